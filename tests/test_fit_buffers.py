"""fit's `buffers` component against the buffers real transformers models hold: every tensor registered as a
buffer, persistent or not, in the dtype the model keeps it (rotary inv_freq fp32 in a bf16 model, a causal-mask
table bool), alive at every moment of the step, so part of the peak."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tutor.theory import fit as fitting
from tutor.theory.models import architecture_from_config

import torch

transformers = pytest.importorskip("transformers")

from tutor.trace import arch_calibration  # noqa: E402

SMALL = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=256, max_position_embeddings=256)
HAND = {
    "llama": SMALL,
    "qwen3": {**SMALL, "head_dim": 32},
    "gemma": {**SMALL, "head_dim": 32},
    "gemma2": {**SMALL, "head_dim": 32},
    "gpt2": dict(n_embd=64, n_layer=3, n_head=4, n_positions=256, vocab_size=256),
    "phi3": {**SMALL, "pad_token_id": 0},
    "mixtral": {**SMALL, "num_local_experts": 4, "num_experts_per_tok": 2},
    "deepseek_v3": {**SMALL, "num_key_value_heads": 4, "n_routed_experts": 8, "num_experts_per_tok": 2,
                    "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "moe_intermediate_size": 32,
                    "n_shared_experts": 1, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
                    "qk_rope_head_dim": 8, "v_head_dim": 16},
}
# Phi-3's own RoPE rotates a share of each head (Phi-4-mini: 0.75); a Llama with a non-default rope type too.
PARTIAL = {
    "phi3": {**SMALL, "pad_token_id": 0, "partial_rotary_factor": 0.5},
    "llama": {**SMALL, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0,
                                           "partial_rotary_factor": 0.5}},
}


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    return tmp_path


def real_model(model_type: str, keys: dict, dtype=torch.bfloat16):
    """The model as from_pretrained(dtype=...) builds it (parameters in dtype, buffers as their code makes them)."""
    torch.set_num_threads(1)
    config = transformers.AutoConfig.for_model(model_type, **keys)
    return config.to_dict(), transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)


def held_bytes(model) -> int:
    """Bytes of every buffer the model holds, each storage once."""
    storages = {b.untyped_storage().data_ptr(): b.untyped_storage().nbytes() for b in model.buffers()}
    return sum(storages.values())


def buffers_of(arch, **request) -> int:
    return fitting.estimate(arch, fitting.FitRequest(**request)).worst.component("buffers")


@pytest.mark.parametrize("model_type", sorted(HAND))
def test_hand_profile_buffers_are_the_real_models(model_type: str) -> None:
    config, model = real_model(model_type, HAND[model_type])
    arch = architecture_from_config(config)
    assert buffers_of(arch, mode="inference", dtype="bf16") == held_bytes(model)
    assert buffers_of(arch, mode="train", recipe="bf16") == held_bytes(model)


@pytest.mark.parametrize("model_type", sorted(PARTIAL))
def test_a_partial_rotary_embedding_keeps_fewer_frequencies(model_type: str) -> None:
    config, model = real_model(model_type, PARTIAL[model_type])
    arch = architecture_from_config(config)
    assert arch.partial_rotary_factor == 0.5
    assert buffers_of(arch, mode="inference") == held_bytes(model) < buffers_of(replace(arch, partial_rotary_factor=1))


def test_a_buffer_in_the_model_dtype_follows_it() -> None:
    # Gemma's embed_scale is made in the model's dtype: 4 B in an fp32 model, 2 B in a bf16 one.
    config, fp32 = real_model("gemma", HAND["gemma"], dtype=torch.float32)
    arch = architecture_from_config(config)
    assert buffers_of(arch, mode="train", recipe="fp32") == held_bytes(fp32)
    assert buffers_of(arch, mode="train", recipe="fp32") - buffers_of(arch, mode="train", recipe="bf16") == 2


NEO = dict(hidden_size=64, num_layers=4, num_heads=4, vocab_size=256, max_position_embeddings=512,
           attention_types=[[["global", "local"], 2]], window_size=32, intermediate_size=128)


def test_calibrated_buffers_are_read_off_the_meta_build() -> None:
    # GPT-Neo keeps a (1, 1, max_positions, max_positions) bool causal-mask table per layer, non-persistent.
    config, model = real_model("gpt_neo", NEO)
    arch = arch_calibration.measured_architecture(config)
    assert arch.profile == "calibrated-trace"
    assert buffers_of(arch, mode="inference") == held_bytes(model) >= 4 * 512 * 512
    component = next(c for c in fitting.estimate(arch, fitting.FitRequest()).worst.components if c.name == "buffers")
    assert "4 layers x attn.attention.bias [1 x 1 x 512 x 512 bool, non-persistent]" in component.formula
    # Split with the layers over pipeline stages; tensor parallelism replicates them.
    stages = fitting.estimate(arch, fitting.FitRequest(pp=2)).stages
    assert [s.component("buffers") for s in stages] == [2 * 512 * 512] * 2
    assert buffers_of(arch, mode="inference", tp=2) == held_bytes(model)


def test_calibrated_model_dtype_buffers_follow_the_run() -> None:
    keys = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, head_dim=32, pad_token_id=0)
    config, bf16 = real_model("gemma3_text", keys)
    _, fp32 = real_model("gemma3_text", keys, dtype=torch.float32)
    arch = arch_calibration.measured_architecture(config)
    assert buffers_of(arch, mode="inference") == held_bytes(bf16)
    assert buffers_of(arch, mode="train", recipe="fp32") == held_bytes(fp32) > held_bytes(bf16)


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_the_peak_holds_the_buffers(mode: str) -> None:
    config, _ = real_model("gpt_neo", NEO)
    arch = arch_calibration.measured_architecture(config)
    worst = fitting.estimate(arch, fitting.FitRequest(mode=mode, seq_len=64)).worst
    assert worst.peak.per_category["buffers"] == worst.component("buffers") > 0
    assert worst.peak.bytes == sum(worst.peak.per_category.values())


def test_the_measured_prefill_peak_holds_what_fit_counts() -> None:
    from tutor.trace.memory_trace import measure_prefill, token_ids

    config, model = real_model("gpt_neo", NEO)
    measured = measure_prefill(model, token_ids(256, 1, 16, seed=0))
    arch = arch_calibration.measured_architecture(config)
    peak = fitting.estimate(arch, fitting.FitRequest(seq_len=16, gpu=False)).worst.peak
    assert measured.peak.per_category_bytes["buffers"] == peak.per_category["buffers"]
