"""Bandwidth against array size across the cache levels: the STREAM-like copy and triad kernels of
tutor.bench.bandwidth, timed at working sets from below L1 to beyond the last-level cache.

Method: McCalpin's STREAM kernels (stream.c v5.10) at growing array sizes, as cache-hierarchy
bandwidth plots do (e.g. lmbench's bw_mem and the "memory mountain" of Bryant & O'Hallaron,
Computer Systems: A Programmer's Perspective, 3rd ed., section 6.6.1): bandwidth plateaus while the
working set fits a cache level and steps down past its size. The working set is the bytes of all
arrays a kernel touches (copy 2 arrays, triad 3). One thread runs the sweep, so that the per-core
L1 and L2 sizes the kernel reports (/sys/devices/system/cpu/cpu0/cache) are where the steps fall.
Each sample repeats the kernel until about SAMPLE_TARGET_S has passed so that the clock read does
not dominate a kernel of a few microseconds; the figure is the best sample, as STREAM reports.
What eager torch cannot hide is its own per-call dispatch (~1 us): below a few tens of KiB the
points measure that, not L1, and the output says so (`dispatch_bound`).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any

from tutor.bench.counting import gbps, stream_bytes
from tutor.bench.timing import BenchCancelled, time_case

SWEEP_OPS = ("copy", "triad")  # the two kernels benchmarks/stream_reference.c times too
ARRAYS_TOUCHED = {"copy": 2, "triad": 3}
ELEMENT_BYTES = 8
SWEEP_STEP = 2  # array sizes grow by this factor
SMALLEST_ARRAY_BYTES = 4 * 2**10
SAMPLE_TARGET_S = 2e-4
# Below this many seconds per kernel call, torch's per-call dispatch is a visible part of the time.
DISPATCH_BOUND_S = 2e-6


@dataclass(frozen=True)
class SweepPoint:
    """One array size of a bandwidth sweep."""

    op: str
    array_bytes: int
    size_bytes: int  # the working set: every array the kernel touches
    gbps: float  # best sample, STREAM's figure of merit
    gbps_median: float
    repeats: int  # kernel calls per timed sample
    samples: int
    threads: int
    dispatch_bound: bool

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "size_bytes": self.size_bytes, "array_bytes": self.array_bytes, "gbps": self.gbps,
                "gbps_median": self.gbps_median, "repeats": self.repeats, "samples": self.samples,
                "threads": self.threads, "dispatch_bound": self.dispatch_bound}


def sweep_array_bytes(largest_cache_bytes: int, *, smallest: int = SMALLEST_ARRAY_BYTES,
                      beyond: int = 4) -> tuple[int, ...]:
    """Array sizes from `smallest` (below L1) doubling up to `beyond` x the last-level cache, so
    that the last working set is 8x (copy) or 12x (triad) the cache (STREAM v5.10 asks 4x for its one size)."""
    sizes = []
    size = smallest
    while size <= beyond * largest_cache_bytes:
        sizes.append(size)
        size *= SWEEP_STEP
    return tuple(sizes)


def _kernel(op: str, a: Any, b: Any, c: Any) -> Any:
    import torch

    if op == "copy":
        return lambda: c.copy_(a)
    return lambda: torch.add(b, c, alpha=3.0, out=a)


def cache_sweep(op: str, array_sizes: tuple[int, ...], *, budget_s: float,
                cancel: threading.Event | None = None) -> tuple[SweepPoint, ...]:
    """Time `op` ("copy" or "triad") at each array size (bytes per fp64 array) on one CPU thread
    within about `budget_s`; keeps the points that finished when cancelled or out of time."""
    import torch

    if op not in SWEEP_OPS:
        raise ValueError(f"sweep op must be one of {SWEEP_OPS}, got {op!r}")
    if not array_sizes:
        return ()
    previous_threads = torch.get_num_threads()
    points: list[SweepPoint] = []
    largest = max(array_sizes) // ELEMENT_BYTES
    # Bandwidth does not depend on the values; filled (not empty) so every page is touched before timing.
    storage = [torch.full((largest,), value, dtype=torch.float64) for value in (1.0, 2.0, 0.5)]
    torch.set_num_threads(1)
    start = time.perf_counter()  # the budget is for timing, not for allocating
    try:
        for index, array_bytes in enumerate(array_sizes):
            if cancel is not None and cancel.is_set():
                break
            remaining = budget_s - (time.perf_counter() - start)
            if remaining <= 0:
                break
            elements = array_bytes // ELEMENT_BYTES
            a, b, c = (array[:elements] for array in storage)
            kernel = _kernel(op, a, b, c)
            kernel()  # first touch of this size
            once = time.perf_counter()
            kernel()
            one_call = max(time.perf_counter() - once, 1e-7)
            repeats = max(1, math.ceil(SAMPLE_TARGET_S / one_call))

            def sample(kernel=kernel, repeats=repeats) -> None:
                for _ in range(repeats):
                    kernel()

            share = max(remaining / (len(array_sizes) - index), 1e-3)
            try:
                timing = time_case(sample, warmup=1, budget_s=share, min_iters=3, max_iters=30, cancel=cancel)
            except BenchCancelled:
                break
            n_bytes = stream_bytes(op, elements, ELEMENT_BYTES)
            points.append(SweepPoint(
                op=op, array_bytes=array_bytes, size_bytes=ARRAYS_TOUCHED[op] * array_bytes,
                gbps=gbps(n_bytes, timing.best_s / repeats), gbps_median=gbps(n_bytes, timing.median_s / repeats),
                repeats=repeats, samples=timing.iters, threads=1,
                dispatch_bound=timing.best_s / repeats < DISPATCH_BOUND_S))
    finally:
        torch.set_num_threads(previous_threads)
    return tuple(points)


@dataclass(frozen=True)
class CacheLevelPlateau:
    """The bandwidth while the working set fits one level (or DRAM, past the last one)."""

    name: str  # "L1", "L2", "L3", "DRAM"
    capacity_bytes: int | None  # None for DRAM
    gbps: float | None  # median of the plateau's points, None when no point lies on it
    points: int


def cache_plateaus(points: list[dict[str, Any]], caches: list[tuple[str, int]]) -> list[CacheLevelPlateau]:
    """Per level, the median GB/s of the points whose working set lies well inside it: above twice
    the level below (past its step) and at most half its own size; DRAM: at least 4x the last level.
    `caches` is [(name, bytes)] smallest first (data and unified caches, as `env` reports them);
    points marked dispatch-bound are left out."""
    usable = [p for p in points if not p.get("dispatch_bound")]
    levels: list[CacheLevelPlateau] = []
    lower = 0
    for name, capacity in caches:
        inside = sorted(p["gbps"] for p in usable if 2 * lower < p["size_bytes"] <= capacity // 2)
        levels.append(CacheLevelPlateau(name, capacity, _median(inside), len(inside)))
        lower = capacity
    beyond = sorted(p["gbps"] for p in usable if p["size_bytes"] >= 4 * lower)
    levels.append(CacheLevelPlateau("DRAM", None, _median(beyond), len(beyond)))
    return levels


def step_positions(points: list[dict[str, Any]], plateaus: list[CacheLevelPlateau]) -> list[tuple[str, int | None]]:
    """Per cache level, the working set where the measured bandwidth first falls below the geometric
    mean of its plateau and the next one's (the middle of the step on a log scale), or None."""
    ordered = sorted(points, key=lambda p: p["size_bytes"])
    steps: list[tuple[str, int | None]] = []
    for here, below in zip(plateaus, plateaus[1:]):
        if here.gbps is None or below.gbps is None or here.capacity_bytes is None:
            steps.append((here.name, None))
            continue
        middle = math.sqrt(here.gbps * below.gbps)
        found = None
        for before, after in zip(ordered, ordered[1:]):
            if before["size_bytes"] >= here.capacity_bytes // 4 and before["gbps"] >= middle > after["gbps"]:
                found = int(math.sqrt(before["size_bytes"] * after["size_bytes"]))
                break
        steps.append((here.name, found))
    return steps


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def data_caches(machine: Any) -> list[tuple[str, int]]:
    """[("L1", bytes), ("L2", bytes), ...] of the data and unified caches the machine reports, smallest first."""
    levels: dict[int, int] = {}
    for cache in machine.cpu.caches:
        if cache.kind in ("Data", "Unified") and cache.size_bytes:
            levels[cache.level] = max(levels.get(cache.level, 0), cache.size_bytes)
    return [(f"L{level}", size) for level, size in sorted(levels.items())]
