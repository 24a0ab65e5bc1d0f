"""Export a result as JSON, CSV or Markdown: pure functions from a result to text, and one that saves it.

A result is what a screen shows: a lab's ProbeResult (a lesson's measure block), a Bench run (a
notebook Run, or a BenchOutcome that could not be saved), or the Fit screen's form (FitValues).
JSON is the same JSON the command line prints (`lab NAME --json`, `bench --json`, `fit --json`);
CSV has one row per measurement (per memory component for a fit), numbers in plain digits;
Markdown is a table with the numbers as the app shows them. No Textual here: the app's Export
command (tutor.ui.commands) calls it. Pictures (tutor.plots Charts) are saved as one SVG with their
data as CSV and JSON beside it (`save_picture_files`, the app's Ctrl+S).
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tutor.formatting import format_bytes, format_quantity

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tutor.hardware.machine import Machine
    from tutor.plots import Chart

FORMATS = {"json": "json", "csv": "csv", "markdown": "md"}
"""Export format -> file extension."""
EXPORTS_FOLDER = "exports"


@dataclass(frozen=True)
class FitValues:
    """The Fit screen's fields (calculator values) and the machine they are checked against."""

    values: dict[str, Any]
    machine: Machine


@dataclass(frozen=True)
class Table:
    """A result reduced to what every format needs: a name, its JSON, and rows of (column -> value)."""

    name: str
    title: str
    data: dict[str, Any]
    columns: tuple[str, ...]
    rows: tuple[dict[str, Any], ...]
    units: dict[str, str]
    """Unit of each numeric column, for the Markdown table ("B" for bytes)."""


# ---- each kind of result as a Table ---------------------------------------------------------------

def probe_table(result: Any) -> Table:
    """A lab's ProbeResult: `lab NAME --json`'s object; one row per measurement."""
    columns = ("label", "measured", "theory", "unit", "percent_of_theory", "theory_source", "note")
    rows = tuple({"label": row.label, "measured": row.measured, "theory": row.theory, "unit": row.unit,
                  "percent_of_theory": row.percent_of_theory, "theory_source": row.theory_source, "note": row.note}
                 for row in result.rows)
    title = f"lab {result.probe} on {result.device}" + (" (cancelled)" if result.cancelled else "")
    return Table(f"lab-{result.probe}", title, result.to_json(), columns, rows, {"percent_of_theory": "%"})


def run_table(run: Any) -> Table:
    """A stored bench run: `bench --json`'s object ({"device": header, "results": [...]}); one row per
    result with its headline (tutor.bench.record: the figure `bench history` and the Bench screen show)."""
    from tutor.bench.notebook import case_label, case_size

    rows = []
    for case in run.cases:
        headline = case.headline()
        if case.key is None or headline is None:
            continue
        rows.append({"run": run.number, "date": run.date, "device": case.device, "case": case_label(case.key),
                     "size": case_size(case.data), "figure": headline.field, "statistic": headline.label,
                     "value": headline.value, "unit": headline.unit, "peak": case.peak,
                     "percent_of_peak": case.percent_of_peak, "noisy": case.data.get("noisy")})
    title = f"bench run {run.number}, {run.date}, {run.device}" + (" (cancelled)" if run.cancelled else "")
    columns = ("run", "date", "device", "case", "size", "figure", "statistic", "value", "unit", "peak",
               "percent_of_peak", "noisy")
    return Table(f"bench-run-{run.number}", title, {"device": run.header, "results": list(run.results)}, columns,
                 tuple(rows), {"percent_of_peak": "%"})


def outcome_table(outcome: Any) -> Table:
    """A Bench outcome that is not in the notebook (its save failed): the screen's rows."""
    rows = tuple({"label": row.label, "measured": row.measured, "peak": row.peak, "unit": row.unit, "note": row.note}
                 for row in outcome.rows)
    data = {"device": outcome.device, "cancelled": outcome.cancelled, "failures": list(outcome.failures),
            "rows": [dict(row) for row in rows]}
    return Table("bench", f"bench on {outcome.device}", data, ("label", "measured", "peak", "unit", "note"), rows, {})


def fit_report(values: dict[str, Any], machine: Machine) -> dict[str, Any]:
    """`tensor-tutor fit --json`'s report for the calculator's values (tutor.fit_answer, the command's own answer)."""
    from tutor.fit_answer import FitInputs, answer_fit

    return answer_fit(FitInputs.from_values(values, machine)).to_json()


def fit_table(fit: FitValues) -> Table:
    """The Fit screen: the report as `fit --json` prints it; one row per memory component."""
    report = fit_report(fit.values, fit.machine)
    at_peak = report["peak"]["per_category_bytes"]
    rows = tuple({"component": c["name"], "bytes": c["bytes"], "at_peak_bytes": at_peak.get(c["name"]),
                  "formula": c["formula"]} for c in report["components"])
    rows += ({"component": "total", "bytes": report["per_device_bytes"]["total"], "at_peak_bytes": None,
              "formula": "what must fit"},)
    device = (report.get("device") or {}).get("name", "")
    title = f"fit {report['model']['name']} ({report['mode']}) on {device}"
    return Table(f"fit-{values_name(fit.values)}", title, report, ("component", "bytes", "at_peak_bytes", "formula"),
                 rows, {"bytes": "B", "at_peak_bytes": "B"})


def values_name(values: dict[str, Any]) -> str:
    return f"{values.get('model', 'model')}-{values.get('mode', 'inference')}"


