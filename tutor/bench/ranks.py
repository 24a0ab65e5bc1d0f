"""Run one function on N ranks of torch.distributed: local processes here, or the ranks torchrun started.

Local mode (no RANK/WORLD_SIZE in the environment): `run_ranks` spawns `ranks` processes (spawn
start method, so no torch state is forked), picks a free port on 127.0.0.1, and initialises the
default process group in each: gloo on CPU tensors, NCCL when there is a GPU per rank (the `gpu`
path; tests marked `gpu`). Each rank runs `fn(ctx, params)` and sends its dict back over a pipe;
the parent returns the dicts in rank order. The parent is the only one that decides:

- a rank that raises, exits or is killed: every other rank is terminated at once (SIGTERM, then
  SIGKILL after KILL_GRACE_S), and `RankFailure` names the rank and the cause;
- a rank that has not finished after `timeout_s` (start-up included): all are terminated and the
  message names the unfinished ranks;
- cancel (the caller's Event): ranks see `ctx.cancelled()`, get CANCEL_GRACE_S to stop, the rest are
  terminated, and `RanksCancelled` is raised;
- Ctrl-C: ranks ignore SIGINT (it reaches the whole terminal process group), so only the parent
  reacts, with one line; a rank whose parent dies follows it (Linux PR_SET_PDEATHSIG, plus a thread
  watching the parent pid where prctl is missing).

When run_ranks returns or raises, no rank process remains.

torchrun mode (RANK, WORLD_SIZE and LOCAL_RANK set): nothing is spawned; this process is one rank. The
default group is initialised from the environment (env://), `fn` runs here, and the dicts of every
rank are all-gathered so each rank returns the same list. torchrun itself handles a dead rank.

PR_SET_PDEATHSIG fires when the *thread* that started the child ends; run_ranks never returns
while a rank lives, so the thread that calls it outlives its ranks.
"""

from __future__ import annotations

import datetime
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tutor.errors import UserError

RankFn = Callable[["RankContext", dict], dict]
"""A MODULE-LEVEL function (spawn pickles it by name): runs with the default group initialised and
returns a picklable dict."""

# An interpreter with torch imported measured 221 MiB resident on the 2-core dev box (psutil, torch
# 2.13 CPU); gloo's buffers and a lab's small model come on top. Labs pass their own estimate.
DEFAULT_MEMORY_PER_RANK = 512 * 2**20
KILL_GRACE_S = 1.0  # between SIGTERM and SIGKILL
CANCEL_GRACE_S = 1.0  # ranks that saw ctx.cancelled() get this long to return
FAILURE_SETTLE_S = 0.3  # after the first failure, time for the real cause (a killed peer) to show up
WATCHDOG_PERIOD_S = 0.5
_PR_SET_PDEATHSIG = 1
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


class RankFailure(UserError):
    """A rank failed, died or hung; the message names it and the cause (one line). `rank` is the
    rank named; `reason` is "failed" (raised), "exited" (died without a report) or "timeout"."""

    def __init__(self, message: str, *, rank: int | None = None, reason: str = "failed") -> None:
        super().__init__(message)
        self.rank, self.reason = rank, reason


class RanksCancelled(Exception):
    """The caller cancelled the run; every rank has been stopped."""


@dataclass(frozen=True)
class RankContext:
    """What `fn` knows about its rank. `progress` reports reach run_ranks' callback from rank 0 only."""

    rank: int
    world: int
    local_rank: int
    device: str  # "cpu" or "cuda:N"
    backend: str  # "gloo" or "nccl"
    _progress: Callable[[float, str], None] | None = field(default=None, repr=False, compare=False)
    _cancelled: Callable[[], bool] | None = field(default=None, repr=False, compare=False)

    def progress(self, fraction: float, message: str) -> None:
        if self.rank == 0 and self._progress is not None:
            self._progress(float(fraction), str(message))

    def cancelled(self) -> bool:
        """True once the parent asked to stop: check between steps. Ranks may see it at different
        steps; a rank left waiting in a collective is terminated after the grace period."""
        return self._cancelled is not None and self._cancelled()


