"""The jobs the measurement process runs besides probes: the Bench screen's quick suite and the
bits explorer's torch casts, and the plain results they return (picklable frozen dataclasses).

No Textual here: the worker process (tutor.worker) imports this module; tutor.ui.services
re-exports its names for the screens. torch is imported only inside the functions that measure.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # tutor.bench's modules import torch; the types are only read by checkers
    from tutor.bench.bandwidth import BandwidthResult
    from tutor.bench.matmul import MatmulResult
    from tutor.bench.record import CaseResult
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
    """One measured figure of the Bench screen beside its theoretical peak: a case's headline
    (tutor.bench.record.CaseResult.headline), `statistic` saying which ("median of 9 at 1024²")."""

    label: str
    measured: float
    peak: float | None
    unit: str
    note: str = ""
    statistic: str = ""

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


def bench_rows(results: Sequence["CaseResult | MatmulResult | BandwidthResult | Any"]) -> tuple[BenchRow, ...]:
    """The Bench screen's rows (bars, gauges, table), for a live run or a stored one: each case's
    headline (CaseResult.headline, the median; the same figure `bench history` and `--compare` show),
    matmul only for the best backend of each dtype. Takes CaseResults or tutor.bench result objects."""
    from tutor.bench.record import CaseResult

    rows: list[BenchRow] = []
    for result in results:
        case = result if isinstance(result, CaseResult) else CaseResult.from_json(result.to_json())
        headline = case.headline()
        if headline is None or (case.kind == "matmul" and not case.primary):
            continue
        rows.append(BenchRow(case.name, headline.value, case.peak, headline.unit, "; ".join(case.notes),
                             headline.label))
    return tuple(rows)


def run_bench_suite(progress: ProgressFn, cancel: threading.Event) -> BenchOutcome:
    """The quick suite of `tensor-tutor bench --quick` (fp32/bf16/fp16 matmul + bandwidth), saved
    to the results notebook as the same record a CLI run saves (tutor.bench.record.suite_run_record).
    Imports torch (through tutor.bench) only when called."""
    from tutor.bench import suite
    from tutor.bench.environment import load_machine, resolve_device
    from tutor.bench.matmul import parse_dtypes
    from tutor.bench.notebook import append_run
    from tutor.bench.record import suite_run_record

    device = resolve_device(None)
    available = parse_dtypes(None, device)
    dtypes = parse_dtypes(",".join(d for d in BENCH_DTYPES if d in available), device)
    machine = load_machine()
    cases = suite.plan_suite(("matmul", "bandwidth"), device=device, machine=machine, dtypes=dtypes, quick=True)

    def report(event: "Progress") -> None:
        progress(event.fraction, f"{event.case}: {event.state}")

    outcome = suite.run_suite(cases, budget_s=BENCH_BUDGET_S, progress=report, cancel=cancel)
    from tutor.bench.memory import memory_accounting

    record = suite_run_record(outcome, machine=machine, device=device, command="tensor-tutor app: Bench screen",
                              budget_s=BENCH_BUDGET_S, cancelled=outcome.cancelled,
                              memory=memory_accounting(device).to_json(), failures=outcome.failures)
    warning = append_run(record)
    failures = outcome.failures + ((warning,) if warning else ())
    return BenchOutcome(bench_rows(record.cases), record.cancelled, failures, device)


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
