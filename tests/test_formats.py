"""tutor.theory.formats against torch (finfo, bit views, casts) and the published format definitions."""

from __future__ import annotations

import math
import statistics
import struct
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.theory.formats import (
    FORMATS,
    NF4_CODES,
    Kind,
    NumberFormat,
    decode,
    encode,
    encoding_of_bits,
    format_by_name,
    int_absmax_scale,
    nearest_nf4_code,
    quantize_int,
    quantize_nf4,
)

import torch

from tutor.labs.precision import torch_saturates_e4m3

TORCH_DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8-e4m3": torch.float8_e4m3fn,
    "fp8-e5m2": torch.float8_e5m2,
}
VIEW_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32}
SAMPLED = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def f32(bits: int) -> float:
    """The float32 with this bit pattern, as a Python float (exact)."""
    return struct.unpack("<f", struct.pack("<I", bits))[0]


F32_MAX = f32(0x7F7FFFFF)


def to_f32(x: float) -> float:
    """x rounded to float32 (finite, in range)."""
    return min(struct.unpack("<f", struct.pack("<f", min(x, F32_MAX)))[0], F32_MAX)


def same_float(a: float, b: float) -> bool:
    """Equal including the sign of zero, or both NaN."""
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def torch_decode_all(name: str) -> list[float]:
    """Every bit pattern of a 8/16-bit format, read by torch: pattern i -> float value."""
    fmt, dtype = FORMATS[name], TORCH_DTYPES[name]
    count = 2**fmt.storage_bits
    raw = struct.pack(f"<{count}{'B' if fmt.storage_bits == 8 else 'H'}", *range(count))
    return torch.frombuffer(bytearray(raw), dtype=dtype).float().tolist()


def torch_cast_bits(value: float, name: str, source: torch.dtype = torch.float32) -> int:
    """The bit pattern torch produces when casting `value` (held in `source`) to the format."""
    dtype = TORCH_DTYPES[name]
    size = torch.tensor([], dtype=dtype).element_size()
    word = torch.tensor([value], dtype=source).to(dtype).view(VIEW_INT[size]).item()
    return word & (2 ** (8 * size) - 1)


# ---- registry and names --------------------------------------------------------------------------


def test_registry_holds_exactly_the_documented_formats() -> None:
    assert list(FORMATS) == ["fp32", "tf32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2", "fp64", "int8", "int4", "nf4"]
    assert all(fmt.name == key and isinstance(fmt, NumberFormat) for key, fmt in FORMATS.items())


@pytest.mark.parametrize(
    ("alias", "key"),
    [("float32", "fp32"), ("float16", "fp16"), ("half", "fp16"), ("bfloat16", "bf16"), ("BF16", "bf16"),
     ("e4m3", "fp8-e4m3"), ("e5m2", "fp8-e5m2"), ("fp8", "fp8-e4m3"), ("torch.float8_e4m3fn", "fp8-e4m3"),
     ("float8_e5m2", "fp8-e5m2"), (" tf32 ", "tf32"), ("int4", "int4"), ("nf4", "nf4")],
)
def test_format_by_name_accepts_aliases(alias: str, key: str) -> None:
    assert format_by_name(alias) is FORMATS[key]


@pytest.mark.parametrize("name", ["uint8", "fp128", "", "fp8-e3m4", "int"])
def test_unknown_format_raises_one_line_user_error_listing_valid_names(name: str) -> None:
    with pytest.raises(UserError) as caught:
        format_by_name(name)
    message = str(caught.value)
    assert "\n" not in message and repr(name) in message
    assert all(key in message for key in FORMATS)


# ---- properties against torch.finfo / iinfo and the published definitions --------------------------


@pytest.mark.parametrize("name", list(TORCH_DTYPES))
def test_float_properties_equal_torch_finfo(name: str) -> None:
    fmt, info = FORMATS[name], torch.finfo(TORCH_DTYPES[name])
    assert fmt.storage_bits == fmt.total_bits == info.bits
    assert fmt.epsilon == Fraction(info.eps)
    assert fmt.max_finite == Fraction(info.max)
    assert fmt.min_finite == Fraction(info.min)
    assert fmt.min_normal == Fraction(info.tiny) == Fraction(info.smallest_normal)
    assert 10.0**-fmt.resolution_digits == pytest.approx(info.resolution)
    # torch.finfo has no smallest_subnormal: read the pattern 0...01 back through torch instead.
    assert fmt.min_subnormal == Fraction(torch_decode_all(name)[1] if name != "fp32" else f32(1))


