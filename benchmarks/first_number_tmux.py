"""Lesson 1's first number in the REAL app, as a learner meets it: fresh launches in tmux, Enter as
soon as the lesson is shown, against `tensor-tutor bench matmul --dtype fp32 --budget 12`.

    python benchmarks/first_number_tmux.py [--launches 10] [--goal 0.7] [--bench-budget 12]
                                           [--reference each|once]

Each launch: a fresh `python -m tutor learn training-loop/parameters` in a 120x40 pane of a private
tmux server with a fresh data dir (no saved progress, settings or results), Enter the moment the
lesson's "press Run (Enter)" line is painted (torch is still loading in the measurement process:
a learner does not wait for it), then the first fp32 rate read from the painted summary line
("fp32 65.3 GFLOP/s on cpu...", the screen read every RESULT_POLL_S while the app measures, so that
reading it does not load the cores it measures). Then the reference, `python -m tutor bench matmul --dtype fp32
--budget 12 --json` in its own process, right after that launch (`--reference each`, default: both
figures under the same load) or once after all launches; its headline median TFLOP/s is the figure
`bench` prints. Per launch: the app's rate, the reference, their ratio, the summary's words about
stability and busyness, and the load average. The goal: ratio >= 0.7 in 10 of 10 launches.
The line before the verdict counts the launches whose summary said "machine busy" (other programs,
not the app, took the cores while it measured); the last line is the verdict: "N of M >= 0.7: PASS|FAIL".

`benchmarks/first_number.py` is the in-process variant (the probe through a fresh worker, no app).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from app_startup import LESSON_ONE, RUN_PROMPT, Terminal, app_command, pane_cell  # noqa: E402

GOAL = 0.7
LAUNCHES = 10
BENCH_BUDGET_S = 12.0
RESULT_TIMEOUT_S = 120.0
START_TIMEOUT_S = 20.0
RESULT_POLL_S = 0.25
"""How often the screen is read while the app measures. Each read is a `tmux capture-pane` process
and the tmux server serialising the pane: at app_startup's 5 ms that took 0.3-0.5 of the 2 cores,
load the reference bench never had and a learner's terminal does not add (the app read 101-216
GFLOP/s under it, 265-317 with a read a second, bench 297-306). Enter -> number is then to 0.25 s."""
BUSY_WORDS = "machine busy:"
"""What the summary says when other processes took at least tutor.bench.busy.BUSY_SHARE of the cores."""
SUMMARY = re.compile(r"fp32 (\d[\d.,]*) ([kMGTP]?)FLOP/s on \w+")
PREFIX = {"": 1e-12, "k": 1e-9, "M": 1e-6, "G": 1e-3, "T": 1.0, "P": 1e3}


def tflops_from_screen(screen: str) -> tuple[float, str] | None:
    """(TFLOP/s, the summary's cell text) from the painted measure block, None until it is there."""
    for line in screen.splitlines():
        match = SUMMARY.search(line)
        if match:
            value = float(match.group(1).replace(",", "")) * PREFIX[match.group(2)]
            return value, pane_cell(line, match.group(0))
    return None


def block_cell(line: str) -> str:
    """The measure block's part of a painted line: between its left border and the next one."""
    cells = line.split("│")
    return cells[1].strip(" ▏▕") if len(cells) > 2 else ""


def summary_text(screen: str, start: str) -> str:
    """Everything the measure block says about the run, joined: the summary paragraph (it wraps
    inside the block) and each row's label, figures and notes (the thread count the lab used, the
    wait for free cores, how many sizes settled), down to the bar chart or the block's end."""
    lines = screen.splitlines()
    index = next(i for i, line in enumerate(lines) if start in line)
    words = []
    for line in lines[index:]:
        cell = block_cell(line)
        if not cell or "█" in cell or "╰" in line.split("│")[0]:
            break
        words.append(cell)
    return " ".join(words)


def one_launch(env: dict[str, str]) -> dict[str, object]:
    terminal = Terminal()
    try:
        launched = terminal.start(app_command(LESSON_ONE), env)
        shown = terminal.wait_for(lambda screen: RUN_PROMPT in screen, 60.0)
        sent = terminal.send("Enter")
        try:
            terminal.wait_for(lambda screen: RUN_PROMPT not in screen, START_TIMEOUT_S)
        except TimeoutError:
            return {"tflops": None, "summary": f"Enter did not start the run within {START_TIMEOUT_S:g} s",
                    "shown_s": shown - launched, "enter_to_number_s": float("nan")}
        terminal.wait_for(lambda screen: tflops_from_screen(screen) is not None, RESULT_TIMEOUT_S,
                          poll_s=RESULT_POLL_S)
        screen = terminal.screen()
        rate, cell = tflops_from_screen(screen)  # type: ignore[misc]
        return {"tflops": rate, "summary": summary_text(screen, cell[:20]), "shown_s": shown - launched,
                "enter_to_number_s": time.perf_counter() - sent}
    finally:
        terminal.close()


def reference(budget_s: float) -> dict[str, object]:
    command = [sys.executable, "-m", "tutor", "bench", "matmul", "--dtype", "fp32", "--budget", f"{budget_s:g}",
               "--json"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the reference bench failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    results = [result for result in json.loads(done.stdout)["results"] if result.get("kind") == "matmul"
               and not result.get("fixed_size")]
    if not results:
        raise SystemExit("the reference bench measured no fp32 matmul")
    return next((result for result in results if result.get("headline")), results[0])


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=LAUNCHES)
    parser.add_argument("--goal", type=float, default=GOAL, help="the smallest ratio that passes (default 0.7)")
    parser.add_argument("--bench-budget", type=float, default=BENCH_BUDGET_S)
    parser.add_argument("--reference", choices=("each", "once"), default="each",
                        help="run the reference bench after each launch (default) or once after all")
    args = parser.parse_args(argv)
    if shutil.which("tmux") is None:
        print("needs tmux (apt-get install tmux)", file=sys.stderr)
        return 2
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {load()}; lesson {LESSON_ONE} in a 120x40 "
          f"tmux pane, Enter as soon as it is shown; reference: bench matmul --dtype fp32 --budget "
          f"{args.bench_budget:g} ({args.reference})")
    launches = []
    for index in range(1, args.launches + 1):
        with tempfile.TemporaryDirectory(prefix="tensor-tutor-first-") as data_dir:
            env = {"TENSOR_TUTOR_DATA_DIR": data_dir, "TERM": "xterm-256color", "TEXTUAL_ANIMATIONS": "none",
                   "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")]))}
            launch = one_launch(env)
        launch["load"] = load()
        if args.reference == "each":
            launch["reference"] = reference(args.bench_budget)
        launches.append(launch)
        if args.reference == "each":
            report(index, launch, launch["reference"], args.goal)  # type: ignore[arg-type]
    if args.reference == "once":
        ref = reference(args.bench_budget)
        for index, launch in enumerate(launches, 1):
            launch["reference"] = ref
            report(index, launch, ref, args.goal)
    passed = sum(launch["tflops"] is not None and launch["tflops"] / launch["reference"]["tflops_median"] >= args.goal
                 for launch in launches)  # type: ignore[index, operator]
    from tutor.bench.busy import BUSY_SHARE
    from tutor.formatting import format_percent

    busy = sum(BUSY_WORDS in str(launch["summary"]) for launch in launches)
    print(f"{load()} at the end; the app found the machine busy (other processes >= {format_percent(BUSY_SHARE)} "
          f"of the cores while it measured) in {busy} of {args.launches} launches")
    print(f"{passed} of {args.launches} >= {args.goal:g} of bench matmul's fp32 best: "
          f"{'PASS' if passed == args.launches else 'FAIL'}")
    return 0 if passed == args.launches else 1


def report(index: int, launch: dict, ref: dict, goal: float) -> None:
    from tutor.formatting import format_rate

    if launch["tflops"] is None:
        print(f"launch {index:2d}: no number: {launch['summary']}; {launch['load']}  LOW")
        return
    ratio = launch["tflops"] / ref["tflops_median"]
    print(f"launch {index:2d}: app {format_rate(launch['tflops'], 'TFLOP/s')}, bench "
          f"{format_rate(ref['tflops_median'], 'TFLOP/s')} at {ref['m']}x{ref['n']}x{ref['k']} ({ref['backend']}): "
          f"ratio {ratio:.2f} {'ok' if ratio >= goal else 'LOW'}; lesson shown {launch['shown_s']:.1f} s after launch, "
          f"Enter -> number {launch['enter_to_number_s']:.1f} s; {launch['load']}; app said: {launch['summary']}")


if __name__ == "__main__":
    sys.exit(main())
