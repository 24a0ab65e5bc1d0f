"""`tensor-tutor data`: where the learner's files live, how big they are, and how to start one of them over.

The folder is tutor.files.storage.data_dir(): $TENSOR_TUTOR_DATA_DIR when set, else platformdirs' user data
folder (~/.local/share/tensor-tutor on Linux). It holds progress.json (lessons, answers, predictions),
settings.json (theme, sample rate, measuring device) and results.jsonl (every `bench` run, for
`bench history`), plus side files: `<name>.corrupt-<time>` / `<name>.torn-<time>` set aside by the
loaders, and `.<name>.lock` files between processes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from tutor.errors import UserError
from tutor.commands.json_output import echo_json

# What `reset` can start over: name -> (file, what the learner loses).
KINDS: dict[str, tuple[str, str]] = {
    "progress": ("progress.json", "lessons done, answers and predictions"),
    "settings": ("settings.json", "theme, live-pane sample rate and measuring device"),
    "results": ("results.jsonl", "every saved bench run (bench history)"),
}


def data_files(folder: Path) -> list[dict]:
    """Every file directly in `folder` with its size and what it is; [] when the folder does not exist."""
    known = {name: kind for kind, (name, _) in KINDS.items()}
    try:
        entries = sorted(folder.iterdir(), key=lambda entry: entry.name)
    except FileNotFoundError:
        return []
    except OSError as error:
        raise UserError(f"cannot list {folder}: {error.strerror or error}") from None
    files = []
    for entry in entries:
        try:
            if not entry.is_file():
                continue
            size = entry.stat().st_size
        except OSError:
            continue
        kind = known.get(entry.name) or ("lock file" if entry.name.endswith(".lock") else "side file")
        files.append({"name": entry.name, "path": str(entry), "bytes": size, "kind": kind})
    return files


def data_report(folder: Path) -> dict:
    """The folder, where its location came from, each file and the total (the `--json` object)."""
    from tutor.files.storage import DATA_DIR_ENV

    files = data_files(folder)
    source = f"${DATA_DIR_ENV}" if os.environ.get(DATA_DIR_ENV) else "the user data folder (platformdirs)"
    return {"folder": str(folder), "source": source, "exists": folder.is_dir(), "files": files,
            "total_bytes": sum(f["bytes"] for f in files)}


@click.group("data", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.pass_context
def data(ctx: click.Context, as_json: bool) -> None:
    """Where tensor-tutor keeps your files, and their sizes.

    \b
    progress.json   lessons done, answers, predictions
    settings.json   theme, live-pane sample rate, measuring device
    results.jsonl   saved bench runs (bench history)
    The folder is $TENSOR_TUTOR_DATA_DIR if set, else ~/.local/share/tensor-tutor on Linux.
    `tensor-tutor data reset progress|settings|results` starts one of them over.
    """
    if ctx.invoked_subcommand is not None:
        return
    from tutor.commands.safe_text import plain
    from tutor.formatting import format_bytes
    from tutor.files.storage import data_dir

    report = data_report(data_dir())
    if as_json:
        echo_json(report)
        return
    click.echo(f"Data folder: {plain(report['folder'])} (from {report['source']})")
    if not report["files"]:
        click.echo("  nothing stored yet" if not report["exists"] else "  the folder is empty")
        return
    width = max(len(plain(f["name"])) for f in report["files"])
    for f in report["files"]:
        what = KINDS[f["kind"]][1] if f["kind"] in KINDS else f["kind"]
        click.echo(f"  {plain(f['name']):<{width}}  {format_bytes(f['bytes']):>10}  {what}")
    click.echo(f"  {'total':<{width}}  {format_bytes(report['total_bytes']):>10}")


@data.command("reset")
@click.argument("kind", type=click.Choice(tuple(KINDS)))
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def reset(kind: str, yes: bool) -> None:
    """Delete progress.json, settings.json or results.jsonl, so that it starts over (close the app first)."""
    from tutor.files.lock import locked
    from tutor.formatting import format_bytes
    from tutor.files.storage import data_dir

    name, loses = KINDS[kind]
    path = data_dir() / name
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        click.echo(f"nothing to reset: {path} does not exist")
        return
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror or error}") from None
    if not yes:
        if not sys.stdin.isatty():
            raise UserError(f"data reset {kind} deletes {path}: confirm at a terminal, or add --yes")
        if not click.confirm(f"Delete {path} ({format_bytes(size)}: {loses})?", default=False):
            click.echo("kept it: nothing was deleted")
            sys.exit(1)
    try:
        with locked(path) as moved:  # not in the middle of another process's read-merge-write
            path.unlink(missing_ok=True)  # a link itself, never what it points to
        if moved:
            click.echo(f"tensor-tutor: {moved}", err=True)
    except OSError as error:
        raise UserError(f"cannot delete {path}: {error.strerror or error}") from None
    click.echo(f"deleted {path} ({format_bytes(size)}); {kind} starts over")
