"""One fit answer for every front end: `answer_fit(FitInputs) -> FitAnswer`.

Does a model fit a device, and what would make it fit? The command line (`tensor-tutor fit`),
the app's calculators and Fit screen, the export of a fit, the lessons' goals and values and the
fit lab all ask through `answer_fit`, so they cannot disagree: it resolves the model (a preset,
a config.json, a model folder, or a bare parameter count), reads a folder's checkpoint headers,
chooses the device budget, builds the tutor.theory.fit request, estimates it, gives the verdict,
the largest batch and sequence that fit, the suggestions, the notes on fields that do not apply,
and (when asked) the traced step. `FitAnswer.to_json()` is `tensor-tutor fit --json`'s object.
Suggestions are phrased here as the flags that make them (`change_flags`), for the CLI and lessons.

No click, no Rich, no Textual: the front ends render.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tutor.errors import UserError
from tutor.answers.fields import BY_PARAMETER, FIELDS, FIT_FIELDS, flag_name, ignored_flag_notes, request_settings
from tutor.theory import fit as fitting

if TYPE_CHECKING:
    from tutor.files.adapters import PeftAdapter
    from tutor.trace.fit_step import TracedFit
    from tutor.hardware.machine import Machine
    from tutor.hardware.memory_budget import DeviceBudget
    from tutor.files.models import ModelConfig
    from tutor.theory.models import Architecture
    from tutor.theory.safetensors_header import SafetensorsSummary

PARAMS_SOURCE = "--params (bare count: model states only)"
THIS_DEVICE = "this"
"""A calculator's device field for this machine (`fit` without --device)."""


@dataclass(frozen=True)
class FitInputs:
    """What a fit question is asked with.

    `request` holds FitRequest attributes (seq_len, not seq), already typed; use `from_command`
    for a command's keywords or `from_values` for a calculator's or a lesson's fields, which the
    field declaration (tutor.answers.fields) checks. `budget` overrides `device` (a goal's card, a
    calculator's size); `given` names the fields the user set, so those that do not apply get a note.
    """

    model: str | None = None
    params: str | int | None = None
    device: str | None = None
    request: Mapping[str, Any] = field(default_factory=dict)
    budget: DeviceBudget | None = None
    machine: Machine | None = None
    given: tuple[str, ...] = ()
    searches: bool = True
    """Search the largest batch and sequence, and the suggestions (needs a known capacity and a model)."""
    trace: bool = False
    read_checkpoint: bool = True
    """Read a model folder's safetensors headers (inference without a dtype then counts the stored bytes)."""
    times: bool = False
    """Time each suggestion's step on the device's ceilings (`suggestion_times`): `fit` and the calculators ask."""

    @classmethod
    def from_command(cls, model: str | None, params: str | None, device: str | None, *,
                     given: tuple[str, ...] = (), trace: bool = False, **request: Any) -> FitInputs:
        """A command's keywords (fit_options' parameters): choices become their enum members, the
        LoRA targets a tuple; range checks are tutor.theory.fit's (validate_request)."""
        from tutor.theory.lora import parse_lora_targets

        typed = {}
        for name, value in request.items():
            fit_field = BY_PARAMETER.get(name)
            if fit_field is None or fit_field.attribute is None:
                raise TypeError(f"{name!r} is not a fit request field")
            if fit_field.enum is not None and value in {member.value for member in fit_field.enum}:
                value = fit_field.enum(value)
            typed[name] = value
        if isinstance(typed.get("lora_targets"), str):
            typed["lora_targets"] = parse_lora_targets(typed["lora_targets"])
        return cls(model=model, params=params, device=device, request=typed, given=given, trace=trace, times=True)

    @classmethod
    def from_values(cls, values: Mapping[str, Any], machine: Machine | None = None, *, budget: DeviceBudget | None
                    = None, searches: bool = True) -> FitInputs:
        """A calculator's or a lesson's fields by name (seq, device, memory, model or params), checked by the
        field declaration; other fields (tokens, mfu, m, n, k: other calculators') are left out."""
        request = request_settings({name: value for name, value in values.items()
                                    if name in FIELDS and FIELDS[name].attribute is not None})
        if budget is None:
            budget = chosen_budget(values, machine)
        params = values.get("params") or None
        model = None if params else str(values.get("model") or FIELDS["model"].starting_value)
        device = values.get("device")
        return cls(model=model, params=params, device=str(device) if device else None, request=request, budget=budget,
                   machine=machine, searches=searches, read_checkpoint=False, times=True)


