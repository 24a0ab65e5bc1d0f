"""The real app with its real measurement process, in a fresh interpreter: probes run through the
services while Textual runs (the collective's rank processes too, which failed inside Textual
before: `bad value(s) in fds_to_keep`), and the app's own process never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent

SCRIPT = textwrap.dedent("""
    import asyncio, json, sys, threading
    from tutor.ui.app import TutorApp
    from tutor.ui.services import default_services

    def run(probe, params):
        return probe.run(params, lambda fraction, text: None, threading.Event())

    async def main():
        services = default_services()
        app = TutorApp(services)
        phases = []
        async with app.run_test(size=(120, 40)) as pilot:
            app.watch(app, "worker_state", lambda state: phases.append(state.phase))
            cast = await asyncio.to_thread(run, services.probes["cast-error"], {"count": 200, "budget_s": 0.5})
            ranks = await asyncio.to_thread(run, services.probes["collective"],
                                            {"ranks": 2, "sizes": ["64KiB"], "ops": ["all_reduce"], "budget_s": 0.5})
            stored = await asyncio.to_thread(services.torch_cast, "0.1", ["fp32", "bf16"])
            await pilot.pause()
            pid = services.worker.pid
        print(json.dumps({"cast": cast.metrics, "cast_rows": len(cast.rows), "ranks": ranks.metrics,
                          "ranks_summary": ranks.summary, "stored": stored, "phases": phases, "pid": pid,
                          "after_exit": services.worker.state.phase, "torch": "torch" in sys.modules}))

    asyncio.run(main())
""")


@pytest.mark.slow
def test_probes_run_in_the_worker_while_the_app_runs_and_the_app_never_imports_torch():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["torch"] is False, "the app's process imported torch"
    assert report["cast_rows"] > 0 and report["cast"], report
    assert report["ranks"]["algbw_all_reduce"] > 0, report["ranks_summary"]
    assert report["stored"]["fp32"] == float.fromhex("0x1.99999a0000000p-4")  # 0.1 rounded to fp32
    assert report["stored"]["bf16"] == float.fromhex("0x1.9a00000000000p-4")  # 0.1 rounded to bf16
    assert "ready" in report["phases"] and "busy" in report["phases"]
    assert report["after_exit"] == "stopped"
    deadline = time.monotonic() + 30  # a limit for a hang only: the loop ends when the process is gone
    while Path(f"/proc/{report['pid']}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{report['pid']}").exists(), "the worker outlived the app"


LAB_BLOCK_SCRIPT = textwrap.dedent("""
    import asyncio, dataclasses, json, sys, time
    from tests.ui_fakes import FakeCurriculum
    from tutor.lessons.model import Lesson, Measure, Prose, Track
    from tutor.lessons.model import LessonInfo as Info
    from tutor.ui.app import TutorApp
    from tutor.ui.services import default_services
    from tutor.ui.widgets.measure import MeasureBlock

    LESSON = Lesson(Info("par/tensor", "Tensor parallel, tiny", "par", 5, (), "two ranks"), (
        Prose("Two ranks split one MLP and attention block."),
        Measure("tensor", {"ranks": 2, "hidden": 64, "heads": 2, "seq": 16, "batch": 1}, "", id="measure-1"),
    ))
    TRACK = Track("par", "Parallelism", "Ranks.", ("par/tensor",))

    async def main():
        services = dataclasses.replace(default_services(), curriculum=FakeCurriculum((LESSON,), (TRACK,)))
        app = TutorApp(services, lesson_id="par/tensor")
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            await pilot.pause()
            block = app.screen.query_one(MeasureBlock)
            focused_run = app.focused is block.query_one("#run")
            header_seen = set()
            await pilot.press("enter")  # the Run button has focus: the lab starts at once
            started = time.monotonic()
            await pilot.pause()
            was_running = block.running
            while block.running and time.monotonic() - started < 180:
                header_seen.add(app.screen.query_one("DeviceHeader").worker)
                await asyncio.sleep(0.1)
            await pilot.pause()
            result = block.result
            print(json.dumps({"focused_run": focused_run, "was_running": was_running, "running": block.running,
                              "error": "error" in block.query_one("#status").classes,
                              "metrics": dict(result.metrics) if result is not None else None,
                              "details": sorted(result.details) if result is not None else [],
                              "drawing_shown": block.query_one("#drawing").display,
                              "header": sorted(header_seen), "torch": "torch" in sys.modules}))

    asyncio.run(main())
""")


@pytest.mark.slow
def test_a_two_rank_lab_block_runs_from_its_lesson_through_the_real_worker():
    done = subprocess.run([sys.executable, "-c", LAB_BLOCK_SCRIPT], capture_output=True, text=True, cwd=ROOT,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["focused_run"] and report["was_running"], report
    assert not report["running"] and not report["error"], report
    assert report["metrics"] and report["metrics"]["max_abs_error"] <= 1e-4, report
    assert report["drawing_shown"], "the lab's own drawing (Probe.render) is not shown"
    assert "measuring…" in report["header"], report["header"]
    assert report["torch"] is False, "the app's process imported torch"
