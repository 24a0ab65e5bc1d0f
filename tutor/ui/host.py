"""The TutorApp a widget runs in, typed: the app-wide state that widgets share (the probe measuring
now, the results kept this session, the measurement process's state) is reached through it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tutor.ui.app import TutorApp


def tutor_app(app: object) -> TutorApp | None:
    """`app` as the TutorApp it is; None in another host (a test's app that mounts one widget)."""
    from tutor.ui.app import TutorApp  # imported here: tutor.ui.app imports every screen and widget

    return app if isinstance(app, TutorApp) else None
