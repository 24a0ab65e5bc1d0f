"""A config.json rebuilt at another number of decoder layers, with every per-layer list rebuilt to match.

A transformers config describes its layers twice: a count (`num_hidden_layers`, or `n_layer`,
`num_layers`) and per-layer data in whatever form its configuration class uses: lists with one entry
per layer (`layer_types`, gemma3n's `intermediate_size` and `activation_sparsity_pattern`, Llama-4's
`no_rope_layers`, gpt_neo's `attention_layers`), lists of layer indices (`mlp_only_layers`,
`full_attn_idxs`, `hybrid_layer_ids`), dicts keyed by layer index (Gemma-4's `per_layer_config`),
run-length patterns (gpt_neo's `attention_types`, [[["global", "local"], 12]]) and counts of layers
of a kind (gemma3n's `num_kv_shared_layers`). Since transformers 5 the configuration classes check
that these agree with the count (`validate_layer_type`: "num_hidden_layers (3) must be equal to the
number of layer_types (2)"), so changing only the count is refused.

The rule here is general, read from the config as its class writes it (`PretrainedConfig.to_dict`,
which spells out what the class derives from its pattern fields: Gemma-3's `layer_types` from
`sliding_window_pattern`), not a table per model type:

1. Every layer gets a *kind*: the tuple of its entries in every per-layer field.
2. The kinds form a *pattern*: the shortest period of the sequence when it repeats with a period of
   at most MAX_PATTERN layers (Gemma-3: 5 sliding and 1 full; gpt-oss: sliding, full); else one
   layer of each kind in proportion to how many layers have it, at most MAX_PATTERN layers (largest
   remainders, every kind at least once), for sequences that do not repeat (gemma3n's 10 sparse
   layers then 25 dense).
3. A config with N layers repeats the pattern to N layers, and every per-layer field is written from
   the layer each position repeats; counts of layers of a kind are scaled to N.

So `pattern_layers` consecutive layers have the model's own mix of kinds, which is what a fit of
per-layer terms from traces at two depths that far apart needs (tutor.trace.arch_calibration).
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass

from tutor.theory.models import SPELLINGS

LAYER_COUNT_NAMES = SPELLINGS["num_hidden_layers"] + ("decoder_layers",)
# A repeating pattern longer than this is not looked for (a trace of twice as many layers would be the
# cost); sequences that do not repeat sooner are reduced to their proportions in this many layers.
MAX_PATTERN = 8
# Leading layers of their own before a repeating pattern (dense layers before the MoE ones) kept as they are.
MAX_LEAD = 3
# Counts of layers that are no count of a kind of layer: a window length in layers (qwen2's layers
# with full attention before the sliding ones are listed in its layer_types, which this rewrites).
NOT_A_KIND_COUNT = ("max_window_layers",)
# Counts of layers of a kind not named *_layers: DeepSeek's dense layers before the MoE ones.
LEADING_LAYER_COUNTS = ("first_k_dense_replace",)


@dataclass(frozen=True)
class LayerPlan:
    """How a config's layers repeat: at any depth, the lead layers first, then layer i copies the original layer
    pattern[(i - len(lead)) % len(pattern)]."""

    layers: int                       # the config's own layer count
    pattern: tuple[int, ...]          # original layer indices, one per position of the repeating unit
    periodic: bool                    # the sequence of kinds repeats this unit exactly (else: its proportions)
    lead: tuple[int, ...] = ()        # leading layers before the repeats start (Kimi-Linear's dense first layer)

    @property
    def pattern_layers(self) -> int:
        return len(self.pattern)

    def source_layer(self, index: int) -> int:
        """The original layer whose entries layer `index` of a rebuilt config takes."""
        if index < len(self.lead):
            return self.lead[index]
        return self.pattern[(index - len(self.lead)) % len(self.pattern)]


def layer_section(config: dict) -> tuple[dict, str] | None:
    """(the dict holding the layer count, the name of the count in it): the config itself, or its
    `text_config` for a composite config (Gemma-3, Llama-4, Qwen3.5 put their decoder there)."""
    for section in (config, config.get("text_config")):
        if isinstance(section, dict):
            name = next((n for n in LAYER_COUNT_NAMES if isinstance(section.get(n), int)
                         and not isinstance(section.get(n), bool)), None)
            if name is not None:
                return section, name
    return None


def _is_index_list(key: str, value: object, layers: int) -> bool:
    """A list of layer indices (`mlp_only_layers`, `full_attn_idxs`): named for layers or indices, and
    strictly increasing integers below the count (a per-layer 0/1 flag list repeats values)."""
    if not isinstance(value, list) or not any(word in key for word in ("layer", "idx", "ids", "indices")):
        return False
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    return ints and all(0 <= v < layers for v in value) and all(a < b for a, b in zip(value, value[1:]))


def _index_dict_keys(key: str, value: object, layers: int) -> dict[int, str] | None:
    """{layer index: key} of a dict named for layers and keyed by layer index (Gemma-4's
    per_layer_config: "05"), else None (id2label is keyed by label)."""
    if "layer" not in key or not isinstance(value, dict) or not value:
        return None
    out = {}
    for entry in value:
        text = str(entry)
        if not isinstance(entry, str) or not text.isdigit() or int(text) >= layers:
            return None
        out[int(text)] = text
    return out


def _is_run_lengths(value: object, layers: int) -> bool:
    """gpt_neo's attention_types: [[kinds, repeat], ...] whose expansion has one entry per layer."""
    if not isinstance(value, list) or not value:
        return False
    if not all(isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[0], (list, tuple))
               and isinstance(item[1], int) for item in value):
        return False
    return sum(len(kinds) * repeat for kinds, repeat in value) == layers


