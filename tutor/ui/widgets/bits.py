"""The bits block: type a value, see how every float format stores it, confirm with a real torch cast."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.message import Message
from textual.widgets import Button, Input, Static

from tutor.formatting import format_number
from tutor.theory import formats
from tutor.ui.widgets.block import LessonBlock
from tutor.ui.workers import yield_cpu_to_the_interface

if TYPE_CHECKING:
    from tutor.lessons.model import Bits
    from tutor.ui.services import Services


def float_formats() -> tuple[str, ...]:
    """Every float format tutor.theory.formats knows, in its registry order."""
    return tuple(name for name, fmt in formats.FORMATS.items() if fmt.family == "float")


def short(value: float) -> str:
    """A stored value with enough digits to see the rounding."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "-inf" if value < 0 else "inf"
    return format_number(value, digits=7)


def flags(encoding: formats.Encoding) -> str:
    """Why a stored value differs from plain rounding: overflow, saturation, underflow, subnormal."""
    words = []
    if encoding.overflowed:
        words.append("overflow")
    if encoding.saturated:
        words.append("saturated to max")
    if encoding.underflowed:
        words.append("underflow to 0")
    if encoding.kind == formats.Kind.SUBNORMAL:
        words.append("subnormal")
    return ", ".join(words)


def encodings(value: str, names: Sequence[str]) -> list[formats.Encoding]:
    """encode(value) in each format; raises UserError for text that is not a number."""
    return [formats.encode(value, name) for name in names]


def _same_value(theory: float, cast: float) -> bool:
    if math.isnan(theory) or math.isnan(cast):
        return math.isnan(theory) and math.isnan(cast)
    return theory == cast


def unsaturated(encoding: formats.Encoding) -> formats.Encoding | None:
    """The same input without saturation, where the theory's default saturated it (fp8-e4m3's
    overflow: torch builds before pytorch/pytorch#178817, 2.11 among them, cast it to NaN); else None."""
    if not encoding.saturated:
        return None
    value = encoding.input_value if encoding.input_value is not None else encoding.input_float
    return formats.encode(value, encoding.format, saturate=False)


def torch_agrees(encoding: formats.Encoding, cast: float | None) -> bool | None:
    """Whether torch stored the same value as the theory (NaN equals NaN here), in the overflow mode this
    torch casts with (see `unsaturated`); None if not cast."""
    if cast is None:
        return None
    if _same_value(encoding.value_float, cast):
        return True
    other = unsaturated(encoding)
    return other is not None and _same_value(other.value_float, cast)


def without_saturation(encoding: formats.Encoding, cast: float | None) -> bool:
    """True when torch agrees only in the non-saturating mode: it stored NaN where the theory clamps."""
    return (cast is not None and not _same_value(encoding.value_float, cast)
            and bool(torch_agrees(encoding, cast)))


def check_text(encoding: formats.Encoding, torch_values: dict[str, float] | None) -> Text:
    """The last column: torch's verdict on this row when cast, else the row's flags."""
    if torch_values is None:
        return Text(flags(encoding), style="yellow")
    agrees = torch_agrees(encoding, torch_values.get(encoding.format.name))
    if agrees is None:
        return Text("no dtype", style="dim")
    if agrees and without_saturation(encoding, torch_values[encoding.format.name]):
        return Text("✓ NaN: this torch does not saturate", style="green")
    if agrees:
        return Text("✓ same", style="green")
    return Text(f"✗ {short(torch_values[encoding.format.name])}", style="red")


def bits_text(encoding: formats.Encoding) -> Text:
    """Sign (red), exponent (blue) and mantissa (green) bits, a space between the fields."""
    return Text.assemble((encoding.sign_string, "bold red"), " ", (encoding.exponent_string, "bold blue"), " ",
                         (encoding.mantissa_string, "green"))


def encoding_table(rows: Sequence[formats.Encoding], torch_values: dict[str, float] | None = None, *,
                   last_column: bool = True, bits_column: bool = True) -> Table:
    """One row per format: coloured sign/exponent/mantissa bits (with `bits_column`), stored value,
    relative error, and (with `last_column`) torch's verdict or the flags."""
    table = Table(box=None, show_edge=False, pad_edge=False, header_style="bold", padding=(0, 1))
    table.add_column("format", no_wrap=True)
    if bits_column:
        table.add_column("sign exponent mantissa", no_wrap=True)
    table.add_column("stored", justify="right", no_wrap=True)
    table.add_column("rel.err", justify="right", no_wrap=True)
    if last_column:
        table.add_column("torch" if torch_values is not None else "", no_wrap=True)
    for encoding in rows:
        fmt = encoding.format
        rel = encoding.rel_error
        rel_text = "-" if rel is None else format_number(float(rel), digits=2)
        cells: list[str | Text] = [fmt.name, *([bits_text(encoding)] if bits_column else []), short(encoding.value_float), rel_text]
        if last_column:
            cells.append(check_text(encoding, torch_values))
        table.add_row(*cells)
    return table


