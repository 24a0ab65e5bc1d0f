"""NVML through a fake pynvml module: every failure becomes a displayable state, never an exception."""

from __future__ import annotations

import json
import sys
import types
from types import SimpleNamespace
from typing import Any

import pytest

from tutor.errors import UserError
from tutor.hardware import nvidia
from tutor.hardware.cpu import detect_cpu
from tutor.hardware.machine import UNKNOWN_GPU, Machine, gpu_for_cuda_index

NOT_SUPPORTED, NO_PERMISSION, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND = 3, 4, 9, 12
GiB = 2**30


class FakeNVMLError(Exception):
    """Mimics pynvml.NVMLError: an error code in `.value`."""

    _text = {3: "Not Supported", 4: "Insufficient Permissions", 9: "Driver Not Loaded",
             12: "NVML Shared Library Not Found"}

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return self._text.get(self.value, f"NVML error {self.value}")


H100 = {
    "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-11111111-aaaa",
    "memory": SimpleNamespace(total=80 * GiB, used=2 * GiB, free=78 * GiB),
    "clock": {1: 1755, 2: 2619}, "max_clock": {1: 1980, 2: 2619},
    "power": 350_000, "limit": 700_000, "temperature": 45,
    "utilization": SimpleNamespace(gpu=97, memory=60), "pcie": (5, 5, 16, 16), "capability": (9, 0),
    "reasons": 0x4 | 0x20, "processes": [SimpleNamespace(pid=4242, usedGpuMemory=GiB)],
}
RTX_4090 = {
    "name": "NVIDIA GeForce RTX 4090", "uuid": "GPU-22222222-bbbb",
    "memory": SimpleNamespace(total=24 * GiB, used=GiB, free=23 * GiB),
    "clock": {1: 2520, 2: 10501}, "max_clock": {1: 3120, 2: 10501},
    "power": FakeNVMLError(NOT_SUPPORTED), "limit": 450_000, "temperature": FakeNVMLError(NO_PERMISSION),
    "utilization": SimpleNamespace(gpu=0, memory=0), "pcie": (1, 4, 16, 16), "capability": (8, 9),
    "reasons": 0x1, "processes": FakeNVMLError(NOT_SUPPORTED),
}


def fake_pynvml(gpus: list[dict[str, Any]], *, init_error: int | None = None,
                legacy_reasons: bool = False, missing: tuple[str, ...] = ()) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    module.NVMLError = FakeNVMLError
    module.NVML_CLOCK_SM, module.NVML_CLOCK_MEM, module.NVML_TEMPERATURE_GPU = 1, 2, 0
    module.calls = {"init": 0, "shutdown": 0}

    def answer(value: Any) -> Any:
        if isinstance(value, Exception):
            raise value
        return value

    def nvmlInit() -> None:
        if init_error is not None:
            raise FakeNVMLError(init_error)
        module.calls["init"] += 1

    def nvmlShutdown() -> None:
        module.calls["shutdown"] += 1

    functions = {
        "nvmlInit": nvmlInit,
        "nvmlShutdown": nvmlShutdown,
        "nvmlSystemGetDriverVersion": lambda: "570.86.15",
        "nvmlSystemGetCudaDriverVersion_v2": lambda: 12080,
        "nvmlSystemGetNVMLVersion": lambda: "12.570.86.15",
        "nvmlDeviceGetCount": lambda: len(gpus),
        "nvmlDeviceGetHandleByIndex": lambda i: i,
        "nvmlDeviceGetName": lambda h: answer(gpus[h]["name"]),
        "nvmlDeviceGetUUID": lambda h: answer(gpus[h]["uuid"]),
        "nvmlDeviceGetMemoryInfo": lambda h: answer(gpus[h]["memory"]),
        "nvmlDeviceGetClockInfo": lambda h, t: answer(gpus[h]["clock"][t]),
        "nvmlDeviceGetMaxClockInfo": lambda h, t: answer(gpus[h]["max_clock"][t]),
        "nvmlDeviceGetPowerUsage": lambda h: answer(gpus[h]["power"]),
        "nvmlDeviceGetEnforcedPowerLimit": lambda h: answer(gpus[h]["limit"]),
        "nvmlDeviceGetTemperature": lambda h, sensor: answer(gpus[h]["temperature"]),
        "nvmlDeviceGetUtilizationRates": lambda h: answer(gpus[h]["utilization"]),
        "nvmlDeviceGetCurrPcieLinkGeneration": lambda h: answer(gpus[h]["pcie"][0]),
        "nvmlDeviceGetMaxPcieLinkGeneration": lambda h: answer(gpus[h]["pcie"][1]),
        "nvmlDeviceGetCurrPcieLinkWidth": lambda h: answer(gpus[h]["pcie"][2]),
        "nvmlDeviceGetMaxPcieLinkWidth": lambda h: answer(gpus[h]["pcie"][3]),
        "nvmlDeviceGetCudaComputeCapability": lambda h: answer(gpus[h]["capability"]),
        "nvmlDeviceGetComputeRunningProcesses": lambda h: answer(gpus[h]["processes"]),
        "nvmlDeviceGetCurrentClocksThrottleReasons": lambda h: answer(gpus[h]["reasons"]),
    }
    if not legacy_reasons:
        functions["nvmlDeviceGetCurrentClocksEventReasons"] = lambda h: answer(gpus[h]["reasons"])
    for name, function in functions.items():
        if name not in missing:
            setattr(module, name, function)
    return module


