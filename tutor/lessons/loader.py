"""Finding and loading the curriculum: curriculum.toml, each lesson.toml, and (on demand) lesson.md.

Layout (lessons/README.md): <root>/curriculum.toml and <root>/<track>/<lesson>/{lesson.toml,lesson.md}.
load_curriculum() reads the manifest, every lesson.toml and, in each lesson.md, the ids of the blocks
that complete it (fast: what the home screen needs); Curriculum.lesson(id) parses that lesson's page
the first time it is asked for.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tutor
from tutor.errors import UserError
from tutor.lessons.catalog import LessonInfo, Track
from tutor.safe_text import strings_without_controls, without_controls
from tutor.files.storage import TooDeepError, loads_toml_bounded, read_regular_text

if TYPE_CHECKING:
    from tutor.lessons.model import Lesson

LESSONS_DIR_ENV = "TENSOR_TUTOR_LESSONS_DIR"
CURRICULUM_FILE = "curriculum.toml"
LESSON_TOML = "lesson.toml"
LESSON_MD = "lesson.md"
_TRACK_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")
_LESSON_ID = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*/[a-z0-9]+(?:-[a-z0-9]+)*")
_TOML_POSITION = re.compile(r"\(at line (\d+), column \d+\)")
TOML_LIMIT_BYTES = 1 << 20
"""The largest curriculum.toml or lesson.toml read (today's are under 2 KiB)."""
PAGE_LIMIT_BYTES = 4 << 20
"""The largest lesson.md read (today's are under 40 KiB)."""


def lessons_root() -> Path:
    """Where the curriculum lives: $TENSOR_TUTOR_LESSONS_DIR if set (tests, authors trying a copy),
    else tutor/_lessons in an installed wheel (hatch force-include), else the repository's
    top-level lessons/ (an editable install or a checkout)."""
    override = os.environ.get(LESSONS_DIR_ENV)
    if override:
        return Path(override).expanduser()
    package = Path(tutor.__file__).resolve().parent
    shipped = package / "_lessons"
    if (shipped / CURRICULUM_FILE).is_file():
        return shipped
    return package.parent / "lessons"


def _shown_path(path: Path, root: Path) -> str:
    try:
        return f"{root.name}/{path.relative_to(root).as_posix()}"
    except ValueError:
        return str(path)


def _read_lesson_file(path: Path, shown: str, limit: int) -> str:
    """A curriculum file's text: a regular file (a FIFO or device would block the read) of at most
    `limit` bytes, UTF-8; a UserError naming the file otherwise."""
    try:
        return read_regular_text(path, limit)
    except FileNotFoundError:
        raise UserError(f"{shown}: file not found") from None
    except UnicodeDecodeError as error:
        raise UserError(f"{shown}: cannot read (not UTF-8: {error.reason} at byte {error.start})") from None
    except OSError as error:
        raise UserError(f"{shown}: cannot read ({error.strerror or error})") from None


def _read_toml(path: Path, root: Path) -> tuple[dict[str, Any], str]:
    import tomllib  # here: a launch that finds the index cached (tutor.lessons.index_cache) parses no TOML

    shown = _shown_path(path, root)
    text = _read_lesson_file(path, shown, TOML_LIMIT_BYTES)
    try:
        return strings_without_controls(loads_toml_bounded(text)), text
    except TooDeepError as error:
        raise UserError(f"{shown}: not valid TOML: {error}") from None
    except tomllib.TOMLDecodeError as error:
        message = str(error)
        position = _TOML_POSITION.search(message)
        line = position.group(1) if position else "1"
        raise UserError(f"{shown}:{line}: not valid TOML: {_TOML_POSITION.sub('', message).strip()}") from None


def _line_of(text: str, needle: str) -> int:
    """The first line of `text` containing `needle` (1 when absent): where to point an error."""
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    return 1


def _require(table: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str, what: str) -> Any:
    if key not in table:
        raise UserError(f"{where}: missing {key!r} ({what})")
    value = table[key]
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise UserError(f"{where}: {key} must be {what}, got {value!r}")
    return value


def _string_list(table: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise UserError(f"{where}: {key} must be a list of lesson ids such as [\"precision/bits-of-a-float\"]")
    return tuple(value)


def _unknown_keys(table: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    extra = sorted(set(table) - set(allowed))
    if extra:
        raise UserError(f"{where}: unknown key {extra[0]!r} (allowed: {', '.join(allowed)})")


def _parse_tracks(data: dict[str, Any], text: str, shown: str) -> tuple[Track, ...]:
    _unknown_keys(data, ("tracks",), shown)
    entries = data.get("tracks")
    if not isinstance(entries, list) or not entries or not all(isinstance(entry, dict) for entry in entries):
        raise UserError(f"{shown}:1: needs one or more [[tracks]] tables")
    tracks: list[Track] = []
    seen_lessons: dict[str, str] = {}
    for number, entry in enumerate(entries, start=1):
        track_id = entry.get("id")
        where = f"{shown}:{_line_of(text, repr(track_id)[1:-1]) if isinstance(track_id, str) else 1}"
        _unknown_keys(entry, ("id", "title", "summary", "lessons"), f"{where}: track {number}")
        track_id = _require(entry, "id", str, where, "a lowercase-hyphenated track id")
        if not _TRACK_ID.fullmatch(track_id):
            raise UserError(f"{where}: track id {track_id!r} must be lowercase letters, digits and hyphens")
        if any(track.id == track_id for track in tracks):
            raise UserError(f"{where}: track id {track_id!r} is used twice")
        title = _require(entry, "title", str, where, "the track's title")
        summary = entry.get("summary", "")
        if not isinstance(summary, str):
            raise UserError(f"{where}: summary must be text")
        lesson_ids = _string_list(entry, "lessons", where)
        for lesson_id in lesson_ids:
            line = f"{shown}:{_line_of(text, lesson_id)}"
            if not _LESSON_ID.fullmatch(lesson_id) or lesson_id.split("/")[0] != track_id:
                raise UserError(f"{line}: lesson id {lesson_id!r} must be \"{track_id}/<lesson-folder>\" "
                                "(lowercase letters, digits, hyphens)")
            if lesson_id in seen_lessons:
                raise UserError(f"{line}: lesson {lesson_id!r} is listed twice")
            seen_lessons[lesson_id] = track_id
        tracks.append(Track(id=track_id, title=title, summary=summary, lesson_ids=lesson_ids))
    return tuple(tracks)


def _parse_lesson_info(path: Path, root: Path, expected_id: str, sources: dict[str, str]) -> LessonInfo:
    data, text = _read_toml(path, root)
    sources[f"{expected_id}/{LESSON_TOML}"] = text
    shown = _shown_path(path, root)
    _unknown_keys(data, ("id", "title", "minutes", "prerequisites", "summary"), shown)
    lesson_id = _require(data, "id", str, shown, f'the lesson id, "{expected_id}"')
    if lesson_id != expected_id:
        raise UserError(f"{shown}:{_line_of(text, 'id')}: id is {lesson_id!r} but the folder says {expected_id!r}")
    title = _require(data, "title", str, shown, "the lesson's title")
    minutes = _require(data, "minutes", int, f"{shown}:{_line_of(text, 'minutes')}", "whole minutes, such as 8")
    if not 1 <= minutes <= 240:
        raise UserError(f"{shown}:{_line_of(text, 'minutes')}: minutes must be from 1 to 240, got {minutes}")
    summary = data.get("summary", "")
    if not isinstance(summary, str):
        raise UserError(f"{shown}:{_line_of(text, 'summary')}: summary must be text")
    prerequisites = _string_list(data, "prerequisites", f"{shown}:{_line_of(text, 'prerequisites')}")
    return LessonInfo(id=lesson_id, title=title, track=expected_id.split("/")[0], minutes=minutes,
                      prerequisites=prerequisites, summary=summary)


def _completing_blocks(path: Path, root: Path, lesson_id: str, sources: dict[str, str]) -> tuple[str, ...]:
    """The ids of the blocks that complete the lesson at `path` (tutor.lessons.fences), its text kept
    in `sources` for the index's digest; () when the page cannot be read (opening it says why)."""
    from tutor.lessons.fences import completing_block_ids
    from tutor.lessons.progress import REQUIRED_TO_COMPLETE

    if not path.exists():  # digested as empty (tutor.lessons.index_cache): adding the page is a change
        sources[f"{lesson_id}/{LESSON_MD}"] = ""
        return ()
    try:
        text = _read_lesson_file(path, _shown_path(path, root), PAGE_LIMIT_BYTES)
    except UserError:
        return ()
    sources[f"{lesson_id}/{LESSON_MD}"] = text  # as read, like the other files the digest covers
    return completing_block_ids(without_controls(text), REQUIRED_TO_COMPLETE)


def find_prerequisite_cycle(infos: dict[str, LessonInfo]) -> list[str] | None:
    """A chain of lesson ids a -> b -> ... -> a through prerequisites, or None when there is none."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(lesson_id: str) -> list[str] | None:
        state[lesson_id] = "open"
        stack.append(lesson_id)
        for needed in infos[lesson_id].prerequisites:
            if needed not in infos:
                continue
            if state.get(needed) == "open":
                return stack[stack.index(needed):] + [needed]
            if needed not in state:
                cycle = visit(needed)
                if cycle:
                    return cycle
        stack.pop()
        state[lesson_id] = "done"
        return None

    for lesson_id in infos:
        if lesson_id not in state:
            cycle = visit(lesson_id)
            if cycle:
                return cycle
    return None


def suggest(wanted: str, known: list[str]) -> str:
    """" (did you mean a, b?)" for close names, else ""."""
    close = difflib.get_close_matches(wanted, known, n=3, cutoff=0.5)
    tails = [name for name in known if name.split("/")[-1].startswith(wanted.split("/")[-1]) and wanted]
    close = list(dict.fromkeys(close + tails))[:3]
    return f" (did you mean {', '.join(close)}?)" if close else ""


@dataclass(frozen=True)
class Curriculum:
    """The tracks in order, every lesson's metadata, and the lesson pages parsed on demand."""

    tracks: tuple[Track, ...]
    infos: dict[str, LessonInfo] = field(default_factory=dict, repr=False)
    root: Path | None = None
    _pages: dict[str, Lesson] = field(default_factory=dict, repr=False, compare=False)

    @property
    def lessons(self) -> tuple[LessonInfo, ...]:
        """Every lesson, track by track, in curriculum order."""
        return tuple(self.infos[lesson_id] for track in self.tracks for lesson_id in track.lesson_ids)

    @property
    def lesson_ids(self) -> tuple[str, ...]:
        return tuple(info.id for info in self.lessons)

    def resolve(self, lesson_id: str) -> str:
        """The full id for `lesson_id`, which may also be a lesson folder name unique across tracks."""
        if lesson_id in self.infos:
            return lesson_id
        tails = [known for known in self.infos if known.split("/")[-1] == lesson_id]
        if len(tails) == 1:
            return tails[0]
        raise UserError(f"unknown lesson {lesson_id!r}{suggest(lesson_id, list(self.infos))}; "
                        "`tensor-tutor lessons` lists them")

    def info(self, lesson_id: str) -> LessonInfo:
        return self.infos[self.resolve(lesson_id)]

    def track(self, track_id: str) -> Track:
        for track in self.tracks:
            if track.id == track_id:
                return track
        raise UserError(f"unknown track {track_id!r}{suggest(track_id, [t.id for t in self.tracks])}")

    def lesson(self, lesson_id: str) -> Lesson:
        """The parsed lesson (title, page blocks); UserError naming the file and line if it is malformed."""
        lesson_id = self.resolve(lesson_id)
        page = self._pages.get(lesson_id)
        if page is None:
            if self.root is None:
                raise UserError(f"lesson {lesson_id!r} has no folder to read (curriculum built in memory)")
            path = self.root / lesson_id / LESSON_MD
            shown = _shown_path(path, self.root)
            text = without_controls(_read_lesson_file(path, shown, PAGE_LIMIT_BYTES))
            # Here, not at the top: the directives check calc blocks against the fit fields (much
            # of tutor.theory), and the page's block classes, which the home screen, listing lessons, never needs.
            from tutor.lessons.directives import parse_blocks
            from tutor.lessons.model import Lesson

            page = Lesson(info=self.infos[lesson_id], blocks=parse_blocks(text, shown), path=path)
            self._pages[lesson_id] = page
        return page

    def _neighbour(self, lesson_id: str, step: int) -> LessonInfo | None:
        order = self.lesson_ids
        position = order.index(self.resolve(lesson_id)) + step
        return self.infos[order[position]] if 0 <= position < len(order) else None

    def next_lesson(self, lesson_id: str) -> LessonInfo | None:
        """The lesson after `lesson_id` in curriculum order (across tracks), None after the last."""
        return self._neighbour(lesson_id, 1)

    def previous_lesson(self, lesson_id: str) -> LessonInfo | None:
        """The lesson before `lesson_id`, None before the first."""
        return self._neighbour(lesson_id, -1)


def load_curriculum(root: Path | None = None) -> Curriculum:
    """Read <root>/curriculum.toml and every listed lesson.toml (root: lessons_root()).

    Checks that every listed lesson has a folder with a lesson.toml whose id matches it, and that
    prerequisites name listed lessons without a cycle. lesson.md is parsed later, by lesson().
    The shipped curriculum (no `root`) comes from tutor.lessons.index_cache while none of its files
    changed since it was last parsed and checked here.
    """
    from tutor.lessons import index_cache

    shipped = root is None
    root = lessons_root() if root is None else Path(root)
    manifest = root / CURRICULUM_FILE
    if not manifest.is_file():
        raise UserError(f"no lessons found: {manifest} does not exist")
    if shipped and (cached := index_cache.read_index(root, CURRICULUM_FILE, LESSON_TOML, LESSON_MD)) is not None:
        return Curriculum(tracks=cached[0], infos=cached[1], root=root)
    data, text = _read_toml(manifest, root)
    sources = {CURRICULUM_FILE: text}  # each file's text as parsed, manifest first: what the cached index is keyed by
    shown = _shown_path(manifest, root)
    tracks = _parse_tracks(data, text, shown)
    infos: dict[str, LessonInfo] = {}
    for track in tracks:
        for lesson_id in track.lesson_ids:
            folder = root / lesson_id
            if not (folder / LESSON_TOML).is_file():
                raise UserError(f"{shown}:{_line_of(text, lesson_id)}: lesson {lesson_id!r} has no "
                                f"{_shown_path(folder / LESSON_TOML, root)}")
            info = _parse_lesson_info(folder / LESSON_TOML, root, lesson_id, sources)
            infos[lesson_id] = dataclasses.replace(info, blocks=_completing_blocks(folder / LESSON_MD, root, lesson_id,
                                                                                   sources))
    for info in infos.values():
        for needed in info.prerequisites:
            if needed not in infos:
                where = _shown_path(root / info.id / LESSON_TOML, root)
                raise UserError(f"{where}: prerequisite {needed!r} is not a lesson in {CURRICULUM_FILE}"
                                f"{suggest(needed, list(infos))}")
    cycle = find_prerequisite_cycle(infos)
    if cycle:
        raise UserError(f"{shown}: prerequisites form a cycle: {' -> '.join(cycle)}")
    if shipped:
        index_cache.write_index(root, sources, tracks, infos)
    return Curriculum(tracks=tracks, infos=infos, root=root)
