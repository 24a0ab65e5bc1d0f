"""The one reader of numbers a learner types: predict guesses, number quizzes, calculator fields.

`read_number(text, unit)` returns the value in `unit` (the block's unit) and says how it read it
("read as 0.8 GB/s"), or raises UserError with one line. The rules:

- **Plain numbers are in the block's unit**, as before: `14` in a GB block is 14 GB.
- **Arithmetic**: numbers with + - * / ** ^ and parentheses (`6*1.24e9*15e12`, `2*80`, `1e3/8`), also as
  formatting writes them (`3.39 × 10³⁸`, `1.5 × 2^-7`) and with thousands separators (`65,504`). Parsed
  with `ast`, only numbers and those operators allowed; never eval.
- **Units convert to the block's unit**; a unit of another dimension is refused with one line
  ("'5 s' is a time; this answer is in GB/s"). Bytes are SI or binary as written, as everywhere in
  the project (tutor.theory.units: GB = 1e9 bytes, GiB = 2**30 bytes; `b` and `B` both mean bytes,
  bits only as `bit`, `Gbit`...). Rates are a unit over a time (`MB/s`, `GFLOP/s`; `TFLOPS` is read as
  TFLOP/s where the block is a rate, as a FLOP count where it counts FLOPs). A unit typed without the
  block's "per" part takes it: `800 MB` in a GB/s block is 800 MB/s, `16 B` in a B/param block is 16
  bytes per parameter. Times: ns, us (µs), ms, s, min, h, days, weeks, months (30.44 days), years
  (365.25 days); `<word>-hours` (GPU-hours) is a time of that many hours. `m` alone is refused in a
  time block (minutes or million?).
- **Counts**: thousand/million/billion/trillion, k/M/B/T. They multiply the number, the unit stays the
  block's: `30 million` in a GPU-hours block is 3e7 GPU-hours, `12.9B` in a `billion` block is 12.9.
  In a block of bytes or FLOPs a lone letter is that unit's SI prefix as parse_bytes reads it
  (`800M` in a GB/s block is 800 MB/s), and **`B` is bytes where the block counts bytes** (its unit
  is bytes: B, GB, B/param, GB/s...), **billion everywhere else** (`8.03B` parameters).
- **Percent against fraction**: in a `%` block a bare number is percent (`0.32` is 0.32%, said as
  "read as 0.32%"), `32%` is 32. In a `fraction` block `32%` is 0.32, a bare number above 1 and up to
  100 is a percent (`20` is 0.2: a share above 1 cannot be meant), one from 0 to 1 is the fraction.
  Elsewhere `50%` is 0.5.
- A block without a unit converts counts (`1.84M`) and percentages (`50%` is 0.5); a unit with a
  dimension (`1,200 GB/s`) has nothing to convert to and is taken as written (1200), and said so.
  A word that is no unit (`76 GPUs`, `3.5x`) is taken as what is counted where the block counts
  things or has no unit, and refused where the block has a unit such as GB or s.
"""

from __future__ import annotations

import ast
import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass

from tutor.errors import UserError
from tutor.safe_text import plain

DAY = 86400.0
MONTH = 30.44 * DAY
"""A month is the mean Gregorian month: 365.25 / 12 = 30.44 days."""
YEAR = 365.25 * DAY

BYTES, FLOP, TIME, SHARE, COUNT = "bytes", "flop", "time", "share", "count"

_BYTE_UNITS = {
    "b": 1, "byte": 1, "bytes": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "pb": 1e15,
    "kib": 2.0**10, "mib": 2.0**20, "gib": 2.0**30, "tib": 2.0**40, "pib": 2.0**50,
    "bit": 1 / 8, "bits": 1 / 8, "kbit": 1e3 / 8, "mbit": 1e6 / 8, "gbit": 1e9 / 8, "tbit": 1e12 / 8,
}
_SI_PREFIX = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "p": 1e15, "e": 1e18, "z": 1e21}
_FLOP_UNITS = {prefix + word: size for prefix, size in _SI_PREFIX.items() for word in ("flop", "flops")}
_TIME_UNITS = {
    "ns": 1e-9, "nanosecond": 1e-9, "nanoseconds": 1e-9,
    "us": 1e-6, "microsecond": 1e-6, "microseconds": 1e-6,
    "ms": 1e-3, "millisecond": 1e-3, "milliseconds": 1e-3,
    "s": 1.0, "sec": 1.0, "secs": 1.0, "second": 1.0, "seconds": 1.0,
    "min": 60.0, "mins": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hrs": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": DAY, "day": DAY, "days": DAY, "wk": 7 * DAY, "week": 7 * DAY, "weeks": 7 * DAY,
    "month": MONTH, "months": MONTH, "yr": YEAR, "yrs": YEAR, "year": YEAR, "years": YEAR,
}
_COUNT_WORDS = {"thousand": 1e3, "million": 1e6, "mn": 1e6, "billion": 1e9, "bn": 1e9, "trillion": 1e12,
                "tn": 1e12}
