"""`fit` for a model type without a hand profile: counted on the real model class, calibrated by traces.

tutor.theory.models has hand-written formulas for SUPPORTED_MODEL_TYPES. Any other decoder-only model
transformers can build is answered here, in two steps:

1. Parameters (`measured_architecture`): the model's own causal-LM class built from the config on
   the meta device (no memory, no initialisation); every parameter is counted once, layer by layer
   and split by the module that holds it (attention, MLP or experts, router, norms): exact by
   construction. The Architecture's sizes (hidden, heads, KV heads, ...) are read from the
   transformers config object, so every spelling its attribute_map knows is read.
2. Activations (`calibrated_for`): for the request's setup (mode, precision, attention, recompute),
   the model is built at two small depths on fake tensors (2 and 3 decoder layers; for a model that
   mixes kinds of layers, one and two repeats of its pattern of kinds, every per-layer list of the
   config rebuilt for that depth by tutor.trace.layer_count) and one step is traced
   (tutor.trace.memory_trace's StorageTracker, the tracker of `fit --trace`; forward and backward,
   the optimizer is fit's formula) at two to four small shapes, as many as the basis terms the setup
   can hold (FIT_SHAPES: a constant, b·s, and b for a prefill's last logits, b·s² for eager scores,
   dropout, a sliding-window mask, and in training always). Each quantity, per region of the step
   (tutor.theory.calibrated; in training, op by op, keeping the ops that are a region's largest at
   some shape), is fitted as head + layers x per-layer terms, then checked against one more shape at
   the deeper depth that the fit never saw. Prompts longer than a sliding window are calibrated
   apart, beyond it.
   The coefficients go to tutor.theory, which answers at any shape as fast as its formulas do.
   The cache is fitted per kind of cache layer (keys and values, conv and recurrent state), counted with
   the whole model's layers of each kind as the DynamicCache transformers builds from the config lays them
   out (cache_layer_counts). A scan that pads the prompt to whole chunks (scan_chunk) adds a b·S term,
   S the padded length, traced at whole chunks and one length that pads up. A setup whose fit misses its
   check by more than AT_SHAPE_ERROR is traced again at the requested shape itself.

Both are cached in the data dir (calibrations/<hash>.json), keyed by a hash of the config and the
torch and transformers versions (read from package metadata: a cached answer imports neither).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from importlib import metadata
from typing import TYPE_CHECKING

from tutor.errors import UserError
from tutor.trace import announce
from tutor.theory.calibrated import (
    BASIS,
    CACHE_PREFIX,
    GRADIENTS_PREFIX,
    KV_CACHE,
    moment_region,
    REGION_PREFIX,
    TRACE_ATTENTION,
    WEIGHT_COPIES_PREFIX,
    Calibration,
    CalibratedSetup,
    Fitted,
    basis_values,
    padded_length,
    at_shape_key,
    setup_key,
)
from tutor.theory.models import (
    SPELLINGS,
    code_mechanisms,
    MODEL_DTYPE,
    SUPPORTED_MODEL_TYPES,
    Architecture,
    BufferKind,
    MeasuredLayer,
    MeasuredParams,
    architecture_from_config,
    shown,
)

if TYPE_CHECKING:
    from tutor.files.models import ModelConfig

CALIBRATION_FORMAT = 8  # 3: per-layer lists rebuilt at each traced depth, depths of whole patterns; 4: the layer's
# code read too (gated MLP, norm kind and count, activation: _layer_code), which the step's operations count; 5: the
# cache per kind of layer (KV, conv and recurrent state), chunked scans' padding; 6: training moments kept op by op
# (a region's maximum may move between ops); 7: every buffer of the meta build (BufferKind), persistent or not;
# 8: a model that mixes kinds of layers has its backward's top and bottom regions over a whole repeat of its
# pattern (the highest and lowest layer of each kind)
OP_MARK = "@op"  # in a training moment's name: "<region>@op<n>", the n-th op of the region
REGION_MAXIMUM = ":maximum"  # "<region>:maximum": the region's largest, kept where no op is in every trace
CACHE_FOLDER = "calibrations"
TRACE_EXTRA = "pip install -e '.[trace]' from a clone of tensor-tutor (it adds transformers)"
# (batch, seq_len) traced for the fit, by the basis terms it needs (as many shapes as terms): the
# constant and per-token terms always; per sequence (the last position's logits) for a prefill; s x s
# where attention keeps scores (eager, SDPA's math kernel under dropout) or a sliding window shorter
# than the traced prompts makes a mask.
FIT_SHAPES: dict[tuple[str, ...], tuple[tuple[int, int], ...]] = {
    ("1", "b*s"): ((1, 32), (1, 96)),
    ("1", "b", "b*s"): ((1, 32), (2, 32), (1, 96)),
    ("1", "b*s", "b*s^2"): ((1, 32), (1, 64), (1, 96)),
    ("1", "b", "b*s", "b*s^2"): ((1, 32), (2, 32), (1, 64), (1, 96))}
CHECK_SHAPE = (2, 128)                                        # never fitted: the check
# A scan that pads the prompt to whole chunks (chunk_size: Mamba-2, Bamba, Zamba2, ...) is traced at
# lengths in chunks, two of them padded to the same whole chunks, so that the per-token terms that
# follow the prompt (b·s) and those that follow its padded length (b·S) separate: (batch, chunks).
CHUNKED_SHAPES = {"1": (1, 1.0), "b*s": (1, 2.0), "b*S": (1, 1.5), "b": (2, 1.0), "b*s^2": (1, 3.0)}
CHUNKED_CHECK = (2, 2.5)                                      # padded to 3 chunks, never traced
# A setup whose fit missed its own check by more than this is traced again at the requested shape itself
# (fake tensors cost the same at any length: only the layer count is small) and answered from that.
AT_SHAPE_ERROR = 0.10
FIT_LAYERS = (2, 3)   # with one layer the top layer is the bottom one: two regions would be one
CHECK_LAYERS = 3
# FIT_LAYERS is for a model whose layers are all of one kind. A model that mixes kinds (sliding and
# full attention, linear and full attention, dense and MoE layers) is traced at depths that are whole
# repeats of its pattern of kinds (tutor.trace.layer_count: Gemma-3's 5 sliding and 1 full layer, at 6
# and 12 layers): the per-layer terms are then the model's own mix, and each depth has every kind
# (a hybrid model of 2 linear-attention layers alone does not run).
PROFILE = "calibrated-trace"


# ---------------------------------------------------------------------------------------------
# Resolving MODEL


def resolve_any_model(spec: str) -> tuple[Architecture, str]:
    """A preset, config.json or model folder -> (Architecture, source) (architecture_of its config)."""
    from tutor.files.models import read_model_config

    found = read_model_config(spec)
    return architecture_of(found), found.source


def architecture_of(found: ModelConfig) -> Architecture:
    """The Architecture of a config as read (tutor.files.models.read_model_config): the hand profile when the
    model type has one, else the real model class counted on the meta device (needs transformers)."""
    model_type = found.config.get("model_type")
    if model_type in SUPPORTED_MODEL_TYPES or not isinstance(model_type, str) or not model_type:
        return architecture_from_config(found.config, found.name)
    return measured_architecture(found.config, found.name)


def versions() -> str:
    """torch and transformers versions from package metadata (imports neither); '' if one is missing."""
    try:
        return f"torch {metadata.version('torch')}, transformers {metadata.version('transformers')}"
    except metadata.PackageNotFoundError:
        return ""


def _require_transformers(model_type: object) -> None:
    if not versions():
        raise UserError(f"model_type {shown(model_type)!r} has no hand profile; counting and tracing its real "
                        f"transformers model needs the [trace] extra: {TRACE_EXTRA}")
    from tutor.trace.transformers_import import install

    install()


def config_hash(config: dict) -> str:
    """The cache key of a config: its JSON (keys sorted), the versions and this module's format."""
    text = json.dumps(config, sort_keys=True, default=str) + versions() + f"format {CALIBRATION_FORMAT}"
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _cache_path(config: dict):
    from tutor.files.storage import data_dir

    return data_dir() / CACHE_FOLDER / f"{config_hash(config)}.json"


