"""Ctrl-C during a lab: exit 130 and one line, whether the lab stops at its next check or is still inside a
long torch call (then the process leaves without finalizing the interpreter under the running thread, which
made torch abort with "terminate called without an active exception", exit 134). CPU only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.subprocess_env import default_signals, pythonpath
from tutor.commands import lab as lab_command

ROOT = Path(__file__).resolve().parents[1]


class _Stubborn:
    """A lab that does not look at its cancel event until the test lets it go."""

    name = "stubborn"

    def __init__(self) -> None:
        self.started, self.release = threading.Event(), threading.Event()

    def run(self, values, progress, cancel):
        self.started.set()
        self.release.wait(30)
        return "done"


def test_a_lab_still_running_after_the_grace_is_reported_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lab_command, "CANCEL_GRACE_S", 0.01)
    # interrupt_main() does nothing where SIGINT is ignored (a shell's background job starts so, and a test run
    # before this one in the same worker may leave another handler): Python's own, for the length of the test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    probe = _Stubborn()
    cancel = threading.Event()
    caught: list[BaseException] = []

    def interrupt_when_started() -> None:
        probe.started.wait(30)
        import _thread
        _thread.interrupt_main()

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    try:
        lab_command._run_interruptible(probe, {}, lambda *a: None, cancel)
    except KeyboardInterrupt as error:
        caught.append(error)
    finally:
        probe.release.set()
        signal.signal(signal.SIGINT, previous)
    assert cancel.is_set() and caught and isinstance(caught[0], lab_command.LabStillRunning)


@pytest.mark.slow
def test_ctrl_c_inside_the_step_time_lab_exits_130_without_an_abort() -> None:
    env = {**os.environ, "PYTHONPATH": pythonpath(ROOT)}
    env.pop("TTY_COMPATIBLE", None)
    # No grace: the signal always finds the worker inside torch, the case that aborted.
    # The signal goes in once the lab's worker says it is timing a backward pass.
    code = ("import sys, tutor.commands.lab as lab, tutor.trace.step_verify as verify\n"
            "lab.CANCEL_GRACE_S = 0.0\n"
            "timed = verify.backward_seconds\n"
            "def announced(*args, **kwargs):\n"
            "    print('timing a backward pass', file=sys.stderr, flush=True)\n"
            "    return timed(*args, **kwargs)\n"
            "verify.backward_seconds = announced\n"
            "from tutor.cli import main; main(['lab', 'step-time', 'size=small'])")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_signals)
    lines: list[str] = []
    measuring = threading.Event()

    def read_stderr() -> None:
        for line in process.stderr:
            lines.append(line)
            if "timing a backward pass" in line:
                measuring.set()
        measuring.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert measuring.wait(timeout=240) and process.poll() is None, "".join(lines)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
        reader.join(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    text = "".join(lines)
    assert process.returncode == 130, text
    assert "cancelled" in text and "terminate called" not in text and "Traceback" not in text


@pytest.mark.parametrize("typed", ["2e12", "2000000000000", "2T"])
def test_a_text_parameter_keeps_what_was_typed_as_the_help_shows_it(typed: str) -> None:
    """The help's own example, `lab time-to-train tokens=2e12`: TOML would read 2e12 as a float; a text
    parameter takes the words typed, read by the lab's own parser."""
    from tests.cli_runner import run

    import json

    code, out, err = run(["lab", "time-to-train", f"tokens={typed}", "--json"])
    assert code == 0, err
    metrics = json.loads(out)["metrics"]
    assert metrics["tokens_per_s"] * metrics["days"] * 86_400 == pytest.approx(2e12, rel=1e-6)
