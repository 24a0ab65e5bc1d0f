"""Where tensor-tutor keeps the learner's files (progress, settings), and how it writes them safely.

Writes are atomic (a temporary file in the same folder, fsync, os.replace), so a crash or a second
app instance never leaves half a file. A file that cannot be parsed is renamed aside to
`<name>.corrupt-<UTC timestamp>` and the caller gets its default plus a one-line warning: losing
progress is bad, refusing to start is worse.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

DATA_DIR_ENV = "TENSOR_TUTOR_DATA_DIR"
APP_NAME = "tensor-tutor"

T = TypeVar("T")


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


def read_json(path: Path, default: T) -> tuple[T, str | None]:
    """The JSON value stored at `path`, or a copy of `default` and a warning.

    A missing file is not a problem (default, None). Invalid JSON, or JSON of another type than
    `default` (a list where an object belongs), is set aside (see set_aside). An unreadable file
    (permissions, a folder in its place) is left where it is.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return copy.deepcopy(default), None
    except (OSError, UnicodeDecodeError) as error:
        if isinstance(error, UnicodeDecodeError):
            return copy.deepcopy(default), set_aside(path, "not UTF-8 text")
        return copy.deepcopy(default), f"cannot read {path} ({error.strerror or error}); using defaults"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        return copy.deepcopy(default), set_aside(path, f"invalid JSON at line {error.lineno}")
    if default is not None and not isinstance(value, type(default)):
        expected = _JSON_KINDS.get(type(default), type(default).__name__)
        return copy.deepcopy(default), set_aside(path, f"expected {expected}, found {type(value).__name__}")
    return value, None


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
