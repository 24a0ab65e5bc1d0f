"""What the exports say and how the charts sit: every export (CSV, JSON, Markdown, the pictures' SVG,
CSV and JSON) carries its context (model, mode, dtype or recipe, device, date in UTC, version) and
names each figure's unit in its header, in the unit the screen shows the same figure in; chart
legends sit outside the plotted data; axes carry their units; the Bench progress bar's percentage
is whole at 80, 100 and 120 columns; an open Select's options are framed. Driven with Pilot on the
fakes of ui_fakes; nothing here waits a fixed time."""

from __future__ import annotations

import csv
import html
import io
import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest


from tests.ui_fakes import fake_machine, fake_services, sync, until

from textual.widgets import Static

from tests.test_ui_bench_fit import fit_screen, probe_result, text_of, write_notebook

import tutor
from tutor import export
from tutor.bench.notebook import read_notebook
from tutor.ui.app import TutorApp
from tutor.ui.commands import export_current

NOW = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@pytest.fixture
def data_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    return tmp_path


def fit_values() -> export.FitValues:
    return export.FitValues({"model": "llama-3.2-1b", "mode": "train", "device": "h100", "dtype": "bf16",
                             "recipe": "mixed"}, fake_machine())


def results(data_dir: Path) -> dict[str, object]:
    write_notebook(data_dir)
    return {"lab": probe_result(), "bench": read_notebook().runs[2], "fit": fit_values()}


EXPECTED = {
    "lab": {"model": None, "mode": None, "dtype": None, "device": "cpu"},
    "bench": {"model": None, "mode": None, "dtype": "fp32, bf16", "device": "cpu"},
    "fit": {"model": "Llama-3.2-1B", "mode": "training", "dtype": "bf16, recipe mixed", "device": "H100 SXM5 80GB"},
}


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_every_export_format_says_what_it_is_of(kind, data_dir):
    result = results(data_dir)[kind]
    expected = {**EXPECTED[kind], "date": "2025-03-04T05:06:07Z", "tool_version": tutor.__version__}
    assert json.loads(export.to_json(result, NOW))["context"] == expected
    rows = list(csv.DictReader(io.StringIO(export.to_csv(result, NOW))))
    assert rows
    for row in rows:
        assert ISO_UTC.match(row["date"]) and row["tool_version"] == tutor.__version__
        assert row["model"] == (expected["model"] or "") and row["mode"] == (expected["mode"] or "")
        if kind != "bench":  # a bench row names its own dtype (a bandwidth has none)
            assert row["dtype"] == (expected["dtype"] or "") and row["device"] == expected["device"]
    markdown = export.to_markdown(result, NOW)
    line = markdown.splitlines()[2]
    for field in ("model", "mode", "dtype", "device"):
        assert f"{field} {expected[field] or 'none'}" in line
    assert f"date {expected['date']}" in line and f"tensor-tutor {tutor.__version__}" in line


@pytest.mark.parametrize("kind", sorted(EXPECTED))
def test_every_figure_column_names_its_unit(kind, data_dir):
    table = export.as_table(results(data_dir)[kind], NOW)
    def figure(value: object) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    numeric = {c.name for c in table.columns if any(figure(r.get(c.name)) for r in table.rows)}
    numeric -= {"run"}  # the run's number in the notebook: a name, not a figure
    assert numeric
    for column in table.columns:
        if column.name in numeric:
            assert column.unit and column.name.endswith("_" + export.unit_slug(column.unit)), column
    assert export.unit_slug("GFLOP/s") == "gflops" and export.unit_slug("GB/s") == "gbps"
    assert export.unit_slug("TFLOP/s") == "tflops" and export.unit_slug("GiB") == "gib"


SHOWN = re.compile(r"([\d,.]+) (GFLOP/s|TFLOP/s|MFLOP/s|GB/s|MB/s|TB/s)")


