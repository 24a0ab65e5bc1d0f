"""A guess and a quiz answer typed in another unit, in the app: `800 MB/s` for a block in GB/s is
graded as 0.8 GB/s (it was read as 800 GB/s, "9.9e+02x too high"), and the block says what it read."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest


pytest.importorskip("textual")

from tests.ui_fakes import FakeCurriculum, FakeProbe, fake_services, sync, text_of, until

from tutor.labs import Measurement, ProbeResult
from tutor.lessons import expected_answer, grade
from tutor.lessons.model import Lesson, LessonInfo, Predict, Prose, Quiz, Track
from tutor.ui.app import TutorApp
from tutor.ui.widgets.predict import PredictBlock
from tutor.ui.widgets.quiz import QuizBlock

LESSON = "memory/bandwidth"


class BandwidthProbe(FakeProbe):
    """Measures 0.82 GB/s, at once."""

    def run(self, params: dict, progress: Any, cancel: threading.Event) -> ProbeResult:
        progress(1.0, "done")
        return ProbeResult(self.name, (Measurement("triad", 0.82, "GB/s", None, "none"),), {"triad_gbps": 0.82},
                           "0.82 GB/s")


def _services() -> Any:
    lesson = Lesson(LessonInfo(LESSON, "Bandwidth", "memory", 5, (), "GB/s"), (
        Prose("Memory moves bytes at a rate."),
        Predict("triad", "How fast does this machine stream memory?", "bandwidth", {}, "triad_gbps", "GB/s",
                explain="The triad reads two arrays and writes one."),
        Quiz("rate", "What rate did it measure, in GB/s?", "number", (), 0.82, None, 0.05, ("Look above.",), "",
             unit="GB/s"),
        Quiz("share", "What share of the step is the bubble, in %?", "number", (), 32.0, None, 0.02, ("3/8",), "",
             unit="%"),
    ))
    curriculum = FakeCurriculum((lesson,), (Track("memory", "Memory", "Bytes.", (LESSON,)),))
    return fake_services(curriculum=curriculum, probes={"bandwidth": BandwidthProbe("bandwidth")},
                         grade=grade, expected_answer=expected_answer)


async def _open(app: TutorApp, pilot: Any) -> None:
    app.open_lesson(LESSON)
    await pilot.pause()


@sync
async def test_a_guess_in_mb_per_s_is_graded_in_gb_per_s_and_says_so() -> None:
    services = _services()
    app = TutorApp(services)
    async with app.run_test(size=(120, 40)) as pilot:
        await _open(app, pilot)
        predict = app.screen.query_one(PredictBlock)
        predict.query_one("#guess").value = "800 MB/s"
        predict.query_one("#commit").press()
        await until(pilot, lambda: predict.query_one("#verdict").display, "the verdict")
        verdict = " ".join(text_of(predict.query_one("#verdict")).split())
        assert "read as 0.8 GB/s from '800 MB/s'" in verdict, verdict
        assert "well predicted" in verdict and "too high" not in verdict, verdict
        assert services.progress.predictions[-1][2] == pytest.approx(0.8)


@sync
async def test_a_guess_in_another_kind_is_one_line_and_nothing_runs() -> None:
    services = _services()
    app = TutorApp(services)
    async with app.run_test(size=(120, 40)) as pilot:
        await _open(app, pilot)
        predict = app.screen.query_one(PredictBlock)
        predict.query_one("#guess").value = "5 s"
        predict.query_one("#commit").press()
        await pilot.pause()
        status = " ".join(text_of(predict.query_one("#status")).split())
        assert "'5 s' is a time, but this answer is a rate in bytes per second" in status, status
        assert not services.probes["bandwidth"].calls and not services.progress.predictions


async def _answer(quiz: QuizBlock, pilot: Any, typed: str) -> str:
    quiz.query_one("#answer").value = typed
    await pilot.pause()
    quiz.check()
    await pilot.pause()
    return " ".join(text_of(quiz.query_one("#feedback")).split())


@sync
async def test_a_quiz_grades_800_mb_per_s_right_and_says_what_it_read() -> None:
    services = _services()
    app = TutorApp(services)
    async with app.run_test(size=(120, 40)) as pilot:
        await _open(app, pilot)
        rate, share = app.screen.query(QuizBlock)
        feedback = await _answer(rate, pilot, "800 MB/s")
        assert feedback.startswith("✓ right.") and "read as 0.8 GB/s from '800 MB/s'" in feedback, feedback
        # in a quiz in %, a bare 0.32 is 0.32%: graded, and said, so the learner sees why
        feedback = await _answer(share, pilot, "0.32")
        assert feedback.startswith("✗ not yet.") and "read as 0.32%" in feedback, feedback
        feedback = await _answer(share, pilot, "32%")
        assert feedback.startswith("✓ right."), feedback


@sync
async def test_a_quiz_answer_in_another_kind_is_not_an_attempt() -> None:
    services = _services()
    app = TutorApp(services)
    async with app.run_test(size=(120, 40)) as pilot:
        await _open(app, pilot)
        rate = app.screen.query(QuizBlock).first()
        feedback = await _answer(rate, pilot, "5 s")
        assert "'5 s' is a time" in feedback and "not yet" not in feedback, feedback
        assert rate.attempts == 0 and not services.progress.answers
