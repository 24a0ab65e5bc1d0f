"""The paths that never ran: the default (non-JSON) output of `models`, of `lab` for a probe
that draws (Probe.render) and of `bench`, and the torchrun main() of tutor.bench.collective with 2 real
ranks. Each is run for real; figures are checked for human units."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_runner import run
from tests.machines import recorded_machine

ROOT = Path(__file__).resolve().parents[1]
SCIENTIFIC = re.compile(r"\d[eE][+-]?\d")


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "100")
    return tmp_path


def test_models_default_output_is_a_table_of_presets_in_human_units(data_dir: Path) -> None:
    from tutor.files.models import list_presets

    code, out, err = run(["models"])
    assert code == 0, err
    assert all(info.name in out for info in list_presets())
    assert not SCIENTIFIC.search(out) and "{" not in out  # a table, not JSON or reprs


@pytest.mark.slow
def test_lab_default_output_draws_the_probe_render(data_dir: Path) -> None:
    from tutor.labs import PROBES

    probe = PROBES["zero"]
    assert probe.render is not None  # the probe this test is about draws a picture
    code, out, err = run(["lab", "zero", "ranks=2", "hidden=32", "layers=2"])
    assert code == 0, err
    assert "stage" in out.lower() or "ZeRO" in out
    assert not SCIENTIFIC.search(out) and "ProbeResult" not in out and "tutor." not in out
    json_code, json_out, _ = run(["lab", "zero", "ranks=2", "hidden=32", "layers=2", "--json"])
    assert json_code == 0 and json_out.lstrip().startswith("{") and not out.lstrip().startswith("{")


def test_bench_default_output_is_a_table_with_the_peak(data_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                        measure_on_cpu: None) -> None:
    machine = recorded_machine()  # a CPU-only record: its peak is the CPU's, the device measured here
    monkeypatch.setattr("tutor.bench.environment.load_machine", lambda: machine)
    code, out, err = run(["bench", "matmul", "--dtype", "fp32", "--budget", "1"])
    assert code == 0, err
    assert "TFLOP/s" in out or "GFLOP/s" in out
    assert "fp32" in out and not SCIENTIFIC.search(out) and "{" not in out
    assert (data_dir / "results.jsonl").read_text().count("\n") == 1  # the default output still records the run


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_collective_main_under_torchrun_with_two_ranks(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TENSOR_TUTOR_DATA_DIR": str(tmp_path)}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(_free_port()), "-m", "tutor.bench.collective", "--sizes", "1M", "--budget", "1"]
    # its own session, so a hang kills torchrun's ranks too, not only torchrun
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 3, result.stdout  # rank 0 alone prints: one line per collective
    for line in lines:
        assert re.search(r"1 MB +algbw +[\d.]+ [MGk]?B/s +busbw +[\d.]+ [MGk]?B/s", line), line
    assert not SCIENTIFIC.search(result.stdout)
