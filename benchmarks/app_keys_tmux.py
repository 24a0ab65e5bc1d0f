"""Keys on a lesson screen while a measurement and the live pane run, in the real app (tmux).

    python benchmarks/app_keys_tmux.py [--keys 24] [--bursts 50] [--sizes 120x40,80x24] [--seed 20]

For each terminal size: launch `tensor-tutor learn training-loop/parameters` (lesson 1: a measure
block, a predict block, a number quiz; the live pane beside the text at 120x40, under it at 80x24)
in a private tmux server, with TENSOR_TUTOR_KEYLOG set so the app appends `monotonic_ns key` for
every key its loop receives (tutor.ui.app.KEYLOG_ENV). Press Run, and while it measures:

(a) Key latency: `--keys` presses of a key nothing is bound to on the Run button, 0.5-1 s apart;
    each is timed from just before `tmux send-keys` to its line in the key log (one clock,
    CLOCK_MONOTONIC, for both processes). Goal: p95 <= 100 ms.
(b) Burst edits: `--bursts` edits shared among the predict input, the quiz answer and the command
    palette. Each clears the field, then sends one `tmux send-keys` call mixing digits and '.' with
    BSpace, End, Home, Left and C-u, and reads the field's text off the screen (capture-pane) once
    the key log holds every key; it is compared exactly with what an Input makes of those keys in
    order. Goal: 0 corrupted of 50.

Whenever the measurement has ended (the header no longer says "measuring"), Run is pressed again
(Ctrl+Up to the measure box, Enter, Ctrl+Down back), so every key and burst is sent during one.
Keys sent while none ran are left out and counted. A control follows: the same key timing on a
bare Textual app (Header, Static, Footer), to tell the app's own stalls from the load's. The machine is shared: the load (`os.getloadavg`)
is printed beside every figure. The last line is the verdict.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

LESSON = "training-loop/parameters"
KEY_GOAL_MS = 100.0
BURST_GOAL = 0
RUN_PROMPT = "press Run (Enter) to measure"
MEASURING = "measuring"  # the header's worker state while a probe runs
IDLE_KEY = "x"  # bound to nothing on the lesson screen; a Button ignores it
POLL_S = 0.01
EDIT_KEYS = ("BSpace", "End", "Home", "Left", "C-u")
TYPED = "0123456789."
PALETTE_MARKER = "Search for commands"
CONTROL_WARM_S = 10.0  # the control's lab: torch imported and matmuls started (about 3-6 s here)


class Terminal:
    """One tmux pane on a private server."""

    def __init__(self, width: int, height: int) -> None:
        self.socket = f"tensor-tutor-keys-{uuid.uuid4().hex[:8]}"
        self.width, self.height = width, height

    def tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.socket, *args], check=True, capture_output=True,
                              text=True).stdout

    def start(self, command: str, env: dict[str, str]) -> None:
        exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())
        self.tmux("new-session", "-d", "-s", "app", "-x", str(self.width), "-y", str(self.height),
                  f"env {exports} {command}")

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", "app")

    def wait_for(self, predicate, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            screen = self.screen()
            if predicate(screen):
                return screen
            if time.monotonic() > deadline:
                raise TimeoutError(f"screen did not change within {timeout_s} s; last screen:\n{screen}")
            time.sleep(POLL_S)

    def send(self, *keys: str) -> int:
        """Send keys in one tmux call; the monotonic_ns just before it."""
        sent = time.monotonic_ns()
        self.tmux("send-keys", "-t", "app", *keys)
        return sent

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


class KeyLog:
    """The app's key log: `monotonic_ns key` lines."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def entries(self) -> list[tuple[int, str]]:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return []
        found = []
        for line in lines:
            stamp, _, key = line.partition(" ")
            if stamp.isdigit():
                found.append((int(stamp), key))
        return found

    def wait_count(self, count: int, timeout_s: float) -> list[tuple[int, str]]:
        """The log once it holds at least `count` keys; TimeoutError otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            entries = self.entries()
            if len(entries) >= count:
                return entries
            if time.monotonic() > deadline:
                raise TimeoutError(f"the app received {len(entries)} of {count} keys within {timeout_s} s")
            time.sleep(POLL_S)


def typed_text(keys: list[str]) -> str:
    """What a Textual Input holds after `keys` (tmux key names), starting empty: each printable
    character is inserted at the cursor, BSpace deletes left of it, Left/Home/End move it, C-u
    deletes everything left of it (Input's delete_left_all)."""
    text, cursor = "", 0
    for key in keys:
        if key == "BSpace":
            if cursor:
                text, cursor = text[:cursor - 1] + text[cursor:], cursor - 1
        elif key == "End":
            cursor = len(text)
        elif key == "Home":
            cursor = 0
        elif key == "Left":
            cursor = max(cursor - 1, 0)
        elif key == "C-u":
            text, cursor = text[cursor:], 0
        else:
            text, cursor = text[:cursor] + key + text[cursor:], cursor + 1
    return text


def burst_keys(rng: random.Random) -> list[str]:
    """One burst: 8-16 keys, about a third of them edits, ending on typed characters, so the
    field's final text is never empty (an empty field shows its placeholder)."""
    while True:
        keys = [rng.choice(EDIT_KEYS) if rng.random() < 0.35 else rng.choice(TYPED)
                for _ in range(rng.randint(8, 16))]
        keys += [rng.choice(TYPED) for _ in range(2)]
        if typed_text(keys):
            return keys


def input_text(screen: str, field: str) -> str | None:
    """The text of a field as painted: the predict input is on the row with its Commit button, the
    quiz answer on the first row with Check, the palette's search on the row under its top edge."""
    lines = screen.splitlines()
    if field == "palette":
        row = next((line for line in lines if "🔎" in line), None)
        return None if row is None else row.split("🔎", 1)[1].strip()
    button = "Commit" if field == "predict" else "Check"
    for line in lines:
        if "▊" in line and "▎" in line and button in line:
            return line.split("▊", 1)[1].split("▎", 1)[0].strip()
    return None


@dataclass
class Run:
    latencies_ms: list[float]
    idle_keys: int
    bursts: list[tuple[str, str, str]]  # (field, expected, painted)
    restarts: int
    loads: list[float]
    bad_screen: str


class Session:
    def __init__(self, terminal: Terminal, log: KeyLog) -> None:
        self.terminal, self.log = terminal, log
        self.received = 0
        self.restarts = 0
        self.field = "run"  # where the focus is: run, predict, quiz
        self.last_bad_screen = ""

    def send_counted(self, *keys: str, timeout_s: float = 10.0) -> list[tuple[int, str]]:
        """Send keys in one call and wait until the app's loop has received them all."""
        self.terminal.send(*keys)
        self.received += len(keys)
        return self.log.wait_count(self.received, timeout_s)

    def measuring(self) -> bool:
        return MEASURING in self.terminal.screen().splitlines()[0]

    def focus(self, field: str) -> None:
        """Focus Run, the predict guess or the quiz answer (boxes 1-3 of the lesson) from anywhere:
        Ctrl+Up to the first box (more presses than boxes: a press there only says "no more
        boxes"), then Ctrl+Down to the one wanted."""
        steps = ["run", "predict", "quiz"].index(field)
        self.send_counted(*["C-Up"] * 4, *["C-Down"] * steps)
        self.field = field
        time.sleep(0.2)

    def ensure_measuring(self) -> None:
        if self.measuring():
            return
        back = self.field
        self.focus("run")
        for _ in range(12):  # the header can say "ready" a moment before Run takes a press again
            self.send_counted("Enter")
            try:
                self.terminal.wait_for(lambda screen: MEASURING in screen.splitlines()[0], 5.0)
                time.sleep(0.5)  # a run that starts may move the focus: navigate after it
                break
            except TimeoutError:
                continue
        else:
            raise RuntimeError(f"Run did not start a measurement; the screen:\n{self.terminal.screen()}")
        self.restarts += 1
        self.focus(back)


def clear_field(session: Session, field: str) -> None:
    terminal = session.terminal
    session.send_counted("End", "C-u")
    if field == "palette":
        terminal.wait_for(lambda screen: input_text(screen, field) in ("", None) or PALETTE_MARKER in screen, 5.0)
    else:
        placeholder = "your guess" if field == "predict" else "your answer"
        terminal.wait_for(lambda screen: placeholder in (input_text(screen, field) or ""), 5.0)


def one_burst(session: Session, field: str, rng: random.Random) -> tuple[str, str, str]:
    terminal = session.terminal
    session.ensure_measuring()
    if field == "palette":
        session.send_counted("C-p")
        terminal.wait_for(lambda screen: PALETTE_MARKER in screen, 5.0)
    else:
        session.focus(field)
    clear_field(session, field)
    keys = burst_keys(rng)
    expected = typed_text(keys)
    session.send_counted(*keys)
    painted: str | None = None
    deadline = time.monotonic() + 2.0  # received: give the paint up to 2 s to show it
    while time.monotonic() < deadline:
        screen = terminal.screen()
        painted = input_text(screen, field)
        if painted == expected:
            break
        time.sleep(POLL_S)
    else:
        session.last_bad_screen = screen
    if field == "palette":
        session.send_counted("Escape")
        terminal.wait_for(lambda screen: "🔎" not in screen, 5.0)
    return field, " ".join(keys), "" if painted is None else painted


def measure(width: int, height: int, keys: int, bursts: int, seed: int, env: dict[str, str]) -> Run:
    rng = random.Random(seed)
    terminal = Terminal(width, height)
    with tempfile.TemporaryDirectory(prefix="tensor-tutor-keylog-") as folder:
        log = KeyLog(Path(folder) / "keys.log")
        try:
            terminal.start(f"{shlex.quote(sys.executable)} -m tutor learn {LESSON}",
                           {**env, "TENSOR_TUTOR_KEYLOG": str(log.path)})
            terminal.wait_for(lambda screen: RUN_PROMPT in screen, 30.0)
            time.sleep(0.5)  # Run is focused once the layout settles
            session = Session(terminal, log)
            session.ensure_measuring()  # Enter on Run (again, if the first only brought the focus to it)
            session.restarts = 0
            latencies, idle, loads = [], 0, []
            while len(latencies) < keys:
                session.ensure_measuring()
                before = session.received
                sent = terminal.send(IDLE_KEY)
                session.received += 1
                stamp, key = session.log.wait_count(session.received, 10.0)[before]
                if key != IDLE_KEY:
                    raise RuntimeError(f"key log out of step: expected {IDLE_KEY!r}, got {key!r}")
                if session.measuring():
                    latencies.append((stamp - sent) / 1e6)
                    loads.append(os.getloadavg()[0])
                else:
                    idle += 1
                time.sleep(rng.uniform(0.5, 1.0))
            fields = ["predict", "quiz", "palette"]
            edits = [one_burst(session, fields[index % 3], rng) for index in range(bursts)]
            loads.append(os.getloadavg()[0])
            return Run(latencies, idle, [(f, k, p) for f, k, p in edits], session.restarts, loads,
                       session.last_bad_screen)
        finally:
            terminal.close()


BARE_APP = """
import os, sys, time
from textual import events
from textual.app import App
from textual.widgets import Footer, Header, Static

LOG = open(sys.argv[1], "a", buffering=1)


class Bare(App):
    async def on_event(self, event):
        if isinstance(event, events.Key) and not event.is_forwarded:
            LOG.write(f"{time.monotonic_ns()} {event.key}\\n")
        await super().on_event(event)

    def compose(self):
        yield Header()
        yield Static("bare textual app painted")
        yield Footer()


Bare().run()
"""


def bare_latencies(keys: int, seed: int, env: dict[str, str]) -> tuple[list[float], list[float]]:
    """The control: the same key timing on a bare Textual app (Header, Static, Footer) with the
    same key log, while `tensor-tutor lab matmul` measures beside it, on the same machine a moment
    later: what the load and a measurement cost a key without the tutor's interface."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="tensor-tutor-bare-") as folder:
        script, log = Path(folder) / "bare.py", KeyLog(Path(folder) / "keys.log")
        script.write_text(BARE_APP, encoding="utf-8")
        terminal = Terminal(120, 40)
        lab: subprocess.Popen[bytes] | None = None
        try:
            terminal.start(f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {shlex.quote(str(log.path))}",
                           env)
            terminal.wait_for(lambda screen: "bare textual app painted" in screen, 30.0)
            # A measurement beside it, as in the app: lesson 1's lab, from the command line.
            lab = subprocess.Popen([sys.executable, "-m", "tutor", "lab", "matmul", "dtypes=fp32", "budget_s=120"],
                                   env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(CONTROL_WARM_S)  # torch loaded, the matmuls running
            latencies, loads = [], []
            for index in range(keys):
                sent = terminal.send(IDLE_KEY)
                stamp, _ = log.wait_count(index + 1, 10.0)[index]
                latencies.append((stamp - sent) / 1e6)
                loads.append(os.getloadavg()[0])
                time.sleep(rng.uniform(0.5, 1.0))
            return latencies, loads
        finally:
            if lab is not None:
                lab.kill()
                lab.wait()
            terminal.close()


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=24, help="timed key presses per size")
    parser.add_argument("--bursts", type=int, default=50, help="burst edits per size")
    parser.add_argument("--sizes", default="120x40,80x24", help="terminal sizes, COLSxROWS, comma-separated")
    parser.add_argument("--seed", type=int, default=20, help="seed of the bursts and the key spacing")
    parser.add_argument("--no-control", action="store_true", help="skip the bare Textual app's key timing")
    parser.add_argument("--show-screen", action="store_true", help="print the screen of a corrupted edit")
    args = parser.parse_args(argv)
    if shutil.which("tmux") is None:
        print("needs tmux (apt-get install tmux)", file=sys.stderr)
        return 2
    try:
        sizes = [tuple(int(n) for n in size.split("x")) for size in args.sizes.split(",")]
    except ValueError:
        print(f"--sizes: expected COLSxROWS[,COLSxROWS], got {args.sizes!r}", file=sys.stderr)
        return 2
    met = True
    with tempfile.TemporaryDirectory(prefix="tensor-tutor-keys-") as data_dir:
        env = {"TENSOR_TUTOR_DATA_DIR": data_dir, "TERM": "xterm-256color", "TEXTUAL_ANIMATIONS": "none",
               "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")]))}
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, lesson {LESSON}, live pane shown")
        for width, height in sizes:
            run = measure(width, height, args.keys, args.bursts, args.seed, env)
            load = f"load {min(run.loads):.1f}-{max(run.loads):.1f}"
            high = p95(run.latencies_ms)
            print(f"{width}x{height} key latency (tmux send -> app loop) while measuring: median "
                  f"{statistics.median(run.latencies_ms):.0f} ms, p95 {high:.0f} ms, max {max(run.latencies_ms):.0f} ms "
                  f"over {len(run.latencies_ms)} keys ({run.idle_keys} left out: sent while no measurement ran); "
                  f"goal p95 <= {KEY_GOAL_MS:.0f} ms: {'met' if high <= KEY_GOAL_MS else 'MISSED'} ({load})")
            corrupted = [(field, keys, painted) for field, keys, painted in run.bursts
                         if painted != typed_text(keys.split())]
            by_field = {field: sum(1 for f, *_ in corrupted if f == field) for field in ("predict", "quiz", "palette")}
            print(f"{width}x{height} burst edits while measuring: {len(corrupted)}/{len(run.bursts)} corrupted "
                  f"(predict {by_field['predict']}, quiz {by_field['quiz']}, palette {by_field['palette']}); "
                  f"goal {BURST_GOAL}: {'met' if len(corrupted) <= BURST_GOAL else 'MISSED'} "
                  f"(Run pressed {run.restarts} more times to keep a measurement going; {load})")
            for field, keys, painted in corrupted[:5]:
                print(f"  {field}: sent [{keys}] -> expected {typed_text(keys.split())!r}, painted {painted!r}")
            if corrupted and args.show_screen:
                print(f"  the screen of the last corrupted edit:\n{run.bad_screen}")
            met = met and high <= KEY_GOAL_MS and len(corrupted) <= BURST_GOAL
        if not args.no_control:
            control, loads = bare_latencies(args.keys, args.seed, env)
            print(f"control, bare Textual app 120x40 beside `lab matmul`, same keys: median {statistics.median(control):.0f} ms, "
                  f"p95 {p95(control):.0f} ms, max {max(control):.0f} ms over {len(control)} keys "
                  f"(load {min(loads):.1f}-{max(loads):.1f})")
    print(f"verdict: {'PASS' if met else 'FAIL'} (key p95 <= {KEY_GOAL_MS:.0f} ms and {BURST_GOAL} corrupted "
          f"burst edits at every size)")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
