"""Architectures from config.json, exact parameter counts against published figures, presets, safetensors headers.

Published figures and their sources live in tutor/presets/index.json (and are repeated in the
comments below); the reference is /work/shared/reference/memory-and-models.md §3.
"""

from __future__ import annotations

import copy
import json
import re
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.files.models import (
    list_presets,
    load_config,
    load_preset,
    read_safetensors_header,
    resolve_model,
    safetensors_summary,
)
from tutor.theory.models import (
    SUPPORTED_MODEL_TYPES,
    Architecture,
    architecture_from_config,
    count_parameters,
    matmul_parameters,
    parameters_per_layer,
)
from tutor.theory.safetensors_header import MAX_HEADER_BYTES

PRESETS = {info.name: info for info in list_presets()}


def preset_config(name: str) -> dict:
    return load_preset(name)[0]


def arch_of(name: str, **changes: object) -> Architecture:
    config = preset_config(name)
    for key, value in changes.items():
        if value is _DELETE:
            config.pop(key, None)
        else:
            config[key] = value
    return architecture_from_config(config, name)


_DELETE = object()


def total_of(name: str, **changes: object) -> int:
    return count_parameters(arch_of(name, **changes)).total


# ---------------------------------------------------------------------------------------------
# Every preset against its published count


def test_at_least_thirty_presets_with_lowercase_hyphenated_names() -> None:
    assert len(PRESETS) >= 30
    for name in PRESETS:
        assert re.fullmatch(r"[a-z0-9][a-z0-9.\-]*", name), name


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_reproduces_its_published_total(name: str) -> None:
    info = PRESETS[name]
    counts = count_parameters(arch_of(name))
    assert info.total is not None or info.stored_elements is not None, f"{name} has no published figure"
    if info.total is not None:
        if info.total.exact:  # exact published counts (keras-hub preset metadata, Hub safetensors.total, ...)
            # Published totals sum checkpoint tensors; they differ from parameters only by persistent
            # buffers (DeepSeek-V3's correction biases), which `checkpoint_tensors` adds.
            assert counts.checkpoint_tensors == info.total.value, info.total.source
        else:  # a rounded figure such as "7.61B": within one unit of its last digit
            assert abs(counts.total - info.total.value) < info.total.resolution, info.total.source


@pytest.mark.parametrize("name", sorted(n for n, i in PRESETS.items() if i.active is not None))
def test_moe_preset_reproduces_its_published_active_count(name: str) -> None:
    info = PRESETS[name]
    counts = count_parameters(arch_of(name))
    assert info.active is not None
    if info.active.exact:
        assert counts.active == info.active.value, info.active.source
    else:
        assert abs(counts.active - info.active.value) < info.active.resolution, info.active.source
    assert counts.active < counts.total


@pytest.mark.parametrize("name", sorted(n for n, i in PRESETS.items() if i.non_embedding is not None))
def test_preset_reproduces_its_published_non_embedding_count(name: str) -> None:
    # Qwen model cards: "Number of Parameters (Non-Embedding)", e.g. Qwen2.5-7B 6.53B, Qwen3-8B 6.95B.
    info = PRESETS[name]
    assert info.non_embedding is not None
    counts = count_parameters(arch_of(name))
    assert abs(counts.non_embedding - info.non_embedding.value) < info.non_embedding.resolution


@pytest.mark.parametrize("name", ["llama-2-7b", "llama-2-13b", "llama-2-70b"])
def test_llama2_hub_element_count_is_parameters_plus_rotary_buffers(name: str) -> None:
    # Hub safetensors.total of meta-llama/Llama-2-*-hf stores rotary_emb.inv_freq (head_dim/2 floats)
    # in every layer: 7B 6,738,417,664; 13B 13,015,866,880; 70B 68,976,653,312 (reference §3.1).
    arch = arch_of(name)
    stored = PRESETS[name].stored_elements
    assert stored is not None and stored.exact
    assert count_parameters(arch).total + arch.num_layers * arch.head_dim // 2 == stored.value


