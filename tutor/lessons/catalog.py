"""The curriculum's index: its tracks and each lesson's metadata, what the home screen lists.

Kept apart from the blocks of a lesson's page (tutor.lessons.model), which only an opened lesson
needs: the app's launch defines these two classes, not the page's nine.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LessonInfo:
    """One lesson's lesson.toml."""

    id: str
    """"<track>/<lesson>", equal to the lesson's folder under lessons/."""
    title: str
    track: str
    minutes: int
    prerequisites: tuple[str, ...]
    summary: str
    blocks: tuple[str, ...] = ()
    """The ids of the blocks that complete the lesson (tutor.lessons.progress.REQUIRED_TO_COMPLETE), in
    page order, read from its lesson.md with the index: what Home counts the learner's blocks done against."""


@dataclass(frozen=True)
class Track:
    """One [[tracks]] entry of curriculum.toml: its lessons, in order."""

    id: str
    title: str
    summary: str
    lesson_ids: tuple[str, ...]
