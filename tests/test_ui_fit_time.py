"""The Fit screen's time beside memory (`tensor-tutor time`'s answer for the form's fields, worked out in a
thread), its memory timeline with the peak and its phase, and Ctrl+S saving pictures as SVG with their
data; driven with Pilot on the fakes of ui_fakes, each test waiting for the answer it checks."""

from __future__ import annotations

import csv
import io
import json
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest


from tests.ui_fakes import fake_services, sync, until

from tests.cli_runner import run
from tests.test_ui_bench_fit import fit_screen, text_of
from tutor import export
from tutor.errors import UserError
from tutor.formatting import format_bytes, format_duration, format_percent, format_rate
from tutor.answers.pictures import Chart, Mark, Point, Series, chart_json, timeline_chart
from tutor.theory import fit as fitting
from tutor.ui.app import TutorApp
from tutor.ui.widgets.calc import fit_advice


def time_json(argv: list[str]) -> dict:
    code, out, err = run(["time", *argv, "--json"])
    assert code == 0, err
    return json.loads(out)


async def settled_fit(pilot, **values):
    """The Fit screen with `values` set, once the time shown answers the form as it is now."""
    await fit_screen(pilot, **values)
    screen = pilot.app.screen
    await until(pilot, lambda: screen.time_settled, "the Fit screen's time")
    return screen


# ---- time beside memory ---------------------------------------------------------------------------

@sync
async def test_the_training_step_shown_is_the_time_commands_answer_for_the_same_fields():
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await settled_fit(pilot, model="llama-3.1-8b", mode="train", device="h100", seq=8192, batch=2,
                                   recompute="full")
        expected = time_json(["llama-3.1-8b", "--mode", "train", "--device", "h100", "--seq", "8192", "--batch", "2",
                              "--recompute", "full"])
        report = screen.fit_time.report
        assert report["step"] == expected["step"] and report["mfu"] == expected["mfu"]
        assert report["tokens_per_second"] == expected["tokens_per_second"]
        text = text_of(screen.query_one("#fit-time"))
        assert format_duration(expected["step"]["seconds"]) in text
        for phase in ("forward", "backward", "optimizer"):
            assert format_duration(expected["step"]["phases"][phase]) in text
        assert format_rate(expected["tokens_per_second"], "tokens/s") in text
        assert format_percent(expected["mfu"]["datasheet"]) in text
        assert format_percent(expected["mfu"]["measured_matmul"]) in text
        assert "mamf-finder" in text  # the matmul ceiling's source, as `time` names it
        # A change in the form gives a new answer: the shown step follows the field.
        before = report["step"]["seconds"]
        await fit_screen(pilot, recompute="none")
        await until(pilot, lambda: screen.time_settled, "the changed form's time")
        assert screen.fit_time.report["step"]["seconds"] != before
        assert screen.fit_time.report["step"] == time_json(
            ["llama-3.1-8b", "--mode", "train", "--device", "h100", "--seq", "8192", "--batch", "2"])["step"]


@sync
async def test_inference_shows_the_prefill_and_decode_that_time_answers():
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await settled_fit(pilot, model="llama-3.1-8b", mode="inference", device="a100-80gb")
        expected = time_json(["llama-3.1-8b", "--device", "a100-80gb"])
        assert screen.fit_time.report["prefill"] == expected["prefill"]
        text = text_of(screen.query_one("#fit-time"))
        assert format_duration(expected["prefill"]["seconds"]) in text
        for point in expected["decode"]:
            assert format_rate(point["tokens_per_second"], "tokens/s") in text
        # The picture is the prefill's: the same moments `fit --timeline` gives for inference.
        fitted = json.loads(run(["fit", "llama-3.1-8b", "--device", "a100-80gb", "--timeline", "--json"])[1])
        assert list(screen.fit_time.timeline) == fitted["timeline"]
        assert {moment["phase"] for moment in fitted["timeline"]} == {"prefill"}
        assert screen.query_one("#timeline").display


@sync
async def test_a_layout_that_does_not_fit_is_timed_under_the_line_the_command_prints():
    """Llama-3.1-8B trained on one H100 (no ZeRO, no recompute) needs about twice its memory: the panel says so above
    the step, as `time` does, in the form's words; a layout that fits says nothing of memory."""
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await settled_fit(pilot, model="llama-3.1-8b", mode="train", device="h100", seq="4096")
        text = text_of(screen.query_one("#fit-time"))
        expected = time_json(["llama-3.1-8b", "--mode", "train", "--device", "h100", "--seq", "4096"])
        assert expected["memory"]["fits"] is False
        assert "does not fit:" in text and format_bytes(expected["memory"]["per_device_bytes"]) in text
        assert "the memory above says" in text and "tensor-tutor fit" not in text
        await fit_screen(pilot, model="llama-3.2-1b", seq="1024")
        await until(pilot, lambda: screen.time_settled, "the time of a layout that fits")
        assert "does not fit" not in text_of(screen.query_one("#fit-time"))


