"""`tensor-tutor bench`: measure this machine and set each figure beside its theoretical peak.

    tensor-tutor bench                 matmul + bandwidth (+ transfer on a GPU; + collective with
                                       --ranks or on a machine with 2+ GPUs)
    tensor-tutor bench --quick         fp32/bf16/fp16 matmul + bandwidth in under 30 s
    tensor-tutor bench matmul --dtype fp32,bf16 --budget 20
    tensor-tutor bench bandwidth | transfer | collective --ranks 4
    tensor-tutor bench history [--compare 3 5]

`--json` prints {"device": {...}, "results": [...]} on stdout and nothing else (progress goes to
stderr). Ctrl-C stops within about a second, prints what finished and exits 130. Every run is
appended to the results notebook (see tutor.bench.notebook).
"""

from __future__ import annotations

import json
import math
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import click

from tutor.errors import UserError


def _run_options(function: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--quick", is_flag=True, default=None, help="fp32/bf16/fp16 matmul and bandwidth, ~20 s."),
        click.option("--device", default=None, help="cpu, cuda or cuda:N (default: the first GPU, else cpu)."),
        click.option("--dtype", default=None, help="Matmul dtypes, comma-separated: fp32,tf32,bf16,fp16,fp8."),
        click.option("--budget", type=float, default=None, help="Seconds for the whole run (default 60; 18 with --quick)."),
        click.option("--ranks", type=int, default=None, help="Local processes for collectives (default 2)."),
        click.option("--json", "as_json", is_flag=True, default=None, help="Print JSON only."),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def _merged(ctx: click.Context, options: dict[str, Any]) -> dict[str, Any]:
    """Options given after the subcommand win over those given before it."""
    parent = (ctx.parent.params if ctx.parent is not None else {}) or {}
    return {key: options[key] if options.get(key) is not None else parent.get(key) for key in options}


@click.group(name="bench", invoke_without_command=True)
@_run_options
@click.pass_context
def bench(ctx: click.Context, **options: Any) -> None:
    """Measure this machine against its datasheet (matmul, bandwidth, transfer, collective)."""
    if ctx.invoked_subcommand is None:
        _run(ctx, None, options)


@bench.command()
@_run_options
@click.pass_context
def matmul(ctx: click.Context, **options: Any) -> None:
    """Maximum achievable matmul TFLOP/s per dtype (mamf-style shape sweep)."""
    _run(ctx, ("matmul",), _merged(ctx, options))


@bench.command()
@_run_options
@click.pass_context
def bandwidth(ctx: click.Context, **options: Any) -> None:
    """STREAM-like copy, scale, add, triad, read-only and write-only GB/s."""
    _run(ctx, ("bandwidth",), _merged(ctx, options))


@bench.command()
@_run_options
@click.pass_context
def transfer(ctx: click.Context, **options: Any) -> None:
    """Host-to-device and device-to-host GB/s, pinned and pageable (needs CUDA)."""
    _run(ctx, ("transfer",), _merged(ctx, options))


@bench.command()
@_run_options
@click.pass_context
def collective(ctx: click.Context, **options: Any) -> None:
    """all_reduce, all_gather, reduce_scatter algbw/busbw across local ranks (gloo or NCCL)."""
    _run(ctx, ("collective",), _merged(ctx, options))


@bench.command()
@click.option("--compare", nargs=2, type=int, default=None, metavar="A B", help="Ratios B/A per matching case.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.pass_context
def history(ctx: click.Context, compare: tuple[int, int] | None, as_json: bool) -> None:
    """List stored runs, or compare two of them."""
    from rich.markup import escape

    from tutor.bench.notebook import case_sizes, compare_runs, notebook_path, read_notebook, run_headlines

    as_json = as_json or bool(_merged(ctx, {"as_json": None}).get("as_json"))
    notebook = read_notebook()
    if notebook.warning:
        click.echo(f"tensor-tutor: warning: {notebook.warning}", err=True)
    runs = {run.number: run for run in notebook.runs}
    if compare is not None:
        for number in compare:
            if number not in runs:
                raise UserError(f"no run number {number} in the notebook (runs 1..{len(runs)}; see `bench history`)")
        before, after = runs[compare[0]], runs[compare[1]]
        rows = compare_runs(before, after)
        old_sizes, new_sizes = case_sizes(before), case_sizes(after)
        sizes = [(old_sizes.get(row.case) or None, new_sizes.get(row.case) or None) for row in rows]
        if as_json:
            click.echo(json.dumps({"before": compare[0], "after": compare[1],
                                   "cases": [{**row.__dict__, "figure_label": _figure_label(row.figure),
                                              "size_before": sizes[i][0], "size_after": sizes[i][1],
                                              "sizes_differ": sizes[i][0] != sizes[i][1]}
                                             for i, row in enumerate(rows)]}))
            return
        from rich.console import Console
        from rich.table import Table

        from tutor.formatting import format_quantity

        table = Table(title=f"run {compare[1]} against run {compare[0]}", title_justify="left")
        for column in ("case", "figure", f"run {compare[0]}", f"run {compare[1]}", "ratio"):
            table.add_column(column, justify="right" if column not in ("case", "figure") else "left",
                             no_wrap=column == "ratio", overflow="fold")
        differing = 0
        for row, (size_before, size_after) in zip(rows, sizes):
            unit = _FIGURE_UNITS.get(row.figure, "")
            ratio = f"{format_quantity(row.ratio, 'x')}"
            case = escape(row.case)
            if size_before != size_after:
                differing += 1
                ratio = "[yellow]sizes differ[/]"
                case += f" ({escape(size_before or '?')} vs {escape(size_after or '?')})"
            table.add_row(case, _figure_label(row.figure), format_quantity(row.before, unit),
                          format_quantity(row.after, unit), ratio)
        console = Console()
        console.print(table if rows else "no case appears in both runs")
        if differing:
            console.print(f"[yellow]{differing} case(s) were measured at different sizes: no ratio is given, "
                          "since throughput depends on the size (small problems do not reach the peak). "
                          "Compare runs made with the same options.[/]")
        return
    if as_json:
        click.echo(json.dumps({"notebook": str(notebook_path()), "corrupt_lines": notebook.corrupt_lines,
                               "set_aside": [str(path) for path in notebook.set_aside],
                               "runs": [{"number": run.number, "date": run.date, "device": run.device,
                                         "cancelled": run.cancelled, "headlines": run_headlines(run)}
                                        for run in notebook.runs]}))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not notebook.runs:
        console.print(f"no runs stored yet in {escape(str(notebook_path()))} (run `tensor-tutor bench --quick`)")
        return
    from tutor.commands.tables import ID_COLUMN, PROSE_COLUMN

    table = Table(title=f"runs in {escape(str(notebook_path()))}", title_justify="left")
    for column in ("#", "date", "device", "headline figures"):
        table.add_column(column, **(ID_COLUMN if column == "#" else PROSE_COLUMN))
    for run in notebook.runs:
        figures = ", ".join(_headline_text(label, value) for label, value in run_headlines(run).items())
        if run.cancelled:
            figures = f"cancelled: partial; {figures}" if figures else "cancelled before any result"
        table.add_row(f"{run.number}{' (cancelled)' if run.cancelled else ''}", escape(run.date),
                      escape(run.device), escape(figures))
    console.print(table)


_FIGURE_UNITS = {"tflops_median": "TFLOP/s", "gbps_median": "GB/s", "busbw_gbps": "GB/s"}
_FIGURE_LABELS = {"tflops_median": "median FLOP/s", "gbps_median": "median B/s", "busbw_gbps": "bus bandwidth"}


def _figure_label(field: str) -> str:
    """A notebook field as a reader names it: tflops_median -> 'median FLOP/s'."""
    return _FIGURE_LABELS.get(field, field.replace("_", " "))


def _headline_text(label: str, value: float) -> str:
    """'fp32 TFLOP/s', 0.134 -> 'fp32 134 GFLOP/s': the unit rescaled so the mantissa reads 1..999."""
    from tutor.formatting import format_rate

    name, _, unit = label.rpartition(" ")
    return f"{name} {format_rate(value, unit)}".strip()


def _validate(options: dict[str, Any]) -> None:
    budget, ranks = options.get("budget"), options.get("ranks")
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise UserError(f"--budget must be a positive number of seconds (finite), got {budget:g}")
    if ranks is not None and ranks < 1:
        raise UserError(f"--ranks must be at least 1, got {ranks}")


class _Interrupts:
    """Ctrl-C for the whole of a bench run, as a flag rather than only an exception.

    Python's own handler raises KeyboardInterrupt wherever the main thread happens to be: inside a
    finaliser or a weakref callback while torch loads it is printed as "Exception ignored" and lost
    (the run then ignores the Ctrl-C), and after the results it escapes and the interpreter kills
    itself with SIGINT (exit -2, nothing saved). This handler records every Ctrl-C in `seen`, sets
    `cancel` (the suite stops at its next iteration boundary), and raises KeyboardInterrupt only
    while `raising` (torch's import, which only an exception can stop); `seen` is checked after
    each phase so a swallowed exception still counts."""

    def __init__(self) -> None:
        self.seen = threading.Event()
        self.cancel = threading.Event()
        self.raising = True
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        self.seen.set()
        self.cancel.set()
        if self.raising:
            raise KeyboardInterrupt

    def __enter__(self) -> "_Interrupts":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _run(ctx: click.Context, kinds: tuple[str, ...] | None, options: dict[str, Any]) -> None:
    _validate(options)
    with _Interrupts() as interrupts:
        _run_interruptible(kinds, options, interrupts)


def _run_interruptible(kinds: tuple[str, ...] | None, options: dict[str, Any], interrupts: _Interrupts) -> None:
    quick, as_json = bool(options.get("quick")), bool(options.get("as_json"))
    command = "tensor-tutor bench " + " ".join(sys.argv[2:])
    try:
        device, machine, cases, budget = _plan(kinds, options, quick)
        interrupts.raising = False  # from here on a Ctrl-C is the cancel event, never an exception
        if interrupts.seen.is_set():  # a KeyboardInterrupt that something inside the import swallowed
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        interrupts.raising = False
        # Ctrl-C while torch loads: nothing finished, but a --json caller still gets JSON.
        if as_json:
            click.echo(json.dumps({"device": _bare_header(command, options), "results": []}))
        click.echo("tensor-tutor: cancelled before any measurement finished", err=True)
        sys.exit(130)
    outcome, _ = _run_with_progress(cases, budget, cancel=interrupts.cancel)
    from tutor.bench.environment import environment_header
    from tutor.bench.memory import memory_accounting

    header = environment_header(machine, command=command)
    header["memory"] = memory_accounting(device).to_json()
    interrupted = interrupts.seen.is_set()
    header["device_under_test"] = device
    header["budget_s"] = budget
    header["elapsed_s"] = round(outcome.elapsed_s, 3)
    header["cancelled"] = outcome.cancelled or interrupted
    results = outcome.to_json()
    from tutor.bench.notebook import append_run

    warning = append_run(header, results)
    if warning:
        click.echo(f"tensor-tutor: warning: {warning}", err=True)
    for failure in outcome.failures:
        click.echo(f"tensor-tutor: warning: {failure}", err=True)
    if as_json:
        click.echo(json.dumps({"device": header, "results": results}, default=str))
    else:
        from tutor.bench.render import render_results

        render_results(outcome.results, header)
    if interrupted or interrupts.seen.is_set():
        click.echo("tensor-tutor: cancelled; the results above are what finished", err=True)
        # sys.exit, not ctx.exit: click's main(standalone_mode=False) returns an Exit's code
        # instead of exiting with it, and tutor.cli.main ignores that return value.
        sys.exit(130)
    if outcome.failures and not outcome.results:
        sys.exit(1)


def _plan(kinds: tuple[str, ...] | None, options: dict[str, Any], quick: bool) -> tuple[str, Any, list[Any], float]:
    """The device, machine, cases and budget of a run (this is where torch is imported)."""
    from tutor.bench import suite
    from tutor.bench.environment import load_machine, resolve_device
    from tutor.bench.matmul import parse_dtypes

    device = resolve_device(options.get("device"))
    dtype_text = options.get("dtype")
    if quick and dtype_text is None:
        dtype_text = ",".join(d for d in ("fp32", "bf16", "fp16") if d in parse_dtypes(None, device))
    dtypes = parse_dtypes(dtype_text, device)
    if kinds is None:
        kinds = ("matmul", "bandwidth") if quick else suite.default_kinds(device, ranks=options.get("ranks"))
    if "transfer" in kinds and not device.startswith("cuda"):
        raise UserError("host<->device transfers need a CUDA device (this run is on cpu)")
    budget = options.get("budget") or (suite.QUICK_BUDGET_S if quick else suite.DEFAULT_BUDGET_S)
    machine = load_machine()
    cases = suite.plan_suite(kinds, device=device, machine=machine, dtypes=dtypes, ranks=options.get("ranks"),
                             quick=quick)
    return device, machine, cases, budget


def _bare_header(command: str, options: dict[str, Any]) -> dict[str, Any]:
    """The header of a run cancelled before the environment could be described."""
    import datetime as _dt

    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "command": command,
            "device_under_test": options.get("device"), "cancelled": True}


def _run_with_progress(cases: list[Any], budget: float, cancel: threading.Event | None = None) -> tuple[Any, bool]:
    """Run the suite in a worker thread so Ctrl-C reaches the main thread at once; it sets the
    cancel event and the worker stops at its next iteration boundary."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from tutor.bench.suite import run_suite

    cancel = cancel if cancel is not None else threading.Event()
    holder: dict[str, Any] = {}
    console = Console(stderr=True)
    # A bar redrawn in place is for a terminal; a pipe or a log file gets one plain line per finished case.
    progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                        TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal)
    task = progress.add_task("bench", total=len(cases))

    def on_progress(event: Any) -> None:
        progress.update(task, completed=event.index + (event.state != "start"),
                        description=f"{event.case} ({event.state})")
        if not console.is_terminal and event.state != "start":
            click.echo(f"[{event.index + 1}/{event.total}] {event.case}: {event.state}", err=True)

    finished = threading.Event()

    def work() -> None:
        try:
            holder["outcome"] = run_suite(cases, budget_s=budget, progress=on_progress, cancel=cancel)
        except BaseException as error:  # handed to the main thread
            holder["error"] = error
        finally:
            finished.set()

    # Waiting on an Event, not Thread.join: a KeyboardInterrupt inside join() can leave the thread
    # looking dead while it still runs (CPython gh-90882).
    worker = threading.Thread(target=work, name="tensor-tutor-bench", daemon=True)
    interrupted = False
    with progress:
        worker.start()
        while not finished.is_set():
            try:
                finished.wait(0.1)
            except KeyboardInterrupt:
                interrupted = True
                cancel.set()
    if "error" in holder:
        raise holder["error"]
    return holder["outcome"], interrupted