@sync
async def test_the_bench_csv_gives_each_figure_in_the_unit_the_screen_shows(data_dir):
    write_notebook(data_dir)
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        app.action_bench()
        await until(pilot, lambda: getattr(app.screen, "shown", None) is not None, "the newest run")
        table = text_of(app.screen.query_one("#table", Static))
        export_current(app, "csv")
        await until(pilot, lambda: list((data_dir / "exports").glob("bench-run-3-*.csv")), "the export")
    rows = list(csv.DictReader(io.StringIO(next((data_dir / "exports").glob("bench-run-3-*.csv")).read_text())))
    checked = 0
    for row in rows:
        line = next((line for line in table.splitlines() if line.strip().startswith(row["label"] + " ")), None)
        if line is None:
            continue
        number, unit = SHOWN.search(line).groups()  # the measured figure, first on its line
        column = f"measured_{export.unit_slug(unit)}"
        assert row[column], (row, column)
        assert float(row[column]) == pytest.approx(float(number.replace(",", "")), rel=5e-3), (line, row[column])
        checked += 1
    assert checked == 5  # two matmuls (GFLOP/s on this CPU) and three bandwidths (GB/s)


@sync
async def test_the_fit_csv_gives_memory_in_the_screens_gib(data_dir):
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        form = await fit_screen(pilot, model="llama-3.2-1b", device="h100")
        shown = text_of(form.query_one("#output", Static))
        export_current(app, "csv")
        await until(pilot, lambda: list((data_dir / "exports").glob("fit-*.csv")), "the export")
    rows = list(csv.DictReader(io.StringIO(next((data_dir / "exports").glob("fit-*.csv")).read_text())))
    assert rows[0]["model"] == "Llama-3.2-1B" and rows[0]["mode"] == "inference"
    for row in rows:
        line = next((line for line in shown.splitlines() if line.strip().startswith(row["component"] + " ")), None)
        if line is None:  # the export keeps what the table leaves out as too small to show: Llama's RoPE buffers
            assert row["component"] == "buffers" and float(row["memory_gib"]) < 0.001, row
            continue
        assert f"{float(row['memory_gib']):,.2f}" in line.split(), (row, line)  # the screen's GiB column


@sync
async def test_ctrl_s_saves_pictures_that_say_what_they_show(data_dir):
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        await fit_screen(pilot, model="llama-3.2-1b", mode="train", device="h100")
        screen = app.screen
        await until(pilot, lambda: screen.time_settled and screen.query_one("#timeline").chart is not None,
                    "the timeline")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: list((data_dir / "exports").glob("fit-timeline-*.json")), "the pictures")
    svg = next((data_dir / "exports").glob("fit-timeline-*.svg"))
    described = json.loads(svg.with_suffix(".json").read_text(encoding="utf-8"))
    context = described["context"]
    assert {k: context[k] for k in ("model", "mode", "dtype", "device")} == EXPECTED["fit"]
    assert ISO_UTC.match(context["date"]) and context["tool_version"] == tutor.__version__
    rows = list(csv.DictReader(io.StringIO(svg.with_suffix(".csv").read_text(encoding="utf-8"))))
    assert rows[0]["model"] == "Llama-3.2-1B" and rows[0]["dtype"] == "bf16, recipe mixed"
    alive = [float(row["memory_alive_gib"]) for row in rows if row["series"] == "alive"]
    peak = max(p["y"] for p in described["charts"][0]["series"][0]["points"])
    assert max(alive) == pytest.approx(peak / 2**30)  # GiB, as the picture's axis says
    picture = html.unescape(svg.read_text(encoding="utf-8")).replace("\xa0", " ")
    assert "model Llama-3.2-1B" in picture and "mode training" in picture and context["date"] in picture


# ---- charts -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
@sync
async def test_chart_legends_sit_outside_the_plotted_data(size, data_dir):
    from tests.plot_data import HEADER, RESULTS

    from tutor.bench.notebook import append_run
    from tutor.ui.widgets.plot import ChartPlot, ChartView

    def check(view: ChartView) -> None:
        plot = view.query_one(ChartPlot)
        legend = view.query_one(".chart-legend", Static)
        assert not plot.query_one("#legend").display  # textual-plot's box over the data: off
        assert legend.virtual_region.y >= plot.virtual_region.bottom  # under the picture, not on it
        words = text_of(legend)
        assert all(series.label in words for series in view.chart.series)
        assert all(mark.label in words for mark in view.chart.y_marks)

    append_run(HEADER, RESULTS, data_dir / "results.jsonl")
    app = TutorApp(fake_services())
    async with app.run_test(size=size) as pilot:
        await fit_screen(pilot, model="llama-3.2-1b", mode="train", device="h100")
        await until(pilot, lambda: app.screen.query_one("#timeline", ChartView).chart is not None, "the timeline")
        await pilot.pause()
        check(app.screen.query_one("#timeline", ChartView))
        app.action_bench()
        await until(pilot, lambda: app.screen.query("#matmul-chart")
                    and app.screen.query_one("#matmul-chart", ChartView).chart is not None, "the sweeps")
        await pilot.pause()
        views = [view for view in app.screen.query(ChartView) if view.chart is not None]
        assert len(views) == 2
        for view in views:
            check(view)


