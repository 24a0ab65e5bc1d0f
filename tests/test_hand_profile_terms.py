"""The hand profiles' per-layer terms, read off the modelling code (no torch needed):
Qwen3's and OLMo-2's q/k norms, OLMo's weightless LayerNorm, OLMo-2's fp32 weight multiply, MQA's K and V
as views under eager attention, Phi-3's fused gate_up output alive through the MLP in a prefill."""

from __future__ import annotations

from tutor.theory.activations import hf_layer_activation_terms, hf_layer_shape, hf_prefill_moments
from tutor.theory.models import architecture_from_config

SMALL = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=512, head_dim=32)


def terms(model_type: str, backend: str = "flash", **keys) -> dict[str, float]:
    arch = architecture_from_config({"model_type": model_type, **SMALL, **keys})
    kept = hf_layer_activation_terms(hf_layer_shape(arch, moe_layer=False), seq_len=1, batch=1, precision="bf16",
                                     backend=backend, gpu=False)
    return {term.name: float(term.bytes) for term in kept}


def test_qwen3_keeps_its_per_head_q_and_k_norms() -> None:
    kept = terms("qwen3")
    # RMSNorm over each head: an fp32 copy (4 B), 1/rms per head (fp32) and the normalized 16-bit tensor.
    assert kept["q norm fp32 input copy"] == 4 * 4 * 32 and kept["q norm 1/rms (fp32)"] == 4 * 4
    assert kept["k norm fp32 input copy"] == 4 * 2 * 32 and kept["k norm 1/rms (fp32)"] == 4 * 2
    assert kept["q norm normalized, kept for the weight multiply"] == 2 * 4 * 32
    assert not any("q norm" in name for name in terms("llama"))


def test_olmo2_norms_multiply_the_weight_in_fp32() -> None:
    kept = terms("olmo2")
    assert kept["q norm normalized, kept for the weight multiply"] == 4 * 4 * 32  # fp32, whole projection
    assert kept["q norm 1/rms (fp32)"] == 4                                       # one per token
    assert kept["attention norm normalized, kept for the weight multiply"] == 4 * 128
    assert terms("llama")["attention norm normalized, kept for the weight multiply"] == 2 * 128


def test_olmo_layernorm_has_no_weight_to_keep_a_tensor_for() -> None:
    kept = terms("olmo")
    assert kept["attention norm fp32 input copy"] == 4 * 128 and kept["attention norm mean and rstd (fp32)"] == 8
    assert not any("weight multiply" in name for name in kept)


def test_mqa_under_eager_keeps_one_kv_head_and_gqa_the_copies() -> None:
    mqa = terms("llama", backend="eager", num_key_value_heads=1)
    assert mqa["K (one head, expanded as a view)"] == 2 * 32
    gqa = terms("llama", backend="eager", num_key_value_heads=2)
    assert gqa["K (expanded to every query head)"] == 2 * 4 * 32  # repeat_kv's reshape copies


def test_phi3_prefill_keeps_the_fused_gate_up_output_through_the_mlp() -> None:
    def mlp(model_type: str) -> int:
        arch = architecture_from_config({"model_type": model_type, **SMALL})
        return hf_prefill_moments(hf_layer_shape(arch, moe_layer=False), seq_len=64, batch=1, vocab=512,
                                  backend="flash", gpu=False)["MLP"]

    assert mlp("phi3") - mlp("mistral") == 64 * 2 * 256  # one more f-wide 16-bit tensor per token


def test_models_lists_hand_profiles_and_the_calibrated_trace() -> None:
    import json

    from click.testing import CliRunner

    from tutor.commands.models import models
    from tutor.theory.models import SUPPORTED_MODEL_TYPES

    report = json.loads(CliRunner().invoke(models, ["--json"], catch_exceptions=False).output)
    assert report["profiles"]["hand"] == list(SUPPORTED_MODEL_TYPES)
    assert "transformers" in report["profiles"]["calibrated_trace"]
    assert {row["profile"] for row in report["models"]} == {"hand"}
    text = CliRunner().invoke(models, [], env={"COLUMNS": "200"}, catch_exceptions=False).output
    assert "Hand-profiled model types" in text and "Calibrated trace: any other" in text and "[trace]" in text


def test_multi_head_prefill_peaks_at_k_rope_with_q_rotated_held() -> None:
    """With as many KV heads as query heads, RoPE on K (three temporaries of K's size, Q's rotated
    copy held) outgrows RoPE on Q; with GQA (2 of 4 heads) Q's temporaries stay the larger."""
    def attention(model_type: str, kv_heads: int) -> int:
        arch = architecture_from_config({"model_type": model_type, **dict(SMALL, num_key_value_heads=kv_heads)})
        shape = hf_layer_shape(arch, moe_layer=False)
        return hf_prefill_moments(shape, seq_len=64, batch=1, vocab=512, backend="flash", gpu=False)["attention"]

    rope = {"llama": 2, "olmo": 4}  # OLMo keeps cos, sin and the rotated Q and K in fp32
    for model_type, element in rope.items():
        # 4 -> 2 KV heads: 2 heads of K and V projections (16-bit), and the peak moves from K's RoPE
        # (Q rotated + 3 x 4 heads of K's temporaries) to Q's (3 x 4 heads): 32·element·(4 + 12 - 12).
        assert attention(model_type, 4) - attention(model_type, 2) == 64 * (2 * 2 * 32 * 2 + 32 * element * 4)
        # 2 -> 1 KV head: Q's temporaries are the peak in both, only K and V's projections shrink.
        assert attention(model_type, 2) - attention(model_type, 1) == 64 * 32 * 2 * 2