def test_exact_counts_from_the_reference_table() -> None:
    # memory-and-models.md §3.1/§3.2, each reproduced to the parameter.
    expected = {
        "gpt2": 124_439_808, "gpt2-medium": 354_823_168, "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200,
        "llama-2-7b": 6_738_415_616, "llama-2-13b": 13_015_864_320, "llama-2-70b": 68_976_648_192,
        "llama-3-8b": 8_030_261_248, "llama-3.1-70b": 70_553_706_496, "llama-3.1-405b": 405_853_388_800,
        "llama-3.2-1b": 1_235_814_400, "llama-3.2-3b": 3_212_749_824, "mistral-7b": 7_241_732_096,
        "qwen2.5-7b": 7_615_616_512, "qwen2.5-72b": 72_706_203_648, "qwen2.5-1.5b": 1_543_714_304,
        "gemma-2-2b": 2_614_341_888, "gemma-2-9b": 9_241_705_984, "gemma-2-27b": 27_227_128_320,
        "phi-3-mini-4k": 3_821_079_552, "olmo-7b": 6_888_095_744, "olmo-2-7b": 7_298_617_344,
        "olmo-2-13b": 13_716_198_400, "mixtral-8x7b": 46_702_792_704, "mixtral-8x22b": 140_620_634_112,
    }
    assert {name: total_of(name) for name in expected} == expected
    # DeepSeek-V3's 671,026,419,200 counts checkpoint tensors: parameters plus the 58 x 256 noaux_tc
    # correction biases, which transformers 5.x registers as buffers (not in model.parameters()).
    deepseek = count_parameters(arch_of("deepseek-v3"))
    assert deepseek.checkpoint_tensors == 671_026_419_200
    assert (deepseek.total, deepseek.buffers) == (671_026_419_200 - 58 * 256, 58 * 256)


def test_moe_active_counts_from_the_reference_table() -> None:
    # Mixtral-8x7B 12,879,925,248 ("12.9B", Mistral AI); Mixtral-8x22B 39,152,031,744 (HF discussion #6).
    assert count_parameters(arch_of("mixtral-8x7b")).active == 12_879_925_248
    assert count_parameters(arch_of("mixtral-8x22b")).active == 39_152_031_744
    # DeepSeek-V3: 37.55B with both token tables (reference §2.10), paper "37B"; 36.63B without the input table.
    counts = count_parameters(arch_of("deepseek-v3"))
    assert abs(counts.active - 37.55e9) < 0.005e9
    assert abs(counts.active - counts.embedding - 36.63e9) < 0.005e9


# ---------------------------------------------------------------------------------------------
# Quirks, one focused test each


def test_tied_embeddings_llama_3_2_1b() -> None:
    # Untying adds one V x h head: 1,235,814,400 + 128256*2048 = 1,498,482,688, the keras-hub figure
    # that counts a separate head (reference §3.1).
    tied, untied = count_parameters(arch_of("llama-3.2-1b")), count_parameters(arch_of("llama-3.2-1b", tie_word_embeddings=False))
    assert tied.lm_head == 0 and untied.lm_head == 128256 * 2048
    assert untied.total - tied.total == 128256 * 2048
    assert untied.total == 1_498_482_688
    # keras-hub's Llama-3.2-3B with an untied head: 3,606,752,256.
    assert total_of("llama-3.2-3b", tie_word_embeddings=False) == 3_606_752_256


@pytest.mark.parametrize("model_type, tied", [
    ("gpt2", True), ("gemma", True), ("gemma2", True), ("llama", False), ("mistral", False), ("mixtral", False),
    ("qwen2", False), ("qwen2_moe", False), ("qwen3", False), ("qwen3_moe", False), ("phi3", False),
    ("olmo", False), ("olmo2", False), ("deepseek_v3", False),
])
def test_tie_default_when_the_key_is_absent_follows_transformers(model_type: str, tied: bool) -> None:
    base = {"gpt2": "gpt2", "gemma": "gemma-7b", "gemma2": "gemma-2-9b", "llama": "llama-3-8b",
            "mistral": "mistral-7b", "mixtral": "mixtral-8x7b", "qwen2": "qwen2.5-7b",
            "qwen2_moe": "qwen1.5-moe-a2.7b", "qwen3": "qwen3-8b", "qwen3_moe": "qwen3-30b-a3b",
            "phi3": "phi-3-mini-4k", "olmo": "olmo-7b", "olmo2": "olmo-2-7b", "deepseek_v3": "deepseek-v3"}[model_type]
    assert arch_of(base, tie_word_embeddings=_DELETE).tie_word_embeddings is tied


