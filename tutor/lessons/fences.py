"""lesson.md cut at its fenced directives, without checking them: the pieces tutor.lessons.directives
parses, and the ids of the blocks that complete a lesson, which the curriculum's index keeps for the
home screen's count of blocks done. It imports no block class or parser: listing the lessons loads
neither them nor the calculators' theory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from collections.abc import Collection

from tutor.errors import UserError
from tutor.files.storage import TooDeepError, loads_toml_bounded

DIRECTIVES = ("bits", "calc", "measure", "predict", "quiz", "exercise")
"""The info strings of the fences that are directives (tutor.lessons.model has a block class for each)."""
_OPENING = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class RawBlock:
    """A piece of lesson.md before parsing: "prose" or a directive name, its first line, its text."""

    directive: str
    line: int
    body: str


def split_markdown(text: str, source: str = "lesson.md") -> list[RawBlock]:
    """Prose and directive bodies in order; the line of a directive is that of its opening fence."""
    lines = text.splitlines()
    pieces: list[RawBlock] = []
    prose: list[str] = []
    prose_start = 1
    index = 0

    def flush_prose() -> None:
        if "".join(prose).strip():
            leading_blank = next(i for i, line in enumerate(prose) if line.strip())
            pieces.append(RawBlock("prose", prose_start + leading_blank, "\n".join(prose).strip("\n")))
        prose.clear()

    while index < len(lines):
        match = _OPENING.match(lines[index])
        if match is None:
            if not prose:
                prose_start = index + 1
            prose.append(lines[index])
            index += 1
            continue
        fence, info = match.group("fence"), match.group("info").strip()
        if fence[0] == "`" and "`" in info:  # CommonMark: not a fence, inline code
            if not prose:
                prose_start = index + 1
            prose.append(lines[index])
            index += 1
            continue
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = next((j for j in range(index + 1, len(lines)) if closing.match(lines[j])), None)
        word = info.split()[0].lower() if info else ""
        if word in DIRECTIVES:
            if end is None:
                raise UserError(f"{source}:{index + 1}: the ```{word} block is never closed (add a line {fence})")
            flush_prose()
            pieces.append(RawBlock(word, index + 1, "\n".join(lines[index + 1:end])))
            index = end + 1
            prose_start = index + 1
            continue
        # Ordinary code: prose, taken whole so that a directive-looking line inside it stays code.
        stop = len(lines) if end is None else end + 1
        if not prose:
            prose_start = index + 1
        prose.extend(lines[index:stop])
        index = stop
    flush_prose()
    return pieces


def completing_block_ids(text: str, completing: Collection[str]) -> tuple[str, ...]:
    """The ids, in page order, of the blocks of a lesson page whose directive is one of `completing`
    (tutor.lessons.progress.REQUIRED_TO_COMPLETE), named as tutor.lessons.directives.parse_blocks names
    them: the block's `id`, else "<directive>-<n>". A page or block that does not parse gives what could be read: opening the
    lesson (and `tensor-tutor lessons --check`) says what is wrong with it."""
    try:
        pieces = split_markdown(text)
    except UserError:
        return ()
    counters: dict[str, int] = {}
    ids: list[str] = []
    for piece in pieces:
        counters[piece.directive] = counters.get(piece.directive, 0) + 1
        if piece.directive not in completing:
            continue
        try:
            explicit = loads_toml_bounded(piece.body).get("id")
        except (TooDeepError, ValueError):  # ValueError: tomllib.TOMLDecodeError
            explicit = None
        ids.append(explicit if isinstance(explicit, str) and explicit
                   else f"{piece.directive}-{counters[piece.directive]}")
    return tuple(ids)
