"""Export a result as JSON, CSV or Markdown: pure functions from a result to text, and one that saves it.

A result is what a screen shows: a lab's ProbeResult (a lesson's measure block), a Bench run (a
notebook Run, or a BenchOutcome that could not be saved), or the Fit screen's form (FitValues).
JSON is the same JSON the command line prints (`lab NAME --json`, `bench --json`, `fit --json`);
CSV has one row per measurement (per memory component for a fit), numbers in plain digits;
Markdown is a table with the numbers as the app shows them. No Textual here: the app's Export
command (tutor.ui.commands) calls it. Pictures (tutor.answers.pictures Charts) are saved as one SVG with their
data as CSV and JSON beside it (`save_picture_files`, the app's Ctrl+S).

Every file says what it is of (ExportContext: model, mode, dtype or recipe, device, the export's date in
ISO 8601 UTC, the tensor-tutor version): the first columns of each CSV row, a `context` object beside the
JSON's keys, a line under the Markdown heading, the first line of the SVG. A column of figures ends with
its unit (`measured_gflops`, `memory_gib`, `bandwidth_gbps`: unit_slug) and holds them in the unit the
app shows that column in (tutor.formatting.column_units, the Bench table's; the Fit table's GiB; a
chart's axis), so a figure read from the file is the figure read from the screen.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tutor.formatting import column_units, format_in_unit, format_number

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tutor.hardware.machine import Machine
    from tutor.answers.pictures import Chart

FORMATS = {"json": "json", "csv": "csv", "markdown": "md"}
"""Export format -> file extension."""
EXPORTS_FOLDER = "exports"
GIB = 2**30

CONTEXT_FIELDS = ("model", "mode", "dtype", "device", "date", "tool_version")
"""What every export says it is of, in this order: the first columns of every CSV, the `context` object
of every JSON, the line under every Markdown heading and at the top of every SVG."""


def iso_utc(moment: datetime) -> str:
    """A moment as ISO 8601 in UTC to the second, '2025-01-12T10:00:00Z' (a naive moment is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def mode_name(mode: object) -> str | None:
    """'training' or 'inference' (fit's `train` is a training step)."""
    if mode in (None, ""):
        return None
    return "training" if str(mode) in ("train", "training") else str(mode)


@dataclass(frozen=True)
class ExportContext:
    """What an exported result is of: the model, the mode (inference or training), the dtype (a training
    recipe beside it), the device, the moment of the export (ISO 8601, UTC) and the tensor-tutor version
    that wrote it. None where a field does not apply: a benchmark measures the machine, not a model."""

    model: str | None
    mode: str | None
    dtype: str | None
    device: str | None
    date: str
    tool_version: str

    def to_json(self) -> dict[str, str | None]:
        return {name: getattr(self, name) for name in CONTEXT_FIELDS}

    def line(self) -> str:
        """'model Llama-3.2-1B · mode training · dtype bf16, recipe mixed · device H100 SXM5 80GB ·
        date 2025-01-12T10:00:00Z · tensor-tutor 0.1.0'; a field that does not apply reads 'none'."""
        parts = [f"{name} {getattr(self, name) or 'none'}" for name in CONTEXT_FIELDS[:-1]]
        return " · ".join(parts + [f"tensor-tutor {self.tool_version}"])


def export_context(*, model: object = None, mode: object = None, dtype: object = None, device: object = None,
                   now: datetime | None = None) -> ExportContext:
    """An ExportContext dated now (UTC) with this tensor-tutor's version; empty fields become None."""
    from tutor import __version__

    def text(value: object) -> str | None:
        if isinstance(value, (list, tuple)):
            value = ", ".join(str(item) for item in value)
        return str(value) if value not in (None, "") else None

    return ExportContext(text(model), mode_name(mode), text(dtype), text(device), iso_utc(now or datetime.now(UTC)),
                         __version__)


@dataclass(frozen=True)
class FitValues:
    """The Fit screen's fields (calculator values) and the machine they are checked against."""

    values: dict[str, Any]
    machine: Machine


@dataclass(frozen=True)
class Column:
    """One column of an export: its CSV header (a figure's ends with its unit: 'measured_gflops'), the
    unit its figures are in ('' for text), and its Markdown heading ('measured (GFLOP/s)')."""

    name: str
    unit: str = ""
    label: str = ""

    @property
    def heading(self) -> str:
        return self.label or self.name.replace("_", " ")


def unit_slug(unit: str) -> str:
    """A unit as the end of a CSV header: 'GFLOP/s' -> 'gflops', 'GB/s' -> 'gbps', 'B' -> 'bytes',
    'GiB' -> 'gib', '%' -> 'pct', 'x' -> 'ratio', 'ms' -> 'ms', 'tokens/s' -> 'tokens_per_s'."""
    special = {"B": "bytes", "bytes": "bytes", "%": "pct", "x": "ratio", "×": "ratio", "fraction": "fraction"}
    if unit in special:
        return special[unit]
    slug = unit.lower().replace("µ", "u").replace("μ", "u")
    slug = re.sub(r"flop/s$", "flops", slug)
    slug = re.sub(r"(^|[kmgtpe])b/s$", r"\1bps", slug)
    slug = slug.replace("/", "_per_")
    return re.sub(r"[^a-z0-9_]+", "_", slug).strip("_")


def figure_column(name: str, unit: str) -> Column:
    """A numeric column named with its unit: ('measured', 'GFLOP/s') -> measured_gflops, 'measured (GFLOP/s)'."""
    slug = unit_slug(unit)
    return Column(f"{name}_{slug}" if slug else name, unit, f"{name.replace('_', ' ')} ({unit})" if unit else "")


@dataclass(frozen=True)
class Table:
    """A result reduced to what every format needs: a name, its JSON, its context, and rows of
    (column name -> value), each figure already in its column's unit (the unit the screen shows)."""

    name: str
    title: str
    data: dict[str, Any]
    columns: tuple[Column, ...]
    rows: tuple[dict[str, Any], ...]
    context: ExportContext


def in_unit(value: Any, factor: float) -> Any:
    """A figure converted to its column's unit, without the float noise of the product (0.118 x 1000 is
    118.00000000000001; a spreadsheet should read 118)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
        return value
    return float(f"{value * factor:.15g}")


def figure_columns(names: Sequence[str], units: dict[str, tuple[float, str]]) -> dict[tuple[str, str], Column]:
    """(name, source unit) -> its Column, for every name and every unit a table's figures come in."""
    return {(name, unit): figure_column(name, shown) for unit, (_, shown) in units.items() for name in names}


# ---- each kind of result as a Table ---------------------------------------------------------------

def probe_table(result: Any, now: datetime | None = None) -> Table:
    """A lab's ProbeResult: `lab NAME --json`'s object; one row per measurement, its measured and theory
    figures in the columns of their unit (every figure of a unit in one, tutor.formatting.column_units)."""
    units = column_units([(row.measured, row.unit) for row in result.rows]
                         + [(row.theory, row.unit) for row in result.rows])
    figures = figure_columns(("measured", "theory"), units)
    percent = Column("of_theory_pct", "%", "of theory (%)")
    rows = []
    for row in result.rows:
        factor = units[row.unit][0]
        rows.append({"label": row.label, figures[("measured", row.unit)].name: in_unit(row.measured, factor),
                     figures[("theory", row.unit)].name: in_unit(row.theory, factor),
                     percent.name: row.percent_of_theory, "theory_source": row.theory_source, "note": row.note})
    columns = (Column("label"), *dict.fromkeys(figures.values()), percent, Column("theory_source"), Column("note"))
    title = f"lab {result.probe} on {result.device}" + (" (cancelled)" if result.cancelled else "")
    details = result.details or {}
    context = export_context(model=details.get("model"), mode=details.get("mode"),
                             dtype=details.get("dtype") or details.get("dtypes"), device=result.device, now=now)
    return Table(f"lab-{result.probe}", title, result.to_json(), columns, tuple(rows), context)


def bench_units(rows: Sequence[Any]) -> dict[str, tuple[float, str]]:
    """The unit each of a Bench table's units is shown in (column_units over the measured and peak figures
    of its rows, tutor.worker.jobs.BenchRow): the screen's table, its bars and the export share it."""
    return column_units([(row.measured, row.unit) for row in rows] + [(row.peak, row.unit) for row in rows])


BENCH_FIGURES = ("measured", "peak")
OF_PEAK = Column("of_peak_pct", "%", "of peak (%)")


def run_table(run: Any, now: datetime | None = None) -> Table:
    """A stored bench run: `bench --json`'s object ({"device": header, "results": [...]}); one row per
    result with its headline (tutor.bench.record: the figure `bench history` and the Bench screen show),
    in the unit the Bench screen shows it in (bench_units of the screen's rows)."""
    from tutor.bench.notebook import case_label, case_size
    from tutor.worker.jobs import bench_rows

    cases = [(case, case.headline()) for case in run.cases]
    cases = [(case, headline) for case, headline in cases if case.key is not None and headline is not None]
    units = bench_units(bench_rows(run.cases))
    for unit, scale in column_units([(headline.value, headline.unit) for _, headline in cases]
                                    + [(case.peak, headline.unit) for case, headline in cases]).items():
        units.setdefault(unit, scale)  # a backend the screen leaves out, in a unit it does not show
    figures = figure_columns(BENCH_FIGURES, units)
    date = run_date_utc(run.date)
    rows = []
    for case, headline in cases:
        factor = units[headline.unit][0]
        rows.append({"dtype": case.data.get("dtype"), "device": case.device, "run": run.number, "run_date": date,
                     "label": case.name, "case": case_label(case.key), "size": case_size(case.data),
                     "figure": headline.field,
                     "statistic": headline.label,
                     figures[("measured", headline.unit)].name: in_unit(headline.value, factor),
                     figures[("peak", headline.unit)].name: in_unit(case.peak, factor),
                     OF_PEAK.name: case.percent_of_peak, "noisy": case.data.get("noisy")})
    # label: the figure as the Bench screen names it ("matmul fp32"); case: as runs are compared by it
    columns = (Column("run"), Column("run_date"), Column("label"), Column("case"), Column("size"), Column("figure"),
               Column("statistic"),
               *dict.fromkeys(figures.values()), OF_PEAK, Column("noisy"))
    title = f"bench run {run.number}, {date}, {run.device}" + (" (cancelled)" if run.cancelled else "")
    dtypes = list(dict.fromkeys(str(case.data["dtype"]) for case, _ in cases if case.data.get("dtype")))
    context = export_context(dtype=dtypes, device=run.device, now=now)
    return Table(f"bench-run-{run.number}", title, {"device": run.header, "results": list(run.results)}, columns,
                 tuple(rows), context)


def run_date_utc(date: str) -> str:
    """A run's stored date (ISO 8601 with its offset) in UTC, as every export writes dates; as stored if unreadable."""
    try:
        return iso_utc(datetime.fromisoformat(date))
    except (TypeError, ValueError):
        return str(date)


def outcome_table(outcome: Any, now: datetime | None = None) -> Table:
    """A Bench outcome that is not in the notebook (its save failed): the screen's rows."""
    units = bench_units(outcome.rows)
    figures = figure_columns(BENCH_FIGURES, units)
    rows = tuple({"label": row.label, figures[("measured", row.unit)].name: in_unit(row.measured, units[row.unit][0]),
                  figures[("peak", row.unit)].name: in_unit(row.peak, units[row.unit][0]), "note": row.note}
                 for row in outcome.rows)
    data = {"device": outcome.device, "cancelled": outcome.cancelled, "failures": list(outcome.failures),
            "rows": [{"label": row.label, "measured": row.measured, "peak": row.peak, "unit": row.unit,
                      "note": row.note} for row in outcome.rows]}
    columns = (Column("label"), *dict.fromkeys(figures.values()), Column("note"))
    return Table("bench", f"bench on {outcome.device}", data, columns, rows,
                 export_context(device=outcome.device, now=now))


def fit_report(values: dict[str, Any], machine: Machine) -> dict[str, Any]:
    """`tensor-tutor fit --json`'s report for the calculator's values (tutor.answers.fit, the command's own answer)."""
    from tutor.answers.fit import FitInputs, answer_fit

    return answer_fit(FitInputs.from_values(values, machine)).to_json()


def fit_context(report: dict[str, Any], now: datetime | None = None) -> ExportContext:
    """A fit report's context: the model's name, the mode, the dtype (and for training the recipe), the device."""
    request = report.get("request") or {}
    dtype = request.get("dtype")
    if mode_name(report.get("mode")) == "training" and request.get("recipe"):
        dtype = f"{dtype}, recipe {request['recipe']}"
    return export_context(model=(report.get("model") or {}).get("name"), mode=report.get("mode"), dtype=dtype,
                          device=(report.get("device") or {}).get("name"), now=now)


def fit_table(fit: FitValues, now: datetime | None = None) -> Table:
    """The Fit screen: the report as `fit --json` prints it; one row per memory component, in GiB as the
    screen's table shows them."""
    report = fit_report(fit.values, fit.machine)
    at_peak = report["peak"]["per_category_bytes"]
    memory, peak = figure_column("memory", "GiB"), figure_column("at_peak", "GiB")
    rows = tuple({"component": c["name"], memory.name: in_unit(c["bytes"], 1 / GIB),
                  peak.name: in_unit(at_peak.get(c["name"]), 1 / GIB), "formula": c["formula"]}
                 for c in report["components"])
    rows += ({"component": "total", memory.name: in_unit(report["per_device_bytes"]["total"], 1 / GIB),
              peak.name: None, "formula": "what must fit"},)
    context = fit_context(report, now)
    title = f"fit {report['model']['name']} ({report['mode']}) on {context.device or ''}"
    columns = (Column("component"), memory, peak, Column("formula"))
    return Table(f"fit-{values_name(fit.values)}", title, report, columns, rows, context)


def values_name(values: dict[str, Any]) -> str:
    return f"{values.get('model', 'model')}-{values.get('mode', 'inference')}"


def as_table(result: Any, now: datetime | None = None) -> Table:
    """The Table of any exportable result (a Table as it is); TypeError for anything else."""
    from tutor.bench.notebook import Run
    from tutor.labs import ProbeResult
    from tutor.worker.jobs import BenchOutcome

    if isinstance(result, Table):
        return result
    if isinstance(result, ProbeResult):
        return probe_table(result, now)
    if isinstance(result, Run):
        return run_table(result, now)
    if isinstance(result, BenchOutcome):
        return outcome_table(result, now)
    if isinstance(result, FitValues):
        return fit_table(result, now)
    raise TypeError(f"cannot export a {type(result).__name__}")


def context_of(result: Any, now: datetime | None = None) -> ExportContext:
    """The context of any exportable result (as_table's); of None or a fit the form cannot compute, only
    the date and version (and the fit's fields as typed)."""
    if result is None:
        return export_context(now=now)
    try:
        return as_table(result, now).context
    except (ValueError, TypeError):
        values = getattr(result, "values", {}) or {}
        return export_context(model=values.get("model"), mode=values.get("mode"), dtype=values.get("dtype"),
                              device=values.get("device"), now=now)


# ---- formats ----------------------------------------------------------------------------------------

def to_json(result: Any, now: datetime | None = None) -> str:
    """The JSON the command line prints for this result, with the export's `context` beside its keys."""
    table = as_table(result, now)
    return json.dumps({**table.data, "context": table.context.to_json()}, indent=2, default=str) + "\n"


def plain_number(value: Any) -> str:
    """A number for a spreadsheet: every digit, never scientific notation ('0.0000012', not '1.2e-06')."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return format(Decimal(repr(value)), "f") if value == value and abs(value) != float("inf") else ""
    if value is None:
        return ""
    return str(value)


def csv_columns(table: Table) -> list[str]:
    """The context fields, then the table's own columns (a row's own dtype or device replaces the context's)."""
    return list(dict.fromkeys([*CONTEXT_FIELDS, *(column.name for column in table.columns)]))


def to_csv(result: Any, now: datetime | None = None) -> str:
    """One row per measurement, a header row first: the context in the first columns of every row, each
    figure's unit at the end of its column's name."""
    table = as_table(result, now)
    columns = csv_columns(table)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    context = table.context.to_json()
    for row in table.rows:
        values = {**context, **row}  # a row's own dtype or device, even None (a bandwidth has no dtype)
        writer.writerow(plain_number(values.get(column)) for column in columns)
    return buffer.getvalue()


def _cell(value: Any, column: Column) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return plain_number(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return format_in_unit(value, (1.0, column.unit)) if column.unit else format_number(value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def to_markdown(result: Any, now: datetime | None = None) -> str:
    """A heading, the context, and a table: numbers as the app shows them, each column in one unit."""
    table = as_table(result, now)
    lines = [f"# {table.title}", "", table.context.line(), ""]
    summary = table.data.get("summary") if isinstance(table.data, dict) else None
    if summary:
        lines += [str(summary), ""]
    lines.append("| " + " | ".join(column.heading for column in table.columns) + " |")
    lines.append("|" + "|".join(" --- " for _ in table.columns) + "|")
    for row in table.rows:
        lines.append("| " + " | ".join(_cell(row.get(column.name), column) for column in table.columns) + " |")
    return "\n".join(lines) + "\n"


EXPORTERS = {"json": to_json, "csv": to_csv, "markdown": to_markdown}


def export_text(result: Any, fmt: str, now: datetime | None = None) -> str:
    return EXPORTERS[fmt](result, now)


def save_export(result: Any, fmt: str, folder: Path | None = None, now: datetime | None = None) -> Path:
    """Write the result under the data dir's exports/ folder; returns the file's path (OSError if it cannot)."""
    from tutor.files.storage import data_dir

    target = folder or data_dir() / EXPORTS_FOLDER
    target.mkdir(parents=True, exist_ok=True)
    now = now or datetime.now(UTC)
    stamp = now.strftime("%Y%m%d-%H%M%S")
    table = as_table(result, now)
    text = export_text(table, fmt, now)
    path = target / f"{table.name}-{stamp}.{FORMATS[fmt]}"
    counter = 1
    while os.path.lexists(path):  # a dangling link is no free name
        counter += 1
        path = target / f"{table.name}-{stamp}-{counter}.{FORMATS[fmt]}"
    from tutor.files.storage import write_regular_text

    write_regular_text(path, text)  # a FIFO put there since the name was free would block a plain write
    return path


# ---- pictures: the SVG and its data -------------------------------------------------------------

def chart_columns(chart: Chart) -> tuple[Column, Column, float, float]:
    """A chart's x and y columns, named with their axis and the unit the app's axes show (Chart.x_scale
    and y_scale; a logarithmic x keeps the chart's own unit), and the factors into those units."""
    y_factor, y_unit = chart.y_scale()
    x_factor, x_unit = (1.0, chart.x_unit) if chart.x_log else chart.x_scale()
    name = re.sub(r"[^a-z0-9]+", "_", chart.x_label.lower()).strip("_") or "x"
    y_name = re.sub(r"[^a-z0-9]+", "_", chart.y_label.lower()).strip("_") or "y"
    return figure_column(name, x_unit), figure_column(y_name, y_unit), x_factor, y_factor


def charts_csv(charts: Sequence[Chart], context: ExportContext | None = None) -> str:
    """Every point of every chart, one row each: the context, the chart, the series, x in the column of its
    axis and unit, x as the table names it, y likewise; the numbers in plain digits for a spreadsheet."""
    from tutor.answers.pictures import point_text

    context = context or export_context()
    axes = [chart_columns(chart) for chart in charts]
    columns = list(dict.fromkeys([*CONTEXT_FIELDS, "chart", "series", *(x.name for x, _, _, _ in axes), "x_text",
                                  *(y.name for _, y, _, _ in axes)]))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for chart, (x, y, x_factor, y_factor) in zip(charts, axes):
        for s in chart.series:
            for p in s.points:
                row = {**context.to_json(), "chart": chart.title, "series": s.label, x.name: in_unit(p.x, x_factor),
                       "x_text": point_text(chart, p), y.name: in_unit(p.y, y_factor)}
                writer.writerow(plain_number(row.get(column)) for column in columns)
    return out.getvalue()


def save_picture_files(charts: Sequence[Chart], folder: str | Path, stem: str, *, width: int = 100,
                       stamp: str | None = None, context: ExportContext | None = None) -> tuple[Path, Path, Path]:
    """The pictures as one SVG (save_svg: the context, picture and table) and their data beside it as CSV
    and JSON, each with the context, `stem-STAMP.svg/.csv/.json` in `folder` (made if missing; a number
    added rather than overwrite). UserError if the folder cannot be written."""
    from tutor.errors import UserError
    from tutor.answers.pictures import chart_json, save_svg
    from tutor.files.storage import write_regular_text

    context = context or export_context()
    target = Path(folder)
    stamp = stamp or datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    try:
        target.mkdir(parents=True, exist_ok=True)
        base, counter = f"{stem}-{stamp}", 1
        while any(os.path.lexists(target / f"{base}.{ext}") for ext in ("svg", "csv", "json")):  # a link too
            counter += 1
            base = f"{stem}-{stamp}-{counter}"
        svg = save_svg(charts, target / f"{base}.svg", width=width, context=context.line())
        data = target / f"{base}.csv"
        # write_regular_text: never through a link when the folder is the data folder's exports/
        write_regular_text(data, charts_csv(charts, context))
        described = target / f"{base}.json"
        write_regular_text(described, json.dumps({"context": context.to_json(),
                                                  "charts": [chart_json(chart) for chart in charts]}, indent=2) + "\n")
    except OSError as error:
        raise UserError(f"cannot write in {target}: {error.strerror or error}") from None
    return svg, data, described
