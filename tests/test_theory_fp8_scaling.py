"""tutor.theory.formats' FP8 scaling rules against their sources (Transformer Engine, OCP MX v1.0,
DeepSeek-V3) and against torch's own float8 casts."""

from __future__ import annotations

import math

import pytest

from tutor.errors import UserError
from tutor.theory.formats import (
    DEEPSEEK_BLOCK,
    DEEPSEEK_TILE,
    FP8_FORWARD_FORMAT,
    FP8_GRADIENT_FORMAT,
    MX_BLOCK_SIZE,
    delayed_amax,
    format_by_name,
    fp8_scale,
    mx_scale_exponent,
    scale_count,
)


def test_te_scale_maps_amax_onto_the_format_max() -> None:
    # _default_sf_compute: sf = (fp8_max / amax) / 2**margin; E4M3 max 448, E5M2 max 57344.
    assert fp8_scale(2.0) == 224.0
    assert fp8_scale(2.0, "fp8-e5m2") == 28672.0
    assert fp8_scale(2.0, margin=1) == 112.0
    assert fp8_scale(0.0) == 1.0


def test_the_hybrid_recipe_formats() -> None:
    # arXiv 2209.05433 §3 and TE's Format.HYBRID: E4M3 forward, E5M2 backward.
    assert format_by_name(FP8_FORWARD_FORMAT).max_finite == 448
    assert format_by_name(FP8_GRADIENT_FORMAT).max_finite == 57344


def test_delayed_amax_takes_the_history_not_the_current_tensor() -> None:
    assert delayed_amax([1.0, 4.0, 2.0]) == 4.0
    assert delayed_amax([1.0, 4.0, 2.0], "most_recent") == 2.0
    with pytest.raises(UserError):
        delayed_amax([])
    with pytest.raises(UserError):
        delayed_amax([1.0], "mean")


def test_mx_scale_exponent_is_floor_log2_amax_minus_emax() -> None:
    # OCP MX v1.0 §6.3: X = floor(log2(amax)) - emax_elem; E4M3 emax 8, E5M2 emax 15.
    assert mx_scale_exponent(1.0) == -8
    assert mx_scale_exponent(3.0) == 1 - 8
    assert mx_scale_exponent(3.0, "fp8-e5m2") == 1 - 15
    assert mx_scale_exponent(0.0) == -127
    assert mx_scale_exponent(2.0**300) == 127
    assert MX_BLOCK_SIZE == 32


def test_mx_scaled_block_top_lands_in_the_top_binade_and_saturates_above_max() -> None:
    torch = pytest.importorskip("torch")
    amax = 480.0 * 2**-5  # a block whose largest value, scaled, is 480: above E4M3's 448
    scaled = amax / 2.0 ** mx_scale_exponent(amax)
    assert 2**8 <= scaled < 2**9
    cast = torch.tensor([scaled]).clamp(-448, 448).to(torch.float8_e4m3fn).float().item()
    assert cast == 448.0


def test_scaled_e4m3_cast_never_overflows_and_keeps_the_unit_roundoff() -> None:
    torch = pytest.importorskip("torch")
    x = torch.randn(4096, dtype=torch.float64) * 3.0
    amax = x.abs().max().item()
    scale = fp8_scale(amax)
    q = (x * scale).float().to(torch.float8_e4m3fn).double() / scale
    assert torch.isfinite(q).all()
    normal = (x * scale).abs() >= float(format_by_name("e4m3").min_normal)
    relative = ((q - x).abs() / x.abs())[normal]
    assert relative.max().item() <= float(format_by_name("e4m3").epsilon) / 2 * (1 + 1e-12)


def test_scale_counts_of_deepseek_tiles_and_blocks() -> None:
    # arXiv 2412.19437 §3.3.2: 1x128 tiles for activations, 128x128 blocks for weights.
    assert scale_count(4096, 7168, *DEEPSEEK_TILE) == 4096 * 56
    assert scale_count(7168, 4096, *DEEPSEEK_BLOCK) == 56 * 32
    assert scale_count(100, 100, *DEEPSEEK_BLOCK) == 1
    assert scale_count(1, 129, *DEEPSEEK_TILE) == 2
    with pytest.raises(UserError):
        scale_count(0, 1, 1, 1)


@pytest.mark.parametrize("call", [lambda: fp8_scale(-1.0), lambda: fp8_scale(math.inf), lambda: fp8_scale(1.0, "int8"),
                                  lambda: fp8_scale(1.0, margin=-1), lambda: mx_scale_exponent(float("nan"))])
def test_bad_inputs_are_one_line_user_errors(call) -> None:
    with pytest.raises(UserError) as caught:
        call()
    assert "\n" not in str(caught.value)
