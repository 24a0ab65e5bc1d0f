"""The calc block: memory, KV-cache, parallelism, FLOPs and roofline calculators, rendered.

Field names and checks are the fit fields' declaration (tutor.answers.fields, through the lesson
engine's tutor.lessons.calc_fields: the same words as `tensor-tutor fit`); the answers come from
tutor.calculators (the fit answer of tutor.answers.fit, FLOPs, rooflines), so a lesson, the CLI
and the Fit screen cannot disagree. This module only renders them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Grid
from textual.message import Message
from textual.suggester import SuggestFromList
from textual.widgets import Button, Input, Label, Select, Static

from tutor.calculators import (  # noqa: F401  (REFERENCE_GPU_KEY, KINDS: the calculators' names)
    FIT_KINDS,
    KINDS,
    REFERENCE_GPU_KEY,
    calc_fit,
    flops_answer,
    roofline_answer,
)
from tutor.errors import UserError
from tutor.answers.fit import FitAnswer, SuggestionTime, table_components
from tutor.answers.fields import FIELDS, FIT_SCREEN_FIELDS
from tutor.formatting import format_bytes, format_duration, format_number, format_percent, format_rate
from tutor.lessons.calc_fields import DEFAULTS
from tutor.theory import activations as acts
from tutor.theory import fit as fitting
from tutor.theory.units import GiB
from tutor.ui.widgets.block import LessonBlock
from tutor.ui.widgets.charts import bar_text, gauge_text

if TYPE_CHECKING:  # types only: the form needs no hardware module at import
    from tutor.hardware.machine import Machine
    from tutor.lessons.model import Calc

DEFAULT_FIELDS = {
    "memory": ("model", "mode", "dtype", "batch", "seq"),
    "kv-cache": ("model", "batch", "seq", "kv_dtype"),
    "parallel": ("model", "mode", "dp", "tp", "pp", "zero"),
    "flops": ("model", "tokens", "dp", "mfu"),
    "roofline": ("m", "n", "k", "dtype"),
    "fit": FIT_SCREEN_FIELDS,
}
LABELS = {"sequence_parallel": "sp", "kv_dtype": "kv dtype", "lora_rank": "lora rank", "lora_targets": "lora targets"}
"""Field labels where the field name is too long for the form's label column (sp: `fit --sp`)."""
# What the input shows while empty: the units a bare number is read in, and examples.
PLACEHOLDERS = {"memory": "80 = 80 GB, or 24GiB", "seq": "4096 or 128k (k = 1,024)", "m": "4096 or 4k",
                "n": "4096 or 4k", "k": "4096 or 4k", "tokens": "15T, 300B", "params": "7B, 350M",
                "device": "this, h100, a100-40gb, rtx-4090…", "batch": "sequences", "mfu": "0.4 or 40%"}
FIT_DEVICE_PLACEHOLDER = "this, h100, a100-40gb, 24GiB, cpu"
LENGTHS = ("m", "n", "k")  # typed as 4096 or 4k: binary k (tutor.lessons.calc_fields.parse_length)


def choices(name: str) -> tuple[Any, ...] | None:
    """The values a field offers in a drop-down (all of them: a learner sees what exists), or None for typed fields."""
    field = FIELDS.get(name)
    if field is None or name == "device":
        return None
    return field.options()


def preset_names() -> list[str]:
    from tutor.files.models import preset_names as names

    return names()


