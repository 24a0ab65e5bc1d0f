"""collective: all_reduce / all_gather / reduce_scatter between local ranks, as nccl-tests reports.

Calls tutor.bench.collective (spawned processes, gloo on CPU tensors, NCCL when there is a GPU per
rank); algbw = bytes / time, busbw = algbw x the factor of tutor.theory.parallel.bus_bandwidth_factor.
Starting the ranks (each imports torch) takes a few seconds on top of budget_s.
"""

from __future__ import annotations

import threading

from tutor.formatting import format_bytes, format_rate
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")
BACKENDS = ("auto", "gloo", "nccl")


def _check_machine(params: dict) -> None:
    """Every rank holds the largest case's buffers (tutor.labs.limits.collective_buffer_bytes) on
    top of its own interpreter with torch loaded, which this process measures (its resident
    memory after importing torch): x ranks, against this machine's memory."""
    import psutil
    import torch  # noqa: F401  (the ranks' baseline is an interpreter with torch loaded)

    from tutor.labs.limits import check_lab_fits, collective_buffer_bytes

    ranks, largest = params["ranks"], max(params["sizes"])
    buffers = collective_buffer_bytes(largest, ranks)
    runtime = psutil.Process().memory_info().rss
    check_lab_fits("collective", memory_bytes=ranks * (buffers + runtime),
                   memory_what=f"{ranks} ranks x ({format_bytes(buffers)} of buffers + {format_bytes(runtime)} "
                               f"for Python and torch)",
                   fix="lower ranks or sizes")


def _collective(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    if cancel.is_set():
        return ProbeResult("collective", (), {}, "cancelled before the ranks started", True, "cpu")
    _check_machine(params)
    progress(0.0, f"starting {params['ranks']} ranks")
    from tutor.bench.collective import collective_bandwidth
    from tutor.theory.parallel import bus_bandwidth_factor

    ranks = params["ranks"]
    backend = None if params["backend"] == "auto" else params["backend"]
    results = collective_bandwidth(ranks=ranks, budget_s=params["budget_s"], ops=params["ops"],
                                   sizes=params["sizes"], backend=backend, cancel=cancel)
    rows: list[Measurement] = []
    metrics: dict[str, float] = {}
    largest: dict[str, int] = {}
    for result in results:
        size = format_bytes(result.bytes) if result.bytes else "-"
        if result.state != "ok" or result.algbw_gbps is None:
            rows.append(Measurement(f"{result.op} {size}", None, "GB/s", note=f"{result.state}: {result.message}"))
            continue
        factor = bus_bandwidth_factor(result.op, ranks)
        rows.append(Measurement(f"{result.op} {size}: algbw", result.algbw_gbps, "GB/s",
                                note=f"{result.backend}, {ranks} ranks, median of {result.iters}"))
        rows.append(Measurement(f"{result.op} {size}: busbw", result.busbw_gbps, "GB/s",
                                theory=None, theory_source=f"algbw x {factor} (nccl-tests PERFORMANCE.md)",
                                note=result.message))
        if result.bytes >= largest.get(result.op, 0):
            largest[result.op] = result.bytes
            metrics[f"algbw_{result.op}"] = result.algbw_gbps
            metrics[f"busbw_{result.op}"] = float(result.busbw_gbps or 0.0)
            metrics[f"busbw_factor_{result.op}"] = float(factor)
    device = results[0].device if results else "cpu"
    cancelled = cancel.is_set() or any(result.state == "cancelled" for result in results)
    progress(1.0, "done")
    summary = ", ".join(f"{op} busbw {format_rate(metrics[f'busbw_{op}'], 'GB/s')}" for op in largest) or (
        rows[0].note if rows else "nothing measured")
    return ProbeResult(probe="collective", rows=tuple(rows), metrics=metrics,
                       summary=f"{summary} ({ranks} local ranks)", cancelled=cancelled, device=device)


COLLECTIVE = make_probe(
    name="collective",
    title="Collective communication",
    description="Runs all_reduce, all_gather and reduce_scatter between local processes with "
                "torch.distributed and reports algorithm and bus bandwidth as nccl-tests defines them.",
    needs_torch=True,
    params=(
        Param("ranks", "int", 2, "local processes", minimum=2, maximum=16),
        Param("sizes", "size-list", ["1MiB"], "buffer sizes", minimum=64, maximum=2**30),
        Param("ops", "str-list", list(COLLECTIVE_OPS), "collectives", choices=COLLECTIVE_OPS),
        Param("backend", "str", "auto", "auto: nccl with a GPU per rank, else gloo", choices=BACKENDS),
        budget_param(3.0, "seconds of measurement after the ranks start"),
    ),
    metrics=tuple(f"{kind}_{op}" for op in COLLECTIVE_OPS for kind in ("algbw", "busbw", "busbw_factor")),
    body=_collective,
    metrics_of=lambda p: tuple(f"{kind}_{op}" for op in p["ops"] for kind in ("algbw", "busbw", "busbw_factor")),
)
