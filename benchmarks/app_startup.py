"""How fast the tutor app starts, answers keys and measures, driven in a real terminal (tmux).

    python benchmarks/app_startup.py [--runs 5] [--keys 12] [--first 3] [--no-bench] [--no-lesson]

1. Start-up: from launching `python -m tutor learn` in a 120x40 tmux pane to the home screen
   painted (its welcome line visible in the pane). Goal: <= 0.8 s on the 2-core machine.
2. Key latency while a benchmark runs: on the Bench screen with the quick suite measuring in the
   measurement process (torch matmuls on every core), press F1 and time until the help box is
   painted, then q until it is gone. Goal: p95 <= 100 ms. Escape is timed too, apart: a terminal
   cannot tell a lone Escape from the start of an escape sequence, so Textual waits ESCDELAY (100 ms
   by default, as curses does) before it acts on one; that wait is the terminal's, not the app's.
3. First number: lesson 1 opened directly, the measurement process warm (torch loaded: its
   /proc maps hold libtorch and it has gone idle), Enter on Run -> the matmul result painted.
   Goal: <= 3 s.
4. Cancel: Run again, Escape while it measures -> "cancelled" painted (includes ESCDELAY).
   Goal: <= 0.5 s.
5. Out of memory: Run again and SIGKILL the measurement process from here (what the kernel's OOM
   killer does); the app must stay up, say why ("killed (probably out of memory)"), still answer
   F1, and the next Run must restart the process and measure. (Setting
   TENSOR_TUTOR_WORKER_MEMORY_LIMIT=2GiB on the app instead caps the worker's address space: an
   allocation beyond it fails inside the lab and is shown as its error line.)

Times are wall clock between sending to tmux and seeing the change in `tmux capture-pane`,
polled every POLL_S: each figure includes up to one poll interval and one capture (a few ms).
Runs in a private tmux server and a temporary data dir, so it touches no session or progress of
the user's.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

POLL_S = 0.005
STARTUP_GOAL_S = 0.8
KEY_GOAL_S = 0.100
FIRST_NUMBER_GOAL_S = 3.0
CANCEL_GOAL_S = 0.5
ESCAPE_DELAY_S = 0.100  # Textual's default ESCDELAY
HOME_MARKER = "Enter opens a lesson"
HELP_MARKER = "Help (Escape closes)"
BENCH_RUNNING_MARKER = "matmul"
LESSON_ONE = "training-loop/parameters"
RUN_PROMPT = "press Run (Enter) to measure"
RUNNING_MARKER = "Escape cancels"
RESULT_MARKER = "FLOP/s on"  # the matmul summary: "fp32 65.3 GFLOP/s on cpu"
CANCELLED_MARKER = "cancelled"
KILLED_MARKER = "probably out of memory"


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

    def wait_for(self, predicate, timeout_s: float, poll_s: float = POLL_S) -> float:
        """perf_counter when predicate(screen) first holds, looking every `poll_s`; TimeoutError after timeout_s."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            if predicate(self.screen()):
                return time.perf_counter()
            time.sleep(poll_s)
        raise TimeoutError(f"screen did not change within {timeout_s} s; last screen:\n{self.screen()}")

    def send(self, key: str) -> float:
        sent = time.perf_counter()
        self.tmux("send-keys", "-t", "app", key)
        return sent

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)

    def app_pid(self) -> int:
        """The app's process id (`env` execs python, so it is the pane's process)."""
        return int(self.tmux("display-message", "-p", "-t", "app", "#{pane_pid}").strip())


def app_command(lesson_id: str | None = None) -> str:
    return f"{shlex.quote(sys.executable)} -m tutor learn" + (f" {shlex.quote(lesson_id)}" if lesson_id else "")


def worker_pid(app_pid: int) -> int | None:
    """The app's measurement process: its child running `-m tutor.worker`."""
    import psutil

    try:
        children = psutil.Process(app_pid).children()
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            if "tutor.worker" in child.cmdline():
                return child.pid
        except psutil.NoSuchProcess:
            continue
    return None


def wait_for_warm_worker(app_pid: int, timeout_s: float = 120.0) -> float:
    """Seconds until the measurement process has torch loaded and sits idle (warm-up done)."""
    import psutil

    started = time.perf_counter()
    deadline = started + timeout_s
    while time.perf_counter() < deadline:
        pid = worker_pid(app_pid)
        if pid is not None:
            try:
                with open(f"/proc/{pid}/maps") as maps:
                    loaded = "libtorch" in maps.read()
                process = psutil.Process(pid)
                before = sum(process.cpu_times()[:2])
                time.sleep(0.3)
                idle = sum(process.cpu_times()[:2]) - before < 0.01
            except (OSError, psutil.NoSuchProcess):
                loaded = idle = False
            if loaded and idle:
                return time.perf_counter() - started
        time.sleep(0.1)
    raise TimeoutError("the measurement process did not become ready")


def press_run(terminal: Terminal) -> float:
    """Enter on the lesson's Run button; Tab to it first if Enter did not start it. The send time
    of the Enter that started the run."""
    sent = terminal.send("Enter")
    try:
        terminal.wait_for(lambda screen: RUN_PROMPT not in screen, 1.0)
        return sent
    except TimeoutError:
        terminal.send("Tab")
        time.sleep(0.2)
        return terminal.send("Enter")


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


