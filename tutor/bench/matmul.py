"""Maximum achievable matmul throughput: a mamf-finder style sweep of shapes per dtype.

Method (Stas Bekman's mamf-finder, stas00/ml-engineering compute/accelerator/benchmarks): C = A @ B with random normal inputs, B column-major as in
mamf-finder; TFLOP/s = 2mnk / t (decimal); on CUDA the output is re-randomised and L2 flushed
before each iteration, outside the timed window. The headline of a dtype is the shape with the best
median ("measured") and its best iteration ("burst").

On a CPU every installed GEMM backend is measured: torch (MKL / oneDNN / OpenBLAS as torch was
built) and numpy's BLAS (fp32 only: numpy has no bf16 and its fp16 matmul does not use BLAS).
Sizes adapt to the budget: start at a small square, time it until its timing is stable, grow while
the next size fits, so an emulated bf16 GEMM ~100x slower than fp32 still finishes in time. Growth
stops early once a real-sized square is stable and no faster than the sizes before it (the rate has
plateaued), and the headline is the best *stable* timing: a size whose iterations would not settle
(another program shared the cores) never becomes the result. How busy the machine was is measured
over the sweep (tutor.bench.busy) and said beside the figure.

Timing starts only on a warm library: `warm_up` (import, thread pool, first GEMM, CUDA context)
runs before any budget clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tutor.bench.busy import BusyMeter, BusyShare
from tutor.bench.counting import compare_with_peak, tflops
from tutor.bench.environment import cpu_flags, peak_tflops
from tutor.bench.timing import STABLE_MIN_ITERS, BenchCancelled, Timing, time_case, use_all_cpu_threads
from tutor.errors import UserError
from tutor.hardware.machine import Machine
from tutor.theory.flops import matmul_flops

if TYPE_CHECKING:
    import torch

MATMUL_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
# Squares tried in order; growth stops at the first that no longer fits the budget.
CPU_LADDER = (128, 256, 512, 768, 1024, 1536, 2048, 3072, 4096)
GPU_LADDER = (1024, 2048, 4096, 6144, 8192, 12288, 16384)
# Below these a result is labelled "small size": launch and cache effects dominate.
SMALL_CPU, SMALL_GPU = 1024, 4096
# mamf-finder times 100 iterations per shape; we never need more.
MAX_ITERS_PER_SHAPE = 100
# Timed iterations a shape needs to enter the sweep (plus one warm-up).
MIN_ITERS_PER_SHAPE = 3
# A square may take this share of the budget left when it starts ...
GROW_SLICE = 0.3
# ... but a square below the real-size threshold at most this share of the whole budget, so that a
# busy machine, where tiny GEMMs never settle, still leaves the budget to the sizes that matter.
SMALL_SLICE = 0.1
# Growth stops when a stable real-sized square is at most this much faster than the best stable
# square before it: mamf-finder sweeps further, but on a plateau the next size costs (ratio)^3 more
# time for a gain inside the run-to-run noise.
PLATEAU_GAIN = 0.05
# The next size is started only if its predicted cost is under this share of what is left.
FIT_SHARE = 0.6


@dataclass(frozen=True)
class MatmulShape:
    """One timed shape of a sweep."""

    m: int
    n: int
    k: int
    tflops_median: float
    tflops_best: float
    iters: int
    noisy: bool  # its timing did not settle (see `settled`)
    spread: float = 0.0  # (p90 - p10) / median of its iteration times

    def to_json(self) -> dict[str, Any]:
        return {"m": self.m, "n": self.n, "k": self.k, "tflops_median": self.tflops_median,
                "tflops_best": self.tflops_best, "iters": self.iters, "noisy": self.noisy, "spread": self.spread}

    @property
    def label(self) -> str:
        return f"{self.m}x{self.n}x{self.k}"


@dataclass(frozen=True)
class MatmulResult:
    """The best shape of one dtype on one backend, with the whole sweep behind it."""

    device: str
    dtype: str
    backend: str
    m: int
    n: int
    k: int
    tflops_median: float
    tflops_best: float
    tflops_mean: float
    peak_tflops: float | None
    percent_of_peak: float | None
    peak_source: str
    iters: int
    noisy: bool
    spread: float
    notes: tuple[str, ...]  # short reasons for the gap to peak, shown in the table
    peak_note: str = ""  # "" or why there is no percent (peak unknown, measured above peak)
    sweep: tuple[MatmulShape, ...] = field(default_factory=tuple)
    headline: bool = True  # the best backend for this dtype on this device
    kind: str = "matmul"
    stable: bool = True  # the headline shape's timing settled (not noisy)
    busy: BusyShare | None = None  # other processes' CPU share during this sweep
    fixed_size: bool = False  # the fixed-size case (fixed_size_matmul), not a sweep: `headline` is False

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "device": self.device, "dtype": self.dtype, "m": self.m, "n": self.n,
            "k": self.k, "backend": self.backend, "tflops_median": self.tflops_median,
            "tflops_best": self.tflops_best, "tflops_mean": self.tflops_mean,
            "peak_tflops": self.peak_tflops, "percent_of_peak": self.percent_of_peak,
            "peak_source": self.peak_source, "peak_note": self.peak_note, "iters": self.iters, "noisy": self.noisy,
            "spread": self.spread, "notes": list(self.notes), "headline": self.headline, "stable": self.stable,
            "busy": self.busy.to_json() if self.busy is not None else None,
            "sweep": [shape.to_json() for shape in self.sweep], **({"fixed_size": True} if self.fixed_size else {}),
        }


def supported_matmul_dtypes(device: str) -> tuple[str, ...]:
    """Dtypes this device can multiply: CPU fp32/bf16/fp16 (bf16/fp16 may be emulated);
    CUDA fp32 and fp16 everywhere, tf32/bf16 from compute capability 8.0 (Ampere), fp8 from 8.9
    (Ada/Hopper) when torch has `_scaled_mm`."""
    if device == "cpu":
        return ("fp32", "bf16", "fp16")
    import torch

    major, minor = torch.cuda.get_device_capability(torch.device(device))
    dtypes = ["fp32"]
    if major >= 8:
        dtypes += ["tf32", "bf16"]
    dtypes.append("fp16")
    if (major, minor) >= (8, 9) and hasattr(torch, "_scaled_mm") and hasattr(torch, "float8_e4m3fn"):
        dtypes.append("fp8")
    return tuple(dtypes)


def parse_dtypes(text: str | None, device: str) -> tuple[str, ...]:
    """'fp32,bf16' -> ('fp32', 'bf16'); None -> every dtype the device supports.
    Unknown names and dtypes the device cannot run are UserErrors."""
    supported = supported_matmul_dtypes(device)
    if text is None:
        return supported
    names = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    if not names:
        raise UserError(f"--dtype is empty (choose from {', '.join(MATMUL_DTYPES)})")
    for name in names:
        if name not in MATMUL_DTYPES:
            raise UserError(f"unknown dtype {name!r} (choose from {', '.join(MATMUL_DTYPES)})")
        if name not in supported:
            raise UserError(f"{name} matmul is not available on {device} (it supports {', '.join(supported)})")
    return names


def torch_backend_name(device: str) -> str:
    """Which library torch's GEMM calls on this device, e.g. 'torch/mkl+onednn' or 'torch/cublas'."""
    import torch

    if device.startswith("cuda"):
        return "torch/hipblas" if getattr(torch.version, "hip", None) else "torch/cublas"
    config = torch.__config__.show()
    blas = "blas"
    for part in config.replace(",", " ").split():
        if part.startswith("BLAS_INFO="):
            blas = part.split("=", 1)[1] or blas
    if torch.backends.mkldnn.is_available():
        blas += "+onednn"
    return f"torch/{blas}"


