"""The fit fields, declared once: every input of a fit question, and what each front end makes of it.

One `FitField` per input (a FitRequest attribute, the model, the parameter count, the device) holds
its name, type, default, choices, help, command-line flag, the mode or recipe it applies to, how a
calculator parses typed text, and the range a lab accepts. From this table come the click options
of `tensor-tutor fit` (and of any command that asks the same question: `fit_options`), the
calculator's defaults and parsing (tutor.lessons.calc_fields), the fit lab's parameters
(tutor.labs._params.fit_params, for tutor.labs.fit_probe) and the notes on flags that do not apply. Adding a fit option: a FitRequest
field in tutor.theory.fit and one FitField here.

No click at import: `fit_options` imports it when a command is built.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from tutor.errors import UserError
from tutor.theory import fit as fitting

# Which requests a field means something for (FitField.applies).
ANY = "any"
TRAIN = "train"          # training only (--mode train)
ADAPTER = "adapter"      # training with --recipe lora or qlora
INFERENCE = "inference"  # inference only

# Groups a command can take (fit_options): a `time` command asks for the same model, mode, recipe,
# layout and device as `fit`.
GROUPS = ("model", "mode", "recipe", "shape", "layout", "activations", "inference", "device")

# How a field's value is typed (FitField.kind), and so how a calculator reads typed text.
KINDS = ("text", "choice", "whole", "length", "flag", "count", "device", "size")


def _weight_formats() -> tuple[str, ...]:
    from tutor.theory.memory import WEIGHT_FORMATS

    return tuple(WEIGHT_FORMATS)


def _optimizers() -> tuple[str, ...]:
    from tutor.theory.memory import OPTIMIZERS

    return tuple(OPTIMIZERS)


def _kv_dtypes() -> tuple[str, ...]:
    from tutor.theory.kv_cache import KV_DTYPES

    return tuple(KV_DTYPES)


def check_whole(value: Any, name: str, minimum: int = 1, maximum: int = 2**40) -> int:
    """`value` when it is an int (not a bool) from `minimum` to `maximum`, else one UserError line."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise UserError(f"{name} must be a whole number from {minimum} to {maximum}, got {value!r}")
    return value


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{name} must be text, got {value!r}")
    return value.strip()


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"{name} must be true or false, got {value!r}")
    return value


def _check_model(value: Any) -> str:
    from tutor.files.models import load_preset

    load_preset(_text(value, "model"))
    return value.strip().lower()


def check_count(value: Any, name: str) -> int:
    """A count as typed ('15T', '1.5e12', tutor.theory.units.parse_count) or a whole number up to 10^16."""
    from tutor.theory.units import parse_count

    if isinstance(value, str):
        return parse_count(value)
    return check_whole(value, name, maximum=10**16)


TOKEN_MULTIPLIERS = {"": 1, "k": 2**10, "m": 2**20}
"""Context lengths are binary: a "128K context" is 131,072 tokens (Llama-3.1's model card and its
config.json, max_position_embeddings = 131072), an "8k" sequence 8,192."""

_LENGTH = re.compile(r"\s*(\d[\d,_]*)\s*([kKmM]?)\s*")


def parse_length(text: str, name: str = "seq") -> int:
    """Tokens (or a matrix dimension) as typed: '4096', '4,096', '8k' = 8,192, '128k' = 131,072 (binary k)."""
    match = _LENGTH.fullmatch(text)
    if not match:
        raise UserError(f"{name} must be a whole number such as 4096 or 128k (k = 1,024, so 128k = 131,072), "
                        f"got {text!r}")
    return check_whole(int(match.group(1).replace(",", "").replace("_", "")) * TOKEN_MULTIPLIERS[match.group(2).lower()],
                  name)


MEMORY_BARE_UNIT = "GB"
"""What a memory size typed without a unit means: device memory is quoted in GB (an "80 GB" H100),
so `80` is 80 GB, never 80 bytes."""


def parse_whole(text: str, name: str) -> int:
    """A whole number as a learner types it: '8', '1,024', '2*8', '4k' (tutor.theory.number_reader)."""
    from tutor.theory.number_reader import read_number

    try:
        value = read_number(text, "count").value
    except UserError:
        value = math.nan
    if not (math.isfinite(value) and value.is_integer()):
        raise UserError(f"{name} must be a whole number, got {text!r}")
    return int(value)


