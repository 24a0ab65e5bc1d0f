"""speculative: greedy speculative decoding with a real draft and target (transformers Llamas).

A draft model proposes `draft_tokens` (γ) tokens one step at a time; the target reads all of them in
one forward pass and keeps the longest run it agrees with, plus one token of its own (the correction
at the first disagreement, or a bonus token when it agreed with all γ). The output is the target's
own greedy output, token for token: the lab checks it against plain decoding (Leviathan et al., ICML
2023, arXiv 2211.17192, §2.3; Chen et al., arXiv 2302.01318). Measured: the acceptance rate, tokens
per verification step and the speed-up, each beside tutor.theory.serving's Eq. (1) and Theorem 3.8
evaluated at the acceptance rate and draft cost measured here.

Random weights predict nothing, so a separately built draft would agree with the target by chance
only. The draft here is the target's own first `draft_layers` layers with its embedding and head
(a self-speculative draft: Zhang et al., "Draft & Verify", arXiv 2309.08168; Elhoushi et al.,
"LayerSkip", arXiv 2404.16710), and the target's later layers write into the residual stream scaled
by `refine`: a small refine makes them adjust what the first layers decided, as a trained model's
deeper layers mostly refine its prediction. The acceptance rate follows from that, and is measured.
"""

from __future__ import annotations

import statistics
import threading
import time

from tutor.formatting import format_duration, format_number, format_percent
from tutor.labs._params import Param, budget_param, device_param, make_probe, resolve_device
from tutor.labs.decode_engines import VOCAB
from tutor.labs.inference import keeping_torch_threads, without_transformers
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs.serving_latency import (
    MIN_ROUNDS,
    check_serving_lab_fits,
    forward_flops_per_token,
    build_model,
    check_shape,
    forward,
    model_params,
    new_cache,
    synchronizer,
)


def drop_last(cache, tokens: int) -> None:
    """Remove the last `tokens` positions from a transformers cache (rejected draft tokens)."""
    if tokens:
        cache.crop(-tokens)  # a negative length removes that many, in the 4.x and 5.x APIs alike


def plain_decode(model, config, prompt_ids, tokens: int, sync) -> tuple[list[int], float]:
    """The target's own greedy output after the prompt and the seconds per token it took."""
    cache = new_cache(config)
    token = forward(model, prompt_ids, cache, last_only=True)[:, -1:].argmax(dim=-1)
    out = [int(token)]
    sync()
    start = time.perf_counter()
    while len(out) < tokens:
        token = forward(model, token, cache)[:, -1:].argmax(dim=-1)
        out.append(int(token))
    sync()
    return out, (time.perf_counter() - start) / (tokens - 1)


def speculative_decode(target, target_config, draft, draft_config, prompt_ids, tokens: int, gamma: int, sync
                       ) -> tuple[list[int], dict[str, float]]:
    """Greedy speculative decoding until `tokens` tokens are out; the output and its counts.

    Both caches hold every token before `last` (the newest token out). Per round the draft reads `last`
    and its own proposals (γ steps), the target reads `last` and the γ proposals at once (one step),
    the agreed run n is kept with the target's next token, and each cache drops what was rejected."""
    import torch

    target_cache, draft_cache = new_cache(target_config), new_cache(draft_config)
    last = forward(target, prompt_ids, target_cache, last_only=True)[:, -1:].argmax(dim=-1)
    forward(draft, prompt_ids, draft_cache, last_only=True)
    out = [int(last)]
    counts = {"rounds": 0.0, "drafted": 0.0, "accepted": 0.0, "tested": 0.0, "verify_s": 0.0}
    sync()
    start = time.perf_counter()
    while len(out) < tokens:
        proposals = []
        token = last
        for _ in range(gamma):
            token = forward(draft, token, draft_cache)[:, -1:].argmax(dim=-1)
            proposals.append(token)
        sync()
        verify_start = time.perf_counter()
        checked = forward(target, torch.cat([last, *proposals], dim=1), target_cache).argmax(dim=-1)[0]
        sync()
        counts["verify_s"] += time.perf_counter() - verify_start
        drafted = [int(p) for p in proposals]
        agreed = 0
        while agreed < gamma and drafted[agreed] == int(checked[agreed]):
            agreed += 1
        counts["rounds"] += 1
        counts["drafted"] += gamma
        counts["accepted"] += agreed
        # Positions compared until the first disagreement: the estimate of α that treats each as a coin.
        counts["tested"] += agreed + (agreed < gamma)
        new = [*drafted[:agreed], int(checked[agreed])]
        drop_last(target_cache, gamma - agreed)  # keep last and the agreed run
        if agreed == gamma:
            forward(draft, proposals[-1], draft_cache)  # the draft never read its own last proposal
        else:
            drop_last(draft_cache, gamma - 1 - agreed)
        out.extend(new)
        last = checked[agreed].view(1, 1)
    sync()
    counts["seconds"] = time.perf_counter() - start
    counts["produced"] = float(len(out) - 1)
    return out[:tokens], counts


