"""Memory of a model: weight storage formats, training state per parameter, LoRA adapters and the
runtime overheads that formulas leave out. Activations live in `tutor.theory.activations`, the
KV cache in `tutor.theory.kv_cache`; both are re-exported here so the fit check has one import.

Per-parameter sizes are exact Fractions (4 + 20/128 bits, not 4.15625…); totals in bytes are ints,
rounded up because a real allocation holds whole bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from numbers import Rational
from typing import TypeVar

from tutor.errors import UserError
from tutor.theory.checks import positive_int
from tutor.theory.activations import (
    ATTENTION_KINDS,
    RECOMPUTE_MODES,
    ActivationTerm,
    activation_bytes_per_layer,
    activation_bytes_per_layer_gpt,
    embedding_activation_bytes,
    input_ids_bytes,
    layer_activation_terms,
    logits_bytes,
    megatron_output_layer_activation_bytes,
    pipeline_activation_multiplier,
)
from tutor.theory.kv_cache import (
    KV_DTYPES,
    VLLM_DEFAULT_BLOCK_SIZE,
    kv_cache_blocks,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    kv_cache_tokens_that_fit,
    kv_dtype_bytes,
    kv_heads_per_rank,
    mla_kv_cache_bytes_per_token,
)
from tutor.theory.units import MiB

__all__ = [
    # weights
    "WeightFormat", "WEIGHT_FORMATS", "weight_format", "weight_bytes",
    "grouped_bits_per_weight", "block_bits_per_weight", "int8_rowwise_bits_per_weight",
    # training state
    "TrainingRecipe", "TRAINING_RECIPES", "training_recipe", "Optimizer", "OPTIMIZERS", "optimizer",
    "ModelStateBytes", "model_state_bytes_per_param", "model_state_bytes", "adafactor_state_elements",
    "lora_adapter_params",
    # overheads
    "Overhead", "cuda_context_overhead_bytes", "allocator_slack_bytes", "ALLOCATOR_SLACK_FRACTION",
    # re-exported: activations
    "ATTENTION_KINDS", "RECOMPUTE_MODES", "ActivationTerm", "activation_bytes_per_layer",
    "activation_bytes_per_layer_gpt", "embedding_activation_bytes", "input_ids_bytes",
    "layer_activation_terms", "logits_bytes", "megatron_output_layer_activation_bytes",
    "pipeline_activation_multiplier",
    # re-exported: KV cache
    "KV_DTYPES", "VLLM_DEFAULT_BLOCK_SIZE", "kv_cache_blocks", "kv_cache_bytes", "kv_cache_bytes_per_token",
    "kv_cache_tokens_that_fit", "kv_dtype_bytes", "kv_heads_per_rank", "mla_kv_cache_bytes_per_token",
]


_Entry = TypeVar("_Entry")



def _lookup(name: str, table: dict[str, _Entry], aliases: dict[str, str], what: str) -> _Entry:
    key = str(name).strip().lower().replace("_", "-")
    key = aliases.get(key, key)
    if key not in table:
        raise UserError(f"unknown {what} {name!r} (choose one of: {', '.join(table)})")
    return table[key]


# --------------------------------------------------------------------------------------------
# Weight storage formats
# --------------------------------------------------------------------------------------------

def grouped_bits_per_weight(element_bits: int, group_size: int, overhead_bits: int) -> Fraction:
    """Bits per weight of a format that stores `element_bits` per weight plus `overhead_bits`
    (scales, zero-points) shared by each group of `group_size` weights: element + overhead/group."""
    positive_int(element_bits, "element_bits")
    positive_int(group_size, "group_size")
    if isinstance(overhead_bits, bool) or not isinstance(overhead_bits, int) or overhead_bits < 0:
        raise UserError(f"overhead_bits must be a whole number >= 0, got {overhead_bits!r}")
    return element_bits + Fraction(overhead_bits, group_size)


def block_bits_per_weight(block_bytes: int, block_weights: int) -> Fraction:
    """Bits per weight of a format stored as fixed blocks (GGUF): 8 × block bytes / weights per block."""
    return Fraction(8 * positive_int(block_bytes, "block_bytes"), positive_int(block_weights, "block_weights"))


def int8_rowwise_bits_per_weight(row_length: int, scale_bits: int = 32) -> Fraction:
    """Exact bits per weight of int8 with one scale per row (LLM.int8 vector-wise quantization,
    Dettmers et al. arXiv 2208.07339 §3; bitsandbytes keeps the row absmax `SCB` in fp32; W8A8
    per-channel scales are 16 or 32 bits): 8 + scale_bits / row_length."""
    return grouped_bits_per_weight(8, row_length, scale_bits)


@dataclass(frozen=True)
class WeightFormat:
    """How weights are stored: exact bits per weight including scales and zero-points."""

    name: str
    bits_per_weight: Fraction
    description: str
    source: str

    @property
    def bytes_per_weight(self) -> Fraction:
        return self.bits_per_weight / 8


_GPTQ_INT4_G128 = grouped_bits_per_weight(4, 128, 16 + 4)
_GPTQ_SOURCE = (
    "AutoGPTQ / AutoAWQ packed layout: qweight 4-bit, one fp16 scale and one packed 4-bit zero-point "
    "per group of 128 per output column (GPTQ arXiv 2210.17323; AWQ arXiv 2306.00978)"
)
_K_QUANT_SOURCE = "llama.cpp ggml-common.h block_q{n}_K structs, 256-weight super-blocks (k-quants, PR #1684)"

WEIGHT_FORMATS: dict[str, WeightFormat] = {
    fmt.name: fmt
    for fmt in (
        WeightFormat("fp32", Fraction(32), "IEEE float32", "IEEE 754 binary32"),
        WeightFormat("tf32", Fraction(32), "TF32 is a tensor-core compute mode; weights stay stored as fp32",
                     "NVIDIA A100 architecture whitepaper (TF32 inputs are fp32 in memory)"),
        WeightFormat("bf16", Fraction(16), "bfloat16", "Google bfloat16 format; 2 bytes"),
        WeightFormat("fp16", Fraction(16), "IEEE float16", "IEEE 754 binary16"),
        WeightFormat("fp8", Fraction(8), "FP8 E4M3/E5M2 with one per-tensor scale (negligible)",
                     "Micikevicius et al., FP8 Formats for Deep Learning, arXiv 2209.05433"),
        WeightFormat("fp8-block128", grouped_bits_per_weight(8, 128 * 128, 32),
                     "FP8 with one fp32 scale per 128x128 block (DeepSeek-V3 weight_scale_inv)",
                     "deepseek-ai/DeepSeek-V3 README_WEIGHTS.md; arXiv 2412.19437 §3.3"),
        WeightFormat("int8", Fraction(8),
                     "int8 with one scale per row; the row scale adds scale_bits/row_length "
                     "(0.008 bits for a 4096-wide fp32-scaled row), counted as 8 bits like accelerate "
                     "estimate-memory (fp32 size / 4); exact: int8_rowwise_bits_per_weight",
                     "LLM.int8(), Dettmers et al. arXiv 2208.07339 §3; huggingface/accelerate estimate.py"),
        WeightFormat("int4", _GPTQ_INT4_G128, "4-bit integer, group 128, fp16 scale + 4-bit zero per group",
                     _GPTQ_SOURCE),
        WeightFormat("gptq-int4-g128", _GPTQ_INT4_G128, "GPTQ 4-bit, group size 128 (same layout as int4)",
                     _GPTQ_SOURCE),
        WeightFormat("awq-int4-g128", _GPTQ_INT4_G128, "AWQ 4-bit, group size 128 (same layout as int4)",
                     _GPTQ_SOURCE),
        WeightFormat("nf4", grouped_bits_per_weight(4, 64, 32), "bitsandbytes NF4, fp32 absmax per 64 weights",
                     "QLoRA, Dettmers et al. arXiv 2305.14314 §3 (blocksize 64: 32/64 = 0.5 bit/param)"),
        WeightFormat("nf4-dq", grouped_bits_per_weight(4, 64, 8) + Fraction(32, 64 * 256),
                     "NF4 with double quantization: 8-bit absmax per 64, fp32 constant per 256 blocks",
                     "QLoRA, arXiv 2305.14314 §3 Double Quantization: 8/64 + 32/(64*256) = 0.127 bit/param"),
        WeightFormat("mxfp4", grouped_bits_per_weight(4, 32, 8), "OCP MXFP4: FP4 E2M1, shared 8-bit E8M0 scale per 32",
                     "OCP Microscaling Formats (MX) Specification v1.0; whichllm engine/quantization.py 0.53125 B"),
        WeightFormat("nvfp4", grouped_bits_per_weight(4, 16, 8),
                     "NVIDIA NVFP4: FP4 E2M1, FP8 E4M3 scale per 16 (+ one fp32 per-tensor scale, negligible)",
                     "NVIDIA Blackwell NVFP4 (block 16, E4M3 scale); whichllm engine/quantization.py 0.5625 B"),
        WeightFormat("q4_0", block_bits_per_weight(2 + 16, 32), "GGUF Q4_0: fp16 scale + 32 4-bit weights = 18 B",
                     "llama.cpp ggml-common.h block_q4_0"),
        WeightFormat("q8_0", block_bits_per_weight(2 + 32, 32), "GGUF Q8_0: fp16 scale + 32 int8 weights = 34 B",
                     "llama.cpp ggml-common.h block_q8_0"),
        WeightFormat("q2_k", block_bits_per_weight(16 + 64 + 2 + 2, 256),
                     "GGUF Q2_K: 4-bit scales/mins, 2-bit quants, fp16 d and dmin = 84 B / 256", _K_QUANT_SOURCE),
        WeightFormat("q3_k", block_bits_per_weight(32 + 64 + 12 + 2, 256),
                     "GGUF Q3_K: high-bit mask, 2-bit quants, 6-bit scales, fp16 d = 110 B / 256", _K_QUANT_SOURCE),
        WeightFormat("q4_k", block_bits_per_weight(2 + 2 + 12 + 128, 256),
                     "GGUF Q4_K: fp16 d and dmin, 6-bit scales/mins, 4-bit quants = 144 B / 256", _K_QUANT_SOURCE),
        WeightFormat("q5_k", block_bits_per_weight(2 + 2 + 12 + 32 + 128, 256),
                     "GGUF Q5_K: as Q4_K plus a high-bit plane = 176 B / 256", _K_QUANT_SOURCE),
        WeightFormat("q6_k", block_bits_per_weight(128 + 64 + 16 + 2, 256),
                     "GGUF Q6_K: 4+2-bit quants, 8-bit scales, fp16 d = 210 B / 256", _K_QUANT_SOURCE),
    )
}

_WEIGHT_FORMAT_ALIASES = {
    "float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16",
    "float8": "fp8", "fp8-e4m3": "fp8", "fp8-e5m2": "fp8", "e4m3": "fp8", "float8-e4m3fn": "fp8",
    "fp8-block": "fp8-block128", "gptq": "gptq-int4-g128", "awq": "awq-int4-g128",
    "q4-0": "q4_0", "q8-0": "q8_0", "q2-k": "q2_k", "q3-k": "q3_k", "q4-k": "q4_k", "q5-k": "q5_k", "q6-k": "q6_k",
}


def weight_format(name: str) -> WeightFormat:
    """The storage format called `name` (case-insensitive; float32/float16/half/bfloat16 accepted)."""
    return _lookup(name, WEIGHT_FORMATS, _WEIGHT_FORMAT_ALIASES, "weight format")


def weight_bytes(params: int, fmt: str) -> int:
    """Bytes to store `params` weights in format `fmt`: ceil(params × bits_per_weight / 8)."""
    params = positive_int(params, "params")
    return math.ceil(params * weight_format(fmt).bits_per_weight / 8)


# --------------------------------------------------------------------------------------------
# Training state per parameter: precision recipes and optimizers
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TrainingRecipe:
    """Bytes per parameter of each copy a precision recipe keeps (optimizer states counted apart)."""

    name: str
    weight_bytes: Fraction
    grad_bytes: Fraction
    master_bytes: Fraction
    state_bytes: Fraction
    description: str
    source: str


TRAINING_RECIPES: dict[str, TrainingRecipe] = {
    recipe.name: recipe
    for recipe in (
        TrainingRecipe("mixed", Fraction(2), Fraction(2), Fraction(4), Fraction(4),
                       "16-bit weights and gradients, fp32 master weights, fp32 optimizer states "
                       "(16 B/param with Adam)",
                       "ZeRO, Rajbhandari et al. arXiv 1910.02054 §3.1"),
        TrainingRecipe("megatron", Fraction(2), Fraction(4), Fraction(4), Fraction(4),
                       "bf16 weights, fp32 main_grad accumulation, fp32 master and states (18 B/param with Adam)",
                       "NVIDIA/Megatron-LM megatron/training/theoretical_memory_usage.py (18 B without "
                       "the distributed optimizer)"),
        TrainingRecipe("hf-amp", Fraction(6), Fraction(4), Fraction(0), Fraction(4),
                       "fp32 weights plus a 16-bit copy for the forward (6), fp32 gradients, fp32 states; "
                       "the fp32 weights are the master (18 B/param with AdamW)",
                       "huggingface/transformers docs/source/en/model_memory_anatomy.md"),
        TrainingRecipe("bf16", Fraction(2), Fraction(2), Fraction(0), Fraction(2),
                       "pure bf16: weights, gradients and optimizer states all bf16, no master (8 B/param with AdamW)",
                       "measured: huggingface/peft method_comparison Llama-3.2-3B full fine-tuning, "
                       "25.70 GB predicted vs 26.06 GB allocated average"),
        TrainingRecipe("fp32", Fraction(4), Fraction(4), Fraction(0), Fraction(4),
                       "everything fp32 (16 B/param with Adam)",
                       "huggingface/transformers model_memory_anatomy.md (fp32 training)"),
    )
}

_RECIPE_ALIASES = {"default": "mixed", "amp": "hf-amp", "mixed-precision": "mixed", "float32": "fp32",
                   "bfloat16": "bf16", "pure-bf16": "bf16"}


def training_recipe(name: str) -> TrainingRecipe:
    """The precision recipe called `name` (mixed, megatron, hf-amp, bf16, fp32)."""
    return _lookup(name, TRAINING_RECIPES, _RECIPE_ALIASES, "training recipe")


@dataclass(frozen=True)
class Optimizer:
    """State elements an optimizer keeps per parameter, and their size if fixed by the optimizer
    (else the recipe's state_bytes)."""

    name: str
    states_per_param: Fraction
    state_bytes_override: Fraction | None
    description: str
    source: str


# bitsandbytes 8-bit optimizers: int8 states with one fp32 absmax per block of 2048 values.
_BLOCKWISE_8BIT_STATE_BYTES = 1 + Fraction(4, 2048)
_ADAM_SOURCE = "Kingma & Ba arXiv 1412.6980 (m and v); AdamW, Loshchilov & Hutter arXiv 1711.05101"

OPTIMIZERS: dict[str, Optimizer] = {
    opt.name: opt
    for opt in (
        Optimizer("adam", Fraction(2), None, "first and second moments m, v", _ADAM_SOURCE),
        Optimizer("adamw", Fraction(2), None, "first and second moments m, v (decoupled weight decay)", _ADAM_SOURCE),
        Optimizer("sgd", Fraction(0), None, "plain SGD keeps no state", "torch.optim.SGD (momentum=0)"),
        Optimizer("sgd-momentum", Fraction(1), None, "one momentum buffer",
                  "torch.optim.SGD momentum_buffer; EleutherAI Transformer Math 101 (SGD+momentum 8 B incl. master)"),
        Optimizer("adam-8bit", Fraction(2), _BLOCKWISE_8BIT_STATE_BYTES,
                  "m and v in 8 bits, block-wise quantized: 1 byte + fp32 absmax per 2048 values",
                  "Dettmers et al., 8-bit Optimizers via Block-wise Quantization, arXiv 2110.02861 §2 "
                  "(block size 2048); EleutherAI TM101 '8-bit: 6 B incl. master'"),
        Optimizer("adafactor", Fraction(0), None,
                  "factored second moment, no first moment (beta1=None, the HF/T5 default): an r×c matrix "
                  "keeps r + c values, o(1) per parameter, counted as 0 here; exact: adafactor_state_elements",
                  "Shazeer & Stern, Adafactor, arXiv 1804.04235 §3; transformers.optimization.Adafactor"),
        Optimizer("adafactor-momentum", Fraction(1), None,
                  "Adafactor with beta1 set: a full first moment plus the factored second moment "
                  "('slightly more than 4 bytes' per parameter in HF docs)",
                  "arXiv 1804.04235 §3; huggingface/transformers perf_train_gpu_one.md"),
        Optimizer("lion", Fraction(1), None, "one momentum buffer",
                  "Chen et al., Symbolic Discovery of Optimization Algorithms (Lion), arXiv 2302.06675"),
    )
}

_OPTIMIZER_ALIASES = {"adam8bit": "adam-8bit", "adamw-8bit": "adam-8bit", "adamw8bit": "adam-8bit",
                      "bnb-adam8bit": "adam-8bit", "momentum": "sgd-momentum"}


def optimizer(name: str) -> Optimizer:
    """The optimizer called `name` (adam, adamw, sgd, sgd-momentum, adam-8bit, adafactor, lion, ...)."""
    return _lookup(name, OPTIMIZERS, _OPTIMIZER_ALIASES, "optimizer")


def adafactor_state_elements(shape: tuple[int, ...], *, momentum: bool = False) -> int:
    """Optimizer-state elements Adafactor keeps for one parameter tensor of `shape`.

    transformers.optimization.Adafactor: a tensor with 2+ dims keeps exp_avg_sq_row (shape[:-1])
    and exp_avg_sq_col (shape[:-2] + shape[-1:]), so an r×c matrix keeps r + c; a vector keeps a
    full exp_avg_sq. With momentum (beta1) it also keeps exp_avg, one value per element. Scalars
    (step, RMS) are left out.
    """
    if not isinstance(shape, tuple) or not shape:
        raise UserError(f"shape must be a non-empty tuple of sizes, got {shape!r}")
    dims = [positive_int(n, "each dimension of shape") for n in shape]
    elements = math.prod(dims)
    second = elements if len(dims) == 1 else math.prod(dims[:-1]) + math.prod(dims[:-2]) * dims[-1]
    return second + (elements if momentum else 0)


@dataclass(frozen=True)
class ModelStateBytes:
    """Bytes per parameter of model states; optimizer = fp32 master copy + optimizer states."""

    weights: Fraction
    gradients: Fraction
    optimizer: Fraction

    @property
    def total(self) -> Fraction:
        return self.weights + self.gradients + self.optimizer


def model_state_bytes_per_param(recipe: str = "mixed", optimizer: str = "adam") -> ModelStateBytes:
    """Weights, gradients and optimizer bytes per trainable parameter for a recipe and optimizer.

    optimizer bytes = master + states_per_param × (the optimizer's own state size, else the
    recipe's). Anchors: mixed+adam 2/2/12 = 16 (ZeRO §3.1, K = 12); megatron+adam 18 and hf-amp+adam 18;
    bf16+adam 8; mixed+sgd-momentum 2 + 2 + (4 + 4) = 12; mixed+adam-8bit 2 + 2 + (4 + 2 + 1/256),
    EleutherAI TM101's "6 B incl. master" plus the block absmax.
    """
    rec = training_recipe(recipe)
    opt = _lookup(optimizer, OPTIMIZERS, _OPTIMIZER_ALIASES, "optimizer")
    state_size = rec.state_bytes if opt.state_bytes_override is None else opt.state_bytes_override
    return ModelStateBytes(
        weights=rec.weight_bytes,
        gradients=rec.grad_bytes,
        optimizer=rec.master_bytes + opt.states_per_param * state_size,
    )


def model_state_bytes(params: int, recipe: str = "mixed", optimizer: str = "adam") -> int:
    """Bytes of weights + gradients + optimizer states for `params` trainable parameters, on one
    device with nothing sharded: ceil(params × model_state_bytes_per_param(...).total)."""
    params = positive_int(params, "params")
    return math.ceil(params * model_state_bytes_per_param(recipe, optimizer).total)


def lora_adapter_params(d_in: int, d_out: int, rank: int) -> int:
    """Trainable parameters LoRA adds to one d_in → d_out linear layer: rank·(d_in + d_out).

    Hu et al., LoRA, arXiv 2106.09685 §4.1: W0 + BA with B ∈ R^{d_out×r}, A ∈ R^{r×d_in}.
    """
    return positive_int(rank, "LoRA rank") * (positive_int(d_in, "d_in") + positive_int(d_out, "d_out"))


# --------------------------------------------------------------------------------------------
# Runtime overheads: explicit, labelled estimates from published measurements
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Overhead:
    """Memory a real run uses beyond the formulas, with where the figure comes from."""

    name: str
    bytes: int
    source: str
    note: str


# Hugging Face model_memory_anatomy.md: `torch.ones((1, 1)).to("cuda")` then NVML used = 1343 "MB",
# printed as info.used // 1024**2, i.e. MiB.
_HF_CUDA_CONTEXT_MIB = 1343


def cuda_context_overhead_bytes() -> Overhead:
    """CUDA context and kernel images: 1,343 MiB measured by Hugging Face on a V100 (2022)."""
    return Overhead(
        name="CUDA context",
        bytes=_HF_CUDA_CONTEXT_MIB * MiB,
        source="huggingface/transformers docs/source/en/model_memory_anatomy.md "
        "(V100, NVML used after torch.ones((1, 1)).cuda())",
        note="typical, measured on one setup; your card differs (driver, PyTorch build, GPU: 300 MiB to 2 GiB seen)",
    )


# huggingface/peft method_comparison/MetaMathQA, Llama-3.2-3B full fine-tuning on an L40S:
# torch allocated 26.06 GB vs reserved 33.10 GB, both averaged over the run.
_PEFT_ALLOCATED_AVG_GB = Fraction("26.06")
_PEFT_RESERVED_AVG_GB = Fraction("33.10")
_PEFT_SLACK_SOURCE = (
    "huggingface/peft method_comparison/MetaMathQA results, Llama-3.2-3B on L40S: reserved vs allocated average"
)
ALLOCATOR_SLACK_FRACTION = (_PEFT_RESERVED_AVG_GB - _PEFT_ALLOCATED_AVG_GB) / _PEFT_ALLOCATED_AVG_GB


def allocator_slack_bytes(allocated: int, fraction: Fraction | float = ALLOCATOR_SLACK_FRACTION) -> Overhead:
    """Memory the PyTorch caching allocator reserves beyond what tensors occupy: allocated × fraction.

    Default fraction 0.27 = (reserved − allocated)/allocated averaged over the PEFT Llama-3.2-3B
    full fine-tuning run (26.06 GB allocated, 33.10 GB reserved); published reports range 5-30%
    (PyTorch "Understanding CUDA Memory Usage": block rounding and fragmentation). This is an
    estimate from one measurement, not an exact term; pass your own measured fraction.
    """
    if isinstance(allocated, bool) or not isinstance(allocated, int) or allocated < 0:
        raise UserError(f"allocated must be a whole number of bytes >= 0, got {allocated!r}")
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, Rational)):
        raise UserError(f"allocator slack fraction must be a number such as 0.1, got {fraction!r}")
    if isinstance(fraction, float) and not math.isfinite(fraction):
        raise UserError(f"allocator slack fraction must be a finite number >= 0 (e.g. 0.1), got {fraction!r}")
    exact = Fraction(repr(fraction)) if isinstance(fraction, float) else Fraction(fraction)
    if exact < 0:
        raise UserError(f"allocator slack fraction must be a finite number >= 0 (e.g. 0.1), got {fraction!r}")
    return Overhead(
        name="allocator slack",
        bytes=math.ceil(allocated * exact),
        source=_PEFT_SLACK_SOURCE if exact == ALLOCATOR_SLACK_FRACTION else "fraction given by the caller",
        note=f"estimate: {float(exact):.0%} of allocated memory held by the PyTorch caching allocator "
        "(rounding, fragmentation); varies with shapes and PYTORCH_CUDA_ALLOC_CONF",
    )
