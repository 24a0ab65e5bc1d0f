"""SVG snapshots of every app picture (tutor/ui/widgets/plot.py) at 80x24 and 120x40: the matmul sweep,
the bandwidth sweep across the caches, the training step's memory timeline (for the Fit screen), the
prefill's, the collectives' busbw sweep, the Bench screen showing a stored run's sweeps, and the lab
drawings a lesson's measure block shows (its #drawing Static): the pipeline's measured step beside the
theory's schedule, the ddp step's buckets, the MoE experts' loads.

Regenerate after an intended change of the look: pytest tests/test_ui_plot_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

import pytest


pytest.importorskip("pytest_textual_snapshot")

from textual.app import App
from textual.containers import VerticalScroll
from textual.widgets import Input, Static
from tests.plot_data import HEADER, RESULTS, collective_results, ddp_result, moe_result, pipeline_result
from tests.ui_fakes import fake_services

from tutor.bench.notebook import append_run
from tutor.answers.pictures import bench_charts
from tutor.ui.app import TutorApp
from tutor.ui.widgets.plot import ChartView

SMALL, WIDE = (80, 24), (120, 40)
SIZES = pytest.mark.parametrize("size", [SMALL, WIDE], ids=["small", "wide"])


def timeline():
    """The Fit screen's picture: gpt2's predicted training step (transformers' modules, CPU rules)."""
    from tutor.files.models import resolve_model
    from tutor.answers.pictures import timeline_chart
    from tutor.theory.fit import FitRequest
    from tutor.theory.fit_timeline import training_timeline

    moments = training_timeline(resolve_model("gpt2")[0], FitRequest(mode="train", impl="hf", gpu=False, seq_len=1024))
    return timeline_chart([moment.to_json() for moment in moments])


def prefill():
    """llama-3.2-1b's predicted prefill of 4 x 8192 tokens."""
    from tutor.files.models import resolve_model
    from tutor.answers.pictures import timeline_chart
    from tutor.theory.fit import FitRequest
    from tutor.theory.fit_timeline import prefill_timeline

    moments = prefill_timeline(resolve_model("llama-3.2-1b")[0], FitRequest(mode="inference", batch=4, seq_len=8192))
    return timeline_chart([moment.to_json() for moment in moments])


class ChartApp(App[None]):
    def __init__(self, index: int) -> None:
        super().__init__()
        if index == 2:
            self.chart = timeline()
        elif index == 3:
            self.chart = prefill()
        elif index == 4:
            self.chart = bench_charts(collective_results(), HEADER)[0]
        else:
            self.chart = bench_charts(RESULTS, HEADER)[index]

    def compose(self):
        with VerticalScroll():
            yield ChartView(self.chart, id="chart")


@SIZES
def test_matmul_sweep(snap_compare, size):
    assert snap_compare(ChartApp(0), terminal_size=size)


@SIZES
def test_bandwidth_sweep(snap_compare, size):
    assert snap_compare(ChartApp(1), terminal_size=size)


@SIZES
def test_step_timeline(snap_compare, size):
    assert snap_compare(ChartApp(2), terminal_size=size)


@SIZES
def test_prefill_timeline(snap_compare, size):
    assert snap_compare(ChartApp(3), terminal_size=size)


@SIZES
def test_collective_sweep(snap_compare, size):
    assert snap_compare(ChartApp(4), terminal_size=size)


class DrawingApp(App[None]):
    """A lab's drawing as the measure block shows it: probe.render(result) in a Static."""

    def __init__(self, result) -> None:
        super().__init__()
        self.result = result

    def compose(self):
        from tutor.labs import get_probe

        with VerticalScroll():
            yield Static(get_probe(self.result.probe).render(self.result), id="drawing")


@SIZES
def test_pipeline_schedule_beside_theory(snap_compare, size):
    assert snap_compare(DrawingApp(pipeline_result()), terminal_size=size)


@SIZES
def test_ddp_buckets(snap_compare, size):
    assert snap_compare(DrawingApp(ddp_result()), terminal_size=size)


@SIZES
def test_moe_expert_loads(snap_compare, size):
    assert snap_compare(DrawingApp(moe_result()), terminal_size=size)


async def toggle_to_table(pilot) -> None:
    pilot.app.query_one(ChartView).focus()
    await pilot.press("t")
    await pilot.pause()


def test_table_only_when_the_picture_is_switched_off(snap_compare):
    assert snap_compare(ChartApp(1), terminal_size=SMALL, run_before=toggle_to_table)


@pytest.fixture
def stored_run(tmp_path, monkeypatch):
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    append_run({**HEADER, "command": "tensor-tutor bench", "date": "2025-01-10T10:00:00+00:00", "cancelled": False},
               RESULTS, tmp_path / "results.jsonl")


async def bench_scrolled_to_bandwidth(pilot) -> None:
    pilot.app.action_bench()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()  # the charts laid out: a scroll before that stopped short (a flaky snapshot)
    pilot.app.screen.query_one("#bandwidth-chart").scroll_visible(animate=False, top=True, immediate=True)
    await pilot.pause()


@SIZES
def test_bench_screen_shows_the_run_sweeps(snap_compare, size, stored_run):
    assert snap_compare(TutorApp(fake_services()), terminal_size=size, run_before=bench_scrolled_to_bandwidth)


def test_bench_screen_draws_a_stored_runs_busbw_sweep(tmp_path, monkeypatch):
    import asyncio

    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    append_run({**HEADER, "command": "tensor-tutor bench collective", "date": "2025-01-10T10:00:00+00:00",
                "cancelled": False}, collective_results(), tmp_path / "results.jsonl")

    async def check() -> None:
        app = TutorApp(fake_services())
        async with app.run_test(size=(120, 40)) as pilot:
            pilot.app.action_bench()
            await pilot.pause()
            await pilot.pause()
            view = pilot.app.screen.query_one("#collective-chart", ChartView)
            assert view.chart is not None and view.chart.title == "collective bus bandwidth against message size"
            assert [s.label for s in view.chart.series] == ["all_reduce gloo x2", "all_gather gloo x2"]
            assert view.display and not pilot.app.screen.query_one("#matmul-chart", ChartView).display

    asyncio.run(check())