def parse_memory_size(text: str) -> int:
    """Bytes of a memory size as typed: '80GB', '24GiB', '80 G', '2*40GB', or a bare '80' (= 80 GB,
    MEMORY_BARE_UNIT), read by tutor.theory.number_reader in GB."""
    from tutor.theory.number_reader import read_number
    from tutor.theory.units import GB

    try:
        size = read_number(text, MEMORY_BARE_UNIT).value * GB
    except UserError:
        size = 0.0
    if not size >= 1 or size > 2**60:
        raise UserError(f"memory must be a size such as 80GB, 24GiB or 80 (a bare number is GB), got {text!r}")
    return int(round(size))


def _check_bytes(value: Any) -> int:
    if isinstance(value, str):
        return parse_memory_size(value)
    return check_whole(value, "memory", maximum=2**60)


def check_length(value: Any, name: str) -> int:
    """A length as typed ('4096', '128k': parse_length) or a whole number: the CLI, the Fit screen and the
    calculators read tokens and matrix sizes through this one check."""
    if isinstance(value, str):
        return parse_length(value, name)
    return check_whole(value, name)


def _check_choice(value: Any, name: str, choices: tuple[Any, ...]) -> Any:
    if value not in choices:
        raise UserError(f"{name} must be one of {', '.join(str(c) for c in choices)}, got {value!r}")
    return value


def _check_dtype(value: Any) -> str:
    from tutor.theory.memory import weight_format

    weight_format(_text(value, "dtype"))
    return value


def _check_recipe(value: Any) -> str:
    from tutor.theory.memory import training_recipe

    if value not in fitting.RECIPES:
        training_recipe(_text(value, "recipe"))  # an alias (amp, default) is accepted as typed
    return value


def _check_optimizer(value: Any) -> str:
    from tutor.theory.memory import optimizer

    optimizer(_text(value, "optimizer"))
    return value


def _check_kv_dtype(value: Any) -> str:
    from tutor.theory.kv_cache import kv_dtype_bytes

    kv_dtype_bytes(_text(value, "kv_dtype"))
    return value


def _check_lora_targets(value: Any) -> tuple[str, ...]:
    from tutor.theory.lora import parse_lora_targets

    if isinstance(value, (list, tuple)):
        value = ",".join(_text(item, "lora_targets entry") for item in value)
    return parse_lora_targets(_text(value, "lora_targets"))


def _check_device(value: Any) -> str:
    """A calculator's device: 'this' or a card of the spec table, by its key."""
    from tutor.hardware.specs import lookup_gpu_spec

    text = _text(value, "device")
    if text == "this":
        return text
    found = lookup_gpu_spec(text)
    if found is None:
        raise UserError(unknown_device_message(text))
    return found[0].key


def unknown_device_message(text: str) -> str:
    """tutor.hardware.specs.unknown_device_message, imported when needed (the spec table is not light)."""
    from tutor.hardware import specs

    return specs.unknown_device_message(text)