class EncodingView:
    """The encoding table where it fits; in a narrower block (beside the live pane) the torch
    verdicts and flags move under the table, one line per format, instead of being squeezed out."""

    def __init__(self, rows: Sequence[formats.Encoding], torch_values: dict[str, float] | None = None) -> None:
        self.rows, self.torch_values = list(rows), torch_values

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        full = encoding_table(self.rows, self.torch_values)
        natural = console.measure(full, options=options.update_width(10_000)).maximum  # unclamped
        if natural <= options.max_width:
            yield full
            return
        narrower = encoding_table(self.rows, self.torch_values, last_column=False)
        if console.measure(narrower, options=options.update_width(10_000)).maximum <= options.max_width:
            yield narrower
        else:  # not even the bits fit beside the figures (fp32's 32 bits at 80 columns): bits below
            yield encoding_table(self.rows, self.torch_values, last_column=False, bits_column=False)
            yield Text("sign exponent mantissa", style="bold")
            width = max(len(encoding.format.name) for encoding in self.rows)
            for encoding in self.rows:
                yield Text.assemble(f"  {encoding.format.name:<{width}} ", bits_text(encoding))
        notes = [(encoding.format.name, check_text(encoding, self.torch_values)) for encoding in self.rows]
        notes = [(name, text) for name, text in notes if text.plain]
        if notes:
            title = "torch" if self.torch_values is not None else "notes"
            yield Text(title, style="bold")
            for name, text in notes:
                yield Text.assemble(f"  {name}: ", text)


class BitsBlock(LessonBlock["Bits"]):
    """```bits: a number-format explorer bound to tutor.theory.formats."""

    TITLE = "Bits of a number"
    HELP = """\
## Bits block

Type any number (`0.1`, `65504`, `1e-8`, `3.4e38`) and press **Enter**: every row shows how
one format stores it, sign (red), exponent (blue) and mantissa (green) bits, the value actually
stored, and the relative rounding error.

*Confirm with torch* casts the same number with PyTorch on this machine and checks that the
hardware stores exactly what the theory says (the first use loads torch: a few seconds).
"""

    class Cast(Message):
        """torch finished casting `value` (or failed with `error`)."""

        def __init__(self, value: str, cast: dict[str, float] | None, error: str | None = None) -> None:
            super().__init__()
            self.value, self.cast, self.error = value, cast, error

    def __init__(self, block: Bits, *, lesson_id: str, services: Services, done: bool = False,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(block, lesson_id=lesson_id, services=services, done=done, id=id, classes=classes)
        names = block.formats or float_formats()
        self.format_names = tuple(formats.format_by_name(name).name for name in names)

    def compose(self) -> ComposeResult:
        with Horizontal(classes="row"):
            yield Input(value=str(self.block.value), placeholder="a number, e.g. 0.1", id="value")
            yield Button("Confirm with torch", id="torch")
        yield Static(id="table")
        yield Static(id="status", classes="status")

    def on_mount(self) -> None:
        self.show(self.query_one("#value", Input).value)

    def show(self, value: str, torch_values: dict[str, float] | None = None) -> bool:
        """Draw the table for `value`; False (and a one-line reason) when it is not a number."""
        status = self.query_one("#status", Static)
        try:
            rows = encodings(value, self.format_names)
        except ValueError as error:
            status.set_classes("error")
            status.update(str(error))
            return False
        status.set_classes("status")
        self.query_one("#table", Static).update(EncodingView(rows, torch_values))
        if torch_values is not None:
            same = sum(bool(torch_agrees(e, torch_values.get(e.format.name))) for e in rows)
            cast = sum(e.format.name in torch_values for e in rows)
            unclamped = [e.format.name for e in rows if without_saturation(e, torch_values.get(e.format.name))]
            mode = (f" ({', '.join(unclamped)}: without saturation, as this torch casts overflow)"
                    if unclamped else "")
            status.update(f"torch stored {same} of {cast} castable formats exactly as the theory says{mode}")
        else:
            status.update("Enter: show this value   Confirm with torch: cast it for real")
        return True

    @on(Input.Submitted, "#value")
    def _submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.show(event.value):
            self.complete()

    @on(Button.Pressed, "#torch")
    def _confirm(self, event: Button.Pressed) -> None:
        event.stop()
        value = self.query_one("#value", Input).value
        if not self.show(value):
            return
        self.query_one("#status", Static).update("casting with torch… (the first cast loads torch)")
        self._cast(value)

    @work(thread=True, exclusive=True, group="torch-cast", exit_on_error=False)
    def _cast(self, value: str) -> None:
        yield_cpu_to_the_interface()  # the first cast imports torch (seconds of CPU)
        try:
            cast = self.services.torch_cast(value, self.format_names)
        except Exception as error:  # no torch, or an odd value: a line in the block, not a crash
            self.post_message(self.Cast(value, None, f"torch cast failed: {type(error).__name__}: {error}"))
        else:
            self.post_message(self.Cast(value, cast))

    @on(Cast)
    def _cast_done(self, message: Cast) -> None:
        message.stop()
        if message.error is not None:
            status = self.query_one("#status", Static)
            status.set_classes("error")
            status.update(message.error)
            return
        self.show(message.value, message.cast)
        self.complete()
