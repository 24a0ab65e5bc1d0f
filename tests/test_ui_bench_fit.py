"""The Bench screen's history and comparison, the Fit screen's fields and advice, the calculators'
units (sizes, lengths, card names) and palette export, driven with Pilot on the fakes of ui_fakes."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest


from tests.ui_fakes import FakeProbe, fake_machine, fake_services, sync

from textual.app import App
from textual.widgets import Input, OptionList, Static

from tutor.bench.notebook import append_run, read_notebook
from tutor.errors import UserError
from tutor.lessons.calc_fields import CALC_FIELDS, memory_text, parse_length, parse_memory_size
from tutor.lessons.model import Calc
from tutor.theory import fit as fitting
from tutor import export
from tutor.ui.app import TutorApp
from tutor.ui.commands import export_current
from tutor.ui.screens.bench import BenchScreen
from tutor.ui.widgets.calc import CalcBlock, change_in_fields, coerce, shown


# ---- a notebook of three runs: fp32 measured at two sizes, one run cancelled ---------------------

def matmul(dtype: str, size: int, tflops: float, peak: float) -> dict:
    return {"kind": "matmul", "device": "cpu", "dtype": dtype, "m": size, "n": size, "k": size, "backend": "torch",
            "tflops_median": tflops, "tflops_best": tflops, "tflops_mean": tflops, "peak_tflops": peak,
            "percent_of_peak": 100 * tflops / peak, "peak_source": "fake", "peak_note": "", "iters": 10,
            "noisy": False, "spread": 0.02, "notes": ["small size"], "headline": True, "sweep": []}


def bandwidth(op: str, gbps: float) -> dict:
    return {"kind": "bandwidth", "device": "cpu", "op": op, "bytes": 3 * 2**27, "bytes_counting": "STREAM",
            "array_bytes": 2**27, "gbps_median": gbps, "gbps_best": gbps, "peak_gbps": None,
            "percent_of_peak": None, "iters": 10, "noisy": False, "spread": 0.03, "notes": []}


def write_notebook(folder: Path) -> None:
    path = folder / "results.jsonl"
    header = {"command": "tensor-tutor bench --quick", "cancelled": False}
    append_run({**header, "date": "2025-01-10T10:00:00+00:00"},
               [matmul("fp32", 1024, 0.120, 0.2688), matmul("bf16", 512, 0.030, 0.5376),
                bandwidth("copy", 9.0), bandwidth("triad", 9.6), bandwidth("write", 6.0)], path)
    append_run({**header, "date": "2025-01-11T10:00:00+00:00", "cancelled": True},
               [matmul("fp32", 1024, 0.118, 0.2688)], path)
    append_run({**header, "date": "2025-01-12T10:00:00+00:00"},
               [matmul("fp32", 2048, 0.130, 0.2688), matmul("bf16", 512, 0.033, 0.5376),
                bandwidth("copy", 9.9), bandwidth("triad", 10.56), bandwidth("write", 6.3)], path)


@pytest.fixture
def data_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def notebook(data_dir) -> Path:
    write_notebook(data_dir)
    return data_dir


def text_of(widget: Static) -> str:
    from rich.console import Console

    console = Console(width=200, record=True, file=io.StringIO())
    console.print(widget.content)
    return console.export_text()


# ---- calculator fields: units a learner types ----------------------------------------------------

def test_lengths_take_a_binary_k_as_model_cards_mean_it():
    # Llama-3.1's "128K context" is max_position_embeddings = 131072 in its config.json.
    from tutor.files.models import load_preset

    config, _ = load_preset("llama-3.1-8b")
    assert parse_length("128k") == config["max_position_embeddings"] == 131_072
    assert (parse_length("4,096"), parse_length("8K"), CALC_FIELDS["seq"].check("32k")) == (4096, 8192, 32768)
    with pytest.raises(UserError, match="128k = 131,072"):
        parse_length("128 thousand")


def test_a_bare_memory_size_is_gigabytes_and_is_shown_back_in_units():
    assert parse_memory_size("80") == 80 * 10**9 == CALC_FIELDS["memory"].check("80")
    assert parse_memory_size("24GiB") == 24 * 2**30 and parse_memory_size("1,000") == 10**12
    assert (memory_text(80 * 10**9), memory_text(24 * 2**30), memory_text(1000)) == ("80 GB", "24 GiB", "1,000 B")
    assert shown(80 * 10**9, "memory") == "80 GB" and coerce("memory", shown(80 * 10**9, "memory")) == 80 * 10**9
    with pytest.raises(UserError, match="a bare number is GB"):
        parse_memory_size("lots")


def test_card_names_are_the_fit_commands_and_unknown_ones_get_close_names():
    check = CALC_FIELDS["device"].check
    assert (check("a100"), check("h200"), check("RTX 4090"), check("h100")) == (
        "a100-80gb-sxm", "h200-sxm", "rtx-4090", "h100-sxm")
    with pytest.raises(UserError, match=r"did you mean h100.*models --devices"):
        check("h1000")


def test_typed_fields_parse_lengths_and_sizes():
    assert coerce("seq", "128k") == 131_072 and coerce("m", "4k") == 4096
    assert coerce("device", "a100", "roofline") == "a100-80gb-sxm"
    assert coerce("device", "24GiB", "fit") == "24GiB"  # the Fit screen's device is fit --device's
    with pytest.raises(UserError, match="unknown GPU"):
        coerce("device", "h2000", "flops")


class CalcApp(App[None]):
    def __init__(self, block: Calc) -> None:
        super().__init__()
        self.block = block

    def compose(self):
        yield CalcBlock(self.block, lesson_id="memory/fit-check", services=fake_services(), id="calc")


@sync
async def test_a_calculator_shows_memory_in_gb_reads_a_bare_number_as_gb_and_a_128k_seq():
    block = Calc("memory", "llama-3.1-8b", ("model", "mode", "seq", "memory"),
                 {"model": "llama-3.1-8b", "mode": "inference", "seq": 4096, "memory": 80 * 10**9}, id="c")
    app = CalcApp(block)
    async with app.run_test(size=(120, 40)) as pilot:
        memory = app.query_one("#field-memory", Input)
        assert memory.value == "80 GB" and "GB" in memory.placeholder
        memory.value = "24"
        await pilot.pause()
        calc = app.query_one(CalcBlock)
        assert calc.values["memory"] == 24 * 10**9
        assert "a 22.4 GiB (24 GB) device" in text_of(app.query_one("#output", Static))
        app.query_one("#field-seq", Input).value = "128k"
        await pilot.pause()
        assert calc.values["seq"] == 131_072
        assert "131072 tokens" in text_of(app.query_one("#output", Static))


@sync
async def test_a_device_field_completes_card_names():
    block = Calc("roofline", None, ("m", "n", "k", "dtype", "device"), {"device": "h100-sxm"}, id="r")
    app = CalcApp(block)
    async with app.run_test(size=(120, 40)) as pilot:
        device = app.query_one("#field-device", Input)
        assert await device.suggester.get_suggestion("a100-4") == "a100-40gb"
        device.value = "h20"
        await pilot.pause()
        assert "did you mean" in text_of(app.query_one("#output", Static))
        device.value = "h200"
        await pilot.pause()
        assert "H200" in text_of(app.query_one("#output", Static))


# ---- Fit screen ------------------------------------------------------------------------------------

def test_advice_names_the_fields_to_change():
    after = fitting.FitRequest(mode="train", seq_len=8192, recompute="full", zero=3, dp=8, tp=8,
                               sequence_parallel=True)
    changes = tuple(fitting.Change(name, getattr(after, name))
                    for name in ("recompute", "tp", "sequence_parallel", "zero", "dp"))
    suggestion = fitting.Suggestion(changes, "", after, 0)
    assert change_in_fields(suggestion) == "set dp to 8, tp to 8, zero to 3, sp to yes, recompute to full (64 GPUs)"


async def fit_screen(pilot, **values) -> CalcBlock:
    """Open the Fit screen and set fields through its widgets, as a learner would."""
    from textual.widgets import Select

    app = pilot.app
    app.action_fit()
    await pilot.pause()
    form = app.screen.query_one("#fit-form", CalcBlock)
    for name, value in values.items():
        widget = form.query_one(f"#field-{name}")
        widget.value = value if isinstance(widget, Select) else shown(value, name)
        await pilot.pause()
    return form


@sync
async def test_fit_screen_has_every_fit_option_and_advises_in_its_own_terms(data_dir):
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        form = await fit_screen(pilot, model="llama-3.1-70b", mode="train", device="h100", seq=8192)
        for name in ("model", "mode", "device", "recipe", "optimizer", "batch", "seq", "dp", "tp", "pp", "zero",
                     "sequence_parallel", "recompute", "attention", "impl", "kv_dtype"):
            assert form.query(f"#field-{name}"), name
        text = text_of(form.query_one("#output", Static))
        assert "does not fit" in text and "H100 SXM5 80GB" in text
        assert "set " in text and " to " in text and "--" not in text  # fields, never command-line flags
        arch, _ = __import__("tutor.files.models", fromlist=["x"]).resolve_model("llama-3.1-70b")
        request = fitting.FitRequest(mode="train", seq_len=8192)
        found = fitting.suggestions(arch, request, fitting_capacity("h100"))
        assert change_in_fields(found[0]) in text
        # A size works as the device too, as in `fit --device 24GiB`; nonsense says why in one line.
        app.screen.query_one("#field-device", Input).value = "640GB"
        await pilot.pause()
        assert "a 640GB device" in text_of(form.query_one("#output", Static))
        app.screen.query_one("#field-device", Input).value = "h1000"
        await pilot.pause()
        assert "unknown GPU or size 'h1000'" in text_of(form.query_one("#output", Static))


def fitting_capacity(card: str) -> int:
    from tutor.hardware.memory_budget import device_budget

    return device_budget(card, fake_machine()).capacity


# ---- Bench screen ----------------------------------------------------------------------------------

async def open_bench(pilot) -> BenchScreen:
    pilot.app.action_bench()
    await pilot.pause()
    await pilot.pause()
    return pilot.app.screen


@sync
async def test_bench_lists_saved_runs_marks_cancelled_and_shows_the_latest(notebook):
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_bench(pilot)
        history = screen.query_one("#history", OptionList)
        assert history.option_count == 3 and history.has_focus
        assert "cancelled" in str(history.get_option_at_index(1).prompt)
        assert "cancelled" not in str(history.get_option_at_index(2).prompt)
        assert screen.shown.number == 3
        bars = screen.query_one("#bars").items
        assert [item.label for item in bars][-1] == "bandwidth write" and len(bars) == 5
        assert bars[0].measured == pytest.approx(0.130)
        await pilot.press("up", "up")
        assert screen.shown.number == 1 and screen.query_one("#bars").items[0].measured == pytest.approx(0.120)


@sync
async def test_bench_compares_two_marked_runs_at_the_same_sizes_only(notebook):
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_bench(pilot)
        await pilot.press("m", "up", "up", "m")
        assert screen.marked == [3, 1]
        text = text_of(screen.query_one("#compare", Static))
        assert "run 1 against run 3" in text
        triad = next(line for line in text.splitlines() if "triad" in line)
        assert "10.6 GB/s" in triad and "9.6 GB/s" in triad and "0.909x" in triad
        fp32 = next(line for line in text.splitlines() if "fp32" in line)
        assert "sizes differ" in fp32 and "2048x2048x2048" in fp32 and "1024x1024x1024" in fp32
        await pilot.press("m")  # unmark run 1: the comparison goes
        assert screen.marked == [3] and "mark another" in text_of(screen.query_one("#compare", Static))


@sync
async def test_bench_with_an_empty_notebook_says_so_and_a_run_shows_its_outcome(data_dir):
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_bench(pilot)
        assert "no saved runs yet" in text_of(screen.query_one("#history-title", Static))
        assert screen.export_result() is None
        await pilot.press("r")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert screen.shown is not None and screen.shown.rows[0].label == "matmul fp32"  # the fake does not save


# ---- export -----------------------------------------------------------------------------------------

def probe_result():
    return FakeProbe("matmul").run({}, lambda fraction, text: None, None)


def test_probe_export_is_the_lab_commands_json_and_one_csv_row_per_measurement():
    result = probe_result()
    exported = json.loads(export.to_json(result))
    assert exported.pop("context")["device"] == "cpu"
    assert exported == json.loads(json.dumps(result.to_json()))
    rows = list(csv.DictReader(io.StringIO(export.to_csv(result))))
    assert [row["label"] for row in rows] == [row.label for row in result.rows]
    assert rows[0]["measured_gflops"] == "120.0" and "e" not in rows[2]["theory_mib"]
    markdown = export.to_markdown(result)
    assert markdown.startswith("# lab matmul on cpu") and "| matmul fp32 | 120 GFLOP/s | 269 GFLOP/s |" in markdown
    assert "1.05 MB" in markdown or "1 MiB" in markdown


def test_plain_numbers_never_use_scientific_notation():
    assert (export.plain_number(1.2e-06), export.plain_number(3.5e20), export.plain_number(None)) == (
        "0.0000012", "350000000000000000000", "")


def test_a_bench_run_exports_as_bench_json_and_its_cases(notebook):
    run = read_notebook().runs[2]
    exported = json.loads(export.to_json(run))
    assert exported.pop("context")["dtype"] == "fp32, bf16"
    assert exported == {"device": run.header, "results": list(run.results)}
    rows = list(csv.DictReader(io.StringIO(export.to_csv(run))))
    # 0.13 TFLOP/s, in the GFLOP/s the Bench screen shows it in
    assert len(rows) == 5 and rows[0]["size"] == "2048x2048x2048" and rows[0]["measured_gflops"] == "130.0"


def test_the_fit_export_is_the_fit_commands_json(data_dir):
    from tests.cli_runner import run

    code, out, err = run(["fit", "llama-3.1-70b", "--mode", "train", "--device", "h100", "--seq", "8192", "--json"])
    assert code == 0, err
    cli = json.loads(out)
    values = {"model": "llama-3.1-70b", "mode": "train", "device": "h100", "seq": 8192, "dtype": "bf16",
              "recipe": "mixed", "optimizer": "adam", "batch": 1}
    ours = json.loads(export.to_json(export.FitValues(values, fake_machine())))
    for key in ("model", "mode", "request", "per_device_bytes", "peak", "fits", "largest_batch", "suggestions"):
        assert ours[key] == cli[key], key
    assert ours["device"]["capacity_bytes"] == cli["device"]["capacity_bytes"]


@sync
async def test_palette_export_saves_the_screens_result_and_says_where(data_dir):
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        export_current(app, "json")
        await pilot.pause()
        assert any("nothing to export yet" in n.message for n in app._notifications)
        app.last_result = probe_result()
        export_current(app, "csv")
        await pilot.pause()
        saved = list((data_dir / "exports").glob("lab-matmul-*.csv"))
        assert len(saved) == 1 and saved[0].read_text().startswith(
            "model,mode,dtype,device,date,tool_version,label,measured_gflops")
        assert any(str(saved[0]) in n.message for n in app._notifications)
        await fit_screen(pilot)
        export_current(app, "markdown")  # the screen's own result wins over the last measurement
        await pilot.pause()
        fit_file = next((data_dir / "exports").glob("fit-llama-3.1-8b-inference-*.md"))
        assert fit_file.read_text().startswith("# fit Llama-3.1-8B (inference)") or "| weights |" in fit_file.read_text()


@sync
async def test_the_palette_lists_the_exports():
    from tutor.ui.commands import TutorCommands

    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)):
        titles = [title for title, _, _ in TutorCommands(app.screen)._commands()]
        assert {"Export result as JSON", "Export result as CSV", "Export result as Markdown"} <= set(titles)
