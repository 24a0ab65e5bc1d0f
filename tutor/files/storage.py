"""Where tensor-tutor keeps the learner's files (progress, settings), and how it writes them safely.

Writes are atomic (a temporary file in the same folder, fsync, os.replace), so a crash or a second
app instance never leaves half a file. A file that cannot be parsed is renamed aside to
`<name>.corrupt-<UTC timestamp>` and the caller gets its default plus a one-line warning: losing
progress is bad, refusing to start is worse.

Nothing in the data folder is written through a link (the safe file layer below): every file the tool
writes, appends to or locks there is opened with O_NOFOLLOW, a symbolic link (or a second hard link)
in its place is renamed aside, never followed, so whatever it points to is untouched, and a sub-folder
that is a link is refused. The data folder itself may be a link (moving it is the learner's choice),
but the folder it leads to must be one the user owns (or root's) and not writable by every user: as
root, tensor-tutor writes into no other user's folder, where they could plant links.
"""

from __future__ import annotations

import copy
import errno
import json
import os
import stat
import sys
import tempfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from tutor.files.untrusted import (CPYTHON_INT_DIGITS, MAX_CHARS, MAX_NESTING, StringPolicy, UntrustedDataError, loads_json,
                             loads_toml)

DATA_DIR_ENV = "TENSOR_TUTOR_DATA_DIR"
APP_NAME = "tensor-tutor"

T = TypeVar("T")

STATE_FILE_LIMIT_BYTES = 16 << 20
"""The most progress.json or settings.json may hold: a hand-made giant is set aside, not read."""


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
    """TOML nested deeper than MAX_NESTING, as loads_toml_bounded says it (the lesson loader's wording)."""


class UnsafePathError(OSError):
    """A path under the data folder that tensor-tutor will not write through (a link, a folder others
    may write in). `reason` is the one line to show (also the strerror)."""

    def __init__(self, path: Path, reason: str) -> None:
        self.reason = reason
        super().__init__(errno.EPERM, reason, str(path))


class SymlinkError(UnsafePathError):
    """A symbolic link where tensor-tutor keeps a file or folder of its own: never followed."""

    def __init__(self, path: Path) -> None:
        from tutor.safe_text import plain

        try:
            self.link_target = plain(os.readlink(path))
        except OSError:
            self.link_target = "?"
        super().__init__(path, f"a symbolic link (to {self.link_target}), which tensor-tutor does not follow "
                               "in its data folder")


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)


def open_nofollow(path: Path, flags: int, mode: int = 0o600) -> int:
    """os.open that never follows a symbolic link in the last place of `path`: SymlinkError instead.
    Where the OS has no O_NOFOLLOW (Windows) the link is looked for first (a race the folder checks
    of safe_folder leave to the user themself)."""
    if not _NOFOLLOW and os.path.islink(path):
        raise SymlinkError(Path(path))
    try:
        return os.open(path, flags | _NOFOLLOW | _CLOEXEC | _BINARY, mode)
    except OSError as error:
        # Linux and macOS say ELOOP for a link under O_NOFOLLOW, FreeBSD EMLINK.
        if error.errno in (errno.ELOOP, errno.EMLINK) and os.path.islink(path):
            raise SymlinkError(Path(path)) from None
        raise


def read_regular_bytes(path: Path, limit: int, follow_symlinks: bool | None = None) -> bytes:
    """The bytes of `path`, which must be a regular file of at most `limit` bytes.

    FileNotFoundError when absent; NotAFileError for a FIFO, device or socket in its place (checked
    with os.stat before opening, and again on the open descriptor, which is opened non-blocking so a
    FIFO swapped in between cannot hang the open); FileTooLargeError over `limit`. A symbolic link is
    followed only where `follow_symlinks` says so; by default (None) everywhere but under the data and
    cache folders, where it is a SymlinkError (model folders and lessons may well be links).
    """
    path = Path(path)
    if follow_symlinks is None:
        follow_symlinks = managed_root(path) is None
    if not stat.S_ISREG((os.stat(path) if follow_symlinks else os.lstat(path)).st_mode):
        if not follow_symlinks and os.path.islink(path):
            raise SymlinkError(path)
        raise NotAFileError(path)
    flags = os.O_RDONLY | _NONBLOCK
    descriptor = (os.open(path, flags | _BINARY | _CLOEXEC) if follow_symlinks
                  else open_nofollow(path, flags))
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


def read_regular_text(path: Path, limit: int, follow_symlinks: bool | None = None) -> str:
    """read_regular_bytes decoded as UTF-8 with universal newlines (what Path.read_text gives);
    UnicodeDecodeError when it is not UTF-8."""
    text = read_regular_bytes(path, limit, follow_symlinks).decode("utf-8")
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_checked_json(path: Path, *, what: str | None = None, max_bytes: int, follow_symlinks: bool | None = None,
                      strings: StringPolicy = "refuse", max_chars: int = MAX_CHARS) -> Any:
    """The JSON in the file at `path`, read by read_regular_bytes (bounded, never blocking on a FIFO, a link
    followed as it says) and parsed by tutor.files.untrusted.loads_json, named `what` (the file's name by default).
    OSError for a file that cannot be read (the caller words it); UntrustedDataError (one line naming the
    file and the field) for content refused."""
    path = Path(path)
    data = read_regular_bytes(path, max_bytes, follow_symlinks)
    return loads_json(data, what=what or path.name, max_bytes=max_bytes, strings=strings, max_chars=max_chars)