def test_explicit_head_dim_gemma_2_9b() -> None:
    arch = arch_of("gemma-2-9b")
    assert arch.head_dim == 256 != arch.hidden_size // arch.num_heads == 224
    narrower = arch_of("gemma-2-9b", head_dim=224)
    per_layer = 2 * 3584 * 16 * 32 + 2 * 3584 * 8 * 32  # q, o and k, v each lose 32 columns per head
    assert count_parameters(arch).total - count_parameters(narrower).total == 42 * per_layer


def test_head_dim_defaults_gemma_256_and_qwen3_128_when_absent() -> None:
    assert arch_of("gemma-7b", head_dim=_DELETE).head_dim == 256
    assert arch_of("qwen3-8b", head_dim=_DELETE).head_dim == 128
    assert arch_of("mistral-small-24b").head_dim == 128 != 5120 // 32


def test_qkv_bias_qwen2_but_not_qwen3() -> None:
    qwen2 = arch_of("qwen2.5-7b")
    assert qwen2.qkv_bias and not arch_of("qwen3-8b").qkv_bias
    as_llama = arch_of("qwen2.5-7b", model_type="llama")
    assert count_parameters(qwen2).total - count_parameters(as_llama).total == 28 * (3584 + 2 * 512)
    # attention_bias=true in Qwen3 adds q, k, v and o biases.
    assert total_of("qwen3-8b", attention_bias=True) - total_of("qwen3-8b") == 36 * (4096 + 2 * 1024 + 4096)


def test_qk_norm_qwen3_per_head_and_olmo2_over_the_projection() -> None:
    assert arch_of("qwen3-8b").qk_norm and arch_of("olmo-2-7b").qk_norm and not arch_of("llama-3-8b").qk_norm
    assert total_of("qwen3-8b") - total_of("qwen3-8b", model_type="llama") == 36 * 2 * 128
    assert total_of("olmo-2-7b") - total_of("olmo-2-7b", model_type="llama") == 32 * (4096 + 4096)


def test_four_norms_per_layer_gemma2() -> None:
    assert arch_of("gemma-2-2b").norms_per_layer == 4
    assert total_of("gemma-2-2b") - total_of("gemma-2-2b", model_type="gemma") == 26 * 2 * 2304


def test_gpt2_learned_positions_layernorm_biases_dropout() -> None:
    arch = arch_of("gpt2")
    counts = count_parameters(arch)
    assert arch.learned_positions == 1024 and counts.position_embedding == 1024 * 768
    assert arch.norm == "layernorm" and not arch.gated_mlp and arch.dropout
    assert counts.norms == 12 * 2 * 2 * 768 + 2 * 768
    assert not arch_of("llama-3-8b").dropout


def test_fused_projections_phi3_count_like_separate_matrices() -> None:
    assert total_of("phi-3-mini-4k") == total_of("phi-3-mini-4k", model_type="mistral")


def test_olmo_v1_nonparametric_layernorm_and_padded_vocab() -> None:
    arch = arch_of("olmo-7b")
    assert arch.norm == "nonparametric" and count_parameters(arch).norms == 0
    padded = arch_of("olmo-7b", vocab_size=50280, embedding_size=50304)
    assert padded.vocab_size == 50304
    with pytest.raises(UserError, match="embedding_size"):
        arch_of("olmo-7b", vocab_size=50304, embedding_size=50280)


def test_deepseek_v3_mla_shared_experts_dense_layers_mtp() -> None:
    arch = arch_of("deepseek-v3")
    assert arch.uses_mla and arch.is_moe
    assert arch.kv_cache_width_per_layer == 512 + 64
    assert (arch.dense_layers, arch.moe_layers, arch.num_shared_experts) == (3, 58, 1)
    counts = count_parameters(arch)
    # MLA attention per layer incl. the q_a and kv_a norms (reference §3.2; verl's 187,105,280 omits them).
    assert counts.attention_per_layer == 187_107_328
    assert counts.expert == 3 * 7168 * 2048 and counts.shared_experts_per_layer == 3 * 7168 * 2048
    # Router: 256 x 7168 weights; the 256 noaux_tc correction biases per layer are buffers.
    assert counts.router_per_layer == 256 * 7168 and counts.buffers == 58 * 256
    # MTP: one module, "11.5B unique" (README_WEIGHTS.md); not part of the 671B.
    assert abs(counts.mtp - 11.5e9) / 11.5e9 < 0.01
    without_mtp = arch_of("deepseek-v3", num_nextn_predict_layers=0)
    assert count_parameters(without_mtp).total == counts.total and count_parameters(without_mtp).mtp == 0


