"""The quiz block: graded by tutor.lessons.grade, a hint after each wrong answer, progress recorded."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Button, Input, RadioButton, RadioSet, Static

from tutor.ui.widgets.block import LessonBlock, say


class QuizBlock(LessonBlock):
    """```quiz: a number, a choice or a short text, checked against the lesson's own answer."""

    TITLE = "Quiz"
    HELP = """\
## Quiz block

Type your answer (or pick a choice) and press **Enter** or *Check*.

- Numbers may carry a unit or an exponent (`3.4e38`); close enough (the quiz's tolerance) is right.
- Each wrong answer reveals the next **hint**.
- *Show answer* gives up: it shows the answer and the explanation.
Answers are saved with your progress.
"""

    def compose(self) -> ComposeResult:
        quiz = self.block
        yield Static(Text(quiz.question, style="bold"))
        if quiz.kind == "choice":
            with RadioSet(id="choices"):
                for choice in quiz.choices:
                    yield RadioButton(str(choice))
        with Horizontal(classes="row"):
            if quiz.kind != "choice":
                unit = getattr(quiz, "unit", "")
                yield Input(placeholder=f"your answer{f' ({unit})' if unit else ''}", id="answer")
            yield Button("Check", id="check", variant="primary")
            yield Button("Show answer", id="reveal")
        yield Static(id="feedback", classes="status")
        yield Static(id="hints", classes="status")
        yield Static(id="explanation", classes="status")

    def on_mount(self) -> None:
        self.hints_shown = 0
        for name in ("#feedback", "#hints", "#explanation"):
            self.query_one(name).display = False
        if self.done:
            say(self.query_one("#feedback", Static), Text("✓ answered before", style="green"))

    def answer_text(self) -> str | None:
        """The learner's answer as the grader takes it (a choice as its index), None if none given."""
        if self.block.kind == "choice":
            index = self.query_one("#choices", RadioSet).pressed_index
            return None if index < 0 else str(index)
        text = self.query_one("#answer", Input).value.strip()
        return text or None

    @on(Input.Submitted, "#answer")
    @on(Button.Pressed, "#check")
    def check(self, event: Any = None) -> None:
        if event is not None:
            event.stop()
        answer = self.answer_text()
        feedback = self.query_one("#feedback", Static)
        if answer is None:
            say(feedback, Text("type an answer first" if self.block.kind != "choice" else "pick a choice first",
                                 style="yellow"))
            return
        try:
            grade = self.services.grade(self.block, answer, device=self.services.machine)
        except ValueError as error:  # UserError: an answer the grader cannot read
            say(feedback, Text(str(error), style="yellow"))
            return
        self._record(answer, grade.correct)
        if grade.correct:
            say(feedback, Text.assemble(("✓ right. ", "bold green"), grade.message or ""))
            self._explain()
            self.complete()
            return
        say(feedback, Text.assemble(("✗ not yet. ", "bold red"), grade.message or ""))
        self._next_hint()

    def _record(self, answer: str, correct: bool) -> None:
        try:
            self.services.progress.record_answer(self.lesson_id, self.block_id, answer, correct)
        except Exception as error:  # progress is a convenience: a full disk must not break the lesson
            self.notify(f"answer not saved: {error}", severity="warning")

    def _next_hint(self) -> None:
        hints = list(getattr(self.block, "hints", ()) or ())
        if self.hints_shown < len(hints):
            self.hints_shown += 1
        if hints:
            shown = hints[: self.hints_shown]
            say(self.query_one("#hints", Static), 
                "\n".join(f"hint {i + 1}/{len(hints)}: {hint}" for i, hint in enumerate(shown)))

    def _explain(self) -> None:
        explanation = getattr(self.block, "explanation", "")
        if explanation:
            say(self.query_one("#explanation", Static), Text(explanation))

    @on(Button.Pressed, "#reveal")
    def reveal(self, event: Any = None) -> None:
        if event is not None:
            event.stop()
        try:
            expected = self.services.expected_answer(self.block, device=self.services.machine)
        except ValueError as error:
            expected = f"(cannot compute: {error})"
        if self.block.kind == "choice" and isinstance(expected, int) and 0 <= expected < len(self.block.choices):
            expected = self.block.choices[expected]
        say(self.query_one("#feedback", Static), Text.assemble(("answer: ", "bold"), str(expected)))
        self._explain()
        self.complete()
