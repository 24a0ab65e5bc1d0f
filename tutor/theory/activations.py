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
from functools import lru_cache
from fractions import Fraction

from tutor.errors import UserError
from tutor.theory.checks import positive_int
from tutor.theory.parallel import kv_heads_per_rank

RECOMPUTE_MODES = ("none", "selective", "full")
# "eager": attention written as matmul + softmax (s x s tensors kept); "sdpa": torch's
# scaled_dot_product_attention, whose backend depends on device, dtype, dropout and head dims
# (transformers' default attn_implementation); "flash": FlashAttention-2 kernels.
ATTENTION_KINDS = ("eager", "sdpa", "flash")
# "hf": transformers' modelling code as written (unfused norms, SwiGLU, loss upcast; the default,
# what most users train with); "fused": Megatron-style fused kernels, Korthikanti's per-tensor count.
IMPLEMENTATIONS = ("hf", "fused")
# What each implementation profile stands for, in a few words (the CLI, the calculator and the lessons say it).
IMPLEMENTATION_MEANING = {
    "hf": "transformers modules as written, the code most people train with: fp32 norm copies, unfused SwiGLU, "
          "eager's fp32 softmax, fp32 loss head",
    "fused": "Megatron-style fused kernels (Korthikanti et al. 2022)",
}

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


# ---------------------------------------------------------------------------------------------
# The "hf" profile: what Hugging Face transformers 5.x modelling code keeps, measured.
#
# Every term below was read off real transformers modules (llama, qwen2, mistral, gemma, gemma2,
# gpt2, mixtral, qwen2_moe, deepseek_v3, qwen3, olmo, olmo2, phi3 modeling_*.py,
# transformers 5.24, torch 2.13) run on a CPU
# under torch.autograd.graph.saved_tensors_hooks, counting each unique non-parameter storage once
# (tests/test_activations_hf.py pins them). Bytes are per token (T = s·b tokens) unless the term
# is an s x s one (per token x s) or a constant.

# Activation precision of a training recipe: "fp32" (everything 4 bytes), "bf16" (a 16-bit model,
# norms upcast inside), "amp" (fp32 weights under torch.autocast: matmul outputs 16-bit, the
# residual stream and norms fp32, each linear casting its own 16-bit copy of its input).
PRECISIONS = ("fp32", "bf16", "amp")
# Attention code paths: "eager" (matmul + softmax, s x s kept), "flash" (flash / memory-efficient
# kernels: output and fp32 log-sum-exp only), "math" (SDPA's reference kernel: s x s kept).
ATTENTION_BACKENDS = ("eager", "flash", "math")
# Per token kept by the cross-entropy of transformers' ForCausalLMLoss in backward, besides its
# saved fp32 log-softmax: the gradient nll_loss hands back and log_softmax's own gradient, both
# fp32 s·V (measured: the 12 s·b·V bytes at the start of backward).
LOSS_BACKWARD_FP32_COPIES = 2


@dataclass(frozen=True)
class HfLayerShape:
    """The quirks of one transformers decoder layer that change what it keeps for backward."""

    model_type: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int            # query/key head width
    v_head_dim: int          # value head width (differs from head_dim only for MLA)
    norm: str                # "rmsnorm" (Llama-style), "gemma" (fp32 (1 + w) form), "layernorm",
                             # "nonparametric" (OLMo's weightless LayerNorm) or "fp32-weight" (OLMo-2:
                             # the weight multiplies the fp32 normalized tensor)
    norms: int               # norms per layer: 2, Gemma-2 4
    ffn: int                 # dense MLP width (0 in an MoE layer without a dense part)
    mlp_act: str             # "glu" (act(gate) * up) or "gelu_new" (GPT-2, written as Python ops)
    dropout: bool
    attn_softcap: bool = False   # Gemma-2's tanh soft-capping of attention scores
    num_experts: int = 0
    experts_per_token: int = 0
    expert_ffn: int = 0
    shared_ffn: int = 0
    router: str = ""             # "softmax" (Qwen2-MoE), "softmax_norm" (Mixtral), "sigmoid" (DeepSeek-V3)
    shared_gate: bool = False    # Qwen2-MoE's sigmoid gate on the shared expert
    kv_lora_rank: int = 0        # MLA latent width (DeepSeek-V3); 0 without MLA
    q_lora_rank: int = 0
    rope_dim: int = 0            # rotary width of a Q/K head (MLA: qk_rope_head_dim); 0: learned positions
    qk_norm: str = ""            # "head" (Qwen3: an RMSNorm over each head), "projection" (OLMo-2: over
                                 # the whole q and k projections), "" (none)


def hf_layer_shape(arch, *, moe_layer: bool) -> HfLayerShape:
    """The HfLayerShape of a dense or MoE layer of `arch` (a tutor.theory.models.Architecture)."""
    t = arch.model_type
    norm = ("layernorm" if arch.norm == "layernorm" else "nonparametric" if arch.norm == "nonparametric"
            else "gemma" if t in ("gemma", "gemma2") else "fp32-weight" if t == "olmo2" else "rmsnorm")
    moe = dict(num_experts=arch.num_experts, experts_per_token=arch.experts_per_token,
               expert_ffn=arch.moe_intermediate_size, shared_ffn=arch.shared_expert_intermediate_size,
               router="sigmoid" if t == "deepseek_v3" else "softmax_norm" if t == "mixtral" else "softmax",
               shared_gate=arch.shared_expert_gate) if moe_layer else {}
    mla = arch.uses_mla
    return HfLayerShape(
        model_type=t, hidden=arch.hidden_size, heads=arch.num_heads,
        kv_heads=arch.num_heads if mla else arch.num_kv_heads, head_dim=arch.head_dim,
        v_head_dim=arch.v_head_dim if mla else arch.head_dim, norm=norm, norms=arch.norms_per_layer,
        ffn=0 if moe_layer else arch.intermediate_size, mlp_act="glu" if arch.gated_mlp else "gelu_new",
        dropout=arch.dropout, attn_softcap=t == "gemma2",
        kv_lora_rank=arch.kv_lora_rank, q_lora_rank=arch.q_lora_rank or 0,
        rope_dim=0 if arch.learned_positions else arch.qk_rope_head_dim if mla else arch.head_dim,
        qk_norm=("head" if arch.qk_norm_per_head else "projection") if arch.qk_norm and not mla else "", **moe)


