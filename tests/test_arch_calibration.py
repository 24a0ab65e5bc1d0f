"""`fit` for model types without a hand profile: parameters counted on the real model class,
activations from traces at small shapes fitted in b·s and b·s², checked here against real transformers
steps at shapes the calibration never traced (4 layers, more tokens)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tutor.errors import UserError
from tutor.theory import fit as fitting
from tutor.theory.calibrated import CalibratedSetup, Calibration, Fitted, setup_key, training_moments, training_timeline
from tutor.theory.models import architecture_from_config, count_parameters

import torch  # noqa: F401  (a hard dependency)

transformers = pytest.importorskip("transformers")

from tutor.trace import arch_calibration

SMALL = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, pad_token_id=0, bos_token_id=1,
             eos_token_id=2)
# The model types fit once refused, experts under the key their configuration class uses.
REFUSED = {
    "gemma3_text": dict(SMALL, head_dim=32), "granite": SMALL,
    "granitemoe": dict(SMALL, num_local_experts=4, num_experts_per_tok=2), "starcoder2": SMALL,
    "gpt_neox": SMALL, "cohere": SMALL, "cohere2": SMALL, "glm": SMALL, "glm4": SMALL, "falcon": SMALL,
    "smollm3": SMALL, "olmoe": dict(SMALL, num_experts=4, num_experts_per_tok=2), "olmo3": SMALL, "phi": SMALL,
    "stablelm": SMALL, "exaone4": SMALL, "helium": dict(SMALL, head_dim=16), "seed_oss": SMALL,
    "gpt_oss": dict(SMALL, num_local_experts=4, num_experts_per_tok=2, head_dim=32),
}


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    return tmp_path


def written(model_type: str, **keys) -> dict:
    return transformers.AutoConfig.for_model(model_type, **keys).to_dict()


def real_parameters(config: dict) -> int:
    hf_config = transformers.AutoConfig.for_model(config["model_type"],
                                                  **{k: v for k, v in config.items() if k != "model_type"})
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf_config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_a_type_without_hand_profile_is_counted_exactly_on_its_real_class(model_type: str) -> None:
    config = written(model_type, **REFUSED[model_type])
    arch = arch_calibration.measured_architecture(config)
    counts = count_parameters(arch)
    assert arch.profile == "calibrated-trace" and "no hand profile" in arch.profile_note
    assert counts.total == real_parameters(config)
    layers = sum(layer.total for layer in fitting.parameters_per_layer(arch))
    assert layers + counts.embedding + counts.lm_head + counts.position_embedding <= counts.total
    if "num_local_experts" in REFUSED[model_type] or "num_experts" in REFUSED[model_type]:
        assert arch.num_experts == 4 and counts.active < counts.total


def test_without_transformers_one_line_names_the_extra(monkeypatch) -> None:
    monkeypatch.setattr(arch_calibration, "versions", lambda: "")
    with pytest.raises(UserError) as error:
        arch_calibration.measured_architecture(written("granite", **SMALL))
    message = str(error.value)
    assert "\n" not in message and "granite" in message and "pip install -e '.[trace]'" in message


def test_qwen3_moe_expert_count_as_transformers_5_writes_it() -> None:
    # transformers 5.24 writes num_local_experts for Qwen3-MoE; reading only num_experts assumed 128.
    config = written("qwen3_moe", **dict(SMALL, head_dim=16, moe_intermediate_size=32), num_experts=8)
    assert "num_local_experts" in config and "num_experts" not in config
    arch = architecture_from_config(config)
    assert arch.num_experts == 8
    assert count_parameters(arch).total == real_parameters(config)


def test_spellings_that_disagree_are_an_error_not_a_choice() -> None:
    config = written("mixtral", **SMALL, num_local_experts=4)
    config["num_experts"] = 8
    with pytest.raises(UserError, match="disagree"):
        architecture_from_config(config)


def test_a_count_field_the_hand_profile_does_not_read_is_an_error() -> None:
    config = written("llama", **SMALL)
    config["num_local_experts"] = 8  # a Llama with experts is not what the llama profile counts
    with pytest.raises(UserError, match="does not model it"):
        architecture_from_config(config)


def test_fitted_quantities_evaluate_head_plus_layers() -> None:
    fitted = Fitted(head=(10.0, 1.0, 2.0, 0.0), per_layer=(0.0, 0.0, 3.0, 0.5))
    # head: 10 + 1·b + 2·b·s; per layer: 3·b·s + 0.5·b·s²
    assert fitted.at(layers=4, batch=2, seq_len=8) == 10 + 2 + 32 + 4 * (48 + 64)
    assert fitted.at(layers=4, batch=2, seq_len=8, head=False) == 4 * (48 + 64)
    key = setup_key(mode="train", precision="bf16", attention="flash", recompute="none")
    assert key == setup_key(mode="train", precision="bf16", attention="sdpa", recompute="none")
    setup = CalibratedSetup(key=key, quantities=(("activations@forward:acts", fitted),), check=(3, 2, 128),
                            check_error=0.0, traced_element_bytes=2)
    assert training_moments(setup, batch=2, seq_len=8, layers=4) == (("forward:acts", fitted.at(
        layers=4, batch=2, seq_len=8), 0, None),)
    assert Calibration("X", "v", (setup,)).setup(key) is setup


def _real_step(model_type: str, keys: dict, run_name: str, batch: int, seq_len: int):
    from tests.benchmark_scripts import load

    base = load("fit_vs_transformers")

    run = base.CONFIGS[run_name]
    hf_config = transformers.AutoConfig.for_model(model_type, **keys)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation=run.attention)
    if run.bf16_model:
        model = model.to(torch.bfloat16)
    if run.mode == "train":
        return base.measure_training(model, run, batch, seq_len), base.fit_request(run, "hf", batch, seq_len)
    return base.measure_inference(model, batch, seq_len), base.fit_request(run, "hf", batch, seq_len)


@pytest.mark.slow
@pytest.mark.parametrize("run_name", ["bf16", "inference"])
def test_calibrated_answer_matches_a_real_step_at_an_unseen_shape(run_name: str) -> None:
    keys = dict(SMALL, hidden_size=128, intermediate_size=256, vocab_size=512)
    config = written("granite", **keys)
    measured, request = _real_step("granite", keys, run_name, batch=2, seq_len=192)
    arch = arch_calibration.calibrated_for(arch_calibration.measured_architecture(config), request)
    estimate = fitting.estimate(arch, request)
    worst = estimate.worst
    assert any("no hand profile" in note for note in estimate.notes)
    categories = ("activations",) + (("kv_cache",) if run_name == "inference" else ())
    for category in categories:
        traced = measured.category_max[category]
        assert abs(worst.component(category) / traced - 1) < 0.10, (category, worst.component(category), traced)
    assert abs(worst.peak.bytes / measured.peak.bytes - 1) < 0.10


@pytest.mark.slow
def test_a_calibration_is_cached_and_reused_without_tracing(monkeypatch) -> None:
    config = written("helium", **dict(SMALL, head_dim=16))  # HeliumAttention assumes heads x head_dim = hidden
    request = fitting.FitRequest(mode="inference", batch=1, seq_len=64, gpu=False)
    first = arch_calibration.calibrated_for(arch_calibration.measured_architecture(config), request)
    assert first.calibration.setups

    def no_tracing(*_args, **_kwargs):
        raise AssertionError("traced again")

    monkeypatch.setattr(arch_calibration, "calibrate", no_tracing)
    monkeypatch.setattr(arch_calibration, "_measure", no_tracing)
    again = arch_calibration.calibrated_for(arch_calibration.measured_architecture(config), request)
    assert again.calibration.setups == first.calibration.setups


@pytest.mark.slow
def test_fit_json_says_which_path_answered(tmp_path) -> None:
    from tutor.commands.fit import fit

    path = tmp_path / "config.json"
    path.write_text(json.dumps(written("starcoder2", **SMALL)))
    result = CliRunner().invoke(fit, [str(path), "--seq", "64", "--device", "cpu", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    model = json.loads(result.output)["model"]
    assert model["profile"] == "calibrated-trace" and "Starcoder2ForCausalLM" in model["profile_note"]
    result = CliRunner().invoke(fit, ["llama-3.1-8b", "--json"], catch_exceptions=False)
    assert json.loads(result.output)["model"]["profile"] == "hand"


# ---------------------------------------------------------------------------------------------
# Hand profiles, against real transformers steps with 4 layers (the per-layer terms
# dominate: the loss head is a minority of the activations), at shapes the profiles were not tuned on.


def _benchmark():
    from tests.benchmark_scripts import load

    return load("fit_any_architecture")


@pytest.mark.slow
@pytest.mark.parametrize("model_type, run_name", [
    ("qwen3", "bf16"), ("olmo2", "bf16"), ("olmo2", "recompute"), ("olmo", "bf16"), ("olmo", "inference"),
    ("phi3", "inference"), ("gemma", "fp32-eager"),
])
def test_hand_profile_matches_transformers_with_four_layers(model_type: str, run_name: str) -> None:
    result, info = _benchmark().compare(model_type, run_name, batch=2, seq_len=160)
    assert info["profile"] == "hand"
    rows = {row.category: row for row in result.rows}
    head = result.theory_peak_per_category  # the loss head must not be what the test measures
    assert rows["activations"].measured > 0 and head
    off = [f"{row.category}: measured {row.measured:,}, fit {row.theory:,}" for row in result.rows if not row.within]
    assert not off, off


def test_window_regime_reads_window_lengths_not_layer_patterns() -> None:
    config = written("gemma3_text", **dict(SMALL, head_dim=32), sliding_window=64)
    assert config.get("sliding_window_pattern", 6) and arch_calibration.shortest_window(config) == 64
    assert arch_calibration.shortest_window(written("llama", **SMALL)) == 0
    within = setup_key(mode="train", precision="bf16", attention="sdpa", recompute="none", seq_len=64, window=64)
    beyond = setup_key(mode="train", precision="bf16", attention="sdpa", recompute="none", seq_len=65, window=64)
    assert within.endswith("within-window-64") and beyond.endswith("beyond-window-64")
    shapes, check = arch_calibration.traced_lengths(((1, 32), (1, 96)), (2, 128), window=64, beyond_window=64)
    assert all(s > 64 for _, s in shapes) and check[1] > 64


def test_a_check_the_fit_misses_refits_with_square_terms(monkeypatch) -> None:
    """Attention code that keeps s x s scores although its attn_implementation says SDPA (Falcon's
    multi-query path) is caught by the check shape: the fit is redone with b·s² terms."""
    traced = []

    def synthetic(model, optimizer, setup, batch, seq_len, layers, assumptions=None, ends=(1, 1)):
        traced.append((layers, batch, seq_len))
        bs = batch * seq_len
        return {"activations@attention": 4096 + 7 * batch + layers * (50 * bs + 3 * bs * seq_len), "kv_cache": 0}

    monkeypatch.setattr(arch_calibration, "_measure_shape", synthetic)
    config = written("llama", **dict(SMALL, num_hidden_layers=2))
    setup = arch_calibration.calibrate(config, "k", mode="inference", precision="bf16", attention="sdpa",
                                       recompute="none")
    fitted = setup.quantity("activations@attention")
    assert setup.check_error < 1e-4
    assert fitted.per_layer[arch_calibration.BASIS.index("b*s^2")] == pytest.approx(3)
    assert (2, 1, 64) in traced and len(traced) == len(set(traced))  # one more shape, nothing traced twice


def test_a_check_the_fit_passes_traces_no_square_shape(monkeypatch) -> None:
    traced = []

    def synthetic(model, optimizer, setup, batch, seq_len, layers, assumptions=None, ends=(1, 1)):
        traced.append((layers, batch, seq_len))
        return {"activations@attention": 4096 + 7 * batch + layers * 50 * batch * seq_len, "kv_cache": 0}

    monkeypatch.setattr(arch_calibration, "_measure_shape", synthetic)
    config = written("llama", **dict(SMALL, num_hidden_layers=2))
    setup = arch_calibration.calibrate(config, "k", mode="inference", precision="bf16", attention="sdpa",
                                       recompute="none")
    assert setup.check_error < 1e-4
    assert sorted(traced) == sorted([(layers, *shape) for layers in arch_calibration.FIT_LAYERS
                                     for shape in arch_calibration.FIT_SHAPES[("1", "b", "b*s")]]
                                    + [(arch_calibration.CHECK_LAYERS, *arch_calibration.CHECK_SHAPE)])


def test_what_a_trace_assumed_is_kept_with_its_setup_and_said_in_the_answer(monkeypatch) -> None:
    """A stand-in for values a fake tensor lacks (an even routing) reaches the answer's notes."""
    from dataclasses import replace

    def synthetic(model, optimizer, setup, batch, seq_len, layers, assumptions=None, ends=(1, 1)):
        assumptions.append("tokens routed evenly")
        return {"activations@attention": 4096 + layers * 50 * batch * seq_len, "kv_cache": 0}

    monkeypatch.setattr(arch_calibration, "_measure_shape", synthetic)
    config = written("granite", **dict(SMALL, num_hidden_layers=2))
    setup = arch_calibration.calibrate(config, "k", mode="inference", precision="bf16", attention="sdpa",
                                       recompute="none")
    assert setup.assumptions == ("tokens routed evenly",)  # once, however many shapes were traced
    assert arch_calibration._setup_from_json("k", arch_calibration._setup_json(setup)) == setup
    request = fitting.FitRequest(mode=fitting.Mode.INFERENCE, batch=1, seq_len=64)
    arch = arch_calibration.measured_architecture(config)
    key = fitting._calibration_key(arch, request)
    arch = replace(arch, calibration=replace(arch.calibration, setups=(replace(setup, key=key),)))
    assert "calibrated trace: tokens routed evenly" in fitting.estimate(arch, request).notes
