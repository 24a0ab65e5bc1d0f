"""The memory one device offers a model right now: what the fit check, its lab and the app compare with.

A GPU offers its free memory (NVML), not the marketing capacity: other processes, MIG slices and
the CUDA reservation all count (an "80 GB" H100 shows 79.2 GiB to CUDA: vLLM start-up logs). A CPU-only machine
offers its available RAM (psutil). A size the user types, or a card named from the spec table
(tutor.hardware.specs: the total its driver reports), stands for a card they do not have.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from tutor.errors import UserError
from tutor.hardware.machine import Machine, cuda_devices
from tutor.hardware.nvidia import GpuInfo
from tutor.theory.units import parse_bytes

_CUDA_DEVICE = re.compile(r"cuda(?::(\d+))?", re.IGNORECASE)


@dataclass(frozen=True)
class DeviceBudget:
    """The memory one device offers the model, and where that figure comes from."""

    name: str
    kind: str              # "cuda", "cpu", "given" (a typed size) or "spec" (a card from the spec table)
    capacity: int | None   # bytes available to the model; None when unknown
    source: str
    gpu: bool
    source_detail: str = ""  # where a spec-table figure was read (a URL), kept out of the one-line verdict

    def to_json(self) -> dict:
        data = {"name": self.name, "kind": self.kind, "capacity_bytes": self.capacity, "source": self.source}
        if self.source_detail:
            data["source_detail"] = self.source_detail
        return data


def device_budget(spec: str | None = None, machine: Machine | None = None) -> DeviceBudget:
    """The device to fit on: a size ('24GiB'), a card from the spec table ('h100', 'a100-40gb', 'rtx-4090'),
    a GPU index ('0' or 'cuda:0'), 'cpu', or by default this machine's first GPU (else its RAM).
    `machine` defaults to tutor.hardware.detect_machine()."""
    text = spec.strip() if isinstance(spec, str) else None
    if text == "":
        raise UserError("--device is empty: give a GPU index, cpu, a card such as h100, or a size such as 24GiB")
    cuda = _CUDA_DEVICE.fullmatch(text) if text else None
    if text and not cuda and not text.isdigit() and text.lower() != "cpu":
        return given_budget(text)
    if text and text.isdigit():
        card = card_budget(text)  # '4090' is a card; nobody has a GPU index 4090
        if card is not None:
            return card
    if machine is None:
        from tutor.hardware import detect_machine

        machine = detect_machine()
    gpus = machine.gpus
    index = int(cuda.group(1) or 0) if cuda else int(text) if text and text.isdigit() else None
    if index is not None:
        if not gpus:
            reason = machine.nvml.reason or "NVML found no NVIDIA GPU"
            raise UserError(f"no GPU {index} on this machine ({reason}); use --device h100 or --device 24GiB "
                            "for a card you do not have")
        gpu = cuda_gpu(machine, index)
        if gpu is None:
            raise UserError(f"no GPU {index}: {visible_gpus_text(machine, len(gpus))}")
        return gpu_budget(gpu)
    if text is None and gpus:
        gpu = cuda_gpu(machine, 0)
        if gpu is not None:
            return gpu_budget(gpu)
    cpu = machine.cpu
    name = f"CPU RAM ({cpu.model_name})" if cpu.model_name else "CPU RAM"
    return DeviceBudget(name, "cpu", cpu.ram_available_bytes, "available RAM now (psutil)", gpu=False)


def cuda_gpu(machine: Machine, index: int) -> GpuInfo | None:
    """The GPU torch calls cuda:N (machine.gpu_for: CUDA_VISIBLE_DEVICES, MIG and UUIDs respected)."""
    return machine.gpu_for(f"cuda:{index}")


def visible_gpus_text(machine: Machine, count: int) -> str:
    """How many GPUs CUDA sees here, in words, for the error that names a missing one."""
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return f"this machine has {count} (0..{count - 1})"
    seen = len(cuda_devices(list(machine.gpus), visible))
    listed = f"0..{seen - 1}" if seen else "none"
    return f"CUDA_VISIBLE_DEVICES={visible!r} shows CUDA {seen} of this machine's {count} GPUs ({listed})"


def given_budget(text: str) -> DeviceBudget:
    """A card you do not have: a size such as 24GiB or 80GB, or a card named from the spec table."""
    if text[0].isdigit() or text[0] == ".":
        return DeviceBudget(f"a {text} device", "given", parse_bytes(text), "as given", gpu=True)
    card = card_budget(text)
    if card is not None:
        return card
    from tutor.hardware.specs import close_gpu_names

    close = close_gpu_names(text)
    hint = f"close matches: {', '.join(close)}; " if close else ""
    raise UserError(f"unknown GPU or size {text!r}: {hint}`tensor-tutor models --devices` lists the cards, "
                    "or give a size such as 24GiB")


def card_budget(text: str) -> DeviceBudget | None:
    """The total memory of a card from the spec table as its driver reports it, or None for an unknown name."""
    from tutor.hardware.specs import lookup_gpu_spec

    found = lookup_gpu_spec(text)
    if found is None or found[0].memory_bytes is None:
        return None
    from tutor.hardware.specs import DRIVER_MEMORY

    spec, note = found
    source = (f"{spec.key}: the total its driver reports" if spec.key in DRIVER_MEMORY
              else f"{spec.key}: datasheet size, no driver-reported total found")
    if note:
        source = f"{note}; {source}"
    return DeviceBudget(spec.name, "spec", spec.memory_bytes, source, gpu=True, source_detail=spec.memory_source)


def gpu_budget(gpu: GpuInfo) -> DeviceBudget:
    """A GPU's (or MIG device's) free memory now, as NVML reports it."""
    if gpu.parent_name:
        return DeviceBudget(f"GPU {gpu.index} MIG device {gpu.mig_index}: {gpu.name}", "cuda", gpu.memory_free_bytes,
                            "free memory of the MIG device now (NVML)", gpu=True)
    source = "free memory now (NVML)"
    if gpu.memory_free_bytes is None:
        reason = gpu.unavailable.get("memory")
        source = f"NVML gave no free memory ({reason})" if reason else source
    return DeviceBudget(f"GPU {gpu.index}: {gpu.name}", "cuda", gpu.memory_free_bytes, source, gpu=True)
