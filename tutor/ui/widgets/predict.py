"""The predict block: the learner commits a guess, then the probe measures it, then both are compared."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, ScrollableContainer
from textual.widgets import Button, Input, ProgressBar, Static

from tutor.ui.widgets.block import say
from tutor.ui.widgets import measure
from tutor.ui.widgets.measure import ProbeRunner, ResultView, age_text, format_value, result_store

if TYPE_CHECKING:
    from tutor.labs import ProbeResult
    from tutor.lessons.model import Predict
    from tutor.ui.services import Services


def parse_guess(text: str, unit: str = "", guess_unit: str = "") -> float:
    """A guess as a value in the block's unit (tutor.lessons.predictions.read_guess)."""
    from tutor.lessons.predictions import read_guess

    return read_guess(text, unit, guess_unit)


def read_guess_note(text: str, unit: str = "", guess_unit: str = "") -> tuple[float, str]:
    """(the guess in the block's unit, what it was read as: "read as 0.8 GB/s", "" for a plain number)."""
    from tutor.lessons.predictions import read_guess_as

    reading = read_guess_as(text, unit, guess_unit)
    return reading.value, reading.note


def verdict(predicted: float, measured: float, unit: str = "") -> str:
    """How far the guess was (tutor.lessons.predictions.prediction_verdict)."""
    from tutor.lessons.predictions import prediction_verdict

    return prediction_verdict(predicted, measured, unit)


def verdict_text(predicted: float, read_as: str, measured: float, unit: str) -> Text:
    """'you predicted 2x (read as ...), measured 0.25x: 8x too high': the guess as read (and what from),
    the measurement and how far apart they are, each figure through tutor.formatting."""
    return Text.assemble(
        "you predicted ", (format_value(predicted, unit), "bold"),
        (f" ({read_as})", "dim") if read_as else "",
        ", measured ", (format_value(measured, unit), "bold"),
        ": ", (verdict(predicted, measured, unit), "bold"))