def hf_attention_backend(attention: str, *, gpu: bool, dropout: bool, head_dim: int, v_head_dim: int,
                         model_type: str = "") -> str:
    """Which attention code path transformers + torch run in training: eager, flash or math.

    - "eager" as asked; and Gemma-2 under "sdpa" (transformers refuses SDPA for Gemma2ForCausalLM
      and its default attn_implementation is eager: modeling_utils `_sdpa_can_dispatch`).
    - "flash": FlashAttention-2 kernels.
    - "sdpa" on CUDA: torch picks the flash or memory-efficient kernel (both regenerate dropout
      from the RNG and accept a V head dim unlike Q/K's, the latter for MLA): no s x s tensor
      (torch/backends/cuda/__init__.py: flash_sdp_enabled / mem_efficient_sdp_enabled default on).
    - "sdpa" on a CPU: the CPU flash kernel, unless dropout is on (GPT-2 training) or the V head
      dim differs from Q/K's (DeepSeek-V3 MLA): then the math kernel, which stores s x s
      (measured: torch 2.13 CPU saves the softmax and a dropout mask there). The rule is torch's
      (aten/src/ATen/native/transformers/sdp_utils_cpp.cpp, `use_flash_attention_cpp`): the CPU flash
      kernel refuses dropout > 0 (check_for_dropout) and q, k, v of unequal last dims
      (check_head_dim_size_cpp); it takes a boolean or float mask of a broadcastable shape
      (check_attn_mask_shape), grouped KV heads and fp32, bf16 and fp16, so transformers' masks, GQA
      and dtypes keep it. `torch._fused_sdp_choice` answers the same on torch 2.13 (tested).
    """
    _choice(attention, "attention implementation", ATTENTION_KINDS)
    if attention == "eager" or (attention == "sdpa" and model_type == "gemma2"):
        return "eager"
    if attention == "flash" or gpu:
        return "flash"
    return "math" if dropout or head_dim != v_head_dim else "flash"


def _norm_terms(kind: str, width: int, label: str, *, precision: str, value: int, gpu: bool):
    """(name, bytes per token) of one norm over `width` features, as transformers writes it.

    RMSNorm (LlamaRMSNorm): hidden.to(float32) is kept by pow/mul (4·w; in fp32 it is the input
    itself), rsqrt(variance) 4 B, and the normalized tensor cast back before `weight *` (the model
    dtype; fp32 under autocast, where the residual stream is fp32). Gemma's RMSNorm multiplies in
    fp32 by (1 + weight): the normalized tensor stays fp32 (4·w). LayerNorm (GPT-2) keeps its input
    and mean and rstd, one value each per token (fp32 on CUDA, the input dtype on a CPU).
    """
    resid = 4 if precision in ("fp32", "amp") else value
    if kind == "layernorm":
        stat = 4 if gpu else resid
        return ((f"{label} input", resid * width), (f"{label} mean and rstd", 2 * stat))
    if kind == "nonparametric":
        # OLMo's LayerNorm without weight or bias: F.layer_norm(x.to(float32)) keeps its fp32 input and
        # fp32 mean and rstd; nothing is kept for a weight multiply (there is none).
        return ((f"{label} fp32 input copy", 4 * width), (f"{label} mean and rstd (fp32)", 8))
    normalized = 4 if kind in ("gemma", "fp32-weight") or precision == "amp" else value
    return ((f"{label} fp32 input copy", 4 * width), (f"{label} 1/rms (fp32)", 4),
            (f"{label} normalized, kept for the weight multiply", normalized * width))


def _per_token(terms: list[tuple[str, Fraction | int, str]], tokens: int) -> tuple[ActivationTerm, ...]:
    return tuple(ActivationTerm(name, Fraction(n) * tokens, block) for name, n, block in terms)


