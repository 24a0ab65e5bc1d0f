"""SIGINT, SIGTERM and SIGHUP during a real `tensor-tutor bench`: what finished is saved as a cancelled
run, printed, and the process exits 130, 143 or 129 without a traceback.

The signal goes in when the process says a case has finished (its progress line on stderr), never
after a sleep: the fixed-size fp32 square is done, and the fp32 sweep (with a long budget) is running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.subprocess_env import default_signals, pythonpath

ROOT = Path(__file__).resolve().parents[1]
SIGNALS = [signal.SIGINT, signal.SIGTERM] + ([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])


@pytest.mark.parametrize("signum", SIGNALS, ids=[signal.Signals(s).name for s in SIGNALS])
def test_a_signal_keeps_what_finished_records_a_cancelled_run_and_exits_128_plus_n(
        signum: int, tmp_path: Path) -> None:
    from tutor.bench.matmul import fixed_matmul_size

    ready_line = f"matmul fp32 {fixed_matmul_size('cpu')}²: done"
    env = {**os.environ, "TENSOR_TUTOR_DATA_DIR": str(tmp_path), "PYTHONPATH": pythonpath(ROOT)}
    env.pop("TTY_COMPATIBLE", None)  # stderr is a pipe: one plain line per finished case
    process = subprocess.Popen([sys.executable, "-m", "tutor", "bench", "matmul", "--dtype", "fp32", "--device", "cpu",
                                "--budget", "300", "--json"], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    lines: list[str] = []
    ready = threading.Event()

    def read_stderr() -> None:
        for line in process.stderr:
            lines.append(line)
            if ready_line in line:
                ready.set()
        ready.set()  # the process ended first: the assertion below says so

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert ready.wait(timeout=240) and process.poll() is None, "".join(lines)
        process.send_signal(signum)
        out = process.stdout.read()
        process.wait(timeout=120)
        reader.join(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
    err = "".join(lines)
    assert process.returncode == 128 + signum, err
    assert "Traceback" not in err and "cancelled" in err
    payload = json.loads(out)
    assert payload["device"]["cancelled"] is True
    assert any(result.get("fixed_size") for result in payload["results"]), "the finished case must be kept"
    stored = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert len(stored) == 1 and stored[0]["status"] == "cancelled" and stored[0]["header"]["cancelled"] is True
    assert stored[0]["results"] == payload["results"]
