"""Ctrl+Q during a measurement, in the real app in a real terminal (tmux): how long until it is gone.

    python benchmarks/app_quit_tmux.py [--runs 5] [--after 1.0] [--goal 1.0]

Each run: a shell in a 120x40 pane of a private tmux server prints a prompt line and runs a fresh
`python -m tutor learn training-loop/parameters`, then waits; wait for the lesson and a warm measurement process (torch loaded and idle), Enter
(Run), wait until the lesson shows it measuring, Ctrl+Q `--after` seconds later, then time
Ctrl+Q -> the app's process gone and Ctrl+Q -> no process of this run left (the app, its
measurement process and anything they started: every process whose environment holds this run's
private TENSOR_TUTOR_DATA_DIR, which is what `pgrep -f` cannot tell apart from other sessions'
tutors), and Ctrl+Q -> the shell's prompt line back on the pane with the app gone. Between Ctrl+Q
and that, every capture of the pane is checked for a blank screen (the terminal restored while the
process still tears itself down: an earlier build showed 3.4-6.8 s of it); the longest blank stretch is printed.
The goal: <= 1 s with no process left, in every run. The last line is the verdict.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app_startup import LESSON_ONE, RUN_PROMPT, RUNNING_MARKER, Terminal, app_command, wait_for_warm_worker  # noqa: E402

GOAL_S = 1.0
POLL_S = 0.005


def processes_of_run(data_dir: str) -> list[psutil.Process]:
    """Every live process whose environment carries this run's private data dir."""
    found = []
    marker = f"TENSOR_TUTOR_DATA_DIR={data_dir}".encode()
    for process in psutil.process_iter(["pid"]):
        try:
            with open(f"/proc/{process.pid}/environ", "rb") as environ:
                if marker in environ.read():
                    if process.status() != psutil.STATUS_ZOMBIE:
                        found.append(process)
        except (OSError, psutil.NoSuchProcess):
            continue
    return found


PROMPT = "quit-bench-shell$"


def app_process(shell_pid: int, timeout_s: float = 30.0) -> int:
    """The app's process id: the pane's shell's child running `-m tutor learn`."""
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        for child in psutil.Process(shell_pid).children():
            try:
                if "learn" in child.cmdline():
                    return child.pid
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.05)
    raise TimeoutError("the app did not start")


def one_quit(after_s: float, env: dict[str, str], data_dir: str) -> dict[str, object]:
    terminal = Terminal()
    try:
        exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
        script = f"printf '%s\\n' {shlex.quote(PROMPT)}; env {exports} {app_command(LESSON_ONE)}; sleep 600"
        terminal.tmux("new-session", "-d", "-s", "app", "-x", str(terminal.width), "-y", str(terminal.height),
                      f"sh -c {shlex.quote(script)}")
        terminal.wait_for(lambda screen: RUN_PROMPT in screen, 30.0)
        app_pid = app_process(terminal.app_pid())
        wait_for_warm_worker(app_pid)
        terminal.send("Enter")
        terminal.wait_for(lambda screen: RUNNING_MARKER in screen, 10.0)
        time.sleep(after_s)
        app = psutil.Process(app_pid)
        sent = terminal.send("C-q")
        blank_since: float | None = None
        blank_s = 0.0
        app_gone = prompt_back = None
        deadline = sent + 30.0
        while time.perf_counter() < deadline:
            now = time.perf_counter()
            if app_gone is None:
                try:
                    if app.status() == psutil.STATUS_ZOMBIE:
                        app_gone = now
                except psutil.NoSuchProcess:
                    app_gone = now
            if prompt_back is None:
                screen = terminal.screen()
                if not screen.strip():
                    blank_since = blank_since if blank_since is not None else now
                elif blank_since is not None:
                    blank_s, blank_since = max(blank_s, now - blank_since), None
                if app_gone is not None and PROMPT in screen:
                    prompt_back = now
            if prompt_back is not None and not processes_of_run(data_dir):
                return {"app_s": app_gone - sent, "prompt_s": prompt_back - sent, "all_s": time.perf_counter() - sent,
                        "blank_s": blank_s, "left": []}
            time.sleep(POLL_S)
        left = [f"{p.pid} {' '.join(p.cmdline())[:80]}" for p in processes_of_run(data_dir)]
        for process in processes_of_run(data_dir):
            process.kill()
        return {"app_s": (app_gone or time.perf_counter()) - sent, "prompt_s": float("inf"), "all_s": float("inf"),
                "blank_s": blank_s, "left": left}
    finally:
        terminal.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--after", type=float, default=1.0, help="seconds of measuring before Ctrl+Q")
    parser.add_argument("--goal", type=float, default=GOAL_S)
    args = parser.parse_args(argv)
    if shutil.which("tmux") is None:
        print("needs tmux (apt-get install tmux)", file=sys.stderr)
        return 2
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f} "
          f"{os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} (1/5/15 min); lesson {LESSON_ONE}, Ctrl+Q "
          f"{args.after:g} s into the measurement")
    times, failures = [], 0
    for run in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="tensor-tutor-quit-") as data_dir:
            env = {"TENSOR_TUTOR_DATA_DIR": data_dir, "TERM": "xterm-256color", "TEXTUAL_ANIMATIONS": "none",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                               os.environ.get("PYTHONPATH", "")]))}
            outcome = one_quit(args.after, env, data_dir)
        took = max(outcome["all_s"], outcome["prompt_s"])
        ok = took <= args.goal and not outcome["left"]
        failures += not ok
        times.append(took)
        print(f"run {run}: Ctrl+Q -> app gone {outcome['app_s'] * 1000:.0f} ms, -> prompt back "
              f"{outcome['prompt_s'] * 1000:.0f} ms, -> no process left {outcome['all_s'] * 1000:.0f} ms; "
              f"longest blank pane {outcome['blank_s'] * 1000:.0f} ms"
              + (f"; LEFT: {outcome['left']}" if outcome["left"] else "") + f"  {'ok' if ok else 'MISSED'}")
    print(f"load after: {os.getloadavg()[0]:.2f}")
    print(f"Ctrl+Q during a measurement -> prompt back and no process left: median {statistics.median(times) * 1000:.0f} ms, "
          f"worst {max(times) * 1000:.0f} ms over {args.runs}; goal {args.goal * 1000:.0f} ms every run: "
          f"{'PASS' if not failures else f'FAIL ({failures} of {args.runs} missed)'}")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
