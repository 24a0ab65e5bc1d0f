"""F1: help for the focused pane, then for the screen, then the keys that work everywhere."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.dom import DOMNode
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

GLOBAL_HELP = """\
## Everywhere

| key | does |
|---|---|
| F1 | this help, for the box you are in |
| Enter | run, check or commit the box you are in (on a lesson's text: go to the next box) |
| Tab / shift+Tab | the next / previous field or box |
| ctrl+↓ / ctrl+↑ (] / [) | lesson: the next / previous box |
| ctrl+p | command palette: go to a lesson, run the benchmark, fit check, theme |
| h | home (the list of lessons) |
| c | home: continue where you left off |
| b | home: the Bench screen (measure this machine, saved runs) |
| f | home: the Fit check (does a model fit this machine?) |
| n / p | lesson: the next / previous lesson |
| l | lesson: hide or show the live pane |
| Escape | cancel a running measurement; out of a text field (its text kept); else back home |
| q | home: quit |
| ctrl+q | quit from anywhere (a running measurement is cancelled first) |

Your progress and the theme are saved as you go.
"""


def help_for(widget: DOMNode | None, screen: DOMNode) -> str:
    """The HELP of the focused widget or its nearest ancestor that has one, then the screen's."""
    parts: list[str] = []
    node = widget
    while node is not None and node is not screen:
        text = getattr(type(node), "HELP", "")
        if text:
            parts.append(text)
            break
        node = node.parent
    screen_help = getattr(type(screen), "HELP", "")
    if screen_help and screen_help not in parts:
        parts.append(screen_help)
    parts.append(GLOBAL_HELP)
    return "\n\n".join(parts)


class HelpScreen(ModalScreen[None]):
    """A modal of Markdown help; Escape, F1 or q closes it."""

    BINDINGS = [Binding("escape,f1,q", "close", "Close")]

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        from rich.markdown import Markdown

        # One Static rendering Rich's Markdown, not Textual's Markdown widget (a widget per
        # paragraph): opening help must stay instant while a benchmark loads the CPU.
        with VerticalScroll(id="help"):
            yield Static(Markdown(self.text))

    def on_mount(self) -> None:
        self.query_one("#help").border_title = "Help (Escape closes)"
        self.query_one("#help").focus()

    def action_close(self) -> None:
        self.dismiss(None)
