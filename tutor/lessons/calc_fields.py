"""The inputs a ```calc block may show, what each accepts, and how they become a FitRequest.

Field names follow `tensor-tutor fit`'s options (seq, not seq_len), so a learner who moves from a
lesson's calculator to the command line types the same words.
"""

from __future__ import annotations

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
    from tutor.theory.models import load_preset

    load_preset(_text(value, "model"))
    return value.strip().lower()


def _check_count(value: Any, name: str) -> int:
    from tutor.theory.units import parse_count

    if isinstance(value, str):
        return parse_count(value)
    return _whole(value, name, maximum=10**16)


def _check_bytes(value: Any) -> int:
    from tutor.theory.units import parse_bytes

    if isinstance(value, str):
        return parse_bytes(value)
    return _whole(value, "memory", maximum=2**60)


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
        raise UserError(f"device must be 'this' (the detected device) or a GPU such as h100-sxm or a100-40gb "
                        f"(tensor-tutor models --devices), got {value!r}")
    return found[0].key


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
    _positive("seq", "tokens per sequence", "seq_len"),
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
    CalcField("memory", "device memory to fit into, such as 80GB or 24GiB", _check_bytes),
    CalcField("tokens", "training tokens, such as 15T", lambda value: _check_count(value, "tokens")),
    CalcField("device", "'this' (the detected device) or a GPU key such as h100-sxm", _check_device),
    CalcField("mfu", "model FLOPs utilization assumed for a time estimate, in (0, 1]",
              lambda value: _check_fraction(value, "mfu")),
    _positive("m", "matmul rows of A"),
    _positive("n", "matmul columns of B"),
    _positive("k", "the shared (reduction) dimension"),
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
