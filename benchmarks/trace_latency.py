"""How long `tensor-tutor fit llama-3.1-8b --mode train --trace --json` takes, end to end, as a user runs it.

Goal: the full-size 8B training step traced on fake tensors in at most 15 s on the 2-core
machine, imports included; and `fit` without --trace still under 0.5 s (it must not import torch).
Times fresh processes and prints medians, the ratio to each goal, and the trace's own split
(import, build, step) from its JSON.

    python benchmarks/trace_latency.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

TRACE_GOAL_S = 15.0
FIT_GOAL_S = 0.5
# --recipe bf16: --trace builds transformers' own setups (fp32, bf16, hf-amp); fit's default, mixed, is not one.
TRACED = ["fit", "llama-3.1-8b", "--mode", "train", "--recipe", "bf16", "--seq", "4096", "--batch", "1",
          "--trace", "--json"]
UNTRACED = ["fit", "llama-3.1-8b", "--mode", "train", "--recipe", "bf16", "--json"]


def timed_runs(argv: list[str], runs: int) -> tuple[list[float], str]:
    times, output = [], ""
    for _ in range(runs):
        start = time.perf_counter()
        output = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        times.append(time.perf_counter() - start)
    return times, output


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    print(f"{'command':<86} {'median s':>9} {'vs goal':>8}")
    for case, goal in ((UNTRACED, FIT_GOAL_S), (TRACED, TRACE_GOAL_S)):
        times, output = timed_runs([sys.executable, "-m", "tutor", *case], runs)
        median = statistics.median(times)
        print(f"{'tensor-tutor ' + ' '.join(case):<86} {median:>9.3f} {median / goal:>7.0%}")
        print(f"{'':<4}runs: {', '.join(f'{t:.2f}' for t in times)} s; goal {goal} s")
        trace = json.loads(output).get("trace")
        if trace:
            split = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in trace["seconds"].items())
            print(f"{'':<4}inside the trace: {split}; peak {trace['peak']['bytes'] / 2**30:.2f} GiB "
                  f"in the {trace['peak']['phase']}")
    print("100% = the goal")


if __name__ == "__main__":
    main()
