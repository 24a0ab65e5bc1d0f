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
    uuid: str | None = None  # CUDA's device UUID, what NVML's UUID is matched against


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


def torch_uuid(device: str) -> str | None:
    """torch.cuda.get_device_properties(N).uuid as text, for a device torch already uses; None for a
    CPU device, a torch without CUDA or without that field (torch < 2.1)."""
    import torch

    index = torch.device(device).index
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return None
    try:
        uuid = getattr(torch.cuda.get_device_properties(index or 0), "uuid", None)
    except (RuntimeError, AssertionError):  # a device that vanished (CUDA error / "Invalid device id"):
        # the caller falls back to CUDA_VISIBLE_DEVICES
        return None
    return str(uuid) if uuid is not None else None


def accelerator_agreement(nvml_gpu_count: int, nvml_reason: str | None, view: TorchView) -> str | None:
    """One line when NVML and torch disagree about this machine's GPUs, saying why; None when they agree.

    NVML talks to the driver, torch to its own CUDA build: a CPU-only torch wheel beside a working
    driver sees no GPU, and a CUDA torch without the driver's NVML sees GPUs NVML does not."""
    cuda = [d for d in view.devices if d.backend in ("cuda", "rocm")]
    if nvml_gpu_count and not cuda:
        if view.error and view.torch_version is None:
            return f"NVML sees {nvml_gpu_count} GPU(s) but torch could not be imported ({view.error}): measured on the CPU"
        if view.cuda_version is None and view.hip_version is None:
            return (f"NVML sees {nvml_gpu_count} GPU(s) but this torch ({view.torch_version}) is a CPU-only build: "
                    "measurements run on the CPU; install a CUDA build of torch to use the GPU")
        return (f"NVML sees {nvml_gpu_count} GPU(s) but torch {view.torch_version} (CUDA {view.cuda_version}) "
                "cannot use them (driver too old for this CUDA build, or CUDA_VISIBLE_DEVICES hides them): "
                "measurements run on the CPU")
    if cuda and not nvml_gpu_count and not view.hip_version:
        return (f"torch sees {len(cuda)} GPU(s) but NVML does not ({nvml_reason or 'no GPU listed'}): "
                "measured only, no live readings or datasheet peaks")
    return None


def detect_torch_devices() -> TorchView:
    """Import torch (seconds) and list its devices. Never raises."""
    try:
        import torch
    except (ImportError, OSError) as error:  # not installed, or a broken build (a shared library missing)
        return TorchView(None, None, None, None, (), f"torch unavailable: {type(error).__name__}: {error}")
    devices: list[TorchDevice] = []
    hip = getattr(torch.version, "hip", None)
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except (AttributeError, RuntimeError):  # torch < 2.1 has no get_cpu_capability
        capability = None
    devices.append(TorchDevice("cpu", "cpu", "cpu", None, None, None, None))
    try:
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        for index in range(count):
            props = torch.cuda.get_device_properties(index)
            sm_count = getattr(props, "multi_processor_count", None)
            devices.append(TorchDevice(
                f"cuda:{index}", "rocm" if hip else "cuda", props.name, int(props.total_memory), sm_count,
                (props.major, props.minor), _spec_check(props.name, sm_count),
                str(props.uuid) if getattr(props, "uuid", None) is not None else None))
        mps = getattr(torch.backends, "mps", None)
        if mps is not None and mps.is_available():
            devices.append(TorchDevice("mps", "mps", "Apple GPU (MPS)", None, None, None, None))
    except (RuntimeError, AssertionError) as error:  # CUDA init errors; "Invalid device id" for a vanished one
        return TorchView(torch.__version__, torch.version.cuda, hip, capability, tuple(devices),
                         f"torch device query failed: {type(error).__name__}: {error}")
    return TorchView(torch.__version__, torch.version.cuda, hip, capability, tuple(devices))