@dataclass(frozen=True)
class FitField:
    """One input of a fit question, as every front end sees it."""

    name: str
    """The calculator's and the lab's name (seq, as `fit --seq` spells it)."""
    kind: str
    """One of KINDS: how the value is typed and how a calculator reads typed text."""
    group: str
    """One of GROUPS: which commands take it (fit_options)."""
    default: Any
    """The command line's default."""
    help: str = ""
    """The command line's help text."""
    short_help: str = ""
    """The calculator's tooltip and the lab's description."""
    attribute: str | None = None
    """The FitRequest attribute it sets; None for the model, the parameter count, the device."""
    flag: str | None = None
    """The command-line option ('--seq'); None: the name with dashes. "" for no option (gpu: set from the device)."""
    choices: tuple[Any, ...] | Callable[[], tuple[Any, ...]] | None = None
    """The values offered (a callable for tables read lazily); None for typed fields."""
    enum: type[Enum] | None = None
    """The enumeration its values are members of (tutor.theory.fit), if any."""
    cli_choice: bool = False
    """The command line refuses values outside `choices` (click.Choice)."""
    applies: str = ANY
    """ANY, TRAIN, ADAPTER or INFERENCE: flags given where they do not apply are named in a note."""
    calc_default: Any = None
    """The calculator's starting value where it differs from `default` (None: the same)."""
    on_fit_screen: bool = True
    """Shown on the app's Fit screen."""
    lab_range: tuple[int, int] | None = None
    """(minimum, maximum) a lab accepts for a whole-number field."""
    check_value: Callable[[Any], Any] | None = None
    """Checks and normalises a value (a lesson's TOML value, a parsed calculator entry); UserError otherwise."""
    metavar: str | None = None
    show_default: bool = True

    @property
    def option(self) -> str:
        """The command-line option that sets it ('--seq', '--sp', '--lora-rank')."""
        return self.flag if self.flag is not None else "--" + self.name.replace("_", "-")

    @property
    def parameter(self) -> str:
        """The keyword the command receives it as: the FitRequest attribute, else the name (seq_len, model)."""
        return self.attribute or self.name

    def options(self) -> tuple[Any, ...] | None:
        """The values offered, or None for typed fields."""
        return self.choices() if callable(self.choices) else self.choices

    @property
    def starting_value(self) -> Any:
        """The calculator's value before a learner changes it."""
        return self.default if self.calc_default is None else self.calc_default

    def check(self, value: Any) -> Any:
        """The checked, normalised value (an enum member for an enumerated field), or a UserError."""
        if self.check_value is not None:
            value = self.check_value(value)
        elif self.kind == "whole":
            value = check_whole(value, self.name)
        elif self.kind == "length":
            value = check_length(value, self.name)
        elif self.kind == "flag":
            value = _check_bool(value, self.name)
        elif self.kind == "choice":
            value = _check_choice(value, self.name, self.options() or ())
        if self.enum is not None and value in {member.value for member in self.enum}:
            value = self.enum(value)
        return value

    def parse(self, text: str) -> Any:
        """A calculator entry's typed value from what the learner typed (not yet checked: see `check`)."""
        text = text.strip()
        if self.kind == "length":
            return parse_length(text, self.name)
        if self.kind == "size":
            return parse_memory_size(text)
        if self.kind == "whole" or (self.kind == "choice" and isinstance(self.default, int)):
            return parse_whole(text, self.name)
        if self.kind == "flag":
            if text.lower() not in ("yes", "no", "true", "false"):
                raise UserError(f"{self.name} must be yes or no, got {text!r}")
            return text.lower() in ("yes", "true")
        return text


_ATTENTION_HELP = ("eager: matmul + softmax as written (keeps s x s scores); sdpa: torch's scaled_dot_product_attention, "
                   "transformers' default (its backend follows the device); flash: FlashAttention-2 kernels.")
_IMPL_HELP = ("Whose code the activations assume. hf: transformers modules as written, the code most people train with; "
              "fused: Megatron-style fused kernels (Korthikanti et al. 2022).")
_DEVICE_HELP = ("A GPU index (0, cuda:0), 'cpu', a card you do not have (h100, h100-pcie, h200, a100, a100-40gb, "
                "rtx-4090, l4, mi300x, ...: the total its driver reports; `tensor-tutor models --devices` lists them), "
                "or a size such as 24GiB or 80GB.")