@dataclass(frozen=True)
class FitAnswer:
    """The answer to one fit question: the estimate, the device, the verdict and the advice."""

    name: str
    source: str
    estimate: fitting.FitEstimate
    budget: DeviceBudget
    checkpoint: SafetensorsSummary | None = None
    largest_batch: int | None = None
    largest_seq_len: int | None = None
    suggestions: tuple[fitting.Suggestion, ...] = ()
    flag_notes: tuple[str, ...] = ()
    traced: TracedFit | None = None
    suggestion_times: tuple[SuggestionTime, ...] = ()
    """One per suggestion (same order) when FitInputs.times asked for them, else empty."""

    @property
    def request(self) -> fitting.FitRequest:
        return self.estimate.request

    @property
    def arch(self) -> Architecture | None:
        return self.estimate.arch

    @property
    def worst(self) -> fitting.DeviceMemory:
        """The most loaded device (the only one without pipeline stages)."""
        return self.estimate.worst

    @property
    def capacity(self) -> int | None:
        return self.budget.capacity

    @property
    def fits(self) -> bool | None:
        """Whether the most loaded device fits the budget; None when its memory is unknown."""
        return None if self.capacity is None else self.worst.total <= self.capacity

    @property
    def notes(self) -> tuple[str, ...]:
        """The estimate's notes, then the notes on flags that do not apply."""
        return tuple(self.estimate.notes) + self.flag_notes

    @property
    def nothing_fits(self) -> bool:
        """It does not fit and no change tried (alone or combined) makes it fit."""
        return self.fits is False and not self.suggestions

    def nothing_fits_text(self) -> str:
        """Why there is no suggestion, in words that hold (the search tries combined plans too)."""
        if self.arch is None:
            return ("no changes are searched for a bare parameter count (model states only): name a model "
                    "(a preset or a config.json) to get suggestions, or use a larger device")
        return (f"nothing tried here makes it fit, alone or combined ({fitting.plans_tried(self.request.mode)}): "
                "pick a smaller model, a shorter sequence or a larger device")

    def to_json(self) -> dict[str, Any]:
        """`tensor-tutor fit --json`'s object."""
        estimate, params = self.estimate, self.estimate.params
        report: dict[str, Any] = {
            "model": {
                "name": self.name,
                "source": self.source,
                "model_type": estimate.arch.model_type if estimate.arch else None,
                "profile": estimate.arch.profile if estimate.arch else None,
                "profile_note": (estimate.arch.profile_note or None) if estimate.arch else None,
                "params_total": estimate.total_params,
                "params_active": params.active if params else estimate.total_params,
                "params_trainable": estimate.trainable_params,
            },
            "mode": estimate.request.mode,
            "request": request_json(estimate.request),
            "per_device_bytes": _estimate_json(estimate),
            "peak": _peak_json(estimate.worst),
            "sum_of_components_bytes": estimate.worst.sum_of_components,
            "components": [{"name": c.name, "bytes": c.bytes, "formula": c.formula} for c in estimate.worst.components],
            "stages": [{"stage": s.stage, "layers": s.layers, "params": s.params, "total_bytes": s.total,
                        "bytes": {n: s.component(n) for n in fitting.COMPONENTS}, "peak": _peak_json(s)}
                       for s in estimate.stages],
            "device": self.budget.to_json() if self.budget.capacity is not None else None,
            "fits": self.fits,
            "largest_batch": self.largest_batch,
            "largest_seq_len": self.largest_seq_len,
            # True: the search stopped at its bound (fitting.BATCH_SEARCH_BOUND, SEQ_SEARCH_BOUND), so
            # the figure is "at least", not the largest that fits.
            "largest_batch_at_search_bound": self.largest_batch == fitting.BATCH_SEARCH_BOUND,
            "largest_seq_len_at_search_bound": self.largest_seq_len == fitting.SEQ_SEARCH_BOUND,
            "suggestions": [suggestion_json(s, t) for s, t in
                            zip(self.suggestions, self.suggestion_times or (None,) * len(self.suggestions))],
            "notes": list(self.notes),
            "checkpoint": checkpoint_json(self.checkpoint, estimate.total_params),
        }
        if self.traced is not None:
            from tutor.trace.fit_step import trace_json

            report["trace"] = trace_json(self.traced, estimate)
        calibration = self.arch.calibration if self.arch is not None else None
        if calibration is not None:
            from tutor.trace.arch_calibration import cache_file, config_hash

            config = json.loads(calibration.config_json)
            report["calibration"] = {"model_class": calibration.model_class, "key": config_hash(config),
                                     "cache_file": cache_file(config),
                                     "setups": [setup.key for setup in calibration.setups]}
        return report


