"""tensor: Megatron-style tensor parallelism over local ranks, checked against one rank and counted.

Each rank builds the same blocks from the same seed, keeps one copy whole (the single-device
reference) and splits another with torch.distributed.tensor.parallel (DTensor):

- column-parallel linear: ColwiseParallel, the weight's output features split; the output stays split;
- row-parallel linear: RowwiseParallel, the input features split (each rank gets its slice of the
  input, as it would from a column-parallel layer before it); the output all-reduced;
- MLP: fc1 column-parallel, fc2 row-parallel (Megatron-LM §3, Figure 3a);
- attention: q, k, v column-parallel (heads split), the output projection row-parallel (Figure 3b).

Both copies run forward and backward on the same input and output gradient; the errors are the
largest absolute differences of the outputs, the input gradients and the weight gradients.

Communication: torch's CommDebugMode sees every collective DTensor issues, forward and backward
apart; each one's buffer size is read from its tensor. The bytes a rank sends for an all-reduce of
S bytes are 2(t-1)/t·S (ring algorithm, nccl-tests PERFORMANCE.md), the count the theory uses too:
attention + MLP form one transformer layer, against
tutor.theory.parallel.tensor_parallel_comm_bytes_per_layer (two all-reduces forward, two backward,
Shoeybi et al. arXiv 1909.08053 §3). Values are fp32 here (4 bytes), so the theory gets 4 bytes per value.
"""

from __future__ import annotations

import math
import threading
from typing import Any

from tutor.errors import UserError
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, make_probe

BYTES_PER_VALUE = 4  # fp32 on the CPU: the comparison with one rank is exact to float rounding
BLOCKS = ("column-parallel linear", "row-parallel linear", "mlp", "attention")
LAYER_BLOCKS = ("attention", "mlp")  # one transformer layer, as the theory counts it
TIMEOUT_S = 180.0
QKV_LAYOUTS = ("fused", "separate")
# A collective's kind as the theory names it, from the torch op names CommDebugMode reports.
_OP_KINDS = (("all_reduce", "all_reduce"), ("allreduce", "all_reduce"), ("reduce_scatter", "reduce_scatter"),
             ("all_gather", "all_gather"), ("allgather", "all_gather"), ("all_to_all", "all_to_all"),
             ("alltoall", "all_to_all"), ("broadcast", "broadcast"))


def _op_kind(op_name: str) -> str:
    """'all_reduce' for c10d_functional.all_reduce, 'all_gather' for all_gather_into_tensor, ..."""
    name = op_name.lower()
    for fragment, kind in _OP_KINDS:
        if fragment in name:
            return kind
    return name


# ---------------------------------------------------------------- inside each rank (imports torch)


