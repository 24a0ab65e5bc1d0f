"""NVIDIA GPUs through NVML (package nvidia-ml-py, import name pynvml), imported lazily.

Every failure is a displayable state, after nvitop's api/libnvml.py: a field NVML cannot give
is None with a reason ("N/A: not supported"); a machine without the library or the driver gets
an `NvmlStatus` that says so. Nothing here raises.
"""

from __future__ import annotations

import ctypes
import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from tutor.hardware.specs import GpuSpec, match_gpu_spec

# Bits of nvmlClocksEventReasons (formerly ClocksThrottleReasons), NVML API reference.
CLOCK_EVENT_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "idle"),
    (0x002, "application clocks setting"),
    (0x004, "software power cap"),
    (0x008, "hardware slowdown"),
    (0x010, "sync boost"),
    (0x020, "software thermal slowdown"),
    (0x040, "hardware thermal slowdown"),
    (0x080, "hardware power brake slowdown"),
    (0x100, "display clock setting"),
    # Named only in the deprecated throttle-reasons list (nvml.h nvmlClocksThrottleReasonBoardLimit,
    # nvmlClocksThrottleReasonReliability), still reported by drivers that lack the clock-event query.
    (0x200, "board limit"),
    (0x400, "reliability"),
)

# NVML error codes (nvml.h) that get a plain-words reason.
_NOT_SUPPORTED, _NO_PERMISSION, _DRIVER_NOT_LOADED, _LIBRARY_NOT_FOUND, _FUNCTION_NOT_FOUND = 3, 4, 9, 12, 13