@dataclass(frozen=True)
class FitModel:
    """The model a fit question is about: its architecture (None for a bare count), display name, source,
    the bare count, its config as read (with its quantization scheme), and the PEFT adapter on it."""

    arch: Architecture | None
    name: str
    source: str
    count: int | None = None
    found: ModelConfig | None = None
    adapter: PeftAdapter | None = None
    spec: str | None = None
    """The model as fit reads its files: MODEL, or the adapter's base."""


def fit_model(model: str | None, params: str | int | None) -> FitModel:
    """The MODEL / --params input resolved, its config read once: a preset, a config.json, a model folder,
    a PEFT adapter folder (its base model, tutor.files.adapters) or a bare parameter count."""
    from tutor.theory.units import parse_count

    if model and params:
        raise UserError("give either MODEL or --params, not both")
    if params:
        count = parse_count(params) if isinstance(params, str) else FIELDS["params"].check(params)
        return FitModel(None, f"{params} parameters", PARAMS_SOURCE, count)
    if not model:
        raise UserError("name a model: a preset (see `tensor-tutor models`), a config.json, a model folder, or --params 7B")
    from tutor.files.adapters import adapter_folder, read_adapter
    from tutor.trace.arch_calibration import architecture_of  # a hand profile, or the real model class
    from tutor.files.models import read_model_config

    folder = adapter_folder(model)
    adapter = read_adapter(folder) if folder is not None else None
    spec = adapter.base if adapter is not None else model
    found = read_model_config(spec)
    try:
        arch = architecture_of(found)
    except UserError as error:  # a field of a config.json: the line names the file
        raise found.refusal(error) from None
    name, source = arch.name or spec, str(found.source)
    if adapter is not None and folder is not None:
        from tutor.theory.models import shown

        name = f"{name} + LoRA adapter {folder.resolve().name}"
        source = (f"PEFT adapter {shown(folder)} on its base_model_name_or_path {adapter.base_named!r}: {source}")
    return FitModel(arch, name, source, None, found, adapter, spec)


def resolve_fit_model(model: str | None, params: str | int | None
                      ) -> tuple[Architecture | None, str, str, int | None]:
    """(Architecture or None, display name, source, bare count or None) for the MODEL / --params input."""
    found = fit_model(model, params)
    return found.arch, found.name, found.source, found.count


