"""The Bench screen: `tensor-tutor bench --quick` inside the app, with bars and "% of peak" gauges,
and the results notebook's history (the CLI's runs too): pick a run to show it, mark two to compare.

The suite runs in a thread worker (torch is imported there, on the first run); Escape cancels it
at the next iteration and keeps what finished. Results go to the same notebook as the CLI's.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Button, OptionList, ProgressBar, Static
from textual.widgets.option_list import Option

from tutor.bench.notebook import Notebook, Run, compare_runs_at_same_sizes, read_notebook
from tutor.export import bench_units
from tutor.formatting import format_in_unit, format_quantity
from tutor.ui.host import tutor_app
from tutor.worker.jobs import BenchOutcome, BenchRow, bench_rows

from tutor.ui.widgets.charts import Comparison, ComparisonBars, PeakGauge
from tutor.ui.widgets.device_header import DeviceHeader, device_label, device_title
from tutor.ui.widgets.live_pane import LivePane
from tutor.ui.workers import yield_cpu_to_the_interface
from tutor.ui.widgets.footer import TutorFooter

if TYPE_CHECKING:
    from tutor.ui.services import Services


def rows_table(rows: Any) -> Table:
    table = Table(expand=True, box=None, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("figure", no_wrap=True)
    table.add_column("measured", justify="right", no_wrap=True)
    table.add_column("peak", justify="right", no_wrap=True)
    table.add_column("which figure; why the gap", ratio=1)
    units = bench_units(rows)  # one unit per column: the export's header names the same one
    for row in rows:
        scale = units[row.unit]
        table.add_row(row.label, format_in_unit(row.measured, scale), format_in_unit(row.peak, scale),
                      Text.assemble(row.statistic, ("; " if row.statistic and row.note else ""), (row.note, "dim")))
    return table


def rows_from_run(run: Run) -> tuple[BenchRow, ...]:
    """The Bench screen's rows for a stored run: the same rows (bench_rows) a live run gets, from each
    case's one headline (tutor.bench.record)."""
    return bench_rows(run.cases)


def run_date(run: Run) -> str:
    """'2025-01-12 10:00' from the header's ISO date (seconds and zone dropped: the list is for people)."""
    return run.date.replace("T", " ")[:16]


def run_figures(run: Run) -> str:
    """The headline figures of a run in one line, each labelled: 'fp32 131 GFLOP/s (median of 9 at 1024²), ...'."""
    return ", ".join(figure.text() for figure in run.figures()) or "no figures"


def comparison_text(before: Run, after: Run) -> Text:
    """Run B against run A, case by case, at the same sizes only; the cases measured at different sizes
    named with both sizes (throughput grows with the size, so their ratio would measure the size)."""
    same, differ = compare_runs_at_same_sizes(before, after)
    table = Table(expand=True, box=None, show_edge=False, pad_edge=False, header_style="bold",
                  title=f"run {after.number} against run {before.number}", title_justify="left")
    table.add_column("case", ratio=1)
    table.add_column(f"run {before.number}", justify="right", no_wrap=True)
    table.add_column(f"run {after.number}", justify="right", no_wrap=True)
    table.add_column("ratio", justify="right", no_wrap=True)
    for row in same:
        table.add_row(f"{row.case} ({row.statistic})", format_quantity(row.before, row.unit),
                      format_quantity(row.after, row.unit), format_quantity(row.ratio, "x"))
    parts: list[Any] = [table] if same else [Text(f"run {after.number} against run {before.number}: no case was "
                                                    "measured at the same size in both", style="yellow")]
    for mismatch in differ:
        parts.append(Text(f"not compared, sizes differ: {mismatch.case} ({mismatch.before_size} in run "
                          f"{before.number}, {mismatch.after_size} in run {after.number})", style="yellow"))
    from rich.console import Group

    return Group(*parts)  # type: ignore[return-value]


