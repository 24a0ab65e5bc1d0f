"""exercise: judge a learner's answer to a lesson's ```exercise block (tutor.labs.exercise_checks).

The worker runs it like any lab, so a loop the learner wrote runs beside torch in the worker
process and Escape stops it; `tensor-tutor lab exercise check=NAME answer=...` runs it headless.
"""

from __future__ import annotations

import threading

from tutor.labs import ProbeResult, ProgressFn
from tutor.labs._params import Param, make_probe
from tutor.labs.exercise_checks import CHECKS, Verdict, run_check


def _exercise(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    check = CHECKS[params["check"]]
    if cancel.is_set():
        return ProbeResult(probe="exercise", rows=(), metrics={}, summary="cancelled before the check ran",
                           cancelled=True, device="cpu")
    progress(0.0, "loading torch" if check.needs_torch else f"checking: {check.title}")
    verdict = run_check(check.name, params["answer"])
    progress(1.0, "done")
    return ProbeResult(probe="exercise", rows=(), metrics={"passed": 1.0 if verdict.passed else 0.0},
                       summary=verdict.message, device="cpu",
                       details={"check": check.name, "passed": verdict.passed, "findings": list(verdict.details)})


def render_verdict(result: ProbeResult):
    """The check's findings, one per line (the summary says passed or why not)."""
    from rich.text import Text

    findings = result.details.get("findings") or []
    return Text("\n".join(f"· {line}" for line in findings), style="dim") if findings else None


def verdict_of(result: ProbeResult) -> Verdict:
    """A result read back as the check's verdict."""
    return Verdict(bool(result.details.get("passed")), result.summary, tuple(result.details.get("findings") or ()))


EXERCISE = make_probe(
    name="exercise", title="Check an exercise",
    description="Runs a lesson exercise's check on an answer: a schedule, a placement, a layout, or Python code "
                "(a function or a training loop) run on this machine.",
    needs_torch=False,
    params=(Param("check", "str", "expert-placement", "which exercise", choices=tuple(CHECKS)),
            Param("answer", "text", "0,1;2,3;4,5;6,7",
                  "the answer: text, or Python code for the code exercises")),
    metrics=("passed",), body=_exercise, render=render_verdict)
