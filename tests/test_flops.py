"""tutor.theory.flops against PaLM, Kaplan et al., the Llama 3 paper and verl's golden values."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.theory.flops import (
    hardware_flops_utilization,
    inference_flops_per_token,
    matmul_flops,
    model_flops_utilization,
    training_flops,
    training_flops_for_sequences,
    training_flops_per_token,
)

# PaLM-540B (arXiv 2204.02311): Table 1 and Appendix B.
PALM = dict(params=540_350_000_000, layers=118, heads=48, head_dim=256, seq_len=2048)
PALM_TOKENS_PER_S = 238.3e3
PALM_CHIPS, TPU_V4_PEAK = 6144, 275e12


def test_matmul_flops() -> None:
    assert matmul_flops(1, 1, 1) == 2
    assert matmul_flops(4096, 4096, 4096) == 2 * 4096**3
    with pytest.raises(UserError):
        matmul_flops(0, 4096, 4096)


def test_palm_mfu_without_attention_is_45_7_percent() -> None:
    per_token = training_flops_per_token(**PALM, attention=False)
    assert per_token == 6 * PALM["params"]
    mfu = model_flops_utilization(
        tokens_per_second=PALM_TOKENS_PER_S, flops_per_token=per_token,
        devices=PALM_CHIPS, peak_flops_per_device=TPU_V4_PEAK,
    )
    assert round(mfu * 100, 1) == 45.7


def test_palm_mfu_with_attention_is_46_2_percent() -> None:
    per_token = training_flops_per_token(**PALM)
    assert per_token == 6 * PALM["params"] + 12 * 118 * 48 * 256 * 2048
    mfu = model_flops_utilization(
        tokens_per_second=PALM_TOKENS_PER_S, flops_per_token=per_token,
        devices=PALM_CHIPS, peak_flops_per_device=TPU_V4_PEAK,
    )
    assert round(mfu * 100, 1) == 46.2


def test_hfu_adds_recompute_flops() -> None:
    per_token = training_flops_per_token(**PALM)
    common = dict(tokens_per_second=PALM_TOKENS_PER_S, devices=PALM_CHIPS, peak_flops_per_device=TPU_V4_PEAK)
    mfu = model_flops_utilization(flops_per_token=per_token, **common)
    assert hardware_flops_utilization(flops_per_token=per_token, recompute_flops_per_token=0, **common) == mfu
    # Full recompute reruns the forward pass (2N): HFU = MFU × 8/6 for the weight matmuls.
    six_n = training_flops_per_token(**PALM, attention=False)
    hfu = hardware_flops_utilization(flops_per_token=six_n, recompute_flops_per_token=six_n // 3, **common)
    assert hfu == pytest.approx(model_flops_utilization(flops_per_token=six_n, **common) * 8 / 6)


def test_llama_3_1_405b_training_compute_is_3_8e25() -> None:
    # Llama 3 paper (arXiv 2407.21783): 405B params on 15.6T tokens, "3.8 × 10^25 FLOPs".
    flops = training_flops(params=405_853_388_800, tokens=15_600_000_000_000)
    assert round(flops / 1e25, 1) == 3.8


def test_deepseek_v3_training_compute() -> None:
    # DeepSeek-V3 (arXiv 2412.19437): 37B active params, 14.8T tokens -> 6ND = 3.29e24.
    assert round(training_flops(params=37_000_000_000, tokens=14_800_000_000_000) / 1e24, 2) == 3.29


def test_kaplan_inference_is_a_third_of_training() -> None:
    # Kaplan Table 1: forward 2N + 2·n_layer·n_ctx·d_attn; training ≈ 3× forward.
    n, layers, ctx, d = 124_439_808, 12, 1024, 768
    forward = inference_flops_per_token(params=n, layers=layers, context=ctx, attention_dim=d)
    assert forward == 2 * n + 2 * layers * ctx * d
    assert inference_flops_per_token(params=n, layers=layers, context=0, attention_dim=d) == 2 * n
    six_n = training_flops_per_token(params=n, layers=layers, heads=12, head_dim=64, seq_len=ctx, attention=False)
    assert six_n == 3 * 2 * n


@settings(deadline=None)
@given(d_model=st.integers(64, 16384), layers=st.integers(1, 128), ctx=st.integers(1, 10**6))
def test_kaplan_context_term_ratio(d_model: int, layers: int, ctx: int) -> None:
    # Kaplan §2.1: with N = 12·n_layer·d_model², the context term / 2N = n_ctx / (12·d_model),
    # so attention is negligible while n_ctx << 12·d_model.
    n = 12 * layers * d_model**2
    flops = inference_flops_per_token(params=n, layers=layers, context=ctx, attention_dim=d_model)
    assert (flops - 2 * n) * 12 * d_model == 2 * n * ctx


# volcengine/verl tests/utils/test_flops_counter.py: batches of sequence lengths and the expected
# FLOPs (an exact integer in the source, divided by 1e12 there).
VERL_BATCHES = ([512, 1024, 2048], [4096, 4096, 4096])


def _dense_matmul_params(*, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, head_dim: int,
                         ffn: int) -> int:
    """verl's count: embedding + head (2·V·h) + per layer q, k, v, o and a 3-matrix gated MLP."""
    attention = hidden * (heads * head_dim + 2 * kv_heads * head_dim + heads * head_dim)
    return 2 * vocab * hidden + layers * (attention + 3 * hidden * ffn)


