"""Activation profiles calibrated from traces, for architectures without hand-written formulas.

A model type this package has no hand profile for (tutor.theory.models.SUPPORTED_MODEL_TYPES lists
those it has) is answered from its real transformers model class: tutor.trace.arch_calibration
counts its parameters on the meta device and traces one step of it (FakeTensorMode and the storage
tracker of `fit --trace`, tutor.trace.memory_trace) at a few small shapes with two and with three
decoder layers. Each traced quantity is fitted as

    q(L, b, s) = head(b, s) + L x per_layer(b, s),   with   f(b, s) = c0 + c1·b + c2·b·s + c3·b·s² + c4·b·S

(a constant, a per-sequence term such as the last position's logits, the per-token terms of the
Korthikanti et al. 2022 activation model (arXiv 2205.05198 §4), the s x s terms of attention that
keeps its scores, and for a model whose scan runs in chunks the per-token terms of the prompt padded
to whole chunks, S = ceil(s / chunk) x chunk: Mamba-2's SSD scan pads the sequence to a multiple of
its chunk_size, transformers/models/mamba2/modeling_mamba2.py torch_forward, a step in s that no
polynomial in s follows), checked against one more traced shape, and evaluated here at the requested
shape.
This module holds the fitted coefficients and evaluates them: pure data, no torch, no files.

Quantities (bytes unless named elements):
    train       for each region of the step (TRAIN_REGIONS: the forward; backward before any layer,
                the loss head's; inside the top layer's backward, the first gone back through, its
                re-run with full recompute; inside the bottom layer's; the embedding's; for layers of
                several kinds, top and bottom are a whole repeat of their pattern: the highest and the
                lowest layer of each kind), at the ops
                of the region that can hold its maximum ("<region>@op<n>": the n-th op of the region,
                counted from the forward's end, from a backward region's start):
                "activations@<moment>", "gradient_elements@<moment>" (parameter gradients alive
                then) and "weight_copy_bytes@<moment>" (under torch.autocast, the 16-bit weight copies
                still alive: cached for the forward, each freed by its layer's backward); and
                "activations_end_of_backward" (alive when the last gradient is made). One
                op is the same code at every shape, so what is alive there is linear in L, b·s, b·s²;
                the region's maximum is not: it can move from one op to another as the shape grows
                (a tied head's V x h weight gradient tops the loss head's b·s·V logits' gradient at
                short prompts, not at long ones), so every op that is the largest somewhere is kept,
                and theory takes the largest at the shape asked, as it does across regions.
    inference   "kv_cache" (the cache's storages after prefill), "kv_cache@<layer class>:<part>" (per
                cache layer of that class: its keys and values, "kv", or its conv and recurrent
                states, "state"; counted in the whole model by Calibration.cache_layers) and
                "activations@<region>" (the live activations' maximum while the prefill is inside
                <region>: attention, mlp, head, other; the prefill peak is the largest)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

BASIS = ("1", "b", "b*s", "b*s^2", "b*S")  # S: the prompt padded to whole chunks (padded_length)
TRAIN_QUANTITIES = ("activations", "activations_end_of_backward", "gradient_elements_at_activation_peak")
KV_CACHE = "kv_cache"
CACHE_PREFIX = "kv_cache@"   # + "<cache layer class>:kv" or ":state": per cache layer of that class
REGION_PREFIX = "activations@"
GRADIENTS_PREFIX = "gradient_elements@"
WEIGHT_COPIES_PREFIX = "weight_copy_bytes@"  # autocast's 16-bit weight copies alive at a training moment
TRAIN_REGIONS = ("forward", "backward-head", "backward-top", "backward-bottom", "backward-embedding")
TRACE_ATTENTION = {"eager": "eager", "sdpa": "sdpa", "flash": "sdpa"}  # flash needs CUDA: traced as SDPA


class _StepShape(TypedDict):
    """The keyword arguments Fitted.at and training_moments share: one step's shape."""

    layers: int
    batch: int
    seq_len: int
    head: bool
    layer_copies: float


