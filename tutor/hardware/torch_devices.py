"""torch's view of the accelerators (CUDA, ROCm, MPS). Imports torch inside the function only.

`tensor-tutor env` stays fast and torch-free by default; `env --torch` calls this explicitly.
"""

from __future__ import annotations

from dataclasses import dataclass

from tutor.hardware.specs import match_gpu_spec


@dataclass(frozen=True)
class TorchDevice:
    """One device torch can run on."""

    device: str  # "cuda:0", "mps", "cpu"
    backend: str  # "cuda", "rocm", "mps", "cpu"
    name: str
    total_memory_bytes: int | None
    sm_count: int | None
    compute_capability: tuple[int, int] | None
    spec_check: str | None  # the SM count against the spec table's, when both are known


@dataclass(frozen=True)
class TorchView:
    """torch's version, its build, and its devices; `error` says why torch could not be asked."""

    torch_version: str | None
    cuda_version: str | None
    hip_version: str | None
    cpu_capability: str | None
    devices: tuple[TorchDevice, ...]
    error: str | None = None


def _spec_check(name: str, sm_count: int | None) -> str | None:
    spec = match_gpu_spec(name)
    if spec is None or spec.derivation is None or sm_count is None:
        return None
    if sm_count == spec.derivation.sm_count:
        return f"{sm_count} SMs, as in the {spec.name} spec"
    return (f"{sm_count} SMs but the {spec.name} spec has {spec.derivation.sm_count}: a different SKU "
            "or a MIG slice; its peak does not apply")


def detect_torch_devices() -> TorchView:
    """Import torch (seconds) and list its devices. Never raises."""
    try:
        import torch
    except Exception as error:  # not installed, or a broken build
        return TorchView(None, None, None, None, (), f"torch unavailable: {type(error).__name__}: {error}")
    devices: list[TorchDevice] = []
    hip = getattr(torch.version, "hip", None)
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:
        capability = None
    devices.append(TorchDevice("cpu", "cpu", "cpu", None, None, None, None))
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        for index in range(count):
            props = torch.cuda.get_device_properties(index)
            sm_count = getattr(props, "multi_processor_count", None)
            devices.append(TorchDevice(
                f"cuda:{index}", "rocm" if hip else "cuda", props.name, int(props.total_memory), sm_count,
                (props.major, props.minor), _spec_check(props.name, sm_count)))
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            devices.append(TorchDevice("mps", "mps", "Apple GPU (MPS)", None, None, None, None))
    except Exception as error:
        return TorchView(torch.__version__, torch.version.cuda, hip, capability, tuple(devices),
                         f"torch device query failed: {type(error).__name__}: {error}")
    return TorchView(torch.__version__, torch.version.cuda, hip, capability, tuple(devices))
