"""cast-error: real torch casts against tutor.theory.formats.encode, bit for bit.

Values (given, or drawn log-uniformly across the whole range of the target format: subnormals,
underflow to zero, normals and overflow) are held in a source dtype, cast by torch to the target,
and the stored bits are compared with the bits `encode` derives from the field widths. The error
statistics are computed from what torch stored, and read against the unit roundoff 2^-(m+1).

The source is fp32 for the narrow targets: torch casts float64 to bf16/fp16 through float32, a
double rounding that can differ from one correct rounding in the last place (seen on this
machine: about 1 value in 10,000); choose source = "fp64" to see it.
"""

from __future__ import annotations

import math
import random
import threading
import time
from fractions import Fraction

from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe
from tutor.formatting import format_exact, format_number

CAST_DTYPES = ("fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2")
SOURCES = ("auto", "fp32", "fp64")
# Values shown one per row when the learner gives them.
MAX_VALUE_ROWS = 12
CHECK_CANCEL_EVERY = 128


def torch_saturates_e4m3() -> bool:
    """Whether this torch's float8_e4m3fn cast clamps a finite overflow (and ±inf) to ±448, as builds
    with pytorch/pytorch#178817 (April 2026) do, rather than giving NaN as earlier ones do (2.11: the
    OCP OFP8 non-saturating mode). tutor.theory.formats.encode has both; what a real cast is
    checked against is the one this torch implements. Imports torch."""
    import torch

    return not math.isnan(torch.tensor([1000.0]).to(torch.float8_e4m3fn).float().item())


def cast_to(inputs, torch_dtype):
    """The cast under test: torch's own, on the CPU (where `inputs` are made)."""
    return inputs.to(torch_dtype)


def _metric_name(dtype: str) -> str:
    return dtype.replace("-", "_")


def unit_roundoff(dtype: str) -> Fraction:
    """Largest relative error of round-to-nearest in the normal range: u = eps/2 = 2^-(m+1).

    Higham, Accuracy and Stability of Numerical Algorithms (2nd ed.), §2.1 Theorem 2.2; eps from
    tutor.theory.formats (bf16 2^-8, fp16 2^-11, E4M3 2^-4, E5M2 2^-3).
    """
    from tutor.theory.formats import format_by_name

    return format_by_name(dtype).epsilon / 2


def random_values(count: int, dtype: str, source: str, seed: int) -> list[float]:
    """`count` values whose magnitudes are log-uniform from a quarter of the target's smallest
    subnormal to twice its largest finite value (capped at the source's own range), random signs."""
    from tutor.theory.formats import format_by_name

    target = format_by_name(dtype)
    low = math.log2(target.min_subnormal) - 2
    high = math.log2(target.max_finite) + 1
    if source == "fp32":
        held = format_by_name("fp32")
        high = min(high, math.log2(held.max_finite))
        low = max(low, math.log2(held.min_subnormal))
    rng = random.Random(seed)
    return [rng.choice((-1.0, 1.0)) * 2.0 ** rng.uniform(low, high) for _ in range(count)]


_NON_FINITE_WORDS = {"nan": math.nan, "inf": math.inf, "+inf": math.inf, "-inf": -math.inf,
                     "infinity": math.inf, "+infinity": math.inf, "-infinity": -math.inf}


def _exact_value(value: str | float) -> Fraction | float:
    """A value as given: "0.1" exactly (a Fraction, rounded once by the cast), "nan"/"inf" as floats."""
    if not isinstance(value, str):
        return value
    return _NON_FINITE_WORDS.get(value.strip().lower()) or Fraction(value)


def _value_text(value: str | float) -> str:
    """A value as IEEE 754 names it: NaN is a value here, not a missing figure."""
    number = float(_exact_value(value)) if isinstance(value, str) else value
    return "NaN" if math.isnan(number) else format_exact(number)