def padded_length(seq_len: int, chunk: int) -> int:
    """The prompt's length padded to whole chunks of `chunk` tokens (0: no chunks, the length itself), as
    a chunked scan pads it: pad_size = (chunk_size - seq_len % chunk_size) % chunk_size
    (transformers/models/mamba2/modeling_mamba2.py, Mamba2Mixer.torch_forward)."""
    return -(-seq_len // chunk) * chunk if chunk > 0 else seq_len


def basis_values(batch: int, seq_len: int, chunk: int = 0) -> tuple[int, ...]:
    """The basis terms (BASIS) at one shape; without chunks b·S is 0 (no fit holds that term)."""
    return (1, batch, batch * seq_len, batch * seq_len * seq_len, batch * padded_length(seq_len, chunk) if chunk else 0)


@dataclass(frozen=True)
class Fitted:
    """One quantity: head and per-layer coefficients over BASIS."""

    head: tuple[float, ...]
    per_layer: tuple[float, ...]
    chunk: int = 0   # the scan's chunk in tokens (b·S's padding), 0 without one

    def at(self, *, layers: int, batch: int, seq_len: int, head: bool = True, layer_copies: float = 1) -> int:
        """The quantity at `layers` decoder layers (x layer_copies micro-batches in flight) and the
        head's terms if `head`; never below zero."""
        terms = basis_values(batch, seq_len, self.chunk)
        per_layer = sum(c * x for c, x in zip(self.per_layer, terms))
        head_part = sum(c * x for c, x in zip(self.head, terms)) if head else 0.0
        return max(0, math.ceil(head_part + layers * layer_copies * per_layer))


@dataclass(frozen=True)
class CalibratedSetup:
    """The fitted quantities of one way of running the model (`setup_key`) and how well they held.

    check: the shape the fit was checked against (layers, batch, seq_len), never used to fit;
    check_error: the largest relative error of any quantity there; traced_element_bytes: the bytes
    of one value of the traced dtype (to rescale the KV cache to another cache dtype);
    assumptions: what the traces took as given where the model's code read values a fake tensor does
    not have (an even routing, say), in words for the answer's notes.
    """

    key: str
    quantities: tuple[tuple[str, Fitted], ...]
    check: tuple[int, int, int]
    check_error: float
    traced_element_bytes: int
    fitted_shapes: tuple[tuple[int, int, int], ...] = ()
    assumptions: tuple[str, ...] = ()

    def quantity(self, name: str) -> Fitted | None:
        return dict(self.quantities).get(name)

    def regions(self) -> tuple[tuple[str, Fitted], ...]:
        return tuple((name[len(REGION_PREFIX):], fitted) for name, fitted in self.quantities
                     if name.startswith(REGION_PREFIX))


@dataclass(frozen=True)
class Calibration:
    """Every calibrated setup of one config, for one torch and transformers version."""

    model_class: str
    versions: str
    setups: tuple[CalibratedSetup, ...] = ()
    config_json: str = ""    # the config calibrated, as JSON text (what a later setup's traces build)
    window: int = 0          # the config's shortest sliding window (0: none): prompts longer than it are
                             # calibrated apart (masks appear), at lengths beyond it
    chunk: int = 0           # the chunk a scan pads the prompt to (0: none): the b·S term's
    cache_layers: tuple[tuple[str, int], ...] = ()   # (cache layer class, how many the whole model's cache has)

    def setup(self, key: str) -> CalibratedSetup | None:
        return next((s for s in self.setups if s.key == key), None)


def setup_key(*, mode: str, precision: str, attention: str, recompute: str, seq_len: int = 0, window: int = 0) -> str:
    """The name of a way of running a model, as calibrations are stored under it: mode, activation
    precision (fp32, bf16, amp: tutor.theory.fit.activation_precision), the attention traced (flash
    needs CUDA, so it is traced as SDPA), for training the recompute mode, and with a sliding window
    whether the prompt is longer than it (transformers then builds a window mask: another regime)."""
    traced = TRACE_ATTENTION.get(attention, attention)
    key = f"inference/{precision}/{traced}" if mode == "inference" else f"train/{precision}/{traced}/recompute-{recompute}"
    if window:
        key += f"/{'beyond' if seq_len > window else 'within'}-window-{window}"
    return key


def at_shape_key(key: str, batch: int, seq_len: int) -> str:
    """The name of setup `key` traced at one shape itself (batch x seq_len tokens): where the fit of `key`
    missed its own check, the answer at that shape comes from a trace there."""
    return f"{key}/at-{batch}x{seq_len}"


def calibrated_setup(arch, key: str) -> CalibratedSetup | None:
    """The calibrated setup `key` of `arch` (a tutor.theory.models.Architecture), or None when the
    architecture has a hand profile or was not calibrated for this setup."""
    calibration = getattr(arch, "calibration", None)
    if calibration is None:
        return None
    return calibration.setup(key)


def moment_region(moment: str) -> str | None:
    """The training region (TRAIN_REGIONS) of a moment's name ("backward-head@op11"), or None."""
    region = moment.split("@")[0].split(":")[0]
    return region if region in TRAIN_REGIONS else None


def training_moments(setup: CalibratedSetup, *, batch: int, seq_len: int, layers: int, head: bool = True,
                     layer_copies: float = 1) -> tuple[tuple[str, int, int, int | None], ...]:
    """(moment, activation bytes, gradient elements, autocast weight-copy bytes or None where the
    setup did not trace them) at each training moment the setup kept."""
    out = []
    quantities = dict(setup.quantities)
    shape = _StepShape(layers=layers, batch=batch, seq_len=seq_len, head=head, layer_copies=layer_copies)
    # The copies are weights: one set whatever the micro-batches in flight.
    weights_shape = _StepShape(layers=layers, batch=batch, seq_len=seq_len, head=head, layer_copies=1)
    for name, acts in setup.quantities:
        moment = name[len(REGION_PREFIX):]
        if not name.startswith(REGION_PREFIX) or moment_region(moment) is None:
            continue
        grads, copies = quantities.get(GRADIENTS_PREFIX + moment), quantities.get(WEIGHT_COPIES_PREFIX + moment)
        out.append((moment, acts.at(**shape), grads.at(**shape) if grads is not None else 0,
                    copies.at(**weights_shape) if copies is not None else None))
    return tuple(out)


def prefill_peak(setup: CalibratedSetup, *, batch: int, seq_len: int, layers: int) -> tuple[int, str]:
    """(bytes, region) of a prefill's activation peak: the largest region's fitted maximum."""
    best, where = 0, ""
    for region, fitted in setup.regions():
        n = fitted.at(layers=layers, batch=batch, seq_len=seq_len)
        if n > best:
            best, where = n, region
    return best, where


@dataclass(frozen=True)
class TrainingTimeline:
    """A calibrated training step on one device, in the terms tutor.theory.fit's peak moments use:
    the activations' maximum, those stored at the end of forward, those left at the end of backward,
    and each backward moment's (name, activation bytes, gradient elements, autocast weight-copy bytes
    or None)."""

    maximum: int
    stored: int
    end_of_backward: int
    moments: tuple[tuple[str, int, int, int | None], ...]


def training_timeline(setup: CalibratedSetup, *, batch: int, seq_len: int, layers: int, head: bool = True,
                      layer_copies: float = 1, tp: int = 1) -> TrainingTimeline:
    """The fitted training quantities at a shape: `layers` layers (x layer_copies micro-batches in
    flight), the head's terms on the last pipeline stage only (`head`), split over `tp` ranks (an
    approximation: the traces ran one device)."""
    def split(n: int) -> int:
        return math.ceil(n / tp)

    shape = _StepShape(batch=batch, seq_len=seq_len, layers=layers, head=head, layer_copies=layer_copies)
    moments = tuple((name, split(acts), split(grads), None if copies is None else split(copies))
                    for name, acts, grads, copies in training_moments(setup, **shape))
    maximum = max((acts for _, acts, _, _ in moments), default=0)
    forward = [acts for name, acts, _, _ in moments if moment_region(name) == "forward"]
    stored = max(forward) if forward else maximum
    end = setup.quantity("activations_end_of_backward")
    return TrainingTimeline(maximum=maximum, stored=stored, end_of_backward=split(end.at(**shape)) if end else 0,
                            moments=tuple(m for m in moments if moment_region(m[0]) != "forward"))


def kv_cache_bytes(setup: CalibratedSetup, *, batch: int, seq_len: int, layers: int, element_bytes: float,
                   tp: int = 1, cache_layers: tuple[tuple[str, float], ...] = ()) -> int | None:
    """The traced cache at a shape; None when the setup traced no cache (training).

    With `cache_layers` ((cache layer class, how many of them on this device), as the model's own cache
    lays its layers out) each class's traced bytes per layer: keys and values, rescaled from the
    traced dtype to `element_bytes` per value, and conv and recurrent states, kept in the dtype the
    model keeps them in (a KV-cache dtype does not apply to them). Without, `layers` x the traced
    cache per decoder layer, rescaled the same way."""
    parts = cache_parts(setup, batch=batch, seq_len=seq_len, cache_layers=cache_layers)
    if parts is not None:
        kv = sum(n for (_kind, part), n in parts.items() if part == "kv")
        state = sum(n for (_kind, part), n in parts.items() if part == "state")
        return math.ceil((kv * element_bytes / setup.traced_element_bytes + state) / tp)
    fitted = setup.quantity(KV_CACHE)
    if fitted is None:
        return None
    traced = fitted.at(layers=layers, batch=batch, seq_len=seq_len, head=False)
    return math.ceil(traced * element_bytes / (setup.traced_element_bytes * tp))


def cache_parts(setup: CalibratedSetup, *, batch: int, seq_len: int,
                cache_layers: tuple[tuple[str, float], ...]) -> dict[tuple[str, str], float] | None:
    """{(cache layer class, "kv" or "state"): traced bytes of all `count` layers of that class} for each
    (class, count) of `cache_layers`; None when a class with layers was not traced (no figure per layer)."""
    out: dict[tuple[str, str], float] = {}
    if not cache_layers:
        return None
    for kind, count in cache_layers:
        found = [(part, setup.quantity(f"{CACHE_PREFIX}{kind}:{part}")) for part in ("kv", "state")]
        if count and all(fitted is None for _, fitted in found):
            return None
        for part, fitted in found:
            if fitted is not None and count:
                out[(kind, part)] = count * fitted.at(layers=1, batch=batch, seq_len=seq_len, head=False)
    return out
