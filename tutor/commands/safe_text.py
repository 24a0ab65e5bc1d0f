"""Text that came from a file (a config's `_name_or_path`, a folder name, a notebook, a device or process
name), made safe to show: control characters appear as escapes (`\\x1b`) and never reach the terminal,
and Rich markup in it is printed as written (`my-model[v2]`, `[link=...]` stays text, never a hyperlink).
"""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text


def plain(text: object) -> str:
    """`text` with every non-printable character (ESC, newline, BEL, ...) written as its Python escape."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def markup_safe(text: object) -> str:
    """`text` to put inside a Rich markup string: plain() and every `[` that could open a tag escaped."""
    return escape(plain(text))


def as_text(text: object, style: str = "") -> Text:
    """`text` as a Rich Text (a table cell that is never parsed as markup), control characters escaped."""
    return Text(plain(text), style=style)
