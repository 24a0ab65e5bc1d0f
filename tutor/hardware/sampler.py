"""A live sampler for the app's panes: GPU (NVML) and CPU/RAM (psutil) readings at 1 to 4 Hz.

A background thread appends one `Sample` per interval to a bounded ring buffer. A reading that
fails becomes None; the thread itself never raises. Readers and the clock are injectable so
tests run without NVML, psutil timing or sleeping.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, fields
from typing import Any, Callable

from tutor.errors import UserError

MIN_INTERVAL_S, MAX_INTERVAL_S = 0.25, 1.0
DEFAULT_HISTORY = 240


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one instant; None where NVML could not say."""

    index: int  # NVML's index of the physical GPU
    utilization_pct: float | None = None
    memory_used_bytes: int | None = None
    sm_clock_mhz: int | None = None
    power_w: float | None = None
    temperature_c: int | None = None
    mig_index: int | None = None  # set on a MIG device of GPU `index`: only its memory is per-slice


@dataclass(frozen=True)
class HostSample:
    """CPU load per logical core and RAM use at one instant."""

    cpu_percent: tuple[float, ...] | None = None
    ram_used_bytes: int | None = None
    ram_total_bytes: int | None = None
    process_cpu_percent: float | None = None  # this app and its children (the measurement worker)
    process_rss_bytes: int | None = None


@dataclass(frozen=True)
class Sample:
    """Everything read at one tick."""

    timestamp: float
    cpu_percent: tuple[float, ...] | None
    ram_used_bytes: int | None
    ram_total_bytes: int | None
    gpus: tuple[GpuSample, ...]
    process_cpu_percent: float | None = None
    """CPU used by this app's process tree, in % of all logical cores (as cpu_percent's mean)."""
    process_rss_bytes: int | None = None
    """Resident memory of this app's process tree."""


HOST_FIELDS = ("cpu_percent", "ram_used_bytes", "ram_total_bytes")
GPU_FIELDS = tuple(f.name for f in fields(GpuSample) if f.name not in ("index", "mig_index"))


def clamp_interval(interval_s: float) -> float:
    """Keep the sampling period within 0.25-1 s (1 to 4 Hz): faster would cost the measurement it watches."""
    if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or interval_s != interval_s:
        raise UserError(f"sampling interval must be a number of seconds, got {interval_s!r}")
    return min(MAX_INTERVAL_S, max(MIN_INTERVAL_S, float(interval_s)))


class ProcessTree:
    """CPU and resident memory of this process and its children (the measurement worker, ranks),
    via psutil; each process object is kept so that cpu_percent measures since the last call."""

    def __init__(self) -> None:
        self._processes: dict[int, Any] = {}

    def __call__(self) -> tuple[float | None, int | None]:
        import psutil

        from tutor.hardware.cpu import psutil_errors  # here: the app imports the sampler at launch

        errors = psutil_errors(psutil)
        try:
            me = psutil.Process()
            tree = [me, *me.children(recursive=True)]
        except errors:
            return None, None
        cpu, rss, seen = 0.0, 0, {}
        for process in tree:
            process = self._processes.get(process.pid, process)
            try:
                cpu += process.cpu_percent(interval=None)
                rss += process.memory_info().rss
            except errors:  # exited between the listing and the read
                continue
            seen[process.pid] = process
        self._processes = seen
        return cpu / (psutil.cpu_count() or 1), rss


_PROCESS_TREE = ProcessTree()


def read_host() -> HostSample:
    """CPU percent per core since the previous call, RAM, and this app's share of both, via psutil."""
    import psutil

    from tutor.hardware.cpu import psutil_errors

    errors = psutil_errors(psutil)
    try:
        cpu: tuple[float, ...] | None = tuple(psutil.cpu_percent(interval=None, percpu=True))
    except errors:
        cpu = None
    used: int | None
    total: int | None
    try:
        memory = psutil.virtual_memory()
        used, total = int(memory.total - memory.available), int(memory.total)
    except errors:
        used = total = None
    process_cpu, process_rss = _PROCESS_TREE()
    return HostSample(cpu, used, total, process_cpu, process_rss)


