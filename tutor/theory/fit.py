"""The fit check: memory per device for a model, a mode and a parallel layout, term by term.

Everything here composes the formulas of the sibling modules (models, memory, activations,
kv_cache, parallel, lora); each component carries the formula it used, so the CLI, the lessons'
calculators and the tests all show the same numbers with the same explanation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import IntEnum, StrEnum
from fractions import Fraction
from typing import TypedDict, Unpack

from tutor.errors import UserError
from tutor.theory.checks import positive_int
from tutor.theory.calibrated import (
    at_shape_key,
    cache_parts,
    calibrated_setup,
    prefill_peak,
    setup_key,
    training_timeline,
)
from tutor.theory.calibrated import kv_cache_bytes as calibrated_kv_cache_bytes
from tutor.theory.activations import (
    ATTENTION_KINDS,
    IMPLEMENTATIONS,
    RECOMPUTE_MODES,
    activation_bytes_per_layer,
    hf_attention_backend,
    hf_attention_core_terms,
    hf_layer_activation_terms,
    hf_layer_shape,
    hf_loss_backward_extra_bytes,
    hf_loss_forward_extra_bytes,
    hf_model_activation_terms,
    hf_attention_mask_bytes,
    hf_prefill_held_bytes,
    hf_prefill_moments,
    hf_rerun_layer_moments,
    input_ids_bytes,
    layer_activation_terms,
    logits_bytes,
    pipeline_activation_multiplier,
)
from tutor.theory.kv_cache import kv_cache_bytes, kv_dtype_bytes
from tutor.theory.lora import ALL_LINEAR, ATTENTION_TARGETS, lora_trainable_params, quantizable_weights_per_layer
from tutor.theory.memory import (
    ALLOCATOR_SLACK_FRACTION,
    TRAINING_RECIPES,
    cuda_context_overhead_bytes,
    model_state_bytes_per_param,
    training_recipe,
    weight_format,
)
from tutor.theory.models import (
    Architecture,
    LayerParams,
    ParamCount,
    count_parameters,
    model_buffers,
    parameters_per_layer,
    qk_norm_parameters,
)
from tutor.theory.parallel import pipeline_stages, zero_model_states
from tutor.theory.units import GiB



class Mode(StrEnum):
    """What the memory is for: serving the model, or a training step."""

    INFERENCE = "inference"
    TRAIN = "train"


class Recipe(StrEnum):
    """Training precision layouts (tutor.theory.memory.TRAINING_RECIPES) and the two adapter recipes."""

    MIXED = "mixed"
    MEGATRON = "megatron"
    HF_AMP = "hf-amp"
    BF16 = "bf16"
    FP32 = "fp32"
    LORA = "lora"
    QLORA = "qlora"


class Recompute(StrEnum):
    """Activation recomputation (tutor.theory.activations.RECOMPUTE_MODES; Korthikanti et al. 2022)."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


class Attention(StrEnum):
    """The attention kernel (tutor.theory.activations.ATTENTION_KINDS)."""

    EAGER = "eager"
    SDPA = "sdpa"
    FLASH = "flash"


class Impl(StrEnum):
    """Whose code the activations assume (tutor.theory.activations.IMPLEMENTATIONS)."""

    HF = "hf"
    FUSED = "fused"


class ZeroStage(IntEnum):
    """ZeRO stages (Rajbhandari et al. 2020, arXiv 1910.02054 §5): what is sharded over dp."""

    NONE = 0
    OPTIMIZER = 1
    GRADIENTS = 2
    PARAMETERS = 3  # FSDP full shard


MODES = tuple(mode.value for mode in Mode)
ADAPTER_RECIPES = (Recipe.LORA.value, Recipe.QLORA.value)
RECIPES = tuple(TRAINING_RECIPES) + ADAPTER_RECIPES
ZERO_STAGES = tuple(int(stage) for stage in ZeroStage)
COMPONENTS = ("weights", "buffers", "gradients", "optimizer", "activations", "kv_cache", "overhead")
SIXTEEN_BIT = ("bf16", "fp16")
# Formats that keep every tensor at full width; the others quantize only the blocks' linear weights.
UNQUANTIZED = ("fp32", "tf32", "bf16", "fp16")
QLORA_BASE_FORMAT = "nf4-dq"  # QLoRA paper arXiv 2305.14314 §3: NF4 with double quantization


@dataclass(frozen=True)
class FitRequest:
    """What to fit: a mode, storage formats, a batch, and a parallel layout.

    batch is the micro-batch per data-parallel rank (inference: concurrent sequences); seq_len
    the tokens per sequence (inference: prompt + generated, the KV cache length).
    """

    mode: Mode | str = Mode.INFERENCE
    dtype: str = "bf16"              # weight storage (inference; the frozen base for LoRA)
    recipe: Recipe | str = Recipe.MIXED  # training precision layout (or an alias: amp), or lora / qlora
    optimizer: str = "adam"
    batch: int = 1
    seq_len: int = 4096
    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    zero: ZeroStage | int = ZeroStage.NONE
    sequence_parallel: bool = False
    recompute: Recompute | str = Recompute.NONE
    attention: Attention | str = Attention.SDPA  # eager | sdpa (transformers' default) | flash (FlashAttention-2)
    impl: Impl | str = Impl.HF       # hf: transformers modules as written; fused: Megatron kernels
    kv_dtype: str | None = None      # None: the weights' 16-bit type (bf16 for quantized weights)
    microbatches: int | None = None  # pipeline micro-batches per step; None: pp (a full pipeline)
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ALL_LINEAR
    gpu: bool = True                 # add the CUDA context (a GPU); False for a CPU-only machine
    stored_weight_bytes: int | None = None  # inference: bytes of a checkpoint's tensors, from its
                                            # safetensors headers (used instead of dtype when given)
    adapter_bytes: int = 0  # inference: bytes of a PEFT adapter's tensors loaded beside the base
                            # (its adapter_model.safetensors headers), spread over stages like the weights

    @property
    def devices(self) -> int:
        """Devices the layout spans: dp x tp x pp (expert parallelism is carved out of dp)."""
        return self.dp * self.tp * self.pp

    @property
    def adapter(self) -> bool:
        return self.mode == Mode.TRAIN and self.recipe in ADAPTER_RECIPES


@dataclass(frozen=True)
class Component:
    """One term of a device's memory: bytes, and the formula that produced them."""

    name: str
    bytes: int
    formula: str


PHASES = ("forward", "backward", "optimizer", "prefill", "decode")


@dataclass(frozen=True)
class PeakMoment:
    """The moment of a step when the most tensors are alive at once, and what they are.

    bytes: tensors live at that moment, without allocator slack or the CUDA context (those stay
    in the `overhead` component); phase: one of PHASES; per_category: bytes of each category
    alive then (weights, buffers, gradients, optimizer, activations, kv_cache, optimizer_temporaries);
    formula: one line saying why the peak is there.
    """

    bytes: int
    phase: str
    per_category: dict[str, int]
    formula: str


@dataclass(frozen=True)
class DeviceMemory:
    """The memory of one device (the worst rank of one pipeline stage).

    components: each category's own maximum over the step (the teaching view); peak: the moment
    the most is alive, which is what must fit (`total`).
    """

    stage: int
    layers: int
    params: int
    components: tuple[Component, ...]
    peak: PeakMoment

    @property
    def total(self) -> int:
        """What must fit: the tensors alive at the peak plus the overhead (CUDA context, slack)."""
        return self.peak.bytes + self.component("overhead")

    @property
    def sum_of_components(self) -> int:
        """Every category at its own maximum, added up: an upper bound, the old view."""
        return sum(c.bytes for c in self.components)

    def component(self, name: str) -> int:
        """Bytes of the named component (0 when this device has none)."""
        return sum(c.bytes for c in self.components if c.name == name)


@dataclass(frozen=True)
class FitEstimate:
    """Per-device memory of every pipeline stage, and the one that bounds the fit.

    arch is None for a bare parameter count (`--params`): then only the model states are known.
    """

    arch: Architecture | None
    params: ParamCount | None
    total_params: int
    request: FitRequest
    trainable_params: int
    stages: tuple[DeviceMemory, ...]
    notes: tuple[str, ...] = field(default=())

    @property
    def worst(self) -> DeviceMemory:
        """The most loaded device: what must fit."""
        return max(self.stages, key=lambda stage: stage.total)


def validate_request(arch: Architecture, request: FitRequest) -> None:
    """Raise UserError, one line, for a request that cannot describe a real run of this model."""
    if request.mode not in MODES:
        raise UserError(f"unknown mode {request.mode!r}: use {' or '.join(MODES)}")
    for name in ("batch", "seq_len", "dp", "tp", "pp", "ep", "lora_rank"):
        positive_int(getattr(request, name), name.replace("_", "-"))
    if request.microbatches is not None:
        positive_int(request.microbatches, "microbatches")
    if request.adapter and request.lora_rank > arch.hidden_size:
        # LoRA's B·A has rank at most min(d_in, d_out) of the matrix it adapts (Hu et al. 2021, LoRA,
        # section 4.1: r << min(d, k)); the projections that read or write the residual stream have the
        # hidden size on one side, so a larger rank adds parameters and no expressiveness.
        raise UserError(f"lora-rank must be between 1 and the model's hidden size {arch.hidden_size:,}, "
                        f"got {request.lora_rank:,}")
    if request.zero not in ZERO_STAGES:
        raise UserError(f"ZeRO stage must be 0, 1, 2 or 3, got {request.zero!r}")
    if request.recompute not in RECOMPUTE_MODES:
        raise UserError(f"unknown recompute mode {request.recompute!r}: use {', '.join(RECOMPUTE_MODES)}")
    if request.attention not in ATTENTION_KINDS:
        raise UserError(f"unknown attention {request.attention!r}: use {', '.join(ATTENTION_KINDS)}")
    if request.impl not in IMPLEMENTATIONS:
        raise UserError(f"unknown implementation {request.impl!r}: use {', '.join(IMPLEMENTATIONS)}")
    if request.recipe not in RECIPES:
        training_recipe(request.recipe)  # raises the list of valid names
    weight_format(request.dtype)
    if request.kv_dtype is not None:
        kv_dtype_bytes(request.kv_dtype)
    model_state_bytes_per_param(Recipe.MIXED, request.optimizer)
    if arch.num_heads % request.tp:
        raise UserError(f"tensor-parallel size {request.tp} must divide the {arch.num_heads} attention heads")
    if request.pp > arch.num_layers:
        raise UserError(f"pipeline-parallel size {request.pp} exceeds the model's {arch.num_layers} layers")
    if request.ep > 1:
        if not arch.is_moe:
            raise UserError(f"expert parallelism (ep={request.ep}) needs a mixture-of-experts model")
        if arch.num_experts % request.ep:
            raise UserError(f"ep={request.ep} must divide the {arch.num_experts} experts")
        if request.dp % request.ep:
            raise UserError(f"ep={request.ep} must divide dp={request.dp} "
                            "(expert-parallel groups are carved out of the data-parallel ranks)")


