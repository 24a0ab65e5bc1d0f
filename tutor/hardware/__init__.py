"""What this machine is: CPU (psutil, /proc/cpuinfo), NVIDIA GPUs (NVML), torch devices, peak specs.

Nothing here imports torch at import time; only `tutor.hardware.torch_devices` does, inside a
function, when a caller asks for torch's view of the devices. The names below are imported on
first use (PEP 562's module __getattr__), so importing one submodule (the sampler, at the app's
launch) does not import the machine's detection with it (launch time).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tutor.hardware.cpu import CpuInfo
    from tutor.hardware.machine import Machine, detect_machine
    from tutor.hardware.nvidia import GpuInfo, NvmlStatus

__all__ = ["CpuInfo", "GpuInfo", "Machine", "NvmlStatus", "detect_machine"]

_HOMES = {"CpuInfo": "tutor.hardware.cpu", "Machine": "tutor.hardware.machine",
          "detect_machine": "tutor.hardware.machine", "GpuInfo": "tutor.hardware.nvidia",
          "NvmlStatus": "tutor.hardware.nvidia"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
