"""What this machine is: CPU (psutil, /proc/cpuinfo), NVIDIA GPUs (NVML), torch devices, peak specs.

Nothing here imports torch at import time; only `tutor.hardware.torch_devices` does, inside a
function, when a caller asks for torch's view of the devices.
"""

from tutor.hardware.cpu import CpuInfo
from tutor.hardware.machine import Machine, detect_machine
from tutor.hardware.nvidia import GpuInfo, NvmlStatus

__all__ = ["CpuInfo", "GpuInfo", "Machine", "NvmlStatus", "detect_machine"]
