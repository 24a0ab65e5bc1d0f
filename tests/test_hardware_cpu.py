"""CPU detection from fixture /proc/cpuinfo texts: ISA flags -> FLOP/cycle, clock choice, caches."""

from __future__ import annotations

from pathlib import Path

import pytest

from tutor.hardware import cpu
from tutor.hardware.cpu import Clock, choose_peak_clock, compute_units, cpu_peaks, parse_cpuinfo
from tutor.theory import peaks

# An Emerald Rapids Xeon VM (this project's CI machine): AVX-512, AVX512-BF16/FP16, AMX.
XEON_AMX = """\
processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model		: 207
model name	: Intel(R) Xeon(R) Processor
cpu MHz		: 2100.000
cache size	: 307200 KB
flags		: fpu sse sse2 ht pni ssse3 fma sse4_1 sse4_2 avx f16c hypervisor avx2 avx512f avx512dq avx512bw avx512vl avx_vnni avx512_bf16 avx512_vnni amx_bf16 avx512_fp16 amx_tile amx_int8

processor	: 1
vendor_id	: GenuineIntel
cpu family	: 6
model		: 207
model name	: Intel(R) Xeon(R) Processor
cpu MHz		: 2100.000
flags		: fpu sse sse2 ht pni ssse3 fma sse4_1 sse4_2 avx f16c hypervisor avx2 avx512f avx512dq avx512bw avx512vl avx_vnni avx512_bf16 avx512_vnni amx_bf16 avx512_fp16 amx_tile amx_int8
"""

# The reference's 2-vCPU AMD EPYC (Zen 3) VM: AVX2 + FMA, no AVX-512, no BF16.
EPYC_ZEN3 = """\
processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 1
model name	: AMD EPYC 7B13
cpu MHz		: 2445.406
cache size	: 512 KB
flags		: fpu sse sse2 ht pni ssse3 fma sse4_1 sse4_2 avx f16c avx2 sha_ni
"""

ZEN4 = """\
processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 25
model		: 97
model name	: AMD Ryzen 9 7950X 16-Core Processor
cpu MHz		: 4500.000
flags		: sse sse2 fma avx avx2 avx512f avx512_bf16 avx512_vnni
"""

ZEN1 = """\
processor	: 0
vendor_id	: AuthenticAMD
cpu family	: 23
model		: 1
model name	: AMD EPYC 7601 32-Core Processor
flags		: sse sse2 fma avx avx2
"""

HASWELL = """\
processor	: 0
vendor_id	: GenuineIntel
cpu family	: 6
model		: 63
model name	: Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz
flags		: sse sse2 fma avx avx2
"""

NEOVERSE_N1 = """\
processor	: 0
BogoMIPS	: 50.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer	: 0x41
CPU architecture: 8
CPU variant	: 0x3
CPU part	: 0xd0c
CPU revision	: 1

processor	: 1
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer	: 0x41
CPU part	: 0xd0c
"""

UNKNOWN_ARM = """\
processor	: 0
Features	: fp asimd
CPU implementer	: 0x41
CPU part	: 0xd99
"""


def test_parse_x86_cpuinfo():
    info = parse_cpuinfo(XEON_AMX)
    assert info.model_name == "Intel(R) Xeon(R) Processor"
    assert info.vendor == "GenuineIntel" and info.family == 6 and info.model == 207
    assert info.mhz == 2100.0 and info.logical_cpus == 2
    assert info.cache_size_bytes == 307200 * 1024
    assert {"avx512f", "amx_bf16", "amx_tile", "avx512_bf16"} <= info.flags


def test_parse_arm_cpuinfo():
    info = parse_cpuinfo(NEOVERSE_N1)
    assert info.arm_implementer == 0x41 and info.arm_part == 0xD0C
    assert info.vendor == "ARM" and info.model_name == "Neoverse N1"
    assert "asimd" in info.flags and info.mhz is None and info.logical_cpus == 2


def test_parse_empty_text_is_all_unknown():
    info = parse_cpuinfo("")
    assert info.model_name is None and info.flags == frozenset() and info.logical_cpus == 0
    units = compute_units(info, "x86_64")
    assert all(units[d].flops_per_cycle is None for d in cpu.CPU_DTYPES)
    assert "unknown" in units["fp32"].reason


def test_xeon_with_amx():
    units = compute_units(parse_cpuinfo(XEON_AMX), "x86_64")
    assert units["fp32"].flops_per_cycle == 64           # §6.4 AVX-512, 2 FMA units
    assert units["bf16"].flops_per_cycle == 1024         # §6.4 AMX-BF16
    assert units["int8"].flops_per_cycle == 2048         # §6.4 AMX-INT8
    assert units["fp16"].flops_per_cycle == 128          # AVX512-FP16: 32 lanes x 2 units x 2
    assert units["tf32"].flops_per_cycle is None and units["fp8"].flops_per_cycle is None


