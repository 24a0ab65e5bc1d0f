"""Launch cost: before the home screen's first paint the app imports and runs only what that
screen shows. The machine is detected, the sampler and the measurement process started, after it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
from pathlib import Path


from tests.ui_fakes import fake_machine, fake_services, until
from tests.subprocess_env import pythonpath

from tutor.ui.app import TutorApp
from tutor.ui.machine_detection import MachineDetection
from tutor.ui.screens.home import DETECTING
from tutor.ui.widgets.device_header import DeviceHeader, device_label

ROOT = Path(__file__).resolve().parents[1]

DEFERRED = ("torch", "numpy", "textual_plot", "psutil", "pynvml", "rich.markdown", "tutor.hardware.machine",
            "tutor.hardware.nvidia", "tutor.hardware.specs", "tutor.hardware.cpu", "tutor.theory", "tutor.ui.widgets.measure",
            "tutor.ui.widgets.live_pane", "tutor.ui.screens.lesson", "tutor.ui.screens.bench",
            "tutor.ui.screens.fit", "tutor.lessons.values", "tutor.lessons.grading", "tutor.bench", "tutor.labs",
            "tutor.worker.proxies", "tutor.worker.jobs", "tutor.hardware.sampler", "tutor.lessons.model",
            "tutor.ui.screens.help", "secrets")
"""Modules the home screen does not need: none may be imported when it is first painted."""

FIRST_PAINT = """
import asyncio, dataclasses, json, sys
from tutor.ui.app import TutorApp
from tutor.ui.services import default_services
from tutor.ui.widgets.device_header import DeviceHeader

seen = {}

class Launch(TutorApp):
    CSS_PATH = TutorApp.CSS_PATH

    def start_after_first_paint(self):
        seen["modules"] = sorted(sys.modules)
        seen["header"] = self.screen.query_one(DeviceHeader).label
        super().start_after_first_paint()

async def main():
    # The real services, less the measurement process (that it starts after the paint is the app's
    # on_mount, checked with fakes in test_ui_app): no torch process in this test.
    services = dataclasses.replace(default_services(), worker=None)
    app = Launch(services)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.detected_machine is None:
            await asyncio.sleep(0.02)
        await pilot.pause()
        seen["header_after"] = app.screen.query_one(DeviceHeader).label
        seen["modules_after"] = sorted(sys.modules)

asyncio.run(main())
print(json.dumps(seen))
"""


def first_paint_report(tmp_path: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": pythonpath(ROOT), "TENSOR_TUTOR_DATA_DIR": str(tmp_path)}
    # Launch.CSS_PATH: the subclass lives in a script, so app.tcss is named by TutorApp's folder.
    script = FIRST_PAINT.replace("CSS_PATH = TutorApp.CSS_PATH",
                                 f"CSS_PATH = {str(ROOT / 'tutor' / 'ui' / 'app.tcss')!r}")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          cwd=str(tmp_path), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_home_screen_is_painted_before_anything_it_does_not_show_is_imported(tmp_path):
    report = first_paint_report(tmp_path)
    imported = [name for name in DEFERRED if name in report["modules"]]
    assert imported == [], f"imported before the home screen's first paint: {imported}"
    assert report["header"] == DETECTING
    # After the paint the machine is detected and fills the header, and the live sampler runs.
    assert "tutor.hardware.machine" in report["modules_after"] and "tutor.hardware.sampler" in report["modules_after"]
    assert report["header_after"] != DETECTING and ("CPU" in report["header_after"] or "GPU" in report["header_after"])


def test_home_header_says_detecting_until_the_machine_is_detected():
    release = threading.Event()
    calls: list[str] = []

    def slow_detection():
        calls.append(threading.current_thread().name)
        release.wait(60)
        return fake_machine()

    async def scenario():
        app = TutorApp(fake_services(machine_detection=MachineDetection(slow_detection)))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: calls, "the detection thread to start")
            header = app.screen.query_one(DeviceHeader)
            assert header.label == DETECTING and app.detected_machine is None
            release.set()
            await until(pilot, lambda: app.detected_machine is not None, "the machine to be detected")
            assert header.label == device_label(fake_machine())
            assert calls != [threading.main_thread().name]  # detected off the event loop's thread

    asyncio.run(scenario())


def test_a_screen_that_needs_the_machine_first_detects_it_once():
    calls = []
    detection = MachineDetection(lambda: calls.append(1) or fake_machine())
    assert detection.ready() is None
    threads = [threading.Thread(target=detection.result) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert detection.ready() is detection.result() and len(calls) == 1
    known = MachineDetection.known(fake_machine(gpu=True))
    assert known.ready() is not None and known.ready().gpus

