"""Tiny probes for the measurement-process tests (tests/test_worker.py): the worker runs this
module's PROBES instead of tutor.labs' when started with probes_module="worker_probes"."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from tutor.errors import UserError
from tutor.labs import Measurement, Probe, ProbeResult, ProgressFn


def _quick(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    progress(0.5, "halfway")
    value = float(params.get("value", 1.5))
    return ProbeResult("quick", (Measurement("value", value, "GB/s", 2.0, "the test's theory"),),
                       {"value": value, "torch_loaded": float("torch" in sys.modules)}, "done", details={"pid": os.getpid()})


def _sleepy(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    """Reports progress until cancelled, then returns what it has: a cooperative probe."""
    step = 0
    while not cancel.wait(0.02):
        step += 1
        progress(min(step / 1000, 0.99), f"step {step}")
    return ProbeResult("sleepy", (Measurement("steps", float(step), "steps"),), {"steps": float(step)},
                       "stopped when asked", cancelled=True)


def _stubborn(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    """Starts a child process (as multi-rank labs do), says its pid, and ignores cancel."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    progress(0.1, f"child {child.pid}")
    time.sleep(120)
    raise AssertionError("the stubborn probe should have been killed")


def _oom(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    """What the kernel's OOM killer does to a process: SIGKILL."""
    progress(0.2, "allocating")
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(10)
    raise AssertionError("unreachable")


def _broken(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    raise RuntimeError("the probe broke\nsecond line never shown")


def _refuses(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    raise UserError("size=0: must be at least 1")


def _limits(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    """The worker's address-space limit and nice value, as the process sees them."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return ProbeResult("limits", (), {"address_space": float(soft), "nice": float(os.getpriority(os.PRIO_PROCESS, 0))},
                       "limits")


def _unpicklable(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    return ProbeResult("unpicklable", (), {}, "a lambda in the details", details={"f": lambda: None})


WARMED_IN: list[int] = []
"""The native id of the thread that ran WARM in this worker."""


def WARM(channel: object) -> None:
    """The tests' stand-in for the worker's torch warm-up (tutor.worker.__main__.warm_function): it
    records the thread it ran in."""
    WARMED_IN.append(threading.get_native_id())


def _where(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    """Which thread of which process ran this job, and which thread warmed the worker up (-1: none)."""
    return ProbeResult("where", (), {"thread": float(threading.get_native_id()), "pid": float(os.getpid()),
                                     "warmed_in": float(WARMED_IN[0]) if WARMED_IN else -1.0}, "where")


def _probe(name: str, run) -> Probe:  # type: ignore[no-untyped-def]
    return Probe(name=name, title=f"test probe {name}", description="a test stand-in", needs_torch=False,
                 params_schema={}, run=run, default_params={"value": 1.5} if name == "quick" else {})


def _chatty(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    """Reports progress as fast as it can for `seconds`, then a last step and a pause: a probe
    that would flood the app's interface."""
    end = time.monotonic() + float(params.get("seconds", 0.6))
    count = 0
    while time.monotonic() < end:
        count += 1
        progress(min(count / 1e6, 0.9), f"report {count}")
    progress(0.95, "the last step")
    time.sleep(0.3)  # longer than the throttle's interval: the held last step must still arrive
    return ProbeResult("chatty", (Measurement("reports", float(count), "reports"),), {"reports": float(count)}, "done")


def _busy(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    """A BusyMeter reading over `seconds`, as a measurement in the worker takes it."""
    from tutor.bench.busy import INTERFACE_PID_ENV, BusyMeter

    meter = BusyMeter.start()
    time.sleep(float(params.get("seconds", 1.0)))
    share = meter.stop()
    return ProbeResult("busy", (), {"other_share": share.other_share}, share.describe(),
                       details={"interface_pid": os.environ.get(INTERFACE_PID_ENV), "busy": share.to_json()})


PROBES = {probe.name: probe for probe in (
    _probe("chatty", _chatty), _probe("busy", _busy),
    _probe("quick", _quick), _probe("sleepy", _sleepy), _probe("stubborn", _stubborn), _probe("oom", _oom),
    _probe("broken", _broken), _probe("refuses", _refuses),
    _probe("limits", _limits), _probe("unpicklable", _unpicklable), _probe("where", _where))}