def under_torchrun() -> bool:
    """Whether this process is one rank of a torchrun (or other env:// launcher) job."""
    return all(name in os.environ for name in _TORCHRUN_VARS)


def torchrun_variable(name: str) -> int:
    """One of torchrun's RANK, WORLD_SIZE, LOCAL_RANK as a whole number; a UserError naming it when a
    value left in the environment is not one (e.g. `RANK=x`), instead of a ValueError traceback."""
    text = os.environ.get(name, "")
    try:
        value = int(text)
    except ValueError:
        raise UserError(f"{name}={text!r} in the environment is not a whole number: under torchrun it is set for "
                        f"you; outside it, unset {' '.join(_TORCHRUN_VARS)}") from None
    if value < 0:
        raise UserError(f"{name}={value} in the environment is negative: unset {' '.join(_TORCHRUN_VARS)}")
    return value


_RENDEZVOUS_VARS = ("MASTER_ADDR", "MASTER_PORT")
RENDEZVOUS_TIMEOUT_S = 30.0
"""How long ranks of an env:// job outside torchrun's agent wait for each other to meet: ranks started together
meet within seconds; variables left over from an earlier job (RANK=0 WORLD_SIZE=2 in the shell) would make
rank 0 wait for a peer that never comes. Under torchrun (TORCHELASTIC_RUN_ID set) its agent has already
gathered the job, and the collective timeout applies."""


def _unset_hint() -> str:
    return f"under torchrun every rank gets them; outside it, unset {' '.join(_TORCHRUN_VARS + _RENDEZVOUS_VARS)}"


@dataclass(frozen=True)
class TorchrunJob:
    """The env:// job this process is one rank of, as the environment describes it (checked)."""

    rank: int
    world: int
    local_rank: int
    master_addr: str
    master_port: int
    local_world: int = 1

    @property
    def under_agent(self) -> bool:
        """Started by torchrun's elastic agent (which has already gathered the job)."""
        return bool(os.environ.get("TORCHELASTIC_RUN_ID"))


def torchrun_job() -> TorchrunJob:
    """This process's rank, world and rendezvous address from RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
    MASTER_PORT; one UserError line for a set that cannot be a job (a missing, non-numeric or out-of-range
    value: variables left over from an earlier torchrun), instead of torch's traceback or a wait."""
    rank, world, local = (torchrun_variable(name) for name in _TORCHRUN_VARS)
    missing = [name for name in _RENDEZVOUS_VARS if not os.environ.get(name, "").strip()]
    if missing:
        raise UserError(f"RANK, WORLD_SIZE and LOCAL_RANK are set but {' and '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} not, so this is no torchrun job (variables left "
                        f"over from one?): {_unset_hint()}")
    port = torchrun_variable("MASTER_PORT")
    if world < 1 or rank >= world or local >= world or not 1 <= port <= 65535:
        raise UserError(f"RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local}, MASTER_PORT={port} cannot describe "
                        f"a job (0 <= rank < world, a port 1..65535): {_unset_hint()}")
    local_world = torchrun_variable("LOCAL_WORLD_SIZE") if os.environ.get("LOCAL_WORLD_SIZE") else 1
    return TorchrunJob(rank, world, local, os.environ["MASTER_ADDR"].strip(), port, max(1, local_world))


