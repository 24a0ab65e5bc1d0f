"""`tensor-tutor models`: the bundled model presets, their exact parameter counts and sources."""

from __future__ import annotations

from typing import TYPE_CHECKING, TypedDict

import click
from tutor.commands.json_output import echo_json

if TYPE_CHECKING:
    from rich.console import JustifyMethod


class _PresetRow(TypedDict):
    """One preset as `models --json` prints it."""

    name: str
    display_name: str
    hf_repo: str
    model_type: str
    params_total: int
    params_active: int
    checkpoint_tensors: int
    published_total: str | None
    published_source: str | None
    profile: str


class _DeviceRow(TypedDict):
    """One GPU card as `models --devices --json` prints it."""

    key: str
    name: str
    aliases: list[str]
    memory_bytes: int | None
    memory_driver_reported: bool
    memory_source: str
    memory_datasheet_bytes: int | None
    bandwidth_gbps: float


@click.command("models")
@click.option("--devices", "devices", is_flag=True,
              help="List the GPU cards that `fit --device` accepts instead, with their memory and its source.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def models(devices: bool, as_json: bool) -> None:
    """List the model presets that `tensor-tutor fit` knows offline (configs as published)."""
    if devices:
        _devices(as_json)
        return
    from tutor.files.models import list_presets, load_preset
    from tutor.theory.models import SUPPORTED_MODEL_TYPES, architecture_from_config, count_parameters

    rows: list[_PresetRow] = []
    for info in list_presets():
        config, _ = load_preset(info.name)
        arch = architecture_from_config(config, info.name)
        counts = count_parameters(arch)
        rows.append({
            "name": info.name, "display_name": info.display_name, "hf_repo": info.hf_repo,
            "model_type": arch.model_type, "params_total": counts.total, "params_active": counts.active,
            "checkpoint_tensors": counts.checkpoint_tensors,
            "published_total": info.total.text if info.total else None,
            "published_source": info.total.source if info.total else None,
            "profile": arch.profile,
        })
    profiles = {"hand": list(SUPPORTED_MODEL_TYPES), "calibrated_trace": CALIBRATED_TRACE}
    if as_json:
        echo_json({"models": rows, "profiles": profiles})
        return
    from rich.console import Console
    from rich.table import Table

    from tutor.commands.safe_text import as_text
    from tutor.commands.tables import ID_COLUMN, PROSE_COLUMN
    from tutor.formatting import format_count

    table = Table(title=f"{len(rows)} model presets (offline; `tensor-tutor fit NAME`)", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("preset", "left"), ("model", "left"), ("type", "left"), ("params", "right"), ("active", "right"),
        ("published", "right"))
    for column, justify in columns:
        table.add_column(column, justify=justify,
                         **(PROSE_COLUMN if column in ("model", "type", "published") else ID_COLUMN))
    for row in rows:
        active = format_count(row["params_active"]) if row["params_active"] != row["params_total"] else ""
        published = row["published_total"] or ""
        if published.isdigit():
            # A published total may sum checkpoint tensors (parameters + persistent buffers).
            matched = {row["checkpoint_tensors"]: "exact (checkpoint tensors)", row["params_total"]: "exact"}
            published = matched.get(int(published), f"{int(published):,}")
        table.add_row(as_text(row["name"]), as_text(row["display_name"]), as_text(row["model_type"]),
                      format_count(row["params_total"]),
                      active, published)
    console = Console()
    console.print(table)
    console.print(f"Hand-profiled model types (formulas, instant): {', '.join(SUPPORTED_MODEL_TYPES)}.")
    from tutor.safe_text import markup_escape as escape

    console.print(f"Calibrated trace: {escape(CALIBRATED_TRACE)}.")


CALIBRATED_TRACE = ("any other decoder-only model_type transformers can build (gemma3_text, granite, gpt_oss, ...): "
                    "parameters from the real model class on the meta device, activations from traces fitted "
                    "in b·s and b·s², cached; needs the [trace] extra")


def _devices(as_json: bool) -> None:
    """The spec-table cards: memory as the driver reports it (GiB) beside the datasheet size (GB)."""
    from tutor.hardware.specs import GPU_ALIASES, SPECS, DRIVER_MEMORY
    from tutor.theory.units import GB, GiB

    aliases: dict[str, list[str]] = {}
    for alias, (key, _) in GPU_ALIASES.items():
        aliases.setdefault(key, []).append(alias)
    rows: list[_DeviceRow] = [{
        "key": spec.key, "name": spec.name, "aliases": aliases.get(spec.key, []),
        "memory_bytes": spec.memory_bytes, "memory_driver_reported": spec.key in DRIVER_MEMORY,
        "memory_source": spec.memory_source, "memory_datasheet_bytes": spec.memory_datasheet,
        "bandwidth_gbps": spec.bandwidth_gbps,
    } for spec in SPECS]
    if as_json:
        alias_rows = {alias: {"key": key, "note": note} for alias, (key, note) in GPU_ALIASES.items()}
        echo_json({"devices": rows, "aliases": alias_rows})
        return
    from rich.console import Console
    from rich.table import Table

    from tutor.commands.tables import ID_COLUMN, PROSE_COLUMN
    from tutor.formatting import format_number

    table = Table(title=f"{len(rows)} GPU cards for `tensor-tutor fit MODEL --device KEY`", title_justify="left")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("key", "left"), ("card", "left"), ("also", "left"), ("driver\nGiB", "right"), ("datasheet\nGB", "right"),
        ("bandwidth\nGB/s", "right"))
    for column, justify in columns:
        table.add_column(column, justify=justify, **(PROSE_COLUMN if column in ("card", "also") else ID_COLUMN))
    for row in rows:
        memory, datasheet = row["memory_bytes"], row["memory_datasheet_bytes"]
        driver = ("" if memory is None else f"{memory / GiB:,.2f}") + ("" if row["memory_driver_reported"] else " *")
        table.add_row(row["key"], row["name"], ", ".join(row["aliases"]), driver,
                      format_number(None if datasheet is None else datasheet / GB, digits=4),
                      format_number(row["bandwidth_gbps"], digits=4))
    console = Console()
    console.print(table)
    console.print("driver GiB: the total nvidia-smi / rocm-smi reports (2^30 bytes); datasheet GB: the marketing "
                  "size (10^9 bytes). * no driver figure found: the datasheet size stands in. "
                  "Sources: `tensor-tutor models --devices --json`.")
