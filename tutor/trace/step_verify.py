"""`tensor-tutor time --verify`: predict a real transformers model's step from this machine's ceilings, then run it.

The model is MODEL's architecture from its config.json, scaled down (layers, width, vocabulary,
sequence) until a training step takes a few seconds on this machine, built by transformers
(`AutoModelForCausalLM.from_config`, fp32, SDPA attention where the family has it, else eager, no dropout). Right before the steps, in
the same process and so under the same load, the ceilings the prediction uses are measured:

- the matmul rate at each GEMM shape of the step, in the layout nn.Linear and its backward use
  (y = x·Wᵀ, dX = dY·W, dW = dYᵀ·x), median of several timed calls (mamf-finder's method, on
  the step's own shapes);
- SDPA's causal attention kernel forward and its backward (timed alone) at the step's shape (its rate in
  FLOPs as tutor.theory.step_operations counts them);
- elementwise bandwidth at sizes spanning the step's memory-bound ops (torch.add, 3 arrays counted
  as STREAM's Add does);
- the cost of one tiny op (dispatch overhead), and the framework's own code per decoder layer and
  per model call, measured on the same family at width 64 with 1 and 2 layers (near-zero work);
- torch.optim.AdamW's step on parameters of the trained tensors' own shapes, with the state evicted from the
  caches by the step's reuse distance and the gradients freshly written, as the real step finds them.

Then real steps per phase: forward (the loss), backward, optimizer (AdamW as torch runs it on a CPU),
and a prefill and decode steps, in three rounds that each start with their own measurement of the
ceilings (2 warm-up steps first; medians over rounds and steps), so that a change in the load of a
shared machine reaches prediction and measurement alike. Everything is timed on this thread's CPU
time with torch on one thread (see CLOCK); the wall-clock step is reported beside it.
"""

from __future__ import annotations

import collections
import statistics
import time
from dataclasses import dataclass, replace
from typing import Any

from tutor.errors import UserError
from tutor.theory.fit import FitRequest
from tutor.theory.models import architecture_from_config, count_parameters
from tutor.theory.step_operations import (
    GEMM,
    LAYER_CODE,
    LINEAR_ROLES,
    LORA_SCALE_ADD,
    MODEL_CODE,
    activation_accesses,
    activation_name,
    adapter_params_on_device,
    inference_operations,
    training_operations,
)
from tutor.theory.step_time import (
    BandwidthPoint,
    Ceilings,
    GemmPoint,
    Sourced,
    decode_step,
    operation_seconds,
    prefill_seconds,
)

# (layers, hidden, heads, sequence, batch, vocabulary): the sizes a verification runs at.
SIZES = {
    "tiny": (1, 64, 2, 32, 2, 512),
    "small": (2, 256, 4, 128, 4, 4096),
    "medium": (4, 512, 8, 256, 2, 8192),
    "large": (4, 768, 12, 256, 4, 8192),
}
WARMUP_STEPS = 2
ROUNDS = 3
STEPS_PER_ROUND = 2
DECODE_STEPS = 12
GEMM_REPEATS = 3


MLP_WIDTH_KEYS = ("intermediate_size", "ffn_hidden_size", "ffn_dim")
"""The names a config gives its dense MLP width by (transformers' configs; Falcon: ffn_hidden_size)."""


def scaled_config(config: dict, size: str) -> dict:
    """MODEL's config with its sizes scaled to `size` (SIZES): the same family, head-dim rule, GQA ratio,
    MLP ratio, tying and norms; dropout off so steps repeat exactly."""
    if size not in SIZES:
        raise UserError(f"unknown verify size {size!r}: use {', '.join(SIZES)}")
    layers, hidden, heads, seq, _batch, vocab = SIZES[size]
    return sized_config(config, layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab)