@lru_cache(maxsize=512)
def hf_layer_activation_terms(
    shape: HfLayerShape,
    *,
    seq_len: int,
    batch: int,
    precision: str = "bf16",
    backend: str = "flash",
    gpu: bool = True,
    tp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> tuple[ActivationTerm, ...]:
    """The tensors one transformers decoder layer keeps for backward, named, on one TP rank.

    Measured on transformers 5.24 modules (see the section comment); each term says which tensor
    it is. Tensor parallelism splits the head- and ffn-wide tensors by t and leaves h-wide ones
    replicated unless sequence parallelism splits them too (as the fused profile).
    recompute "full": `gradient_checkpointing_enable()` (non-reentrant torch.utils.checkpoint,
    transformers modeling_utils) keeps only the layer input; "selective" drops the s x s tensors.
    """
    s = positive_int(seq_len, "seq_len")
    b = positive_int(batch, "batch")
    t = positive_int(tp, "tensor-parallel size (tp)")
    _choice(precision, "activation precision", PRECISIONS)
    _choice(backend, "attention backend", ATTENTION_BACKENDS)
    _choice(recompute, "recompute mode", RECOMPUTE_MODES)
    tokens = s * b
    h = shape.hidden
    v = 4 if precision == "fp32" else 2
    resid = 4 if precision in ("fp32", "amp") else 2
    rep = Fraction(1, t) if sequence_parallel else Fraction(1)
    if recompute == "full":
        return (ActivationTerm("layer input (checkpoint)", Fraction(resid * h * tokens) * rep),)
    a = _heads_per_rank(shape.heads, t)
    g = kv_heads_per_rank(shape.kv_heads, t)
    d, dv = shape.head_dim, shape.v_head_dim
    amp = precision == "amp"
    # Dropout masks: a bool tensor from CUDA's native_dropout; on a CPU torch's dropout keeps a
    # mask of the input's dtype (measured).
    terms: list[tuple[str, Fraction | int, str]] = []

    def keep(name: str, n, block: str) -> None:
        terms.append((name, Fraction(n), block))

    def norm(label: str, width: int, block: str, factor=rep) -> None:
        for name, n in _norm_terms(shape.norm, width, label, precision=precision, value=v, gpu=gpu):
            keep(name, n * factor, block)

    def linear_inputs(label: str, width: int, linears: int, block: str, factor=rep) -> None:
        # Under autocast each linear casts (and keeps) its own 16-bit copy of its input.
        if amp:
            keep(f"{label} (a 16-bit copy per linear, x{linears})", linears * 2 * width * factor, block)
        else:
            keep(label, v * width * factor, block)

    # Attention block.
    blk = "attention"
    norm("attention norm", h, blk)
    if shape.kv_lora_rank:
        linear_inputs("q and kv_a projection input (norm output)", h, 2 if shape.q_lora_rank == 0 else 2, blk)
        if shape.q_lora_rank:
            norm("q latent norm", shape.q_lora_rank, blk, 1)
            linear_inputs("q_b projection input", shape.q_lora_rank, 1, blk, 1)
        norm("kv latent norm", shape.kv_lora_rank, blk, 1)
        linear_inputs("kv_b projection input (latent)", shape.kv_lora_rank, 1, blk, 1)
    else:
        linear_inputs("QKV projection input (norm output)", h, 1 if shape.model_type == "gpt2" else 3, blk)
    if shape.qk_norm:
        # Qwen3 normalizes each head (1/rms per head), OLMo-2 the whole projection (one 1/rms per token);
        # each keeps what its norm kind keeps, over the q (a·d) and the k (g·d) widths.
        kind = "fp32-weight" if shape.norm == "fp32-weight" else "rmsnorm"
        for label, heads in (("q norm", a), ("k norm", g)):
            for name, n in _norm_terms(kind, heads * d, label, precision=precision, value=v, gpu=gpu):
                keep(name, n * heads if shape.qk_norm == "head" and "1/rms" in name else n, blk)
    if backend == "flash":
        keep("Q (after RoPE)", v * a * d, blk)
        keep("K (after RoPE)", v * g * d, blk)
        keep("V", v * g * dv, blk)
        keep("flash log-sum-exp (fp32)", 4 * a, blk)
        keep("attention output (the output-projection input)", v * a * dv, blk)
    else:
        # Eager: repeat_kv materialises K and V at every query head; math SDPA expands them too.
        # SDPA's math kernel on a CPU computes 16-bit inputs in fp32 (measured).
        c = 4 if backend == "math" and not gpu else v
        keep("Q", c * a * d, blk)
        if backend == "eager" and g == 1 and a > 1:
            # MQA: repeat_kv's expand + reshape of one KV head is a view (stride 0): K and V stay one head.
            keep("K (one head, expanded as a view)", c * d, blk)
            keep("V (one head, expanded as a view)", c * dv, blk)
        else:
            keep("K (expanded to every query head)", c * a * d, blk)
            keep("V (expanded to every query head)", c * a * dv, blk)
        if recompute == "none":
            probs = 4 if backend == "eager" else c
            keep("softmax output (fp32)" if probs == 4 else "softmax output", probs * a * s, blk)
            if backend == "eager" and v < 4:
                keep("softmax output cast back to 16-bit", v * a * s, blk)
            if shape.attn_softcap:
                keep("soft-capped scores tanh(x/cap)", v * a * s, blk)
            if shape.dropout:
                keep("attention dropout mask", (1 if gpu else c) * a * s, blk)
                keep("attention dropout output", c * a * s, blk)
        keep("attention output (the output-projection input)", v * a * dv, blk)
    if shape.dropout:
        keep("attention residual dropout mask", (1 if gpu else v) * h * rep, blk)
    if shape.norms == 4:
        norm("post-attention norm", h, blk)

    # MLP block.
    blk = "mlp"
    norm("MLP norm", h, blk)
    if shape.num_experts:
        _moe_terms(shape, keep, linear_inputs, a=a, v=v, amp=amp, rep=rep, t=t)
    else:
        linear_inputs("MLP input (norm output)", h, 2 if shape.mlp_act == "glu" else 1, blk)
        f = shape.ffn // t
        if shape.mlp_act == "glu":
            keep("gate projection output (act input)", v * f, blk)
            keep("act(gate)", v * f, blk)
            keep("up projection output", v * f, blk)
            keep("down projection input act(gate)·up", v * f, blk)
        else:
            keep("gelu_new temporaries (x, x³, tanh, ... as Python ops: 4 tensors)", 4 * v * f, blk)
            keep("second linear input (gelu output)", v * f, blk)
    if shape.dropout:
        keep("MLP residual dropout mask", (1 if gpu else v) * h * rep, blk)
    if shape.norms == 4:
        norm("post-MLP norm", h, blk)
    kept = _per_token(terms, tokens)
    if shape.norm == "gemma":
        # Gemma's norms multiply by (1 + weight.float()): one fp32 h-vector per norm, not per token.
        kept += (ActivationTerm("fp32 (1 + weight) of each norm", Fraction(4 * h * shape.norms), "mlp"),)
    return kept


def _moe_terms(shape: HfLayerShape, keep, linear_inputs, *, a: int, v: int, amp: bool, rep, t: int) -> None:
    """Grouped experts as transformers 5 runs them (`use_experts_implementation`): each token is
    copied once per chosen expert (k·T rows), through gate_up (2f), act, product, down (h) whose
    output is kept for the routing-weight multiply; int64 sort/gather indices; the router's fp32
    scores. DeepSeek-V3's router upcasts the hidden states to fp32 (F.linear(x.float(), w.float()))."""
    h, k, e = shape.hidden, shape.experts_per_token, shape.num_experts
    f = shape.expert_ffn // t
    blk = "mlp"
    linear_inputs("MLP input (norm output; router and shared experts read it)", h,
                  1 + (2 if shape.shared_ffn else 0), blk)
    if shape.router == "sigmoid":
        keep("router input upcast to fp32", 4 * h, blk)
        keep("router scores: sigmoid and score + correction bias (fp32)", 8 * e, blk)
        keep("router group mask (bool) and group indices", e + 24, blk)
        route_weight = 4
    else:
        keep("router softmax (fp32)", 4 * e, blk)
        route_weight = 4 if shape.router == "softmax_norm" else v
    keep("top-k expert indices (int64) and weights", 8 * k + (4 * k + 4 if shape.router != "softmax" else 0), blk)
    keep("token-to-expert sort and gather indices (int64, 3 x k)", 24 * k, blk)
    # Under autocast the grouped expert matmuls are not cast: the experts run in fp32 (measured).
    ev = 4 if amp else v
    keep("tokens gathered per chosen expert (k copies)", ev * k * h, blk)
    keep("gate_up projection output (2f per copy)", ev * k * 2 * f, blk)
    keep("act(gate) per copy", ev * k * f, blk)
    keep("down projection input per copy", ev * k * f, blk)
    keep("routing weight per copy", route_weight * k, blk)
    keep("down projection output per copy (kept for the routing-weight multiply)", ev * k * h, blk)
    if shape.shared_ffn:
        fs = shape.shared_ffn // t
        keep("shared expert gate output, act, up, product", 4 * v * fs, blk)
        if shape.shared_gate:
            keep("shared expert output and its sigmoid gate", v * (h + 1), blk)


# The s x s tensors the attention core saves that are gone by the time softmax's backward runs: the
# 16-bit cast of the probabilities (freed by the backward of their matmul with V) and dropout's mask
# and output (freed by dropout's backward, which runs first).
_FREED_BEFORE_SOFTMAX_BACKWARD = ("softmax output cast back to 16-bit", "attention dropout mask",
                                  "attention dropout output")
_DROPOUT_TERMS = ("attention dropout mask", "attention dropout output")
_AFTER_THE_CORE = ("attention output", "post-attention norm", "attention residual dropout mask")
_SQUARE_TERMS = ("softmax output", "softmax output (fp32)", "soft-capped scores tanh(x/cap)") + _FREED_BEFORE_SOFTMAX_BACKWARD


@lru_cache(maxsize=512)
def hf_attention_core_terms(
    shape: HfLayerShape,
    *,
    seq_len: int,
    batch: int,
    precision: str = "bf16",
    backend: str = "flash",
    gpu: bool = True,
    tp: int = 1,
    sequence_parallel: bool = False,
) -> tuple[ActivationTerm, ...]:
    """What one transformers decoder layer holds at the end of its attention core in forward, when
    SDPA runs torch's math kernel (backend "math", `hf_attention_backend`); () for any other backend.

    The math kernel (aten/src/ATen/native/transformers/attention.cpp,
    `_scaled_dot_product_attention_math`) is composite: its C++ locals live until it returns, so at
    its last op (`attn.to(origin_dtype)`) it holds, besides what it saves for backward (the scaled Q
    and K, the softmax, V's contiguous copy for the bmm; with dropout its mask and output):
    - 16-bit inputs on a CPU: the fp32 copies of Q, K and V (query_acc, key_acc, value_acc), the
      output cast back to 16 bits and the probabilities cast back (the second result);
    - the bmm's output, in the kernel's dtype;
    - under is_causal (transformers passes no mask when it can say is_causal), the (s, s) mask it
      builds, in the kernel's dtype, once for the batch.
    On top of that, what the layer saved before its core (its norms, the projections' inputs) and
    the tensors its Python code holds as it calls SDPA: the query, key and value it hands over (in
    the model dtype); MLA (DeepSeek-V3's DeepseekV3Attention) holds the q_b output (q_states; its
    nope and rotary parts are views), the kv_a output (compressed_kv), the rotated q and k parts,
    the concatenated query, the kv_b output (value_states is a view of it) and the key it fills.
    Measured on transformers 5.25 / torch 2.13 (CPU), each tensor by shape and dtype: DeepSeek-V3
    narrowed (8 heads, Q/K 192, V 128), 2 x 296 tokens, 52,870,336 B in its last layer, this sum.
    """
    s = positive_int(seq_len, "seq_len")
    b = positive_int(batch, "batch")
    t = positive_int(tp, "tensor-parallel size (tp)")
    _choice(precision, "activation precision", PRECISIONS)
    _choice(backend, "attention backend", ATTENTION_BACKENDS)
    if backend != "math":
        return ()
    saved = hf_layer_activation_terms(shape, seq_len=s, batch=b, precision=precision, backend=backend, gpu=gpu,
                                      tp=t, sequence_parallel=sequence_parallel, recompute="none")
    before = tuple(term for term in saved if term.block == "attention" and not term.name.startswith(_AFTER_THE_CORE))
    tokens = s * b
    v = 4 if precision == "fp32" else 2
    upcast = v < 4 and not gpu
    c = 4 if upcast else v
    a = _heads_per_rank(shape.heads, t)
    g = kv_heads_per_rank(shape.kv_heads, t)
    d, dv = shape.head_dim, shape.v_head_dim
    held: list[tuple[str, Fraction | int, str]] = []
    if shape.kv_lora_rank:
        rope = shape.rope_dim
        nope = d - rope
        held += [("q_b projection output (q_states)", v * a * d, "attention"),
                 ("kv_a projection output (compressed_kv)", v * (shape.kv_lora_rank + rope), "attention"),
                 ("rotated q and k parts", v * (a + 1) * rope, "attention"),
                 ("query handed to SDPA (q parts concatenated)", v * a * d, "attention"),
                 ("kv_b projection output (value_states is a view)", v * a * (nope + dv), "attention"),
                 ("key handed to SDPA (filled from k parts)", v * a * d, "attention")]
    else:
        held.append(("query, key and value handed to SDPA", v * (a * d + g * d + g * dv), "attention"))
    if upcast:
        held += [("math SDPA: fp32 copies of query, key and value", 4 * (a * d + g * d + g * dv), "attention"),
                 ("math SDPA: output and probabilities cast back to 16 bits", v * a * (dv + s), "attention")]
    held.append(("math SDPA: the bmm output (probabilities x V)", c * a * dv, "attention"))
    causal = ActivationTerm("math SDPA: its causal mask (s x s)", Fraction(c * s * s), "attention")
    return before + _per_token(held, tokens) + (causal,)


@lru_cache(maxsize=512)
def hf_rerun_layer_moments(
    shape: HfLayerShape,
    *,
    seq_len: int,
    batch: int,
    precision: str = "bf16",
    backend: str = "flash",
    gpu: bool = True,
    tp: int = 1,
    sequence_parallel: bool = False,
) -> dict[str, tuple[ActivationTerm, ...]]:
    """Full recompute: what one checkpointed layer holds while backward re-runs it and goes back
    through it, at the two moments that can hold its peak (the checkpoints, the parameter gradients
    and the model's other tensors are the caller's).

    Non-reentrant torch.utils.checkpoint (transformers' `gradient_checkpointing_enable`) re-runs the
    layer's forward when backward reaches it, so every tensor the layer saves exists again; then
    backward frees them block by block. Measured on transformers 5.24 / torch 2.13 (CPU;
    benchmarks/fit_vs_transformers.py --config recompute --explain, each layer's re-run apart):
    - "MLP backward": everything the layer saves (`hf_layer_activation_terms`, recompute "none"),
      the gradient of the layer output (the residual stream) and the MLP's first gradients: of the
      down-projection input, of act(gate) and of up (3 tensors of the MLP width; GPT-2's gelu_new: 2;
      MoE: k·f per token plus the shared expert, with the experts' down projection output and input
      already freed);
    - "MoE unsort backward" (MoE layers): everything the layer saves, the incoming gradient and three
      k x h gradients of the routed output's un-sorting, the first step of the experts' backward;
    - "attention backward": the attention block's saved tensors up to its core (the MLP's and those
      after the core are freed) while the attention core goes back: for eager and math-SDPA attention, softmax's backward holds the
      saved probabilities, the gradient arriving at them and its own output, three s x s tensors in
      the softmax's dtype (fp32 for eager, and for math SDPA on a CPU), besides any s x s tensor saved
      before the softmax (Gemma-2's tanh); with dropout the step before (the gradient of the dropped
      probabilities beside the probabilities, the mask and the dropped copy) can be larger. Plus the
      gradients of the residual stream, of the attention output and of V. Flash kernels keep no
      s x s tensor: the gradients of Q, K, V and of the output.
    - "attention core, re-run forward" (math SDPA): the re-run forward at the end of its attention
      core (`hf_attention_core_terms`) beside the gradient of the layer output.
    """
    saved = hf_layer_activation_terms(shape, seq_len=seq_len, batch=batch, precision=precision, backend=backend,
                                      gpu=gpu, tp=tp, sequence_parallel=sequence_parallel, recompute="none")
    s, b, t = seq_len, batch, positive_int(tp, "tensor-parallel size (tp)")
    tokens = s * b
    h = shape.hidden
    v = 4 if precision == "fp32" else 2
    resid = 4 if precision in ("fp32", "amp") else 2
    amp = precision == "amp"
    rep = Fraction(1, t) if sequence_parallel else Fraction(1)
    a = _heads_per_rank(shape.heads, t)
    g = kv_heads_per_rank(shape.kv_heads, t)
    d, dv = shape.head_dim, shape.v_head_dim
    incoming = ActivationTerm("gradient of the layer output (residual stream)", Fraction(resid * h * tokens) * rep, "mlp")

    if shape.num_experts:
        width = shape.experts_per_token * shape.expert_ffn // t + shape.shared_ffn // t
    else:
        width = shape.ffn // t
    # GLU: the gradients of the down-projection input, of act(gate) and of up; gelu_new (GPT-2): of
    # the second linear's input and of one link of its chain (measured).
    count, what = (3, "down-projection input, act(gate), up") if shape.mlp_act == "glu" else \
        (2, "second linear input, one gelu_new step")
    gradients = ActivationTerm(f"MLP gradients: {what} ({count} x MLP width)", Fraction(count * v * width * tokens),
                               "mlp")
    moments: dict[str, tuple[ActivationTerm, ...]] = {}
    if shape.num_experts:
        # Grouped experts (transformers integrations/moe.py, grouped_mm_experts_forward): the routed
        # part's backward starts at the per-token sum over the k copies, whose expanded gradient is
        # made contiguous by view's backward, then index's backward (weighted_out[inv_perm]) makes a
        # zeroed k·T x h tensor and its scatter: three k x h gradients per token, in the dtype of the
        # routing-weight product (fp32 where the routing weights are fp32: Mixtral, DeepSeek-V3).
        # Every tensor is k·T rows whatever the routing, so no expert's load enters (measured, random
        # routing, fit_unseen_set qwen3_moe and mixtral). By the time the expert MLP's gradients
        # exist, the backward of the routing-weight multiply and of the down projection have freed
        # what they saved: the down projection's output and input.
        k = shape.experts_per_token
        product = 4 if amp or precision == "fp32" or shape.router in ("sigmoid", "softmax_norm") else v
        moments["MoE unsort backward"] = saved + (incoming, ActivationTerm(
            "routed gradients at the unsort: the k copies' sum made contiguous, index's zeros and scatter "
            "(3 x k x hidden)", Fraction(3 * product * k * h * tokens) * rep, "mlp"))
        freed = ("down projection output per copy", "down projection input per copy")
        moments["MLP backward"] = tuple(term for term in saved if not term.name.startswith(freed)) + (
            incoming, gradients)
    else:
        moments["MLP backward"] = saved + (incoming, gradients)

    # What the attention block saves after its core (the output projection's input, Gemma-2's
    # post-attention norm, the residual dropout mask) is freed before the core's backward runs.
    attention_saved = tuple(term for term in saved if term.block == "attention" and term.name not in _SQUARE_TERMS
                            and not term.name.startswith(_AFTER_THE_CORE))
    square = {term.name: term.bytes for term in saved if term.name in _SQUARE_TERMS}
    extra: list[ActivationTerm] = [ActivationTerm(incoming.name, incoming.bytes, "attention")]
    if backend == "flash":
        extra.append(ActivationTerm("gradients of Q, K, V and the attention output",
                                    Fraction(v * (2 * a * d + 2 * g * d) * tokens), "attention"))
    else:
        c = 4 if backend == "math" and not gpu else v
        probs = Fraction((4 if backend == "eager" else c) * a * s * tokens)
        extra.append(ActivationTerm("gradients of the attention output and of V (every head)",
                                    Fraction(2 * c * a * dv * tokens), "attention"))
        kept = sum((n for name, n in square.items() if name not in _FREED_BEFORE_SOFTMAX_BACKWARD), Fraction(0))
        dropped = sum((n for name, n in square.items() if name in _DROPOUT_TERMS), Fraction(0))
        at_softmax = kept + 2 * probs
        before = kept + dropped + probs
        if before > at_softmax:
            extra.append(ActivationTerm("s x s: probabilities, dropout mask and dropped copy (saved) + the "
                                        "gradient arriving at them", before, "attention"))
        else:
            extra.append(ActivationTerm("s x s: saved probabilities" + (" and tanh" if shape.attn_softcap else "")
                                        + " + the gradient arriving at softmax and softmax's own gradient",
                                        at_softmax, "attention"))
    moments["attention backward"] = attention_saved + tuple(extra)
    if backend == "math":
        # The re-run forward reaches the attention core with the gradient of the layer output waiting.
        moments["attention core, re-run forward"] = hf_attention_core_terms(
            shape, seq_len=s, batch=b, precision=precision, backend=backend, gpu=gpu, tp=t,
            sequence_parallel=sequence_parallel) + (incoming,)
    return moments


@lru_cache(maxsize=512)
def hf_model_activation_terms(
    shape: HfLayerShape,
    *,
    seq_len: int,
    batch: int,
    vocab: int,
    precision: str = "bf16",
    gpu: bool = True,
    tp: int = 1,
    learned_positions: bool = False,
    final_softcap: bool = False,
) -> tuple[ActivationTerm, ...]:
    """What a transformers causal LM keeps outside its layers: token ids, embedding dropout mask,
    the final norm, the lm_head input, the shifted labels and cross-entropy's fp32 log-softmax
    (ForCausalLMLoss upcasts the logits with .float()); Gemma-2's final soft-cap keeps tanh(x/30)."""
    s = positive_int(seq_len, "seq_len")
    b = positive_int(batch, "batch")
    V = positive_int(vocab, "vocab")
    t = positive_int(tp, "tensor-parallel size (tp)")
    tokens = s * b
    h = shape.hidden
    v = 4 if precision == "fp32" else 2
    terms: list[tuple[str, Fraction | int, str]] = [("token ids (int64)", TOKEN_ID_BYTES, "embedding")]
    if shape.dropout:
        terms.append(("embedding dropout mask", (1 if gpu else (4 if precision != "bf16" else v)) * h, "embedding"))
    for name, n in _norm_terms(shape.norm, h, "final norm", precision=precision, value=v, gpu=gpu):
        terms.append((name, n, "head"))
    terms.append(("lm_head input (final norm output)", v * h, "head"))
    terms.append(("shifted labels (int64)", TOKEN_ID_BYTES, "head"))
    terms.append(("log-softmax of the fp32 logits", Fraction(4 * V, t), "head"))
    if final_softcap:
        terms.append(("final logit soft-cap tanh(x/cap)", Fraction(v * V, t), "head"))
    return _per_token(terms, tokens)


def hf_loss_backward_extra_bytes(*, seq_len: int, batch: int, vocab: int, tp: int = 1) -> int:
    """Bytes alive at the start of backward beyond the saved log-softmax: nll_loss's gradient and
    log_softmax's gradient, both fp32 s·b·V (measured; with the saved log-softmax, 12 s·b·V)."""
    tokens = positive_int(seq_len, "seq_len") * positive_int(batch, "batch")
    return math.ceil(Fraction(LOSS_BACKWARD_FP32_COPIES * 4 * tokens * positive_int(vocab, "vocab"),
                              positive_int(tp, "tensor-parallel size (tp)")))


def hf_loss_forward_extra_bytes(*, seq_len: int, batch: int, vocab: int, precision: str, tp: int = 1) -> int:
    """Bytes alive while cross-entropy runs forward beyond the saved log-softmax: the logits in
    the model dtype and, unless they are fp32 already, their .float() copy."""
    tokens = positive_int(seq_len, "seq_len") * positive_int(batch, "batch")
    v = 4 if precision == "fp32" else 2
    per_value = v + (0 if v == 4 else 4)
    return math.ceil(Fraction(per_value * tokens * positive_int(vocab, "vocab"), positive_int(tp, "tp")))


def hf_attention_mask_bytes(*, seq_len: int, batch: int, backend: str, precision: str = "bf16",
                            mask_kinds: int = 1, model_type: str = "") -> int:
    """Bytes of the attention masks transformers 5 materialises for one forward (measured, 5.24).

    masking_utils builds one mask per kind of layer (full, sliding) and the model's forward keeps
    them all: under eager attention a (b, 1, s, s) additive mask in the model dtype per kind; under
    SDPA none when it can say is_causal instead (no padding, window longer than the prompt).
    Qwen2-MoE always builds a sliding-window mask, with window 0 when use_sliding_window is false
    (configuration_qwen2_moe.py), which cannot be skipped: a (1, 1, s, s) bool mask under SDPA.
    """
    s = positive_int(seq_len, "seq_len")
    b = positive_int(batch, "batch")
    _choice(backend, "attention backend", ATTENTION_BACKENDS)
    _choice(precision, "activation precision", PRECISIONS)
    if backend == "eager":
        kinds = max(mask_kinds, 2 if model_type == "qwen2_moe" else 1)
        return kinds * (4 if precision == "fp32" else 2) * b * s * s
    return s * s if model_type == "qwen2_moe" else 0


def hf_prefill_held_bytes(shape: HfLayerShape, *, seq_len: int, batch: int, precision: str = "bf16",
                          mask_bytes: int = 0) -> int:
    """Activation bytes a transformers prefill holds between two decoder layers (and under every
    moment of `hf_prefill_moments`): the token ids (int64, b x s) and position ids (int64, s); RoPE's
    cos and sin (1 x s x rope dim, model dtype; fp32 for OLMo; GPT-2: its learned position embeddings,
    1 x s x h); the embedding output the model's forward keeps and the input of the layer being run
    (b x s x h each: at the first layer most models hand it the embedding output itself, one tensor);
    the attention masks. Measured on transformers 5.24 / torch 2.13 (CPU), see `hf_prefill_moments`."""
    s = positive_int(seq_len, "seq_len")
    b = positive_int(batch, "batch")
    _choice(precision, "activation precision", PRECISIONS)
    v = 4 if precision == "fp32" else 2
    # OLMo's apply_rotary_pos_emb keeps cos and sin in fp32 (not cast to the model dtype): RoPE's
    # products on Q and K are fp32, cast back at the end (measured, transformers 5.24).
    rope = 4 if shape.model_type == "olmo" else v
    positions = 2 * rope * s * shape.rope_dim if shape.rope_dim else v * s * shape.hidden
    return TOKEN_ID_BYTES * (s * b + s) + positions + 2 * v * s * b * shape.hidden + mask_bytes


def hf_prefill_moments(shape: HfLayerShape, *, seq_len: int, batch: int, vocab: int, precision: str = "bf16",
                       backend: str = "flash", tp: int = 1, gpu: bool = True, mask_bytes: int = 0) -> dict[str, int]:
    """Activation bytes alive at each moment of a transformers prefill that can hold its peak.

    The call is generate()'s: model(input_ids, use_cache=True, logits_to_keep=1) under no_grad,
    then the last position's logits copied to fp32. No grad: each op's inputs are freed as soon
    as no Python name holds them, so the live set is what the modelling code's variables hold.
    Measured on transformers 5.24 / torch 2.13 (CPU) with a dispatch mode that records every
    storage from creation to free (benchmarks/fit_vs_transformers.py --config inference --explain).

    Held through the whole forward: the token ids (int64) and position ids (int64, s); RoPE's cos
    and sin (1 x s x rope dim, model dtype; GPT-2: its learned position embeddings, 1 x s x h);
    the embedding output (inputs_embeds, kept by the model's forward); the input of the layer being
    run (kept by the layer loop); the attention masks (`hf_attention_mask_bytes`). On top of that:
    - attention (flash/SDPA): the norm output, the Q, K, V projections and RoPE's temporaries on Q
      (q·cos, rotate_half(q), rotate_half(q)·sin), or, when K's are larger (K with more than 2/3 of
      Q's heads), Q's rotated copy and K's temporaries;
    - attention (eager): the norm output, Q, K and V repeated to every head (repeat_kv copies when
      1 < kv heads < heads), the masked scores in the model dtype, their fp32 copy and the fp32 softmax
      (GPT-2: the softmax in the model dtype);
    - MLA (DeepSeek-V3): q_b and kv_a outputs, the rotated q, query and key states, kv_b's output;
      SDPA's math kernel (a V head dim unlike Q/K's, on a CPU) copies Q, K, V to fp32, scales Q,
      builds an fp32 s x s causal mask and holds the scores twice (matmul, + mask), or later the
      probabilities, their 16-bit cast, V's copy and the output;
    - MLP: the residual sum, the norm output and act(gate), up, their product (GPT-2: also the
      attention output its block keeps, and gelu_new's x, 0.5x, x³, 0.044715x³); under eager
      attention also the layer's attention probabilities, which the decoder layer still holds;
    - MoE (grouped experts): the residual, norm output, routing ids and weights, k gathered copies
      of each token, then either gate_up (2f) + act + product per copy, or at the combine the
      down output, its product with the routing weight (fp32 when the router's weights are fp32:
      Mixtral, DeepSeek-V3) and that product reordered; the shared expert's output (Qwen2-MoE runs
      it first) or intermediates (3 x its width);
    - head: the last layer's output, the final norm output, the last position's logits and their
      fp32 copy (4 b V: generate()'s next_token_logits).
    """
    s = positive_int(seq_len, "seq_len")
    b = positive_int(batch, "batch")
    V = positive_int(vocab, "vocab")
    t = positive_int(tp, "tensor-parallel size (tp)")
    _choice(precision, "activation precision", PRECISIONS)
    _choice(backend, "attention backend", ATTENTION_BACKENDS)
    T = s * b
    v = 4 if precision == "fp32" else 2
    h = shape.hidden
    a = _heads_per_rank(shape.heads, t)
    g = kv_heads_per_rank(shape.kv_heads, t)
    d, dv = shape.head_dim, shape.v_head_dim
    rope = 4 if shape.model_type == "olmo" else v  # OLMo's RoPE products are fp32 (hf_prefill_held_bytes)
    held = hf_prefill_held_bytes(shape, seq_len=s, batch=b, precision=precision, mask_bytes=mask_bytes)
    # fp32 copies a kernel makes of 16-bit inputs: none when the model is fp32 already.
    upcast = 4 if v < 4 and not gpu else v

    def per_token(n) -> int:
        return math.ceil(Fraction(n) * T)

    moments: dict[str, int] = {}
    norm_out = v * h
    if shape.kv_lora_rank:
        rope = shape.rope_dim
        nope = d - rope
        mla = v * (a * d + (shape.kv_lora_rank + rope) + a * rope + a * d + a * (nope + dv) + a * d)
        if backend == "math":
            copies = upcast * a * (2 * d + dv) if upcast != v else 0
            # Either the scores twice (matmul, + mask) or, after the softmax, the probabilities (and
            # their 16-bit cast), V's contiguous copy and the output: whichever is larger.
            after = upcast * a * s + (v * a * s if upcast != v else 0) + 2 * upcast * a * dv
            scores = per_token(copies + upcast * a * d + max(2 * upcast * a * s, after)) + 4 * s * s
        else:
            scores = per_token(v * a * dv + 4 * a)
        moments["attention"] = held + per_token(norm_out + mla) + scores
    elif backend == "flash":
        projections = v * (a * d + 2 * g * d)
        # RoPE on Q makes three temporaries; on K, with Q's rotated copy still held, three of K's size:
        # the larger once K has more than 2/3 of Q's heads (multi-head attention: OLMo, Llama-2).
        temporaries = max(3 * rope * a * d, rope * a * d + 3 * rope * g * d) if shape.rope_dim else v * a * dv
        moments["attention"] = held + per_token(norm_out + projections + temporaries)
    else:
        # repeat_kv's expand + reshape is a view for one KV head (MQA), a copy for 1 < kv heads < heads.
        expanded = 2 * v * a * d if 1 < g < a else 0
        if shape.model_type == "gpt2":  # GPT-2's eager softmax runs in the model dtype
            scores = 2 * v * a * s
        else:
            scores = v * a * s + (4 * a * s if v < 4 else 0) + 4 * a * s
        moments["attention"] = held + per_token(norm_out + v * a * d + expanded + scores)
    # The residual sum after attention (the MLP's skip input); under eager attention the decoder
    # layer also keeps the attention probabilities it was handed back (`hidden_states, _ = ...`).
    residual = v * h + (v * a * s if backend == "eager" else 0)
    if shape.num_experts:
        k, e = shape.experts_per_token, shape.num_experts
        f = shape.expert_ffn // t
        fs = shape.shared_ffn // t
        weight = 4 if shape.router in ("softmax_norm", "sigmoid") else v
        routing = v * e + k * (3 * TOKEN_ID_BYTES + 2 * 4 + weight)
        base = residual + norm_out + routing + (v * h if shape.shared_gate else 0) + v * k * h
        moments["MoE experts"] = held + per_token(base + 4 * v * k * f)
        moments["MoE combine"] = held + per_token(base + v * k * h + 2 * weight * k * h + TOKEN_ID_BYTES * k)
        if fs:
            moments["shared expert"] = held + per_token(residual + norm_out + v * h + 3 * v * fs)
    elif shape.mlp_act == "glu":
        # Phi-3's fused gate_up: its chunks are views, so the whole 2f output lives until the product.
        glu = 4 if shape.model_type == "phi3" else 3
        moments["MLP"] = held + per_token(residual + norm_out + glu * v * (shape.ffn // t))
    else:
        moments["MLP"] = held + per_token(v * h + residual + norm_out + 4 * v * (shape.ffn // t))
    moments["head"] = held + per_token(norm_out) + math.ceil(Fraction((v + 4) * b * V, t))
    return moments


def hf_prefill_activation_bytes(shape: HfLayerShape, *, seq_len: int, batch: int, vocab: int,
                                precision: str = "bf16", backend: str = "flash", tp: int = 1, gpu: bool = True,
                                mask_bytes: int = 0) -> int:
    """Peak activation bytes of a transformers prefill (generate()'s call, no grad): the largest
    of `hf_prefill_moments` (measured on transformers 5.24; see there)."""
    return max(hf_prefill_moments(shape, seq_len=seq_len, batch=batch, vocab=vocab, precision=precision,
                                  backend=backend, tp=tp, gpu=gpu, mask_bytes=mask_bytes).values())