class PredictBlock(ProbeRunner["Predict"]):
    """```predict: commit a number first, then measure it on this machine and compare."""

    TITLE = "Predict, then measure"
    HELP = """\
## Predict block

Commit to a guess **before** measuring: type a number and press **Enter** (or *Commit*).
Units convert to the block's (`800 MB/s` for a GB/s block, `2 months` for days, `30 million`), and
arithmetic works (`6*1.24e9*15e12`); the block says what it read ("read as 0.8 GB/s").
The probe then runs on this machine (Escape cancels) and the block compares your guess with
the measured value as a ratio ("2.1x too high"). Your predictions are saved with your progress: a
reopened lesson shows your guess, the measured value and the verdict; commit again to measure again.
"""

    def __init__(self, block: Predict, *, lesson_id: str, services: Services, done: bool = False,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(block, lesson_id=lesson_id, services=services, done=done, id=id, classes=classes)
        from tutor.lessons.learner import safe_learner_view

        self.read_as = ""
        """What the committed guess was read as ("read as 0.8 GB/s from '800 MB/s'"), "" for a plain number."""
        self.typed = ""
        """The committed guess as typed ("800 MB/s"), saved with it."""
        self.written = block
        self.block, self.render_error = safe_learner_view(
            block, learner_id=self.services.progress.learner_id, lesson_id=self.lesson_id,
            device=self.services.machine)

    def compose(self) -> ComposeResult:
        unit = self.block.guess_unit or self.block.unit
        shown_unit = {"fraction": "a share, e.g. 20%"}.get(unit, unit)
        yield Static(Text(self.block.question, style="bold"))
        with Horizontal(classes="row"):
            yield Input(placeholder=f"your guess{f' ({shown_unit})' if shown_unit else ''}", id="guess")
            yield Button("Commit", id="commit", variant="primary")
        yield ProgressBar(total=100, show_eta=False, id="progress")
        yield Static("guess first: the measurement starts when you commit", id="status", classes="status")
        yield Static(id="verdict")
        yield Static(id="explain", classes="explain")
        yield Static(id="table")
        yield Static(id="drawing")

    def on_mount(self) -> None:
        for name in ("#progress", "#verdict", "#explain", "#table", "#drawing"):
            self.query_one(name).display = False
        kept = result_store(self.app).recall(self.lesson_id, self.block_id)
        if kept is not None and kept.predicted is not None:  # committed earlier in this session
            self._show_guess(kept.predicted, kept.typed)
            self.show_result(kept.result, age=measure.now() - kept.at)
            return
        saved = self.services.progress.prediction(self.lesson_id, self.block_id)
        if saved is not None and saved.measured is not None:  # an earlier session's: its guess and verdict
            self._show_guess(saved.predicted, saved.typed)
            self._set_status("predicted and measured before (saved with your progress): commit again to "
                             "measure again")
            self.show_verdict(saved.measured)
        elif saved is not None:
            self._show_guess(saved.predicted, saved.typed)
            self._set_status("your guess was saved, but not measured: commit to measure it")
        elif self.done:
            self._set_status("predicted and measured before; commit again to re-run")

    def _show_guess(self, predicted: float, typed: str) -> None:
        """Put a committed guess back: in the field as the learner typed it (its value when no text was
        kept), and what it was read as, read again from that text by the same reader."""
        self.predicted = predicted
        self.read_as = ""
        if typed:
            try:
                _, note = read_guess_note(typed, self.block.unit, self.block.guess_unit)
            except ValueError:  # the block's unit changed since: the value stands as it was read then
                note = ""
            self.read_as = f"{note} from {typed.strip()!r}" if note else ""
        self.query_one("#guess", Input).value = typed.strip() or format_value(predicted, "")

    def keep_result(self, result: ProbeResult) -> None:
        """Remember the guess and the result for this lesson and block, as measure blocks do."""
        result_store(self.app).keep(self.lesson_id, self.block_id, result, predicted=self.predicted,
                                    typed=self.typed)

    @on(Input.Submitted, "#guess")
    @on(Button.Pressed, "#commit")
    def _commit(self, event: Input.Submitted | Button.Pressed) -> None:
        event.stop()
        if self.running:
            return
        # The guess as it was when Enter was pressed: keys typed after it may already be in the field.
        text = event.value if isinstance(event, Input.Submitted) else self.query_one("#guess", Input).value
        try:
            self.predicted, note = read_guess_note(text, self.block.unit, self.block.guess_unit)
        except ValueError as error:
            self._show_error(str(error))
            return
        self.read_as = f"{note} from {text.strip()!r}" if note else ""
        self.typed = text.strip()
        self.keep_focus_in_the_lesson()
        self.query_one("#guess", Input).disabled = True
        self.query_one("#commit", Button).disabled = True
        self.query_one("#progress").display = True
        self.start_probe()

    def keep_focus_in_the_lesson(self) -> None:
        """Disabling the focused input would leave nothing focused (PgDn dead): hand focus to the
        scroller the block sits in, so the keys keep reading the lesson while it measures."""
        focused = self.app.focused
        if focused is None or self not in focused.ancestors_with_self:
            return
        scroller = next((node for node in self.ancestors if isinstance(node, ScrollableContainer)), None)
        if scroller is not None:
            scroller.focus(scroll_visible=False)

    def take_focus_back(self) -> None:
        """While it measured the focus waited on the lesson text (keep_focus_in_the_lesson); give it
        back to this block's Commit so that Tab continues from here, not from the lesson's top."""
        focused = self.app.focused
        if focused is None or isinstance(focused, ScrollableContainer) and self in focused.walk_children():
            self.query_one("#commit", Button).focus(scroll_visible=False)

    def _unlock(self) -> None:
        self.query_one("#guess", Input).disabled = False
        self.query_one("#commit", Button).disabled = False

    def _show_error(self, text: str) -> None:
        super()._show_error(text)
        self._unlock()

    def show_verdict(self, measured: float) -> Static:
        """The committed guess against `measured`, and the lesson's explanation: as a fresh result shows
        them, and as a reopened lesson shows the ones saved with the learner's progress."""
        verdict_line = self.query_one("#verdict", Static)
        say(verdict_line, verdict_text(self.predicted, self.read_as, measured, self.block.unit))
        if self.block.explain:  # the reconciliation: why the measured value is what it is
            say(self.query_one("#explain", Static), Text.assemble(("Why: ", "bold"), self.block.explain))
        return verdict_line

    def show_result(self, result: ProbeResult, age: float | None = None) -> None:
        """The verdict, the probe's rows and its drawing; `age` (seconds) when the result is one
        kept from earlier in this session (then the prediction is not recorded again)."""
        self._unlock()
        metric = self.block.metric
        measured = result.metrics.get(metric)
        say(self.query_one("#table", Static), ResultView(result))
        say(self.query_one("#drawing", Static), self.drawing(result) or "")
        if result.cancelled or measured is None:
            why = "cancelled before" if result.cancelled else "the lab did not report"
            self._set_status(f"{why} {metric}: commit again to measure")
            self.take_focus_back()
            self.call_after_refresh(self.query_one("#status").scroll_visible, animate=False)
            return
        self._set_status((f"measured {age_text(age)}: " if age is not None else "")
                         + (result.summary or "measured"))
        verdict_line = self.show_verdict(float(measured))
        if age is not None:  # shown again on return: recorded when it was measured
            return
        self.call_after_refresh(verdict_line.scroll_visible, animate=False)  # the answer, not below the fold
        self.take_focus_back()
        try:
            self.services.progress.record_prediction(self.lesson_id, self.block_id, self.predicted, float(measured),
                                                     typed=self.typed)
        except OSError as error:  # the store keeps its own warning; a lock or disk error must not break the lesson
            self.notify(f"prediction not saved: {error}", severity="warning")
        self.complete()
