"""The one record of a bench run, and the one figure each of its cases is shown by.

A `BenchRun` is what the results notebook stores for one `tensor-tutor bench` (or Bench screen) run:
a run id, the environment header (date, versions, machine, device, budget), the status ("complete" or
"cancelled") and every case's result as the JSON its measurement wrote. `CaseResult` reads one result
(matmul, bandwidth, transfer, collective) into typed fields: median, best, spread, iterations, size,
peak. `CaseResult.headline()` is the single statistic a case is shown by, everywhere: the command
line's history and `--compare`, the Bench screen's list, bars, gauges and table, and the CSV/JSON
export. It is the median, labelled with its count and size ("median of 9 at 1024²"):

- matmul: the median TFLOP/s of the shape the sweep settled on (tutor.bench.matmul: the best median
  among the shapes whose timing was stable), 2mnk / t;
- bandwidth and transfer: the median GB/s (STREAM reports the best iteration; the best is kept beside
  the median in the table, but a median is what two runs are compared by: one lucky iteration moves the
  best, not the median, and the app and the command line must show the same figure);
- collective: the bus bandwidth at the median time (nccl-tests doc/PERFORMANCE.md's busbw).

Old notebook lines (version 1: no run id, no status, results without iteration counts) read as well:
the status comes from the header's `cancelled`, the run id from the line's position, and a label
without a count or a size says only "median".

No torch here: the app and the notebook reader import this module.
"""

from __future__ import annotations

import datetime as _dt
import math
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

RECORD_VERSION = 2
Status = Literal["complete", "cancelled"]
COMPLETE: Status = "complete"
CANCELLED: Status = "cancelled"
HEADLINE_STATISTIC = "median"


def _number(value: Any) -> float | None:
    """A finite number from a JSON field, else None (a bool is not a number here)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def shape_text(m: Any, n: Any, k: Any) -> str:
    """'1024²' for a square m = n = k (as matmul benchmarks name their sizes), '768x1024x1024' otherwise."""
    if m == n == k and _count(m) is not None:
        return f"{m}²"
    return "x".join(str(dim) for dim in (m, n, k))


@dataclass(frozen=True)
class Headline:
    """The one figure a case is shown by: `value` in `unit`, the statistic it is, over how many
    iterations, at what size. `field` names the result's JSON field it was read from."""

    value: float
    unit: str
    statistic: str
    field: str
    iters: int | None = None
    size: str = ""

    @property
    def label(self) -> str:
        """'median of 9 at 1024²', 'median at 128 MiB per array', or just 'median' (an old record)."""
        text = self.statistic + (f" of {self.iters}" if self.iters else "")
        return f"{text} at {self.size}" if self.size else text

    def figure(self) -> str:
        """'131 GFLOP/s (median of 9 at 1024²)': the value rescaled (tutor.formatting) and its label."""
        from tutor.formatting import format_rate

        return f"{format_rate(self.value, self.unit)} ({self.label})"

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit, "statistic": self.statistic, "field": self.field,
                "iters": self.iters, "size": self.size, "label": self.label}


