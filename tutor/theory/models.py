"""Model architectures read from Hugging Face config.json files, and their exact parameter counts.

A config is turned into an `Architecture` (one frozen record of every size and quirk that changes
a count or a memory formula), then `count_parameters` follows the module structure of the
transformers modelling code for that `model_type`, weight by weight and bias by bias. Every exact
count published for the shipped presets is reproduced to the parameter (tests/test_models.py;
each with its source in tutor/presets/index.json).

Reading config.json files and the shipped presets is tutor.files.models' job: this module takes the
config as a dict. Standard library only, no file access.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from tutor.errors import UserError

SUPPORTED_MODEL_TYPES = (
    "gpt2", "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
    "gemma", "gemma2", "phi3", "olmo", "olmo2", "deepseek_v3",
)

# Upper bounds that no real model comes near; they keep every later formula (and loops over
# layers) cheap and turn garbage such as 1e30 into a clear message instead of a silly answer.
_MAX_DIM = 2**24
_MAX_HEADS = 2**16
_MAX_LAYERS = 10_000
_MAX_VOCAB = 2**31
_MAX_EXPERTS = 2**16
_MAX_POSITIONS = 2**40


@dataclass(frozen=True)
class MeasuredLayer:
    """Parameters of one decoder layer of a real model class, split by the module that holds them."""

    attention: int
    mlp: int             # dense MLP, or routed + shared experts
    routed: int          # the routed experts' share of `mlp` (0 in a dense layer)
    router: int
    norms: int
    linear: int          # 2-D weights of the layer (what a weight-only quantized format stores low-bit)


@dataclass(frozen=True)
class BufferKind:
    """One buffer of a transformers model: a tensor registered with nn.Buffer (register_buffer), persistent or
    not, held in memory beside the parameters for the model's whole life, in its own dtype.

    name: its name in the module that holds it (in a decoder layer, relative to the layer: `attn.attention.bias`);
    dtype: torch's name for it, or MODEL_DTYPE for one made in the model's dtype (its bytes follow the dtype the
    model runs in); element_bytes: bytes per element (0 for MODEL_DTYPE); persistent: saved in the state_dict (and
    so in a checkpoint) or not; layers: the decoder layers that each hold one (empty: the model holds one, outside
    its layers); meaning: what it is, where known (the hand profiles say; a meta build knows only names).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    element_bytes: int
    persistent: bool
    layers: tuple[int, ...] = ()
    meaning: str = ""

    @property
    def elements(self) -> int:
        return math.prod(self.shape)

    def bytes_each(self, model_element_bytes: int) -> int:
        """Bytes of one copy, a MODEL_DTYPE buffer at `model_element_bytes` per element."""
        return self.elements * (self.element_bytes or model_element_bytes)


MODEL_DTYPE = "model dtype"


@dataclass(frozen=True)
class MeasuredParams:
    """Parameter counts read off the real transformers model class of a config, built on the meta
    device (`sum(p.numel() for p in model.parameters())`, tied tensors once): exact by construction.

    embedding: the input table; lm_head: the output projection when it is not tied to it;
    positions: learned position tables; other: everything outside the decoder layers besides those
    (final norm, ...); largest: the numel of the largest single parameter tensor.
    """

    total: int
    embedding: int
    lm_head: int
    positions: int
    other: int
    layers: tuple[MeasuredLayer, ...]
    largest: int
    buffers: int = 0
    model_class: str = ""
    buffer_kinds: tuple[BufferKind, ...] = ()  # every buffer of the meta build, persistent or not (BufferKind)


