"""Benchmark suites with a time budget, progress reporting and cancellation.

A suite is a list of cases; `run_suite` gives each case its share of what is left of the budget
(by weight), reports progress through one callback (the CLI draws Rich bars from it, the Textual
app will post messages from it), and stops between iterations when the cancel event is set,
keeping every result that finished.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tutor.hardware.machine import Machine

QUICK_BUDGET_S = 18.0  # `bench --quick` must finish in 30 s on 2 cores, start-up included
DEFAULT_BUDGET_S = 60.0
SUITE_KINDS = ("matmul", "bandwidth", "transfer", "collective")


@dataclass(frozen=True)
class Progress:
    """One progress report: case `index` of `total` changed `state` ("start", "done", "failed",
    "cancelled"); `fraction` of the suite is finished."""

    case: str
    index: int
    total: int
    state: str
    fraction: float
    message: str = ""


ProgressCallback = Callable[[Progress], None]


@dataclass(frozen=True)
class BenchCase:
    """A named measurement: run(budget_s, cancel) returns result dataclasses (each has to_json)."""

    name: str
    kind: str
    weight: float
    run: Callable[[float, threading.Event | None], Sequence[Any]]


@dataclass(frozen=True)
class SuiteResult:
    results: tuple[Any, ...]
    cancelled: bool
    failures: tuple[str, ...]
    budget_s: float
    elapsed_s: float

    def to_json(self) -> list[dict[str, Any]]:
        return [result.to_json() for result in self.results]


def case_budgets(weights: Sequence[float], budget_s: float) -> list[float]:
    """Budget of each case if every case used exactly its share: budget x weight / total weight."""
    total = sum(weights)
    if total <= 0:
        raise ValueError("case weights must sum to a positive number")
    return [budget_s * weight / total for weight in weights]


def run_suite(cases: Sequence[BenchCase], *, budget_s: float, progress: ProgressCallback | None = None,
              cancel: threading.Event | None = None, clock: Callable[[], float] = time.perf_counter) -> SuiteResult:
    """Run `cases` in order within `budget_s`. Each case gets the remaining budget times its weight
    over the remaining weights, so time a case leaves unused goes to the ones after it. A failing
    case costs its own results only (reported in `failures`); a set `cancel` stops the suite."""
    if budget_s <= 0:
        raise ValueError(f"budget must be positive, got {budget_s}")
    start = clock()
    results: list[Any] = []
    failures: list[str] = []
    cancelled = False
    total = len(cases)

    def report(case: BenchCase, index: int, state: str, message: str = "") -> None:
        if progress is not None:
            finished = index + (0 if state == "start" else 1)
            progress(Progress(case=case.name, index=index, total=total, state=state,
                              fraction=finished / total if total else 1.0, message=message))

    for index, case in enumerate(cases):
        if cancel is not None and cancel.is_set():
            cancelled = True
            break
        remaining = budget_s - (clock() - start)
        weight_left = sum(c.weight for c in cases[index:])
        share = max(remaining * case.weight / weight_left, 0.05)
        report(case, index, "start")
        try:
            case_results = list(case.run(share, cancel))
        except Exception as error:  # noqa: BLE001 - guards the suite's table/Bench screen: one broken case
            # (any error from torch, a BLAS or a rank) is a failure line and must not cost the others
            detail = str(error).splitlines()[0] if str(error) else ""
            failures.append(f"{case.name}: {type(error).__name__}: {detail}".rstrip(": "))
            report(case, index, "failed", failures[-1])
            continue
        results.extend(case_results)
        if cancel is not None and cancel.is_set():
            cancelled = True
            report(case, index, "cancelled")
            break
        report(case, index, "done")
    return SuiteResult(results=tuple(results), cancelled=cancelled, failures=tuple(failures),
                       budget_s=budget_s, elapsed_s=clock() - start)


def default_kinds(device: str, *, ranks: int | None) -> tuple[str, ...]:
    """What a bare `bench` runs: matmul and bandwidth everywhere, transfers when the device is a
    GPU, collectives only when --ranks was given or the machine has 2+ GPUs (on a CPU box the gloo
    demo measures loopback and memory, and spawning ranks costs seconds of start-up)."""
    kinds = ["matmul", "bandwidth"]
    if device.startswith("cuda"):
        kinds.append("transfer")
        from tutor.bench.environment import cuda_device_count

        if ranks is not None or cuda_device_count() >= 2:
            kinds.append("collective")
    elif ranks is not None:
        kinds.append("collective")
    return tuple(kinds)


def plan_suite(kinds: Sequence[str], *, device: str, machine: Machine, dtypes: Sequence[str],
               ranks: int | None = None, quick: bool = False, ops: Sequence[str] | None = None,
               sizes: Sequence[int] | None = None) -> list[BenchCase]:
    """The cases for `kinds` on `device`: with fp32, the fixed-size fp32 square first
    (tutor.bench.matmul.fixed_size_matmul); one matmul sweep per dtype (fp32 first: the bf16/fp16
    notes compare with it), one bandwidth case, one transfer case, one collective case."""
    from tutor.bench.bandwidth import host_device_transfer, memory_bandwidth
    from tutor.bench.collective import COLLECTIVE_OPS, DEFAULT_SIZES, QUICK_SIZES, collective_bandwidth
    from tutor.bench.matmul import fixed_matmul_size, fixed_size_matmul, matmul_throughput

    cases: list[BenchCase] = []
    fp32_seen: dict[str, float] = {}

    def matmul_case(dtype: str) -> BenchCase:
        def run(budget: float, cancel: threading.Event | None) -> list[Any]:
            results = matmul_throughput(device, dtype, budget_s=budget, machine=machine, cancel=cancel,
                                        fp32_tflops=fp32_seen.get("fp32"))
            if dtype == "fp32" and results:
                fp32_seen["fp32"] = max(r.tflops_median for r in results)
            return results

        two_backends = device == "cpu" and dtype == "fp32"
        return BenchCase(name=f"matmul {dtype}", kind="matmul", weight=1.4 if two_backends else 1.0, run=run)

    if "matmul" in kinds:
        if "fp32" in dtypes:  # first: short, and the figure every two runs compare at the same size
            size = fixed_matmul_size(device)
            cases.append(BenchCase(
                name=f"matmul fp32 {size}²", kind="matmul", weight=0.3,
                run=lambda budget, cancel: fixed_size_matmul(device, "fp32", budget_s=budget, machine=machine,
                                                            cancel=cancel)))
        ordered = sorted(dtypes, key=lambda name: name != "fp32")
        cases.extend(matmul_case(dtype) for dtype in ordered)
        # A decode step's matmuls are matrix-vector products, and on a GPU its kernels are launched one by one:
        # what `time` needs for inference beyond the square sweep (tutor.bench.decode_gemm).
        from tutor.bench.decode_gemm import decode_matmul_bandwidth, launch_costs

        def decode_case(dtype: str) -> BenchCase:
            return BenchCase(name=f"decode matmul {dtype}", kind="matmul", weight=0.2,
                             run=lambda budget, cancel: decode_matmul_bandwidth(device, dtype, budget_s=budget,
                                                                                cancel=cancel))

        cases.extend(decode_case(dtype) for dtype in ordered if dtype in ("fp32", "bf16", "fp16"))
        if device.startswith("cuda"):
            cases.append(BenchCase(name="kernel launch", kind="matmul", weight=0.1,
                                   run=lambda budget, cancel: [launch_costs(device)]))
    if "bandwidth" in kinds:
        cases.append(BenchCase(
            name="bandwidth", kind="bandwidth", weight=2.0,
            run=lambda budget, cancel: memory_bandwidth(device, budget_s=budget, machine=machine, cancel=cancel)))
        if device == "cpu" and "matmul" in kinds:
            # A run of this CPU's ceilings (bare bench, --quick, the app's Bench) also measures what `time` needs for
            # an elementwise kernel beyond its bytes (tutor.bench.elementwise, ~0.2 s); `bench bandwidth` stays STREAM.
            from tutor.bench.elementwise import elementwise_rates

            cases.append(BenchCase(name="elementwise functions", kind="bandwidth", weight=0.1,
                                   run=lambda budget, cancel: elementwise_rates(device)))
            # and the causal attention kernel's rate by sequence length (tutor.bench.attention, ~0.5 s)
            from tutor.bench.attention import attention_rates

            cases.append(BenchCase(name="attention kernel", kind="matmul", weight=0.2,
                                   run=lambda budget, cancel: attention_rates(device)))
    if "transfer" in kinds:
        cases.append(BenchCase(
            name="transfer", kind="transfer", weight=1.0,
            run=lambda budget, cancel: host_device_transfer(device, budget_s=budget, machine=machine, cancel=cancel)))
    if "collective" in kinds:
        world = ranks if ranks is not None else 2
        chosen_sizes = tuple(sizes) if sizes else QUICK_SIZES if quick else DEFAULT_SIZES
        chosen_ops = tuple(ops) if ops else COLLECTIVE_OPS
        if world > 1:  # too many local ranks: one UserError line (exit 2) before anything is measured
            from tutor.bench.memory import collective_buffer_bytes
            from tutor.bench.ranks import DEFAULT_MEMORY_PER_RANK, check_local_ranks, choose_backend

            check_local_ranks(world, backend=choose_backend(world),
                              memory_per_rank_bytes=DEFAULT_MEMORY_PER_RANK + collective_buffer_bytes(max(chosen_sizes),
                                                                                                      world))
        cases.append(BenchCase(
            name=f"collective x{world}", kind="collective", weight=1.5,
            run=lambda budget, cancel: collective_bandwidth(ranks=world, budget_s=budget, ops=chosen_ops,
                                                            sizes=chosen_sizes, cancel=cancel)))
    return cases
