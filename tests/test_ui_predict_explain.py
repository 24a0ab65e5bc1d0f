"""Every predict block of the real curriculum closes: after the verdict the learner reads
the block's explanation, with their guess and the measured value above it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest


pytest.importorskip("textual")

from tests.ui_fakes import real_services, text_of, until, walk_lessons

from tutor.lessons.model import Predict
from tutor.ui.widgets.predict import PredictBlock

pytestmark = pytest.mark.slow


async def _wait_for_verdict(predict: PredictBlock, pilot) -> None:
    """Until the verdict is shown (the event this test checks); the limit only catches a hang."""
    await until(pilot, lambda: predict.query_one("#verdict").display, f"the verdict of {predict.block.id}")


def test_every_prediction_is_followed_by_its_explanation(tmp_path: Path) -> None:
    async def scenario() -> int:
        services = real_services(tmp_path)
        with_predicts = [info.id for info in services.curriculum.lessons
                         if any(isinstance(b, Predict) for b in services.curriculum.lesson(info.id).blocks)]
        shown = 0
        async for lesson_id, screen, pilot in walk_lessons(services, with_predicts):
            for predict in screen.query(PredictBlock):
                assert predict.query_one("#explain").display is False  # not before the measurement
                predict.query_one("#guess").value = "1"
                predict.query_one("#commit").press()
                await _wait_for_verdict(predict, pilot)
                verdict = text_of(predict.query_one("#verdict"))
                assert "you predicted" in verdict and "measured 2" in verdict, lesson_id
                explain = text_of(predict.query_one("#explain"))
                assert predict.block.explain, (lesson_id, predict.block.id)
                assert explain.startswith("Why: ") and predict.block.explain[:40] in " ".join(explain.split()), (
                    lesson_id, predict.block.id, explain)
                shown += 1
        return shown

    from tutor.lessons.loader import load_curriculum

    curriculum = load_curriculum()
    predicts = sum(isinstance(block, Predict) for lesson_id in curriculum.lesson_ids
                   for block in curriculum.lesson(lesson_id).blocks)
    assert predicts >= 34 and asyncio.run(scenario()) == predicts
