"""`fit` sums the safetensors files transformers would load, checked as the safetensors library
checks their headers; a header the library refuses is one clear line, never a sum."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tutor.errors import UserError
from tutor.files.models import checkpoint_summary, load_preset, safetensors_summary


def write_file(path: Path, header: dict, data_bytes: int) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(data_bytes))


def f32(*spans: tuple[str, int, int]) -> dict:
    return {name: {"dtype": "F32", "shape": [(end - begin) // 4], "data_offsets": [begin, end]}
            for name, begin, end in spans}


def library_refuses(path: Path) -> bool | None:
    """Whether the safetensors library itself refuses the file (None when it is not installed)."""
    try:
        from safetensors import safe_open
    except ImportError:
        return None
    try:
        with safe_open(str(path), "np"):
            return False
    except Exception:  # SafetensorError: the library's own refusal
        return True


BAD_HEADERS = {
    "a gap between tensors": (f32(("a", 4, 8)), 8),
    "two tensors on the same bytes": (f32(("a", 0, 4), ("b", 0, 4)), 4),
    "bytes after the last tensor": (f32(("a", 0, 4)), 8),
    "metadata that is not text": ({"__metadata__": {"format": 1}, **f32(("a", 0, 4))}, 4),
    "an F4 tensor ending inside a byte": ({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, 2),
}


@pytest.mark.parametrize("case", BAD_HEADERS)
def test_headers_the_library_refuses_are_refused_in_one_line(tmp_path: Path, case: str) -> None:
    header, data = BAD_HEADERS[case]
    path = tmp_path / "model.safetensors"
    write_file(path, header, data)
    assert library_refuses(path) in (True, None)
    with pytest.raises(UserError, match="is not a valid safetensors file") as refused:
        safetensors_summary(tmp_path)
    assert "\n" not in str(refused.value)


def test_a_header_the_library_reads_is_summed(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_file(path, {"__metadata__": {"format": "pt"}, **f32(("b", 4, 12), ("a", 0, 4))}, 12)
    assert library_refuses(path) in (False, None)
    assert safetensors_summary(tmp_path).total_bytes == 12


@pytest.fixture
def model_folder(tmp_path: Path) -> Path:
    config, _ = load_preset("qwen2.5-1.5b")
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_model_safetensors_is_taken_before_an_index_as_transformers_does(model_folder: Path) -> None:
    write_file(model_folder / "model.safetensors", f32(("a", 0, 16)), 16)
    write_file(model_folder / "model-00001-of-00001.safetensors", f32(("a", 0, 400)), 400)
    (model_folder / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": "model-00001-of-00001.safetensors"}}))
    summary = checkpoint_summary(str(model_folder))
    assert summary is not None and (summary.checkpoint_format, summary.total_bytes) == ("hf-single", 16)


def test_stray_safetensors_files_are_not_a_checkpoint(model_folder: Path) -> None:
    # An adapter and an optimizer state beside a config: transformers loads neither as the model.
    write_file(model_folder / "adapter_model.safetensors", f32(("a", 0, 64)), 64)
    write_file(model_folder / "optimizer.safetensors", f32(("m", 0, 128)), 128)
    assert checkpoint_summary(str(model_folder)) is None
    with pytest.raises(UserError, match="not counted: adapter_model.safetensors, optimizer.safetensors"):
        safetensors_summary(model_folder)


def test_transformers_weights_in_the_config_names_the_file(model_folder: Path) -> None:
    config = json.loads((model_folder / "config.json").read_text())
    (model_folder / "config.json").write_text(json.dumps({**config, "transformers_weights": "weights.safetensors"}))
    write_file(model_folder / "weights.safetensors", f32(("a", 0, 8)), 8)
    write_file(model_folder / "model.safetensors", f32(("a", 0, 800)), 800)
    summary = checkpoint_summary(str(model_folder))
    assert summary is not None and summary.total_bytes == 8


def test_a_fifo_named_model_safetensors_is_refused_not_skipped(model_folder: Path) -> None:
    import os

    os.mkfifo(model_folder / "model.safetensors")
    with pytest.raises(UserError, match="model.safetensors is not a regular file"):
        checkpoint_summary(str(model_folder))
