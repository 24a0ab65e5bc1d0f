"""The exercise block in the app: the starting point fails with a hint, the learner's
fix passes with the explanation, and the lesson records it as solved."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest


pytest.importorskip("textual")

from tests.test_ui_lessons import real_services, text_of
from tests.ui_fakes import until
from textual.widgets import TextArea

from tutor.labs.exercise import EXERCISE
from tutor.ui.app import TutorApp
from tutor.ui.widgets.exercise import ExerciseBlock

LESSON = "parallelism/pipeline-parallel"


async def _checked(block: ExerciseBlock, pilot, text: str) -> str:
    """Type `text`, press Check, and wait for the check's verdict (the event under test)."""
    block.query_one("#answer", TextArea).text = text
    before = block.result
    block.query_one("#check").press()
    await until(pilot, lambda: block.result is not before and not block.running, "the check's verdict")
    return text_of(block.query_one("#status"))


def test_an_exercise_fails_with_a_hint_then_passes_when_fixed(tmp_path: Path) -> None:
    async def scenario() -> None:
        services = real_services(tmp_path)
        services.probes["exercise"] = EXERCISE  # the real check: a pure simulation, no torch
        app = TutorApp(services)
        async with app.run_test(size=(120, 40)) as pilot:
            app.open_lesson(LESSON)
            await pilot.pause()
            block = app.screen.query_one(ExerciseBlock)
            assert block.query_one("#answer", TextArea).text == block.block.start
            status = await _checked(block, pilot, block.block.start)
            assert status.startswith("✗ stage 0 holds 4 micro-batches")
            assert "hint 1:" in text_of(block.query_one("#hints")) and not block.query_one("#explain").display
            status = await _checked(block, pilot, block.block.solution)
            assert status.startswith("✓ right")
            assert text_of(block.query_one("#explain")).startswith("Why: This is 1F1B")
            assert block.block.id in services.progress.lesson_state(LESSON).done_blocks

    asyncio.run(scenario())
