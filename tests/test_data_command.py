"""`tensor-tutor data`: the folder, the files and their sizes, and `reset` with its confirmation."""

from __future__ import annotations

import json

import pytest

from tests.cli_runner import run
from tutor.commands import data as data_command


@pytest.fixture
def folder(tmp_path, monkeypatch):
    target = tmp_path / "tt-data"
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(target))
    return target


def test_an_empty_install_says_where_data_will_live(folder) -> None:
    code, out, _ = run(["data"])
    assert code == 0
    assert str(folder) in out and "$TENSOR_TUTOR_DATA_DIR" in out and "nothing stored yet" in out


def test_lists_each_file_with_its_size_and_the_total(folder) -> None:
    folder.mkdir()
    (folder / "progress.json").write_text("{}" * 50)
    (folder / "results.jsonl").write_text("x" * 7)
    code, out, _ = run(["data", "--json"])
    assert code == 0
    report = json.loads(out)
    sizes = {f["name"]: (f["bytes"], f["kind"]) for f in report["files"]}
    assert sizes == {"progress.json": (100, "progress"), "results.jsonl": (7, "results")}
    assert report["total_bytes"] == 107 and report["folder"] == str(folder)
    code, text, _ = run(["data"])
    assert "progress.json" in text and "100 B" in text and "107 B" in text


def test_reset_with_yes_deletes_only_that_file(folder) -> None:
    folder.mkdir()
    (folder / "progress.json").write_text("{}")
    (folder / "settings.json").write_text("{}")
    code, out, _ = run(["data", "reset", "progress", "--yes"])
    assert code == 0 and "deleted" in out
    assert not (folder / "progress.json").exists() and (folder / "settings.json").exists()


def test_reset_without_a_terminal_or_yes_refuses_in_one_line(folder, monkeypatch) -> None:
    folder.mkdir()
    (folder / "settings.json").write_text("{}")
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    code, _, err = run(["data", "reset", "settings"])
    assert code == 2 and "--yes" in err and len(err.strip().splitlines()) == 1
    assert (folder / "settings.json").exists()


@pytest.mark.parametrize(("answer", "kept"), [("n\n", True), ("y\n", False)])
def test_reset_asks_first(folder, monkeypatch, answer, kept) -> None:
    import io
    import sys

    folder.mkdir()
    (folder / "results.jsonl").write_text("{}\n")
    stdin = io.StringIO(answer)
    stdin.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stdin", stdin)
    code, out, _ = run(["data", "reset", "results"])
    assert (folder / "results.jsonl").exists() is kept
    assert (code, "nothing was deleted" in out) == ((1, True) if kept else (0, False))


def test_reset_of_a_missing_file_says_so(folder) -> None:
    code, out, _ = run(["data", "reset", "progress", "--yes"])
    assert code == 0 and "nothing to reset" in out


def test_reset_names_are_the_files_the_program_writes() -> None:
    from tutor.bench.notebook import NOTEBOOK_FILE
    from tutor.lessons.progress import PROGRESS_FILE
    from tutor.files.settings import SETTINGS_FILE

    assert {name for name, _ in data_command.KINDS.values()} == {PROGRESS_FILE, SETTINGS_FILE, NOTEBOOK_FILE}
