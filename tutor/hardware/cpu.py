"""What this machine's CPU is: model, cores, ISA flags, caches, RAM, clock, and its peak per dtype.

Detection only; the peak arithmetic is tutor.theory.peaks. Parsing functions take text so tests
can feed fixture /proc/cpuinfo files; the `read_*` functions touch the live system and never
raise (a missing file becomes "unknown").
"""

from __future__ import annotations

import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from tutor.hardware import cpu_clocks
from tutor.theory import peaks

PROC_CPUINFO = Path("/proc/cpuinfo")
SYS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")

CPU_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")

# Flags worth showing: SIMD width, FMA, reduced-precision dot products, matrix units (x86 names
# from /proc/cpuinfo "flags", Arm names from "Features").
ISA_FLAGS = (
    "sse2", "avx", "fma", "avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16",
    "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
    "asimd", "asimdhp", "asimddp", "fphp", "sve", "sve2", "bf16", "i8mm", "sme",
)

# Arm "CPU part" -> (core, SIMD bits, FMA pipes), from Arm's Neoverse and Cortex software optimization guides (FMA pipes per core).
ARM_CORES: dict[tuple[int, int], tuple[str, int, int]] = {
    (0x41, 0xD0C): ("Neoverse N1", 128, 2),
    (0x41, 0xD40): ("Neoverse V1", 256, 2),
}
ARM_IMPLEMENTERS = {0x41: "ARM", 0x61: "Apple", 0x48: "HiSilicon", 0xC0: "Ampere", 0x51: "Qualcomm", 0x4E: "NVIDIA"}


@dataclass(frozen=True)
class CpuinfoFields:
    """The fields of /proc/cpuinfo that matter here (first processor block; flags are per-CPU identical)."""

    model_name: str | None
    vendor: str | None
    family: int | None
    model: int | None
    flags: frozenset[str]
    mhz: float | None
    cache_size_bytes: int | None
    arm_implementer: int | None
    arm_part: int | None
    logical_cpus: int


@dataclass(frozen=True)
class Clock:
    """A clock rate and where the number came from (a peak is only as good as its clock)."""

    hz: float | None
    source: str


@dataclass(frozen=True)
class CacheLevel:
    """One cache as the kernel reports it (size per instance, not summed over cores)."""

    level: int
    kind: str  # "Data", "Instruction", "Unified"
    size_bytes: int
    shared_by_cpus: int | None


@dataclass(frozen=True)
class ComputeUnit:
    """How one core executes one dtype: FLOP (or int ops) per cycle and what that rests on."""

    dtype: str
    flops_per_cycle: float | None
    unit: str | None  # "AVX-512 FMA x2", "AMX-BF16 tiles"
    reason: str | None  # why there is no peak, or the assumption it rests on


@dataclass(frozen=True)
class CpuPeak:
    """Theoretical peak of the whole CPU for one dtype; flops None when there is no honest value."""

    dtype: str
    flops: float | None
    flops_per_cycle_per_core: float | None
    unit: str | None
    note: str | None


@dataclass(frozen=True)
class CpuInfo:
    """This machine's CPU and RAM."""

    model_name: str
    vendor: str | None
    arch: str
    physical_cores: int | None
    logical_cores: int | None
    flags: tuple[str, ...]  # the ISA_FLAGS present, in ISA_FLAGS order
    caches: tuple[CacheLevel, ...]
    ram_total_bytes: int | None
    ram_available_bytes: int | None
    current_clock: Clock
    peak_clock: Clock
    peaks: dict[str, CpuPeak] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def last_level_cache_bytes(self) -> int | None:
        """Size of the highest-level cache instance (bandwidth buffers should be >= 4x this)."""
        data = [c for c in self.caches if c.kind in ("Unified", "Data")]
        return max(data, key=lambda c: (c.level, c.size_bytes)).size_bytes if data else None


def _int_or_none(text: str | None, base: int = 10) -> int | None:
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None


