"""moe-routing: a random top-k router against tutor.theory.moe.

Anchors: uniform routing touches E·(1 − (1 − k/E)^T) experts on average; the Switch Transformer
auxiliary loss (arXiv 2101.03961 eq. 4, f summing to k) equals k under uniform routing; Mixtral's
top-2 of 8 uses a quarter of its experts per token.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.labs import run_probe


def test_uniform_router_matches_the_expected_distinct_experts() -> None:
    metrics = run_probe("moe-routing", {"tokens": 4, "experts": 8, "top_k": 2, "trials": 3000}).metrics
    theory = metrics["distinct_experts_theory"]
    assert theory == pytest.approx(8 * (1 - 0.75**4))
    # The count per batch varies with a standard deviation below 1 expert: 3000 batches put the
    # mean within 0.1 of the expectation with overwhelming probability (> 5 standard errors).
    assert abs(metrics["distinct_experts_mean"] - theory) < 0.1
    assert metrics["active_fraction"] == 0.25  # Mixtral 8x7B: top-2 of 8


def test_uniform_router_keeps_the_balance_loss_at_k_and_skew_raises_it() -> None:
    uniform = run_probe("moe-routing", {"tokens": 16, "trials": 500}).metrics
    skewed = run_probe("moe-routing", {"tokens": 16, "trials": 500, "skew": 2.0}).metrics
    assert uniform["load_balancing_loss_uniform"] == 2.0
    assert uniform["load_balancing_loss"] == pytest.approx(2.0, abs=0.02)
    assert skewed["load_balancing_loss"] > uniform["load_balancing_loss"] + 0.1
    assert skewed["max_load_over_mean"] > uniform["max_load_over_mean"]
    assert skewed["distinct_experts_mean"] < uniform["distinct_experts_mean"]
    assert skewed["drop_fraction"] > uniform["drop_fraction"]


@settings(max_examples=25, deadline=None)
@given(experts=st.integers(1, 16), data=st.data(), seed=st.integers(0, 1000))
def test_one_token_always_touches_exactly_k_experts(experts: int, data, seed: int) -> None:
    top_k = data.draw(st.integers(1, experts))
    metrics = run_probe("moe-routing", {"tokens": 1, "experts": experts, "top_k": top_k, "trials": 20,
                                        "seed": seed}).metrics
    assert metrics["distinct_experts_mean"] == top_k
    assert metrics["distinct_experts_theory"] == pytest.approx(top_k, rel=1e-12)


def test_the_same_seed_routes_the_same_way() -> None:
    first = run_probe("moe-routing", {"skew": 1.0, "seed": 7}).metrics
    again = run_probe("moe-routing", {"skew": 1.0, "seed": 7}).metrics
    assert first == again
    assert math.isfinite(first["load_balancing_loss"])


def test_top_k_above_the_experts_is_a_user_error() -> None:
    with pytest.raises(UserError, match="top_k 9 exceeds the 8 experts"):
        run_probe("moe-routing", {"top_k": 9})
    with pytest.raises(UserError, match="lower trials or tokens"):
        run_probe("moe-routing", {"tokens": 100_000, "trials": 1000})
