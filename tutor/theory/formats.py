"""Number formats used by LLM training and inference: their bit layouts, ranges and exact rounding.

Every float property is derived from the field widths (sign, exponent, mantissa) with exact
`fractions.Fraction` arithmetic; only the special-value rule of each format is stated by hand:

* "ieee": the all-ones exponent holds ±inf (mantissa 0) and NaN (mantissa != 0). IEEE 754-2019 §3.4;
  used by fp32, tf32, bf16, fp16 and FP8 E5M2.
* "fn" (finite, one NaN): no infinities; only S.1111.111 is NaN, so the top exponent holds normal
  numbers. FP8 E4M3 of Micikevicius et al., "FP8 Formats for Deep Learning", arXiv 2209.05433,
  Table 1, and the OCP 8-bit Floating Point Specification (OFP8) v1.0; torch.float8_e4m3fn.

Rounding is round-to-nearest, ties-to-even (IEEE 754-2019 §4.3.1), the mode of every torch cast.
Integer formats use symmetric absmax quantization (LLM.int8, arXiv 2208.07339 §2.1); NF4 is the
16-value codebook of QLoRA (arXiv 2305.14314) with block-wise absmax scaling.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from fractions import Fraction
from functools import cached_property
from typing import Literal, TypedDict

from tutor.errors import UserError

Number = float | int | Fraction | str

# QLoRA NF4 code values, as bitsandbytes stores them (float32 values written in decimal):
# bitsandbytes/functional.py, get_4bit_type("nf4"); Dettmers et al. 2023, arXiv 2305.14314, Appendix E.
# Fraction(float(text)) is the exact float32 value, since each literal is the repr of a float32.
_NF4_CODE_LITERALS = (
    "-1.0", "-0.6961928009986877", "-0.5250730514526367", "-0.39491748809814453",
    "-0.28444138169288635", "-0.18477343022823334", "-0.09105003625154495", "0.0",
    "0.07958029955625534", "0.16093020141124725", "0.24611230194568634", "0.33791524171829224",
    "0.44070982933044434", "0.5626170039176941", "0.7229568362236023", "1.0",
)
NF4_CODES: tuple[Fraction, ...] = tuple(Fraction(float(text)) for text in _NF4_CODE_LITERALS)


@dataclass(frozen=True)
class NumberFormat:
    """One storage format. Float properties are derived from the field widths, never typed in."""

    name: str
    """Registry key, e.g. "bf16"."""
    family: Literal["float", "int", "codebook"]
    """float: sign/exponent/mantissa; int: two's complement; codebook: index into a value table (NF4)."""
    storage_bits: int
    """Bits one value occupies in memory. TF32 is stored in a 32-bit word but keeps only 19 of them."""
    exponent_bits: int = 0
    mantissa_bits: int = 0
    """Stored fraction bits, without the implicit leading 1."""
    specials: Literal["ieee", "fn", "none"] = "none"
    """Where inf/NaN live: "ieee" (top exponent), "fn" (only S.1...1 is NaN, no inf), "none"."""
    saturating_cast: bool = False
    """True when a plain cast clamps overflow to ±max instead of producing inf/NaN (torch's e4m3fn)."""
    codebook: tuple[Fraction, ...] = ()
    """Code values for a codebook format (NF4), indexed by the stored bits, normalised to [-1, 1]."""
    summary: str = ""
    source: str = ""

    # ---- layout -------------------------------------------------------------------------------

    @property
    def sign_bits(self) -> int:
        """1 for every format here: all are signed."""
        return 1

    @property
    def total_bits(self) -> int:
        """Bits that carry information: 1 + exponent + mantissa for floats (TF32: 19), else storage."""
        if self.family == "float":
            return self.sign_bits + self.exponent_bits + self.mantissa_bits
        return self.storage_bits

    @property
    def signed(self) -> bool:
        """Whether negative values are representable (always, for these formats)."""
        return True

    @cached_property
    def bias(self) -> int:
        """Exponent bias 2**(e-1) - 1 (IEEE 754-2019 §3.3: bias = emax): fp32 127, fp16 15, E4M3 7."""
        self._require_float("an exponent bias")
        return 2 ** (self.exponent_bits - 1) - 1

    @cached_property
    def max_exponent(self) -> int:
        """Largest unbiased exponent of a finite number: the top field is reserved only under "ieee"."""
        self._require_float("an exponent")
        top_field = 2**self.exponent_bits - (2 if self.specials == "ieee" else 1)
        return top_field - self.bias

    @cached_property
    def min_exponent(self) -> int:
        """Smallest unbiased exponent of a normal number, 1 - bias (IEEE 754-2019 §3.3: emin = 1 - emax)."""
        self._require_float("an exponent")
        return 1 - self.bias

    @property
    def has_inf(self) -> bool:
        """Whether ±inf is encodable (not in E4M3fn, whose top exponent holds finite numbers)."""
        return self.specials == "ieee"

    @property
    def has_nan(self) -> bool:
        """Whether a NaN encoding exists."""
        return self.specials in ("ieee", "fn")

    # ---- ranges -------------------------------------------------------------------------------

    @cached_property
    def max_finite(self) -> Fraction:
        """Largest finite value.

        float "ieee": (2 - 2**-m) * 2**emax (fp32 3.4028e38, fp16 65504, bf16 3.3895e38, E5M2 57344);
        float "fn": the all-ones mantissa is NaN, so (2 - 2**(1-m)) * 2**emax (E4M3: 448; arXiv
        2209.05433 Table 1); int: 2**(b-1) - 1; codebook: its largest code (NF4: 1).
        """
        if self.family == "int":
            return Fraction(2 ** (self.storage_bits - 1) - 1)
        if self.family == "codebook":
            return max(self.codebook)
        top_mantissa = 2**self.mantissa_bits - (2 if self.specials == "fn" else 1)
        return (1 + Fraction(top_mantissa, 2**self.mantissa_bits)) * Fraction(2) ** self.max_exponent

    @cached_property
    def min_finite(self) -> Fraction:
        """Most negative finite value: -max for floats, -2**(b-1) for two's complement ints (int8 -128)."""
        if self.family == "int":
            return Fraction(-(2 ** (self.storage_bits - 1)))
        if self.family == "codebook":
            return min(self.codebook)
        return -self.max_finite

    @cached_property
    def min_normal(self) -> Fraction:
        """Smallest positive normal number, 2**emin (fp32 1.1755e-38, fp16 6.1035e-5, E4M3 2**-6)."""
        return Fraction(2) ** self.min_exponent

    @cached_property
    def min_subnormal(self) -> Fraction:
        """Smallest positive value, 2**(emin - m) (fp32 2**-149, fp16 2**-24, E4M3 2**-9, E5M2 2**-16)."""
        return Fraction(2) ** (self.min_exponent - self.mantissa_bits)

    @cached_property
    def epsilon(self) -> Fraction:
        """Machine epsilon: the gap between 1 and the next larger value, 2**-m (bf16 2**-7)."""
        self._require_float("a machine epsilon")
        return Fraction(1, 2**self.mantissa_bits)

    @property
    def decimal_digits(self) -> float:
        """Decimal digits of precision, p * log10(2) with p = m + 1 (fp32 7.22, fp16 3.31, bf16 2.41)."""
        self._require_float("decimal digits of precision")
        return (self.mantissa_bits + 1) * math.log10(2)

    @property
    def resolution_digits(self) -> int:
        """floor(-log10(eps)): the digits numpy/torch finfo report as `precision` (fp32 6, fp16 3)."""
        return math.floor(-_log10(self.epsilon))

    @property
    def dynamic_range_decades(self) -> float:
        """log10(max finite / smallest subnormal): the decades spanned (fp16 12.04, E4M3 5.36)."""
        self._require_float("a dynamic range")
        return _log10(self.max_finite / self.min_subnormal)

    @property
    def normal_range_decades(self) -> float:
        """log10(max finite / min normal): decades spanned at full precision (fp16 9.03, E4M3 4.46)."""
        self._require_float("a dynamic range")
        return _log10(self.max_finite / self.min_normal)

    def _require_float(self, what: str) -> None:
        if self.family != "float":
            raise UserError(f"{self.name} is not a floating-point format, so it has no {what}")