def estimate(arch: Architecture, request: FitRequest) -> FitEstimate:
    """Memory per device for `request`, one DeviceMemory per pipeline stage."""
    validate_request(arch, request)
    params = count_parameters(arch)
    layers = parameters_per_layer(arch)
    trainable = 0
    if request.adapter:
        trainable = lora_trainable_params(arch, rank=request.lora_rank, targets=request.lora_targets)
    elif request.mode == Mode.TRAIN:
        trainable = params.total
    # What lies outside the layers: the final norm (and anything else the counter adds there).
    final_norm = params.total - params.embedding - params.lm_head - params.position_embedding - sum(
        layer.total for layer in layers)
    stages = []
    start = 0
    for stage in pipeline_stages(arch.num_layers, request.pp, tied_embeddings=arch.tie_word_embeddings):
        stage_layers = range(start, start + stage.layers)
        start += stage.layers
        stages.append(_stage_memory(arch, params, layers, request, stage, stage_layers, final_norm, trainable))
    notes = _notes(arch, request)
    return FitEstimate(arch=arch, params=params, total_params=params.total, request=request,
                       trainable_params=trainable, stages=tuple(stages), notes=notes)


def estimate_from_count(total_params: int, request: FitRequest) -> FitEstimate:
    """Model states only, for a bare parameter count: weights (and, training, gradients and
    optimizer states) split evenly over tp x pp and sharded by ZeRO. Activations and the KV
    cache depend on the architecture, so they are not estimated (and the verdict says so)."""
    positive_int(total_params, "parameter count")
    if request.recipe in ADAPTER_RECIPES and request.mode == Mode.TRAIN:
        raise UserError("LoRA/QLoRA need the model's architecture: pass a preset or a config.json, not --params")
    if request.ep > 1:
        raise UserError("expert parallelism needs the model's architecture: pass a preset or a config.json")
    for name in ("batch", "seq_len", "dp", "tp", "pp"):
        positive_int(getattr(request, name), name.replace("_", "-"))
    if request.zero not in ZERO_STAGES:
        raise UserError(f"ZeRO stage must be 0, 1, 2 or 3, got {request.zero!r}")
    on_device = math.ceil(Fraction(total_params, request.tp * request.pp))
    split = f" / (tp x pp = {request.tp * request.pp})" if request.tp * request.pp > 1 else ""
    if request.mode == Mode.INFERENCE:
        fmt = weight_format(request.dtype)
        components = [Component("weights", math.ceil(on_device * fmt.bits_per_weight / 8),
                                f"{total_params:,} params{split} x {float(fmt.bits_per_weight) / 8:g} B ({fmt.name})")]
    elif request.mode == Mode.TRAIN:
        resident = _StageParams(dense=on_device, expert=0, quantizable=0, sixteen_bit=on_device)
        components = _model_states(request, resident)
    else:
        raise UserError(f"unknown mode {request.mode!r}: use {' or '.join(MODES)}")
    components.append(Component("overhead", cuda_context_overhead_bytes().bytes if request.gpu else 0,
                                "CUDA context (measured by HF on a V100)" if request.gpu else "none on a CPU"))
    stage = DeviceMemory(stage=0, layers=0, params=on_device, components=tuple(components),
                         peak=_all_at_once(components, "optimizer" if request.mode == Mode.TRAIN else "prefill"))
    notes = ("activations and KV cache not estimated: a bare parameter count has no architecture "
             "(pass a preset name or a config.json for those)",)
    return FitEstimate(arch=None, params=None, total_params=total_params, request=request,
                       trainable_params=total_params if request.mode == Mode.TRAIN else 0,
                       stages=(stage,), notes=notes)


@dataclass(frozen=True)
class _StageParams:
    """Parameters resident on one device of a stage, split by how they are sharded and stored."""

    dense: int        # replicated over data parallelism (sharded by ZeRO over dp)
    expert: int       # routed experts (sharded by ZeRO over the expert-data-parallel group)
    quantizable: int  # the blocks' linear weights a low-bit format applies to
    sixteen_bit: int  # embeddings, head, norms, biases, routers: kept 16-bit by quantized formats
    autocast_cast: int = 0  # parameters torch.autocast casts to 16-bit (`autocast_cast_parameters`)

    @property
    def total(self) -> int:
        return self.dense + self.expert


def _layer_shape_counts(arch: Architecture, layer_indices) -> tuple[tuple[bool, int], ...]:
    """(is_moe, count) for each layer shape (dense, MoE) among `layer_indices`, omitting absent shapes.

    Every layer of one shape holds the same parameters and keeps the same activations, so the
    estimate computes each shape once and counts its layers: its cost does not grow with depth."""
    moe = sum(arch.layer_is_moe[index] for index in layer_indices)
    return tuple((is_moe, count) for is_moe, count in ((False, len(layer_indices) - moe), (True, moe)) if count)


def _layer_split(arch: Architecture, layer: LayerParams, expert_params: int, tp: int, ep: int, *,
                 mlp_only: bool = False) -> tuple[int, int]:
    """(dense, expert) parameters of one layer on one device: the dense part split over tp and the
    routed experts over ep ranks, each expert tensor-parallel over tp (Megatron's classic layout).
    mlp_only: the MLP, router and experts alone (what the MLP's backward gives gradients to)."""
    routed = arch.num_experts * expert_params if layer.is_moe else 0
    own = layer.mlp - routed + (0 if mlp_only else layer.attention)
    dense = math.ceil(Fraction(own, tp)) + layer.router + (0 if mlp_only else layer.norms)
    return dense, math.ceil(Fraction(routed, ep * tp))


def _distinct_layers(arch: Architecture, layers: tuple[LayerParams, ...],
                     stage_layers: range) -> tuple[tuple[LayerParams, int, int], ...]:
    """(layer, its linear weights, how many such layers) for each distinct layer among `stage_layers`: every
    layer of one shape holds the same parameters, so each is computed once and counted (its cost does not
    grow with depth). A calibrated-trace architecture's layers are each the real model's (tutor.theory.models.
    MeasuredParams): a hybrid model's Mamba and attention layers differ, and a block shared by several layers
    (Zamba2's shared transformer block) is counted in the first layer that holds it, none after."""
    counts: dict[tuple[LayerParams, int], int] = {}
    by_shape = {} if arch.measured is not None else {is_moe: quantizable_weights_per_layer(arch, moe_layer=is_moe)
                                                     for is_moe in {layers[index].is_moe for index in stage_layers}}
    for index in stage_layers:
        layer = layers[index]
        linear = arch.measured.layers[index].linear if arch.measured is not None else by_shape[layer.is_moe]
        counts[(layer, linear)] = counts.get((layer, linear), 0) + 1
    return tuple((layer, linear, count) for (layer, linear), count in counts.items())


def _stage_params(arch: Architecture, params: ParamCount, layers: tuple[LayerParams, ...], request: FitRequest,
                  stage, stage_layers: range, final_norm: int) -> _StageParams:
    tp, ep = request.tp, request.ep
    dense = expert = quantizable = cast = 0
    for layer, linear, count in _distinct_layers(arch, layers, stage_layers):
        routed = arch.num_experts * params.expert if layer.is_moe else 0
        layer_dense, layer_expert = _layer_split(arch, layer, params.expert, tp, ep)
        dense += count * layer_dense
        expert += count * layer_expert
        cast += count * autocast_cast_parameters(arch, layer, routed, tp)
        quantizable += count * (math.ceil(Fraction(linear - routed, tp)) + layer_expert)
    if stage.input_embedding:
        dense += math.ceil(Fraction(params.embedding, tp)) + params.position_embedding
    if stage.output_head:
        dense += math.ceil(Fraction(params.lm_head or params.embedding, tp))
    if stage.index == request.pp - 1:  # lm_head is a linear: its weight is cast, tied to the embedding or not
        cast += math.ceil(Fraction(params.lm_head or params.embedding, tp))
    if stage.index == request.pp - 1:
        dense += final_norm
    total = dense + expert
    return _StageParams(dense=dense, expert=expert, quantizable=quantizable, sixteen_bit=total - quantizable,
                        autocast_cast=cast)


def autocast_cast_parameters(arch: Architecture, layer: LayerParams, routed: int, tp: int = 1) -> int:
    """Parameters of one layer that torch.autocast copies to 16-bit in a transformers forward.

    Autocast casts the inputs of the ops on its lower-precision list (linear, matmul, addmm, bmm:
    torch/csrc/autograd/autocast_mode.cpp, the CUDA and CPU `lower_precision_fp` lists) and caches
    the copy of each weight for the rest of the forward. So the attention projections and their
    biases, dense and shared-expert MLPs, and nn.Linear routers are copied; norms (Qwen3's and MLA's
    inner norms too) are not (they are not on the list), nor the input embedding (embedding is not
    on the list), nor routed experts run through transformers 5's grouped_mm path (`_grouped_mm`
    is not on the list; measured: no 16-bit copy), nor DeepSeek-V3's router (measured: no copy).
    The output head is a linear, so its weight is cast whether or not it is tied to the embedding.
    """
    cast = layer.attention - qk_norm_parameters(arch) + (layer.mlp - routed)
    if arch.model_type != "deepseek_v3":
        cast += layer.router
    return math.ceil(Fraction(cast, tp))