def test_a_region_whose_maximum_moves_between_ops_is_kept_op_by_op(monkeypatch) -> None:
    """A tied head's backward: at short prompts a V x h weight gradient (op 56) tops the b·s·V logits'
    gradient (op 11), at long ones the logits win. Each op is linear in b·s; their maximum is not, and
    one fit of it (a parabola through the traced points) was ~4x off at 1 x 1024 tokens."""
    weight_gradient = 262_144

    def synthetic(model, optimizer, setup, batch, seq_len, layers, assumptions=None, ends=(1, 1)):
        bs = batch * seq_len
        stored = layers * 3872 * bs
        logits, weight = stored + 7192 * bs, stored + weight_gradient + 1304 * bs
        return {"activations@backward-head@op11": logits, "gradient_elements@backward-head@op11": 0,
                "activations@backward-head@op56": weight, "gradient_elements@backward-head@op56": 0,
                "activations@forward@top0@op1": stored + 6688 * bs, "gradient_elements@forward@top0@op1": 0,
                "activations_end_of_backward": weight_gradient}

    monkeypatch.setattr(arch_calibration, "_measure_shape", synthetic)
    config = written("llama", **dict(SMALL, num_hidden_layers=2))
    setup = arch_calibration.calibrate(config, "k", mode="train", precision="amp", attention="sdpa",
                                       recompute="none")
    assert setup.check_error < 1e-4
    assert {name for name, _ in setup.quantities if name.startswith("activations@backward-head")} == {
        "activations@backward-head@op11", "activations@backward-head@op56"}
    for batch, seq_len in ((1, 32), (1, 1024), (8, 4096)):
        bs = batch * seq_len
        timeline = training_timeline(setup, batch=batch, seq_len=seq_len, layers=24)
        # (to a byte: the coefficients are kept to 6 significant digits and the bytes rounded up)
        assert timeline.maximum == pytest.approx(24 * 3872 * bs + max(7192 * bs, weight_gradient + 1304 * bs), abs=1)
        assert timeline.stored == pytest.approx(24 * 3872 * bs + 6688 * bs, abs=1)


