"""Command palette (ctrl+p): go to any lesson, run the benchmark, open the fit check, go home.

Textual's own system commands (Theme, Keys, Screenshot, Quit) stay beside these; the chosen
theme is saved by the app.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from textual.command import DiscoveryHit, Hit, Hits, Provider


class TutorCommands(Provider):
    """Lessons by title or id, and the app's screens."""

    def _commands(self) -> list[tuple[str, str, Callable[[], object]]]:
        app = self.app
        services = app.services  # type: ignore[attr-defined]
        commands: list[tuple[str, str, Callable[[], object]]] = [
            ("Run benchmark", "Measure matmul TFLOP/s and memory GB/s on this machine", partial(app.action_bench, True)),
            ("Fit check", "Does a model fit this machine's memory?", app.action_fit),
            ("Home: lessons and progress", "The list of tracks and lessons", app.action_home),
        ]
        for info in services.curriculum.lessons:
            commands.append((f"Go to lesson: {info.title}", f"{info.id} · {info.minutes} min · {info.summary}",
                             partial(app.open_lesson, info.id)))
        return commands

    async def discover(self) -> Hits:
        for title, help_text, callback in self._commands()[:3]:
            yield DiscoveryHit(title, callback, help=help_text)

    async def search(self, query: str) -> Hits:
        matcher = self.matcher(query)
        for title, help_text, callback in self._commands():
            # Match the lesson id as well as the title: "precision/bits" finds its lesson.
            score = max(matcher.match(title), matcher.match(help_text.split(" · ")[0]) * 0.9)
            if score > 0:
                yield Hit(score, matcher.highlight(title), callback, help=help_text)