def test_chart_axes_carry_their_units():
    from tests.plot_data import HEADER, RESULTS

    from tutor.answers.pictures import bench_charts

    matmul, bandwidth = bench_charts(RESULTS, HEADER)[:2]
    assert (matmul.x_label, matmul.y_label, matmul.y_scale()[1]) == ("matrix size n", "throughput", "GFLOP/s")
    assert (bandwidth.x_unit, bandwidth.y_scale()[1]) == ("B", "GB/s")
    from tutor.ui.widgets.plot import axis_title

    assert axis_title("moment", "") == "moment" and axis_title("memory alive", "GiB") == "memory alive (GiB)"


@sync
async def test_the_chart_axes_are_labelled_with_units_in_the_app(data_dir):
    from tests.plot_data import HEADER, RESULTS

    from tutor.bench.notebook import append_run
    from tutor.ui.widgets.plot import ChartPlot, ChartView

    append_run(HEADER, RESULTS, data_dir / "results.jsonl")
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        app.action_bench()
        await until(pilot, lambda: app.screen.query("#matmul-chart")
                    and app.screen.query_one("#matmul-chart", ChartView).chart is not None, "the sweeps")
        await pilot.pause()
        plot = app.screen.query_one("#matmul-chart", ChartView).query_one(ChartPlot)
        assert (plot._y_label, plot._x_label) == ("GFLOP/s", "matrix size n")
        plot = app.screen.query_one("#bandwidth-chart", ChartView).query_one(ChartPlot)
        assert plot._y_label == "GB/s"


@pytest.mark.parametrize("width", [80, 100, 120])
@sync
async def test_the_bench_progress_bar_shows_its_whole_percentage(width, data_dir):
    from textual.widgets import ProgressBar
    from textual.widgets._progress_bar import PercentageStatus

    app = TutorApp(fake_services())
    async with app.run_test(size=(width, 30)) as pilot:
        app.action_bench()
        await until(pilot, lambda: app.screen.query("#progress"), "the Bench screen")
        bar = app.screen.query_one("#progress", ProgressBar)
        bar.update(total=100, progress=100)
        await pilot.pause()
        status = bar.query_one(PercentageStatus)
        bench = app.screen.query_one("#bench")
        assert str(status.render()) == "100%"
        assert status.region.width >= len("100%")
        assert status.region.right <= bench.content_region.right  # drawn whole, inside the column


@sync
async def test_an_open_select_is_framed_by_a_border(data_dir):
    from textual.color import Color
    from textual.widgets import Select
    from textual.widgets._select import SelectOverlay

    from tutor.ui import palette

    app = TutorApp(fake_services())
    async with app.run_test(size=(80, 24)) as pilot:
        form = await fit_screen(pilot)
        select = form.query_one("#field-mode", Select)
        select.expanded = True
        await pilot.pause()
        overlay = select.query_one(SelectOverlay)
        assert overlay.display
        for edge in (overlay.styles.border.top, overlay.styles.border.left, overlay.styles.border.bottom):
            kind, color = edge
            assert kind not in ("", "none", "hidden")
            # WCAG 2.1 1.4.11: a component's boundary at 3:1 against what it stands on
            under = Color.parse(app.get_css_variables()["surface"])
            assert palette.contrast_ratio(color, under) >= 3, (edge, under)


def test_a_column_of_figures_reads_in_the_unit_of_its_largest():
    from tutor.formatting import column_units, format_in_unit

    units = column_units([(0.12, "TFLOP/s"), (0.2688, "TFLOP/s"), (9.9, "GB/s"), (None, "GB/s")])
    assert units == {"TFLOP/s": (1000.0, "GFLOP/s"), "GB/s": (1.0, "GB/s")}
    assert format_in_unit(0.12, units["TFLOP/s"]) == "120 GFLOP/s"
    assert format_in_unit(1.2, column_units([(1.2, "TFLOP/s"), (0.05, "TFLOP/s")])["TFLOP/s"]) == "1.2 TFLOP/s"
    assert format_in_unit(None, units["GB/s"]) == "N/A" and format_in_unit(45.0, (1.0, "%")) == "45%"
