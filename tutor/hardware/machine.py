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
def cpu_memory_peak_note(euid: int | None = None) -> str:
    """Why the CPU has no DRAM peak, for this user: root could read the DIMM layout; others cannot."""
    if euid is None:
        euid = os.geteuid() if hasattr(os, "geteuid") else -1
    if euid == 0:
        return ("unknown: DRAM peak = channels x MT/s x 8 B needs the DIMM layout (dmidecode -t memory, which "
                "you can run as root), which tensor-tutor does not read; compare with the measured triad instead")
    return ("unknown: DRAM peak = channels x MT/s x 8 B needs the DIMM layout, which only root can read "
            "(dmidecode); compare with the measured triad instead")


CPU_MEMORY_PEAK_NOTE = cpu_memory_peak_note()
_DEVICE = re.compile(r"(cpu|mps|cuda)(?::(\d+))?")


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")


def _parse_device(device: str) -> tuple[str, int]:
    match = _DEVICE.fullmatch(device.strip().lower()) if isinstance(device, str) else None
    if not match:
        raise UserError(f"unknown device {device!r}: use 'cpu', 'cuda:N' or 'mps'")
    return match.group(1), int(match.group(2) or 0)


def _strtoul(entry: str) -> int:
    """The number an entry starts with, as CUDA's strtoul reads it ('1gpu' is 1); -1 for none or negative."""
    digits = next((i for i, c in enumerate(entry) if not (c.isdigit() or (i == 0 and c in "+-"))), len(entry))
    try:
        return int(entry[:digits]) if digits else -1
    except ValueError:  # a bare sign
        return -1


def _cuda_units(gpu: GpuInfo) -> list[GpuInfo]:
    """What CUDA enumerates for one physical GPU: the GPU, or its MIG devices when MIG is on."""
    return list(gpu.mig_devices) if gpu.mig_enabled else [gpu]


def _by_uuid_prefix(prefix: str, candidates: list[GpuInfo]) -> GpuInfo | None:
    """The one candidate whose UUID starts with `prefix`; None when none or several do (ambiguous)."""
    found = [gpu for gpu in candidates if gpu.uuid and gpu.uuid.lower().startswith(prefix.lower())]
    return found[0] if len(found) == 1 else None


def _visible_entry(entry: str, gpus: list[GpuInfo]) -> list[GpuInfo] | None:
    """What one CUDA_VISIBLE_DEVICES entry selects, None when it is invalid."""
    if entry.upper().startswith("MIG-GPU-"):
        # The R450-R465 form MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>.
        parent_uuid, _, rest = entry[4:].partition("/")
        parent = _by_uuid_prefix(parent_uuid, gpus)
        instance = _strtoul(rest.partition("/")[0])
        match = [m for m in (parent.mig_devices if parent else ()) if m.gpu_instance_id == instance]
        return match[:1] or None
    if entry.upper().startswith("MIG-"):
        found = _by_uuid_prefix(entry, [mig for gpu in gpus for mig in gpu.mig_devices])
        return [found] if found else None
    if entry.upper().startswith("GPU-"):
        found = _by_uuid_prefix(entry, gpus)
        return _cuda_units(found) if found else None
    number = _strtoul(entry)
    return _cuda_units(gpus[number]) if 0 <= number < len(gpus) else None


