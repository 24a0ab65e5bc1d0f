"""Links in the data folder are never followed: what a link points to outside the folder is left
byte for byte as it was, whatever tensor-tutor writes, appends to or locks there (tutor.files.storage's
safe file layer). A link in a file's place is moved aside with one line that names it."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tutor.bench.notebook import append_run, read_notebook
from tutor.files.lock import locked
from tutor.lessons.progress import ProgressStore
from tutor.files.settings import Settings, save_settings
from tutor.files.storage import (
    SymlinkError,
    UnsafePathError,
    read_regular_bytes,
    safe_folder,
    write_json_atomic,
    write_regular_text,
)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX links and O_NOFOLLOW")

PRECIOUS = b"someone else's file: not JSON, no final newline"
LESSON = "memory/training-memory"


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(folder))
    return folder


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A file outside the data folder that a planted link points at."""
    target = tmp_path / "elsewhere" / "precious.txt"
    target.parent.mkdir()
    target.write_bytes(PRECIOUS)
    return target


def links_in(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_symlink())


def assert_moved_aside(folder: Path, name: str, target: Path, warning: str | None) -> None:
    assert warning is not None and "\n" not in warning
    assert f"{name} was a symbolic link to {target}; moved it to {name}.symlink-" in warning, warning
    (side,) = [p for p in folder.iterdir() if p.name.startswith(f"{name}.symlink-")]
    assert os.readlink(side) == str(target)  # the link itself kept, still pointing where it did


def test_a_symlinked_notebook_is_moved_aside_and_its_target_is_untouched(data: Path, outside: Path) -> None:
    (data / "results.jsonl").symlink_to(outside)
    warning = append_run({"command": "bench"}, [{"kind": "matmul"}])
    assert outside.read_bytes() == PRECIOUS  # before: its last line cut off and a run appended to it
    assert_moved_aside(data, "results.jsonl", outside, warning)
    assert warning is not None and warning.endswith("this run starts a fresh results.jsonl")
    fresh = data / "results.jsonl"
    assert stat.S_ISREG(fresh.lstat().st_mode) and len(read_notebook().runs) == 1


def test_a_hard_linked_notebook_is_moved_aside(data: Path, tmp_path: Path) -> None:
    other = data / "my-backup.jsonl"  # a second name for the same file (on the same file system)
    other.write_bytes(PRECIOUS)
    os.link(other, data / "results.jsonl")
    warning = append_run({"command": "bench"}, [])
    assert other.read_bytes() == PRECIOUS
    assert warning is not None and "results.jsonl was a file with 2 hard links" in warning and "\n" not in warning
    assert os.stat(data / "results.jsonl").st_nlink == 1 and len(read_notebook().runs) == 1


def test_a_fifo_in_the_notebooks_place_is_still_refused_in_one_line(data: Path) -> None:
    os.mkfifo(data / "results.jsonl")
    warning = append_run({"command": "bench"}, [])
    assert warning is not None and "not a regular file" in warning and "\n" not in warning


