"""tutor.theory.peaks against the published figures in reference/benchmarking.md (§1.2, §1.3, §3.5, §6.3, §6.4)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tutor.errors import UserError
from tutor.formatting import efficiency_summary
from tutor.theory import peaks


def test_cpu_flops_per_cycle_matches_the_isa_table():
    # §6.4: AVX2 + 2 FMA ports -> 32 FP32 FLOP/cycle, AVX-512 x2 -> 64, Zen 1 (2 x 128-bit) -> 16,
    # AVX without FMA (one mul + one add) -> 16, FP64 on AVX-512 x2 -> 32.
    assert peaks.cpu_flops_per_cycle(simd_bits=256, element_bits=32, fma_units=2) == 32
    assert peaks.cpu_flops_per_cycle(simd_bits=512, element_bits=32, fma_units=2) == 64
    assert peaks.cpu_flops_per_cycle(simd_bits=128, element_bits=32, fma_units=2) == 16
    assert peaks.cpu_flops_per_cycle(simd_bits=256, element_bits=32, fma_units=1) == 16
    assert peaks.cpu_flops_per_cycle(simd_bits=512, element_bits=64, fma_units=2) == 32
    # AVX512-BF16 packs 2 products in each FP32 lane: twice the FP32 rate.
    assert peaks.cpu_flops_per_cycle(simd_bits=512, element_bits=16, fma_units=2) == 2 * 64


@pytest.mark.parametrize(
    ("cores", "simd_bits", "fma_units", "clock_hz", "published"),
    [
        (56, 512, 2, 2.0e9, 7.2e12),     # 56-core Sapphire Rapids, AVX-512 at 2.0 GHz: 7.2 TF
        (16, 256, 2, 5.0e9, 2.56e12),    # 16-core Zen 4 (double-pumped) at 5.0 GHz: 2.56 TF
        (2, 256, 2, 2.445e9, 156e9),     # 2-vCPU EPYC Zen 3 VM, AVX2/FMA at 2.445 GHz: 156 GF
    ],
)
def test_cpu_peak_flops_reproduces_the_worked_examples(cores, simd_bits, fma_units, clock_hz, published):
    value = peaks.cpu_peak_flops(cores=cores, simd_bits=simd_bits, element_bits=32, fma_units=fma_units,
                                 clock_hz=clock_hz)
    assert value == pytest.approx(published, rel=0.005)


def test_amx_peak_reproduces_intels_example():
    # §6.4: 56 cores x 1024 BF16 FLOP/cycle x 1.9 GHz ~ 109 TF.
    assert peaks.peak_flops(units=56, flops_per_cycle_per_unit=1024, clock_hz=1.9e9) == pytest.approx(109e12, rel=0.005)


@pytest.mark.parametrize(
    ("units", "fma_per_clock", "clock_hz", "published_tflops"),
    [
        (528, 512, 1830e6, 989.4),  # H100 SXM: 4 tensor cores x 132 SMs
        (432, 256, 1410e6, 311.9),  # A100 SXM: 4 x 108
    ],
)
def test_ml_engineering_tensor_core_formula(units, fma_per_clock, clock_hz, published_tflops):
    # §1.3: clock x FMAs per clock per unit x 2 x units.
    value = peaks.peak_flops(units=units, flops_per_cycle_per_unit=fma_per_clock * peaks.FLOPS_PER_FMA,
                             clock_hz=clock_hz)
    assert value / 1e12 == pytest.approx(published_tflops, abs=0.05)


@pytest.mark.parametrize(
    ("sm_count", "per_sm", "clock_ghz", "published"),
    [
        (80, 1024, 1.53, 125.3),    # V100
        (40, 1024, 1.59, 65.1),     # T4
        (108, 2048, 1.41, 311.9),   # A100
        (72, 1024, 1.695, 125.0),   # A10
        (82, 512, 1.695, 71.2),     # RTX 3090, FP32 accumulate
        (128, 512, 2.52, 165.2),    # RTX 4090, FP32 accumulate
        (132, 4096, 1.83, 989.4),   # H100 SXM
        (114, 4096, 1.62, 756.4),   # H100 PCIe
    ],
)
def test_gpu_peak_flops_reproduces_the_per_sm_table(sm_count, per_sm, clock_ghz, published):
    value = peaks.gpu_peak_flops(sm_count=sm_count, flops_per_clock_per_sm=per_sm, clock_hz=clock_ghz * 1e9)
    assert value / 1e12 == pytest.approx(published, abs=0.05)


def test_cuda_core_fp32_rate_of_the_4090():
    # §6.3: 16384 CUDA cores x 2 x 2.52 GHz = 82.6 TFLOP/s.
    assert peaks.peak_flops(units=16384, flops_per_cycle_per_unit=2, clock_hz=2.52e9) / 1e12 == pytest.approx(82.6, abs=0.05)


def test_inverting_the_h100_peak_gives_the_clock_the_spec_used():
    # §1.3: the spec's 989.4 TF implies 1830 MHz, not the 1980 MHz boost clock.
    clock = peaks.clock_implied_by_peak(peak=989.4e12, units=528, flops_per_cycle_per_unit=1024)
    assert clock == pytest.approx(1830e6, rel=1e-3)
    at_1980 = peaks.peak_flops(units=528, flops_per_cycle_per_unit=1024, clock_hz=1980e6)
    assert at_1980 / 1e12 == pytest.approx(1070, abs=1)


@pytest.mark.parametrize(
    ("clock_mhz", "bus_bits", "published_gbps", "rel"),
    [
        (2619, 5120, 3350, 0.002),    # H100 SXM HBM3
        (10501, 384, 1008, 0.001),    # RTX 4090 GDDR6X
        (3996, 8192, 8180, 0.001),    # B200: 3996e6 x 1024 bytes x 2 = 8.18 TB/s (8.00 published)
    ],
)
def test_memory_bandwidth_from_bus(clock_mhz, bus_bits, published_gbps, rel):
    value = peaks.memory_bandwidth_bytes_per_s(memory_clock_hz=clock_mhz * 1e6, bus_width_bits=bus_bits)
    assert value / 1e9 == pytest.approx(published_gbps, rel=rel)


@pytest.mark.parametrize(
    ("channels", "mts", "published_gbps"),
    [(2, 3200, 51.2), (2, 6000, 96.0), (8, 4800, 307.2)],
)
def test_dram_bandwidth(channels, mts, published_gbps):
    # §3.5: DDR4-3200 dual channel 51.2 GB/s; DDR5-6000 dual 96; DDR5-4800 8-channel 307.2.
    value = peaks.dram_bandwidth_bytes_per_s(channels=channels, megatransfers_per_s=mts)
    assert value / 1e9 == pytest.approx(published_gbps)


def test_clock_adjusted_peak():
    # An H100 sustaining 1650 MHz instead of the spec's 1830 MHz.
    adjusted = peaks.clock_adjusted_peak(peak=989.4e12, spec_clock_hz=1830e6, actual_clock_hz=1650e6)
    assert adjusted == pytest.approx(989.4e12 * 1650 / 1830)
    assert adjusted < 989.4e12


@pytest.mark.parametrize(
    ("mamf", "theory", "published_efficiency"),
    [(794.5, 989, 0.803), (271.2, 312, 0.869), (668.4, 1300, 0.514)],
)
def test_efficiency_reproduces_the_mamf_table(mamf, theory, published_efficiency):
    # §1.2: "Efficiency is MAMF/Theory*100" (H100 SXM, A100 SXM, MI300X rows).
    result = peaks.explain_efficiency(mamf, theory)
    assert result.fraction == pytest.approx(published_efficiency, abs=0.0005)
    assert not result.exceeds_peak and result.implied_clock_hz is None
    assert f"{published_efficiency:.1%}" in efficiency_summary(result)


def test_a_measurement_above_the_peak_names_the_clock_it_implies():
    peak = peaks.cpu_peak_flops(cores=2, simd_bits=512, element_bits=32, fma_units=2, clock_hz=2.1e9)
    result = peaks.explain_efficiency(300e9, peak, assumed_clock_hz=2.1e9)
    assert result.fraction is None and result.exceeds_peak
    assert result.implied_clock_hz == pytest.approx(300e9 / 268.8e9 * 2.1e9)
    assert "2.34 GHz" in efficiency_summary(result) and "%" not in efficiency_summary(result)


def test_above_the_peak_without_a_clock_blames_an_assumption():
    result = peaks.explain_efficiency(2.0, 1.0)
    assert result.exceeds_peak and result.implied_clock_hz is None and result.fraction is None
    assert "assumption" in efficiency_summary(result)


def test_no_peak_means_measured_only():
    result = peaks.explain_efficiency(5.0, None)
    assert result.fraction is None and not result.exceeds_peak and "measured only" in efficiency_summary(result)


@given(measured=st.floats(0, 1e18), peak=st.floats(1e-3, 1e18), clock=st.floats(1e6, 1e10))
def test_efficiency_never_reports_more_than_100_percent(measured, peak, clock):
    result = peaks.explain_efficiency(measured, peak, assumed_clock_hz=clock)
    if result.fraction is not None:
        assert 0 <= result.fraction <= 1 and not result.exceeds_peak
    else:
        assert result.exceeds_peak and result.implied_clock_hz is not None
        # The implied clock reproduces the measurement through the same linear formula.
        assert result.implied_clock_hz > clock
        assert peak * result.implied_clock_hz / clock == pytest.approx(measured, rel=1e-9)


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, True])
def test_bad_inputs_raise_user_error(bad):
    with pytest.raises(UserError):
        peaks.peak_flops(units=1, flops_per_cycle_per_unit=1, clock_hz=bad)
    with pytest.raises(UserError):
        peaks.explain_efficiency(1.0, bad)


def test_simd_width_must_hold_whole_elements():
    with pytest.raises(UserError, match="multiple"):
        peaks.simd_lanes(simd_bits=100, element_bits=32)
    with pytest.raises(UserError):
        peaks.explain_efficiency(-1.0, 1.0)
