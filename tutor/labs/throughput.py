"""Throughput probes: matmul TFLOP/s per dtype and STREAM-like memory bandwidth, on this machine.

Both call tutor.bench (its timing core, shape sweep and byte counting) with a lesson-sized budget;
the peaks they are read against come from tutor.hardware (datasheet or CPU formula). The matmul
probe is `tensor-tutor bench matmul`'s code with torch's backend only: the budget starts once torch
is loaded and warm, sizes grow until their timing is stable, and how busy the machine was (other
processes' CPU share, tutor.bench.busy) is reported beside the figures and as `busy` in the JSON.
On a CPU it first waits briefly for free cores and sweeps on the threads they allow
(tutor.bench.free_cores); when cores it gave up are free once it has swept, it sweeps again on them.
"""

from __future__ import annotations

import itertools
import threading
import time

from tutor.formatting import format_bytes, format_rate
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import (
    Param,
    budget_param,
    device_param,
    make_probe,
    resolve_device,
)

# The dtypes a matmul lab may ask for (tutor.bench.matmul.MATMUL_DTYPES; repeated here so that
# building the registry imports nothing from tutor.bench).
MATMUL_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
BANDWIDTH_OPS = ("copy", "scale", "add", "triad", "read", "write")
# Each dtype gets at least this much time, even when the dtypes before it overran their shares.
MIN_SHARE_S = 0.15
FILL_SHARE = 0.5


def _speedup_keys() -> tuple[str, ...]:
    return tuple(f"speedup_{a}_over_{b}" for a, b in itertools.permutations(MATMUL_DTYPES, 2))


def _headline_details(result, threads: int | None = None) -> dict:
    """Which timing a dtype's figure comes from, for the JSON (the rows say it in words); `threads`:
    torch's intra-op threads for it (None: every usable CPU, or not a CPU)."""
    return {"m": result.m, "n": result.n, "k": result.k, "backend": result.backend, "statistic": "median",
            "threads": threads,
            "iters": result.iters, "stable": result.stable, "spread": result.spread,
            "tflops_median": result.tflops_median, "tflops_best": result.tflops_best,
            "sizes_timed": len(result.sweep), "sizes_noisy": sum(1 for shape in result.sweep if shape.noisy),
            "busy": result.busy.to_json() if result.busy is not None else None}


def _where_measured(device: str, machine, threads: int | None, cores: int | None) -> str:
    """Where the headline rate was timed, in the words of its first line: '2 cores', '1 of 2 cores'
    (torch's threads against the cores the wait found), or the GPU's name (else the device)."""
    if device == "cpu":
        if threads is None or cores is None:
            return "the CPU"
        plural = "s" if cores != 1 else ""
        return f"{cores} core{plural}" if threads >= cores else f"{threads} of {cores} core{plural}"
    gpu = machine.gpu_for(device) if machine is not None else None
    return gpu.name if gpu is not None else device


def _matmul_summary(rates: dict[str, float], device: str, busy, any_noisy: bool,
                    unsettled: list[str] | None = None, where: dict[str, str] | None = None) -> str:
    """The result in words. Its first line is the one figure a learner looks for, plainly: the best
    measured rate, its dtype and where it ran ('198 GFLOP/s on fp32, 2 cores'); every rate and what
    may make them read low follow, one per line."""
    if not rates:
        return f"nothing measured on {device}"
    best = max(rates, key=lambda dtype: rates[dtype])
    lines = [f"{format_rate(rates[best], 'TFLOP/s')} on {best}, {(where or {}).get(best, device)}"]
    if len(rates) > 1:
        lines.append(", ".join(f"{dtype} {format_rate(rate, 'TFLOP/s')}" for dtype, rate in rates.items())
                     + f" on {device}")
    if unsettled:
        lines.append(f"{', '.join(unsettled)} could not get a stable timing at any size, even swept twice: the "
                     "figure is the best median it saw, and it may read low")
    if busy.busy:
        lines.append(f"{busy.describe()}, so it may read low: run it again when the machine is quiet")
    elif any_noisy:
        lines.append(f"some sizes did not settle, though {busy.describe()}")
    return "\n".join(lines)


def largest_matmul_bytes(device: str, dtypes: list[str]) -> int:
    """Bytes of the largest shape the sweep may prepare: A, B and C (tutor.bench.matmul._TorchCase) of
    the top of the size ladder, grown by the 5/4 neighbour shapes it times around the headline."""
    from tutor.bench.matmul import CPU_LADDER, GPU_LADDER

    side = max(CPU_LADDER if device == "cpu" else GPU_LADDER) * 5 // 4
    element = max((2 if dtype in ("bf16", "fp16") else 4 for dtype in dtypes), default=4)
    return 3 * side * side * element


