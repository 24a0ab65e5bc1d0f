"""Every key of every screen, on every focus stop, keeps the app running: Home, a lesson, Fit and Bench
(with two saved runs, so that their charts are drawn), in the picture and the table view, at 120x40
and 80x24, sent one at a time and all together before the screen's first paint (as a fast typist or
tmux sends them). Then the failure guard (tutor.ui.guard): an exception in one widget's handler,
action or render is a notice and the app carries on; start-up failures, Ctrl+Q and a cancelled
worker behave as Textual has them.

The keys of one stop go in one batch (send_together) and the test waits for the app to be idle, never
for a time. The suite runs with TENSOR_TUTOR_UI_STRICT=1 (tests/conftest.py): any exception a key
raises ends the app and run_test raises it, so "still running" here means no handler failed at all."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest


from tests.plot_data import HEADER, RESULTS
from tests.ui_fakes import fake_services, sync

from textual import events
from textual.message import Message
from textual.screen import ModalScreen
from textual.widget import Widget
from textual.widgets import Input, Select, Static

from tutor.bench.notebook import append_run
from tutor.ui.app import TutorApp
from tutor.ui.screens.bench import BenchScreen
from tutor.ui.screens.fit import FitScreen
from tutor.ui.widgets.plot import ChartPlot, ChartView

WIDE, SMALL = (120, 40), (80, 24)
LEAVING = {"escape", "h", "f1", "ctrl+p", "ctrl+q", "ctrl+c", "super+c", "tab", "shift+tab", "n", "p",
           "b", "c", "f", "q"}
"""Keys that leave the screen (home, help, palette, another lesson, quit) or move the focus: pressed once
each from a fresh screen (test_the_keys_that_leave_a_screen_come_back_to_a_running_app), not at each stop."""
TEXT_EDITING = {"backspace", "delete", "alt+backspace", "ctrl+backspace", "ctrl+d", "ctrl+k", "ctrl+u", "ctrl+w",
                "ctrl+x", "ctrl+v"}
CHART_KEYS = ["up", "down", "left", "right", "plus", "minus", "0", "r", "z", "up", "down", "plus", "z"]
"""textual-plot's own keys (pan, zoom, reset) and the zoom-keys switch, on and off again."""


def send_together(pilot, *keys: str) -> None:
    """Queue `keys` at once, as a terminal delivers keys typed faster than the app draws (tmux send-keys):
    none is handled before the next is queued, so the screen has not been repainted in between."""
    app = pilot.app
    for key in keys:
        event = events.Key(key, key if len(key) == 1 else None)
        event.set_sender(app)
        app._driver.send_message(event)


async def settle(pilot) -> None:
    await pilot.pause()
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()


def assert_running(app: TutorApp, what: str) -> None:
    assert app.is_running and app.return_code is None, what
    assert not app._exit_renderables, what  # no traceback waiting to be printed
    assert app.failures == [], what


@pytest.fixture
def two_runs(tmp_path, monkeypatch) -> Path:
    """A results notebook with two saved runs whose sweeps draw the matmul and bandwidth charts."""
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    for day in (10, 11):
        append_run({"command": "tensor-tutor bench --quick", "cancelled": False,
                    "date": f"2025-01-{day}T10:00:00+00:00", **HEADER}, RESULTS, tmp_path / "results.jsonl")
    return tmp_path


def open_screen(app: TutorApp, name: str) -> None:
    if name == "home":
        app.action_home()
    elif name == "lesson":
        app.open_lesson(app.services.curriculum.lessons[0].id)
    elif name == "fit":
        app.action_fit()
    else:
        app.action_bench()


def close_overlays(app: TutorApp, screen) -> None:
    while isinstance(app.screen, ModalScreen) and app.screen is not screen:
        app.pop_screen()


def back_to(app: TutorApp, screen) -> None:
    """Pop what the keys opened above `screen`."""
    while app.screen is not screen and screen in app.screen_stack and len(app.screen_stack) > 1:
        app.pop_screen()


