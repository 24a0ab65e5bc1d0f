"""`tensor-tutor fit MODEL`: does a model fit this machine's memory, and what would make it fit.

No torch, no textual: the answer comes from tutor.theory and the memory that NVML (GPU) or
psutil (CPU) reports as free right now.
"""

from __future__ import annotations

import json
import click

from tutor.commands.safe_text import markup_safe, plain
from tutor.errors import UserError
from tutor.fit_fields import fit_options, flag_name, ignored_flag_notes
from tutor.hardware.memory_budget import DeviceBudget, device_budget
from tutor.model_files import checkpoint_summary
from tutor.theory import fit as fitting
from tutor.theory.activations import IMPLEMENTATION_MEANING
from tutor.theory.lora import parse_lora_targets
from tutor.theory.units import GB, GiB, parse_count


def _size(value: int) -> str:
    return f"{value / GiB:,.2f}"


def _gb(value: int) -> str:
    return f"{value / GB:,.2f}"


def _estimate_json(estimate: fitting.FitEstimate) -> dict:
    worst = estimate.worst
    per_device = {name: worst.component(name) for name in fitting.COMPONENTS}
    per_device["total"] = worst.total
    return per_device


def _peak_json(stage: fitting.DeviceMemory) -> dict:
    """The moment of the step when the most tensors are alive (without overhead), and what they are."""
    peak = stage.peak
    return {"bytes": peak.bytes, "phase": peak.phase, "per_category_bytes": dict(peak.per_category),
            "formula": peak.formula}


def _request_json(request: fitting.FitRequest) -> dict:
    return {
        "mode": request.mode, "dtype": request.dtype, "recipe": request.recipe, "optimizer": request.optimizer,
        "batch": request.batch, "seq_len": request.seq_len, "dp": request.dp, "tp": request.tp, "pp": request.pp,
        "ep": request.ep, "zero": request.zero, "sequence_parallel": request.sequence_parallel,
        "recompute": request.recompute, "attention": request.attention, "impl": request.impl,
        "kv_dtype": request.kv_dtype, "lora_rank": request.lora_rank, "lora_targets": list(request.lora_targets),
        "microbatches": request.microbatches or request.pp, "devices": request.devices,
    }


def _resolve(model: str | None, params: str | None):
    """(Architecture or None, display name, source, bare count or None) for the MODEL / --params input."""
    if model and params:
        raise UserError("give either MODEL or --params, not both")
    if params:
        count = parse_count(params)
        return None, f"{params} parameters", "--params (bare count: model states only)", count
    if not model:
        raise UserError("name a model: a preset (see `tensor-tutor models`), a config.json, a model folder, or --params 7B")
    from tutor.model_files import resolve_model

    arch, source = resolve_model(model)
    return arch, arch.name or model, source, None


@click.command("fit")
@fit_options()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--trace", is_flag=True,
              help="Also build the real transformers model at full size on fake tensors and trace one step "
                   "(needs tensor-tutor[trace]).")