def test_kv_cache_width_gqa() -> None:
    assert arch_of("llama-3-8b").kv_cache_width_per_layer == 2 * 8 * 128
    assert arch_of("llama-2-7b").kv_cache_width_per_layer == 2 * 32 * 128
    assert arch_of("gemma-2-9b").kv_cache_width_per_layer == 2 * 8 * 256


def test_mixtral_experts_and_router() -> None:
    arch = arch_of("mixtral-8x7b")
    counts = count_parameters(arch)
    assert (arch.num_experts, arch.experts_per_token, arch.moe_layers, arch.dense_layers) == (8, 2, 32, 0)
    assert counts.expert == 3 * 4096 * 14336 and counts.router_per_layer == 4096 * 8
    assert counts.total - counts.active == 32 * 6 * counts.expert


def test_qwen2_moe_shared_expert_and_sparse_step() -> None:
    arch = arch_of("qwen1.5-moe-a2.7b")
    counts = count_parameters(arch)
    assert arch.num_shared_experts == 1 and arch.shared_expert_intermediate_size == 5632
    assert counts.router_per_layer == 2048 * 60 + 2048  # router + sigmoid shared-expert gate
    assert arch_of("qwen1.5-moe-a2.7b", decoder_sparse_step=2).dense_layers == 12
    assert arch_of("qwen1.5-moe-a2.7b", mlp_only_layers=[0, 5]).dense_layers == 2
    assert arch_of("qwen1.5-moe-a2.7b", mlp_only_layers=[0, 5]).layer_is_moe[:6] == (False, True, True, True, True, False)


def test_sliding_window_layers() -> None:
    assert (arch_of("mistral-7b").sliding_window, arch_of("mistral-7b").sliding_window_layers) == (4096, 32)
    assert arch_of("mistral-7b", sliding_window=_DELETE).sliding_window == 4096  # MistralConfig default
    assert arch_of("mistral-small-24b").sliding_window is None
    assert arch_of("gemma-2-9b").sliding_window_layers == 21 and arch_of("gemma-2-2b").sliding_window_layers == 13
    assert arch_of("qwen2.5-7b").sliding_window is None  # use_sliding_window false
    qwen = arch_of("qwen2.5-7b", use_sliding_window=True, max_window_layers=20)
    assert (qwen.sliding_window, qwen.sliding_window_layers) == (131072, 8)
    listed = arch_of("llama-3-8b", model_type="mistral", sliding_window=1024,
                     layer_types=["sliding_attention", "full_attention"] * 16)
    assert listed.sliding_window_layers == 16
    assert listed.layer_uses_sliding_window[:3] == (True, False, True)
    assert arch_of("gemma-2-2b").layer_uses_sliding_window[:3] == (True, False, True)
    assert qwen.layer_uses_sliding_window[19:21] == (False, True)


def test_dense_models_have_active_equal_total() -> None:
    for name in ("llama-3-8b", "gpt2", "gemma-2-9b", "olmo-7b"):
        counts = count_parameters(arch_of(name))
        assert counts.active == counts.total and counts.router == 0
        assert arch_of(name).dense_layers == arch_of(name).num_layers and not arch_of(name).is_moe


def test_parameters_per_layer_adds_up_to_the_total() -> None:
    for name in ("gpt2", "llama-3-8b", "deepseek-v3", "qwen1.5-moe-a2.7b", "olmo-2-7b", "gemma-2-2b"):
        arch = arch_of(name)
        counts = count_parameters(arch)
        layers = parameters_per_layer(arch)
        assert len(layers) == arch.num_layers
        final_norm = 0 if arch.norm == "nonparametric" else arch.hidden_size * (2 if arch.norm == "layernorm" else 1)
        rest = counts.embedding + counts.lm_head + counts.position_embedding + final_norm
        assert rest + sum(layer.total for layer in layers) == counts.total
        assert rest + sum(layer.active for layer in layers) == counts.active


