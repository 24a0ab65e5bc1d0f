"""`tensor-tutor lab NAME`: run one of the lessons' experiments headless (the same labs the app runs).

`lab` lists the labs from the registry's data (no lab module imported); `lab NAME --help` lists the
lab's parameters from the declaration it validates with (its `Param`s: default, accepted values,
unit), so the help cannot disagree with what a run accepts.
"""

from __future__ import annotations

import os
import re
import sys
import threading

import click

from tutor.commands.safe_text import as_text, markup_safe, plain, without_controls
from tutor.errors import UserError
from tutor.formatting import format_quantity
from tutor.commands.json_output import echo_json
from tutor.files.untrusted import UntrustedDataError, loads_toml

MAX_PARAM_BYTES = 1 << 16
"""The longest KEY=VALUE value read as TOML: a list of sizes is a few hundred bytes."""


def _params(pairs: tuple[str, ...], text_keys: frozenset[str] = frozenset()) -> dict:
    """KEY=VALUE pairs, each value read as TOML (numbers, booleans, ["lists"]) or else as text; a parameter in
    `text_keys` (a lab's text or choice parameters) keeps what was typed, so `tokens=2e12` stays "2e12"."""
    params = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise UserError(f"parameters are KEY=VALUE, got {pair!r} (e.g. dtypes='[\"fp32\",\"bf16\"]' budget_s=3)")
        name = key.strip()
        try:
            parsed = loads_toml(f"v = {value}", what="lab parameter", max_bytes=MAX_PARAM_BYTES)["v"]
        except UntrustedDataError as error:
            if name in text_keys:  # a text parameter keeps what was typed, whatever TOML makes of it
                params[name] = value.strip()
                continue
            if error.reason.startswith("is not valid TOML"):
                params[name] = value  # not a TOML value: the text as typed (a dtype name, a size like 1MiB)
                continue
            # A TOML value refused (a 5,000-digit integer, inf, a control character): said, never run.
            field = name + error.where.removeprefix("v") if error.where else name
            raise UserError(f"lab parameter {plain(field)} {error.reason}") from None
        params[name] = value.strip() if name in text_keys and not isinstance(parsed, str) else parsed
    return params


CANCEL_GRACE_S = 2.0


class LabStillRunning(KeyboardInterrupt):
    """Ctrl-C, and the lab's worker thread is still inside torch after CANCEL_GRACE_S: the interpreter must
    not be finalized under it (torch's C++ threads then abort the process: "terminate called without an
    active exception", exit 134)."""


class ProgressLine:
    """A lab's progress on stderr: one line redrawn in place on a terminal; on a pipe or a file,
    plain newline-terminated lines (no carriage returns), one when a new step starts and one per
    tenth of the run within a step, so a log stays short."""

    WIDTH = 70
    LOG_STEP = 0.1

    def __init__(self, stream=None) -> None:
        self.stream = stream
        self.shown = False
        self.logged: tuple[str, float] | None = None  # (step, fraction) of the last logged line

    def _stream(self):
        return self.stream or sys.stderr

    def _terminal(self) -> bool:
        stream = self._stream()
        return bool(getattr(stream, "isatty", None) and stream.isatty())

    def __call__(self, fraction: float, message: str) -> None:
        text = plain(message)
        if self._terminal():
            click.echo(f"\r[{fraction:4.0%}] {text[:self.WIDTH]:<{self.WIDTH}}", file=self._stream(), nl=False)
            self.shown = True
            return
        step = re.sub(r"\d[\d,.]*", "#", text)  # "routing batch 65 of 400" and "... 129 of 400": one step
        if self.logged is None or step != self.logged[0] or fraction - self.logged[1] >= self.LOG_STEP:
            click.echo(f"[{fraction:4.0%}] {text}", file=self._stream())
            self.logged = (step, fraction)

    def clear(self) -> None:
        """Erase the in-place line (terminal only), so what follows starts at column 0."""
        if self.shown:
            click.echo("\r" + " " * (self.WIDTH + 8) + "\r", file=self._stream(), nl=False)
            self.shown = False


def _run_interruptible(probe, values: dict, progress, cancel: threading.Event):
    """probe.run in a worker thread, so that Ctrl-C reaches this thread at once even while torch
    is inside one long kernel: it sets `cancel`, gives the lab CANCEL_GRACE_S to stop at its next
    check, and re-raises KeyboardInterrupt (the daemon worker ends with the process)."""
    outcome: dict = {}
    finished = threading.Event()

    def work() -> None:
        try:
            outcome["result"] = probe.run(values, progress, cancel)
        except BaseException as error:  # handed to the main thread
            outcome["error"] = error
        finally:
            finished.set()

    worker = threading.Thread(target=work, name=f"tensor-tutor-lab-{probe.name}", daemon=True)
    try:
        worker.start()  # inside the try: a Ctrl-C while the thread starts cancels it too
        while not finished.wait(0.1):  # an Event, not Thread.join: see CPython gh-90882
            pass
    except KeyboardInterrupt:
        cancel.set()
        if not finished.wait(CANCEL_GRACE_S):
            raise LabStillRunning() from None
        raise
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


