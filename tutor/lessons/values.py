"""`{{ expr }}` values in lesson prose: evaluated by tutor.theory at render time, never typed by hand.

An expression sees only the names of lessons/README.md ("Inline values"): the theory modules, a
few helpers, `device` (this machine's figures, or None) and `reference_gpu` (the H100 SXM
datasheet entry), plus the builtins float, int, round, min, max, abs, len, sum.

Lesson content may come from any folder (TENSOR_TUTOR_LESSONS_DIR), so expressions are not trusted:
an allow-list interpreter evaluates them (no eval()): a few kinds of syntax, no "_" names, attributes
only of the theory modules and tutor's own objects, calls only to the namespace's functions and tutor
objects' methods, arithmetic bounded before it runs, a step and time limit, and no file access.
"""

from __future__ import annotations

import ast
import math
import os
import re
import sys
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from types import (
    BuiltinFunctionType,
    FunctionType,
    MappingProxyType,
    MethodType,
    ModuleType,
)
from typing import TYPE_CHECKING, Any

from tutor.errors import UserError

if TYPE_CHECKING:
    from tutor.hardware.machine import Machine
    from tutor.hardware.specs import GpuSpec
    from tutor.theory.fit import Suggestion
    from tutor.theory.formats import NumberFormat
    from tutor.theory.models import Architecture, ParamCount
    from tutor.theory.step_time import Ceilings

VALUE_PATTERN = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
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
    from tutor.files.models import load_preset
    from tutor.theory.models import architecture_from_config

    config, info = load_preset(name)
    return architecture_from_config(config, info.display_name)


@lru_cache(maxsize=64)
def params(name: str) -> ParamCount:
    """The exact parameter count of a preset: params("llama-3.1-8b").total."""
    from tutor.theory.models import count_parameters

    return count_parameters(preset(name))


def flags(suggestion: Suggestion) -> str:
    """A fit suggestion as the `tensor-tutor fit` flags that make it: flags(fit.suggestions(...)[0]) ->
    "--tp 8 --sp (8 devices)" (tutor.theory.fit gives the changes; tutor.answers.fit phrases them, for the
    command too)."""
    from tutor.answers.fit import change_flags

    return change_flags(suggestion)


def fmt(name: str) -> NumberFormat:
    """A number format by name or alias: fmt("bf16").max_finite."""
    from tutor.theory.formats import format_by_name

    return format_by_name(name)


def num(x: float | Fraction, digits: int = 3) -> str:
    """x to `digits` significant digits as tutor.formatting writes every number: 65,500 / 3.31 / 0.25 /
    0.00391; powers of ten beyond what digits can hold (3.39 × 10³⁸), which the quiz grader reads back."""
    if isinstance(digits, bool) or not isinstance(digits, int) or not 1 <= digits <= 17:
        raise UserError(f"num() digits must be a whole number from 1 to 17, got {digits!r}")
    from tutor.formatting import format_number

    value = float(x)
    if not math.isfinite(value):
        return str(value)
    rounded = float(f"{value:.{digits}g}")  # 1.797e308 to 3 digits rounds past the largest float
    return format_number(rounded if math.isfinite(rounded) else value, digits=digits)


def count(n: float) -> str:
    """A count the way model cards write it: count(8030261248) -> "8.03B"."""
    from tutor.formatting import format_count

    return format_count(n)


def gb(n_bytes: float) -> float:
    """Bytes in GB (1e9), a number: gb(140e9) -> 140.0."""
    from tutor.theory.units import gb as to_gb

    return to_gb(n_bytes)


def gib(n_bytes: float) -> float:
    """Bytes in GiB (2**30), a number."""
    from tutor.theory.units import gib as to_gib

    return to_gib(n_bytes)


@lru_cache(maxsize=32)
def gpu(card: str) -> DeviceFigures:
    """A card of the spec table (tutor.hardware.specs) by key or alias, as `reference_gpu` is one:
    gpu("h200").peak_tflops("fp8")."""
    from tutor.hardware.specs import lookup_gpu_spec, unknown_device_message

    found = lookup_gpu_spec(card) if isinstance(card, str) else None
    if found is None:
        raise UserError(unknown_device_message(str(card)))
    return figures_from_spec(found[0])


