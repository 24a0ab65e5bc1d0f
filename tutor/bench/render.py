"""Rich tables of benchmark results: measured median and best beside the theoretical peak, the
percent of peak, and a short reason for the gap."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tutor.theory.units import human_bytes


def _rate(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value >= 0.01 else f"{value:.1e}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def render_results(results: Sequence[Any], header: dict[str, Any], console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    console.print(f"[bold]device[/bold] {header.get('device_under_test')}  torch {header.get('torch')}  "
                  f"threads {header.get('torch_threads')}  ISA {header.get('cpu_capability')}  "
                  f"budget {header.get('budget_s'):g} s, took {header.get('elapsed_s'):.1f} s")
    by_kind: dict[str, list[Any]] = {}
    for result in results:
        by_kind.setdefault(result.kind, []).append(result)

    if "matmul" in by_kind:
        table = Table(title="matmul TFLOP/s (2mnk / t): median = measured, best = burst")
        for column in ("dtype", "backend", "m x n x k", "median", "best", "peak", "% peak", "gap to peak"):
            table.add_column(column, justify="right" if column in ("median", "best", "peak", "% peak") else "left")
        for r in by_kind["matmul"]:
            mark = "" if r.headline else " (not best)"
            table.add_row(r.dtype, r.backend + mark, f"{r.m}x{r.n}x{r.k}", _rate(r.tflops_median),
                          _rate(r.tflops_best), _rate(r.peak_tflops), _percent(r.percent_of_peak),
                          "; ".join(r.notes) or ("peak unknown" if r.peak_tflops is None else ""))
        console.print(table)

    for kind, title in (("bandwidth", "STREAM-like bandwidth GB/s (bytes counted / t), fp64 arrays"),
                        ("transfer", "host <-> device GB/s, buffer counted once")):
        if kind not in by_kind:
            continue
        table = Table(title=title)
        for column in ("op", "array", "median", "best", "peak", "% peak", "counted", "gap to peak"):
            table.add_column(column, justify="right" if column in ("median", "best", "peak", "% peak") else "left")
        for r in by_kind[kind]:
            op = f"{r.op} ({r.memory})" if r.memory else r.op
            table.add_row(op, human_bytes(r.array_bytes), _rate(r.gbps_median), _rate(r.gbps_best),
                          _rate(r.peak_gbps), _percent(r.percent_of_peak), r.bytes_counting.split(":")[0],
                          "; ".join(r.notes) or ("peak unknown" if r.peak_gbps is None else ""))
        console.print(table)
        if kind == "bandwidth":
            console.print("bytes counted as STREAM does: copy/scale 2 arrays, add/triad 3, read/write 1; "
                          "write-allocate traffic not counted. % of peak uses the best iteration.")

    if "collective" in by_kind:
        table = Table(title="collectives GB/s: algbw = S / t, busbw = algbw x nccl-tests factor")
        for column in ("op", "backend", "ranks", "size", "algbw", "busbw", "state"):
            table.add_column(column, justify="right" if column in ("ranks", "size", "algbw", "busbw") else "left")
        for r in by_kind["collective"]:
            if r.state == "ok":
                state = f"ok, noisy: spread {r.spread:.0%}" if r.noisy and r.spread is not None else "ok"
            else:
                state = f"{r.state}: {r.message}"
            table.add_row(r.op, r.backend, str(r.ranks), human_bytes(r.bytes) if r.bytes else "-",
                          _rate(r.algbw_gbps), _rate(r.busbw_gbps), state)
        console.print(table)

    memory = header.get("memory") or {}
    parts = [f"process RSS {human_bytes(memory.get('process_rss_bytes') or 0)}"]
    for key, label in (("nvml_used_bytes", "NVML used"), ("torch_reserved_bytes", "torch reserved"),
                       ("torch_allocated_bytes", "torch allocated")):
        if memory.get(key) is not None:
            parts.append(f"{label} {human_bytes(memory[key])}")
    console.print("memory: " + ", ".join(parts))
