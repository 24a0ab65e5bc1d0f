"""The calc block: memory, KV-cache, parallelism, FLOPs and roofline calculators bound to tutor.theory.

Field names and checks are the lesson engine's (tutor.lessons.calc_fields, the same words as
`tensor-tutor fit`); every figure comes from tutor.theory (fit, flops, roofline), so a lesson,
the CLI and the Fit screen cannot disagree.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Grid
from textual.suggester import SuggestFromList
from textual.widgets import Button, Input, Label, Select, Static

from tutor.errors import UserError
from tutor.formatting import format_bytes, format_number, format_percent
from tutor.theory import activations as acts
from tutor.theory import fit as fitting
from tutor.theory.units import GiB
from tutor.ui.widgets.block import LessonBlock
from tutor.ui.widgets.charts import bar_text, gauge_text

if TYPE_CHECKING:  # types only: the form needs no hardware module at import
    from tutor.hardware.machine import Machine
    from tutor.hardware.memory_budget import DeviceBudget
    from tutor.theory.models import Architecture

FIT_KINDS = ("memory", "kv-cache", "parallel", "fit")  # "fit": the Fit screen (adds bars and advice)
KINDS = FIT_KINDS + ("flops", "roofline")
REFERENCE_GPU_KEY = "h100-sxm"  # the lessons' reference GPU (tutor.lessons.values.reference_gpu)
DEFAULT_FIELDS = {
    "memory": ("model", "mode", "dtype", "batch", "seq"),
    "kv-cache": ("model", "batch", "seq", "kv_dtype"),
    "parallel": ("model", "mode", "dp", "tp", "pp", "zero"),
    "flops": ("model", "tokens", "dp", "mfu"),
    "roofline": ("m", "n", "k", "dtype"),
    "fit": ("model", "mode", "device", "dtype", "recipe", "optimizer", "batch", "seq", "dp", "tp", "pp", "ep", "zero",
            "sequence_parallel", "recompute", "attention", "impl", "kv_dtype"),
}
# Starting values of fields a lesson leaves unset (FitRequest's own defaults for the rest).
DEFAULTS: dict[str, Any] = {"model": "llama-3.1-8b", "mode": "inference", "dtype": "bf16", "recipe": "mixed",
                            "optimizer": "adam", "batch": 1, "seq": 4096, "dp": 1, "tp": 1, "pp": 1, "ep": 1,
                            "zero": 0, "recompute": "none", "attention": "sdpa", "impl": "hf", "kv_dtype": "bf16",
                            "tokens": "15T", "mfu": 0.4, "device": "this", "m": 4096, "n": 4096, "k": 4096,
                            "lora_rank": 16, "lora_targets": "all-linear", "sequence_parallel": False}
WHOLE = ("batch", "dp", "tp", "pp", "ep", "zero", "microbatches", "lora_rank")
LENGTHS = ("seq", "m", "n", "k")  # typed as 4096 or 4k: binary k (tutor.lessons.calc_fields.parse_length)
FLAGS = ("sequence_parallel", "gpu")
NON_REQUEST = ("model", "params", "memory", "tokens", "device", "mfu", "m", "n", "k")
LABELS = {"sequence_parallel": "sp", "kv_dtype": "kv dtype", "lora_rank": "lora rank", "lora_targets": "lora targets"}
"""Field labels where the field name is too long for the form's label column (sp: `fit --sp`)."""
# What the input shows while empty: the units a bare number is read in, and examples.
PLACEHOLDERS = {"memory": "80 = 80 GB, or 24GiB", "seq": "4096 or 128k (k = 1,024)", "m": "4096 or 4k",
                "n": "4096 or 4k", "k": "4096 or 4k", "tokens": "15T, 300B", "params": "7B, 350M",
                "device": "this, h100, a100-40gb, rtx-4090…", "batch": "sequences", "mfu": "0.4 or 40%"}
FIT_DEVICE_PLACEHOLDER = "this, h100, a100-40gb, 24GiB, cpu"


