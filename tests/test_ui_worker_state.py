"""The app while it measures: the measurement process's state in the header and in a waiting
block, predict results kept per lesson with the probe's drawing, warnings from progress and settings as
toasts when the data folder cannot be written, and the collector's full passes kept off key presses."""

from __future__ import annotations

import dataclasses
import functools
import gc
import threading
from pathlib import Path


from rich.text import Text
from textual.widgets import Static
from tests.ui_fakes import FakeProbe, fake_services, sync, until

from tutor.lessons.progress import ProgressStore
from tutor.files.settings import load_settings, save_settings
from tutor.ui import app as app_module
from tutor.ui.app import HELD_FULL_COLLECTIONS, TutorApp
from tutor.ui.widgets.device_header import DeviceHeader, header_line
from tutor.ui.widgets.measure import MeasureBlock
from tutor.ui.widgets.predict import PredictBlock
from tutor.worker.client import WorkerState

SMALL, WIDE = (80, 24), (120, 40)


def rendered(widget) -> str:
    return str(widget.render())


# ---- the measurement process's state ---------------------------------------------------------------

def test_the_header_says_what_the_measurement_process_does_after_the_place_and_before_the_device():
    line = header_line("Lower precision, more speed?", "CPU only · no NVIDIA GPU · Xeon", 120, "loading torch…").plain
    assert line.index("Lower precision") < line.index("loading torch…") < line.index("CPU only")
    narrow = header_line("Lower precision, more speed?", "CPU only · no NVIDIA GPU · Xeon", 62, "loading torch…").plain
    assert "Lower precision, more speed?" in narrow and "loading torch…" in narrow
    tight = header_line("Lower precision, more speed?", "CPU", 40, "restarting measurer…").plain
    assert "Lower precision, more speed?" in tight and "restarting" not in tight  # the place wins
    assert WorkerState("busy", job="matmul").short == "measuring…" and WorkerState("not started").short == ""


@sync
async def test_the_header_follows_the_worker_state_on_every_screen():
    app = TutorApp(fake_services(), lesson_id="precision/speed")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        header = app.screen.query_one(DeviceHeader)
        assert header.worker == ""  # fake services: no measurement process, nothing to say
        app.worker_state = WorkerState("loading torch")
        await pilot.pause()
        assert "loading torch…" in rendered(header).replace("\n", "")
        app.worker_state = WorkerState("busy", job="matmul")
        await pilot.pause()
        assert "measuring…" in rendered(header)
        app.action_home()
        await pilot.pause()
        assert app.screen.query_one(DeviceHeader).worker == "measuring…"


@sync
async def test_a_run_that_waits_for_torch_says_so_in_its_block():
    app = TutorApp(fake_services(), lesson_id="memory/train")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        app.worker_state = WorkerState("loading torch")
        block = app.screen.query_one(MeasureBlock)
        block.start_probe()
        status = rendered(block.query_one("#status", Static))
        assert status.startswith("loading torch in the measurement process… then running")
        block.cancel()
        await app.workers.wait_for_complete()
        app.worker_state = WorkerState("ready")
        await pilot.pause()
        block.start_probe()
        assert rendered(block.query_one("#status", Static)).startswith("running")
        block.cancel()
        await app.workers.wait_for_complete()


# ---- predict blocks keep their result --------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class DrawingMatmul(FakeProbe):
    """The fake matmul with details and a drawing (Probe.render), as the torch.distributed labs have."""

    def run(self, params, progress, cancel: threading.Event):
        return dataclasses.replace(super().run(params, progress, cancel), details={"ranks": 2})

    @staticmethod
    def render(result):
        return Text(f"RANKS {result.details['ranks']}")


