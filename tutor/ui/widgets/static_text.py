"""Text in a Static that changes often (a probe's progress line) without re-laying-out the screen.

`Static.update` asks for a layout on every call, and in Textual a layout request from any widget
reflows the whole screen and repaints every widget on it: on a lesson (one long scroll of Markdown
blocks beside the live pane) that cost 20 ms a time on an idle 2-core machine and 50-150 ms at
load 6-7, once per progress message. A status line whose height stays the same needs
only a repaint of itself (Textual's `Widget.refresh(layout=False)`: "set `layout=False` if you are
certain the size won't change", textual.widgets.Static.update).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual.widgets import Static

if TYPE_CHECKING:
    from textual.visual import VisualType


def same_height_after(static: Static) -> bool:
    """Whether `static`, its content just replaced (not yet laid out), still fills the height it was
    laid out at: a fixed height, or an auto height whose wrapped content has as many lines as before."""
    if not static.display or not static.is_mounted or static.parent is None:
        return False
    width = static.content_size.width
    if width <= 0 or (static.styles.width is not None and static.styles.width.is_auto):
        return False  # never laid out, or its width follows its text: only a layout can tell
    height = static.styles.height
    if height is not None and not height.is_auto and height.is_cells:
        return True
    parent = static.parent
    container = parent.content_size if hasattr(parent, "content_size") else static.app.size
    return static.get_content_height(container, static.app.size, width) == static.content_size.height


def show_text(static: Static, content: VisualType, style_class: str | None = None) -> bool:
    """Put `content` in `static` (and its one class, if given), doing nothing when both are as they
    were and asking Textual for a layout only when the height changes. True when anything changed."""
    changed = False
    if style_class is not None and set(static.classes) != {style_class}:
        static.set_classes(style_class)
        changed = True
    if content != static.content:
        static.update(content, layout=False)
        if not same_height_after(static):
            static.refresh(layout=True)
        changed = True
    return changed
