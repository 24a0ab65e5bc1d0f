"""The results notebook: atomic appends, reading past corrupt lines, unwritable dirs, comparisons."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tutor.bench.notebook import (append_run, compare_runs, notebook_path, read_notebook, run_headlines)


def matmul(dtype: str, tflops: float) -> dict:
    return {"kind": "matmul", "device": "cpu", "dtype": dtype, "backend": "torch/mkl", "tflops_median": tflops}


def test_path_follows_the_environment_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    assert notebook_path() == tmp_path / "results.jsonl"


def test_each_run_is_one_line_and_reads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path / "nested"))
    assert append_run({"date": "2026-01-01"}, [matmul("fp32", 0.2)]) is None
    assert append_run({"date": "2026-01-02"}, [matmul("fp32", 0.3), matmul("bf16", 1.0)]) is None
    lines = (tmp_path / "nested" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 2 and all(json.loads(line)["header"] for line in lines)
    notebook = read_notebook()
    assert notebook.corrupt_lines == 0 and notebook.warning == ""
    assert [run.number for run in notebook.runs] == [1, 2]
    assert notebook.runs[1].date == "2026-01-02" and notebook.runs[1].device == "cpu"
    assert run_headlines(notebook.runs[1]) == {"fp32 TFLOP/s": 0.3, "bf16 TFLOP/s": 1.0}


def test_corrupt_lines_are_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    append_run({"date": "a"}, [matmul("fp32", 0.2)], path)
    with path.open("a") as handle:
        handle.write('{"header": {"date": "torn"}, "resu\n')  # a torn write
        handle.write("[1, 2, 3]\n")  # valid JSON, not a run
    append_run({"date": "b"}, [matmul("fp32", 0.4)], path)
    notebook = read_notebook(path)
    assert notebook.corrupt_lines == 2
    assert "2 corrupt" in notebook.warning
    assert [run.date for run in notebook.runs] == ["a", "b"]


def test_missing_notebook_is_empty_not_an_error(tmp_path: Path) -> None:
    notebook = read_notebook(tmp_path / "absent.jsonl")
    assert notebook.runs == () and notebook.warning == ""


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root ignores directory permissions")
def test_unwritable_directory_costs_a_warning(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        warning = append_run({}, [], locked / "results.jsonl")
    finally:
        locked.chmod(0o700)
    assert warning and "not saved" in warning


def test_a_file_in_the_way_costs_a_warning(tmp_path: Path) -> None:
    # Works as root too: the data dir path is an existing regular file.
    blocker = tmp_path / "data"
    blocker.write_text("not a directory")
    warning = append_run({}, [matmul("fp32", 0.1)], blocker / "results.jsonl")
    assert warning is not None and "not saved" in warning
    assert "\n" not in warning


def test_unserialisable_results_cost_a_warning(tmp_path: Path) -> None:
    warning = append_run({}, [{"kind": "matmul", "tflops_median": float("nan")}], tmp_path / "r.jsonl")
    assert warning is not None and not (tmp_path / "r.jsonl").exists()


def test_compare_two_runs_by_matching_case(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    append_run({}, [matmul("fp32", 0.2), matmul("bf16", 1.0),
                    {"kind": "bandwidth", "device": "cpu", "op": "triad", "gbps_median": 10.0}], path)
    append_run({}, [matmul("fp32", 0.3),
                    {"kind": "bandwidth", "device": "cpu", "op": "triad", "gbps_median": 5.0},
                    {"kind": "collective", "op": "all_reduce", "backend": "gloo", "ranks": 2, "bytes": 8,
                     "busbw_gbps": 1.0}], path)
    before, after = read_notebook(path).runs
    rows = {row.case: row for row in compare_runs(before, after)}
    assert set(rows) == {"matmul cpu fp32 torch/mkl", "bandwidth cpu triad"}
    assert rows["matmul cpu fp32 torch/mkl"].ratio == pytest.approx(1.5)
    assert rows["bandwidth cpu triad"].ratio == pytest.approx(0.5)
