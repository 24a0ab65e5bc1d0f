"""A config rebuilt at another layer count (tutor.trace.layer_count) keeps its per-layer lists valid and its
mix of layer kinds, and the calibration traces every kind (tutor.trace.arch_calibration)."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from tutor.trace import arch_calibration
from tutor.trace.layer_count import class_view, config_at_depth, layer_plan, with_layers
from tutor.errors import UserError


def written(model_type: str, **keys) -> dict:
    return transformers.AutoConfig.for_model(model_type, **keys).to_dict()


def built(config: dict):
    """The transformers config object: its class's own validation of the per-layer fields."""
    return transformers.AutoConfig.for_model(config["model_type"],
                                             **{k: v for k, v in config.items() if k != "model_type"})


def test_gemma3_keeps_five_sliding_layers_to_one_full_at_any_depth() -> None:
    config = written("gemma3_text", num_hidden_layers=26)
    plan = layer_plan(config)
    assert plan is not None and plan.periodic and plan.pattern_layers == 6
    twelve = built(with_layers(config, 12)).layer_types
    assert twelve.count("full_attention") == 2 and twelve.count("sliding_attention") == 10
    assert arch_calibration.traced_depths(config) == (6, 12)


def test_a_two_layer_config_is_rebuilt_at_three_layers() -> None:
    # The refusal this fixes: "num_hidden_layers (3) must be equal to the number of layer_types (2)".
    config = written("gpt_oss", num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2)
    assert built(config_at_depth(config, 3)).layer_types == ["sliding_attention", "full_attention",
                                                             "sliding_attention"]
    assert arch_calibration.traced_depths(config) == (2, 4)


def test_uniform_layers_are_traced_at_two_and_three() -> None:
    assert arch_calibration.traced_depths(written("llama", num_hidden_layers=32)) == arch_calibration.FIT_LAYERS


def test_gpt_neo_run_length_attention_types() -> None:
    config = written("gpt_neo", num_layers=24, attention_types=[[["global", "local"], 12]])
    five = built(config_at_depth(config, 5))
    assert five.num_layers == 5 and five.attention_layers == ["global", "local", "global", "local", "global"]


def test_gemma3n_per_layer_sizes_and_shared_kv_layers() -> None:
    config = written("gemma3n_text")  # 35 layers: 10 with activation sparsity, the last 15 share KV caches
    plan = layer_plan(config)
    assert plan is not None and not plan.periodic
    small = built(config_at_depth(config, plan.pattern_layers))
    assert len(small.intermediate_size) == len(small.activation_sparsity_pattern) == plan.pattern_layers
    kinds = set(zip(small.layer_types, small.activation_sparsity_pattern))
    original = set(zip(config["layer_types"], config["activation_sparsity_pattern"]))
    assert kinds == original  # every kind of layer the model has, in a few layers
    assert 0 < small.num_kv_shared_layers < plan.pattern_layers


def test_layer_index_lists_keep_their_kind() -> None:
    config = written("qwen3_moe", num_hidden_layers=8, mlp_only_layers=[1, 5], num_experts=4, num_experts_per_tok=2)
    plan = layer_plan(config)
    assert plan is not None and plan.pattern_layers == 4
    assert with_layers(config, 10)["mlp_only_layers"] == [1, 5, 9]


def test_leading_layers_of_their_own_are_kept_once_before_the_repeats() -> None:
    # Kimi-Linear: a dense first layer, then 3 linear-attention MoE layers and a full-attention one, repeated.
    config = written("kimi_linear")
    plan = layer_plan(config)
    assert plan is not None and plan.lead == (0,) and plan.pattern_layers == 4
    nine = built(with_layers(config, 9))
    assert nine.mlp_layer_types == ["dense"] + ["sparse"] * 8
    assert nine.layer_types[1:] == config["layer_types"][1:5] * 2
    assert arch_calibration.traced_depths(config) == (5, 9)


