"""Our FP32 matmul measurement against plain reference loops, side by side, in one run.

For each square size, three figures (TFLOP/s = 2n^3 / t):
  ours    tutor.bench's timing core on its torch and numpy GEMM cases (median per iteration, the
          better backend), exactly as `tensor-tutor bench matmul` times a shape;
  torch   a plain loop `for _ in range(r): torch.matmul(a, b)`, total / r;
  numpy   a plain loop `for _ in range(r): a @ b`, total / r.
The three are interleaved over several rounds and each keeps its best round, so a busy machine
hurts all alike. Then the headline: `matmul_throughput` (the mamf-style sweep) against the best
reference figure at any size. Goal: ours >= 0.95 of the best reference.

    python benchmarks/matmul_vs_reference.py [--sizes 512,1024,2048,4096] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tutor.bench.environment import load_machine  # noqa: E402
from tutor.bench.matmul import (_NumpyCase, _TorchCase, matmul_throughput, numpy_backend_name,  # noqa: E402
                                torch_backend_name)
from tutor.bench.timing import time_case, use_all_cpu_threads  # noqa: E402
from tutor.theory.flops import matmul_flops  # noqa: E402

GOAL = 0.95


def plain_loop_tflops(fn, flops: int, seconds: float = 1.0) -> float:
    fn()  # the first call pays one-time costs; a plain loop would too, but once
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    repeats = max(2, int(seconds / max(once, 1e-6)))
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return flops * repeats / (time.perf_counter() - start) / 1e12


def ours_tflops(size: int, seconds: float = 1.0) -> tuple[float, str]:
    flops = matmul_flops(size, size, size)
    best = (0.0, "")
    for name, case in ((torch_backend_name("cpu"), _TorchCase(size, size, size, "fp32", "cpu")),
                       (numpy_backend_name(), _NumpyCase(size, size, size))):
        timing = time_case(case.fn, warmup=1, budget_s=seconds, min_iters=3, max_iters=100)
        best = max(best, (flops / timing.median_s / 1e12, name))
    return best


def main() -> int:
    import numpy
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="512,1024,2048,4096")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sweep-budget", type=float, default=20.0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    threads = use_all_cpu_threads()
    torch.set_float32_matmul_precision("highest")
    print(f"torch {torch.__version__} ({torch_backend_name('cpu')}), numpy {numpy.__version__} "
          f"({numpy_backend_name()}), {threads} threads")
    rows = []
    for size in sizes:
        flops = matmul_flops(size, size, size)
        ta, tb = torch.randn(size, size), torch.randn(size, size)
        na, nb = ta.numpy(), tb.numpy()
        ours, torch_ref, numpy_ref, backend = 0.0, 0.0, 0.0, ""
        for _ in range(args.rounds):
            value, name = ours_tflops(size)
            if value > ours:
                ours, backend = value, name
            torch_ref = max(torch_ref, plain_loop_tflops(lambda: torch.matmul(ta, tb), flops))
            numpy_ref = max(numpy_ref, plain_loop_tflops(lambda: na @ nb, flops))
        rows.append((size, ours, backend, torch_ref, numpy_ref))
    print()
    print(f"{'size':>6} {'ours TF/s':>10} {'torch loop':>11} {'numpy loop':>11} {'ours/best ref':>14}  ours via")
    for size, ours, backend, torch_ref, numpy_ref in rows:
        print(f"{size:>6} {ours:10.4f} {torch_ref:11.4f} {numpy_ref:11.4f} {ours / max(torch_ref, numpy_ref):14.3f}  {backend}")
    best_reference = max(max(r[3], r[4]) for r in rows)
    machine = load_machine()
    results = matmul_throughput("cpu", "fp32", budget_s=args.sweep_budget, machine=machine)
    headline = max(results, key=lambda r: r.tflops_median)
    ratio = headline.tflops_median / best_reference
    print(f"\nheadline (mamf-style sweep, {args.sweep_budget:g} s): {headline.tflops_median:.4f} TF/s median at "
          f"{headline.m}x{headline.n}x{headline.k} via {headline.backend}")
    print(f"best reference loop at any size: {best_reference:.4f} TF/s")
    print(f"ours / best reference = {ratio:.3f} (goal >= {GOAL}) -> {'MET' if ratio >= GOAL else 'NOT MET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
