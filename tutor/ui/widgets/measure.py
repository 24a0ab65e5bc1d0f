"""The measure block: runs a tutor.labs probe in a thread worker and sets its result beside theory.

The probe runs in `@work(thread=True)`; it reports progress through a callback that posts
messages (thread-safe) and stops at its next check of a `threading.Event` when the learner
presses Escape, leaves the lesson or quits. Only one probe runs at a time in the whole app:
two measurements at once would measure each other.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.message import Message
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Button, ProgressBar, Static

from tutor.errors import UserError
from tutor.formatting import format_params
from tutor.labs import Measurement, ProbeResult
from tutor.ui.host import tutor_app
from tutor.ui.services import DrawsResults
from tutor.ui.widgets.block import LessonBlock, reveal, say
from tutor.ui.widgets.charts import Comparison, ComparisonBars, quantity_text
from tutor.safe_text import plain, without_controls
from tutor.ui.widgets.static_text import show_text
from tutor.ui.workers import yield_cpu_to_the_interface

if TYPE_CHECKING:
    from rich.console import RenderableType
    from textual.timer import Timer

    from tutor.lessons.model import Measure, Predict
    from tutor.ui.services import ProbeLike, Services
    from tutor.worker.client import WorkerState

P = TypeVar("P", bound="Measure | Predict", covariant=True)
"""The block a ProbeRunner runs the probe of."""


def format_value(value: float | None, unit: str) -> str:
    """A figure with its unit in the project's one way of writing numbers (tutor.formatting):
    scaled units, no scientific notation; N/A for None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "N/A"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return quantity_text(float(value), unit)


def param_text(params: dict) -> str:
    """A probe's parameters as 'dtypes fp32, bf16 · budget 3 s' (not `dtypes=['fp32'], budget_s=3`)."""
    return format_params(params)


def now() -> float:
    """Wall-clock seconds (a function of its own so that tests can freeze it)."""
    return time.time()


def age_text(seconds: float) -> str:
    """'just now', '40 s ago', '3 min ago', '2 h ago'."""
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return "just now"
    if seconds < 60:
        return f"{seconds:.0f} s ago"
    if seconds < 2 * 3600:
        return f"{seconds // 60:.0f} min ago"
    return f"{seconds // 3600:.0f} h ago"


@dataclass(frozen=True)
class KeptResult:
    """A finished measurement and when it finished (seconds since the epoch)."""

    result: ProbeResult
    at: float
    predicted: float | None = None
    """The learner's committed guess (predict blocks)."""
    typed: str = ""
    """That guess as the learner typed it."""


class ResultStore:
    """Measure results kept while the app runs, per lesson and block: leaving a lesson and coming
    back shows them again instead of asking for another run. Not saved to disk: a result belongs
    to the machine's state of the moment."""

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str], KeptResult] = {}

    def keep(self, lesson_id: str, block_id: str, result: ProbeResult, predicted: float | None = None,
             typed: str = "") -> None:
        self._kept[(lesson_id, block_id)] = KeptResult(result, now(), predicted, typed)

    def recall(self, lesson_id: str, block_id: str) -> KeptResult | None:
        return self._kept.get((lesson_id, block_id))

    def latest(self) -> list[KeptResult]:
        """Every kept result, oldest first."""
        return sorted(self._kept.values(), key=lambda kept: kept.at)


def result_store(app: App[None]) -> ResultStore:
    """The app's store of measure results (a fresh, empty one in a host other than TutorApp)."""
    store = getattr(app, "measured_results", None) if tutor_app(app) is not None else None
    return store if isinstance(store, ResultStore) else ResultStore()


def percent_cell(row: Measurement) -> str:
    """measured / theory, short: a percentage up to 100 %; above that, never a bare '130 %' for a
    rate but a pointer to the reason (the row's note, or tutor.theory.peaks.explain_efficiency)."""
    measured, theory = row.measured, row.theory
    if measured is None or theory is None or theory == 0:
        return "-"
    ratio = measured / theory
    if ratio <= 1.0 or f"{ratio * 100:.1f}" == "100.0":  # equal at the shown precision: not "above"
        return f"{ratio * 100:.1f} %"
    if row.rate or "/s" in row.unit:
        if row.note:
            return "above the peak: see why"  # the note carries the explanation (e.g. the implied clock)
        from tutor.formatting import efficiency_summary
        from tutor.theory.peaks import explain_efficiency

        return efficiency_summary(explain_efficiency(float(measured), float(theory)))
    if row.note:
        return f"{ratio * 100:.1f} %: see note"
    return f"{ratio * 100:.1f} % (above theory)"