@sync
async def test_without_a_bench_run_or_with_a_size_the_time_says_why_in_one_line():
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await settled_fit(pilot, model="llama-3.2-1b", mode="train")  # this machine, no bench run
        text = text_of(screen.query_one("#fit-time"))
        assert "bench --quick" in text and screen.fit_time.report is None
        assert "set device to a card such as h100" in text and "--device" not in text  # the form's words
        assert screen.query_one("#timeline").display  # the memory timeline needs no ceilings
        await fit_screen(pilot, device="24GiB")
        await until(pilot, lambda: screen.time_settled, "the time for a size")
        assert "not a memory size" in text_of(screen.query_one("#fit-time"))
        await fit_screen(pilot, seq="lots")
        await until(pilot, lambda: screen.time_settled, "the time for a bad field")
        assert "fix the field above" in text_of(screen.query_one("#fit-time")) and screen.fit_time is None


@sync
async def test_the_time_is_worked_out_off_the_event_loop(monkeypatch):
    import tutor.ui.screens.fit as fit_screen_module

    threads: list[bool] = []
    real = fit_screen_module.fit_time

    def recording(values, machine):
        threads.append(threading.current_thread() is threading.main_thread())
        return real(values, machine)

    monkeypatch.setattr(fit_screen_module, "fit_time", recording)
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        await settled_fit(pilot, model="llama-3.2-1b", mode="train", device="h100")
    assert threads and not any(threads)


@sync
async def test_an_older_answer_arriving_late_is_not_shown():
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await settled_fit(pilot, model="llama-3.2-1b", mode="train", device="h100")
        shown = screen.fit_time
        screen.show_time(screen.asked - 1, None, "time: an old question")
        assert screen.fit_time is shown and "an old question" not in text_of(screen.query_one("#fit-time"))


# ---- the memory timeline --------------------------------------------------------------------------

@sync
async def test_training_draws_the_memory_timeline_with_the_peak_marked_with_its_phase():
    expected = json.loads(run(["fit", "llama-3.2-1b", "--mode", "train", "--device", "h100", "--timeline",
                               "--json"])[1])
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await settled_fit(pilot, model="llama-3.2-1b", mode="train", device="h100")
        chart = screen.query_one("#timeline").chart
        assert [p.y for p in chart.series[0].points] == [float(m["bytes"]) for m in expected["timeline"]]
        peak = max(expected["timeline"], key=lambda moment: moment["bytes"])
        assert peak["bytes"] == expected["peak"]["bytes"]
        mark = chart.y_marks[0]
        assert mark.value == peak["bytes"] and mark.label == f"peak, in {peak['phase']}"
        peak_line = text_of(screen.query_one("#fit-peak"))
        assert format_bytes(peak["bytes"]) in peak_line and f"in the {peak['phase']} phase" in peak_line
        table = text_of(screen.query_one("#timeline .chart-table"))  # the text fallback: every moment
        assert all(moment["moment"] in table for moment in expected["timeline"])


def test_the_peak_mark_is_optional_so_fit_timeline_draws_as_before():
    timeline = [{"phase": "forward", "moment": "after layer 0", "bytes": 10, "per_category_bytes": {"weights": 10}},
                {"phase": "backward", "moment": "loss head", "bytes": 30, "per_category_bytes": {"weights": 30}}]
    assert timeline_chart(timeline).y_marks == ()
    marked = timeline_chart(timeline, peak_mark=True)
    assert marked.y_marks == (Mark("peak, in backward", 30.0),)
    assert marked.notes == ("peak 30 B at loss head (backward)",)


# ---- saving pictures ------------------------------------------------------------------------------

def small_chart() -> Chart:
    return Chart(title="a sweep", x_label="size", x_unit="B", y_label="bandwidth", y_unit="GB/s",
                 series=(Series("copy", (Point(4096.0, 12.5), Point(2.0**30, 0.0000012))),),
                 y_marks=(Mark("peak", 20.0),))


def test_picture_files_are_an_svg_with_its_data_as_csv_and_json(tmp_path):
    svg, table, described = export.save_picture_files([small_chart()], tmp_path / "out", "sweep", stamp="now")
    assert svg.read_text(encoding="utf-8").lstrip().startswith("<svg")
    rows = list(csv.DictReader(io.StringIO(table.read_text(encoding="utf-8"))))
    assert [(row["series"], row["size_bytes"], row["bandwidth_gbps"]) for row in rows] == [
        ("copy", "4096.0", "12.5"), ("copy", "1073741824.0", "0.0000012")]
    described_json = json.loads(described.read_text(encoding="utf-8"))
    assert described_json.pop("context")["tool_version"] and described_json == {"charts": [chart_json(small_chart())]}
    again = export.save_picture_files([small_chart()], tmp_path / "out", "sweep", stamp="now")
    assert again[0] != svg and svg.exists()  # a second save never overwrites the first
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    with pytest.raises(UserError, match="cannot write"):
        export.save_picture_files([small_chart()], blocked / "sub", "sweep")


