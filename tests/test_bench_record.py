"""The one bench run record (tutor.bench.record) and its one headline per case: the command line's
history and --compare, the Bench screen's list, bars and table, and the CSV export all show the same
labelled figure for the same run; old notebook lines still load; the fixed-size fp32 case compares."""

from __future__ import annotations

import csv
import io
import json
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner


from tests.ui_fakes import fake_services, slow_bench, sync

from textual.widgets import OptionList, ProgressBar, Static

from tutor.bench.notebook import (append_run, compare_runs_at_same_sizes, read_notebook,
                                  run_headlines)
from tutor.bench.record import CANCELLED, COMPLETE, CaseResult, run_record
from tutor.commands.bench import bench
from tutor.formatting import format_quantity
from tutor import export
from tutor.ui.app import TutorApp
from tutor.worker.jobs import bench_rows


def matmul(size: int, median: float, best: float, *, backend: str = "torch/mkl", headline: bool = True,
           iters: int = 9, fixed: bool = False) -> dict:
    data = {"kind": "matmul", "device": "cpu", "dtype": "fp32", "m": size, "n": size, "k": size, "backend": backend,
            "tflops_median": median, "tflops_best": best, "tflops_mean": median, "peak_tflops": 0.2688,
            "percent_of_peak": 100 * median / 0.2688, "peak_source": "fake", "peak_note": "", "iters": iters,
            "noisy": False, "spread": 0.02, "notes": [], "headline": headline, "sweep": []}
    return {**data, "fixed_size": True, "headline": False} if fixed else data


def triad(median: float, best: float) -> dict:
    return {"kind": "bandwidth", "device": "cpu", "op": "triad", "bytes": 3 * 2**27, "bytes_counting": "STREAM",
            "array_bytes": 2**27, "gbps_median": median, "gbps_best": best, "peak_gbps": None,
            "percent_of_peak": None, "iters": 10, "noisy": False, "spread": 0.03, "notes": []}


# A run where the old views disagreed: numpy's unsettled fp32 median (not the headline backend) above
# torch's, and triad's best above its median. The one headline is torch's median and triad's median.
RUN_ONE = [matmul(1024, 0.0232, 0.030), matmul(1024, 0.0546, 0.060, backend="numpy/openblas", headline=False),
           matmul(1024, 0.0200, 0.024, fixed=True, iters=12), triad(5.67, 7.32)]
RUN_TWO = [matmul(2048, 0.0300, 0.031), matmul(1024, 0.0220, 0.025, fixed=True, iters=15), triad(6.0, 6.5)]