def fit(model, params, mode, dtype, recipe, optimizer, batch, seq_len, dp, tp, pp, ep, zero, sequence_parallel,
        recompute, attention, impl, kv_dtype, microbatches, lora_rank, lora_targets, device, as_json, trace) -> None:
    """Does MODEL fit this machine for inference or training, on how many devices, and what would make it fit?

    MODEL is a preset name (tensor-tutor models), a config.json, or a local model folder.
    """
    arch, name, source, count = _resolve(model, params)
    checkpoint = checkpoint_summary(model) if arch is not None else None  # a local folder's safetensors
    stored = checkpoint.total_bytes if checkpoint and mode == "inference" and dtype is None else None
    budget = device_budget(device)
    request = fitting.FitRequest(
        mode=mode, dtype=dtype or "bf16", stored_weight_bytes=stored, recipe=recipe, optimizer=optimizer, batch=batch, seq_len=seq_len, dp=dp, tp=tp,
        pp=pp, ep=ep, zero=zero, sequence_parallel=sequence_parallel, recompute=recompute, attention=attention,
        impl=impl, kv_dtype=kv_dtype, microbatches=microbatches, lora_rank=lora_rank,
        lora_targets=parse_lora_targets(lora_targets), gpu=budget.gpu)
    estimate = fitting.estimate(arch, request) if arch is not None else fitting.estimate_from_count(count, request)
    capacity = budget.capacity
    fits = None if capacity is None else estimate.worst.total <= capacity
    searches = {"largest_batch": None, "largest_seq_len": None, "suggestions": [],
                "flag_notes": _flags_that_do_not_apply(mode, recipe)}
    if arch is not None and capacity is not None:
        searches["largest_batch"] = fitting.largest_batch(arch, request, capacity)
        searches["largest_seq_len"] = fitting.largest_seq_len(arch, request, capacity)
        if not fits:
            searches["suggestions"] = fitting.suggestions(arch, request, capacity)
    traced = None
    if trace:
        from tutor.commands.fit_trace import traced_fit

        traced = traced_fit(model if arch is not None else None, request)
    if as_json:
        report = _report_json(estimate, name, source, budget, fits, searches)
        report["checkpoint"] = _checkpoint_json(checkpoint, estimate.total_params)
        if traced is not None:
            from tutor.commands.fit_trace import trace_json

            report["trace"] = trace_json(traced, estimate)
        click.echo(json.dumps(report, indent=2))
        return
    _render(estimate, name, source, budget, fits, searches)
    if checkpoint is not None:
        click.echo(plain(_checkpoint_line(checkpoint, estimate.total_params)))  # dtype names come from the file
    if traced is not None:
        from tutor.commands.fit_trace import render_trace

        render_trace(traced, estimate)


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


