"""One time answer for every front end: how long a training step, a training run, a prefill and a decode
step take, as `tensor-tutor time --json`'s report dict.

The command (`tensor-tutor time`) and the app's Fit screen both ask through `time_report` (or, with
ceilings already resolved, `report_for_ceilings`), so they cannot disagree: every operation of the step
counted (tutor.theory.step_operations) and timed on ceilings that are measured on this machine (the
results notebook) or a datasheet peak times a published achieved fraction (tutor.bench.ceilings),
each with its source. No click, no Rich, no Textual, no torch: the front ends render.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tutor.bench.ceilings import compute_dtype as ceilings_dtype  # noqa: F401  (re-exported)
from tutor.bench.ceilings import device_ceilings as resolve_ceilings  # noqa: F401
from tutor.errors import UserError
from tutor.theory import fit as fitting
from tutor.theory.step_operations import inference_operations
from tutor.theory.step_time import (
    ENGINE_WORDS,
    GEMM,
    Ceilings,
    EngineStep,
    StepTime,
    decode_compute_bound_batch,
    decode_step,
    operation_seconds,
    prefill_engines,
    training_run,
    training_step_time,
)

DECODE_BATCHES = (1, 8, 32, 128)
DEFAULT_TOKENS = "15T"
"""`time --tokens`'s default: the tokens a time-to-train is asked for (Llama 3's 15T)."""


PHASE_WORDS = {"forward": "forward", "backward": "backward (incl. recompute)", "optimizer": "optimizer step",
               "pipeline_bubble": "pipeline bubble", "communication": "exposed communication"}
"""The step's phases (the report's `step.phases` keys) as the CLI and the Fit screen name them."""


def phase_share(part: float, whole: float) -> str:
    """A phase's share of the step, as text ("N/A" for an empty step)."""
    from tutor.formatting import format_percent

    return format_percent(part / whole) if whole else "N/A"


def does_not_fit_line(report: dict) -> str:
    """'' when the layout fits (or the device's memory is unknown), else one line saying it cannot run as asked (the
    CLI and the Fit screen print the same line)."""
    from tutor.formatting import format_bytes

    memory = report.get("memory") or {}
    if memory.get("fits") is not False:
        return ""
    return (f"does not fit: {format_bytes(memory['per_device_bytes'])} per device against "
            f"{format_bytes(memory['capacity_bytes'])} ({memory['device']}); the times below are for a run that "
            "could not start: `tensor-tutor fit` with the same model and options says what would make it fit")


def parse_fraction(text: str | None, name: str) -> float | None:
    """'0.38' or '38%' -> 0.38; None stays None; anything else a one-line UserError."""
    if text is None:
        return None
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise UserError(f"{name} must be a fraction such as 0.38 or 38%, got {text!r}") from None
    if not 0 <= value <= 1 or not math.isfinite(value):
        raise UserError(f"{name} must be between 0 and 1 (or 0% and 100%), got {text!r}")
    return value


