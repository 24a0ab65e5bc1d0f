"""The ceilings a time prediction runs on, never a silent constant: each figure measured here or sourced.

- This machine: the latest `bench` run in the results notebook (read through tutor.bench.notebook):
  the matmul curve is that run's whole measured sweep (every size it timed, not one headline), the
  memory bandwidth its STREAM-like triad, the link its measured all-reduce busbw; each figure names
  the run (its number and date). No run: a UserError that offers `tensor-tutor bench --quick`.
- A card by name (`--device h100`): its datasheet peak (tutor.hardware.specs) times an achieved
  fraction with its citation: Stas Bekman's mamf-finder table for matmul (H100 SXM bf16 794.5 of
  989 TFLOP/s), a published HBM measurement, NCCL's own figures for NVLink and InfiniBand.

Importing this module imports no torch: `tensor-tutor time` answers from the notebook and tables.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from tutor.errors import UserError
from tutor.hardware.specs import CARDS, CARDS_BY_KEY, GpuSpec
from tutor.theory.interconnect import nvlink_bandwidth_bytes_per_s, pcie_bandwidth_bytes_per_s
from tutor.theory.step_operations import LAYER_CODE, MODEL_CODE
from tutor.theory.step_time import BandwidthPoint, Ceilings, GemmPoint, HostCosts, Sourced

if TYPE_CHECKING:
    from tutor.bench.notebook import Notebook, Run
    from tutor.theory.fit import FitRequest

# card key -> (measured maximum achievable matmul TFLOP/s, the card it was measured on, best shape): a view
# over the card records (tutor/hardware/cards/<key>.json, `mamf`)
PUBLISHED_MAMF_BF16: dict[str, tuple[float, str, tuple[int, int, int]]] = {
    card.key: (card.mamf.bf16_tflops, card.mamf.measured_on, card.mamf.shape) for card in CARDS if card.mamf}
# Used for a card without its own published MAMF: the H100 SXM's efficiency (its record's mamf-finder result
# over its dense bf16 peak, 794.5 / 989.4), said as such.
FALLBACK_MAMF_CARD = "h100-sxm"


def _fallback_mamf_fraction() -> float:
    card = CARDS_BY_KEY[FALLBACK_MAMF_CARD]
    peak = card.spec.peak_tflops("bf16")
    if card.mamf is None or peak is None:  # the records are validated; this guards an edit of the H100's file
        raise RuntimeError(f"the {FALLBACK_MAMF_CARD} card record lost its bf16 peak or its mamf-finder result")
    return card.mamf.bf16_tflops / peak


FALLBACK_MAMF_FRACTION = _fallback_mamf_fraction()
HBM_FRACTION = 2.8 / 3.35
HBM_SOURCE = ("coalesced loads at 2.8 of 3.35 TB/s on an H100 SXM, measured with Nsight Compute "
              "(https://mikamirai.com/blog/gpu-memory-bandwidth/)")
NVLINK_FRACTION = 370 / 450
NVLINK_SOURCE = ("NCCL reaches an effective 370 GB/s busbw of NVLink 4's 450 GB/s line rate, ~20% protocol "
                 "overhead (NCCL developer S. Jeaugey, https://github.com/NVIDIA/nccl-tests/issues/212)")
PCIE_FRACTION = 26 / 31.5
PCIE_SOURCE = ("nvbandwidth README: host_to_device_memcpy_ce about 26 GB/s of PCIe Gen4 x16's 31.5 GB/s "
               "(NVIDIA/nvbandwidth)")
NDR_BUSBW = 47e9
NDR_SOURCE = ("46-48 GB/s per NDR 400 Gb/s NIC, one NIC per GPU (NVIDIA, "
              "https://github.com/NVIDIA/nccl-tests/issues/290)")
NCCL_STEP_LATENCY = 3e-6
NCCL_LATENCY_SOURCE = ("a 2-GPU all-reduce of a few kB takes about 6 µs on an HGX H100, 2 ring steps "
                       "(https://github.com/NVIDIA/nccl/issues/1259)")
KERNEL_LAUNCH = 5e-6
KERNEL_LAUNCH_SOURCE = ("CUDA kernel launch overhead of about 5 µs per launch (NVIDIA CUDA C++ Best Practices "
                        "Guide, 'Kernel launch overhead'; PyTorch CUDA Graphs blog: 'several microseconds')")
# The host of a card by name is an assumption: the one this project measured. transformers' eager decode of
# Llama-3.1-8B (32 decoder layers, bf16, SDPA, a DynamicCache after 2048 tokens of prompt) on an H200 whose host
# is a 16-core 2.1 GHz Xeon, torch 2.11.0+cu130, transformers 5.17.0: seconds per step by batch, bound by the host.
REFERENCE_HOST_STEPS = ((1, 55.9e-3), (8, 62.9e-3))
REFERENCE_HOST_LAYERS = 32
REFERENCE_HOST_SOURCE = ("assumed host: transformers' eager decode of Llama-3.1-8B measured by this project on an "
                         "H200 with a 16-core 2.1 GHz Xeon host (torch 2.11, transformers 5.17, 2048 tokens of "
                         "context): 55.9 ms per step at batch 1, 62.9 ms at batch 8, host-bound; per decoder layer "
                         "1/32 of it (the model's own code folded in), a prefill's layer as a batch-1 decode's")
GRAPH_KERNEL = 3.4e-6
GRAPH_KERNEL_SOURCE = ("a graph of 20 short kernels replayed at 3.4 µs per kernel, kernels included (NVIDIA, "
                       "'Getting Started with CUDA Graphs', https://developer.nvidia.com/blog/cuda-graphs/); the "
                       "decode step's kernels as eager transformers launches them (a serving engine fuses some)")
# card key -> (intra-node link: "nvlink" generation or "pcie" generation): a view over the card records
# (`intra_node_link`); a card without one has no entry, and its ceilings carry no intra-node link.
INTRA_NODE_LINKS: dict[str, tuple[str, int]] = {
    card.key: (card.intra_node_link.kind, card.intra_node_link.generation) for card in CARDS
    if card.intra_node_link is not None}
FIRST_TOUCH_MIB = 64  # tutor.bench.elementwise.FIRST_TOUCH_BYTES (that module imports torch)
BENCH_HINT = "run `tensor-tutor bench --quick` (about 20 s) to measure this machine, or pass --device h100"


@dataclass(frozen=True)
class WaterfallStep:
    """One rung of the waterfall from the datasheet to the achieved step: a rate and the factor to the
    rung above it, with where the factor comes from."""

    name: str
    flops_per_s: float
    factor: float
    source: str


def intra_node_link_rate(spec_key: str) -> tuple[str, float] | None:
    """(name, bytes/s per direction) of a card's intra-node link from the datasheets (the NVIDIA
    NVLink page, PCI-SIG; tutor.theory.interconnect): the rate a busbw curve saturates below
    (nccl-tests doc/PERFORMANCE.md: busbw is comparable to the link's unidirectional bandwidth).
    None for a card not in INTRA_NODE_LINKS."""
    if spec_key not in INTRA_NODE_LINKS:
        return None
    link_kind, generation = INTRA_NODE_LINKS[spec_key]
    if link_kind == "nvlink":
        return f"NVLink {generation}", nvlink_bandwidth_bytes_per_s(generation)
    return f"PCIe Gen{generation} x16", pcie_bandwidth_bytes_per_s(generation)


def reference_host_costs(scale: float = 1.0, why: str = "") -> HostCosts:
    """The assumed host of a card by name (REFERENCE_HOST_SOURCE), its code times `scale` (this family's code
    over Llama's, measured on this machine; `why` says so)."""
    rows = []
    for batch, seconds in REFERENCE_HOST_STEPS:
        rows.append(("decode", LAYER_CODE, batch, scale * seconds / REFERENCE_HOST_LAYERS))
        rows.append(("decode", MODEL_CODE, batch, 0.0))
    first = REFERENCE_HOST_STEPS[0][1] / REFERENCE_HOST_LAYERS
    rows += [("prefill", LAYER_CODE, 1, scale * first), ("prefill", MODEL_CODE, 1, 0.0)]
    return HostCosts(tuple(rows), REFERENCE_HOST_SOURCE + (f"; {why}" if why else ""))


def card_ceilings(spec: GpuSpec, dtype: str = "bf16") -> Ceilings:
    """Ceilings of a card from its record (tutor/hardware/cards/<key>.json): datasheet peak and bandwidth and
    its intra-node link, times published achieved fractions, each with its citation.

    A fact the record lacks is never filled in silently: no dense peak for the dtype or no memory bandwidth
    is a UserError; no intra-node link leaves that ceiling empty with a note saying so, and a step that
    talks between the GPUs of a node is then refused (tutor.theory.step_time) rather than priced on a guess."""
    peak_tflops = spec.peak_tflops(dtype)
    if peak_tflops is None:
        raise UserError(f"{spec.name} has no dense {dtype} peak in the spec table ({spec.source})")
    if not spec.bandwidth_gbps or spec.bandwidth_gbps <= 0:
        raise UserError(f"{spec.name} has no memory bandwidth on record ({spec.source}): a time estimate needs one")
    card = CARDS_BY_KEY.get(spec.key)
    peak = peak_tflops * 1e12
    published = card.mamf if card is not None and dtype in ("bf16", "fp16") else None
    if published is not None:
        fraction = published.bf16_tflops / peak_tflops
        rate = peak * fraction
        gemm_source = (f"{spec.name} {dtype} peak {peak_tflops:g} TFLOP/s x {fraction:.3f} achieved: "
                       f"{published.measured_on}, {published.source}")
        m, n, k = published.shape
    else:
        fraction = FALLBACK_MAMF_FRACTION
        rate = peak * fraction
        reference = CARDS_BY_KEY[FALLBACK_MAMF_CARD]
        where = reference.mamf.source if reference.mamf is not None else ""
        gemm_source = (f"{spec.name} {dtype} peak {peak_tflops:g} TFLOP/s x {fraction:.3f}, the "
                       f"{reference.spec.name}'s achieved bf16 fraction (no published {dtype} MAMF for this card): "
                       f"{where}")
        m, n, k = 4096, 4096, 4096
    bandwidth = spec.bandwidth_gbps * 1e9 * HBM_FRACTION
    notes: tuple[str, ...] = (spec.confidence,) if spec.confidence != "datasheet" else ()
    link = card.intra_node_link if card is not None else None
    intra: Sourced | None
    if link is None:
        intra = None
        notes += (f"no intra-node link on record for {spec.name} (tutor/hardware/cards/{spec.key}.json): a step "
                  "that talks between GPUs of one node is not priced",)
    elif link.kind == "nvlink":
        line = nvlink_bandwidth_bytes_per_s(link.generation)
        intra = Sourced(line * NVLINK_FRACTION, "B/s", f"NVLink {link.generation} {line / 1e9:g} GB/s per direction "
                        f"(NVIDIA NVLink page, per-GPU links) x {NVLINK_FRACTION:.3f}: {NVLINK_SOURCE}; "
                        f"the {spec.name}'s link: {link.source}")
    else:
        line = pcie_bandwidth_bytes_per_s(link.generation)
        intra = Sourced(line * PCIE_FRACTION, "B/s", f"PCIe Gen{link.generation} x16 {line / 1e9:.1f} GB/s per "
                        f"direction (PCI-SIG) x {PCIE_FRACTION:.3f}: {PCIE_SOURCE}; the {spec.name}'s link: "
                        f"{link.source}")
    return Ceilings(
        device=spec.key, dtype=dtype,
        gemm_points=(GemmPoint(m, n, k, rate),), gemm_source=gemm_source,
        bandwidth_points=(BandwidthPoint(1 << 30, bandwidth),),
        bandwidth_source=f"{spec.name} datasheet {spec.bandwidth_gbps:g} GB/s ({spec.source}) x {HBM_FRACTION:.3f}: "
                         f"{HBM_SOURCE}",
        peak_flops=Sourced(peak, "FLOP/s", f"{spec.name} dense {dtype} datasheet peak: {spec.source}"),
        kernel_overhead=Sourced(KERNEL_LAUNCH, "s", KERNEL_LAUNCH_SOURCE),
        intra_node_link=intra, inter_node_link=Sourced(NDR_BUSBW, "B/s", NDR_SOURCE),
        link_latency=Sourced(NCCL_STEP_LATENCY, "s", NCCL_LATENCY_SOURCE),
        notes=notes,
        host=reference_host_costs(), host_overlaps=True, graph_kernel=Sourced(GRAPH_KERNEL, "s", GRAPH_KERNEL_SOURCE),
    )


def _run_label(run: Run) -> str:
    return f"bench run {run.number} ({run.date})"


def _matmul_results(run: Run, device: str, dtype: str) -> list[dict]:
    return [r for r in run.results if r.get("kind") == "matmul" and r.get("device") == device
            and r.get("dtype") == dtype and str(r.get("backend", "")).startswith("torch")]


def latest_run_with_matmul(notebook: Notebook, device: str, dtype: str, threads: int | None = None) -> Run | None:
    """The newest finished run that measured torch matmul of `dtype` on `device`; with `threads`, the newest such run
    made with torch on that many threads where there is one (a CPU's rates scale with the threads a run had: a step
    on one thread is predicted from a one-thread run, not from a newer run on all the cores), else the newest."""
    runs = [run for run in reversed(notebook.runs) if not run.cancelled and _matmul_results(run, device, dtype)]
    matching = [run for run in runs if threads is not None and run.header.get("torch_threads") == threads]
    found = matching or runs
    return found[0] if found else None


def _positive(value) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def default_torch_threads() -> int | None:
    """The intra-op threads torch would use in a new process here, without importing torch: OMP_NUM_THREADS
    when set to a whole number, else the physical cores (torch's default, at::get_num_threads)."""
    import os

    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    if text.isdigit() and int(text) > 0:
        return int(text)
    import psutil

    cores = psutil.cpu_count(logical=False)
    return cores if isinstance(cores, int) and cores > 0 else None


def _run_conditions(run: Run, matmul: list[dict], device: str, label: str) -> tuple[str, ...]:
    """What the ceilings predict for (the threads the bench run measured with on a CPU) and what makes them
    doubtful (a different thread count now; a matmul measured while other processes took the cores)."""
    from tutor.bench.notebook import measured_while_busy
    from tutor.formatting import format_percent

    notes = []
    threads = run.header.get("torch_threads")
    if device == "cpu" and isinstance(threads, int) and not isinstance(threads, bool) and threads > 0:
        notes.append(f"predicted for torch on {threads} thread(s), the threads {label} measured with")
        now = default_torch_threads()
        if now is not None and now != threads:
            notes.append(f"a new process here would run torch on {now} thread(s) (OMP_NUM_THREADS or the physical "
                         f"cores): a step run that way differs; `tensor-tutor bench --quick` with the same setting "
                         f"measures ceilings for it")
    busy = [r["busy"] for r in matmul if measured_while_busy(r)]
    if busy:
        share = max(float(b.get("other_share") or 0.0) for b in busy)
        notes.append(f"{label} measured its matmul while other processes took {format_percent(share)} of the cores: these "
                     f"ceilings, and the times from them, are slower than a quiet machine's; rerun "
                     f"`tensor-tutor bench --quick` when it is quiet")
    return tuple(notes)


def measured_ceilings(device: str = "cpu", dtype: str = "fp32", notebook: Notebook | None = None) -> Ceilings:
    """This machine's ceilings from the latest bench run in the results notebook, each naming the run."""
    from tutor.bench.notebook import read_notebook  # only this machine's ceilings read the notebook

    book = notebook if notebook is not None else read_notebook()
    run = latest_run_with_matmul(book, device, dtype, default_torch_threads() if device == "cpu" else None)
    if run is None:
        skipped = f" ({'; '.join(_skipped_runs(book))})" if book.skipped else ""
        raise UserError(f"no bench run with a {dtype} matmul on {device} in the results notebook{skipped}: {BENCH_HINT}")
    label = _run_label(run)
    points = []
    matmul = _matmul_results(run, device, dtype)
    for result in matmul:
        for shape in result.get("sweep") or [result]:
            rate = _positive(shape.get("tflops_median"))
            if rate and all(isinstance(shape.get(d), int) for d in ("m", "n", "k")):
                points.append(GemmPoint(shape["m"], shape["n"], shape["k"], rate * 1e12))
    if not points:
        raise UserError(f"{label} holds no matmul figure for {dtype} on {device}: {BENCH_HINT}")
    headline = matmul[0]
    bandwidth = None
    for result in run.results:
        if result.get("kind") == "bandwidth" and result.get("device") == device and result.get("op") == "triad":
            rate = _positive(result.get("gbps_median"))
            if rate:
                bandwidth = BandwidthPoint(int(result.get("bytes") or 1 << 30), rate * 1e9)
    if bandwidth is None:
        raise UserError(f"{label} has no STREAM-like triad for {device}: run `tensor-tutor bench --quick` "
                        "(it measures matmul and bandwidth)")
    link = None
    busbw = [(r.get("bytes") or 0, rate) for r in run.results
             if r.get("kind") == "collective" and r.get("op") == "all_reduce"
             and (rate := _positive(r.get("busbw_gbps"))) is not None]
    if busbw:
        size, rate = max(busbw)
        link = Sourced(rate * 1e9, "B/s", f"measured all_reduce busbw at {size:,} B, {label}")
    peak = _positive(headline.get("peak_tflops"))
    sizes = ", ".join(f"{p.m}x{p.n}x{p.k}" for p in points)
    skinny = sorted((int(r["m"]), int(r["bytes"]), rate * 1e9) for r in run.results
                    if r.get("kind") == "decode_matmul" and r.get("device") == device and r.get("dtype") == dtype
                    and isinstance(r.get("m"), int) and isinstance(r.get("bytes"), int) and r["bytes"] > 0
                    and (rate := _positive(r.get("gbps_median"))) is not None)
    rows_measured = sorted({m for m, _, _ in skinny})
    skinny_source = ("measured x·Wᵀ with " + "; ".join(
        f"{m} row(s): " + ", ".join(f"{rate / 1e9:.3g} GB/s at {nbytes / 2**20:.3g} MiB" for mm, nbytes, rate in skinny
                                    if mm == m) for m in rows_measured)
        + f" (weights past the caches), {label}" if skinny else "")
    functions = tuple((str(r["function"]), rate) for r in run.results
                      if r.get("kind") == "elementwise" and r.get("device") == device and isinstance(r.get("function"), str)
                      and (rate := _positive(r.get("elements_per_s"))) is not None)
    touch = next((rate for r in run.results if r.get("kind") == "first_touch" and r.get("device") == device
                  and (rate := _positive(r.get("gbps_median"))) is not None), None)
    first_touch = None if touch is None else Sourced(
        touch * 1e9, "B/s", f"measured first touch of freshly mapped memory, {touch:.3g} GB/s beyond the write itself "
                            f"(a new {FIRST_TOUCH_MIB} MiB tensor filled against a mapped one), {label}")
    attention = tuple(sorted((str(r["phase"]), int(r["seq"]), rate * 1e12) for r in run.results
                             if r.get("kind") == "attention" and r.get("device") == device
                             and r.get("phase") in ("forward", "backward") and isinstance(r.get("seq"), int)
                             and not isinstance(r.get("seq"), bool) and r["seq"] > 0
                             and (rate := _positive(r.get("tflops_median"))) is not None))
    attention_source = ("measured torch SDPA causal kernel, " + "; ".join(
        f"{phase} " + ", ".join(f"{rate / 1e9:.3g} GFLOP/s at s = {seq}" for p, seq, rate in attention if p == phase)
        for phase in ("forward", "backward")) + f", {label}") if attention else ""
    graph_kernel = None
    if device.startswith("cuda"):
        graph_kernel = Sourced(GRAPH_KERNEL, "s", GRAPH_KERNEL_SOURCE)
        for result in run.results:
            floor = _positive(result.get("graph_kernel_s")) if result.get("kind") == "launch" else None
            if floor is not None and result.get("device") == device:
                graph_kernel = Sourced(floor, "s", f"measured CUDA graph replay of {result.get('kernels')} tiny "
                                                   f"kernels, per kernel, {label}")
    return Ceilings(
        device=device, dtype=dtype, gemm_points=tuple(points),
        notes=_run_conditions(run, matmul, device, label) + _skipped_runs(book),
        gemm_source=f"measured torch {dtype} matmul sweep ({sizes}), {label}",
        bandwidth_points=(bandwidth,),
        bandwidth_source=f"measured STREAM-like triad, median {bandwidth.bytes_per_s / 1e9:.3g} GB/s, {label}",
        peak_flops=Sourced(peak * 1e12, "FLOP/s", str(headline.get("peak_source") or "bench peak")) if peak else None,
        kernel_overhead=Sourced(0.0, "s", f"not measured by {label}: launch costs left out"),
        intra_node_link=link, inter_node_link=link,
        link_latency=None, devices_per_node=1 if device == "cpu" else 8,
        host_overlaps=device.startswith("cuda"), graph_kernel=graph_kernel,
        decode_matmul=tuple(skinny), decode_matmul_source=skinny_source,
        elementwise_rates=functions, first_touch=first_touch, attention_rates=attention,
        attention_source=attention_source,
        elementwise_source=("measured elements/s in the caches: " + ", ".join(f"{name} {rate / 1e9:.3g} G/s"
                                                                             for name, rate in functions)
                            + f", {label}") if functions else "",
    )


def _skipped_runs(book: Notebook) -> tuple[str, ...]:
    """The notebook's runs left out for a bad figure, said beside the figures taken from an older run."""
    from tutor.bench.notebook import MAX_SKIPPED_NAMED, SKIPPED

    more = len(book.skipped) - MAX_SKIPPED_NAMED
    return book.skipped[:MAX_SKIPPED_NAMED] + ((f"{SKIPPED} {more} more run(s) with a bad figure",) if more > 0 else ())


def waterfall(ceilings: Ceilings, *, gemm_flops: float, gemm_seconds: float, model_flops: float,
              step_seconds: float, clock_fraction: Sourced | None = None) -> tuple[WaterfallStep, ...]:
    """Datasheet peak -> clock now -> measured maximum matmul -> this model's GEMM shapes -> the achieved
    step. Each factor is the ratio of consecutive rungs, so their product is the achieved rate over the peak.

    gemm_flops / gemm_seconds: the step's GEMMs at their own shapes' rates; model_flops / step_seconds:
    the achieved model FLOP/s of the whole step (memory-bound work, communication and bubbles included)."""
    steps: list[WaterfallStep] = []
    top = ceilings.peak_flops.value if ceilings.peak_flops is not None else ceilings.max_matmul_flops
    steps.append(WaterfallStep("datasheet peak", top, 1.0,
                               ceilings.peak_flops.source if ceilings.peak_flops else "no datasheet: measured maximum"))
    rate = top
    if clock_fraction is not None:
        rate = top * clock_fraction.value
        steps.append(WaterfallStep("clock now", rate, clock_fraction.value, clock_fraction.source))
    best = ceilings.max_matmul_flops
    steps.append(WaterfallStep("measured maximum matmul", best, best / rate, ceilings.gemm_source))
    shapes = gemm_flops / gemm_seconds if gemm_seconds else best
    steps.append(WaterfallStep("this model's GEMM shapes", shapes, shapes / best,
                               "the model's GEMMs, each at the rate the matmul ceiling gives its shape"))
    achieved = model_flops / step_seconds
    steps.append(WaterfallStep("achieved step", achieved, achieved / shapes,
                               "model FLOPs over the whole step: memory-bound ops, optimizer, communication, bubble"))
    return tuple(steps)


# The ceilings for a --device, as `time` and `fit`'s suggestions ask for them


def compute_dtype(request: FitRequest) -> str:
    """The matmul dtype the step computes in: fp32 for the fp32 recipe (or fp32 weights), else bf16/fp16."""
    if request.mode == "train" and request.adapter:  # LoRA computes in its base's dtype
        return "fp32" if request.dtype in ("fp32", "tf32") else "bf16"
    if request.mode == "train":
        return "fp32" if request.recipe == "fp32" else "bf16"
    return {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16"}.get(request.dtype, "bf16")


def device_ceilings(device: str | None, dtype: str) -> tuple[Ceilings, str]:
    """(ceilings, what the device is) for --device: this machine (measured), a GPU index, or a card by name."""
    from tutor.hardware.specs import lookup_gpu_spec

    text = device.strip() if isinstance(device, str) else None
    if text == "":
        raise UserError("--device is empty: give cpu, a GPU index, or a card such as h100")
    if text is None or text.lower() == "cpu" or text.isdigit() or text.lower().startswith("cuda"):
        if text is None or text.lower() == "cpu":
            name = "cpu"
            if text is None:
                from tutor.hardware import detect_machine

                if detect_machine().gpus:
                    name = "cuda:0"
        else:
            name = text.lower() if text.lower().startswith("cuda") else f"cuda:{text}"
            card = lookup_gpu_spec(text) if text.isdigit() else None
            if card is not None:  # '4090' is a card, not GPU 4090
                spec = card[0]
                return card_ceilings(spec, dtype), f"{spec.name} (datasheet x published fractions)"
        ceilings = measured_ceilings(name, dtype)
        if name.startswith("cuda"):
            ceilings = replace(ceilings, clock_fraction=_clock_now(name))
        return ceilings, f"this machine's {name} (measured)"
    found = lookup_gpu_spec(text)
    if found is None:
        from tutor.hardware.specs import unknown_device_message

        raise UserError(unknown_device_message(text).replace("use 'this' (the detected device) or",
                                                             "use cpu, a GPU index, or"))
    spec, _note = found
    return card_ceilings(spec, dtype), f"{spec.name} (datasheet x published fractions)"


def _clock_now(device: str):
    """The SM clock now over the boost clock the datasheet peak assumes (NVML), with the clock-event reasons."""
    from tutor.hardware import detect_machine
    machine = detect_machine()
    gpu = machine.gpu_for(device)
    assumed = machine.peak_clock_hz(device)
    if gpu is None or not gpu.sm_clock_mhz or not assumed:
        return None
    reasons = ", ".join(gpu.clock_event_reasons or ()) or "none"
    return Sourced(gpu.sm_clock_mhz * 1e6 / assumed, "fraction",
                   f"NVML SM clock now {gpu.sm_clock_mhz} MHz over the {assumed / 1e6:g} MHz the datasheet peak assumes "
                   f"(spec derivation); clock events: {reasons}")