@pytest.fixture
def install(monkeypatch):
    def _install(module: types.ModuleType | None) -> types.ModuleType | None:
        monkeypatch.setitem(sys.modules, "pynvml", module)
        return module
    return _install


def machine_with(gpus: list[nvidia.GpuInfo], status: nvidia.NvmlStatus | None = None) -> Machine:
    return Machine(cpu=detect_cpu(), gpus=gpus, nvml=status or nvidia.NvmlStatus(True, None))


def test_no_library_installed(install):
    install(None)  # `import pynvml` raises ImportError
    status, gpus = nvidia.detect_nvidia()
    assert not status.available and gpus == []
    assert "nvidia-ml-py is not installed" in status.reason


@pytest.mark.parametrize(("code", "words"), [(LIBRARY_NOT_FOUND, "NVML Shared Library Not Found"),
                                             (DRIVER_NOT_LOADED, "Driver Not Loaded")])
def test_no_driver(install, code, words):
    install(fake_pynvml([H100], init_error=code))
    status, gpus = nvidia.detect_nvidia()
    assert gpus == [] and not status.available
    assert status.reason == f"no NVIDIA driver found (NVML: {words})"


def test_permission_denied_at_init(install):
    install(fake_pynvml([H100], init_error=NO_PERMISSION))
    status, _ = nvidia.detect_nvidia()
    assert not status.available and "refused" in status.reason


def test_a_shadowing_pynvml_module_is_named(install):
    install(types.ModuleType("pynvml"))  # e.g. an unrelated package called pynvml
    status, _ = nvidia.detect_nvidia()
    assert not status.available and "not nvidia-ml-py" in status.reason


def test_one_full_gpu(install):
    module = install(fake_pynvml([H100]))
    status, gpus = nvidia.detect_nvidia()
    assert status.available and status.reason is None
    assert status.driver_version == "570.86.15" and status.cuda_driver_version == "12.8"
    (gpu,) = gpus
    assert gpu.name == "NVIDIA H100 80GB HBM3" and gpu.uuid == "GPU-11111111-aaaa"
    assert (gpu.memory_total_bytes, gpu.memory_used_bytes, gpu.memory_free_bytes) == (80 * GiB, 2 * GiB, 78 * GiB)
    assert (gpu.sm_clock_mhz, gpu.sm_clock_max_mhz, gpu.memory_clock_mhz) == (1755, 1980, 2619)
    assert gpu.power_w == 350.0 and gpu.power_limit_w == 700.0 and gpu.temperature_c == 45
    assert (gpu.utilization_gpu_pct, gpu.utilization_memory_pct) == (97, 60)
    assert (gpu.pcie_generation, gpu.pcie_generation_max, gpu.pcie_width, gpu.pcie_width_max) == (5, 5, 16, 16)
    assert gpu.compute_capability == (9, 0)
    assert gpu.clock_event_reasons == ("software power cap", "software thermal slowdown")
    assert gpu.processes == (nvidia.GpuProcess(4242, GiB),)
    assert gpu.unavailable == {}
    assert gpu.spec is not None and gpu.spec.key == "h100-sxm"
    assert module.calls == {"init": 1, "shutdown": 1}


def test_unsupported_fields_are_none_with_a_reason(install):
    install(fake_pynvml([RTX_4090]))
    _, (gpu,) = nvidia.detect_nvidia()
    assert gpu.power_w is None and gpu.unavailable["power_w"] == "N/A: not supported"
    assert gpu.temperature_c is None and gpu.unavailable["temperature_c"] == "N/A: insufficient permissions"
    assert gpu.processes is None and gpu.unavailable["processes"] == "N/A: not supported"
    assert gpu.power_limit_w == 450.0 and gpu.clock_event_reasons == ("idle",)


def test_legacy_throttle_reason_call_is_used(install):
    install(fake_pynvml([H100], legacy_reasons=True))
    _, (gpu,) = nvidia.detect_nvidia()
    assert gpu.clock_event_reasons == ("software power cap", "software thermal slowdown")


