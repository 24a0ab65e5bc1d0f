"""grad-accumulation, fp64-cost and checkpoint-interval probes, and tutor.theory.reliability."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)

from tutor.errors import UserError
from tutor.labs import get_probe, run_probe
from tutor.labs.checkpoint_interval import simulated_wall_time_s
from tutor.theory import reliability


def test_young_and_daly_intervals() -> None:
    # Young 1974: sqrt(2 delta M); 60 s writes, 10 h MTBF -> sqrt(2 * 60 * 36000) = 2078.46 s
    assert reliability.young_interval_s(60, 36_000) == pytest.approx(math.sqrt(2 * 60 * 36_000))
    daly = reliability.daly_interval_s(60, 36_000)
    assert daly < reliability.young_interval_s(60, 36_000) and daly == pytest.approx(2030.0, rel=0.01)
    assert reliability.daly_interval_s(100, 40) == 40  # delta >= 2M: checkpoint every M
    assert reliability.job_mtbf_s(16_384 * 3600.0, 16_384) == 3600.0
    with pytest.raises(UserError):
        reliability.young_interval_s(0, 10)


def test_daly_interval_minimises_the_expected_waste() -> None:
    delta, m = 120.0, 11_000.0
    best = reliability.daly_interval_s(delta, m)
    waste = reliability.waste_fraction(best, delta, m)
    for factor in (0.5, 0.8, 1.25, 2.0):
        assert reliability.waste_fraction(best * factor, delta, m) > waste
    assert reliability.first_order_waste_fraction(reliability.young_interval_s(delta, m), delta, m) == \
        pytest.approx(math.sqrt(2 * delta / m))


def test_simulation_agrees_with_dalys_expected_wall_time() -> None:
    rng = random.Random(1)
    work, tau, delta, m = 500 * 3600.0, 1800.0, 120.0, 3 * 3600.0
    simulated = sum(simulated_wall_time_s(work, tau, delta, m, rng) for _ in range(20)) / 20
    assert simulated == pytest.approx(reliability.expected_wall_time_s(work, tau, delta, m), rel=0.02)


@pytest.mark.parametrize(("segment", "m", "restart"), [(100.0, 300.0, 0.0), (400.0, 300.0, 20.0)])
def test_a_segments_wall_time_moments_match_its_simulation(segment: float, m: float, restart: float) -> None:
    rng = random.Random(3)
    walls = [simulated_wall_time_s(segment, segment, 0.0, m, rng, restart) for _ in range(40_000)]
    mean, variance = reliability.segment_wall_time_moments(segment, m, restart)
    assert statistics.fmean(walls) == pytest.approx(mean, rel=0.02)
    assert statistics.variance(walls) == pytest.approx(variance, rel=0.06)
    assert mean == pytest.approx(math.expm1(segment / m) * (m + restart))  # Daly 2006 eq. 13, one segment


class _CountingRandom(random.Random):
    draws = 0

    def expovariate(self, lambd: float) -> float:
        self.draws += 1
        return super().expovariate(lambd)


def test_the_longest_run_the_lab_allows_is_simulated_within_its_budget_and_agrees_with_daly() -> None:
    """work_hours=1e5 at 0.25 x Daly's interval is millions of segments a run: past its share of the budget a
    run sums its segments by the central limit theorem, in a bounded number of draws, still at Daly's mean."""
    work, tau, delta, m = 1e5 * 3600.0, 60.0, 10.0, 3 * 3600.0
    rng = _CountingRandom(5)
    walls = [simulated_wall_time_s(work, tau, delta, m, rng, exact_segments=1_000) for _ in range(20)]
    assert rng.draws < 20 * 1_100
    assert statistics.fmean(walls) == pytest.approx(reliability.expected_wall_time_s(work, tau, delta, m), rel=1e-3)


def test_grad_accumulation_equals_the_big_batch_and_shrinks_activations() -> None:
    m = run_probe("grad-accumulation", {"batch": 32, "micro_batches": 4, "hidden": 64, "layers": 2}).metrics
    assert set(m) <= set(get_probe("grad-accumulation").metrics)
    assert m["grad_rel_difference"] < 1e-5
    assert m["undivided_grad_ratio"] == pytest.approx(4.0, rel=1e-5)
    assert m["activation_ratio"] == pytest.approx(1 / 4, rel=0.02)
    with pytest.raises(UserError, match="multiple of micro_batches"):
        run_probe("grad-accumulation", {"batch": 10, "micro_batches": 4})


def test_the_undivided_row_does_not_call_the_adam_error_a_learning_rate() -> None:
    """Adam's update is normalised (Kingma and Ba 2015 §2.1): a k-times gradient is a k-times step
    under SGD only, and the row's note must say so rather than 'an effective learning rate'."""
    rows = run_probe("grad-accumulation", {"batch": 8, "micro_batches": 2, "hidden": 16, "layers": 1}).rows
    [undivided] = [row for row in rows if "without dividing" in row.label]
    assert "learning rate k times" not in undivided.note
    assert "SGD" in undivided.note and "Adam" in undivided.note and "clipping" in undivided.note


def test_fp64_cost_reports_speed_and_sum_errors() -> None:
    m = run_probe("fp64-cost", {"size": 128, "count": 100_000, "budget_s": 0.6}).metrics
    assert m["tflops_fp32"] > 0 and m["tflops_fp64"] > 0 and m["bytes_ratio"] == 2
    assert m["speedup_fp32_over_fp64"] == pytest.approx(m["tflops_fp32"] / m["tflops_fp64"])
    assert m["sum_rel_error_fp64"] < 1e-12 < m["sum_rel_error_fp32"]


def test_checkpoint_interval_uses_the_measured_write_rate(tmp_path) -> None:
    result = run_probe("checkpoint-interval", {"model": "gpt2", "size_mb": 4, "work_hours": 20, "runs": 3,
                                               "mtbf_hours": 2.0, "budget_s": 1.0})
    m = result.metrics
    assert set(m) <= set(get_probe("checkpoint-interval").metrics)
    assert m["young_interval_s"] == pytest.approx(math.sqrt(2 * m["write_s"] * 7200))
    assert m["daly_interval_s"] == pytest.approx(reliability.daly_interval_s(m["write_s"], 7200))
    assert 0 < m["daly_waste_fraction"] < 1
