"""`time --verify --device N`: the real model on the device against `time --device N`'s own answer. The runs here
use the CPU (device "cpu": the same code, timed on the wall clock; CUDA events and graph capture need a GPU, and
the GPU kit's time_8b and time_vs_real steps check those); the device checks need no device at all."""

from __future__ import annotations

import pytest

from tests.cli_runner import run
from tutor.trace.device_verify import _with_layers, gpu_index, layers_that_fit
from tutor.bench.notebook import append_run
from tutor.errors import UserError
from tutor.files.models import read_model_config, resolve_model
from tutor.theory.fit import FitRequest
from tutor.answers.time import device_verification


@pytest.mark.parametrize("text, index", [("0", 0), ("3", 3), ("cuda", 0), ("cuda:1", 1), ("CUDA:2", 2), ("cpu", None),
                                         ("h100", None), ("4090", None), (None, None)])
def test_a_gpu_of_this_machine_is_an_index_or_cuda_n_and_a_card_is_not(text, index) -> None:
    assert gpu_index(text) == index


def test_a_model_too_large_for_the_free_memory_is_verified_with_fewer_layers() -> None:
    arch = resolve_model("llama-3.1-8b")[0]
    request = FitRequest(mode="train", recipe="bf16", batch=1, seq_len=4096, optimizer="adamw")
    assert layers_that_fit(arch, request, 200 * 2**30) == arch.num_layers
    fewer = layers_that_fit(arch, request, 40 * 2**30)
    assert 1 <= fewer < arch.num_layers
    assert layers_that_fit(arch, request, 1) == 1
    config = {"num_hidden_layers": 4, "layer_types": ["a", "b", "a", "b"], "other": [1, 2]}
    assert _with_layers(config, 2) == {"num_hidden_layers": 2, "layer_types": ["a", "b"], "other": [1, 2]}


def _bench_run(data_dir) -> None:
    header = {"date": "2026-12-04T10:00:00Z", "cancelled": False}
    results = [
        {"kind": "matmul", "device": "cpu", "dtype": "fp32", "backend": "torch/mkl", "m": 512, "n": 512, "k": 512,
         "tflops_median": 0.05, "peak_tflops": 0.2, "peak_source": "test", "headline": True},
        {"kind": "bandwidth", "device": "cpu", "op": "triad", "bytes": 3 * 2**27, "gbps_median": 20.0},
    ]
    assert append_run(header, results, data_dir / "results.jsonl") is None


def _tiny_llama() -> dict:
    from tutor.trace.step_verify import sized_config

    return sized_config(read_model_config("llama-3.2-1b").config, layers=2, hidden=64, heads=2, seq=32, vocab=256)


def test_verification_on_a_device_times_the_step_prefill_and_each_engine_s_decode(tmp_path, monkeypatch) -> None:
    pytest.importorskip("transformers")
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    _bench_run(tmp_path)
    request = FitRequest(mode="train", recipe="fp32", batch=1, seq_len=32, optimizer="adamw")
    result = device_verification(_tiny_llama(), request, "cpu", name="tiny llama", source="test")
    assert result["scaled"] == "full size" and result["device"] == "cpu"
    assert set(result["phases"]) == {"forward", "backward", "optimizer"}
    assert result["measured_s"] == pytest.approx(sum(p["measured_s"] for p in result["phases"].values()))
    assert result["predicted_s"] > 0 and all(p["measured_s"] > 0 for p in result["phases"].values())
    assert result["prefill"]["measured_s"] > 0 and result["prefill"]["predicted_s"] > 0
    # A CPU has no CUDA graphs: eager rows only, at batch 1 and 8, each beside time's own row for it.
    assert [(r["engine"], r["batch"]) for r in result["decode_engines"]] == [("eager", 1), ("eager", 8)]
    assert result["decode"]["measured_s"] == result["decode_engines"][0]["measured_s"]
    assert "bench run 1" in result["sources"]["matmul"]


def test_recipes_a_gpu_verification_cannot_run_are_one_line() -> None:
    for request in (FitRequest(mode="train", recipe="mixed", batch=1, seq_len=32),
                    FitRequest(mode="inference", batch=1, seq_len=32, dp=2)):
        with pytest.raises(UserError) as error:
            device_verification(_tiny_llama(), request, "cpu", name="x", source="y")
        assert "\n" not in str(error.value)


def test_verify_on_a_gpu_index_without_that_gpu_is_one_line_and_exit_2() -> None:
    """Assumes no GPU numbered 7 (a machine with 8 GPUs would verify there instead)."""
    for device in ("7", "cuda:7"):
        code, out, err = run(["time", "llama-3.2-1b", "--verify", "--device", device])
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and f"--verify --device {device}" in err