def loads_toml_bounded(text: str) -> dict[str, Any]:
    """tutor.files.untrusted.loads_toml for the lesson loader, in the errors it has always caught: nesting deeper
    than MAX_NESTING is a TooDeepError, everything else refused (tomllib's own errors, an integer past
    CPython's digit limit, inf or nan) a tomllib.TOMLDecodeError with tomllib's message where it gave one.
    Control characters are kept: the loader shows them as escapes itself."""
    import tomllib

    from tutor.files.untrusted import TooDeepError as Deep

    try:
        return loads_toml(text, what="TOML", max_bytes=max(len(text), 1), strings="keep")
    except Deep as error:
        raise TooDeepError(error.reason) from None
    except UntrustedDataError as error:
        raise tomllib.TOMLDecodeError(error.detail or error.field_reason) from None


def data_dir() -> Path:
    """The folder for progress.json, settings.json and results: $TENSOR_TUTOR_DATA_DIR if set,
    else platformdirs' user data dir ("~/.local/share/tensor-tutor" on Linux). Not created here."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir(APP_NAME, appauthor=False))


def cache_dir() -> Path:
    """The folder for caches: $TENSOR_TUTOR_DATA_DIR/cache if that is set, else platformdirs' user
    cache dir ("~/.cache/tensor-tutor" on Linux). Not created here."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override).expanduser() / "cache"
    import platformdirs

    return Path(platformdirs.user_cache_dir(APP_NAME, appauthor=False))


def managed_root(path: Path) -> Path | None:
    """The folder of tensor-tutor's own files (data_dir() or cache_dir()) that `path` is in or is,
    compared by name (a data folder that is itself a link still counts); None outside both."""
    target = os.path.abspath(Path(path).expanduser())
    for root in (data_dir(), cache_dir()):
        folder = os.path.abspath(root)
        if target == folder or target.startswith(folder.rstrip(os.sep) + os.sep):
            return Path(folder)
    return None


def _check_root(root: Path) -> None:
    """Create `root` (mode 0700) when missing; refuse one that is no folder, is owned by another user
    (root's own folders are fine), or that every user may write in (UnsafePathError). The root may be
    reached through a link: that is where the learner chose to keep their files."""
    try:
        info = os.stat(root)
    except FileNotFoundError:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(root)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(root))
    geteuid = getattr(os, "geteuid", None)
    if geteuid is not None and info.st_uid not in (geteuid(), 0):
        raise UnsafePathError(root, f"{root} belongs to another user (uid {info.st_uid}); tensor-tutor writes "
                                    f"only in a folder of yours: set {DATA_DIR_ENV} to one")
    if info.st_mode & stat.S_IWOTH and sys.platform != "win32":
        raise UnsafePathError(root, f"every user may write in {root}, so anyone could put a link there; "
                                    f"run chmod o-w on it or set {DATA_DIR_ENV} to a folder of yours")


def safe_folder(folder: Path) -> None:
    """Make sure `folder` exists and may be written in safely, creating what is missing (mode 0700).

    Its root (data_dir() or cache_dir() when `folder` is under one, else `folder` itself) passes
    _check_root; each sub-folder below the root must be a real folder, not a link (SymlinkError),
    so no file is ever created outside the data folder through a planted `cache` link.
    """
    folder = Path(os.path.abspath(Path(folder).expanduser()))
    root = managed_root(folder) or folder
    _check_root(root)
    current = root
    for part in folder.relative_to(root).parts:
        current = current / part
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            try:
                os.mkdir(current, 0o700)
            except FileExistsError:
                pass
            info = os.lstat(current)
        if stat.S_ISLNK(info.st_mode):
            raise SymlinkError(current)
        if not stat.S_ISDIR(info.st_mode):
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(current))


def move_aside(path: Path, what: str, tag: str) -> str:
    """Rename what is at `path` (a link, a second hard link: never opened) to a side file and return
    the one line that says so; a link moved keeps pointing where it did. OSError when it cannot."""
    side = side_file_name(path, tag)
    os.rename(path, side)
    return (f"{path.name} was {what}; moved it to {side.name}, untouched (tensor-tutor writes only files "
            "of its own in its data folder)")