def cli(*args: str) -> str:
    """`tensor-tutor bench ARGS` on a console wide enough that no figure wraps."""
    result = CliRunner().invoke(bench, list(args), catch_exceptions=False, env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def two_runs(data_dir: Path) -> Path:
    header = {"command": "tensor-tutor bench", "device_under_test": "cpu"}
    assert append_run(run_record({**header, "date": "2026-01-01T10:00:00+00:00"}, RUN_ONE, cancelled=False)) is None
    assert append_run(run_record({**header, "date": "2026-01-02T10:00:00+00:00"}, RUN_TWO, cancelled=False)) is None
    return data_dir


def test_a_case_has_one_labelled_headline_the_median() -> None:
    case = CaseResult.from_json(RUN_ONE[0])
    headline = case.headline()
    assert (headline.value, headline.unit, headline.statistic) == (0.0232, "TFLOP/s", "median")
    assert headline.label == "median of 9 at 1024²" and headline.figure() == "23.2 GFLOP/s (median of 9 at 1024²)"
    bandwidth = CaseResult.from_json(RUN_ONE[3]).headline()
    assert bandwidth.value == 5.67 and bandwidth.label == "median of 10 at 128 MiB per array"
    # A collective's figure is its bus bandwidth at the median time; a failed one has none.
    collective = {"kind": "collective", "op": "all_reduce", "backend": "gloo", "ranks": 2, "bytes": 2**20,
                  "busbw_gbps": 1.5, "time_median_s": 0.002, "time_best_s": 0.001, "iters": 7, "device": "cpu"}
    assert CaseResult.from_json(collective).headline().label == "bus bandwidth at the median of 7 at 1 MiB"
    assert CaseResult.from_json(collective).best == pytest.approx(3.0)
    assert CaseResult.from_json({**collective, "busbw_gbps": None, "state": "failed"}).headline() is None


def test_the_record_stores_its_id_and_status_and_a_new_line_reads_back(two_runs: Path) -> None:
    line = json.loads((two_runs / "results.jsonl").read_text().splitlines()[0])
    assert line["notebook_version"] == 2 and line["status"] == COMPLETE and len(line["run_id"]) == 12
    run = read_notebook().runs[0]
    assert run.id == line["run_id"] and run.status == COMPLETE and not run.cancelled
    assert [figure.text() for figure in run.figures()] == [
        "fp32 23.2 GFLOP/s (median of 9 at 1024²)", "triad 5.67 GB/s (median of 10 at 128 MiB per array)"]


def test_an_old_format_notebook_still_loads(data_dir: Path) -> None:
    # Lines as version 1 wrote them: no run id, no status (the header's "cancelled"), bare results.
    old = [{"notebook_version": 1, "header": {"date": "2025-01-01", "cancelled": False},
            "results": [{"kind": "matmul", "device": "cpu", "dtype": "fp32", "backend": "torch/mkl",
                         "tflops_median": 0.2}]},
           {"notebook_version": 1, "header": {"date": "2025-01-02", "cancelled": True},
            "results": [{"kind": "matmul", "device": "cpu", "dtype": "fp32", "backend": "torch/mkl",
                         "tflops_median": 0.3}, {"kind": "bandwidth", "device": "cpu", "op": "triad",
                                                 "gbps_median": 10.0}]}]
    (data_dir / "results.jsonl").write_text("".join(json.dumps(line) + "\n" for line in old))
    first, second = read_notebook().runs
    assert (first.status, second.status) == (COMPLETE, CANCELLED) and second.cancelled
    assert first.id == "notebook-line-1"
    assert run_headlines(second) == {"fp32 TFLOP/s": 0.3, "triad GB/s": 10.0}
    assert [figure.text() for figure in second.figures()] == ["fp32 300 GFLOP/s (median)", "triad 10 GB/s (median)"]
    listing = cli("history")
    assert "2 (cancelled)" in listing and "fp32 300 GFLOP/s (median)" in listing
    compared = json.loads(cli("history", "--compare", "1", "2", "--json"))
    assert compared["cases"][0]["ratio"] == pytest.approx(1.5)
    # A new run appends after the old lines, in the new format.
    assert append_run(run_record({"date": "2026"}, RUN_TWO, cancelled=True)) is None
    assert [run.status for run in read_notebook().runs] == [COMPLETE, CANCELLED, CANCELLED]


def test_history_compare_list_bars_and_export_show_the_same_figure(two_runs: Path) -> None:
    run = read_notebook().runs[0]
    fp32, bandwidth = "23.2 GFLOP/s", "5.67 GB/s"
    history = cli("history")
    assert "fp32 23.2 GFLOP/s (median of 9 at" in history and "54.6" not in history
    assert "triad 5.67 GB/s (median of 10 at 128" in history and "7.32" not in history
    listing = json.loads(cli("history", "--json"))["runs"][0]
    assert listing["headlines"] == {"fp32 TFLOP/s": 0.0232, "triad GB/s": 5.67}
    assert [(f["value"], f["label"]) for f in listing["figures"]] == [
        (0.0232, "median of 9 at 1024²"), (5.67, "median of 10 at 128 MiB per array")]
    compared = cli("history", "--compare", "1", "2")
    triad_line = next(line for line in compared.splitlines() if "triad" in line)
    assert bandwidth in triad_line and "median" in triad_line
    rows = {row.label: row for row in bench_rows(run.cases)}  # what the Bench screen draws (bars, gauges, table)
    assert format_quantity(rows["matmul fp32"].measured, "TFLOP/s") == fp32
    assert rows["matmul fp32"].statistic == "median of 9 at 1024²"
    assert format_quantity(rows["bandwidth triad"].measured, "GB/s") == bandwidth
    exported = {row["case"]: row for row in csv.DictReader(io.StringIO(export.to_csv(run)))}
    # the export: each figure in the unit the Bench screen shows it in, that unit in the column's name
    assert exported["bandwidth cpu triad"]["measured_gbps"] == "5.67"
    assert exported["bandwidth cpu triad"]["statistic"] == "median of 10 at 128 MiB per array"
    assert exported["matmul cpu fp32 torch/mkl"]["measured_gflops"] == "23.2"
    assert {row["run"] for row in exported.values()} == {"1"} and {row["device"] for row in exported.values()} == {"cpu"}
    assert all(row["run_date"] == export.run_date_utc(run.date) for row in exported.values())


def screen_text(widget) -> str:
    from rich.console import Console

    console = Console(width=240, record=True, file=io.StringIO())
    console.print(widget.content if isinstance(widget, Static) else widget)
    return console.export_text()


@sync
async def test_the_bench_screen_list_and_chart_show_the_history_figure(two_runs: Path) -> None:
    app = TutorApp(fake_services())
    async with app.run_test(size=(160, 50)) as pilot:
        pilot.app.action_bench()
        await pilot.pause()
        await pilot.pause()
        screen = app.screen
        history = screen.query_one("#history", OptionList)
        await pilot.press("up")
        await pilot.pause()
        assert screen.shown.number == 1
        line = str(history.get_option_at_index(0).prompt)
        assert "fp32 23.2 GFLOP/s (median of 9 at 1024²)" in line
        assert "triad 5.67 GB/s (median of 10 at 128 MiB per array)" in line
        bars = {item.label: item.measured for item in screen.query_one("#bars").items}
        assert bars["matmul fp32"] == pytest.approx(0.0232) and bars["bandwidth triad"] == pytest.approx(5.67)
        assert bars["matmul fp32 1024²"] == pytest.approx(0.0200)  # the fixed-size case has its own bar
        table = screen_text(screen.query_one("#table", Static))
        assert "23.2 GFLOP/s" in table and "median of 9 at 1024²" in table and "5.67 GB/s" in table
        assert "54.6" not in table and "7.32" not in table


def test_the_fixed_fp32_case_is_compared_when_the_sweeps_differ(two_runs: Path) -> None:
    before, after = read_notebook().runs
    same, differ = compare_runs_at_same_sizes(before, after)
    fixed = [row for row in same if "fixed" in row.case]
    assert [row.case for row in fixed] == ["matmul cpu fp32 torch/mkl fixed 1024²"]
    assert fixed[0].ratio == pytest.approx(0.022 / 0.020)
    assert [mismatch.case for mismatch in differ] == ["matmul cpu fp32 torch/mkl"]  # the sweeps: 1024 vs 2048
    compared = json.loads(cli("history", "--compare", "1", "2", "--json"))
    case = next(case for case in compared["cases"] if "fixed" in case["case"])
    assert case["sizes_differ"] is False and case["ratio"] == pytest.approx(1.1)
    assert case["label"] == "median at 1024x1024x1024"


@sync
async def test_a_cancelled_bench_run_leaves_its_bar_where_it_stopped(data_dir: Path) -> None:
    app = TutorApp(fake_services(run_bench=slow_bench))
    async with app.run_test(size=(120, 40)) as pilot:
        app.action_bench(run=True)
        await pilot.pause()
        assert app.screen.running
        await pilot.press("escape")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert not app.screen.running and "cancelled" in screen_text(app.screen.query_one("#status", Static))
        assert app.screen.query_one("#progress", ProgressBar).progress < 100


def test_the_app_worker_and_the_command_line_save_the_same_record(data_dir: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.machines import recorded_machine
    from tutor.worker import jobs

    monkeypatch.setattr("tutor.bench.environment.load_machine", lambda: recorded_machine())
    monkeypatch.setattr(jobs, "BENCH_BUDGET_S", 1.0)
    outcome = jobs.run_bench_suite(lambda fraction, text: None, threading.Event())
    cli("matmul", "--dtype", "fp32", "--budget", "0.5", "--json")
    app_run, cli_run = read_notebook().runs
    assert app_run.status == cli_run.status == COMPLETE and app_run.id != cli_run.id
    assert set(app_run.header) == set(cli_run.header)  # one header: environment, memory, device, budget, time
    assert app_run.header["command"] == "tensor-tutor app: Bench screen" and app_run.header["budget_s"] == 1.0
    # What the screen showed live is what it shows from the notebook, and what history lists.
    assert outcome.rows == bench_rows(app_run.cases)
    assert any(case.fixed_size for case in app_run.cases)
    shown = {row.label: row.measured for row in outcome.rows}
    for figure in app_run.figures():
        assert shown[figure.case.name] == figure.headline.value
