"""The text view of `tensor-tutor time`: the report dict `time --json` prints, as Rich tables.

Every figure goes through tutor.formatting; names read from files are escaped (markup_safe).
"""

from __future__ import annotations

from tutor.commands.safe_text import markup_safe
from tutor.answers.time import PHASE_WORDS, does_not_fit_line, phase_share
from tutor.formatting import (
    format_count,
    format_duration,
    format_number,
    format_percent,
    format_quantity,
    format_rate,
)



def render_report(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    request = report["request"]
    console.print(f"[bold]{markup_safe(report['model']['name'])}[/bold]  [dim]{markup_safe(report['model']['source'])}"
                  f"[/dim]\n{markup_safe(report['device']['name'])}, {report['device']['dtype']}; "
                  f"dp {request['dp']} x tp {request['tp']} x pp {request['pp']} = {request['devices']:,} device(s)")
    if line := does_not_fit_line(report):
        console.print(f"[bold red]{markup_safe(line)}[/bold red]")
    if report["mode"] == "train":
        _render_train(console, Table, report)
    else:
        _render_inference(console, Table, report)
    if "verify" in report:
        _render_verify(console, Table, report["verify"])
    console.print("\n[bold]Sources[/bold]")
    for name, source in report["sources"].items():
        console.print(f"  {name.replace('_', ' ')}: [dim]{markup_safe(source)}[/dim]")
    for note in report.get("notes", []):
        console.print(f"[yellow]note:[/yellow] {markup_safe(note)}")


def render_verify_only(report: dict) -> None:
    """--verify without a bench run: the verification alone, and why the rest is missing."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    console.print(f"[bold]{markup_safe(report['model']['name'])}[/bold]")
    _render_verify(console, Table, report["verify"])
    for note in report["notes"]:
        console.print(f"[yellow]note:[/yellow] {markup_safe(note)}")


def _render_train(console, Table, report: dict) -> None:
    step = report["step"]
    request = report["request"]
    console.print(f"training: micro-batch {request['batch']} x {request['seq_len']:,} tokens, "
                  f"{step['microbatches']} micro-batch(es) per step, {format_count(step['tokens'])} tokens per step; "
                  f"{report['request']['recipe']} + {report['request']['optimizer']}, recompute {request['recompute']}")
    table = Table(title="One training step", title_justify="left")
    table.add_column("phase")
    table.add_column("time", justify="right")
    table.add_column("share", justify="right")
    for name, seconds in step["phases"].items():
        table.add_row(PHASE_WORDS.get(name, name), format_duration(seconds), phase_share(seconds, step["seconds"]))
    table.add_section()
    table.add_row("[bold]step[/bold]", f"[bold]{format_duration(step['seconds'])}[/bold]", "100%")
    console.print(table)
    if step.get("mfu_stated"):
        console.print(f"[dim]step from the stated MFU {format_percent(step['mfu_stated'])}: model FLOPs / (MFU x peak "
                      "x devices); phases scaled from the counted ones[/dim]")
    mfu = report["mfu"]
    console.print(f"{format_rate(report['tokens_per_second'], 'tokens/s')}; "
                  f"{format_quantity(report['flops_per_step'], 'FLOP')} per step "
                  f"({format_quantity(report['model_flops_per_token'], 'FLOP')} per token); "
                  f"MFU {format_percent(mfu['datasheet'])} of the datasheet peak, "
                  f"{format_percent(mfu['measured_matmul'])} of the measured matmul maximum")
    train = report["train"]
    cost = f", cost {format_number(train['cost'])} at {format_number(train['price_per_device_hour'])} per device-hour" \
        if train["cost"] is not None else " (--price gives the cost)"
    console.print(f"[bold]Train on {format_count(train['tokens'])} tokens:[/bold] {format_duration(train['seconds'])} "
                  f"wall-clock on {request['devices']:,} device(s), {format_count(train['device_hours'])} device-hours, "
                  f"{format_number(train['flops'])} FLOPs{cost}")
    if report["communication"]:
        comm = Table(title="Communication per step", title_justify="left")
        for column in ("group", "collective", "ranks", "bytes per rank", "time", "exposed", "link"):
            comm.add_column(column, justify="right" if column in ("ranks", "bytes per rank", "time", "exposed") else "left")
        for c in report["communication"]:
            comm.add_row(c["group"], c["collective"], f"{c['ranks']:,}", format_quantity(c["bytes_per_rank"], "B"),
                         format_duration(c["seconds"]), format_duration(c["exposed_seconds"]),
                         c["link"].replace("_", " "))
        console.print(comm)
        console.print(f"[dim]overlap {format_percent(report['assumptions']['overlap'])}: "
                      f"{report['assumptions']['overlap_meaning']} (--overlap changes it)[/dim]")
    fall = Table(title="Waterfall: datasheet peak to achieved step (per device)", title_justify="left")
    fall.add_column("rung")
    fall.add_column("rate", justify="right")
    fall.add_column("factor", justify="right")
    fall.add_column("from", overflow="fold")
    for w in report["waterfall"]:
        fall.add_row(w["name"], format_rate(w["flops_per_s"], "FLOP/s"), format_quantity(w["factor"], "x"),
                     markup_safe(w["source"]))
    console.print(fall)
    ops = Table(title="Largest operations", title_justify="left")
    for column in ("phase", "operation", "FLOPs", "bytes", "time"):
        ops.add_column(column, justify="right" if column in ("FLOPs", "bytes", "time") else "left")
    for op in report["operations"][:8]:
        ops.add_row(op["phase"], op["name"], format_quantity(op["flops"], "FLOP") if op["flops"] else "",
                    format_quantity(op["bytes"], "B"), format_duration(op["seconds"]))
    console.print(ops)


def _render_inference(console, Table, report: dict) -> None:
    prefill = report["prefill"]
    engines = report.get("engines") or {}
    console.print(f"prefill (time to first token) of {prefill['tokens']:,} tokens: "
                  f"[bold]{format_duration(prefill['seconds'])}[/bold], "
                  f"{format_rate(prefill['tokens_per_second'], 'tokens/s')} ({prefill.get('engine', 'eager')}, "
                  f"bound by {prefill.get('bound', 'compute')})")
    for row in prefill.get("engines", [])[1:]:
        console.print(f"  with {row['engine']}: {format_duration(row['seconds'])}")
    table = Table(title=f"Decode at {report['request']['seq_len']:,} tokens of context", title_justify="left")
    for column in ("engine", "batch", "per step", "tokens/s", "bound by", "host's code"):
        table.add_column(column, justify="right" if column not in ("bound by", "engine") else "left")
    for point in report["decode"]:
        share = point.get("host_share")
        table.add_row(point.get("engine", "eager"), f"{point['batch']:,}", format_duration(point["seconds_per_step"]),
                      format_rate(point["tokens_per_second"], "tokens/s"), point["bound"],
                      "not counted" if share is None else format_percent(share))
    console.print(table)
    for engine, words in engines.items():
        console.print(f"[dim]{engine}: {markup_safe(words)}[/dim]")
    crossover = report["decode_compute_bound_batch"]
    console.print(f"the device's decode work turns compute-bound at batch {crossover:,}" if crossover else
                  "the device's decode work stays memory-bound at every batch: at this context the KV cache read "
                  "grows with the batch as fast as the FLOPs")


def _render_verify(console, Table, verify: dict) -> None:
    where = f"on {verify['device']}" if verify.get("device") else "on this machine"
    console.print(f"\n[bold]Verified {markup_safe(where)}[/bold]: {markup_safe(verify['model'])} "
                  f"[dim]({markup_safe(verify.get('scaled', ''))})[/dim]")
    table = Table(title_justify="left")
    for column in ("what", "predicted", "measured", "measured / predicted"):
        table.add_column(column, justify="left" if column == "what" else "right")

    def add(name: str, row: dict) -> None:
        table.add_row(name, format_duration(row["predicted_s"]), format_duration(row["measured_s"]),
                      format_quantity(row["measured_s"] / row["predicted_s"], "x") if row["predicted_s"] else "N/A")

    for name, row in verify.get("phases", {}).items():
        add(name, row)
    if "predicted_s" in verify:
        table.add_section()
        add("[bold]training step[/bold]", verify)
    if "prefill" in verify:
        add("prefill", verify["prefill"])
    engines = verify.get("decode_engines")
    if engines:
        for row in engines:
            add(f"decode, batch {row['batch']}, {row['engine']}", row)
    elif "decode" in verify:
        add("decode", verify["decode"])
    console.print(table)
    for note in [*verify.get("notes", []), *([verify["graphs_note"]] if verify.get("graphs_note") else [])]:
        console.print(f"[dim]{markup_safe(note)}[/dim]")
