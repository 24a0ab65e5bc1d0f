"""A PEFT adapter folder is fitted as its base model with the adapter on it, not as a model of
its own (the adapter's 6.5 MiB were the whole model's weights)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from tutor.cli import main
from tutor.commands.group import cli
from tutor.answers.fit import FitInputs, answer_fit
from tutor.files.models import load_preset
from tutor.theory.lora import lora_trainable_params
from tutor.theory.models import architecture_from_config

LLAMA_1B_KV_WIDTH = 512  # 8 KV heads x 64 (meta-llama/Llama-3.2-1B config.json)


def write_adapter(folder: Path, *, base: str = "meta-llama/Llama-3.2-1B", rank: int = 16,
                  targets: object = ("q_proj", "v_proj"), tensors: bool = True) -> Path:
    """adapter_config.json as PEFT writes it, and adapter_model.safetensors with the shapes PEFT saves for a
    Llama-3.2-1B LoRA on q and v (F32, zero data as a sparse file)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"peft_type": "LORA", "base_model_name_or_path": base, "r": rank, "lora_alpha": 2 * rank,
              "target_modules": list(targets) if isinstance(targets, tuple) else targets, "task_type": "CAUSAL_LM"}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    if tensors:
        header, offset = {}, 0
        for layer in range(16):
            for module, d_out in (("q_proj", 2048), ("v_proj", LLAMA_1B_KV_WIDTH)):
                for part, shape in (("lora_A", [rank, 2048]), ("lora_B", [d_out, rank])):
                    size = shape[0] * shape[1] * 4
                    header[f"base_model.model.model.layers.{layer}.self_attn.{module}.{part}.weight"] = {
                        "dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
                    offset += size
        raw = json.dumps(header).encode()
        with (folder / "adapter_model.safetensors").open("wb") as handle:
            handle.write(struct.pack("<Q", len(raw)) + raw)
            handle.truncate(8 + len(raw) + offset)
    return folder


def fit_json(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["fit", *args, "--device", "24GiB", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_an_adapter_is_fitted_on_its_base_model(tmp_path: Path) -> None:
    adapter = fit_json(str(write_adapter(tmp_path / "adapter")))
    base = fit_json("llama-3.2-1b")
    assert adapter["model"]["params_total"] == base["model"]["params_total"]
    adapter_bytes = 16 * 16 * (2 * 2048 + 2048 + LLAMA_1B_KV_WIDTH) * 4
    assert adapter["per_device_bytes"]["weights"] == base["per_device_bytes"]["weights"] + adapter_bytes
    assert any("LoRA adapter r=16 on q,v" in note for note in adapter["notes"])


def test_training_an_adapter_trains_its_own_parameters(tmp_path: Path) -> None:
    report = fit_json(str(write_adapter(tmp_path / "adapter", rank=32)), "--mode", "train")
    arch = architecture_from_config(load_preset("llama-3.2-1b")[0])
    assert report["request"]["recipe"] == "lora"
    assert (report["request"]["lora_rank"], report["request"]["lora_targets"]) == (32, ["q", "v"])
    assert report["model"]["params_trainable"] == lora_trainable_params(arch, rank=32, targets=("q", "v"))


def test_flags_given_override_the_adapter_config(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "adapter")
    report = fit_json(str(folder), "--mode", "train", "--lora-rank", "4", "--lora-targets", "all-linear")
    assert (report["request"]["lora_rank"], len(report["request"]["lora_targets"])) == (4, 7)


def test_a_local_base_folder_is_read_and_its_path_may_be_the_adapter_config(tmp_path: Path) -> None:
    config, _ = load_preset("qwen2.5-1.5b")
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "config.json").write_text(json.dumps(config))
    folder = write_adapter(tmp_path / "adapter", base=str(tmp_path / "base"), targets="all-linear", tensors=False)
    report = fit_json(str(folder / "adapter_config.json"), "--mode", "train")
    assert report["model"]["params_total"] == fit_json(str(tmp_path / "base"))["model"]["params_total"]
    assert report["request"]["lora_targets"] == ["q", "k", "v", "o", "gate", "up", "down"]


@pytest.mark.parametrize(("base", "says"), [("someone/unknown-7b", "neither a preset nor a local model folder"),
                                            ("", "names no base_model_name_or_path")])
def test_a_base_that_cannot_be_read_is_one_line_saying_to_pass_it(tmp_path: Path, base: str, says: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_adapter(tmp_path / "adapter", base=base)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", str(folder)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1
    assert says in err[0] and "pass the base model" in err[0] and "--lora-rank 16" in err[0]


def test_the_answer_is_the_same_through_answer_fit(tmp_path: Path) -> None:
    folder = write_adapter(tmp_path / "adapter")
    answer = answer_fit(FitInputs.from_command(str(folder), None, "24GiB", given=()))
    assert answer.name.startswith("Llama-3.2-1B + LoRA adapter") and "PEFT adapter" in answer.source
    assert answer.checkpoint is None  # the adapter's tensors are not the base's checkpoint
