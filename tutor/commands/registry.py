"""The `tensor-tutor` subcommands: each one's module, its click command and its line in `--help`.

A plain table, so tutor/cli.py can tell whether the app is wanted without importing click
(tutor/commands/group.py builds the click group from it)."""

from __future__ import annotations

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


def command_available(name: str) -> bool:
    """Whether `name` is a command here and its module can be imported (found, not imported)."""
    import importlib.util

    return name in COMMANDS and importlib.util.find_spec(COMMANDS[name][0]) is not None
