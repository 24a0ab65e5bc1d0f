"""training-step: the memory anatomy of one real training step of a tiny language model.

A TinyLM (tutor.labs.tiny_transformer) takes one step: forward (the tensors autograd saves are
recorded), cross-entropy loss, backward, optimizer step. What torch then holds is counted exactly:
parameter bytes, .grad bytes, the optimizer's state tensors (and the fp32 master copy for the
mixed recipe), and the saved activations; each is set beside tutor.theory.memory
(model_state_bytes_per_param) and tutor.theory.activations for the same model.

Recipes as they are implemented here (all runnable on a CPU):
- fp32: fp32 weights, gradients and optimizer states;
- bf16: bf16 weights, gradients and states, no master copy ("pure bf16");
- mixed: bf16 weights and gradients, an fp32 master copy that the optimizer updates (its states
  therefore fp32), copied back to the bf16 weights after each step (ZeRO §3.1's 2 + 2 + 12).
On a GPU the same step is also read from the CUDA caching allocator (torch.cuda.memory_allocated
deltas after each phase), which counts everything the step allocates.
"""

from __future__ import annotations

import math
import threading

from tutor.errors import UserError
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, make_probe, resolve_device
from tutor.formatting import format_bytes, format_number

RECIPES = ("fp32", "bf16", "mixed")
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum")
STYLES = ("llama", "gpt")
MAX_PARAMS = 50_000_000
TRAINING_METRICS = (
    "params", "param_bytes", "theory_param_bytes", "grad_bytes", "theory_grad_bytes", "optimizer_bytes",
    "theory_optimizer_bytes", "step_counter_bytes", "bytes_per_param", "theory_bytes_per_param",
    "layer_activation_bytes", "theory_layer_activation_bytes", "activation_bytes", "total_bytes", "loss",
    "cuda_allocated_bytes",
)


def _optimizer(name: str, params, lr: float = 1e-3):
    import torch

    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    return torch.optim.SGD(params, lr=lr, momentum=0.9)


