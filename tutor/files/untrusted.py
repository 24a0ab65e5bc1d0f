"""The one reader of JSON and TOML that a user, an editor, a download or a disk may have damaged.

Every file tensor-tutor parses (a model's config.json, an adapter's adapter_config.json, a safetensors
header, the results notebook, progress.json, settings.json, the caches, the lessons' TOML, a lab
parameter typed on the command line) goes through `loads_json` or `loads_toml` here (a file named by
its path through tutor.files.storage.read_checked_json, which reads the bytes without blocking on a FIFO or
following a link where it must not), so what one of them refuses, all of them refuse, each in one
line naming the file and the field:

- a bounded size (`max_bytes`) and nesting depth (MAX_NESTING): a parser that recurses per level
  raises RecursionError, and later code that walks the value would too;
- integers of at most `max_digits` decimal digits. CPython refuses to turn a string of more than
  4,300 digits into an int with a ValueError raised from inside json.loads and tomllib.loads
  (Python docs, "Integer string conversion length limitation", CVE-2020-10735); here json's
  `parse_int` hook sees the digits first (in text that holds so long a run of digits) and a huge
  number is refused as "too large". TOML's hexadecimal, octal and binary integers are not limited
  by CPython at all, so every parsed integer is compared with 10**max_digits as well;
- finite numbers only: JSON's NaN and Infinity (which Python's json accepts, RFC 8259 section 6
  does not), a float that overflows to infinity (1e999) and TOML's inf and nan are refused, unless
  `non_finite="keep"` (a reader that cleans each field itself, as progress.json's does);
- strings without lone surrogates ("\\ud800" is valid JSON but no Unicode text: writing it back as
  UTF-8 raises UnicodeEncodeError), of at most `max_chars` characters, and without control
  characters: refused (`strings="refuse"`), shown as escapes (`"clean"`, for text only displayed) or
  left for the caller (`"keep"`, the lesson loader escapes them itself).

`UntrustedDataError` is a UserError: a config file or a command-line value that fails reaches the
user as one line and exit code 2; state files (progress, settings, caches) catch it and set the file
aside (tutor.files.storage.read_json). `expect` is the small typed schema for single fields ("config.json:
r must be a positive whole number, got "abc"").

Standard library only, no torch or textual: `fit`, `models` and the app's first paint import this.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from tutor.errors import UserError

MAX_NESTING = 64
"""The deepest nesting a file may have (progress.json needs 5, a safetensors header 3): deeper is damage."""
MAX_DIGITS = 40
"""Decimal digits an integer may have: 2**64 has 20; a config, header or notebook needs no more."""
MAX_CHARS = 1 << 16
"""Characters a string may have unless the caller says otherwise."""
CPYTHON_INT_DIGITS = 4300
"""CPython's default limit on int <-> str conversion (sys.get_int_max_str_digits()): what a state file
(progress, settings), whose reader cleans each field itself, may hold at most."""

StringPolicy = Literal["refuse", "clean", "keep"]

_CONTROL = frozenset(chr(code) for code in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0),
                                            0x2028, 0x2029))
"""C0 and C1 controls and DEL, except tab and newline; the Unicode line and paragraph separators
(the characters tutor.safe_text escapes before a terminal sees them)."""


class UntrustedDataError(UserError):
    """What a file or value holds that tensor-tutor will not read. `what` names the file (or the
    option), `where` the field ("results[0].sweep[2].tflops_median", "" for the whole), `reason` why;
    the message is the one line to show: "config.json: hidden_size is an integer of 5,001 digits, ..."."""

    def __init__(self, what: str, reason: str, where: str = "", detail: str = "") -> None:
        self.what, self.reason, self.where = what, reason, where
        self.detail = detail  # the parser's own message, where it gave one (tomllib's names the line)
        super().__init__(f"{what}: {self.field_reason}")

    @property
    def field_reason(self) -> str:
        """The line without the file's name: "hidden_size is an integer of 5,001 digits, ..."."""
        return f"{self.where} {self.reason}" if self.where else self.reason


class TooDeepError(UntrustedDataError):
    """Data nested deeper than the reader allows (JSON or TOML)."""

    def __init__(self, what: str, depth: int = MAX_NESTING) -> None:
        super().__init__(what, f"nested deeper than {depth} levels")


