"""tutor.theory.roofline against the reference tables (benchmarking.md §7, memory-and-models.md §2.12)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.theory.roofline import (
    attainable_flops,
    decode_time_per_token_bound,
    decode_tokens_per_second_bound,
    is_compute_bound,
    matmul_arithmetic_intensity,
    ridge_point,
)

# Datasheet dense BF16/FP16 peaks and HBM bandwidths (cli99/llm-analysis gpu_configs; NVIDIA).
H100_SXM = (989e12, 3.35e12)
A100_SXM = (312e12, 2.039e12)
V100 = (125e12, 0.9e12)
H200 = (989e12, 4.8e12)
LLAMA3_8B_PARAMS = 8_030_261_248


@pytest.mark.parametrize(
    ("shape", "printed"),
    [
        ((512, 512, 512), "171"),
        ((1024, 1024, 1024), "341"),
        ((4096, 4096, 4096), "1365"),
        ((8192, 8192, 8192), "2731"),
        ((4096, 4096, 128), "120.5"),
        ((1, 4096, 4096), "1.0"),
        ((64, 4096, 4096), "62"),
        ((256, 4096, 4096), "228"),
        ((512, 4096, 4096), "410"),
    ],
)
def test_bf16_matmul_intensity_table(shape: tuple[int, int, int], printed: str) -> None:
    intensity = matmul_arithmetic_intensity(*shape, 2)
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    assert round(float(intensity), decimals) == float(printed)


def test_intensity_closed_forms() -> None:
    # Square n: 2n/(3b); GEMV (m = 1) -> 2/b as n, k grow.
    assert matmul_arithmetic_intensity(4096, 4096, 4096, 2) == Fraction(2 * 4096, 3 * 2)
    assert matmul_arithmetic_intensity(1, 8192, 8192, 4) == pytest.approx(0.5, rel=1e-3)
    assert matmul_arithmetic_intensity(2, 2, 2, 0.5) == Fraction(16, 6)  # float bytes read exactly


@settings(deadline=None)
@given(m=st.integers(1, 4096), n=st.integers(1, 4096), k=st.integers(1, 4096), b=st.sampled_from([1, 2, 4]))
def test_intensity_grows_with_each_dimension(m: int, n: int, k: int, b: int) -> None:
    base = matmul_arithmetic_intensity(m, n, k, b)
    assert matmul_arithmetic_intensity(m + 1, n, k, b) > base
    assert base < Fraction(2, b) * min(m, n, k)  # intensity never exceeds 2·min(m,n,k)/b


@pytest.mark.parametrize(
    ("gpu", "printed"),
    [(H100_SXM, 295), (A100_SXM, 153), (V100, 139), (H200, 206)],
)
def test_ridge_points(gpu: tuple[float, float], printed: int) -> None:
    # V100's 139 FLOP/B is the example in NVIDIA's "Matrix Multiplication Background" guide.
    assert round(ridge_point(*gpu)) == printed


def test_256_rows_memory_bound_on_h100_compute_bound_on_a100() -> None:
    intensity = matmul_arithmetic_intensity(256, 4096, 4096, 2)
    assert not is_compute_bound(intensity, *H100_SXM)
    assert is_compute_bound(intensity, *A100_SXM)
    assert is_compute_bound(matmul_arithmetic_intensity(4096, 4096, 4096, 2), *H100_SXM)


def test_attainable_flops_roofs() -> None:
    peak, bw = H100_SXM
    assert attainable_flops(1.0, peak, bw) == pytest.approx(3.35e12)  # GEMV: on the bandwidth slope
    assert attainable_flops(1365.0, peak, bw) == peak  # square 4096: on the flat roof
    assert attainable_flops(ridge_point(peak, bw), peak, bw) == pytest.approx(peak)


@settings(deadline=None)
@given(i=st.floats(1e-3, 1e5), peak=st.floats(1e9, 1e16), bw=st.floats(1e9, 1e13))
def test_attainable_is_min_of_roofs(i: float, peak: float, bw: float) -> None:
    value = attainable_flops(i, peak, bw)
    assert value <= peak and value <= i * bw * (1 + 1e-12)
    assert value == pytest.approx(min(peak, i * bw))


def test_llama3_8b_decode_bound_on_h100() -> None:
    # memory-and-models.md §2.12: 16.06 GB / 3.35 TB/s = 4.8 ms per token, <= ~208 tok/s at batch 1.
    weights = 2 * LLAMA3_8B_PARAMS
    seconds = decode_time_per_token_bound(weight_bytes=weights, bandwidth=3.35e12)
    assert round(seconds * 1e3, 1) == 4.8
    rate = decode_tokens_per_second_bound(weight_bytes=weights, bandwidth=3.35e12)
    assert int(rate) == 208


@pytest.mark.parametrize(
    ("weight_bytes", "bandwidth", "printed"),
    [(14e9, 3.35e12, 239), (14e9, 1.008e12, 72), (141e9, 4.8e12, 34)],
)
def test_decode_bounds_table(weight_bytes: float, bandwidth: float, printed: int) -> None:
    # benchmarking.md §7: 7B bf16 on H100 SXM <= 239 tok/s, on RTX 4090 <= 72; 70B on H200 <= 34.
    assert int(decode_tokens_per_second_bound(weight_bytes=weight_bytes, bandwidth=bandwidth)) == printed


def test_decode_batch_and_kv() -> None:
    weights, kv = 16e9, 4e9
    t = decode_time_per_token_bound(weight_bytes=weights, kv_bytes=kv, bandwidth=2e12)
    assert t == pytest.approx(0.01)
    rate = decode_tokens_per_second_bound(weight_bytes=weights, kv_bytes=kv, bandwidth=2e12, batch=8)
    assert rate == pytest.approx(800)


@pytest.mark.parametrize(
    "call",
    [
        lambda: matmul_arithmetic_intensity(0, 1, 1, 2),
        lambda: matmul_arithmetic_intensity(1, 1, 1, 0),
        lambda: ridge_point(989e12, 0),
        lambda: attainable_flops(-1, 1e12, 1e12),
        lambda: decode_time_per_token_bound(weight_bytes=1e9, kv_bytes=-1, bandwidth=1e12),
        lambda: decode_tokens_per_second_bound(weight_bytes=1e9, bandwidth=1e12, batch=0),
        lambda: ridge_point(float("nan"), 1e12),
    ],
)
def test_rejects_impossible_input(call) -> None:
    with pytest.raises(UserError) as err:
        call()
    assert "\n" not in str(err.value)
