"""profile-step: torch.profiler on one training step of a small transformer, read as a profile is read.

The model is TinyLM (tutor.labs.tiny_transformer, llama style: RMSNorm, SwiGLU, SDPA attention)
trained with AdamW on random tokens. After a warm-up step, `steps` steps run under torch.profiler
(PyTorch docs, "PyTorch Profiler" recipe: `profile(activities=..., record_shapes=True,
with_flops=True)` and `key_averages()`), and the operators are ranked by self time: the time spent in
an operator itself, not in the operators it calls (aten::linear calls aten::addmm; its own time is the
dispatch around it). On a GPU the ranking is by self device time (the kernels), on a CPU by self CPU
time. The operators are grouped: matrix multiplies (mm, addmm, bmm, baddbmm, _scaled_mm), the fused
attention kernel (scaled_dot_product_attention's), and everything else (norms, activations, the
optimizer's elementwise updates, copies, the loss).

The profiler counts the FLOPs of each matrix multiply from its shapes; they are set beside 6N per
token (Kaplan et al., arXiv 2001.08361 §2.1, tutor.theory.flops), N the weights that multiply (the
linear layers and the LM head; the embedding is a lookup).
"""

from __future__ import annotations

import statistics
import threading
import time

from tutor.formatting import format_duration, format_number, format_percent
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, device_param, make_probe, resolve_device

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm", "aten::mv", "aten::dot")
ATTENTION_MARKERS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")
HEADS = 4
LR = 1e-3


def op_group(name: str) -> str:
    """'matmul', 'attention' or 'other' for a profiler operator name."""
    if name in MATMUL_OPS:
        return "matmul"
    if any(marker in name for marker in ATTENTION_MARKERS):
        return "attention"
    return "other"


def _self_device_us(event) -> float:
    """An operator's own kernels' time: `self_device_time_total` (torch 2.4 on), `self_cuda_time_total` before."""
    value = getattr(event, "self_device_time_total", None)
    return float(value if value is not None else getattr(event, "self_cuda_time_total", 0.0))


def _matmul_params(hidden: int, layers: int, vocab: int) -> int:
    """Weights that multiply in TinyLM (llama style, no biases): per layer QKV 3h², output h², SwiGLU
    gate/up 2·h·ffn and down ffn·h; the LM head h·V. The embedding is looked up, not multiplied."""
    from tutor.labs.activation_memory import default_ffn

    ffn = default_ffn("llama", hidden)
    return layers * (4 * hidden * hidden + 3 * hidden * ffn) + hidden * vocab


