"""Command palette (ctrl+p): go to any lesson, run the benchmark, open the fit check, go home, and
export the current screen's result as JSON, CSV or Markdown (tutor.export).

Textual's own system commands (Theme, Keys, Screenshot, Quit) stay beside these; the chosen
theme is saved by the app.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from textual.app import App
from textual.command import DiscoveryHit, Hit, Hits, Provider

from tutor.ui.host import tutor_app

EXPORT_FORMATS = (("json", "JSON", "the same JSON as the command line's --json"),
                  ("csv", "CSV", "one row per measurement, for a spreadsheet"),
                  ("markdown", "Markdown", "a table for notes or an issue"))


@runtime_checkable
class ShowsResult(Protocol):
    """A screen with a result of its own to export (Bench: the run shown; Fit: the report)."""

    def export_result(self) -> object | None: ...


def current_result(app: App[None]) -> object | None:
    """The result on screen: what the screen says it shows (Bench: the run shown; Fit: the report), else
    the last measure block's result (app.last_result); None when nothing was measured or computed yet."""
    screen = app.screen
    result = screen.export_result() if isinstance(screen, ShowsResult) else None
    tutor = tutor_app(app)
    return result if result is not None or tutor is None else tutor.last_result


def export_current(app: App[Any], fmt: str) -> None:
    """Save the current result under the data dir's exports/ folder and name the file in a toast."""
    from tutor.export import save_export

    result = current_result(app)
    if result is None:
        app.notify("nothing to export yet: run a measurement, open Bench or Fit first", severity="warning")
        return
    try:
        path = save_export(result, fmt)
    except (OSError, ValueError) as error:  # an unwritable data dir, or a fit the form cannot compute
        app.notify(f"export failed: {error}", severity="error")
        return
    app.notify(f"saved {path}", title="Exported", timeout=10, markup=False)


@runtime_checkable
class ShowsPictures(Protocol):
    """A screen with pictures to save (Bench: the run's sweeps; Fit: the memory timeline)."""

    def pictures(self) -> tuple[str, list[Any]]:
        """(a file name stem, the tutor.answers.pictures Charts on screen now; [] when none)."""
        ...


def save_pictures(app: App[Any]) -> Path | None:
    """Save the screen's pictures as one SVG, their data as CSV and JSON beside it, under the data dir's
    exports/ folder (the current folder if that cannot be written), and name the files in a toast."""
    from tutor.errors import UserError
    from tutor.export import EXPORTS_FOLDER, context_of, save_picture_files
    from tutor.files.storage import data_dir

    screen = app.screen
    stem, charts = screen.pictures() if isinstance(screen, ShowsPictures) else ("", [])
    if not charts:
        app.notify("no picture on this screen to save: Bench shows a run's sweeps, Fit a training step's memory",
                   severity="warning")
        return None
    problem = ""
    context = context_of(current_result(app))  # what the pictures are of: the result the screen shows
    for folder in (data_dir() / EXPORTS_FOLDER, Path.cwd()):
        try:
            svg, table, described = save_picture_files(charts, folder, stem, context=context)
        except UserError as error:
            problem = str(error)
            continue
        app.notify(f"saved {svg}\nits data beside it: {table.name}, {described.name}", title="Picture saved",
                   timeout=10, markup=False)
        return svg
    app.notify(f"could not save the picture: {problem}", severity="error", markup=False)
    return None


class TutorCommands(Provider):
    """Lessons by title or id, and the app's screens."""

    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        app = tutor_app(self.app)
        if app is None:  # the palette of another host app: none of the tutor's commands apply
            return []
        services = app.services
        commands: list[tuple[str, str, Callable[[], object]]] = [
            ("Run benchmark", "Measure matmul FLOP/s and memory GB/s on this machine", partial(app.action_bench, True)),
            ("Fit check", "Does a model fit this machine's memory?", app.action_fit),
            ("Home: lessons and progress", "The list of tracks and lessons", app.action_home),
            ("Bench: saved runs", "The results notebook: show a run, compare two", partial(app.action_bench, False)),
        ]
        for fmt, name, what in EXPORT_FORMATS:
            commands.append((f"Export result as {name}", f"The result on this screen: {what}",
                             partial(export_current, self.app, fmt)))
        commands.append(("Save pictures as SVG", "The pictures on this screen (Bench's sweeps, Fit's memory timeline), "
                         "with their data as CSV and JSON", partial(save_pictures, self.app)))
        for info in services.curriculum.lessons:
            commands.append((f"Go to lesson: {info.title}", f"{info.id} · {info.minutes} min · {info.summary}",
                             partial(app.open_lesson, info.id)))
        return commands

    async def discover(self) -> Hits:
        # The first entry is highlighted on open: Enter on an empty palette must not start anything,
        # least of all a benchmark, so it is a hint that only closes the palette.
        yield DiscoveryHit(EMPTY_HINT, lambda: None, help="Enter on an empty search does nothing")
        commands = self._commands()
        for title, help_text, callback in commands[1:4] + commands[:1] + commands[4:7]:
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            # Match the lesson id as well as the title: "precision/bits" finds its lesson.
            score = max(matcher.match(title), matcher.match(help_text.split(" · ")[0]) * 0.9,
                        words_score(query, title, help_text))
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)


EMPTY_HINT = "Type to search: a lesson (\"bits of\"), bench, fit, export"


def searchable_words(*texts: str) -> str:
    """The texts in lower case with ids' separators as spaces: 'precision/bits-of-a-float' reads
    'precision bits of a float'."""
    return " ".join(re.sub(r"[/_\-·:,()]+", " ", text.lower()) for text in texts)


def words_score(query: str, title: str, help_text: str) -> float:
    """A multi-word query ("bits of", "float bits") matches when every word starts a word of the
    title, id or summary, in any order; the score stays below a close fuzzy match of the title."""
    words = searchable_words(query).split()
    if not words:
        return 0.0
    haystack = " " + searchable_words(title, help_text)
    if all(f" {word}" in haystack for word in words):
        return 1.0 + len(words) * 0.1
    return 0.0