@pytest.mark.parametrize("name", ["fp32", "tf32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2"])
def test_float_properties_agree_with_the_bit_patterns_they_come_from(name: str) -> None:
    fmt = FORMATS[name]
    below_specials = encode(fmt.max_finite, fmt).bits
    assert decode(below_specials, fmt) == fmt.max_finite
    assert encoding_of_bits(below_specials + 1, fmt).kind in (Kind.INF, Kind.NAN)
    assert decode(1, fmt) == fmt.min_subnormal
    assert decode(1 << fmt.mantissa_bits, fmt) == fmt.min_normal
    assert decode(encode(1, fmt).bits + 1, fmt) - 1 == fmt.epsilon


def test_tf32_matches_the_a100_whitepaper_definition() -> None:
    # NVIDIA A100 whitepaper: TF32 has FP32's 8-bit exponent (same range) and FP16's 10-bit mantissa.
    tf32, fp32, fp16 = FORMATS["tf32"], FORMATS["fp32"], FORMATS["fp16"]
    assert (tf32.exponent_bits, tf32.mantissa_bits, tf32.storage_bits, tf32.total_bits) == (8, 10, 32, 19)
    assert tf32.epsilon == fp16.epsilon == Fraction(1, 1024)
    assert tf32.min_normal == fp32.min_normal and tf32.bias == 127
    assert tf32.max_finite == (2 - Fraction(1, 1024)) * 2**127
    assert math.floor(tf32.decimal_digits) == math.floor(fp16.decimal_digits) == 3
    assert encode(1.0, tf32).storage_word == 0x3F800000  # same word as fp32 1.0
    assert encode(1 + 2**-11, tf32).value == 1  # tie: to even
    assert encode(1 + 3 * 2**-11, tf32).value == 1 + Fraction(1, 2**9)


def test_fp8_properties_match_table_1_of_the_fp8_paper() -> None:
    # Micikevicius et al., "FP8 Formats for Deep Learning", arXiv 2209.05433, Table 1.
    e4m3, e5m2 = FORMATS["fp8-e4m3"], FORMATS["fp8-e5m2"]
    table = {"fp8-e4m3": (7, 448, Fraction(1, 2**6), Fraction(1, 2**9)),
             "fp8-e5m2": (15, 57344, Fraction(1, 2**14), Fraction(1, 2**16))}
    for name, (bias, largest, normal, subnormal) in table.items():
        fmt = FORMATS[name]
        assert (fmt.bias, fmt.max_finite, fmt.min_normal, fmt.min_subnormal) == (bias, largest, normal, subnormal)
    assert not e4m3.has_inf and e4m3.has_nan and e5m2.has_inf and e5m2.has_nan
    assert encoding_of_bits(0b0_1111_111, e4m3).kind is Kind.NAN  # S.1111.111 is E4M3's only NaN
    assert encoding_of_bits(0b0_1111_110, e4m3).value == 448
    assert encoding_of_bits(0b0_11111_00, e5m2).kind is Kind.INF
    assert {encoding_of_bits(b, e5m2).kind for b in (0b0_11111_01, 0b0_11111_10, 0b0_11111_11)} == {Kind.NAN}


def test_decimal_digits_and_ranges_match_published_values() -> None:
    # IEEE 754 significand precision p = m + 1: binary32 24 bits ~ 7.22 digits, binary16 11 bits ~ 3.31.
    assert round(FORMATS["fp32"].decimal_digits, 2) == 7.22
    assert round(FORMATS["fp16"].decimal_digits, 2) == 3.31
    assert round(FORMATS["bf16"].decimal_digits, 2) == 2.41
    # fp16: 65504 / 2**-24 spans 12.04 decades; bf16 keeps fp32's 2**-126..3.39e38 normal range.
    assert round(FORMATS["fp16"].dynamic_range_decades, 2) == 12.04
    assert FORMATS["bf16"].normal_range_decades == pytest.approx(FORMATS["fp32"].normal_range_decades, abs=1e-2)