def _stage_memory(arch: Architecture, params: ParamCount, layers: tuple[LayerParams, ...], request: FitRequest,
                  stage, stage_layers: range, final_norm: int, trainable: int) -> DeviceMemory:
    resident = _stage_params(arch, params, layers, request, stage, stage_layers, final_norm)
    components: list[Component] = []
    if request.mode == Mode.INFERENCE and request.stored_weight_bytes is not None:
        share = Fraction(resident.total, params.total)
        split = f" x {resident.total:,}/{params.total:,} of the params" if share != 1 else ""
        components.append(Component("weights", math.ceil(request.stored_weight_bytes * share),
                                    f"{request.stored_weight_bytes:,} B of tensors in the checkpoint's safetensors"
                                    f" headers{split}"))
    elif request.mode == Mode.INFERENCE:
        components.append(_stored_weights(resident, request.dtype))
    elif request.adapter:
        base_format = QLORA_BASE_FORMAT if request.recipe == Recipe.QLORA else request.dtype
        components += _adapter_states(request, _stored_weights(resident, base_format), trainable,
                                      resident.total, params.total)
    else:
        components += _model_states(request, resident)
    if request.mode == Mode.INFERENCE and request.adapter_bytes:
        # PEFT keeps an unmerged adapter's A and B beside each base matrix (peft tuners/lora/layer.py).
        base = components.pop()
        share = Fraction(resident.total, params.total)
        components.append(Component("weights", base.bytes + math.ceil(request.adapter_bytes * share),
                                    f"{base.formula} + {request.adapter_bytes:,} B of adapter tensors (its "
                                    f"safetensors headers){' x the same share' if share != 1 else ''}"))
    buffers = _buffers(arch, request, stage_layers)
    if buffers.bytes:
        components.insert(1, buffers)  # beside the weights: the model holds both for its whole life
    timeline = _activation_timeline(arch, request, stage, stage_layers)
    activations = timeline.component
    components.append(activations)
    if request.mode == Mode.INFERENCE:
        components.append(_kv_cache(arch, request, stage_layers))
    components.append(_overhead(request, activations.bytes))
    if request.mode == Mode.INFERENCE:
        peak = _all_at_once(components, "prefill")
        peak = replace(peak, formula="prefill: weights" + (" and buffers" if buffers.bytes else "")
                       + " + the whole prompt's KV cache + one layer's live tensors + logits, all alive together")
    else:
        peak = _training_peak(arch, request, stage, components, timeline, resident)
    return DeviceMemory(stage=stage.index, layers=len(stage_layers), params=resident.total,
                        components=tuple(components), peak=peak)


def _all_at_once(components: list[Component], phase: str) -> PeakMoment:
    """A peak where every category is at its own maximum at once (the sum-of-components bound)."""
    per_category = {c.name: c.bytes for c in components if c.name != "overhead"}
    return PeakMoment(bytes=sum(per_category.values()), phase=phase, per_category=per_category,
                      formula="every category at its own maximum at once")


def model_dtype_bytes(request: FitRequest) -> int:
    """Bytes per element of the dtype the model's floating tensors are made in: fp32 for an fp32 model (--recipe
    fp32, hf-amp's fp32 weights under autocast, fp32/tf32 inference weights), else 16-bit (2 B)."""
    return 4 if activation_precision(request) in ("fp32", "amp") else 2


def _buffers(arch: Architecture, request: FitRequest, stage_layers: range) -> Component:
    """The model's buffers on one device (tutor.theory.models.model_buffers): tensors registered as buffers,
    persistent or not, alive for the model's whole life in their own dtype. A decoder layer's go with the layer's
    stage; the model's own (the rotary embedding every layer reads) are on every stage; tensor parallelism
    replicates them (no rank holds a part of a mask or a frequency table)."""
    element = model_dtype_bytes(request)
    n_bytes = 0
    groups: dict[tuple, list] = {}  # buffers alike in shape, dtype, persistence and holders: one phrase
    for kind in model_buffers(arch):
        holders = sum(1 for index in kind.layers if index in stage_layers) if kind.layers else 1
        if not holders:
            continue
        n_bytes += holders * kind.bytes_each(element)
        key = (kind.shape, kind.dtype, kind.element_bytes, kind.persistent, bool(kind.layers), holders)
        groups.setdefault(key, []).append(kind)
    words = []
    for (shape, dtype, element_bytes, persistent, in_layers, holders), kinds in groups.items():
        meaning = ", ".join(kind.meaning for kind in kinds if kind.meaning)
        size = " x ".join(map(str, shape)) or "1"
        what = (f"{' and '.join(kind.name for kind in kinds)}{f' ({meaning})' if meaning else ''} "
                f"[{size} {dtype if element_bytes else f'in the model dtype ({element} B)'}"
                f"{' each' if len(kinds) > 1 else ''}, {'persistent' if persistent else 'non-persistent'}]")
        group_bytes = holders * sum(kind.bytes_each(element) for kind in kinds)
        words.append((f"{holders} layers x {what}" if in_layers else what) + f": {group_bytes:,} B")
    return Component("buffers", n_bytes, " + ".join(words) + (" (replicated on every tp rank)" if request.tp > 1 else "")
                     if words else "no buffers")


def _stored_weights(resident: _StageParams, fmt_name: str) -> Component:
    fmt = weight_format(fmt_name)
    if fmt.name in UNQUANTIZED:
        n_bytes = math.ceil(resident.total * fmt.bits_per_weight / 8)
        return Component("weights", n_bytes, f"{resident.total:,} params x {fmt.bits_per_weight / 8} B ({fmt.name})")
    quantized = math.ceil(resident.quantizable * fmt.bits_per_weight / 8)
    kept = resident.sixteen_bit * 2
    bits = float(fmt.bits_per_weight)
    return Component(
        "weights", quantized + kept,
        f"{resident.quantizable:,} linear weights x {bits:g} bits ({fmt.name}, incl. scales) "
        f"+ {resident.sixteen_bit:,} embedding/head/norm params x 2 B (kept 16-bit)")


def _model_states(request: FitRequest, resident: _StageParams) -> list[Component]:
    """Weights, gradients and optimizer states of full training, sharded by ZeRO stage."""
    per_param = model_state_bytes_per_param(request.recipe, request.optimizer)
    dense = zero_model_states(params=resident.dense, dp=request.dp, stage=request.zero,
                              weight_bytes=per_param.weights, grad_bytes=per_param.gradients,
                              optimizer_bytes=per_param.optimizer)
    expert_dp = request.dp // request.ep
    expert = zero_model_states(params=resident.expert, dp=expert_dp, stage=request.zero,
                               weight_bytes=per_param.weights, grad_bytes=per_param.gradients,
                               optimizer_bytes=per_param.optimizer) if resident.expert else None
    shard = {0: (), 1: ("optimizer",), 2: ("optimizer", "gradients"), 3: ("optimizer", "gradients", "weights")}
    sharded = shard[request.zero]

    def formula(name: str, per: Fraction) -> str:
        base = f"{resident.total:,} params x {float(per):g} B"
        if name in sharded and request.dp > 1:
            base += f" / dp {request.dp} (ZeRO-{request.zero})"
        return base + f" [{request.recipe} + {request.optimizer}]"

    def total(field_name: str) -> int:
        return getattr(dense, field_name) + (getattr(expert, field_name) if expert else 0)

    weights = Component("weights", total("weights"), formula("weights", per_param.weights))
    if request.impl == Impl.HF and training_recipe(request.recipe).name == Recipe.HF_AMP:
        weights = _autocast_weights(request, resident, dense, expert)
    return [
        weights,
        Component("gradients", total("gradients"), formula("gradients", per_param.gradients)),
        Component("optimizer", total("optimizer"), formula("optimizer", per_param.optimizer)),
    ]


def _autocast_weights(request: FitRequest, resident: _StageParams, dense, expert) -> Component:
    """--recipe hf-amp, --impl hf: the fp32 weights (4 B/param, the master) plus the 16-bit copy
    autocast makes of each parameter it casts (2 B each; `autocast_cast_parameters`), not of
    every parameter as the 6 B/param convention assumes (transformers model_memory_anatomy.md)."""
    fp32 = zero_model_states(params=resident.dense, dp=request.dp, stage=request.zero, weight_bytes=4,
                             grad_bytes=0, optimizer_bytes=0).weights
    if expert is not None:
        fp32 += zero_model_states(params=resident.expert, dp=request.dp // request.ep, stage=request.zero,
                                  weight_bytes=4, grad_bytes=0, optimizer_bytes=0).weights
    copies = zero_model_states(params=resident.autocast_cast, dp=request.dp, stage=request.zero, weight_bytes=2,
                               grad_bytes=0, optimizer_bytes=0).weights
    zero = f" / dp {request.dp} (ZeRO-{request.zero})" if request.zero >= ZeroStage.PARAMETERS and request.dp > 1 else ""
    return Component("weights", fp32 + copies,
                     f"{resident.total:,} params x 4 B (fp32) + {resident.autocast_cast:,} params autocast casts "
                     f"(linear and matmul weights; not embeddings, norms or grouped experts) x 2 B{zero} "
                     f"[{request.recipe} + {request.optimizer}]")


def _adapter_states(request: FitRequest, base: Component, trainable: int, resident_params: int,
                    total_params: int) -> list[Component]:
    """LoRA/QLoRA: the frozen base (no gradients, no optimizer) plus adapters trained with mixed
    precision (2 + 2 + 12 B/param with Adam), spread over devices in the same share as the base."""
    on_device = math.ceil(trainable * Fraction(resident_params, total_params))
    per_param = model_state_bytes_per_param(Recipe.MIXED, request.optimizer)
    label = f"{on_device:,} LoRA params (r={request.lora_rank}, {','.join(request.lora_targets)})"
    return [
        Component("weights", base.bytes + math.ceil(on_device * per_param.weights),
                  f"frozen base: {base.formula}; + {label} x {float(per_param.weights):g} B"),
        Component("gradients", math.ceil(on_device * per_param.gradients),
                  f"{label} x {float(per_param.gradients):g} B (the frozen base has none)"),
        Component("optimizer", math.ceil(on_device * per_param.optimizer),
                  f"{label} x {float(per_param.optimizer):g} B "
                  f"[{request.recipe}: adapters in mixed precision + {request.optimizer}]"),
    ]


