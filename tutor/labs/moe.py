"""moe: a real mixture-of-experts layer in torch, trained briefly, with three ways to balance its experts.

The layer: a router (linear, then softmax as in Switch (Mixtral's after renormalising the top k) or a sigmoid per expert as in DeepSeek-V3),
top-k selection, and E small SwiGLU experts that only their routed tokens run through. The data is
synthetic: tokens drawn around C cluster centres, each cluster with its own target map, so experts have
something to specialise on. The router starts with a popularity bias −skew·ln(i+1) on expert i (the
moe-routing lab's skew), so that routing begins lopsided and can stay collapsed.

Three runs from the same seed (same initial weights, same batches):
- "none": the main loss only;
- "aux_loss": plus the Switch Transformer auxiliary loss α·E·Σ f_i·P_i (Fedus et al. arXiv 2101.03961,
  eq. 4; f_i counted per token-slot so it sums to k, as HF Mixtral does), checked against
  tutor.theory.moe.load_balancing_loss on the same f and P;
- "bias": DeepSeek-V3's auxiliary-loss-free balancing (arXiv 2412.19437 §2.1.2): a per-expert bias added
  to the affinity for the top-k choice only (the gate weights use the unbiased scores), moved by ±γ after
  each step against the sign of the expert's load error.

Each run's per-expert load (share of token-slots) is measured on held-out batches, with the tokens a
capacity factor would drop (tutor.theory.moe.expert_capacity / tokens_dropped beside a real capacity mask).
FLOPs of one forward pass are counted by torch.utils.flop_counter.FlopCounterMode for the routed layer,
for every expert on every token, and for a dense SwiGLU MLP of the active size, beside
tutor.theory.flops.matmul_flops and tutor.theory.moe.experts_active_fraction. With ranks > 1 the
experts are spread over local torch.distributed ranks (tutor.bench.ranks) and tokens really travel:
dispatch and combine through dist.all_to_all_single (gloo supports uneven splits), the bytes each rank
sends counted from the split sizes, beside tutor.theory.parallel.expert_parallel_alltoall_bytes.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tutor.errors import UserError
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, make_probe

if TYPE_CHECKING:
    import torch

RUNS = ("none", "aux_loss", "bias")
RUN_TITLES = {"none": "no balancing", "aux_loss": "Switch auxiliary loss", "bias": "DeepSeek-V3 bias"}
HEADLINE_ORDER = ("aux_loss", "bias", "none")  # the run whose loads stand in `expert_load`
SCORINGS = ("softmax", "sigmoid")
LEARNING_RATE = 1e-2  # Adam; a few hundred steps must be enough to see balance move
INPUT_NOISE = 0.5  # token spread around its cluster centre, in units of the centres' 1.5 std
CENTRE_SCALE = 1.5
ROUTER_INIT_SCALE = 0.5  # router weights small against the skew, so the start is lopsided
EVAL_BATCHES = 4  # held-out batches of `tokens` tokens for the final loads and drops
BYTES_PER_VALUE = 4  # fp32 activations travel in the all-to-all here
MAX_WORK = 40_000_000_000  # runs x steps x tokens x experts x hidden x ffn: a ceiling of a few minutes
RANK_TIMEOUT_S = 120.0
PROGRESS_EVERY = 10


# ---------------------------------------------------------------- the layer (torch inside functions)


@dataclass
class MoEWeights:
    """The layer's tensors: router [E, h] and bias [E]; experts' gate and up [E, f, h], down [E, h, f]."""

    router: torch.Tensor
    router_bias: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor

    def tensors(self) -> list:
        return [self.router, self.router_bias, self.w_gate, self.w_up, self.w_down]

    def to_lists(self) -> dict[str, list]:
        return {name: tensor.detach().tolist() for name, tensor in zip(
            ("router", "router_bias", "w_gate", "w_up", "w_down"), self.tensors(), strict=True)}

    @staticmethod
    def from_lists(lists: dict[str, list]) -> MoEWeights:
        import torch

        return MoEWeights(*(torch.tensor(lists[name]) for name in ("router", "router_bias", "w_gate", "w_up",
                                                                     "w_down")))


@dataclass
class SyntheticTask:
    """Tokens around C centres; cluster c's target is tanh(A_c·x)."""

    centres: torch.Tensor
    maps: torch.Tensor


@dataclass
class Routing:
    """One batch's routing: scores [T, E], probabilities over experts [T, E], chosen [T, k], gates [T, k]."""

    scores: torch.Tensor
    probs: torch.Tensor
    chosen: torch.Tensor
    gates: torch.Tensor

    def expert_counts(self, num_experts: int):
        """Token-slots per expert: how many (token, choice) pairs picked each expert."""
        import torch

        return torch.bincount(self.chosen.flatten(), minlength=num_experts)


