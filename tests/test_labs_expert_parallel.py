"""moe-alltoall: all-to-all bytes counted from real routing decisions against tutor.theory.parallel.

Anchor: under uniform routing, (ep−1)/ep of each rank's k·tokens hidden vectors leave it on dispatch
and come back on combine (expert_parallel_alltoall_bytes); a skewed router sends as much on average
but piles the tokens on one rank.
"""

from __future__ import annotations

import pytest

from tutor.errors import UserError
from tutor.labs import run_probe
from tutor.theory.parallel import expert_parallel_alltoall_bytes


def test_uniform_routing_sends_what_the_formula_says() -> None:
    metrics = run_probe("moe-alltoall", {"tokens": 512, "experts": 16, "top_k": 2, "ep": 4, "hidden": 64,
                                         "steps": 8}).metrics
    assert metrics["theory_alltoall_bytes_per_rank"] == expert_parallel_alltoall_bytes(512, 64, 2, 4)
    # 8 steps x 4 ranks x 1024 pairs, each leaving with probability 3/4: within 2 % of the mean.
    assert metrics["measured_over_theory"] == pytest.approx(1.0, abs=0.02)
    assert metrics["busiest_rank_over_mean"] < 1.1
    assert 0 < metrics["dedup_saving"] < 0.5


def test_one_rank_sends_nothing() -> None:
    metrics = run_probe("moe-alltoall", {"tokens": 32, "experts": 8, "top_k": 2, "ep": 1}).metrics
    assert metrics["alltoall_bytes_per_rank"] == metrics["theory_alltoall_bytes_per_rank"] == 0


def test_a_skewed_router_overloads_one_rank() -> None:
    uniform = run_probe("moe-alltoall", {"tokens": 128, "experts": 16, "top_k": 2, "ep": 4, "steps": 4}).metrics
    skewed = run_probe("moe-alltoall", {"tokens": 128, "experts": 16, "top_k": 2, "ep": 4, "steps": 4,
                                        "skew": 1.5}).metrics
    assert skewed["busiest_rank_over_mean"] > uniform["busiest_rank_over_mean"] + 0.5
    assert skewed["busiest_expert_over_mean"] > 2


def test_ranks_that_do_not_divide_the_experts_are_a_user_error() -> None:
    with pytest.raises(UserError):
        run_probe("moe-alltoall", {"experts": 10, "ep": 4, "top_k": 2})
