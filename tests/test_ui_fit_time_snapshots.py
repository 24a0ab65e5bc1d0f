"""SVG snapshots of the Fit screen's time and memory timeline at 80x24 and 120x40: a training step on a
card (the time panel, then the timeline with its peak), a prefill and decode on a card, and this
machine with no bench run (the one line that says why there is no time); from the fakes of ui_fakes.

Regenerate after an intended change of the look: pytest tests/test_ui_fit_time_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

import pytest


pytest.importorskip("pytest_textual_snapshot")

from textual.containers import VerticalScroll
from textual.widgets import Input
from tests.ui_fakes import fake_services, until

from tutor.ui.app import TutorApp

SIZES = pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["small", "wide"])


@pytest.fixture(autouse=True)
def no_cursor_blink(monkeypatch):
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)


def shown_at(part: str, **values):
    """Open the Fit screen with `values`, wait for its time, and scroll `part` (#fit-time, #timeline) to the top."""
    async def run_before(pilot) -> None:
        from tests.test_ui_bench_fit import fit_screen

        await fit_screen(pilot, **values)
        screen = pilot.app.screen
        await until(pilot, lambda: screen.time_settled, "the Fit screen's time")
        await pilot.app.workers.wait_for_complete()
        await pilot.pause()
        screen.query_one("#fit", VerticalScroll).scroll_to_widget(screen.query_one(part), animate=False, top=True)
        await pilot.pause()
        await pilot.pause()

    return run_before


TRAIN_ON_H100 = dict(model="llama-3.2-1b", mode="train", device="h100", seq="8k")


@SIZES
def test_fit_time_training(snap_compare, size):
    assert snap_compare(TutorApp(fake_services()), terminal_size=size, run_before=shown_at("#fit-time", **TRAIN_ON_H100))


@SIZES
def test_fit_timeline_training(snap_compare, size):
    assert snap_compare(TutorApp(fake_services()), terminal_size=size, run_before=shown_at("#fit-peak", **TRAIN_ON_H100))


@SIZES
def test_fit_time_inference(snap_compare, size):
    assert snap_compare(TutorApp(fake_services()), terminal_size=size,
                        run_before=shown_at("#fit-time", model="llama-3.1-8b", mode="inference", device="h100"))


@SIZES
def test_fit_time_without_a_bench_run(snap_compare, size):
    assert snap_compare(TutorApp(fake_services()), terminal_size=size,
                        run_before=shown_at("#fit-time", model="llama-3.2-1b", mode="train"))
