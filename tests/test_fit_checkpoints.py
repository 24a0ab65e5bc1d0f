"""`fit FOLDER` on shard sets as they are downloaded: incomplete sets refused, one format counted."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from tutor.cli import main
from tutor.commands.group import cli
from tutor.files.models import load_preset


def write_header_only(path: Path, tensors: dict[str, list[int]]) -> None:
    """A BF16 safetensors file with zero-filled data: the headers are all `fit` reads."""
    header, offset = {}, 0
    for name, shape in tensors.items():
        size = 2
        for dim in shape:
            size *= dim
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    config, _ = load_preset("qwen2.5-1.5b")
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_fit_refuses_a_folder_with_shards_missing(folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_header_only(folder / "model-00001-of-00004.safetensors", {"a": [4, 4]})
    index = {"weight_map": {f"t{k}": f"model-0000{k}-of-00004.safetensors" for k in range(1, 5)}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(SystemExit) as exit_:
        main(["fit", str(folder), "--device", "24GiB"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "incomplete checkpoint" in err[0] and "model-00004-of-00004.safetensors" in err[0]


def test_fit_counts_one_format_and_says_which(folder: Path) -> None:
    write_header_only(folder / "model.safetensors", {"a": [4, 4]})
    write_header_only(folder / "consolidated.safetensors", {"a": [4, 4]})
    result = CliRunner().invoke(cli, ["fit", str(folder), "--device", "24GiB", "--json"], catch_exceptions=False)
    checkpoint = json.loads(result.output)["checkpoint"]
    assert (checkpoint["total_elements"], checkpoint["format"], checkpoint["skipped_files"]) == (
        16, "hf-single", ["consolidated.safetensors"])
    assert json.loads(result.output)["per_device_bytes"]["weights"] == 32  # 16 BF16 elements, counted once


def test_fit_text_line_names_the_format_counted(folder: Path) -> None:
    write_header_only(folder / "model.safetensors", {"a": [4, 4]})
    write_header_only(folder / "consolidated.safetensors", {"a": [4, 4]})
    result = CliRunner().invoke(cli, ["fit", str(folder), "--device", "24GiB"], terminal_width=200,
                                catch_exceptions=False)
    line = next(line for line in result.output.splitlines() if line.startswith("checkpoint:"))
    assert "Hugging Face model.safetensors" in line and "not counted: consolidated.safetensors" in line
