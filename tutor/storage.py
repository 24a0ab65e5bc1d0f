"""Where tensor-tutor keeps the learner's files (progress, settings), and how it writes them safely.

Writes are atomic (a temporary file in the same folder, fsync, os.replace), so a crash or a second
app instance never leaves half a file. A file that cannot be parsed is renamed aside to
`<name>.corrupt-<UTC timestamp>` and the caller gets its default plus a one-line warning: losing
progress is bad, refusing to start is worse.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

DATA_DIR_ENV = "TENSOR_TUTOR_DATA_DIR"
APP_NAME = "tensor-tutor"

T = TypeVar("T")

STATE_FILE_LIMIT_BYTES = 16 << 20
"""The most progress.json or settings.json may hold: a hand-made giant is set aside, not read."""
MAX_NESTING = 64
"""The deepest nesting a state or lesson file may have (progress.json needs 5): deeper is damage."""


class NotAFileError(OSError):
    """A FIFO, device, socket or folder where a regular file belongs (reading it could block forever)."""

    def __init__(self, path: Path) -> None:
        super().__init__(errno.EINVAL, "not a regular file", str(path))


class FileTooLargeError(OSError):
    """A file over the size limit of what it should hold."""

    def __init__(self, path: Path, size: int, limit: int) -> None:
        self.reason = f"{size:,} bytes, over the {limit:,}-byte limit"  # strerror, typed str (never None)
        super().__init__(errno.EFBIG, self.reason, str(path))


class TooDeepError(ValueError):
    """Data nested deeper than MAX_NESTING (JSON or TOML)."""


def read_regular_bytes(path: Path, limit: int) -> bytes:
    """The bytes of `path`, which must be a regular file of at most `limit` bytes.

    FileNotFoundError when absent; NotAFileError for a FIFO, device or socket in its place (checked
    with os.stat before opening, and again on the open descriptor, which is opened non-blocking so a
    FIFO swapped in between cannot hang the open); FileTooLargeError over `limit`.
    """
    path = Path(path)
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise NotAFileError(path)
    descriptor = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            raise NotAFileError(path)
        if info.st_size > limit:
            raise FileTooLargeError(path, info.st_size, limit)
        chunks = []
        remaining = limit + 1  # a file that grows while read is still cut at the limit
        while remaining > 0:
            chunk = os.read(descriptor, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
    finally:
        os.close(descriptor)
    data = b"".join(chunks)
    if len(data) > limit:
        raise FileTooLargeError(path, len(data), limit)
    return data


def read_regular_text(path: Path, limit: int) -> str:
    """read_regular_bytes decoded as UTF-8 with universal newlines (what Path.read_text gives);
    UnicodeDecodeError when it is not UTF-8."""
    text = read_regular_bytes(path, limit).decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def nesting_depth(value: Any) -> int:
    """How deeply lists and dicts nest in `value` (a scalar is 0, [] is 1), without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth > MAX_NESTING:
            return depth
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _parsed_within_nesting(parse: Callable[[Any], Any], text: Any) -> Any:
    """`parse(text)`, with nesting deeper than MAX_NESTING refused as TooDeepError: a parser that
    recurses once per level raises RecursionError, and a value nested that deep breaks later code."""
    try:
        value = parse(text)
    except RecursionError:
        raise TooDeepError(f"nested deeper than {MAX_NESTING} levels") from None
    if nesting_depth(value) > MAX_NESTING:
        raise TooDeepError(f"nested deeper than {MAX_NESTING} levels")
    return value


def loads_json_bounded(text: str | bytes) -> Any:
    """json.loads, with nesting deeper than MAX_NESTING refused as TooDeepError (a ValueError,
    like json.JSONDecodeError) rather than a RecursionError from the parser or from later code."""
    return _parsed_within_nesting(json.loads, text)


