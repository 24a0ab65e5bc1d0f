"""One real training step (or prefill) of a transformers model, traced tensor by tensor.

The model is built from its config at full size on fake tensors (PyTorch's FakeTensorMode: shapes,
dtypes and storages without memory), then one step of the code a user runs executes for real on
them. A TorchDispatchMode sees every tensor each aten op returns; the bytes of its untyped storage
are counted once per storage (views and in-place results share it) until a weakref callback on
that storage says the last tensor using it is gone. Each live storage has a category; the tracker
keeps running totals per category and copies them whenever the total reaches a new high, so the
peak is a moment of the timeline, with its phase and each category's bytes at that moment.

Why not torch.distributed._tools.mem_tracker.MemTracker: it is the reference the tests check this
tracker against, but its module hooks and per-op snapshots took 14.8 s for a fake Llama-3.1-8B step
on 2 cores; this tracker does the same step in about a second.

torch and transformers are imported inside functions only: `tensor-tutor fit` without --trace must
not pay for them.
"""

from __future__ import annotations

import time
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any
from unittest.mock import patch

from tutor.errors import UserError

CATEGORIES = ("weights", "buffers", "gradients", "optimizer_states", "optimizer_temporaries", "activations",
              "kv_cache")
PHASES = ("setup", "forward", "backward", "optimizer", "prefill")
TRAIN_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
ATTENTION = {"eager": "eager", "sdpa": "sdpa"}
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum")
EXTRA_HINT = "install tensor-tutor[trace] (pip install 'tensor-tutor[trace]', which adds transformers)"


@dataclass(frozen=True)
class TraceSetup:
    """What to run: the knobs of a transformers training step or prefill, as a user would set them.

    dtype: the parameters' dtype; autocast: run forward under torch.autocast(bfloat16) (hf-amp);
    foreach: AdamW's multi-tensor path (None: torch's own default for the traced tensors);
    fake: FakeTensorMode (False: real tensors, for checking the trace against a real run).
    """

    mode: str = "train"            # "train" or "inference"
    dtype: str = "bf16"            # fp32, bf16, fp16
    autocast: bool = False
    recompute: bool = False        # model.gradient_checkpointing_enable()
    attention: str = "sdpa"        # eager or sdpa (attn_implementation)
    optimizer: str = "adamw"
    batch: int = 1
    seq_len: int = 4096
    foreach: bool | None = None
    fake: bool = True


@dataclass(frozen=True)
class TracePeak:
    """The moment the live tensors' bytes were highest: when, and what they were."""

    bytes: int
    phase: str
    per_category_bytes: dict[str, int]
    activations_by_op: dict[str, int]  # the live activations at that moment, by the aten op that made them

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "phase": self.phase, "per_category_bytes": dict(self.per_category_bytes),
                "activations_by_op": dict(self.activations_by_op)}


@dataclass(frozen=True)
class MemoryTrace:
    """A traced step: the peak moment, each category's own maximum, and how it was run."""

    model_type: str
    model_class: str
    params: int
    setup: TraceSetup
    attention_traced: str           # what transformers really ran (its config._attn_implementation)
    optimizer_traced: str           # e.g. "AdamW (foreach)" or "AdamW (single-tensor)"
    device_traced: str              # the device type of the traced tensors
    peak: TracePeak
    max_per_category: dict[str, int]
    phase_peaks: dict[str, int]     # the highest total within each phase
    seconds: dict[str, float]       # import, build, step
    transformers_version: str
    torch_version: str
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict:
        s = self.setup
        return {
            "model_type": self.model_type, "model_class": self.model_class, "params": self.params,
            "mode": s.mode, "dtype": s.dtype, "autocast": s.autocast, "recompute": s.recompute,
            "batch": s.batch, "seq_len": s.seq_len, "fake": s.fake,
            "attention": self.attention_traced, "optimizer": self.optimizer_traced if s.mode == "train" else None,
            "device": self.device_traced,
            "peak": self.peak.to_json(),
            "max_per_category_bytes": dict(self.max_per_category),
            "phase_peak_bytes": dict(self.phase_peaks),
            "seconds": dict(self.seconds),
            "versions": {"torch": self.torch_version, "transformers": self.transformers_version},
            "notes": list(self.notes),
        }