def test_matmul_parameters_convention() -> None:
    # Llama-3-8B: all linear weights incl. the output head, no embedding lookup, norms or biases.
    arch = arch_of("llama-3-8b")
    counts = count_parameters(arch)
    norms = 32 * 2 * 4096 + 4096
    assert matmul_parameters(arch) == counts.total - counts.embedding - norms
    # Tied models still multiply by the V x h table once, for the logits.
    tied = arch_of("llama-3.2-1b")
    assert matmul_parameters(tied) == count_parameters(tied).total - (16 * 2 * 2048 + 2048)
    # MoE: only the routed top-k experts take part.
    mixtral = arch_of("mixtral-8x7b")
    assert matmul_parameters(mixtral) == count_parameters(mixtral).active - 32000 * 4096 - (32 * 2 * 4096 + 4096)


# ---------------------------------------------------------------------------------------------
# Bad configs: always one clear UserError


@pytest.mark.parametrize("changes, key", [
    ({"hidden_size": 0}, "hidden_size"),
    ({"hidden_size": -4096}, "hidden_size"),
    ({"hidden_size": 4096.0}, "hidden_size"),
    ({"hidden_size": "4096"}, "hidden_size"),
    ({"hidden_size": True}, "hidden_size"),
    ({"hidden_size": _DELETE}, "hidden_size"),
    ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
    ({"num_attention_heads": 31}, "num_attention_heads"),  # does not divide 4096, no head_dim given
    ({"num_key_value_heads": 5}, "num_key_value_heads"),
    ({"vocab_size": None}, "vocab_size"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings"),
    ({"attention_dropout": "high"}, "attention_dropout"),
    ({"attention_dropout": float("nan")}, "attention_dropout"),
    ({"attention_dropout": 10**400}, "attention_dropout"),
    ({"attention_dropout": 1.5}, "attention_dropout"),
])
def test_bad_values_name_the_key(changes: dict, key: str) -> None:
    with pytest.raises(UserError, match=key) as info:
        arch_of("llama-3-8b", **changes)
    assert "\n" not in str(info.value)


def test_moe_top_k_larger_than_experts() -> None:
    with pytest.raises(UserError, match="num_experts_per_tok"):
        arch_of("mixtral-8x7b", num_experts_per_tok=9)
    with pytest.raises(UserError, match="first_k_dense_replace"):
        arch_of("deepseek-v3", first_k_dense_replace=62)


def test_unknown_model_type_names_the_supported_ones() -> None:
    with pytest.raises(UserError, match="bert") as info:
        architecture_from_config({"model_type": "bert", "hidden_size": 768})
    assert all(t in str(info.value) for t in SUPPORTED_MODEL_TYPES)
    with pytest.raises(UserError, match="model_type"):
        architecture_from_config({"hidden_size": 768})


@pytest.mark.parametrize("value", [None, [], "llama", 3, ["model_type"]])
def test_non_dict_config(value: object) -> None:
    with pytest.raises(UserError):
        architecture_from_config(value)  # type: ignore[arg-type]


JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-2**70, max_value=2**70), st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)), max_leaves=10)
KNOWN_KEYS = sorted({key for name in PRESETS for key in preset_config(name)} | {"head_dim", "embedding_size", "layer_types",
                    "n_inner", "mlp_bias", "shared_expert_intermediate_size", "num_local_experts"})


def _check_sane(arch: Architecture) -> None:
    counts = count_parameters(arch)
    assert counts.total > 0 and 0 < counts.active <= counts.total
    assert matmul_parameters(arch) > 0 and arch.kv_cache_width_per_layer > 0
    assert 0 <= arch.sliding_window_layers <= arch.num_layers and 0 <= arch.dense_layers <= arch.num_layers
    assert arch.dense_layers + arch.moe_layers == arch.num_layers and arch.is_moe == (arch.moe_layers > 0)
    assert arch.layer_is_moe.count(True) == arch.moe_layers


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(KNOWN_KEYS + ["model_type"]) | st.text(max_size=10), JSON_VALUES, max_size=12),
       st.sampled_from(SUPPORTED_MODEL_TYPES + ("bert", "")))
