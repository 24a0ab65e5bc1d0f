"""The app as a learner meets it: focus that follows the learner at 80x24 and 120x40,
verdicts in view, a solved quiz that stays solved, whole choices and bits, the pipeline bubble, the
live pane's words and figures, the palette's multi-word search, the help's keys, the reading
position across a resize, a Fit model given as a path, and bursts of edits typed while a
measurement and the live pane run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


from rich.console import Console
from textual.widgets import Button, Input, RadioButton, Static
from tests.ui_fakes import LESSONS, TRACKS, FakeCurriculum, FakeProbe, fake_services, sync

from tutor.labs import ProbeResult
from tutor.lessons.model import Lesson, Measure, Predict, Prose, Quiz, Track
from tutor.lessons.model import LessonInfo as Info
from tutor.ui.app import TutorApp
from tutor.ui.widgets.block import fully_visible
from tutor.ui.widgets.measure import MeasureBlock
from tutor.ui.widgets.predict import PredictBlock
from tutor.ui.widgets.quiz import QuizBlock

SMALL, WIDE = (80, 24), (120, 40)
SIZES = pytest.mark.parametrize("size", [SMALL, WIDE], ids=["small", "wide"])


def plain(renderable, width: int) -> str:
    console = Console(width=width, record=True, color_system=None, legacy_windows=False)
    console.print(renderable)
    return console.export_text()


def text_of(widget: Static) -> str:
    return plain(widget.content if hasattr(widget, "content") else widget.render(), 200)


LONG_CHOICE = ("BF16, because it keeps all eight exponent bits of FP32 and gives up mantissa bits, "
               "so its range matches FP32 while its precision is lower")
READING = tuple(Prose(f"## Part {part}\n\n" + " ".join(f"Sentence {part}.{i} about bits and bytes." for i in range(40)))
                for part in range(6))
EXTRA = (
    Lesson(Info("learner/quiz-low", "A quiz at the bottom", "learner", 5, (), "Quiz below prose"), (
        Prose("Read this first.\n\n" + "\n\n".join(f"Line {i} of the text above the quiz." for i in range(14))),
        Quiz("fp16-max", "Largest finite FP16 number?", "number", (), 65504, None, 0.01,
             ("5 exponent bits, 10 mantissa bits.", "(2 - 2^-10) x 2^15"),
             "65504 = (2 - 2^-10) x 2^15. " * 4),
        Quiz("long-choice", "Which 16-bit format keeps FP32's range?", "choice", ("FP16", LONG_CHOICE, "INT8"), 1,
             None, 0.0, ("Count the exponent bits.",), "BF16 keeps 8 exponent bits."),
    )),
    Lesson(Info("learner/reading", "A long read", "learner", 5, (), "Text to scroll"), READING),
    Lesson(Info("learner/busy", "Typing while it measures", "learner", 5, (), "Bursts"), (
        Prose("A slow measurement, a quiz and a prediction."),
        Measure("slow", {}, "", id="measure-slow"),
        Quiz("pipeline", "Bubble share of pp 4, 8 micro-batches?", "number", (), 0.273, None, 0.05, ("(p-1)/(m+p-1)",), ""),
        Predict("guess", "How many GFLOP/s?", "matmul", {}, "tflops_fp32", "TFLOP/s"),
    )),
)
EXTRA_TRACK = Track("learner", "Learner", "The learner's walk.", tuple(lesson.info.id for lesson in EXTRA))


def services(**changes):
    curriculum = FakeCurriculum(LESSONS + EXTRA, TRACKS + (EXTRA_TRACK,))
    return fake_services(curriculum=curriculum, **changes)


# ---- focus follows the learner -------------------------------------------------------------------

@SIZES
@sync
async def test_a_lesson_that_opens_on_a_measurement_focuses_run_and_enter_measures(size):
    probe = FakeProbe("matmul")
    app = TutorApp(services(probes={"matmul": probe, "slow": FakeProbe("slow", slow=True)}), lesson_id="precision/speed")
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.pause()
        assert app.focused is not None and app.focused.id == "run"
        block = app.screen.query_one(MeasureBlock)
        for _ in range(2):  # a Run out of sight: the first Enter scrolls to it, the next measures
            await pilot.press("enter")
            await app.workers.wait_for_complete()
            await pilot.pause()
            if probe.calls:
                break
        assert probe.calls, "Enter on the focused Run measured nothing"
        assert block.result is not None


@sync
async def test_tab_after_a_prediction_continues_from_the_predict_block():
    app = TutorApp(services(), lesson_id="precision/speed")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        predict = app.screen.query_one(PredictBlock)
        guess = predict.query_one("#guess", Input)
        guess.focus()
        await pilot.press("2", "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        await pilot.pause()
        assert "you predicted" in text_of(predict.query_one("#verdict", Static))
        assert app.focused is predict.query_one("#commit", Button)
        await pilot.press("shift+tab")
        assert app.focused is guess  # Tab order runs through this block, not from the lesson's top
        measure = app.screen.query_one(MeasureBlock)
        assert measure not in app.focused.ancestors_with_self


@SIZES
@sync
async def test_a_quiz_verdict_is_scrolled_into_view_and_a_solved_quiz_stays_solved(size):
    app = TutorApp(services(), lesson_id="learner/quiz-low")
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        quiz = app.screen.query(QuizBlock).first()
        answer = quiz.query_one("#answer", Input)
        answer.focus(scroll_visible=False)
        app.screen.query_one("#lesson").scroll_home(animate=False)
        await pilot.pause()
        await pilot.press(*"1000", "enter")
        await pilot.pause()
        await pilot.pause()
        feedback = quiz.query_one("#feedback", Static)
        assert "✗" in text_of(feedback)
        assert fully_visible(feedback), "the verdict landed below the fold"
        assert "hint 1/2" in text_of(quiz.query_one("#hints", Static))
        answer.value = ""
        await pilot.press(*"65504", "enter")
        await pilot.pause()
        await pilot.pause()
        assert "✓ right" in text_of(feedback) and fully_visible(feedback)
        assert not quiz.query_one("#hints", Static).display  # the old hint is gone with the right answer
        answer.value = ""
        await pilot.press(*"7", "enter")
        await pilot.pause()
        assert "✗" not in text_of(feedback) and "✓ solved" in text_of(feedback)
        answers = [answer for _, quiz_id, answer, _ in app.services.progress.answers if quiz_id == "fp16-max"]
        assert answers == ["1000", "65504"]  # the answer after the solve was not graded nor recorded


@SIZES
@sync
async def test_a_long_choice_wraps_instead_of_being_cut(size):
    app = TutorApp(services(), lesson_id="learner/quiz-low")
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        quiz = app.screen.query(QuizBlock).last()
        button = quiz.query(RadioButton)[1]
        quiz.scroll_visible(animate=False)
        await pilot.pause()
        lines = button.render().wrap(button.content_region.width)
        assert button.size.height == len(lines) >= 2  # as tall as its wrapped text
        assert " ".join(line.plain.strip() for line in lines).endswith("its precision is lower")


def test_the_bits_table_keeps_fp32s_error_and_bits_whole_at_80_columns():
    from tutor.ui.widgets.bits import EncodingView, encodings

    rows = encodings("0.1", ["fp32", "bf16", "fp16", "fp8-e4m3"])
    for width in (60, 66, 74, 110):  # the block's width at 80 columns and beside the live pane
        shown = plain(EncodingView(rows), width)
        assert "1.5 × 10⁻⁸" in shown and "…" not in shown
        assert "10011001100110011001101" in shown  # fp32's 23 mantissa bits of 0.1


def test_the_pipeline_calculator_shows_the_bubble():
    from tutor.formatting import format_percent
    from tutor.theory.parallel import pipeline_bubble_fraction
    from tutor.ui.widgets.calc import calc_renderable
    from tests.ui_fakes import fake_machine

    values = {"model": "llama-3.1-70b", "mode": "train", "pp": 4, "microbatches": 8, "tp": 1, "dp": 1, "seq": 4096}
    shown = plain(calc_renderable("parallel", values, fake_machine()), 110)
    expected = format_percent(float(pipeline_bubble_fraction(stages=4, microbatches=8)))
    assert "pipeline bubble" in shown and expected in shown
    assert "pipeline bubble" not in plain(calc_renderable("parallel", {**values, "pp": 1}, fake_machine()), 110)


# ---- the live pane -------------------------------------------------------------------------------

@sync
async def test_the_live_pane_shows_the_measured_bandwidth_and_no_raw_nvml_error():
    app = TutorApp(services(), lesson_id="precision/speed")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        pane = app.screen.query_one("#live")
        device = text_of(pane.query_one("#device", Static))
        assert "CPU only" in device and "NVML" not in device and "Shared Library" not in device
        peaks = pane.query_one("#peaks", Static)
        assert "peak fp32: 269 GFLOP/s" in text_of(peaks) and "TFLOP/s" not in text_of(peaks)
        assert "peak memory: N/A" in text_of(peaks)
        app.last_result = ProbeResult("bandwidth", (), {"gbps_copy": 6.0, "gbps_triad": 7.32}, "triad 7.32 GB/s")
        pane.refresh_traces()
        await pilot.pause()
        assert "memory: 7.32 GB/s measured (triad, best)" in text_of(peaks)
        assert "N/A" not in text_of(peaks).split("memory")[-1]


# ---- palette and help ----------------------------------------------------------------------------

@sync
async def test_multi_word_palette_queries_find_lessons_by_title_and_id():
    from tutor.ui.commands import TutorCommands

    app = TutorApp(services())
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        provider = TutorCommands(app.screen)
        for query in ("float made", "bits of", "made of", "bits float"):
            hits = [str(hit.text) async for hit in provider.search(query)]
            assert any("What a float is made of" in hit for hit in hits), query
        assert not [hit async for hit in provider.search("zebra quantum")]


@sync
async def test_enter_on_an_empty_palette_starts_nothing():
    from tutor.ui.screens.bench import BenchScreen

    ran = []
    app = TutorApp(services(run_bench=lambda progress, cancel: ran.append(1)))
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        await app.workers.wait_for_complete()
        assert not ran and not isinstance(app.screen, BenchScreen)


def test_the_help_names_every_key():
    from tutor.ui.screens.help import GLOBAL_HELP

    for key in ("| b |", "| f |", "| c |", "| l |", "| q |", "| Enter |", "| Tab / shift+Tab |", "| ctrl+q |"):
        assert key in GLOBAL_HELP, key


@sync
async def test_the_lesson_footer_shows_enter_tab_and_next_box():
    app = TutorApp(services(), lesson_id="precision/bits")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        shown = {binding.action for _, binding, _, _ in
                 ((key, b.binding, b.enabled, b.tooltip) for key, b in app.screen.active_bindings.items())
                 if binding.show}
        assert {"enter", "app.focus_next", "next_block"} <= shown


@sync
async def test_next_box_key_walks_the_boxes_from_text_and_from_inside_a_field():
    app = TutorApp(services(), lesson_id="precision/bits")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        screen = app.screen
        blocks = screen.blocks()
        await pilot.press("enter")  # on the lesson text: Enter goes to the next box
        assert screen.current_block() is blocks[0]
        await pilot.press("ctrl+down")  # from inside the bits field (] would be typed there)
        assert screen.current_block() is blocks[1] and fully_visible(app.focused)
        await pilot.press("ctrl+down")
        assert screen.current_block() is blocks[2]
        await pilot.press("ctrl+up")
        assert screen.current_block() is blocks[1]


@sync
async def test_presses_past_the_first_box_say_so_once_while_it_shows(monkeypatch):
    import tutor.ui.screens.lesson as lesson_screen

    # A notice that shows for an hour: the five presses fall inside it however slowly a loaded machine sends them.
    monkeypatch.setattr(lesson_screen, "EDGE_NOTICE_S", 3600.0)
    app = TutorApp(services(), lesson_id="precision/bits")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        said: list[str] = []
        notify = app.notify
        app.notify = lambda message, **kw: (said.append(str(message)), notify(message, **kw))[1]  # type: ignore[method-assign]
        await pilot.press("enter")  # into the first box
        for _ in range(5):
            await pilot.press("ctrl+up")
        assert said == ["no more boxes that way"]  # not one toast per press, stacked five deep over the lesson
        app.screen._edge_notice_at -= 2 * lesson_screen.EDGE_NOTICE_S  # the notice has gone: the next press says it again
        await pilot.press("ctrl+up")
        assert said == ["no more boxes that way"] * 2


@sync
async def test_a_resize_keeps_the_reading_position():
    app = TutorApp(services(), lesson_id="learner/reading")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        scroller = app.screen.query_one("#lesson")
        part = scroller.children[4]  # the heading line, then the parts: part 3 at the top
        scroller.scroll_to(y=part.virtual_region.y, animate=False, immediate=True)
        await pilot.pause()
        before = app.screen._reading_anchor()
        await pilot.resize_terminal(*SMALL)
        await pilot.pause()
        await pilot.pause()
        after = app.screen._reading_anchor()
        assert before is not None and after is not None and after[0] == before[0] == 4
        await pilot.resize_terminal(*WIDE)
        await pilot.pause()
        await pilot.pause()
        assert app.screen._reading_anchor()[0] == 4


# ---- the Fit screen's model ----------------------------------------------------------------------

@sync
async def test_the_fit_model_field_takes_a_config_json_path_and_unknown_names_say_why(tmp_path):
    from tutor.ui.widgets.calc import CalcBlock

    config = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 256,
              "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
              "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    app = TutorApp(services())
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        app.action_fit()
        await pilot.pause()
        form = app.screen.query_one("#fit-form", CalcBlock)
        field = form.query_one("#field-model", Input)
        output = form.query_one("#output", Static)
        field.value = str(path)
        await pilot.pause()
        assert not output.has_class("error"), text_of(output)
        assert form.values["model"] == str(path)
        assert "weights" in text_of(output)
        field.value = str(tmp_path)  # the model folder that holds it
        await pilot.pause()
        assert not output.has_class("error"), text_of(output)
        field.value = "no-such-model-xyz"
        await pilot.pause()
        assert output.has_class("error") and "no-such-model-xyz" in text_of(output)


# ---- bursts of edits while a measurement and the live pane run -------------------------------------

BURSTS = (
    (("5", "0", "enter", "backspace", "backspace", *"0.368"), "0.368"),
    ((*"12345", "ctrl+u", *"0.27", "home", "delete", *"9"), "9.27"),
    ((*"abc", "home", "x", "end", "y", "backspace", "backspace", "z"), "xabz"),
)


@sync
async def test_bursts_of_edits_land_exactly_while_a_measurement_and_the_live_pane_run():
    app = TutorApp(services(), lesson_id="learner/busy")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        measure = app.screen.query_one(MeasureBlock)
        measure.start_probe()
        await pilot.pause()
        assert measure.running
        pane = app.screen.query_one("#live")
        quiz_input = app.screen.query_one(QuizBlock).query_one("#answer", Input)
        guess = app.screen.query_one(PredictBlock).query_one("#guess", Input)
        # Enter grades the quiz (then the edits go on); in the predict field it would commit, so not there.
        for target, bursts in ((quiz_input, BURSTS), (guess, BURSTS[1:])):
            for keys, expected in bursts:
                target.value = ""
                target.focus()
                await pilot.press(*keys)
                pane.refresh_traces()  # a live-pane draw between bursts
                assert target.value == expected, (target.id, keys)
        await pilot.press("ctrl+p")
        await pilot.pause()
        from textual.command import CommandInput

        palette_input = app.screen.query_one(CommandInput)
        for keys, expected in BURSTS[1:]:
            palette_input.value = ""
            await pilot.press(*keys)
            assert palette_input.value == expected, keys
        await pilot.press("escape")
        assert measure.running  # the measurement ran through all of it
        measure.cancel()
        await app.workers.wait_for_complete()


@SIZES
@sync
async def test_the_first_lesson_of_the_course_opens_on_run_at_80x24_and_120x40(size, tmp_path):
    from tests.test_ui_lessons import real_services

    services = real_services(tmp_path)
    first = services.curriculum.lessons[0].id
    app = TutorApp(services, lesson_id=first)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.pause()
        assert app.focused is not None and app.focused.id == "run", (first, app.focused)
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.screen.query(MeasureBlock).first().result is not None
