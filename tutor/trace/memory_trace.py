"""One training step (or prefill) of a transformers model, measured storage by storage: the one tracker.

`fit --trace` builds the model from its config at full size on fake tensors (PyTorch's
FakeTensorMode: shapes, dtypes and storages without memory) and runs one step of the code a user
runs on them (`trace_step`); the verification benchmark (benchmarks/fit_vs_transformers.py) and the
tests run the same measured step on small models with real tensors (`build_model(..., seed=0)`,
`training_step`, `measure_training_step`, `measure_prefill`).

StorageTracker, a TorchDispatchMode, sees every tensor each aten op returns; the bytes of its
untyped storage are counted once per storage (views and in-place results share it) from the op
that made it until a weakref callback on that storage says the last tensor using it is gone. The
allocations and frees form a timeline; each storage has one category, the role it ends the step
with (a storage that becomes a parameter's .grad is a gradient from the op that computed it), and
the timeline is replayed with those categories: each category's own maximum, and the peak as a
moment, with its phase, its op and what was alive then.

Categories: weights (parameters, and autocast's 16-bit copies of them), buffers, gradients,
optimizer_states (exp_avg, exp_avg_sq, step), optimizer_temporaries (made inside optimizer.step()),
activations (everything else of forward and backward: token ids, labels, saved tensors, the loss,
backward's intermediate gradients) and kv_cache (inference: the cache's key and value storages).

Why not torch.distributed._tools.mem_tracker.MemTracker: it is the reference the tests check this
tracker against (`fit_vs_transformers.py --cross-check` too), but its module hooks and per-op
snapshots took 14.8 s for a fake Llama-3.1-8B step on 2 cores; this tracker does it in about a second.

torch and transformers are imported inside functions only: `tensor-tutor fit` without --trace must
not pay for them.
"""

from __future__ import annotations

import time
import weakref
import contextlib
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any
from unittest.mock import patch

from tutor.errors import UserError
from tutor.theory.fit_timeline import TimelineMoment  # a measured moment is the same record as a predicted one

CATEGORIES = ("weights", "buffers", "gradients", "optimizer_states", "optimizer_temporaries", "activations",
              "kv_cache")
PHASES = ("setup", "forward", "backward", "optimizer", "prefill")
TRAIN_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
ATTENTION = {"eager": "eager", "sdpa": "sdpa"}
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum")
EXTRA_HINT = "install the [trace] extra, which adds transformers (from a clone: pip install -e '.[trace]')"


