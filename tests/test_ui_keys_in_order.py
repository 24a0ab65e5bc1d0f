"""Keys that arrive together are applied in the order they came: a burst of characters
mixed with Backspace, End, Home, Ctrl+U (bindings in Textual) lands exactly in a quiz answer, a
predict guess and the palette while a measurement runs, and Ctrl+Down followed at once by typing
types into the box it moved to. `pilot.press` waits for each key, so these tests hand the whole
burst to the driver at once, as a terminal does when the loop was busy or tmux sends it in one go."""

from __future__ import annotations

import unicodedata
from pathlib import Path


from textual import events
from textual.keys import REPLACED_KEYS, _character_to_key, _get_unicode_name_from_key
from textual.widgets import Input
from tests.ui_fakes import sync

from tests.test_ui_learner import WIDE, services
from tutor.ui.app import TutorApp, handles_keys_itself
from tutor.ui.widgets.measure import MeasureBlock
from tutor.ui.widgets.predict import PredictBlock
from tutor.ui.widgets.quiz import QuizBlock

BURSTS = (
    (("5", "0", "backspace", "backspace", *"0.368"), "0.368"),
    ((*"12345", "ctrl+u", *"0.27", "home", "delete", *"9"), "9.27"),
    ((*"abc", "home", "x", "end", "y", "backspace", "backspace", "z"), "xabz"),
    ((*"901", "home", *"93", "home", "backspace", *"761"), "76193901"),
    ((*"46", "left", *"193", "ctrl+u", "end", *"2140"), "62140"),
)


def key_event(key: str) -> events.Key:
    """The Key event a terminal's driver makes of `key` (as Pilot builds it)."""
    if len(key) == 1 and not key.isalnum():
        key = _character_to_key(key)
    try:
        char: str | None = unicodedata.lookup(_get_unicode_name_from_key(REPLACED_KEYS.get(key, key)))
    except KeyError:
        char = key if len(key) == 1 else None
    return events.Key(key, char)


async def send_at_once(pilot, keys) -> None:
    """Queue every key before the app handles any, then wait until it has handled them all."""
    app = pilot.app
    for key in keys:
        event = key_event(key)
        event.set_sender(app)
        app._driver.send_message(event)
    await pilot.pause()
    await pilot.pause()


def test_only_widgets_with_their_own_key_handlers_keep_textuals_path():
    from textual.containers import VerticalScroll
    from textual.widgets import Button, TextArea

    assert handles_keys_itself(Input()) and handles_keys_itself(TextArea())
    assert not handles_keys_itself(Button("Run")) and not handles_keys_itself(VerticalScroll())


@sync
async def test_a_burst_sent_at_once_lands_exactly_in_quiz_predict_and_palette_while_measuring():
    app = TutorApp(services(), lesson_id="learner/busy")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        measure = app.screen.query_one(MeasureBlock)
        measure.start_probe()
        await pilot.pause()
        assert measure.running
        answer = app.screen.query_one(QuizBlock).query_one("#answer", Input)
        guess = app.screen.query_one(PredictBlock).query_one("#guess", Input)
        for field in (answer, guess):
            for keys, expected in BURSTS:
                field.value = ""
                field.focus()
                await pilot.pause()
                await send_at_once(pilot, keys)
                assert field.value == expected, (field.id, keys, field.value)
        await pilot.press("ctrl+p")
        await pilot.pause()
        from textual.command import CommandInput

        palette = app.screen.query_one(CommandInput)
        for keys, expected in BURSTS:
            palette.value = ""
            await send_at_once(pilot, keys)
            assert palette.value == expected, (keys, palette.value)
        await pilot.press("escape")
        assert measure.running  # every burst was typed during the measurement
        measure.cancel()
        await app.workers.wait_for_complete()


@sync
async def test_typing_right_after_ctrl_down_goes_to_the_box_it_moved_to():
    app = TutorApp(services(), lesson_id="learner/busy")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        answer = app.screen.query_one(QuizBlock).query_one("#answer", Input)
        guess = app.screen.query_one(PredictBlock).query_one("#guess", Input)
        answer.focus()
        await pilot.pause()
        await send_at_once(pilot, ["1", "ctrl+down", *"42", "ctrl+up", "2"])
        assert (answer.value, guess.value) == ("12", "42")


@sync
async def test_enter_grades_the_answer_typed_before_it_not_the_keys_after():
    app = TutorApp(services(), lesson_id="learner/busy")
    async with app.run_test(size=WIDE) as pilot:
        await pilot.pause()
        answer = app.screen.query_one(QuizBlock).query_one("#answer", Input)
        answer.focus()
        await pilot.pause()
        # The pipeline quiz: `50` Enter, Backspace twice, `0.368` Enter, sent together.
        await send_at_once(pilot, ["5", "0", "enter", "backspace", "backspace", *"0.368", "enter"])
        graded = [given for _, quiz_id, given, _ in app.services.progress.answers if quiz_id == "pipeline"]
        assert graded == ["50", "0.368"] and answer.value == "0.368"
