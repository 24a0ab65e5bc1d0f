"""fit reads a checkpoint's quantization_config and never mixes a preset with a folder it did not name:
a 4-bit Qwen3-32B is counted as 4-bit, a preset's name is the preset."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tutor.errors import UserError
from tutor.answers.fit import FitInputs, answer_fit
from tutor.files.models import load_preset, quantized_weights


@pytest.mark.parametrize(("block", "weight_format"), [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "gptq-int4-g128"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, "awq-int4-g128"),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "int8"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
      "bnb_4bit_use_double_quant": True}, "nf4-dq"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "nf4"),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "int8"),
    ({"quant_method": "fbgemm_fp8", "activation_scale_ub": 1200.0}, "fp8"),
    ({"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}, "fp8-block128"),
    ({"quant_method": "mxfp4"}, "mxfp4"),
    ({"quant_method": "compressed-tensors",
      "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}}}, "fp8"),
])
def test_each_scheme_maps_to_the_format_its_weights_are_stored_in(block: dict, weight_format: str) -> None:
    found = quantized_weights({"quantization_config": block})
    assert found is not None and found.weight_format == weight_format and found.scheme


def test_a_scheme_fit_cannot_count_is_an_error_not_bf16() -> None:
    with pytest.raises(UserError, match="quant_method 'hqq' is not a scheme fit counts"):
        quantized_weights({"quantization_config": {"quant_method": "hqq"}})
    assert quantized_weights({}) is None


def test_a_4bit_qwen3_32b_is_counted_as_4bit(tmp_path: Path) -> None:
    config, _ = load_preset("qwen3-32b")
    config["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}
    (tmp_path / "config.json").write_text(json.dumps(config))
    read = answer_fit(FitInputs.from_command(str(tmp_path), None, "rtx-4090", mode="inference"))
    stated = answer_fit(FitInputs.from_command(str(tmp_path), None, "rtx-4090", mode="inference",
                                               dtype="awq-int4-g128"))
    bf16 = answer_fit(FitInputs.from_command(str(tmp_path), None, "rtx-4090", mode="inference", dtype="bf16"))
    assert read.estimate.worst.total == stated.estimate.worst.total < bf16.estimate.worst.total
    assert read.fits is True and bf16.fits is False  # the case: 21.25 GiB fits a 24 GB card, bf16 does not
    assert any("AWQ 4-bit" in note for note in read.notes)


def test_a_preset_never_reads_a_folder_that_shares_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "llama-3.1-8b"
    folder.mkdir()
    header = json.dumps({"w": {"dtype": "F16", "shape": [4, 4], "data_offsets": [0, 32]}}).encode()
    (folder / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(32))
    (folder / "config.json").write_text(json.dumps(load_preset("llama-3.2-1b")[0]))  # another model
    monkeypatch.chdir(tmp_path)
    assert os.path.isdir("llama-3.1-8b")
    by_name = answer_fit(FitInputs.from_command("llama-3.1-8b", None, "24GiB", mode="inference"))
    assert by_name.checkpoint is None and "preset" in by_name.source
    by_path = answer_fit(FitInputs.from_command("./llama-3.1-8b", None, "24GiB", mode="inference"))
    assert by_path.checkpoint is not None  # the folder, named as a path, is read


def test_the_config_is_read_once_per_answer(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config was read once to resolve the model and again for its
    quantization_config; the scheme is now parsed as the config is read."""
    import tutor.files.models as model_files

    config, _ = load_preset("llama-3.2-1b")
    quantized = {**config, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    (tmp_path / "config.json").write_text(json.dumps(quantized))
    reads: list[object] = []
    real = model_files.load_config
    monkeypatch.setattr(model_files, "load_config", lambda path: reads.append(path) or real(path))
    answer = answer_fit(FitInputs.from_command(str(tmp_path), None, "24GiB", given=()))
    assert answer.request.dtype == "awq-int4-g128"
    assert len(reads) == 1
