"""Matmul sweep on the CPU with tiny budgets: results, schema, budget adaptation, dtype checks."""

from __future__ import annotations

import threading
import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)

from tutor.bench.matmul import (SMALL_CPU, MatmulShape, headline_entry, matmul_throughput, parse_dtypes,
                                supported_matmul_dtypes, sweep_shapes)
from tutor.bench.timing import Timing, timing_from_samples
from tutor.errors import UserError

from tests.machines import recorded_machine

MATMUL_KEYS = {"kind", "device", "dtype", "m", "n", "k", "backend", "tflops_median", "tflops_best",
               "peak_tflops", "percent_of_peak"}


def fake_machine(peaks: dict[str, float | None] | None = None, flags: tuple[str, ...] = ("avx2", "fma"),
                 clock_hz: float | None = 2.6e9):
    """A real Machine from recorded facts whose CPU peaks (TFLOP/s) are `peaks` (default 100: far above)."""
    peaks = {"fp32": 100.0, "bf16": 100.0, "fp16": 100.0} if peaks is None else peaks
    return recorded_machine(peaks_tflops=peaks, flags=flags, clock_hz=clock_hz)


def test_fp32_reports_torch_and_numpy_side_by_side() -> None:
    results = matmul_throughput("cpu", "fp32", budget_s=0.6, machine=fake_machine())
    backends = [result.backend for result in results]
    assert backends[0].startswith("torch/")
    assert backends[1].startswith("numpy/")
    assert sum(result.headline for result in results) == 1
    best = max(results, key=lambda r: (r.stable, r.tflops_median))  # a settled timing outranks a noisy one
    assert best.headline
    for result in results:
        data = result.to_json()
        assert MATMUL_KEYS <= set(data)
        assert data["kind"] == "matmul" and data["dtype"] == "fp32"
        assert 0 < result.tflops_median <= result.tflops_best
        assert result.peak_tflops == 100.0
        assert result.percent_of_peak == pytest.approx(100 * result.tflops_median / 100.0)
        assert (result.m, result.n, result.k) in {(s.m, s.n, s.k) for s in result.sweep}
        stable = [s for s in result.sweep if not s.noisy]
        assert result.tflops_median == max(s.tflops_median for s in (stable or result.sweep))
        assert result.stable == bool(stable)
        assert 0.0 <= data["busy"]["other_share"] <= 1.0 and data["busy"]["cores"] >= 1


def test_tiny_budget_still_returns_a_result_in_measuring_order() -> None:
    results = matmul_throughput("cpu", "bf16", budget_s=0.05, machine=fake_machine())
    assert len(results) == 1
    sweep = results[0].sweep
    assert sweep and sweep[0].m == 128  # the smallest square always runs
    squares = [s.m for s in sweep if s.m == s.n == s.k]
    assert squares == sorted(squares)
    # A machine slow at bf16 (emulated) stops at a small size within 50 ms; one with AMX reaches 1024^3.
    headline = results[0]
    small = max(headline.m, headline.n, headline.k) < SMALL_CPU
    assert ("small size" in headline.notes) == small


def test_unknown_peak_gives_no_percent() -> None:
    (result,) = matmul_throughput("cpu", "fp16", budget_s=0.05, machine=fake_machine({"fp16": None}))
    assert result.peak_tflops is None and result.percent_of_peak is None
    assert result.to_json()["peak_tflops"] is None


def test_measured_above_a_too_low_peak_is_explained_not_over_100() -> None:
    (result,) = matmul_throughput("cpu", "fp16", budget_s=0.05, machine=fake_machine({"fp16": 1e-9}))
    assert result.percent_of_peak is None
    assert any(note.startswith("above the peak computed at 2.60 GHz") for note in result.notes)
    assert result.peak_note


def test_above_peak_says_what_clock_the_measurement_implies() -> None:
    machine = fake_machine({"fp16": 1e-9}, clock_hz=2.0e9)
    (result,) = matmul_throughput("cpu", "fp16", budget_s=0.05, machine=machine)
    implied = result.tflops_median / 1e-9 * 2.0
    assert f"the clock must have been at least {implied:.2f} GHz" in " ".join(result.notes)


