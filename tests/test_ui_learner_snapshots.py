"""SVG snapshots, at 80x24 and 120x40, of the screens that had none: a quiz verdict
scrolled into view, a long choice wrapped whole, a prediction's verdict, the bits explorer at 80
columns, the pipeline calculator with its bubble. (The lesson's
compact footer at 80 columns is in tests/test_ui_snapshots.py's small lesson.)
From the deterministic fakes (tests/ui_fakes.py, the learner lessons of tests/test_ui_learner.py).

Regenerate after an intended change of the look: pytest tests/test_ui_learner_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

import pytest


pytest.importorskip("pytest_textual_snapshot")

from textual.app import App
from textual.containers import VerticalScroll
from textual.widgets import Input, RadioButton
from tests.ui_fakes import fake_services

from tests.test_ui_learner import services
from tutor.lessons.model import Calc
from tutor.ui.app import TutorApp
from tutor.ui.widgets.calc import CalcBlock
from tutor.ui.widgets.predict import PredictBlock
from tutor.ui.widgets.quiz import QuizBlock

SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["small", "wide"])


@pytest.fixture(autouse=True)
def no_cursor_blink(monkeypatch):
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)


async def settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


async def answer_the_low_quiz_right(pilot) -> None:
    await pilot.pause()
    quiz = pilot.app.screen.query(QuizBlock).first()
    quiz.query_one("#answer", Input).focus(scroll_visible=False)
    pilot.app.screen.query_one("#lesson").scroll_home(animate=False)
    await pilot.pause()
    await pilot.press(*"65504", "enter")
    await settle(pilot)


@SIZES
def test_quiz_verdict_in_view(snap_compare, size):
    assert snap_compare(TutorApp(services(), lesson_id="learner/quiz-low"), terminal_size=size,
                        run_before=answer_the_low_quiz_right)


async def show_the_long_choice(pilot) -> None:
    await pilot.pause()
    quiz = pilot.app.screen.query(QuizBlock).last()
    quiz.query(RadioButton)[1].focus(scroll_visible=False)
    quiz.scroll_visible(animate=False, top=True)
    await settle(pilot)


@SIZES
def test_long_choice_wraps(snap_compare, size):
    assert snap_compare(TutorApp(services(), lesson_id="learner/quiz-low"), terminal_size=size,
                        run_before=show_the_long_choice)


async def commit_a_prediction(pilot) -> None:
    await pilot.pause()
    block = pilot.app.screen.query_one(PredictBlock)
    block.query_one("#guess", Input).focus()
    await pilot.press("3", "enter")
    await settle(pilot)
    block.scroll_visible(animate=False, top=True)
    await pilot.pause()


@SIZES
def test_prediction_verdict(snap_compare, size):
    assert snap_compare(TutorApp(fake_services(), lesson_id="precision/speed"), terminal_size=size,
                        run_before=commit_a_prediction)


def test_bits_explorer_at_80_columns(snap_compare):
    assert snap_compare(TutorApp(fake_services(), lesson_id="precision/bits"), terminal_size=(80, 24),
                        run_before=settle)


class PipelineCalcApp(App[None]):
    def compose(self):
        block = Calc("parallel", "llama-3.1-70b", ("model", "mode", "pp", "microbatches", "tp", "dp", "seq"),
                     {"model": "llama-3.1-70b", "mode": "train", "pp": 4, "microbatches": 8, "tp": 1, "dp": 1,
                      "seq": 4096}, id="c")
        with VerticalScroll():
            yield CalcBlock(block, lesson_id="parallelism/pipeline", services=fake_services())


async def scroll_to_the_bubble(pilot) -> None:
    await pilot.pause()
    pilot.app.query_one(VerticalScroll).scroll_end(animate=False)
    await pilot.pause()


@SIZES
def test_pipeline_calculator_bubble(snap_compare, size):
    """The bubble line at the end of the block, scrolled to at 80x24."""
    assert snap_compare(PipelineCalcApp(), terminal_size=size, run_before=scroll_to_the_bubble)
