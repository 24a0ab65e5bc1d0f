"""The results notebook: one JSON line per benchmark run in the user data dir.

Each line is {"notebook_version", "header": {...environment...}, "results": [...]}; lines are
appended whole with one os.write on an O_APPEND descriptor and fsync'd, so concurrent runs never
interleave and a crash leaves at most one torn last line. Reading skips lines that do not parse
and counts them. A notebook that cannot be written costs a warning, never the run.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NOTEBOOK_FILE = "results.jsonl"
NOTEBOOK_VERSION = 1
DATA_DIR_ENV = "TENSOR_TUTOR_DATA_DIR"


def notebook_path() -> Path:
    """$TENSOR_TUTOR_DATA_DIR/results.jsonl, else platformdirs' user data dir for tensor-tutor."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return Path(override) / NOTEBOOK_FILE
    import platformdirs

    return Path(platformdirs.user_data_dir("tensor-tutor")) / NOTEBOOK_FILE


def append_run(header: dict[str, Any], results: Sequence[dict[str, Any]], path: Path | None = None) -> str | None:
    """Append one run as one line. Returns None on success, else a one-line warning."""
    target = path or notebook_path()
    record = {"notebook_version": NOTEBOOK_VERSION, "header": header, "results": list(results)}
    try:
        line = (json.dumps(record, separators=(",", ":"), allow_nan=False, default=str) + "\n").encode()
    except ValueError as error:
        return f"results not saved: {error}"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            written = os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as error:
        return f"results not saved to {target}: {error.strerror or error}"
    if written != len(line):
        return f"results only partly saved to {target} ({written} of {len(line)} bytes)"
    return None


@dataclass(frozen=True)
class Run:
    """One stored run: its position in the notebook (1-based), header and results."""

    number: int
    header: dict[str, Any]
    results: tuple[dict[str, Any], ...]

    @property
    def date(self) -> str:
        return str(self.header.get("date", "?"))

    @property
    def device(self) -> str:
        devices = sorted({str(r.get("device")) for r in self.results if r.get("device")})
        return ",".join(devices) or "?"


@dataclass(frozen=True)
class Notebook:
    runs: tuple[Run, ...]
    corrupt_lines: int
    warning: str = ""  # "" when the file read cleanly (or does not exist yet)


def read_notebook(path: Path | None = None) -> Notebook:
    """Every run that parses; lines that do not are counted in `corrupt_lines`."""
    target = path or notebook_path()
    try:
        text = target.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return Notebook(runs=(), corrupt_lines=0)
    except OSError as error:
        return Notebook(runs=(), corrupt_lines=0, warning=f"cannot read {target}: {error.strerror or error}")
    runs: list[Run] = []
    corrupt = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            corrupt += 1
            continue
        if not (isinstance(record, dict) and isinstance(record.get("header"), dict)
                and isinstance(record.get("results"), list)
                and all(isinstance(r, dict) for r in record["results"])):
            corrupt += 1
            continue
        runs.append(Run(number=len(runs) + 1, header=record["header"], results=tuple(record["results"])))
    warning = f"skipped {corrupt} corrupt line(s) in {target}" if corrupt else ""
    return Notebook(runs=tuple(runs), corrupt_lines=corrupt, warning=warning)


def case_key(result: dict[str, Any]) -> tuple[str, ...] | None:
    """What makes two results the same case across runs; None for results without a figure."""
    kind = result.get("kind")
    if kind == "matmul":
        return ("matmul", str(result.get("device")), str(result.get("dtype")), str(result.get("backend")))
    if kind in ("bandwidth", "transfer"):
        return (kind, str(result.get("device")), str(result.get("op")), str(result.get("memory", "")))
    if kind == "collective":
        return ("collective", str(result.get("op")), str(result.get("backend")), str(result.get("ranks")),
                str(result.get("bytes")))
    return None


def headline_value(result: dict[str, Any]) -> tuple[str, float] | None:
    """The figure a case is compared by: matmul median TFLOP/s, bandwidth median GB/s, busbw."""
    field = {"matmul": "tflops_median", "bandwidth": "gbps_median", "transfer": "gbps_median",
             "collective": "busbw_gbps"}.get(str(result.get("kind")))
    value = result.get(field) if field else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
        return field, float(value)
    return None


def case_label(key: tuple[str, ...]) -> str:
    return " ".join(part for part in key if part)


@dataclass(frozen=True)
class CaseComparison:
    """One case present in both runs: `after / before` of its headline figure."""

    case: str
    figure: str
    before: float
    after: float
    ratio: float


def compare_runs(before: Run, after: Run) -> list[CaseComparison]:
    """Ratios after/before for every case both runs measured (matching by case_key)."""
    def figures(run: Run) -> dict[tuple[str, ...], tuple[str, float]]:
        table = {}
        for result in run.results:
            key, value = case_key(result), headline_value(result)
            if key is not None and value is not None:
                table[key] = value
        return table

    old, new = figures(before), figures(after)
    return [CaseComparison(case=case_label(key), figure=old[key][0], before=old[key][1], after=new[key][1],
                           ratio=new[key][1] / old[key][1])
            for key in old if key in new]


def run_headlines(run: Run) -> dict[str, float]:
    """Short figures for a history listing: best matmul TFLOP/s per dtype, triad GB/s, busbw."""
    headlines: dict[str, float] = {}
    for result in run.results:
        value = headline_value(result)
        if value is None:
            continue
        kind = result.get("kind")
        if kind == "matmul":
            label = f"{result.get('dtype')} TFLOP/s"
        elif kind == "bandwidth" and result.get("op") == "triad":
            label = "triad GB/s"
        elif kind == "collective" and result.get("op") == "all_reduce":
            label = "all_reduce busbw GB/s"
        else:
            continue
        headlines[label] = max(headlines.get(label, 0.0), value[1])
    return headlines