def _log10(value: Fraction) -> float:
    """log10 of a positive Fraction without overflowing a float (fp32 ranges reach 2**-149)."""
    return (math.log2(value.numerator) - math.log2(value.denominator)) * math.log10(2)


def _float_format(name: str, storage: int, exponent: int, mantissa: int, specials: Literal["ieee", "fn"],
                  summary: str, source: str, saturating_cast: bool = False) -> NumberFormat:
    return NumberFormat(name=name, family="float", storage_bits=storage, exponent_bits=exponent,
                        mantissa_bits=mantissa, specials=specials, saturating_cast=saturating_cast,
                        summary=summary, source=source)


FORMATS: dict[str, NumberFormat] = {
    "fp32": _float_format(
        "fp32", 32, 8, 23, "ieee", "IEEE single precision: 8-bit exponent, 23-bit mantissa.",
        "IEEE 754-2019 §3.6 Table 3.5 (binary32)"),
    "tf32": _float_format(
        "tf32", 32, 8, 10, "ieee",
        "TensorFloat-32: FP32's 8-bit exponent with FP16's 10-bit mantissa; a tensor-core compute "
        "mode, stored in a 32-bit word of which 19 bits are kept.",
        "NVIDIA A100 Tensor Core GPU Architecture whitepaper (2020), 'TF32'"),
    "bf16": _float_format(
        "bf16", 16, 8, 7, "ieee", "bfloat16: FP32's 8-bit exponent (same range), 7-bit mantissa.",
        "Kalamkar et al., 'A Study of BFLOAT16 for Deep Learning Training', arXiv 1905.12322 §2"),
    "fp16": _float_format(
        "fp16", 16, 5, 10, "ieee", "IEEE half precision: 5-bit exponent, 10-bit mantissa.",
        "IEEE 754-2019 §3.6 Table 3.5 (binary16)"),
    "fp8-e4m3": _float_format(
        "fp8-e4m3", 8, 4, 3, "fn",
        "FP8 E4M3 (float8_e4m3fn): no infinities, one NaN pattern S.1111.111, max 448; "
        "torch's cast saturates overflow to ±448 (builds before April 2026, such as 2.11, give NaN).",
        "Micikevicius et al., 'FP8 Formats for Deep Learning', arXiv 2209.05433 Table 1; OCP OFP8 v1.0",
        saturating_cast=True),
    "fp8-e5m2": _float_format(
        "fp8-e5m2", 8, 5, 2, "ieee", "FP8 E5M2: IEEE-like with inf and NaN, max 57344.",
        "Micikevicius et al., 'FP8 Formats for Deep Learning', arXiv 2209.05433 Table 1; OCP OFP8 v1.0"),
    "fp64": _float_format(
        "fp64", 64, 11, 52, "ieee", "IEEE double precision: 11-bit exponent, 52-bit mantissa; NumPy's default.",
        "IEEE 754-2019 §3.6 Table 3.5 (binary64)"),
    "int8": NumberFormat(
        name="int8", family="int", storage_bits=8,
        summary="8-bit two's complement integer; symmetric quantization uses -127..127.",
        source="Dettmers et al., 'LLM.int8()', arXiv 2208.07339 §2.1 (absmax quantization)"),
    "int4": NumberFormat(
        name="int4", family="int", storage_bits=4,
        summary="4-bit two's complement integer -8..7; symmetric quantization uses -7..7.",
        source="two's complement range; symmetric absmax as in arXiv 2208.07339 §2.1"),
    "nf4": NumberFormat(
        name="nf4", family="codebook", storage_bits=4, codebook=NF4_CODES,
        summary="4-bit NormalFloat: 16 quantiles of N(0,1) scaled to [-1, 1], absmax per block of 64.",
        source="Dettmers et al., 'QLoRA', arXiv 2305.14314 §3 and Appendix E; bitsandbytes "
               "functional.py get_4bit_type('nf4')"),
}

