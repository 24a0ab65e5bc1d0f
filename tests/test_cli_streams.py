"""What the command line does when its output cannot be written as asked: a full disk, a closed stdout, an
encoding without the characters it prints. Each is one line on stderr and an exit code, never a traceback;
an encoding that lacks characters still gets the answer. Runs `python -m tutor` in a child (CPU only)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.subprocess_env import pythonpath

ROOT = Path(__file__).resolve().parents[1]


def _tutor(args: list[str], *, stdout, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tutor", *args], cwd=ROOT, stdout=stdout, stderr=subprocess.PIPE,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": pythonpath(ROOT), **(env or {})})


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("args", [["fit", "llama-3.1-8b"], ["fit", "llama-3.1-8b", "--json"], ["models"]])
def test_a_full_disk_under_stdout_is_one_line_and_exit_1(args: list[str]) -> None:
    with open("/dev/full", "w") as full:
        done = _tutor(args, stdout=full)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == ["tensor-tutor: error: could not write the output: No space left on "
                                                "device"]


def test_a_closed_stdout_is_one_line_and_exit_1() -> None:
    done = subprocess.run([sys.executable, "-c", "import os, runpy, sys; os.close(1); sys.argv = ['tutor', 'models'];"
                           " runpy.run_module('tutor', run_name='__main__')"], cwd=ROOT, stderr=subprocess.PIPE,
                          text=True, timeout=120, env={**os.environ, "PYTHONPATH": pythonpath(ROOT)})
    assert done.returncode == 1
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("args", [["fit", "llama-3.1-8b"], ["models"], ["env"]])
def test_an_ascii_stdout_gets_the_answer_with_question_marks_and_one_note(args: list[str]) -> None:
    done = _tutor(args, stdout=subprocess.PIPE, env={"PYTHONIOENCODING": "ascii"})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert "encoding (ascii)" in done.stderr
    assert done.stdout.isascii() and done.stdout.strip()


def test_json_output_is_strict_json_without_infinity_or_nan() -> None:
    import json
    import math

    from tutor.commands.json_output import json_text

    text = json_text({"a": math.inf, "b": [-math.inf, math.nan, 1.5], "c": (2, {"d": float("nan")})})
    assert json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in --json")) == {
        "a": None, "b": [None, None, 1.5], "c": [2, {"d": None}]}


PAYLOAD = "\x1b[31mX\x07"


@pytest.mark.parametrize("args", [["bench", "history"], ["bench", "history", "--plot", "1"],
                                  ["bench", "history", "--compare", "1", "2"]])
def test_notebook_text_reaches_a_real_terminal_escaped(args: list[str], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich writes a table to a terminal (TTY_COMPATIBLE) as it finds it; a device name or a case from a
    hand-edited notebook must still arrive as `\\x1b`, never as the escape character itself."""
    from tests.cli_runner import run
    from tutor.bench.notebook import append_run

    sweep = [{"m": s, "n": s, "k": s, "tflops_median": 0.01 * s / 256} for s in (256, 512)]
    for _ in range(2):
        assert append_run({"date": "2026-12-01T10:00:00Z", "cancelled": False}, [
            {"kind": "matmul", "device": "cpu" + PAYLOAD, "dtype": "fp32" + PAYLOAD, "m": 512, "n": 512, "k": 512,
             "tflops_median": 0.02, "sweep": sweep, "headline": True}], tmp_path / "results.jsonl") is None
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    monkeypatch.setenv("FORCE_COLOR", "1")
    code, out, err = run(args)
    assert code == 0, err
    assert PAYLOAD not in out + err and "\x07" not in out + err
    assert "\\x1b[31mX" in out


def test_an_error_quoting_a_file_reaches_the_terminal_escaped(tmp_path: Path) -> None:
    from tests.cli_runner import run

    config = tmp_path / "config.json"
    config.write_text('{"model_type": "llama\\u001b[31mX\\u0007", "hidden_size": 64, "num_hidden_layers": 2, '
                      '"num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100}')
    code, out, err = run(["fit", str(config)])
    assert PAYLOAD not in out + err and "\x07" not in out + err
    if code == 2:
        assert len(err.strip().splitlines()) == 1