@lru_cache(maxsize=32)
def ceilings(card: str) -> Ceilings:
    """A card's sourced ceilings (tutor.bench.ceilings.card_ceilings): what `tensor-tutor time --device CARD`
    runs on. `ceilings("h100").intra_node_link.value` is NVLink's achieved busbw in B/s, `.inter_node_link`
    one NDR InfiniBand NIC's, each with its `.source`."""
    from tutor.bench.ceilings import card_ceilings
    from tutor.hardware.specs import lookup_gpu_spec, unknown_device_message

    found = lookup_gpu_spec(card) if isinstance(card, str) else None
    if found is None:
        raise UserError(unknown_device_message(str(card)))
    return card_ceilings(found[0])


class _ModuleView:
    """The names of one module a lesson may use (attributes only: no item access, no internals)."""

    def __init__(self, module_name: str, names: dict[str, Any]) -> None:
        object.__setattr__(self, "_module_name", module_name)
        object.__setattr__(self, "_names", dict(names))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._names[name]
        except KeyError:
            raise AttributeError(f"{self._module_name} has no name {name!r} that lessons may use") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("lesson namespaces are read-only")

    def __dir__(self) -> list[str]:
        return sorted(self._names)


MATH_NAMES = ("ceil", "floor", "trunc", "log", "log2", "log10", "exp", "sqrt", "isqrt", "pow", "fabs", "hypot",
              "copysign", "frexp", "ldexp", "gcd", "isfinite", "isinf", "isnan", "isclose", "pi", "e", "tau",
              "inf", "nan")
"""The math functions a lesson may call: quick on any argument (math.factorial(10**7) is not)."""


def _public_view(module: ModuleType) -> _ModuleView:
    """A theory module's public names, without what it merely imports (os, json, re, other modules'
    functions), so that `models.os` is not reachable. tutor.theory reads no files (tests/test_theory_purity.py),
    so nothing offered here can open a path."""
    names = {}
    for name, value in vars(module).items():
        if name.startswith("_") or isinstance(value, ModuleType):
            continue
        origin = getattr(value, "__module__", None)
        if isinstance(value, (type, FunctionType, BuiltinFunctionType)) and not (origin or "").startswith("tutor."):
            continue
        if callable(value) and not isinstance(value, (type, FunctionType)) and not hasattr(value, "__wrapped__"):
            continue  # typing forms and other callables that are not the module's own functions or classes
        names[name] = value
    return _ModuleView(module.__name__, names)


def _bounded_round(number: Any, ndigits: int | None = None) -> Any:
    """round(), refusing |ndigits| > MAX_ROUND_DIGITS (round(1, -10**9) would build 10**(10**9))."""
    if ndigits is not None and isinstance(ndigits, int) and abs(ndigits) > MAX_ROUND_DIGITS:
        raise UserError(f"round() digits must be within ±{MAX_ROUND_DIGITS}, got {ndigits:,}")
    return round(number) if ndigits is None else round(number, ndigits)


SAFE_BUILTINS = MappingProxyType({
    "float": float, "int": int, "round": _bounded_round, "min": min, "max": max, "abs": abs, "len": len, "sum": sum,
})


@lru_cache(maxsize=1)
def _base_namespace() -> MappingProxyType:
    from tutor.formatting import format_bytes, format_count
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
        serving,
        units,
    )

    theory = {"formats": formats, "models": models, "memory": memory, "kv_cache": kv_cache,
              "activations": activations, "parallel": parallel, "flops": flops, "roofline": roofline,
              "moe": moe, "units": units, "fit": fit, "peaks": peaks, "lora": lora,
              "interconnect": interconnect, "reliability": reliability, "serving": serving}
    views = {name: _public_view(module) for name, module in theory.items()}
    # Prose sizes and counts in the units lesson expressions name them by (`units.human_bytes(...)`),
    # written by tutor.formatting: theory computes numbers, formatting turns them into text.
    views["units"] = _ModuleView(units.__name__, {**views["units"]._names, "human_bytes": format_bytes,
                                                  "human_count": format_count})
    return MappingProxyType({
        **views,
        "math": _ModuleView("math", {name: getattr(math, name) for name in MATH_NAMES}),
        "preset": preset, "params": params, "flags": flags, "gpu": gpu, "ceilings": ceilings, "fmt": fmt, "gb": gb, "gib": gib, "count": count, "num": num,
    })


@lru_cache(maxsize=1)
def _namespace_callables() -> frozenset[int]:
    """The ids of every function an expression may call by name (the namespace keeps them alive)."""
    found = [*SAFE_BUILTINS.values()]
    for value in _base_namespace().values():
        found.extend(value._names.values() if isinstance(value, _ModuleView) else [value])
    return frozenset(id(value) for value in found if callable(value))


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


