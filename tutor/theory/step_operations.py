"""The operations of one training step (or one inference pass), counted one by one: every GEMM by its
shape, every memory-bound op (norms, activations, residual adds, loss, optimizer) by its bytes.

What is counted follows the code people run, transformers' modelling code as written (one GEMM per
nn.Linear, fused only where the module is: GPT-2's c_attn, Phi-3's qkv_proj and gate_up_proj,
transformers 5's stacked experts), and torch's kernels under it:

- GEMM FLOPs: 2·m·n·k per GEMM (one multiply-add = 2 FLOPs; Kaplan et al. arXiv 2001.08361 §2.1).
  The backward of y = x·Wᵀ is two GEMMs of the same size, dX = dY·W and dW = dYᵀ·x, so it costs 2×
  the forward (Kaplan §2.1: "backward twice the forward"; Narayanan et al. arXiv 2104.04473 §5.1).
- Attention: QKᵀ and P·V as batched GEMMs over (batch × heads). SDPA's flash kernels (CUDA
  FlashAttention, torch's CPU flash kernel) skip the tiles above the diagonal when causal, so they do
  about half the work; FlashAttention's own benchmark counts forward 4·b·s²·a·d / 2 when causal and
  backward 2.5× forward, because the backward recomputes the scores (Dao-AILab/flash-attention
  benchmarks/benchmark_flash_attention.py). Eager attention multiplies the full s×s (the mask is
  added after) and its backward is 2×, plus the fp32 softmax as memory-bound work.
- Memory-bound ops: bytes = elements read + written × bytes per element, counted per kernel as the
  code issues them (RMSNorm's fp32 upcast, pow, mean, rsqrt, two multiplies; SwiGLU's silu and
  multiply; GPT-2's tanh GELU written out as eight kernels; RoPE's rotate_half, two multiplies and an
  add). An elementwise backward reads the output gradient and the saved inputs and writes the input
  gradients: counted as twice the forward traffic (a unary op reads 2 and writes 1 where its forward
  read 1 and wrote 1; the stated approximation for the others).
- LoRA / QLoRA (Hu et al. arXiv 2106.09685 §4.1; Dettmers et al. arXiv 2305.14314): every adapted
  linear adds x·Aᵀ (r x in) and ·Bᵀ (out x r) GEMMs and PEFT's `result + lora_B(lora_A(x)) * scaling`
  (a multiply and an add over the output: peft/tuners/lora/layer.py Linear.forward). The base is
  frozen: its linears' backward is dX only (no dW), the embedding has no backward, and the first
  layer's attention inputs need no gradient at all (nothing before them requires one). The adapters
  get both dX and dW; the optimizer steps only them. QLoRA dequantizes each 4-bit base weight to 16
  bits before every use, forward and again in the backward's dX (bitsandbytes autograd MatMul4Bit):
  memory-bound, the packed weight and its scales read, the 16-bit copy written.
- Optimizer: torch.optim.AdamW as torch runs it by default, one tensor at a time or foreach
  (torch/optim/adam.py `_single_tensor_adam` / `_multi_tensor_adam`): mul_ (weight decay), lerp_,
  mul_, addcmul_, sqrt, div_, add_, addcdiv_: 20 element reads and writes per parameter in the state
  dtype; fused=True does one pass, 7.

Everything here is per device (one tensor-parallel rank of the most loaded pipeline stage) and
pure standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from tutor.errors import UserError
from tutor.theory.checks import positive_int
from tutor.theory.fit import FitRequest
from tutor.theory.lora import lora_trainable_params
from tutor.theory.memory import weight_format
from tutor.theory.models import Architecture, count_parameters
from tutor.theory.parallel import layers_per_pipeline_stage

PHASES = ("forward", "backward", "optimizer")
GEMM, MEMORY = "gemm", "memory"
FP32 = 4
# AdamW element accesses per parameter (see the module docstring).
ADAMW_ACCESSES_UNFUSED = 20
ADAMW_ACCESSES_FUSED = 7
SGD_ACCESSES = 3  # param.add_(grad, alpha=-lr): read param, read grad, write param
MOMENTUM_ACCESSES = 6  # buf.mul_(m).add_(grad); param.add_(buf, alpha=-lr)
# FlashAttention's backward FLOPs over its forward (benchmark_flash_attention.py: 2.5x).
FLASH_BACKWARD_RATIO = 2.5
BACKWARD_MEMORY_RATIO = 2


@dataclass(frozen=True)
class Operation:
    """One kind of operation of a step: `calls` identical calls, each of `flops` FLOPs and `bytes`
    of memory traffic. A GEMM is (batch ×) m×n×k; a memory-bound op has m = n = k = 0."""

    name: str
    phase: str
    kind: str
    calls: int
    flops: int
    bytes: int
    m: int = 0
    n: int = 0
    k: int = 0
    batch: int = 1
    formula: str = ""
    kernels: int = 1  # kernel launches per call (a memory op written as several torch ops)
    # (function, elements per call) of the transcendental functions its kernels evaluate (ELEMENTWISE_FUNCTIONS):
    # timed at the function's measured rate where that is slower than its bytes (compute-bound on a CPU core).
    functions: tuple[tuple[str, int], ...] = ()
    # Bytes per call written into memory freshly mapped from the operating system (fresh_block): each page faulted
    # in and zeroed by the kernel on first touch, at the measured first-touch rate.
    fresh_bytes: int = 0
    # The attention kernel a GEMM of attention runs in, where it is not a plain matmul: SDPA_KERNEL (timed at the
    # fused kernel's measured rate) or SDPA_MATH (SDPA's unfused fallback: plain matmuls on the whole square).
    kernel: str = ""

    @property
    def total_flops(self) -> int:
        return self.calls * self.flops

    @property
    def total_bytes(self) -> int:
        return self.calls * self.bytes

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.m, self.n, self.k)


def gemm(name: str, phase: str, m: int, n: int, k: int, *, calls: int, element_bytes: int, batch: int = 1,
         fraction: float = 1.0, formula: str = "", weight_bytes: float | None = None) -> Operation:
    """A (batched) GEMM C[m,n] = A[m,k]·B[k,n]: 2·m·n·k FLOPs per matrix (× `fraction` for a kernel that
    skips masked tiles), and its minimum traffic b·(mk + kn + mn) per matrix (Williams et al., Roofline,
    CACM 2009); B (a weight) at `weight_bytes` per element where it is stored in another format than the
    activations (a quantized linear read packed by its kernel)."""
    for value, what in ((m, "m"), (n, "n"), (k, "k"), (batch, "batch"), (calls, "calls")):
        positive_int(value, f"GEMM {what}")
    flops = round(2 * m * n * k * batch * fraction)
    b_bytes = element_bytes if weight_bytes is None else weight_bytes
    traffic = math.ceil(batch * (element_bytes * (m * k + m * n) + b_bytes * k * n))
    output = batch * m * n * element_bytes  # a new tensor: on fresh pages from FRESH_MAPPING_BYTES up
    return Operation(name, phase, GEMM, calls, flops, traffic, m, n, k, batch,
                     formula or f"2·{m}·{n}·{k}" + (f" x {batch}" if batch > 1 else ""),
                     fresh_bytes=output if output >= FRESH_MAPPING_BYTES else 0)


SDPA_KERNEL = "sdpa"
SDPA_MATH = "sdpa math"
"""torch's SDPA on a CPU runs its fused flash kernel (aten _scaled_dot_product_flash_attention_for_cpu), except where
the query/key and value head widths differ (MLA: 192 against 128 in DeepSeek-V3), where it falls back to
_scaled_dot_product_attention_math: q·kᵀ over the whole square, the causal mask added, _safe_softmax, then ·v
(torch/nn/attention and aten/src/ATen/native/transformers/attention.cpp; checked with torch.profiler)."""


LAYER_CODE = "decoder layer code (Python, dispatch)"
MODEL_CODE = "model code (inputs, mask, rotary, outputs)"
FRAMEWORK = "framework"


def framework_op(name: str, phase: str, calls: int) -> Operation:
    """The cost of running a module's code itself (Python, dispatch, views; no FLOPs, no bytes): eager
    frameworks pay it per call whatever the sizes, which is why small models and decode steps are slower
    than their FLOPs and bytes say. Its time comes from a measured per-call figure (Ceilings.named_seconds),
    else it is not counted."""
    return Operation(name, phase, FRAMEWORK, calls, 0, 0, kernels=0, formula="per call, measured at near-zero work")


def memory_op(name: str, phase: str, elements: int, accesses: float, element_bytes: float, *, calls: int,
              kernels: int = 1, formula: str = "", function: str | None = None) -> Operation:
    """A memory-bound op over `elements` values, each read or written `accesses` times in total; `function`: the
    transcendental function (ELEMENTWISE_FUNCTIONS) its kernel evaluates once per element, if any."""
    traffic = math.ceil(elements * accesses * element_bytes)
    return Operation(name, phase, MEMORY, calls, 0, traffic, kernels=kernels,
                     formula=formula or f"{elements:,} x {accesses:g} accesses x {element_bytes:g} B",
                     functions=((function, elements),) if function else ())


ELEMENTWISE_FUNCTIONS = ("silu", "silu backward", "gelu", "gelu backward", "gelu tanh", "gelu tanh backward", "tanh",
                         "log_softmax", "log_softmax backward", "softmax")
"""The functions whose evaluation, not their bytes, can bound an elementwise kernel on a CPU core (exp, erf and tanh
are tens of instructions per element): torch's F.silu, F.gelu (erf), F.gelu(approximate="tanh"), torch.tanh,
F.log_softmax and F.softmax over rows, and the backward kernels autograd runs for them (aten silu_backward,
gelu_backward, _log_softmax_backward_data). Each one's elements per second is measured (tutor.bench.elementwise):
on one core of the dev machine tanh ran at 0.5 G elements/s and log_softmax at 2.5, where a unary op's bytes at the
STREAM triad's 38 GB/s would allow 4.75."""
BACKWARD_FUNCTIONS = {"silu": "silu backward", "gelu": "gelu backward", "gelu tanh": "gelu tanh backward",
                      "log_softmax": "log_softmax backward"}
