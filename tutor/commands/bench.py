"""`tensor-tutor bench`: measure this machine and set each figure beside its theoretical peak.

    tensor-tutor bench                 matmul + bandwidth (+ transfer on a GPU; + collective with
                                       --ranks or on a machine with 2+ GPUs)
    tensor-tutor bench --quick         fp32/bf16/fp16 matmul + bandwidth in under 30 s
    tensor-tutor bench matmul --dtype fp32,bf16 --budget 20
    tensor-tutor bench bandwidth | transfer | collective --ranks 4
    tensor-tutor bench history [--compare 3 5]

`--json` prints {"device": {...}, "results": [...]} on stdout and nothing else (progress goes to
stderr). SIGINT (Ctrl-C), SIGTERM and SIGHUP stop within about a second, save and print what finished
as a cancelled run and exit 130, 143 or 129. Every run is appended to the results notebook as one
record (tutor.bench.record, tutor.bench.notebook).
"""

from __future__ import annotations

import math
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import click

from tutor.errors import UserError
from tutor.commands.json_output import echo_json


_OPTIONS: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
    "quick": click.option("--quick", is_flag=True, default=None, help="fp32/bf16/fp16 matmul and bandwidth, ~20 s."),
    "device": click.option("--device", default=None, help="cpu, cuda or cuda:N (default: the first GPU, else cpu)."),
    "dtype": click.option("--dtype", default=None, help="Matmul dtypes, comma-separated: fp32,tf32,bf16,fp16,fp8."),
    "budget": click.option("--budget", type=float, default=None, help="Seconds for the whole run (default 60)."),
    "quick_budget": click.option("--budget", type=float, default=None,
                                 help="Seconds for the whole run (default 60; 18 with --quick)."),
    "ranks": click.option("--ranks", type=int, default=None, help="Local processes for collectives (default 2)."),
    "ops": click.option("--ops", default=None, metavar="OPS",
                        help="Collectives, comma-separated: all_reduce,all_gather,reduce_scatter (default: all)."),
    "sizes": click.option("--sizes", default=None, metavar="SIZES",
                          help="Buffer sizes, comma-separated, e.g. 1M,16M,64MiB (default 4KiB to 64MiB by 4x); "
                               "measured smallest first, and sizes left when the budget is spent are skipped."),
    "svg": click.option("--svg", "svg", default=None, metavar="FILE",
                        help="Also save the run's pictures (sweeps, with their tables) as an SVG file."),
    "as_json": click.option("--json", "as_json", is_flag=True, default=None,
                            help="Print one JSON object ({\"device\": ..., \"results\": [...]}) and nothing else."),
}


_RUN_PARAMETERS = ("quick", "device", "dtype", "budget", "ranks", "ops", "sizes", "svg", "as_json")