def test_integer_ranges_match_torch_iinfo_and_twos_complement() -> None:
    info = torch.iinfo(torch.int8)
    int8, int4 = FORMATS["int8"], FORMATS["int4"]
    assert (int8.min_finite, int8.max_finite, int8.storage_bits) == (info.min, info.max, info.bits)
    assert (int4.min_finite, int4.max_finite, int4.storage_bits) == (-8, 7, 4)
    assert int8.signed and int4.signed and not int8.has_inf and not int8.has_nan
    assert [decode(b, int4) for b in (0b0111, 0b1000, 0b1111)] == [7, -8, -1]
    assert decode(0x80, int8) == -128


@pytest.mark.parametrize("name", ["int8", "int4", "nf4"])
def test_float_only_properties_of_non_float_formats_raise_user_error(name: str) -> None:
    with pytest.raises(UserError):
        _ = FORMATS[name].epsilon
    with pytest.raises(UserError):
        encode(1.0, name)


# ---- exhaustive decode against torch --------------------------------------------------------------


@pytest.mark.parametrize("name", ["fp8-e4m3", "fp8-e5m2", "bf16", "fp16"])
def test_every_bit_pattern_decodes_to_what_torch_reads(name: str) -> None:
    fmt = FORMATS[name]
    expected = torch_decode_all(name)
    mismatches = [
        (hex(bits), want)
        for bits, want in enumerate(expected)
        if not same_float(encoding_of_bits(bits, fmt).value_float, want)
    ]
    assert not mismatches[:5]


@pytest.mark.parametrize("name", ["fp8-e4m3", "fp8-e5m2", "bf16", "fp16"])
def test_every_non_nan_pattern_round_trips_through_encode(name: str) -> None:
    fmt = FORMATS[name]
    for bits in range(2**fmt.total_bits):
        decoded = encoding_of_bits(bits, fmt)
        if decoded.kind is Kind.NAN:
            continue
        assert encode(decoded.value_float, fmt).bits == bits, hex(bits)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_fp32_patterns_decode_like_struct(bits: int) -> None:
    assert same_float(encoding_of_bits(bits, "fp32").value_float, f32(bits))


# ---- encode against torch casts --------------------------------------------------------------------


def _tie_and_neighbours(name: str) -> st.SearchStrategy[float]:
    """Midpoints between adjacent values of the format (ties), and the float32 on either side of them."""
    fmt = FORMATS[name]

    def build(bits: int, negative: bool, nudge: int) -> float:
        exponent = bits >> fmt.mantissa_bits
        low = encoding_of_bits(bits, fmt).value
        assert low is not None
        spacing = Fraction(2) ** (max(exponent, 1) - fmt.bias - fmt.mantissa_bits)
        tie = float(low + spacing / 2)
        tie = min(tie, F32_MAX)
        word = struct.unpack("<I", struct.pack("<f", tie))[0] + nudge
        return -f32(word) if negative else f32(word)

    top = encode(fmt.max_finite, fmt).bits
    return st.builds(build, st.integers(0, top), st.booleans(), st.sampled_from([-1, 0, 0, 1]))


def _float32_inputs(name: str) -> st.SearchStrategy[float]:
    fmt = FORMATS[name]
    near_max = float(fmt.max_finite)
    return st.one_of(
        st.floats(width=32),
        st.integers(0, 2**32 - 1).map(f32),
        _tie_and_neighbours(name),
        st.floats(min_value=to_f32(near_max * 0.9), max_value=min(to_f32(near_max * 1.2), F32_MAX), width=32),
        st.floats(min_value=0.0, max_value=float(fmt.min_normal) * 2, width=32),
    )


# fp8-e4m3 overflow: ±448 from torch builds with pytorch#178817, NaN from earlier ones (2.11). The theory
# has both modes; a cast is checked against the one this torch implements (the lab does the same).
E4M3_SATURATES = torch_saturates_e4m3()


