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
What eager torch cannot hide is its own per-call dispatch (a few microseconds, measured each sweep on
arrays of DISPATCH_PROBE_ELEMENTS): where it is a quarter of a call or more, the point measures that,
not the cache, and the output says so (`dispatch_bound`).

Where each level ends is read from the curve itself (`bandwidth_steps`), then matched to the
caches the kernel reports: the size sysfs reports is the whole cache, and a thread may get less of
a cache that other cores (or, in a virtual machine, other guests) share.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from collections.abc import Iterable
from typing import Any

from tutor.bench.counting import gbps, stream_bytes
from tutor.bench.timing import BenchCancelled, time_case

SWEEP_OPS = ("copy", "triad")  # the two kernels benchmarks/stream_reference.c times too
ARRAYS_TOUCHED = {"copy": 2, "triad": 3}
ELEMENT_BYTES = 8
SWEEP_STEP = 2  # array sizes grow by this factor
SMALLEST_ARRAY_BYTES = 4 * 2**10
SAMPLE_TARGET_S = 2e-4
# A point is dispatch-bound when torch's per-call cost is this share of the call or more: its GB/s is
# then understated by at least as much as the plateaus' tolerance (25%).
DISPATCH_SHARE = 0.25
DISPATCH_PROBE_ELEMENTS = 8  # 64 B arrays: a call of the kernel that moves almost nothing
DISPATCH_PROBE_CALLS = 200
# A level ends where the bandwidth falls below 1/STEP_DROP of the best point since the last step: above
# the spread of one plateau's points, below the falls between levels (the 2-core dev box: up to 1.3x
# within a plateau, 2.2x to 2.7x between levels, benchmarks/cache_sweep_vs_stream.py).
STEP_DROP = 1.4


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
    dispatch_s: float | None = None  # torch's cost of one call of this kernel, measured in the same sweep

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, "size_bytes": self.size_bytes, "array_bytes": self.array_bytes, "gbps": self.gbps,
                "gbps_median": self.gbps_median, "repeats": self.repeats, "samples": self.samples,
                "threads": self.threads, "dispatch_bound": self.dispatch_bound, "dispatch_s": self.dispatch_s}


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


def dispatch_seconds(op: str, storage: list[Any], *, cancel: threading.Event | None = None) -> float | None:
    """The best time of one call of `op`'s kernel on arrays of DISPATCH_PROBE_ELEMENTS (64 B): what a
    call costs when it moves almost nothing, torch's per-call dispatch. None when cancelled."""
    a, b, c = (array[:DISPATCH_PROBE_ELEMENTS] for array in storage)
    kernel = _kernel(op, a, b, c)

    def sample() -> None:
        for _ in range(DISPATCH_PROBE_CALLS):
            kernel()

    try:
        timing = time_case(sample, warmup=1, iters=7, cancel=cancel)
    except BenchCancelled:
        return None
    return timing.best_s / DISPATCH_PROBE_CALLS


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
        dispatch_s = dispatch_seconds(op, storage, cancel=cancel)
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
            call_s = timing.best_s / repeats
            points.append(SweepPoint(
                op=op, array_bytes=array_bytes, size_bytes=ARRAYS_TOUCHED[op] * array_bytes,
                gbps=gbps(n_bytes, call_s), gbps_median=gbps(n_bytes, timing.median_s / repeats),
                repeats=repeats, samples=timing.iters, threads=1,
                dispatch_bound=dispatch_s is not None and dispatch_s >= DISPATCH_SHARE * call_s, dispatch_s=dispatch_s))
    finally:
        torch.set_num_threads(previous_threads)
    return tuple(points)


@dataclass(frozen=True)
class CacheLevelPlateau:
    """The bandwidth while the working set fits one level (or DRAM, past the last one)."""

    name: str  # "L1", "L2", "L3", "DRAM"
    capacity_bytes: int | None  # where the level ends (the boundary the plateau was read against); None for DRAM
    gbps: float | None  # median of the plateau's points, None when no point lies on it
    points: int


