"""time-to-train: how long a training run takes on a cluster of named cards, as `tensor-tutor time` answers it.

No torch: the step is tutor.theory.step_time's (`training_step_time`, then `training_run`), on the card's
ceilings from tutor.bench.ceilings (`device_ceilings`: its datasheet peak times a published achieved
fraction, each with its citation), the same calls `tensor-tutor time MODEL --device CARD --mfu M
--devices N --tokens T` makes. With `mfu` given (the Llama 3 paper's Table 4: 41% for 16,384 GPUs at
8K tokens, 38% for its long-context phase), the step is the model FLOPs
over mfu x peak x devices; with mfu 0 it is counted operation by operation on the ceilings instead.
Rows are theory: a prediction from published figures, no measurement of this machine.
"""

from __future__ import annotations

import threading

from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, make_probe

SECONDS_PER_DAY = 24 * 3600
METRICS = ("days", "device_hours", "flops", "step_s", "tokens_per_s", "mfu")
PARAMS = (
    Param("model", "text", "llama-3.1-405b", "a preset name (tensor-tutor models) or a config.json"),
    Param("tokens", "text", "15.6T", "tokens to train on (15.6T, 2e12, 300B)"),
    Param("device", "text", "h100-sxm", "a card by name (tensor-tutor models --devices)"),
    Param("devices", "int", 16384, "devices in all: dp is devices / (tp x pp)", minimum=1, maximum=10**7),
    Param("tp", "int", 8, "tensor-parallel degree", minimum=1, maximum=1024),
    Param("pp", "int", 16, "pipeline stages", minimum=1, maximum=1024),
    Param("seq", "int", 8192, "tokens per sequence", minimum=1, maximum=10**7),
    Param("batch", "int", 1, "sequences per micro-batch per data-parallel rank", minimum=1, maximum=10**6),
    Param("mfu", "float", 0.38, "stated utilisation (the Llama 3 paper's Table 4: 0.41 at 16,384 GPUs and 8K "
          "tokens, 0.38 in its long-context phase); 0 counts the step instead",
          minimum=0.0, maximum=1.0, unit="fraction"),
)


def _time_to_train(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.bench.ceilings import compute_dtype, device_ceilings
    from tutor.errors import UserError
    from tutor.answers.fit import resolve_fit_model
    from tutor.formatting import format_count, format_number, format_percent
    from tutor.theory.fit import FitRequest, validate_request
    from tutor.theory.step_time import training_run, training_step_time
    from tutor.theory.units import parse_count

    if cancel.is_set():
        return ProbeResult("time-to-train", (), {}, "cancelled", True, "cpu")
    progress(0.0, "counting the step")
    arch, name, _source, _count = resolve_fit_model(params["model"], None)
    if arch is None:
        raise UserError("time-to-train: name a model with an architecture (a preset or a config.json)")
    tp, pp, devices = params["tp"], params["pp"], params["devices"]
    if devices % (tp * pp):
        raise UserError(f"time-to-train: devices {devices} is not a multiple of tp x pp = {tp * pp}")
    request = FitRequest(mode="train", batch=params["batch"], seq_len=params["seq"], dp=devices // (tp * pp), tp=tp,
                         pp=pp, microbatches=pp if pp > 1 else None)
    validate_request(arch, request)
    ceilings, device_words = device_ceilings(params["device"], compute_dtype(request))
    if ceilings.peak_flops is None:
        raise UserError(f"time-to-train: {params['device']} has no datasheet peak; name a card such as h100-sxm")
    mfu = params["mfu"] or None
    step = training_step_time(arch, request, ceilings, mfu=mfu)
    run = training_run(step, tokens=parse_count(params["tokens"]))
    days = run.seconds / SECONDS_PER_DAY
    achieved = step.mfu(ceilings.peak_flops.value)
    how = (f"step = model FLOPs / ({format_percent(mfu)} MFU x {ceilings.peak_flops.source} x {devices:,} devices)"
           if mfu else f"step counted operation by operation on {device_words}")
    rows = (
        Measurement("model FLOPs of the run", None, "FLOP", run.flops, "forward + backward counted op by op "
                    "(tutor.theory.step_time.model_flops_per_token) x tokens"),
        Measurement("training step", None, "s", step.seconds, how),
        Measurement("tokens per second", None, "tokens/s", step.tokens_per_second, how),
        Measurement("days to train", None, "days", days, f"tokens / tokens per second, on {devices:,} devices"),
        Measurement("device-hours", None, "device-hours", run.device_hours, "days x 24 x devices (the Llama 3.1 model card's unit)"),
    )
    metrics = {"days": days, "device_hours": run.device_hours, "flops": run.flops, "step_s": step.seconds,
               "tokens_per_s": step.tokens_per_second, "mfu": achieved}
    progress(1.0, "done")
    summary = (f"{name} on {format_count(run.tokens)} tokens, {devices:,} x {device_words}: {format_number(days)} days, "
               f"{format_count(run.device_hours)} device-hours at {format_percent(achieved)} MFU")
    return ProbeResult("time-to-train", rows, metrics, summary, False, "theory",
                       details={"sources": ceilings.sources()})


TIME_TO_TRAIN = make_probe(
    name="time-to-train", title="How long a training run takes on a cluster",
    description="The days, device-hours and FLOPs of a training run on N named cards, from the card's datasheet peak "
                "and a stated MFU (or the counted step on its sourced ceilings): tensor-tutor time's model.",
    needs_torch=False, params=PARAMS, metrics=METRICS, body=_time_to_train)
