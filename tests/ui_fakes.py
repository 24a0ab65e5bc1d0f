"""Deterministic stand-ins for the app's services: a fixed machine, a sampler with canned
samples, probes with canned results (one slow and cancellable), a two-track curriculum, an
in-memory progress store. The UI tests and snapshots use these so that they depend neither on
this machine nor on the lesson content of the day. Each satisfies the Protocol of
tutor.ui.services it stands in for (tests/test_ui_workers.py checks); the machine and the
settings are the real classes, built from recorded facts.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tutor.hardware.cpu import CacheLevel, Clock, CpuInfo, CpuPeak
from tutor.hardware.machine import Machine
from tutor.hardware.nvidia import GpuInfo, NvmlStatus
from tutor.hardware.sampler import GpuSample, Sample
from tutor.labs import Measurement, ProbeResult
from tutor.lessons.grading import Grade
from tutor.lessons.model import Bits, Calc, Lesson, Measure, Predict, Prose, Quiz, Track
from tutor.lessons.model import LessonInfo as Info
from tutor.lessons.progress import AnswerRecord, PredictionRecord
from tutor.files.settings import Settings
from tutor.ui.machine_detection import MachineDetection
from tutor.ui.services import Services
from tutor.worker.jobs import BenchOutcome, BenchRow

NO_DRIVER = "no NVIDIA driver found (NVML: NVML Shared Library Not Found)"


def fake_machine(gpu: bool = False) -> Machine:
    """A 2-core AVX-512 Xeon with 24 GiB RAM (and optionally one H100)."""
    peaks = {
        "fp32": CpuPeak("fp32", 2.688e11, 64, "FLOP", None),
        "tf32": CpuPeak("tf32", None, None, None, "no TF32 on a CPU"),
        "bf16": CpuPeak("bf16", 5.376e11, 128, "FLOP", "AVX512_BF16"),
        "fp16": CpuPeak("fp16", None, None, None, "no native FP16 FMA"),
        "fp8": CpuPeak("fp8", None, None, None, "no FP8 on a CPU"),
        "int8": CpuPeak("int8", None, None, None, "not modelled"),
    }
    cpu = CpuInfo(
        model_name="Fake Xeon 2-core", vendor="GenuineIntel", arch="x86_64", physical_cores=2, logical_cores=2,
        flags=("avx2", "avx512f"), caches=(CacheLevel(3, "Unified", 32 * 2**20, 2),),
        ram_total_bytes=24 * 2**30, ram_available_bytes=20 * 2**30,
        current_clock=Clock(2.1e9, "fixed"), peak_clock=Clock(2.1e9, "fixed"), peaks=peaks)
    if gpu:
        gpus = [GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", memory_total_bytes=80 * 10**9,
                        memory_free_bytes=79 * 10**9, sm_clock_max_mhz=1980, power_limit_w=700.0)]
        nvml = NvmlStatus(True, None, driver_version="550.00")
    else:
        gpus, nvml = [], NvmlStatus(False, NO_DRIVER)
    return Machine(cpu=cpu, gpus=gpus, nvml=nvml, versions={})


class FakeSampler:
    """Sixty canned samples: CPU load rising and falling, RAM creeping up; start/stop do nothing."""

    interval_s = 0.5

    def __init__(self, gpu: bool = False) -> None:
        self._samples = []
        for tick in range(60):
            load = float((tick * 7) % 100)
            gpus = (GpuSample(0, utilization_pct=load, memory_used_bytes=(10 + tick) * 10**9, sm_clock_mhz=1500,
                              power_w=300.0 + tick, temperature_c=50 + tick % 10),) if gpu else ()
            self._samples.append(Sample(1000.0 + tick / 2, (load, load / 2), (8 + tick / 10) * 2**30,
                                        24 * 2**30, gpus))
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True

    def samples(self) -> list[Sample]:
        return list(self._samples)

    def latest(self) -> Sample | None:
        return self._samples[-1]


@dataclass(frozen=True)
class FakeProbe:
    """A probe with a canned result; `slow` ones wait (reporting progress) until cancelled."""

    name: str
    title: str = "fake probe"
    description: str = "a deterministic stand-in"
    needs_torch: bool = False
    params_schema: dict = field(default_factory=dict)
    default_params: dict = field(default_factory=dict)
    slow: bool = False
    calls: list = field(default_factory=list)

    def run(self, params: dict, progress: Any, cancel: threading.Event) -> ProbeResult:
        self.calls.append(dict(params))
        if self.slow:
            step = 0
            while not cancel.wait(0.05):
                step += 1
                progress(min(step / 500, 0.99), f"step {step}")
            return ProbeResult(self.name, (Measurement("matmul fp32", 10.0, "GFLOP/s", 268.8, "formula"),),
                               {"tflops_fp32": 0.01}, "cancelled", cancelled=True)
        progress(0.5, "halfway")
        rows = (
            Measurement("matmul fp32", 120.0, "GFLOP/s", 268.8, "cores x FLOP/cycle x clock"),
            Measurement("matmul bf16", 30.0, "GFLOP/s", 537.6, "cores x FLOP/cycle x clock",
                        note="bf16 emulated: no AMX on this CPU"),
            Measurement("saved activations", 1.05e6, "B", 1.0e6, "Korthikanti et al. 2022 eq. 1"),
        )
        metrics = {"tflops_fp32": 0.12, "tflops_bf16": 0.03, "speedup_bf16_over_fp32": 0.25,
                   "speedup_fp32_over_bf16": 4.0}
        return ProbeResult(self.name, rows, metrics, "fp32 reached 45% of its peak")


class BrokenProbe(FakeProbe):
    def run(self, params: dict, progress: Any, cancel: threading.Event) -> ProbeResult:
        raise RuntimeError("the fake probe broke\nsecond line never shown")


# ---- a small curriculum in the engine's shapes -----------------------------------------------

def fake_grade(quiz: Any, answer: str, *, device: Any = None) -> Grade:
    """Numbers within the relative tolerance, choices by index, text case-insensitively."""
    if quiz.kind == "number":
        value = float(answer.split()[0])
        correct = abs(value - float(quiz.answer)) <= quiz.tolerance * abs(float(quiz.answer))
    elif quiz.kind == "choice":
        correct = int(answer) == int(quiz.answer)
    else:
        correct = answer.strip().lower() == str(quiz.answer).lower()
    return Grade(correct, "" if correct else "not within tolerance", str(quiz.answer))


def fake_expected(quiz: Any, *, device: Any = None) -> Any:
    return quiz.answer


def fake_render_values(text: str, *, device: Any = None) -> str:
    return text.replace("{{ 6 * 8 }}", "48")


LESSONS = (
    Lesson(Info("precision/bits", "What a float is made of", "precision", 8, (), "Sign, exponent, mantissa"), (
        Prose("A float has **three fields**. Six times eight is {{ 6 * 8 }}."),
        Bits("0.1", ("fp32", "bf16", "fp16", "fp8-e4m3"), id="bits-1"),
        Prose("Which format keeps FP32's range?"),
        Quiz("bf16-range", "Which 16-bit format keeps FP32's exponent?", "choice", ("fp16", "bf16", "int8"), 1, None,
             0.0, ("Count the exponent bits.",), "BF16 keeps 8 exponent bits."),
        Quiz("fp16-max", "Largest finite FP16 number?", "number", (), 65504, None, 0.01,
             ("5 exponent bits, 10 mantissa bits.", "(2 - 2^-10) x 2^15"), "65504 = (2 - 2^-10) x 2^15."),
    )),
    Lesson(Info("precision/speed", "Lower precision, more speed?", "precision", 10, ("precision/bits",),
                "Measure matmul per dtype"), (
        Prose("Now measure it."),
        Measure("matmul", {"dtypes": ["fp32", "bf16"], "budget_s": 2}, "BF16 is emulated here.", id="measure-1"),
        Predict("bf16-speedup", "How many times faster is BF16 than FP32 here?", "matmul",
                {"dtypes": ["fp32", "bf16"]}, "speedup_bf16_over_fp32", "x"),
    )),
    Lesson(Info("memory/train", "Training needs more memory", "memory", 12, (), "Weights, grads, Adam"), (
        Prose("Training holds weights, gradients and optimizer states."),
        Calc("memory", "llama-3.1-8b", ("model", "mode", "batch", "seq"), {"mode": "train"}, id="calc-1"),
        Measure("slow", {}, "This one never finishes by itself.", id="measure-1"),
    )),
)
TRACKS = (
    Track("precision", "Precision and number formats", "Bits, ranges, speed.", ("precision/bits", "precision/speed")),
    Track("memory", "Memory: inference against training", "Where the bytes go.", ("memory/train",)),
)


def with_completing_blocks(lesson: Lesson) -> Lesson:
    """The lesson with its info listing the blocks that complete it, as the loader's index lists them."""
    import dataclasses

    from tutor.lessons.progress import REQUIRED_TO_COMPLETE

    blocks = tuple(block.id for block in lesson.blocks if block.directive in REQUIRED_TO_COMPLETE)
    return dataclasses.replace(lesson, info=dataclasses.replace(lesson.info, blocks=blocks))


