"""`tensor-tutor time MODEL`: how long a training step, a training run, a prefill and a decode step take.

The same model, mode, recipe, layout and --device questions as `fit` (tutor.fit_fields), answered
with time: every operation of the step counted (tutor.theory.step_operations) and timed on ceilings
that are measured on this machine (the results notebook) or a datasheet peak times a published
achieved fraction (tutor.bench.ceilings), each with its source. No torch unless --verify.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import click

from tutor.errors import UserError
from tutor.fit_fields import fit_options
from tutor.theory import fit as fitting
from tutor.theory.step_time import (
    GEMM,
    Ceilings,
    StepTime,
    decode_compute_bound_batch,
    decode_step,
    operation_seconds,
    prefill_seconds,
    training_run,
    training_step_time,
)
from tutor.theory.step_operations import inference_operations
from tutor.theory.units import parse_count
from tutor.bench.ceilings import compute_dtype as ceilings_dtype, device_ceilings as resolve_ceilings

DECODE_BATCHES = (1, 8, 32, 128)


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


def inference_answer(arch, request: fitting.FitRequest, ceilings: Ceilings, batches=DECODE_BATCHES) -> dict:
    """Prefill (time to first token) and decode tokens per second by batch, and where decode turns compute-bound."""
    prefill = prefill_seconds(arch, request, ceilings)
    prefill_ops = inference_operations(arch, request, queries=request.seq_len, context=request.seq_len,
                                       logits_tokens=request.batch)
    flops = sum(op.total_flops for op in prefill_ops)
    points = [decode_step(arch, request, ceilings, batch=b, context=request.seq_len) for b in batches]
    crossover = decode_compute_bound_batch(arch, request, ceilings, context=request.seq_len)
    return {
        "prefill": {"seconds": prefill, "tokens": request.batch * request.seq_len, "flops": flops,
                    "tokens_per_second": request.batch * request.seq_len / prefill},
        "decode": [{"batch": p.batch, "context": request.seq_len, "seconds_per_step": p.seconds,
                    "tokens_per_second": p.tokens_per_second, "bound": p.bound,
                    "compute_seconds": p.compute_seconds, "memory_seconds": p.memory_seconds} for p in points],
        "decode_compute_bound_batch": crossover,
    }


def verify_model(model: str, size: str, recipe: str = "fp32") -> dict:
    """--verify: MODEL's architecture scaled down, predicted from ceilings measured now, then run (tutor.bench.step_verify)."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise UserError("--verify runs the real model: it needs torch and transformers (pip install -e '.[trace]')") from None
    from tutor.bench.step_verify import run_verification
    from tutor.model_files import read_model_config

    return run_verification(read_model_config(model).config, size, recipe=recipe)


@click.command("time")
@fit_options()
@click.option("--tokens", "tokens_text", default="15T", show_default=True,
              help="Tokens to train on for the time-to-train (15T, 2e12, 300B).")
@click.option("--devices", "devices", type=int, default=None,
              help="Devices in all: sets dp so that dp x tp x pp = N (default: the layout's product).")
@click.option("--price", type=float, default=None, help="Price per device-hour, for the cost of the run.")
@click.option("--mfu", "mfu_text", default=None,
              help="Use a stated utilisation (0.38 or 38%) instead of the counted step: step = FLOPs / (MFU x peak).")
@click.option("--overlap", "overlap_text", default="1", show_default=True,
              help="Share (0-1) of the data-parallel gradient traffic hidden under the backward pass.")
@click.option("--verify", is_flag=True,
              help="Run the real transformers model of MODEL's architecture, scaled down, on this machine and "
                   "compare predicted with measured step, prefill and decode (needs torch and transformers).")
@click.option("--verify-size", type=click.Choice(("tiny", "small", "medium", "large")), default="medium",
              show_default=True, help="How far --verify scales the model down (medium: a step of about a second).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def time_command(model, params, device, tokens_text, devices, price, mfu_text, overlap_text, verify, verify_size,
                 as_json, **fields) -> None:
    """How long does a step of MODEL take, how many tokens per second, and how long to train on --tokens?

    MODEL is a preset name (tensor-tutor models), a config.json, or a local model folder. Ceilings come from
    this machine's latest `tensor-tutor bench` run, or with --device h100 from the datasheet times published
    achieved fractions; every one is listed with its source.
    """
    if params:
        raise UserError("time counts every operation of the step: it needs an architecture, pass a preset or a "
                        "config.json rather than --params")
    if not model:
        raise UserError("name a model: a preset (see `tensor-tutor models`), a config.json or a model folder")
    from tutor.fit_answer import FitInputs, resolve_fit_model

    arch, name, source, _ = resolve_fit_model(model, None)
    assert arch is not None  # a model (not a bare count) resolves to an architecture
    tokens = parse_count(tokens_text)
    mfu = parse_fraction(mfu_text, "--mfu")
    if mfu == 0:
        raise UserError("--mfu must be above 0")
    overlap = parse_fraction(overlap_text, "--overlap")
    if overlap is None:
        raise UserError("--overlap needs a fraction between 0 and 1")
    if price is not None and (price < 0 or not math.isfinite(price)):
        raise UserError(f"--price must be a number >= 0, got {price}")
    # The same request `fit` builds from the same options (tutor.fit_fields declares them once).
    settings = {name: value for name, value in FitInputs.from_command(model, None, device, **fields).request.items()
                if not (name == "dtype" and value is None)}
    request = fitting.FitRequest(**settings)
    request = apply_devices(request, devices)
    fitting.validate_request(arch, request)
    dtype = ceilings_dtype(request)
    try:
        ceilings, device_words = resolve_ceilings(device, dtype)
    except UserError as error:
        if not verify:
            raise
        ceilings, device_words, missing = None, "this machine", str(error)
    # --verify runs full steps in fp32, or LoRA steps for a LoRA request (QLoRA's kernels need a GPU: refused there)
    verified = verify_model(model, verify_size, str(request.recipe) if request.adapter else "fp32") if verify else None
    if ceilings is None:
        assert verified is not None  # without ceilings only --verify gets this far
        report = {"model": {"name": name, "source": source, "model_type": arch.model_type},
                  "mode": request.mode, "verify": verified, "sources": verified["sources"],
                  "notes": [f"only --verify answered: {missing}"]}
        if as_json:
            click.echo(json.dumps(report, indent=2))
            return
        from tutor.commands.time_render import render_verify_only

        render_verify_only(report)
        return
    report = {"model": {"name": name, "source": source, "model_type": arch.model_type},
              "mode": request.mode,
              "request": {"batch": request.batch, "seq_len": request.seq_len, "dp": request.dp, "tp": request.tp,
                          "pp": request.pp, "ep": request.ep, "zero": request.zero, "recipe": request.recipe,
                          "optimizer": request.optimizer, "recompute": request.recompute,
                          "attention": request.attention, "microbatches": request.microbatches or request.pp,
                          "devices": request.devices},
              "device": {"name": device_words, "key": ceilings.device, "dtype": dtype}}
    if request.mode == "train":
        report.update(train_answer(arch, request, ceilings, tokens=tokens, price=price, mfu=mfu, overlap=overlap))
    else:
        report.update(inference_answer(arch, request, ceilings))
    report["sources"] = ceilings.sources()
    report["notes"] = list(ceilings.notes)
    if verified is not None:
        report["verify"] = verified
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    from tutor.commands.time_render import render_report

    render_report(report)

