"""The one timing core every benchmark uses.

Method (Triton `do_bench`, torch.utils.benchmark.Timer, mamf-finder): warm-up first; per-iteration device events with one
synchronize at the end on CUDA (Triton `do_bench`, mamf-finder) and `time.perf_counter` elsewhere;
an L2 flush between GPU iterations, outside the timed window; median, best and spread per case.
"""

from __future__ import annotations

import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

# (p90 - p10) / median above this marks a case noisy. torch.utils.benchmark's Measurement warns at
# IQR/median > 10 %; the p10..p90 range is wider than the IQR, so twice that threshold.
NOISY_SPREAD = 0.20
# Coefficient of variation (stdev / mean) above this also marks a case noisy.
NOISY_CV = 0.10
# Triton do_bench and mamf-finder flush with a 256 MB buffer; never less than 2x the device's L2.
L2_FLUSH_MIN_BYTES = 256 * 10**6
# A case never runs more timed iterations than this, whatever the budget.
MAX_ITERS = 1000
# `until_stable` stops a case once this many timed iterations are not noisy. Five is the fewest whose
# p10..p90 range is not simply the full range of a few samples (torch.utils.benchmark's
# adaptive_autorange likewise wants more than 3 blocks before it trusts IQR/median).
STABLE_MIN_ITERS = 5
# On CUDA the events are read (one synchronize) every this many iterations to test stability.
STABLE_CHECK_EVERY_CUDA = 8


class BenchCancelled(Exception):
    """The cancel event was set before a single timed iteration of a case finished."""


