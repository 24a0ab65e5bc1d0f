"""`fit` for hybrid and state-space models without a hand profile: the cache counted per kind of layer
(attention keys and values, conv and recurrent state), a chunked scan's padding as a step in the
prompt's length, a block shared by several layers counted once, and a fit that misses its own check
answered from a trace at the requested shape."""

from __future__ import annotations

from collections import Counter

import pytest

from tutor.theory import fit as fitting
from tutor.theory.calibrated import (
    CACHE_PREFIX,
    CalibratedSetup,
    Fitted,
    basis_values,
    kv_cache_bytes,
    padded_length,
)
from tutor.theory.models import count_parameters

import torch  # noqa: F401  (a hard dependency)

transformers = pytest.importorskip("transformers")

from tutor.trace import arch_calibration, memory_trace  # noqa: E402

TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2)


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    return tmp_path


def written(model_type: str, **keys) -> dict:
    return transformers.AutoConfig.for_model(model_type, **keys).to_dict()


def inference(batch: int, seq_len: int, **more) -> fitting.FitRequest:
    return fitting.FitRequest(mode="inference", dtype="bf16", batch=batch, seq_len=seq_len, attention="sdpa",
                              gpu=False, **more)


# -------------------------------------------------------------------------------------------------
# The cache per kind of layer


def _per_layer(kind: str, part: str, coefficients: dict[str, float]) -> tuple[str, Fitted]:
    basis = ("1", "b", "b*s", "b*s^2", "b*S")
    return f"{CACHE_PREFIX}{kind}:{part}", Fitted((0.0,) * 5, tuple(coefficients.get(t, 0.0) for t in basis))


def test_keys_and_values_grow_with_the_prompt_and_recurrent_state_does_not() -> None:
    setup = CalibratedSetup(key="k", check=(4, 2, 128), check_error=0.0, traced_element_bytes=2, quantities=(
        _per_layer("DynamicLayer", "kv", {"b*s": 512}),                  # 2 x 2 heads x 64 x 2 B per token
        _per_layer("LinearAttentionLayer", "state", {"b": 40_000}),      # conv + SSM state per sequence
        _per_layer("DummyLayer", "kv", {})))
    kinds = (("DynamicLayer", 2), ("LinearAttentionLayer", 6), ("DummyLayer", 4))

    def cache(seq_len: int, element: float = 2) -> int | None:
        return kv_cache_bytes(setup, batch=3, seq_len=seq_len, layers=12, element_bytes=element, cache_layers=kinds)

    assert cache(100) == 2 * 512 * 3 * 100 + 6 * 40_000 * 3
    assert cache(200) - cache(100) == 2 * 512 * 3 * 100           # only the attention layers grow
    # An fp8 KV cache halves the keys and values, not the recurrent state (the model's own dtype).
    assert cache(100, element=1) == 512 * 3 * 100 + 6 * 40_000 * 3
    # A kind of layer the trace never saw: no figure per layer, so no per-kind answer.
    assert kv_cache_bytes(setup, batch=1, seq_len=8, layers=2, element_bytes=2,
                          cache_layers=(("DynamicSlidingWindowLayer", 2),)) is None


def test_a_mamba_prefill_keeps_its_conv_and_ssm_state_as_its_cache() -> None:
    """A real (tiny) Mamba prefill: its cache holds no keys or values, but a conv and an SSM state per layer,
    counted as the cache, not as activations."""
    config = transformers.AutoConfig.for_model("mamba", hidden_size=32, num_hidden_layers=2, state_size=8,
                                               vocab_size=64, time_step_rank=4, conv_kernel=4)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    measured = memory_trace.measure_prefill(model, memory_trace.token_ids(64, 2, 12, seed=0))
    inner = 2 * 32  # expand x hidden
    conv, ssm = 2 * inner * 4 * 4, 2 * inner * 8 * 4  # batch x channels x kernel / state x fp32
    assert measured.max_per_category["kv_cache"] == 2 * (conv + ssm)


def test_the_cache_kinds_are_read_from_the_cache_transformers_builds() -> None:
    """Layer kinds by mechanism: the cache object a hybrid config gives (linear attention, full attention,
    hybrid, layers without cache), not a table of model types."""
    bamba = written("bamba", **TINY, num_hidden_layers=4, attn_layer_indices=[1, 3], mamba_n_heads=4,
                    mamba_d_head=32, mamba_d_state=8)
    zamba2 = written("zamba2", **dict(TINY, num_key_value_heads=4), num_hidden_layers=4,
                     layers_block_type=["mamba", "hybrid", "mamba", "hybrid"], mamba_d_state=8, n_mamba_heads=4)
    assert Counter(dict(arch_calibration.cache_layer_counts(bamba))) == Counter(
        LinearAttentionLayer=2, DynamicLayer=2)
    assert Counter(dict(arch_calibration.cache_layer_counts(zamba2))) == Counter(
        LinearAttentionLayer=2, LinearAttentionAndFullAttentionLayer=2)


