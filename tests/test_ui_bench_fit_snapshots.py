"""SVG snapshots of the Bench screen with a saved history, the Fit screen, and a calc block, at 80x24
and 120x40, from the deterministic fakes (tests/ui_fakes.py) and a fixed results notebook.

Regenerate after an intended change of the look: pytest tests/test_ui_bench_fit_snapshots.py --snapshot-update
"""

from __future__ import annotations

from pathlib import Path

import pytest


pytest.importorskip("pytest_textual_snapshot")

from textual.app import App
from textual.widgets import Input
from tests.ui_fakes import fake_services

from tests.test_ui_bench_fit import write_notebook
from tutor.lessons.model import Calc
from tutor.ui.app import TutorApp
from tutor.ui.widgets.calc import CalcBlock

SMALL, WIDE = (80, 24), (120, 40)


@pytest.fixture(autouse=True)
def fixed_notebook(tmp_path, monkeypatch):
    monkeypatch.setattr(Input, "_toggle_cursor", lambda self: None)
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    write_notebook(tmp_path)


async def compare_first_and_last(pilot) -> None:
    pilot.app.action_bench()
    await pilot.pause()
    await pilot.press("m", "up", "up", "m")
    await pilot.pause()


@pytest.mark.parametrize("size", [SMALL, WIDE], ids=["small", "wide"])
def test_bench_history(snap_compare, size):
    assert snap_compare(TutorApp(fake_services()), terminal_size=size, run_before=compare_first_and_last)


async def fit_70b_training_on_h100(pilot) -> None:
    from tests.test_ui_bench_fit import fit_screen

    from tests.ui_fakes import until

    await fit_screen(pilot, model="llama-3.1-70b", mode="train", device="h100", seq="8k")
    # The time and the timeline under the memory arrive from a thread: their length sets the scrollbar.
    await until(pilot, lambda: pilot.app.screen.time_settled, "the Fit screen's time")
    await pilot.pause()


@pytest.mark.slow
@pytest.mark.parametrize("size", [SMALL, WIDE], ids=["small", "wide"])
def test_fit_screen(snap_compare, size):
    assert snap_compare(TutorApp(fake_services()), terminal_size=size, run_before=fit_70b_training_on_h100)


class CalcApp(App[None]):
    def compose(self):
        block = Calc("memory", "llama-3.1-8b", ("model", "mode", "seq", "memory"),
                     {"model": "llama-3.1-8b", "mode": "train", "seq": 131_072, "memory": 80 * 10**9}, id="c")
        yield CalcBlock(block, lesson_id="memory/fit-check", services=fake_services())


@pytest.mark.parametrize("size", [SMALL, WIDE], ids=["small", "wide"])
def test_calc_block(snap_compare, size):
    assert snap_compare(CalcApp(), terminal_size=size)