@dataclass(frozen=True)
class Timing:
    """Per-iteration wall times of one case (seconds) and their statistics."""

    times_s: tuple[float, ...]
    median_s: float
    best_s: float
    mean_s: float
    stdev_s: float
    p10_s: float
    p90_s: float
    iters: int
    spread: float  # (p90 - p10) / median
    noisy: bool
    noise_message: str  # "" when not noisy
    cancelled: bool = False  # True when the cancel event cut the timed loop short

    def to_json(self) -> dict[str, object]:
        return {
            "median_s": self.median_s, "best_s": self.best_s, "mean_s": self.mean_s,
            "stdev_s": self.stdev_s, "p10_s": self.p10_s, "p90_s": self.p90_s, "iters": self.iters,
            "spread": self.spread, "noisy": self.noisy, "noise_message": self.noise_message,
            "cancelled": self.cancelled,
        }


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of already sorted values, linear interpolation between closest ranks
    (numpy's default "linear" method, Hyndman & Fan type 7)."""
    if not sorted_values:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within 0..1, got {q}")
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def timing_from_samples(times_s: Sequence[float], *, cancelled: bool = False) -> Timing:
    """Statistics of per-iteration times; flags the case noisy when the p10..p90 spread exceeds
    NOISY_SPREAD of the median or the coefficient of variation exceeds NOISY_CV."""
    if not times_s:
        raise ValueError("no timed iterations to summarise")
    if any(not math.isfinite(t) or t <= 0 for t in times_s):
        raise ValueError("iteration times must be positive and finite")
    ordered = sorted(times_s)
    median = statistics.median(ordered)
    mean = statistics.fmean(ordered)
    stdev = statistics.stdev(ordered) if len(ordered) > 1 else 0.0
    p10, p90 = percentile(ordered, 0.10), percentile(ordered, 0.90)
    spread = (p90 - p10) / median
    cv = stdev / mean
    reasons = []
    if spread > NOISY_SPREAD:
        reasons.append(f"p10..p90 spread {spread:.0%} of the median (threshold {NOISY_SPREAD:.0%})")
    if cv > NOISY_CV:
        reasons.append(f"coefficient of variation {cv:.0%} (threshold {NOISY_CV:.0%})")
    message = ("noisy: " + "; ".join(reasons) + " - another process may be using this machine") if reasons else ""
    return Timing(
        times_s=tuple(times_s), median_s=median, best_s=ordered[0], mean_s=mean, stdev_s=stdev,
        p10_s=p10, p90_s=p90, iters=len(ordered), spread=spread, noisy=bool(reasons),
        noise_message=message, cancelled=cancelled,
    )


def usable_cpu_count() -> int:
    """Logical CPUs this process may run on (respects affinity masks and container cpusets)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def use_all_cpu_threads() -> int:
    """Give torch's intra-op pool every logical CPU this process may use; returns the count.

    Decision measured on the 2-core dev box (1 thread per core): FP32 1024^3 matmul 135 GFLOP/s
    with 1 thread vs 170-220 GFLOP/s with 2. torch.utils.benchmark.Timer defaults to ONE thread,
    which would measure a single core (torch.utils.benchmark.Timer: num_threads=1). On SMT machines the
    hyperthreads share FMA units; we still use them (the issue asks for every thread) and record
    the count in the environment header so runs stay comparable.
    """
    import torch

    threads = usable_cpu_count()
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads


def _l2_flush_buffer(device: str):
    import torch

    props = torch.cuda.get_device_properties(torch.device(device))
    l2_bytes = int(getattr(props, "L2_cache_size", 0) or 0)
    n_bytes = max(L2_FLUSH_MIN_BYTES, 2 * l2_bytes)
    return torch.empty(n_bytes // 4, dtype=torch.int32, device=device)


def _iterations_for_budget(estimate_s: float, budget_s: float, min_iters: int, max_iters: int) -> int:
    if estimate_s <= 0:
        return max_iters
    return max(min_iters, min(max_iters, int(budget_s / estimate_s)))


def time_case(
    fn: Callable[[], object],
    *,
    device: str = "cpu",
    warmup: int = 1,
    iters: int | None = None,
    budget_s: float | None = None,
    min_iters: int = 3,
    max_iters: int = MAX_ITERS,
    flush_l2: bool = False,
    setup: Callable[[], object] | None = None,
    cancel: threading.Event | None = None,
    until_stable: bool = False,
    timer: Callable[[], float] = time.perf_counter,
) -> Timing:
    """Time `fn` per iteration after `warmup` untimed calls.

    Give `iters` (a fixed count) or `budget_s` (seconds for the timed loop: the iteration count is
    estimated from the warm-up, at least `min_iters`, never more than `max_iters`, and the loop
    also stops at the deadline once `min_iters` are done). `setup` runs before each iteration
    outside the timed window (mamf-finder re-randomises the output there). On CUDA, `flush_l2` zeroes a buffer of at least 2x L2 before
    each iteration, outside the events. `cancel` is checked between iterations: a set event ends the
    loop and the Timing says `cancelled`; BenchCancelled if no timed iteration finished.
    `until_stable` also ends the loop as soon as STABLE_MIN_ITERS or more iterations are not noisy
    (torch.utils.benchmark's adaptive_autorange: run until IQR/median is under a threshold), so a
    steady case spends little of its budget. `timer` is the host clock (a test injects a fake one);
    deadlines are read from it too.
    """
    if (iters is None) == (budget_s is None):
        raise ValueError("give exactly one of iters or budget_s")
    if iters is not None and iters < 1:
        raise ValueError(f"iters must be at least 1, got {iters}")
    if budget_s is not None and budget_s <= 0:
        raise ValueError(f"budget_s must be positive, got {budget_s}")
    on_cuda = device.startswith("cuda")
    if on_cuda:
        return _time_cuda(fn, device, warmup, iters, budget_s, min_iters, max_iters, flush_l2, setup, cancel,
                          until_stable, timer)
    return _time_host(fn, warmup, iters, budget_s, min_iters, max_iters, setup, cancel, until_stable, timer)


def _cancelled(cancel: threading.Event | None) -> bool:
    return cancel is not None and cancel.is_set()


def is_stable(times_s: Sequence[float]) -> bool:
    """At least STABLE_MIN_ITERS samples and not noisy (spread and CV under their thresholds)."""
    return len(times_s) >= STABLE_MIN_ITERS and not timing_from_samples(times_s).noisy


def _time_host(fn, warmup, iters, budget_s, min_iters, max_iters, setup, cancel, until_stable, timer) -> Timing:
    warm_times = []
    for _ in range(max(warmup, 1 if iters is None else 0)):
        if _cancelled(cancel):
            raise BenchCancelled("cancelled during warm-up")
        if setup is not None:
            setup()
        start = timer()
        fn()
        warm_times.append(max(timer() - start, 0.0))
    target = iters if iters is not None else _iterations_for_budget(min(warm_times), budget_s, min_iters, max_iters)
    deadline = None if budget_s is None else timer() + budget_s
    times: list[float] = []
    cancelled = False
    while len(times) < target:
        if _cancelled(cancel):
            cancelled = True
            break
        if deadline is not None and len(times) >= min_iters and timer() > deadline:
            break
        if until_stable and len(times) >= min_iters and is_stable(times):
            break
        if setup is not None:
            setup()
        start = timer()
        fn()
        times.append(timer() - start)
    if not times:
        raise BenchCancelled("cancelled before a timed iteration finished")
    return timing_from_samples(times, cancelled=cancelled)


def _time_cuda(fn, device, warmup, iters, budget_s, min_iters, max_iters, flush_l2, setup, cancel, until_stable,
               timer) -> Timing:
    import torch

    flush = _l2_flush_buffer(device) if flush_l2 else None
    stream_device = torch.device(device)

    def one_pair() -> tuple[torch.cuda.Event, torch.cuda.Event]:
        if setup is not None:
            setup()
        if flush is not None:
            flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return start, end

    with torch.cuda.device(stream_device):
        warm_pairs = []
        for _ in range(max(warmup, 1 if iters is None else 0)):
            if _cancelled(cancel):
                raise BenchCancelled("cancelled during warm-up")
            warm_pairs.append(one_pair())
        torch.cuda.synchronize(stream_device)
        warm_times = [s.elapsed_time(e) / 1e3 for s, e in warm_pairs]
        target = iters if iters is not None else _iterations_for_budget(min(warm_times), budget_s, min_iters, max_iters)
        deadline = None if budget_s is None else timer() + budget_s
        pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        cancelled = False
        # No host sync inside the loop; the deadline check costs a host clock read only. The queue
        # is synchronized every 32 iterations so a cancel never waits behind a long backlog.
        while len(pairs) < target:
            if _cancelled(cancel):
                cancelled = True
                break
            if deadline is not None and len(pairs) >= min_iters and timer() > deadline:
                break
            pairs.append(one_pair())
            if len(pairs) % 32 == 0:
                torch.cuda.synchronize(stream_device)
            if until_stable and len(pairs) >= min_iters and len(pairs) % STABLE_CHECK_EVERY_CUDA == 0:
                torch.cuda.synchronize(stream_device)
                if is_stable([s.elapsed_time(e) / 1e3 for s, e in pairs]):
                    break
        torch.cuda.synchronize(stream_device)
    if not pairs:
        raise BenchCancelled("cancelled before a timed iteration finished")
    return timing_from_samples([s.elapsed_time(e) / 1e3 for s, e in pairs], cancelled=cancelled)
