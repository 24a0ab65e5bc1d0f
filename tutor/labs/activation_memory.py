"""activation-memory: what a real transformer block keeps for backward, against Korthikanti's count.

A genuine pre-norm block (tutor.labs.tiny_transformer) runs forward in training mode under
torch.autograd.graph.saved_tensors_hooks; the bytes of every unique non-parameter storage that
autograd packs are summed per region and set beside tutor.theory.activations.layer_activation_terms
for the same shape. Differences that PyTorch's implementation causes (statistics of the norms,
unfused SwiGLU, RMSNorm written out, GQA copies in eager attention, dropout inside SDPA's math
fallback) are itemised; `unexplained_bytes` is what is left, 0 when theory and torch agree.
"""

from __future__ import annotations

import math
import threading
from fractions import Fraction

from tutor.errors import UserError
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, make_probe, resolve_device

STYLES = ("gpt", "llama")
ATTENTIONS = ("eager", "sdpa")
DTYPES = ("fp32", "bf16", "fp16")
# The lab allocates what it measures: refuse shapes whose theory exceeds this (a lesson lab, not a stress test).
MAX_THEORY_BYTES = 512 * 2**20

# Rows of the comparison: the regions the block files saved tensors under, and the theory terms
# (tutor.theory.activations names) that belong to them.
GROUPS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("attention norm input", ("attention norm",), ("attention norm input",)),
    ("QKV projection input", ("QKV projection",), ("QKV projection input (norm output)",)),
    ("attention: Q, K, V, scores, output", ("attention core", "output projection"),
     ("Q", "K", "V", "softmax output", "attention dropout mask", "attention dropout output",
      "flash log-sum-exp (fp32)", "output projection input (attention output)")),
    ("attention residual dropout mask", ("attention residual dropout",), ("attention residual dropout mask",)),
    ("MLP norm input", ("MLP norm",), ("MLP norm input",)),
    ("MLP input", ("MLP input projection",), ("MLP input (norm output)",)),
    ("MLP intermediate", ("MLP activation", "MLP output projection"),
     ("gate projection output", "up projection output", "down projection input (silu(gate)·up)",
      "activation input (first linear output)", "second linear input (activation output)")),
    ("MLP residual dropout mask", ("MLP residual dropout",), ("MLP residual dropout mask",)),
)


def default_ffn(style: str, hidden: int) -> int:
    """GPT: 4h (Radford et al. 2019, GPT-2); Llama: 2/3 of 4h, the SwiGLU width rule of Shazeer 2020
    (arXiv 2002.05202 §2) that LLaMA states as "2/3 4d" (arXiv 2302.13971 §2.2), rounded up to a
    multiple of 16 here (a small-model choice; Meta's llama/model.py rounds to multiple_of = 256)."""
    if style == "gpt":
        return 4 * hidden
    return math.ceil(Fraction(8 * hidden, 3) / 16) * 16


def _layer_terms(params: dict, shape, attention_kind: str, value_bytes: int):
    from tutor.theory.activations import layer_activation_terms

    return layer_activation_terms(
        seq_len=params["seq"], batch=params["batch"], hidden=shape.hidden, heads=shape.heads,
        kv_heads=shape.kv_heads, head_dim=shape.head_dim, ffn=shape.ffn, gated_mlp=shape.gated_mlp,
        dropout=shape.dropout > 0, attention=attention_kind, bytes_per_value=value_bytes)


def resolve_shape(params: dict) -> dict:
    """The block's full shape from the params (defaults filled), checked against each other."""
    hidden, heads = params["hidden"], params["heads"]
    kv_heads = params["kv_heads"] or heads
    if hidden % heads:
        raise UserError(f"activation-memory: heads ({heads}) must divide hidden ({hidden})")
    if heads % kv_heads:
        raise UserError(f"activation-memory: kv_heads ({kv_heads}) must divide heads ({heads})")
    style = params["style"]
    dropout = params["dropout"] if params["dropout"] is not None else (0.1 if style == "gpt" else 0.0)
    ffn = params["ffn"] or default_ffn(style, hidden)
    return {"hidden": hidden, "heads": heads, "kv_heads": kv_heads, "ffn": ffn, "style": style,
            "attention": params["attention"], "dropout": dropout}


def block_params(geometry: dict) -> int:
    """Weights of one block: Q and O (h x h), K and V (h x kv_heads x head_dim), the MLP's 3 (gated)
    or 2 matrices of h x ffn; norms and biases are too small to matter here."""
    hidden, head_dim = geometry["hidden"], geometry["hidden"] // geometry["heads"]
    mlp_matrices = 3 if geometry["style"] == "llama" else 2
    return 2 * hidden * hidden + 2 * hidden * geometry["kv_heads"] * head_dim + mlp_matrices * hidden * geometry["ffn"]


