"""tutor.theory.serving against the papers' definitions: vLLM's TTFT/TPOT, PagedAttention's block
allocation (Kwon et al. 2023), Orca's iteration-level scheduling (Yu et al. 2022) and speculative
decoding's expected tokens and speed-up (Leviathan et al. 2023, Eq. 1 and Theorem 3.8)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.theory import serving


def test_latency_is_the_first_token_plus_one_decode_step_per_later_token() -> None:
    assert serving.request_latency_s(ttft_s=0.2, tpot_s=0.05, output_tokens=11) == pytest.approx(0.7)
    assert serving.request_latency_s(ttft_s=0.2, tpot_s=0.05, output_tokens=1) == pytest.approx(0.2)
    # vLLM's benchmark reads TPOT back as (latency - TTFT) / (output - 1).
    latency = serving.request_latency_s(ttft_s=0.31, tpot_s=0.017, output_tokens=129)
    assert (latency - 0.31) / 128 == pytest.approx(0.017)


def test_user_and_server_rates() -> None:
    assert serving.user_tokens_per_second(0.02) == pytest.approx(50)
    assert serving.server_tokens_per_second(batch=32, step_s=0.025) == pytest.approx(1280)
    with pytest.raises(UserError, match="TPOT must be more than 0"):
        serving.user_tokens_per_second(0)
    with pytest.raises(UserError, match="batch must be a whole number"):
        serving.server_tokens_per_second(batch=0, step_s=1)


def test_contiguous_allocation_reserves_the_maximum_for_every_request() -> None:
    assert serving.contiguous_reserved_tokens([10, 2000, 37], 2048) == 3 * 2048
    with pytest.raises(UserError, match="does not fit a maximum length of 2,048"):
        serving.contiguous_reserved_tokens([4000], 2048)


def test_paging_rounds_each_request_up_to_whole_blocks() -> None:
    # 10 -> 16, 16 -> 16, 17 -> 32 with vLLM's default 16-token blocks.
    assert serving.paged_reserved_tokens([10, 16, 17], 16) == 64
    assert serving.paged_reserved_tokens([1], 1) == 1


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=50), st.integers(1, 64))
def test_paging_wastes_less_than_one_block_per_request(lengths: list[int], block: int) -> None:
    waste = serving.paged_reserved_tokens(lengths, block) - sum(lengths)
    assert 0 <= waste <= len(lengths) * (block - 1)


@pytest.mark.parametrize("block", [1, 2, 16, 32])
def test_the_expected_waste_is_half_a_block_less_half_a_slot(block: int) -> None:
    # Every remainder equally likely: lengths 1..block*1000 cover each remainder 1000 times.
    lengths = list(range(1, block * 1000 + 1))
    mean = (serving.paged_reserved_tokens(lengths, block) - sum(lengths)) / len(lengths)
    assert mean == pytest.approx(serving.expected_block_waste_tokens(block))


def test_a_shared_prefix_is_stored_once_in_whole_blocks() -> None:
    # 100 prompt tokens in 16-token blocks: 6 full blocks (96 tokens) shared, the 7th is not.
    assert serving.prefix_cache_saved_tokens(requests=5, prefix_tokens=100, block_size=16) == 4 * 96
    assert serving.prefix_cache_saved_tokens(requests=1, prefix_tokens=100, block_size=16) == 0
    assert serving.prefix_cache_saved_tokens(requests=8, prefix_tokens=15, block_size=16) == 0


def test_static_batching_waits_for_the_longest_request_of_each_batch() -> None:
    schedule = serving.static_batching_schedule([5, 1, 1, 1, 5, 5], batch=2)
    # batches (5, 1), (1, 1), (5, 5): 5 + 1 + 5 steps
    assert schedule.steps == 11
    assert schedule.finish_steps == [5, 5, 6, 6, 11, 11]
    assert schedule.utilisation == pytest.approx(18 / 22)


def test_continuous_batching_refills_a_slot_as_soon_as_it_frees() -> None:
    schedule = serving.continuous_batching_schedule([5, 1, 1, 1, 5, 5], batch=2)
    # slot A: 5; slot B: 1, 1, 1 (ends 3), then 5 (ends 8); slot A takes the last at 5 -> 10
    assert schedule.finish_steps == [5, 1, 2, 3, 8, 10]
    assert schedule.steps == 10
    assert schedule.mean_finish_step == pytest.approx(29 / 6)


@given(st.lists(st.integers(1, 300), min_size=1, max_size=60), st.integers(1, 16))
def test_continuous_batching_never_takes_more_steps_than_static(lengths: list[int], batch: int) -> None:
    static = serving.static_batching_schedule(lengths, batch)
    continuous = serving.continuous_batching_schedule(lengths, batch)
    assert continuous.steps <= static.steps
    assert sum(continuous.finish_steps) <= sum(static.finish_steps)
    assert continuous.tokens == static.tokens == sum(lengths)
    # no schedule beats the work spread perfectly over the slots, nor the longest request
    assert continuous.steps >= max(max(lengths), -(-sum(lengths) // batch))


@pytest.mark.parametrize(("alpha", "gamma"), [(0.0, 3), (0.5, 1), (0.6, 4), (0.8, 5), (0.9, 7), (1.0, 4)])
def test_expected_tokens_per_step_is_leviathan_equation_one(alpha: float, gamma: int) -> None:
    # Eq. (1) is the sum of a geometric series: 1 + α + ... + α^γ.
    assert serving.speculative_expected_tokens_per_step(alpha, gamma) == pytest.approx(
        sum(alpha ** i for i in range(gamma + 1)))


def test_expected_tokens_per_step_matches_a_simulated_draft() -> None:
    rng = random.Random(0)
    alpha, gamma, runs = 0.7, 4, 200_000
    total = 0
    for _ in range(runs):
        accepted = 0
        while accepted < gamma and rng.random() < alpha:
            accepted += 1
        total += accepted + 1  # the target's own token: the correction or the bonus
    assert total / runs == pytest.approx(serving.speculative_expected_tokens_per_step(alpha, gamma), rel=0.01)


def test_speedup_is_leviathan_theorem_3_8() -> None:
    alpha, gamma, c = 0.8, 3, 0.05
    assert serving.speculative_speedup(alpha, gamma, c) == pytest.approx(
        (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1)))
    # A free draft gives the expected tokens; a draft as slow as the target never pays at α < 1.
    assert serving.speculative_speedup(0.8, 3, 0) == pytest.approx(serving.speculative_expected_tokens_per_step(0.8, 3))
    assert serving.speculative_speedup(0.99, 5, 1.0) < 1


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), True, "0.5"])
def test_an_acceptance_rate_outside_zero_to_one_is_one_clear_error(bad: object) -> None:
    with pytest.raises(UserError, match="acceptance rate must be a number from 0 to 1"):
        serving.speculative_expected_tokens_per_step(bad, 3)  # type: ignore[arg-type]