def test_emulated_bf16_is_named_when_the_cpu_lacks_the_flags() -> None:
    (result,) = matmul_throughput("cpu", "bf16", budget_s=0.05, machine=fake_machine(flags=("avx2", "fma")))
    assert "emulated bf16: no AVX512-BF16" in result.notes
    (native,) = matmul_throughput("cpu", "bf16", budget_s=0.05, machine=fake_machine(flags=("amx_bf16",)))
    assert "emulated bf16: no AVX512-BF16" not in native.notes


class FakeClock:
    """A clock that only moves when a fake GEMM runs: each call advances it by its pretend duration."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_cases(clock: FakeClock, rate_tflops: dict[int, float], noisy: frozenset[int] = frozenset(),
               calls: dict[tuple[int, int, int], int] | None = None):
    """Case factory whose GEMM of m x n x k 'takes' 2mnk / rate seconds on `clock` (rate per m; other m:
    the rate of n). Shapes with m or n in `noisy` alternate that time with 3x it, a spread no threshold accepts."""
    pattern = (1.0, 3.0, 1.0, 1.0, 3.0)

    class Case:
        def __init__(self, m: int, n: int, k: int) -> None:
            self.setup = None
            rate = rate_tflops.get(m, rate_tflops[n])
            seconds = 2 * m * n * k / (rate * 1e12)
            count = iter(range(10**6))

            def fn() -> None:
                index = next(count)
                clock.now += seconds * (pattern[index % len(pattern)] if {m, n} & noisy else 1.0)
                if calls is not None:
                    calls[(m, n, k)] = calls.get((m, n, k), 0) + 1

            self.fn = fn

    return Case


LADDER = (64, 128, 256, 512, 1024, 2048)


def test_growth_stops_at_the_first_real_size_that_is_stable_and_no_faster() -> None:
    clock = FakeClock()
    rates = {64: 1.0, 128: 2.0, 256: 4.0, 512: 4.1, 1024: 8.0, 2048: 8.0}
    sweep = sweep_shapes(fake_cases(clock, rates), device="cpu", budget_s=100.0, ladder=LADDER, clock=clock,
                         real_size=512)
    squares = [shape.m for shape, _ in sweep if shape.m == shape.n]
    # 512 is stable and only 2.5 % faster than 256: the plateau ends growth (1024 would have been faster).
    assert squares == [64, 128, 256, 512]
    assert all(not timing.noisy and timing.iters == 5 for _, timing in sweep)  # stable: stopped at 5 iterations
    neighbours = [shape for shape, _ in sweep if shape.m != shape.n]
    assert [(s.m, s.n, s.k) for s in neighbours] == [(384, 512, 512), (640, 512, 512)]
    # Below the real-size threshold a plateau does not stop growth.
    clock = FakeClock()
    sweep = sweep_shapes(fake_cases(clock, rates), device="cpu", budget_s=100.0, ladder=LADDER, clock=clock,
                         real_size=2048)
    assert [shape.m for shape, _ in sweep if shape.m == shape.n] == list(LADDER)


def test_growth_stops_when_the_next_size_would_not_fit_the_budget() -> None:
    clock = FakeClock()
    rates = {size: 1e-5 * size for size in LADDER}  # 0.8 ms per GEMM at 64 ... 0.84 s at 2048: never a plateau
    sweep = sweep_shapes(fake_cases(clock, rates), device="cpu", budget_s=1.0, ladder=LADDER, clock=clock,
                         real_size=64)
    squares = [shape.m for shape, _ in sweep if shape.m == shape.n]
    # ~0.42 s for 64..512; 1024 needs 4 x 0.21 s, more than 60 % of what is left.
    assert squares == [64, 128, 256, 512]
    assert clock.now <= 1.0


def test_a_noisy_size_is_never_the_headline_nor_a_plateau() -> None:
    clock = FakeClock()
    calls: dict[tuple[int, int, int], int] = {}
    # 256 is the fastest by its median but never settles; 512 and 1024 are stable and slower.
    rates = {64: 1.0, 128: 2.0, 256: 50.0, 512: 4.0, 768: 3.0, 1024: 4.1, 1280: 3.0, 2048: 4.1}
    sweep = sweep_shapes(fake_cases(clock, rates, noisy=frozenset({256}), calls=calls), device="cpu",
                         budget_s=100.0, ladder=LADDER, clock=clock, real_size=256)
    timings = {shape.label: timing for shape, timing in sweep}
    assert timings["256x256x256"].noisy and timings["256x256x256"].iters > 5  # kept timing, hoping it settles
    shape, timing = headline_entry(sweep)
    assert shape.label == "1024x1024x1024" and not timing.noisy
    # 512 is the first stable real size: no earlier stable size to compare with, so growth goes on;
    # 1024 is within 5 % of 512: growth stops there.
    assert [s.m for s, _ in sweep if s.m == s.n] == [64, 128, 256, 512, 1024]
    assert (768, 1024, 1024) in calls and (1280, 1024, 1024) in calls


def test_a_noisy_headline_is_timed_again_with_what_is_left() -> None:
    clock = FakeClock()
    calls: dict[tuple[int, int, int], int] = {}
    sweep = sweep_shapes(fake_cases(clock, {64: 1.0, 128: 2.0}, noisy=frozenset({64, 128}), calls=calls),
                         device="cpu", budget_s=1.0, ladder=(64, 128), clock=clock, real_size=64)
    shape, timing = headline_entry(sweep)
    assert timing.noisy and shape.label == "128x128x128"  # nothing settled: the best median
    assert [s.label for s, _ in sweep].count("128x128x128") == 1  # the steadier timing replaces, never duplicates
    # More calls than the kept timing accounts for (its iterations + a warm-up): it was timed a second time.
    assert calls[(128, 128, 128)] > timing.iters + 1


def test_busy_machine_is_said_and_the_stable_timing_is_the_headline(monkeypatch: pytest.MonkeyPatch) -> None:
    import tutor.bench.matmul as bench_matmul
    from tutor.bench.busy import BusyShare

    noisy = timing_from_samples([1e-3, 3e-3, 1e-3, 1e-3, 3e-3, 1e-3, 3e-3])
    steady = timing_from_samples([8e-3] * 6)
    fast_noisy = MatmulShape(256, 256, 256, 0.9, 1.0, noisy.iters, True, noisy.spread)
    slow_stable = MatmulShape(512, 512, 512, 0.03, 0.03, steady.iters, False, steady.spread)
    monkeypatch.setattr(bench_matmul, "sweep_shapes", lambda *a, **k: [(fast_noisy, noisy), (slow_stable, steady)])
    busy = BusyShare(window_s=2.0, cores=2, other_cpu_s=3.2, own_cpu_s=0.8)

    class Meter:
        @staticmethod
        def start() -> Meter:
            return Meter()

        def stop(self) -> BusyShare:
            return busy

    monkeypatch.setattr(bench_matmul, "BusyMeter", Meter)
    (result,) = matmul_throughput("cpu", "fp32", budget_s=0.1, machine=fake_machine(), include_numpy=False)
    assert (result.m, result.tflops_median, result.stable) == (512, 0.03, True)
    assert "machine busy: other processes used 80% of 2 cores during the measurement" in result.notes
    assert any(note.startswith("best stable timing shown (512x512x512") for note in result.notes)
    assert not any("spread" in note and "noisy" in note for note in result.notes)
    assert result.to_json()["busy"]["other_share"] == pytest.approx(0.8)
    assert result.to_json()["busy"]["busy"] is True


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
    shape = MatmulShape(m=1, n=2, k=3, tflops_median=1.0, tflops_best=2.0, iters=timing.iters, noisy=False,
                        spread=timing.spread)
    assert shape.to_json() == {"m": 1, "n": 2, "k": 3, "tflops_median": 1.0, "tflops_best": 2.0, "iters": 2,
                               "noisy": False, "spread": timing.spread}
