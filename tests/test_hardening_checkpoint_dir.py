"""`lab checkpoint-write dir=` that is missing, a file, too small or fills up: one line, exit 2."""

from __future__ import annotations

import errno
import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from tests.cli_runner import run as run_cli
from tutor.errors import UserError
from tutor.labs import checkpoint


def run(argv: list[str]) -> tuple[int, str]:
    code, _, err = run_cli(argv)
    return code, err


def assert_one_line(argv: list[str], fragment: str) -> None:
    code, err = run(argv)
    last = err.replace("\r", "\n").strip().splitlines()[-1]
    assert code == 2 and "Traceback" not in err, (code, err)
    assert last.startswith("tensor-tutor: error:") and fragment in last, err


def test_missing_folder(tmp_path: Path) -> None:
    assert_one_line(["lab", "checkpoint-write", f"dir={tmp_path / 'missing'}", "size_mb=1"], "no such directory")


def test_a_file_as_folder(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert_one_line(["lab", "checkpoint-write", f"dir={tmp_path / 'file'}", "size_mb=1"], "is a file")


def test_not_enough_room_is_refused_before_building(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: usage(2**30, 2**30 - 2**20, 2**20))
    assert_one_line(["lab", "checkpoint-write", f"dir={tmp_path}", "size_mb=4"], "1 MiB free")


def test_a_disk_that_fills_while_writing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    assert_one_line(["lab", "checkpoint-write", f"dir={tmp_path}", "size_mb=1", "budget_s=0.1"], "the disk is full")
    assert list(tmp_path.iterdir()) == []  # the temporary folder is gone


def test_torch_reports_a_full_disk_as_a_runtime_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What torch.save raised on a full 2 MiB tmpfs here: "[enforce fail at inline_container.cc:672] unexpected pos".
    usage = namedtuple("usage", "total used free")
    error = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: usage(2**21, 2**21, 0))
    assert "the disk is full" in str(checkpoint._write_failed("dir=x", str(tmp_path), error))
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda path: usage(2**40, 0, 2**40))
    assert "RuntimeError" in str(checkpoint._write_failed("dir=x", str(tmp_path), error))


def test_a_good_folder_still_works(tmp_path: Path) -> None:
    assert checkpoint.checkpoint_folder(str(tmp_path), 1) == str(tmp_path)
    with pytest.raises(UserError, match="free, the checkpoint needs about"):
        checkpoint.checkpoint_folder(str(tmp_path), shutil.disk_usage(tmp_path).total + 1)