def coerce(name: str, text: str, kind: str = "memory") -> Any:
    """A field's typed value from what the learner typed; UserError naming the field otherwise."""
    from tutor.lessons.calc_fields import CALC_FIELDS

    text = text.strip()
    if name == "model":  # resolved with the rest of the fit (tutor.answers.fit): a preset, a path, a folder
        if not text:
            raise UserError("model: name a preset (tensor-tutor models), a config.json or a model folder")
        return text
    if name in LENGTHS:
        return CALC_FIELDS[name].check(text)
    if name == "device":
        if kind == "fit":  # the Fit screen's device is `fit --device`: a card, a size, cpu or a GPU index
            return text or "this"
        return CALC_FIELDS["device"].check(text)
    if name == "mfu":  # a share: 0.4, 40% and 40 are all 40 % (tutor.theory.number_reader)
        from tutor.theory.number_reader import read_number

        try:
            return read_number(text, "fraction").value
        except UserError:
            raise UserError(f"mfu must be a fraction such as 0.4 or 40%, got {text!r}") from None
    field = FIELDS.get(name)
    if field is None:
        return text
    value = field.parse(text)
    return field.check(value) if field.kind in ("length", "size") else value


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


def fit_renderable(kind: str, values: dict[str, Any], machine: Machine) -> Group:
    """The per-device memory of a model, component by component, against this machine (or `memory`)."""
    calc = calc_fit(kind, values, machine)
    answer = calc.answer
    request, worst, capacity = answer.request, answer.worst, answer.capacity
    lines: list[RenderableType] = [peak_table(worst) if request.mode == fitting.Mode.TRAIN else component_table(worst, kind)]
    if worst.component("activations") and kind != "kv-cache":
        lines.append(Text(f"activations assume impl {request.impl}: {acts.IMPLEMENTATION_MEANING[request.impl]}", style="italic"))
    if kind == "kv-cache":
        kv = worst.component("kv_cache")
        tokens = calc.kv_tokens
        lines.append(Text(f"KV cache: {format_bytes(kv)} for {tokens:,} tokens = {format_bytes(kv / tokens)} "
                          "per token"))
    if request.devices > 1:
        lines.append(Text(f"layout: dp {request.dp} x tp {request.tp} x pp {request.pp} = {request.devices} GPUs; "
                          "the figures are for the most loaded one"))
    if request.pp > 1:
        lines.append(bubble_text(request.pp, request.microbatches or request.pp))
    if capacity:
        fraction = worst.total / capacity
        lines.append(gauge_text(f"{calc.capacity_name} {format_bytes(capacity)}:", fraction, 70, suffix="used")
                     if fraction <= 1 else
                     Text(f"does not fit: {format_number(fraction)}x {calc.capacity_name} ({format_bytes(capacity)})",
                          style="bold red"))
    if kind == "fit":
        lines[1:1] = [component_bars(worst, capacity)]
        if capacity and answer.arch is not None:
            lines.extend(fit_advice(answer))
    return Group(*lines)


def bubble_text(stages: int, microbatches: int) -> Text:
    """The pipeline bubble of this layout (tutor.theory.parallel.pipeline_bubble_fraction: GPipe,
    Huang et al. arXiv 1811.06965 §2.3; 1F1B has the same bubble)."""
    from tutor.formatting import format_percent
    from tutor.theory.parallel import pipeline_bubble_fraction

    idle = pipeline_bubble_fraction(stages=stages, microbatches=microbatches)
    return Text.assemble(("pipeline bubble: ", "bold"),
                         f"(pp - 1) / (micro-batches + pp - 1) = ({stages} - 1) / ({microbatches} + {stages} - 1) = ",
                         (format_percent(float(idle)), "bold"),
                         " of each step a GPU waits (GPipe and 1F1B); more micro-batches shrink it")


