"""Matmul sweep on the CPU with tiny budgets: results, schema, budget adaptation, dtype checks."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)

from tutor.bench.matmul import (MatmulShape, matmul_throughput, parse_dtypes, supported_matmul_dtypes,
                                sweep_shapes)
from tutor.bench.timing import Timing, timing_from_samples
from tutor.errors import UserError

MATMUL_KEYS = {"kind", "device", "dtype", "m", "n", "k", "backend", "tflops_median", "tflops_best",
               "peak_tflops", "percent_of_peak"}


def fake_machine(peaks: dict[str, float | None] | None = None, flags: tuple[str, ...] = ("avx2", "fma")):
    peaks = {"fp32": 100.0, "bf16": 100.0, "fp16": 100.0} if peaks is None else peaks
    return SimpleNamespace(
        cpu=SimpleNamespace(flags=flags, last_level_cache_bytes=2**20),
        peak_tflops=lambda device, dtype: peaks.get(dtype),
        peak_source=lambda device, dtype: "test table",
        peak_memory_gbps=lambda device: None,
        to_json=lambda: {"cpu": {"model_name": "fake"}},
    )


def test_fp32_reports_torch_and_numpy_side_by_side() -> None:
    results = matmul_throughput("cpu", "fp32", budget_s=0.6, machine=fake_machine())
    backends = [result.backend for result in results]
    assert backends[0].startswith("torch/")
    assert backends[1].startswith("numpy/")
    assert sum(result.headline for result in results) == 1
    best = max(results, key=lambda r: r.tflops_median)
    assert best.headline
    for result in results:
        data = result.to_json()
        assert MATMUL_KEYS <= set(data)
        assert data["kind"] == "matmul" and data["dtype"] == "fp32"
        assert 0 < result.tflops_median <= result.tflops_best
        assert result.peak_tflops == 100.0
        assert result.percent_of_peak == pytest.approx(100 * result.tflops_median / 100.0)
        assert (result.m, result.n, result.k) in {(s.m, s.n, s.k) for s in result.sweep}
        assert result.tflops_median == max(s.tflops_median for s in result.sweep)


def test_tiny_budget_still_returns_a_result_in_measuring_order() -> None:
    results = matmul_throughput("cpu", "bf16", budget_s=0.05, machine=fake_machine())
    assert len(results) == 1
    sweep = results[0].sweep
    assert sweep and sweep[0].m == 128  # the smallest square always runs
    squares = [s.m for s in sweep if s.m == s.n == s.k]
    assert squares == sorted(squares)
    assert "small size" in results[0].notes


def test_unknown_peak_gives_no_percent() -> None:
    (result,) = matmul_throughput("cpu", "fp16", budget_s=0.05, machine=fake_machine({"fp16": None}))
    assert result.peak_tflops is None and result.percent_of_peak is None
    assert result.to_json()["peak_tflops"] is None


def test_measured_above_a_too_low_peak_is_explained_not_over_100() -> None:
    (result,) = matmul_throughput("cpu", "fp16", budget_s=0.05, machine=fake_machine({"fp16": 1e-9}))
    assert result.percent_of_peak is None
    assert any(note.startswith("above the theoretical peak") for note in result.notes)
    assert result.peak_note


def test_above_peak_says_what_clock_the_measurement_implies() -> None:
    machine = fake_machine({"fp16": 1e-9})
    machine.peak_clock_hz = lambda device: 2.0e9
    (result,) = matmul_throughput("cpu", "fp16", budget_s=0.05, machine=machine)
    implied = result.tflops_median / 1e-9 * 2.0
    assert f"the clock must have been at least {implied:.2f} GHz" in " ".join(result.notes)


def test_emulated_bf16_is_named_when_the_cpu_lacks_the_flags() -> None:
    (result,) = matmul_throughput("cpu", "bf16", budget_s=0.05, machine=fake_machine(flags=("avx2", "fma")))
    assert "emulated bf16: no AVX512-BF16" in result.notes
    (native,) = matmul_throughput("cpu", "bf16", budget_s=0.05, machine=fake_machine(flags=("amx_bf16",)))
    assert "emulated bf16: no AVX512-BF16" not in native.notes


def test_sweep_grows_while_the_budget_allows_and_stops_when_not() -> None:
    class Case:
        def __init__(self, m: int, n: int, k: int) -> None:
            self.fn, self.setup = (lambda: None), None

    ladder = (64, 128, 256, 512)
    # Free iterations and plenty of time: every square, then the two mamf-style neighbours of the best.
    shapes = [shape for shape, _ in sweep_shapes(Case, device="cpu", budget_s=5.0, ladder=ladder)]
    assert [s.m for s in shapes[:4]] == list(ladder)
    assert len(shapes) == 6 and all(s.n == s.k for s in shapes[4:]) and all(s.m != s.n for s in shapes[4:])
    # A clock that jumps 1 s per reading: the 2.5 s budget is gone after two sizes.
    ticks = iter(range(10_000))
    shapes = [s for s, _ in sweep_shapes(Case, device="cpu", budget_s=2.5, ladder=ladder, clock=lambda: next(ticks))]
    assert [s.m for s in shapes] == [64, 128]


def test_cancelled_sweep_returns_nothing_or_what_finished() -> None:
    cancel = threading.Event()
    cancel.set()
    assert matmul_throughput("cpu", "fp32", budget_s=1.0, machine=fake_machine(), cancel=cancel) == []


def test_dtype_parsing() -> None:
    assert supported_matmul_dtypes("cpu") == ("fp32", "bf16", "fp16")
    assert parse_dtypes("fp32, bf16,fp32", "cpu") == ("fp32", "bf16")
    assert parse_dtypes(None, "cpu") == ("fp32", "bf16", "fp16")
    with pytest.raises(UserError, match="unknown dtype 'fp64'"):
        parse_dtypes("fp64", "cpu")
    with pytest.raises(UserError, match="tf32 matmul is not available on cpu"):
        parse_dtypes("tf32", "cpu")
    with pytest.raises(UserError):
        parse_dtypes(",", "cpu")


def test_shape_json_round_trip() -> None:
    timing: Timing = timing_from_samples([1.0, 2.0])
    shape = MatmulShape(m=1, n=2, k=3, tflops_median=1.0, tflops_best=2.0, iters=timing.iters, noisy=False)
    assert shape.to_json() == {"m": 1, "n": 2, "k": 3, "tflops_median": 1.0, "tflops_best": 2.0, "iters": 2,
                               "noisy": False}
