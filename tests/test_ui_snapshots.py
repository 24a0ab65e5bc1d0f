"""SVG snapshots of the main screens at 80x24 and 120x40, from deterministic fakes (a fixed
machine, canned samples, canned probe and bench results, a small fixed curriculum).

Regenerate after an intended change of the look: pytest tests/test_ui_snapshots.py --snapshot-update
and review tests/__snapshots__/ (or --snapshot-report report.html) before committing.
"""

from __future__ import annotations

from pathlib import Path

import pytest


from tests.ui_fakes import fake_services

pytest.importorskip("pytest_textual_snapshot")

from textual.widgets import Input

from tutor.ui.app import TutorApp

SMALL, WIDE = (80, 24), (120, 40)


@pytest.fixture(autouse=True)
def no_cursor_blink(monkeypatch):
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)


def app(lesson_id: str | None = None) -> TutorApp:
    return TutorApp(fake_services(), lesson_id=lesson_id)


async def settle(pilot) -> None:
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def test_home_small(snap_compare):
    assert snap_compare(app(), terminal_size=SMALL)


def test_home_wide(snap_compare):
    assert snap_compare(app(), terminal_size=WIDE)


def test_lesson_wide(snap_compare):
    assert snap_compare(app("precision/bits"), terminal_size=WIDE)


def test_lesson_small_stacks_the_live_pane(snap_compare):
    assert snap_compare(app("precision/speed"), terminal_size=SMALL)


def test_measure_result_wide(snap_compare):
    async def run_probe(pilot):
        from tutor.ui.widgets.measure import MeasureBlock

        pilot.app.screen.query_one(MeasureBlock).start_probe()
        await settle(pilot)

    assert snap_compare(app("precision/speed"), run_before=run_probe, terminal_size=WIDE)


def test_measure_result_small(snap_compare):
    async def run_probe(pilot):
        from tutor.ui.widgets.measure import MeasureBlock

        block = pilot.app.screen.query_one(MeasureBlock)
        block.start_probe()
        await settle(pilot)
        block.query_one("#run").focus()
        await pilot.pause()

    assert snap_compare(app("precision/speed"), run_before=run_probe, terminal_size=SMALL)


def test_home_back_from_a_lesson_small(snap_compare):
    async def visit(pilot):
        await pilot.pause()
        pilot.app.open_lesson("memory/train")
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()

    assert snap_compare(app(), run_before=visit, terminal_size=SMALL)


def test_help_wide(snap_compare):
    async def open_help(pilot):
        await pilot.pause()
        pilot.app.screen.query_one("#run").focus()
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(app("precision/speed"), run_before=open_help, terminal_size=WIDE)


def test_bench_result_wide(snap_compare, monkeypatch, tmp_path):
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))  # no saved runs: the screen shows this run only

    async def run_bench(pilot):
        from tests.ui_fakes import until

        await pilot.press("b", "r")
        await until(pilot, lambda: pilot.app.screen.query("PeakGauge") and not pilot.app.screen.running,
                    "the bench's result")

    assert snap_compare(app(), run_before=run_bench, terminal_size=WIDE)


def test_fit_small(snap_compare):
    async def open_fit(pilot):
        from tests.ui_fakes import until

        await pilot.press("f")
        # The time and the timeline under the memory arrive from a thread: their length sets the scrollbar.
        await until(pilot, lambda: getattr(pilot.app.screen, "time_settled", False), "the Fit screen's time")
        await pilot.pause()

    assert snap_compare(app(), run_before=open_fit, terminal_size=SMALL)


def test_help_small(snap_compare):
    async def open_help(pilot):
        await pilot.pause()
        pilot.app.screen.query_one("#value").focus()
        await pilot.press("f1")
        await pilot.pause()

    assert snap_compare(app("precision/bits"), run_before=open_help, terminal_size=SMALL)