def _run_options(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The options `names` (keys of _OPTIONS), in that order: each subcommand lists only its own."""
    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        for name in reversed(names):
            function = _OPTIONS[name](function)
        return function

    return decorate


def _merged(ctx: click.Context, options: dict[str, Any]) -> dict[str, Any]:
    """The group's options (`bench --budget 5 matmul`), with those given after the subcommand winning."""
    parent = (ctx.parent.params if ctx.parent is not None else {}) or {}
    merged = {key: value for key, value in parent.items() if value is not None}
    merged.update({key: value for key, value in options.items() if value is not None})
    return {key: merged.get(key) for key in {*_RUN_PARAMETERS, *options}}


@click.group(name="bench", invoke_without_command=True)
@_run_options("quick", "device", "dtype", "quick_budget", "ranks", "svg", "as_json")
@click.pass_context
def bench(ctx: click.Context, **options: Any) -> None:
    """Measure this machine against its datasheet (matmul, bandwidth, transfer, collective).

    A bare `bench` runs matmul and bandwidth (plus transfer on a GPU, and collectives with --ranks
    or 2+ GPUs) and saves the run to the results notebook; SIGINT, SIGTERM and SIGHUP stop it,
    keep what finished, record the run as cancelled and exit 130, 143 or 129."""
    if ctx.invoked_subcommand is None:
        _run(ctx, None, _merged(ctx, options))


@bench.command(short_help="Maximum achievable matmul TFLOP/s per dtype (mamf-style shape sweep).")
@_run_options("dtype", "device", "budget", "svg", "as_json")
@click.pass_context
def matmul(ctx: click.Context, **options: Any) -> None:
    """Maximum achievable matmul TFLOP/s per dtype (mamf-style shape sweep), and with fp32 one
    fixed-size square that every run measures, so any two runs compare."""
    _run(ctx, ("matmul",), _merged(ctx, options))


@bench.command(short_help="STREAM-like copy, scale, add, triad, read-only and write-only GB/s.")
@_run_options("device", "budget", "svg", "as_json")
@click.pass_context
def bandwidth(ctx: click.Context, **options: Any) -> None:
    """STREAM-like copy, scale, add, triad, read-only and write-only GB/s, and on a CPU copy and
    triad against the working set from below L1 to beyond the last-level cache (one thread)."""
    _run(ctx, ("bandwidth",), _merged(ctx, options))


@bench.command(short_help="Host-to-device and device-to-host GB/s, pinned and pageable (needs CUDA).")
@_run_options("device", "budget", "as_json")
@click.pass_context
def transfer(ctx: click.Context, **options: Any) -> None:
    """Host-to-device and device-to-host GB/s, pinned and pageable (needs CUDA)."""
    _run(ctx, ("transfer",), _merged(ctx, options))


@bench.command(short_help="all_reduce, all_gather, reduce_scatter algbw/busbw across local ranks.")
@_run_options("ranks", "ops", "sizes", "budget", "svg", "as_json")
@click.pass_context
def collective(ctx: click.Context, **options: Any) -> None:
    """all_reduce, all_gather, reduce_scatter algbw/busbw across local ranks (gloo, or NCCL with a
    GPU per rank), as nccl-tests defines them. Across nodes, under torchrun:
    `torchrun ... -m tutor.bench.collective --json` (see README)."""
    _run(ctx, ("collective",), _merged(ctx, options))


@bench.command(short_help="List stored runs, or compare two of them.")
@click.option("--compare", nargs=2, type=int, default=None, metavar="A B", help="Ratios B/A per matching case.")
@click.option("--plot", "plot", type=int, default=None, metavar="N",
              help="Draw run N's sweeps (matmul throughput, bandwidth across the caches, busbw against message "
                   "size) with their tables.")
@click.option("--svg", "svg", default=None, metavar="FILE", help="With --plot: also save the pictures as SVG.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON only.")
@click.pass_context
def history(ctx: click.Context, compare: tuple[int, int] | None, plot: int | None, svg: str | None,
            as_json: bool) -> None:
    """List stored runs, compare two of them, or draw one run's sweeps."""
    from tutor.safe_text import markup_escape as escape

    from tutor.bench.notebook import case_sizes, compare_runs, notebook_path, read_notebook, run_headlines

    as_json = as_json or bool(_merged(ctx, {"as_json": None}).get("as_json"))
    if svg is not None and plot is None:
        raise UserError("--svg needs --plot N (which run to draw)")
    _check_svg_path(svg)
    notebook = read_notebook()
    if notebook.warning:
        click.echo(f"tensor-tutor: warning: {notebook.warning}", err=True)
    runs = {run.number: run for run in notebook.runs}
    if plot is not None:
        if plot not in runs:
            raise UserError(f"no run number {plot} in the notebook (runs 1..{len(runs)}; see `bench history`)")
        _show_pictures(runs[plot].results, runs[plot].header, svg, as_json=as_json)
        return
    if compare is not None:
        for number in compare:
            if number not in runs:
                raise UserError(f"no run number {number} in the notebook (runs 1..{len(runs)}; see `bench history`)")
        before, after = runs[compare[0]], runs[compare[1]]
        rows = compare_runs(before, after)
        old_sizes, new_sizes = case_sizes(before), case_sizes(after)
        sizes = [(old_sizes.get(row.case) or None, new_sizes.get(row.case) or None) for row in rows]
        if as_json:
            echo_json({"before": compare[0], "after": compare[1],
                       "cases": [{**row.__dict__, "figure_label": _figure_label(row.figure),
                                  "label": f"{row.statistic} at {sizes[i][1]}"
                                  if sizes[i][0] == sizes[i][1] and sizes[i][1] else row.statistic,
                                  "size_before": sizes[i][0], "size_after": sizes[i][1],
                                  "sizes_differ": sizes[i][0] != sizes[i][1]}
                                 for i, row in enumerate(rows)]}, indent=None)
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
            unit = row.unit
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
        echo_json({"notebook": str(notebook_path()), "corrupt_lines": notebook.corrupt_lines,
                   "set_aside": [str(path) for path in notebook.set_aside],
                   "runs": [{"number": run.number, "run_id": run.id, "date": run.date,
                             "device": run.device, "status": run.status, "cancelled": run.cancelled,
                             "headlines": run_headlines(run),
                             "figures": [{"name": figure.name, "case": figure.case.name,
                                          **figure.headline.to_json()} for figure in run.figures()]}
                            for run in notebook.runs]}, indent=None)
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
        figures = ", ".join(figure.text() for figure in run.figures())
        if run.cancelled:
            figures = f"cancelled: partial; {figures}" if figures else "cancelled before any result"
        table.add_row(f"{run.number}{' (cancelled)' if run.cancelled else ''}", escape(run.date),
                      escape(run.device), escape(figures))
    console.print(table)


_FIGURE_LABELS = {"tflops_median": "median FLOP/s", "gbps_median": "median B/s", "busbw_gbps": "bus bandwidth"}


def _figure_label(field: str) -> str:
    """A notebook field as a reader names it: tflops_median -> 'median FLOP/s'."""
    return _FIGURE_LABELS.get(field, field.replace("_", " "))


def _check_svg_path(svg: str | None) -> None:
    """A --svg FILE whose folder does not exist is bad input, said before anything is measured."""
    if svg is None:
        return
    from pathlib import Path

    if not svg.strip() or Path(svg).is_dir() or not Path(svg).expanduser().resolve().parent.is_dir():
        raise UserError(f"--svg: cannot write {svg!r} (its folder does not exist, or it is a folder)")
    if Path(svg).exists() and not Path(svg).is_file():  # a FIFO would block the write forever
        raise UserError(f"--svg: {svg!r} is not a regular file (a pipe or device?)")


def _show_pictures(results: Any, header: dict[str, Any], svg: str | None, *, as_json: bool) -> None:
    """A run's pictures with their tables on stdout (unless --json), and in the SVG file when asked."""
    from tutor.answers.pictures import bench_charts, print_chart, save_svg

    charts = bench_charts([dict(result) for result in results], header)
    if not as_json:
        from rich.console import Console

        console = Console()
        if not charts:
            console.print("no sweep of two or more sizes in this run to draw")
        for chart in charts:
            print_chart(chart, console)
    if svg is not None:
        if not charts:
            raise UserError("nothing to save: no sweep of two or more sizes in this run")
        from tutor.export import export_context

        dtypes = list(dict.fromkeys(str(r["dtype"]) for r in results if isinstance(r, dict) and r.get("dtype")))
        device = header.get("device_under_test") or header.get("device")
        path = save_svg(charts, svg, context=export_context(dtype=dtypes, device=device).line())
        click.echo(f"tensor-tutor: saved the pictures to {path}", err=True)


def _validate(options: dict[str, Any]) -> None:
    budget, ranks = options.get("budget"), options.get("ranks")
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise UserError(f"--budget must be a positive number of seconds (finite), got {budget:g}")
    if ranks is not None and ranks < 1:
        raise UserError(f"--ranks must be at least 1, got {ranks}")
    _check_svg_path(options.get("svg"))


STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))
"""Ctrl-C; `timeout`, CI cancellation, `systemctl stop`, `docker stop`; a closed terminal."""