def result_table(result: ProbeResult) -> Table:
    """The rows of a ProbeResult: what, measured, theory, % of theory, note or source."""
    table = Table(expand=True, show_edge=False, pad_edge=False, box=None, header_style="bold")
    table.add_column("what", ratio=3)
    table.add_column("measured", justify="right", no_wrap=True)
    table.add_column("theory", justify="right", no_wrap=True)
    table.add_column("% of theory", justify="right", ratio=2)
    table.add_column("why / source", ratio=4)
    for row in result.rows:
        note = row.note or row.theory_source
        table.add_row(row.label, format_value(row.measured, row.unit), format_value(row.theory, row.unit),
                      percent_cell(row), Text(note, style="dim"))
    return table


class ResultView:
    """A ProbeResult's rows: the table where it has room, else one short paragraph per row
    (a five-column table in the 50 columns a measure block gets beside the live pane is unreadable)."""

    TABLE_MIN_WIDTH = 90

    def __init__(self, result: ProbeResult) -> None:
        self.result = result

    def __bool__(self) -> bool:
        return bool(self.result.rows)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if options.max_width >= self.TABLE_MIN_WIDTH:
            yield result_table(self.result)
            return
        for row in self.result.rows:
            figures = Text("  measured ", style="dim").append(format_value(row.measured, row.unit), style="bold")
            if row.theory is not None:
                figures.append("  theory ", style="dim").append(format_value(row.theory, row.unit))
                figures.append(f"  {percent_cell(row)}")
            yield Text(row.label)
            yield figures
            note = row.note or row.theory_source
            if note:
                yield Text(f"  {note}", style="dim")


def comparisons(result: ProbeResult) -> tuple[Comparison, ...]:
    """Rows that have both figures, for the bar chart."""
    return tuple(Comparison(row.label, row.measured, row.theory, row.unit) for row in result.rows
                 if row.measured is not None and row.theory is not None)


WAITING_PHASES = ("starting", "loading torch", "restarting")


def waiting_text(state: WorkerState | None) -> str:
    """What a run waits for before it measures: 'loading torch… then ' while the measurement
    process starts (torch takes seconds to import on a 2-core machine); '' when it is ready."""
    if state is None or state.phase not in WAITING_PHASES:
        return ""
    return "loading torch in the measurement process… then "