_ALIASES = {
    "float32": "fp32", "f32": "fp32", "single": "fp32",
    "tensorfloat32": "tf32", "tensorfloat-32": "tf32",
    "bfloat16": "bf16",
    "float16": "fp16", "half": "fp16", "f16": "fp16",
    "fp8": "fp8-e4m3", "e4m3": "fp8-e4m3", "e4m3fn": "fp8-e4m3", "fp8e4m3": "fp8-e4m3",
    "float8-e4m3fn": "fp8-e4m3", "float8-e4m3": "fp8-e4m3", "fp8-e4m3fn": "fp8-e4m3",
    "e5m2": "fp8-e5m2", "fp8e5m2": "fp8-e5m2", "float8-e5m2": "fp8-e5m2",
    "int4": "int4", "int8": "int8", "nf4": "nf4", "normalfloat4": "nf4",
}


def format_by_name(name: str) -> NumberFormat:
    """The format called `name` (registry key or alias such as 'bfloat16', 'half', 'e4m3', 'fp8').

    Case, a 'torch.' prefix and '_' vs '-' do not matter. Raises UserError naming the valid keys.
    """
    key = str(name).strip().lower().replace("_", "-")
    key = key.removeprefix("torch.")
    key = _ALIASES.get(key, key)
    if key not in FORMATS:
        raise UserError(f"unknown number format {name!r}; choose one of: {', '.join(FORMATS)}")
    return FORMATS[key]


def _resolve(fmt: NumberFormat | str) -> NumberFormat:
    return fmt if isinstance(fmt, NumberFormat) else format_by_name(fmt)


# ---- parsing user input ---------------------------------------------------------------------------

_DECIMAL_EXPONENT = re.compile(r"e([+-]?\d+)\s*$", re.IGNORECASE)
_MAX_DECIMAL_EXPONENT = 9999  # far beyond every format's range; keeps Fraction('1e999999999') from hanging


@dataclass(frozen=True)
class _ParsedValue:
    """A user's number split into sign and exact magnitude, so that -0.0, ±inf and NaN survive."""

    sign: int
    """1 when negative (including -0.0 and -inf), else 0."""
    magnitude: Fraction | None
    """|value|, or None for inf and NaN."""
    is_nan: bool = False

    @property
    def exact(self) -> Fraction | None:
        if self.magnitude is None:
            return None
        return -self.magnitude if self.sign else self.magnitude

    @property
    def as_float(self) -> float:
        if self.is_nan:
            return math.copysign(math.nan, -1.0 if self.sign else 1.0)
        if self.magnitude is None:
            return -math.inf if self.sign else math.inf
        value = _fraction_to_float(self.magnitude)
        return -value if self.sign else value


