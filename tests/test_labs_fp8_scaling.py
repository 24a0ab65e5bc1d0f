"""The fp8-scaling lab: each FP8 recipe's scales, cast with torch's float8 dtypes on this CPU."""

from __future__ import annotations

import threading

import pytest

from tutor.errors import UserError
from tutor.labs import get_probe

pytest.importorskip("torch")

SMALL = {"rows": 128, "cols": 256, "outliers": 1, "history": 4}


def run(**params):
    return get_probe("fp8-scaling").run({**SMALL, **params}, lambda fraction, message: None, threading.Event())


def test_an_outlier_channel_costs_per_tensor_scaling_and_not_per_tile_scaling() -> None:
    # One channel 10^4 larger: one scale per tensor pushes the other channels below E4M3's normal range.
    metrics = run(outlier_scale=1e4).metrics
    assert metrics["underflow_tensor"] > 5 * metrics["underflow_tile"]
    assert metrics["ordinary_error_tensor"] > 2 * metrics["ordinary_error_tile"]
    assert metrics["tensor_over_tile"] == pytest.approx(
        metrics["ordinary_error_tensor"] / metrics["ordinary_error_tile"])


def test_without_outliers_the_schemes_agree_and_stay_under_the_rounding_bound() -> None:
    from tutor.theory.formats import format_by_name

    bound = float(format_by_name("e4m3").epsilon) / 2
    metrics = run(outliers=0, growth=1.0).metrics
    assert 0.8 < metrics["tensor_over_tile"] < 1.25
    for scheme in ("tensor", "tile", "block", "mx"):
        assert metrics[f"ordinary_error_{scheme}"] < bound


def test_delayed_scaling_saturates_when_this_steps_outliers_outgrow_the_history() -> None:
    grew = run(outlier_scale=100.0, growth=4.0).metrics
    assert grew["clipped_delayed"] > 0
    assert grew["clipped_tensor"] == 0  # current scaling sees this step's amax
    assert grew["error_delayed"] > 5 * grew["error_tensor"]
    assert run(outlier_scale=100.0, growth=0.5).metrics["clipped_delayed"] == 0


def test_unscaled_values_above_448_saturate() -> None:
    metrics = run(outlier_scale=1e3).metrics  # N(0,1) x 1000 reaches far past E4M3's 448
    assert metrics["clipped_unscaled"] > 0
    assert metrics["error_unscaled"] > 0.5


def test_e5m2_keeps_the_small_gradients_e4m3_flushes() -> None:
    metrics = run(gradient_spread=2.5).metrics
    assert metrics["grad_underflow_e4m3"] > 0.01
    assert metrics["grad_underflow_e5m2"] < metrics["grad_underflow_e4m3"] / 10
    # E4M3's extra mantissa bit: the values both keep are closer.
    narrow = run(gradient_spread=0.5).metrics
    assert narrow["grad_error_e4m3"] < narrow["grad_error_e5m2"]


def test_the_cast_saturates_at_the_format_max_like_transformer_engine() -> None:
    import torch

    from tutor.labs.fp8_scaling import _cast

    cast, clipped = _cast(torch, torch.tensor([500.0, -1e6, 1.0], dtype=torch.float64), "fp8-e4m3")
    assert cast.tolist() == [448.0, -448.0, 1.0]
    assert clipped == 2


def test_a_run_reports_the_metrics_it_declares() -> None:
    probe = get_probe("fp8-scaling")
    assert set(run().metrics) == set(probe.metrics)


@pytest.mark.parametrize(("params", "message"), [({"cols": 200}, "multiples of 128"),
                                                 ({"outliers": 256}, "fewer than cols")])
def test_bad_shapes_are_one_line_user_errors(params: dict, message: str) -> None:
    with pytest.raises(UserError, match=message) as caught:
        run(**params)
    assert "\n" not in str(caught.value)