# ---------------------------------------------------------------------------------------------
# The tracker


def storage_tracker_class():
    """The TorchDispatchMode subclass (built on first use so that importing this module stays light)."""
    global _StorageTracker
    if _StorageTracker is None:
        from torch import Tensor
        from torch.utils._python_dispatch import TorchDispatchMode

        class StorageTracker(TorchDispatchMode):
            """Live bytes per category, by untyped storage; the peak moment and each category's maximum."""

            def __init__(self) -> None:
                super().__init__()
                self.live: dict[int, list] = {}          # storage key -> [bytes, category, op, weakref]
                self.totals = dict.fromkeys(CATEGORIES, 0)
                self.maxima = dict.fromkeys(CATEGORIES, 0)
                self.activations_by_op: dict[str, int] = {}
                self.total = 0
                self.phase = "setup"
                self.new_category = "activations"
                self.peak = TracePeak(0, "setup", dict(self.totals), {})
                self.phase_peaks: dict[str, int] = {}

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                name = func._overloadpacket.__name__
                if type(out) in (tuple, list):
                    for item in out:
                        if isinstance(item, Tensor):
                            self.add(item, self.new_category, name)
                        elif type(item) in (tuple, list):  # _foreach ops return lists
                            for inner in item:
                                if isinstance(inner, Tensor):
                                    self.add(inner, self.new_category, name)
                elif isinstance(out, Tensor):
                    self.add(out, self.new_category, name)
                return out

            def add(self, tensor, category: str, op: str = "") -> None:
                """Count `tensor`'s storage under `category` if it is new; keep an existing one's category."""
                try:
                    storage = tensor.untyped_storage()
                except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
                    return
                key = storage._cdata
                entry = self.live.get(key)
                if entry is not None:
                    grown = storage.nbytes() - entry[0]
                    if grown:  # resize_ grew (or shrank) the storage in place
                        entry[0] += grown
                        self._change(entry[1], grown, entry[2])
                    return
                n_bytes = storage.nbytes()
                ref = weakref.ref(storage, lambda _, key=key: self._free(key))
                self.live[key] = [n_bytes, category, op, ref]
                self._change(category, n_bytes, op)

            def classify(self, tensor, category: str) -> None:
                """Move `tensor`'s storage to `category` (a gradient accumulated, a cache entry stored)."""
                if tensor is None:
                    return
                self.add(tensor, category)
                entry = self.live.get(tensor.untyped_storage()._cdata)
                if entry is not None and entry[1] != category:
                    self._change(entry[1], -entry[0], entry[2])
                    entry[1] = category
                    self._change(category, entry[0], entry[2])

            def set_phase(self, phase: str) -> None:
                self.phase = phase
                self.new_category = "optimizer_temporaries" if phase == "optimizer" else "activations"

            def _free(self, key: int) -> None:
                entry = self.live.pop(key, None)
                if entry is not None:
                    self._change(entry[1], -entry[0], entry[2])

            def _change(self, category: str, delta: int, op: str) -> None:
                self.totals[category] += delta
                self.total += delta
                if category == "activations":
                    self.activations_by_op[op] = self.activations_by_op.get(op, 0) + delta
                if delta > 0:
                    if self.totals[category] > self.maxima[category]:
                        self.maxima[category] = self.totals[category]
                    if self.total > self.phase_peaks.get(self.phase, 0):
                        self.phase_peaks[self.phase] = self.total
                    if self.total > self.peak.bytes:
                        self.peak = TracePeak(self.total, self.phase, dict(self.totals),
                                              {k: v for k, v in self.activations_by_op.items() if v})

        _StorageTracker = StorageTracker
    return _StorageTracker


_StorageTracker = None


def _torch():
    import torch

    return torch