def as_table(result: Any) -> Table:
    """The Table of any exportable result; TypeError for anything else."""
    from tutor.bench.notebook import Run
    from tutor.labs import ProbeResult
    from tutor.worker.jobs import BenchOutcome

    if isinstance(result, ProbeResult):
        return probe_table(result)
    if isinstance(result, Run):
        return run_table(result)
    if isinstance(result, BenchOutcome):
        return outcome_table(result)
    if isinstance(result, FitValues):
        return fit_table(result)
    raise TypeError(f"cannot export a {type(result).__name__}")


# ---- formats ----------------------------------------------------------------------------------------

def to_json(result: Any) -> str:
    """The JSON the command line prints for this result."""
    return json.dumps(as_table(result).data, indent=2, default=str) + "\n"


def plain_number(value: Any) -> str:
    """A number for a spreadsheet: every digit, never scientific notation ('0.0000012', not '1.2e-06')."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(Decimal(repr(value)), "f") if value == value and abs(value) != float("inf") else ""
    if value is None:
        return ""
    return str(value)


def to_csv(result: Any) -> str:
    """One row per measurement, a header row first."""
    table = as_table(result)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(table.columns)
    for row in table.rows:
        writer.writerow(plain_number(row.get(column)) for column in table.columns)
    return buffer.getvalue()


def _cell(value: Any, unit: str) -> str:
    if value is None:
        return ""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_bytes(value) if unit == "B" else format_quantity(value, unit)
    return str(value).replace("|", "\\|").replace("\n", " ")


def to_markdown(result: Any) -> str:
    """A heading and a table, numbers as the app shows them (units scaled, no scientific notation)."""
    table = as_table(result)
    row_units = [{column: table.units.get(column) or (row.get("unit", "") if column in ("measured", "theory", "peak",
                                                                                            "value") else "")
                  for column in table.columns} for row in table.rows]
    shown_columns = [c for c in table.columns if c != "unit"]
    lines = [f"# {table.title}", ""]
    summary = table.data.get("summary") if isinstance(table.data, dict) else None
    if summary:
        lines += [str(summary), ""]
    lines.append("| " + " | ".join(c.replace("_", " ") for c in shown_columns) + " |")
    lines.append("|" + "|".join(" --- " for _ in shown_columns) + "|")
    for row, units in zip(table.rows, row_units):
        lines.append("| " + " | ".join(_cell(row.get(c), units[c]) for c in shown_columns) + " |")
    return "\n".join(lines) + "\n"


EXPORTERS = {"json": to_json, "csv": to_csv, "markdown": to_markdown}


def export_text(result: Any, fmt: str) -> str:
    return EXPORTERS[fmt](result)


def save_export(result: Any, fmt: str, folder: Path | None = None, now: datetime | None = None) -> Path:
    """Write the result under the data dir's exports/ folder; returns the file's path (OSError if it cannot)."""
    from tutor.storage import data_dir

    target = folder or data_dir() / EXPORTS_FOLDER
    target.mkdir(parents=True, exist_ok=True)
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%d-%H%M%S")
    text = export_text(result, fmt)
    path = target / f"{as_table(result).name}-{stamp}.{FORMATS[fmt]}"
    counter = 1
    while os.path.lexists(path):  # a dangling link is no free name
        counter += 1
        path = target / f"{as_table(result).name}-{stamp}-{counter}.{FORMATS[fmt]}"
    from tutor.storage import write_regular_text

    write_regular_text(path, text)  # a FIFO put there since the name was free would block a plain write
    return path


# ---- pictures: the SVG and its data -------------------------------------------------------------

def charts_csv(charts: Sequence[Chart]) -> str:
    """Every point of every chart, one row each (chart, series, x, x as the table names it, y, units),
    the numbers in plain digits for a spreadsheet."""
    from tutor.plots import point_text

    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["chart", "series", "x", "x_text", "x_unit", "y", "y_unit"])
    for chart in charts:
        for s in chart.series:
            for p in s.points:
                writer.writerow([chart.title, s.label, plain_number(p.x), point_text(chart, p), chart.x_unit,
                                 plain_number(p.y), chart.y_unit])
    return out.getvalue()


def save_picture_files(charts: Sequence[Chart], folder: str | Path, stem: str, *, width: int = 100,
                       stamp: str | None = None) -> tuple[Path, Path, Path]:
    """The pictures as one SVG (save_svg: picture and table) and their data beside it as CSV and JSON,
    `stem-STAMP.svg/.csv/.json` in `folder` (made if missing; a number added rather than overwrite).
    UserError if the folder cannot be written."""
    from tutor.errors import UserError
    from tutor.plots import chart_json, save_svg
    from tutor.storage import write_regular_text

    target = Path(folder)
    stamp = stamp or datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    try:
        target.mkdir(parents=True, exist_ok=True)
        base, counter = f"{stem}-{stamp}", 1
        while any(os.path.lexists(target / f"{base}.{ext}") for ext in ("svg", "csv", "json")):  # a link too
            counter += 1
            base = f"{stem}-{stamp}-{counter}"
        svg = save_svg(charts, target / f"{base}.svg", width=width)
        data = target / f"{base}.csv"
        # write_regular_text: never through a link when the folder is the data folder's exports/
        write_regular_text(data, charts_csv(charts))
        described = target / f"{base}.json"
        write_regular_text(described, json.dumps({"charts": [chart_json(chart) for chart in charts]}, indent=2) + "\n")
    except OSError as error:
        raise UserError(f"cannot write in {target}: {error.strerror or error}") from None
    return svg, data, described
