"""An Enter pressed as soon as lesson 1 is painted: the block says "press Run (Enter)",
but the Run is focused only once the layout has settled, seconds later on a loaded machine. That
early Enter must press Run, not only move the focus to it."""

from __future__ import annotations

from pathlib import Path


from tests.ui_fakes import fake_services, sync, until

from tutor.ui.app import TutorApp
from tutor.ui.widgets.measure import MeasureBlock


@sync
async def test_an_enter_before_the_opening_focus_settles_presses_run():
    services = fake_services()
    app = TutorApp(services, lesson_id="precision/speed")
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        screen = app.screen
        # The moment between the first paint and focus_first_block: focus on the lesson text.
        screen.query_one("#lesson").focus(scroll_visible=False)
        screen._opening = True
        await pilot.press("enter")
        block = screen.query_one(MeasureBlock)
        await until(pilot, lambda: block.result is not None, "the measurement the early Enter started")
        assert services.probes["matmul"].calls, "Enter moved the focus but ran nothing"
        assert app.focused is block.query_one("#run")


@sync
async def test_once_the_focus_has_settled_enter_on_the_lesson_text_only_goes_to_the_next_box():
    services = fake_services()
    app = TutorApp(services, lesson_id="precision/speed")
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: not app.screen._opening, "the opening focus")
        screen = app.screen
        run = screen.query_one(MeasureBlock).query_one("#run")
        assert app.focused is run
        screen.query_one("#lesson").focus(scroll_visible=False)  # the learner went back to reading
        await pilot.press("enter")
        await pilot.pause()
        assert app.focused is run and services.probes["matmul"].calls == []
