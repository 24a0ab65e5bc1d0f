"""grad-accumulation: k micro-batches with the loss divided by k give the big batch's gradient,
while the activations kept for backward shrink to a micro-batch's.

A small MLP (width `hidden`, `layers` hidden layers) in FP32. The big batch of `batch` examples is
run once; then the same examples as `micro_batches` slices, each loss divided by k, backward after
each, gradients summed in .grad. The mean loss is a mean over examples, so the sum over slices of
(slice mean / k) is the big mean: the gradients agree up to FP32 rounding of the sums' order
(NVIDIA NeMo user guide, "Batching": global batch = micro-batch × data-parallel size × accumulation steps).
Activation bytes are what autograd saved for backward, counted with saved_tensors_hooks.
"""

from __future__ import annotations

import threading

from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe
from tutor.formatting import format_bytes, format_number, format_quantity


def activation_bytes_ratio(micro_batch: int, batch: int) -> float:
    """Activations kept for backward scale with the examples in flight: micro_batch / batch
    (Korthikanti et al. 2022, arXiv 2205.05198 eq. 1: every term is proportional to s*b)."""
    return micro_batch / batch


def mlp_parameters(hidden: int, layers: int) -> int:
    """The lab's MLP: `layers` Linear(h, h) with bias, then Linear(h, 1)."""
    return layers * (hidden * hidden + hidden) + hidden + 1


def mlp_saved_bytes(batch: int, hidden: int, layers: int) -> int:
    """FP32 bytes autograd keeps for backward of the big batch: each Linear saves its input (addmm's
    mat1) and each GELU its input, b·h values apiece, and mse_loss its input and target, b values each
    (PyTorch derivatives.yaml); tests/test_lab_limits.py checks it against the saved-tensor hooks' count."""
    return 4 * batch * (hidden * (2 * layers + 1) + 2)


def _check_fits(params: dict) -> None:
    """Weights, .grad and the three gradient copies the lab keeps, the inputs and the big batch's
    saved activations; training FLOPs 6·N per example (Kaplan et al. 2020 §2.1) for the big batch
    and the two accumulated passes."""
    from tutor.labs.limits import check_lab_fits

    batch, hidden, layers = params["batch"], params["hidden"], params["layers"]
    n_params = mlp_parameters(hidden, layers)
    states = 5 * 4 * n_params
    activations = mlp_saved_bytes(batch, hidden, layers) + 4 * batch * (hidden + 1)  # + inputs and targets
    check_lab_fits("grad-accumulation", memory_bytes=states + activations,
                   memory_what=f"weights, gradients and their copies {format_bytes(states)}, "
                               f"activations {format_bytes(activations)}",
                   flops=3 * 6 * n_params * batch, fix="lower batch, hidden or layers")


