"""Every lesson of the real curriculum opened in the app and worked through: prose renders, each
quiz accepts its own reference answer through the UI, each calculator computes, each measure and
predict block runs (fake probes under the real probe names), and the lesson ends completed."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest


from tests.ui_fakes import real_services, text_of, until, walk_lessons

lessons = pytest.importorskip("tutor.lessons")
labs = pytest.importorskip("tutor.labs")

from textual.widgets import RadioButton, Static

from tutor.ui.app import TutorApp
from tutor.ui.screens.lesson import LessonScreen
from tutor.ui.services import Services
from tutor.ui.widgets.bits import BitsBlock
from tutor.ui.widgets.calc import CalcBlock
from tutor.ui.widgets.exercise import ExerciseBlock
from tutor.ui.widgets.measure import MeasureBlock
from tutor.ui.widgets.predict import PredictBlock
from tutor.ui.widgets.quiz import QuizBlock


async def answer(quiz: QuizBlock, services: Services, pilot) -> None:
    expected = services.expected_answer(quiz.block, device=services.machine)
    if quiz.block.kind == "choice":
        list(quiz.query(RadioButton))[int(expected)].value = True
    else:
        value = f"{expected:.6g}" if isinstance(expected, float) else str(expected)
        quiz.query_one("#answer").value = value
    await pilot.pause()
    quiz.check()
    await pilot.pause()


@pytest.mark.slow
def test_every_lesson_opens_and_every_block_works(tmp_path):
    async def scenario():
        services = real_services(tmp_path)
        ids = [info.id for info in services.curriculum.lessons]
        assert len(ids) >= 14
        seen: set[str] = set()
        async for lesson_id, screen, pilot in walk_lessons(services, ids):
            assert isinstance(screen, LessonScreen) and screen.lesson_id == lesson_id
            for markdown in screen.query(".prose"):
                assert "could not compute a value" not in markdown.source, (lesson_id, markdown.source)
                assert "{{" not in markdown.source, lesson_id
            for bits in screen.query(BitsBlock):
                seen.add("bits")
                assert not bits.query_one("#status").has_class("error"), lesson_id
            for calc in screen.query(CalcBlock):
                seen.add("calc")
                output = calc.query_one("#output", Static)
                assert not output.has_class("error"), (lesson_id, calc.block, text_of(output))
            for quiz in screen.query(QuizBlock):
                seen.add("quiz")
                await answer(quiz, services, pilot)
                assert "✓ right" in text_of(quiz.query_one("#feedback")), (lesson_id, quiz.block.id)
            for runner in screen.query(MeasureBlock):
                seen.add("measure")
                runner.start_probe()
                await until(pilot, lambda: not runner.running, f"{lesson_id}'s probe to finish")
                assert runner.result is not None, (lesson_id, text_of(runner.query_one("#status")))
            for predict in screen.query(PredictBlock):
                seen.add("predict")
                predict.query_one("#guess").value = "1"
                predict.query_one("#commit").press()
                # The press is a message: the probe starts once it is handled, then posts its result.
                await until(pilot, lambda: "measured" in text_of(predict.query_one("#verdict")),
                            f"{lesson_id}'s verdict", limit_s=60)
                assert "measured 2" in text_of(predict.query_one("#verdict")), lesson_id
            for exercise in screen.query(ExerciseBlock):
                seen.add("exercise")
                exercise.start_probe()
                await until(pilot, lambda: "✓" in text_of(exercise.query_one("#status")),
                            f"{lesson_id}'s exercise to be checked")
            if not screen.graded_ids():
                screen.action_next()
            # The last block's result reaches the lesson as a message: wait for the completion it saves.
            await until(pilot, lambda: services.progress.lesson_state(lesson_id).completed,
                        f"{lesson_id} to be completed", limit_s=60)
        assert seen == {"bits", "calc", "quiz", "measure", "predict", "exercise"}
        done, total = services.progress.track_progress(services.curriculum.tracks[0])
        assert done == total
    asyncio.run(scenario())


@pytest.mark.slow
def test_a_lesson_fits_an_80x24_terminal(tmp_path):
    async def scenario():
        services = real_services(tmp_path)
        first = services.curriculum.lessons[0].id
        app = TutorApp(services, lesson_id=first)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            lesson = app.screen.query_one("#lesson")
            assert app.screen.has_class("-narrow")
            assert lesson.region.height >= 10 and lesson.region.width >= 76
            await pilot.press("n")
            await pilot.pause()
            assert app.screen.lesson_id == services.curriculum.lessons[1].id
    asyncio.run(scenario())


@pytest.mark.slow
def test_a_real_probe_runs_in_its_lesson(tmp_path):
    """moe-routing needs no torch: the real lab runs in the worker and its rows reach the table."""
    async def scenario():
        services = real_services(tmp_path)
        import dataclasses

        services = dataclasses.replace(services, probes=labs.PROBES)
        lesson_id = next(info.id for info in services.curriculum.lessons
                         if any(getattr(b, "probe", None) == "moe-routing" and b.directive == "measure"
                                for b in services.curriculum.lesson(info.id).blocks))
        app = TutorApp(services, lesson_id=lesson_id)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            runner = next(r for r in app.screen.query(MeasureBlock) if r.probe_name == "moe-routing")
            runner.start_probe()
            await until(pilot, lambda: not runner.running, "the moe-routing lab to finish")
            assert runner.result is not None and runner.result.probe == "moe-routing" and runner.result.rows
            table = text_of(runner.query_one("#table"))
            assert runner.result.rows[0].label[:20] in table and "% of theory" in table
    asyncio.run(scenario())


@pytest.mark.slow
def test_switching_impl_in_the_activations_calculator_changes_the_activations(tmp_path):
    """The learner picks `fused` in the calculator's impl list: Llama-3.1-8B's training activations drop
    below what a transformers training loop (`hf`, the block's start) keeps, and the result says so."""
    import re

    from textual.widgets import Select

    def activations_gib(calc: CalcBlock) -> float:
        text = text_of(calc.query_one("#output", Static))
        return float(re.search(r"^activations\s+([\d,]+\.\d+)", text, re.MULTILINE).group(1).replace(",", ""))

    async def scenario():
        app = TutorApp(real_services(tmp_path), lesson_id="memory/activations")
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            calc = next(c for c in app.screen.query(CalcBlock) if "impl" in c.fields)
            assert calc.values["model"] == "llama-3.1-8b" and calc.values["mode"] == "train"
            assert calc.values["impl"] == "hf"
            hf = activations_gib(calc)
            assert "activations assume impl hf" in text_of(calc.query_one("#output", Static))
            select = calc.query_one("#field-impl", Select)
            select.scroll_visible(animate=False)
            await pilot.pause()
            select.focus()
            await pilot.press("enter", "down", "enter")  # open the list, move to fused, pick it
            await pilot.pause()
            assert select.value == "fused" and calc.values["impl"] == "fused"
            output = text_of(calc.query_one("#output", Static))
            assert "activations assume impl fused" in output and "at peak" in output
            assert hf > activations_gib(calc) > 0
    asyncio.run(scenario())
