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

from tutor.formatting import axis_unit, format_bytes, format_duration, format_quantity

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


def point_text(chart: Chart, point: Point) -> str:
    """How the chart's table names a point's x: its own text ('1024²'), else the x formatted in the chart's unit."""
    return _x_text(chart, point)


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
        backend = str(result.get("backend") or "").split()  # a hand-edited run may have none
        series.append(Series(f"{result.get('dtype')} {backend[0] if backend else ''}".strip(), tuple(points)))
        if isinstance(result.get("peak_tflops"), (int, float)):
            peaks[str(result.get("dtype"))] = float(result["peak_tflops"])
    if not series:
        return None
    return Chart(title="matmul throughput against size (median per shape)", x_label="matrix size n", x_unit="",
                 y_label="throughput", y_unit="TFLOP/s", series=tuple(series),
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
    swept = [r for r in results if r.get("kind") == "bandwidth" and len(r.get("sweep") or ()) >= 2]
    threads = {p.get("threads") for r in swept for p in r.get("sweep") or ()}
    notes = ["best of each size's samples, as STREAM reports; one thread"] if threads == {1} else []
    notes.extend(cache_level_notes(swept, caches))
    return Chart(title="STREAM-like bandwidth against working set", x_label="working set", x_unit="B",
                 y_label="bandwidth", y_unit="GB/s", series=tuple(series),
                 x_marks=tuple(Mark(name, float(size)) for name, size in caches), notes=tuple(notes))


# A measured step this far from the reported size (either way) is worth a word: the plateaus' 2x rule.
STEP_NOTE_FACTOR = 2.0


def cache_level_notes(swept: Sequence[dict[str, Any]], caches: Sequence[tuple[str, int]]) -> list[str]:
    """A line per cache level and DRAM, read from the sweeps of `swept` (bandwidth results) by
    tutor.bench.cache_sweep.cache_levels: the plateau per op, where the curve steps down against the
    size `env` reports, and why a level is not seen (dispatch-bound sizes) or steps far from its size."""
    from tutor.bench.cache_sweep import DISPATCH_PROBE_ELEMENTS, ELEMENT_BYTES, cache_levels, dispatch_share_limit

    if not swept or not caches:
        return []
    per_op = [(str(r.get("op")), cache_levels(list(r["sweep"]), list(caches)), dispatch_share_limit(list(r["sweep"])))
              for r in swept]
    lines = []
    for index, (name, reported) in enumerate([*caches, ("DRAM", 0)]):
        levels = [(op, found[index], limit) for op, found, limit in per_op]
        plateaus = ", ".join(f"{op} {format_quantity(level.gbps, 'GB/s')}" for op, level, _ in levels
                             if level.gbps is not None)
        if name == "DRAM":
            if plateaus:
                lines.append(f"beyond the caches (DRAM): {plateaus}")
            continue
        head = f"{name} {format_bytes(reported)}"
        if not plateaus:
            limits = [(size, dispatch) for _, _, (size, dispatch) in levels if size is not None and size >= reported // 2]
            if limits:
                size, dispatch = max(limits, key=lambda item: item[0])
                cost = (f" ({format_duration(dispatch)}, measured on "
                        f"{format_bytes(DISPATCH_PROBE_ELEMENTS * ELEMENT_BYTES)} arrays)") if dispatch is not None else ""
                lines.append(f"{head}: not seen: at working sets up to {format_bytes(size)} a quarter or more of "
                             f"each call is torch's per-call cost{cost}, not memory traffic")
            else:
                lines.append(f"{head}: no point on its plateau")
            continue
        steps = [(op, level) for op, level, _ in levels if level.step_bytes is not None]
        where = ", ".join(f"{format_bytes(level.step_bytes)} ({op})" for op, level in steps)
        line = f"{head}: {plateaus} while the working set fits; " + (
            f"falls at {where}" if steps else "no step seen past it")
        factors = [level.step_factor for _, level in steps if level.step_factor is not None]
        if factors and max(factors) < 1 / STEP_NOTE_FACTOR:
            line += (f", under 1/{STEP_NOTE_FACTOR:g} of its size: this thread gets only part of a cache it shares "
                     "(with the other cores; in a virtual machine, with other guests of the host)")
        elif factors and min(factors) > STEP_NOTE_FACTOR:
            line += f", past {STEP_NOTE_FACTOR:g}x its size: the next level or a prefetcher hides where it ends"
        lines.append(line)
    return lines


def collective_sweep_chart(results: Iterable[dict[str, Any]], link: tuple[str, float] | None = None) -> Chart | None:
    """busbw against message size, one series per collective (op, backend, ranks), from each result's
    `sweep` (or, for runs stored before it, from the results of each size); `link` (name, bytes/s per
    direction) as a horizontal line. None without two measured sizes of some op."""
    points_of: dict[str, dict[float, float]] = {}
    for result in results:
        if result.get("kind") != "collective":
            continue
        label = f"{result.get('op')} {result.get('backend')} x{result.get('ranks')}"
        sweep = result.get("sweep") or [{"size_bytes": result.get("bytes"), "busbw_gbps": result.get("busbw_gbps")}]
        for point in sweep:
            size, busbw = point.get("size_bytes"), point.get("busbw_gbps")
            if isinstance(size, (int, float)) and size > 0 and isinstance(busbw, (int, float)):
                points_of.setdefault(label, {})[float(size)] = float(busbw)
    series = tuple(Series(label, tuple(Point(size, busbw) for size, busbw in sorted(points.items())))
                   for label, points in points_of.items() if len(points) >= 2)
    if not series:
        return None
    marks = (Mark(f"{link[0]} per direction", link[1] / 1e9),) if link is not None else ()
    return Chart(title="collective bus bandwidth against message size", x_label="message", x_unit="B",
                 y_label="busbw", y_unit="GB/s", series=series, y_marks=marks,
                 notes=("busbw = algbw x the nccl-tests factor; the median time of each size",))


def collective_link(results: Iterable[dict[str, Any]], header: dict[str, Any] | None) -> tuple[str, float] | None:
    """The link a run's collectives crossed, when they ran on GPUs (NCCL) of a card on record; else None
    (gloo between CPU processes crosses no link with a datasheet rate)."""
    on_gpus = any(r.get("kind") == "collective" and r.get("backend") == "nccl" for r in results)
    return link_from_machine_json((header or {}).get("machine")) if on_gpus else None


def link_from_machine_json(machine: dict[str, Any] | None) -> tuple[str, float] | None:
    """The intra-node link of the first GPU of a stored machine record whose card has one on record."""
    from tutor.bench.ceilings import intra_node_link_rate

    for gpu in (machine or {}).get("gpus") or ():
        spec = gpu.get("spec") if isinstance(gpu, dict) else None
        if isinstance(spec, dict) and isinstance(spec.get("key"), str):
            link = intra_node_link_rate(spec["key"])
            if link is not None:
                return link
    return None


VISIBLE_SHARE = 0.001
"""The share of a timeline's peak a category must reach somewhere to be drawn as a line."""


def timeline_chart(timeline: Sequence[dict[str, Any]], traced: Sequence[dict[str, Any]] = (),
                   traced_peak: int | None = None, *, peak_mark: bool = False) -> Chart | None:
    """Bytes alive over one training step or one prefill, moment by moment in order (the `timeline`
    JSON of `fit --timeline`): the total and each category that holds bytes at some moment; with `traced`
    (the measured moments, [{"phase", "moment", "bytes"}]) the traced total at the moments both
    have, and the traced peak as a line. x is the moment's index. `peak_mark` draws the predicted
    peak as a line named with its phase (the Fit screen's picture; the note names its moment)."""
    if not timeline:
        return None

    def name(entry: dict[str, Any]) -> str:
        return str(entry.get("moment") or entry.get("phase"))

    series = [Series("alive", tuple(Point(float(i), float(entry["bytes"]), name(entry))
                                    for i, entry in enumerate(timeline)))]
    # A category drawn where it reaches a pixel's worth of the peak (a line at 0 tells nothing: Llama's 512 B of
    # RoPE buffers); the data (`fit --timeline`) keeps every one.
    visible = max(float(entry["bytes"]) for entry in timeline) * VISIBLE_SHARE
    categories = [c for c in (timeline[0].get("per_category_bytes") or {})
                  if any(((entry.get("per_category_bytes") or {}).get(c) or 0) > visible for entry in timeline)]
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
    marks: tuple[Mark, ...] = (Mark(f"peak, in {peak['phase']}", float(peak["bytes"])),) if peak_mark else ()
    if traced_peak is not None:
        marks += (Mark("traced peak", float(traced_peak)),)
    prefill = all(entry.get("phase") == "prefill" for entry in timeline)
    return Chart(title="memory alive over one prefill" if prefill else "memory alive over one training step",
                 x_label="moment", x_unit="", y_label="memory alive", y_unit="B", series=tuple(series),
                 x_log=False, notes=tuple(notes), y_marks=marks)


# ---- lanes: what ran when, one row per rank or bucket (schedules, overlap) -------------------------

@dataclass(frozen=True)
class Span:
    """One block on a lane: from start to end (seconds from the lanes' origin), of a kind ("F", "B",
    "comm", ...), labelled at its start ("F3": micro-batch 3's forward)."""

    start: float
    end: float
    kind: str
    label: str = ""


@dataclass(frozen=True)
class Lane:
    label: str
    spans: tuple[Span, ...]


@dataclass(frozen=True)
class Lanes:
    """Timelines on one time axis from 0 to `length` seconds: a pipeline's stages, DDP's buckets.
    `kinds` names each span kind for the legend, in order; every span was measured, or laid out by
    a schedule, elsewhere."""

    title: str
    lanes: tuple[Lane, ...]
    kinds: tuple[tuple[str, str], ...]
    length: float
    idle: str = "idle"
    notes: tuple[str, ...] = ()
    period: float | None = None  # the time idle shares are of (a step); None: up to the latest block's end

    def idle_period(self) -> float:
        if self.period is not None:
            return self.period
        return max((span.end for lane in self.lanes for span in lane.spans), default=0.0)


LANE_STYLES = ("bold black on cyan", "bold black on magenta", "bold black on green", "bold black on yellow")


class LanesPicture:
    """Lanes as terminal art: one row per lane scaled to the width Rich gives it, each block opened by
    its label so edges stay visible without colour, idle time as dots; under it the time axis and a
    legend. The same renderable serves the command line and the app (a lab's drawing)."""

    def __init__(self, lanes: Lanes) -> None:
        self.lanes = lanes

    def _label_width(self) -> int:
        return max(len(lane.label) for lane in self.lanes.lanes) + 1

    def _row(self, lane: Lane, width: int):
        from rich.text import Text

        styles = {kind: LANE_STYLES[index % len(LANE_STYLES)] for index, (kind, _words) in enumerate(self.lanes.kinds)}
        cells: list[tuple[str, str]] = [("·", "dim")] * width
        length = self.lanes.length
        for span in lane.spans:
            first = min(width - 1, max(0, round(span.start / length * width)))
            last = max(first + 1, min(width, round(span.end / length * width)))
            label = span.label[: last - first]
            text = label + "─" * (last - first - len(label))
            for offset, char in enumerate(text):
                cells[first + offset] = (char, styles.get(span.kind, "reverse"))
        line = Text()
        for char, style in cells:
            line.append(char, style)
        return line

    def __rich_console__(self, console, options):
        from tutor.safe_text import markup_escape as escape
        from rich.text import Text

        from tutor.formatting import format_duration

        lanes = self.lanes
        if lanes.length <= 0 or not lanes.lanes:
            yield Text(f"{lanes.title}: nothing to draw")
            return
        label_width = self._label_width()
        width = max(10, options.max_width - label_width)
        yield Text(lanes.title)
        for lane in lanes.lanes:
            yield Text(lane.label.ljust(label_width)) + self._row(lane, width)
        end = format_duration(lanes.length)
        yield Text(" " * label_width + "0".ljust(max(1, width - len(end))) + end, style="dim")
        legend = Text(" " * label_width)
        for index, (kind, words) in enumerate(lanes.kinds):
            legend.append(f" {kind} ", LANE_STYLES[index % len(LANE_STYLES)])
            legend.append(f" {words}  ")
        legend.append(f"· {lanes.idle}")
        yield legend
        for note in lanes.notes:
            yield Text(escape(note), style="dim")


def lanes_rows(lanes: Lanes) -> tuple[list[str], list[list[str]]]:
    """The text behind lanes (for a pipe or a screen reader): per lane its busy time, its idle share
    of the period (Lanes.idle_period: a step), and its blocks in order with their start and end."""
    from tutor.formatting import format_duration, format_percent

    header = ["lane", "busy", "idle", "blocks (start-end)"]
    rows = []
    for lane in lanes.lanes:
        busy = sum(span.end - span.start for span in lane.spans)
        period = lanes.idle_period()
        idle = 1 - busy / period if period > 0 else 0.0
        blocks = ", ".join(f"{span.label or span.kind} {format_duration(span.start)}-{format_duration(span.end)}"
                           for span in lane.spans)
        rows.append([lane.label, format_duration(busy), format_percent(max(0.0, idle)), blocks])
    return header, rows


def lanes_table(lanes: Lanes) -> Any:
    from tutor.safe_text import markup_escape as escape
    from rich.table import Table

    header, rows = lanes_rows(lanes)
    table = Table(title=f"{escape(lanes.title)} (table)", title_justify="left")
    for index, column in enumerate(header):
        table.add_column(escape(column), justify="right" if index in (1, 2) else "left", overflow="fold")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    return table


def lanes_with_table(*pictures: Lanes) -> Any:
    """Each picture, then its table: what a lab prints and a lesson shows."""
    from rich.console import Group

    parts: list[Any] = []
    for lanes in pictures:
        parts += [LanesPicture(lanes), lanes_table(lanes)]
    return Group(*parts)


def pipeline_lanes(timeline: Sequence[Sequence[dict[str, Any]]], *, title: str, length: float,
                   step: float | None = None) -> Lanes:
    """A pipeline's stages as lanes from a timeline [[{"kind": "F"|"B", "microbatch", "start_s",
    "end_s"}] per stage] (the pipeline lab's measured step, or its schedule with equal blocks)."""
    lanes = tuple(Lane(f"stage {stage}", tuple(Span(float(e["start_s"]), float(e["end_s"]), str(e["kind"]),
                                                     f"{e['kind']}{e['microbatch']}") for e in events))
                  for stage, events in enumerate(timeline))
    return Lanes(title=title, lanes=lanes, kinds=(("F", "forward"), ("B", "backward")), length=length,
                 idle="idle (bubble, send/recv waits)", period=step)


# ---- shares: one bar per item and column (the MoE lab's tokens per expert) --------------------------

def share_bars(columns: Sequence[tuple[str, Sequence[float]]], *, title: str, row_label: str,
               width: int = 8) -> Any:
    """A table with one row per item and one column per (heading, shares): each cell a bar of
    `width` cells scaled to the largest share of all columns, then the share as a percentage (the
    text a screen reader reads). Eight cells keep four columns inside 80 terminal columns."""
    from tutor.safe_text import markup_escape as escape
    from rich.table import Table
    from rich.text import Text

    from tutor.formatting import format_percent

    busiest = max((max(shares) for _heading, shares in columns if shares), default=0.0)

    def bar(share: float) -> str:
        filled = 0 if busiest <= 0 else round(width * share / busiest)
        return "█" * filled + "·" * (width - filled)

    table = Table(title=escape(title), title_justify="left")
    table.add_column(escape(row_label), justify="right", no_wrap=True)
    for heading, _shares in columns:
        table.add_column(escape(heading), no_wrap=True)
    for item in range(max((len(shares) for _heading, shares in columns), default=0)):
        table.add_row(str(item), *(Text(f"{bar(shares[item])} {format_percent(shares[item]):>5}")
                                   if item < len(shares) else Text("-") for _heading, shares in columns))
    return table


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


def chart_table(chart: Chart, *, notes: bool = False) -> Any:
    """The Rich table a pipe or a screen reader reads instead of the picture; with `notes`, the
    chart's notes in its caption too (where the picture that prints them is not shown beside it)."""
    from tutor.safe_text import markup_escape as escape
    from rich.table import Table

    header, rows = chart_rows(chart)
    table = Table(title=f"{escape(chart.title)} (table)", title_justify="left")
    for index, column in enumerate(header):
        table.add_column(escape(column), justify="left" if index == 0 else "right", overflow="fold")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    marks = [f"{m.label} {format_quantity(m.value, chart.y_unit)}" for m in chart.y_marks] + [
        f"{m.label} at {_x_text(chart, Point(m.value, 0))}" for m in chart.x_marks]
    caption = ["; ".join(marks)] if marks else []
    caption += list(chart.notes) if notes else []
    if caption:
        table.caption = escape("\n".join(caption))
        table.caption_justify = "left"
    return table


def print_chart(chart: Chart, console: Any) -> None:
    """The picture (coloured on a terminal, plain text in a pipe) and then its table."""
    from rich.text import Text

    width = max(40, min(console.width - 12, 100))
    picture = chart_text(chart, width=width, color=console.is_terminal and not console.no_color)
    console.print(Text.from_ansi(picture))
    console.print(chart_table(chart))


def save_svg(charts: Sequence[Chart], path: str | Path, *, width: int = 100, context: str = "") -> Path:
    """Every chart (picture and table) in one SVG file, through Rich's recording console; `context` (what
    the pictures are of: model, mode, dtype, device, date, version; tutor.export.ExportContext.line) is
    its first line, so the picture says what it shows when it travels without its CSV and JSON."""
    import io

    from rich.console import Console
    from rich.text import Text

    console = Console(record=True, width=width, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    for line in packed(context.split(" · "), width) if context else ():
        console.print(Text(line))  # a Text: a model's name is never read as markup
    for chart in charts:
        print_chart(chart, console)
    from tutor.files.storage import write_regular_text

    target = Path(path)
    try:
        write_regular_text(target, console.export_svg(title="tensor-tutor"))
    except OSError as error:
        from tutor.errors import UserError

        raise UserError(f"cannot write {target}: {error.strerror or error}") from None
    return target


def packed(parts: Sequence[str], width: int, separator: str = " · ") -> list[str]:
    """`parts` joined by `separator` into lines of at most `width` characters, a part never split
    (Rich would wrap 'tensor-tutor 0.1.0' at its space); a part longer than `width` stands alone."""
    lines: list[str] = []
    for part in parts:
        if lines and len(lines[-1]) + len(separator) + len(part) <= width:
            lines[-1] += separator + part
        else:
            lines.append(part)
    return lines


def chart_json(chart: Chart) -> dict[str, Any]:
    """A chart's data as plain JSON: its axes and units, every series' points (x, y and the x as the table
    names it), the marks and the notes; the numbers as computed or measured, not as formatted."""
    return {"title": chart.title, "x_label": chart.x_label, "x_unit": chart.x_unit, "x_log": chart.x_log,
            "y_label": chart.y_label, "y_unit": chart.y_unit,
            "series": [{"label": s.label, "points": [{"x": p.x, "y": p.y, "x_text": _x_text(chart, p)}
                                                     for p in s.points]} for s in chart.series],
            "y_marks": [{"label": m.label, "value": m.value} for m in chart.y_marks],
            "x_marks": [{"label": m.label, "value": m.value} for m in chart.x_marks],
            "notes": list(chart.notes)}


def caches_from_machine_json(machine: dict[str, Any] | None) -> list[tuple[str, int]]:
    """[("L1", bytes), ...]: the data and unified caches of a stored machine record (`env --json`'s
    cpu.caches, kept in every bench run's header), smallest first."""
    from tutor.bench.cache_sweep import levels_of_caches

    cpu = (machine or {}).get("cpu") or {}
    return levels_of_caches((cache.get("kind"), cache.get("level"), cache.get("size_bytes"))
                            for cache in cpu.get("caches") or () if isinstance(cache, dict))


def bench_charts(results: Sequence[dict[str, Any]], header: dict[str, Any] | None = None) -> list[Chart]:
    """The pictures of one bench run (its results' JSON and header): the matmul sweep, the bandwidth
    sweep, the collectives' busbw sweep (with the GPU's link when the collectives ran on GPUs)."""
    header = header or {}
    caches = caches_from_machine_json(header.get("machine")) if str(
        header.get("device_under_test") or "cpu").startswith("cpu") else []
    charts = [matmul_sweep_chart(results), bandwidth_sweep_chart(results, caches),
              collective_sweep_chart(results, collective_link(results, header))]
    return [chart for chart in charts if chart is not None]