def init_torchrun_group(job: TorchrunJob, backend: str, device: str, timeout_s: float) -> None:
    """The default process group of `job`: its ranks meet through torch's env:// rendezvous within
    RENDEZVOUS_TIMEOUT_S (outside torchrun's agent), then collectives time out after `timeout_s`. A
    rendezvous that fails or finds no peers is one UserError line naming the address."""
    import torch.distributed as dist

    meet_s = max(60.0, timeout_s) if job.under_agent else RENDEZVOUS_TIMEOUT_S
    where = f"{job.master_addr}:{job.master_port}"
    if job.rank != 0 and not job.under_agent and not _reachable(job.master_addr, job.master_port, meet_s):
        # Checked here: torch's client retries print C++ stack traces to stderr before it gives up.
        raise UserError(f"rank {job.rank} of {job.world} found no torchrun job at {where} within {meet_s:g} s "
                        f"(nothing listens there); {_unset_hint()}")
    try:
        store, rank, world = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=meet_s)))
    except (RuntimeError, ValueError, OSError) as error:  # DistStoreError / DistNetworkError are RuntimeErrors
        first = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise UserError(f"rank {job.rank} of {job.world} found no torchrun job at {where} within {meet_s:g} s "
                        f"({first}); {_unset_hint()}") from None
    collective = datetime.timedelta(seconds=max(60.0, timeout_s))
    store.set_timeout(collective)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=collective,
                            **process_group_device(backend, device))


def _reachable(host: str, port: int, within_s: float) -> bool:
    """Whether something accepts TCP connections at host:port before `within_s` seconds pass."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:  # refused, unreachable, or an unknown host
            if time.monotonic() + 0.5 > deadline:
                return False
            time.sleep(0.5)  # rank 0 may not have opened the store yet


def torchrun_rank() -> int | None:
    """This process's global rank under torchrun, None outside it."""
    return torchrun_variable("RANK") if under_torchrun() else None


def local_rank_cap(backend: str = "gloo") -> tuple[int, str]:
    """(most local ranks, why): one CPU core per rank (on gloo a rank's collectives and compute run on
    the CPU, so two ranks on one core take turns and each one's timing includes the other's work); on
    NCCL one GPU per rank as well."""
    from tutor.bench.timing import usable_cpu_count

    cores = usable_cpu_count()
    if backend == "nccl":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if gpus < cores:
            return gpus, f"this machine has {gpus} GPU{'s' if gpus != 1 else ''} and NCCL needs one per rank"
    return cores, (f"this machine has {cores} usable CPU core{'s' if cores != 1 else ''}, and ranks sharing a core "
                   f"take turns, so each would time the others' work")


