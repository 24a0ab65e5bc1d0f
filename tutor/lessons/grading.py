"""Grading a learner's answer to a ```quiz block.

Numbers are read the way people type them: "3.4e38", "3.39 × 10^38", "3.39*10**38", "2^-24", "2**-7",
"1.5 × 2^-7", "65,504", "8.03B" (also read as 8.03e9), "50%" (also read as 0.5), "1/3", and with a
unit: an answer in another unit of the quiz's unit's kind is converted to it ("128 KiB" for a quiz in
bytes is 131,072; "14e9 bytes" for a quiz in GB is 14). A quiz's unit is its `unit`, else the one its
question asks for ("how many bytes", "how many GB", "in GiB"). An answer that cannot be read, or
whose unit is of another kind ("3 s" for a quiz in GB), is not valid: not an attempt. A number is
right within the quiz's relative tolerance. Choice answers are the 0-based index of a choice (as
text), its letter, or the choice's own text; text answers ignore case, spacing and a final full stop.
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

_UNSIGNED = r"(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?"
_NUMBER = rf"[+-]?{_UNSIGNED}"
_POWER = r"(?P<base>\d+(?:\.\d+)?)\s*(?:\^|\*\*)\s*\(?\s*(?P<power>[+-]?\d+(?:\.\d+)?)\s*\)?"
_BARE_POWER = _POWER.replace("<base>", "<base2>").replace("<power>", "<power2>")
# "2^-24" before "2": a bare power is tried first, else "2" would leave "^-24" as its unit.
_VALUE = re.compile(rf"(?P<sign>[+-])?\s*(?:{_BARE_POWER}|(?P<mantissa>{_UNSIGNED})(?:\s*[x*]\s*{_POWER})?)"
                    r"\s*(?P<unit>.*)")
_RATIO = re.compile(rf"(?P<top>{_NUMBER})\s*/\s*(?P<bottom>{_NUMBER})")
_UNIT = re.compile(r"[a-zµ%][\w/%µ.\- ]*")

# Unit words (lowercase) -> size in the kind's base unit. "b" is bytes in a quiz about bytes, else billion.
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
    (not a number, no such choice): the UI should ask again rather than count an attempt.
    `feedback` is the quiz's text for the choice picked (choice quizzes), else ""."""

    correct: bool
    message: str
    expected: str
    valid: bool = True
    feedback: str = ""


_SUPERSCRIPT_DIGITS = str.maketrans("⁻⁺⁰¹²³⁴⁵⁶⁷⁸⁹", "-+0123456789")
_SUPERSCRIPT_POWER = re.compile(r"[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+")


def _normalise_number_text(text: str) -> str:
    # "5.96 × 10⁻⁸" as tutor.formatting writes it reads as 5.96 x 10^-8
    text = _SUPERSCRIPT_POWER.sub(lambda m: "^" + m.group().translate(_SUPERSCRIPT_DIGITS), text.strip()).lower()
    for old, new in (("−", "-"), ("–", "-"), ("×", "x"), ("\u2009", ""), ("\u202f", ""), ("_", ""), ("·", "*")):
        text = text.replace(old, new)
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)


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


def _split_value(cleaned: str) -> tuple[float, str] | None:
    """(value, unit text) of a normalised answer, None when it is no number."""
    ratio = _RATIO.fullmatch(cleaned)
    if ratio is not None:
        bottom = float(ratio.group("bottom"))
        return (float(ratio.group("top")) / bottom, "") if bottom else None
    match = _VALUE.fullmatch(cleaned)
    if match is None:
        return None
    unit = match.group("unit").strip()
    if unit and not _UNIT.fullmatch(unit):
        return None
    try:
        if match.group("mantissa") is not None:
            value = float(match.group("mantissa"))
            base, power = match.group("base"), match.group("power")
            if base is not None and float(base) == 10 and float(power).is_integer():
                value = float(f"{match.group('mantissa')}e{int(float(power))}")  # 10.0**-324 would underflow
            elif base is not None:
                value *= float(base) ** float(power)
        else:
            value = float(match.group("base2")) ** float(match.group("power2"))
    except (OverflowError, ZeroDivisionError):
        return None
    if match.group("sign") == "-":
        value = -value
    if not math.isfinite(value):
        return None
    return value, unit


def number_readings(text: str, unit: str = "") -> tuple[float, ...]:
    """Every value a typed number may mean in `unit` (a quiz's unit; "" for none).

    "8.03B" -> (8.03, 8.03e9); "50%" -> (50.0, 0.5); "128 KiB" in "bytes" -> (131072.0,);
    "14e9 bytes" in "GB" -> (14.0,); "3 s" in "GB" -> () (another kind); "x" -> ().
    """
    if not isinstance(text, str):
        return ()
    split = _split_value(_normalise_number_text(text))
    if split is None:
        return ()
    value, typed = split
    word = typed.lower()
    wanted_kind, wanted_size = unit_kind(unit)
    if not word or word == unit.strip().lower():
        return (value,)
    if word == "%":
        return (value, value / 100)
    if wanted_kind in ("bytes", "time"):
        table = BYTE_UNITS if wanted_kind == "bytes" else TIME_UNITS
        if word in table:
            return (value * table[word] / wanted_size,)
        if word in BYTE_UNITS or word in TIME_UNITS:
            return ()  # a size for a time, or a time for a size
        if word in COUNT_UNITS:
            return (value * COUNT_UNITS[word] / wanted_size,)
        return (value,)
    if word in COUNT_UNITS:
        scale = wanted_size if wanted_kind == "count" else 1.0
        return tuple(dict.fromkeys((value, value * COUNT_UNITS[word] / scale)))
    if word in BYTE_UNITS:
        return tuple(dict.fromkeys((value, value * BYTE_UNITS[word])))
    if word in TIME_UNITS:
        return tuple(dict.fromkeys((value, value * TIME_UNITS[word])))
    return (value,)


def parse_number(text: str) -> float | None:
    """The plain reading of a typed number (units ignored), None when it is not a number."""
    split = _split_value(_normalise_number_text(text)) if isinstance(text, str) else None
    return None if split is None else split[0]


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


NOT_A_NUMBER = "could not read that as a number: type one such as 3.4e38, 2^-24, 65,504 or 128 KiB"


def _grade_number(quiz: Quiz, answer: str, expected: float, shown: str) -> Grade:
    unit = quiz_unit(quiz)
    readings = number_readings(answer, unit)
    if not readings:
        split = _split_value(_normalise_number_text(answer))
        if split is not None and unit:
            return Grade(False, f"could not read {split[1]!r} as {unit}: the answer is in {unit}", shown,
                         valid=False)
        return Grade(False, NOT_A_NUMBER, shown, valid=False)
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
