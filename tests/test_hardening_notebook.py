"""A torn notebook line never swallows the next run; one data dir; `bench history` and
`bench --budget/--json` survive what a hostile-but-realistic user does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tutor.bench.notebook import append_run, notebook_path, read_notebook
from tutor.cli import main
from tutor.commands.bench import bench


def matmul(dtype: str, tflops: float) -> dict:
    return {"kind": "matmul", "device": "cpu", "dtype": dtype, "backend": "torch/mkl", "tflops_median": tflops}


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    return tmp_path


def test_a_torn_tail_without_newline_is_set_aside_and_the_next_run_kept(data_dir: Path) -> None:
    path = data_dir / "results.jsonl"
    assert append_run({"date": "a"}, [matmul("fp32", 0.2)]) is None
    torn = b'{"notebook_version":1,"header":{"date":"torn"},"resu'
    with path.open("ab") as handle:
        handle.write(torn)  # disk full mid-line: no final newline
    warning = append_run({"date": "b"}, [matmul("fp32", 0.4)])
    assert warning is not None and "results.jsonl.torn-" in warning and "\n" not in warning
    notebook = read_notebook()
    assert [run.date for run in notebook.runs] == ["a", "b"]
    assert notebook.corrupt_lines == 0
    (side,) = notebook.set_aside
    assert side.read_bytes() == torn and side.name in notebook.warning
    assert path.read_bytes().endswith(b"\n") and len(path.read_text().splitlines()) == 2


def test_an_unparsable_last_line_is_set_aside_too(data_dir: Path) -> None:
    path = data_dir / "results.jsonl"
    append_run({"date": "a"}, [matmul("fp32", 0.2)])
    with path.open("ab") as handle:
        handle.write(b'{"header": {"date": "cut"}, "res\n')  # cut mid-line, newline written after
    warning = append_run({"date": "b"}, [matmul("fp32", 0.4)])
    assert warning is not None and "did not parse" in warning
    notebook = read_notebook()
    assert [run.date for run in notebook.runs] == ["a", "b"] and notebook.corrupt_lines == 0
    assert notebook.set_aside[0].read_bytes() == b'{"header": {"date": "cut"}, "res\n'


def test_a_long_notebook_keeps_its_whole_last_line(data_dir: Path) -> None:
    # The tail is found by reading backwards in blocks: a last line longer than one block stays.
    big = [matmul("fp32", 0.1 + i / 1e6) for i in range(3000)]
    append_run({"date": "a"}, big)
    append_run({"date": "b"}, big)
    assert append_run({"date": "c"}, [matmul("fp32", 0.3)]) is None
    assert [run.date for run in read_notebook().runs] == ["a", "b", "c"]


def test_the_data_dir_override_expands_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", "~/x")
    assert notebook_path() == tmp_path / "x" / "results.jsonl"


def test_history_shows_the_new_run_marks_cancelled_ones_and_names_what_was_set_aside(data_dir: Path) -> None:
    path = data_dir / "results.jsonl"
    append_run({"date": "2026-01-01", "cancelled": False}, [matmul("fp32", 0.2)])
    path.open("ab").write(b'{"header": {"da')
    append_run({"date": "2026-01-02", "cancelled": True}, [matmul("fp32", 0.3)])
    table = CliRunner().invoke(bench, ["history"], catch_exceptions=False)
    assert table.exit_code == 0
    assert "2026-01-02" in table.stdout and "2 (cancelled)" in table.stdout and "1 (cancelled)" not in table.stdout
    assert "results.jsonl.torn-" in table.stderr
    listing = json.loads(CliRunner().invoke(bench, ["--json", "history"], catch_exceptions=False).stdout)
    assert [(run["number"], run["cancelled"]) for run in listing["runs"]] == [(1, False), (2, True)]
    assert len(listing["set_aside"]) == 1


def test_history_prints_markup_from_the_notebook_as_text(data_dir: Path) -> None:
    append_run({"date": "[/bold]2026[red]"}, [{**matmul("fp32", 0.2), "device": "cpu[v2]"}])
    table = CliRunner().invoke(bench, ["history"], catch_exceptions=False)
    assert table.exit_code == 0, table.output
    assert "[/bold]" in table.stdout and "cpu[v2]" in table.stdout


@pytest.mark.parametrize("budget", ["inf", "nan", "-1", "0"])
def test_a_budget_that_is_not_a_finite_positive_number_is_one_line_exit_2(
        budget: str, data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "matmul", "--dtype", "fp32", "--budget", budget, "--json"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--budget must be a positive number" in err and len(err.strip().splitlines()) == 1


def test_ctrl_c_before_any_result_still_prints_json(data_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    def interrupted() -> None:
        raise KeyboardInterrupt  # as if Ctrl-C arrived while torch loads

    monkeypatch.setattr("tutor.bench.environment.load_machine", interrupted)
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "matmul", "--dtype", "fp32", "--budget", "5", "--json"])
    assert exit_info.value.code == 130
    captured = capsys.readouterr()
    payload = json.loads(captured.out)
    assert payload["results"] == [] and payload["device"]["cancelled"] is True
    assert "cancelled" in captured.err


def test_a_fifo_in_place_of_the_notebook_is_refused_not_written(data_dir: Path) -> None:
    """A write larger than a pipe's buffer blocked append_run forever on a FIFO."""
    import os
    import threading

    os.mkfifo(data_dir / "results.jsonl")
    outcome: list[str | None] = []
    big = [{"kind": "matmul", "note": "x" * 200_000}]
    writer = threading.Thread(target=lambda: outcome.append(append_run({"date": "a"}, big)), daemon=True)
    writer.start()
    writer.join(timeout=30)
    if writer.is_alive():
        pytest.fail("append_run blocked on a FIFO")
    (warning,) = outcome
    assert warning is not None and "not a regular file" in warning and "\n" not in warning
