"""The answers of the ```calc blocks and the Fit screen: memory (tutor.answers.fit), FLOPs and rooflines.

A calculator's fields (tutor.lessons.calc_fields: the fit fields, plus tokens, mfu, m, n, k) go in;
typed answers come out, every figure from tutor.theory or this machine's measured or datasheet
peaks. The calculator widget (tutor.ui.widgets.calc) only renders them. No Textual here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tutor.errors import UserError
from tutor.answers.fit import THIS_DEVICE, FitAnswer, FitInputs, answer_fit, chosen_budget
from tutor.answers.fields import FIELDS
from tutor.theory import fit as fitting

if TYPE_CHECKING:
    from tutor.hardware.machine import Machine
    from tutor.hardware.memory_budget import DeviceBudget

FIT_KINDS = ("memory", "kv-cache", "parallel", "fit")  # "fit": the Fit screen (adds bars and advice)
KINDS = FIT_KINDS + ("flops", "roofline")
REFERENCE_GPU_KEY = "h100-sxm"  # the lessons' reference GPU (tutor.lessons.values.reference_gpu)
NON_REQUEST = ("model", "params", "memory", "tokens", "device", "mfu", "m", "n", "k")
"""Calculator fields that are not FitRequest attributes."""
DEFAULT_MODEL = FIELDS["model"].starting_value


def _this(values: Mapping[str, Any]) -> bool:
    return not values.get("memory") and str(values.get("device") or THIS_DEVICE).strip() == THIS_DEVICE


def capacity_name(budget: DeviceBudget, this_machine: bool) -> str:
    """What the capacity is, in words: this machine's available RAM, a GPU's free memory, or the card named."""
    if not this_machine:
        return budget.name
    return "this machine's available RAM" if budget.kind == "cpu" else f"{budget.name} free memory"


def machine_capacity(machine: Machine) -> tuple[int | None, str, bool]:
    """(bytes, what they are, is a GPU): what `tensor-tutor fit` compares with on this machine."""
    from tutor.hardware.memory_budget import device_budget

    budget = device_budget(None, machine)
    return budget.capacity, capacity_name(budget, True), budget.gpu


def build_request(values: Mapping[str, Any], *, gpu: bool) -> fitting.FitRequest:
    """The FitRequest the fields describe, checked by the field declaration (tutor.answers.fields)."""
    from tutor.lessons.calc_fields import fit_request

    fields = {name: value for name, value in values.items() if name not in NON_REQUEST}
    fields.setdefault("gpu", gpu)
    return fit_request(fields)


@dataclass(frozen=True)
class CalcFit:
    """A memory / kv-cache / parallel calculator's answer, or the Fit screen's."""

    answer: FitAnswer
    capacity_name: str

    @property
    def kv_tokens(self) -> int:
        return self.answer.request.batch * self.answer.request.seq_len


def calc_fit(kind: str, values: Mapping[str, Any], machine: Machine | None) -> CalcFit:
    """The fit answer for a calculator's fields: kv-cache asks about inference; only the Fit screen searches
    the largest batch and sequence and the suggestions."""
    if kind == "kv-cache":
        values = {**values, "mode": fitting.Mode.INFERENCE}
    budget = chosen_budget(values, machine)
    answer = answer_fit(FitInputs.from_values({"model": DEFAULT_MODEL, **values}, machine, budget=budget,
                                              searches=kind == "fit"))
    return CalcFit(answer, capacity_name(budget, _this(values)))


# ---- FLOPs and rooflines ------------------------------------------------------------------------

def device_peaks(machine: Machine, device: str, dtype: str) -> tuple[float | None, float | None, str]:
    """(peak FLOP/s, memory bytes/s, name) of 'this' machine (the GPU torch calls cuda:0, else its CPU) or of a
    GPU from the datasheet table (a key such as h100-sxm)."""
    if device != THIS_DEVICE:
        from tutor.hardware.specs import lookup_gpu_spec

        found = lookup_gpu_spec(device)
        if found is None:
            from tutor.answers.fields import unknown_device_message

            raise UserError(unknown_device_message(device))
        spec = found[0]
        tflops = spec.peak_tflops(dtype)
        return (tflops * 1e12 if tflops else None), spec.bandwidth_gbps * 1e9, spec.name
    gpu = machine.gpu_for("cuda:0") if machine.gpus else None  # torch's cuda:0, not NVML's 0
    target = "cuda:0" if gpu is not None else "cpu"
    tflops = machine.peak_tflops(target, dtype)
    gbps = machine.peak_memory_gbps(target)
    name = gpu.name if gpu is not None else "this CPU"
    return (tflops * 1e12 if tflops else None), (gbps * 1e9 if gbps else None), name


def compared_devices(values: Mapping[str, Any]) -> tuple[str, ...]:
    """The chosen device, and the reference GPU beside it when the chosen one is this machine."""
    device = str(values.get("device", THIS_DEVICE))
    return (device, REFERENCE_GPU_KEY) if device == THIS_DEVICE else (device,)


@dataclass(frozen=True)
class DeviceTime:
    """How long the compute takes on `devices` x one device at `mfu` of its peak (None: no peak known)."""

    label: str
    seconds: float | None


@dataclass(frozen=True)
class FlopsAnswer:
    """Compute for `tokens`: factor x active parameters x tokens (6 to train, 2 to run), and the time it takes."""

    name: str
    factor: int
    active: int
    tokens: int
    total: int
    devices: int
    mfu: float
    dtype: str
    tokens_per_step: int | None
    times: tuple[DeviceTime, ...]

    @property
    def steps(self) -> float | None:
        return self.tokens / self.tokens_per_step if self.tokens_per_step else None


def flops_answer(values: Mapping[str, Any], machine: Machine) -> FlopsAnswer:
    """Compute for `tokens`: 6·N·D to train (Kaplan et al. 2020 §2.1), 2·N·D to run, N the active
    parameters; and how long that takes at `mfu` of the peak on `dp` devices."""
    from tutor.lessons.calc_fields import CALC_FIELDS, DEFAULTS
    from tutor.files.models import resolve_model
    from tutor.theory.flops import training_flops
    from tutor.theory.models import count_parameters

    if values.get("params"):
        active = CALC_FIELDS["params"].check(values["params"])
        name = f"{values['params']} parameters"
    else:
        arch, _ = resolve_model(str(values.get("model", DEFAULT_MODEL)))
        active, name = count_parameters(arch).active, str(arch.name or values.get("model"))
    tokens = CALC_FIELDS["tokens"].check(values.get("tokens", DEFAULTS["tokens"]))
    devices = CALC_FIELDS["dp"].check(values.get("dp", 1))
    mfu = CALC_FIELDS["mfu"].check(values.get("mfu", DEFAULTS["mfu"]))
    dtype = "bf16"
    if values.get("mode", fitting.Mode.TRAIN) == fitting.Mode.TRAIN:
        factor, total = 6, training_flops(params=active, tokens=tokens)
    else:
        factor, total = 2, 2 * active * tokens
    per_step = (int(values["batch"]) * int(values["seq"]) * devices
                if values.get("batch") and values.get("seq") else None)
    times = []
    for device in compared_devices(values):
        peak, _, label = device_peaks(machine, device, dtype)
        times.append(DeviceTime(label, None if peak is None else total / (peak * devices * mfu)))
    return FlopsAnswer(name, factor, active, tokens, total, devices, mfu, dtype, per_step, tuple(times))


@dataclass(frozen=True)
class DeviceRoofline:
    """One device's ridge point and what bounds the matmul there (None: peak or bandwidth unknown)."""

    label: str
    ridge: float | None = None
    attainable: float | None = None
    compute_bound: bool | None = None


