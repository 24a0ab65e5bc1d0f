"""tutor.formatting: every number a user reads, in human units, never in scientific notation or as a repr."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tutor.formatting import (
    format_bytes,
    format_count,
    format_decimal_bytes,
    format_duration,
    format_number,
    format_params,
    format_percent,
    format_quantity,
    format_rate,
)

_BINARY = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50, "EiB": 2**60}
_DECIMAL = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_SUPERSCRIPT = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")
_DURATION = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def number_of(text: str) -> float:
    """The number a reader takes from format_number's text (powers of ten included)."""
    if " × 10" in text:
        mantissa, exponent = text.split(" × 10")
        return float(f"{mantissa}e{int(exponent.translate(_SUPERSCRIPT))}")  # 10**-324 would underflow
    return float(text.replace(",", ""))


def bytes_of(text: str) -> float:
    mantissa, unit = text.split(" ", 1) if " × " not in text else text.rsplit(" ", 1)
    return number_of(mantissa) * _BINARY[unit]


def rate_of(text: str, base: str) -> float:
    mantissa, unit = text.rsplit(" ", 1)
    assert unit.endswith(base)
    return number_of(mantissa) * _DECIMAL[unit[: -len(base)]]


def seconds_of(text: str) -> float:
    parts = text.split(" ")
    return sum(number_of(parts[i]) * _DURATION[parts[i + 1]] for i in range(0, len(parts), 2))


def assert_readable(text: str) -> None:
    assert not re.search(r"\d[eE][+-]?\d", text), text  # no 7.4e-03, 1e+20
    assert "'" not in text and "[" not in text and "None" not in text, text


finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e30, max_value=1e30)
positive = st.floats(min_value=1e-12, max_value=1e24, allow_nan=False)


@given(finite)
def test_numbers_round_trip_within_the_shown_precision(value: float) -> None:
    text = format_number(value)
    assert_readable(text)
    assert number_of(text) == pytest.approx(value, rel=5e-3, abs=0)


@given(st.integers(min_value=-10**14, max_value=10**14))
def test_whole_numbers_are_exact_with_thousands_separators(value: int) -> None:
    text = format_number(value)
    assert int(text.replace(",", "")) == value
    assert re.fullmatch(r"-?\d{1,3}(,\d{3})*", text), text


@given(st.floats(min_value=0, max_value=1e21, allow_nan=False))
def test_bytes_round_trip_in_binary_units(n: float) -> None:
    text = format_bytes(n)
    assert_readable(text)
    assert bytes_of(text) == pytest.approx(n, rel=5e-3, abs=1e-9)
    mantissa = number_of(text.rsplit(" ", 1)[0])
    assert n < 1024 or 1 <= mantissa < 1024  # the unit keeps the mantissa in 1..1023


@given(positive, positive)
def test_byte_units_are_monotonic(a: float, b: float) -> None:
    small, large = sorted((a, b))
    assert bytes_of(format_bytes(small)) <= bytes_of(format_bytes(large)) * (1 + 1e-12)


@given(positive, st.sampled_from(["FLOP/s", "kFLOP/s", "GFLOP/s", "TFLOP/s", "B/s", "GB/s", "TB/s"]))
def test_rates_scale_to_a_mantissa_below_a_thousand(value: float, unit: str) -> None:
    base = "FLOP/s" if "FLOP" in unit else "B/s"
    text = format_rate(value, unit)
    assert_readable(text)
    assert rate_of(text, base) == pytest.approx(value * _DECIMAL[unit[: -len(base)]], rel=5e-3)
    mantissa = number_of(text.rsplit(" ", 1)[0])
    assert mantissa < 1000 or value * _DECIMAL[unit[: -len(base)]] >= 999.5e18  # E is the largest prefix
    assert mantissa >= 1 or text.endswith(f" {base}")  # below 1 only where no smaller prefix exists


@given(positive, positive)
def test_rate_units_are_monotonic(a: float, b: float) -> None:
    small, large = sorted((a, b))
    assert rate_of(format_rate(small, "TFLOP/s"), "FLOP/s") <= rate_of(format_rate(large, "TFLOP/s"), "FLOP/s") * (1 + 1e-12)


@given(st.floats(min_value=1e-10, max_value=1e7, allow_nan=False))
def test_durations_round_trip(seconds: float) -> None:
    text = format_duration(seconds)
    assert_readable(text)
    # Beyond a minute the shown figure is whole seconds, minutes or hours.
    tolerance = 5e-3 * seconds if seconds < 60 else (0.5 if seconds < 3600 else 30 if seconds < 86400 else 1800)
    assert abs(seconds_of(text) - seconds) <= tolerance + 1e-15


@given(st.one_of(st.none(), st.booleans(), finite, st.just(math.nan), st.just(math.inf)),
       st.sampled_from(["", "B", "bytes", "GiB", "GB", "s", "ms", "%", "x", "tokens", "tokens/s", "TFLOP/s",
                        "GB/s", "relative error"]))