def _expanded(value: list) -> list:
    return [kind for kinds, repeat in value for _ in range(repeat) for kind in kinds]


@dataclass(frozen=True)
class _Field:
    key: str
    form: str          # "list", "indices", "index-dict", "run-lengths"
    values: tuple      # the entry of each original layer (JSON text, to compare)


@functools.lru_cache(maxsize=64)
def _class_list_lengths(model_type: str) -> tuple[int, dict[str, int]] | None:
    """(layer count, {field: length of its list}) of the configuration class's own default config, or None
    where its defaults do not build: which list fields the class itself sizes by its layer count."""
    try:
        from transformers import AutoConfig

        written = AutoConfig.for_model(model_type).to_dict()
    except Exception:  # noqa: BLE001 - a class whose defaults do not build tells nothing, and is no error here
        return None
    found = layer_section(written)
    if found is None:
        return None
    section, count_name = found
    return section[count_name], {k: len(v) for k, v in section.items() if isinstance(v, (list, tuple))}


@functools.lru_cache(maxsize=256)
def _class_derived(model_type: str, count_name: str, layers: int) -> dict[str, object]:
    """The scalar fields the configuration class derives from its layer count, with the value it derives
    for `layers` (xLSTM's num_blocks, ERNIE-4.5-MoE's moe_layer_end_index, Dory's n_recurrent_layers):
    the fields whose default differs between the class built at `layers` and at `layers` + 1."""
    try:
        from transformers import AutoConfig

        found = [layer_section(AutoConfig.for_model(model_type, **{count_name: n}).to_dict())
                 for n in (layers, layers + 1)]
    except Exception:  # noqa: BLE001 - a class that does not build at these counts tells nothing
        return {}
    if found[0] is None or found[1] is None:
        return {}
    here, there = found[0][0], found[1][0]
    return {k: v for k, v in here.items() if k != count_name and k in there and there[k] != v
            and not isinstance(v, (list, tuple, dict)) and isinstance(v, (int, float))}