@dataclass(frozen=True)
class DecodeBound:
    """Decoding reads every weight once per step: tokens/s <= batch x bandwidth / weight bytes (None: unknown)."""

    model: str
    weight_bytes: int
    dtype: str
    label: str
    batch: int
    tokens_per_second: float | None


@dataclass(frozen=True)
class RooflineAnswer:
    """Arithmetic intensity of one matmul against the devices' ridge points, and the decode bound of a model."""

    m: int
    n: int
    k: int
    dtype: str
    intensity: float
    devices: tuple[DeviceRoofline, ...]
    decode: tuple[DecodeBound, ...]


def roofline_answer(values: Mapping[str, Any], machine: Machine) -> RooflineAnswer:
    """Arithmetic intensity of one matmul against the ridge points of the devices compared
    (Williams et al. 2009); with a model, the decode bound tokens/s = bandwidth / bytes read."""
    from tutor.lessons.calc_fields import CALC_FIELDS, DEFAULTS
    from tutor.theory.formats import format_by_name
    from tutor.theory.roofline import attainable_flops, matmul_arithmetic_intensity, ridge_point

    m, n, k = (CALC_FIELDS[name].check(values.get(name, DEFAULTS[name])) for name in ("m", "n", "k"))
    dtype = str(values.get("dtype", "bf16"))
    element = format_by_name(dtype).storage_bits / 8
    intensity = float(matmul_arithmetic_intensity(m, n, k, element))
    peak_dtype = dtype if dtype in ("fp32", "tf32", "bf16", "fp16", "int8") else "fp8"
    devices = []
    for device in compared_devices(values):
        peak, bandwidth, label = device_peaks(machine, device, peak_dtype)
        if peak is None or bandwidth is None:
            devices.append(DeviceRoofline(label))
            continue
        ridge = ridge_point(peak, bandwidth)
        devices.append(DeviceRoofline(label, ridge, attainable_flops(intensity, peak, bandwidth), intensity >= ridge))
    decode = decode_bounds(values, machine, dtype) if values.get("model") else ()
    return RooflineAnswer(m, n, k, dtype, intensity, tuple(devices), decode)


