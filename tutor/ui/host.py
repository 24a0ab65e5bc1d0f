"""The app-wide state widgets read, typed as a protocol: the probe measuring now, the latest result, the
results kept this session, the measurement process's state, the services. A widget reaches it through
Textual's own `self.app`, checked against `TutorAppState`; it never imports the app (which imports every
screen and widget) and never assigns these attributes: it posts a message (measure.ProbeRunner.Claimed,
Released, Measured) and the app, which owns the state, updates it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from tutor.labs import ProbeResult
    from tutor.ui.services import Services
    from tutor.worker.client import WorkerState


@runtime_checkable
class TutorAppState(Protocol):
    """What TutorApp holds for its widgets (tutor.ui.app.TutorApp implements it). isinstance() checks that each
    member exists, so no member here may be a property that does work when read (TutorApp.measured_results
    imports the measure widget: measure.result_store reads it itself)."""

    services: Services
    active_runner: Any
    """The ProbeRunner measuring now, or None: one probe runs at a time (two would measure each other)."""
    last_result: ProbeResult | None
    worker_state: WorkerState

    def action_home(self) -> None: ...

    def action_fit(self) -> None: ...

    def action_bench(self, run: bool = False) -> None: ...

    def open_lesson(self, lesson_id: str, resume: bool = False) -> None: ...


def tutor_app(app: object) -> TutorAppState | None:
    """`app` as the tensor-tutor app it is; None in another host (a test's app that mounts one widget)."""
    return app if isinstance(app, TutorAppState) else None
