"""Labs, the bench suite and the torch cast, as the app calls them, run by the worker process.

Each proxy has the signature of what it replaces, so the widgets keep calling `probe.run(params,
progress, cancel)`, `run_bench(progress, cancel)` and `torch_cast(value, formats)` from their thread
workers; the call blocks until the worker answers. The app's labs (`worker_labs`) are built from the
registry's data (tutor.labs.registry), so the app imports no lab module to list or start them.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tutor.errors import UserError
from tutor.labs.probe import Probe, ProbeResult, ProgressFn
from tutor.labs.registry import LabEntry
from tutor.worker.client import CANCELLED, WorkerClient
from tutor.worker.jobs import BenchOutcome


def _no_progress(fraction: float, text: str) -> None:
    """Progress nobody shows (the torch cast reports none)."""


def _run_in_worker(client: WorkerClient, name: str, params: dict, progress: ProgressFn,
                   cancel: threading.Event) -> ProbeResult:
    """The lab `name` run by the worker; a cancel that killed the worker returns an empty cancelled result."""
    value = client.run_job(name, {"kind": "probe", "name": name, "params": dict(params)}, progress, cancel)
    if value is CANCELLED:
        return ProbeResult(name, (), {}, "cancelled before any figure was measured", cancelled=True)
    if not isinstance(value, ProbeResult):
        raise UserError(f"{name}: the measurement process answered with {type(value).__name__}")
    return value


def worker_probe(client: WorkerClient, probe: Probe) -> Probe:
    """`probe` with everything it describes (title, params, metrics, render) kept, and `run` sent to
    the worker. A cancel that killed the worker returns an empty cancelled result."""

    def run(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
        return _run_in_worker(client, probe.name, params, progress, cancel)

    return dataclasses.replace(probe, run=run)


@dataclass(frozen=True)
class WorkerLab:
    """A lab as the app holds it: what the registry says of it, and `run` sent to the worker.

    Its module is imported in the app's process only by `render`, to draw a result the lab returned
    (a pipeline timeline, per-rank bars): after a run, never before the first paint."""

    entry: LabEntry
    client: WorkerClient

    @property
    def name(self) -> str:
        return self.entry.name

    @property
    def title(self) -> str:
        return self.entry.title

    @property
    def param_names(self) -> tuple[str, ...]:
        return self.entry.param_names

    def run(self, params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
        return _run_in_worker(self.client, self.name, params, progress, cancel)

    def render(self, result: ProbeResult) -> Any:
        """The lab's own drawing of `result`, or None when the lab draws nothing."""
        draw = self.entry.load().render
        return None if draw is None else draw(result)


def worker_labs(client: WorkerClient, entries: Mapping[str, LabEntry]) -> dict[str, WorkerLab]:
    """Every lab of the registry (tutor.labs.registry.LABS) as the app runs it: in the worker."""
    return {name: WorkerLab(entry, client) for name, entry in entries.items()}


def worker_probes(client: WorkerClient, probes: Mapping[str, Probe]) -> dict[str, Probe]:
    """Every probe of `probes` as a worker probe."""
    return {name: worker_probe(client, probe) for name, probe in probes.items()}


def worker_bench(client: WorkerClient) -> Callable[[ProgressFn, threading.Event], BenchOutcome]:
    """The Bench screen's quick suite (tutor.worker.jobs.run_bench_suite), run by the worker."""

    def run_bench(progress: ProgressFn, cancel: threading.Event) -> BenchOutcome:
        value = client.run_job("the benchmark suite", {"kind": "bench"}, progress, cancel)
        if value is CANCELLED:
            return BenchOutcome((), cancelled=True)
        if not isinstance(value, BenchOutcome):
            raise UserError(f"the measurement process answered with {type(value).__name__}")
        return value

    return run_bench


def worker_cast(client: WorkerClient) -> Callable[[str, Sequence[str]], dict[str, float]]:
    """The bits explorer's torch cast (tutor.worker.jobs.torch_cast), run by the worker."""

    def torch_cast(value: str, formats: Sequence[str]) -> dict[str, float]:
        answer = client.run_job("a torch cast", {"kind": "cast", "value": value, "formats": list(formats)},
                                _no_progress, threading.Event())
        if answer is CANCELLED or not isinstance(answer, dict):
            raise UserError("the torch cast did not finish")
        return answer

    return torch_cast