FIT_FIELDS: tuple[FitField, ...] = (
    FitField("model", "text", "model", None, short_help="a bundled preset (tensor-tutor models)",
             calc_default="llama-3.1-8b", check_value=_check_model),
    FitField("params", "count", "model", None, "A bare parameter count such as 7B (model states only).",
             "a bare parameter count such as 70B (instead of a model)", metavar="N",
             check_value=lambda value: check_count(value, "params"), on_fit_screen=False),
    FitField("mode", "choice", "mode", fitting.Mode.INFERENCE.value, short_help="inference or train", attribute="mode",
             choices=fitting.MODES, enum=fitting.Mode, cli_choice=True),
    FitField("dtype", "text", "recipe", None,
             "Weight storage: fp32, bf16, fp16, fp8, int8, int4, nf4, nf4-dq, mxfp4, nvfp4, q4_k, ... "
             "(default: bf16, or a model folder's checkpoint as stored)",
             "weight storage format: fp32, bf16, int8, int4, nf4, ...", attribute="dtype", choices=_weight_formats,
             calc_default="bf16", check_value=_check_dtype),
    FitField("recipe", "text", "recipe", fitting.Recipe.MIXED.value,
             "Training precision: mixed (16 B/param with Adam), megatron, hf-amp, bf16, fp32, lora, qlora.",
             "training precision layout: mixed, fp32, bf16, lora, qlora, ...", attribute="recipe",
             choices=fitting.RECIPES, enum=fitting.Recipe, applies=TRAIN, check_value=_check_recipe),
    FitField("optimizer", "text", "recipe", "adam", "adam, adamw, sgd, sgd-momentum, adam-8bit, adafactor, lion.",
             "adam, sgd, adam-8bit, adafactor, ...", attribute="optimizer", choices=_optimizers, applies=TRAIN,
             check_value=_check_optimizer),
    FitField("batch", "whole", "shape", 1, "Micro-batch per data-parallel rank (inference: sequences).",
             "sequences per step per data-parallel rank", attribute="batch", lab_range=(1, 1 << 20)),
    FitField("seq", "length", "shape", 4096, "Tokens per sequence.",
             "tokens per sequence: 4096, or 128k (binary k: 128k = 131,072, as model cards mean it)",
             attribute="seq_len", flag="--seq", lab_range=(1, 1 << 24)),
    FitField("dp", "whole", "layout", 1, "Data-parallel degree.", "data-parallel degree", attribute="dp"),
    FitField("tp", "whole", "layout", 1, "Tensor-parallel degree.", "tensor-parallel degree", attribute="tp"),
    FitField("pp", "whole", "layout", 1, "Pipeline-parallel stages.", "pipeline-parallel stages", attribute="pp"),
    FitField("ep", "whole", "layout", 1, "Expert-parallel degree (MoE).", "expert-parallel degree (MoE)",
             attribute="ep"),
    FitField("zero", "choice", "layout", int(fitting.ZeroStage.NONE), "ZeRO stage 0-3 (3 = FSDP full shard).",
             "ZeRO stage 0-3 (3 = FSDP full shard)", attribute="zero", choices=fitting.ZERO_STAGES,
             enum=fitting.ZeroStage, applies=TRAIN,
             check_value=lambda value: check_whole(value, "zero", 0, max(fitting.ZERO_STAGES))),
    FitField("sequence_parallel", "flag", "layout", False, "Sequence parallelism (with --tp).",
             "sequence parallelism with tp", attribute="sequence_parallel", flag="--sp", choices=(False, True)),
    FitField("recompute", "choice", "activations", fitting.Recompute.NONE.value,
             short_help="activation recomputation: none, selective, full", attribute="recompute",
             choices=tuple(m.value for m in fitting.Recompute), enum=fitting.Recompute, cli_choice=True,
             applies=TRAIN),
    FitField("attention", "choice", "activations", fitting.Attention.SDPA.value, _ATTENTION_HELP,
             "eager, sdpa (transformers' default) or flash (FlashAttention-2)", attribute="attention",
             choices=tuple(m.value for m in fitting.Attention), enum=fitting.Attention, cli_choice=True),
    FitField("impl", "choice", "activations", fitting.Impl.HF.value, _IMPL_HELP,
             "the code the activations assume: hf (transformers modules as written) or fused (Megatron-style kernels)",
             attribute="impl", choices=tuple(m.value for m in fitting.Impl), enum=fitting.Impl, cli_choice=True),
    FitField("kv_dtype", "text", "inference", None, "KV cache type: bf16, fp16, fp8, int8, fp32 (default: bf16).",
             "KV-cache element type: bf16, fp8, int8, fp32", attribute="kv_dtype", choices=_kv_dtypes,
             applies=INFERENCE, calc_default="bf16", check_value=_check_kv_dtype),
    FitField("microbatches", "whole", "layout", None, "Pipeline micro-batches per step (default: pp).",
             "pipeline micro-batches per step", attribute="microbatches", applies=TRAIN, on_fit_screen=False),
    FitField("lora_rank", "whole", "recipe", 16, short_help="LoRA rank r", attribute="lora_rank", applies=ADAPTER,
             on_fit_screen=False),
    FitField("lora_targets", "text", "recipe", "all-linear", "all-linear or a list such as q,v.",
             "all-linear or a list such as [\"q\", \"v\"]", attribute="lora_targets", applies=ADAPTER,
             on_fit_screen=False, check_value=_check_lora_targets),
    FitField("gpu", "flag", "device", None, short_help="count a CUDA context (false for a CPU-only machine)",
             attribute="gpu", flag="", on_fit_screen=False,
             check_value=lambda value: _check_bool(value, "gpu")),
    FitField("device", "device", "device", None, _DEVICE_HELP,
             "'this' (the detected device) or a card such as h100, a100-40gb, rtx-4090 (tensor-tutor models --devices)",
             calc_default="this", check_value=_check_device),
    FitField("memory", "size", "device", None, short_help="device memory to fit into, such as 80GB or 24GiB; a bare 80 "
             "is 80 GB", flag="", on_fit_screen=False, check_value=_check_bytes),
)
"""Every fit field, in the command line's order."""

FIELDS: dict[str, FitField] = {field.name: field for field in FIT_FIELDS}
BY_ATTRIBUTE: dict[str, FitField] = {field.attribute: field for field in FIT_FIELDS if field.attribute}
BY_PARAMETER: dict[str, FitField] = {field.parameter: field for field in FIT_FIELDS}

