"""The lesson screens as a learner meets them: focus that follows the learner, charts that
keep every row, a header that keeps its place, results kept per lesson, labelled live traces."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest


from rich.console import Console
from rich.text import Text
from textual.widgets import Button, OptionList, ProgressBar, Static
from tests.ui_fakes import LESSONS, TRACKS, FakeCurriculum, FakeProbe, fake_machine, fake_services, sync, until

from tutor.hardware.sampler import Sample
from tutor.labs import Measurement, ProbeResult
from tutor.lessons.model import Lesson, Measure, Prose
from tutor.lessons.model import LessonInfo as Info
from tutor.ui.app import TutorApp
from tutor.ui.widgets import measure
from tutor.ui.widgets.bits import EncodingView, encodings
from tutor.ui.widgets.charts import Comparison, ComparisonBars, comparison_lines, gauge_text, rendered_height
from tutor.ui.widgets.device_header import device_label, header_line
from tutor.ui.widgets.live_pane import Trace, host_series, spark_rows
from tutor.ui.widgets.measure import MeasureBlock, age_text
from tutor.ui.widgets.predict import PredictBlock

SMALL, WIDE = (80, 24), (120, 40)
GiB = 2**30


def plain(renderable, width: int) -> str:
    console = Console(width=width, record=True, color_system=None, legacy_windows=False)
    console.print(renderable)
    return console.export_text()


# ---- charts ---------------------------------------------------------------------------------------

SEVEN = tuple(Comparison(label, 100.0 + i, 120.0, "GFLOP/s") for i, label in enumerate((
    "forward matmuls 128x128x128", "backward matmuls 128x128x128", "optimizer step (AdamW, fp32 states)",
    "expert 6 tokens", "expert 7 tokens", "bandwidth write", "loss")))


@pytest.mark.parametrize("width", [30, 50, 76])
def test_bar_chart_keeps_every_row_and_every_label_whole(width):
    text = comparison_lines(SEVEN, width)
    shown = plain(text, width)
    for item in SEVEN:
        assert item.label in shown.replace("\n", " ") or all(word in shown for word in item.label.split())
    assert "128x128x128" in shown  # never cut mid-token
    assert shown.count("measured") == len(SEVEN) and shown.count("theory") == len(SEVEN)
    assert rendered_height(text, width) == len(shown.rstrip("\n").split("\n"))


def test_bar_chart_numbers_use_scaled_units():
    shown = plain(comparison_lines((Comparison("saved", 1.651e4, 8192.0, "B"),), 60), 60)
    assert "16.1 KiB" in shown and "e+" not in shown


def test_a_gauge_with_a_long_label_moves_its_bar_to_the_next_line():
    text = gauge_text("bandwidth write (stream, 64 MiB buffers)", 0.5, 40)
    assert "bandwidth write" in text.plain and "50% of peak" in plain(text, 40)
    assert rendered_height(text, 40) == 2


@sync
async def test_comparison_bars_grow_with_their_rows():
    app = TutorApp(fake_services())
    async with app.run_test(size=(60, 40)) as pilot:
        bars = ComparisonBars()
        await app.screen.mount(bars)
        bars.items = SEVEN
        await pilot.pause()
        assert bars.size.height == rendered_height(comparison_lines(SEVEN, bars.size.width), bars.size.width) > 14


# ---- header, bits ---------------------------------------------------------------------------------

def test_header_says_no_gpu_in_words_and_keeps_the_place():
    label = device_label(fake_machine())
    assert label == "CPU only · no NVIDIA GPU · Fake Xeon 2-core" and "NVML" not in label
    place = "3/22 Training needs more memory"
    for width in (30, 48, 80, 120):
        line = header_line(place, label, width).plain
        assert len(line) <= width and (place in line or width < len(place) + 2)
        assert line.strip().startswith(("tensor-tutor", "3/22"))
    assert "no NVIDIA GPU" in header_line(place, label, 120).plain
    assert header_line(place, label, 30).plain.strip().startswith("3/22 Training")


def test_bits_explorer_keeps_its_torch_column_when_narrow():
    rows = encodings("65504", ("fp32", "bf16", "fp16", "fp8-e4m3"))
    torch_values = {"fp32": 65504.0, "bf16": 65535.0, "fp16": 65504.0, "fp8-e4m3": 0.0}  # two disagree
    for width in (66, 120):
        shown = plain(EncodingView(rows, torch_values), width)
        assert shown.count("✓ same") == 2 and shown.count("✗") == 2, (width, shown)
        assert max(len(line) for line in shown.split("\n")) <= width
    assert "saturated" in plain(EncodingView(rows), 66) or "overflow" in plain(EncodingView(rows), 66)


# ---- live pane ------------------------------------------------------------------------------------

def test_host_traces_say_this_apps_share_scale_and_window():
    samples = [Sample(100.0 + t, (40.0, 60.0), 8 * GiB, 16 * GiB, (), 25.0, GiB // 2) for t in range(31)]
    cpu, ram = host_series(samples)
    assert cpu.reading == " 50.0 % of 2 cores, app 25 %" and ram.reading == "8.0 / 16.0 GiB, app 512 MiB"
    assert cpu.scale == "0-100 %" and cpu.mine == (25.0,) * 31 and ram.scale == "0-16 GiB"


def test_tall_sparkline_fills_rows_in_eighths_and_colours_the_apps_part():
    lines = spark_rows([50.0, 100.0, None], 0.0, 100.0, 3, 2, mine=[50.0, 25.0, None])
    assert [line.plain for line in lines] == [" █ ", "██ "]
    bottom = lines[1]
    assert bottom.get_style_at_offset(Console(), 0).color.name == "cyan"  # all of column 0 is the app's
    assert bottom.get_style_at_offset(Console(), 1).color.name == "green"


@pytest.mark.parametrize("size, tall", [(WIDE, True), (SMALL, False)])
@sync
async def test_live_pane_uses_its_height(size, tall):
    app = TutorApp(fake_services(), lesson_id="precision/bits")
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        await pilot.pause()
        traces = list(app.screen.query(Trace))
        assert all((trace.chart_rows > 2) == tall for trace in traces)
        pane = app.screen.query_one("#live")
        spark = traces[0].size.width - Trace.HEAD_WIDTH - 1  # one sample each 0.5 s
        assert pane.border_subtitle == ("" if tall else f"last {(spark - 1) / 2:.0f} s")
        assert all(("last" in str(trace.render())) == tall for trace in traces)
        if tall:  # the bottom rows are used: the last widget ends near the pane's bottom
            bottom = max(widget.region.bottom for widget in pane.query("Trace, CoreLoads"))
            assert pane.region.bottom - bottom <= 6


# ---- focus ----------------------------------------------------------------------------------------

LONG = Lesson(Info("long/run", "A long read, then a run", "memory", 5, (), "scrolls"), (
    Prose("\n\n".join(f"Paragraph {i} of the reading." for i in range(40))),
    Measure("matmul", {"dtypes": ["fp32", "bf16"], "budget_s": 2}, "", id="measure-1"),
))


def long_services(**changes):
    tracks = (*TRACKS, dataclasses.replace(TRACKS[1], id="long", lesson_ids=("long/run",)))
    return fake_services(curriculum=FakeCurriculum((*LESSONS, LONG), tracks), **changes)


@sync
async def test_a_lesson_whose_first_run_is_on_screen_opens_on_it_and_enter_measures():
    services = fake_services()
    probe = services.probes["matmul"]
    app = TutorApp(services, lesson_id="precision/speed")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        await pilot.pause()
        run = app.screen.query_one("#run", Button)
        assert app.focused is run and measure_visible(app, run)
        assert app.screen.query_one("#lesson").scroll_y == 0
        calls = len(probe.calls)
        await pilot.press("enter")
        await until(pilot, lambda: len(probe.calls) > calls, "the probe to run")
        assert len(probe.calls) == calls + 1


@sync
async def test_a_lesson_whose_first_run_is_below_the_fold_opens_at_its_top_and_the_first_tab_reaches_run():
    app = TutorApp(long_services(), lesson_id="long/run")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        await pilot.pause()
        assert app.focused is app.screen.query_one("#lesson") and app.focused.scroll_y == 0
        await pilot.press("tab")
        assert isinstance(app.focused, Button) and app.focused.id == "run"


@sync
async def test_enter_on_an_unseen_run_scrolls_to_it_and_a_second_enter_runs():
    services = long_services()
    probe = services.probes["matmul"]
    app = TutorApp(services, lesson_id="long/run")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        run = app.screen.query_one("#run", Button)
        run.focus(scroll_visible=False)  # focused but below the fold (as after PgUp)
        await pilot.pause()
        calls = len(probe.calls)
        await pilot.press("enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert len(probe.calls) == calls and measure_visible(app, run)
        # A Button ignores a press while it animates: wait for the animation's end, not for its length.
        await until(pilot, lambda: not run.has_class("-active"), "the Run button's press effect to end")
        await pilot.press("enter")
        await until(pilot, lambda: len(probe.calls) > calls, "the probe to run")
        assert len(probe.calls) == calls + 1


def measure_visible(app, widget) -> bool:
    from tutor.ui.widgets.block import fully_visible

    return fully_visible(widget)


@sync
async def test_committing_a_prediction_keeps_focus_and_shows_the_verdict():
    app = TutorApp(fake_services(), lesson_id="precision/speed")
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        block = app.screen.query_one(PredictBlock)
        block.query_one("#guess").focus()
        await pilot.press("3", "enter")
        # While it measures the focus waits on the lesson text; the fake probe may already have
        # answered, and then the focus is back on Commit (Tab continues from the block).
        assert app.focused in (app.screen.query_one("#lesson"), block.query_one("#commit"))
        verdict = block.query_one("#verdict", Static)
        await until(pilot, lambda: "you predicted" in str(verdict.render()), "the verdict")
        await pilot.pause()
        assert "you predicted" in str(verdict.render()) and measure_visible(app, verdict)
        scroll = app.screen.query_one("#lesson")
        before = scroll.scroll_y
        await pilot.press("pageup")
        assert scroll.scroll_y < before  # the keys still read the lesson


# ---- results kept, cancel, home, drawing ----------------------------------------------------------

@sync
async def test_a_measure_result_is_shown_again_when_the_learner_returns(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(measure, "now", lambda: clock[0])
    app = TutorApp(fake_services(), lesson_id="precision/speed")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        app.screen.query_one(MeasureBlock).start_probe()
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.last_result.probe == "matmul"
        await pilot.press("escape")
        await pilot.pause()
        clock[0] += 185
        await pilot.press("enter")  # Home's cursor is on the lesson just left
        await pilot.pause()
        block = app.screen.query_one(MeasureBlock)
        status = str(block.query_one("#status", Static).render())
        assert status.startswith("measured 3 min ago: fp32 reached 45% of its peak")
        assert block.query_one("#table").display and block.query_one(ProgressBar).percentage == 1.0


def test_age_reads_in_words():
    assert [age_text(s) for s in (3, 42, 185, 9000)] == ["just now", "42 s ago", "3 min ago", "2 h ago"]


@sync
async def test_a_cancelled_run_does_not_read_100_percent():
    app = TutorApp(fake_services(), lesson_id="memory/train")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        block = app.screen.query_one(MeasureBlock)
        block.start_probe()
        await until(pilot, lambda: block.query_one(ProgressBar).progress, "the probe's first progress report")
        await pilot.press("escape")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert block.query_one(ProgressBar).percentage < 1.0
        assert "cancelled" in str(block.query_one("#status", Static).render())


@sync
async def test_home_cursor_follows_the_lesson_the_learner_was_in():
    app = TutorApp(fake_services())
    async with app.run_test(size=SMALL) as pilot:
        await pilot.pause()
        app.open_lesson("memory/train")
        await pilot.pause()
        await pilot.press("p")  # to precision/speed
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        options = app.screen.query_one(OptionList)
        assert options.get_option_at_index(options.highlighted).id == "precision/speed"


@dataclasses.dataclass(frozen=True)
class DrawingProbe(FakeProbe):
    render: object = None

    def run(self, params, progress, cancel: threading.Event) -> ProbeResult:
        return ProbeResult(self.name, (Measurement("bubble", 0.2, "fraction", 0.25, "(p-1)/(m+p-1)"),), {},
                           "pipeline done", details={"stages": [1, 2]})


@sync
async def test_a_probes_drawing_shows_under_its_table_and_params_read_as_words():
    probe = DrawingProbe("matmul", render=lambda result: Text(f"STAGES {result.details['stages']}"))
    services = fake_services()
    services = dataclasses.replace(services, probes={**services.probes, "matmul": probe})
    app = TutorApp(services, lesson_id="precision/speed")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        block = app.screen.query_one(MeasureBlock)
        params_line = str(block.query(Static).first().render())
        assert "dtypes fp32, bf16 · budget 2 s" in params_line and "=" not in params_line
        block.start_probe()
        await app.workers.wait_for_complete()
        await pilot.pause()
        drawing = block.query_one("#drawing", Static)
        assert drawing.display and "STAGES [1, 2]" in str(drawing.render())
