"""Progress and settings survive concurrent writers, keep keys they do not know, and the app says
when the data folder stops being writable."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tutor.lessons.progress import ProgressStore
from tutor.files.settings import Settings, load_settings, save_settings

ROOT = Path(__file__).parent.parent
LESSON = "memory/training-memory"
WRITER = """
import sys
from pathlib import Path
from tutor.lessons.progress import ProgressStore
store = ProgressStore(Path(sys.argv[1]))
for i in range(int(sys.argv[3])):
    store.mark_block("memory/training-memory", f"{sys.argv[2]}-{i}")
"""


def test_concurrent_writers_lose_no_update(tmp_path: Path) -> None:
    # Before the lock, 3 writers x 150 updates lost 7 to 10 of them here.
    path, writers, updates = tmp_path / "progress.json", ("a", "b", "c"), 150
    processes = [subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, str(updates)], cwd=ROOT)
                 for name in writers]
    assert [process.wait(timeout=120) for process in processes] == [0, 0, 0]
    done = set(json.loads(path.read_text())["lessons"][LESSON]["done_blocks"])
    assert done == {f"{name}-{i}" for name in writers for i in range(updates)}


def test_progress_keeps_keys_it_does_not_know(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    path.write_text(json.dumps({
        "version": 1, "learner_id": "abc", "last_lesson": None, "streak": {"days": 3},
        "lessons": {LESSON: {"done_blocks": ["q1"], "completed": False, "notes": "from a newer version"}},
    }))
    store = ProgressStore(path)
    store.mark_block(LESSON, "q2")
    saved = json.loads(path.read_text())
    assert saved["streak"] == {"days": 3}
    assert saved["lessons"][LESSON]["notes"] == "from a newer version"
    assert saved["lessons"][LESSON]["done_blocks"] == ["q1", "q2"]


def test_settings_keep_keys_they_do_not_know(tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"theme": "nord", "font": "large", "sample_hz": 3}))
    settings, warning = load_settings(path)
    assert warning is None and settings.theme == "nord"
    assert save_settings(Settings(theme="gruvbox", sample_hz=settings.sample_hz), path) is None
    assert json.loads(path.read_text()) == {"theme": "gruvbox", "font": "large", "sample_hz": 3.0, "device": "auto"}


def test_settings_that_cannot_be_saved_return_one_line(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("a file where the folder belongs")
    warning = save_settings(Settings(theme="nord"), tmp_path / "data" / "settings.json")
    assert warning is not None and warning.startswith("could not save settings") and "\n" not in warning


def test_app_shows_warnings_from_after_start_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.ui_fakes import FakeSettings, fake_services, until

    import tutor.ui.app as app_module

    monkeypatch.setattr(app_module, "PROGRESS_WARNING_CHECK_S", 0.05)
    folder = tmp_path / "data"
    folder.mkdir()
    progress = ProgressStore(folder / "progress.json")
    settings_path = folder / "settings.json"
    services = fake_services(progress=progress, settings=FakeSettings(theme="nord"),
                             save_settings=lambda settings: save_settings(Settings(theme=settings.theme),
                                                                          settings_path))

    async def scenario() -> list[str]:
        app = app_module.TutorApp(services)
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await pilot.pause()
            shutil.rmtree(folder)
            folder.write_text("the data folder became a file")
            progress.mark_block(LESSON, "q1")
            app.theme = "gruvbox"

            def said(start: str) -> bool:
                return any(str(note.message).startswith(start) for note in app._notifications)

            # The progress warning comes with the app's next look for one (every 0.05 s here).
            await until(pilot, lambda: said("cannot save progress") and said("could not save settings"),
                        "both warnings", limit_s=60)
            return [notification.message for notification in app._notifications]

    messages = asyncio.run(scenario())
    assert any(message.startswith("cannot save progress") for message in messages), messages
    assert any(message.startswith("could not save settings") for message in messages), messages


def test_the_place_in_a_lesson_is_kept_and_a_malformed_one_dropped(tmp_path: Path) -> None:
    path = tmp_path / "progress.json"
    store = ProgressStore(path)
    assert store.place("memory/roofline") is None
    store.set_place("memory/roofline", (3, 0.25))
    assert ProgressStore(path).place("memory/roofline") == (3, 0.25)  # saved: another start reads it
    data = json.loads(path.read_text())
    for bad in ([3], [-1, 0.5], [2, 1.5], ["3", 0.2], [True, 0.1], "top", None):
        data["lessons"]["memory/roofline"]["place"] = bad
        path.write_text(json.dumps(data))
        assert ProgressStore(path).place("memory/roofline") is None, bad
