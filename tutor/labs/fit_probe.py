"""fit: does a model fit this machine's memory right now? tutor.theory.fit against measured free memory.

The memory per device comes from tutor.theory.fit (the same estimate `tensor-tutor fit` prints);
the capacity is measured now: the first GPU's free memory (NVML), else available RAM (psutil).
"""

from __future__ import annotations

import threading

from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, make_probe
from tutor.theory.fit import RECIPES
from tutor.theory.memory import OPTIMIZERS, WEIGHT_FORMATS

MODES = ("inference", "train")
COMPONENTS = ("weights", "gradients", "optimizer", "activations", "kv_cache", "overhead")


def _capacity(params: dict) -> tuple[int | None, str, bool, str]:
    """(bytes available, where the figure comes from, is it a GPU, device name)."""
    from tutor.hardware.memory_budget import device_budget

    budget = device_budget(params["capacity"] or ("cpu" if params["device"] == "cpu" else None))
    device = {"cpu": "cpu", "cuda": budget.name.replace("GPU ", "cuda:", 1)}.get(budget.kind, budget.name)
    return budget.capacity, budget.source, budget.gpu, device


def _fit(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.theory import fit as fitting
    from tutor.model_files import resolve_model
    from tutor.formatting import format_bytes

    if cancel.is_set():
        return ProbeResult("fit", (), {}, "cancelled", True, "cpu")
    progress(0.0, "reading free memory")
    capacity, source, gpu, device = _capacity(params)
    arch, _where = resolve_model(params["model"])
    request = fitting.FitRequest(mode=params["mode"], dtype=params["dtype"], recipe=params["recipe"],
                                 optimizer=params["optimizer"], batch=params["batch"], seq_len=params["seq"],
                                 attention=params["attention"], gpu=gpu)
    progress(0.5, "estimating")
    estimate = fitting.estimate(arch, request)
    worst = estimate.worst
    rows: list[Measurement] = []
    metrics: dict[str, float] = {}
    for name in COMPONENTS:  # every component, 0 when this mode has none (inference: no gradients)
        metrics[f"{name}_bytes"] = float(worst.component(name))
    for component in worst.components:
        if component.bytes:
            rows.append(Measurement(component.name.replace("_", " "), None, "bytes", float(component.bytes),
                                    component.formula))
    total = worst.total
    metrics["total_bytes"] = float(total)
    rows.append(Measurement("total needed", None, "bytes", float(total), "the same estimate as `tensor-tutor fit`"))
    if capacity is not None:
        metrics["capacity_bytes"] = float(capacity)
        metrics["fits"] = 1.0 if total <= capacity else 0.0
        metrics["total_over_capacity"] = total / capacity
        verdict = "fits" if total <= capacity else "does not fit"
        # Free memory is not a prediction of the estimate: a percent "of theory" would read as agreement.
        rows.append(Measurement(f"memory available on {device}", float(capacity), "bytes", note=source))
        rows.append(Measurement("needed over available", total / capacity, "x", note=(
            f"the total needed over the memory free now: {verdict}")))
        summary = (f"{arch.name or params['model']} ({params['mode']}, {params['dtype']}) needs {format_bytes(total)}; "
                   f"{device} has {format_bytes(capacity)} free: it {verdict}")
    else:
        summary = f"{arch.name or params['model']} needs {format_bytes(total)}; free memory unknown ({source})"
    progress(1.0, "done")
    return ProbeResult(probe="fit", rows=tuple(rows), metrics=metrics, summary=summary, cancelled=False,
                       device=device.split(" ")[0])


FIT = make_probe(
    name="fit",
    title="Does it fit here?",
    description="Estimates the memory a model needs (tutor.theory.fit: weights, gradients, optimizer, "
                "activations, KV cache, overhead) and compares it with this machine's free memory now.",
    needs_torch=False,
    params=(
        Param("model", "text", "llama-3.2-1b", "a preset name (tensor-tutor models) or a config.json path"),
        Param("mode", "str", "inference", "inference or train", choices=MODES),
        Param("dtype", "str", "bf16", "weight storage", choices=tuple(WEIGHT_FORMATS)),
        Param("recipe", "str", "mixed", "training precision recipe", choices=RECIPES),
        Param("optimizer", "str", "adam", "optimizer", choices=tuple(OPTIMIZERS)),
        Param("batch", "int", 1, "micro-batch (inference: sequences)", minimum=1, maximum=1 << 20),
        Param("seq", "int", 2048, "tokens per sequence", minimum=1, maximum=1 << 24),
        Param("attention", "str", "flash", "eager or flash", choices=("eager", "flash")),
        Param("capacity", "text", None, "a memory size such as 24GiB instead of this machine's", optional=True),
        Param("device", "str", "auto", "auto (first GPU, else RAM) or cpu", choices=("auto", "cpu")),
    ),
    metrics=("total_bytes", "capacity_bytes", "fits", "total_over_capacity") + tuple(f"{c}_bytes" for c in COMPONENTS),
    body=_fit,
)
