"""What an exercise check returns (Verdict) and how the registry names one (Check): shared by the
checks' modules (tutor.labs.exercise_checks, exercise_functions, exercise_torch) and the exercise lab."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    """What a check found: `passed`, one line for the learner, and the figures behind it."""

    passed: bool
    message: str
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    run: Callable[[str], Verdict]
    needs_torch: bool = False
