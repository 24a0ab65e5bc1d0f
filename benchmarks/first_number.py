"""The first number on lesson 1 against `tensor-tutor bench matmul`'s fp32 best, over fresh launches.

The check: the figure a learner sees after pressing Enter on the first lesson's measure block
must be within 30 % of what the CLI benchmark finds on the same machine, in 10 launches out of 10.

1. The reference: `python -m tutor bench matmul --dtype fp32 --json`, once, in its own process; its
   headline result's median TFLOP/s (the figure `bench` prints; the better of torch and numpy).
2. N fresh launches (default 10). Each starts a fresh measurement process as the app does
   (tutor.worker: it imports torch and warms it up), waits until it is ready, then runs the first
   lesson's first measure/predict block exactly as the app would: same probe, same params read from
   the lesson file, same budget. With `--via process` (or when tutor.worker is missing) a fresh Python
   process does the same: niced like the worker, torch imported and warmed, then the probe.
3. Each launch's ratio to the reference, the pass count and PASS/FAIL (exit 0/1).

Every line also says how busy the machine was during that run (other processes' CPU share,
tutor.bench.busy). `--quiet-check` turns that into a gate: when the reference or any launch ran on a
busy machine the figures are not comparable, and the script says so and exits 3.

    python benchmarks/first_number.py [--launches 10] [--via worker|process] [--quiet-check]
                                      [--tolerance 0.3] [--bench-budget SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tutor.bench.busy import BUSY_SHARE  # noqa: E402
from tutor.formatting import format_percent, format_rate  # noqa: E402

TOLERANCE = 0.30
LAUNCHES = 10
EXIT_BUSY = 3
METRIC = "tflops_fp32"
WARM_SIZE = 256  # tutor.worker's warm-up: a few 256 x 256 matmuls


def first_lesson_block() -> tuple[str, str, dict[str, Any]]:
    """(lesson id, probe, params) of the first lesson's first measure or predict block."""
    from tutor.lessons.loader import load_curriculum
    from tutor.lessons.model import Measure, Predict

    curriculum = load_curriculum()
    lesson_id = curriculum.lessons[0].id
    for block in curriculum.lesson(lesson_id).blocks:
        if isinstance(block, (Measure, Predict)):
            if "{{" in json.dumps(block.params):
                raise SystemExit(f"{lesson_id}: the first block's params are drawn per learner; this script "
                                 "runs plain params only")
            return lesson_id, block.probe, dict(block.params)
    raise SystemExit(f"{lesson_id} has no measure or predict block")