_COUNT_LETTERS = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}
_SHARE_UNITS = {"%": 0.01, "percent": 0.01, "pct": 0.01, "fraction": 1.0}
_RATIO_WORDS = ("x", "times")
_PER_SYNONYMS = {"parameter": "param", "params": "param", "parameters": "param", "tokens": "token"}


@dataclass(frozen=True)
class Unit:
    """A unit as dimension and size: `dimension` is BYTES, FLOP, TIME, SHARE or COUNT (a count of
    `label`s, "" for a bare count), `scale` its size in the dimension's base (bytes, FLOP, seconds, a
    fraction, ones), `per` what it is per ("" none, TIME, or a word such as "param") with `per_scale`
    the size of that time."""

    dimension: str
    scale: float = 1.0
    per: str = ""
    per_scale: float = 1.0
    label: str = ""

    def describe(self) -> str:
        """A few words for a message: 'a time', 'a rate in bytes per second', 'a count'."""
        names = {BYTES: "size in bytes", FLOP: "number of FLOPs", TIME: "time", SHARE: "percentage",
                 COUNT: "count"}
        if self.per == TIME:
            what = {BYTES: "rate in bytes per second", FLOP: "FLOP rate"}.get(self.dimension,
                                                                           f"{names[self.dimension]} per time")
        elif self.per:
            what = f"{names[self.dimension]} per {self.per}"
        else:
            what = names[self.dimension]
        return f"{'an' if what[0] in 'aeiou' else 'a'} {what}"


@dataclass(frozen=True)
class Reading:
    """What a typed number was read as: `value` in `unit` (the block's), and `note`, the line to echo
    ("read as 0.8 GB/s"), "" when the text was a plain number in the block's unit."""

    value: float
    unit: str
    typed: str
    note: str = ""


