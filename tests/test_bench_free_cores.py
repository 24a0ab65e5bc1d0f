"""Waiting for free cores before a short CPU matmul (tutor.bench.free_cores)."""

from __future__ import annotations

import pytest

from tutor.bench.busy import BusyShare
from tutor.bench.free_cores import (FreeCores, cores_taken, free_thread_count, wait_for_free_cores)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def meters(shares: list[BusyShare]):
    """start_meter for wait_for_free_cores: each meter's stop() returns the next share."""
    pending = list(shares)

    class Meter:
        def stop(self) -> BusyShare:
            return pending.pop(0)

    return Meter, pending


def window(other_cores: float, interface_cores: float | None = None, *, cores: int = 2, seconds: float = 0.1) -> BusyShare:
    return BusyShare(window_s=seconds, cores=cores, other_cpu_s=other_cores * seconds, own_cpu_s=0.0,
                     interface_cpu_s=None if interface_cores is None else interface_cores * seconds)


def test_the_interface_counts_as_taken_cores_beside_other_processes():
    assert cores_taken(window(0.5, 0.25)) == pytest.approx(0.75)
    assert cores_taken(window(0.5)) == pytest.approx(0.5)
    assert cores_taken(BusyShare(window_s=0.0, cores=2, other_cpu_s=1.0, own_cpu_s=0.0)) == 0.0


@pytest.mark.parametrize(("cores", "taken", "threads"), [
    (2, 0.0, 2), (2, 0.49, 2), (2, 0.5, 1), (2, 1.4, 1), (2, 2.0, 1), (8, 2.6, 5), (1, 0.9, 1), (4, -0.1, 4)])
def test_a_core_counts_as_taken_from_half_of_it_used_and_one_thread_is_always_left(cores, taken, threads):
    assert free_thread_count(cores, taken) == threads


def test_the_wait_ends_at_the_first_quiet_window_with_every_core():
    clock = FakeClock()
    start_meter, pending = meters([window(1.2), window(0.6, 0.3), window(0.1, 0.05), window(1.5)])
    free = wait_for_free_cores(window_s=0.1, max_wait_s=2.0, start_meter=start_meter, sleep=clock.sleep, clock=clock)
    assert free == FreeCores(cores=2, threads=2, taken_cores=pytest.approx(0.15), waited_s=pytest.approx(0.3), quiet=True)
    assert len(pending) == 1  # the window after the quiet one was never looked at
    assert "waited 300 ms" in free.describe() and "threads" not in free.describe()


def test_on_a_machine_that_stays_busy_it_gives_up_and_uses_only_the_free_cores():
    clock = FakeClock()
    start_meter, _ = meters([window(1.0)] * 30)
    free = wait_for_free_cores(window_s=0.1, max_wait_s=0.5, start_meter=start_meter, sleep=clock.sleep, clock=clock)
    assert free.threads == 1 and not free.quiet and free.waited_s == pytest.approx(0.5)
    assert free.describe() == ("waited 500 ms for the cores to be free (they did not come free); "
                               "1 thread on 2 cores: other work used 1 of them when it started")


def test_quiet_at_once_says_nothing_and_a_cancel_ends_the_wait():
    clock = FakeClock()
    start_meter, _ = meters([window(0.0, 0.02)])
    free = wait_for_free_cores(window_s=0.1, start_meter=start_meter, sleep=clock.sleep, clock=clock)
    assert free.quiet and free.threads == 2 and free.describe() == ""
    start_meter, pending = meters([window(2.0)] * 5)
    free = wait_for_free_cores(window_s=0.1, start_meter=start_meter, sleep=clock.sleep, clock=clock,
                               cancelled=lambda: True)
    assert len(pending) == 4 and not free.quiet


def test_a_look_without_waiting_reads_one_window_however_busy_it_is():
    # What the matmul lab does after a sweep on fewer threads: are the cores free now?
    clock = FakeClock()
    start_meter, pending = meters([window(1.0), window(0.0)])
    busy = wait_for_free_cores(max_wait_s=0.0, window_s=0.1, start_meter=start_meter, sleep=clock.sleep, clock=clock)
    assert busy.threads == 1 and not busy.quiet and len(pending) == 1
    free = wait_for_free_cores(max_wait_s=0.0, window_s=0.1, start_meter=start_meter, sleep=clock.sleep, clock=clock)
    assert free.threads == 2 and free.quiet and pending == []


def test_a_figure_timed_again_on_the_cores_that_came_free_says_where_it_started_and_what_it_is():
    started = FreeCores(cores=2, threads=1, taken_cores=0.9, waited_s=2.0, quiet=False)
    assert started.describe(threads_used=2) == (
        "waited 2 s for the cores to be free (they did not come free); 1 thread on 2 cores at first (other work "
        "used 0.9 of them when it started); the figure is timed on 2 threads, once the cores came free")
    assert started.describe(threads_used=1) == started.describe() == (
        "waited 2 s for the cores to be free (they did not come free); 1 thread on 2 cores: other work used 0.9 "
        "of them when it started")


# ---- the matmul lab uses it -------------------------------------------------------------------------

def _result(device, dtype, rate, *, stable):
    from tutor.bench.matmul import MatmulResult, MatmulShape

    shape = MatmulShape(1024, 1024, 1024, rate, rate, 5, not stable, 0.02 if stable else 0.4)
    return MatmulResult(device, dtype, "fake", 1024, 1024, 1024, rate, rate, rate, None, None, "", 5, not stable,
                        shape.spread, (), sweep=(shape,), stable=stable)


