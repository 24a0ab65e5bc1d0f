"""The Fit screen's time beside memory: step time by phase, tokens per second, MFU and the ceilings'
sources, as `tensor-tutor time` reports them (tutor.answers.time, asked through
tutor.calculators.fit_time); and the peak moment of the memory timeline in words.

This module only renders the report dict; every figure in it was computed by tutor.theory from
measured or sourced ceilings. Names read from files (a model folder's name) are escaped: Text, not markup.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from tutor.calculators import FitTime
from tutor.answers.time import PHASE_WORDS, does_not_fit_line, phase_share
from tutor.formatting import (
    format_bytes,
    format_count,
    format_duration,
    format_percent,
    format_quantity,
    format_rate,
)



def train_lines(report: dict[str, Any]) -> list[RenderableType]:
    """Step time by phase, tokens per second, MFU against both ceilings and the time to train."""
    step = report["step"]
    table = Table(expand=False, box=None, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column("one training step")
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("share", justify="right", no_wrap=True)
    for name, seconds in step["phases"].items():
        table.add_row(PHASE_WORDS.get(name, name), format_duration(seconds), phase_share(seconds, step["seconds"]))
    table.add_row(Text("step", style="bold"), Text(format_duration(step["seconds"]), style="bold"), "100%")
    mfu = report["mfu"]
    train = report["train"]
    devices = report["request"]["devices"]
    return [
        table,
        Text.assemble((format_rate(report["tokens_per_second"], "tokens/s"), "bold"),
                      f" ({format_count(step['tokens'])} tokens per step); MFU ",
                      (format_percent(mfu["datasheet"]), "bold"), " of the datasheet peak, ",
                      (format_percent(mfu["measured_matmul"]), "bold"), " of the measured matmul maximum"),
        Text(f"train on {format_count(train['tokens'])} tokens: {format_duration(train['seconds'])} on "
             f"{devices:,} device(s), {format_count(train['device_hours'])} device-hours"),
    ]


def inference_lines(report: dict[str, Any]) -> list[RenderableType]:
    """Prefill (time to first token) and decode tokens per second by batch."""
    prefill = report["prefill"]
    table = Table(expand=False, box=None, show_edge=False, pad_edge=False, header_style="bold")
    table.add_column(f"decode at {report['request']['seq_len']:,} tokens of context")
    table.add_column("engine", no_wrap=True)
    table.add_column("per step", justify="right", no_wrap=True)
    table.add_column("tokens/s", justify="right", no_wrap=True)
    table.add_column("bound by", no_wrap=True)
    for point in report["decode"]:
        table.add_row(f"batch {point['batch']:,}", point.get("engine", "eager"),
                      format_duration(point["seconds_per_step"]),
                      format_rate(point["tokens_per_second"], "tokens/s"), point["bound"])
    crossover = report["decode_compute_bound_batch"]
    return [
        Text.assemble(f"prefill (time to first token) of {prefill['tokens']:,} tokens: ",
                      (format_duration(prefill["seconds"]), "bold"),
                      f", {format_rate(prefill['tokens_per_second'], 'tokens/s')}"),
        table,
        Text(f"the device's decode work turns compute-bound at batch {crossover:,}" if crossover else
             "the device's decode work stays memory-bound at every batch at this context"),
    ]


LINK_SOURCES = ("intra_node_link", "inter_node_link", "link_latency")
"""Sources of the links between devices: no part of a one-device answer."""


def sources_lines(report: dict[str, Any]) -> list[RenderableType]:
    """Where each ceiling came from (a measured run, or a datasheet times a published fraction), and the notes;
    the links' only when the layout has more than one device (`time --json` lists them all)."""
    lines: list[RenderableType] = [Text("ceilings, from:", style="bold")]
    single = report.get("request", {}).get("devices", 1) == 1
    for name, source in report["sources"].items():
        if single and name in LINK_SOURCES:
            continue
        lines.append(Text.assemble(f"  {name.replace('_', ' ')}: ", (str(source), "dim")))
    for note in report.get("notes", ()):
        lines.append(Text.assemble(("note: ", "yellow"), str(note)))
    return lines


def time_renderable(answer: FitTime) -> RenderableType:
    """The time half of the Fit screen: the report, or the one line why there is none."""
    if answer.report is None:
        return Text(f"time: {answer.reason}", style="dim")
    report = answer.report
    device = report["device"]
    head = Text(f"on {device['name']}, {device['dtype']}", style="italic")
    # The CLI's line, in the form's words: the form is where the options are changed.
    misfit = does_not_fit_line(report).replace("`tensor-tutor fit` with the same model and options says",
                                               "the memory above says")
    warning = [Text(misfit, style="bold yellow")] if misfit else []
    body = train_lines(report) if report["mode"] == "train" else inference_lines(report)
    return Group(head, *warning, *body, *sources_lines(report))


def peak_text(answer: FitTime) -> Text:
    """The memory timeline's peak: its bytes, its moment and its phase (the moment that must fit)."""
    peak = answer.peak
    if peak is None:
        return Text("")
    return Text.assemble(("peak ", "bold"), (format_bytes(peak["bytes"]), "bold"),
                         f" at {peak['moment']}, in the {peak['phase']} phase",
                         (f" ({format_quantity(len(answer.timeline), '')} moments of one step)", "dim"))


class TimePanel(Static):
    """How long the step takes on the form's device; `update_time` gives it a new answer."""

    DEFAULT_CSS = "TimePanel { height: auto; }"

    def update_time(self, answer: FitTime | None, waiting: str = "") -> None:
        self.update(Text(waiting, style="dim") if answer is None else time_renderable(answer))
