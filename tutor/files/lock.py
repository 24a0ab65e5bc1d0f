"""A lock between processes around a file's read-merge-write (progress.json, settings.json).

os.replace keeps each write whole, but two processes that both read, merge and write can still lose
one another's update (3 processes x 150 progress updates lost 7). The lock is an OS lock on a side file
`<name>.lock` (fcntl.flock on POSIX, msvcrt.locking on Windows), released by the OS if the holder dies.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOCK_TIMEOUT_S = 10.0
"""How long a writer waits for another before it gives up (OSError: the caller keeps working in memory)."""


def lock_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.lock")


@contextmanager
def locked(path: Path, timeout_s: float = LOCK_TIMEOUT_S) -> Iterator[str | None]:
    """Hold the lock of `path` (creating its folder and lock file); OSError when it cannot be taken.

    Yields None, or the one line to show when a link in the lock file's place was moved aside: the
    lock file is opened with O_NOFOLLOW in a folder that passed safe_folder, so taking a lock never
    creates or opens a file outside the data folder.
    """
    from tutor.files.storage import SymlinkError, move_aside, open_nofollow, safe_folder

    target = lock_path(Path(path))
    safe_folder(target.parent)
    # Non-blocking open and a regular-file check: a FIFO or device put in the lock file's place
    # must give an OSError (the caller keeps working in memory), not a hang or a lock on a tty.
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0)
    note = None
    try:
        descriptor = open_nofollow(target, flags, 0o600)
    except SymlinkError as error:
        note = move_aside(target, f"a symbolic link to {error.link_target}", "symlink")
        descriptor = open_nofollow(target, flags, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            from tutor.files.storage import NotAFileError

            raise NotAFileError(target)
        _acquire(descriptor, timeout_s, target)
        try:
            yield note
        finally:
            _release(descriptor)
    finally:
        os.close(descriptor)


if sys.platform == "win32":
    import msvcrt

    def _acquire(descriptor: int, timeout_s: float, target: Path) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                os.lseek(descriptor, 0, os.SEEK_SET)
                msvcrt.locking(descriptor, msvcrt.LK_NBLCK, 1)
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def _release(descriptor: int) -> None:
        os.lseek(descriptor, 0, os.SEEK_SET)
        msvcrt.locking(descriptor, msvcrt.LK_UNLCK, 1)

else:
    import fcntl

    def _acquire(descriptor: int, timeout_s: float, target: Path) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"another tensor-tutor has held {target.name} for {timeout_s:g} s") from None
                time.sleep(0.005)

    def _release(descriptor: int) -> None:
        fcntl.flock(descriptor, fcntl.LOCK_UN)
