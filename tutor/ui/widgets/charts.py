"""Charts drawn with text: measured-against-theoretical bars and "% of peak" gauges.

Hand-drawn rather than textual-plot: every chart here compares a handful of labelled figures,
for which a horizontal bar with the number printed beside it reads better than plotted axes, and
it costs no numpy import at start-up. Numbers are always printed next to the bars, so nothing
is said by colour alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive
from textual.widget import Widget

from tutor.formatting import column_units, format_in_unit, format_percent, format_quantity

FULL, PARTIALS = "█", " ▏▎▍▌▋▊▉"


def bar_text(fraction: float, width: int) -> str:
    """A bar `fraction` (clamped to 0..1) of `width` cells, with eighth-cell resolution."""
    if width <= 0:
        return ""
    eighths = round(min(max(fraction, 0.0), 1.0) * width * 8)
    full, part = divmod(eighths, 8)
    text = FULL * full + (PARTIALS[part] if part else "")
    return text.ljust(width)


@dataclass(frozen=True)
class Comparison:
    """One labelled figure: what was measured and what theory says, in one unit."""

    label: str
    measured: float | None
    theory: float | None
    unit: str


def quantity_text(value: float, unit: str) -> str:
    """A figure with its unit the project's one way (tutor.formatting: bytes in KiB/MiB/GiB, rates
    scaled to G/T, no scientific notation)."""
    return format_quantity(value, unit)


def _number(value: float | None, scale: tuple[float, str]) -> str:
    return format_in_unit(value, scale)


KIND_WIDTH = 10  # " measured "


def comparison_lines(items: Sequence[Comparison], width: int) -> Text:
    """Two bars per item (theory, then measured). Bars of one unit share a scale, the largest
    figure of that unit filling the width; figures in different units are never compared.

    Labels are never cut: when one does not fit the label column, every item's label goes on a
    line of its own above its bars (wrapped at spaces if it must), so no row is lost and
    `128x128x128` stays whole."""
    width = max(width, 20)
    tops: dict[str, float] = {}
    for item in items:
        for value in (item.measured, item.theory):
            if value is not None and value > 0:
                tops[item.unit] = max(tops.get(item.unit, 0.0), value)
    # Every figure of a unit in one unit (the Bench table's and its export's): bars are compared by eye.
    units = column_units((value, item.unit) for item in items for value in (item.measured, item.theory))
    numbers = [_number(value, units[item.unit]) for item in items for value in (item.theory, item.measured)]
    number_width = max((len(number) for number in numbers), default=3)
    longest = max((len(item.label) for item in items), default=0)
    label_width = longest if longest <= max(width // 3, 8) else 0  # 0: labels on their own lines
    bar_width = max(width - label_width - KIND_WIDTH - 1 - number_width, 4)
    lines = Text(no_wrap=False)
    for item in items:
        top = tops.get(item.unit, 1.0)
        if not label_width:
            lines.append(item.label, style="bold")
            lines.append("\n")
        for kind, value, style in (("theory", item.theory, "blue"), ("measured", item.measured, "green")):
            if label_width:
                lines.append((item.label if kind == "theory" else "").ljust(label_width), style="bold")
            lines.append(f" {kind:>8} ", style="dim")
            if value is None:
                lines.append("N/A", style="dim")
            else:
                lines.append(bar_text(value / top, bar_width), style=style)
                lines.append(" " + _number(value, units[item.unit]))
            lines.append("\n")
    lines.rstrip()
    return lines


class ComparisonBars(Widget):
    """Measured (green) against theoretical (blue) bars, one pair per figure; as tall as its rows."""

    DEFAULT_CSS = """
    ComparisonBars { height: auto; }
    """

    items: reactive[tuple[Comparison, ...]] = reactive((), layout=True)
    """The figures drawn, in order."""

    def render(self) -> Text:
        if not self.items:
            return Text("nothing measured yet", style="dim")
        return comparison_lines(self.items, self.size.width or 60)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        if not self.items:
            return 1
        return rendered_height(comparison_lines(self.items, width or 60), width or 60)


def rendered_height(text: Text, width: int) -> int:
    """How many lines `text` takes at `width` cells once wrapped (what the widget must be tall)."""
    from rich.console import Console

    console = Console(width=max(width, 1), legacy_windows=False)
    return max(len(text.wrap(console, max(width, 1))), 1)


def gauge_text(label: str, fraction: float | None, width: int, reason: str = "", suffix: str = "of peak") -> Text:
    """'label [█████     ] 52.1 % of peak', or the reason when there is no honest percentage."""
    text = Text(label, style="bold")
    text.append(" ")
    if fraction is None:
        text.append(reason or "no theoretical peak: measured only", style="italic")
        return text
    tail = f"] {format_percent(fraction):>6} {suffix}"
    if width - text.cell_len - 1 - len(tail) < 4:  # a long label: the gauge goes on the next line
        text.append("\n")
        text.append(" " * 2)
        inner = max(width - 3 - len(tail), 4)
    else:
        inner = width - text.cell_len - 1 - len(tail)
    text.append("[")
    text.append(bar_text(fraction, inner), style="green" if fraction >= 0.5 else "yellow")
    text.append(tail)
    return text


class PeakGauge(Widget):
    """A single "% of peak" gauge; fraction None shows the reason instead of a number."""

    DEFAULT_CSS = """
    PeakGauge { height: auto; }
    """

    fraction: reactive[float | None] = reactive(None)
    """measured / peak, at most 1, or None."""

    def __init__(self, label: str, fraction: float | None = None, reason: str = "", *,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.label = label
        self.reason = reason
        self.fraction = fraction

    def render(self) -> Text:
        return gauge_text(self.label, self.fraction, self.size.width or 60, self.reason)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return rendered_height(gauge_text(self.label, self.fraction, width or 60, self.reason), width or 60)
