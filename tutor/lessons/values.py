"""`{{ expr }}` values in lesson prose: evaluated by tutor.theory at render time, never typed by hand.

An expression sees only the names of lessons/README.md ("Inline values"): the theory modules, a
few helpers, `device` (this machine's figures, or None) and `reference_gpu` (the H100 SXM
datasheet entry), plus the builtins float, int, round, min, max, abs, len, sum. Names and
attributes starting with "_" are refused, so an expression cannot reach Python's internals.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from types import (
    BuiltinFunctionType,
    CodeType,
    FunctionType,
    MappingProxyType,
    ModuleType,
    SimpleNamespace,
)
from typing import TYPE_CHECKING, Any

from tutor.errors import UserError

if TYPE_CHECKING:
    from tutor.hardware.machine import Machine
    from tutor.hardware.specs import GpuSpec
    from tutor.theory.formats import NumberFormat
    from tutor.theory.models import Architecture, ParamCount

VALUE_PATTERN = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
SAFE_BUILTINS = MappingProxyType({
    "float": float, "int": int, "round": round, "min": min, "max": max, "abs": abs, "len": len, "sum": sum,
})
REFERENCE_GPU_KEY = "h100-sxm"


@dataclass(frozen=True)
class DeviceFigures:
    """The figures a lesson may quote about one device: name, memory, bandwidth and dense peaks.

    Shaped like tutor.hardware.specs.GpuSpec (name, memory_bytes, bandwidth_gbps, peak_tflops(dtype)),
    so an expression works the same on `device` and on `reference_gpu`. None means unknown
    (a CPU's DRAM bandwidth needs root to read; an unknown GPU has no datasheet entry).
    """

    name: str
    kind: str
    """"cpu", "cuda" or "mps"."""
    memory_bytes: int | None
    """GPU memory, or system RAM for a CPU."""
    bandwidth_gbps: float | None
    """Datasheet memory bandwidth in GB/s (1e9)."""
    tflops: dict[str, float | None] = field(default_factory=dict)
    """dtype -> dense peak TFLOP/s (TOPS for int8), as tutor.hardware reports it."""
    source: str = ""

    @property
    def is_gpu(self) -> bool:
        return self.kind != "cpu"

    def peak_tflops(self, dtype: str) -> float | None:
        """Dense peak TFLOP/s for dtype ("fp32", "bf16", ...), None when unknown or unsupported."""
        return self.tflops.get(dtype)

    def peak_flops(self, dtype: str) -> float | None:
        """The same peak in FLOP/s."""
        tflops = self.peak_tflops(dtype)
        return tflops * 1e12 if tflops is not None else None

    @property
    def bandwidth_bytes_per_s(self) -> float | None:
        return self.bandwidth_gbps * 1e9 if self.bandwidth_gbps is not None else None


def figures_from_spec(spec: GpuSpec) -> DeviceFigures:
    """A datasheet entry of tutor.hardware.specs as DeviceFigures."""
    return DeviceFigures(name=spec.name, kind="cuda", memory_bytes=spec.memory_bytes,
                         bandwidth_gbps=float(spec.bandwidth_gbps), tflops=dict(spec.tflops), source=spec.source)


@lru_cache(maxsize=1)
def reference_gpu() -> DeviceFigures:
    """The H100 SXM entry of tutor.hardware.specs, the reference GPU beside every worked problem.

    Its memory_bytes is the total the driver reports (81,559 MiB), not the datasheet's 80 GB: what a
    learner's own nvidia-smi would show, and what a fit check has to compare with.
    """
    from tutor.hardware.specs import SPECS_BY_KEY

    return figures_from_spec(SPECS_BY_KEY[REFERENCE_GPU_KEY])


def device_figures(machine: Machine, device: str = "auto") -> DeviceFigures:
    """This machine's figures for `device` ("auto": the first GPU NVML sees, else the CPU)."""
    from tutor.hardware.machine import DTYPES

    if device == "auto":
        device = "cuda:0" if machine.gpus else "cpu"
    if device == "cpu":
        cpu = machine.cpu
        return DeviceFigures(
            name=cpu.model_name, kind="cpu", memory_bytes=cpu.ram_total_bytes, bandwidth_gbps=None,
            tflops={dtype: machine.peak_tflops("cpu", dtype) for dtype in DTYPES},
            source=machine.peak_source("cpu", "fp32"))
    gpu = machine.gpu_for(device)
    name = gpu.name if gpu is not None else device
    return DeviceFigures(
        name=name, kind=device.split(":")[0],
        memory_bytes=gpu.memory_total_bytes if gpu is not None else None,
        bandwidth_gbps=machine.peak_memory_gbps(device),
        tflops={dtype: machine.peak_tflops(device, dtype) for dtype in DTYPES},
        source=machine.peak_source(device, "bf16"))


# ---- helpers offered to expressions -------------------------------------------------------------


@lru_cache(maxsize=64)
def preset(name: str) -> Architecture:
    """The Architecture of a bundled model preset (tutor.theory.models), e.g. preset("llama-3.1-8b")."""
    from tutor.theory.models import architecture_from_config, load_preset

    config, info = load_preset(name)
    return architecture_from_config(config, info.display_name)


@lru_cache(maxsize=64)
def params(name: str) -> ParamCount:
    """The exact parameter count of a preset: params("llama-3.1-8b").total."""
    from tutor.theory.models import count_parameters

    return count_parameters(preset(name))


def fmt(name: str) -> NumberFormat:
    """A number format by name or alias: fmt("bf16").max_finite."""
    from tutor.theory.formats import format_by_name

    return format_by_name(name)


def num(x: float | Fraction, digits: int = 3) -> str:
    """x to `digits` significant digits, trailing zeros dropped: 65,500 / 3.31 / 0.25 / 0.00391; e-notation
    outside 1e-4..1e6 (3.39e38)."""
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 17:
        raise UserError(f"num() digits must be a whole number from 1 to 17, got {digits!r}")
    value = float(x)
    if not math.isfinite(value):
        return str(value)
    if value == 0:
        return "0"
    rounded = float(f"{value:.{digits}g}")
    if 1e-4 <= abs(rounded) < 1e6:
        decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
        text = f"{rounded:,.{decimals}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    mantissa, exponent = f"{value:.{digits - 1}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def count(n: float) -> str:
    """A count the way model cards write it: count(8030261248) -> "8.03B"."""
    from tutor.theory.units import human_count

    return human_count(n)


def gb(n_bytes: float) -> float:
    """Bytes in GB (1e9), a number: gb(140e9) -> 140.0."""
    from tutor.theory.units import gb as to_gb

    return to_gb(n_bytes)


def gib(n_bytes: float) -> float:
    """Bytes in GiB (2**30), a number."""
    from tutor.theory.units import gib as to_gib

    return to_gib(n_bytes)


def _public_view(module: ModuleType, *, own_only: bool = True) -> SimpleNamespace:
    """A module's public names without what it merely imports (os, json, re...), so that
    `models.os` is not reachable from a lesson. Not a security boundary: content is reviewed code."""
    names = {}
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, ModuleType):
            continue
        origin = getattr(value, "__module__", None)
        if own_only and isinstance(value, (type, FunctionType, BuiltinFunctionType)) and not (
                origin or "").startswith("tutor."):
            continue
        names[name] = value
    return SimpleNamespace(**names)


@lru_cache(maxsize=1)
def _base_namespace() -> MappingProxyType:
    from tutor.theory import (
        activations,
        fit,
        flops,
        formats,
        interconnect,
        kv_cache,
        lora,
        memory,
        models,
        moe,
        parallel,
        peaks,
        reliability,
        roofline,
        units,
    )

    theory = {"formats": formats, "models": models, "memory": memory, "kv_cache": kv_cache,
              "activations": activations, "parallel": parallel, "flops": flops, "roofline": roofline,
              "moe": moe, "units": units, "fit": fit, "peaks": peaks, "lora": lora,
              "interconnect": interconnect, "reliability": reliability}
    return MappingProxyType({
        **{name: _public_view(module) for name, module in theory.items()},
        "math": _public_view(math, own_only=False),
        "preset": preset, "params": params, "fmt": fmt, "gb": gb, "gib": gib, "count": count, "num": num,
    })


def namespace_names() -> tuple[str, ...]:
    """Every name an expression may use (besides the safe builtins)."""
    return tuple(_base_namespace()) + ("device", "reference_gpu", "draw")


class Draw:
    """The values drawn for one learner in one block: `draw.model` and `draw["model"]` both work."""

    def __init__(self, values: Any = None) -> None:
        object.__setattr__(self, "_drawn", dict(values or {}))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._drawn[name]
        except KeyError:
            raise UserError(f"no draw named {name!r} (this block draws: {', '.join(self._drawn) or 'nothing'})") \
                from None

    def __getitem__(self, name: str) -> Any:
        return self.__getattr__(name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("draws are read-only")


# ---- evaluation ---------------------------------------------------------------------------------


# Attributes that lead from a value to interpreter frames or format-string introspection.
_REFUSED_ATTRIBUTES = frozenset({"format_map", "gi_frame", "gi_code", "cr_frame", "ag_frame", "f_globals",
                                 "f_locals", "f_back", "f_builtins", "tb_frame", "mro"})


def _refuse_private(tree: ast.AST, expr: str) -> None:
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name is not None and (name.startswith("_") or name in _REFUSED_ATTRIBUTES):
            raise UserError(f"{{{{ {expr} }}}}: {name!r} is not allowed in lesson values (no '_' names, "
                            "no frame access)")


@lru_cache(maxsize=1024)
def _compile(expr: str) -> CodeType:
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as error:
        raise UserError(f"{{{{ {expr.strip()} }}}} is not a Python expression ({error.msg})") from None
    _refuse_private(tree, expr.strip())
    return compile(tree, "<lesson value>", "eval")


_figures_of_machine: dict[int, tuple[Any, DeviceFigures]] = {}


def _as_device(device: Any) -> DeviceFigures | None:
    if device is None or isinstance(device, DeviceFigures):
        return device
    from tutor.hardware.machine import Machine

    if isinstance(device, Machine):
        # A lesson renders many values against one detected machine: work its figures out once.
        cached = _figures_of_machine.get(id(device))
        if cached is None or cached[0] is not device:
            cached = (device, device_figures(device))
            _figures_of_machine.clear()
            _figures_of_machine[id(device)] = cached
        return cached[1]
    raise UserError(f"device must be DeviceFigures, a Machine or None, got {type(device).__name__}")


def evaluate(expr: str, *, device: DeviceFigures | Machine | None = None, draw: Any = None) -> Any:
    """The value of one lesson expression; any failure is a UserError naming the expression.
    `draw`: the block's drawn values (name -> value), seen as `draw.name` / `draw["name"]`."""
    code = _compile(expr)
    scope = dict(_base_namespace())
    scope["device"] = _as_device(device)
    scope["reference_gpu"] = reference_gpu()
    scope["draw"] = Draw(draw)
    try:
        return eval(code, {"__builtins__": dict(SAFE_BUILTINS)}, scope)
    except UserError as error:
        raise UserError(f"{{{{ {expr.strip()} }}}}: {error}") from None
    except Exception as error:  # noqa: BLE001 - a content bug: name the expression, never a traceback
        raise UserError(f"{{{{ {expr.strip()} }}}} failed: {type(error).__name__}: {error}") from None


def format_value(value: Any) -> str:
    """How a value appears in prose: int 8,030,261,248; float/Fraction via num(); text as is."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (float, Fraction)):
        return num(value)
    if value is None:
        raise UserError("evaluated to None (no such figure here; guard it: `... if device else ...`)")
    return str(value)


def render_values(text: str, *, device: DeviceFigures | Machine | None = None, draw: Any = None) -> str:
    """`text` with every {{ expr }} replaced by its formatted value (format_value)."""

    def substitute(match: re.Match[str]) -> str:
        value = evaluate(match.group(1), device=device, draw=draw)
        try:
            return format_value(value)
        except UserError as error:
            raise UserError(f"{{{{ {match.group(1).strip()} }}}} {error}") from None

    return VALUE_PATTERN.sub(substitute, text)


def expressions_in(text: str) -> list[str]:
    """The {{ }} expressions of a text, in order (for the lesson lint)."""
    return [match.group(1).strip() for match in VALUE_PATTERN.finditer(text)]