@dataclass(frozen=True)
class NvmlStatus:
    """Whether NVML answered, and if not, why (shown to the user as is)."""

    available: bool
    reason: str | None
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    nvml_version: str | None = None


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU (NVML gives host PIDs, even inside a container)."""

    pid: int
    used_memory_bytes: int | None


@dataclass(frozen=True)
class GpuInfo:
    """One NVIDIA GPU as NVML describes it. A None field has its reason in `unavailable`."""

    index: int
    name: str
    uuid: str | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    sm_clock_mhz: int | None = None
    sm_clock_max_mhz: int | None = None
    memory_clock_mhz: int | None = None
    memory_clock_max_mhz: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    temperature_c: int | None = None
    utilization_gpu_pct: int | None = None
    utilization_memory_pct: int | None = None
    pcie_generation: int | None = None
    pcie_generation_max: int | None = None
    pcie_width: int | None = None
    pcie_width_max: int | None = None
    compute_capability: tuple[int, int] | None = None
    clock_event_reasons: tuple[str, ...] | None = None
    processes: tuple[GpuProcess, ...] | None = None
    unavailable: dict[str, str] = field(default_factory=dict)
    mig_enabled: bool | None = None        # MIG mode of a physical GPU; None where NVML has no MIG (pre-Ampere)
    mig_devices: tuple["GpuInfo", ...] = ()  # its MIG devices, in NVML's MIG index order
    parent_name: str | None = None         # set on a MIG device: the GPU it is a slice of
    parent_memory_total_bytes: int | None = None
    mig_index: int | None = None
    gpu_instance_id: int | None = None
    sm_count: int | None = None            # a MIG device's streaming multiprocessors (nvmlDeviceGetAttributes)

    @property
    def is_mig(self) -> bool:
        return self.parent_name is not None

    @property
    def spec(self) -> GpuSpec | None:
        """The dense datasheet entry for this GPU (a MIG device: its parent's), None when not a known SKU."""
        return match_gpu_spec(self.parent_name or self.name)

    @property
    def compute_share(self) -> float | None:
        """The fraction of the parent's compute peak this device has: 1 for a whole GPU, see mig_compute_share."""
        if not self.is_mig:
            return 1.0
        spec = self.spec
        full = spec.derivation.sm_count if spec is not None and spec.derivation is not None else None
        return mig_compute_share(self.sm_count, full)

    @property
    def memory_share(self) -> float | None:
        """The fraction of the parent's memory bandwidth this device has: 1 for a whole GPU, see mig_memory_share."""
        if not self.is_mig:
            return 1.0
        return mig_memory_share(self.memory_total_bytes, self.parent_memory_total_bytes)


def mig_compute_share(slice_sms: int | None, full_sms: int | None) -> float | None:
    """A MIG device's share of its GPU's dense peak: its SMs over the full chip's SMs.

    NVIDIA MIG User Guide, "Terminology": a GPU instance's compute slices are groups of SMs and each
    compute instance owns its SMs outright, so the tensor-core peak scales with the SM count
    (a 1g slice of an A100 has 14 of 108 SMs: 13 %, not 100 %). None when either count is unknown."""
    if not slice_sms or not full_sms:
        return None
    return min(slice_sms / full_sms, 1.0)


def mig_memory_share(slice_bytes: int | None, full_bytes: int | None) -> float | None:
    """A MIG device's share of its GPU's memory bandwidth: its memory over the GPU's memory.

    NVIDIA MIG User Guide, "Terminology": a memory slice is 1/8 of the GPU memory together with the
    memory controllers and L2 slices in front of it, so bandwidth goes with the memory a GPU instance
    owns. None when either size is unknown."""
    if not slice_bytes or not full_bytes:
        return None
    return min(slice_bytes / full_bytes, 1.0)


def decode_clock_event_reasons(mask: int) -> tuple[str, ...]:
    """The clock-event ("throttle") bitmask in words; () when the clocks are not held back."""
    words = [word for bit, word in CLOCK_EVENT_REASONS if mask & bit]
    known = 0
    for bit, _ in CLOCK_EVENT_REASONS:
        known |= bit
    if mask & ~known:
        words.append(f"other ({mask & ~known:#x})")
    return tuple(words)


def _error_reason(error: BaseException) -> str:
    if type(error).__name__ == "NVMLLibraryMismatchError":  # not an NVMLError: an unversioned symbol is missing
        return "N/A: the driver is older than this query (nvidia-ml-py/driver mismatch)"
    code = getattr(error, "value", None)
    if code == _NOT_SUPPORTED:
        return "N/A: not supported"
    if code == _NO_PERMISSION:
        return "N/A: insufficient permissions"
    if code == _FUNCTION_NOT_FOUND:
        return "N/A: the driver is older than this query (nvidia-ml-py/driver mismatch)"
    return f"N/A: NVML error: {error}"


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def nvml_errors(pynvml: ModuleType) -> tuple[type[BaseException], ...]:
    """What an nvidia-ml-py call raises when the driver cannot answer: NVMLError (and its per-code
    subclasses), NVMLLibraryMismatchError (12.535+: an unversioned symbol the driver lacks),
    ctypes.ArgumentError (a wrapper called with a handle of the wrong kind), UnicodeDecodeError (a
    driver string that is not UTF-8) and OSError (the library vanished). Anything else is a bug."""
    errors: list[type[BaseException]] = [UnicodeDecodeError, OSError, ctypes.ArgumentError]
    for name in ("NVMLError", "NVMLLibraryMismatchError"):
        error_type = getattr(pynvml, name, None)
        if isinstance(error_type, type) and issubclass(error_type, BaseException):
            errors.append(error_type)
    return tuple(errors)


class NvmlQuery:
    """The one way this project calls NVML (after nvitop's libnvml): calls a function by name; a
    failure stores the reason to display under the field's name and returns None. Never raises for
    what the driver cannot answer (see nvml_errors)."""

    def __init__(self, pynvml: ModuleType) -> None:
        self.pynvml = pynvml
        self.unavailable: dict[str, str] = {}
        self.codes: dict[str, int | None] = {}  # the NVML error code behind each unavailable field
        self._errors = nvml_errors(pynvml)

    def __call__(self, field_name: str, function: str, *args: Any) -> Any:
        func: Callable[..., Any] | None = getattr(self.pynvml, function, None)
        if func is None:
            self.unavailable[field_name] = f"N/A: this nvidia-ml-py has no {function}"
            return None
        try:
            return func(*args)
        except self._errors as error:
            if isinstance(error, (UnicodeDecodeError, OSError, ctypes.ArgumentError)):
                self.unavailable[field_name] = f"N/A: {type(error).__name__}: {error}"
            else:
                self.unavailable[field_name] = _error_reason(error)
                self.codes[field_name] = getattr(error, "value", _FUNCTION_NOT_FOUND)
            return None


def import_pynvml() -> tuple[ModuleType | None, str | None]:
    """The pynvml module, or None and why (not installed, shadowed by the deprecated package)."""
    try:
        module = importlib.import_module("pynvml")
    except ImportError:
        return None, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
    except (OSError, SyntaxError, AttributeError) as error:  # a broken or foreign install
        return None, f"pynvml failed to import: {type(error).__name__}: {error}"
    if not hasattr(module, "nvmlInit"):
        return None, "the pynvml module found is not nvidia-ml-py (reinstall nvidia-ml-py)"
    return module, None


def init_nvml(pynvml: ModuleType) -> str | None:
    """nvmlInit; None on success, else the line to show."""
    try:
        pynvml.nvmlInit()
    except nvml_errors(pynvml) as error:
        code = getattr(error, "value", None)
        if code in (_LIBRARY_NOT_FOUND, _DRIVER_NOT_LOADED):
            return f"no NVIDIA driver found (NVML: {error})"
        if code == _NO_PERMISSION:
            return f"NVML refused access (NVML: {error})"
        return f"NVML unavailable: {type(error).__name__}: {error}"
    return None


def open_nvml() -> tuple[ModuleType | None, str | None]:
    """nvidia-ml-py imported and initialised: (module, None), or (None, the line to show). The
    caller ends the session with shutdown_nvml(module)."""
    pynvml, reason = import_pynvml()
    if pynvml is None:
        return None, reason
    reason = init_nvml(pynvml)
    return (None, reason) if reason is not None else (pynvml, None)


def shutdown_nvml(pynvml: ModuleType) -> None:
    try:
        pynvml.nvmlShutdown()
    except nvml_errors(pynvml):  # shutting down a half-initialised library must not hide the result
        pass


def _cuda_version(value: Any) -> str | None:
    if not isinstance(value, int) or value <= 0:
        return None
    return f"{value // 1000}.{value % 1000 // 10}"


def clock_event_mask(query: NvmlQuery, handle: Any) -> int | None:
    """The clock-event bitmask; the deprecated throttle-reasons call where the driver predates R535.

    The binding always has both wrappers: what an older driver lacks is the C symbol
    nvmlDeviceGetCurrentClocksEventReasons, which surfaces as NVML_ERROR_FUNCTION_NOT_FOUND."""
    mask = query("clock_event_reasons", "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if mask is None and query.codes.get("clock_event_reasons") in (None, _FUNCTION_NOT_FOUND):
        query.unavailable.pop("clock_event_reasons", None)
        mask = query("clock_event_reasons", "nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    return mask


def _read_mig_devices(pynvml: ModuleType, query: NvmlQuery, handle: Any, index: int, parent_name: str,
                      parent_total: int | None) -> tuple[bool | None, tuple[GpuInfo, ...]]:
    """MIG mode and the MIG devices of one GPU (nvmlDeviceGetMigMode, nvmlDeviceGetMigDeviceHandleByIndex)."""
    mode = query("mig_mode", "nvmlDeviceGetMigMode", handle)
    if not isinstance(mode, (list, tuple)) or not mode:
        query.unavailable.pop("mig_mode", None)  # pre-Ampere, or a driver without MIG: not a missing field
        return None, ()
    if mode[0] != getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1):
        return False, ()
    slots = query("mig_devices", "nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    devices = []
    for slot in range(int(slots)):
        mig_query = NvmlQuery(pynvml)
        mig = mig_query("handle", "nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)
        if mig is None:
            continue  # an empty slot answers NVML_ERROR_NOT_FOUND
        devices.append(_read_mig(pynvml, mig, index, slot, parent_name, parent_total))
    return True, tuple(devices)


def _read_mig(pynvml: ModuleType, handle: Any, index: int, slot: int, parent_name: str,
              parent_total: int | None) -> GpuInfo:
    query = NvmlQuery(pynvml)
    name = query("name", "nvmlDeviceGetName", handle)
    uuid = query("uuid", "nvmlDeviceGetUUID", handle)
    memory = query("memory", "nvmlDeviceGetMemoryInfo", handle)
    attributes = query("sm_count", "nvmlDeviceGetAttributes", handle)
    instance = query("gpu_instance_id", "nvmlDeviceGetGpuInstanceId", handle)
    total, used, free = (memory.total, memory.used, memory.free) if memory is not None else (None, None, None)
    return GpuInfo(
        index=index, name=_text(name) if name is not None else f"{parent_name} MIG {slot}",
        uuid=_text(uuid) if uuid is not None else None,
        memory_total_bytes=total, memory_used_bytes=used, memory_free_bytes=free,
        parent_name=parent_name, parent_memory_total_bytes=parent_total, mig_index=slot,
        gpu_instance_id=int(instance) if instance is not None else None,
        sm_count=int(attributes.multiprocessorCount) if attributes is not None else None,
        unavailable=query.unavailable,
    )


def _read_gpu(pynvml: ModuleType, index: int) -> GpuInfo:
    query = NvmlQuery(pynvml)
    handle = query("handle", "nvmlDeviceGetHandleByIndex", index)
    if handle is None:
        reason = query.unavailable.get("handle", "N/A")
        return GpuInfo(index, f"GPU {index} (unreadable: {reason})", unavailable=query.unavailable)
    name = query("name", "nvmlDeviceGetName", handle)
    uuid = query("uuid", "nvmlDeviceGetUUID", handle)
    memory = query("memory", "nvmlDeviceGetMemoryInfo", handle)
    sm_type, mem_type = getattr(pynvml, "NVML_CLOCK_SM", 1), getattr(pynvml, "NVML_CLOCK_MEM", 2)
    power_mw = query("power_w", "nvmlDeviceGetPowerUsage", handle)
    limit_mw = query("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", handle)
    utilization = query("utilization", "nvmlDeviceGetUtilizationRates", handle)
    capability = query("compute_capability", "nvmlDeviceGetCudaComputeCapability", handle)
    mask = clock_event_mask(query, handle)
    raw_processes = query("processes", "nvmlDeviceGetComputeRunningProcesses", handle)
    processes = None
    if raw_processes is not None:
        processes = tuple(
            GpuProcess(int(getattr(p, "pid", -1)),
                       mem if isinstance(mem := getattr(p, "usedGpuMemory", None), int) else None)
            for p in raw_processes
        )
    memory_fields: tuple[int | None, ...] = (None, None, None)
    if memory is not None:
        memory_fields = tuple(getattr(memory, attr, None) for attr in ("total", "used", "free"))
        if not memory_fields[0]:
            # Unified-memory parts (GB10, Jetson) report 0 or NotSupported (nvitop handles the same).
            query.unavailable["memory"] = "N/A: no dedicated GPU memory reported (unified memory?)"
            memory_fields = (None, None, None)
    utilization_fields = (None, None)
    if utilization is not None:
        utilization_fields = (getattr(utilization, "gpu", None), getattr(utilization, "memory", None))
    capability_field = None
    if isinstance(capability, tuple) and len(capability) == 2:
        capability_field = (int(capability[0]), int(capability[1]))
    gpu_name = _text(name) if name is not None else f"GPU {index} (name unreadable)"
    mig_enabled, mig_devices = _read_mig_devices(pynvml, query, handle, index, gpu_name, memory_fields[0])
    return GpuInfo(
        index=index,
        name=gpu_name,
        uuid=_text(uuid) if uuid is not None else None,
        memory_total_bytes=memory_fields[0],
        memory_used_bytes=memory_fields[1],
        memory_free_bytes=memory_fields[2],
        sm_clock_mhz=query("sm_clock_mhz", "nvmlDeviceGetClockInfo", handle, sm_type),
        sm_clock_max_mhz=query("sm_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", handle, sm_type),
        memory_clock_mhz=query("memory_clock_mhz", "nvmlDeviceGetClockInfo", handle, mem_type),
        memory_clock_max_mhz=query("memory_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", handle, mem_type),
        power_w=power_mw / 1000 if power_mw is not None else None,
        power_limit_w=limit_mw / 1000 if limit_mw is not None else None,
        temperature_c=query("temperature_c", "nvmlDeviceGetTemperature", handle,
                            getattr(pynvml, "NVML_TEMPERATURE_GPU", 0)),
        utilization_gpu_pct=utilization_fields[0],
        utilization_memory_pct=utilization_fields[1],
        pcie_generation=query("pcie_generation", "nvmlDeviceGetCurrPcieLinkGeneration", handle),
        pcie_generation_max=query("pcie_generation_max", "nvmlDeviceGetMaxPcieLinkGeneration", handle),
        pcie_width=query("pcie_width", "nvmlDeviceGetCurrPcieLinkWidth", handle),
        pcie_width_max=query("pcie_width_max", "nvmlDeviceGetMaxPcieLinkWidth", handle),
        compute_capability=capability_field,
        clock_event_reasons=decode_clock_event_reasons(int(mask)) if mask is not None else None,
        processes=processes,
        unavailable=query.unavailable,
        mig_enabled=mig_enabled,
        mig_devices=mig_devices,
    )


def detect_nvidia() -> tuple[NvmlStatus, list[GpuInfo]]:
    """NVML's view of this machine: status plus one GpuInfo per GPU. Never raises."""
    pynvml, reason = open_nvml()
    if pynvml is None:
        return NvmlStatus(False, reason), []
    try:
        query = NvmlQuery(pynvml)
        driver = query("driver", "nvmlSystemGetDriverVersion")
        cuda = query("cuda", "nvmlSystemGetCudaDriverVersion_v2") or query("cuda", "nvmlSystemGetCudaDriverVersion")
        nvml_version = query("nvml", "nvmlSystemGetNVMLVersion")
        count = query("count", "nvmlDeviceGetCount")
        if count is None:
            return NvmlStatus(False, f"NVML could not count GPUs ({query.unavailable['count']})",
                              _text(driver) if driver else None, _cuda_version(cuda)), []
        gpus = [_read_gpu(pynvml, index) for index in range(int(count))]
        status = NvmlStatus(True, None if gpus else "NVML found no GPU",
                            _text(driver) if driver is not None else None, _cuda_version(cuda),
                            _text(nvml_version) if nvml_version is not None else None)
        return status, gpus
    except (TypeError, ValueError) as error:  # a count or struct that is not what nvml.h says
        return NvmlStatus(False, f"NVML failed: {type(error).__name__}: {error}"), []
    finally:
        shutdown_nvml(pynvml)
