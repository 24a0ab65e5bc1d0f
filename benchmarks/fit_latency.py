"""How fast `tensor-tutor fit <preset> --json` answers, end to end, as a user runs it.

Goal (issue 2): well under half a second on the 2-core machine. Times fresh processes (interpreter
start, imports, the estimate, the batch/context searches and JSON output) and, side by side, a bare
`python -c pass` as the floor no command can beat. Prints medians and the ratio to the goal.

    python benchmarks/fit_latency.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

GOAL_S = 0.5
CASES = [
    ["fit", "llama-3.1-8b", "--json"],
    ["fit", "llama-3.1-70b", "--mode", "train", "--device", "80GB", "--json"],
    ["fit", "deepseek-v3", "--device", "141GB", "--json"],
    ["models", "--json"],
]


def median_seconds(argv: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    runs = parser.parse_args().runs
    floor = median_seconds([sys.executable, "-c", "pass"], runs)
    print(f"{'command':<62} {'median s':>9} {'vs goal':>8}")
    print(f"{'python -c pass (floor)':<62} {floor:>9.3f} {floor / GOAL_S:>7.0%}")
    for case in CASES:
        seconds = median_seconds([sys.executable, "-m", "tutor", *case], runs)
        print(f"{'tensor-tutor ' + ' '.join(case):<62} {seconds:>9.3f} {seconds / GOAL_S:>7.0%}")
    print(f"goal: each under {GOAL_S} s (100% = the goal)")


if __name__ == "__main__":
    main()
