"""Memory accounting on the CPU: the process RSS, and no GPU figures where there is no GPU."""

from __future__ import annotations

import mmap

import psutil

from tutor.bench.memory import memory_accounting


def test_cpu_snapshot_is_the_process_rss() -> None:
    snapshot = memory_accounting("cpu")
    rss = psutil.Process().memory_info().rss
    assert 0.5 * rss < snapshot.process_rss_bytes < 2 * rss
    data = snapshot.to_json()
    assert data["kind"] == "memory" and data["device"] == "cpu"
    assert data["nvml_used_bytes"] is None and data["torch_reserved_bytes"] is None


def test_rss_grows_with_a_touched_allocation() -> None:
    before = memory_accounting("cpu").process_rss_bytes
    # A fresh anonymous mapping, every page written: a malloc'd block may come from pages this long-lived test process
    # already has resident (seen once in a full run: RSS unchanged to the byte), a new mapping never does.
    block = mmap.mmap(-1, 64 * 2**20)
    block.write(b"\x01" * (64 * 2**20))
    after = memory_accounting("cpu").process_rss_bytes
    assert after - before > 32 * 2**20
    block.close()