"""The backward kernel of each function, where it evaluates a transcendental again (tanh's and softmax's backward
read their saved output: memory-bound, none)."""
ACTIVATION_FUNCTIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu tanh",
                        "gelu_new": "tanh"}
"""The function each transformers activation (ACT2FN) evaluates per element: SiLUActivation, GELUActivation (erf),
PytorchGELUTanh, NewGELUActivation (its one tanh among eight kernels)."""


FRESH_MAPPING_BYTES = 32 * 2**20
"""glibc malloc's DEFAULT_MMAP_THRESHOLD_MAX on a 64-bit system (malloc/malloc.c; mallopt(3), M_MMAP_THRESHOLD): a
block at least this large is always mapped fresh with mmap and unmapped when freed, so every allocation of it
faults its pages in again. torch's CPU allocator takes its blocks from malloc (c10 alloc_cpu: posix_memalign)."""


def fresh_block(nbytes: int, largest_other: int) -> bool:
    """Whether a block of `nbytes`, allocated and freed once per step, lands on freshly mapped pages every time
    (glibc malloc, mallopt(3)): at least FRESH_MAPPING_BYTES; or, below that, when it is larger than every other
    block of the step (`largest_other`): the dynamic mmap threshold rises to the largest block freed, the heap's
    top is returned to the system once twice that lies free there, and the largest block with its twin (AdamW's
    two temporaries) reaches it. Measured on this machine (ru_minflt of real steps): Qwen2-MoE scaled small, its
    22.5 MiB expert stack the largest block, 11,521 faults per AdamW step = its two temporaries; Mistral, its
    4 MiB matrices under an 8 MiB logits block, none; DeepSeek-V3, two 32 MiB stacks, 36,868 (4 x 8,192 counted)."""
    return nbytes >= FRESH_MAPPING_BYTES or nbytes > largest_other


def activation_bytes(request: FitRequest) -> int:
    """Bytes of one activation element: 4 for fp32 training or fp32 inference, else 2 (bf16/fp16; quantized
    weights compute in 16 bits). LoRA computes in its base's dtype (fp32 only for an fp32 base)."""
    if request.mode == "train" and not request.adapter:
        return FP32 if request.recipe == "fp32" else 2
    return FP32 if request.dtype in ("fp32", "tf32") else 2


# Low-bit formats whose transformers kernels read the packed weight and dequantize it in registers (GPTQ/AWQ
# through ExLlama/Marlin, FP8 and MXFP4/NVFP4 GEMMs, LLM.int8's int8 matmul); bitsandbytes NF4 does so only for one
# token (its gemv_4bit), and otherwise dequantizes the whole weight to 16 bits before a 16-bit matmul
# (bitsandbytes docs, "4-bit quantization": inference with batch size 1 uses the fast 4-bit GEMV kernel).
FUSED_LOW_BIT = ("int4", "gptq-int4-g128", "awq-int4-g128", "fp8", "fp8-block128", "int8", "mxfp4", "nvfp4")
BNB_4BIT = ("nf4", "nf4-dq")