async def every_key_on_every_stop(pilot, screen) -> list[Widget]:
    """Tab through the screen; at each stop send every key bound there (and the chart keys) together.
    Returns the stops visited."""
    app = pilot.app
    stops: list[Widget] = []
    for _ in range(len(screen.focus_chain)):
        await pilot.press("tab")
        focused = app.focused
        if focused is None or focused in stops:
            continue
        stops.append(focused)
        keys = sorted(key for key in app.active_bindings if key not in LEAVING)
        typed = getattr(focused, "value", None) if isinstance(focused, (Input, Select)) else None
        if isinstance(focused, Input):  # Textual's own editing keys: the field's text is Input's business
            keys = [key for key in keys if key not in TEXT_EDITING]
        send_together(pilot, *keys, *(key for key in CHART_KEYS if not isinstance(focused, Input) or len(key) > 1))
        await pilot.pause()
        assert_running(app, f"keys on {focused!r}")
        if typed is not None and focused.value != typed:  # the field as it was: the chart stays drawn
            focused.value = typed
        back_to(app, screen)  # Enter on Home's list opened a lesson, on a Select its list
        await pilot.pause()
        assert app.screen is screen, f"left the screen for good from {focused!r}"
        if focused.is_attached and focused.focusable:
            focused.focus()
    return stops


async def both_views(pilot, name: str) -> None:
    """The screen's stops in the picture view, then `t` on each chart and the stops again (table view)."""
    app = pilot.app
    open_screen(app, name)
    await settle(pilot)
    screen = app.screen
    charts = [plot for plot in screen.query(ChartPlot) if plot.parent.display]
    stops = await every_key_on_every_stop(pilot, screen)
    if name in ("fit", "bench"):
        assert charts and all(plot in stops for plot in charts), "every chart is a focus stop"
    for plot in charts:
        plot.parent.action_toggle_picture()  # `t` on each chart (the Shift+Tab pass below presses it too)
    # The table view: Shift+Tab back over the last stops (the charts are last in the focus chain).
    for _ in range(min(len(stops), 5)):
        await pilot.press("shift+tab")
        send_together(pilot, *CHART_KEYS, "t", "t")
        await pilot.pause()
        assert_running(app, f"table view, {app.focused!r}")
        back_to(app, screen)
    await settle(pilot)
    assert_running(app, f"shift+tab on {name}")


@pytest.mark.parametrize("name", ["home", "lesson", "fit", "bench"])
@pytest.mark.parametrize("size", [WIDE, SMALL], ids=["120x40", "80x24"])
@sync
async def test_every_key_on_every_stop_of_every_screen(two_runs, size, name):
    app = TutorApp(fake_services())
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await both_views(pilot, name)
        app.action_home()
        await settle(pilot)
        assert_running(app, "after the screen")


@pytest.mark.parametrize("size", [WIDE, SMALL], ids=["120x40", "80x24"])
@sync
async def test_keys_sent_before_a_screens_first_paint(two_runs, size):
    app = TutorApp(fake_services())
    async with app.run_test(size=size) as pilot:
        send_together(pilot, "down", "up", "tab", "shift+tab", "down")  # before the home screen is painted
        await settle(pilot)
        for name in ("lesson", "fit", "bench"):
            open_screen(app, name)
            send_together(pilot, *["tab", *CHART_KEYS, "shift+tab", *CHART_KEYS, "t", "shift+tab", "down"] * 2)
            await settle(pilot)
            assert_running(app, f"keys before {name}'s first paint")
            close_overlays(app, None)
            app.action_home()
            await settle(pilot)


@pytest.mark.parametrize("size", [WIDE, SMALL], ids=["120x40", "80x24"])
@sync
async def test_the_fit_screens_t_shift_tab_down(size):
    """The learner's sequence: `t`, Shift+Tab (onto the chart, not drawn yet), Down: ZeroDivisionError
    in textual-plot's mapping, and the app ended."""
    app = TutorApp(fake_services())
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await pilot.press("f")
        await settle(pilot)
        assert isinstance(app.screen, FitScreen)
        send_together(pilot, "t", "shift+tab", "down")
        await settle(pilot)
        assert_running(app, "t, shift+tab, down on Fit")
        await pilot.press("t", "shift+tab", "down")  # and one at a time, the chart drawn
        await settle(pilot)
        assert_running(app, "again, one key at a time")


