"""The pipeline lab's measured bubble against (P-1)/(M+P-1), for GPipe and 1F1B at M = 2, 4, 8 on
2 local ranks (within 25% of theory on a quiet 2-core machine). Each run is
`tensor-tutor lab pipeline schedule=S microbatches=M --json` end to end; beside each ratio, the median
and longest hand-over between stages (from the end of the sender's block, or the start of the
receiver's wait, to the data's arrival), which should stay near a millisecond, and the ratio the same
blocks give when replayed through the schedule with free hand-overs (what unequal blocks alone cost).
"waiting for a core" above ~0 means other programs shared the cores: re-measure when it is quiet.

    python benchmarks/pipeline_bubble.py [--runs 1] [--steps 4] [--microbatches 2 4 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_RATIO = 1.25


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="runs per setting (the worst is judged)")
    parser.add_argument("--steps", type=int, default=4, help="lab steps (the first warms up)")
    parser.add_argument("--microbatches", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b"])
    args = parser.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory() as data_dir:
        env = {**os.environ, "TENSOR_TUTOR_DATA_DIR": data_dir,
               "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        for schedule in args.schedules:
            for microbatches in args.microbatches:
                for run in range(args.runs):
                    command = [sys.executable, "-m", "tutor", "lab", "pipeline", f"schedule={schedule}",
                               f"microbatches={microbatches}", f"steps={args.steps}", "--json"]
                    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
                    if done.returncode != 0:
                        print(done.stderr, file=sys.stderr)
                        return 1
                    data = json.loads(done.stdout)
                    bubble = data["bubble_fraction"]
                    ratio = bubble["measured"] / bubble["theory"]
                    worst = max(worst, ratio)
                    delay = data.get("transfer_delay_s") or {}
                    blocks = [e["end_s"] - e["start_s"] for events in data["timeline"] for e in events]
                    print(f"{schedule:5} M={microbatches} run {run + 1}: bubble {bubble['measured']:.3f} vs theory "
                          f"{bubble['theory']:.3f} -> {ratio:.2f}x (same blocks, free hand-overs: "
                          f"{data['bubble_with_free_handovers'] / bubble['theory']:.2f}x); "
                          f"per step {data['bubble_per_step']}; "
                          f"hand-over median {1e3 * delay.get('median', float('nan')):.2f} ms, "
                          f"max {1e3 * delay.get('max', float('nan')):.2f} ms; "
                          f"block mean {1e3 * sum(blocks) / len(blocks):.1f} ms, step {1e3 * data['step_s']:.0f} ms; "
                          f"waiting for a core {100 * (data.get('core_wait_share') or 0):.1f}% (quiet: ~0)")
    print(f"\nworst ratio {worst:.2f}x (goal <= {GOAL_RATIO:g}x) -> {'MET' if worst <= GOAL_RATIO else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