def synthetic_task(params: dict) -> SyntheticTask:
    import torch

    generator = torch.Generator().manual_seed(params["seed"])
    hidden, clusters = params["hidden"], params["clusters"]
    return SyntheticTask(centres=torch.randn(clusters, hidden, generator=generator) * CENTRE_SCALE,
                         maps=torch.randn(clusters, hidden, hidden, generator=generator) / math.sqrt(hidden))


def token_batch(task: SyntheticTask, tokens: int, generator):
    """(inputs [T, h], targets [T, h]) drawn from random clusters."""
    import torch

    cluster = torch.randint(0, task.centres.shape[0], (tokens,), generator=generator)
    inputs = task.centres[cluster] + INPUT_NOISE * torch.randn(tokens, task.centres.shape[1], generator=generator)
    targets = torch.tanh(torch.einsum("tij,tj->ti", task.maps[cluster], inputs))
    return inputs, targets


def initial_weights(params: dict) -> MoEWeights:
    """Seeded weights; the router bias starts at −skew·ln(i+1) (expert 0 favoured, as in moe-routing)."""
    import torch

    generator = torch.Generator().manual_seed(params["seed"] + 1)
    experts, hidden, ffn = params["experts"], params["hidden"], params["ffn"]
    return MoEWeights(
        router=torch.randn(experts, hidden, generator=generator) * ROUTER_INIT_SCALE / math.sqrt(hidden),
        router_bias=torch.tensor([-params["skew"] * math.log(i + 1) for i in range(experts)]),
        w_gate=torch.randn(experts, ffn, hidden, generator=generator) / math.sqrt(hidden),
        w_up=torch.randn(experts, ffn, hidden, generator=generator) / math.sqrt(hidden),
        w_down=torch.randn(experts, hidden, ffn, generator=generator) / math.sqrt(ffn),
    )


def route(inputs, weights: MoEWeights, *, scoring: str, top_k: int, selection_bias=None) -> Routing:
    """Scores, top-k choice and gate weights.

    softmax: Switch (arXiv 2101.03961 §2.1); renormalised over the chosen k it equals Mixtral's
    Softmax(TopK(x·W_g)) (arXiv 2401.04088 §2.1); sigmoid: DeepSeek-V3 (arXiv 2412.19437 eq. 15).
    `selection_bias` is DeepSeek-V3's balancing bias: added to the scores for the choice only (eq. 16).
    Gates: the chosen scores renormalised to sum to 1 for k > 1 (Mixtral; DeepSeek-V3 eq. 13), the raw
    probability for k = 1 (Switch eq. 2), which keeps the router trainable by the main loss.
    """
    logits = inputs @ weights.router.T + weights.router_bias
    scores = logits.softmax(dim=-1) if scoring == "softmax" else logits.sigmoid()
    affinity = scores.detach() if selection_bias is None else scores.detach() + selection_bias
    chosen = affinity.topk(top_k, dim=-1).indices
    gates = scores.gather(1, chosen)
    if top_k > 1:
        gates = gates / gates.sum(dim=-1, keepdim=True)
    probs = scores / scores.sum(dim=-1, keepdim=True)  # sigmoid scores normalised, as DeepSeek-V3 eq. 19
    return Routing(scores=scores, probs=probs, chosen=chosen, gates=gates)


def swiglu(inputs, w_gate, w_up, w_down):
    """One expert: down(silu(gate·x) ⊙ up·x) (Shazeer arXiv 2002.05202, as in Mixtral and DeepSeek-V3)."""
    import torch.nn.functional as F

    return (F.silu(inputs @ w_gate.T) * (inputs @ w_up.T)) @ w_down.T


def experts_forward(inputs, routing: Routing, weights: MoEWeights):
    """Each expert runs on its routed tokens only (gathered), results scattered back weighted by the gates."""
    import torch

    output = torch.zeros_like(inputs)
    for expert in range(weights.w_gate.shape[0]):
        token, slot = (routing.chosen == expert).nonzero(as_tuple=True)
        if token.numel():
            result = swiglu(inputs[token], weights.w_gate[expert], weights.w_up[expert], weights.w_down[expert])
            output.index_add_(0, token, result * routing.gates[token, slot, None])
    return output