class NvmlReader:
    """Reads the sampled GPU fields through NVML; initialised once, shut down by close().

    Each GPU's handle is taken on its own: one lost GPU (NVML_ERROR_GPU_IS_LOST) reads as None for
    that GPU and retries next tick, never blanking the others."""

    def __init__(self) -> None:
        from tutor.hardware.nvidia import NvmlQuery, open_nvml

        self._pynvml, self.reason = open_nvml()
        """Why no GPU is sampled (no nvidia-ml-py, no driver, ...); None while NVML answers."""
        self._query = NvmlQuery(self._pynvml) if self._pynvml is not None else None
        self._count = 0
        self._handles: dict[int, Any] = {}
        self._mig_handles: dict[int, list[tuple[int, Any]]] = {}
        if self._pynvml is not None:
            count = self._get("nvmlDeviceGetCount")
            self._count = int(count) if isinstance(count, int) else 0

    def _get(self, function: str, *args: Any) -> Any:
        """NVML's answer, or None: a field the driver cannot give this tick (the reason is kept in
        self._query.unavailable under the function's name)."""
        if self._query is None:
            return None
        return self._query(function, function, *args)

    def _handle(self, index: int) -> Any:
        if index not in self._handles:
            handle = self._get("nvmlDeviceGetHandleByIndex", index)
            if handle is None:
                return None
            self._handles[index] = handle
            self._mig_handles[index] = self._migs(handle)
        return self._handles[index]

    def _migs(self, handle: Any) -> list[tuple[int, Any]]:
        mode = self._get("nvmlDeviceGetMigMode", handle)
        if not isinstance(mode, (list, tuple)) or not mode or mode[0] != getattr(self._pynvml, "NVML_DEVICE_MIG_ENABLE", 1):
            return []
        slots = self._get("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        found = [(slot, self._get("nvmlDeviceGetMigDeviceHandleByIndex", handle, slot)) for slot in range(int(slots))]
        return [(slot, mig) for slot, mig in found if mig is not None]

    def _sample(self, index: int, handle: Any) -> GpuSample:
        utilization = self._get("nvmlDeviceGetUtilizationRates", handle)
        memory = self._get("nvmlDeviceGetMemoryInfo", handle)
        power_mw = self._get("nvmlDeviceGetPowerUsage", handle)
        return GpuSample(
            index=index,
            utilization_pct=getattr(utilization, "gpu", None),
            memory_used_bytes=getattr(memory, "used", None),
            sm_clock_mhz=self._get("nvmlDeviceGetClockInfo", handle, getattr(self._pynvml, "NVML_CLOCK_SM", 1)),
            power_w=power_mw / 1000 if isinstance(power_mw, (int, float)) else None,
            temperature_c=self._get("nvmlDeviceGetTemperature", handle,
                                    getattr(self._pynvml, "NVML_TEMPERATURE_GPU", 0)),
        )

    def __call__(self) -> tuple[GpuSample, ...]:
        if self._pynvml is None:
            return ()
        samples = []
        for index in range(self._count):
            handle = self._handle(index)
            if handle is None:
                samples.append(GpuSample(index=index))
                continue
            samples.append(self._sample(index, handle))
            for slot, mig in self._mig_handles.get(index, []):
                memory = self._get("nvmlDeviceGetMemoryInfo", mig)
                samples.append(GpuSample(index=index, memory_used_bytes=getattr(memory, "used", None), mig_index=slot))
        return tuple(samples)

    def close(self) -> None:
        if self._pynvml is not None:
            from tutor.hardware.nvidia import shutdown_nvml

            shutdown_nvml(self._pynvml)
            self._pynvml = None


class Sampler:
    """Background sampling into a ring buffer: start(), latest(), history(field), stop().

    `host_reader`, `gpu_reader` and `clock` default to psutil, NVML and time.time; tests pass fakes.
    """

    def __init__(
        self,
        interval_s: float = 0.5,
        *,
        maxlen: int = DEFAULT_HISTORY,
        host_reader: Callable[[], HostSample] | None = None,
        gpu_reader: Callable[[], tuple[GpuSample, ...]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(maxlen, bool) or not isinstance(maxlen, int) or maxlen < 1:
            raise UserError(f"sample history length must be a whole number >= 1, got {maxlen!r}")
        self.interval_s = clamp_interval(interval_s)
        self._host_reader = host_reader or read_host
        self._gpu_reader = gpu_reader
        self._owns_gpu_reader = gpu_reader is None
        self._clock = clock
        self._buffer: deque[Sample] = deque(maxlen=maxlen)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def sample_once(self) -> Sample:
        """Take one sample now, append it and return it. Never raises."""
        # Guards the sampling thread behind the live CPU/GPU panes: the readers are injectable
        # callables, and one that fails must read as "no value" for a tick, not end the thread.
        try:
            host = self._host_reader()
        except Exception:  # noqa: BLE001 - any reader failure is one blank tick of the live panes
            host = HostSample()
        gpus: tuple[GpuSample, ...] = ()
        if self._gpu_reader is not None:
            try:
                gpus = tuple(self._gpu_reader())
            except Exception:  # noqa: BLE001 - same: one blank tick of the GPU pane
                gpus = ()
        timestamp = float(self._clock())
        sample = Sample(timestamp, host.cpu_percent, host.ram_used_bytes, host.ram_total_bytes, gpus,
                        host.process_cpu_percent, host.process_rss_bytes)
        with self._lock:
            self._buffer.append(sample)
        return sample

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample_once()
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        """Start the background thread (a second start while running does nothing)."""
        if self.running:
            return
        if self._owns_gpu_reader and self._gpu_reader is None:
            self._gpu_reader = NvmlReader()  # never raises: NVML failures become its `reason`
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="tensor-tutor-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread; returns within about one interval."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 1.0)
            self._thread = None
        if self._owns_gpu_reader and isinstance(self._gpu_reader, NvmlReader):
            self._gpu_reader.close()
            self._gpu_reader = None

    def __enter__(self) -> "Sampler":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def latest(self) -> Sample | None:
        """The newest sample, None before the first."""
        with self._lock:
            return self._buffer[-1] if self._buffer else None

    def samples(self) -> list[Sample]:
        """All buffered samples, oldest first."""
        with self._lock:
            return list(self._buffer)

    def history(self, field_name: str, gpu: int | None = None) -> list[tuple[float, Any]]:
        """(timestamp, value) pairs of one field, oldest first.

        Host fields: cpu_percent, ram_used_bytes, ram_total_bytes. GPU fields (pass gpu=index):
        utilization_pct, memory_used_bytes, sm_clock_mhz, power_w, temperature_c. A GPU missing
        from a sample gives None for that instant.
        """
        if gpu is None:
            if field_name not in HOST_FIELDS:
                hint = " (a GPU field: pass gpu=index)" if field_name in GPU_FIELDS else ""
                raise UserError(f"unknown sample field {field_name!r}{hint}: use one of {', '.join(HOST_FIELDS)}")
            return [(s.timestamp, getattr(s, field_name)) for s in self.samples()]
        if field_name not in GPU_FIELDS:
            raise UserError(f"unknown GPU sample field {field_name!r}: use one of {', '.join(GPU_FIELDS)}")
        result = []
        for sample in self.samples():
            match = next((g for g in sample.gpus if g.index == gpu and getattr(g, "mig_index", None) is None), None)
            result.append((sample.timestamp, getattr(match, field_name) if match is not None else None))
        return result
