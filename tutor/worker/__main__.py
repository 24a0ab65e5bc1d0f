"""The measurement process: `python -m tutor.worker --fd N --parent PID [--probes MODULE] [--no-warm]`.

Started by tutor.worker.client.WorkerClient (never by a user). It imports torch and warms it while
the learner reads, then runs one job at a time (probes, the bench suite, torch casts) and answers
on the socket it inherited as fd N. Warming and every job run in one long-lived measurement thread
(`JobThread`): torch's OpenMP runtime keeps a pool of threads per thread that calls it, so a job in
a thread of its own met a cold pool of its own beside the warm one, twice the threads for the
cores, and libgomp then stops spinning between parallel regions (it throttles once it manages
more threads than there are CPUs): on the 2-core machine fp32 matmuls in a fresh thread after the
main thread's warm-up ran at one core's rate (150-156 GFLOP/s at 1024^3 against 320-355 in the
warming thread; 256^3: 180-200 against 315-330), what the low first numbers read. The main
thread only reads commands, so a cancel reaches the job's Event at once. It dies with the app: end of stream on the socket, or the parent's
death (Linux PR_SET_PDEATHSIG), kills its whole process group (rank processes included).
It names the app in TENSOR_TUTOR_INTERFACE_PID, so busy readings (tutor.bench.busy) count the
app's interface apart from other programs, and sends each job's progress at most 10 times a second.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pickle
import queue
import signal
import socket
import sys
import threading
import time
import types
from collections.abc import Callable, Mapping
from tutor.bench.busy import INTERFACE_PID_ENV
from tutor.errors import UserError
from tutor.labs.probe import Probe, ProgressFn
from tutor.worker.protocol import Channel, ChannelClosed, Frame

MEASUREMENT_NICENESS = 10
"""The worker's nice value: the app's interface thread gets a core as soon as it needs one."""
PROGRESS_INTERVAL_S = 0.1
"""Progress reports closer together than this are held back (at most 10 a second per job: each one
repaints a bar and a status line in the app's interface, which shares the cores with the measurement);
the latest held-back report is sent when the interval has passed, and a final one (fraction 1) at once."""
MEMORY_LIMIT_ENV = "TENSOR_TUTOR_WORKER_MEMORY_LIMIT"
"""Address-space limit for the worker (e.g. 3GiB): a way to rehearse running out of memory."""
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Ask Linux to send SIGTERM when the parent dies (the handler then ends the process group);
    leave at once if the parent is already gone. Elsewhere the socket's end of stream does it."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):
            pass  # no prctl: the end of stream on the socket still ends the worker
    if os.getppid() != parent_pid:
        end_process_group()


def end_process_group() -> None:
    """Kill this process and every process it started (rank processes share its group)."""
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(0)


def lower_priority() -> None:
    """Nice the whole worker (threads and the rank processes it spawns inherit it)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, MEASUREMENT_NICENESS)
    except OSError:
        pass  # not allowed here: the measurement just competes evenly


def apply_memory_limit() -> None:
    """RLIMIT_AS from TENSOR_TUTOR_WORKER_MEMORY_LIMIT (bytes, or 3GiB, 500MB), if set."""
    text = os.environ.get(MEMORY_LIMIT_ENV, "").strip()
    if not text:
        return
    import resource

    from tutor.theory.units import parse_bytes

    limit = parse_bytes(text)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def warm_torch(channel: Channel) -> None:
    """Import torch and warm it as every matmul measurement does (tutor.bench.matmul.warm_up): the
    first timed run then meets a loaded library, a started thread pool and faulted-in kernels."""
    channel.send({"event": "state", "phase": "loading torch"})
    from tutor.bench.matmul import warm_up

    warm_up("cpu")


def warm_function(module: types.ModuleType, channel: Channel) -> Callable[[], None]:
    """How the measurement thread warms up: the probes module's WARM(channel) where it has one (the
    tests' stand-in for torch), else torch's (warm_torch)."""
    warm = getattr(module, "WARM", None) or warm_torch
    return lambda: warm(channel)


def load_probes(module_name: str | None) -> types.ModuleType:
    """The module whose PROBES the jobs run: tutor.labs (each lab's module imported when it first
    runs), or a test module."""
    return importlib.import_module(module_name or "tutor.labs")


def job_function(job: Frame, probes: Mapping[str, Probe]) -> Callable[[ProgressFn, threading.Event], object]:
    """What a "run" command asks for, as fn(progress, cancel)."""
    kind = job["kind"]
    if kind == "probe":
        probe = probes.get(job["name"])
        if probe is None:
            raise UserError(f"unknown lab {job['name']!r}")
        return lambda progress, cancel: probe.run(dict(job["params"]), progress, cancel)
    if kind == "bench":
        from tutor.worker.jobs import run_bench_suite

        return run_bench_suite
    if kind == "cast":
        from tutor.worker.jobs import torch_cast

        return lambda progress, cancel: torch_cast(job["value"], job["formats"])
    raise UserError(f"unknown job kind {kind!r}")


