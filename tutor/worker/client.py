"""The app's side of the measurement process: start it, send it jobs, follow its state.

`WorkerClient` owns one worker process at a time (`python -m tutor.worker`). It is started with
subprocess.Popen and a socketpair, not multiprocessing: inside Textual's App.run() sys.stderr is
replaced and multiprocessing's spawn fails (`bad value(s) in fds_to_keep`). The worker gets its own
session (process group), so a cancel that the probe does not honour within CANCEL_GRACE_S kills it
with every rank process it started, and a fresh worker is started in the background.

`run_job` blocks (call it from a thread): it waits for torch to be loaded, forwards progress,
honours the cancel Event and returns the job's value, `CANCELLED`, or raises UserError with the
failure as one line. Each worker process is started and watched by its own thread, which lives as
long as that process: Linux's parent-death signal is tied to the thread that started the child.
"""

from __future__ import annotations

import itertools
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tutor.errors import UserError
from tutor.worker.protocol import Channel, ChannelClosed, Frame

CANCEL_GRACE_S = 0.35
"""How long a probe has to honour its cancel Event before the process is killed: with the kill
and the reply this keeps cancel -> idle within the 0.5 s cancel goal."""
POLL_S = 0.02
STOP_WAIT_S = 1.0
STDERR_TAIL_CHARS = 400

PHASES = ("not started", "starting", "loading torch", "ready", "busy", "restarting", "failed", "stopped")


class Cancelled:
    """The job was cancelled before it produced a value (the process was killed, or never asked)."""

    def __repr__(self) -> str:
        return "CANCELLED"


CANCELLED = Cancelled()


@dataclass(frozen=True)
class WorkerState:
    """What the measurement process is doing, for the app to show.

    phase is one of PHASES; job names what runs while busy; reason says why it failed."""

    phase: str
    job: str = ""
    reason: str = ""

    @property
    def text(self) -> str:
        """One line for a header or a status bar."""
        if self.phase == "busy":
            return f"measuring: {self.job}" if self.job else "measuring"
        if self.phase == "restarting":
            return "restarting the measurement process"
        if self.phase == "failed":
            return self.reason or "the measurement process stopped"
        if self.phase == "loading torch":
            return "loading torch in the measurement process"
        if self.phase == "ready":
            return "measurement process ready"
        return f"measurement process {self.phase}"

    @property
    def short(self) -> str:
        """A few words for the header ('' when there is nothing to say: not started, stopped)."""
        return SHORT_TEXT.get(self.phase, "")


SHORT_TEXT = {
    "starting": "loading torch…",
    "loading torch": "loading torch…",
    "ready": "ready to measure",
    "busy": "measuring…",
    "restarting": "restarting measurer…",
    "failed": "measurer failed",
}
"""WorkerState.short for each phase: the header's word on the measurement process."""


StateListener = Callable[[WorkerState], None]


@dataclass
class _Job:
    id: int
    name: str
    events: "queue.Queue[Frame]"


class _Generation:
    """One worker process and the thread that started it and reads its frames."""

    def __init__(self, process: subprocess.Popen[bytes], channel: Channel, stderr: IO[bytes]) -> None:
        self.process = process
        self.channel = channel
        self.stderr = stderr
        self.killed_on_purpose = False
        self.ready = False
        self.ended: str | None = None
        """Why the process ended (exit_reason), once it has."""

    def stderr_tail(self) -> str:
        """The last line the worker wrote to stderr (a traceback's last line says what failed)."""
        try:
            self.stderr.seek(0)
            text = self.stderr.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""
        lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
        return lines[-1][-STDERR_TAIL_CHARS:] if lines else ""

    def kill(self) -> None:
        """SIGKILL the worker's process group (it and every rank process it started)."""
        self.killed_on_purpose = True
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass  # already gone
        self.channel.close()


def exit_reason(returncode: int | None, stderr_tail: str) -> str:
    """Why a worker process ended, in words: a SIGKILL is what the kernel's OOM killer sends."""
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if -returncode == signal.SIGKILL:
            return f"killed by {name}" + (f"; {stderr_tail}" if stderr_tail else "")
        return f"ended by {name}" + (f"; {stderr_tail}" if stderr_tail else "")
    return f"exit code {returncode}" + (f": {stderr_tail}" if stderr_tail else "")


