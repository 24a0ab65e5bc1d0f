"""The fit check composes the theory modules into per-device memory; these tests pin it to
published figures (ZeRO Table 1, Korthikanti Figure 1, vLLM's measured weights and KV cache)."""

from __future__ import annotations

import dataclasses

import pytest

from tutor.errors import UserError
from tutor.theory import fit as fitting
from tutor.theory.activations import input_ids_bytes, logits_bytes
from tutor.files.models import list_presets, resolve_model
from tutor.theory.models import architecture_from_config, count_parameters
from tutor.theory.units import GB, GiB

PRESETS = [info.name for info in list_presets()]


def arch(name: str):
    return resolve_model(name)[0]


def gpt_config(*, hidden: int, heads: int, layers: int, vocab: int = 51200, positions: int = 2048) -> dict:
    """A GPT block as in Korthikanti et al.: LayerNorm, 4h GeLU MLP, dropout 0.1, learned positions."""
    return {"model_type": "gpt2", "n_embd": hidden, "n_head": heads, "n_layer": layers, "vocab_size": vocab,
            "n_positions": positions, "resid_pdrop": 0.1, "attn_pdrop": 0.1, "embd_pdrop": 0.1}


@pytest.mark.parametrize("name", PRESETS)
def test_one_device_holds_exactly_the_counted_parameters(name: str) -> None:
    model = arch(name)
    estimate = fitting.estimate(model, fitting.FitRequest())
    assert estimate.worst.params == count_parameters(model).total


@pytest.mark.parametrize("name", ["llama-3.1-8b", "gemma-2-9b", "mixtral-8x7b", "deepseek-v3", "gpt2"])
def test_pipeline_stages_partition_the_layers_and_place_the_embeddings(name: str) -> None:
    model = arch(name)
    counts = count_parameters(model)
    estimate = fitting.estimate(model, fitting.FitRequest(pp=4))
    assert sum(stage.layers for stage in estimate.stages) == model.num_layers
    # Tied embeddings with pp > 1: the last stage keeps its own copy (Megatron).
    extra = counts.embedding if model.tie_word_embeddings else 0
    assert sum(stage.params for stage in estimate.stages) == counts.total + extra


@pytest.mark.parametrize(
    ("stage", "published_gb"),
    [(1, 31.4), (2, 16.6), (3, 1.875)],
)
def test_zero_paper_figure_1_through_the_fit_check(stage: int, published_gb: float) -> None:
    """ZeRO (arXiv 1910.02054) Figure 1: 7.5B parameters on 64 GPUs, 16 B/param mixed-precision Adam."""
    request = fitting.FitRequest(mode="train", dp=64, zero=stage, gpu=False)
    worst = fitting.estimate_from_count(7_500_000_000, request).worst
    states = worst.component("weights") + worst.component("gradients") + worst.component("optimizer")
    assert states / GB == pytest.approx(published_gb, abs=0.05)


def test_zero_baseline_is_16_bytes_per_parameter() -> None:
    worst = fitting.estimate_from_count(7_500_000_000, fitting.FitRequest(mode="train", gpu=False)).worst
    assert worst.total == 120 * GB


def _korthikanti_22b(**changes) -> int:
    """Activation bytes of the 22B GPT of Korthikanti Figure 1 (t = 8, b = 4, s = 2048), layers only."""
    model = architecture_from_config(gpt_config(hidden=6144, heads=64, layers=48), "22B")
    request = fitting.FitRequest(mode="train", batch=4, seq_len=2048, tp=8, attention="eager", impl="fused", gpu=False,
                                 **changes)
    activations = fitting.estimate(model, request).worst.component("activations")
    outside_layers = input_ids_bytes(2048, 4) + logits_bytes(seq_len=2048, batch=4, vocab=model.vocab_size, tp=8)
    return activations - outside_layers


def test_korthikanti_figure_1_no_recompute() -> None:
    assert _korthikanti_22b() == 59.25 * GiB


