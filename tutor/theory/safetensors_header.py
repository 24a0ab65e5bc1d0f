"""Count the tensors of a safetensors checkpoint from its headers alone, never touching the weights.

Format (huggingface/safetensors README, "Format"): 8 bytes little-endian unsigned N, then N bytes of
UTF-8 JSON mapping tensor name -> {"dtype", "shape", "data_offsets": [begin, end]} (offsets
relative to the byte after the header), plus an optional "__metadata__" map of strings; then the
data. Sharded checkpoints add model.safetensors.index.json whose "weight_map" names the shard of
each tensor (transformers' `modeling_utils`: SAFE_WEIGHTS_INDEX_NAME, shards named
model-00001-of-00004.safetensors by `huggingface_hub.split_torch_state_dict_into_shards`). Mistral's
repositories also ship consolidated.safetensors, the same weights in their original format, beside
the Hugging Face files: a folder holding both is counted once, in the format transformers loads.
An incomplete shard set is refused: summing the shards that are there would understate the model.
Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from tutor.errors import UserError
from tutor.theory.models import shown

# The reference implementation refuses headers above 100 MB (safetensors MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000
INDEX_FILE = "model.safetensors.index.json"
HF_SINGLE_FILE = "model.safetensors"
# name-0000k-of-0000N.safetensors, as huggingface_hub names shards (any prefix; 5 digits by default).
SHARD_NAME = re.compile(r"(?P<prefix>.+)-(?P<index>\d+)-of-(?P<count>\d+)\.safetensors")

# Bits per element of each safetensors dtype (safetensors Dtype enum; F4/F6 are packed sub-byte types).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32, "I64": 64, "U64": 64, "F64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "C64": 64,
}


@dataclass(frozen=True)
class SafetensorsSummary:
    """What the headers of a checkpoint say: file and tensor counts, elements per dtype, bytes of data."""

    files: int
    tensors: int
    elements_by_dtype: dict[str, int]
    total_elements: int
    total_bytes: int
    checkpoint_format: str = "safetensors"
    """Which files were summed: "hf-index", "hf-shards", "hf-single", "mistral-consolidated" or "safetensors"."""
    skipped: tuple[str, ...] = ()
    """Files left out because they hold the same weights in another format."""

    @property
    def format_note(self) -> str:
        """One line on which files were counted, for the fit report."""
        what = {"hf-index": f"Hugging Face shards listed in {INDEX_FILE}",
                "hf-shards": "Hugging Face shards (no index)", "hf-single": f"Hugging Face {HF_SINGLE_FILE}",
                "mistral-consolidated": "Mistral consolidated format",
                "safetensors": "every .safetensors file"}[self.checkpoint_format]
        if self.skipped:
            what += (f" (the format transformers loads); not counted: {', '.join(self.skipped)} "
                     "(the same weights in Mistral's original format)")
        return what


def _corrupt(path: Path, why: str) -> UserError:
    return UserError(f"{shown(path)} is not a valid safetensors file: {why}")


def read_safetensors_header(path: str | os.PathLike[str]) -> dict:
    """The JSON header of one .safetensors file, validated against the file's size.

    Reads only 8 + N bytes. Truncated, corrupt or oversized headers raise UserError.
    """
    path = Path(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO or device would block the read forever
            raise _corrupt(path, "not a regular file (a pipe, socket or device?)")
        size = info.st_size
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) < 8:
                raise _corrupt(path, f"only {len(prefix)} bytes, shorter than the 8-byte header length")
            (length,) = struct.unpack("<Q", prefix)
            if length < 2 or length > MAX_HEADER_BYTES:
                raise _corrupt(path, f"header length {length} is outside 2..{MAX_HEADER_BYTES} bytes")
            if 8 + length > size:
                raise _corrupt(path, f"header claims {length} bytes but the file has {size - 8} after the length")
            raw = handle.read(length)
    except UserError:
        raise
    except FileNotFoundError:
        raise UserError(f"no such file: {shown(path)}") from None
    except IsADirectoryError:
        raise UserError(f"{shown(path)} is a folder; give a .safetensors file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise UserError(f"cannot read {shown(path)}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise _corrupt(path, "the header is not UTF-8 JSON") from None
    if not isinstance(header, dict):
        raise _corrupt(path, "the header is not a JSON object")
    data_size = size - 8 - length
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict):
                raise _corrupt(path, "__metadata__ is not an object")
            continue
        _check_tensor(path, name, entry, data_size)
    return header


def _check_tensor(path: Path, name: str, entry: object, data_size: int) -> None:
    label = repr(name)[:80]
    if not isinstance(entry, dict):
        raise _corrupt(path, f"tensor {label} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise _corrupt(path, f"tensor {label} has no dtype")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise _corrupt(path, f"tensor {label} has a bad shape {shape!r}"[:200])
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size):
        raise _corrupt(path, f"tensor {label} has data_offsets {offsets!r} outside the {data_size}-byte data"[:200])
    bits = DTYPE_BITS.get(dtype)
    if bits is None:  # the byte count could not be checked, nor the memory of the tensor known
        raise _corrupt(path, f"tensor {label} has an unknown dtype {dtype[:20]!r} (known: {', '.join(DTYPE_BITS)})")
    if (math.prod(shape) * bits + 7) // 8 != offsets[1] - offsets[0]:
        raise _corrupt(path, f"tensor {label} ({dtype} {shape}) does not match its {offsets[1] - offsets[0]} bytes"[:200])


@dataclass(frozen=True)
class _Selection:
    files: list[Path]
    checkpoint_format: str
    skipped: tuple[str, ...] = ()


def _shard_files(target: Path) -> _Selection:
    try:
        is_file, is_dir = target.is_file(), target.is_dir()
    except (OSError, ValueError):
        raise UserError(f"not a usable path: {str(target)[:120]!r}") from None
    if is_file:
        if target.name.endswith(".index.json"):
            return _Selection(_files_from_index(target), "hf-index")
        return _Selection([target], "hf-single" if target.name == HF_SINGLE_FILE else "safetensors")
    if not is_dir:
        raise UserError(f"no such file or folder: {shown(target)}")
    files = sorted(p for p in target.glob("*.safetensors") if p.is_file())
    consolidated = tuple(p.name for p in files if p.name.startswith("consolidated"))
    index = target / INDEX_FILE
    if index.is_file():
        return _Selection(_files_from_index(index), "hf-index", consolidated)
    if not files:
        raise UserError(f"no .safetensors files in {shown(target)}")
    hf_shards = [p for p in files if (m := SHARD_NAME.fullmatch(p.name)) and m["prefix"] == "model"]
    if hf_shards:
        _check_complete(target, hf_shards)
        return _Selection(hf_shards, "hf-shards", consolidated)
    if (target / HF_SINGLE_FILE) in files:
        return _Selection([target / HF_SINGLE_FILE], "hf-single", consolidated)
    _check_complete(target, files)
    if consolidated and len(consolidated) == len(files):
        return _Selection(files, "mistral-consolidated")
    return _Selection(files, "safetensors")


def _listed(names: list[str], limit: int = 6) -> str:
    shown_names = ", ".join(names[:limit])
    return shown_names + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _check_complete(folder: Path, files: list[Path]) -> None:
    """Refuse a set of name-0000k-of-0000N shards with some k missing (no index to say otherwise)."""
    groups: dict[tuple[str, str], set[int]] = {}
    for path in files:
        match = SHARD_NAME.fullmatch(path.name)
        if match:
            groups.setdefault((match["prefix"], match["count"]), set()).add(int(match["index"]))
    missing = []
    for (prefix, count), present in sorted(groups.items()):
        width = len(count)
        missing += [f"{prefix}-{k:0{width}d}-of-{count}.safetensors" for k in range(1, int(count) + 1)
                    if k not in present]
    if missing:
        raise UserError(f"incomplete checkpoint in {shown(folder)}: {len(missing)} shard file(s) missing: "
                        f"{_listed(missing)}; download every shard (or pass a config.json alone)")


def _files_from_index(index: Path) -> list[Path]:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise UserError(f"{shown(index)} is not a readable JSON index") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise UserError(f"{shown(index)} has no weight_map of tensor name -> shard file")
    shards = sorted(set(weight_map.values()))
    outside = [shard for shard in shards if Path(shard).name != shard]
    if outside:
        raise UserError(f"{shown(index)} names shard {outside[0]!r}, which is not a file next to it"[:200])
    missing = [shard for shard in shards if not (index.parent / shard).is_file()]
    if missing:
        raise UserError(f"incomplete checkpoint: {shown(index)} names {len(shards)} shard file(s) and "
                        f"{len(missing)} are missing: {_listed(missing)}"[:400])
    return [index.parent / shard for shard in shards]


def safetensors_summary(folder: str | os.PathLike[str]) -> SafetensorsSummary:
    """Sum the headers of a checkpoint: a folder, one file, or an index.

    A folder is read as transformers would load it: the shards its model.safetensors.index.json names
    (all of them must be there), else a complete model-0000k-of-0000N set, else model.safetensors,
    else every *.safetensors (a complete set). consolidated*.safetensors beside Hugging Face files is
    Mistral's copy of the same weights and is skipped (`skipped`).

    Element counts are what the Hub reports as `safetensors.total`; they include buffers such as
    Llama-2's rotary inv_freq and FP8 scale tensors, so they can exceed the parameter count
    (meta-llama/Llama-2-7b-hf's Hub `safetensors.total` is 6,738,417,664, 2,048 above the
    6,738,415,616 parameters: 32 layers x 64 inv_freq values).
    """
    selection = _shard_files(Path(folder))
    by_dtype: dict[str, int] = {}
    tensors = 0
    total_bytes = 0
    for path in selection.files:
        for name, entry in read_safetensors_header(path).items():
            if name == "__metadata__":
                continue
            tensors += 1
            by_dtype[entry["dtype"]] = by_dtype.get(entry["dtype"], 0) + math.prod(entry["shape"])
            total_bytes += entry["data_offsets"][1] - entry["data_offsets"][0]
    return SafetensorsSummary(files=len(selection.files), tensors=tensors,
                              elements_by_dtype=dict(sorted(by_dtype.items())), total_elements=sum(by_dtype.values()),
                              total_bytes=total_bytes, checkpoint_format=selection.checkpoint_format,
                              skipped=selection.skipped)
