"""The learner's progress: blocks done, lessons completed, quiz answers and predictions.

`done_blocks` are the blocks *solved*: a quiz answered right, a predict measured, a measure run.
A quiz whose answer the learner had shown is only *seen* (`seen_blocks`, with how many times it was
shown: the round a quiz is drawn and shuffled for); it does not count toward completing a lesson
(lesson_complete). `learner_id` is a random id created with the file: the seed of each learner's
draws and choice order (tutor.lessons.learner), so they stay the same across runs.

Stored as data_dir()/progress.json; every change is written at once, atomically. Before each write
the file is read again and merged (done blocks and completions are unions), so two app instances
(the terminal and `tensor-tutor serve`) do not erase each other's progress. When the folder cannot
be written the store keeps working in memory and says so in `warning`.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from collections.abc import Callable, Mapping, Set
from typing import TYPE_CHECKING, Any

from tutor.files.lock import locked
from tutor.lessons.catalog import LessonInfo, Track
from tutor.files.storage import data_dir, read_json, write_json_atomic

if TYPE_CHECKING:
    from tutor.lessons.model import Lesson

PROGRESS_FILE = "progress.json"
FORMAT_VERSION = 1
LEARNER_ID_NOT_SAVED = ("your learner id could not be saved: quiz values and choice order are drawn "
                        "afresh each time until progress can be written")


@dataclass(frozen=True)
class LessonProgress:
    """What is done in one lesson."""

    done_blocks: frozenset[str]
    completed: bool
    seen_blocks: frozenset[str] = frozenset()
    """Quizzes whose answer was shown (and not solved since)."""


@dataclass(frozen=True)
class AnswerRecord:
    """The latest answer to one quiz, and how many were given."""

    answer: str
    """As the grader took it: the text typed, or a choice's index in the learner's order."""
    correct: bool
    attempts: int
    at: str
    round: int = 0
    """The round it answered (ProgressStore.round_of then): a later round draws the quiz afresh, and
    this answer no longer belongs to the numbers shown."""


@dataclass(frozen=True)
class PredictionRecord:
    """A learner's guess and what this machine then measured."""

    predicted: float
    measured: float | None
    at: str
    typed: str = ""
    """The guess as the learner typed it ("800 MB/s"); `predicted` is what it was read as, in the block's unit."""

    @property
    def ratio(self) -> float | None:
        """predicted / measured (1.0 is a perfect guess); None when nothing was measured."""
        if self.measured is None or self.measured == 0:
            return None
        return self.predicted / self.measured


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _empty() -> dict[str, Any]:
    return {"version": FORMAT_VERSION, "last_lesson": None, "learner_id": None, "lessons": {}}


REQUIRED_TO_COMPLETE = ("quiz", "predict", "measure", "exercise")
_LESSON_KEYS = ("done_blocks", "completed", "seen_blocks", "answers", "predictions")


def required_blocks(lesson: Lesson) -> set[str]:
    """The blocks a lesson is completed by: every quiz and exercise (solved), predict and measure."""
    return {block.id for block in lesson.blocks if block.directive in REQUIRED_TO_COMPLETE}


def lesson_complete(lesson: Lesson, state: LessonProgress) -> bool:
    """Whether every required block is solved (a quiz only seen does not count)."""
    return required_blocks(lesson) <= set(state.done_blocks)


def blocks_done(info: LessonInfo, done_blocks: Set[str]) -> tuple[int, int]:
    """(blocks solved, blocks to solve) of one lesson: its completing blocks (LessonInfo.blocks, read
    from its page with the curriculum's index) against the blocks the learner solved. A block done
    under an id the page no longer has does not count."""
    return sum(block in done_blocks for block in info.blocks), len(info.blocks)


def track_blocks_done(track: Track, infos: Mapping[str, LessonInfo],
                      done_blocks_of: Callable[[str], Set[str]]) -> tuple[int, int]:
    """(blocks solved, blocks to solve) over a track's lessons; `done_blocks_of(lesson_id)` is the
    learner's solved blocks in that lesson (ProgressStore.lesson_state(...).done_blocks)."""
    counts = [blocks_done(infos[lesson_id], done_blocks_of(lesson_id)) for lesson_id in track.lesson_ids
              if lesson_id in infos]
    return sum(done for done, _ in counts), sum(total for _, total in counts)


_MAX_COUNT = 10**9
"""More attempts or reveals than this is a damaged (or hand-made) file, not a learner."""


