"""The measured memory timeline of one transformers training step: the bytes alive per category at
every decoder layer's boundary, forward and backward, with the storage tracker of
tutor.bench.memory_trace (every storage counted once, from the op that made it until it is freed).

A forward hook on each decoder layer marks the moment its forward returned ("after layer i",
forward); a hook on the gradient of the layer's input marks the moment backward went through it
("after layer i", backward: autograd computes the input's gradient last, PyTorch's
torch.Tensor.register_hook). The tracker's events are then replayed with each storage's final
category up to each mark, as `StorageTracker.measurement` replays them for the peak. The moments
are named as tutor.theory.fit_timeline names them, so the two line up.

torch is imported inside functions only.
"""

from __future__ import annotations

from dataclasses import dataclass

from tutor.bench.memory_trace import (
    CATEGORIES,
    StepMeasurement,
    register_model_states,
    storage_tracker_class,
    training_step,
)


@dataclass(frozen=True)
class MeasuredMoment:
    phase: str
    moment: str
    layer: int | None
    per_category: dict[str, int]

    @property
    def bytes(self) -> int:
        return sum(self.per_category.values())

    def to_json(self) -> dict:
        return {"phase": self.phase, "moment": self.moment, "layer": self.layer, "bytes": self.bytes,
                "per_category_bytes": dict(self.per_category)}


def decoder_layers(model):
    """The model's decoder layers: the first ModuleList as long as config.num_hidden_layers (or n_layer)."""
    torch = __import__("torch")
    count = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layer", None)
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return list(module)
    raise ValueError("no ModuleList of the decoder layers found")


def measure_training_timeline(model, optimizer, ids, labels=None,
                              autocast_dtype=None) -> tuple[tuple[MeasuredMoment, ...], StepMeasurement]:
    """One `training_step` under a StorageTracker, marked at every decoder layer's boundary: the
    moments (forward and backward, in the order they happened) and the step's measurement (its peak).
    Run a step first so that the optimizer states exist (the steady state the theory describes)."""
    tracker = storage_tracker_class()()
    register_model_states(tracker, model, optimizer)
    tracker.register([ids, labels if labels is not None else ids], "activations")
    tracker.autocast_dtype = autocast_dtype
    marks: list[tuple[str, str, int | None, int]] = []
    handles = []

    def after_forward(index):
        def hook(_module, _args, _output):
            marks.append(("forward", f"after layer {index}", index, len(tracker.events)))
        return hook

    def before_forward(index):
        def hook(_module, args, kwargs):
            hidden = args[0] if args else kwargs.get("hidden_states")
            if hidden is not None and hidden.requires_grad:
                hidden.register_hook(lambda grad: marks.append(
                    ("backward", f"after layer {index}", index, len(tracker.events))))
        return hook

    for index, layer in enumerate(decoder_layers(model)):
        handles.append(layer.register_forward_hook(after_forward(index)))
        handles.append(layer.register_forward_pre_hook(before_forward(index), with_kwargs=True))
    try:
        with tracker:
            training_step(model, optimizer, ids, labels, autocast_dtype, tracker)
    finally:
        for handle in handles:
            handle.remove()
    measurement = tracker.measurement()
    return _replay(tracker, marks), measurement


def _replay(tracker, marks) -> tuple[MeasuredMoment, ...]:
    """Per-category bytes alive at each mark (an index into the tracker's events), by final category."""
    live = dict.fromkeys(CATEGORIES, 0)
    moments = []
    position = 0
    for phase, name, layer, at in sorted(marks, key=lambda mark: mark[3]):
        for key, delta, *_ in tracker.events[position:at]:
            live[tracker.role[key]] += delta
        position = at
        moments.append(MeasuredMoment(phase, name, layer, dict(live)))
    return tuple(moments)
