"""zero: ZeRO stages 1, 2 and 3 with PyTorch's own implementations, per-rank bytes measured.

Every rank builds the same TinyLM (tutor.labs.tiny_transformer, llama style, FP32) and trains it
with AdamW twice: once replicated (plain AdamW on the whole model, what every data-parallel rank
holds without ZeRO), once sharded by `stage`:

- stage 1: torch.distributed.optim.ZeroRedundancyOptimizer(AdamW) over a DistributedDataParallel
  model. Each rank keeps AdamW's states (exp_avg, exp_avg_sq) for its partition of the parameters
  only (whole tensors, greedily balanced by size); gradients and parameters stay replicated. Its
  communication is DDP's all-reduce of the gradients plus a broadcast of each rank's updated
  partition: not the paper's reduce-scatter + all-gather, and so more bytes (measured below).
- stage 2: FSDP2 `fully_shard(reshard_after_forward=False)` on each layer, the embedding, the head
  and the root. Gradients are reduce-scattered (sharded) and the optimizer sees only shards; the
  parameters are all-gathered once per step and kept whole from forward to backward, as ZeRO-2
  keeps them (at rest between steps FSDP2 holds only the shards, which ZeRO-2 does not).
- stage 3: the same with `reshard_after_forward=True`: parameters are freed after each layer's
  forward and all-gathered again for its backward (FSDP2's root unit, here only the final norm,
  stays gathered: FSDP2's heuristic for the root).
All of this runs on CPU tensors with gloo in torch 2.13 (FSDP2 uses all_gather_single and
reduce_scatter_single, which gloo implements).

Measured per rank after a real step (local tensors; a DTensor counts its local shard): parameter,
gradient and optimizer-state bytes, and the parameter bytes held between forward and backward,
beside tutor.theory.parallel.zero_model_states with FP32 weights and gradients (4 + 4 B) and AdamW's
two FP32 states (K = 8 B; the paper's K = 12 adds the FP32 master copy of mixed precision): ZeRO paper
(Rajbhandari et al., arXiv 1910.02054) Figure 1 and section 5. Communication: every collective the
step calls (torch.distributed's all_reduce, broadcast, all_gather_single, reduce_scatter_single,
wrapped to record their buffer sizes S), each counted as S x the bandwidth-optimal bytes per byte of
tutor.theory.parallel.bus_bandwidth_factor, beside data_parallel_comm_bytes (section 7: 2 Psi for
stages 1 and 2, 3 Psi for stage 3).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from tutor.formatting import format_bytes
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe

if TYPE_CHECKING:
    import torch
    from rich.console import RenderableType

    from tutor.bench.ranks import RankContext

VOCAB = 512
HEADS = 4
LR = 1e-3
CATEGORIES = ("parameters", "gradients", "optimizer")
# torch.distributed calls that move data in these implementations, and which buffer is S
# (nccl-tests: all_gather's gathered output, reduce_scatter's full input).
_COUNTED = {"all_reduce": 0, "broadcast": 0, "all_gather_single": 0, "reduce_scatter_single": 1,
            "all_gather_into_tensor": 0, "reduce_scatter_tensor": 1}


def _local_bytes(tensor: torch.Tensor) -> int:
    """Bytes this rank holds for `tensor`: a DTensor's local shard, else the tensor itself."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return int(local.numel() * local.element_size())


def _optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(_local_bytes(value) for state in optimizer.state.values() for value in state.values()
               if hasattr(value, "numel"))


@contextlib.contextmanager
def _counting_collectives(log: list[tuple[str, int]]) -> Iterator[None]:
    """Record (op, S bytes) of every counted torch.distributed call made inside the block."""
    import torch
    import torch.distributed as dist

    originals = {name: getattr(dist, name) for name in _COUNTED if hasattr(dist, name)}

    def wrap(name: str, original: Callable[..., object]) -> Callable[..., object]:
        def counted(*args: object, **kwargs: object) -> object:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            if tensors:
                buffer = tensors[min(_COUNTED[name], len(tensors) - 1)]
                log.append((name, int(buffer.numel() * buffer.element_size())))
            return original(*args, **kwargs)
        return counted

    for name, original in originals.items():
        setattr(dist, name, wrap(name, original))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)


