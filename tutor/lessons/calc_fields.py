"""The inputs a ```calc block may show, what each accepts, and how they become a FitRequest.

The fit fields are tutor.answers.fields' declaration (the same names as `tensor-tutor fit`'s options: seq,
not seq_len), so a learner who moves from a lesson's calculator to the command line types the same
words; the FLOPs and roofline calculators add their own inputs here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tutor.errors import UserError
from tutor.answers.fields import (  # noqa: F401  (re-exported: the calculator's words are the fit fields')
    CALC_DEFAULTS,
    FIELDS as FIT_FIELD_BY_NAME,
    FIT_FIELDS,
    MEMORY_BARE_UNIT,
    TOKEN_MULTIPLIERS,
    FitField,
    check_count,
    check_length,
    check_whole,
    parse_length,
    parse_memory_size,
    request_settings,
    unknown_device_message,
)
from tutor.theory.fit import FitRequest

FIT_FIELD_NAMES = frozenset(FIT_FIELD_BY_NAME)


def memory_text(n_bytes: int) -> str:
    """A byte count as a learner types it back: '80 GB', '24 GiB' (whole units), else its bytes with a B."""
    from tutor.theory.units import GB, GiB

    for size, unit in ((GiB, "GiB"), (GB, "GB")):
        if n_bytes >= size and n_bytes % size == 0:
            return f"{n_bytes // size:,} {unit}"
    return f"{n_bytes:,} B"


def device_names() -> tuple[str, ...]:
    """Every card name the device field accepts (the same as `tensor-tutor fit --device`), aliases last."""
    from tutor.hardware.specs import gpu_names

    return gpu_names()


def _check_fraction(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise UserError(f"{name} must be a number in (0, 1], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class CalcField:
    """One calculator input: its name, a one-line description, and the check that normalises a value."""

    name: str
    help: str
    check: Callable[[Any], Any]
    fit_attribute: str | None = None
    """The FitRequest attribute it sets, if any."""


def _from_declaration(field: FitField) -> CalcField:
    return CalcField(field.name, field.short_help, field.check, field.attribute)


CALC_FIELDS: dict[str, CalcField] = {field.name: field for field in (
    *(_from_declaration(fit_field) for fit_field in FIT_FIELDS),
    CalcField("tokens", "training tokens, such as 15T", lambda value: check_count(value, "tokens")),
    CalcField("mfu", "model FLOPs utilization assumed for a time estimate, in (0, 1]",
              lambda value: _check_fraction(value, "mfu")),
    CalcField("m", "matmul rows of A (4096 or 4k)", lambda value: check_length(value, "m")),
    CalcField("n", "matmul columns of B (4096 or 4k)", lambda value: check_length(value, "n")),
    CalcField("k", "the shared (reduction) dimension (4096 or 4k)", lambda value: check_length(value, "k")),
)}
"""Every calculator field: the fit fields (tutor.answers.fields, in their order), then the FLOPs and roofline inputs."""

DEFAULTS: dict[str, Any] = {**CALC_DEFAULTS, "tokens": "15T", "mfu": 0.4, "m": 4096, "n": 4096, "k": 4096}
"""Starting values of fields a lesson leaves unset (FitRequest's own defaults for the rest)."""

_FIT_FIELDS = tuple(field.name for field in FIT_FIELDS if field.name != "device")

CALC_KINDS: dict[str, tuple[str, ...]] = {
    "memory": _FIT_FIELDS,
    "parallel": _FIT_FIELDS,
    "kv-cache": ("model", "batch", "seq", "kv_dtype", "dtype", "tp", "memory"),
    "flops": ("model", "params", "tokens", "batch", "seq", "mode", "dp", "device", "mfu"),
    "roofline": ("m", "n", "k", "dtype", "device", "model", "batch", "seq"),
}


def check_calc_value(kind: str, name: str, value: Any) -> Any:
    """The normalised value of calculator field `name`, or a UserError saying what it accepts."""
    if name not in CALC_KINDS.get(kind, ()):
        allowed = ", ".join(CALC_KINDS.get(kind, ()))
        raise UserError(f"a {kind} calculator has no field {name!r} (fields: {allowed})")
    return CALC_FIELDS[name].check(value)


def fit_request(values: dict[str, Any]) -> FitRequest:
    """The FitRequest that a memory/parallel/kv-cache calculator's values describe (unset fields: defaults)."""
    for name in values:
        if name not in CALC_FIELDS:
            raise UserError(f"unknown calculator field {name!r}")
    return FitRequest(**request_settings({name: value for name, value in values.items() if name in FIT_FIELD_NAMES}))