@pytest.mark.parametrize("size", [WIDE, SMALL], ids=["120x40", "80x24"])
@sync
async def test_the_bench_screens_tab_tab_down_with_two_saved_runs(two_runs, size):
    app = TutorApp(fake_services())
    async with app.run_test(size=size) as pilot:
        await settle(pilot)
        await pilot.press("b")
        await settle(pilot)
        assert isinstance(app.screen, BenchScreen) and len(app.screen.notebook.runs) == 2
        send_together(pilot, "tab", "tab", "down")
        await settle(pilot)
        assert_running(app, "tab, tab, down on Bench")
        await pilot.press("tab", "tab", "down")
        await settle(pilot)
        assert_running(app, "again, one key at a time")


@sync
async def test_the_keys_that_leave_a_screen_come_back_to_a_running_app(two_runs):
    app = TutorApp(fake_services())
    async with app.run_test(size=WIDE) as pilot:
        await settle(pilot)
        for name in ("lesson", "fit", "bench"):
            for key in ("escape", "f1", "ctrl+p", "h", "n"):
                open_screen(app, name)
                await settle(pilot)
                await pilot.press(key)
                await settle(pilot)
                assert_running(app, f"{key} on {name}")
                close_overlays(app, None)
                app.action_home()
                await settle(pilot)


# ---- the charts' keys ------------------------------------------------------------------------------

@sync
async def test_a_chart_takes_no_pan_or_zoom_keys_until_z_and_r_still_runs_the_bench(two_runs):
    app = TutorApp(fake_services())
    async with app.run_test(size=WIDE) as pilot:
        await settle(pilot)
        app.action_bench()
        await settle(pilot)
        screen = app.screen
        plot = screen.query_one("#matmul-chart", ChartView).query_one(ChartPlot)
        plot.focus()
        await settle(pilot)
        limits = plot._x_min, plot._x_max, plot._y_min, plot._y_max
        await pilot.press("up", "left", "plus", "minus")
        assert (plot._x_min, plot._x_max, plot._y_min, plot._y_max) == limits
        await pilot.press("z", "up", "left", "plus")
        assert (plot._x_min, plot._x_max, plot._y_min, plot._y_max) != limits
        await pilot.press("0")
        assert (plot._x_min, plot._x_max, plot._y_min, plot._y_max) == limits
        await pilot.press("z")
        assert not plot.zoom_keys
        runs: list[bool] = []
        screen.action_run = lambda: runs.append(True)  # type: ignore[method-assign]
        await pilot.press("r")  # the screen's Run, not textual-plot's "reset scales"
        assert runs == [True] and app.focused is plot
        assert_running(app, "chart keys")


@sync
async def test_a_zoom_to_a_point_or_a_pan_before_drawing_changes_nothing():
    """Programmatic zooms and pans: refused where an axis would collapse, and no division by zero."""
    from tutor.answers.pictures import Chart, Point, Series

    chart = Chart(title="one point", x_label="x", x_unit="", y_label="y", y_unit="B",
                  series=(Series("s", (Point(3.0, 2.0),)),))

    app = TutorApp(fake_services())
    async with app.run_test(size=WIDE) as pilot:
        await settle(pilot)
        view = ChartView(chart)
        plot_before = ChartPlot()
        await app.screen.mount(view)
        await settle(pilot)
        plot = view.query_one(ChartPlot)
        assert plot._x_min < plot._x_max  # one point: the axis is widened around it
        plot.focus()
        plot.zoom_keys = True
        for _ in range(400):
            plot.action_zoom_in()
        assert plot._x_min < plot._x_max and plot._y_min < plot._y_max
        plot._zoom(0.0, 0.0, -1.0, True, True)  # 1 + factor = 0
        await settle(pilot)
        # Never drawn: no area to pan by, and nothing to map.
        plot_before._pan(2.0, 2.0)
        assert plot_before.get_coordinate_from_pixel(1, 1)
        assert_running(app, "zoom to a point")


