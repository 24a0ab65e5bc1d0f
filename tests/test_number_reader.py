"""The one reader of typed numbers (tutor.theory.number_reader): a guess, a quiz answer or a calculator
entry typed in another unit is converted to the block's unit, arithmetic is read safely, what was
read is said, and a unit of another kind is one clear line, never a misgrade."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.lessons.grading import grade
from tutor.lessons.model import Quiz
from tutor.lessons.predictions import read_guess, read_guess_as
from tutor.theory.number_reader import MONTH, DAY, convert, number_part, read_number, same_kind, shown_number


@pytest.mark.parametrize(("typed", "unit", "value"), [
    # the learner's hour: another unit of the same kind, read in the block's unit
    ("800 MB/s", "GB/s", 0.8),
    ("800MB/s", "GB/s", 0.8),
    ("800 MB", "GB/s", 0.8),              # the block's "per second" is implied
    ("800M", "GB/s", 0.8),                # a lone prefix in a bytes block: MB, as parse_bytes reads "80 G"
    ("1.2 TB/s", "GB/s", 1200.0),
    ("400 Gbit/s", "GB/s", 50.0),
    ("48 GB/min", "GB/s", 0.8),
    ("100 GFLOP/s", "TFLOP/s", 0.1),
    ("100 GFLOPS", "TFLOP/s", 0.1),      # FLOPS in a rate block is FLOP/s
    ("0.5 PFLOP/s", "TFLOP/s", 500.0),
    ("2 months", "days", 2 * MONTH / DAY),
    ("2 weeks", "days", 14.0),
    ("1 year", "days", 365.25),
    ("36 hours", "days", 1.5),
    ("250 ms", "s", 0.25),
    ("2 µs", "ms", 0.002),
    ("2 us", "ms", 0.002),
    ("45 min", "s", 2700.0),
    ("16 B", "B", 16.0),                  # B is bytes where the block counts bytes
    ("16 B", "bytes", 16.0),
    ("16 bytes", "B/param", 16.0),
    ("16 B", "B/param", 16.0),
    ("16 B per parameter", "B/param", 16.0),
    ("128 KiB", "bytes", 131072.0),
    ("14e9 bytes", "GB", 14.0),
    ("14 GiB", "GB", 14 * 2**30 / 1e9),
    ("30 million", "GPU-hours", 3e7),     # a count multiplies the block's unit
    ("30 million GPU-hours", "GPU-hours", 3e7),
    ("30M", "GPU-hours", 3e7),
    ("1.25 million GPU-days", "GPU-hours", 3e7),
    ("30 million", "", 3e7),
    ("30 million", "GPUs", 3e7),
    ("12.9B", "billion", 12.9),           # B is billion where the block counts things
    ("8.03B", "", 8.03e9),
    ("1.84M", "tokens", 1.84e6),
    ("15T", "tokens", 15e12),
    ("50k tokens/s", "tokens/s", 5e4),
    ("3 million tokens/min", "tokens/s", 5e4),
    ("6*1.24e9*15e12", "FLOP", 6 * 1.24e9 * 15e12),
    ("1.116e23 FLOPs", "FLOP", 1.116e23),
    ("2*80", "GB", 160.0),
    ("2 x 80", "GB", 160.0),
    ("1e3/8", "", 125.0),
    ("(2+3)*4", "", 20.0),
    ("2^-24", "", 2.0**-24),
    ("1.5 × 2^-7", "", 1.5 * 2.0**-7),
    ("3.39 × 10³⁸", "", 3.39e38),
    ("65,504", "", 65504.0),
    ("1,200 GB/s", "GB/s", 1200.0),
    ("1,200 GB/s", "", 1200.0),           # no unit to convert to: taken as written
    ("3.5x", "x", 3.5),
    ("150%", "x", 1.5),
    ("76 GPUs", "", 76.0),
    ("-1.5", "", -1.5),
    # plain numbers are in the block's unit, as before
    ("14", "GB", 14.0),
    ("0.8", "GB/s", 0.8),
    ("60", "days", 60.0),
])
def test_typed_numbers_are_read_in_the_blocks_unit(typed: str, unit: str, value: float) -> None:
    assert read_number(typed, unit).value == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize(("typed", "unit", "value", "note"), [
    # percent against fraction: a bare number in a % block is percent, and the block says so
    ("0.32", "%", 0.32, "read as 0.32%"),
    ("32", "%", 32.0, "read as 32%"),
    ("32%", "%", 32.0, "read as 32%"),
    ("32 percent", "%", 32.0, "read as 32%"),
    ("32%", "fraction", 0.32, "read as 0.32 (32%)"),
    ("0.32", "fraction", 0.32, "read as 0.32 (32%)"),
    ("32", "fraction", 0.32, "read as 0.32 (32%)"),  # a share above 1 cannot be meant
    ("50%", "", 0.5, "read as 0.5"),
])
def test_percent_and_fraction_follow_one_rule_and_say_it(typed: str, unit: str, value: float, note: str) -> None:
    reading = read_number(typed, unit)
    assert reading.value == pytest.approx(value) and reading.note == note


@pytest.mark.parametrize(("typed", "unit", "note"), [
    ("800 MB/s", "GB/s", "read as 0.8 GB/s"),
    ("100 GFLOP/s", "TFLOP/s", "read as 0.1 TFLOP/s"),
    ("2 months", "days", "read as 60.88 days"),
    ("30 million", "GPU-hours", "read as 30,000,000 GPU-hours"),
    ("6*1.24e9*15e12", "FLOP", "read as 1.116e23 FLOP"),
    ("1,200 GB/s", "", "read as 1,200 (GB/s taken as written: this answer has no unit)"),
    # a plain number in the block's unit says nothing: it means what it always meant
    ("0.8", "GB/s", ""),
    ("0.8 GB/s", "GB/s", ""),
    ("3.39e38", "", ""),
    ("65,504", "", ""),
    ("76 GPUs", "", ""),
])
def test_what_was_read_is_said(typed: str, unit: str, note: str) -> None:
    assert read_number(typed, unit).note == note


@pytest.mark.parametrize(("typed", "unit", "message"), [
    ("5 s", "GB/s", "'5 s' is a time, but this answer is a rate in bytes per second: type it in GB/s"),
    ("3 s", "GB", "'3 s' is a time, but this answer is a size in bytes"),
    ("12 GB", "ms", "'12 GB' is a size in bytes, but this answer is a time"),
    ("5 GB/s", "GB", "is a rate in bytes per second, but this answer is a size in bytes"),
    ("2 TFLOP/s", "GB/s", "is a FLOP rate, but this answer is a rate in bytes per second"),
    ("16 B/token", "B/param", "per token, but this answer is a size in bytes per param"),
    ("2 days", "x", "is a time, but this answer is a count"),
    ("14 gigs", "GB", "could not read 'gigs' as a unit: this answer is in GB"),
    ("5m", "s", "minutes or million"),
    ("fourteen", "GB", "could not read 'fourteen' as a number"),
    ("", "GB", "type a number first"),
    ("inf", "", "could not read 'inf' as a number"),
    ("nan", "", "could not read 'nan' as a number"),
    ("1e999", "", "too large to be a number"),
    ("9**9**9", "", "too large to be a number"),
    ("1/0", "", "divides by zero"),
    ("2^^3", "", "could not read '2^^3' as a number"),
    ("3.4.5", "", "could not read '3.4.5' as a number"),
    ("(-8)**0.5", "", "fractional power"),
    ("__import__('os')", "", "could not read"),
    ("2*x", "", "could not read"),
    ("1" * 300, "", "too long"),
])
def test_what_cannot_be_read_is_one_line(typed: str, unit: str, message: str) -> None:
    with pytest.raises(UserError) as error:
        read_number(typed, unit)
    assert message in str(error.value) and "\n" not in str(error.value)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=30), st.sampled_from(["", "GB", "GB/s", "TFLOP/s", "days", "%", "fraction", "B/param",
                                               "GPU-hours", "x", "billion", "tokens/s"]))
def test_anything_typed_is_a_reading_or_a_user_error(text: str, unit: str) -> None:
    try:
        assert math.isfinite(read_number(text, unit).value)
    except UserError as error:
        assert "\n" not in str(error)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_any_float_repr_reads_back_exactly(value: float) -> None:
    assert read_number(repr(value)).value == value and number_part(repr(value)) == value


def test_convert_and_same_kind() -> None:
    assert convert(60, "min", "s") == 3600.0 and convert(1.5, "days", "h") == 36.0
    assert convert(800, "MB/s", "GB/s") == pytest.approx(0.8)
    assert same_kind("min", "s") and same_kind("GiB", "GB") and not same_kind("GB", "s")
    with pytest.raises(UserError):
        convert(1, "s", "GB")


@pytest.mark.parametrize(("value", "text"), [(0.8, "0.8"), (60.876, "60.88"), (3e7, "30,000,000"), (1.116e23, "1.116e23"),
                                             (0.01171875, "0.01172"), (0, "0"), (-2.5, "-2.5")])
def test_shown_number(value: float, text: str) -> None:
    assert shown_number(value) == text


# ---- the reader behind each block -------------------------------------------------------------

def _quiz(answer: float, unit: str, tolerance: float = 0.03) -> Quiz:
    return Quiz("q", "?", "number", (), answer, None, tolerance, (), "", unit=unit)


@pytest.mark.parametrize(("answer", "unit", "typed"), [
    (0.82, "GB/s", "800 MB/s"),           # was graded as 800 GB/s: "9.9e+02x too high"
    (0.1, "TFLOP/s", "100 GFLOP/s"),
    (61.0, "days", "2 months"),
    (3.084e7, "GPU-hours", "30.84 million"),
    (16.0, "B/param", "16 B"),
    (32.0, "%", "32%"),
    (0.32, "fraction", "32%"),
    (1.116e23, "FLOP", "6*1.24e9*15e12"),
])
def test_a_quiz_grades_other_units_right_and_says_how_it_read_them(answer: float, unit: str, typed: str) -> None:
    verdict = grade(_quiz(answer, unit), typed)
    assert verdict.correct and verdict.valid, verdict.message
    assert verdict.read_as.startswith("read as ")


def test_a_quiz_in_percent_reads_a_bare_fraction_as_percent_and_says_so() -> None:
    verdict = grade(_quiz(32.0, "%"), "0.32")
    assert verdict.valid and not verdict.correct and verdict.read_as == "read as 0.32%"


def test_a_quiz_refuses_a_unit_of_another_kind_without_counting_it() -> None:
    verdict = grade(_quiz(0.8, "GB/s"), "5 s")
    assert not verdict.valid and not verdict.correct and "GB/s" in verdict.message


@pytest.mark.parametrize(("typed", "unit", "guess_unit", "value"), [
    ("800 MB/s", "GB/s", "", 0.8),
    ("100 GFLOP/s", "TFLOP/s", "", 0.1),
    ("2 months", "days", "", 2 * MONTH / DAY),
    ("30 million", "GPU-hours", "", 3e7),
    ("16 B", "B/param", "", 16.0),
    ("1 h", "s", "min", 3600.0),
])
def test_a_guess_uses_the_same_reader(typed: str, unit: str, guess_unit: str, value: float) -> None:
    assert read_guess(typed, unit, guess_unit) == pytest.approx(value)
    assert read_guess_as(typed, unit, guess_unit).note.startswith("read as ")


def test_a_guess_in_another_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="is a time, but this answer is a rate in bytes per second"):
        read_guess("5 s", "GB/s")


def test_calculator_fields_use_the_same_reader() -> None:
    from tutor.answers.fields import parse_memory_size, parse_whole
    from tutor.theory.units import parse_bytes, parse_count

    assert parse_count("15 trillion") == 15 * 10**12 and parse_count("2*7e9") == 14 * 10**9
    assert parse_count("7B") == 7 * 10**9  # B is billion in a count
    assert parse_bytes("16 B") == 16 and parse_bytes("2*40GB") == 80 * 10**9
    assert parse_memory_size("80") == 80 * 10**9 and parse_memory_size("2*40") == 80 * 10**9
    assert parse_memory_size("24GiB") == 24 * 2**30
    assert parse_whole("2*8", "batch") == 16 and parse_whole("1,024", "batch") == 1024
    for bad in ("5 GB", "3 s"):
        with pytest.raises(UserError, match="not a parameter count"):
            parse_count(bad)
    with pytest.raises(UserError, match="batch must be a whole number"):
        parse_whole("2.5", "batch")
