"""The `tensor-tutor` command line.

The app opens straight from here (`tensor-tutor`, `tensor-tutor learn [LESSON_ID]`): the learner
meets its home screen sooner without click's import and parse in front of it (the launch
goal). Every other command line goes through the click group of tutor/commands/group.py.
"""

from __future__ import annotations

import codecs
import errno
import os
import sys
from collections.abc import Mapping

from tutor.errors import UserError

COMPLETION_ENV = "_TENSOR_TUTOR_COMPLETE"
"""Set by the shell asking click for completions (click's `_{PROG}_COMPLETE`): click must answer it."""

MIN_TERMINAL_COLUMNS = 20
"""Narrower than this is no terminal: a COLUMNS of 0 made Rich print nothing at all (exit 0, no answer)."""


def drop_unusable_terminal_size() -> None:
    """Remove COLUMNS / LINES values that are not a usable size (0, negative, text), so Rich measures the
    terminal itself (80 columns when it is not one) instead of drawing into zero columns."""
    for name, least in (("COLUMNS", MIN_TERMINAL_COLUMNS), ("LINES", 1)):
        value = os.environ.get(name)
        if value is not None and not (value.strip().isdigit() and int(value) >= least):
            del os.environ[name]


def opens_the_app(args: list[str], environ: Mapping[str, str]) -> bool:
    """Whether `args` is the app's own command line, which click would parse the same way: no words, or
    `learn` with at most a lesson id; no option (`--help` and the like are click's), no completion."""
    from tutor.commands.registry import COMMANDS

    if COMPLETION_ENV in environ or "learn" not in COMMANDS:
        return False
    if not args:
        return True
    return args[0] == "learn" and len(args) <= 2 and not any(word.startswith("-") for word in args[1:])


def tolerate_narrow_encoding() -> None:
    """Let a stdout whose encoding is not Unicode (PYTHONIOENCODING=ascii, a C locale on an old system) print
    what it can: the answer with '?' for the characters it lacks (×, µ, box lines), and one line on stderr
    saying why, rather than a UnicodeEncodeError in the middle of a table."""
    stream = sys.stdout
    encoding = getattr(stream, "encoding", None)
    if not encoding or not hasattr(stream, "reconfigure"):
        return
    try:
        unicode = codecs.lookup(encoding).name.startswith("utf")
    except LookupError:
        unicode = False
    if unicode:
        return
    stream.reconfigure(errors="replace")
    print(f"tensor-tutor: note: the output's encoding ({encoding}) lacks some characters; they print as '?' "
          "(PYTHONIOENCODING=utf-8 or a UTF-8 locale shows them)", file=sys.stderr)


def _stdout_failed(error: OSError) -> int:
    """One line for an output that cannot be written (a full disk, a closed stream, a terminal gone) and the
    exit code; a reader that left (`| head`) is no error worth a line, as for any shell tool: quiet, exit 1 (what
    Rich's Console.on_broken_pipe does for the tables it prints)."""
    try:  # stdout's buffer still holds what failed: later writes and the exit's flush go nowhere
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    if error.errno == errno.EPIPE:
        return 1
    print(f"tensor-tutor: error: could not write the output: {error.strerror or error}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input becomes one line on stderr and exit code 2, never a traceback; an output that
    cannot be written is one line and exit code 1."""
    drop_unusable_terminal_size()
    if sys.stdout is None:  # started with stdout closed (`>&-`): nothing could show the answer
        print("tensor-tutor: error: no output: stdout is closed", file=sys.stderr)
        sys.exit(1)
    tolerate_narrow_encoding()
    code: str | int | None = 0
    try:
        try:
            _run(argv)
        except SystemExit as exit_:
            code = exit_.code
        sys.stdout.flush()
    except OSError as error:
        if error.errno not in (errno.EPIPE, errno.ENOSPC, errno.EIO, errno.EBADF,
                                                      errno.EDQUOT, errno.EFBIG):
            raise
        code = _stdout_failed(error)
    if code:
        sys.exit(code)


def _run(argv: list[str] | None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    if opens_the_app(args, os.environ):
        from tutor.commands.app_start import open_app

        try:
            open_app(args[1] if len(args) > 1 else None)
        except UserError as error:
            from tutor.safe_text import plain

            print(f"tensor-tutor: error: {plain(error)}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:  # Ctrl+C before the app takes the keys: what click says of it (Abort)
            print("tensor-tutor: cancelled", file=sys.stderr)
            sys.exit(130)
        return
    from tutor.commands.group import run

    run(args)
