"""The tensor-tutor app: home (tracks and progress), lessons, Bench and Fit screens, help and palette.

`TutorApp(services)` takes everything it shows from a `tutor.ui.services.Services`; without one it
builds the real services (this machine, the shipped lessons, saved progress and settings). When the
services have a measurement process (`services.worker`), the app starts it once the home screen is
painted, so torch loads while the learner reads the home screen, follows its state in `worker_state`
(screens can watch it) and stops it on exit. The machine is detected in a thread after that first
paint too (`detected_machine`; the home screen's header says "detecting…" until then), and the live
sampler starts then: before the first paint the app imports and runs only what the home screen shows
(tests/test_ui_launch_imports.py).
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import sys
import time
from typing import TYPE_CHECKING, ClassVar, Protocol, TextIO, runtime_checkable

from textual import events, on
from textual.app import App
from textual.binding import Binding, BindingType
from textual.filter import DimFilter, LineFilter
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen, Screen
from textual.theme import Theme
from textual.widget import Widget
from textual.widgets import Input

from tutor.ui import guard, palette
from tutor.ui.commands import TutorCommands
from tutor.ui.messages import OpenLesson
from tutor.ui.screens.home import HomeScreen
from tutor.ui.services import Services
from tutor.worker.client import WorkerState

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tutor.hardware.machine import Machine
    from tutor.labs import ProbeResult
    from tutor.lessons.model import Measure, Predict
    from tutor.ui.widgets.measure import ProbeRunner, ResultStore


@runtime_checkable
class CancelsMeasurements(Protocol):
    """A screen that runs measurements (the lesson screen): quitting stops them."""

    def cancel_measurements(self) -> None: ...


@runtime_checkable
class Cancels(Protocol):
    """A screen with one cancellable run (the Bench screen's suite)."""

    def cancel(self) -> None: ...


PROGRESS_WARNING_CHECK_S = 2.0
"""How often the app looks for a new progress warning (a write that failed since the last look)."""


FULL_COLLECTION_EVERY_S = 20.0
"""How often the app runs the collector's full pass itself, when no key came for INPUT_QUIET_S."""
INPUT_QUIET_S = 1.0
IDLE_CHECK_S = 2.0
KEYLOG_ENV = "TENSOR_TUTOR_KEYLOG"
"""A file the app appends `<time.monotonic_ns()> <key>` to for every key it receives (the tmux key
benchmarks read it: tmux send -> the app's loop). Unset, nothing is opened or written."""
STRICT_ENV = "TENSOR_TUTOR_UI_STRICT"
"""Set to 1: an exception in a handler ends the app with its traceback, as Textual does by default
(the tests run so, to see every failure); unset, it becomes a notice (tutor.ui.guard)."""
FAILURE_NOTICE_REPEAT_S = 30.0
"""The same failure (same place, same error) is noticed at most once in this long; the log has each."""
FAILURE_STORM = (50, 1.0)
"""More failures than this in this many seconds: handling them is what fails (a frame that cannot be
drawn, a notice that fails in turn); the app ends with the traceback, as Textual does, rather than spin."""
HELD_FULL_COLLECTIONS = 1_000_000
"""The collector's third threshold while the app runs: its own full passes never come (see
`hold_full_collections`); young-generation passes (about 1 ms) run as usual."""


def freeze_start_up_objects() -> None:
    """Move every object alive after start-up (modules, classes, the home screen) out of the
    collector's reach. A full collection scans every tracked object: measured in this app on the
    2-core machine, ~89,000 objects took 125-155 ms, and a key press that arrived meanwhile waited
    that long (the key goal is 100 ms). Frozen objects are never scanned again (CPython's
    gc.freeze). rich.markdown is imported first: help (F1) needs it, and its import is a pause too."""
    import rich.markdown  # noqa: F401 - loaded now, not on the first F1

    gc.freeze()
    gc.enable()  # off since launch when tutor.commands.app_start started the app; a no-op otherwise


def hold_full_collections() -> tuple[int, int, int]:
    """Stop the collector's own full passes; returns the thresholds to restore. Measured in this
    app while the Bench suite ran: help opened and closed made a full pass every ~0.7 s, each 30-95
    ms; the F1 presses that met one took 180-190 ms. `TutorApp.collect_when_idle` runs them instead."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], HELD_FULL_COLLECTIONS)
    return thresholds


def open_keylog(path: str) -> TextIO | None:
    """The key log named by $TENSOR_TUTOR_KEYLOG, line-buffered (one write per key), None when unset
    or not writable (the app runs without it)."""
    if not path:
        return None
    try:
        return open(path, "a", buffering=1, encoding="utf-8")
    except OSError:
        return None


@functools.cache
def _class_handles_keys(cls: type) -> bool:
    return (getattr(cls, "_on_key", None) is not getattr(Widget, "_on_key", None)
            or getattr(cls, "handle_key", None) is not getattr(Widget, "handle_key", None)
            or hasattr(cls, "on_key") or any(name.startswith("key_") for name in dir(cls)))


def handles_keys_itself(node: object) -> bool:
    """Whether a widget acts on keys in its own handlers (Input, TextArea, a Select's list: an
    `_on_key`, `on_key` or `key_` method), not only through bindings."""
    return isinstance(node, Widget) and _class_handles_keys(type(node))


guard.install()


class TutorApp(App[None]):
    """The tutor: learn, measure, check the fit."""

    CSS_PATH = "app.tcss"
    TITLE = "tensor-tutor"
    # Below 100 columns screens get the -narrow class and stack their panes (see each .tcss).
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-wide")]
    COMMANDS = App.COMMANDS | {TutorCommands}
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f1", "help", "Help", tooltip="Help for the focused box"),
        Binding("h", "home", "Home", show=False),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    worker_state: reactive[WorkerState] = reactive(WorkerState("not started"), init=False)
    """What the measurement process is doing (starting, loading torch, ready, busy, restarting,
    failed with its reason); `WorkerState.text` is the line to show."""

    detected_machine: reactive[Machine | None] = reactive(None, init=False)
    """This machine once detected (None before: the home screen's header says "detecting…")."""

    class MachineDetected(Message):
        """The machine detection thread finished."""

        def __init__(self, machine: Machine) -> None:
            super().__init__()
            self.machine = machine

    class WorkerStateChanged(Message):
        """The measurement process changed state (posted from whichever thread saw it)."""

        def __init__(self, state: WorkerState) -> None:
            super().__init__()
            self.state = state

    def __init__(self, services: Services | None = None, *, lesson_id: str | None = None) -> None:
        super().__init__()
        # Dim text kept at WCAG AA (tutor.ui.palette): a terminal's own dim is half way to the background.
        self._dim_filter = DimFilter(dim_factor=palette.DIM_FACTOR)
        self._terminal_bases = {True: self.ansi_theme_dark, False: self.ansi_theme_light}
        self._markdown_theme_pushed = False
        self.apply_palette(self.current_theme, starting=True)
        if services is None:
            from tutor.ui.services import default_services

            services = default_services()
        self.services = services
        self.start_lesson = lesson_id
        self.active_runner: ProbeRunner[Measure | Predict] | None = None
        """The ProbeRunner measuring now: only one probe runs at a time (two would measure each other)."""
        self.last_input_at = 0.0
        """time.monotonic() of the last key or click (full collections wait for a quiet moment)."""
        self.last_collection_at = time.monotonic()
        self._gc_thresholds: tuple[int, int, int] | None = None
        self.last_result: ProbeResult | None = None
        """The latest measure block's ProbeResult (set by the lesson screen): what palette Export saves
        when the screen shows no result of its own (tutor.ui.commands.current_result)."""
        self._measured_results: ResultStore | None = None
        self.shut_down = False
        """True once the app ran and shut down (its screens closed, the measurement process killed)."""
        self._keylog = open_keylog(os.environ.get(KEYLOG_ENV, ""))
        self.recover_failures = os.environ.get(STRICT_ENV, "") != "1"
        """Whether an exception in a handler becomes a notice (tutor.ui.guard) once the app runs."""
        self.failures: list[str] = []
        """Each failure turned into a notice this session, as its one line (what failed, and the error)."""
        self._failures_armed = False
        self._failure_times: list[float] = []
        self._failure_noticed: dict[str, float] = {}

    def get_css_variables(self) -> dict[str, str]:
        """The theme's variables, its text colours made readable on its backgrounds (tutor.ui.palette)."""
        return palette.readable_variables(super().get_css_variables())

    def get_line_filters(self) -> Sequence[LineFilter]:
        return [*super().get_line_filters(), self._dim_filter]

    def apply_palette(self, theme: Theme, *, starting: bool = False) -> None:
        """Readable text on `theme` (tutor.ui.palette): its ANSI colours, and Markdown headings and code in
        colours that reach WCAG AA on its backgrounds. At start-up without a restyle (nothing is styled yet)."""
        from rich.theme import Theme as RichTheme

        terminal, styles = palette.theme_palette(theme.to_color_system().generate(), self._terminal_bases[theme.dark],
                                                 theme.dark)
        reactive_name = "ansi_theme_dark" if theme.dark else "ansi_theme_light"
        if starting:
            self.set_reactive(getattr(TutorApp, reactive_name), terminal)
            self._refresh_truecolor_filter(terminal)
        else:
            setattr(self, reactive_name, terminal)
        if self._markdown_theme_pushed:
            self.console.pop_theme()
        self.console.push_theme(RichTheme(styles))
        self._markdown_theme_pushed = True

    @property
    def measured_results(self) -> ResultStore:
        """Measure results kept this session, per lesson and block (tutor.ui.widgets.measure.result_store);
        made on first use, so the measure widget's module is imported with the first lesson, not at launch."""
        if self._measured_results is None:
            from tutor.ui.widgets.measure import ResultStore

            self._measured_results = ResultStore()
        return self._measured_results

    def on_mount(self) -> None:
        worker = self.services.worker
        if worker is not None:
            worker.subscribe(self._post_worker_state)
        self.detected_machine = self.services.machine_detection.ready()
        # After the first paint: the home screen waits for no process start, detection or sampler.
        self.call_after_refresh(self.start_after_first_paint)
        theme = self.services.settings.theme
        if theme and theme in self.available_themes:
            self.theme = theme
        self.theme_changed_signal.subscribe(self, self.apply_palette)
        self.theme_changed_signal.subscribe(self, self._save_theme)
        if self.start_lesson is not None:
            self.open_lesson(self.start_lesson)
        for warning in self.services.warnings:
            self.notify(warning, severity="warning", timeout=8)
        self._progress_warning = self.services.progress.warning
        self.set_interval(PROGRESS_WARNING_CHECK_S, self.show_progress_warning)
        self.call_after_refresh(freeze_start_up_objects)
        self._gc_thresholds = hold_full_collections()
        self.set_interval(IDLE_CHECK_S, self.collect_when_idle)

    def get_default_screen(self) -> Screen:
        """The home screen, as the first screen of the stack: composed and laid out inside Textual's
        start-up batch, so the first frame rendered is the one painted. Pushed from on_mount above a
        blank default screen, it was rendered once in that batch and the frame thrown away (the
        batch suppresses painting, not rendering): 13-20 ms of the launch on the 2-core machine."""
        return HomeScreen(self.services)

    def start_after_first_paint(self) -> None:
        """What the home screen does not show, started once it is painted: the machine's detection
        (a thread), the live sampler (its thread) and the measurement process. From now on a failing
        handler is a notice (before, one is a start-up failure: Textual's exit with the traceback)."""
        self._failures_armed = True
        if self.detected_machine is None:
            self.run_worker(self._detect_machine, thread=True, exclusive=True, group="machine-detection",
                            exit_on_error=False)
        self.services.sampler.start()
        worker = self.services.worker
        if worker is not None:
            worker.start()

    def _detect_machine(self) -> None:
        self.post_message(self.MachineDetected(self.services.machine_detection.result()))

    @on(MachineDetected)
    def _machine_detected(self, message: MachineDetected) -> None:
        self.detected_machine = message.machine

    async def on_event(self, event: events.Event) -> None:
        if isinstance(event, (events.Key, events.MouseDown)):
            self.last_input_at = time.monotonic()
            if self._keylog is not None and isinstance(event, events.Key) and not event.is_forwarded:
                self._keylog.write(f"{time.monotonic_ns()} {event.key}\n")
        if isinstance(event, events.Key) and not event.is_forwarded and await self.key_in_order(event):
            return
        await super().on_event(event)

    async def key_in_order(self, event: events.Key) -> bool:
        """Apply a key here, in the order the keys came, when its effect is known without a trip
        through the widgets: a character typed into a focused text field, or a key bound on the
        focus chain where no widget handles keys itself. True when done (nothing is forwarded).

        Textual hands a typed character to the field at once (one hop, the field's queue), but a
        bound key (Backspace, End, Ctrl+U, arrows, Ctrl+Down) only after it has bubbled from the
        focused widget up to the app, a hop per widget. Keys that arrive together (a stalled loop,
        a fast typist, tmux send-keys) were then applied out of order: `50` Enter Backspace
        Backspace `0.368` became `500.3`, and characters typed right after Ctrl+Down went to the
        box being left. Each key here has the effect Textual gives it after all the hops."""
        if self.screen.maximized is not None:
            return False
        focused = self.focused
        chain = list(focused.ancestors_with_self) if focused is not None else [self.screen]
        field = focused if isinstance(focused, Input) else None
        if any(handles_keys_itself(node) for node in chain if node is not field and node is not self):
            return False  # a TextArea, a Select's list: Textual's own path
        self.app_focus = True
        self.screen._clear_tooltip()
        if await self._check_bindings(event.key, priority=True):
            return True
        if field is not None and event.is_printable:
            await field._on_key(event)  # what the field does with a character: insert at the cursor
            return True
        return await self._check_bindings(event.key)  # the focused widget's binding, else its boxes', screen's, app's

    def collect_when_idle(self) -> bool:
        """Run the collector's full pass when FULL_COLLECTION_EVERY_S have passed since the last
        and no key came for INPUT_QUIET_S (a pause nobody waits on); True when it ran."""
        now = time.monotonic()
        if now - self.last_collection_at < FULL_COLLECTION_EVERY_S or now - self.last_input_at < INPUT_QUIET_S:
            return False
        gc.collect()
        self.last_collection_at = time.monotonic()
        return True

    def _post_worker_state(self, state: WorkerState) -> None:
        # Called from the worker client's threads: post_message is the thread-safe way in.
        self.post_message(self.WorkerStateChanged(state))

    @on(WorkerStateChanged)
    def _worker_state_changed(self, message: WorkerStateChanged) -> None:
        previous, self.worker_state = self.worker_state, message.state
        if message.state.phase == "failed" and message.state != previous:
            self.notify(message.state.text, severity="error", timeout=10)
        elif message.state.phase == "restarting" and previous.phase != "restarting":
            self.notify(message.state.text, timeout=3)

    def show_progress_warning(self) -> None:
        """Say so once when progress stops being saved (the data folder became unwritable after start-up)."""
        warning = self.services.progress.warning
        if warning and warning != self._progress_warning:
            self.notify(warning, severity="warning", timeout=10)
        self._progress_warning = warning

    def _save_theme(self, theme: Theme) -> None:
        settings = self.services.settings
        name = theme.name
        if settings.theme == name:
            return
        updated = dataclasses.replace(settings, theme=name)
        self.services = dataclasses.replace(self.services, settings=updated)
        try:
            warning = self.services.save_settings(updated)
        except OSError as error:
            warning = f"theme not saved: {error}"
        if warning:  # save_settings returns its problem instead of raising
            self.notify(warning, severity="warning")

    # ---- failures ----------------------------------------------------------------------------

    def recover_from_failure(self, error: Exception, where: str = "") -> bool:
        """Turn `error`, raised by a handler, an action or a render of one widget, into an error notice
        and a log entry, and carry on: True when done so. False leaves it to Textual (exit code 1,
        the traceback printed): before the first paint, once an exit is under way, with
        $TENSOR_TUTOR_UI_STRICT=1, or in a storm of failures (see FAILURE_STORM)."""
        if not (self.recover_failures and self._failures_armed) or self._exit or self._closing or self._closed:
            return False
        from textual.worker import WorkerFailed

        now = time.monotonic()
        limit, window_s = FAILURE_STORM
        self._failure_times = [t for t in self._failure_times if now - t < window_s] + [now]
        if len(self._failure_times) > limit:
            return False
        cause = error.error if isinstance(error, WorkerFailed) and isinstance(error.error, BaseException) else error
        line = guard.failure_line(cause, where)
        self.failures.append(line)
        self.log.error(f"{line} (the app carries on)\n{guard.failure_traceback(cause)}")
        if now - self._failure_noticed.get(line, -FAILURE_NOTICE_REPEAT_S) >= FAILURE_NOTICE_REPEAT_S:
            self._failure_noticed[line] = now
            self.notify(line, title="Something failed; the app carries on", severity="error", timeout=10,
                        markup=False)
        return True

    def _handle_exception(self, error: Exception) -> None:
        """Textual's report of an unhandled exception (a compose, a timer, a worker, a layout): a notice
        where recover_from_failure takes it, else Textual's exit with the traceback."""
        if self.recover_from_failure(error):
            return
        super()._handle_exception(error)

    # ---- navigation -----------------------------------------------------------------------

    def open_lesson(self, lesson_id: str, resume: bool = False) -> None:
        """Show lesson `lesson_id` above the home screen (replacing another lesson or tool screen); `resume`: at
        the place the learner left it."""
        from tutor.ui.screens.lesson import LessonScreen

        try:
            screen = LessonScreen(self.services, lesson_id, resume=resume)
        except ValueError as error:  # UserError: no such lesson (the message suggests close ids)
            self.notify(str(error), severity="error")
            return
        self._show(screen)

    def _show(self, screen: Screen[None]) -> None:
        while isinstance(self.screen, ModalScreen) and len(self.screen_stack) > 1:
            self.pop_screen()  # help open: it explained the screen being left
        if isinstance(self.screen, HomeScreen):
            self.push_screen(screen)
        else:
            self.switch_screen(screen)

    @on(OpenLesson)
    def _open_lesson(self, message: OpenLesson) -> None:
        self.open_lesson(message.lesson_id, message.resume)

    # The state widgets share is the app's: they post these messages, the app writes its attributes.
    def on_probe_runner_claimed(self, message: ProbeRunner.Claimed) -> None:
        self.active_runner = message.runner

    def on_probe_runner_released(self, message: ProbeRunner.Released) -> None:
        if self.active_runner is message.runner:
            self.active_runner = None

    def on_probe_runner_measured(self, message: ProbeRunner.Measured) -> None:
        self.last_result = message.result

    def action_home(self) -> None:
        """Back to the list of lessons (the first screen of the stack)."""
        while len(self.screen_stack) > 1:
            self.pop_screen()

    def action_bench(self, run: bool = False) -> None:
        """Open the Bench screen (and start the suite when `run`)."""
        from tutor.ui.screens.bench import BenchScreen

        screen = self.screen
        if not isinstance(screen, BenchScreen):
            screen = BenchScreen(self.services)
            self._show(screen)
        if run:
            self.call_after_refresh(screen.action_run)

    def action_fit(self) -> None:
        from tutor.ui.screens.fit import FitScreen

        if not isinstance(self.screen, FitScreen):
            self._show(FitScreen(self.services))

    def action_help(self) -> None:
        from tutor.ui.screens.help import HelpScreen, help_for

        if isinstance(self.screen, HelpScreen):
            return
        self.push_screen(HelpScreen(help_for(self.focused, self.screen)))

    # ---- shutdown -------------------------------------------------------------------------

    def cancel_measurements(self) -> None:
        """Ask every running probe or benchmark to stop at its next check."""
        if self.active_runner is not None:
            self.active_runner.cancel()
        for screen in self.screen_stack:
            if isinstance(screen, CancelsMeasurements):
                screen.cancel_measurements()
            elif isinstance(screen, Cancels):
                screen.cancel()

    async def action_quit(self) -> None:
        lessons = sys.modules.get("tutor.ui.screens.lesson")  # never imported just to quit: no lesson was opened
        if lessons is not None and isinstance(self.screen, lessons.LessonScreen):
            self.screen.save_place()  # Continue returns where the learner was
        self.cancel_measurements()
        # The measurement process is killed now, not after the screens close: a matmul it runs would
        # keep both cores from the interface's shutdown (measured: 0.2 s from Ctrl+Q to Textual's
        # shutdown while a lesson measured), and nothing it could still send would be shown.
        self.stop_measurement_process()
        self.exit()

    def stop_measurement_process(self) -> None:
        """Kill the measurement process (and every process it started); idempotent."""
        worker = self.services.worker
        if worker is not None:
            worker.unsubscribe(self._post_worker_state)
            worker.stop()

    def on_unmount(self) -> None:
        if self._gc_thresholds is not None:  # the process's collector as the app found it
            gc.set_threshold(*self._gc_thresholds)
            self._gc_thresholds = None
            gc.unfreeze()
        self.cancel_measurements()
        self.services.sampler.stop()
        self.stop_measurement_process()  # kills its process group: rank processes of a running lab too
        if self._keylog is not None:
            self._keylog.close()
            self._keylog = None
        self.shut_down = True
