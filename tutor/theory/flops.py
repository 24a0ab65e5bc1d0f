"""Floating-point operations of transformer training and inference, and the utilisation they imply.

Sources: Kaplan et al. "Scaling Laws for Neural Language Models" arXiv 2001.08361 §2.1, Table 1
(2N forward, 6N training per token); Chowdhery et al. "PaLM" arXiv 2204.02311 Appendix B (model
FLOPs 6N + 12·L·H·Q·T per token, MFU and HFU); EleutherAI "Transformer Math 101" (C = 6·N·D);
volcengine/verl `verl/utils/flops_counter.py` (the same formula summed over variable-length sequences).

One multiply-add counts as two FLOPs everywhere, as in all of these sources.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from tutor.errors import UserError


def _count(value: int | float, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 540.35e9 typed as a float is still a whole count
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{name} must be a whole number of at least {minimum}, got {value!r}")
    return value


def _rate(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{name} must be a positive number, got {value!r}")
    return float(value)


def _nonnegative(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise UserError(f"{name} must be a number >= 0, got {value!r}")
    return float(value)


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of C[m,n] = A[m,k]·B[k,n]: 2·m·n·k (one multiply and one add per term)."""
    return 2 * _count(m, "m") * _count(n, "n") * _count(k, "k")


def training_flops_per_token(
    *, params: int, layers: int, heads: int, head_dim: int, seq_len: int, attention: bool = True
) -> int:
    """Model FLOPs per trained token: 6N + 12·L·H·Q·T (PaLM, arXiv 2204.02311, Appendix B).

    6N: forward 2N + backward 4N for the weight matmuls (Kaplan et al. arXiv 2001.08361 §2.1).
    12·L·H·Q·T: the QKᵀ and attention·V matmuls, 4·L·H·Q·T forward ×3 for forward + backward,
    counted without a causal-mask discount, as PaLM does. attention=False gives 6N alone.
    """
    params = _count(params, "params")
    base = 6 * params
    if not attention:
        return base
    return base + 12 * _count(layers, "layers") * _count(heads, "heads") * _count(head_dim, "head_dim") * _count(
        seq_len, "sequence length"
    )


def inference_flops_per_token(*, params: int, layers: int, context: int, attention_dim: int) -> int:
    """Forward FLOPs per token: 2N + 2·n_layer·n_ctx·d_attn (Kaplan et al. arXiv 2001.08361, Table 1).

    d_attn is the width of the attention output (heads × head_dim); n_ctx the tokens attended to.
    Kaplan notes the context term is small next to 2N while n_ctx < 12·d_model.
    """
    params = _count(params, "params")
    return 2 * params + 2 * _count(layers, "layers") * _count(context, "context", minimum=0) * _count(
        attention_dim, "attention_dim"
    )


def training_flops(*, params: int, tokens: int) -> int:
    """Total training compute C = 6·N·D (Kaplan et al. §2.1; EleutherAI Transformer Math 101)."""
    return 6 * _count(params, "params") * _count(tokens, "tokens")


def training_flops_for_sequences(
    *, matmul_params: int, seq_lens: Iterable[int], layers: int, attention_dim: int
) -> int:
    """FLOPs of one forward + backward pass over a batch of sequences of different lengths.

    6·N·Σs + 12·Σ(s²)·L·d_attn: PaLM's 6N + 12·L·H·Q·T per token, summed over each sequence's
    tokens (a sequence of length s costs 12·L·d_attn·s² in attention). This is the convention of
    volcengine/verl `verl/utils/flops_counter.py`, where N counts the matmul weights including
    both the input embedding and the LM head (vocab·hidden·2), and d_attn = heads × head_dim of
    the queries (for MLA, qk_nope + qk_rope head dim).
    """
    lengths = [_count(s, "sequence length") for s in seq_lens]
    if not lengths:
        raise UserError("need at least one sequence length")
    n = _count(matmul_params, "matmul_params")
    return 6 * n * sum(lengths) + 12 * sum(s * s for s in lengths) * _count(layers, "layers") * _count(
        attention_dim, "attention_dim"
    )


def model_flops_utilization(
    *, tokens_per_second: float, flops_per_token: float, devices: int, peak_flops_per_device: float
) -> float:
    """MFU: observed model FLOP/s over the peak of all devices (PaLM, arXiv 2204.02311, Appendix B).

    Counts only the FLOPs the model needs (`training_flops_per_token`), never recomputation,
    so it compares fairly across implementations.
    """
    achieved = _nonnegative(tokens_per_second, "tokens per second") * _rate(flops_per_token, "FLOPs per token")
    return achieved / (_count(devices, "devices") * _rate(peak_flops_per_device, "peak FLOP/s per device"))


def hardware_flops_utilization(
    *,
    tokens_per_second: float,
    flops_per_token: float,
    recompute_flops_per_token: float,
    devices: int,
    peak_flops_per_device: float,
) -> float:
    """HFU: like MFU but also counting FLOPs spent recomputing activations (PaLM Appendix B).

    With full activation recomputation the forward pass runs twice: recompute ≈ 2N per token
    (plus its attention share), so HFU ≈ MFU × 8/6.
    """
    recompute = _nonnegative(recompute_flops_per_token, "recompute FLOPs per token")
    total = _rate(flops_per_token, "FLOPs per token") + recompute
    return model_flops_utilization(
        tokens_per_second=tokens_per_second,
        flops_per_token=total,
        devices=devices,
        peak_flops_per_device=peak_flops_per_device,
    )