@dataclass(frozen=True)
class _Huge:
    """Stands for an integer refused by the parse hook: reported with its field by the walk after it."""

    digits: int


@dataclass(frozen=True)
class _NonFinite:
    """Stands for NaN, Infinity or a float that overflowed to infinity."""

    text: str


def _digit_limit(max_digits: int) -> int:
    """`max_digits`, or CPython's own limit where it is lower (PYTHONINTMAXSTRDIGITS may set it to 640)."""
    cpython = sys.get_int_max_str_digits()
    return min(max_digits, cpython) if cpython else max_digits


def _int_hook(max_digits: int) -> Callable[[str], object]:
    def parse_int(text: str) -> object:
        digits = len(text) - (text[0] in "+-")
        return _Huge(digits) if digits > max_digits else int(text)

    return parse_int


def _constant_hook(keep: bool) -> Callable[[str], object]:
    def parse_constant(text: str) -> object:
        return float(text) if keep else _NonFinite(text)

    return parse_constant


def _field(path: tuple[object, ...]) -> str:
    """("results", 0, "sweep", 2, "m") -> "results[0].sweep[2].m": a key shown safe and short."""
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            key = part if isinstance(part, str) and part.isprintable() and len(part) <= 60 else repr(part)[:60]
            text += ("." if text else "") + key
    return text


def _clean(text: str) -> str:
    return "".join(repr(char)[1:-1] if char in _CONTROL else char for char in text)


def _has_lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


@dataclass(frozen=True)
class _Rules:
    what: str
    max_digits: int
    max_chars: int
    strings: StringPolicy
    keep_non_finite: bool
    max_depth: int = MAX_NESTING

    @property
    def int_bound(self) -> int:
        return 10**self.max_digits


def _text_needs_cleaning(text: str, path: tuple[object, ...], rules: _Rules, is_key: bool) -> bool:
    """Check a string that is not plainly fine (long, or not printable); True when `strings="clean"` must
    rewrite it."""
    where = _field(path) + (" (a key)" if is_key and path else "")
    if len(text) > rules.max_chars:
        raise UntrustedDataError(rules.what, f"is text of {len(text):,} characters, over the {rules.max_chars:,} "
                                             "it may have", where or "a key")
    if _has_lone_surrogate(text):
        raise UntrustedDataError(rules.what, "holds a lone surrogate escape (such as \\ud800), which is not "
                                             "Unicode text", where or "a key")
    if rules.strings != "keep" and any(char in _CONTROL for char in text):
        if rules.strings == "clean":
            return True
        raise UntrustedDataError(rules.what, "holds a control character (such as \\u001b), which is not "
                                             "allowed here", where or "a key")
    return False


def _scalar_needs_cleaning(value: Any, path: tuple[object, ...], rules: _Rules, bound: int) -> bool:
    """Check one value that is no container, as _walk does inline for the common cases."""
    if isinstance(value, str):
        return _text_needs_cleaning(value, path, rules, is_key=False)
    if isinstance(value, _Huge):
        raise UntrustedDataError(rules.what, f"is an integer of {value.digits:,} digits, too large (at most "
                                             f"{rules.max_digits} digits)", _field(path))
    if isinstance(value, _NonFinite):
        raise UntrustedDataError(rules.what, f"is {value.text[:20]}, not a finite number", _field(path))
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, int) and not -bound < value < bound:
        # TOML's 0x, 0o and 0b integers never meet CPython's digit limit: bounded by size instead, and
        # compared, never converted to text.
        raise UntrustedDataError(rules.what, f"is an integer too large (over {rules.max_digits} digits)",
                                 _field(path))
    if isinstance(value, float) and not (math.isfinite(value) or rules.keep_non_finite):
        raise UntrustedDataError(rules.what, f"is {value!r}, not a finite number", _field(path))
    return False  # TOML's dates and times


