"""`tensor-tutor fit MODEL`: does a model fit this machine's memory, and what would make it fit.

No torch, no textual: the answer comes from tutor.theory and the memory that NVML (GPU) or
psutil (CPU) reports as free right now.
"""

from __future__ import annotations


import click

from tutor.commands.safe_text import markup_safe, plain
from tutor.errors import UserError
from tutor.answers.fit import FitAnswer, FitInputs, answer_fit, change_flags, table_components
from tutor.answers.fields import fit_options
from tutor.theory import fit as fitting
from tutor.theory.activations import IMPLEMENTATION_MEANING
from tutor.theory.units import GB, GiB
from tutor.commands.json_output import echo_json


def _times_note(times) -> str:
    """The one line under the suggestions saying where their seconds per step come from (or why they are missing)."""
    said = []
    for timed in times:
        words = timed.source.split("; ")[0] if timed.seconds is not None else timed.source
        if words not in said:
            said.append(words)
    timed = any(t.seconds is not None for t in times)
    return "seconds per step: " + "; ".join(said) + (" (each figure's source: fit --json, step_source)" if timed else "")


def _size(value: int) -> str:
    return f"{value / GiB:,.2f}"


def _gb(value: int) -> str:
    return f"{value / GB:,.2f}"


@click.command("fit")
@fit_options()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--trace", is_flag=True,
              help="Also build the real transformers model at full size on fake tensors and trace one step "
                   "(needs the [trace] extra: pip install -e '.[trace]' from a clone).")
@click.option("--timeline", is_flag=True,
              help="The memory alive per category at every layer boundary of one training step (or of one "
                   "prefill, --mode inference), as the formula predicts it (a picture and its table; "
                   "JSON: \"timeline\").")
@click.option("--svg", "svg", default=None, metavar="FILE", help="With --timeline: also save the picture as SVG.")
def fit(model, params, device, as_json, trace, timeline, svg, **request) -> None:
    """Does MODEL fit this machine for inference or training, on how many devices, and what would make it fit?

    MODEL is a preset name (tensor-tutor models), a config.json, or a local model folder.
    """
    if svg is not None and not timeline:
        raise UserError("--svg needs --timeline (the picture to save)")
    if svg is not None:
        from tutor.commands.bench import _check_svg_path

        _check_svg_path(svg)
    answer = answer_fit(FitInputs.from_command(model, params, device, given=_given(), trace=trace, **request))
    moments = _timeline(answer) if timeline else None
    if as_json:
        data = answer.to_json()
        if moments is not None:
            data["timeline"] = [moment.to_json() for moment in moments]
            if answer.traced is not None:
                data["traced_timeline"] = list(answer.traced.trace.timeline)
        echo_json(data)
        if svg is not None:
            _save_timeline(moments, svg, answer)
        return
    _render(answer)
    if moments is not None:
        from rich.console import Console

        from tutor.answers.pictures import print_chart

        print_chart(_timeline_chart(moments, answer.traced), Console())
        if svg is not None:
            _save_timeline(moments, svg, answer)
    if answer.checkpoint is not None:  # dtype names come from the file
        click.echo(plain(_checkpoint_line(answer.checkpoint, answer.estimate.total_params)))
    if answer.traced is not None:
        from tutor.commands.fit_trace import render_trace

        render_trace(answer.traced, answer.estimate)


def _timeline(answer: FitAnswer):
    """The predicted step or prefill timeline (tutor.theory.fit_timeline); a bare count is a UserError."""
    from tutor.theory.fit_timeline import step_timeline

    estimate = answer.estimate
    if estimate.arch is None:
        raise UserError("--timeline needs the model's architecture (a preset, config.json or folder), not --params")
    return step_timeline(estimate.arch, estimate.request)


def _timeline_chart(moments, traced):
    """The predicted timeline, with the traced one (and its peak) over it under --trace."""
    from tutor.answers.pictures import timeline_chart

    trace = traced.trace if traced is not None else None
    return timeline_chart([moment.to_json() for moment in moments], trace.timeline if trace is not None else (),
                          trace.peak.bytes if trace is not None else None)