@functools.lru_cache(maxsize=256)
def _count_kept_in(model_type: str, count_name: str) -> str | None:
    """The field a configuration class keeps the layer count it is given in, when it writes another count
    in its place (HRM-Text: given 16 decoder layers per stack, it keeps 16 in num_layers_per_stack and
    writes num_hidden_layers = 16 x H_cycles x (L_cycles + 1), the cache slots its cycles fill); None
    where the class keeps the count as given. Read from the class built at two counts."""
    try:
        from transformers import AutoConfig

        found = [layer_section(AutoConfig.for_model(model_type, **{count_name: n}).to_dict()) for n in (2, 3)]
    except Exception:  # noqa: BLE001 - a class that does not build at these counts tells nothing
        return None
    if found[0] is None or found[1] is None:
        return None
    two, three = found[0][0], found[1][0]
    if two.get(count_name) == 2 and three.get(count_name) == 3:
        return None
    return next((key for key, value in two.items() if key != count_name and value == 2 and three.get(key) == 3
                 and isinstance(value, int) and not isinstance(value, bool)), None)


def _sized_by_layers(key: str, model_type: object, layers: int) -> bool:
    """Whether a list field as long as the layer count is one entry per layer: the class's default config
    has it as long as its own layer count (falcon_h1's two mlp_multipliers are no per-layer list in a
    2-layer config); for a field the defaults lack, a name that says layer, or more than 2 entries."""
    defaults = _class_list_lengths(model_type) if isinstance(model_type, str) and model_type else None
    if defaults is not None and key in defaults[1]:
        return defaults[0] > 1 and defaults[1][key] == defaults[0]
    return layers > 2 or "layer" in key


def per_layer_fields(section: dict, layers: int, count_name: str, model_type: object = None) -> tuple[_Field, ...]:
    """The fields of `section` that hold something per layer, with each layer's entry."""
    fields = []
    for key, value in section.items():
        if key in LAYER_COUNT_NAMES or key == count_name:
            continue
        if _is_run_lengths(value, layers):
            fields.append(_Field(key, "run-lengths", tuple(json.dumps(v) for v in _expanded(value))))
        elif _is_index_list(key, value, layers):
            members = set(value)
            fields.append(_Field(key, "indices", tuple(json.dumps(i in members) for i in range(layers))))
        elif (isinstance(value, (list, tuple)) and len(value) == layers and layers > 1
              and _sized_by_layers(key, model_type, layers)):
            fields.append(_Field(key, "list", tuple(json.dumps(v, sort_keys=True, default=str) for v in value)))
        elif (keys := _index_dict_keys(key, value, layers)) is not None:
            fields.append(_Field(key, "index-dict", tuple(
                json.dumps(value[keys[i]], sort_keys=True, default=str) if i in keys else "null"
                for i in range(layers))))
    return tuple(fields)


def _period(kinds: list) -> int:
    """The shortest p with kinds[i] == kinds[i % p] for every i (len(kinds) when none is shorter)."""
    for p in range(1, len(kinds) + 1):
        if all(kinds[i] == kinds[i % p] for i in range(len(kinds))):
            return p
    return len(kinds)


def _proportional(kinds: list) -> tuple[int, ...]:
    """One original layer per position: each kind's first layer, repeated in proportion to how many
    layers have that kind, in at most MAX_PATTERN positions (more only when there are more kinds)."""
    first: dict = {}
    counts: dict = {}
    for index, kind in enumerate(kinds):
        first.setdefault(kind, index)
        counts[kind] = counts.get(kind, 0) + 1
    slots = max(min(MAX_PATTERN, len(kinds)), len(first))
    exact = {kind: count * slots / len(kinds) for kind, count in counts.items()}
    given = {kind: max(1, int(share)) for kind, share in exact.items()}
    by_remainder = sorted(first, key=lambda kind: (-(exact[kind] - int(exact[kind])), first[kind]))
    for kind in by_remainder:
        if sum(given.values()) >= slots:
            break
        given[kind] += 1
    return tuple(first[kind] for kind in sorted(first, key=lambda kind: first[kind]) for _ in range(given[kind]))