def _read_cache(config: dict) -> dict:
    from tutor.files.storage import read_json

    empty: dict[str, object] = {}
    entry, _warning = read_json(_cache_path(config), empty)
    return entry if entry.get("format") == CALIBRATION_FORMAT else {}


def cache_file(config: dict) -> str:
    """Where `config`'s counts and calibrations are kept (one file per config, versions and format)."""
    return str(_cache_path(config))


def _write_cache(config: dict, entry: dict) -> None:
    from tutor.files.storage import write_json_atomic

    try:
        write_json_atomic(_cache_path(config), {**entry, "format": CALIBRATION_FORMAT})
    except OSError:
        pass  # a read-only data dir costs the next call its calibration, nothing else


def measured_architecture(config: dict, name: str = "") -> Architecture:
    """The Architecture of a model type without a hand profile, with the real model's parameter
    counts (cached), and whatever calibrations of it are cached."""
    model_type = config.get("model_type")
    _require_transformers(model_type)
    entry = _read_cache(config)
    if "architecture" not in entry:
        entry = {"architecture": _measure(config), "setups": {}, "traced_layers": list(traced_depths(config)),
                 "cache_layers": cache_layer_counts(config), "chunk": scan_chunk(config)}
        _write_cache(config, entry)
    return _architecture_from_entry(entry, config, name)


def _architecture_from_entry(entry: dict, config: dict, name: str) -> Architecture:
    fields = dict(entry["architecture"])
    measured = fields.pop("measured")
    measured["layers"] = tuple(MeasuredLayer(**layer) for layer in measured["layers"])
    measured["buffer_kinds"] = tuple(BufferKind(**{**kind, "shape": tuple(kind["shape"]), "layers": tuple(kind["layers"])})
                                     for kind in measured.get("buffer_kinds", ()))
    for key in ("dense_layer_indices", "sliding_window_layer_indices"):
        fields[key] = tuple(fields[key])
    setups = tuple(_setup_from_json(key, value) for key, value in entry.get("setups", {}).items())
    calibration = Calibration(model_class=measured["model_class"], versions=versions(), setups=setups,
                              config_json=json.dumps(config, sort_keys=True, default=str), window=shortest_window(config))
    low, high = entry.get("traced_layers", FIT_LAYERS)
    chunk = int(entry.get("chunk") or 0)
    calibration = replace(calibration, chunk=chunk,
                          cache_layers=tuple((str(kind), int(n)) for kind, n in entry.get("cache_layers") or ()))
    padded = f" and in the prompt padded to whole {chunk}-token chunks of its scan" if chunk else ""
    cache = ("; the cache counted per kind of layer (attention keys and values, conv and recurrent state)"
             if calibration.cache_layers else "")
    note = (f"model_type {fields['model_type']!r} has no hand profile: parameters counted on "
            f"{measured['model_class']} built on the meta device (exact); activations and the peak from "
            f"traces of the real model with {low} and {high} layers at small shapes, fitted in b·s and b·s²{padded}"
            f"{cache} (calibrated-trace, {versions()})")
    return Architecture(name=name or fields["model_type"], measured=MeasuredParams(**measured), calibration=calibration,
                        profile=PROFILE, profile_note=note, **fields)


def _setup_from_json(key: str, value: dict) -> CalibratedSetup:
    chunk = int(value.get("chunk") or 0)
    quantities = tuple((name, Fitted(tuple(q["head"]), tuple(q["per_layer"]), chunk))
                       for name, q in value["quantities"].items())
    return CalibratedSetup(key=key, quantities=quantities, check=tuple(value["check"]),
                           check_error=value["check_error"], traced_element_bytes=value["traced_element_bytes"],
                           fitted_shapes=tuple(tuple(s) for s in value["fitted_shapes"]),
                           assumptions=tuple(str(a) for a in value.get("assumptions", ())))


def _setup_json(setup: CalibratedSetup) -> dict:
    return {"quantities": {name: {"head": list(f.head), "per_layer": list(f.per_layer)} for name, f in setup.quantities},
            "check": list(setup.check), "check_error": setup.check_error,
            "traced_element_bytes": setup.traced_element_bytes, "fitted_shapes": [list(s) for s in setup.fitted_shapes],
            "chunk": next((f.chunk for _, f in setup.quantities), 0), "assumptions": list(setup.assumptions)}


# ---------------------------------------------------------------------------------------------
# 1. Parameters on the meta device


def _get(config_obj, names: tuple[str, ...], default=None):
    for name in names:
        try:
            value = getattr(config_obj, name, None)
        except Exception:  # noqa: BLE001 - e.g. Gemma-4's per-layer attributes refuse a global read
            value = None
        if value is not None and not isinstance(value, (list, dict)):
            return value
    return default


def _classify(name: str) -> str:
    """Which part of a decoder layer a parameter belongs to, by its module path."""
    lowered = name.lower()
    parts = lowered.split(".")
    if "experts" in lowered and "shared" not in lowered:
        return "routed"
    if any(p in ("router", "gate") for p in parts[:-1]) and "mlp" in lowered or "router" in lowered:
        return "router"
    if any(p.endswith(("norm", "layernorm")) or p.startswith(("ln", "norm")) for p in parts[:-1]):
        attention_norm = any(p in ("q_norm", "k_norm", "q_layernorm", "k_layernorm") for p in parts)
        return "attention" if attention_norm else "norms"
    if "att" in lowered:
        return "attention"
    return "mlp"


def _decoder_layers(model, num_layers: int | tuple[int, ...] | None = None):
    """(path, ModuleList) of the decoder layers: the outermost ModuleList of num_layers modules (or of any
    of the counts given: LongCat-Flash's config has num_layers decoder layers and num_hidden_layers, twice
    as many, for their two attention sublayers each, held in a ModuleList inside each layer), or (the config
    names its layers otherwise: BART-style decoder_layers) the one holding the most parameters."""
    import torch

    counts = num_layers if isinstance(num_layers, tuple) else (num_layers,)
    lists = [(name, module) for name, module in model.named_modules()
             if isinstance(module, torch.nn.ModuleList) and len(module)]
    exact = [(name, module) for name, module in lists if len(module) in counts]
    if exact:
        outermost = min(name.count(".") for name, _ in exact)
        exact = [(name, module) for name, module in exact if name.count(".") == outermost]
    candidates = exact or lists
    if not candidates:
        raise UserError(f"cannot find the decoder layers of {type(model).__name__}")
    return max(candidates, key=lambda item: sum(p.numel() for p in item[1].parameters()))


def _buffer_kinds(model, prefix: str, layers, stored: set[str]) -> list[dict]:
    """Every buffer of the meta build, persistent or not, as tutor.theory.models.BufferKind's fields: one per name
    within a decoder layer (with the layers holding it) and one per buffer outside them, each tensor once (a buffer
    shared by several layers counted in the first). The build is bf16 (`_measure`), so a bf16 buffer was made in
    the model's dtype (its bytes follow the dtype a run uses); any other keeps its own (bool masks, fp32 rotary
    inv_freq, int64 ids)."""
    import torch

    seen: set[int] = set()
    kinds: dict[tuple, dict] = {}

    def add(name: str, tensor, persistent: bool, layer: int | None) -> None:
        if id(tensor) in seen:
            return
        seen.add(id(tensor))
        follows = tensor.dtype == torch.bfloat16
        key = (name, tuple(tensor.shape), str(tensor.dtype), persistent, layer is None)
        kind = kinds.setdefault(key, dict(
            name=name, shape=list(tensor.shape), dtype=MODEL_DTYPE if follows else str(tensor.dtype).removeprefix("torch."),
            element_bytes=0 if follows else tensor.element_size(), persistent=persistent, layers=[]))
        if layer is not None:
            kind["layers"].append(layer)

    for index, layer in enumerate(layers):
        for name, tensor in layer.named_buffers():
            add(name, tensor, f"{prefix}.{index}.{name}" in stored, index)
    for name, tensor in model.named_buffers():
        if not name.startswith(f"{prefix}."):
            add(name, tensor, name in stored, None)
    return list(kinds.values())


