"""Text that came from a file (a config's `_name_or_path`, a folder name, a notebook, a device or process
name), made safe to show: control characters appear as escapes (`\\x1b`) and never reach the terminal,
and Rich markup in it is printed as written (`my-model[v2]`, `[link=...]` stays text, never a hyperlink).
Lesson text keeps its lines and tabs (without_controls): only the characters a terminal acts on are
written as escapes. Rich is imported only by the two helpers that build Rich text, so the lesson engine
can use plain() and without_controls() without it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.text import Text

_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
"""C0 and C1 controls and DEL, except tab and newline; and the Unicode line/paragraph separators."""


def plain(text: object) -> str:
    """`text` with every non-printable character (ESC, newline, BEL, ...) written as its Python escape."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def without_controls(text: str) -> str:
    """`text` with its newlines and tabs, every other control character (ESC, BEL, CR, C1 such as
    CSI U+009B) written as its Python escape (`\\x1b`): multi-line text made safe for a terminal."""
    return _CONTROLS.sub(lambda match: repr(match.group())[1:-1], text)


def strings_without_controls(value: Any) -> Any:
    """Parsed data (TOML, JSON: bounded depth) with without_controls() applied to every string in it,
    keys included: a TOML escape such as "\\u001b" cannot bring a control character back."""
    if isinstance(value, str):
        return without_controls(value)
    if isinstance(value, list):
        return [strings_without_controls(item) for item in value]
    if isinstance(value, dict):
        return {strings_without_controls(key): strings_without_controls(item) for key, item in value.items()}
    return value


def markup_safe(text: object) -> str:
    """`text` to put inside a Rich markup string: plain() and every `[` that could open a tag escaped."""
    from rich.markup import escape

    return escape(plain(text))


def markup_escape(text: object) -> str:
    """rich.markup.escape for text that may hold lines: `[` escaped and every control character but newline
    and tab written as its escape (without_controls). Every module that escapes text for Rich markup uses
    this one, so a string from a file cannot reach the terminal as a control sequence on any path."""
    from rich.markup import escape

    return escape(without_controls(str(text)))


def as_text(text: object, style: str = "") -> Text:
    """`text` as a Rich Text (a table cell that is never parsed as markup), control characters escaped."""
    from rich.text import Text

    return Text(plain(text), style=style)
