"""Printed sums that add up and comparisons that read as they are: lab ddp's step split, the MoE labs'
"takes about X, more than budget_s", env's DIMM note for root, and lesson 1's first claim."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tutor.formatting import format_durations_apart
from tutor.hardware.machine import cpu_memory_peak_note
from tutor.labs.ddp import step_summary, step_terms

UNITS = {"ns": 1e-9, "µs": 1e-6, "ms": 1e-3, "s": 1.0}
DURATION = r"([\d,.]+) (ns|µs|ms|s)\b"


def _seconds(text: str) -> float:
    value, unit = re.fullmatch(DURATION, text).groups()
    return float(value.replace(",", "")) * UNITS[unit]


def _printed_sum(summary: str) -> tuple[float, float, float]:
    """(step, sum of the printed terms, rounding allowance) read back from the summary's text."""
    equation = summary.split(";")[0]
    left, right = equation.split(" = ")
    step = _seconds(re.search(DURATION, left).group(0))
    total, allowance = 0.0, 0.005 * step
    terms = re.findall(r"(\+ |- |^)[a-z ]*?" + DURATION, right)
    for sign, value, unit in terms:
        seconds = float(value.replace(",", "")) * UNITS[unit]
        total += -seconds if sign.startswith("-") else seconds
        allowance += 0.005 * seconds
    return step, total, allowance


@pytest.mark.parametrize(("compute", "comm", "step"), [
    (50.2e-3, 10e-3, 79.9e-3),  # a measured run: slower than both back to back
    (10e-3, 4e-3, 11e-3),       # 3 of the 4 ms hidden
    (10e-3, 4e-3, 9e-3),        # faster than compute alone
    (10e-3, 0.0, 10e-3),
])
def test_the_ddp_step_equals_the_sum_it_prints(compute, comm, step) -> None:
    summary = step_summary(compute, comm, step)
    shown_step, shown_total, allowance = _printed_sum(summary)
    assert shown_step == pytest.approx(step, rel=0.005)
    assert abs(shown_total - shown_step) <= allowance, summary


def test_issue_24s_ddp_line_names_what_was_missing() -> None:
    summary = step_summary(50.2e-3, 10e-3, 79.9e-3)
    assert summary.startswith("step 79.9 ms = compute 50.2 ms + exposed communication 10 ms + slowdown 19.7 ms")
    assert summary.endswith("all-reduce 10 ms alone, none of it hidden behind the backward pass")
    assert "3 ms of it (75%) hidden" in step_summary(10e-3, 4e-3, 11e-3)


@given(st.floats(1e-4, 10), st.floats(0, 10), st.floats(1e-4, 30))
def test_step_terms_add_up_exactly(compute, comm, step) -> None:
    terms = step_terms(compute, comm, step)
    total = terms["compute_s"] + terms["exposed_communication_s"] + terms["other_s"]
    assert total == pytest.approx(step, rel=1e-9, abs=1e-12)
    assert terms["exposed_communication_s"] + terms["hidden_communication_s"] == pytest.approx(comm, abs=1e-12)
    assert terms["exposed_communication_s"] >= 0 and terms["hidden_communication_s"] >= 0


@pytest.mark.parametrize(("value", "limit"), [(0.54, 0.5), (0.5004, 0.5), (0.04, 0.039999), (2.0, 2.0)])
def test_a_time_over_a_budget_never_prints_as_equal_to_it(value, limit) -> None:
    shown, budget = format_durations_apart(value, limit)
    assert (shown != budget) == (value != limit)
    if value > limit:
        assert _seconds(shown) > _seconds(budget)


def test_moe_routing_over_budget_reads_as_over(monkeypatch) -> None:
    from tutor.errors import UserError
    from tutor.labs import moe_routing

    ticks = iter([0.0, 0.5004 / 100_000 * moe_routing.CALIBRATION_TOKENS])
    monkeypatch.setattr(moe_routing.time, "perf_counter", lambda: next(ticks))
    params = {"tokens": 100_000, "experts": 8, "top_k": 2, "seed": 0, "budget_s": 0.5}
    with pytest.raises(UserError) as error:
        moe_routing._check_batch_time(params, [0.0] * 8)
    about = re.search(r"takes about " + DURATION, str(error.value)).group(0).removeprefix("takes about ")
    budget = re.search(r"budget_s=0\.5 \(" + DURATION + r"\)", str(error.value)).group(0)
    assert _seconds(about) > _seconds(budget.split("(")[1].rstrip(")")), str(error.value)


def test_root_is_not_told_that_only_root_can_read_the_dimm_layout() -> None:
    assert "only root" not in cpu_memory_peak_note(euid=0) and "dmidecode" in cpu_memory_peak_note(euid=0)
    assert "only root" in cpu_memory_peak_note(euid=1000)


def test_lesson_one_does_not_call_a_number_measured_before_it_is() -> None:
    from tutor.lessons.loader import load_curriculum
    from tutor.lessons.model import Measure, Prose

    curriculum = load_curriculum()
    lesson = curriculum.lesson(curriculum.lessons[0].id)
    first = next(i for i, block in enumerate(lesson.blocks) if isinstance(block, Measure))
    after = lesson.blocks[first + 1]
    assert isinstance(after, Prose)  # shown before the learner has pressed Run
    assert "real" in after.text and "just now" not in after.text and not after.text.startswith("That number")