def reference(budget: float | None) -> dict[str, Any]:
    """`tensor-tutor bench matmul --dtype fp32 --json`'s headline result, run in its own process."""
    command = [sys.executable, "-m", "tutor", "bench", "matmul", "--dtype", "fp32", "--json"]
    if budget is not None:
        command += ["--budget", str(budget)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the reference bench failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    results = [result for result in json.loads(done.stdout)["results"] if result.get("kind") == "matmul"]
    if not results:
        raise SystemExit("the reference bench measured no fp32 matmul")
    return next((result for result in results if result.get("headline")), results[0])


def launch_via_worker(probe_name: str, params: dict[str, Any]) -> dict[str, Any]:
    """A fresh worker process (as the app starts it), warm; then the probe through it, as the app runs it."""
    from tutor.labs import get_probe
    from tutor.worker.client import WorkerClient
    from tutor.worker.proxies import worker_probe

    client = WorkerClient()
    started = time.perf_counter()
    client.start()
    try:
        while client.state.phase not in ("ready", "failed"):
            if time.perf_counter() - started > 120:
                raise SystemExit("the measurement process did not get ready in 120 s")
            time.sleep(0.02)
        if client.state.phase == "failed":
            raise SystemExit(f"the measurement process failed: {client.state.reason}")
        ready_s = time.perf_counter() - started
        probe = worker_probe(client, get_probe(probe_name))
        enter = time.perf_counter()
        result = probe.run(dict(params), lambda fraction, text: None, threading.Event())
        return {"ready_s": ready_s, "to_number_s": time.perf_counter() - enter, "result": result.to_json()}
    finally:
        client.stop()


def launch_via_process(probe_name: str, params: dict[str, Any]) -> dict[str, Any]:
    """A fresh Python process that does what the worker does, then runs the probe (see `one_launch`)."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--one-launch", probe_name, json.dumps(params)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"a launch failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    answer = json.loads(done.stdout)
    answer["launch_s"] = time.perf_counter() - started
    return answer


def one_launch(probe_name: str, params_json: str) -> int:
    """Inside the fresh process: niced as the worker is, torch imported and warmed, then the probe."""
    started = time.perf_counter()
    try:
        os.setpriority(os.PRIO_PROCESS, 0, 10)  # tutor.worker's MEASUREMENT_NICENESS
    except (AttributeError, OSError):
        pass
    import torch

    a = torch.randn(WARM_SIZE, WARM_SIZE)
    for _ in range(3):
        a = (a @ a).clamp_(-1.0, 1.0)
    from tutor.labs import get_probe

    ready_s = time.perf_counter() - started
    enter = time.perf_counter()
    result = get_probe(probe_name).run(json.loads(params_json), lambda fraction, text: None, threading.Event())
    print(json.dumps({"ready_s": ready_s, "to_number_s": time.perf_counter() - enter, "result": result.to_json()}))
    return 0


def busy_text(busy: dict[str, Any] | None) -> str:
    if not busy:
        return "busy: not measured"
    state = "BUSY" if busy["other_share"] >= BUSY_SHARE else "quiet"
    return f"others {format_percent(busy['other_share'], digits=2)} of {busy['cores']} cores ({state})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=LAUNCHES)
    parser.add_argument("--via", choices=("worker", "process"), default=None,
                        help="worker: tutor.worker as the app runs it (default when it exists); process: a plain "
                             "fresh Python process")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="allowed |ratio - 1| (default 0.3)")
    parser.add_argument("--bench-budget", type=float, default=None, help="--budget for the reference bench")
    parser.add_argument("--quiet-check", action="store_true",
                        help="exit 3 (not comparable) when the reference or any launch saw a busy machine")
    parser.add_argument("--one-launch", nargs=2, metavar=("PROBE", "PARAMS_JSON"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_launch:
        return one_launch(*args.one_launch)

    via = args.via
    if via is None:
        try:
            import tutor.worker.client  # noqa: F401
            via = "worker"
        except ImportError:
            via = "process"
    lesson_id, probe_name, params = first_lesson_block()
    print(f"lesson 1: {lesson_id}, probe {probe_name}, params {json.dumps(params)}; launches via {via}")

    ref = reference(args.bench_budget)
    ref_rate = ref["tflops_median"]
    ref_busy = ref.get("busy")
    print(f"reference: bench matmul fp32 {format_rate(ref_rate, 'TFLOP/s')} at {ref['m']}x{ref['n']}x{ref['k']} "
          f"({ref['backend']}); {busy_text(ref_busy)}")

    launch = launch_via_worker if via == "worker" else launch_via_process
    passed, busy_runs = 0, int(bool(ref_busy) and ref_busy["other_share"] >= BUSY_SHARE)
    waits: list[float] = []
    for index in range(1, args.launches + 1):
        answer = launch(probe_name, params)
        waits.append(answer["to_number_s"])
        result = answer["result"]
        rate = result["metrics"].get(METRIC)
        busy = result.get("busy")
        busy_runs += int(bool(busy) and busy["other_share"] >= BUSY_SHARE)
        headline = result.get("headline", {}).get("fp32", {})
        shape = f"{headline.get('m')}x{headline.get('n')}x{headline.get('k')}" if headline else "?"
        stable = "stable" if headline.get("stable") else "NOT stable"
        if rate is None:
            print(f"launch {index:2d}: no {METRIC} ({result['summary']})  FAIL")
            continue
        ratio = rate / ref_rate
        ok = abs(ratio - 1.0) <= args.tolerance
        passed += ok
        print(f"launch {index:2d}: {format_rate(rate, 'TFLOP/s')} at {shape} ({stable})  ratio {ratio:.2f}  "
              f"{'ok' if ok else 'OUT'}  {answer['to_number_s']:.1f} s Enter->number; {busy_text(busy)}")
    verdict = "PASS" if passed == args.launches else "FAIL"
    print(f"Enter -> number: median {sorted(waits)[len(waits) // 2]:.1f} s, slowest {max(waits):.1f} s "
          f"(the goal with torch preloaded: 3 s; the lesson's budget is {params.get('budget_s', '?')} s)")
    print(f"{passed} of {args.launches} launches within {args.tolerance:.0%} of bench's fp32 best: {verdict}")
    if args.quiet_check:
        print(f"quiet check: the machine was busy during {busy_runs} of {args.launches + 1} runs (reference included; "
              f"busy = other processes >= {BUSY_SHARE:.0%} of the usable cores)")
        if busy_runs:
            print("not comparable: re-run on a quiet machine")
            return EXIT_BUSY
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