def _cast_error(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    progress(0.0, "loading torch")
    import torch

    from tutor.theory.formats import Kind, encode, format_by_name

    deadline = time.perf_counter() + params["budget_s"]  # the budget is for the check, not for loading torch

    dtype = params["dtype"]
    source = params["source"]
    if source == "auto":
        source = "fp64" if dtype == "fp32" else "fp32"
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
                   "fp8-e4m3": torch.float8_e4m3fn, "fp8-e5m2": torch.float8_e5m2}[dtype]
    source_dtype = torch.float64 if source == "fp64" else torch.float32
    given = params["values"]
    if given is not None:
        raw = [_exact_value(value) for value in given]
        inputs = torch.tensor([float(value) for value in raw], dtype=source_dtype)
    else:
        inputs = torch.tensor(random_values(params["count"], dtype, source, params["seed"]), dtype=source_dtype)
    cast = cast_to(inputs, torch_dtype)
    # Overflow in fp8-e4m3 is the one place torch builds differ (torch_saturates_e4m3); the theory is
    # read in the mode this one casts with, and the rows say which.
    saturate = torch_saturates_e4m3() if dtype == "fp8-e4m3" else None
    size = cast.element_size()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[size]
    torch_bits = [bits & (2 ** (8 * size) - 1) for bits in cast.view(view).tolist()]
    torch_values = cast.to(torch.float64).tolist()
    held = inputs.to(torch.float64).tolist()  # exact: float32 and float64 both fit a float64

    fmt = format_by_name(dtype)
    agree = 0
    rel_errors: list[float] = []
    counts = {"overflow": 0, "underflow": 0, "subnormal": 0}
    value_rows: list[Measurement] = []
    done = 0
    cancelled = False
    for index, (x, bits, stored) in enumerate(zip(held, torch_bits, torch_values, strict=True)):
        if index % CHECK_CANCEL_EVERY == 0:
            if cancel.is_set():
                cancelled = True
                break
            if time.perf_counter() > deadline:
                break
            progress(index / len(held), f"checking {index} of {len(held)} casts")
        encoding = encode(x, fmt, saturate=saturate)
        # Any NaN is a NaN: its sign and payload bits are the implementation's choice (IEEE 754 §6.2.3).
        same = encoding.storage_word == bits or (math.isnan(x) and math.isnan(stored))
        agree += same
        done += 1
        if encoding.saturated or encoding.overflowed or encoding.kind is Kind.INF:
            counts["overflow"] += 1
        elif encoding.underflowed:
            counts["underflow"] += 1
        elif encoding.kind is Kind.SUBNORMAL:
            counts["subnormal"] += 1
        elif math.isfinite(x) and fmt.min_normal <= abs(Fraction(x)) <= fmt.max_finite:
            # The bound u holds for inputs in the normal range; an input just below the smallest
            # normal that rounds up to it is a subnormal-range rounding, with a larger error.
            rel_errors.append(float(abs(Fraction(stored) - Fraction(x)) / abs(Fraction(x))))
        if given is not None and len(value_rows) < MAX_VALUE_ROWS:
            theory = encoding.rel_error
            measured = (float(abs(Fraction(stored) - Fraction(x)) / abs(Fraction(x)))
                        if x != 0 and math.isfinite(x) and math.isfinite(stored) else None)
            value_rows.append(Measurement(
                label=f"{_value_text(given[index])} -> {_value_text(stored)} in {dtype}",
                measured=measured, unit="relative error",
                theory=float(theory) if theory is not None else None,
                theory_source=f"IEEE 754 round to nearest, ties to even: bits {encoding.bit_string}",
                note="" if same else f"torch stored bits {bits:#x}, theory {encoding.storage_word:#x}"))

    if done == 0 and not cancelled:
        from tutor.errors import UserError

        raise UserError(f"cast-error: the budget of {params['budget_s']:g} s ran out before the first value was "
                        "checked; give a larger budget_s")
    u = unit_roundoff(dtype)
    name = _metric_name(dtype)
    metrics: dict[str, float] = {
        "agree_fraction": agree / done if done else 0.0,
        f"unit_roundoff_{name}": float(u),
        "overflow_fraction": counts["overflow"] / done if done else 0.0,
        "underflow_fraction": counts["underflow"] / done if done else 0.0,
        "subnormal_fraction": counts["subnormal"] / done if done else 0.0,
    }
    if rel_errors:
        metrics[f"max_rel_error_{name}"] = max(rel_errors)
        metrics[f"mean_rel_error_{name}"] = math.fsum(rel_errors) / len(rel_errors)
    rows = [
        Measurement(label=f"torch casts bit-identical to the theory ({done} of {len(held)} values, "
                          f"{source} -> {dtype})",
                    measured=metrics["agree_fraction"], unit="fraction", theory=1.0,
                    theory_source="IEEE 754 encoding (round to nearest, ties to even)",
                    note="" if agree == done else
                    ("double rounding: torch casts float64 through float32" if source == "fp64" and dtype != "fp32"
                     else "a disagreement: report it, the theory or torch is wrong")),
        Measurement(label=f"largest relative error, normal range ({len(rel_errors)} values)",
                    measured=metrics.get(f"max_rel_error_{name}"), unit="relative error", theory=float(u),
                    theory_source=f"unit roundoff 2^-({fmt.mantissa_bits}+1) = eps/2 (Higham §2.1 Thm 2.2)",
                    note="never above the unit roundoff: rounding to nearest loses at most half a step"),
        Measurement(label="mean relative error, normal range", measured=metrics.get(f"mean_rel_error_{name}"),
                    unit="relative error", note="about a third of the unit roundoff for log-uniform inputs"),
        Measurement(label="overflowed (inf, or saturated to max)", measured=metrics["overflow_fraction"],
                    unit="fraction", note=f"above {format_number(float(fmt.max_finite))}" + (
                        "; this torch casts e4m3 overflow to NaN (no saturation), and so does the theory here"
                        if saturate is False else "")),
        Measurement(label="underflowed to zero", measured=metrics["underflow_fraction"], unit="fraction",
                    note=f"below half of {format_number(float(fmt.min_subnormal))}"),
        Measurement(label="subnormal (reduced precision)", measured=metrics["subnormal_fraction"], unit="fraction",
                    note=f"below {format_number(float(fmt.min_normal))}: fewer significant bits, larger relative error"),
    ]
    progress(1.0, "done")
    summary = (f"{agree} of {done} torch casts to {dtype} match the theory bit for bit; largest relative error "
               f"{format_number(metrics.get(f'max_rel_error_{name}'))} (bound {format_number(float(u))})")
    return ProbeResult(probe="cast-error", rows=tuple(rows + value_rows), metrics=metrics, summary=summary,
                       cancelled=cancelled, device="cpu")