def cache_plateaus(points: list[dict[str, Any]], boundaries: list[tuple[str, int]]) -> list[CacheLevelPlateau]:
    """Per level, the median GB/s of the points whose working set lies well inside it: above twice
    the boundary below (past its step) and at most half its own; DRAM: at least twice the last one.
    `boundaries` is [(name, bytes)] smallest first: where each level ends (a measured step, or the
    size `env` reports); points marked dispatch-bound are left out."""
    usable = [p for p in points if not p.get("dispatch_bound")]
    levels: list[CacheLevelPlateau] = []
    lower = 0
    for name, capacity in boundaries:
        inside = sorted(p["gbps"] for p in usable if 2 * lower < p["size_bytes"] <= capacity // 2)
        levels.append(CacheLevelPlateau(name, capacity, _median(inside), len(inside)))
        lower = capacity
    beyond = sorted(p["gbps"] for p in usable if p["size_bytes"] >= 2 * lower)
    levels.append(CacheLevelPlateau("DRAM", None, _median(beyond), len(beyond)))
    return levels


def bandwidth_steps(points: list[dict[str, Any]]) -> list[int]:
    """The working sets where the measured bandwidth steps down, smallest first: a step is a fall
    below 1/STEP_DROP of the best point since the previous step, placed where the curve crosses
    the geometric mean of the plateaus on either side (log-log interpolation between the two
    points around the crossing), as one reads a memory mountain. Dispatch-bound points are left out."""
    ordered = sorted((p for p in points if not p.get("dispatch_bound")), key=lambda p: p["size_bytes"])
    steps: list[int] = []
    segment_start = 0
    for index in range(1, len(ordered)):
        if index <= segment_start:
            continue
        segment = ordered[segment_start:index]
        best = max(p["gbps"] for p in segment)
        if ordered[index]["gbps"] * STEP_DROP >= best:
            continue
        above = _median(sorted(p["gbps"] for p in segment if p["gbps"] * STEP_DROP >= best)) or best
        after_step = ordered[index:index + 3]  # the first points of the next plateau
        below = _median(sorted(p["gbps"] for p in after_step)) or ordered[index]["gbps"]
        middle = math.sqrt(above * below)
        window = ordered[segment_start:index + len(after_step)]
        for offset, (before, after) in enumerate(zip(window, window[1:])):
            if before["gbps"] >= middle > after["gbps"]:
                steps.append(_log_crossing(before, after, middle))
                segment_start += offset + 1
                break
        else:
            segment_start = index
    return steps


def _log_crossing(before: dict[str, Any], after: dict[str, Any], gbps_level: float) -> int:
    """The working set between two points where GB/s crosses `gbps_level`, interpolated on log scales."""
    span = math.log(before["gbps"] / after["gbps"])
    share = math.log(before["gbps"] / gbps_level) / span if span > 0 else 0.5
    return int(before["size_bytes"] * (after["size_bytes"] / before["size_bytes"]) ** share)


@dataclass(frozen=True)
class CacheLevel:
    """One cache level as `env` reports it and as the sweep saw it (DRAM: past the last one)."""

    name: str
    reported_bytes: int | None  # the whole cache, from sysfs; None for DRAM
    step_bytes: int | None  # the measured working set where bandwidth falls past this level; None if not seen
    gbps: float | None  # the plateau while the working set fits
    points: int

    @property
    def step_factor(self) -> float | None:
        """The measured step over the reported size (1 when the thread gets the whole cache)."""
        if self.step_bytes is None or not self.reported_bytes:
            return None
        return self.step_bytes / self.reported_bytes


def cache_levels(points: list[dict[str, Any]], caches: list[tuple[str, int]]) -> list[CacheLevel]:
    """Each reported cache level with the measured step nearest its size (on a log scale; a step
    goes to one level) and its plateau read against the measured steps (the reported size where no
    step was seen), then DRAM. `caches` is [(name, bytes)] smallest first, as `data_caches` gives."""
    matched: dict[str, int] = {}
    for step in bandwidth_steps(points):
        if not caches:
            break
        name, size = min(caches, key=lambda level: abs(math.log(step / level[1])))
        if name not in matched or abs(math.log(step / size)) < abs(math.log(matched[name] / size)):
            matched[name] = step
    boundaries = [(name, matched.get(name, size)) for name, size in caches]
    plateaus = cache_plateaus(points, boundaries)
    reported = dict(caches)
    return [CacheLevel(plateau.name, reported.get(plateau.name), matched.get(plateau.name), plateau.gbps, plateau.points)
            for plateau in plateaus]


def level_boundaries(levels: list[CacheLevel]) -> list[tuple[str, int]]:
    """[(name, bytes)] where each cache level of `levels` ends: its measured step, else its reported size."""
    return [(level.name, level.step_bytes or level.reported_bytes) for level in levels
            if level.reported_bytes is not None]


def dispatch_share_limit(points: list[dict[str, Any]]) -> tuple[int | None, float | None]:
    """(the largest dispatch-bound working set, the measured dispatch seconds) of a sweep: below it
    the points measure torch's per-call cost, not a cache. (None, ...) when no point is dispatch-bound."""
    bound = [p["size_bytes"] for p in points if p.get("dispatch_bound")]
    dispatch = next((p["dispatch_s"] for p in points if isinstance(p.get("dispatch_s"), (int, float))), None)
    return (max(bound) if bound else None), dispatch


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    middle = len(values) // 2
    return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2


def data_caches(machine: Any) -> list[tuple[str, int]]:
    """[("L1", bytes), ("L2", bytes), ...] of the data and unified caches the machine reports, smallest first."""
    return levels_of_caches((cache.kind, cache.level, cache.size_bytes) for cache in machine.cpu.caches)


def levels_of_caches(caches: Iterable[tuple[object, object, object]]) -> list[tuple[str, int]]:
    """[("L1", bytes), ...] from (kind, level, size in bytes) of each cache: the data and unified ones,
    the largest of a level, smallest level first (an instruction cache holds no array; a malformed
    entry of a stored record is skipped)."""
    levels: dict[int, int] = {}
    for kind, level, size in caches:
        if kind in ("Data", "Unified") and isinstance(level, int) and isinstance(size, int) and size > 0:
            levels[level] = max(levels.get(level, 0), size)
    return [(f"L{level}", size) for level, size in sorted(levels.items())]
