"""tutor.bench.cache_sweep: the sizes, a real (tiny) sweep, and how plateaus and steps are read."""

from __future__ import annotations

from pathlib import Path

import pytest


from tests.plot_data import LEVELS, RESULTS
from tutor.bench.cache_sweep import (
    bandwidth_steps, cache_levels, cache_plateaus, cache_sweep, sweep_array_bytes)

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
    levels = {level.name: level for level in cache_levels(triad, CACHES)}
    # L1's last point (24 KiB) is free of dispatch: its fall to L2's rate is seen, but no plateau.
    assert 24 * 2**10 <= levels["L1"].step_bytes <= 48 * 2**10 and levels["L1"].gbps is None
    assert 512 * 2**10 <= levels["L2"].step_bytes <= 2 * 512 * 2**10  # the data step after 512 KiB working set
    assert 16 * 2**20 <= levels["L3"].step_bytes <= 2 * 16 * 2**20
    assert [levels[name].gbps for name in ("L2", "L3", "DRAM")] == [rate for _, rate in LEVELS[1:]]


def curve(plateaus: list[tuple[int, float]], *, first: int = 64 * 2**10, last: int = 2**31) -> list[dict]:
    """A copy sweep (working set doubling from `first`) at the rate of the first plateau whose limit it is under."""
    points, size = [], first
    while size <= last:
        points.append({"size_bytes": size, "gbps": next(rate for limit, rate in plateaus if size <= limit)})
        size *= 2
    return points


def test_a_step_is_read_from_the_curve_where_it_falls_not_where_the_cache_is_reported():
    # A thread that gets 48 MiB of a 256 MiB L3 (shared with other cores or guests): the step is
    # at ~48 MiB, matched to L3 (the nearest reported size), and L3's plateau is read below it.
    points = curve([(2 * 2**20, 70.0), (48 * 2**20, 27.0), (2**40, 12.0)])
    steps = bandwidth_steps(points)
    assert len(steps) == 2
    assert 2 * 2**20 <= steps[0] <= 4 * 2**20 and 32 * 2**20 <= steps[1] <= 64 * 2**20  # between the points around each fall
    levels = cache_levels(points, [("L1", 48 * 2**10), ("L2", 2 * 2**20), ("L3", 256 * 2**20)])
    l3 = levels[2]
    assert (l3.name, l3.step_bytes, l3.gbps) == ("L3", steps[1], 27.0)
    assert l3.step_factor < 0.5
    assert (levels[3].name, levels[3].gbps) == ("DRAM", 12.0)  # past twice the measured step, not 4x the reported 256 MiB


def test_noise_within_a_plateau_is_not_a_step_and_a_gradual_fall_is_one_step():
    noisy = [{"size_bytes": 2**k, "gbps": rate} for k, rate in zip(range(17, 24), (63, 60, 76, 58, 62, 61, 60))]
    assert bandwidth_steps(noisy) == []
    gradual = curve([(2**20, 70.0), (2**21, 48.0), (2**40, 28.0)])  # a fall spread over two doublings
    (step,) = bandwidth_steps(gradual)
    assert 2**20 <= step <= 2**22


def test_tiny_arrays_are_dispatch_bound_and_large_ones_are_not():
    points = cache_sweep("copy", (4096, 8 * 2**20), budget_s=0.5)
    small, large = points
    assert small.dispatch_s is not None and small.dispatch_s == large.dispatch_s > 0
    # 8 KiB moved per call cannot take a quarter of the measured cost of a call that moves nothing
    # unless the call is dominated by that cost; 16 MiB per call takes far longer than any dispatch.
    assert small.dispatch_bound and not large.dispatch_bound


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
