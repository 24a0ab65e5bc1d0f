"""The quiz block: graded by tutor.lessons.grade, a hint after each wrong answer, progress recorded.

The block shown is the learner's own (tutor.lessons.learner): numbers drawn and choices shuffled
for this progress file, every text rendered. An answer that cannot be read is not an attempt.
"Show answer" opens after a few attempts and marks the quiz seen, not solved.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.geometry import Size

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.widgets import Button, Input, RadioButton, RadioSet, Static

from tutor.ui.widgets.block import LessonBlock, say

if TYPE_CHECKING:
    from tutor.lessons.grading import Grade
    from tutor.lessons.model import Quiz
    from tutor.ui.services import Services

ATTEMPTS_BEFORE_REVEAL = 3
"""Wrong answers before "Show answer" opens (fewer when the quiz has fewer hints; at least one)."""


def attempts_before_reveal(hints: int) -> int:
    """How many counted attempts open "Show answer": one per hint, at least 1, at most 3."""
    return max(1, min(ATTEMPTS_BEFORE_REVEAL, hints))


class ChoiceButton(RadioButton):
    """A choice that wraps onto as many lines as it needs (RadioButton draws one line and cuts the
    rest: a right answer read as half a sentence)."""

    DEFAULT_CSS = """
    ChoiceButton { width: 1fr; height: auto; text-wrap: wrap; text-overflow: fold; }
    """

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return max(1, len(self.render().wrap(max(width, 1))))


class QuizBlock(LessonBlock["Quiz"]):
    """```quiz: a number, a choice or a short text, checked against the lesson's own answer."""

    TITLE = "Quiz"
    # A choice is a sentence: it wraps inside the block instead of being cut at the block's edge.
    DEFAULT_CSS = """
    QuizBlock RadioSet { width: 1fr; height: auto; }
    """
    HELP = """\
## Quiz block

Type your answer (or pick a choice) and press **Enter** or *Check*.

- Numbers may carry a unit or a power (`3.4e38`, `2^-24`, `128 KiB`, `800 MB/s`, `2 months`), or be
  arithmetic (`2*80`, `1e3/8`): units are converted to the quiz's, and the block says what it read
  ("read as 0.8 GB/s"). In a quiz in %, `32` and `32%` are 32%, `0.32` is 0.32%. Close enough (the
  quiz's tolerance) is right. An answer that cannot be read, or in a unit of another kind, does not count.
- Each wrong answer reveals the next **hint**, and a wrong choice says why it is wrong.
- *Show answer* opens after a few tries: it shows the answer and the explanation, and the quiz
  counts as seen, not solved (next visit: a fresh draw to solve).
Answers are saved with your progress: reopened, the quiz shows your last answer as it was graded.
"""

    def __init__(self, block: Quiz, *, lesson_id: str, services: Services, done: bool = False,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(block, lesson_id=lesson_id, services=services, done=done, id=id, classes=classes)
        from tutor.lessons.learner import safe_learner_view

        progress = self.services.progress
        self.written = block
        self.block, self.render_error = safe_learner_view(
            block, learner_id=progress.learner_id, lesson_id=self.lesson_id,
            device=self.services.machine, round_=progress.round_of(self.lesson_id, block.id))
        self.attempts = progress.attempts(self.lesson_id, block.id)
        self.revealed = False
        self.solved = False
        """Answered right in this visit: further answers are not graded (a ✗ after a ✓ misleads)."""

    def compose(self) -> ComposeResult:
        quiz = self.block
        yield Static(Text(quiz.question, style="bold"))
        if self.render_error:
            yield Static(Text(f"could not compute a value: {self.render_error}"), classes="error")
        if quiz.kind == "choice":
            with RadioSet(id="choices"):
                for choice in quiz.choices:
                    yield ChoiceButton(str(choice))
        with Horizontal(classes="row"):
            if quiz.kind != "choice":
                unit = quiz.unit
                yield Input(placeholder=f"your answer{f' ({unit})' if unit else ''}", id="answer")
            yield Button("Check", id="check", variant="primary")
            yield Button("Show answer", id="reveal", disabled=not self.can_reveal)
        yield Static(id="saved", classes="status")
        yield Static(id="feedback", classes="status")
        yield Static(id="hints", classes="status")
        yield Static(id="explanation", classes="status")

    @property
    def can_reveal(self) -> bool:
        return self.attempts >= attempts_before_reveal(len(self.block.hints))

    def on_mount(self) -> None:
        self.hints_shown = 0
        for name in ("#saved", "#feedback", "#hints", "#explanation"):
            self.query_one(name).display = False
        if not self.restore_answer() and self.done:  # solved before any answer was saved with it
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
    def check(self, event: Input.Submitted | Button.Pressed | None = None) -> None:
        if event is not None:
            event.stop()
        # The text as it was when Enter was pressed: keys typed after it may already be in the field.
        answer = (event.value.strip() or None) if isinstance(event, Input.Submitted) else self.answer_text()
        feedback = self.query_one("#feedback", Static)
        if answer is None:
            say(feedback, Text("type an answer first" if self.block.kind != "choice" else "pick a choice first",
                                 style="yellow"))
            return
        if self.revealed:
            say(feedback, Text("the answer was shown: come back to this lesson for a fresh try", style="yellow"))
            self.show_verdict()
            return
        if self.solved:  # graded once: a second answer changes nothing (next visit: a fresh draw)
            say(feedback, Text.assemble(("✓ solved. ", "bold green"),
                                        "Come back to this lesson for a fresh draw to try again."))
            self.show_verdict()
            return
        try:
            grade = self.services.grade(self.block, answer, device=self.services.machine)
        except ValueError as error:  # UserError: a broken quiz (content), shown in place
            say(feedback, Text(str(error), style="yellow"))
            return
        if not grade.valid:  # unreadable: not an attempt, no hint given away
            say(feedback, Text(grade.message, style="yellow"))
            return
        self._record(answer, grade.correct)
        say(self.query_one("#saved", Static), "")  # this answer is the one now saved
        if grade.correct:
            self.solved = True
            self.show_grade(answer, grade)
            self.complete()
            self.show_verdict()
            return
        self.attempts += 1
        self._next_hint()
        self.show_grade(answer, grade)
        self.show_verdict()

    def show_grade(self, answer: str, grade: Grade) -> None:
        """The verdict on `answer`: right (with the explanation) or not yet, with what it was read as;
        as a fresh answer shows it, and as a reopened lesson shows the answer saved with the progress."""
        feedback = self.query_one("#feedback", Static)
        read_as = (f" ({grade.read_as} from {answer!r})", "dim") if grade.read_as else ""
        if grade.correct:
            say(feedback, Text.assemble(("✓ right. ", "bold green"), grade.message or "", read_as))
            say(self.query_one("#hints", Static), "")  # the hints were for the wrong answers
            self._explain()
            self.query_one("#reveal", Button).disabled = True
            return
        say(feedback, Text.assemble(("✗ not yet. ", "bold red"), grade.message or "", read_as))
        self.query_one("#reveal", Button).disabled = not self.can_reveal

    def restore_answer(self) -> bool:
        """Show the answer saved with the learner's progress, as it was graded, when it answered this
        round's draw (a later round draws the numbers afresh); False when there is none to show."""
        saved = self.services.progress.answer(self.lesson_id, self.block_id)
        if saved is None or saved.round != self.services.progress.round_of(self.lesson_id, self.block_id):
            return False
        try:
            grade = self.services.grade(self.block, saved.answer, device=self.services.machine)
        except ValueError:  # a broken quiz: checking says so in place
            return False
        if not grade.valid:
            return False
        if self.block.kind == "choice":
            buttons = list(self.query(ChoiceButton))
            if not (saved.answer.isdigit() and int(saved.answer) < len(buttons)):
                return False
            buttons[int(saved.answer)].value = True
        else:
            self.query_one("#answer", Input).value = saved.answer
        if not grade.correct:
            self.hints_shown = 0
            for _ in range(min(self.attempts, len(self.block.hints))):
                self._next_hint()
        self.show_grade(saved.answer, grade)
        say(self.query_one("#saved", Static), Text("your saved answer: change it and press Check to answer again",
                                                   style="dim"))
        return True

    def show_verdict(self) -> None:
        """Scroll the verdict and what follows it (hints, explanation) into view once drawn: an
        answer checked at the bottom of the screen must not be graded below the fold."""
        shown = [widget for widget in (self.query_one(name, Static) for name in ("#feedback", "#hints", "#explanation"))
                 if widget.display]

        def scroll() -> None:
            if shown:
                shown[-1].scroll_visible(animate=False, immediate=True)
                shown[0].scroll_visible(animate=False, immediate=True)  # the verdict first, if all cannot fit

        self.call_after_refresh(scroll)

    def _record(self, answer: str, correct: bool) -> None:
        try:
            self.services.progress.record_answer(self.lesson_id, self.block_id, answer, correct)
        except OSError as error:  # the store keeps its own warning; a lock or disk error must not break the lesson
            self.notify(f"answer not saved: {error}", severity="warning")

    def _next_hint(self) -> None:
        hints = list(self.block.hints)
        if self.hints_shown < len(hints):
            self.hints_shown += 1
        if hints:
            shown = hints[: self.hints_shown]
            say(self.query_one("#hints", Static), 
                "\n".join(f"hint {i + 1}/{len(hints)}: {hint}" for i, hint in enumerate(shown)))

    def _explain(self) -> None:
        explanation = self.block.explanation
        if explanation:
            say(self.query_one("#explanation", Static), Text(explanation))

    @on(Button.Pressed, "#reveal")
    def reveal(self, event: Button.Pressed | None = None) -> None:
        """Give up: show the answer and the explanation; the quiz is seen, not solved."""
        if event is not None:
            event.stop()
        if not self.can_reveal or self.done:
            return
        try:
            expected = self.services.expected_answer(self.block, device=self.services.machine)
        except ValueError as error:
            expected = f"(cannot compute: {error})"
        if self.block.kind == "choice" and isinstance(expected, int) and 0 <= expected < len(self.block.choices):
            expected = self.block.choices[expected]
        if self.block.kind == "number" and isinstance(expected, (int, float)):
            from tutor.lessons.grading import format_expected

            expected = format_expected(self.block, expected)
        say(self.query_one("#feedback", Static), Text.assemble(("answer: ", "bold"), str(expected),
                                                               (" (seen, not solved)", "dim")))
        self._explain()
        self.show_verdict()
        self.revealed = True
        self.query_one("#check", Button).disabled = True
        self.query_one("#reveal", Button).disabled = True
        try:
            self.services.progress.record_reveal(self.lesson_id, self.block_id)
        except OSError as error:  # the store keeps its own warning; a lock or disk error must not break the lesson
            self.notify(f"not saved: {error}", severity="warning")
