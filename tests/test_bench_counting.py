"""Counting conventions against their published sources (STREAM, mamf-finder, nccl-tests)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tutor.bench.counting import (STREAM_ARRAYS, compare_with_peak, gbps, stream_bytes, stream_bytes_counting,
                                  tflops)
from tutor.theory.flops import matmul_flops


def test_stream_default_array_bytes() -> None:
    # stream.c v5.10: STREAM_ARRAY_SIZE 10,000,000 doubles; bytes = {2,2,3,3} * 8 * N.
    n = 10_000_000
    assert stream_bytes("copy", n, 8) == 160_000_000
    assert stream_bytes("scale", n, 8) == 160_000_000
    assert stream_bytes("add", n, 8) == 240_000_000
    assert stream_bytes("triad", n, 8) == 240_000_000


def test_triton_vector_add_counts_three_fp32_tensors() -> None:
    # triton python/tutorials/01-vector-add.py: gbps = 12 * size / ms * 1e-6 (3 tensors x 4 B).
    size = 98_432
    assert stream_bytes("add", size, 4) == 12 * size


def test_one_array_ops_and_transfers_count_the_buffer_once() -> None:
    for op in ("read", "write", "h2d", "d2h"):
        assert stream_bytes(op, 1000, 8) == 8000


def test_counting_words_state_the_convention() -> None:
    text = stream_bytes_counting("triad", 8)
    assert text.startswith("3 x N x 8 B")
    assert "write-allocate" in text
    assert "device_local_copy" in STREAM_ARRAYS["copy"][1]


def test_unknown_op_is_rejected() -> None:
    with pytest.raises(ValueError):
        stream_bytes("memset", 10, 8)


def test_mamf_rates_are_decimal() -> None:
    # mamf-finder: tflops = 2mnk / (t * 10**12); an 8192^3 matmul in 1 ms is 1099.5 TFLOP/s.
    assert tflops(matmul_flops(8192, 8192, 8192), 1e-3) == pytest.approx(1099.511627776)
    assert gbps(2 * 10**9, 0.5) == 4.0


def test_h100_mamf_efficiency_from_the_published_table() -> None:
    # ml-engineering compute/accelerator/README.md: H100 SXM BF16 MAMF 794.5 of 989 -> 80.3 %.
    comparison = compare_with_peak(794.5, 989.0)
    assert comparison.percent == pytest.approx(80.3, abs=0.05)
    # GH200 828.6 of 989 -> 83.8 %; B200 1745.0 of 2250 -> 77.6 %.
    assert compare_with_peak(828.6, 989.0).percent == pytest.approx(83.8, abs=0.05)
    assert compare_with_peak(1745.0, 2250.0).percent == pytest.approx(77.6, abs=0.05)


def test_above_peak_is_never_a_percent() -> None:
    comparison = compare_with_peak(1.2, 1.0)
    assert comparison.percent is None
    assert comparison.peak == 1.0
    assert comparison.note  # says why instead of printing 120 %


def test_unknown_peak() -> None:
    comparison = compare_with_peak(1.0, None)
    assert comparison.peak is None and comparison.percent is None
    assert "unknown" in comparison.note


@given(st.floats(min_value=0, max_value=1e6), st.floats(min_value=1e-6, max_value=1e6))
def test_percent_is_at_most_100(measured: float, peak: float) -> None:
    percent = compare_with_peak(measured, peak).percent
    assert percent is None or 0.0 <= percent <= 100.0