def choices(name: str) -> tuple[Any, ...] | None:
    """The values a field offers in a drop-down (all of them: a learner sees what exists), or None for typed fields."""
    from tutor.theory.kv_cache import KV_DTYPES
    from tutor.theory.memory import OPTIMIZERS, WEIGHT_FORMATS

    return {"mode": fitting.MODES, "recompute": acts.RECOMPUTE_MODES, "attention": acts.ATTENTION_KINDS,
            "impl": acts.IMPLEMENTATIONS, "dtype": tuple(WEIGHT_FORMATS), "recipe": fitting.RECIPES,
            "optimizer": tuple(OPTIMIZERS), "kv_dtype": tuple(KV_DTYPES), "zero": (0, 1, 2, 3),
            "sequence_parallel": (False, True)}.get(name)


def preset_names() -> list[str]:
    from tutor.model_files import preset_names as names

    return names()


def coerce(name: str, text: str, kind: str = "memory") -> Any:
    """A field's typed value from what the learner typed; UserError naming the field otherwise."""
    from tutor.lessons.calc_fields import CALC_FIELDS

    text = text.strip()
    if name in LENGTHS or name == "memory":
        return CALC_FIELDS[name].check(text)
    if name == "device":
        if kind == "fit":  # the Fit screen's device is `fit --device`: a card, a size, cpu or a GPU index
            return text or "this"
        return CALC_FIELDS["device"].check(text)
    if name in WHOLE:
        try:
            return int(text.replace(",", "").replace("_", ""))
        except ValueError:
            raise UserError(f"{name} must be a whole number, got {text!r}") from None
    if name in FLAGS:
        if text.lower() not in ("yes", "no", "true", "false"):
            raise UserError(f"{name} must be yes or no, got {text!r}")
        return text.lower() in ("yes", "true")
    if name == "mfu":
        try:
            return float(text.rstrip("%")) / (100 if text.endswith("%") else 1)
        except ValueError:
            raise UserError(f"mfu must be a fraction such as 0.4, got {text!r}") from None
    return text