def chosen_budget(values: Mapping[str, Any], machine: Machine | None = None) -> DeviceBudget:
    """The DeviceBudget a calculator's fields name: `memory` (a size), `device` (as `tensor-tutor fit --device`
    reads it: a card from the spec table, a size, cpu), else this machine (tutor.hardware.memory_budget)."""
    from tutor.formatting import format_bytes
    from tutor.hardware.memory_budget import DeviceBudget, device_budget

    if values.get("memory"):
        capacity = FIELDS["memory"].check(values["memory"])
        return DeviceBudget(f"a {format_bytes(capacity, si_beside=True)} device", "given", capacity, "as given",
                            gpu=True)
    device = str(values.get("device") or THIS_DEVICE).strip()
    return device_budget(None if device == THIS_DEVICE else device, machine)


def model_request_settings(model: FitModel, inputs: FitInputs, budget: DeviceBudget
                     ) -> tuple[dict[str, Any], SafetensorsSummary | None, tuple[str, ...]]:
    """The FitRequest fields of a question about `model` on a device with `budget`: the inputs, then what the
    model's files say where the inputs do not (the config's quantization_config as the weight format, a
    checkpoint's stored bytes for inference, a PEFT adapter's rank and targets) and whether the device is a GPU.
    `fit` and `time` both ask here, so they count the same weights. Returns (settings, checkpoint, notes)."""
    from tutor.files.models import checkpoint_summary

    arch = model.arch
    settings = dict(inputs.request)
    mode = settings.get("mode", fitting.Mode.INFERENCE)
    checkpoint = (checkpoint_summary(model.spec, model.found.config if model.found is not None else None)
                  if arch is not None and inputs.read_checkpoint else None)
    scheme_notes: tuple[str, ...] = ()
    if settings.get("dtype") is None:
        settings.pop("dtype", None)  # bf16, the config's quantization, or (inference) the checkpoint as stored
        quantized = model.found.weights_scheme() if model.found is not None else None
        if quantized is not None:
            settings["dtype"] = quantized.weight_format
            scheme_notes = (f"weights as the config's quantization_config stores them: {quantized.scheme} "
                            f"(--dtype {quantized.weight_format}); --dtype overrides it",)
        if checkpoint is not None and mode == fitting.Mode.INFERENCE:
            settings["stored_weight_bytes"] = checkpoint.total_bytes
    if model.adapter is not None:
        assert arch is not None  # an adapter's base is always a model with an architecture
        settings, adapter_notes = _with_adapter(model.adapter, arch, settings, inputs.given)
        scheme_notes += adapter_notes
    settings.setdefault("gpu", budget.gpu)
    return settings, checkpoint, scheme_notes


def answer_fit(inputs: FitInputs) -> FitAnswer:
    """Does the model fit, and what would make it fit? (UserError for input that makes no sense.)"""
    from tutor.hardware.memory_budget import device_budget

    model = fit_model(inputs.model, inputs.params)
    arch, name, source, count = model.arch, model.name, model.source, model.count
    budget = inputs.budget or device_budget(inputs.device, inputs.machine)
    settings, checkpoint, scheme_notes = model_request_settings(model, inputs, budget)
    request = fitting.FitRequest(**settings)
    if arch is not None and arch.calibration is not None:  # no hand profile: traces calibrate this setup
        from tutor.trace.arch_calibration import calibrated_for

        arch = calibrated_for(arch, request)
    if arch is not None:
        estimate = fitting.estimate(arch, request)
    else:
        assert count is not None  # resolve_fit_model gives a count where it gives no architecture
        estimate = fitting.estimate_from_count(count, request)
    capacity = budget.capacity
    largest_batch = largest_seq_len = None
    found: tuple[fitting.Suggestion, ...] = ()
    if inputs.searches and arch is not None and capacity is not None:
        largest_batch = fitting.largest_batch(arch, request, capacity)
        largest_seq_len = fitting.largest_seq_len(arch, request, capacity)
        if estimate.worst.total > capacity:
            found = tuple(fitting.suggestions(arch, request, capacity))
    times: tuple[SuggestionTime, ...] = ()
    if inputs.times and found and arch is not None:
        if budget.kind == "given":  # a bare memory size: no device whose ceilings could time a step
            times = tuple(SuggestionTime(None, "", "not timed: a memory size has no matmul or bandwidth ceilings; "
                                                   "pass a card such as --device h100 to see each step's seconds")
                          for _ in found)
        else:
            times = suggestion_times(arch, found, None if inputs.device == THIS_DEVICE else inputs.device)
    traced = None
    if inputs.trace:
        from tutor.trace.fit_step import traced_fit

        traced = traced_fit(model.spec if arch is not None else None, request,
                            config=model.found.config if model.found is not None else None,
                            layers=arch.num_layers if arch is not None else None)
    # A bench run left out for a bad figure is said once, not per suggestion timed on the run before it.
    skipped: tuple[str, ...] = ()
    if any(time.ceiling_notes for time in times):
        from tutor.bench.notebook import SKIPPED  # the notebook was read already: no new import cost

        skipped = tuple(dict.fromkeys(note for time in times for note in time.ceiling_notes
                                      if note.startswith(SKIPPED + " ")))
    return FitAnswer(name=name, source=source, estimate=estimate, budget=budget, checkpoint=checkpoint,
                     largest_batch=largest_batch, largest_seq_len=largest_seq_len, suggestions=found,
                     flag_notes=scheme_notes + tuple(ignored_flag_notes(inputs.given, request.mode, request.recipe))
                     + skipped,
                     traced=traced, suggestion_times=times)


