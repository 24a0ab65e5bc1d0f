"""Headless output that scripts and narrow terminals can use: ids never cut at 80 columns, progress on a
pipe as plain lines (no carriage returns), human units in every table, and the app refusing a pipe."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_runner import run
from tutor.commands.lab import ProgressLine

ROOT = Path(__file__).resolve().parents[1]
SCIENTIFIC = re.compile(r"\d[eE][+-]?\d")


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    return tmp_path


def cli_subprocess(args: list[str], *, stdin: int | None = subprocess.DEVNULL, timeout: float = 60,
                   env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "COLUMNS": "80", **(env or {})}
    environment.pop("TEXTUAL_DRIVER", None)
    return subprocess.run([sys.executable, "-m", "tutor", *args], cwd=ROOT, stdin=stdin, capture_output=True,
                          text=True, timeout=timeout, env=environment)


def assert_fits_80_columns(out: str) -> None:
    widest = max((len(line.rstrip()) for line in out.splitlines()), default=0)
    assert widest <= 80, f"a line of {widest} columns"


# ---- ids stay whole -------------------------------------------------------------------------------

def test_lesson_ids_are_whole_at_80_columns(narrow: Path) -> None:
    from tutor.lessons import load_curriculum

    code, out, _ = run(["lessons"])
    assert code == 0
    assert_fits_80_columns(out)
    ids = list(load_curriculum().lesson_ids)
    assert "training-loop/one-training-step" in ids  # the id the issue saw cut
    missing = [lesson_id for lesson_id in ids if lesson_id not in out]
    assert not missing, f"cut at 80 columns: {missing}"
    assert "…" not in out


def test_model_presets_and_device_keys_are_whole_at_80_columns(narrow: Path) -> None:
    from tutor.hardware.specs import SPECS
    from tutor.files.models import list_presets

    code, out, _ = run(["models"])
    assert code == 0
    assert_fits_80_columns(out)
    names = [info.name for info in list_presets()]
    assert "mistral-small-24b" in names
    assert [name for name in names if name not in out] == []
    assert "…" not in out
    code, out, _ = run(["models", "--devices"])
    assert code == 0 and [spec.key for spec in SPECS if spec.key not in out] == []
    assert "…" not in out


def test_lab_names_line_up_whole(narrow: Path) -> None:
    from tutor.labs import PROBES

    code, out, _ = run(["lab"])
    assert code == 0
    starts = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert starts == set(PROBES)
    title_columns = {line.index(probe.title) for line in out.splitlines() for probe in PROBES.values()
                     if line.split()[0] == probe.name}
    assert len(title_columns) == 1  # one column of titles, whatever the longest name


# ---- progress on a pipe -------------------------------------------------------------------------

class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_to_a_pipe_is_plain_lines_and_short() -> None:
    stream = io.StringIO()
    progress = ProgressLine(stream)
    for step in range(400):
        progress(step / 400, f"routing batch {step + 1} of 400")
    progress(1.0, "done")
    progress.clear()
    text = stream.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert lines[0] == "[  0%] routing batch 1 of 400" and lines[-1] == "[100%] done"
    assert len(lines) <= 12  # one line per tenth of the run, not one per batch


def test_progress_on_a_terminal_redraws_one_line() -> None:
    stream = _Terminal()
    progress = ProgressLine(stream)
    progress(0.5, "halfway")
    progress.clear()
    assert stream.getvalue().startswith("\r[ 50%] halfway") and "\n" not in stream.getvalue()


def test_lab_writes_no_carriage_return_to_a_file(narrow: Path) -> None:
    result = cli_subprocess(["lab", "fit", "model=gpt2"], env={"TENSOR_TUTOR_DATA_DIR": str(narrow)})
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr and result.stderr.endswith("\n")
    assert "[100%] done" in result.stderr.splitlines()
    assert_fits_80_columns(result.stdout)
    assert not SCIENTIFIC.search(result.stdout)
    assert "GiB" in result.stdout or "MiB" in result.stdout  # byte rows in binary units, not "1.651e+04 bytes"


# ---- the app without a terminal ------------------------------------------------------------------

def test_the_app_without_a_terminal_exits_2_pointing_to_serve() -> None:
    result = cli_subprocess([], stdin=subprocess.PIPE, timeout=30)
    assert result.returncode == 2
    assert result.stdout == ""  # no escape codes
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "tensor-tutor serve" in lines[0] and "fit" in lines[0]


def test_serve_still_runs_the_app_through_its_pipes(monkeypatch: pytest.MonkeyPatch) -> None:
    from tutor.commands import app_start

    monkeypatch.setenv("TEXTUAL_DRIVER", "textual.drivers.web_driver:WebDriver")  # what textual-serve sets
    app_start._require_terminal()  # no UserError: textual-serve's driver talks over pipes
    monkeypatch.delenv("TEXTUAL_DRIVER")
    from tutor.errors import UserError

    with pytest.raises(UserError, match="tensor-tutor serve"):
        app_start._require_terminal()  # pytest's stdin is no terminal


# ---- bench history and --compare -----------------------------------------------------------------

def _store_run(size: int, tflops: float) -> None:
    from tutor.bench.notebook import append_run

    result = {"kind": "matmul", "device": "cpu", "dtype": "fp32", "backend": "torch", "m": size, "n": size,
              "k": size, "tflops_median": tflops, "tflops_best": tflops}
    assert append_run({"date": "2025-01-01T00:00:00+00:00", "device_under_test": "cpu"}, [result]) is None


def test_history_shows_rates_in_human_units(narrow: Path) -> None:
    _store_run(1024, 0.0074)
    code, out, _ = run(["bench", "history"])
    assert code == 0 and "fp32 7.4 GFLOP/s" in out and "0.0074" not in out


def test_compare_names_figures_and_refuses_a_ratio_across_sizes(narrow: Path) -> None:
    _store_run(128, 0.0074)
    _store_run(4096, 0.134)
    _store_run(4096, 0.201)
    code, out, _ = run(["bench", "history", "--compare", "1", "2"])
    assert code == 0
    assert "tflops_median" not in out and "median FLOP/s" in out
    assert "7.4 GFLOP/s" in out and "134 GFLOP/s" in out
    assert "sizes differ" in out and "128x128x128" in out and "18.1" not in out  # no 18.1x ratio
    payload = json.loads(run(["bench", "history", "--compare", "1", "2", "--json"])[1])
    assert payload["cases"][0]["sizes_differ"] is True
    assert payload["cases"][0]["figure_label"] == "median FLOP/s"
    same = json.loads(run(["bench", "history", "--compare", "2", "3", "--json"])[1])
    assert same["cases"][0]["sizes_differ"] is False and same["cases"][0]["ratio"] == pytest.approx(1.5)
    code, out, _ = run(["bench", "history", "--compare", "2", "3"])
    assert "1.5x" in out and "sizes differ" not in out


# ---- env ------------------------------------------------------------------------------------------

def test_env_at_80_columns_shows_peaks_in_human_units(narrow: Path) -> None:
    code, out, _ = run(["env"])
    assert code == 0
    assert_fits_80_columns(out)
    assert not SCIENTIFIC.search(out)
    assert re.search(r"\d (G|T)FLOP/s", out)  # scaled, not "0.3 TFLOP/s" on a CPU