def shown(value: Any, name: str = "") -> str:
    """A typed value as the learner types it back (a memory size in GB or GiB, never a bare byte count)."""
    if name == "memory" and isinstance(value, int) and not isinstance(value, bool):
        from tutor.lessons.calc_fields import memory_text

        return memory_text(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    if isinstance(value, int) and value >= 10_000:
        return f"{value:,}"  # 131,072 reads at a glance; every whole-number field accepts the commas back
    return str(value)


def machine_capacity(machine: Machine) -> tuple[int | None, str, bool]:
    """(bytes, what they are, is a GPU): what `tensor-tutor fit` compares with on this machine."""
    from tutor.hardware.memory_budget import device_budget

    budget = device_budget(None, machine)
    name = "this machine's available RAM" if budget.kind == "cpu" else f"{budget.name} free memory"
    return budget.capacity, name, budget.gpu


def chosen_budget(values: dict[str, Any], machine: Machine) -> DeviceBudget:
    """The DeviceBudget the fields name: `memory` (a size), `device` (as `tensor-tutor fit --device` reads
    it: a card from the spec table, a size, cpu), else this machine (tutor.hardware.memory_budget)."""
    from tutor.hardware.memory_budget import DeviceBudget, device_budget
    from tutor.lessons.calc_fields import CALC_FIELDS

    if values.get("memory"):
        capacity = CALC_FIELDS["memory"].check(values["memory"])
        return DeviceBudget(f"a {format_bytes(capacity, si_beside=True)} device", "given", capacity, "as given",
                            gpu=True)
    device = str(values.get("device") or "this").strip()
    return device_budget(None if device == "this" else device, machine)


def chosen_capacity(values: dict[str, Any], machine: Machine) -> tuple[int | None, str, bool]:
    """(bytes, what they are, is a GPU) of the device the fields name (chosen_budget)."""
    if not values.get("memory") and str(values.get("device") or "this").strip() == "this":
        return machine_capacity(machine)
    budget = chosen_budget(values, machine)
    return budget.capacity, budget.name, budget.gpu


def build_request(values: dict[str, Any], *, gpu: bool) -> fitting.FitRequest:
    """The FitRequest the fields describe, checked by the lesson engine's field rules."""
    from tutor.lessons.calc_fields import fit_request

    fields = {name: value for name, value in values.items() if name not in NON_REQUEST}
    fields.setdefault("gpu", gpu)
    return fit_request(fields)


def fit_renderable(kind: str, values: dict[str, Any], machine: Machine) -> Group:
    """The per-device memory of a model, component by component, against this machine (or `memory`)."""
    from tutor.lessons.calc_fields import CALC_FIELDS
    from tutor.model_files import resolve_model

    capacity, capacity_name, gpu = chosen_capacity(values, machine)
    if kind == "kv-cache":
        values = {**values, "mode": "inference"}
    request = build_request(values, gpu=gpu)
    arch = None
    if values.get("params"):
        estimate = fitting.estimate_from_count(CALC_FIELDS["params"].check(values["params"]), request)
    else:
        arch, _ = resolve_model(str(values.get("model", DEFAULTS["model"])))
        estimate = fitting.estimate(arch, request)
    worst = estimate.worst
    lines: list[RenderableType] = [peak_table(worst) if request.mode == "train" else component_table(worst, kind)]
    if worst.component("activations") and kind != "kv-cache":
        lines.append(Text(f"activations assume impl {request.impl}: {acts.IMPLEMENTATION_MEANING[request.impl]}", style="italic"))
    if kind == "kv-cache":
        kv = worst.component("kv_cache")
        tokens = request.batch * request.seq_len
        lines.append(Text(f"KV cache: {format_bytes(kv)} for {tokens:,} tokens = {format_bytes(kv / tokens)} "
                          "per token"))
    if request.devices > 1:
        lines.append(Text(f"layout: dp {request.dp} x tp {request.tp} x pp {request.pp} = {request.devices} GPUs; "
                          "the figures are for the most loaded one"))
    if capacity:
        fraction = worst.total / capacity
        lines.append(gauge_text(f"{capacity_name} {format_bytes(capacity)}:", fraction, 70, suffix="used")
                     if fraction <= 1 else
                     Text(f"does not fit: {format_number(fraction)}x {capacity_name} ({format_bytes(capacity)})",
                          style="bold red"))
    if kind == "fit":
        lines[1:1] = [component_bars(worst, capacity)]
        if capacity and arch is not None:
            lines.extend(fit_advice(arch, request, capacity, worst.total <= capacity))
    return Group(*lines)


def component_table(worst: fitting.DeviceMemory, kind: str) -> Table:
    """Each component with its bytes and formula; the total is what must fit (inference: all at once)."""
    table = Table(expand=True, box=None, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("per device", no_wrap=True)
    table.add_column("GiB", justify="right", no_wrap=True)
    table.add_column("formula", ratio=1)
    for component in worst.components:
        if component.bytes or kind != "kv-cache":
            table.add_row(component.name, f"{component.bytes / GiB:,.2f}", Text(component.formula, style="dim"))
    table.add_row(Text("total", style="bold"), Text(f"{worst.total / GiB:,.2f}", style="bold"), "")
    return table


# A training step's peak may hold tensors no category keeps at its own maximum (the optimizer's).
PEAK_ONLY = {"optimizer_temporaries": "step temporaries"}


def peak_table(worst: fitting.DeviceMemory) -> Table:
    """Training: each category at its own maximum over the step beside what is alive at the peak
    moment (tutor.theory.fit.PeakMoment); the peak plus the overhead is what must fit."""
    peak = worst.peak
    table = Table(expand=True, box=None, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("per device", no_wrap=True)
    table.add_column("GiB", justify="right", no_wrap=True)
    table.add_column("at peak", justify="right", no_wrap=True)
    table.add_column("formula", ratio=1)
    for component in worst.components:
        at_peak = component.bytes if component.name == "overhead" else peak.per_category.get(component.name, 0)
        table.add_row(component.name, f"{component.bytes / GiB:,.2f}", f"{at_peak / GiB:,.2f}",
                      Text(component.formula, style="dim"))
    for name, label in PEAK_ONLY.items():
        if peak.per_category.get(name):
            table.add_row(label, "-", f"{peak.per_category[name] / GiB:,.2f}",
                          Text("allocated only inside this phase", style="dim"))
    table.add_row(Text("total", style="bold"), Text(f"{worst.sum_of_components / GiB:,.2f}", style="dim"),
                  Text(f"{worst.total / GiB:,.2f}", style="bold"),
                  Text(f"must fit: the peak, in {peak.phase} ({peak.formula}), + overhead", style="bold"))
    return table


def component_bars(worst: fitting.DeviceMemory, capacity: int | None) -> Text:
    """One bar per memory component, on the scale of the capacity (or of the total if larger)."""
    scale = max(worst.total, capacity or 0, 1)
    text = Text()
    for component in worst.components:
        if component.bytes:
            text.append(f"{component.name:<12}", style="bold")
            text.append(bar_text(component.bytes / scale, 40), style="magenta")
            text.append(f" {component.bytes / GiB:,.2f} GiB\n")
    text.rstrip()
    return text


def fit_advice(arch: Architecture, request: fitting.FitRequest, capacity: int, fits: bool) -> list[Text]:
    """The largest batch and sequence that fit, or the changes that would make the model fit, said as
    the fields to change (tutor.theory.fit.suggestions, the same search as `tensor-tutor fit`)."""
    if fits:
        batch = fitting.largest_batch(arch, request, capacity)
        seq = fitting.largest_seq_len(arch, request, capacity)
        return [Text(f"largest batch that fits: {batch:,}; largest seq: {seq:,} tokens", style="green")]
    found = fitting.suggestions(arch, request, capacity)
    if not found:
        return [Text("no single change makes it fit here: pick a smaller model or a larger device")]
    lines = [Text("would fit with one of these changes:", style="bold")]
    for suggestion in found:
        lines.append(Text(f"  {change_in_fields(suggestion)}: {format_bytes(suggestion.total)} per GPU"))
    return lines


def form_field_names() -> dict[str, str]:
    """FitRequest attribute -> the calculator field that sets it, in the form's order."""
    from tutor.lessons.calc_fields import CALC_FIELDS

    return {field.fit_attribute: name for name, field in CALC_FIELDS.items() if field.fit_attribute}


def change_in_fields(suggestion: fitting.Suggestion) -> str:
    """A suggested change in the form's own words: 'set dp to 8, tp to 8, zero to 3, sp to yes, recompute to
    full (64 GPUs)', the fields in the form's order."""
    names = form_field_names()
    order = {attribute: position for position, attribute in enumerate(names)}
    changes = sorted(suggestion.changes, key=lambda change: order.get(change.field, len(order)))
    words = []
    for change in changes:
        name = names.get(change.field, change.field)
        words.append(f"{LABELS.get(name, name)} to {shown(change.value)}")
    why = [suggestion.reason] if suggestion.reason else []
    if suggestion.changes_layout:
        why.append(f"{suggestion.devices:,} GPUs")
    return "set " + ", ".join(words) + (f" ({'; '.join(why)})" if why else "")


def device_peaks(machine: Machine, device: str, dtype: str) -> tuple[float | None, float | None, str]:
    """(peak FLOP/s, memory bytes/s, name) of 'this' machine (the GPU torch calls cuda:0, else its CPU) or of a
    GPU from the datasheet table (a key such as h100-sxm)."""
    if device != "this":
        from tutor.hardware.specs import lookup_gpu_spec

        found = lookup_gpu_spec(device)
        if found is None:
            from tutor.lessons.calc_fields import unknown_device_message

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


def compared_devices(values: dict[str, Any]) -> tuple[str, ...]:
    """The chosen device, and the reference GPU beside it when the chosen one is this machine."""
    device = str(values.get("device", "this"))
    return (device, REFERENCE_GPU_KEY) if device == "this" else (device,)


def duration(seconds: float) -> str:
    for unit, size in (("years", 365 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:,.2f} s"


def flops_renderable(values: dict[str, Any], machine: Machine) -> Group:
    """Compute for `tokens`: 6·N·D to train (Kaplan et al. 2020 §2.1), 2·N·D to run, N the active
    parameters; and how long that takes at `mfu` of the peak on `dp` devices."""
    from tutor.lessons.calc_fields import CALC_FIELDS
    from tutor.theory.flops import training_flops
    from tutor.model_files import resolve_model
    from tutor.theory.models import count_parameters

    if values.get("params"):
        active = CALC_FIELDS["params"].check(values["params"])
        name = f"{values['params']} parameters"
    else:
        arch, _ = resolve_model(str(values.get("model", DEFAULTS["model"])))
        active, name = count_parameters(arch).active, arch.name or values.get("model")
    tokens = CALC_FIELDS["tokens"].check(values.get("tokens", DEFAULTS["tokens"]))
    devices = CALC_FIELDS["dp"].check(values.get("dp", 1))
    mfu = CALC_FIELDS["mfu"].check(values.get("mfu", DEFAULTS["mfu"]))
    mode = values.get("mode", "train")
    dtype = "bf16"
    if mode == "train":
        total, formula = training_flops(params=active, tokens=tokens), "6"
    else:
        total, formula = 2 * active * tokens, "2"
    lines: list[RenderableType] = [Text(f"{name}: {formula} x {active:,} active parameters x {tokens:,} tokens "
                             f"= {format_number(float(total))} FLOPs", style="bold")]
    if values.get("batch") and values.get("seq"):
        per_step = int(values["batch"]) * int(values["seq"]) * devices
        lines.append(Text(f"{per_step:,} tokens per step (batch x seq x dp): {tokens / per_step:,.0f} steps"))
    for device in compared_devices(values):
        peak, _, label = device_peaks(machine, device, dtype)
        if peak is None:
            lines.append(Text(f"{label}: no {dtype} peak known", style="dim"))
            continue
        seconds = total / (peak * devices * mfu)
        lines.append(Text(f"{devices:,} x {label} at {format_percent(mfu)} of its {dtype} peak: {duration(seconds)}"))
    return Group(*lines)


def roofline_renderable(values: dict[str, Any], machine: Machine) -> Group:
    """Arithmetic intensity of one matmul against the ridge points of the devices compared
    (Williams et al. 2009); with a model, the decode bound tokens/s = bandwidth / bytes read."""
    from tutor.lessons.calc_fields import CALC_FIELDS
    from tutor.theory.formats import format_by_name
    from tutor.theory.roofline import attainable_flops, matmul_arithmetic_intensity, ridge_point

    m, n, k = (CALC_FIELDS[name].check(values.get(name, DEFAULTS[name])) for name in ("m", "n", "k"))
    dtype = str(values.get("dtype", "bf16"))
    element = format_by_name(dtype).storage_bits / 8
    intensity = float(matmul_arithmetic_intensity(m, n, k, element))
    lines: list[RenderableType] = [Text(f"[{m} x {k}] @ [{k} x {n}] in {dtype}: {intensity:,.1f} FLOP per byte moved",
                             style="bold")]
    peak_dtype = dtype if dtype in ("fp32", "tf32", "bf16", "fp16", "int8") else "fp8"
    for device in compared_devices(values):
        peak, bandwidth, label = device_peaks(machine, device, peak_dtype)
        if peak is None or bandwidth is None:
            lines.append(Text(f"{label}: peak or bandwidth unknown (measure them in Bench)", style="dim"))
            continue
        ridge = ridge_point(peak, bandwidth)
        bound = "compute-bound" if intensity >= ridge else "memory-bound"
        lines.append(Text(f"{label}: ridge {ridge:,.0f} FLOP/B -> {bound}, at most "
                          f"{attainable_flops(intensity, peak, bandwidth) / 1e12:,.1f} TFLOP/s"))
    if values.get("model") and "model" in values:
        lines.extend(decode_bound(values, machine, dtype))
    return Group(*lines)


def decode_bound(values: dict[str, Any], machine: Machine, dtype: str) -> list[Text]:
    """Decoding reads every weight once per step: tokens/s <= batch x bandwidth / weight bytes."""
    from tutor.theory.memory import weight_bytes
    from tutor.model_files import resolve_model
    from tutor.theory.models import count_parameters
    from tutor.theory.roofline import decode_tokens_per_second_bound

    arch, _ = resolve_model(str(values["model"]))
    weights = weight_bytes(count_parameters(arch).total, dtype)
    batch = int(values.get("batch", 1))
    lines = []
    for device in compared_devices(values):
        _, bandwidth, label = device_peaks(machine, device, "bf16")
        if bandwidth is None:
            lines.append(Text(f"{label}: memory bandwidth unknown, no decode bound", style="dim"))
            continue
        rate = decode_tokens_per_second_bound(weight_bytes=weights, bandwidth=bandwidth, batch=batch)
        lines.append(Text(f"decode {arch.name or values['model']} ({format_bytes(weights)} of {dtype} weights) "
                          f"on {label}: at most {rate:,.0f} tokens/s at batch {batch}"))
    return lines


def calc_renderable(kind: str, values: dict[str, Any], machine: Machine) -> Group:
    """The calculator's output for `kind`; UserError for a field that makes no sense."""
    if kind in FIT_KINDS:
        return fit_renderable(kind, values, machine)
    if kind == "flops":
        return flops_renderable(values, machine)
    if kind == "roofline":
        return roofline_renderable(values, machine)
    raise UserError(f"unknown calculator {kind!r}: use one of {', '.join(KINDS)}")


class CalcBlock(LessonBlock):
    """```calc: change any field and the figures follow, computed by tutor.theory."""

    TITLE = "Calculator"
    HELP = """\
## Calculator block

Every field can be changed: the result below follows as you type (Tab moves between fields).
The figures come from `tutor.theory`, the same code as `tensor-tutor fit`, and each memory
term shows the formula that produced it. The last line compares with this machine.

Training adds an *at peak* column: what is alive at the step's peak moment, which (plus the
overhead) is what must fit. *impl* switches the code the activations assume: `hf`
(transformers modules as written) or `fused` (Megatron-style kernels).
"""

    DEFAULT_CSS = """
    CalcBlock Grid { grid-size: 2; grid-columns: 12 1fr; grid-rows: 1; grid-gutter: 0 1; height: auto;
                     margin-bottom: 1; }
    """

    def __init__(self, block: Any, **kwargs: Any) -> None:
        super().__init__(block, **kwargs)
        self.calc_kind: str = self._calc_kind(block)
        self.fields = tuple(getattr(block, "fields", ()) or ()) or DEFAULT_FIELDS.get(self.calc_kind, ())
        values = dict(getattr(block, "values", {}) or {})
        if getattr(block, "model", None):
            values.setdefault("model", block.model)
        self.values: dict[str, Any] = {**{name: DEFAULTS[name] for name in self.fields if name in DEFAULTS}, **values}
        self.border_title = f"Calculator: {self.calc_kind}"
        self.goal = getattr(block, "goal", None)
        self.goal_tries = 0
        if self.goal is not None:
            self.border_title = f"Exercise: {self.calc_kind} calculator"
            from tutor.lessons.learner import render_block

            try:
                self.block = render_block(block, device=self.services.machine)
            except ValueError as error:  # a broken {{ }} in the goal text: shown as written, with the reason
                self.goal_error = str(error)
            else:
                self.goal_error = None

    @staticmethod
    def _calc_kind(block: Any) -> str:
        # Calc.kind names the calculator; every other block's kind is its directive.
        kind = getattr(block, "kind", None)
        return kind if kind in KINDS else str(dict(getattr(block, "values", {}) or {}).get("kind", "memory"))

    def compose(self) -> ComposeResult:
        if self.goal is not None:
            yield Static(Text(getattr(self.block, "goal_text", "") or "Meet the goal.", style="bold"), id="goal")
        from tutor.lessons.calc_fields import CALC_FIELDS

        with Grid():
            for name in self.fields:
                label = Label(LABELS.get(name, name.replace("_", " ")))
                label.tooltip = CALC_FIELDS[name].help if name in CALC_FIELDS else None
                yield label
                value = self.values.get(name, "")
                options = choices(name)
                if name == "model":
                    names = preset_names()
                    if value not in names:
                        names.insert(0, str(value))
                    yield Select([(n, n) for n in names], value=str(value), allow_blank=False, compact=True,
                                 id="field-model")
                elif options is not None:
                    listed = list(options)
                    if value not in listed and value != "":
                        listed.insert(0, value)  # a lesson's alias (adamw8bit) stays as the lesson wrote it
                    yield Select([(shown(option), option) for option in listed],
                                 value=listed[0] if value == "" else value, allow_blank=False, compact=True,
                                 id=f"field-{name}")
                else:
                    yield self._input(name, value)
        if self.goal is not None:
            yield Button("Check", id="check-goal", variant="primary")
            yield Static(id="goal-verdict", classes="status")
            yield Static(id="goal-hints", classes="status")
        yield Static(id="output")

    def _input(self, name: str, value: Any) -> Input:
        """A typed field, with what a bare number means as its placeholder, and the known card names
        completed as you type in a device field."""
        from tutor.lessons.calc_fields import CALC_FIELDS, device_names

        placeholder = FIT_DEVICE_PLACEHOLDER if (name, self.calc_kind) == ("device", "fit") else PLACEHOLDERS.get(name, "")
        suggester = SuggestFromList(("this", *device_names()), case_sensitive=False) if name == "device" else None
        field = Input(value=shown(value, name), placeholder=placeholder, compact=True, suggester=suggester,
                      id=f"field-{name}")
        field.tooltip = CALC_FIELDS[name].help if name in CALC_FIELDS else None
        return field

    @on(Button.Pressed, "#check-goal")
    def check_goal(self, event: Button.Pressed | None = None) -> None:
        """Check the learner's layout against the goal with tutor.theory; a hint on a wrong try."""
        if event is not None:
            event.stop()
        from tutor.lessons.goals import check_goal

        verdict = self.query_one("#goal-verdict", Static)
        try:
            result = check_goal(self.block, dict(self.values))
        except ValueError as error:  # UserError: the layout makes no sense (tp not dividing heads, ...)
            verdict.update(Text(f"✗ {error}", style="yellow"))
            return
        if result.met:
            verdict.update(Text.assemble(("✓ ", "bold green"), result.message))
            self.complete()
            return
        self.goal_tries += 1
        verdict.update(Text.assemble(("✗ not yet: ", "bold red"), result.message))
        hints = tuple(getattr(self.block, "goal_hints", ()))
        if hints:
            shown_hints = hints[: min(self.goal_tries, len(hints))]
            self.query_one("#goal-hints", Static).update(
                "\n".join(f"hint {i + 1}/{len(hints)}: {hint}" for i, hint in enumerate(shown_hints)))

    def on_mount(self) -> None:
        self.recompute()

    @on(Input.Changed)
    @on(Select.Changed)
    def _changed(self, event: Input.Changed | Select.Changed) -> None:
        event.stop()
        name = (event.control.id or "").removeprefix("field-")
        if name not in self.fields:
            return
        try:
            self.values[name] = (coerce(name, str(event.value), self.calc_kind) if isinstance(event, Input.Changed)
                                 else event.value)
        except UserError as error:
            self._show_error(str(error))
            return
        self.recompute()

    def recompute(self) -> None:
        """Compute and show the result, or the one-line reason it cannot be computed."""
        try:
            renderable = calc_renderable(self.calc_kind, self.values, self.services.machine)
        except ValueError as error:  # UserError from theory: say which field is wrong
            self._show_error(str(error))
            return
        output = self.query_one("#output", Static)
        output.set_classes("")
        output.update(renderable)

    def _show_error(self, text: str) -> None:
        output = self.query_one("#output", Static)
        output.set_classes("error")
        output.update(text)
