"""Activation memory of training: what the forward pass keeps alive for the backward pass.

Source: Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models",
arXiv 2205.05198 (MLSys 2023), §4.1 (per-tensor derivation), Table 2 (per-layer totals), §4.2.3
(pipeline in-flight micro-batches); Megatron-LM `megatron/training/theoretical_memory_usage.py`
(embedding and output-layer terms, interleaved-schedule penalty).

Symbols: s sequence length, b micro-batch size, h hidden size, a attention heads, t tensor-parallel
size, L layers, p pipeline stages, V vocabulary. All results are bytes on ONE tensor-parallel rank
for ONE micro-batch. Sums are exact Fractions; the final byte count is rounded up (a tensor shard
of a fractional byte is still a whole byte).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from tutor.errors import UserError
from tutor.theory.checks import positive_int
from tutor.theory.parallel import kv_heads_per_rank

RECOMPUTE_MODES = ("none", "selective", "full")
ATTENTION_KINDS = ("eager", "flash")

# Korthikanti §4.1: dropout masks are stored as one byte per element, whatever the activation dtype.
DROPOUT_MASK_BYTES = 1
# FlashAttention keeps the softmax log-sum-exp in fp32, one value per query position and head.
LOGSUMEXP_BYTES = 4
# Token ids are int64 (torch.long), the dtype nn.Embedding and cross-entropy expect.
TOKEN_ID_BYTES = 8



def _choice(value: str, name: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise UserError(f"unknown {name} {value!r} (choose one of: {', '.join(allowed)})")
    return value


def _heads_per_rank(heads: int, tp: int) -> int:
    if heads % tp:
        raise UserError(
            f"tensor-parallel size {tp} must divide the {heads} attention heads (each rank holds whole heads)"
        )
    return heads // tp


@dataclass(frozen=True)
class ActivationTerm:
    """One tensor a transformer layer keeps for its backward pass, in bytes on one TP rank."""

    name: str
    bytes: Fraction
    block: str = "attention"  # "attention" or "mlp": which half of the layer the tensor belongs to


def activation_bytes_per_layer_gpt(
    *,
    seq_len: int,
    batch: int,
    hidden: int,
    heads: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> int:
    """Activation bytes of one GPT layer, one micro-batch, one TP rank: Korthikanti Table 2 exactly.

    arXiv 2205.05198 Table 2 (16-bit activations, 1-byte dropout masks, 4h GeLU MLP):
    none:      sbh(34 + 5as/h) at t = 1; sbh(10 + 24/t + 5as/(ht)) with TP; sbh(34/t + 5as/(ht)) with SP;
    selective: sbh(10 + 24/t), or sbh·34/t with SP (the attention core is recomputed);
    full:      2sbh, only the layer input; with SP that input is itself split, so 2sbh/t.
    """
    s = positive_int(seq_len, "seq_len")
    b = positive_int(batch, "batch")
    h = positive_int(hidden, "hidden")
    a = positive_int(heads, "heads")
    t = positive_int(tp, "tensor-parallel size (tp)")
    _heads_per_rank(a, t)
    _choice(recompute, "recompute mode", RECOMPUTE_MODES)
    sbh = Fraction(s * b * h)
    if recompute == "full":
        total = 2 * sbh / (t if sequence_parallel else 1)
    else:
        total = sbh * (Fraction(34, t) if sequence_parallel else 10 + Fraction(24, t))
        if recompute == "none":
            total += sbh * Fraction(5 * a * s, h * t)
    return math.ceil(total)


def layer_activation_terms(
    *,
    seq_len: int,
    batch: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    ffn: int,
    gated_mlp: bool,
    dropout: bool,
    attention: str = "eager",
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    bytes_per_value: int = 2,
) -> tuple[ActivationTerm, ...]:
    """The tensors one pre-norm transformer layer stores for backward, named, on one TP rank.

    Korthikanti §4.1 lists them for a GPT block; this generalises each to a modern layer:
    - no dropout (Llama, Qwen, Mistral): the 1-byte masks and the attention-dropout output vanish;
    - flash attention (FlashAttention / SDPA flash kernel): no s² tensors; it keeps its output (the
      output-projection input, counted anyway) and an fp32 log-sum-exp, 4·a·s·b bytes; dropout, if
      any, is regenerated from the RNG seed, so no mask is stored;
    - GQA: K and V hold kv_heads·head_dim values per token, Q holds heads·head_dim;
    - gated MLP (SwiGLU) with intermediate f: gate output, up output and their product (the
      down-projection input), 3 tensors of s·b·f, as a fused SwiGLU kernel keeps them (Megatron);
      unfused PyTorch also keeps silu(gate), one more s·b·f tensor, which is not counted here.
    Tensors split by tensor parallelism are divided by t; LayerNorm inputs, the MLP input and the
    dropout masks are replicated on every rank unless sequence parallelism splits them too.
    With tp > kv_heads each rank keeps one KV head (a replica), see `kv_heads_per_rank`.

    recompute: "selective" drops the attention core (softmax output, its dropout mask and output;
    flash attention already stores none of these, so nothing more is dropped); "full" keeps only
    the layer input (its checkpoint), divided by t under sequence parallelism.
    """
    s = positive_int(seq_len, "seq_len")
    b = positive_int(batch, "batch")
    h = positive_int(hidden, "hidden")
    a = positive_int(heads, "heads")
    kv = positive_int(kv_heads, "kv_heads")
    d = positive_int(head_dim, "head_dim")
    f = positive_int(ffn, "ffn")
    t = positive_int(tp, "tensor-parallel size (tp)")
    value = positive_int(bytes_per_value, "bytes_per_value")
    _choice(attention, "attention implementation", ATTENTION_KINDS)
    _choice(recompute, "recompute mode", RECOMPUTE_MODES)
    if a % kv:
        raise UserError(f"heads ({a}) must be a multiple of kv_heads ({kv}) for grouped-query attention")
    if f % t:
        raise UserError(f"tensor-parallel size {t} must divide the MLP width ffn={f}")
    a_rank = _heads_per_rank(a, t)
    kv_rank = kv_heads_per_rank(kv, t)
    tokens = s * b
    # Tensors of width h outside the TP-split matmuls: replicated on each rank, split only by SP.
    replicated = Fraction(1, t) if sequence_parallel else Fraction(1)

    if recompute == "full":
        return (ActivationTerm("layer input (checkpoint)", value * tokens * h * replicated),)

    terms: list[ActivationTerm] = []

    block = "attention"

    def keep(name: str, n_bytes: Fraction | int) -> None:
        terms.append(ActivationTerm(name, Fraction(n_bytes), block))

    # Attention block.
    keep("attention norm input", value * tokens * h * replicated)
    keep("QKV projection input (norm output)", value * tokens * h * replicated)
    keep("Q", value * tokens * a_rank * d)
    keep("K", value * tokens * kv_rank * d)
    keep("V", value * tokens * kv_rank * d)
    if attention == "eager":
        if recompute == "none":
            keep("softmax output", value * a_rank * s * s * b)
            if dropout:
                keep("attention dropout mask", DROPOUT_MASK_BYTES * a_rank * s * s * b)
                keep("attention dropout output", value * a_rank * s * s * b)
    else:
        keep("flash log-sum-exp (fp32)", LOGSUMEXP_BYTES * a_rank * s * b)
    keep("output projection input (attention output)", value * tokens * a_rank * d)
    if dropout:
        keep("attention residual dropout mask", DROPOUT_MASK_BYTES * tokens * h * replicated)

    # MLP block.
    block = "mlp"
    keep("MLP norm input", value * tokens * h * replicated)
    keep("MLP input (norm output)", value * tokens * h * replicated)
    f_rank = f // t
    if gated_mlp:
        keep("gate projection output", value * tokens * f_rank)
        keep("up projection output", value * tokens * f_rank)
        keep("down projection input (silu(gate)·up)", value * tokens * f_rank)
    else:
        keep("activation input (first linear output)", value * tokens * f_rank)
        keep("second linear input (activation output)", value * tokens * f_rank)
    if dropout:
        keep("MLP residual dropout mask", DROPOUT_MASK_BYTES * tokens * h * replicated)
    return tuple(terms)


def activation_bytes_per_layer(
    *,
    seq_len: int,
    batch: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    ffn: int,
    gated_mlp: bool,
    dropout: bool,
    attention: str = "eager",
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    bytes_per_value: int = 2,
) -> int:
    """Activation bytes of one transformer layer, one micro-batch, one TP rank (Korthikanti §4.1,
    generalised to GQA, SwiGLU, flash attention and no dropout; see `layer_activation_terms`).

    For a GPT block (kv_heads = heads, head_dim = h/a, ffn = 4h, no gate, dropout, eager, 2-byte
    values) this equals `activation_bytes_per_layer_gpt`, i.e. Table 2 of arXiv 2205.05198.
    """
    terms = layer_activation_terms(
        seq_len=seq_len, batch=batch, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, ffn=ffn, gated_mlp=gated_mlp, dropout=dropout, attention=attention,
        tp=tp, sequence_parallel=sequence_parallel, recompute=recompute,
        bytes_per_value=bytes_per_value,
    )
    return math.ceil(sum((term.bytes for term in terms), Fraction(0)))


def embedding_activation_bytes(
    *,
    seq_len: int,
    batch: int,
    hidden: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    dropout: bool = True,
) -> int:
    """Bytes the embedding layer keeps beyond the token ids: its dropout mask, s·b·h at 1 byte.

    Megatron-LM theoretical_memory_usage.py ("Dropout in embedding layer": s·b·h, split by t only
    under sequence parallelism). Without dropout the embedding output is the first layer's input,
    already counted there, so this is 0. The int64 token ids are `input_ids_bytes`.
    """
    s = positive_int(seq_len, "seq_len")
    b = positive_int(batch, "batch")
    h = positive_int(hidden, "hidden")
    t = positive_int(tp, "tensor-parallel size (tp)")
    if not dropout:
        return 0
    return math.ceil(Fraction(DROPOUT_MASK_BYTES * s * b * h, t if sequence_parallel else 1))


def input_ids_bytes(seq_len: int, batch: int) -> int:
    """Bytes of one micro-batch of token ids: 8·s·b (int64; Megatron theoretical_memory_usage.py)."""
    s = positive_int(seq_len, "seq_len")
    b = positive_int(batch, "batch")
    return TOKEN_ID_BYTES * s * b


def logits_bytes(*, seq_len: int, batch: int, vocab: int, tp: int = 1, fp32_loss: bool = True) -> int:
    """Peak bytes of the vocabulary-sized tensors around the loss, on one TP rank.

    Counted: the 16-bit logits (2·s·b·V), the fp32 copy the loss is computed from when fp32_loss
    (4·s·b·V; what Hugging Face models do before cross-entropy), and the gradient of the logits
    made at the start of backward while those are still alive (4·s·b·V in fp32, else 2·s·b·V).
    So 10·s·b·V with an fp32 loss and 4·s·b·V without; the output layer is vocabulary-parallel,
    so each rank holds V/t of it. This is the unfused, Hugging Face-style upper bound.
    Megatron's fused vocab-parallel cross-entropy keeps only the fp32 logits, 4·s·b·V/t, in its
    `4sbh(1 + V/h)` term (see `megatron_output_layer_activation_bytes`); vram-calculator counts
    4·s·b·V × 2 (fp32 logits and their gradient).
    """
    s = positive_int(seq_len, "seq_len")
    b = positive_int(batch, "batch")
    v = positive_int(vocab, "vocab")
    t = positive_int(tp, "tensor-parallel size (tp)")
    per_value = 2 + (4 + 4 if fp32_loss else 2)
    return math.ceil(Fraction(per_value * s * b * v, t))


def megatron_output_layer_activation_bytes(*, seq_len: int, batch: int, hidden: int, vocab: int, tp: int = 1) -> int:
    """Megatron's output layer + cross-entropy activations, 4sbh(1 + V/h)/t, with sequence parallelism.

    Megatron-LM theoretical_memory_usage.py (`compute_activation_memory`, pp = 1): the final
    LayerNorm and output-layer inputs (2sbh each) and the fp32 logits (4sbV), all split over t.
    """
    s = positive_int(seq_len, "seq_len")
    b = positive_int(batch, "batch")
    h = positive_int(hidden, "hidden")
    v = positive_int(vocab, "vocab")
    t = positive_int(tp, "tensor-parallel size (tp)")
    return math.ceil(Fraction(4 * s * b * h, t) * (1 + Fraction(v, h)))


def pipeline_activation_multiplier(
    *, pp: int, microbatches: int, interleave: int = 1, stage: str | int = "first"
) -> Fraction:
    """Micro-batches' worth of its own layers' activations a pipeline stage holds at its peak.

    A stage with L/p layers keeps per_layer_bytes × (L/p) × this multiplier.
    1F1B (PipeDream-Flush; Narayanan et al. arXiv 2104.04473 §2.2): stage r (0 = first) runs
    p − r − 1 warm-up forwards, then one more before its first backward, so it holds min(p − r, m)
    micro-batches; the first stage holds p, i.e. L layers' worth (Korthikanti §4.2.3).
    Interleaved with v model chunks per stage (Megatron-LM core/pipeline_parallel/schedules.py):
    rank r holds min(2(p − r − 1) + (v − 1)p + 1, m·v) chunks of L/(p·v) layers; for the first
    stage that is p·(1 + (p − 1)/(p·v)), the penalty in theoretical_memory_usage.py and arXiv
    2205.05198 §4.2.3, whenever m is large enough to fill the warm-up (m >= 2p suffices); with
    fewer micro-batches the stage simply holds all m of them.
    stage: "first", "last", or a 0-based stage index.
    """
    p = positive_int(pp, "pipeline-parallel size (pp)")
    m = positive_int(microbatches, "microbatches")
    v = positive_int(interleave, "interleave (model chunks per stage)")
    if stage == "first":
        rank = 0
    elif stage == "last":
        rank = p - 1
    elif isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage < p:
        rank = stage
    else:
        raise UserError(f"pipeline stage must be 'first', 'last' or an index 0..{p - 1}, got {stage!r}")
    if v == 1:
        return Fraction(min(p - rank, m))
    chunks = min(2 * (p - rank - 1) + (v - 1) * p + 1, m * v)
    return Fraction(chunks, v)
