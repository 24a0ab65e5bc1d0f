"""Real tutor.hardware.machine.Machine objects built from recorded facts, for tests outside the UI.

The default is this project's 2-core development VM as `tensor-tutor env --json` recorded it (AMD EPYC,
AVX-512 with BF16 and VNNI, 32 MiB L3, 2.596 GHz); the optional GPU is an H100 80GB HBM3 as NVML
reports one (79.2 GiB to CUDA, PCIe Gen5 x16). Arguments change one fact each so a test states
what it depends on: a peak, the ISA flags, the cache, the free RAM.
"""

from __future__ import annotations

from tutor.hardware.cpu import CPU_DTYPES, CacheLevel, Clock, CpuInfo, CpuPeak
from tutor.hardware.machine import Machine
from tutor.hardware.nvidia import GpuInfo, NvmlStatus

RECORDED_CLOCK_HZ = 2.59612e9
RECORDED_CORES = 2
RECORDED_FLAGS = ("sse2", "avx", "fma", "avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16")
RECORDED_PEAK_TFLOPS: dict[str, float | None] = {  # tutor.hardware.cpu's formula on the recorded CPU
    "fp32": 0.33230336, "tf32": None, "bf16": 0.66460672, "fp16": None, "fp8": None, "int8": 1.32921344}
RECORDED_CACHES = (CacheLevel(1, "Data", 49152, 1), CacheLevel(1, "Instruction", 32768, 1),
                   CacheLevel(2, "Unified", 2**20, 1), CacheLevel(3, "Unified", 32 * 2**20, 2))
NO_DRIVER = "no NVIDIA driver found (NVML: NVML Shared Library Not Found)"
_DEFAULT = object()


def recorded_cpu(*, peaks_tflops: dict[str, float | None] | None = None, flags: tuple[str, ...] = RECORDED_FLAGS,
                 llc_bytes: int | None | object = _DEFAULT, ram_available_bytes: int | None = 22 * 2**30,
                 clock_hz: float | None = RECORDED_CLOCK_HZ) -> CpuInfo:
    """The recorded CPU; `peaks_tflops` replaces the named dtypes' peaks, `llc_bytes=None` drops the caches,
    `clock_hz=None` is a CPU whose clock could not be read."""
    peaks_tflops = {**RECORDED_PEAK_TFLOPS, **(peaks_tflops or {})}
    peaks = {}
    for dtype in CPU_DTYPES:
        tflops = peaks_tflops.get(dtype)
        if tflops is None:
            peaks[dtype] = CpuPeak(dtype, None, None, None, "no peak")
        elif not clock_hz:  # as tutor.hardware.cpu does: no clock, no peak
            peaks[dtype] = CpuPeak(dtype, None, tflops * 1e12 / (RECORDED_CORES * RECORDED_CLOCK_HZ), "recorded",
                                   "unknown clock")
        else:
            peaks[dtype] = CpuPeak(dtype, tflops * 1e12, tflops * 1e12 / (RECORDED_CORES * clock_hz), "recorded", None)
    if llc_bytes is _DEFAULT:
        caches = RECORDED_CACHES
    elif llc_bytes is None:
        caches = ()
    else:
        caches = (CacheLevel(3, "Unified", int(llc_bytes), 2),)  # type: ignore[arg-type]
    return CpuInfo(model_name="AMD EPYC", vendor="AuthenticAMD", arch="x86_64", physical_cores=RECORDED_CORES,
                   logical_cores=RECORDED_CORES, flags=tuple(flags), caches=caches,
                   ram_total_bytes=25276059648, ram_available_bytes=ram_available_bytes,
                   current_clock=Clock(clock_hz, "recorded" if clock_hz else "unknown"),
                   peak_clock=Clock(clock_hz, "recorded" if clock_hz else "unknown"), peaks=peaks)


def recorded_h100(*, pcie_generation_max: int | None = 5, pcie_width_max: int | None = 16,
                  memory_free_bytes: int | None = 79 * 10**9) -> GpuInfo:
    return GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", uuid="GPU-00000000-0000-0000-0000-000000000000",
                   memory_total_bytes=85520809984, memory_free_bytes=memory_free_bytes, sm_clock_max_mhz=1980,
                   power_limit_w=700.0, pcie_generation_max=pcie_generation_max, pcie_width_max=pcie_width_max)


def recorded_machine(*, gpus: list[GpuInfo] | None = None, nvml_reason: str | None = NO_DRIVER,
                     **cpu_facts) -> Machine:
    """A real Machine: the recorded CPU (see recorded_cpu for the facts one can change) and `gpus`."""
    gpus = list(gpus or [])
    nvml = NvmlStatus(True, None, driver_version="550.54.15") if gpus else NvmlStatus(False, nvml_reason)
    return Machine(cpu=recorded_cpu(**cpu_facts), gpus=gpus, nvml=nvml, versions={})
