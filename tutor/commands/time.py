"""`tensor-tutor time MODEL`: how long a training step, a training run, a prefill and a decode step take.

The same model, mode, recipe, layout and --device questions as `fit` (tutor.answers.fields), answered
with time: every operation of the step counted (tutor.theory.step_operations) and timed on ceilings
that are measured on this machine (the results notebook) or a datasheet peak times a published
achieved fraction (tutor.bench.ceilings), each with its source. No torch unless --verify.
"""

from __future__ import annotations

import math

import click

from tutor.errors import UserError
from tutor.answers.fields import fit_options
from tutor.theory import fit as fitting
from tutor.theory.units import parse_count

from tutor.commands.json_output import echo_json

# The answer lives in tutor.answers.time (the Fit screen asks it too); its names stay importable from here.
from tutor.answers.time import (  # noqa: F401
    DECODE_BATCHES,
    DEFAULT_TOKENS,
    apply_devices,
    ceilings_dtype,
    check_time_request,
    inference_answer,
    parse_fraction,
    report_for_ceilings,
    resolve_ceilings,
    train_answer,
)


def verify_model(model: str, size: str, recipe: str = "fp32") -> dict:
    """--verify: MODEL's architecture scaled down, predicted from ceilings measured now, then run (tutor.trace.step_verify)."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise UserError("--verify runs the real model: it needs torch and transformers (pip install -e '.[trace]')") from None
    from tutor.trace.step_verify import run_verification
    from tutor.files.models import read_model_config

    return run_verification(read_model_config(model).config, size, recipe=recipe)


@click.command("time")
@fit_options()
@click.option("--tokens", "tokens_text", default=DEFAULT_TOKENS, show_default=True,
              help="Tokens to train on for the time-to-train (15T, 2e12, 300B).")
@click.option("--devices", "devices", type=int, default=None,
              help="Devices in all: sets dp so that dp x tp x pp = N (default: the layout's product).")
@click.option("--price", type=float, default=None, help="Price per device-hour, for the cost of the run.")
@click.option("--mfu", "mfu_text", default=None,
              help="Use a stated utilisation (0.38 or 38%) instead of the counted step: step = FLOPs / (MFU x peak).")
@click.option("--overlap", "overlap_text", default="1", show_default=True,
              help="Share (0-1) of the data-parallel gradient traffic hidden under the backward pass.")
@click.option("--verify", is_flag=True,
              help="Run the real transformers model of MODEL's architecture and compare predicted with measured step, "
                   "prefill and decode: on the CPU scaled down (--verify-size); with --device N on that CUDA GPU, "
                   "at full size where it fits, eager and CUDA graphs (needs torch and transformers).")
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
    from tutor.answers.fit import FitInputs, fit_model

    found = fit_model(model, None)
    arch, name, source = found.arch, found.name, found.source
    assert arch is not None  # a model (not a bare count) resolves to an architecture
    from tutor.trace.device_verify import gpu_index

    gpu = gpu_index(device) if verify else None
    if verify and device is None:  # this machine's device, as `time` answers for it: cuda:0 where there is one
        from tutor.hardware import detect_machine

        gpu = 0 if detect_machine().gpus else None
    tokens = parse_count(tokens_text)
    mfu = parse_fraction(mfu_text, "--mfu")
    if mfu == 0:
        raise UserError("--mfu must be above 0")
    overlap = parse_fraction(overlap_text, "--overlap")
    if overlap is None:
        raise UserError("--overlap needs a fraction between 0 and 1")
    if price is not None and (price < 0 or not math.isfinite(price)):
        raise UserError(f"--price must be a number >= 0, got {price}")
    # The same request `fit` builds from the same options and files (the config's quantization, a checkpoint's stored
    # bytes, an adapter), so both count the same weights.
    from tutor.answers.fit import model_request_settings
    from tutor.hardware.memory_budget import device_budget

    inputs = FitInputs.from_command(model, None, device, **fields)
    try:
        budget = device_budget(device)
    except UserError:
        budget = None  # an unknown device: resolve_ceilings below says so in time's words
    if budget is not None:
        settings, _, file_notes = model_request_settings(found, inputs, budget)
    else:
        settings, file_notes = dict(inputs.request), ()
    request = fitting.FitRequest(**{name: value for name, value in settings.items()
                                    if not (name == "dtype" and value is None)})
    request = apply_devices(request, devices)
    check_time_request(arch, request)
    if gpu is not None:
        from tutor.trace.device_verify import check_device

        check_device(gpu, device)  # before anything is read or measured: no such device is one line
    try:
        ceilings, device_words = resolve_ceilings(device, ceilings_dtype(request))
    except UserError as error:
        if not verify or gpu is not None:
            raise
        ceilings, device_words, missing = None, "this machine", str(error)
    verified: dict | None
    if gpu is not None:  # --verify on a GPU of this machine: the real model there, against `time --device N`
        from tutor.answers.time import device_verification

        config = found.found.config if found.found is not None else None
        if config is None:
            raise UserError("--verify builds the real model: it needs a config.json (a preset, a file or a folder)")
        verified = device_verification(config, request, f"cuda:{gpu}", name=name, source=source)
    else:
        # --verify runs full steps in fp32, or LoRA steps for a LoRA request (QLoRA's kernels need a GPU: refused
        # there)
        verified = verify_model(model, verify_size, str(request.recipe) if request.adapter else "fp32") if verify \
            else None
    if ceilings is None:
        assert verified is not None  # without ceilings only --verify gets this far
        report = {"model": {"name": name, "source": source, "model_type": arch.model_type},
                  "mode": request.mode, "verify": verified, "sources": verified["sources"],
                  "notes": [f"only --verify answered: {missing}"]}
        if as_json:
            echo_json(report)
            return
        from tutor.commands.time_render import render_verify_only

        render_verify_only(report)
        return
    report = report_for_ceilings(arch, request, ceilings, device_words, name=name, source=source, tokens=tokens,
                                 price=price, mfu=mfu, overlap=overlap, device=device,
                                 config=found.found.config if found.found is not None else None,
                                 on_measure=lambda words: click.echo(f"tensor-tutor: {words}", err=True))
    report["notes"] = [*file_notes, *report["notes"]]
    if verified is not None:
        report["verify"] = verified
    if as_json:
        echo_json(report)
        return
    from tutor.commands.time_render import render_report

    render_report(report)