def parse_cpuinfo(text: str) -> CpuinfoFields:
    """Parse the text of /proc/cpuinfo (x86 or Arm layout)."""
    first: dict[str, str] = {}
    logical = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "processor" and value.isdigit():
            logical += 1
        first.setdefault(key, value)
    flags_text = first.get("flags") or first.get("Features") or ""
    mhz = None
    try:
        mhz = float(first["cpu MHz"]) if "cpu MHz" in first else None
    except ValueError:
        mhz = None
    cache = None
    match = re.fullmatch(r"(\d+)\s*([KMG]?)B?", first.get("cache size", ""), re.IGNORECASE)
    if match:
        cache = int(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2).upper()]
    implementer = _int_or_none(first.get("CPU implementer"), 16)
    part = _int_or_none(first.get("CPU part"), 16)
    vendor = first.get("vendor_id") or (ARM_IMPLEMENTERS.get(implementer, f"Arm implementer {implementer:#x}")
                                        if implementer is not None else None)
    model_name = first.get("model name") or first.get("Model") or first.get("Hardware")
    if model_name is None and implementer is not None:
        core = ARM_CORES.get((implementer, part or -1))
        model_name = core[0] if core else None
    return CpuinfoFields(
        model_name=model_name,
        vendor=vendor,
        family=_int_or_none(first.get("cpu family")),
        model=_int_or_none(first.get("model")),
        flags=frozenset(flags_text.split()),
        mhz=mhz if mhz and mhz > 0 else None,
        cache_size_bytes=cache,
        arm_implementer=implementer,
        arm_part=part,
        logical_cpus=logical,
    )


def _x86_fp32_unit(info: CpuinfoFields) -> tuple[int, int, str, str | None]:
    """(effective SIMD bits, FMA units, label, assumption) for FP32 FMA on an x86 core (§6.4)."""
    flags, amd = info.flags, info.vendor == "AuthenticAMD"
    if "avx512f" in flags:
        if amd and info.family == 0x19:
            return (256, 2, "AVX-512 (Zen 4, double-pumped 256-bit) FMA x2",
                    "Zen 4 executes 512-bit ops as two 256-bit halves")
        if amd:
            return 512, 2, "AVX-512 FMA x2", "full 512-bit datapath assumed (Zen 5 desktop/server)"
        return 512, 2, "AVX-512 FMA x2", "2 AVX-512 FMA units assumed (Xeon Gold/Platinum and later; some SKUs have 1)"
    if "avx2" in flags and "fma" in flags:
        if amd and info.family == 0x17 and (info.model or 0) < 0x30:
            return 128, 2, "AVX2 (Zen 1, 2 x 128-bit) FMA x2", None
        return 256, 2, "AVX2 FMA x2", "2 FMA ports assumed (Haswell and later, Zen 2/3)"
    if "avx" in flags:
        return 256, 1, "AVX (separate 256-bit mul + add)", "no FMA: one multiply and one add per cycle"
    if "sse2" in flags:
        return 128, 1, "SSE2 (separate 128-bit mul + add)", "no FMA: one multiply and one add per cycle"
    return 0, 0, "", None


