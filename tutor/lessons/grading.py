"""Grading a learner's answer to a ```quiz block.

Numbers are read by tutor.theory.number_reader, the one reader of the predict blocks, the quizzes and
the calculators: "3.4e38", "3.39 × 10^38", "2^-24", "65,504", "8.03B", "50%", "1/3", "2*80", and with
a unit converted to the quiz's ("128 KiB" for a quiz in bytes is 131,072; "800 MB/s" for a quiz in
GB/s is 0.8; "0.32" for a quiz in % is 0.32%). A quiz's unit is its `unit`, else the one its question
asks for ("how many bytes", "how many GB", "in GiB"). An answer that cannot be read, or whose unit is
of another kind ("3 s" for a quiz in GB), is not valid: not an attempt, and the learner is told why in
one line. What a number was read as, when it was more than a plain number in the quiz's unit, comes
with the grade (`read_as`). A number is right within the quiz's relative tolerance. Choice answers
are the 0-based index of a choice (as text), its letter, or the choice's own text; text answers
ignore case, spacing and a final full stop.
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

# Unit words (lowercase) -> size in the kind's base unit, for the lint's reading of printed figures
# (tutor.lessons.lint.printed_figures) and a predict block's guess_unit check. Answers are read by
# tutor.theory.number_reader, which knows these and more (rates, FLOPs, weeks, months).
BYTE_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "pb": 10**15,
              "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "pib": 2**50}
TIME_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
              "min": 60.0, "minute": 60.0, "minutes": 60.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0,
              "day": 86400.0, "days": 86400.0}
COUNT_UNITS = {"k": 1e3, "thousand": 1e3, "m": 1e6, "million": 1e6, "b": 1e9, "bn": 1e9, "billion": 1e9, "g": 1e9,
               "t": 1e12, "trillion": 1e12}
_KINDS = (("bytes", BYTE_UNITS), ("time", TIME_UNITS), ("count", COUNT_UNITS))
_ASKED_UNIT = re.compile(r"\bhow many (?P<a>bytes|[KMGTP]i?B)\b|\bin (?P<b>bytes|[KMGTP]i?B)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Grade:
    """The verdict on one answer. `valid` is False when the answer could not be read at all
    (not a number, a unit of another kind, no such choice): the UI should ask again rather than count
    an attempt. `feedback` is the quiz's text for the choice picked (choice quizzes), else ""."""

    correct: bool
    message: str
    expected: str
    valid: bool = True
    feedback: str = ""
    read_as: str = ""
    """How a number answer was read when it was more than a plain number in the quiz's unit
    ("read as 0.8 GB/s"), for the learner to see; "" otherwise."""


def unit_kind(unit: str) -> tuple[str | None, float]:
    """(kind, size) of a unit word: "GiB" -> ("bytes", 2**30), "ms" -> ("time", 1e-3), "billion" ->
    ("count", 1e9); (None, 1.0) for a word that is no known unit ("x", "GPUs", "FLOP", "")."""
    word = unit.strip().lower()
    if word == "b":
        return "bytes", 1.0  # as a quiz's unit, B is bytes; in an answer it depends on the quiz
    for kind, table in _KINDS:
        if word in table:
            return kind, float(table[word])
    return None, 1.0


def quiz_unit(quiz: Quiz) -> str:
    """The unit a number quiz's answer is in: its `unit`, else the bytes unit its question asks for."""
    if quiz.unit:
        return quiz.unit
    asked = _ASKED_UNIT.search(quiz.question or "")
    return (asked.group("a") or asked.group("b")) if asked else ""


def number_readings(text: str, unit: str = "") -> tuple[float, ...]:
    """The value a typed number means in `unit` (a quiz's unit; "" for none), as a 1-tuple, or ()
    when it cannot be read there: tutor.theory.number_reader.read_number, the one reader.

    "8.03B" -> (8.03e9,); "50%" -> (0.5,); "128 KiB" in "bytes" -> (131072.0,); "14e9 bytes" in "GB" ->
    (14.0,); "800 MB/s" in "GB/s" -> (0.8,); "3 s" in "GB" -> () (another kind); "x" -> ().
    """
    from tutor.theory.number_reader import read_number

    if not isinstance(text, str):
        return ()
    try:
        return (read_number(text, unit).value,)
    except UserError:
        return ()


def parse_number(text: str) -> float | None:
    """The number a text starts with (its arithmetic, any unit after it ignored), None when it is not
    a number: a quiz's written answer, a figure of the prose."""
    from tutor.theory.number_reader import number_part

    if not isinstance(text, str):
        return None
    try:
        return number_part(text)
    except UserError:
        return None


def _normalise_text(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".!").strip()


def expected_answer(quiz: Quiz, *, device: DeviceFigures | Machine | None = None) -> str | float | int:
    """The reference answer: a float for number quizzes, the choice index for choice quizzes, the
    (first accepted) text for text quizzes. answer_expr is evaluated like a {{ }} value."""
    if quiz.answer_expr is not None:
        from tutor.lessons.learner import drawn_values
        from tutor.lessons.values import evaluate

        value = evaluate(quiz.answer_expr, device=device, draw=drawn_values(quiz))
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
    answer = quiz.answer
    if answer is None:  # the loader requires answer or answer_expr
        raise UserError(f"quiz {quiz.id}: no answer and no answer_expr")
    if quiz.kind == "number":
        if isinstance(answer, str):
            parsed = parse_number(answer)
            if parsed is None:
                raise UserError(f"quiz {quiz.id}: answer {answer!r} is not a number")
            return parsed
        if isinstance(answer, tuple):
            raise UserError(f"quiz {quiz.id}: answer {answer!r} is not a number")
        return float(answer)
    if isinstance(answer, tuple):  # a text quiz's accepted texts: the first is the reference
        return answer[0]
    return answer


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
    return f"{shown} {quiz_unit(quiz)}".strip()


def _grade_number(quiz: Quiz, answer: str, expected: float, shown: str) -> Grade:
    from tutor.theory.number_reader import read_number

    try:
        reading = read_number(answer, quiz_unit(quiz))
    except UserError as error:  # no number, or a unit of another kind: not an attempt
        return Grade(False, str(error), shown, valid=False)
    if abs(reading.value - expected) <= quiz.tolerance * abs(expected):
        return Grade(True, f"Correct: {shown}.", shown, read_as=reading.note)
    direction = "too high" if reading.value > expected else "too low"
    return Grade(False, f"Not quite: that is {direction}.", shown, read_as=reading.note)


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
    feedback = quiz.feedback[index] if index < len(quiz.feedback) else ""
    if index == expected:
        return Grade(True, f"Correct: {shown}.", shown, feedback=feedback)
    return Grade(False, f"Not quite. {feedback}".strip(), shown, feedback=feedback)


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
