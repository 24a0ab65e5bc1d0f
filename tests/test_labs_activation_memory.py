"""activation-memory: bytes autograd really saves in a torch block, against tutor.theory.activations.

Tolerance: exact. For each block the test states, by hand, what PyTorch keeps beyond the
theory (norm statistics, RMSNorm and SwiGLU written out, GQA copies, SDPA's fp32 math fallback);
measured bytes must equal theory + those, to the byte. A GPT block must also reproduce
Korthikanti et al. (arXiv 2205.05198) Table 2, sbh(34 + 5as/h), plus only the LayerNorm statistics.
"""

from __future__ import annotations

import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tutor.labs import run_probe
from tutor.theory.activations import activation_bytes_per_layer_gpt

S, B, H, A = 32, 2, 64, 4


def _run(**params) -> dict[str, float]:
    result = run_probe("activation-memory", {"seq": S, "batch": B, "hidden": H, "heads": A, **params})
    assert not result.cancelled
    return result.metrics


@pytest.mark.parametrize(("dtype", "value_bytes"), [("bf16", 2), ("fp32", 4)])
def test_gpt_block_measures_korthikanti_table_2_plus_layernorm_statistics(dtype: str, value_bytes: int) -> None:
    metrics = _run(style="gpt", dtype=dtype)
    # Two LayerNorms, each keeping a mean and a 1/std per token (CPU: in the activation dtype).
    layernorm_stats = 2 * 2 * S * B * value_bytes
    table_2 = activation_bytes_per_layer_gpt(seq_len=S, batch=B, hidden=H, heads=A)
    if value_bytes == 2:  # Table 2 assumes 16-bit activations
        assert metrics["theory_bytes"] == table_2
        assert metrics["measured_bytes"] == table_2 + layernorm_stats
    assert metrics["measured_bytes"] == metrics["theory_bytes"] + layernorm_stats
    assert metrics["unexplained_bytes"] == 0
    assert metrics["measured_bytes"] / metrics["theory_bytes"] < 1.01


def test_llama_block_differs_from_theory_by_rmsnorm_and_unfused_swiglu_only() -> None:
    metrics = _run(style="llama", dtype="bf16")
    ffn = 176  # 8h/3 rounded up to a multiple of 16
    rmsnorm = 2 * (S * B * H * 2 + S * B * 2)  # per norm: x*rsqrt(...) and the 1/rms statistic
    silu_gate = S * B * ffn * 2
    assert metrics["measured_bytes"] == metrics["theory_bytes"] + rmsnorm + silu_gate
    assert metrics["explained_bytes"] == rmsnorm + silu_gate
    assert metrics["unexplained_bytes"] == 0


def test_sdpa_on_cpu_runs_the_flash_kernel_and_matches_the_flash_theory() -> None:
    result = run_probe("activation-memory", {"style": "llama", "attention": "sdpa", "dtype": "fp32",
                                             "seq": S, "batch": B, "hidden": H, "heads": A})
    eager = _run(style="llama", attention="eager", dtype="fp32")
    flash = result.metrics
    assert "SDPA flash kernel" in result.rows[-1].note
    assert flash["unexplained_bytes"] == 0
    # Flash keeps no s x s scores: the saving is exactly the softmax output, a*s*s*b values.
    softmax_bytes = A * S * S * B * 4
    logsumexp_bytes = A * S * B * 4
    assert eager["measured_bytes"] - flash["measured_bytes"] == softmax_bytes - logsumexp_bytes


def test_sdpa_with_dropout_falls_back_to_math_and_the_fp32_upcast_is_itemised() -> None:
    result = run_probe("activation-memory", {"style": "gpt", "attention": "sdpa", "dtype": "bf16",
                                             "seq": S, "batch": B, "hidden": H, "heads": A})
    assert "math fallback" in result.rows[-1].note
    assert result.metrics["unexplained_bytes"] == 0
    attention_row = next(row for row in result.rows if row.label.startswith("attention:"))
    assert "fp32" in attention_row.note and "float tensor" in attention_row.note


def test_eager_gqa_copies_k_and_v_to_every_head() -> None:
    mha = _run(style="llama", dtype="fp32")
    gqa = _run(style="llama", dtype="fp32", kv_heads=2)
    # Theory: K and V shrink by half; torch's eager repeat_kv keeps full-size copies anyway.
    assert mha["theory_bytes"] - gqa["theory_bytes"] == 2 * (S * B * H // 2) * 4
    assert gqa["measured_bytes"] == mha["measured_bytes"]
    assert gqa["unexplained_bytes"] == 0


def test_layers_scale_linearly() -> None:
    one = _run(style="gpt", layers=1)
    three = _run(style="gpt", layers=3)
    assert three["measured_bytes"] == 3 * one["measured_bytes"]
    assert three["theory_bytes"] == 3 * one["theory_bytes"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(style=st.sampled_from(["gpt", "llama"]), attention=st.sampled_from(["eager", "sdpa"]),
       heads=st.sampled_from([1, 2, 4, 8]), head_dim=st.sampled_from([8, 16, 24]), seq=st.integers(1, 40),
       batch=st.integers(1, 3), dtype=st.sampled_from(["fp32", "bf16", "fp16"]), group=st.sampled_from([1, 2, 4]),
       dropout=st.sampled_from([None, 0.0, 0.2]), layers=st.integers(1, 2))
@pytest.mark.slow
def test_every_saved_byte_is_theory_or_an_itemised_pytorch_extra(style, attention, heads, head_dim, seq, batch,
                                                                 dtype, group, dropout, layers) -> None:
    kv_heads = heads // group if heads % group == 0 else heads
    result = run_probe("activation-memory", {"style": style, "attention": attention, "heads": heads,
                                             "kv_heads": kv_heads, "dropout": dropout, "layers": layers,
                                             "hidden": heads * head_dim, "seq": seq, "batch": batch, "dtype": dtype})
    metrics = result.metrics
    assert metrics["unexplained_bytes"] == 0
    assert metrics["measured_bytes"] >= metrics["theory_bytes"]
    assert sum(row.measured for row in result.rows[:-1]) == metrics["measured_bytes"]


def test_shapes_that_do_not_divide_are_user_errors() -> None:
    from tutor.errors import UserError

    with pytest.raises(UserError, match="heads"):
        run_probe("activation-memory", {"hidden": 65, "heads": 4})
    with pytest.raises(UserError, match="kv_heads"):
        run_probe("activation-memory", {"heads": 4, "kv_heads": 3})
    with pytest.raises(UserError, match="the lab allows"):
        run_probe("activation-memory", {"hidden": 4096, "heads": 32, "seq": 4096, "batch": 8})


@pytest.mark.gpu
def test_on_a_gpu_sdpa_runs_a_fused_kernel_that_keeps_no_s_squared_tensors() -> None:
    params = {"style": "llama", "dtype": "bf16", "seq": 256, "batch": 2, "hidden": 256, "heads": 4, "device": "cuda"}
    fused = run_probe("activation-memory", {**params, "attention": "sdpa"})
    eager = run_probe("activation-memory", {**params, "attention": "eager"})
    assert "math fallback" not in fused.rows[-1].note
    softmax_bytes = 4 * 256 * 256 * 2 * 2
    assert eager.metrics["measured_bytes"] - fused.metrics["measured_bytes"] >= softmax_bytes * 0.9
