"""The learner's place in the app: what an answered block shows when its lesson is reopened, the blocks
done per lesson and track on Home, and a measurement's result brought into view when it arrives."""

from __future__ import annotations

import asyncio
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from ui_fakes import FakeProbe, real_services, text_of, until  # noqa: E402

from tutor.labs import Measurement, ProbeResult  # noqa: E402
from tutor.ui.app import TutorApp  # noqa: E402
from tutor.ui.widgets.block import fully_visible  # noqa: E402

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
    from tutor.storage import data_dir

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
