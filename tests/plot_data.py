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
