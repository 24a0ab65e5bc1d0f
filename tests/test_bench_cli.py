"""`tensor-tutor bench` end to end with tiny budgets: JSON shape, notebook, bad flags, Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)
from click.testing import CliRunner

from tutor.cli import main
from tutor.commands.bench import bench

from tests.machines import recorded_machine
from tests.subprocess_env import default_signals, pythonpath

ROOT = Path(__file__).resolve().parents[1]


def fake_machine():
    return recorded_machine(peaks_tflops={"fp32": 50.0, "bf16": 100.0, "fp16": 100.0}, flags=("avx2", "fma"))


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, measure_on_cpu: None) -> Path:
    """A data folder, the fake CPU machine, and the CPU as the device measured (its peaks are the fake's)."""
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    monkeypatch.setattr("tutor.bench.environment.load_machine", fake_machine)
    return tmp_path


def run_json(args: list[str]) -> dict:
    result = CliRunner().invoke(bench, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_matmul_json_with_a_tiny_budget(data_dir: Path) -> None:
    payload = run_json(["matmul", "--dtype", "fp32", "--budget", "1", "--json"])
    assert set(payload) == {"device", "results"}
    assert payload["device"]["machine"] == fake_machine().to_json()
    assert payload["device"]["torch_threads"] >= 1 and payload["device"]["device_under_test"] == "cpu"
    kinds = {(r["kind"], r["dtype"]) for r in payload["results"]}
    assert kinds == {("matmul", "fp32"), ("decode_matmul", "fp32")}  # the sweep, and its matrix-vector products
    for result in (r for r in payload["results"] if r["kind"] == "matmul"):
        assert {"m", "n", "k", "backend", "tflops_median", "tflops_best", "peak_tflops", "percent_of_peak"} <= set(result)
        assert result["peak_tflops"] == 50.0
    stored = (data_dir / "results.jsonl").read_text().splitlines()
    assert len(stored) == 1 and json.loads(stored[0])["results"] == payload["results"]


def test_bandwidth_json_states_the_byte_counting(data_dir: Path) -> None:
    payload = run_json(["bandwidth", "--budget", "1", "--json"])
    ops = [r["op"] for r in payload["results"]]
    assert ops == ["copy", "scale", "add", "triad", "read", "write"]
    assert all(r["kind"] == "bandwidth" and "STREAM" in r["bytes_counting"] for r in payload["results"])
    assert all(r["array_bytes"] >= 4 * 2**20 for r in payload["results"])  # 4x the fake 1 MiB cache


def test_group_options_apply_to_the_subcommand_and_tables_render(data_dir: Path) -> None:
    result = CliRunner().invoke(bench, ["--budget", "1", "matmul", "--dtype", "bf16"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "matmul" in result.stdout and "bf16" in result.stdout and "% peak" in result.stdout


def test_history_lists_and_compares(data_dir: Path) -> None:
    run_json(["matmul", "--dtype", "fp16", "--budget", "0.3", "--json"])
    run_json(["matmul", "--dtype", "fp16", "--budget", "0.3", "--json"])
    listing = run_json(["history", "--json"])
    assert [run["number"] for run in listing["runs"]] == [1, 2]
    assert "fp16 TFLOP/s" in listing["runs"][0]["headlines"]
    comparison = run_json(["history", "--compare", "1", "2", "--json"])
    assert [case["case"].split()[:3] for case in comparison["cases"]] == [["matmul", "cpu", "fp16"]]
    assert comparison["cases"][0]["ratio"] > 0
    table = CliRunner().invoke(bench, ["history"], catch_exceptions=False)
    assert table.exit_code == 0 and re.search(r"fp16 [\d.,]+ [kMGT]?FLOP/s", table.stdout)  # scaled, not "TFLOP/s 0.0001"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "matmul", "--dtype", "fp64"], "unknown dtype 'fp64'"),
        (["bench", "matmul", "--dtype", "tf32", "--device", "cpu"], "not available on cpu"),
        (["bench", "--budget", "-1"], "--budget must be a positive number"),
        (["bench", "matmul", "--device", "cuda:3"], "cuda:3 is not present"),
        (["bench", "collective", "--ranks", "0"], "--ranks must be at least 1"),
        (["bench", "transfer", "--device", "cpu"], "need a CUDA device"),
        (["bench", "history", "--compare", "1", "9"], "no run number"),
        (["bench", "matmul", "--budget", "soon"], "soon"),
    ],
)
def test_bad_flags_exit_2_with_one_line(argv: list[str], message: str, data_dir: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_stops_within_seconds_prints_what_finished_and_exits_130(tmp_path: Path) -> None:
    # Rich draws its progress bar into a pipe only when told the pipe is a terminal. The sweep stops
    # at a plateau within seconds, so the signal goes in as soon as bf16 starts: fp32 has finished
    # (something to print) and bf16 and fp16 are still to come (something to cancel).
    env = {**os.environ, "TENSOR_TUTOR_DATA_DIR": str(tmp_path), "PYTHONPATH": pythonpath(ROOT),
           "TTY_COMPATIBLE": "1", "TTY_INTERACTIVE": "1"}
    process = subprocess.Popen([sys.executable, "-m", "tutor", "bench", "matmul", "--dtype", "fp32,bf16,fp16",
                                "--budget", "30", "--json"], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    chunks: list[str] = []
    started = threading.Event()

    def read_stderr() -> None:
        for chunk in iter(lambda: process.stderr.read(64), ""):
            chunks.append(chunk)
            if "matmul bf16 (start)" in "".join(chunks[-3:]):
                started.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert started.wait(timeout=180), "".join(chunks)
        sent = time.monotonic()
        process.send_signal(signal.SIGINT)
        out = process.stdout.read()
        process.wait(timeout=60)
        stopped_after = time.monotonic() - sent
        reader.join(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
    err = "".join(chunks)
    assert process.returncode == 130, err
    assert "Traceback" not in err and "cancelled" in err
    payload = json.loads(out)
    assert payload["device"]["cancelled"] is True
    assert payload["results"], "Ctrl-C after the sweep started must still print what finished"
    assert all(r["tflops_median"] > 0 for r in payload["results"])
    assert stopped_after < 30  # behaviour, not speed: far below the 600 s budget
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 1


def test_a_run_ends_with_where_it_was_saved_and_what_to_do_next(data_dir: Path) -> None:
    result = CliRunner().invoke(bench, ["matmul", "--dtype", "fp32", "--budget", "1"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith(f"saved to {data_dir / 'results.jsonl'}") and "tensor-tutor time" in last
    # --json keeps stdout one JSON object: no sentence after it
    json.loads(CliRunner().invoke(bench, ["matmul", "--dtype", "fp32", "--budget", "1", "--json"]).stdout)
