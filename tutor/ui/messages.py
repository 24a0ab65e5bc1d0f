"""Messages that cross screens: what the learner asked to open, and what they finished."""

from __future__ import annotations

from textual.message import Message


class OpenLesson(Message):
    """Open lesson `lesson_id` (from the home list, the palette or n/p); `resume`: where the learner left it."""

    def __init__(self, lesson_id: str, resume: bool = False) -> None:
        super().__init__()
        self.lesson_id = lesson_id
        self.resume = resume


class LessonCompleted(Message):
    """Every graded block of `lesson_id` is done; the progress file already says so."""

    def __init__(self, lesson_id: str) -> None:
        super().__init__()
        self.lesson_id = lesson_id
