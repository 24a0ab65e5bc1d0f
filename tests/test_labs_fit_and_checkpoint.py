"""fit and checkpoint-write probes.

Anchors: Llama-3.1-8B has 8,030,261,248 parameters (meta-llama/Llama-3.1-8B model card /
safetensors total), so 16,060,522,496 bytes of bf16 weights; a mixed-precision Adam checkpoint
stores 2 + 12 = 14 bytes per parameter (ZeRO arXiv 1910.02054 §3.1, without gradients).
"""

from __future__ import annotations

import os
import threading

import pytest

from tutor.labs import get_probe, run_probe
from tutor.theory.units import GiB

LLAMA_31_8B_PARAMS = 8_030_261_248


def test_fit_weights_of_llama_31_8b_in_bf16_come_from_the_published_count() -> None:
    metrics = run_probe("fit", {"model": "llama-3.1-8b", "capacity": "24GiB"}).metrics
    assert metrics["weights_bytes"] == 2 * LLAMA_31_8B_PARAMS
    assert metrics["capacity_bytes"] == 24 * GiB
    assert metrics["fits"] == 1.0
    assert metrics["total_bytes"] == sum(metrics[f"{c}_bytes"] for c in
                                         ("weights", "buffers", "activations", "kv_cache", "overhead"))
    # RoPE's inv_freq and its copy: 64 fp32 values each for a 128-wide head (transformers LlamaRotaryEmbedding)
    assert metrics["buffers_bytes"] == 2 * 64 * 4


def test_training_llama_31_8b_does_not_fit_an_80gb_card() -> None:
    result = run_probe("fit", {"model": "llama-3.1-8b", "mode": "train", "capacity": "80GB"})
    assert result.metrics["fits"] == 0.0
    # mixed precision + Adam: 16 bytes per parameter before activations (ZeRO §3.1)
    states = sum(result.metrics[f"{c}_bytes"] for c in ("weights", "gradients", "optimizer"))
    assert states == 16 * LLAMA_31_8B_PARAMS
    assert "does not fit" in result.summary


def test_fit_without_a_capacity_reads_this_machine() -> None:
    result = run_probe("fit", {"model": "gpt2", "device": "cpu"})
    assert result.metrics["capacity_bytes"] > 0
    assert result.metrics["fits"] == (1.0 if result.metrics["total_bytes"] <= result.metrics["capacity_bytes"] else 0.0)
    assert result.device == "cpu"


def test_unknown_model_is_a_user_error() -> None:
    from tutor.errors import UserError

    with pytest.raises(UserError):
        run_probe("fit", {"model": "no-such-model-xyz"})


@pytest.fixture()
def torch_available():
    import torch

    return torch


def test_checkpoint_holds_14_bytes_per_parameter_and_leaves_no_file(torch_available, tmp_path) -> None:
    seen = []
    result = get_probe("checkpoint-write").run({"size_mb": 4, "dir": str(tmp_path), "budget_s": 2},
                                               lambda f, m: seen.append(f), threading.Event())
    metrics = result.metrics
    assert metrics["theory_bytes_per_param"] == 14
    # pickle and per-tensor metadata add a little: well under 1 % at 256k parameters per tensor
    assert 14 <= metrics["bytes_per_param"] < 14 * 1.01
    assert metrics["write_gbps"] > 0 and metrics["read_gbps"] > 0
    assert os.listdir(tmp_path) == []
    assert seen[-1] == 1.0 and not result.cancelled


def test_checkpoint_extrapolates_to_a_named_model(torch_available, tmp_path) -> None:
    metrics = run_probe("checkpoint-write", {"size_mb": 4, "dir": str(tmp_path), "model": "llama-3.1-8b",
                                             "budget_s": 1}).metrics
    assert metrics["model_checkpoint_bytes"] == 14 * LLAMA_31_8B_PARAMS
    assert metrics["model_checkpoint_write_s"] == pytest.approx(
        metrics["model_checkpoint_bytes"] / (metrics["write_gbps"] * 1e9))


def test_checkpoint_cancelled_before_it_starts(torch_available, tmp_path) -> None:
    cancel = threading.Event()
    cancel.set()
    result = get_probe("checkpoint-write").run({"size_mb": 4, "dir": str(tmp_path)}, lambda f, m: None, cancel)
    assert result.cancelled
    assert os.listdir(tmp_path) == []
