"""Where this process's memory is, as each layer counts it.

On CUDA, three numbers disagree by design (PyTorch docs, "Understanding CUDA
Memory Usage"; NVML nvmlDeviceGetMemoryInfo): NVML "used" counts the
whole device (every process, the CUDA context of hundreds of MB, the caching allocator's reserve);
torch "reserved" is what PyTorch's caching allocator holds from the driver; "allocated" is what live
tensors occupy. On a CPU the process resident set size (psutil RSS) is the figure.

What a run may still allocate is here too: the memory available now, the share of it a measurement
(a lab, local ranks) may take, and the bytes one rank holds for a collective case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MEMORY_SHARE = 0.8
"""The share of the memory available now that a measurement may use; the rest is left to the OS
and the other programs."""


@dataclass(frozen=True)
class MemoryAccounting:
    """Bytes as each layer counts them; None where a layer is absent (no GPU, no NVML)."""

    device: str
    process_rss_bytes: int
    nvml_used_bytes: int | None = None
    nvml_total_bytes: int | None = None
    torch_reserved_bytes: int | None = None
    torch_allocated_bytes: int | None = None
    note: str = ""
    kind: str = "memory"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "device": self.device, "process_rss_bytes": self.process_rss_bytes,
            "nvml_used_bytes": self.nvml_used_bytes, "nvml_total_bytes": self.nvml_total_bytes,
            "torch_reserved_bytes": self.torch_reserved_bytes,
            "torch_allocated_bytes": self.torch_allocated_bytes, "note": self.note,
        }


def process_rss_bytes() -> int:
    """Resident set size of this process (psutil)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def _nvml_memory(uuid: str | None) -> tuple[int | None, int | None, str]:
    """NVML's used and total bytes of the GPU (or MIG device) with this UUID."""
    if uuid is None:
        return None, None, "NVML does not list this device (CUDA_VISIBLE_DEVICES or MIG mismatch)"
    from tutor.hardware.nvidia import NvmlQuery, open_nvml, shutdown_nvml

    pynvml, reason = open_nvml()
    if pynvml is None:  # no nvidia-ml-py, no driver: a state, not a crash
        return None, None, reason or "NVML unavailable"
    try:
        query = NvmlQuery(pynvml)
        handle = query("handle", "nvmlDeviceGetHandleByUUID", uuid)
        info = query("memory", "nvmlDeviceGetMemoryInfo", handle) if handle is not None else None
        if info is None or not getattr(info, "total", 0):  # unified-memory parts report 0 or NotSupported
            why = next(iter(query.unavailable.values()), "N/A: no dedicated GPU memory reported (unified memory?)")
            return None, None, f"NVML memory {why}"
        return int(info.used), int(info.total), ""
    finally:
        shutdown_nvml(pynvml)


def nvml_uuid_for(device: str) -> str | None:
    """The NVML UUID of torch's `device`, matched by torch's own UUID (tutor.hardware Machine.gpu_for)."""
    from tutor.hardware import detect_machine
    from tutor.hardware.torch_devices import torch_uuid

    gpu = detect_machine().gpu_for(device, torch_uuid=torch_uuid(device))
    return gpu.uuid if gpu is not None else None


def memory_accounting(device: str = "cpu") -> MemoryAccounting:
    """A snapshot for `device` ('cpu' or 'cuda:N'); torch is imported only for CUDA devices."""
    rss = process_rss_bytes()
    if not device.startswith("cuda"):
        return MemoryAccounting(device=device, process_rss_bytes=rss)
    import torch

    index = torch.device(device).index or 0
    used, total, note = _nvml_memory(nvml_uuid_for(device))
    return MemoryAccounting(
        device=device, process_rss_bytes=rss, nvml_used_bytes=used, nvml_total_bytes=total,
        torch_reserved_bytes=int(torch.cuda.memory_reserved(index)),
        torch_allocated_bytes=int(torch.cuda.memory_allocated(index)), note=note,
    )


def available_memory_bytes(device: str = "cpu") -> int | None:
    """Bytes a lab can allocate on `device` now: psutil's `available` (CPU), the driver's free
    memory (CUDA); None when it cannot be read."""
    if device.startswith("cuda"):
        try:
            import torch

            free, _total = torch.cuda.mem_get_info(torch.device(device))
        except (ImportError, RuntimeError, AssertionError):
            return None
        return int(free)
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def collective_buffer_bytes(size: int, ranks: int) -> int:
    """Bytes one rank holds for one collective case of `size` bytes: the full buffer plus its
    1/ranks shard (all_gather's input, reduce_scatter's output), as tutor.bench.collective
    allocates them (torch.distributed's tensor forms)."""
    return size + size // ranks
