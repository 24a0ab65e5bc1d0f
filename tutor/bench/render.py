"""Rich tables of benchmark results: measured median and best beside the theoretical peak, the
percent of peak, and a short reason for the gap."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

from tutor.formatting import format_bytes, format_duration, format_quantity, format_rate


def _rate(value: float | None, unit: str) -> str:
    """A measured or peak rate in `unit` (TFLOP/s, GB/s), rescaled: 0.0074 TFLOP/s -> '7.4 GFLOP/s'."""
    return "-" if value is None else format_rate(value, unit)


def _percent(value: float | None) -> str:
    """A percentage already in percent (85.9 -> '85.9%')."""
    return "-" if value is None else format_quantity(value, "%")


def _column_options(column: str, whole: tuple[str, ...]) -> dict[str, Any]:
    """Rich column options at any width: the `whole` columns never wrap; the others wrap at spaces
    (a figure may put its unit on the next line) and fold a word longer than the column instead of cutting it."""
    return {"no_wrap": True} if column in whole else {"overflow": "fold"}


NOTES_IN_TABLE_MIN_WIDTH = 120
"""Below this many columns the notes leave the table for numbered lines under it: in a narrow
column they would stretch every row to dozens of lines."""


class _Notes:
    """The 'gap to peak' notes of one table: in the table on a wide console, else numbered below it."""

    def __init__(self, console: Console) -> None:
        self.below = console.width < NOTES_IN_TABLE_MIN_WIDTH
        self.lines: list[str] = []

    def cell(self, text: str) -> str:
        if not self.below or not text:
            return text
        self.lines.append(text)
        return f"note {len(self.lines)}"

    def print(self, console: Console) -> None:
        from tutor.safe_text import markup_escape as escape

        for number, text in enumerate(self.lines, 1):
            console.print(f"  note {number}: {escape(text)}")


def render_results(results: Sequence[Any], header: dict[str, Any], console: Console | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    console.print(f"[bold]device[/bold] {header.get('device_under_test')}  torch {header.get('torch')}  "
                  f"threads {header.get('torch_threads')}  ISA {header.get('cpu_capability')}  "
                  f"budget {format_duration(header.get('budget_s'))}, took {format_duration(header.get('elapsed_s'))}")
    by_kind: dict[str, list[Any]] = {}
    for result in results:
        by_kind.setdefault(result.kind, []).append(result)

    if "matmul" in by_kind:
        table = Table(title="matmul FLOP/s (2mnk / t): median = measured, best = burst", title_justify="left")
        notes = _Notes(console)
        columns: tuple[str, ...] = ("dtype", "backend", "m x n x k", "median", "best", "peak", "% peak", "gap to peak")
        if notes.below:  # narrow: the peak per dtype goes under the table with the notes
            columns = tuple(column for column in columns if column != "peak")
        for column in columns:
            table.add_column(column, justify="right" if column in ("median", "best", "peak", "% peak") else "left",
                             **_column_options(column, ("dtype", "m x n x k", "% peak")))
        peaks: dict[str, str] = {}
        for r in by_kind["matmul"]:
            mark = " (fixed size)" if r.fixed_size else "" if r.headline else " (not best)"
            peaks[r.dtype] = _rate(r.peak_tflops, "TFLOP/s") if r.peak_tflops is not None else "unknown"
            cells = [r.dtype, r.backend + mark, f"{r.m}x{r.n}x{r.k}", _rate(r.tflops_median, "TFLOP/s"),
                     _rate(r.tflops_best, "TFLOP/s"), _rate(r.peak_tflops, "TFLOP/s"), _percent(r.percent_of_peak),
                     notes.cell("; ".join(r.notes) or ("peak unknown" if r.peak_tflops is None else ""))]
            table.add_row(*(cell for column, cell in zip(("dtype", "backend", "m x n x k", "median", "best", "peak",
                                                          "% peak", "gap to peak"), cells) if column in columns))
        console.print(table)
        if notes.below:
            console.print("  peak: " + ", ".join(f"{dtype} {peak}" for dtype, peak in peaks.items()))
        notes.print(console)

    from tutor.safe_text import markup_escape as escape

    if "decode_matmul" in by_kind:
        sides = sorted({r.n for r in by_kind["decode_matmul"]})
        table = Table(title="decode matmul: x·Wᵀ with m rows (the batch) on square weights, rotated past the caches",
                      title_justify="left")
        for column in ("dtype", "m", *(f"{side}²" for side in sides)):
            table.add_column(column, justify="left" if column == "dtype" else "right")
        for dtype, m in dict.fromkeys((r.dtype, r.m) for r in by_kind["decode_matmul"]):
            rates = {r.n: r.gbps_median for r in by_kind["decode_matmul"] if r.dtype == dtype and r.m == m}
            table.add_row(dtype, str(m), *(_rate(rates[side], "GB/s") if side in rates else "-" for side in sides))
        console.print(table)
    for r in by_kind.get("launch", ()):
        graph = format_duration(r.graph_kernel_s) if r.graph_kernel_s is not None else f"not measured ({escape(r.note)})"
        console.print(f"kernel launch on {r.device}: eager {format_duration(r.eager_launch_s)} per tiny kernel "
                      f"(host), CUDA graph replay {graph} per kernel ({r.kernels} kernels)")

    if "elementwise" in by_kind:
        console.print("elementwise functions in the caches, elements/s: " + ", ".join(
            f"{escape(r.function)} {r.elements_per_s / 1e9:.3g} G" for r in by_kind["elementwise"]))
    for r in by_kind.get("first_touch", ()):
        console.print(f"first touch of freshly mapped memory on {r.device}: {_rate(r.gbps_median, 'GB/s')} beyond the "
                      "write itself (page faults and zeroing)")
    for kind, title in (("bandwidth", "STREAM-like bandwidth (bytes counted / t), fp64 arrays"),
                        ("transfer", "host <-> device bandwidth, buffer counted once")):
        if kind not in by_kind:
            continue
        table = Table(title=title, title_justify="left")
        for column in ("op", "array", "median", "best", "peak", "% peak", "counted", "gap to peak"):
            table.add_column(column, justify="right" if column in ("median", "best", "peak", "% peak") else "left",
                             **_column_options(column, ("op", "array", "% peak")))
        for r in by_kind[kind]:
            op = f"{r.op} ({r.memory})" if r.memory else r.op
            table.add_row(op, format_bytes(r.array_bytes), _rate(r.gbps_median, "GB/s"), _rate(r.gbps_best, "GB/s"),
                          _rate(r.peak_gbps, "GB/s"), _percent(r.percent_of_peak), r.bytes_counting.split(":")[0],
                          "; ".join(r.notes) or ("peak unknown" if r.peak_gbps is None else ""))
        console.print(table)
        if kind == "bandwidth":
            console.print("bytes counted as STREAM does: copy/scale 2 arrays, add/triad 3, read/write 1; "
                          "write-allocate traffic not counted. % of peak uses the best iteration.")

    if "collective" in by_kind:
        table = Table(title="collectives: algbw = S / t, busbw = algbw x nccl-tests factor", title_justify="left")
        for column in ("op", "backend", "ranks", "size", "algbw", "busbw", "state"):
            table.add_column(column, justify="right" if column in ("ranks", "size", "algbw", "busbw") else "left",
                             **_column_options(column, ("ranks",)))
        for r in by_kind["collective"]:
            if r.state == "ok":
                state = f"ok, noisy: spread {format_quantity(r.spread * 100, '%')}" if r.noisy and r.spread is not None else "ok"
            else:
                state = f"{r.state}: {r.message}"
            table.add_row(r.op, r.backend, str(r.ranks), format_bytes(r.bytes) if r.bytes else "-",
                          _rate(r.algbw_gbps, "GB/s"), _rate(r.busbw_gbps, "GB/s"), state)
        console.print(table)

    memory = header.get("memory") or {}
    parts = [f"process RSS {format_bytes(memory.get('process_rss_bytes') or 0)}"]
    for key, label in (("nvml_used_bytes", "NVML used"), ("torch_reserved_bytes", "torch reserved"),
                       ("torch_allocated_bytes", "torch allocated")):
        if memory.get(key) is not None:
            parts.append(f"{label} {format_bytes(memory[key])}")
    console.print("memory: " + ", ".join(parts))