@keeping_torch_threads
def _speculative(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    if cancel.is_set():
        return ProbeResult("speculative", (), {}, "cancelled before the models were built", True, "cpu")
    import torch

    if (missing := without_transformers("speculative", "speculative decoding")) is not None:
        return missing
    from tutor.errors import UserError

    check_shape("speculative", params)
    if params["draft_layers"] >= params["layers"]:
        raise UserError(f"speculative: draft_layers ({params['draft_layers']}) must be fewer than the target's "
                        f"layers ({params['layers']})")
    device = resolve_device(params["device"])
    dtype = "fp32"  # greedy agreement must not hinge on BF16 rounding between one-token and batched reads
    prompt, tokens, gamma = params["prompt"], params["tokens"], params["draft_tokens"]
    context = prompt + tokens + gamma + 2
    flops = 4 * MIN_ROUNDS * context * forward_flops_per_token(params, context)
    check_serving_lab_fits("speculative", params, device, dtype, batch=1, context=context, flops=flops)
    if device == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(params["seed"])
    progress(0.05, "building the target and its draft")
    target, target_config = build_model(params, device, dtype, max_positions=context + 16)
    draft, draft_config = build_model(params, device, dtype, max_positions=context + 16,
                                      layers=params["draft_layers"])
    with torch.no_grad():
        for layer in target.model.layers[params["draft_layers"]:]:
            layer.self_attn.o_proj.weight.mul_(params["refine"])
            layer.mlp.down_proj.weight.mul_(params["refine"])
        kept = draft.state_dict()
        draft.load_state_dict({name: value for name, value in target.state_dict().items() if name in kept})
    prompt_ids = torch.randint(0, VOCAB, (1, prompt), device=device)
    sync = synchronizer(device)
    plain_s: list[float] = []
    draft_s: list[float] = []
    spec_s: list[float] = []
    totals = {"rounds": 0.0, "drafted": 0.0, "accepted": 0.0, "tested": 0.0, "produced": 0.0, "verify_s": 0.0}
    matches = True
    deadline = time.perf_counter() + params["budget_s"]
    with torch.no_grad():
        for round_ in range(MIN_ROUNDS + 9):  # round 0 warms up (first-call costs) and is not kept
            if cancel.is_set() or (round_ > MIN_ROUNDS and time.perf_counter() > deadline):
                break
            progress(0.1 + 0.85 * min(1.0, round_ / (MIN_ROUNDS + 1)), "plain, draft and speculative decoding in turns")
            reference, plain = plain_decode(target, target_config, prompt_ids, tokens, sync)
            _, drafting = plain_decode(draft, draft_config, prompt_ids, tokens, sync)
            out, counts = speculative_decode(target, target_config, draft, draft_config, prompt_ids, tokens, gamma,
                                             sync)
            matches = matches and out == reference
            if round_:
                plain_s.append(plain)
                draft_s.append(drafting)
                spec_s.append(counts["seconds"] / counts["produced"])
                for key in totals:
                    totals[key] += counts[key]
    if not plain_s:
        return ProbeResult("speculative", (), {}, "cancelled before a run was timed", True, device)
    from tutor.theory.serving import speculative_expected_tokens_per_step, speculative_speedup

    plain_tok, draft_tok, spec_tok = (statistics.median(s) for s in (plain_s, draft_s, spec_s))
    alpha = totals["accepted"] / totals["tested"] if totals["tested"] else 1.0
    cost = draft_tok / plain_tok
    per_step = totals["produced"] / totals["rounds"]
    # One verification's time over a plain step's (the theorem takes it as 1), from the timed runs' means.
    verify = (totals["verify_s"] / totals["rounds"]) / statistics.fmean(plain_s)
    metrics = {
        "acceptance_rate": alpha,
        "accepted_share": totals["accepted"] / totals["drafted"],
        "tokens_per_step": per_step,
        "theory_tokens_per_step": speculative_expected_tokens_per_step(alpha, gamma),
        "draft_cost": cost,
        "speedup": plain_tok / spec_tok,
        "theory_speedup": speculative_speedup(alpha, gamma, cost),
        "verify_cost": verify,
        "speedup_at_measured_verify": speculative_expected_tokens_per_step(alpha, gamma) / (gamma * cost + verify),
        "plain_token_s": plain_tok,
        "speculative_token_s": spec_tok,
        "matches_target": 1.0 if matches else 0.0,
    }
    where = "the CPU (one core)" if device == "cpu" else device
    rows = (
        Measurement("acceptance rate α: draft tokens the target agreed with, until its first disagreement",
                    alpha, "fraction", note=f"refine {format_number(params['refine'])}: how much the target's later "
                                            f"layers change the draft's prediction"),
        Measurement(f"tokens per verification step (γ = {gamma})", per_step, "tokens",
                    metrics["theory_tokens_per_step"], "(1 - α^(γ+1)) / (1 - α), Leviathan et al. Eq. (1)",
                    f"{format_number(totals['rounds'])} target steps for {format_number(totals['produced'])} tokens"),
        Measurement("draft step / target step (c)", cost, "x",
                    note=f"{params['draft_layers']} of {params['layers']} layers; the embedding, head and Python "
                         f"around them cost the same in both"),
        Measurement("plain decoding: one target step per token", plain_tok, "s", note=f"on {where}, fp32, batch 1"),
        Measurement("speculative decoding, per token", spec_tok, "s"),
        Measurement("speed-up", metrics["speedup"], "x", metrics["theory_speedup"],
                    "(1 - α^(γ+1)) / ((1 - α)(γc + 1)), Theorem 3.8",
                    "the theorem prices one verification of γ + 1 tokens as one target step"),
        Measurement(f"one verification of {gamma + 1} tokens / one plain target step (v)", verify, "x",
                    1.0, "Theorem 3.8's assumption: a memory-bound step costs the same for 1 or γ + 1 tokens"),
        Measurement("speed-up expected with the measured v", metrics["speedup_at_measured_verify"], "x",
                    note="(1 - α^(γ+1)) / ((1 - α)(γc + v)); the rest is the rounds' own Python (cache trims)"),
        Measurement("output identical to the target's own greedy decoding", metrics["matches_target"], "",
                    note="yes" if matches else "no: a near-tie between two tokens rounded differently in one read "
                                              "of γ + 1 tokens than in one of 1"),
    )
    progress(1.0, "done")
    summary = (f"α {format_percent(alpha)}, {format_number(per_step)} tokens per target step "
               f"({format_number(metrics['theory_tokens_per_step'])} by Eq. 1), {format_duration(spec_tok)} per "
               f"token against {format_duration(plain_tok)} plain: {format_number(metrics['speedup'])}x")
    details = {"plain_token_s": plain_s, "draft_token_s": draft_s, "speculative_token_s": spec_s}
    return ProbeResult("speculative", rows, metrics, summary, cancel.is_set(), device, details)


SPECULATIVE = make_probe(
    name="speculative",
    title="Speculative decoding with a draft model",
    description="Greedy speculative decoding on a small transformers Llama: a draft made of the target's first "
                "layers proposes tokens, the target verifies them in one pass; acceptance rate, tokens per "
                "verification step and speed-up measured beside Leviathan et al.'s formulas, and the output "
                "checked against the target's own.",
    needs_torch=True,
    params=(
        *model_params(default_layers=8),
        Param("draft_layers", "int", 1, "the target's first layers the draft keeps", minimum=1, maximum=31),
        Param("refine", "float", 0.02, "scale of what the target's later layers add (0: the draft is exact)",
              minimum=0.0, maximum=1.0),
        Param("draft_tokens", "int", 4, "tokens the draft proposes per verification (γ)", minimum=1, maximum=16),
        Param("prompt", "int", 16, "prompt tokens", minimum=1, maximum=1024),
        Param("tokens", "int", 48, "tokens generated per run", minimum=4, maximum=512),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(6.0, "seconds of decoding at most (at least 2 runs of each after a warm-up)"),
        device_param(),
    ),
    metrics=("acceptance_rate", "accepted_share", "tokens_per_step", "theory_tokens_per_step", "draft_cost", "speedup",
             "theory_speedup", "verify_cost", "speedup_at_measured_verify", "plain_token_s", "speculative_token_s",
             "matches_target"),
    body=_speculative,
)