def _measure(config: dict) -> dict:
    """Build the model on the meta device and count its parameters; the Architecture's fields."""
    from tutor.trace.memory_trace import TraceSetup, _quiet, build_config, build_model

    import torch

    with _quiet():
        hf_config = build_config(config, "eager")
        text = hf_config.get_text_config()
        with torch.device("meta"):
            model = build_model(config, TraceSetup(mode="inference", dtype="bf16", attention="eager"))
    counts = tuple(n for name in SPELLINGS["num_hidden_layers"] + ("decoder_layers",)
                   if isinstance(n := _get(text, (name,)), int) and not isinstance(n, bool))
    prefix, layers = _decoder_layers(model, counts or None)
    layers_count = len(layers)
    seen: set[int] = set()
    per_layer = []
    experts_from_shapes = 0
    for index, layer in enumerate(layers):
        parts = dict.fromkeys(("attention", "mlp", "routed", "router", "norms"), 0)
        linear = 0
        for pname, param in layer.named_parameters():
            if id(param) in seen:
                continue
            seen.add(id(param))
            kind = _classify(pname)
            parts[kind] += param.numel()
            if param.dim() >= 2:
                linear += param.numel()
            if kind == "routed" and param.dim() == 3:
                experts_from_shapes = experts_from_shapes or param.shape[0]
        per_layer.append(dict(attention=parts["attention"], mlp=parts["mlp"] + parts["routed"], routed=parts["routed"],
                              router=parts["router"], norms=parts["norms"], linear=linear))
    input_emb = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    lm_weight = getattr(output, "weight", None)
    tied = lm_weight is None or lm_weight is input_emb
    unique = {id(p): p for p in model.parameters()}
    total = sum(p.numel() for p in unique.values())
    embedding = input_emb.numel()
    lm_head = 0 if lm_weight is None or lm_weight is input_emb else lm_weight.numel()
    positions = sum(p.numel() for n, p in model.named_parameters()
                    if not n.startswith(prefix) and any(k in n for k in ("wpe", "embed_positions", "position_embeddings")))
    in_layers = sum(sum(v for k, v in layer.items() if k not in ("routed", "linear")) for layer in per_layer)
    other = total - embedding - lm_head - positions - in_layers
    stored = model.state_dict()
    buffers = sum(b.numel() for n, b in model.named_buffers() if n in stored)
    measured = dict(total=total, embedding=embedding, lm_head=lm_head, positions=positions, other=other,
                    layers=per_layer, largest=max(p.numel() for p in unique.values()), buffers=buffers,
                    model_class=type(model).__name__, buffer_kinds=_buffer_kinds(model, prefix, layers, set(stored)))
    hidden = _get(text, SPELLINGS["hidden_size"]) or input_emb.shape[-1]
    heads = _get(text, SPELLINGS["num_attention_heads"], 1)
    kv_heads = _get(text, SPELLINGS["num_key_value_heads"] + ("multi_query_group_num",), heads)
    if getattr(text, "multi_query", False) and not getattr(text, "new_decoder_architecture", False):
        kv_heads = 1  # Falcon's multi_query without a KV-head count
    head_dim = _get(text, ("head_dim", "attention_head_size"), None) or hidden // max(heads, 1)
    experts = int(_get(text, SPELLINGS["num_experts"], 0) or 0) or experts_from_shapes
    moe_layers = tuple(i for i, layer in enumerate(per_layer) if layer["routed"])
    if moe_layers and not experts:
        experts = 1
    intermediate = _get(text, ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim"), None) or 4 * hidden
    top_k = int(_get(text, SPELLINGS["num_experts_per_tok"] + ("top_k", "moe_topk"), 1) or 1) if moe_layers else 0
    window = _get(text, ("sliding_window",), None)
    layer_types = getattr(text, "layer_types", None) or []
    sliding = tuple(i for i, t in enumerate(layer_types) if t == "sliding_attention") if window else ()
    dropout = any(isinstance(getattr(text, k, 0), (int, float)) and (getattr(text, k, 0) or 0) > 0
                  for k in ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop"))
    dense = [i for i in range(layers_count) if i not in moe_layers]
    gated, norm, norms = _layer_code(layers[dense[0] if dense else 0], per_layer[dense[0]]["mlp"] if dense else None,
                                     hidden * intermediate)
    architecture = dict(
        model_type=config["model_type"], hidden_size=hidden, num_layers=layers_count, num_heads=heads,
        num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=intermediate,
        vocab_size=embedding // hidden if hidden else 0, tie_word_embeddings=tied, gated_mlp=gated, norm=norm,
        norms_per_layer=norms, qkv_bias=False, qk_norm=False, learned_positions=positions // hidden if hidden else 0,
        max_position_embeddings=int(_get(text, ("max_position_embeddings", "n_positions"), 0) or 0),
        dropout=dropout, sliding_window=window if sliding else None, sliding_window_layers=len(sliding),
        num_experts=experts if moe_layers else 0, experts_per_token=min(top_k, experts) if moe_layers else 0,
        num_shared_experts=0,
        moe_intermediate_size=_expert_width(per_layer[moe_layers[0]]["routed"] // experts, hidden, text)
        if moe_layers else 0,
        shared_expert_intermediate_size=0, dense_layers=layers_count - len(moe_layers), q_lora_rank=None,
        kv_lora_rank=0, qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0, num_nextn_predict_layers=0,
        dense_layer_indices=[i for i in range(layers_count) if i not in moe_layers],
        sliding_window_layer_indices=list(sliding), measured=measured, **code_mechanisms(config),
    )
    return architecture


def _expert_width(per_expert: int, hidden: int, text) -> int:
    """One routed expert's width f: the config's (moe_intermediate_size, else intermediate_size) where the expert's
    parameters are its three h x f matrices and at most their biases (GPT-OSS: 2f + h more), else those
    parameters over 3h."""
    for name in ("moe_intermediate_size", "intermediate_size"):
        width = _get(text, (name,), None)
        if isinstance(width, int) and 0 < width and 3 * hidden * width <= per_expert <= 3 * hidden * width + 3 * width + hidden:
            return width
    return per_expert // (3 * hidden)


def _layer_code(layer, mlp_params: int | None, hidden_by_width: int) -> tuple[bool, str, int]:
    """(gated MLP, norm kind, norms) of one decoder layer as built: gated where the dense MLP holds three h x f
    matrices, not two (its parameters over h·f; an all-MoE model's experts are gated, as transformers' stacked
    gate_up_proj is); the norms are the layer's own norm modules (not the q/k norms inside attention), a
    "layernorm" where one subtracts the mean (a torch LayerNorm or a class named so: Cohere's, Nemotron's), else
    "rmsnorm"."""
    import torch

    gated = True if mlp_params is None or not hidden_by_width else mlp_params >= 2.5 * hidden_by_width
    norms = [module for _name, module in layer.named_children() if "norm" in type(module).__name__.lower()]
    layer_norm = any(isinstance(m, torch.nn.LayerNorm) or "layernorm" in type(m).__name__.lower() for m in norms)
    return gated, "layernorm" if layer_norm else "rmsnorm", len(norms) or 2


# ---------------------------------------------------------------------------------------------
# 2. Calibration by traces


def calibrated_for(arch: Architecture, request) -> Architecture:
    """`arch` with a calibration for the setup of `request` (a tutor.theory.fit.FitRequest): from the
    cache, or traced now and cached. Hand-profiled architectures come back unchanged."""
    if arch.profile != PROFILE or arch.calibration is None:
        return arch
    from tutor.theory.fit import activation_precision

    if request.mode == "train" and request.recompute == "selective":
        return arch  # transformers has no selective recompute to trace; theory says it approximates
    precision = activation_precision(request)
    recompute = request.recompute
    window = arch.calibration.window
    key = setup_key(mode=request.mode, precision=precision, attention=request.attention, recompute=recompute,
                    seq_len=request.seq_len, window=window)
    beyond = window if window and request.seq_len > window else 0
    traced = TRACE_ATTENTION[request.attention]
    at_key = at_shape_key(key, request.batch, request.seq_len)
    if arch.calibration.setup(key) is None and arch.calibration.setup(at_key) is None:
        try:
            arch = _with_setup(arch, key, request.mode, precision, traced, recompute, beyond)
        except DepthRebuildFailed as failed:
            # A model that cannot be rebuilt at fewer layers is traced whole, at this shape itself.
            return _with_setup(arch, at_key, request.mode, precision, traced, recompute, beyond,
                               at_shape=(request.batch, request.seq_len), whole=str(failed))
    fitted = arch.calibration.setup(key) if arch.calibration is not None else None
    if fitted is None or fitted.check_error <= AT_SHAPE_ERROR:
        return arch
    # The fit missed its own check: a quantity follows the shape in a way its basis cannot (a step, a
    # threshold), so this shape is traced itself, at the same two small depths.
    if arch.calibration.setup(at_key) is not None:
        return arch
    return _with_setup(arch, at_key, request.mode, precision, traced, recompute, beyond,
                       at_shape=(request.batch, request.seq_len), missed=fitted.check_error)


# Keys that hold a window length (not sliding_window_pattern, max_window_layers: counts of layers).
WINDOW_KEYS = ("sliding_window", "attention_window", "window_size", "sliding_window_size")


def shortest_window(config: dict) -> int:
    """The shortest sliding window a config sets (keys naming a window, not a layer count), 0 for none."""
    windows = [v for k, v in config.items() if k in WINDOW_KEYS and isinstance(v, int) and not isinstance(v, bool)
               and v > 0]
    return min(windows, default=0)


def _with_setup(arch: Architecture, key: str, mode: str, precision: str, attention: str, recompute: str,
                beyond: int = 0, at_shape: tuple[int, int] | None = None, missed: float = 0.0,
                whole: str = "") -> Architecture:
    """`arch` with setup `key` traced now and cached; `whole`: why the model is traced whole (at at_shape)."""
    config = json.loads(arch.calibration.config_json)
    entry = _read_cache(config)
    took = [float(t) for value in (entry.get("setups") or {}).values() if isinstance(value, dict)
            and isinstance(t := value.get("seconds"), (int, float)) and not isinstance(t, bool) and t > 0]
    from tutor.formatting import format_duration

    low, high = (own_depth(config),) * 2 if whole else traced_depths(config)
    depths = f"whole ({low} layers, as it cannot be rebuilt at fewer)" if whole else f"at {low} and {high} layers"
    shape = "" if not at_shape else (f" at {at_shape[0]} x {at_shape[1]} tokens itself" + (
        "" if whole else f" (the fit at small shapes missed its check by {missed:.0%})"))
    announce(f"tracing {arch.calibration.model_class} {depths} on fake tensors to calibrate {mode} "
              f"memory ({precision}, {attention} attention){shape}: first time for this setup, "
              + (f"about {format_duration(max(took))} (its slowest setup so far)" if took else
                 "typically 2-30 s on 2 cores") + f"; kept in {cache_file(config)}")
    started = time.perf_counter()
    setup = calibrate(config, key, mode=mode, precision=precision, attention=attention, recompute=recompute,
                      beyond_window=beyond, window=arch.calibration.window, chunk=arch.calibration.chunk,
                      at_shape=at_shape, whole=bool(whole))
    entry = _read_cache(config)
    if "architecture" in entry:
        entry.setdefault("setups", {})[key] = {**_setup_json(setup), "seconds": time.perf_counter() - started}
        _write_cache(config, entry)
    calibration = replace(arch.calibration, setups=arch.calibration.setups + (setup,))
    return replace(arch, calibration=calibration)


def cache_layer_counts(config: dict) -> list[list]:
    """[[cache layer class, how many], ...] of the cache generate() gives the whole model: DynamicCache built
    from its config, one layer per decoder layer of the kind its config says (transformers/cache_utils.py,
    get_layer_types_and_kwargs: full or sliding attention, linear attention for Mamba, gated delta-net and
    short-convolution layers, hybrid for a layer with both, dummy for one without a cache), read from the
    cache object, not from a table of model types; [] where the model keeps a cache of its own."""
    from collections import Counter

    from tutor.trace.memory_trace import _causal_lm_class, _quiet, build_config, import_trace_dependencies

    _, transformers = import_trace_dependencies()
    with _quiet():
        hf_config = build_config(config, "eager")
        supports = getattr(_causal_lm_class(transformers, hf_config), "_supports_default_dynamic_cache", None)
        if callable(supports) and not supports():
            return []
        try:
            cache = transformers.DynamicCache(config=hf_config.get_text_config(decoder=True))
        except Exception:  # noqa: BLE001 - a config the cache cannot read: the cache is fitted per decoder layer
            return []
    return [[kind, n] for kind, n in Counter(type(layer).__name__ for layer in getattr(cache, "layers", ())).items()]


# The config keys that name a chunk length but are no scan's padding: chunked attention's window (Llama-4's
# attention_chunk_size), the feed-forward's chunking of the batch (chunk_size_feed_forward, 0 unless set).
NOT_A_SCAN_CHUNK = ("attention", "feed_forward")


def scan_chunk(config: dict) -> int:
    """The chunk a scan pads the prompt to, as the config's class reads it (chunk_size of Mamba-2, Zamba2,
    NemotronH; mamba_chunk_size of Bamba, GraniteMoeHybrid, Falcon-H1), 0 for none: the chunked SSD scan
    pads the sequence to whole chunks (transformers/models/mamba2/modeling_mamba2.py, torch_forward)."""
    from tutor.trace.layer_count import class_view, layer_section

    written, _ = class_view(config)
    found = layer_section(written)
    section = found[0] if found else written
    chunks = [v for k, v in section.items() if k.endswith("chunk_size") and not any(w in k for w in NOT_A_SCAN_CHUNK)
              and isinstance(v, int) and not isinstance(v, bool) and v > 1]
    return max(chunks, default=0)


def traced_depths(config: dict) -> tuple[int, int]:
    """The two layer counts the calibration traces: FIT_LAYERS for layers all of one kind, else whole
    repeats of the config's pattern of layer kinds (tutor.trace.layer_count.layer_plan)."""
    from tutor.trace.layer_count import class_view

    _, plan = class_view(config)
    if plan is None or (plan.pattern_layers == 1 and not plan.lead):
        return FIT_LAYERS
    low = max(FIT_LAYERS[0], len(plan.lead) + plan.pattern_layers)
    return low, low + plan.pattern_layers


def end_layers(config: dict) -> tuple[int, int]:
    """(bottom, top): how many of the lowest and of the highest decoder layers the backward's bottom and top
    regions cover. Alike layers: one each (what is alive in backward is linear in the layer's position, so
    its largest is at an end). A model that mixes kinds of layers: the top repeat of its pattern, and the
    lead layers with the first repeat, so that the highest and the lowest layer of every kind is one
    (Jamba's Mamba layers keep more for their backward than its attention layers: with the top layer
    an attention one, the step's largest moment is inside the Mamba layer below it)."""
    from tutor.trace.layer_count import class_view

    _, plan = class_view(config)
    if plan is None or (plan.pattern_layers == 1 and not plan.lead):
        return 1, 1
    return len(plan.lead) + plan.pattern_layers, plan.pattern_layers


def layer_config(config: dict, layers: int) -> dict:
    """`config` with `layers` decoder layers, every per-layer list, index list and pattern rebuilt for that
    count by repeating the model's own pattern of layer kinds (tutor.trace.layer_count.config_at_depth)."""
    from tutor.trace.layer_count import config_at_depth

    return config_at_depth(config, layers)


def _timeline_quantities(tracker, element_bytes: int, layers: int, starts: dict[int, int],
                         ends: tuple[int, int] = (1, 1)) -> dict[str, float]:
    """Training, per region of the step (TRAIN_REGIONS: the forward; backward before any layer, the
    loss head's; inside the backward of the top layer, the first one gone back through; inside the
    bottom layer's; the embedding's after it), at every op of the region that makes a tensor: the
    activations and the gradient elements alive after it. A backward region is the same code at
    every depth: its n-th op is "<region>@op<n>". The forward holds every layer, two at one depth and
    three at another: its ops are counted from its end and named with the number of layers that
    start after them, "forward@top<t>@op<n>" (`starts`: the forward's op count at each layer's start),
    so that one name is one piece of code at both depths (the top layer and the head are t = 0).
    `ends` (end_layers: bottom, top): where layers differ in kind, the top region is the backward of
    the top `top` layers, layer k below the top one named "backward-top@down<k>@op<n>", and the bottom
    region that of the lowest `bottom`, layer i "backward-bottom@up<i>@op<n>": the same code at both
    depths. One op is the same code at every shape, so each is linear in layers, b·s and b·s², where a
    region's maximum may move from one op to another (`_fit_setup` keeps those that are the largest
    somewhere). Also the activations alive when the gradients peak (the end of backward)."""
    live: dict[str, int] = {}
    at: dict[str, tuple[int, int, int]] = {}
    g_max = a_at_g = 0
    forward_ops = tracker.ops_in_phase.get("forward", 0)
    # The weights made during the step are autocast's 16-bit copies (the tracker counts them as weights).
    parameters = sum(size for size, role, (made_in, _) in zip(tracker.size, tracker.role, tracker.made_by)
                     if role == "weights" and made_in == "setup")
    for key, delta, phase, index, _op in tracker.events:
        category = tracker.role[key]
        live[category] = live.get(category, 0) + delta
        if delta <= 0:
            continue
        acts, grads = live.get("activations", 0), live.get("gradients", 0)
        copies = max(0, live.get("weights", 0) - parameters)
        if category == "gradients" and grads >= g_max:
            g_max, a_at_g = grads, acts
        if phase.startswith("backward-layer:"):
            layer = int(phase.split(":")[1])
            down = layers - 1 - layer
            regions = [r for r, hit in (("backward-top" + (f"@down{down}" if down else ""), down < ends[1]),
                                        ("backward-bottom" + (f"@up{layer}" if layer else ""), layer < ends[0]))
                       if hit]
        elif phase in ("backward", "backward-embedding"):
            regions = ["backward-head" if phase == "backward" else phase]
        elif phase == "forward":
            later = sum(start >= index for start in starts.values())
            regions, index = [f"forward@top{later}"], forward_ops - index
        else:
            regions = []
        for region in regions:
            at[f"{region}{OP_MARK}{index}"] = (acts, grads, copies)  # an op's outputs come before any free
            whole = region.split("@")[0] + REGION_MAXIMUM
            if acts > at.get(whole, (-1, 0, 0))[0]:
                at[whole] = (acts, grads, copies)
    out: dict[str, float] = {"activations_end_of_backward": a_at_g}
    for moment, (acts, grads, copies) in at.items():
        out[REGION_PREFIX + moment] = acts
        out[GRADIENTS_PREFIX + moment] = grads / element_bytes
        if tracker.autocast_dtype is not None:
            out[WEIGHT_COPIES_PREFIX + moment] = copies
    return out


def _backward_hooks(model, num_layers: int, tracker, starts: dict[int, int] | None = None):
    """Forward hooks that put a gradient hook on each decoder layer's output: when backward reaches
    layer i, the tracker's phase becomes "backward-layer:i" (a checkpointed layer's re-run included);
    and that note in `starts` the forward's op count when layer i's forward began."""
    import torch

    _, layers = _decoder_layers(model, num_layers)
    handles = []

    def on_input(index):
        def hook(_module, _args):
            if starts is not None and tracker.phase == "forward":
                starts.setdefault(index, tracker.ops_in_phase.get("forward", 0))
        return hook

    def on_output(index):
        def hook(_module, _args, output):
            tensor = output if isinstance(output, torch.Tensor) else next(
                (o for o in (output if isinstance(output, (tuple, list)) else ()) if isinstance(o, torch.Tensor)), None)
            if tensor is not None and tensor.requires_grad:
                tensor.register_hook(lambda grad: tracker.set_phase(f"backward-layer:{index}"))
        return hook

    for index, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(on_input(index)))
        handles.append(layer.register_forward_hook(on_output(index)))

    def on_embedding(_module, _args, output):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: tracker.set_phase("backward-embedding"))

    handles.append(model.get_input_embeddings().register_forward_hook(on_embedding))
    return handles


def _region_quantities(tracker) -> dict[str, float]:
    """Inference: each region's activation maximum, and the KV cache's storages."""
    live: dict[str, int] = {}
    best: dict[str, float] = {}
    for key, delta, phase, _i, _op in tracker.events:
        category = tracker.role[key]
        live[category] = live.get(category, 0) + delta
        if delta > 0 and category == "activations":
            region = REGION_PREFIX + (phase if phase in ("attention", "mlp", "head") else "other")
            best[region] = max(best.get(region, 0), live[category])
        if category == "kv_cache":
            best[KV_CACHE] = max(best.get(KV_CACHE, 0), live[category])
    best.setdefault(KV_CACHE, 0)
    return best


def _cache_per_kind(cache) -> dict[str, float]:
    """The cache after prefill, per layer of each cache layer class: "kv_cache@<class>:kv" (keys and values)
    and "kv_cache@<class>:state" (conv and recurrent states), the bytes of their storages (each once)
    over the number of layers of that class."""
    from tutor.trace.memory_trace import cache_layer_parts

    totals: dict[str, float] = {}
    layers: dict[str, int] = {}
    seen: set[int] = set()
    for kind, parts in cache_layer_parts(cache):
        layers[kind] = layers.get(kind, 0) + 1
        for part, tensors in parts.items():
            name = f"{CACHE_PREFIX}{kind}:{part}"
            totals.setdefault(name, 0)
            for tensor in tensors:
                storage = tensor.untyped_storage()
                if storage._cdata not in seen:  # a storage two layers share counts once (the tracker's key)
                    seen.add(storage._cdata)
                    totals[name] += storage.nbytes()
    return {name: total / layers[name[len(CACHE_PREFIX):].rsplit(":", 1)[0]] for name, total in totals.items()}


def _region_hooks(model, num_layers: int, tracker):
    """Forward hooks that name the region of the prefill the tracker's events fall in."""
    _, layers = _decoder_layers(model, num_layers)
    handles = []

    def enter(region):
        return lambda *_args, **_kwargs: tracker.set_phase(region)

    def leave(*_args, **_kwargs):
        tracker.set_phase("prefill")

    for layer in layers:
        for child_name, child in layer.named_children():
            lowered = child_name.lower()
            region = "attention" if "att" in lowered else "mlp" if any(
                k in lowered for k in ("mlp", "feed_forward", "ffn", "moe", "experts")) else None
            if region:
                handles.append(child.register_forward_pre_hook(enter(region)))
                handles.append(child.register_forward_hook(leave))
    head = model.get_output_embeddings()
    if head is not None:
        handles.append(head.register_forward_pre_hook(enter("head")))
    return handles


def _forward_backward(model, ids, labels, tracker) -> None:
    """memory_trace.training_step up to its optimizer step (fit's formulas count the optimizer)."""
    import torch

    tracker.set_phase("forward")
    if tracker.autocast_dtype is not None:
        with torch.autocast(device_type=ids.device.type, dtype=tracker.autocast_dtype):
            loss = model(input_ids=ids, labels=labels).loss
    else:
        loss = model(input_ids=ids, labels=labels).loss
    tracker.set_phase("backward")
    loss.backward()
    loss = loss.detach()
    tracker.mark([p.grad for p in model.parameters()], "gradients")
    tracker.set_phase("optimizer")
    for p in model.parameters():
        p.grad = None
    del loss


def _measure_shape(model, optimizer, setup, batch: int, seq_len: int, layers: int,
                   assumptions: list[str] | None = None, ends: tuple[int, int] = (1, 1)) -> dict[str, float]:
    """One traced step (training: forward and backward; inference: a prefill) at one shape: its quantities.
    `assumptions` gets what the trace took as given for values fake tensors lack (FakeValues); `ends`:
    the layers the backward's bottom and top regions cover (end_layers)."""
    import torch

    from tutor.trace.memory_trace import (
        _fake_tensor_workarounds,
        cache_tensors,
        register_model_states,
        storage_tracker_class,
        supports_default_cache,
        token_ids,
        cache_argument,
    )

    vocab = model.config.get_text_config().vocab_size
    ids = token_ids(vocab, batch, seq_len)
    tracker = storage_tracker_class()()
    register_model_states(tracker, model, optimizer)
    tracker.register(ids, "activations")
    element = 4 if setup.dtype == "fp32" else 2
    noted = assumptions if assumptions is not None else []
    with _fake_tensor_workarounds(True) as values:
        values.give_token_ids(ids, vocab)
        values.assumptions = noted  # the stand-ins this trace rests on, as they are first read
        if setup.mode == "train":
            labels = ids.clone()
            tracker.register(labels, "activations")
            tracker.autocast_dtype = torch.bfloat16 if setup.autocast else None
            starts: dict[int, int] = {}
            handles = _backward_hooks(model, layers, tracker, starts)
            try:
                with tracker:
                    _forward_backward(model, ids, labels, tracker)
            finally:
                for handle in handles:
                    handle.remove()
            return _timeline_quantities(tracker, element, layers, starts, ends)
        from transformers import DynamicCache

        handles = _region_hooks(model, layers, tracker)
        try:
            with tracker, torch.no_grad():
                tracker.set_phase("prefill")
                cache: object = None
                use_cache = True
                if supports_default_cache(model):
                    try:
                        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
                    except AttributeError:
                        # A config with no layer count at its top (BLT: four stacks, each counted in its
                        # sub-config) gives transformers no cache to make; its own tests generate with
                        # use_cache=False, and so is it traced.
                        use_cache = False
                        if NO_CACHE not in noted:
                            noted.append(NO_CACHE)
                if not use_cache:
                    out = model(input_ids=ids, use_cache=False, logits_to_keep=1)
                elif cache is not None:
                    out = model(input_ids=ids, **{cache_argument(model): cache}, use_cache=True, logits_to_keep=1)
                else:  # as generate() leaves it: the model makes its own cache (MiniMax's MiniMaxCache)
                    out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
                    cache = getattr(out, "past_key_values", None)
                tracker.set_phase("head")
                logits = out.logits[:, -1, :].to(copy=True, dtype=torch.float32)
            tracker.mark(cache_tensors(cache), "kv_cache")
            per_kind = _cache_per_kind(cache)
            del logits, out, cache
        finally:
            for handle in handles:
                handle.remove()
        return {**_region_quantities(tracker), **per_kind}


NO_CACHE = ("no KV cache: transformers makes none from this config (it names no layer count at its top), so the "
            "prefill is traced as generate(use_cache=False) runs it, each new token recomputing the prompt")


# What a trace on fake tensors (torch's FakeTensorMode: shapes and dtypes, no values) cannot run, by the
# exception torch raises or the words of its message: the reason a refusal gives.
FAKE_TENSOR_LIMITS = (
    (("DataDependentOutputException", "_local_scalar_dense"),
     "its code reads a tensor's value on the host (aten._local_scalar_dense: .item(), or a Python branch on a "
     "tensor), and fake tensors have no values"),
    (("DynamicOutputShapeException", "aten.nonzero"),
     "its code makes a tensor whose size depends on the values (aten.nonzero: tokens gathered per expert), "
     "which fake tensors cannot size"),
    (("Couldn't swap",),
     "its parameters cannot be cast to the traced dtype on fake tensors (torch's Module._apply could not swap "
     "one)"),
    (("devices must match", 'device "meta"'),
     "its code mixes fake tensors with ones it makes on another device, which torch refuses"),
)


def fake_tensor_limit(exc: BaseException) -> str | None:
    """The reason, in words, when `exc` is a limit of tracing on fake tensors (FAKE_TENSOR_LIMITS), else None."""
    text = f"{type(exc).__name__}: {exc}"
    return next((reason for signs, reason in FAKE_TENSOR_LIMITS if any(sign in text for sign in signs)), None)


def _refusal(config: dict, reason: str) -> str:
    """One line: which architecture fit cannot calibrate (it has no hand profile), and why."""
    model_type = config.get("model_type")
    classes = config.get("architectures")
    named = f" ({shown(classes[0])})" if isinstance(classes, list) and classes and isinstance(classes[0], str) else ""
    return f"fit cannot calibrate model_type {shown(model_type)!r}{named}, which has no hand profile: {reason}"


def basis_terms(config: dict, mode: str, attention: str, beyond_window: int = 0) -> tuple[str, ...]:
    """The BASIS terms a setup's quantities can hold (FIT_SHAPES): s x s with eager attention, with
    dropout (SDPA's math kernel on a CPU), beyond a sliding window (its mask), and in training always:
    a model's own code may keep an s x s tensor for backward whatever its attention (Falcon turns its
    mask into a 16-bit additive one in every layer, which SDPA saves: 2 MiB a layer at 1 x 1024
    tokens, 1% of the activations at the check's 128 tokens, where no check can see it)."""
    dropout = any(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                  for k, v in config.items() if "dropout" in k or k.endswith("_pdrop"))
    square = attention == "eager" or dropout or bool(beyond_window) or mode == "train"
    return ("1",) + (("b",) if mode == "inference" else ()) + ("b*s",) + (("b*s^2",) if square else ())


def traced_lengths(shapes: tuple[tuple[int, int], ...], check: tuple[int, int], *, window: int,
                   beyond_window: int) -> tuple[tuple[tuple[int, int], ...], tuple[int, int]]:
    """The traced (batch, seq_len) shapes, all on one side of a sliding window: prompts longer than it
    are traced at lengths beyond it, shorter ones within it (fake tensors cost the same at any length)."""
    if beyond_window:
        return tuple((b, s + beyond_window) for b, s in shapes), (check[0], check[1] + beyond_window)
    if window and window < check[1]:
        def scale(s: int) -> int:
            return max(2, s * window // check[1])
        return tuple((b, scale(s)) for b, s in shapes), (check[0], window)
    return shapes, check


def _solve(points: list[tuple[tuple[int, ...], float]], terms: tuple[str, ...]) -> tuple[float, ...]:
    """Least squares over `terms` of BASIS (numpy; the others 0), rounded to 6 significant digits."""
    return _solve_many([x for x, _ in points], [[y] for _, y in points], terms)[0]


def _solve_many(shapes: list[tuple[int, ...]], values: list[list[float]],
                terms: tuple[str, ...]) -> list[tuple[float, ...]]:
    """`_solve` for many quantities traced at the same shapes at once: values[i][j] is quantity j at
    shapes[i] (basis values); one coefficient tuple per quantity."""
    import numpy

    columns = [BASIS.index(term) for term in terms]
    matrix = numpy.array([[x[i] for i in columns] for x in shapes], dtype=float)
    scale = matrix.max(axis=0)
    scale[scale == 0] = 1
    solution, *_ = numpy.linalg.lstsq(matrix / scale, numpy.array(values, dtype=float), rcond=None)
    solution = solution / scale[:, None]
    out = []
    for column_values in solution.T:
        full = [0.0] * len(BASIS)
        for column, value in zip(columns, column_values):
            full[column] = float(f"{value:.6g}")
        out.append(tuple(full))
    return out


# The check shape's largest relative error above which the fit without s x s terms is refitted with
# them: attention code that keeps scores without saying so (Falcon's multi-query path under SDPA
# builds them with bmm: 10.7% off at the check) is found by the check, not by its attn_implementation.
# Not lower: a few percent off (Granite's prefill, 3.2%) are not s x s terms, and the refit costs two traces.
SQUARE_REFIT_ERROR = 0.05


# The cache per layer of a kind (CACHE_PREFIX quantities): keys and values grow with the prompt, conv and
# recurrent states are one per sequence; neither has a head, and neither is padded to chunks.
CACHE_TERMS = ("b", "b*s")


# Where the ops of a region are weighed against each other to keep those that can hold its maximum
# (`_moments_that_peak`): the traced depths and deep models, the traced lengths and long prompts,
# with the loss head (the last pipeline stage) and without it.
ENVELOPE_DEPTHS = (16, 128)
ENVELOPE_SHAPES = tuple((b, s) for b in (1, 8, 64) for s in (16, 128, 1024, 8192, 131072))


def _fit_setup(measured: dict, terms: tuple[str, ...], fit_shapes, check_shape,
               depths: tuple[int, int] = FIT_LAYERS, element_bytes: int = 2, chunk: int = 0) -> tuple[list, float]:
    """Every traced quantity fitted over `terms` from the traces at the two `depths` (layer counts) at
    `fit_shapes`, and the largest relative error at `check_shape` (the deeper one; quantities above 1 KiB).
    The cache per layer of a kind is already per layer: fitted over CACHE_TERMS from both depths' traces.
    A training step's per-op moments (`_timeline_quantities`) are fitted op by op, and only those that
    are a region's largest at some depth and shape are kept (`_moments_that_peak`); the check then
    compares each region's maximum too, where the fit answers the largest of its moments."""
    low, high = depths
    first = [measured[layers][shape] for layers in depths for shape in fit_shapes]
    # An op of one trace that another lacks (a code path that differs with the shape) cannot be fitted;
    # nor a forward op below the top `high - low` layers (one repeat of the layers' pattern): counted
    # from the end, it is in another layer, or the embedding, at the other depth.
    per_op = sorted(name for name in set.intersection(*({n for n in trace if OP_MARK in n} for trace in first))
                    if _forward_layers_later(name) < high - low)
    with_ops = {moment_region(name.split("@", 1)[1]) for name in per_op}
    # A region's maximum as one quantity only where none of its ops could be fitted one by one.
    plain = sorted({name for trace in first for name in trace if OP_MARK not in name and not (
        REGION_MAXIMUM in name and moment_region(name.split("@", 1)[1]) in with_ops)})
    caches = [name for name in plain if name.startswith(CACHE_PREFIX)]
    plain = [name for name in plain if not name.startswith(CACHE_PREFIX)]
    names = plain + per_op
    by_terms: dict[tuple[str, ...], list[str]] = {}
    for name in names:
        # Parameter gradients and weight copies do not grow with the batch or the prompt: a constant
        # (per layer and head).
        by_terms.setdefault(("1",) if name.startswith(WEIGHTS_LIKE) else terms, []).append(name)
    fitted: dict[str, Fitted] = {}
    for own, group in by_terms.items():
        shapes = [basis_values(shape[0], shape[1], chunk) for shape in fit_shapes]
        one, two = (_solve_many(shapes, [[measured[layers][shape].get(name, 0) for name in group]
                                         for shape in fit_shapes], own) for layers in depths)
        for name, a_coeffs, b_coeffs in zip(group, one, two):
            per_layer = tuple(float(f"{(b - a) / (high - low):.6g}") for a, b in zip(a_coeffs, b_coeffs))
            head = tuple(float(f"{a - low * p:.6g}") for a, p in zip(a_coeffs, per_layer))
            fitted[name] = Fitted(head, per_layer, chunk)
    for name in caches:
        own_terms = tuple(t for t in CACHE_TERMS if t in terms) or ("1",)
        points = [(basis_values(shape[0], shape[1], chunk), measured[layers][shape].get(name, 0))
                  for layers in depths for shape in fit_shapes]
        fitted[name] = Fitted((0.0,) * len(BASIS), _solve(points, own_terms), chunk)
    kept = plain + caches + sorted(_moments_that_peak(fitted, per_op, depths, element_bytes, chunk))
    quantities = [(name, fitted[name]) for name in kept]
    check = measured[high][check_shape]
    shape = dict(layers=high, batch=check_shape[0], seq_len=check_shape[1])
    # Per-op moments are checked as theory reads them, region by region, by their largest: one op's
    # position can shift at the check's batch (Starcoder2's loss clones its labels when b > 1).
    compared = [(check.get(name, 0), fitted[name].at(**shape)) for name in plain
                if not name.startswith(WEIGHTS_LIKE)]
    def region_of(name: str) -> str | None:
        return moment_region(name[len(REGION_PREFIX):]) if name.startswith(REGION_PREFIX) and OP_MARK in name else None

    for region in {region_of(name) for name, _ in quantities} - {None}:
        truth = max((n for name, n in check.items() if region_of(name) == region), default=0)
        compared.append((truth, max(f.at(**shape) for name, f in quantities if region_of(name) == region)))
    worst = max((abs(predicted - truth) / max(truth, 1) for truth, predicted in compared
                 if max(truth, predicted) > 1024), default=0.0)
    return quantities, worst


WEIGHTS_LIKE = (GRADIENTS_PREFIX, WEIGHT_COPIES_PREFIX)  # per-moment quantities sized by the parameters


def _forward_layers_later(name: str) -> int:
    """t of a forward op's name "...forward@top<t>@op<n>" (the layers that start after it), else 0."""
    marker = "forward@top"
    if marker not in name:
        return 0
    return int(name.split(marker)[1].split("@")[0])


def _moments_that_peak(fitted: dict[str, Fitted], per_op: list[str], depths: tuple[int, int],
                       element_bytes: int, chunk: int = 0) -> set[str]:
    """The per-op moments worth keeping: in each region, every op whose activations, or activations
    plus gradient and weight-copy bytes (what the step's peak adds up), are the region's largest at
    some depth and shape (the traced ones, ENVELOPE_DEPTHS, ENVELOPE_SHAPES), with the loss head and
    without it; each with its gradient elements and weight copies."""
    import numpy

    moments = [name[len(REGION_PREFIX):] for name in per_op if name.startswith(REGION_PREFIX)]
    if not moments:
        return set()
    probes = [(layers, b, s) for layers in (*depths, *ENVELOPE_DEPTHS) for b, s in ENVELOPE_SHAPES]
    basis = numpy.array([basis_values(b, s, chunk) for _, b, s in probes], dtype=float)
    layer_counts = numpy.array([layers for layers, _, _ in probes], dtype=float)

    def values(prefix: str, head: bool) -> numpy.ndarray:
        """(probe, moment) values of each moment's fitted quantity (0 where it has none)."""
        zero = Fitted((0.0,) * len(BASIS), (0.0,) * len(BASIS))
        quantities = [fitted.get(prefix + moment, zero) for moment in moments]
        per_layer = numpy.array([q.per_layer for q in quantities], dtype=float)
        layers_part = layer_counts[:, None] * (basis @ per_layer.T)
        return layers_part + basis @ numpy.array([q.head for q in quantities], dtype=float).T if head else layers_part

    regions = numpy.array([moment_region(moment) or "" for moment in moments])
    kept: set[str] = set()
    for head in (True, False):
        acts = values(REGION_PREFIX, head)
        total = acts + element_bytes * values(GRADIENTS_PREFIX, head) + values(WEIGHT_COPIES_PREFIX, head)
        for region in set(regions):
            columns = numpy.flatnonzero(regions == region)
            for table in (acts, total):
                for best in set(columns[numpy.argmax(table[:, columns], axis=1)]):
                    kept.update(prefix + moments[best] for prefix in (REGION_PREFIX, *WEIGHTS_LIKE))
    return kept & set(fitted)


def fit_shapes(terms: tuple[str, ...], chunk: int = 0) -> tuple[tuple[tuple[int, int], ...], tuple[int, int]]:
    """(the traced (batch, seq_len) shapes, the check shape) for the basis `terms`: FIT_SHAPES and CHECK_SHAPE,
    or for a scan that pads to whole chunks of `chunk` tokens, CHUNKED_SHAPES in chunks with b·S among the
    terms (two lengths that pad to the same whole chunks) and CHUNKED_CHECK, which pads to a chunk never traced."""
    if not chunk:
        return FIT_SHAPES[terms], CHECK_SHAPE
    shapes = tuple((CHUNKED_SHAPES[t][0], int(CHUNKED_SHAPES[t][1] * chunk)) for t in BASIS if t in terms + ("b*S",))
    return shapes, (CHUNKED_CHECK[0], int(CHUNKED_CHECK[1] * chunk))


class DepthRebuildFailed(UserError):
    """The model's code failed at a layer count other than its config's own (a structure the rebuilt config
    does not keep: layers looped between indices, stacks counted in slots): traced whole instead."""


def own_depth(config: dict) -> int:
    """The decoder layers the config itself has (tutor.trace.layer_count.layer_section), 1 where it names none."""
    from tutor.trace.layer_count import layer_section

    found = layer_section(config)
    return int(found[0][found[1]]) if found is not None else 1


def whole_model_setup(key: str, traced: dict[str, float], layers: int, shape: tuple[int, int], *,
                      traced_element_bytes: int, assumptions: tuple[str, ...] = ()) -> CalibratedSetup:
    """The setup of one trace of the whole model at one shape: each quantity spread evenly over its `layers`
    layers, none in the head (exact for the whole model at that shape; a pipeline stage gets its share of
    the layers), the cache per layer of a kind as traced (already per layer)."""
    def per_layer(value: float) -> Fitted:
        return Fitted((0.0,) * len(BASIS), (float(f"{value:.9g}"),) + (0.0,) * (len(BASIS) - 1))

    quantities = tuple((name, per_layer(value if name.startswith(CACHE_PREFIX) else value / layers))
                       for name, value in sorted(traced.items()))
    return CalibratedSetup(key=key, quantities=quantities, check=(layers, *shape), check_error=0.0,
                           traced_element_bytes=traced_element_bytes, fitted_shapes=((layers, *shape),),
                           assumptions=assumptions)


def calibrate(config: dict, key: str, *, mode: str, precision: str, attention: str, recompute: str,
              beyond_window: int = 0, window: int = 0, chunk: int = 0,
              at_shape: tuple[int, int] | None = None, whole: bool = False) -> CalibratedSetup:
    """Trace the setup at its fit_shapes at two depths (traced_depths), fit every quantity, check at the check
    shape; a check off by more than SQUARE_REFIT_ERROR without s x s terms traces one more shape and refits
    with them. `chunk`: the scan's chunk (scan_chunk), b·S among the terms. `at_shape` (batch, seq_len):
    traced at that shape alone, each quantity a constant per layer and head (exact there, and nowhere else);
    with `whole`, the config as given, at its own depth (whole_model_setup). DepthRebuildFailed where the
    model's code fails at a depth other than its own."""
    import torch  # noqa: F401 - imported before FakeTensorMode, as torch requires
    from torch._subclasses.fake_tensor import FakeTensorMode

    from tutor.trace.memory_trace import TraceSetup, _one_line, _quiet, attention_to_run, build_model, enable_recompute

    dtype = {"fp32": "fp32", "amp": "fp32", "bf16": "bf16"}[precision]
    setup = TraceSetup(mode=mode, dtype=dtype, autocast=precision == "amp", recompute=recompute == "full",
                       attention=attention, optimizer="adamw", foreach=None, fake=True)
    depths = traced_depths(config)
    ends = end_layers(config)
    check_layers = depths[1]
    measured: dict[int, dict[tuple[int, int], dict[str, float]]] = {layers: {} for layers in depths}
    assumptions: list[str] = []

    if whole:
        depths = (own_depth(config),) * 2
        measured = {depths[0]: {}}

    def trace(wanted: dict[int, tuple[tuple[int, int], ...]]) -> None:
        for layers, shapes in wanted.items():
            shapes = tuple(shape for shape in dict.fromkeys(shapes) if shape not in measured[layers])
            if not shapes:
                continue
            try:
                small = config if whole else layer_config(config, layers)
                traced_attention, _ = attention_to_run(small, attention)
                run = replace(setup, attention=traced_attention)
                with FakeTensorMode():
                    model = build_model(small, run)
                    model.train(mode == "train")
                    if mode == "train":
                        model.config.use_cache = False  # as transformers' Trainer sets it
                        if run.recompute:
                            enable_recompute(model)
                    for shape in shapes:
                        measured[layers][shape] = _measure_shape(model, None, run, *shape, layers, assumptions,
                                                                 ends=ends)
            except UserError as error:
                limit = fake_tensor_limit(error)
                if limit is None:
                    raise
                raise UserError(_refusal(config, f"it cannot be traced on fake tensors: {limit}")) from None
            except Exception as exc:  # noqa: BLE001 - the model's own code on the user's config may raise anything
                limit = fake_tensor_limit(exc)
                if limit is None and not whole and layers != own_depth(config):
                    raise DepthRebuildFailed(_refusal(config, f"its transformers code failed in the trace at "
                                                              f"{layers} layers: {_one_line(exc)}")) from None
                raise UserError(_refusal(config, f"it cannot be traced on fake tensors: {limit}" if limit else
                                         f"its transformers code failed in the trace: {_one_line(exc)}")) from None

    def traced_fit(terms: tuple[str, ...]):
        shapes, check = fit_shapes(terms, chunk)
        shapes, check = traced_lengths(shapes, check, window=window, beyond_window=beyond_window)
        with_padding = terms + (("b*S",) if chunk else ())
        trace({layers: shapes + ((check,) if layers == check_layers else ()) for layers in depths})
        return shapes, check, *_fit_setup(measured, with_padding, shapes, check, depths,
                                          element_bytes=4 if dtype == "fp32" else 2, chunk=chunk)

    with _quiet():
        if whole and at_shape is not None:
            trace({depths[0]: (at_shape,)})
            return whole_model_setup(key, measured[depths[0]][at_shape], depths[0], at_shape,
                                     traced_element_bytes=4 if dtype == "fp32" else 2,
                                     assumptions=tuple(dict.fromkeys(assumptions)))
        if at_shape is not None:
            trace({layers: (at_shape,) for layers in depths})
            quantities, worst = _fit_setup(measured, ("1",), (at_shape,), at_shape, depths,
                                           element_bytes=4 if dtype == "fp32" else 2)
            return CalibratedSetup(key=key, quantities=tuple(quantities), check=(check_layers, *at_shape),
                                   check_error=round(worst, 4), traced_element_bytes=4 if dtype == "fp32" else 2,
                                   fitted_shapes=tuple((layers, *at_shape) for layers in depths),
                                   assumptions=tuple(dict.fromkeys(assumptions)))
        terms = basis_terms(config, mode, attention, beyond_window)
        fit_shapes_used, check_shape, quantities, worst = traced_fit(terms)
        if worst > SQUARE_REFIT_ERROR and "b*s^2" not in terms:
            square = traced_fit(terms + ("b*s^2",))
            if square[3] < worst:
                fit_shapes_used, check_shape, quantities, worst = square
    return CalibratedSetup(key=key, quantities=tuple(quantities), check=(check_layers, *check_shape),
                           check_error=round(worst, 4), traced_element_bytes=4 if dtype == "fp32" else 2,
                           fitted_shapes=tuple((layers, *shape) for layers in depths for shape in fit_shapes_used),
                           assumptions=tuple(dict.fromkeys(assumptions)))
