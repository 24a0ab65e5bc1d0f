"""tutor.bench.cache_sweep: the sizes, a real (tiny) sweep, and how plateaus and steps are read."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from plot_data import LEVELS, RESULTS  # noqa: E402
from tutor.bench.cache_sweep import cache_plateaus, cache_sweep, step_positions, sweep_array_bytes  # noqa: E402

CACHES = [("L1", 32768), ("L2", 1048576), ("L3", 33554432)]


def test_sizes_start_below_l1_and_end_past_four_times_the_last_level():
    sizes = sweep_array_bytes(32 * 2**20)
    assert sizes[0] < 32768 and sizes[-1] >= 4 * 32 * 2**20 > sizes[-1] // 2
    assert all(b == 2 * a for a, b in zip(sizes, sizes[1:]))


def test_a_real_sweep_times_each_size_on_one_thread_and_gives_the_threads_back():
    import torch

    before = torch.get_num_threads()
    points = cache_sweep("triad", (4096, 65536), budget_s=0.5)
    assert torch.get_num_threads() == before
    assert [p.array_bytes for p in points] == [4096, 65536]
    assert all(p.gbps > 0 and p.size_bytes == 3 * p.array_bytes and p.threads == 1 for p in points)
    assert all(p.gbps >= p.gbps_median for p in points)  # the best sample is never slower than the median


def test_unknown_op_is_refused():
    with pytest.raises(ValueError):
        cache_sweep("scale", (4096,), budget_s=0.1)


def test_plateaus_and_steps_of_a_stepped_sweep():
    triad = RESULTS[4]["sweep"]
    plateaus = cache_plateaus(triad, CACHES)
    # L1's only points are dispatch-bound in the data, so it has none; the others read their level.
    assert [(p.name, p.gbps) for p in plateaus] == [("L1", None), ("L2", LEVELS[1][1]), ("L3", LEVELS[2][1]),
                                                  ("DRAM", LEVELS[3][1])]
    steps = dict(step_positions(triad, plateaus))
    assert steps["L1"] is None
    assert 512 * 2**10 <= steps["L2"] <= 2 * 512 * 2**10  # the data step after 512 KiB working set
    assert 16 * 2**20 <= steps["L3"] <= 2 * 16 * 2**20


def test_bandwidth_results_keep_every_size_they_timed():
    from tests.machines import recorded_machine
    from tutor.bench.bandwidth import FILL_BLOCK_ELEMENTS, memory_bandwidth

    machine = recorded_machine(llc_bytes=2**18)  # a 256 KiB "last-level cache": the sweep ends at 1 MiB arrays
    results = memory_bandwidth("cpu", budget_s=2.0, machine=machine, ops=("copy", "triad", "read"),
                               array_elements=FILL_BLOCK_ELEMENTS, sweep=True)
    by_op = {r.op: r.to_json() for r in results}
    copy_sizes = [p["array_bytes"] for p in by_op["copy"]["sweep"]]
    assert copy_sizes == list(sweep_array_bytes(2**18))
    assert all(p["size_bytes"] == 2 * p["array_bytes"] and p["gbps"] > 0 for p in by_op["copy"]["sweep"])
    assert all(p["size_bytes"] == 3 * p["array_bytes"] for p in by_op["triad"]["sweep"])
    # Not swept (the C reference times copy and triad only): the one size it was timed at.
    assert by_op["read"]["sweep"] == [{"op": "read", "size_bytes": by_op["read"]["bytes"],
                                       "array_bytes": by_op["read"]["array_bytes"], "gbps": by_op["read"]["gbps_best"],
                                       "gbps_median": by_op["read"]["gbps_median"]}]