def test_fuzz_random_dicts_only_raise_user_error(config: dict, model_type: str) -> None:
    config.setdefault("model_type", model_type)
    try:
        arch = architecture_from_config(config)
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    _check_sane(arch)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(sorted(PRESETS)), st.lists(st.tuples(st.sampled_from(KNOWN_KEYS), JSON_VALUES | st.just(_DELETE)),
                                                  min_size=1, max_size=4))
def test_fuzz_mutated_real_configs_only_raise_user_error(name: str, mutations: list) -> None:
    config = copy.deepcopy(preset_config(name))
    for key, value in mutations:
        if value is _DELETE:
            config.pop(key, None)
        else:
            config[key] = value
    try:
        arch = architecture_from_config(config, name)
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    _check_sane(arch)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(sorted(PRESETS)), st.integers(1, 200), st.integers(1, 400_000), st.booleans())
def test_valid_mutations_give_consistent_positive_counts(name: str, layers: int, vocab: int, tie: bool) -> None:
    config = copy.deepcopy(preset_config(name))
    layer_key = "n_layer" if "n_layer" in config else "num_hidden_layers"
    config.update({layer_key: layers, "vocab_size": vocab, "tie_word_embeddings": tie})
    if "first_k_dense_replace" in config:
        config["first_k_dense_replace"] = min(config["first_k_dense_replace"], layers)
    config.pop("max_window_layers", None)
    if "mlp_only_layers" in config:
        config["mlp_only_layers"] = []
    arch = architecture_from_config(config, name)
    _check_sane(arch)
    counts = count_parameters(arch)
    # One more layer adds exactly one (last-layer-type) layer's parameters.
    config[layer_key] = layers + 1
    bigger = architecture_from_config(config, name)
    assert count_parameters(bigger).total - counts.total == parameters_per_layer(bigger)[-1].total
    # Untying adds exactly one V x h output head.
    assert total_of_config(config, tie=False) - total_of_config(config, tie=True) == vocab * arch.hidden_size


def total_of_config(config: dict, *, tie: bool) -> int:
    return count_parameters(architecture_from_config(dict(config, tie_word_embeddings=tie))).total


# ---------------------------------------------------------------------------------------------
# Loading config files, presets and model specs


def test_load_config_file_and_folder(tmp_path: Path) -> None:
    config = preset_config("qwen2.5-7b")
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert load_config(tmp_path / "config.json") == config
    assert load_config(tmp_path) == config
    assert load_config(str(tmp_path)) == config


@pytest.mark.parametrize("content, message", [
    (b"", "empty"), (b"   \n", "empty"), (b"\x89PNG\r\n\x1a\n\xff\xfe\x00", "UTF-8"),
    (b'{"model_type": "llama",', "not valid JSON"), (b"[1, 2, 3]", "JSON object"), (b'"llama"', "JSON object"),
    (b"[" * 100_000 + b"]" * 100_000, "nested|JSON"),
])
def test_load_config_bad_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(UserError, match=message) as info:
        load_config(path)
    assert "\n" not in str(info.value)


