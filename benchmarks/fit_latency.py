"""How fast `tensor-tutor fit <preset> --json` answers, end to end, as a user runs it.

Goal: well under half a second on the 2-core machine. Times fresh processes (interpreter
start, imports, the estimate, the batch/context searches and JSON output) and, side by side, a bare
`python -c pass` as the floor no command can beat. Prints medians and the ratio to the goal.

`fit` was once quadratic in the layer count (a 10,000-layer config took 6 min). The deep cases
time a small Mistral-style config (sliding window on every layer) at 2,500 and 10,000 layers;
the last line is the 10,000 / 2,500 ratio of the time above the floor: about 4 when fit is linear
in the layer count, about 16 when quadratic.

A model type without a hand profile (Granite, 4 layers) is counted on its real class and
calibrated by traces on its first call, then answered from the cache. Timed in fresh processes: the
first call with an empty data dir (nothing cached: transformers' module table, the parameters, the
calibration), the first call of a new config with the data dir warm from another one (what a user
who has used any such type sees), and the cached call; beside them the same hand-profiled config
(Llama). Goals: first call 3 s, cached 0.5 s, hand profile 0.5 s. Wall seconds depend on the load
of the machine: CPU seconds (the process's user + system time) are printed beside them.

    python benchmarks/fit_latency.py [--runs 15] [--calibrated-only]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


FIRST_CALL_GOAL_S = 3.0
CACHED_GOAL_S = 0.5
SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512, max_position_embeddings=1024, rms_norm_eps=1e-5,
             tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)


# What any calibrated first call imports (FakeTensorMode imports torch._dynamo on its first
# dispatch; transformers' masking_utils at import): no first call can be faster.
IMPORT_FLOOR = ("from tutor.trace.transformers_import import install; install(); import torch, torch._dynamo, "
                "transformers.models.granite.modeling_granite")


def small_config(folder: Path, model_type: str, architecture: str, **extra) -> Path:
    """A small config.json of `model_type` in the keys its configuration class reads."""
    path = folder / f"{model_type}-{len(list(folder.iterdir()))}.json"
    path.write_text(json.dumps({"architectures": [architecture], "model_type": model_type, **SMALL, **extra}))
    return path


def timed(argv: list[str], env: dict | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds: user + system) of one run of argv in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def medians(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def calibrated_rows(runs: int) -> list[tuple[str, float, float, float]]:
    """(label, wall, CPU, goal) for the calibrated and the hand-profiled first and cached calls."""
    fit = [sys.executable, "-m", "tutor", "fit"]
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        warm = {**os.environ, "TENSOR_TUTOR_DATA_DIR": str(Path(folder) / "data-floor")}
        timed([sys.executable, "-c", IMPORT_FLOOR], warm)  # writes transformers' table: the floor reads it
        floor = medians([timed([sys.executable, "-c", IMPORT_FLOOR], warm) for _ in range(runs)])
        rows.append(("import floor: torch, torch._dynamo, modeling_granite", *floor, FIRST_CALL_GOAL_S))
        configs = Path(folder) / "configs"
        configs.mkdir()
        for label, model_type, architecture, extra in (
                ("calibrated (granite)", "granite", "GraniteForCausalLM", {}),
                ("hand profile (llama)", "llama", "LlamaForCausalLM", {})):
            cold, new_config, cached = [], [], []
            for run in range(runs):
                data = Path(folder) / f"data-{model_type}-{run}"
                env = {**os.environ, "TENSOR_TUTOR_DATA_DIR": str(data)}
                cold.append(timed([*fit, str(small_config(configs, model_type, architecture, **extra)), "--json"], env))
                other = small_config(configs, model_type, architecture, intermediate_size=384 + 64 * run)
                new_config.append(timed([*fit, str(other), "--json"], env))
                cached.append(timed([*fit, str(other), "--json"], env))
            goal = FIRST_CALL_GOAL_S if model_type == "granite" else GOAL_S
            rows.append((f"{label}: first call, empty data dir", *medians(cold), goal))
            rows.append((f"{label}: first call of a new config", *medians(new_config), goal))
            rows.append((f"{label}: cached", *medians(cached), CACHED_GOAL_S if model_type == "granite" else GOAL_S))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--calibrated-only", action="store_true",
                        help="only the calibrated-trace and hand-profile first/cached calls")
    options = parser.parse_args()
    runs = options.runs
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    if options.calibrated_only:
        print_calibrated(runs)
        return
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
    print_calibrated(max(1, runs // 5))


def print_calibrated(runs: int) -> None:
    print(f"\n{'tensor-tutor fit <4-layer config> --json, median of ' + str(runs):<52} {'wall s':>7} {'CPU s':>7} "
          f"{'goal s':>7} {'CPU/goal':>8}")
    for label, wall, cpu, goal in calibrated_rows(runs):
        print(f"{label:<52} {wall:>7.2f} {cpu:>7.2f} {goal:>7.1f} {cpu / goal:>7.0%}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