def every_expert_forward(inputs, routing: Routing, weights: MoEWeights):
    """The same output computed the wasteful way: every expert on every token, then the routed ones kept."""
    import torch

    output = torch.zeros_like(inputs)
    for expert in range(weights.w_gate.shape[0]):
        result = swiglu(inputs, weights.w_gate[expert], weights.w_up[expert], weights.w_down[expert])
        weight = (routing.gates * (routing.chosen == expert)).sum(dim=-1, keepdim=True)
        output = output + result * weight
    return output


def switch_aux_loss(routing: Routing, num_experts: int, alpha: float):
    """α·E·Σ f_i·P_i (Switch eq. 4): f_i token-slots to expert i over tokens (not differentiable, sums to k),
    P_i the mean router probability of expert i (eq. 6, differentiable)."""
    tokens = routing.chosen.shape[0]
    fraction = routing.expert_counts(num_experts).to(routing.probs.dtype) / tokens
    return alpha * num_experts * (fraction * routing.probs.mean(dim=0)).sum()


def update_balancing_bias(bias, counts, rate: float) -> None:
    """DeepSeek-V3 §2.1.2: bias −= γ for an overloaded expert, += γ for an underloaded one (sign of the error)."""
    import torch

    load = counts.to(bias.dtype)
    bias += rate * torch.sign(load.mean() - load)


# ---------------------------------------------------------------- one training run


@dataclass
class RunOutcome:
    """What one run ends with."""

    name: str
    weights: MoEWeights
    selection_bias: torch.Tensor | None  # the DeepSeek-V3 bias (None for the other runs)
    main_loss_first: float
    main_loss_last: float
    aux_check: tuple[float, float] | None  # (torch's value, tutor.theory's value) on the last step
    steps: int


def _aux_loss_theory(routing: Routing, num_experts: int, alpha: float) -> float:
    from tutor.theory.moe import load_balancing_loss

    tokens = routing.chosen.shape[0]
    fraction = [count / tokens for count in routing.expert_counts(num_experts).tolist()]
    mean_probs = routing.probs.detach().double().mean(dim=0).tolist()
    return load_balancing_loss(fraction, mean_probs, num_experts, alpha=alpha)