def test_load_config_missing(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such file"):
        load_config(tmp_path / "nope.json")
    with pytest.raises(UserError, match="no config.json"):
        load_config(tmp_path)


def test_resolve_model_preset_path_and_folder(tmp_path: Path) -> None:
    arch, source = resolve_model("Llama-3.1-8B")
    assert arch.hidden_size == 4096 and "llama-3.1-8b" in source
    (tmp_path / "config.json").write_text(json.dumps(preset_config("mistral-7b")))
    assert resolve_model(str(tmp_path))[0].sliding_window == 4096
    assert count_parameters(resolve_model(str(tmp_path / "config.json"))[0]).total == 7_241_732_096


def test_resolve_model_unknown_names_suggest_close_presets(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="llama-3.1-8b"):
        resolve_model("llama-3.1-8")
    with pytest.raises(UserError, match="no such file"):
        resolve_model(str(tmp_path / "missing.json"))
    with pytest.raises(UserError, match="Hub ids are not fetched.*llama-3.1-8b"):
        resolve_model("meta-llama/Llama-3.1-8B")
    with pytest.raises(UserError):
        resolve_model("   ")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_fuzz_resolve_model_only_raises_user_error(spec: str) -> None:
    try:
        arch, source = resolve_model(spec)
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    assert count_parameters(arch).total > 0 and source


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_fuzz_load_config_bytes_only_raises_user_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    try:
        config = load_config(path)
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(config, dict)


def test_load_preset_unknown_and_info() -> None:
    config, info = load_preset("MIXTRAL-8x7B")
    assert config["model_type"] == "mixtral" and info.hf_repo == "mistralai/Mixtral-8x7B-v0.1"
    assert info.config_source and info.total is not None and info.total.source
    with pytest.raises(UserError, match="unknown model preset"):
        load_preset("gpt5")


# ---------------------------------------------------------------------------------------------
# safetensors headers


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], *, metadata: dict | None = None,
                      itemsize: dict[str, int] | None = None) -> None:
    """A tiny but valid safetensors file (zero-filled data) built with struct + json."""
    sizes = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8, "F8_E4M3": 1, **(itemsize or {})}
    header: dict = {"__metadata__": metadata} if metadata is not None else {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for dim in shape:
            n *= dim
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def test_read_header_and_summary_single_file(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"emb": ("BF16", [10, 4]), "w": ("F32", [4, 4]), "b": ("F32", [4])}, metadata={"format": "pt"})
    header = read_safetensors_header(path)
    assert header["emb"]["shape"] == [10, 4] and header["__metadata__"] == {"format": "pt"}
    summary = safetensors_summary(tmp_path)
    assert (summary.files, summary.tensors, summary.total_elements) == (1, 3, 60)
    assert summary.elements_by_dtype == {"BF16": 40, "F32": 20}
    assert summary.total_bytes == 40 * 2 + 20 * 4
    assert safetensors_summary(path) == summary


