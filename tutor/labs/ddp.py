"""ddp: data-parallel training of a small transformer with DistributedDataParallel, on real ranks.

Every rank builds the same TinyLM (tutor.labs.tiny_transformer, same seed), wraps it in
torch.nn.parallel.DistributedDataParallel and trains on its own shard of synthetic tokens (a seed
per rank), so the local gradients differ and only the all-reduce makes the replicas agree. DDP
groups gradients into buckets of about `bucket_cap_mb` (its first bucket is capped at 1 MiB) and
all-reduces each bucket as soon as its last gradient is ready, while the backward pass goes on
(PyTorch DDP design notes; Li et al., "PyTorch Distributed", VLDB 2020, section 3.2.3).

Measured on every rank, each a median over the steps, every phase started after a barrier:
- compute: forward + backward inside `no_sync()` (no all-reduce);
- communication: all-reduce of flat buffers of the bucket sizes DDP really used, one after another;
- DDP step: forward + backward with the bucketed all-reduce (DDP waits for the last bucket before
  backward returns);
- overlap = (compute + communication - step) / communication, clamped to 0..1: the share of the
  communication hidden behind the backward pass. On CPU ranks gloo's threads and the backward share
  the same cores, so the overlap here is small; on GPUs NCCL runs on its own streams.

The same communication hook times each bucket of the DDP step: when DDP handed it over (its last
gradient was ready) and when its all-reduce completed; the step of the median time on rank 0 is
reported as `bucket_timeline`, each bucket with the share of its all-reduce that ran before the last
bucket was ready (while backward still computed: bucket_overlap), and drawn as lanes (tutor.answers.pictures).

The gradient bytes handed to all-reduce per step are counted by a communication hook (the sum of the
bucket buffers), beside the parameter count x 4 bytes (FP32 gradients) and the ring traffic of
tutor.theory.parallel.data_parallel_comm_bytes (ZeRO paper arXiv 1910.02054 section 7: 2 Psi per
rank). After the steps, every rank's parameters are compared with rank 0's: replicas_identical.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from tutor.formatting import format_duration, format_number
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe

if TYPE_CHECKING:
    from rich.console import RenderableType

    from tutor.bench.ranks import RankContext

T = TypeVar("T")

VOCAB = 512
HEADS = 4
LR = 1e-3


def _param_count(hidden: int, layers: int) -> int:
    """Parameters of TinyLM in the llama style used here (no biases), counted as the model builds them:
    embedding + head (2·V·h), per layer 2 RMSNorm weights (2h), QKV (3h²), output projection (h²),
    SwiGLU gate/up (2·h·ffn) and down (ffn·h); a final RMSNorm (h)."""
    from tutor.labs.activation_memory import default_ffn

    ffn = default_ffn("llama", hidden)
    return 2 * VOCAB * hidden + layers * (2 * hidden + 4 * hidden * hidden + 3 * hidden * ffn) + hidden


def _median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else 0.0


def _ddp_rank(ctx: RankContext, p: dict) -> dict:
    """One rank: build, wrap, train, time, and report its parameters' digest and difference from rank 0."""
    import hashlib

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    from tutor.labs.activation_memory import default_ffn
    from tutor.labs.tiny_transformer import BlockShape, TinyLM

    device = torch.device(ctx.device)
    torch.manual_seed(p["seed"])
    shape = BlockShape(hidden=p["hidden"], heads=HEADS, kv_heads=HEADS, ffn=default_ffn("llama", p["hidden"]),
                       style="llama", attention="sdpa", dropout=0.0)
    model = TinyLM(shape, p["layers"], VOCAB).to(device).train()
    initial = torch.cat([w.detach().reshape(-1).float() for w in model.parameters()]).clone()
    ddp = DistributedDataParallel(model, bucket_cap_mb=p["bucket_cap_mb"],
                                  device_ids=[device.index] if device.type == "cuda" else None)
    buckets: list[int] = []  # bytes of each bucket handed to all-reduce in the current step
    # The current step's moments, seconds from its start: forward's end, backward's return, and per
    # bucket when DDP handed it to all-reduce (its last gradient was ready) and when the all-reduce
    # completed (the future's callback, on gloo's or NCCL's completion thread).
    marks: dict = {"start": 0.0, "buckets": []}

    def counting_hook(state, bucket):  # no annotations: DDP checks them against dist.GradBucket
        buffer = bucket.buffer()
        buckets.append(buffer.numel() * buffer.element_size())
        entry = {"index": bucket.index(), "bytes": buckets[-1], "ready_s": time.perf_counter() - marks["start"]}
        marks["buckets"].append(entry)

        def completed(future):
            if device.type == "cuda":
                # NCCL: the callback may run before the all-reduce's kernels finish, on a stream that
                # waits for them (torch.futures.Future.then): wait on that stream alone, not on backward's.
                torch.cuda.current_stream(device).synchronize()
            entry["done_s"] = time.perf_counter() - marks["start"]
            return future.value()

        return allreduce_hook(state, bucket).then(completed)

    ddp.register_comm_hook(dist.group.WORLD, counting_hook)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=LR)
    data = torch.Generator().manual_seed(p["seed"] * 100_003 + ctx.rank + 1)  # each rank its own shard
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def batch() -> torch.Tensor:
        return torch.randint(0, VOCAB, (p["batch"], p["seq"] + 1), generator=data).to(device)

    def forward_backward(ids: torch.Tensor) -> float:
        marks.update(start=time.perf_counter(), buckets=[])
        logits = ddp(ids[:, :-1])
        loss = F.cross_entropy(logits.view(-1, VOCAB), ids[:, 1:].reshape(-1))
        sync()
        marks["forward_s"] = time.perf_counter() - marks["start"]
        loss.backward()
        sync()
        marks["backward_s"] = time.perf_counter() - marks["start"]
        return float(loss.detach())

    def timed(work: Callable[[], T]) -> tuple[float, T]:
        sync()
        dist.barrier()
        start = time.perf_counter()
        out = work()
        sync()
        return time.perf_counter() - start, out

    def all_agree(flag: bool) -> bool:
        """Every rank must take the same branch, or one would wait in a collective the others skipped."""
        value = torch.tensor([1.0 if flag else 0.0], device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MIN)
        return bool(value.item() == 1.0)

    compute, comm, step, losses = [], [], [], []
    step_moments: list[tuple[float, dict]] = []
    step_buckets: list[int] = []
    deadline = time.perf_counter() + p["budget_s"]
    warmup = 1
    total = p["steps"] + warmup
    done = 0
    for index in range(total):
        go = not ctx.cancelled() and (index <= warmup or time.perf_counter() < deadline)
        if not all_agree(go):
            break
        ctx.progress(index / total, f"step {index + 1} of {total} on {ctx.world} ranks")
        ids = batch()
        with ddp.no_sync():  # compute alone: the same forward and backward, no all-reduce
            t_compute, _ = timed(lambda: forward_backward(ids))
        optimizer.zero_grad(set_to_none=True)
        buckets.clear()
        t_step, loss = timed(lambda: forward_backward(ids))
        step_buckets = list(buckets)
        moments = {"forward_s": marks["forward_s"], "backward_s": marks["backward_s"], "step_s": t_step,
                   "buckets": [dict(entry) for entry in marks["buckets"]]}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        flats = [torch.zeros(size // 4, device=device) for size in step_buckets]

        def all_reduce_buckets() -> None:
            for flat in flats:
                dist.all_reduce(flat)

        t_comm, _ = timed(all_reduce_buckets)
        losses.append(loss)
        if index >= warmup:
            compute.append(t_compute)
            step.append(t_step)
            comm.append(t_comm)
            step_moments.append((t_step, moments))
            done += 1
    with torch.no_grad():
        flat = torch.cat([w.detach().reshape(-1).float() for w in model.parameters()])
        reference = flat.clone()
        dist.broadcast(reference, src=0)
        difference = float((flat - reference).abs().max()) if flat.numel() else 0.0
        moved = float((flat - initial).abs().max())
    digest = hashlib.sha256(flat.cpu().numpy().tobytes()).hexdigest()[:16]
    return {"rank": ctx.rank, "steps": done, "compute_s": _median(compute), "comm_s": _median(comm),
            "step_s": _median(step), "buckets": step_buckets, "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None, "param_digest": digest,
            "max_difference_from_rank0": difference, "max_change_from_init": moved,
            "params": int(flat.numel()), "device": ctx.device, "backend": ctx.backend, "world": ctx.world,
            "cancelled": ctx.cancelled(),
            # The DDP step of the median time: its forward, backward and every bucket's all-reduce.
            "step_moments": sorted(step_moments, key=lambda item: item[0])[len(step_moments) // 2][1]
            if step_moments else None}


def bucket_overlap(moments: dict) -> list[dict]:
    """Per bucket of one DDP step, in the order DDP handed them to all-reduce: its bytes, when it was
    ready and done, and the share of its all-reduce that ran while backward was still computing
    (before the last bucket was ready: the last gradient is computed then), the rest exposed."""
    entries = sorted((b for b in moments.get("buckets") or () if "done_s" in b), key=lambda b: b["ready_s"])
    if not entries:
        return []
    compute_end = max(b["ready_s"] for b in entries)
    out = []
    for entry in entries:
        length = entry["done_s"] - entry["ready_s"]
        hidden = max(0.0, min(entry["done_s"], compute_end) - entry["ready_s"])
        out.append({**entry, "hidden_share": hidden / length if length > 0 else 1.0})
    return out


def overlap_fraction(compute_s: float, comm_s: float, step_s: float) -> float:
    """Share of the communication hidden behind compute: (compute + comm - step) / comm, clamped to 0..1
    (a step slower than compute + comm, e.g. from contention, is no overlap; faster than compute
    alone is all of it)."""
    if comm_s <= 0:
        return 0.0
    return min(1.0, max(0.0, (compute_s + comm_s - step_s) / comm_s))


def step_terms(compute_s: float, comm_s: float, step_s: float) -> dict[str, float]:
    """The DDP step as terms that add up to it exactly: step = compute + exposed communication + other.

    hidden = overlap x communication (the all-reduce that ran behind the backward pass), exposed =
    communication - hidden, and other = step - compute - exposed: positive when the step is slower than
    compute and all of its communication back to back (ranks contending for cores or the link), negative
    when compute ran faster inside the DDP step than under no_sync()."""
    hidden = overlap_fraction(compute_s, comm_s, step_s) * comm_s
    exposed = comm_s - hidden
    return {"compute_s": compute_s, "exposed_communication_s": exposed, "hidden_communication_s": hidden,
            "other_s": step_s - compute_s - exposed}


def step_summary(compute_s: float, comm_s: float, step_s: float) -> str:
    """'step S = compute C + exposed communication E [+ slowdown O]; ...': the printed terms add up to S."""
    terms = step_terms(compute_s, comm_s, step_s)
    text = (f"step {format_duration(step_s)} = compute {format_duration(compute_s)} + exposed communication "
            f"{format_duration(terms['exposed_communication_s'])}")
    other = terms["other_s"]
    if abs(other) >= 0.005 * step_s:  # below the third significant digit the sum already holds as printed
        text += (f" + slowdown {format_duration(other)} (ranks contending for cores or the link)" if other > 0 else
                 f" - {format_duration(-other)} (compute ran faster inside the DDP step than under no_sync)")
    overlap = overlap_fraction(compute_s, comm_s, step_s)
    hidden = (f"{format_duration(terms['hidden_communication_s'])} of it ({overlap:.0%})" if overlap > 0
              else "none of it")
    return text + f"; all-reduce {format_duration(comm_s)} alone, {hidden} hidden behind the backward pass"


def _memory_per_rank(p: dict) -> int:
    """A rank's interpreter with torch (tutor.bench.ranks) plus FP32 weights, gradients, AdamW's two
    states and DDP's bucket copy (5 x 4 B per parameter), plus activations at a generous 64 values
    per token per hidden unit per layer and the logits."""
    from tutor.bench.ranks import DEFAULT_MEMORY_PER_RANK

    params = _param_count(p["hidden"], p["layers"])
    tokens = p["batch"] * p["seq"]
    return DEFAULT_MEMORY_PER_RANK + 20 * params + 4 * tokens * (64 * p["hidden"] * p["layers"] + 3 * VOCAB)


def _ddp(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.errors import UserError
    from tutor.bench.ranks import run_lab_ranks

    if params["hidden"] % HEADS:
        raise UserError(f"ddp: hidden must be a multiple of {HEADS} (the heads), got {params['hidden']}")
    reports = run_lab_ranks("ddp", _ddp_rank, params, ranks=params["ranks"], timeout_s=60.0 + 3 * params["budget_s"],
                            progress=progress, cancel=cancel, memory_per_rank_bytes=_memory_per_rank(params))
    if reports is None:
        return ProbeResult("ddp", (), {}, "cancelled", True, "cpu")
    return ddp_result(reports, params)


def ddp_result(reports: list[dict], params: dict) -> ProbeResult:
    """The probe result from every rank's report (rank order)."""
    from tutor.theory.parallel import allreduce_bytes_per_rank, data_parallel_comm_bytes

    world = len(reports)
    first = reports[0]
    n_params = first["params"]
    identical = len({r["param_digest"] for r in reports}) == 1
    max_difference = max(r["max_difference_from_rank0"] for r in reports)
    bucket_bytes = sum(first["buckets"])
    compute = statistics.mean(r["compute_s"] for r in reports)
    comm = statistics.mean(r["comm_s"] for r in reports)
    step = statistics.mean(r["step_s"] for r in reports)
    overlap = overlap_fraction(compute, comm, step)
    theory = data_parallel_comm_bytes(params=n_params, dp=world, stage=0, bytes_per_grad=4)
    ring = allreduce_bytes_per_rank(bucket_bytes, world)
    per_rank = [{"rank": r["rank"], "compute_s": r["compute_s"], "communication_s": r["comm_s"],
                 "step_s": r["step_s"], "overlap": overlap_fraction(r["compute_s"], r["comm_s"], r["step_s"]),
                 "loss_first": r["loss_first"], "loss_last": r["loss_last"], "param_digest": r["param_digest"],
                 "max_difference_from_rank0": r["max_difference_from_rank0"]} for r in reports]
    details = {
        "replicas_identical": identical,
        "max_replica_difference": max_difference,
        "parameters_changed": min(r["max_change_from_init"] for r in reports) > 0,
        "ranks": world, "backend": first["backend"], "steps": first["steps"], "parameters": n_params,
        "buckets": {"count": len(first["buckets"]), "bytes": first["buckets"], "bucket_cap_mb": params["bucket_cap_mb"]},
        "gradient_bytes_per_step": {"measured": bucket_bytes, "theory": 4 * n_params},
        "communication_bytes_per_rank": {"measured": ring, "theory": theory.bytes_per_rank,
                                         "paper": theory.paper_bytes},
        "step_split": {"compute_s": compute, "communication_s": comm, "step_s": step, "overlap": overlap,
                       "communication_share": (step - compute) / step if step > 0 else 0.0,
                       **{k: v for k, v in step_terms(compute, comm, step).items() if k != "compute_s"}},
        "per_rank": per_rank,
        "bucket_timeline": _bucket_timeline(first.get("step_moments")),
    }
    metrics = {"replicas_identical": 1.0 if identical else 0.0, "max_replica_difference": max_difference,
               "compute_ms": compute * 1e3, "communication_ms": comm * 1e3, "step_ms": step * 1e3,
               "overlap": overlap, "exposed_communication_share": max(0.0, (step - compute) / step) if step else 0.0,
               "gradient_bytes_per_step": float(bucket_bytes), "buckets": float(len(first["buckets"]))}
    dp_source = "2(n-1)/n · 4Ψ, ring all-reduce of FP32 gradients (ZeRO paper §7; tutor.theory.parallel)"
    rows = (
        Measurement("replicas identical after training (1 = yes)", 1.0 if identical else 0.0, "", 1.0,
                    "all-reduced gradients and the same optimizer keep every replica equal",
                    f"largest difference from rank 0: {format_number(max_difference)}; {first['steps']} measured steps"),
        Measurement("gradient bytes all-reduced per step (sum of DDP's buckets)", float(bucket_bytes), "B",
                    float(4 * n_params), "parameters x 4 B (FP32 gradients)",
                    f"{len(first['buckets'])} buckets, bucket_cap_mb = {format_number(params['bucket_cap_mb'])}"),
        Measurement("bytes each rank sends per step, ring all-reduce of those buckets", float(ring), "B",
                    float(theory.bytes_per_rank), dp_source, f"{world} ranks, {first['backend']}"),
        Measurement("compute: forward + backward without all-reduce (no_sync)", compute * 1e3, "ms",
                    note="median over steps, mean over ranks"),
        Measurement("communication alone: all-reduce of the same buckets", comm * 1e3, "ms"),
        Measurement("DDP step: forward + backward with bucketed all-reduce", step * 1e3, "ms",
                    compute * 1e3 + comm * 1e3, "compute + communication with no overlap",
                    f"overlap {overlap:.0%} of the communication hidden behind the backward pass"),
    )
    summary = (f"{world} ranks: replicas {'identical' if identical else 'DIFFER'} after {first['steps']} steps; "
               + step_summary(compute, comm, step))
    return ProbeResult(probe="ddp", rows=rows, metrics=metrics, summary=summary, device=first["device"],
                       details=details)


def _bucket_timeline(moments: dict | None) -> dict | None:
    """Rank 0's DDP step of the median time: forward and backward ends, per bucket its all-reduce
    and the share of it hidden behind backward (bucket_overlap); None when nothing was measured."""
    if not moments:
        return None
    return {"forward_s": moments["forward_s"], "backward_s": moments["backward_s"], "step_s": moments["step_s"],
            "buckets": bucket_overlap(moments)}


def ddp_lanes(timeline: dict):
    """Rank 0's DDP step as lanes (tutor.answers.pictures): the forward and the backward, then one lane per bucket
    with its all-reduce, in the order DDP handed them over."""
    from tutor.formatting import format_bytes, format_percent
    from tutor.answers.pictures import Lane, Lanes, Span

    buckets = timeline["buckets"]
    compute_end = max((b["ready_s"] for b in buckets), default=timeline["backward_s"])
    lanes = [Lane("rank 0 compute", (Span(0.0, timeline["forward_s"], "F", "F"),
                                     Span(timeline["forward_s"], max(compute_end, timeline["forward_s"]), "B", "B")))]
    for number, bucket in enumerate(buckets):
        lanes.append(Lane(f"bucket {number} {format_bytes(bucket['bytes'])}",
                          (Span(bucket["ready_s"], bucket["done_s"], "AR",
                                f"{format_percent(bucket['hidden_share'])} hidden"),)))
    hidden = [b["hidden_share"] for b in buckets]
    notes = (f"backward returned at {format_duration(timeline['backward_s'])} (it waits for the last bucket); "
             "hidden: the share of each all-reduce that ran while backward still computed",) if hidden else ()
    return Lanes(title="one DDP step on rank 0: compute, and each bucket's all-reduce from ready to done",
                 lanes=tuple(lanes), kinds=(("F", "forward"), ("B", "backward"), ("AR", "all-reduce")),
                 length=max(timeline["backward_s"], max((b["done_s"] for b in buckets), default=0.0)),
                 idle="waiting", period=timeline["backward_s"], notes=notes)


def render_ddp(result: ProbeResult) -> RenderableType:
    """Per-rank bars: compute alone, communication alone, and the DDP step, on one time scale; under
    them rank 0's step with each bucket's all-reduce against the backward pass."""
    from rich.console import Group

    bars = _rank_bars(result)
    timeline = result.details.get("bucket_timeline")
    if not timeline or not timeline.get("buckets"):
        return bars
    from tutor.answers.pictures import lanes_with_table

    return Group(bars, lanes_with_table(ddp_lanes(timeline)))


def _rank_bars(result: ProbeResult) -> RenderableType:
    from rich.table import Table
    from rich.text import Text

    ranks = result.details.get("per_rank", [])
    table = Table(title="Step time per rank (one scale)", title_justify="left", show_edge=False)
    for column in ("rank", "phase", "time", ""):
        table.add_column(column)
    longest = max([max(r["compute_s"], r["communication_s"], r["step_s"]) for r in ranks] or [0.0])
    width = 40
    phases = (("compute", "compute_s", "green"), ("communication", "communication_s", "magenta"),
              ("DDP step", "step_s", "cyan"))
    for r in ranks:
        for index, (label, key, style) in enumerate(phases):
            value = r[key]
            cells = round(width * value / longest) if longest > 0 else 0
            table.add_row(str(r["rank"]) if index == 0 else "", label, f"{value * 1e3:,.3g} ms",
                          Text("█" * cells, style=style))
    return table


DDP = make_probe(
    name="ddp",
    title="Data parallelism with DDP",
    description="Trains a small transformer on local ranks with DistributedDataParallel: replicas checked "
                "identical, gradient bytes per step, and the step split into compute, communication and overlap.",
    needs_torch=True,
    params=(
        Param("ranks", "int", 2, "local processes (data-parallel replicas)", minimum=2, maximum=64),
        Param("steps", "int", 6, "measured training steps (after one warm-up)", minimum=1, maximum=200),
        Param("hidden", "int", 64, "hidden size", minimum=8, maximum=256),
        Param("layers", "int", 2, "transformer layers", minimum=1, maximum=4),
        Param("batch", "int", 8, "sequences per rank per step", minimum=1, maximum=64),
        Param("seq", "int", 64, "tokens per sequence", minimum=2, maximum=256),
        Param("bucket_cap_mb", "float", 0.25, "DDP bucket size in MiB (DDP's default is 25; small here so the "
              "tiny model spans several buckets)", minimum=0.01, maximum=1024.0),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(6.0, "seconds of training after the ranks start"),
    ),
    metrics=("replicas_identical", "max_replica_difference", "compute_ms", "communication_ms", "step_ms", "overlap",
             "exposed_communication_share", "gradient_bytes_per_step", "buckets"),
    body=_ddp,
    render=render_ddp,
)
