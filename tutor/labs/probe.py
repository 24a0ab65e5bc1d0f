"""What a lab is and what it returns: the types every layer above the labs reads.

A lab (a `Probe`) takes a params dict, a progress callback and a cancel Event, and returns a
`ProbeResult`: rows of measured-against-theory figures (`Measurement`) plus a flat `metrics` dict
that `predict` blocks name. Its parameters are declared once as `Param`s (tutor.labs._params checks
values against them; `tensor-tutor lab NAME --help` lists them).

This module imports no lab and no torch, so the app, the worker and the CLI can name these types
without loading any experiment.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

KINDS = ("int", "float", "str", "text", "bool", "str-list", "number-list", "size-list")


# A parameter named with one of these endings is in that unit (budget_s, size_mb, work_hours).
UNIT_SUFFIXES = (("_s", "s"), ("_mb", "MiB"), ("_hours", "h"))


@dataclass(frozen=True)
class Param:
    """One parameter of a lab: its name, kind, default, what it means, and the values it accepts
    (`choices`, or `minimum`..`maximum`). The lab validates with it (tutor.labs._params) and
    `tensor-tutor lab NAME --help` lists it, so the two cannot disagree."""

    name: str
    kind: str
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    optional: bool = False  # None is an accepted value (e.g. "no model given")
    unit: str = ""
    """The unit of a number; empty means the one its name ends with (UNIT_SUFFIXES) or none."""

    @property
    def shown_unit(self) -> str:
        """The unit a value is in: `unit`, else the one the name's ending says; sizes are bytes."""
        if self.unit:
            return self.unit
        if self.kind == "size-list":
            return "bytes (1MiB, 64KiB, 4096)"
        for suffix, unit in UNIT_SUFFIXES:
            if self.name.endswith(suffix):
                return unit
        return ""

    @property
    def typed_default(self) -> str | None:
        """The default as one types it after KEY= (a list comma-separated); None when there is none."""
        value = self.default
        if value is None:
            return None
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (list, tuple)):
            return ",".join(str(item) for item in value)
        return str(value)

    @property
    def accepted(self) -> str:
        """The values it accepts, in words: the choices, the range, or the kind."""
        from tutor.formatting import format_bytes, format_number

        shown = format_bytes if self.kind == "size-list" else format_number
        parts = []
        if self.choices:
            parts.append(("one or more of " if self.kind == "str-list" else "one of ") + ", ".join(self.choices))
        if self.minimum is not None and self.maximum is not None:
            parts.append(f"{shown(self.minimum)} to {shown(self.maximum)}")
        elif self.minimum is not None:
            parts.append(f"at least {shown(self.minimum)}")
        elif self.maximum is not None:
            parts.append(f"at most {shown(self.maximum)}")
        if not parts:
            parts.append(KIND_WORDS.get(self.kind, self.kind))
        if self.optional:
            parts.append("or none")
        return " ".join(parts)

    def describe(self) -> str:
        text = f"{self.kind}: {self.help}"
        if self.choices:
            text += f" ({', '.join(self.choices)})"
        if self.minimum is not None or self.maximum is not None:
            low = "" if self.minimum is None else f"{self.minimum:g}"
            high = "" if self.maximum is None else f"{self.maximum:g}"
            text += f" [{low}..{high}]"
        return f"{text}; default {self.default!r}"


KIND_WORDS = {"int": "a whole number", "float": "a number", "str": "text", "text": "text", "bool": "true or false",
              "str-list": "a list of names", "number-list": "a list of numbers", "size-list": "a list of sizes"}


ProgressFn = Callable[[float, str], None]
"""progress(fraction 0..1, message): called from the lab's thread."""


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
            from tutor.formatting import efficiency_summary
            from tutor.theory.peaks import explain_efficiency

            assert self.measured is not None and self.theory is not None
            if self.measured < 0 or self.theory <= 0 or not math.isfinite(self.measured):
                return ""
            return efficiency_summary(explain_efficiency(self.measured, self.theory))
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
    params: tuple[Param, ...] = ()
    """The declared parameters `check` validates against (make_probe fills it)."""

    @property
    def param_names(self) -> tuple[str, ...]:
        """The names of the parameters it takes."""
        return tuple(self.default_params)

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


__all__ = ["KINDS", "Measurement", "Param", "Probe", "ProbeResult", "ProgressFn"]
