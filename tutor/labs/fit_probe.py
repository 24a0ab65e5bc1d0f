"""fit: does a model fit this machine's memory right now? The fit answer against measured free memory.

The memory per device comes from tutor.answers.fit (the same answer `tensor-tutor fit` prints);
the capacity is measured now: the first GPU's free memory (NVML), else available RAM (psutil).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, fit_params, make_probe
from tutor.theory.fit import COMPONENTS

if TYPE_CHECKING:
    from tutor.hardware.memory_budget import DeviceBudget

REQUEST_FIELDS = ("mode", "dtype", "recipe", "optimizer", "batch", "seq", "attention")
"""The fit fields the lab takes (tutor.answers.fields declares them: defaults, choices, ranges)."""


def _budget(params: dict) -> tuple[DeviceBudget, str]:
    """The device budget (capacity, where it comes from, GPU or not) and the device's short name."""
    from tutor.hardware.memory_budget import device_budget

    budget = device_budget(params["capacity"] or ("cpu" if params["device"] == "cpu" else None))
    device = {"cpu": "cpu", "cuda": budget.name.replace("GPU ", "cuda:", 1)}.get(budget.kind, budget.name)
    return budget, device


def _fit(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.answers.fit import FitInputs, answer_fit
    from tutor.formatting import format_bytes

    if cancel.is_set():
        return ProbeResult("fit", (), {}, "cancelled", True, "cpu")
    progress(0.0, "reading free memory")
    budget, device = _budget(params)
    capacity, source = budget.capacity, budget.source
    question = {name: params[name] for name in REQUEST_FIELDS}
    progress(0.5, "estimating")
    answer = answer_fit(FitInputs.from_values({"model": params["model"], **question}, budget=budget, searches=False))
    worst = answer.worst
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
        summary = (f"{answer.name} ({params['mode']}, {params['dtype']}) needs {format_bytes(total)}; "
                   f"{device} has {format_bytes(capacity)} free: it {verdict}")
    else:
        summary = f"{answer.name} needs {format_bytes(total)}; free memory unknown ({source})"
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
        *fit_params(("model", *REQUEST_FIELDS), defaults={"model": "llama-3.2-1b", "seq": 2048, "attention": "flash"},
                    choices={"attention": ("eager", "flash")},
                    helps={"model": "a preset name (tensor-tutor models) or a config.json path",
                           "attention": "eager or flash"}),
        Param("capacity", "text", None, "a memory size such as 24GiB instead of this machine's", optional=True),
        Param("device", "str", "auto", "auto (first GPU, else RAM) or cpu", choices=("auto", "cpu")),
    ),
    metrics=("total_bytes", "capacity_bytes", "fits", "total_over_capacity") + tuple(f"{c}_bytes" for c in COMPONENTS),
    body=_fit,
)
