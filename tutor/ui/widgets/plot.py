"""The app's picture of a `tutor.answers.pictures.Chart`: textual-plot's PlotWidget (high-resolution braille
lines from textual-hires-canvas), and under it the same chart as a table (tutor.answers.pictures.chart_table)
for screen readers and for a terminal too small to draw in. `t` switches the picture off and on.

The picture is still: textual-plot's keyboard pan and zoom (arrows, +/-, `r` to reset) are off until
the learner asks for them with `z` on a focused chart, so the arrows scroll the screen and `r` keeps
the screen's meaning (Bench: run). Its mouse pan and zoom stay off (allow_pan_and_zoom=False).

The widget renders what it is given; the chart's figures were measured or computed elsewhere.
A logarithmic x axis is drawn as log10(x) with tick labels in the chart's own units (textual-plot
has no log axis of its own). Both axes carry their unit: the y axis is labelled with it ("GFLOP/s"),
the x axis with its quantity and unit ("matrix size n", "moment"; a byte axis's ticks read "32 KiB").

The legend is a line under the picture, not textual-plot's box inside it: a box in a corner of the
data area covered the curves wherever they reached that corner (the Fit timeline's peak, under a
legend of eight rows), and no corner is free for every chart. Axis labels and ticks are in the
theme's text colours ($text, $text-muted: WCAG AA on every built-in theme), not textual-plot's
$primary and $secondary (1.9:1 on the dark theme).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Static
from textual.geometry import Region
from rich.markup import escape
from rich.text import Text
from textual_plot import HiResMode, PlotWidget
from textual_plot import plot_widget as textual_plot
from textual_plot.axis_formatter import AxisFormatter, NumericAxisFormatter

from tutor.formatting import format_bytes, format_number
from tutor.answers.pictures import Chart, Mark, chart_table

SERIES_STYLES = ("green", "cyan", "magenta", "yellow", "bright_blue", "bright_red")
MARK_STYLES = ("red", "blue", "bright_magenta")  # not white: a light theme's background
X_MARK_STYLE = "bright_black"
LINE_MARKER, X_MARK_MARKER = "⠒⠒⠒", " │ "  # the legend's samples: a braille line, a vertical line


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


def usable_span(low: float, high: float) -> bool:
    """Whether [low, high] can be an axis: finite, increasing, and wide enough against its magnitude
    for textual-plot's mapping (it divides by high - low) and its ticks (log10 of a fifth of it)."""
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return False
    return high - low > max(abs(low), abs(high)) * 1e-9


def widened(low: float, high: float) -> tuple[float, float]:
    """[low, high] made usable as an axis: one value (a single point) gets a margin each side of it."""
    if usable_span(low, high):
        return low, high
    if not (math.isfinite(low) and math.isfinite(high)):
        return 0.0, 1.0
    centre = (low + high) / 2
    margin = max(abs(centre) * 0.05, 0.5)
    return centre - margin, centre + margin


PAN_AND_ZOOM_ACTIONS = frozenset({"zoom_in", "zoom_out", "zoom_x_in", "zoom_x_out", "zoom_y_in", "zoom_y_out",
                                  "pan_left", "pan_right", "pan_up", "pan_down", "reset_scales"})