def component_table(worst: fitting.DeviceMemory, kind: str) -> Table:
    """Each component with its bytes and formula; the total is what must fit (inference: all at once)."""
    table = Table(expand=True, box=None, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("per device", no_wrap=True)
    table.add_column("GiB", justify="right", no_wrap=True)
    table.add_column("formula", ratio=1)
    for component in table_components(worst):
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
    for component in table_components(worst):
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
    for component in table_components(worst):
        if component.bytes:
            text.append(f"{component.name:<12}", style="bold")
            text.append(bar_text(component.bytes / scale, 40), style="magenta")
            text.append(f" {component.bytes / GiB:,.2f} GiB\n")
    text.rstrip()
    return text


def fit_advice(answer: FitAnswer) -> list[Text]:
    """The largest batch and sequence that fit, or the changes that would make the model fit, said as
    the fields to change (tutor.theory.fit.suggestions, the same search as `tensor-tutor fit`)."""
    if answer.fits:
        return [Text(f"largest batch that fits: {answer.largest_batch:,}; largest seq: {answer.largest_seq_len:,} tokens",
                     style="green")]
    if not answer.suggestions:
        return [Text(answer.nothing_fits_text())]
    lines = [Text("would fit with one of these changes:", style="bold")]
    for index, suggestion in enumerate(answer.suggestions):
        lines.append(Text(f"  {change_in_fields(suggestion)}: {format_bytes(suggestion.total)} per GPU"
                          f"{suggestion_cost(answer, index)}"))
    return lines


def suggestion_cost(answer: Any, index: int) -> str:
    """', 1.2 s per training step': what the suggestion costs in time, where the fit answer timed it (its
    `suggestion_times`, one per suggestion: SuggestionTime.cost_text, the CLI's words); '' where it did not."""
    times = tuple(getattr(answer, "suggestion_times", ()) or ())
    if index < len(times) and isinstance(times[index], SuggestionTime):
        return times[index].cost_text()
    seconds = getattr(answer.suggestions[index], "step_seconds", None)
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return ""
    return f", {format_duration(seconds)} per step"


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


def duration(seconds: float) -> str:
    for unit, size in (("years", 365 * 86400), ("days", 86400), ("hours", 3600), ("minutes", 60)):
        if seconds >= size:
            return f"{seconds / size:,.1f} {unit}"
    return f"{seconds:,.2f} s"


def flops_renderable(values: dict[str, Any], machine: Machine) -> Group:
    """Compute for `tokens` and how long it takes (tutor.calculators.flops_answer)."""
    answer = flops_answer(values, machine)
    lines: list[RenderableType] = [Text(f"{answer.name}: {answer.factor} x {answer.active:,} active parameters x "
                                        f"{answer.tokens:,} tokens = {format_number(float(answer.total))} FLOPs",
                                        style="bold")]
    if answer.tokens_per_step:
        lines.append(Text(f"{answer.tokens_per_step:,} tokens per step (batch x seq x dp): {answer.steps:,.0f} steps"))
    for time in answer.times:
        if time.seconds is None:
            lines.append(Text(f"{time.label}: no {answer.dtype} peak known", style="dim"))
            continue
        lines.append(Text(f"{answer.devices:,} x {time.label} at {format_percent(answer.mfu)} of its {answer.dtype} "
                          f"peak: {duration(time.seconds)}"))
    return Group(*lines)


def roofline_renderable(values: dict[str, Any], machine: Machine) -> Group:
    """One matmul against the devices' ridge points, and a model's decode bound (tutor.calculators.roofline_answer)."""
    answer = roofline_answer(values, machine)
    lines: list[RenderableType] = [Text(f"[{answer.m} x {answer.k}] @ [{answer.k} x {answer.n}] in {answer.dtype}: "
                                        f"{answer.intensity:,.1f} FLOP per byte moved", style="bold")]
    for device in answer.devices:
        if device.ridge is None or device.attainable is None:
            lines.append(Text(f"{device.label}: peak or bandwidth unknown (measure them in Bench)", style="dim"))
            continue
        bound = "compute-bound" if device.compute_bound else "memory-bound"
        lines.append(Text(f"{device.label}: ridge {device.ridge:,.0f} FLOP/B -> {bound}, at most "
                          f"{device.attainable / 1e12:,.1f} TFLOP/s"))
    for decode in answer.decode:
        if decode.tokens_per_second is None:
            lines.append(Text(f"{decode.label}: memory bandwidth unknown, no decode bound", style="dim"))
            continue
        lines.append(Text(f"decode {decode.model} ({format_bytes(decode.weight_bytes)} of {decode.dtype} weights) "
                          f"on {decode.label}: at most {decode.tokens_per_second:,.0f} tokens/s at batch {decode.batch}"))
    return Group(*lines)


def calc_renderable(kind: str, values: dict[str, Any], machine: Machine) -> Group:
    """The calculator's output for `kind`; UserError for a field that makes no sense."""
    if kind in FIT_KINDS:
        return fit_renderable(kind, values, machine)
    if kind == "flops":
        return flops_renderable(values, machine)
    if kind == "roofline":
        return roofline_renderable(values, machine)
    raise UserError(f"unknown calculator {kind!r}: use one of {', '.join(KINDS)}")


class CalcBlock(LessonBlock["Calc"]):
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

    def __init__(self, block: Calc, **kwargs: Any) -> None:
        super().__init__(block, **kwargs)
        self.calc_kind: str = block.kind if block.kind in KINDS else "memory"
        self.fields = block.fields or DEFAULT_FIELDS.get(self.calc_kind, ())
        values = dict(block.values)
        if block.model:
            values.setdefault("model", block.model)
        self.values: dict[str, Any] = {**{name: DEFAULTS[name] for name in self.fields if name in DEFAULTS}, **values}
        self.border_title = f"Calculator: {self.calc_kind}"
        self.goal = block.goal
        self.goal_tries = 0
        if self.goal is not None:
            self.border_title = f"Exercise: {self.calc_kind} calculator"
            from tutor.lessons.learner import render_block

            try:
                self.block = render_block(block, device=self.services.machine)
            except ValueError as error:  # a broken {{ }} in the goal text: shown as written, with the reason
                self.goal_error: str | None = str(error)
            else:
                self.goal_error = None

    def compose(self) -> ComposeResult:
        if self.goal is not None:
            yield Static(Text(self.block.goal_text or "Meet the goal.", style="bold"), id="goal")
        from tutor.lessons.calc_fields import CALC_FIELDS

        with Grid():
            for name in self.fields:
                label = Label(LABELS.get(name, name.replace("_", " ")))
                label.tooltip = CALC_FIELDS[name].help if name in CALC_FIELDS else None
                yield label
                value = self.values.get(name, "")
                options = choices(name)
                if name == "model":
                    yield self._model_input(str(value))
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

    def _model_input(self, value: str) -> Input:
        """The model as `tensor-tutor fit MODEL` takes it: a preset (Right completes one), a
        config.json, a model folder or any name the command resolves (tutor.answers.fit)."""
        field = Input(value=value, placeholder="a preset, config.json or model folder", compact=True,
                      suggester=SuggestFromList(preset_names(), case_sensitive=False), id="field-model")
        field.tooltip = ("a preset (tensor-tutor models lists them; Right completes), a path to a config.json "
                         "or a model folder")
        return field

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
        hints = self.block.goal_hints
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
            self.post_message(self.Computed(self, dict(self.values), str(error)))
            return
        self.recompute()

    class Computed(Message):
        """The calculator shows a new answer for `values` (or, with `error`, the one line why it cannot)."""

        def __init__(self, block: CalcBlock, values: dict[str, Any], error: str | None = None) -> None:
            super().__init__()
            self.block = block
            self.values = values
            self.error = error

        @property
        def control(self) -> CalcBlock:
            """The calculator that computed (for `@on(CalcBlock.Computed, "#id")`)."""
            return self.block

    def recompute(self) -> None:
        """Compute and show the result, or the one-line reason it cannot be computed."""
        try:
            renderable = calc_renderable(self.calc_kind, self.values, self.services.machine)
        except ValueError as error:  # UserError from theory: say which field is wrong
            self._show_error(str(error))
            self.post_message(self.Computed(self, dict(self.values), str(error)))
            return
        output = self.query_one("#output", Static)
        output.set_classes("")
        output.update(renderable)
        self.post_message(self.Computed(self, dict(self.values)))

    def _show_error(self, text: str) -> None:
        output = self.query_one("#output", Static)
        output.set_classes("error")
        output.update(text)