@dataclass(frozen=True)
class CaseResult:
    """One result of a run (one matmul dtype and backend, one bandwidth op, one collective at one size),
    read from its JSON. `data` keeps the JSON as stored; `key` is what makes two runs' results the same
    case (None for a result no figure is compared by)."""

    kind: str
    device: str
    name: str
    key: tuple[str, ...] | None
    unit: str
    median: float | None
    best: float | None
    spread: float | None
    iters: int | None
    size: str
    peak: float | None
    percent_of_peak: float | None
    notes: tuple[str, ...]
    primary: bool  # matmul: the best backend of its dtype, or the fixed-size case (the Bench screen shows these)
    fixed_size: bool  # the fixed-size fp32 matmul every run measures, so every two runs compare
    data: dict[str, Any] = field(repr=False, compare=False, default_factory=dict)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CaseResult:
        kind = str(data.get("kind", ""))
        device = str(data.get("device") or "")
        notes = tuple(str(note) for note in (data.get("notes") or ()) if note) if isinstance(
            data.get("notes"), (list, tuple)) else ()
        common: dict[str, Any] = {"kind": kind, "device": device, "iters": _count(data.get("iters")),
                  "spread": _number(data.get("spread")), "percent_of_peak": _number(data.get("percent_of_peak")),
                  "data": data}
        if kind == "matmul":
            fixed = data.get("fixed_size") is True
            size = shape_text(data.get("m"), data.get("n"), data.get("k")) if "m" in data else ""
            key: tuple[str, ...] = ("matmul", device, str(data.get("dtype")), str(data.get("backend")))
            name = f"matmul {data.get('dtype')}"
            if fixed:
                key += (f"fixed {size}",)
                name += f" {size}"
            backend = str(data.get("backend") or "")
            extra = (backend, *notes, *((str(data["peak_note"]),) if data.get("peak_note") else ()))
            return cls(name=name, key=key, unit="TFLOP/s", median=_number(data.get("tflops_median")),
                       best=_number(data.get("tflops_best")), size=size, peak=_number(data.get("peak_tflops")),
                       notes=tuple(note for note in extra if note),
                       primary=fixed or data.get("headline", True) is not False,
                       fixed_size=fixed, **common)
        if kind in ("bandwidth", "transfer"):
            memory = str(data.get("memory") or "")
            size = _size_words(data)
            return cls(name=f"{kind} {data.get('op')}" + (f" {memory}" if memory else ""),
                       key=(kind, device, str(data.get("op")), memory), unit="GB/s",
                       median=_number(data.get("gbps_median")), best=_number(data.get("gbps_best")), size=size,
                       peak=_number(data.get("peak_gbps")), notes=notes, primary=True, fixed_size=False, **common)
        if kind == "collective":
            busbw = _number(data.get("busbw_gbps"))
            median_s, best_s = _number(data.get("time_median_s")), _number(data.get("time_best_s"))
            best = busbw * median_s / best_s if busbw is not None and median_s and best_s else None
            backend = str(data.get("backend") or "")
            return cls(name=f"{data.get('op')} {data.get('ranks')} ranks",
                       key=("collective", str(data.get("op")), backend, str(data.get("ranks")),
                            str(data.get("bytes"))),
                       unit="GB/s", median=busbw, best=best, size=_size_words(data), peak=None,
                       notes=(f"bus bandwidth, {backend}",) + notes, primary=True, fixed_size=False, **common)
        return cls(name=kind or "?", key=None, unit="", median=None, best=None, size="", peak=None, notes=notes,
                   primary=False, fixed_size=False, **common)

    def headline(self) -> Headline | None:
        """The case's one figure (the median, labelled); None when it measured nothing (a failed or
        cancelled collective, a zero)."""
        if self.median is None or self.median <= 0:
            return None
        statistic = "bus bandwidth at the median" if self.kind == "collective" else HEADLINE_STATISTIC
        figure_field = {"matmul": "tflops_median", "collective": "busbw_gbps"}.get(self.kind, "gbps_median")
        return Headline(self.median, self.unit, statistic, figure_field, self.iters, self.size)


def _size_words(data: dict[str, Any]) -> str:
    """'128 MiB per array' (bandwidth), '16 MiB' (a transfer or a collective's buffer), '' when unknown."""
    size = data.get("array_bytes") or data.get("bytes")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return ""
    from tutor.formatting import format_bytes

    return format_bytes(size) + (" per array" if data.get("array_bytes") else "")


@dataclass(frozen=True)
class RunFigure:
    """One figure of a run's one-line summary: 'fp32' with its case and headline."""

    name: str  # 'fp32', 'triad', 'all_reduce busbw'
    case: CaseResult
    headline: Headline

    @property
    def legacy_label(self) -> str:
        """The key `bench history --json` has always used: 'fp32 TFLOP/s', 'triad GB/s'."""
        return f"{self.name} {self.headline.unit}"

    def text(self) -> str:
        """'fp32 131 GFLOP/s (median of 9 at 1024²)'."""
        return f"{self.name} {self.headline.figure()}"


