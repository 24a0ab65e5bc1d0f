"""Every file the tool reads, damaged as a user, an editor, a download or a disk damages one, through the
real commands: a config or a command-line value is refused in one line with exit code 2; a state file
is set aside in one line and the next save works; a notebook run with a bad figure is left out, named,
and never used. Found by a hostile-input audit of every JSON and TOML reader (tutor.files.untrusted)."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli_runner import run
from tutor.bench.notebook import append_run, read_notebook
from tutor.lessons.progress import ProgressStore
from tutor.files.settings import Settings, load_settings, save_settings

PRESETS = Path(__file__).parent.parent / "tutor" / "presets"
HUGE = "1" + "0" * 5000  # past CPython's 4,300-digit limit on int <-> str


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "data"
    monkeypatch.setenv("TENSOR_TUTOR_DATA_DIR", str(folder))
    return folder


def preset_text(name: str = "llama-3.2-1b") -> str:
    return (PRESETS / f"{name}.json").read_text()


def one_line_refusal(code: int, out: str, err: str) -> str:
    assert code == 2, (code, out, err)
    assert err.startswith("tensor-tutor: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


# ---- config.json ------------------------------------------------------------------------------------


def test_a_config_with_a_5000_digit_integer_is_one_line_naming_the_file_and_field(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(preset_text().replace('"hidden_size": 2048', f'"hidden_size": {HUGE}', 1))
    err = one_line_refusal(*run(["fit", str(path)]))
    assert f"{path}: hidden_size is an integer of 5,001 digits, too large" in err


def test_a_config_field_of_the_wrong_type_names_the_file(tmp_path: Path) -> None:
    config = json.loads(preset_text())
    config["hidden_size"] = "abc"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    err = one_line_refusal(*run(["fit", str(path)]))
    assert err.startswith(f"tensor-tutor: error: {path}: ") and "hidden_size" in err and "'abc'" in err


@pytest.mark.parametrize("value", ["NaN", "Infinity", "1e999"])
def test_a_config_number_that_is_not_finite_is_refused_where_fit_reads_it_and_kept_where_transformers_writes_it(
        tmp_path: Path, value: str) -> None:
    """transformers writes Infinity itself (json.dumps: Mamba-2's time_step_limit is (0.0, inf)), so a field fit
    does not read may hold one; a field it reads may not, and --json stays strict JSON."""
    path = tmp_path / "config.json"
    path.write_text(preset_text().replace('"rms_norm_eps": 1e-05', f'"rms_norm_eps": {value}', 1))
    code, out, err = run(["fit", str(path), "--json"])
    assert code == 0, err
    json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} in --json"))
    path.write_text(preset_text().replace('"hidden_size": ', f'"hidden_size": {value}, "was": ', 1))
    err = one_line_refusal(*run(["fit", str(path)]))
    assert "hidden_size" in err


def test_a_100_kb_name_or_path_is_refused_at_once_and_a_long_one_shown_cut(tmp_path: Path) -> None:
    config = json.loads(preset_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**config, "_name_or_path": "x" * 100_000}))
    err = one_line_refusal(*run(["fit", str(path)]))
    assert "_name_or_path is text of 100,000 characters, over the 16,384" in err
    path.write_text(json.dumps({**config, "_name_or_path": "/models/" + "x" * 10_000 + "/tail-of-the-path"}))
    code, out, err = run(["fit", str(path), "--json"])
    assert code == 0, err
    name = json.loads(out)["model"]["name"]
    assert name.endswith("/tail-of-the-path") and len(name) == 120


def test_a_lone_surrogate_in_a_config_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(preset_text().replace('"model_type": "llama"', '"model_type": "llama", "x": "\\ud800"', 1))
    err = one_line_refusal(*run(["fit", str(path)]))
    assert "x holds a lone surrogate escape" in err


# ---- adapter_config.json ----------------------------------------------------------------------------


@pytest.mark.parametrize("rank, message", [(HUGE, "r is an integer of 5,001 digits, too large"),
                                           ('"abc"', 'r must be a positive whole number, got "abc"'),
                                           ("0", "r must be a positive whole number, got 0")])
def test_an_adapter_rank_that_is_no_rank_is_one_line(tmp_path: Path, rank: str, message: str) -> None:
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(
        '{"peft_type": "LORA", "base_model_name_or_path": "meta-llama/Llama-3.2-1B", '
        f'"target_modules": ["q_proj", "v_proj"], "r": {rank}}}')
    err = one_line_refusal(*run(["fit", str(adapter), "--mode", "train"]))
    assert f"adapter_config.json: {message}" in err


# ---- safetensors headers ----------------------------------------------------------------------------


def test_a_safetensors_header_with_a_huge_offset_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(preset_text())
    header = ('{"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, ' + HUGE + "]}}").encode()
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(12))
    err = one_line_refusal(*run(["fit", str(tmp_path)]))
    assert "model.safetensors is not a valid safetensors file: the header w.data_offsets[1] is an integer" in err


# ---- lab parameters on the command line -------------------------------------------------------------


@pytest.mark.parametrize("value, message", [(HUGE, "more than 4,300 digits, too large"),
                                            ("0x1" + "0" * 5000, "is an integer too large"),
                                            ("inf", "is inf, not a finite number"),
                                            ('["a", nan]', "budget_s[1] is nan, not a finite number"),
                                            ('"\\u001b[2J"', "holds a control character")])
def test_a_lab_parameter_that_toml_reads_but_no_lab_can_use_is_one_line(value: str, message: str) -> None:
    err = one_line_refusal(*run(["lab", "matmul", f"budget_s={value}"]))
    assert err.startswith("tensor-tutor: error: lab parameter budget_s") and message in err


# ---- progress.json and settings.json, as the app reads them at start ---------------------------------


@pytest.mark.parametrize("content, why", [
    ('{"lessons": {"a/b": {"attempts": ' + HUGE + "}}}", "an integer of 5,001 digits"),
    ('{"lessons": {"a/b": {"blocks": ["\\ud800"]}}}', "lone surrogate"),
])
def test_a_progress_file_that_could_crash_the_start_or_a_save_is_set_aside_in_one_line(
        data_dir: Path, content: str, why: str) -> None:
    data_dir.mkdir()
    (data_dir / "progress.json").write_text(content)
    code, out, err = run(["lessons", "--json"])
    assert code == 0 and "Traceback" not in err
    assert err.startswith("tensor-tutor: warning: progress.json was unreadable (") and why in err
    assert err.count("\n") == 1 and list(data_dir.glob("progress.json.corrupt-*"))
    store = ProgressStore(data_dir / "progress.json")
    store.mark_block("memory/roofline", "q1")  # the next save works
    assert "q1" in (data_dir / "progress.json").read_text()


@pytest.mark.parametrize("content, why", [('{"sample_hz": ' + HUGE + "}", "an integer of 5,001 digits"),
                                          ('{"theme": "nord\\udc80"}', "lone surrogate")])
def test_a_settings_file_that_could_crash_the_start_or_a_save_is_set_aside_in_one_line(
        data_dir: Path, content: str, why: str) -> None:
    from tutor.ui.services import default_services
    from tutor.worker.client import WorkerClient

    data_dir.mkdir()
    (data_dir / "settings.json").write_text(content)
    services = default_services(WorkerClient())  # what the app does at start (the worker is not started)
    (warning,) = services.warnings
    assert warning.startswith("settings.json was unreadable (") and why in warning and "\n" not in warning
    assert save_settings(Settings(theme="nord")) is None
    assert load_settings() == (Settings(theme="nord"), None)


# ---- the results notebook ---------------------------------------------------------------------------


def _good_run(data_dir: Path, date: str = "2026-12-01T10:00:00Z", scale: float = 1.0) -> None:
    sweep = [{"m": s, "n": s, "k": s, "tflops_median": scale * 0.02 * s / 1024, "tflops_best": 0.03}
             for s in (256, 512, 1024)]
    results = [
        {"kind": "matmul", "device": "cpu", "dtype": "bf16", "backend": "torch/mkl", "m": 1024, "n": 1024,
         "k": 1024, "tflops_median": scale * 0.02, "peak_tflops": 0.5, "peak_source": "CPU formula",
         "sweep": sweep, "headline": True},
        {"kind": "matmul", "device": "cpu", "dtype": "fp32", "backend": "torch/mkl", "m": 1024, "n": 1024,
         "k": 1024, "tflops_median": scale * 0.04, "peak_tflops": 0.5, "sweep": sweep, "headline": True},
        {"kind": "bandwidth", "device": "cpu", "op": "triad", "bytes": 3 * 2**27, "gbps_median": scale * 9.5,
         "sweep": [{"op": "triad", "size_bytes": 2**20 * n, "gbps": 9.5 * scale, "gbps_median": 9.0 * scale}
                   for n in (1, 8, 64)]},
    ]
    assert append_run({"date": date, "cancelled": False}, results, data_dir / "results.jsonl") is None


def _hand_edit_last_run(data_dir: Path, edit) -> None:
    path = data_dir / "results.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[-1])
    edit(record)
    lines[-1] = json.dumps(record)  # Python writes Infinity and NaN as an editor may
    path.write_text("\n".join(lines) + "\n")


def _set(field_path: tuple, value) -> object:
    def edit(record: dict) -> None:
        target = record["results"]
        for key in field_path[:-1]:
            target = target[key]
        target[field_path[-1]] = value
    return edit


HOSTILE_FIGURES = [
    ((0, "sweep"), "fast", 'results[0].sweep must be a list of objects, got "fast"'),
    ((0, "sweep", 1, "tflops_median"), "0.5", 'results[0].sweep[1].tflops_median must be a positive finite number, '
                                              'got "0.5"'),
    ((0, "sweep", 2, "tflops_median"), float("inf"), "results[0].sweep[2].tflops_median is Infinity, not a finite number"),
    ((2, "gbps_median"), 0, "results[2].gbps_median must be a positive finite number, got 0"),
    ((0, "sweep", 0, "m"), -256, "results[0].sweep[0].m must be a positive whole number, got -256"),
    ((2, "sweep", 1, "gbps"), float("nan"), "results[2].sweep[1].gbps is NaN, not a finite number"),
]


@pytest.mark.parametrize("field_path, value, said", HOSTILE_FIGURES)
def test_time_leaves_out_a_run_with_a_bad_figure_says_which_and_uses_the_run_before(
        data_dir: Path, field_path: tuple, value: object, said: str) -> None:
    data_dir.mkdir()
    _good_run(data_dir)
    _good_run(data_dir, "2026-12-02T10:00:00Z", scale=100.0)  # a hundred times faster, if it were read
    _hand_edit_last_run(data_dir, _set(field_path, value))
    code, out, err = run(["time", "gpt2", "--mode", "train", "--device", "cpu", "--batch", "2", "--seq", "512",
                          "--json"])
    assert code == 0, err
    report = json.loads(out)
    assert "bench run 1 (2026-12-01T10:00:00Z)" in report["sources"]["matmul"]  # the good run, not the edited one
    note = next(n for n in report["notes"] if n.startswith("skipped the run on results.jsonl line 2"))
    assert "2026-12-02T10:00:00Z" in note and note.endswith(said)


def test_time_says_why_when_the_only_run_has_a_bad_figure(data_dir: Path) -> None:
    data_dir.mkdir()
    _good_run(data_dir)
    _hand_edit_last_run(data_dir, _set((0, "sweep"), "fast"))
    err = one_line_refusal(*run(["time", "gpt2", "--mode", "train", "--device", "cpu"]))
    assert "no bench run with a bf16 matmul on cpu" in err and 'results[0].sweep must be a list of objects' in err


def test_fit_in_train_mode_times_its_suggestions_without_the_bad_run(data_dir: Path) -> None:
    data_dir.mkdir()
    _good_run(data_dir)
    _good_run(data_dir, "2026-12-02T10:00:00Z", scale=100.0)
    _hand_edit_last_run(data_dir, _set((0, "sweep"), "fast"))
    code, out, err = run(["fit", "llama-3.2-1b", "--mode", "train", "--device", "cpu", "--json"])
    assert code == 0, err
    answer = json.loads(out)
    sources = [s.get("step_source", "") for s in answer["suggestions"]]
    assert any("bench run 1 (2026-12-01T10:00:00Z)" in source for source in sources), sources
    assert not any("2026-12-02" in source for source in sources)
    (said,) = [note for note in answer["notes"] if note.startswith("skipped the run on results.jsonl line 2")]
    assert said.endswith('results[0].sweep must be a list of objects, got "fast"')
    code, text, err = run(["fit", "llama-3.2-1b", "--mode", "train", "--device", "cpu"])
    assert code == 0 and " ".join(text.split()).count("skipped the run on results.jsonl line 2") == 1


def test_bench_history_and_its_plot_name_the_run_left_out(data_dir: Path) -> None:
    data_dir.mkdir()
    _good_run(data_dir)
    _good_run(data_dir, "2026-12-02T10:00:00Z")
    _hand_edit_last_run(data_dir, _set((2, "sweep"), [{"size_bytes": "big", "gbps": 1.0}]))
    code, out, err = run(["bench", "history"])
    assert code == 0 and "2026-12-01" in out and "2026-12-02" not in out
    assert "skipped the run on results.jsonl line 2" in err and "results[2].sweep[0].size_bytes must be" in err
    code, out, err = run(["bench", "history", "--plot", "1"])
    assert code == 0 and "Traceback" not in err, err
    assert [run_.date for run_ in read_notebook().runs] == ["2026-12-01T10:00:00Z"]


def test_a_notebook_line_with_a_5000_digit_integer_is_left_out_in_one_line(data_dir: Path) -> None:
    data_dir.mkdir()
    _good_run(data_dir)
    path = data_dir / "results.jsonl"
    path.write_text(path.read_text().replace('"m":256', f'"m":{HUGE}', 1))
    _good_run(data_dir, "2026-12-02T10:00:00Z")  # the tail is whole JSON: nothing moved aside as torn
    notebook = read_notebook()
    assert [run_.date for run_ in notebook.runs] == ["2026-12-02T10:00:00Z"] and not notebook.set_aside
    assert notebook.skipped == ("skipped the run on results.jsonl line 1: results[0].sweep[0].m is an integer of "
                                "5,001 digits, too large (at most 40 digits)",)


# ---- any bytes as config.json -----------------------------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12)
CONFIG_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
               "intermediate_size", "vocab_size", "model_type", "_name_or_path", "torch_dtype",
               "tie_word_embeddings", "quantization_config", "head_dim", "max_position_embeddings")


@st.composite
def config_bytes(draw) -> bytes:
    """Bytes of every kind a config.json may hold: noise, JSON of any shape, or a real config with some
    fields replaced by anything JSON (or Python's json) can write."""
    kind = draw(st.sampled_from(["bytes", "json", "edited"]))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "json":
        return json.dumps(draw(JSON_VALUES)).encode()
    config = json.loads(preset_text())
    for key in draw(st.lists(st.sampled_from(CONFIG_KEYS), min_size=1, max_size=4)):
        config[key] = draw(JSON_VALUES | st.sampled_from(["<huge>", "\ud800", "\x1b[2J", "x" * 20_000]))
    text = json.dumps(config, ensure_ascii=True).replace('"<huge>"', HUGE)
    if draw(st.booleans()):  # cut where a disk or a download stops
        text = text[: draw(st.integers(min_value=0, max_value=len(text)))]
    return text.encode()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                HealthCheck.too_slow])