@dataclass(frozen=True)
class Architecture:
    """The sizes and quirks of a decoder-only transformer, as read from its config.json.

    `head_dim` is the query/key head width (for MLA: qk_nope_head_dim + qk_rope_head_dim);
    `intermediate_size` is the dense MLP width (per matrix, not fused); `vocab_size` is the
    number of rows of the embedding table (OLMo v1's padded `embedding_size` where given).
    """

    name: str
    model_type: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int                 # = num_heads for MHA; fewer for GQA/MQA
    head_dim: int
    intermediate_size: int            # dense MLP width (the config's value; unused by all-MoE models)
    vocab_size: int
    tie_word_embeddings: bool
    gated_mlp: bool                   # 3 matrices (SwiGLU/GeGLU) vs 2 (GPT-2)
    norm: str                         # "rmsnorm" | "layernorm" | "nonparametric"
    norms_per_layer: int              # 2, or 4 for Gemma-2 (pre and post norms)
    qkv_bias: bool
    qk_norm: bool
    learned_positions: int            # rows of a learned position table (GPT-2: n_positions), else 0
    max_position_embeddings: int      # 0 when the config does not say
    dropout: bool                     # any dropout probability > 0 in the config
    sliding_window: int | None        # None when no layer uses one
    sliding_window_layers: int
    num_experts: int                  # routed experts per MoE layer; 0 for dense models
    experts_per_token: int
    num_shared_experts: int
    moe_intermediate_size: int        # width of one routed expert
    shared_expert_intermediate_size: int  # total width of the shared expert(s) of a layer
    dense_layers: int                 # layers with a dense MLP: all of a dense model, DeepSeek-V3's first 3
    q_lora_rank: int | None           # MLA only (None: full-rank query projection)
    kv_lora_rank: int                 # MLA latent width; 0 without MLA
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    num_nextn_predict_layers: int     # DeepSeek MTP modules, counted apart from the total
    # Extra detail the counter needs.
    o_bias: bool = False              # output-projection bias (GPT-2, attention_bias=true)
    mlp_bias: bool = False
    qk_norm_per_head: bool = True     # Qwen3: norm over head_dim; OLMo-2: over the whole projection
    shared_expert_gate: bool = False  # Qwen2-MoE's sigmoid gate on the shared expert (h x 1)
    router_bias: bool = False         # DeepSeek-V3 noaux_tc score-correction bias (E per layer; a buffer)
    dense_layer_indices: tuple[int, ...] = ()
    sliding_window_layer_indices: tuple[int, ...] = ()
    # Which path answers for this architecture: "hand" (the formulas of this package, written for
    # the model type) or "calibrated-trace" (a model type without them: parameters counted on the real
    # model class, activations from traces fitted in b·s and s², `tutor.theory.calibrated`).
    profile: str = "hand"
    profile_note: str = ""
    # What the code does beyond the counts (the step's operations read them, tutor.theory.step_operations): the
    # MLP's activation as the config names it ("" for the family's own: SiLU, GPT-2's gelu_new), Gemma-2's tanh
    # soft-capping of the attention scores and of the final logits (None: none).
    hidden_act: str = ""
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    partial_rotary_factor: float = 1.0  # the share of head_dim RoPE rotates, where transformers' code applies it
    measured: MeasuredParams | None = None            # calibrated-trace: the real model's counts
    calibration: Any = None                           # calibrated-trace: tutor.theory.calibrated.Calibration

    @property
    def is_moe(self) -> bool:
        """True when at least one layer routes tokens to experts."""
        return self.moe_layers > 0

    @property
    def moe_layers(self) -> int:
        """Number of layers whose MLP is a mixture of experts."""
        return self.num_layers - self.dense_layers

    @property
    def uses_mla(self) -> bool:
        """True for DeepSeek's multi-head latent attention (a compressed, shared KV latent)."""
        return self.kv_lora_rank > 0

    @property
    def q_width(self) -> int:
        """Width of the concatenated query heads: num_heads * head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of the concatenated key (or value) heads: num_kv_heads * head_dim."""
        return self.num_kv_heads * self.head_dim

    @property
    def kv_cache_width_per_layer(self) -> int:
        """Elements cached per token per layer.

        Standard/GQA attention caches K and V: 2 * num_kv_heads * head_dim (Shazeer 2019 MQA,
        Ainslie et al. 2023 GQA). MLA caches the compressed latent plus the shared RoPE key:
        kv_lora_rank + qk_rope_head_dim (DeepSeek-V2 paper, arXiv 2405.04434, §2.1.2: 512 + 64).
        """
        if self.uses_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    @cached_property
    def layer_uses_sliding_window(self) -> tuple[bool, ...]:
        """For each layer in order, whether it attends only to the last `sliding_window` tokens
        (and so caches at most that many): Mistral-7B-v0.1 all, Gemma-2 layers 0, 2, 4, ..."""
        sliding = set(self.sliding_window_layer_indices)
        return tuple(i in sliding for i in range(self.num_layers))

    @cached_property
    def layer_is_moe(self) -> tuple[bool, ...]:
        """For each layer in order, whether its MLP is a mixture of experts.

        Cached (as is layer_uses_sliding_window): estimates look layers up one by one, and
        rebuilding the tuple on every lookup made `fit` quadratic in the layer count. A frozen
        dataclass without slots keeps an instance __dict__, where cached_property stores it."""
        dense = set(self.dense_layer_indices)
        return tuple(self.num_experts > 0 and i not in dense for i in range(self.num_layers))


# ---------------------------------------------------------------------------------------------
# Reading and validating config values


