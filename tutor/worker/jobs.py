"""The jobs the measurement process runs besides probes: the Bench screen's quick suite and the
bits explorer's torch casts, and the plain results they return (picklable frozen dataclasses).

No Textual here: the worker process (tutor.worker) imports this module; tutor.ui.services
re-exports its names for the screens. torch is imported only inside the functions that measure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # tutor.bench's modules import torch; the types are only read by checkers
    from tutor.bench.bandwidth import BandwidthResult
    from tutor.bench.matmul import MatmulResult
    from tutor.bench.suite import Progress

# (fraction 0..1, message): the progress callback probes and the bench suite report through.
ProgressFn = Callable[[float, str], None]
# Float formats torch can store; the bits explorer confirms its theory against these casts.
TORCH_DTYPES = {
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8-e4m3": "float8_e4m3fn",
    "fp8-e5m2": "float8_e5m2",
}
BENCH_BUDGET_S = 18.0  # the app's Bench screen runs `bench --quick`'s suite
BENCH_DTYPES = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class BenchRow:
    """One measured figure of the Bench screen beside its theoretical peak."""

    label: str
    measured: float
    peak: float | None
    unit: str
    note: str = ""

    @property
    def fraction(self) -> float | None:
        """measured / peak when that is at most 1; None otherwise (unknown peak, or a wrong peak)."""
        if self.peak is None or self.peak <= 0 or self.measured > self.peak:
            return None
        return self.measured / self.peak


@dataclass(frozen=True)
class BenchOutcome:
    """What a Bench run produced: rows, failures, and whether it was cancelled."""

    rows: tuple[BenchRow, ...]
    cancelled: bool = False
    failures: tuple[str, ...] = ()
    device: str = "cpu"


def bench_rows(results: Sequence["MatmulResult | BandwidthResult"]) -> tuple[BenchRow, ...]:
    """Rows for the Bench screen from tutor.bench results (MatmulResult / BandwidthResult).

    Matmul rows show the headline backend of each dtype (median TFLOP/s); bandwidth rows the
    STREAM figure of merit (best GB/s), as `tensor-tutor bench` prints them.
    """
    rows: list[BenchRow] = []
    for result in results:
        kind = result.kind
        if kind == "matmul":
            if not result.headline:
                continue
            note = "; ".join((result.backend, *result.notes, *((result.peak_note,) if result.peak_note else ())))
            rows.append(BenchRow(f"matmul {result.dtype}", result.tflops_median, result.peak_tflops, "TFLOP/s",
                                 note))
        elif kind in ("bandwidth", "transfer"):
            label = f"{kind} {result.op}" + (f" {result.memory}" if result.memory else "")
            note = "; ".join(result.notes) if result.notes else ""
            rows.append(BenchRow(label, result.gbps_best, result.peak_gbps, "GB/s", note))
    return tuple(rows)


def run_bench_suite(progress: ProgressFn, cancel: threading.Event) -> BenchOutcome:
    """The quick suite of `tensor-tutor bench --quick` (fp32/bf16/fp16 matmul + bandwidth), saved
    to the results notebook like a CLI run. Imports torch (through tutor.bench) only when called."""
    from tutor.bench import suite
    from tutor.bench.environment import environment_header, load_machine, resolve_device
    from tutor.bench.matmul import parse_dtypes

    device = resolve_device(None)
    available = parse_dtypes(None, device)
    dtypes = parse_dtypes(",".join(d for d in BENCH_DTYPES if d in available), device)
    machine = load_machine()
    cases = suite.plan_suite(("matmul", "bandwidth"), device=device, machine=machine, dtypes=dtypes, quick=True)

    def report(event: "Progress") -> None:
        progress(event.fraction, f"{event.case}: {event.state}")

    outcome = suite.run_suite(cases, budget_s=BENCH_BUDGET_S, progress=report, cancel=cancel)
    from tutor.bench.notebook import append_run

    header = environment_header(machine, command="tensor-tutor app: Bench screen")
    header.update(device_under_test=device, budget_s=BENCH_BUDGET_S, cancelled=outcome.cancelled,
                  elapsed_s=round(outcome.elapsed_s, 3))
    warning = append_run(header, outcome.to_json())
    failures = outcome.failures + ((warning,) if warning else ())
    return BenchOutcome(bench_rows(outcome.results), outcome.cancelled, failures, device)


def torch_cast(value: str, formats: Sequence[str]) -> dict[str, float]:
    """Cast `value` to each torch float dtype in `formats` and back to float64: what the hardware
    stores. Formats torch has no dtype for (tf32, integers) are left out. Imports torch."""
    import torch

    source = torch.tensor([float(value)], dtype=torch.float64)
    cast: dict[str, float] = {}
    for name in formats:
        dtype_name = TORCH_DTYPES.get(name)
        dtype = getattr(torch, dtype_name, None) if dtype_name else None
        if dtype is None:
            continue
        # float64 -> float32 first, as a real model's values are float32 before a down-cast.
        stored = source.to(torch.float32).to(dtype) if name != "fp32" else source.to(torch.float32)
        cast[name] = float(stored.to(torch.float64).item())
    return cast