def test_korthikanti_figure_1_sequence_parallel_and_selective_recompute() -> None:
    assert _korthikanti_22b(sequence_parallel=True, recompute="selective") == 9.5625 * GiB


def test_vllm_measured_weights_llama_3_8b() -> None:
    """vLLM PR #10511: Meta-Llama-3-8B weights 14.96 GiB on an H100."""
    worst = fitting.estimate(arch("llama-3-8b"), fitting.FitRequest()).worst
    assert round(worst.component("weights") / GiB, 2) == 14.96


def test_fp8_checkpoint_keeps_embeddings_16_bit_like_the_measured_one() -> None:
    """Llama-3.3-70B-FP8: vLLM measured 67.72 GiB of weights (llm-d empirical results)."""
    worst = fitting.estimate(arch("llama-3.3-70b"), fitting.FitRequest(dtype="fp8")).worst
    assert worst.component("weights") / GiB == pytest.approx(67.72, rel=1e-3)


def test_kv_cache_matches_vllm_for_mistral_small() -> None:
    """llm-d: Mistral-Small-3.2-24B, 28.20 GiB of KV cache for 184,832 tokens (163,840 B/token)."""
    worst = fitting.estimate(arch("mistral-small-24b"), fitting.FitRequest(seq_len=184_832)).worst
    assert worst.component("kv_cache") == 184_832 * 163_840
    assert round(worst.component("kv_cache") / GiB, 2) == 28.20


def test_fp8_kv_cache_halves_it_and_tp_splits_heads() -> None:
    model = arch("llama-3.1-8b")
    base = fitting.estimate(model, fitting.FitRequest()).worst.component("kv_cache")
    assert fitting.estimate(model, fitting.FitRequest(kv_dtype="fp8")).worst.component("kv_cache") * 2 == base
    assert fitting.estimate(model, fitting.FitRequest(tp=8)).worst.component("kv_cache") * 8 == base
    # 16 ranks for 8 KV heads: each rank still keeps a whole head.
    assert fitting.estimate(model, fitting.FitRequest(tp=16)).worst.component("kv_cache") * 8 == base


def test_mla_caches_the_latent() -> None:
    """DeepSeek-V3 caches 70,272 B per token (61 layers x (512 + 64) x 2 B)."""
    worst = fitting.estimate(arch("deepseek-v3"), fitting.FitRequest(seq_len=1000)).worst
    assert worst.component("kv_cache") == 70_272 * 1000


def test_expert_parallelism_divides_the_experts() -> None:
    model = arch("mixtral-8x7b")
    one = fitting.estimate(model, fitting.FitRequest(mode="train", dp=8)).worst
    eight = fitting.estimate(model, fitting.FitRequest(mode="train", dp=8, ep=8)).worst
    counts = count_parameters(model)
    routed = counts.expert * model.num_experts * model.moe_layers
    assert one.params - eight.params == routed - routed // 8


def test_lora_trainable_count_matches_peft() -> None:
    """huggingface/peft MetaMathQA results: Llama-3.2-3B, LoRA r=32 on q,v: 9,175,040 trainable."""
    request = fitting.FitRequest(mode="train", recipe="lora", lora_rank=32, lora_targets=("q", "v"))
    assert fitting.estimate(arch("llama-3.2-3b"), request).trainable_params == 9_175_040


def test_qlora_base_is_about_a_quarter_of_lora_base() -> None:
    model = arch("llama-3.1-8b")
    lora = fitting.estimate(model, fitting.FitRequest(mode="train", recipe="lora")).worst
    qlora = fitting.estimate(model, fitting.FitRequest(mode="train", recipe="qlora")).worst
    assert qlora.component("weights") < 0.4 * lora.component("weights")
    assert qlora.component("gradients") == lora.component("gradients")


def test_recompute_and_sequence_parallel_reduce_activations() -> None:
    model = arch("llama-3.1-8b")
    values = [fitting.estimate(model, fitting.FitRequest(mode="train", tp=2, attention="eager", **kw))
              .worst.component("activations")
              for kw in ({}, {"sequence_parallel": True}, {"recompute": "selective", "sequence_parallel": True},
                         {"recompute": "full", "sequence_parallel": True})]
    assert values == sorted(values, reverse=True) and len(set(values)) == 4