def _check_against_torch_cast(x: float, name: str, source: torch.dtype = torch.float32) -> None:
    fmt = FORMATS[name]
    ours = encode(x, fmt, saturate=E4M3_SATURATES if name == "fp8-e4m3" else None)
    theirs = torch_cast_bits(x, name, source)
    # our bits must mean what our Encoding says they mean
    assert encoding_of_bits(ours.bits, fmt).kind is ours.kind
    if encoding_of_bits(theirs, fmt).kind is Kind.NAN:
        assert ours.kind is Kind.NAN, (x, ours.bit_string)
    else:
        assert ours.bits == theirs, (x, ours.bit_string, format(theirs, f"0{fmt.total_bits}b"))
        if ours.abs_error is not None:
            # the reported error is |what torch stores - input|, exactly
            torch_value = encoding_of_bits(theirs, fmt).value
            assert ours.abs_error == abs(torch_value - Fraction(x))


@SAMPLED
@given(_float32_inputs("bf16"))
@example(float("inf"))
@example(float("nan"))
@example(-0.0)
def test_encode_bf16_matches_torch_cast(x: float) -> None:
    _check_against_torch_cast(x, "bf16")


@SAMPLED
@given(_float32_inputs("fp16"))
@example(65520.0)  # max + half ulp: IEEE rounds to inf
@example(65519.99609375)
@example(-float("inf"))
def test_encode_fp16_matches_torch_cast(x: float) -> None:
    _check_against_torch_cast(x, "fp16")


@SAMPLED
@given(_float32_inputs("fp8-e4m3"))
@example(464.0)
@example(470.0)
@example(1e30)
@example(float("inf"))
@example(-float("inf"))
@example(float("nan"))
@example(2.0**-10)  # half the smallest subnormal: ties to zero
def test_encode_e4m3_matches_torch_cast(x: float) -> None:
    _check_against_torch_cast(x, "fp8-e4m3")


def test_torch_saturates_e4m3_says_what_this_torch_stores_for_an_overflow() -> None:
    stored = [torch.tensor([v]).to(torch.float8_e4m3fn).float().item() for v in (1000.0, -1e30)]
    if E4M3_SATURATES:
        assert stored == [448.0, -448.0]
    else:
        assert all(math.isnan(v) for v in stored)


@SAMPLED
@given(_float32_inputs("fp8-e5m2"))
@example(61440.0)  # max + half ulp
@example(float("inf"))
@example(float("nan"))
def test_encode_e5m2_matches_torch_cast(x: float) -> None:
    _check_against_torch_cast(x, "fp8-e5m2")


def _float64_inputs() -> st.SearchStrategy[float]:
    def fp32_tie(bits: int, nudge: int) -> float:
        low = Fraction(f32(bits))
        exponent = (bits >> 23) & 0xFF
        tie = low + Fraction(2) ** (max(exponent, 1) - 127 - 23) / 2
        return math.nextafter(float(tie), math.inf if nudge > 0 else -math.inf) if nudge else float(tie)

    return st.one_of(
        st.floats(),
        st.floats(min_value=-1e-37, max_value=1e-37),
        st.floats(min_value=3.3e38, max_value=3.5e38),
        st.builds(fp32_tie, st.integers(0, 0x7F7FFFFF), st.sampled_from([-1, 0, 1])),
    )


@SAMPLED
@given(_float64_inputs())
@example(0.1)
@example(3.4028235677973366e38)  # fp32 max + half ulp -> inf
def test_encode_fp32_from_float64_matches_torch_cast(x: float) -> None:
    _check_against_torch_cast(x, "fp32", source=torch.float64)


# ---- rounding properties ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fp32", "tf32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2"])
@settings(max_examples=300, deadline=None)
@given(x=st.floats(allow_nan=False, allow_infinity=False))
def test_rounding_error_is_at_most_half_a_spacing(name: str, x: float) -> None:
    fmt = FORMATS[name]
    enc = encode(x, fmt, saturate=False)
    if enc.kind in (Kind.INF, Kind.NAN):
        assert enc.overflowed and abs(Fraction(x)) > fmt.max_finite
        return
    assert enc.abs_error == abs(enc.value - Fraction(x))
    magnitude = abs(Fraction(x))
    exponent = max(math.floor(math.log2(magnitude)) if magnitude else fmt.min_exponent, fmt.min_exponent)
    assert enc.abs_error <= Fraction(2) ** (exponent - fmt.mantissa_bits) / 2
    if fmt.min_normal <= magnitude <= fmt.max_finite:
        assert enc.rel_error <= fmt.epsilon / 2  # unit roundoff u = 2**-(m+1)


