"""Calculator exercises: does the layout a learner chose meet a ```calc block's goal?

The check is the fit answer (tutor.fit_answer), the same as `tensor-tutor fit`: the most loaded device
(plus the CUDA context and allocator slack `fit` counts) must fit the goal's device, the card's
total as its driver reports it (tutor.hardware.memory_budget.given_budget) or a given size, using
no more than `devices_max` devices (dp x tp x pp) and no fewer than `devices_min`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tutor.errors import UserError
from tutor.lessons.calc_fields import CALC_FIELDS
from tutor.lessons.model import Calc, Goal
from tutor.theory.units import GiB


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
    return f"Make {what}{fixed_text} fit on {count}{device_name}: change {', '.join(calc.fields)}."


def check_goal(calc: Calc, values: dict[str, Any]) -> GoalCheck:
    """Whether `values` (the calculator's current fields; the block's fixed values win over them)
    meet the block's goal. UserError when the values make no sense (the calculator shows that)."""
    from tutor.fit_answer import FitInputs, answer_fit
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
    return GoalCheck(True, f"goal met: the most loaded of {devices} devices needs {worst / GiB:,.2f} GiB of "
                     f"{name}'s {capacity / GiB:,.2f} GiB", **figures)
