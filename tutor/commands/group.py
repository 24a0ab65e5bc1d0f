"""The click group behind `tensor-tutor`: every subcommand but the app's direct start (tutor/cli.py).

Each subcommand lives in `tutor/commands/<name>.py` (the table in tutor/commands/registry.py) and is
imported only when it runs, so that `tensor-tutor fit` never pays for torch or textual
(tests/test_layers.py enforces this).
"""

from __future__ import annotations

import importlib
import sys

import click

from tutor import __version__
from tutor.commands.registry import COMMANDS, command_available
from tutor.safe_text import plain
from tutor.errors import UserError

TORCH_MISSING = ("this command measures with PyTorch, which is not installed: pip install torch (on a CPU-only "
                 "machine: pip install torch --index-url https://download.pytorch.org/whl/cpu)")


class LazyGroup(click.Group):
    """A click group that imports a subcommand's module only when that subcommand is used."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if command_available(name)]

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS or not command_available(name):
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


def run(args: list[str]) -> None:
    """Run the command line `args` through click: bad input becomes one line on stderr and exit code 2,
    never a traceback."""
    try:
        from tutor.trace import announcing

        # What takes seconds the first time (a calibration traced) is said in one line before it starts, to a
        # person at a terminal; a script reading stderr gets only the answer or the one-line error.
        def say(text: str) -> None:
            if sys.stderr.isatty():
                click.echo(f"tensor-tutor: {plain(text)}", err=True)

        with announcing(say):
            # Without standalone mode, click returns (rather than raises) the code of ctx.exit(n).
            code = cli.main(args=args, prog_name="tensor-tutor", standalone_mode=False)
        if isinstance(code, int) and code:
            sys.exit(code)
    except UserError as error:
        click.echo(f"tensor-tutor: error: {plain(error)}", err=True)  # may quote a file or a library
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("tensor-tutor: cancelled", err=True)
        sys.exit(130)
    except click.ClickException as error:
        # Usage errors (unknown option, bad choice) already carry their one-line message.
        click.echo(f"tensor-tutor: error: {plain(error.format_message())}", err=True)
        sys.exit(2)
    except click.exceptions.Exit as exit_:
        sys.exit(exit_.exit_code)
    except ModuleNotFoundError as error:
        if error.name != "torch":
            raise
        # torch is a dependency, but an install with --no-deps (or a removed torch) still runs fit, models and env.
        click.echo(f"tensor-tutor: error: {TORCH_MISSING}", err=True)
        sys.exit(2)
