"""The shipped curriculum's index kept between launches: its tracks and every lesson's metadata, as
parsed from curriculum.toml and the lesson.toml files the last time they changed, with the ids of the
blocks that complete each lesson, read from its lesson.md (Home counts the blocks done against them).

Every launch of the app lists all lessons, and parsing the 31 TOML files behind that list (tomllib
is pure Python) with the loader's checks was 4-5 ms of the ~200 ms to the home screen on the 2-core
machine, a tenth of what the app adds to a bare Textual start. The cache holds the index
the loader built, keyed by a CRC-32 of every file it read (read again at each launch: 0.3 ms), so an
edited, added or removed lesson is parsed afresh. It is only ever a shortcut: a missing, unreadable,
stale or damaged cache, or one that cannot be written, means the files are parsed as before.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

from tutor import __version__
from tutor.lessons.catalog import LessonInfo, Track
from tutor.safe_text import strings_without_controls
from tutor.files.storage import cache_dir, read_checked_json, read_regular_bytes, write_json_atomic

CACHE_FILE = "curriculum-index.json"
FORMAT = 2
"""Bumped whenever the stored shape changes. The index is also kept per tutor version, so a release
whose loader checks more parses the files afresh."""
CACHE_LIMIT_BYTES = 1 << 20
SOURCE_LIMIT_BYTES = 1 << 20
"""The most any one source file is read for its digest: the loader's own limit for a TOML file."""


def cache_path() -> Path:
    """$TENSOR_TUTOR_DATA_DIR/cache/curriculum-index.json when that is set (tests, a portable setup),
    else in platformdirs' user cache folder (~/.cache/tensor-tutor on Linux)."""
    return cache_dir() / CACHE_FILE


def sources_digest(sources: list[tuple[str, bytes]]) -> int:
    """CRC-32 over the name and bytes of each source file, in order."""
    digest = 0
    for name, data in sources:
        digest = zlib.crc32(data, zlib.crc32(name.encode("utf-8") + b"\0", digest))
    return digest


def newlines_as_parsed(data: bytes) -> bytes:
    """The bytes with universal newlines, as the loader reads its text (tutor.files.storage.read_regular_text):
    a CRLF checkout digests the same on both sides."""
    if b"\r" not in data:  # the usual checkout: spares two copies of every page at each launch
        return data
    return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")


def _source_bytes(path: Path, *, missing_is_empty: bool) -> bytes:
    """A source file's bytes; a lesson page that does not exist is digested as empty, as the loader
    keeps it (a lesson without its page lists no blocks), so that adding it is a change."""
    try:
        # The lessons are no data-folder file (a link among them is followed, as the loader does): said
        # outright, which also spares each read the look-up of the data and cache folders.
        return read_regular_bytes(path, SOURCE_LIMIT_BYTES, follow_symlinks=True)
    except FileNotFoundError:
        if missing_is_empty:
            return b""
        raise


def read_index(root: Path, manifest: str, lesson_file: str,
               page_file: str) -> tuple[tuple[Track, ...], dict[str, LessonInfo]] | None:
    """The cached tracks and lesson metadata of the curriculum at `root` (its `manifest`, each lesson's
    `lesson_file` and its `page_file`, whose completing blocks the index keeps), if the cache holds them
    and none of those files changed since; None otherwise."""
    try:
        stored = read_checked_json(cache_path(), max_bytes=CACHE_LIMIT_BYTES, follow_symlinks=False, strings="keep")
        if stored.get("format") != FORMAT or stored.get("version") != __version__ or stored.get("root") != str(root):
            return None
        stored = strings_without_controls(stored)
        tracks = tuple(Track(id=t["id"], title=t["title"], summary=t["summary"], lesson_ids=tuple(t["lesson_ids"]))
                       for t in stored["tracks"])
        infos = {i["id"]: LessonInfo(id=i["id"], title=i["title"], track=i["track"], minutes=i["minutes"],
                                     prerequisites=tuple(i["prerequisites"]), summary=i["summary"],
                                     blocks=tuple(str(block) for block in i["blocks"]))
                 for i in stored["lessons"]}
        lesson_ids = [lesson_id for track in tracks for lesson_id in track.lesson_ids]
        if lesson_ids != list(infos):
            return None
        names = [manifest, *(f"{lesson_id}/{name}" for lesson_id in lesson_ids for name in (lesson_file, page_file))]
        digest = sources_digest([
            (name, newlines_as_parsed(_source_bytes(root / name, missing_is_empty=name.endswith(f"/{page_file}"))))
            for name in names])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None  # no cache, a file gone, or not a cache this code wrote: parse the files
    return (tracks, infos) if digest == stored.get("digest") else None


def write_index(root: Path, sources: dict[str, str], tracks: tuple[Track, ...], infos: dict[str, LessonInfo]) -> None:
    """Keep the index the loader just parsed and checked from `sources` (each file's name under `root`
    and text, in the order read_index reads them); says nothing when it cannot (a read-only home)."""
    stored: dict[str, Any] = {
        "format": FORMAT, "version": __version__, "root": str(root),
        "digest": sources_digest([(name, text.encode("utf-8")) for name, text in sources.items()]),
        "tracks": [{"id": t.id, "title": t.title, "summary": t.summary, "lesson_ids": list(t.lesson_ids)}
                   for t in tracks],
        "lessons": [{"id": i.id, "title": i.title, "track": i.track, "minutes": i.minutes,
                     "prerequisites": list(i.prerequisites), "summary": i.summary, "blocks": list(i.blocks)}
                    for i in infos.values()],
    }
    try:
        write_json_atomic(cache_path(), stored)
    except OSError:
        pass  # the next launch parses the files again