def _profile_step(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.errors import UserError

    if params["hidden"] % HEADS:
        raise UserError(f"profile-step: hidden must be a multiple of {HEADS} (the heads), got {params['hidden']}")
    device = resolve_device(params["device"])
    from tutor.labs.limits import check_lab_fits
    from tutor.theory.flops import training_flops_per_token

    n_matmul = _matmul_params(params["hidden"], params["layers"], params["vocab"])
    tokens = params["batch"] * params["seq"]
    flops = training_flops_per_token(params=n_matmul, layers=params["layers"], heads=HEADS,
                                     head_dim=params["hidden"] // HEADS, seq_len=params["seq"]) * tokens
    check_lab_fits("profile-step", memory_bytes=16 * n_matmul + 64 * tokens * params["hidden"] * params["layers"],
                   memory_what="weights, gradients, AdamW's states and activations", device=device,
                   flops=flops * (params["steps"] + 1), fix="lower hidden, layers, batch, seq or steps")
    if cancel.is_set():
        return ProbeResult("profile-step", (), {}, "cancelled before anything was measured", True, device)
    progress(0.0, "loading torch")
    import torch
    import torch.nn.functional as F
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from tutor.labs.activation_memory import default_ffn
    from tutor.labs.tiny_transformer import BlockShape, TinyLM

    torch.manual_seed(params["seed"])
    shape = BlockShape(hidden=params["hidden"], heads=HEADS, kv_heads=HEADS, ffn=default_ffn("llama", params["hidden"]),
                       style="llama", attention="sdpa", dropout=0.0)
    model = TinyLM(shape, params["layers"], params["vocab"]).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    generator = torch.Generator().manual_seed(params["seed"])
    on_gpu = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(device)) if on_gpu else (lambda: None)

    def step() -> None:
        ids = torch.randint(0, params["vocab"], (params["batch"], params["seq"] + 1), generator=generator).to(device)
        logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, params["vocab"]), ids[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    progress(0.1, f"warm-up step on {device}")
    step()  # the first step allocates AdamW's states and warms the kernels: not what a profile should show
    sync()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    walls: list[float] = []
    with profile(activities=activities, record_shapes=True, with_flops=True) as prof:
        for index in range(params["steps"]):
            if cancel.is_set():
                break
            progress(0.2 + 0.6 * index / params["steps"], f"profiled step {index + 1} of {params['steps']}")
            start = time.perf_counter()
            step()
            sync()
            walls.append(time.perf_counter() - start)
    if not walls:
        return ProbeResult("profile-step", (), {}, "cancelled before a step was profiled", True, device)
    progress(0.9, "reading the profile")
    steps = len(walls)
    clock = "device" if on_gpu else "CPU"
    events = []
    for event in prof.key_averages():
        if on_gpu and getattr(event, "device_type", None) != DeviceType.CPU:
            # A kernel's own row repeats the device time already counted as the self time of the
            # operator that launched it: keep the operators, so each moment counts once.
            continue
        self_us = _self_device_us(event) if on_gpu else event.self_cpu_time_total
        events.append({"name": event.key, "self_us": float(self_us), "calls": int(event.count),
                       "flops": float(event.flops or 0), "group": op_group(event.key)})
    total_us = sum(e["self_us"] for e in events)
    if total_us <= 0:
        raise UserError("profile-step: the profiler recorded no time; try more steps or a larger model")
    events.sort(key=lambda e: e["self_us"], reverse=True)
    shares = {group: sum(e["self_us"] for e in events if e["group"] == group) / total_us
              for group in ("matmul", "attention", "other")}
    counted_flops = sum(e["flops"] for e in events if e["group"] == "matmul") / steps
    theory_flops = training_flops_per_token(params=n_matmul, layers=1, heads=1, head_dim=1, seq_len=1,
                                            attention=False) * tokens
    matmul_seconds = shares["matmul"] * total_us * 1e-6 / steps
    top = events[: params["top"]]
    rows: list[Measurement] = []
    for rank, e in enumerate(top, start=1):
        rows.append(Measurement(
            f"{rank}. {e['name']} ({e['group']})", e["self_us"] / 1e3 / steps, "ms", None, "",
            f"{format_percent(e['self_us'] / total_us)} of self {clock} time; {e['calls'] / steps:,.0f} calls per step"))
    rows.append(Measurement("matrix multiplies: share of self time", shares["matmul"], "fraction", None, "",
                            f"attention kernel {format_percent(shares['attention'])}, everything else "
                            f"{format_percent(shares['other'])}"))
    rows.append(Measurement("matmul FLOPs per step, counted by the profiler from shapes", counted_flops, "FLOP",
                            float(theory_flops), "6N per token x tokens, N the weights that multiply "
                            "(Kaplan et al. 2020; tutor.theory.flops)",
                            "the attention kernel's own FLOPs are not counted by the profiler"))
    rows.append(Measurement("matmul rate inside the step", counted_flops / matmul_seconds / 1e12
                            if matmul_seconds > 0 else None, "TFLOP/s", None, "",
                            "counted FLOPs / self time of the matmul operators", rate=True))
    metrics = {"step_ms": statistics.median(walls) * 1e3, "matmul_share": shares["matmul"],
               "attention_share": shares["attention"], "other_share": shares["other"],
               "top_op_share": top[0]["self_us"] / total_us,
               "ops_per_step": sum(e["calls"] for e in events) / steps,
               "matmul_flops_per_step": counted_flops, "theory_matmul_flops_per_step": float(theory_flops)}
    progress(1.0, "done")
    summary = (f"{format_percent(shares['matmul'])} of self {clock} time in matrix multiplies, "
               f"{format_percent(shares['attention'])} in attention, {format_percent(shares['other'])} in everything "
               f"else; top operator {top[0]['name']} ({format_percent(metrics['top_op_share'])}); "
               f"step {format_duration(metrics['step_ms'] / 1e3)} under the profiler, "
               f"{format_number(metrics['ops_per_step'])} operator calls per step")
    return ProbeResult(probe="profile-step", rows=tuple(rows), metrics=metrics, summary=summary,
                       cancelled=cancel.is_set(), device=device,
                       details={"operators": events[:50], "steps": steps, "clock": clock,
                                "self_time_total_ms_per_step": total_us / 1e3 / steps})


PROFILE_STEP = make_probe(
    name="profile-step",
    title="Reading a profiler trace of one training step",
    description="Runs torch.profiler over training steps of a small transformer and ranks the operators by self "
                "time: the top operators, the share in matrix multiplies against everything else, and the "
                "profiler's matmul FLOPs beside 6N per token.",
    needs_torch=True,
    params=(
        Param("hidden", "int", 256, "hidden size (a multiple of 4, the heads)", minimum=8, maximum=2048),
        Param("layers", "int", 2, "transformer layers", minimum=1, maximum=8),
        Param("seq", "int", 128, "tokens per sequence", minimum=2, maximum=2048),
        Param("batch", "int", 4, "sequences per step", minimum=1, maximum=64),
        Param("vocab", "int", 1024, "vocabulary size", minimum=16, maximum=65536),
        Param("steps", "int", 3, "profiled steps (after one warm-up step)", minimum=1, maximum=20),
        Param("top", "int", 8, "operators listed", minimum=1, maximum=30),
        Param("seed", "int", 0, "random seed", minimum=0),
        device_param(),
    ),
    metrics=("step_ms", "matmul_share", "attention_share", "other_share", "top_op_share", "ops_per_step",
             "matmul_flops_per_step", "theory_matmul_flops_per_step"),
    body=_profile_step,
)