def train_run(name: str, params: dict, task: SyntheticTask, progress, cancel: threading.Event) -> RunOutcome | None:
    """`steps` Adam steps on fresh batches of `tokens` tokens; None when cancelled."""
    import torch
    import torch.nn.functional as F

    weights = initial_weights(params)
    for tensor in weights.tensors():
        tensor.requires_grad_(True)
    optimizer = torch.optim.Adam(weights.tensors(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(params["seed"] + 2)
    selection_bias = torch.zeros(params["experts"]) if name == "bias" else None
    first = last = float("nan")
    aux_check = None
    for step in range(params["steps"]):
        if cancel.is_set():
            return None
        if step % PROGRESS_EVERY == 0:
            progress(step / params["steps"], f"{RUN_TITLES[name]}: step {step + 1} of {params['steps']}")
        inputs, targets = token_batch(task, params["tokens"], generator)
        routing = route(inputs, weights, scoring=params["scoring"], top_k=params["top_k"],
                        selection_bias=selection_bias)
        main_loss = F.mse_loss(experts_forward(inputs, routing, weights), targets)
        loss = main_loss
        if name == "aux_loss":
            aux = switch_aux_loss(routing, params["experts"], params["aux_alpha"])
            loss = loss + aux
            if step == params["steps"] - 1:
                aux_check = (aux.item(), _aux_loss_theory(routing, params["experts"], params["aux_alpha"]))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if selection_bias is not None:
            update_balancing_bias(selection_bias, routing.expert_counts(params["experts"]), params["bias_rate"])
        first = main_loss.item() if step == 0 else first
        last = main_loss.item()
    for tensor in weights.tensors():
        tensor.requires_grad_(False)
    return RunOutcome(name=name, weights=weights, selection_bias=selection_bias, main_loss_first=first,
                      main_loss_last=last, aux_check=aux_check, steps=params["steps"])


# ---------------------------------------------------------------- what a run's routing does


@dataclass
class LoadReport:
    """Per-expert share of token-slots on the held-out batches, and the capacity drops there."""

    load: list[float]
    dropped: int  # token-slots over capacity, counted by the capacity mask
    dropped_theory: int  # tutor.theory.moe.tokens_dropped on the same per-batch loads
    slots: int
    capacity: int


def capacity_mask(chosen, num_experts: int, capacity: int):
    """Which token-slots an expert with `capacity` slots keeps: the first ones in token order (Switch
    §2.2, GShard's cumsum position in expert), as a bool [T, k]."""
    import torch

    one_hot = torch.nn.functional.one_hot(chosen.flatten(), num_experts)
    position = one_hot.cumsum(dim=0) * one_hot  # 1-based position of each slot in its expert's queue
    return ((position > 0) & (position <= capacity)).any(dim=-1).view_as(chosen)


def measure_loads(params: dict, task: SyntheticTask, weights: MoEWeights, selection_bias) -> LoadReport:
    import torch

    from tutor.theory.moe import expert_capacity, tokens_dropped

    experts, tokens = params["experts"], params["tokens"]
    capacity = expert_capacity(tokens, experts, params["top_k"], params["capacity_factor"])
    generator = torch.Generator().manual_seed(params["seed"] + 3)  # the same held-out tokens for every run
    counts = torch.zeros(experts, dtype=torch.long)
    dropped = dropped_theory = 0
    with torch.no_grad():
        for _ in range(EVAL_BATCHES):
            inputs, _targets = token_batch(task, tokens, generator)
            routing = route(inputs, weights, scoring=params["scoring"], top_k=params["top_k"],
                            selection_bias=selection_bias)
            batch_counts = routing.expert_counts(experts)
            counts += batch_counts
            dropped += int((~capacity_mask(routing.chosen, experts, capacity)).sum())
            dropped_theory += tokens_dropped(batch_counts.tolist(), capacity).dropped
    slots = int(counts.sum())
    return LoadReport(load=[count / slots for count in counts.tolist()], dropped=dropped,
                      dropped_theory=dropped_theory, slots=slots, capacity=capacity)


def max_over_mean(load: list[float]) -> float:
    """The busiest expert's load over the mean: 1 when perfectly balanced, E when one expert takes all."""
    return max(load) / (sum(load) / len(load))


def coefficient_of_variation(load: list[float]) -> float:
    """Standard deviation of the loads over their mean: 0 when perfectly balanced."""
    mean = sum(load) / len(load)
    return math.sqrt(sum((value - mean) ** 2 for value in load) / len(load)) / mean


# ---------------------------------------------------------------- FLOPs


def count_flops(params: dict, task: SyntheticTask, weights: MoEWeights, selection_bias) -> dict[str, int]:
    """FlopCounterMode totals of one forward pass on `tokens` tokens: the router, the routed layer
    (router + experts on their tokens), every expert on every token, a dense SwiGLU of the active size."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    tokens, hidden, ffn, top_k = params["tokens"], params["hidden"], params["ffn"], params["top_k"]
    inputs, _targets = token_batch(task, tokens, torch.Generator().manual_seed(params["seed"] + 4))
    generator = torch.Generator().manual_seed(params["seed"] + 5)
    width = top_k * ffn
    dense = [torch.randn(width, hidden, generator=generator), torch.randn(width, hidden, generator=generator),
             torch.randn(hidden, width, generator=generator)]

    def counted(fn) -> int:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            fn()
        return int(counter.get_total_flops())

    def routing():
        return route(inputs, weights, scoring=params["scoring"], top_k=top_k, selection_bias=selection_bias)

    return {
        "router": counted(routing),
        "active": counted(lambda: experts_forward(inputs, routing(), weights)),
        "total": counted(lambda: every_expert_forward(inputs, routing(), weights)),
        "dense_same_active": counted(lambda: swiglu(inputs, *dense)),
    }


def flops_theory(params: dict) -> dict[str, int]:
    """matmul_flops (2·m·n·k) per matmul: router T×E×h; an expert 3 matmuls of h×f per token it gets;
    k·T token-slots when routed, E·T when every expert runs; a dense SwiGLU of width k·f on T tokens."""
    from tutor.theory.flops import matmul_flops

    tokens, hidden, ffn = params["tokens"], params["hidden"], params["ffn"]
    top_k, experts = params["top_k"], params["experts"]
    router = matmul_flops(tokens, experts, hidden)
    return {
        "router": router,
        "active": router + 3 * matmul_flops(top_k * tokens, ffn, hidden),
        "total": router + 3 * matmul_flops(experts * tokens, ffn, hidden),
        "dense_same_active": 3 * matmul_flops(tokens, top_k * ffn, hidden),
    }


# ---------------------------------------------------------------- expert parallelism over ranks


def expert_parallel_rank(ctx, params: dict) -> dict:
    """One expert-parallel rank (run by tutor.bench.ranks.run_ranks): holds experts/world whole experts,
    routes its own tokens, dispatches each token-slot to the rank of its expert and combines the results
    back, both through dist.all_to_all_single; checks the output against the whole layer computed here."""
    import torch
    import torch.distributed as dist

    from tutor.theory.parallel import experts_per_rank

    experts, rank, world = params["experts"], ctx.rank, ctx.world
    local = experts_per_rank(experts, world)
    device = torch.device(ctx.device)  # NCCL needs the buffers on this rank's GPU, gloo takes CPU tensors
    weights = MoEWeights(*(tensor.to(device) for tensor in MoEWeights.from_lists(params["weights"]).tensors()))
    selection_bias = None if params["selection_bias"] is None else torch.tensor(params["selection_bias"], device=device)
    task = synthetic_task(params)
    inputs, _targets = token_batch(task, params["tokens"], torch.Generator().manual_seed(params["seed"] + 10 + rank))
    inputs = inputs.to(device)
    ctx.progress(0.1, f"routing {params['tokens']} tokens on each of {world} ranks")
    with torch.no_grad():
        routing = route(inputs, weights, scoring=params["scoring"], top_k=params["top_k"],
                        selection_bias=selection_bias)
        token, slot = torch.nonzero(torch.ones_like(routing.chosen), as_tuple=True)
        expert = routing.chosen[token, slot]
        order = torch.argsort(expert, stable=True)  # by expert, hence by destination rank
        token, slot, expert = token[order], slot[order], expert[order]
        counts = torch.bincount(expert, minlength=experts)
        received_counts = torch.empty_like(counts)
        dist.all_to_all_single(received_counts, counts)  # each rank learns its experts' counts from every rank
        send_splits = counts.view(world, local).sum(dim=1).tolist()
        received_splits = received_counts.view(world, local).sum(dim=1).tolist()
        received = torch.empty(sum(received_splits), inputs.shape[1], device=device)
        ctx.progress(0.4, "dispatch: all-to-all of token vectors")
        dist.all_to_all_single(received, inputs[token].contiguous(), output_split_sizes=received_splits,
                               input_split_sizes=send_splits)
        # received rows come grouped by source rank, then by local expert
        local_expert = torch.arange(local, device=device).repeat(world).repeat_interleave(received_counts)
        results = torch.empty_like(received)
        for index in range(local):
            rows = (local_expert == index).nonzero(as_tuple=True)[0]
            global_expert = rank * local + index
            results[rows] = swiglu(received[rows], weights.w_gate[global_expert], weights.w_up[global_expert],
                                   weights.w_down[global_expert])
        returned = torch.empty(len(token), inputs.shape[1], device=device)
        ctx.progress(0.7, "combine: all-to-all of expert outputs")
        dist.all_to_all_single(returned, results, output_split_sizes=send_splits, input_split_sizes=received_splits)
        output = torch.zeros_like(inputs).index_add_(0, token, returned * routing.gates[token, slot, None])
        reference = experts_forward(inputs, routing, weights)
    vector = inputs.shape[1] * inputs.element_size()
    return {
        "rank": rank,
        "backend": ctx.backend,
        "dispatch_bytes": (sum(send_splits) - send_splits[rank]) * vector,
        "combine_bytes": (sum(received_splits) - received_splits[rank]) * vector,
        "count_bytes": (experts - local) * counts.element_size(),
        "slots_received": sum(received_splits),
        "max_abs_error": float((output - reference).abs().max()),
    }


def run_expert_parallel(params: dict, outcome: RunOutcome, progress, cancel: threading.Event) -> list[dict]:
    from tutor.bench.ranks import RanksCancelled, run_ranks
    from tutor.theory.parallel import experts_per_rank

    experts_per_rank(params["experts"], expert_parallel_ranks(params))  # a UserError before any rank starts
    rank_params = {key: params[key] for key in ("experts", "top_k", "hidden", "clusters", "tokens", "seed",
                                                "scoring")}
    rank_params["weights"] = outcome.weights.to_lists()
    rank_params["selection_bias"] = None if outcome.selection_bias is None else outcome.selection_bias.tolist()
    try:
        return run_ranks(expert_parallel_rank, rank_params, ranks=params["ranks"], timeout_s=RANK_TIMEOUT_S,
                         progress=progress, cancel=cancel, name="moe")
    except RanksCancelled:
        return []


# ---------------------------------------------------------------- the probe


def expert_parallel_ranks(params: dict) -> int:
    """Ranks for the all-to-all: the torchrun job's world size when this process is one of its ranks
    (tutor.bench.ranks runs the function on the job's ranks then), else the `ranks` parameter."""
    import os

    from tutor.bench.ranks import torchrun_variable, under_torchrun

    return torchrun_variable("WORLD_SIZE") if under_torchrun() else params["ranks"]


def _check(params: dict) -> None:
    if params["top_k"] > params["experts"]:
        raise UserError(f"moe: top_k {params['top_k']} exceeds the {params['experts']} experts "
                        f"(use top_k <= {params['experts']})")
    work = math.prod((len(params["runs"]), params["steps"], params["tokens"], params["experts"], params["hidden"],
                      params["ffn"]))
    if work > MAX_WORK:
        raise UserError(f"moe: runs x steps x tokens x experts x hidden x ffn = {work:,} is above {MAX_WORK:,} "
                        f"(a few minutes here); lower steps, tokens or the sizes")
    ranks = expert_parallel_ranks(params)
    if ranks > 1:
        from tutor.theory.parallel import experts_per_rank

        try:
            experts_per_rank(params["experts"], ranks)
        except UserError as error:
            raise UserError(f"moe: {error} (ranks = {ranks})") from None


def _headline(runs: tuple[str, ...]) -> str:
    return next(name for name in HEADLINE_ORDER if name in runs)


def _run_rows(name: str, load: list[float], report: LoadReport, outcome: RunOutcome, experts: int) -> list[Measurement]:
    title = RUN_TITLES[name]
    return [
        Measurement(f"{title}: busiest expert's load over the mean", max_over_mean(load), "x", 1.0,
                    "every expert k·T/E token-slots when balanced",
                    f"coefficient of variation {coefficient_of_variation(load):.2f}"),
        Measurement(f"{title}: token-slots dropped at capacity {report.capacity}", report.dropped / report.slots,
                    "fraction", report.dropped_theory / report.slots,
                    "Σ max(0, load − capacity) per batch on the same routing (Switch §2.2)",
                    f"{report.dropped:,} of {report.slots:,} over {EVAL_BATCHES} held-out batches"),
        Measurement(f"{title}: main loss (MSE) after {outcome.steps} steps", outcome.main_loss_last, "", None, "",
                    f"{outcome.main_loss_first:.3g} at the first step; {experts} experts"),
    ]


def _moe(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    _check(params)
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the lab's sizes are tiny: one thread is fastest and leaves the others alone
    try:
        return _measure(params, progress, cancel)
    finally:
        torch.set_num_threads(threads)


def _measure(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.formatting import format_bytes, format_percent, format_quantity
    from tutor.theory.moe import experts_active_fraction
    from tutor.theory.parallel import expert_parallel_alltoall_bytes

    runs, experts, top_k = params["runs"], params["experts"], params["top_k"]
    task = synthetic_task(params)
    start = measure_loads(params, task, initial_weights(params), None)
    outcomes: dict[str, RunOutcome] = {}
    reports: dict[str, LoadReport] = {}
    for index, name in enumerate(runs):
        def run_progress(fraction: float, message: str, index=index) -> None:
            progress(0.85 * (index + fraction) / len(runs), message)

        outcome = train_run(name, params, task, run_progress, cancel)
        if outcome is None:
            break
        outcomes[name] = outcome
        reports[name] = measure_loads(params, task, outcome.weights, outcome.selection_bias)
    if not outcomes:
        return ProbeResult("moe", (), {}, "cancelled before the first run finished", True, "cpu")
    headline = _headline(tuple(outcomes))
    progress(0.88, "counting FLOPs of one forward pass")
    flops = count_flops(params, task, outcomes[headline].weights, outcomes[headline].selection_bias)
    theory = flops_theory(params)
    active_fraction = float(experts_active_fraction(top_k, experts))

    metrics: dict[str, float] = {"max_over_mean_start": max_over_mean(start.load),
                                 "busiest_share_start": max(start.load)}
    rows: list[Measurement] = [
        Measurement("before training: busiest expert's load over the mean", metrics["max_over_mean_start"], "x", 1.0,
                    "every expert k·T/E token-slots when balanced",
                    f"router bias −{params['skew']:g}·ln(i+1) favours expert 0"),
    ]
    for name, outcome in outcomes.items():
        load = reports[name].load
        rows += _run_rows(name, load, reports[name], outcome, experts)
        metrics[f"max_over_mean_{name}"] = max_over_mean(load)
        metrics[f"cv_{name}"] = coefficient_of_variation(load)
        metrics[f"busiest_share_{name}"] = max(load)
        metrics[f"drop_fraction_{name}"] = reports[name].dropped / reports[name].slots
        metrics[f"main_loss_{name}"] = outcome.main_loss_last
    if "aux_loss" in outcomes and outcomes["aux_loss"].aux_check is not None:
        measured, expected = outcomes["aux_loss"].aux_check
        metrics["aux_loss_torch"], metrics["aux_loss_theory"] = measured, expected
        rows.append(Measurement(f"Switch auxiliary loss on the last step (α = {params['aux_alpha']:g})", measured, "",
                                expected, "α·E·Σ f_i·P_i on the same f and P (Switch eq. 4, f summing to k)",
                                f"{params['aux_alpha'] * top_k:g} when perfectly balanced"))
    expert_flops = flops["active"] - flops["router"]
    metrics.update({
        "flops_active": float(flops["active"]), "flops_total": float(flops["total"]),
        "flops_dense_same_active": float(flops["dense_same_active"]),
        "active_over_total": flops["active"] / flops["total"],
        "expert_active_fraction": expert_flops / (flops["total"] - flops["router"]),
        "active_fraction_theory": active_fraction,
        "active_over_dense": flops["active"] / flops["dense_same_active"],
    })
    rows += [
        Measurement(f"FLOPs of one forward pass, {params['tokens']} tokens, routed (top-{top_k} of {experts})",
                    float(flops["active"]), "FLOP", float(theory["active"]),
                    "router + 3 matmuls per token-slot, 2·m·n·k each (tutor.theory.flops)", "FlopCounterMode"),
        Measurement("the same with every expert run on every token", float(flops["total"]), "FLOP",
                    float(theory["total"]), "router + 3 matmuls per token per expert", "FlopCounterMode"),
        Measurement(f"a dense SwiGLU MLP of the active width ({top_k}·{params['ffn']})",
                    float(flops["dense_same_active"]), "FLOP", float(theory["dense_same_active"]),
                    "3 matmuls per token", "FlopCounterMode"),
        Measurement("experts' FLOPs routed over every expert", metrics["expert_active_fraction"], "fraction",
                    active_fraction, "k/E (tutor.theory.moe.experts_active_fraction)",
                    f"the router adds {format_percent(flops['router'] / flops['active'])} to the routed layer"),
    ]

    alltoall = None
    ranks = expert_parallel_ranks(params)
    if ranks > 1 and not cancel.is_set():
        progress(0.9, f"expert parallelism over {ranks} ranks")
        per_rank = run_expert_parallel(params, outcomes[headline], lambda f, m: progress(0.9 + 0.1 * f, m), cancel)
        if per_rank:
            ep_theory = expert_parallel_alltoall_bytes(params["tokens"], params["hidden"], top_k, ranks,
                                                       BYTES_PER_VALUE)
            sent = [rank["dispatch_bytes"] + rank["combine_bytes"] for rank in per_rank]
            mean_sent = sum(sent) / len(sent)
            error = max(rank["max_abs_error"] for rank in per_rank)
            alltoall = {"ranks": ranks, "collective": "all_to_all_single", "backend": per_rank[0]["backend"],
                        "bytes_per_value": BYTES_PER_VALUE, "routing_of_run": headline,
                        "per_rank": per_rank, "mean_bytes_per_rank": mean_sent, "theory_bytes_per_rank": ep_theory,
                        "max_abs_error": error}
            metrics.update({"alltoall_bytes_per_rank": mean_sent, "alltoall_bytes_theory": float(ep_theory),
                            "alltoall_measured_over_theory": mean_sent / ep_theory, "ep_max_abs_error": error})
            rows += [
                Measurement(f"bytes each rank sends, dispatch + combine, mean of {ranks} ranks",
                            mean_sent, "B", float(ep_theory),
                            "2·(ep−1)/ep·T·k·h·4 B, uniform routing (tutor.theory.parallel)",
                            f"fp32, routing of the {RUN_TITLES[headline]} run; busiest rank sent "
                            f"{format_bytes(max(sent))}"),
                Measurement("expert-parallel output against the whole layer on one rank", error, "max abs error",
                            None, "", f"dist.all_to_all_single on {per_rank[0]['backend']}, uneven splits"),
            ]

    loads_by_run = {name: reports[name].load for name in outcomes}
    details = {
        "expert_load": loads_by_run[headline],
        "expert_load_run": headline,
        "expert_load_by_run": loads_by_run,
        "expert_load_start": start.load,
        "balance_by_run": {name: {"max_over_mean": metrics[f"max_over_mean_{name}"], "cv": metrics[f"cv_{name}"]}
                           for name in outcomes},
        "dropped_tokens": {"capacity_factor": params["capacity_factor"], "capacity": start.capacity,
                           "by_run": {name: {"dropped": reports[name].dropped, "theory": reports[name].dropped_theory,
                                             "slots": reports[name].slots} for name in outcomes}},
        "flops": {**flops, "theory": theory, "active_fraction_theory": active_fraction},
        "alltoall_bytes": alltoall,
    }
    progress(1.0, "done")
    balance = ", ".join(f"{RUN_TITLES[name]} {metrics[f'max_over_mean_{name}']:.2f}x" for name in outcomes)
    summary = (f"busiest expert over the mean after {params['steps']} steps: {balance} (start "
               f"{metrics['max_over_mean_start']:.2f}x); routed forward {format_quantity(flops['active'], 'FLOP')} "
               f"vs {format_quantity(flops['total'], 'FLOP')} with every expert")
    if alltoall is not None:
        summary += (f"; all-to-all {format_bytes(alltoall['mean_bytes_per_rank'])} per rank vs "
                    f"{format_bytes(alltoall['theory_bytes_per_rank'])} uniform theory")
    cancelled = cancel.is_set() or len(outcomes) < len(runs)
    return ProbeResult(probe="moe", rows=tuple(rows), metrics=metrics, summary=summary, cancelled=cancelled,
                       device="cpu", details=details)


# ---------------------------------------------------------------- drawing (no torch)


RUN_SHORT = {"none": "no balancing", "aux_loss": "aux loss", "bias": "bias (DSv3)"}


def render_loads(result: ProbeResult):
    """Per-expert load bars (tutor.answers.pictures.share_bars), one column per run (and the start), with each
    run's busiest-over-mean."""
    from rich.text import Text

    from tutor.answers.pictures import share_bars

    by_run = result.details.get("expert_load_by_run") or {}
    start = result.details.get("expert_load_start")
    columns = ([("before training", start)] if start else []) + [(RUN_SHORT.get(name, name), load)
                                                                 for name, load in by_run.items()]
    if not columns:
        return Text("no run finished")
    return share_bars([(f"{title}\nbusiest {max_over_mean(load):.2f}x", load) for title, load in columns],
                      title="Share of token-slots per expert (bars scaled to the busiest)", row_label="expert")


def _metrics_of(params: dict) -> tuple[str, ...]:
    names = ["max_over_mean_start", "busiest_share_start"]
    for run in params["runs"]:
        names += [f"max_over_mean_{run}", f"cv_{run}", f"busiest_share_{run}", f"drop_fraction_{run}",
                  f"main_loss_{run}"]
    if "aux_loss" in params["runs"]:
        names += ["aux_loss_torch", "aux_loss_theory"]
    names += ["flops_active", "flops_total", "flops_dense_same_active", "active_over_total", "expert_active_fraction",
              "active_fraction_theory", "active_over_dense"]
    if params["ranks"] > 1:
        names += ["alltoall_bytes_per_rank", "alltoall_bytes_theory", "alltoall_measured_over_theory",
                  "ep_max_abs_error"]
    return tuple(names)


MOE = make_probe(
    name="moe",
    title="A real mixture-of-experts layer",
    description="Trains a small top-k MoE layer (router + SwiGLU experts) three ways: no balancing, the Switch "
                "auxiliary loss, DeepSeek-V3's bias; per-expert load, dropped tokens, FLOPs routed vs every "
                "expert (FlopCounterMode), and with ranks > 1 a real all-to-all between expert-parallel ranks.",
    needs_torch=True,
    params=(
        Param("experts", "int", 8, "routed experts E", minimum=2, maximum=64),
        Param("top_k", "int", 2, "experts per token k", minimum=1, maximum=64),
        Param("hidden", "int", 32, "hidden size h", minimum=4, maximum=256),
        Param("ffn", "int", 32, "each expert's inner width f", minimum=4, maximum=256),
        Param("clusters", "int", 8, "token clusters in the synthetic data", minimum=1, maximum=256),
        Param("tokens", "int", 256, "tokens per batch T", minimum=8, maximum=4096),
        Param("steps", "int", 300, "training steps per run", minimum=1, maximum=5000),
        Param("scoring", "str", "softmax", "router scores", choices=SCORINGS),
        Param("skew", "float", 1.0, "initial router bias toward low-numbered experts", minimum=0.0, maximum=10.0),
        Param("aux_alpha", "float", 0.01, "auxiliary loss weight α (Switch: 0.01)", minimum=0.0, maximum=10.0),
        Param("bias_rate", "float", 0.01, "DeepSeek-V3 bias update speed γ", minimum=0.0, maximum=1.0),
        Param("capacity_factor", "float", 1.25, "expert capacity factor", minimum=0.01, maximum=100.0),
        Param("runs", "str-list", RUNS, "which runs", choices=RUNS),
        Param("ranks", "int", 1, "expert-parallel ranks (1: skip the all-to-all)", minimum=1, maximum=64),
        Param("seed", "int", 0, "random seed", minimum=0),
    ),
    metrics=_metrics_of({"runs": RUNS, "ranks": 2}),
    metrics_of=_metrics_of,
    body=_moe,
    render=render_loads,
)
