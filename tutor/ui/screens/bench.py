"""The Bench screen: `tensor-tutor bench --quick` inside the app, with bars and "% of peak" gauges.

The suite runs in a thread worker (torch is imported there, on the first run); Escape cancels it
at the next iteration and keeps what finished. Results go to the same notebook as the CLI's.
"""

from __future__ import annotations

import threading
from typing import Any

from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Button, Footer, ProgressBar, Static

from tutor.ui.widgets.charts import Comparison, ComparisonBars, PeakGauge
from tutor.ui.widgets.device_header import DeviceHeader, device_title
from tutor.ui.widgets.live_pane import LivePane
from tutor.ui.widgets.measure import format_value
from tutor.ui.workers import yield_cpu_to_the_interface


def rows_table(rows: Any) -> Table:
    table = Table(expand=True, box=None, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("figure", no_wrap=True)
    table.add_column("measured", justify="right", no_wrap=True)
    table.add_column("peak", justify="right", no_wrap=True)
    table.add_column("why the gap", ratio=1)
    for row in rows:
        table.add_row(row.label, format_value(row.measured, row.unit), format_value(row.peak, row.unit),
                      Text(row.note, style="dim"))
    return table


class BenchScreen(Screen):
    """Run the quick benchmark suite and read every figure against this machine's datasheet."""

    CSS_PATH = "bench.tcss"
    HELP = """\
## Bench

Measures this machine the way `tensor-tutor bench --quick` does: matmul throughput in FP32,
BF16 and FP16 (TFLOP/s) and STREAM-like memory bandwidth (GB/s), in about 20 seconds.

- **r** (or *Run*) starts it, **Escape** cancels it (what finished is kept) or goes home.
- Blue bars are the theoretical peak, green bars the measurement; the gauges say what
  fraction of the peak was reached. A CPU has no published memory peak: measured only.
Every run is saved to the results notebook (`tensor-tutor bench history`).
"""

    BINDINGS = [
        Binding("r", "run", "Run"),
        Binding("escape", "escape", "Cancel/Home"),
    ]

    running = reactive(False)
    """True while the suite runs."""

    class Progress(Message):
        def __init__(self, fraction: float, text: str) -> None:
            super().__init__()
            self.fraction, self.text = fraction, text

        def can_replace(self, message: Message) -> bool:
            return isinstance(message, BenchScreen.Progress)

    class Finished(Message):
        def __init__(self, outcome: Any | None, error: str | None = None) -> None:
            super().__init__()
            self.outcome, self.error = outcome, error

    def __init__(self, services: Any) -> None:
        super().__init__()
        self.services = services
        self._cancel = threading.Event()
        self.device = "cpu"

    def compose(self) -> ComposeResult:
        yield DeviceHeader(device_title(self.services.machine), "Bench")
        with Horizontal(id="bench-body"):
            with VerticalScroll(id="bench"):
                with Horizontal(classes="row"):
                    yield Button("Run", id="run", variant="primary")
                    yield ProgressBar(total=100, show_eta=False, id="progress")
                yield Static("r runs the quick suite (~20 s): matmul fp32/bf16/fp16 and memory bandwidth",
                             id="status")
                yield ComparisonBars(id="bars")
                yield VerticalScroll(id="gauges")
                yield Static(id="table")
            yield LivePane(self.services.machine, self.services.sampler, id="live")
        yield Footer()

    def action_run(self) -> None:
        if self.running:
            return
        active = getattr(self.app, "active_runner", None)
        if active is not None:
            active.cancel()
        self._cancel = threading.Event()
        self.running = True
        self.query_one("#progress", ProgressBar).update(total=100, progress=0)
        self.query_one("#status", Static).update("starting… (Escape cancels; the first run loads torch)")
        self._run(self._cancel)

    @on(Button.Pressed, "#run")
    def _pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.action_run()

    @work(thread=True, exclusive=True, group="bench", exit_on_error=False, description="Benchmark suite")
    def _run(self, cancel: threading.Event) -> None:
        yield_cpu_to_the_interface()

        def progress(fraction: float, text: str) -> None:
            self.post_message(self.Progress(fraction, text))

        try:
            outcome = self.services.run_bench(progress, cancel)
        except Exception as error:  # shown on the screen, never a traceback
            detail = str(error).splitlines()[0] if str(error) else type(error).__name__
            self.post_message(self.Finished(None, detail))
        else:
            self.post_message(self.Finished(outcome))

    @on(Progress)
    def _progress(self, message: Progress) -> None:
        self.query_one("#progress", ProgressBar).update(progress=max(0.0, min(message.fraction, 1.0)) * 100)
        self.query_one("#status", Static).update(f"{message.text} (Escape cancels)")

    @on(Finished)
    def _finished(self, message: Finished) -> None:
        self.running = False
        status = self.query_one("#status", Static)
        if message.error is not None:
            status.update(Text(f"the benchmark failed: {message.error}", style="red"))
            return
        outcome = message.outcome
        self.query_one("#progress", ProgressBar).update(progress=100)
        words = "cancelled: these are the cases that finished" if outcome.cancelled else "done"
        failures = "; ".join(outcome.failures)
        status.update(f"{words} on {outcome.device}" + (f" (problems: {failures})" if failures else ""))
        self.device = outcome.device
        self.show_rows(outcome.rows)

    def show_rows(self, rows: Any) -> None:
        """Bars, gauges and the table for a finished run."""
        self.query_one("#bars", ComparisonBars).items = tuple(
            Comparison(row.label, row.measured, row.peak, row.unit) for row in rows)
        gauges = self.query_one("#gauges", VerticalScroll)
        gauges.remove_children()
        gauges.mount_all(PeakGauge(row.label, row.fraction, reason=self.no_percent_reason(row))
                         for row in rows if row.peak is not None)
        unknown = [row.label for row in rows if row.peak is None]
        if unknown:
            gauges.mount(Static(Text(f"no published peak, measured only: {', '.join(unknown)}", style="dim")))
        self.query_one("#table", Static).update(rows_table(rows))

    def no_percent_reason(self, row: Any) -> str:
        """Why a row above its peak has no percentage: the clock its peak assumed must be wrong
        (tutor.theory.peaks.explain_efficiency)."""
        from tutor.theory.peaks import explain_efficiency

        try:
            clock = self.services.machine.peak_clock_hz(self.device)
        except Exception:  # an odd device name: explain without the clock
            clock = None
        return explain_efficiency(row.measured, row.peak, assumed_clock_hz=clock).summary

    def cancel(self) -> None:
        """Stop the suite at its next iteration (used by Escape, leaving and quitting)."""
        if self.running:
            self._cancel.set()
            self.query_one("#status", Static).update("cancelling…")

    def action_escape(self) -> None:
        if self.running:
            self.cancel()
        else:
            self.app.action_home()

    def on_unmount(self) -> None:
        self._cancel.set()
