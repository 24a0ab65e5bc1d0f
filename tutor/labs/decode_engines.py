"""decode-engines: one decode step of a real transformers Llama, timed the ways engines run it.

- eager: transformers' forward with a DynamicCache, one token per step (the loop `generate` runs);
- the host floor: the same model family, the same layers and heads, at a tiny width (head
  dimension 8), so the device work is close to nothing and the step time is what the host spends
  (Python, dispatch, kernel launches) whatever the width;
- on CUDA only: the same step on a StaticCache captured once in a CUDA graph and replayed, the way
  serving engines remove the host from the decode loop;
- the bandwidth floor: (weights + KV cache) bytes read per step over this machine's memory bandwidth
  (tutor.theory.roofline.decode_time_per_token_bound): what an engine approaches, not what eager
  decode gives when the host is slower than the memory.

Batch 1, greedy. On a CPU the host and the "device" are the same cores: the lab says so, and reports
no CUDA-graph figure there.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

from tutor.trace.decode_loops import GRAPH_WARMUPS, StaticDecoder, capture_cuda_graph, eager_decoder
from tutor.formatting import format_duration, format_percent
from tutor.labs._params import Param, budget_param, device_param, make_probe, resolve_device
from tutor.labs.inference import DTYPE_BYTES, keeping_torch_threads, tiny_llama_params, without_transformers
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn

VOCAB = 256
HOST_HEAD_DIM = 8  # the host-floor model: hidden = 8 · heads (64 at 8 heads), as many layers
WARMUP_STEPS = 2   # untimed steps of each model before the timed ones (first-call costs)
MIN_ROUNDS = 3


def chosen_dtype(dtype: str, device: str) -> str:
    """'auto' is bf16 on a GPU (how 8B models are served) and fp32 on a CPU, where BF16 without
    native support runs far slower than FP32 and would time the emulation instead of the step."""
    if dtype != "auto":
        return dtype
    return "fp32" if device == "cpu" else "bf16"


def llama_config(*, layers: int, hidden: int, heads: int, kv_heads: int, max_positions: int):
    """A transformers LlamaConfig (intermediate 2·hidden, a 256-token vocabulary), as the kv-cache lab builds."""
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions)


def time_in_turns(steps: dict[str, Any], sync, *, rounds: int, budget_s: float, cancel: threading.Event,
                  on_round=lambda share: None) -> dict[str, list[float]]:
    """Seconds of each step, one of each per round (a load that comes and goes slows all alike), from
    host clock to host clock with the device synchronised: what a token costs the loop that asks for it."""
    for fn in steps.values():
        for _ in range(WARMUP_STEPS):
            fn()
        sync()
    times: dict[str, list[float]] = {name: [] for name in steps}
    deadline = time.perf_counter() + budget_s
    for done in range(rounds):
        if cancel.is_set() or (done >= MIN_ROUNDS and time.perf_counter() > deadline):
            break
        for name, fn in steps.items():
            start = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - start)
        on_round((done + 1) / rounds)
    return times


def weight_bytes_read(model) -> int:
    """Bytes of the weights one decode step reads: every parameter but the embedding table, of which
    the step reads the one row of its token."""
    embedding = model.get_input_embeddings().weight
    total = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embedding)
    return total + embedding.shape[1] * embedding.element_size()


def measured_read_bandwidth(device: str) -> tuple[float, str] | None:
    """(bytes/s, source) of the newest `bench bandwidth` read figure for `device` on this machine, from
    the results notebook; None when it has none."""
    import math

    from tutor.bench.environment import load_machine
    from tutor.bench.notebook import same_machine, read_notebook

    machine = load_machine()
    for run in reversed(read_notebook().runs):
        if run.cancelled or not same_machine(run.header.get("machine"), machine):
            continue
        for result in run.results:
            value = result.get("gbps_median")
            if (result.get("kind") == "bandwidth" and result.get("op") == "read" and result.get("device") == device
                    and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                    and value > 0):
                return float(value) * 1e9, f"the read bandwidth `bench` measured here on {run.date[:10]}"
    return None


def memory_bandwidth(device: str) -> tuple[float, str] | None:
    """This device's bandwidth: measured by `bench` when the notebook has it, else a GPU's datasheet."""
    measured = measured_read_bandwidth(device)
    if measured is not None or device == "cpu":
        return measured
    from tutor.bench.environment import load_machine

    gbps = load_machine().peak_memory_gbps(device)
    return (gbps * 1e9, "the datasheet bandwidth of this GPU") if gbps else None


def _check_fits(params: dict, device: str, dtype: str) -> None:
    """Weights of both models, the caches (a static one too on CUDA) and the prompt's attention scores
    against this machine; the forward FLOPs of every position both models read."""
    from tutor.labs.limits import check_lab_fits
    from tutor.theory.flops import inference_flops_per_token
    from tutor.theory.kv_cache import kv_cache_bytes_per_token

    layers, hidden, heads, kv_heads = params["layers"], params["hidden"], params["heads"], params["kv_heads"]
    element = DTYPE_BYTES[dtype]
    context = params["prompt"] + WARMUP_STEPS + GRAPH_WARMUPS + params["tokens"] + 1
    n_params = tiny_llama_params(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads)
    host_params = tiny_llama_params(layers=layers, hidden=HOST_HEAD_DIM * heads, heads=heads, kv_heads=kv_heads)
    caches = 2 if device != "cpu" and params["graphs"] else 1
    cache = caches * context * kv_cache_bytes_per_token(layers=layers, kv_heads=kv_heads, head_dim=hidden // heads,
                                                        bytes_per_element=element)
    scores = 2 * heads * params["prompt"] ** 2 * element
    weights = (n_params + host_params) * element
    flops = caches * context * inference_flops_per_token(params=n_params, layers=layers, context=context,
                                                         attention_dim=hidden)
    check_lab_fits("decode-engines", memory_bytes=weights + cache + scores,
                   memory_what=f"weights {weights:,} B, KV caches {cache:,} B, prompt scores {scores:,} B",
                   device=device, flops=flops, dtype=dtype, fix="lower layers, hidden, prompt or tokens")


@keeping_torch_threads
def _decode_engines(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    if cancel.is_set():
        return ProbeResult("decode-engines", (), {}, "cancelled before the models were built", True, "cpu")
    progress(0.0, "loading torch and transformers")
    import torch

    if (missing := without_transformers("decode-engines", "eager decode step")) is not None:
        return missing
    from tutor.errors import UserError

    heads, kv_heads, hidden = params["heads"], params["kv_heads"], params["hidden"]
    if hidden % heads or heads % kv_heads:
        raise UserError(f"decode-engines: hidden {hidden} must be a multiple of heads {heads}, and heads a multiple "
                        f"of kv_heads {kv_heads}")
    device = resolve_device(params["device"])
    dtype = chosen_dtype(params["dtype"], device)
    _check_fits(params, device, dtype)
    if device == "cpu":
        torch.set_num_threads(1)  # one core: the host's Python and the "device" kernels share it
    return _measure(params, device, dtype, progress, cancel)


def _measure(params: dict, device: str, dtype: str, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    import torch
    from transformers import LlamaForCausalLM

    from tutor.bench.matmul import torch_dtype
    from tutor.theory.kv_cache import kv_cache_bytes_per_token
    from tutor.theory.roofline import decode_time_per_token_bound

    layers, hidden, heads, kv_heads = params["layers"], params["hidden"], params["heads"], params["kv_heads"]
    prompt, tokens = params["prompt"], params["tokens"]
    max_positions = prompt + WARMUP_STEPS + GRAPH_WARMUPS + tokens + 16
    torch.manual_seed(params["seed"])
    progress(0.05, "building the models")
    models = {}
    for name, width in (("eager", hidden), ("host", HOST_HEAD_DIM * heads)):
        config = llama_config(layers=layers, hidden=width, heads=heads, kv_heads=kv_heads, max_positions=max_positions)
        # transformers declares .to through functools.wraps(nn.Module.to), which mypy reads as a call missing self
        models[name] = (LlamaForCausalLM(config).to(device=device, dtype=torch_dtype(dtype)).eval(),  # type: ignore[call-arg]
                        config)
    prompt_ids = torch.randint(0, VOCAB, (1, prompt), device=device)
    cuda = device.startswith("cuda")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    if cancel.is_set():
        return ProbeResult("decode-engines", (), {}, "cancelled before the prompt was read", True, device)
    progress(0.1, f"reading the {prompt}-token prompt")
    graph_note = ("not measured on a CPU (no kernel launches to capture)" if not cuda
                  else "not asked for (graphs = false)")
    graph_times: list[float] = []
    with torch.no_grad():
        steps = {name: eager_decoder(model, config, prompt_ids) for name, (model, config) in models.items()}
        sync()
        turns = "decode steps in turns: the model, then the same layers at a tiny width (the host floor)"
        times = time_in_turns(steps, sync, rounds=tokens, budget_s=params["budget_s"], cancel=cancel,
                              on_round=lambda share: progress(0.1 + (0.6 if cuda else 0.85) * share, turns))
        if cuda and params["graphs"] and not cancel.is_set():
            progress(0.75, "capturing the step in a CUDA graph")
            graph_times, graph_note = _time_cuda_graph(models["eager"], prompt_ids, tokens, sync, cancel)
    if not times["eager"]:
        return ProbeResult("decode-engines", (), {}, "cancelled before a decode step was timed", True, device)

    model, config = models["eager"]
    eager_s = statistics.median(times["eager"])
    host_s = statistics.median(times["host"])
    # The KV cache each timed step read: its mean length over the timed steps.
    context = prompt + WARMUP_STEPS + (len(times["eager"]) + 1) / 2
    kv_bytes = int(context * kv_cache_bytes_per_token(layers=layers, kv_heads=kv_heads, head_dim=hidden // heads,
                                                      bytes_per_element=DTYPE_BYTES[dtype]))
    weights = weight_bytes_read(model)
    metrics = {
        "eager_step_s": eager_s,
        "host_floor_s": host_s,
        "host_share": host_s / eager_s,
        "eager_tokens_per_s": 1 / eager_s,
        "weight_bytes": float(weights),
        "kv_bytes": float(kv_bytes),
        "context_tokens": context,
    }
    where = "the CPU (one core)" if device == "cpu" else device
    shape = (f"{layers} layers, hidden {hidden}, {heads} heads ({kv_heads} KV), {dtype}, batch 1, "
             f"{prompt}-token prompt, median of {len(times['eager'])} steps")
    rows = [
        Measurement("eager decode step: transformers forward + DynamicCache (the loop generate runs)", eager_s, "s",
                    note=f"on {where}; {shape}"),
        Measurement(f"host floor: the same {layers} layers at hidden {HOST_HEAD_DIM * heads}", host_s, "s",
                    note="almost no arithmetic: Python, dispatch" + (", launches" if cuda else "") + " per step"),
        Measurement("host floor / eager step", host_s / eager_s, "fraction",
                    note="what the step costs even if the arithmetic were free"),
    ]
    bandwidth = memory_bandwidth(device)
    if bandwidth is not None:
        rate, source = bandwidth
        floor = decode_time_per_token_bound(weight_bytes=weights, kv_bytes=kv_bytes, bandwidth=rate)
        metrics.update(bandwidth_floor_s=floor, eager_over_floor=eager_s / floor)
        rows.append(Measurement("bandwidth floor: (weights + KV cache) / bandwidth", None, "s", floor,
                                f"{rate / 1e9:.3g} GB/s, {source}",
                                f"{weights:,} B of weights + {kv_bytes:,} B of cache per step"
                                + ("; bench reads with every core, this lab decodes on one" if device == "cpu" else "")))
        rows.append(Measurement("eager step / bandwidth floor", eager_s / floor, "x",
                                note="1x would be an engine reading memory at full speed and nothing else"))
    else:
        rows.append(Measurement("bandwidth floor: (weights + KV cache) / bandwidth", None, "s",
                                note="no bandwidth known for this CPU: `tensor-tutor bench bandwidth` measures it, "
                                     "and this lab reads it next time"))
    if graph_times:
        graph_s = statistics.median(graph_times)
        metrics.update(graph_step_s=graph_s, graph_speedup=eager_s / graph_s)
        if "bandwidth_floor_s" in metrics:
            metrics["graph_over_floor"] = graph_s / metrics["bandwidth_floor_s"]
        rows.append(Measurement("CUDA graph: the same step on a StaticCache, captured once and replayed", graph_s,
                                "s", note=f"{eager_s / graph_s:.1f}x faster than eager: the host launches one graph "
                                          "instead of every kernel"))
    else:
        rows.append(Measurement("CUDA graph of the same step", None, "s", note=f"graphs: {graph_note}"))
    if device == "cpu":
        rows.append(Measurement(
            "what this measured", None, "",
            note="host and device are the same core here: the step is host work, then arithmetic. On a GPU the "
                 "host queues kernels while the GPU runs them, and a step takes about the longer of the two"))
    progress(1.0, "done")
    summary = (f"eager {format_duration(eager_s)} per token on {where}, host floor {format_duration(host_s)} "
               f"({format_percent(host_s / eager_s)} of it)")
    if "graph_step_s" in metrics:
        summary += f", CUDA graph {format_duration(metrics['graph_step_s'])}"
    if "bandwidth_floor_s" in metrics:
        summary += f", bandwidth floor {format_duration(metrics['bandwidth_floor_s'])}"
    details = {"steps_s": {name: list(kept) for name, kept in times.items()}, "graph_steps_s": graph_times,
               "graphs": "measured" if graph_times else graph_note, "dtype": dtype}
    return ProbeResult(probe="decode-engines", rows=tuple(rows), metrics=metrics, summary=summary,
                       cancelled=cancel.is_set(), device=device, details=details)


def _time_cuda_graph(model_and_config, prompt_ids, tokens: int, sync, cancel: threading.Event
                     ) -> tuple[list[float], str]:
    """Replay times of the step captured in a CUDA graph, or ([], why it could not be captured)."""
    model, config = model_and_config
    prompt = int(prompt_ids.shape[1])
    try:
        decoder = StaticDecoder(model, config, prompt_ids, max_len=prompt + GRAPH_WARMUPS + tokens + 1)
        graph = capture_cuda_graph(decoder)
        sync()
    except Exception as error:  # any transformers release or model that cannot be captured: say why, go on
        reason = (str(error).strip().splitlines() or [""])[0][:160]
        return [], f"not available ({type(error).__name__}: {reason})"
    times = []
    for _ in range(min(tokens, decoder.room)):
        if cancel.is_set():
            break
        decoder.room -= 1
        start = time.perf_counter()
        graph.replay()
        sync()
        times.append(time.perf_counter() - start)
    return times, "measured"


BASE_METRICS = ("eager_step_s", "host_floor_s", "host_share", "eager_tokens_per_s", "weight_bytes", "kv_bytes",
                "context_tokens")

DECODE_ENGINES = make_probe(
    name="decode-engines",
    title="Decode: eager, the host floor and CUDA graphs",
    description="Times one batch-1 decode step of a small transformers Llama as generate runs it (DynamicCache), "
                "the same layers at a tiny width (the host's floor), on CUDA the step captured in a CUDA graph, "
                "and the bandwidth floor (weights + KV cache) / bandwidth.",
    needs_torch=True,
    params=(
        Param("layers", "int", 4, "decoder layers (the host floor model has as many)", minimum=1, maximum=32),
        Param("hidden", "int", 512, "hidden size of the model timed", minimum=8, maximum=4096),
        Param("heads", "int", 8, "query heads (the host floor model has as many, of dimension 8)", minimum=1,
              maximum=64),
        Param("kv_heads", "int", 2, "key/value heads", minimum=1, maximum=64),
        Param("prompt", "int", 32, "prompt tokens read before decoding", minimum=1, maximum=2048),
        Param("tokens", "int", 24, "decode steps timed per model", minimum=2, maximum=256),
        Param("dtype", "str", "auto", "weight and cache dtype: auto is bf16 on a GPU, fp32 on a CPU",
              choices=("auto", *DTYPE_BYTES)),
        Param("graphs", "bool", True, "on CUDA, also time the step captured in a CUDA graph"),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(6.0, "seconds of decoding at most (at least 3 steps each)"),
        device_param(),
    ),
    metrics=(*BASE_METRICS, "bandwidth_floor_s", "eager_over_floor", "graph_step_s", "graph_speedup",
             "graph_over_floor"),
    body=_decode_engines,
    metrics_of=lambda p: BASE_METRICS,
)
