"""Bench results with sweeps, as `bench --json` writes them, for the picture tests (fixed numbers
so that the drawings are deterministic; the shapes follow a real run on the 2-core dev box)."""

from __future__ import annotations

CACHES_JSON = {"cpu": {"caches": [
    {"level": 1, "kind": "Data", "size_bytes": 32768, "shared_by_cpus": 1},
    {"level": 1, "kind": "Instruction", "size_bytes": 32768, "shared_by_cpus": 1},
    {"level": 2, "kind": "Unified", "size_bytes": 1048576, "shared_by_cpus": 1},
    {"level": 3, "kind": "Unified", "size_bytes": 33554432, "shared_by_cpus": 2}]}}
HEADER = {"device_under_test": "cpu", "machine": CACHES_JSON}


def matmul_result(dtype: str, backend: str, rates: dict[int, float], peak: float, **extra) -> dict:
    best = max(rates, key=rates.get)
    return {"kind": "matmul", "device": "cpu", "dtype": dtype, "backend": backend, "m": best, "n": best, "k": best,
            "tflops_median": rates[best], "tflops_best": rates[best], "tflops_mean": rates[best],
            "peak_tflops": peak, "percent_of_peak": 100 * rates[best] / peak, "peak_source": "fake",
            "peak_note": "", "iters": 9, "noisy": False, "spread": 0.02, "notes": [], "headline": True,
            "sweep": [{"m": n, "n": n, "k": n, "tflops_median": r, "tflops_best": r, "iters": 9, "noisy": False,
                       "spread": 0.02} for n, r in rates.items()], **extra}


def bandwidth_result(op: str, arrays: int, plateaus: list[tuple[int, float]]) -> dict:
    """A sweep whose GB/s is the plateau of the first level whose limit the working set is under."""
    sweep = []
    size = 4096
    while size <= 2**27:
        working = arrays * size
        gbps = next(rate for limit, rate in plateaus if working <= limit)
        sweep.append({"op": op, "size_bytes": working, "array_bytes": size, "gbps": gbps, "gbps_median": gbps * 0.9,
                      "repeats": 1, "samples": 5, "threads": 1, "dispatch_bound": working < 24 * 2**10})
        size *= 2
    return {"kind": "bandwidth", "device": "cpu", "op": op, "bytes": arrays * 2**27, "bytes_counting": "STREAM",
            "array_bytes": 2**27, "gbps_median": 9.0, "gbps_best": 10.0, "peak_gbps": None, "percent_of_peak": None,
            "iters": 10, "noisy": False, "spread": 0.03, "notes": [], "sweep": sweep}


LEVELS = [(24 * 2**10, 150.0), (512 * 2**10, 90.0), (16 * 2**20, 60.0), (2**40, 12.0)]
RESULTS = [
    matmul_result("fp32", "torch/mkl+onednn", {128: 0.05, 256: 0.09, 512: 0.12, 1024: 0.14, 2048: 0.145}, 0.166),
    matmul_result("bf16", "torch/mkl+onednn", {128: 0.01, 256: 0.04, 512: 0.06, 1024: 0.08}, 0.332),
    matmul_result("fp32", "torch/mkl+onednn", {1024: 0.14}, 0.166, fixed_size=True, headline=False),
    bandwidth_result("copy", 2, LEVELS),
    bandwidth_result("triad", 3, LEVELS),
]


def collective_results(backend: str = "gloo", ranks: int = 2) -> list[dict]:
    """A busbw sweep shaped like `bench collective --ranks 2` on the dev box (latency-bound small
    messages, a plateau from a few MiB), as its JSON keeps it: each result with its op's sweep."""
    curve = {4096: 0.009, 16384: 0.035, 65536: 0.099, 262144: 0.29, 2**20: 0.52, 4 * 2**20: 0.78, 16 * 2**20: 0.81}
    results = []
    for op, factor in (("all_reduce", 1.0), ("all_gather", 0.7)):
        sweep = [{"size_bytes": size, "busbw_gbps": rate * factor, "algbw_gbps": rate * factor, "time_median_s": 0.001,
                  "state": "ok"} for size, rate in curve.items()]
        for point in sweep:
            results.append({"kind": "collective", "op": op, "backend": backend, "ranks": ranks,
                            "bytes": point["size_bytes"], "dtype": "fp32", "busbw_gbps": point["busbw_gbps"],
                            "algbw_gbps": point["algbw_gbps"], "state": "ok", "sweep": sweep})
    return results


H100_HEADER = {"device_under_test": "cuda:0", "machine": {"cpu": {"caches": []}, "gpus": [
    {"name": "NVIDIA H100 80GB HBM3", "spec": {"key": "h100-sxm", "name": "H100 SXM"}}]}}


def pipeline_result(schedule: str = "1f1b"):
    """A pipeline lab result with fixed block times (2 stages x 4 micro-batches; backward 2x forward,
    the last stage a little slower, hand-overs 1 ms), and the theory's schedule of those blocks."""
    from tutor.labs import ProbeResult
    from tutor.labs.pipeline import equal_block_durations, measured_bubble_fraction, replay_timeline, step_time

    stages, microbatches = 2, 4
    durations = [{(kind, i): (0.020 if kind == "F" else 0.040) * (1.1 if stage == 1 else 1.0) + 0.001
                  for kind in "FB" for i in range(microbatches)} for stage in range(stages)]
    measured = replay_timeline(schedule, durations)
    step = step_time(measured, [0.0] * stages)
    theory = replay_timeline(schedule, equal_block_durations(measured))
    theory_step = step_time(theory, [0.0] * stages)
    details = {"bubble_fraction": {"measured": measured_bubble_fraction(measured, step), "theory": 0.2},
               "schedule": schedule, "stages": stages, "microbatches": microbatches, "step_s": step,
               "timeline": measured, "theory_timeline": theory, "theory_step_s": theory_step,
               "theory_schedule_bubble": measured_bubble_fraction(theory, theory_step)}
    return ProbeResult("pipeline", (), {}, "", details=details)


def ddp_result():
    """A ddp lab result whose rank-0 step has three buckets: one hidden behind backward, one half, one exposed."""
    from tutor.labs import ProbeResult
    from tutor.labs.ddp import bucket_overlap

    buckets = [{"index": 0, "bytes": 266240, "ready_s": 0.030, "done_s": 0.045},
               {"index": 1, "bytes": 267264, "ready_s": 0.050, "done_s": 0.070},
               {"index": 2, "bytes": 131072, "ready_s": 0.060, "done_s": 0.075}]
    timeline = {"forward_s": 0.010, "backward_s": 0.076, "step_s": 0.077, "buckets": bucket_overlap({"buckets": buckets})}
    per_rank = [{"rank": r, "compute_s": 0.060, "communication_s": 0.004, "step_s": 0.077} for r in (0, 1)]
    return ProbeResult("ddp", (), {}, "", details={"per_rank": per_rank, "bucket_timeline": timeline})


def moe_result():
    """A moe lab result: a skewed start, and the three runs' loads after training."""
    from tutor.labs import ProbeResult

    start = [0.40, 0.25, 0.15, 0.08, 0.05, 0.04, 0.02, 0.01]
    runs = {"none": [0.38, 0.27, 0.14, 0.09, 0.05, 0.04, 0.02, 0.01],
            "aux_loss": [0.15, 0.14, 0.13, 0.13, 0.12, 0.12, 0.11, 0.10],
            "bias": [0.13, 0.13, 0.13, 0.12, 0.12, 0.12, 0.13, 0.12]}
    return ProbeResult("moe", (), {}, "", details={"expert_load_start": start, "expert_load_by_run": runs})
