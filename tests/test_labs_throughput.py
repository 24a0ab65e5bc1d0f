"""matmul, bandwidth and collective probes: thin wrappers over tutor.bench, checked for what they
report (metric keys, ratios, peaks, cancellation), never for how fast this machine is."""

from __future__ import annotations

import threading
import time

import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)

from tutor.labs import get_probe, run_probe


def test_matmul_reports_each_dtype_and_consistent_speedups() -> None:
    result = run_probe("matmul", {"dtypes": ["fp32", "bf16"], "budget_s": 0.6, "device": "cpu"})
    metrics = result.metrics
    assert metrics["tflops_fp32"] > 0 and metrics["tflops_bf16"] > 0
    speedup = next(row for row in result.rows if row.label.startswith("bf16 speed over fp32"))
    assert speedup.measured == metrics["speedup_bf16_over_fp32"] and "both at" in speedup.label
    assert metrics["speedup_bf16_over_fp32"] * metrics["speedup_fp32_over_bf16"] == pytest.approx(1.0)
    assert set(metrics) <= set(get_probe("matmul").metrics)
    fp32 = next(row for row in result.rows if row.label.startswith("fp32 matmul"))
    assert fp32.rate and fp32.unit == "TFLOP/s" and fp32.theory_source
    assert result.device == "cpu" and not result.cancelled


def test_matmul_dtypes_this_device_lacks_become_rows_not_errors() -> None:
    result = run_probe("matmul", {"dtypes": ["fp32", "fp8"], "budget_s": 0.3, "device": "cpu"})
    fp8 = next(row for row in result.rows if row.label == "fp8 matmul")
    assert fp8.measured is None and "not available on cpu" in fp8.note
    assert "tflops_fp8" not in result.metrics and "tflops_fp32" in result.metrics


def test_matmul_honours_a_cancel_event_set_before_it_starts() -> None:
    cancel = threading.Event()
    cancel.set()
    start = time.perf_counter()
    result = get_probe("matmul").run({"dtypes": ["fp32"], "device": "cpu"}, lambda f, m: None, cancel)
    assert result.cancelled and result.metrics == {}
    assert time.perf_counter() - start < 5


def test_bandwidth_reports_gb_per_s_with_the_stream_byte_count() -> None:
    result = run_probe("bandwidth", {"ops": ["copy"], "budget_s": 0.3, "device": "cpu"})
    assert result.metrics["gbps_copy"] > 0
    (row,) = result.rows
    assert row.rate and "2 x N x 8 B" in row.note
    assert set(result.metrics) == set(get_probe("bandwidth").metrics_for({"ops": ["copy"]}))


def test_collective_busbw_is_algbw_times_the_nccl_tests_factor() -> None:
    result = run_probe("collective", {"ranks": 2, "sizes": ["64KiB"], "ops": ["all_reduce", "all_gather"],
                                      "backend": "gloo", "budget_s": 0.5})
    metrics = result.metrics
    assert not result.cancelled, result.summary
    # nccl-tests PERFORMANCE.md: all_reduce 2(n-1)/n = 1 at n = 2; all_gather (n-1)/n = 0.5
    assert metrics["busbw_factor_all_reduce"] == 1.0 and metrics["busbw_factor_all_gather"] == 0.5
    assert metrics["busbw_all_reduce"] == pytest.approx(metrics["algbw_all_reduce"])
    assert metrics["busbw_all_gather"] == pytest.approx(metrics["algbw_all_gather"] / 2)
    assert set(metrics) == set(get_probe("collective").metrics_for({"ops": ["all_reduce", "all_gather"]}))


def test_matmul_speedup_compares_rates_at_the_same_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """fp32's best rate at 1024 and bf16's at 256 must not be divided: the ratio is taken at the
    largest size both timed (256 here), 0.5 / 0.25, not 1.0 / 0.25 (issue 8, fact 13)."""
    import tutor.bench.matmul as bench_matmul
    from tutor.bench.matmul import MatmulResult, MatmulShape

    rates = {"fp32": {128: 0.2, 256: 0.5, 1024: 1.0}, "bf16": {128: 0.1, 256: 0.25}}

    def fake(device, dtype, **kwargs):
        sweep = tuple(MatmulShape(n, n, n, rate, rate, 3, False) for n, rate in rates[dtype].items())
        best = max(sweep, key=lambda shape: shape.tflops_median)
        return [MatmulResult(device, dtype, "fake", best.m, best.n, best.k, best.tflops_median, best.tflops_median,
                             best.tflops_median, None, None, "", 3, False, 0.0, (), sweep=sweep)]

    monkeypatch.setattr(bench_matmul, "matmul_throughput", fake)
    metrics = run_probe("matmul", {"dtypes": ["fp32", "bf16"], "budget_s": 0.3, "device": "cpu"}).metrics
    assert metrics["tflops_fp32"] == 1.0 and metrics["tflops_bf16"] == 0.25
    assert metrics["speedup_fp32_over_bf16"] == pytest.approx(2.0)
    assert metrics["speedup_bf16_over_fp32"] == pytest.approx(0.5)