def check_local_ranks(ranks: int, *, memory_per_rank_bytes: int = DEFAULT_MEMORY_PER_RANK,
                      backend: str = "gloo") -> None:
    """UserError (one line, with the numbers) when `ranks` local processes do not fit this machine:
    more than local_rank_cap, or ranks x memory_per_rank_bytes beyond the share of available memory
    a measurement may use (tutor.bench.memory)."""
    from tutor.bench.memory import MEMORY_SHARE, available_memory_bytes
    from tutor.formatting import format_bytes

    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 1:
        raise UserError(f"ranks must be a whole number of at least 1, got {ranks!r}")
    cap, why = local_rank_cap(backend)
    if ranks > cap:
        raise UserError(f"{ranks:,} local ranks is more than {cap:,}: {why}; use ranks <= {cap:,}, or torchrun "
                        f"across machines for more")
    room = available_memory_bytes("cpu")
    need = ranks * memory_per_rank_bytes
    if room is not None and need > MEMORY_SHARE * room:
        most = max(0, int(MEMORY_SHARE * room // max(1, memory_per_rank_bytes)))
        raise UserError(f"{ranks:,} local ranks need about {format_bytes(need)} ({format_bytes(memory_per_rank_bytes)} "
                        f"each); this machine has {format_bytes(room)} available and ranks may use "
                        f"{MEMORY_SHARE:.0%} of it; use ranks <= {most:,}")


def choose_backend(ranks: int, backend: str | None = None) -> str:
    """NCCL when there are at least `ranks` GPUs, else gloo; an explicit choice is kept."""
    if backend is not None:
        if backend not in ("gloo", "nccl"):
            raise UserError(f"unknown backend {backend!r} (choose gloo or nccl)")
        return backend
    import torch

    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= ranks else "gloo"


def torchrun_backend(local_world: int) -> str:
    """The backend of a torchrun job whose nodes each run `local_world` ranks: NCCL when every one of
    them has a GPU of its own, else gloo. Every rank gets the same answer: NCCL refuses two ranks on
    one GPU (and a rank past the last GPU has none to set), and ranks that chose different backends
    would never meet in the process group."""
    return choose_backend(local_world)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now: the rendezvous of a local run's ranks."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def process_group_device(backend: str, device: str) -> dict[str, Any]:
    """`device_id` for init_process_group on NCCL: it binds the rank to its GPU up front, without which
    PyTorch warns at the first barrier that the device is guessed (and may hang on a wrong guess).
    Empty for gloo, and for a torch whose init_process_group has no device_id."""
    import inspect

    import torch
    import torch.distributed as dist

    if backend != "nccl" or "device_id" not in inspect.signature(dist.init_process_group).parameters:
        return {}
    return {"device_id": torch.device(device)}


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "did not exit"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown"
        return f"killed by signal {-code}, {name}"
    return f"exit code {code}"


def _seconds(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 else f"{value:.2g}"


def _ranks_text(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {', '.join(str(r) for r in ranks)}"


# ---------------------------------------------------------------- inside a spawned rank


def _follow_parent(parent_pid: int) -> None:
    """Die with the parent: prctl(PR_SET_PDEATHSIG, SIGKILL) on Linux, and a watchdog thread for the
    case prctl missed (the parent died before it was set) or is unavailable."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent_pid:
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_PERIOD_S)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="tensor-tutor-parent-watchdog", daemon=True).start()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def end_rank(code: int = 0) -> None:
    """End a rank whose work is done and whose process group is destroyed, without the interpreter's
    teardown: there, torch 2.13's C++ threads (gloo, DTensor) sometimes abort ("terminate called without an
    active exception", SIGABRT; 2 of 3 torchrun `lab tensor` jobs here) after the result is out, which
    prints on the learner's terminal and makes torchrun report the job failed. Output is flushed first."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _rank_main(fn: RankFn, params: dict, rank: int, world: int, port: int, backend: str, threads: int,
               conn: Any, parent_pid: int, timeout_s: float) -> None:
    """Entry point of a spawned rank. Messages to the parent: ("progress", f, text), ("ok", dict),
    ("error", text). Never a traceback on the terminal."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _follow_parent(parent_pid)
    send_lock = threading.Lock()
    cancelled = threading.Event()

    def send(message: tuple) -> None:
        with send_lock:
            conn.send(message)

    def is_cancelled() -> bool:
        if not cancelled.is_set():
            try:
                while conn.poll():
                    if conn.recv() == "cancel":
                        cancelled.set()
            except (EOFError, OSError):
                cancelled.set()
        return cancelled.is_set()

    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(max(1, threads))
        device = f"cuda:{rank}" if backend == "nccl" else "cpu"
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=max(30.0, timeout_s)),
                                **process_group_device(backend, device))
        ctx = RankContext(rank=rank, world=world, local_rank=rank, device=device, backend=backend,
                          _progress=lambda f, m: send(("progress", f, m)), _cancelled=is_cancelled)
        result = fn(ctx, params)
        if not isinstance(result, dict):
            raise TypeError(f"the rank function returned {type(result).__name__}, not a dict")
        send(("ok", result))
    except BaseException as error:  # reported to the parent, which names the rank; no traceback per rank
        try:
            send(("error", _first_line(error)))
            conn.close()
        finally:
            os._exit(1)
    try:
        dist.destroy_process_group()
    except (RuntimeError, ValueError):  # DistBackendError, or "not initialized": the result is already
        pass  # with the parent
    conn.close()
    end_rank()


# ---------------------------------------------------------------- the parent


def _stop(processes: list[Any]) -> None:
    """Terminate every live process, kill what is left after KILL_GRACE_S, and reap them all."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + KILL_GRACE_S
    for process in processes:
        process.join(timeout=max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            process.kill()
            process.join(timeout=5.0)


class _Run:
    """The parent's view of the spawned ranks while they run."""

    def __init__(self, processes: list[Any], conns: list[Any], progress: Callable[[float, str], None] | None) -> None:
        self.processes, self.conns, self.progress = processes, conns, progress
        self.open = set(range(len(conns)))
        self.results: dict[int, dict] = {}
        self.errors: dict[int, str] = {}
        self.deaths: dict[int, str] = {}  # ranks that exited without a report
        self.first_failure: float | None = None

    def _drain(self, rank: int) -> None:
        conn = self.conns[rank]
        try:
            while conn.poll():
                message = conn.recv()
                kind = message[0]
                if kind == "ok":
                    self.results[rank] = message[1]
                elif kind == "error":
                    self.errors.setdefault(rank, message[1])
                elif kind == "progress" and self.progress is not None:
                    self.progress(message[1], message[2])
        except (EOFError, OSError):
            self.open.discard(rank)

    def poll(self, timeout: float) -> None:
        from multiprocessing.connection import wait

        watched: dict[Any, tuple[str, int]] = {}
        for rank in self.open:
            watched[self.conns[rank]] = ("conn", rank)
        for rank, process in enumerate(self.processes):
            if rank not in self.deaths and rank not in self.results and process.exitcode is None:
                watched[process.sentinel] = ("exit", rank)
        if not watched:
            time.sleep(timeout)
            return
        for ready in wait(list(watched), timeout=timeout):
            kind, rank = watched[ready]
            self._drain(rank)
            if kind == "exit":
                self.processes[rank].join(timeout=1.0)
                self._drain(rank)
                if rank not in self.results and rank not in self.errors:
                    self.deaths[rank] = _describe_exit(self.processes[rank].exitcode)
        if (self.errors or self.deaths) and self.first_failure is None:
            self.first_failure = time.monotonic()

    def done(self) -> bool:
        return len(self.results) == len(self.processes)

    def failure(self, prefix: str) -> RankFailure:
        """The cause: a rank that died beats a rank that raised (its peers' errors are usually the
        broken connection it left), then the first error to arrive."""
        if self.deaths:
            rank = next(iter(self.deaths))
            return RankFailure(f"{prefix}rank {rank} exited ({self.deaths[rank]})", rank=rank, reason="exited")
        rank = next(iter(self.errors))
        return RankFailure(f"{prefix}rank {rank} failed: {self.errors[rank]}", rank=rank, reason="failed")


def run_ranks(fn: RankFn, params: dict, *, ranks: int, timeout_s: float,
              progress: Callable[[float, str], None] | None = None, cancel: threading.Event | None = None,
              backend: str | None = None, memory_per_rank_bytes: int = DEFAULT_MEMORY_PER_RANK,
              name: str = "") -> list[dict]:
    """fn(ctx, params) on every rank; the dicts in rank order. `name` prefixes failure messages
    (e.g. the lab's name). Under torchrun the job's ranks are used and `ranks` is ignored."""
    prefix = f"{name}: " if name else ""
    if under_torchrun():
        return _run_under_torchrun(fn, params, progress=progress, cancel=cancel, timeout_s=timeout_s)
    backend = choose_backend(ranks, backend)
    try:
        check_local_ranks(ranks, memory_per_rank_bytes=memory_per_rank_bytes, backend=backend)
    except UserError as error:
        raise UserError(f"{prefix}{error}") from None
    if cancel is not None and cancel.is_set():
        raise RanksCancelled()
    import multiprocessing

    from tutor.bench.timing import usable_cpu_count

    context = multiprocessing.get_context("spawn")
    port = free_port()
    threads = max(1, usable_cpu_count() // ranks)
    pipes = [context.Pipe(duplex=True) for _ in range(ranks)]
    processes = [context.Process(target=_rank_main, name=f"tensor-tutor-rank-{rank}", daemon=True,
                                 args=(fn, params, rank, ranks, port, backend, threads, pipes[rank][1], os.getpid(),
                                       timeout_s))
                 for rank in range(ranks)]
    run = _Run(processes, [parent for parent, _child in pipes], progress)
    start = time.monotonic()
    cancel_sent: float | None = None
    try:
        # Children inherit the signal mask: with SIGINT blocked until a rank ignores it, a Ctrl-C while
        # ranks start cannot print their import tracebacks.
        blocked = hasattr(signal, "pthread_sigmask")
        if blocked:
            previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            for process in processes:
                process.start()
        finally:
            if blocked:
                signal.pthread_sigmask(signal.SIG_SETMASK, previous)
        for _parent, child in pipes:
            child.close()
        while not run.done():
            run.poll(0.1)
            now = time.monotonic()
            if run.first_failure is not None and (now - run.first_failure >= FAILURE_SETTLE_S or run.deaths):
                raise run.failure(prefix)
            if cancel is not None and cancel.is_set() and cancel_sent is None:
                cancel_sent = now
                for rank in run.open:
                    try:
                        run.conns[rank].send("cancel")
                    except OSError:
                        pass
            if cancel_sent is not None and (now - cancel_sent > CANCEL_GRACE_S or run.done()):
                raise RanksCancelled()
            if now - start > timeout_s:
                running = [rank for rank in range(ranks) if rank not in run.results]
                raise RankFailure(f"{prefix}rank {running[0]} did not finish within {_seconds(timeout_s)} s "
                                  f"({_ranks_text(running)} still running)", rank=running[0], reason="timeout")
        if cancel_sent is not None or (cancel is not None and cancel.is_set()):
            raise RanksCancelled()
        for process in processes:
            process.join(timeout=KILL_GRACE_S)
        return [run.results[rank] for rank in range(ranks)]
    finally:
        _stop(processes)
        for conn in run.conns:
            conn.close()


# ---------------------------------------------------------------- torchrun


def _run_under_torchrun(fn: RankFn, params: dict, *, progress: Callable[[float, str], None] | None,
                        cancel: threading.Event | None, timeout_s: float) -> list[dict]:
    import torch
    import torch.distributed as dist

    from tutor.bench.timing import usable_cpu_count

    job = torchrun_job()
    local_rank = job.local_rank
    created = not dist.is_initialized()
    if created:
        backend = torchrun_backend(job.local_world)
        device = f"cuda:{local_rank}" if backend == "nccl" else "cpu"
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
        # Ranks on one node share its cores; without this each would start a full-size thread pool.
        torch.set_num_threads(max(1, usable_cpu_count() // job.local_world))
        init_torchrun_group(job, backend, device, timeout_s)
    else:
        backend = dist.get_backend()
        device = f"cuda:{local_rank}" if backend == "nccl" else "cpu"
    ctx = RankContext(rank=dist.get_rank(), world=dist.get_world_size(), local_rank=local_rank, device=device,
                      backend=backend, _progress=progress,
                      _cancelled=(cancel.is_set if cancel is not None else None))
    try:
        result = fn(ctx, params)
        gathered: list[Any] = [None] * ctx.world
        dist.all_gather_object(gathered, result)
    finally:
        if created:
            dist.destroy_process_group()
    return [dict(item) for item in gathered]


def run_lab_ranks(name: str, fn: RankFn, params: dict, *, ranks: int, timeout_s: float,
                  progress: Callable[[float, str], None], cancel: threading.Event,
                  memory_per_rank_bytes: int = DEFAULT_MEMORY_PER_RANK) -> list[dict] | None:
    """A lab's ranks through run_ranks: "starting N ranks" reported first, failures named after the
    lab; None when the learner cancelled (the lab then returns an empty, cancelled result)."""
    progress(0.0, f"starting {ranks} ranks")
    try:
        return run_ranks(fn, params, ranks=ranks, timeout_s=timeout_s, progress=progress, cancel=cancel, name=name,
                         memory_per_rank_bytes=memory_per_rank_bytes)
    except RanksCancelled:
        return None


__all__ = ["DEFAULT_MEMORY_PER_RANK", "RankContext", "RankFailure", "RankFn", "RanksCancelled", "check_local_ranks",
           "choose_backend", "end_rank", "free_port", "local_rank_cap", "process_group_device", "run_lab_ranks",
           "run_ranks", "init_torchrun_group", "torchrun_backend", "torchrun_job", "torchrun_rank", "under_torchrun"]
