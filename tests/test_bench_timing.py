"""The timing core: statistics on synthetic timings, the noisy flag, budgets and cancellation."""

from __future__ import annotations

import statistics
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tutor.bench.timing import (NOISY_CV, NOISY_SPREAD, STABLE_MIN_ITERS, BenchCancelled, percentile, time_case,
                                timing_from_samples, usable_cpu_count, use_all_cpu_threads)


def test_statistics_of_known_samples() -> None:
    timing = timing_from_samples([5.0, 1.0, 3.0, 2.0, 4.0])
    assert timing.median_s == 3.0
    assert timing.best_s == 1.0
    assert timing.mean_s == 3.0
    assert timing.stdev_s == pytest.approx(statistics.stdev([1, 2, 3, 4, 5]))
    # numpy's linear percentile of 1..5: p10 = 1.4, p90 = 4.6
    assert timing.p10_s == pytest.approx(1.4)
    assert timing.p90_s == pytest.approx(4.6)
    assert timing.iters == 5
    assert timing.times_s == (5.0, 1.0, 3.0, 2.0, 4.0)  # iteration order is kept


def test_percentile_matches_numpy_linear_method() -> None:
    numpy = pytest.importorskip("numpy")
    values = sorted([0.3, 0.1, 0.7, 0.25, 0.9, 0.05, 0.5])
    for q in (0.0, 0.1, 0.25, 0.5, 0.9, 1.0):
        assert percentile(values, q) == pytest.approx(float(numpy.percentile(values, q * 100)))


def test_steady_samples_are_not_noisy() -> None:
    timing = timing_from_samples([1.00, 1.01, 0.99, 1.00, 1.02, 0.98])
    assert not timing.noisy
    assert timing.noise_message == ""


def test_wide_spread_is_flagged_noisy_with_its_size() -> None:
    timing = timing_from_samples([1.0, 1.0, 1.0, 1.5, 2.0, 1.0, 1.0, 3.0])
    assert timing.noisy
    assert timing.spread > NOISY_SPREAD
    assert "spread" in timing.noise_message and "%" in timing.noise_message


def test_one_outlier_trips_the_coefficient_of_variation() -> None:
    samples = [1.0] * 19 + [3.0]  # p10..p90 is flat, the CV is not
    timing = timing_from_samples(samples)
    assert timing.spread == 0.0
    assert statistics.stdev(samples) / statistics.fmean(samples) > NOISY_CV
    assert timing.noisy and "coefficient of variation" in timing.noise_message


@pytest.mark.parametrize("bad", [[], [0.0], [-1.0, 1.0], [float("nan")]])
def test_bad_samples_are_rejected(bad: list[float]) -> None:
    with pytest.raises(ValueError):
        timing_from_samples(bad)


@given(st.lists(st.floats(min_value=1e-7, max_value=1e3), min_size=1, max_size=60))
def test_order_of_statistics(samples: list[float]) -> None:
    timing = timing_from_samples(samples)
    assert timing.best_s == min(samples)
    assert timing.best_s <= timing.p10_s <= timing.median_s <= timing.p90_s <= max(samples)
    assert min(samples) <= timing.mean_s * (1 + 1e-12)
    assert timing.iters == len(samples)


def test_fixed_iterations_run_setup_outside_and_warm_up_first() -> None:
    calls: list[str] = []
    timing = time_case(lambda: calls.append("fn"), warmup=2, iters=4, setup=lambda: calls.append("setup"))
    assert timing.iters == 4
    assert calls.count("fn") == 6  # 2 warm-up + 4 timed
    assert calls[:2] == ["setup", "fn"]


def test_budget_mode_estimates_iterations_and_respects_min_iters() -> None:
    def slow() -> None:
        time.sleep(0.02)

    timing = time_case(slow, warmup=1, budget_s=0.001, min_iters=3)
    assert timing.iters == 3  # the budget allows fewer, min_iters wins
    timing = time_case(lambda: None, warmup=1, budget_s=0.05, min_iters=1, max_iters=7)
    assert timing.iters == 7


def test_cancel_between_iterations_keeps_what_finished() -> None:
    cancel = threading.Event()
    count = {"n": 0}

    def fn() -> None:
        count["n"] += 1
        if count["n"] == 4:  # warm-up is call 1; timed calls 2, 3, 4
            cancel.set()

    timing = time_case(fn, warmup=1, iters=100, cancel=cancel)
    assert timing.cancelled
    assert timing.iters == 3


def test_cancel_before_anything_raises() -> None:
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(BenchCancelled):
        time_case(lambda: None, iters=3, cancel=cancel)


def test_exactly_one_of_iters_or_budget() -> None:
    with pytest.raises(ValueError):
        time_case(lambda: None)
    with pytest.raises(ValueError):
        time_case(lambda: None, iters=3, budget_s=1.0)
    with pytest.raises(ValueError):
        time_case(lambda: None, budget_s=-1.0)


def test_torch_uses_every_usable_cpu() -> None:
    import torch
    assert use_all_cpu_threads() == usable_cpu_count()
    assert torch.get_num_threads() == usable_cpu_count()


class StepClock:
    """A fake clock that moves only when the timed function runs: by the next of `durations`, cycling."""

    def __init__(self, durations: list[float]) -> None:
        self.now, self.durations, self.calls = 0.0, durations, 0

    def __call__(self) -> float:
        return self.now

    def work(self) -> None:
        self.now += self.durations[self.calls % len(self.durations)]
        self.calls += 1


def test_until_stable_stops_once_enough_iterations_agree() -> None:
    clock = StepClock([0.01])
    timing = time_case(clock.work, budget_s=100.0, max_iters=50, until_stable=True, timer=clock)
    assert timing.iters == STABLE_MIN_ITERS and not timing.noisy
    assert timing.median_s == pytest.approx(0.01)
    assert clock.calls == STABLE_MIN_ITERS + 1  # + the warm-up


def test_until_stable_keeps_timing_a_noisy_case_to_its_budget() -> None:
    clock = StepClock([0.01, 0.03, 0.01, 0.01, 0.03])
    timing = time_case(clock.work, budget_s=1.0, max_iters=1000, until_stable=True, timer=clock)
    assert timing.noisy and timing.iters > STABLE_MIN_ITERS
    assert 1.0 <= clock.now - 0.01 <= 1.0 + 0.03  # the deadline, read on the injected clock, ended it
    # Without until_stable a steady case runs the iterations its budget allows.
    steady = StepClock([0.01])
    assert time_case(steady.work, budget_s=0.1, max_iters=1000, timer=steady).iters == 10