class ProgressThrottle:
    """A job's progress callback that passes at most one report per `interval_s` on to `send`.

    A report that comes too soon is held, and the newest held one is sent when the interval has
    passed (by a timer if no later report comes), so the app never shows a stale step; a report
    of fraction 1 (done) goes at once. `close()` drops what is held: nothing after the result."""

    def __init__(self, send: ProgressFn, interval_s: float = PROGRESS_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.send = send
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._last_sent: float | None = None
        self._held: tuple[float, str] | None = None
        self._timer: threading.Timer | None = None
        self._closed = False

    def __call__(self, fraction: float, text: str) -> None:
        with self._lock:
            if self._closed:
                return
            now, last = self.clock(), self._last_sent
            if fraction >= 1.0 or last is None or now - last >= self.interval_s:
                self._held = None
                self._last_sent = now
                self.send(fraction, text)
                return
            self._held = (fraction, text)
            if self._timer is None:
                self._start_timer(self.interval_s - (now - last))

    def _start_timer(self, delay_s: float) -> None:
        self._timer = threading.Timer(max(delay_s, 0.0), self._send_held)
        self._timer.daemon = True
        self._timer.start()

    def _send_held(self) -> None:
        with self._lock:
            self._timer = None
            if self._closed or self._held is None:
                return
            now, last = self.clock(), self._last_sent
            if last is not None and now - last < self.interval_s:
                # A report went out directly since this timer was set: wait out its interval.
                self._start_timer(self.interval_s - (now - last))
                return
            fraction, text = self._held
            self._held = None
            self._last_sent = now
            self.send(fraction, text)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._held = None
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


class JobThread:
    """The one thread that warms torch and runs every job, in turn (see the module docstring)."""

    def __init__(self) -> None:
        self._tasks: queue.Queue[Callable[[], None]] = queue.Queue()
        self.thread = threading.Thread(target=self._serve, daemon=True, name="measurement")
        self.thread.start()

    def _serve(self) -> None:
        while True:
            self._tasks.get()()

    def submit(self, task: Callable[[], None]) -> None:
        """Run `task` in the measurement thread after what is already queued; returns at once."""
        self._tasks.put(task)

    def call(self, task: Callable[[], None]) -> None:
        """Run `task` in the measurement thread and wait for it; its exception is raised here."""
        done = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                task()
            except BaseException as error:  # noqa: BLE001 - handed to the caller, who decides
                failure.append(error)
            finally:
                done.set()

        self.submit(run)
        done.wait()
        if failure:
            raise failure[0]


class Worker:
    """Reads commands, runs one job at a time in the measurement thread, reports."""

    def __init__(self, channel: Channel, probes: Mapping[str, Probe], jobs: JobThread | None = None) -> None:
        self.channel = channel
        self.probes = probes
        self.jobs = jobs or JobThread()
        self.current: tuple[int, threading.Event] | None = None
        self._lock = threading.Lock()

    def serve(self) -> None:
        while True:
            try:
                command = self.channel.receive()
            except ChannelClosed:
                return
            op = command.get("op")
            if op == "exit":
                return
            if op == "cancel":
                with self._lock:
                    if self.current is not None and self.current[0] == command["job"]:
                        self.current[1].set()
            elif op == "run":
                self.start(command)

    def start(self, job: Frame) -> None:
        with self._lock:
            if self.current is not None:
                self.send({"event": "error", "job": job["job"], "message": "the measurement process is busy"})
                return
            cancel = threading.Event()
            self.current = (job["job"], cancel)
        self.jobs.submit(lambda: self.run(job, cancel))

    def run(self, job: Frame, cancel: threading.Event) -> None:
        job_id = job["job"]
        progress = ProgressThrottle(
            lambda fraction, text: self.send({"event": "progress", "job": job_id, "fraction": float(fraction),
                                              "text": str(text)}))
        try:
            value = job_function(job, self.probes)(progress, cancel)
        except UserError as error:
            reply = {"event": "error", "job": job_id, "message": str(error)}
        except MemoryError as error:
            reply = {"event": "error", "job": job_id, "message": f"out of memory: {error}".rstrip(": ")}
        except Exception as error:  # noqa: BLE001 - arbitrary probe code: any failure is a message to the app
            first = str(error).splitlines()[0] if str(error) else ""
            reply = {"event": "error", "job": job_id, "message": f"{type(error).__name__}: {first}".rstrip(": ")}
        else:
            reply = {"event": "result", "job": job_id, "value": value}
        finally:
            progress.close()  # nothing of this job may arrive after its result
        with self._lock:
            self.current = None
        try:
            self.channel.send(reply)
        except ChannelClosed:
            end_process_group()
        except (pickle.PicklingError, TypeError, AttributeError) as error:  # a result pickle cannot carry
            self.send({"event": "error", "job": job_id, "message": f"the result could not be sent back: {error}"})

    def send(self, message: Frame) -> None:
        try:
            self.channel.send(message)
        except ChannelClosed:
            end_process_group()  # nobody is listening: the app is gone


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tutor.worker", description="tensor-tutor's measurement process")
    parser.add_argument("--fd", type=int, required=True, help="the inherited socket's file descriptor")
    parser.add_argument("--parent", type=int, required=True, help="the app's process id")
    parser.add_argument("--probes", default=None, help="module whose PROBES the jobs run (tests)")
    parser.add_argument("--no-warm", action="store_true", help="do not import torch at start (tests)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: end_process_group())
    die_with_parent(args.parent)
    # Busy readings (tutor.bench.busy) count the app's interface apart from other programs.
    os.environ[INTERFACE_PID_ENV] = str(args.parent)
    os.set_inheritable(args.fd, False)  # rank processes must not hold the app's socket open
    channel = Channel(socket.socket(fileno=args.fd))
    lower_priority()
    apply_memory_limit()
    jobs = JobThread()  # after lower_priority: the thread, and the OpenMP pool it starts, inherit the nice value
    try:
        module = load_probes(args.probes)
        if not args.no_warm:
            jobs.call(warm_function(module, channel))
        channel.send({"event": "state", "phase": "ready"})
    except ChannelClosed:
        end_process_group()
    Worker(channel, module.PROBES, jobs).serve()
    end_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
