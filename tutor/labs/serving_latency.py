"""Serving labs on a real transformers Llama (random weights, built from a config): what a user waits
for and what a server produces.

ttft-tpot: one request timed as a server runs it: the prompt read in one forward pass (the time to
first token, TTFT), then one decode step per token (the time per output token, TPOT), with the FLOP/s
each phase reaches (Kaplan's 2N + 2·L·n_ctx·d_attn per token, tutor.theory.flops) and the request's
latency beside tutor.theory.serving.request_latency_s.

batch-decode: one decode step of the same model at growing batch sizes (milliseconds per step and
tokens per second for the server), then the request mix played under static batching and under
iteration-level (continuous) batching (tutor.theory.serving's schedules, Orca, OSDI 2022), each
schedule's steps timed at the step time measured here.
"""

from __future__ import annotations

import random
import statistics
import threading
import time

from tutor.errors import UserError
from tutor.formatting import format_bytes, format_count, format_duration, format_number, format_percent, format_rate
from tutor.labs._params import Param, budget_param, device_param, make_probe, resolve_device
from tutor.labs.decode_engines import VOCAB, chosen_dtype, llama_config
from tutor.labs.inference import DTYPE_BYTES, keeping_torch_threads, tiny_llama_params, without_transformers
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn

MIN_ROUNDS = 2
MAX_ROUNDS = 30


def model_params(default_layers: int = 4, default_hidden: int = 256) -> tuple[Param, ...]:
    """The shape of the lab's Llama: the parameters every serving lab on a real model takes."""
    return (
        Param("layers", "int", default_layers, "decoder layers", minimum=1, maximum=32),
        Param("hidden", "int", default_hidden, "hidden size", minimum=8, maximum=4096),
        Param("heads", "int", 4, "query heads", minimum=1, maximum=64),
        Param("kv_heads", "int", 2, "key/value heads", minimum=1, maximum=64),
    )


def check_shape(lab: str, params: dict) -> None:
    """hidden a multiple of heads, heads a multiple of kv_heads: one line otherwise."""
    hidden, heads, kv_heads = params["hidden"], params["heads"], params["kv_heads"]
    if hidden % heads or heads % kv_heads:
        raise UserError(f"{lab}: hidden {hidden} must be a multiple of heads {heads}, and heads a multiple of "
                        f"kv_heads {kv_heads}")


def build_model(params: dict, device: str, dtype: str, *, max_positions: int, layers: int | None = None):
    """(model, config): a LlamaForCausalLM with random weights, in eval mode, on `device` in `dtype`."""
    from transformers import LlamaForCausalLM

    from tutor.bench.matmul import torch_dtype

    config = llama_config(layers=layers or params["layers"], hidden=params["hidden"], heads=params["heads"],
                          kv_heads=params["kv_heads"], max_positions=max_positions)
    # transformers declares .to through functools.wraps(nn.Module.to), which mypy reads as a call missing self
    model = LlamaForCausalLM(config).to(device=device, dtype=torch_dtype(dtype)).eval()  # type: ignore[call-arg]
    return model, config


def new_cache(config):
    """An empty DynamicCache for `config` (the cache `generate` uses)."""
    from transformers import DynamicCache

    try:
        return DynamicCache(config=config)
    except TypeError:  # a transformers release whose DynamicCache takes no config
        return DynamicCache()


def forward(model, ids, cache, *, last_only: bool = False):
    """The model's logits for `ids`, appending them to `cache`."""
    from tutor.trace.memory_trace import cache_argument

    kwargs = {cache_argument(model): cache, "use_cache": True}
    if last_only:  # only the last position's logits, as generate asks
        kwargs["logits_to_keep"] = 1
    return model(ids, **kwargs).logits


def synchronizer(device: str):
    import torch

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)

    return sync


def forward_flops_per_token(params: dict, context: int) -> int:
    """Forward FLOPs per token at `context` tokens attended (Kaplan et al., tutor.theory.flops)."""
    from tutor.theory.flops import inference_flops_per_token

    n_params = tiny_llama_params(layers=params["layers"], hidden=params["hidden"], heads=params["heads"],
                                 kv_heads=params["kv_heads"])
    return inference_flops_per_token(params=n_params, layers=params["layers"], context=context,
                                     attention_dim=params["hidden"])