def _zero_rank(ctx: RankContext, p: dict) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from tutor.labs.activation_memory import default_ffn
    from tutor.labs.tiny_transformer import BlockShape, TinyLM

    device = torch.device(ctx.device)
    shape = BlockShape(hidden=p["hidden"], heads=HEADS, kv_heads=HEADS, ffn=default_ffn("llama", p["hidden"]),
                       style="llama", attention="sdpa", dropout=0.0)
    data = torch.Generator().manual_seed(p["seed"] * 100_003 + ctx.rank + 1)

    def fresh_model() -> TinyLM:
        torch.manual_seed(p["seed"])
        return TinyLM(shape, p["layers"], VOCAB).to(device).train()

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
        """One training step; returns the parameter bytes held between forward and backward."""
        ids = torch.randint(0, VOCAB, (p["batch"], p["seq"] + 1), generator=data).to(device)
        logits = model(ids[:, :-1])
        held = sum(_local_bytes(w) for w in model.parameters())
        F.cross_entropy(logits.view(-1, VOCAB), ids[:, 1:].reshape(-1)).backward()
        optimizer.step()
        return held

    def measure(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                local_optimizer: torch.optim.Optimizer) -> dict:
        log: list[tuple[str, int]] = []
        optimizer.zero_grad(set_to_none=True)
        step(model, optimizer)  # warm-up: AdamW creates its states at the first step
        optimizer.zero_grad(set_to_none=True)
        with _counting_collectives(log):
            held = step(model, optimizer)
        return {"parameters": sum(_local_bytes(w) for w in model.parameters()),
                "gradients": sum(_local_bytes(w.grad) for w in model.parameters() if w.grad is not None),
                "optimizer": _optimizer_state_bytes(local_optimizer),
                "parameters_between_passes": held, "collectives": log}

    ctx.progress(0.1, "replicated: plain AdamW on the whole model")
    plain = fresh_model()
    params = sum(w.numel() for w in plain.parameters())
    adam = torch.optim.AdamW(plain.parameters(), lr=LR)
    replicated = measure(plain, adam, adam)
    replicated.pop("collectives")
    del plain, adam
    if ctx.cancelled():
        return {"cancelled": True}
    stage = int(p["stage"])
    ctx.progress(0.5, f"stage {stage}: sharded across {ctx.world} ranks")
    model = fresh_model()
    if stage == 1:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
        # The Python hook does what DDP's built-in all-reduce does, through dist.all_reduce, where it is counted.
        wrapped.register_comm_hook(dist.group.WORLD, allreduce_hook)
        zero_optimizer = ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=torch.optim.AdamW, lr=LR)
        sharded = measure(wrapped, zero_optimizer, zero_optimizer.optim)
    else:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        # The rank's own device: without a mesh fully_shard takes the machine's accelerator, so on a
        # CUDA machine whose ranks run gloo on the CPU (fewer GPUs than ranks) it would move the
        # shards to cuda:0 and ask gloo to reduce-scatter them there.
        mesh = init_device_mesh(device.type, (ctx.world,))
        reshard = stage == 3
        for module in (model.embed, *model.blocks, model.head):
            fully_shard(module, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        sharded = measure(model, optimizer, optimizer)
    ctx.progress(0.9, "comparing")
    return {"rank": ctx.rank, "world": ctx.world, "params": int(params), "replicated": replicated,
            "sharded": sharded, "device": ctx.device, "backend": ctx.backend}


def _memory_per_rank(p: dict) -> int:
    """A rank's interpreter with torch (tutor.bench.ranks) plus two FP32 copies of the model with AdamW
    (16 B per parameter each, the replicated one freed before the sharded one is built, so counted
    with margin) and activations at 64 values per token per hidden unit per layer plus the logits."""
    from tutor.labs.ddp import _param_count
    from tutor.bench.ranks import DEFAULT_MEMORY_PER_RANK

    tokens = p["batch"] * p["seq"]
    return (DEFAULT_MEMORY_PER_RANK + 32 * _param_count(p["hidden"], p["layers"])
            + 4 * tokens * (64 * p["hidden"] * p["layers"] + 3 * VOCAB))


def _zero(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.errors import UserError
    from tutor.bench.ranks import run_lab_ranks

    if params["hidden"] % HEADS:
        raise UserError(f"zero: hidden must be a multiple of {HEADS} (the heads), got {params['hidden']}")
    reports = run_lab_ranks("zero", _zero_rank, params, ranks=params["ranks"], timeout_s=60.0 + 3 * params["budget_s"],
                            progress=progress, cancel=cancel, memory_per_rank_bytes=_memory_per_rank(params))
    if reports is None or any(report.get("cancelled") for report in reports):
        return ProbeResult("zero", (), {}, "cancelled", True, "cpu")
    return zero_result(reports, params)


def wire_bytes(collectives: list[tuple[str, int]], ranks: int) -> int:
    """Bytes one rank sends for these (op, S) calls with bandwidth-optimal algorithms, on average over
    ranks: S x tutor.theory.parallel.bus_bandwidth_factor(op, n) (nccl-tests doc/PERFORMANCE.md). A
    broadcast is counted as a pipelined chain, where n-1 of the n ranks send S: (n-1)/n, the
    all-gather factor (nccl-tests' busbw factor of 1 is the busiest link's, not the mean)."""
    from tutor.theory.parallel import bus_bandwidth_factor

    names = {"all_gather_single": "all_gather", "all_gather_into_tensor": "all_gather",
             "reduce_scatter_single": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
             "broadcast": "all_gather"}
    return round(sum(size * bus_bandwidth_factor(names.get(op, op), ranks) for op, size in collectives))


def zero_result(reports: list[dict], params: dict) -> ProbeResult:
    """The probe result from every rank's report (rank order)."""
    from tutor.theory.parallel import data_parallel_comm_bytes, zero_model_states

    world = len(reports)
    stage = int(params["stage"])
    n_params = reports[0]["params"]
    theory_sharded = zero_model_states(params=n_params, dp=world, stage=stage, weight_bytes=4, grad_bytes=4,
                                       optimizer_bytes=8)
    theory_replicated = zero_model_states(params=n_params, dp=world, stage=0, weight_bytes=4, grad_bytes=4,
                                          optimizer_bytes=8)
    theory = {"parameters": (theory_replicated.weights, theory_sharded.weights),
              "gradients": (theory_replicated.gradients, theory_sharded.gradients),
              "optimizer": (theory_replicated.optimizer, theory_sharded.optimizer)}
    per_rank = [{"rank": r["rank"], **{f"{cat}_bytes": {"replicated": r["replicated"][cat],
                                                         "sharded": r["sharded"][cat]} for cat in CATEGORIES},
                 "parameters_between_passes_bytes": {"replicated": r["replicated"]["parameters_between_passes"],
                                                     "sharded": r["sharded"]["parameters_between_passes"]}}
                for r in reports]
    largest = {cat: max(r["sharded"][cat] for r in reports) for cat in CATEGORIES}
    replicated = {cat: reports[0]["replicated"][cat] for cat in CATEGORIES}
    comm = [wire_bytes(r["sharded"]["collectives"], world) for r in reports]
    comm_theory = data_parallel_comm_bytes(params=n_params, dp=world, stage=stage, bytes_per_grad=4)
    calls: dict[str, int] = {}
    for op, _size in reports[0]["sharded"]["collectives"]:
        calls[op] = calls.get(op, 0) + 1
    ratio = replicated["optimizer"] / largest["optimizer"] if largest["optimizer"] else 0.0
    details: dict[str, Any] = {
        "stage": stage, "ranks": world, "parameters": n_params, "backend": reports[0]["backend"],
        **{f"{cat}_bytes_per_rank": {
            "replicated": replicated[cat], "sharded": largest[cat],
            "theory_replicated": int(theory[cat][0]), "theory_sharded": int(theory[cat][1])} for cat in CATEGORIES},
        "parameters_between_passes_bytes_per_rank": {
            "replicated": reports[0]["replicated"]["parameters_between_passes"],
            "sharded": max(r["sharded"]["parameters_between_passes"] for r in reports)},
        "optimizer_reduction": ratio,
        "communication_bytes_per_step": {"measured": max(comm), "theory": comm_theory.bytes_per_rank,
                                         "paper": comm_theory.paper_bytes, "calls": calls,
                                         "theory_collectives": list(comm_theory.collectives)},
        "per_rank": per_rank,
    }
    metrics = {"optimizer_bytes_replicated": float(replicated["optimizer"]),
               "optimizer_bytes_sharded": float(largest["optimizer"]), "optimizer_reduction": ratio,
               "gradient_bytes_sharded": float(largest["gradients"]),
               "parameter_bytes_sharded": float(largest["parameters"]),
               "communication_bytes_per_step": float(max(comm)),
               "communication_over_theory": max(comm) / comm_theory.bytes_per_rank if comm_theory.bytes_per_rank else 0.0}
    source = f"ZeRO stage {stage}, FP32 AdamW: 4 + 4 + 8 B per parameter (ZeRO paper Fig. 1, §5)"
    names = {"parameters": "parameter", "gradients": "gradient", "optimizer": "optimizer-state"}
    rows = [Measurement(f"{names[cat]} bytes per rank, replicated", float(replicated[cat]), "B",
                        float(theory[cat][0]), "plain data parallelism: every rank holds all of it")
            for cat in CATEGORIES]
    rows += [Measurement(f"{names[cat]} bytes per rank, stage {stage} (largest rank)", float(largest[cat]), "B",
                         float(theory[cat][1]), source, "local shards after a real step")
             for cat in CATEGORIES]
    rows.append(Measurement(f"parameter bytes held between forward and backward, stage {stage}",
                            float(details["parameters_between_passes_bytes_per_rank"]["sharded"]), "B",
                            float(theory["parameters"][1]), source,
                            "FSDP2 gathers whole parameters for compute" if stage > 1 else "replicated in stage 1"))
    rows.append(Measurement("optimizer memory, replicated over sharded", ratio, "x", float(world),
                            f"{world} ranks share the optimizer states (ZeRO paper §5.1)"))
    rows.append(Measurement(f"bytes each rank sends per step, stage {stage}", float(max(comm)), "B",
                            float(comm_theory.bytes_per_rank),
                            f"ZeRO paper §7: {'3Ψ' if stage == 3 else '2Ψ'} x 4 B x (n-1)/n (ring)",
                            ", ".join(f"{count} {op}" for op, count in sorted(calls.items()))))
    summary = (f"stage {stage} on {world} ranks: optimizer states {ratio:.2f}x smaller per rank "
               f"(theory {world}x); {format_bytes(max(comm))} sent per step vs "
               f"{format_bytes(comm_theory.bytes_per_rank)} in theory")
    return ProbeResult(probe="zero", rows=tuple(rows), metrics=metrics, summary=summary,
                       device=reports[0]["device"], details=details)


def render_zero(result: ProbeResult) -> RenderableType:
    """Per-rank memory bars per category: replicated beside sharded, on one byte scale."""
    from rich.table import Table
    from rich.text import Text


    ranks = result.details.get("per_rank", [])
    table = Table(title=f"Memory per rank, replicated vs ZeRO stage {result.details.get('stage', '?')}",
                  title_justify="left", show_edge=False)
    for column in ("rank", "category", "", "bytes", ""):
        table.add_column(column)
    largest = max([r[f"{cat}_bytes"]["replicated"] for r in ranks for cat in CATEGORIES] or [0]) or 1
    width = 28  # the bars' column: the table stays within 80 columns
    styles = {"parameters": "cyan", "gradients": "yellow", "optimizer": "magenta"}
    for r in ranks:
        for index, cat in enumerate(CATEGORIES):
            for kind in ("replicated", "sharded"):
                value = r[f"{cat}_bytes"][kind]
                table.add_row(str(r["rank"]) if index == 0 and kind == "replicated" else "",
                              cat if kind == "replicated" else "", kind, format_bytes(value),
                              Text("█" * round(width * value / largest), style=styles[cat] if kind == "sharded"
                                   else "dim"))
    return table


ZERO = make_probe(
    name="zero",
    title="ZeRO and FSDP: sharding the model states",
    description="Trains a small transformer on local ranks with ZeroRedundancyOptimizer (stage 1) or FSDP2 "
                "fully_shard (stages 2 and 3) and measures each rank's parameter, gradient and optimizer bytes "
                "and the bytes communicated, beside the ZeRO formulas.",
    needs_torch=True,
    params=(
        Param("stage", "int", 1, "ZeRO stage: 1 optimizer states, 2 + gradients, 3 + parameters", minimum=1,
              maximum=3),
        Param("ranks", "int", 2, "local processes (data-parallel ranks)", minimum=2, maximum=64),
        Param("hidden", "int", 64, "hidden size", minimum=8, maximum=256),
        Param("layers", "int", 2, "transformer layers", minimum=1, maximum=4),
        Param("batch", "int", 4, "sequences per rank per step", minimum=1, maximum=64),
        Param("seq", "int", 32, "tokens per sequence", minimum=2, maximum=256),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(10.0, "seconds the ranks may take after they start (three steps run)"),
    ),
    metrics=("optimizer_bytes_replicated", "optimizer_bytes_sharded", "optimizer_reduction", "gradient_bytes_sharded",
             "parameter_bytes_sharded", "communication_bytes_per_step", "communication_over_theory"),
    body=_zero,
    render=render_zero,
)