def _fraction_to_float(value: Fraction) -> float:
    """float(value), or ±inf past the float64 range instead of OverflowError."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _parse_value(value: Number) -> _ParsedValue:
    """Split a float, int, Fraction or text such as '0.1', '-1e-3', '3/7', 'inf', 'nan' into sign and |value|."""
    if isinstance(value, bool):
        raise UserError(f"not a number: {value!r} (give a float, a Fraction or text such as '0.1')")
    if isinstance(value, float):
        sign = 1 if math.copysign(1.0, value) < 0 else 0
        if math.isnan(value):
            return _ParsedValue(sign, None, is_nan=True)
        if math.isinf(value):
            return _ParsedValue(sign, None)
        return _ParsedValue(sign, abs(Fraction(value)))
    if isinstance(value, (int, Fraction)):
        fraction = Fraction(value)
        return _ParsedValue(1 if fraction < 0 else 0, abs(fraction))
    if isinstance(value, str):
        text = value.strip().lower().replace("_", "")
        sign = 1 if text.startswith("-") else 0
        body = text.lstrip("+-")
        if body == "nan":
            return _ParsedValue(sign, None, is_nan=True)
        if body in ("inf", "infinity"):
            return _ParsedValue(sign, None)
        exponent = _DECIMAL_EXPONENT.search(text)
        if exponent and abs(int(exponent.group(1))) > _MAX_DECIMAL_EXPONENT:
            raise UserError(f"exponent out of range in {value!r}: use a power of ten within ±{_MAX_DECIMAL_EXPONENT}")
        try:
            fraction = Fraction(text)
        except (ValueError, ZeroDivisionError):
            raise UserError(f"not a number: {value!r} (try 0.1, -3e-5, 1/3, inf or nan)") from None
        return _ParsedValue(sign, abs(fraction))
    raise UserError(f"not a number: {value!r} (give a float, a Fraction or text such as '0.1')")


# ---- float encoding -------------------------------------------------------------------------------


class Kind(StrEnum):
    """The class of a float encoding."""

    ZERO = "zero"
    SUBNORMAL = "subnormal"
    NORMAL = "normal"
    INF = "inf"
    NAN = "nan"


@dataclass(frozen=True)
class Encoding:
    """A value stored in a float format: its bit fields, what it decodes to, and the rounding error."""

    format: NumberFormat
    sign: int
    """Sign field (0 or 1)."""
    exponent: int
    """Biased exponent field as an unsigned integer."""
    mantissa: int
    """Mantissa (fraction) field as an unsigned integer, without the implicit bit."""
    kind: Kind
    input_value: Fraction | None
    """The exact input, or None when the input was inf or NaN."""
    input_float: float
    """The input as a float (±inf, NaN, or the nearest float64 of an exact input)."""
    value: Fraction | None
    """The exact value the bits represent, or None for inf and NaN."""
    saturated: bool = False
    """True when the input overflowed (or was ±inf) and was clamped to ±max finite."""
    overflowed: bool = False
    """True when a finite input rounded past max finite and became inf (IEEE) or NaN (E4M3 non-saturating)."""
    underflowed: bool = False
    """True when a nonzero finite input rounded to zero."""

    @property
    def bits(self) -> int:
        """The total_bits-wide pattern sign|exponent|mantissa (19 bits for TF32)."""
        fmt = self.format
        sign_shift = fmt.exponent_bits + fmt.mantissa_bits
        return (self.sign << sign_shift) | (self.exponent << fmt.mantissa_bits) | self.mantissa

    @property
    def storage_word(self) -> int:
        """The pattern as stored in memory: for TF32 the FP32 word with the 13 low mantissa bits zero."""
        return self.bits << (self.format.storage_bits - self.format.total_bits)

    @property
    def sign_string(self) -> str:
        return str(self.sign)

    @property
    def exponent_string(self) -> str:
        return format(self.exponent, f"0{self.format.exponent_bits}b")

    @property
    def mantissa_string(self) -> str:
        return format(self.mantissa, f"0{self.format.mantissa_bits}b")

    @property
    def bit_string(self) -> str:
        """Fields separated by spaces, e.g. '0 01111 0000000000' for fp16 1.0."""
        return f"{self.sign_string} {self.exponent_string} {self.mantissa_string}"

    @property
    def value_float(self) -> float:
        """The decoded value as a float: ±inf, NaN, -0.0 kept."""
        if self.kind is Kind.NAN:
            return math.copysign(math.nan, -1.0 if self.sign else 1.0)
        if self.kind is Kind.INF:
            return -math.inf if self.sign else math.inf
        assert self.value is not None
        return math.copysign(_fraction_to_float(abs(self.value)), -1.0 if self.sign else 1.0)

    @property
    def abs_error(self) -> Fraction | None:
        """|decoded - input| exactly; None when the input or the result is not finite."""
        if self.input_value is None or self.value is None:
            return None
        return abs(self.value - self.input_value)

    @property
    def rel_error(self) -> Fraction | None:
        """|decoded - input| / |input|; None when undefined (non-finite, or input zero)."""
        error = self.abs_error
        if error is None or self.input_value == 0:
            return None
        assert self.input_value is not None
        return error / abs(self.input_value)

    @property
    def abs_error_float(self) -> float:
        """abs_error as a float: 0 for inf kept as inf, inf when inf or overflow met a finite value, NaN with NaN."""
        error = self.abs_error
        if error is not None:
            return _fraction_to_float(error)
        if math.isnan(self.input_float) or self.kind is Kind.NAN:
            return math.nan
        if self.kind is Kind.INF and self.input_value is None:
            return 0.0 if self.input_float == self.value_float else math.inf
        return math.inf


def _floor_log2(value: Fraction) -> int:
    """floor(log2(value)) for value > 0, exactly."""
    numerator, denominator = value.numerator, value.denominator
    estimate = numerator.bit_length() - denominator.bit_length()
    # value >= 2**estimate  <=>  numerator * 2**-estimate >= denominator
    if estimate >= 0:
        below = numerator < denominator << estimate
    else:
        below = numerator << -estimate < denominator
    return estimate - 1 if below else estimate


def _round_to_fields(magnitude: Fraction, fmt: NumberFormat) -> tuple[int, int]:
    """(exponent field, mantissa field) of |x| rounded to nearest, ties to even (IEEE 754-2019 §4.3.1).

    The spacing is 2**(e - m) in binade e and 2**(emin - m) below min normal. The exponent field
    is not capped: a result past the top of the format is left for the caller to call overflow.
    """
    if magnitude == 0:
        return 0, 0
    shift = max(_floor_log2(magnitude), fmt.min_exponent) - fmt.mantissa_bits  # spacing = 2**shift
    numerator, denominator = magnitude.numerator, magnitude.denominator
    if shift >= 0:
        denominator <<= shift
    else:
        numerator <<= -shift
    steps, remainder = divmod(numerator, denominator)
    if 2 * remainder > denominator or (2 * remainder == denominator and steps & 1):
        steps += 1
    implicit_one = 1 << fmt.mantissa_bits
    if steps < implicit_one:  # subnormal (shift is at its minimum here) or zero
        return 0, steps
    if steps == 2 * implicit_one:  # rounding carried into the next binade
        steps, shift = implicit_one, shift + 1
    return shift + fmt.mantissa_bits + fmt.bias, steps - implicit_one


def _value_of_fields(exponent: int, mantissa: int, fmt: NumberFormat) -> Fraction:
    """|value| of finite fields: (1 + f/2**m) * 2**(E - bias) for normals, f * 2**(emin - m) for subnormals."""
    if exponent == 0:
        return mantissa * fmt.min_subnormal
    significand = (1 << fmt.mantissa_bits) + mantissa
    shift = exponent - fmt.bias - fmt.mantissa_bits
    return Fraction(significand << shift) if shift >= 0 else Fraction(significand, 1 << -shift)


def _max_finite_fields(fmt: NumberFormat) -> tuple[int, int]:
    """Fields of max finite: the top exponent is reserved under "ieee"; under "fn" only its all-ones mantissa is."""
    top_exponent, all_ones = 2**fmt.exponent_bits - 1, 2**fmt.mantissa_bits - 1
    if fmt.specials == "ieee":
        return top_exponent - 1, all_ones
    return top_exponent, all_ones - 1


def _kind_of_finite(exponent: int, mantissa: int) -> Kind:
    if exponent:
        return Kind.NORMAL
    return Kind.SUBNORMAL if mantissa else Kind.ZERO


def _nan_fields(fmt: NumberFormat) -> tuple[int, int]:
    """The NaN this module produces: all-ones for E4M3fn (its only NaN), the quiet NaN (top mantissa bit) else."""
    if fmt.specials == "fn":
        return 2**fmt.exponent_bits - 1, 2**fmt.mantissa_bits - 1
    return 2**fmt.exponent_bits - 1, 1 << (fmt.mantissa_bits - 1)


def _require_float_format(fmt: NumberFormat, verb: str) -> None:
    if fmt.family != "float":
        helper = "quantize_nf4" if fmt.family == "codebook" else "quantize_int"
        raise UserError(f"cannot {verb} {fmt.name} bit by bit: it is not a float format (use {helper})")


class _EncodedInput(TypedDict):
    """The Encoding fields that come from the input, the same whichever bits it rounds to."""

    format: NumberFormat
    sign: int
    input_value: Fraction | None
    input_float: float


def encode(value: Number, fmt: NumberFormat | str, saturate: bool | None = None) -> Encoding:
    """Round `value` to the nearest value of float format `fmt` (ties to even) and return its bits.

    Overflow: a finite input whose rounded magnitude exceeds max finite
    * saturate=None (default): does what torch's cast does: IEEE formats give ±inf
      (IEEE 754-2019 §7.4); fp8-e4m3 clamps to ±448, and ±inf also becomes ±448, as
      torch.float8_e4m3fn casts do since pytorch/pytorch#178817 (April 2026;
      torch/headeronly/util/Float8_e4m3fn.h, checked in tests/test_formats.py). Earlier builds
      (2.11 among them) give NaN instead: saturate=False; tutor.labs.precision.torch_saturates_e4m3
      says which one a torch is.
    * saturate=True: clamp to ±max finite, ±inf included: the "SATFINITE" conversion of CUDA's
      __nv_cvt_float_to_fp8 and the OCP OFP8 v1.0 saturation mode used by FP8 training recipes
      (NVIDIA Transformer Engine).
    * saturate=False: no clamping: inf for "ieee" formats, NaN for fp8-e4m3 (no inf to go to;
      OCP OFP8 v1.0 non-saturating mode).
    NaN stays NaN in every mode. Text input is exact: encode('0.1', 'fp32') rounds the real 1/10.
    TF32 is rounded the same way here; NVIDIA's PTX cvt.rna.tf32.f32 rounds ties away from zero,
    so a TF32 tie can differ from a GPU by one unit in the last place.
    """
    fmt = _resolve(fmt)
    _require_float_format(fmt, "encode")
    parsed = _parse_value(value)
    clamp = fmt.saturating_cast if saturate is None else saturate
    common = _EncodedInput(format=fmt, sign=parsed.sign, input_value=parsed.exact, input_float=parsed.as_float)
    top_exponent = 2**fmt.exponent_bits - 1

    if parsed.is_nan:
        exponent, mantissa = _nan_fields(fmt)
        return Encoding(exponent=exponent, mantissa=mantissa, kind=Kind.NAN, value=None, **common)

    if parsed.magnitude is None:
        exponent, mantissa, overflow = top_exponent, 0, True
    else:
        exponent, mantissa = _round_to_fields(parsed.magnitude, fmt)
        overflow = (exponent, mantissa) > _max_finite_fields(fmt)
    if overflow:
        if clamp:
            exponent, mantissa = _max_finite_fields(fmt)
            signed_max = -fmt.max_finite if parsed.sign else fmt.max_finite
            return Encoding(exponent=exponent, mantissa=mantissa, kind=Kind.NORMAL, value=signed_max,
                            saturated=True, **common)
        overflowed = parsed.magnitude is not None
        if fmt.has_inf:
            return Encoding(exponent=top_exponent, mantissa=0, kind=Kind.INF, value=None,
                            overflowed=overflowed, **common)
        exponent, mantissa = _nan_fields(fmt)
        return Encoding(exponent=exponent, mantissa=mantissa, kind=Kind.NAN, value=None,
                        overflowed=overflowed, **common)

    magnitude = _value_of_fields(exponent, mantissa, fmt)
    kind = _kind_of_finite(exponent, mantissa)
    underflowed = kind is Kind.ZERO and parsed.magnitude != 0
    return Encoding(exponent=exponent, mantissa=mantissa, kind=kind,
                    value=-magnitude if parsed.sign else magnitude, underflowed=underflowed, **common)


def encoding_of_bits(bits: int, fmt: NumberFormat | str) -> Encoding:
    """The Encoding that a total_bits-wide pattern sign|exponent|mantissa stands for (input = its value)."""
    fmt = _resolve(fmt)
    _require_float_format(fmt, "decode")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits < 2**fmt.total_bits:
        raise UserError(f"{fmt.name} bit pattern must be an integer in 0..{2**fmt.total_bits - 1}, got {bits!r}")
    mantissa = bits & (2**fmt.mantissa_bits - 1)
    exponent = (bits >> fmt.mantissa_bits) & (2**fmt.exponent_bits - 1)
    sign = bits >> (fmt.exponent_bits + fmt.mantissa_bits)
    top_exponent = 2**fmt.exponent_bits - 1
    negative = -1.0 if sign else 1.0

    if (fmt.specials == "ieee" and exponent == top_exponent) or (
        fmt.specials == "fn" and exponent == top_exponent and mantissa == 2**fmt.mantissa_bits - 1
    ):
        if fmt.specials == "ieee" and mantissa == 0:
            kind, as_float = Kind.INF, math.copysign(math.inf, negative)
        else:
            kind, as_float = Kind.NAN, math.copysign(math.nan, negative)
        return Encoding(format=fmt, sign=sign, exponent=exponent, mantissa=mantissa, kind=kind,
                        input_value=None, input_float=as_float, value=None)

    magnitude = _value_of_fields(exponent, mantissa, fmt)
    kind = _kind_of_finite(exponent, mantissa)
    value = -magnitude if sign else magnitude
    return Encoding(format=fmt, sign=sign, exponent=exponent, mantissa=mantissa, kind=kind,
                    input_value=value, input_float=math.copysign(_fraction_to_float(magnitude), negative),
                    value=value)


def decode(bits: int, fmt: NumberFormat | str) -> Fraction | float:
    """The value of a bit pattern: an exact Fraction when finite, else float ±inf or NaN.

    Float formats take the total_bits-wide pattern (TF32: 19 bits). Zero's sign is dropped here
    (Fraction(0)); use encoding_of_bits(bits, fmt).value_float to keep -0.0. int8/int4 read two's
    complement; nf4 returns the normalised code value (multiply by the block's absmax).
    """
    fmt = _resolve(fmt)
    if fmt.family == "int":
        if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits < 2**fmt.storage_bits:
            raise UserError(f"{fmt.name} bit pattern must be an integer in 0..{2**fmt.storage_bits - 1}, got {bits!r}")
        half = 2 ** (fmt.storage_bits - 1)
        return Fraction(bits - 2 * half if bits >= half else bits)
    if fmt.family == "codebook":
        if isinstance(bits, bool) or not isinstance(bits, int) or not 0 <= bits < len(fmt.codebook):
            raise UserError(f"{fmt.name} code must be an integer in 0..{len(fmt.codebook) - 1}, got {bits!r}")
        return fmt.codebook[bits]
    encoding = encoding_of_bits(bits, fmt)
    return encoding.value if encoding.value is not None else encoding.value_float


# ---- integer and NF4 quantization ------------------------------------------------------------------


@dataclass(frozen=True)
class IntQuantization:
    """Symmetric integer quantization of a list of values with one scale."""

    bits: int
    scale: Fraction
    """Value of one integer step: x ≈ code * scale."""
    inputs: tuple[Fraction, ...]
    codes: tuple[int, ...]
    dequantized: tuple[Fraction, ...]
    clipped: tuple[bool, ...]
    """True where round(x / scale) fell outside ±(2**(bits-1) - 1) and was clamped."""

    @property
    def abs_errors(self) -> tuple[Fraction, ...]:
        """|dequantized - input| per value, exactly."""
        return tuple(abs(d - x) for d, x in zip(self.dequantized, self.inputs))

    @property
    def max_abs_error(self) -> Fraction:
        return max(self.abs_errors)


def _finite_values(values: Sequence[Number], what: str) -> tuple[Fraction, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise UserError(f"{what} needs a list of numbers, got {values!r}")
    if len(values) == 0:
        raise UserError(f"{what} needs at least one value")
    exact = []
    for value in values:
        parsed = _parse_value(value)
        if parsed.exact is None:
            raise UserError(f"{what} needs finite values; got {value!r}")
        exact.append(parsed.exact)
    return tuple(exact)


def int_absmax_scale(values: Sequence[Number], bits: int) -> Fraction:
    """Per-tensor absmax step absmax(|x|) / (2**(bits-1) - 1): the value of one integer step.

    LLM.int8 (arXiv 2208.07339 §2.1) writes the same scaling as the factor s = 127 / absmax; this is 1/s.

    An all-zero input has scale 0 (every code is 0).
    """
    _check_int_bits(bits)
    exact = _finite_values(values, "int quantization")
    return max(abs(x) for x in exact) / (2 ** (bits - 1) - 1)


def _check_int_bits(bits: int) -> None:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 2 <= bits <= 32:
        raise UserError(f"integer bit width must be a whole number from 2 to 32 (e.g. 8 or 4), got {bits!r}")


def quantize_int(values: Sequence[Number], bits: int, scale: Number | None = None) -> IntQuantization:
    """Symmetric quantization: code = clamp(round_half_even(x / scale), -qmax, qmax), qmax = 2**(bits-1) - 1.

    scale=None uses the per-tensor absmax scale (LLM.int8, arXiv 2208.07339 §2.1), so nothing clips
    and every |error| <= scale / 2. The most negative code (-128 for int8) is unused, as in the paper.
    """
    _check_int_bits(bits)
    exact = _finite_values(values, "int quantization")
    qmax = 2 ** (bits - 1) - 1
    if scale is None:
        step = max(abs(x) for x in exact) / qmax
    else:
        parsed = _parse_value(scale)
        if parsed.exact is None or parsed.exact <= 0:
            raise UserError(f"quantization scale must be a positive finite number, got {scale!r}")
        step = parsed.exact
    codes, clipped = [], []
    for x in exact:
        raw = round(x / step) if step else 0  # Fraction.__round__: half to even
        codes.append(max(-qmax, min(qmax, raw)))
        clipped.append(abs(raw) > qmax)
    return IntQuantization(bits=bits, scale=step, inputs=exact, codes=tuple(codes),
                           dequantized=tuple(code * step for code in codes), clipped=tuple(clipped))


@dataclass(frozen=True)
class NF4Quantization:
    """NF4 block-wise quantization: per block an absmax, per value a 4-bit index into NF4_CODES."""

    blocksize: int
    absmax: tuple[Fraction, ...]
    """One scale per block of `blocksize` consecutive values (the last block may be shorter)."""
    inputs: tuple[Fraction, ...]
    codes: tuple[int, ...]
    """Indices 0..15 into NF4_CODES."""
    dequantized: tuple[Fraction, ...]

    @property
    def abs_errors(self) -> tuple[Fraction, ...]:
        """|dequantized - input| per value, exactly."""
        return tuple(abs(d - x) for d, x in zip(self.dequantized, self.inputs))

    @property
    def max_abs_error(self) -> Fraction:
        return max(self.abs_errors)


def nearest_nf4_code(normalised: Fraction) -> int:
    """Index of the NF4 code nearest to a value in [-1, 1]; a tie goes to the lower code, as the
    `x > midpoint` comparisons of bitsandbytes' dQuantizeNF4 do."""
    best = 0
    for index in range(1, len(NF4_CODES)):
        if normalised > (NF4_CODES[index - 1] + NF4_CODES[index]) / 2:
            best = index
    return best


def quantize_nf4(values: Sequence[Number], blocksize: int = 64) -> NF4Quantization:
    """QLoRA NF4 quantization (arXiv 2305.14314 §3): per block c = absmax(|x|), code = nearest NF4 value to x / c.

    Exact arithmetic: bitsandbytes stores c in fp32 and compares in fp32, which can move a value
    lying within float32 rounding of a decision midpoint to the neighbouring code.
    """
    if isinstance(blocksize, bool) or not isinstance(blocksize, int) or blocksize < 1:
        raise UserError(f"NF4 block size must be a positive whole number (QLoRA uses 64), got {blocksize!r}")
    exact = _finite_values(values, "NF4 quantization")
    absmaxes, codes, dequantized = [], [], []
    for start in range(0, len(exact), blocksize):
        block = exact[start:start + blocksize]
        absmax = max(abs(x) for x in block)
        absmaxes.append(absmax)
        for x in block:
            code = nearest_nf4_code(x / absmax) if absmax else 7  # index 7 is the code 0.0
            codes.append(code)
            dequantized.append(NF4_CODES[code] * absmax)
    return NF4Quantization(blocksize=blocksize, absmax=tuple(absmaxes), inputs=exact,
                           codes=tuple(codes), dequantized=tuple(dequantized))


# --------------------------------------------------------------------------------------------
# FP8 scaling: how training recipes map a tensor's range onto FP8's
# --------------------------------------------------------------------------------------------

FP8_FORWARD_FORMAT = "fp8-e4m3"
"""Activations and weights: more mantissa (Micikevicius et al., arXiv 2209.05433 §3: E4M3 for the
forward pass, E5M2 for gradients; Transformer Engine's `Format.HYBRID`)."""
FP8_GRADIENT_FORMAT = "fp8-e5m2"
"""Gradients: more range, the wider spread of values a backward pass produces (same sources)."""
MX_BLOCK_SIZE = 32
"""Elements per shared scale in the OCP Microscaling Formats (MX) Specification v1.0, §5.2 (k = 32)."""
DEEPSEEK_TILE = (1, 128)
"""DeepSeek-V3's activation tiles: one scale per token per 128 channels (arXiv 2412.19437 §3.3.2)."""
DEEPSEEK_BLOCK = (128, 128)
"""DeepSeek-V3's weight blocks: one scale per 128 x 128 block (arXiv 2412.19437 §3.3.2)."""


def _positive_finite(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)) or not math.isfinite(float(value)) \
            or value < 0:
        raise UserError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def _float_for_scaling(fmt: NumberFormat | str) -> NumberFormat:
    resolved = _resolve(fmt)
    if resolved.family != "float":
        raise UserError(f"{resolved.name} is not a float format: FP8 scaling needs one such as fp8-e4m3")
    return resolved


