"""training-step: what torch holds after one real step, against tutor.theory.memory.

Published anchors: mixed precision + Adam = 2 + 2 + 12 = 16 bytes per parameter (ZeRO, arXiv
1910.02054 §3.1, K = 12); pure bf16 + AdamW = 8 (tutor.theory.memory's "bf16" recipe); fp32 +
SGD with momentum = 4 + 4 + 4. Measured from the tensors torch keeps, to the byte.
"""

from __future__ import annotations

import threading

import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)

from tutor.labs import get_probe, run_probe

TINY = {"hidden": 32, "heads": 2, "layers": 1, "vocab": 64, "seq": 8, "batch": 2}


@pytest.mark.parametrize(("recipe", "optimizer", "bytes_per_param"), [
    ("mixed", "adam", 16),      # ZeRO §3.1
    ("fp32", "adam", 16),
    ("bf16", "adamw", 8),
    ("fp32", "sgd-momentum", 12),
    ("mixed", "sgd", 8),        # bf16 weights + grads + fp32 master, no states
])
def test_model_state_bytes_per_param_are_measured_exactly(recipe: str, optimizer: str, bytes_per_param: int) -> None:
    metrics = run_probe("training-step", {**TINY, "recipe": recipe, "optimizer": optimizer}).metrics
    assert metrics["bytes_per_param"] == bytes_per_param
    assert metrics["theory_bytes_per_param"] == bytes_per_param
    for part in ("param", "grad", "optimizer"):
        assert metrics[f"{part}_bytes"] == metrics[f"theory_{part}_bytes"], part


def test_adam_keeps_one_step_counter_per_parameter_tensor() -> None:
    adam = run_probe("training-step", {**TINY, "optimizer": "adam"}).metrics
    sgd = run_probe("training-step", {**TINY, "optimizer": "sgd"}).metrics
    # llama-style, 1 layer: embedding, 2 norms, qkv, proj, gate_up, fc2, final norm, head = 9 tensors
    assert adam["step_counter_bytes"] == 9 * 4
    assert sgd["step_counter_bytes"] == 0


def test_layer_activations_equal_the_activation_theory_plus_itemised_extras() -> None:
    result = run_probe("training-step", {**TINY, "style": "gpt", "recipe": "bf16"})
    metrics = result.metrics
    s, b, h, layers = TINY["seq"], TINY["batch"], TINY["hidden"], TINY["layers"]
    layernorm_stats = layers * 2 * 2 * s * b * 2
    assert metrics["layer_activation_bytes"] == metrics["theory_layer_activation_bytes"] + layernorm_stats
    embedding = next(row for row in result.rows if row.label.startswith("saved by the embedding"))
    assert embedding.measured == embedding.theory == 8 * s * b + s * b * h  # int64 ids + 1-byte dropout mask
    head = next(row for row in result.rows if row.label.startswith("saved final norm"))
    final_norm_stats = 2 * s * b * 2
    assert head.measured == head.theory + final_norm_stats + 4  # + cross-entropy's fp32 total_weight scalar


def test_the_loss_is_that_of_an_untrained_model() -> None:
    import math

    metrics = run_probe("training-step", {**TINY, "recipe": "fp32"}).metrics
    assert abs(metrics["loss"] - math.log(TINY["vocab"])) < 0.5


def test_cancel_before_the_step_returns_a_cancelled_result() -> None:
    cancel = threading.Event()
    cancel.set()
    result = get_probe("training-step").run(dict(TINY), lambda f, m: None, cancel)
    assert result.cancelled


@pytest.mark.gpu
def test_gpu_step_reads_the_caching_allocator() -> None:
    metrics = run_probe("training-step", {**TINY, "device": "cuda", "recipe": "mixed"}).metrics
    model_states = metrics["param_bytes"] + metrics["grad_bytes"] + metrics["optimizer_bytes"]
    assert metrics["bytes_per_param"] == 16
    # The allocator holds at least the model states after the step (activations are freed by then).
    assert metrics["cuda_allocated_bytes"] >= model_states