class ChartPlot(PlotWidget, inherit_bindings=False):
    """textual-plot's PlotWidget, still until asked: its pan and zoom keys act only after `z` (again: off);
    until then check_action turns them down and the key goes on to the chart's boxes (the arrows scroll
    the screen, `r` is the screen's). And whatever the keys or a program ask, the axes never collapse:
    textual-plot divides by each axis's span and by the drawn area's size, and a zero one (a chart not
    drawn yet, a zoom to a point) raised ZeroDivisionError inside a key press."""

    ZOOM_KEYS_GROUP = Binding.Group("Zoom")
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("z", "toggle_zoom_keys", "Zoom keys"),
        Binding("plus", "zoom_in", "Zoom in", group=ZOOM_KEYS_GROUP),
        Binding("minus", "zoom_out", "Zoom out", group=ZOOM_KEYS_GROUP),
        Binding("left", "pan_left", "Pan", group=PlotWidget.PAN_GROUP),
        Binding("right", "pan_right", "Pan", group=PlotWidget.PAN_GROUP),
        Binding("up", "pan_up", "Pan", group=PlotWidget.PAN_GROUP),
        Binding("down", "pan_down", "Pan", group=PlotWidget.PAN_GROUP),
        Binding("0", "reset_scales", "Reset zoom"),
    ]

    def __init__(self) -> None:
        super().__init__(allow_pan_and_zoom=False)
        self.zoom_keys = False
        """True once the learner pressed `z` on this chart: the pan and zoom keys act."""

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in PAN_AND_ZOOM_ACTIONS:
            return self.zoom_keys
        return super().check_action(action, parameters)

    def action_toggle_zoom_keys(self) -> None:
        self.zoom_keys = not self.zoom_keys
        if not self.zoom_keys:
            self.action_reset_scales()  # back to the whole chart, as drawn
        self.refresh_bindings()
        self.notify("zoom keys on: arrows pan, + and - zoom, 0 resets, z again turns them off"
                    if self.zoom_keys else "zoom keys off: the whole chart again", timeout=4)

    # ---- geometry that cannot divide by zero --------------------------------------------------------

    def _drawn(self) -> bool:
        """Whether the chart has been laid out and drawn (its data area has a size to pan by)."""
        return self._scale_rectangle.width > 0 and self._scale_rectangle.height > 0

    def set_xlimits(self, xmin: float | None = None, xmax: float | None = None) -> None:
        if xmin is not None and xmax is not None:
            xmin, xmax = widened(xmin, xmax)
        super().set_xlimits(xmin, xmax)

    def set_ylimits(self, ymin: float | None = None, ymax: float | None = None) -> None:
        if ymin is not None and ymax is not None:
            ymin, ymax = widened(ymin, ymax)
        super().set_ylimits(ymin, ymax)

    def _zoom(self, center_x: float, center_y: float, factor: float, zoom_x: bool, zoom_y: bool) -> None:
        """textual-plot's zoom, refused (nothing changes) where it would leave an axis unusable."""
        if 1 + factor == 0:
            return
        if zoom_x and not usable_span((self._x_min + factor * center_x) / (1 + factor),
                                      (self._x_max + factor * center_x) / (1 + factor)):
            return
        if zoom_y and not usable_span((self._y_min + factor * center_y) / (1 + factor),
                                      (self._y_max + factor * center_y) / (1 + factor)):
            return
        super()._zoom(center_x, center_y, factor, zoom_x, zoom_y)

    def _pan(self, factor_x: float, factor_y: float) -> None:
        """textual-plot's pan (by pixels of the drawn area): nothing before the chart is drawn, and
        nothing where it would leave an axis unusable."""
        if not self._drawn():
            return
        limits = self._x_min, self._x_max, self._y_min, self._y_max
        super()._pan(factor_x, factor_y)
        if not (usable_span(self._x_min, self._x_max) and usable_span(self._y_min, self._y_max)):
            self._x_min, self._x_max, self._y_min, self._y_max = limits
            self._rerender()

    def _limits(self) -> tuple[float, float, float, float]:
        return (*widened(self._x_min, self._x_max), *widened(self._y_min, self._y_max))

    def get_pixel_from_coordinate(self, x: float, y: float) -> tuple[int, int]:  # type: ignore[override]
        return textual_plot.map_coordinate_to_pixel(x, y, *self._limits(), region=self._scale_rectangle)

    def get_hires_pixel_from_coordinate(self, x: float, y: float) -> tuple[float, float]:  # type: ignore[override]
        px, py = textual_plot.map_coordinate_to_hires_pixel(x, y, *self._limits(), region=self._scale_rectangle)
        return float(px), float(py)

    def get_coordinate_from_pixel(self, x: int, y: int) -> tuple[float, float]:
        region = self._scale_rectangle
        region = Region(region.x, region.y, max(region.width, 1), max(region.height, 1))
        return textual_plot.map_pixel_to_coordinate(x, y, *self._limits(), region=region)


