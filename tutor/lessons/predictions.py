"""A learner's prediction: the guess as typed, read in the predict block's unit, and how far it was.

The guess is read by tutor.theory.number_reader.read_number, the one reader of the predict blocks,
the quizzes and the calculators (units, arithmetic, k/M/B suffixes, percentages), so "20%", "1.84M",
"2^-7", "45 min" and "800 MB/s" mean what they say:

- `unit` is the unit of the probe's metric ("s", "B", "GB/s", "x", "fraction" for a share from 0 to 1,
  "%" for a metric already in percent); a guess typed with another unit of the same kind is converted,
  one of another kind ("5 s" for GB/s) is refused with one line.
- `guess_unit` (optional) is the unit a bare number is read in when the question asks for another
  one than the metric reports ("every how many minutes" for a metric in seconds).
- A share ("fraction") reads "20%" and a bare "20" as 0.2: a share above 1 cannot be meant. A "%"
  metric reads a bare "0.32" as 0.32%, and says so.
"""

from __future__ import annotations

from tutor.lessons.grading import unit_kind  # noqa: F401  (re-exported: the guess_unit check's kinds)
from tutor.theory.number_reader import Reading, convert, read_number

SHARE_UNITS = ("fraction", "%")
"""Units of a share: judged by the difference in percentage points, not by a ratio."""

WELL_PREDICTED_FACTOR = 1.1
"""A guess within 10 % of the measured value (as a ratio) is "well predicted"."""
WELL_PREDICTED_POINTS = 3.0
"""A share within 3 percentage points is "well predicted"."""


def read_guess_as(text: str, unit: str = "", guess_unit: str = "") -> Reading:
    """The guess as a value in `unit` with what it was read as ("read as 0.8 GB/s", "" for a plain
    number in the unit asked for); ValueError with a line for the learner when it is none."""
    typed = (text or "").strip()
    if not typed:
        raise ValueError("type your guess first, a number such as 3.5" + (f" ({guess_unit or unit})" if unit else ""))
    read_in = guess_unit or unit
    reading = read_number(typed, read_in)
    if guess_unit and guess_unit != unit:
        return Reading(convert(reading.value, guess_unit, unit), unit, typed, reading.note)
    return reading


def read_guess(text: str, unit: str = "", guess_unit: str = "") -> float:
    """The guess as a value in `unit`; ValueError with a line for the learner when it is none."""
    return read_guess_as(text, unit, guess_unit).value


def _points(value: float, unit: str) -> float:
    return value * 100 if unit == "fraction" else value


def prediction_verdict(predicted: float, measured: float, unit: str = "") -> str:
    """How far the guess was: for a share, in percentage points; otherwise as a ratio (the right
    measure for quantities that span decades), or the difference when one of them is zero."""
    if unit in SHARE_UNITS:
        difference = _points(predicted, unit) - _points(measured, unit)
        if abs(difference) <= WELL_PREDICTED_POINTS:
            return f"within {abs(difference):.0f} percentage points: well predicted"
        return f"{abs(difference):.0f} percentage points too {'high' if difference > 0 else 'low'}"
    if measured == 0 or predicted == 0:
        if measured == predicted:
            return "exact"
        from tutor.formatting import format_quantity

        direction = "too high" if predicted > measured else "too low"
        return f"{format_quantity(abs(predicted - measured), unit)} {direction} (a ratio to zero means nothing)"
    ratio = predicted / measured
    if ratio <= 0:
        return "the sign was wrong"
    factor = max(ratio, 1 / ratio)
    if factor <= WELL_PREDICTED_FACTOR:
        return f"within {(factor - 1) * 100:.0f} %: well predicted"
    direction = "too high" if ratio > 1 else "too low"
    return f"{factor:.2g}x {direction}"