def test_any_quantity_reads_as_text_a_person_writes(value, unit: str) -> None:
    text = format_quantity(value, unit)
    assert_readable(text)
    assert text and "nan" not in text.lower()


@pytest.mark.parametrize(("value", "unit", "expected"), [
    (0.0074, "TFLOP/s", "7.4 GFLOP/s"),
    (0.007446, "TFLOP/s", "7.45 GFLOP/s"),
    (0.134, "TFLOP/s", "134 GFLOP/s"),
    (16510, "B", "16.1 KiB"),
    (16510.0, "bytes", "16.1 KiB"),
    (8192, "B", "8 KiB"),
    (512, "B", "512 B"),
    (0.0074, "s", "7.4 ms"),
    (0.0074, "", "0.0074"),
    (85.94, "%", "85.9%"),
    (3.21, "x", "3.21x"),
    (8192, "tokens", "8,192 tokens"),
    (1.5e9, "tokens", "1.5B tokens"),
    (204.8, "GB/s", "205 GB/s"),
    (3350, "GB/s", "3.35 TB/s"),
    (80, "GB", "80 GB"),
    (24, "GiB", "24 GiB"),
    (5.96e-8, "", "5.96 × 10⁻⁸"),
    (True, "", "yes"),
    (False, "", "no"),
    (None, "GB/s", "N/A"),
    (math.nan, "s", "N/A"),
    (math.inf, "", "inf"),
])
def test_quantities_as_the_issue_names_them(value, unit: str, expected: str) -> None:
    assert format_quantity(value, unit) == expected


def test_rounding_up_to_the_next_unit_moves_to_that_unit() -> None:
    assert format_bytes(1023.9 * 2**20) == "1 GiB"
    assert format_rate(999.7, "GFLOP/s") == "1 TFLOP/s"
    assert format_duration(0.9997) == "1 s"
    assert format_duration(59.97) == "1 min"


def test_bytes_with_the_datasheet_size_beside() -> None:
    assert format_bytes(80e9, si_beside=True) == "74.5 GiB (80 GB)"
    assert format_bytes(512, si_beside=True) == "512 B"
    assert format_decimal_bytes(1.61e9) == "1.61 GB"


def test_counts_as_model_cards_write_them() -> None:
    assert format_count(8_030_261_248) == "8.03B"
    assert format_count(124_439_808) == "124M"
    assert format_count(12_900) == "12.9K"
    assert format_count(512) == "512"
    assert format_count(8_030_261_248, exact=True) == "8,030,261,248"


def test_percent_takes_a_fraction() -> None:
    assert format_percent(0.859) == "85.9%"
    assert format_percent(0.003) == "0.3%"
    assert format_percent(1) == "100%"
    assert format_percent(None) == "N/A"


def test_durations_pick_a_unit_a_person_uses() -> None:
    assert [format_duration(s) for s in (8.5e-7, 1.25e-5, 3.2, 125, 12_000, 190_000)] == [
        "850 ns", "12.5 µs", "3.2 s", "2 min 5 s", "3 h 20 min", "2 d 5 h"]


def test_lab_parameters_read_without_reprs() -> None:
    assert format_params({"dtypes": ["fp32"], "budget_s": 3}) == "dtypes fp32 · budget 3 s"
    assert format_params({"dtypes": ["fp32", "bf16"], "size": 4096, "fused": True, "dir": None}) == \
        "dtypes fp32, bf16 · size 4,096 · fused yes · dir N/A"


def test_exact_values_read_back_as_the_same_float() -> None:
    from tutor.formatting import format_exact

    assert [format_exact(x) for x in (0.1, 1.0, 65504.0, 1e-5, -448.0, 2**-24)] == [
        "0.1", "1", "65,504", "0.00001", "-448", "5.960464477539063 × 10⁻⁸"]


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_exact_values_round_trip(value: float) -> None:
    from tutor.formatting import format_exact

    text = format_exact(value)
    assert_readable(text)
    if " × 10" in text:
        mantissa, exponent = text.split(" × 10")
        assert float(f"{mantissa}e{exponent.translate(_SUPERSCRIPT)}") == value
    else:
        assert float(text.replace(",", "")) == value


def test_past_the_largest_prefix_a_power_of_ten_of_the_unit():
    # The Llama 3 paper's 3.8 x 10^25 FLOPs of training: no prefix reaches it.
    assert format_quantity(3.8e25, "FLOP") == "3.8 × 10²⁵ FLOP"
    assert format_quantity(999e18, "FLOP") == "999 EFLOP"  # the largest prefix while it holds the figure
    assert format_quantity(3.8e10, "PFLOP") == "3.8 × 10²⁵ FLOP"
    assert format_count(3e22) == "3 × 10²²"
    # Rounded up past the largest prefix: 999.6 EFLOP would show as "1,000 EFLOP".
    assert format_quantity(999.6e18, "FLOP") == "1 × 10²¹ FLOP"
    assert format_quantity(999.6e18, "FLOP/s") == "1 × 10²¹ FLOP/s"
