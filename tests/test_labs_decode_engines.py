"""decode-engines on the CPU: eager decode of a real transformers Llama against the host floor (the same
layers at a tiny width), the static-cache step a CUDA graph would capture, cancel and parameters.

Every run here pins device = "cpu": the lab's CUDA-graph path needs a GPU and is not exercised, except
StaticDecoder, the device-agnostic step it captures, which is checked against eager decode below.
"""

from __future__ import annotations

import threading

import pytest

from tutor.errors import UserError
from tutor.labs import run_probe
from tutor.labs.registry import load_lab

pytest.importorskip("transformers")

SMALL = {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 2, "prompt": 8, "tokens": 6, "budget_s": 2.0,
         "device": "cpu"}


@pytest.mark.slow
def test_eager_and_host_floor_on_the_cpu_are_positive_and_consistent() -> None:
    result = run_probe("decode-engines", SMALL)
    metrics = result.metrics
    assert result.device == "cpu" and not result.cancelled
    assert metrics["eager_step_s"] > 0 and metrics["host_floor_s"] > 0
    # The host-floor model runs the same layers with (almost) no arithmetic: its step is not longer
    # than the real model's, beyond timing noise on a shared 2-core machine.
    assert metrics["host_floor_s"] <= 1.5 * metrics["eager_step_s"]
    assert metrics["host_share"] == pytest.approx(metrics["host_floor_s"] / metrics["eager_step_s"])
    assert metrics["eager_tokens_per_s"] == pytest.approx(1 / metrics["eager_step_s"])
    assert set(load_lab("decode-engines").metrics_for(SMALL)) <= set(metrics)
    # Never a GPU figure from a CPU run: no graph timing, and the row says why.
    assert "graph_step_s" not in metrics
    assert result.details["graphs"].startswith("not measured on a CPU")
    assert len(result.details["steps_s"]["eager"]) == len(result.details["steps_s"]["host"]) >= 3


@pytest.mark.slow
def test_weights_read_per_step_are_the_model_less_its_embedding_table() -> None:
    from tutor.labs.inference import tiny_llama_params

    metrics = run_probe("decode-engines", SMALL).metrics
    params = tiny_llama_params(layers=2, hidden=256, heads=4, kv_heads=2)
    # fp32; the step reads one row (256 values) of the 256 x 256 embedding table.
    assert metrics["weight_bytes"] == 4 * (params - 256 * 256 + 256)
    # KV bytes at the mean context of the timed steps: 2 · layers · kv_heads · head_dim · 4 B per token.
    assert metrics["kv_bytes"] == int(metrics["context_tokens"] * 2 * 2 * 2 * 64 * 4)


@pytest.mark.slow
def test_a_known_bandwidth_gives_the_floor_and_the_ratio(monkeypatch) -> None:
    import tutor.labs.decode_engines as lab

    monkeypatch.setattr(lab, "measured_read_bandwidth", lambda device: (10e9, "a test's 10 GB/s"))
    metrics = run_probe("decode-engines", SMALL).metrics
    floor = (metrics["weight_bytes"] + metrics["kv_bytes"]) / 10e9
    assert metrics["bandwidth_floor_s"] == pytest.approx(floor)
    assert metrics["eager_over_floor"] == pytest.approx(metrics["eager_step_s"] / floor)


def test_a_cpu_without_a_measured_bandwidth_has_no_floor() -> None:
    import tutor.labs.decode_engines as lab

    assert lab.memory_bandwidth("cpu") is None  # the test's own empty notebook, and no CPU datasheet


def test_the_read_bandwidth_bench_saved_for_this_machine_is_the_one_used() -> None:
    import tutor.labs.decode_engines as lab
    from tutor.bench.environment import environment_header, load_machine
    from tutor.bench.notebook import append_run

    header = environment_header(load_machine(), command="tensor-tutor bench bandwidth")
    results = [{"kind": "bandwidth", "device": "cpu", "op": "copy", "gbps_median": 99.0},
               {"kind": "bandwidth", "device": "cpu", "op": "read", "gbps_median": 12.5},
               {"kind": "bandwidth", "device": "cuda:0", "op": "read", "gbps_median": 4000.0}]
    assert append_run(header, results) is None  # the test's own data dir (conftest)
    rate, source = lab.memory_bandwidth("cpu")
    assert rate == 12.5e9 and "read bandwidth `bench` measured here" in source


@pytest.mark.slow
def test_the_static_step_a_graph_captures_decodes_as_eager_does() -> None:
    import torch
    from transformers import LlamaForCausalLM

    from tutor.trace.decode_loops import StaticDecoder, eager_decoder
    from tutor.labs.decode_engines import llama_config

    torch.manual_seed(0)
    config = llama_config(layers=2, hidden=64, heads=4, kv_heads=2, max_positions=64)
    model = LlamaForCausalLM(config).eval()
    prompt = torch.randint(0, 256, (1, 8))
    with torch.no_grad():
        eager = eager_decoder(model, config, prompt)
        static = StaticDecoder(model, config, prompt, max_len=8 + 4)
        for _ in range(4):
            torch.testing.assert_close(static.step(), eager(), rtol=1e-4, atol=1e-4)
        assert int(static.position) == 12
        with pytest.raises(RuntimeError, match="static cache is full"):
            static.step()  # never written past its end: on a GPU that index would be a device-side assert


def test_cancel_before_the_start_returns_a_cancelled_result() -> None:
    cancel = threading.Event()
    cancel.set()
    result = load_lab("decode-engines").run(dict(SMALL), lambda fraction, message: None, cancel)
    assert result.cancelled and result.rows == ()


@pytest.mark.slow
def test_cancel_during_decoding_stops_with_what_was_timed() -> None:
    cancel = threading.Event()

    def progress(fraction: float, message: str) -> None:
        if message.startswith("decode steps") and fraction > 0.2:
            cancel.set()

    result = load_lab("decode-engines").run({**SMALL, "tokens": 200, "budget_s": 60}, progress, cancel)
    assert result.cancelled
    assert 1 <= len(result.details["steps_s"]["eager"]) < 200


@pytest.mark.parametrize(("params", "message"), [
    ({"hidden": 100, "heads": 8}, "multiple of heads"),
    ({"heads": 8, "kv_heads": 3}, "multiple of"),
    ({"tokens": 1}, "tokens must be between 2"),
    ({"dtype": "fp64"}, "unknown dtype 'fp64'"),
    ({"graphs": "yes"}, "graphs must be true or false"),
    ({"layers": 0}, "layers must be between 1"),
    ({"device": "tpu"}, "unknown device"),
])
def test_bad_parameters_are_one_line_user_errors(params: dict, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        run_probe("decode-engines", {**SMALL, **params})
    assert "\n" not in str(caught.value)


def test_a_model_too_large_for_this_machine_is_refused_before_it_is_built() -> None:
    with pytest.raises(UserError, match="decode-engines: .*lower layers, hidden, prompt or tokens"):
        run_probe("decode-engines", {**SMALL, "layers": 32, "hidden": 4096, "prompt": 2048, "tokens": 256})


def test_auto_dtype_is_fp32_on_a_cpu_and_bf16_on_a_gpu() -> None:
    from tutor.labs.decode_engines import chosen_dtype

    assert chosen_dtype("auto", "cpu") == "fp32"
    assert chosen_dtype("auto", "cuda:0") == "bf16"
    assert chosen_dtype("fp16", "cpu") == "fp16"