def _count(value: Any) -> int | None:
    """A count of attempts or reveals as stored: a whole number from 1 to _MAX_COUNT, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= _MAX_COUNT:
        return value
    return None


def _finite(value: Any) -> float | None:
    """A stored number (a guess, a measurement) as a finite float; None for text, NaN, infinity or
    an integer too large for a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _clean_answer(value: Any) -> dict[str, Any] | None:
    """A quiz answer record with a str answer, a bool verdict and whole attempts (a bad count becomes 1:
    the answer was given at least once); None when the answer itself is unusable."""
    if not (isinstance(value, dict) and isinstance(value.get("answer"), str) and isinstance(value.get("correct"), bool)):
        return None
    clean = dict(value)
    clean["attempts"] = _count(value.get("attempts")) or 1
    if not isinstance(value.get("at"), str):
        clean["at"] = ""
    round_ = value.get("round", 0)
    clean["round"] = round_ if round_ == 0 or _count(round_) else 0
    return clean


def _clean_prediction(value: Any) -> dict[str, Any] | None:
    """A prediction record with a finite guess; a measurement that is not a finite number is dropped."""
    if not isinstance(value, dict) or _finite(value.get("predicted")) is None:
        return None
    clean = dict(value)
    clean["measured"] = _finite(value.get("measured"))
    if not isinstance(value.get("at"), str):
        clean["at"] = ""
    if not isinstance(value.get("typed"), str):
        clean["typed"] = ""
    return clean


def _clean_lesson(entry: object) -> dict[str, Any] | None:
    """A lesson's record with only well-formed parts, None when nothing in it is usable."""
    return _clean_record(entry) if isinstance(entry, dict) else None


def _clean_record(entry: dict[str, Any]) -> dict[str, Any]:
    """A lesson's record (an object) with only its well-formed parts; {} gives an empty record."""
    unknown = {key: value for key, value in entry.items() if key not in _LESSON_KEYS}  # a newer version's
    done = entry.get("done_blocks", [])
    seen = entry.get("seen_blocks", {})
    answers = entry.get("answers", {})
    predictions = entry.get("predictions", {})
    return {
        **unknown,
        "done_blocks": sorted({item for item in done if isinstance(item, str)}) if isinstance(done, list) else [],
        "completed": entry.get("completed") is True,
        "seen_blocks": {key: value for key, value in seen.items() if isinstance(key, str) and _count(value)}
                       if isinstance(seen, dict) else {},
        "answers": {key: clean for key, clean in ((key, _clean_answer(value)) for key, value in answers.items())
                    if clean is not None} if isinstance(answers, dict) else {},
        "predictions": {key: clean for key, clean in ((key, _clean_prediction(value))
                                                      for key, value in predictions.items())
                        if clean is not None} if isinstance(predictions, dict) else {},
        "place": _clean_place(entry.get("place")),
    }


def _clean_place(value: Any) -> list[float] | None:
    """[index of the lesson part at the top of the view, how far into it (0-1)], or None when malformed."""
    if (isinstance(value, list) and len(value) == 2 and isinstance(value[0], int) and not isinstance(value[0], bool)
            and 0 <= value[0] < 10_000 and isinstance(value[1], (int, float)) and not isinstance(value[1], bool)
            and 0 <= value[1] <= 1):
        return [value[0], float(value[1])]
    return None


def clean_progress(data: dict[str, Any]) -> dict[str, Any]:
    """A progress object keeping every well-formed part of `data` (hand edits, older versions)."""
    clean = _empty()
    clean.update({key: value for key, value in data.items() if key not in clean})  # a newer version's keys stay
    if isinstance(data.get("last_lesson"), str):
        clean["last_lesson"] = data["last_lesson"]
    if isinstance(data.get("learner_id"), str) and data["learner_id"]:
        clean["learner_id"] = data["learner_id"]
    lessons = data.get("lessons")
    if isinstance(lessons, dict):
        for lesson_id, entry in lessons.items():
            lesson = _clean_lesson(entry)
            if lesson is not None:
                clean["lessons"][lesson_id] = lesson
    return clean