def test_selective_recompute_saves_nothing_with_flash_attention() -> None:
    """Flash attention already avoids storing the s^2 tensors that selective recompute drops."""
    model = arch("llama-3.1-8b")
    none, selective = (fitting.estimate(model, fitting.FitRequest(mode="train", recompute=mode)).worst
                       .component("activations") for mode in ("none", "selective"))
    assert none == selective


def test_cpu_device_has_no_cuda_context() -> None:
    model = arch("gpt2")
    gpu = fitting.estimate(model, fitting.FitRequest()).worst.component("overhead")
    cpu = fitting.estimate(model, fitting.FitRequest(gpu=False)).worst.component("overhead")
    assert gpu - cpu == 1343 * 2**20


@pytest.mark.parametrize("name", ["llama-3.1-8b", "mixtral-8x7b", "gemma-2-2b"])
def test_largest_batch_and_context_are_the_boundary(name: str) -> None:
    model = arch(name)
    request = fitting.FitRequest()
    capacity = 120 * GiB
    batch = fitting.largest_batch(model, request, capacity)
    assert fitting.estimate(model, dataclasses.replace(request, batch=batch)).worst.total <= capacity
    assert fitting.estimate(model, dataclasses.replace(request, batch=batch + 1)).worst.total > capacity
    seq = fitting.largest_seq_len(model, request, capacity)
    assert fitting.estimate(model, dataclasses.replace(request, seq_len=seq)).worst.total <= capacity
    assert fitting.estimate(model, dataclasses.replace(request, seq_len=seq + 1)).worst.total > capacity


def test_largest_batch_is_zero_when_nothing_fits() -> None:
    assert fitting.largest_batch(arch("llama-3.1-70b"), fitting.FitRequest(), 10 * GiB) == 0


@pytest.mark.parametrize(("name", "mode"), [("llama-3.3-70b", "train"), ("deepseek-v3", "inference"),
                                            ("llama-3.1-8b", "train")])
def test_every_suggestion_fits(name: str, mode: str) -> None:
    model = arch(name)
    request = fitting.FitRequest(mode=mode)
    capacity = 80 * GB
    found = fitting.suggestions(model, request, capacity)
    assert found, "a model this size fits 80 GB cards with some layout"
    for suggestion in found:
        assert fitting.estimate(model, suggestion.request).worst.total == suggestion.total <= capacity


@pytest.mark.parametrize(
    "changes",
    [{"mode": "fine-tune"}, {"batch": 0}, {"seq_len": -1}, {"zero": 4}, {"tp": 3}, {"pp": 1000},
     {"recompute": "some"}, {"attention": "sdpa2"}, {"dtype": "fp7"}, {"kv_dtype": "fp4x"}, {"optimizer": "adamx"},
     {"recipe": "magic"}, {"ep": 2}, {"lora_rank": 0}],
)
def test_impossible_requests_are_user_errors(changes: dict) -> None:
    with pytest.raises(UserError):
        fitting.estimate(arch("llama-3.1-8b"), fitting.FitRequest(**changes))


def test_ep_must_divide_experts_and_dp() -> None:
    with pytest.raises(UserError, match="divide"):
        fitting.estimate(arch("mixtral-8x7b"), fitting.FitRequest(ep=3, dp=3))
    with pytest.raises(UserError, match="dp"):
        fitting.estimate(arch("mixtral-8x7b"), fitting.FitRequest(ep=8, dp=4))


def test_adapting_attention_only_is_suggested_when_it_is_what_fits() -> None:
    model = arch("qwen3-30b-a3b")
    request = fitting.FitRequest(mode="train", recipe="qlora")
    attention_only = fitting.estimate(model, dataclasses.replace(request, lora_targets=("q", "k", "v", "o")))
    found = fitting.suggestions(model, request, attention_only.worst.total)
    assert any(s.changes == (fitting.Change("lora_targets", ("q", "k", "v", "o")),) for s in found)


