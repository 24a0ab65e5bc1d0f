"""The app's footer: Textual's, in its compact form on a narrow terminal (the app's -narrow class,
below 100 columns), so that at 80 columns the keys a learner needs (Enter, Tab, the next box,
Escape home, F1 help, Ctrl+Q) all fit on the one line beside the palette key."""

from __future__ import annotations

from textual.widgets import Footer


class TutorFooter(Footer):
    """Footer that turns compact on a narrow screen and back on a wide one."""

    def on_mount(self) -> None:
        self.compact = self.screen.has_class("-narrow")

    def on_resize(self) -> None:
        self.compact = self.screen.has_class("-narrow")