# ---- what each suggestion costs in time ----------------------------------------------------------

@dataclass(frozen=True)
class SuggestionTime:
    """A suggestion's step time on the device's ceilings, as `tensor-tutor time` counts it, or why there is none.

    kind: "training step" (forward, backward, optimizer and exposed communication: step_time.training_step_time)
    or "decode step" (one token for every sequence of the batch at the full context: step_time.decode_step);
    source: the device and where its ceilings come from (or the one line saying why it has none)."""

    seconds: float | None
    kind: str
    source: str
    tokens_per_second: float | None = None
    """Tokens the step trains (global batch x sequence) or decodes (one per sequence) per second: what compares
    suggestions whose global batches differ."""
    bound: str | None = None
    """A decode step's bound in eager code: "host" (the framework's code on the CPU), "memory" or "compute";
    None for a training step."""
    graphs_seconds: float | None = None
    """The same decode step captured in a CUDA graph (what serving engines run), where the device has one."""
    ceiling_notes: tuple[str, ...] = ()
    """What the ceilings say beside their figures: a notebook run left out for a bad figure, named."""

    def cost_text(self) -> str:
        """', 83.8 ms per decode step (11.9 tokens/s; eager, bound by the host; CUDA graphs: 9.12 ms)', or ''
        when the suggestion was not timed: the bound says why a smaller weight format is not faster in eager
        code and what an engine that removes the host would make of it."""
        from tutor.formatting import format_duration, format_rate

        if self.seconds is None:
            return ""
        said = [format_rate(self.tokens_per_second, "tokens/s")] if self.tokens_per_second else []
        if self.bound is not None:
            said.append(f"eager, bound by the {'host' if self.bound == 'host' else self.bound}")
        if self.graphs_seconds is not None:
            said.append(f"CUDA graphs: {format_duration(self.graphs_seconds)}")
        return f", {format_duration(self.seconds)} per {self.kind}" + (f" ({'; '.join(said)})" if said else "")