def _tensor_bytes(tensors) -> int:
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is not None:
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _check_machine(params: dict, approx_params: int, ffn: int) -> None:
    """Model states (tutor.theory.memory), the layers' activations (Korthikanti's count, eager
    attention as the TinyLM runs it) and the logits with their fp32 copy and gradient, against this
    machine's memory; PaLM's training FLOPs against its peak (tutor.labs.limits)."""
    from tutor.labs.limits import check_lab_fits
    from tutor.theory.activations import activation_bytes_per_layer, logits_bytes
    from tutor.theory.flops import training_flops_per_token
    from tutor.theory.memory import model_state_bytes

    hidden, heads, layers = params["hidden"], params["heads"], params["layers"]
    seq, batch = params["seq"], params["batch"]
    value_bytes = 4 if params["recipe"] == "fp32" else 2
    states = model_state_bytes(approx_params, params["recipe"], params["optimizer"])
    activations = layers * activation_bytes_per_layer(
        seq_len=seq, batch=batch, hidden=hidden, heads=heads, kv_heads=heads, head_dim=hidden // heads, ffn=ffn,
        gated_mlp=params["style"] == "llama", dropout=params["style"] == "gpt", attention="eager",
        bytes_per_value=value_bytes)
    logits = logits_bytes(seq_len=seq, batch=batch, vocab=params["vocab"])  # with the fp32 copy and the gradient
    flops = batch * seq * training_flops_per_token(params=approx_params, layers=layers, heads=heads,
                                                   head_dim=hidden // heads, seq_len=seq)
    check_lab_fits("training-step", memory_bytes=states + activations + logits,
                   memory_what=f"model states {format_bytes(states)}, activations {format_bytes(activations)}, "
                               f"logits {format_bytes(logits)}",
                   device=resolve_device(params["device"]), flops=flops,
                   dtype="fp32" if params["recipe"] == "fp32" else "bf16", fix="lower batch, seq, layers or vocab")


def _training_step(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.labs.activation_memory import GROUPS, default_ffn
    from tutor.theory.activations import (
        embedding_activation_bytes,
        input_ids_bytes,
        layer_activation_terms,
        megatron_output_layer_activation_bytes,
    )
    from tutor.theory.memory import model_state_bytes_per_param

    hidden, heads, layers, vocab = params["hidden"], params["heads"], params["layers"], params["vocab"]
    seq, batch, recipe, optimizer_name = params["seq"], params["batch"], params["recipe"], params["optimizer"]
    if hidden % heads:
        raise UserError(f"training-step: heads ({heads}) must divide hidden ({hidden})")
    ffn = default_ffn(params["style"], hidden)
    approx_params = 2 * vocab * hidden + layers * (4 * hidden * hidden + 3 * hidden * ffn)
    if approx_params > MAX_PARAMS:
        raise UserError(f"training-step: about {approx_params:,} parameters; the lab allows {MAX_PARAMS:,} "
                        "(lower hidden, layers or vocab)")
    _check_machine(params, approx_params, ffn)
    progress(0.0, "loading torch")
    import torch
    import torch.nn.functional as F

    from tutor.labs.gradients import grad_of
    from tutor.labs.tiny_transformer import BlockShape, SavedTensorRecorder, TinyLM

    device = resolve_device(params["device"])
    on_cuda = device.startswith("cuda")
    torch.manual_seed(params["seed"])
    shape = BlockShape(hidden=hidden, heads=heads, kv_heads=heads, ffn=ffn, style=params["style"],
                       attention="eager", dropout=0.1 if params["style"] == "gpt" else 0.0)
    model_dtype = torch.float32 if recipe == "fp32" else torch.bfloat16
    allocated: dict[str, int] = {}
    if on_cuda:  # GPU path: the caching allocator's view of each phase
        torch.cuda.synchronize(device)
        allocated["start"] = torch.cuda.memory_allocated(device)
    model = TinyLM(shape, layers, vocab).to(device=device, dtype=model_dtype).train()
    weights = list(model.parameters())
    master = [w.detach().float().clone().requires_grad_(True) for w in weights] if recipe == "mixed" else []
    optimizer = _optimizer(optimizer_name, master or weights)
    if on_cuda:
        allocated["weights"] = torch.cuda.memory_allocated(device)
    ids = torch.randint(0, vocab, (batch, seq), device=device)
    if cancel.is_set():
        return ProbeResult("training-step", (), {}, "cancelled before the forward pass", True, device)
    progress(0.2, "forward pass")
    with SavedTensorRecorder(model) as recorder:
        logits = model(ids)
        loss = F.cross_entropy(logits.float().view(-1, vocab), ids.view(-1))
    if on_cuda:
        allocated["after forward"] = torch.cuda.memory_allocated(device)
    if cancel.is_set():
        return ProbeResult("training-step", (), {}, "cancelled after the forward pass", True, device)
    progress(0.5, "backward pass")
    loss.backward()
    if on_cuda:
        allocated["after backward"] = torch.cuda.memory_allocated(device)
    grad_bytes = _tensor_bytes(w.grad for w in weights)
    if cancel.is_set():
        return ProbeResult("training-step", (), {}, "cancelled after the backward pass", True, device)
    progress(0.7, "optimizer step")
    if master:
        for fp32, low in zip(master, weights, strict=True):
            fp32.grad = grad_of(low).float()
    optimizer.step()
    if master:
        with torch.no_grad():
            for fp32, low in zip(master, weights, strict=True):
                low.copy_(fp32)
                fp32.grad = None  # the fp32 gradient copy is transient; the bf16 .grad is what stays
    if on_cuda:
        torch.cuda.synchronize(device)
        allocated["after step"] = torch.cuda.memory_allocated(device)

    n_params = sum(w.numel() for w in weights)
    param_bytes = _tensor_bytes(weights)
    state_tensors = [value for state in optimizer.state.values() for value in state.values()
                     if isinstance(value, torch.Tensor)]
    step_counters = [t for t in state_tensors if t.dim() == 0]
    states = [t for t in state_tensors if t.dim() > 0]
    optimizer_bytes = _tensor_bytes(states) + _tensor_bytes(master)
    counter_bytes = _tensor_bytes(step_counters)

    per_param = model_state_bytes_per_param(recipe, optimizer_name)
    theory = {"weights": math.ceil(n_params * per_param.weights), "gradients": math.ceil(n_params * per_param.gradients),
              "optimizer": math.ceil(n_params * per_param.optimizer)}
    value_bytes = 4 if recipe == "fp32" else 2
    terms = layer_activation_terms(seq_len=seq, batch=batch, hidden=hidden, heads=heads, kv_heads=heads,
                                   head_dim=hidden // heads, ffn=ffn, gated_mlp=shape.gated_mlp,
                                   dropout=shape.dropout > 0, attention="eager", bytes_per_value=value_bytes)
    theory_layers = math.ceil(sum(term.bytes for term in terms)) * layers
    block_regions = {region for _label, regions, _terms in GROUPS for region in regions}
    saved = recorder.tensors
    layer_saved = sum(t.nbytes for t in saved if t.region in block_regions)
    layer_extra = sum(t.extra_bytes for t in saved if t.region in block_regions)
    layer_reasons = sorted({t.extra for t in saved if t.region in block_regions and t.extra})
    ids_saved = sum(t.nbytes for t in saved if t.region == "embedding")
    head_tensors = [t for t in saved if t.region not in block_regions and t.region != "embedding"]
    head_saved = sum(t.nbytes for t in head_tensors)
    head_extra = sum(t.extra_bytes for t in head_tensors)
    recipe_name = {"fp32": "fp32", "bf16": "pure bf16", "mixed": "mixed precision (bf16 + fp32 master)"}[recipe]
    source = f"{recipe_name} with {optimizer_name} (ZeRO paper §3.1 conventions)"
    rows = [
        Measurement(f"weights ({n_params:,} parameters)", float(param_bytes), "bytes", float(theory["weights"]),
                    f"{source}: {format_number(float(per_param.weights))} B/param"),
        Measurement("gradients (.grad)", float(grad_bytes), "bytes", float(theory["gradients"]),
                    f"{format_number(float(per_param.gradients))} B/param"),
        Measurement("optimizer: master copy and states" if master else "optimizer states", float(optimizer_bytes),
                    "bytes", float(theory["optimizer"]), f"{format_number(float(per_param.optimizer))} B/param",
                    note="" if states or master else "this optimizer keeps no state"),
    ]
    if counter_bytes:
        rows.append(Measurement(f"optimizer step counters ({len(step_counters)} scalars)", float(counter_bytes),
                                "bytes", 0.0, "not counted per parameter",
                                note="Adam keeps one 4-byte step count per parameter tensor: negligible"))
    rows.append(Measurement(f"saved activations, {layers} transformer layer(s)", float(layer_saved), "bytes",
                            float(theory_layers), "Korthikanti et al. 2022 per-layer terms, eager attention",
                            note=f"+{layer_extra:,} B that PyTorch keeps beyond the theory: " + "; ".join(layer_reasons)
                            if layer_extra else ""))
    ids_theory = input_ids_bytes(seq, batch) + embedding_activation_bytes(
        seq_len=seq, batch=batch, hidden=hidden, dropout=shape.dropout > 0)
    rows.append(Measurement("saved by the embedding: token ids" + (", dropout mask" if shape.dropout else ""),
                            float(ids_saved), "bytes", float(ids_theory),
                            "8 B per token id (int64)" + (" + 1 B per value of the mask (Megatron)" if shape.dropout
                                                          else "")))
    head_theory = (megatron_output_layer_activation_bytes(seq_len=seq, batch=batch, hidden=hidden, vocab=vocab)
                   if value_bytes == 2 else None)
    rows.append(Measurement("saved final norm, LM head input and fp32 logits", float(head_saved), "bytes",
                            float(head_theory) if head_theory is not None else None,
                            "Megatron 4sbh(1 + V/h), 16-bit values" if head_theory is not None else
                            "Megatron's 4sbh(1 + V/h) assumes 16-bit values",
                            note="cross-entropy keeps the fp32 log-softmax output, s·b·V values"
                            + (f"; the final norm's extras: {head_extra:,} B" if head_extra else "")))
    for phase, after in (("weights", "start"), ("after forward", "weights"), ("after backward", "after forward"),
                         ("after step", "after backward")):
        if phase in allocated:
            rows.append(Measurement(f"CUDA allocated: {after} -> {phase}", float(allocated[phase] - allocated[after]),
                                    "bytes", note="torch.cuda.memory_allocated delta (includes temporaries alive then)"))
    model_state = param_bytes + grad_bytes + optimizer_bytes
    activation_bytes = recorder.total_bytes
    metrics = {
        "params": float(n_params),
        "param_bytes": float(param_bytes), "theory_param_bytes": float(theory["weights"]),
        "grad_bytes": float(grad_bytes), "theory_grad_bytes": float(theory["gradients"]),
        "optimizer_bytes": float(optimizer_bytes), "theory_optimizer_bytes": float(theory["optimizer"]),
        "step_counter_bytes": float(counter_bytes),
        "bytes_per_param": model_state / n_params, "theory_bytes_per_param": float(per_param.total),
        "layer_activation_bytes": float(layer_saved), "theory_layer_activation_bytes": float(theory_layers),
        "activation_bytes": float(activation_bytes),
        "total_bytes": float(model_state + counter_bytes + activation_bytes),
        "loss": float(loss.detach()),
    }
    if on_cuda:
        metrics["cuda_allocated_bytes"] = float(allocated["after step"] - allocated["start"])
    progress(1.0, "done")
    summary = (f"{recipe_name} + {optimizer_name}, {n_params:,} parameters: model states "
               f"{format_number(model_state / n_params)} B/param (theory {format_number(float(per_param.total))}); "
               f"activations {format_bytes(activation_bytes)}")
    return ProbeResult(probe="training-step", rows=tuple(rows), metrics=metrics, summary=summary,
                       cancelled=False, device=device)


TRAINING_STEP = make_probe(
    name="training-step",
    title="Memory of one training step",
    description="Takes one real training step of a tiny language model and counts what torch holds: "
                "weights, gradients, optimizer states and saved activations, each beside the theory.",
    needs_torch=True,
    params=(
        Param("style", "str", "llama", "block style", choices=STYLES),
        Param("hidden", "int", 64, "hidden size", minimum=8, maximum=4096),
        Param("heads", "int", 4, "attention heads", minimum=1, maximum=128),
        Param("layers", "int", 2, "transformer layers", minimum=1, maximum=48),
        Param("vocab", "int", 512, "vocabulary size", minimum=2, maximum=262_144),
        Param("batch", "int", 2, "micro-batch", minimum=1, maximum=256),
        Param("seq", "int", 32, "sequence length", minimum=1, maximum=8192),
        Param("recipe", "str", "mixed", "precision recipe", choices=RECIPES),
        Param("optimizer", "str", "adam", "optimizer", choices=OPTIMIZERS),
        Param("seed", "int", 0, "random seed", minimum=0),
        Param("device", "str", "cpu", "cpu, cuda, cuda:N or auto"),
    ),
    metrics=TRAINING_METRICS,
    body=_training_step,
    # cuda_allocated_bytes exists only on a GPU: named for "auto" too, which picks one when present.
    metrics_of=lambda p: tuple(m for m in TRAINING_METRICS if m != "cuda_allocated_bytes" or p["device"] != "cpu"),
)