def sized_config(config: dict, *, layers: int, hidden: int, heads: int, seq: int, vocab: int) -> dict:
    """The config with these sizes, everything else (family, ratios, tying, norms) kept."""
    out = dict(config)
    kind = out.get("model_type")
    if kind == "gpt2":
        out.update(n_layer=layers, n_embd=hidden, n_head=heads, n_inner=None, vocab_size=vocab,
                   n_positions=max(seq * 2, 1024), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        out.pop("torch_dtype", None)
        out["dtype"] = "float32"
        return out
    orig_hidden = out.get("hidden_size") or hidden
    orig_heads = out.get("num_attention_heads") or heads
    kv = out.get("num_key_value_heads") or orig_heads
    group = max(1, orig_heads // kv)
    # The MLP width under each name a family reads it by (Falcon: ffn_hidden_size), each scaled by its own ratio;
    # intermediate_size is set where no other name holds the width (a family that reads another name ignores it).
    widths = {key: out[key] for key in MLP_WIDTH_KEYS if isinstance(out.get(key), int) and out[key] > 0}
    if not widths:
        widths = {"intermediate_size": 4 * orig_hidden}
    for key, width in widths.items():
        out[key] = int(round(hidden * width / orig_hidden / 64)) * 64
    out.update(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
               num_key_value_heads=max(1, heads // group),
               vocab_size=vocab, max_position_embeddings=max(out.get("max_position_embeddings") or 0, 4 * seq),
               attention_dropout=0.0)
    if isinstance(out.get("num_kv_heads"), int):  # Falcon's spelling of the KV heads (new_decoder_architecture)
        out["num_kv_heads"] = max(1, heads // max(1, orig_heads // max(1, out["num_kv_heads"])))
    if "head_dim" in out or kind in ("qwen3", "gemma", "gemma2"):
        out["head_dim"] = hidden // heads
    if out.get("moe_intermediate_size"):
        # At least one 64-wide block: a narrow expert (DeepSeek-V3's 2048 of 7168) rounds to nothing at width 64.
        out["moe_intermediate_size"] = max(1, int(round(hidden * out["moe_intermediate_size"] / orig_hidden / 64))) * 64
    for key in ("layer_types", "max_window_layers", "mlp_only_layers"):
        out.pop(key, None)
    if isinstance(out.get("first_k_dense_replace"), int) and out["first_k_dense_replace"] >= layers:
        # DeepSeek's dense first layers, more than the scaled model has: every layer a MoE one (at any of the depths
        # the framework's code is measured at, so the per-layer difference is one kind of layer).
        out["first_k_dense_replace"] = 0
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        # Token ids of the full vocabulary point past the scaled one (an embedding's padding_idx must lie inside it).
        ids = out.get(key)
        if isinstance(ids, list):
            out[key] = [i for i in ids if isinstance(i, int) and 0 <= i < vocab] or None
        elif isinstance(ids, int) and not 0 <= ids < vocab:
            out[key] = None
    out.pop("quantization_config", None)
    out.pop("torch_dtype", None)
    out["dtype"] = "float32"
    return out


LORA_ALPHA = 16  # PEFT LoraConfig's default lora_alpha: scaling = alpha / r


def module_role_name(name: str) -> str:
    """A transformers module's path as step_operations names its GEMM: the last part, or GPT-2's attn/mlp.c_proj."""
    parts = name.split(".")
    return ".".join(parts[-2:]) if parts[-1] == "c_proj" else parts[-1]


def add_lora_adapters(torch, model, request: FitRequest) -> list:
    """LoRA by hand, as PEFT's LoraLinear does it (peft/tuners/lora/layer.py): every base weight frozen, and each
    targeted linear (nn.Linear, or GPT-2's Conv1D with W stored (in, out)) wrapped so that its output is
    base(x) + lora_B(lora_A(x)) * alpha / r; lora_A Kaiming-uniform, lora_B zeros (PEFT's init). Returns the
    adapters' parameters, the only ones the optimizer steps."""
    nn = torch.nn
    wanted = set(request.lora_targets)
    rank = request.lora_rank

    class LoraWrapped(nn.Module):  # type: ignore[name-defined]  # torch is imported by the caller
        def __init__(self, base, d_in: int, d_out: int):
            super().__init__()
            self.base_layer = base
            self.lora_A = nn.Linear(d_in, rank, bias=False)
            self.lora_B = nn.Linear(rank, d_out, bias=False)
            nn.init.zeros_(self.lora_B.weight)
            self.scaling = LORA_ALPHA / rank

        def forward(self, x):
            result = self.base_layer(x)
            return result + self.lora_B(self.lora_A(x)) * self.scaling

    for parameter in model.parameters():
        parameter.requires_grad_(False)
    targets = []
    for name, module in model.named_modules():
        roles = LINEAR_ROLES.get(module_role_name(name))
        if roles is None or not wanted & set(roles) or name.endswith("lm_head"):
            continue
        weight = getattr(module, "weight", None)
        if weight is None or weight.dim() != 2:
            continue
        d_in, d_out = (weight.shape[1], weight.shape[0]) if isinstance(module, nn.Linear) else weight.shape
        targets.append((name, module, int(d_in), int(d_out)))
    adapters = []
    for name, module, d_in, d_out in targets:
        parent_name, _, child = name.rpartition(".")
        wrapped = LoraWrapped(module, d_in, d_out)
        setattr(model.get_submodule(parent_name), child, wrapped)
        adapters += [wrapped.lora_A.weight, wrapped.lora_B.weight]
    if not adapters:
        raise UserError("no linear layer of this model matches the LoRA targets")
    return adapters


CLOCK = time.thread_time
"""Steps and ceilings are timed on this thread's CPU time, with torch on one thread: on a shared machine
wall-clock time counts the other programs' turns too (and a multi-threaded kernel waits for its slowest,
descheduled thread), CPU time counts the work. Wall-clock figures are reported beside it."""
CLOCK_RESOLUTION = time.get_clock_info("thread_time").resolution


def timed_training_step(model, ids, optimizer) -> tuple[float, float, float]:
    """One training step as a user's loop runs it (the loss on `ids` as labels, backward, the optimizer's step and
    zero_grad), each phase on CLOCK: (forward with the loss, backward, optimizer) seconds."""
    t0 = CLOCK()
    loss = model(input_ids=ids, labels=ids).loss
    t1 = CLOCK()
    loss.backward()
    t2 = CLOCK()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t3 = CLOCK()
    return t1 - t0, t2 - t1, t3 - t2
ROTATE_BYTES = 64 * 2**20  # GEMM operands rotate over copies this large, so weights come from DRAM as in a step


def _median_seconds(fn, repeats: int) -> float:
    return _median_on(CLOCK, fn, repeats)


REUSE_LIMIT_BYTES = 256 * 2**20
"""The most memory a probe's operand copies or flush may take: past it the operands come from DRAM. Measured: 8x the
32 MiB L3 of the first dev machine; on a VM reporting a 480 MiB shared L3, the optimizer probe slowed until a
256 MiB flush (12.0 ms) and no further (12.2 ms at 384 MiB and beyond): the VM gets a share of that L3."""


def reuse_distance_bytes(ops) -> int:
    """The bytes a pass touches between two uses of the same weight: in a decode step each weight is read once per
    step, so everything else the step moves (all its operations' bytes) passes through the caches in between."""
    return sum(op.calls * op.bytes for op in ops)


def rotation_copies(reuse_bytes: int, per_call_bytes: int, *, minimum: int = 1) -> int:
    """Operand copies a measured call rotates over so that each copy comes back only after `reuse_bytes` (capped at
    REUSE_LIMIT_BYTES) have passed through the caches, as the same operand does in the step: a call moving
    `per_call_bytes` then finds its operands where the step finds them (a cache when the step fits in it, DRAM
    when it does not). Least-recently-used replacement (Hennessy & Patterson, 6th ed., §B.1): a line survives
    until the cache has seen its capacity of other lines, so the reuse distance, not the operand's size, decides."""
    return max(minimum, min(reuse_bytes, REUSE_LIMIT_BYTES) // max(1, per_call_bytes))


DECODE_SAMPLE_SECONDS = 0.02


def _repeats(fn) -> int:
    """Timed calls for a short kernel: as many as fill DECODE_SAMPLE_SECONDS of CPU time (between GEMM_REPEATS and
    100), so a decode GEMM of a few hundred microseconds is a median of many calls, not of three."""
    start = CLOCK()
    fn()
    one = max(CLOCK() - start, 1e-6)
    return max(GEMM_REPEATS, min(100, int(DECODE_SAMPLE_SECONDS / one)))


def held_outputs(torch, hold_bytes: int, chunk_bytes: int) -> collections.deque | None:
    """Where a training forward's outputs land: autograd keeps every op's output (and what its backward needs)
    until the backward, so a new output never reuses the block the allocator just freed, hot in the caches, but
    memory last used a whole step ago (freed by the previous backward), which the caches have long dropped: its
    write misses and allocates its lines from DRAM. A timed call appends its result here: a deque of `hold_bytes`
    (the step's reuse distance, capped at REUSE_LIMIT_BYTES) in blocks of `chunk_bytes`, filled with written blocks
    first, so each result takes the place of the block dropped `hold_bytes` earlier. Measured on this machine: a
    gpt2-small c_fc GEMM 1.8 ms with its output recycled hot, 2.1 ms held; the forward phase of the small models
    1.17-1.29x the prediction timed hot, 1.03-1.13x held. With `hold_bytes` 0, None: nothing is held (inference
    frees each output as soon as the next op has read it)."""
    if hold_bytes <= 0:
        return None
    blocks = max(1, hold_bytes // max(1, chunk_bytes))
    size = max(1, min(chunk_bytes, hold_bytes) // 4)
    return collections.deque((torch.empty(size).fill_(0.0) for _ in range(blocks)), maxlen=blocks)


def _gemm_call(torch, op, dtype, conv1d: bool = False, reuse_bytes: int | None = None, hold_bytes: int = 0):
    """A callable running one GEMM in the layout its call uses (y = x·Wᵀ, dX = dY·W, dW = dYᵀ·x, bmm),
    rotating over enough operand copies that they do not stay in the caches between calls. With `reuse_bytes`
    (decode) the copies span the step's own reuse distance, so a weight comes from where the real step finds it
    (DRAM once the model's weights pass the last-level cache, a cache when the whole step fits in it)."""
    m, n, k, batch = op.m, op.n, op.k, op.batch
    per_call = 4 * batch * (m * k + k * n)
    if reuse_bytes is None:
        copies = max(1, min(16, ROTATE_BYTES // max(1, per_call)))
    else:
        copies = rotation_copies(reuse_bytes, per_call)
    if batch > 1:
        pairs = [(torch.randn(batch, m, k, dtype=dtype), torch.randn(batch, k, n, dtype=dtype)) for _ in range(copies)]
        run = lambda a, b: torch.bmm(a, b)  # noqa: E731
    elif op.name.endswith(" dX") and conv1d:  # GPT-2's Conv1D keeps W as (in, out): dX = dY · Wᵀ
        pairs = [(torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)) for _ in range(copies)]
        run = lambda a, b: torch.mm(a, b.t())  # noqa: E731
    elif op.name.endswith(" dX"):
        pairs = [(torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)) for _ in range(copies)]
        run = lambda a, b: torch.mm(a, b)  # noqa: E731
    elif op.name.endswith(" dW"):
        pairs = [(torch.randn(k, m, dtype=dtype), torch.randn(k, n, dtype=dtype)) for _ in range(copies)]
        run = lambda a, b: torch.mm(a.t(), b)  # noqa: E731
    elif conv1d:  # transformers' Conv1D: addmm(bias, x, W) with W stored (in, out)
        pairs = [(torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)) for _ in range(copies)]
        bias = torch.randn(n, dtype=dtype)
        run = lambda a, b: torch.addmm(bias, a, b)  # noqa: E731
    else:
        pairs = [(torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)) for _ in range(copies)]
        run = torch.nn.functional.linear
    state = {"i": 0}
    held = held_outputs(torch, hold_bytes, 4 * batch * m * n)

    def call():
        a, b = pairs[state["i"] % copies]
        state["i"] += 1
        result = run(a, b)
        if held is not None:
            held.append(result)

    return call


def kv_append_call(torch, batch: int, kv_heads: int, context: int, head_dim: int, reuse_bytes: int | None):
    """(callable, copies): one decode layer's KV cache append as transformers' DynamicCache does it
    (cache_utils.DynamicLayer.update: keys and values each torch.cat with the new token), the old caches and the new
    ones rotating over copies. Both ends are cold in a decode step: the old cache was written a whole step ago, and
    the new one lands in memory last touched a step ago, so the write allocates its lines from DRAM too (write-allocate:
    the copy moves 3 arrays, not STREAM's 2). Measured on this machine (gpt2 layout, 4 x 12 x 256 x 64 fp32): a cat
    into a fresh allocation the allocator hands back hot ran ~420 us, into a destination rotated over 190 MB ~630 us,
    the same cat inside the real decode step ~600-700 us. With `reuse_bytes` the copies span the step's reuse distance
    (rotation_copies: a model whose step fits in the caches finds both ends there), else ROTATE_BYTES."""
    one_cache = 4 * batch * kv_heads * context * head_dim
    per_call = 2 * (2 * one_cache)  # keys and values, each read and written
    span = ROTATE_BYTES if reuse_bytes is None else reuse_bytes
    copies = rotation_copies(span, per_call, minimum=2)
    sources = [(torch.randn(batch, kv_heads, context, head_dim), torch.randn(batch, kv_heads, context, head_dim))
               for _ in range(copies)]
    # Written once now, so the timed calls pay no first-touch page faults the step does not pay either.
    targets = [(torch.randn(batch, kv_heads, context + 1, head_dim), torch.randn(batch, kv_heads, context + 1, head_dim))
               for _ in range(copies)]
    one = torch.randn(batch, kv_heads, 1, head_dim)
    turn = {"i": 0}

    def append():
        i = turn["i"] = turn["i"] + 1
        (keys, values), (new_keys, new_values) = sources[i % copies], targets[i % copies]
        return (torch.cat([keys, one], dim=-2, out=new_keys), torch.cat([values, one], dim=-2, out=new_values))

    return append, copies


def drop_gradients(leaves) -> None:
    """Forget the probe inputs' gradients before a timed backward. A probe's inputs are leaves, and autograd adds
    each new gradient into a leaf's existing .grad (AccumulateGrad: an extra read, read and write of the input's
    size), while in the step the same inputs are activations whose gradient flows on to the op before, added to
    nothing. With .grad None the leaf keeps the new gradient as it is, no kernel. Measured on this machine (llama
    scaled small): the cross-entropy backward probe 4.7-5.4 ms with the add, 3.7-4.3 ms without, the embedding's
    1.3 ms and 0.5 ms; the backward phase measured / predicted 0.89 before, 0.98 after."""
    for leaf in leaves:
        leaf.grad = None


def _named_rates(torch, ops, arch, request, reuse_bytes: int | None = None,
                 hold_bytes: int = 0) -> list[tuple[str, float]]:
    """Measured bytes/s of each memory-bound operation of the step, forward and backward, by running the
    torch ops transformers issues for it at its own size (launches included). `reuse_bytes` (decode): the step's
    reuse distance, which the KV cache append's operands rotate over (kv_append_call)."""
    F = torch.nn.functional
    T, h = request.batch * request.queries, arch.hidden_size
    rates: list[tuple[str, float]] = []
    forward = {op.name: op for op in ops if op.kind != GEMM and op.phase == "forward"}
    backward = {op.name: op for op in ops if op.kind != GEMM and op.phase == "backward"}

    def rms(x, w):
        var = x.pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(var + 1e-6))

    activation_op_name = activation_accesses(arch)[3]

    def make(name):
        """(function, inputs needing grad) for one op name; None for names measured otherwise."""
        a = arch.num_heads
        g = max(1, arch.num_kv_heads)
        d = arch.head_dim
        f = arch.intermediate_size
        V = arch.vocab_size
        if name.endswith("norm") and name != "q/k norm":
            x, w = torch.randn(T, h, requires_grad=True), torch.randn(h, requires_grad=True)
            if arch.norm == "rmsnorm":
                return (lambda: rms(x, w)), (x, w)
            bias = torch.randn(h, requires_grad=True)
            return (lambda: F.layer_norm(x, (h,), w, bias)), (x, w, bias)
        if name == "q/k norm":
            x, w = torch.randn(T * (a + g), d, requires_grad=True), torch.randn(d, requires_grad=True)
            return (lambda: rms(x, w)), (x, w)
        if name == "rope":
            q = torch.randn(request.batch, a + g, request.queries, d, requires_grad=True)
            cos, sin = torch.randn(request.batch, 1, request.queries, d), torch.randn(request.batch, 1, request.queries, d)

            def rope():
                x1, x2 = q[..., : d // 2], q[..., d // 2:]
                return q * cos + torch.cat((-x2, x1), dim=-1) * sin

            return rope, (q,)
        if name == "heads to rows (contiguous)":
            x = torch.randn(request.batch, a, request.queries, d, requires_grad=True)
            return (lambda: x.transpose(1, 2).contiguous()), (x,)
        if name == "residual add":
            x, y = torch.randn(T, h, requires_grad=True), torch.randn(T, h, requires_grad=True)
            return (lambda: x + y), (x, y)
        if name == activation_op_name:  # the family's own activation module (transformers ACT2FN), gated or not
            from transformers.activations import ACT2FN

            act = ACT2FN[activation_name(arch)] if activation_name(arch) in ACT2FN else F.silu
            x, y = torch.randn(T, f, requires_grad=True), torch.randn(T, f, requires_grad=True)
            if arch.gated_mlp:
                return (lambda: act(x) * y), (x, y)
            return (lambda: act(x)), (x,)
        if name.endswith("soft-capping"):
            cap = arch.attn_logit_softcapping if name.startswith("score") else arch.final_logit_softcapping
            x = torch.randn(forward[name].bytes // (6 * 4), requires_grad=True)
            return (lambda: torch.tanh(x / cap) * cap), (x,)
        if name.startswith("cross-entropy"):
            x = torch.randn(T, V, requires_grad=True)
            labels = torch.randint(0, V, (T,))
            return (lambda: F.cross_entropy(x, labels)), (x,)
        if name == "embedding lookup":
            table = torch.randn(V, h, requires_grad=True)
            ids = torch.randint(0, V, (T,))
            return (lambda: F.embedding(ids, table)), (table,)
        if name == "position embedding + add":
            table, x = torch.randn(T, h, requires_grad=True), torch.randn(T, h, requires_grad=True)
            return (lambda: x + table), (x, table)
        if name.endswith(LORA_SCALE_ADD):
            width = forward[name].bytes // (5 * 4 * T)
            x, y = torch.randn(T, width, requires_grad=True), torch.randn(T, width, requires_grad=True)
            return (lambda: x + y * 0.5), (x, y)
        if name == "KV cache append (torch.cat)":
            call, copies = kv_append_call(torch, request.batch, g, request.context, d, reuse_bytes)
            return call, (), max(5, copies)
        return None

    for name, op in forward.items():
        made = make(name)
        if made is None:
            continue
        fn, leaves, *timed = made
        with torch.no_grad():
            fn()
            seconds = _median_seconds(fn, timed[0] if timed else 5)
        in_step = seconds
        if hold_bytes and leaves:  # a training forward: autograd keeps the outputs (held_outputs)
            held = held_outputs(torch, hold_bytes, op.bytes)
            assert held is not None
            in_step = _median_seconds(lambda: held.append(fn()), 5)
            held.clear()
        rates.append((f"forward:{name}", op.bytes / in_step))
        if name in backward and leaves:
            out = fn()
            grad = torch.randn_like(out[0] if isinstance(out, tuple) else out)
            rates.append((f"backward:{name}", backward[name].bytes / backward_seconds(fn, leaves, grad, 5)))
    return rates


def backward_seconds(forward, leaves, grad, repeats: int) -> float:
    """Median time of the backward alone: each repeat runs `forward` untimed, then times `.backward(grad)` on its
    result (the first output of a tuple), with the leaves' gradients dropped first (drop_gradients). The backward
    used to be timed as forward+backward minus a separate forward: a difference of two timings, in which the two
    forwards need not cost the same (a grad-mode forward allocates what it saves; one under no_grad does not).
    Measured on this machine, a LoRA scale-and-add at 512 x 1024: forward+backward 1.8 ms minus the no_grad forward
    0.8 ms gave 1.0 ms; the backward alone runs 0.6 ms."""
    times = []
    for _ in range(repeats + 1):
        drop_gradients(leaves)
        result = forward()
        result = result[0] if isinstance(result, tuple) else result
        start = CLOCK()
        result.backward(grad)
        times.append(CLOCK() - start)
    return max(statistics.median(times[1:]), CLOCK_RESOLUTION)


def evict_caches(buffer) -> None:
    """Stream `buffer` through the caches (read and write every element), so that what a timed call touches next
    comes from where the step finds it after that many other bytes (Hennessy & Patterson, 6th ed., §B.1: LRU)."""
    buffer.add_(1.0)


def optimizer_rate(torch, op, arch, request: FitRequest | None, shapes, reuse_bytes: int) -> tuple[str, float]:
    """Measured bytes/s of torch.optim.AdamW's step (and zero_grad, which the step's optimizer phase includes) on
    parameters of the trained tensors' own shapes, found where the real step finds them.

    On a CPU torch runs AdamW one tensor at a time (torch/optim/optimizer.py _default_to_fused_or_foreach: foreach
    and fused kernels are for accelerators), about nine kernels per tensor, so the step's cost depends on how its
    parameters are split into tensors: a per-tensor fixed cost (~20 us for a tensor of 8 elements here),
    and each tensor's arrays reused from the caches across its kernels only while they fit. Between two steps the
    whole forward and backward pass through the caches (the step's reuse distance, `reuse_bytes`), so the weights
    and both moments come from DRAM, while the gradients were written by the backward just before. Measured on this
    machine (llama/gpt2/qwen3 scaled, 2.6-35M params): the old probe (the five largest matrices, repeated hot)
    predicted 1.07-1.89x too fast; on the model's own shapes, repeated hot, 0.96-1.33x; with the state evicted and
    the gradients rewritten before each call, 0.94-1.05x."""
    params = [torch.nn.Parameter(torch.randn(*shape)) for shape in shapes]
    grads = [torch.randn_like(p) for p in params]
    for p, g in zip(params, grads):
        p.grad = g
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    optimizer.step()  # the moments exist from the first step on, as in every step after the warm-up
    flush = torch.empty(min(reuse_bytes, REUSE_LIMIT_BYTES) // 4).fill_(0.0)
    times = []
    for _ in range(OPTIMIZER_REPEATS):
        for p, g in zip(params, grads):
            p.grad = g
        evict_caches(flush)
        for g in reversed(grads):  # the backward writes the last layer's gradients first
            g.normal_()
        start = CLOCK()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(CLOCK() - start)
    seconds = statistics.median(times)
    count = sum(p.numel() for p in params)
    adapter = request if request is not None and request.adapter else None
    # one device, no ZeRO: every parameter (LoRA: every adapter parameter)
    bytes_per_param = op.bytes / (adapter_params_on_device(arch, adapter) if adapter is not None
                                  else count_parameters(arch).total)
    return f"optimizer:{op.name}", bytes_per_param * count / seconds


OPTIMIZER_REPEATS = 5


FRAMEWORK_SHAPE = dict(hidden=64, heads=2, seq=8, vocab=64)


def build_as_run(torch, config: dict, dtype, device: str = "cpu"):
    """(model, its transformers config): `config`'s causal LM as transformers builds it from the config (random
    weights), in `dtype`, initialised on `device` (billions of parameters take minutes on the host), with the
    attention transformers runs the family with: SDPA where its class has it, else eager (Gemma 2 in transformers
    5; tutor.trace.memory_trace.attention_to_run). The attention is `hf._attn_implementation`."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tutor.trace.memory_trace import attention_to_run

    attention, _ = attention_to_run(config, "sdpa")
    hf = AutoConfig.for_model(**{k: v for k, v in config.items() if k != "architectures"})
    hf._attn_implementation = attention
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf, dtype=dtype)
    return model.to(dtype), hf


def tiny_model(torch, config: dict, layers: int, device: str = "cpu", lora: FitRequest | None = None):
    """The family of `config` at near-zero work (FRAMEWORK_SHAPE, `layers` decoder layers), fp32, on `device`, with
    the attention transformers runs it with (build_as_run)."""
    model, _ = build_as_run(torch, sized_config(config, layers=layers, **FRAMEWORK_SHAPE), torch.float32, device)
    if lora is not None:
        add_lora_adapters(torch, model, replace(lora, lora_rank=min(lora.lora_rank, FRAMEWORK_SHAPE["hidden"])))
    return model


def host_clock(torch, device: str):
    """A clock for the host's code: this thread's CPU time on a CPU (the work, not the other programs' turns); on
    CUDA the wall clock after the queue drains (at near-zero work the device waits for the host, so the time is
    the host's)."""
    if not device.startswith("cuda"):
        return CLOCK

    def wall() -> float:
        torch.cuda.synchronize(device)
        return time.perf_counter()

    return wall


def _median_on(clock, fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def framework_seconds(torch, config: dict, mode: str, lora: FitRequest | None = None, *, device: str = "cpu",
                      batch: int = 1) -> list[tuple[str, float]]:
    """Seconds per call of the model's own code at near-zero work, per decoder layer and for the rest of the
    model: the same family built with 1 and with 2 (decode: 3) layers of width 64 on 8 tokens, timed in `mode`
    (train: forward and backward; prefill; decode: one token for each of `batch` sequences on a cache of 8)
    on `device`; the layer is the difference."""
    times = {}
    clock = host_clock(torch, device)
    # A decode step (and a prefill of 8 tokens) is a few milliseconds, most of it this code: measured over 1 and 3
    # layers and more calls, so the per-layer figure (a difference of two timings) is not mostly noise; measured at 1
    # and 2 layers, a prefill's layer came out at 0 on a loaded machine.
    depths = (1, 2) if mode == "train" else (1, 3)
    calls = {"decode": 40, "prefill": 25}.get(mode, 15)
    for layers in depths:
        model = tiny_model(torch, config, layers, device, lora)
        ids = torch.randint(0, FRAMEWORK_SHAPE["vocab"], (batch, FRAMEWORK_SHAPE["seq"]), device=device)
        if mode == "train":
            model.train()
            forward, backward = [], []
            for index in range(12):
                t0 = clock()
                loss = model(input_ids=ids, labels=ids).loss
                t1 = clock()
                loss.backward()
                t2 = clock()
                if index >= 2:
                    forward.append(t1 - t0)
                    backward.append(t2 - t1)
            times[layers] = {"forward": statistics.median(forward), "backward": statistics.median(backward)}
            continue
        model.eval()
        with torch.no_grad():
            if mode == "prefill":
                call = lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1)  # noqa: E731
                call()
                times[layers] = {"forward": _median_on(clock, call, calls)}
            else:
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                state = {"cache": out.past_key_values, "token": ids[:, -1:]}

                def step():
                    result = model(input_ids=state["token"], past_key_values=state["cache"], use_cache=True)
                    state["cache"] = result.past_key_values

                step()
                times[layers] = {"forward": _median_on(clock, step, calls)}
    out = []
    low, high = depths
    for phase in times[low]:
        layer = max(0.0, (times[high][phase] - times[low][phase]) / (high - low))
        out += [(f"{phase}:{LAYER_CODE}", layer), (f"{phase}:{MODEL_CODE}", max(0.0, times[1][phase] - layer))]
    return out


def measure_ceilings(ops, arch, request, *, queries: int, context: int, training: bool,
                     config: dict | None = None, mode: str = "train", parameter_shapes=()) -> Ceilings:
    """This machine's ceilings at the step's own shapes, measured now (see the module docstring).
    `parameter_shapes`: the shapes of the tensors the optimizer steps (needed when `ops` hold an optimizer step)."""
    import torch

    dtype = torch.float32
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    points: dict[tuple, GemmPoint] = {}
    reuse = reuse_distance_bytes(ops)
    for op in ops:
        if op.kind != GEMM or op.name.startswith("attention") or (op.batch, op.m, op.n, op.k) in points:
            continue
        conv1d = arch.model_type == "gpt2" and op.name in ("c_attn", "attn.c_proj", "c_fc", "mlp.c_proj",
                                                           "c_attn dX", "attn.c_proj dX", "c_fc dX", "mlp.c_proj dX")
        fn = _gemm_call(torch, op, dtype, conv1d, reuse_bytes=reuse if mode == "decode" else None,
                        hold_bytes=min(reuse, REUSE_LIMIT_BYTES) if mode == "train" else 0)
        fn()
        seconds = _median_seconds(fn, _repeats(fn) if mode == "decode" else GEMM_REPEATS)
        points[(op.batch, op.m, op.n, op.k)] = GemmPoint(op.m, op.n, op.k, op.flops / seconds, op.batch)
    attention = [op for op in ops if op.name.startswith("attention")]
    heads, kv = arch.num_heads, max(1, arch.num_kv_heads)
    if attention:
        q = torch.randn(request.batch, heads, queries, arch.head_dim, requires_grad=training)
        # Decode reads the whole KV cache for one query per head: its keys and values rotate over the step's reuse
        # distance like the GEMMs' weights (rotation_copies). Measured here: SDPA inside the real decode step, on the
        # keys and values the cache append had just written, ran at the rate of copies rotated over 50 MB or more,
        # 2-2.5x slower than on one pair kept in the caches.
        kv_bytes = 2 * 4 * request.batch * kv * context * arch.head_dim
        pairs = [(torch.randn(request.batch, kv, context, arch.head_dim, requires_grad=training),
                  torch.randn(request.batch, kv, context, arch.head_dim, requires_grad=training))
                 for _ in range(rotation_copies(reuse, kv_bytes) if mode == "decode" else 1)]
        turn = {"i": 0}

        def forward():
            turn["i"] += 1
            keys, values = pairs[turn["i"] % len(pairs)]
            return torch.nn.functional.scaled_dot_product_attention(q, keys, values, is_causal=queries > 1,
                                                                    enable_gqa=heads != kv)

        with torch.no_grad():
            forward()
            fwd = _median_seconds(forward, max(_repeats(forward), len(pairs)) if mode == "decode" else GEMM_REPEATS)
        flops_fwd = sum(op.flops for op in attention if op.phase == "forward")
        for op in attention:
            if op.phase == "forward":
                points[(op.batch, op.m, op.n, op.k)] = GemmPoint(op.m, op.n, op.k, flops_fwd / fwd, op.batch)
        if training:
            grad = torch.randn(request.batch, heads, queries, arch.head_dim)

            bwd = backward_seconds(forward, [q, *(t for pair in pairs for t in pair)], grad, GEMM_REPEATS)
            flops_bwd = sum(op.flops for op in attention if op.phase == "backward")
            for op in attention:
                if op.phase == "backward":  # same shapes as the forward: kept under a negative batch key
                    points[(-op.batch, op.m, op.n, op.k)] = GemmPoint(op.m, op.n, op.k, flops_bwd / bwd, -op.batch)
    named = _named_rates(torch, ops, arch, _Shape(request.batch, queries, context),
                         reuse_bytes=reuse if mode == "decode" else None,
                         hold_bytes=min(reuse, REUSE_LIMIT_BYTES) if mode == "train" else 0)
    for op in ops:
        if op.phase == "optimizer":
            if not parameter_shapes:
                raise ValueError("an optimizer step is timed on the trained tensors' shapes: pass parameter_shapes")
            named.append(optimizer_rate(torch, op, arch, request if isinstance(request, FitRequest) else None,
                                         parameter_shapes, reuse))
    big = torch.randn(ROTATE_BYTES // 4)
    out = torch.empty_like(big)
    stream = 8 * big.numel() / _median_seconds(lambda: torch.add(big, 1.0, out=out), 5)
    tiny = torch.randn(1)
    overhead = _median_seconds(lambda: torch.add(tiny, tiny), 200)
    lora = request if isinstance(request, FitRequest) and request.adapter and mode == "train" else None
    framework = framework_seconds(torch, config, mode, lora) if config is not None else []
    return Ceilings(
        device="cpu", dtype="fp32", gemm_points=tuple(points.values()),
        gemm_source=f"measured now ({stamp}): torch fp32 GEMMs at the step's {len(points)} shapes (operands rotated "
                    "past the caches) and SDPA at its shape, median of 5, one thread's CPU time",
        bandwidth_points=(BandwidthPoint(ROTATE_BYTES * 2, stream),),
        bandwidth_source=f"measured now ({stamp}): {len(named)} memory-bound ops of the step run at their own sizes; "
                         f"torch.add of {ROTATE_BYTES >> 20} MiB arrays ({stream / 1e9:.3g} GB/s) for the rest",
        kernel_overhead=Sourced(overhead, "s", f"measured now ({stamp}): one tiny torch op, median of 200"),
        devices_per_node=1, named_bandwidth=tuple(named), named_seconds=tuple(framework),
        framework_source=(f"measured now ({stamp}): the same model family with 1 and 2 layers of width 64 on 8 tokens "
                          f"({mode}), per layer the difference" if framework else "not measured"),
    )


@dataclass(frozen=True)
class _Shape:
    batch: int
    queries: int
    context: int


def _with_backward_attention(ops):
    """The backward attention GEMMs keyed by the negative batch their measured rate is stored under."""
    return [replace(op, batch=-op.batch) if op.phase == "backward" and op.name.startswith("attention") else op
            for op in ops]


def _seconds(ceilings: Ceilings, ops) -> dict[str, float]:
    phases: dict[str, float] = {}
    for op in ops:
        phases[op.phase] = phases.get(op.phase, 0.0) + operation_seconds(ceilings, op)
    return phases


def scaled_architecture(config: dict, name: str):
    """The Architecture of a scaled config: its hand profile, or for a model type without one the real class counted
    on the meta device (tutor.trace.arch_calibration.measured_architecture), as `time` answers for it."""
    from tutor.theory.models import SUPPORTED_MODEL_TYPES

    if config.get("model_type") in SUPPORTED_MODEL_TYPES:
        return architecture_from_config(config, name=name)
    from tutor.trace.arch_calibration import measured_architecture

    return measured_architecture(config, name)


@dataclass(frozen=True)
class VerifySetup:
    config: dict
    arch: Any
    request: FitRequest
    size: str


VERIFY_RECIPES = ("fp32", "lora")


def verify_setup(config: dict, size: str = "medium", recipe: str = "fp32") -> VerifySetup:
    """The scaled model and the request its steps run: full fp32 training, or LoRA (r=16 on all linears, as
    `fit --recipe lora` counts it) on a frozen fp32 base."""
    if recipe not in VERIFY_RECIPES:
        raise UserError(f"--verify runs {', '.join(VERIFY_RECIPES)} steps on this machine; {recipe!r} needs "
                        "what it cannot run here (qlora: bitsandbytes' 4-bit kernels on a GPU)")
    scaled = scaled_config(config, size)
    arch = scaled_architecture(scaled, f"{config.get('model_type')} scaled ({size})")
    _layers, _hidden, _heads, seq, batch, _vocab = SIZES[size]
    request = FitRequest(mode="train", recipe=recipe, dtype="fp32", optimizer="adamw", batch=batch, seq_len=seq,
                         attention="sdpa", gpu=False)
    return VerifySetup(scaled, arch, request, size)


def run_verification(config: dict, size: str = "medium", *, decode: bool = True, recipe: str = "fp32") -> dict:
    """Predict, then measure, one scaled-down model's training step, prefill and decode (module docstring)."""
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _run(torch, config, size, decode, recipe)
    finally:
        torch.set_num_threads(threads)


def _median_phases(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {name: statistics.median(r.get(name, 0.0) for r in rounds) for name in rounds[0]}


def _run(torch, config: dict, size: str, decode: bool, recipe: str) -> dict:
    setup = verify_setup(config, size, recipe)
    arch, request = setup.arch, setup.request
    torch.manual_seed(0)
    model, hf_config = build_as_run(torch, setup.config, torch.float32)
    # SDPA where the family has it, else eager (Gemma 2 in transformers 5): predicted as it runs, and said.
    request = replace(request, attention=hf_config._attn_implementation)
    attention_note = "" if request.attention == "sdpa" else (
        f"{type(model).__name__} has no SDPA path in transformers: predicted and run with {request.attention} "
        "attention, which transformers uses for it")
    params = sum(p.numel() for p in model.parameters())
    trained = add_lora_adapters(torch, model, request) if request.adapter else list(model.parameters())
    model.train()
    ops = training_operations(arch, request, params_on_device=count_parameters(arch).total).operations
    optimizer = torch.optim.AdamW(trained, lr=1e-4)
    shapes = tuple(tuple(p.shape) for p in trained)
    ids = torch.randint(0, arch.vocab_size, (request.batch, request.seq_len))
    phases: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}
    walls: list[float] = []
    predictions: list[dict[str, float]] = []
    ceilings: Ceilings | None = None
    for round_index in range(ROUNDS):
        # Ceilings and steps alternate, so a change in the machine's load reaches both alike.
        ceilings = measure_ceilings(ops, arch, request, queries=request.seq_len, context=request.seq_len,
                                    training=True, config=setup.config, mode="train", parameter_shapes=shapes)
        predictions.append(_seconds(ceilings, _with_backward_attention(ops)))
        warmup = WARMUP_STEPS if round_index == 0 else 0
        for index in range(warmup + STEPS_PER_ROUND):
            wall = time.perf_counter()
            forward, backward, step = timed_training_step(model, ids, optimizer)
            if index >= warmup:
                phases["forward"].append(forward)
                phases["backward"].append(backward)
                phases["optimizer"].append(step)
                walls.append(time.perf_counter() - wall)
    predicted = _median_phases(predictions)
    measured = {name: statistics.median(values) for name, values in phases.items()}
    steps = [sum(values) for values in zip(*phases.values())]
    timed = ROUNDS * STEPS_PER_ROUND
    result = {
        "model": arch.name, "size": size,
        "recipe": request.recipe,
        "scaled": f"{arch.num_layers} layers, hidden {arch.hidden_size}, {arch.num_heads} heads, vocab "
                  f"{arch.vocab_size:,}, batch {request.batch} x {request.seq_len} tokens, fp32, {params:,} params"
                  + (f", LoRA r={request.lora_rank} on all linears: {sum(p.numel() for p in trained):,} trained"
                     if request.adapter else ""),
        "predicted_s": statistics.median(sum(r.values()) for r in predictions), "measured_s": statistics.median(steps),
        "measured_wall_s": statistics.median(walls),
        "phases": {name: {"predicted_s": predicted.get(name, 0.0), "measured_s": measured[name]}
                   for name in ("forward", "backward", "optimizer")},
        "clock": "this thread's CPU time (torch on 1 thread); wall-clock beside it",
        "attention": request.attention,
        "sources": ceilings.sources() if ceilings is not None else {},
        "notes": [f"median of {timed} steps after {WARMUP_STEPS} warm-up, in {ROUNDS} rounds each after its own "
                  "measurement of the ceilings (the prediction is the median of the rounds'), on one clock: this "
                  "thread's CPU time with torch on one thread, since the machine is shared; measured_wall_s is the "
                  "wall-clock step"] + ([attention_note] if attention_note else []),
    }
    if decode and not request.adapter:  # the adapters change training, not the base's inference
        result.update(_verify_inference(torch, model, arch, request, setup.config))
    return result


def _verify_inference(torch, model, arch, request: FitRequest, config: dict) -> dict:
    infer = replace(request, mode="inference", dtype="fp32")
    prefill_ops = inference_operations(arch, infer, queries=infer.seq_len, context=infer.seq_len,
                                       logits_tokens=infer.batch)
    decode_ops = inference_operations(arch, infer, queries=1, context=infer.seq_len)
    model.eval()
    ids = torch.randint(0, arch.vocab_size, (infer.batch, infer.seq_len))
    prefills, decodes, predicted_prefill, predicted_decode = [], [], [], []
    with torch.no_grad():
        for round_index in range(ROUNDS):
            prefill_ceilings = measure_ceilings(prefill_ops, arch, infer, queries=infer.seq_len,
                                                context=infer.seq_len, training=False, config=config, mode="prefill")
            predicted_prefill.append(prefill_seconds(arch, infer, prefill_ceilings))
            warmup = WARMUP_STEPS if round_index == 0 else 0
            for index in range(warmup + STEPS_PER_ROUND):
                start = CLOCK()
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                if index >= warmup:
                    prefills.append(CLOCK() - start)
            # Decode is memory-bound, the figure most moved by other programs' memory traffic: its ceilings
            # are measured right before its own steps.
            decode_ceilings = measure_ceilings(decode_ops, arch, infer, queries=1, context=infer.seq_len,
                                               training=False, config=config, mode="decode")
            predicted_decode.append(decode_step(arch, infer, decode_ceilings, batch=infer.batch,
                                                context=infer.seq_len).seconds)
            cache = out.past_key_values
            token = out.logits[:, -1:].argmax(-1)
            for index in range(DECODE_STEPS):
                start = CLOCK()
                out = model(input_ids=token, past_key_values=cache, use_cache=True)
                if index >= 2:  # the first steps after a prefill pay the cache's first growth
                    decodes.append(CLOCK() - start)
                cache = out.past_key_values
                token = out.logits[:, -1:].argmax(-1)
    measured_prefill = statistics.median(prefills)
    measured_decode = statistics.median(decodes)
    decode_predicted = statistics.median(predicted_decode)
    return {
        "prefill": {"predicted_s": statistics.median(predicted_prefill), "measured_s": measured_prefill},
        "decode": {"predicted_s": decode_predicted, "measured_s": measured_decode,
                   "predicted_tokens_per_second": infer.batch / decode_predicted,
                   "measured_tokens_per_second": infer.batch / measured_decode, "batch": infer.batch,
                   "context": infer.seq_len,
                   # A decode step lasts a few milliseconds, about one scheduler time slice: on a shared machine
                   # most steps are preempted once and restart on cold caches, which the short kernels the
                   # ceilings time mostly escape. The fastest step is the one nobody interrupted (timeit's advice).
                   "measured_min_s": min(decodes), "measured_min_tokens_per_second": infer.batch / min(decodes)},
    }
