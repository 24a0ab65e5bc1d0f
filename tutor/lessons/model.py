"""What a curriculum is made of: tracks and lesson metadata (tutor.lessons.catalog), and the blocks of a
lesson's page.

A lesson page is a sequence of blocks: `Prose` (Markdown, possibly holding `{{ expr }}` values)
and the interactive directives `Bits`, `Calc`, `Measure`, `Predict` and `Quiz`. Every block knows
the line of lesson.md it starts on (`line`), its stable id within the lesson (`id`, used by the
progress file) and which directive it is (`directive`: "prose", "bits", "calc", "measure",
"predict", "quiz").

`kind` names the directive too, except on `Calc` and `Quiz`, where the lesson format uses `kind`
for the calculator ("memory", ...) and the answer type ("number", "choice", "text"). Dispatch on
`directive` (or isinstance), never on `kind`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tutor.lessons.catalog import LessonInfo, Track
from tutor.lessons.fences import DIRECTIVES

__all__ = ["DIRECTIVES", "Bits", "Block", "Calc", "Exercise", "Goal", "Lesson", "LessonInfo", "Measure", "Predict",
           "Prose", "Quiz", "Track"]


@dataclass(frozen=True)
class Prose:
    """Markdown between directives. `{{ expr }}` values are rendered with render_values()."""

    text: str
    line: int = 1
    id: str = ""
    directive: ClassVar[str] = "prose"
    kind: ClassVar[str] = "prose"


@dataclass(frozen=True)
class Bits:
    """A number-format explorer: `value` shown first, in each of `formats` (keys of formats.FORMATS)."""

    value: str
    formats: tuple[str, ...]
    line: int = 1
    id: str = ""
    directive: ClassVar[str] = "bits"
    kind: ClassVar[str] = "bits"


@dataclass(frozen=True)
class Goal:
    """What a calculator exercise asks: the worst device fits `device` with at most `devices_max`
    (and at least `devices_min`) devices. `device` is a card name (tutor.hardware.specs) or a size."""

    device: str
    devices_max: int | None = None
    devices_min: int | None = None
    tokens_per_step_max: int | None = None
    """The largest global batch in tokens (dp x micro-batch x micro-batches x seq) the run may take:
    past the critical batch more tokens per step stop buying fewer steps (McCandlish et al. 2018,
    arXiv 1812.06162), so a layout that fits only by multiplying the batch is no answer."""
    train_tokens: int | None = None
    days_max: float | None = None
    """With train_tokens: the training run must take at most this many days on the layout's counted
    step (tutor.theory.step_time on the goal device's sourced ceilings): fitting is not enough if the
    step is slow."""


@dataclass(frozen=True)
class Calc:
    """A calculator bound to tutor.theory.

    kind: "memory" | "kv-cache" | "parallel" | "flops" | "roofline" (see CALC_KINDS);
    model: the starting preset (or None); fields: the inputs shown, in order (CALC_FIELDS keys);
    values: starting values of fields (field name -> value, already type-checked).
    """

    kind: str
    model: str | None
    fields: tuple[str, ...]
    values: dict[str, Any]
    line: int = 1
    id: str = ""
    goal: Goal | None = None
    """An exercise: the layout the learner finds must fit `goal.device` (tutor.lessons.goals)."""
    goal_hints: tuple[str, ...] = ()
    goal_text: str = ""
    directive: ClassVar[str] = "calc"


@dataclass(frozen=True)
class Measure:
    """Runs probe `probe` of tutor.labs.PROBES with `params` on this machine; `explain` follows the result."""

    probe: str
    params: dict[str, Any]
    explain: str
    line: int = 1
    id: str = ""
    directive: ClassVar[str] = "measure"
    kind: ClassVar[str] = "measure"


@dataclass(frozen=True)
class Predict:
    """The learner commits a guess for `metric` (a key of the probe result's metrics), then it is measured."""

    id: str
    question: str
    probe: str
    params: dict[str, Any]
    metric: str
    unit: str
    line: int = 1
    explain: str = ""
    guess_unit: str = ""
    """The unit a bare guess is read in when the question asks for another than the metric's `unit`
    (tutor.lessons.predictions)."""
    draw: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """(name, values) pairs: one value of each is drawn per learner (tutor.lessons.learner)."""
    drawn: dict[str, Any] | None = None
    """The values drawn for this learner (None until personalised; expressions then see the first ones)."""
    directive: ClassVar[str] = "predict"
    kind: ClassVar[str] = "predict"


@dataclass(frozen=True)
class Quiz:
    """A graded question.

    kind "number": `answer` (a number) or `answer_expr` (evaluated like `{{ }}`), relative `tolerance`,
    `unit` the unit the answer is in (answers in other units of its kind are converted);
    kind "choice": `choices` and `answer`, the 0-based index of the right one, `feedback` one text per
    choice (shown when it is picked), `shuffle` whether the engine shuffles them per learner;
    kind "text": `answer`, one accepted text or a tuple of them (case and spacing ignored), or `answer_expr`.
    """

    id: str
    question: str
    kind: str
    choices: tuple[str, ...]
    answer: str | float | int | tuple[str, ...] | None
    answer_expr: str | None
    tolerance: float
    hints: tuple[str, ...]
    explanation: str
    line: int = 1
    unit: str = ""
    feedback: tuple[str, ...] = ()
    shuffle: bool = True
    draw: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    """(name, values) pairs: one value of each is drawn per learner (tutor.lessons.learner)."""
    drawn: dict[str, Any] | None = None
    """The values drawn for this learner (None until personalised; expressions then see the first ones)."""
    chain: str = ""
    """A worked problem's name: the quizzes of one chain draw each shared name once, so the answer a
    learner carries from one step into the next is the one the next step expects."""
    directive: ClassVar[str] = "quiz"


@dataclass(frozen=True)
class Exercise:
    """Work the learner does and the program checks by running it (tutor.labs.exercise_checks):
    `task` says what to do, `start` is the starting point (it fails its check), `solution` one answer
    that passes (the lint runs both), `hints` open one per failed check, `language` "python" for a
    loop to edit, "text" otherwise."""

    id: str
    task: str
    check: str
    start: str
    solution: str
    hints: tuple[str, ...]
    explanation: str
    language: str = "text"
    line: int = 1
    directive: ClassVar[str] = "exercise"
    kind: ClassVar[str] = "exercise"
    probe: ClassVar[str] = "exercise"


Block = Prose | Bits | Calc | Measure | Predict | Quiz | Exercise


@dataclass(frozen=True)
class Lesson:
    """A parsed lesson: its metadata and its page, in order."""

    info: LessonInfo
    blocks: tuple[Block, ...]
    path: Path | None = field(default=None, compare=False)
    """The lesson.md it came from (None when parsed from a string)."""

    @property
    def id(self) -> str:
        return self.info.id

    def block(self, block_id: str) -> Block:
        """The block with this id (KeyError when there is none)."""
        for block in self.blocks:
            if block.id == block_id:
                return block
        raise KeyError(block_id)

    @property
    def interactive_blocks(self) -> tuple[Block, ...]:
        """Every block but prose: what a learner does in this lesson."""
        return tuple(block for block in self.blocks if block.directive != "prose")

    @property
    def quizzes(self) -> tuple[Quiz, ...]:
        return tuple(block for block in self.blocks if isinstance(block, Quiz))
