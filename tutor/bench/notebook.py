"""The results notebook: one JSON line per benchmark run in the user data dir.

Each line is one run record (tutor.bench.record.BenchRun): {"notebook_version", "run_id", "status",
"header": {...environment...}, "results": [...]} (version 1 lines have no run id or status and read
the same); lines are
appended whole with one os.write on an O_APPEND descriptor and fsync'd, so concurrent runs never
interleave and a crash leaves at most one torn last line. Before appending, a torn last line (no
final newline, or one that does not parse) is moved to a side file `results.jsonl.torn-<UTC time>`
and cut off, so the new run starts on a line of its own and is never swallowed by the torn one.
Reading skips lines that do not parse and counts them. A notebook that cannot be written costs a
warning, never the run.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tutor.bench.record import HEADLINE_STATISTIC, BenchRun, CaseResult, Headline, new_run_id
from tutor.hardware.machine import Machine
from tutor.safe_text import plain
from tutor.files.untrusted import (CPYTHON_INT_DIGITS, NUMBER, OBJECTS, POSITIVE_NUMBER, POSITIVE_WHOLE, WHOLE, Kind,
                             UntrustedDataError, check_fields, loads_json)

NOTEBOOK_FILE = "results.jsonl"
NOTEBOOK_VERSION = 1
TORN_TAG = "torn"
_TAIL_BLOCK = 1 << 16
NOTEBOOK_LIMIT_BYTES = 512 << 20
"""The largest notebook read (some 50,000 runs): a bigger file is named in a warning, not loaded."""


def notebook_path() -> Path:
    """results.jsonl in tutor.files.storage.data_dir() (the one place the learner's files live)."""
    from tutor.files.storage import data_dir

    return data_dir() / NOTEBOOK_FILE


def _read_at(fd: int, count: int, offset: int) -> bytes:
    """os.pread where it exists; seek + read elsewhere (Windows). Writes ignore the position:
    the descriptor is O_APPEND."""
    if hasattr(os, "pread"):
        return os.pread(fd, count, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.read(fd, count)


def _last_line_start(fd: int, size: int) -> int:
    """Offset of the first byte of the file's last line (the byte after the last newline that is
    not the file's final byte). Reads backwards in blocks: a notebook can hold thousands of runs."""
    end = size - 1  # a final newline belongs to the last line
    while end > 0:
        start = max(0, end - _TAIL_BLOCK)
        block = _read_at(fd, end - start, start)
        newline = block.rfind(b"\n")
        if newline >= 0:
            return start + newline + 1
        end = start
    return 0


def _parses(data: bytes) -> bool:
    """Whether a line is whole JSON. Valid JSON that is not a run is left in place (read_notebook
    counts it): only a line cut short by a torn write is moved aside."""
    try:
        loads_json(data, what=NOTEBOOK_FILE, max_bytes=NOTEBOOK_LIMIT_BYTES, strings="keep", non_finite="keep",
                   max_chars=NOTEBOOK_LIMIT_BYTES)
    except UntrustedDataError as error:
        return bool(error.where)  # whole JSON holding a value refused (a huge integer) is no torn write
    return True


def _set_aside_torn_tail(fd: int, target: Path) -> str | None:
    """Move a torn last line (no final newline, or unparsable) to a side file and cut it off.
    Returns a one-line note naming the side file, or None when the tail is whole."""
    size = os.fstat(fd).st_size
    if size == 0:
        return None
    start = _last_line_start(fd, size)
    tail = _read_at(fd, size - start, start)
    whole = tail.endswith(b"\n")
    if whole and (not tail.strip() or _parses(tail)):
        return None
    from tutor.files.storage import side_file_name

    side = side_file_name(target, TORN_TAG)
    with open(side, "xb") as handle:
        handle.write(tail)
        handle.flush()
        os.fsync(handle.fileno())
    os.ftruncate(fd, start)
    why = "did not parse" if whole else "had no final newline"
    return f"the notebook's last line {why} (a torn write); moved its {len(tail):,} bytes to {side.name}"


def _lock(fd: int) -> None:
    """An exclusive advisory lock while the tail is checked and the run appended (POSIX only:
    elsewhere O_APPEND alone keeps whole lines apart, and a torn tail is still set aside)."""
    try:
        import fcntl
    except ImportError:
        return
    fcntl.flock(fd, fcntl.LOCK_EX)


def append_run(header: dict[str, Any] | BenchRun, results: Sequence[dict[str, Any]] = (),
               path: Path | None = None) -> str | None:
    """Append one run as one line: a BenchRun (tutor.bench.record), or a header and its results.
    Returns None on success, else a one-line warning (which also reports a torn last line that was set
    aside before this run was saved)."""
    target = path or notebook_path()
    run = header if isinstance(header, BenchRun) else BenchRun(
        number=0, header=header, results=tuple(results), run_id=new_run_id())
    record = run.to_json()
    try:
        line = (json.dumps(record, separators=(",", ":"), allow_nan=False, default=str) + "\n").encode()
    except ValueError as error:
        return f"results not saved: {error}"
    from tutor.files.storage import NotAFileError, open_for_append

    note = None
    try:
        # Non-blocking, then checked: a FIFO in the notebook's place would block a write larger than the
        # pipe's buffer (or a read of its tail) forever, and a device is no notebook. Never through a
        # link: a symlinked or hard-linked notebook is moved aside and this run starts a fresh one.
        try:
            fd, moved = open_for_append(target)
        except NotAFileError:
            return f"results not saved: {target} is not a regular file (a pipe or device?); move it away"
        try:
            _lock(fd)
            note = _set_aside_torn_tail(fd, target)
            written = os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)  # also releases the lock
    except OSError as error:
        return f"results not saved to {target}: {error.strerror or error}"
    if written != len(line):
        return f"results only partly saved to {target} ({written} of {len(line)} bytes)"
    if moved:  # a fresh file: no torn tail in it
        return f"{moved}; this run starts a fresh {target.name}"
    return f"{note}; this run is saved after it" if note else None


def _is_run_record(record: Any) -> bool:
    return (isinstance(record, dict) and isinstance(record.get("header"), dict)
            and isinstance(record.get("results"), list) and all(isinstance(r, dict) for r in record["results"]))


Run = BenchRun
"""A stored run is the bench run record (tutor.bench.record.BenchRun)."""


@dataclass(frozen=True)
class Notebook:
    runs: tuple[Run, ...]
    corrupt_lines: int
    warning: str = ""  # "" when the file read cleanly (or does not exist yet)
    set_aside: tuple[Path, ...] = ()  # side files holding torn lines cut off before an append
    skipped: tuple[str, ...] = ()
    """One line per run left out for a figure that is no figure (which run, which field), as `warning`
    says them: what a reader of the notebook's figures (time, fit) repeats so none is dropped silently."""


# The figures a reader of the notebook uses (tutor.bench.record, ceilings, plots, the Bench screen, the
# labs' compute estimates), by what each must be when present: a hand-edited line whose figure is text,
# zero, negative or Infinity is left out with its run, never drawn or divided by. null is "not measured"
# (a failed collective's busbw, a device without a datasheet peak).
RESULT_FIGURES: dict[str, Kind] = {
    **dict.fromkeys(("tflops_median", "tflops_best", "tflops_mean", "peak_tflops", "gbps_median", "gbps_best",
                     "gbps", "peak_gbps", "busbw_gbps", "algbw_gbps", "time_median_s", "time_best_s",
                     "graph_kernel_s", "eager_launch_s", "elements_per_s"), POSITIVE_NUMBER),
    **dict.fromkeys(("spread", "percent_of_peak"), NUMBER),
    **dict.fromkeys(("m", "n", "k", "ranks", "threads", "kernels", "seq", "heads", "head_dim"), POSITIVE_WHOLE),
    **dict.fromkeys(("bytes", "array_bytes", "size_bytes", "iters"), WHOLE),
    "sweep": OBJECTS,
}


def _bad_figure(record: dict[str, Any], what: str) -> str | None:
    """Why a parsed run record may not be read (the field and what it holds), or None when every figure in
    it is what it must be: finite everywhere, and each RESULT_FIGURES field of the right kind in every
    result and every point of its sweep."""
    try:
        for index, result in enumerate(record["results"]):
            where = f"results[{index}]"
            check_fields(result, RESULT_FIGURES, what=what, where=where)
            for point, entry in enumerate(result.get("sweep") or ()):
                check_fields(entry, RESULT_FIGURES, what=what, where=f"{where}.sweep[{point}]")
    except UntrustedDataError as error:
        return error.field_reason
    return None


def torn_side_files(target: Path) -> tuple[Path, ...]:
    """The side files that torn last lines of `target` were moved to, oldest first."""
    try:
        return tuple(sorted(target.parent.glob(f"{target.name}.{TORN_TAG}-*")))
    except OSError:
        return ()


def _run_named(record: dict[str, Any] | str) -> str:
    """" (run id, date)" of a run record (or of its line, parsed again leniently only to name it), or ""."""
    if isinstance(record, str):
        try:  # refused by the strict reader already: read again leniently, only for its names
            record = loads_json(record, what=NOTEBOOK_FILE, max_bytes=NOTEBOOK_LIMIT_BYTES, strings="clean",
                                non_finite="keep", max_digits=CPYTHON_INT_DIGITS, max_chars=NOTEBOOK_LIMIT_BYTES)
        except UntrustedDataError:
            return ""
    if not isinstance(record, dict):
        return ""
    header = record.get("header")
    parts = (record.get("run_id"), header.get("date") if isinstance(header, dict) else None)
    named = ", ".join(plain(part)[:40] for part in parts if isinstance(part, str) and part)
    return f" ({named})" if named else ""


MAX_SKIPPED_NAMED = 3
"""Runs with a bad figure named one by one in the warning; the rest are counted."""
SKIPPED = "skipped"
"""The first word of each line about a run left out (what fit picks out of the ceilings' notes)."""


def read_notebook(path: Path | None = None) -> Notebook:
    """Every run that parses and whose figures are figures (RESULT_FIGURES); lines that do not parse are
    counted in `corrupt_lines`, runs with a bad figure are left out with one line each in `skipped`."""
    from tutor.files.storage import read_regular_bytes

    target = path or notebook_path()
    aside = torn_side_files(target)
    aside_note = (f"{len(aside)} torn line(s) were set aside earlier: {', '.join(p.name for p in aside)}"
                  if aside else "")
    try:
        text = read_regular_bytes(target, NOTEBOOK_LIMIT_BYTES).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return Notebook(runs=(), corrupt_lines=0, warning=aside_note, set_aside=aside)
    except OSError as error:
        return Notebook(runs=(), corrupt_lines=0, warning=f"cannot read {target}: {error.strerror or error}",
                        set_aside=aside)
    runs: list[Run] = []
    corrupt = 0
    skipped: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        what = f"{target.name} line {number}"
        try:
            record = loads_json(line, what=what, max_bytes=NOTEBOOK_LIMIT_BYTES, strings="clean",
                                max_chars=NOTEBOOK_LIMIT_BYTES)
        except UntrustedDataError as error:
            if error.where:  # whole JSON with a value refused in it (Infinity, a huge integer): a run, named
                skipped.append(f"{SKIPPED} the run on {what}{_run_named(line)}: {error.field_reason}")
            else:
                corrupt += 1
            continue
        if not _is_run_record(record):
            corrupt += 1
            continue
        bad = _bad_figure(record, what)
        if bad is not None:
            skipped.append(f"{SKIPPED} the run on {what}{_run_named(record)}: {bad}")
            continue
        runs.append(Run(number=len(runs) + 1, header=record["header"], results=tuple(record["results"]),
                        run_id=str(record.get("run_id") or ""), stored_status=str(record.get("status") or "")))
    notes = [f"skipped {corrupt} corrupt line(s) in {target}"] if corrupt else []
    notes += skipped[:MAX_SKIPPED_NAMED]
    if len(skipped) > MAX_SKIPPED_NAMED:
        notes.append(f"{SKIPPED} {len(skipped) - MAX_SKIPPED_NAMED} more run(s) with a bad figure")
    if aside_note:
        notes.append(f"{aside_note} (in {target.parent})")
    return Notebook(runs=tuple(runs), corrupt_lines=corrupt, warning="; ".join(notes), set_aside=aside,
                    skipped=tuple(skipped))


def case_key(result: dict[str, Any]) -> tuple[str, ...] | None:
    """What makes two results the same case across runs; None for results without a figure."""
    return CaseResult.from_json(result).key


def case_label(key: tuple[str, ...]) -> str:
    return " ".join(part for part in key if part)


@dataclass(frozen=True)
class CaseComparison:
    """One case present in both runs: `after / before` of its headline figure."""

    case: str
    figure: str
    before: float
    after: float
    ratio: float
    statistic: str = HEADLINE_STATISTIC
    unit: str = ""


def _figures(run: Run) -> dict[tuple[str, ...], tuple[CaseResult, Headline]]:
    """case key -> (case, headline) for every result with a figure (the last one of a key wins)."""
    table = {}
    for case in run.cases:
        headline = case.headline()
        if case.key is not None and headline is not None:
            table[case.key] = (case, headline)
    return table


def compare_runs(before: Run, after: Run) -> list[CaseComparison]:
    """Ratios after/before of the headline figure of every case both runs measured (matching by case key)."""
    old, new = _figures(before), _figures(after)
    return [CaseComparison(case=case_label(key), figure=old[key][1].field, before=old[key][1].value,
                           after=new[key][1].value, ratio=new[key][1].value / old[key][1].value,
                           statistic=old[key][1].statistic, unit=old[key][1].unit)
            for key in old if key in new]


def run_headlines(run: Run) -> dict[str, float]:
    """Short figures for a history listing: each matmul dtype's headline TFLOP/s, triad GB/s, busbw
    (BenchRun.figures: the same headlines as every other view)."""
    return {figure.legacy_label: figure.headline.value for figure in run.figures()}


def case_size(result: dict[str, Any]) -> str:
    """The problem size a result was measured at, in words ('1024x1024x1024', '128 MiB per array'):
    two runs' figures compare only at the same size (a larger matmul reaches a higher TFLOP/s)."""
    if result.get("kind") == "matmul":
        return "x".join(str(result.get(dim)) for dim in ("m", "n", "k"))
    return CaseResult.from_json(result).size


@dataclass(frozen=True)
class SizeMismatch:
    """A case both runs measured, at different sizes: not compared."""

    case: str
    before_size: str
    after_size: str


def case_sizes(run: Run) -> dict[str, str]:
    """case label -> the size it was measured at, for the results compare_runs keeps (the last with a figure)."""
    return {case_label(key): case_size(case.data) for key, (case, _) in _figures(run).items()}


def compare_runs_at_same_sizes(before: Run, after: Run) -> tuple[list[CaseComparison], list[SizeMismatch]]:
    """compare_runs restricted to cases measured at the same size in both runs, and the cases left out."""
    old, new = case_sizes(before), case_sizes(after)
    same = [row for row in compare_runs(before, after) if old.get(row.case) == new.get(row.case)]
    differ = [SizeMismatch(case, old[case], new[case]) for case in old if case in new and old[case] != new[case]]
    return same, differ


def same_machine(recorded: Any, machine: Machine) -> bool:
    """Whether a run's header describes `machine`: the same CPU model and cores, the same GPUs by name
    (free memory and clocks move between runs; the hardware does not)."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("cpu"), dict):
        return False
    cpu = recorded["cpu"]
    gpus = recorded.get("gpus")
    if not isinstance(gpus, list):
        gpus = []
    return (cpu.get("model_name") == machine.cpu.model_name and cpu.get("logical_cores") == machine.cpu.logical_cores
            and [g.get("name") for g in gpus if isinstance(g, dict)] == [g.name for g in machine.gpus])


def measured_while_busy(result: dict) -> bool:
    """Whether a result's record says other processes took the cores while it measured (BusyShare.to_json)."""
    busy = result.get("busy")
    return isinstance(busy, dict) and busy.get("busy") is True


def last_matmul_tflops(notebook: Notebook, *, device: str, dtype: str, machine: Machine) -> tuple[float, str] | None:
    """(TFLOP/s, date) of the newest finished `bench matmul` headline for `dtype` on `device` of this
    machine, None when the notebook has none (a cancelled run's figure may be a tiny size, and a figure measured
    while other processes took the cores says what they left, not what the machine does: both skipped)."""
    for run in reversed(notebook.runs):
        if run.cancelled or not same_machine(run.header.get("machine"), machine):
            continue
        figures = [r.get("tflops_median") for r in run.results
                   if r.get("kind") == "matmul" and r.get("device") == device and r.get("dtype") == dtype
                   and r.get("headline", True) and not r.get("fixed_size") and not measured_while_busy(r)]
        rates = [float(f) for f in figures if isinstance(f, (int, float)) and not isinstance(f, bool)
                 and math.isfinite(f) and f > 0]
        if rates:
            return max(rates), run.date
    return None