def suggestion_times(arch: Architecture, suggestions: tuple[fitting.Suggestion, ...],
                     device: str | None) -> tuple[SuggestionTime, ...]:
    """Each suggestion's changed request timed by the time model on `device`'s ceilings (None: this machine's
    latest bench run; a card by name: its datasheet x published fractions), the ceilings resolved once per dtype."""
    from tutor.bench.ceilings import compute_dtype, device_ceilings
    from tutor.theory.step_time import GRAPHS, decode_step, training_step_time

    resolved: dict[str, Any] = {}
    out = []
    for suggestion in suggestions:
        request = suggestion.request
        kind = "training step" if request.mode == fitting.Mode.TRAIN else "decode step"
        dtype = compute_dtype(request)
        try:
            if dtype not in resolved:
                try:
                    resolved[dtype] = device_ceilings(device, dtype)
                except UserError as error:
                    resolved[dtype] = error
            found = resolved[dtype]
            if isinstance(found, UserError):
                raise found
            ceilings, words = found
            if request.mode == fitting.Mode.TRAIN:
                step = training_step_time(arch, request, ceilings)
                seconds, rate = step.seconds, step.tokens_per_second
            else:
                point = decode_step(arch, request, ceilings, batch=request.batch, context=request.seq_len)
                graphs = next((e.seconds for e in point.engines if e.engine == GRAPHS), None)
                out.append(SuggestionTime(point.seconds, kind, f"tensor-tutor time's model on {words}; "
                                          f"matmul: {ceilings.gemm_source}", point.tokens_per_second,
                                          point.engines[0].bound, graphs, ceiling_notes=ceilings.notes))
                continue
            out.append(SuggestionTime(seconds, kind, f"tensor-tutor time's model on {words}; "
                                                     f"matmul: {ceilings.gemm_source}", rate,
                                      ceiling_notes=ceilings.notes))
        except UserError as error:
            out.append(SuggestionTime(None, kind, f"not timed: {error}"))
    return tuple(out)


def _with_adapter(adapter: PeftAdapter, arch: Architecture, settings: dict[str, Any], given: tuple[str, ...]
                  ) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A fit request for the base model with a LoRA adapter on it: training trains the adapter's own
    parameters (--recipe lora with its r and target modules, unless the flags say otherwise); inference
    loads its tensors beside the base weights. Returns the settings and the notes saying so."""
    from tutor.formatting import format_bytes, format_count
    from tutor.theory.lora import lora_trainable_params

    settings = dict(settings)
    notes = list(adapter.notes)
    if "lora_targets" in given:
        targets = tuple(settings["lora_targets"])
    else:
        targets, target_notes = adapter.roles()
        notes += target_notes
    rank = settings["lora_rank"] if "lora_rank" in given else adapter.rank
    training = settings.get("mode", fitting.Mode.INFERENCE) == fitting.Mode.TRAIN
    if training:
        if "recipe" not in given:
            settings["recipe"] = fitting.Recipe.LORA
        settings["lora_rank"], settings["lora_targets"] = rank, targets
    counted = lora_trainable_params(arch, rank=rank, targets=targets)
    what = f"LoRA adapter r={rank} on {','.join(targets)}: {format_count(counted)} parameters by the LoRA formula"
    if adapter.weights is not None:
        stored = adapter.weights
        what += (f"; {adapter.folder.name}/adapter_model.safetensors holds {format_count(stored.total_elements)} "
                 f"elements ({format_bytes(stored.total_bytes)})")
        if stored.total_elements != counted:
            what += " (rank_pattern, modules_to_save or another base than the one read would explain a difference)"
        if not training:
            settings["adapter_bytes"] = stored.total_bytes
    elif not training:
        what += "; its tensors are not in safetensors (adapter_model.bin?), so inference does not count them"
    notes.insert(0, what + (" (trained with --recipe lora)" if training and "recipe" not in given else ""))
    return settings, tuple(notes)


# ---- suggestions as flags ---------------------------------------------------------------------

NEGLIGIBLE_BUFFERS = 0.001
"""The share of the sum of components under which a table leaves the buffers row out: a RoPE model's inverse
frequencies (512 B for Llama-3.1-8B) would print as a row of 0.00 GiB. `--json` keeps every component."""


def table_components(memory: fitting.DeviceMemory) -> tuple[fitting.Component, ...]:
    """The components a table shows (the command line's and the Fit screen's): every one but buffers too small
    to show (NEGLIGIBLE_BUFFERS); a GPT-Neo's causal-mask tables are shown."""
    summed = memory.sum_of_components or 1
    return tuple(c for c in memory.components if c.name != "buffers" or c.bytes / summed >= NEGLIGIBLE_BUFFERS)


