"""STREAM-like bandwidth on small CPU arrays: byte counting, buffer sizing rule, schema."""

from __future__ import annotations

import threading
import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)

from tutor.bench.bandwidth import (BANDWIDTH_OPS, ELEMENT_BYTES, FILL_BLOCK_ELEMENTS, host_device_transfer,
                                   memory_bandwidth, parse_ops, stream_array_elements)
from tutor.bench.counting import stream_bytes
from tutor.bench.environment import FALLBACK_LLC_BYTES, cpu_llc_bytes
from tutor.errors import UserError

from tests.machines import recorded_h100, recorded_machine

BANDWIDTH_KEYS = {"kind", "device", "op", "bytes", "bytes_counting", "gbps_median", "gbps_best", "peak_gbps"}


def fake_machine(llc: int | None = 2**20):
    return recorded_machine(llc_bytes=llc)


def test_every_op_is_measured_with_stream_byte_counting() -> None:
    elements = FILL_BLOCK_ELEMENTS
    results = memory_bandwidth("cpu", budget_s=0.5, machine=fake_machine(), array_elements=elements)
    assert [r.op for r in results] == list(BANDWIDTH_OPS)
    for result in results:
        data = result.to_json()
        assert BANDWIDTH_KEYS <= set(data) and data["kind"] == "bandwidth"
        assert data["bytes"] == stream_bytes(result.op, elements, ELEMENT_BYTES)
        assert 0 < result.gbps_median <= result.gbps_best
        assert result.peak_gbps is None and result.percent_of_peak is None
    by_op = {r.op: r for r in results}
    assert by_op["copy"].bytes == 2 * elements * 8 and by_op["triad"].bytes == 3 * elements * 8
    assert by_op["read"].bytes == elements * 8
    assert "write-allocate" in by_op["copy"].bytes_counting


def test_percent_of_a_known_peak_uses_the_best_iteration(monkeypatch: pytest.MonkeyPatch) -> None:
    # a CPU has no DRAM peak (CPU_MEMORY_PEAK_NOTE): stand one in as a GPU's datasheet would give it
    monkeypatch.setattr("tutor.bench.bandwidth.peak_memory_gbps", lambda machine, device: 1e6)
    (triad,) = memory_bandwidth("cpu", budget_s=0.2, machine=fake_machine(), ops=("triad",),
                                array_elements=FILL_BLOCK_ELEMENTS)
    assert triad.percent_of_peak == pytest.approx(100 * triad.gbps_best / 1e6)


def test_arrays_are_at_least_four_times_the_cache() -> None:
    elements, note = stream_array_elements(300 * 2**20, free_bytes=None)
    assert elements * ELEMENT_BYTES >= 4 * 300 * 2**20
    assert elements % FILL_BLOCK_ELEMENTS == 0 and note == ""
    # stream.c v5.10's own example: two E5s with 20 MB of L3 each need >= 20M elements
    # (4 x 40 MB / 8 B per double).
    elements, _ = stream_array_elements(40 * 10**6, free_bytes=None)
    assert elements >= 20_000_000


def test_arrays_shrink_to_fit_free_memory_and_say_so() -> None:
    elements, note = stream_array_elements(2**30, free_bytes=600 * 2**20)
    assert 3 * elements * ELEMENT_BYTES <= 300 * 2**20
    assert "not enough free memory" in note


def test_unknown_cache_falls_back_and_says_so() -> None:
    size, source = cpu_llc_bytes(fake_machine(llc=None))
    assert size == FALLBACK_LLC_BYTES and "assumed 32 MiB" in source
    assert cpu_llc_bytes(fake_machine(llc=12345))[0] == 12345


def test_cancel_keeps_finished_ops() -> None:
    cancel = threading.Event()
    cancel.set()
    assert memory_bandwidth("cpu", budget_s=1.0, machine=fake_machine(), cancel=cancel,
                            array_elements=FILL_BLOCK_ELEMENTS) == []


def test_op_parsing_and_transfer_needs_cuda() -> None:
    assert parse_ops("triad,copy") == ("triad", "copy")
    with pytest.raises(UserError, match="unknown bandwidth op"):
        parse_ops("memset")
    with pytest.raises(UserError, match="CUDA"):
        host_device_transfer("cpu", budget_s=1.0, machine=fake_machine())


def test_transfer_peak_is_the_gpus_pcie_link(monkeypatch: pytest.MonkeyPatch) -> None:
    from tutor.bench.bandwidth import pcie_link_peak_gbps

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    peak, note = pcie_link_peak_gbps(recorded_machine(gpus=[recorded_h100()]), "cuda:0")
    assert peak == pytest.approx(63.015, rel=1e-4) and note == "PCIe Gen5 x16 link, one way"
    unknown = recorded_machine(gpus=[recorded_h100(pcie_generation_max=None)])
    assert pcie_link_peak_gbps(unknown, "cuda:0") == (None, "PCIe link unknown (NVML)")
    assert pcie_link_peak_gbps(recorded_machine(), "cuda:0") == (None, "PCIe link unknown (NVML)")
