"""Checked exercises (issue 19): every track has one, each passes when solved and fails on its
starting point, and each check says what is wrong in a way a learner can act on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tutor.labs.exercise_checks import CHECKS, check_bf16_bits, check_expert_placement, check_pipeline_schedule
from tutor.lessons.loader import load_curriculum
from tutor.lessons.model import Exercise

sys.path.insert(0, str(Path(__file__).parent))
from cli_runner import run  # noqa: E402

LESSONS = Path(__file__).parent.parent / "lessons"


def exercises() -> list[tuple[str, str, Exercise]]:
    curriculum = load_curriculum(LESSONS)
    found = []
    for track in curriculum.tracks:
        for lesson_id in track.lesson_ids:
            found += [(track.id, lesson_id, block) for block in curriculum.lesson(lesson_id).blocks
                      if isinstance(block, Exercise)]
    return found


def test_every_track_has_an_exercise() -> None:
    tracks = {track.id for track in load_curriculum(LESSONS).tracks}
    assert {track for track, _, _ in exercises()} == tracks and len(exercises()) >= 5


@pytest.mark.parametrize(("lesson_id", "exercise"), [(lesson, block) for _, lesson, block in exercises()],
                         ids=[block.id for _, _, block in exercises()])
def test_the_solution_passes_and_the_starting_point_fails(lesson_id: str, exercise: Exercise) -> None:
    check = CHECKS[exercise.check]
    if check.needs_torch:
        pytest.importorskip("torch")
    start, solution = check.run(exercise.start), check.run(exercise.solution)
    assert not start.passed and start.message, (lesson_id, start)
    assert solution.passed, (lesson_id, solution)


def test_bf16_bits_says_which_field_is_wrong() -> None:
    assert check_bf16_bits("0 01111011 1001101").passed
    assert "round to the nearer one" in check_bf16_bits("0 01111011 1001100").message  # truncated, not rounded
    assert "exponent field 124" in check_bf16_bits("0 01111100 1001101").message
    assert "negative" in check_bf16_bits("1 01111011 1001101").message
    assert "16 bits" in check_bf16_bits("0101").message and "binary digits" in check_bf16_bits("0.1").message


def test_a_schedule_that_waits_for_later_work_is_a_deadlock() -> None:
    verdict = check_pipeline_schedule("stage 0: B1 F1 F2 F3 F4 B2 B3 B4\nstage 1: F1 B1 F2 B2 F3 B3 F4 B4")
    assert not verdict.passed and verdict.message.startswith("deadlock: stage 0: B1")


def test_gpipe_has_the_bubble_but_too_much_in_flight() -> None:
    verdict = check_pipeline_schedule("stage 0: F1 F2 F3 F4 B1 B2 B3 B4\nstage 1: F1 F2 F3 F4 B1 B2 B3 B4")
    assert not verdict.passed and "holds 4 micro-batches" in verdict.message
    assert "stage 0: idle 20%" in " ".join(verdict.details)  # (p-1)/(m+p-1) = 1/5 for GPipe too


def test_a_schedule_must_run_every_micro_batch_once() -> None:
    verdict = check_pipeline_schedule("stage 0: F1 F2 B1 F3 B2 B3 B4\nstage 1: F1 B1 F2 B2 F3 B3 F4 B4")
    assert not verdict.passed and "stage 0 must run F1..F4 and B1..B4 once each" in verdict.message


def test_expert_placement_names_the_bottleneck() -> None:
    verdict = check_expert_placement("rank 0: 0 1\nrank 1: 2 3\nrank 2: 4 5\nrank 3: 6 7")
    assert not verdict.passed and "rank 0 receives 51 tokens, 1.7x the mean" in verdict.message
    assert "exactly once" in check_expert_placement("rank 0: 0 0\nrank 1: 2 3\nrank 2: 4 5\nrank 3: 6 7").message


def test_a_loop_that_does_not_run_is_a_line_with_its_line_number() -> None:
    pytest.importorskip("torch")
    verdict = CHECKS["accumulation-loop"].run("optimizer.zero_grad()\nfor x, y in micro_batches:\n    nope(x)\n")
    assert not verdict.passed and verdict.message == "your loop did not run: line 3: NameError: name 'nope' is not defined"


def test_the_exercise_lab_runs_from_the_command_line() -> None:
    code, out, _ = run(["lab", "exercise", "check=expert-placement",
                        "answer=rank 0: 0 7\nrank 1: 1 6\nrank 2: 2 5\nrank 3: 3 4", "--json"])
    assert code == 0
    result = json.loads(out)
    assert result["passed"] is True and result["metrics"]["passed"] == 1.0 and result["findings"]


def test_lessons_json_lists_exercises() -> None:
    code, out, _ = run(["lessons", "show", "parallelism/pipeline-parallel", "--json"])
    assert code == 0
    shown = json.loads(out)
    blocks = shown["blocks"] if isinstance(shown, dict) else shown
    [exercise] = [block for block in blocks if block["kind"] == "exercise"]
    assert exercise["check"] == "pipeline-schedule" and exercise["start"].startswith("stage 0: F1 F2 F3 F4")
