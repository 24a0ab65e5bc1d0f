"""tutor.theory.parallel against the ZeRO paper, Megatron-LM, GPipe and nccl-tests."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.theory.parallel import (
    CommVolume,
    ModelStates,
    algorithm_bandwidth,
    allgather_bytes_per_rank,
    allreduce_bytes_per_rank,
    alltoall_bytes_per_rank,
    bus_bandwidth,
    bus_bandwidth_factor,
    data_parallel_comm_bytes,
    embedding_stages,
    expert_parallel_alltoall_bytes,
    experts_per_rank,
    kv_heads_per_rank,
    layers_per_pipeline_stage,
    megatron_bytes_per_param,
    megatron_distributed_optimizer_bytes_per_param,
    padded_vocab_size,
    pipeline_bubble_fraction,
    pipeline_bubble_ratio,
    pipeline_p2p_bytes_per_microbatch,
    pipeline_stages,
    reduce_scatter_bytes_per_rank,
    tensor_parallel_comm_bytes_per_layer,
    tensor_parallel_split,
    zero_model_states,
    zero_stage_for_fsdp,
)
from tutor.theory.units import GB

# ZeRO paper (arXiv 1910.02054) Table 1, per-device model-state memory in GB (1e9), as printed in
# reference/memory-and-models.md §2.3: {params: {N_d: (P_os, P_os+g, P_os+g+p)}}.
ZERO_TABLE_1 = {
    7_500_000_000: {
        1: ("120", "120", "120"),
        4: ("52.5", "41.25", "30"),
        16: ("35.62", "21.56", "7.5"),
        64: ("31.41", "16.64", "1.875"),
        256: ("30.35", "15.41", "0.469"),
        1024: ("30.09", "15.10", "0.117"),
    },
    128_000_000_000: {
        1: ("2048", "2048", "2048"),
        4: ("896", "704", "512"),
        16: ("608", "368", "128"),
        64: ("536", "284", "32"),
        256: ("518", "263", "8"),
        1024: ("513.5", "257.75", "2"),
    },
    1_000_000_000_000: {
        1: ("16000", "16000", "16000"),
        4: ("7000", "5500", "4000"),
        16: ("4750", "2875", "1000"),
        64: ("4187.5", "2218.75", "250"),
        256: ("4046.9", "2054.7", "62.5"),
        1024: ("4011.7", "2013.7", "15.6"),
    },
}
ZERO_CELLS = [
    (params, dp, stage, printed)
    for params, rows in ZERO_TABLE_1.items()
    for dp, cells in rows.items()
    for stage, printed in zip((1, 2, 3), cells, strict=True)
]


def _matches_printed(value_bytes: int, printed: str) -> bool:
    """True when value rounds to the printed GB figure: within half a unit of its last digit."""
    exponent = Decimal(printed).as_tuple().exponent
    half_unit = Fraction(1, 2) * Fraction(10) ** exponent
    return abs(Fraction(value_bytes, GB) - Fraction(printed)) <= half_unit


@pytest.mark.parametrize(("params", "dp", "stage", "printed"), ZERO_CELLS)
def test_zero_table_1_every_cell(params: int, dp: int, stage: int, printed: str) -> None:
    states = zero_model_states(params=params, dp=dp, stage=stage)
    assert _matches_printed(states.total, printed), (states.total / GB, printed)


def test_zero_table_1_has_all_cells() -> None:
    assert len(ZERO_CELLS) == 54  # 18 rows (3 models × 6 N_d) × 3 stages


def test_zero_figure_1_worked_example() -> None:
    # Ψ = 7.5B, N_d = 64: 120 GB -> 31.4 GB -> 16.6 GB -> 1.9 GB (exact 120, 31.406, 16.641, 1.875).
    totals = [zero_model_states(params=7_500_000_000, dp=64, stage=s).total for s in range(4)]
    assert totals == [120 * GB, 31_406_250_000, 16_640_625_000, 1_875_000_000]
    assert [round(t / GB, 1) for t in totals] == [120.0, 31.4, 16.6, 1.9]


def test_zero_bold_cells_fit_a_32gb_v100() -> None:
    # The five cells the paper prints in bold are the configurations that fit in 32 GB.
    bold = [(7_500_000_000, 4, 3), (7_500_000_000, 16, 2), (7_500_000_000, 64, 1),
            (128_000_000_000, 64, 3), (1_000_000_000_000, 1024, 3)]
    for params, dp, stage in bold:
        assert zero_model_states(params=params, dp=dp, stage=stage).total <= 32 * GB


def test_zero_components_per_stage() -> None:
    psi, dp = 1_000, 4
    assert zero_model_states(params=psi, dp=dp, stage=0) == ModelStates(2000, 2000, 12000)
    assert zero_model_states(params=psi, dp=dp, stage=1) == ModelStates(2000, 2000, 3000)
    assert zero_model_states(params=psi, dp=dp, stage=2) == ModelStates(2000, 500, 3000)
    assert zero_model_states(params=psi, dp=dp, stage=3) == ModelStates(500, 500, 3000)


def test_zero_fractional_bytes_round_up() -> None:
    # 8-bit Adam on 7 params over 2 ranks: 7·2/2 = 7 exactly; 0.1 B/param reads as the decimal 0.1.
    assert zero_model_states(params=7, dp=2, stage=1, optimizer_bytes=2).optimizer == 7
    assert zero_model_states(params=10, dp=1, stage=0, optimizer_bytes=0.1).optimizer == 1
    assert zero_model_states(params=3, dp=2, stage=3, weight_bytes=Fraction(1, 2)).weights == 1  # 0.75 -> 1


@settings(deadline=None)
@given(
    params=st.integers(1, 10**13),
    dp=st.integers(1, 4096),
    stage=st.integers(0, 2),
)
def test_zero_each_stage_never_needs_more(params: int, dp: int, stage: int) -> None:
    lower = zero_model_states(params=params, dp=dp, stage=stage + 1).total
    assert lower <= zero_model_states(params=params, dp=dp, stage=stage).total


@settings(deadline=None)
@given(params=st.integers(1, 10**13), dp=st.integers(1, 4096))
def test_zero3_is_baseline_over_dp_rounded_up(params: int, dp: int) -> None:
    states = zero_model_states(params=params, dp=dp, stage=3)
    for component, per_param in ((states.weights, 2), (states.gradients, 2), (states.optimizer, 12)):
        assert component == -(-params * per_param // dp)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(params=0, dp=1, stage=0),
        dict(params=10, dp=0, stage=0),
        dict(params=10, dp=1, stage=4),
        dict(params=10, dp=1, stage=1, optimizer_bytes=-1),
        dict(params=10, dp=1, stage=1, weight_bytes=float("nan")),
        dict(params=10, dp=1, stage=1, grad_bytes="2"),
    ],
)
def test_zero_rejects_impossible_input(kwargs: dict) -> None:
    with pytest.raises(UserError) as err:
        zero_model_states(**kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("name", "stage"),
    [("NO_SHARD", 0), ("SHARD_GRAD_OP", 2), ("FULL_SHARD", 3), ("HYBRID_SHARD", 3),
     ("ShardingStrategy.FULL_SHARD", 3), ("full-shard", 3), ("_HYBRID_SHARD_ZERO2", 2)],
)
def test_fsdp_strategy_to_zero_stage(name: str, stage: int) -> None:
    assert zero_stage_for_fsdp(name) == stage


def test_fsdp_unknown_strategy() -> None:
    with pytest.raises(UserError, match="FULL_SHARD"):
        zero_stage_for_fsdp("SHARD_EVERYTHING")


def test_megatron_bytes_per_param() -> None:
    # theoretical_memory_usage.py: 18 without the distributed optimizer, 6 + 12/dp with it.
    assert megatron_bytes_per_param(dp=8, distributed_optimizer=False) == 18
    assert megatron_distributed_optimizer_bytes_per_param(1) == 18
    assert megatron_distributed_optimizer_bytes_per_param(8) == Fraction(15, 2)
    assert megatron_distributed_optimizer_bytes_per_param(64) == 6 + Fraction(12, 64)


# ---------------------------------------------------------------------------- TP / PP / EP splits

def test_tensor_parallel_split() -> None:
    assert tensor_parallel_split(32, 8, what="attention heads") == 4
    assert tensor_parallel_split(14336, 4) == 3584
    with pytest.raises(UserError, match="does not divide"):
        tensor_parallel_split(28, 8, what="attention heads")  # Qwen2.5-7B: 28 heads


def test_megatron_vocab_padding() -> None:
    # GPT-2's 50257 tokens pad to 50304 (= OLMo's embedding_size for 50280 tokens).
    assert padded_vocab_size(50257, 1) == 50304
    assert padded_vocab_size(50280, 1) == 50304
    assert padded_vocab_size(50257, 8) == 51200  # multiple of 128·8 = 1024
    assert padded_vocab_size(32000, 1) == 32000
    assert padded_vocab_size(128256, 8) == 129024


@settings(deadline=None)
@given(vocab=st.integers(1, 10**6), tp=st.integers(1, 64), multiple=st.sampled_from([1, 64, 128]))
def test_padded_vocab_is_smallest_even_split(vocab: int, tp: int, multiple: int) -> None:
    padded = padded_vocab_size(vocab, tp, multiple)
    assert padded % (multiple * tp) == 0
    assert vocab <= padded < vocab + multiple * tp
    assert tensor_parallel_split(padded, tp) * tp == padded


def test_kv_heads_per_rank() -> None:
    assert kv_heads_per_rank(8, 1) == 8
    assert kv_heads_per_rank(8, 8) == 1
    assert kv_heads_per_rank(8, 16) == 1  # replicated: each rank keeps at least one KV head
    assert kv_heads_per_rank(1, 4) == 1  # MQA
    assert kv_heads_per_rank(4, 2) == 2
    with pytest.raises(UserError):
        kv_heads_per_rank(8, 3)
    with pytest.raises(UserError):
        kv_heads_per_rank(8, 12)


def test_experts_per_rank() -> None:
    assert experts_per_rank(256, 64) == 4  # DeepSeek-V3 on EP64
    assert experts_per_rank(8, 8) == 1
    with pytest.raises(UserError, match="must divide"):
        experts_per_rank(8, 3)


def test_layers_per_pipeline_stage() -> None:
    assert layers_per_pipeline_stage(32, 4) == [8, 8, 8, 8]
    # Not divisible: DeepSpeed partition_uniform gives the remainder to the earliest stages.
    assert layers_per_pipeline_stage(126, 8) == [16, 16, 16, 16, 16, 16, 15, 15]
    assert layers_per_pipeline_stage(5, 5) == [1] * 5
    # Megatron's uneven split: fixed first/last stages, the rest evenly over the middle ones.
    assert layers_per_pipeline_stage(61, 8, first_stage_layers=5, last_stage_layers=8) == [5, 8, 8, 8, 8, 8, 8, 8]
    assert layers_per_pipeline_stage(30, 4, first_stage_layers=6) == [6, 8, 8, 8]
    with pytest.raises(UserError):
        layers_per_pipeline_stage(61, 8, first_stage_layers=4, last_stage_layers=8)
    with pytest.raises(UserError, match="exceeds"):
        layers_per_pipeline_stage(4, 8)


@settings(deadline=None)
@given(layers=st.integers(1, 200), pp=st.integers(1, 64))
def test_pipeline_split_covers_all_layers(layers: int, pp: int) -> None:
    if pp > layers:
        with pytest.raises(UserError):
            layers_per_pipeline_stage(layers, pp)
        return
    split = layers_per_pipeline_stage(layers, pp)
    assert len(split) == pp and sum(split) == layers
    assert max(split) - min(split) <= 1 and split == sorted(split, reverse=True)


def test_embedding_placement() -> None:
    assert embedding_stages(1) == (0, 0)
    assert embedding_stages(4) == (0, 3)
    # Tied embeddings at pp > 1: Megatron keeps a copy on the last stage, so two stages hold one each.
    tied = pipeline_stages(32, 4, tied_embeddings=True)
    assert [s.embedding_matrices for s in tied] == [1, 0, 0, 1]
    assert tied[0].input_embedding and tied[-1].output_head
    assert [s.embedding_matrices for s in pipeline_stages(32, 1, tied_embeddings=True)] == [1]
    assert [s.embedding_matrices for s in pipeline_stages(32, 1, tied_embeddings=False)] == [2]
    assert [s.layers for s in pipeline_stages(32, 4, tied_embeddings=False)] == [8, 8, 8, 8]


# ---------------------------------------------------------------------------- pipeline bubble

def test_pipeline_bubble_anchors() -> None:
    assert pipeline_bubble_fraction(stages=4, microbatches=8) == Fraction(3, 11)
    assert pipeline_bubble_ratio(stages=4, microbatches=8) == Fraction(3, 8)
    # Interleaving v = 2 chunks per device halves the bubble (Narayanan et al. §2.2.2).
    assert pipeline_bubble_ratio(stages=4, microbatches=8, interleave=2) == Fraction(3, 16)
    assert pipeline_bubble_fraction(stages=4, microbatches=8, interleave=2) == Fraction(3, 19)
    assert pipeline_bubble_fraction(stages=1, microbatches=1) == 0


def test_gpipe_bubble_negligible_at_m_4k() -> None:
    # GPipe §2.3: "negligible when M >= 4 x K"; the bubble is then under 20% of the step.
    for k in (2, 4, 8, 16, 64):
        assert pipeline_bubble_fraction(stages=k, microbatches=4 * k) < Fraction(1, 5)


@settings(deadline=None)
@given(p=st.integers(1, 128), m=st.integers(1, 1024), v=st.integers(1, 8))
def test_bubble_fraction_and_ratio_agree(p: int, m: int, v: int) -> None:
    fraction = pipeline_bubble_fraction(stages=p, microbatches=m, interleave=v)
    ratio = pipeline_bubble_ratio(stages=p, microbatches=m, interleave=v)
    assert fraction == ratio / (1 + ratio)  # bubble/total from bubble/ideal
    assert 0 <= fraction < 1


def test_bubble_rejects_zero() -> None:
    with pytest.raises(UserError):
        pipeline_bubble_fraction(stages=4, microbatches=0)


# ---------------------------------------------------------------------------- collectives

def test_nccl_tests_bus_bandwidth_factors() -> None:
    assert bus_bandwidth_factor("all_reduce", 8) == Fraction(7, 4)
    assert bus_bandwidth_factor("allgather", 8) == Fraction(7, 8)
    assert bus_bandwidth_factor("reduce-scatter", 8) == Fraction(7, 8)
    assert bus_bandwidth_factor("alltoall", 4) == Fraction(3, 4)
    assert bus_bandwidth_factor("broadcast", 8) == 1
    assert bus_bandwidth_factor("reduce", 8) == 1
    assert bus_bandwidth_factor("all_reduce", 1) == 0
    with pytest.raises(UserError, match="unknown collective"):
        bus_bandwidth_factor("all_scatter", 8)


def test_algbw_and_busbw() -> None:
    # 1 GB all-reduced in 10 ms on 8 ranks: algbw 100 GB/s, busbw 175 GB/s.
    algbw = algorithm_bandwidth(10**9, 0.01)
    assert algbw == pytest.approx(100e9)
    assert bus_bandwidth("all_reduce", algbw, 8) == pytest.approx(175e9)
    with pytest.raises(UserError):
        algorithm_bandwidth(10**9, 0)


def test_bytes_per_rank() -> None:
    size = 2**30
    assert allreduce_bytes_per_rank(size, 8) == 2 * 7 * size // 8
    assert allgather_bytes_per_rank(size, 8) == 7 * size // 8
    assert reduce_scatter_bytes_per_rank(size, 8) == 7 * size // 8
    assert alltoall_bytes_per_rank(size, 4) == 3 * size // 4
    assert allreduce_bytes_per_rank(size, 1) == 0


@settings(deadline=None)
@given(size=st.integers(1, 10**12), n=st.integers(1, 1024))
def test_allreduce_is_reduce_scatter_plus_all_gather(size: int, n: int) -> None:
    # Ring all-reduce = reduce-scatter + all-gather (nccl-tests derivation); ceil can add one byte.
    total = reduce_scatter_bytes_per_rank(size, n) + allgather_bytes_per_rank(size, n)
    assert total - 1 <= allreduce_bytes_per_rank(size, n) <= total
    assert allreduce_bytes_per_rank(size, n) <= 2 * size


def test_zero_communication_volume() -> None:
    # ZeRO §7: stages 0-2 move 2Ψ, stage 3 moves 3Ψ (1.5×), in the large-n limit.
    psi = 7_500_000_000
    for stage in (0, 1, 2):
        volume = data_parallel_comm_bytes(params=psi, dp=64, stage=stage)
        assert volume.paper_bytes == 2 * psi * 2
        assert volume.bytes_per_rank == 2 * psi * 2 * 63 // 64
    stage3 = data_parallel_comm_bytes(params=psi, dp=64, stage=3)
    assert stage3.paper_bytes == 3 * psi * 2
    stage2 = data_parallel_comm_bytes(params=psi, dp=64, stage=2)
    assert Fraction(stage3.paper_bytes, stage2.paper_bytes) == Fraction(3, 2)
    assert stage3.collectives == ("all_gather", "all_gather", "reduce_scatter")
    assert data_parallel_comm_bytes(params=psi, dp=1, stage=3) == CommVolume(0, 0, stage3.collectives)
    # Stage 0's all-reduce is exactly allreduce_bytes_per_rank of the gradient buffer.
    assert data_parallel_comm_bytes(params=psi, dp=8, stage=0).bytes_per_rank == allreduce_bytes_per_rank(2 * psi, 8)


def test_tensor_parallel_traffic() -> None:
    # Megatron: 4 all-reduces of b·s·h per layer in training, 2 in inference; SP moves the same bytes.
    s, b, h, t = 2048, 1, 4096, 8
    one = allreduce_bytes_per_rank(s * b * h * 2, t)
    assert tensor_parallel_comm_bytes_per_layer(seq_len=s, batch=b, hidden=h, tp=t) == 4 * one
    assert tensor_parallel_comm_bytes_per_layer(seq_len=s, batch=b, hidden=h, tp=t, training=False) == 2 * one
    assert tensor_parallel_comm_bytes_per_layer(seq_len=s, batch=b, hidden=h, tp=t, sequence_parallel=True) == 4 * one
    assert tensor_parallel_comm_bytes_per_layer(seq_len=s, batch=b, hidden=h, tp=1) == 0


def test_pipeline_and_expert_traffic() -> None:
    assert pipeline_p2p_bytes_per_microbatch(2048, 1, 4096, 2) == 2 * 2048 * 4096 * 2
    assert pipeline_p2p_bytes_per_microbatch(2048, 1, 4096, 2, training=False) == 2048 * 4096 * 2
    # 4096 tokens, h 4096, top-2, EP 8: 7/8 of 4096·2·4096·2 B each way.
    assert expert_parallel_alltoall_bytes(4096, 4096, 2, 8, 2) == 2 * 4096 * 2 * 4096 * 2 * 7 // 8
    assert expert_parallel_alltoall_bytes(4096, 4096, 2, 1, 2) == 0
