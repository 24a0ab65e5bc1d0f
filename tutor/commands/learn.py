"""`tensor-tutor learn [LESSON_ID]`: open the tutor app, at the home screen or at a lesson.

tutor/cli.py opens the app without click for the command lines it recognises (tutor/commands/app_start.py);
this click command is the same start for click's own paths (`tensor-tutor` with the app's table entry
replaced, completion, `--help`).
"""

from __future__ import annotations

import click

from tutor.commands.app_start import open_app


@click.command("learn")
@click.argument("lesson_id", required=False)
def learn(lesson_id: str | None) -> None:
    """Open the tutor app (at LESSON_ID, e.g. precision/bits-of-a-float, if given)."""
    open_app(lesson_id)