def merge_progress(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    """Both instances' progress: done blocks and completions united; our answers win on a clash."""
    merged = clean_progress(theirs)
    for key, value in ours.items():
        merged.setdefault(key, value)  # keys only we know of (read at start) survive too
    merged["last_lesson"] = ours.get("last_lesson") or merged["last_lesson"]
    merged["learner_id"] = merged["learner_id"] or ours.get("learner_id")  # the first one written stays
    for lesson_id, entry in ours["lessons"].items():
        other = merged["lessons"].setdefault(lesson_id, _clean_lesson({}))
        for key, value in entry.items():
            other.setdefault(key, value)
        other["done_blocks"] = sorted(set(other["done_blocks"]) | set(entry["done_blocks"]))
        other["completed"] = other["completed"] or entry["completed"]
        other["seen_blocks"] = {key: max(other["seen_blocks"].get(key, 0), entry["seen_blocks"].get(key, 0))
                                for key in set(other["seen_blocks"]) | set(entry["seen_blocks"])}
        other["answers"] = {**other["answers"], **entry["answers"]}
        other["place"] = entry.get("place") or other.get("place")  # where this instance's learner left it
        other["predictions"] = {**other["predictions"], **entry["predictions"]}
    return merged


class ProgressStore:
    """Progress in progress.json (path: data_dir()/progress.json unless given).

    `warning` holds the latest problem (a corrupt file set aside, a folder that cannot be written)
    as one line for the UI; `persistent` turns False once a write has failed, after which the
    store works in memory only. Safe to use from several threads.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else data_dir() / PROGRESS_FILE
        self._lock = threading.Lock()
        data, self.warning = read_json(self.path, _empty())
        self._data = clean_progress(data)
        self.persistent = True

    # ---- reading ------------------------------------------------------------------------------

    def _lesson(self, lesson_id: str) -> dict[str, Any]:
        return self._data["lessons"].get(lesson_id) or _clean_record({})

    def lesson_state(self, lesson_id: str) -> LessonProgress:
        entry = self._lesson(lesson_id)
        return LessonProgress(done_blocks=frozenset(entry["done_blocks"]), completed=entry["completed"],
                              seen_blocks=frozenset(key for key in entry["seen_blocks"]
                                                    if key not in entry["done_blocks"]))

    @property
    def learner_id(self) -> str:
        """This progress file's random id (created and saved on first use): the seed of the learner's
        draws and choice order."""
        if not self._data.get("learner_id"):
            import secrets  # here: its hashlib import is 3 ms of every launch, and only a first run draws an id

            new_id = secrets.token_hex(8)
            self._change(None, lambda data: data.__setitem__("learner_id", data.get("learner_id") or new_id))
            if not self.persistent:  # said once: the id is only created once per store
                self.warning = "; ".join(filter(None, (self.warning, LEARNER_ID_NOT_SAVED)))
        return self._data["learner_id"]

    def round_of(self, lesson_id: str, block_id: str) -> int:
        """How many times the learner had this block's answer shown: the round it is drawn for."""
        return int(self._lesson(lesson_id)["seen_blocks"].get(block_id, 0))

    def attempts(self, lesson_id: str, block_id: str) -> int:
        """Answers counted for a quiz (unreadable ones are not recorded)."""
        return int(self._lesson(lesson_id)["answers"].get(block_id, {}).get("attempts", 0))

    def is_completed(self, lesson_id: str) -> bool:
        return self._lesson(lesson_id)["completed"]

    def answers(self, lesson_id: str) -> dict[str, AnswerRecord]:
        """quiz id -> the latest answer recorded for it."""
        return {quiz_id: AnswerRecord(answer=value["answer"], correct=value["correct"],
                                      attempts=int(value.get("attempts", 1)), at=str(value.get("at", "")),
                                      round=int(value.get("round", 0)))
                for quiz_id, value in self._lesson(lesson_id)["answers"].items()}

    def answer(self, lesson_id: str, quiz_id: str) -> AnswerRecord | None:
        """The latest answer recorded for one quiz (what a reopened quiz shows), None when none was."""
        return self.answers(lesson_id).get(quiz_id)

    def predictions(self, lesson_id: str) -> dict[str, PredictionRecord]:
        """predict id -> the learner's guess and the measured value."""
        result = {}
        for predict_id, value in self._lesson(lesson_id)["predictions"].items():
            measured = value.get("measured")
            measured = float(measured) if isinstance(measured, (int, float)) and not isinstance(measured, bool) else None
            result[predict_id] = PredictionRecord(float(value["predicted"]), measured, str(value.get("at", "")),
                                                  str(value.get("typed", "")))
        return result

    def prediction(self, lesson_id: str, predict_id: str) -> PredictionRecord | None:
        """The guess and measurement kept for one predict block (what a reopened one shows), None when none was."""
        return self.predictions(lesson_id).get(predict_id)

    def track_progress(self, track: Track) -> tuple[int, int]:
        """(completed lessons, lessons) of a track."""
        return sum(self.is_completed(lesson_id) for lesson_id in track.lesson_ids), len(track.lesson_ids)

    @property
    def last_lesson(self) -> str | None:
        """The lesson the learner last worked in (where `tensor-tutor` resumes)."""
        return self._data["last_lesson"]

    # ---- changing -----------------------------------------------------------------------------

    def _change(self, lesson_id: str | None, update) -> None:
        with self._lock:
            if lesson_id is not None:
                entry = self._data["lessons"].setdefault(lesson_id, _clean_lesson({}))
                update(entry)
                self._data["last_lesson"] = lesson_id
            else:
                update(self._data)
            self._save()

    def _save(self) -> None:
        if not self.persistent:
            return
        try:
            with locked(self.path) as moved:  # another process must not write between our read and our write
                on_disk, warning = read_json(self.path, _empty())
                if warning or moved:
                    self.warning = "; ".join(filter(None, (moved, warning)))
                merged = merge_progress(self._data, on_disk)
                write_json_atomic(self.path, merged)
        except OSError as error:
            self.persistent = False
            self.warning = (f"cannot save progress to {self.path} ({error.strerror or error}); "
                            "progress is kept until you quit")
            return
        self._data = merged

    def set_last_lesson(self, lesson_id: str) -> None:
        self._change(None, lambda data: data.__setitem__("last_lesson", lesson_id))

    def place(self, lesson_id: str) -> tuple[int, float] | None:
        """Where the learner left `lesson_id`: (index of the lesson part at the top of the view, how far into it)."""
        entry = self._data["lessons"].get(lesson_id) or {}
        place = entry.get("place")
        return (place[0], place[1]) if place else None

    def set_place(self, lesson_id: str, place: tuple[int, float]) -> None:
        clean = _clean_place([place[0], place[1]])
        if clean is not None and clean != (self._data["lessons"].get(lesson_id) or {}).get("place"):
            self._change(lesson_id, lambda entry: entry.__setitem__("place", clean))

    def mark_block(self, lesson_id: str, block_id: str) -> None:
        def update(entry: dict[str, Any]) -> None:
            entry["done_blocks"] = sorted(set(entry["done_blocks"]) | {block_id})

        self._change(lesson_id, update)

    def record_reveal(self, lesson_id: str, block_id: str) -> None:
        """The learner had the answer shown: the quiz is seen, not solved (the next visit is a new round)."""
        def update(entry: dict[str, Any]) -> None:
            entry["seen_blocks"][block_id] = int(entry["seen_blocks"].get(block_id, 0)) + 1

        self._change(lesson_id, update)

    def mark_completed(self, lesson_id: str) -> None:
        self._change(lesson_id, lambda entry: entry.__setitem__("completed", True))

    def record_answer(self, lesson_id: str, quiz_id: str, answer: str, correct: bool) -> None:
        """Keep the latest answer, with the round it answered, and count attempts; a correct answer marks
        the quiz block done."""
        def update(entry: dict[str, Any]) -> None:
            previous = entry["answers"].get(quiz_id, {})
            attempts = int(previous.get("attempts", 0)) + 1
            entry["answers"][quiz_id] = {"answer": str(answer), "correct": bool(correct), "attempts": attempts,
                                         "at": _now(), "round": int(entry["seen_blocks"].get(quiz_id, 0))}
            if correct:
                entry["done_blocks"] = sorted(set(entry["done_blocks"]) | {quiz_id})

        self._change(lesson_id, update)

    def record_prediction(self, lesson_id: str, predict_id: str, predicted: float, measured: float | None,
                          typed: str = "") -> None:
        """Keep a guess (as read, and as `typed`) and its measurement; the predict block counts as done once measured."""
        def update(entry: dict[str, Any]) -> None:
            entry["predictions"][predict_id] = {"predicted": float(predicted),
                                                "measured": None if measured is None else float(measured),
                                                "at": _now(), "typed": str(typed)}
            if measured is not None:
                entry["done_blocks"] = sorted(set(entry["done_blocks"]) | {predict_id})

        self._change(lesson_id, update)

    def reset(self, lesson_id: str | None = None) -> None:
        """Forget one lesson's progress, or everything (lesson_id None). Not merged: a reset wins."""
        with self._lock:
            if lesson_id is None:
                self._data = _empty()
            else:
                self._data["lessons"].pop(lesson_id, None)
            if not self.persistent:
                return
            try:
                with locked(self.path) as moved:
                    write_json_atomic(self.path, self._data)
                if moved:
                    self.warning = moved
            except OSError as error:
                self.persistent = False
                self.warning = f"cannot save progress to {self.path} ({error.strerror or error})"
