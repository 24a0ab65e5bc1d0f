"""How fast the tutor app starts and answers keys, driven in a real terminal (tmux).

    python benchmarks/app_startup.py [--runs 5] [--keys 10] [--no-bench]

1. Start-up: from launching `python -m tutor learn` in a 120x40 tmux pane to the home screen
   painted (its welcome line visible in the pane). Goal (issue 4): <= 1 s on the 2-core machine.
2. Key latency while a benchmark runs: on the Bench screen with the quick suite measuring (torch
   matmuls on every core), press F1 and time until the help box is painted, then q until it is
   gone. Goal: <= 100 ms. Escape is timed too, apart: a terminal cannot tell a lone Escape from the
   start of an escape sequence, so Textual waits ESCDELAY (100 ms by default, as curses does)
   before it acts on one; that wait is the terminal's, not the app's.

Times are wall clock between sending to tmux and seeing the change in `tmux capture-pane`,
polled every POLL_S: each figure includes up to one poll interval and one capture (a few ms).
Runs in a private tmux server and a temporary data dir, so it touches no session or progress of
the user's.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

POLL_S = 0.005
STARTUP_GOAL_S = 1.0
KEY_GOAL_S = 0.100
ESCAPE_DELAY_S = 0.100  # Textual's default ESCDELAY
HOME_MARKER = "Enter opens a lesson"
HELP_MARKER = "Help (Escape closes)"
BENCH_RUNNING_MARKER = "matmul"


class Terminal:
    """One tmux pane on a private server."""

    def __init__(self, width: int = 120, height: int = 40) -> None:
        self.socket = f"tensor-tutor-bench-{uuid.uuid4().hex[:8]}"
        self.width, self.height = width, height

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True,
                              text=True).stdout

    def start(self, command: str, env: dict[str, str]) -> float:
        """Launch `command`; returns the launch time (perf_counter)."""
        exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
        started = time.perf_counter()
        self.tmux("new-session", "-d", "-s", "app", "-x", str(self.width), "-y", str(self.height),
                  f"env {exports} {command}")
        return started

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "app")

    def wait_for(self, predicate, timeout_s: float) -> float:
        """perf_counter when predicate(screen) first holds; TimeoutError after timeout_s."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if predicate(self.screen()):
                return time.perf_counter()
            time.sleep(POLL_S)
        raise TimeoutError(f"screen did not change within {timeout_s} s; last screen:\n{self.screen()}")

    def send(self, key: str) -> float:
        sent = time.perf_counter()
        self.tmux("send-keys", "-t", "app", key)
        return sent

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def app_command() -> str:
    return f"{shlex.quote(sys.executable)} -m tutor learn"


def measure_startup(runs: int, env: dict[str, str]) -> list[float]:
    times = []
    for _ in range(runs):
        terminal = Terminal()
        try:
            started = terminal.start(app_command(), env)
            painted = terminal.wait_for(lambda screen: HOME_MARKER in screen, 20.0)
            times.append(painted - started)
        finally:
            terminal.close()
    return times


def measure_keys_during_bench(presses: int, env: dict[str, str]) -> tuple[list[float], list[float], list[float]]:
    """(F1 -> help painted, q -> help gone, Escape -> help gone) latencies while the quick suite runs."""
    terminal = Terminal()
    opened, closed, escaped = [], [], []
    try:
        terminal.start(app_command(), env)
        terminal.wait_for(lambda screen: HOME_MARKER in screen, 20.0)
        terminal.send("b")
        terminal.wait_for(lambda screen: "Run" in screen and "quick suite" in screen, 5.0)
        terminal.send("r")
        # Wait until torch is loaded and matmuls run: the status names the case being measured.
        terminal.wait_for(lambda screen: BENCH_RUNNING_MARKER in screen and "Escape cancels" in screen, 60.0)
        time.sleep(0.5)
        for index in range(presses):
            sent = terminal.send("F1")
            opened.append(terminal.wait_for(lambda screen: HELP_MARKER in screen, 5.0) - sent)
            sent = terminal.send("Escape" if index % 2 else "q")
            gone = terminal.wait_for(lambda screen: HELP_MARKER not in screen, 5.0) - sent
            (escaped if index % 2 else closed).append(gone)
            time.sleep(0.1)
        still_running = "Escape cancels" in terminal.screen()
        if not still_running:
            print("note: the suite finished before the last key; later figures were taken after it")
    finally:
        terminal.close()
    return opened, closed, escaped


def report(name: str, values: list[float], goal: float) -> None:
    median, worst = statistics.median(values), max(values)
    print(f"{name}: median {median * 1000:.0f} ms, best {min(values) * 1000:.0f} ms, worst {worst * 1000:.0f} ms "
          f"over {len(values)}; goal {goal * 1000:.0f} ms: median/goal = {median / goal:.2f}, "
          f"worst/goal = {worst / goal:.2f} ({'met' if worst <= goal else 'MISSED' if median > goal else 'median met'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="start-ups to time")
    parser.add_argument("--keys", type=int, default=12, help="F1/close pairs during the benchmark")
    parser.add_argument("--no-bench", action="store_true", help="skip the key-latency part (no torch needed)")
    args = parser.parse_args(argv)
    if shutil.which("tmux") is None:
        print("needs tmux (apt-get install tmux)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="tensor-tutor-bench-") as data_dir:
        env = {"TENSOR_TUTOR_DATA_DIR": data_dir, "TERM": "xterm-256color", "TEXTUAL_ANIMATIONS": "none",
               "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")]))}
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, terminal 120x40 (tmux)")
        report("launch -> home screen painted", measure_startup(args.runs, env), STARTUP_GOAL_S)
        if not args.no_bench:
            opened, closed, escaped = measure_keys_during_bench(args.keys, env)
            report("F1 -> help painted, bench running", opened, KEY_GOAL_S)
            report("q -> help gone, bench running", closed, KEY_GOAL_S)
            report("Escape -> help gone, bench running (includes ESCDELAY 100 ms)", escaped,
                   KEY_GOAL_S + ESCAPE_DELAY_S)
    return 0


if __name__ == "__main__":
    sys.exit(main())