def test_sapphire_rapids_example_through_detection():
    # §6.4 worked example: 56 cores x 64 x 2.0 GHz = 7.2 TF FP32, 56 x 1024 x 1.9 GHz ~ 109 TF BF16.
    units = compute_units(parse_cpuinfo(XEON_AMX), "x86_64")
    fp32 = cpu_peaks(units, physical_cores=56, clock=Clock(2.0e9, "test"))["fp32"].flops
    bf16 = cpu_peaks(units, physical_cores=56, clock=Clock(1.9e9, "test"))["bf16"].flops
    assert fp32 == pytest.approx(7.2e12, rel=0.005)
    assert bf16 == pytest.approx(109e12, rel=0.005)


def test_avx2_only_epyc_has_no_native_bf16():
    units = compute_units(parse_cpuinfo(EPYC_ZEN3), "x86_64")
    assert units["fp32"].flops_per_cycle == 32
    for dtype in ("bf16", "fp16"):
        assert units[dtype].flops_per_cycle is None
        assert units[dtype].reason.startswith("no native support (emulated)")
    assert units["int8"].flops_per_cycle is None
    # §6.4's 2-vCPU EPYC VM: 156 GF at its 2.445 GHz "cpu MHz", which is the base clock. The peak now
    # takes the 7B13's published 3.5 GHz max boost (Google Cloud's CPU platforms page), as the cores
    # boost above the base: 2 x 32 x 3.5 GHz = 224 GF if vCPUs were whole cores.
    clock = choose_peak_clock(cpufreq_max_mhz=None, cpuinfo_mhz=2445.406, model_name="AMD EPYC 7B13",
                              cpufreq_current_mhz=None)
    result = cpu_peaks(units, physical_cores=2, clock=clock)
    assert result["fp32"].flops == pytest.approx(224e9, rel=0.005)
    assert result["bf16"].flops is None and "emulated" in result["bf16"].note


def test_zen4_avx512_does_not_double_flops():
    units = compute_units(parse_cpuinfo(ZEN4), "x86_64")
    assert units["fp32"].flops_per_cycle == 32  # §6.4: double-pumped 256-bit
    assert units["bf16"].flops_per_cycle == 64  # VDPBF16PS: 2x the FP32 rate
    # §6.4 worked example: 16-core Zen 4 at 5.0 GHz = 2.56 TF.
    assert cpu_peaks(units, physical_cores=16, clock=Clock(5.0e9, "t"))["fp32"].flops == pytest.approx(2.56e12)


def test_zen1_and_haswell():
    assert compute_units(parse_cpuinfo(ZEN1), "x86_64")["fp32"].flops_per_cycle == 16
    assert compute_units(parse_cpuinfo(HASWELL), "x86_64")["fp32"].flops_per_cycle == 32


def test_neoverse_n1():
    units = compute_units(parse_cpuinfo(NEOVERSE_N1), "aarch64")
    assert units["fp32"].flops_per_cycle == 16  # §6.4: 2 x 128-bit NEON pipes
    assert units["fp16"].flops_per_cycle == 32  # asimdhp: 8 lanes x 2 x 2
    assert units["int8"].flops_per_cycle == 64  # SDOT
    assert units["bf16"].flops_per_cycle is None and "emulated" in units["bf16"].reason


def test_unknown_arm_core_has_no_peak_and_says_why():
    units = compute_units(parse_cpuinfo(UNKNOWN_ARM), "aarch64")
    assert units["fp32"].flops_per_cycle is None
    assert "0xd99" in units["fp32"].reason


def test_clock_source_order():
    assert choose_peak_clock(cpufreq_max_mhz=3500, cpuinfo_mhz=2100, model_name="AMD EPYC 9654 96-Core Processor",
                             cpufreq_current_mhz=1200) == Clock(3.5e9, "maximum clock from cpufreq (psutil.cpu_freq().max)")
    clock = choose_peak_clock(cpufreq_max_mhz=0.0, cpuinfo_mhz=2100.0, model_name=None, cpufreq_current_mhz=2100)
    assert clock.hz == 2.1e9 and "/proc/cpuinfo" in clock.source
    clock = choose_peak_clock(cpufreq_max_mhz=None, cpuinfo_mhz=None,
                              model_name="Intel(R) Xeon(R) CPU E5-2680 v3 @ 2.50GHz", cpufreq_current_mhz=None)
    assert clock.hz == 2.5e9 and "model name" in clock.source and "base clock" in clock.source
    clock = choose_peak_clock(cpufreq_max_mhz=None, cpuinfo_mhz=None, model_name="Apple M2", cpufreq_current_mhz=1800)
    assert clock.hz == 1.8e9 and "psutil.cpu_freq()" in clock.source
    clock = choose_peak_clock(cpufreq_max_mhz=None, cpuinfo_mhz=None, model_name="Apple M2", cpufreq_current_mhz=None)
    assert clock.hz is None and clock.source.startswith("unknown")


