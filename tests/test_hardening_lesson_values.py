"""Lesson expressions are untrusted content (lessons may come from any folder).

`{{ }}` values must not reach Python's internals through str.format, must not read files, and must
stay bounded in time and size, so that neither `lessons --check` nor the app can be hung by a lesson.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tutor.errors import UserError
from tutor.lessons import render_values
from tutor.lessons import values as lesson_values
from tutor.lessons.values import evaluate

FIXTURE = Path(__file__).parent / "fixtures" / "lessons"


def refusal(expr: str) -> str:
    with pytest.raises(UserError) as caught:
        evaluate(expr)
    return str(caught.value)


def test_str_format_cannot_traverse_into_globals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H11A_SECRET_TOKEN", "hunter2-not-for-lessons")
    for expr in ('"{0.__globals__[os].environ[H11A_SECRET_TOKEN]}".format(models.load_config)',
                 '"{0.__globals__[os].environ[H11A_SECRET_TOKEN]}".format(num)',
                 '"{0.__globals__}".format_map({"0": num})'):
        message = refusal(expr)
        assert "hunter2" not in message and "not allowed" in message


def test_no_file_reading_function_is_reachable(tmp_path: Path) -> None:
    secret = tmp_path / "config.json"
    secret.write_text('{"model_type": "llama", "secret_field": "hunter2-file"}')
    for expr in (f"models.load_config({str(secret)!r})", f"models.resolve_model({str(secret)!r})",
                 f"preset({str(secret)!r})"):
        message = refusal(expr)
        assert "hunter2-file" not in message
    assert "load_config" not in dir(evaluate("models")) and "resolve_model" not in dir(evaluate("models"))


def test_every_offered_function_takes_no_path() -> None:
    import inspect

    for value in lesson_values._base_namespace().values():
        functions = vars(value)["_names"].values() if isinstance(value, lesson_values._ModuleView) else [value]
        for function in functions:
            if callable(function) and not isinstance(function, type) and hasattr(function, "__code__"):
                names = set(inspect.signature(function).parameters)
                assert not names & {"path", "file", "filename", "folder"}, function


def test_file_access_during_evaluation_is_refused(tmp_path: Path) -> None:
    # Defence in depth: even a theory function that opened a path would be stopped while a value runs.
    target = tmp_path / "secret.txt"
    target.write_text("hunter2")
    lesson_values._install_audit_hook()
    token = lesson_values._EVALUATING.set(True)
    try:
        with pytest.raises(PermissionError):
            target.read_text()
        with pytest.raises(PermissionError):
            open(lesson_values.__file__, "a").close()  # noqa: SIM115 - writing inside the package is refused too
        with pytest.raises(PermissionError):
            os.system("true")
    finally:
        lesson_values._EVALUATING.reset(token)
    assert target.read_text() == "hunter2"  # outside an evaluation nothing changes


@pytest.mark.parametrize("expr", [
    "9**9**9", "10**10**4", "(2**4096) * (2**4096)", "'a' * 10**9", "[0] * 10**9", "(1,) * 10**9",
    "round(1, -10**9)", "sum(1 for a in [0]*10000 for b in [0]*10000)", "math.factorial(10**7)",
    "'%*d' % (10**9, 1)", "len([x for x in [0]*10000 for y in [0, 1]])",
])
def test_huge_computations_are_refused_quickly(expr: str) -> None:
    start = time.monotonic()
    refusal(expr)
    assert time.monotonic() - start < 2 * lesson_values.MAX_SECONDS


@pytest.mark.parametrize("expr", [
    "(1).real", "fmt('bf16').max_finite.hex", "max([1], key=float)", "fit.FitRequest.mro()", "lambda: 1",
    "f'{num}'", "[c for c in ()].__class__", "draw.__dict__",
])
def test_only_allowed_syntax_attributes_and_calls(expr: str) -> None:
    assert "not allowed" in refusal(expr)


def test_ordinary_lesson_arithmetic_still_works() -> None:
    assert evaluate("2**4096") == 2**4096  # the bound is on size, not on every power
    assert evaluate("2**-149") == 2**-149
    assert evaluate("sum(x * y for x in [1, 2] for y in [3, 4] if x > 1)") == 14
    assert evaluate("[p for p in (1, 2, 3)][1:]") == [2, 3]
    assert evaluate("round(fmt('bf16').max_finite / 1e38, 2)") == 3.39
    assert render_values("{{ count(params('llama-3.1-8b').total) }}") == "8.03B"


def lessons_check(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TENSOR_TUTOR_LESSONS_DIR": str(root), "H11A_SECRET_TOKEN": "hunter2-env"}
    return subprocess.run([sys.executable, "-m", "tutor", "lessons", "--check"], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


def test_lessons_check_reports_hostile_values_and_does_not_hang(tmp_path: Path) -> None:
    root = tmp_path / "lessons"
    shutil.copytree(FIXTURE, root)
    hostile = {  # one per lesson: the lint reports the first failing value of each block
        "precision/weights-in-memory": '"{0.__globals__[os].environ[H11A_SECRET_TOKEN]}".format(models.load_config)',
        "precision/bits-of-a-float": 'models.load_config("/etc/hostname")',
        "experts/routing": "9**9**9",
    }
    for lesson_id, expr in hostile.items():
        lesson = root / lesson_id / "lesson.md"
        title, rest = lesson.read_text().split("\n", 1)
        lesson.write_text(f"{title}\n\nA value: {{{{ {expr} }}}}.\n{rest}")
    start = time.monotonic()
    result = lessons_check(root)
    assert time.monotonic() - start < 30
    assert result.returncode != 0 and "Traceback" not in result.stderr
    output = result.stdout + result.stderr
    assert "hunter2" not in output
    assert "9**9**9" in output and "load_config" in output and "format" in output
