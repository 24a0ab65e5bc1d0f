"""A signal during `lab checkpoint-write` leaves no checkpoint behind.

The lab runs as a real `tensor-tutor` process; once it says it is writing, it gets SIGINT, SIGTERM or
SIGHUP (Ctrl-C; `timeout`, CI cancellation, `docker stop`; a closed terminal). Whatever the exit, the
folder it wrote in must be empty afterwards: the checkpoint file never had a name to leave.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.subprocess_env import default_signals

pytest.importorskip("torch")
GUARD_S = 300  # a hang guard, not a measured figure


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_signal_while_writing_leaves_no_checkpoint(tmp_path: Path, signum: int) -> None:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "tutor", "lab", "checkpoint-write", "size_mb=256", "budget_s=60", f"dir={folder}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=dict(os.environ), preexec_fn=default_signals)
    try:
        seen = []
        for line in process.stderr:  # a pipe gets whole progress lines: wait for the writing step
            seen.append(line)
            if "writing (torch.save + fsync)" in line:
                break
        else:
            pytest.fail(f"the lab never started writing: {''.join(seen)[-2000:]}")
        process.send_signal(signum)
        process.communicate(timeout=GUARD_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode != 0  # stopped, not finished
    assert list(folder.iterdir()) == []