def _save_timeline(moments, svg: str, answer) -> None:
    """The timeline as an SVG whose first line says what it is of (model, mode, dtype, device, date, version)."""
    from tutor.export import fit_context
    from tutor.answers.pictures import save_svg

    path = save_svg([_timeline_chart(moments, answer.traced)], svg, context=fit_context(answer.to_json()).line())
    click.echo(f"tensor-tutor: saved the picture to {path}", err=True)


def _given() -> tuple[str, ...]:
    """The parameters typed on the command line (the flags that do not apply get a note)."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return tuple(name for name in ctx.params if ctx.get_parameter_source(name) is ParameterSource.COMMANDLINE)


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


def _other_impl(impl: str) -> str:
    return next(other for other in fitting.IMPLEMENTATIONS if other != impl)


def _phase_words(phase: str) -> str:
    return {"forward": "the forward pass", "backward": "the backward pass", "optimizer": "the optimizer step"}.get(
        phase, phase)


def _peak_line(stage: fitting.DeviceMemory, mode: str) -> str:
    """When the step peaks, what is alive then, and why the sum of categories is larger."""
    peak = stage.peak
    # Shares that round to 0% are left out (a RoPE model's 512 B of buffers).
    alive = sorted(((name, n) for name, n in peak.per_category.items() if n / (peak.bytes or 1) >= 0.005),
                   key=lambda item: -item[1])
    shares = ", ".join(f"{name.replace('_', ' ')} {n / (peak.bytes or 1):.0%}" for name, n in alive)
    line = f"peak: {_size(peak.bytes)} GiB alive during {_phase_words(peak.phase)} ({shares})"
    over = stage.sum_of_components - stage.component("overhead") - peak.bytes
    if over > 0:
        why = ("gradients and activations do not peak together: backward frees activations as gradients appear"
               if mode == fitting.Mode.TRAIN else "the categories do not peak at the same moment")
        line += f"; the sum of categories counts {_size(over)} GiB more: {why}"
    from tutor.safe_text import markup_escape as escape

    return line + f". [dim]{escape(peak.formula)}[/dim]"


# Tensors a training step's peak holds that no category keeps across the step: a row of their own, so
# the "at peak" column adds up to what must fit.
PEAK_ONLY = {"optimizer_temporaries": "optimizer temporaries"}


def _memory_table(stage: fitting.DeviceMemory, title: str, mode: str):
    """Each category at its own maximum over the step (they add up to the sum of categories); training adds
    what is alive at the peak (they add up, with the overhead, to what must fit)."""
    from rich.table import Table
    from rich.text import Text

    training = mode == fitting.Mode.TRAIN
    peak = stage.peak
    table = Table(title=title, title_justify="left")
    table.add_column("component")
    table.add_column("GiB", justify="right")
    table.add_column("GB", justify="right")
    table.add_column("share", justify="right")
    if training:
        table.add_column("at peak, GiB", justify="right")
    table.add_column("formula", overflow="fold")
    summed = stage.sum_of_components or 1
    for component in table_components(stage):
        at_peak = component.bytes if component.name == "overhead" else peak.per_category.get(component.name, 0)
        table.add_row(component.name.replace("_", " "), _size(component.bytes), _gb(component.bytes),
                      f"{component.bytes / summed:.0%}", *((_size(at_peak),) if training else ()),
                      Text(component.formula, style="dim"))
    if training:
        for name, label in PEAK_ONLY.items():
            if peak.per_category.get(name):
                table.add_row(label, "-", "-", "-", _size(peak.per_category[name]),
                              Text(f"allocated only inside {_phase_words(peak.phase)}", style="dim"))
    table.add_section()
    table.add_row("sum of categories", _size(stage.sum_of_components), _gb(stage.sum_of_components), "100%",
                  *(("",) if training else ()), Text("each category at its own maximum over the step", style="dim"))
    table.add_row("[bold]must fit[/bold]", f"[bold]{_size(stage.total)}[/bold]", _gb(stage.total), "",
                  *((f"[bold]{_size(stage.total)}[/bold]",) if training else ()),
                  Text(f"the peak ({_phase_words(peak.phase)}) + overhead"
                       + (": the at-peak column's sum" if training else ""), style="dim"))
    return table


def _render(answer: FitAnswer) -> None:
    from rich.console import Console

    from tutor.formatting import format_count

    console = Console()
    estimate, budget = answer.estimate, answer.budget
    request = estimate.request
    params_line = f"{format_count(estimate.total_params)} parameters ({estimate.total_params:,})"
    if estimate.params and estimate.params.active != estimate.params.total:
        params_line += f", {format_count(estimate.params.active)} active per token"
    if request.mode == fitting.Mode.TRAIN and request.adapter:
        params_line += f", {estimate.trainable_params:,} trainable ({request.recipe})"
    console.print(f"[bold]{markup_safe(answer.name)}[/bold]  {params_line}\n[dim]{markup_safe(answer.source)}[/dim]")
    layout = f"dp {request.dp} x tp {request.tp} x pp {request.pp}" + (f", ep {request.ep}" if request.ep > 1 else "")
    what = (f"inference, {request.dtype} weights, batch {request.batch} x {request.seq_len:,} tokens"
            if request.mode == fitting.Mode.INFERENCE else
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
        console.print(_memory_table(stage, title, request.mode))
        console.print(_peak_line(stage, request.mode))
    for note in answer.notes:
        console.print(f"[yellow]note:[/yellow] {markup_safe(note)}")
    if budget.capacity is None:
        console.print(f"\n[yellow]No verdict:[/yellow] the memory of {markup_safe(budget.name)} is unknown "
                      f"({markup_safe(budget.source)}); "
                      "pass --device 24GiB to check against a size.")
        return
    worst = estimate.worst.total
    fits = answer.fits
    verdict = "[bold green]FITS[/bold green]" if fits else "[bold red]DOES NOT FIT[/bold red]"
    console.print(f"\n{verdict}: needs {_size(worst)} GiB per device (peak + overhead); "
                  f"{markup_safe(budget.name)} has {_size(budget.capacity)} GiB ({markup_safe(budget.source)}), "
                  + (f"{_size(budget.capacity - worst)} GiB to spare." if fits else f"{_size(worst - budget.capacity)} GiB short."))
    if answer.largest_batch is not None:
        batch, seq = answer.largest_batch, answer.largest_seq_len
        beyond = "the search stops there; memory does not limit it sooner"
        console.print(f"Largest batch at {request.seq_len:,} tokens: "
                      + (f"more than {batch:,} ({beyond})" if batch == fitting.BATCH_SEARCH_BOUND else f"{batch:,}")
                      if batch else f"No batch fits at {request.seq_len:,} tokens.")
        console.print(f"Longest sequence at batch {request.batch}: "
                      + (f"more than {seq:,} tokens ({beyond})" if seq == fitting.SEQ_SEARCH_BOUND else f"{seq:,} tokens")
                      if seq else f"No sequence length fits at batch {request.batch}.")
    if answer.suggestions:
        console.print("\nWhat would make it fit:")
        times = answer.suggestion_times or (None,) * len(answer.suggestions)
        for suggestion, timed in zip(answer.suggestions, times):
            cost = "" if timed is None else timed.cost_text()
            console.print(f"  {markup_safe(change_flags(suggestion))}: {_size(suggestion.total)} GiB per device{cost}")
        if answer.suggestion_times:
            console.print(f"  [dim]{markup_safe(_times_note(answer.suggestion_times))}[/dim]")
    elif answer.nothing_fits:
        text = answer.nothing_fits_text()
        console.print(f"\n{text[0].upper()}{text[1:]}.")
