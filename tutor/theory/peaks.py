"""Theoretical peak throughput of CPUs and GPUs, and how to read a measurement against one.

Every peak here is "units x operations per unit per clock x clock": what differs between a CPU
core, a GPU SM and a memory bus is only what a "unit" is. Detection of the inputs (which SIMD
width, how many FMA units, which clock) lives in tutor.hardware; this module is the arithmetic.

Sources: Stas Bekman, "Machine Learning Engineering" (stas00/ml-engineering,
compute/accelerator/README.md: the peak formula and its inversion); NVIDIA architecture whitepapers
(A100, H100: SMs, tensor cores, dense FLOP per clock); Intel 64 and IA-32 Architectures Optimization Reference Manual
(FMA port counts, AMX "1024 BF16 / 2048 INT8 operations per cycle per core").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tutor.errors import UserError

# One fused multiply-add is two floating-point operations (a multiply and an add).
FLOPS_PER_FMA = 2


def _require_positive(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise UserError(f"{name} must be a positive finite number, got {value!r}")


def simd_lanes(*, simd_bits: int, element_bits: int) -> int:
    """Elements of `element_bits` that fit in one SIMD register of `simd_bits`.

    AVX-512: 512/32 = 16 FP32 lanes; 512/16 = 32 BF16 lanes (Intel optimization manual, ch. 2).
    """
    _require_positive("simd_bits", simd_bits)
    _require_positive("element_bits", element_bits)
    if simd_bits % element_bits:
        raise UserError(f"simd_bits ({simd_bits}) must be a multiple of element_bits ({element_bits})")
    return simd_bits // element_bits


def cpu_flops_per_cycle(*, simd_bits: int, element_bits: int, fma_units: int) -> int:
    """FLOP per cycle per core of a SIMD FMA pipeline: lanes x FMA units x 2.

    Intel Optimization Reference Manual: AVX2 + 2 FMA ports -> 32 FP32 FLOP/cycle; AVX-512 with 2 FMA
    units -> 64; Zen 1 (2 x 128-bit) -> 16. A dot-product instruction that packs 2 (BF16,
    VDPBF16PS) or 4 (INT8, VPDPBUSD) products into each 32-bit lane is counted by passing the
    narrow element width, which gives the 2x/4x the manuals state.
    """
    _require_positive("fma_units", fma_units)
    return simd_lanes(simd_bits=simd_bits, element_bits=element_bits) * fma_units * FLOPS_PER_FMA


def peak_flops(*, units: int, flops_per_cycle_per_unit: float, clock_hz: float) -> float:
    """Peak operations per second = units x operations per cycle per unit x clock.

    The one formula behind every peak (ml-engineering, compute/accelerator: "clock x FMAs per
    clock per unit x 2 x units"); a unit is a CPU core, a GPU SM or a tensor core.
    """
    _require_positive("units", units)
    _require_positive("flops_per_cycle_per_unit", flops_per_cycle_per_unit)
    _require_positive("clock_hz", clock_hz)
    return units * flops_per_cycle_per_unit * clock_hz


def cpu_peak_flops(*, cores: int, simd_bits: int, element_bits: int, fma_units: int, clock_hz: float) -> float:
    """CPU peak FLOP/s = physical cores x SIMD lanes x FMA units x 2 x clock.

    Worked example: a 56-core Sapphire Rapids with AVX-512
    (2 FMA units) at 2.0 GHz -> 56 x 64 x 2.0e9 = 7.2 TFLOP/s FP32. Physical cores, because
    hyperthreads share a core's FMA units.
    """
    per_cycle = cpu_flops_per_cycle(simd_bits=simd_bits, element_bits=element_bits, fma_units=fma_units)
    return peak_flops(units=cores, flops_per_cycle_per_unit=per_cycle, clock_hz=clock_hz)


def gpu_peak_flops(*, sm_count: int, flops_per_clock_per_sm: float, clock_hz: float) -> float:
    """GPU dense peak = SMs x FLOP per clock per SM x boost clock.

    NVIDIA H100 and A100 whitepapers: H100 SXM 132 x 4096 x 1.83 GHz = 989.4 TFLOP/s BF16;
    A100 108 x 2048 x 1.41 GHz = 311.9.
    """
    return peak_flops(units=sm_count, flops_per_cycle_per_unit=flops_per_clock_per_sm, clock_hz=clock_hz)


def clock_implied_by_peak(*, peak: float, units: int, flops_per_cycle_per_unit: float) -> float:
    """The clock (Hz) a published peak assumes: peak / (units x FLOP per cycle per unit).

    ml-engineering, compute/accelerator: H100 SXM's 989.4 TFLOP/s over 528 tensor cores x 1024 FLOP
    gives 1830 MHz, not the 1980 MHz boost clock often quoted.
    """
    _require_positive("peak", peak)
    _require_positive("units", units)
    _require_positive("flops_per_cycle_per_unit", flops_per_cycle_per_unit)
    return peak / (units * flops_per_cycle_per_unit)


def clock_adjusted_peak(*, peak: float, spec_clock_hz: float, actual_clock_hz: float) -> float:
    """A datasheet peak scaled to the clock the chip really ran at: peak x actual / spec clock.

    ml-engineering, compute/accelerator (throttling): a GPU that sustains a lower clock under power or
    thermal limits cannot reach the datasheet figure.
    """
    _require_positive("peak", peak)
    _require_positive("spec_clock_hz", spec_clock_hz)
    _require_positive("actual_clock_hz", actual_clock_hz)
    return peak * actual_clock_hz / spec_clock_hz


def memory_bandwidth_bytes_per_s(*, memory_clock_hz: float, bus_width_bits: int, transfers_per_clock: int = 2) -> float:
    """Peak DRAM/HBM bandwidth = memory clock x bus width in bytes x transfers per clock.

    ml-engineering, compute/accelerator (double data rate, 2 transfers per clock):
    H100 SXM 2619 MHz x 5120 bit -> 3.35 TB/s; RTX 4090 10501 MHz x 384 bit -> 1008 GB/s.
    """
    _require_positive("memory_clock_hz", memory_clock_hz)
    _require_positive("bus_width_bits", bus_width_bits)
    _require_positive("transfers_per_clock", transfers_per_clock)
    return memory_clock_hz * bus_width_bits / 8 * transfers_per_clock


def dram_bandwidth_bytes_per_s(*, channels: int, megatransfers_per_s: float, bytes_per_transfer: int = 8) -> float:
    """Host DRAM peak = channels x MT/s x 8 bytes (64-bit channel).

    JEDEC DDR4/DDR5 transfer rates: DDR4-3200 dual channel = 51.2 GB/s; DDR5-4800 with 8 channels
    = 307.2 GB/s. The channel count is not readable without root (dmidecode).
    """
    _require_positive("channels", channels)
    _require_positive("megatransfers_per_s", megatransfers_per_s)
    _require_positive("bytes_per_transfer", bytes_per_transfer)
    return channels * megatransfers_per_s * 1e6 * bytes_per_transfer


@dataclass(frozen=True)
class Efficiency:
    """A measurement read against a theoretical peak.

    fraction is measured/peak when that is at most 1, else None: a result above the peak means
    an assumption behind the peak was wrong (usually the clock), never 130 % efficiency. Its words are
    tutor.formatting.efficiency_summary's.
    """

    measured: float
    peak: float | None
    fraction: float | None
    exceeds_peak: bool
    implied_clock_hz: float | None
    assumed_clock_hz: float | None = None


def explain_efficiency(measured: float, peak: float | None, *, assumed_clock_hz: float | None = None) -> Efficiency:
    """How a measured rate compares with a theoretical peak of the same unit (FLOP/s, B/s).

    At or below the peak: fraction = measured / peak. Above it the peak's clock must be too low
    (ml-engineering, compute/accelerator: inverting the peak formula): the clock was at least
    measured / peak x assumed clock, which is reported instead of an efficiency above 100 %.
    """
    valid = isinstance(measured, (int, float)) and not isinstance(measured, bool)
    if not valid or not math.isfinite(measured) or measured < 0:
        raise UserError(f"a measured rate must be a finite number >= 0, got {measured!r}")
    if peak is None:
        return Efficiency(measured, None, None, False, None)
    _require_positive("peak", peak)
    if assumed_clock_hz is not None:
        _require_positive("assumed_clock_hz", assumed_clock_hz)
    if measured <= peak:
        return Efficiency(measured, peak, measured / peak, False, None, assumed_clock_hz)
    implied = None if assumed_clock_hz is None else measured / peak * assumed_clock_hz
    return Efficiency(measured, peak, None, True, implied, assumed_clock_hz)
