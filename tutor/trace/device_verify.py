"""`tensor-tutor time MODEL --verify --device N`: the real model run on a CUDA device, to set beside `time`'s answer
for it (tutor.answers.time.device_verification predicts and joins).

The real run is MODEL as transformers builds it from its
config (random weights, SDPA), on the device, at full size where its step fits in 85% of the memory free now,
else with fewer decoder layers (the same width, so the same kernels; the prediction is made for that same
model). Timed with CUDA events (the wall clock after the queue drains where events are not available):

- mode train: forward (the loss), backward and the optimizer (torch.optim.AdamW, foreach) as phases, the median
  of STEPS after WARMUP; recipes bf16 (bf16 weights and states), fp32, and hf-amp (fp32 weights under
  torch.autocast to bf16);
- a prefill of the request's sequence (batch 1; logits of the last position), the median of PREFILLS;
- decode after that prompt, at batch 1 and 8: eager (transformers' forward with a DynamicCache, the loop
  `generate` runs) and, where transformers' StaticCache can be captured, the same step replayed from a CUDA
  graph (tutor.trace.decode_loops), the median of DECODE_STEPS each.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import replace

from tutor.errors import UserError
from tutor.theory.fit import FitRequest

WARMUP = 2
STEPS = 3
PREFILLS = 3
DECODE_STEPS = 12
DECODE_BATCHES = (1, 8)
MEMORY_SHARE = 0.85
GPU_RECIPES = ("bf16", "fp32", "hf-amp")


def gpu_index(device: str | None) -> int | None:
    """The CUDA index `--device` names (0, cuda:1), or None for anything else (cpu, a card by name)."""
    from tutor.hardware.specs import lookup_gpu_spec

    text = (device or "").strip().lower()
    if text.startswith("cuda"):
        rest = text[4:].lstrip(":")
        return int(rest) if rest.isdigit() else 0
    if text.isdigit() and lookup_gpu_spec(text) is None:
        return int(text)
    return None


def check_device(index: int, asked: str | None = None) -> str:
    """'cuda:N' when torch sees that device, else a one-line UserError (naming the device as `asked`)."""
    asked = asked if asked is not None else str(index)
    try:
        import torch
    except ImportError:
        raise UserError("--verify on a GPU runs the real model: it needs torch with CUDA") from None
    if not torch.cuda.is_available():
        raise UserError(f"--verify --device {asked}: no CUDA GPU on this machine (torch sees none); "
                        "verify on the CPU with --device cpu")
    if index >= torch.cuda.device_count():
        raise UserError(f"--verify --device {asked}: torch sees {torch.cuda.device_count()} CUDA GPU(s), "
                        f"numbered from 0")
    return f"cuda:{index}"


class _Timer:
    """Seconds between two marks on `device`: CUDA events there, the wall clock after a sync elsewhere."""

    def __init__(self, torch, device: str) -> None:
        self.torch, self.cuda = torch, device.startswith("cuda")

    def mark(self):
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start, end) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end) / 1e3
        return end - start


def layers_that_fit(arch, request: FitRequest, free_bytes: int) -> int:
    """The most decoder layers of `arch` whose step (tutor.theory.fit, as `fit` counts it) fits in MEMORY_SHARE
    of `free_bytes`: all of them where the whole model fits, at least 1."""
    from tutor.theory import fit as fitting

    def need(layers: int) -> int:
        return fitting.estimate(replace(arch, num_layers=layers), request).worst.total

    budget = MEMORY_SHARE * free_bytes
    if need(arch.num_layers) <= budget:
        return arch.num_layers
    low, high = 1, arch.num_layers
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if need(mid) <= budget else (low, mid)
    return low


def _train(torch, model, ids, recipe: str, timer: _Timer) -> dict[str, float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    autocast = recipe == "hf-amp"
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    model.train()
    for index in range(WARMUP + STEPS):
        t0 = timer.mark()
        with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        t1 = timer.mark()
        loss.backward()
        t2 = timer.mark()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t3 = timer.mark()
        if index >= WARMUP:
            phases["forward"].append(timer.seconds(t0, t1))
            phases["backward"].append(timer.seconds(t1, t2))
            phases["optimizer"].append(timer.seconds(t2, t3))
        del loss
    del optimizer
    return {name: statistics.median(values) for name, values in phases.items()}


def _inference(torch, model, hf, vocab: int, seq: int, device: str, timer: _Timer) -> dict:
    from tutor.trace.decode_loops import StaticDecoder, capture_cuda_graph, eager_decoder

    model.eval()
    out: dict = {"decode": {}}
    with torch.no_grad():
        ids = torch.randint(0, vocab, (1, seq), device=device)
        model(input_ids=ids, use_cache=True, logits_to_keep=1)
        times = []
        for _ in range(PREFILLS):
            t0 = timer.mark()
            model(input_ids=ids, use_cache=True, logits_to_keep=1)
            times.append(timer.seconds(t0, timer.mark()))
        out["prefill"] = statistics.median(times)
        for batch in DECODE_BATCHES:
            prompt = torch.randint(0, vocab, (batch, seq), device=device)
            step = eager_decoder(model, hf, prompt)
            for _ in range(2):
                step()
            times = []
            for _ in range(DECODE_STEPS):
                t0 = timer.mark()
                step()
                times.append(timer.seconds(t0, timer.mark()))
            out["decode"][("eager", batch)] = statistics.median(times)
            del step
            if not device.startswith("cuda"):
                continue
            try:
                decoder = StaticDecoder(model, hf, prompt, max_len=seq + DECODE_STEPS + 8)
                graph = capture_cuda_graph(decoder)
            except Exception as error:  # a family or release whose static cache does not capture: say why
                out.setdefault("graphs_note", f"CUDA graph capture failed: {type(error).__name__}: "
                                              f"{(str(error).splitlines() or [''])[0][:160]}")
                continue
            times = []
            for _ in range(min(DECODE_STEPS, decoder.room)):
                decoder.room -= 1
                t0 = timer.mark()
                graph.replay()
                times.append(timer.seconds(t0, timer.mark()))
            out["decode"][("graphs", batch)] = statistics.median(times)
            del graph, decoder
    return out


def verification_config(config: dict, request: FitRequest, device: str) -> dict:
    """The config the verification builds: MODEL's own where its step fits in MEMORY_SHARE of `device`'s free
    memory, else with fewer decoder layers (layers_that_fit). Refuses in one line what a GPU verification cannot
    run."""
    from tutor.trace.step_verify import scaled_architecture

    train = request.mode == "train"
    if train and request.recipe not in GPU_RECIPES:
        raise UserError(f"--verify on a GPU runs {', '.join(GPU_RECIPES)} training steps (no master-weight "
                        f"copies); use --recipe bf16 rather than {request.recipe}")
    if train and request.adapter:
        raise UserError("--verify on a GPU runs full training steps; a LoRA step is verified on the CPU")
    if request.devices != 1:
        raise UserError("--verify runs one device: leave --dp, --tp, --pp and --devices at 1")
    arch = scaled_architecture(config, str(config.get("model_type")))
    if device.startswith("cuda"):
        import torch

        free = torch.cuda.mem_get_info(device)[0]
    else:
        free = 1 << 62
    layers = layers_that_fit(arch, request, free)
    return dict(config) if layers == arch.num_layers else _with_layers(config, layers)


def weights_dtype(request: FitRequest) -> str:
    """The dtype the verified model's weights are built in: the recipe's for training (hf-amp: fp32 weights under
    autocast), the request's for inference (bf16 by default)."""
    if request.mode == "train":
        return "bf16" if request.recipe == "bf16" else "fp32"
    return {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16"}.get(str(request.dtype), "bf16")


def measure_model(config: dict, request: FitRequest, device: str) -> dict:
    """The real model of `config` on `device` (module docstring): measured seconds of the training step's phases
    (mode train), a prefill and each engine's decode step at DECODE_BATCHES."""
    import torch
    from transformers.utils import logging as hf_logging

    from tutor.bench.matmul import torch_dtype
    from tutor.trace.step_verify import build_as_run

    hf_logging.set_verbosity_error()
    dtype = torch_dtype(weights_dtype(request))
    torch.manual_seed(0)
    model, hf = build_as_run(torch, config, dtype, device)
    timer = _Timer(torch, device)
    vocab = int(config.get("vocab_size") or hf.vocab_size)
    out: dict = {"clock": "CUDA events" if device.startswith("cuda") else "wall clock"}
    if request.mode == "train":
        ids = torch.randint(0, vocab, (request.batch, request.seq_len), device=device)
        out["phases"] = _train(torch, model, ids, request.recipe, timer)
        if device.startswith("cuda"):
            out["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        model.zero_grad(set_to_none=True)
    out.update(_inference(torch, model, hf, vocab, request.seq_len, device, timer))
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return out


def _with_layers(config: dict, layers: int) -> dict:
    """The config with `layers` decoder layers, its per-layer lists rebuilt to match (transformers checks them)
    by repeating the model's own pattern of layer kinds (tutor.trace.layer_count.with_layers): fewer layers of
    Gemma-2 still alternate sliding and full attention."""
    from tutor.trace.layer_count import with_layers

    return with_layers(config, layers)
