"""A fake libnvidia-ml at the C level, behind the real nvidia-ml-py wrappers.

`FakeNvml.install(monkeypatch)` puts a fake shared-library object in `pynvml.nvmlLib` and empties
pynvml's function-pointer cache, so every `pynvml.nvmlDevice...` call runs the real wrapper: real
ctypes structs (`c_nvmlMemory_t`, `c_nvmlProcessInfo_v3_t`), real `NVMLError(code)` per-code
subclasses, and a symbol the "driver" lacks raises the real `NVMLError_FunctionNotFound` from
`_nvmlGetFunctionPointer`. Handles are real `c_nvmlDevice_t` pointers (never NULL, never falsy ints).

Each fake C function takes the arguments the wrapper passes (`byref(...)`, string buffers, pointers),
writes its outputs through them and returns an nvmlReturn_t code, as libnvidia-ml does.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Callable

import pynvml

GiB = 2**30
SUCCESS, INVALID_ARGUMENT, NOT_SUPPORTED, NO_PERMISSION = 0, 2, 3, 4
NOT_FOUND, INSUFFICIENT_SIZE, GPU_IS_LOST = 6, 7, 15
NOT_AVAILABLE_ULL = 2**64 - 1  # NVML_VALUE_NOT_AVAILABLE_ulonglong: usedGpuMemory unknown (WDDM, MIG)
NO_INSTANCE = 0xFFFFFFFF

# Symbols added in R535 (nvml.h of 535.x; nvidia-ml-py 12.535.77 added the wrapper): absent from an R525 driver.
R535_SYMBOLS = frozenset({"nvmlDeviceGetCurrentClocksEventReasons"})


@dataclass
class FakeProcess:
    pid: int
    used_bytes: int | None  # None: the driver reports NVML_VALUE_NOT_AVAILABLE
    gpu_instance_id: int = NO_INSTANCE


@dataclass
class FakeMig:
    """One MIG device (a GPU instance + compute instance) on a MIG-enabled GPU."""

    uuid: str
    gpu_instance_id: int
    memory_total: int
    memory_used: int = 0
    sm_count: int = 16
    slice_count: int = 1
    compute_instance_id: int = 0


@dataclass
class FakeGpu:
    """One physical GPU. `errors` maps a C symbol to the nvmlReturn_t it returns for this GPU."""

    name: str
    uuid: str
    memory_total: int
    memory_used: int = 0
    sm_clock: int = 1755
    sm_clock_max: int = 1980
    mem_clock: int = 2619
    power_mw: int = 350_000
    power_limit_mw: int = 700_000
    temperature: int = 45
    utilization: tuple[int, int] = (97, 60)
    pcie: tuple[int, int, int, int] = (5, 5, 16, 16)
    capability: tuple[int, int] = (9, 0)
    reasons: int = 0
    processes: list[FakeProcess] = field(default_factory=list)
    migs: list[FakeMig] = field(default_factory=list)
    max_mig_count: int = 7
    lost: bool = False  # every call on this GPU (handle included) returns GPU_IS_LOST
    errors: dict[str, int] = field(default_factory=dict)

    @property
    def mig_enabled(self) -> bool:
        return bool(self.migs)


def h100(uuid: str = "GPU-11111111-aaaa-4000-8000-000000000001", **changes: Any) -> FakeGpu:
    values: dict[str, Any] = dict(name="NVIDIA H100 80GB HBM3", uuid=uuid, memory_total=81559 * 2**20,
                                  memory_used=2 * GiB, reasons=0x4 | 0x20,
                                  processes=[FakeProcess(4242, GiB)])
    values.update(changes)
    return FakeGpu(**values)


def rtx_4090(uuid: str = "GPU-22222222-bbbb-4000-8000-000000000002", **changes: Any) -> FakeGpu:
    values: dict[str, Any] = dict(name="NVIDIA GeForce RTX 4090", uuid=uuid, memory_total=24 * GiB,
                                  memory_used=GiB, sm_clock=2520, sm_clock_max=3120, mem_clock=10501,
                                  power_limit_mw=450_000, utilization=(0, 0), pcie=(1, 4, 16, 16),
                                  capability=(8, 9), reasons=0x1)
    values.update(changes)
    return FakeGpu(**values)


def a100_with_migs(uuid: str = "GPU-33333333-cccc-4000-8000-000000000003") -> FakeGpu:
    """An A100 80GB in MIG mode with one 3g.40gb and two 1g.10gb slices (MIG user guide, A100 profiles)."""
    return FakeGpu(
        name="NVIDIA A100-SXM4-80GB", uuid=uuid, memory_total=81920 * 2**20, memory_used=3 * GiB,
        capability=(8, 0), pcie=(4, 4, 16, 16),
        errors={"nvmlDeviceGetUtilizationRates": NOT_SUPPORTED},  # not per-GPU in MIG mode
        migs=[FakeMig("MIG-aaaaaaaa-0001-5000-8000-000000000001", 1, 40 * GiB - 512 * 2**20, GiB, 42, 3),
              FakeMig("MIG-aaaaaaaa-0002-5000-8000-000000000002", 5, 10 * GiB - 256 * 2**20, 0, 14, 1),
              FakeMig("MIG-aaaaaaaa-0003-5000-8000-000000000003", 6, 10 * GiB - 256 * 2**20, 0, 14, 1)],
        processes=[FakeProcess(777, None, gpu_instance_id=1)],
    )


class _Lib:
    """The fake shared library: attribute lookup is dlsym; a missing symbol is an AttributeError."""

    def __init__(self, symbols: dict[str, Callable[..., int]]) -> None:
        self._symbols = symbols

    def __getattr__(self, name: str) -> Callable[..., int]:
        try:
            return self._symbols[name]
        except KeyError:
            raise AttributeError(name) from None


def _out(ref: Any) -> Any:
    """The ctypes object behind `byref(x)` (what the C function writes through)."""
    return ref._obj


class FakeNvml:
    """A driver with these GPUs. `missing` are C symbols the driver lacks (e.g. R535_SYMBOLS);
    `init_error` makes nvmlInit fail with that code."""

    def __init__(self, gpus: list[FakeGpu], *, driver: str = "570.86.15", cuda: int = 12080,
                 missing: frozenset[str] | set[str] = frozenset(), init_error: int | None = None) -> None:
        self.gpus = gpus
        self.driver, self.cuda, self.missing, self.init_error = driver, cuda, set(missing), init_error
        self.calls: dict[str, int] = {}
        self._arena = ctypes.create_string_buffer(4096)
        self._base = ctypes.addressof(self._arena)

    # handles: gpu g is byte 1 + 16 g of the arena, its MIG device m byte 1 + 16 g + 1 + m
    def _handle_address(self, gpu: int, mig: int | None = None) -> int:
        return self._base + 1 + 16 * gpu + (0 if mig is None else 1 + mig)

    def _resolve(self, handle: Any) -> tuple[FakeGpu, FakeMig | None] | None:
        address = ctypes.cast(handle, ctypes.c_void_p).value
        if not address or not self._base < address < self._base + 4096:
            return None
        gpu, rest = divmod(address - self._base - 1, 16)
        if gpu >= len(self.gpus):
            return None
        fake = self.gpus[gpu]
        if rest == 0:
            return fake, None
        return (fake, fake.migs[rest - 1]) if rest - 1 < len(fake.migs) else None

    @staticmethod
    def _write_handle(ref: Any, address: int) -> None:
        pointer = _out(ref)
        ctypes.memmove(ctypes.addressof(pointer), ctypes.byref(ctypes.c_void_p(address)), ctypes.sizeof(ctypes.c_void_p))

    def _symbols(self) -> dict[str, Callable[..., int]]:
        nvml = self

        def device_call(symbol: str, body: Callable[[FakeGpu, FakeMig | None, tuple], int], *, mig_ok: bool = True):
            def function(handle: Any, *args: Any) -> int:
                nvml.calls[symbol] = nvml.calls.get(symbol, 0) + 1
                found = nvml._resolve(handle)
                if found is None:
                    return INVALID_ARGUMENT
                gpu, mig = found
                if gpu.lost:
                    return GPU_IS_LOST
                if symbol in gpu.errors and mig is None:
                    return gpu.errors[symbol]
                if mig is not None and not mig_ok:
                    return NOT_SUPPORTED
                return body(gpu, mig, args)
            return function

        def uint_out(value: Callable[[FakeGpu, FakeMig | None, tuple], int]):
            def body(gpu: FakeGpu, mig: FakeMig | None, args: tuple) -> int:
                _out(args[-1]).value = value(gpu, mig, args)
                return SUCCESS
            return body

        def text_out(value: Callable[[FakeGpu, FakeMig | None], str]):
            def body(gpu: FakeGpu, mig: FakeMig | None, args: tuple) -> int:
                args[0].value = value(gpu, mig).encode()
                return SUCCESS
            return body

        def init(flags: Any) -> int:
            nvml.calls["init"] = nvml.calls.get("init", 0) + 1
            return nvml.init_error if nvml.init_error is not None else SUCCESS

        def shutdown() -> int:
            nvml.calls["shutdown"] = nvml.calls.get("shutdown", 0) + 1
            return SUCCESS

        def error_string(code: Any) -> bytes:
            return f"fake NVML error {int(getattr(code, 'value', code))}".encode()

        def system_text(value: str):
            def function(buffer: Any, size: Any) -> int:
                buffer.value = value.encode()
                return SUCCESS
            return function

        def cuda_version(ref: Any) -> int:
            _out(ref).value = nvml.cuda
            return SUCCESS

        def count(ref: Any) -> int:
            _out(ref).value = len(nvml.gpus)
            return SUCCESS

        def handle_by_index(index: Any, ref: Any) -> int:
            index = int(getattr(index, "value", index))
            if index >= len(nvml.gpus):
                return INVALID_ARGUMENT
            if nvml.gpus[index].lost:
                return GPU_IS_LOST
            nvml._write_handle(ref, nvml._handle_address(index))
            return SUCCESS

        def handle_by_uuid(uuid: Any, ref: Any) -> int:
            wanted = uuid.value.decode()
            for g, gpu in enumerate(nvml.gpus):
                if gpu.uuid == wanted:
                    if gpu.lost:
                        return GPU_IS_LOST
                    nvml._write_handle(ref, nvml._handle_address(g))
                    return SUCCESS
                for m, mig in enumerate(gpu.migs):
                    if mig.uuid == wanted:
                        nvml._write_handle(ref, nvml._handle_address(g, m))
                        return SUCCESS
            return NOT_FOUND

        def memory(gpu: FakeGpu, mig: FakeMig | None, args: tuple) -> int:
            total, used = (mig.memory_total, mig.memory_used) if mig else (gpu.memory_total, gpu.memory_used)
            struct = _out(args[0])
            struct.total, struct.used, struct.free = total, used, total - used
            return SUCCESS

        def clock(table: str):
            def value(gpu: FakeGpu, mig: FakeMig | None, args: tuple) -> int:
                kind = int(args[0].value)
                return {("now", 1): gpu.sm_clock, ("max", 1): gpu.sm_clock_max}.get((table, kind), gpu.mem_clock)
            return value

        def utilization(gpu: FakeGpu, mig: FakeMig | None, args: tuple) -> int:
            struct = _out(args[0])
            struct.gpu, struct.memory = gpu.utilization
            return SUCCESS

        def capability(gpu: FakeGpu, mig: FakeMig | None, args: tuple) -> int:
            _out(args[0]).value, _out(args[1]).value = gpu.capability
            return SUCCESS

        def processes(gpu: FakeGpu, mig: FakeMig | None, args: tuple) -> int:
            found = [p for p in gpu.processes if mig is None or p.gpu_instance_id == mig.gpu_instance_id]
            count_ref, array = args
            if array is None or _out(count_ref).value < len(found):
                _out(count_ref).value = len(found)
                return INSUFFICIENT_SIZE if found else SUCCESS
            for slot, process in zip(array, found):
                slot.pid = process.pid
                slot.usedGpuMemory = NOT_AVAILABLE_ULL if process.used_bytes is None else process.used_bytes
                slot.gpuInstanceId = process.gpu_instance_id
                slot.computeInstanceId = 0 if process.gpu_instance_id != NO_INSTANCE else NO_INSTANCE
            _out(count_ref).value = len(found)
            return SUCCESS

        def mig_mode(gpu: FakeGpu, mig: FakeMig | None, args: tuple) -> int:
            if not gpu.capability >= (8, 0):
                return NOT_SUPPORTED
            _out(args[0]).value = _out(args[1]).value = int(gpu.mig_enabled)
            return SUCCESS

        def mig_handle(gpu: FakeGpu, mig: FakeMig | None, args: tuple) -> int:
            index = int(args[0].value)
            if not gpu.mig_enabled or index >= gpu.max_mig_count:
                return INVALID_ARGUMENT
            if index >= len(gpu.migs):
                return NOT_FOUND  # an unused MIG slot
            nvml._write_handle(args[1], nvml._handle_address(nvml.gpus.index(gpu), index))
            return SUCCESS

        def attributes(gpu: FakeGpu, mig: FakeMig | None, args: tuple) -> int:
            if mig is None:
                return NOT_SUPPORTED  # nvmlDeviceGetAttributes is for MIG device handles
            struct = _out(args[0])
            struct.multiprocessorCount, struct.gpuInstanceSliceCount = mig.sm_count, mig.slice_count
            struct.computeInstanceSliceCount, struct.memorySizeMB = mig.slice_count, mig.memory_total // 2**20
            return SUCCESS

        def parent_handle(gpu: FakeGpu, mig: FakeMig | None, args: tuple) -> int:
            if mig is None:
                return INVALID_ARGUMENT
            nvml._write_handle(args[0], nvml._handle_address(nvml.gpus.index(gpu)))
            return SUCCESS

        symbols: dict[str, Callable[..., int]] = {
            "nvmlInitWithFlags": init,
            "nvmlInit_v2": lambda: init(0),
            "nvmlShutdown": shutdown,
            "nvmlErrorString": error_string,
            "nvmlSystemGetDriverVersion": system_text(nvml.driver),
            "nvmlSystemGetNVMLVersion": system_text(f"12.{nvml.driver}"),
            "nvmlSystemGetCudaDriverVersion": cuda_version,
            "nvmlSystemGetCudaDriverVersion_v2": cuda_version,
            "nvmlDeviceGetCount_v2": count,
            "nvmlDeviceGetHandleByIndex_v2": handle_by_index,
            "nvmlDeviceGetHandleByUUID": handle_by_uuid,
            "nvmlDeviceGetName": device_call("nvmlDeviceGetName", text_out(
                lambda g, m: f"{g.name} MIG {m.slice_count}g.{m.memory_total // 2**30 + 1}gb" if m else g.name)),
            "nvmlDeviceGetUUID": device_call("nvmlDeviceGetUUID", text_out(lambda g, m: m.uuid if m else g.uuid)),
            "nvmlDeviceGetMemoryInfo": device_call("nvmlDeviceGetMemoryInfo", memory),
            "nvmlDeviceGetClockInfo": device_call("nvmlDeviceGetClockInfo", uint_out(clock("now"))),
            "nvmlDeviceGetMaxClockInfo": device_call("nvmlDeviceGetMaxClockInfo", uint_out(clock("max"))),
            "nvmlDeviceGetPowerUsage": device_call("nvmlDeviceGetPowerUsage", uint_out(lambda g, m, a: g.power_mw),
                                                   mig_ok=False),
            "nvmlDeviceGetEnforcedPowerLimit": device_call(
                "nvmlDeviceGetEnforcedPowerLimit", uint_out(lambda g, m, a: g.power_limit_mw), mig_ok=False),
            "nvmlDeviceGetTemperature": device_call("nvmlDeviceGetTemperature",
                                                    uint_out(lambda g, m, a: g.temperature), mig_ok=False),
            "nvmlDeviceGetUtilizationRates": device_call("nvmlDeviceGetUtilizationRates", utilization,
                                                         mig_ok=False),
            "nvmlDeviceGetCurrPcieLinkGeneration": device_call(
                "nvmlDeviceGetCurrPcieLinkGeneration", uint_out(lambda g, m, a: g.pcie[0])),
            "nvmlDeviceGetMaxPcieLinkGeneration": device_call(
                "nvmlDeviceGetMaxPcieLinkGeneration", uint_out(lambda g, m, a: g.pcie[1])),
            "nvmlDeviceGetCurrPcieLinkWidth": device_call(
                "nvmlDeviceGetCurrPcieLinkWidth", uint_out(lambda g, m, a: g.pcie[2])),
            "nvmlDeviceGetMaxPcieLinkWidth": device_call(
                "nvmlDeviceGetMaxPcieLinkWidth", uint_out(lambda g, m, a: g.pcie[3])),
            "nvmlDeviceGetCudaComputeCapability": device_call("nvmlDeviceGetCudaComputeCapability", capability),
            "nvmlDeviceGetComputeRunningProcesses_v3": device_call("nvmlDeviceGetComputeRunningProcesses_v3",
                                                                   processes),
            "nvmlDeviceGetCurrentClocksThrottleReasons": device_call(
                "nvmlDeviceGetCurrentClocksThrottleReasons", uint_out(lambda g, m, a: g.reasons)),
            "nvmlDeviceGetCurrentClocksEventReasons": device_call(
                "nvmlDeviceGetCurrentClocksEventReasons", uint_out(lambda g, m, a: g.reasons)),
            "nvmlDeviceGetMigMode": device_call("nvmlDeviceGetMigMode", mig_mode, mig_ok=False),
            "nvmlDeviceGetMaxMigDeviceCount": device_call(
                "nvmlDeviceGetMaxMigDeviceCount", uint_out(lambda g, m, a: g.max_mig_count if g.mig_enabled else 0),
                mig_ok=False),
            "nvmlDeviceGetMigDeviceHandleByIndex": device_call("nvmlDeviceGetMigDeviceHandleByIndex", mig_handle,
                                                               mig_ok=False),
            "nvmlDeviceIsMigDeviceHandle": device_call("nvmlDeviceIsMigDeviceHandle",
                                                       uint_out(lambda g, m, a: int(m is not None))),
            "nvmlDeviceGetGpuInstanceId": device_call(
                "nvmlDeviceGetGpuInstanceId",
                lambda g, m, a: uint_out(lambda *_: m.gpu_instance_id)(g, m, a) if m else INVALID_ARGUMENT),
            "nvmlDeviceGetAttributes_v2": device_call("nvmlDeviceGetAttributes_v2", attributes),
            "nvmlDeviceGetDeviceHandleFromMigDeviceHandle": device_call(
                "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", parent_handle),
        }
        return {name: function for name, function in symbols.items() if name not in nvml.missing}

    def install(self, monkeypatch: Any) -> "FakeNvml":
        """Make the real pynvml talk to this fake driver for the rest of the test."""
        import sys

        monkeypatch.setitem(sys.modules, "pynvml", pynvml)
        monkeypatch.setattr(pynvml, "nvmlLib", _Lib(self._symbols()))
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        monkeypatch.setattr(pynvml, "_nvmlLib_refcount", 0)
        return self
