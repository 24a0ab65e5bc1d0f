"""Wall time of `tensor-tutor lab moe --json`, end to end (interpreter start, torch import, three
training runs of the MoE layer, FLOP counting), and of `lab moe ranks=2 --json` (plus two spawned
ranks and the all-to-all). Goal: <= 15 s each on the 2-core CPU machine. Prints the balance figures
of each run beside the time, so a slow run and a changed result are seen together.

    python benchmarks/lab_moe_time.py [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 15.0
CASES = ((), ("ranks=2",))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    worst: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as data_dir:
        env = {**os.environ, "TENSOR_TUTOR_DATA_DIR": data_dir,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        for case in CASES:
            name = " ".join(("lab moe", *case))
            for run in range(args.runs):
                start = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "tutor", "lab", "moe", *case, "--json"], cwd=ROOT,
                                      env=env, capture_output=True, text=True)
                elapsed = time.perf_counter() - start
                if done.returncode != 0:
                    print(done.stderr, file=sys.stderr)
                    return 1
                metrics = json.loads(done.stdout)["metrics"]
                balance = ", ".join(f"{run_name} {metrics[f'max_over_mean_{run_name}']:.2f}x"
                                    for run_name in ("none", "aux_loss", "bias"))
                extra = (f"; all-to-all {metrics['alltoall_measured_over_theory']:.2f}x theory"
                         if "alltoall_measured_over_theory" in metrics else "")
                print(f"{name}, run {run + 1}: {elapsed:.1f} s wall; busiest over mean: {balance}; "
                      f"routed/all-experts FLOPs {metrics['active_over_total']:.3f}{extra}")
                worst[name] = max(worst.get(name, 0.0), elapsed)
    print()
    for name, seconds in worst.items():
        print(f"{name}: worst of {args.runs}: {seconds:.1f} s (goal <= {GOAL_S:g} s) -> "
              f"{'MET' if seconds <= GOAL_S else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
