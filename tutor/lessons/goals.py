"""Calculator exercises: does the layout a learner chose meet a ```calc block's goal?

The check is the fit answer (tutor.answers.fit), the same as `tensor-tutor fit`: the most loaded device
(plus the CUDA context and allocator slack `fit` counts) must fit the goal's device, the card's
total as its driver reports it (tutor.hardware.memory_budget.given_budget) or a given size, using
no more than `devices_max` devices (dp x tp x pp) and no fewer than `devices_min`. A training goal may
also bound the global batch (`tokens_per_step_max`) and the run's days (`train_tokens`, `days_max`),
on the step `tensor-tutor time` counts (tutor.theory.step_time on the card's sourced ceilings): a
layout that fits only by taking a huge batch, or whose step waits on the network, does not meet it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tutor.errors import UserError
from tutor.formatting import format_count, format_duration, format_number
from tutor.lessons.calc_fields import CALC_FIELDS
from tutor.lessons.model import Calc, Goal
from tutor.theory.fit import FitRequest
from tutor.theory.units import GiB

SECONDS_PER_DAY = 24 * 3600


@dataclass(frozen=True)
class GoalCheck:
    """The verdict on one try: met or not, one line saying why, and the figures behind it."""

    met: bool
    message: str
    worst_bytes: int | None = None
    capacity_bytes: int | None = None
    devices: int | None = None


def goal_capacity(goal: Goal) -> tuple[int, str]:
    """(bytes, name) of the goal's device: a spec-table card at its driver-reported total, or a size."""
    from tutor.hardware.memory_budget import given_budget

    budget = given_budget(goal.device)
    assert budget.capacity is not None, "a given size or a spec-table card always has a capacity"
    return int(budget.capacity), budget.name


def goal_text(calc: Calc) -> str:
    """The task in words, from the goal and the fixed values: "Make llama-3.1-70b (train, seq 4,096)
    fit on at most 8 x NVIDIA H100 80GB HBM3: change dp, tp, pp."""
    goal = calc.goal
    if goal is None:
        return ""
    _, device_name = goal_capacity(goal)
    fixed = [f"{name} {value:,}" if isinstance(value, int) and not isinstance(value, bool) else f"{name} {value}"
             for name, value in calc.values.items() if name not in calc.fields and name != "model"]
    what = calc.model or calc.values.get("params", "the model")
    count = ""
    if goal.devices_max is not None:
        count = f"at most {goal.devices_max} x " if goal.devices_min is None else \
            f"{goal.devices_min} to {goal.devices_max} x "
    elif goal.devices_min is not None:
        count = f"at least {goal.devices_min} x "
    fixed_text = f" ({', '.join(fixed)})" if fixed else ""
    limits = []
    if goal.tokens_per_step_max is not None:
        limits.append(f"at most {format_count(goal.tokens_per_step_max)} tokens per step")
    if goal.train_tokens is not None and goal.days_max is not None:
        limits.append(f"{format_count(goal.train_tokens)} tokens in at most {format_number(goal.days_max)} days")
    limits_text = f", with {' and '.join(limits)}" if limits else ""
    return f"Make {what}{fixed_text} fit on {count}{device_name}{limits_text}: change {', '.join(calc.fields)}."


def check_goal(calc: Calc, values: dict[str, Any]) -> GoalCheck:
    """Whether `values` (the calculator's current fields; the block's fixed values win over them)
    meet the block's goal. UserError when the values make no sense (the calculator shows that)."""
    from tutor.answers.fit import FitInputs, answer_fit
    from tutor.hardware.memory_budget import given_budget

    goal = calc.goal
    if goal is None:
        raise UserError(f"calc {calc.id} has no goal")
    settings = {**values, **{name: value for name, value in calc.values.items() if name not in calc.fields}}
    if not settings.get("model") and not settings.get("params"):
        raise UserError(f"calc {calc.id}: a goal needs a model or params")
    question = {name: value for name, value in settings.items()
                if name in CALC_FIELDS and CALC_FIELDS[name].fit_attribute is not None}
    question["gpu"] = True
    if settings.get("model"):  # a model wins over a bare count
        question["model"] = settings["model"]
    else:
        question["params"] = settings["params"]
    answer = answer_fit(FitInputs.from_values(question, budget=given_budget(goal.device), searches=False))
    worst = answer.worst.total
    request = answer.request
    capacity, name = int(answer.budget.capacity or 0), answer.budget.name
    devices = request.devices
    figures = {"worst_bytes": worst, "capacity_bytes": capacity, "devices": devices}
    if goal.devices_max is not None and devices > goal.devices_max:
        return GoalCheck(False, f"uses {devices} devices (dp x tp x pp); the goal allows at most {goal.devices_max}",
                         **figures)
    if goal.devices_min is not None and devices < goal.devices_min:
        return GoalCheck(False, f"uses {devices} devices (dp x tp x pp); the goal asks for at least "
                         f"{goal.devices_min}", **figures)
    if worst > capacity:
        return GoalCheck(False, f"does not fit: the most loaded device needs {worst / GiB:,.2f} GiB, "
                         f"{worst / capacity:.2f}x the {capacity / GiB:,.2f} GiB of {name}", **figures)
    fits = f"the most loaded of {devices} devices needs {worst / GiB:,.2f} GiB of {name}'s {capacity / GiB:,.2f} GiB"
    slow = _too_large_or_slow(goal, request, settings.get("model"))
    if slow:
        return GoalCheck(False, f"fits ({fits}), but {slow}", **figures)
    return GoalCheck(True, f"goal met: {fits}", **figures)


def _too_large_or_slow(goal: Goal, request: FitRequest, model: str | None) -> str:
    """Why a layout that fits still misses the goal's global batch or days, or "" when it does not.
    The step is tutor.theory.step_time's, counted on the goal card's ceilings (tutor.bench.ceilings:
    datasheet peaks times published achieved fractions), the answer `tensor-tutor time` gives."""
    if goal.tokens_per_step_max is None and goal.days_max is None:
        return ""
    from tutor.bench.ceilings import compute_dtype, device_ceilings
    from tutor.answers.fit import resolve_fit_model
    from tutor.theory.step_time import training_run, training_step_time

    arch = None
    if request.mode == "train" and model:
        arch = resolve_fit_model(model, None)[0]
    if arch is None:
        raise UserError("a goal on the global batch or the days needs a training calculator with a model")
    ceilings, _words = device_ceilings(goal.device, compute_dtype(request))
    step = training_step_time(arch, request, ceilings)
    if goal.tokens_per_step_max is not None and step.tokens_per_step > goal.tokens_per_step_max:
        return (f"one step takes {format_count(step.tokens_per_step)} tokens (dp {request.dp:,} x micro-batch "
                f"{request.batch:,} x {step.operations.microbatches:,} micro-batch{'es' if step.operations.microbatches != 1 else ''} "
                f"x {request.seq_len:,} tokens), "
                f"above the {format_count(goal.tokens_per_step_max)} a step may take: past the critical batch, "
                "bigger steps stop buying fewer of them")
    if goal.train_tokens is not None and goal.days_max is not None:
        days = training_run(step, tokens=goal.train_tokens).seconds / SECONDS_PER_DAY
        if days > goal.days_max:
            longest = max(step.phases, key=lambda phase: step.phases[phase])
            return (f"the counted step takes {format_duration(step.seconds)}, so {format_count(goal.train_tokens)} tokens "
                    f"take {format_number(days)} days, more than the {format_number(goal.days_max)} allowed; its "
                    f"longest part is {longest.replace('_', ' ')}, {format_duration(step.phases[longest])} of it")
    return ""