PARAMS_SECTION = "Parameters (KEY=VALUE; a value is read as TOML: 3, 0.5, true, '[\"fp32\",\"bf16\"]', else as text)"


def _term(param) -> str:
    """KEY=DEFAULT as one would type it; the bare KEY when there is no default value."""
    typed = param.typed_default
    return param.name if typed is None else f"{param.name}={typed}"


def _param_text(param) -> str:
    """What one parameter means, what it accepts, and its unit."""
    unit = param.shown_unit
    accepted = param.accepted
    text = f"{param.help}. {accepted[:1].upper()}{accepted[1:]}"
    if unit:
        text += f"; unit: {unit}"
    return f"{text}."


def lab_help(ctx: click.Context, probe) -> str:
    """`tensor-tutor lab NAME --help`: the lab's title, description, parameters and options."""
    formatter = ctx.make_formatter()
    formatter.write_usage(f"{ctx.command_path} {probe.name}", "[KEY=VALUE]... [--json]")
    formatter.write_paragraph()
    with formatter.indentation():
        formatter.write_text(f"{probe.title}. {probe.description}")
    with formatter.section(PARAMS_SECTION):
        formatter.write_dl([(_term(param), _param_text(param)) for param in probe.params]
                           or [("(none)", "this lab takes no parameters")])
    with formatter.section("Options"):
        formatter.write_dl([("--json", "Print the result as one JSON object."),
                            ("-h, --help", "Show this message and exit.")])
    return formatter.getvalue().rstrip("\n")


@click.command("lab", add_help_option=False)
@click.argument("name", required=False)
@click.argument("params", nargs=-1)
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
@click.option("-h", "--help", "show_help", is_flag=True,
              help="Show this message and exit; with NAME, that lab's parameters (defaults, accepted values, units).")
@click.pass_context
def lab(ctx: click.Context, name: str | None, params: tuple[str, ...], as_json: bool, show_help: bool) -> None:
    """Run the experiment NAME with KEY=VALUE parameters; without NAME, list the experiments.

    `tensor-tutor lab NAME --help` lists NAME's parameters.
    """
    from tutor.labs.registry import LABS, load_lab

    if show_help:
        click.echo(ctx.get_help() if name is None else lab_help(ctx, load_lab(name)))
        return
    if name is None:
        if as_json:
            probes = [load_lab(lab_name) for lab_name in LABS]
            echo_json({"labs": [{"name": p.name, "title": p.title, "description": p.description,
                                 "params": p.params_schema, "defaults": p.default_params}
                                for p in probes]})
            return
        width = max(len(name) for name in LABS)
        for entry in LABS.values():
            click.echo(f"{entry.name:<{width}}  {entry.title}")
        return
    probe = load_lab(name)
    values = probe.check_params(_params(params, frozenset(p.name for p in probe.params if p.kind in ("text", "str"))))
    cancel = threading.Event()

    import io

    from tutor.bench.ranks import end_rank, torchrun_rank

    quiet = (torchrun_rank() or 0) != 0  # under torchrun every rank runs the lab; only rank 0 prints
    progress = ProgressLine(io.StringIO()) if quiet else ProgressLine()
    try:
        result = _run_interruptible(probe, values, progress, cancel)
    except UserError:
        progress.clear()  # the error line replaces the progress line
        raise
    except KeyboardInterrupt as interrupt:
        cancel.set()
        progress.clear()
        click.echo("cancelled", err=True)
        if isinstance(interrupt, LabStillRunning):
            # A lab keeps nothing on disk, so leaving without the interpreter's teardown loses nothing.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(130)
        sys.exit(130)
    progress.clear()
    if not quiet:
        _show(probe, result, as_json)
    if torchrun_rank() is not None:
        end_rank()  # the lab destroyed its process group: skip torch's teardown (see end_rank)


def _show(probe, result, as_json: bool) -> None:
    """A lab's result: one JSON object, or the table, the lab's drawing and the summary."""
    if as_json:
        echo_json(result.to_json())
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=markup_safe(f"{probe.title} ({result.device})"), title_justify="left")
    for column in ("measurement", "measured", "theory", "comparison", "note"):
        # Every column wraps at spaces, so at 80 columns a figure and its unit may take two lines but no word is cut.
        table.add_column(column, justify="right" if column in ("measured", "theory") else "left")
    for row in result.rows:
        measured = "-" if row.measured is None else format_quantity(row.measured, row.unit)
        theory = "-" if row.theory is None else format_quantity(row.theory, row.unit)
        table.add_row(as_text(row.label), measured, theory, as_text(row.comparison), as_text(row.note))
    console = Console()
    console.print(table)
    if probe.render is not None:
        console.print(probe.render(result))
    # Results quote parameters as typed (dir=...): never markup. A summary may hold several lines (the
    # figure first, its caveats after): they stay lines, any other control character is escaped.
    console.print(Text(without_controls(str(result.summary))))
