"""How the benchmarks turn a time into a rate: bytes a STREAM-like kernel is credited with, decimal
rates, and the comparison with a theoretical peak. Pure Python, standard library only (FLOPs of a
matmul come from tutor.theory.flops.matmul_flops).

These are counting conventions, not physics: each function names the convention it follows.
"""

from __future__ import annotations

from dataclasses import dataclass

from tutor.formatting import efficiency_summary
from tutor.theory.peaks import explain_efficiency

DTYPE_NAMES = ("fp32", "tf32", "bf16", "fp16", "fp8")


def tflops(flops: float, seconds: float) -> float:
    """Decimal TFLOP/s (1e12 FLOP per second), as mamf-finder and every datasheet count them."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    return flops / seconds / 1e12


def gbps(n_bytes: float, seconds: float) -> float:
    """Decimal GB/s (1e9 bytes per second), as STREAM (MB/s = 1e-6 B/s) and nvbandwidth count."""
    if seconds <= 0:
        raise ValueError(f"time must be positive, got {seconds}")
    return n_bytes / seconds / 1e9


# op -> (arrays counted per element, words). STREAM v5.10 stream.c: bytes = {2,2,3,3} *
# sizeof(STREAM_TYPE) * STREAM_ARRAY_SIZE for copy, scale, add, triad; read-only and write-only
# count the one array they touch. Write-allocate is NOT counted.
STREAM_ARRAYS: dict[str, tuple[int, str]] = {
    "copy": (2, "copy c=a: 1 read + 1 write per element (STREAM); 2x nvbandwidth's device_local_copy"),
    "scale": (2, "scale b=q*c: 1 read + 1 write per element (STREAM)"),
    "add": (3, "add c=a+b: 2 reads + 1 write per element (STREAM)"),
    "triad": (3, "triad a=b+q*c: 2 reads + 1 write per element (STREAM)"),
    "read": (1, "read-only sum(a): 1 read per element"),
    "write": (1, "write-only fill(a): 1 write per element"),
    "h2d": (1, "host-to-device copy: buffer counted once (nvbandwidth, bandwidthTest)"),
    "d2h": (1, "device-to-host copy: buffer counted once (nvbandwidth, bandwidthTest)"),
}
WRITE_ALLOCATE_NOTE = "write-allocate traffic not counted (STREAM convention)"


def stream_bytes(op: str, n_elements: int, element_size: int) -> int:
    """Bytes a STREAM-like kernel is credited with per iteration: arrays touched x N x element size.

    Source: STREAM v5.10 `stream.c` (McCalpin): copy 2, scale 2, add 3, triad 3 arrays; writes are
    credited once, the read-for-ownership of write-allocate caches is not counted.
    """
    if op not in STREAM_ARRAYS:
        raise ValueError(f"unknown bandwidth op {op!r}; known: {', '.join(STREAM_ARRAYS)}")
    if n_elements < 1 or element_size < 1:
        raise ValueError("element count and element size must be positive")
    return STREAM_ARRAYS[op][0] * n_elements * element_size


def stream_bytes_counting(op: str, element_size: int) -> str:
    """The counting convention of `op`, in words, for the output."""
    arrays, words = STREAM_ARRAYS[op]
    return f"{arrays} x N x {element_size} B: {words}; {WRITE_ALLOCATE_NOTE}"


@dataclass(frozen=True)
class PeakComparison:
    """A measured rate against a theoretical peak: percent (None when unknown or above 100 %)."""

    peak: float | None
    percent: float | None
    note: str  # "" when the percent says it all


def compare_with_peak(measured: float, peak: float | None, *, assumed_clock_hz: float | None = None) -> PeakComparison:
    """Percent of peak, never above 100 %. A measurement above the assumed peak means the peak's
    assumptions are wrong; tutor.theory.peaks.explain_efficiency says how (with the clock the
    measurement implies, when the peak's clock is known)."""
    if peak is None or peak <= 0:
        return PeakComparison(peak=None, percent=None, note="peak unknown: measured only")
    percent = 100.0 * measured / peak
    if percent <= 100.0:
        return PeakComparison(peak=peak, percent=percent, note="")
    explanation = explain_efficiency(measured, peak, assumed_clock_hz=assumed_clock_hz)
    return PeakComparison(peak=peak, percent=None, note=efficiency_summary(explanation))