class _LayerShape(TypedDict):
    """One layer's shape, as the activation formulas (activation_bytes_per_layer) take it."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    gated_mlp: bool
    dropout: bool


class _ActivationRun(TypedDict):
    """The rest of the activation formulas' arguments: the batch, attention and layout of a request."""

    seq_len: int
    batch: int
    attention: str
    tp: int
    sequence_parallel: bool
    bytes_per_value: int


def _layer_shape(arch: Architecture, is_moe: bool) -> _LayerShape:
    """Arguments of the activation formulas for one layer.

    MoE: each token passes through top-k experts plus the shared ones, so the MLP activations
    are those of an MLP of width k x expert + shared. MLA: K and V are expanded per head in
    training (transformers DeepseekV3Attention), i.e. heads x head_dim like MHA.
    """
    ffn = (arch.experts_per_token * arch.moe_intermediate_size + arch.shared_expert_intermediate_size
           if is_moe else arch.intermediate_size)
    kv_heads = arch.num_heads if arch.uses_mla else arch.num_kv_heads
    return _LayerShape(hidden=arch.hidden_size, heads=arch.num_heads, kv_heads=kv_heads, head_dim=arch.head_dim,
                       ffn=ffn, gated_mlp=arch.gated_mlp, dropout=arch.dropout)


def activation_precision(request: FitRequest) -> str:
    """The activations' precision (tutor.theory.activations.PRECISIONS) a request implies:
    fp32 for --recipe fp32 (training) or fp32/tf32 weights (inference), amp for --recipe hf-amp
    (fp32 weights under torch.autocast), else bf16 (16-bit models, and LoRA/QLoRA's bf16 compute)."""
    if request.mode == Mode.TRAIN and not request.adapter:
        return {Recipe.FP32: "fp32", Recipe.HF_AMP: "amp"}.get(Recipe(training_recipe(request.recipe).name), "bf16")
    if request.mode == Mode.INFERENCE and request.stored_weight_bytes is None:
        return "fp32" if weight_format(request.dtype).name in ("fp32", "tf32") else "bf16"
    return "bf16"


@dataclass(frozen=True)
class _ActivationTimeline:
    """Activation bytes at the moments of a training step that can hold the peak.

    stored: what forward keeps for backward (layers x micro-batches in flight, embedding, head);
    loss_forward / loss_backward: what the loss head holds on top of that while cross-entropy runs
    forward / at the start of backward; layers_part: the stored bytes that belong to the layers
    (freed layer by layer in backward); component: the activations' own maximum.
    """

    component: Component
    stored: int
    loss_forward: int = 0
    loss_backward: int = 0
    layers_part: int = 0
    head: int = 0        # stored bytes of the loss head (final norm, lm_head input, log-softmax ...):
                         # freed by the head's backward, before any checkpointed layer is re-run
    reruns: tuple = ()   # full recompute (hf): the `_RerunMoment`s inside the re-run layers' backward
    core_forward: int = 0  # math SDPA: the activations at the end of the last layer's attention core


def _calibration_key(arch: Architecture, request: FitRequest) -> str:
    """The calibrated setup that answers `request`: traced at its own shape where the fit at small shapes
    missed its check (tutor.trace.arch_calibration.AT_SHAPE_ERROR) and that trace was made, else the fit."""
    window = arch.calibration.window if arch.calibration is not None else 0
    key = setup_key(mode=request.mode, precision=activation_precision(request), attention=request.attention,
                    recompute=request.recompute, seq_len=request.seq_len, window=window)
    at_shape = at_shape_key(key, request.batch, request.seq_len)
    return at_shape if calibrated_setup(arch, at_shape) is not None else key


def _traced_whole(setup) -> bool:
    """Whether a calibrated setup is one trace of the whole model (tutor.trace.arch_calibration.whole_model_setup:
    one traced depth, the model's own), not a fit over two small depths."""
    return len(setup.fitted_shapes) == 1 and setup.fitted_shapes[0][0] == setup.check[0]


def _calibrated_timeline(arch: Architecture, request: FitRequest, stage, stage_layers: range,
                         calibrated) -> _ActivationTimeline:
    """A calibrated-trace architecture (tutor.theory.calibrated): the fitted head + per-layer terms
    at this stage's layers and shape (the head on the last stage only; split over tp)."""
    b, s, t, n = request.batch, request.seq_len, request.tp, len(stage_layers)
    last = stage.index == request.pp - 1
    if calibrated.key.endswith(at_shape_key("", b, s)) and _traced_whole(calibrated):
        where = (f"trace of the whole {arch.calibration.model_class} ({calibrated.check[0]} layers) at this shape "
                 f"({calibrated.key}), its bytes shared evenly by the layers: {n} of them here"
                 + (f", / tp {t}" if t > 1 else ""))
    elif calibrated.key.endswith(at_shape_key("", b, s)):
        where = (f"trace of {arch.calibration.model_class} at this shape ({calibrated.key}; the fit at small shapes "
                 f"missed its check): head + {n} layers x the per-layer bytes traced at {calibrated.fitted_shapes[0][0]} "
                 f"and {calibrated.fitted_shapes[-1][0]} layers" + (f", / tp {t}" if t > 1 else ""))
    else:
        padded = (f", b·S (the prompt padded to whole {arch.calibration.chunk}-token chunks of the scan)"
                  if arch.calibration.chunk else "")
        where = (f"calibrated trace of {arch.calibration.model_class} ({calibrated.key}): fitted head + {n} layers x "
                 f"per-layer terms in b, b·s, b·s²{padded} (checked at {calibrated.check[0]} layers, "
                 f"{calibrated.check[1]} x {calibrated.check[2]} tokens: {calibrated.check_error:.1%} off)"
                 + (f", / tp {t}" if t > 1 else ""))
    if request.mode == Mode.INFERENCE:
        peak, region = prefill_peak(calibrated, batch=b, seq_len=s, layers=n)
        component = Component("activations", math.ceil(Fraction(peak, t)), f"prefill peak in the {region}: {where}")
        return _ActivationTimeline(component, component.bytes)
    in_flight = pipeline_activation_multiplier(pp=request.pp, microbatches=request.microbatches or request.pp,
                                               stage=stage.index)
    timeline = training_timeline(calibrated, batch=b, seq_len=s, layers=n, head=last, layer_copies=float(in_flight),
                                 tp=t)
    component = Component("activations", timeline.maximum, f"the step's activation maximum: {where}")
    # _training_peak adds a tied embedding's unsummed gradients at the end of backward; the trace has them.
    layers_part = timeline.stored - timeline.end_of_backward + _tied_gradient_bytes(arch, request, stage)
    reruns = tuple(_RerunMoment(f"backward, the {name} moment of the traced step ({where})", acts,
                                min(grads, count_parameters(arch).total), copies)
                   for name, acts, grads, copies in timeline.moments)
    return _ActivationTimeline(component, timeline.stored, layers_part=layers_part, reruns=reruns)


def _activation_timeline(arch: Architecture, request: FitRequest, stage, stage_layers: range) -> _ActivationTimeline:
    calibrated = calibrated_setup(arch, _calibration_key(arch, request))
    if calibrated is not None and len(stage_layers):
        return _calibrated_timeline(arch, request, stage, stage_layers, calibrated)
    if request.mode == Mode.INFERENCE:
        component = _inference_activations(arch, request, stage_layers)
        return _ActivationTimeline(component, component.bytes)
    if request.impl == Impl.HF:
        return _hf_training_activations(arch, request, stage, stage_layers)
    component = _activations(arch, request, stage, stage_layers)
    return _ActivationTimeline(component, component.bytes, layers_part=component.bytes)


def _hf_attention_backend(arch: Architecture, request: FitRequest) -> str:
    return hf_attention_backend(request.attention, gpu=request.gpu, dropout=arch.dropout and request.mode == Mode.TRAIN,
                                head_dim=arch.head_dim, v_head_dim=arch.v_head_dim if arch.uses_mla else arch.head_dim,
                                model_type=arch.model_type)


def _hf_training_activations(arch: Architecture, request: FitRequest, stage, stage_layers: range) -> _ActivationTimeline:
    """transformers modules as written (tutor.theory.activations, hf profile): per-layer saved
    tensors x micro-batches in flight, the embedding and loss-head tensors, and the loss head's
    transient (the fp32 log-softmax and two fp32 s·V gradients at the start of backward)."""
    s, b, t = request.seq_len, request.batch, request.tp
    precision = activation_precision(request)
    backend = _hf_attention_backend(arch, request)
    microbatches = request.microbatches or request.pp
    in_flight = pipeline_activation_multiplier(pp=request.pp, microbatches=microbatches, stage=stage.index)
    common = dict(seq_len=s, batch=b, precision=precision, backend=backend, gpu=request.gpu, tp=t,
                  sequence_parallel=request.sequence_parallel)
    flags = arch.layer_is_moe
    moe_count = sum(flags[i] for i in stage_layers)
    per_shape = {is_moe: (count, _hf_layer_bytes(arch, is_moe, common, request.recompute))
                 for is_moe, count in _layer_shape_counts(arch, stage_layers)}
    layers_part = math.ceil(sum(count * n for count, n in per_shape.values()) * in_flight)
    formula = (f"{len(stage_layers)} layers x transformers per-layer bytes ({precision}, {backend} attention, "
               f"recompute {request.recompute}) x {float(in_flight):g} micro-batches in flight")
    stored = layers_part
    shape = hf_layer_shape(arch, moe_layer=bool(moe_count) and moe_count == len(stage_layers))
    model_terms = hf_model_activation_terms(shape, seq_len=s, batch=b, vocab=arch.vocab_size, precision=precision,
                                            gpu=request.gpu, tp=t, final_softcap=arch.model_type == "gemma2")
    loss_forward = loss_backward = head = 0
    if stage.input_embedding:
        stored += math.ceil(sum(term.bytes for term in model_terms if term.block == "embedding") * in_flight)
        formula += " + token ids"
    if stage.index == request.pp - 1:
        head = math.ceil(sum(term.bytes for term in model_terms if term.block == "head"))
        stored += head
        loss_forward = hf_loss_forward_extra_bytes(seq_len=s, batch=b, vocab=arch.vocab_size, precision=precision, tp=t)
        loss_backward = hf_loss_backward_extra_bytes(seq_len=s, batch=b, vocab=arch.vocab_size, tp=t)
        formula += " + final norm, lm_head input, fp32 log-softmax (4 s b V) and 2 fp32 s b V loss gradients"
    core_forward = 0
    if request.recompute != Recompute.FULL and len(stage_layers):
        core_forward = _hf_core_forward_bytes(arch, request, stage, stage_layers, common,
                                              before=stored - head - _hf_layer_bytes(
                                                  arch, flags[stage_layers[-1]], common, request.recompute))
        if core_forward:
            formula += " + the last layer's math-SDPA attention core in forward"
    reruns: tuple[_RerunMoment, ...] = ()
    if request.recompute == Recompute.FULL and len(stage_layers):
        reruns = _hf_rerun_moments(arch, request, stage, stage_layers, common, precision, backend,
                                   other=stored - layers_part - head, layers_part=layers_part)
        formula += " + the re-run layer's tensors and gradients in its backward"
    component = Component("activations", max([stored + max(loss_forward, loss_backward), core_forward]
                                             + [m.activations for m in reruns]), formula)
    return _ActivationTimeline(component, stored, loss_forward, loss_backward, layers_part, head, reruns, core_forward)


