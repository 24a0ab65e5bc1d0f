"""cast-error: real torch casts against tutor.theory.formats.encode.

Anchors: unit roundoff u = 2^-(m+1) (Higham, Accuracy and Stability of Numerical Algorithms,
§2.1 Thm 2.2): bf16 2^-8, fp16 2^-11, FP8 E4M3 2^-4, E5M2 2^-3; E4M3's largest finite value 448
(arXiv 2209.05433 Table 1), to which torch's float8_e4m3fn cast saturates (builds with
pytorch#178817; earlier ones, 2.11 among them, cast an overflow to NaN).
"""

from __future__ import annotations

import pytest

from tutor.labs import run_probe

import torch

UNIT_ROUNDOFF = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11, "fp8-e4m3": 2.0**-4, "fp8-e5m2": 2.0**-3}


@pytest.mark.parametrize("dtype", list(UNIT_ROUNDOFF))
def test_every_random_cast_matches_the_theory_bit_for_bit(dtype: str) -> None:
    result = run_probe("cast-error", {"dtype": dtype, "count": 3000, "seed": 1})
    name = dtype.replace("-", "_")
    metrics = result.metrics
    assert metrics["agree_fraction"] == 1.0
    assert metrics[f"unit_roundoff_{name}"] == UNIT_ROUNDOFF[dtype]
    assert 0 < metrics[f"max_rel_error_{name}"] <= UNIT_ROUNDOFF[dtype]
    # Log-uniform inputs reach the subnormals, zero and overflow of every format.
    assert metrics["underflow_fraction"] > 0 and metrics["subnormal_fraction"] > 0
    if dtype != "bf16":  # bf16's range is fp32's, and its values are held in fp32: nothing overflows
        assert metrics["overflow_fraction"] > 0


def test_given_values_get_one_row_each_with_the_exact_theory_error() -> None:
    result = run_probe("cast-error", {"dtype": "bf16", "values": ["0.1", 1.0, 65504]})
    rows = [row for row in result.rows if row.label.endswith(" in bf16")]
    assert [row.label.split(" ->")[0] for row in rows] == ["0.1", "1", "65,504"]
    # 0.1 is held in fp32 first (0.100000001490116...), then rounded to bf16 = 0.10009765625.
    assert rows[0].label.endswith("-> 0.10009765625 in bf16")
    assert rows[0].measured == pytest.approx(rows[0].theory, rel=1e-12)
    assert rows[1].measured == rows[1].theory == 0.0
    assert result.metrics["agree_fraction"] == 1.0


def test_e4m3_overflow_is_what_this_torch_stores_and_the_theory_agrees() -> None:
    from tutor.labs.precision import torch_saturates_e4m3

    result = run_probe("cast-error", {"dtype": "fp8-e4m3", "values": [1000.0, -1e6]})
    assert result.metrics["overflow_fraction"] == 1.0
    assert result.metrics["agree_fraction"] == 1.0
    if torch_saturates_e4m3():
        assert "-> 448 in" in result.rows[-2].label and "-> -448 in" in result.rows[-1].label
    else:
        assert "-> NaN in" in result.rows[-2].label and "-> NaN in" in result.rows[-1].label


def test_a_torch_that_casts_e4m3_overflow_to_nan_is_checked_without_saturation(monkeypatch) -> None:
    # torch 2.11's cast, on this torch: NaN past 464 (448 plus half a step), its sign kept (0x7f | sign in
    # c10's fp8e4m3fn_from_fp32_value), otherwise the same rounding.
    import torch

    import tutor.labs.precision as precision

    def nan_on_overflow(inputs, dtype):
        if dtype is not torch.float8_e4m3fn:
            return inputs.to(dtype)
        nan = torch.copysign(torch.full_like(inputs, torch.nan), inputs)
        return torch.where(inputs.abs() > 464, nan, inputs).to(dtype)

    monkeypatch.setattr(precision, "cast_to", nan_on_overflow)
    monkeypatch.setattr(precision, "torch_saturates_e4m3", lambda: False)
    result = run_probe("cast-error", {"dtype": "fp8-e4m3", "values": [1000.0, -1e6, 448.0, 464.0, 465.0]})
    assert result.metrics["agree_fraction"] == 1.0 and result.metrics["overflow_fraction"] == 3 / 5
    labels = [row.label for row in result.rows[-5:]]
    assert ["-> NaN in" in label for label in labels] == [True, True, False, False, True]
    assert "does not saturate" not in result.summary and "NaN (no saturation)" in result.rows[3].note
    monkeypatch.setattr(precision, "torch_saturates_e4m3", lambda: True)  # the theory in the wrong mode
    assert run_probe("cast-error", {"dtype": "fp8-e4m3", "values": [1000.0]}).metrics["agree_fraction"] == 0.0


def test_fp64_source_shows_torchs_double_rounding_through_fp32() -> None:
    # 1 + 2^-8 + 2^-30 in fp64 rounds up to bf16 1 + 2^-7; through fp32 it first becomes the tie
    # 1 + 2^-8, which rounds to even: 1.0.
    value = 1 + 2**-8 + 2**-30
    direct = run_probe("cast-error", {"dtype": "bf16", "values": [value], "source": "fp64"})
    assert direct.metrics["agree_fraction"] == 0.0
    assert "double rounding" in direct.rows[0].note
    held_in_fp32 = run_probe("cast-error", {"dtype": "bf16", "values": [value], "source": "fp32"})
    assert held_in_fp32.metrics["agree_fraction"] == 1.0
