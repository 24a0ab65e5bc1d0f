"""The commands as a user types them: JSON shapes, and bad input as one line with exit code 2."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli_runner import run


def assert_one_line_error(argv: list[str], fragment: str = "") -> str:
    code, out, err = run(argv)
    assert code == 2, (argv, code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tensor-tutor: error:"), err
    assert "Traceback" not in err and fragment.lower() in err.lower(), err
    return err


def test_fit_json_has_the_documented_shape() -> None:
    code, out, _ = run(["fit", "llama-3.1-8b", "--json", "--device", "24GiB"])
    assert code == 0
    report = json.loads(out)
    assert report["model"]["name"] == "Llama-3.1-8B"
    assert report["model"]["params_total"] == report["model"]["params_active"] == 8_030_261_248
    assert report["mode"] == "inference"
    per_device = report["per_device_bytes"]
    assert set(per_device) >= {"weights", "gradients", "optimizer", "activations", "kv_cache", "overhead", "total"}
    assert all(isinstance(value, int) for value in per_device.values())
    # total is what must fit: the tensors alive at the peak plus overhead, at most the sum of categories.
    assert per_device["total"] == report["peak"]["bytes"] + per_device["overhead"]
    assert per_device["total"] <= sum(v for k, v in per_device.items() if k != "total")
    assert report["device"]["capacity_bytes"] == 24 * 2**30
    assert report["fits"] is True
    assert report["largest_batch"] >= 1 and report["largest_seq_len"] >= 4096


def test_fit_training_reports_what_would_make_it_fit() -> None:
    code, out, _ = run(["fit", "llama-3.1-70b", "--mode", "train", "--device", "80GB", "--json"])
    report = json.loads(out)
    assert code == 0 and report["fits"] is False
    assert report["suggestions"] and all(s["total_bytes"] <= 80e9 for s in report["suggestions"])


def test_fit_moe_reports_active_parameters() -> None:
    report = json.loads(run(["fit", "mixtral-8x7b", "--json", "--device", "100GB"])[1])
    assert report["model"]["params_total"] == 46_702_792_704
    assert report["model"]["params_active"] == 12_879_925_248


def test_fit_bare_count() -> None:
    code, out, _ = run(["fit", "--params", "7.5B", "--mode", "train", "--dp", "64", "--zero", "3", "--json",
                        "--device", "32GB"])
    report = json.loads(out)
    assert code == 0 and report["model"]["params_total"] == 7_500_000_000
    states = sum(report["per_device_bytes"][k] for k in ("weights", "gradients", "optimizer"))
    assert states == 1_875_000_000  # ZeRO paper Figure 1: 1.875 GB per device


def test_fit_reads_a_config_file_and_a_folder_with_safetensors(tmp_path: Path) -> None:
    from tutor.files.models import load_preset

    config, _ = load_preset("qwen2.5-1.5b")
    (tmp_path / "config.json").write_text(json.dumps(config))
    header = json.dumps({"model.embed_tokens.weight": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}})
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(8))
    for spec in (str(tmp_path / "config.json"), str(tmp_path)):
        code, out, err = run(["fit", spec, "--json", "--device", "8GiB"])
        assert code == 0, err
        report = json.loads(out)
        assert report["model"]["params_total"] == 1_543_714_304
        # The headers (never the weights) say what is stored; inference uses those bytes.
        assert report["checkpoint"]["elements_by_dtype"] == {"BF16": 4}
        assert report["checkpoint"]["elements_minus_params"] == 4 - 1_543_714_304
        assert report["per_device_bytes"]["weights"] == 8
    explicit = json.loads(run(["fit", str(tmp_path), "--json", "--dtype", "bf16", "--device", "8GiB"])[1])
    assert explicit["per_device_bytes"]["weights"] == 2 * 1_543_714_304
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)
    assert_one_line_error(["fit", str(tmp_path)], "safetensors")


def test_models_lists_the_presets() -> None:
    code, out, _ = run(["models", "--json"])
    rows = json.loads(out)["models"]
    assert code == 0 and len(rows) >= 25
    assert {"llama-3.1-8b", "mixtral-8x7b", "deepseek-v3"} <= {row["name"] for row in rows}


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["fit", "llama-3.1-8bb"], "llama-3.1-8b"),          # unknown preset: suggests the close name
        (["fit", "no-such-model-at-all"], "preset"),
        (["fit", "llama-3.1-8b", "--zero", "5"], "zero"),
        (["fit", "llama-3.1-8b", "--dtype", "fp7"], "fp7"),
        (["fit", "llama-3.1-8b", "--kv-dtype", "q9"], "q9"),
        (["fit", "llama-3.1-8b", "--batch", "0"], "batch"),
        (["fit", "llama-3.1-8b", "--seq", "-5"], "seq"),
        (["fit", "llama-3.1-8b", "--tp", "3"], "tensor-parallel"),
        (["fit", "llama-3.1-8b", "--optimizer", "adamx"], "adamx"),
        (["fit", "llama-3.1-8b", "--recipe", "magic"], "magic"),
        (["fit", "llama-3.1-8b", "--mode", "finetune"], "mode"),
        (["fit", "llama-3.1-8b", "--device", "lots"], "lots"),
        (["fit", "llama-3.1-8b", "--device", "0GiB"], "size"),
        (["fit", "llama-3.1-8b", "--lora-targets", "x"], "lora"),
        (["fit", "--params", "-3B"], "count"),
        (["fit", "--params", "seven"], "seven"),
        (["fit"], "model"),
        (["fit", "llama-3.1-8b", "--params", "7B"], "either"),
        (["fit", "mixtral-8x7b", "--ep", "3", "--dp", "3"], "divide"),
        (["fit", "llama-3.1-8b", "--ep", "2", "--dp", "2"], "mixture-of-experts"),
        (["nosuchcommand"], "nosuchcommand"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(argv: list[str], fragment: str) -> None:
    assert_one_line_error(argv, fragment)


def test_gpu_index_without_a_gpu_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from tutor.hardware import detect_machine
    from tutor.hardware.memory_budget import device_budget

    machine = detect_machine()
    if machine.gpus:
        pytest.skip("this machine has a GPU")
    assert_one_line_error(["fit", "gpt2", "--device", "0"], "no gpu 0")
    assert device_budget(None).kind == "cpu"  # what fit uses without --device (tutor.answers.fit)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"", "empty"),
        (b"{not json", "json"),
        (b"\x00\x01\x02\xff\xfe binary", ""),
        (b"[1, 2, 3]", "object"),
        (b'"a string"', "object"),
        (b'{"model_type": "llama"}', "hidden_size"),
        # No causal-LM class in transformers (BERT has one, BertLMHeadModel, so fit now answers it).
        (b'{"model_type": "t5", "d_model": 512}', "t5"),
        (b'{"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 3, "num_hidden_layers": 2, '
         b'"intermediate_size": 11008, "vocab_size": 32000}', "head"),
        (b'{"model_type": "llama", "hidden_size": -4096, "num_attention_heads": 32, "num_hidden_layers": 2, '
         b'"intermediate_size": 11008, "vocab_size": 32000}', "hidden_size"),
    ],
)
def test_bad_config_files_are_one_line_errors(tmp_path: Path, content: bytes, fragment: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    assert_one_line_error(["fit", str(path)], fragment)


def test_missing_config_and_empty_folder(tmp_path: Path) -> None:
    assert_one_line_error(["fit", str(tmp_path / "nope.json")])
    assert_one_line_error(["fit", str(tmp_path)])


OPTION_VALUES = {
    "--mode": ["inference", "train", "x", ""],
    "--dtype": ["bf16", "fp8", "int4", "nf4-dq", "q4_k", "mxfp4", "zz", ""],
    "--recipe": ["mixed", "megatron", "hf-amp", "bf16", "fp32", "lora", "qlora", "?"],
    "--optimizer": ["adam", "sgd", "adam-8bit", "adafactor", "lion", "no"],
    "--batch": ["1", "8", "0", "-1", "1e3", "x", "99999999999999999999"],
    "--seq": ["1", "4096", "131072", "0", "-7", "nan"],
    "--dp": ["1", "2", "64", "0"], "--tp": ["1", "2", "8", "3", "0"], "--pp": ["1", "2", "4", "1000"],
    "--ep": ["1", "2", "8", "0"], "--zero": ["0", "1", "2", "3", "4", "-1"],
    "--recompute": ["none", "selective", "full", "x"], "--attention": ["eager", "flash", "x"],
    "--kv-dtype": ["bf16", "fp8", "fp32", "x"], "--microbatches": ["1", "8", "0"],
    "--lora-rank": ["1", "64", "0"], "--lora-targets": ["all-linear", "q,v", "q,,v", "qq"],
    "--device": ["24GiB", "80GB", "1", "cpu", "0", "-1GB", "1e400GB", "7", "GiB"],
    "--params": ["7B", "1", "0", "-1", "1e30", "x"],
}
MODELS = ["gpt2", "llama-3.1-8b", "mixtral-8x7b", "deepseek-v3", "gemma-2-9b", "qwen3-30b-a3b", "phi-3-mini-4k",
          "nope", ""]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(MODELS),
    options=st.lists(st.sampled_from(sorted(OPTION_VALUES)), max_size=5, unique=True),
    data=st.data(),
    flags=st.lists(st.sampled_from(["--sp", "--json"]), unique=True),
)
def test_fit_never_shows_a_traceback(model: str, options: list[str], data: st.DataObject, flags: list[str]) -> None:
    argv = ["fit"] + ([model] if model else [])
    for option in options:
        argv += [option, data.draw(st.sampled_from(OPTION_VALUES[option]))]
    code, out, err = run(argv + flags)
    assert code in (0, 2), (argv, code, err)
    assert "Traceback" not in err
    if code == 2:
        assert len(err.strip().splitlines()) == 1, err
    elif "--json" in flags:
        json.loads(out)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=12), max_size=6))
def test_any_argv_never_shows_a_traceback(argv: list[str]) -> None:
    code, _, err = run(["fit", *argv])
    assert code in (0, 2) and "Traceback" not in err


@pytest.mark.parametrize("argv, lesson", [([], None), (["learn"], None), (["learn", "memory/train"], "memory/train")])
def test_the_app_opens_without_click(monkeypatch: pytest.MonkeyPatch, argv: list[str], lesson: str | None) -> None:
    import tutor.commands.app_start

    opened = []
    monkeypatch.setattr(tutor.commands.app_start, "open_app", opened.append)
    assert run(argv)[0] == 0 and opened == [lesson]


def test_the_app_start_skips_click_in_a_fresh_interpreter(tmp_path) -> None:
    code = ("import sys\nimport tutor.commands.app_start as start\nstart.open_app = lambda lesson: None\n"
            "from tutor.cli import main\nmain(['learn'])\nprint(sorted(m for m in ('click', 'textual') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "TENSOR_TUTOR_DATA_DIR": str(tmp_path)})
    assert done.stdout.strip() == "[]"


def test_ctrl_c_before_the_app_starts_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import tutor.commands.app_start

    def interrupted(lesson: str | None) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(tutor.commands.app_start, "open_app", interrupted)
    code, _, err = run([])
    assert code == 130 and err == "tensor-tutor: cancelled\n"


@pytest.mark.parametrize("argv", [["learn", "--help"], ["learn", "a", "b"], ["--help"], ["learn", "-x"]])
def test_options_and_extra_words_go_to_click(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    import tutor.commands.app_start

    opened = []
    monkeypatch.setattr(tutor.commands.app_start, "open_app", opened.append)
    code, out, err = run(argv)
    assert opened == [] and (code == 0 and "Usage" in out or code == 2 and err.count("\n") == 1)


def test_completion_is_answered_by_click_not_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    from tutor.cli import opens_the_app

    assert opens_the_app([], {}) and not opens_the_app([], {"_TENSOR_TUTOR_COMPLETE": "bash_complete"})


def test_bare_command_lists_the_commands_without_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    import tutor.commands.registry

    monkeypatch.delitem(tutor.commands.registry.COMMANDS, "learn")
    code, out, err = run([])
    assert code == 0 and "fit" in out and "env" in out and not err


def test_version_and_help_exit_zero() -> None:
    assert run(["--version"])[0] == 0
    assert run(["fit", "--help"])[0] == 0


def test_lab_lists_and_runs_an_experiment() -> None:
    code, out, _ = run(["lab", "--json"])
    names = {entry["name"] for entry in json.loads(out)["labs"]}
    assert code == 0 and {"matmul", "moe-routing", "activation-memory"} <= names
    code, out, _ = run(["lab", "moe-routing", "tokens=16", "experts=8", "top_k=2", "--json"])
    result = json.loads(out)
    assert code == 0 and result["probe"] == "moe-routing" and not result["cancelled"]
    assert result["metrics"]


@pytest.mark.parametrize(("argv", "fragment"), [(["lab", "nope"], "unknown lab 'nope'"), (["lab", "matmul", "foo=1"], "foo"),
                                                (["lab", "moe-routing", "tokens"], "key=value")])
def test_lab_bad_input(argv: list[str], fragment: str) -> None:
    assert_one_line_error(argv, fragment)