def test_forward_ops_are_named_by_the_layers_after_them() -> None:
    """The forward's ops are counted from its end and named with the layers that start after them:
    one name is one piece of code at two depths, and ops below the top layer are not fitted."""

    class Tracker:
        role = ["activations"] * 4
        size = [100, 10, 20, 5]
        made_by = [("forward", "embedding"), ("forward", "mm"), ("forward", "mm"), ("backward", "ones_like")]
        autocast_dtype = None
        ops_in_phase = {"forward": 30}
        events = [(0, 100, "forward", 2, "embedding"), (1, 10, "forward", 12, "mm"), (2, 20, "forward", 25, "mm"),
                  (3, 5, "backward", 1, "ones_like")]

    out = arch_calibration._timeline_quantities(Tracker(), 2, 2, {0: 5, 1: 20})
    assert out["activations@forward@top2@op28"] == 100   # before layer 0: the embedding
    assert out["activations@forward@top1@op18"] == 110   # in layer 0, below the top one
    assert out["activations@forward@top0@op5"] == 130    # in the top layer
    assert out["activations@backward-head@op1"] == 135
    assert arch_calibration._forward_layers_later("activations@forward@top1@op18") == 1



@pytest.mark.slow
@pytest.mark.parametrize("recipe, recompute", [("hf-amp", "none"), ("bf16", "full")])
def test_a_tied_head_fitted_at_short_prompts_holds_at_a_long_one(recipe: str, recompute: str) -> None:
    """Starcoder2 ties its head to the embedding: at the traced prompts the head's V x h weight gradient
    tops its logits' gradient, at 1 x 1024 the logits do. The calibrated answer there, set beside one
    step traced at that shape on fake tensors (`fit --trace`, the same tracker), within 2%."""
    from tutor.trace.memory_trace import TraceSetup, trace_step

    config = written("starcoder2", **dict(SMALL, hidden_size=128, intermediate_size=256, vocab_size=512))
    request = fitting.FitRequest(mode="train", batch=1, seq_len=1024, recipe=recipe, recompute=recompute,
                                 attention="sdpa", optimizer="adamw", gpu=False)
    arch = arch_calibration.calibrated_for(arch_calibration.measured_architecture(config), request)
    worst = fitting.estimate(arch, request).worst
    traced = trace_step(config, TraceSetup(mode="train", dtype="fp32" if recipe == "hf-amp" else "bf16",
                                           autocast=recipe == "hf-amp", recompute=recompute == "full",
                                           batch=1, seq_len=1024))
    assert worst.component("activations") == pytest.approx(traced.max_per_category["activations"], rel=0.02)
    assert worst.peak.bytes == pytest.approx(traced.peak.bytes, rel=0.02)


