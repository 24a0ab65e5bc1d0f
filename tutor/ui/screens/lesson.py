"""The lesson screen: prose and interactive blocks on the left, the live pane on the right.

Below 100 columns (the app's `-narrow` breakpoint) the live pane goes under the prose and keeps
to a few rows; `l` hides or shows it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, VerticalScroll
from textual.geometry import Size
from textual.screen import Screen
from textual.widget import Widget
from textual.css.query import NoMatches
from textual.widgets import Button, Static

from tutor.lessons import model
from tutor.ui.host import tutor_app
from tutor.lessons.progress import REQUIRED_TO_COMPLETE
from tutor.ui.messages import LessonCompleted, OpenLesson
from tutor.ui.widgets.bits import BitsBlock
from tutor.ui.widgets.block import LessonBlock, block_id, fully_visible
from tutor.ui.widgets.calc import CalcBlock
from tutor.ui.widgets.exercise import ExerciseBlock
from tutor.ui.widgets.device_header import DeviceHeader, device_label, device_title
from tutor.ui.widgets.live_pane import LivePane
from tutor.ui.widgets.measure import MeasureBlock, ProbeRunner
from tutor.ui.widgets.predict import PredictBlock
from tutor.ui.widgets.quiz import QuizBlock
from tutor.ui.widgets.footer import TutorFooter

if TYPE_CHECKING:
    from tutor.lessons.model import Block, LessonInfo
    from tutor.ui.services import Services

BLOCK_WIDGETS: dict[str, type[LessonBlock[Block]]] = {
    "bits": BitsBlock,
    "calc": CalcBlock,
    "measure": MeasureBlock,
    "predict": PredictBlock,
    "quiz": QuizBlock,
    "exercise": ExerciseBlock,
}
GRADED = REQUIRED_TO_COMPLETE  # a lesson is completed when all of these are done
EDGE_NOTICE_S = 2.0
"""How long "no more boxes that way" shows; further presses meanwhile add no toast."""


class Prose(Static):
    """A chunk of lesson Markdown, drawn by Rich in one widget. (Textual's Markdown widget makes a
    widget of every paragraph, list item and table cell: a lesson would cost a thousand widgets and
    most of a second to open on a 2-core machine.)"""

    def __init__(self, source: str, *, classes: str | None = None) -> None:
        from rich.markdown import Markdown

        super().__init__(Markdown(source, hyperlinks=False), classes=classes)
        self.source = source


def directive(block: Block) -> str:
    """Which directive a block is ("prose", "quiz", ...); Calc and Quiz use `kind` for other things."""
    return block.directive


class LessonScreen(Screen):
    """One lesson: rendered prose with its blocks mounted in between, and the live pane."""

    CSS_PATH = "lesson.tcss"
    HELP = """\
## Lesson

Read on the left; the boxes are live: type in them, run them, answer them.

- **Enter** runs, checks or commits the box you are in (on the lesson text: goes to the next box).
- **Tab / shift+Tab** move between fields and boxes; **ctrl+↓ / ctrl+↑** (or **] / [** on the text) jump to the next or previous box.
- **↑/↓ PgUp/PgDn** scroll the lesson.
- **n / p** next and previous lesson, **Escape** cancels a running measurement (or goes home).
- **l** hides or shows the live pane; **F1** explains the box you are in.

