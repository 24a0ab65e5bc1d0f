"""moe-routing: a random top-k router, pure Python, against tutor.theory.moe.

Each token gets router logits: standard normal noise plus a popularity bias −skew·ln(i+1) for
expert i (skew 0 is a uniform router; larger skew favours low-numbered experts, the imbalance
a load-balancing loss fights). Top-k of the logits picks the experts; the softmax gives the router
probabilities. Over many batches of `tokens` tokens we count distinct experts touched (what
decides how many experts' weights a step must read), tokens per expert, the Switch Transformer
auxiliary loss, and the tokens dropped at a capacity factor.
"""

from __future__ import annotations

import math
import random
import threading
import time

from tutor.errors import UserError
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe
from tutor.formatting import format_duration, format_durations_apart, format_number

# Rows listing each expert's share are shown for at most this many experts.
MAX_EXPERT_ROWS = 16
MAX_ROUTED = 20_000_000  # tokens x trials x experts: beyond this the budget, not the work, would end the run
PROGRESS_EVERY = 64
CHECK_EVERY_TOKENS = 256  # the cancel event and the deadline are also looked at inside a batch
CALIBRATION_TOKENS = 64


def route(logits: list[float], top_k: int) -> tuple[list[int], list[float]]:
    """(the top_k expert indices by logit, the softmax probabilities over all experts)."""
    peak = max(logits)
    weights = [math.exp(value - peak) for value in logits]
    total = math.fsum(weights)
    chosen = sorted(range(len(logits)), key=logits.__getitem__, reverse=True)[:top_k]
    return chosen, [weight / total for weight in weights]


def _check_batch_time(params: dict, bias: list[float]) -> None:
    """Route a sample of tokens, time it, and refuse when one whole batch would outlast budget_s:
    the budget is checked between batches, and a batch cut short cannot be counted."""
    sample = min(params["tokens"], CALIBRATION_TOKENS)
    rng = random.Random(params["seed"] + 1)
    start = time.perf_counter()
    for _ in range(sample):
        route([rng.gauss(0.0, 1.0) + b for b in bias], params["top_k"])
    per_token = (time.perf_counter() - start) / sample
    batch_s = per_token * params["tokens"]
    if batch_s > params["budget_s"]:
        batch_text, budget_text = format_durations_apart(batch_s, params["budget_s"])
        raise UserError(f"moe-routing: one batch of {params['tokens']:,} tokens over {params['experts']:,} experts "
                        f"takes about {batch_text} here ({format_duration(per_token)} a token, timed on {sample}), "
                        f"more than budget_s={params['budget_s']:g} ({budget_text}); lower tokens or experts, "
                        "or raise budget_s")


