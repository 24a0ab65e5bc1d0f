"""One widget's failure is a notice, not the end of the app.

Textual ends the whole app on any exception a handler raises (App._handle_exception: the terminal
gets a traceback and exit code 1; `tensor-tutor serve`'s browser says "Session ended"), and the
message loop that raised is left for good either way (MessagePump._process_messages_loop breaks out
of it after reporting). A key in one chart ended a learner's session that way. Once the app runs,
TutorApp.recover_from_failure turns such an exception into an error notice naming what failed and
the traceback into Textual's log, and everything carries on. The places it is asked:

- every message and event of every widget, screen and the app itself, at MessagePump._dispatch_message
  (a key binding's action runs inside the app's Key event, so actions are covered too);
- a widget's render (Widget._render, Widget._render_content): that widget shows one line saying it
  could not be drawn; the rest of the screen is drawn as usual;
- what Textual reports to App._handle_exception itself (a compose, a timer's callback, a worker
  started with exit_on_error, a layout): TutorApp._handle_exception asks the same question.

Only `Exception`s are caught: task cancellation (a cancelled worker, a closing widget), SystemExit
and KeyboardInterrupt are BaseExceptions and go on as Textual expects, and App.exit() raises nothing.
The patches act for a TutorApp only; any other Textual app in the process sees Textual unchanged.
"""

from __future__ import annotations

import traceback
from types import TracebackType
from typing import Any, Protocol

from rich.text import Text
from textual._context import active_app
from textual.message import Message
from textual.message_pump import MessagePump
from textual.widget import Widget

_PATCHED = "_tutor_failure_guard"


class Recovers(Protocol):
    def recover_from_failure(self, error: Exception, where: str = "") -> bool: ...


def _recovering_app() -> Recovers | None:
    app = active_app.get(None)
    return app if callable(getattr(app, "recover_from_failure", None)) else None  # type: ignore[return-value]


def failure_site(error: BaseException, where: str = "") -> str:
    """'ChartPlot._pan': the innermost method of a widget, screen or app the error came through
    (the code that failed, in the app's own terms), else `where`, else the function it was raised in."""
    from textual.dom import DOMNode

    site = ""
    last = ""
    tb: TracebackType | None = error.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        owner = frame.f_locals.get("self")
        if isinstance(owner, DOMNode):
            site = f"{type(owner).__name__}.{frame.f_code.co_name}"
        last = frame.f_code.co_name
        tb = tb.tb_next
    return site or where or last or "the app"


def failure_line(error: BaseException, where: str = "") -> str:
    """One line: what failed and with what ('ChartPlot._pan failed: ZeroDivisionError: float division by zero')."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else ""
    if len(text) > 160:
        text = text[:159] + "…"
    return f"{failure_site(error, where)} failed: {type(error).__name__}" + (f": {text}" if text else "")


def failure_traceback(error: BaseException) -> str:
    return "".join(traceback.format_exception(type(error), error, error.__traceback__))


def _message_name(pump: MessagePump, message: Message) -> str:
    return f"{type(pump).__name__} handling {type(message).__name__}"


def install() -> None:
    """Wrap Textual's dispatch and render methods (once per process) so that a TutorApp is asked
    before an exception from them ends the app."""
    if getattr(MessagePump._dispatch_message, _PATCHED, False):
        return
    dispatch_message = MessagePump._dispatch_message
    render = Widget._render
    render_content = Widget._render_content

    async def guarded_dispatch_message(self: MessagePump, message: Message) -> None:
        try:
            await dispatch_message(self, message)
        except Exception as error:
            app = _recovering_app()
            if app is None or not app.recover_from_failure(error, _message_name(self, message)):
                raise

    def guarded_render(self: Widget) -> Any:
        try:
            return render(self)
        except Exception as error:
            app = _recovering_app()
            if app is None or not app.recover_from_failure(error, f"{type(self).__name__}.render"):
                raise
            from textual.visual import visualize

            return visualize(self, _could_not_draw(self, error))

    def guarded_render_content(self: Widget) -> None:
        try:
            render_content(self)
        except Exception as error:
            app = _recovering_app()
            if app is None or not app.recover_from_failure(error, f"{type(self).__name__}.render"):
                raise
            _draw_failure(self, error)

    for function in (guarded_dispatch_message, guarded_render, guarded_render_content):
        setattr(function, _PATCHED, True)
    MessagePump._dispatch_message = guarded_dispatch_message  # type: ignore[method-assign]
    Widget._render = guarded_render  # type: ignore[method-assign]
    Widget._render_content = guarded_render_content  # type: ignore[method-assign]


def _could_not_draw(widget: Widget, error: Exception) -> Text:
    return Text(f"{type(widget).__name__} could not be drawn ({type(error).__name__})", style="bold red")


def _draw_failure(widget: Widget, error: Exception) -> None:
    """Fill the widget's render cache with one line saying it could not be drawn (blank lines under it),
    until its next refresh tries again."""
    from textual.strip import Strip
    from textual.widget import _RenderCache

    width, height = widget.size
    line = _could_not_draw(widget, error)
    line.truncate(max(width, 0), pad=True)
    strips = [Strip(list(line.render(widget.app.console)), max(width, 0))]
    strips += [Strip.blank(max(width, 0))] * max(height - 1, 0)
    widget._render_cache = _RenderCache(widget.size, strips[:max(height, 0)])
    widget._dirty_regions.clear()