def _grad_accumulation(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    progress(0.0, "loading torch")
    import torch
    from torch import nn

    from tutor.errors import UserError
    from tutor.labs.gradients import grad_of

    batch, k = params["batch"], params["micro_batches"]
    if batch % k:
        raise UserError(f"grad-accumulation: batch ({batch}) must be a multiple of micro_batches ({k})")
    _check_fits(params)
    torch.manual_seed(params["seed"])
    width = params["hidden"]
    layers: list[nn.Module] = []
    for _ in range(params["layers"]):
        layers += [nn.Linear(width, width), nn.GELU()]
    model = nn.Sequential(*layers, nn.Linear(width, 1))
    inputs = torch.randn(batch, width)
    targets = torch.randn(batch, 1)
    saved_bytes = 0
    seen: set[int] = set()
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal saved_bytes
        # weights are saved too (as views such as weight.t()): they are not activations
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            saved_bytes += storage.nbytes()
        return tensor

    def loss_of(x: torch.Tensor, y: torch.Tensor, divide: int) -> tuple[torch.Tensor, int]:
        nonlocal saved_bytes
        saved_bytes = 0
        seen.clear()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = nn.functional.mse_loss(model(x), y) / divide
        return loss, saved_bytes

    def gradients() -> list[torch.Tensor]:
        return [grad_of(p).detach().clone() for p in model.parameters()]

    progress(0.2, "one big batch")
    loss, full_bytes = loss_of(inputs, targets, 1)
    loss.backward()
    full = gradients()
    model.zero_grad(set_to_none=True)
    results = {}
    for divide_by_k in (True, False):
        if cancel.is_set():
            return ProbeResult("grad-accumulation", (), {}, "cancelled", True, "cpu")
        progress(0.4 if divide_by_k else 0.7, f"{k} micro-batches" + ("" if divide_by_k else ", loss not divided by k"))
        micro_bytes = 0
        for x, y in zip(inputs.chunk(k), targets.chunk(k), strict=True):
            # a slice is a view of the whole batch's storage; a data loader hands over its own
            loss, used = loss_of(x.clone(), y.clone(), k if divide_by_k else 1)
            micro_bytes = max(micro_bytes, used)
            loss.backward()  # adds into .grad
        results[divide_by_k] = (gradients(), micro_bytes)
        model.zero_grad(set_to_none=True)
    accumulated, micro_bytes = results[True]
    undivided, _ = results[False]
    zero = torch.tensor(0.0)
    norm = torch.sqrt(sum(((g**2).sum() for g in full), zero)).item()
    difference = torch.sqrt(sum((((a - f) ** 2).sum() for a, f in zip(accumulated, full, strict=True)),
                                zero)).item() / norm
    undivided_ratio = torch.sqrt(sum(((u**2).sum() for u in undivided), zero)).item() / norm
    from tutor.theory.formats import format_by_name

    fp32_eps = float(format_by_name("fp32").epsilon)
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    metrics = {
        "grad_rel_difference": difference,
        "undivided_grad_ratio": undivided_ratio,
        "activation_bytes_full": float(full_bytes),
        "activation_bytes_micro": float(micro_bytes),
        "activation_ratio": micro_bytes / full_bytes,
        "gradient_bytes": float(gradient_bytes),
        "global_batch": float(batch),
        "micro_batch": float(batch // k),
    }
    rows = (
        Measurement(f"accumulated gradient ({k} x {batch // k}) vs big batch ({batch}): relative difference",
                    difference, "relative", 0.0, "the sum of slice means / k is the big mean (exact arithmetic)",
                    f"FP32 epsilon is {format_number(fp32_eps)}: the sums are added in another order, so they round differently"),
        Measurement("the same without dividing each loss by k: gradient norm / big batch's", undivided_ratio, "x",
                    float(k), "k micro-batch means summed instead of averaged",
                    "the classic bug: under SGD a step k times too large; Adam normalises its update, so its "
                    "step hardly changes, but gradient clipping sees a norm k times larger"),
        Measurement("activations kept for backward, one micro-batch / big batch", metrics["activation_ratio"], "x",
                    activation_bytes_ratio(batch // k, batch), "Korthikanti et al. 2022 eq. 1 (proportional to b)",
                    f"{format_bytes(micro_bytes)} against {format_bytes(full_bytes)}; "
                    "each saved tensor counted once by its storage; weights excluded"),
        Measurement("gradient buffer (same either way)", float(gradient_bytes), "bytes", float(gradient_bytes),
                    "one FP32 number per parameter", "accumulation adds into it in place"),
    )
    progress(1.0, "done")
    summary = (f"{k} micro-batches of {batch // k}: gradient differs from the batch of {batch} by "
               f"{format_number(difference, digits=2)} (relative); activations "
               f"{format_quantity(metrics['activation_ratio'], 'x')} the big batch's")
    return ProbeResult(probe="grad-accumulation", rows=rows, metrics=metrics, summary=summary, device="cpu")


GRAD_ACCUMULATION = make_probe(
    name="grad-accumulation",
    title="Gradient accumulation against one big batch",
    description="Computes a small MLP's gradient on one big batch and on k micro-batches accumulated, and "
                "compares the gradients and the activation bytes autograd kept.",
    needs_torch=True,
    params=(
        Param("batch", "int", 64, "examples in the global batch", minimum=1, maximum=8192),
        Param("micro_batches", "int", 8, "k: slices the batch is cut into", minimum=1, maximum=1024),
        Param("hidden", "int", 256, "width of the MLP", minimum=4, maximum=2048),
        Param("layers", "int", 3, "hidden layers", minimum=1, maximum=16),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(3.0, "seconds allowed (informative: the model is small)"),
    ),
    metrics=("grad_rel_difference", "undivided_grad_ratio", "activation_bytes_full", "activation_bytes_micro",
             "activation_ratio", "gradient_bytes", "global_batch", "micro_batch"),
    body=_grad_accumulation,
)
