"""Labs: the small real experiments that lessons run in `measure` and `predict` blocks.

A probe takes a params dict, a progress callback and a cancel Event, and returns a ProbeResult:
rows of measured-against-theory figures plus a flat `metrics` dict that `predict` blocks name.
Every theory figure comes from `tutor.theory`; every measured figure from this machine.

Importing this package never imports torch: probes import it inside their run function.
"""

from __future__ import annotations

import difflib
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tutor.errors import UserError

ProgressFn = Callable[[float, str], None]
"""progress(fraction 0..1, message): called from the probe's thread."""


@dataclass(frozen=True)
class Measurement:
    """One row of a probe's result: a measured figure beside the theory it is read against.

    measured is None when the row is theory only (e.g. a fit component); theory is None when no
    formula applies (e.g. a CPU's memory bandwidth peak). `rate` marks throughputs (FLOP/s, B/s),
    whose percent of a peak is an efficiency; for byte counts it is an agreement ratio.
    """

    label: str
    measured: float | None
    unit: str
    theory: float | None = None
    theory_source: str = ""
    note: str = ""
    rate: bool = False

    @property
    def percent_of_theory(self) -> float | None:
        """100 x measured / theory; None when either is missing or theory is 0."""
        if self.measured is None or self.theory is None or self.theory == 0:
            return None
        return 100.0 * self.measured / self.theory

    @property
    def comparison(self) -> str:
        """The percent in words. A rate above its peak is never shown as >100 %: the explanation
        of tutor.theory.peaks.explain_efficiency (which assumption behind the peak failed) is."""
        percent = self.percent_of_theory
        if percent is None:
            return ""
        if self.rate:
            from tutor.theory.peaks import explain_efficiency

            assert self.measured is not None and self.theory is not None
            if self.measured < 0 or self.theory <= 0 or not math.isfinite(self.measured):
                return ""
            return explain_efficiency(self.measured, self.theory).summary
        return f"{percent:.1f}% of theory"

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "measured": self.measured, "unit": self.unit, "theory": self.theory,
                "theory_source": self.theory_source, "note": self.note, "rate": self.rate,
                "percent_of_theory": self.percent_of_theory, "comparison": self.comparison}


@dataclass(frozen=True)
class ProbeResult:
    """What a probe found: rows for people, metrics for `predict` blocks and scripts."""

    probe: str
    rows: tuple[Measurement, ...]
    metrics: dict[str, float]
    summary: str
    cancelled: bool = False
    device: str = "cpu"
    details: dict[str, Any] = field(default_factory=dict)
    """JSON-ready figures a lab reports beyond its rows (per-rank bytes, a timeline, expert loads);
    they stand at the top level of `to_json()` beside the fixed keys, which they may not replace."""

    def to_json(self) -> dict[str, Any]:
        fixed = {"probe": self.probe, "device": self.device, "cancelled": self.cancelled, "summary": self.summary,
                 "metrics": dict(self.metrics), "rows": [row.to_json() for row in self.rows]}
        clash = fixed.keys() & self.details.keys()
        if clash:
            raise ValueError(f"{self.probe}: details may not replace the keys {sorted(clash)}")
        return {**fixed, **self.details}


@dataclass(frozen=True)
class Probe:
    """A named experiment. `run(params, progress, cancel)` validates `params` against
    `default_params` (unknown keys and wrong types are UserErrors) before it measures anything."""

    name: str
    title: str
    description: str
    needs_torch: bool
    params_schema: dict[str, str]
    run: Callable[[dict, ProgressFn, threading.Event], ProbeResult]
    metrics: tuple[str, ...] = ()
    default_params: dict[str, Any] = field(default_factory=dict)
    check: Callable[[dict], dict] | None = None
    metrics_of: Callable[[dict], tuple[str, ...]] | None = None
    render: Callable[[ProbeResult], Any] | None = None
    """A Rich renderable drawn from a result's details (a pipeline timeline, per-rank memory bars),
    shown under the rows by `tensor-tutor lab` and by the app's measure block. Must not import torch."""

    def check_params(self, params: dict | None) -> dict:
        """The full parameter set (defaults + `params`), validated without running anything;
        raises UserError naming the bad key. The lesson lint uses this on every block."""
        if self.check is None:
            return {**self.default_params, **(params or {})}
        return self.check(params or {})

    def metrics_for(self, params: dict | None) -> tuple[str, ...]:
        """The metric keys a run with `params` reports (a subset of `metrics`) on a machine that
        supports what they ask for: e.g. matmul with dtypes fp32, bf16 reports tflops_fp32,
        tflops_bf16, speedup_bf16_over_fp32 and speedup_fp32_over_bf16."""
        checked = self.check_params(params)
        return self.metrics if self.metrics_of is None else self.metrics_of(checked)


def _registry() -> dict[str, Probe]:
    from tutor.labs.activation_memory import ACTIVATION_MEMORY
    from tutor.labs.checkpoint import CHECKPOINT_WRITE
    from tutor.labs.checkpoint_interval import CHECKPOINT_INTERVAL
    from tutor.labs.collective import COLLECTIVE
    from tutor.labs.ddp import DDP
    from tutor.labs.evaluation import EVALUATION
    from tutor.labs.exercise import EXERCISE
    from tutor.labs.expert_parallel import MOE_ALLTOALL
    from tutor.labs.fit_probe import FIT
    from tutor.labs.fp64 import FP64_COST
    from tutor.labs.grad_accumulation import GRAD_ACCUMULATION
    from tutor.labs.inference import KV_CACHE, PREFILL_DECODE
    from tutor.labs.loss_scaling import LOSS_SCALING
    from tutor.labs.moe import MOE
    from tutor.labs.moe_routing import MOE_ROUTING
    from tutor.labs.pipeline import PIPELINE
    from tutor.labs.precision import CAST_ERROR
    from tutor.labs.quantization import QUANT_ERROR
    from tutor.labs.tensor_parallel import TENSOR
    from tutor.labs.throughput import BANDWIDTH, MATMUL
    from tutor.labs.training_step import TRAINING_STEP
    from tutor.labs.zero import ZERO

    probes = (MATMUL, BANDWIDTH, CAST_ERROR, ACTIVATION_MEMORY, TRAINING_STEP, MOE_ROUTING, COLLECTIVE,
              CHECKPOINT_WRITE, FIT, KV_CACHE, PREFILL_DECODE, MOE_ALLTOALL,
              QUANT_ERROR, LOSS_SCALING, GRAD_ACCUMULATION, FP64_COST, CHECKPOINT_INTERVAL,
              MOE, DDP, ZERO, PIPELINE, TENSOR, EXERCISE, EVALUATION)
    return {probe.name: probe for probe in probes}


PROBES: dict[str, Probe] = _registry()


def get_probe(name: str) -> Probe:
    """The probe called `name`; a UserError listing the names (closest first) otherwise."""
    if name in PROBES:
        return PROBES[name]
    close = difflib.get_close_matches(str(name), list(PROBES), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise UserError(f"unknown probe {name!r}{hint}; choose one of: {', '.join(PROBES)}")


def run_probe(name: str, params: dict | None = None, *, progress: ProgressFn | None = None,
              cancel: threading.Event | None = None) -> ProbeResult:
    """Run probe `name` with `params` (defaults filled in); progress and cancel are optional."""
    probe = get_probe(name)
    return probe.run(dict(params or {}), progress or (lambda fraction, message: None), cancel or threading.Event())


__all__ = ["PROBES", "Measurement", "Probe", "ProbeResult", "ProgressFn", "get_probe", "run_probe"]