def test_known_encodings() -> None:
    assert encode("0.1", "fp32").bits == 0x3DCCCCCD  # 0.1 in binary32
    assert encode(1.0, "fp16").bit_string == "0 01111 0000000000"
    assert encode("-2", "bf16").bit_string == "1 10000000 0000000"
    assert encode("1/3", "fp16").value == Fraction(1365, 4096)
    negative_zero = encode("-0", "fp16")
    assert negative_zero.bits == 0x8000 and negative_zero.kind is Kind.ZERO and not negative_zero.underflowed
    tiny = encode(1e-30, "fp16")
    assert tiny.kind is Kind.ZERO and tiny.underflowed and tiny.abs_error == Fraction(1e-30)
    assert encode(2**-24, "fp16").kind is Kind.SUBNORMAL
    assert encode("1e-5000", "fp32").underflowed


def test_overflow_and_saturation_modes() -> None:
    # E4M3 default: what torch.float8_e4m3fn casts do (checked above): clamp to ±448, inf included.
    assert encode(1e6, "fp8-e4m3").value == 448 and encode(1e6, "fp8-e4m3").saturated
    assert encode(-math.inf, "fp8-e4m3").value == -448
    # Non-saturating E4M3 (OCP OFP8): past 464 (448 + half a step) there is no value left: NaN.
    assert encode(464, "fp8-e4m3", saturate=False).value == 448
    over = encode(465, "fp8-e4m3", saturate=False)
    assert over.kind is Kind.NAN and over.overflowed and over.abs_error is None and math.isnan(over.abs_error_float)
    # IEEE formats overflow to inf unless asked to saturate.
    assert encode(65520, "fp16").kind is Kind.INF and encode(65520, "fp16").overflowed
    assert encode(65520, "fp16").abs_error_float == math.inf
    assert encode(65520, "fp16", saturate=True).value == 65504
    clamped = encode(math.inf, "fp8-e5m2", saturate=True)
    assert clamped.value == 57344 and clamped.saturated and not clamped.overflowed
    assert encode(math.inf, "fp8-e5m2").kind is Kind.INF and encode(math.inf, "fp8-e5m2").abs_error_float == 0
    for saturate in (None, True, False):
        assert encode(math.nan, "fp8-e4m3", saturate=saturate).kind is Kind.NAN
        assert math.isnan(encode("nan", "fp16", saturate=saturate).abs_error_float)


@pytest.mark.parametrize("bad", ["abc", "1e99999", "", "0x", [1.0], None, True])
def test_bad_values_raise_user_error(bad: object) -> None:
    with pytest.raises(UserError):
        encode(bad, "fp16")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("bits", "name"), [(256, "fp8-e4m3"), (-1, "fp16"), (2**19, "tf32"), (16, "nf4"), (16, "int4"), (1.0, "bf16")]
)
def test_out_of_range_bit_patterns_raise_user_error(bits: int, name: str) -> None:
    with pytest.raises(UserError):
        decode(bits, name)


# ---- integer quantization -----------------------------------------------------------------------------

finite_floats = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(finite_floats, min_size=1, max_size=40), bits=st.sampled_from([8, 4]))
def test_absmax_int_quantization_error_is_at_most_half_a_step(values: list[float], bits: int) -> None:
    result = quantize_int(values, bits)
    qmax = 2 ** (bits - 1) - 1
    assert result.scale == int_absmax_scale(values, bits) == max(abs(Fraction(v)) for v in values) / qmax
    assert all(-qmax <= code <= qmax for code in result.codes) and not any(result.clipped)
    assert all(error <= result.scale / 2 for error in result.abs_errors)
    if result.scale:
        assert max(abs(code) for code in result.codes) == qmax  # the absmax value maps to ±qmax exactly


