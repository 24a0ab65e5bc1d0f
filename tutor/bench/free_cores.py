"""Before a short CPU measurement: wait briefly for the cores to be free, then say how many are.

A CPU GEMM splits its work evenly over torch's intra-op threads and finishes with the slowest
(OpenMP's static schedule), so one thread that shares its core with another program halves the
whole GEMM's rate. In the app a lesson's 3 s matmul often starts while the interface is still
painting the lesson it was started from, or while other programs run: the app measured the first
fp32 rate at 0.40-0.88 of `bench matmul`'s on the 2-core machine. So the lab first waits (outside
its budget, at most MAX_WAIT_S) until the CPU time of everything but itself (other processes and
the app's interface, as tutor.bench.busy counts them) fits in QUIET_CORES, and then uses one
thread per core that is still free: a core counts as taken once half of it is used. Where it gave
cores up, it looks once more after its sweep (one window, `max_wait_s=0`), and sweeps again on the
cores that are free by then (on the shared machine another program's burst often ends just after
the wait), so a passing burst does not leave the learner with one core's rate.

Measured on the 2-core dev box (tutor.bench.timing.use_all_cpu_threads): fp32 1024^3 135 GFLOP/s
on 1 thread, 170-220 on 2, so a thread given up for a core that is really busy costs less than the
straggler it avoids.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from tutor.bench.busy import BusyMeter, BusyShare

QUIET_CORES = 0.25
"""Everything but the measurement using at most this many cores counts as quiet (a desktop at
rest and an idle interface stay under it; a repaint or another program's thread does not)."""
WINDOW_S = 0.15
"""One look at the machine: /proc/stat ticks at 1/100 s, so 15 ticks per core."""
MAX_WAIT_S = 2.0
"""The longest the lab waits for quiet before it measures anyway (with the cores still free)."""
TAKEN_FROM = 0.5
"""A core counts as taken once this share of it is used by others."""


@dataclass(frozen=True)
class FreeCores:
    """What the wait found: usable cores, the threads to use, what else used the cores in the last
    window (in cores), how long the wait took and whether it ended quiet."""

    cores: int
    threads: int
    taken_cores: float
    waited_s: float
    quiet: bool

    def describe(self, threads_used: int | None = None) -> str:
        """One line for the result's notes ('' when nothing is worth saying: quiet at once, all cores).
        `threads_used`: the threads the figure was timed on, when more than the wait left it (the
        cores came free: tutor.labs.throughput times again on them)."""
        from tutor.formatting import format_duration, format_number

        parts = []
        if self.waited_s >= WINDOW_S * 2:
            parts.append(f"waited {format_duration(self.waited_s)} for the cores to be free"
                         + ("" if self.quiet else " (they did not come free)"))
        if self.threads < self.cores:
            threads = f"{self.threads} thread{'s' if self.threads != 1 else ''} on {self.cores} cores"
            used = f"other work used {format_number(self.taken_cores)} of them when it started"
            if threads_used is not None and threads_used > self.threads:
                parts.append(f"{threads} at first ({used}); the figure is timed on {threads_used} threads, once "
                             "the cores came free")
            else:
                parts.append(f"{threads}: {used}")
        return "; ".join(parts)

    def to_json(self) -> dict[str, float | int | bool]:
        return {"cores": self.cores, "threads": self.threads, "taken_cores": self.taken_cores,
                "waited_s": self.waited_s, "quiet": self.quiet}


def cores_taken(share: BusyShare) -> float:
    """Cores' worth of CPU that other processes and the app's interface used over the window."""
    if share.window_s <= 0:
        return 0.0
    return (share.other_cpu_s + (share.interface_cpu_s or 0.0)) / share.window_s


def free_thread_count(cores: int, taken_cores: float) -> int:
    """Threads for the cores not taken (a core is taken from TAKEN_FROM of it used); at least one."""
    return max(1, min(cores, cores - math.floor(taken_cores + (1 - TAKEN_FROM))))


def wait_for_free_cores(*, max_wait_s: float = MAX_WAIT_S, window_s: float = WINDOW_S,
                        quiet_cores: float = QUIET_CORES,
                        start_meter: Callable[[], BusyMeter] = BusyMeter.start,
                        sleep: Callable[[float], None] = time.sleep,
                        clock: Callable[[], float] = time.perf_counter,
                        cancelled: Callable[[], bool] = lambda: False) -> FreeCores:
    """Look at the machine in windows of `window_s` until what else runs fits in `quiet_cores` or
    `max_wait_s` has passed (or `cancelled()`); the threads to use are the cores free in the last window."""
    started = clock()
    while True:
        meter = start_meter()
        sleep(window_s)
        share = meter.stop()
        taken = cores_taken(share)
        quiet = taken <= quiet_cores
        if quiet or clock() - started >= max_wait_s or cancelled():
            return FreeCores(cores=share.cores, threads=free_thread_count(share.cores, taken), taken_cores=taken,
                             waited_s=clock() - started, quiet=quiet)
