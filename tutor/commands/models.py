"""`tensor-tutor models`: the bundled model presets, their exact parameter counts and sources."""

from __future__ import annotations

import json

import click


@click.command("models")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def models(as_json: bool) -> None:
    """List the model presets that `tensor-tutor fit` knows offline (configs as published)."""
    from tutor.theory.models import count_parameters, list_presets, load_preset, architecture_from_config

    rows = []
    for info in list_presets():
        config, _ = load_preset(info.name)
        arch = architecture_from_config(config, info.name)
        counts = count_parameters(arch)
        rows.append({
            "name": info.name, "display_name": info.display_name, "hf_repo": info.hf_repo,
            "model_type": arch.model_type, "params_total": counts.total, "params_active": counts.active,
            "published_total": info.total.text if info.total else None,
            "published_source": info.total.source if info.total else None,
        })
    if as_json:
        click.echo(json.dumps({"models": rows}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    from tutor.theory.units import human_count

    table = Table(title=f"{len(rows)} model presets (offline; `tensor-tutor fit NAME`)", title_justify="left")
    for column, justify in (("preset", "left"), ("model", "left"), ("type", "left"), ("params", "right"),
                            ("active", "right"), ("published", "right")):
        table.add_column(column, justify=justify)
    for row in rows:
        active = human_count(row["params_active"]) if row["params_active"] != row["params_total"] else ""
        published = row["published_total"] or ""
        if published.isdigit():
            published = "exact" if int(published) == row["params_total"] else f"{int(published):,}"
        table.add_row(row["name"], row["display_name"], row["model_type"], human_count(row["params_total"]),
                      active, published)
    Console().print(table)