@dataclass(frozen=True)
class TraceSetup:
    """What to run: the knobs of a transformers training step or prefill, as a user would set them.

    dtype: the parameters' dtype; autocast: run forward under torch.autocast(bfloat16) (hf-amp);
    foreach: AdamW's multi-tensor path (None: torch's own default for the traced tensors);
    fake: FakeTensorMode (False: real tensors, for checking the trace against a real run);
    seed: real tensors only: the seed of the weights' initialisation and the token ids.
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
    seed: int = 0


@dataclass(frozen=True)
class TracePeak:
    """The moment the live tensors' bytes were highest: when, and what they were.

    op: the aten overload whose output made the peak (e.g. "add.Tensor"), the op_index-th op of
    its phase; storages: every storage alive then, as (category, phase made, op that made it,
    bytes), largest first.
    """

    bytes: int
    phase: str
    per_category_bytes: dict[str, int]
    activations_by_op: dict[str, int]  # the live activations at that moment, by the aten op that made them
    op: str = ""
    op_index: int = 0
    storages: tuple[tuple[str, str, str, int], ...] = ()

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "phase": self.phase, "op": self.op,
                "per_category_bytes": dict(self.per_category_bytes),
                "activations_by_op": dict(self.activations_by_op)}


@dataclass(frozen=True)
class StepMeasurement:
    """What one measured step held: the peak moment, each category's own maximum over the step,
    the highest total within each phase, and notes on how storages were counted."""

    peak: TracePeak
    max_per_category: dict[str, int]
    phase_peaks: dict[str, int]
    notes: tuple[str, ...] = ()


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
    # The bytes alive per category at every decoder layer's boundary (measure_training_timeline; a
    # prefill: measure_prefill_timeline),
    # as {"phase", "moment", "layer", "bytes", "per_category_bytes"}; `fit --timeline --trace` draws it.
    timeline: tuple[dict, ...] = field(default=())

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
    """The TorchDispatchMode subclass StorageTracker (built on first use so that importing this module
    stays light)."""
    global _StorageTracker
    if _StorageTracker is None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        tensor_type = torch.Tensor
        cast_ops = {torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout}

        class StorageTracker(TorchDispatchMode):
            """Every storage from the op that made it to its free, on a timeline; one category per storage.

            Storages alive before tracking (parameters, buffers, optimizer states, token ids) are
            `register`ed with their category; each storage an op returns is added when it appears
            (views and in-place results share a storage, so each is counted once, at its full size) and
            a weakref callback on it records its free. A new storage is an activation, or an optimizer
            temporary when made inside optimizer.step(); a cast of a weight to `autocast_dtype` is a
            weight (autocast's cached 16-bit copy). `mark` gives a storage the role it ends the step with
            (a parameter's .grad, the KV cache), and the role holds from the storage's birth: a gradient
            is one from the op that computed it, not from the moment AccumulateGrad stores it.
            `measurement()` replays the timeline with those roles.
            """

            def __init__(self) -> None:
                super().__init__()
                self._key_of: dict[int, int] = {}     # storage._cdata -> key, while the storage is alive
                self.size: list[int] = []             # by key: bytes
                self.role: list[str] = []             # by key: category
                self.made_by: list[tuple[str, str]] = []  # by key: (phase, op)
                self.events: list[tuple[int, int, str, int, str]] = []  # (key, +/- bytes, phase, op index, op)
                self.phase = "setup"
                self.ops_in_phase: dict[str, int] = {}
                self.autocast_dtype = None  # while set, a cast of a weight to it is a weight
                self.autocast_weight_copies = 0
                self._op = "register"
                self._refs: list[weakref.ref] = []    # a weakref must outlive its storage for the callback

            # Recording ---------------------------------------------------------------------

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                count = self.ops_in_phase[self.phase] = self.ops_in_phase.get(self.phase, 0) + 1
                self._op = func.__name__
                out = func(*args, **(kwargs or {}))
                category = "optimizer_temporaries" if self.phase == "optimizer" else "activations"
                if type(out) in (tuple, list):
                    for item in out:
                        if isinstance(item, tensor_type):
                            self._seen(item, category, count)
                        elif type(item) in (tuple, list):  # _foreach ops return lists
                            for inner in item:
                                if isinstance(inner, tensor_type):
                                    self._seen(inner, category, count)
                elif isinstance(out, tensor_type):
                    if (self.autocast_dtype is not None and func in cast_ops and out.dtype == self.autocast_dtype
                            and isinstance(args[0], tensor_type) and self.category_of(args[0]) == "weights"):
                        category = "weights"
                        self.autocast_weight_copies += self.key_of(out) is None
                    self._seen(out, category, count)
                return out

            def _seen(self, tensor, category: str, op_index: int) -> None:
                if tensor.is_meta:
                    return
                try:
                    storage = tensor.untyped_storage()
                except (RuntimeError, NotImplementedError):  # sparse or storage-less tensors
                    return
                key = self._key_of.get(storage._cdata)
                if key is None:
                    self._new(storage, category, op_index)
                elif storage.nbytes() != self.size[key]:  # resize_ grew (or shrank) it in place
                    delta = storage.nbytes() - self.size[key]
                    self.size[key] += delta
                    self.events.append((key, delta, self.phase, op_index, self._op))

            def _new(self, storage, category: str, op_index: int) -> int:
                key = len(self.size)
                cdata = storage._cdata
                self._key_of[cdata] = key
                self.size.append(storage.nbytes())
                self.role.append(category)
                self.made_by.append((self.phase, self._op))

                def freed(_ref: object) -> None:
                    self._freed(key, cdata)

                self._refs.append(weakref.ref(storage, freed))
                self.events.append((key, self.size[key], self.phase, op_index, self._op))
                return key

            def _freed(self, key: int, cdata: int) -> None:
                if self._key_of.get(cdata) == key:
                    del self._key_of[cdata]
                self.events.append((key, -self.size[key], self.phase, self.ops_in_phase.get(self.phase, 0),
                                    self._op))

            def register(self, tensors, category: str) -> None:
                """Count tensors that already exist (a tensor or an iterable of them; None skipped) as
                `category`; a storage already known keeps its category."""
                if tensors is None or isinstance(tensors, tensor_type):
                    tensors = (tensors,)
                for tensor in tensors:
                    if tensor is not None:
                        self._seen(tensor, category, self.ops_in_phase.get(self.phase, 0))

            def mark(self, tensors, category: str) -> None:
                """Give the storages of `tensors` the role they end the step with (from their birth on)."""
                if tensors is None or isinstance(tensors, tensor_type):
                    tensors = (tensors,)
                for tensor in tensors:
                    if tensor is None:
                        continue
                    self.register(tensor, category)
                    key = self.key_of(tensor)
                    if key is not None:
                        self.role[key] = category

            def set_phase(self, phase: str) -> None:
                self.phase = phase
                self.ops_in_phase.setdefault(phase, 0)

            # Reading -----------------------------------------------------------------------

            def key_of(self, tensor) -> int | None:
                return self._key_of.get(tensor.untyped_storage()._cdata)

            def category_of(self, tensor) -> str | None:
                key = self.key_of(tensor)
                return None if key is None else self.role[key]

            @property
            def live_bytes(self) -> int:
                """Bytes of the storages alive now."""
                return sum(delta for _, delta, *_ in self.events)

            def measurement(self, notes: tuple[str, ...] = ()) -> "StepMeasurement":
                """Replay the timeline with each storage's final category: each category's maximum, the
                highest total within each phase, and the peak moment with what was alive then."""
                role, events = self.role, self.events
                live = dict.fromkeys(CATEGORIES, 0)
                maxima = dict.fromkeys(CATEGORIES, 0)
                phase_peaks: dict[str, int] = {}
                total = peak_bytes = 0
                peak_at, peak_live = -1, dict(live)
                for index, (key, delta, phase, _, _) in enumerate(events):
                    category = role[key]
                    now = live[category] = live[category] + delta
                    total += delta
                    if delta > 0:
                        if now > maxima[category]:
                            maxima[category] = now
                        if total > phase_peaks.get(phase, 0):
                            phase_peaks[phase] = total
                        if total > peak_bytes:
                            peak_bytes, peak_at, peak_live = total, index, dict(live)
                return StepMeasurement(peak=self._peak(peak_at, peak_live), max_per_category=maxima,
                                       phase_peaks=phase_peaks, notes=tuple(notes))

            def _peak(self, at: int, per_category: dict[str, int]) -> "TracePeak":
                if at < 0:
                    return TracePeak(0, "setup", per_category, {})
                alive: dict[int, int] = {}
                for key, delta, *_ in self.events[:at + 1]:
                    alive[key] = alive.get(key, 0) + delta
                storages = sorted(((self.role[key], *self.made_by[key], n) for key, n in alive.items() if n),
                                  key=lambda item: -item[-1])
                by_op: dict[str, int] = {}
                for category, _, op, n in storages:
                    if category == "activations":
                        packet = op.split(".")[0]
                        by_op[packet] = by_op.get(packet, 0) + n
                _, _, phase, op_index, op = self.events[at]
                return TracePeak(bytes=sum(per_category.values()), phase=phase, per_category_bytes=per_category,
                                 activations_by_op=by_op, op=op, op_index=op_index, storages=tuple(storages))

        _StorageTracker = StorageTracker
    return _StorageTracker


_StorageTracker: type | None = None


def _torch():
    import torch

    return torch


# ---------------------------------------------------------------------------------------------
# Building the model


def import_trace_dependencies() -> tuple[Any, Any]:
    """(torch, transformers), or UserError naming the extra to install."""
    from tutor.trace.transformers_import import install

    install()  # transformers' scan of its model folders, read from the data dir
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


def _config_rejections() -> tuple[type[BaseException], ...]:
    """What a configuration class raises for fields it rejects: Python's errors, and (transformers 5's
    classes are huggingface_hub strict dataclasses) StrictDataclassError, which is none of them."""
    rejections: tuple[type[BaseException], ...] = (ValueError, KeyError, TypeError, AttributeError)
    try:
        from huggingface_hub.errors import StrictDataclassError
    except ImportError:  # an older huggingface_hub: its validators raise the errors above
        return rejections
    return rejections + (StrictDataclassError,)


def build_config(config: dict, attention: str):
    """The transformers config object for a config.json dict, or UserError (one line) if it cannot be built."""
    _, transformers = import_trace_dependencies()
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise UserError("--trace needs a config.json with a model_type")
    fields = {k: v for k, v in config.items() if k != "model_type"}
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **fields)
    except _config_rejections() as exc:  # what PretrainedConfig raises for what it rejects
        raise UserError(f"transformers {transformers.__version__} cannot build model_type {model_type!r}: "
                        f"{_one_line(exc)}") from None
    hf_config._attn_implementation = attention
    return hf_config


def _causal_lm_class(transformers, hf_config):
    try:
        return transformers.AutoModelForCausalLM._model_mapping[type(hf_config)]
    except KeyError:
        raise UserError(f"transformers {transformers.__version__} has no causal-LM class for model_type "
                        f"{hf_config.model_type!r}: fit answers (and --trace runs) decoder-only language models") from None


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


def build_model(config: dict, setup: TraceSetup, seed: int | None = None):
    """The causal-LM model class of `config`, at full size, with the setup's dtype and attention.

    seed None: weight initialisation is skipped (fake tensors have no values; `trace_step` builds
    inside its FakeTensorMode). A seed: real weights, initialised as `AutoModelForCausalLM.from_config`
    does after torch.manual_seed(seed) (the same values, so the same MoE routing, as a script that
    does that). Either way the parameters are made in the setup's dtype and the rotary buffers stay
    fp32, as from_pretrained(dtype=...) keeps them (model.to(dtype) would cast those too).
    """
    torch, transformers = import_trace_dependencies()
    from transformers.initialization import no_init_weights

    hf_config = build_config(config, setup.attention)
    model_class = _causal_lm_class(transformers, hf_config)
    text_config_class = getattr(hf_config, "sub_configs", {}).get("text_config")
    if text_config_class is not None and getattr(model_class, "config_class", None) == text_config_class:
        # As AutoModelForCausalLM.from_config does: a text-only causal LM of a composite config (Llama-4,
        # Qwen3.5, Emu3) is built from the text config.
        hf_config = hf_config.get_text_config()
        hf_config._attn_implementation = setup.attention
    dtype = getattr(torch, TRAIN_DTYPES[setup.dtype])
    try:
        if seed is None:
            with no_init_weights():
                try:
                    model = model_class._from_config(hf_config, attn_implementation=setup.attention, dtype=dtype)
                except RuntimeError as exc:
                    if "Couldn't swap" not in str(exc) or _active_fake_mode() is None:
                        raise
                    model = _built_on_meta_then_faked(model_class, hf_config, setup.attention, dtype)
            model.tie_weights()  # skipped with the initialisation; from_config and from_pretrained tie them
            return model
        torch.manual_seed(seed)
        return model_class._from_config(hf_config, attn_implementation=setup.attention, dtype=dtype)
    except Exception as exc:  # noqa: BLE001 - guards `fit --trace` on any config.json: model code built from
        # arbitrary fields raises anything (asserts included); the user sees one line, exit 2, not a traceback
        raise UserError(f"transformers {transformers.__version__} cannot build {model_class.__name__} from this "
                        f"config: {_one_line(exc)}") from None


def _active_fake_mode():
    """The FakeTensorMode in force, or None."""
    torch = _torch()
    return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)


def _built_on_meta_then_faked(model_class, hf_config, attention: str, dtype):
    """The model built on the meta device, each parameter and buffer then given a fake tensor of its
    shape, dtype and requires_grad in the FakeTensorMode in force (shared tensors stay shared).

    A constructor that casts a module (DeepSeek-V4's fp32 norms, `.to(dtype=torch.float32)` on a module
    just built) cannot run under FakeTensorMode: Module._apply swaps a fake parameter for its cast
    (torch.utils.swap_tensors), which torch refuses for a tensor that the fake mode's memo holds a weakref
    to. On the meta device the cast is an ordinary one; the tensors hold no values either way."""
    torch = _torch()
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily(), torch.device("meta"):
        model = model_class._from_config(hf_config, attn_implementation=attention, dtype=dtype)
    faked: dict[int, Any] = {}

    def fake_of(tensor):
        if id(tensor) not in faked:
            made = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
            faked[id(tensor)] = (torch.nn.Parameter(made, requires_grad=tensor.requires_grad)
                                 if isinstance(tensor, torch.nn.Parameter) else made)
        return faked[id(tensor)]

    for module in model.modules():
        for name, tensor in list(module._parameters.items()):
            if tensor is not None:
                module._parameters[name] = fake_of(tensor)
        for name, tensor in list(module._buffers.items()):
            if tensor is not None:
                module._buffers[name] = fake_of(tensor)
    return model


def token_ids(vocab: int, batch: int, seq_len: int, seed: int | None = None):
    """Random token ids, (batch, seq_len) int64; a seed: from a generator of its own (the global RNG untouched)."""
    torch = _torch()
    if seed is None:
        return torch.randint(0, vocab, (batch, seq_len))
    return torch.randint(0, vocab, (batch, seq_len), generator=torch.Generator().manual_seed(seed))


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

    torch optimizers create their states lazily inside the first step(); measuring that step would
    count the states as temporaries. One step() on zero gradients creates them, then the gradients
    are dropped: the measured step is the steady state (a real first step, `training_step`, leaves
    the same tensors; it costs a forward and a backward more).
    """
    torch = _torch()
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def enable_recompute(model) -> None:
    """Full recompute as transformers runs it: torch.utils.checkpoint around every decoder layer
    (activation_checkpointing_enable; gradient_checkpointing_enable before transformers 5 renamed it)."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


# ---------------------------------------------------------------------------------------------
# The measured steps


def training_step(model, optimizer, ids, labels=None, autocast_dtype=None, tracker=None) -> None:
    """One step of a user's loop, as transformers' Trainer runs it: the loss comes back from the model
    (labels given; None: the ids, as `labels=input_ids`), the output object is dropped before backward,
    then step() and zero_grad(set_to_none=True); the loss (Trainer keeps it, detached, for logging) and
    the batch live until the step ends. autocast_dtype: the forward under torch.autocast, as Trainer's
    bf16=True runs it. tracker: told the phases and, after backward, which storages are gradients.
    """
    torch = _torch()
    phase = tracker.set_phase if tracker is not None else (lambda _name: None)
    phase("forward")
    labels = ids if labels is None else labels
    if autocast_dtype is not None:
        with torch.autocast(device_type=ids.device.type, dtype=autocast_dtype):
            loss = model(input_ids=ids, labels=labels).loss
    else:
        loss = model(input_ids=ids, labels=labels).loss
    phase("backward")
    loss.backward()
    loss = loss.detach()  # as Trainer keeps it: the graph, and what autograd Functions kept on ctx, is freed
    if tracker is not None:
        tracker.mark([p.grad for p in model.parameters()], "gradients")
    phase("optimizer")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del loss


def register_model_states(tracker, model, optimizer=None) -> None:
    """Tell `tracker` the storages that exist before the step: parameters, buffers, optimizer states."""
    torch = _torch()
    tracker.register(model.parameters(), "weights")
    tracker.register(model.buffers(), "buffers")
    if optimizer is not None:
        tracker.register((value for state in optimizer.state.values() for value in state.values()
                          if isinstance(value, torch.Tensor)), "optimizer_states")


def measure_training_step(model, optimizer, ids, labels=None, autocast_dtype=None) -> StepMeasurement:
    """`training_step` under a new StorageTracker that knows the model states and the batch.

    Run a step (or `create_optimizer_states`) first: the measured step is then the steady state,
    with the optimizer states in place.
    """
    tracker = storage_tracker_class()()
    register_model_states(tracker, model, optimizer)
    tracker.register([ids, labels], "activations")
    tracker.autocast_dtype = autocast_dtype
    with tracker:
        training_step(model, optimizer, ids, labels, autocast_dtype, tracker)
    notes = []
    if tracker.autocast_weight_copies:
        notes.append(f"{tracker.autocast_weight_copies} autocast weight copies counted as weights")
    return tracker.measurement(tuple(notes))

# ---------------------------------------------------------------------------------------------
# The step's timeline at the layer boundaries (`fit --timeline --trace`, tests/test_fit_timeline.py).
# A forward hook on each decoder layer marks the moment its forward returned ("after layer i",
# forward); a hook on the gradient of the layer's input marks the moment backward went through it
# ("after layer i", backward: the input's gradient is the last thing the layer's backward computes,
# torch.Tensor.register_hook). The tracker's events are replayed with each storage's final category up
# to each mark, as `measurement` replays them for the peak; the moments are named as
# tutor.theory.fit_timeline names them, so the two line up.


def decoder_layers(model):
    """The model's decoder layers: the first ModuleList as long as config.num_hidden_layers (or n_layer)."""
    torch = _torch()
    count = getattr(model.config, "num_hidden_layers", None) or getattr(model.config, "n_layer", None)
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == count:
            return list(module)
    raise ValueError("no ModuleList of the decoder layers found")


def measure_training_timeline(model, optimizer, ids, labels=None,
                              autocast_dtype=None) -> tuple[tuple[TimelineMoment, ...], StepMeasurement]:
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
    notes = []
    if tracker.autocast_weight_copies:  # as measure_training_step says it
        notes.append(f"{tracker.autocast_weight_copies} autocast weight copies counted as weights")
    return _replay(tracker, marks), tracker.measurement(tuple(notes))


def _replay(tracker, marks) -> tuple[TimelineMoment, ...]:
    """Per-category bytes alive at each mark (an index into the tracker's events), by final category."""
    live = dict.fromkeys(CATEGORIES, 0)
    moments = []
    position = 0
    for phase, name, layer, at in sorted(marks, key=lambda mark: mark[3]):
        for key, delta, *_ in tracker.events[position:at]:
            live[tracker.role[key]] += delta
        position = at
        moments.append(TimelineMoment(phase, name, layer, dict(live)))
    return tuple(moments)


def cache_argument(model) -> str:
    """The name of forward's KV-cache keyword: transformers renamed `past_key_values` to `cache` during 5.x
    (5.17 has only `past_key_values` and drops an unknown `cache=` into **kwargs unused; the old name warns
    until 5.40)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


# What a transformers 5 cache layer stores, by attribute (transformers/cache_utils.py): an attention layer's keys and
# values (DynamicLayer, DynamicSlidingWindowLayer: they grow with the prompt) and a linear-attention layer's
# conv and recurrent states, one of each per state index (LinearAttentionLayer for Mamba, Mamba-2, gated
# delta-net and short-convolution layers, a fixed size per sequence); a hybrid layer
# (LinearAttentionAndFullAttentionLayer: Zamba2's shared attention beside its Mamba, Falcon-H1's parallel
# heads) holds both.
CACHE_PARTS = {"kv": ("keys", "values"), "state": ("conv_states", "recurrent_states")}


def cache_layer_parts(cache) -> list[tuple[str, dict[str, list]]]:
    """Each layer of a transformers 5 Cache: (its class name, {"kv": key and value tensors, "state": conv and
    recurrent state tensors}), in layer order; a layer without storage (DummyLayer) has empty lists."""
    out = []
    for layer in getattr(cache, "layers", ()):
        parts: dict[str, list] = {}
        for part, names in CACHE_PARTS.items():
            found: list = []
            for name in names:
                value = getattr(layer, name, None)
                values = value.values() if isinstance(value, dict) else (value,)
                found.extend(v for v in values if v is not None and hasattr(v, "untyped_storage"))
            parts[part] = found
        out.append((type(layer).__name__, parts))
    return out


def cache_tensors(cache) -> list:
    """Every tensor a transformers 5 Cache holds: attention layers' keys and values, and linear-attention
    (SSM, gated delta-net, short-convolution) layers' conv and recurrent states (cache_layer_parts)."""
    return [t for _kind, parts in cache_layer_parts(cache) for tensors in parts.values() for t in tensors]


def measure_prefill(model, ids) -> StepMeasurement:
    """A prefill of `ids` as generate() runs it, measured: no autograd, a DynamicCache, logits for the
    last position only, copied to fp32 for sampling. The cache's storages are the KV cache."""
    tracker, _marks, notes = _traced_prefill(model, ids, mark_layers=False)
    return tracker.measurement(notes)


def measure_prefill_timeline(model, ids) -> tuple[tuple[TimelineMoment, ...], StepMeasurement]:
    """`measure_prefill`, marked as each decoder layer starts ("into layer i": the moment between two
    layers) and at the end (the last position's fp32 logits beside the whole cache): the moments
    in order, by each storage's final category (the cache's storages are kv_cache from their birth),
    and the prefill's measurement (its peak)."""
    tracker, marks, notes = _traced_prefill(model, ids, mark_layers=True)
    return _replay(tracker, marks), tracker.measurement(notes)


def supports_default_cache(model) -> bool:
    """Whether generate() gives this model a DynamicCache (GenerationMixin._supports_default_dynamic_cache,
    transformers/generation/utils.py): MiniMax, RWKV, xLSTM, XLNet and Reformer keep a cache of their own."""
    supports = getattr(model, "_supports_default_dynamic_cache", None)
    return bool(supports()) if callable(supports) else True


def _traced_prefill(model, ids, mark_layers: bool):
    torch = _torch()
    from transformers import DynamicCache

    model.eval()
    tracker = storage_tracker_class()()
    register_model_states(tracker, model)
    tracker.register(ids, "activations")
    marks: list[tuple[str, str, int | None, int]] = []
    handles = []

    def into(index):
        def hook(_module, _args):
            marks.append(("prefill", f"into layer {index}", index, len(tracker.events)))
        return hook

    if mark_layers:
        handles = [layer.register_forward_pre_hook(into(index)) for index, layer in enumerate(decoder_layers(model))]
    try:
        with tracker, torch.no_grad():
            tracker.set_phase("prefill")
            cache: object
            if supports_default_cache(model):
                cache = DynamicCache(config=model.config)
                out = model(input_ids=ids, **{cache_argument(model): cache}, use_cache=True, logits_to_keep=1)
            else:  # as generate() leaves it: the model makes its own cache (MiniMax's MiniMaxCache)
                out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                cache = getattr(out, "past_key_values", None)
            next_token_logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
            marks.append(("prefill", "end of prefill: the next token's logits", None, len(tracker.events)))
    finally:
        for handle in handles:
            handle.remove()
    kv = cache_tensors(cache)
    tracker.mark(kv, "kv_cache")
    notes = []
    stored = sum(t.untyped_storage().nbytes() for t in kv)
    viewed = sum(t.numel() * t.element_size() for t in kv)
    if stored != viewed:
        notes.append(f"KV cache storages hold {stored:,} B, the cache's views {viewed:,} B "
                     "(sliding layers keep the whole prompt until the first decode step)")
    del next_token_logits, out, cache, kv
    return tracker, marks, tuple(notes)


# ---------------------------------------------------------------------------------------------
# Values on fake tensors. A fake tensor has a shape and no values, so code that reads one (.item(),
# .tolist(), a Python `if` on a tensor: aten._local_scalar_dense) or makes a tensor sized by them
# (aten.nonzero, boolean indexing) stops a fake trace. Most such values are small and follow from the
# token ids and positions alone (XLM's sequence lengths, Reformer's largest position id); the rest come
# from the weights (an MoE router's choice of experts, BLT's patch boundaries from its entropy model),
# whose values a fake model does not have, and a real model at random initialisation would not give
# the trained model's either. FakeValues carries a real copy of every small tensor computable from
# known values, and gives the weight-derived ones a stated stand-in, recorded as an assumption.

# A tensor of more elements than this gets no real copy: the calibration's inputs are a few hundred
# tokens, and their masks s x s; anything larger is hidden states, which no value read needs.
VALUE_COPY_ELEMENTS = 1 << 18
# Ops whose indices pick among values the trace does not have: the stand-in spreads them evenly.
_PICKING_OPS = ("topk", "argmax", "argmin", "max", "min", "sort", "argsort")
_COMPARISONS = ("gt", "ge", "lt", "le", "eq", "ne")
# Stated in the answer's note when a value read rested on the stand-in.
UNIFORM_PICK = ("the trace routes tokens evenly: where the model's code reads which experts, buckets or "
                "positions its weights pick (top-k, argmax), each is picked equally often (tokens per expert: "
                "the uniform share)")
COMPARISON_TRUE = ("the trace takes comparisons of weight-derived values as true at every position where the "
                   "model reads them (BLT's entropy patcher: a patch at every byte, the most patches)")


def fake_values_class():
    """The TorchDispatchMode subclass FakeValues (built on first use, as storage_tracker_class)."""
    global _FakeValues
    if _FakeValues is not None:
        return _FakeValues
    import torch
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        unset_fake_temporarily,
    )
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten
    from torch.utils.weak import WeakTensorKeyDictionary

    aten = torch.ops.aten
    read_ops = {aten._local_scalar_dense.default}
    not_copied = {aten.detach.default, aten.empty.memory_format, aten.empty_strided.default,
                  aten.empty_like.default, aten.new_empty.default}
    sized_by_values = (DataDependentOutputException, DynamicOutputShapeException)

    class FakeValues(TorchDispatchMode):
        """Under a FakeTensorMode: a real copy (`copies`) of each small tensor whose inputs all have one,
        made by running the op on those copies; a value read or a value-sized op on such a tensor is
        answered from its copy, and its fake result made at the copy's size. Indices picked from values
        without a copy (top-k, argmax) are spread evenly, and comparisons of such values are true: a
        stand-in whose first read records `assumptions`. A write from values without a copy drops the
        copies of the storage written (any view of it)."""

        def __init__(self) -> None:
            super().__init__()
            self.copies = WeakTensorKeyDictionary()    # fake tensor -> (real tensor, stand-in reason, version)
            self._written: dict[int, int] = {}          # storage -> writes from unknown values
            self.assumptions: list[str] = []

        def give_token_ids(self, ids, vocab: int) -> None:
            """Values for fake token ids made before: random ids below `vocab`, as the real trace's."""
            with unset_fake_temporarily():
                real = torch.randint(0, vocab, tuple(ids.shape), generator=torch.Generator().manual_seed(1))
            self.copies[ids] = (real, "", self._version(ids))

        def _version(self, tensor) -> int:
            return self._written.get(tensor.untyped_storage()._cdata, 0)

        def _copy(self, tensor):
            entry = self.copies.get(tensor)
            if entry is None or entry[2] != self._version(tensor):
                return None
            return entry

        def _read(self, entry) -> None:
            if entry[1] and entry[1] not in self.assumptions:
                self.assumptions.append(entry[1])

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            leaves, spec = tree_flatten((args, kwargs))
            tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
            entries = [self._copy(t) for t in tensors]
            known = all(entry is not None for entry in entries)
            if func in read_ops:
                if known and entries:
                    self._read(entries[0])
                    with unset_fake_temporarily():
                        return entries[0][0].item()
                return func(*args, **kwargs)
            error = None
            try:
                out = func(*args, **kwargs)
            except sized_by_values as exc:
                if not (known and tensors):
                    raise
                out, error = None, exc
            try:
                ran = False
                if error is not None or (func not in not_copied and self._small(out)):
                    if known and (tensors or error is None):
                        result = self._on_copies(func, leaves, spec, entries)
                        if result is not None:
                            ran = True
                            out = self._fake_like(result, tensors[0].device) if error else self._pair(out, *result)
                    elif tensors:
                        self._stand_in(func, args, kwargs, out)
                if error is not None and not ran:
                    raise error
                if func._schema.is_mutable and not ran:
                    self._mark_written(func, args, kwargs)
                return out
            finally:
                # The exception's traceback holds this frame, and a frame holds its callers (f_back): kept
                # here, the model's forward frames and every tensor they name (hidden states of each layer
                # up the stack) would live until Python's cycle collector ran, not until the code dropped
                # them as on real tensors (DBRX's experts, torch.where per expert: 140 kB of a 1 x 64-token
                # prefill held, the trace's regions off by the collector's timing).
                del error

        def _mark_written(self, func, args, kwargs) -> None:
            """A write the copies did not follow: the copies of the storages written are stale."""
            for index, argument in enumerate(func._schema.arguments):
                if argument.alias_info is not None and argument.alias_info.is_write:
                    written = args[index] if index < len(args) else kwargs.get(argument.name)
                    if isinstance(written, torch.Tensor):
                        cdata = written.untyped_storage()._cdata
                        self._written[cdata] = self._written.get(cdata, 0) + 1

        @staticmethod
        def _small(out) -> bool:
            flat, _ = tree_flatten(out)
            outs = [o for o in flat if isinstance(o, torch.Tensor)]
            return bool(outs) and all(o.numel() <= VALUE_COPY_ELEMENTS and not o.is_meta for o in outs)

        def _on_copies(self, func, leaves, spec, entries):
            """(the op's real result on the copies, the stand-in it rests on), or None if it fails."""
            reals = iter(entry[0] for entry in entries)
            args, kwargs = tree_unflatten([next(reals) if isinstance(leaf, torch.Tensor) else leaf
                                           for leaf in leaves], spec)
            try:
                with unset_fake_temporarily():
                    real = func(*args, **kwargs)
            except Exception:  # noqa: BLE001 - a copy that cannot be made is a value not known, as before
                return None
            return real, next((entry[1] for entry in entries if entry[1]), "")

        def _pair(self, out, real, reason):
            fakes, _ = tree_flatten(out)
            reals, _ = tree_flatten(real)
            for fake, value in zip(fakes, reals):
                if isinstance(fake, torch.Tensor) and isinstance(value, torch.Tensor) and fake.shape == value.shape:
                    self.copies[fake] = (value, reason, self._version(fake))
            return out

        def _fake_like(self, result, device):
            """The fake result of a value-sized op: empty fakes at its real result's sizes."""
            real, reason = result

            def fake_of(value):
                if not isinstance(value, torch.Tensor):
                    return value
                fake = torch.empty(value.shape, dtype=value.dtype, device=device)
                self.copies[fake] = (value, reason, self._version(fake))
                return fake

            if reason:  # the result's size itself rests on the stand-in
                self._read((None, reason))
            return tree_map(fake_of, real)

        def _stand_in(self, func, args, kwargs, out) -> None:
            """Values for the indices an op picks, or the truth of a comparison, among values not known."""
            name = func.__name__.split(".")[0]
            if name in _COMPARISONS and isinstance(out, torch.Tensor) and out.dtype == torch.bool:
                with unset_fake_temporarily():
                    self.copies[out] = (torch.ones(out.shape, dtype=torch.bool), COMPARISON_TRUE, self._version(out))
                return
            outs = out if isinstance(out, (tuple, list)) else (out,)
            indices = next((o for o in reversed(outs) if isinstance(o, torch.Tensor) and o.dtype == torch.int64), None)
            if name not in _PICKING_OPS or indices is None or not isinstance(args[0], torch.Tensor):
                return
            dim = None
            for index, argument in enumerate(func._schema.arguments):
                if argument.name == "dim":
                    dim = args[index] if index < len(args) else kwargs.get("dim", argument.default_value)
            with unset_fake_temporarily():
                picks = _even_picks(torch, tuple(indices.shape), tuple(args[0].shape), dim)
            self.copies[indices] = (picks, UNIFORM_PICK, self._version(indices))

    _FakeValues = FakeValues
    return FakeValues