# ---- evaluation: an allow-list interpreter over the expression's syntax tree -----------------------
#
# Lesson content may come from another folder (TENSOR_TUTOR_LESSONS_DIR), so an expression is treated
# as untrusted: it is never given to eval(). Each node of its syntax tree is one of a few allowed kinds,
# names come from the namespace above, attributes are read only from the namespace's modules and from
# tutor's own objects (never from str, so "{0.__globals__}".format(...) is unreachable), only the
# namespace's functions and tutor objects' methods are called, and arithmetic is bounded before it runs.

MAX_INT_BITS = 4096
"""No integer (or fraction part) beyond 4096 bits (1,233 digits): past any figure a lesson quotes
(FP64's largest finite is below 2**1024), small enough that arithmetic on it is instant."""
MAX_SEQUENCE = 10_000
"""No list, tuple or text longer than this is built by `*`, `+` or a list comprehension."""
MAX_STEPS = 200_000
"""Syntax-tree nodes evaluated per expression (a comprehension's body counts once per item)."""
MAX_SECONDS = 2.0
"""Wall-clock bound per expression, checked as its nodes are evaluated."""
MAX_ROUND_DIGITS = 400
"""round(x, n) with |n| beyond this would build 10**|n| first (round(1, -10**9) never returns)."""

_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.USub, ast.UAdd, ast.Not,
              ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is,
              ast.IsNot)
_ALLOWED_NODES = (ast.Expression, ast.Constant, ast.Name, ast.Load, ast.Store, ast.Attribute, ast.Call, ast.keyword,
                  ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.List, ast.Tuple, ast.Dict,
                  ast.Subscript, ast.Slice, ast.GeneratorExp, ast.ListComp, ast.comprehension) + _OPERATORS
_CONSTANT_TYPES = (int, float, str, bool, type(None))
_INDEXABLE = (list, tuple, dict, str, MappingProxyType)


class _Refused(Exception):
    """The expression does something lesson values may not do (shown as one line, never run further)."""


