"""fp64-cost: what FP64 costs against FP32 on this machine, at the same matrix size, and what it buys.

Times C = A @ B in float64 and float32 on the same square size (tutor.bench's timing core), and
sums `count` random values in each format against an exact sum (math.fsum of the float64
values), so the price (time, bytes) and the gain (error) are measured side by side.
"""

from __future__ import annotations

import functools
import math
import threading

from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe
from tutor.formatting import format_number, format_quantity


def bytes_ratio_fp64_over_fp32() -> float:
    """Bytes per value, FP64 / FP32: 64 / 32 bits (IEEE 754-2019 binary64 and binary32; tutor.theory.formats)."""
    from tutor.theory.formats import format_by_name

    return format_by_name("fp64").storage_bits / format_by_name("fp32").storage_bits


def _fp64_cost(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    progress(0.0, "loading torch")
    import torch

    from tutor.bench.timing import time_case
    from tutor.theory.flops import matmul_flops

    size = params["size"]
    generator = torch.Generator().manual_seed(params["seed"])
    metrics: dict[str, float] = {}
    rows: list[Measurement] = []
    for index, (name, dtype) in enumerate((("fp32", torch.float32), ("fp64", torch.float64))):
        if cancel.is_set():
            return ProbeResult("fp64-cost", tuple(rows), metrics, "cancelled", True, "cpu")
        progress(index / 3, f"{name} matmul {size}x{size}")
        a = torch.randn(size, size, generator=generator).to(dtype)
        b = torch.randn(size, size, generator=generator).to(dtype)
        timing = time_case(functools.partial(torch.mm, a, b), budget_s=params["budget_s"] / 3, min_iters=3,
                           max_iters=50, cancel=cancel)
        metrics[f"tflops_{name}"] = matmul_flops(size, size, size) / timing.median_s / 1e12
        rows.append(Measurement(f"{name} matmul {size}x{size}x{size}", metrics[f"tflops_{name}"], "TFLOP/s",
                                note=f"median of {timing.iters}"))
    metrics["speedup_fp32_over_fp64"] = metrics["tflops_fp32"] / metrics["tflops_fp64"]
    rows.append(Measurement("FP32 speed over FP64, same size", metrics["speedup_fp32_over_fp64"], "x",
                            bytes_ratio_fp64_over_fp32(),
                            "half the bytes per value: twice the values per vector register and per byte moved",
                            "a GPU's FP64 units are a separate, smaller part of the chip: the datasheet ratio "
                            "there is set by silicon, not by bytes"))
    progress(2 / 3, "summing in fp32 and fp64")
    values = torch.rand(params["count"], generator=generator, dtype=torch.float64)
    exact = math.fsum(values.tolist())
    for name, dtype in (("fp32", torch.float32), ("fp64", torch.float64)):
        held = values.to(dtype)
        total = 0.0
        running = torch.zeros((), dtype=dtype)
        for chunk in held.split(4096):
            running = running + chunk.sum()  # torch's pairwise sum inside a chunk, running sum across
        total = float(running)
        metrics[f"sum_rel_error_{name}"] = abs(total - exact) / exact
        rows.append(Measurement(f"sum of {params['count']:,} values in {name}: relative error",
                                metrics[f"sum_rel_error_{name}"], "relative",
                                note="includes rounding the inputs to the format"))
    metrics["bytes_ratio"] = bytes_ratio_fp64_over_fp32()
    progress(1.0, "done")
    summary = (f"FP32 {format_quantity(metrics['speedup_fp32_over_fp64'], 'x')} faster than FP64 at {size}; "
               f"sum error FP32 {format_number(metrics['sum_rel_error_fp32'], digits=2)}, "
               f"FP64 {format_number(metrics['sum_rel_error_fp64'], digits=2)}")
    return ProbeResult(probe="fp64-cost", rows=tuple(rows), metrics=metrics, summary=summary, device="cpu")


FP64_COST = make_probe(
    name="fp64-cost",
    title="What FP64 costs",
    description="Times FP64 and FP32 matrix multiplies at the same size and sums many values in both, "
                "against an exact sum.",
    needs_torch=True,
    params=(
        Param("size", "int", 512, "square matrix size", minimum=16, maximum=4096),
        Param("count", "int", 1_000_000, "values summed", minimum=1000, maximum=50_000_000),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(3.0),
    ),
    metrics=("tflops_fp32", "tflops_fp64", "speedup_fp32_over_fp64", "sum_rel_error_fp32", "sum_rel_error_fp64",
             "bytes_ratio"),
    body=_fp64_cost,
)