def quantized_linears(request: FitRequest) -> str | None:
    """The low-bit format an inference request's block linears are stored in, where transformers keeps them so
    (None: 16 or 32 bits, training, or GGUF, which transformers dequantizes to 16 bits when it loads the file)."""
    if request.mode == "train" or request.dtype is None:
        return None
    name = str(request.dtype)
    return name if name in FUSED_LOW_BIT or name in BNB_4BIT else None


def causal_attention_fraction(kernel: str, causal: bool = True) -> float:
    """Share of the s×s score tiles a kernel computes: 1/2 for flash-style kernels on a causal mask
    (FlashAttention's benchmark divides by 2 when causal), 1 for eager (mask added after a full matmul)."""
    return 0.5 if causal and kernel in ("sdpa", "flash") else 1.0


def norm_accesses(arch: Architecture, e: int) -> tuple[float, int]:
    """(element accesses x bytes, kernels) per normalised element, as transformers writes the norm.

    RMSNorm (LlamaRMSNorm and its copies): x.to(fp32) [skipped when x is fp32], pow(2), mean(-1),
    x * rsqrt(var + eps), .to(dtype) [skipped in fp32], weight * x. LayerNorm (GPT-2, OLMo's
    non-parametric one): one fused native_layer_norm kernel reading x and writing y.
    Returned as bytes per element (the accesses already weighted by their dtypes)."""
    if arch.norm == "layernorm" or arch.norm == "nonparametric":
        return float(2 * e), 1
    up = 0 if e == FP32 else e + FP32
    return float(up + 2 * FP32 + FP32 + 2 * FP32 + up + 2 * e), 4 + (2 if up else 0)


# Elementwise passes of each activation as transformers runs it (transformers/activations.py ACT2FN), as
# (element accesses, kernels) per element of the MLP's inner width: one read and one write per pass. SiLU, GELU
# (erf or tanh through F.gelu) and ReLU are one torch kernel; ReLUSquaredActivation is relu, then square: two;
# GPT-2's NewGELUActivation writes 0.5*x*(1+tanh(√(2/π)(x+0.044715·x³))) as eight kernels: pow, mul, add, mul, tanh,
# add, mul, mul = 18 accesses (two of them read two arrays).
ACTIVATION_PASSES: dict[str, tuple[float, int]] = {
    "silu": (2, 1), "swish": (2, 1), "gelu": (2, 1), "gelu_pytorch_tanh": (2, 1), "gelu_python": (2, 1),
    "relu": (2, 1), "relu2": (4, 2), "gelu_new": (18, 8),
}
GATE_MULTIPLY = (3, 1)  # act(gate) * up: two reads, one write


def activation_name(arch: Architecture) -> str:
    """The MLP's activation (an ACT2FN key): the config's, else the family's own (SiLU gated, GPT-2's gelu_new)."""
    return arch.hidden_act or ("silu" if arch.gated_mlp else "gelu_new")


def activation_accesses(arch: Architecture) -> tuple[float, float, int, str]:
    """(accesses per element on the MLP's inner width f for act + gating, accesses on what, kernels, name).

    The activation's passes (ACTIVATION_PASSES; an activation not listed counts as one pass), and for a gated MLP
    the multiply by up: SwiGLU silu(gate) [r1 w1] then * up [r2 w1] = 5 accesses of f elements, 2 kernels."""
    act = activation_name(arch)
    accesses, kernels = ACTIVATION_PASSES.get(act, (2, 1))
    if arch.gated_mlp:
        return accesses + GATE_MULTIPLY[0], 0.0, kernels + GATE_MULTIPLY[1], f"{act}(gate) * up"
    return float(accesses), 0.0, kernels, f"{act} ({kernels} kernel{'s' if kernels > 1 else ''})"


