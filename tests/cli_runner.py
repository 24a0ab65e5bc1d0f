"""Running the CLI in-process, as the tests of every command do."""

from __future__ import annotations

import contextlib
import io

from tutor.cli import main


def run(argv: list[str]) -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr). Any exception other than SystemExit fails."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return code, out.getvalue(), err.getvalue()
