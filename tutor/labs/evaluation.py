"""evaluation: a held-out loss measured every N training steps, what it costs in time, and why
model.eval() and torch.no_grad() matter.

A small MLP (width `hidden`, `layers` hidden layers of Linear, GELU and Dropout, then Linear(h, 1))
in FP32 learns a fixed random regression task for `steps` steps of `batch` examples; every
`eval_every` steps the held-out loss is computed over `eval_batches` batches the run never trains
on. Measured:

- time: the share of the run's wall time spent evaluating, beside the FLOPs share it predicts: a
  training step costs 6·N FLOPs per example, an evaluation forward 2·N (Kaplan et al. 2020,
  arXiv 2001.08361 §2.1), so with e held-out batches every k steps evaluation's share of the FLOPs
  is 2e / (2e + 6k) (`evaluation_flops_share`);
- memory: the bytes autograd keeps alive at the end of an evaluation loop that sums the loss
  tensors (`total = total + loss`), with gradients on and under torch.no_grad() (PyTorch
  documentation, torch.no_grad: "disabling gradient calculation ... will reduce memory consumption
  for computations that would otherwise have requires_grad=True");
- model.eval(): two evaluations of the same weights in training mode differ (dropout draws new
  masks; PyTorch documentation, nn.Module.eval and nn.Dropout), in evaluation mode they agree.
"""

from __future__ import annotations

import threading
import time
import weakref

from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, make_probe
from tutor.formatting import format_bytes, format_quantity


def evaluation_flops_share(*, eval_every: int, eval_batches: int) -> float:
    """Share of a run's FLOPs spent on held-out evaluation: `eval_batches` forward passes (2·N per
    example) every `eval_every` training steps (6·N per example, the same batch size); Kaplan et al.
    2020, arXiv 2001.08361 §2.1 (forward 2N, backward 4N)."""
    if eval_every < 1 or eval_batches < 0:
        raise ValueError("eval_every must be at least 1 and eval_batches not negative")
    evaluation = 2 * eval_batches
    training = 6 * eval_every
    return evaluation / (evaluation + training)


def mlp_parameters(hidden: int, layers: int) -> int:
    """The lab's MLP: `layers` Linear(h, h) with bias, then Linear(h, 1)."""
    return layers * (hidden * hidden + hidden) + hidden + 1


def mlp_saved_bytes(batch: int, hidden: int, layers: int, *, dropout: bool) -> int:
    """Bytes autograd keeps for backward of one FP32 forward and MSE loss: each Linear's input and
    each GELU's input (b·h FP32 values apiece, the last Linear's input too), mse_loss's input and
    target (b values each), and, in training mode with dropout, each Dropout's mask (b·h bytes, bool)
    (PyTorch derivatives.yaml: addmm saves mat1, gelu self, native_dropout its mask)."""
    floats = batch * (hidden * (2 * layers + 1) + 2)
    masks = layers * batch * hidden if dropout else 0
    return 4 * floats + masks


def eval_graph_bytes(batch: int, hidden: int, layers: int) -> int:
    """Bytes one held-out batch's graph keeps when evaluated with gradients on, in model.eval():
    the inputs of every Linear but the first and of every GELU (2·L tensors of b·h FP32 values) and
    mse_loss's input (b values); the batch itself and its targets are the data, not counted, and
    dropout in eval mode is the identity and saves no mask (PyTorch derivatives.yaml)."""
    return 4 * batch * (2 * layers * hidden + 1)


def _check_fits(params: dict) -> None:
    from tutor.labs.limits import check_lab_fits

    batch, hidden, layers = params["batch"], params["hidden"], params["layers"]
    n_params = mlp_parameters(hidden, layers)
    data = 4 * batch * (hidden + 1) * (1 + params["eval_batches"])
    kept = params["eval_batches"] * mlp_saved_bytes(batch, hidden, layers, dropout=True)
    evals = params["steps"] // params["eval_every"] + 3
    flops = 6 * n_params * batch * params["steps"] + 2 * n_params * batch * params["eval_batches"] * evals
    check_lab_fits("evaluation", memory_bytes=4 * 4 * n_params + data + kept,
                   memory_what=f"weights, gradients and momentum {format_bytes(16 * n_params)}, data "
                               f"{format_bytes(data)}, an evaluation's graphs {format_bytes(kept)}",
                   flops=flops, fix="lower steps, batch, hidden, layers or eval_batches")