def test_a_region_whose_ops_differ_between_traces_keeps_its_maximum(monkeypatch) -> None:
    """Where no op of a region is in every trace (a code path that changes with the prompt), its
    maximum is fitted as one quantity, as before ops were told apart."""

    def synthetic(model, optimizer, setup, batch, seq_len, layers, assumptions=None, ends=(1, 1)):
        value = layers * 100 * batch * seq_len + 4096
        return {f"activations@backward-head@op{seq_len}": value, f"gradient_elements@backward-head@op{seq_len}": 0,
                "activations@backward-head:maximum": value, "gradient_elements@backward-head:maximum": 0}

    monkeypatch.setattr(arch_calibration, "_measure_shape", synthetic)
    config = written("llama", **dict(SMALL, num_hidden_layers=2))
    setup = arch_calibration.calibrate(config, "k", mode="train", precision="bf16", attention="sdpa",
                                       recompute="none")
    assert [name for name, _ in setup.quantities if name.startswith("activations@")] == [
        "activations@backward-head:maximum"]
    assert training_timeline(setup, batch=2, seq_len=512, layers=8).maximum == pytest.approx(
        8 * 100 * 1024 + 4096, abs=1)


@pytest.mark.slow
def test_amp_copies_are_freed_by_backward_in_the_calibrated_peak() -> None:
    """torch.autocast caches a 16-bit copy of each weight it casts for the forward; each is saved by
    its layer and freed by that layer's backward. At a short prompt the step's peak is where most
    gradients exist, and few copies do: counting every copy there (2 B/param) put GLM-4's peak 8% high."""
    keys = dict(SMALL, hidden_size=128, intermediate_size=256, vocab_size=512)
    config = written("glm4", **keys)
    measured, request = _real_step("glm4", keys, "amp", batch=1, seq_len=64)
    arch = arch_calibration.calibrated_for(arch_calibration.measured_architecture(config), request)
    worst = fitting.estimate(arch, request).worst
    assert worst.component("weights") == measured.category_max["weights"]  # every copy, at the end of forward
    assert worst.peak.bytes == pytest.approx(measured.peak.bytes, rel=0.03)
