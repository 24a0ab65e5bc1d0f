"""tutor.theory.moe against Switch Transformers, GShard/DeepSpeed-MoE and exact enumeration."""

from __future__ import annotations

import itertools
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.theory.moe import (
    CapacityOutcome,
    expected_distinct_experts_touched,
    expert_capacity,
    experts_active_fraction,
    load_balancing_loss,
    tokens_dropped,
)


def test_active_fraction() -> None:
    assert experts_active_fraction(2, 8) == Fraction(1, 4)  # Mixtral-8x7B
    assert experts_active_fraction(8, 256) == Fraction(1, 32)  # DeepSeek-V3
    assert experts_active_fraction(1, 128) == Fraction(1, 128)  # Switch top-1
    with pytest.raises(UserError, match="exceeds"):
        experts_active_fraction(9, 8)


def test_distinct_experts_batch_1_vs_large_batch() -> None:
    # One token touches exactly its k experts; a large batch touches nearly all of them.
    assert expected_distinct_experts_touched(1, 2, 8) == pytest.approx(2)
    assert expected_distinct_experts_touched(0, 2, 8) == 0
    assert expected_distinct_experts_touched(8, 2, 8) == pytest.approx(8 * (1 - 0.75**8))
    assert expected_distinct_experts_touched(64, 8, 256) == pytest.approx(256 * (1 - (248 / 256) ** 64))
    assert expected_distinct_experts_touched(4096, 8, 256) > 255.99


@pytest.mark.parametrize(("tokens", "k", "experts"), [(1, 1, 3), (2, 2, 4), (3, 1, 4), (3, 2, 5)])
def test_distinct_experts_matches_exhaustive_enumeration(tokens: int, k: int, experts: int) -> None:
    # Each token takes a uniformly random k-subset: average the union size over every outcome.
    subsets = list(itertools.combinations(range(experts), k))
    outcomes = list(itertools.product(subsets, repeat=tokens))
    exact = Fraction(sum(len(set().union(*choice)) for choice in outcomes), len(outcomes))
    assert expected_distinct_experts_touched(tokens, k, experts) == pytest.approx(float(exact), rel=1e-12)


@settings(deadline=None)
@given(tokens=st.integers(1, 10_000), experts=st.integers(1, 512), data=st.data())
def test_distinct_experts_bounds(tokens: int, experts: int, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, experts))
    touched = expected_distinct_experts_touched(tokens, k, experts)
    assert k - 1e-9 <= touched <= experts + 1e-9
    assert touched <= min(experts, tokens * k) + 1e-9
    assert expected_distinct_experts_touched(tokens + 1, k, experts) >= touched - 1e-9


def test_load_balancing_loss_uniform_is_alpha() -> None:
    # Switch eq. 4: α·N·Σ f_i·P_i is minimised at uniform routing, where it equals α.
    n = 8
    uniform = [1 / n] * n
    assert load_balancing_loss(uniform, uniform, n) == pytest.approx(1.0)
    assert load_balancing_loss(uniform, uniform, n, alpha=0.01) == pytest.approx(0.01)


def test_load_balancing_loss_skewed() -> None:
    # Everything routed to expert 0 with full confidence: N·1·1 = N, the maximum.
    n = 4
    assert load_balancing_loss([1, 0, 0, 0], [1, 0, 0, 0], n) == pytest.approx(4.0)
    # Half the tokens on expert 0 with router mass 0.5 there, the rest spread evenly.
    f = [0.5, 1 / 6, 1 / 6, 1 / 6]
    assert load_balancing_loss(f, f, n) == pytest.approx(4 * (0.25 + 3 / 36))
    # Top-2 dispatch counted per token (f sums to 2): the uniform value is k.
    assert load_balancing_loss([0.5] * 4, [0.25] * 4, n) == pytest.approx(2.0)


@settings(deadline=None)
@given(st.lists(st.floats(0.001, 1.0), min_size=1, max_size=64))
def test_load_balancing_loss_at_least_one_when_f_equals_p(weights: list[float]) -> None:
    total = sum(weights)
    p = [w / total for w in weights]
    p[-1] = max(0.0, 1.0 - sum(p[:-1]))
    assert load_balancing_loss(p, p, len(p)) >= 1.0 - 1e-9  # N·Σ p_i² >= 1 (Cauchy–Schwarz)


@pytest.mark.parametrize(
    ("f", "p", "n"),
    [([0.5, 0.5], [0.5, 0.5], 3), ([0.5, 0.5], [0.7, 0.7], 2), ([1.5, 0.0], [0.5, 0.5], 2), ([0.5], [1.0], 0)],
)
def test_load_balancing_loss_rejects_bad_input(f: list[float], p: list[float], n: int) -> None:
    with pytest.raises(UserError) as err:
        load_balancing_loss(f, p, n)
    assert "\n" not in str(err.value)


def test_expert_capacity() -> None:
    # Switch eq. 3: 6 tokens over 3 experts -> 2 slots at capacity factor 1.0, 3 at 1.5.
    assert expert_capacity(6, 3, capacity_factor=1.0) == 2
    assert expert_capacity(6, 3, capacity_factor=1.5) == 3
    # GShard / DeepSpeed top-2: k·T/E·cf, rounded up.
    assert expert_capacity(4096, 8, top_k=2, capacity_factor=1.25) == 1280
    assert expert_capacity(10, 4, capacity_factor=1.0) == 3  # 2.5 -> 3
    with pytest.raises(UserError, match="capacity factor"):
        expert_capacity(10, 4, capacity_factor=0)


@settings(deadline=None)
@given(tokens=st.integers(1, 10**6), experts=st.integers(1, 256), cf=st.floats(1.0, 4.0))
def test_capacity_at_least_the_fair_share(tokens: int, experts: int, cf: float) -> None:
    capacity = expert_capacity(tokens, experts, capacity_factor=cf)
    assert capacity * experts >= tokens  # with cf >= 1, perfectly balanced routing drops nothing
    assert tokens_dropped([tokens // experts] * experts, capacity).dropped == 0


def test_tokens_dropped() -> None:
    # 6 tokens, 3 experts, capacity 2; routing (3, 2, 1) drops one token.
    outcome = tokens_dropped([3, 2, 1], 2)
    assert outcome == CapacityOutcome(capacity=2, processed=5, dropped=1)
    assert outcome.drop_fraction == pytest.approx(1 / 6)
    assert tokens_dropped([3, 2, 1], 3).dropped == 0
    with pytest.raises(UserError):
        tokens_dropped([], 2)
    with pytest.raises(UserError):
        tokens_dropped([1, -1], 2)


def test_one_token_touches_exactly_its_k_experts() -> None:
    from tutor.theory.moe import expected_distinct_experts_touched

    assert expected_distinct_experts_touched(1, 1, 5) == 1.0
    assert expected_distinct_experts_touched(1, 8, 256) == 8.0
    # Past the exact range the float form agrees with the exact one.
    assert expected_distinct_experts_touched(5000, 2, 1000) == pytest.approx(1000 * (1 - (998 / 1000) ** 5000))
