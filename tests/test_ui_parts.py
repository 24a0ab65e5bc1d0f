"""The UI's pure parts: text charts, the device line, result cells, guesses, calculators, bench rows."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st


from tests.ui_fakes import NO_DRIVER, Measurement, fake_machine

from tutor.errors import UserError
from tutor.theory import fit as fitting
from tutor.theory import formats
from tutor.theory.units import GiB
from tutor.ui.screens.help import GLOBAL_HELP, help_for
from tutor.worker.jobs import BenchRow, bench_rows
from tutor.ui.widgets.bits import check_text, encodings, flags, float_formats, torch_agrees
from tutor.calculators import build_request, machine_capacity
from tutor.ui.widgets.calc import calc_renderable, coerce
from tutor.ui.widgets.charts import Comparison, bar_text, comparison_lines, gauge_text
from tutor.ui.widgets.device_header import device_title
from tutor.ui.widgets.live_pane import BARS, host_series, peak_lines, spark_text
from tutor.ui.widgets.measure import format_value, percent_cell
from tutor.ui.widgets.predict import parse_guess, verdict


# ---- charts --------------------------------------------------------------------------------------

@given(st.floats(0, 1), st.integers(1, 200))
def test_bar_fills_its_fraction_to_an_eighth_of_a_cell(fraction, width):
    text = bar_text(fraction, width)
    assert len(text) == width
    eighths = sum(8 if ch == "█" else " ▏▎▍▌▋▊▉".index(ch) for ch in text)
    assert abs(eighths - fraction * width * 8) <= 0.5 + 1e-9


def test_bar_clamps_outside_zero_to_one():
    assert bar_text(1.7, 10) == "█" * 10
    assert bar_text(-3, 10) == " " * 10


def test_comparison_bars_scale_each_unit_separately():
    # 1 MB of activations must not flatten the GFLOP/s bars beside it.
    items = (Comparison("matmul", 120.0, 240.0, "GFLOP/s"), Comparison("saved", 1e6, 1e6, "B"))
    lines = comparison_lines(items, 80).plain.splitlines()
    theory_flops, measured_flops = lines[0], lines[1]
    assert abs(theory_flops.count("█") - 2 * measured_flops.count("█")) <= 1
    assert lines[2].count("█") == lines[3].count("█") == theory_flops.count("█")
    assert "240 GFLOP/s" in theory_flops and "120 GFLOP/s" in measured_flops


def test_gauge_says_why_when_there_is_no_percentage():
    assert "52.1% of peak" in gauge_text("fp32", 0.521, 60).plain
    assert "used" in gauge_text("RAM", 0.5, 60, suffix="used").plain
    text = gauge_text("triad", None, 60, reason="no published peak: measured only").plain
    assert "%" not in text and "no published peak" in text


@given(st.lists(st.one_of(st.none(), st.floats(-50, 150)), max_size=80), st.integers(1, 60))
def test_sparkline_is_fixed_width_on_a_fixed_scale(values, width):
    text = spark_text(values, 0.0, 100.0, width)
    assert len(text) == width
    for value, cell in zip(reversed(values[-width:]), reversed(text)):
        if value is None:
            assert cell == " "
        else:
            level = min(max(value, 0), 100) / 100
            assert cell == BARS[min(int(level * len(BARS)), len(BARS) - 1)]


# ---- device and live pane ------------------------------------------------------------------------

def test_cpu_only_machine_says_why_there_is_no_gpu():
    title = device_title(fake_machine())
    assert title.startswith("CPU only (no NVIDIA driver found: NVML Shared Library Not Found)")
    assert "Fake Xeon 2-core" in title
    assert NO_DRIVER.startswith("no NVIDIA driver found")


def test_gpu_machine_names_its_first_gpu():
    assert device_title(fake_machine(gpu=True)) == "GPU 0: NVIDIA H100 80GB HBM3, 75 GiB"


def test_peaks_come_from_the_machine_with_na_for_unknown():
    lines = peak_lines(fake_machine())
    # 2 cores x 64 FLOP/cycle x 2.1 GHz, scaled by tutor.formatting (not "0.269 TFLOP/s")
    assert "peak fp32: 269 GFLOP/s" in lines
    assert "peak fp16: N/A" in lines
    assert any(line.startswith("peak memory: N/A") for line in lines)
    gpu_lines = peak_lines(fake_machine(gpu=True))
    # H100 SXM datasheet: 989.4 dense BF16 TFLOP/s, 3,350 GB/s.
    assert "peak bf16: 989 TFLOP/s" in gpu_lines and "peak memory: 3,350 GB/s" in gpu_lines


def test_a_cpu_memory_line_shows_the_bandwidth_measured_in_this_session():
    from tutor.labs import ProbeResult
    from tutor.ui.widgets.live_pane import measured_bandwidth

    result = ProbeResult(probe="bandwidth", rows=(), metrics={"gbps_copy": 6.1, "gbps_triad": 7.32}, summary="")
    assert measured_bandwidth(result) == ("triad", 7.32)
    assert measured_bandwidth(ProbeResult(probe="matmul", rows=(), metrics={"tflops_fp32": 0.05}, summary="")) is None
    lines = peak_lines(fake_machine(), measured_bandwidth(result))
    assert "memory: 7.32 GB/s measured (triad, best)" in lines
    assert not any("N/A" in line and "memory" in line for line in lines)


def test_the_live_pane_names_a_missing_gpu_in_words_not_nvmls_error():
    from tutor.ui.widgets.live_pane import pane_device_line

    line = pane_device_line(fake_machine())
    assert line.startswith("CPU only · no NVIDIA GPU") and "Fake Xeon 2-core" in line
    assert "NVML" not in line and "Shared Library" not in line


def test_host_series_reads_mean_cpu_load_and_ram():
    from tutor.hardware.sampler import Sample

    samples = [Sample(0.0, (10.0, 30.0), 4 * GiB, 16 * GiB, ()), Sample(1.0, None, None, 16 * GiB, ())]
    cpu, ram = host_series(samples)
    assert cpu.values == (20.0, None) and cpu.reading == "N/A"
    assert ram.values == (4 * GiB, None) and ram.high == 16 * GiB
    assert host_series(samples[:1])[0].reading == " 20.0 % of 2 cores"
    assert host_series(samples[:1])[1].reading == "4.0 / 16.0 GiB"


# ---- measure, predict ----------------------------------------------------------------------------

def test_percent_cell_never_shows_a_bare_percentage_above_theory():
    assert percent_cell(Measurement("a", 50.0, "GFLOP/s", 200.0)) == "25.0 %"
    above_rate = percent_cell(Measurement("a", 300.0, "GFLOP/s", 200.0))
    assert "above the theoretical peak" in above_rate and "150" not in above_rate
    assert percent_cell(Measurement("a", 3.0, "B", 2.0, note="allocator rounding")) == "150.0 %: see note"
    assert percent_cell(Measurement("a", None, "B", 2.0)) == "-"


def test_percent_cell_uses_the_labs_wording_when_present():
    from tutor import labs
    row = labs.Measurement("matmul", 300.0, "GFLOP/s", 200.0, rate=True)
    assert percent_cell(row) == row.comparison and "150" not in row.comparison


def test_format_value():
    assert format_value(None, "B") == "N/A"
    assert format_value(16_510, "bytes") == "16.1 KiB"  # one way to write bytes (tutor.formatting)
    assert format_value(0.0074, "TFLOP/s") == "7.4 GFLOP/s" and "e" not in format_value(7.4e-3, "")
    assert format_value(True, "") == "yes"


@pytest.mark.parametrize("text, value", [("3", 3.0), ("3.5x", 3.5), (" 2e9 ", 2e9), ("1,200 GB/s", 1200.0),
                                         ("4 ×", 4.0)])
def test_parse_guess(text, value):
    assert parse_guess(text) == value


@pytest.mark.parametrize("text", ["", "fast", "inf", "nan"])
def test_parse_guess_rejects(text):
    with pytest.raises(ValueError):
        parse_guess(text)


def test_verdict_is_a_ratio():
    assert verdict(2.0, 1.0) == "2x too high"
    assert verdict(1.0, 4.0) == "4x too low"
    assert verdict(1.05, 1.0).startswith("within 5 %")
    assert verdict(0.0, 0.0) == "exact"


# ---- bits ----------------------------------------------------------------------------------------

def test_bits_rows_come_from_the_theory_encoder():
    rows = encodings("0.1", ("fp32", "bf16"))
    # IEEE 754: 0.1 in binary32 is 0x3DCCCCCD = 0 01111011 10011001100110011001101.
    assert rows[0].bit_string == "0 01111011 10011001100110011001101"
    assert rows[1].bit_string == "0 01111011 1001101"  # bf16: the top 16 bits, rounded
    assert float_formats()[:3] == ("fp32", "tf32", "bf16")


def test_bits_flags_overflow_and_subnormals():
    assert flags(formats.encode("70000", "fp16")) == "overflow"  # > 65504 (IEEE binary16 max)
    assert flags(formats.encode("1e-6", "fp16")) == "subnormal"  # below 2^-14 = 6.1e-5
    assert "saturated" in flags(formats.encode("1000", "fp8-e4m3"))  # E4M3 saturates at 448


def test_bits_rejects_text_that_is_not_a_number():
    with pytest.raises(UserError):
        encodings("ten", ("fp32",))


def test_torch_agreement_treats_nan_as_equal():
    nan = formats.encode("nan", "fp32")
    assert torch_agrees(nan, math.nan) is True
    assert torch_agrees(formats.encode("1", "fp32"), 1.0) is True
    assert torch_agrees(formats.encode("1", "fp32"), 1.5) is False
    assert torch_agrees(formats.encode("1", "fp32"), None) is None


def test_a_torch_that_casts_e4m3_overflow_to_nan_agrees_without_saturation():
    # torch 2.11 stores NaN for an fp8-e4m3 overflow, later builds 448: both are modes the theory has.
    over = formats.encode("1000", "fp8-e4m3")
    assert torch_agrees(over, math.nan) is True and torch_agrees(over, 448.0) is True
    assert torch_agrees(over, 0.0) is False and torch_agrees(over, math.inf) is False
    assert torch_agrees(formats.encode("1", "fp8-e4m3"), math.nan) is False  # no overflow, no other mode
    assert check_text(over, {"fp8-e4m3": math.nan}).plain == "✓ NaN: this torch does not saturate"
    assert check_text(over, {"fp8-e4m3": 448.0}).plain == "✓ same"


@pytest.mark.parametrize("value", ["0.1", "65504", "70000", "1e-8", "3.4e38", "-2.5", "448", "1000"])
def test_a_real_torch_cast_stores_what_the_theory_says(value):
    from tutor.worker.jobs import torch_cast

    names = ("fp32", "bf16", "fp16", "fp8-e4m3", "fp8-e5m2")
    cast = torch_cast(value, names)
    for row in encodings(value, names):
        assert torch_agrees(row, cast[row.format.name]), (value, row.format.name, cast[row.format.name])


# ---- calculators ---------------------------------------------------------------------------------

def test_typed_fields_from_text():
    assert coerce("batch", " 1,024 ") == 1024
    assert coerce("sequence_parallel", "yes") is True
    assert coerce("mfu", "40%") == 0.4 and coerce("mfu", "0.5") == 0.5
    assert coerce("tokens", "15T") == "15T"  # counts and sizes are parsed by the engine's field check
    with pytest.raises(UserError, match="batch must be a whole number"):
        coerce("batch", "four")


def test_build_request_uses_the_engine_field_names():
    request = build_request({"model": "llama-3.1-8b", "batch": 4, "seq": 2048, "mode": "train", "zero": 3,
                             "sequence_parallel": True}, gpu=False)
    assert (request.batch, request.seq_len, request.mode, request.zero) == (4, 2048, "train", 3)
    assert request.sequence_parallel is True and request.gpu is False
    with pytest.raises(UserError):
        build_request({"zero": 4}, gpu=True)


def test_memory_calculator_matches_the_fit_engine():
    from rich.console import Console
    from tutor.files.models import resolve_model

    machine = fake_machine()
    values = {"model": "llama-3.1-8b", "mode": "inference", "batch": 1, "seq": 4096}
    console = Console(width=120, record=True)
    console.print(calc_renderable("memory", values, machine))
    text = console.export_text()
    arch, _ = resolve_model("llama-3.1-8b")
    estimate = fitting.estimate(arch, build_request(values, gpu=False))
    # Llama-3.1-8B: 8,030,261,248 parameters (model card) x 2 B = 14.96 GiB of bf16 weights.
    assert "8,030,261,248 params x 2 B" in text and "14.96" in text
    assert f"{estimate.worst.total / GiB:,.2f}" in text
    assert "available RAM 20 GiB" in text


def activations_row_gib(text: str) -> float:
    """The own-maximum GiB of the activations row of a rendered memory calculator."""
    import re

    return float(re.search(r"^activations\s+([\d,]+\.\d+)", text, re.MULTILINE).group(1).replace(",", ""))


@pytest.mark.parametrize("impl", ["hf", "fused"])
def test_training_calculator_shows_the_peak_moment_and_the_implementation(impl):
    from rich.console import Console
    from tutor.files.models import resolve_model

    values = {"model": "llama-3.1-8b", "mode": "train", "batch": 8, "seq": 4096, "impl": impl, "memory": "80GB"}
    console = Console(width=160, record=True)
    console.print(calc_renderable("memory", values, fake_machine()))
    text = console.export_text()
    arch, _ = resolve_model("llama-3.1-8b")
    worst = fitting.estimate(arch, build_request(values, gpu=True)).worst
    assert worst.sum_of_components != worst.total  # the two views differ, so the check below can fail
    total_row = next(line for line in text.splitlines() if line.startswith("total"))
    assert total_row.split()[1:3] == [f"{worst.sum_of_components / GiB:,.2f}", f"{worst.total / GiB:,.2f}"]
    assert f"must fit: the peak, in {worst.peak.phase}" in text and "at peak" in text
    gradients_row = next(line for line in text.splitlines() if line.startswith("gradients"))
    assert gradients_row.split()[2] == f"{worst.peak.per_category['gradients'] / GiB:,.2f}"
    assert activations_row_gib(text) == round(worst.component("activations") / GiB, 2)
    assert f"activations assume impl {impl}" in text


def test_switching_impl_to_fused_lowers_llama_training_activations():
    from rich.console import Console

    figures = {}
    for impl in ("hf", "fused"):
        console = Console(width=160, record=True)
        console.print(calc_renderable("memory", {"model": "llama-3.1-8b", "mode": "train", "impl": impl},
                                      fake_machine()))
        figures[impl] = activations_row_gib(console.export_text())
    assert figures["hf"] > figures["fused"] > 0


def test_fit_calculator_suggests_changes_when_it_does_not_fit():
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(calc_renderable("fit", {"model": "llama-3.1-70b", "mode": "train", "seq": 4096},
                                  fake_machine()))
    text = console.export_text()
    assert "does not fit" in text
    assert "would fit with one of these changes:" in text and "no single change" not in text
    assert "set " in text and "--" not in text  # the form's own fields, not command-line flags


def test_flops_and_roofline_calculators():
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(calc_renderable("flops", {"model": "llama-3.1-8b", "tokens": "15T", "dp": 1, "mfu": 0.4},
                                  fake_machine()))
    console.print(calc_renderable("roofline", {"m": 4096, "n": 4096, "k": 4096, "dtype": "bf16"}, fake_machine()))
    console.print(calc_renderable("roofline", {"m": 1, "n": 4096, "k": 4096, "dtype": "bf16",
                                               "model": "llama-3-8b", "batch": 1}, fake_machine()))
    text = console.export_text()
    # Llama 3.1 paper: 8B trained on ~15T tokens; 6 x 8.03e9 x 15e12 = 7.23e23 FLOPs.
    assert "= 7.23 × 10²³ FLOPs" in text and "e+23" not in text
    # ... on one H100 SXM at 40 % of 989.4 TFLOP/s: 7.227e23 / 3.958e14 = 1.826e9 s = 57.9 years.
    assert "1 x H100 SXM5 80GB at 40% of its bf16 peak: 57.9 years" in text
    # Square n=4096 in bf16: 2n/(3b) = 8192/6 = 1,365.3 FLOP/B; H100 SXM ridge 989.4e12/3.35e12 = 295.
    assert "1,365.3 FLOP per byte" in text and "ridge 295 FLOP/B -> compute-bound" in text
    # roofline.py: Llama-3-8B bf16 decode on H100 SXM: 3.35e12 / 16.06e9 B = 208.6 tokens/s at batch 1.
    assert "at most 209 tokens/s at batch 1" in text
    assert "this CPU: peak or bandwidth unknown" in text  # no published DRAM peak for a CPU


def test_calculators_reject_bad_fields():
    with pytest.raises(UserError):
        calc_renderable("memory", {"model": "no-such-model"}, fake_machine())
    with pytest.raises(UserError):
        calc_renderable("roofline", {"m": 0}, fake_machine())
    with pytest.raises(UserError):
        calc_renderable("weather", {}, fake_machine())


def test_capacity_is_gpu_memory_or_available_ram():
    assert machine_capacity(fake_machine()) == (20 * GiB, "this machine's available RAM", False)
    # A GPU offers its free memory, as `tensor-tutor fit` counts it (tutor.hardware.memory_budget).
    assert machine_capacity(fake_machine(gpu=True))[:2] == (79 * 10**9, "GPU 0: NVIDIA H100 80GB HBM3 free memory")


# ---- bench rows ----------------------------------------------------------------------------------

def test_bench_rows_from_real_bench_results():
    from tutor.bench.bandwidth import BandwidthResult
    from tutor.bench.matmul import MatmulResult

    matmul = MatmulResult("cpu", "fp32", "torch", 1024, 1024, 1024, 0.12, 0.13, 0.12, 0.2688, 44.6, "formula",
                          10, False, 0.05, ("small size",))
    other = MatmulResult("cpu", "fp32", "numpy", 1024, 1024, 1024, 0.1, 0.1, 0.1, 0.2688, 37.2, "formula",
                         10, False, 0.05, (), headline=False)
    triad = BandwidthResult("cpu", "triad", 3 * 8 * 10**6, "3 x N x 8 B", 8 * 10**6, 9.0, 9.8, None, None, 10,
                            False, 0.02, ())
    rows = bench_rows([matmul, other, triad])
    # Every row is its case's one headline, the median (tutor.bench.record), labelled: the triad row
    # showed the best (9.8) while `bench history` showed the median (9.0).
    assert rows == (BenchRow("matmul fp32", 0.12, 0.2688, "TFLOP/s", "torch; small size", "median of 10 at 1024²"),
                    BenchRow("bandwidth triad", 9.0, None, "GB/s", "", "median of 10 at 7.63 MiB per array"))
    assert rows[0].fraction == pytest.approx(0.12 / 0.2688) and rows[1].fraction is None
    assert BenchRow("x", 3.0, 2.0, "GB/s").fraction is None  # above the peak: no percentage


# ---- help ----------------------------------------------------------------------------------------

def test_help_prefers_the_focused_block_then_the_screen():
    class Screen:
        HELP = "screen help"
        parent = None

    class Block:
        HELP = "block help"

        def __init__(self, parent):
            self.parent = parent

    class Input:
        HELP = ""

        def __init__(self, parent):
            self.parent = parent

    screen = Screen()
    text = help_for(Input(Block(screen)), screen)
    assert text.index("block help") < text.index("screen help") < text.index(GLOBAL_HELP)
    assert help_for(None, screen).startswith("screen help")


def test_a_rate_above_its_peak_points_to_the_explanation() -> None:
    from tutor.labs import Measurement as LabMeasurement

    row = LabMeasurement("fp32 matmul", 0.313, "TFLOP/s", 0.269, note="the clock must have been at least 2.44 GHz",
                         rate=True)
    assert percent_cell(row) == "above the peak: see why"


def test_percent_cell_equal_at_its_precision_is_not_above_theory():
    # moe-routing's balanced share 0.25002 against k/E = 0.25 once read "100.0 % (above theory)".
    assert percent_cell(Measurement("a", 0.25002, "fraction", 0.25)) == "100.0 %"
    assert percent_cell(Measurement("a", 0.2502, "fraction", 0.25)) == "100.1 % (above theory)"