def _modules(hidden: int, heads: int, ffn: int, fused_qkv: bool):
    """The four blocks, unsplit, with their parallel plans (built inside a rank: imports torch)."""
    import torch
    from torch import nn
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    class MLP(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

        def forward(self, x):
            return self.fc2(torch.nn.functional.gelu(self.fc1(x)))

    class Attention(nn.Module):
        """Causal self-attention. The head count comes from the local width, so a split copy runs its
        own heads only. Fused: one q-k-v projection whose output is laid out head by head (q, k, v of
        head 0, then of head 1, ...), so that a column split hands each rank whole heads, as
        Megatron-LM's ColumnParallelLinear does; separate: q, k and v projections, as Llama's code."""

        def __init__(self) -> None:
            super().__init__()
            self.head_dim = hidden // heads
            if fused_qkv:
                self.qkv = nn.Linear(hidden, 3 * hidden)
            else:
                self.q, self.k, self.v = (nn.Linear(hidden, hidden) for _ in range(3))
            self.o = nn.Linear(hidden, hidden)

        def forward(self, x):
            batch, seq, _ = x.shape
            if fused_qkv:
                q, k, v = self.qkv(x).view(batch, seq, -1, 3, self.head_dim).unbind(3)
            else:
                q, k, v = (t.view(batch, seq, -1, self.head_dim) for t in (self.q(x), self.k(x), self.v(x)))
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            return self.o(out.transpose(1, 2).reshape(batch, seq, -1))

    attention_plan = ({"qkv": ColwiseParallel(), "o": RowwiseParallel()} if fused_qkv else
                      {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "o": RowwiseParallel()})
    return {
        "column-parallel linear": (nn.Linear(hidden, ffn), ColwiseParallel()),
        "row-parallel linear": (nn.Linear(ffn, hidden), RowwiseParallel()),
        "mlp": (MLP(), {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}),
        "attention": (Attention(), attention_plan),
    }


def _counting_mode():
    """A CommDebugMode that also keeps (op, buffer bytes) of every collective it sees."""
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.debug._comm_mode import c10d_collective_ops

    class SizedCommMode(CommDebugMode):
        def __init__(self) -> None:
            super().__init__()
            self.sized: list[tuple[str, int]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = super().__torch_dispatch__(func, types, args, kwargs)
            packet = getattr(func, "_overloadpacket", None)
            if out is not NotImplemented and (packet in self.comm_registry or packet in c10d_collective_ops):
                self.sized.append((str(packet), _buffer_bytes(str(packet), args)))
            return out

    return SizedCommMode()


def _buffer_bytes(op_name: str, args: tuple) -> int:
    """The collective's whole buffer: the input for all-reduce and reduce-scatter, the gathered
    output (input x group size) for all-gather."""
    import torch
    import torch.distributed as dist

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if not tensors and args and isinstance(args[0], (list, tuple)):
        tensors = [a for a in args[0] if isinstance(a, torch.Tensor)]
    size = sum(t.numel() * t.element_size() for t in tensors[:1])
    if _op_kind(op_name) == "all_gather":
        size *= dist.get_world_size()
    return int(size)


def _split_input(block: str, x, rank: int, world: int):
    """A row-parallel linear alone takes its input already split over the ranks (its slice here)."""
    if block == "row-parallel linear":
        return x.detach().chunk(world, dim=-1)[rank].clone().requires_grad_(True)
    return x.detach().clone().requires_grad_(True)


def _local(tensor):
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _check_block(block: str, params: dict, rank: int, world: int, mesh) -> dict[str, Any]:
    import copy

    import torch
    from torch.distributed.tensor.parallel import parallelize_module

    from tutor.labs.gradients import grad_of

    hidden, heads, seq, batch = params["hidden"], params["heads"], params["seq"], params["batch"]
    ffn = params["ffn_multiplier"] * hidden
    torch.manual_seed(params["seed"])
    reference, plan = _modules(hidden, heads, ffn, params["qkv"] == "fused")[block]
    in_features = ffn if block == "row-parallel linear" else hidden
    x = torch.randn(batch, seq, in_features)
    split = parallelize_module(copy.deepcopy(reference), mesh, plan)

    ref_in = x.clone().requires_grad_(True)
    ref_out = reference(ref_in)
    grad_out = torch.randn_like(ref_out)
    ref_out.backward(grad_out)

    tp_in = _split_input(block, x, rank, world)
    forward_mode, backward_mode = _counting_mode(), _counting_mode()
    with forward_mode:
        tp_out = split(tp_in)
    column_output = block == "column-parallel linear"  # its output stays split: compare this rank's slice
    expected_out = ref_out.chunk(world, dim=-1)[rank] if column_output else ref_out
    tp_grad_out = grad_out.chunk(world, dim=-1)[rank] if column_output else grad_out
    with backward_mode:
        tp_out.backward(tp_grad_out)
    ref_in_grad = grad_of(ref_in)
    expected_in_grad = ref_in_grad.chunk(world, dim=-1)[rank] if block == "row-parallel linear" else ref_in_grad

    forward_error = float((_local(tp_out) - expected_out).detach().abs().max())
    grad_errors = [float((tp_in.grad - expected_in_grad).detach().abs().max())]
    reference_params = dict(reference.named_parameters())
    for name, param in split.named_parameters():
        grad_errors.append(float((_local(param.grad) - reference_params[name].grad).detach().abs().max()))
    return {"forward_error": forward_error, "backward_error": max(grad_errors),
            "forward": forward_mode.sized, "backward": backward_mode.sized}


def tensor_rank(ctx, params: dict) -> dict:
    """Rank function (tutor.bench.ranks): every block checked and counted on this rank."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(ctx.device.split(":")[0], (ctx.world,))
    blocks = {}
    for index, block in enumerate(BLOCKS):
        if ctx.cancelled():
            break
        ctx.progress(index / len(BLOCKS), f"{block} on {ctx.world} ranks")
        with torch.device(ctx.device):
            blocks[block] = _check_block(block, params, ctx.rank, ctx.world, mesh)
    # Every rank's collectives complete before any rank tears its process group down.
    torch.distributed.barrier()
    return {"rank": ctx.rank, "device": ctx.device, "blocks": blocks}


# ---------------------------------------------------------------- in the calling process (no torch)


def _summarise_block(per_rank: list[dict], world: int) -> dict[str, Any]:
    """Errors as the worst rank's; collectives as rank 0 saw them (every rank issues the same ones)."""
    from tutor.theory.parallel import bus_bandwidth_factor

    first = per_rank[0]
    summary: dict[str, Any] = {
        "forward_error": max(block["forward_error"] for block in per_rank),
        "backward_error": max(block["backward_error"] for block in per_rank),
    }
    sent = 0
    for phase in ("forward", "backward"):
        counts: dict[str, int] = {}
        buffer = 0
        for op, size in first[phase]:
            kind = _op_kind(op)
            counts[kind] = counts.get(kind, 0) + 1
            buffer += size
            sent += math.ceil(size * bus_bandwidth_factor(kind, world))
        summary[phase] = {"collectives": counts, "buffer_bytes": buffer}
    summary["bytes_sent_per_rank"] = sent
    return summary


def _rank_memory_bytes(params: dict) -> int:
    """One rank's largest block, fp32, twice (the whole reference and the split copy): weights with
    their gradients, and the activations kept for the backward pass: per token the MLP's two
    ffn-wide tensors or attention's q, k, v and output, plus the attention scores and probabilities
    (seq x seq per head: what the math kernel of scaled_dot_product_attention materialises on a CPU)."""
    hidden, ffn, heads = params["hidden"], params["ffn_multiplier"] * params["hidden"], params["heads"]
    tokens = params["batch"] * params["seq"]
    weights = max(2 * hidden * ffn, 4 * hidden * hidden)
    activations = tokens * max(2 * ffn + 2 * hidden, 6 * hidden) + 2 * params["batch"] * heads * params["seq"] ** 2
    return 2 * 4 * (2 * weights + activations)


def _tensor(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.labs.limits import check_lab_fits
    from tutor.bench.ranks import DEFAULT_MEMORY_PER_RANK, run_lab_ranks
    from tutor.theory.parallel import tensor_parallel_comm_bytes_per_layer, tensor_parallel_split

    ranks = params["ranks"]
    try:
        tensor_parallel_split(params["heads"], ranks, what="attention heads")
    except UserError as error:
        raise UserError(f"tensor: {error}") from None
    if params["hidden"] % params["heads"]:
        raise UserError(f"tensor: hidden {params['hidden']} is not a multiple of heads {params['heads']} "
                        f"(each head takes hidden / heads features)")
    if cancel.is_set():
        return ProbeResult("tensor", (), {}, "cancelled before the ranks started", True, "cpu")
    rank_bytes = _rank_memory_bytes(params)
    check_lab_fits("tensor", memory_bytes=ranks * (rank_bytes + DEFAULT_MEMORY_PER_RANK),
                   memory_what=f"{ranks} ranks, each a block whole and split with its activations",
                   fix="lower seq, batch, hidden or heads")
    results = run_lab_ranks("tensor", tensor_rank, dict(params), ranks=ranks, timeout_s=TIMEOUT_S, progress=progress,
                            cancel=cancel, memory_per_rank_bytes=DEFAULT_MEMORY_PER_RANK + rank_bytes)
    if results is None:
        return ProbeResult("tensor", (), {}, "cancelled", True, "cpu")
    world = len(results)
    blocks = {block: _summarise_block([r["blocks"][block] for r in results], world)
              for block in BLOCKS if all(block in r["blocks"] for r in results)}
    theory = tensor_parallel_comm_bytes_per_layer(seq_len=params["seq"], batch=params["batch"],
                                                  hidden=params["hidden"], tp=world,
                                                  bytes_per_value=BYTES_PER_VALUE)
    layer_sent = sum(blocks[b]["bytes_sent_per_rank"] for b in LAYER_BLOCKS)
    layer_allreduces = {phase: sum(blocks[b][phase]["collectives"].get("all_reduce", 0) for b in LAYER_BLOCKS)
                        for phase in ("forward", "backward")}
    max_error = max(max(b["forward_error"], b["backward_error"]) for b in blocks.values())
    rows = _rows(blocks, layer_sent, layer_allreduces, theory, world)
    metrics = {"max_abs_error": max_error, "allreduces_per_layer": float(sum(layer_allreduces.values())),
               "comm_bytes_per_layer": float(layer_sent), "theory_comm_bytes_per_layer": float(theory),
               "comm_bytes_over_theory": layer_sent / theory}
    details = {"max_abs_error": max_error, "ranks": world, "blocks": blocks,
               "layer": {"allreduces": layer_allreduces,
                         "bytes_sent_per_rank": {"measured": layer_sent, "theory": theory}}}
    progress(1.0, "done")
    from tutor.formatting import format_bytes, format_number

    summary = (f"{world} ranks: outputs and gradients within {format_number(max_error)} of one rank; "
               f"{sum(layer_allreduces.values())} all-reduces per layer, {format_bytes(layer_sent)} sent per rank "
               f"(theory {format_bytes(theory)})")
    return ProbeResult("tensor", tuple(rows), metrics, summary, False, results[0].get("device", "cpu"), details)


def _rows(blocks: dict, layer_sent: int, layer_allreduces: dict, theory: int, world: int) -> list[Measurement]:
    rows = []
    for block, figures in blocks.items():
        rows.append(Measurement(f"{block}: largest error, forward", figures["forward_error"], "",
                                note="output against the same block on one rank"))
        rows.append(Measurement(f"{block}: largest error, backward", figures["backward_error"], "",
                                note="input and weight gradients against one rank"))
        rows.append(Measurement(f"{block}: bytes sent per rank", figures["bytes_sent_per_rank"], "B",
                                note=_collectives_text(figures)))
    rows.append(Measurement("one layer (attention + MLP): all-reduces", float(sum(layer_allreduces.values())), "",
                            theory=4.0, theory_source="2 forward + 2 backward (Megatron-LM §3)",
                            note=f"{layer_allreduces['forward']} forward, {layer_allreduces['backward']} backward"))
    rows.append(Measurement("one layer (attention + MLP): bytes sent per rank", float(layer_sent), "B",
                            theory=float(theory),
                            theory_source=f"4 all-reduces x 2({world}-1)/{world} x b·s·h x 4 B "
                                          "(tensor_parallel_comm_bytes_per_layer)"))
    return rows


def _collectives_text(figures: dict) -> str:
    parts = []
    for phase in ("forward", "backward"):
        counts = figures[phase]["collectives"]
        text = ", ".join(f"{n} {op.replace('_', '-')}" for op, n in counts.items()) or "none"
        parts.append(f"{phase}: {text}")
    return "; ".join(parts)


def render_tensor(result: ProbeResult):
    """Per block: the collectives forward and backward, bytes each rank sends, and the layer's
    figures beside the theory's (a Rich table; no torch)."""
    from rich.table import Table

    from tutor.formatting import format_bytes, format_number

    details = result.details
    table = Table(title="Collectives per block (each rank)", title_justify="left")
    for column in ("block", "forward", "backward", "sent per rank", "largest error"):
        table.add_column(column, justify="right" if column in ("sent per rank", "largest error") else "left")
    for block, figures in details.get("blocks", {}).items():
        cells = []
        for phase in ("forward", "backward"):
            counts = figures[phase]["collectives"]
            cells.append(", ".join(f"{n} x {op.replace('_', '-')}" for op, n in counts.items()) or "none")
        error = max(figures["forward_error"], figures["backward_error"])
        table.add_row(block, *cells, format_bytes(figures["bytes_sent_per_rank"]), format_number(error))
    layer = details.get("layer")
    if layer:
        sent = layer["bytes_sent_per_rank"]
        allreduces = layer["allreduces"]
        table.add_section()
        table.add_row("layer (measured)", f"{allreduces['forward']} x all-reduce", f"{allreduces['backward']} x all-reduce",
                      format_bytes(sent["measured"]), "")
        table.add_row("layer (Megatron-LM)", "2 x all-reduce", "2 x all-reduce", format_bytes(sent["theory"]), "")
    return table


TENSOR = make_probe(
    name="tensor",
    title="Tensor parallelism for real",
    description="Splits linear layers, an MLP and an attention block over local ranks with DTensor, checks the "
                "output and gradients against one rank, and counts the collectives and bytes each layer costs.",
    needs_torch=True,
    params=(
        Param("ranks", "int", 2, "local processes (tensor-parallel size)", minimum=2, maximum=16),
        Param("hidden", "int", 256, "hidden size", minimum=8, maximum=2048),
        Param("heads", "int", 4, "attention heads", minimum=1, maximum=64),
        Param("ffn_multiplier", "int", 4, "MLP width over the hidden size", minimum=1, maximum=8),
        Param("seq", "int", 64, "tokens per sequence", minimum=1, maximum=1024),
        Param("batch", "int", 2, "sequences", minimum=1, maximum=64),
        Param("qkv", "str", "fused", "attention's q-k-v projection: one fused column-parallel linear "
              "(Megatron-LM) or three separate ones (Llama's code)", choices=QKV_LAYOUTS),
        Param("seed", "int", 0, "random seed of weights and inputs", minimum=0, maximum=2**31 - 1),
    ),
    metrics=("max_abs_error", "allreduces_per_layer", "comm_bytes_per_layer", "theory_comm_bytes_per_layer",
             "comm_bytes_over_theory"),
    body=_tensor,
    render=render_tensor,
)
