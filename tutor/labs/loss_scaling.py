"""loss-scaling: the same small training run in FP32, in FP16 without a loss scaler, and in FP16
with torch.amp.GradScaler, with the gradients that underflow to zero counted.

The model is a small MLP whose weights are held in FP16 (the FP16 copy a mixed-precision run
computes with; the FP32 master copy is kept by the optimizer here as in Micikevicius et al. 2017,
arXiv 1710.03740 §3.1). The loss is multiplied by `loss_factor` to place the gradients where a
large model's are: Micikevicius et al. §3.2 (Figure 3) found most activation gradients of a real
network below FP16's range. GradScaler multiplies the loss by S before backward, unscales the
gradients in FP32, skips a step whose gradients overflowed and halves S, and doubles S after
`growth_interval` good steps (torch.amp.GradScaler, which runs on the CPU in torch 2.x).
"""

from __future__ import annotations

import threading
import time

from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs.gradients import grad_of
from tutor.labs._params import Param, budget_param, make_probe
from tutor.formatting import format_number

RUNS = ("fp32", "fp16", "fp16_scaled")


def fp16_flush_threshold() -> float:
    """Magnitudes that FP16 rounds to zero: below half its smallest subnormal, 2^-25
    (IEEE 754-2019 binary16; tutor.theory.formats)."""
    from tutor.theory.formats import format_by_name

    return float(format_by_name("fp16").min_subnormal) / 2


def _run(kind: str, params: dict, cancel: threading.Event):
    import torch
    from torch import nn

    torch.manual_seed(params["seed"])
    width = params["hidden"]
    master = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                           nn.Linear(width, 1))
    generator = torch.Generator().manual_seed(params["seed"] + 1)
    inputs = torch.randn(params["batch"], width, generator=generator)
    targets = torch.sin(inputs[:, :1] * 3)
    dtype = torch.float32 if kind == "fp32" else torch.float16
    working = [p.detach().to(dtype).requires_grad_() for p in master.parameters()]
    optimizer = torch.optim.SGD(master.parameters(), lr=params["lr"])
    scaler = torch.amp.GradScaler("cpu", init_scale=params["init_scale"]) if kind == "fp16_scaled" else None
    losses, zero_fractions, skipped = [], [], 0
    for step in range(params["steps"]):
        if cancel.is_set():
            return None
        x = inputs.to(dtype)
        h = x
        for index in range(0, len(working) - 2, 2):
            h = torch.tanh(h @ working[index].T + working[index + 1])
        out = h @ working[-2].T + working[-1]
        loss = ((out.float() - targets) ** 2).mean()
        losses.append(loss.item())
        scaled = loss * params["loss_factor"]
        (scaler.scale(scaled) if scaler else scaled).backward()
        zeros = sum(int((grad_of(w) == 0).sum()) for w in working) / sum(w.numel() for w in working)
        zero_fractions.append(zeros)
        for p, w in zip(master.parameters(), working, strict=True):
            # divide the factor out again, in FP32, as an optimizer would see a normal gradient
            p.grad = grad_of(w).float() / params["loss_factor"]
            w.grad = None
        if scaler:
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            skipped += scaler.get_scale() < before
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, w in zip(master.parameters(), working, strict=True):
                w.copy_(p.to(dtype))
    return {"loss_start": losses[0], "loss_end": losses[-1], "zero_fraction": sum(zero_fractions) / len(zero_fractions),
            "skipped": skipped, "scale": scaler.get_scale() if scaler else 1.0}


def _reference_below_threshold(params: dict) -> float:
    """Share of the FP32 run's first gradients (times loss_factor) that FP16 would round to 0."""
    import torch
    from torch import nn

    torch.manual_seed(params["seed"])
    width = params["hidden"]
    model = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 1))
    generator = torch.Generator().manual_seed(params["seed"] + 1)
    inputs = torch.randn(params["batch"], width, generator=generator)
    loss = ((model(inputs) - torch.sin(inputs[:, :1] * 3)) ** 2).mean() * params["loss_factor"]
    loss.backward()
    threshold = fp16_flush_threshold()
    grads = [grad_of(p) for p in model.parameters()]
    return sum(int((g.abs() < threshold).sum()) for g in grads) / sum(g.numel() for g in grads)