def fp8_scale(amax: float, fmt: NumberFormat | str = FP8_FORWARD_FORMAT, margin: int = 0) -> float:
    """The factor a tensor is multiplied by before its FP8 cast: (fp8 max / amax) / 2**margin.

    Transformer Engine's scaling rule (transformer_engine/pytorch/fp8.py, `_default_sf_compute`;
    NVIDIA Transformer Engine docs, "Using FP8 with Transformer Engine"): the largest magnitude maps
    to the format's largest finite value (E4M3: 448), `margin` powers of two below it. An amax of 0
    leaves the scale at 1, as TE keeps the previous one. Per-tensor "current" scaling takes amax from
    the tensor itself; "delayed" scaling from the amaxes of earlier steps (`delayed_amax`).
    """
    fmt = _float_for_scaling(fmt)
    amax = _positive_finite(amax, "amax")
    if isinstance(margin, bool) or not isinstance(margin, int) or not 0 <= margin <= 64:
        raise UserError(f"margin must be a whole number of powers of two from 0 to 64, got {margin!r}")
    if amax == 0:
        return 1.0
    return float(fmt.max_finite) / amax / 2**margin


def delayed_amax(history: Sequence[float], algorithm: str = "max") -> float:
    """The amax delayed scaling uses for this step: the max of the previous steps' amaxes ("max", TE's
    default, `DelayedScaling(amax_compute_algo="max")`), or the latest one ("most_recent").

    The current tensor is not in `history`: its amax is recorded after the cast (Transformer Engine
    docs, "Delayed scaling"), so a value larger than every earlier amax saturates at the FP8 max.
    """
    if isinstance(history, (str, bytes)) or not isinstance(history, Sequence) or not history:
        raise UserError("delayed scaling needs a non-empty amax history")
    values = [_positive_finite(value, "amax history value") for value in history]
    if algorithm == "max":
        return max(values)
    if algorithm == "most_recent":
        return values[-1]
    raise UserError(f"unknown amax algorithm {algorithm!r}: use max or most_recent")