FIT_SCREEN_FIELDS: tuple[str, ...] = ("model", "mode", "device") + tuple(
    field.name for field in FIT_FIELDS if field.on_fit_screen and field.name not in ("model", "mode", "device"))
"""The Fit screen's form, in its order: what and how first, then the request's fields."""

CALC_DEFAULTS: dict[str, Any] = {field.name: field.starting_value for field in FIT_FIELDS
                                 if field.starting_value is not None}
"""A calculator's starting value of each fit field it shows (FitRequest's own defaults for the rest)."""


def flag_name(parameter: str) -> str:
    """The command-line option that sets `parameter` (a field's name, a FitRequest attribute or a click parameter)."""
    field = FIELDS.get(parameter) or BY_PARAMETER.get(parameter)
    if field is not None and field.option:
        return field.option
    return {"as_json": "--json"}.get(parameter, "--" + parameter.replace("_", "-"))


def fit_options(*groups: str, model_argument: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A decorator adding the fit fields of `groups` (all of GROUPS when none) to a click command, in the
    declared order: `MODEL` as an argument (model_argument) and one option per field. The command
    receives each as its `parameter` keyword (seq_len, sequence_parallel, model, params, device)."""
    unknown = set(groups) - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown fit option groups {sorted(unknown)}: use {', '.join(GROUPS)}")
    chosen = [field for field in FIT_FIELDS if (not groups or field.group in groups) and field.option]

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        import click

        for field in reversed(chosen):  # click lists options in the order their decorators run, innermost last
            if field.name == "model":
                if model_argument:
                    command = click.argument("model", required=False)(command)
                continue
            command = _click_option(field)(command)
        return command

    return decorate


def _length_type(name: str) -> Any:
    """A click type reading a length as the calculators and the Fit screen do (parse_length: '4096', '4,096',
    '128k'), so `--seq 128k` means what the seq field means everywhere."""
    import click

    class Length(click.ParamType):
        name = "length"

        def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
            if isinstance(value, int) and not isinstance(value, bool):
                return value
            try:
                return parse_length(str(value), name)
            except UserError as error:
                self.fail(str(error), param, ctx)

    return Length()


def _click_option(field: FitField) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    import click

    settings: dict[str, Any] = {}
    if field.help:
        settings["help"] = field.help
    if field.metavar:
        settings["metavar"] = field.metavar
    if field.kind == "flag":
        return click.option(field.option, field.parameter, is_flag=True, **settings)
    if field.cli_choice:
        settings["type"] = click.Choice(tuple(str(c) for c in field.options() or ()))
    elif field.kind == "length":
        settings["type"] = _length_type(field.name)
    elif field.kind == "whole" or (field.kind == "choice" and isinstance(field.default, int)):
        settings["type"] = int
    if field.default is not None:
        settings["default"] = field.default
        settings["show_default"] = field.show_default
    else:
        settings["default"] = None
    return click.option(field.option, field.parameter, **settings)


def ignored_flag_notes(given: Iterable[str], mode: str, recipe: str) -> list[str]:
    """Notes naming each flag given (fields' names or parameters, in the order given) that this mode
    (or recipe) ignores: `--kv-dtype: ignored here; these flags only apply to inference: ...`."""
    fields = [BY_PARAMETER.get(name) or FIELDS.get(name) for name in given]
    present = [field for field in fields if field is not None]
    groups: list[tuple[tuple[str, ...], str]]
    if mode == fitting.Mode.INFERENCE:
        groups = [((TRAIN, ADAPTER), "only apply to training (--mode train)")]
    else:
        groups = [((INFERENCE,), "only apply to inference: training keeps no KV cache")]
        if recipe not in fitting.ADAPTER_RECIPES:
            groups.append(((ADAPTER,), "only apply to --recipe lora or qlora"))
    notes = []
    for applies, why in groups:
        ignored = [field.option for field in present if field.applies in applies]
        if ignored:
            notes.append(f"{', '.join(ignored)}: ignored here; these flags {why}")
    return notes


def request_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """FitRequest keyword arguments from fit fields by name ({'seq': '8k'} -> {'seq_len': 8192}), each
    checked; fields that set no request attribute (model, params, device) are skipped; UserError for
    a name that is no fit field."""
    settings = {}
    for name, value in values.items():
        field = FIELDS.get(name) or BY_ATTRIBUTE.get(name)
        if field is None:
            raise UserError(f"unknown fit field {name!r}")
        if field.attribute is not None:
            settings[field.attribute] = field.check(value)
    return settings