@given(content=config_bytes())
def test_any_bytes_given_as_config_json_are_an_answer_or_one_line_with_exit_code_2(tmp_path: Path,
                                                                                 content: bytes) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    code, out, err = run(["fit", str(path), "--json"])
    if code == 0:
        assert json.loads(out)["model"]
    else:
        one_line_refusal(code, out, err)


def test_the_bench_screen_shows_the_good_runs_and_names_the_one_left_out(data_dir: Path) -> None:
    from textual.widgets import OptionList
    from tests.ui_fakes import fake_services, sync, until

    from tutor.ui.app import TutorApp

    data_dir.mkdir()
    _good_run(data_dir)
    _good_run(data_dir, "2026-12-02T10:00:00Z")
    _hand_edit_last_run(data_dir, _set((0, "sweep"), "fast"))  # the sweep the screen would draw

    @sync
    async def scenario() -> None:
        app = TutorApp(fake_services())
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            app.action_bench()
            await until(pilot, lambda: app.screen.query("#history"), "the Bench screen")
            history = app.screen.query_one("#history", OptionList)
            await until(pilot, lambda: history.option_count == 1, "the one good run listed")
            await until(pilot, lambda: any("skipped the run on results.jsonl line 2" in str(note.message)
                                           for note in app._notifications), "the line naming the run left out")
            (note,) = [str(n.message) for n in app._notifications if "skipped the run" in str(n.message)]
            assert 'results[0].sweep must be a list of objects, got "fast"' in note

    scenario()