class ProbeRunner(LessonBlock[P]):
    """Runs one probe in a thread worker: progress bar, Escape cancels, one runner at a time."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", show=True)]

    running = reactive(False)
    """True while the probe's worker runs."""

    PROGRESS_TEXT_INTERVAL_S = 0.25
    """The progress line changes at most four times a second (a probe may report hundreds): each
    change is a repaint of the lesson screen, and the learner cannot read faster anyway."""

    class Progress(Message):
        """The probe reported `fraction` done with `text`."""

        def __init__(self, runner: ProbeRunner[Measure | Predict], fraction: float, text: str) -> None:
            super().__init__()
            self.runner, self.fraction, self.text = runner, fraction, text

        def can_replace(self, message: Message) -> bool:
            # Only the newest progress of a runner matters; a fast probe must not flood the queue.
            return isinstance(message, ProbeRunner.Progress) and message.runner is self.runner

    class Finished(Message):
        """The probe returned (possibly cancelled) or failed with a one-line `error`."""

        def __init__(self, runner: ProbeRunner[Measure | Predict], result: ProbeResult | None,
                     error: str | None = None) -> None:
            super().__init__()
            self.runner, self.result, self.error = runner, result, error

    class Claimed(Message):
        """`runner` starts measuring: the app makes it the one runner measuring now (TutorApp.active_runner)."""

        def __init__(self, runner: ProbeRunner[Measure | Predict]) -> None:
            super().__init__()
            self.runner = runner

    class Released(Message):
        """`runner` stopped measuring: the app forgets it if it is still the one measuring."""

        def __init__(self, runner: ProbeRunner[Measure | Predict]) -> None:
            super().__init__()
            self.runner = runner

    class Measured(Message):
        """A probe's result, for the app to keep as its latest (what the palette's export writes)."""

        def __init__(self, result: ProbeResult) -> None:
            super().__init__()
            self.result = result

    def __init__(self, block: P, *, lesson_id: str, services: Services, done: bool = False,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(block, lesson_id=lesson_id, services=services, done=done, id=id, classes=classes)
        self._cancel = threading.Event()
        self.result: ProbeResult | None = None
        self._progress_text_at = -math.inf
        """time.monotonic() when the progress line last changed."""
        self._progress_text: str | None = None
        """The newest progress line not shown yet (a timer shows it)."""
        self._progress_timer: Timer | None = None

    @property
    def probe_name(self) -> str:
        return self.block.probe

    @property
    def params(self) -> dict:
        return dict(self.block.params)

    def params_for(self, probe: ProbeLike) -> dict:
        """The block's params, plus the learner's chosen device (settings) where the probe takes one
        and the lesson does not pin it."""
        params = self.params
        device = self.services.settings.device
        if device != "auto" and "device" in getattr(probe, "param_names", ()) and "device" not in params:
            params["device"] = device
        return params

    def start_probe(self) -> None:
        """Start the probe (cancelling any other runner in the app first)."""
        if self.running:
            return
        try:
            probe = self.services.probe(self.probe_name)
        except UserError as error:
            self._show_error(str(error))
            return
        app = tutor_app(self.app)
        if app is not None and app.active_runner is not None and app.active_runner is not self:
            app.active_runner.cancel()  # one probe at a time: two would measure each other
        self.post_message(self.Claimed(self))
        self._cancel = threading.Event()
        self._drop_progress_text()
        self.running = True
        bar = self.query_one(ProgressBar)
        bar.update(total=100, progress=0)
        self._set_status(f"{waiting_text(app.worker_state if app is not None else None)}"
                         f"running {probe.title}… (Escape cancels)")
        self._run(probe, self.params_for(probe), self._cancel)

    @work(thread=True, exclusive=True, group="probe", exit_on_error=False, description="Running a lab")
    def _run(self, probe: ProbeLike, params: dict, cancel: threading.Event) -> None:
        yield_cpu_to_the_interface()

        def progress(fraction: float, text: str) -> None:
            self.post_message(self.Progress(self, fraction, text))

        try:
            result = probe.run(params, progress, cancel)
        except UserError as error:
            self.post_message(self.Finished(self, None, str(error)))
        except Exception as error:  # a broken probe is a message in its block, never a traceback
            detail = str(error).splitlines()[0] if str(error) else ""
            self.post_message(self.Finished(self, None, f"{type(error).__name__}: {detail}".rstrip(": ")))
        else:
            self.post_message(self.Finished(self, result))

    def cancel(self) -> None:
        """Ask the probe to stop at its next check; the result keeps what finished."""
        if self.running:
            self._cancel.set()
            if self.is_attached:
                self._set_status("cancelling…")

    def on_unmount(self) -> None:
        # Leaving the lesson or quitting: nobody would see the result, so stop measuring.
        self._cancel.set()
        self._release_app()

    def _release_app(self) -> None:
        """This runner is no longer the app's one measuring."""
        self.post_message(self.Released(self))

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # Escape belongs to this block only while it runs; otherwise it reaches the screen.
        if action == "cancel":
            return self.running
        return True

    def action_cancel(self) -> None:
        self.cancel()

    def watch_running(self, running: bool) -> None:
        self.refresh_bindings()

    @on(Progress)
    def _on_progress(self, message: Progress) -> None:
        message.stop()
        if message.runner is not self:
            return
        self.query_one(ProgressBar).update(progress=max(0.0, min(message.fraction, 1.0)) * 100)
        self._progress_text = f"{message.text} (Escape cancels)"
        wait = self._progress_text_at + self.PROGRESS_TEXT_INTERVAL_S - time.monotonic()
        if wait <= 0:
            self._show_progress_text()
        elif self._progress_timer is None:
            self._progress_timer = self.set_timer(wait, self._show_progress_text)

    def _show_progress_text(self) -> None:
        self._progress_timer = None
        if self._progress_text is None or not self.running or self._cancel.is_set():
            return  # finished or cancelling meanwhile: that line stands
        self._set_status(self._progress_text)
        self._progress_text = None
        self._progress_text_at = time.monotonic()

    def _drop_progress_text(self) -> None:
        self._progress_text = None
        if self._progress_timer is not None:
            self._progress_timer.stop()
            self._progress_timer = None

    @on(Finished)
    def _on_finished(self, message: Finished) -> None:
        message.stop()
        if message.runner is not self:
            return
        self.running = False
        self._drop_progress_text()
        self._release_app()
        result = message.result
        if message.error is not None or result is None:
            self._show_error(message.error or "the probe returned no result")
            return
        self.result = result
        self.post_message(self.Measured(result))  # the app keeps it: what the palette's export writes
        if not result.cancelled:
            self.query_one(ProgressBar).update(progress=100)  # a cancelled run keeps the bar where it stopped
        self.keep_result(result)
        self.show_result(result)

    def keep_result(self, result: ProbeResult) -> None:
        """Remember the result for this lesson and block (measure blocks show it again on return)."""

    def show_result(self, result: ProbeResult, age: float | None = None) -> None:
        raise NotImplementedError

    def drawing(self, result: ProbeResult) -> RenderableType | None:
        """The probe's own picture of its result (Probe.render: timelines, per-rank bars), or None."""
        if not result.details:
            return None
        try:
            probe = self.services.probe(self.probe_name)
        except UserError:
            return None
        render = probe.render if isinstance(probe, DrawsResults) else None
        if render is None:
            return None
        try:
            return render(result)
        except Exception as error:  # a broken drawing is a line in the block, never a crash
            return Text(f"could not draw the result: {type(error).__name__}", style="red")

    def _set_status(self, text: str | Text) -> None:
        show_text(self.query_one("#status", Static), text, "status")

    def show_in_view(self, parts: list[Widget]) -> None:
        """Once drawn, scroll the shown `parts` of a result into view, the first one (the line that
        says what was measured) first when they cannot all fit."""
        shown = [part for part in parts if part.display]

        def scroll() -> None:
            if shown:
                shown[-1].scroll_visible(animate=False, immediate=True)
                shown[0].scroll_visible(animate=False, immediate=True)

        self.call_after_refresh(scroll)

    def _show_error(self, text: str) -> None:
        self.running = False
        self._drop_progress_text()
        show_text(self.query_one("#status", Static), text, "error")


class MeasureBlock(ProbeRunner["Measure"]):
    """```measure: run a probe on this machine and read its result against theory."""

    TITLE = "Measure on this machine"
    HELP = """\
## Measure block

Runs a real measurement (a *probe*) on this machine in the background: the app stays usable.

- **Enter** on *Run* starts it; **Escape** cancels it (what finished is kept).
- The table sets each **measured** figure beside **theory** (from `tutor.theory`) with the
  percentage and the reason for any gap. A figure above theory is never shown as "130 %":
  the app says which assumption behind the theory must be wrong instead.
"""

    def compose(self) -> ComposeResult:
        explain = self.block.explain
        yield Static(Text.assemble(("lab ", "dim"), (self.probe_name, "bold"),
                                   ("  " + param_text(self.params) if self.params else "", "dim")))
        with Horizontal(classes="row"):
            yield Button("Run", id="run", variant="primary")
            yield ProgressBar(total=100, show_eta=False, id="progress")
        yield Static("press Run (Enter) to measure", id="status", classes="status")
        yield Static(id="table")
        yield Static(id="drawing")
        yield ComparisonBars(id="bars")
        yield Static(explain, id="explain", classes="status")

    def on_mount(self) -> None:
        for name in ("#explain", "#bars", "#table", "#drawing"):
            self.query_one(name).display = False
        kept = result_store(self.app).recall(self.lesson_id, self.block_id)
        if kept is not None:  # measured earlier in this session: show it again, with its age
            self.result = kept.result
            if not kept.result.cancelled:
                self.query_one(ProgressBar).update(total=100, progress=100)
            self.show_result(kept.result, age=now() - kept.at)

    def keep_result(self, result: ProbeResult) -> None:
        result_store(self.app).keep(self.lesson_id, self.block_id, result)

    @on(Button.Pressed, "#run")
    def _run_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        if reveal(event.button):  # Enter on a Run the learner cannot see scrolls to it first
            self.start_probe()

    def show_result(self, result: ProbeResult, age: float | None = None) -> None:
        cancelled = result.cancelled
        headline, _, details = (result.summary or "done").partition("\n")
        # The summary's first line is the figure the learner ran it for (the lab words it plainly):
        # it leads, in bold; what may make it read low follows on the lines after it.
        self._set_status(Text.assemble(
            (f"measured {age_text(age)}: " if age is not None else ""),
            ("cancelled: the rows below are what finished. " if cancelled else ""),
            (plain(headline), "bold"), ("\n" + without_controls(details) if details else "")))
        say(self.query_one("#table", Static), ResultView(result))
        say(self.query_one("#drawing", Static), self.drawing(result) or "")
        bars = self.query_one("#bars", ComparisonBars)
        bars.items = comparisons(result)
        bars.display = bool(bars.items)
        self.query_one("#explain").display = bool(self.block.explain)
        if age is None:  # a result that just arrived: in view, not below the fold (at 80x24 the block starts at the top)
            self.show_in_view([self.query_one("#status", Static), *(self.query_one(name) for name in
                                                                    ("#table", "#drawing", "#bars", "#explain"))])
        if not cancelled:
            self.complete()
