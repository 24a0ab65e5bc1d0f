"""quant-error and loss-scaling probes: what they report against theory, on small sizes."""

from __future__ import annotations

import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)

from tutor.errors import UserError
from tutor.labs import get_probe, run_probe
from tutor.labs.loss_scaling import fp16_flush_threshold
from tutor.labs.quantization import absmax_qmax, quantization_noise_variance


def test_absmax_qmax_and_noise_model() -> None:
    assert absmax_qmax(8) == 127 and absmax_qmax(4) == 7
    assert quantization_noise_variance(0.5) == pytest.approx(0.25 / 12)
    assert fp16_flush_threshold() == 2.0**-25


def test_quant_error_int8_matches_the_noise_model_and_groups_beat_one_scale() -> None:
    result = run_probe("quant-error", {"rows": 256, "cols": 256, "group_size": 64, "outliers": 4})
    m = result.metrics
    assert set(m) <= set(get_probe("quant-error").metrics)
    # INT8 steps are small next to the weights: the uniform model holds within a few percent
    assert m["rel_error_int8_tensor"] == pytest.approx(m["theory_rel_error_int8_tensor"], rel=0.1)
    assert m["rel_error_int8_row"] == pytest.approx(m["theory_rel_error_int8_row"], rel=0.1)
    assert m["rel_error_int8_row"] < m["rel_error_int8_tensor"]
    assert m["rel_error_int4_group"] < m["rel_error_int4_tensor"] and m["int4_tensor_over_group"] > 1
    assert m["bits_per_weight_int4_group"] == pytest.approx(4 + 16 / 64)


def test_quant_error_without_outliers_has_no_zero_collapse() -> None:
    m = run_probe("quant-error", {"rows": 128, "cols": 128, "outliers": 0, "group_size": 32}).metrics
    assert m["zero_fraction_int8_tensor"] < 0.05


def test_quant_error_rejects_a_group_that_does_not_divide_the_columns() -> None:
    with pytest.raises(UserError, match="multiple of group_size"):
        run_probe("quant-error", {"cols": 100, "group_size": 64})


def test_loss_scaling_makes_fp16_underflow_visible_and_the_scaler_removes_it() -> None:
    m = run_probe("loss-scaling", {"hidden": 32, "batch": 32, "steps": 10, "loss_factor": 2.0**-20}).metrics
    assert set(m) <= set(get_probe("loss-scaling").metrics)
    assert m["zero_grad_fraction_fp32"] == 0.0
    assert m["zero_grad_fraction_fp16"] > 0.5
    # activation gradients underflow before the weight gradients: at least as many zeros as predicted
    assert m["zero_grad_fraction_fp16"] >= m["predicted_zero_fraction_fp16"] - 0.05
    assert m["zero_grad_fraction_fp16_scaled"] < 0.01
    assert m["loss_ratio_fp16_scaled"] == pytest.approx(m["loss_ratio_fp32"], rel=0.05)
    assert m["loss_ratio_fp16"] > m["loss_ratio_fp32"]
