"""A probe's progress repaints its status line only: on a lesson screen a layout reflows
and repaints the whole screen (every Markdown block, the live pane), which stalled keys while a
measurement ran. A progress line of the same height must not lay out the screen, one that wraps
to more lines must (or its text would be cut), and the line changes at most
ProbeRunner.PROGRESS_TEXT_INTERVAL_S apart however often the probe reports."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any


from textual.widgets import ProgressBar, Static
from tests.ui_fakes import FakeProbe, sync, until

from tests.test_ui_learner import SMALL, WIDE, services
from tutor.labs import Measurement, ProbeResult
from tutor.ui.app import TutorApp
from tutor.ui.widgets.measure import MeasureBlock, ProbeRunner
from tutor.ui.widgets.static_text import show_text


class SilentProbe(FakeProbe):
    """Runs until cancelled and reports nothing itself: the test posts every progress message."""

    def run(self, params: dict, progress: Any, cancel: threading.Event) -> ProbeResult:
        cancel.wait()
        return ProbeResult(self.name, (Measurement("matmul fp32", 10.0, "GFLOP/s", 268.8, "formula"),),
                           {}, "cancelled", cancelled=True)


def status_text(measure: MeasureBlock) -> str:
    return str(measure.query_one("#status", Static).content)


class LayoutSpy:
    """Counts the screen's layouts (Screen._refresh_layout: a reflow of every widget on it)."""

    def __init__(self, screen) -> None:
        self.count = 0
        self._layout = screen._refresh_layout
        screen._refresh_layout = self

    def __call__(self, *args, **kwargs):
        self.count += 1
        return self._layout(*args, **kwargs)


async def measuring(pilot, app) -> MeasureBlock:
    """The busy lesson's measure block, running its silent probe, with its first progress line shown."""
    measure = app.screen.query_one(MeasureBlock)
    measure.start_probe()
    await until(pilot, lambda: measure.running, "the probe to start")
    measure.post_message(ProbeRunner.Progress(measure, 0.1, "fp32: size 1 of 9"))
    await until(pilot, lambda: status_text(measure).startswith("fp32: size 1 of 9"), "the first progress line")
    return measure


@sync
async def test_progress_lines_of_one_height_repaint_without_a_layout_and_a_taller_one_lays_out():
    for size in (WIDE, SMALL):
        app = TutorApp(services(probes={"slow": SilentProbe("slow")}), lesson_id="learner/busy")
        async with app.run_test(size=size) as pilot:
            measure = await measuring(pilot, app)
            measure.PROGRESS_TEXT_INTERVAL_S = 0.0
            status = measure.query_one("#status", Static)
            assert status.region.height == 1
            spy = LayoutSpy(app.screen)
            for step in range(2, 8):
                measure.post_message(ProbeRunner.Progress(measure, step / 10, f"fp32: size {step} of 9"))
                await until(pilot, lambda step=step: status_text(measure).startswith(f"fp32: size {step} "),
                            f"progress line {step}")
                assert measure.query_one(ProgressBar).progress == step * 10
            assert spy.count == 0, f"{spy.count} layouts of the lesson for one-line progress at {size}"
            long = "fp32: " + " ".join(f"size {n} of 9 still settling" for n in range(12))
            measure.post_message(ProbeRunner.Progress(measure, 0.9, long))
            await until(pilot, lambda: status_text(measure).startswith(long), "the long progress line")
            await until(pilot, lambda: status.region.height > 1, "the status line to grow to its text")
            assert spy.count >= 1
            measure.cancel()
            await until(pilot, lambda: not measure.running, "the cancelled probe to finish")


@sync
async def test_the_progress_line_changes_no_faster_than_its_interval_and_a_result_replaces_a_waiting_one():
    app = TutorApp(services(probes={"slow": SilentProbe("slow")}), lesson_id="learner/busy")
    async with app.run_test(size=WIDE) as pilot:
        measure = await measuring(pilot, app)
        measure.PROGRESS_TEXT_INTERVAL_S = 3600.0  # within the interval of the first line for the whole test
        measure.post_message(ProbeRunner.Progress(measure, 0.5, "fp32: size 5 of 9"))
        await until(pilot, lambda: measure.query_one(ProgressBar).progress == 50, "the bar to move")
        assert status_text(measure).startswith("fp32: size 1 of 9")  # the bar moves, the text waits
        measure.cancel()
        await until(pilot, lambda: not measure.running, "the cancelled probe to finish")
        assert "size 5" not in status_text(measure) and "cancelled" in status_text(measure)


@sync
async def test_a_waiting_progress_line_is_shown_when_its_interval_ends():
    app = TutorApp(services(probes={"slow": SilentProbe("slow")}), lesson_id="learner/busy")
    async with app.run_test(size=WIDE) as pilot:
        measure = await measuring(pilot, app)
        measure.PROGRESS_TEXT_INTERVAL_S = 0.2
        for step in (2, 3, 4):  # within one interval of the first: only the newest is shown, later
            measure.post_message(ProbeRunner.Progress(measure, step / 10, f"fp32: size {step} of 9"))
        await until(pilot, lambda: status_text(measure).startswith("fp32: size 4 of 9"), "the newest line")
        measure.cancel()
        await until(pilot, lambda: not measure.running, "the cancelled probe to finish")


@sync
async def test_show_text_leaves_an_unchanged_line_alone():
    app = TutorApp(services(), lesson_id="learner/busy")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        status = app.screen.query_one(MeasureBlock).query_one("#status", Static)
        assert show_text(status, "ready", "status")
        await pilot.pause()
        assert not show_text(status, "ready", "status")
        assert show_text(status, "broken", "error") and status.classes == {"error"}


def test_a_tall_sparkline_has_one_span_per_run_of_a_colour_with_each_cell_coloured_as_before():
    from rich.console import Console

    from tutor.ui.widgets.live_pane import spark_rows

    values = [10.0 * (n % 11) for n in range(60)]
    mine = [50.0 if n < 30 else 0.0 for n in range(60)]
    rows = spark_rows(values, 0.0, 100.0, 60, 4, mine=mine)
    bottom = rows[-1]
    colours = [bottom.get_style_at_offset(Console(), n).color.name for n in range(60)]
    changes = sum(1 for a, b in zip(colours, colours[1:]) if a != b)
    assert len(bottom.spans) == changes + 1
    # column n is the app's (cyan) on the bottom row where the app's share reaches what is drawn there
    assert colours[1] == "cyan" and colours[40] == "green" and colours[0] == "green"  # column 0: nothing drawn
    assert all(len(row.spans) == 1 for row in spark_rows(values, 0.0, 100.0, 60, 4))  # no `mine`: one colour
