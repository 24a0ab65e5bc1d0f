"""What every interactive lesson block shares: its lesson, its id for progress, its help text."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Generic, TypeVar

from rich.console import RenderableType
from textual.containers import Vertical
from textual.message import Message
from textual.widget import Widget
from textual.widgets import Static

if TYPE_CHECKING:
    from tutor.lessons.model import Block
    from tutor.ui.services import Services

B = TypeVar("B", bound="Block", covariant=True)
"""The kind of lesson block a widget shows (tutor.lessons.model: Quiz, Measure, ...)."""


def say(static: Static, content: RenderableType, style_class: str | None = None) -> None:
    """Show `content` in `static` (hidden while empty), optionally as "status", "error" or "good"."""
    static.update(content)
    static.display = bool(content)
    if style_class is not None:
        static.set_classes(style_class)


def fully_visible(widget: Widget) -> bool:
    """Whether all of `widget` is on screen now (not scrolled out of its container, not hidden)."""
    try:
        geometry = widget.screen.find_widget(widget)
    except Exception:  # not laid out (yet): nothing to reveal
        return False
    region = geometry.region
    return bool(region.area) and region.intersection(geometry.clip) == region


def reveal(widget: Widget) -> bool:
    """True when `widget` is fully on screen; otherwise scroll it into view and return False, so
    that a key press on something the learner cannot see shows it instead of acting on it."""
    if fully_visible(widget):
        return True
    widget.scroll_visible(animate=False)
    return False


def block_id(block: Block) -> str:
    """The id progress is recorded under: the block's own `id` (quiz, predict), else kind@line."""
    return block.id if block.id else f"{block.kind}@{block.line}"


class LessonBlock(Vertical, Generic[B]):
    """A bordered block between prose chunks. Subclasses set HELP (Markdown shown by F1)."""

    HELP: ClassVar[str] = ""
    TITLE: ClassVar[str] = "Block"

    DEFAULT_CSS = """
    LessonBlock {
        height: auto;
        border: round $secondary 60%;
        border-title-color: $text-secondary;
        padding: 0 1;
        margin: 1 0;
    }
    LessonBlock:focus-within { border: round $accent; }
    LessonBlock .row { height: auto; }
    LessonBlock .status { color: $text-muted; height: auto; }
    LessonBlock .error { color: $text-error; height: auto; }
    LessonBlock .good { color: $text-success; height: auto; }
    LessonBlock Input { width: 1fr; }
    LessonBlock Button { min-width: 10; margin-left: 1; }
    LessonBlock .row ProgressBar { margin: 1 0 0 2; }
    """

    class Completed(Message):
        """The learner finished this block (answered, measured, predicted)."""

        def __init__(self, block: "LessonBlock") -> None:
            super().__init__()
            self.block = block

        @property
        def control(self) -> "LessonBlock":
            return self.block

    def __init__(self, block: B, *, lesson_id: str, services: Services, done: bool = False,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.block = block
        self.lesson_id = lesson_id
        self.services = services
        self.done = done
        self.border_title = self.TITLE

    @property
    def block_id(self) -> str:
        return block_id(self.block)

    def complete(self) -> None:
        """Mark this block done (once) and tell the lesson screen."""
        if not self.done:
            self.done = True
            self.post_message(self.Completed(self))
