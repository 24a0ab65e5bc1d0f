"""The evaluation lab: a held-out loss every N steps, its FLOPs share, and what no_grad and eval() change."""

from __future__ import annotations

import threading

import pytest

from tutor.labs import get_probe
from tutor.labs.evaluation import eval_graph_bytes, evaluation_flops_share

TINY = {"steps": 6, "eval_every": 3, "eval_batches": 3, "train_batches": 2, "batch": 4, "hidden": 8, "layers": 2,
        "dropout": 0.5}


def test_evaluation_flops_share_is_forward_passes_over_all_work() -> None:
    # 8 forward passes (2N) against 20 steps (6N): 16 / 136
    assert evaluation_flops_share(eval_every=20, eval_batches=8) == pytest.approx(16 / 136)
    assert evaluation_flops_share(eval_every=1, eval_batches=3) == pytest.approx(0.5)
    assert evaluation_flops_share(eval_every=5, eval_batches=0) == 0.0
    with pytest.raises(ValueError):
        evaluation_flops_share(eval_every=0, eval_batches=1)


def test_a_gradient_on_eval_loop_keeps_every_batch_graph_and_no_grad_keeps_none() -> None:
    import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)
    result = get_probe("evaluation").run(dict(TINY), lambda fraction, message: None, threading.Event())
    metrics = result.metrics
    assert metrics["kept_bytes_grad"] == 3 * eval_graph_bytes(4, 8, 2) == metrics["theory_kept_bytes_grad"]
    assert metrics["kept_bytes_no_grad"] == 0.0
    assert metrics["evaluations"] == 2.0
    assert 0.0 < metrics["eval_time_share"] < 1.0
    assert metrics["theory_eval_share"] == pytest.approx(evaluation_flops_share(eval_every=3, eval_batches=3))


def test_dropout_makes_train_mode_evaluations_disagree_and_eval_mode_agree() -> None:
    import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)
    result = get_probe("evaluation").run(dict(TINY), lambda fraction, message: None, threading.Event())
    assert result.metrics["train_mode_spread"] > 0.0
    assert result.metrics["eval_mode_spread"] == 0.0
    no_dropout = get_probe("evaluation").run(dict(TINY, dropout=0.0), lambda fraction, message: None,
                                             threading.Event())
    assert no_dropout.metrics["train_mode_spread"] == 0.0


def test_a_cancelled_run_reports_cancelled() -> None:
    import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)
    cancel = threading.Event()
    cancel.set()
    result = get_probe("evaluation").run(dict(TINY), lambda fraction, message: None, cancel)
    assert result.cancelled and result.probe == "evaluation"