def shown_number(value: float) -> str:
    """A value for a "read as" line: 4 significant digits, thousands separators, powers of ten only
    beyond what that holds ('0.8', '60.88', '30,000,000', '1.116e+23')."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    magnitude = math.floor(math.log10(abs(value)))
    if not -4 <= magnitude < 15:
        mantissa, _, power = f"{value:.4g}".partition("e")
        return f"{mantissa}e{int(power)}"
    digits = max(0, 3 - magnitude)
    text = f"{value:,.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _with_unit(value: float, unit: str) -> str:
    number = shown_number(value)
    if not unit:
        return number
    if unit in ("%", "x"):
        return f"{number}{unit}"
    if unit == "fraction":
        return f"{number} ({shown_number(value * 100)}%)"
    return f"{number} {unit}"


# ---- arithmetic ---------------------------------------------------------------------------------

_SUPERSCRIPTS = str.maketrans("⁻⁺⁰¹²³⁴⁵⁶⁷⁸⁹", "-+0123456789")
_SUPERSCRIPT_POWER = re.compile(r"[⁻⁺]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+")
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
# "3.39 × 10^38" and "10^-324" become 3.39e38 and 1e-324: 10.0**-324 underflows to zero.
_TIMES_TEN = re.compile(rf"(?<![\w.])({_NUMBER})\s*(?:\*|x|×|·)\s*10\s*(?:\^|\*\*)\s*\(?\s*([+-]?\d+)\s*\)?(?![\d.])")
_TEN_TO = re.compile(r"(?<![\w.])10\s*(?:\^|\*\*)\s*\(?\s*([+-]?\d+)\s*\)?(?![\d.])")
_TOKEN = re.compile(rf"\s+|{_NUMBER}|\*\*|[-+*/()^]")
_OPERATORS: dict[type, Callable[..., float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos,
}
_MAX_TEXT = 200
NOT_A_NUMBER = "type one such as 3.5, 2^-7, 65,504, 1.8M or 800 MB/s"


def _shown(typed: str) -> str:
    """What the learner typed as one short line for a message: no controls or line breaks, at most 40 characters."""
    printable = " ".join("".join(ch if ch.isprintable() else " " for ch in typed).split())
    return printable if len(printable) <= 40 else printable[:39] + "…"


def not_a_number(typed: str) -> UserError:
    """The one line for a text with no number in it, naming what was typed so the learner sees it."""
    return UserError(f"could not read '{_shown(typed)}' as a number: {NOT_A_NUMBER}")


def _normalise(text: str) -> str:
    text = _SUPERSCRIPT_POWER.sub(lambda m: "^" + m.group().translate(_SUPERSCRIPTS), text.strip())
    for old, new in (("−", "-"), ("–", "-"), ("\u2009", ""), ("\u202f", ""), ("_", ""), ("μ", "u"), ("µ", "u")):
        text = text.replace(old, new)
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
    text = _TIMES_TEN.sub(lambda m: f"{m.group(1)}e{int(m.group(2))}", text)
    return _TEN_TO.sub(lambda m: f"1e{int(m.group(1))}", text)


def _split(text: str) -> tuple[str, str]:
    """(arithmetic, unit text): the longest start made of numbers, operators and spaces; a multiplication
    sign (x, ×, ·) counts as one only between a number and a number or a parenthesis."""
    position, previous = 0, ""
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None and text[position] in "x×·" and previous and (previous[-1].isdigit() or previous[-1] in ")."):
            after = text[position + 1:].lstrip()
            if after[:1].isdigit() or after[:1] in ("(", "."):
                position += 1
                previous = "*"
                continue
        if match is None:
            break
        if match.group().strip():
            previous = match.group()
        position = match.end()
    expression = re.sub(r"(?<=[\d.)])\s*[x×·]\s*(?=[\d.(])", "*", text[:position]).replace("^", "**")
    return expression.strip(), text[position:].strip()


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return float(_OPERATORS[type(node.op)](_evaluate(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 10_000:
            raise OverflowError
        result = _OPERATORS[type(node.op)](left, right)
        if isinstance(result, complex):
            raise ValueError("a negative number to a fractional power")
        return float(result)
    raise ValueError("only numbers and + - * / ** ^ ( ) are read")


def evaluate_arithmetic(expression: str, shown: str = "") -> float:
    """The value of numbers joined by + - * / ** and parentheses; UserError (one line) otherwise,
    naming `shown` (what the learner typed) or else the expression."""
    if not expression:
        raise UserError("no number")
    said = f"'{_shown(shown or expression)}'"
    try:
        tree = ast.parse(expression, mode="eval")
        value = _evaluate(tree)
    except ZeroDivisionError:
        raise UserError(f"{said} divides by zero") from None
    except (OverflowError, RecursionError):
        raise UserError(f"{said} is too large to be a number") from None
    except (SyntaxError, ValueError) as error:
        why = str(error) if isinstance(error, ValueError) and str(error) else "type a number such as 3.5 or 2^-7"
        raise UserError(f"could not read {said} as a number: {why}") from None
    if not math.isfinite(value):
        raise UserError(f"{said} is too large to be a number")
    return value


# ---- units --------------------------------------------------------------------------------------

def _per(word: str) -> tuple[str, float]:
    word = word.strip()
    if word in _TIME_UNITS:
        return TIME, _TIME_UNITS[word]
    word = _PER_SYNONYMS.get(word, word)
    return (word[:-1] if word.endswith("s") and len(word) > 3 else word), 1.0


def _numerator(word: str, *, bytes_block: bool) -> Unit | None:
    """The unit a word names (lowercase), None for a word that is no unit."""
    if word == "b" and not bytes_block:
        return Unit(COUNT, 1e9)
    if word in _BYTE_UNITS:
        return Unit(BYTES, float(_BYTE_UNITS[word]))
    if word in _FLOP_UNITS:
        return Unit(FLOP, _FLOP_UNITS[word])
    if word in _TIME_UNITS:
        return Unit(TIME, _TIME_UNITS[word])
    timed = re.fullmatch(r"([\w.]+)-(\w+)", word)
    if timed and timed.group(2) in _TIME_UNITS:  # GPU-hours: a time, counted in hours of one device
        return Unit(TIME, _TIME_UNITS[timed.group(2)], label=timed.group(1))
    if word in _SHARE_UNITS:
        return Unit(SHARE, _SHARE_UNITS[word])
    if word in _COUNT_WORDS:
        return Unit(COUNT, _COUNT_WORDS[word])
    if word in _RATIO_WORDS or word == "×":
        return Unit(COUNT, label="x")
    return None


def parse_unit(unit: str) -> Unit | None:
    """A block's unit ('GB/s', 'TFLOP/s', 'B/param', 'days', '%', 'GPU-hours', 'tokens'); None for no
    unit. A word that is no known unit is a count of that word ('tokens', 'GPUs', 'x')."""
    text = _normalise(unit).lower()
    if not text:
        return None
    top, slash, bottom = text.partition("/")
    if not slash and " per " in text:
        top, _, bottom = text.partition(" per ")
    top = top.strip()
    found = _numerator(top, bytes_block=True)
    if found is None and top in _COUNT_LETTERS:
        found = Unit(COUNT, _COUNT_LETTERS[top])
    if found is None:
        found = Unit(COUNT, label=top)
    if bottom.strip():
        per, per_scale = _per(bottom)
        found = Unit(found.dimension, found.scale, per, per_scale, found.label)
    return found


def _typed_unit(text: str, block: Unit | None, block_text: str) -> tuple[float, Unit]:
    """(count multiplier, unit) of the unit text typed after a number; UserError for what is no unit."""
    words = text.lower()
    multiplier = 1.0
    first, _, rest = words.partition(" ")
    physical = block is not None and block.dimension in (BYTES, FLOP)
    if rest.strip() and not rest.startswith("per ") and (first in _COUNT_WORDS or first in _COUNT_LETTERS):
        multiplier = _COUNT_WORDS.get(first) or _COUNT_LETTERS[first]
        if physical and first in _COUNT_LETTERS and first != "b":
            multiplier = _SI_PREFIX.get(first, multiplier)
        words = rest.strip()
    top, slash, bottom = words.partition("/")
    if not slash and " per " in words:
        top, _, bottom = words.partition(" per ")
    top = top.strip()
    bytes_block = block is not None and block.dimension == BYTES
    unit: Unit | None = _numerator(top, bytes_block=bytes_block) if top else Unit(COUNT)
    if unit is None and top in _COUNT_LETTERS:
        if block is not None and block.dimension == TIME and not block.label and "m" in text.split("/")[0]:
            raise UserError(f"'{text}' is minutes or million here: type min for minutes, M or million for a count")
        if physical and top != "b":  # parse_bytes' "80 G": the block's unit with that SI prefix
            unit = Unit(block.dimension if block else COUNT, _SI_PREFIX[top])
        else:
            unit = Unit(COUNT, _COUNT_LETTERS[top])
    if unit is None:
        if block is not None and block.dimension != COUNT:
            raise UserError(f"could not read '{text}' as a unit: this answer is in {block_text}")
        unit = Unit(COUNT, label=top)
    if bottom.strip():
        per, per_scale = _per(bottom)
        unit = Unit(unit.dimension, unit.scale, per, per_scale, unit.label)
    return multiplier, unit


def _wrong(typed: str, unit: Unit, block: Unit, block_text: str) -> UserError:
    return UserError(f"'{typed}' is {unit.describe()}, but this answer is {block.describe()}: "
                     f"type it in {block_text} or a unit of the same kind")


def _convert(number: float, typed: str, unit: Unit, block: Unit, block_text: str) -> float:
    """`number` of `unit` in `block`'s unit; UserError when the two measure different things."""
    if unit.dimension == COUNT:
        if unit.per and unit.per != block.per:
            raise _wrong(typed, unit, block, block_text)
        if block.dimension == COUNT:
            value = number * unit.scale / block.scale
        else:
            value = number * unit.scale  # "30 million" GPU-hours: the count multiplies the block's unit
        if unit.per == TIME and block.per == TIME:
            value *= block.per_scale / unit.per_scale
        return value
    if unit.dimension == SHARE and block.dimension == COUNT and not block.per:
        return number * unit.scale  # "150%" where the block counts times: 1.5
    if unit.dimension != block.dimension:
        raise _wrong(typed, unit, block, block_text)
    value = number * unit.scale / block.scale
    if unit.per:
        if unit.per != block.per:
            raise _wrong(typed, unit, block, block_text)
        value *= block.per_scale / unit.per_scale
    return value


