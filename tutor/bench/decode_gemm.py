"""What a decode step's matmuls and kernels really cost on this device: the two figures `time` needs beyond a
square matmul sweep and a STREAM-like triad.

- Matrix-vector bandwidth (kind "decode_matmul"): a decode step multiplies each weight matrix by one row per
  sequence (m = batch), so it streams the weights and does almost no arithmetic; the kernel a BLAS picks for
  such skinny shapes does not stream at the triad's rate (one thread of the 2-core Xeon dev box: about 15 GB/s
  at m = 1 and 9 GB/s at m = 8 for fp32, against a 38 GB/s triad). Timed as `torch.nn.functional.linear` at
  m = 1 and 8 on weights rotated over ROTATE_BYTES (past the last-level cache, as a real model's weights are),
  bytes = the weights + the input and output rows.
- On CUDA (kind "launch"): the host's cost of one eager kernel launch (a queue of tiny kernels, wall clock
  after it drains) and a CUDA graph's per-kernel floor (the same tiny kernels captured once and replayed,
  timed with CUDA events): the eager and graphs engines of tutor.theory.step_time.
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from tutor.bench.timing import BenchCancelled

DECODE_ROWS = (1, 8)
ROTATE_BYTES = 256 * 2**20          # past the caches of the CPUs measured (the VM's share of a 480 MiB L3)
GPU_ROTATE_BYTES = 1 << 30          # past an H100/H200's 50-60 MB of L2 many times over
# Square weight matrices from a small model's to a large one's: a small matrix streams slower (one thread of the
# 2-core dev box, fp32, m = 1: 14 GB/s at 512², 19-22 GB/s from 1024² up).
CPU_SIDES = (512, 1024, 2048, 4096)
GPU_SIDES = (1024, 2048, 4096, 8192)
REPEATS = 2
LAUNCH_KERNELS = 500


@dataclass(frozen=True)
class DecodeMatmulResult:
    """The bandwidth `torch.nn.functional.linear` reaches at m rows (a decode step's batch) on n x k weights."""

    device: str
    dtype: str
    m: int
    n: int
    k: int
    bytes: int  # per call: the weights + the input and output rows
    gbps_median: float
    iters: int
    kind: str = "decode_matmul"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": self.device, "dtype": self.dtype, "m": self.m, "n": self.n, "k": self.k,
                "bytes": self.bytes, "gbps_median": self.gbps_median, "iters": self.iters,
                "bytes_counting": "weights + input and output rows, once per call"}


@dataclass(frozen=True)
class LaunchResult:
    """One CUDA device's eager launch cost (host seconds per tiny kernel) and a graph's per-kernel floor."""

    device: str
    eager_launch_s: float
    graph_kernel_s: float | None
    kernels: int
    note: str = ""
    kind: str = "launch"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": self.device, "eager_launch_s": self.eager_launch_s,
                "graph_kernel_s": self.graph_kernel_s, "kernels": self.kernels, "note": self.note}


def decode_matmul_bandwidth(device: str, dtype: str, *, budget_s: float,
                            cancel: threading.Event | None = None) -> list[DecodeMatmulResult]:
    """Matrix-vector bandwidth at each of DECODE_ROWS and each weight size on `device` in `dtype` (module
    docstring); the points that finished within `budget_s`, the largest sizes first to go (none if cancelled)."""
    import torch

    from tutor.bench.matmul import torch_dtype

    if dtype not in ("fp32", "bf16", "fp16"):
        return []
    cuda = device.startswith("cuda")
    stored = torch_dtype(dtype)
    element = torch.finfo(stored).bits // 8

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    deadline = time.perf_counter() + budget_s
    results = []
    with torch.no_grad():
        for side in GPU_SIDES if cuda else CPU_SIDES:
            weight_bytes = side * side * element
            copies = max(2, (GPU_ROTATE_BYTES if cuda else ROTATE_BYTES) // weight_bytes)
            weights = [torch.randn(side, side, device=device).to(stored) for _ in range(copies)]
            for m in DECODE_ROWS:
                x = torch.randn(m, side, device=device).to(stored)
                for w in weights[:2]:  # warm: the kernel chosen, its workspace allocated
                    torch.nn.functional.linear(x, w)
                times = []
                for _ in range(REPEATS):
                    if cancel is not None and cancel.is_set():
                        raise BenchCancelled()
                    sync()
                    start = time.perf_counter()
                    for w in weights:
                        torch.nn.functional.linear(x, w)
                    sync()
                    times.append((time.perf_counter() - start) / len(weights))
                moved = weight_bytes + element * (m * side * 2)
                results.append(DecodeMatmulResult(device, dtype, m, side, side, moved,
                                                  moved / statistics.median(times) / 1e9, len(times) * len(weights)))
            del weights
            if time.perf_counter() > deadline:
                break
    return results


def launch_costs(device: str, kernels: int = LAUNCH_KERNELS) -> LaunchResult:
    """The host's cost of launching one tiny kernel eagerly, and a CUDA graph's per-kernel floor, on `device`."""
    import torch

    tiny = torch.ones(1, device=device)
    for _ in range(20):
        tiny.add_(1.0)
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(kernels):
        tiny.add_(1.0)
    torch.cuda.synchronize(device)
    eager = (time.perf_counter() - start) / kernels
    graph_kernel, note = None, ""
    try:
        stream = torch.cuda.Stream(device=device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):  # capture needs a side stream warmed up first (PyTorch CUDA graphs docs)
            for _ in range(3):
                tiny.add_(1.0)
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(kernels):
                tiny.add_(1.0)
        graph.replay()
        torch.cuda.synchronize(device)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(5):
            begin.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(begin.elapsed_time(end) / 1e3 / kernels)
        graph_kernel = statistics.median(times)
    except Exception as error:  # an old driver, a capture refused: eager is still measured
        note = f"CUDA graph capture failed: {type(error).__name__}: {error}"[:200]
    return LaunchResult(device, eager, graph_kernel, kernels, note)