def _model_type(config: dict, section: dict) -> object:
    return section.get("model_type") or config.get("model_type")


def layer_plan(config: dict, derived: dict[str, list] | None = None) -> LayerPlan | None:
    """How the layers of `config` (a config.json dict as its class writes it) repeat; None without a count.
    `derived`: per-layer lists the class computes without writing them (`class_view`), kinds too."""
    found = layer_section(config)
    if found is None:
        return None
    section, count_name = found
    layers = section[count_name]
    fields = per_layer_fields(section, layers, count_name, _model_type(config, section))
    lists = [f.values for f in fields] + [tuple(json.dumps(v, default=str) for v in value)
                                          for value in (derived or {}).values() if len(value) == layers]
    kinds = [tuple(values[i] for values in lists) for i in range(layers)]
    if not kinds:
        return LayerPlan(layers=layers, pattern=(0,), periodic=True)
    period = _period(kinds)
    if period <= MAX_PATTERN:
        return LayerPlan(layers=layers, pattern=tuple(range(period)), periodic=True)
    for lead in range(1, MAX_LEAD + 1):
        # A few leading layers of their own, then repeats (at least two seen): the lead is kept once at any depth.
        period = _period(kinds[lead:])
        if period <= MAX_PATTERN and len(kinds) - lead >= 2 * period:
            return LayerPlan(layers=layers, pattern=tuple(range(lead, lead + period)), periodic=True,
                             lead=tuple(range(lead)))
    return LayerPlan(layers=layers, pattern=_proportional(kinds), periodic=False)


def with_layers(config: dict, layers: int, plan: LayerPlan | None = None) -> dict:
    """`config` (as its class writes it: PretrainedConfig.to_dict) with `layers` decoder layers: the count
    under every spelling it uses, every per-layer field rebuilt by repeating the plan's pattern, and
    every count of layers of a kind scaled to the new count (at least 1 where it was, below `layers`)."""
    out = copy.deepcopy(config)
    found = layer_section(out)
    if found is None:
        # No count to change (BLT's four stacks each count their own in a sub-config; Nemotron-H's is a
        # property of its layers_block_type): the model is built whole at every depth. A count added here
        # would be read by nothing but DynamicCache(config=...), which would then hold fewer layers than run.
        return out
    section, count_name = found
    model_type = _model_type(config, section)
    kept_in = _count_kept_in(model_type, count_name) if isinstance(model_type, str) and model_type else None
    if kept_in is not None and isinstance(section.get(kept_in), int):
        # The count the class was given, in place of the one it derived from it: given the new count,
        # the class derives both again (HRM-Text: its stacks' layers, and their cache slots).
        section[count_name] = section.pop(kept_in)
        plan = None  # the plan counted the derived slots
    original = section[count_name]
    plan = plan or layer_plan(out)
    assert plan is not None  # layer_section found a count
    fields = per_layer_fields(section, original, count_name, _model_type(config, section))
    for name in LAYER_COUNT_NAMES:
        if isinstance(section.get(name), int) and section[name] == original:
            section[name] = layers
    if count_name == "decoder_layers" and isinstance(section.get("encoder_layers"), int):
        # The decoder of an encoder-decoder family run alone (BlenderbotForCausalLM): transformers sizes its
        # caches by num_hidden_layers, which these classes map to encoder_layers (attribute_map), so a cache
        # for fewer layers than the decoder has fails ("list index out of range"); no encoder is built.
        section["encoder_layers"] = layers
    sources = [plan.source_layer(i) for i in range(layers)]
    for f in fields:
        value = section[f.key]
        if f.form == "list":
            section[f.key] = type(value)(copy.deepcopy(value[s]) for s in sources)
        elif f.form == "indices":
            members = set(value)
            section[f.key] = [i for i, s in enumerate(sources) if s in members]
        elif f.form == "run-lengths":
            expanded = _expanded(value)
            section[f.key] = [[[expanded[s] for s in sources], 1]]
        elif f.form == "index-dict":
            keys = _index_dict_keys(f.key, value, original) or {}
            width = max(len(k) for k in keys.values())
            section[f.key] = {str(i).zfill(width): copy.deepcopy(value[keys[s]])
                              for i, s in enumerate(sources) if s in keys}
    derived = _class_derived(model_type, count_name, original) if isinstance(model_type, str) and model_type else {}
    for key, value in derived.items():
        if section.get(key) == value:
            # The class derives it from the layer count (and this config has the class's value): left out,
            # the class derives it again at the new count.
            del section[key]
    for key, value in list(section.items()):
        if key in derived:
            continue
        kind_count = (key.endswith("_layers") or key in LEADING_LAYER_COUNTS) and key not in LAYER_COUNT_NAMES
        if (kind_count and key not in NOT_A_KIND_COUNT and isinstance(value, int) and not isinstance(value, bool)
                and 0 < value < original):
            # A count of layers of one kind (gemma3n's last num_kv_shared_layers share their KV cache):
            # the same share of the new count, at least one layer of the kind, and one of the others.
            section[key] = min(max(1, round(value * layers / original)), max(layers - 1, 1))
    return out


