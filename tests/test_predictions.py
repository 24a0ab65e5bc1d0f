"""A guess read as the learner meant it: percentages, suffixes, the unit the question asks
in; and a verdict that fits the quantity (percentage points for a share, no ratio to zero)."""

from __future__ import annotations

import pytest

from tutor.lessons.predictions import prediction_verdict, read_guess


@pytest.mark.parametrize(("typed", "unit", "guess_unit", "value"), [
    ("20%", "fraction", "", 0.2),        # the pipeline predict's "(e.g. 15%)"
    ("20", "fraction", "", 0.2),         # a share above 1 cannot be meant: 20 %
    ("0.2", "fraction", "", 0.2),
    ("20%", "%", "", 20.0),
    ("20%", "", "", 0.2),
    ("1.84M", "", "", 1.84e6),           # was read as 1.84
    ("8.03B", "", "", 8.03e9),
    ("60", "s", "min", 3600.0),          # "every how many minutes", graded in seconds
    ("45 min", "s", "min", 2700.0),
    ("90 s", "s", "min", 90.0),
    ("128 KiB", "B", "", 131072.0),
    ("2^-7", "", "", 2 ** -7),
    ("3.5x", "x", "", 3.5),
    ("1,200 GB/s", "GB/s", "", 1200.0),
    ("4 ×", "", "", 4.0),
])
def test_a_guess_is_read_as_meant(typed: str, unit: str, guess_unit: str, value: float) -> None:
    assert read_guess(typed, unit, guess_unit) == pytest.approx(value)


@pytest.mark.parametrize("typed", ["", "   ", "fast", "inf", "nan"])
def test_a_guess_that_is_no_number_says_so(typed: str) -> None:
    with pytest.raises(ValueError) as error:
        read_guess(typed, "x")
    assert "''" not in str(error.value)  # never "'' is not a number"


def test_an_empty_guess_asks_for_one() -> None:
    with pytest.raises(ValueError, match="type your guess first"):
        read_guess("", "s", "min")


def test_a_share_is_judged_in_percentage_points() -> None:
    assert prediction_verdict(0.2, 0.18, "fraction") == "within 2 percentage points: well predicted"
    assert prediction_verdict(0.5, 0.0, "fraction") == "50 percentage points too high"
    assert prediction_verdict(10.0, 35.0, "%") == "25 percentage points too low"


def test_a_zero_is_a_difference_not_a_ratio() -> None:
    verdict = prediction_verdict(5.0, 0.0, "ms")
    assert verdict.startswith("5 ms too high") and "no ratio" not in verdict
    assert prediction_verdict(0.0, 0.0, "x") == "exact"


def test_other_quantities_are_judged_by_ratio() -> None:
    assert prediction_verdict(2.0, 1.0, "x") == "2x too high"
    assert prediction_verdict(1.0, 4.0, "s") == "4x too low"
    assert prediction_verdict(1.05, 1.0).startswith("within 5 %")
