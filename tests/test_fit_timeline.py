"""The memory timeline of one training step (tutor.theory.fit_timeline) and `fit --timeline`: its
maximum is the estimate's peak, and it matches a real transformers step, tracked storage by storage
(tutor.trace.memory_trace.measure_training_timeline, the method of benchmarks/fit_vs_transformers.py), within 10% at every
layer boundary and at the peak."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


from tests.cli_runner import run
from tutor.files.models import resolve_model
from tutor.theory import fit as fitting
from tutor.theory.fit_timeline import prefill_timeline, training_timeline

TOLERANCE = 0.10


@pytest.mark.parametrize("name", ["llama-3.2-1b", "gpt2", "gemma-2-2b", "mixtral-8x7b", "deepseek-v3"])
@pytest.mark.parametrize("fields", [{}, {"impl": "hf", "gpu": False}, {"impl": "hf", "recompute": "full"},
                                    {"pp": 4}, {"impl": "hf", "pp": 4}, {"impl": "hf", "recipe": "hf-amp"},
                                    {"impl": "hf", "batch": 8, "seq_len": 8192}])
def test_the_timeline_peaks_at_the_estimate_peak(name, fields):
    arch = resolve_model(name)[0]
    request = fitting.FitRequest(mode="train", **fields)
    timeline = training_timeline(arch, request)
    assert max(moment.bytes for moment in timeline) == fitting.estimate(arch, request).worst.peak.bytes
    layers = [m.layer for m in timeline if m.layer is not None]
    stage = fitting.estimate(arch, request).worst
    assert len(layers) == 2 * stage.layers  # every layer's boundary, forward and backward


def test_forward_keeps_and_backward_frees_layer_by_layer():
    arch = resolve_model("llama-3.2-1b")[0]
    timeline = training_timeline(arch, fitting.FitRequest(mode="train", impl="hf", gpu=False))
    forward = [m for m in timeline if m.phase == "forward" and m.layer is not None]
    backward = [m for m in timeline if m.phase == "backward" and m.layer is not None]
    assert all(a.per_category["activations"] < b.per_category["activations"] for a, b in zip(forward, forward[1:]))
    assert all(a.per_category["activations"] > b.per_category["activations"] for a, b in zip(backward, backward[1:]))
    assert all(a.per_category["gradients"] < b.per_category["gradients"] for a, b in zip(backward, backward[1:]))
    assert [m.layer for m in backward] == list(reversed([m.layer for m in forward]))


def test_inference_has_no_step_timeline():
    with pytest.raises(ValueError):
        training_timeline(resolve_model("gpt2")[0], fitting.FitRequest(mode="inference"))


def test_fit_timeline_json_maximum_is_the_peak():
    code, out, err = run(["fit", "llama-3.2-1b", "--mode", "train", "--timeline", "--json", "--device", "24GiB"])
    assert code == 0, err
    data = json.loads(out)
    assert max(m["bytes"] for m in data["timeline"]) == data["devices"][0]["peak"]["bytes"] if "devices" in data \
        else max(m["bytes"] for m in data["timeline"]) == _peak_bytes(data)
    assert all(m["bytes"] == sum(m["per_category_bytes"].values()) for m in data["timeline"])


def _peak_bytes(data: dict) -> int:
    """peak.bytes wherever the fit JSON keeps it."""
    found = []

    def walk(value):
        if isinstance(value, dict):
            if isinstance(value.get("peak"), dict) and "bytes" in value["peak"]:
                found.append(value["peak"]["bytes"])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(data)
    return max(found)


def test_fit_timeline_prints_the_picture_and_its_table(tmp_path):
    target = tmp_path / "timeline.svg"
    code, out, err = run(["fit", "gpt2", "--mode", "train", "--timeline", "--device", "24GiB", "--svg", str(target)])
    assert code == 0, err
    assert "memory alive over one training step" in out and "peak" in out
    assert "(table)" in out and "optimizer" in out  # the table a pipe reads (80 columns: its cells wrap)
    assert target.read_text().lstrip().startswith("<svg")
    import html

    picture = html.unescape(target.read_text()).replace("\xa0", " ")  # the SVG says what it shows
    assert "model GPT-2" in picture and "mode training" in picture and "dtype bf16, recipe mixed" in picture


@pytest.mark.parametrize("argv, message", [
    (["fit", "gpt2", "--mode", "train", "--svg", "x.svg"], "--svg needs --timeline"),
    (["fit", "--params", "7B", "--mode", "train", "--timeline"], "--timeline needs the model's architecture"),
])
def test_bad_timeline_requests_are_one_line_and_exit_2(argv, message):
    code, out, err = run(argv)
    assert code == 2 and message in err and "Traceback" not in err


# ---- against a real transformers step ----------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "mixtral"])
def test_predicted_timeline_matches_a_real_step(model_type):
    pytest.importorskip("transformers")
    import torch

    from benchmarks.fit_vs_transformers import BATCH, CONFIGS, SEQ_LEN, architecture_for, build_model, fit_request
    from tutor.trace.memory_trace import token_ids, training_step
    from tutor.trace.memory_trace import measure_training_timeline

    run_config = CONFIGS["bf16"]
    hf_config, model = build_model(model_type, run_config)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = token_ids(model.config.vocab_size, BATCH, SEQ_LEN, seed=1)
    training_step(model, optimizer, ids, labels=ids)  # the optimizer states exist: the steady state
    measured, step = measure_training_timeline(model, optimizer, ids, labels=ids)
    arch, _ = architecture_for(model_type, hf_config)
    request = fit_request(run_config, "hf", attention=model.config._attn_implementation)
    predicted = {(m.phase, m.moment): m for m in training_timeline(arch, request)}
    assert len(measured) == 2 * arch.num_layers
    off = []
    for moment in measured:
        theory = predicted[(moment.phase, moment.moment)].bytes
        if abs(theory - moment.bytes) > TOLERANCE * moment.bytes:
            off.append(f"{moment.phase} {moment.moment}: measured {moment.bytes:,}, predicted {theory:,}")
    peak = max(m.bytes for m in predicted.values())
    if abs(peak - step.peak.bytes) > TOLERANCE * step.peak.bytes:
        off.append(f"peak: measured {step.peak.bytes:,}, predicted {peak:,}")
    assert not off, "\n".join(off)


# ---- a prefill ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["llama-3.2-1b", "gpt2", "gemma-2-2b", "mixtral-8x7b", "deepseek-v3"])
@pytest.mark.parametrize("fields", [{}, {"impl": "fused"}, {"gpu": False}, {"pp": 4}, {"tp": 4},
                                    {"batch": 8, "seq_len": 8192}])
def test_the_prefill_timeline_peaks_at_the_estimate_peak(name, fields):
    arch = resolve_model(name)[0]
    request = fitting.FitRequest(mode="inference", **fields)
    timeline = prefill_timeline(arch, request)
    worst = fitting.estimate(arch, request).worst
    assert max(moment.bytes for moment in timeline) == worst.peak.bytes
    assert len([m for m in timeline if m.moment.startswith("into layer")]) == worst.layers


def test_the_prefill_cache_grows_layer_by_layer_and_the_layer_tensors_come_and_go():
    arch = resolve_model("llama-3.2-1b")[0]
    request = fitting.FitRequest(mode="inference", batch=4, seq_len=8192)
    timeline = prefill_timeline(arch, request)
    kv = [m.per_category["kv_cache"] for m in timeline]
    assert kv == sorted(kv) and kv[0] == 0
    assert kv[-1] == fitting.estimate(arch, request).worst.component("kv_cache")
    into = [m for m in timeline if m.moment.startswith("into")]
    inside = [m for m in timeline if m.moment.startswith("inside")]
    assert all(a.per_category["activations"] > b.per_category["activations"] for a, b in zip(inside, into[1:]))
    assert all(m.per_category["gradients"] == m.per_category["optimizer"] == 0 for m in timeline)
    assert timeline[-1].moment.startswith("end of prefill")


def test_training_has_no_prefill_timeline():
    with pytest.raises(ValueError):
        prefill_timeline(resolve_model("gpt2")[0], fitting.FitRequest(mode="train"))


def test_fit_prefill_timeline_json_and_picture():
    code, out, err = run(["fit", "llama-3.2-1b", "--mode", "inference", "--timeline", "--json"])
    assert code == 0, err
    data = json.loads(out)
    assert max(m["bytes"] for m in data["timeline"]) == _peak_bytes(data)
    assert {m["phase"] for m in data["timeline"]} == {"prefill"}
    code, out, err = run(["fit", "gpt2", "--mode", "inference", "--timeline"])
    assert code == 0, err
    assert "memory alive over one prefill" in out and "into layer 11" in out and "end of prefill" in out


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "gpt2"])
def test_predicted_prefill_timeline_matches_a_real_prefill(model_type):
    pytest.importorskip("transformers")
    from benchmarks.fit_vs_transformers import BATCH, CONFIGS, SEQ_LEN, architecture_for, build_model, fit_request
    from tutor.trace.memory_trace import measure_prefill_timeline, token_ids

    run_config = CONFIGS["inference"]
    hf_config, model = build_model(model_type, run_config)
    ids = token_ids(model.config.vocab_size, BATCH, SEQ_LEN, seed=1)
    measured, prefill = measure_prefill_timeline(model, ids)
    arch, _ = architecture_for(model_type, hf_config)
    request = fit_request(run_config, "hf", attention=model.config._attn_implementation)
    predicted = {(m.phase, m.moment): m for m in prefill_timeline(arch, request)}
    assert [m.moment for m in measured] == [f"into layer {i}" for i in range(arch.num_layers)] + [
        "end of prefill: the next token's logits"]
    off = []
    for moment in measured:
        theory = predicted[(moment.phase, moment.moment)]
        if abs(theory.bytes - moment.bytes) > TOLERANCE * moment.bytes:
            off.append(f"{moment.moment}: measured {moment.bytes:,}, predicted {theory.bytes:,}")
        if moment.per_category["kv_cache"] != theory.per_category["kv_cache"]:  # the cache, layer by layer
            off.append(f"{moment.moment}: KV cache measured {moment.per_category['kv_cache']:,}, "
                       f"predicted {theory.per_category['kv_cache']:,}")
    peak = max(m.bytes for m in predicted.values())
    if abs(peak - prefill.peak.bytes) > TOLERANCE * prefill.peak.bytes:
        off.append(f"peak: measured {prefill.peak.bytes:,}, predicted {peak:,}")
    assert not off, "\n".join(off)
