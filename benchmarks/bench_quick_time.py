"""Wall time of `tensor-tutor bench --quick --json`, end to end (interpreter start, torch import,
machine detection, fp32/bf16/fp16 matmul, bandwidth, notebook append). Goal: <= 30 s on the
2-core CPU machine.

    python benchmarks/bench_quick_time.py [--runs 2]
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
GOAL_S = 30.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    times = []
    with tempfile.TemporaryDirectory() as data_dir:
        env = {**os.environ, "TENSOR_TUTOR_DATA_DIR": data_dir,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        for run in range(args.runs):
            start = time.perf_counter()
            done = subprocess.run([sys.executable, "-m", "tutor", "bench", "--quick", "--json"], cwd=ROOT, env=env,
                                  capture_output=True, text=True)
            elapsed = time.perf_counter() - start
            if done.returncode != 0:
                print(done.stderr, file=sys.stderr)
                return 1
            payload = json.loads(done.stdout)
            figures = ", ".join(
                f"{r['dtype']} {r['tflops_median']:.3f} TF/s" if r["kind"] == "matmul" and r.get("headline")
                else f"{r['op']} {r['gbps_best']:.1f} GB/s" for r in payload["results"]
                if (r["kind"] == "matmul" and r.get("headline")) or (r["kind"] == "bandwidth" and r["op"] == "triad"))
            print(f"run {run + 1}: {elapsed:.1f} s wall (suite {payload['device']['elapsed_s']:.1f} s); {figures}")
            times.append(elapsed)
    worst = max(times)
    print(f"\nworst of {len(times)}: {worst:.1f} s (goal <= {GOAL_S:g} s) -> {'MET' if worst <= GOAL_S else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
