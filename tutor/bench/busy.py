"""How busy the machine was during a measurement: the CPU time other processes took.

A timing that will not settle usually means another program shared the cores (torch.utils.benchmark's Measurement warns of "system fluctuation"). Rather than
guess, this module measures it: the CPU time every process spent on the cores this process may use
(psutil.cpu_times per CPU, i.e. /proc/stat), minus the CPU time of this process and its children,
as a share of those cores over the same wall-clock window.

In the app the measurement runs in a process of its own (tutor.worker) whose parent is the app's
interface. That interface is the measurement's own app, not another program: the worker names it in
TENSOR_TUTOR_INTERFACE_PID, and its CPU time is counted apart ("this app's interface used 6%") and
left out of "other processes".

    meter = BusyMeter.start()
    ...  # measure
    busy = meter.stop()          # BusyShare: busy.other_share 0..1, busy.describe()
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psutil

# Other processes taking at least this share of the usable cores make the machine "busy" in what a
# learner reads. A desktop at rest (browser, editor, the tutor's own interface) stays well under it.
BUSY_SHARE = 0.15
CPU_SECONDS_DIGITS = 6
"""Other processes' CPU seconds are rounded to a microsecond (the counters tick at 1/100 s)."""
INTERFACE_PID_ENV = "TENSOR_TUTOR_INTERFACE_PID"
"""The app interface's process id, set by the measurement process for everything it runs."""


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds at one instant: all work on the usable cores, and this process tree's."""

    wall_s: float
    machine_busy_s: float
    own_s: float
    interface_s: float | None = None
    """CPU seconds of the app's interface process; None when the measurement has no interface (CLI)."""


@dataclass(frozen=True)
class BusyShare:
    """Who used the usable cores during a window: other processes, and this process tree."""

    window_s: float
    cores: int
    other_cpu_s: float
    own_cpu_s: float
    interface_cpu_s: float | None = None
    """The app interface's CPU seconds (not in other_cpu_s); None without one (the CLI)."""

    @property
    def other_share(self) -> float:
        """Other processes' CPU time as a share (0..1) of what the usable cores could give in the window."""
        return share_of_cores(self.other_cpu_s, self.window_s, self.cores)

    @property
    def own_share(self) -> float:
        """This process tree's CPU time as a share (0..1) of the usable cores over the window."""
        return share_of_cores(self.own_cpu_s, self.window_s, self.cores)

    @property
    def interface_share(self) -> float | None:
        """The app interface's CPU time as a share (0..1) of the usable cores; None without one."""
        if self.interface_cpu_s is None:
            return None
        return share_of_cores(self.interface_cpu_s, self.window_s, self.cores)

    @property
    def busy(self) -> bool:
        """True when other processes took at least BUSY_SHARE of the usable cores."""
        return self.other_share >= BUSY_SHARE

    def describe(self) -> str:
        """One line for people: how much of the machine other processes took."""
        from tutor.formatting import format_percent

        cores = f"{self.cores} core" + ("s" if self.cores != 1 else "")
        share = format_percent(self.other_share, digits=2)
        interface = self.interface_share
        besides = "" if interface is None else f"; this app's interface used {format_percent(interface, digits=2)}"
        if self.busy:
            return f"machine busy: other processes used {share} of {cores} during the measurement{besides}"
        return f"other processes used only {share} of {cores} during the measurement{besides}"

    def to_json(self) -> dict[str, Any]:
        return {"other_share": self.other_share, "own_share": self.own_share, "busy": self.busy,
                "cores": self.cores, "window_s": self.window_s, "other_cpu_s": self.other_cpu_s,
                "own_cpu_s": self.own_cpu_s, "threshold": BUSY_SHARE,
                "interface_share": self.interface_share, "interface_cpu_s": self.interface_cpu_s}


def share_of_cores(cpu_s: float, window_s: float, cores: int) -> float:
    """CPU seconds as a share of `cores` x `window_s` core-seconds, clamped to 0..1 (the two clocks
    are read a few microseconds apart, and /proc/stat ticks at 1/100 s, so a short window can read
    slightly outside)."""
    if window_s <= 0 or cores < 1:
        return 0.0
    return min(1.0, max(0.0, cpu_s / (window_s * cores)))