# ---------------------------------------------------------------------------------------------
# Building the model


def import_trace_dependencies() -> tuple[Any, Any]:
    """(torch, transformers), or UserError naming the extra to install."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise UserError(f"--trace needs transformers ({exc.name or exc} is not installed): {EXTRA_HINT}") from None
    return torch, transformers


def _one_line(exc: BaseException) -> str:
    text = f"unknown key or value {exc.args[0]!r}" if isinstance(exc, KeyError) and exc.args else str(exc)
    text = " ".join(text.split()) or type(exc).__name__
    return text[:200] + ("..." if len(text) > 200 else "")


def build_config(config: dict, attention: str):
    """The transformers config object for a config.json dict, or UserError (one line) if it cannot be built."""
    _, transformers = import_trace_dependencies()
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise UserError("--trace needs a config.json with a model_type")
    fields = {k: v for k, v in config.items() if k != "model_type"}
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **fields)
    except Exception as exc:  # transformers raises ValueError, KeyError, TypeError ... for what it rejects
        raise UserError(f"transformers {transformers.__version__} cannot build model_type {model_type!r}: "
                        f"{_one_line(exc)}") from None
    hf_config._attn_implementation = attention
    return hf_config


def _causal_lm_class(transformers, hf_config):
    try:
        return transformers.AutoModelForCausalLM._model_mapping[type(hf_config)]
    except KeyError:
        raise UserError(f"transformers {transformers.__version__} has no causal-LM class for model_type "
                        f"{hf_config.model_type!r}: --trace runs decoder-only language models") from None


def attention_to_run(config: dict, requested: str) -> tuple[str, str]:
    """(attn_implementation to build, a note or ""): SDPA where the model class has it, else eager,
    which is what transformers itself picks for such a class."""
    if requested not in ATTENTION:
        raise UserError(f"--trace runs attention {', '.join(ATTENTION)}; got {requested!r}")
    _, transformers = import_trace_dependencies()
    model_class = _causal_lm_class(transformers, build_config(config, "eager"))
    if requested == "sdpa" and not getattr(model_class, "_supports_sdpa", False):
        return "eager", (f"{model_class.__name__} has no SDPA path in transformers {transformers.__version__}: "
                         "traced eager attention, which transformers uses for it")
    return requested, ""


def build_model(config: dict, setup: TraceSetup):
    """The causal-LM model class of `config`, at full size, with the setup's dtype and attention.

    Built inside the caller's FakeTensorMode when setup.fake; weight initialisation is skipped (the
    values of fake tensors do not exist, and init of real ones does not change their memory).
    """
    torch, transformers = import_trace_dependencies()
    from transformers.initialization import no_init_weights

    hf_config = build_config(config, setup.attention)
    model_class = _causal_lm_class(transformers, hf_config)
    try:
        with no_init_weights():
            return model_class._from_config(hf_config, attn_implementation=setup.attention,
                                            dtype=getattr(torch, TRAIN_DTYPES[setup.dtype]))
    except Exception as exc:
        raise UserError(f"transformers {transformers.__version__} cannot build {model_class.__name__} from this "
                        f"config: {_one_line(exc)}") from None


def _optimizer(torch, parameters, setup: TraceSetup):
    if setup.optimizer not in OPTIMIZERS:
        raise UserError(f"--trace runs the optimizers {', '.join(OPTIMIZERS)}; got {setup.optimizer!r}")
    kwargs = {} if setup.foreach is None else {"foreach": setup.foreach}
    if setup.optimizer == "adamw":
        return torch.optim.AdamW(parameters, lr=1e-5, **kwargs)
    if setup.optimizer == "adam":
        return torch.optim.Adam(parameters, lr=1e-5, **kwargs)
    return torch.optim.SGD(parameters, lr=1e-5, momentum=0.9 if setup.optimizer == "sgd-momentum" else 0.0, **kwargs)


def _optimizer_name(optimizer) -> str:
    foreach = optimizer.defaults.get("foreach")
    if foreach is None:
        from torch.optim.optimizer import _default_to_fused_or_foreach

        params = [p for group in optimizer.param_groups for p in group["params"]]
        _, foreach = _default_to_fused_or_foreach(params, differentiable=False, use_fused=False)
    return f"{type(optimizer).__name__} ({'foreach' if foreach else 'single-tensor'})"


def create_optimizer_states(model, optimizer) -> None:
    """The optimizer's states as they stand from step 2 on, created by its own code.

    torch optimizers create their states lazily inside the first step(); tracing that step would
    count the states as temporaries. One step() on zero gradients creates them, then the
    gradients are dropped: the traced step is the steady state.
    """
    torch = _torch()
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _register_existing(tracker, model, optimizer) -> None:
    for p in model.parameters():
        tracker.add(p, "weights")
    for b in model.buffers():
        tracker.add(b, "buffers")
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, _torch().Tensor):
                    tracker.add(value, "optimizer_states")


def _grad_hooks(tracker, model) -> list:
    return [p.register_post_accumulate_grad_hook(lambda p: tracker.classify(p.grad, "gradients"))
            for p in model.parameters() if p.requires_grad]


def run_training_step(model, optimizer, tracker, setup: TraceSetup, vocab: int) -> None:
    """One step as transformers' Trainer runs it: the loss comes back from the model (labels given),
    the output object is dropped before backward, then step() and zero_grad(set_to_none=True)."""
    torch = _torch()
    tracker.set_phase("forward")
    ids = torch.randint(0, vocab, (setup.batch, setup.seq_len))
    labels = ids.clone()
    if setup.autocast:
        with torch.autocast(device_type=ids.device.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=labels).loss
    else:
        loss = model(input_ids=ids, labels=labels).loss
    tracker.set_phase("backward")
    loss.backward()
    del loss
    for p in model.parameters():  # gradients that arrived without the hook (none expected)
        if p.grad is not None:
            tracker.classify(p.grad, "gradients")
    del ids, labels
    tracker.set_phase("optimizer")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _cache_argument(model) -> str:
    """transformers 5.x renamed forward's `past_key_values` to `cache` (the old name warns until 5.40)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def run_prefill(model, tracker, setup: TraceSetup, vocab: int) -> None:
    """A prefill as generate() runs it: no autograd, a DynamicCache, logits for the last position only,
    copied to fp32 for sampling."""
    torch = _torch()
    from transformers import DynamicCache

    tracker.set_phase("prefill")
    cache = DynamicCache(config=model.config)
    original_update = cache.update

    def update(key_states, value_states, layer_idx, *args, **kwargs):
        keys, values = original_update(key_states, value_states, layer_idx, *args, **kwargs)
        layer = cache.layers[layer_idx]
        for tensor in (getattr(layer, "keys", None), getattr(layer, "values", None), keys, values):
            if isinstance(tensor, torch.Tensor):
                tracker.classify(tensor, "kv_cache")
        return keys, values

    cache.update = update
    with torch.no_grad():
        ids = torch.randint(0, vocab, (setup.batch, setup.seq_len))
        out = model(input_ids=ids, **{_cache_argument(model): cache}, use_cache=True, logits_to_keep=1)
        next_token_logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
        del out, next_token_logits