def _check_matmul_memory(device: str, dtypes: list[str]) -> None:
    """The sizes grow with the budget, not with a parameter, so only the memory of the largest can be
    too much; the time is the budget's."""
    from tutor.labs.limits import check_lab_fits

    need = largest_matmul_bytes(device, dtypes)
    check_lab_fits("matmul", memory_bytes=need, memory_what="A, B and C of the largest shape the sweep may time",
                   device=device, fix="free some memory, or measure on another device")


def _check_bandwidth_memory(device: str, machine) -> None:
    """The three STREAM arrays memory_bandwidth will allocate (tutor.bench.bandwidth's sizing rule)."""
    from tutor.bench.bandwidth import ELEMENT_BYTES, GPU_MIN_ARRAY_BYTES, _cache_bytes, _free_bytes, stream_array_elements
    from tutor.labs.limits import check_lab_fits

    cache, _ = _cache_bytes(device, machine)
    free = _free_bytes(device)
    elements, _ = stream_array_elements(cache, free, min_array_bytes=0 if device == "cpu" else GPU_MIN_ARRAY_BYTES)
    check_lab_fits("bandwidth", memory_bytes=3 * elements * ELEMENT_BYTES,
                   memory_what=f"three arrays of {format_bytes(elements * ELEMENT_BYTES)}", device=device,
                   available=free, fix="free some memory, or measure on another device")