def _hf_core_forward_bytes(arch: Architecture, request: FitRequest, stage, stage_layers: range, common: dict, *,
                           before: int) -> int:
    """Math SDPA (`hf_attention_core_terms`): activations at the end of the stage's last layer's attention
    core in forward, 0 for another backend. `before`: what the earlier layers and the embedding saved (the
    stored bytes less the head's and this layer's); the model's forward also holds the embedding output,
    the layer's input, the position ids and RoPE's cos and sin (`hf_prefill_held_bytes`, its token ids
    already in `before`; the residual stream fp32 under autocast), one tensor where the layer's input is
    the embedding output itself."""
    shape = hf_layer_shape(arch, moe_layer=arch.layer_is_moe[stage_layers[-1]])
    core = hf_attention_core_terms(shape, **common)
    if not core:
        return 0
    s, b = request.seq_len, request.batch
    precision = common["precision"]
    masks = hf_attention_mask_bytes(seq_len=s, batch=b, backend=common["backend"], precision=precision,
                                    model_type=arch.model_type)
    held = hf_prefill_held_bytes(shape, seq_len=s, batch=b, precision="fp32" if precision == "amp" else precision,
                                 mask_bytes=masks) - input_ids_bytes(s, b)
    if stage.input_embedding and len(stage_layers) == 1:
        held -= (4 if precision in ("fp32", "amp") else 2) * s * b * arch.hidden_size
    return before + held + math.ceil(sum(term.bytes for term in core))


@dataclass(frozen=True)
class _RerunMoment:
    """A moment inside backward (full recompute: inside a re-run layer's; a calibrated trace: each
    traced moment): activations, the parameters whose gradients exist by then, which `_training_peak`
    turns into bytes, and (a trace under torch.autocast) the bytes of autocast's 16-bit weight copies
    still alive (None: all of them, as at the end of forward)."""

    formula: str
    activations: int
    gradient_params: int
    weight_copies: int | None = None


def _layer_resident_params(arch: Architecture, layer: LayerParams, expert_params: int, request: FitRequest,
                           mlp_only: bool = False) -> int:
    """Parameters of one layer on one device (as `_stage_params` counts them: `_layer_split`)."""
    return sum(_layer_split(arch, layer, expert_params, request.tp, request.ep, mlp_only=mlp_only))


def _hf_layer_bytes(arch: Architecture, is_moe: bool, common: dict, recompute: str) -> int:
    """Bytes one transformers layer of this shape keeps for backward (hf_layer_activation_terms)."""
    terms = hf_layer_activation_terms(hf_layer_shape(arch, moe_layer=is_moe), **common, recompute=recompute)
    return math.ceil(sum(term.bytes for term in terms))


def _hf_rerun_moments(arch: Architecture, request: FitRequest, stage, stage_layers: range, common: dict,
                      precision: str, backend: str, *, other: int, layers_part: int) -> tuple[_RerunMoment, ...]:
    """Full recompute (transformers' gradient_checkpointing_enable, non-reentrant): the moments while
    backward re-runs a layer and goes back through it (`hf_rerun_layer_moments`), for the first layer
    re-run (the last one: every checkpoint still alive, only the head's gradients exist) and the last
    one re-run (the first layer: one checkpoint left, every other layer's gradient exists). Every
    checkpoint also holds the layer's other inputs: the attention masks (eager) and RoPE's cos and
    sin. Measured per layer on transformers 5.24 (benchmarks/fit_vs_transformers.py --config recompute)."""
    s, b, t = request.seq_len, request.batch, request.tp
    flags = arch.layer_is_moe
    layers = parameters_per_layer(arch)
    params = count_parameters(arch)
    resid = 4 if precision in ("fp32", "amp") else 2
    sliding = [arch.layer_uses_sliding_window[i] for i in stage_layers]
    kinds = 2 if any(sliding) and not all(sliding) else 1
    masks_all = hf_attention_mask_bytes(seq_len=s, batch=b, backend=backend, precision=precision,
                                        mask_kinds=kinds, model_type=arch.model_type)
    masks_one = hf_attention_mask_bytes(seq_len=s, batch=b, backend=backend, precision=precision,
                                        mask_kinds=1, model_type=arch.model_type)
    rotary = 2 * resid * s * (arch.qk_rope_head_dim if arch.uses_mla else arch.head_dim) \
        if not arch.learned_positions else 0
    head_params = 0
    tied_partial = 0
    if stage.index == request.pp - 1:
        lm_head = math.ceil(Fraction(params.lm_head or params.embedding, t))
        final_norm = params.total - params.embedding - params.lm_head - params.position_embedding - sum(
            layer.total for layer in layers)
        head_params = final_norm
        if params.lm_head:
            head_params += lm_head
        else:
            # Tied: lm_head's gradient is a free tensor until the embedding's backward adds it to .grad.
            tied_partial = math.ceil(lm_head * model_state_bytes_per_param(request.recipe, request.optimizer).gradients)

    moments = []
    first, last = stage_layers[0], stage_layers[-1]
    cases = [("last layer re-run first: every checkpoint", last, layers_part + masks_all, head_params)]
    if first != last:
        # The layers after the first, counted per shape (dense, MoE): each shape's figures once.
        later_counts = _layer_shape_counts(arch, stage_layers[1:])
        shape_layer = {is_moe: next(layers[i] for i in stage_layers if flags[i] == is_moe)
                       for is_moe, _ in later_counts}
        later = sum(count * _layer_resident_params(arch, shape_layer[is_moe], params.expert, request)
                    for is_moe, count in later_counts)
        one_left = layers_part - sum(count * _hf_layer_bytes(arch, is_moe, common, Recompute.FULL)
                                     for is_moe, count in later_counts)
        cases.append(("first layer re-run last: one checkpoint, every later layer's gradients", first,
                      one_left + masks_one, head_params + later))
    for label, index, checkpoints, grads in cases:
        shape = hf_layer_shape(arch, moe_layer=flags[index])
        inner = hf_rerun_layer_moments(shape, **common)
        mlp_params = _layer_resident_params(arch, layers[index], params.expert, request, mlp_only=True)
        for name, terms in inner.items():
            acts = other + checkpoints + rotary + tied_partial + math.ceil(sum(term.bytes for term in terms))
            moments.append(_RerunMoment(f"backward, {label} ({name})", acts,
                                        grads + (mlp_params if name == "attention backward" else 0)))
    return tuple(moments)