def _evaluation(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    progress(0.0, "loading torch")
    import torch

    _check_fits(params)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small kernels: more threads add synchronisation, not speed
    try:
        return _measure(params, progress, cancel)
    finally:
        torch.set_num_threads(threads)


def _measure(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    import torch
    from torch import nn

    torch.manual_seed(params["seed"])
    width, batch = params["hidden"], params["batch"]
    layers: list[nn.Module] = []
    for _ in range(params["layers"]):
        layers += [nn.Linear(width, width), nn.GELU(), nn.Dropout(params["dropout"])]
    model = nn.Sequential(*layers, nn.Linear(width, 1))
    teacher = torch.randn(width, 1) / width**0.5
    generator = torch.Generator().manual_seed(params["seed"] + 1)

    def make_batch():
        x = torch.randn(batch, width, generator=generator)
        return x, torch.tanh(x @ teacher * 3) + 0.1 * torch.randn(batch, 1, generator=generator)

    train_set = [make_batch() for _ in range(params["train_batches"])]
    held_out = [make_batch() for _ in range(params["eval_batches"])]
    optimizer = torch.optim.SGD(model.parameters(), lr=params["lr"], momentum=0.9)

    def evaluate() -> float:
        model.eval()
        with torch.no_grad():
            total = sum(nn.functional.mse_loss(model(x), y).item() for x, y in held_out)
        model.train()
        return total / len(held_out)

    train_s = eval_s = 0.0
    evaluations: list[tuple[int, float, float]] = []
    train_loss = float("nan")
    for step in range(1, params["steps"] + 1):
        if cancel.is_set():
            return ProbeResult("evaluation", (), {}, "cancelled", True, "cpu")
        x, y = train_set[step % len(train_set)]
        started = time.perf_counter()
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        train_loss = loss.item()
        train_s += time.perf_counter() - started
        if step % params["eval_every"] == 0:
            started = time.perf_counter()
            held = evaluate()
            eval_s += time.perf_counter() - started
            evaluations.append((step, train_loss, held))
        if step % 20 == 0:
            progress(0.7 * step / params["steps"], f"step {step} of {params['steps']}")

    progress(0.75, "what an evaluation loop keeps alive")
    data_storages = {t.untyped_storage().data_ptr() for pair in held_out for t in pair}
    weight_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def kept_alive(*, grad: bool) -> int:
        """Bytes of saved tensors still alive after a loop that sums the loss tensors."""
        saved: list[weakref.ref] = []

        def pack(tensor):
            pointer = tensor.untyped_storage().data_ptr()
            if pointer not in data_storages and pointer not in weight_storages:
                saved.append(weakref.ref(tensor))
            return tensor

        model.eval()
        with torch.set_grad_enabled(grad), torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            total = torch.zeros(())
            for x, y in held_out:
                total = total + nn.functional.mse_loss(model(x), y)
        alive, seen = 0, set()
        for ref in saved:
            tensor = ref()
            if tensor is not None and tensor.untyped_storage().data_ptr() not in seen:
                seen.add(tensor.untyped_storage().data_ptr())
                alive += tensor.untyped_storage().nbytes()
        del total
        model.train()
        return alive

    kept_grad = kept_alive(grad=True)
    kept_no_grad = kept_alive(grad=False)

    progress(0.9, "model.train() against model.eval()")
    model.train()
    with torch.no_grad():
        first = sum(nn.functional.mse_loss(model(x), y).item() for x, y in held_out)
        second = sum(nn.functional.mse_loss(model(x), y).item() for x, y in held_out)
    train_mode_spread = abs(first - second) / max(abs(first), 1e-30)
    model.eval()
    with torch.no_grad():
        first = sum(nn.functional.mse_loss(model(x), y).item() for x, y in held_out)
        second = sum(nn.functional.mse_loss(model(x), y).item() for x, y in held_out)
    eval_mode_spread = abs(first - second) / max(abs(first), 1e-30)

    share_theory = evaluation_flops_share(eval_every=params["eval_every"], eval_batches=params["eval_batches"])
    share = eval_s / (train_s + eval_s)
    theory_kept = params["eval_batches"] * eval_graph_bytes(batch, width, params["layers"])
    best_step, _, best_held = min(evaluations, key=lambda entry: entry[2])
    last_step, last_train, last_held = evaluations[-1]
    metrics = {
        "eval_time_share": share,
        "theory_eval_share": share_theory,
        "train_step_ms": 1000 * train_s / params["steps"],
        "eval_pass_ms": 1000 * eval_s / max(len(evaluations), 1),
        "kept_bytes_grad": float(kept_grad),
        "theory_kept_bytes_grad": float(theory_kept),
        "kept_bytes_no_grad": float(kept_no_grad),
        "train_mode_spread": train_mode_spread,
        "eval_mode_spread": eval_mode_spread,
        "train_loss_final": last_train,
        "heldout_loss_final": last_held,
        "heldout_loss_best": best_held,
        "best_step": float(best_step),
        "evaluations": float(len(evaluations)),
    }
    k, e = params["eval_every"], params["eval_batches"]
    rows = (
        Measurement(f"time spent evaluating ({e} batches every {k} steps), share of the run", share, "fraction",
                    share_theory, "FLOPs: 2N per example forward against 6N per training example "
                    "(Kaplan et al. 2020 §2.1)",
                    f"a training step took {format_quantity(metrics['train_step_ms'], 'ms')}, one evaluation "
                    f"{format_quantity(metrics['eval_pass_ms'], 'ms')}; small kernels here carry fixed overheads"),
        Measurement("saved tensors kept alive by an evaluation loop that sums loss tensors, gradients on",
                    float(kept_grad), "bytes", float(theory_kept),
                    f"{e} batches x the Linear and GELU inputs and the loss input (PyTorch derivatives.yaml)",
                    "every batch's graph stays alive through `total`: the memory grows with the held-out set"),
        Measurement("the same loop under torch.no_grad()", float(kept_no_grad), "bytes", 0.0,
                    "no graph is recorded", "what evaluation should cost in activation memory: nothing kept"),
        Measurement("two evaluations of the same weights in model.train(): relative difference",
                    train_mode_spread, "relative", None, "",
                    f"dropout p = {params['dropout']} draws new masks each pass: a noisy held-out loss"),
        Measurement("the same in model.eval()", eval_mode_spread, "relative", 0.0, "dropout off: deterministic",
                    "what the held-out loss should be: a function of the weights alone"),
        Measurement(f"held-out loss at step {last_step} (training loss {format_quantity(last_train, '')})",
                    last_held, "", None, "",
                    f"lowest held-out loss {format_quantity(best_held, '')} at step {best_step}"),
    )
    progress(1.0, "done")
    summary = (f"evaluation took {share:.1%} of the run (FLOPs say {share_theory:.1%}); a gradient-on loop kept "
               f"{format_bytes(kept_grad)} alive, under no_grad {format_bytes(kept_no_grad)}")
    return ProbeResult(probe="evaluation", rows=rows, metrics=metrics, summary=summary, device="cpu")


EVALUATION = make_probe(
    name="evaluation",
    title="A held-out loss every N steps: its time, and no_grad and eval()",
    description="Trains a small MLP with dropout and evaluates a held-out loss every eval_every steps; "
                "measures the share of time evaluation takes against its FLOPs share, the saved tensors an "
                "evaluation loop keeps alive with gradients on and under torch.no_grad(), and how two "
                "evaluations differ in model.train() and model.eval().",
    needs_torch=True,
    params=(
        Param("steps", "int", 200, "training steps", minimum=1, maximum=5000),
        Param("eval_every", "int", 20, "k: evaluate every k steps", minimum=1, maximum=5000),
        Param("eval_batches", "int", 8, "held-out batches per evaluation", minimum=1, maximum=256),
        Param("train_batches", "int", 16, "distinct training batches (cycled)", minimum=1, maximum=1024),
        Param("batch", "int", 64, "examples per batch", minimum=1, maximum=4096),
        Param("hidden", "int", 128, "width of the MLP", minimum=4, maximum=2048),
        Param("layers", "int", 3, "hidden layers", minimum=1, maximum=16),
        Param("dropout", "float", 0.1, "dropout probability", minimum=0.0, maximum=0.9),
        Param("lr", "float", 0.01, "learning rate (SGD with momentum 0.9)", minimum=1e-6, maximum=1.0),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(10.0, "seconds allowed (informative: the model is small)"),
    ),
    metrics=("eval_time_share", "theory_eval_share", "train_step_ms", "eval_pass_ms", "kept_bytes_grad",
             "theory_kept_bytes_grad", "kept_bytes_no_grad", "train_mode_spread", "eval_mode_spread",
             "train_loss_final", "heldout_loss_final", "heldout_loss_best", "best_step", "evaluations"),
    body=_evaluation,
)