def test_a_pattern_the_class_derives_without_writing_it() -> None:
    # Jamba writes attn_layer_period and attn_layer_offset; its layers_block_type is a property.
    _, plan = class_view(written("jamba"))
    assert plan is not None and plan.pattern_layers == 8
    assert arch_calibration.traced_depths(written("jamba")) == (8, 16)


def test_a_list_as_long_as_a_tiny_layer_count_is_not_taken_for_a_per_layer_list() -> None:
    config = written("falcon_h1", num_hidden_layers=2)  # mlp_multipliers: 2 entries at any depth
    assert built(config_at_depth(config, 3)).mlp_multipliers == config["mlp_multipliers"]


def test_each_traced_depth_has_every_kind_and_the_per_layer_term_is_their_mean(monkeypatch) -> None:
    """A synthetic quantity where a sliding layer keeps 1 and a full one 5 units per token: the fitted
    per-layer term is the model's own mean (5 x 1 + 5) / 6, and each traced model has both kinds."""
    seen = []

    def synthetic(model, optimizer, setup, batch, seq_len, layers, assumptions=None, ends=(1, 1)):
        kinds = model.config.layer_types
        seen.append((layers, tuple(kinds)))
        per_token = sum(5 if kind == "full_attention" else 1 for kind in kinds)
        return {"activations@attention": 1000 + per_token * batch * seq_len, "kv_cache": 0}

    monkeypatch.setattr(arch_calibration, "_measure_shape", synthetic)
    config = written("gemma3_text", num_hidden_layers=26, hidden_size=64, intermediate_size=128,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256)
    setup = arch_calibration.calibrate(config, "k", mode="inference", precision="bf16", attention="sdpa",
                                       recompute="none")
    assert {layers for layers, _ in seen} == {6, 12}
    assert all("full_attention" in kinds and "sliding_attention" in kinds for _, kinds in seen)
    fitted = setup.quantity("activations@attention")
    assert fitted.per_layer[arch_calibration.BASIS.index("b*s")] == pytest.approx(10 / 6, rel=1e-5)
    assert setup.check_error < 1e-3  # the coefficients are kept to 6 significant digits


def test_a_limit_of_fake_tensors_is_one_line_naming_the_model_type(monkeypatch) -> None:
    def data_dependent(*_args, **_kwargs):
        from torch._subclasses.fake_tensor import DataDependentOutputException

        import torch

        raise DataDependentOutputException(torch.ops.aten._local_scalar_dense.default)

    monkeypatch.setattr(arch_calibration, "_measure_shape", data_dependent)
    config = written("granite", num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                     num_key_value_heads=2, vocab_size=256)
    with pytest.raises(UserError) as error:
        arch_calibration.calibrate(config, "k", mode="inference", precision="bf16", attention="sdpa",
                                   recompute="none")
    message = str(error.value)
    assert "\n" not in message and "'granite'" in message and "fake tensors have no values" in message


def test_a_first_calibration_says_what_it_traces_and_where_it_is_kept(tmp_path, monkeypatch) -> None:
    """The first `fit` of an unseen architecture traces for seconds: one sentence says so before it starts, with
    where the result is kept (the command line prints it to a terminal); --json names the cache file and key;
    the second call traces nothing."""
    import json

    from tests.cli_runner import run
    from tutor.trace import announcing

    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "granite", "architectures": ["GraniteForCausalLM"],
                                  "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "num_hidden_layers": 4, "vocab_size": 256}))
    heard: list[str] = []
    with announcing(heard.append):
        code, out, err = run(["fit", str(config), "--json"])
    assert code == 0 and err == "", err  # stderr is no terminal here: nothing but the answer
    calibration = json.loads(out)["calibration"]
    assert calibration["model_class"] == "GraniteForCausalLM" and calibration["setups"] == ["inference/bf16/sdpa"]
    assert len(heard) == 1 and heard[0].startswith("tracing GraniteForCausalLM")
    assert calibration["cache_file"] in heard[0]
    heard.clear()
    with announcing(heard.append):
        code, out, err = run(["fit", str(config), "--json"])
    assert code == 0 and heard == []
