"""How fast `tensor-tutor fit <preset> --json` answers, end to end, as a user runs it.

Goal (issue 2): well under half a second on the 2-core machine. Times fresh processes (interpreter
start, imports, the estimate, the batch/context searches and JSON output) and, side by side, a bare
`python -c pass` as the floor no command can beat. Prints medians and the ratio to the goal.

Issue 11: `fit` was quadratic in the layer count (a 10,000-layer config took 6 min). The deep cases
time a small Mistral-style config (sliding window on every layer) at 2,500 and 10,000 layers;
the last line is the 10,000 / 2,500 ratio of the time above the floor: about 4 when fit is linear
in the layer count, about 16 when quadratic.

    python benchmarks/fit_latency.py [--runs 15]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 0.5
CASES = [
    ["fit", "llama-3.1-8b", "--json"],
    ["fit", "llama-3.1-70b", "--mode", "train", "--device", "80GB", "--json"],
    ["fit", "deepseek-v3", "--device", "141GB", "--json"],
    ["models", "--json"],
]


DEEP_LAYERS = (2_500, 10_000)


def deep_config(folder: Path, layers: int) -> Path:
    """A small Mistral-style config with `layers` layers (hidden 256), every one sliding-window."""
    path = folder / f"deep-{layers}.json"
    path.write_text(json.dumps({
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": layers, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096,
        "sliding_window": 1024, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}))
    return path


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
    with tempfile.TemporaryDirectory() as folder:
        above_floor = {}
        for layers in DEEP_LAYERS:
            for mode in ("inference", "train"):
                case = ["fit", str(deep_config(Path(folder), layers)), "--mode", mode, "--json"]
                seconds = median_seconds([sys.executable, "-m", "tutor", *case], max(1, runs // 5))
                above_floor[layers, mode] = seconds - floor
                label = f"tensor-tutor fit <{layers:,}-layer config> --mode {mode} --json"
                print(f"{label:<62} {seconds:>9.3f} {seconds / GOAL_S:>7.0%}")
        for mode in ("inference", "train"):
            ratio = above_floor[DEEP_LAYERS[1], mode] / above_floor[DEEP_LAYERS[0], mode]
            print(f"{mode}: {DEEP_LAYERS[1]:,} / {DEEP_LAYERS[0]:,} layers, time above the floor: {ratio:.1f}x "
                  f"(linear: {DEEP_LAYERS[1] / DEEP_LAYERS[0]:.0f}x, quadratic: {(DEEP_LAYERS[1] / DEEP_LAYERS[0]) ** 2:.0f}x)")
    print(f"goal: each under {GOAL_S} s (100% = the goal)")


if __name__ == "__main__":
    main()
