"""The profile-step lab: torch.profiler over a small training step, operators ranked by self time."""

from __future__ import annotations

import threading

import pytest

from tutor.errors import UserError
from tutor.labs import get_probe
from tutor.labs.profile_step import op_group

pytest.importorskip("torch")

SMALL = {"hidden": 16, "layers": 1, "seq": 8, "batch": 2, "vocab": 32, "steps": 1, "device": "cpu"}


def run(**params):
    return get_probe("profile-step").run({**SMALL, **params}, lambda fraction, message: None, threading.Event())


def test_operators_are_grouped_as_matmul_attention_or_other() -> None:
    assert op_group("aten::mm") == op_group("aten::addmm") == op_group("aten::bmm") == "matmul"
    assert op_group("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert op_group("aten::linear") == "other"  # its own time is dispatch; the multiply is its aten::mm child
    assert op_group("aten::mul") == "other"


@pytest.mark.parametrize("hidden", [16, 32])
def test_the_profilers_matmul_flops_are_six_n_per_token(hidden: int) -> None:
    result = run(hidden=hidden)
    assert result.metrics["matmul_flops_per_step"] == pytest.approx(result.metrics["theory_matmul_flops_per_step"],
                                                                    rel=1e-9)
    assert result.metrics["matmul_flops_per_step"] > 0


def test_shares_add_up_and_the_top_operators_are_ranked_by_self_time() -> None:
    result = run(steps=2, top=5)
    metrics = result.metrics
    assert metrics["matmul_share"] + metrics["attention_share"] + metrics["other_share"] == pytest.approx(1.0)
    assert metrics["matmul_share"] > 0 and metrics["attention_share"] > 0
    operators = result.details["operators"]
    assert [op["self_us"] for op in operators] == sorted((op["self_us"] for op in operators), reverse=True)
    # The share is of every operator's self time, not only of the top rows shown.
    total_us = result.details["self_time_total_ms_per_step"] * 1e3 * 2
    assert metrics["top_op_share"] == pytest.approx(operators[0]["self_us"] / total_us, rel=1e-6)
    assert sum(op["self_us"] for op in operators) <= total_us * (1 + 1e-9)
    assert sum(1 for row in result.rows if row.label[0].isdigit()) == 5
    assert set(metrics) == set(get_probe("profile-step").metrics)


def test_a_hidden_size_the_heads_do_not_divide_is_a_one_line_user_error() -> None:
    with pytest.raises(UserError, match="multiple of 4") as caught:
        run(hidden=18)
    assert "\n" not in str(caught.value)