def numpy_backend_name() -> str:
    """numpy's BLAS as numpy.show_config reports it, e.g. 'numpy/scipy-openblas 0.3.31'."""
    import numpy

    try:
        config = numpy.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"numpy/{blas.get('name', 'blas')} {blas.get('version', '')}".strip()
    except (TypeError, KeyError):  # numpy < 1.25 has no mode="dicts"; a build that names no BLAS
        return "numpy/blas"


def torch_dtype(dtype: str):
    """The torch dtype a dtype name (fp32, tf32, bf16, fp16) stores in: tf32 is a compute mode on fp32 tensors."""
    import torch

    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16,
            "fp16": torch.float16}[dtype]


def scaled_mm(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """torch._scaled_mm with unit scales on both schemas: keyword scales work on torch 2.3/2.4
    (keyword-only scale_a/scale_b, returns (out, amax)) and 2.5+ (positional, returns out)."""
    import torch

    out = torch._scaled_mm(a, b, scale_a=scale, scale_b=scale, out_dtype=out_dtype)
    return out[0] if isinstance(out, tuple) else out


class _TorchCase:
    """A prepared torch matmul of one shape: random inputs, B column-major, output preallocated."""

    def __init__(self, m: int, n: int, k: int, dtype: str, device: str) -> None:
        import torch

        self.device = device
        if dtype == "fp8":
            # mamf-finder: inputs made in fp32 and cast to float8_e4m3fn, B column-major, unit scales.
            self.a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
            self.b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
            self.scale = torch.tensor(1.0, device=device)
            self.out = None
            self.fn: Callable[[], object] = lambda: scaled_mm(self.a, self.b, self.scale, torch.bfloat16)
            self.setup = None
            return
        stored = torch_dtype(dtype)
        self.a = torch.randn(m, k, device=device, dtype=stored)
        self.b = torch.randn(n, k, device=device, dtype=stored).t()
        self.out = torch.randn(m, n, device=device, dtype=stored)
        self.fn = lambda: torch.mm(self.a, self.b, out=self.out)
        # Re-randomising the output before each iteration keeps the power draw of a real write
        # (mamf-finder); only on GPUs, where the power-cap effect was measured.
        self.setup = None
        if device.startswith("cuda"):
            fresh = torch.randn(m, n, device=device, dtype=stored)
            self.setup = lambda: self.out.copy_(fresh)


class _NumpyCase:
    def __init__(self, m: int, n: int, k: int) -> None:
        import numpy

        rng = numpy.random.default_rng(0)
        self.a = rng.standard_normal((m, k), dtype=numpy.float32)
        self.b = rng.standard_normal((n, k), dtype=numpy.float32).T
        self.out = numpy.empty((m, n), dtype=numpy.float32)
        self.fn: Callable[[], object] = lambda: numpy.matmul(self.a, self.b, out=self.out)
        self.setup = None


def _precision_context(dtype: str, device: str):
    """TF32 on for 'tf32', off ('highest') for everything else; restored afterwards."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def context():
        try:
            previous: str | None = torch.get_float32_matmul_precision()
        except RuntimeError:  # the fp32_precision API (torch 2.9+) is in use: leave it as the user set it
            previous = None
        torch.set_float32_matmul_precision("high" if dtype == "tf32" else "highest")
        try:
            yield
        finally:
            if previous is not None:
                torch.set_float32_matmul_precision(previous)

    return context()


def warm_up(device: str) -> None:
    """Load torch and leave it warm before any budget clock starts: the import, the intra-op thread
    pool, the BLAS handles and (on CUDA) the context are one-time costs (first-call
    overheads every benchmark harness warms up past: Triton do_bench, torch.utils.benchmark), not matmul time. Cheap when torch is already warm."""
    import torch

    if device == "cpu":
        use_all_cpu_threads()
    a = torch.randn(256, 256, device=device)
    torch.mm(a, a)
    if device.startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def _measure_shape(make_case: Callable[[int, int, int], Any], m: int, n: int, k: int, *, device: str,
                   budget_s: float, cancel: threading.Event | None,
                   timer: Callable[[], float] = time.perf_counter) -> tuple[MatmulShape, Timing]:
    case = make_case(m, n, k)
    timing = time_case(case.fn, device=device, warmup=1, budget_s=budget_s, min_iters=MIN_ITERS_PER_SHAPE,
                       max_iters=MAX_ITERS_PER_SHAPE, flush_l2=device.startswith("cuda"), setup=case.setup,
                       cancel=cancel, until_stable=True, timer=timer)
    flops = matmul_flops(m, n, k)
    shape = MatmulShape(m=m, n=n, k=k, tflops_median=tflops(flops, timing.median_s),
                        tflops_best=tflops(flops, timing.best_s), iters=timing.iters, noisy=not settled(timing),
                        spread=timing.spread)
    del case
    return shape, timing


def settled(timing: Timing) -> bool:
    """A timing to trust: at least STABLE_MIN_ITERS iterations and not noisy (three quiet samples that a
    run cut short at its minimum can look steady by chance)."""
    return timing.iters >= STABLE_MIN_ITERS and not timing.noisy


def headline_entry(measured: list[tuple[MatmulShape, Timing]]) -> tuple[MatmulShape, Timing]:
    """The entry a sweep reports: the best median among the shapes whose timing was stable, so a noisy
    size never outranks a settled one. When none settled, the best median of all: interference from
    other programs only ever adds time (Python's timeit documentation: "higher values ... are
    typically ... caused by other processes interfering"), so the fastest median is the least wrong."""
    stable = [item for item in measured if settled(item[1])]
    return max(stable or measured, key=lambda item: item[0].tflops_median)


def _plateaued(measured: list[tuple[MatmulShape, Timing]]) -> bool:
    """The last square is stable and at most PLATEAU_GAIN faster than the best stable square before it."""
    last_shape, last_timing = measured[-1]
    earlier = [shape.tflops_median for shape, timing in measured[:-1] if settled(timing)]
    return settled(last_timing) and bool(earlier) and last_shape.tflops_median <= max(earlier) * (1 + PLATEAU_GAIN)


def _predicted_cost_s(measured: list[tuple[MatmulShape, Timing]], m: int, n: int, k: int) -> float:
    """Seconds for one warm-up and MIN_ITERS_PER_SHAPE iterations of m x n x k, from the fastest rate
    any shape reached so far (a tiny GEMM on a busy machine is latency, not work: scaling its time by
    (size ratio)^3 would stop growth at once)."""
    best_rate = max(shape.tflops_best for shape, _ in measured)
    return matmul_flops(m, n, k) / (best_rate * 1e12) * (MIN_ITERS_PER_SHAPE + 1)


def sweep_shapes(make_case: Callable[[int, int, int], Any], *, device: str, budget_s: float,
                 ladder: tuple[int, ...], cancel: threading.Event | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 real_size: int = 0) -> list[tuple[MatmulShape, Timing]]:
    """Time squares from the ladder in order, each until its timing is stable, growing while the next
    one fits the budget.

    A square takes GROW_SLICE of the time left (below `real_size` at most SMALL_SLICE of the budget)
    and stops as soon as its iterations are stable. Growth stops when the next size's predicted cost
    exceeds FIT_SHARE of the time left, or once a square of at least `real_size` is stable and no more
    than PLATEAU_GAIN faster than the best stable square before it. Then, mamf style, two non-square
    neighbours of the headline square (m = 3/4 and 5/4 of it) when time is left; last, if the
    headline's timing is still noisy, it is timed again with what is left and the steadier timing
    kept. `clock` times the iterations and the budget (a test injects a fake one). Returns (shape,
    timing) in the order measured; stops early, keeping what finished, on cancel.
    """
    deadline = clock() + budget_s
    measured: list[tuple[MatmulShape, Timing]] = []
    for size in ladder:
        remaining = deadline - clock()
        if measured and _predicted_cost_s(measured, size, size, size) > remaining * FIT_SHARE:
            break
        if cancel is not None and cancel.is_set():
            break
        share = remaining * GROW_SLICE if size >= real_size else min(remaining * GROW_SLICE, budget_s * SMALL_SLICE)
        try:
            measured.append(_measure_shape(make_case, size, size, size, device=device, budget_s=max(share, 1e-3),
                                           cancel=cancel, timer=clock))
        except BenchCancelled:
            break
        if measured[-1][1].cancelled:
            return measured
        if size >= real_size and _plateaued(measured):
            break
    if not measured:
        return measured
    best_shape = headline_entry(measured)[0]
    base = best_shape.m
    for m in (base * 3 // 4 // 64 * 64, (base * 5 // 4 + 63) // 64 * 64):
        remaining = deadline - clock()
        if m < 64 or _predicted_cost_s(measured, m, base, base) > remaining * FIT_SHARE or (
                cancel is not None and cancel.is_set()):
            continue
        try:
            measured.append(_measure_shape(make_case, m, base, base, device=device,
                                           budget_s=max(remaining * 0.4, 1e-3), cancel=cancel, timer=clock))
        except BenchCancelled:
            return measured
    _retime_if_noisy(measured, make_case, device=device, deadline=deadline, cancel=cancel, clock=clock)
    return measured


def _retime_if_noisy(measured: list[tuple[MatmulShape, Timing]], make_case: Callable[[int, int, int], Any], *,
                     device: str, deadline: float, cancel: threading.Event | None,
                     clock: Callable[[], float]) -> None:
    """Time the headline shape once more with the time left when its timing is noisy; the steadier of
    the two timings stays in `measured` (in place of the first)."""
    shape, timing = headline_entry(measured)
    remaining = deadline - clock()
    if settled(timing) or (cancel is not None and cancel.is_set()) or (
            _predicted_cost_s(measured, shape.m, shape.n, shape.k) > remaining * FIT_SHARE):
        return
    try:
        again = _measure_shape(make_case, shape.m, shape.n, shape.k, device=device, budget_s=max(remaining, 1e-3),
                               cancel=cancel, timer=clock)
    except BenchCancelled:
        return
    if settled(again[1]) or again[1].spread < timing.spread:
        index = next(i for i, item in enumerate(measured) if item[0] is shape)
        measured[index] = again


def stability_notes(sweep: list[tuple[MatmulShape, Timing]], headline: MatmulShape, timing: Timing,
                    busy: BusyShare | None) -> tuple[str, ...]:
    """What a reader needs to trust the figure: how busy the machine was (when it was, or when the
    timings were noisy anyway), and which timing the figure comes from when some sizes would not settle."""
    notes = []
    noisy = sum(1 for _, item in sweep if not settled(item))
    if busy is not None and (busy.busy or noisy):
        notes.append(busy.describe())
    if noisy and settled(timing):
        notes.append(f"best stable timing shown ({headline.label}, {timing.iters} iterations); "
                     f"{noisy} of {len(sweep)} sizes did not settle")
    elif not settled(timing):
        notes.append(f"no size settled: the best median ({headline.label}) is shown, spread {timing.spread:.0%}")
    return tuple(notes)


def _gap_notes(device: str, dtype: str, best: MatmulShape, timing: Timing, flags: frozenset[str],
               fp32_tflops: float | None, above_peak_note: str) -> tuple[str, ...]:
    """Short reasons for the gap to peak, for the table's last column."""
    notes = []
    if device == "cpu" and dtype == "bf16" and flags and not flags & {"avx512_bf16", "amx_bf16"}:
        notes.append("emulated bf16: no AVX512-BF16")
    if device == "cpu" and dtype == "fp16" and flags and not flags & {"avx512_fp16", "amx_fp16"}:
        notes.append("emulated fp16: no AVX512-FP16")
    if device == "cpu" and dtype in ("bf16", "fp16") and fp32_tflops and best.tflops_median < fp32_tflops:
        notes.append(f"slower than fp32: no native {dtype} GEMM")
    if max(best.m, best.n, best.k) < (SMALL_CPU if device == "cpu" else SMALL_GPU):
        notes.append("small size")
    if above_peak_note:
        notes.append(above_peak_note)
    return tuple(notes)


def matmul_throughput(device: str, dtype: str, *, budget_s: float, machine: Machine,
                      cancel: threading.Event | None = None, include_numpy: bool = True,
                      fp32_tflops: float | None = None, threads: int | None = None) -> list[MatmulResult]:
    """Sweep `dtype` on `device` within `budget_s` seconds: one result per backend (torch, and
    numpy for fp32 on a CPU), the faster marked `headline`. Empty if cancelled before any shape.
    torch is warmed up (`warm_up`) before the budget starts. `threads` (CPU only) sets torch's
    intra-op threads for the sweep instead of every usable CPU (tutor.bench.free_cores picks it)."""
    if dtype not in supported_matmul_dtypes(device):
        raise UserError(f"{dtype} matmul is not available on {device}")
    warm_up(device)
    if threads is not None and device == "cpu":
        import torch

        torch.set_num_threads(max(1, threads))
    backends: list[tuple[str, Callable[[int, int, int], Any]]] = [
        (torch_backend_name(device), lambda m, n, k: _TorchCase(m, n, k, dtype, device))]
    if device == "cpu" and dtype == "fp32" and include_numpy:
        backends.append((numpy_backend_name(), _NumpyCase))
    ladder = CPU_LADDER if device == "cpu" else GPU_LADDER
    peak, source = peak_tflops(machine, device, dtype)
    flags = cpu_flags(machine) if device == "cpu" else frozenset()
    results: list[MatmulResult] = []
    start = time.perf_counter()
    for index, (backend, make_case) in enumerate(backends):
        share = (budget_s - (time.perf_counter() - start)) / (len(backends) - index)
        meter = BusyMeter.start()
        with _precision_context(dtype, device):
            sweep = sweep_shapes(make_case, device=device, budget_s=max(share, 1e-3), ladder=ladder, cancel=cancel,
                                 real_size=SMALL_CPU if device == "cpu" else SMALL_GPU)
        busy = meter.stop()
        if not sweep:
            break
        best, timing = headline_entry(sweep)
        comparison = compare_with_peak(best.tflops_median, peak, assumed_clock_hz=machine.peak_clock_hz(device))
        results.append(MatmulResult(
            device=device, dtype=dtype, backend=backend, m=best.m, n=best.n, k=best.k,
            tflops_median=best.tflops_median, tflops_best=best.tflops_best,
            tflops_mean=tflops(matmul_flops(best.m, best.n, best.k), timing.mean_s),
            peak_tflops=comparison.peak, percent_of_peak=comparison.percent, peak_source=source,
            iters=timing.iters, noisy=not settled(timing), spread=timing.spread,
            notes=stability_notes(sweep, best, timing, busy) + _gap_notes(
                device, dtype, best, timing, flags, fp32_tflops,
                above_peak_note=comparison.note if comparison.peak and comparison.percent is None else ""),
            peak_note=comparison.note,
            sweep=tuple(shape for shape, _ in sweep), stable=settled(timing), busy=busy,
        ))
        if cancel is not None and cancel.is_set():
            break
    if len(results) > 1:
        top = max(results, key=lambda result: (result.stable, result.tflops_median))
        results = [_replace_headline(result, result is top) for result in results]
    return results


def fixed_matmul_size(device: str) -> int:
    """The one square every run measures, so any two runs compare at the same size: the real-size
    threshold (SMALL_CPU on a CPU, SMALL_GPU on a GPU), the smallest square not labelled "small size".
    1024³ fp32 is 2.1 GFLOP, a few tens of ms a GEMM on 2 cores: it fits `bench --quick`."""
    return SMALL_CPU if device == "cpu" else SMALL_GPU


def fixed_size_matmul(device: str, dtype: str = "fp32", *, budget_s: float, machine: Machine,
                      cancel: threading.Event | None = None) -> list[MatmulResult]:
    """One square of fixed_matmul_size(device) with torch, timed until stable within `budget_s`: the
    figure `bench history --compare` can always compare, whatever sizes the sweeps of two runs settled
    on. Empty if cancelled before an iteration finished."""
    if dtype not in supported_matmul_dtypes(device):
        raise UserError(f"{dtype} matmul is not available on {device}")
    warm_up(device)
    size = fixed_matmul_size(device)
    peak, source = peak_tflops(machine, device, dtype)
    meter = BusyMeter.start()
    try:
        with _precision_context(dtype, device):
            shape, timing = _measure_shape(lambda m, n, k: _TorchCase(m, n, k, dtype, device), size, size, size,
                                           device=device, budget_s=max(budget_s, 1e-3), cancel=cancel)
    except BenchCancelled:
        return []
    busy = meter.stop()
    comparison = compare_with_peak(shape.tflops_median, peak, assumed_clock_hz=machine.peak_clock_hz(device))
    notes = [f"fixed size {size}² in every run"]
    if not settled(timing):
        notes.append(f"did not settle: spread {timing.spread:.0%}")
    if busy is not None and (busy.busy or not settled(timing)):
        notes.append(busy.describe())
    return [MatmulResult(
        device=device, dtype=dtype, backend=torch_backend_name(device), m=size, n=size, k=size,
        tflops_median=shape.tflops_median, tflops_best=shape.tflops_best,
        tflops_mean=tflops(matmul_flops(size, size, size), timing.mean_s), peak_tflops=comparison.peak,
        percent_of_peak=comparison.percent, peak_source=source, iters=timing.iters, noisy=not settled(timing),
        spread=timing.spread, notes=tuple(notes), peak_note=comparison.note, sweep=(shape,), stable=settled(timing),
        busy=busy, fixed_size=True, headline=False)]  # not a sweep's headline: readers that pick a dtype's
    # headline result (first_number.py, lab limits) keep the sweep's


def _replace_headline(result: MatmulResult, headline: bool) -> MatmulResult:
    import dataclasses

    return dataclasses.replace(result, headline=headline)
