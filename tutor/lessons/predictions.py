"""A learner's prediction: the guess as typed, read in the predict block's unit, and how far it was.

The guess is read by the quiz grader's rules (tutor.lessons.grading.number_readings: units, powers,
k/M/B suffixes, percentages), so "20%", "1.84M", "2^-7" and "45 min" mean what they say:

- `unit` is the unit of the probe's metric ("s", "B", "x", "fraction" for a share from 0 to 1, "%"
  for a metric already in percent); a guess typed with another unit of the same kind is converted.
- `guess_unit` (optional) is the unit a bare number is read in when the question asks for another
  one than the metric reports ("every how many minutes" for a metric in seconds).
- A share ("fraction") reads "20%" and a bare "20" as 0.2: a share above 1 cannot be meant.
"""

from __future__ import annotations

import math

from tutor.lessons.grading import number_readings, unit_kind

SHARE_UNITS = ("fraction", "%")
"""Units of a share: judged by the difference in percentage points, not by a ratio."""

WELL_PREDICTED_FACTOR = 1.1
"""A guess within 10 % of the measured value (as a ratio) is "well predicted"."""
WELL_PREDICTED_POINTS = 3.0
"""A share within 3 percentage points is "well predicted"."""


def _plain_number(text: str) -> float | None:
    """The number a guess starts with when no unit reading applies: '4 ×' -> 4, '3.5 fast' -> 3.5."""
    cleaned = text.strip().replace(",", "").replace("×", "").replace("_", "")
    while cleaned and not (cleaned[-1].isdigit() or cleaned[-1] == "."):
        cleaned = cleaned[:-1].rstrip()
    try:
        return float(cleaned)
    except ValueError:
        return None


def read_guess(text: str, unit: str = "", guess_unit: str = "") -> float:
    """The guess as a value in `unit`; ValueError with a line for the learner when it is none."""
    typed = (text or "").strip()
    if not typed:
        raise ValueError("type your guess first, a number such as 3.5" + (f" ({guess_unit or unit})" if unit else ""))
    read_in = guess_unit or unit
    readings = number_readings(typed, "" if read_in in SHARE_UNITS else read_in)
    percent = typed.endswith("%")
    if readings:
        if percent:
            value = readings[0] if unit == "%" else readings[-1]
        else:
            value = readings[-1]  # the converted reading ("1.84M" -> 1.84e6) when a suffix converts
    else:
        plain = _plain_number(typed)
        if plain is None:
            raise ValueError(f"could not read {typed!r} as a number: type one such as 3.5, 20%, 1.8M or 2^-7")
        value = plain
    if not math.isfinite(value):
        raise ValueError(f"{typed!r} is not a finite number")
    if unit == "fraction" and not percent and 1 < value <= 100:
        value /= 100  # "20" for a share: 20 %
    if guess_unit and guess_unit != unit:
        (from_kind, from_size), (to_kind, to_size) = unit_kind(guess_unit), unit_kind(unit)
        if from_kind is not None and from_kind == to_kind:
            value = value * from_size / to_size
    return value


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