def _check_machine(params: dict, geometry: dict, activations: int, value_bytes: int, fix: str) -> None:
    """Memory (fp32 init, the dtype copy, its gradient, the activations) and FLOPs (PaLM's
    6N + 12·L·H·Q·T per token) against this machine (tutor.labs.limits)."""
    from tutor.labs.limits import check_lab_fits
    from tutor.theory.flops import training_flops_per_token

    weights = params["layers"] * block_params(geometry)
    memory = activations + weights * (4 + 2 * value_bytes)
    flops = params["batch"] * params["seq"] * training_flops_per_token(
        params=weights, layers=params["layers"], heads=geometry["heads"],
        head_dim=geometry["hidden"] // geometry["heads"], seq_len=params["seq"])
    check_lab_fits("activation-memory", memory_bytes=memory, device=resolve_device(params["device"]),
                   memory_what=f"{weights:,} weights in fp32 then {params['dtype']} with gradients, "
                               f"{activations:,} B of activations",
                   flops=flops, dtype=params["dtype"], fix=fix)


def _activation_memory(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    geometry = resolve_shape(params)
    value_bytes = {"fp32": 4, "bf16": 2, "fp16": 2}[params["dtype"]]
    from tutor.theory.activations import activation_bytes_per_layer

    estimate = params["layers"] * activation_bytes_per_layer(
        seq_len=params["seq"], batch=params["batch"], hidden=geometry["hidden"], heads=geometry["heads"],
        kv_heads=geometry["kv_heads"], head_dim=geometry["hidden"] // geometry["heads"], ffn=geometry["ffn"],
        gated_mlp=geometry["style"] == "llama", dropout=geometry["dropout"] > 0, attention="eager",
        bytes_per_value=value_bytes)
    fix = "lower seq, batch, hidden or layers"
    if estimate > MAX_THEORY_BYTES:
        raise UserError(f"activation-memory: this shape keeps {estimate:,} B of activations; the lab allows at "
                        f"most {MAX_THEORY_BYTES:,} B ({MAX_THEORY_BYTES // 2**20} MiB); {fix}")
    _check_machine(params, geometry, estimate, value_bytes, fix)
    progress(0.0, "loading torch")
    import torch

    from tutor.labs.tiny_transformer import (
        TORCH_DTYPES,
        Block,
        BlockShape,
        SavedTensorRecorder,
    )

    device = resolve_device(params["device"])
    torch.manual_seed(params["seed"])
    shape = BlockShape(**geometry)
    stacked = [Block(shape) for _ in range(params["layers"])]
    blocks = torch.nn.Sequential(*stacked)
    blocks = blocks.to(device=device, dtype=TORCH_DTYPES[params["dtype"]]).train()
    # The input stands for the previous layer's output, so it requires grad: otherwise autograd
    # would not keep the first norm's input at all.
    x = torch.randn(params["batch"], params["seq"], shape.hidden, device=device, dtype=TORCH_DTYPES[params["dtype"]],
                    requires_grad=True)
    if cancel.is_set():
        return ProbeResult("activation-memory", (), {}, "cancelled before the forward pass", True, device)
    progress(0.3, "forward pass, recording saved tensors")
    with SavedTensorRecorder(blocks) as recorder:
        out = blocks(x)
    progress(0.7, "backward pass")
    out.float().square().mean().backward()  # proves the recorded graph is a real, complete one
    backend = stacked[0].sdpa_backend or "eager"  # .to() moved the blocks in place
    attention_kind = "eager" if backend in ("eager", "math") else "flash"
    terms = _layer_terms(params, shape, attention_kind, value_bytes)
    layers = params["layers"]
    tensors = recorder.tensors

    # SDPA's math fallback does its own dropout through torch.dropout, whose mask on a CPU is a
    # tensor of the activation dtype rather than 1-byte booleans: the theory's mask term, scaled.
    math_dropout_extra = 0
    if backend == "math" and shape.dropout > 0 and device == "cpu":
        mask = sum(term.bytes for term in terms if term.name == "attention dropout mask")
        math_dropout_extra = math.ceil(mask * (value_bytes - 1)) * layers
    # With GQA the math fallback expands K and V to every query head, as eager repeat_kv does.
    math_gqa_extra = 0
    if backend == "math" and shape.kv_heads < shape.heads:
        kv_bytes = sum(term.bytes for term in terms if term.name in ("K", "V"))
        math_gqa_extra = math.ceil(kv_bytes * Fraction(shape.heads - shape.kv_heads, shape.kv_heads)) * layers
    # The math fallback computes 16-bit attention in fp32 on a CPU: what it keeps is 4 bytes a value.
    upcast_extra = 0
    if backend == "math" and value_bytes < 4:
        upcast_extra = sum(round(t.nbytes * (1 - value_bytes / 4)) for t in tensors
                           if t.region == "attention core" and t.dtype == "float32" and not t.extra)

    rows: list[Measurement] = []
    explained_total = sum(t.extra_bytes for t in tensors) + math_dropout_extra + upcast_extra + math_gqa_extra
    for label, regions, term_names in GROUPS:
        theory = math.ceil(sum(term.bytes for term in terms if term.name in term_names)) * layers
        in_group = [t for t in tensors if t.region in regions]
        measured = sum(t.nbytes for t in in_group)
        if not theory and not measured:
            continue
        reasons: dict[str, int] = {}
        for t in in_group:
            if t.extra_bytes:
                reasons[t.extra] = reasons.get(t.extra, 0) + t.extra_bytes
        if label.startswith("attention:") and math_gqa_extra:
            reasons["SDPA's math fallback copies K and V to every query head (GQA)"] = math_gqa_extra
        if label.startswith("attention:") and upcast_extra:
            reasons["SDPA's math fallback computes 16-bit attention in fp32 here and keeps fp32 tensors"] = upcast_extra
        if label.startswith("attention:") and math_dropout_extra:
            reasons["SDPA's math fallback keeps its dropout mask as a float tensor, not 1-byte booleans"] = (
                math_dropout_extra)
        note = "; ".join(f"+{n_bytes:,} B: {why}" for why, n_bytes in reasons.items())
        rows.append(Measurement(label=label, measured=float(measured), unit="bytes", theory=float(theory),
                                theory_source="Korthikanti et al. 2022, per-layer terms as the code keeps them", note=note))
    measured_total = recorder.total_bytes
    theory_total = math.ceil(sum(term.bytes for term in terms)) * layers
    other = measured_total - sum(row.measured or 0 for row in rows)
    if other:
        rows.append(Measurement(label="other saved tensors", measured=float(other), unit="bytes", theory=0.0,
                                note="saved outside the named regions"))
    unexplained = measured_total - theory_total - explained_total
    backend_text = {"eager": "eager softmax (written out)", "math": "SDPA math fallback (s² scores kept)",
                    "flash": "SDPA flash kernel (no s² tensors, fp32 log-sum-exp)",
                    "efficient": "SDPA memory-efficient kernel (no s² tensors)",
                    "cudnn": "SDPA cuDNN kernel (no s² tensors)"}[backend]
    rows.append(Measurement(
        label=f"total, {layers} layer{'s' if layers > 1 else ''}", measured=float(measured_total), unit="bytes",
        theory=float(theory_total),
        theory_source=f"Korthikanti et al. arXiv 2205.05198 §4.1 generalised ({attention_kind} attention, "
                      f"{value_bytes}-byte values)",
        note=f"attention ran as: {backend_text}; PyTorch's extras explain {explained_total:,} B, "
             f"{unexplained:,} B unexplained"))
    metrics = {
        "measured_bytes": float(measured_total),
        "theory_bytes": float(theory_total),
        "explained_bytes": float(explained_total),
        "unexplained_bytes": float(unexplained),
        "measured_over_theory": measured_total / theory_total,
        "measured_bytes_per_layer": measured_total / layers,
        "theory_bytes_per_layer": theory_total / layers,
    }
    progress(1.0, "done")
    summary = (f"{layers} {shape.style}-style layer(s), s={params['seq']} b={params['batch']} h={shape.hidden}: "
               f"torch kept {measured_total:,} B for backward, theory {theory_total:,} B "
               f"({measured_total / theory_total:.2f}x); attention: {backend_text}")
    return ProbeResult(probe="activation-memory", rows=tuple(rows), metrics=metrics, summary=summary,
                       cancelled=False, device=device)


ACTIVATION_MEMORY = make_probe(
    name="activation-memory",
    title="Activation memory of a transformer block",
    description="Builds a real pre-norm transformer block in torch, runs it forward in training mode, "
                "adds up the tensors autograd keeps for backward and compares them, region by region, "
                "with the per-layer formulas of Korthikanti et al. 2022.",
    needs_torch=True,
    params=(
        Param("style", "str", "llama", "gpt: LayerNorm, GeLU MLP 4h, dropout; llama: RMSNorm, SwiGLU, no dropout",
              choices=STYLES),
        Param("hidden", "int", 64, "hidden size h", minimum=8, maximum=8192),
        Param("heads", "int", 4, "attention heads a", minimum=1, maximum=256),
        Param("kv_heads", "int", None, "key/value heads (GQA); default: heads", minimum=1, maximum=256,
              optional=True),
        Param("ffn", "int", None, "MLP width; default 4h (gpt) or 8h/3 rounded to 16 (llama)", minimum=1,
              maximum=65536, optional=True),
        Param("seq", "int", 32, "sequence length s", minimum=1, maximum=16384),
        Param("batch", "int", 2, "micro-batch b", minimum=1, maximum=1024),
        Param("layers", "int", 1, "layers L", minimum=1, maximum=64),
        Param("attention", "str", "eager", "eager softmax, or F.scaled_dot_product_attention", choices=ATTENTIONS),
        Param("dropout", "float", None, "dropout probability; default 0.1 (gpt), 0 (llama)", minimum=0.0,
              maximum=0.9, optional=True),
        Param("dtype", "str", "bf16", "activation dtype", choices=DTYPES),
        Param("seed", "int", 0, "random seed", minimum=0),
        Param("device", "str", "cpu", "where to run: cpu, cuda, cuda:N or auto (kernels differ: flash on GPUs)"),
    ),
    metrics=("measured_bytes", "theory_bytes", "explained_bytes", "unexplained_bytes", "measured_over_theory",
             "measured_bytes_per_layer", "theory_bytes_per_layer"),
    body=_activation_memory,
)