def open_for_append(path: Path, mode: int = 0o644) -> tuple[int, str | None]:
    """An O_RDWR | O_APPEND descriptor on `path`, a regular file of tensor-tutor's own (created when
    missing), and None or the one line saying what was moved aside first.

    The folder passes safe_folder; the file is opened with O_NOFOLLOW and non-blocking, then checked
    on the descriptor: a symbolic link in its place, or a regular file with a second hard link (an
    append would change the other name's file too), is renamed aside and a fresh file made; a FIFO,
    device or folder is a NotAFileError. Nothing is ever truncated or appended to outside the folder.
    """
    path = Path(path)
    safe_folder(path.parent)
    notes: list[str] = []
    for _ in range(3):  # each pass moves one thing aside; a third is someone racing us
        try:
            descriptor = open_nofollow(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | _NONBLOCK, mode)
        except SymlinkError as error:
            notes.append(move_aside(path, f"a symbolic link to {error.link_target}", "symlink"))
            continue
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            os.close(descriptor)
            raise NotAFileError(path)
        if info.st_nlink > 1:
            os.close(descriptor)
            notes.append(move_aside(path, f"a file with {info.st_nlink} hard links (appending would change "
                                          "the other names' file too)", "linked"))
            continue
        return descriptor, "; ".join(notes) or None
    raise UnsafePathError(path, f"{path} kept being replaced while it was opened")


def side_file_name(path: Path, tag: str = "corrupt") -> Path:
    """A free name `<name>.<tag>-<UTC timestamp>[-n]` beside `path`, for content set aside."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate = path.with_name(f"{path.name}.{tag}-{stamp}")
    counter = 1
    while os.path.lexists(candidate):  # a dangling link is a name taken too
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


def _refusal(error: UntrustedDataError) -> str:
    """Why a state file was set aside, in the words of set_aside's line: "invalid JSON (line 3, ...)",
    "JSON nested deeper than 64 levels", "quiz.q1 holds a lone surrogate escape ..."."""
    if error.reason.startswith("is not valid JSON"):
        return "invalid JSON" + error.reason.removeprefix("is not valid JSON")
    if error.reason.startswith("nested deeper"):
        return "JSON " + error.reason
    return error.field_reason


def read_json(path: Path, default: T, limit: int = STATE_FILE_LIMIT_BYTES) -> tuple[T, str | None]:
    """The JSON value stored at `path`, or a copy of `default` and a warning.

    A missing file is not a problem (default, None). Invalid JSON, JSON nested deeper than
    MAX_NESTING, an integer past CPython's 4,300 digits, a lone surrogate (no later save could encode
    it), a file over `limit` bytes, or JSON of another type than `default` (a list where an object
    belongs), is set aside (see set_aside); tutor.files.untrusted.loads_json reads it. An unreadable file (permissions, a folder, FIFO
    or device in its place) is left where it is, and never opened in a way that could block.
    """
    path = Path(path)
    try:
        text = read_regular_text(path, limit, follow_symlinks=False)
    except FileNotFoundError:
        return copy.deepcopy(default), None
    except SymlinkError as error:
        try:
            return copy.deepcopy(default), move_aside(path, f"a symbolic link to {error.link_target}",
                                                       "symlink") + "; started fresh"
        except OSError as moving:
            return copy.deepcopy(default), (f"{path} is {error.reason}, and could not be moved aside "
                                            f"({moving.strerror or moving}); using defaults")
    except FileTooLargeError as error:
        return copy.deepcopy(default), set_aside(path, error.reason)
    except UnicodeDecodeError:
        return copy.deepcopy(default), set_aside(path, "not UTF-8 text")
    except OSError as error:
        return copy.deepcopy(default), f"cannot read {path} ({error.strerror or error}); using defaults"
    try:
        # Control characters, NaN, integers up to CPython's limit and text up to the file's size are kept:
        # each store cleans its own fields, so one odd value costs that value, not the file. A lone surrogate is refused (the next
        # save could not encode it), and an integer past CPython's limit (it could never be printed).
        value = loads_json(text, what=path.name, max_bytes=limit, strings="keep", non_finite="keep",
                           max_digits=CPYTHON_INT_DIGITS, max_chars=limit)
    except UntrustedDataError as error:
        return copy.deepcopy(default), set_aside(path, _refusal(error))
    if default is not None and not isinstance(value, type(default)):
        expected = _JSON_KINDS.get(type(default), type(default).__name__)
        return copy.deepcopy(default), set_aside(path, f"expected {expected}, found {type(value).__name__}")
    return value, None


def write_regular_text(path: Path, text: str) -> None:
    """Write `text` (UTF-8) to `path`, created or truncated, which must be a regular file: opened
    non-blocking and checked on the open descriptor, so a FIFO or device in its place is a
    NotAFileError (or ENXIO, a FIFO without a reader) rather than a write that blocks forever.
    Under the data or cache folder (an export's default folder) the folder passes safe_folder and a
    link in `path`'s place is a SymlinkError; elsewhere (a path the learner named) it is followed."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | _NONBLOCK
    if managed_root(path) is not None:
        safe_folder(path.parent)
        descriptor = open_nofollow(path, flags, 0o644)
    else:
        descriptor = os.open(path, flags | _BINARY | _CLOEXEC, 0o644)
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
    the user); the temporary file is removed on failure. The folder passes safe_folder first. The
    rename replaces a link in `path`'s place, never writing through it: whatever it pointed to is
    untouched (read_json, which every read-merge-write runs first, has moved a link aside already).
    """
    path = Path(path)
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    safe_folder(path.parent)
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