FIXTURES = Path(__file__).parent / "fixtures" / "cpuinfo"
# This project's 2-vCPU AMD VM: Firecracker rewrites the host's brand string to plain "AMD EPYC", has
# no cpufreq, and its "cpu MHz" (2596) is the TSC rate, the base clock; CPUID family 1Ah model 02h is
# Zen 5 Turin. At 2.60 GHz a quiet 2-thread fp32 matmul measured above the 332 GFLOP/s peak.
FIRECRACKER_EPYC = (FIXTURES / "amd-epyc-firecracker-2vcpu.txt").read_text()


def _clock_for(text: str, *, cpufreq_max_mhz: float | None = None) -> Clock:
    """The peak clock for a recorded /proc/cpuinfo, as detect_cpu chooses it."""
    info = parse_cpuinfo(text)
    return choose_peak_clock(cpufreq_max_mhz=cpufreq_max_mhz, cpuinfo_mhz=info.mhz, model_name=info.model_name,
                             cpufreq_current_mhz=None, vendor=info.vendor, family=info.family, model=info.model)


def test_cpufreq_maximum_comes_first():
    clock = _clock_for(EPYC_ZEN3.replace("7B13", "9R14"), cpufreq_max_mhz=3100.0)
    assert clock.hz == 3.1e9 and "cpufreq" in clock.source


def test_a_sku_in_the_table_gives_its_published_max_boost():
    # no cpufreq, model in the table: its max boost, not the 2.45 GHz "cpu MHz"
    clock = _clock_for(EPYC_ZEN3.replace("AMD EPYC 7B13", "AMD EPYC 9R14 96-Core Processor"))
    assert clock.hz == 3.7e9
    assert clock.source.startswith("max boost of the AMD EPYC 9R14, as published (aws.amazon.com/")
    clock = _clock_for(ZEN1.replace("AMD EPYC 7601 32-Core Processor", "AMD EPYC 9654P 96-Core Processor"))
    assert clock.hz == 3.7e9 and "AMD EPYC 9654P" in clock.source and "amd.com" in clock.source
    clock = _clock_for(XEON_AMX.replace("Intel(R) Xeon(R) Processor", "Intel(R) Xeon(R) Platinum 8480+"))
    assert clock.hz == 3.8e9
    assert clock.source == ("max turbo of the Intel Xeon Platinum 8480+, as published "
                            "(ark.intel.com product page, Max Turbo Frequency)")


def test_a_hidden_epyc_sku_gets_its_generations_highest_boost_said_as_an_upper_bound():
    info = parse_cpuinfo(FIRECRACKER_EPYC)
    assert info.model_name == "AMD EPYC" and info.family == 0x1A and info.model == 0x02 and info.mhz == 2596.098
    clock = _clock_for(FIRECRACKER_EPYC)
    assert clock.hz == 5.0e9  # EPYC 9575F / 9175F, the fastest EPYC 9005 SKUs
    assert clock.source.startswith("upper bound, the highest max boost of any AMD EPYC 9005 (Zen 5, Turin) SKU")
    assert 'the model name "AMD EPYC" hides which SKU this is' in clock.source
    # an EPYC SKU the table lacks: its generation's bound too, naming the SKU
    clock = _clock_for(EPYC_ZEN3.replace("7B13", "7443"))
    assert clock.hz == 4.1e9 and "AMD EPYC 7003" in clock.source and "AMD EPYC 7443 is not in the clock table" in clock.source


def test_no_generation_bound_outside_epyc():
    # a Ryzen of an EPYC family and model range boosts higher than any EPYC: no bound from the family
    desktop = FIRECRACKER_EPYC.replace("model name\t: AMD EPYC", "model name\t: AMD Ryzen 9 9950X")
    clock = _clock_for(desktop)
    assert clock.hz == pytest.approx(2596.098e6) and clock.source.startswith('"cpu MHz" in /proc/cpuinfo')
    assert _clock_for(ZEN4).hz == 4.5e9 and "snapshot" in _clock_for(ZEN4).source