QWEN_14B_CONFIG = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 5120,
                   "intermediate_size": 13824, "num_attention_heads": 40, "num_key_value_heads": 8,
                   "num_hidden_layers": 48, "vocab_size": 152064, "tie_word_embeddings": False}


def test_both_8_bit_and_4_bit_weights_are_offered_when_both_fit() -> None:
    """A 14B model in bf16 (about 30 GB) on a 24 GB card: fp8 weights fit, and so does int4, the format
    consumer cards run such models in; both are offered, each a different trade of quality for memory."""
    model = architecture_from_config(QWEN_14B_CONFIG)
    found = fitting.suggestions(model, fitting.FitRequest(), 24 * GB)
    formats = [dict((c.field, c.value) for c in s.changes).get("dtype") for s in found if len(s.changes) == 1]
    assert "fp8" in formats and "int4" in formats


def test_a_shorter_context_is_offered_with_4_bit_weights_only_where_4_bit_alone_does_not_fit() -> None:
    model = arch("gemma-2-27b")
    request = fitting.FitRequest(seq_len=4096)
    alone = fitting.estimate(model, dataclasses.replace(request, dtype="int4")).worst.total
    shorter = fitting.estimate(model, dataclasses.replace(request, dtype="int4", seq_len=2048)).worst.total
    assert shorter < alone
    between = (shorter + alone) // 2
    found = fitting.suggestions(model, request, between)
    assert any(s.changes == (fitting.Change("dtype", "int4"), fitting.Change("seq_len", 2048)) for s in found)
    # With room for int4 at the full context, the shorter context is only a worse choice: not offered.
    roomy = fitting.suggestions(model, request, alone)
    assert any(s.changes == (fitting.Change("dtype", "int4"),) for s in roomy)
    assert not any({c.field for c in s.changes} == {"dtype", "seq_len"} for s in roomy)


@pytest.mark.parametrize(("name", "request_", "capacity"), [
    ("llama-3.1-70b", fitting.FitRequest(mode="train", batch=4), 24 * GiB),
    ("mixtral-8x7b", fitting.FitRequest(mode="train", dp=8, ep=8), 24 * GiB),
    ("llama-3.1-70b", fitting.FitRequest(batch=8, seq_len=32768), 80 * GiB),
])
def test_a_suggestion_is_its_changes_applied_one_per_kind(name: str, request_: fitting.FitRequest,
                                                          capacity: int) -> None:
    found = fitting.suggestions(arch(name), request_, capacity)
    assert found
    for suggestion in found:
        changed = dataclasses.replace(request_, **{c.field: c.value for c in suggestion.changes})
        assert suggestion.request == changed and suggestion.devices == changed.devices
        assert {kind.split(":")[0] for kind in suggestion.kind} == {c.field for c in suggestion.changes}
        assert suggestion.changes_layout == bool(suggestion.kind & {"dp", "tp", "pp"})
    assert len({s.kind for s in found}) == len(found)


def test_cpu_adam_temporaries_take_the_largest_parameter_the_model_has() -> None:
    """A DeepSeek-V3 config that names 256 experts but makes every layer dense (first_k_dense_replace at its
    layer count) has no (E, 2f, h) expert tensor: single-tensor AdamW's two temporaries are of its largest real
    parameter, the embedding here."""
    config = {"model_type": "deepseek_v3", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1024, "q_lora_rank": 64,
              "kv_lora_rank": 32, "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
              "n_routed_experts": 256, "num_experts_per_tok": 8, "n_shared_experts": 1, "moe_intermediate_size": 2048,
              "first_k_dense_replace": 2, "n_group": 8, "topk_group": 4}
    arch = architecture_from_config(config)
    assert not arch.is_moe
    request = fitting.FitRequest(mode="train", batch=1, seq_len=64, recipe="bf16", optimizer="adamw", gpu=False)
    temporaries, why = fitting._optimizer_temporaries(arch, request, fitting._StageParams(0, 0, 0, 0))
    assert f"({1024 * 256:,} elements)" in why