def apply_devices(request: fitting.FitRequest, devices: int | None) -> fitting.FitRequest:
    """--devices N: the data-parallel degree that makes dp x tp x pp = N (or a check that it already does)."""
    if devices is None:
        return request
    if devices < 1:
        raise UserError(f"--devices must be at least 1, got {devices}")
    if request.devices == devices:
        return request
    if request.dp != 1:
        raise UserError(f"--devices {devices} disagrees with dp {request.dp} x tp {request.tp} x pp {request.pp} "
                        f"= {request.devices}; give one or the other")
    model_parallel = request.tp * request.pp
    if devices % model_parallel:
        raise UserError(f"--devices {devices} is not a multiple of tp x pp = {model_parallel}")
    return replace(request, dp=devices // model_parallel)


def _operation_rows(step: StepTime, ceilings: Ceilings) -> list[dict]:
    """Operations grouped by name and phase with their FLOPs, bytes and time (largest first)."""
    rows: dict[tuple[str, str], dict] = {}
    for op in step.operations.operations:
        key = (op.phase, op.name)
        row = rows.setdefault(key, {"phase": op.phase, "name": op.name, "kind": op.kind, "flops": 0, "bytes": 0,
                                    "seconds": 0.0, "shape": [op.batch, op.m, op.n, op.k] if op.kind == GEMM else None})
        row["flops"] += op.total_flops
        row["bytes"] += op.total_bytes
        row["seconds"] += operation_seconds(ceilings, op)
    return sorted(rows.values(), key=lambda row: -row["seconds"])


def train_answer(arch, request: fitting.FitRequest, ceilings: Ceilings, *, tokens: int, price: float | None,
                 mfu: float | None, overlap: float) -> dict:
    """The whole training answer as one dict (the JSON; the text view renders it)."""
    from tutor.bench.ceilings import waterfall

    step = training_step_time(arch, request, ceilings, overlap=overlap, mfu=mfu)
    run = training_run(step, tokens=tokens, price_per_device_hour=price)
    gemms = [op for op in step.operations.operations if op.kind == GEMM]
    gemm_flops = sum(op.total_flops for op in gemms)
    gemm_seconds = sum(operation_seconds(ceilings, op) for op in gemms)
    per_device_model_flops = step.model_flops_per_step / step.devices
    peak = ceilings.peak_flops.value if ceilings.peak_flops is not None else None
    falls = waterfall(ceilings, gemm_flops=gemm_flops, gemm_seconds=gemm_seconds,
                      model_flops=per_device_model_flops, step_seconds=step.seconds,
                      clock_fraction=ceilings.clock_fraction)
    return {
        "flops_per_step": step.model_flops_per_step,
        "flops_per_step_per_device": step.operations.flops(),
        "model_flops_per_token": step.model_flops_per_step / step.tokens_per_step,
        "step": {"seconds": step.seconds, "phases": step.phases, "microbatches": step.operations.microbatches,
                 "tokens": step.tokens_per_step, "layers_per_device": step.operations.layers,
                 "mfu_stated": mfu},
        "tokens_per_second": step.tokens_per_second,
        "mfu": {"datasheet": step.mfu(peak) if peak else None,
                "measured_matmul": step.mfu(ceilings.max_matmul_flops),
                "stated": mfu},
        "train": {"tokens": run.tokens, "flops": run.flops, "seconds": run.seconds,
                  "device_hours": run.device_hours, "cost": run.cost, "price_per_device_hour": price},
        "communication": [{"group": c.group, "collective": c.op, "ranks": c.ranks, "bytes_per_rank": c.bytes_per_rank,
                           "calls": c.calls, "link": c.link, "seconds": c.seconds,
                           "exposed_seconds": c.exposed_seconds, "formula": c.formula} for c in step.collectives],
        "waterfall": [{"name": w.name, "flops_per_s": w.flops_per_s, "factor": w.factor, "source": w.source}
                      for w in falls],
        "operations": _operation_rows(step, ceilings)[:12],
        "assumptions": {"overlap": overlap,
                        "overlap_meaning": "share of the data-parallel gradient traffic hidden under the backward "
                                           "pass (at most its length); tensor-parallel and expert traffic is never "
                                           "hidden",
                        "optimizer": "torch's default (foreach / single-tensor) implementation, not fused"},
    }


def _engine_row(step: EngineStep, tokens: int) -> dict:
    return {"engine": step.engine, "seconds": step.seconds, "tokens_per_second": tokens / step.seconds,
            "bound": step.bound, "device_seconds": step.device_seconds, "host_seconds": step.host_seconds,
            "host_share": None if step.host_seconds is None else min(1.0, step.host_seconds / step.seconds),
            "source": step.source}


def inference_answer(arch, request: fitting.FitRequest, ceilings: Ceilings, batches=DECODE_BATCHES) -> dict:
    """Prefill (time to first token) and decode tokens per second by batch under each engine the device runs
    (eager always; CUDA graphs on a GPU), and where decode's device work turns compute-bound."""
    prefill = prefill_engines(arch, request, ceilings)
    prefill_ops = inference_operations(arch, request, queries=request.seq_len, context=request.seq_len,
                                       logits_tokens=request.batch)
    flops = sum(op.total_flops for op in prefill_ops)
    tokens = request.batch * request.seq_len
    points = [decode_step(arch, request, ceilings, batch=b, context=request.seq_len) for b in batches]
    crossover = decode_compute_bound_batch(arch, request, ceilings, context=request.seq_len)
    decode = []
    for engine in (step.engine for step in points[0].engines):
        for p in points:
            step = next(s for s in p.engines if s.engine == engine)
            row = _engine_row(step, p.batch)
            decode.append({"batch": p.batch, "context": request.seq_len, "engine": engine,
                           "seconds_per_step": step.seconds, "tokens_per_second": row["tokens_per_second"],
                           "bound": step.bound, "compute_seconds": step.compute_seconds,
                           "memory_seconds": step.memory_seconds, "device_seconds": step.device_seconds,
                           "host_seconds": step.host_seconds, "host_share": row["host_share"], "source": step.source})
    eager = prefill[0]
    return {
        "prefill": {"seconds": eager.seconds, "tokens": tokens, "flops": flops,
                    "tokens_per_second": tokens / eager.seconds, "engine": eager.engine, "bound": eager.bound,
                    "engines": [_engine_row(step, tokens) for step in prefill]},
        "decode": decode,
        "engines": {step.engine: ENGINE_WORDS[step.engine] for step in prefill},
        "decode_compute_bound_batch": crossover,
    }


def with_host_costs(ceilings: Ceilings, config: dict | None, on_measure=None) -> Ceilings:
    """The ceilings with the host's costs for this model's family: measured on this machine's device (cpu or
    cuda:N, cached; tutor.trace.host_costs); for a card by name, the assumed host (tutor.bench.ceilings) times
    this family's code over Llama's, both measured on this machine's CPU where it can. Unchanged without a
    config, or where nothing can be measured (the answer then says the host's code is not counted). `on_measure`
    hears a sentence before a measurement starts."""
    from tutor.bench.ceilings import reference_host_costs
    from tutor.trace.host_costs import REFERENCE_MODEL, host_costs_for, per_layer_decode

    if config is None:
        return ceilings
    if ceilings.device == "cpu" or ceilings.device.startswith("cuda"):
        costs = host_costs_for(config, ceilings.device, on_measure)
        return replace(ceilings, host=costs) if costs is not None else ceilings
    if ceilings.host is None:
        return ceilings
    from tutor.files.models import read_model_config

    here = host_costs_for(config, "cpu", on_measure)
    reference = host_costs_for(read_model_config(REFERENCE_MODEL).config, "cpu", on_measure)
    if here is None or reference is None or per_layer_decode(reference) <= 0:
        return replace(ceilings, host=reference_host_costs(1.0, "this family's own code not measured on this "
                                                                "machine: taken as Llama's"))
    scale = per_layer_decode(here) / per_layer_decode(reference)
    return replace(ceilings, host=reference_host_costs(scale, f"x {scale:.2f}, this family's decode layer code over "
                                                              "Llama's, both measured on this machine's CPU"))


def with_training_host_code(ceilings: Ceilings, config: dict | None, request: fitting.FitRequest,
                            on_measure=None) -> Ceilings:
    """The ceilings with the framework's own code of a training step's forward and backward, per decoder layer and
    per model call (tutor.trace.host_costs, measured on this machine's CPU at near-zero work, cached), where the
    host's code runs on the cores that do the work: a CPU. On a GPU the host queues kernels ahead of the device and
    a step of real size hides its code. Unchanged for a card by name, a LoRA step (its wrapped linears run other
    code than the measured model's), without a config, or where nothing can be measured."""
    from tutor.trace.host_costs import host_costs_for, training_framework_seconds

    if config is None or ceilings.device != "cpu" or request.adapter:
        return ceilings
    costs = host_costs_for(config, "cpu", on_measure)
    named = training_framework_seconds(costs) if costs is not None else ()
    if costs is None or not named:
        return ceilings
    return replace(ceilings, named_seconds=ceilings.named_seconds + named, framework_source=costs.source)


def check_time_request(arch, request: fitting.FitRequest) -> None:
    """A UserError for a request `time` cannot answer: one tutor.theory.fit rejects."""
    fitting.validate_request(arch, request)


def memory_check(arch, request: fitting.FitRequest, device: str | None) -> dict:
    """Whether the request's most loaded device holds its tensors (tutor.theory.fit, as `fit` counts them) on
    `device` (a card, a size, a GPU index, `cpu`; None: this machine): `time` answers how long a step would
    take either way, and says when it could not run. fits is None when the device's memory is unknown."""
    from tutor.hardware.memory_budget import device_budget

    try:
        budget = device_budget(device)
    except UserError:
        budget = None
    # As `fit` counts it for that device: a CPU holds no CUDA context and runs its own attention kernel.
    need = fitting.estimate(arch, replace(request, gpu=budget.gpu) if budget is not None else request).worst.total
    capacity = budget.capacity if budget is not None else None
    return {"per_device_bytes": need, "capacity_bytes": capacity,
            "device": budget.name if budget is not None else None,
            "fits": None if capacity is None else need <= capacity}


def report_for_ceilings(arch, request: fitting.FitRequest, ceilings: Ceilings, device_words: str, *, name: str,
                        source: str, tokens: int, price: float | None = None, mfu: float | None = None,
                        overlap: float = 1.0, device: str | None = None, config: dict | None = None,
                        on_measure=None) -> dict:
    """`time --json`'s report (without verify) for a checked request on ceilings already resolved; `device` is
    what the user named (for the memory check, `memory`); `config`, the model's config.json, lets an inference
    answer count the host's code of its family (with_host_costs)."""
    if request.mode != "train":
        ceilings = with_host_costs(ceilings, config, on_measure)
    else:  # the engines' figures time inference only: a training step's sources list what it used
        ceilings = with_training_host_code(replace(ceilings, host=None, graph_kernel=None, decode_matmul=()),
                                           config, request, on_measure)
    report = {"model": {"name": name, "source": source, "model_type": arch.model_type},
              "mode": request.mode,
              "request": {"batch": request.batch, "seq_len": request.seq_len, "dp": request.dp, "tp": request.tp,
                          "pp": request.pp, "ep": request.ep, "zero": request.zero, "recipe": request.recipe,
                          "optimizer": request.optimizer, "recompute": request.recompute,
                          "attention": request.attention, "microbatches": request.microbatches or request.pp,
                          "devices": request.devices,
                          "weights": str(request.dtype) if request.dtype is not None else None},
              "device": {"name": device_words, "key": ceilings.device, "dtype": ceilings_dtype(request)}}
    if request.mode == "train":
        report.update(train_answer(arch, request, ceilings, tokens=tokens, price=price, mfu=mfu, overlap=overlap))
    else:
        report.update(inference_answer(arch, request, ceilings))
    report["memory"] = memory_check(arch, request, device)
    report["sources"] = ceilings.sources()
    report["notes"] = list(ceilings.notes)
    return report


def time_report(arch, request: fitting.FitRequest, device: str | None, *, name: str, source: str,
                tokens: int | None = None, price: float | None = None, mfu: float | None = None,
                overlap: float = 1.0, config: dict | None = None) -> dict:
    """How long MODEL's step takes on `device` (None: this machine, measured; `cpu`, a GPU index, or a card by
    name): `tensor-tutor time --json`'s report without --verify. UserError (one line) when the request makes
    no sense for time or the device has no ceilings (no bench run on this machine, an unknown card)."""
    from tutor.theory.units import parse_count

    check_time_request(arch, request)
    ceilings, device_words = resolve_ceilings(device, ceilings_dtype(request))
    return report_for_ceilings(arch, request, ceilings, device_words, name=name, source=source,
                               tokens=parse_count(DEFAULT_TOKENS) if tokens is None else tokens, price=price,
                               mfu=mfu, overlap=overlap, device=device, config=config)


def device_verification(config: dict, request: fitting.FitRequest, device: str, *, name: str, source: str) -> dict:
    """`time --verify --device N`: `time --device N`'s own answer (this machine's bench run on that device, the
    family's host costs) for the model tutor.trace.device_verify builds there, beside that model's real step,
    prefill and decode per engine."""
    from tutor.bench.ceilings import compute_dtype
    from tutor.trace.device_verify import MEMORY_SHARE, measure_model, verification_config, weights_dtype
    from tutor.trace.step_verify import scaled_architecture

    scaled = verification_config(config, request, device)
    arch = scaled_architecture(scaled, name)
    where = device.split(":")[1] if device.startswith("cuda") else "cpu"  # as `time --device` reads it
    full = config.get("num_hidden_layers")
    result: dict = {"device": device, "model": name, "layers": arch.num_layers, "full_layers": full,
                    "scaled": "full size" if scaled == config else
                              f"{arch.num_layers} of {full} decoder layers (the step fits in {MEMORY_SHARE:.0%} of the "
                              "memory free)"}
    inference_request = replace(request, mode="inference", batch=1, dtype=weights_dtype(request))
    inference = report_for_ceilings(arch, inference_request, resolve_ceilings(where, ceilings_dtype(inference_request))[0],
                                    "", name=name, source=source, tokens=1, config=scaled, device=where)
    trained = None
    if request.mode == "train":
        ceilings, words = resolve_ceilings(where, compute_dtype(request))
        trained = report_for_ceilings(arch, request, ceilings, words, name=name, source=source, tokens=1, device=where)
    measured = measure_model(scaled, request, device)
    result["clock"] = measured["clock"]
    if trained is not None:
        phases = trained["step"]["phases"]
        result["phases"] = {phase: {"predicted_s": phases.get(phase, 0.0), "measured_s": seconds}
                            for phase, seconds in measured["phases"].items()}
        result["predicted_s"] = trained["step"]["seconds"]
        result["measured_s"] = sum(measured["phases"].values())
        if "max_memory_allocated_bytes" in measured:
            result["max_memory_allocated_bytes"] = measured["max_memory_allocated_bytes"]
    result["prefill"] = {"predicted_s": inference["prefill"]["seconds"], "measured_s": measured["prefill"]}
    rows = []
    for row in inference["decode"]:
        seconds = measured["decode"].get((row["engine"], row["batch"]))
        if seconds is not None:
            rows.append({"engine": row["engine"], "batch": row["batch"], "bound": row["bound"],
                         "predicted_s": row["seconds_per_step"], "measured_s": seconds})
    result["decode_engines"] = rows
    eager_one = next((r for r in rows if r["engine"] == "eager" and r["batch"] == 1), None)
    if eager_one is not None:
        result["decode"] = {"predicted_s": eager_one["predicted_s"], "measured_s": eager_one["measured_s"],
                            "batch": 1, "context": request.seq_len}
    if "graphs_note" in measured:
        result["graphs_note"] = measured["graphs_note"]
    result["sources"] = inference["sources"]
    return result