def test_longcat_flash_counts_its_decoder_layers_not_its_attention_sublayers() -> None:
    """LongCat-Flash: num_layers decoder layers, each with a ModuleList of two attention sublayers (and a
    cache layer for each: num_hidden_layers = 2 x num_layers)."""
    config = written("longcat_flash", **{k: v for k, v in TINY.items() if k not in ("intermediate_size", "num_key_value_heads")},
                     num_layers=1, num_key_value_heads=4, ffn_hidden_size=128, q_lora_rank=32, kv_lora_rank=16,
                     qk_nope_head_dim=16, qk_rope_head_dim=8, head_dim=8, v_head_dim=16, n_routed_experts=4,
                     moe_topk=2, zero_expert_num=2, expert_ffn_hidden_size=64)
    arch = arch_calibration.measured_architecture(config)
    assert arch.num_layers == 1
    assert arch.calibration.cache_layers == (("DynamicLayer", 2),)


# -------------------------------------------------------------------------------------------------
# A chunked scan's padding


def test_padded_length_is_a_step_in_whole_chunks() -> None:
    assert [padded_length(s, 64) for s in (1, 64, 65, 128, 200)] == [64, 64, 128, 128, 256]
    assert padded_length(200, 0) == 200
    assert basis_values(2, 65, 64)[-1] == 2 * 128 and basis_values(2, 65)[-1] == 0


def test_a_chunked_scan_is_fitted_as_a_step_in_the_padded_length(monkeypatch) -> None:
    """A quantity that follows the prompt padded to whole chunks (Mamba-2's SSD scan) is fitted with b·S
    from traces at whole chunks and one length that pads up, and so holds between chunks; a polynomial
    in s through the same kind of quantity (chunk unknown) misses it there."""
    chunk = 64

    def truth(layers: int, batch: int, seq_len: int) -> float:
        return 4096 + layers * (50 * batch * seq_len + 300 * batch * padded_length(seq_len, chunk))

    traced = []

    def synthetic(model, optimizer, setup, batch, seq_len, layers, assumptions=None, ends=(1, 1)):
        traced.append((layers, batch, seq_len))
        return {"activations@mlp": truth(layers, batch, seq_len), "kv_cache": 0}

    monkeypatch.setattr(arch_calibration, "_measure_shape", synthetic)
    config = written("llama", **TINY, num_hidden_layers=2)
    stepped = arch_calibration.calibrate(config, "k", mode="inference", precision="bf16", attention="sdpa",
                                         recompute="none", chunk=chunk)
    assert any(s % chunk for _l, _b, s in traced) and stepped.check_error < 1e-3
    fitted = stepped.quantity("activations@mlp")
    for seq_len in (65, 130, 200, 1000):
        assert fitted.at(layers=48, batch=2, seq_len=seq_len) == pytest.approx(truth(48, 2, seq_len), rel=1e-3)
    smooth = arch_calibration.calibrate(config, "k", mode="inference", precision="bf16", attention="sdpa",
                                        recompute="none").quantity("activations@mlp")
    assert abs(smooth.at(layers=48, batch=2, seq_len=65) / truth(48, 2, 65) - 1) > 0.10


def test_the_scan_chunk_is_read_from_the_config_class() -> None:
    mamba2 = written("mamba2", hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32, n_groups=1,
                     vocab_size=256, chunk_size=32)
    bamba = written("bamba", **TINY, num_hidden_layers=2, mamba_chunk_size=16)
    assert arch_calibration.scan_chunk(mamba2) == 32
    assert arch_calibration.scan_chunk(bamba) == 16
    assert arch_calibration.scan_chunk(written("llama", **TINY, num_hidden_layers=2)) == 0


# -------------------------------------------------------------------------------------------------
# A fit that misses its check: traced at the requested shape


