"""The exercise block: the learner edits a starting point (bits, a schedule, a loop) and the worker
runs its check (the `exercise` lab); a hint opens with each failed check, the explanation on a pass."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Button, ProgressBar, Static, TextArea

from tutor.ui.widgets.block import say
from tutor.ui.widgets.measure import ProbeRunner

if TYPE_CHECKING:
    from tutor.labs.probe import ProbeResult


class ExerciseBlock(ProbeRunner):
    """```exercise: work the program checks by running it."""

    TITLE = "Exercise: do it, then check it"
    HELP = """\
## Exercise block

Edit the starting point in the box (it does not pass yet), then press **Check**: the program runs
your answer (a loop runs for real, on a tiny model, in the measurement worker) and says what it
found. Each failed check opens a hint; *Show solution* opens after the last hint (that marks the
exercise seen, not solved). **Tab** leaves the box; *Reset* brings back the starting point.
"""

    DEFAULT_CSS = """
    ExerciseBlock TextArea { height: auto; max-height: 16; min-height: 3; }
    """

    def __init__(self, block: Any, **kwargs: Any) -> None:
        super().__init__(block, **kwargs)
        from tutor.lessons.learner import safe_learner_view

        self.written = block
        self.block, self.render_error = safe_learner_view(
            block, learner_id=str(self.services.progress.learner_id or ""), lesson_id=self.lesson_id,
            device=self.services.machine)
        self.hints_shown = 0

    @property
    def params(self) -> dict:
        return {"check": self.block.check, "answer": self.query_one("#answer", TextArea).text}

    def compose(self) -> ComposeResult:
        yield Static(Text(self.block.task))
        yield TextArea(self.block.start, id="answer", show_line_numbers=self.block.language == "python",
                       soft_wrap=self.block.language != "python", tab_behavior="focus")
        with Horizontal(classes="row"):
            yield Button("Check", id="check", variant="primary")
            yield Button("Reset", id="reset")
            yield Button("Show solution", id="solution")
            yield ProgressBar(total=100, show_eta=False, id="progress")
        yield Static("edit the starting point, then Check", id="status", classes="status")
        yield Static(id="findings", classes="status")
        yield Static(id="hints", classes="status")
        yield Static(id="explain")

    def on_mount(self) -> None:
        for name in ("#progress", "#findings", "#hints", "#explain", "#solution"):
            self.query_one(name).display = False
        if self.done:
            self._set_status("solved before; check again to re-run")

    @on(Button.Pressed, "#check")
    def _check(self, event: Button.Pressed) -> None:
        event.stop()
        if not self.running:
            self.query_one("#progress").display = True
            self.start_probe()

    @on(Button.Pressed, "#reset")
    def _reset(self, event: Button.Pressed) -> None:
        event.stop()
        self.query_one("#answer", TextArea).text = self.block.start

    @on(Button.Pressed, "#solution")
    def _show_solution(self, event: Button.Pressed) -> None:
        event.stop()
        self.query_one("#answer", TextArea).text = self.block.solution
        try:
            self.services.progress.record_reveal(self.lesson_id, self.block_id)
        except OSError as error:
            self.notify(f"progress not saved: {error}", severity="warning")
        self._set_status("the solution is in the box: check it to see why it passes (seen, not solved)")

    def show_result(self, result: ProbeResult, age: float | None = None) -> None:
        # `age` is a kept result's: exercises keep none (each check runs anew), so it is always None.
        from tutor.labs.exercise import render_verdict, verdict_of

        verdict = verdict_of(result)
        say(self.query_one("#findings", Static), render_verdict(result) or "")
        status = self.query_one("#status", Static)
        status.update(Text.assemble(("✓ " if verdict.passed else "✗ ", "bold"), verdict.message))
        status.set_classes("good" if verdict.passed else "error")
        if verdict.passed:
            if self.block.explanation:
                say(self.query_one("#explain", Static), Text.assemble(("Why: ", "bold"), self.block.explanation))
            self.complete()
        else:
            self._next_hint()
        self.call_after_refresh(status.scroll_visible, animate=False)

    def _next_hint(self) -> None:
        hints = self.block.hints
        if self.hints_shown < len(hints):
            self.hints_shown += 1
        shown = hints[: self.hints_shown]
        say(self.query_one("#hints", Static),
            Text("\n".join(f"hint {i}: {hint}" for i, hint in enumerate(shown, 1))) if shown else "")
        self.query_one("#solution").display = self.hints_shown >= len(hints)