def compute_units(info: CpuinfoFields, arch: str) -> dict[str, ComputeUnit]:
    """For each dtype, how one core of this CPU computes it, from its ISA flags (§6.4)."""
    flags = info.flags
    units: dict[str, ComputeUnit] = {
        "tf32": ComputeUnit("tf32", None, None, "TF32 is a GPU tensor-core format; no CPU instruction"),
        "fp8": ComputeUnit("fp8", None, None, "no CPU instruction for FP8 matmul"),
    }
    if not flags:
        reason = "ISA flags unknown (/proc/cpuinfo not readable on this system)"
        units.update({d: ComputeUnit(d, None, None, reason) for d in ("fp32", "bf16", "fp16", "int8")})
        return units
    is_arm = arch.lower() in ("aarch64", "arm64") or info.arm_implementer is not None
    if is_arm:
        core = ARM_CORES.get((info.arm_implementer or -1, info.arm_part or -1))
        if info.arm_implementer == 0x61:
            core = ("Apple P-core", 128, 4)
        if core is None:
            part = f"{info.arm_part:#x}" if info.arm_part is not None else "unknown"
            reason = f"unknown Arm core (CPU part {part}): its FMA pipe count is not known"
            units.update({d: ComputeUnit(d, None, None, reason) for d in ("fp32", "bf16", "fp16", "int8")})
            return units
        name, bits, pipes = core
        simd = "SVE" if bits > 128 and "sve" in flags else "NEON"
        label = f"{simd} {bits}-bit FMA x{pipes} ({name})"

        def arm(dtype: str, element_bits: int, present: bool, instr: str) -> ComputeUnit:
            if not present:
                return ComputeUnit(dtype, None, None, f"no native support (emulated): no {instr}")
            per = peaks.cpu_flops_per_cycle(simd_bits=bits, element_bits=element_bits, fma_units=pipes)
            return ComputeUnit(dtype, per, f"{label}, {instr}" if instr != "FMA" else label, None)

        units["fp32"] = arm("fp32", 32, True, "FMA")
        units["bf16"] = arm("bf16", 16, "bf16" in flags, "BFDOT (bf16)")
        units["fp16"] = arm("fp16", 16, "asimdhp" in flags or "fphp" in flags, "FP16 arithmetic (asimdhp)")
        units["int8"] = arm("int8", 8, "asimddp" in flags, "SDOT (asimddp)")
        return units

    bits, fma_units, label, assumption = _x86_fp32_unit(info)
    if not bits:
        reason = "no SSE2/AVX flags found"
        units.update({d: ComputeUnit(d, None, None, reason) for d in ("fp32", "bf16", "fp16", "int8")})
        return units
    fp32 = peaks.cpu_flops_per_cycle(simd_bits=bits, element_bits=32, fma_units=fma_units)
    units["fp32"] = ComputeUnit("fp32", fp32, label, assumption)
    if "amx_bf16" in flags and "amx_tile" in flags:
        units["bf16"] = ComputeUnit("bf16", 1024, "AMX-BF16 tiles", "Intel AMX: 1024 BF16 FLOP per cycle per core")
    elif "avx512_bf16" in flags:
        per = peaks.cpu_flops_per_cycle(simd_bits=bits, element_bits=16, fma_units=fma_units)
        units["bf16"] = ComputeUnit("bf16", per, f"AVX512-BF16 VDPBF16PS x{fma_units}", "2 BF16 products per FP32 lane")
    else:
        units["bf16"] = ComputeUnit("bf16", None, None, "no native support (emulated): no avx512_bf16 or amx_bf16")
    if "amx_fp16" in flags and "amx_tile" in flags:
        units["fp16"] = ComputeUnit("fp16", 1024, "AMX-FP16 tiles", "Intel AMX: 1024 FP16 FLOP per cycle per core")
    elif "avx512_fp16" in flags and bits == 512:
        per = peaks.cpu_flops_per_cycle(simd_bits=512, element_bits=16, fma_units=fma_units)
        units["fp16"] = ComputeUnit("fp16", per, f"AVX512-FP16 FMA x{fma_units}", None)
    else:
        units["fp16"] = ComputeUnit("fp16", None, None, "no native support (emulated): no avx512_fp16 or amx_fp16")
    if "amx_int8" in flags and "amx_tile" in flags:
        units["int8"] = ComputeUnit("int8", 2048, "AMX-INT8 tiles", "Intel AMX: 2048 INT8 ops per cycle per core")
    elif "avx512_vnni" in flags and bits >= 256:
        per = peaks.cpu_flops_per_cycle(simd_bits=bits, element_bits=8, fma_units=fma_units)
        units["int8"] = ComputeUnit("int8", per, f"AVX512-VNNI VPDPBUSD x{fma_units}",
                                    "4 INT8 products per 32-bit lane")
    elif "avx_vnni" in flags:
        per = peaks.cpu_flops_per_cycle(simd_bits=256, element_bits=8, fma_units=2)
        units["int8"] = ComputeUnit("int8", per, "AVX-VNNI VPDPBUSD x2", "4 INT8 products per 32-bit lane")
    else:
        units["int8"] = ComputeUnit("int8", None, None, "no INT8 dot-product instruction (VNNI or AMX)")
    return units