class FakeCurriculum:
    def __init__(self, lessons: tuple = LESSONS, tracks: tuple = TRACKS) -> None:
        self._lessons = {lesson.info.id: with_completing_blocks(lesson) for lesson in lessons}
        self.tracks = tracks

    @property
    def lessons(self) -> tuple[Info, ...]:
        return tuple(self._lessons[i].info for t in self.tracks for i in t.lesson_ids)

    def lesson(self, lesson_id: str) -> Lesson:
        from tutor.errors import UserError

        if lesson_id not in self._lessons:
            raise UserError(f"no lesson {lesson_id!r}")
        return self._lessons[lesson_id]

    def _step(self, lesson_id: str, step: int) -> Info | None:
        ids = [info.id for info in self.lessons]
        index = ids.index(lesson_id) + step
        return self.lessons[index] if 0 <= index < len(ids) else None

    def next_lesson(self, lesson_id: str) -> Info | None:
        return self._step(lesson_id, 1)

    def previous_lesson(self, lesson_id: str) -> Info | None:
        return self._step(lesson_id, -1)


@dataclass
class LessonProgress:
    done_blocks: set
    completed: bool


class FakeProgress:
    """In memory; records every call so tests can check what was saved."""

    def __init__(self) -> None:
        self.state: dict[str, LessonProgress] = {}
        self.answers: list[tuple] = []
        self.predictions: list[tuple] = []
        self.last_lesson: str | None = None
        self.places: dict[str, tuple[int, float]] = {}
        self.warning: str | None = None
        self.learner_id = ""
        self.reveals: list[tuple[str, str]] = []
        self.typed: dict[tuple[str, str], str] = {}

    def set_last_lesson(self, lesson_id: str) -> None:
        self.last_lesson = lesson_id

    def place(self, lesson_id: str) -> tuple[int, float] | None:
        return self.places.get(lesson_id)

    def set_place(self, lesson_id: str, place: tuple[int, float]) -> None:
        self.places[lesson_id] = place

    def lesson_state(self, lesson_id: str) -> LessonProgress:
        return self.state.setdefault(lesson_id, LessonProgress(set(), False))

    def round_of(self, lesson_id: str, block_id: str) -> int:
        return 0

    def attempts(self, lesson_id: str, block_id: str) -> int:
        return 0

    def record_reveal(self, lesson_id: str, block_id: str) -> None:
        self.reveals.append((lesson_id, block_id))

    def mark_block(self, lesson_id: str, block_id: str) -> None:
        self.lesson_state(lesson_id).done_blocks.add(block_id)

    def mark_completed(self, lesson_id: str) -> None:
        self.lesson_state(lesson_id).completed = True

    def record_answer(self, lesson_id: str, quiz_id: str, answer: str, correct: bool) -> None:
        self.answers.append((lesson_id, quiz_id, answer, correct))

    def record_prediction(self, lesson_id: str, predict_id: str, predicted: float, measured: float,
                          typed: str = "") -> None:
        self.predictions.append((lesson_id, predict_id, predicted, measured))
        self.typed[(lesson_id, predict_id)] = typed

    def answer(self, lesson_id: str, quiz_id: str) -> AnswerRecord | None:
        given = [(answer, correct) for lesson, quiz, answer, correct in self.answers
                 if (lesson, quiz) == (lesson_id, quiz_id)]
        return AnswerRecord(given[-1][0], given[-1][1], len(given), "") if given else None

    def prediction(self, lesson_id: str, predict_id: str) -> PredictionRecord | None:
        made = [(predicted, measured) for lesson, block, predicted, measured in self.predictions
                if (lesson, block) == (lesson_id, predict_id)]
        return (PredictionRecord(made[-1][0], made[-1][1], "", self.typed.get((lesson_id, predict_id), ""))
                if made else None)

    def track_progress(self, track: Any) -> tuple[int, int]:
        return sum(self.lesson_state(i).completed for i in track.lesson_ids), len(track.lesson_ids)


