"""The learner's place in the app: what an answered block shows when its lesson is reopened, the blocks
done per lesson and track on Home, and a measurement's result brought into view when it arrives."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from tests.ui_fakes import FakeProbe, real_services, text_of, until

from tutor.labs import Measurement, ProbeResult
from tutor.ui.app import TutorApp
from tutor.ui.widgets.block import fully_visible

SMALL, WIDE = (80, 24), (120, 40)


def run(scenario) -> None:
    asyncio.run(scenario)


# ---- a measurement's result comes into view -------------------------------------------------------

@dataclass(frozen=True)
class GatedProbe(FakeProbe):
    """A matmul lab that returns once the test opens its gate, with a summary worded as the lab's."""

    gate: threading.Event = field(default_factory=threading.Event)

    def run(self, params: dict, progress: Any, cancel: threading.Event) -> ProbeResult:
        self.calls.append(dict(params))
        progress(0.5, "fp32 matmul on cpu")
        self.gate.wait(60)
        rows = (Measurement("fp32 matmul, 1024x1024x1024 (torch)", 0.198, "TFLOP/s", 0.2688, "cores x FLOP/cycle x clock",
                            rate=True),)
        return ProbeResult(self.name, rows, {"tflops_fp32": 0.198},
                           "198 GFLOP/s on fp32, 2 cores\nsome sizes did not settle, though the machine was quiet",
                           device="cpu")


def first_matmul_lesson(curriculum) -> str:
    """The first lesson of the course (curriculum.toml's order) with a measure block of the matmul lab."""
    return next(info.id for info in curriculum.lessons
                if any(block.directive == "measure" and block.probe == "matmul"
                       for block in curriculum.lesson(info.id).blocks))


def test_the_matmul_result_is_scrolled_into_view_at_80x24_with_its_figure_on_its_first_line(tmp_path):
    async def scenario():
        from tutor.ui.widgets.measure import MeasureBlock

        services = real_services(tmp_path)
        probe = GatedProbe("matmul")
        services.probes["matmul"] = probe  # type: ignore[index]
        lesson_id = first_matmul_lesson(services.curriculum)
        app = TutorApp(services, lesson_id=lesson_id)
        async with app.run_test(size=SMALL) as pilot:
            await pilot.pause()
            measure = next(block for block in app.screen.query(MeasureBlock) if block.probe_name == "matmul")
            measure.start_probe()
            await until(pilot, lambda: probe.calls, "the lab to start")
            app.screen.query_one("#lesson").scroll_end(animate=False, immediate=True)  # reading on meanwhile
            await pilot.pause()
            status = measure.query_one("#status")
            assert not fully_visible(status)
            probe.gate.set()
            await until(pilot, lambda: not measure.running and fully_visible(status), "the result in view", limit_s=60)
            first, *rest = text_of(status).splitlines()
            assert first.strip() == "198 GFLOP/s on fp32, 2 cores"
            assert "some sizes did not settle" in " ".join(rest)
    run(scenario())


# ---- Home counts blocks done ----------------------------------------------------------------------

def saved_progress(tmp_path: Path, lessons: dict[str, dict]):
    """The real curriculum and grading, with progress.json written first into this test's data folder
    ($TENSOR_TUTOR_DATA_DIR, tests/conftest.py) and read by the real store, as after a restart."""
    import dataclasses
    import json

    from tutor.lessons.progress import ProgressStore
    from tutor.files.storage import data_dir

    path = data_dir() / "progress.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"version": 1, "last_lesson": None, "learner_id": "0123456789abcdef",
                                "lessons": lessons}), encoding="utf-8")
    return dataclasses.replace(real_services(tmp_path), progress=ProgressStore())


def option_text(app, option_id: str) -> str:
    from rich.console import Console
    from textual.widgets import OptionList

    console = Console(width=200, record=True)
    option_list = app.screen.query_one(OptionList)
    console.print(option_list.get_option_at_index(option_list.get_option_index(option_id)).prompt)
    return console.export_text()


def test_home_shows_blocks_done_per_lesson_and_per_track(tmp_path):
    async def scenario():
        from tutor.lessons import load_curriculum

        curriculum = load_curriculum()
        track = curriculum.tracks[0]
        first, second = (curriculum.info(lesson_id) for lesson_id in track.lesson_ids[:2])
        services = saved_progress(tmp_path, {
            first.id: {"done_blocks": list(first.blocks[:2]) + ["calc-1"]},  # a calculator does not count
            second.id: {"done_blocks": list(second.blocks[:1])},
        })
        in_track = sum(len(curriculum.info(lesson_id).blocks) for lesson_id in track.lesson_ids)
        app = TutorApp(services)
        async with app.run_test(size=WIDE) as pilot:
            await pilot.pause()
            assert f"2/{len(first.blocks)} blocks" in option_text(app, first.id)
            assert f"1/{len(second.blocks)} blocks" in option_text(app, second.id)
            assert f"0/{len(track.lesson_ids)} lessons · 3/{in_track} blocks" in option_text(app, f"track:{track.id}")
    run(scenario())