class WorkerClient:
    """Starts and supervises the measurement process; thread-safe."""

    def __init__(self, *, probes_module: str | None = None, warm: bool = True,
                 python: str = sys.executable, env: dict[str, str] | None = None) -> None:
        self.probes_module = probes_module
        self.warm = warm
        self.python = python
        self.extra_env = dict(env or {})
        self._lock = threading.Condition()
        self._job_lock = threading.Lock()
        self._generation: _Generation | None = None
        self._job: _Job | None = None
        self._state = WorkerState("not started")
        self._listeners: list[StateListener] = []
        self._ids = itertools.count(1)
        self._stopped = False
        self._starting = False

    # ---- state --------------------------------------------------------------------------------

    @property
    def state(self) -> WorkerState:
        with self._lock:
            return self._state

    def subscribe(self, listener: StateListener) -> None:
        """Call listener(state) on every change (from whichever thread changed it) and once now."""
        with self._lock:
            self._listeners.append(listener)
            state = self._state
        listener(state)

    def unsubscribe(self, listener: StateListener) -> None:
        with self._lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    def _set_state(self, state: WorkerState) -> None:
        with self._lock:
            if state == self._state:
                return
            self._state = state
            listeners = list(self._listeners)
            self._lock.notify_all()
        for listener in listeners:
            listener(state)

    @property
    def pid(self) -> int | None:
        """The worker's process id (its process group's id too), None when none runs."""
        with self._lock:
            generation = self._generation
        return generation.process.pid if generation is not None and generation.process.poll() is None else None

    # ---- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker in the background unless one runs or is starting."""
        with self._lock:
            if self._generation is not None or self._starting or self._stopped:
                return
            self._starting = True
            restarting = self._state.phase == "restarting"
        if not restarting:
            self._set_state(WorkerState("starting"))
        started = threading.Event()
        threading.Thread(target=self._supervise, args=(started,), daemon=True, name="measurement-process").start()
        started.wait()

    def _command(self, fd: int) -> list[str]:
        command = [self.python, "-m", "tutor.worker", "--fd", str(fd), "--parent", str(os.getpid())]
        if self.probes_module:
            command += ["--probes", self.probes_module]
        if not self.warm:
            command.append("--no-warm")
        return command

    def _environment(self) -> dict[str, str]:
        # The worker imports the same tutor package as the app, wherever the app found it.
        source_root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, **self.extra_env}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [source_root, env.get("PYTHONPATH", "")]))
        return env

    def _supervise(self, started: threading.Event) -> None:
        """Start one worker process, read its frames until it ends, then say why it ended."""
        ours, theirs = socket.socketpair()
        stderr = tempfile.TemporaryFile()
        try:
            process = subprocess.Popen(self._command(theirs.fileno()), stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=stderr, pass_fds=(theirs.fileno(),),
                                       start_new_session=True, env=self._environment())
        except OSError as error:
            theirs.close()
            ours.close()
            stderr.close()
            with self._lock:
                self._starting = False
            started.set()
            self._set_state(WorkerState("failed", reason=f"the measurement process could not start: {error}"))
            return
        theirs.close()
        generation = _Generation(process, Channel(ours), stderr)
        with self._lock:
            self._generation = generation
            self._starting = False
        started.set()
        try:
            while True:
                try:
                    event = generation.channel.receive()
                except ChannelClosed:
                    break
                self._dispatch(generation, event)
        finally:
            self._ended(generation)

    def _dispatch(self, generation: _Generation, event: Frame) -> None:
        if event.get("event") == "state":
            if event["phase"] == "ready":
                generation.ready = True
            self._set_state(WorkerState(event["phase"]))
            return
        with self._lock:
            job = self._job
        if job is not None and event.get("job") == job.id:
            job.events.put(event)

    def _ended(self, generation: _Generation) -> None:
        returncode = generation.process.wait()
        reason = exit_reason(returncode, generation.stderr_tail())
        generation.ended = reason
        generation.channel.close()
        generation.stderr.close()
        with self._lock:
            if self._generation is generation:
                self._generation = None
            job = self._job
            stopped = self._stopped
        if job is not None:
            job.events.put({"event": "exit", "reason": reason, "on_purpose": generation.killed_on_purpose})
        if stopped:
            self._set_state(WorkerState("stopped"))
        elif generation.killed_on_purpose:
            self._set_state(WorkerState("restarting"))
            self.start()
        elif job is not None:
            self._set_state(WorkerState("failed", job=job.name, reason=died_while_running(job.name, reason)))
        elif not generation.ready:
            self._set_state(WorkerState("failed", reason=f"the measurement process could not start ({reason})"))
        else:
            self._set_state(WorkerState("failed", reason=f"the measurement process stopped ({reason})"))

    def stop(self) -> None:
        """End the worker and every process it started; later jobs fail. Quick: no waiting on it."""
        with self._lock:
            self._stopped = True
            generation = self._generation
        if generation is not None:
            # On purpose from here: a worker that ends itself on "exit" before the kill below (a stubborn
            # job, its own SIGKILL of its group) must not read as one that died under its job.
            generation.killed_on_purpose = True
            try:
                generation.channel.send({"op": "exit"})
            except ChannelClosed:
                pass  # already gone
            generation.kill()
            try:
                generation.process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                pass  # SIGKILLed: the kernel reaps it; the supervising thread waits for it
        self._set_state(WorkerState("stopped"))

    # ---- jobs ---------------------------------------------------------------------------------

    def run_job(self, name: str, command: Frame, progress: Callable[[float, str], None],
                cancel: threading.Event) -> object:
        """Run `command` (kind + arguments) in the worker; see the module docstring."""
        while not self._job_lock.acquire(timeout=POLL_S):  # one job at a time: two would measure each other
            if cancel.is_set():
                return CANCELLED
        try:
            generation = self._wait_ready(progress, cancel)
            if generation is None:
                return CANCELLED
            job = _Job(next(self._ids), name, queue.Queue())
            with self._lock:
                self._job = job
            self._set_state(WorkerState("busy", job=name))
            try:
                return self._follow(generation, job, {**command, "op": "run", "job": job.id}, progress, cancel)
            finally:
                with self._lock:
                    self._job = None
                    busy = self._state.phase == "busy"
                if busy:
                    self._set_state(WorkerState("ready"))
        finally:
            self._job_lock.release()

    def _wait_ready(self, progress: Callable[[float, str], None], cancel: threading.Event) -> _Generation | None:
        """The running, warm worker (starting one if needed); None when cancelled while waiting."""
        with self._lock:
            stopped = self._stopped
        if stopped:
            raise UserError("the measurement process has been stopped (the app is closing)")
        self.start()
        told = False
        while True:
            with self._lock:
                generation, state = self._generation, self._state
                if generation is None and state.phase == "failed":
                    raise UserError(state.reason)
                if generation is not None and generation.ready and not generation.killed_on_purpose:
                    return generation
                if not told:
                    told = True
                    progress(0.0, "waiting for the measurement process to load torch")
                self._lock.wait(POLL_S)
            if cancel.is_set():
                return None

    def _follow(self, generation: _Generation, job: _Job, command: Frame,
                progress: Callable[[float, str], None], cancel: threading.Event) -> object:
        try:
            generation.channel.send(command)
        except ChannelClosed:
            pass  # the end of the stream arrives as an "exit" event
        cancel_sent_at: float | None = None
        while True:
            try:
                event = job.events.get(timeout=POLL_S)
            except queue.Empty:
                if generation.ended is not None and job.events.empty():
                    # It ended before this job was registered to hear so (or the event was missed).
                    job.events.put({"event": "exit", "reason": generation.ended,
                                    "on_purpose": generation.killed_on_purpose})
                elif cancel.is_set() and cancel_sent_at is None:
                    cancel_sent_at = time.monotonic()
                    try:
                        generation.channel.send({"op": "cancel", "job": job.id})
                    except ChannelClosed:
                        pass
                elif cancel_sent_at is not None and time.monotonic() - cancel_sent_at > CANCEL_GRACE_S:
                    self._set_state(WorkerState("restarting"))
                    generation.kill()
                    return CANCELLED
                continue
            kind = event["event"]
            if kind == "progress":
                progress(event["fraction"], event["text"])
            elif kind == "result":
                return event["value"]
            elif kind == "error":
                raise UserError(event["message"])
            elif kind == "exit":
                if event["on_purpose"]:
                    return CANCELLED
                raise UserError(died_while_running(job.name, event["reason"]))


def died_while_running(job: str, reason: str) -> str:
    """The one line a learner reads when the worker dies under a job."""
    if reason.startswith("killed by SIGKILL"):
        return f"the measurement process was killed (probably out of memory) while running {job}: {reason}"
    return f"the measurement process stopped while running {job}: {reason}"