def _walk(value: Any, rules: _Rules) -> bool:
    """Check every rule on parsed data, without recursion and without copying it; True when some string
    must be cleaned. The common values (printable short text, finite floats, small ints) are checked
    inline: a notebook of a thousand runs holds some million of them."""
    bound = rules.int_bound
    if not isinstance(value, (dict, list)):
        return _scalar_needs_cleaning(value, (), rules, bound)
    max_chars, keep_non_finite, isfinite = rules.max_chars, rules.keep_non_finite, math.isfinite
    dirty = False
    stack: list[tuple[Any, tuple[object, ...], int]] = [(value, (), 1)]
    while stack:
        container, path, depth = stack.pop()
        if depth > rules.max_depth:
            raise TooDeepError(rules.what, rules.max_depth)
        is_dict = type(container) is dict
        pairs: Any = container.items() if is_dict else enumerate(container)
        for key, item in pairs:
            if is_dict and not (key.isprintable() and len(key) <= max_chars):
                dirty |= _text_needs_cleaning(key, (*path, key), rules, is_key=True)
            kind = type(item)
            if kind is str:
                if item.isprintable() and len(item) <= max_chars:
                    continue
            elif kind is float:
                if keep_non_finite or isfinite(item):
                    continue
            elif kind is int:
                if -bound < item < bound:
                    continue
            elif kind is dict or kind is list:
                stack.append((item, (*path, key), depth + 1))
                continue
            elif kind is bool or item is None:
                continue
            dirty |= _scalar_needs_cleaning(item, (*path, key), rules, bound)
    return dirty


def _cleaned(value: Any) -> Any:
    """`value` with the control characters of its strings written as escapes (depth already bounded)."""
    if isinstance(value, str):
        return _clean(value) if not value.isprintable() else value
    if isinstance(value, list):
        return [_cleaned(item) for item in value]
    if isinstance(value, dict):
        return {_cleaned(key): _cleaned(item) for key, item in value.items()}
    return value


def _bounded(parse: Callable[[], Any], rules: _Rules) -> Any:
    try:
        value = parse()
    except RecursionError:
        raise TooDeepError(rules.what, rules.max_depth) from None
    if _walk(value, rules) and rules.strings == "clean":
        return _cleaned(value)
    return value


def _decoded(data: str | bytes, what: str, max_bytes: int) -> str:
    if isinstance(data, str):
        if len(data) > max_bytes:  # a character is at least a byte
            raise UntrustedDataError(what, f"is {len(data):,} characters, over the {max_bytes:,}-byte limit")
        return data
    if len(data) > max_bytes:
        raise UntrustedDataError(what, f"is {len(data):,} bytes, over the {max_bytes:,}-byte limit")
    try:
        return bytes(data).decode("utf-8-sig")  # a byte-order mark, as Windows editors save, is no content
    except UnicodeDecodeError as error:
        raise UntrustedDataError(what, f"is not UTF-8 text (byte {error.start:,})") from None


def loads_json(data: str | bytes, *, what: str, max_bytes: int, max_depth: int = MAX_NESTING,
               max_digits: int = MAX_DIGITS, max_chars: int = MAX_CHARS, strings: StringPolicy = "refuse",
               non_finite: Literal["refuse", "keep"] = "refuse") -> Any:
    """The JSON value in `data` (UTF-8 bytes or text) under the rules of this module; UntrustedDataError
    (one line, starting with `what`) for anything else, never a ValueError from CPython's limits or a
    RecursionError."""
    text = _decoded(data, what, max_bytes)
    keep = non_finite == "keep"
    max_digits = _digit_limit(max_digits)
    rules = _Rules(what, max_digits, max_chars, strings, keep, max_depth)
    # The integer hook costs a Python call per number: only text with a run of digits that long needs it
    # (json's own int() would raise past CPython's limit, or make an integer too large to use).
    long_digits = re.search(r"\d{%d}" % (max_digits + 1), text) is not None

    def parse() -> Any:
        try:
            return json.loads(text, parse_int=_int_hook(max_digits) if long_digits else None,
                              parse_constant=_constant_hook(keep))
        except json.JSONDecodeError as error:
            raise UntrustedDataError(what, f"is not valid JSON (line {error.lineno}, column {error.colno}: "
                                           f"{error.msg})") from None

    return _bounded(parse, rules)


