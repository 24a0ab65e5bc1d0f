"""Suites: budget split, progress order, failure isolation, cancellation from another thread."""

from __future__ import annotations

import threading
import time

import pytest

from tutor.bench.suite import BenchCase, Progress, case_budgets, default_kinds, plan_suite, run_suite

from tests.machines import recorded_machine


class Result:
    def __init__(self, name: str) -> None:
        self.name = name

    def to_json(self) -> dict:
        return {"kind": "test", "name": self.name}


def recording_case(name: str, weight: float, budgets: list[float]) -> BenchCase:
    def run(budget: float, cancel: threading.Event | None) -> list[Result]:
        budgets.append(budget)
        return [Result(name)]

    return BenchCase(name=name, kind="test", weight=weight, run=run)


def test_budget_is_split_by_weight() -> None:
    assert case_budgets([1, 1, 2], 20.0) == [5.0, 5.0, 10.0]
    with pytest.raises(ValueError):
        case_budgets([0, 0], 1.0)


def test_cases_get_their_share_and_progress_is_reported_in_order() -> None:
    now = {"t": 0.0}
    budgets: list[float] = []

    def half_of_its_share(name: str, weight: float) -> BenchCase:
        def run(budget: float, cancel: threading.Event | None) -> list[Result]:
            budgets.append(budget)
            now["t"] += budget / 2
            return [Result(name)]

        return BenchCase(name=name, kind="test", weight=weight, run=run)

    events: list[Progress] = []
    cases = [half_of_its_share("a", 1), half_of_its_share("b", 1), half_of_its_share("c", 2)]
    outcome = run_suite(cases, budget_s=8.0, progress=events.append, clock=lambda: now["t"])
    assert [r.name for r in outcome.results] == ["a", "b", "c"]
    # a: 8 x 1/4 = 2, uses 1; b: 7 x 1/3; c gets all that is left, 7 - 7/6.
    assert budgets == pytest.approx([2.0, 7 / 3, 7 - 7 / 6])
    assert outcome.elapsed_s == pytest.approx(1.0 + 7 / 6 + (7 - 7 / 6) / 2)
    assert [(e.case, e.state) for e in events] == [(n, s) for n in "abc" for s in ("start", "done")]
    assert events[-1].fraction == 1.0
    assert outcome.to_json() == [{"kind": "test", "name": n} for n in "abc"]


def test_a_failing_case_costs_only_its_own_results() -> None:
    def broken(budget: float, cancel: threading.Event | None) -> list[Result]:
        raise RuntimeError("out of memory\nsecond line")

    budgets: list[float] = []
    outcome = run_suite([BenchCase("bad", "test", 1, broken), recording_case("good", 1, budgets)], budget_s=1.0)
    assert [r.name for r in outcome.results] == ["good"]
    assert outcome.failures == ("bad: RuntimeError: out of memory",)


def test_rejects_a_non_positive_budget() -> None:
    with pytest.raises(ValueError):
        run_suite([], budget_s=0)


def test_cancel_from_another_thread_stops_promptly_and_keeps_finished_results() -> None:
    from tutor.bench.timing import time_case

    ticks: list[int] = []
    ticking_started = threading.Event()

    def tick() -> None:
        ticks.append(1)
        if len(ticks) == 2:  # the first timed iteration (after one warm-up call)
            ticking_started.set()
        time.sleep(0.01)

    def ticking(budget: float, cancel: threading.Event | None) -> list[Result]:
        time_case(tick, iters=100_000, cancel=cancel)
        return [Result("ticking")]

    budgets: list[float] = []
    cases = [recording_case("first", 1, budgets), BenchCase("ticking", "test", 1, ticking),
             recording_case("never", 1, budgets)]
    cancel = threading.Event()
    canceller = threading.Thread(target=lambda: ticking_started.wait() and cancel.set())
    canceller.start()
    outcome = run_suite(cases, budget_s=600.0, cancel=cancel)
    canceller.join()
    assert outcome.cancelled
    assert [r.name for r in outcome.results] == ["first", "ticking"]
    assert budgets == [pytest.approx(200.0, rel=0.01)]
    assert len(ticks) < 10_000  # it stopped soon after the cancel: all 100,000 iterations would take 1000 s


@pytest.mark.slow
def test_real_matmul_case_can_be_cancelled_mid_sweep() -> None:
    machine = recorded_machine()
    cases = plan_suite(("matmul",), device="cpu", machine=machine, dtypes=("fp32", "bf16", "fp16"))
    cancel = threading.Event()
    events: list[Progress] = []

    def cancel_when_bf16_starts(event: Progress) -> None:  # cancel on a signal, not a timer
        events.append(event)
        if event.case == "matmul bf16" and event.state == "start":
            cancel.set()

    # A busy machine never reaches a plateau, so fp32 takes its whole share: keep the budget small.
    outcome = run_suite(cases, budget_s=6.0, cancel=cancel, progress=cancel_when_bf16_starts)
    assert outcome.cancelled
    # Every run with fp32 first times one fixed square (tutor.bench.suite), so two runs always compare.
    assert [(e.case, e.state) for e in events] == [("matmul fp32 1024²", "start"), ("matmul fp32 1024²", "done"),
                                                  ("matmul fp32", "start"), ("matmul fp32", "done"),
                                                  ("matmul bf16", "start"), ("matmul bf16", "cancelled")]
    dtypes = {result.dtype for result in outcome.results}
    assert "fp32" in dtypes  # what finished before the cancel is kept
    assert dtypes == {"fp32"}  # bf16 stopped before its first shape (its share would have measured some)
    for result in outcome.results:  # whatever finished is a complete result
        assert result.tflops_median > 0


def test_plan_orders_fp32_first_and_default_kinds() -> None:
    machine = recorded_machine()
    cases = plan_suite(("matmul", "bandwidth", "collective"), device="cpu", machine=machine,
                       dtypes=("bf16", "fp32"), ranks=2)
    # The fixed-size fp32 square comes first: short, and the one figure every two runs compare at one size.
    # Then each dtype's matrix-vector products (a decode step's matmuls, which `time` reads for inference).
    assert [c.name for c in cases] == ["matmul fp32 1024²", "matmul fp32", "matmul bf16", "decode matmul fp32",
                                       "decode matmul bf16", "bandwidth", "elementwise functions", "attention kernel",
                                       "collective x2"]
    assert [c.name for c in plan_suite(("matmul",), device="cpu", machine=machine, dtypes=("bf16",))] == [
        "matmul bf16", "decode matmul bf16"]
    # On CUDA the kernel launch costs too (the eager and graphs engines).
    on_gpu = [c.name for c in plan_suite(("matmul",), device="cuda:0", machine=machine, dtypes=("bf16",))]
    assert on_gpu == ["matmul bf16", "decode matmul bf16", "kernel launch"]
    assert default_kinds("cpu", ranks=None) == ("matmul", "bandwidth")
    assert default_kinds("cpu", ranks=2) == ("matmul", "bandwidth", "collective")