def test_int8_quantization_rounds_half_to_even_and_clips_with_a_given_scale() -> None:
    result = quantize_int([0.5, -1.0, 0.25], 8)  # scale 1/127: 63.5 -> 64, 31.75 -> 32
    assert result.codes == (64, -127, 32)
    assert quantize_int([2.5, 3.5, -2.5], 8, scale=1).codes == (2, 4, -2)
    clipped = quantize_int([2.0, 0.5, -3.0], 8, scale="0.01")
    assert clipped.codes == (127, 50, -127) and clipped.clipped == (True, False, True)
    assert clipped.abs_errors[0] == Fraction(2) - Fraction(127, 100)
    zeros = quantize_int([0.0, 0.0], 4)
    assert zeros.codes == (0, 0) and zeros.scale == 0


@pytest.mark.parametrize(
    ("values", "bits", "scale"),
    [([], 8, None), ([math.nan], 8, None), ([1.0], 1, None), ([1.0], 8, 0), ([1.0], 8, -1.0), ("1,2", 8, None)],
)
def test_bad_quantization_input_raises_user_error(values: object, bits: int, scale: object) -> None:
    with pytest.raises(UserError):
        quantize_int(values, bits, scale)  # type: ignore[arg-type]


# ---- NF4 -------------------------------------------------------------------------------------------------


def test_nf4_codes_are_the_qlora_normal_quantiles() -> None:
    # QLoRA (arXiv 2305.14314) §3 / bitsandbytes create_normal_map(offset=0.9677083): 8 positive quantiles
    # of N(0,1) at linspace(offset, 0.5, 9)[:-1], 7 negative at linspace(offset, 0.5, 8)[:-1], a zero,
    # all divided by the largest. Recomputed here with the standard library's NormalDist.
    offset, normal = 0.9677083, statistics.NormalDist()
    positive = [normal.inv_cdf(offset - i * (offset - 0.5) / 8) for i in range(8)]
    negative = [-normal.inv_cdf(offset - i * (offset - 0.5) / 7) for i in range(7)]
    derived = sorted(v / max(positive) for v in positive + negative + [0.0])
    assert len(NF4_CODES) == 16 and list(NF4_CODES) == sorted(NF4_CODES)
    assert (NF4_CODES[0], NF4_CODES[7], NF4_CODES[15]) == (-1, 0, 1)
    assert [float(code) for code in NF4_CODES] == pytest.approx(derived, abs=2e-6)
    # each table entry is an exact float32, as bitsandbytes stores it
    assert all(struct.unpack("<f", struct.pack("<f", float(c)))[0] == float(c) for c in NF4_CODES)
    assert [decode(i, "nf4") for i in range(16)] == list(NF4_CODES)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(finite_floats, min_size=1, max_size=150), blocksize=st.sampled_from([1, 7, 64]))
def test_nf4_picks_the_nearest_code_after_absmax_scaling(values: list[float], blocksize: int) -> None:
    result = quantize_nf4(values, blocksize)
    assert len(result.absmax) == math.ceil(len(values) / blocksize)
    for index, x in enumerate(result.inputs):
        absmax = result.absmax[index // blocksize]
        assert absmax == max(abs(v) for v in result.inputs[index // blocksize * blocksize:][:blocksize])
        if absmax == 0:
            assert result.dequantized[index] == 0
            continue
        distances = [abs(x / absmax - code) for code in NF4_CODES]
        assert distances[result.codes[index]] == min(distances)
        assert result.dequantized[index] == NF4_CODES[result.codes[index]] * absmax
        assert result.abs_errors[index] == abs(result.dequantized[index] - x)


def test_nf4_block_extremes_are_exact_and_ties_go_down() -> None:
    result = quantize_nf4([0.3, -2.0, 1.0, 4.0], blocksize=2)
    assert result.absmax == (2, 4) and result.codes[1] == 0 and result.codes[3] == 15
    assert result.abs_errors[1] == 0 and result.abs_errors[3] == 0
    midpoint = (NF4_CODES[8] + NF4_CODES[9]) / 2
    assert nearest_nf4_code(midpoint) == 8
    with pytest.raises(UserError):
        quantize_nf4([1.0], blocksize=0)