# ---- a reopened lesson shows what the learner answered --------------------------------------------

PIPELINE = "training-loop/data-pipeline"
LEARNER = "0123456789abcdef"


def saved_answers() -> dict[str, dict]:
    """data-pipeline's progress after a session: a guess typed in MB/s for a GB/s block and measured, the
    choice quiz answered right (its index in this learner's order of choices), the number quiz wrong."""
    from tutor.lessons import expected_answer, load_curriculum
    from tutor.lessons.learner import learner_view
    from tests.ui_fakes import fake_machine

    choice = learner_view(load_curriculum().lesson(PIPELINE).block("prefetch-step-time"), learner_id=LEARNER,
                          lesson_id=PIPELINE, device=fake_machine())
    right = expected_answer(choice, device=fake_machine())
    at = "2026-01-02T03:04:05Z"
    return {PIPELINE: {
        "done_blocks": ["ram-copy", "prefetch-step-time"],
        "answers": {"prefetch-step-time": {"answer": str(right), "correct": True, "attempts": 1, "at": at, "round": 0},
                    "tokens-per-second": {"answer": "12", "correct": False, "attempts": 1, "at": at, "round": 0}},
        "predictions": {"ram-copy": {"predicted": 0.8, "measured": 9.5, "at": at, "typed": "800 MB/s"}},
    }}


def test_a_reopened_lesson_shows_the_saved_guess_measurement_verdict_and_answers(tmp_path):
    async def scenario():
        from textual.widgets import Input

        from tutor.lessons.predictions import prediction_verdict, read_guess_as
        from tutor.ui.widgets.measure import format_value
        from tutor.ui.widgets.predict import PredictBlock
        from tutor.ui.widgets.quiz import ChoiceButton, QuizBlock

        services = saved_progress(tmp_path, saved_answers())
        app = TutorApp(services, lesson_id=PIPELINE)
        async with app.run_test(size=WIDE) as pilot:
            await pilot.pause()
            predict = next(block for block in app.screen.query(PredictBlock) if block.block_id == "ram-copy")
            assert predict.query_one("#guess", Input).value == "800 MB/s"  # as typed
            verdict = text_of(predict.query_one("#verdict"))
            read = read_guess_as("800 MB/s", "GB/s")
            assert read.note and f"({read.note} from '800 MB/s')" in verdict  # and as it was read
            assert (f"you predicted {format_value(0.8, 'GB/s')}" in verdict
                    and f"measured {format_value(9.5, 'GB/s')}" in verdict
                    and prediction_verdict(0.8, 9.5, "GB/s") in verdict)
            assert "commit again to measure again" in text_of(predict.query_one("#status"))
            assert predict.query_one("#explain").display and not predict.query_one("#guess", Input).disabled

            quizzes = {block.block_id: block for block in app.screen.query(QuizBlock)}
            choice = quizzes["prefetch-step-time"]
            pressed = [button.value for button in choice.query(ChoiceButton)]
            assert pressed.count(True) == 1 and pressed.index(True) == int(
                saved_answers()[PIPELINE]["answers"]["prefetch-step-time"]["answer"])
            assert text_of(choice.query_one("#feedback")).startswith("✓ right.")
            assert "300 ms: the loader is the bottleneck" in text_of(choice.query_one("#explanation"))
            assert "your saved answer" in text_of(choice.query_one("#saved"))

            number = quizzes["tokens-per-second"]
            assert number.query_one("#answer", Input).value == "12"
            assert text_of(number.query_one("#feedback")).startswith("✗ not yet.")
            assert "hint 1/2: Training costs 6·N FLOPs per token." in text_of(number.query_one("#hints"))

            # Answering again: the new guess is measured and saved in place of the old one.
            predict.query_one("#guess", Input).value = "3 GB/s"
            predict.query_one("#commit").press()
            await until(pilot, lambda: services.progress.prediction(PIPELINE, "ram-copy").typed == "3 GB/s",
                        "the new guess saved", limit_s=60)
            assert f"you predicted {format_value(3.0, 'GB/s')}, measured" in text_of(predict.query_one("#verdict"))
    run(scenario())


def test_an_answer_to_an_earlier_draw_is_not_shown_against_a_fresh_one(tmp_path):
    async def scenario():
        from textual.widgets import Input

        from tutor.ui.widgets.quiz import QuizBlock

        progress = saved_answers()
        progress[PIPELINE]["seen_blocks"] = {"tokens-per-second": 1}  # its answer was shown: round 1 now
        app = TutorApp(saved_progress(tmp_path, progress), lesson_id=PIPELINE)
        async with app.run_test(size=WIDE) as pilot:
            await pilot.pause()
            number = next(block for block in app.screen.query(QuizBlock) if block.block_id == "tokens-per-second")
            assert number.query_one("#answer", Input).value == ""
            assert not number.query_one("#feedback").display and not number.query_one("#saved").display
    run(scenario())