def test_a_fit_that_misses_its_check_answers_from_a_trace_at_the_shape(monkeypatch) -> None:
    """A quantity no basis term follows (a step every 100 tokens): the fit's own check fails, so the
    requested shape is traced itself, the answer is that trace's, and the notes say so."""
    def truth(layers: int, batch: int, seq_len: int) -> float:
        return 8192 + layers * 5000 * batch * (seq_len // 100) ** 3

    traced = []

    def synthetic(model, optimizer, setup, batch, seq_len, layers, assumptions=None, ends=(1, 1)):
        traced.append((layers, batch, seq_len))
        return {"activations@mlp": truth(layers, batch, seq_len), "kv_cache": 0}

    monkeypatch.setattr(arch_calibration, "_measure_shape", synthetic)
    config = written("granite", **TINY, num_hidden_layers=4)
    request = inference(3, 450)
    arch = arch_calibration.calibrated_for(arch_calibration.measured_architecture(config), request)
    assert (arch_calibration.FIT_LAYERS[1], 3, 450) in traced
    estimate = fitting.estimate(arch, request)
    assert estimate.worst.component("activations") == pytest.approx(truth(4, 3, 450), rel=1e-5)
    assert any("was traced itself" in note for note in estimate.notes)


def test_a_model_whose_code_fails_at_fewer_layers_is_traced_whole_at_the_shape(monkeypatch) -> None:
    """A model whose config indexes its layers in a way the rebuild at another depth does not follow (Inkling-2's
    looped layers, loop_layer_index_start/end) fails at the small depths: the whole model is traced at the
    requested shape instead of being refused, the answer is that trace's, and the notes say so."""
    def truth(layers: int, batch: int, seq_len: int) -> float:
        return 4096 + layers * 700 * batch * seq_len

    traced = []

    def synthetic(model, optimizer, setup, batch, seq_len, layers, assumptions=None, ends=(1, 1)):
        traced.append((layers, batch, seq_len))
        if layers != 4:
            raise IndexError("list index out of range")  # what the looped model's code raised
        return {"activations@mlp": truth(layers, batch, seq_len), "kv_cache": layers * 64 * batch * seq_len}

    monkeypatch.setattr(arch_calibration, "_measure_shape", synthetic)
    config = written("granite", **TINY, num_hidden_layers=4)
    request = inference(2, 300)
    arch = arch_calibration.calibrated_for(arch_calibration.measured_architecture(config), request)
    assert traced[-1] == (4, 2, 300)
    estimate = fitting.estimate(arch, request)
    assert estimate.worst.component("activations") == pytest.approx(truth(4, 2, 300), rel=1e-6)
    assert any("whole 4 layers were traced at this shape" in note for note in estimate.notes)


def test_a_model_that_fails_at_its_own_depth_is_still_refused_in_one_line(monkeypatch) -> None:
    def synthetic(model, optimizer, setup, batch, seq_len, layers, assumptions=None, ends=(1, 1)):
        raise IndexError("list index out of range")

    monkeypatch.setattr(arch_calibration, "_measure_shape", synthetic)
    config = written("granite", **TINY, num_hidden_layers=4)
    with pytest.raises(arch_calibration.UserError, match="its transformers code failed in the trace: "):
        arch_calibration.calibrated_for(arch_calibration.measured_architecture(config), inference(2, 300))


# -------------------------------------------------------------------------------------------------
# The backward of a model whose layers differ in kind

JAMBA = dict(TINY, num_hidden_layers=4, num_experts=4, num_experts_per_tok=2, attn_layer_period=2,
             attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1, mamba_d_state=8, mamba_dt_rank=8)


def test_the_backward_s_end_regions_cover_a_repeat_of_the_layers_pattern() -> None:
    """Alike layers: the top and the bottom layer. Jamba's Mamba and attention layers alternate: the top
    two and the bottom two, so that the highest and the lowest layer of each kind is in one."""
    assert arch_calibration.end_layers(written("llama", **TINY, num_hidden_layers=4)) == (1, 1)
    assert arch_calibration.end_layers(written("jamba", **JAMBA)) == (2, 2)


def test_the_largest_backward_moment_below_the_top_layer_is_kept() -> None:
    """Four layers, two kinds alternating (ends 2, 2): the layer below the top one (a Mamba layer of
    Jamba's, under an attention one) holds the backward's largest moment. It is in the top region, named
    by its place under the top, and the region's maximum is it; the middle layers' own moments are not."""

    phases = ("backward-layer:3", "backward-layer:2", "backward-layer:1", "backward-layer:0")
    size = [400, 50, 300, 40, 30]   # what the forward stored, then what each layer's backward makes and frees

    class Tracker:
        role = ["activations"] * 5
        made_by = [("forward", "mm")] + [(phase, "mm") for phase in phases]
        autocast_dtype = None
        ops_in_phase = {"forward": 1}
        events = [(0, size[0], "forward", 1, "mm")] + [
            event for key, phase in enumerate(phases, start=1)
            for event in ((key, size[key], phase, 1, "mm"), (key, -size[key], phase, 2, "mm"))]

    Tracker.size = size

    out = arch_calibration._timeline_quantities(Tracker(), 2, 4, {0: 0, 1: 0, 2: 0, 3: 0}, ends=(2, 2))
    assert out["activations@backward-top@op1"] == 450
    assert out["activations@backward-top@down1@op1"] == 700
    assert out["activations@backward-top:maximum"] == 700
    assert out["activations@backward-bottom@up1@op1"] == 440
    assert out["activations@backward-bottom:maximum"] == 440
    assert not any("down2" in name or "up2" in name for name in out)
    alike = arch_calibration._timeline_quantities(Tracker(), 2, 4, {0: 0, 1: 0, 2: 0, 3: 0})
    assert alike["activations@backward-top:maximum"] == 450  # what a fit for alike layers saw


@pytest.mark.slow
def test_a_model_of_two_kinds_of_layers_is_fitted_to_its_step_s_largest_moment() -> None:
    """Jamba at 4 layers, trained at 2 x 200 tokens (a shape never traced by the calibration): the
    calibrated activations and peak beside one step traced there (`fit --trace`, the same tracker; a
    real run of the benchmark's config agrees with such a trace to the byte), within 2%."""
    from tutor.trace.memory_trace import TraceSetup, trace_step

    config = written("jamba", **JAMBA)
    request = fitting.FitRequest(mode="train", batch=2, seq_len=200, recipe="bf16", attention="sdpa",
                                 optimizer="adamw", gpu=False)
    arch = arch_calibration.calibrated_for(arch_calibration.measured_architecture(config), request)
    worst = fitting.estimate(arch, request).worst
    traced = trace_step(config, TraceSetup(mode="train", dtype="bf16", batch=2, seq_len=200))
    assert worst.component("activations") == pytest.approx(traced.max_per_category["activations"], rel=0.02)
    assert worst.peak.bytes == pytest.approx(traced.peak.bytes, rel=0.02)


# -------------------------------------------------------------------------------------------------
# Weights of models whose layers differ, or share a block


@pytest.mark.parametrize("model_type, keys", [
    ("zamba2", dict(dict(TINY, num_key_value_heads=4), num_hidden_layers=4, mamba_d_state=8, n_mamba_heads=4,
                    layers_block_type=["mamba", "hybrid", "mamba", "hybrid"])),
    ("bamba", dict(TINY, num_hidden_layers=4, attn_layer_indices=[1, 3], mamba_n_heads=4, mamba_d_head=32,
                   mamba_d_state=8)),
])
def test_weights_are_every_layer_s_own_parameters(model_type: str, keys: dict) -> None:
    """Zamba2's shared transformer block is one set of parameters used by every hybrid layer; Bamba's Mamba
    and attention layers differ: the weights are the real model's parameters, each counted once."""
    arch = arch_calibration.measured_architecture(written(model_type, **keys))
    total = count_parameters(arch).total
    for request in (inference(1, 16), fitting.FitRequest(mode="train", recipe="bf16", optimizer="adamw", batch=1,
                                                         seq_len=16, gpu=False, attention="sdpa")):
        worst = fitting.estimate(arch, request).worst
        assert worst.component("weights") == 2 * total
        if request.mode == "train":
            assert worst.component("gradients") == 2 * total


# -------------------------------------------------------------------------------------------------
# Against real transformers prefills and steps


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["bamba", "zamba2", "mamba2", "lfm2", "falcon_h1", "nemotron_h"])
def test_hybrid_fit_matches_a_real_prefill_between_chunks(model_type: str) -> None:
    """benchmarks/fit_any_architecture.py's configs, at 200 tokens (not a whole 64-token chunk): the cache
    and the activations within 10% of the real prefill."""
    from tests.benchmark_scripts import load

    bench = load("fit_any_architecture")
    result, _info = bench.compare(model_type, "inference", 2, 200)
    rows = {row.category: row for row in result.rows}
    assert rows["kv_cache"].measured > 0
    for category in ("weights", "kv_cache", "activations", "peak"):
        assert rows[category].within, (category, rows[category].measured, rows[category].theory)
