"""`tensor-tutor learn [LESSON_ID]`: open the tutor app, at the home screen or at a lesson.

A lesson id that does not exist is a one-line error (exit 2) before Textual starts, so a typo
never flashes a full-screen app.
"""

from __future__ import annotations

import os
import sys

import click

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


@click.command("learn")
@click.argument("lesson_id", required=False)
def learn(lesson_id: str | None) -> None:
    """Open the tutor app (at LESSON_ID, e.g. precision/bits-of-a-float, if given)."""
    from tutor.ui.services import default_services

    services = default_services()
    if lesson_id is not None:
        # Raises UserError with close ids; tutor.cli turns it into one line and exit code 2.
        lesson_id = services.curriculum.lesson(lesson_id).info.id
    _require_terminal()
    from tutor.ui.app import TutorApp

    TutorApp(services, lesson_id=lesson_id).run()
