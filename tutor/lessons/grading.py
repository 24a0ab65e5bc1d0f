"""Grading a learner's answer to a ```quiz block.

Numbers are read the way people type them: "3.4e38", "3.39 × 10^38", "3.39*10**38", "65,504",
"140 GB" (a trailing unit is ignored), "8.03B" (also read as 8.03e9), "50%" (also read as 0.5),
"1/3". A number is right within the quiz's relative tolerance. Choice answers are the 0-based
index of a choice (as text) or the choice's own text; text answers ignore case, spacing and a
final full stop.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tutor.errors import UserError
from tutor.lessons.model import Quiz

if TYPE_CHECKING:
    from tutor.hardware.machine import Machine
    from tutor.lessons.values import DeviceFigures

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_SCIENTIFIC = re.compile(rf"(?P<base>{_NUMBER})\s*(?:[x*·]\s*10\s*(?:\^|\*\*)\s*(?P<power>[+-]?\d+))?\s*(?P<unit>.*)")
_RATIO = re.compile(rf"(?P<top>{_NUMBER})\s*/\s*(?P<bottom>{_NUMBER})")
_UNIT = re.compile(r"[a-zµ%][\w/%µ.\- ]*")
_SUFFIX_MULTIPLIERS = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


@dataclass(frozen=True)
class Grade:
    """The verdict on one answer. `valid` is False when the answer could not be read at all
    (not a number, no such choice): the UI should ask again rather than count an attempt."""

    correct: bool
    message: str
    expected: str
    valid: bool = True


def _normalise_number_text(text: str) -> str:
    text = text.strip().lower()
    for old, new in (("−", "-"), ("–", "-"), ("×", "x"), ("\u2009", ""), ("\u202f", ""), ("_", "")):
        text = text.replace(old, new)
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)


def number_readings(text: str) -> tuple[float, ...]:
    """Every value a typed number may mean: "8.03B" -> (8.03, 8.03e9); "50%" -> (50.0, 0.5); "x" -> ()."""
    if not isinstance(text, str):
        return ()
    cleaned = _normalise_number_text(text)
    ratio = _RATIO.fullmatch(cleaned)
    if ratio is not None:
        bottom = float(ratio.group("bottom"))
        return (float(ratio.group("top")) / bottom,) if bottom else ()
    match = _SCIENTIFIC.fullmatch(cleaned)
    if match is None:
        return ()
    unit = match.group("unit").strip()
    if unit and not _UNIT.fullmatch(unit):
        return ()
    try:
        value = float(match.group("base"))
        if match.group("power") is not None:
            value *= 10.0 ** int(match.group("power"))
    except OverflowError:
        return ()
    if not math.isfinite(value):
        return ()
    readings = [value]
    if unit in _SUFFIX_MULTIPLIERS:
        readings.append(value * _SUFFIX_MULTIPLIERS[unit])
    if unit == "%":
        readings.append(value / 100)
    return tuple(readings)


def parse_number(text: str) -> float | None:
    """The plain reading of a typed number (units ignored), None when it is not a number."""
    readings = number_readings(text)
    return readings[0] if readings else None


def _normalise_text(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".!").strip()


def expected_answer(quiz: Quiz, *, device: DeviceFigures | Machine | None = None) -> str | float | int:
    """The reference answer: a float for number quizzes, the choice index for choice quizzes, the
    (first accepted) text for text quizzes. answer_expr is evaluated like a {{ }} value."""
    if quiz.answer_expr is not None:
        from tutor.lessons.values import evaluate

        value = evaluate(quiz.answer_expr, device=device)
        if quiz.kind == "number":
            try:
                number = float(value)
            except (TypeError, ValueError, OverflowError):
                raise UserError(f"quiz {quiz.id}: answer_expr gave {value!r}, not a number") from None
            if not math.isfinite(number):
                raise UserError(f"quiz {quiz.id}: answer_expr gave {number}, not a finite number")
            return number
        if quiz.kind == "text":
            if not isinstance(value, str) or not value.strip():
                raise UserError(f"quiz {quiz.id}: answer_expr gave {value!r}, not text")
            return value
        raise UserError(f"quiz {quiz.id}: a choice quiz takes answer = <index>, not answer_expr")
    if quiz.kind == "number":
        if isinstance(quiz.answer, str):
            number = parse_number(quiz.answer)
            if number is None:
                raise UserError(f"quiz {quiz.id}: answer {quiz.answer!r} is not a number")
            return number
        return float(quiz.answer)  # type: ignore[arg-type]
    if quiz.kind == "text" and isinstance(quiz.answer, tuple):
        return quiz.answer[0]
    return quiz.answer  # type: ignore[return-value]


def format_expected(quiz: Quiz, value: str | float) -> str:
    """The reference answer as the learner should read it: "65,504", "3.390e38 x", the choice text."""
    if quiz.kind == "choice":
        return quiz.choices[int(value)]
    if quiz.kind == "text":
        return str(value)
    from tutor.lessons.values import num

    number = float(value)
    if number.is_integer() and abs(number) < 1e15:
        shown = f"{int(number):,}"
    else:
        shown = num(number, 4)
    return f"{shown} {quiz.unit}".strip()


def _grade_number(quiz: Quiz, answer: str, expected: float, shown: str) -> Grade:
    readings = number_readings(answer)
    if not readings:
        return Grade(False, "Type a number, such as 3.4e38, 65504 or 140 GB (units are ignored).", shown, valid=False)
    allowed = quiz.tolerance * abs(expected)
    if any(abs(reading - expected) <= allowed for reading in readings):
        return Grade(True, f"Correct: {shown}.", shown)
    closest = min(readings, key=lambda reading: abs(reading - expected))
    direction = "too high" if closest > expected else "too low"
    return Grade(False, f"Not quite: that is {direction}.", shown)


def _grade_choice(quiz: Quiz, answer: str, expected: int, shown: str) -> Grade:
    text = answer.strip()
    index: int | None = None
    if re.fullmatch(r"\d+", text) and int(text) < len(quiz.choices):
        index = int(text)
    else:
        wanted = _normalise_text(text)
        matches = [i for i, choice in enumerate(quiz.choices) if _normalise_text(choice) == wanted]
        if matches:
            index = matches[0]
        elif len(text) == 1 and text.isalpha() and ord(text.lower()) - ord("a") < len(quiz.choices):
            index = ord(text.lower()) - ord("a")
    if index is None:
        return Grade(False, f"Pick one of the {len(quiz.choices)} choices.", shown, valid=False)
    if index == expected:
        return Grade(True, f"Correct: {shown}.", shown)
    return Grade(False, "Not quite.", shown)


def _grade_text(quiz: Quiz, answer: str, expected: str, shown: str) -> Grade:
    if not answer.strip():
        return Grade(False, "Type an answer.", shown, valid=False)
    accepted = quiz.answer if isinstance(quiz.answer, tuple) else (expected,)
    if _normalise_text(answer) in {_normalise_text(text) for text in accepted}:
        return Grade(True, f"Correct: {shown}.", shown)
    return Grade(False, "Not quite.", shown)


def grade(quiz: Quiz, answer: str, *, device: DeviceFigures | Machine | None = None) -> Grade:
    """Grade one answer to `quiz`. Never raises for what a learner types; a broken quiz raises UserError."""
    expected = expected_answer(quiz, device=device)
    shown = format_expected(quiz, expected)
    answer = "" if answer is None else str(answer)
    if quiz.kind == "number":
        return _grade_number(quiz, answer, float(expected), shown)
    if quiz.kind == "choice":
        return _grade_choice(quiz, answer, int(expected), shown)
    return _grade_text(quiz, answer, str(expected), shown)
