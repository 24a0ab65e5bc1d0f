"""moe-alltoall: route real batches over expert-parallel ranks and count what the all-to-all moves.

Each of `ep` ranks holds experts/ep whole experts and routes its own `tokens` tokens with the top-k
router of tutor.labs.moe_routing (random logits, optionally skewed toward low-numbered experts).
Every (token, chosen expert) pair whose expert lives on another rank sends the token's hidden
vector there (dispatch) and gets the result back (combine): the bytes each rank sends are counted
from those routing decisions, beside tutor.theory.parallel.expert_parallel_alltoall_bytes (uniform
routing, (ep-1)/ep of the k·tokens·h values leave the rank). The busiest rank's incoming tokens
over the mean is the load imbalance in hardware: every rank waits for it. Sending a token once per
destination rank rather than once per expert (what DeepSeek-V3's dispatch does) is counted too.
No bytes cross a wire here: the collective probe times a real link.
"""

from __future__ import annotations

import math
import random
import threading
import time

from tutor.errors import UserError
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe
from tutor.labs.moe_routing import CALIBRATION_TOKENS, route
from tutor.formatting import format_bytes, format_duration, format_durations_apart, format_quantity

BYTES_PER_VALUE = 2  # BF16 activations, as the theory's default


def _check_step_time(params: dict, bias: list[float]) -> None:
    """Refuse when the first step, which always runs whole (ep ranks x tokens routings), would outlast
    budget_s. Routing is Python, not FLOPs: its cost is timed on a sample here, as moe-routing does."""
    sample = min(params["tokens"] * params["ep"], CALIBRATION_TOKENS)
    rng = random.Random(params["seed"] + 1)
    start = time.perf_counter()
    for _ in range(sample):
        route([rng.gauss(0.0, 1.0) + b for b in bias], params["top_k"])
    per_token = (time.perf_counter() - start) / sample
    step_s = per_token * params["tokens"] * params["ep"]
    if step_s > params["budget_s"]:
        step_text, budget_text = format_durations_apart(step_s, params["budget_s"])
        raise UserError(f"moe-alltoall: one step of {params['ep']:,} ranks x {params['tokens']:,} tokens over "
                        f"{params['experts']:,} experts takes about {step_text} here "
                        f"({format_duration(per_token)} a token, timed on {sample}), more than budget_s="
                        f"{budget_text}; lower tokens, ep or experts, or raise budget_s")


