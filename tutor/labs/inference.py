"""Inference labs: a KV cache measured as it grows, and prefill against decode on a roofline.

kv-cache: a small Llama built from a config by Hugging Face transformers (random weights, the model
class people run), a DynamicCache, a prompt and then greedy decoding one token at a time; after each
step the bytes of every key and value tensor the cache holds are read from the tensors themselves,
beside tutor.theory.kv_cache's 2 · layers · kv_heads · head_dim · bytes per element per token.

prefill-decode: a stack of MLP weight matrices far larger than the last-level cache, run the two
ways a model serves text: prefill (all prompt tokens in one matrix multiply) and decode (one token
per step, so each step reads every weight for a few FLOPs each). Decode is timed against the bound
tutor.theory.roofline gives from this machine's bandwidth, measured by the same read the decode
step does (a pass over the same weights), and the intensity of each against the ridge point.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time

from tutor.errors import UserError
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, budget_param, device_param, make_probe, resolve_device
from tutor.formatting import format_bytes, format_quantity, format_rate

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
MIN_REPEATS = 3


TRANSFORMERS_MISSING = "needs Hugging Face transformers: pip install -e '.[trace]'"


def without_transformers(lab: str, label: str) -> ProbeResult | None:
    """The result of a lab that builds a transformers model when transformers is not installed: one row,
    `label`, saying how to install it (a state the lesson shows, not an error); None when it is installed."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return ProbeResult(lab, (Measurement(label, None, "s", note=TRANSFORMERS_MISSING),), {}, TRANSFORMERS_MISSING,
                           False, "cpu")
    return None


