"""STREAM-like memory bandwidth, and host<->device transfers.

Kernels (McCalpin's STREAM, stream.c v5.10, plus read-only and write-only), on fp64 arrays as STREAM's default double:
copy c=a, scale b=q*c, add c=a+b, triad a=b+q*c, read-only sum(a), write-only fill(a), each with
out= so nothing is allocated in the timed window. Bytes are counted as STREAM does (copy and scale
2 arrays, add and triad 3, read and write 1; write-allocate not counted) and the output says so.
Arrays are at least 4x the last-level cache (STREAM v5.10's rule); the figure of merit is the best
iteration after a warm-up, as STREAM reports, with the median beside it. This is "STREAM-like",
not STREAM: STREAM's licence reserves the name for the unmodified program.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tutor.bench.counting import compare_with_peak, gbps, stream_bytes, stream_bytes_counting
from tutor.bench.environment import cpu_llc_bytes, peak_memory_gbps
from tutor.bench.timing import BenchCancelled, Timing, time_case, use_all_cpu_threads
from tutor.errors import UserError
from tutor.hardware.machine import Machine
from tutor.theory.interconnect import PCIE_GENERATIONS, pcie_bandwidth_bytes_per_s

if TYPE_CHECKING:
    import torch

BANDWIDTH_OPS = ("copy", "scale", "add", "triad", "read", "write")
ELEMENT_BYTES = 8  # fp64, STREAM's default STREAM_TYPE double
STREAM_SCALAR = 3.0  # STREAM's q
# STREAM reports the best of NTIMES=10 iterations, the first excluded; we stop at 10 as well.
MAX_ITERS_PER_OP = 10
MIN_ITERS_PER_OP = 2
# Arrays are filled by tiling one random block (memory speed) instead of drawing every element
# (randn of 3 GB takes ~7 s on 2 cores); the arrays are rounded up to a whole number of blocks.
FILL_BLOCK_ELEMENTS = 2**20
# GPUs: HBM, not L2, must be measured: at least 1 GiB per array (an H100 has 50 MB of L2).
GPU_MIN_ARRAY_BYTES = 2**30
TRANSFER_BYTES = 256 * 2**20


@dataclass(frozen=True)
class BandwidthResult:
    """One STREAM-like kernel (kind "bandwidth") or one host<->device copy (kind "transfer")."""

    device: str
    op: str
    bytes: int  # bytes credited per iteration, as `bytes_counting` says
    bytes_counting: str
    array_bytes: int  # size of one array
    gbps_median: float
    gbps_best: float
    peak_gbps: float | None
    percent_of_peak: float | None
    iters: int
    noisy: bool
    spread: float
    notes: tuple[str, ...]
    memory: str = ""  # transfers: "pinned" or "pageable"
    kind: str = "bandwidth"
    # Every array size timed (tutor.bench.cache_sweep): the cache sweep for copy and triad on a CPU,
    # else the one size of the result.
    sweep: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "kind": self.kind, "device": self.device, "op": self.op, "bytes": self.bytes,
            "bytes_counting": self.bytes_counting, "array_bytes": self.array_bytes,
            "gbps_median": self.gbps_median, "gbps_best": self.gbps_best, "peak_gbps": self.peak_gbps,
            "percent_of_peak": self.percent_of_peak, "iters": self.iters, "noisy": self.noisy,
            "spread": self.spread, "notes": list(self.notes),
        }
        if self.kind == "transfer":
            data["memory"] = self.memory
        data["sweep"] = [dict(point) for point in self.sweep] or [
            {"op": self.op, "size_bytes": self.bytes if self.kind == "bandwidth" else self.array_bytes,
             "array_bytes": self.array_bytes,
             "gbps": self.gbps_best, "gbps_median": self.gbps_median}]
        return data


def stream_array_elements(cache_bytes: int, free_bytes: int | None, *, arrays: int = 3,
                          min_array_bytes: int = 0) -> tuple[int, str]:
    """Elements per fp64 array: at least 4x the cache (STREAM v5.10) and `min_array_bytes`,
    rounded up to whole fill blocks; shrunk to fit half the free memory, with a note when it is."""
    wanted = max(4 * cache_bytes, min_array_bytes)
    elements = -(-wanted // ELEMENT_BYTES)
    elements = -(-elements // FILL_BLOCK_ELEMENTS) * FILL_BLOCK_ELEMENTS
    note = ""
    if free_bytes is not None and arrays * elements * ELEMENT_BYTES > free_bytes // 2:
        elements = max(FILL_BLOCK_ELEMENTS, (free_bytes // 2 // arrays // ELEMENT_BYTES)
                       // FILL_BLOCK_ELEMENTS * FILL_BLOCK_ELEMENTS)
        note = "arrays below 4x cache: not enough free memory"
    return elements, note


def parse_ops(text: str | None) -> tuple[str, ...]:
    if text is None:
        return BANDWIDTH_OPS
    ops = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    for op in ops:
        if op not in BANDWIDTH_OPS:
            raise UserError(f"unknown bandwidth op {op!r} (choose from {', '.join(BANDWIDTH_OPS)})")
    if not ops:
        raise UserError(f"no bandwidth op given (choose from {', '.join(BANDWIDTH_OPS)})")
    return ops


def _free_bytes(device: str) -> int | None:
    if device == "cpu":
        import psutil

        return int(psutil.virtual_memory().available)
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return int(free)


def _cache_bytes(device: str, machine: Machine) -> tuple[int, str]:
    if device == "cpu":
        return cpu_llc_bytes(machine)
    import torch

    l2 = int(getattr(torch.cuda.get_device_properties(torch.device(device)), "L2_cache_size", 0) or 0)
    if l2:
        return l2, "L2 reported by torch"
    return 256 * 10**6, "L2 unknown: assumed 256 MB"


def _random_arrays(count: int, elements: int, device: str) -> list[Any]:
    import torch

    generator = torch.Generator(device="cpu").manual_seed(0)
    arrays = []
    for _ in range(count):
        block = torch.rand(FILL_BLOCK_ELEMENTS, dtype=torch.float64, generator=generator).to(device) + 0.5
        array = torch.empty(elements, dtype=torch.float64, device=device)
        array.view(-1, FILL_BLOCK_ELEMENTS).copy_(block)
        arrays.append(array)
    return arrays


def _kernels(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> dict[str, Callable[[], torch.Tensor]]:
    import torch

    q = STREAM_SCALAR
    return {
        "copy": lambda: c.copy_(a),
        "scale": lambda: torch.mul(c, q, out=b),
        "add": lambda: torch.add(a, b, out=c),
        "triad": lambda: torch.add(b, c, alpha=q, out=a),
        "read": lambda: torch.sum(a),
        "write": lambda: a.fill_(q),
    }


def _result(device: str, op: str, n_bytes: int, counting: str, array_bytes: int, timing: Timing,
            peak: float | None, notes: list[str], *, kind: str = "bandwidth", memory: str = "") -> BandwidthResult:
    median, best = gbps(n_bytes, timing.median_s), gbps(n_bytes, timing.best_s)
    comparison = compare_with_peak(best, peak)
    all_notes = list(notes)
    if timing.noisy:
        all_notes.append(f"noisy: spread {timing.spread:.0%}")
    if comparison.peak is not None and comparison.percent is None:
        all_notes.append(comparison.note)
    return BandwidthResult(
        device=device, op=op, bytes=n_bytes, bytes_counting=counting, array_bytes=array_bytes,
        gbps_median=median, gbps_best=best, peak_gbps=comparison.peak, percent_of_peak=comparison.percent,
        iters=timing.iters, noisy=timing.noisy, spread=timing.spread, notes=tuple(all_notes),
        memory=memory, kind=kind,
    )


def memory_bandwidth(device: str, *, budget_s: float, machine: Machine, ops: tuple[str, ...] = BANDWIDTH_OPS,
                     cancel: threading.Event | None = None, array_elements: int | None = None,
                     sweep: bool | None = None) -> list[BandwidthResult]:
    """STREAM-like kernels on `device` within about `budget_s` (the arrays are never made smaller
    than 4x the cache to fit the budget: each op then runs its minimum iterations).
    `array_elements` overrides the cache rule (tests). Keeps finished ops when cancelled.
    `sweep` (default: on a CPU, unless `array_elements` is given) also times copy and triad from
    below L1 to beyond the last-level cache (tutor.bench.cache_sweep) with SWEEP_SHARE of the budget."""
    if sweep is None:
        sweep = device == "cpu" and array_elements is None
    if device == "cpu":
        use_all_cpu_threads()
    if sweep:
        sweep_budget = budget_s * SWEEP_SHARE
        budget_s -= sweep_budget
    start = time.perf_counter()
    notes: list[str] = []
    if array_elements is None:
        cache, cache_source = _cache_bytes(device, machine)
        array_elements, size_note = stream_array_elements(
            cache, _free_bytes(device), min_array_bytes=0 if device == "cpu" else GPU_MIN_ARRAY_BYTES)
        if cache_source.endswith(("assumed 32 MiB", "assumed 256 MB")):
            notes.append(cache_source)
        if size_note:
            notes.append(size_note)
    a, b, c = _random_arrays(3, array_elements, device)
    kernels = _kernels(a, b, c)
    peak = peak_memory_gbps(machine, device)
    array_bytes = array_elements * ELEMENT_BYTES
    results: list[BandwidthResult] = []
    ordered = [op for op in BANDWIDTH_OPS if op in ops]  # write-only last: it leaves a constant
    for index, op in enumerate(ordered):
        remaining = budget_s - (time.perf_counter() - start)
        share = max(remaining / (len(ordered) - index), 1e-3)
        try:
            timing = time_case(kernels[op], device=device, warmup=1, budget_s=share, min_iters=MIN_ITERS_PER_OP,
                               max_iters=MAX_ITERS_PER_OP, cancel=cancel)
        except BenchCancelled:
            break
        n_bytes = stream_bytes(op, array_elements, ELEMENT_BYTES)
        results.append(_result(device, op, n_bytes, stream_bytes_counting(op, ELEMENT_BYTES), array_bytes,
                               timing, peak, notes))
        if timing.cancelled:
            break
    del a, b, c, kernels
    if sweep and results and not (cancel is not None and cancel.is_set()):
        results = _with_cache_sweeps(results, machine, sweep_budget, cancel)
    return results


SWEEP_SHARE = 0.4


def _with_cache_sweeps(results: list[BandwidthResult], machine: Machine, budget_s: float,
                       cancel: threading.Event | None) -> list[BandwidthResult]:
    """The results with a cache sweep attached to each op in SWEEP_OPS, the budget split between them."""
    import dataclasses

    from tutor.bench.cache_sweep import SWEEP_OPS, cache_sweep, sweep_array_bytes

    llc, _source = cpu_llc_bytes(machine)
    sizes = sweep_array_bytes(llc)
    swept = [result for result in results if result.op in SWEEP_OPS]
    out = list(results)
    for index, result in enumerate(swept):
        points = cache_sweep(result.op, sizes, budget_s=budget_s / len(swept), cancel=cancel)
        if points:
            out[out.index(result)] = dataclasses.replace(
                result, sweep=tuple(point.to_json() for point in points))
        if cancel is not None and cancel.is_set():
            break
    return out


def pcie_link_peak_gbps(machine: Machine, device: str) -> tuple[float | None, str]:
    """(GB/s one way of the GPU's PCIe link at its max generation and width, a note), or (None, why)."""
    gpu = machine.gpu_for(device)
    generation = gpu.pcie_generation_max if gpu is not None else None
    width = gpu.pcie_width_max if gpu is not None else None
    if not generation or not width or generation not in PCIE_GENERATIONS:
        return None, "PCIe link unknown (NVML)"
    return pcie_bandwidth_bytes_per_s(generation, width) / 1e9, f"PCIe Gen{generation} x{width} link, one way"


def host_device_transfer(device: str, *, budget_s: float, machine: Machine, cancel: threading.Event | None = None,
                         size_bytes: int = TRANSFER_BYTES) -> list[BandwidthResult]:
    """Host-to-device and device-to-host copies of `size_bytes`, from pinned and from pageable host
    memory (NVIDIA nvbandwidth pins; CUDA samples' bandwidthTest offers both). Buffer counted once.
    The peak is one direction of the GPU's PCIe link at its maximum generation and width (NVML),
    tutor.theory.interconnect.pcie_bandwidth_bytes_per_s; a slower host slot caps it lower."""
    if not device.startswith("cuda"):
        raise UserError("host<->device transfers need a CUDA device (try --device cuda:0)")
    import torch

    elements = max(1, size_bytes // 4)
    device_buffer = torch.randn(elements, device=device)
    pageable = torch.randn(elements)
    pinned = pageable.pin_memory()
    cases = [
        ("h2d", "pinned", lambda: device_buffer.copy_(pinned, non_blocking=True)),
        ("h2d", "pageable", lambda: device_buffer.copy_(pageable)),
        ("d2h", "pinned", lambda: pinned.copy_(device_buffer, non_blocking=True)),
        ("d2h", "pageable", lambda: pageable.copy_(device_buffer)),
    ]
    peak, link_note = pcie_link_peak_gbps(machine, device)
    start = time.perf_counter()
    results: list[BandwidthResult] = []
    for index, (op, memory, fn) in enumerate(cases):
        share = max((budget_s - (time.perf_counter() - start)) / (len(cases) - index), 1e-3)
        try:
            timing = time_case(fn, device=device, warmup=1, budget_s=share, min_iters=MIN_ITERS_PER_OP,
                               max_iters=MAX_ITERS_PER_OP, cancel=cancel)
        except BenchCancelled:
            break
        n_bytes = stream_bytes(op, elements, 4)
        results.append(_result(device, op, n_bytes, stream_bytes_counting(op, 4) + f"; {memory} host memory",
                               elements * 4, timing, peak, [link_note] if link_note else [], kind="transfer",
                               memory=memory))
        if timing.cancelled:
            break
    return results