def change_flags(suggestion: fitting.Suggestion) -> str:
    """A suggestion as the flags that make it: '--recompute full --zero 3 --dp 8 (8 devices)'."""
    words = []
    for change in suggestion.changes:
        value = change.value
        if value is True:
            words.append(flag_name(change.field))  # an on/off flag: given means on
        else:
            shown = ",".join(value) if isinstance(value, tuple) else str(value)
            words.append(f"{flag_name(change.field)} {shown}")
    why = [suggestion.reason] if suggestion.reason else []
    if suggestion.changes_layout:
        why.append(f"{suggestion.devices:,} devices")
    return " ".join(words) + (f" ({'; '.join(why)})" if why else "")


# ---- JSON parts -------------------------------------------------------------------------------

def _estimate_json(estimate: fitting.FitEstimate) -> dict[str, int]:
    worst = estimate.worst
    per_device = {name: worst.component(name) for name in fitting.COMPONENTS}
    per_device["total"] = worst.total
    return per_device


def _peak_json(stage: fitting.DeviceMemory) -> dict[str, Any]:
    """The moment of the step when the most tensors are alive (without overhead), and what they are."""
    peak = stage.peak
    return {"bytes": peak.bytes, "phase": peak.phase, "per_category_bytes": dict(peak.per_category),
            "formula": peak.formula}


def request_json(request: fitting.FitRequest) -> dict[str, Any]:
    """The request as `fit --json` prints it: every declared field (tutor.answers.fields) in its order, the LoRA
    targets as a list, the pipeline micro-batches as counted (default pp), and the devices it spans."""
    data: dict[str, Any] = {}
    for fit_field in FIT_FIELDS:
        if fit_field.attribute is None or fit_field.attribute == "gpu":
            continue
        value = getattr(request, fit_field.attribute)
        data[fit_field.attribute] = list(value) if isinstance(value, tuple) else value
    # microbatches has always come last, before devices, in this object: scripts may read it in order.
    data["microbatches"] = data.pop("microbatches") or request.pp
    data["devices"] = request.devices
    return data


def checkpoint_json(checkpoint: SafetensorsSummary | None, params_total: int) -> dict[str, Any] | None:
    if checkpoint is None:
        return None
    return {"files": checkpoint.files, "tensors": checkpoint.tensors, "elements_by_dtype": checkpoint.elements_by_dtype,
            "total_elements": checkpoint.total_elements, "total_bytes": checkpoint.total_bytes,
            "elements_minus_params": checkpoint.total_elements - params_total,
            "format": checkpoint.checkpoint_format, "skipped_files": list(checkpoint.skipped)}


def suggestion_json(suggestion: fitting.Suggestion, time: SuggestionTime | None = None) -> dict[str, Any]:
    """One suggestion: `change` as flags (for people and old scripts), `changes` as FitRequest fields, and when
    timed its step's seconds (`step_seconds`, null when not timed), what step that is, the figure's source, and for
    a decode step its eager bound (`step_bound`: host, memory or compute) and its seconds in a CUDA graph
    (`graphs_step_seconds`, null where the device has none)."""
    changes = [{"field": c.field, "value": list(c.value) if isinstance(c.value, tuple) else c.value}
               for c in suggestion.changes]
    out: dict[str, Any] = {"change": change_flags(suggestion), "changes": changes, "reason": suggestion.reason or None,
                           "devices": suggestion.devices, "total_bytes": suggestion.total}
    if time is not None:
        out.update(step_seconds=time.seconds, step_kind=time.kind, step_source=time.source,
                   tokens_per_second=time.tokens_per_second, step_bound=time.bound,
                   graphs_step_seconds=time.graphs_seconds)
    return out