FakeSettings = Settings
"""The real settings: a frozen dataclass with defaults, nothing to fake."""


def fake_bench(progress: Any, cancel: threading.Event) -> BenchOutcome:
    progress(0.5, "matmul fp32: done")
    return BenchOutcome((
        BenchRow("matmul fp32", 0.121, 0.2688, "TFLOP/s", "torch; small size", "median of 10 at 512²"),
        BenchRow("matmul bf16", 0.031, 0.5376, "TFLOP/s", "torch; bf16 emulated", "median of 5 at 256²"),
        BenchRow("matmul fp16", 0.3, 0.2688, "TFLOP/s", "torch", "median of 10 at 1024²"),
        BenchRow("bandwidth triad", 9.8, None, "GB/s", "no published DRAM peak", "median of 10 at 128 MiB per array"),
    ), device="cpu")


def slow_bench(progress: Any, cancel: threading.Event) -> BenchOutcome:
    step = 0
    while not cancel.wait(0.05):
        step += 1
        progress(min(step / 500, 0.99), f"matmul fp32: step {step}")
    return BenchOutcome((), cancelled=True, device="cpu")


def fake_services(*, gpu: bool = False, curriculum: Any = None, progress: Any = None, **changes: Any) -> Services:
    saved: list = []
    services = Services(
        curriculum=curriculum or FakeCurriculum(),
        progress=progress or FakeProgress(),
        machine_detection=MachineDetection.known(fake_machine(gpu)),
        sampler=FakeSampler(gpu),
        probes={"matmul": FakeProbe("matmul"), "slow": FakeProbe("slow", slow=True),
                "broken": BrokenProbe("broken")},
        render_values=fake_render_values,
        grade=fake_grade,
        expected_answer=fake_expected,
        run_bench=fake_bench,
        torch_cast=lambda value, names: {n: float(value) if n == "fp32" else 0.0 for n in names},
        settings=FakeSettings(),
        save_settings=saved.append,
    )
    import dataclasses

    return dataclasses.replace(services, **changes)


