"""SVG snapshots, at 80x24 and 120x40, of the learner's place kept across sessions: Home with blocks
done per lesson and per track, and a reopened lesson whose quiz answers and prediction were saved
(each block showing the answer, the measured value and the verdict as when it was given).
From the deterministic fakes (tests/ui_fakes.py).

Regenerate after an intended change of the look: pytest tests/test_ui_place_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

import pytest


pytest.importorskip("pytest_textual_snapshot")

from textual.widgets import Input
from tests.ui_fakes import LESSONS, FakeProgress, fake_machine, fake_services

from tutor.ui.app import TutorApp

SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["small", "wide"])


@pytest.fixture(autouse=True)
def no_cursor_blink(monkeypatch):
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)


def progress_after_a_session() -> FakeProgress:
    """A learner who answered both quizzes of precision/bits (the choice right, the number wrong) and
    predicted, then measured, the speedup of precision/speed, as a restarted app reads them."""
    from tutor.lessons.learner import learner_view

    progress = FakeProgress()
    quiz = next(block for block in LESSONS[0].blocks if block.id == "bf16-range")
    shown = learner_view(quiz, learner_id=progress.learner_id, lesson_id="precision/bits", device=fake_machine())
    progress.record_answer("precision/bits", "bf16-range", str(shown.answer), True)  # its index as this learner sees them
    progress.mark_block("precision/bits", "bf16-range")
    progress.record_answer("precision/bits", "fp16-max", "60000", False)
    progress.record_prediction("precision/speed", "bf16-speedup", 0.5, 0.25, typed="1/2")
    progress.mark_block("precision/speed", "bf16-speedup")
    progress.mark_block("precision/speed", "measure-1")
    progress.mark_completed("precision/speed")
    return progress


def app(lesson_id: str | None = None) -> TutorApp:
    return TutorApp(fake_services(progress=progress_after_a_session()), lesson_id=lesson_id)


def scroll_to(block_id: str):
    """Bring one block to the top of the lesson, as the learner scrolling back to it would."""
    async def run_before(pilot) -> None:
        from tutor.ui.widgets.block import LessonBlock

        await pilot.pause()
        block = next(block for block in pilot.app.screen.query(LessonBlock) if block.block_id == block_id)
        block.scroll_visible(animate=False, top=True, immediate=True)
        await pilot.pause()
        await pilot.pause()

    return run_before


@SIZES
def test_home_counts_blocks_done(snap_compare, size):
    assert snap_compare(app(), terminal_size=size)


@SIZES
def test_reopened_quizzes_show_the_saved_answers(snap_compare, size):
    assert snap_compare(app("precision/bits"), run_before=scroll_to("bf16-range"), terminal_size=size)


@SIZES
def test_reopened_prediction_shows_the_guess_measurement_and_verdict(snap_compare, size):
    assert snap_compare(app("precision/speed"), run_before=scroll_to("bf16-speedup"), terminal_size=size)