The lesson is completed when every quiz, prediction and measurement in it is done.
"""

    BINDINGS = [
        Binding("enter", "enter", "Run/check", key_display="Enter"),
        Binding("tab", "app.focus_next", "Field", key_display="Tab"),
        # ctrl+down works inside a text field too (where ] would be typed); ] / [ on the lesson text.
        Binding("ctrl+down,right_square_bracket", "next_block", "Next box", key_display="^↓"),
        Binding("ctrl+up,left_square_bracket", "previous_block", "Prev box", show=False),
        Binding("n", "next", "Next lesson"),
        Binding("p", "previous", "Prev", show=False),
        Binding("escape", "escape", "Home"),
        Binding("l", "toggle_live", "Live"),
    ]

    NARROW_HIDDEN_KEYS = ("n", "l")
    """Keys the footer leaves out below 100 columns, where the line has room for Enter, Tab, the next
    box, Escape, Ctrl+Q and F1 only; they still work (the lesson's last line names n; F1 lists both)."""

    def __init__(self, services: Services, lesson_id: str, *, resume: bool = False) -> None:
        super().__init__()
        self.services = services
        self._resume = resume
        self.lesson = services.curriculum.lesson(lesson_id)
        self.lesson_id = self.lesson.info.id  # the curriculum may resolve a short id
        self._edge_notice_at = -EDGE_NOTICE_S
        self._anchor: tuple[int, float] | None = None
        """Where the learner reads (see _reading_anchor), kept across resizes."""
        self._anchor_size: Size | None = None
        self._restoring = False
        self._opening = True
        """Until focus_first_block has run: an Enter on the lesson text presses the opening Run."""

    @property
    def info(self) -> LessonInfo:
        return self.lesson.info

    def compose(self) -> ComposeResult:
        curriculum = self.services.curriculum
        position = [info.id for info in curriculum.lessons].index(self.lesson_id) + 1
        yield DeviceHeader(device_title(self.services.machine), f"{position}/{len(curriculum.lessons)} {self.info.title}",
                           label=device_label(self.services.machine))
        with Horizontal(id="body"):
            with VerticalScroll(id="lesson"):
                yield Static(self._heading(), id="heading")
                yield from self._blocks()
                yield Static(self._footer_line(), id="lesson-end")
            yield LivePane(self.services.machine, self.services.sampler, id="live")
        yield TutorFooter()

    def _heading(self) -> Text:
        info = self.info
        details = f"{info.track} · {info.minutes} min"
        if info.prerequisites:
            details += " · after " + ", ".join(info.prerequisites)
        first = self.lesson.blocks[0] if self.lesson.blocks else None
        if isinstance(first, model.Prose) and first.text.lstrip().startswith("# "):
            return Text(details, style="dim")  # the page opens with its own title
        return Text.assemble((info.title, "bold underline"), "\n", (details, "dim"))

    def _blocks(self) -> list[Widget]:
        state = self.services.progress.lesson_state(self.lesson_id)
        widgets: list[Widget] = []
        for block in self.lesson.blocks:
            kind = directive(block)
            if isinstance(block, model.Prose):
                widgets.append(Prose(self._render_prose(block.text), classes="prose"))
                continue
            widget_class = BLOCK_WIDGETS.get(kind)
            if widget_class is None:
                widgets.append(Static(f"(unknown block {kind!r} at line {block.line})", classes="error"))
                continue
            if isinstance(block, model.Measure):  # quiz, predict and calc render their own texts (with the learner's draws)
                block = self._render_block(block)
            widgets.append(widget_class(block, lesson_id=self.lesson_id, services=self.services,
                                        done=block_id(block) in state.done_blocks))
        return widgets

    def _render_block(self, block: model.Measure) -> model.Measure:
        from tutor.lessons.learner import render_block

        try:
            return render_block(block, device=self.services.machine)
        except ValueError:  # a broken {{ }}: the block shows its text as written; the lint names it
            return block

    def _render_prose(self, text: str) -> str:
        try:
            return self.services.render_values(text, device=self.services.machine)
        except ValueError as error:  # a broken {{ }} is shown in place, never a crash
            return f"{text}\n\n> **could not compute a value:** {error}"

    def _footer_line(self) -> Text:
        curriculum = self.services.curriculum
        following = curriculum.next_lesson(self.lesson_id)
        previous = curriculum.previous_lesson(self.lesson_id)
        text = Text()
        if previous is not None:
            text.append(f"p: ← {self._title(previous)}   ", style="dim")
        text.append(f"n: {self._title(following)} →" if following is not None else "the last lesson: well done",
                    style="bold")
        return text

    @staticmethod
    def _title(lesson: LessonInfo) -> str:
        return lesson.title

    def on_mount(self) -> None:
        self.services.progress.set_last_lesson(self.lesson_id)
        self.query_one("#lesson").focus(scroll_visible=False)
        self.call_after_refresh(self.settle_then_focus)
        self.call_after_refresh(self.fit_footer)
        self.watch(self.query_one("#lesson"), "scroll_y", self._remember_reading, init=False)

    def settle_then_focus(self) -> None:
        # The first refresh lays out the lesson; the live pane then shares out its height (at 80x24
        # it is stacked under the lesson): look once that second layout is done.
        place = self.services.progress.place(self.lesson_id) if self._resume else None
        if place is not None:  # Continue: back where the learner left the lesson, the focus on its text
            self._anchor = place
            self._restoring = True
            self.call_after_refresh(self._restore_reading)
            self._opening = False
            return
        self.call_after_refresh(self.focus_first_block)

    def focus_first_block(self) -> None:
        """Focus the first box's Run when the first box is a measurement whose Run is on screen once
        the layout has settled (the block says "press Run (Enter)": Enter must do it, at 80x24 too,
        where the box is cut by the bottom edge). A Run out of sight is not focused: focus stays on
        the lesson text, where arrows and PgDn read on and Enter or Tab go to the first box. A box
        that opens on a text field (bits, quiz, predict) is not focused: n, p and l would be typed."""
        run = self._opening_run()
        self._opening = False
        if run is not None:
            run.focus(scroll_visible=False)

    def _opening_run(self) -> Button | None:
        """The first box's Run when the lesson opens on it: the first box is a measurement, its Run
        is fully on screen and the learner has not moved the focus off the lesson text yet."""
        first = next(iter(self.query(LessonBlock)), None)
        if not isinstance(first, MeasureBlock):
            return None
        run = first.query_one("#run", Button)
        return run if self.focused is self.query_one("#lesson") and fully_visible(run) else None

    # ---- moving between boxes -------------------------------------------------------------

    def blocks(self) -> list[LessonBlock]:
        return list(self.query(LessonBlock))

    def current_block(self) -> LessonBlock | None:
        """The box holding the focus, None when the focus is on the lesson text or elsewhere."""
        focused = self.focused
        return next((node for node in (focused.ancestors_with_self if focused is not None else ())
                     if isinstance(node, LessonBlock)), None)

    def _block_after_view(self, forward: bool) -> LessonBlock | None:
        """Without a focused box: the first box starting below the top of the view (forward), or
        the last one starting above it."""
        scroller = self.query_one("#lesson", VerticalScroll)
        top = scroller.scroll_y
        blocks = self.blocks()
        if forward:
            return next((b for b in blocks if b.virtual_region.y >= top), None)
        return next((b for b in reversed(blocks) if b.virtual_region.y < top), None)

    def focus_block(self, block: LessonBlock) -> None:
        """Focus the box's first field or button and bring the box into view."""
        target = next((node for node in block.query("*") if node.focusable), None)
        if target is not None:
            # At once, not target.focus() (which waits its turn behind keys already queued): what is
            # typed right after Ctrl+Down goes into the box it moved to.
            self.set_focus(target, scroll_visible=False)
        block.scroll_visible(animate=False, top=True)

    def _step_block(self, forward: bool) -> None:
        blocks = self.blocks()
        current = self.current_block()
        if current is None:
            target = self._block_after_view(forward)
        else:
            index = blocks.index(current) + (1 if forward else -1)
            target = blocks[index] if 0 <= index < len(blocks) else None
        if target is None:
            self._edge_notice("no more boxes that way" if blocks else "this lesson has no boxes")
            return
        self.focus_block(target)

    def _edge_notice(self, text: str) -> None:
        """Say there is no box that way, once while the notice shows: held Ctrl+Up at the first box (or
        a script's extra presses) stacked one toast per press, five deep over the lesson at 80x24."""
        now = time.monotonic()
        if now - self._edge_notice_at < EDGE_NOTICE_S:
            return
        self._edge_notice_at = now
        self.notify(text, timeout=EDGE_NOTICE_S)

    def action_next_block(self) -> None:
        """]: the next interactive box, focused and in view."""
        self._step_block(True)

    def action_previous_block(self) -> None:
        self._step_block(False)

    def action_enter(self) -> None:
        """Enter where no field or button takes it (the lesson text): go to the next box. Before the
        opening focus has settled (two refreshes after the first paint: under load, seconds after
        "press Run (Enter)" is painted), an Enter is the one the block asks for and presses Run."""
        run = self._opening_run() if self._opening else None
        if run is not None:
            self._opening = False
            run.focus(scroll_visible=False)
            run.press()
            return
        self._step_block(True)

    # ---- the reading position survives a resize ----------------------------------------------

    def _reading_anchor(self) -> tuple[int, float] | None:
        """(index of the lesson part at the top of the view, how far into it), to restore after a
        resize reflows the text."""
        scroller = self.query_one("#lesson", VerticalScroll)
        top = scroller.scroll_y
        for index, child in enumerate(scroller.children):
            region = child.virtual_region
            if region.height and region.y <= top < region.y + region.height:
                return index, (top - region.y) / region.height
        return None

    def _remember_reading(self, *_: object) -> None:
        scroller = self.query_one("#lesson", VerticalScroll)
        if self._restoring or (self._anchor_size is not None and scroller.size != self._anchor_size):
            return  # a scroll the resize itself made (clamping): not the learner's place
        self._anchor_size = scroller.size
        self._anchor = self._reading_anchor()

    def on_resize(self) -> None:
        self._restoring = True
        self.call_after_refresh(self._restore_reading)
        self.call_after_refresh(self.fit_footer)

    def fit_footer(self) -> None:
        """Show the NARROW_HIDDEN_KEYS in the footer on a wide screen only."""
        show = not self.has_class("-narrow")
        keys = self._bindings.key_to_bindings
        changed = False
        for key in self.NARROW_HIDDEN_KEYS:
            bindings = keys.get(key, [])
            if any(binding.show != show for binding in bindings):
                keys[key] = [dataclasses.replace(binding, show=show) for binding in bindings]
                changed = True
        if changed:
            self.refresh_bindings()

    def _restore_reading(self) -> None:
        scroller = self.query_one("#lesson", VerticalScroll)
        anchor = self._anchor
        if anchor is not None and anchor[0] < len(scroller.children):
            child = scroller.children[anchor[0]]
            region = child.virtual_region
            scroller.scroll_to(y=region.y + anchor[1] * region.height, animate=False, immediate=True)
        self._anchor_size = scroller.size
        self._restoring = False

    # ---- progress -----------------------------------------------------------------------

    def graded_ids(self) -> set[str]:
        return {block_id(b) for b in self.lesson.blocks if directive(b) in GRADED}

    @on(LessonBlock.Completed)
    def _block_completed(self, message: LessonBlock.Completed) -> None:
        progress = self.services.progress
        try:
            progress.mark_block(self.lesson_id, message.block.block_id)
            done = progress.lesson_state(self.lesson_id).done_blocks
            if not progress.lesson_state(self.lesson_id).completed and self.graded_ids() <= set(done):
                progress.mark_completed(self.lesson_id)
                self.notify(f"Lesson complete: {self.info.title}. Press n for the next one.")
                self.post_message(LessonCompleted(self.lesson_id))
        except OSError as error:
            self.notify(f"progress not saved: {error}", severity="warning")

    # ---- keys ---------------------------------------------------------------------------

    def running_runners(self) -> list[ProbeRunner]:
        return [runner for runner in self.query(ProbeRunner) if runner.running]

    def cancel_measurements(self) -> None:
        for runner in self.running_runners():
            runner.cancel()

    def _go(self, lesson: LessonInfo | None) -> None:
        if lesson is None:
            self.notify("no lesson that way")
            return
        if not self.graded_ids() and not self.services.progress.lesson_state(self.lesson_id).completed:
            # A lesson with nothing to answer or run is completed by reading to its end.
            self.services.progress.mark_completed(self.lesson_id)
        self.save_place()
        self.post_message(OpenLesson(lesson.id))

    def action_next(self) -> None:
        self._go(self.services.curriculum.next_lesson(self.lesson_id))

    def action_previous(self) -> None:
        self._go(self.services.curriculum.previous_lesson(self.lesson_id))

    def action_escape(self) -> None:
        from textual.widgets import Input

        if self.running_runners():
            self.cancel_measurements()
        elif isinstance(self.focused, Input):
            # Esc in a field leaves the field, its text kept; a second Esc leaves the lesson.
            self.set_focus(None)
        elif (app := tutor_app(self.app)) is not None:
            self.save_place()
            app.action_home()

    def action_toggle_live(self) -> None:
        live = self.query_one("#live", LivePane)
        live.display = not live.display

    def on_unmount(self) -> None:
        # Leaving the lesson (n/p, home, quit) stops its measurement: nobody would see the result.
        self.cancel_measurements()
        self.save_place()

    def save_place(self) -> None:
        """Keep where the learner is reading (Continue returns there): the view's place now, else the last one
        seen (once the screen is being taken down its text can no longer be asked)."""
        try:
            place = self._reading_anchor() or self._anchor
        except NoMatches:
            place = self._anchor
        if place is not None:
            self.services.progress.set_place(self.lesson_id, place)