def _moe_alltoall(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.theory.parallel import expert_parallel_alltoall_bytes, experts_per_rank

    tokens, experts, top_k, ep = params["tokens"], params["experts"], params["top_k"], params["ep"]
    hidden, skew = params["hidden"], params["skew"]
    if top_k > experts:
        raise UserError(f"moe-alltoall: top_k {top_k} exceeds the {experts} experts (use top_k <= {experts})")
    local = experts_per_rank(experts, ep)  # a UserError when ep does not divide the experts
    rng = random.Random(params["seed"])
    bias = [-skew * math.log(i + 1) for i in range(experts)]
    _check_step_time(params, bias)
    deadline = time.perf_counter() + params["budget_s"]
    sent_pairs = [0] * ep  # (token, expert) pairs leaving each source rank
    sent_dedup = [0] * ep  # tokens leaving each source rank, once per destination rank
    received = [0] * ep  # (token, expert) pairs arriving at each rank, its own included
    expert_load = [0] * experts
    steps = 0
    cancelled = False
    for step in range(params["steps"]):
        if cancel.is_set():
            cancelled = True
            break
        if steps and time.perf_counter() > deadline:
            break
        progress(step / params["steps"], f"routing step {step + 1}")
        for source in range(ep):
            for _ in range(tokens):
                chosen, _probs = route([rng.gauss(0.0, 1.0) + b for b in bias], top_k)
                destinations = {expert // local for expert in chosen}
                for expert in chosen:
                    expert_load[expert] += 1
                    received[expert // local] += 1
                    if expert // local != source:
                        sent_pairs[source] += 1
                sent_dedup[source] += len(destinations - {source})
        steps += 1
    if not steps:
        return ProbeResult("moe-alltoall", (), {}, "cancelled before the first step", True, "cpu")
    vector = hidden * BYTES_PER_VALUE
    # dispatch + combine: the same vectors go out and come back
    measured = 2 * vector * sum(sent_pairs) / (ep * steps)
    dedup = 2 * vector * sum(sent_dedup) / (ep * steps)
    theory = expert_parallel_alltoall_bytes(tokens, hidden, top_k, ep, BYTES_PER_VALUE)
    mean_received = sum(received) / ep
    mean_load = sum(expert_load) / experts
    metrics = {
        "alltoall_bytes_per_rank": measured,
        "theory_alltoall_bytes_per_rank": float(theory),
        "measured_over_theory": measured / theory if theory else 0.0,
        "dedup_bytes_per_rank": dedup,
        "dedup_saving": 1 - dedup / measured if measured else 0.0,
        "busiest_rank_over_mean": max(received) / mean_received,
        "busiest_expert_over_mean": max(expert_load) / mean_load,
        "steps": float(steps),
    }
    theory_source = "2 · (ep−1)/ep · tokens · k · h · 2 B, uniform routing"
    rows = [
        Measurement(f"bytes each rank sends per MoE layer, forward (dispatch + combine), mean of {steps} steps",
                    measured, "B", float(theory), theory_source,
                    f"{ep} ranks x {local} experts, {tokens} tokens per rank, top-{top_k}, h = {hidden}, BF16"),
        Measurement("the same, sending each token once per destination rank", dedup, "B", float(theory),
                    theory_source, "a token whose k experts share a rank crosses the link once"),
        Measurement("busiest rank's incoming tokens over the mean", metrics["busiest_rank_over_mean"], "x", 1.0,
                    "every rank equal under uniform routing", "the all-to-all and the experts wait for this rank"),
        Measurement("busiest expert's tokens over the mean", metrics["busiest_expert_over_mean"], "x", 1.0,
                    "k·T/E per expert under uniform routing"),
    ]
    progress(1.0, "done")
    summary = (f"{format_bytes(measured)} per rank per layer measured vs {format_bytes(theory)} uniform theory; "
               f"busiest rank {format_quantity(metrics['busiest_rank_over_mean'], 'x')} the mean")
    return ProbeResult(probe="moe-alltoall", rows=tuple(rows), metrics=metrics, summary=summary,
                       cancelled=cancelled, device="cpu")


MOE_ALLTOALL = make_probe(
    name="moe-alltoall",
    title="Expert-parallel all-to-all volume",
    description="Routes each rank's tokens with a top-k router over experts spread across ep ranks and counts the "
                "bytes dispatch and combine send, the busiest rank and expert, beside the uniform-routing formula.",
    needs_torch=False,
    params=(
        Param("tokens", "int", 256, "tokens per rank per step", minimum=1, maximum=100_000),
        Param("experts", "int", 64, "routed experts E", minimum=1, maximum=1024),
        Param("top_k", "int", 8, "experts per token k", minimum=1, maximum=1024),
        Param("ep", "int", 8, "expert-parallel ranks", minimum=1, maximum=1024),
        Param("hidden", "int", 7168, "hidden size h (DeepSeek-V3: 7168)", minimum=1, maximum=65536),
        Param("skew", "float", 0.0, "router popularity bias (0 = uniform)", minimum=0.0, maximum=10.0),
        Param("steps", "int", 4, "steps routed", minimum=1, maximum=10_000),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(3.0),
    ),
    metrics=("alltoall_bytes_per_rank", "theory_alltoall_bytes_per_rank", "measured_over_theory",
             "dedup_bytes_per_rank", "dedup_saving", "busiest_rank_over_mean", "busiest_expert_over_mean", "steps"),
    body=_moe_alltoall,
)
