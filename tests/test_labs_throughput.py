"""matmul, bandwidth and collective probes: thin wrappers over tutor.bench, checked for what they
report (metric keys, ratios, peaks, cancellation), never for how fast this machine is."""

from __future__ import annotations

import re
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


@pytest.mark.slow
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
    largest size both timed (256 here), 0.5 / 0.25, not 1.0 / 0.25."""
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


@pytest.mark.sleeps
def test_matmul_budget_starts_after_torch_is_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading and warming torch must not eat the lesson's budget (at 3 s, the import left
    only tiny sizes): the sweep gets the whole budget however long the warm-up took."""
    import tutor.bench.matmul as bench_matmul

    budgets: list[float] = []
    real = bench_matmul.matmul_throughput

    def recording(device, dtype, **kwargs):
        budgets.append(kwargs["budget_s"])
        return real(device, dtype, **{**kwargs, "budget_s": 0.05})

    monkeypatch.setattr(bench_matmul, "warm_up", lambda device: time.sleep(0.6))
    monkeypatch.setattr(bench_matmul, "matmul_throughput", recording)
    result = run_probe("matmul", {"dtypes": ["fp32"], "budget_s": 0.5, "device": "cpu"})
    assert budgets and budgets[0] > 0.45
    assert "tflops_fp32" in result.metrics


def test_matmul_says_how_busy_the_machine_was(monkeypatch: pytest.MonkeyPatch) -> None:
    import tutor.bench.busy as busy_module
    import tutor.bench.matmul as bench_matmul
    from tutor.bench.busy import BusyShare
    from tutor.bench.matmul import MatmulResult, MatmulShape

    sweep = (MatmulShape(256, 256, 256, 0.5, 0.9, 40, True, 3.1), MatmulShape(512, 512, 512, 0.2, 0.21, 5, False, 0.02))

    sweep_busy = BusyShare(window_s=2.9, cores=2, other_cpu_s=4.35, own_cpu_s=1.4)

    def fake(device, dtype, **kwargs):
        return [MatmulResult(device, dtype, "fake", 512, 512, 512, 0.2, 0.21, 0.2, None, None, "", 5, False, 0.02,
                             (sweep_busy.describe(),
                              "best stable timing shown (512x512x512, 5 iterations); 1 of 2 sizes did not settle"),
                             sweep=sweep, busy=sweep_busy)]

    class Meter:
        @staticmethod
        def start() -> "Meter":
            return Meter()

        def stop(self) -> BusyShare:
            return BusyShare(window_s=3.0, cores=2, other_cpu_s=4.5, own_cpu_s=1.5)

    monkeypatch.setattr(bench_matmul, "matmul_throughput", fake)
    monkeypatch.setattr(bench_matmul, "warm_up", lambda device: None)
    monkeypatch.setattr(busy_module, "BusyMeter", Meter)
    result = run_probe("matmul", {"dtypes": ["fp32"], "budget_s": 0.3, "device": "cpu"})
    assert result.metrics["tflops_fp32"] == 0.2  # the stable timing, not the noisy 0.5
    first, *details = result.summary.splitlines()
    assert re.fullmatch(r"200 GFLOP/s on fp32, (\d+ of )?\d+ cores?", first)  # the figure plainly, then the caveats
    assert details == ["machine busy: other processes used 75% of 2 cores during the measurement, so it may read "
                       "low: run it again when the machine is quiet"]
    data = result.to_json()
    assert data["busy"]["other_share"] == pytest.approx(0.75) and data["busy"]["busy"] is True
    headline = data["headline"]["fp32"]
    assert (headline["m"], headline["stable"], headline["sizes_noisy"], headline["sizes_timed"]) == (512, True, 1, 2)
    fp32 = next(row for row in result.rows if row.label.startswith("fp32 matmul"))
    assert fp32.unit == "TFLOP/s" and "best stable timing shown" in fp32.note
    assert "machine busy" not in fp32.note  # said once, in the summary


def test_the_lab_command_prints_a_summary_line_by_line_with_controls_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from tutor.commands.lab import _show
    from tutor.labs import ProbeResult

    result = ProbeResult("matmul", (), {}, "198 GFLOP/s on fp32, 2 cores\nmachine busy\x1b[2J", device="cpu")
    _show(SimpleNamespace(title="Matrix multiply throughput", render=None), result, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == ["198 GFLOP/s on fp32, 2 cores", "machine busy\\x1b[2J"]
