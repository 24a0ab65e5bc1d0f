"""The whole machine in one object: CPU, NVIDIA GPUs, NVML status, versions, and the peaks to compare against.

`detect_machine()` never imports torch, never raises, and is cached per process.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import re
import threading
from dataclasses import dataclass, field
from typing import Any

from tutor.errors import UserError
from tutor.hardware.cpu import CPU_DTYPES, CpuInfo, detect_cpu
from tutor.hardware.nvidia import GpuInfo, NvmlStatus, detect_nvidia
from tutor.hardware.specs import GpuSpec

DTYPES = CPU_DTYPES  # ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
UNKNOWN_GPU = "unknown GPU: measured only"
CPU_MEMORY_PEAK_NOTE = (
    "unknown: DRAM peak = channels x MT/s x 8 B needs the DIMM layout, which only root can read "
    "(dmidecode); compare with the measured triad instead"
)
_DEVICE = re.compile(r"(cpu|mps|cuda)(?::(\d+))?")


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")


def _parse_device(device: str) -> tuple[str, int]:
    match = _DEVICE.fullmatch(device.strip().lower()) if isinstance(device, str) else None
    if not match:
        raise UserError(f"unknown device {device!r}: use 'cpu', 'cuda:N' or 'mps'")
    return match.group(1), int(match.group(2) or 0)


def nvml_index_for_cuda(cuda_index: int, gpus: list[GpuInfo], visible: str | None) -> int | None:
    """Which NVML GPU torch calls cuda:N, honouring CUDA_VISIBLE_DEVICES (indices or UUIDs).

    NVML numbers GPUs in PCI bus order and ignores CUDA_VISIBLE_DEVICES; CUDA renumbers the
    visible ones from 0. (CUDA's default FASTEST_FIRST order equals PCI order on identical GPUs.)
    """
    if visible is None:
        return cuda_index if cuda_index < len(gpus) else None
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if cuda_index >= len(entries):
        return None
    entry = entries[cuda_index]
    if entry.isdigit():
        index = int(entry)
        return index if index < len(gpus) else None
    for gpu in gpus:
        if gpu.uuid and gpu.uuid.startswith(entry):
            return gpu.index
    return None


def _versions() -> dict[str, str | None]:
    from importlib import metadata

    from tutor import __version__

    def installed(package: str) -> str | None:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return None

    # torch's version comes from its metadata: importing torch would cost seconds.
    return {
        "tensor_tutor": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "psutil": installed("psutil"),
        "nvidia_ml_py": installed("nvidia-ml-py"),
        "torch": installed("torch"),
    }


@dataclass(frozen=True)
class Machine:
    """This machine: CPU, NVIDIA GPUs as NVML sees them, NVML status and package versions."""

    cpu: CpuInfo
    gpus: list[GpuInfo]
    nvml: NvmlStatus
    versions: dict[str, str | None] = field(default_factory=dict)

    def gpu_for(self, device: str) -> GpuInfo | None:
        """The NVML GPU behind a torch device name ('cuda:1'), None if there is none."""
        kind, index = _parse_device(device)
        if kind != "cuda":
            return None
        nvml_index = nvml_index_for_cuda(index, self.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
        return self.gpus[nvml_index] if nvml_index is not None else None

    def _spec(self, device: str) -> GpuSpec | None:
        gpu = self.gpu_for(device)
        return gpu.spec if gpu is not None else None

    def peak_tflops(self, device: str, dtype: str) -> float | None:
        """Dense theoretical peak in TFLOP/s (TOPS for int8); None when unknown or unsupported."""
        _check_dtype(dtype)
        kind, _ = _parse_device(device)
        if kind == "cpu":
            flops = self.cpu.peaks[dtype].flops
            return flops / 1e12 if flops is not None else None
        spec = self._spec(device)
        return spec.peak_tflops(dtype) if spec is not None else None

    def peak_memory_gbps(self, device: str) -> float | None:
        """Peak memory bandwidth in GB/s (1e9); None for the CPU (see CPU_MEMORY_PEAK_NOTE) and unknown GPUs."""
        kind, _ = _parse_device(device)
        if kind != "cuda":
            return None
        spec = self._spec(device)
        return spec.bandwidth_gbps if spec is not None else None

    def peak_clock_hz(self, device: str) -> float | None:
        """The clock the peak of `device` assumes: the CPU clock chosen for its formula, or the boost
        clock behind a GPU's datasheet figure (spec derivation). Pass it to
        tutor.theory.peaks.explain_efficiency(assumed_clock_hz=...) or clock_adjusted_peak."""
        kind, _ = _parse_device(device)
        if kind == "cpu":
            return self.cpu.peak_clock.hz
        spec = self._spec(device) if kind == "cuda" else None
        if spec is None or spec.derivation is None:
            return None
        return spec.derivation.boost_clock_mhz * 1e6

    def peak_source(self, device: str, dtype: str) -> str:
        """Where peak_tflops(device, dtype) comes from, or why there is none, in one line."""
        _check_dtype(dtype)
        kind, index = _parse_device(device)
        if kind == "cpu":
            peak = self.cpu.peaks[dtype]
            clock = self.cpu.peak_clock
            if peak.flops is None:
                return peak.note or "no peak"
            ghz = clock.hz / 1e9 if clock.hz else 0.0
            text = (f"formula: {self.cpu.physical_cores} physical cores x {peak.flops_per_cycle_per_core:g} "
                    f"{'ops' if dtype == 'int8' else 'FLOP'}/cycle ({peak.unit}) x {ghz:.2f} GHz, {clock.source}")
            return f"{text}; {peak.note}" if peak.note else text
        if kind == "mps":
            return "no datasheet table for Apple GPUs: measured only"
        gpu = self.gpu_for(device)
        if gpu is None:
            return f"cuda:{index} not seen by NVML ({self.nvml.reason or 'no such GPU'}): measured only"
        spec = gpu.spec
        if spec is None:
            return f"{UNKNOWN_GPU} ({gpu.name})"
        if spec.peak_tflops(dtype) is None:
            text = f"{spec.name}: no dense {dtype} figure (no hardware support or unpublished)"
            return f"{text}; {spec.notes}" if spec.notes else text
        text = f"{spec.name} datasheet, dense: {spec.source}"
        return text if spec.confidence == "datasheet" else f"{text} [confidence {spec.confidence}]"

    def peak_memory_source(self, device: str) -> str:
        """Where peak_memory_gbps(device) comes from, or why there is none."""
        kind, index = _parse_device(device)
        if kind == "cpu":
            return CPU_MEMORY_PEAK_NOTE
        if kind == "mps":
            return "no datasheet table for Apple GPUs: measured only"
        gpu = self.gpu_for(device)
        if gpu is None:
            return f"cuda:{index} not seen by NVML: measured only"
        spec = gpu.spec
        return f"{spec.name} datasheet: {spec.source}" if spec else f"{UNKNOWN_GPU} ({gpu.name})"

    def to_json(self) -> dict[str, Any]:
        """The environment as plain JSON types: {"cpu", "memory", "nvml", "gpus", "versions"}."""
        cpu = self.cpu
        return {
            "cpu": {
                "model_name": cpu.model_name,
                "vendor": cpu.vendor,
                "arch": cpu.arch,
                "physical_cores": cpu.physical_cores,
                "logical_cores": cpu.logical_cores,
                "flags": list(cpu.flags),
                "caches": [dataclasses.asdict(cache) for cache in cpu.caches],
                "last_level_cache_bytes": cpu.last_level_cache_bytes,
                "clock": {
                    "current_hz": cpu.current_clock.hz,
                    "current_source": cpu.current_clock.source,
                    "assumed_for_peak_hz": cpu.peak_clock.hz,
                    "assumed_for_peak_source": cpu.peak_clock.source,
                },
                "peaks": {
                    dtype: {
                        "tflops": peak.flops / 1e12 if peak.flops is not None else None,
                        "flops_per_cycle_per_core": peak.flops_per_cycle_per_core,
                        "unit": peak.unit,
                        "note": peak.note,
                        "source": self.peak_source("cpu", dtype),
                    }
                    for dtype, peak in cpu.peaks.items()
                },
                "notes": list(cpu.notes),
            },
            "memory": {
                "total_bytes": cpu.ram_total_bytes,
                "available_bytes": cpu.ram_available_bytes,
                "peak_gbps": None,
                "peak_note": CPU_MEMORY_PEAK_NOTE,
            },
            "nvml": dataclasses.asdict(self.nvml),
            "gpus": [self._gpu_json(gpu) for gpu in self.gpus],
            "versions": dict(self.versions),
        }

    @staticmethod
    def _gpu_json(gpu: GpuInfo) -> dict[str, Any]:
        data = dataclasses.asdict(gpu)
        data["compute_capability"] = list(gpu.compute_capability) if gpu.compute_capability else None
        data["clock_event_reasons"] = list(gpu.clock_event_reasons) if gpu.clock_event_reasons is not None else None
        data["processes"] = [dataclasses.asdict(p) for p in gpu.processes] if gpu.processes is not None else None
        spec = gpu.spec
        data["spec"] = None if spec is None else {
            "key": spec.key,
            "name": spec.name,
            "peak_tflops": dict(spec.tflops),
            "memory_bytes": spec.memory_bytes,
            "bandwidth_gbps": spec.bandwidth_gbps,
            "source": spec.source,
            "notes": spec.notes,
            "confidence": spec.confidence,
        }
        data["spec_status"] = "datasheet" if spec is not None else UNKNOWN_GPU
        return data


_cache: Machine | None = None
_lock = threading.Lock()


def detect_machine(*, refresh: bool = False) -> Machine:
    """Detect this machine once per process (refresh=True re-reads). Fast; never imports torch; never raises."""
    global _cache
    with _lock:
        if _cache is None or refresh:
            nvml, gpus = detect_nvidia()
            _cache = Machine(cpu=detect_cpu(), gpus=gpus, nvml=nvml, versions=_versions())
        return _cache