VERL_DENSE = {
    # name: (config, (expected for batch 1, expected for batch 2))
    "llama2-7b": (dict(vocab=32000, hidden=4096, layers=32, heads=32, kv_heads=32, head_dim=128, ffn=11008),
                  (153555818250240, 575955114393600)),
    "qwen2.5-7b": (dict(vocab=152064, hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128, ffn=18944),
                   (170388331954176, 622070178250752)),
    "qwen3-8b": (dict(vocab=151936, hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, ffn=12288),
                 (185867930959872, 692924253732864)),
    "mistral-small-24b": (dict(vocab=131072, hidden=5120, layers=40, heads=32, kv_heads=8, head_dim=128, ffn=32768),
                          (517715357859840, 1836871613153280)),
}


@pytest.mark.parametrize("name", sorted(VERL_DENSE))
def test_verl_golden_dense(name: str) -> None:
    config, expected = VERL_DENSE[name]
    n = _dense_matmul_params(**config)
    for seq_lens, want in zip(VERL_BATCHES, expected, strict=True):
        got = training_flops_for_sequences(
            matmul_params=n, seq_lens=seq_lens, layers=config["layers"],
            attention_dim=config["heads"] * config["head_dim"],
        )
        assert got == want


def test_verl_golden_llama2_in_tflop() -> None:
    n = _dense_matmul_params(**VERL_DENSE["llama2-7b"][0])
    got = [training_flops_for_sequences(matmul_params=n, seq_lens=b, layers=32, attention_dim=4096) / 1e12
           for b in VERL_BATCHES]
    assert [round(x, 2) for x in got] == [153.56, 575.96]


def test_verl_golden_qwen3_30b_a3b_moe() -> None:
    # Active matmul params: top-8 of 128 experts (ffn 768) plus the router h·E.
    h, layers = 2048, 48
    attention = h * (128 * 32 + 128 * 4 * 2 + 128 * 32)
    n = 151936 * h * 2 + layers * (attention + h * 768 * 8 * 3 + h * 128)
    expected = (85087060230144, 365944098521088)
    for seq_lens, want in zip(VERL_BATCHES, expected, strict=True):
        assert training_flops_for_sequences(matmul_params=n, seq_lens=seq_lens, layers=layers,
                                            attention_dim=128 * 32) == want


def test_verl_golden_deepseek_v3_mla() -> None:
    # MLA attention matmuls per layer (verl comment: 187,105,280), 3 dense layers then 58 MoE layers
    # with 8 routed + 1 shared expert of width 2048 and a 256-way router; d_attn = 128 heads × 192.
    h = 7168
    mla = 1536 * h + 128 * 192 * 1536 + h * (512 + 64) + 128 * (128 + 128) * 512 + 128 * 128 * h
    assert mla == 187_105_280
    n = 129280 * h * 2 + 3 * (h * 18432 * 3 + mla) + 58 * (mla + h * 256 + h * 2048 * 9 * 3)
    expected = (906535995703296, 3674028304760832)
    for seq_lens, want in zip(VERL_BATCHES, expected, strict=True):
        assert training_flops_for_sequences(matmul_params=n, seq_lens=seq_lens, layers=61,
                                            attention_dim=128 * 192) == want
    assert [round(w / 1e12, 2) for w in expected] == [906.54, 3674.03]


def test_verl_golden_apertus_two_matrix_mlp() -> None:
    # swiss-ai/Apertus-8B: xIELU MLP has 2 matrices, QK-norm adds 2·h per layer.
    v, h, i, layers = 131072, 4096, 21504, 32
    n = 2 * v * h + layers * (4 * h * h + 2 * h * i + 2 * h)
    for seq_lens, want in zip(VERL_BATCHES, (199154680725504, 732294071451648), strict=True):
        assert training_flops_for_sequences(matmul_params=n, seq_lens=seq_lens, layers=layers,
                                            attention_dim=h) == want


@settings(deadline=None)
@given(
    n=st.integers(1, 10**12), layers=st.integers(1, 128), heads=st.integers(1, 128),
    head_dim=st.sampled_from([64, 96, 128, 256]), seq=st.integers(1, 8192),
)
def test_one_sequence_equals_palm_per_token_times_tokens(n: int, layers: int, heads: int, head_dim: int,
                                                         seq: int) -> None:
    per_token = training_flops_per_token(params=n, layers=layers, heads=heads, head_dim=head_dim, seq_len=seq)
    batch = training_flops_for_sequences(matmul_params=n, seq_lens=[seq], layers=layers,
                                         attention_dim=heads * head_dim)
    assert batch == per_token * seq


@pytest.mark.parametrize(
    "call",
    [
        lambda: training_flops(params=0, tokens=10),
        lambda: training_flops_for_sequences(matmul_params=10, seq_lens=[], layers=1, attention_dim=1),
        lambda: training_flops_for_sequences(matmul_params=10, seq_lens=[0], layers=1, attention_dim=1),
        lambda: model_flops_utilization(tokens_per_second=1.0, flops_per_token=1.0, devices=0,
                                        peak_flops_per_device=1.0),
        lambda: model_flops_utilization(tokens_per_second=-1.0, flops_per_token=1.0, devices=1,
                                        peak_flops_per_device=1.0),
        lambda: model_flops_utilization(tokens_per_second=1.0, flops_per_token=1.0, devices=1,
                                        peak_flops_per_device=float("inf")),
        lambda: training_flops_per_token(params=10, layers=1, heads=1, head_dim=1, seq_len=1.5),
    ],
)
def test_rejects_impossible_input(call) -> None:
    with pytest.raises(UserError) as err:
        call()
    assert "\n" not in str(err.value)