def _flags_that_do_not_apply(mode: str, recipe: str) -> list[str]:
    """Notes naming each flag the user typed that this mode (or recipe) ignores."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = [name for name in ctx.params if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE]
    return ignored_flag_notes(given, mode, recipe)


def _checkpoint_json(checkpoint, params_total: int) -> dict | None:
    if checkpoint is None:
        return None
    return {"files": checkpoint.files, "tensors": checkpoint.tensors, "elements_by_dtype": checkpoint.elements_by_dtype,
            "total_elements": checkpoint.total_elements, "total_bytes": checkpoint.total_bytes,
            "elements_minus_params": checkpoint.total_elements - params_total,
            "format": checkpoint.checkpoint_format, "skipped_files": list(checkpoint.skipped)}


def _checkpoint_line(checkpoint, params_total: int) -> str:
    dtypes = ", ".join(f"{n:,} {d}" for d, n in checkpoint.elements_by_dtype.items())
    extra = checkpoint.total_elements - params_total
    line = (f"checkpoint: {checkpoint.files} safetensors file(s) ({checkpoint.format_note}), {checkpoint.tensors} "
            f"tensors ({dtypes}), {checkpoint.total_bytes / GiB:.2f} GiB stored")
    if extra > 0:
        line += (f"; {extra:+,} elements against the counted parameters (buffers such as rotary inv_freq, "
                 "quantization scales, or tensors of other parts)")
    elif extra < 0:
        line += (f"; {extra:+,} elements against the counted parameters (packed quantized tensors, or a "
                 "checkpoint of another configuration than this config.json)")
    return line


def _suggestion_json(suggestion: fitting.Suggestion) -> dict:
    """One suggestion: `change` as flags (for people and old scripts), `changes` as FitRequest fields."""
    return {"change": change_flags(suggestion),
            "changes": [{"field": c.field, "value": list(c.value) if isinstance(c.value, tuple) else c.value}
                        for c in suggestion.changes],
            "reason": suggestion.reason or None, "devices": suggestion.devices, "total_bytes": suggestion.total}


def _report_json(estimate: fitting.FitEstimate, name: str, source: str, budget: DeviceBudget, fits, searches) -> dict:
    params = estimate.params
    return {
        "model": {
            "name": name,
            "source": source,
            "model_type": estimate.arch.model_type if estimate.arch else None,
            "params_total": estimate.total_params,
            "params_active": params.active if params else estimate.total_params,
            "params_trainable": estimate.trainable_params,
        },
        "mode": estimate.request.mode,
        "request": _request_json(estimate.request),
        "per_device_bytes": _estimate_json(estimate),
        "peak": _peak_json(estimate.worst),
        "sum_of_components_bytes": estimate.worst.sum_of_components,
        "components": [{"name": c.name, "bytes": c.bytes, "formula": c.formula} for c in estimate.worst.components],
        "stages": [{"stage": s.stage, "layers": s.layers, "params": s.params, "total_bytes": s.total,
                    "bytes": {n: s.component(n) for n in fitting.COMPONENTS}, "peak": _peak_json(s)}
                   for s in estimate.stages],
        "device": budget.to_json() if budget.capacity is not None else None,
        "fits": fits,
        "largest_batch": searches["largest_batch"],
        "largest_seq_len": searches["largest_seq_len"],
        # True: the search stopped at its bound (fitting.BATCH_SEARCH_BOUND, SEQ_SEARCH_BOUND), so
        # the figure is "at least", not the largest that fits.
        "largest_batch_at_search_bound": searches["largest_batch"] == fitting.BATCH_SEARCH_BOUND,
        "largest_seq_len_at_search_bound": searches["largest_seq_len"] == fitting.SEQ_SEARCH_BOUND,
        "suggestions": [_suggestion_json(s) for s in searches["suggestions"]],
        "notes": list(estimate.notes) + searches["flag_notes"],
    }


def _other_impl(impl: str) -> str:
    return next(other for other in fitting.IMPLEMENTATIONS if other != impl)


def _phase_words(phase: str) -> str:
    return {"forward": "the forward pass", "backward": "the backward pass", "optimizer": "the optimizer step"}.get(
        phase, phase)


def _peak_line(stage: fitting.DeviceMemory, mode: str) -> str:
    """When the step peaks, what is alive then, and why the sum of categories is larger."""
    peak = stage.peak
    alive = sorted(((name, n) for name, n in peak.per_category.items() if n), key=lambda item: -item[1])
    shares = ", ".join(f"{name.replace('_', ' ')} {n / (peak.bytes or 1):.0%}" for name, n in alive)
    line = f"peak: {_size(peak.bytes)} GiB alive during {_phase_words(peak.phase)} ({shares})"
    over = stage.sum_of_components - stage.component("overhead") - peak.bytes
    if over > 0:
        why = ("gradients and activations do not peak together: backward frees activations as gradients appear"
               if mode == "train" else "the categories do not peak at the same moment")
        line += f"; the sum of categories counts {_size(over)} GiB more: {why}"
    from rich.markup import escape

    return line + f". [dim]{escape(peak.formula)}[/dim]"


def _render(estimate: fitting.FitEstimate, name: str, source: str, budget: DeviceBudget, fits, searches) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from tutor.formatting import format_count

    console = Console()
    request = estimate.request
    params_line = f"{format_count(estimate.total_params)} parameters ({estimate.total_params:,})"
    if estimate.params and estimate.params.active != estimate.params.total:
        params_line += f", {format_count(estimate.params.active)} active per token"
    if request.mode == "train" and request.adapter:
        params_line += f", {estimate.trainable_params:,} trainable ({request.recipe})"
    console.print(f"[bold]{markup_safe(name)}[/bold]  {params_line}\n[dim]{markup_safe(source)}[/dim]")
    layout = f"dp {request.dp} x tp {request.tp} x pp {request.pp}" + (f", ep {request.ep}" if request.ep > 1 else "")
    what = (f"inference, {request.dtype} weights, batch {request.batch} x {request.seq_len:,} tokens"
            if request.mode == "inference" else
            f"training ({request.recipe} + {request.optimizer}), micro-batch {request.batch} x {request.seq_len:,} "
            f"tokens, ZeRO-{request.zero}, recompute {request.recompute}")
    console.print(f"{what}; {layout} = {request.devices} device(s)")
    if estimate.arch is not None:
        console.print(f"activations assume [bold]{request.impl}[/bold] ({IMPLEMENTATION_MEANING[request.impl]}), "
                      f"{request.attention} attention; --impl {_other_impl(request.impl)} shows the other")
    console.print()
    shown = estimate.stages if len(estimate.stages) <= 4 else (estimate.stages[0], estimate.worst, estimate.stages[-1])
    for stage in {id(stage): stage for stage in shown}.values():  # a stage holds a dict: not hashable
        title = "Memory per device" if len(estimate.stages) == 1 else (
            f"Pipeline stage {stage.stage} ({stage.layers} layers)" + (" - the most loaded" if stage is estimate.worst else ""))
        table = Table(title=title, title_justify="left")
        table.add_column("component")
        table.add_column("GiB", justify="right")
        table.add_column("GB", justify="right")
        table.add_column("share", justify="right")
        table.add_column("formula", overflow="fold")
        summed = stage.sum_of_components or 1
        for component in stage.components:
            table.add_row(component.name.replace("_", " "), _size(component.bytes), _gb(component.bytes),
                          f"{component.bytes / summed:.0%}", Text(component.formula, style="dim"))
        table.add_section()
        table.add_row("sum of categories", _size(stage.sum_of_components), _gb(stage.sum_of_components), "100%",
                      Text("each category at its own maximum over the step", style="dim"))
        table.add_row("[bold]must fit[/bold]", f"[bold]{_size(stage.total)}[/bold]", _gb(stage.total), "",
                      Text(f"the peak ({_phase_words(stage.peak.phase)}) + overhead", style="dim"))
        console.print(table)
        console.print(_peak_line(stage, request.mode))
    for note in (*estimate.notes, *searches["flag_notes"]):
        console.print(f"[yellow]note:[/yellow] {markup_safe(note)}")
    if budget.capacity is None:
        console.print(f"\n[yellow]No verdict:[/yellow] the memory of {markup_safe(budget.name)} is unknown "
                      f"({markup_safe(budget.source)}); "
                      "pass --device 24GiB to check against a size.")
        return
    worst = estimate.worst.total
    verdict = "[bold green]FITS[/bold green]" if fits else "[bold red]DOES NOT FIT[/bold red]"
    console.print(f"\n{verdict}: needs {_size(worst)} GiB per device (peak + overhead); "
                  f"{markup_safe(budget.name)} has {_size(budget.capacity)} GiB ({markup_safe(budget.source)}), "
                  + (f"{_size(budget.capacity - worst)} GiB to spare." if fits else f"{_size(worst - budget.capacity)} GiB short."))
    if searches["largest_batch"] is not None:
        batch, seq = searches["largest_batch"], searches["largest_seq_len"]
        beyond = "the search stops there; memory does not limit it sooner"
        console.print(f"Largest batch at {request.seq_len:,} tokens: "
                      + (f"more than {batch:,} ({beyond})" if batch == fitting.BATCH_SEARCH_BOUND else f"{batch:,}")
                      if batch else f"No batch fits at {request.seq_len:,} tokens.")
        console.print(f"Longest sequence at batch {request.batch}: "
                      + (f"more than {seq:,} tokens ({beyond})" if seq == fitting.SEQ_SEARCH_BOUND else f"{seq:,} tokens")
                      if seq else f"No sequence length fits at batch {request.batch}.")
    if searches["suggestions"]:
        console.print("\nWhat would make it fit:")
        for suggestion in searches["suggestions"]:
            console.print(f"  {markup_safe(change_flags(suggestion))}: {_size(suggestion.total)} GiB per device")
    elif fits is False:
        console.print("\nNo single change tried here makes it fit; combine them (e.g. --zero 3 with --recompute full) "
                      "or use a larger device.")