def cuda_devices(gpus: list[GpuInfo], visible: str | None) -> list[GpuInfo]:
    """The GPUs (or MIG devices) CUDA numbers cuda:0, cuda:1, ... in that order, from NVML's list.

    CUDA_VISIBLE_DEVICES as the CUDA C++ Programming Guide ("CUDA Environment Variables") defines it:
    a comma-separated list of indices or UUIDs (GPU-..., MIG-..., or an unambiguous prefix);
    the devices are enumerated in the order given, and an invalid entry hides it and everything after
    it ("0,2,-1,1" is 0 and 2). A repeated device yields no device at all, as PyTorch's
    torch.cuda._parse_visible_devices mirrors the driver ("1,1" is none). Unset: every GPU in NVML
    (PCI) order, a MIG-enabled GPU contributing its MIG devices (MIG User Guide, "CUDA Device
    Enumeration"); this is CUDA's order for identical GPUs or CUDA_DEVICE_ORDER=PCI_BUS_ID, not
    necessarily under the default FASTEST_FIRST on mixed models: Machine.gpu_for prefers torch's UUID.
    """
    if visible is None:
        return [unit for gpu in gpus for unit in _cuda_units(gpu)]
    chosen: list[GpuInfo] = []
    for entry in visible.split(","):
        selected = _visible_entry(entry.strip(), gpus)
        if selected is None:
            break
        if any(any(unit is seen for seen in chosen) for unit in selected):
            return []
        chosen.extend(selected)
    return chosen


def _bare_uuid(uuid: str) -> str:
    text = str(uuid).strip().lower()
    for prefix in ("gpu-", "mig-"):
        if text.startswith(prefix):
            return text[len(prefix):]
    return text


def gpu_for_cuda_index(cuda_index: int, gpus: list[GpuInfo], visible: str | None, *,
                       torch_uuid: str | None = None) -> GpuInfo | None:
    """The NVML GPU (or MIG device) that torch calls cuda:N: the one function every caller uses.

    With `torch_uuid` (torch.cuda.get_device_properties(N).uuid) the match is by UUID, which is
    exact whatever CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER say; without it, CUDA's own parsing
    of CUDA_VISIBLE_DEVICES over NVML's list (cuda_devices)."""
    if torch_uuid:
        wanted = _bare_uuid(torch_uuid)
        units = [unit for gpu in gpus for unit in (gpu, *gpu.mig_devices)]
        found = next((unit for unit in units if unit.uuid and _bare_uuid(unit.uuid) == wanted), None)
        if found is not None:
            return found
    units = cuda_devices(gpus, visible)
    return units[cuda_index] if 0 <= cuda_index < len(units) else None


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

    def gpu_for(self, device: str, *, torch_uuid: str | None = None) -> GpuInfo | None:
        """The NVML GPU (or MIG device) behind a torch device name ('cuda:1'), None if there is none.
        Pass torch's UUID for the device where torch is loaded (tutor.hardware.torch_devices.torch_uuid)."""
        kind, index = _parse_device(device)
        if kind != "cuda":
            return None
        return gpu_for_cuda_index(index, self.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), torch_uuid=torch_uuid)

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
        gpu = self.gpu_for(device)
        spec = gpu.spec if gpu is not None else None
        peak = spec.peak_tflops(dtype) if spec is not None else None
        share = gpu.compute_share if gpu is not None else None
        return peak * share if peak is not None and share is not None else None

    def peak_memory_gbps(self, device: str) -> float | None:
        """Peak memory bandwidth in GB/s (1e9); None for the CPU (see CPU_MEMORY_PEAK_NOTE) and unknown GPUs."""
        kind, _ = _parse_device(device)
        if kind != "cuda":
            return None
        gpu = self.gpu_for(device)
        spec = gpu.spec if gpu is not None else None
        share = gpu.memory_share if gpu is not None else None
        return spec.bandwidth_gbps * share if spec is not None and share is not None else None

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
        if gpu.is_mig:
            # a share is known only with the parent's SM count (mig_compute_share)
            full = spec.derivation.sm_count if spec.derivation is not None else None
            text = (f"MIG device {gpu.name}: {gpu.sm_count} SMs of {full} x the {text}"
                    if gpu.compute_share is not None and full is not None else f"MIG device {gpu.name}: its SM count is unknown, so no share of "
                    f"the {spec.name} peak applies")
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
        if spec is None:
            return f"{UNKNOWN_GPU} ({gpu.name})"
        if gpu.is_mig:
            return f"MIG device {gpu.name}: its share of the {spec.name} memory x the datasheet: {spec.source}"
        return f"{spec.name} datasheet: {spec.source}"

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
        data["mig_devices"] = [Machine._gpu_json(mig) for mig in gpu.mig_devices]
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