def loads_toml(text: str, *, what: str, max_bytes: int = 1 << 20, max_depth: int = MAX_NESTING,
               max_digits: int = MAX_DIGITS, max_chars: int = MAX_CHARS, strings: StringPolicy = "refuse",
               non_finite: Literal["refuse", "keep"] = "refuse") -> dict[str, Any]:
    """tomllib.loads under the rules of this module; UntrustedDataError for anything else (including
    tomllib's own errors, and the ValueError CPython raises from inside it for a 4,301-digit integer)."""
    import tomllib

    text = _decoded(text, what, max_bytes)
    keep = non_finite == "keep"
    max_digits = _digit_limit(max_digits)
    rules = _Rules(what, max_digits, max_chars, strings, keep, max_depth)

    def parse() -> Any:
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise UntrustedDataError(what, f"is not valid TOML ({error})", detail=str(error)) from None
        except ValueError as error:  # raised inside tomllib: an int past CPython's limit, a 31 February
            if "integer string conversion" in str(error):
                reason = f"holds an integer of more than {sys.get_int_max_str_digits() or CPYTHON_INT_DIGITS:,} digits, too large"
            else:
                reason = f"is not valid TOML ({str(error)[:120]})"
            raise UntrustedDataError(what, reason, detail=reason.removeprefix("is ")) from None

    value: dict[str, Any] = _bounded(parse, rules)
    return value


# ---------------------------------------------------------------------------------------------
# A small typed schema: one field, its kind, one line when it is not


@dataclass(frozen=True)
class Kind:
    """What a field must be: `test` says whether a value is one, `words` says so in an error."""

    words: str
    test: Callable[[Any], bool]


_NUMBERS = (int, float)  # by exact type: a bool is no number here, and JSON makes no subclasses
_INF = math.inf

# Tests by exact type and chained comparison (NaN compares false, so `0 < v < inf` is finite and positive):
# the notebook checks some million fields with them.
POSITIVE_WHOLE = Kind("a positive whole number", lambda v: type(v) is int and v > 0)
WHOLE = Kind("a whole number, 0 or more", lambda v: type(v) is int and v >= 0)
POSITIVE_NUMBER = Kind("a positive finite number", lambda v: type(v) in _NUMBERS and 0 < v < _INF)
NUMBER = Kind("a finite number, 0 or more", lambda v: type(v) in _NUMBERS and 0 <= v < _INF)
TEXT = Kind("text", lambda v: isinstance(v, str))
FLAG = Kind("true or false", lambda v: isinstance(v, bool))
OBJECT = Kind("an object", lambda v: isinstance(v, dict))
LIST = Kind("a list", lambda v: isinstance(v, list))
OBJECTS = Kind("a list of objects", lambda v: isinstance(v, list) and all(isinstance(item, dict) for item in v))


def shown_value(value: Any, limit: int = 40) -> str:
    """A value as JSON would write it ("abc" with quotes, 1e+400 as its text), cut for one line."""
    if isinstance(value, (_Huge, _NonFinite)):
        return "a huge number" if isinstance(value, _Huge) else value.text
    if isinstance(value, int) and value.bit_length() > 3 * limit:  # never str() an int past CPython's limit
        return f"an integer of about {int(value.bit_length() * math.log10(2)):,} digits"
    try:
        text = json.dumps(value, ensure_ascii=True, allow_nan=True)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > limit:
        return text[: limit - 3] + "..."
    return text


MISSING: Any = object()


def bad_field(what: str, where: str, kind: Kind, value: Any) -> UntrustedDataError:
    """The one line for a field that is not what it must be."""
    return UntrustedDataError(what, f"must be {kind.words}, got {shown_value(value)}", where)


def expect(data: Mapping[str, Any], key: str, kind: Kind, *, what: str, where: str = "",
           default: Any = MISSING, allow_null: bool = False) -> Any:
    """`data[key]` when it is of `kind`; `default` when absent (null too, with `allow_null`); else one
    UntrustedDataError naming `what` and the field (`where` is the path to `data`)."""
    field = f"{where}.{key}" if where else key
    if key not in data or (allow_null and data[key] is None):
        if default is MISSING:
            raise UntrustedDataError(what, f"is missing; it must be {kind.words}", field)
        return default
    value = data[key]
    if not kind.test(value):
        raise bad_field(what, field, kind, value)
    return value


def check_fields(data: Mapping[str, Any], kinds: Mapping[str, Kind], *, what: str, where: str = "",
                 allow_null: bool = True) -> None:
    """Each field of `kinds` present in `data` is of its kind (null allowed for a figure not measured,
    with `allow_null`); the first that is not raises UntrustedDataError."""
    for key, value in data.items():  # by the data's keys: a notebook checks some million fields
        kind = kinds.get(key)
        if kind is not None and not (allow_null and value is None) and not kind.test(value):
            raise bad_field(what, f"{where}.{key}" if where else key, kind, value)