def check_serving_lab_fits(lab: str, params: dict, device: str, dtype: str, *, batch: int, context: int,
                           flops: float) -> None:
    """Weights, the batch's KV cache and the prompt's attention scores against this machine."""
    from tutor.labs.limits import check_lab_fits
    from tutor.theory.kv_cache import kv_cache_bytes_per_token

    element = DTYPE_BYTES[dtype]
    n_params = tiny_llama_params(layers=params["layers"], hidden=params["hidden"], heads=params["heads"],
                                 kv_heads=params["kv_heads"])
    weights = n_params * element
    cache = batch * context * kv_cache_bytes_per_token(layers=params["layers"], kv_heads=params["kv_heads"],
                                                       head_dim=params["hidden"] // params["heads"],
                                                       bytes_per_element=element)
    scores = 2 * batch * params["heads"] * params["prompt"] ** 2 * element
    check_lab_fits(lab, memory_bytes=weights + cache + scores,
                   memory_what=f"weights {format_bytes(weights)}, KV cache {format_bytes(cache)}, prompt scores {format_bytes(scores)}",
                   device=device, flops=flops, dtype=dtype, fix="lower layers, hidden, prompt, tokens or batch")


# ---- ttft-tpot --------------------------------------------------------------------------------

@keeping_torch_threads
def _ttft_tpot(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    if cancel.is_set():
        return ProbeResult("ttft-tpot", (), {}, "cancelled before the model was built", True, "cpu")
    import torch

    if (missing := without_transformers("ttft-tpot", "time to first token")) is not None:
        return missing
    check_shape("ttft-tpot", params)
    device = resolve_device(params["device"])
    dtype = chosen_dtype(params["dtype"], device)
    prompt, tokens, batch = params["prompt"], params["tokens"], params["batch"]
    context = prompt + tokens + 1
    flops = (1 + MIN_ROUNDS) * batch * context * forward_flops_per_token(params, context)
    check_serving_lab_fits("ttft-tpot", params, device, dtype, batch=batch, context=context, flops=flops)
    if device == "cpu":
        torch.set_num_threads(1)  # one core: the figures do not depend on what else the machine runs
    torch.manual_seed(params["seed"])
    progress(0.05, "building the model")
    model, config = build_model(params, device, dtype, max_positions=context + 16)
    ids = torch.randint(0, VOCAB, (batch, prompt), device=device)
    sync = synchronizer(device)
    ttfts: list[float] = []
    tpots: list[float] = []
    steps_s: list[float] = []
    latencies: list[float] = []
    deadline = time.perf_counter() + params["budget_s"]
    with torch.no_grad():
        for round_ in range(MAX_ROUNDS + 1):  # round 0 warms up (first-call costs) and is not kept
            if cancel.is_set() or (round_ > MIN_ROUNDS and time.perf_counter() > deadline):
                break
            cache = new_cache(config)
            sync()
            start = time.perf_counter()
            token = forward(model, ids, cache, last_only=True)[:, -1:].argmax(dim=-1)
            sync()
            first = time.perf_counter()
            steps = []
            for _ in range(tokens):
                step_start = time.perf_counter()
                token = forward(model, token, cache)[:, -1:].argmax(dim=-1)
                sync()
                steps.append(time.perf_counter() - step_start)
            end = time.perf_counter()
            if round_:
                ttfts.append(first - start)
                # A request's TPOT as vLLM's benchmark defines it: its decode time over its later tokens.
                tpots.append((end - first) / tokens)
                steps_s.extend(steps)
                latencies.append(end - start)
            progress(0.1 + 0.85 * min(1.0, round_ / (MIN_ROUNDS + 1)), f"request {round_ + 1}: prefill, then decode")
    if not ttfts:
        return ProbeResult("ttft-tpot", (), {}, "cancelled before a request was timed", True, device)
    from tutor.theory.serving import request_latency_s, server_tokens_per_second, user_tokens_per_second

    ttft, tpot, latency = statistics.median(ttfts), statistics.median(tpots), statistics.median(latencies)
    prefill_flops = batch * prompt * forward_flops_per_token(params, prompt // 2)  # mean context over the prompt
    decode_flops = batch * forward_flops_per_token(params, prompt + tokens // 2)
    metrics = {
        "ttft_s": ttft,
        "tpot_s": tpot,
        "ttft_over_tpot": ttft / tpot,
        "prefill_tokens_per_s": batch * prompt / ttft,
        "user_tokens_per_s": user_tokens_per_second(tpot),
        "server_tokens_per_s": server_tokens_per_second(batch=batch, step_s=tpot),
        "prefill_flops_per_s": prefill_flops / ttft,
        "decode_flops_per_s": decode_flops / tpot,
        "prefill_over_decode_flops": (prefill_flops / ttft) / (decode_flops / tpot),
        "latency_s": latency,
    }
    theory_latency = request_latency_s(ttft_s=ttft, tpot_s=tpot, output_tokens=tokens + 1)
    where = "the CPU (one core)" if device == "cpu" else device
    shape = (f"{params['layers']} layers, hidden {params['hidden']}, {dtype}, batch {batch}, "
             f"{prompt}-token prompt; median of {len(ttfts)} requests")
    rows = (
        Measurement("time to first token (TTFT): the whole prompt in one forward pass", ttft, "s",
                    note=f"on {where}; {shape}"),
        Measurement("time per output token (TPOT): one decode step", tpot, "s",
                    note="each request's decode time over its tokens after the first (vLLM's definition), "
                         "the median request's"),
        Measurement("TTFT / TPOT", ttft / tpot, "x", float(prompt), "the prompt's tokens, if a token cost the same "
                    "in both phases", "below the prompt length: prefill does many tokens' work per weight read"),
        Measurement("prefill rate", metrics["prefill_flops_per_s"], "FLOP/s",
                    note=f"{format_count(prefill_flops)} FLOPs (2N + attention per token, Kaplan et al.) over TTFT"),
        Measurement("decode rate", metrics["decode_flops_per_s"], "FLOP/s",
                    note="one token per sequence per step: every weight read for two FLOPs per sequence"),
        Measurement("tokens/s one user sees (1 / TPOT)", metrics["user_tokens_per_s"], "tokens/s"),
        Measurement(f"tokens/s the server generates (batch {batch} / TPOT)", metrics["server_tokens_per_s"],
                    "tokens/s"),
        Measurement(f"one request: prompt in, {tokens + 1} tokens out", latency, "s", theory_latency,
                    "TTFT + TPOT × (output tokens - 1)"),
    )
    progress(1.0, "done")
    summary = (f"TTFT {format_duration(ttft)} for {prompt} tokens, TPOT {format_duration(tpot)} "
               f"({format_number(ttft / tpot)}x); prefill at {format_rate(metrics['prefill_flops_per_s'], 'FLOP/s')}, "
               f"decode at {format_rate(metrics['decode_flops_per_s'], 'FLOP/s')}")
    details = {"ttft_s": ttfts, "tpot_s": tpots, "steps_s": steps_s, "dtype": dtype}
    return ProbeResult("ttft-tpot", rows, metrics, summary, cancel.is_set(), device, details)


TTFT_TPOT = make_probe(
    name="ttft-tpot",
    title="Prefill against decode: time to first token and time per token",
    description="Times requests to a small transformers Llama as a server runs them: the prompt in one forward "
                "pass (time to first token), then one decode step per token (time per output token), with the "
                "FLOP/s each phase reaches and tokens per second for a user and for the server.",
    needs_torch=True,
    params=(
        *model_params(),
        Param("prompt", "int", 128, "prompt tokens (prefill)", minimum=1, maximum=4096),
        Param("tokens", "int", 16, "tokens decoded after the first", minimum=1, maximum=512),
        Param("batch", "int", 1, "requests served together", minimum=1, maximum=64),
        Param("dtype", "str", "auto", "weight and cache dtype: auto is bf16 on a GPU, fp32 on a CPU",
              choices=("auto", *DTYPE_BYTES)),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(4.0, "seconds of requests at most (at least 2 after a warm-up)"),
        device_param(),
    ),
    metrics=("ttft_s", "tpot_s", "ttft_over_tpot", "prefill_tokens_per_s", "user_tokens_per_s", "server_tokens_per_s",
             "prefill_flops_per_s", "decode_flops_per_s", "prefill_over_decode_flops", "latency_s"),
    body=_ttft_tpot,
)


# ---- batch-decode -----------------------------------------------------------------------------

def batch_sizes(given: str) -> list[int]:
    """The batch sizes asked for ("1,2,4"), sorted, each a whole number from 1 to 256 (one line otherwise)."""
    parts = [part.strip() for part in given.split(",") if part.strip()]
    if not parts or any(not part.isdigit() or not 1 <= int(part) <= 256 for part in parts):
        raise UserError(f"batch-decode: batches must be whole numbers from 1 to 256 separated by commas, got {given!r}")
    return sorted({int(part) for part in parts})


def request_mix(requests: int, output_max: int, seed: int) -> list[int]:
    """Output lengths of a request mix: uniform from 1 to output_max tokens, seeded."""
    rng = random.Random(seed)
    return [rng.randint(1, output_max) for _ in range(requests)]


@keeping_torch_threads
def _batch_decode(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    if cancel.is_set():
        return ProbeResult("batch-decode", (), {}, "cancelled before the model was built", True, "cpu")
    import torch

    if (missing := without_transformers("batch-decode", "decode step")) is not None:
        return missing
    check_shape("batch-decode", params)
    batches = batch_sizes(params["batches"])
    device = resolve_device(params["device"])
    dtype = chosen_dtype(params["dtype"], device)
    prompt, steps = params["prompt"], params["steps"]
    context = prompt + steps + 2
    flops = sum(batches) * (prompt + steps + 1) * forward_flops_per_token(params, context)
    check_serving_lab_fits("batch-decode", params, device, dtype, batch=max(batches), context=context, flops=flops)
    if device == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(params["seed"])
    progress(0.05, "building the model")
    model, config = build_model(params, device, dtype, max_positions=context + 16)
    sync = synchronizer(device)
    step_s: dict[int, float] = {}
    deadline_share = params["budget_s"] / len(batches)
    with torch.no_grad():
        for index, batch in enumerate(batches):
            if cancel.is_set():
                break
            progress(0.1 + 0.8 * index / len(batches), f"decoding at batch {batch}")
            cache = new_cache(config)
            ids = torch.randint(0, VOCAB, (batch, prompt), device=device)
            token = forward(model, ids, cache, last_only=True)[:, -1:].argmax(dim=-1)
            token = forward(model, token, cache)[:, -1:].argmax(dim=-1)  # a first step, untimed
            sync()
            times: list[float] = []
            deadline = time.perf_counter() + deadline_share
            for _ in range(steps):
                if cancel.is_set() or (len(times) >= MIN_ROUNDS + 1 and time.perf_counter() > deadline):
                    break
                start = time.perf_counter()
                token = forward(model, token, cache)[:, -1:].argmax(dim=-1)
                sync()
                times.append(time.perf_counter() - start)
            if times:
                step_s[batch] = statistics.median(times)
    if len(step_s) < len(batches):
        return ProbeResult("batch-decode", (), {}, "cancelled before every batch size was timed", True, device)
    from tutor.theory.serving import continuous_batching_schedule, server_tokens_per_second, static_batching_schedule

    first, last = batches[0], batches[-1]
    rows = []
    for batch in batches:
        rate = server_tokens_per_second(batch=batch, step_s=step_s[batch])
        rows.append(Measurement(f"batch {batch}: one decode step", step_s[batch], "s",
                                note=f"{format_rate(rate, 'tokens/s')} for the server, "
                                     f"{format_rate(1 / step_s[batch], 'tokens/s')} for each user"))
    mix = request_mix(params["requests"], params["output_max"], params["seed"])
    static = static_batching_schedule(mix, last)
    continuous = continuous_batching_schedule(mix, last)
    # Both schedules run a full batch of slots every step (static batching pads its finished requests),
    # so each step takes the time measured at that batch; continuous batching's tail runs fewer, which
    # this counts at the full batch's time too: a bound on its advantage from below.
    step = step_s[last]
    static_s, continuous_s = static.steps * step, continuous.steps * step
    metrics = {
        "step_s_first": step_s[first],
        "step_s_last": step,
        "step_growth": step / step_s[first],
        "tokens_per_s_first": server_tokens_per_second(batch=first, step_s=step_s[first]),
        "tokens_per_s_last": server_tokens_per_second(batch=last, step_s=step),
        "throughput_gain": (last / step) / (first / step_s[first]),
        "static_tokens_per_s": static.tokens / static_s,
        "continuous_tokens_per_s": continuous.tokens / continuous_s,
        "continuous_over_static": static.steps / continuous.steps,
        "static_utilisation": static.utilisation,
        "continuous_utilisation": continuous.utilisation,
        "static_mean_latency_s": static.mean_finish_step * step,
        "continuous_mean_latency_s": continuous.mean_finish_step * step,
    }
    rows.append(Measurement(f"server tokens/s at batch {last} over batch {first}", metrics["throughput_gain"], "x",
                            float(last) / first, "the batch ratio: what a step whose time did not grow would give",
                            f"the step grew {format_number(metrics['step_growth'])}x"))
    mix_note = f"{len(mix)} requests of 1 to {params['output_max']} tokens at batch {last}"
    rows.append(Measurement("static batching: each batch runs until its longest request ends",
                            metrics["static_tokens_per_s"], "tokens/s",
                            note=f"{format_count(static.steps, exact=True)} steps, {format_percent(static.utilisation)} of slots busy; "
                                 f"mean request done after {format_duration(metrics['static_mean_latency_s'])}"))
    rows.append(Measurement("continuous batching: a finished request's slot is refilled at the next step",
                            metrics["continuous_tokens_per_s"], "tokens/s",
                            note=f"{format_count(continuous.steps, exact=True)} steps, {format_percent(continuous.utilisation)} of "
                                 f"slots busy; mean request done after "
                                 f"{format_duration(metrics['continuous_mean_latency_s'])}; {mix_note}"))
    progress(1.0, "done")
    summary = (f"batch {first}: {format_duration(step_s[first])} per step, batch {last}: {format_duration(step)} "
               f"({format_number(metrics['throughput_gain'])}x the tokens/s); continuous batching "
               f"{format_number(metrics['continuous_over_static'])}x static on {mix_note}")
    details = {"step_s": {str(b): s for b, s in step_s.items()}, "output_tokens": mix, "dtype": dtype}
    return ProbeResult("batch-decode", tuple(rows), metrics, summary, cancel.is_set(), device, details)


BATCH_DECODE = make_probe(
    name="batch-decode",
    title="Batched decode: static against continuous batching",
    description="Times one decode step of a small transformers Llama at growing batch sizes (time per step, "
                "tokens per second for the server and for each user), then plays a request mix under static "
                "and continuous (iteration-level) batching at the largest batch, timed at the measured step.",
    needs_torch=True,
    params=(
        *model_params(),
        Param("prompt", "int", 32, "prompt tokens of each sequence", minimum=1, maximum=2048),
        Param("batches", "text", "1,2,4,8,16,32", "batch sizes timed, separated by commas (each 1 to 256)"),
        Param("steps", "int", 8, "decode steps timed per batch size", minimum=2, maximum=256),
        Param("requests", "int", 64, "requests in the simulated mix", minimum=1, maximum=100_000),
        Param("output_max", "int", 256, "longest output of the mix (outputs are uniform from 1)", minimum=1,
              maximum=100_000, unit="tokens"),
        Param("dtype", "str", "auto", "weight and cache dtype: auto is bf16 on a GPU, fp32 on a CPU",
              choices=("auto", *DTYPE_BYTES)),
        Param("seed", "int", 0, "random seed", minimum=0),
        budget_param(6.0, "seconds of decoding at most, shared by the batch sizes"),
        device_param(),
    ),
    metrics=("step_s_first", "step_s_last", "step_growth", "tokens_per_s_first", "tokens_per_s_last",
             "throughput_gain", "static_tokens_per_s", "continuous_tokens_per_s", "continuous_over_static",
             "static_utilisation", "continuous_utilisation", "static_mean_latency_s", "continuous_mean_latency_s"),
    body=_batch_decode,
)