_FakeValues: type | None = None


def _even_picks(torch, shape, source_shape, dim):
    """Indices of `shape` into a dimension of `source_shape` picked evenly: along `dim` (None: the
    flattened tensor), row r's j-th pick is (r * k + j) mod n, k picks per row among n, so that each of
    the n is picked equally often (to one) and a row picks no index twice while k <= n."""
    if dim is None:
        n = max(1, int(torch.Size(source_shape).numel()))
        count = int(torch.Size(shape).numel())
        return (torch.arange(count) % n).reshape(shape)
    ndim = len(shape)
    dim = dim % max(ndim, 1)
    n = source_shape[dim] if len(source_shape) == ndim else max(1, int(torch.Size(source_shape).numel()))
    k = shape[dim] if ndim else 1
    moved = list(shape[:dim]) + list(shape[dim + 1:]) + [k]
    rows = int(torch.Size(moved[:-1]).numel())
    picks = (torch.arange(rows).unsqueeze(1) * k + torch.arange(k).unsqueeze(0)) % max(n, 1)
    return picks.reshape(moved).movedim(-1, dim).contiguous() if ndim else picks.reshape(())


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
    3. That fallback's backward walks the experts' token offsets (`offs.tolist()`), values a fake
       tensor lacks. transformers 5.25 wraps it in an op with a shape-only fake; older ones (5.17)
       run it as Python and the traced backward stops at aten._local_scalar_dense. There the
       fallback runs as `_grouped_mm_on_fake_tensors`, which allocates and saves what it does.
    4. Code that reads values (FakeValues): small tensors carry real copies, and what the weights
       would decide gets a stated stand-in. Yields the FakeValues mode (None on real tensors): give it
       the token ids (`give_token_ids`), and read its `assumptions` after the step.
    5. copy.deepcopy of a fake tensor (Inkling-2-Loop copies its cache layers for the looped passes)
       fails inside torch (Tensor.__deepcopy__ sets a fake tensor's meta storage on a CPU one); a copy
       by clone() makes the same new storage of the same size.
    """
    if not fake:
        yield None
        return
    import torch
    from torch._subclasses.fake_tensor import FakeTensor
    from transformers import masking_utils
    from transformers.integrations import moe

    can_use_grouped_mm = moe._can_use_grouped_mm

    def grouped_mm_on_meta(input, weight, offs):
        return can_use_grouped_mm(input, weight, offs) and weight.dtype == torch.bfloat16

    patches: list[Any] = [patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None),
               patch.object(moe, "_can_use_grouped_mm", grouped_mm_on_meta),
               patch.object(FakeTensor, "__deepcopy__", _fake_deepcopy, create=True)]
    if hasattr(moe, "_grouped_mm") and not hasattr(torch.ops.transformers, "grouped_mm_fallback_backward"):
        grouped_mm = moe._grouped_mm
        fallback = _grouped_mm_on_fake_tensors()

        def grouped_mm_traceable(input, weight, offs):
            if grouped_mm_on_meta(input, weight, offs):
                return grouped_mm(input, weight, offs)
            return fallback.apply(input.to(weight.dtype), weight, offs)

        patches.append(patch.object(moe, "_grouped_mm", grouped_mm_traceable))
    with contextlib.ExitStack() as stack:
        for active in patches:
            stack.enter_context(active)
        yield stack.enter_context(fake_values_class()())


def _fake_deepcopy(tensor, memo):
    """copy.deepcopy of a fake tensor: a clone (a new storage of its size), a leaf's requires_grad kept."""
    if id(tensor) not in memo:
        copied = tensor.detach().clone()
        memo[id(tensor)] = copied.requires_grad_(tensor.requires_grad) if tensor.is_leaf else copied
    return memo[id(tensor)]


def _grouped_mm_on_fake_tensors():
    """transformers' grouped-mm fallback (transformers.integrations.moe, 5.17) for fake tensors: the
    same output (zeros of S x out), the same tensors held for backward (input and weight saved, the offsets
    kept on ctx) and the same gradients (zeros_like of each, filled in place per expert by the real one),
    without reading the offsets."""
    torch = _torch()

    class GroupedMmFallback(torch.autograd.Function):  # type: ignore[name-defined]  # torch comes from _torch()
        @staticmethod
        def forward(ctx, input, weight, offs):
            ctx.save_for_backward(input, weight)
            ctx.offs = offs  # the real op keeps them until backward: their bytes stay live as long
            return torch.zeros(input.size(0), weight.size(2), device=input.device, dtype=input.dtype)

        @staticmethod
        def backward(ctx, grad_output):
            input, weight = ctx.saved_tensors
            return torch.zeros_like(input), torch.zeros_like(weight), None

    return GroupedMmFallback


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
    """Build `config`'s model and run one measured step of `setup` (on fake tensors unless setup.fake
    is False: then real ones, seeded by setup.seed)."""
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
            measured, timeline = _measured_step(model, optimizer, setup, transformers.__version__)
        stepped = time.perf_counter()
    return MemoryTrace(
        model_type=model.config.model_type, model_class=type(model).__name__,
        params=sum(p.numel() for p in model.parameters()), setup=setup,
        attention_traced=model.config._attn_implementation,
        optimizer_traced=_optimizer_name(optimizer) if optimizer is not None else "",
        device_traced=next(model.parameters()).device.type,
        peak=measured.peak, max_per_category=dict(measured.max_per_category), phase_peaks=dict(measured.phase_peaks),
        seconds={"import": round(imported - started, 3), "build": round(built - imported, 3),
                 "step": round(stepped - built, 3)},
        transformers_version=transformers.__version__, torch_version=torch.__version__,
        notes=((note,) if note else ()) + measured.notes, timeline=timeline)


def _model_and_optimizer(torch, config: dict, setup: TraceSetup):
    """The model in the mode of the step, and (training) its optimizer with its states created."""
    model = build_model(config, setup, seed=None if setup.fake else setup.seed)
    model.train(setup.mode == "train")
    if setup.mode == "inference":
        return model, None
    model.config.use_cache = False  # as transformers' Trainer sets it (TrainingArguments.use_cache)
    if setup.recompute:
        enable_recompute(model)
    optimizer = _optimizer(torch, [p for p in model.parameters() if p.requires_grad], setup)
    create_optimizer_states(model, optimizer)
    return model, optimizer


def _measured_step(model, optimizer, setup: TraceSetup, transformers_version: str) -> tuple[StepMeasurement, tuple]:
    """The setup's step, measured, and its timeline at the layer boundaries; a failure
    inside transformers becomes one UserError line."""
    torch = _torch()
    vocab = model.config.get_text_config().vocab_size
    ids = token_ids(vocab, setup.batch, setup.seq_len, seed=None if setup.fake else setup.seed + 1)
    try:
        with _fake_tensor_workarounds(setup.fake) as values:
            if values is not None:
                values.give_token_ids(ids, vocab)
            if setup.mode == "inference":
                moments, measured = measure_prefill_timeline(model, ids)
                return measured, tuple(moment.to_json() for moment in moments)
            labels = ids.clone()  # as transformers' language-modelling data collator makes them
            moments, measured = measure_training_timeline(
                model, optimizer, ids, labels, autocast_dtype=torch.bfloat16 if setup.autocast else None)
            return measured, tuple(moment.to_json() for moment in moments)
    except UserError:
        raise
    except Exception as exc:  # noqa: BLE001 - guards `fit --trace`: the model's own forward/backward on the
        # user's config may raise anything; one line naming the transformers version, exit 2
        what = "training step" if setup.mode == "train" else "prefill"
        raise UserError(f"the traced {what} of {type(model).__name__} failed in transformers "
                        f"{transformers_version}: {_one_line(exc)}") from None