def exit_code_for(signum: int) -> int:
    """The shell's code for a process ended by a signal: 128 + its number (130 SIGINT, 143 SIGTERM, 129 SIGHUP)."""
    return 128 + signum


class _Interrupts:
    """SIGINT, SIGTERM and SIGHUP for the whole of a bench run, as a flag rather than only an exception.

    Python's own SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be: inside a
    finaliser or a weakref callback while torch loads it is printed as "Exception ignored" and lost
    (the run then ignores the Ctrl-C), and after the results it escapes and the interpreter kills
    itself with SIGINT (exit -2, nothing saved); SIGTERM and SIGHUP kill at once, saving nothing. This
    handler records the first signal in `signum` (every one sets `seen`), sets `cancel` (the suite
    stops at its next iteration boundary and what finished is saved as a cancelled run), and raises
    KeyboardInterrupt only while `raising` (torch's import, which only an exception can stop); `seen`
    is checked after each phase so a swallowed exception still counts."""

    def __init__(self) -> None:
        self.seen = threading.Event()
        self.cancel = threading.Event()
        self.raising = True
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    @property
    def exit_code(self) -> int:
        return exit_code_for(self.signum if self.signum is not None else signal.SIGINT)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        self.seen.set()
        self.cancel.set()
        if self.raising:
            raise KeyboardInterrupt

    def __enter__(self) -> "_Interrupts":
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)


def _run(ctx: click.Context, kinds: tuple[str, ...] | None, options: dict[str, Any]) -> None:
    _validate(options)
    with _Interrupts() as interrupts:
        _run_interruptible(kinds, options, interrupts)


def _quietly(interrupts: _Interrupts, write: Callable[[], None]) -> None:
    """Write output; after a SIGHUP the terminal may be gone (EIO, EPIPE): then the output goes to
    /dev/null rather than ending in a traceback (the run is already saved)."""
    try:
        write()
        sys.stdout.flush()
    except OSError:
        if not interrupts.seen.is_set():
            raise
        import os

        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.dup2(null, sys.stderr.fileno())