@contextmanager
def _fake_tensor_workarounds(fake: bool):
    """Make transformers take, on fake tensors, the path it takes on real ones (checked: same bytes).

    1. Without an attention mask, a training forward checks position_ids for several sequences
       packed in one row; the check reads tensor values, which fake tensors lack, so transformers
       assumes packing and builds an s x s mask the real run never makes (and that would stop SDPA
       from choosing its flash kernel on a GPU). The traced rows are 0..s-1 each: not packed.
    2. The meta kernel of torch's grouped_mm accepts only bf16 while the CPU kernel runs fp32 too;
       for other dtypes the experts use transformers' own grouped-mm fallback op, whose outputs
       have the same shapes.
    """
    if not fake:
        yield
        return
    import torch
    from transformers import masking_utils
    from transformers.integrations import moe

    can_use_grouped_mm = moe._can_use_grouped_mm

    def grouped_mm_on_meta(input, weight, offs):
        return can_use_grouped_mm(input, weight, offs) and weight.dtype == torch.bfloat16

    with patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None), \
            patch.object(moe, "_can_use_grouped_mm", grouped_mm_on_meta):
        yield


@contextmanager
def _quiet():
    """transformers' and torch's warnings about the traced code are not the user's business here."""
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    fake_logger = logging.getLogger("torch._subclasses.fake_tensor")
    level, hf_level = fake_logger.level, hf_logging.get_verbosity()
    fake_logger.setLevel(logging.CRITICAL)
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        fake_logger.setLevel(level)
        hf_logging.set_verbosity(hf_level)


