"""The `tensor-tutor` command line.

Each subcommand lives in `tutor/commands/<name>.py` and is imported only when it runs, so that
`tensor-tutor fit` never pays for torch or textual (tests/test_layers.py enforces this).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import click

from tutor import __version__
from tutor.errors import UserError

TORCH_MISSING = ("this command measures with PyTorch, which is not installed: pip install torch (on a CPU-only "
                 "machine: pip install torch --index-url https://download.pytorch.org/whl/cpu)")

# name -> (module, attribute, one-line help shown by `tensor-tutor --help`)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "fit": ("tutor.commands.fit", "fit", "Does a model fit this machine for inference or training?"),
    "time": ("tutor.commands.time", "time_command",
             "How long a step, a training run, a prefill and a decode take, from measured ceilings."),
    "models": ("tutor.commands.models", "models", "List the bundled model presets."),
    "env": ("tutor.commands.env", "env", "What this machine is: CPU, GPUs, drivers, theoretical peaks."),
    "bench": ("tutor.commands.bench", "bench", "Measure this machine against its datasheet."),
    "lab": ("tutor.commands.lab", "lab", "Run one of the lessons' experiments on this machine."),
    "learn": ("tutor.commands.learn", "learn", "Open the tutor app (at a lesson, if given)."),
    "lessons": ("tutor.commands.lessons", "lessons", "List the lessons and your progress."),
    "serve": ("tutor.commands.serve", "serve", "Run the tutor app in a browser on localhost."),
    "data": ("tutor.commands.data", "data", "Where your progress, settings and results live; reset them."),
}


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when that subcommand is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if _command_available(name)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or not _command_available(name):
            return None
        module_name, attribute, _ = COMMANDS[name]
        from tutor.commands.completion import attach

        return attach(name, getattr(importlib.import_module(module_name), attribute))

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help comes from COMMANDS so `--help` imports no subcommand module.
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _command_available(name: str) -> bool:
    module_name = COMMANDS[name][0]
    return importlib.util.find_spec(module_name) is not None


@click.group(cls=LazyGroup, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="tensor-tutor")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """tensor-tutor: the hardware behind large language models, explained and measured.

    Run with no command to open the tutor app (the same as `tensor-tutor learn`).
    """
    if ctx.invoked_subcommand is None:
        group = ctx.command  # this LazyGroup
        learn = group.get_command(ctx, "learn") if isinstance(group, click.Group) else None
        if learn is not None:
            ctx.invoke(learn)
            return
        click.echo(ctx.get_help())
        click.echo("\nTry: tensor-tutor fit llama-3.1-8b    tensor-tutor env    tensor-tutor models")


MIN_TERMINAL_COLUMNS = 20
"""Narrower than this is no terminal: a COLUMNS of 0 made Rich print nothing at all (exit 0, no answer)."""


def drop_unusable_terminal_size() -> None:
    """Remove COLUMNS / LINES values that are not a usable size (0, negative, text), so Rich measures the
    terminal itself (80 columns when it is not one) instead of drawing into zero columns."""
    for name, least in (("COLUMNS", MIN_TERMINAL_COLUMNS), ("LINES", 1)):
        value = os.environ.get(name)
        if value is not None and not (value.strip().isdigit() and int(value) >= least):
            del os.environ[name]


def main(argv: list[str] | None = None) -> None:
    """Entry point: bad input becomes one line on stderr and exit code 2, never a traceback."""
    drop_unusable_terminal_size()
    try:
        # Without standalone mode, click returns (rather than raises) the code of ctx.exit(n).
        code = cli.main(args=argv, prog_name="tensor-tutor", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except UserError as error:
        click.echo(f"tensor-tutor: error: {error}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("tensor-tutor: cancelled", err=True)
        sys.exit(130)
    except click.ClickException as error:
        # Usage errors (unknown option, bad choice) already carry their one-line message.
        click.echo(f"tensor-tutor: error: {error.format_message()}", err=True)
        sys.exit(2)
    except click.exceptions.Exit as exit_:
        sys.exit(exit_.exit_code)
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        # torch is a dependency, but an install with --no-deps (or a removed torch) still runs fit, models and env.
        click.echo(f"tensor-tutor: error: {TORCH_MISSING}", err=True)
        sys.exit(2)