def test_bench_with_a_symlinked_notebook_says_one_line(data: Path, outside: Path, monkeypatch: pytest.MonkeyPatch,
                                                        measure_on_cpu: None) -> None:
    from tests.test_bench_cli import fake_machine
    from tutor.commands.bench import bench

    monkeypatch.setattr("tutor.bench.environment.load_machine", fake_machine)
    (data / "results.jsonl").symlink_to(outside)
    result = CliRunner().invoke(bench, ["matmul", "--dtype", "fp32", "--budget", "1", "--json"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert outside.read_bytes() == PRECIOUS
    lines = [line for line in result.stderr.splitlines() if "symbolic link" in line]
    assert len(lines) == 1 and lines[0].startswith("tensor-tutor: warning: results.jsonl was a symbolic link")
    assert len(read_notebook().runs) == 1


def test_a_symlinked_progress_file_is_moved_aside_on_load(data: Path, outside: Path) -> None:
    (data / "progress.json").symlink_to(outside)
    store = ProgressStore()
    assert_moved_aside(data, "progress.json", outside, store.warning)
    store.mark_block(LESSON, "q1")
    assert store.persistent and outside.read_bytes() == PRECIOUS
    assert not (data / "progress.json").is_symlink()


def test_a_link_planted_after_load_is_moved_aside_on_save(data: Path, outside: Path) -> None:
    store = ProgressStore()
    (data / "progress.json").symlink_to(outside)
    store.mark_block(LESSON, "q1")
    assert outside.read_bytes() == PRECIOUS
    assert_moved_aside(data, "progress.json", outside, store.warning)
    assert json.loads((data / "progress.json").read_text())["lessons"][LESSON]["done_blocks"] == ["q1"]


def test_a_symlinked_settings_file_is_moved_aside_on_save(data: Path, outside: Path) -> None:
    (data / "settings.json").symlink_to(outside)
    warning = save_settings(Settings(theme="nord"))
    assert outside.read_bytes() == PRECIOUS
    assert_moved_aside(data, "settings.json", outside, warning)
    assert json.loads((data / "settings.json").read_text())["theme"] == "nord"


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlinked_lock_file_creates_and_changes_nothing_outside(data: Path, outside: Path, dangling: bool) -> None:
    target = outside.with_name("created-by-the-lock") if dangling else outside
    (data / ".progress.json.lock").symlink_to(target)
    store = ProgressStore()
    store.mark_block(LESSON, "q1")
    if dangling:
        assert not os.path.lexists(target)  # before: O_CREAT made it (as root: anywhere)
    else:
        assert outside.read_bytes() == PRECIOUS
    assert store.persistent
    assert_moved_aside(data, ".progress.json.lock", target, store.warning)
    with locked(data / "progress.json") as moved:
        assert moved is None  # the lock file is now a regular file of our own


def test_a_symlinked_cache_file_is_replaced_not_written_through(data: Path, outside: Path) -> None:
    cache = data / "cache"
    cache.mkdir()
    (cache / "host-costs.json").symlink_to(outside)
    with pytest.raises(SymlinkError):
        read_regular_bytes(cache / "host-costs.json", 1 << 20)  # not read through either
    write_json_atomic(cache / "host-costs.json", {"format": 1})
    assert outside.read_bytes() == PRECIOUS
    assert json.loads((cache / "host-costs.json").read_text()) == {"format": 1}


def test_a_symlinked_sub_folder_is_refused(data: Path, outside: Path) -> None:
    (data / "cache").symlink_to(outside.parent)
    with pytest.raises(SymlinkError, match="symbolic link"):
        write_json_atomic(data / "cache" / "curriculum-index.json", {})
    with pytest.raises(SymlinkError):
        write_regular_text(data / "cache" / "picture.svg", "<svg/>")
    assert sorted(p.name for p in outside.parent.iterdir()) == ["precious.txt"]


def test_an_export_into_a_symlinked_exports_folder_writes_nothing_outside(data: Path, outside: Path) -> None:
    from tutor.export import save_picture_files

    (data / "exports").symlink_to(outside.parent)
    from tutor.errors import UserError

    with pytest.raises(UserError):
        save_picture_files([], data / "exports", "fit")
    assert sorted(p.name for p in outside.parent.iterdir()) == ["precious.txt"]


def test_links_outside_the_data_folder_are_followed_for_reading(tmp_path: Path, outside: Path) -> None:
    # Model folders (the Hugging Face cache is links) and lessons may be links: only the data folder is strict.
    link = tmp_path / "config.json"
    link.symlink_to(outside)
    assert read_regular_bytes(link, 1 << 20) == PRECIOUS


def test_a_symlinked_data_folder_is_the_learners_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tmp_path / "big-disk" / "tensor-tutor"
    real.mkdir(parents=True)
    link = tmp_path / "data-link"
    link.symlink_to(real)
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(link))
    store = ProgressStore()
    store.mark_block(LESSON, "q1")
    assert store.persistent and store.warning is None
    assert append_run({"command": "bench"}, []) is None
    assert sorted(p.name for p in real.iterdir() if not p.name.startswith(".")) == ["progress.json", "results.jsonl"]


def test_a_missing_data_folder_is_made_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "new" / "tensor-tutor"
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(folder))
    assert save_settings(Settings(theme="nord")) is None
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_a_data_folder_every_user_may_write_in_is_refused(data: Path) -> None:
    data.chmod(0o777)
    store = ProgressStore()
    store.mark_block(LESSON, "q1")
    assert not store.persistent and "every user may write in" in store.warning and "\n" not in store.warning
    assert "chmod o-w" in store.warning
    warning = append_run({"command": "bench"}, [])
    assert warning is not None and "every user may write in" in warning
    assert list(data.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="only root can give a folder away")
def test_as_root_another_users_data_folder_is_refused(data: Path) -> None:
    os.chown(data, 4242, 4242)  # a user who could plant links in it, then wait for root to write
    with pytest.raises(UnsafePathError, match="belongs to another user"):
        safe_folder(data)
    assert save_settings(Settings(theme="nord")) is not None
    assert list(data.iterdir()) == []


def test_data_reset_deletes_a_link_not_its_target(data: Path, outside: Path) -> None:
    from tests.cli_runner import run

    (data / "settings.json").symlink_to(outside)
    code, out, _ = run(["data", "reset", "settings", "--yes"])
    assert code == 0 and not os.path.lexists(data / "settings.json")
    assert outside.read_bytes() == PRECIOUS
