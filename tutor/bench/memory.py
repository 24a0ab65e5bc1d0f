"""Where this process's memory is, as each layer counts it.

On CUDA, three numbers disagree by design (reference/benchmarking.md §5.3): NVML "used" counts the
whole device (every process, the CUDA context of hundreds of MB, the caching allocator's reserve);
torch "reserved" is what PyTorch's caching allocator holds from the driver; "allocated" is what live
tensors occupy. On a CPU the process resident set size (psutil RSS) is the figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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


def _nvml_memory(index: int) -> tuple[int | None, int | None, str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
            return int(info.used), int(info.total), ""
        finally:
            pynvml.nvmlShutdown()
    except Exception as error:  # no driver, no NVML, unified memory: a state, not a crash
        return None, None, f"NVML unavailable: {type(error).__name__}"


def memory_accounting(device: str = "cpu") -> MemoryAccounting:
    """A snapshot for `device` ('cpu' or 'cuda:N'); torch is imported only for CUDA devices."""
    rss = process_rss_bytes()
    if not device.startswith("cuda"):
        return MemoryAccounting(device=device, process_rss_bytes=rss)
    import torch

    index = torch.device(device).index or 0
    used, total, note = _nvml_memory(index)
    return MemoryAccounting(
        device=device, process_rss_bytes=rss, nvml_used_bytes=used, nvml_total_bytes=total,
        torch_reserved_bytes=int(torch.cuda.memory_reserved(index)),
        torch_allocated_bytes=int(torch.cuda.memory_allocated(index)), note=note,
    )
