"""count_parameters against the real transformers model built from the same config (random weights, CPU).

The configs are what transformers itself writes (`AutoConfig.for_model(...).to_dict()`), so defaults
such as Qwen2-MoE's `sliding_window: 0` with `use_sliding_window: false` go through our parser too.
"""

from __future__ import annotations

import pytest

from tutor.theory.models import architecture_from_config, count_parameters

import torch
transformers = pytest.importorskip("transformers")

SMALL = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=256, max_position_embeddings=256)
CONFIGS = {
    "llama": SMALL,
    "qwen2": SMALL,
    "mistral": SMALL,
    "gemma": {**SMALL, "head_dim": 32},
    "gemma2": {**SMALL, "head_dim": 32},
    "gpt2": dict(n_embd=64, n_layer=3, n_head=4, n_positions=256, vocab_size=256),
    "mixtral": {**SMALL, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3": {**SMALL, "head_dim": 32},
    # transformers 5.24 writes Qwen3-MoE's expert count as num_local_experts (its to_dict, read back here).
    "qwen3_moe": {**SMALL, "head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "phi3": {**SMALL, "pad_token_id": 0},
    "olmo": SMALL,
    "olmo2": SMALL,
    "qwen2_moe": {**SMALL, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                  "shared_expert_intermediate_size": 48},
    "deepseek_v3": {**SMALL, "num_key_value_heads": 4, "n_routed_experts": 8, "num_experts_per_tok": 2,
                    "n_group": 2, "topk_group": 1, "first_k_dense_replace": 1, "moe_intermediate_size": 32,
                    "n_shared_experts": 1, "q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 16,
                    "qk_rope_head_dim": 8, "v_head_dim": 16},
}


def build(model_type: str):
    torch.set_num_threads(1)
    config = transformers.AutoConfig.for_model(model_type, **CONFIGS[model_type])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return config.to_dict(), model


def test_every_hand_profiled_type_is_checked_here() -> None:
    from tutor.theory.models import SUPPORTED_MODEL_TYPES

    assert set(CONFIGS) == set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_count_matches_the_transformers_model(model_type: str) -> None:
    config, model = build(model_type)
    counts = count_parameters(architecture_from_config(config, model_type))
    assert counts.total == sum(p.numel() for p in model.parameters())
    # A checkpoint also stores persistent buffers (DeepSeek-V3's e_score_correction_bias); rotary
    # inv_freq is not persistent in transformers 5.x, so it is in neither figure.
    stored = model.state_dict()
    persistent = sum(buffer.numel() for name, buffer in model.named_buffers() if name in stored)
    assert counts.checkpoint_tensors - counts.total == counts.buffers == persistent


def test_deepseek_v3_correction_bias_is_a_buffer_per_moe_layer() -> None:
    config, model = build("deepseek_v3")
    counts = count_parameters(architecture_from_config(config))
    biases = [b for name, b in model.named_buffers() if name.endswith("e_score_correction_bias")]
    assert len(biases) == 2 and counts.buffers == sum(b.numel() for b in biases) == 2 * 8
    assert not any(name.endswith("e_score_correction_bias") for name, _ in model.named_parameters())


def test_qwen2_moe_config_as_transformers_writes_it_is_accepted() -> None:
    config = transformers.AutoConfig.for_model("qwen2_moe").to_dict()
    assert (config["sliding_window"], config["use_sliding_window"]) == (0, False)
    arch = architecture_from_config(config)
    assert arch.sliding_window is None and arch.sliding_window_layers == 0
