"""checkpoint-interval: how often to checkpoint, from this disk's measured write speed.

Writes a real checkpoint (the checkpoint-write probe) to measure this machine's write rate, takes
the time delta to write `model`'s full training checkpoint at that rate, and the job's mean time
between failures M (default: Llama 3's 419 interruptions in 54 days, arXiv 2407.21783 §3.3.4).
Young's and Daly's optimum intervals come from tutor.theory.reliability. Then a run of
`work_hours` of computation is simulated with exponential failures at several intervals, and the
simulated waste is set beside Daly's expected waste: the optimum should sit at the bottom.
"""

from __future__ import annotations

import math
import random
import threading

from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe
from tutor.formatting import format_decimal_bytes, format_duration, format_number, format_percent, format_rate

# Interval multiples of Daly's optimum that the simulation tries.
MULTIPLES = (0.25, 0.5, 1.0, 2.0, 4.0)
LLAMA3_INTERRUPTIONS, LLAMA3_DAYS = 419, 54
SIMULATED_SEGMENTS_BUDGET = 2_000_000
"""Segments the whole lab simulates one by one (about 2 s of Python); a run with more segments than its share
has its whole segments summed from their exact mean and variance instead (reliability.segment_wall_time_moments,
the central limit theorem), so every run the limits allow (work_hours 1e5, runs 1,000) ends in bounded time."""


def simulated_wall_time_s(work_s: float, interval_s: float, write_s: float, mtbf_s: float,
                          rng: random.Random, restart_s: float = 0.0, exact_segments: int | None = None) -> float:
    """Wall time of one simulated run: segments of `interval_s` compute + `write_s` write; a
    failure (exponential, mean mtbf_s) inside a segment loses it and costs restart_s. Past `exact_segments`
    whole segments, their sum is drawn from a normal law with the segments' exact mean and variance."""
    from tutor.theory.reliability import segment_wall_time_moments

    wall = 0.0
    done = 0.0
    whole = math.floor(work_s / interval_s)
    if exact_segments is not None and whole > exact_segments:
        mean, variance = segment_wall_time_moments(interval_s + write_s, mtbf_s, restart_s)
        wall = max(whole * mean + math.sqrt(whole * variance) * rng.gauss(0.0, 1.0), whole * (interval_s + write_s))
        done = whole * interval_s
    while done < work_s:
        segment = min(interval_s, work_s - done) + write_s
        while True:
            failure = rng.expovariate(1 / mtbf_s)
            if failure >= segment:
                wall += segment
                break
            wall += failure + restart_s
        done += min(interval_s, work_s - done)
    return wall