class BenchScreen(Screen):
    """Run the quick benchmark suite and read every figure against this machine's datasheet."""

    CSS_PATH = "bench.tcss"
    HELP = """\
## Bench

Measures this machine the way `tensor-tutor bench --quick` does: matmul throughput in FP32,
BF16 and FP16 (FLOP/s) and STREAM-like memory bandwidth (GB/s), in about 20 seconds.

- **r** (or *Run*) starts it, **Escape** cancels it (what finished is kept) or goes home.
- Blue bars are the theoretical peak, green bars the measurement; the gauges say what
  fraction of the peak was reached. Every figure is a case's median, labelled with its
  count and size ("median of 9 at 1024²"): the list, the bars, the table, the command
  line's `bench history` and the export all show that same figure. A CPU has no published memory peak: measured only.
Every run is saved to the results notebook (`tensor-tutor bench history`), and the list of
saved runs shows them all, the command line's too; cancelled runs are marked.
- **Up/Down** in the list shows a run; **m** marks it for comparison: mark two and their
  figures stand side by side with the ratio. Only cases measured at the same size are
  compared (a larger matrix runs faster, so a ratio across sizes would measure the size).
- Under the table, the run's sweeps: matmul throughput against matrix size per dtype with
  its peak, and bandwidth against working set with the cache sizes `tensor-tutor env`
  reports; each picture has its table under it (**t** on a picture hides it, table only).
- **Ctrl+S** saves the run's pictures as one SVG, their data as CSV and JSON beside it, under the
  data dir's exports folder, and says where. Every saved or exported file names the device, the
  dtypes, the date (UTC) and the tensor-tutor version; a figure's column ends with its unit, the one
  the screen shows (`measured_gflops`).
- Ctrl+P, *Export*: the run shown as JSON (the same as `tensor-tutor bench --json`), CSV or Markdown.
"""

    BINDINGS = [
        Binding("r", "run", "Run"),
        Binding("m", "mark", "Mark to compare"),
        Binding("escape", "escape", "Cancel/Home"),
        Binding("ctrl+s", "save_pictures", "Save SVG", show=False),  # in Help and the palette: the footer is full at 80
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
        def __init__(self, outcome: BenchOutcome | None, error: str | None = None) -> None:
            super().__init__()
            self.outcome, self.error = outcome, error

    def __init__(self, services: Services) -> None:
        super().__init__()
        self.services = services
        self._cancel = threading.Event()
        self.device = "cpu"
        self.notebook = Notebook(runs=(), corrupt_lines=0)
        self.marked: list[int] = []
        """Run numbers marked for comparison (at most two: the first is the baseline)."""
        self.shown: Any = None
        """What the screen shows now (a notebook Run, or a BenchOutcome that was not saved): what Export saves."""

    def compose(self) -> ComposeResult:
        yield DeviceHeader(device_title(self.services.machine), "Bench", label=device_label(self.services.machine))
        with Horizontal(id="bench-body"):
            with VerticalScroll(id="bench"):
                with Horizontal(classes="row"):
                    yield Button("Run", id="run", variant="primary")
                    yield ProgressBar(total=100, show_eta=False, id="progress")
                yield Static("r runs the quick suite (~20 s): matmul fp32/bf16/fp16 and memory bandwidth",
                             id="status")
                yield Static(id="history-title", classes="title")
                yield OptionList(id="history")
                yield Static(id="compare")
                yield Static(id="shown", classes="title")
                yield ComparisonBars(id="bars")
                yield VerticalScroll(id="gauges")
                yield Static(id="table")
                # textual-plot brings numpy: loaded when the Bench screen is built, not when the app starts.
                from tutor.ui.widgets.plot import ChartView

                yield ChartView(id="matmul-chart")
                yield ChartView(id="bandwidth-chart")
                yield ChartView(id="collective-chart")
            yield LivePane(self.services.machine, self.services.sampler, id="live")
        yield TutorFooter()

    def on_mount(self) -> None:
        self.load_history(show_latest=True)
        if self.notebook.runs:  # arrows pick a run at once; r still runs the suite
            self.query_one("#history", OptionList).focus()

    # ---- history ---------------------------------------------------------------------------------

    def load_history(self, show_latest: bool) -> None:
        """Read the notebook and list its runs; with `show_latest`, show the newest one."""
        self.notebook = read_notebook()
        table = self.query_one("#history", OptionList)
        highlighted = table.highlighted
        table.clear_options()
        table.add_options(Option(self._run_line(run), id=str(run.number)) for run in self.notebook.runs)
        if highlighted is not None and not show_latest and highlighted < len(self.notebook.runs):
            table.highlighted = highlighted
        title = self.query_one("#history-title", Static)
        count = len(self.notebook.runs)
        if not count:
            title.update(Text("no saved runs yet: r measures this machine and saves the run", style="dim"))
        else:
            title.update(Text(f"{count} saved run{'s' * (count != 1)} (the command line's too): ↑↓ shows one, "
                              "m marks two to compare", style="dim"))
        if self.notebook.warning:
            self.notify(self.notebook.warning, severity="warning", timeout=8)
        table.display = bool(count)
        if count and show_latest:
            table.highlighted = count - 1
            self.show_run(self.notebook.runs[-1])

    def _run_line(self, run: Run) -> Text:
        """'A  3  2025-01-12 10:00  cpu  fp32 131 GFLOP/s, ...': the mark, the run, cancelled in yellow."""
        mark = (" ", "")
        if run.number in self.marked:
            mark = ("A" if self.marked.index(run.number) == 0 else "B", "bold magenta")
        line = Text.assemble(mark, f" {run.number:>3}  {run_date(run)}  {run.device}  ")
        if run.cancelled:
            line.append("cancelled: ", style="yellow")
        line.append(run_figures(run))
        return line

    def run_by_number(self, number: int) -> Run | None:
        return next((run for run in self.notebook.runs if run.number == number), None)

    @on(OptionList.OptionHighlighted, "#history")
    def _highlighted(self, event: OptionList.OptionHighlighted) -> None:
        run = self.run_by_number(int(event.option.id or 0))
        if run is not None and run is not self.shown:
            self.show_run(run)

    def show_run(self, run: Run) -> None:
        """A stored run's bars, gauges and table."""
        self.shown = run
        self.device = run.device.split(",")[0]
        state = Text(" · cancelled: what finished before the stop", style="yellow") if run.cancelled else Text("")
        self.query_one("#shown", Static).update(
            Text.assemble((f"run {run.number}", "bold"), f" · {run_date(run)} · {run.device}", state))
        self.show_rows(rows_from_run(run))
        self.show_charts(run.results, run.header)

    def show_charts(self, results: Any, header: dict[str, Any]) -> None:
        """The run's sweeps (tutor.answers.pictures): matmul throughput against size, bandwidth across the caches,
        busbw against message size; a chart without a sweep of two sizes is hidden."""
        from tutor.answers.pictures import (bandwidth_sweep_chart, caches_from_machine_json, collective_link,
                                 collective_sweep_chart, matmul_sweep_chart)
        from tutor.ui.widgets.plot import ChartView

        results = [dict(result) for result in results]
        caches = caches_from_machine_json(header.get("machine")) if str(
            header.get("device_under_test") or "cpu").startswith("cpu") else []
        self.query_one("#matmul-chart", ChartView).chart = matmul_sweep_chart(results)
        self.query_one("#bandwidth-chart", ChartView).chart = bandwidth_sweep_chart(results, caches)
        self.query_one("#collective-chart", ChartView).chart = collective_sweep_chart(
            results, collective_link(results, header))

    def action_mark(self) -> None:
        """Mark the highlighted run for comparison (again: unmark it); two marked runs are compared."""
        table = self.query_one("#history", OptionList)
        if not self.notebook.runs or table.highlighted is None:
            self.notify("no saved runs to compare yet: r runs the suite", severity="warning")
            return
        number = self.notebook.runs[table.highlighted].number
        if number in self.marked:
            self.marked.remove(number)
        else:
            self.marked = [*self.marked, number][-2:]
        for run in self.notebook.runs:
            table.replace_option_prompt(str(run.number), self._run_line(run))
        self.show_comparison()

    def show_comparison(self) -> None:
        compare = self.query_one("#compare", Static)
        if len(self.marked) < 2:
            compare.update(Text(f"run {self.marked[0]} marked A: mark another run (m) to compare"
                                if self.marked else "", style="dim"))
            return
        before, after = (self.run_by_number(number) for number in self.marked)
        if before is not None and after is not None:
            compare.update(comparison_text(before, after))

    def export_result(self) -> Any:
        """What Export saves from this screen: the run shown (or the unsaved outcome); None before any."""
        return self.shown

    def pictures(self) -> tuple[str, list[Any]]:
        """What Ctrl+S saves: the sweeps drawn now (a chart without a sweep of two sizes is not drawn)."""
        from tutor.ui.widgets.plot import ChartView

        charts = [view.chart for view in self.query(ChartView) if view.chart is not None]
        number = getattr(self.shown, "number", None)
        return (f"bench-run-{number}" if number is not None else "bench-run"), charts

    def action_save_pictures(self) -> None:
        from tutor.ui.commands import save_pictures

        save_pictures(self.app)

    # ---- running ---------------------------------------------------------------------------------

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
        outcome = message.outcome
        if message.error is not None or outcome is None:
            status.update(Text(f"the benchmark failed: {message.error or 'no result'}", style="red"))
            return
        if not outcome.cancelled:  # a cancelled run stops its bar where it was, never at 100 %
            self.query_one("#progress", ProgressBar).update(progress=100)
        words = "cancelled: these are the cases that finished" if outcome.cancelled else "done"
        failures = "; ".join(outcome.failures)
        status.update(f"{words} on {outcome.device}" + (f" (problems: {failures})" if failures else ""))
        self.device = outcome.device
        self.shown = outcome
        self.query_one("#shown", Static).update(Text.assemble(("this run", "bold"), f" · {outcome.device}"))
        self.show_rows(outcome.rows)
        self.show_charts((), {})  # the saved run, shown just below, brings its sweeps
        saved_before = len(self.notebook.runs)
        self.load_history(show_latest=False)
        if len(self.notebook.runs) > saved_before:  # saved: the outcome is the newest run; show it from there
            self.shown = self.notebook.runs[-1]
            self.query_one("#history", OptionList).highlighted = len(self.notebook.runs) - 1
            self.show_run(self.notebook.runs[-1])

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
        from tutor.formatting import efficiency_summary
        from tutor.theory.peaks import explain_efficiency

        try:
            clock = self.services.machine.peak_clock_hz(self.device)
        except Exception:  # an odd device name: explain without the clock
            clock = None
        return efficiency_summary(explain_efficiency(row.measured, row.peak, assumed_clock_hz=clock))

    def cancel(self) -> None:
        """Stop the suite at its next iteration (used by Escape, leaving and quitting)."""
        if self.running:
            self._cancel.set()
            self.query_one("#status", Static).update("cancelling…")

    def action_escape(self) -> None:
        if self.running:
            self.cancel()
        elif (app := tutor_app(self.app)) is not None:
            app.action_home()

    def on_unmount(self) -> None:
        self._cancel.set()