class ChartView(Vertical):
    """One chart: the picture over its table."""

    DEFAULT_CSS = """
    ChartView { height: auto; }
    ChartView ChartPlot { height: 16; }
    ChartView .chart-legend { height: auto; padding: 0 0 0 2; }
    ChartView .chart-table { height: auto; }
    ChartView.table-only ChartPlot, ChartView.table-only .chart-legend { display: none; }
    ChartView ChartPlot > .plot--axis { color: $text-muted; }
    ChartView ChartPlot > .plot--tick { color: $text-muted; text-style: none; }
    ChartView ChartPlot > .plot--label { color: $text; text-style: bold; }
    """
    BINDINGS = [Binding("t", "toggle_picture", "Picture/table")]

    chart: reactive[Chart | None] = reactive(None, init=False)

    def __init__(self, chart: Chart | None = None, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._initial = chart

    def compose(self) -> ComposeResult:
        yield Static(classes="chart-title")
        yield ChartPlot()
        yield Static(classes="chart-legend")
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
        plot = self.query_one(ChartPlot)
        plot.clear()
        title = self.query_one(".chart-title", Static)
        table = self.query_one(".chart-table", Static)
        legend = self.query_one(".chart-legend", Static)
        if chart is None or not chart.series:
            title.update("")
            table.update("")
            legend.update("")
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
                plot.add_v_line(x, line_style=X_MARK_STYLE, label=mark.label)
        top = max([p.y * y_factor for s in chart.series for p in s.points] + [m.value * y_factor for m in chart.y_marks])
        plot.set_ylimits(0, top * 1.05 if top > 0 else 1.0)
        plot.set_xlimits(low, high)
        # textual-plot centres the y label over the axis in a 10-cell margin: the unit alone fits there
        # ("GFLOP/s"), the chart's title above names the quantity. Its labels are markup: escaped.
        plot.set_ylabel(escape(y_unit or chart.y_label))
        # A log axis's ticks carry the unit themselves ("32 KiB"); a plain number's axis names it.
        plot.set_xlabel(escape(axis_title(chart.x_label, "" if chart.x_log and chart.x_unit == "B" else x_unit)))
        if chart.x_log:
            plot.set_x_formatter(_LogAxis(chart.x_unit))
        else:
            plot.set_x_formatter(NumericAxisFormatter())
        plot.show_legend(is_visible=False)  # under the picture instead: see the module's docstring
        drawn = [mark for mark in chart.x_marks if low <= self._x(chart, mark.value * x_factor) <= high]
        legend.update(legend_text(chart, drawn))
        table.update(chart_table(chart, notes=True))  # the plot widget does not draw them

    @staticmethod
    def _x(chart: Chart, x: float) -> float:
        return math.log10(x) if chart.x_log and x > 0 else x


def axis_title(label: str, unit: str) -> str:
    """An axis named with its unit: ('throughput', 'GFLOP/s') -> 'throughput (GFLOP/s)'; a label that is
    the unit itself stays as it is."""
    if not unit or unit == label:
        return label or unit
    return f"{label} ({unit})" if label else unit


def legend_text(chart: Chart, x_marks: Sequence[Mark] = ()) -> Text:
    """The legend under a chart: each series and peak line with a sample of its line in its colour,
    then the vertical marks drawn; entries three spaces apart, wrapping at the widget's width. The
    labels come from data (a dtype, a cache's name): a Text, never markup."""
    entries = [(LINE_MARKER, SERIES_STYLES[i % len(SERIES_STYLES)], s.label) for i, s in enumerate(chart.series)]
    entries += [(LINE_MARKER, MARK_STYLES[i % len(MARK_STYLES)], m.label) for i, m in enumerate(chart.y_marks)]
    entries += [(X_MARK_MARKER, X_MARK_STYLE, m.label) for m in x_marks]
    text = Text()
    for index, (marker, style, label) in enumerate(entries):
        if index:
            text.append("   ")
        text.append(marker, style=style)
        text.append(f" {label}")
    return text
