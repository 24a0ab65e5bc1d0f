"""Splitting a model over devices: ZeRO/FSDP sharding, tensor, pipeline and expert parallelism,
the pipeline bubble, and the bytes each rank moves per step.

Sources:
- ZeRO: Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models",
  arXiv 1910.02054, Figure 1, Table 1 (memory) and §7 (communication volume).
- Megatron-LM: Shoeybi et al. arXiv 1909.08053 §3 (tensor parallel all-reduces); Narayanan et al.
  arXiv 2104.04473 §2.2 (1F1B and interleaved pipeline bubble); Korthikanti et al. arXiv 2205.05198
  §4.2.2 (sequence parallelism: reduce-scatter + all-gather instead of all-reduce).
- GPipe: Huang et al. arXiv 1811.06965 §2.3 (bubble (K-1)/(M+K-1)).
- Collective volumes and bus bandwidth: NVIDIA/nccl-tests doc/PERFORMANCE.md.

Sizes are bytes (ints, rounded up to whole bytes where a formula gives a fraction); ratios are
exact Fractions so that a lesson can print 3/11 rather than 0.27272727.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Rational

from tutor.errors import UserError
from tutor.theory.checks import MAX_DIMENSION, MAX_LAYERS, bounded_int, positive_int

Number = int | float | Fraction


def _exact(value: Number, name: str) -> Fraction:
    """A byte count as an exact Fraction; floats are read as the decimal the user typed (0.1, not 0.1000…0555)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Rational)):
        raise UserError(f"{name} must be a number, got {value!r}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"{name} must be a finite number, got {value!r}")
        exact = Fraction(repr(value))
    else:
        exact = Fraction(value)
    if exact < 0:
        raise UserError(f"{name} must not be negative, got {value!r}")
    return exact


def _positive_int(value: int | float, name: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 7.5e9 typed as a float is still a whole count
    return positive_int(value, name)


def _ceil(value: Fraction) -> int:
    return math.ceil(value)


# --------------------------------------------------------------------------------------------
# ZeRO / FSDP model-state sharding
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelStates:
    """Bytes of model states held on ONE data-parallel device (activations not included)."""

    weights: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer


ZERO_STAGES = (0, 1, 2, 3)


def zero_model_states(
    *,
    params: int,
    dp: int,
    stage: int,
    weight_bytes: Number = 2,
    grad_bytes: Number = 2,
    optimizer_bytes: Number = 12,
) -> ModelStates:
    """Per-device bytes of weights, gradients and optimizer states under ZeRO stage 0-3.

    ZeRO paper (arXiv 1910.02054), Figure 1 and Table 1, with Ψ params, K optimizer bytes/param:
    stage 0 (plain DP) keeps everything: (2 + 2 + K)Ψ = 16Ψ;
    stage 1 (P_os) shards the optimizer: 4Ψ + KΨ/N_d;
    stage 2 (P_os+g) also the gradients: 2Ψ + (2 + K)Ψ/N_d;
    stage 3 (P_os+g+p) also the weights: (2 + 2 + K)Ψ/N_d.
    PyTorch FSDP: NO_SHARD = stage 0, SHARD_GRAD_OP = stage 2, FULL_SHARD = stage 3, and
    HYBRID_SHARD = stage 3 inside each shard group (pass that group's size, usually the GPUs
    of one node, as `dp`); see `zero_stage_for_fsdp`.

    The byte arguments may be fractional (8-bit Adam: optimizer_bytes=2 or 6 with the fp32 master);
    each component is rounded up to whole bytes per device.
    """
    params = _positive_int(params, "params")
    dp = _positive_int(dp, "data-parallel size (dp)")
    if stage not in ZERO_STAGES:
        raise UserError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    weights = _exact(weight_bytes, "weight_bytes") * params
    grads = _exact(grad_bytes, "grad_bytes") * params
    optim = _exact(optimizer_bytes, "optimizer_bytes") * params
    return ModelStates(
        weights=_ceil(weights / dp if stage >= 3 else weights),
        gradients=_ceil(grads / dp if stage >= 2 else grads),
        optimizer=_ceil(optim / dp if stage >= 1 else optim),
    )


_FSDP_TO_ZERO = {
    "NO_SHARD": 0,
    "SHARD_GRAD_OP": 2,
    "FULL_SHARD": 3,
    "HYBRID_SHARD": 3,
    "_HYBRID_SHARD_ZERO2": 2,
}


def zero_stage_for_fsdp(strategy: str) -> int:
    """The ZeRO stage whose memory formula matches a PyTorch FSDP `ShardingStrategy`.

    NO_SHARD ≈ DDP (0), SHARD_GRAD_OP ≈ ZeRO-2, FULL_SHARD ≈ ZeRO-3 (mapping table of
    cli99/llm-analysis README; PyTorch FSDP docs). HYBRID_SHARD is FULL_SHARD within a shard
    group and replication across groups (3, with dp = the shard group's size);
    _HYBRID_SHARD_ZERO2 is SHARD_GRAD_OP within the group (2).
    Accepts 'full_shard', 'FULL_SHARD', 'ShardingStrategy.FULL_SHARD' or 'full-shard'.
    """
    if not isinstance(strategy, str):
        raise UserError(f"FSDP sharding strategy must be a name such as FULL_SHARD, got {strategy!r}")
    key = strategy.strip().rsplit(".", 1)[-1].upper().replace("-", "_")
    if key not in _FSDP_TO_ZERO:
        choices = ", ".join(name for name in _FSDP_TO_ZERO if not name.startswith("_"))
        raise UserError(f"unknown FSDP sharding strategy {strategy!r} (choose one of {choices})")
    return _FSDP_TO_ZERO[key]


def megatron_bytes_per_param(*, dp: int, distributed_optimizer: bool) -> Fraction:
    """Model-state bytes per parameter on one device in Megatron-LM mixed-precision training.

    NVIDIA/Megatron-LM megatron/training/theoretical_memory_usage.py: bf16 weight (2) + fp32
    main_grad (4) + fp32 master weight, Adam m and v (12) = 18 without the distributed optimizer;
    with it the 12 optimizer bytes are sharded over the data-parallel group: 6 + 12/dp.
    """
    dp = _positive_int(dp, "data-parallel size (dp)")
    return Fraction(6) + Fraction(12, dp) if distributed_optimizer else Fraction(18)


def megatron_distributed_optimizer_bytes_per_param(dp: int) -> Fraction:
    """6 + 12/dp bytes per parameter: Megatron's distributed optimizer (≈ ZeRO-1 with fp32 grads)."""
    return megatron_bytes_per_param(dp=dp, distributed_optimizer=True)


# --------------------------------------------------------------------------------------------
# Tensor, pipeline and expert parallel splits
# --------------------------------------------------------------------------------------------

def tensor_parallel_split(size: int, tp: int, *, what: str = "dimension") -> int:
    """The share of `size` (heads, FFN width, padded vocab…) one tensor-parallel rank holds.

    Megatron-LM splits attention heads and MLP columns evenly and requires tp to divide them
    (megatron/core/utils.py `divide` asserts divisibility); so does vLLM.
    """
    size = bounded_int(_positive_int(size, what), what, MAX_DIMENSION)  # the divisor search is O(sqrt(size))
    tp = _positive_int(tp, "tensor-parallel size (tp)")
    if size % tp:
        small = [d for d in range(1, math.isqrt(size) + 1) if size % d == 0]
        divisors = set(small) | {size // d for d in small}
        nearest = sorted(sorted(divisors, key=lambda d: abs(d - tp))[:4])
        raise UserError(
            f"tensor-parallel size {tp} does not divide {what} {size} "
            f"(use a divisor of {size} such as {', '.join(map(str, nearest))})"
        )
    return size // tp


def padded_vocab_size(vocab: int, tp: int, multiple: int = 128) -> int:
    """Vocabulary rows after Megatron's padding, so the embedding splits evenly over tp ranks.

    Megatron-LM `_vocab_size_with_padding` (megatron/training/tokenizer): round the vocab up to a
    multiple of make_vocab_size_divisible_by (default 128) × tp. GPT-2's 50257 becomes 50304.
    """
    vocab = _positive_int(vocab, "vocabulary size")
    tp = _positive_int(tp, "tensor-parallel size (tp)")
    multiple = _positive_int(multiple, "vocabulary padding multiple")
    step = multiple * tp
    return -(-vocab // step) * step


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    """KV heads (and so KV-cache share) on one tensor-parallel rank: max(1, kv_heads / tp).

    When tp > kv_heads each rank still keeps one KV head, a replica (vLLM `QKVParallelLinear`;
    cli99/llm-analysis uses max(n_kv/tp, 1)). vLLM requires kv_heads % tp == 0 when
    tp <= kv_heads and tp % kv_heads == 0 otherwise; other layouts are rejected here too.
    """
    kv_heads = _positive_int(kv_heads, "KV heads")
    tp = _positive_int(tp, "tensor-parallel size (tp)")
    if tp <= kv_heads and kv_heads % tp:
        raise UserError(f"tensor-parallel size {tp} must divide the {kv_heads} KV heads")
    if tp > kv_heads and tp % kv_heads:
        raise UserError(
            f"tensor-parallel size {tp} exceeds the {kv_heads} KV heads and is not a multiple of them "
            f"(use a multiple of {kv_heads} so each head is replicated evenly)"
        )
    return max(1, kv_heads // tp)


def experts_per_rank(num_experts: int, ep: int) -> int:
    """Routed experts resident on one expert-parallel rank: num_experts / ep.

    Megatron-LM and DeepSpeed-MoE place num_experts/ep whole experts per rank and require ep to
    divide the expert count.
    """
    num_experts = _positive_int(num_experts, "number of experts")
    ep = _positive_int(ep, "expert-parallel size (ep)")
    if num_experts % ep:
        raise UserError(f"expert-parallel size {ep} must divide the {num_experts} experts")
    return num_experts // ep


def layers_per_pipeline_stage(
    num_layers: int,
    pp: int,
    *,
    first_stage_layers: int | None = None,
    last_stage_layers: int | None = None,
) -> list[int]:
    """Transformer layers on each of the pp pipeline stages, first stage first.

    Megatron-LM (`get_num_layers_to_build`) splits evenly and asserts that pp divides the layers;
    uneven splits are set explicitly with num_layers_in_first/last_pipeline_stage, and the rest
    must then divide evenly over the middle stages (UserError here when they do not).
    When pp does not divide the layers and no override is given, this follows DeepSpeed's
    `partition_uniform` (deepspeed/runtime/utils.py): the remainder goes one layer each to the
    earliest stages, which also hold the input embedding, so stage 0 is the most loaded.
    """
    num_layers = bounded_int(_positive_int(num_layers, "number of layers"), "number of layers", MAX_LAYERS)
    pp = _positive_int(pp, "pipeline-parallel size (pp)")  # <= num_layers below: one list entry per stage
    if pp > num_layers:
        raise UserError(f"pipeline-parallel size {pp} exceeds the {num_layers} layers (use pp <= {num_layers})")
    if first_stage_layers is None and last_stage_layers is None:
        base, extra = divmod(num_layers, pp)
        return [base + (1 if stage < extra else 0) for stage in range(pp)]
    if pp == 1:
        raise UserError("first/last stage layer counts need a pipeline-parallel size of at least 2")
    first = num_layers if first_stage_layers is None else first_stage_layers
    last = num_layers if last_stage_layers is None else last_stage_layers
    for value, name in ((first_stage_layers, "first"), (last_stage_layers, "last")):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise UserError(f"{name}-stage layer count must be a whole number >= 0, got {value!r}")
    rest, middle = num_layers, pp
    if first_stage_layers is not None:
        rest, middle = rest - first, middle - 1
    if last_stage_layers is not None:
        rest, middle = rest - last, middle - 1
    if rest < 0 or (middle == 0 and rest != 0) or (middle > 0 and rest % middle):
        raise UserError(
            f"{num_layers} layers cannot be split as first={first_stage_layers}, last={last_stage_layers} "
            f"with the other {middle} stages equal"
        )
    each = rest // middle if middle else 0
    stages = [each] * pp
    if first_stage_layers is not None:
        stages[0] = first
    if last_stage_layers is not None:
        stages[-1] = last
    return stages


@dataclass(frozen=True)
class PipelineStage:
    """What one pipeline stage holds besides its share of transformer layers."""

    index: int
    layers: int
    input_embedding: bool
    output_head: bool

    @property
    def embedding_matrices(self) -> int:
        """vocab × hidden matrices resident on this stage (weights, and their grads/optimizer)."""
        return int(self.input_embedding) + int(self.output_head)


def embedding_stages(pp: int) -> tuple[int, int]:
    """(stage holding the input embedding, stage holding the LM head) = (0, pp - 1).

    Megatron-LM `LanguageModule.setup_embeddings_and_output_layer`: the word embedding lives on
    the first stage and the output layer on the last. With tied embeddings and pp > 1 the last
    stage keeps its own copy of the word embedding and the two copies' gradients are all-reduced
    over the "embedding group", so the tied matrix is resident twice.
    """
    pp = _positive_int(pp, "pipeline-parallel size (pp)")
    return 0, pp - 1


def pipeline_stages(num_layers: int, pp: int, *, tied_embeddings: bool) -> list[PipelineStage]:
    """Per-stage layout: layers (see `layers_per_pipeline_stage`) and embedding/head placement.

    With pp = 1 and tied embeddings one matrix serves both ends; otherwise (untied, or pp > 1
    where Megatron keeps a copy on the last stage, see `embedding_stages`) each end holds one.
    """
    layers = layers_per_pipeline_stage(num_layers, pp)
    first, last = embedding_stages(pp)
    stages = []
    for index, count in enumerate(layers):
        head = index == last and not (pp == 1 and tied_embeddings)
        stages.append(PipelineStage(index=index, layers=count, input_embedding=index == first, output_head=head))
    return stages


# --------------------------------------------------------------------------------------------
# Pipeline bubble
# --------------------------------------------------------------------------------------------

def _bubble_args(stages: int, microbatches: int, interleave: int) -> tuple[int, int, int]:
    return (
        _positive_int(stages, "pipeline stages"),
        _positive_int(microbatches, "micro-batches"),
        _positive_int(interleave, "interleave (virtual stages per device)"),
    )


def pipeline_bubble_fraction(*, stages: int, microbatches: int, interleave: int = 1) -> Fraction:
    """Share of a training step's time that a pipeline device sits idle: (p-1) / (v·m + p-1).

    GPipe (Huang et al. arXiv 1811.06965 §2.3): bubble O((K-1)/(M+K-1)) for K stages and M
    micro-batches. 1F1B has the same bubble; the interleaved schedule with v model chunks per
    device divides the bubble time by v (Narayanan et al. arXiv 2104.04473 §2.2.2).
    """
    p, m, v = _bubble_args(stages, microbatches, interleave)
    return Fraction(p - 1, v * m + p - 1)


def pipeline_bubble_ratio(*, stages: int, microbatches: int, interleave: int = 1) -> Fraction:
    """Bubble time over ideal compute time: (1/v)·(p-1)/m (Narayanan et al. arXiv 2104.04473 §2.2)."""
    p, m, v = _bubble_args(stages, microbatches, interleave)
    return Fraction(p - 1, v * m)


PIPELINE_SCHEDULES = ("gpipe", "1f1b")


def pipeline_microbatches_in_flight(*, schedule: str, stages: int, stage: int, microbatches: int) -> int:
    """Micro-batches whose activations a stage holds at once (forward done, backward not yet).

    GPipe runs every forward before any backward, so each stage holds all m (Huang et al. arXiv
    1811.06965 §2.3; the paper re-computes activations to avoid it, torch's ScheduleGPipe does not). 1F1B (PipeDream-Flush) starts the backward as soon as it can: stage i
    (0-based) holds at most p - i, the first stage p (Narayanan et al. arXiv 2104.04473 §2.2.1).
    """
    p, m, _v = _bubble_args(stages, microbatches, 1)
    if isinstance(stage, bool) or not isinstance(stage, int) or not 0 <= stage < p:
        raise UserError(f"stage must be a whole number from 0 to {p - 1}, got {stage!r}")
    name = str(schedule).strip().lower()
    if name not in PIPELINE_SCHEDULES:
        raise UserError(f"unknown pipeline schedule {schedule!r} (choose one of {', '.join(PIPELINE_SCHEDULES)})")
    return m if name == "gpipe" else min(m, p - stage)


# --------------------------------------------------------------------------------------------
# Collectives (NVIDIA/nccl-tests doc/PERFORMANCE.md)
# --------------------------------------------------------------------------------------------

_COLLECTIVE_ALIASES = {
    "allreduce": "all_reduce",
    "reducescatter": "reduce_scatter",
    "allgather": "all_gather",
    "alltoall": "all_to_all",
    "broadcast": "broadcast",
    "reduce": "reduce",
}
COLLECTIVES = tuple(_COLLECTIVE_ALIASES.values())


def _collective(op: str) -> str:
    key = str(op).lower().replace("_", "").replace("-", "").replace(" ", "")
    if key not in _COLLECTIVE_ALIASES:
        raise UserError(f"unknown collective {op!r} (choose one of {', '.join(COLLECTIVES)})")
    return _COLLECTIVE_ALIASES[key]


def bus_bandwidth_factor(op: str, ranks: int) -> Fraction:
    """busbw / algbw for a collective on n ranks (nccl-tests doc/PERFORMANCE.md).

    all_reduce 2(n-1)/n; reduce_scatter, all_gather, all_to_all (n-1)/n; broadcast, reduce 1.
    It is also the bytes each rank sends per byte of buffer with the bandwidth-optimal algorithms.
    On one rank a collective moves nothing and the factor is 0 (broadcast/reduce: 1, as nccl-tests).
    """
    name = _collective(op)
    n = _positive_int(ranks, "ranks")
    if name == "all_reduce":
        return Fraction(2 * (n - 1), n)
    if name in ("reduce_scatter", "all_gather", "all_to_all"):
        return Fraction(n - 1, n)
    return Fraction(1)


def algorithm_bandwidth(size: int, seconds: float) -> float:
    """algbw = S / t in bytes per second, S the buffer size (nccl-tests doc/PERFORMANCE.md)."""
    size_bytes = _exact(size, "buffer size")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        raise UserError(f"time must be a positive number of seconds, got {seconds!r}")
    return float(size_bytes) / seconds


def bus_bandwidth(op: str, algbw: float, ranks: int) -> float:
    """busbw = algbw × factor: the speed of the bottleneck link, comparable across rank counts."""
    if isinstance(algbw, bool) or not isinstance(algbw, (int, float)) or algbw < 0 or not math.isfinite(algbw):
        raise UserError(f"algorithm bandwidth must be a number of bytes/s >= 0, got {algbw!r}")
    return algbw * float(bus_bandwidth_factor(op, ranks))


def _bytes_per_rank(op: str, size: int, ranks: int) -> int:
    return _ceil(_exact(size, "buffer size") * bus_bandwidth_factor(op, ranks))


def allreduce_bytes_per_rank(size: int, ranks: int) -> int:
    """Bytes each rank sends (and receives) in a ring all-reduce of S bytes: 2(n-1)/n · S."""
    return _bytes_per_rank("all_reduce", size, ranks)


def reduce_scatter_bytes_per_rank(size: int, ranks: int) -> int:
    """Bytes each rank sends in a reduce-scatter whose full (unscattered) buffer is S: (n-1)/n · S."""
    return _bytes_per_rank("reduce_scatter", size, ranks)


def allgather_bytes_per_rank(size: int, ranks: int) -> int:
    """Bytes each rank receives in an all-gather whose gathered buffer is S: (n-1)/n · S."""
    return _bytes_per_rank("all_gather", size, ranks)


def alltoall_bytes_per_rank(size: int, ranks: int) -> int:
    """Bytes each rank sends in an all-to-all of an S-byte buffer: the (n-1)/n · S not kept locally."""
    return _bytes_per_rank("all_to_all", size, ranks)


# --------------------------------------------------------------------------------------------
# Traffic per training step for each kind of parallelism
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class CommVolume:
    """Bytes one rank sends per step: exact ring-algorithm volume and the paper's large-n form."""

    bytes_per_rank: int
    paper_bytes: int
    collectives: tuple[str, ...]


def data_parallel_comm_bytes(*, params: int, dp: int, stage: int, bytes_per_grad: Number = 2) -> CommVolume:
    """Gradient/parameter traffic per rank per step for data parallelism with ZeRO stage 0-3.

    ZeRO paper (arXiv 1910.02054) §7: plain DP all-reduces the gradients, 2Ψ per rank (as a
    reduce-scatter Ψ + all-gather Ψ); stages 1 and 2 reduce-scatter the gradients and all-gather
    the updated parameters, also 2Ψ; stage 3 all-gathers the parameters in the forward and again in
    the backward pass plus a gradient reduce-scatter, 3Ψ (1.5×). `paper_bytes` is that asymptotic
    2Ψ/3Ψ (times bytes per value); `bytes_per_rank` the exact ring volume with (n-1)/n per pass
    (nccl-tests), 0 when dp = 1.
    """
    params = _positive_int(params, "params")
    dp = _positive_int(dp, "data-parallel size (dp)")
    if stage not in ZERO_STAGES:
        raise UserError(f"ZeRO stage must be 0, 1, 2 or 3, got {stage!r}")
    size = _exact(bytes_per_grad, "bytes_per_grad") * params
    if stage == 0:
        collectives: tuple[str, ...] = ("all_reduce",)
    elif stage in (1, 2):
        collectives = ("reduce_scatter", "all_gather")
    else:
        collectives = ("all_gather", "all_gather", "reduce_scatter")
    passes = 2 if stage < 3 else 3
    return CommVolume(
        bytes_per_rank=_ceil(size * passes * Fraction(dp - 1, dp)),
        paper_bytes=_ceil(size * passes) if dp > 1 else 0,
        collectives=collectives,
    )


def tensor_parallel_comm_bytes_per_layer(
    *,
    seq_len: int,
    batch: int,
    hidden: int,
    tp: int,
    bytes_per_value: Number = 2,
    sequence_parallel: bool = False,
    training: bool = True,
) -> int:
    """Bytes one tensor-parallel rank sends per transformer layer per micro-batch.

    Megatron-LM (Shoeybi et al. arXiv 1909.08053 §3, Figure 4): two all-reduces of the b·s·h
    activations in the forward pass (after attention, after the MLP) and two in the backward pass.
    With sequence parallelism (Korthikanti et al. arXiv 2205.05198 §4.2.2) each all-reduce becomes
    an all-gather + reduce-scatter pair of the same total volume, so the bytes are equal:
    2(t-1)/t · b·s·h·bytes per all-reduce. Inference (training=False) has the forward two only.
    """
    size = (
        _positive_int(seq_len, "sequence length")
        * _positive_int(batch, "batch")
        * _positive_int(hidden, "hidden size")
        * _exact(bytes_per_value, "bytes_per_value")
    )
    tp = _positive_int(tp, "tensor-parallel size (tp)")
    collectives = 4 if training else 2
    if sequence_parallel:
        per_collective = size * Fraction(tp - 1, tp) * 2  # all-gather + reduce-scatter
    else:
        per_collective = size * Fraction(2 * (tp - 1), tp)
    return _ceil(per_collective * collectives)


def pipeline_p2p_bytes_per_microbatch(
    seq_len: int, batch: int, hidden: int, bytes_per_value: Number = 2, *, training: bool = True
) -> int:
    """Bytes a pipeline stage sends to its neighbour per micro-batch: the s·b·h boundary activation.

    Narayanan et al. (arXiv 2104.04473) §2.2 / §4.1: each stage boundary carries the b·s·h hidden
    state forward and, in training, its gradient back (same size). Interleaving multiplies the
    number of boundaries a micro-batch crosses by v.
    """
    size = (
        _positive_int(seq_len, "sequence length")
        * _positive_int(batch, "batch")
        * _positive_int(hidden, "hidden size")
        * _exact(bytes_per_value, "bytes_per_value")
    )
    return _ceil(size * (2 if training else 1))


def expert_parallel_alltoall_bytes(
    tokens: int, hidden: int, top_k: int, ep: int, bytes_per_value: Number = 2
) -> int:
    """Bytes one expert-parallel rank sends per MoE layer forward: dispatch + combine all-to-all.

    Each of the rank's tokens goes to top_k experts (GShard, Lepikhin et al. arXiv 2006.16668 §2.2;
    DeepSpeed-MoE); with experts spread evenly and uniform routing, a share (ep-1)/ep of the
    tokens·k·h activations leaves the rank on dispatch and the same comes back on combine
    (nccl-tests all-to-all factor). Without token dropping; the backward pass doubles it.
    """
    size = (
        _positive_int(tokens, "tokens")
        * _positive_int(hidden, "hidden size")
        * _positive_int(top_k, "top_k")
        * _exact(bytes_per_value, "bytes_per_value")
    )
    ep = _positive_int(ep, "expert-parallel size (ep)")
    return _ceil(2 * size * Fraction(ep - 1, ep))


# --------------------------------------------------------------------------------------------
# Hiding the data-parallel all-reduce behind the backward pass (PyTorch DDP)
# --------------------------------------------------------------------------------------------

# torch.nn.parallel.DistributedDataParallel's defaults: bucket_cap_mb=25 (MiB), and the bucket of the
# first gradients to be ready capped at 1 MiB (torch.distributed's _DEFAULT_FIRST_BUCKET_BYTES) so that
# communication starts early in the backward pass.
DDP_BUCKET_BYTES = 25 * 2**20
DDP_FIRST_BUCKET_BYTES = 2**20


def ddp_bucket_sizes(grad_bytes: int, bucket_bytes: int = DDP_BUCKET_BYTES,
                     first_bucket_bytes: int | None = DDP_FIRST_BUCKET_BYTES) -> tuple[int, ...]:
    """The gradient buckets DDP all-reduces, in the order they become ready during backward.

    DDP fills buckets in reverse parameter order (the order backward produces gradients) up to
    `bucket_bytes` each, the first one up to `first_bucket_bytes` (None: the same cap); the last
    holds the remainder (Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel
    Training", VLDB 2020, arXiv 2006.15704, §3.2.3 and §4.2; torch's `bucket_cap_mb=25`). Real
    buckets end on parameter boundaries; this splits the bytes as if parameters were small.
    """
    total = _positive_int(grad_bytes, "gradient bytes")
    cap = _positive_int(bucket_bytes, "bucket bytes")
    first = cap if first_bucket_bytes is None else _positive_int(first_bucket_bytes, "first bucket bytes")
    sizes = [min(first, total)]
    left = total - sizes[0]
    while left > 0:
        sizes.append(min(cap, left))
        left -= sizes[-1]
    return tuple(sizes)


@dataclass(frozen=True)
class BucketAllReduce:
    """One bucket's all-reduce: when its last gradient was ready, and when its all-reduce ran."""

    index: int
    bytes: int
    ready_s: float
    start_s: float
    end_s: float


@dataclass(frozen=True)
class OverlapSchedule:
    """Backward and the bucketed all-reduce of one data-parallel step, on one timeline from backward's start."""

    backward_s: float
    buckets: tuple[BucketAllReduce, ...]

    @property
    def communication_s(self) -> float:
        """Every all-reduce back to back: what the step would add with no overlap at all."""
        return sum(bucket.end_s - bucket.start_s for bucket in self.buckets)

    @property
    def end_s(self) -> float:
        """When the step's gradients are all reduced: after the backward and the last all-reduce."""
        return max([self.backward_s] + [bucket.end_s for bucket in self.buckets])

    @property
    def exposed_s(self) -> float:
        """Communication the step waits for after backward ends: end - backward."""
        return self.end_s - self.backward_s

    @property
    def hidden_fraction(self) -> float:
        """Share of the communication that ran under the backward pass: 1 - exposed / communication."""
        if self.communication_s <= 0:
            return 1.0
        return min(1.0, max(0.0, 1.0 - self.exposed_s / self.communication_s))


def allreduce_time(size: int, ranks: int, *, busbw: float, latency_s: float = 0.0) -> float:
    """Seconds for a ring all-reduce of `size` bytes: latency + size x 2(n-1)/n / busbw.

    busbw is the bus bandwidth in bytes/s that nccl-tests reports (doc/PERFORMANCE.md): the rate of
    the slowest link, so the data each rank moves, 2(n-1)/n of the buffer, divided by it is the time.
    """
    if isinstance(busbw, bool) or not isinstance(busbw, (int, float)) or not math.isfinite(busbw) or busbw <= 0:
        raise UserError(f"bus bandwidth must be a positive number of bytes/s, got {busbw!r}")
    if isinstance(latency_s, bool) or not isinstance(latency_s, (int, float)) or not math.isfinite(latency_s) \
            or latency_s < 0:
        raise UserError(f"latency must be a number of seconds >= 0, got {latency_s!r}")
    return latency_s + float(_exact(size, "buffer size") * bus_bandwidth_factor("all_reduce", ranks)) / busbw


def ddp_overlap(*, backward_s: float, grad_bytes: int, ranks: int, busbw: float, latency_s: float = 0.0,
                bucket_bytes: int = DDP_BUCKET_BYTES,
                first_bucket_bytes: int | None = DDP_FIRST_BUCKET_BYTES) -> OverlapSchedule:
    """When each gradient bucket's all-reduce runs while backward computes, and what is left exposed.

    The model of DDP's reducer (Li et al., VLDB 2020, arXiv 2006.15704, §3.2.3): a bucket is
    all-reduced as soon as its last gradient is ready, buckets in order on one communication stream
    (one all-reduce at a time), while backward goes on. Assumed: backward produces gradient bytes at
    a steady rate, so bucket i is ready when the bytes up to its end are, at backward_s x (bytes so
    far / grad_bytes); each all-reduce takes `allreduce_time`. Then
    start_i = max(ready_i, end_(i-1)), end_i = start_i + t_i, exposed = max(0, end_last - backward_s).

    Two regimes follow: if every bucket's all-reduce is shorter than the backward time that fills the
    next bucket, the communication keeps up and only the last bucket's all-reduce (ready when backward
    ends) is exposed; otherwise it falls behind, and exposed = first bucket's ready time + the sum
    of all t_i - backward_s.
    """
    if isinstance(backward_s, bool) or not isinstance(backward_s, (int, float)) or not math.isfinite(backward_s) \
            or backward_s < 0:
        raise UserError(f"backward time must be a number of seconds >= 0, got {backward_s!r}")
    sizes = ddp_bucket_sizes(grad_bytes, bucket_bytes, first_bucket_bytes)
    total = sum(sizes)
    buckets = []
    done = 0
    free_at = 0.0
    for index, size in enumerate(sizes):
        done += size
        ready = float(backward_s) if done == total else backward_s * done / total  # exact end: no rounding past it
        start = max(ready, free_at)
        free_at = start + allreduce_time(size, ranks, busbw=busbw, latency_s=latency_s)
        buckets.append(BucketAllReduce(index=index, bytes=size, ready_s=ready, start_s=start, end_s=free_at))
    return OverlapSchedule(backward_s=float(backward_s), buckets=tuple(buckets))