@sync
async def test_ctrl_s_on_the_fit_screen_saves_the_timeline_and_says_where(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await settled_fit(pilot, model="llama-3.2-1b", mode="train", device="h100")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: list((tmp_path / "exports").glob("fit-timeline-*.svg")), "the saved picture")
        svg = next((tmp_path / "exports").glob("fit-timeline-*.svg"))
        assert any(str(svg) in note.message for note in app._notifications)
        data = json.loads(svg.with_suffix(".json").read_text(encoding="utf-8"))
        alive = data["charts"][0]["series"][0]
        assert max(p["y"] for p in alive["points"]) == screen.fit_time.peak["bytes"]
        assert svg.with_suffix(".csv").exists()
        # Inference draws the prefill: Ctrl+S saves that picture, its maximum the prefill's peak.
        await fit_screen(pilot, mode="inference")
        await until(pilot, lambda: screen.time_settled and screen.fit_time.timeline
                    and screen.fit_time.timeline[0]["phase"] == "prefill", "the inference answer")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: len(list((tmp_path / "exports").glob("fit-timeline-*.svg"))) == 2,
                    "the saved prefill picture")
        newest = max((tmp_path / "exports").glob("fit-timeline-*.json"), key=lambda path: path.stat().st_mtime_ns)
        prefill = json.loads(newest.read_text(encoding="utf-8"))["charts"][0]
        assert prefill["title"] == "memory alive over one prefill"
        assert max(p["y"] for p in prefill["series"][0]["points"]) == screen.fit_time.peak["bytes"]


@sync
async def test_ctrl_s_on_the_bench_screen_saves_the_runs_sweeps(tmp_path, monkeypatch):
    from tests.plot_data import HEADER, RESULTS

    from tutor.bench.notebook import append_run

    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(tmp_path))
    append_run(HEADER, RESULTS, tmp_path / "results.jsonl")
    app = TutorApp(fake_services())
    async with app.run_test(size=(120, 40)) as pilot:
        pilot.app.action_bench()
        await until(pilot, lambda: pilot.app.screen.query("#matmul-chart")
                    and pilot.app.screen.query_one("#matmul-chart").chart is not None, "the run's sweeps")
        await pilot.press("ctrl+s")
        await until(pilot, lambda: list((tmp_path / "exports").glob("bench-run-*.json")), "the saved pictures")
        data = json.loads(next((tmp_path / "exports").glob("bench-run-*.json")).read_text(encoding="utf-8"))
        assert [chart["title"] for chart in data["charts"]] == [
            "matmul throughput against size (median per shape)", "STREAM-like bandwidth against working set"]


@pytest.mark.slow
def test_a_picture_saved_from_the_app_opens_in_headless_chromium(tmp_path):
    """The Fit screen's saved SVG is a picture a browser draws: headless Chromium renders it to a PNG."""
    import shutil
    import subprocess
    from xml.etree import ElementTree

    from tutor.calculators import fit_time

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no Chromium here (apt-get install chromium)")
    answer = fit_time({"model": "llama-3.2-1b", "mode": "train", "device": "h100"}, None)
    svg, _, _ = export.save_picture_files([timeline_chart(list(answer.timeline), peak_mark=True)], tmp_path, "fit")
    assert ElementTree.parse(svg).getroot().tag.endswith("svg")
    png = tmp_path / "fit.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", f"--screenshot={png}",
                    "--window-size=1000,800", svg.as_uri()], capture_output=True, timeout=120, check=True)
    data = png.read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 10_000


# ---- suggestions' seconds --------------------------------------------------------------------------

@dataclass(frozen=True)
class TimedSuggestion(fitting.Suggestion):
    step_seconds: float | None = None


def test_a_suggestion_that_carries_its_step_seconds_shows_them():
    from types import SimpleNamespace

    after = fitting.FitRequest(mode="train", zero=3, dp=8)
    timed = TimedSuggestion((fitting.Change("zero", 3), fitting.Change("dp", 8)), "", after, 40 * 2**30,
                            step_seconds=1.25)
    plain = fitting.Suggestion((fitting.Change("recompute", "full"),), "", after, 50 * 2**30)
    answer = SimpleNamespace(fits=False, suggestions=(timed, plain))
    lines = [line.plain for line in fit_advice(answer)]
    assert lines[1].endswith(f"per GPU, {format_duration(1.25)} per step")
    assert lines[2].endswith("per GPU")
    # The fit answer's own timings, one per suggestion (with what step each is), win; one not timed shows none.
    from tutor.answers.fit import SuggestionTime

    times = (SuggestionTime(0.5, "training step", "s"), SuggestionTime(None, "training step", "not timed"))
    lines = [line.plain for line in fit_advice(SimpleNamespace(fits=False, suggestions=(timed, plain),
                                                               suggestion_times=times))]
    assert lines[1].endswith(f"per GPU, {format_duration(0.5)} per training step")
    assert lines[2].endswith("per GPU")