def _checkpoint_interval(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.labs.checkpoint import CHECKPOINT_WRITE
    from tutor.theory import reliability

    write = CHECKPOINT_WRITE.run({"size_mb": params["size_mb"], "model": params["model"],
                                  "budget_s": max(params["budget_s"] / 2, 0.5)},
                                 lambda fraction, message: progress(fraction / 2, message), cancel)
    if write.cancelled or "model_checkpoint_write_s" not in write.metrics:
        return ProbeResult("checkpoint-interval", write.rows, dict(write.metrics), "cancelled", True, "cpu")
    delta = write.metrics["model_checkpoint_write_s"]
    mtbf = params["mtbf_hours"] * 3600
    young = reliability.young_interval_s(delta, mtbf)
    daly = reliability.daly_interval_s(delta, mtbf)
    metrics: dict[str, float] = {"write_gbps": write.metrics["write_gbps"], "write_s": delta, "mtbf_s": mtbf,
                                 "young_interval_s": young, "daly_interval_s": daly,
                                 "daly_waste_fraction": reliability.waste_fraction(daly, delta, mtbf)}
    rows = [Measurement(f"write {params['model']}'s checkpoint here", delta, "s",
                        note=f"{format_decimal_bytes(write.metrics['model_checkpoint_bytes'])} at the measured "
                             f"{format_rate(write.metrics['write_gbps'], 'GB/s')}"),
            Measurement("Young's interval sqrt(2 delta M)", None, "s", young, "Young 1974"),
            Measurement("Daly's interval", None, "s", daly, "Daly 2006, eq. 37")]
    rng = random.Random(params["seed"])
    work = params["work_hours"] * 3600
    best_multiple, best_waste = MULTIPLES[0], math.inf
    exact = max(1, SIMULATED_SEGMENTS_BUDGET // (params["runs"] * len(MULTIPLES)))
    for index, multiple in enumerate(MULTIPLES):
        if cancel.is_set():
            return ProbeResult("checkpoint-interval", tuple(rows), metrics, "cancelled", True, "cpu")
        progress(0.5 + index / (2 * len(MULTIPLES)), f"simulating an interval of {multiple:g} x Daly's")
        tau = daly * multiple
        wall = sum(simulated_wall_time_s(work, tau, delta, mtbf, rng, exact_segments=exact)
                   for _ in range(params["runs"])) / params["runs"]
        summed = math.floor(work / tau) > exact
        waste = 1 - work / wall
        theory = reliability.waste_fraction(tau, delta, mtbf)
        key = f"{multiple:g}".replace(".", "_")
        metrics[f"simulated_waste_x{key}"] = waste
        if waste < best_waste:
            best_multiple, best_waste = multiple, waste
        rows.append(Measurement(f"waste, checkpoint every {format_duration(tau)} ({format_number(multiple)} x Daly's)", waste,
                                "fraction", theory, "Daly 2006, eq. 13",
                                f"mean of {params['runs']:,} simulated runs of {format_duration(params['work_hours'] * 3600)} of work"
                                + (f" ({format_number(math.floor(work / tau))} segments a run, summed by the central "
                                   "limit theorem)" if summed else "")))
    metrics["best_simulated_multiple"] = float(best_multiple)
    progress(1.0, "done")
    summary = (f"writing a checkpoint takes {format_duration(delta)} at {format_rate(metrics['write_gbps'], 'GB/s')}, "
               f"a failure comes every {format_duration(mtbf)}: checkpoint every {format_duration(daly)} (Daly; Young "
               f"{format_duration(young)}), expected waste {format_percent(metrics['daly_waste_fraction'])}")
    return ProbeResult(probe="checkpoint-interval", rows=tuple(rows), metrics=metrics, summary=summary, device="cpu")


CHECKPOINT_INTERVAL = make_probe(
    name="checkpoint-interval",
    title="How often to checkpoint",
    description="Measures this disk's checkpoint write speed, derives Young's and Daly's optimum intervals for a "
                "model's checkpoint and a job's MTBF, and simulates a failing run at several intervals.",
    needs_torch=True,
    params=(
        Param("model", "text", "llama-3.1-8b", "a preset whose full training checkpoint is written"),
        Param("mtbf_hours", "float", LLAMA3_DAYS * 24 / LLAMA3_INTERRUPTIONS,
              "the job's mean time between failures, hours (default: Llama 3, 54 days / 419)",
              minimum=0.01, maximum=1e6),
        Param("size_mb", "float", 64.0, "size of the checkpoint actually written to measure the rate, MiB",
              minimum=1.0, maximum=2048.0),
        Param("work_hours", "float", 200.0, "hours of computation in each simulated run", minimum=1.0, maximum=1e5),
        Param("runs", "int", 20, "simulated runs per interval", minimum=1, maximum=1000),
        Param("seed", "int", 0, "random seed of the simulated failures", minimum=0),
        budget_param(5.0),
    ),
    metrics=("write_gbps", "write_s", "mtbf_s", "young_interval_s", "daly_interval_s", "daly_waste_fraction",
             "best_simulated_multiple") + tuple(f"simulated_waste_x{m:g}".replace(".", "_") for m in MULTIPLES),
    body=_checkpoint_interval,
)