@dataclass(frozen=True)
class BenchRun:
    """One stored bench run: its position in the notebook (1-based), header and results (as JSON).

    `run_id` and `status` are stored since record version 2; older lines derive them."""

    number: int
    header: dict[str, Any]
    results: tuple[dict[str, Any], ...]
    run_id: str = ""
    stored_status: str = ""

    @property
    def date(self) -> str:
        return str(self.header.get("date", "?"))

    @property
    def status(self) -> Status:
        if self.stored_status in (COMPLETE, CANCELLED):
            return self.stored_status
        return CANCELLED if self.header.get("cancelled") is True else COMPLETE

    @property
    def cancelled(self) -> bool:
        """True when the run was stopped (Ctrl-C, a signal, Esc) before its budget was spent."""
        return self.status == CANCELLED

    @property
    def id(self) -> str:
        return self.run_id or f"notebook-line-{self.number}"

    @property
    def device(self) -> str:
        devices = sorted({str(r.get("device")) for r in self.results if r.get("device")})
        return ",".join(devices) or "?"

    @property
    def cases(self) -> tuple[CaseResult, ...]:
        return tuple(CaseResult.from_json(result) for result in self.results)

    def figures(self) -> list[RunFigure]:
        """The run in a few figures (history, the Bench screen's list): each matmul dtype's swept
        headline (its best backend), triad, and all_reduce at its largest measured size."""
        chosen: dict[str, tuple[CaseResult, Headline]] = {}
        sizes: dict[str, int] = {}
        for case in self.cases:
            headline = case.headline()
            if headline is None:
                continue
            if case.kind == "matmul" and case.primary and not case.fixed_size:
                name = str(case.data.get("dtype"))
                chosen.setdefault(name, (case, headline))
            elif case.kind == "bandwidth" and case.data.get("op") == "triad":
                chosen.setdefault("triad", (case, headline))
            elif case.kind == "collective" and case.data.get("op") == "all_reduce":
                size = _count(case.data.get("bytes")) or 0
                if size >= sizes.get("all_reduce busbw", -1):
                    sizes["all_reduce busbw"] = size
                    chosen["all_reduce busbw"] = (case, headline)
        return [RunFigure(name, case, headline) for name, (case, headline) in chosen.items()]

    def to_json(self) -> dict[str, Any]:
        """The notebook line of this run (tutor.bench.notebook writes it)."""
        return {"notebook_version": RECORD_VERSION, "run_id": self.id, "status": self.status,
                "header": self.header, "results": list(self.results)}


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def run_record(header: dict[str, Any], results: Iterable[dict[str, Any]], *, cancelled: bool,
               run_id: str | None = None) -> BenchRun:
    """A new run's record (number 0: not yet in the notebook). The header says `cancelled` too, as
    version-1 readers expect."""
    status = CANCELLED if cancelled else COMPLETE
    return BenchRun(number=0, header={**header, "cancelled": cancelled}, results=tuple(results),
                    run_id=run_id or new_run_id(), stored_status=status)


def suite_run_record(outcome: Any, *, machine: Any, device: str, command: str, budget_s: float,
                     cancelled: bool, memory: dict[str, Any] | None = None, failures: Sequence[str] = ()) -> BenchRun:
    """The record of a finished (or stopped) suite, as the command line and the app's worker save it:
    the environment header (tutor.bench.environment), device, budget, time taken, and the results."""
    from tutor.bench.environment import environment_header

    header = environment_header(machine, command=command)
    if memory is not None:
        header["memory"] = memory
    header.update(device_under_test=device, budget_s=budget_s, elapsed_s=round(outcome.elapsed_s, 3))
    if failures:
        header["failures"] = list(failures)
    return run_record(header, outcome.to_json(), cancelled=cancelled or outcome.cancelled)