def _optimizer_temporaries(arch: Architecture, request: FitRequest, resident: _StageParams) -> tuple[int, str]:
    """Bytes optimizer.step() allocates beyond its states, and why.

    torch.optim.Adam/AdamW (torch/optim/adam.py): the single-tensor path computes
    `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)` one parameter at a time (the
    sqrt and the quotient, two tensors of the largest parameter, alive together); the foreach path
    (`_multi_tensor_adam`) computes `exp_avg_sq_sqrt = torch._foreach_sqrt(device_exp_avg_sqs)` for
    the whole group at once: one state-sized temporary per parameter. torch picks foreach by default
    only for CUDA tensors (torch/optim/optimizer.py `_default_to_fused_or_foreach`; torch/utils/
    _foreach_utils.py `_get_foreach_kernels_supported_devices`: cuda, xpu, mtia), so a CPU runs
    single-tensor Adam. Other optimizers update in place (counted as 0).
    """
    if request.adapter or request.optimizer.replace("_", "-") not in ("adam", "adamw", "adam-8bit"):
        return 0, "no temporaries counted for this optimizer"
    state_bytes = training_recipe(request.recipe).state_bytes
    if request.gpu:
        shard = resident.dense / (request.dp if request.zero >= ZeroStage.OPTIMIZER else 1)
        if resident.expert:
            shard += resident.expert / ((request.dp // request.ep) if request.zero >= ZeroStage.OPTIMIZER else 1)
        return (math.ceil(shard * state_bytes),
                f"foreach AdamW (CUDA default): sqrt(v) for every parameter at once, {float(state_bytes):g} B each")
    h = arch.hidden_size
    largest = arch.measured.largest if arch.measured is not None else max(
        arch.vocab_size * h, arch.intermediate_size * h,
        # grouped experts: one (E, 2f, h) tensor, where a layer has experts (a config may name experts and
        # make every layer dense: DeepSeek-V3 with first_k_dense_replace past its layer count)
        2 * arch.num_experts * arch.moe_intermediate_size * h if arch.is_moe else 0)
    largest = math.ceil(Fraction(largest, request.tp))
    return (math.ceil(2 * largest * state_bytes),
            f"single-tensor AdamW (CPU): sqrt(v) and sqrt(v)/c of the largest parameter ({largest:,} elements)")


def _autocast_copy_bytes(request: FitRequest, resident: _StageParams) -> int:
    """--recipe hf-amp, --impl hf: bytes of autocast's 16-bit weight copies on this device
    (`autocast_cast_parameters`; part of the weights component), else 0."""
    if request.impl != Impl.HF or request.mode != Mode.TRAIN or request.adapter \
            or training_recipe(request.recipe).name != Recipe.HF_AMP:
        return 0
    return zero_model_states(params=resident.autocast_cast, dp=request.dp, stage=request.zero, weight_bytes=2,
                             grad_bytes=0, optimizer_bytes=0).weights


def _tied_gradient_bytes(arch: Architecture, request: FitRequest, stage) -> int:
    """Bytes of the two extra V x h gradients of a tied embedding at the end of backward (lm_head's and
    the embedding's, before autograd sums them into .grad), when one device holds both uses."""
    # pipeline_stages: a tied model's single stage has the embedding and no separate head (it is the same weight).
    if not (arch.tie_word_embeddings and stage.input_embedding and stage.index == request.pp - 1) or request.adapter:
        return 0
    per_element = model_state_bytes_per_param(request.recipe, request.optimizer).gradients
    return math.ceil(2 * Fraction(arch.vocab_size * arch.hidden_size, request.tp) * per_element)


def _training_peak(arch: Architecture, request: FitRequest, stage, components: list[Component],
                   timeline: _ActivationTimeline, resident: _StageParams) -> PeakMoment:
    """The largest of the moments of a steady-state step (optimizer states exist, gradients were
    set to None by zero_grad): end of forward, start of backward (the loss head's transient), end
    of backward (every gradient, activations freed layer by layer) and optimizer.step()."""
    by_name = {c.name: c.bytes for c in components}
    weights, grads, states = by_name.get("weights", 0), by_name.get("gradients", 0), by_name.get("optimizer", 0)
    buffers = by_name.get("buffers", 0)  # alive at every moment, beside the weights
    temporaries, why = _optimizer_temporaries(arch, request, resident)
    # End of backward: the layers' and the loss head's tensors are freed; the embedding's (token ids)
    # go last, with the embedding backward. A tied embedding is used twice, so autograd holds the
    # lm_head's weight gradient until the embedding's arrives, then adds them: three V x h
    # gradients alive at once before the sum becomes .grad (measured with tutor.trace.memory_trace).
    remaining = timeline.stored - timeline.layers_part - timeline.head + _tied_gradient_bytes(arch, request, stage)
    # Autocast's 16-bit weight copies are saved for backward and freed by it: gone by its end.
    masters = weights - _autocast_copy_bytes(request, resident)
    moments = [
        ("forward", timeline.stored + timeline.loss_forward, 0, 0, weights,
         "end of forward: every layer's saved tensors + the loss head running forward"),
        ("forward", timeline.core_forward, 0, 0, weights,
         "forward, the last layer's attention core (math SDPA): the earlier layers' saved tensors + its own "
         "up to the core + the kernel's fp32 copies, scores and casts"),
        ("backward", timeline.stored + timeline.loss_backward, 0, 0, weights,
         "start of backward: every layer's saved tensors + the loss head's fp32 gradients, no parameter gradient yet"),
        ("backward", remaining, grads, 0, masters,
         "end of backward: every gradient exists, the layers' activations are freed"
         + (" (a tied embedding's two gradients still unsummed)" if _tied_gradient_bytes(arch, request, stage) else "")),
        ("optimizer", 0, grads, temporaries, masters,
         "inside optimizer.step(), after backward freed the activations: every weight, gradient and optimizer "
         f"state at once, plus the step's temporaries ({why})"),
    ]
    for rerun in timeline.reruns:
        rerun_grads = math.ceil(Fraction(grads * rerun.gradient_params, max(resident.total, 1)))
        # Each autocast copy is saved by its layer's forward and freed by its backward: a traced moment
        # late in backward holds few of them, beside most of the gradients.
        alive = weights if rerun.weight_copies is None else masters + min(rerun.weight_copies, weights - masters)
        moments.append(("backward", rerun.activations, rerun_grads, 0, alive,
                        f"{rerun.formula}: its tensors + the checkpoints + the gradients made so far"
                        + (f" + the {rerun.weight_copies:,} B of autocast weight copies still alive"
                           if rerun.weight_copies is not None and alive != weights else "")))
    phase, acts, grad_bytes, temp, weight_bytes, formula = max(moments, key=lambda m: m[1] + m[2] + m[3] + m[4])
    per_category = {"weights": weight_bytes, "buffers": buffers, "gradients": grad_bytes, "optimizer": states,
                    "activations": acts, "kv_cache": 0, "optimizer_temporaries": temp}
    if request.zero >= ZeroStage.GRADIENTS and request.dp > 1:
        formula += f"; gradients sharded over dp {request.dp} (ZeRO-{request.zero}), buckets not counted"
    return PeakMoment(bytes=sum(per_category.values()), phase=phase, per_category=per_category, formula=formula)


def _activations(arch: Architecture, request: FitRequest, stage, stage_layers: range) -> Component:
    s, b, t = request.seq_len, request.batch, request.tp
    microbatches = request.microbatches or request.pp
    in_flight = pipeline_activation_multiplier(pp=request.pp, microbatches=microbatches, stage=stage.index)
    common = _ActivationRun(seq_len=s, batch=b, attention=request.attention, tp=t,
                            sequence_parallel=request.sequence_parallel,
                            bytes_per_value=4 if activation_precision(request) == "fp32" else 2)
    moe_flags = arch.layer_is_moe
    stored = sum(count * activation_bytes_per_layer(**common, **_layer_shape(arch, is_moe),
                                                    recompute=request.recompute)
                 for is_moe, count in _layer_shape_counts(arch, stage_layers))
    n_bytes = stored * in_flight
    formula = (f"{len(stage_layers)} layers x Korthikanti per-layer bytes (recompute {request.recompute}, "
               f"{request.attention}) x {float(in_flight):g} micro-batches in flight")
    if request.recompute == Recompute.FULL and len(stage_layers):
        # Backward recomputes one layer at a time; its full activations live while it is done.
        n_bytes += activation_bytes_per_layer(**common, **_layer_shape(arch, moe_flags[stage_layers[0]]),
                                              recompute=Recompute.NONE)
        formula += " + one layer recomputed"
    if stage.input_embedding:
        n_bytes += input_ids_bytes(s, b) * in_flight
        formula += " + token ids"
    if stage.index == request.pp - 1:
        n_bytes += logits_bytes(seq_len=s, batch=b, vocab=arch.vocab_size, tp=t, fp32_loss=True)
        formula += " + logits and fp32 loss (10 s b V / t)"
    return Component("activations", math.ceil(n_bytes), formula)


def _inference_activations(arch: Architecture, request: FitRequest, stage_layers: range) -> Component:
    """Prefill of the whole batch: one layer's tensors at a time (the rest are freed), plus the
    fp32 logits of the last position of each sequence (what generation samples from)."""
    if not len(stage_layers):
        return Component("activations", 0, "no layers on this stage")
    flags = arch.layer_is_moe
    precision = activation_precision(request)
    if request.impl == Impl.HF:
        backend = _hf_attention_backend(arch, request)
        s, b = request.seq_len, request.batch
        sliding = any(arch.layer_uses_sliding_window[i] for i in stage_layers)
        kinds = 2 if sliding and not all(arch.layer_uses_sliding_window[i] for i in stage_layers) else 1
        masks = hf_attention_mask_bytes(seq_len=s, batch=b, backend=backend, precision=precision,
                                        mask_kinds=kinds, model_type=arch.model_type)
        moments: dict[str, int] = {}
        for is_moe in {flags[i] for i in stage_layers}:
            shape = hf_layer_shape(arch, moe_layer=is_moe)
            for name, n in hf_prefill_moments(shape, seq_len=s, batch=b, vocab=arch.vocab_size, precision=precision,
                                              backend=backend, tp=request.tp, gpu=request.gpu,
                                              mask_bytes=masks).items():
                moments[name] = max(moments.get(name, 0), n)
        moment = max(moments, key=moments.__getitem__)
        return Component("activations", moments[moment],
                         f"prefill as generate() runs it (transformers, {precision}, {backend} attention; "
                         f"logits_to_keep=1), peak at the {moment} moment: ids, embedding output, layer input, "
                         f"positions{', masks' if masks else ''} + that moment's tensors over {b} x {s} tokens")
    peak = 0
    for is_moe in {flags[i] for i in stage_layers}:
        # Inference runs the model in eval mode: dropout is off whatever the config says.
        eval_shape = _layer_shape(arch, is_moe)
        eval_shape["dropout"] = False
        terms = layer_activation_terms(seq_len=request.seq_len, batch=request.batch, attention=request.attention,
                                       tp=request.tp, bytes_per_value=4 if precision == "fp32" else 2, **eval_shape)
        attention_part = sum(t.bytes for t in terms if t.block == "attention")
        mlp_part = sum(t.bytes for t in terms if t.block == "mlp")
        peak = max(peak, math.ceil(max(attention_part, mlp_part)))
    logits = 4 * request.batch * arch.vocab_size
    peak = math.ceil(peak)
    return Component("activations", peak + logits,
                     f"largest block (attention or MLP) of one layer over {request.batch} x {request.seq_len} "
                     f"tokens ({request.attention}) + last-token logits 4 b V")


def _kv_cache(arch: Architecture, request: FitRequest, stage_layers: range) -> Component:
    kv_name = request.kv_dtype or (request.dtype if weight_format(request.dtype).name in SIXTEEN_BIT else "bf16")
    element = kv_dtype_bytes(kv_name)
    if not len(stage_layers):
        return Component("kv_cache", 0, "no layers on this stage")
    calibrated = calibrated_setup(arch, _calibration_key(arch, request))
    # The model's cache layers of each kind on this stage (its share of the decoder layers).
    share = Fraction(len(stage_layers), arch.num_layers)
    cache_layers = tuple((kind, float(count * share)) for kind, count in
                         (arch.calibration.cache_layers if arch.calibration is not None else ()))
    traced = None if calibrated is None else calibrated_kv_cache_bytes(
        calibrated, batch=request.batch, seq_len=request.seq_len, layers=len(stage_layers), element_bytes=element,
        tp=request.tp, cache_layers=cache_layers)
    parts = None if calibrated is None else cache_parts(calibrated, batch=request.batch, seq_len=request.seq_len,
                                                        cache_layers=cache_layers)
    if traced is not None and parts is not None:
        return Component("kv_cache", traced, _cache_per_kind_formula(arch, request, cache_layers, parts, element,
                                                                      kv_name))
    if traced is not None:
        return Component("kv_cache", traced, f"{len(stage_layers)} layers x the traced cache per layer (fitted in b·s; "
                         f"{arch.calibration.model_class}) x {request.batch} x {request.seq_len} tokens, "
                         f"{element} B ({kv_name})" + (f" / tp {request.tp}" if request.tp > 1 else ""))
    sliding = [i for i in stage_layers if arch.layer_uses_sliding_window[i]]
    kv_heads = 1 if arch.uses_mla else arch.num_kv_heads
    # transformers: right after prefill a sliding layer's storage holds the whole prompt (the window
    # is a view of it) until the first decode step; that is the peak generate() meets.
    windowed = sliding if request.impl == Impl.FUSED else []
    n_bytes = kv_cache_bytes(layer_widths=[arch.kv_cache_width_per_layer] * len(stage_layers),
                             seq_len=request.seq_len, batch=request.batch, bytes_per_element=element,
                             sliding_window=arch.sliding_window if windowed else None,
                             sliding_layers=len(windowed), tp=request.tp, kv_heads=kv_heads)
    width = ("(kv_lora_rank + rope dim) latent" if arch.uses_mla
             else f"2 x {arch.num_kv_heads} KV heads x {arch.head_dim}")
    formula = (f"{len(stage_layers)} layers x {width} x {request.seq_len} tokens x {request.batch} seqs"
               f" x {element} B ({kv_name})")
    if windowed:
        formula += f"; {len(sliding)} sliding-window layers cap at {arch.sliding_window} tokens (a serving engine's allocation)"
    elif sliding and arch.sliding_window is not None and request.seq_len > arch.sliding_window:
        formula += (f"; the {len(sliding)} sliding-window layers too: right after prefill transformers' cache "
                    f"holds the whole prompt (cropped to {arch.sliding_window} tokens at the first decode step)")
    if request.tp > 1:
        formula += f"; / tp {request.tp} (at least one KV head per rank)"
    return Component("kv_cache", n_bytes, formula)


def _cache_per_kind_formula(arch: Architecture, request: FitRequest, cache_layers: tuple[tuple[str, float], ...],
                            parts: dict[tuple[str, str], float], element: float, kv_name: str) -> str:
    """The words of a cache counted per kind of layer (tutor.theory.calibrated.cache_parts): how many layers of
    each kind of the model's cache, what each keeps (keys and values for the prompt, or a conv and recurrent
    state per sequence) and its traced bytes at this shape."""
    counts = dict(cache_layers)
    state = any(part == "state" and n for (_kind, part), n in parts.items())
    pieces = []
    for (kind, part), n in parts.items():
        if not n:
            continue
        what = (f"keys and values of {request.batch} x {request.seq_len} tokens, {element:g} B ({kv_name})"
                if part == "kv" else f"conv and recurrent state of {request.batch} sequence{'s' if request.batch != 1 else ''} "
                                          "(constant in the prompt)")
        pieces.append(f"{counts[kind]:g} {kind} x {what}: {n:,.0f} B traced")
    name = "KV cache and recurrent state" if state else "KV cache"
    return (f"{name}, per kind of layer of {arch.calibration.model_class}'s cache (traced per layer): "
            + ("; ".join(pieces) or "no layer keeps a cache")
            + (f"; / tp {request.tp}" if request.tp > 1 else ""))


def _overhead(request: FitRequest, activation_bytes: int) -> Component:
    """Explicit runtime terms: the CUDA context (GPU only) and allocator slack on the transient
    activations (weights and states are allocated once, in large blocks that waste little)."""
    slack = math.ceil(activation_bytes * ALLOCATOR_SLACK_FRACTION)
    # The fraction is the CUDA caching allocator's (reserved / allocated in a PEFT run); a CPU-only
    # machine allocates through malloc, for which nothing here measured a figure.
    measured = "PEFT reserved/allocated" if request.gpu else (
        "the CUDA caching allocator's, from a PEFT run, assumed for CPU RAM: not measured there")
    parts = [f"allocator slack {float(ALLOCATOR_SLACK_FRACTION):.0%} of activations ({measured})"]
    n_bytes = slack
    if request.gpu:
        context = cuda_context_overhead_bytes()
        n_bytes += context.bytes
        parts.insert(0, f"CUDA context {context.bytes / GiB:.2f} GiB (measured by HF on a V100)")
    return Component("overhead", n_bytes, " + ".join(parts))


def _notes(arch: Architecture, request: FitRequest) -> tuple[str, ...]:
    notes = [arch.profile_note] if arch.profile_note else []
    key = _calibration_key(arch, request)
    if arch.calibration is not None and key.endswith(at_shape_key("", request.batch, request.seq_len)):
        fitted = calibrated_setup(arch, key[: -len(at_shape_key("", request.batch, request.seq_len))])
        traced = calibrated_setup(arch, key)
        if traced is not None and _traced_whole(traced):
            notes.append(f"{arch.calibration.model_class} cannot be rebuilt at fewer layers (its code failed there): "
                         f"its whole {traced.check[0]} layers were traced at this shape ({request.batch} x "
                         f"{request.seq_len} tokens) itself; another shape is traced anew")
        else:
            missed = f" by {fitted.check_error:.0%}" if fitted is not None else ""
            notes.append(f"the calibration's fit at small shapes missed its own check{missed}: this shape "
                         f"({request.batch} x {request.seq_len} tokens) was traced itself, at small layer counts")
    calibrated = calibrated_setup(arch, key)
    if calibrated is not None:
        notes.extend(f"calibrated trace: {assumption}" for assumption in calibrated.assumptions)
    if arch.calibration is not None and calibrated is None:
        notes.append(f"no calibrated trace for {_calibration_key(arch, request)}: activations follow the Llama-like "
                     "transformers formulas on this config's sizes (approximate)")
    if arch.tie_word_embeddings and request.pp > 1:
        notes.append("tied embeddings with pp > 1: the last stage keeps its own copy of the embedding (Megatron)")
    if request.tp > arch.num_kv_heads and not arch.uses_mla and request.mode == Mode.INFERENCE:
        notes.append(f"tp {request.tp} > {arch.num_kv_heads} KV heads: KV heads are replicated across ranks")
    if request.mode == Mode.INFERENCE and arch.max_position_embeddings and request.seq_len > arch.max_position_embeddings:
        notes.append(f"seq {request.seq_len:,} exceeds the model's trained context of "
                     f"{arch.max_position_embeddings:,} tokens")
    if request.mode == Mode.INFERENCE and arch.sliding_window and request.seq_len > arch.sliding_window:
        if request.impl == Impl.FUSED:
            notes.append(f"sliding-window layers: the KV cache shown holds {arch.sliding_window:,} tokens on those "
                         "layers, as a serving engine allocates them; right after prefill transformers' cache still "
                         f"holds the whole {request.seq_len:,}-token prompt (the window is a view) until the first "
                         "decode step")
        else:
            notes.append(f"sliding-window layers: the KV cache shown holds the whole {request.seq_len:,}-token prompt "
                         "on those layers too, as transformers' cache does right after prefill (the window is a view "
                         f"of it) until the first decode step crops it to {arch.sliding_window:,} tokens; a serving "
                         "engine allocates the window only (--impl fused)")
    if request.mode == Mode.TRAIN and request.impl == Impl.HF:
        notes.append("activations follow transformers' modelling code (--impl hf); a loop that keeps the model "
                     "output through backward also keeps the logits (s b V in the model dtype)")
    if request.impl == Impl.HF:
        notes += _attention_notes(arch, request)
    if weight_format(request.dtype).name not in UNQUANTIZED:
        notes.append("quantized formats store the blocks' linear weights low-bit; "
                     "embeddings, head and norms stay 16-bit")
    return tuple(notes)


def _attention_notes(arch: Architecture, request: FitRequest) -> list[str]:
    """--impl hf: when the attention code run differs from the one asked for, say which and why."""
    backend = _hf_attention_backend(arch, request)
    if request.attention == Attention.SDPA and arch.model_type == "gemma2":
        return ["Gemma-2 under --attention sdpa: transformers refuses SDPA for Gemma2ForCausalLM and runs eager "
                "attention (its soft-capped scores need it), so the s x s scores and softmax are stored as eager's"]
    if request.attention == Attention.SDPA and backend == "math":
        why = []
        if arch.dropout and request.mode == Mode.TRAIN:
            why.append("dropout is on in training")
        if arch.uses_mla and arch.v_head_dim != arch.head_dim:
            why.append(f"the V head dim ({arch.v_head_dim}) differs from Q/K's ({arch.head_dim}, MLA)")
        return [f"SDPA on a CPU falls back to its math kernel here ({' and '.join(why)}: the CPU flash kernel "
                "does not support that), which holds the s x s attention scores and softmax in fp32, as eager "
                "attention does"]
    return []


# ---------------------------------------------------------------------------------------------
# Searches: the largest batch and context that fit, and what would make a model fit.


def _largest(fits, upper: int) -> int:
    """Largest n in [1, upper] with fits(n), for a monotone predicate; 0 if even 1 does not fit."""
    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= upper and fits(high):
        low, high = high, high * 2
    high = min(high, upper + 1)
    while high - low > 1:
        mid = (low + high) // 2
        if fits(mid):
            low = mid
        else:
            high = mid
    return low


BATCH_SEARCH_BOUND = 1 << 20  # the searches stop here: a result equal to its bound means "at least"
SEQ_SEARCH_BOUND = 1 << 24


def largest_batch(arch: Architecture, request: FitRequest, capacity: int, upper: int = BATCH_SEARCH_BOUND) -> int:
    """The largest batch (per data-parallel rank) at request.seq_len whose worst device fits capacity."""
    return _largest(lambda b: estimate(arch, replace(request, batch=b)).worst.total <= capacity, upper)


def largest_seq_len(arch: Architecture, request: FitRequest, capacity: int, upper: int = SEQ_SEARCH_BOUND) -> int:
    """The longest sequence at request.batch whose worst device fits capacity (0: none)."""
    return _largest(lambda s: estimate(arch, replace(request, seq_len=s)).worst.total <= capacity, upper)


@dataclass(frozen=True)
class Change:
    """One field of a FitRequest set to a new value (the front ends phrase it: a flag, a form field)."""

    field: str
    value: object


@dataclass(frozen=True)
class Suggestion:
    """Changes to the request that make it fit, why (empty when the change says it), and the worst
    device's total memory with them; `request` is the request with the changes made."""

    changes: tuple[Change, ...]
    reason: str
    request: FitRequest
    total: int

    @property
    def kind(self) -> frozenset[str]:
        """The fields the suggestion sets, of each kind only the smallest change that fits is offered
        (change_kind)."""
        return change_kind(self.changes)

    @property
    def devices(self) -> int:
        """The devices the changed layout spans (FitRequest.devices)."""
        return self.request.devices

    @property
    def changes_layout(self) -> bool:
        """Whether the suggestion sets dp, tp or pp, the factors of the device count."""
        return bool(self.kind & {"dp", "tp", "pp"})


def change_kind(changes: tuple[Change, ...]) -> frozenset[str]:
    """The fields `changes` set, a weight format named with its width ("dtype:8-bit", "dtype:4-bit"):
    8-bit and 4-bit weights are different trade-offs of quality for memory (4-bit GGUF/GPTQ/AWQ is what
    a 24 GB consumer card runs a 14B-30B model in), so when 8-bit fits, 4-bit is still offered."""
    return frozenset(f"{change.field}:{round(weight_format(str(change.value)).bits_per_weight)}-bit"
                     if change.field == "dtype" else change.field for change in changes)


class _PlanFields(TypedDict, total=False):
    """The FitRequest fields a suggestion may set (keywords of dataclasses.replace on a FitRequest);
    a new kind of plan that sets another field adds it here."""

    dtype: str
    kv_dtype: str | None
    recipe: Recipe | str
    optimizer: str
    batch: int
    seq_len: int
    dp: int
    tp: int
    ep: int
    zero: ZeroStage | int
    sequence_parallel: bool
    recompute: Recompute | str
    lora_targets: tuple[str, ...]


@dataclass(frozen=True)
class _Plan:
    fields: _PlanFields
    reason: str = ""

    @property
    def changes(self) -> tuple[Change, ...]:
        """The plan's fields as Changes, in the order given (the order the front ends name them)."""
        return tuple(Change(name, value) for name, value in self.fields.items())


def _plan(reason: str = "", **fields: Unpack[_PlanFields]) -> _Plan:
    """A candidate change, its fields in the order given (the order the front ends name them)."""
    return _Plan(fields, reason)


def _with_ep(request: FitRequest, plan: _Plan, ep: int) -> _Plan:
    """`plan` with expert parallelism `ep`. Experts are carved out of dp, so a plan that changes dp or the
    layout may have to reset ep; that reset is part of the advice, named like any other change."""
    if ep == request.ep:
        return plan
    return _Plan({**plan.fields, "ep": ep}, plan.reason)


# The changes suggestions() tries (plans_tried says them in words).
INFERENCE_TP_STEPS = (2, 4, 8, 16, 32, 64)
SHORTER_CONTEXT_DIVISORS = (2, 4, 8)
MIN_SUGGESTED_CONTEXT = 512  # below this a chat or code prompt no longer fits: not worth offering
SMALLER_WEIGHT_FORMATS = ("fp8", "int4", "nf4")
SMALLER_WEIGHT_FORMATS_WITH_TP = ("fp8", "int4")
TRAIN_DP_STEPS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
TRAIN_TP_STEPS = (2, 4, 8)
COMBINED_TP = 8
COMBINED_TP_DP_STEPS = (1, 2, 4, 8, 16, 32, 64, 128)


def plans_tried(mode: str) -> str:
    """What suggestions() tries for `mode`, alone and combined, in words (for "nothing tried fits")."""
    if mode == Mode.INFERENCE:
        return (f"an 8-bit KV cache, {', '.join(SMALLER_WEIGHT_FORMATS)} weights, half the context, batch 1, "
                f"{' or '.join(SMALLER_WEIGHT_FORMATS_WITH_TP)} weights with down to an eighth of the context, "
                f"tp up to {max(INFERENCE_TP_STEPS)}, and {' or '.join(SMALLER_WEIGHT_FORMATS_WITH_TP)} weights "
                f"with tp up to {max(INFERENCE_TP_STEPS)}")
    return (f"recompute, batch 1, LoRA, QLoRA, 8-bit Adam, ZeRO-3 on up to {max(TRAIN_DP_STEPS):,} devices, "
            f"tp up to {max(TRAIN_TP_STEPS)} with sp, and full recompute with ZeRO-3 on up to "
            f"{max(TRAIN_DP_STEPS):,} devices, also with tp {COMBINED_TP} and sp on up to "
            f"{COMBINED_TP * max(COMBINED_TP_DP_STEPS):,}")


def _candidate_plans(arch: Architecture, request: FitRequest) -> list[_Plan]:
    plans: list[_Plan] = []
    heads = arch.num_heads
    if request.mode == Mode.INFERENCE:
        if (request.kv_dtype or "bf16") not in ("fp8", "int8"):
            plans.append(_plan("halves the KV cache", kv_dtype="fp8"))
        for fmt in SMALLER_WEIGHT_FORMATS:
            if weight_format(request.dtype).bits_per_weight > weight_format(fmt).bits_per_weight:
                plans.append(_plan(dtype=fmt))
        if request.seq_len > 1024:
            plans.append(_plan("half the context", seq_len=request.seq_len // 2))
        if request.batch > 1:
            plans.append(_plan(batch=1))
        # A smaller format with a shorter context still runs on the one device the user has.
        for fmt in SMALLER_WEIGHT_FORMATS_WITH_TP:
            if weight_format(request.dtype).bits_per_weight > weight_format(fmt).bits_per_weight:
                for divisor in SHORTER_CONTEXT_DIVISORS:
                    if request.seq_len // divisor >= MIN_SUGGESTED_CONTEXT:
                        plans.append(_plan(dtype=fmt, seq_len=request.seq_len // divisor))
        for tp in INFERENCE_TP_STEPS:
            if tp > request.tp and heads % tp == 0:
                plans.append(_plan(tp=tp))
        for fmt in SMALLER_WEIGHT_FORMATS_WITH_TP:
            if weight_format(request.dtype).bits_per_weight > weight_format(fmt).bits_per_weight:
                for tp in INFERENCE_TP_STEPS:
                    if tp > request.tp and heads % tp == 0:
                        plans.append(_plan(dtype=fmt, tp=tp))
        return plans
    if request.recompute != Recompute.FULL:
        for mode in (Recompute.SELECTIVE, Recompute.FULL):
            if RECOMPUTE_MODES.index(mode) > RECOMPUTE_MODES.index(request.recompute):
                plans.append(_plan(recompute=mode))
    if request.batch > 1:
        plans.append(_plan("gradient accumulation keeps the global batch", batch=1))
    if request.adapter and set(request.lora_targets) - set(ATTENTION_TARGETS):
        plans.append(_plan("adapt attention only", lora_targets=ATTENTION_TARGETS))
    if not request.adapter:
        plans.append(_plan("frozen base, train adapters", recipe=Recipe.LORA))
        plans.append(_plan("4-bit base + adapters", recipe=Recipe.QLORA))
        if request.optimizer in ("adam", "adamw"):
            plans.append(_plan(optimizer="adam-8bit"))
        for dp in TRAIN_DP_STEPS:
            if dp > request.dp:
                plans.append(_with_ep(request, _plan(zero=ZeroStage.PARAMETERS, dp=dp), request.ep if dp % request.ep == 0 else 1))
    for tp in TRAIN_TP_STEPS:
        if tp > request.tp and heads % tp == 0:
            plans.append(_plan(tp=tp, sequence_parallel=True))
    if not request.adapter:
        # Combined plans, as large runs use them: full recompute with sharded states, then with TP.
        tp8 = COMBINED_TP if heads % COMBINED_TP == 0 and request.tp < COMBINED_TP else request.tp
        for dp in TRAIN_DP_STEPS:
            if dp > request.dp:
                plans.append(_with_ep(request, _plan(recompute=Recompute.FULL, zero=ZeroStage.PARAMETERS, dp=dp),
                                      request.ep if dp % request.ep == 0 else 1))
        for dp in COMBINED_TP_DP_STEPS:
            plans.append(_with_ep(request, _plan(recompute=Recompute.FULL, tp=tp8, sequence_parallel=True, zero=ZeroStage.PARAMETERS, dp=dp), 1))
    return plans


def _serves_as_well(found: FitRequest, candidate: FitRequest) -> bool:
    """Whether an inference layout already offered keeps at least as much of what the user asked as
    `candidate` does (context, batch, weight and KV-cache bits) on no more devices: then the candidate
    is only a worse choice (4-bit with a shorter context where 4-bit alone fits). Single changes are
    all offered: fp8 and int4 weights are both worth seeing when both fit."""
    def bits(dtype: str) -> float:
        return float(weight_format(dtype).bits_per_weight)

    def kv_bits(request: FitRequest) -> float:
        return float(kv_dtype_bytes(request.kv_dtype or "bf16"))

    return (found.devices <= candidate.devices and found.seq_len >= candidate.seq_len
            and found.batch >= candidate.batch and bits(found.dtype) >= bits(candidate.dtype)
            and kv_bits(found) >= kv_bits(candidate))


def suggestions(arch: Architecture, request: FitRequest, capacity: int, limit: int = 4) -> list[Suggestion]:
    """Changes to the request that make the worst device fit `capacity`, cheapest first.

    Changes are tried in the order a practitioner would (no extra hardware before more hardware);
    of each kind of change (the set of fields it sets) only the first, i.e. smallest, that fits is kept.
    """
    found: list[Suggestion] = []
    kinds_done: set[frozenset[str]] = set()
    for plan in _candidate_plans(arch, request):
        kind = change_kind(plan.changes)
        if kind in kinds_done:
            continue
        candidate = replace(request, **plan.fields)
        if (request.mode == Mode.INFERENCE and len(plan.changes) > 1
                and any(_serves_as_well(s.request, candidate) for s in found)):
            continue
        try:
            total = estimate(arch, candidate).worst.total
        except UserError:
            continue
        if total <= capacity:
            found.append(Suggestion(plan.changes, plan.reason, candidate, total))
            kinds_done.add(kind)
            if len(found) >= limit:
                break
    return found
