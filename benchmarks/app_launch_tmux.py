"""Launch -> first screen painted: the tutor app against a bare Textual app, in one run (tmux).

    python benchmarks/app_launch_tmux.py [--runs 5] [--size 120x40]

Alternates `tensor-tutor learn` (home screen: its "Enter opens a lesson" line) with a bare Textual
app of a Header, a Static and a Footer (its Static's line), `--runs` launches each, in a private
tmux server, the same Python and the same terminal size. Each time is from `tmux new-session`
to the marker seen in `capture-pane` (polled every POLL_S, so it includes up to one poll and one
capture, alike for both). Goal: the app's median <= 1.2 x the bare app's median. The
machine is shared: the load is printed beside the figures. The last line is the verdict.
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
from pathlib import Path

POLL_S = 0.005
RATIO_GOAL = 1.2
HOME_MARKER = "Enter opens a lesson"
BARE_MARKER = "bare textual app painted"
BARE_APP = f'''
from textual.app import App
from textual.widgets import Footer, Header, Static


class Bare(App):
    BINDINGS = [("q", "quit", "Quit")]

    def compose(self):
        yield Header()
        yield Static({BARE_MARKER!r})
        yield Footer()


Bare().run()
'''


def launch_seconds(command: str, marker: str, env: dict[str, str], width: int, height: int,
                   timeout_s: float = 30.0) -> float:
    """Seconds from starting `command` in a fresh tmux session to `marker` on its screen."""
    socket = f"tensor-tutor-launch-{uuid.uuid4().hex[:8]}"
    exports = " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", socket, *args], check=True, capture_output=True, text=True).stdout

    try:
        started = time.perf_counter()
        tmux("new-session", "-d", "-s", "app", "-x", str(width), "-y", str(height), f"env {exports} {command}")
        deadline = started + timeout_s
        while time.perf_counter() < deadline:
            if marker in tmux("capture-pane", "-p", "-t", "app"):
                return time.perf_counter() - started
            time.sleep(POLL_S)
        raise TimeoutError(f"{marker!r} not painted within {timeout_s} s")
    finally:
        subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="launches of each app")
    parser.add_argument("--size", default="120x40", help="terminal size, COLSxROWS")
    args = parser.parse_args(argv)
    if shutil.which("tmux") is None:
        print("needs tmux (apt-get install tmux)", file=sys.stderr)
        return 2
    try:
        width, height = (int(n) for n in args.size.split("x"))
    except ValueError:
        print(f"--size: expected COLSxROWS, got {args.size!r}", file=sys.stderr)
        return 2
    if args.runs < 1:
        print("--runs: at least 1", file=sys.stderr)
        return 2
    python = shlex.quote(sys.executable)
    with tempfile.TemporaryDirectory(prefix="tensor-tutor-launch-") as folder:
        bare = Path(folder) / "bare_app.py"
        bare.write_text(BARE_APP, encoding="utf-8")
        env = {"TENSOR_TUTOR_DATA_DIR": folder, "TERM": "xterm-256color", "TEXTUAL_ANIMATIONS": "none",
               "PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH", "")]))}
        # Bytecode as an install leaves it (pip compiles a wheel's modules; textual's already are): a shell with
        # PYTHONDONTWRITEBYTECODE set would otherwise make every launch of the app compile tutor from source.
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(Path(__file__).resolve().parents[1] / "tutor")],
                       check=True)
        # One launch of each first, untimed: both then start from a warm page cache.
        launch_seconds(f"{python} -m tutor learn", HOME_MARKER, env, width, height)
        launch_seconds(f"{python} {shlex.quote(str(bare))}", BARE_MARKER, env, width, height)
        app, plain, loads = [], [], []
        for _ in range(args.runs):
            loads.append(os.getloadavg()[0])
            app.append(launch_seconds(f"{python} -m tutor learn", HOME_MARKER, env, width, height))
            plain.append(launch_seconds(f"{python} {shlex.quote(str(bare))}", BARE_MARKER, env, width, height))
        loads.append(os.getloadavg()[0])
    ratio = statistics.median(app) / statistics.median(plain)
    load = f"load {min(loads):.1f}-{max(loads):.1f}"
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, terminal {width}x{height} (tmux), {args.runs} "
          f"launches each, alternating")
    print(f"tensor-tutor learn -> home painted: median {statistics.median(app) * 1000:.0f} ms "
          f"(best {min(app) * 1000:.0f}, worst {max(app) * 1000:.0f}) ({load})")
    print(f"bare Textual app (Header, Static, Footer) -> painted: median {statistics.median(plain) * 1000:.0f} ms "
          f"(best {min(plain) * 1000:.0f}, worst {max(plain) * 1000:.0f}) ({load})")
    met = ratio <= RATIO_GOAL
    print(f"verdict: {'PASS' if met else 'FAIL'}: app / bare = {ratio:.2f} (goal <= {RATIO_GOAL}) ({load})")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
