"""Opening the tutor app: `tensor-tutor`, `tensor-tutor learn [LESSON_ID]` and each browser tab of `serve`.

Started straight from tutor/cli.py, without click (tutor/commands/learn.py is the same start as a
click command, for `--help` and completion). A lesson id that does not exist is a one-line error
(exit 2) before Textual starts, so a typo never flashes a full-screen app.
"""

from __future__ import annotations

import gc
import os
import sys

from tutor.errors import UserError

NO_TERMINAL = ("the tutor app needs a terminal (stdin and stdout are not both one); run `tensor-tutor serve` "
               "for the app in a browser, or a headless command: fit, models, env, bench, lab, lessons (--json for scripts)")


def _require_terminal() -> None:
    """A full-screen app on a pipe writes escape codes and waits for keys that never come: refuse instead.
    Under `tensor-tutor serve` the pipes are textual-serve's, which names its driver in TEXTUAL_DRIVER."""
    if os.environ.get("TEXTUAL_DRIVER"):
        return
    if not (_is_terminal(sys.stdin) and _is_terminal(sys.stdout)):
        raise UserError(NO_TERMINAL)


def _is_terminal(stream) -> bool:
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):  # a replaced or closed stream
        return False


def open_app(lesson_id: str | None) -> None:
    """Run the tutor app (at `lesson_id` when given) until the learner quits, then end the process.

    The cyclic collector is off until the home screen's first paint (TutorApp turns it back on
    once start-up's objects are frozen, tutor.ui.app.freeze_start_up_objects): importing Textual and
    the app makes objects, not garbage, and measured on the 2-core machine the collector's passes
    over them (121 of generations 0 and 1) took 14 ms of the ~210 ms to the first paint."""
    gc.disable()
    try:
        from tutor.ui.services import default_services

        services = default_services()
        if lesson_id is not None:
            # Raises UserError with close ids; tutor.cli turns it into one line and exit code 2.
            lesson_id = services.curriculum.lesson(lesson_id).info.id
        _require_terminal()
        from tutor.ui.app import TutorApp

        app = TutorApp(services, lesson_id=lesson_id)
        app.run()
    finally:
        gc.enable()  # an app that never painted, or a refused start, leaves the collector as it found it
    if app.shut_down:
        exit_without_teardown(app.return_code or 0)


def exit_without_teardown(code: int) -> None:
    """End the process once the app has shut down, skipping the interpreter's own teardown.

    After Textual restores the terminal the app has nothing left to do, but CPython's finalization
    (the final full collection over every object the app made, then module cleanup) took 0.9-1.0 s
    on the 2-core machine (measured with Ctrl+Q during a lesson's measurement: 0.31 s in the last
    gen-2 collection alone), a blank pane the learner waits on. atexit handlers still
    run and the standard streams are flushed; os._exit skips the rest (the Python docs' os._exit:
    "Exit the process ... without calling cleanup handlers, flushing stdio buffers, etc.").
    """
    import atexit

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass  # closed or replaced: nothing to flush
        os._exit(code)
