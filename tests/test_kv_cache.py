"""KV cache against published figures: the per-token table of the reference (§2.5), vLLM's exact
Mistral-Small allocation (llm-d measurements), DeepSeek-V3's MLA cache and the HF Llama 3.1 blog."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.theory.kv_cache import (
    kv_cache_blocks,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    kv_cache_tokens_that_fit,
    kv_dtype_bytes,
    kv_heads_per_rank,
    mla_kv_cache_bytes_per_token,
)
from tutor.theory.units import GiB


def matches_printed(value: float, printed: str) -> bool:
    """True when `value` rounds to the figure as printed (half a unit in its last digit, inclusive)."""
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return abs(Fraction(value) - Fraction(printed)) <= Fraction(1, 2 * 10**decimals)


# Reference memory-and-models.md §2.5, bf16: layers, kv heads, head_dim, B/token, GiB @4k/32k/128k.
PER_TOKEN_TABLE = [
    ("GPT-2 small", 12, 12, 64, 36_864, "0.14", "1.1", "4.5"),
    ("Llama-2-7B", 32, 32, 128, 524_288, "2.0", "16", "64"),
    ("Llama-2-13B", 40, 40, 128, 819_200, "3.1", "25", "100"),
    ("Llama-2-70B", 80, 8, 128, 327_680, "1.25", "10", "40"),
    ("Llama-3.1-8B", 32, 8, 128, 131_072, "0.5", "4", "16"),
    ("Llama-3.1-405B", 126, 8, 128, 516_096, "1.97", "15.75", "63"),
    ("Mixtral-8x22B", 56, 8, 128, 229_376, "0.88", "7", "28"),
    ("Qwen2.5-7B", 28, 4, 128, 57_344, "0.22", "1.75", "7"),
    ("Gemma-2-9B", 42, 8, 256, 344_064, "1.31", "10.5", "42"),
    ("Phi-3-mini-4k", 32, 32, 96, 393_216, "1.5", "12", "48"),
    ("Mistral-Small-3.2-24B", 40, 8, 128, 163_840, "0.63", "5", "20"),
]


@pytest.mark.parametrize(("model", "layers", "kv", "head_dim", "per_token", "at4k", "at32k", "at128k"), PER_TOKEN_TABLE)
def test_reference_per_token_table(model, layers, kv, head_dim, per_token, at4k, at32k, at128k) -> None:
    assert kv_cache_bytes_per_token(layers=layers, kv_heads=kv, head_dim=head_dim) == per_token
    widths = [2 * kv * head_dim] * layers
    for tokens, printed in ((4096, at4k), (32768, at32k), (131072, at128k)):
        assert matches_printed(kv_cache_bytes(layer_widths=widths, seq_len=tokens) / GiB, printed), (model, tokens)


def test_deepseek_v3_mla_cache() -> None:
    per_token = mla_kv_cache_bytes_per_token(layers=61, kv_lora_rank=512, qk_rope_head_dim=64)
    assert per_token == 70_272
    widths = [512 + 64] * 61
    for tokens, printed in ((4096, "0.27"), (32768, "2.1"), (131072, "8.6")):
        assert matches_printed(kv_cache_bytes(layer_widths=widths, seq_len=tokens) / GiB, printed)


def test_vllm_mistral_small_allocation_is_exact() -> None:
    # llm-d docs/empirical-vllm-memory-results.md: KV 28.20 GiB holding 184,832 tokens, block 128.
    per_token = kv_cache_bytes_per_token(layers=40, kv_heads=8, head_dim=128)
    assert matches_printed(184_832 * per_token / GiB, "28.20")
    assert kv_cache_tokens_that_fit(184_832 * per_token, per_token, 128) == 184_832
    assert kv_cache_tokens_that_fit(184_832 * per_token - 1, per_token, 128) == 184_832 - 128


# HF blog llama31.md, "KV cache" table (GB as printed, which are GiB) for 1k / 16k / 128k tokens.
# The convention that reproduces it: 1k = 1,024 tokens, 16k = 16,000, 128k = 128,000.
BLOG_TOKENS = (1024, 16_000, 128_000)


@pytest.mark.parametrize(
    ("layers", "printed"),
    [(32, ("0.125", "1.95", "15.62")), (80, ("0.313", "4.88", "39.06"))],
)
def test_hf_llama31_blog_8b_and_70b(layers: int, printed: tuple[str, ...]) -> None:
    widths = [2 * 8 * 128] * layers
    for tokens, figure in zip(BLOG_TOKENS, printed):
        assert matches_printed(kv_cache_bytes(layer_widths=widths, seq_len=tokens) / GiB, figure)


def test_hf_llama31_blog_405b_column_is_twice_the_formula() -> None:
    blog = ("0.984", "15.38", "123.05")
    eight_heads = [2 * 8 * 128] * 126  # Meta sku_list.py and the Llama 3 paper: n_kv_heads = 8
    sixteen_heads = [2 * 16 * 128] * 126
    for tokens, figure in zip(BLOG_TOKENS, blog):
        correct = kv_cache_bytes(layer_widths=eight_heads, seq_len=tokens) / GiB
        assert not matches_printed(correct, figure)
        assert matches_printed(2 * correct, figure)
        assert matches_printed(kv_cache_bytes(layer_widths=sixteen_heads, seq_len=tokens) / GiB, figure)


def test_sliding_window_layers_cap_their_length() -> None:
    # Gemma-2-9B: 21 of 42 layers use a 4096-token window.
    width = 2 * 8 * 256
    full = kv_cache_bytes(layer_widths=[width] * 42, seq_len=8192)
    capped = kv_cache_bytes(layer_widths=[width] * 42, seq_len=8192, sliding_window=4096, sliding_layers=21)
    assert capped == 2 * (21 * 4096 + 21 * 8192) * width
    assert full - capped == 2 * 21 * 4096 * width
    # Shorter than the window: no effect.
    assert kv_cache_bytes(layer_widths=[width] * 42, seq_len=1000, sliding_window=4096, sliding_layers=21) == \
        kv_cache_bytes(layer_widths=[width] * 42, seq_len=1000)


def test_first_sliding_layers_are_the_windowed_ones() -> None:
    got = kv_cache_bytes(layer_widths=[10, 100], seq_len=50, sliding_window=5, sliding_layers=1, bytes_per_element=1)
    assert got == 10 * 5 + 100 * 50


def test_tensor_parallel_splits_heads_but_keeps_one_per_rank() -> None:
    widths = [2 * 8 * 128] * 80  # Llama-3-70B
    whole = kv_cache_bytes(layer_widths=widths, seq_len=4096)
    assert kv_cache_bytes(layer_widths=widths, seq_len=4096, tp=8, kv_heads=8) == whole // 8
    assert kv_cache_bytes(layer_widths=widths, seq_len=4096, tp=16, kv_heads=8) == whole // 8
    assert kv_heads_per_rank(8, 16) == 1
    # An MLA latent is replicated on every rank.
    mla = [576] * 61
    replicated = kv_cache_bytes(layer_widths=mla, seq_len=4096, tp=8, kv_heads=1)
    assert replicated == kv_cache_bytes(layer_widths=mla, seq_len=4096)


@settings(max_examples=200, deadline=None)
@given(
    layers=st.integers(1, 128), kv=st.sampled_from([1, 2, 4, 8, 16, 32]), head_dim=st.sampled_from([64, 96, 128, 256]),
    seq=st.integers(1, 200_000), batch=st.integers(1, 64), dtype=st.sampled_from(["bf16", "fp8", "fp32"]),
)
def test_total_is_per_token_times_tokens(layers, kv, head_dim, seq, batch, dtype) -> None:
    size = kv_dtype_bytes(dtype)
    per_token = kv_cache_bytes_per_token(layers=layers, kv_heads=kv, head_dim=head_dim, bytes_per_element=size)
    total = kv_cache_bytes(layer_widths=[2 * kv * head_dim] * layers, seq_len=seq, batch=batch, bytes_per_element=size)
    assert total == per_token * seq * batch


def test_fp8_halves_bf16() -> None:
    assert kv_dtype_bytes("fp8") * 2 == kv_dtype_bytes("bf16") == kv_dtype_bytes("float16") == 2
    assert kv_dtype_bytes("FP8_E4M3") == 1


def test_paged_blocks_round_up() -> None:
    assert kv_cache_blocks(15_049, 128) == 118  # llm-d measurement
    assert kv_cache_blocks(16) == 1 and kv_cache_blocks(17) == 2
    assert kv_cache_tokens_that_fit(0, 131_072) == 0


@pytest.mark.parametrize(
    "call",
    [
        lambda: kv_cache_bytes_per_token(layers=0, kv_heads=8, head_dim=128),
        lambda: kv_cache_bytes_per_token(layers=32, kv_heads=-8, head_dim=128),
        lambda: kv_cache_bytes(layer_widths=[], seq_len=10),
        lambda: kv_cache_bytes(layer_widths=[256, 0], seq_len=10),
        lambda: kv_cache_bytes(layer_widths=[256], seq_len=10, sliding_layers=1),
        lambda: kv_cache_bytes(layer_widths=[256], seq_len=10, sliding_window=4, sliding_layers=2),
        lambda: kv_cache_bytes(layer_widths=[256], seq_len=10, tp=2),
        lambda: kv_cache_bytes(layer_widths=[256], seq_len=10, tp=3, kv_heads=8),
        lambda: kv_dtype_bytes("int3"),
        lambda: kv_cache_tokens_that_fit(-1, 10),
        lambda: mla_kv_cache_bytes_per_token(layers=61, kv_lora_rank=0, qk_rope_head_dim=64),
    ],
)
def test_bad_input_is_one_line_user_error(call) -> None:
    with pytest.raises(UserError) as caught:
        call()
    assert "\n" not in str(caught.value)


def test_unknown_dtype_lists_the_choices() -> None:
    with pytest.raises(UserError, match="bf16"):
        kv_dtype_bytes("int3")
