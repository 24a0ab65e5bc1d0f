"""`tensor-tutor fit MODEL --trace`: the traced step (tutor.trace.fit_step) beside the formula, as Rich tables."""

from __future__ import annotations

from tutor.trace.fit_step import LABELS, TracedFit, comparison, explanations, traced_over_formula
from tutor.theory.fit import Mode
from tutor.theory.units import GiB


def render_trace(result: TracedFit, estimate) -> None:
    """Rich tables: traced vs formula per category (at the peak and each one's maximum), then why."""
    from rich.console import Console
    from tutor.safe_text import markup_escape as escape
    from rich.table import Table

    console = Console()
    trace = result.trace
    table_data = comparison(result, estimate)
    setup = trace.setup
    what = (f"one training step ({setup.dtype} parameters{', bf16 autocast' if setup.autocast else ''}, "
            f"{trace.optimizer_traced}{', gradient checkpointing' if setup.recompute else ''})"
            if setup.mode == Mode.TRAIN else f"one prefill ({setup.dtype}, DynamicCache, logits of the last token)")
    console.print(f"\n[bold]Traced[/bold]: {escape(trace.model_class)} built at full size "
                  f"({trace.params:,} parameters) on fake {escape(trace.device_traced)} tensors, {what}, "
                  f"attention {escape(trace.attention_traced)}, batch {setup.batch} x {setup.seq_len:,} tokens; "
                  f"transformers {escape(trace.transformers_version)}, torch {escape(trace.torch_version)}; "
                  f"{sum(trace.seconds.values()):.1f} s")
    table = Table(title="Traced vs formula, GiB (ratio: traced max / fit max)", title_justify="left")
    for column in ("category", "peak: traced", "peak: fit", "max: traced", "max: fit", "ratio"):
        table.add_column(column, justify="left" if column == "category" else "right")
    for name, row in table_data["categories"].items():
        ratio = traced_over_formula(row["traced_max"], row["formula_max"])
        table.add_row(LABELS.get(name, name), _gib(row["traced_at_peak"]), _gib(row["formula_at_peak"]),
                      _gib(row["traced_max"]), _gib(row["formula_max"]),
                      f"{ratio:.2f}" if ratio is not None else "-")
    peak = table_data["peak"]
    table.add_section()
    table.add_row("[bold]peak[/bold]", f"[bold]{_gib(peak['traced_bytes'])}[/bold]", _gib(peak["formula_bytes"]),
                  "", "", f"{peak['ratio']:.2f}" if peak["ratio"] is not None else "-")
    table.add_row("phase", trace.peak.phase, peak["formula_phase"] or "-", "", "", "")
    console.print(table)
    console.print("[dim]Overhead (CUDA context, allocator slack) is not a tensor: only the formula counts it.[/dim]")
    for line in explanations(result, estimate):
        console.print(f"  {escape(line)}")
    for note in result.notes:
        console.print(f"[yellow]trace note:[/yellow] {escape(note)}")


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / GiB:,.2f}"