def choose_peak_clock(*, cpufreq_max_mhz: float | None, cpuinfo_mhz: float | None, model_name: str | None,
                      cpufreq_current_mhz: float | None, vendor: str | None = None, family: int | None = None,
                      model: int | None = None) -> Clock:
    """The clock a CPU peak assumes, and where it came from, best source first.

    A peak is a ceiling, so its clock is the highest the cores reach. In order: the cpufreq maximum
    (what the OS says the cores can reach); the published max boost/turbo clock of the SKU in the
    model name (tutor.hardware.cpu_clocks), since most VMs expose no
    /sys/devices/system/cpu/*/cpufreq; where the model name hides the SKU, the highest max boost of
    its generation (CPUID family and model), an upper bound; the "@ 2.50GHz" of an Intel model name,
    which is the base clock; /proc/cpuinfo "cpu MHz", a snapshot of the current clock (in a VM the
    TSC rate, the base clock); last the current clock psutil reads.
    The base clock and the snapshot are both below what the cores boost to, so a peak on either can
    be beaten by a quiet measurement: they come last, and the higher of the two is taken.
    """
    if cpufreq_max_mhz and cpufreq_max_mhz > 0:
        return Clock(cpufreq_max_mhz * 1e6, "maximum clock from cpufreq (psutil.cpu_freq().max)")
    sku = cpu_clocks.sku_clock(model_name)
    if sku is not None:
        return Clock(sku.max_hz, f"{sku.term} of the {sku.name}, as published ({sku.source})")
    generation = cpu_clocks.generation_clock(model_name, vendor=vendor, family=family, model=model)
    if generation is not None and family is not None and model is not None:
        named = cpu_clocks.sku_in_model_name(model_name)
        why = (f"the {named} is not in the clock table" if named is not None
               else f"the model name \"{model_name}\" hides which SKU this is")
        return Clock(generation.max_hz,
                     f"upper bound, the highest max boost of any {generation.series} SKU ({generation.fastest}; "
                     f"{generation.source}), as {why} (CPUID family {family:02X}h, model {model:02X}h)")
    match = re.search(r"@\s*(\d+(?:\.\d+)?)\s*GHz", model_name or "", re.IGNORECASE)
    base_hz = float(match.group(1)) * 1e9 if match else None
    snapshot_hz = cpuinfo_mhz * 1e6 if cpuinfo_mhz and cpuinfo_mhz > 0 else None
    if base_hz is not None and (snapshot_hz is None or base_hz >= snapshot_hz):
        return Clock(base_hz, "base clock in the CPU model name (\"@ x GHz\"): turbo runs above it "
                              "(no cpufreq maximum, the model is not in the clock table)")
    if snapshot_hz is not None:
        return Clock(snapshot_hz, "\"cpu MHz\" in /proc/cpuinfo, a snapshot of the current clock (in a VM the base "
                                  "clock): boost may run above it (no cpufreq maximum, the model is not in the "
                                  "clock table)")
    if cpufreq_current_mhz and cpufreq_current_mhz > 0:
        return Clock(cpufreq_current_mhz * 1e6, "current clock from psutil.cpu_freq(): boost may run above it")
    return Clock(None, "unknown: no cpufreq, no clock table entry, no \"cpu MHz\", no clock in the model name")


def cpu_peaks(units: dict[str, ComputeUnit], *, physical_cores: int | None, clock: Clock) -> dict[str, CpuPeak]:
    """Whole-CPU peak per dtype = physical cores x per-core FLOP/cycle x clock (Intel 64 and IA-32
    Architectures Optimization Reference Manual: FMA ports x SIMD lanes x 2)."""
    result: dict[str, CpuPeak] = {}
    for dtype in CPU_DTYPES:
        unit = units[dtype]
        if unit.flops_per_cycle is None:
            result[dtype] = CpuPeak(dtype, None, None, None, unit.reason)
        elif not physical_cores or clock.hz is None:
            missing = "physical core count" if not physical_cores else "clock"
            result[dtype] = CpuPeak(dtype, None, unit.flops_per_cycle, unit.unit, f"unknown {missing}")
        else:
            value = peaks.peak_flops(units=physical_cores, flops_per_cycle_per_unit=unit.flops_per_cycle,
                                     clock_hz=clock.hz)
            result[dtype] = CpuPeak(dtype, value, unit.flops_per_cycle, unit.unit, unit.reason)
    return result