CAST_ERROR = make_probe(
    name="cast-error",
    title="Rounding error of a real cast",
    description="Casts values with torch to a narrow format and compares every stored bit with "
                "tutor.theory.formats.encode; reports the relative errors against the unit roundoff.",
    needs_torch=True,
    params=(
        Param("dtype", "str", "bf16", "format to cast to", choices=CAST_DTYPES),
        Param("values", "number-list", None, "values to cast (default: random across the whole range)",
              optional=True),
        Param("count", "int", 2000, "how many random values when none are given", minimum=1, maximum=200_000),
        Param("source", "str", "auto", "dtype the values are held in before the cast (auto: fp64 for an fp32 "
              "target, else fp32)", choices=SOURCES),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(3.0, "seconds allowed (the check stops early when cancelled)"),
    ),
    metrics=("agree_fraction", "overflow_fraction", "underflow_fraction", "subnormal_fraction")
    + tuple(f"{kind}_{_metric_name(dtype)}" for dtype in CAST_DTYPES
            for kind in ("max_rel_error", "mean_rel_error", "unit_roundoff")),
    body=_cast_error,
    metrics_of=lambda p: ("agree_fraction", "overflow_fraction", "underflow_fraction", "subnormal_fraction")
    + tuple(f"{kind}_{_metric_name(p['dtype'])}" for kind in ("max_rel_error", "mean_rel_error", "unit_roundoff")),
)