def test_a_function_missing_from_an_old_binding(install):
    install(fake_pynvml([H100], missing=("nvmlDeviceGetCudaComputeCapability", "nvmlSystemGetCudaDriverVersion_v2")))
    status, (gpu,) = nvidia.detect_nvidia()
    assert gpu.compute_capability is None
    assert "no nvmlDeviceGetCudaComputeCapability" in gpu.unavailable["compute_capability"]
    assert status.available and status.cuda_driver_version is None


def test_odd_exceptions_become_na(install):
    broken = dict(H100, name=UnicodeDecodeError("utf-8", b"\xff", 0, 1, "bad"), memory=SimpleNamespace(total=0, used=0, free=0))
    install(fake_pynvml([broken]))
    _, (gpu,) = nvidia.detect_nvidia()
    assert "name unreadable" in gpu.name and gpu.spec is None
    assert gpu.unavailable["name"].startswith("N/A: UnicodeDecodeError")
    assert gpu.memory_total_bytes is None and "unified memory" in gpu.unavailable["memory"]


def test_two_gpus_and_peaks(install, monkeypatch):
    install(fake_pynvml([H100, RTX_4090]))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    status, gpus = nvidia.detect_nvidia()
    assert [g.index for g in gpus] == [0, 1]
    machine = machine_with(gpus, status)
    assert machine.peak_tflops("cuda:0", "bf16") == pytest.approx(989.4)
    assert machine.peak_tflops("cuda:1", "bf16") == pytest.approx(165.2)  # FP32-accumulate, not 330
    assert machine.peak_tflops("cuda:0", "fp8") == pytest.approx(1979)
    assert machine.peak_memory_gbps("cuda:0") == 3350 and machine.peak_memory_gbps("cuda:1") == 1008
    assert "H100 SXM5" in machine.peak_source("cuda:0", "bf16") and "datasheet" in machine.peak_source("cuda:0", "bf16")
    assert machine.peak_tflops("cuda", "bf16") == machine.peak_tflops("cuda:0", "bf16")
    assert machine.peak_tflops("cuda:2", "bf16") is None
    assert machine.peak_clock_hz("cuda:0") == 1830e6  # the clock behind 989.4 TF (reference §1.3)
    assert machine.peak_clock_hz("cuda:2") is None
    assert "measured only" in machine.peak_source("cuda:2", "bf16")
    data = json.loads(json.dumps(machine.to_json()))
    assert [g["name"] for g in data["gpus"]] == [H100["name"], RTX_4090["name"]]
    assert data["gpus"][0]["spec"]["key"] == "h100-sxm" and data["gpus"][0]["spec_status"] == "datasheet"
    assert data["gpus"][1]["unavailable"]["power_w"] == "N/A: not supported"
    assert data["gpus"][0]["clock_event_reasons"] == ["software power cap", "software thermal slowdown"]


def test_cuda_visible_devices_renumbers(install, monkeypatch):
    install(fake_pynvml([H100, RTX_4090]))
    _, gpus = nvidia.detect_nvidia()
    machine = machine_with(gpus)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert machine.peak_tflops("cuda:0", "bf16") == pytest.approx(165.2)
    assert machine.peak_tflops("cuda:1", "bf16") is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-11111111")
    assert machine.gpu_for("cuda:0").name == H100["name"]
    assert gpu_for_cuda_index(0, gpus, "") is None  # an empty list hides every GPU
    assert gpu_for_cuda_index(0, gpus, "7") is None


def test_unknown_gpu_is_measured_only(install):
    install(fake_pynvml([dict(H100, name="NVIDIA GH200 480GB")]))
    _, gpus = nvidia.detect_nvidia()
    machine = machine_with(gpus)
    assert machine.peak_tflops("cuda:0", "bf16") is None and machine.peak_memory_gbps("cuda:0") is None
    assert machine.peak_source("cuda:0", "bf16") == f"{UNKNOWN_GPU} (NVIDIA GH200 480GB)"
    assert machine.to_json()["gpus"][0]["spec_status"] == UNKNOWN_GPU


def test_known_gpu_without_that_dtype(install):
    install(fake_pynvml([dict(H100, name="Tesla T4")]))
    _, gpus = nvidia.detect_nvidia()
    machine = machine_with(gpus)
    assert machine.peak_tflops("cuda:0", "bf16") is None
    assert "no dense bf16" in machine.peak_source("cuda:0", "bf16")


def test_bad_device_or_dtype_is_a_user_error():
    machine = machine_with([])
    with pytest.raises(UserError, match="device"):
        machine.peak_tflops("gpu0", "bf16")
    with pytest.raises(UserError, match="dtype"):
        machine.peak_tflops("cpu", "float16")


def test_decode_clock_event_reasons():
    assert nvidia.decode_clock_event_reasons(0) == ()
    assert nvidia.decode_clock_event_reasons(0x4 | 0x40) == ("software power cap", "hardware thermal slowdown")
    assert nvidia.decode_clock_event_reasons(0x1000 | 0x1) == ("idle", "other (0x1000)")
