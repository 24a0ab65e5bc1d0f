"""The home screen: the tracks with the learner's progress, and every lesson one Enter away."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import Screen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from tutor.formatting import format_count
from tutor.lessons.progress import blocks_done, track_blocks_done
from tutor.ui.host import tutor_app
from tutor.ui.messages import OpenLesson
from tutor.ui.widgets.device_header import DeviceHeader, device_label, device_title
from tutor.ui.widgets.footer import TutorFooter

if TYPE_CHECKING:
    from tutor.hardware.machine import Machine
    from tutor.lessons.model import LessonInfo, Track
    from tutor.ui.services import Services


DETECTING = "detecting this machine…"
"""The header's device line until the machine is detected (after the home screen's first paint)."""


def blocks_text(done: int, total: int) -> str:
    """'4/7 blocks' (blocks solved of those that complete it); '' where there is nothing to solve."""
    return f"{format_count(done)}/{format_count(total)} blocks" if total else ""


def track_heading(track: Track, done: int, total: int, blocks: tuple[int, int] = (0, 0)) -> Text:
    """'Precision and number formats  2/4 lessons · 11/30 blocks' with the track's summary dimmed below."""
    mark = "✓ " if total and done == total else ""
    counts = f"  {format_count(done)}/{format_count(total)} lessons"
    if blocks_text(*blocks):
        counts += f" · {blocks_text(*blocks)}"
    heading = Text.assemble((f"{mark}{track.title}", "bold"), (counts, "cyan"))
    if track.summary:
        heading.append(f"\n{track.summary}", style="dim")
    return heading


def lesson_line(info: LessonInfo, completed: bool, current: bool, blocks: tuple[int, int] = (0, 0)) -> Text:
    """'  ▶ What a float is made of  8 min  1/2 blocks'."""
    mark = ("✓", "green") if completed else (("▶", "yellow") if current else ("·", "dim"))
    counts = blocks_text(*blocks)
    return Text.assemble("  ", mark, " ", (info.title, "bold" if current else ""),
                         (f"  {info.minutes} min", "dim"), (f"  {counts}" if counts else "", "cyan"))


class HomeScreen(Screen):
    """Tracks and lessons; Enter opens the highlighted lesson."""

    # Its styles are in app.tcss (parsed with the app, not when this first screen opens).
    HELP = """\
## Home

The tracks of the course, each with how many of its lessons you have completed and how many of
their blocks (quizzes, predictions, measurements, exercises) you have solved; each lesson with its own count.

- **↑/↓** move, **Enter** opens a lesson, **c** continues where you left off.
- **b** opens the Bench (measure this machine), **f** the Fit check.
- **ctrl+p** opens the command palette: go to any lesson, run the benchmark, change the theme.
"""

    BINDINGS = [
        Binding("c", "continue", "Continue"),
        Binding("b", "app.bench", "Bench"),
        Binding("f", "app.fit", "Fit"),
        Binding("q", "app.quit", "Quit", show=False),
    ]

    def __init__(self, services: Services) -> None:
        super().__init__()
        self.services = services
        self._resumed = False

    def compose(self) -> ComposeResult:
        machine = self.services.machine_detection.ready()
        if machine is None:
            yield DeviceHeader(DETECTING, "Home")
        else:
            yield DeviceHeader(device_title(machine), "Home", label=device_label(machine))
        with Vertical(id="home"):
            yield Static(self._welcome(), id="welcome")
            yield OptionList(id="lessons")
        yield TutorFooter()

    def _welcome(self) -> Text:
        lessons = self.services.curriculum.lessons
        return Text.assemble(("The hardware behind LLMs, explained and measured on this machine. ", "bold"),
                             (f"{len(self.services.curriculum.tracks)} tracks, {len(lessons)} lessons. "
                              "Enter opens a lesson; b then r measures this machine in 20 s; F1 help anywhere.",
                              "dim"))

    def on_mount(self) -> None:
        self.refresh_lessons()
        self.query_one(OptionList).focus()
        app = tutor_app(self.app)
        if self.services.machine_detection.ready() is None and app is not None:
            self.watch(self.app, "detected_machine", self._machine_detected)

    def _machine_detected(self, machine: Machine | None) -> None:
        if machine is not None:
            self.query_one(DeviceHeader).show_device(device_title(machine), device_label(machine))

    def on_screen_resume(self) -> None:
        if self._resumed:
            self.refresh_lessons(follow_last_lesson=True)
        self._resumed = True  # the first resume follows on_mount's listing: nothing changed between them

    def refresh_lessons(self, follow_last_lesson: bool = False) -> None:
        """Rebuild the list from the curriculum and the progress file, keeping the highlight (or,
        back from a lesson, moving it to the lesson the learner was in)."""
        option_list = self.query_one(OptionList)
        highlighted = option_list.highlighted
        progress = self.services.progress
        current = progress.last_lesson
        if follow_last_lesson and current is not None:
            highlighted = None
        curriculum = self.services.curriculum
        infos = {info.id: info for info in curriculum.lessons}
        options: list[Option | None] = []
        for index, track in enumerate(curriculum.tracks):
            if index:
                options.append(None)  # a separator line between tracks
            done, total = progress.track_progress(track)
            blocks = track_blocks_done(track, infos, lambda lesson_id: progress.lesson_state(lesson_id).done_blocks)
            options.append(Option(track_heading(track, done, total, blocks), id=f"track:{track.id}", disabled=True))
            for lesson_id in track.lesson_ids:
                state = progress.lesson_state(lesson_id)
                options.append(Option(lesson_line(infos[lesson_id], state.completed, lesson_id == current,
                                                  blocks_done(infos[lesson_id], state.done_blocks)), id=lesson_id))
        option_list.clear_options()
        option_list.add_options(options)
        if highlighted is not None and highlighted < option_list.option_count:
            option_list.highlighted = highlighted
        elif current is not None and current in infos:
            option_list.highlighted = option_list.get_option_index(current)
        else:
            option_list.highlighted = next(
                (i for i in range(option_list.option_count) if not option_list.get_option_at_index(i).disabled), None)

    @on(OptionList.OptionSelected)
    def _open(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        if event.option.id and not event.option.id.startswith("track:"):
            self.post_message(OpenLesson(event.option.id))

    def action_continue(self) -> None:
        """Open the last lesson where the learner left it, or the first not completed."""
        progress = self.services.progress
        target = progress.last_lesson
        if target is None:
            target = next((info.id for info in self.services.curriculum.lessons
                           if not progress.lesson_state(info.id).completed), None)
        if target is None and self.services.curriculum.lessons:
            target = self.services.curriculum.lessons[0].id
        if target is not None:
            self.post_message(OpenLesson(target, resume=True))