def _moe_routing(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.theory.moe import (
        expected_distinct_experts_touched,
        expert_capacity,
        experts_active_fraction,
        load_balancing_loss,
        tokens_dropped,
    )

    tokens, experts, top_k = params["tokens"], params["experts"], params["top_k"]
    trials, skew = params["trials"], params["skew"]
    if top_k > experts:
        raise UserError(f"moe-routing: top_k {top_k} exceeds the {experts} experts (use top_k <= {experts})")
    if tokens * trials * experts > MAX_ROUTED:
        raise UserError(f"moe-routing: tokens x trials x experts = {tokens * trials * experts:,} is above "
                        f"{MAX_ROUTED:,}; lower trials or tokens")
    deadline = time.perf_counter() + params["budget_s"]
    rng = random.Random(params["seed"])
    bias = [-skew * math.log(i + 1) for i in range(experts)]
    capacity = expert_capacity(tokens, experts, top_k, params["capacity_factor"])
    counts = [0] * experts
    prob_sums = [0.0] * experts
    distinct: list[int] = []
    dropped = processed = 0
    cancelled = False
    _check_batch_time(params, bias)
    for trial in range(trials):
        if cancel.is_set():
            cancelled = True
            break
        if distinct and time.perf_counter() > deadline:
            break
        if trial % PROGRESS_EVERY == 0:
            progress(trial / trials, f"routing batch {trial + 1} of {trials}")
        touched: set[int] = set()
        loads = [0] * experts
        batch_probs = [0.0] * experts
        for token in range(tokens):
            if token % CHECK_EVERY_TOKENS == 0 and token and (
                    cancel.is_set() or distinct and time.perf_counter() > deadline):
                break  # a batch cut short is not counted: its statistics are of another batch size
            chosen, probs = route([rng.gauss(0.0, 1.0) + b for b in bias], top_k)
            touched.update(chosen)
            for expert in chosen:
                loads[expert] += 1
            for expert, p in enumerate(probs):
                batch_probs[expert] += p
        else:
            for expert, p in enumerate(batch_probs):
                prob_sums[expert] += p
        if sum(loads) < tokens * top_k:
            cancelled = cancel.is_set()
            break
        for expert, load in enumerate(loads):
            counts[expert] += load
        outcome = tokens_dropped(loads, capacity)
        dropped += outcome.dropped
        processed += outcome.processed
        distinct.append(len(touched))
    batches = len(distinct)
    routed_tokens = batches * tokens
    if not batches:
        return ProbeResult("moe-routing", (), {}, "cancelled before the first batch", True, "cpu")
    fractions = [count / routed_tokens for count in counts]  # sum to k (HF Mixtral's convention)
    mean_probs = [total / routed_tokens for total in prob_sums]
    loss = load_balancing_loss(fractions, mean_probs, experts)
    uniform_loss = load_balancing_loss([float(experts_active_fraction(top_k, experts))] * experts,
                                       [1 / experts] * experts, experts)
    theory_distinct = expected_distinct_experts_touched(tokens, top_k, experts)
    mean_load = top_k * routed_tokens / experts
    metrics = {
        "distinct_experts_mean": sum(distinct) / batches,
        "distinct_experts_theory": theory_distinct,
        "load_balancing_loss": loss,
        "load_balancing_loss_uniform": uniform_loss,
        "max_load_over_mean": max(counts) / mean_load,
        "drop_fraction": dropped / (dropped + processed) if dropped + processed else 0.0,
        "active_fraction": float(experts_active_fraction(top_k, experts)),
        "batches": float(batches),
    }
    rows = [
        Measurement(f"distinct experts touched by a batch of {tokens} token(s), mean of {batches}",
                    metrics["distinct_experts_mean"], "experts", theory_distinct,
                    "E·(1 − (1 − k/E)^T), uniform independent routing",
                    "" if skew == 0 else "a skewed router touches fewer experts than uniform routing"),
        Measurement("load-balancing loss N·Σ f_i·P_i", loss, "", uniform_loss,
                    "its value under perfectly uniform routing (Switch Transformers eq. 4, f summing to k)",
                    "above the uniform value means imbalance: the busiest experts also get the highest probabilities"),
        Measurement("busiest expert's tokens over the mean", metrics["max_load_over_mean"], "x", 1.0,
                    "a balanced router gives every expert k·T/E tokens"),
        Measurement(f"assignments dropped at capacity {capacity} per expert (factor {format_number(params['capacity_factor'])})",
                    metrics["drop_fraction"], "fraction", None, "",
                    "Switch §2.2: tokens over an expert's capacity skip the layer through the residual"),
        Measurement("share of experts each token uses (k/E)", metrics["active_fraction"], "fraction",
                    metrics["active_fraction"], "compute follows the active experts, memory all of them"),
    ]
    for expert in range(min(experts, MAX_EXPERT_ROWS)):
        rows.append(Measurement(f"expert {expert}: share of tokens", fractions[expert], "fraction",
                                top_k / experts, "k/E under uniform routing"))
    progress(1.0, "done")
    summary = (f"{batches} batches of {tokens} token(s), top-{top_k} of {experts}: "
               f"{format_number(metrics['distinct_experts_mean'])} experts touched on average (theory "
               f"{format_number(theory_distinct)} for a uniform router); balance loss {format_number(loss)} vs "
               f"{format_number(uniform_loss)} uniform")
    return ProbeResult(probe="moe-routing", rows=tuple(rows), metrics=metrics, summary=summary,
                       cancelled=cancelled, device="cpu")


MOE_ROUTING = make_probe(
    name="moe-routing",
    title="Mixture-of-experts routing",
    description="Routes random tokens with a top-k router (optionally skewed) and counts experts touched, "
                "tokens per expert, the load-balancing loss and dropped tokens, against the uniform-routing formulas.",
    needs_torch=False,
    params=(
        Param("tokens", "int", 4, "tokens per batch T", minimum=1, maximum=100_000),
        Param("experts", "int", 8, "routed experts E", minimum=1, maximum=1024),
        Param("top_k", "int", 2, "experts per token k", minimum=1, maximum=1024),
        Param("skew", "float", 0.0, "router popularity bias (0 = uniform)", minimum=0.0, maximum=10.0),
        Param("trials", "int", 400, "batches routed", minimum=1, maximum=100_000),
        Param("capacity_factor", "float", 1.25, "expert capacity factor", minimum=0.01, maximum=100.0),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(3.0),
    ),
    metrics=("distinct_experts_mean", "distinct_experts_theory", "load_balancing_loss", "load_balancing_loss_uniform",
             "max_load_over_mean", "drop_fraction", "active_fraction", "batches"),
    body=_moe_routing,
)