def parse_cache_size(text: str) -> int | None:
    """'48K' -> 49152, '300M' -> 314572800, '1024' -> 1024; None when unreadable."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not match:
        return None
    return int(match.group(1)) * {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2).upper()]


def _cpu_list_len(text: str) -> int | None:
    count = 0
    for part in text.strip().split(","):
        if not part:
            continue
        low, _, high = part.partition("-")
        if not low.isdigit() or (high and not high.isdigit()):
            return None
        count += int(high) - int(low) + 1 if high else 1
    return count or None


def read_caches(root: Path = SYS_CACHE) -> tuple[CacheLevel, ...]:
    """Caches of cpu0 from sysfs (index*/level, type, size); empty when the directory is missing."""
    levels: list[CacheLevel] = []
    try:
        entries = sorted(root.glob("index*"))
    except OSError:
        return ()
    for entry in entries:
        try:
            level = int((entry / "level").read_text().strip())
            kind = (entry / "type").read_text().strip()
            size = parse_cache_size((entry / "size").read_text())
        except (OSError, ValueError):
            continue
        if size is None:
            continue
        try:
            shared = _cpu_list_len((entry / "shared_cpu_list").read_text())
        except OSError:
            shared = None
        levels.append(CacheLevel(level, kind, size, shared))
    return tuple(sorted(levels, key=lambda c: (c.level, c.kind)))


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def psutil_errors(psutil: ModuleType) -> tuple[type[BaseException], ...]:
    """What a psutil reading raises where the platform cannot answer: psutil.Error (NoSuchProcess,
    AccessDenied, ZombieProcess), OSError from /proc or sysctl, NotImplementedError on platforms without
    the reading, RuntimeError from its C extension (psutil docs, "Exceptions")."""
    return (psutil.Error, OSError, NotImplementedError, RuntimeError)


def detect_cpu(cpuinfo_text: str | None = None, cache_root: Path = SYS_CACHE) -> CpuInfo:
    """Describe this machine's CPU and RAM. Never raises: what cannot be read is None/"unknown"."""
    import psutil

    info = parse_cpuinfo(_read_text(PROC_CPUINFO) if cpuinfo_text is None else cpuinfo_text)
    arch = platform.machine() or "unknown"
    try:
        physical = psutil.cpu_count(logical=False)
        logical = psutil.cpu_count(logical=True)
    except psutil_errors(psutil):  # counts are then unknown
        physical, logical = None, None
    logical = logical or info.logical_cpus or os.cpu_count()
    try:
        freq = psutil.cpu_freq()
    except psutil_errors(psutil) + (AttributeError,):  # psutil #2382/#2642/#2841: cpu_freq fails on some
        freq = None  # Apple Silicon releases; AttributeError: platforms where psutil has no cpu_freq
    freq_max = freq.max if freq is not None and freq.max else None
    freq_current = freq.current if freq is not None and freq.current else None
    peak_clock = choose_peak_clock(cpufreq_max_mhz=freq_max, cpuinfo_mhz=info.mhz, model_name=info.model_name,
                                   cpufreq_current_mhz=freq_current, vendor=info.vendor, family=info.family,
                                   model=info.model)
    if freq_current:
        current = Clock(freq_current * 1e6, "psutil.cpu_freq().current")
    elif info.mhz:
        current = Clock(info.mhz * 1e6, "\"cpu MHz\" in /proc/cpuinfo")
    else:
        current = Clock(None, "unknown")
    ram_total: int | None
    ram_available: int | None
    try:
        memory = psutil.virtual_memory()
        ram_total, ram_available = int(memory.total), int(memory.available)
    except psutil_errors(psutil):
        ram_total = ram_available = None
    caches = read_caches(cache_root)
    if not caches and info.cache_size_bytes:
        caches = (CacheLevel(3 if info.vendor == "GenuineIntel" else 2, "Unified", info.cache_size_bytes, None),)
    units = compute_units(info, arch)
    notes: list[str] = []
    if "hypervisor" in info.flags:
        notes.append("virtual machine: vCPUs may be hyperthreads sharing fewer physical cores, "
                     "so the peak may be up to 2x too high")
    if units["fp32"].unit and "AVX-512" in units["fp32"].unit and info.vendor == "GenuineIntel":
        notes.append("AVX-512 code runs at a lower 'license' clock than the one assumed")
    model_name = info.model_name or platform.processor() or "unknown CPU"
    return CpuInfo(
        model_name=model_name,
        vendor=info.vendor,
        arch=arch,
        physical_cores=physical,
        logical_cores=logical,
        flags=tuple(flag for flag in ISA_FLAGS if flag in info.flags),
        caches=caches,
        ram_total_bytes=ram_total,
        ram_available_bytes=ram_available,
        current_clock=current,
        peak_clock=peak_clock,
        peaks=cpu_peaks(units, physical_cores=physical, clock=peak_clock),
        notes=tuple(notes),
    )
