"""What a benchmark needs to know about the machine it runs on, and the environment header that
makes a result comparable months later (mamf-finder prints the same: versions, device, flags).

Machine detection itself is tutor.hardware's job; it is imported lazily so this module (and the
notebook reader) load without torch.
"""

from __future__ import annotations

import datetime as _dt
import platform
import sys
from typing import Any

from tutor.errors import UserError
from tutor.hardware.machine import Machine

# STREAM's rule needs the last-level cache; when the machine does not report it we assume 32 MiB
# (a large desktop L3) and say so in the output.
FALLBACK_LLC_BYTES = 32 * 2**20
BENCHMARK_VERSION = 1


def load_machine() -> Machine:
    """The detected Machine (tutor.hardware.detect_machine)."""
    from tutor.hardware import detect_machine

    return detect_machine()


def cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(text: str | None) -> str:
    """'cpu', 'cuda' or 'cuda:N' -> a canonical device name; None -> the first GPU, else 'cpu'.

    A GPU this machine does not have is a UserError naming what exists.
    """
    count = cuda_device_count()
    if text is None:
        return "cuda:0" if count else "cpu"
    name = text.strip().lower()
    if name == "cpu":
        return "cpu"
    if name == "cuda":
        name = "cuda:0"
    if name.startswith("cuda:") and name[5:].isdigit():
        index = int(name[5:])
        if index < count:
            return f"cuda:{index}"
        present = f"cuda:0..cuda:{count - 1}" if count else "no CUDA device"
        raise UserError(f"device {text} is not present: this machine has {present} (try --device cpu)")
    raise UserError(f"unknown device {text!r} (use cpu, cuda or cuda:N)")


def cpu_llc_bytes(machine: Machine) -> tuple[int, str]:
    """Last-level cache size in bytes from the machine's CPU info, and where it came from."""
    value = machine.cpu.last_level_cache_bytes
    if value is not None and value > 0:
        return value, "last-level cache reported by the machine"
    return FALLBACK_LLC_BYTES, "last-level cache unknown: assumed 32 MiB"


def cpu_flags(machine: Machine) -> frozenset[str]:
    """The CPU's ISA flags as the machine reports them (empty when unknown)."""
    return frozenset(flag.lower() for flag in machine.cpu.flags)


def peak_tflops(machine: Machine, device: str, dtype: str) -> tuple[float | None, str]:
    """Theoretical dense peak (TFLOP/s) of `dtype` on `device` and its source, None when unknown."""
    peak = machine.peak_tflops(device, dtype)
    return (float(peak) if peak else None), machine.peak_source(device, dtype)


def peak_memory_gbps(machine: Machine, device: str) -> float | None:
    peak = machine.peak_memory_gbps(device)
    return float(peak) if peak else None


def float32_matmul_precision() -> str:
    """torch's fp32 matmul setting in words; never raises (it is read after the suite has run).

    PyTorch 2.9 added per-backend `torch.backends.cuda.matmul.fp32_precision` ("ieee"/"tf32"); once it
    is set, the legacy torch.get_float32_matmul_precision() raises RuntimeError ("mix of the legacy
    and new APIs"), so the new attribute is read instead."""
    import torch

    try:
        return str(torch.get_float32_matmul_precision())
    except RuntimeError:
        pass
    matmul = getattr(getattr(torch.backends, "cuda", None), "matmul", None)
    value = getattr(matmul, "fp32_precision", None)
    return f"cuda.matmul.fp32_precision={value}" if value is not None else "unknown"


def accelerator_note(machine: Machine) -> str | None:
    """Why NVML and torch disagree about this machine's GPUs, if they do (a CPU wheel beside a driver)."""
    from tutor.hardware.torch_devices import accelerator_agreement, detect_torch_devices

    return accelerator_agreement(len(machine.gpus), machine.nvml.reason, detect_torch_devices())


def torch_environment() -> dict[str, Any]:
    """torch-side facts that change results: versions, threads, dispatch level, TF32 setting."""
    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "float32_matmul_precision": float32_matmul_precision(),
        "cuda_runtime": torch.version.cuda,
        "hip_runtime": getattr(torch.version, "hip", None),
    }
    try:
        import numpy

        info["numpy"] = numpy.__version__
    except ImportError:
        info["numpy"] = None
    return info


def environment_header(machine: Machine, *, command: str) -> dict[str, Any]:
    """The header stored with every run: date, command, versions, threads and the machine."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "benchmark_version": BENCHMARK_VERSION,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        **torch_environment(),
        "accelerator_note": accelerator_note(machine),
        "machine": machine.to_json(),
    }
