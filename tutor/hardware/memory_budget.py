"""The memory one device offers a model right now: what the fit check, its lab and the app compare with.

A GPU offers its free memory (NVML), not the marketing capacity: other processes, MIG slices and
the CUDA reservation all count (reference memory-and-models.md §5 item 2). A CPU-only machine
offers its available RAM (psutil). A size the user types stands for a card they do not have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tutor.errors import UserError
from tutor.theory.units import parse_bytes


@dataclass(frozen=True)
class DeviceBudget:
    """The memory one device offers the model, and where that figure comes from."""

    name: str
    kind: str              # "cuda", "cpu" or "given"
    capacity: int | None   # bytes available to the model; None when unknown
    source: str
    gpu: bool

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "capacity_bytes": self.capacity, "source": self.source}


def device_budget(spec: str | None = None, machine: Any = None) -> DeviceBudget:
    """The device to fit on: a size ('24GiB'), a GPU index ('0'), 'cpu', or by default this machine's
    first GPU (else its RAM). `machine` defaults to tutor.hardware.detect_machine()."""
    text = spec.strip() if isinstance(spec, str) else None
    if text and not text.isdigit() and text.lower() != "cpu":
        return DeviceBudget(f"a {text} device", "given", parse_bytes(text), "as given", gpu=True)
    if machine is None:
        from tutor.hardware import detect_machine

        machine = detect_machine()
    gpus = list(getattr(machine, "gpus", None) or [])
    if text and text.isdigit():
        index = int(text)
        if not gpus:
            reason = getattr(machine.nvml, "reason", None) or "NVML found no NVIDIA GPU"
            raise UserError(f"no GPU {index} on this machine ({reason}); use --device 24GiB for a card you do not have")
        if index >= len(gpus):
            raise UserError(f"no GPU {index}: this machine has {len(gpus)} (0..{len(gpus) - 1})")
        return gpu_budget(gpus[index])
    if text is None and gpus:
        return gpu_budget(gpus[0])
    cpu = machine.cpu
    name = f"CPU RAM ({cpu.model_name})" if getattr(cpu, "model_name", None) else "CPU RAM"
    return DeviceBudget(name, "cpu", cpu.ram_available_bytes, "available RAM now (psutil)", gpu=False)


def gpu_budget(gpu: Any) -> DeviceBudget:
    """A GPU's free memory now, as NVML reports it."""
    return DeviceBudget(f"GPU {gpu.index}: {gpu.name}", "cuda", gpu.memory_free_bytes, "free memory now (NVML)",
                        gpu=True)
