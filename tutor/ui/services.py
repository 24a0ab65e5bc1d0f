"""Everything the app reads from outside the UI, gathered in one injectable object.

The app never reaches for the hardware, the lesson engine or the probes directly: it receives a
`Services`. `default_services()` builds the real one: the lesson engine, the labs' probes, the
bench suite and the torch cast all run in the measurement process (tutor.worker), so this process
never imports torch; tests build one from deterministic fakes (tests/ui_fakes.py) that satisfy the
Protocols below.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tutor.files.settings import Settings
from tutor.ui.machine_detection import MachineDetection

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tutor.hardware.machine import Machine
    from tutor.hardware.sampler import Sample
    from tutor.labs.probe import ProbeResult, ProgressFn
    from tutor.lessons.grading import Grade
    from tutor.lessons.model import Lesson, LessonInfo, Quiz, Track
    from tutor.lessons.progress import AnswerRecord, PredictionRecord
    from tutor.worker.client import WorkerClient
    from tutor.worker.jobs import BenchOutcome

__all__ = ["CurriculumLike", "DrawsResults", "LessonStateLike", "ProbeLike", "ProgressLike", "SamplerLike",
           "SamplerWhenStarted", "Services", "default_services"]


@runtime_checkable
class ProbeLike(Protocol):
    """What the app needs of a lab (tutor.labs.Probe, or the worker's tutor.worker.proxies.WorkerLab),
    known without importing the lab's module. A lab may also have `param_names` (the measure block
    passes the learner's device to a lab that takes one) and `render` (its drawing of a result)."""

    @property
    def name(self) -> str: ...

    @property
    def title(self) -> str: ...

    def run(self, params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult: ...


@runtime_checkable
class DrawsResults(Protocol):
    """A probe that can draw a result's details (tutor.labs.Probe.render: timelines, per-rank bars;
    None when it draws nothing). Probes without the attribute (the tests' fakes) draw nothing."""

    @property
    def render(self) -> Callable[[ProbeResult], RenderableType] | None: ...


@runtime_checkable
class SamplerLike(Protocol):
    """The live pane's source (tutor.hardware.sampler.Sampler)."""

    interval_s: float

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def samples(self) -> list[Sample]: ...

    def latest(self) -> Sample | None: ...


@runtime_checkable
class CurriculumLike(Protocol):
    """The tracks and lessons (tutor.lessons.Curriculum)."""

    @property
    def tracks(self) -> tuple[Track, ...]: ...

    @property
    def lessons(self) -> tuple[LessonInfo, ...]: ...

    def lesson(self, lesson_id: str) -> Lesson: ...

    def next_lesson(self, lesson_id: str) -> LessonInfo | None: ...

    def previous_lesson(self, lesson_id: str) -> LessonInfo | None: ...


class LessonStateLike(Protocol):
    """One lesson's progress (tutor.lessons.progress.LessonProgress)."""

    @property
    def done_blocks(self) -> Set[str]: ...

    @property
    def completed(self) -> bool: ...


@runtime_checkable
class ProgressLike(Protocol):
    """Where the learner's progress goes (tutor.lessons.ProgressStore). `warning` is the latest
    problem saving it (one line), None while all is well; `learner_id` seeds the learner's draws
    and choice order; `last_lesson` is the lesson the learner was in (None at first); `answer` and
    `prediction` give back what a reopened block shows."""

    warning: str | None

    @property
    def learner_id(self) -> str: ...

    @property
    def last_lesson(self) -> str | None: ...

    def lesson_state(self, lesson_id: str) -> LessonStateLike: ...

    def round_of(self, lesson_id: str, block_id: str) -> int: ...

    def attempts(self, lesson_id: str, block_id: str) -> int: ...

    def record_reveal(self, lesson_id: str, block_id: str) -> None: ...

    def set_last_lesson(self, lesson_id: str) -> None: ...

    def place(self, lesson_id: str) -> tuple[int, float] | None: ...

    def set_place(self, lesson_id: str, place: tuple[int, float]) -> None: ...

    def mark_block(self, lesson_id: str, block_id: str) -> None: ...

    def mark_completed(self, lesson_id: str) -> None: ...

    def record_answer(self, lesson_id: str, quiz_id: str, answer: str, correct: bool) -> None: ...

    def record_prediction(self, lesson_id: str, predict_id: str, predicted: float, measured: float,
                          typed: str = "") -> None: ...

    def answer(self, lesson_id: str, quiz_id: str) -> AnswerRecord | None: ...

    def prediction(self, lesson_id: str, predict_id: str) -> PredictionRecord | None: ...

    def track_progress(self, track: Track) -> tuple[int, int]: ...


BenchRunner = Callable[["ProgressFn", threading.Event], "BenchOutcome"]
TorchCaster = Callable[[str, Sequence[str]], dict[str, float]]


class ValuesRenderer(Protocol):
    """tutor.lessons.render_values: a lesson's text with its {{ }} values computed for `device`."""

    def __call__(self, text: str, *, device: Machine | None = None) -> str: ...


class Grader(Protocol):
    """tutor.lessons.grade: the verdict on one answer to a quiz."""

    def __call__(self, quiz: Quiz, answer: str, *, device: Machine | None = None) -> Grade: ...


class AnswerFn(Protocol):
    """tutor.lessons.expected_answer: the reference answer of a quiz."""

    def __call__(self, quiz: Quiz, *, device: Machine | None = None) -> str | float | int: ...


SettingsSaver = Callable[[Settings], "str | None"]
"""tutor.files.settings.save_settings: returns its problem as one line instead of raising."""


@dataclass(frozen=True)
class Services:
    """The app's view of the world. Every field is replaceable in tests.

    curriculum, progress, render_values, grade and expected_answer come from tutor.lessons;
    probes from tutor.labs (as worker proxies); the machine (`machine_detection`, read as `machine`)
    and sampler from tutor.hardware; run_bench and torch_cast run in the worker. `worker` is the measurement process the app starts at launch
    and stops on exit (None: the probes run in this process, as the tests' fakes do).
    """

    curriculum: CurriculumLike
    progress: ProgressLike
    machine_detection: MachineDetection
    sampler: SamplerLike
    probes: Mapping[str, ProbeLike]
    render_values: ValuesRenderer
    grade: Grader
    expected_answer: AnswerFn
    run_bench: BenchRunner
    torch_cast: TorchCaster
    settings: Settings
    save_settings: SettingsSaver
    warnings: tuple[str, ...] = field(default=())
    worker: WorkerClient | None = None

    @property
    def machine(self) -> Machine:
        """This machine: detected on first use unless the app's detection thread has done it."""
        return self.machine_detection.result()

    def probe(self, name: str) -> ProbeLike:
        """The lab called `name`; UserError naming the known ones otherwise."""
        from tutor.errors import UserError

        if name not in self.probes:
            raise UserError(f"unknown lab {name!r}: use one of {', '.join(sorted(self.probes))}")
        return self.probes[name]


# The lessons' values and graders import much of tutor.theory: on first use (a lesson opened, an
# answer checked), not before the home screen is painted (launch time).

def render_values_when_used(text: str, *, device: Machine | None = None) -> str:
    """tutor.lessons.render_values, imported on the first call."""
    from tutor.lessons.values import render_values

    return render_values(text, device=device)


def grade_when_used(quiz: Quiz, answer: str, *, device: Machine | None = None) -> Grade:
    """tutor.lessons.grade, imported on the first call."""
    from tutor.lessons.grading import grade

    return grade(quiz, answer, device=device)


def expected_answer_when_used(quiz: Quiz, *, device: Machine | None = None) -> str | float | int:
    """tutor.lessons.expected_answer, imported on the first call."""
    from tutor.lessons.grading import expected_answer

    return expected_answer(quiz, device=device)


class ProbesWhenUsed(Mapping[str, ProbeLike]):
    """The labs as the app runs them (tutor.worker.proxies.worker_labs over tutor.labs.registry.LABS),
    built on first use: the home screen runs no lab, so the registry and the proxies are imported
    with the first lesson or palette search, not before the first paint."""

    def __init__(self, build: Callable[[], Mapping[str, ProbeLike]]) -> None:
        self._build = build
        self._probes: Mapping[str, ProbeLike] | None = None

    def _labs(self) -> Mapping[str, ProbeLike]:
        if self._probes is None:
            self._probes = self._build()
        return self._probes

    def __getitem__(self, name: str) -> ProbeLike:
        return self._labs()[name]

    def __iter__(self):
        return iter(self._labs())

    def __len__(self) -> int:
        return len(self._labs())


class SamplerWhenStarted:
    """tutor.hardware.sampler.Sampler, imported and made on the first start (the app starts it after
    the home screen's first paint, which shows no live pane): its module was 2 ms of every launch."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._sampler: SamplerLike | None = None

    def start(self) -> None:
        if self._sampler is None:
            from tutor.hardware.sampler import Sampler

            self._sampler = Sampler(self.interval_s)
        self._sampler.start()

    def stop(self) -> None:
        if self._sampler is not None:
            self._sampler.stop()

    def samples(self) -> list[Sample]:
        return self._sampler.samples() if self._sampler is not None else []

    def latest(self) -> Sample | None:
        return self._sampler.latest() if self._sampler is not None else None


def worker_labs_when_used(worker: WorkerClient) -> ProbesWhenUsed:
    """Every lab of the registry, run by `worker`, built on first use."""

    def build() -> Mapping[str, ProbeLike]:
        from tutor.labs.registry import LABS
        from tutor.worker.proxies import worker_labs

        return worker_labs(worker, LABS)

    return ProbesWhenUsed(build)


def worker_bench_when_used(worker: WorkerClient) -> BenchRunner:
    """tutor.worker.proxies.worker_bench, imported on the first run of the suite."""

    def run_bench(progress: ProgressFn, cancel: threading.Event) -> BenchOutcome:
        from tutor.worker.proxies import worker_bench

        return worker_bench(worker)(progress, cancel)

    return run_bench


def worker_cast_when_used(worker: WorkerClient) -> TorchCaster:
    """tutor.worker.proxies.worker_cast, imported on the first cast."""

    def cast(value: str, formats: Sequence[str]) -> dict[str, float]:
        from tutor.worker.proxies import worker_cast

        return worker_cast(worker)(value, formats)

    return cast


def default_services(worker: WorkerClient | None = None) -> Services:
    """The real services: this machine, the shipped curriculum, saved progress and settings, and the
    labs, bench suite and torch cast run by `worker` (a new WorkerClient unless given; the app
    starts it after the home screen's first paint). The machine is not detected here: the app
    does it in a thread after that paint (tutor.ui.machine_detection)."""
    import tutor.lessons as lessons
    from tutor.files.settings import load_settings, save_settings
    from tutor.worker.client import WorkerClient

    worker = worker if worker is not None else WorkerClient()
    settings, settings_warning = load_settings()
    progress = lessons.ProgressStore()
    warnings = [w for w in (settings_warning, progress.warning) if w]
    return Services(
        curriculum=lessons.load_curriculum(),
        progress=progress,
        machine_detection=MachineDetection(),
        sampler=SamplerWhenStarted(1.0 / settings.sample_hz),
        probes=worker_labs_when_used(worker),
        render_values=render_values_when_used,
        grade=grade_when_used,
        expected_answer=expected_answer_when_used,
        run_bench=worker_bench_when_used(worker),
        torch_cast=worker_cast_when_used(worker),
        settings=settings,
        save_settings=save_settings,
        warnings=tuple(warnings),
        worker=worker,
    )