def test_summary_sharded_with_index(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": ("BF16", [3, 5])})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"b": ("F8_E4M3", [8]), "b_scale": ("F32", [1])})
    write_safetensors(tmp_path / "stray.safetensors", {"c": ("F32", [1000])})  # not in the index: ignored
    index = {"metadata": {"total_size": 0}, "weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
        "b_scale": "model-00002-of-00002.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    summary = safetensors_summary(tmp_path)
    assert (summary.files, summary.tensors, summary.total_elements) == (2, 3, 24)
    assert summary.elements_by_dtype == {"BF16": 15, "F32": 1, "F8_E4M3": 8}
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(UserError, match="model-00002-of-00002"):
        safetensors_summary(tmp_path)


def _index(folder: Path, weight_map: dict[str, str]) -> None:
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_an_index_naming_missing_shards_is_refused_naming_all_of_them(tmp_path: Path) -> None:
    # The case: config.json and the first of four shards, with the index as the Hub ships it.
    write_safetensors(tmp_path / "model-00001-of-00004.safetensors", {"a": ("BF16", [4])})
    _index(tmp_path, {f"t{k}": f"model-0000{k}-of-00004.safetensors" for k in range(1, 5)})
    with pytest.raises(UserError, match=r"incomplete checkpoint.*4 shard file\(s\) and 3 are missing: "
                                        r"model-00002-of-00004.safetensors, model-00003-of-00004.safetensors, "
                                        r"model-00004-of-00004.safetensors"):
        safetensors_summary(tmp_path)


def test_shards_without_an_index_must_be_a_complete_set(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model-00001-of-00003.safetensors", {"a": ("BF16", [4])})
    write_safetensors(tmp_path / "model-00003-of-00003.safetensors", {"c": ("BF16", [4])})
    with pytest.raises(UserError, match=r"1 shard file\(s\) missing: model-00002-of-00003.safetensors"):
        safetensors_summary(tmp_path)
    write_safetensors(tmp_path / "model-00002-of-00003.safetensors", {"b": ("BF16", [6])})
    summary = safetensors_summary(tmp_path)
    assert (summary.files, summary.total_elements, summary.checkpoint_format) == (3, 14, "hf-shards")


def test_hf_and_mistral_consolidated_files_are_counted_once(tmp_path: Path) -> None:
    # Mistral repositories ship both; transformers loads the Hugging Face files.
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {"a": ("BF16", [10])})
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"b": ("BF16", [6])})
    write_safetensors(tmp_path / "consolidated.safetensors", {"a": ("BF16", [10]), "b": ("BF16", [6])})
    without_index = safetensors_summary(tmp_path)
    assert (without_index.total_elements, without_index.skipped) == (16, ("consolidated.safetensors",))
    assert "consolidated.safetensors" in without_index.format_note and "transformers" in without_index.format_note
    _index(tmp_path, {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"})
    with_index = safetensors_summary(tmp_path)
    assert (with_index.total_elements, with_index.checkpoint_format, with_index.skipped) == (
        16, "hf-index", ("consolidated.safetensors",))


def test_single_hf_file_beside_consolidated_and_consolidated_alone(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "consolidated.safetensors", {"w": ("BF16", [8])})
    alone = safetensors_summary(tmp_path)
    assert (alone.total_elements, alone.checkpoint_format, alone.skipped) == (8, "mistral-consolidated", ())
    write_safetensors(tmp_path / "model.safetensors", {"w": ("BF16", [8])})
    both = safetensors_summary(tmp_path)
    assert (both.total_elements, both.checkpoint_format, both.skipped) == (8, "hf-single", ("consolidated.safetensors",))


def test_summary_folder_without_safetensors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no .safetensors"):
        safetensors_summary(tmp_path)
    with pytest.raises(UserError, match="no such"):
        safetensors_summary(tmp_path / "missing")


def _raw_file(tmp_path: Path, content: bytes) -> Path:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    return path


def _header_file(tmp_path: Path, header: bytes, *, length: int | None = None, data: bytes = b"") -> Path:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(struct.pack("<Q", len(header) if length is None else length) + header + data)
    return path


@pytest.mark.parametrize("make", [
    lambda p: _raw_file(p, b""),
    lambda p: _raw_file(p, b"\x05\x00\x00"),                                   # shorter than the length field
    lambda p: _header_file(p, b'{"a": 1}', length=1000),                       # truncated header
    lambda p: _header_file(p, b"{}", length=MAX_HEADER_BYTES + 1),             # absurd header length
    lambda p: _header_file(p, b"\xff\xfe not json"),
    lambda p: _header_file(p, b"[1, 2]"),
    lambda p: _header_file(p, b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'),  # data truncated
    lambda p: _header_file(p, b'{"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}', data=bytes(8)),
    lambda p: _header_file(p, b'{"w": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 0]}}'),
    lambda p: _header_file(p, b'{"w": {"shape": [1], "data_offsets": [0, 4]}}', data=bytes(4)),
    lambda p: _header_file(p, b'{"w": "tensor"}'),
    lambda p: _header_file(p, b'{"__metadata__": [1]}'),
])
def test_corrupt_safetensors_raise_user_error(tmp_path: Path, make) -> None:
    path = make(tmp_path)
    with pytest.raises(UserError) as info:
        read_safetensors_header(path)
    assert "\n" not in str(info.value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.binary(max_size=64), st.integers(0, 2**64 - 1) | st.integers(0, 80), JSON_VALUES)
def test_fuzz_safetensors_headers_only_raise_user_error(tmp_path: Path, tail: bytes, length: int, header: object) -> None:
    path = tmp_path / "fuzz.safetensors"
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", length) + raw + tail)
    try:
        parsed = read_safetensors_header(path)
    except UserError as exc:
        assert "\n" not in str(exc)
        return
    assert isinstance(parsed, dict)


def test_header_bytes_are_parsed_and_counted_without_a_file() -> None:
    from tutor.files.models import parse_safetensors_header as parse_header
    from tutor.theory.safetensors_header import header_length, summarize_headers

    raw = json.dumps({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 12]},
                      "__metadata__": {"format": "pt"}}).encode()
    length = header_length(struct.pack("<Q", len(raw)), 8 + len(raw) + 12, "in memory")
    header = parse_header(raw, 12, "in memory")
    summary = summarize_headers([header, header], "hf-shards")
    assert length == len(raw) and (summary.files, summary.tensors, summary.total_bytes) == (2, 2, 24)
    assert summary.elements_by_dtype == {"BF16": 12}
    with pytest.raises(UserError, match="in memory is not a valid safetensors file: .*does not match its 11 bytes"):
        parse_header(raw.replace(b"12]", b"11]"), 12, "in memory")


def test_truncated_real_file_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"w": ("F32", [64, 64])})
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(UserError, match="data_offsets"):
        read_safetensors_header(path)