def mx_scale_exponent(amax: float, fmt: NumberFormat | str = FP8_FORWARD_FORMAT) -> int:
    """The shared power-of-two scale of an MX block: floor(log2(amax)) - emax of the element format.

    OCP Microscaling Formats (MX) Specification v1.0, §6.3 (emax_elem: E4M3 8, E5M2 15); the scale is
    an E8M0 number 2**X, clamped to [-127, 127]. The block's largest value is divided by 2**X and lands
    in [2**emax, 2**(emax+1)), so with E4M3 (max 1.75 x 2**8) values near the top saturate. An all-zero
    block gets the smallest scale.
    """
    fmt = _float_for_scaling(fmt)
    amax = _positive_finite(amax, "amax")
    if amax == 0:
        return -127
    return max(-127, min(127, math.floor(math.log2(amax)) - fmt.max_exponent))


def scale_count(rows: int, cols: int, block_rows: int, block_cols: int) -> int:
    """Scales a rows x cols tensor needs with one per block_rows x block_cols block (partial blocks count).

    DeepSeek-V3 (arXiv 2412.19437 §3.3.2): activations in 1 x 128 tiles, weights in 128 x 128 blocks;
    per tensor is one block the size of the tensor.
    """
    for value, name in ((rows, "rows"), (cols, "cols"), (block_rows, "block rows"), (block_cols, "block cols")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{name} must be a positive whole number, got {value!r}")
    return -(-rows // block_rows) * -(-cols // block_cols)