def keeping_torch_threads(body):
    """`body` may run torch on one thread (a one-core measurement); its thread count is put back
    after, because labs run in the app's long-lived measurement process and the next benchmark there
    must get every core again."""
    @functools.wraps(body)
    def run(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
        if cancel.is_set():
            return body(params, progress, cancel)
        progress(0.0, "loading torch")
        import torch

        threads = torch.get_num_threads()
        try:
            return body(params, progress, cancel)
        finally:
            torch.set_num_threads(threads)

    return run


def cache_tensor_bytes(cache) -> int:
    """Bytes of the key and value storages a transformers Cache holds, each storage counted once."""
    seen: dict[int, int] = {}
    for layer in cache.layers:
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if tensor is None or not hasattr(tensor, "untyped_storage") or tensor.numel() == 0:
                continue
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def tiny_llama_params(*, layers: int, hidden: int, heads: int, kv_heads: int, vocab: int = 256) -> int:
    """Parameters of the lab's LlamaConfig (intermediate 2·hidden, untied embeddings): per layer Q and O
    h×h, K and V h×(kv_heads·head_dim), gate/up/down h×2h, two RMSNorms; embeddings, final norm and
    head (transformers' LlamaModel/LlamaForCausalLM, no biases)."""
    kv = kv_heads * (hidden // heads)
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * 2 * hidden + 2 * hidden
    return layers * per_layer + 2 * vocab * hidden + hidden


def _check_kv_cache_fits(params: dict, device: str) -> None:
    """Weights, the full cache and the prompt's attention scores (eager: heads·prompt² per layer at
    once) against this machine; the forward FLOPs of every position (Kaplan's 2N + 2·L·n_ctx·d_attn)."""
    from tutor.labs.limits import check_lab_fits
    from tutor.theory.flops import inference_flops_per_token
    from tutor.theory.kv_cache import kv_cache_bytes_per_token

    layers, hidden, heads, kv_heads = params["layers"], params["hidden"], params["heads"], params["kv_heads"]
    element = DTYPE_BYTES[params["dtype"]]
    context = params["prompt"] + params["tokens"]
    n_params = tiny_llama_params(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads)
    weights = n_params * element
    cache = context * kv_cache_bytes_per_token(layers=layers, kv_heads=kv_heads, head_dim=hidden // heads,
                                               bytes_per_element=element)
    scores = 2 * heads * params["prompt"] ** 2 * element  # scores and their softmax, one layer at a time
    flops = context * inference_flops_per_token(params=n_params, layers=layers, context=context,
                                                attention_dim=hidden)
    check_lab_fits("kv-cache", memory_bytes=weights + cache + scores,
                   memory_what=f"weights {format_bytes(weights)}, KV cache {format_bytes(cache)}, "
                               f"prompt attention scores {format_bytes(scores)}",
                   device=device, flops=flops, dtype=params["dtype"], fix="lower layers, hidden, prompt or tokens")


@keeping_torch_threads
def _kv_cache(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    if cancel.is_set():
        return ProbeResult("kv-cache", (), {}, "cancelled before the model was built", True, "cpu")
    progress(0.0, "loading torch and transformers")
    import torch

    try:
        from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM
    except ImportError:
        note = "needs Hugging Face transformers: pip install -e '.[trace]'"
        return ProbeResult("kv-cache", (Measurement("KV cache bytes per token", None, "B", note=note),), {}, note,
                           False, "cpu")
    from tutor.bench.matmul import torch_dtype
    from tutor.trace.memory_trace import cache_argument
    from tutor.theory.kv_cache import kv_cache_bytes_per_token

    heads, kv_heads, hidden = params["heads"], params["kv_heads"], params["hidden"]
    if hidden % heads or heads % kv_heads:
        raise UserError(f"kv-cache: hidden {hidden} must be a multiple of heads {heads}, and heads a multiple of "
                        f"kv_heads {kv_heads}")
    device = resolve_device(params["device"])
    _check_kv_cache_fits(params, device)
    torch.manual_seed(params["seed"])
    if device == "cpu":
        torch.set_num_threads(1)
    config = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=params["layers"], num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=params["prompt"] + params["tokens"] + 1)
    dtype = torch_dtype(params["dtype"])
    # transformers declares .to through functools.wraps(nn.Module.to), which mypy reads as a call missing self
    model = LlamaForCausalLM(config).to(device=device, dtype=dtype).eval()  # type: ignore[call-arg]
    cache = DynamicCache(config=config)
    # Under the keyword this transformers reads: one it does not know is ignored, and the model then
    # fills a cache of its own while this one stays empty.
    cache_keyword = cache_argument(model)
    ids = torch.randint(0, config.vocab_size, (1, params["prompt"]), device=device)
    lengths: list[int] = []
    sizes: list[int] = []
    deadline = time.perf_counter() + params["budget_s"]
    cancelled = False
    with torch.no_grad():
        for step in range(params["tokens"] + 1):
            if cancel.is_set():
                cancelled = True
                break
            if step and time.perf_counter() > deadline:
                break
            logits = model(ids, **{cache_keyword: cache}, use_cache=True).logits
            lengths.append(cache.get_seq_length())
            sizes.append(cache_tensor_bytes(cache))
            ids = logits[:, -1:].argmax(dim=-1)  # greedy: the next step feeds one token
            progress(step / (params["tokens"] + 1), f"{lengths[-1]} tokens cached")
    if not lengths:
        return ProbeResult("kv-cache", (), {}, "cancelled before the prompt was read", True, device)
    theory_per_token = kv_cache_bytes_per_token(layers=params["layers"], kv_heads=kv_heads,
                                                head_dim=hidden // heads,
                                                bytes_per_element=DTYPE_BYTES[params["dtype"]])
    grown = lengths[-1] - lengths[0]
    per_token = (sizes[-1] - sizes[0]) / grown if grown else sizes[0] / lengths[0]
    metrics = {
        "kv_bytes_per_token": float(per_token),
        "theory_kv_bytes_per_token": float(theory_per_token),
        "kv_bytes_final": float(sizes[-1]),
        "theory_kv_bytes_final": float(theory_per_token * lengths[-1]),
        "tokens_cached": float(lengths[-1]),
        "kv_bytes_after_prompt": float(sizes[0]),
    }
    source = "2 · layers · kv_heads · head_dim · bytes per element"
    rows = [
        Measurement(f"bytes per token, measured as the cache grew from {lengths[0]} to {lengths[-1]} tokens",
                    metrics["kv_bytes_per_token"], "B", metrics["theory_kv_bytes_per_token"], source,
                    f"{params['layers']} layers, {kv_heads} KV heads of {hidden // heads}, {params['dtype']}"),
        Measurement(f"whole cache after the {lengths[0]}-token prompt (prefill)", float(sizes[0]), "B",
                    float(theory_per_token * lengths[0]), source),
        Measurement(f"whole cache at {lengths[-1]} tokens", metrics["kv_bytes_final"], "B",
                    metrics["theory_kv_bytes_final"], source,
                    "DynamicCache concatenates each step, so storage is exactly the tokens held"),
    ]
    progress(1.0, "done")
    summary = (f"{metrics['kv_bytes_per_token']:.0f} B per token measured, {theory_per_token} B by the formula, "
               f"{lengths[-1]} tokens cached")
    return ProbeResult(probe="kv-cache", rows=tuple(rows), metrics=metrics, summary=summary, cancelled=cancelled,
                       device=device)


KV_CACHE = make_probe(
    name="kv-cache",
    title="The KV cache, measured as it grows",
    description="Generates token by token with a small transformers Llama and a DynamicCache, reading the bytes "
                "of every cached key and value tensor after each step, beside the KV-cache formula.",
    needs_torch=True,
    params=(
        Param("layers", "int", 2, "decoder layers", minimum=1, maximum=8),
        Param("hidden", "int", 128, "hidden size", minimum=8, maximum=1024),
        Param("heads", "int", 4, "query heads", minimum=1, maximum=64),
        Param("kv_heads", "int", 2, "key/value heads (grouped-query attention when below heads)", minimum=1,
              maximum=64),
        Param("prompt", "int", 16, "prompt tokens (prefill)", minimum=1, maximum=512),
        Param("tokens", "int", 32, "tokens generated one at a time", minimum=1, maximum=512),
        Param("dtype", "str", "fp32", "cache and weight dtype", choices=tuple(DTYPE_BYTES)),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(5.0, "seconds of decoding at most"),
        device_param(),
    ),
    metrics=("kv_bytes_per_token", "theory_kv_bytes_per_token", "kv_bytes_final", "theory_kv_bytes_final",
             "tokens_cached", "kv_bytes_after_prompt"),
    body=_kv_cache,
)


def _median_times_in_turns(fns, sync, budget_s: float, cancel: threading.Event,
                           on_round=lambda share_of_budget: None) -> list[float]:
    """The median time of each of `fns`, timed in turns (one run of each per round) rather than one
    after the other: a load that comes and goes on a busy machine then slows each of them alike,
    so their ratios (decode against the read that bounds it) stay a property of the kernels."""
    for fn in fns:
        fn()  # warm-up
        sync()
    times: list[list[float]] = [[] for _ in fns]
    deadline = time.perf_counter() + budget_s
    while len(times[0]) < MIN_REPEATS or time.perf_counter() < deadline:
        if cancel.is_set() and times[0]:
            break
        for fn, kept in zip(fns, times):
            start = time.perf_counter()
            fn()
            sync()
            kept.append(time.perf_counter() - start)
        on_round(min(1.0, 1.0 - (deadline - time.perf_counter()) / budget_s))
        if len(times[0]) >= 200:
            break
    return [statistics.median(kept) for kept in times]


def _check_prefill_decode_fits(params: dict, device: str) -> None:
    """The weights (8·h²·layers elements) plus one layer's fp32 draw before the cast and the prompt's
    activations, against this machine; the FLOPs of the passes that run whatever the budget (a warm-up
    and MIN_REPEATS each of prefill and decode: 2·matmul_flops per layer per token)."""
    from tutor.labs.limits import check_lab_fits
    from tutor.theory.flops import matmul_flops

    hidden, layers, prompt = params["hidden"], params["layers"], params["prompt"]
    element = DTYPE_BYTES[params["dtype"]]
    weights = 8 * hidden * hidden * layers * element
    draw = 4 * hidden * hidden * 4  # torch.randn makes each fp32 matrix before .to(dtype)
    activations = 2 * prompt * 4 * hidden * 4 + prompt * hidden * element
    per_token = layers * 2 * matmul_flops(1, 4 * hidden, hidden)
    flops = (1 + MIN_REPEATS) * (prompt + 1) * per_token
    one_core = device == "cpu"  # the lab runs on one thread
    rate = _one_core_rate(device, params["dtype"]) if one_core else None
    check_lab_fits("prefill-decode", memory_bytes=weights + draw + activations,
                   memory_what=f"weights {format_bytes(weights)}, prompt activations {format_bytes(activations)}",
                   device=device, flops=flops, dtype=params["dtype"], rate=rate,
                   fix="lower hidden, layers or prompt")


def _one_core_rate(device: str, dtype: str):
    """The machine's rate for `dtype` shared over its physical cores: this lab runs on one thread."""
    from dataclasses import replace

    from tutor.bench.environment import load_machine
    from tutor.labs.limits import lab_compute_rate

    machine = load_machine()
    rate = lab_compute_rate(device, dtype, machine)
    if rate is None:
        return None
    cores = max(machine.cpu.physical_cores or 1, 1)
    return replace(rate, flops_per_s=rate.flops_per_s / cores, source=f"one core's share of {rate.source}")


@keeping_torch_threads
def _prefill_decode(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    if cancel.is_set():
        return ProbeResult("prefill-decode", (), {}, "cancelled before the weights were made", True, "cpu")
    import torch

    from tutor.bench.matmul import torch_dtype
    from tutor.hardware import detect_machine
    from tutor.theory.flops import matmul_flops
    from tutor.theory.roofline import (
        decode_tokens_per_second_bound,
        matmul_arithmetic_intensity,
        ridge_point,
    )

    device = resolve_device(params["device"])
    _check_prefill_decode_fits(params, device)
    if device == "cpu":
        torch.set_num_threads(1)  # one core: the peak below is one core's too
    hidden, ffn, layers, prompt = params["hidden"], 4 * params["hidden"], params["layers"], params["prompt"]
    dtype = torch_dtype(params["dtype"])
    element = DTYPE_BYTES[params["dtype"]]
    generator = torch.Generator(device="cpu").manual_seed(params["seed"])
    progress(0.05, "making the weights")
    weights = [(torch.randn(hidden, ffn, generator=generator).to(device, dtype) / hidden**0.5,
                torch.randn(ffn, hidden, generator=generator).to(device, dtype) / ffn**0.5) for _ in range(layers)]
    weight_bytes = sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in weights)

    def forward(x):
        for up, down in weights:
            x = torch.relu(x @ up) @ down
        return x

    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    one = torch.randn(1, hidden, generator=generator).to(device, dtype)
    many = torch.randn(prompt, hidden, generator=generator).to(device, dtype)
    turns = (f"in turns: decode (one token per step), prefill ({prompt} tokens in one pass) and a read of the "
             "weights (this machine's bandwidth)")
    progress(0.1, turns)
    # The bandwidth that bounds decode: a pass that reads every weight once and does nothing else.
    decode_s, prefill_s, read_s = _median_times_in_turns(
        [lambda: forward(one), lambda: forward(many), lambda: [float(a.sum()) + float(b.sum()) for a, b in weights]],
        sync, params["budget_s"], cancel, on_round=lambda share: progress(0.1 + 0.85 * share, turns))
    bandwidth = weight_bytes / read_s
    flops_per_token = layers * 2 * matmul_flops(1, ffn, hidden)
    decode_tps = 1 / decode_s
    prefill_tps = prompt / prefill_s
    bound = decode_tokens_per_second_bound(weight_bytes=weight_bytes, bandwidth=bandwidth)
    decode_intensity = float(matmul_arithmetic_intensity(1, ffn, hidden, element))
    prefill_intensity = float(matmul_arithmetic_intensity(prompt, ffn, hidden, element))
    machine = detect_machine()
    peak_tflops = machine.peak_tflops(device if device != "cpu" else "cpu", params["dtype"])
    if peak_tflops is not None and device == "cpu":
        peak_tflops = peak_tflops / max(machine.cpu.physical_cores or 1, 1)  # one thread, one core's peak
    metrics = {
        "decode_tokens_per_s": decode_tps,
        "decode_bound_tokens_per_s": bound,
        "decode_over_bound": decode_tps / bound,
        "prefill_tokens_per_s": prefill_tps,
        "prefill_over_decode": prefill_tps / decode_tps,
        "read_gbps": bandwidth / 1e9,
        "decode_gbps": weight_bytes / decode_s / 1e9,
        "decode_tflops": flops_per_token * decode_tps / 1e12,
        "prefill_tflops": flops_per_token * prefill_tps / 1e12,
        "decode_intensity": decode_intensity,
        "prefill_intensity": prefill_intensity,
        "weight_bytes": float(weight_bytes),
    }
    rows = [
        Measurement("weights read per decode step", float(weight_bytes), "B",
                    note=f"{layers} MLP layers {hidden}x{ffn}x{hidden}, {params['dtype']}"),
        Measurement("this machine's read bandwidth over those weights", metrics["read_gbps"], "GB/s",
                    note="one pass that reads every weight once: the memory roof decode meets"),
        Measurement("decode: tokens per second", decode_tps, "tokens/s", bound,
                    "bandwidth / weight bytes (the roofline bound of decode)",
                    "each step reads every weight for 2 FLOPs each: memory-bound", rate=True),
        Measurement(f"prefill: tokens per second ({prompt} tokens per pass)", prefill_tps, "tokens/s", None,
                    "", "the same weights, read once for all the prompt's tokens"),
        Measurement("arithmetic intensity, decode (1 token)", decode_intensity, "FLOP/B",
                    note="2·m·n·k / bytes(A, B, C) with m = 1 (Williams et al. 2009)"),
        Measurement(f"arithmetic intensity, prefill ({prompt} tokens)", prefill_intensity, "FLOP/B",
                    note="the same weights serve m tokens: intensity grows with m"),
        Measurement("prefill compute rate", metrics["prefill_tflops"], "TFLOP/s",
                    peak_tflops, "theoretical peak of one core" if device == "cpu" else "datasheet peak",
                    rate=True),
    ]
    if peak_tflops:
        ridge = ridge_point(peak_tflops * 1e12, bandwidth)
        metrics["ridge_intensity"] = ridge
        rows.append(Measurement("ridge point: peak / bandwidth", ridge, "FLOP/B", note=(
            "below it a kernel is memory-bound, above it compute-bound (Williams et al. 2009)")))
    progress(1.0, "done")
    summary = (f"decode {format_quantity(decode_tps, 'tokens/s')} (bound {format_quantity(bound, 'tokens/s')} from "
               f"{format_rate(metrics['read_gbps'], 'GB/s')}), prefill {format_quantity(prefill_tps, 'tokens/s')}: "
               f"{format_quantity(metrics['prefill_over_decode'], 'x')}")
    return ProbeResult(probe="prefill-decode", rows=tuple(rows), metrics=metrics, summary=summary,
                       cancelled=cancel.is_set(), device=device)


PREFILL_DECODE = make_probe(
    name="prefill-decode",
    title="Prefill against decode on the roofline",
    description="Runs a stack of MLP weights far larger than the cache for one token per step (decode) and for a "
                "whole prompt at once (prefill); decode against the bandwidth bound, intensities against the ridge.",
    needs_torch=True,
    params=(
        Param("hidden", "int", 1024, "hidden size h (the MLP is h x 4h x h)", minimum=64, maximum=8192),
        Param("layers", "int", 8, "MLP layers (weights: 8·h²·layers elements)", minimum=1, maximum=64),
        Param("prompt", "int", 128, "prompt tokens processed together in prefill", minimum=2, maximum=4096),
        Param("dtype", "str", "fp32", "weight dtype", choices=tuple(DTYPE_BYTES)),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(4.0, "seconds of timing in all"),
        device_param(),
    ),
    metrics=("decode_tokens_per_s", "decode_bound_tokens_per_s", "decode_over_bound", "prefill_tokens_per_s",
             "prefill_over_decode", "read_gbps", "decode_gbps", "decode_tflops", "prefill_tflops", "decode_intensity",
             "prefill_intensity", "weight_bytes", "ridge_intensity"),
    body=_prefill_decode,
    metrics_of=lambda p: ("decode_tokens_per_s", "decode_bound_tokens_per_s", "decode_over_bound",
                          "prefill_tokens_per_s", "prefill_over_decode", "read_gbps", "decode_gbps", "decode_tflops",
                          "prefill_tflops", "decode_intensity", "prefill_intensity", "weight_bytes"),
)