def decode_bounds(values: Mapping[str, Any], machine: Machine, dtype: str) -> tuple[DecodeBound, ...]:
    """Decoding reads every weight once per step: tokens/s <= batch x bandwidth / weight bytes."""
    from tutor.files.models import resolve_model
    from tutor.theory.memory import weight_bytes
    from tutor.theory.models import count_parameters
    from tutor.theory.roofline import decode_tokens_per_second_bound

    arch, _ = resolve_model(str(values["model"]))
    weights = weight_bytes(count_parameters(arch).total, dtype)
    batch = int(values.get("batch", 1))
    bounds = []
    for device in compared_devices(values):
        _, bandwidth, label = device_peaks(machine, device, "bf16")
        rate = None if bandwidth is None else decode_tokens_per_second_bound(weight_bytes=weights, bandwidth=bandwidth,
                                                                            batch=batch)
        bounds.append(DecodeBound(str(arch.name or values["model"]), weights, dtype, label, batch, rate))
    return tuple(bounds)


# ---- the Fit screen's time and memory timeline ---------------------------------------------------

@dataclass(frozen=True)
class FitTime:
    """The Fit screen's second half: how long the step takes (`tensor-tutor time --json`'s report, from
    tutor.answers.time) or the one line why it cannot say, and the memory alive over the training step or the prefill
    (tutor.theory.fit_timeline, `fit --timeline`'s JSON) with its peak moment."""

    report: dict[str, Any] | None
    reason: str | None
    timeline: tuple[dict[str, Any], ...] = ()
    peak: dict[str, Any] | None = None

    @property
    def step_seconds(self) -> float | None:
        """Training: the step's seconds as `time --json` has them; None for inference or without a report."""
        step = (self.report or {}).get("step")
        return step["seconds"] if step else None


def time_device(values: Mapping[str, Any], machine: Machine | None) -> str | None:
    """The Fit form's device as `tensor-tutor time --device` reads it: `this` is this machine's GPU (torch's
    cuda:0) or CPU, as `time` without --device; a card, cpu or a GPU index as typed; None for a memory size,
    which has no ceilings."""
    if values.get("memory"):
        return None
    device = str(values.get("device") or THIS_DEVICE).strip()
    if device != THIS_DEVICE:
        from tutor.hardware.memory_budget import DeviceBudget, device_budget

        try:
            budget: DeviceBudget = device_budget(device, machine)
        except UserError:
            return device  # time says why in its own words
        return None if budget.kind == "given" else device
    return "cuda:0" if machine is not None and machine.gpus and machine.gpu_for("cuda:0") is not None else "cpu"


def fit_time(values: Mapping[str, Any], machine: Machine | None) -> FitTime:
    """The time and the memory timeline of the Fit form's question: the same request the memory answer
    uses (tutor.answers.fit), timed by the entry point `tensor-tutor time` uses (tutor.answers.time.time_report)
    on the form's device. UserError for a form the memory answer rejects too."""
    from tutor.theory.fit_timeline import step_timeline, timeline_peak
    from tutor.answers.time import time_report

    answer = answer_fit(FitInputs.from_values({"model": DEFAULT_MODEL, **values}, machine,
                                              budget=chosen_budget(values, machine), searches=False))
    arch, request = answer.arch, answer.request
    if arch is None:
        return FitTime(None, "time counts every operation of the step: it needs an architecture (a preset, "
                             "a config.json or a model folder), not a bare parameter count")
    moments = step_timeline(arch, request)
    timeline = tuple(moment.to_json() for moment in moments)
    peak = timeline_peak(moments).to_json()
    device = time_device(values, machine)
    if device is None:
        return FitTime(None, "time needs a device with known rates: a card (h100) or this machine, not a memory "
                             "size", timeline, peak)
    config = None
    if request.mode != "train":  # the eager engine counts the host's code of the model's own family
        from tutor.answers.fit import fit_model

        found = fit_model({"model": DEFAULT_MODEL, **values}["model"], None).found
        config = found.config if found is not None else None
    try:
        report = time_report(arch, request, device, name=answer.name, source=answer.source, config=config)
    except UserError as error:
        return FitTime(None, in_form_words(str(error)), timeline, peak)
    return FitTime(report, None, timeline, peak)


def in_form_words(message: str) -> str:
    """`time`'s one-line reason in the Fit form's words: its fields, not the command's flags."""
    return message.replace("or pass --device h100", "or set device to a card such as h100").replace(
        "use cpu, a GPU index, or", "set device to this, cpu, a GPU index, or")
