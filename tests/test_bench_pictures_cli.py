"""`bench history --plot N [--svg FILE]` and `--svg` on the run commands: pictures of stored sweeps."""

from __future__ import annotations

from pathlib import Path

import pytest


from tests.cli_runner import run
from tests.plot_data import HEADER, RESULTS, collective_results
from tutor.bench.notebook import append_run


@pytest.fixture
def notebook(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    append_run({**HEADER, "command": "tensor-tutor bench", "date": "2025-01-10T10:00:00+00:00", "cancelled": False},
               RESULTS, tmp_path / "results.jsonl")
    return tmp_path


def test_history_plot_draws_both_sweeps_with_their_tables(notebook):
    code, out, err = run(["bench", "history", "--plot", "1"])
    assert code == 0, err
    assert "matmul throughput against size" in out and "STREAM-like bandwidth against working set" in out
    assert "vertical lines: L1 32 KiB, L2 1 MiB, L3 32 MiB" in out
    assert "2048²" in out and "145 GFLOP/s" in out  # the table, read by a pipe


def test_history_plot_saves_svg(notebook, tmp_path):
    target = tmp_path / "run1.svg"
    code, out, err = run(["bench", "history", "--plot", "1", "--svg", str(target)])
    assert code == 0, err
    assert target.read_text().lstrip().startswith("<svg")
    assert "saved the pictures" in err
    import html

    from tutor import __version__

    picture = html.unescape(target.read_text()).replace("\xa0", " ")  # the SVG says what it shows
    assert "model none · mode none · dtype fp32" in picture and f"tensor-tutor {__version__}" in picture


@pytest.mark.parametrize("argv, message", [
    (["bench", "history", "--svg", "x.svg"], "--svg needs --plot N"),
    (["bench", "history", "--plot", "7"], "no run number 7"),
    (["bench", "history", "--plot", "1", "--svg", "/no/such/folder/x.svg"], "cannot write"),
    (["bench", "--svg", "/no/such/folder/x.svg"], "cannot write"),
    (["bench", "bandwidth", "--svg", "/no/such/folder/x.svg"], "cannot write"),
    (["bench", "collective", "--svg", "/no/such/folder/x.svg"], "cannot write"),
])
def test_bad_svg_or_run_is_one_line_and_exit_2(notebook, argv, message):
    code, out, err = run(argv)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_history_plot_draws_the_busbw_sweep_of_a_collective_run(notebook):
    append_run({**HEADER, "command": "tensor-tutor bench collective", "date": "2025-01-11T10:00:00+00:00",
                "cancelled": False}, collective_results(), notebook / "results.jsonl")
    code, out, err = run(["bench", "history", "--plot", "2"])
    assert code == 0, err
    assert "collective bus bandwidth against message size" in out
    assert "all_reduce gloo x2" in out and "16 MiB" in out and "810 MB/s" in out  # the table
    assert "per direction" not in out  # gloo on a CPU: no link rate to draw
