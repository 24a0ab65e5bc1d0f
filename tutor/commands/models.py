"""`tensor-tutor models`: the bundled model presets, their exact parameter counts and sources."""

from __future__ import annotations

import json

import click


@click.command("models")
@click.option("--devices", "devices", is_flag=True,
              help="List the GPU cards that `fit --device` accepts instead, with their memory and its source.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def models(devices: bool, as_json: bool) -> None:
    """List the model presets that `tensor-tutor fit` knows offline (configs as published)."""
    if devices:
        _devices(as_json)
        return
    from tutor.model_files import list_presets, load_preset
    from tutor.theory.models import architecture_from_config, count_parameters

    presets = []
    for info in list_presets():
        config, _ = load_preset(info.name)
        arch = architecture_from_config(config, info.name)
        presets.append((info, arch, count_parameters(arch)))
    if as_json:
        rows = [{
            "name": info.name, "display_name": info.display_name, "hf_repo": info.hf_repo,
            "model_type": arch.model_type, "params_total": counts.total, "params_active": counts.active,
            "checkpoint_tensors": counts.checkpoint_tensors,
            "published_total": info.total.text if info.total else None,
            "published_source": info.total.source if info.total else None,
        } for info, arch, counts in presets]
        click.echo(json.dumps({"models": rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    from tutor.commands.safe_text import as_text
    from tutor.commands.tables import ID_COLUMN, PROSE_COLUMN
    from tutor.formatting import format_count

    table = Table(title=f"{len(presets)} model presets (offline; `tensor-tutor fit NAME`)", title_justify="left")
    for column in ("preset", "model", "type"):
        table.add_column(column, justify="left", **(PROSE_COLUMN if column in ("model", "type") else ID_COLUMN))
    for column in ("params", "active"):
        table.add_column(column, justify="right", **ID_COLUMN)
    table.add_column("published", justify="right", **PROSE_COLUMN)
    for info, arch, counts in presets:
        active = format_count(counts.active) if counts.active != counts.total else ""
        published = info.total.text if info.total else ""
        if published.isdigit():
            # A published total may sum checkpoint tensors (parameters + persistent buffers).
            matched = {counts.checkpoint_tensors: "exact (checkpoint tensors)", counts.total: "exact"}
            published = matched.get(int(published), f"{int(published):,}")
        table.add_row(as_text(info.name), as_text(info.display_name), as_text(arch.model_type),
                      format_count(counts.total),
                      active, published)
    Console().print(table)


def _devices(as_json: bool) -> None:
    """The spec-table cards: memory as the driver reports it (GiB) beside the datasheet size (GB)."""
    from tutor.hardware.specs import GPU_ALIASES, SPECS, DRIVER_MEMORY
    from tutor.theory.units import GB, GiB

    aliases: dict[str, list[str]] = {}
    for alias, (key, _) in GPU_ALIASES.items():
        aliases.setdefault(key, []).append(alias)
    rows = [{
        "key": spec.key, "name": spec.name, "aliases": aliases.get(spec.key, []),
        "memory_bytes": spec.memory_bytes, "memory_driver_reported": spec.key in DRIVER_MEMORY,
        "memory_source": spec.memory_source, "memory_datasheet_bytes": spec.memory_datasheet,
        "bandwidth_gbps": spec.bandwidth_gbps,
    } for spec in SPECS]
    if as_json:
        alias_rows = {alias: {"key": key, "note": note} for alias, (key, note) in GPU_ALIASES.items()}
        click.echo(json.dumps({"devices": rows, "aliases": alias_rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    from tutor.commands.tables import ID_COLUMN, PROSE_COLUMN
    from tutor.formatting import NOT_AVAILABLE, format_number

    table = Table(title=f"{len(rows)} GPU cards for `tensor-tutor fit MODEL --device KEY`", title_justify="left")
    for column in ("key", "card", "also"):
        table.add_column(column, justify="left", **(PROSE_COLUMN if column in ("card", "also") else ID_COLUMN))
    for column in ("driver\nGiB", "datasheet\nGB", "bandwidth\nGB/s"):
        table.add_column(column, justify="right", **ID_COLUMN)
    for spec in SPECS:
        driver = NOT_AVAILABLE if spec.memory_bytes is None else f"{spec.memory_bytes / GiB:,.2f}"
        driver += "" if spec.key in DRIVER_MEMORY else " *"
        datasheet = None if spec.memory_datasheet is None else spec.memory_datasheet / GB
        table.add_row(spec.key, spec.name, ", ".join(aliases.get(spec.key, [])), driver,
                      format_number(datasheet, digits=4),
                      format_number(spec.bandwidth_gbps, digits=4))
    console = Console()
    console.print(table)
    console.print("driver GiB: the total nvidia-smi / rocm-smi reports (2^30 bytes); datasheet GB: the marketing "
                  "size (10^9 bytes). * no driver figure found: the datasheet size stands in. "
                  "Sources: `tensor-tutor models --devices --json`.")