def _refuse_syntax(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise _Refused(f"{type(node).__name__} syntax is not allowed in lesson values")
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
        if name is not None and name.startswith("_"):
            raise _Refused(f"{name!r} is not allowed in lesson values (no '_' names)")
        if isinstance(node, ast.Constant) and not isinstance(node.value, _CONSTANT_TYPES):
            raise _Refused(f"the constant {node.value!r} is not allowed in lesson values")
        if isinstance(node, ast.keyword) and node.arg is None:
            raise _Refused("**-arguments are not allowed in lesson values")
        if isinstance(node, ast.Dict) and None in node.keys:
            raise _Refused("**-unpacking is not allowed in lesson values")
        if isinstance(node, ast.comprehension) and node.is_async:
            raise _Refused("async comprehensions are not allowed in lesson values")
        if isinstance(node, ast.comprehension) and not all(
                isinstance(target, (ast.Name, ast.Tuple)) for target in ast.walk(node.target)
                if not isinstance(target, (ast.Store, ast.Load))):
            raise _Refused("a comprehension may only bind plain names")


@lru_cache(maxsize=1024)
def _compile(expr: str) -> ast.Expression:
    """The checked syntax tree of an expression (UserError when it is not one, or uses refused syntax)."""
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as error:
        raise UserError(f"{{{{ {expr.strip()} }}}} is not a Python expression ({error.msg})") from None
    except (ValueError, RecursionError, MemoryError) as error:  # NUL bytes; nesting too deep to parse
        raise UserError(f"{{{{ {expr.strip()} }}}} is not a Python expression ({type(error).__name__})") from None
    try:
        _refuse_syntax(tree)
    except _Refused as refusal:
        raise UserError(f"{{{{ {expr.strip()} }}}}: {refusal}") from None
    return tree


def _is_tutor_object(value: Any) -> bool:
    """An instance (or a class) defined in tutor's own modules: its public attributes are figures."""
    owner = value if isinstance(value, type) else type(value)
    return (owner.__module__ or "").startswith("tutor.")


def _int_bits(value: Any) -> int:
    """The size of an exact number in bits (the larger of a fraction's two parts)."""
    if isinstance(value, int):
        return abs(value).bit_length()
    if isinstance(value, Fraction):
        return max(abs(value.numerator).bit_length(), value.denominator.bit_length())
    return 0


def _length(value: Any) -> int | None:
    return len(value) if isinstance(value, (str, list, tuple)) else None


def _bounded_power(base: Any, exponent: Any) -> Any:
    if isinstance(exponent, Fraction) and exponent.denominator == 1:
        exponent = exponent.numerator
    if isinstance(base, (int, Fraction)) and isinstance(exponent, int):
        bits = abs(exponent) * max(_int_bits(base) - 1, 1) if isinstance(base, Fraction) or abs(base) > 1 else 0
        if (exponent > 0 or isinstance(base, Fraction)) and bits > MAX_INT_BITS:
            raise _Refused(f"{base!r} ** {exponent!r} would have about {bits:,} bits (lesson values allow "
                           f"{MAX_INT_BITS:,})")
    return base ** exponent


def _bounded_multiply(left: Any, right: Any) -> Any:
    for sequence, times in ((left, right), (right, left)):
        size = _length(sequence)
        if size is not None and isinstance(times, int) and size * max(times, 0) > MAX_SEQUENCE:
            raise _Refused(f"a sequence of {size:,} repeated {times:,} times is longer than lesson values allow "
                           f"({MAX_SEQUENCE:,})")
    if _int_bits(left) + _int_bits(right) > MAX_INT_BITS:
        raise _Refused(f"a product of {_int_bits(left) + _int_bits(right):,} bits is larger than lesson values "
                       f"allow ({MAX_INT_BITS:,})")
    return left * right


def _bounded_add(left: Any, right: Any) -> Any:
    sizes = (_length(left), _length(right))
    if None not in sizes and sizes[0] + sizes[1] > MAX_SEQUENCE:  # type: ignore[operator]
        raise _Refused(f"a sequence longer than lesson values allow ({MAX_SEQUENCE:,})")
    return left + right


def _bounded_modulo(left: Any, right: Any) -> Any:
    if isinstance(left, str):  # printf-style formatting: "%*d" % (10**9, 1) builds a gigabyte of spaces
        raise _Refused("%-formatting of text is not allowed in lesson values")
    return left % right


_BINARY = {
    ast.Add: _bounded_add, ast.Sub: lambda a, b: a - b, ast.Mult: _bounded_multiply, ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b, ast.Mod: _bounded_modulo, ast.Pow: _bounded_power,
}
_UNARY = {ast.USub: lambda a: -a, ast.UAdd: lambda a: +a, ast.Not: lambda a: not a}
_COMPARE = {
    ast.Eq: lambda a, b: a == b, ast.NotEq: lambda a, b: a != b, ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b, ast.Gt: lambda a, b: a > b, ast.GtE: lambda a, b: a >= b,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b, ast.Is: lambda a, b: a is b,
    ast.IsNot: lambda a, b: a is not b,
}


def _call_by(deadline: float, function: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """function(*args, **kwargs), stopped with _Refused once `deadline` passes: a per-thread line trace
    checks the clock inside the callee (a theory loop the arguments did not bound). Under a debugger or
    coverage tracer (sys.gettrace() set) the call runs untraced, rather than replacing that tracer."""
    if sys.gettrace() is not None:
        return function(*args, **kwargs)

    def trace(frame: Any, event: str, arg: Any) -> Any:
        if time.monotonic() > deadline:
            raise _Refused(f"took longer than {MAX_SECONDS:g} s (lesson values must be quick to compute)")
        return trace

    sys.settrace(trace)
    try:
        return function(*args, **kwargs)
    finally:
        sys.settrace(None)


class _Interpreter:
    """Evaluates one checked expression tree against a scope, within MAX_STEPS and MAX_SECONDS."""

    def __init__(self, scope: dict[str, Any], callables: frozenset[int]) -> None:
        self.scope = scope
        self.callables = callables
        self.steps = 0
        self.deadline = time.monotonic() + MAX_SECONDS

    def run(self, node: ast.AST, local: dict[str, Any]) -> Any:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise _Refused(f"more than {MAX_STEPS:,} steps (lesson values must be quick to compute)")
        if self.steps % 64 == 0 and time.monotonic() > self.deadline:
            raise _Refused(f"took longer than {MAX_SECONDS:g} s (lesson values must be quick to compute)")
        return getattr(self, f"_{type(node).__name__}")(node, local)

    def _Expression(self, node: ast.Expression, local: dict[str, Any]) -> Any:
        return self.run(node.body, local)

    def _Constant(self, node: ast.Constant, local: dict[str, Any]) -> Any:
        return node.value

    def _Name(self, node: ast.Name, local: dict[str, Any]) -> Any:
        for names in (local, self.scope, SAFE_BUILTINS):
            if node.id in names:
                return names[node.id]
        raise NameError(f"name {node.id!r} is not defined")

    def _Attribute(self, node: ast.Attribute, local: dict[str, Any]) -> Any:
        owner = self.run(node.value, local)
        if owner is None:
            raise AttributeError(f"None has no attribute {node.attr!r} (guard it: `... if device else ...`)")
        if not isinstance(owner, (_ModuleView, Draw)) and not _is_tutor_object(owner):
            raise _Refused(f"{node.attr!r} is not allowed on {type(owner).__name__} in lesson values (attributes "
                           "only of the theory modules and of tutor's own objects)")
        return getattr(owner, node.attr)

    def _Call(self, node: ast.Call, local: dict[str, Any]) -> Any:
        function = self.run(node.func, local)
        if not self._may_call(function):
            raise _Refused(f"calling {getattr(function, '__name__', type(function).__name__)!r} is not allowed in "
                           "lesson values")
        args = [self.run(arg, local) for arg in node.args]
        kwargs: dict[str, Any] = {}
        for keyword in node.keywords:
            if keyword.arg is None:  # `**mapping`: _refuse_syntax refuses it before any run
                raise _Refused("**-arguments are not allowed in lesson values")
            kwargs[keyword.arg] = self.run(keyword.value, local)
        for value in (*args, *kwargs.values()):
            if callable(value):  # max(..., key=f) would call f outside these checks
                raise _Refused("passing a function as an argument is not allowed in lesson values")
        return _call_by(self.deadline, function, args, kwargs)

    def _may_call(self, function: Any) -> bool:
        if id(function) in self.callables:
            return True
        if isinstance(function, MethodType) and not function.__name__.startswith("_"):
            return _is_tutor_object(function.__self__)
        return isinstance(function, type) and _is_tutor_object(function)

    def _BinOp(self, node: ast.BinOp, local: dict[str, Any]) -> Any:
        return _BINARY[type(node.op)](self.run(node.left, local), self.run(node.right, local))

    def _UnaryOp(self, node: ast.UnaryOp, local: dict[str, Any]) -> Any:
        return _UNARY[type(node.op)](self.run(node.operand, local))

    def _BoolOp(self, node: ast.BoolOp, local: dict[str, Any]) -> Any:
        value: Any = None
        for operand in node.values:
            value = self.run(operand, local)
            if (not value) if isinstance(node.op, ast.And) else value:
                return value
        return value

    def _Compare(self, node: ast.Compare, local: dict[str, Any]) -> Any:
        left = self.run(node.left, local)
        for operator, comparator in zip(node.ops, node.comparators, strict=True):
            right = self.run(comparator, local)
            if not _COMPARE[type(operator)](left, right):
                return False
            left = right
        return True

    def _IfExp(self, node: ast.IfExp, local: dict[str, Any]) -> Any:
        return self.run(node.body if self.run(node.test, local) else node.orelse, local)

    def _List(self, node: ast.List, local: dict[str, Any]) -> Any:
        return [self.run(item, local) for item in node.elts]

    def _Tuple(self, node: ast.Tuple, local: dict[str, Any]) -> Any:
        return tuple(self.run(item, local) for item in node.elts)

    def _Dict(self, node: ast.Dict, local: dict[str, Any]) -> Any:
        return {self.run(key, local): self.run(value, local)  # type: ignore[arg-type]
                for key, value in zip(node.keys, node.values, strict=True)}

    def _Subscript(self, node: ast.Subscript, local: dict[str, Any]) -> Any:
        owner = self.run(node.value, local)
        if not isinstance(owner, (*_INDEXABLE, Draw)) and not _is_tutor_object(owner):
            raise _Refused(f"indexing {type(owner).__name__} is not allowed in lesson values")
        return owner[self.run(node.slice, local)]

    def _Slice(self, node: ast.Slice, local: dict[str, Any]) -> Any:
        parts = (node.lower, node.upper, node.step)
        return slice(*(None if part is None else self.run(part, local) for part in parts))

    def _GeneratorExp(self, node: ast.GeneratorExp, local: dict[str, Any]) -> Any:
        return (self.run(node.elt, inner) for inner in self._bindings(node.generators, 0, local))

    def _ListComp(self, node: ast.ListComp, local: dict[str, Any]) -> Any:
        items = []
        for inner in self._bindings(node.generators, 0, local):
            items.append(self.run(node.elt, inner))
            if len(items) > MAX_SEQUENCE:
                raise _Refused(f"a list longer than lesson values allow ({MAX_SEQUENCE:,})")
        return items

    def _bindings(self, generators: list[ast.comprehension], index: int, local: dict[str, Any]):
        if index == len(generators):
            yield local
            return
        generator = generators[index]
        for item in self.run(generator.iter, local):
            inner = dict(local)
            self._bind(generator.target, item, inner)
            if all(self.run(condition, inner) for condition in generator.ifs):
                yield from self._bindings(generators, index + 1, inner)

    def _bind(self, target: ast.AST, value: Any, local: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            local[target.id] = value
            return
        values = list(value)
        targets = target.elts  # type: ignore[attr-defined]
        if len(values) != len(targets):
            raise ValueError(f"cannot unpack {len(values)} values into {len(targets)} names")
        for name, item in zip(targets, values, strict=True):
            self._bind(name, item, local)


# ---- no file access while an expression runs ------------------------------------------------------
#
# The namespace offers no file-reading function, and this hook makes sure of it: while an expression is
# being evaluated, opening a file outside tutor's own package and the Python installation (imports),
# or starting a process, a connection or a change to the file system, raises PermissionError.

_EVALUATING: ContextVar[bool] = ContextVar("tutor_lesson_value_evaluating", default=False)
_REFUSED_EVENTS = ("os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.kill", "os.putenv",
                   "os.unsetenv", "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate", "os.chmod",
                   "os.chown", "os.link", "os.symlink", "os.utime", "subprocess.", "socket.", "shutil.", "ctypes.",
                   "urllib.", "webbrowser.", "sqlite3.")
_PATH_EVENTS = ("open", "os.listdir", "os.scandir")
_audit_hook_installed = False


@lru_cache(maxsize=1)
def _readable_roots() -> tuple[str, ...]:
    import tutor

    roots = {os.path.dirname(os.path.abspath(tutor.__file__)), sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(os.path.join(os.path.realpath(root), "") for root in roots)


def _may_open(path: Any, mode: Any) -> bool:
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False  # a bare file descriptor: nothing an expression needs
    if isinstance(mode, str) and any(flag in mode for flag in "wax+"):
        return False
    real = os.path.realpath(os.fsdecode(path))
    return real.startswith(_readable_roots())


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _EVALUATING.get():
        return
    if event in _PATH_EVENTS:
        mode = args[1] if event == "open" and len(args) > 1 else "r"
        if event == "open" and isinstance(args[2] if len(args) > 2 else 0, int) and \
                (args[2] if len(args) > 2 else 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            mode = "w"
        if not _may_open(args[0] if args else None, mode):
            raise PermissionError(f"lesson values may not read or write files ({args[0] if args else '?'!s})")
    elif event.startswith(_REFUSED_EVENTS):
        raise PermissionError(f"lesson values may not do {event}")


def _install_audit_hook() -> None:
    global _audit_hook_installed  # noqa: PLW0603 - a hook can be added once per process and never removed
    if not _audit_hook_installed:
        sys.addaudithook(_audit)
        _audit_hook_installed = True


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
    `draw`: the block's drawn values (name -> value), seen as `draw.name` / `draw["name"]`.

    Evaluated by an allow-list interpreter (see _Interpreter): bounded in size (MAX_INT_BITS,
    MAX_SEQUENCE), steps (MAX_STEPS) and time (MAX_SECONDS), with no file access."""
    tree = _compile(expr)
    scope = dict(_base_namespace())
    scope["device"] = _as_device(device)
    scope["reference_gpu"] = reference_gpu()
    scope["draw"] = Draw(draw)
    _install_audit_hook()
    token = _EVALUATING.set(True)
    try:
        return _Interpreter(scope, _namespace_callables()).run(tree, {})
    except _Refused as refusal:
        raise UserError(f"{{{{ {expr.strip()} }}}}: {refusal}") from None
    except UserError as error:
        raise UserError(f"{{{{ {expr.strip()} }}}}: {error}") from None
    except RecursionError:
        raise UserError(f"{{{{ {expr.strip()} }}}}: nested too deeply for lesson values") from None
    except Exception as error:  # noqa: BLE001 - a content bug: name the expression, never a traceback
        raise UserError(f"{{{{ {expr.strip()} }}}} failed: {type(error).__name__}: {error}") from None
    finally:
        _EVALUATING.reset(token)

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