def usable_cpus() -> list[int]:
    """The logical CPUs this process may run on (affinity mask, container cpuset)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def busy_seconds(times: Any) -> float:
    """Non-idle CPU seconds of one psutil cputimes record: everything but idle and iowait, as psutil's
    own cpu_percent counts it (guest time is already inside user time on Linux, so it is not added)."""
    fields = times._asdict()
    total = sum(value for name, value in fields.items() if name not in ("guest", "guest_nice"))
    return total - fields.get("idle", 0.0) - fields.get("iowait", 0.0)


def machine_busy_seconds(cpus: Sequence[int]) -> float:
    """Non-idle CPU seconds so far on the CPUs `cpus`, every process counted."""
    import psutil

    per_cpu = psutil.cpu_times(percpu=True)
    if not per_cpu:
        return busy_seconds(psutil.cpu_times())
    return sum(busy_seconds(per_cpu[index]) for index in cpus if index < len(per_cpu))


def process_tree_seconds(root: psutil.Process | None = None) -> float:
    """CPU seconds so far of `root` (a psutil.Process; default: this process), its reaped children
    (children_user/children_system) and every live descendant."""
    import psutil

    root = root or psutil.Process()
    total = 0.0
    for process in [root, *_descendants(root)]:
        try:
            times = process.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        total += times.user + times.system + getattr(times, "children_user", 0.0) + getattr(times, "children_system", 0.0)
    return total


def process_seconds(process: psutil.Process) -> float | None:
    """CPU seconds so far of `process` alone (not its children: the app's children are the
    measurement itself); None once it is gone."""
    import psutil

    try:
        times = process.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return times.user + times.system


def interface_process() -> psutil.Process | None:
    """The app interface this measurement runs for (TENSOR_TUTOR_INTERFACE_PID, set by the
    measurement process), as a psutil.Process; None from the CLI, or when it is this process."""
    import psutil

    text = os.environ.get(INTERFACE_PID_ENV, "").strip()
    if not text.isdigit() or int(text) == os.getpid():
        return None
    try:
        return psutil.Process(int(text))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _descendants(root: psutil.Process) -> list[psutil.Process]:
    import psutil

    try:
        return root.children(recursive=True)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


class BusyMeter:
    """Two snapshots of CPU time, at start and stop; nothing runs in between."""

    def __init__(self, *, cpus: Sequence[int] | None = None, root: psutil.Process | None = None,
                 interface: psutil.Process | None = None, clock: Callable[[], float] = time.perf_counter) -> None:
        self.cpus = list(cpus) if cpus is not None else usable_cpus()
        self.root = root
        self.interface = interface if interface is not None else interface_process()
        self.clock = clock
        self.first: CpuSnapshot | None = None

    @classmethod
    def start(cls, *, cpus: Sequence[int] | None = None, root: psutil.Process | None = None,
              interface: psutil.Process | None = None, clock: Callable[[], float] = time.perf_counter) -> BusyMeter:
        meter = cls(cpus=cpus, root=root, interface=interface, clock=clock)
        meter.first = meter.snapshot()
        return meter

    def snapshot(self) -> CpuSnapshot:
        interface = process_seconds(self.interface) if self.interface is not None else None
        return CpuSnapshot(wall_s=self.clock(), machine_busy_s=machine_busy_seconds(self.cpus),
                           own_s=process_tree_seconds(self.root), interface_s=interface)

    def stop(self) -> BusyShare:
        """The share other processes took since start()."""
        if self.first is None:
            raise RuntimeError("BusyMeter.stop() before start()")
        return busy_share_between(self.first, self.snapshot(), cores=len(self.cpus))


def busy_share_between(first: CpuSnapshot, last: CpuSnapshot, *, cores: int) -> BusyShare:
    """What happened between two snapshots: other processes' CPU seconds are the machine's non-idle
    seconds minus this tree's and the app interface's (never below zero: /proc/stat and per-process
    times tick separately)."""
    window = max(0.0, last.wall_s - first.wall_s)
    own = max(0.0, last.own_s - first.own_s)
    machine = max(0.0, last.machine_busy_s - first.machine_busy_s)
    interface: float | None = None
    if first.interface_s is not None and last.interface_s is not None:
        interface = max(0.0, last.interface_s - first.interface_s)
    # The CPU seconds are whole ticks (1/100 s) summed in floats: an exact zero can come out as 1e-14
    # s, which a learner would read as "1.7 × 10⁻¹²%"; nothing finer than a microsecond is real.
    other = round(max(0.0, machine - own - (interface or 0.0)), CPU_SECONDS_DIGITS)
    return BusyShare(window_s=window, cores=max(1, cores), other_cpu_s=other, own_cpu_s=own, interface_cpu_s=interface)