def loads_toml_bounded(text: str) -> dict[str, Any]:
    """tomllib.loads, with nesting deeper than MAX_NESTING refused as TooDeepError (tomllib itself
    recurses once per level and raises RecursionError). tomllib.TOMLDecodeError as usual."""
    import tomllib

    value: dict[str, Any] = _parsed_within_nesting(tomllib.loads, text)
    return value


def data_dir() -> Path:
    """The folder for progress.json, settings.json and results: $TENSOR_TUTOR_DATA_DIR if set,
    else platformdirs' user data dir ("~/.local/share/tensor-tutor" on Linux). Not created here."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def side_file_name(path: Path, tag: str = "corrupt") -> Path:
    """A free name `<name>.<tag>-<UTC timestamp>[-n]` beside `path`, for content set aside."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate = path.with_name(f"{path.name}.{tag}-{stamp}")
    counter = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.{tag}-{stamp}-{counter}")
        counter += 1
    return candidate


def _corrupt_name(path: Path) -> Path:
    return side_file_name(path, "corrupt")


def set_aside(path: Path, why: str) -> str:
    """Rename a damaged file to `<name>.corrupt-<UTC timestamp>`; return the warning to show."""
    try:
        target = _corrupt_name(path)
        os.replace(path, target)
    except OSError as error:
        return f"{path} is unreadable ({why}) and could not be moved aside ({error.strerror}); starting fresh"
    return f"{path.name} was unreadable ({why}); moved it to {target.name} and started fresh"


_JSON_KINDS: dict[type, str] = {dict: "an object", list: "a list"}


def read_json(path: Path, default: T, limit: int = STATE_FILE_LIMIT_BYTES) -> tuple[T, str | None]:
    """The JSON value stored at `path`, or a copy of `default` and a warning.

    A missing file is not a problem (default, None). Invalid JSON, JSON nested deeper than
    MAX_NESTING, a file over `limit` bytes, or JSON of another type than `default` (a list where an
    object belongs), is set aside (see set_aside). An unreadable file (permissions, a folder, FIFO
    or device in its place) is left where it is, and never opened in a way that could block.
    """
    path = Path(path)
    try:
        text = read_regular_text(path, limit)
    except FileNotFoundError:
        return copy.deepcopy(default), None
    except FileTooLargeError as error:
        return copy.deepcopy(default), set_aside(path, error.reason)
    except UnicodeDecodeError:
        return copy.deepcopy(default), set_aside(path, "not UTF-8 text")
    except OSError as error:
        return copy.deepcopy(default), f"cannot read {path} ({error.strerror or error}); using defaults"
    try:
        value = loads_json_bounded(text)
    except json.JSONDecodeError as error:
        return copy.deepcopy(default), set_aside(path, f"invalid JSON at line {error.lineno}")
    except TooDeepError as error:
        return copy.deepcopy(default), set_aside(path, f"JSON {error}")
    if default is not None and not isinstance(value, type(default)):
        expected = _JSON_KINDS.get(type(default), type(default).__name__)
        return copy.deepcopy(default), set_aside(path, f"expected {expected}, found {type(value).__name__}")
    return value, None


def write_regular_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path`, created or truncated, which must be a regular file: opened
    non-blocking and checked on the open descriptor, so a FIFO or device in its place is a
    NotAFileError (or ENXIO, a FIFO without a reader) rather than a write that blocks forever."""
    path = Path(path)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0),
                         0o644)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise NotAFileError(path)
        os.ftruncate(descriptor, 0)
        data = text.encode("utf-8")
        while data:
            written = os.write(descriptor, data)
            data = data[written:]
    finally:
        os.close(descriptor)


def write_json_atomic(path: Path, value: object) -> None:
    """Write `value` as JSON so that `path` always holds either the old or the new complete file.

    A temporary file in the same folder is written, flushed, fsynced and renamed over `path`
    (os.replace is atomic on POSIX and Windows). Raises OSError (the caller decides what to tell
    the user); the temporary file is removed on failure.
    """
    path = Path(path)
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where folders cannot be opened (Windows)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
