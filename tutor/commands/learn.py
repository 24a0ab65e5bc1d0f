"""`tensor-tutor learn [LESSON_ID]`: open the tutor app, at the home screen or at a lesson.

A lesson id that does not exist is a one-line error (exit 2) before Textual starts, so a typo
never flashes a full-screen app.
"""

from __future__ import annotations

import click


@click.command("learn")
@click.argument("lesson_id", required=False)
def learn(lesson_id: str | None) -> None:
    """Open the tutor app (at LESSON_ID, e.g. precision/bits-of-a-float, if given)."""
    from tutor.ui.services import default_services

    services = default_services()
    if lesson_id is not None:
        # Raises UserError with close ids; tutor.cli turns it into one line and exit code 2.
        lesson_id = services.curriculum.lesson(lesson_id).info.id
    from tutor.ui.app import TutorApp

    TutorApp(services, lesson_id=lesson_id).run()