# ---- the failure guard --------------------------------------------------------------------------------

class Fragile(Static, can_focus=True):
    """A widget that fails on request: in its message handler, its action and its render."""

    BINDINGS = [("x", "explode", "Explode")]

    class Go(Message):
        def __init__(self, fail: bool) -> None:
            super().__init__()
            self.fail = fail

    def __init__(self) -> None:
        super().__init__("fragile")
        self.handled = 0
        self.broken_render = False

    def on_fragile_go(self, message: Go) -> None:
        if message.fail:
            raise RuntimeError("handler broke")
        self.handled += 1

    def action_explode(self) -> None:
        raise ValueError("action broke")

    def render(self):
        if self.broken_render:
            raise ZeroDivisionError("render broke")
        return super().render()


async def guarded_app(pilot) -> Fragile:
    app = pilot.app
    app.recover_failures = True  # as the app runs outside the tests
    await settle(pilot)
    fragile = Fragile()
    await app.screen.mount(fragile)
    await settle(pilot)
    return fragile


def notices(app: TutorApp) -> list[str]:
    return [notification.message for notification in app._notifications if notification.severity == "error"]


@sync
async def test_a_failing_handler_action_or_render_is_a_notice_and_the_app_carries_on():
    app = TutorApp(fake_services())
    async with app.run_test(size=WIDE) as pilot:
        fragile = await guarded_app(pilot)
        fragile.post_message(Fragile.Go(fail=True))
        fragile.post_message(Fragile.Go(fail=False))  # the widget's loop goes on after its failure
        await settle(pilot)
        assert fragile.handled == 1
        assert app.failures == ["Fragile.on_fragile_go failed: RuntimeError: handler broke"]
        assert notices(app) == app.failures
        fragile.focus()
        await pilot.press("x")  # an action, run by the app's own loop
        await pilot.press("x")
        await settle(pilot)
        assert app.failures[1:] == ["Fragile.action_explode failed: ValueError: action broke"] * 2
        assert len(notices(app)) == 2  # the same failure again is logged, not noticed again
        fragile.broken_render = True
        fragile.refresh(layout=True)
        await settle(pilot)
        assert "Fragile.render failed: ZeroDivisionError: render broke" in app.failures
        assert app.is_running and app.return_code is None
        await pilot.press("f")  # the rest of the app works
        await settle(pilot)
        assert isinstance(app.screen, FitScreen)


@sync
async def test_a_failing_widget_is_drawn_as_one_line_saying_so():
    app = TutorApp(fake_services())
    async with app.run_test(size=WIDE) as pilot:
        fragile = await guarded_app(pilot)
        fragile.broken_render = True
        fragile.refresh(layout=True)
        await settle(pilot)
        assert "could not be drawn" in "".join(str(line.text) for line in fragile.render_lines(fragile.region.reset_offset))
        assert app.is_running


@sync
async def test_a_failure_before_the_first_paint_ends_the_app_as_textual_does():
    class BrokenAtStart(TutorApp):
        CSS_PATH = str(Path(sys.modules[TutorApp.__module__].__file__).parent / "app.tcss")

        def on_mount(self) -> None:
            super().on_mount()
            raise RuntimeError("start-up broke")

    app = BrokenAtStart(fake_services())
    app.recover_failures = True
    with pytest.raises(RuntimeError, match="start-up broke"):
        async with app.run_test(size=WIDE) as pilot:
            await pilot.pause()
    assert app.return_code == 1 and app.failures == []


@sync
async def test_ctrl_q_and_a_cancelled_worker_are_not_failures():
    app = TutorApp(fake_services())
    async with app.run_test(size=WIDE) as pilot:
        app.recover_failures = True
        await settle(pilot)

        async def forever() -> None:
            await asyncio.Event().wait()

        worker = app.run_worker(forever(), exit_on_error=True)
        await pilot.pause()
        worker.cancel()
        await settle(pilot)
        assert worker.is_cancelled and app.is_running and app.failures == []
        await pilot.press("ctrl+q")
        await pilot.pause()
    assert app.return_code == 0 and app.failures == []
