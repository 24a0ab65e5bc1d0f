"""Declared lab parameters: defaults, types and ranges, checked before a lab measures anything.

Lesson authors write params in TOML, so a typo must become one clear line (UserError), never a
traceback from deep inside torch. A lab declares its parameters once, as a tuple of `Param`
(tutor.labs.probe); `make_probe` validates every run against that tuple and keeps it on the Probe,
where `tensor-tutor lab NAME --help` reads it.
"""

from __future__ import annotations

import difflib
import math
import threading
from collections.abc import Callable
from typing import Any

from tutor.errors import UserError
from tutor.labs.probe import KINDS, Param, Probe
from tutor.files.untrusted import shown_value


def _range(param: Param, value: float, probe: str) -> None:
    if param.minimum is not None and value < param.minimum or param.maximum is not None and value > param.maximum:
        low = "-inf" if param.minimum is None else f"{param.minimum:g}"
        high = "inf" if param.maximum is None else f"{param.maximum:g}"
        raise UserError(f"{probe}: {param.name} must be between {low} and {high}, got {value!r}")


def _choice(param: Param, value: Any, probe: str) -> str:
    if not isinstance(value, str):
        raise UserError(f"{probe}: {param.name} must be text, got {value!r}")
    text = value.strip().lower()
    if param.choices and text not in param.choices:
        raise UserError(f"{probe}: unknown {param.name} {value!r} (choose from {', '.join(param.choices)})")
    return text


def check_value(param: Param, value: Any, probe: str) -> Any:
    """`value` converted to the parameter's kind, or a UserError naming the probe and parameter."""
    if value is None and param.optional:
        return None
    kind = param.kind
    if kind == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{probe}: {param.name} must be a whole number, got {value!r}")
        _range(param, value, probe)
        return value
    if kind == "float":
        # An int past float's range (10**400 from a script or a lesson) is no number a lab can use:
        # math.isfinite would raise OverflowError converting it.
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or (isinstance(value, int) and abs(value) > 2**1000) or not math.isfinite(value)):
            raise UserError(f"{probe}: {param.name} must be a number, got {shown_value(value)}")
        _range(param, float(value), probe)
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise UserError(f"{probe}: {param.name} must be true or false, got {value!r}")
        return value
    if kind == "str":
        return _choice(param, value, probe)
    if kind == "text":
        if not isinstance(value, str) or not value.strip():
            raise UserError(f"{probe}: {param.name} must be non-empty text, got {value!r}")
        return value.strip()
    if kind in ("str-list", "number-list", "size-list"):
        items = [part for part in value.split(",") if part.strip()] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not items:
            raise UserError(f"{probe}: {param.name} must be a non-empty list, got {value!r}")
        if kind == "str-list":
            return tuple(dict.fromkeys(_choice(param, item, probe) for item in items))
        if kind == "number-list":
            return tuple(_number(param, item, probe) for item in items)
        return tuple(_size(param, item, probe) for item in items)
    raise AssertionError(f"unknown parameter kind {kind}")


def _number(param: Param, item: Any, probe: str) -> float | str:
    """Numbers stay numbers; text such as '0.1' or '1e-3' stays text so it can be read exactly."""
    if isinstance(item, bool) or not isinstance(item, (int, float, str)):
        raise UserError(f"{probe}: each of {param.name} must be a number, got {item!r}")
    if isinstance(item, str):
        try:
            float(item)
        except ValueError:
            raise UserError(f"{probe}: each of {param.name} must be a number, got {item!r}") from None
        return item.strip()
    return float(item)


def _size(param: Param, item: Any, probe: str) -> int:
    from tutor.theory.units import parse_bytes

    if isinstance(item, bool):
        raise UserError(f"{probe}: each of {param.name} must be a size such as 1MiB, got {item!r}")
    if isinstance(item, (int, float)):
        item = str(item)
    if not isinstance(item, str):
        raise UserError(f"{probe}: each of {param.name} must be a size such as 1MiB, got {item!r}")
    size = parse_bytes(item)
    _range(param, size, probe)
    return size


def check_params(probe: str, declared: tuple[Param, ...], params: dict | None) -> dict[str, Any]:
    """Defaults overlaid with `params`, every value checked; unknown keys are UserErrors."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise UserError(f"{probe}: params must be a table of name = value, got {params!r}")
    by_name = {param.name: param for param in declared}
    for key in params:
        if key not in by_name:
            close = difflib.get_close_matches(str(key), list(by_name), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise UserError(f"{probe}: unknown parameter {key!r}{hint}; it takes {', '.join(by_name) or 'none'}")
    return {name: check_value(param, params.get(name, param.default), probe) for name, param in by_name.items()}


def make_probe(*, name: str, title: str, description: str, needs_torch: bool, params: tuple[Param, ...],
               metrics: tuple[str, ...], body: Callable[[dict, Callable[[float, str], None], threading.Event], Any],
               metrics_of: Callable[[dict], tuple[str, ...]] | None = None, render: Callable[[Any], Any] | None = None):
    """A Probe whose run() checks params, then calls `body(checked, progress, cancel)`.
    `metrics_of(checked params)` names the metrics of one run, when they depend on the params;
    `render(result)` draws its details (see Probe.render)."""
    def check(given: dict) -> dict:
        return check_params(name, params, given)

    def run(given: dict, progress: Callable[[float, str], None], cancel: threading.Event):
        checked = check(given)
        return body(checked, progress, cancel)

    run.__name__ = f"run_{name.replace('-', '_')}"
    return Probe(name=name, title=title, description=description, needs_torch=needs_torch,
                 params_schema={param.name: param.describe() for param in params}, run=run,
                 metrics=tuple(dict.fromkeys(metrics)), default_params={param.name: param.default for param in params},
                 check=check, metrics_of=metrics_of, render=render, params=params)


def budget_param(default: float, help_text: str = "seconds of measurement") -> Param:
    return Param("budget_s", "float", default, help_text, minimum=0.1, maximum=120.0, unit="s")


def device_param() -> Param:
    return Param("device", "str", "auto", "where to run: auto (first GPU, else cpu), cpu, cuda or cuda:N")


def resolve_device(text: str) -> str:
    """'auto' -> the first CUDA device if any, else 'cpu'; others as tutor.bench resolves them."""
    from tutor.bench.environment import resolve_device as bench_resolve

    return bench_resolve(None if text == "auto" else text)


def fit_params(names: tuple[str, ...], defaults: dict[str, Any] | None = None,
               choices: dict[str, tuple[str, ...]] | None = None, helps: dict[str, str] | None = None
               ) -> tuple[Param, ...]:
    """The fit fields `names` (tutor.answers.fields: help, choices, the lab range) as a lab's parameters, with the
    lab's own defaults, narrower choices and, where it accepts other values than a calculator, its own help."""
    from tutor.answers.fields import FIELDS

    defaults, choices, helps = defaults or {}, choices or {}, helps or {}
    params = []
    for name in names:
        field = FIELDS[name]
        value = defaults.get(name, field.starting_value)
        offered = choices.get(name) or field.options()
        kind = {"whole": "int", "length": "int", "choice": "str", "flag": "bool"}.get(field.kind, "text")
        if kind == "text" and offered:
            kind = "str"
        low, high = field.lab_range or (None, None)
        params.append(Param(name, kind, value, helps.get(name, field.short_help),
                            choices=tuple(str(c) for c in offered) if offered and kind == "str" else (),
                            minimum=low, maximum=high))
    return tuple(params)


__all__ = ["KINDS", "Param", "budget_param", "check_params", "check_value", "device_param", "fit_params", "make_probe",
           "resolve_device"]
