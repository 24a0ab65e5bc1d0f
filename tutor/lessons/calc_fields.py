"""The inputs a ```calc block may show, what each accepts, and how they become a FitRequest.

Field names follow `tensor-tutor fit`'s options (seq, not seq_len), so a learner who moves from a
lesson's calculator to the command line types the same words.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tutor.errors import UserError


def _whole(value: Any, name: str, minimum: int = 1, maximum: int = 2**40) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise UserError(f"{name} must be a whole number from {minimum} to {maximum}, got {value!r}")
    return value


def _text(value: Any, name: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise UserError(f"{name} must be text, got {value!r}")
    return value.strip()


def _check_model(value: Any) -> str:
    from tutor.model_files import load_preset

    load_preset(_text(value, "model"))
    return value.strip().lower()


def _check_count(value: Any, name: str) -> int:
    from tutor.theory.units import parse_count

    if isinstance(value, str):
        return parse_count(value)
    return _whole(value, name, maximum=10**16)


MEMORY_BARE_UNIT = "GB"
"""What a memory size typed without a unit means: device memory is quoted in GB (an "80 GB" H100),
so `80` is 80 GB, never 80 bytes."""

_BARE_NUMBER = re.compile(r"\s*(\d[\d,_]*(?:\.\d*)?|\.\d+)\s*")


def parse_memory_size(text: str) -> int:
    """Bytes of a memory size as typed: '80GB', '24GiB', '80 G', or a bare '80' (= 80 GB, MEMORY_BARE_UNIT)."""
    from tutor.theory.units import parse_bytes

    bare = _BARE_NUMBER.fullmatch(text)
    if bare:
        text = bare.group(1).replace(",", "").replace("_", "") + MEMORY_BARE_UNIT
    try:
        return parse_bytes(text)
    except UserError:
        raise UserError(f"memory must be a size such as 80GB, 24GiB or 80 (a bare number is GB), got {text!r}") \
            from None


def _check_bytes(value: Any) -> int:
    if isinstance(value, str):
        return parse_memory_size(value)
    return _whole(value, "memory", maximum=2**60)


def memory_text(n_bytes: int) -> str:
    """A byte count as a learner types it back: '80 GB', '24 GiB' (whole units), else its bytes with a B."""
    from tutor.theory.units import GB, GiB

    for size, unit in ((GiB, "GiB"), (GB, "GB")):
        if n_bytes >= size and n_bytes % size == 0:
            return f"{n_bytes // size:,} {unit}"
    return f"{n_bytes:,} B"


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
    return _whole(int(match.group(1).replace(",", "").replace("_", "")) * TOKEN_MULTIPLIERS[match.group(2).lower()],
                  name)


def _check_length(value: Any, name: str) -> int:
    if isinstance(value, str):
        return parse_length(value, name)
    return _whole(value, name)


def _check_choice(value: Any, name: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise UserError(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _check_dtype(value: Any) -> str:
    from tutor.theory.memory import weight_format

    weight_format(_text(value, "dtype"))
    return value


def _check_recipe(value: Any) -> str:
    from tutor.theory.fit import RECIPES
    from tutor.theory.memory import training_recipe

    if value not in RECIPES:
        training_recipe(_text(value, "recipe"))
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


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"{name} must be true or false, got {value!r}")
    return value


def _check_device(value: Any) -> str:
    from tutor.hardware.specs import lookup_gpu_spec

    text = _text(value, "device")
    if text == "this":
        return text
    found = lookup_gpu_spec(text)
    if found is None:
        raise UserError(unknown_device_message(text))
    return found[0].key


def unknown_device_message(text: str) -> str:
    """One line for a card name the spec table does not know: the closest known names, and where the rest are."""
    from tutor.hardware.specs import close_gpu_names

    close = close_gpu_names(text)
    nearest = f"did you mean {', '.join(close)}? " if close else ""
    return (f"unknown GPU {text!r}: {nearest}use 'this' (the detected device) or a card such as h100, h200, "
            "a100-40gb, rtx-4090 (tensor-tutor models --devices lists them all)")


def device_names() -> tuple[str, ...]:
    """Every card name the device field accepts (the same as `tensor-tutor fit --device`), aliases last."""
    from tutor.hardware.specs import gpu_names

    return gpu_names()


def _check_fraction(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise UserError(f"{name} must be a number in (0, 1], got {value!r}")
    return float(value)


def _fit_choice(attribute: str) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        from tutor.theory import activations, fit

        choices = {"mode": fit.MODES, "recompute": activations.RECOMPUTE_MODES,
                   "attention": activations.ATTENTION_KINDS, "impl": activations.IMPLEMENTATIONS}[attribute]
        return _check_choice(value, attribute, choices)

    return check


@dataclass(frozen=True)
class CalcField:
    """One calculator input: its name, a one-line description, and the check that normalises a value."""

    name: str
    help: str
    check: Callable[[Any], Any]
    fit_attribute: str | None = None
    """The FitRequest attribute it sets, if any."""


def _positive(name: str, help_text: str, fit_attribute: str | None = None) -> CalcField:
    return CalcField(name, help_text, lambda value: _whole(value, name), fit_attribute)


CALC_FIELDS: dict[str, CalcField] = {field.name: field for field in (
    CalcField("model", "a bundled preset (tensor-tutor models)", _check_model),
    CalcField("params", "a bare parameter count such as 70B (instead of a model)",
              lambda value: _check_count(value, "params")),
    CalcField("mode", "inference or train", _fit_choice("mode"), "mode"),
    CalcField("dtype", "weight storage format: fp32, bf16, int8, int4, nf4, ...", _check_dtype, "dtype"),
    CalcField("recipe", "training precision layout: mixed, fp32, bf16, lora, qlora, ...", _check_recipe, "recipe"),
    CalcField("optimizer", "adam, sgd, adam-8bit, adafactor, ...", _check_optimizer, "optimizer"),
    _positive("batch", "sequences per step per data-parallel rank", "batch"),
    CalcField("seq", "tokens per sequence: 4096, or 128k (binary k: 128k = 131,072, as model cards mean it)",
              lambda value: _check_length(value, "seq"), "seq_len"),
    _positive("dp", "data-parallel degree", "dp"),
    _positive("tp", "tensor-parallel degree", "tp"),
    _positive("pp", "pipeline-parallel stages", "pp"),
    _positive("ep", "expert-parallel degree (MoE)", "ep"),
    CalcField("zero", "ZeRO stage 0-3 (3 = FSDP full shard)", lambda value: _whole(value, "zero", 0, 3), "zero"),
    CalcField("sequence_parallel", "sequence parallelism with tp", lambda value: _check_bool(value, "sequence_parallel"),
              "sequence_parallel"),
    CalcField("recompute", "activation recomputation: none, selective, full", _fit_choice("recompute"), "recompute"),
    CalcField("attention", "eager, sdpa (transformers' default) or flash (FlashAttention-2)", _fit_choice("attention"),
              "attention"),
    CalcField("impl", "the code the activations assume: hf (transformers modules as written) or fused "
              "(Megatron-style kernels)", _fit_choice("impl"), "impl"),
    CalcField("kv_dtype", "KV-cache element type: bf16, fp8, int8, fp32", _check_kv_dtype, "kv_dtype"),
    _positive("microbatches", "pipeline micro-batches per step", "microbatches"),
    _positive("lora_rank", "LoRA rank r", "lora_rank"),
    CalcField("lora_targets", "all-linear or a list such as [\"q\", \"v\"]", _check_lora_targets, "lora_targets"),
    CalcField("gpu", "count a CUDA context (false for a CPU-only machine)", lambda value: _check_bool(value, "gpu"), "gpu"),
    CalcField("memory", "device memory to fit into, such as 80GB or 24GiB; a bare 80 is 80 GB", _check_bytes),
    CalcField("tokens", "training tokens, such as 15T", lambda value: _check_count(value, "tokens")),
    CalcField("device", "'this' (the detected device) or a card such as h100, a100-40gb, rtx-4090 "
              "(tensor-tutor models --devices)", _check_device),
    CalcField("mfu", "model FLOPs utilization assumed for a time estimate, in (0, 1]",
              lambda value: _check_fraction(value, "mfu")),
    CalcField("m", "matmul rows of A (4096 or 4k)", lambda value: _check_length(value, "m")),
    CalcField("n", "matmul columns of B (4096 or 4k)", lambda value: _check_length(value, "n")),
    CalcField("k", "the shared (reduction) dimension (4096 or 4k)", lambda value: _check_length(value, "k")),
)}

_FIT_FIELDS = ("model", "params", "mode", "dtype", "recipe", "optimizer", "batch", "seq", "dp", "tp", "pp", "ep",
               "zero", "sequence_parallel", "recompute", "attention", "impl", "kv_dtype", "microbatches", "lora_rank",
               "lora_targets", "gpu", "memory")

CALC_KINDS: dict[str, tuple[str, ...]] = {
    "memory": _FIT_FIELDS,
    "parallel": _FIT_FIELDS,
    "kv-cache": ("model", "batch", "seq", "kv_dtype", "dtype", "tp", "memory"),
    "flops": ("model", "params", "tokens", "batch", "seq", "mode", "dp", "device", "mfu"),
    "roofline": ("m", "n", "k", "dtype", "device", "model", "batch", "seq"),
}


def check_calc_value(kind: str, name: str, value: Any) -> Any:
    """The normalised value of calculator field `name`, or a UserError saying what it accepts."""
    if name not in CALC_KINDS.get(kind, ()):
        allowed = ", ".join(CALC_KINDS.get(kind, ()))
        raise UserError(f"a {kind} calculator has no field {name!r} (fields: {allowed})")
    return CALC_FIELDS[name].check(value)


def fit_request(values: dict[str, Any]):  # -> tutor.theory.fit.FitRequest (imported lazily)
    """The FitRequest that a memory/parallel/kv-cache calculator's values describe (unset fields: defaults)."""
    from tutor.theory.fit import FitRequest

    settings = {}
    for name, value in values.items():
        field = CALC_FIELDS.get(name)
        if field is None:
            raise UserError(f"unknown calculator field {name!r}")
        if field.fit_attribute is not None:
            settings[field.fit_attribute] = field.check(value)
    return FitRequest(**settings)