def test_base_clock_in_the_model_name_then_cpu_mhz():
    # not in the table, "@ GHz" in the name: that, said to be the base
    clock = _clock_for(HASWELL)
    assert clock.hz == 2.5e9 and clock.source.startswith('base clock in the CPU model name ("@ x GHz")')
    # a "cpu MHz" above the base is the better of the two (both are below turbo)
    clock = _clock_for(HASWELL.replace("flags", "cpu MHz\t\t: 3100.000\nflags"))
    assert clock.hz == 3.1e9 and "snapshot" in clock.source
    # only "cpu MHz": that, said to be a snapshot that boost may exceed
    clock = _clock_for(XEON_AMX)
    assert clock.hz == 2.1e9
    assert clock.source.startswith('"cpu MHz" in /proc/cpuinfo, a snapshot of the current clock')
    assert "boost may run above it" in clock.source


def test_detect_cpu_on_the_firecracker_fixture_uses_the_bound(tmp_path):
    info = cpu.detect_cpu(cpuinfo_text=FIRECRACKER_EPYC, cache_root=tmp_path)
    if info.peak_clock.source.startswith("maximum clock from cpufreq"):
        pytest.skip("this machine has a cpufreq maximum, which comes first")
    assert info.peak_clock.hz == 5.0e9
    assert info.peaks["fp32"].flops_per_cycle_per_core == 64  # Zen 5: full 512-bit FMA x2


def test_peaks_without_clock_or_cores_are_none_with_a_reason():
    units = compute_units(parse_cpuinfo(HASWELL), "x86_64")
    no_clock = cpu_peaks(units, physical_cores=12, clock=Clock(None, "unknown"))
    assert no_clock["fp32"].flops is None and no_clock["fp32"].flops_per_cycle_per_core == 32
    assert "clock" in no_clock["fp32"].note
    no_cores = cpu_peaks(units, physical_cores=None, clock=Clock(2.5e9, "t"))
    assert no_cores["fp32"].flops is None and "core" in no_cores["fp32"].note


def test_peak_equals_the_theory_formula():
    units = compute_units(parse_cpuinfo(HASWELL), "x86_64")
    result = cpu_peaks(units, physical_cores=12, clock=Clock(2.5e9, "t"))["fp32"].flops
    assert result == peaks.cpu_peak_flops(cores=12, simd_bits=256, element_bits=32, fma_units=2, clock_hz=2.5e9)


def _write_cache(root: Path, index: int, level: str, kind: str, size: str, shared: str) -> None:
    entry = root / f"index{index}"
    entry.mkdir(parents=True)
    (entry / "level").write_text(level + "\n")
    (entry / "type").write_text(kind + "\n")
    (entry / "size").write_text(size + "\n")
    (entry / "shared_cpu_list").write_text(shared + "\n")


def test_read_caches_from_sysfs(tmp_path):
    _write_cache(tmp_path, 0, "1", "Data", "48K", "0")
    _write_cache(tmp_path, 1, "1", "Instruction", "32K", "0")
    _write_cache(tmp_path, 2, "2", "Unified", "2048K", "0")
    _write_cache(tmp_path, 3, "3", "Unified", "307200K", "0-1,4-5")
    _write_cache(tmp_path, 4, "4", "Unified", "garbage", "0")
    caches = cpu.read_caches(tmp_path)
    assert [(c.level, c.kind, c.size_bytes) for c in caches] == [
        (1, "Data", 48 * 1024), (1, "Instruction", 32 * 1024), (2, "Unified", 2 * 2**20), (3, "Unified", 300 * 2**20)]
    assert caches[-1].shared_by_cpus == 4


def test_missing_cache_dir_and_cpuinfo_fallback(tmp_path):
    assert cpu.read_caches(tmp_path / "absent") == ()
    info = cpu.detect_cpu(cpuinfo_text=EPYC_ZEN3, cache_root=tmp_path / "absent")
    assert [(c.level, c.size_bytes) for c in info.caches] == [(2, 512 * 1024)]
    assert info.last_level_cache_bytes == 512 * 1024


def test_detect_cpu_never_raises_on_garbage(tmp_path):
    info = cpu.detect_cpu(cpuinfo_text="\x00garbage: : :\nflags\n", cache_root=tmp_path)
    assert info.model_name and all(p.flops is None for p in info.peaks.values())


def test_detect_cpu_on_this_machine():
    info = cpu.detect_cpu()
    assert info.logical_cores and info.logical_cores >= 1
    assert info.ram_total_bytes and info.ram_total_bytes > 0
    assert set(info.peaks) == set(cpu.CPU_DTYPES)
    assert info.peaks["tf32"].flops is None
    if info.peaks["fp32"].flops is not None:
        assert info.peak_clock.hz and info.peak_clock.source
