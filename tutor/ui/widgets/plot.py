"""The app's picture of a `tutor.plots.Chart`: textual-plot's PlotWidget (high-resolution braille
lines from textual-hires-canvas), and under it the same chart as a table (tutor.plots.chart_table)
for screen readers and for a terminal too small to draw in. `t` switches the picture off and on.

The widget renders what it is given; the chart's figures were measured or computed elsewhere.
A logarithmic x axis is drawn as log10(x) with tick labels in the chart's own units (textual-plot
has no log axis of its own).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Static
from textual_plot import HiResMode, LegendLocation, PlotWidget
from textual_plot.axis_formatter import AxisFormatter, NumericAxisFormatter

from tutor.formatting import format_bytes, format_number
from tutor.plots import Chart, chart_table

SERIES_STYLES = ("green", "cyan", "magenta", "yellow", "bright_blue", "bright_red")
MARK_STYLES = ("red", "bright_white", "bright_magenta")


class _LogAxis(AxisFormatter):
    """Ticks at powers of two of x (the axis holds log10 x), as many as fit, labelled in the chart's
    units: 1 KiB, 32 KiB, 1 MiB, ... line up with cache sizes; 128, 256, 512, ... with matrix sides."""

    def __init__(self, unit: str) -> None:
        self.unit = unit

    def get_ticks(self, min_: float, max_: float, max_ticks: int = 8) -> list[float]:
        low, high = math.ceil(min_ / math.log10(2)), math.floor(max_ / math.log10(2))
        step = 1
        while (high - low) // step + 1 > max(max_ticks, 1):
            step += 1
        first = -(-low // step) * step
        return [k * math.log10(2) for k in range(first, high + 1, step)] or [min_]

    def get_labels_for_ticks(self, ticks: Sequence[float]) -> list[str]:
        values = [round(10 ** t) for t in ticks]
        if self.unit == "B":
            return [format_bytes(value) for value in values]
        return [format_number(value) for value in values]


class ChartView(Vertical):
    """One chart: the picture over its table."""

    DEFAULT_CSS = """
    ChartView { height: auto; }
    ChartView PlotWidget { height: 16; }
    ChartView .chart-table { height: auto; }
    ChartView.table-only PlotWidget { display: none; }
    """
    BINDINGS = [Binding("t", "toggle_picture", "Picture/table")]

    chart: reactive[Chart | None] = reactive(None, init=False)

    def __init__(self, chart: Chart | None = None, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._initial = chart

    def compose(self) -> ComposeResult:
        yield Static(classes="chart-title")
        yield PlotWidget(allow_pan_and_zoom=False)
        yield Static(classes="chart-table")

    def on_mount(self) -> None:
        self.display = self._initial is not None  # no chart, no room taken
        if self._initial is not None:
            self.chart = self._initial

    def watch_chart(self, chart: Chart | None) -> None:
        self.display = chart is not None and bool(chart.series)
        # After the next refresh: the plot's canvas has its final size only once laid out.
        self.call_after_refresh(self.draw, chart)

    def action_toggle_picture(self) -> None:
        self.toggle_class("table-only")

    def draw(self, chart: Chart | None) -> None:
        plot = self.query_one(PlotWidget)
        plot.clear()
        title = self.query_one(".chart-title", Static)
        table = self.query_one(".chart-table", Static)
        if chart is None or not chart.series:
            title.update("")
            table.update("")
            self.display = False
            return
        self.display = True
        y_factor, y_unit = chart.y_scale()
        # A log axis keeps x in its own units (the tick labels format 10**tick); a linear one is rescaled.
        x_factor, x_unit = (1.0, chart.x_unit) if chart.x_log else chart.x_scale()
        title.update(f"{chart.title} ({y_unit})")
        xs_all: list[float] = []
        for index, series in enumerate(chart.series):
            xs = [self._x(chart, p.x * x_factor) for p in series.points]
            xs_all.extend(xs)
            plot.plot(xs, [p.y * y_factor for p in series.points], line_style=SERIES_STYLES[index % len(SERIES_STYLES)],
                      hires_mode=HiResMode.BRAILLE, label=series.label)
        low, high = min(xs_all), max(xs_all)
        for index, mark in enumerate(chart.y_marks):
            plot.plot([low, high], [mark.value * y_factor] * 2, line_style=MARK_STYLES[index % len(MARK_STYLES)],
                      hires_mode=HiResMode.BRAILLE, label=mark.label)
        for mark in chart.x_marks:
            x = self._x(chart, mark.value * x_factor)
            if low <= x <= high:
                plot.add_v_line(x, line_style="bright_black", label=mark.label)
        top = max([p.y * y_factor for s in chart.series for p in s.points] + [m.value * y_factor for m in chart.y_marks])
        plot.set_ylimits(0, top * 1.05 if top > 0 else 1.0)
        plot.set_xlimits(low, high)
        plot.set_ylabel(y_unit)
        plot.set_xlabel(f"{chart.x_label}" + (f" ({x_unit})" if x_unit and not chart.x_log else ""))
        if chart.x_log:
            plot.set_x_formatter(_LogAxis(chart.x_unit))
        else:
            plot.set_x_formatter(NumericAxisFormatter())
        plot.show_legend(self._legend_corner(chart))
        table.update(chart_table(chart, notes=True))  # the plot widget does not draw them

    @staticmethod
    def _legend_corner(chart: Chart) -> LegendLocation:
        """The chart's own corner when it names one; else the top corner the curves leave free: top left
        when they rise to the right (throughput grows with size), top right when they fall (bandwidth
        past each cache)."""
        corners = {"top left": LegendLocation.TOPLEFT, "top right": LegendLocation.TOPRIGHT}
        if chart.legend_corner in corners:
            return corners[chart.legend_corner]
        rising = sum(1 if s.points[-1].y >= s.points[0].y else -1 for s in chart.series if s.points)
        return LegendLocation.TOPLEFT if rising > 0 else LegendLocation.TOPRIGHT

    @staticmethod
    def _x(chart: Chart, x: float) -> float:
        return math.log10(x) if chart.x_log and x > 0 else x