def read_number(text: str, unit: str = "") -> Reading:
    """`text` as a value in `unit` (the block's unit; "" for none), see the module's rules.
    UserError with one line for what cannot be read: the typed text it quotes has its newlines and other
    control characters written as escapes (a paste may hold them)."""
    try:
        return _read_number(text, unit)
    except UserError as error:
        message = str(error)
        if message.isprintable():
            raise
        raise UserError(plain(message)) from None


def _read_number(text: str, unit: str) -> Reading:
    typed = (text or "").strip()
    if not typed:
        raise UserError("type a number first")
    if len(typed) > _MAX_TEXT:
        raise UserError("that is too long to be a number")
    expression, unit_text = _split(_normalise(typed))
    if not expression or not re.search(r"\d", expression):
        raise not_a_number(typed)
    number = evaluate_arithmetic(expression, typed)
    arithmetic = bool(re.search(r"(?<=[\d.)\s])[-+*/]|\*\*|\(", expression.lstrip("+-")))
    block = parse_unit(unit)
    shown_unit = unit.strip()
    note_always = False
    unconverted = ""
    if not unit_text:
        value = number
        if block is not None and block.dimension == SHARE:
            note_always = True
            if block.scale == 1.0 and 1 < value <= 100:
                value /= 100  # "20" for a share: 20 %; a share above 1 cannot be meant
    elif block is None:  # no unit: counts and percentages convert, a unit with a dimension has nothing to convert to
        multiplier, typed_unit = _typed_unit(unit_text, None, "")
        if typed_unit.dimension in (COUNT, SHARE) and not typed_unit.per:
            value = number * multiplier * typed_unit.scale
            note_always = value != number
        else:
            value = number * multiplier
            unconverted = f" ({unit_text} taken as written: this answer has no unit)"
            note_always = True
    elif unit_text.lower() == shown_unit.lower():
        value = number
        note_always = block.dimension == SHARE
    else:
        multiplier, typed_unit = _typed_unit(unit_text, block, shown_unit)
        value = _convert(number * multiplier, typed, typed_unit, block, shown_unit)
        if typed_unit.dimension == COUNT and typed_unit.label and multiplier == 1.0 and typed_unit.scale == 1.0:
            note_always = arithmetic  # "76 GPUs", "3.5x": the number as typed, its word a label
        else:
            note_always = True
    if not math.isfinite(value):
        raise UserError(f"'{typed}' is too large to be a number")
    note = f"read as {_with_unit(value, shown_unit)}{unconverted}" if note_always or arithmetic else ""
    return Reading(value, shown_unit, typed, note)


def number_part(text: str) -> float:
    """The number a text starts with, its arithmetic evaluated and any unit after it ignored
    ('3.39 × 10³⁸' -> 3.39e38, '14 GB' -> 14); UserError when it starts with none."""
    typed = (text or "").strip()
    expression, _ = _split(_normalise(typed))
    if not re.search(r"\d", expression):
        raise not_a_number(typed)
    return evaluate_arithmetic(expression, typed)


def convert(value: float, from_unit: str, to_unit: str) -> float:
    """`value` in `from_unit` as a value in `to_unit` (both units of the same kind: 'min' to 's');
    UserError when they measure different things."""
    source, target = parse_unit(from_unit), parse_unit(to_unit)
    if source is None or target is None or from_unit.strip() == to_unit.strip():
        return value
    return _convert(value, from_unit, source, target, to_unit)


def same_kind(unit: str, other: str) -> bool:
    """Whether a value in `unit` converts to `other` (a predict block's guess_unit and unit)."""
    source, target = parse_unit(unit), parse_unit(other)
    if source is None or target is None:
        return False
    return (source.dimension, bool(source.per)) == (target.dimension, bool(target.per)) and source.dimension != COUNT