@sync
async def test_a_prediction_is_shown_again_with_its_drawing_when_the_learner_returns():
    services = fake_services()
    probe = DrawingMatmul("matmul")
    services = dataclasses.replace(services, probes={**services.probes, "matmul": probe})
    app = TutorApp(services, lesson_id="precision/speed")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        block = app.screen.query_one(PredictBlock)
        block.query_one("#guess").focus()
        await pilot.press("3", "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert "RANKS 2" in rendered(block.query_one("#drawing", Static))
        recorded = len(services.progress.predictions) if hasattr(services.progress, "predictions") else None
        calls = len(probe.calls)
        app.open_lesson("precision/bits")
        await pilot.pause()
        app.open_lesson("precision/speed")
        await pilot.pause()
        await pilot.pause()
        again = app.screen.query_one(PredictBlock)
        assert again is not block and len(probe.calls) == calls  # shown, not measured again
        verdict = rendered(again.query_one("#verdict", Static))
        assert "you predicted 3" in verdict and "measured 0.25" in verdict
        assert rendered(again.query_one("#status", Static)).startswith("measured just now")
        assert again.query_one("#drawing", Static).display and "RANKS 2" in rendered(again.query_one("#drawing"))
        if recorded is not None:
            assert len(services.progress.predictions) == recorded  # not recorded twice


# ---- warnings as toasts ----------------------------------------------------------------------------

def unwritable(path: Path) -> None:
    """Make writes to `path` fail even for root (a read-only mode does not stop root): a directory
    where the file must go, so the atomic rename onto it fails."""
    if path.exists():
        path.unlink()
    (path / "blocker").mkdir(parents=True)


def progress_checks(app) -> list[int]:
    """Counts the app's looks for a new progress warning (it looks every PROGRESS_WARNING_CHECK_S)."""
    checks: list[int] = []
    look = app.show_progress_warning

    def counted(*args, **kwargs):
        result = look(*args, **kwargs)
        checks.append(1)
        return result

    app.show_progress_warning = counted
    return checks


async def next_check(pilot, checks: list[int]) -> None:
    """Wait for the app's next look for a progress warning: the event a toast follows, not a time."""
    seen = len(checks)
    await until(pilot, lambda: len(checks) > seen, "the app's next look for a progress warning")


@sync
async def test_progress_and_settings_that_cannot_be_saved_are_toasts(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    progress = ProgressStore(data / "progress.json")
    settings, _ = load_settings(data / "settings.json")
    services = fake_services(progress=progress, settings=settings,
                             save_settings=functools.partial(save_settings, path=data / "settings.json"))
    app = TutorApp(services)
    toasts: list[tuple[str, str]] = []
    real_notify = app.notify

    def notify(message, *, severity="information", **kwargs):
        toasts.append((str(message), severity))
        real_notify(message, severity=severity, **kwargs)

    app.notify = notify
    checks = progress_checks(app)
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        assert toasts == []  # a writable folder: nothing to say
        unwritable(data / "progress.json")
        unwritable(data / "settings.json")
        app.open_lesson("precision/speed")  # saves the last lesson: the write fails
        await pilot.pause()
        await next_check(pilot, checks)
        assert any("cannot save progress" in text and severity == "warning" for text, severity in toasts), toasts
        shown = len(toasts)
        app.theme = "nord" if app.theme != "nord" else "gruvbox"
        await pilot.pause()
        assert any("could not save settings" in text and severity == "warning" for text, severity in toasts[shown:])
        shown = len(toasts)
        await next_check(pilot, checks)
        assert not any("cannot save progress" in text for text, _ in toasts[shown:])  # said once


@sync
async def test_a_data_folder_unwritable_at_start_is_a_toast_at_start(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    progress = ProgressStore(blocked / "progress.json")
    progress.set_last_lesson("precision/bits")  # the first write fails
    assert progress.warning
    services = fake_services(progress=progress, warnings=(progress.warning,))
    app = TutorApp(services)
    toasts: list[str] = []
    app.notify = lambda message, **kwargs: toasts.append(str(message))
    checks = progress_checks(app)
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        await next_check(pilot, checks)
        assert sum("cannot save progress" in text for text in toasts) == 1, toasts


# ---- the collector ---------------------------------------------------------------------------------

@sync
async def test_full_collections_wait_for_a_quiet_moment_and_thresholds_come_back_after(monkeypatch):
    before = gc.get_threshold()
    app = TutorApp(fake_services())
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        assert gc.get_threshold()[2] == HELD_FULL_COLLECTIONS
        assert gc.get_freeze_count() > 0  # start-up objects are out of the collector's reach
        app.last_collection_at -= app_module.FULL_COLLECTION_EVERY_S
        await pilot.press("down")  # a key just now: not the moment
        assert app.collect_when_idle() is False
        app.last_input_at -= app_module.INPUT_QUIET_S
        assert app.collect_when_idle() is True
        assert app.collect_when_idle() is False  # and not again before FULL_COLLECTION_EVERY_S
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
