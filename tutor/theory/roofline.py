"""The roofline model: when a kernel is limited by arithmetic and when by memory traffic.

Source: Williams, Waterman, Patterson, "Roofline: An Insightful Visual Performance Model for
Multicore Architectures", CACM 52(4), 2009: attainable FLOP/s = min(peak, intensity × bandwidth),
with intensity in FLOPs per byte of DRAM traffic. NVIDIA "Matrix Multiplication Background User's
Guide" applies it to GEMMs. The decode bound (every generated token reads all weights and the KV
cache once) is the same model with a fixed byte count per step.
"""

from __future__ import annotations

import math
from fractions import Fraction
from numbers import Rational

from tutor.errors import UserError


def _positive(value: float, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, Rational)) or not value > 0:
        raise UserError(f"{name} must be a positive number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise UserError(f"{name} must be a finite number, got {value!r}")
    return value


def _dimension(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"matrix dimension {name} must be a whole number of at least 1, got {value!r}")
    return value


def matmul_arithmetic_intensity(m: int, n: int, k: int, bytes_per_element: float) -> Fraction:
    """FLOPs per byte of C[m,n] = A[m,k]·B[k,n]: 2mnk / (b·(mk + kn + mn)).

    Counts reading A and B and writing C once each (no re-reads: the best a kernel can do);
    add another mn if C is also read (β ≠ 0). Square n×n×n: 2n/(3b); GEMV (m = 1): about 2/b.
    Williams, Waterman, Patterson, "Roofline" (CACM 2009); NVIDIA, "Matrix Multiplication Background
    User's Guide" (Deep Learning Performance docs), "Math and Memory Bounds".
    """
    m, n, k = _dimension(m, "m"), _dimension(n, "n"), _dimension(k, "k")
    b = _positive(bytes_per_element, "bytes per element")
    b_exact = Fraction(repr(b)) if isinstance(b, float) else Fraction(b)
    return Fraction(2 * m * n * k) / (b_exact * (m * k + k * n + m * n))


def ridge_point(peak_flops: float, bandwidth_bytes_per_s: float) -> float:
    """Intensity (FLOP/byte) where the memory slope meets the compute roof: peak / bandwidth.

    Below it a kernel is memory-bound, above it compute-bound (Williams et al. 2009).
    H100 SXM dense BF16: 989e12 / 3.35e12 ≈ 295 FLOP/B.
    """
    return float(_positive(peak_flops, "peak FLOP/s")) / float(_positive(bandwidth_bytes_per_s, "memory bandwidth"))


def attainable_flops(intensity: float, peak_flops: float, bandwidth_bytes_per_s: float) -> float:
    """Roofline bound on FLOP/s: min(peak, intensity × bandwidth) (Williams et al. 2009)."""
    intensity = float(_positive(intensity, "arithmetic intensity"))
    peak = float(_positive(peak_flops, "peak FLOP/s"))
    return min(peak, intensity * float(_positive(bandwidth_bytes_per_s, "memory bandwidth")))


def is_compute_bound(intensity: float, peak_flops: float, bandwidth_bytes_per_s: float) -> bool:
    """True when the intensity is at or above the ridge point, i.e. the compute roof is the limit."""
    return float(_positive(intensity, "arithmetic intensity")) >= ridge_point(peak_flops, bandwidth_bytes_per_s)


def decode_time_per_token_bound(*, weight_bytes: int, kv_bytes: int = 0, bandwidth: float) -> float:
    """Lower bound in seconds on one decode step: (weight bytes + KV bytes read) / HBM bandwidth.

    Each step of autoregressive decoding reads every weight and the whole KV cache of the batch
    once, so at small batch it is memory-bound (Pope et al., "Efficiently Scaling Transformer
    Inference", arXiv 2211.05102, §2.1).
    Llama-3-8B bf16 on H100 SXM: 16.06 GB / 3.35 TB/s = 4.8 ms. kv_bytes is the KV cache of all
    sequences in the batch.
    """
    if isinstance(kv_bytes, bool) or not isinstance(kv_bytes, (int, float)) or kv_bytes < 0:
        raise UserError(f"KV-cache bytes must be a number >= 0, got {kv_bytes!r}")
    total = float(_positive(weight_bytes, "weight bytes")) + float(kv_bytes)
    return total / float(_positive(bandwidth, "memory bandwidth"))


def decode_tokens_per_second_bound(
    *, weight_bytes: int, kv_bytes: int = 0, bandwidth: float, batch: int = 1
) -> float:
    """Upper bound on generated tokens per second over a batch: batch / decode step time.

    At batch 1, bandwidth / model bytes: Llama-3-8B bf16 on H100 SXM ≤ ~208 tok/s.
    """
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise UserError(f"batch must be a whole number of at least 1, got {batch!r}")
    return batch / decode_time_per_token_bound(weight_bytes=weight_bytes, kv_bytes=kv_bytes, bandwidth=bandwidth)