def _run_interruptible(kinds: tuple[str, ...] | None, options: dict[str, Any], interrupts: _Interrupts) -> None:
    quick, as_json = bool(options.get("quick")), bool(options.get("as_json"))
    command = "tensor-tutor bench " + " ".join(sys.argv[2:])
    try:
        device, machine, cases, budget = _plan(kinds, options, quick)
        interrupts.raising = False  # from here on a signal is the cancel event, never an exception
        if interrupts.seen.is_set():  # a KeyboardInterrupt that something inside the import swallowed
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        interrupts.raising = False
        # Stopped while torch loads: nothing finished, but a --json caller still gets JSON.
        def say() -> None:
            if as_json:
                echo_json({"device": _bare_header(command, options), "results": []}, indent=None)
            click.echo("tensor-tutor: cancelled before any measurement finished", err=True)

        _quietly(interrupts, say)
        sys.exit(interrupts.exit_code)
    from tutor.bench.memory import memory_accounting
    from tutor.bench.notebook import append_run
    from tutor.bench.record import suite_run_record

    outcome, _ = _run_with_progress(cases, budget, cancel=interrupts.cancel)
    record = suite_run_record(outcome, machine=machine, device=device, command=command, budget_s=budget,
                              cancelled=interrupts.seen.is_set(), memory=memory_accounting(device).to_json(),
                              failures=outcome.failures)
    warning = append_run(record)
    header, results = record.header, list(record.results)

    def report() -> None:
        if warning:
            click.echo(f"tensor-tutor: warning: {warning}", err=True)
        for failure in outcome.failures:
            click.echo(f"tensor-tutor: warning: {failure}", err=True)
        if as_json:
            echo_json({"device": header, "results": results}, default=str, indent=None)
        else:
            from tutor.bench.render import render_results

            render_results(outcome.results, header)
        if not as_json or options.get("svg"):
            _show_pictures(results, header, options.get("svg"), as_json=as_json)
        collectives = [result for result in outcome.results if result.kind == "collective"]
        if collectives:
            from tutor.bench.collective import budget_note

            if note := budget_note(collectives):
                click.echo(f"tensor-tutor: note: {note}", err=True)
        if interrupts.seen.is_set():
            click.echo("tensor-tutor: cancelled; the results above are what finished (saved as a cancelled run)",
                       err=True)
        elif not as_json and not (warning or "").startswith("results not saved"):
            from tutor.bench.notebook import notebook_path

            where = "cpu" if device == "cpu" else device.removeprefix("cuda:")
            timed = any(result.get("kind") == "matmul" for result in results)
            click.echo(f"saved to {notebook_path()} (`tensor-tutor bench history` lists the runs); next: "
                       + (f"`tensor-tutor time llama-3.2-1b --device {where}` times a model from these figures"
                          if timed else "`tensor-tutor bench --quick` adds the matmul rates `tensor-tutor time` needs"))

    _quietly(interrupts, report)
    if interrupts.seen.is_set():
        # sys.exit, not ctx.exit: click's main(standalone_mode=False) returns an Exit's code
        # instead of exiting with it, and tutor.cli.main ignores that return value.
        sys.exit(interrupts.exit_code)
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
    ops, sizes = _collective_choices(options)
    machine = load_machine()
    cases = suite.plan_suite(kinds, device=device, machine=machine, dtypes=dtypes, ranks=options.get("ranks"),
                             quick=quick, ops=ops, sizes=sizes)
    return device, machine, cases, budget


def _collective_choices(options: dict[str, Any]) -> tuple[tuple[str, ...] | None, tuple[int, ...] | None]:
    """--ops and --sizes as tuples (None: the defaults); a bad name or size is a UserError (exit 2)."""
    from tutor.bench.collective import COLLECTIVE_OPS, parse_sizes

    ops = None
    if options.get("ops") is not None:
        ops = tuple(dict.fromkeys(part.strip() for part in str(options["ops"]).split(",") if part.strip()))
        unknown = [op for op in ops if op not in COLLECTIVE_OPS]
        if unknown or not ops:
            raise UserError(f"unknown collective {', '.join(map(repr, unknown)) or 'list (empty)'} "
                            f"(choose from {', '.join(COLLECTIVE_OPS)})")
    sizes = parse_sizes(options["sizes"]) if options.get("sizes") is not None else None
    if sizes is not None and (not sizes or min(sizes) <= 0):
        raise UserError(f"--sizes must be positive sizes such as 1M,64M, got {options['sizes']!r}")
    return ops, sizes


def _bare_header(command: str, options: dict[str, Any]) -> dict[str, Any]:
    """The header of a run cancelled before the environment could be described."""
    import datetime as _dt

    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "command": command,
            "device_under_test": options.get("device"), "cancelled": True, "status": "cancelled"}


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