# ---- the caches -------------------------------------------------------------------------------------


def test_a_curriculum_index_cache_with_a_lone_surrogate_or_infinity_is_parsed_again(data_dir: Path) -> None:
    code, first, err = run(["lessons"])  # writes the cache
    assert code == 0, err
    cache = data_dir / "cache" / "curriculum-index.json"
    stored = json.loads(cache.read_text())
    title = stored["lessons"][0]["title"]
    stored["lessons"][0]["title"] = "Evil \ud800 title"  # json.dumps writes it as the escape "\ud800"
    stored["lessons"][1]["minutes"] = float("inf")
    cache.write_text(json.dumps(stored))
    code, out, err = run(["lessons", "--json"])
    assert code == 0, err
    out.encode("utf-8")  # printable: a terminal would raise UnicodeEncodeError on a lone surrogate
    lessons = json.loads(out)["lessons"]
    assert lessons[0]["title"] == title and all(isinstance(lesson["minutes"], int) for lesson in lessons)


def test_a_host_costs_cache_with_a_lone_surrogate_is_only_a_miss(data_dir: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tutor.trace import host_costs

    monkeypatch.setattr(host_costs, "cache_key", lambda config, device: "family")
    host_costs.cache_path().parent.mkdir(parents=True)
    rows = [["decode", "layer code", 1, 1e-4], ["decode", "model code", 1, 0.0]]
    for source in ("measured here", "measured \ud800 here"):
        host_costs.cache_path().write_text(json.dumps(
            {"format": host_costs.FORMAT, "entries": {"family": {"rows": rows, "source": source}}}))
        found = host_costs.host_costs_for({"model_type": "llama"}, "cpu")  # measuring is off in tests
        assert (found is not None) == (source == "measured here")
