"""Memory over one training step, as the fit formula predicts it: the bytes alive per category at
each layer boundary from the start of forward to the end of optimizer.step().

Built from the same terms as the peak (tutor.theory.fit): the model states of `_model_states`,
each layer's saved tensors (`_hf_layer_bytes` for --impl hf, tutor.theory.activations), the
embedding and loss-head terms, the loss head's transients, the optimizer's temporaries. Forward
keeps each layer's saved tensors as it goes (PyTorch autograd saves what backward needs: "Autograd
mechanics", saved tensors); backward goes through the layers in reverse, freeing a layer's saved
tensors and making its parameters' gradients (gradients appear layer by layer, as PyTorch's memory
profile of a step shows: pytorch.org/blog/understanding-gpu-memory-1, and the Ultra-Scale Playbook's
memory profile of a training step, huggingface.co/spaces/nanotron/ultrascale-playbook). The moments
the peak is chosen from are all in the timeline, so its maximum is the estimate's `peak.bytes`.

One pipeline stage (the worst device), steady state (optimizer states exist, gradients were set to
None by zero_grad). Full recompute adds the re-run moments of the peak; a layer's re-run inside
backward is not split further. Pure: stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

from tutor.theory.fit import (
    FitRequest,
    Impl,
    Mode,
    _activation_timeline,
    _autocast_copy_bytes,
    _hf_layer_bytes,
    _layer_resident_params,
    _layer_shape_counts,
    _optimizer_temporaries,
    _stage_params,
    _tied_gradient_bytes,
    activation_precision,
    _hf_attention_backend,
    estimate,
)
from tutor.theory.activations import TOKEN_ID_BYTES, hf_attention_mask_bytes, hf_layer_shape, hf_prefill_held_bytes
from tutor.theory.models import Architecture, count_parameters, parameters_per_layer
from tutor.theory.parallel import pipeline_stages

CATEGORIES = ("weights", "buffers", "gradients", "optimizer", "activations", "kv_cache", "optimizer_temporaries")


@dataclass(frozen=True)
class TimelineMoment:
    """The bytes alive at one moment of a step, per category (CATEGORIES)."""

    phase: str  # "forward", "backward", "optimizer"
    moment: str  # "after layer 3", "loss head", ...
    layer: int | None  # the layer whose boundary this is, None for the other moments
    per_category: dict[str, int]

    @property
    def bytes(self) -> int:
        return sum(self.per_category.values())

    def to_json(self) -> dict:
        return {"phase": self.phase, "moment": self.moment, "layer": self.layer, "bytes": self.bytes,
                "per_category_bytes": dict(self.per_category)}


def training_timeline(arch: Architecture, request: FitRequest) -> tuple[TimelineMoment, ...]:
    """The predicted memory of one training step of the worst device, moment by moment.

    Raises ValueError for inference (a prefill has no backward: see prefill_timeline)."""
    if request.mode != Mode.TRAIN:
        raise ValueError("the step timeline is for training (a prefill has prefill_timeline)")
    answer = estimate(arch, request)
    worst = answer.worst
    params = count_parameters(arch)
    layers = parameters_per_layer(arch)
    stages = pipeline_stages(arch.num_layers, request.pp, tied_embeddings=arch.tie_word_embeddings)
    start = sum(stage.layers for stage in stages[:worst.stage])
    stage = stages[worst.stage]
    stage_layers = range(start, start + stage.layers)
    final_norm = params.total - params.embedding - params.lm_head - params.position_embedding - sum(
        layer.total for layer in layers)
    resident = _stage_params(arch, params, layers, request, stage, stage_layers, final_norm)
    timeline = _activation_timeline(arch, request, stage, stage_layers)
    by_name = {c.name: c.bytes for c in worst.components}
    weights, grads, states = by_name.get("weights", 0), by_name.get("gradients", 0), by_name.get("optimizer", 0)
    buffers = by_name.get("buffers", 0)
    masters = weights - _autocast_copy_bytes(request, resident)
    temporaries, _why = _optimizer_temporaries(arch, request, resident)

    per_layer = _per_layer_activation_bytes(arch, request, stage, stage_layers, timeline.layers_part)
    grad_of = {i: math.ceil(Fraction(grads * _layer_resident_params(arch, layers[i], params.expert, request),
                                     max(resident.total, 1))) for i in stage_layers}
    embedding = timeline.stored - timeline.layers_part - timeline.head
    head_grads = max(0, grads - sum(grad_of.values()) - _embedding_grad_bytes(arch, request, stage, grads, resident))

    def moment(phase: str, name: str, layer: int | None, acts: int, grad: int, temp: int = 0,
               weight: int = weights) -> TimelineMoment:
        return TimelineMoment(phase, name, layer, {"weights": weight, "buffers": buffers, "gradients": grad,
                                                   "optimizer": states, "activations": acts, "kv_cache": 0,
                                                   "optimizer_temporaries": temp})

    moments = [moment("forward", "start of forward: the batch", None, embedding, 0)]
    alive = embedding
    for i in stage_layers:
        if timeline.core_forward and i == stage_layers[-1]:
            # Math SDPA: the kernel's temporaries inside the last layer (the peak's forward moment).
            # Inside a layer, not at its boundary: no layer index.
            moments.append(moment("forward", f"layer {i}'s attention core (math SDPA)", None, timeline.core_forward, 0))
        alive += per_layer[i]
        moments.append(moment("forward", f"after layer {i}", i, alive, 0))
    moments.append(moment("forward", "loss head, forward", None, timeline.stored + timeline.loss_forward, 0))
    moments.append(moment("backward", "loss head, start of backward", None,
                          timeline.stored + timeline.loss_backward, 0))
    alive = timeline.stored - timeline.head
    made = head_grads
    # Tied embedding: lm_head's weight gradient waits, as a free tensor, for the embedding's.
    tied = _tied_gradient_bytes(arch, request, stage) // 2
    # Between two layers' backward, the gradient of the hidden state (b x s x h at the residual
    # stream's precision) is alive: the output of one layer's backward, the input of the next.
    # Counted for --impl hf on the stage with the loss head, whose start-of-backward moment (the
    # loss's fp32 gradients, far larger) the estimate's peak already takes; elsewhere the estimate has no
    # moment for it, and the timeline keeps to the estimate's terms so that its maximum is the peak.
    hidden_grad = _hidden_gradient_bytes(arch, request) if request.impl == Impl.HF and timeline.loss_backward else 0
    moments.append(moment("backward", "after the loss head", None, alive + tied + hidden_grad, made))
    for i in reversed(stage_layers):
        alive -= per_layer[i]
        made += grad_of[i]
        moments.append(moment("backward", f"after layer {i}", i, alive + tied + hidden_grad, made))
    for rerun in timeline.reruns:
        rerun_grads = math.ceil(Fraction(grads * rerun.gradient_params, max(resident.total, 1)))
        moments.append(moment("backward", rerun.formula, None, rerun.activations, rerun_grads))
    remaining = embedding + _tied_gradient_bytes(arch, request, stage)
    moments.append(moment("backward", "end of backward", None, remaining, grads, weight=masters))
    moments.append(moment("optimizer", "optimizer.step()", None, 0, grads, temporaries, weight=masters))
    return tuple(moments)


def _per_layer_activation_bytes(arch: Architecture, request: FitRequest, stage, stage_layers: range,
                                layers_part: int) -> dict[int, int]:
    """Each layer's share of the stored activations: its own shape's bytes (--impl hf), else an even split."""
    if not len(stage_layers):
        return {}
    if request.impl == Impl.HF:
        from tutor.theory.activations import pipeline_activation_multiplier

        common = dict(seq_len=request.seq_len, batch=request.batch, precision=activation_precision(request),
                      backend=_hf_attention_backend(arch, request), gpu=request.gpu, tp=request.tp,
                      sequence_parallel=request.sequence_parallel)
        in_flight = pipeline_activation_multiplier(pp=request.pp, microbatches=request.microbatches or request.pp,
                                                   stage=stage.index)
        shapes = {is_moe: _hf_layer_bytes(arch, is_moe, common, request.recompute)
                  for is_moe, _ in _layer_shape_counts(arch, stage_layers)}
        return {i: math.ceil(shapes[arch.layer_is_moe[i]] * in_flight) for i in stage_layers}
    share = layers_part // len(stage_layers)
    return {i: share for i in stage_layers}


def _hidden_gradient_bytes(arch: Architecture, request: FitRequest) -> int:
    """Bytes of the gradient of one hidden state, b x s x h at the residual stream's precision (4 bytes
    for fp32 and autocast, whose residual stream stays fp32; else 2), split over tp with sequence parallelism."""
    width = 4 if activation_precision(request) in ("fp32", "amp") else 2
    elements = request.batch * request.seq_len * arch.hidden_size
    return math.ceil(Fraction(elements * width, request.tp if request.sequence_parallel else 1))


def _embedding_grad_bytes(arch: Architecture, request: FitRequest, stage, grads: int, resident) -> int:
    """Gradient bytes of the input embedding (made last, by the embedding's backward)."""
    if not stage.input_embedding:
        return 0
    params = count_parameters(arch)
    embedding = math.ceil(Fraction(params.embedding, request.tp)) + params.position_embedding
    if arch.tie_word_embeddings and stage.output_head:
        return 0  # one matrix: its gradient is summed at the embedding's backward, counted with the head
    return math.ceil(Fraction(grads * embedding, max(resident.total, 1)))


def prefill_timeline(arch: Architecture, request: FitRequest) -> tuple[TimelineMoment, ...]:
    """The predicted memory of one prefill of the worst device (generate()'s call: no grad, the
    whole prompt at once), moment by moment: entering each layer (the weights, the KV cache of the
    layers before it, what the forward holds between layers: `hf_prefill_held_bytes`), inside each
    layer (its K and V written to the cache, and the estimate's one layer's live tensors: the largest
    moment of any layer, as the estimate takes it), and the end (the last position's logits in the
    model dtype and their fp32 copy, 4 b V, and the token ids, beside the whole cache). Under no grad each layer's
    tensors are freed before the next runs (PyTorch, "Autograd mechanics": no graph, nothing saved),
    so the cache is what grows: the KV-cache's bytes are split evenly over the stage's layers.
    The last layer's inner moment is the estimate's peak (every category at its maximum at once),
    so the timeline's maximum is `peak.bytes`.

    Raises ValueError for training (see training_timeline)."""
    if request.mode != Mode.INFERENCE:
        raise ValueError("the prefill timeline is for inference (training has training_timeline)")
    answer = estimate(arch, request)
    worst = answer.worst
    stages = pipeline_stages(arch.num_layers, request.pp, tied_embeddings=arch.tie_word_embeddings)
    start = sum(stage.layers for stage in stages[:worst.stage])
    stage = stages[worst.stage]
    stage_layers = range(start, start + stage.layers)
    by_name = {c.name: c.bytes for c in worst.components}
    weights, kv, live = by_name.get("weights", 0), by_name.get("kv_cache", 0), by_name.get("activations", 0)
    buffers = by_name.get("buffers", 0)
    held = _prefill_held_bytes(arch, request, stage_layers)
    count = max(len(stage_layers), 1)

    def cache(layers_done: int) -> int:
        return math.ceil(Fraction(kv * layers_done, count))

    def moment(name: str, layer: int | None, acts: int, kv_bytes: int) -> TimelineMoment:
        return TimelineMoment("prefill", name, layer, {"weights": weights, "buffers": buffers, "gradients": 0,
                                                       "optimizer": 0,
                                                       "activations": acts, "kv_cache": kv_bytes,
                                                       "optimizer_temporaries": 0})

    moments = []
    for done, i in enumerate(stage_layers):
        moments.append(moment(f"into layer {i}", i, held, cache(done)))
        moments.append(moment(f"inside layer {i}", i, max(live, held), cache(done + 1)))
    if stage.index == len(stages) - 1:  # the stage with the head (output_head is False for a tied one)
        width = 4 if activation_precision(request) == "fp32" else 2
        logits = math.ceil(Fraction((width + 4) * request.batch * arch.vocab_size, request.tp))
        ids = TOKEN_ID_BYTES * request.batch * request.seq_len
        moments.append(moment("end of prefill: the next token's logits", None, ids + logits, kv))
    return tuple(moments)


def _prefill_held_bytes(arch: Architecture, request: FitRequest, stage_layers: range) -> int:
    """What a prefill holds between two layers: `hf_prefill_held_bytes`, with the attention masks
    transformers builds under --impl hf (a fused kernel builds none)."""
    precision = activation_precision(request)
    masks = 0
    if request.impl == Impl.HF:
        sliding = [arch.layer_uses_sliding_window[i] for i in stage_layers]
        kinds = 2 if any(sliding) and not all(sliding) else 1
        masks = hf_attention_mask_bytes(seq_len=request.seq_len, batch=request.batch,
                                        backend=_hf_attention_backend(arch, request), precision=precision,
                                        mask_kinds=kinds, model_type=arch.model_type)
    return hf_prefill_held_bytes(hf_layer_shape(arch, moe_layer=False), seq_len=request.seq_len,
                                 batch=request.batch, precision=precision, mask_bytes=masks)


def step_timeline(arch: Architecture, request: FitRequest) -> tuple[TimelineMoment, ...]:
    """The timeline of the request's mode: a training step or a prefill."""
    return training_timeline(arch, request) if request.mode == Mode.TRAIN else prefill_timeline(arch, request)


def timeline_peak(timeline: tuple[TimelineMoment, ...]) -> TimelineMoment:
    """The moment with the most bytes alive (the first of equals)."""
    return max(timeline, key=lambda m: m.bytes)
