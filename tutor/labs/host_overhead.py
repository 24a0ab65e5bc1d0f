"""host-overhead: what one operation costs the host, and how many one decode step issues.

Eager PyTorch runs every operation through Python, the dispatcher and (on a GPU) a kernel launch,
whatever the tensor's size. The lab measures that cost on this machine with operations on tiny
tensors (an add of two 8-element vectors: no arithmetic to speak of), counts the ATen operations one
decode step of a small transformers Llama issues (a TorchDispatchMode sees each one, as PyTorch's
profiler would), and sets operations × cost per operation beside the step of the same layers at a
tiny width, the host's floor (the decode-engines lab's measure). What the count does not explain is
the model's own Python between the operations (transformers' modules, the cache's bookkeeping).

This is the CPU half of "eager against CUDA graphs": a CUDA graph replays the recorded kernels with
one launch, so neither the per-operation cost nor the Python remains (PyTorch, "CUDA Graphs" notes).
"""

from __future__ import annotations

import statistics
import threading
import time

from tutor.formatting import format_count, format_duration, format_percent
from tutor.labs._params import Param, budget_param, make_probe
from tutor.labs.decode_engines import HOST_HEAD_DIM, VOCAB
from tutor.labs.inference import keeping_torch_threads, without_transformers
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs.serving_latency import build_model, forward, new_cache

OPS_PER_ROUND = 2_000


def count_aten_ops(fn) -> int:
    """ATen operations `fn()` dispatches (views and in-place updates included), seen by a TorchDispatchMode."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Counter(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Counter.count += 1
            return func(*args, **(kwargs or {}))

    with Counter():
        fn()
    return Counter.count


@keeping_torch_threads
def _host_overhead(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    if cancel.is_set():
        return ProbeResult("host-overhead", (), {}, "cancelled before anything was timed", True, "cpu")
    import torch

    if (missing := without_transformers("host-overhead", "one decode step's operations")) is not None:
        return missing
    torch.set_num_threads(1)  # the host's cost is one thread's: Python runs on one
    torch.manual_seed(params["seed"])
    a, b = torch.randn(8), torch.randn(8)
    progress(0.1, "timing tiny operations")
    per_op: list[float] = []
    deadline = time.perf_counter() + params["budget_s"] / 2
    with torch.no_grad():
        torch.add(a, b)
        while len(per_op) < 5 or (time.perf_counter() < deadline and len(per_op) < 200):
            if cancel.is_set():
                break
            start = time.perf_counter()
            for _ in range(OPS_PER_ROUND):
                torch.add(a, b)
            per_op.append((time.perf_counter() - start) / OPS_PER_ROUND)
    if not per_op:
        return ProbeResult("host-overhead", (), {}, "cancelled before anything was timed", True, "cpu")
    progress(0.5, "counting one decode step's operations")
    shape = {"hidden": HOST_HEAD_DIM * params["heads"], "heads": params["heads"], "kv_heads": params["kv_heads"]}
    model, config = build_model(shape, "cpu", "fp32", max_positions=256, layers=params["layers"])
    prompt = torch.randint(0, VOCAB, (1, 8))
    steps: list[float] = []
    with torch.no_grad():
        cache = new_cache(config)
        token = forward(model, prompt, cache, last_only=True)[:, -1:].argmax(dim=-1)
        ops = count_aten_ops(lambda: forward(model, token, cache))
        deadline = time.perf_counter() + params["budget_s"] / 2
        while len(steps) < 5 or (time.perf_counter() < deadline and len(steps) < 100):
            if cancel.is_set():
                break
            start = time.perf_counter()
            token = forward(model, token, cache)[:, -1:].argmax(dim=-1)
            steps.append(time.perf_counter() - start)
    op_s = statistics.median(per_op)
    step_s = statistics.median(steps)
    layers = params["layers"]
    metrics = {
        "op_s": op_s,
        "ops_per_step": float(ops),
        "ops_per_layer": ops / layers,
        "host_step_s": step_s,
        "ops_share": min(1.0, ops * op_s / step_s),
        "host_s_per_layer": step_s / layers,
    }
    rows = (
        Measurement("one tiny operation (an add of 8 values)", op_s, "s",
                    note=f"median over rounds of {format_count(OPS_PER_ROUND, exact=True)}: Python, the dispatcher, "
                         f"an allocation; the arithmetic is nothing"),
        Measurement(f"ATen operations in one decode step ({layers} layers)", float(ops), "ops",
                    note=f"{format_count(ops / layers)} per layer, counted by a TorchDispatchMode"),
        Measurement(f"the host's floor: one decode step at hidden {shape['hidden']}", step_s, "s",
                    ops * op_s, "operations × the cost of one",
                    f"{format_duration(step_s / layers)} per layer; the rest is the model's own Python"),
    )
    progress(1.0, "done")
    summary = (f"{format_duration(op_s)} per operation, {format_count(ops)} operations per step: "
               f"{format_percent(metrics['ops_share'])} of the host's {format_duration(step_s)} step")
    return ProbeResult("host-overhead", rows, metrics, summary, cancel.is_set(), "cpu",
                       {"op_s": per_op, "step_s": steps})


HOST_OVERHEAD = make_probe(
    name="host-overhead",
    title="The host's cost per operation and per decode step",
    description="Times tiny PyTorch operations (the host's cost of one, with no arithmetic), counts the "
                "operations one decode step of a small transformers Llama dispatches, and sets their product "
                "beside the step of the same layers at a tiny width. On the CPU, on one thread.",
    needs_torch=True,
    params=(
        Param("layers", "int", 4, "decoder layers", minimum=1, maximum=64),
        Param("heads", "int", 8, "query heads (of dimension 8: no arithmetic to speak of)", minimum=1, maximum=64),
        Param("kv_heads", "int", 2, "key/value heads", minimum=1, maximum=64),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(3.0, "seconds of timing at most"),
    ),
    metrics=("op_s", "ops_per_step", "ops_per_layer", "host_step_s", "ops_share", "host_s_per_layer"),
    body=_host_overhead,
)
