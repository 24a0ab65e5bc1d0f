"""A theory call inside a lesson value must end, whatever its arguments.

The allow-list interpreter bounds syntax, arithmetic and steps; the callee's own work is bounded by
its arguments' limits (tutor.theory.checks.bounded_int) and, for anything left, by a deadline the
interpreter checks inside the call. Each case runs in a child interpreter with a guard timeout so a
regression fails here instead of hanging the suite (the guard is not a measured figure).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tutor.errors import UserError
from tutor.lessons.values import evaluate
from tutor.theory import parallel
from tutor.theory.checks import MAX_DIMENSION, MAX_LAYERS

HANG_GUARD_S = 120


def evaluated_in_child(code: str) -> str:
    try:
        result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                                timeout=HANG_GUARD_S, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        pytest.fail(f"a lesson value ran for {HANG_GUARD_S} s")
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize(("expr", "expected"), [
    ("parallel.tensor_parallel_split(10**30 + 1, 3)", f"dimension must be at most {MAX_DIMENSION:,}"),
    ("parallel.layers_per_pipeline_stage(10**12, 10**11)", f"number of layers must be at most {MAX_LAYERS:,}"),
    ("parallel.pipeline_stages(10**12, 10**11, tied_embeddings=True)",
     f"number of layers must be at most {MAX_LAYERS:,}"),
])
def test_a_huge_argument_to_a_theory_call_is_one_clear_line(expr: str, expected: str) -> None:
    output = evaluated_in_child(f"""
        from tutor.errors import UserError
        from tutor.lessons.values import evaluate
        try:
            print(evaluate({expr!r}))
        except UserError as error:
            print(error)
    """)
    assert output == f"{{{{ {expr} }}}}: {expected}, got {eval(expr.split('(', 1)[1].split(',')[0]):,}"


def test_the_bounds_keep_every_real_answer() -> None:
    assert parallel.layers_per_pipeline_stage(MAX_LAYERS, 7)[:2] == [1429, 1429]
    assert sum(parallel.layers_per_pipeline_stage(MAX_LAYERS, MAX_LAYERS)) == MAX_LAYERS
    assert parallel.tensor_parallel_split(MAX_DIMENSION, 8) == MAX_DIMENSION // 8
    with pytest.raises(UserError, match=r"does not divide dimension 2147483647 \(use a divisor of 2147483647 such as 1"):
        parallel.tensor_parallel_split(MAX_DIMENSION - 1, 7)  # 2**31 - 1 is prime: the search ends
    assert evaluate("parallel.tensor_parallel_split(4096, 8)") == 512


def test_a_theory_call_that_runs_past_the_deadline_is_stopped() -> None:
    # A callee whose work no argument bound covers: the interpreter's deadline reaches inside it.
    output = evaluated_in_child("""
        from tutor.errors import UserError
        from tutor.lessons import values
        from tutor.theory import parallel

        def endless(n):
            total = 0
            while True:
                total += n
        endless.__module__ = parallel.__name__
        parallel.endless = endless  # a theory function the namespace offers, as a lesson would find it
        try:
            print(values.evaluate("parallel.endless(3)"))
        except UserError as error:
            print(error)
    """)
    assert output == "{{ parallel.endless(3) }}: took longer than 2 s (lesson values must be quick to compute)"