def shown(text: object, limit: int = 160) -> str:
    """Text safe to put in a one-line message: repr() when it holds control characters, cut to `limit`."""
    text = str(text)
    if not text.isprintable():
        text = repr(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _bad(key: str, why: str) -> UserError:
    return UserError(f"config key {key!r} {why}")


def _int(config: dict, key: str, default: Any = ..., *, minimum: int = 1, maximum: int = _MAX_DIM,
         aliases: tuple[str, ...] = ()) -> int:
    """A whole number from the config; missing without a default, or out of range, is a UserError."""
    for name in (key, *aliases):
        if name in config and config[name] is not None:
            key, value = name, config[name]
            break
    else:
        if default is ...:
            raise _bad(key, "is missing; it must be a whole number (see the model's config.json)")
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(key, f"must be a whole number, got {value!r} ({type(value).__name__})"[:200])
    if value < minimum:
        raise _bad(key, f"must be at least {minimum}, got {value}")
    if value > maximum:
        raise _bad(key, f"is implausibly large ({value}); at most {maximum} is accepted")
    return value


# Every spelling transformers writes for a field that changes a count (configuration_*.py of 5.x and
# their attribute_map aliases: Qwen3MoeConfig and MixtralConfig write num_local_experts,
# Qwen2MoeConfig and OlmoeConfig num_experts, DeepseekV3Config n_routed_experts).
SPELLINGS = {
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
    "num_experts_per_tok": ("num_experts_per_tok", "num_experts_per_token"),
    "num_hidden_layers": ("num_hidden_layers", "n_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_heads", "n_head"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_kv_heads"),
    "hidden_size": ("hidden_size", "d_model", "n_embd"),
}


def _spelled(config: dict, field: str, default: Any = ..., **limits) -> int:
    """A count field read under each spelling transformers writes; two spellings that disagree are
    an error (never one silently preferred), none present is the default (or an error without one)."""
    names = SPELLINGS[field]
    found = {name: config[name] for name in names if config.get(name) is not None}
    values = set(map(repr, found.values()))
    if len(values) > 1:
        listed = ", ".join(f"{name}={value!r}" for name, value in found.items())
        raise UserError(f"config keys disagree on {field.replace('_', ' ')}: {listed}"[:300])
    if not found:
        return _int(config, names[0], default, **limits)
    name = next(iter(found))
    return _int(config, name, **limits)


# Fields that change a parameter count, and the model types whose hand profile reads them. Set
# (true, or a count above zero) on another hand-profiled type they would be silently ignored: an error.
_COUNT_FIELDS = {
    "num_experts": ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3"),
    "shared_expert_intermediate_size": ("qwen2_moe",),
    "n_shared_experts": ("deepseek_v3",),
    "first_k_dense_replace": ("deepseek_v3",),
    "q_lora_rank": ("deepseek_v3",),
    "kv_lora_rank": ("deepseek_v3",),
    "num_nextn_predict_layers": ("deepseek_v3",),
    "mlp_bias": ("llama",),
    "embedding_size": ("olmo",),
    "use_qk_norm": (),
    "qk_layernorm": (),
}


def _check_unread_fields(config: dict, model_type: str) -> None:
    for field, readers in _COUNT_FIELDS.items():
        if model_type in readers:
            continue
        for name in SPELLINGS.get(field, (field,)):
            value = config.get(name)
            if value is True or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise UserError(f"config key {name!r} = {value!r} changes the parameter count, and the hand profile "
                                f"of model_type {model_type!r} does not model it; remove it or check the config")


def _optional_int(config: dict, key: str, *, minimum: int = 1, maximum: int = _MAX_DIM) -> int | None:
    if config.get(key) is None:
        return None
    return _int(config, key, minimum=minimum, maximum=maximum)


def _bool(config: dict, key: str, default: bool) -> bool:
    value = config.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(key, f"must be true or false, got {value!r}"[:200])
    return value


def _probability(config: dict, key: str) -> float:
    """A dropout probability in [0, 1]; absent or null means 0."""
    value = config.get(key)
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise _bad(key, f"must be a probability between 0 and 1, got {value!r}"[:200])
    return float(value)


def _int_list(config: dict, key: str, num_layers: int) -> tuple[int, ...]:
    value = config.get(key)
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _bad(key, f"must be a list of layer numbers, got {value!r}"[:200])
    out = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < num_layers:
            raise _bad(key, f"must hold layer numbers 0..{num_layers - 1}, got {item!r}"[:200])
        out.append(item)
    return tuple(sorted(set(out)))


def _dropout(config: dict, keys: tuple[str, ...]) -> bool:
    """True when any dropout probability in the config is above zero (GPT-2: 0.1; Llama: 0.0)."""
    return any(_probability(config, key) > 0 for key in keys)


def _sliding_from_layer_types(config: dict, num_layers: int) -> tuple[int, ...] | None:
    """Indices of "sliding_attention" layers when the config lists per-layer attention types."""
    types = config.get("layer_types")
    if types is None:
        return None
    if not isinstance(types, list) or len(types) != num_layers or not all(isinstance(t, str) for t in types):
        raise _bad("layer_types", f"must list one attention type per layer ({num_layers} strings)")
    return tuple(i for i, t in enumerate(types) if t == "sliding_attention")


# ---------------------------------------------------------------------------------------------
# config.json -> Architecture


def architecture_from_config(config: dict, name: str = "") -> Architecture:
    """Read the architecture of a Hugging Face config.json (already parsed into a dict).

    Defaults for absent keys follow each transformers `configuration_<type>.py` (e.g.
    tie_word_embeddings: True for gpt2/gemma/gemma2, False for llama, mistral, qwen2, phi3, olmo,
    deepseek_v3; gemma head_dim 256; qwen3 head_dim 128; mistral sliding_window 4096).
    Raises UserError, with one line naming the key, on anything that is not a usable config.
    """
    if not isinstance(config, dict):
        raise UserError(f"a model config must be a JSON object (a dict), got {type(config).__name__}")
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in SUPPORTED_MODEL_TYPES:
        shown = repr(model_type)[:60] if model_type is not None else "missing"
        raise UserError(f"unsupported model_type {shown}: no hand profile (those: {', '.join(SUPPORTED_MODEL_TYPES)}); "
                        "`tensor-tutor fit` answers any other model type transformers builds with a calibrated "
                        "trace (the [trace] extra)")
    if not isinstance(name, str):
        raise UserError("the model name must be a string")
    name = name or (config["_name_or_path"] if isinstance(config.get("_name_or_path"), str) else "") or model_type
    _check_unread_fields(config, model_type)
    if model_type == "gpt2":
        fields = _gpt2_fields(config)
    elif model_type == "deepseek_v3":
        fields = _deepseek_v3_fields(config)
    else:
        fields = _llama_family_fields(config, model_type)
    if not fields["num_experts"]:
        fields.update(dense_layers=fields["num_layers"], dense_layer_indices=tuple(range(fields["num_layers"])))
    fields.update(code_mechanisms(config))
    fields["partial_rotary_factor"] = _partial_rotary_factor(config, model_type)
    arch = Architecture(name=name, model_type=model_type, **fields)
    _check_consistency(arch)
    return arch


ACTIVATION_KEYS = ("hidden_act", "hidden_activation", "activation_function", "activation")
"""Where transformers' configs name the MLP's activation (an ACT2FN key): Llama's hidden_act, Gemma-2's
hidden_activation, GPT-2's activation_function, Falcon's activation."""
SOFTCAP_KEYS = ("attn_logit_softcapping", "final_logit_softcapping")


def code_mechanisms(config: dict) -> dict[str, Any]:
    """The Architecture fields that say what a family's code does beyond its parameter counts, read from the
    config's own switches (transformers' configuration_*.py names them): the MLP activation (ACTIVATION_KEYS), the
    soft-capping of scores and logits (SOFTCAP_KEYS: Gemma-2's `logits / cap`, tanh, `* cap`)."""
    act = next((config[k] for k in ACTIVATION_KEYS if isinstance(config.get(k), str) and config[k]), "")
    caps = {}
    for key in SOFTCAP_KEYS:
        value = config.get(key)
        caps[key] = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
            and 0 < value < float("inf") else None
    return dict(hidden_act=act[:40], **caps)


def _partial_rotary_factor(config: dict, model_type: str) -> float:
    """The share of each head's dims RoPE rotates (`partial_rotary_factor`, top level or in rope_parameters /
    rope_scaling), where transformers' code reads it: Phi-3's own default RoPE (modeling_phi3.py
    `compute_default_rope_parameters`: dim = int(head_dim * partial_rotary_factor)) and every non-default rope type
    (modeling_rope_utils.py `_compute_*_parameters`); the other families' default RoPE rotates the whole head."""
    params: dict = {}
    for key in ("rope_scaling", "rope_parameters"):
        if isinstance(config.get(key), dict):
            params.update(config[key])
    rope_type = params.get("rope_type", params.get("type")) or "default"
    if model_type != "phi3" and rope_type == "default":
        return 1.0
    value = config.get("partial_rotary_factor", params.get("partial_rotary_factor"))
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise _bad("partial_rotary_factor", f"must be a share of the head above 0 and at most 1, got {value!r}"[:200])
    return float(value)


def _no_moe() -> dict[str, Any]:
    return dict(num_experts=0, experts_per_token=0, num_shared_experts=0, moe_intermediate_size=0,
                shared_expert_intermediate_size=0, dense_layers=0, q_lora_rank=None, kv_lora_rank=0,
                qk_nope_head_dim=0, qk_rope_head_dim=0, v_head_dim=0, num_nextn_predict_layers=0)


def _gpt2_fields(config: dict) -> dict[str, Any]:
    """GPT-2 (transformers GPT2Config): Conv1D layers with biases everywhere, LayerNorm, learned positions."""
    hidden = _int(config, "n_embd", aliases=("hidden_size",))
    layers = _int(config, "n_layer", maximum=_MAX_LAYERS, aliases=("num_hidden_layers",))
    heads = _int(config, "n_head", maximum=_MAX_HEADS, aliases=("num_attention_heads",))
    if hidden % heads:
        raise _bad("n_head", f"({heads}) must divide n_embd ({hidden})")
    positions = _int(config, "n_positions", 1024, maximum=_MAX_POSITIONS)
    return dict(
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=heads,
        head_dim=hidden // heads, intermediate_size=_int(config, "n_inner", 4 * hidden),
        vocab_size=_int(config, "vocab_size", maximum=_MAX_VOCAB),
        tie_word_embeddings=_bool(config, "tie_word_embeddings", True),
        gated_mlp=False, norm="layernorm", norms_per_layer=2, qkv_bias=True, qk_norm=False,
        learned_positions=positions, max_position_embeddings=positions,
        dropout=_dropout(config, ("resid_pdrop", "embd_pdrop", "attn_pdrop")),
        sliding_window=None, sliding_window_layers=0, o_bias=True, mlp_bias=True,
        **_no_moe(),
    )


# Per model type, from transformers configuration_*.py / modeling_*.py: (tie_word_embeddings
# default, head_dim default, norm, norms per layer, QK-norm scope, attention-bias rule). Bias rule:
# "always" (Qwen2 hard-codes q/k/v biases), "never" (Mistral, Mixtral, Phi-3 hard-code none) or
# "attention_bias" (the config key switches q/k/v/o biases, default false).
_FAMILY = {
    "llama": (False, None, "rmsnorm", 2, "", "attention_bias"),
    "mistral": (False, None, "rmsnorm", 2, "", "never"),
    "mixtral": (False, None, "rmsnorm", 2, "", "never"),
    "qwen2": (False, None, "rmsnorm", 2, "", "always"),
    "qwen2_moe": (False, None, "rmsnorm", 2, "", "always"),
    "qwen3": (False, 128, "rmsnorm", 2, "head", "attention_bias"),
    "qwen3_moe": (False, None, "rmsnorm", 2, "head", "attention_bias"),
    "gemma": (True, 256, "rmsnorm", 2, "", "attention_bias"),
    "gemma2": (True, 256, "rmsnorm", 4, "", "attention_bias"),
    "phi3": (False, None, "rmsnorm", 2, "", "never"),
    "olmo": (False, None, "nonparametric", 2, "", "attention_bias"),
    "olmo2": (False, None, "rmsnorm", 2, "projection", "attention_bias"),
}


def _llama_family_fields(config: dict, model_type: str) -> dict[str, Any]:
    """Llama-like decoders: separate (or fused, same count) q/k/v/o and gated MLP."""
    tie_default, head_dim_default, norm, norms_per_layer, qk_norm_scope, bias_rule = _FAMILY[model_type]
    hidden = _spelled(config, "hidden_size")
    layers = _spelled(config, "num_hidden_layers", maximum=_MAX_LAYERS)
    heads = _spelled(config, "num_attention_heads", maximum=_MAX_HEADS)
    kv_heads = _spelled(config, "num_key_value_heads", heads, maximum=_MAX_HEADS)
    explicit_head_dim = _optional_int(config, "head_dim")
    head_dim = explicit_head_dim or head_dim_default
    if head_dim is None:
        if hidden % heads:
            raise _bad("num_attention_heads", f"({heads}) must divide hidden_size ({hidden}) unless head_dim is given")
        head_dim = hidden // heads
    if heads % kv_heads:
        raise _bad("num_key_value_heads", f"({kv_heads}) must divide num_attention_heads ({heads})")
    vocab = _int(config, "vocab_size", maximum=_MAX_VOCAB)
    if model_type == "olmo" and config.get("embedding_size") is not None:
        # OLMo v1 pads its embedding table (50280 tokens -> 50304 rows) for throughput.
        padded = _int(config, "embedding_size", maximum=_MAX_VOCAB)
        if padded < vocab:
            raise _bad("embedding_size", f"({padded}) must be at least vocab_size ({vocab})")
        vocab = padded
    moe_types = ("mixtral", "qwen2_moe", "qwen3_moe")
    intermediate = _int(config, "intermediate_size", 0 if model_type in moe_types else ..., minimum=0)
    if intermediate == 0 and model_type not in moe_types:
        raise _bad("intermediate_size", "must be at least 1")
    attention_bias = _bool(config, "attention_bias", False)
    qkv_bias = {"always": True, "never": False}.get(bias_rule, attention_bias)
    o_bias = attention_bias if bias_rule == "attention_bias" else False
    mlp_bias = _bool(config, "mlp_bias", False) if model_type == "llama" else False
    positions = _int(config, "max_position_embeddings", 0, minimum=0, maximum=_MAX_POSITIONS,
                     aliases=("max_sequence_length",))
    dropout = _dropout(config, ("attention_dropout", "hidden_dropout", "resid_pdrop", "embd_pdrop"))
    moe = _no_moe()
    shared_gate = False
    dense_indices: tuple[int, ...] = ()
    if model_type == "mixtral":
        experts = _spelled(config, "num_experts", 8, maximum=_MAX_EXPERTS)
        moe.update(num_experts=experts, experts_per_token=_spelled(config, "num_experts_per_tok", 2, maximum=_MAX_EXPERTS),
                   moe_intermediate_size=_int(config, "intermediate_size"))
        intermediate = moe["moe_intermediate_size"]
    elif model_type in ("qwen2_moe", "qwen3_moe"):
        experts = _spelled(config, "num_experts", 60 if model_type == "qwen2_moe" else 128, minimum=0,
                           maximum=_MAX_EXPERTS)
        moe.update(num_experts=experts,
                   experts_per_token=_spelled(config, "num_experts_per_tok", 4 if model_type == "qwen2_moe" else 8,
                                              maximum=_MAX_EXPERTS),
                   moe_intermediate_size=_int(config, "moe_intermediate_size", 1408 if model_type == "qwen2_moe" else 768))
        if experts == 0:  # transformers falls back to a dense MLP in every layer
            moe.update(experts_per_token=0, moe_intermediate_size=0)
        step = _int(config, "decoder_sparse_step", 1, maximum=_MAX_LAYERS)
        mlp_only = set(_int_list(config, "mlp_only_layers", layers))
        # transformers Qwen2MoeDecoderLayer: sparse iff not in mlp_only_layers, experts > 0 and
        # (layer_idx + 1) % decoder_sparse_step == 0.
        dense_indices = tuple(i for i in range(layers)
                              if experts == 0 or i in mlp_only or (i + 1) % step != 0)
        if model_type == "qwen2_moe":
            shared = _int(config, "shared_expert_intermediate_size", 5632, minimum=0) if experts else 0
            moe.update(shared_expert_intermediate_size=shared, num_shared_experts=1 if shared else 0)
            shared_gate = shared > 0
        if dense_indices and intermediate == 0:
            raise _bad("intermediate_size", "must be at least 1 when some layers have a dense MLP")
        moe["dense_layers"] = len(dense_indices)
    sliding_window = None
    sliding_layers = 0
    sliding_indices: tuple[int, ...] = ()
    if model_type in ("mistral", "mixtral", "phi3", "gemma2", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        default_window = None if model_type in ("mixtral", "phi3") else 4096
        # Qwen configs carry a window even when it is off (Qwen2MoeConfig().to_dict() writes
        # sliding_window 0 with use_sliding_window false): read the switch before the value.
        if model_type.startswith("qwen") and not _bool(config, "use_sliding_window", False):
            sliding_window = None
        elif "sliding_window" in config:
            sliding_window = _optional_int(config, "sliding_window", maximum=_MAX_POSITIONS)
        else:
            sliding_window = default_window
        listed = _sliding_from_layer_types(config, layers)
        if sliding_window is None:
            sliding_indices = ()
        elif listed is not None:
            sliding_indices = listed
        elif model_type == "gemma2":
            sliding_indices = tuple(range(0, layers, 2))  # layers 0, 2, 4, ... slide; the others see everything
        elif model_type.startswith("qwen"):
            # transformers Qwen2Config.layer_types: sliding iff layer_idx >= max_window_layers.
            first = _int(config, "max_window_layers", 28, minimum=0, maximum=_MAX_LAYERS)
            sliding_indices = tuple(range(first, layers))
        else:
            sliding_indices = tuple(range(layers))
        if not sliding_indices:
            sliding_window = None
        sliding_layers = len(sliding_indices)
    return dict(
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        intermediate_size=intermediate, vocab_size=vocab,
        tie_word_embeddings=_bool(config, "tie_word_embeddings", tie_default),
        gated_mlp=True, norm=norm, norms_per_layer=norms_per_layer, qkv_bias=qkv_bias,
        qk_norm=bool(qk_norm_scope), learned_positions=0, max_position_embeddings=positions,
        dropout=dropout, sliding_window=sliding_window, sliding_window_layers=sliding_layers,
        sliding_window_layer_indices=sliding_indices,
        o_bias=o_bias, mlp_bias=mlp_bias, qk_norm_per_head=qk_norm_scope != "projection",
        shared_expert_gate=shared_gate, dense_layer_indices=dense_indices, **moe,
    )


def _deepseek_v3_fields(config: dict) -> dict[str, Any]:
    """DeepSeek-V3 (transformers DeepseekV3Config): MLA, shared experts, first k layers dense, MTP."""
    hidden = _int(config, "hidden_size")
    layers = _int(config, "num_hidden_layers", maximum=_MAX_LAYERS)
    heads = _int(config, "num_attention_heads", maximum=_MAX_HEADS)
    kv_heads = _int(config, "num_key_value_heads", heads, maximum=_MAX_HEADS)
    if heads % kv_heads:
        raise _bad("num_key_value_heads", f"({kv_heads}) must divide num_attention_heads ({heads})")
    nope = _int(config, "qk_nope_head_dim", 128)
    rope = _int(config, "qk_rope_head_dim", 64)
    experts = _spelled(config, "num_experts", 256, minimum=0, maximum=_MAX_EXPERTS)
    first_dense = _int(config, "first_k_dense_replace", 3, minimum=0, maximum=_MAX_LAYERS)
    if first_dense > layers:
        raise _bad("first_k_dense_replace", f"({first_dense}) must not exceed num_hidden_layers ({layers})")
    freq = _int(config, "moe_layer_freq", 1, maximum=_MAX_LAYERS)
    # DeepSeek modelling: layer i is MoE iff experts and i >= first_k_dense_replace and i % moe_layer_freq == 0.
    dense_indices = tuple(i for i in range(layers) if experts == 0 or i < first_dense or i % freq)
    shared = _int(config, "n_shared_experts", 1, minimum=0, maximum=_MAX_EXPERTS)
    moe_inter = _int(config, "moe_intermediate_size", 2048)
    attention_bias = _bool(config, "attention_bias", False)
    return dict(
        hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=nope + rope, intermediate_size=_int(config, "intermediate_size"),
        vocab_size=_int(config, "vocab_size", maximum=_MAX_VOCAB),
        tie_word_embeddings=_bool(config, "tie_word_embeddings", False),
        gated_mlp=True, norm="rmsnorm", norms_per_layer=2, qkv_bias=attention_bias, qk_norm=False,
        learned_positions=0,
        max_position_embeddings=_int(config, "max_position_embeddings", 0, minimum=0, maximum=_MAX_POSITIONS),
        dropout=_dropout(config, ("attention_dropout",)), sliding_window=None, sliding_window_layers=0,
        num_experts=experts,
        experts_per_token=_spelled(config, "num_experts_per_tok", 8, maximum=_MAX_EXPERTS) if experts else 0,
        num_shared_experts=shared if experts else 0, moe_intermediate_size=moe_inter if experts else 0,
        shared_expert_intermediate_size=shared * moe_inter if experts else 0,
        dense_layers=len(dense_indices), dense_layer_indices=dense_indices,
        q_lora_rank=_optional_int(config, "q_lora_rank"),
        kv_lora_rank=_int(config, "kv_lora_rank", 512),
        qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=_int(config, "v_head_dim", 128),
        num_nextn_predict_layers=_int(config, "num_nextn_predict_layers", 0, minimum=0, maximum=_MAX_LAYERS),
        o_bias=attention_bias,
        # noaux_tc routing adds a learned per-expert score-correction bias (DeepSeek-V3 paper §2.1.2).
        router_bias=config.get("topk_method", "noaux_tc") == "noaux_tc",
    )


def _check_consistency(arch: Architecture) -> None:
    if arch.num_experts:
        if arch.experts_per_token < 1:
            raise _bad("num_experts_per_tok", "must be at least 1 in a mixture-of-experts model")
        if arch.experts_per_token > arch.num_experts:
            raise _bad("num_experts_per_tok",
                       f"({arch.experts_per_token}) must not exceed the number of experts ({arch.num_experts})")


# ---------------------------------------------------------------------------------------------
# Parameter counts


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer, split the way activation and sharding formulas need them."""

    attention: int       # projections (+ biases) and QK-norm weights
    mlp: int             # dense MLP, or every routed + shared expert of a MoE layer
    active_mlp: int      # what one token uses: dense MLP, or top-k routed + shared experts
    router: int          # router and Qwen2-MoE's shared-expert gate
    norms: int           # the layer's pre/post norms (not the QK-norm)
    is_moe: bool
    buffers: int = 0     # persistent buffers a checkpoint stores that are not parameters (not in total)

    @property
    def total(self) -> int:
        return self.attention + self.mlp + self.router + self.norms

    @property
    def active(self) -> int:
        return self.attention + self.active_mlp + self.router + self.norms


@dataclass(frozen=True)
class ParamCount:
    """Parameter counts of a model. `total` is what must be stored; `active` what one token uses.

    `total` excludes the DeepSeek multi-token-prediction module, reported in `mtp` (the
    671B-vs-685B distinction of deepseek-ai/DeepSeek-V3 README_WEIGHTS.md).

    Two conventions: `total` counts parameters as `sum(p.numel() for p in model.parameters())` of the
    transformers model does; `checkpoint_tensors` adds the persistent buffers a checkpoint also
    stores (`buffers`: DeepSeek-V3's e_score_correction_bias, an nn.Buffer of E floats per MoE layer
    in transformers 5.x DeepseekV3TopkRouter). Published totals that sum checkpoint tensors
    (DeepSeek-V3's 671,026,419,200) match `checkpoint_tensors`.
    """

    total: int
    active: int
    embedding: int               # input token table
    lm_head: int                 # output projection; 0 when tied to the embedding
    position_embedding: int      # learned positions (GPT-2), else 0
    attention_per_layer: int
    attention: int               # all layers
    dense_mlp_per_layer: int     # 0 when no layer is dense
    moe_mlp_per_layer: int       # all routed + shared experts of one MoE layer; 0 for dense models
    expert: int                  # one routed expert
    shared_experts_per_layer: int
    mlp: int                     # all layers, all experts
    router_per_layer: int
    router: int                  # all layers
    norms: int                   # every norm weight/bias in the model incl. the final norm and QK-norms
    mtp: int                     # DeepSeek MTP module, parameters not shared with the main model
    buffers: int = 0             # persistent non-parameter tensors of the main model (see above)

    @property
    def checkpoint_tensors(self) -> int:
        """Elements a checkpoint stores for the main model: parameters plus persistent buffers."""
        return self.total + self.buffers

    @property
    def non_embedding(self) -> int:
        """Total minus the token tables and position embeddings (Kaplan et al. 2020's N)."""
        return self.total - self.embedding - self.lm_head - self.position_embedding


def _norm_size(arch: Architecture, width: int) -> int:
    """Parameters of one norm over `width` features: RMSNorm a weight, LayerNorm weight + bias."""
    return {"rmsnorm": width, "layernorm": 2 * width, "nonparametric": 0}[arch.norm]


def attention_weights(arch: Architecture) -> int:
    """Matrix weights of one attention block (no biases, no norms).

    GQA/MQA: h*(a*d) for Q, 2*h*(g*d) for K and V, (a*d)*h for O, with explicit head_dim d
    (Ainslie et al. 2023; transformers LlamaAttention). MLA (DeepSeek-V2 arXiv 2405.04434 §2.1;
    transformers DeepseekV3Attention): q_a h*r_q, q_b r_q*a*(nope+rope) (or q h*a*(nope+rope)
    without a query LoRA), kv_a h*(r_kv+rope), kv_b r_kv*a*(nope+v), o a*v*h.
    """
    h = arch.hidden_size
    if arch.uses_mla:
        qk = arch.qk_nope_head_dim + arch.qk_rope_head_dim
        q = h * arch.num_heads * qk if arch.q_lora_rank is None else h * arch.q_lora_rank + arch.q_lora_rank * arch.num_heads * qk
        kv = h * (arch.kv_lora_rank + arch.qk_rope_head_dim) + arch.kv_lora_rank * arch.num_heads * (arch.qk_nope_head_dim + arch.v_head_dim)
        return q + kv + arch.num_heads * arch.v_head_dim * h
    return 2 * h * arch.q_width + 2 * h * arch.kv_width


def qk_norm_parameters(arch: Architecture) -> int:
    """Norm weights inside one attention block.

    Qwen3: an RMSNorm over head_dim shared by all heads, for q and for k (2*d); OLMo-2: an
    RMSNorm over the whole q and k projections (a*d + g*d); MLA: the q_a and kv_a latent norms.
    """
    if arch.uses_mla:
        return arch.kv_lora_rank + (arch.q_lora_rank or 0)
    if not arch.qk_norm:
        return 0
    if arch.qk_norm_per_head:
        return 2 * arch.head_dim
    return arch.q_width + arch.kv_width


def attention_biases(arch: Architecture) -> int:
    """Biases of one attention block: Qwen2 q/k/v only; GPT-2 and attention_bias=true also o."""
    h = arch.hidden_size
    if arch.uses_mla:
        if not arch.qkv_bias:
            return 0
        q_in = arch.q_lora_rank if arch.q_lora_rank is not None else arch.num_heads * arch.head_dim
        return q_in + arch.kv_lora_rank + arch.qk_rope_head_dim + (h if arch.o_bias else 0)
    return (arch.q_width + 2 * arch.kv_width if arch.qkv_bias else 0) + (h if arch.o_bias else 0)


def mlp_weights(arch: Architecture, width: int) -> int:
    """Matrix weights of one MLP of the given width: 3*h*f gated (SwiGLU/GeGLU), 2*h*f plain (GPT-2)."""
    return (3 if arch.gated_mlp else 2) * arch.hidden_size * width


def mlp_biases(arch: Architecture, width: int) -> int:
    """Biases of one MLP: GPT-2's c_fc (f) and c_proj (h); Llama with mlp_bias the same per matrix."""
    if not arch.mlp_bias:
        return 0
    return (2 * width if arch.gated_mlp else width) + arch.hidden_size


def router_weights(arch: Architecture) -> int:
    """Router (gate) of one MoE layer: a h x E matrix; Qwen2-MoE adds a h x 1 shared-expert gate."""
    return arch.hidden_size * arch.num_experts + (arch.hidden_size if arch.shared_expert_gate else 0)


def _measured_layer(arch: Architecture, layer: MeasuredLayer) -> LayerParams:
    active_routed = layer.routed * arch.experts_per_token // arch.num_experts if arch.num_experts else 0
    return LayerParams(attention=layer.attention, mlp=layer.mlp, active_mlp=layer.mlp - layer.routed + active_routed,
                       router=layer.router, norms=layer.norms, is_moe=layer.routed > 0)


def parameters_per_layer(arch: Architecture) -> tuple[LayerParams, ...]:
    """Parameters of each decoder layer in order (dense and MoE layers differ)."""
    if arch.measured is not None:
        return tuple(_measured_layer(arch, layer) for layer in arch.measured.layers)
    dense, moe = _dense_layer(arch), _moe_layer(arch)
    return tuple(moe if is_moe else dense for is_moe in arch.layer_is_moe)


def _attention_params(arch: Architecture) -> int:
    return attention_weights(arch) + attention_biases(arch) + qk_norm_parameters(arch)


def _dense_layer(arch: Architecture) -> LayerParams:
    mlp = mlp_weights(arch, arch.intermediate_size) + mlp_biases(arch, arch.intermediate_size)
    return LayerParams(attention=_attention_params(arch), mlp=mlp, active_mlp=mlp, router=0,
                       norms=arch.norms_per_layer * _norm_size(arch, arch.hidden_size), is_moe=False)


def _moe_layer(arch: Architecture) -> LayerParams:
    expert = mlp_weights(arch, arch.moe_intermediate_size)
    shared = mlp_weights(arch, arch.shared_expert_intermediate_size)
    # noaux_tc's score-correction bias is learned by a load-balancing rule, not by gradients: transformers
    # registers it as a buffer, so it is stored in checkpoints but is no parameter.
    return LayerParams(attention=_attention_params(arch), mlp=arch.num_experts * expert + shared,
                       active_mlp=arch.experts_per_token * expert + shared, router=router_weights(arch),
                       norms=arch.norms_per_layer * _norm_size(arch, arch.hidden_size), is_moe=True,
                       buffers=arch.num_experts if arch.router_bias else 0)


def _mtp_params(arch: Architecture, moe_layer: LayerParams, dense_layer: LayerParams) -> int:
    """One DeepSeek-V3 MTP module per predicted token: enorm + hnorm (2h), eh_proj (2h x h), one
    decoder block, and the shared head's norm (h); embedding and output head are shared with the
    main model (DeepSeek-V3 paper arXiv 2412.19437 §2.2; README_WEIGHTS.md, "11.5B unique")."""
    h = arch.hidden_size
    block = moe_layer.total if arch.num_experts else dense_layer.total
    return arch.num_nextn_predict_layers * (3 * _norm_size(arch, h) + 2 * h * h + block)


def count_parameters(arch: Architecture) -> ParamCount:
    """Exact parameter count following the transformers module structure for arch.model_type.

    total = embedding + (lm_head if untied) + positions + sum over layers + final norm.
    active adds only top-k routed experts of each MoE layer (plus shared experts, router, all
    attention, embeddings, norms): the "12.9B of 46.7B" of Mixtral (Mistral AI announcement) and
    37.55B of 671B for DeepSeek-V3 (paper: 37B).
    """
    if arch.measured is not None:
        return _measured_count(arch, arch.measured)
    h = arch.hidden_size
    embedding = arch.vocab_size * h
    lm_head = 0 if arch.tie_word_embeddings else arch.vocab_size * h
    positions = arch.learned_positions * h
    dense, moe = _dense_layer(arch), _moe_layer(arch)
    n_moe = arch.moe_layers
    n_dense = arch.num_layers - n_moe
    final_norm = _norm_size(arch, h)
    base = embedding + lm_head + positions + final_norm
    total = base + n_dense * dense.total + n_moe * moe.total
    active = base + n_dense * dense.active + n_moe * moe.active
    return ParamCount(
        total=total, active=active, embedding=embedding, lm_head=lm_head, position_embedding=positions,
        attention_per_layer=dense.attention, attention=arch.num_layers * dense.attention,
        dense_mlp_per_layer=dense.mlp if n_dense else 0, moe_mlp_per_layer=moe.mlp if n_moe else 0,
        expert=mlp_weights(arch, arch.moe_intermediate_size) if n_moe else 0,
        shared_experts_per_layer=mlp_weights(arch, arch.shared_expert_intermediate_size) if n_moe else 0,
        mlp=n_dense * dense.mlp + n_moe * moe.mlp,
        router_per_layer=moe.router if n_moe else 0, router=n_moe * moe.router,
        norms=arch.num_layers * (dense.norms + qk_norm_parameters(arch)) + final_norm,
        mtp=_mtp_params(arch, moe, dense), buffers=n_moe * moe.buffers,
    )


def _measured_count(arch: Architecture, measured: MeasuredParams) -> ParamCount:
    """A ParamCount from the real model's counts (calibrated-trace architectures)."""
    layers = parameters_per_layer(arch)
    dense = [layer for layer in layers if not layer.is_moe]
    moe = [layer for layer in layers if layer.is_moe]
    routed = [m.routed for m in measured.layers if m.routed]
    expert = routed[0] // arch.num_experts if routed and arch.num_experts else 0
    active = measured.total - sum(layer.total - layer.active for layer in layers)
    return ParamCount(
        total=measured.total, active=active, embedding=measured.embedding, lm_head=measured.lm_head,
        position_embedding=measured.positions,
        attention_per_layer=layers[0].attention if layers else 0, attention=sum(layer.attention for layer in layers),
        dense_mlp_per_layer=dense[0].mlp if dense else 0, moe_mlp_per_layer=moe[0].mlp if moe else 0,
        expert=expert, shared_experts_per_layer=(moe[0].mlp - routed[0]) if moe else 0,
        mlp=sum(layer.mlp for layer in layers), router_per_layer=moe[0].router if moe else 0,
        router=sum(layer.router for layer in layers),
        norms=sum(layer.norms for layer in layers) + measured.other, mtp=0, buffers=measured.buffers)


# Families whose input embedding scales its output by sqrt(hidden) from a 0-d buffer in the model's dtype
# (transformers modeling_gemma.py / modeling_gemma2.py: GemmaTextScaledWordEmbedding's embed_scale).
SCALED_EMBEDDING_TYPES = ("gemma", "gemma2")
# Families whose router holds a score-correction bias buffer whatever the config's topk_method (transformers 5
# modeling_deepseek_v3.py DeepseekV3TopkRouter registers it unconditionally; a checkpoint stores it for noaux_tc).
CORRECTED_ROUTER_TYPES = ("deepseek_v3",)


def model_buffers(arch: Architecture) -> tuple[BufferKind, ...]:
    """Every buffer the transformers model of `arch` holds in memory, persistent or not, in the dtype it holds it.

    A calibrated-trace architecture's are read off its meta build (MeasuredParams.buffer_kinds). The hand profiles
    follow transformers 5's modelling code: a RoPE model's rotary embedding keeps `inv_freq` and a clone,
    `original_inv_freq` (what dynamic RoPE restores), both non-persistent and fp32 even in a 16-bit model (computed
    with dtype=torch.float; from_pretrained(dtype=...) leaves buffers as built), of len(arange(0, dim, 2)) elements
    for the rotated dim (MLA: qk_rope_head_dim; modeling_llama.py LlamaRotaryEmbedding); Gemma's embedding keeps
    its scale, one value in the model's dtype (SCALED_EMBEDDING_TYPES); DeepSeek-V3's noaux_tc router keeps
    `e_score_correction_bias`, E fp32 values per MoE layer, persistent (CORRECTED_ROUTER_TYPES).
    GPT-2 keeps none (its learned positions are a parameter; transformers 5 builds the causal mask per call).
    """
    if arch.measured is not None:
        return arch.measured.buffer_kinds
    kinds: list[BufferKind] = []
    if not arch.learned_positions:
        dim = arch.qk_rope_head_dim if arch.uses_mla else int(arch.head_dim * arch.partial_rotary_factor)
        frequencies = (dim + 1) // 2
        kinds += [BufferKind("rotary_emb.inv_freq", (frequencies,), "float32", 4, False,
                             meaning="RoPE's inverse frequencies"),
                  BufferKind("rotary_emb.original_inv_freq", (frequencies,), "float32", 4, False)]
    if arch.model_type in SCALED_EMBEDDING_TYPES:
        kinds.append(BufferKind("embed_tokens.embed_scale", (), MODEL_DTYPE, 0, False,
                                meaning="the embedding's sqrt(hidden) scale"))
    if arch.model_type in CORRECTED_ROUTER_TYPES and arch.num_experts:
        moe = tuple(index for index, is_moe in enumerate(arch.layer_is_moe) if is_moe)
        kinds.append(BufferKind("mlp.gate.e_score_correction_bias", (arch.num_experts,), "float32", 4, True, moe,
                                meaning="the router's score-correction bias"))
    return tuple(kinds)


def matmul_parameters(arch: Architecture) -> int:
    """Weights one token multiplies through in a forward pass: the N in the 6·N·D training rule.

    Convention: every matrix a token's activations are multiplied by, i.e. attention projections,
    the dense MLP or the top-k routed + shared experts, the router, and the output projection
    (V·h, counted even when tied to the input table, because the logits are a real matmul).
    Excluded: the input-embedding and position lookups, norms and biases (no multiply-accumulate
    per weight) and the MTP module. Kaplan et al. 2020 (arXiv 2001.08361, §2.1) drop embeddings
    from N altogether; Chinchilla (Hoffmann et al. 2022) keeps them; counting the output
    projection but not the lookup follows the FLOP count of Narayanan et al. 2021 (arXiv 2104.04473, §5.1).
    """
    if arch.measured is not None:
        # The layers' 2-D weights a token multiplies through (top-k of the routed experts) + the head.
        per_layer = 0
        for layer in arch.measured.layers:
            active_routed = layer.routed * arch.experts_per_token // arch.num_experts if arch.num_experts else 0
            per_layer += layer.linear - layer.routed + active_routed
        return per_layer + arch.vocab_size * arch.hidden_size
    h = arch.hidden_size
    attention = attention_weights(arch)
    dense = mlp_weights(arch, arch.intermediate_size)
    moe = (arch.experts_per_token * mlp_weights(arch, arch.moe_intermediate_size)
           + mlp_weights(arch, arch.shared_expert_intermediate_size) + router_weights(arch))
    n_moe = arch.moe_layers
    return (arch.num_layers * attention + (arch.num_layers - n_moe) * dense + n_moe * moe
            + arch.vocab_size * h)
