"""Every picture tensor-tutor draws, as data, and how the command line draws it.

A `Chart` is what a picture shows: series of (x, y) points measured or computed elsewhere, marks
(a peak as a horizontal line, cache sizes as vertical lines), the axes' units. The builders below
make one from the JSON that a measurement or a formula wrote (bench results, a fit timeline);
nothing here measures or computes a figure. The command line draws a chart with uniplot (chosen
over plotille on a real matmul sweep: uniplot has a logarithmic x axis of its own, compact tick
labels, gridlines to mark sizes, and draws 4x faster; see docs/pictures.md), the app with
textual-plot (tutor/ui/widgets/chart.py). Every chart has a text fallback, `chart_table`: one row
per x, one column per series, for pipes and screen readers; `print_chart` prints the picture on a
terminal and the table always. `save_svg` writes both through Rich's recording console.

No torch here: the app imports this module.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tutor.formatting import axis_unit, format_bytes, format_quantity

CLI_WIDTH = 64
CLI_HEIGHT = 14


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    x_text: str = ""  # how the table names this x ('1024²', '32 KiB'); "" -> the formatted x


@dataclass(frozen=True)
class Series:
    label: str
    points: tuple[Point, ...]


@dataclass(frozen=True)
class Mark:
    """A labelled line across the chart: at y (horizontal, e.g. a peak) or at x (vertical, e.g. a cache size)."""

    label: str
    value: float


@dataclass(frozen=True)
class Chart:
    title: str
    x_label: str
    x_unit: str  # "B" (bytes, binary) or "" (a plain number)
    y_label: str
    y_unit: str  # "TFLOP/s", "GB/s", "B"
    series: tuple[Series, ...]
    x_log: bool = True
    y_marks: tuple[Mark, ...] = ()
    x_marks: tuple[Mark, ...] = ()
    notes: tuple[str, ...] = field(default=())

    def y_scale(self) -> tuple[float, str]:
        """(factor, unit) the y axis is drawn in: the prefix its largest value reads best with."""
        values = [p.y for s in self.series for p in s.points] + [m.value for m in self.y_marks]
        return axis_unit(max(values, default=0.0), self.y_unit)

    def x_scale(self) -> tuple[float, str]:
        values = [p.x for s in self.series for p in s.points]
        return axis_unit(max(values, default=0.0), self.x_unit) if self.x_unit else (1.0, "")


def _x_text(chart: Chart, point: Point) -> str:
    if point.x_text:
        return point.x_text
    return format_bytes(point.x) if chart.x_unit == "B" else format_quantity(point.x)


# ---- builders: JSON written elsewhere -> Chart ---------------------------------------------------

def matmul_sweep_chart(results: Iterable[dict[str, Any]]) -> Chart | None:
    """Throughput against matrix size, one series per dtype and backend, a peak line per dtype.
    x is the cube root of m*n*k (the side of the square of the same work); None without a sweep."""
    from tutor.bench.record import shape_text

    series: list[Series] = []
    peaks: dict[str, float] = {}
    for result in results:
        if result.get("kind") != "matmul" or result.get("fixed_size") or len(result.get("sweep") or ()) < 2:
            continue
        points = sorted((Point((s["m"] * s["n"] * s["k"]) ** (1 / 3), float(s["tflops_median"]),
                               shape_text(s["m"], s["n"], s["k"])) for s in result["sweep"]
                         if s.get("tflops_median") is not None), key=lambda p: p.x)
        series.append(Series(f"{result.get('dtype')} {str(result.get('backend', '')).split()[0]}", tuple(points)))
        if isinstance(result.get("peak_tflops"), (int, float)):
            peaks[str(result.get("dtype"))] = float(result["peak_tflops"])
    if not series:
        return None
    return Chart(title="matmul throughput against size (median per shape)", x_label="matrix side", x_unit="",
                 y_label="FLOP/s", y_unit="TFLOP/s", series=tuple(series),
                 y_marks=tuple(Mark(f"{dtype} peak", value) for dtype, value in peaks.items()))


def bandwidth_sweep_chart(results: Iterable[dict[str, Any]], caches: Sequence[tuple[str, int]] = ()) -> Chart | None:
    """Bandwidth against working set (every array the kernel touches) per op, the cache sizes as
    vertical marks. None when no result has a sweep of two or more sizes."""
    series = []
    for result in results:
        if result.get("kind") != "bandwidth" or len(result.get("sweep") or ()) < 2:
            continue
        points = sorted((Point(float(p["size_bytes"]), float(p["gbps"])) for p in result["sweep"]),
                        key=lambda p: p.x)
        series.append(Series(str(result.get("op")), tuple(points)))
    if not series:
        return None
    threads = {p.get("threads") for r in results if r.get("kind") == "bandwidth" for p in r.get("sweep") or ()}
    notes = ["best of each size's samples, as STREAM reports; one thread"] if threads == {1} else []
    return Chart(title="STREAM-like bandwidth against working set", x_label="working set", x_unit="B",
                 y_label="bandwidth", y_unit="GB/s", series=tuple(series),
                 x_marks=tuple(Mark(name, float(size)) for name, size in caches), notes=tuple(notes))


def timeline_chart(timeline: Sequence[dict[str, Any]], traced: Sequence[dict[str, Any]] = (),
                   traced_peak: int | None = None) -> Chart | None:
    """Bytes alive over one training step, moment by moment in order (the `timeline` JSON of
    `fit --timeline`): the total and each category that holds bytes at some moment; with `traced`
    (the measured moments, [{"phase", "moment", "bytes"}]) the traced total at the moments both
    have, and the traced peak as a line. x is the moment's index."""
    if not timeline:
        return None

    def name(entry: dict[str, Any]) -> str:
        return str(entry.get("moment") or entry.get("phase"))

    series = [Series("alive", tuple(Point(float(i), float(entry["bytes"]), name(entry))
                                    for i, entry in enumerate(timeline)))]
    categories = [c for c in (timeline[0].get("per_category_bytes") or {})
                  if any((entry.get("per_category_bytes") or {}).get(c) for entry in timeline)]
    for category in categories:
        series.append(Series(category.replace("_", " "), tuple(
            Point(float(i), float(entry["per_category_bytes"].get(category, 0)), name(entry))
            for i, entry in enumerate(timeline))))
    index = {(entry.get("phase"), name(entry)): i for i, entry in enumerate(timeline)}
    matched = [(index[(entry.get("phase"), name(entry))], entry) for entry in traced
               if (entry.get("phase"), name(entry)) in index]
    if matched:
        series.append(Series("traced", tuple(Point(float(i), float(entry["bytes"]), name(entry))
                                             for i, entry in sorted(matched, key=lambda item: item[0]))))
    peak = max(timeline, key=lambda entry: entry["bytes"])
    notes = [f"peak {format_bytes(peak['bytes'])} at {name(peak)} ({peak['phase']})"]
    if traced_peak is not None:
        notes.append(f"traced peak {format_bytes(traced_peak)}")
    return Chart(title="memory alive over one training step", x_label="moment", x_unit="", y_label="alive",
                 y_unit="B", series=tuple(series), x_log=False, notes=tuple(notes),
                 y_marks=(Mark("traced peak", float(traced_peak)),) if traced_peak is not None else ())