def derived_per_layer(hf_config) -> dict[str, list]:
    """The per-layer lists a transformers config object computes from its pattern fields without writing
    them (properties: Jamba's layers_block_type from attn_layer_period and attn_layer_offset,
    RecurrentGemma's from block_types): read for the kinds of layers, never rewritten (the class derives
    them again at any count)."""
    section = hf_config
    if layer_section(hf_config.to_dict()) is not None and not any(
            isinstance(getattr(hf_config, n, None), int) for n in LAYER_COUNT_NAMES):
        section = hf_config.get_text_config()
    layers = next((getattr(section, n) for n in LAYER_COUNT_NAMES if isinstance(getattr(section, n, None), int)), None)
    out: dict[str, list] = {}
    for name in dir(type(section)):
        if not isinstance(getattr(type(section), name, None), property):
            continue
        try:
            value = getattr(section, name)
        except Exception:  # noqa: BLE001 - a property that refuses a global read (Gemma-4's per-layer sizes)
            continue
        if isinstance(value, (list, tuple)) and layers and len(value) == layers > 1:
            out[name] = list(value)
    return out


def class_view(config: dict) -> tuple[dict, LayerPlan | None]:
    """(`config` as its transformers class writes it, the plan of its layers read with what the class
    derives): the class's own reading, so a config.json that gives only a pattern field
    (sliding_window_pattern) has its per-layer list spelled out. UserError if transformers cannot build it."""
    from tutor.trace.memory_trace import _quiet, build_config

    with _quiet():
        hf_config = build_config(config, "eager")
        written = hf_config.to_dict()
        if layer_section(written) is None:
            # A class that derives its layer count from a per-layer list and does not write it (NemotronH's
            # num_hidden_layers is len(layers_block_type)): the count it derives is written, as it accepts it.
            text = hf_config.get_text_config()
            section = written.get("text_config") if text is not hf_config and isinstance(
                written.get("text_config"), dict) else written
            count = next(((n, v) for n in LAYER_COUNT_NAMES if isinstance(v := getattr(text, n, None), int)
                          and not isinstance(v, bool)), None)
            if count is not None:
                section[count[0]] = count[1]
        return written, layer_plan(written, derived_per_layer(hf_config))


def config_at_depth(config: dict, layers: int) -> dict:
    """`config` rebuilt with `layers` decoder layers and every per-layer field for that count (class_view,
    with_layers): what anything that changes a config's layer count should build."""
    written, plan = class_view(config)
    return with_layers(written, layers, plan)