def measure_lesson_one(runs: int, env: dict[str, str]) -> dict[str, list[float] | list[str]]:
    """First number (warm worker), cancel -> idle, and a killed worker, on lesson 1."""
    figures: dict[str, list] = {"warm_s": [], "first": [], "cancel": [], "killed": []}
    for run in range(runs):
        terminal = Terminal()
        try:
            terminal.start(app_command(LESSON_ONE), env)
            terminal.wait_for(lambda screen: RUN_PROMPT in screen, 20.0)
            figures["warm_s"].append(wait_for_warm_worker(terminal.app_pid()))
            sent = press_run(terminal)
            figures["first"].append(terminal.wait_for(lambda screen: RESULT_MARKER in screen, 30.0) - sent)
            if run == 0:
                figures["summary"] = [pane_cell(line, RESULT_MARKER) for line in terminal.screen().splitlines()
                                      if RESULT_MARKER in line][:1]
            terminal.send("Enter")  # focus stays on Run: measure again, then cancel
            terminal.wait_for(lambda screen: RUNNING_MARKER in screen, 10.0)
            time.sleep(0.3)
            sent = terminal.send("Escape")
            figures["cancel"].append(terminal.wait_for(
                lambda screen: CANCELLED_MARKER in screen and RUNNING_MARKER not in screen, 10.0) - sent)
            if run == 0:
                figures["killed"] = kill_worker_mid_run(terminal)
        finally:
            terminal.close()
    return figures


def kill_worker_mid_run(terminal: Terminal) -> list[str]:
    """SIGKILL the measurement process during a run: what the app shows, and whether it recovers."""
    outcome: list[str] = []
    time.sleep(0.5)  # a cancel-kill restarts the worker in the background
    wait_for_warm_worker(terminal.app_pid())
    terminal.send("Enter")
    terminal.wait_for(lambda screen: RUNNING_MARKER in screen, 10.0)
    pid = worker_pid(terminal.app_pid())
    if pid is None:
        return ["no measurement process found"]
    os.kill(pid, signal.SIGKILL)
    try:
        terminal.wait_for(lambda screen: KILLED_MARKER in screen, 10.0)
        outcome.append("reason shown: " + next(pane_cell(line, KILLED_MARKER) for line in terminal.screen().splitlines()
                                               if KILLED_MARKER in line))
    except TimeoutError:
        outcome.append("MISSED: no reason shown after the kill")
    sent = terminal.send("F1")
    try:
        outcome.append(f"app alive: F1 -> help in {(terminal.wait_for(lambda s: HELP_MARKER in s, 5.0) - sent) * 1000:.0f} ms")
        terminal.send("q")
        terminal.wait_for(lambda screen: HELP_MARKER not in screen, 5.0)
        terminal.send("Enter")
        terminal.wait_for(lambda screen: RESULT_MARKER in screen and RUNNING_MARKER not in screen, 90.0)
        outcome.append("next Run restarted the measurement process and measured")
    except TimeoutError:
        outcome.append("MISSED: the app did not answer after the kill")
    return outcome


def pane_cell(line: str, marker: str) -> str:
    """The part of a painted line between box borders that holds `marker` (not the live pane beside it)."""
    return next((cell.strip(" ▏▕") for cell in line.split("│") if marker in cell), line).strip()


def p95(values: list[float]) -> float:
    """The 95th percentile, nearest rank (the worst value for fewer than 20)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def report(name: str, values: list[float], goal: float, *, percentile: bool = False) -> None:
    median, worst = statistics.median(values), max(values)
    line = (f"{name}: median {median * 1000:.0f} ms, best {min(values) * 1000:.0f} ms, worst {worst * 1000:.0f} ms "
            f"over {len(values)}; goal {goal * 1000:.0f} ms: median/goal = {median / goal:.2f}, ")
    if percentile:
        high = p95(values)
        line += f"p95/goal = {high / goal:.2f} ({'met' if high <= goal else 'MISSED'})"
    else:
        line += (f"worst/goal = {worst / goal:.2f} "
                 f"({'met' if worst <= goal else 'MISSED' if median > goal else 'median met'})")
    print(line)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="start-ups to time")
    parser.add_argument("--keys", type=int, default=12, help="F1/close pairs during the benchmark")
    parser.add_argument("--first", type=int, default=3, help="fresh launches of lesson 1 to time")
    parser.add_argument("--no-bench", action="store_true", help="skip the key-latency part")
    parser.add_argument("--no-lesson", action="store_true", help="skip lesson 1 (first number, cancel, kill)")
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
            report("F1 -> help painted, bench running", opened, KEY_GOAL_S, percentile=True)
            report("q -> help gone, bench running", closed, KEY_GOAL_S, percentile=True)
            report("F1 and q together, bench running", opened + closed, KEY_GOAL_S, percentile=True)
            report("Escape -> help gone, bench running (includes ESCDELAY 100 ms)", escaped,
                   KEY_GOAL_S + ESCAPE_DELAY_S, percentile=True)
        if not args.no_lesson:
            figures = measure_lesson_one(args.first, env)
            print(f"measurement process warm after: {', '.join(f'{s:.1f} s' for s in figures['warm_s'])} "
                  "(from the lesson painted)")
            report("Enter on lesson 1 -> first number painted, torch preloaded", figures["first"],
                   FIRST_NUMBER_GOAL_S)
            for line in figures.get("summary", []):
                print(f"  first result: {line}")
            report("Escape -> measurement cancelled, idle (includes ESCDELAY 100 ms)", figures["cancel"],
                   CANCEL_GOAL_S)
            for line in figures["killed"]:
                print(f"measurement process SIGKILLed mid-run: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