def _matmul(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    progress(0.0, "loading torch")
    from tutor.bench.matmul import supported_matmul_dtypes, warm_up
    from tutor.hardware import detect_machine

    device = resolve_device(params["device"])
    supported = supported_matmul_dtypes(device)
    machine = detect_machine()
    _check_matmul_memory(device, [dtype for dtype in params["dtypes"] if dtype in supported])
    if cancel.is_set():
        return ProbeResult("matmul", (), {}, "cancelled before anything was measured", True, device)
    progress(0.0, f"warming up torch on {device}")
    # The budget is for timing matmuls: loading and warming torch come first, outside it, and on a
    # CPU so does a short wait for the cores the app's interface or other programs still use.
    warm_up(device)
    free = None
    if device == "cpu":
        from tutor.bench.free_cores import wait_for_free_cores

        # No progress report for the wait: each one repaints the app's interface, the very work it waits out.
        free = wait_for_free_cores(cancelled=cancel.is_set)
    try:
        return _matmul_sweeps(params, progress, cancel, device=device, supported=supported, machine=machine,
                              free=free)
    finally:
        if free is not None and free.threads < free.cores:
            from tutor.bench.timing import use_all_cpu_threads

            use_all_cpu_threads()  # the next lab in this process starts with every thread again


def cores_freed_since(free, threads: int | None, cancel: threading.Event) -> int:
    """After a CPU sweep on fewer threads than cores (the wait found them taken): one more look at
    the machine (tutor.bench.free_cores, one window); the threads it allows when more than the
    sweep used, else 0. The other work often ends during the sweep (a burst that outlasted
    the wait by a second left one core's rate, 155-163 GFLOP/s against bench's 314-319)."""
    if free is None or threads is None or threads >= free.cores or cancel.is_set():
        return 0
    from tutor.bench.free_cores import wait_for_free_cores

    now = wait_for_free_cores(max_wait_s=0.0, cancelled=cancel.is_set)
    return now.threads if now.threads > threads else 0


def _better(first, second):
    """The better of two sweeps' headline results: a stable timing first, then the higher median."""
    return max(first, second, key=lambda result: (result.stable, result.tflops_median))


def _matmul_sweeps(params: dict, progress: ProgressFn, cancel: threading.Event, *, device: str,
                   supported: tuple[str, ...], machine, free) -> ProbeResult:
    from tutor.bench.busy import BusyMeter
    from tutor.bench.matmul import matmul_throughput

    threads = free.threads if free is not None else None
    start = time.perf_counter()
    meter = BusyMeter.start()
    dtypes = [dtype for dtype in params["dtypes"] if dtype in supported]
    # A lesson written on a GPU still runs on a laptop: missing dtypes become rows, not errors.
    rows: list[Measurement] = [
        Measurement(label=f"{dtype} matmul", measured=None, unit="TFLOP/s",
                    note=f"not available on {device} (it runs {', '.join(supported)})")
        for dtype in params["dtypes"] if dtype not in supported]
    budget = params["budget_s"]
    metrics: dict[str, float] = {}
    peaks: dict[str, float | None] = {}
    sweeps: dict[str, dict[tuple[int, int, int], float]] = {}
    headlines: dict[str, dict] = {}
    swept_twice: list[str] = []
    cancelled = False
    for index, dtype in enumerate(dtypes):
        if cancel.is_set():
            cancelled = True
            break
        progress(index / len(dtypes), f"{dtype} matmul on {device}")
        remaining = budget - (time.perf_counter() - start)
        share = max(remaining / (len(dtypes) - index), MIN_SHARE_S)
        results = matmul_throughput(device, dtype, budget_s=share, machine=machine, cancel=cancel,
                                    include_numpy=False, fp32_tflops=metrics.get("tflops_fp32"), threads=threads)
        if not results:
            cancelled = True
            break
        best = next(result for result in results if result.headline)
        swept_on = threads
        retry = ""
        freed = cores_freed_since(free, threads, cancel)
        if freed:
            # Cores given up before the sweep are free now: time again on them.
            threads = freed
            retry = f"timing again on {threads} threads, the cores came free"
        elif not best.stable:
            # No size settled within its share: sweep once more rather than report a figure the
            # timing does not support.
            retry = "timing again, it did not settle"
        if retry and not cancel.is_set():
            # Past the budget, at most its share again.
            progress(index / len(dtypes), f"{dtype} matmul on {device}: {retry}")
            again = matmul_throughput(device, dtype, budget_s=share, machine=machine, cancel=cancel,
                                      include_numpy=False, fp32_tflops=metrics.get("tflops_fp32"), threads=threads)
            if again:
                second = next(result for result in again if result.headline)
                best = _better(best, second)
                if best is second:
                    swept_on = threads
                swept_twice.append(dtype)
        metrics[f"tflops_{dtype}"] = best.tflops_median
        headlines[dtype] = _headline_details(best, swept_on)
        peaks[dtype] = best.peak_tflops
        sweeps[dtype] = {(shape.m, shape.n, shape.k): shape.tflops_median for shape in best.sweep}
        # How busy the machine was is said once, in the summary, over the whole run.
        said_in_summary = best.busy.describe() if best.busy is not None else ""
        cores_note = free.describe(threads_used=swept_on) if free is not None else ""
        notes = list(dict.fromkeys(note for note in (*best.notes, best.peak_note, cores_note)
                                   if note and note != said_in_summary))
        rows.append(Measurement(
            label=f"{dtype} matmul, {best.m}x{best.n}x{best.k} ({best.backend})", measured=best.tflops_median,
            unit="TFLOP/s", theory=best.peak_tflops, theory_source=best.peak_source or "no peak known",
            note="; ".join(notes), rate=True))
        if cancel.is_set():
            cancelled = True
            break
    measured = [dtype for dtype in dtypes if f"tflops_{dtype}" in metrics]
    # A ratio of rates means something only at one size: each dtype's best rate may come from a
    # different size (a slow emulated dtype stops growing early), so compare at the largest shape
    # both sweeps timed.
    shared_shape: dict[frozenset[str], tuple[int, int, int] | None] = {}
    for a, b in itertools.combinations(measured, 2):
        common = set(sweeps[a]) & set(sweeps[b])
        shared_shape[frozenset((a, b))] = max(common, key=lambda shape: shape[0] * shape[1] * shape[2]) if common else None
    for a, b in itertools.permutations(measured, 2):
        shape = shared_shape[frozenset((a, b))]
        rate_a, rate_b = (sweeps[a][shape], sweeps[b][shape]) if shape else (metrics[f"tflops_{a}"], metrics[f"tflops_{b}"])
        metrics[f"speedup_{a}_over_{b}"] = rate_a / rate_b
    for a, b in itertools.combinations(measured, 2):
        # Lower precision listed first reads naturally: "bf16 is 0.02x fp32 here".
        low, high = (b, a) if MATMUL_DTYPES.index(a) < MATMUL_DTYPES.index(b) else (a, b)
        peak_low, peak_high = peaks[low], peaks[high]
        theory = peak_low / peak_high if peak_low and peak_high else None
        shape = shared_shape[frozenset((a, b))]
        at = f", both at {shape[0]}x{shape[1]}x{shape[2]}" if shape else ", best rates (no size timed by both)"
        rows.append(Measurement(
            label=f"{low} speed over {high}{at}", measured=metrics[f"speedup_{low}_over_{high}"], unit="x",
            theory=theory, theory_source="ratio of the two theoretical peaks" if theory else "no peak known",
            note="below 1: no native instructions for it, so the work is emulated" if
            metrics[f"speedup_{low}_over_{high}"] < 1 else ""))
    busy = meter.stop()
    progress(1.0, "done")
    summary = _matmul_summary({dtype: metrics[f"tflops_{dtype}"] for dtype in measured}, device, busy,
                              any_noisy=any(headline["sizes_noisy"] for headline in headlines.values()),
                              unsettled=[dtype for dtype in measured if not headlines[dtype]["stable"]],
                              where={dtype: _where_measured(device, machine, headlines[dtype]["threads"],
                                                            free.cores if free is not None else None)
                                     for dtype in measured})
    details = {"busy": busy.to_json(), "headline": headlines, "swept_twice": swept_twice}
    if free is not None:
        details["cores"] = free.to_json()
    return ProbeResult(probe="matmul", rows=tuple(rows), metrics=metrics, summary=summary, cancelled=cancelled,
                       device=device, details=details)


MATMUL = make_probe(
    name="matmul",
    title="Matrix multiply throughput",
    description="Times C = A @ B on random inputs for each dtype (square sizes grown until their timing is "
                "stable, within the budget; loading torch is not counted) and sets the best stable median "
                "TFLOP/s beside the device's theoretical peak, with how busy the machine was.",
    needs_torch=True,
    params=(
        Param("dtypes", "str-list", ["fp32", "bf16"], "matmul dtypes to time", choices=MATMUL_DTYPES),
        budget_param(4.0),
        device_param(),
    ),
    metrics=tuple(f"tflops_{dtype}" for dtype in MATMUL_DTYPES) + _speedup_keys(),
    body=_matmul,
    metrics_of=lambda p: tuple(f"tflops_{d}" for d in p["dtypes"])
    + tuple(f"speedup_{a}_over_{b}" for a, b in itertools.permutations(p["dtypes"], 2)),
)


def _bandwidth(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    progress(0.0, "loading torch")
    from tutor.bench.bandwidth import memory_bandwidth  # imports torch
    from tutor.hardware import detect_machine

    start = time.perf_counter()  # the budget is for filling and timing, not for loading torch
    device = resolve_device(params["device"])
    machine = detect_machine()
    _check_bandwidth_memory(device, machine)
    if cancel.is_set():
        return ProbeResult("bandwidth", (), {}, "cancelled before the arrays were filled", True, device)
    progress(0.05, f"filling arrays on {device}")
    # Allocating and filling arrays of 4x the last-level cache comes on top of the timed kernels
    # and takes about as long on a CPU: half of what is left goes to the kernels.
    budget = max((params["budget_s"] - (time.perf_counter() - start)) * FILL_SHARE, MIN_SHARE_S)
    results = memory_bandwidth(device, budget_s=budget, machine=machine, ops=params["ops"], cancel=cancel)
    source = machine.peak_memory_source(device)
    rows = []
    metrics: dict[str, float] = {}
    for result in results:
        metrics[f"gbps_{result.op}"] = result.gbps_best
        rows.append(Measurement(
            label=f"{result.op} ({result.array_bytes / 2**20:.0f} MiB arrays)", measured=result.gbps_best,
            unit="GB/s", theory=result.peak_gbps, theory_source=source,
            note="; ".join((result.bytes_counting,) + result.notes), rate=True))
    progress(1.0, "done")
    cancelled = cancel.is_set() or len(results) < len(params["ops"])
    summary = ", ".join(f"{op} {format_rate(value, 'GB/s')}" for op, value in
                        ((key.removeprefix("gbps_"), value) for key, value in metrics.items()))
    return ProbeResult(probe="bandwidth", rows=tuple(rows), metrics=metrics,
                       summary=f"{summary or 'nothing measured'} GB/s on {device}", cancelled=cancelled, device=device)


BANDWIDTH = make_probe(
    name="bandwidth",
    title="Memory bandwidth",
    description="STREAM-like copy, scale, add, triad, read and write over arrays of at least 4x the "
                "last-level cache; best GB/s per kernel beside the memory's theoretical peak. The arrays are "
                "never shrunk to fit the budget: with a very large cache the minimum run can exceed a tiny budget.",
    needs_torch=True,
    params=(
        Param("ops", "str-list", ["copy", "triad"], "kernels to time", choices=BANDWIDTH_OPS),
        budget_param(4.0, "seconds in all; half of what is left after loading torch goes to the timed kernels, "
                          "the rest to filling the arrays (a very large cache can need more)"),
        device_param(),
    ),
    metrics=tuple(f"gbps_{op}" for op in BANDWIDTH_OPS),
    body=_bandwidth,
    metrics_of=lambda p: tuple(f"gbps_{op}" for op in p["ops"]),
)