class AnyMetric(dict):
    """Metrics that answer every name a predict block may ask for."""

    def get(self, key, default=None):
        return 2.0


class NamedFakeProbe(FakeProbe):
    """A fake under a real lab's name: done at once, every metric 2, every exercise solved."""

    def run(self, params, progress, cancel):
        progress(1.0, "done")
        result = super().run(params, progress, cancel)
        details = {"passed": True, "findings": []} if self.name == "exercise" else {}
        return ProbeResult(self.name, result.rows, AnyMetric(), result.summary, details=details)


def real_services(tmp_path: Any) -> Services:
    """The real curriculum, grading and value rendering, with fake probes under the real lab names."""
    from tutor import labs, lessons
    from tutor.worker.jobs import torch_cast

    return Services(
        curriculum=lessons.load_curriculum(),
        progress=lessons.ProgressStore(tmp_path / "progress.json"),
        machine_detection=MachineDetection.known(fake_machine()),
        sampler=FakeSampler(),
        probes={name: NamedFakeProbe(name) for name in labs.PROBES},
        render_values=lessons.render_values,
        grade=lessons.grade,
        expected_answer=lessons.expected_answer,
        run_bench=lambda progress, cancel: None,
        torch_cast=torch_cast,
        settings=FakeSettings(),
        save_settings=lambda settings: None,
    )


def text_of(widget: Any) -> str:
    """A widget's content as the terminal shows it, markup rendered."""
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(widget.content)
    return console.export_text()


async def walk_lessons(services: Services, lesson_ids: Iterable[str], *,
                       size: tuple[int, int] = (120, 40)) -> AsyncIterator[tuple[str, Any, Any]]:
    """The app with `services`, each of `lesson_ids` opened in turn: yields (id, its lesson screen, the
    pilot) once the screen is mounted, for the caller to work through before the next one opens."""
    from tutor.ui.app import TutorApp

    app = TutorApp(services)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for lesson_id in lesson_ids:
            app.open_lesson(lesson_id)
            await pilot.pause()
            yield lesson_id, app.screen, pilot


def sync(test):
    """Run an async Pilot test with asyncio.run (the suite has no pytest async plugin)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        return asyncio.run(test(*args, **kwargs))

    return run


async def until(pilot: Any, condition: Callable[[], object], what: str, *, limit_s: float = 300.0) -> None:
    """Let the app run until `condition()` holds: the event the test checks (a status line, a
    result, a worker that has started), never a fixed time, so a busy machine only makes it later.
    A button press posts a message, and the worker it starts begins after that message is handled,
    so `app.workers.wait_for_complete()` right after a press can return before any worker exists.
    `limit_s` only turns a hang into a failure that names `what`."""
    deadline = time.monotonic() + limit_s
    await pilot.pause()
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {limit_s:g} s for {what}")
        # The app handles its messages meanwhile; pilot.pause() here would post a callback to every
        # widget on the screen at each look, which costs more than the wait on a long lesson.
        await asyncio.sleep(0.02)
    await pilot.pause()
