"""tutor.answers.pictures: charts built from bench JSON, drawn as text (uniplot), as a table, and as SVG."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console


from tests.plot_data import H100_HEADER, HEADER, RESULTS, collective_results
from tutor.errors import UserError
from tutor.formatting import axis_unit
from tutor.answers.pictures import (
    Lane, Lanes, LanesPicture, Span, bandwidth_sweep_chart, bench_charts, caches_from_machine_json, chart_rows,
    chart_text, collective_sweep_chart, lanes_rows, matmul_sweep_chart, print_chart, save_svg, timeline_chart)


def test_matmul_chart_has_one_series_per_sweep_and_a_peak_per_dtype():
    chart = matmul_sweep_chart(RESULTS)
    assert [s.label for s in chart.series] == ["fp32 torch/mkl+onednn", "bf16 torch/mkl+onednn"]  # fixed size left out
    assert [p.x_text for p in chart.series[0].points] == ["128²", "256²", "512²", "1024²", "2048²"]
    assert {m.label: m.value for m in chart.y_marks} == {"fp32 peak": 0.166, "bf16 peak": 0.332}


def test_bandwidth_chart_marks_the_data_and_unified_caches():
    caches = caches_from_machine_json(HEADER["machine"])
    assert caches == [("L1", 32768), ("L2", 1048576), ("L3", 33554432)]  # the instruction cache is not a data level
    chart = bandwidth_sweep_chart(RESULTS, caches)
    assert [m.label for m in chart.x_marks] == ["L1", "L2", "L3"]
    assert chart.series[1].points[0].x == 3 * 4096  # triad's working set is its three arrays


def test_bandwidth_chart_says_per_level_what_the_sweep_saw():
    # A thread that gets ~48 MiB of a 256 MiB L3, with every point up to 96 KiB dispatch-bound (2 us a call).
    caches = [("L1", 48 * 2**10), ("L2", 2 * 2**20), ("L3", 256 * 2**20)]
    sweep, size = [], 16 * 2**10
    while size <= 2**31:
        rate = 70.0 if size <= 2 * 2**20 else 27.0 if size <= 48 * 2**20 else 12.0
        sweep.append({"size_bytes": size, "gbps": rate, "threads": 1, "dispatch_bound": size <= 96 * 2**10,
                      "dispatch_s": 2e-6})
        size *= 2
    result = dict(RESULTS[3], sweep=sweep)
    l1, l2, l3, dram = bandwidth_sweep_chart([result], caches).notes[1:]
    assert l1.startswith("L1 48 KiB: not seen") and "up to 64 KiB" in l1 and "2 µs" in l1
    assert l2.startswith("L2 2 MiB: copy 70 GB/s while the working set fits; falls at") and "shares" not in l2
    assert l3.startswith("L3 256 MiB: copy 27 GB/s") and "only part of a cache it shares" in l3
    assert dram == "beyond the caches (DRAM): copy 12 GB/s"


def test_no_chart_without_a_sweep_of_two_sizes():
    single = [dict(RESULTS[3], sweep=RESULTS[3]["sweep"][:1])]
    assert bandwidth_sweep_chart(single) is None
    assert matmul_sweep_chart([RESULTS[2]]) is None
    assert bench_charts([], {}) == []


def test_table_is_wide_when_series_share_sizes_and_long_otherwise():
    header, rows = chart_rows(matmul_sweep_chart(RESULTS))
    assert header == ["matrix size n", "fp32 torch/mkl+onednn", "bf16 torch/mkl+onednn"]
    assert rows[0] == ["128²", "50 GFLOP/s", "10 GFLOP/s"]
    assert rows[-1] == ["2048²", "145 GFLOP/s", "-"]  # bf16 stopped at 1024²
    header, rows = chart_rows(bandwidth_sweep_chart(RESULTS))  # copy and triad touch 2 and 3 arrays: other sizes
    assert header == ["series", "working set", "bandwidth"]
    assert rows[0] == ["copy", "8 KiB", "150 GB/s"]
    assert rows[-1] == ["triad", "384 MiB", "12 GB/s"]


def test_text_picture_has_title_legend_and_no_colour_unless_asked():
    chart = bandwidth_sweep_chart(RESULTS, caches_from_machine_json(HEADER["machine"]))
    plain = chart_text(chart, width=60, height=12)
    assert "STREAM-like bandwidth" in plain and "copy" in plain and "triad" in plain
    assert "vertical lines: L1 32 KiB, L2 1 MiB, L3 32 MiB" in plain
    assert "\x1b[" not in plain
    assert "\x1b[" in chart_text(chart, width=60, height=12, color=True)


def test_a_pipe_gets_the_picture_as_plain_text_and_the_table():
    out = io.StringIO()
    console = Console(file=out, width=100)  # not a terminal
    print_chart(matmul_sweep_chart(RESULTS), console)
    text = out.getvalue()
    assert "\x1b[" not in text
    assert "(table)" in text and "2048²" in text and "145 GFLOP/s" in text
    assert "fp32 peak 166 GFLOP/s" in text


def test_svg_holds_every_chart(tmp_path):
    path = save_svg(bench_charts(RESULTS, HEADER), tmp_path / "run.svg")
    svg = path.read_text()
    assert svg.lstrip().startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert "matmul" in svg and "STREAM" in svg


def test_svg_to_a_missing_folder_is_one_clear_error(tmp_path):
    with pytest.raises(UserError, match="cannot write"):
        save_svg(bench_charts(RESULTS, HEADER), tmp_path / "no" / "run.svg")


def test_timeline_chart_marks_the_peak_moment():
    chart = timeline_chart([
        {"phase": "forward", "moment": "after layer 0", "bytes": 100, "per_category_bytes": {"weights": 60, "activations": 40, "kv_cache": 0}},
        {"phase": "backward", "moment": "loss head", "bytes": 300, "per_category_bytes": {"weights": 60, "activations": 240, "kv_cache": 0}},
        {"phase": "optimizer", "moment": "step", "bytes": 200, "per_category_bytes": {"weights": 60, "activations": 0, "kv_cache": 0}}])
    assert chart.notes == ("peak 300 B at loss head (backward)",)
    assert [s.label for s in chart.series] == ["alive", "weights", "activations"]  # kv cache never holds bytes
    assert not chart.x_log
    header, rows = chart_rows(chart)
    assert header == ["moment", "alive", "weights", "activations"]
    assert rows[1] == ["loss head", "300 B", "60 B", "240 B"]


@pytest.mark.parametrize(("largest", "unit", "expected"), [
    (0.18, "TFLOP/s", (1000.0, "GFLOP/s")), (95.0, "GB/s", (1.0, "GB/s")), (1500.0, "GB/s", (0.001, "TB/s")),
    (3 * 2**20, "B", (2**-20, "MiB")), (0.0, "GB/s", (1.0, "GB/s"))])
def test_axis_unit_picks_the_prefix_the_largest_value_reads_with(largest, unit, expected):
    factor, name = axis_unit(largest, unit)
    assert name == expected[1] and factor == pytest.approx(expected[0])


@pytest.mark.slow
def test_the_svg_opens_in_headless_chromium(tmp_path):
    """The --svg file is a picture a browser draws: headless Chromium renders it to a PNG."""
    import shutil
    import subprocess

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium here (apt-get install chromium)")
    from xml.etree import ElementTree

    from tutor.files.models import resolve_model
    from tutor.theory.fit import FitRequest
    from tutor.theory.fit_timeline import prefill_timeline

    prefill = timeline_chart([m.to_json() for m in prefill_timeline(resolve_model("gpt2")[0], FitRequest())])
    svg = save_svg([*bench_charts(RESULTS + collective_results(), HEADER), prefill], tmp_path / "run.svg")
    assert ElementTree.parse(svg).getroot().tag.endswith("svg")  # well-formed: no XML error page in the browser
    png = tmp_path / "run.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
                    "--window-size=1000,800", svg.as_uri()], capture_output=True, timeout=120, check=True)
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000  # a drawn page, not an error page's few bytes


def test_collective_chart_has_one_series_per_op_and_the_link_only_on_gpus():
    chart = collective_sweep_chart(collective_results())
    assert [s.label for s in chart.series] == ["all_reduce gloo x2", "all_gather gloo x2"]
    assert [p.x for p in chart.series[0].points] == sorted(p.x for p in chart.series[0].points)
    assert chart.series[0].points[0].x == 4096 and chart.x_unit == "B" and chart.x_log
    assert chart.y_marks == ()
    # A gloo run on this box draws no link; an NCCL run on an H100 draws NVLink 4's datasheet rate.
    assert [c.title for c in bench_charts(collective_results(), HEADER)] == [
        "collective bus bandwidth against message size"]
    gpu = [c for c in bench_charts(collective_results("nccl", 8), H100_HEADER) if c.title.startswith("collective")][0]
    from tutor.theory.interconnect import nvlink_bandwidth_bytes_per_s

    assert [(m.label, m.value) for m in gpu.y_marks] == [("NVLink 4 per direction", nvlink_bandwidth_bytes_per_s(4) / 1e9)]


def test_collective_chart_reads_runs_stored_before_the_sweep():
    old = [{k: v for k, v in result.items() if k != "sweep"} for result in collective_results()]
    chart = collective_sweep_chart(old)
    assert [len(s.points) for s in chart.series] == [7, 7]
    assert collective_sweep_chart(old[:1]) is None  # one size is no curve


def test_lanes_draw_each_block_at_its_time_and_the_table_says_it():
    lanes = Lanes(title="two lanes", length=10.0, kinds=(("F", "forward"), ("B", "backward")), lanes=(
        Lane("a", (Span(0.0, 5.0, "F", "F0"), Span(5.0, 10.0, "B", "B0"))),
        Lane("b", (Span(5.0, 7.5, "F", "F0"),))))
    text = io.StringIO()
    Console(file=text, width=42, color_system=None).print(LanesPicture(lanes))
    rows = [line for line in text.getvalue().splitlines() if line[:2] in ("a ", "b ")]
    assert rows[0] == "a " + "F0" + "─" * 18 + "B0" + "─" * 18
    assert rows[1] == "b " + "·" * 20 + "F0" + "─" * 8 + "·" * 10
    header, table = lanes_rows(lanes)
    assert header == ["lane", "busy", "idle", "blocks (start-end)"]
    assert table[1][:3] == ["b", "2.5 s", "75%"]  # idle of the period up to the latest end (10 s)
