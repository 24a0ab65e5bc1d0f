"""The lesson engine: loads the curriculum, splits lesson pages at directives, renders `{{ }}`
values from tutor.theory, grades quiz answers and stores progress. No Textual, no torch.

    curriculum = load_curriculum()
    lesson = curriculum.lesson("precision/bits-of-a-float")
    for block in lesson.blocks: ...            # Prose, Bits, Calc, Measure, Predict, Quiz
    render_values(prose.text, device=figures)  # "{{ count(params('llama-3.1-8b').total) }}" -> "8.03B"
    grade(quiz, "3.4e38")                      # Grade(correct, message, expected)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tutor.lessons.calc_fields import CALC_FIELDS, CALC_KINDS, fit_request
    from tutor.lessons.grading import (
        Grade,
        expected_answer,
        grade,
        number_readings,
        parse_number,
    )
    from tutor.lessons.loader import Curriculum, lessons_root, load_curriculum
    from tutor.lessons.catalog import LessonInfo, Track
    from tutor.lessons.model import (
        DIRECTIVES,
        Bits,
        Block,
        Calc,
        Lesson,
        Measure,
        Predict,
        Prose,
        Quiz,
    )
    from tutor.lessons.progress import (
        AnswerRecord,
        LessonProgress,
        PredictionRecord,
        ProgressStore,
    )
    from tutor.lessons.values import (
        DeviceFigures,
        device_figures,
        evaluate,
        num,
        reference_gpu,
        render_values,
    )

_WHERE = {
    **dict.fromkeys(('CALC_FIELDS', 'CALC_KINDS', 'fit_request'), 'calc_fields'),
    **dict.fromkeys(('Grade', 'expected_answer', 'grade', 'number_readings', 'parse_number'), 'grading'),
    **dict.fromkeys(('Curriculum', 'lessons_root', 'load_curriculum'), 'loader'),
    **dict.fromkeys(('DIRECTIVES', 'Bits', 'Block', 'Calc', 'Lesson', 'Measure', 'Predict', 'Prose', 'Quiz'), 'model'),
    **dict.fromkeys(('LessonInfo', 'Track'), 'catalog'),
    **dict.fromkeys(('AnswerRecord', 'LessonProgress', 'PredictionRecord', 'ProgressStore'), 'progress'),
    **dict.fromkeys(('DeviceFigures', 'device_figures', 'evaluate', 'num', 'reference_gpu', 'render_values'), 'values'),
}
"""Which submodule holds each name: imported on first use (PEP 562), so that reading the curriculum
for the home screen does not import the calculators' and graders' theory (launch time)."""


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tutor.lessons' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tutor.lessons.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CALC_FIELDS", "CALC_KINDS", "DIRECTIVES", "AnswerRecord", "Bits", "Block", "Calc", "Curriculum",
    "DeviceFigures", "Grade", "Lesson", "LessonInfo", "LessonProgress", "Measure", "Predict",
    "PredictionRecord", "ProgressStore", "Prose", "Quiz", "Track", "device_figures", "evaluate",
    "expected_answer", "fit_request", "grade", "lessons_root", "load_curriculum", "num", "number_readings",
    "parse_number", "reference_gpu", "render_values",
]