def attention_projections(arch: Architecture, tp: int) -> list[tuple[str, int, int]]:
    """(name, output width, input width) of each attention GEMM on one tensor-parallel rank, before
    the score/context GEMMs (in) and after them (the output projection, last).

    Llama family: q, k, v, o (transformers LlamaAttention); GPT-2: fused c_attn (h -> 3h) and c_proj
    (GPT2Attention, Conv1D); Phi-3: fused qkv_proj; MLA (DeepSeek-V3): q_a, q_b (or q), kv_a, kv_b, o
    (DeepseekV3Attention). KV heads on a rank: max(1, kv_heads / tp)."""
    h = arch.hidden_size
    a = arch.num_heads // tp
    g = max(1, arch.num_kv_heads // tp)
    d = arch.head_dim
    if arch.uses_mla:
        qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        shapes = []
        if arch.q_lora_rank is None:
            shapes.append(("q_proj", a * qk, h))
        else:
            shapes += [("q_a_proj", arch.q_lora_rank, h), ("q_b_proj", a * qk, arch.q_lora_rank)]
        shapes += [("kv_a_proj", arch.kv_lora_rank + arch.qk_rope_head_dim, h),
                   ("kv_b_proj", a * (arch.qk_nope_head_dim + arch.v_head_dim), arch.kv_lora_rank),
                   ("o_proj", h, a * arch.v_head_dim)]
        return shapes
    if arch.model_type == "gpt2":
        return [("c_attn", 3 * a * d, h), ("attn.c_proj", h, a * d)]
    if arch.model_type == "phi3":
        return [("qkv_proj", (a + 2 * g) * d, h), ("o_proj", h, a * d)]
    return [("q_proj", a * d, h), ("k_proj", g * d, h), ("v_proj", g * d, h), ("o_proj", h, a * d)]


def mlp_projections(arch: Architecture, width: int, tp: int) -> list[tuple[str, int, int]]:
    """(name, out, in) of a dense MLP's GEMMs on one rank: gate, up, down (LlamaMLP); Phi-3's fused
    gate_up_proj; GPT-2's c_fc and c_proj."""
    h, f = arch.hidden_size, width // tp
    if not arch.gated_mlp:
        return [("c_fc", f, h), ("mlp.c_proj", h, f)]
    if arch.model_type == "phi3":
        return [("gate_up_proj", 2 * f, h), ("down_proj", h, f)]
    return [("gate_proj", f, h), ("up_proj", f, h), ("down_proj", h, f)]


@dataclass(frozen=True)
class PassShape:
    """What one forward pass multiplies: micro-batch, query tokens per sequence, keys attended to."""

    batch: int
    queries: int   # tokens computed per sequence (s in training and prefill, 1 in decode)
    context: int   # keys each query attends to at most (s in training, the cache length in decode)
    causal: bool = True

    @property
    def tokens(self) -> int:
        return self.batch * self.queries


def layer_forward(arch: Architecture, *, moe_layer: bool, shape: PassShape, tp: int, ep: int, e: int,
                  attention: str, calls: int, training: bool, cache_copy: bool = True) -> list[Operation]:
    """Forward operations of one decoder layer for one micro-batch, on one tensor-parallel rank.
    cache_copy: a decode step appends to the KV cache by copying it (transformers' DynamicCache, --impl hf);
    False for a paged or static cache that writes only the new token (vLLM, --impl fused)."""
    T, h = shape.tokens, arch.hidden_size
    a = arch.num_heads // tp
    g = max(1, arch.num_kv_heads // tp)
    d = arch.head_dim
    dv = arch.v_head_dim if arch.uses_mla else d
    ops: list[Operation] = [framework_op(LAYER_CODE, "forward", calls)]
    norm_bytes, norm_kernels = norm_accesses(arch, e)
    ops.append(memory_op("input norm", "forward", T * h, norm_bytes, 1, calls=calls, kernels=norm_kernels,
                         formula=f"{arch.norm} over {T:,} x {h:,}: {norm_bytes:g} B per element"))
    projections = attention_projections(arch, tp)
    # transformers' DeepseekV3Attention caches the compressed latent (kv_lora_rank + the shared RoPE key per
    # token) and expands it with kv_b_proj on every pass (expand_kv): a decode step re-projects the whole context.
    latent_cache = arch.uses_mla and shape.queries < shape.context and not training
    for name, out, inp in projections[:-1]:
        rows = shape.batch * shape.context if latent_cache and name == "kv_b_proj" else T
        ops.append(gemm(name, "forward", rows, out, inp, calls=calls, element_bytes=e))
    if arch.uses_mla:
        # DeepseekV3Attention normalises each latent before its up-projection: q_a_layernorm over q_lora_rank (where
        # the query is low-rank) and kv_a_layernorm over kv_lora_rank.
        latent = arch.kv_lora_rank + (arch.q_lora_rank or 0)
        ops.append(memory_op("latent norms (q_a, kv_a)", "forward", T * latent, norm_bytes, 1, calls=calls,
                             kernels=norm_kernels * (2 if arch.q_lora_rank else 1)))
    if latent_cache:
        keys = shape.batch * a * shape.context * (arch.qk_nope_head_dim + arch.qk_rope_head_dim)
        ops.append(memory_op("keys assembled (k_nope, shared k_rot)", "forward", keys, 2, e, calls=calls, kernels=2,
                             formula="expand_kv: new_empty, then k_nope and the broadcast k_rot copied in"))
    if arch.qk_norm:
        ops.append(memory_op("q/k norm", "forward", T * (a + g) * d, norm_bytes, 1, calls=calls,
                             kernels=2 * norm_kernels))
    if arch.model_type != "gpt2":
        rope_width = (a + (1 if arch.uses_mla else g)) * (arch.qk_rope_head_dim if arch.uses_mla else d)
        ops.append(memory_op("rope", "forward", T * rope_width, 10, e, calls=calls, kernels=10,
                             formula="q·cos + rotate_half(q)·sin for q and k: 10 accesses per element"))
    # SDPA on MLA's unequal head widths runs unfused (SDPA_MATH): the whole square, like eager, and its own softmax.
    math_path = attention == "sdpa" and dv != d and shape.queries > 1
    kernel = SDPA_MATH if math_path else SDPA_KERNEL if attention == "sdpa" and shape.queries > 1 else ""
    fraction = causal_attention_fraction("eager" if math_path else attention, shape.causal) \
        if shape.queries > 1 else 1.0
    heads = shape.batch * a
    if cache_copy and shape.queries < shape.context and not training:
        # transformers' DynamicCache appends the new keys and values with torch.cat: each decode step
        # reads the cached K and V and writes them again, one token longer (cache_utils.DynamicLayer.update).
        width = arch.kv_lora_rank + arch.qk_rope_head_dim if arch.uses_mla else g * (d + dv)  # MLA: the latent
        cached = shape.batch * shape.context * width
        ops.append(memory_op("KV cache append (torch.cat)", "forward", cached, 2, e, calls=calls, kernels=2))
    # Grouped-query kernels read each key/value head once for the a/g query heads that share it.
    kv_read = e * shape.batch * g * shape.context * d
    scores = gemm("attention scores q·kᵀ", "forward", shape.queries, shape.context, d, calls=calls,
                  element_bytes=e, batch=heads, fraction=fraction)
    ops.append(replace(scores, bytes=e * heads * (shape.queries * d + shape.queries * shape.context) + kv_read,
                       kernel=kernel))
    if math_path:
        # _scaled_dot_product_attention_math: the mask added in place (read 2, write 1), _safe_softmax (softmax, read
        # and write, and its all-masked-rows check: isneginf, all, where over the scores, read 4, write 2): 9 accesses.
        ops.append(memory_op("sdpa math: mask + softmax", "forward", heads * shape.queries * shape.context, 9, e,
                             calls=calls, kernels=5, function="softmax"))
    if attention == "eager" and g < a:
        # eager_attention_forward's repeat_kv: each key and value head copied out for the a/g query heads sharing it.
        copies = 2 * shape.batch * a * shape.context * d
        ops.append(memory_op("repeat_kv (keys, values)", "forward", copies, 1 + g / a, e, calls=calls, kernels=2,
                             formula=f"{copies:,} elements written, 1/{a // g} of them read"))
    if attention == "eager" and shape.queries > 1:
        score_elements = heads * shape.queries * shape.context
        # transformers eager_attention_forward: + mask, softmax in fp32, cast back.
        ops.append(memory_op("eager softmax", "forward", score_elements, 3 * e + 2 * FP32 + FP32 + e, 1, calls=calls,
                             kernels=3, function="softmax"))
    if attention == "eager" and arch.attn_logit_softcapping:
        ops.append(softcap_op("score soft-capping", heads * shape.queries * shape.context, e, calls))
    context = gemm("attention context p·v", "forward", shape.queries, dv, shape.context, calls=calls,
                   element_bytes=e, batch=heads, fraction=fraction)
    ops.append(replace(context, bytes=e * heads * (shape.queries * shape.context + shape.queries * dv)
                       + e * shape.batch * g * shape.context * dv, kernel=kernel))
    ops.append(memory_op("heads to rows (contiguous)", "forward", T * a * dv, 2, e, calls=calls))
    name, out, inp = projections[-1]
    ops.append(gemm(name, "forward", T, out, inp, calls=calls, element_bytes=e))
    ops.append(memory_op("residual add", "forward", T * h, 3, e, calls=calls))
    # Norms beyond the input norm, as the family has them (norms_per_layer): one before the MLP (Llama), none where
    # attention and MLP share the input norm (Falcon's parallel block), three more with Gemma-2's norms after
    # attention and MLP.
    if arch.norms_per_layer > 1:
        ops.append(memory_op("post-attention norm", "forward", T * h, norm_bytes, 1,
                             calls=calls * (arch.norms_per_layer - 1), kernels=norm_kernels))
    if moe_layer:
        ops += _moe_forward(arch, T, tp, ep, e, calls)
    else:
        for name, out, inp in mlp_projections(arch, arch.intermediate_size, tp)[:-1]:
            ops.append(gemm(name, "forward", T, out, inp, calls=calls, element_bytes=e))
        accesses, _, kernels, what = activation_accesses(arch)
        ops.append(memory_op(what, "forward", T * arch.intermediate_size // tp, accesses, e, calls=calls,
                             kernels=kernels, function=ACTIVATION_FUNCTIONS.get(activation_name(arch))))
        name, out, inp = mlp_projections(arch, arch.intermediate_size, tp)[-1]
        ops.append(gemm(name, "forward", T, out, inp, calls=calls, element_bytes=e))
    ops.append(memory_op("residual add", "forward", T * h, 3, e, calls=calls))
    if arch.dropout and training:
        ops.append(memory_op("dropout", "forward", 2 * T * h, 2 + 1 / e, e, calls=calls, kernels=2,
                             formula="two residual dropouts: read, write, and a 1-byte mask per element"))
    return ops


def softcap_op(name: str, elements: int, e: int, calls: int) -> Operation:
    """Gemma-2's soft-capping, `x = x / cap; x = tanh(x); x = x * cap` (Gemma2Attention's eager scores and
    Gemma2ForCausalLM's logits): three elementwise passes, a read and a write each."""
    return memory_op(name, "forward", elements, 6, e, calls=calls, kernels=3, function="tanh",
                     formula=f"{elements:,} x (divide, tanh, multiply): 6 accesses x {e} B")


def _moe_forward(arch: Architecture, T: int, tp: int, ep: int, e: int, calls: int) -> list[Operation]:
    """Router, routed experts (uniform routing: T·k rows spread over the rank's E/ep experts) and shared
    experts. transformers 5 stacks each expert's gate and up into one gate_up_proj (E, 2f, h) and a
    down_proj (E, h, f) (MixtralExperts, Qwen2MoeExperts)."""
    h = arch.hidden_size
    f = arch.moe_intermediate_size // tp
    k = arch.experts_per_token
    local = arch.num_experts // ep
    # Experts a step touches: with uniform top-k routing an expert is missed by one token with probability
    # 1 - k/E, so the T·ep tokens routed to this rank's group touch local·(1 - (1 - k/E)^(T·ep)) of its experts
    # in expectation: two at batch 1 in decode (top-2), nearly all in training.
    routed_rows = max(1, math.ceil(T * k / ep))  # (token, expert) rows this rank's experts multiply
    touched = min(local, routed_rows, max(1, round(local * (1 - (1 - k / arch.num_experts) ** (T * ep)))))
    # The rows spread evenly over the touched experts, `extra` of them one row more: exactly T·k rows in all.
    rows, extra = divmod(routed_rows, touched)
    ops = [gemm("router", "forward", T, arch.num_experts, h, calls=calls, element_bytes=e),
           memory_op("router softmax + top-k", "forward", T * arch.num_experts, 4, FP32, calls=calls, kernels=3,
                     function="softmax"),
           # transformers' grouped_mm experts (integrations/moe.py grouped_mm_experts_forward, the default where
           # torch has grouped_mm): the T·k (token, expert) rows gathered in expert order, each output row scaled by
           # its routing weight, put back in token order, then summed over the k experts of a token: three passes
           # reading and writing T·k·h, one reading it and writing T·h.
           memory_op("token dispatch (gather) + combine (scatter)", "forward", T * k * h, 7 + 1 / k, e, calls=calls,
                     kernels=4),
           ]
    width = (2 if arch.gated_mlp else 1) * f
    groups = [(count, m) for count, m in ((touched - extra, rows), (extra, rows + 1)) if count and m]
    ops += [gemm("experts gate_up", "forward", m, width, h, calls=calls * count, element_bytes=e) for count, m in groups]
    ops.append(memory_op("experts activation", "forward", routed_rows * f, activation_accesses(arch)[0], e,
                         calls=calls, kernels=activation_accesses(arch)[2],
                         function=ACTIVATION_FUNCTIONS.get(activation_name(arch))))
    ops += [gemm("experts down", "forward", m, h, f, calls=calls * count, element_bytes=e) for count, m in groups]
    if arch.shared_expert_intermediate_size:
        fs = arch.shared_expert_intermediate_size // tp
        ops += [gemm("shared expert gate", "forward", T, fs, h, calls=calls, element_bytes=e),
                gemm("shared expert up", "forward", T, fs, h, calls=calls, element_bytes=e),
                memory_op("shared expert activation", "forward", T * fs, 5, e, calls=calls, kernels=2,
                          function=ACTIVATION_FUNCTIONS.get(activation_name(arch))),
                gemm("shared expert down", "forward", T, h, fs, calls=calls, element_bytes=e)]
        # The shared expert's output added to the routed experts' (Qwen2MoeSparseMoeBlock, DeepseekV3MoE), after
        # Qwen2-MoE's sigmoid gate (an h -> 1 linear, its sigmoid, and the multiply over T·h).
        gate = 3 if arch.shared_expert_gate else 0
        if gate:
            ops.append(gemm("shared expert sigmoid gate", "forward", T, 1, h, calls=calls, element_bytes=e))
        ops.append(memory_op("shared expert gate + add", "forward", T * h, 3 + gate, e, calls=calls,
                             kernels=1 + (2 if gate else 0)))
    return ops


def model_ends_forward(arch: Architecture, *, shape: PassShape, tp: int, e: int, calls: int, first: bool,
                       last: bool, loss: bool, logits_tokens: int | None = None) -> list[Operation]:
    """The embedding lookup (first stage) and the final norm, LM head and loss (last stage).

    The head multiplies every token in training; in generation transformers keeps only the last
    position's logits (`logits_to_keep`), so `logits_tokens` = batch there. The loss is transformers'
    ForCausalLMLoss: logits.float(), then cross_entropy (log_softmax reads the logits twice and writes
    them once)."""
    T, h = shape.tokens, arch.hidden_size
    ops = [framework_op(MODEL_CODE, "forward", calls)]
    if first:
        ops.append(memory_op("embedding lookup", "forward", T * h, 2, e, calls=calls))
        if arch.learned_positions:
            ops.append(memory_op("position embedding + add", "forward", T * h, 4, e, calls=calls, kernels=2))
    if last:
        norm_bytes, norm_kernels = norm_accesses(arch, e)
        ops.append(memory_op("final norm", "forward", T * h, norm_bytes, 1, calls=calls, kernels=norm_kernels))
        rows = logits_tokens if logits_tokens is not None else T
        vocab = math.ceil(arch.vocab_size / tp)
        ops.append(gemm("lm_head", "forward", rows, vocab, h, calls=calls, element_bytes=e))
        if arch.final_logit_softcapping:
            ops.append(softcap_op("logit soft-capping", rows * vocab, e, calls))
        if loss:
            upcast = 0 if e == FP32 else e + FP32
            loss_op = memory_op("cross-entropy (fp32 logits)", "forward", rows * vocab, upcast + 3 * FP32, 1,
                                calls=calls, kernels=3, function="log_softmax")
            # log_softmax writes a new block of the logits' size (and its backward another): on fresh pages when it
            # is the step's largest block (fresh_block), as the logits of a small model are.
            largest_weight = max(n for _, n, _ in parameter_tensors(arch, tp)) * FP32
            log_probs = rows * vocab * FP32
            ops.append(replace(loss_op, fresh_bytes=log_probs if fresh_block(log_probs, largest_weight) else 0))
    return ops


def backward_of(ops: list[Operation], attention: str) -> list[Operation]:
    """The backward pass of forward operations: each linear GEMM becomes two of the same size
    (dX: m x k over n; dW: n x k over m), attention GEMMs 2x (eager) or 2.5x with the score
    recompute (flash kernels), memory-bound ops twice their forward traffic."""
    out: list[Operation] = []
    for op in ops:
        if op.phase != "forward":
            continue
        if op.kind == FRAMEWORK:
            out.append(replace(op, phase="backward"))
            continue
        if op.kind == MEMORY:
            functions = tuple((BACKWARD_FUNCTIONS[f], n) for f, n in op.functions if f in BACKWARD_FUNCTIONS)
            out.append(replace(op, phase="backward", bytes=op.bytes * BACKWARD_MEMORY_RATIO, functions=functions,
                               formula=f"2 x forward ({op.formula})"))
            continue
        if op.name.startswith("attention"):
            ratio = FLASH_BACKWARD_RATIO if attention in ("sdpa", "flash") and op.kernel != SDPA_MATH else 2
            out.append(replace(op, phase="backward", flops=round(op.flops * ratio), bytes=op.bytes * 2,
                               formula=f"{ratio:g} x forward ({op.formula})"))
            continue
        e = op.bytes // max(1, op.batch * (op.m * op.k + op.k * op.n + op.m * op.n))
        out.append(gemm(f"{op.name} dX", "backward", op.m, op.k, op.n, calls=op.calls, element_bytes=e,
                        batch=op.batch))
        out.append(gemm(f"{op.name} dW", "backward", op.n, op.k, op.m, calls=op.calls, element_bytes=e,
                        batch=op.batch))
    return out


def parameter_tensors(arch: Architecture, tp: int = 1, ep: int = 1) -> list[tuple[str, int, int]]:
    """(name, elements, count) of the model's weight tensors on one device as transformers holds them: the token
    table, the LM head where untied, and per decoder layer each attention and MLP projection (one tensor per
    nn.Linear, fused where the module is), the router and transformers 5's stacked experts (gate_up_proj (E, 2f, h)
    and down_proj (E, h, f): MixtralExperts, Qwen2MoeExperts) with the shared experts. Norms and biases are left
    out: they are small, and the blocks that matter here are the large ones (fresh_block)."""
    h = arch.hidden_size
    vocab = math.ceil(arch.vocab_size / tp)
    out = [("embed_tokens", vocab * h, 1)]
    if not arch.tie_word_embeddings:
        out.append(("lm_head", vocab * h, 1))
    moe = arch.moe_layers
    for name, o, i in attention_projections(arch, tp):
        out.append((name, o * i, arch.num_layers))
    if arch.num_layers - moe:
        out += [(name, o * i, arch.num_layers - moe) for name, o, i in mlp_projections(arch, arch.intermediate_size, tp)]
    if moe:
        f = arch.moe_intermediate_size // tp
        local = max(1, arch.num_experts // ep)
        out += [("router", arch.num_experts * h, moe),
                ("experts gate_up", local * (2 if arch.gated_mlp else 1) * f * h, moe),
                ("experts down", local * h * f, moe)]
        if arch.shared_expert_intermediate_size:
            out += [(f"shared expert {name}", o * i, moe)
                    for name, o, i in mlp_projections(arch, arch.shared_expert_intermediate_size, tp)]
    return out


GRADIENTS_NOT_FROM_ONE_GEMM = ("embed_tokens", "experts gate_up", "experts down")
"""Parameter tensors whose gradient is not one GEMM's output: the embedding's (embedding_dense_backward) and the
stacked experts' (grouped_mm's backward into the (E, ...) stack)."""

ADAMW_TEMPORARIES = 2
"""Blocks of a parameter's size that torch's single-tensor AdamW allocates per step: exp_avg_sq.sqrt(), then its
division by the bias correction (torch/optim/adamw.py, _single_tensor_adam: denom = (exp_avg_sq.sqrt() /
bias_correction2_sqrt).add_(eps)); the foreach and fused paths are not what a CPU runs by default."""


def fresh_page_operations(arch: Architecture, request: FitRequest, forward: list[Operation], *,
                          fused: bool) -> tuple[list[Operation], int]:
    """(backward operations, AdamW bytes): what a training step writes on freshly mapped pages (fresh_block) beyond
    the blocks its operations allocate themselves (a GEMM's output, counted in gemm). The gradients of the parameter
    tensors of at least FRESH_MAPPING_BYTES that no single GEMM writes (GRADIENTS_NOT_FROM_ONE_GEMM; zero_grad frees
    them, the backward allocates them again), as operations with no bytes of their own, only `fresh_bytes`; and the
    bytes of AdamW's temporaries there, those of each such tensor and of the largest tensor when it is larger than
    every activation (the biggest GEMM output: the logits), which the optimizer step carries. Nothing for LoRA
    (small adapters) or ZeRO (sharded state); other optimizers allocate no temporaries."""
    if request.adapter or request.zero >= 1:
        return [], 0
    state = 2 if request.recipe == "bf16" else FP32
    tensors = parameter_tensors(arch, request.tp, request.ep)
    largest_activation = max((op.batch * op.m * op.n * activation_bytes(request) for op in forward
                              if op.kind == GEMM), default=0)
    big = [(name, n * state, count) for name, n, count in tensors if n * state >= FRESH_MAPPING_BYTES]
    ops = []
    written = [(name, nbytes, count) for name, nbytes, count in big if name in GRADIENTS_NOT_FROM_ONE_GEMM]
    gradients = sum(nbytes * count for _, nbytes, count in written)
    if gradients:
        ops.append(Operation("gradients on fresh pages", "backward", MEMORY, 1, 0, 0, kernels=0, fresh_bytes=gradients,
                             formula=f"tensors of at least {FRESH_MAPPING_BYTES >> 20} MiB: "
                                     + ", ".join(f"{count} x {name}" for name, _, count in written)))
    temporaries = 0
    if request.optimizer.lower() in ("adam", "adamw") and not fused:
        _, n, _ = max(tensors, key=lambda t: t[1])
        temporaries = sum(nbytes * count for _, nbytes, count in big)
        if n * state < FRESH_MAPPING_BYTES and fresh_block(n * state, largest_activation):
            temporaries += n * state  # one tensor: its pair of temporaries leaves the heap's top to be trimmed
    return ops, ADAMW_TEMPORARIES * temporaries


def optimizer_accesses(optimizer: str, *, fused: bool = False) -> int:
    """Element reads + writes per parameter of one optimizer step as torch implements it (module docstring)."""
    name = optimizer.lower()
    if name in ("adam", "adamw"):
        return ADAMW_ACCESSES_FUSED if fused else ADAMW_ACCESSES_UNFUSED
    if name == "sgd":
        return SGD_ACCESSES
    if name == "sgd-momentum":
        return MOMENTUM_ACCESSES
    raise UserError(f"time counts the optimizer step of adam, adamw, sgd and sgd-momentum; got {optimizer!r}")


def optimizer_operation(params_on_device: int, request: FitRequest, *, fused: bool = False) -> Operation:
    """The optimizer step on this device's parameters (ZeRO 1+ shards the update over dp), memory-bound.

    State dtype: fp32 for the fp32, mixed, megatron and hf-amp recipes, bf16 for pure bf16; a recipe
    with an fp32 master also writes the 16-bit weights back (2 B read + 2 B written per parameter).
    LoRA/QLoRA: `params_on_device` are the adapters only, fp32, in mixed precision over a 16-bit base."""
    params = params_on_device
    if request.zero >= 1:
        params = math.ceil(params / request.dp)
    state = 2 if request.recipe == "bf16" else FP32
    accesses = optimizer_accesses(request.optimizer, fused=fused)
    copy_back = 2 * 2 if request.recipe in ("mixed", "megatron") else 0
    if request.adapter:  # fp32 adapters (as tutor.theory.fit counts them); a 16-bit base gets its 16-bit copy
        copy_back = 0 if activation_bytes(request) == FP32 else 2 * 2
    return memory_op(f"{request.optimizer} step", "optimizer", params, accesses + copy_back / state, state, calls=1,
                     kernels=1 if fused else 8,
                     formula=f"{params:,} params x {accesses} accesses x {state} B"
                             + (" + the 16-bit weight copy" if copy_back else ""))

# Which adapter roles (tutor.theory.lora: q, k, v, o, gate, up, down) each counted linear serves.
LINEAR_ROLES: dict[str, tuple[str, ...]] = {
    "q_proj": ("q",), "k_proj": ("k",), "v_proj": ("v",), "o_proj": ("o",), "c_attn": ("q", "k", "v"),
    "attn.c_proj": ("o",), "qkv_proj": ("q", "k", "v"), "q_a_proj": ("q",), "q_b_proj": ("q",),
    "kv_a_proj": ("k", "v"), "kv_b_proj": ("k", "v"), "gate_proj": ("gate",), "up_proj": ("up",),
    "down_proj": ("down",), "gate_up_proj": ("gate", "up"), "c_fc": ("up",), "mlp.c_proj": ("down",),
    "experts gate_up": ("gate", "up"), "experts down": ("down",), "shared expert gate": ("gate",),
    "shared expert up": ("up",), "shared expert down": ("down",),
}
# The first layer's inputs to attention: nothing before them requires a gradient under a frozen base.
ATTENTION_INPUTS = ("q_proj", "k_proj", "v_proj", "c_attn", "qkv_proj", "q_a_proj", "kv_a_proj")
LORA_A, LORA_B = " lora_A", " lora_B"
LORA_SCALE_ADD = " lora scale + add"
DEQUANTIZE = " dequantize (4-bit to 16-bit)"


def lora_forward(ops: list[Operation], request: FitRequest, e: int) -> list[Operation]:
    """`ops` with each adapted linear's adapter GEMMs and PEFT's scale-and-add after it (and, for QLoRA, the
    dequantization of its base weight before it): see the module docstring."""
    r = request.lora_rank
    wanted = set(request.lora_targets)
    packed = float(weight_format("nf4-dq").bits_per_weight) / 8  # bytes per stored 4-bit weight, scales included
    out: list[Operation] = []
    for op in ops:
        roles = LINEAR_ROLES.get(op.name) if op.kind == GEMM else None
        if roles is None:
            out.append(op)
            continue
        if request.recipe == "qlora":
            out.append(memory_op(op.name + DEQUANTIZE, op.phase, op.batch * op.n * op.k, packed + e, 1,
                                 calls=op.calls, formula=f"{op.n:,} x {op.k:,} weights: {packed:.3g} B read + {e} B "
                                                         "written each (nf4 with double quantization)"))
        out.append(op)
        if wanted & set(roles):
            out.append(gemm(op.name + LORA_A, op.phase, op.m, r, op.k, calls=op.calls, element_bytes=e, batch=op.batch))
            out.append(gemm(op.name + LORA_B, op.phase, op.m, op.n, r, calls=op.calls, element_bytes=e, batch=op.batch))
            out.append(memory_op(op.name + LORA_SCALE_ADD, op.phase, op.batch * op.m * op.n, 5, e, calls=op.calls,
                                 kernels=2, formula="lora_B(lora_A(x)) * scaling, then + result: 5 accesses"))
    return out


def lora_backward(ops: list[Operation], attention: str, *, first_layer_calls: int) -> list[Operation]:
    """The backward of LoRA forward operations on a frozen base: base linears dX only, adapters dX and dW,
    QLoRA's dequantization again before each dX, no embedding backward; the first layer's attention inputs
    (`first_layer_calls` of their calls) need no backward at all."""
    out: list[Operation] = []
    for op in backward_of(ops, attention):
        base = op.name.removesuffix(" dX").removesuffix(" dW")
        if op.name.startswith(("embedding lookup", "position embedding")):
            continue  # frozen tables, and nothing before them
        adapter = base.endswith((LORA_A, LORA_B))
        linear = base.removesuffix(LORA_A).removesuffix(LORA_B)
        if op.kind == GEMM and op.name.endswith(" dW") and not adapter:
            continue  # a frozen weight gets no gradient
        calls = op.calls
        first_input = (linear in ATTENTION_INPUTS and op.name.endswith(" dX") and not base.endswith(LORA_B)) \
            or base == "input norm" or base in tuple(name + DEQUANTIZE for name in ATTENTION_INPUTS)
        if first_input and op.kind != FRAMEWORK:
            calls -= first_layer_calls
        if base.endswith(DEQUANTIZE):  # dequantized once more for dX, not twice the forward's traffic
            op = replace(op, bytes=op.bytes // BACKWARD_MEMORY_RATIO, formula="again for dX (MatMul4Bit backward)")
        if calls > 0:
            out.append(replace(op, calls=calls))
    return out


def adapter_params_on_device(arch: Architecture, request: FitRequest) -> int:
    """The LoRA parameters one device trains: the model's (tutor.theory.lora) in the base's share per device."""
    total = count_parameters(arch).total
    on_device = math.ceil(total / (request.tp * request.pp))
    return math.ceil(lora_trainable_params(arch, rank=request.lora_rank, targets=request.lora_targets)
                     * on_device / total)


@dataclass(frozen=True)
class StepOperations:
    """Every operation of one training step on one device, and what they were counted for."""

    operations: tuple[Operation, ...]
    layers: int              # decoder layers on this device's pipeline stage
    microbatches: int
    tokens_per_microbatch: int
    element_bytes: int

    def phase(self, name: str) -> tuple[Operation, ...]:
        return tuple(op for op in self.operations if op.phase == name)

    def flops(self, phase: str | None = None) -> int:
        return sum(op.total_flops for op in self.operations if phase is None or op.phase == phase)


def training_operations(arch: Architecture, request: FitRequest, *, params_on_device: int,
                        fused_optimizer: bool = False) -> StepOperations:
    """The operations of one training step (all micro-batches of one device, then the optimizer) on the
    most loaded pipeline stage: forward, backward (with the recompute the request asks for), optimizer."""
    if request.mode != "train":
        raise UserError("training_operations needs mode 'train'")
    microbatches = request.microbatches or request.pp
    stage_layers = layers_per_pipeline_stage(arch.num_layers, request.pp)
    stage = 0  # the first stage holds the most layers (and the embedding)
    layers = stage_layers[stage]
    e = activation_bytes(request)
    shape = PassShape(request.batch, request.seq_len, request.seq_len)
    forward: list[Operation] = []
    moe_layers = sum(arch.layer_is_moe[: layers])
    backward: list[Operation] = []
    for is_moe, count in ((False, layers - moe_layers), (True, moe_layers)):
        if count:
            ops = layer_forward(arch, moe_layer=is_moe, shape=shape, tp=request.tp, ep=request.ep, e=e,
                                attention=request.attention, calls=count * microbatches, training=True)
            if request.adapter:
                ops = lora_forward(ops, request, e)
                first = microbatches if is_moe == arch.layer_is_moe[0] else 0
                backward += lora_backward(ops, request.attention, first_layer_calls=first)
            forward += ops
    ends = model_ends_forward(arch, shape=shape, tp=request.tp, e=e, calls=microbatches, first=True,
                              last=request.pp == 1, loss=True)
    forward += ends
    if request.adapter:
        backward += lora_backward(ends, request.attention, first_layer_calls=0)
        params_on_device = adapter_params_on_device(arch, request)
    else:
        backward = backward_of(forward, request.attention)
    if request.recompute == "full":
        backward = [replace(op, phase="backward", name=f"recompute {op.name}") for op in forward] + backward
    elif request.recompute == "selective":
        backward = [replace(op, phase="backward", name=f"recompute {op.name}") for op in forward
                    if op.name.startswith("attention")] + backward
    optimizer = optimizer_operation(params_on_device, request, fused=fused_optimizer)
    fresh, temporaries = fresh_page_operations(arch, request, forward, fused=fused_optimizer) if request.pp == 1 \
        else ([], 0)
    if temporaries:
        optimizer = replace(optimizer, fresh_bytes=temporaries,
                            formula=optimizer.formula + f"; {temporaries:,} B of temporaries on fresh pages")
    return StepOperations(tuple(forward + backward + fresh + [optimizer]), layers, microbatches, shape.tokens, e)


def inference_operations(arch: Architecture, request: FitRequest, *, queries: int, context: int,
                         logits_tokens: int | None = None) -> tuple[Operation, ...]:
    """Forward operations of one inference pass on one device: a prefill (queries = context = prompt)
    or one decode step (queries = 1, context = the cache length)."""
    e = activation_bytes(request)
    shape = PassShape(request.batch, queries, context)
    ops: list[Operation] = []
    moe_layers = arch.moe_layers
    for is_moe, count in ((False, arch.num_layers - moe_layers), (True, moe_layers)):
        if count:
            ops += layer_forward(arch, moe_layer=is_moe, shape=shape, tp=request.tp, ep=request.ep, e=e,
                                 attention=request.attention, calls=math.ceil(count / request.pp), training=False,
                                 cache_copy=request.impl == "hf")
    ops += model_ends_forward(arch, shape=shape, tp=request.tp, e=e, calls=1, first=True, last=True, loss=False,
                              logits_tokens=logits_tokens)
    quantized = quantized_linears(request)
    return tuple(quantized_forward(ops, quantized, e) if quantized else ops)


def quantized_forward(ops, fmt: str, e: int) -> list[Operation]:
    """Inference `ops` with the block linears stored in `fmt` (tutor.theory.memory's bits per weight, scales
    included): read packed by a fused kernel (FUSED_LOW_BIT, and bitsandbytes 4-bit for one row), or, for
    bitsandbytes 4-bit over several rows, dequantized to 16 bits first (read packed, write 16-bit) and multiplied
    in 16 bits, as QLoRA's forward is counted. Embeddings, the LM head and routers stay 16-bit."""
    packed = float(weight_format(fmt).bits_per_weight) / 8
    out: list[Operation] = []
    for op in ops:
        if op.kind != GEMM or op.name not in LINEAR_ROLES:
            out.append(op)
            continue
        if fmt in BNB_4BIT and op.m > 1:
            out.append(memory_op(op.name + DEQUANTIZE, op.phase, op.batch * op.n * op.k, packed + e, 1,
                                 calls=op.calls, formula=f"{op.n:,} x {op.k:,} weights: {packed:.3g} B read + {e} B "
                                                         f"written each ({fmt}, bitsandbytes dequantize_4bit)"))
            out.append(op)
            continue
        weights = gemm(op.name, op.phase, op.m, op.n, op.k, calls=op.calls, element_bytes=e, batch=op.batch,
                       weight_bytes=packed)
        out.append(replace(op, bytes=weights.bytes,
                           formula=op.formula + f"; weights {fmt} ({packed:.3g} B each, read packed)"))
    return out