def _loss_scaling(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    progress(0.0, "loading torch")
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    started = time.perf_counter()
    try:
        results = {}
        for index, kind in enumerate(RUNS):
            progress(index / (len(RUNS) + 1), f"training in {kind.replace('_', ' + ')}")
            result = _run(kind, params, cancel)
            if result is None:
                return ProbeResult("loss-scaling", (), {}, "cancelled", True, "cpu")
            results[kind] = result
        predicted = _reference_below_threshold(params)
    finally:
        torch.set_num_threads(threads)
    metrics: dict[str, float] = {"predicted_zero_fraction_fp16": predicted}
    rows: list[Measurement] = []
    for kind in RUNS:
        result = results[kind]
        metrics[f"zero_grad_fraction_{kind}"] = result["zero_fraction"]
        metrics[f"loss_ratio_{kind}"] = result["loss_end"] / result["loss_start"]
        label = {"fp32": "FP32", "fp16": "FP16, no loss scaling", "fp16_scaled": "FP16 + GradScaler"}[kind]
        theory = predicted if kind == "fp16" else (0.0 if kind == "fp32" else None)
        rows.append(Measurement(
            f"{label}: weight gradients exactly 0", result["zero_fraction"], "fraction", theory,
            "share of the FP32 gradients below 2^-25 (FP16 rounds them to 0)" if kind == "fp16" else
            ("FP32 reaches 1e-45" if kind == "fp32" else ""),
            "mean over the steps" + ("; more than the weight gradients alone predict: activation gradients "
                                     "underflow first and zero everything behind them" if kind == "fp16" else "")))
        rows.append(Measurement(f"{label}: loss after {params['steps']} steps / before",
                                metrics[f"loss_ratio_{kind}"], "x",
                                note="below 1: the run learned" + (
                                    f"; final scale S = {format_number(result['scale'])}, {result['skipped']} steps skipped "
                                    "after an overflow" if kind == "fp16_scaled" else "")))
    metrics["final_scale"] = results["fp16_scaled"]["scale"]
    metrics["skipped_steps"] = float(results["fp16_scaled"]["skipped"])
    progress(1.0, "done")
    summary = (f"gradients that are exactly 0: FP32 {metrics['zero_grad_fraction_fp32']:.1%}, FP16 "
               f"{metrics['zero_grad_fraction_fp16']:.1%}, FP16 + GradScaler {metrics['zero_grad_fraction_fp16_scaled']:.1%} "
               f"(in {time.perf_counter() - started:.1f} s)")
    return ProbeResult(probe="loss-scaling", rows=tuple(rows), metrics=metrics, summary=summary, device="cpu")


LOSS_SCALING = make_probe(
    name="loss-scaling",
    title="FP16 training with and without a loss scaler",
    description="Trains a small MLP in FP32, in FP16 and in FP16 with torch.amp.GradScaler, with the loss "
                "multiplied by a small factor as a large model's gradients are small, and counts the "
                "gradients that underflow to zero.",
    needs_torch=True,
    params=(
        Param("hidden", "int", 128, "width of the MLP", minimum=4, maximum=1024),
        Param("batch", "int", 64, "examples per step", minimum=1, maximum=4096),
        Param("steps", "int", 30, "training steps per run", minimum=2, maximum=1000),
        Param("loss_factor", "float", 2.0**-16, "the loss is multiplied by this (small gradients)",
              minimum=1e-12, maximum=1.0),
        Param("init_scale", "float", 2.0**16, "GradScaler's first scale S", minimum=1.0, maximum=2.0**32),
        Param("lr", "float", 0.05, "learning rate (SGD)", minimum=1e-6, maximum=10.0),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(5.0, "seconds allowed (informative: the runs are small)"),
    ),
    metrics=("predicted_zero_fraction_fp16", "final_scale", "skipped_steps")
    + tuple(f"{kind}_{run}" for run in RUNS for kind in ("zero_grad_fraction", "loss_ratio")),
    body=_loss_scaling,
)