def test_the_matmul_lab_sweeps_with_the_free_cores_threads_and_gives_every_thread_back(monkeypatch):
    import torch

    import tutor.bench.free_cores as free_cores
    import tutor.bench.matmul as bench_matmul
    from tutor.bench.timing import usable_cpu_count
    from tutor.labs import run_probe

    calls: list[dict] = []

    def fake(device, dtype, **kwargs):
        calls.append(kwargs)
        torch.set_num_threads(kwargs["threads"])  # what the real sweep does with it
        return [_result(device, dtype, 0.1, stable=True)]

    busy = FreeCores(cores=2, threads=1, taken_cores=1.2, waited_s=2.0, quiet=False)
    monkeypatch.setattr(free_cores, "wait_for_free_cores", lambda **kwargs: busy)
    monkeypatch.setattr(bench_matmul, "matmul_throughput", fake)
    result = run_probe("matmul", {"dtypes": ["fp32"], "budget_s": 0.3, "device": "cpu"})
    assert [call["threads"] for call in calls] == [1]
    assert torch.get_num_threads() == usable_cpu_count()
    row = next(row for row in result.rows if row.label.startswith("fp32 matmul"))
    assert "1 thread on 2 cores: other work used 1.2 of them when it started" in row.note
    assert "waited 2 s for the cores to be free (they did not come free)" in row.note
    assert result.to_json()["cores"] == busy.to_json()  # in the JSON and the results notebook too
    assert result.summary.splitlines()[0] == "100 GFLOP/s on fp32, 1 of 2 cores"  # the figure's cores, said first


def test_a_sweep_that_did_not_settle_is_swept_again_and_said_plainly_when_it_never_does(monkeypatch):
    import tutor.bench.free_cores as free_cores
    import tutor.bench.matmul as bench_matmul
    from tutor.labs import run_probe

    quiet = FreeCores(cores=2, threads=2, taken_cores=0.0, waited_s=0.15, quiet=True)
    monkeypatch.setattr(free_cores, "wait_for_free_cores", lambda **kwargs: quiet)
    outcomes = [_result("cpu", "fp32", 0.05, stable=False), _result("cpu", "fp32", 0.09, stable=True)]
    monkeypatch.setattr(bench_matmul, "matmul_throughput", lambda device, dtype, **kwargs: [outcomes.pop(0)])
    settled = run_probe("matmul", {"dtypes": ["fp32"], "budget_s": 0.3, "device": "cpu"})
    assert settled.metrics["tflops_fp32"] == 0.09 and outcomes == []  # the second sweep settled: its figure
    assert "could not get a stable timing" not in settled.summary

    outcomes[:] = [_result("cpu", "fp32", 0.06, stable=False), _result("cpu", "fp32", 0.05, stable=False)]
    never = run_probe("matmul", {"dtypes": ["fp32"], "budget_s": 0.3, "device": "cpu"})
    assert never.metrics["tflops_fp32"] == 0.06 and outcomes == []
    assert never.summary.startswith("60 GFLOP/s on fp32, 2 cores\nfp32 could not get a stable timing at any size, "
                                    "even swept twice: the figure is the best median it saw, and it may read low")


def test_cores_given_up_to_a_burst_that_ended_are_taken_back_and_the_all_core_timing_is_the_figure(monkeypatch):
    # A burst of other work during the wait left the lab on 1 thread (one core's rate,
    # 155-171 GFLOP/s against bench's ~300) although it ended during the sweep or before it.
    import tutor.bench.free_cores as free_cores
    import tutor.bench.matmul as bench_matmul
    from tutor.labs import run_probe

    busy_at_start = FreeCores(cores=2, threads=1, taken_cores=0.9, waited_s=2.0, quiet=False)
    looks: list[dict] = []

    def wait(**kwargs):
        looks.append(kwargs)
        return busy_at_start if len(looks) == 1 else after_the_sweep

    monkeypatch.setattr(free_cores, "wait_for_free_cores", wait)
    threads: list[int] = []
    outcomes = {1: 0.156, 2: 0.31}

    def fake(device, dtype, **kwargs):
        threads.append(kwargs["threads"])
        return [_result(device, dtype, outcomes[kwargs["threads"]], stable=True)]

    monkeypatch.setattr(bench_matmul, "matmul_throughput", fake)
    after_the_sweep = FreeCores(cores=2, threads=2, taken_cores=0.05, waited_s=0.15, quiet=True)
    regained = run_probe("matmul", {"dtypes": ["fp32"], "budget_s": 0.3, "device": "cpu"})
    assert threads == [1, 2] and len(looks) == 2 and looks[1]["max_wait_s"] == 0.0
    assert regained.metrics["tflops_fp32"] == 0.31
    assert regained.to_json()["headline"]["fp32"]["threads"] == 2
    row = next(row for row in regained.rows if row.label.startswith("fp32 matmul"))
    assert "the figure is timed on 2 threads, once the cores came free" in row.note

    threads.clear()
    looks.clear()
    after_the_sweep = FreeCores(cores=2, threads=1, taken_cores=1.0, waited_s=0.15, quiet=False)
    stayed = run_probe("matmul", {"dtypes": ["fp32"], "budget_s": 0.3, "device": "cpu"})
    assert threads == [1] and len(looks) == 2  # the other work went on: one thread is what this machine gives
    assert stayed.metrics["tflops_fp32"] == 0.156 and stayed.to_json()["headline"]["fp32"]["threads"] == 1
    row = next(row for row in stayed.rows if row.label.startswith("fp32 matmul"))
    assert "1 thread on 2 cores: other work used 0.9 of them when it started" in row.note
    assert "came free" not in row.note