# ---- text: the picture (uniplot) and its table ---------------------------------------------------

def chart_text(chart: Chart, *, width: int = CLI_WIDTH, height: int = CLI_HEIGHT, color: bool = False) -> str:
    """The chart drawn with uniplot: plain text, or with ANSI colours when `color`."""
    import uniplot

    y_factor, y_unit = chart.y_scale()
    x_factor, x_unit = chart.x_scale()
    xs = [[p.x * x_factor for p in s.points] for s in chart.series]
    ys = [[p.y * y_factor for p in s.points] for s in chart.series]
    labels = [s.label for s in chart.series]
    low = min(min(x) for x in xs)
    high = max(max(x) for x in xs)
    for mark in chart.y_marks:
        xs.append([low, high])
        ys.append([mark.value * y_factor] * 2)
        labels.append(mark.label)
    top = max(max(y) for y in ys)
    options: dict[str, Any] = dict(
        legend_labels=labels, lines=True, width=width, height=height, color=color,
        title=f"{chart.title} ({y_unit}{', x in ' + x_unit if x_unit else ''})",
        x_as_log=chart.x_log, y_min=0, y_max=top * 1.05 if top > 0 else 1.0)
    if chart.x_marks:
        marks = [m.value * x_factor for m in chart.x_marks if low <= m.value * x_factor <= high]
        if marks:
            options["x_gridlines"] = marks  # uniplot takes them in data units and logs them itself
    text = uniplot.plot_to_string(ys, xs, **options)
    lines = [text] if isinstance(text, str) else list(text)
    if chart.x_marks:
        lines.append("vertical lines: " + ", ".join(f"{m.label} {_x_text(chart, Point(m.value, 0))}"
                                                    for m in chart.x_marks))
    lines.extend(chart.notes)
    return "\n".join(lines)