def trace_step(config: dict, setup: TraceSetup) -> MemoryTrace:
    """Build `config`'s model and run one step of `setup` under the storage tracker."""
    started = time.perf_counter()
    torch, transformers = import_trace_dependencies()
    from torch._subclasses.fake_tensor import FakeTensorMode

    imported = time.perf_counter()
    if setup.mode not in ("train", "inference"):
        raise UserError(f"unknown mode {setup.mode!r}: use train or inference")
    if setup.dtype not in TRAIN_DTYPES:
        raise UserError(f"--trace runs parameters in {', '.join(TRAIN_DTYPES)}; got {setup.dtype!r}")
    with _quiet():
        attention, note = attention_to_run(config, setup.attention)
        setup = replace(setup, attention=attention)
        with FakeTensorMode() if setup.fake else nullcontext():
            model, optimizer = _model_and_optimizer(torch, config, setup)
            built = time.perf_counter()
            tracker = _traced_step(model, optimizer, setup, transformers.__version__)
        stepped = time.perf_counter()
    return MemoryTrace(
        model_type=model.config.model_type, model_class=type(model).__name__,
        params=sum(p.numel() for p in model.parameters()), setup=setup,
        attention_traced=model.config._attn_implementation,
        optimizer_traced=_optimizer_name(optimizer) if optimizer is not None else "",
        device_traced=next(model.parameters()).device.type,
        peak=tracker.peak, max_per_category=dict(tracker.maxima), phase_peaks=dict(tracker.phase_peaks),
        seconds={"import": round(imported - started, 3), "build": round(built - imported, 3),
                 "step": round(stepped - built, 3)},
        transformers_version=transformers.__version__, torch_version=torch.__version__,
        notes=(note,) if note else ())


def _model_and_optimizer(torch, config: dict, setup: TraceSetup):
    """The model in the mode of the step, and (training) its optimizer with its states created."""
    model = build_model(config, setup)
    model.train(setup.mode == "train")
    if setup.mode == "inference":
        return model, None
    model.config.use_cache = False  # as transformers' Trainer sets it (TrainingArguments.use_cache)
    if setup.recompute:
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
    optimizer = _optimizer(torch, [p for p in model.parameters() if p.requires_grad], setup)
    create_optimizer_states(model, optimizer)
    return model, optimizer


def _traced_step(model, optimizer, setup: TraceSetup, transformers_version: str):
    """Run the step under a new tracker that knows the tensors already there; return the tracker."""
    tracker = storage_tracker_class()()
    _register_existing(tracker, model, optimizer)
    hooks = _grad_hooks(tracker, model) if optimizer is not None else []
    vocab = model.config.get_text_config().vocab_size
    try:
        with tracker, _fake_tensor_workarounds(setup.fake):
            if setup.mode == "train":
                run_training_step(model, optimizer, tracker, setup, vocab)
            else:
                run_prefill(model, tracker, setup, vocab)
    except UserError:
        raise
    except Exception as exc:
        what = "training step" if setup.mode == "train" else "prefill"
        raise UserError(f"the traced {what} of {type(model).__name__} failed in transformers "
                        f"{transformers_version}: {_one_line(exc)}") from None
    finally:
        for hook in hooks:
            hook.remove()
    return tracker