def chart_rows(chart: Chart) -> tuple[list[str], list[list[str]]]:
    """The table behind a chart: a header and its rows. When every series' x values are among the
    first series', one row per x of the first series and one column per series ("-" where a series
    has no point); else one row per point (series, x, y)."""
    first = chart.series[0]
    xs = {p.x for p in first.points}
    if any(p.x not in xs for s in chart.series[1:] for p in s.points):
        header = ["series", chart.x_label, chart.y_label]
        return header, [[s.label, _x_text(chart, p), format_quantity(p.y, chart.y_unit)]
                        for s in chart.series for p in s.points]
    header = [chart.x_label] + [s.label for s in chart.series]
    by_series = [{p.x: p.y for p in s.points} for s in chart.series]
    rows = [[_x_text(chart, point)] + [format_quantity(values[point.x], chart.y_unit) if point.x in values else "-"
                                       for values in by_series] for point in first.points]
    return header, rows


def chart_table(chart: Chart) -> Any:
    """The Rich table a pipe or a screen reader reads instead of the picture."""
    from rich.markup import escape
    from rich.table import Table

    header, rows = chart_rows(chart)
    table = Table(title=f"{escape(chart.title)} (table)", title_justify="left")
    for index, column in enumerate(header):
        table.add_column(escape(column), justify="left" if index == 0 else "right", overflow="fold")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    marks = [f"{m.label} {format_quantity(m.value, chart.y_unit)}" for m in chart.y_marks] + [
        f"{m.label} at {_x_text(chart, Point(m.value, 0))}" for m in chart.x_marks]
    if marks:
        table.caption = escape("; ".join(marks))
        table.caption_justify = "left"
    return table


def print_chart(chart: Chart, console: Any) -> None:
    """The picture (coloured on a terminal, plain text in a pipe) and then its table."""
    from rich.text import Text

    width = max(40, min(console.width - 12, 100))
    picture = chart_text(chart, width=width, color=console.is_terminal and not console.no_color)
    console.print(Text.from_ansi(picture))
    console.print(chart_table(chart))


def save_svg(charts: Sequence[Chart], path: str | Path, *, width: int = 100) -> Path:
    """Every chart (picture and table) in one SVG file, through Rich's recording console."""
    import io

    from rich.console import Console

    console = Console(record=True, width=width, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    for chart in charts:
        print_chart(chart, console)
    from tutor.storage import write_regular_text

    target = Path(path)
    try:
        write_regular_text(target, console.export_svg(title="tensor-tutor"))
    except OSError as error:
        from tutor.errors import UserError

        raise UserError(f"cannot write {target}: {error.strerror or error}") from None
    return target


def caches_from_machine_json(machine: dict[str, Any] | None) -> list[tuple[str, int]]:
    """[("L1", bytes), ...]: the data and unified caches of a stored machine record (`env --json`'s
    cpu.caches, kept in every bench run's header), smallest first."""
    levels: dict[int, int] = {}
    cpu = (machine or {}).get("cpu") or {}
    for cache in cpu.get("caches") or ():
        if isinstance(cache, dict) and cache.get("kind") in ("Data", "Unified") and isinstance(
                cache.get("size_bytes"), int) and isinstance(cache.get("level"), int):
            levels[cache["level"]] = max(levels.get(cache["level"], 0), cache["size_bytes"])
    return [(f"L{level}", size) for level, size in sorted(levels.items())]


def bench_charts(results: Sequence[dict[str, Any]], header: dict[str, Any] | None = None) -> list[Chart]:
    """The pictures of one bench run (its results' JSON and header): the matmul sweep, the bandwidth sweep."""
    header = header or {}
    caches = caches_from_machine_json(header.get("machine")) if str(
        header.get("device_under_test") or "cpu").startswith("cpu") else []
    charts = [matmul_sweep_chart(results), bandwidth_sweep_chart(results, caches)]
    return [chart for chart in charts if chart is not None]
