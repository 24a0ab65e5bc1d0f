"""The safetensors format, as bytes and names: a header's JSON parsed and checked, a shard set's names, and
a checkpoint's tensors counted from its headers alone. No file is read here (tutor.files.models reads them).

Format (huggingface/safetensors README, "Format"): 8 bytes little-endian unsigned N, then N bytes of
UTF-8 JSON mapping tensor name -> {"dtype", "shape", "data_offsets": [begin, end]} (offsets
relative to the byte after the header), plus an optional "__metadata__" map of strings; then the
data. Sharded checkpoints add model.safetensors.index.json whose "weight_map" names the shard of
each tensor (transformers' `modeling_utils`: SAFE_WEIGHTS_INDEX_NAME, shards named
model-00001-of-00004.safetensors by `huggingface_hub.split_torch_state_dict_into_shards`). Mistral's
repositories also ship consolidated.safetensors, the same weights in their original format, beside
the Hugging Face files: a folder holding both is counted once, in the format transformers loads.
The header's bytes are parsed above theory (tutor.files.models, through tutor.files.untrusted); `check_header`
checks what they hold. Standard library only.
"""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from tutor.errors import UserError

# The reference implementation refuses headers above 100 MB (safetensors MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000
LENGTH_BYTES = 8  # the little-endian u64 before the header
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


def invalid_file(name: str, why: str) -> UserError:
    """The one-line refusal of a file `name` (as shown to the user) that breaks the format."""
    return UserError(f"{name} is not a valid safetensors file: {why}")


def header_length(prefix: bytes, file_size: int, name: str) -> int:
    """N, the header's byte count, from a file's first 8 bytes, checked against the file's size."""
    if len(prefix) < LENGTH_BYTES:
        raise invalid_file(name, f"only {len(prefix)} bytes, shorter than the 8-byte header length")
    (length,) = struct.unpack("<Q", prefix[:LENGTH_BYTES])
    if length < 2 or length > MAX_HEADER_BYTES:
        raise invalid_file(name, f"header length {length} is outside 2..{MAX_HEADER_BYTES} bytes")
    if LENGTH_BYTES + length > file_size:
        raise invalid_file(name, f"header claims {length} bytes but the file has {file_size - LENGTH_BYTES} after the length")
    return length


def check_header(header: object, data_size: int, name: str) -> dict:
    """A header's parsed JSON (tutor.files.untrusted.loads_json of its bytes: bounded, finite, no huge integers)
    as a dict, every tensor entry checked against the `data_size` bytes after it."""
    if not isinstance(header, dict):
        raise invalid_file(name, "the header is not a JSON object")
    spans = []
    for tensor, entry in header.items():
        if tensor == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(value, str) for value in entry.values()):
                raise invalid_file(name, "__metadata__ is not a map of text to text")
            continue
        _check_tensor(name, tensor, entry, data_size)
        spans.append((entry["data_offsets"][0], entry["data_offsets"][1], tensor))
    _check_layout(name, spans, data_size)
    return header


def _check_layout(name: str, spans: list[tuple[int, int, str]], data_size: int) -> None:
    """The tensors' data, in offset order, must tile the data exactly: each begins where the one before
    ends, the first at 0, the last at the end of the file (safetensors' `Metadata::validate` and the
    "incomplete metadata, file not fully covered" check of `SafeTensors::deserialize`): a gap, an
    overlap or trailing bytes mean the header does not describe this file."""
    end = 0
    for begin, stop, tensor in sorted(spans):
        if begin != end:
            raise invalid_file(name, f"tensor {repr(tensor)[:80]} starts at byte {begin:,} of the data, where "
                                     f"the tensors before it end at {end:,} (a gap or an overlap)")
        end = stop
    if end != data_size:
        raise invalid_file(name, f"the tensors cover {end:,} of the {data_size:,} bytes after the header "
                                 "(the file is not fully covered)")


def _check_tensor(name: str, tensor: str, entry: object, data_size: int) -> None:
    label = repr(tensor)[:80]
    if not isinstance(entry, dict):
        raise invalid_file(name, f"tensor {label} is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise invalid_file(name, f"tensor {label} has no dtype")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise invalid_file(name, f"tensor {label} has a bad shape {shape!r}"[:200])
    if (not isinstance(offsets, list) or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_size):
        raise invalid_file(name, f"tensor {label} has data_offsets {offsets!r} outside the {data_size}-byte data"[:200])
    bits = DTYPE_BITS.get(dtype)
    if bits is None:  # the byte count could not be checked, nor the memory of the tensor known
        raise invalid_file(name, f"tensor {label} has an unknown dtype {dtype[:20]!r} (known: {', '.join(DTYPE_BITS)})")
    if math.prod(shape) * bits % 8:  # a sub-byte dtype (F4, F6) whose tensor ends inside a byte
        raise invalid_file(name, f"tensor {label} ({dtype} {shape}) does not end on a byte boundary"[:200])
    if math.prod(shape) * bits // 8 != offsets[1] - offsets[0]:
        raise invalid_file(name, f"tensor {label} ({dtype} {shape}) does not match its {offsets[1] - offsets[0]} bytes"[:200])


def missing_shards(names: Iterable[str]) -> list[str]:
    """The name-0000k-of-0000N.safetensors files absent from a set that holds some of them."""
    groups: dict[tuple[str, str], set[int]] = {}
    for file_name in names:
        match = SHARD_NAME.fullmatch(file_name)
        if match:
            groups.setdefault((match["prefix"], match["count"]), set()).add(int(match["index"]))
    missing = []
    for (prefix, count), present in sorted(groups.items()):
        width = len(count)
        missing += [f"{prefix}-{k:0{width}d}-of-{count}.safetensors" for k in range(1, int(count) + 1)
                    if k not in present]
    return missing


def hf_shards(names: Iterable[str]) -> list[str]:
    """The model-0000k-of-0000N.safetensors shards among `names`, as transformers saves them."""
    return [n for n in names if (m := SHARD_NAME.fullmatch(n)) and m["prefix"] == "model"]


def shards_in_index(index: object, name: str) -> list[str]:
    """The shard file names an index's "weight_map" lists (sorted, once each); UserError for an index
    without one, or naming a file outside its own folder."""
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise UserError(f"{name} has no weight_map of tensor name -> shard file")
    shards = sorted(set(weight_map.values()))
    outside = [shard for shard in shards if not shard or any(sep in shard for sep in "/\\") or shard in (".", "..")]
    if outside:
        raise UserError(f"{name} names shard {outside[0]!r}, which is not a file next to it"[:200])
    return shards


def summarize_headers(headers: Iterable[dict], checkpoint_format: str = "safetensors",
                      skipped: tuple[str, ...] = ()) -> SafetensorsSummary:
    """Sum checked headers (parse_header) into files, tensors, elements per dtype and bytes of data.

    Element counts are what the Hub reports as `safetensors.total`; they include buffers such as
    Llama-2's rotary inv_freq and FP8 scale tensors, so they can exceed the parameter count
    (meta-llama/Llama-2-7b-hf's Hub `safetensors.total` is 6,738,417,664, 2,048 above the
    6,738,415,616 parameters: 32 layers x 64 inv_freq values).
    """
    by_dtype: dict[str, int] = {}
    files = tensors = total_bytes = 0
    for header in headers:
        files += 1
        for tensor, entry in header.items():
            if tensor == "__metadata__":
                continue
            tensors += 1
            by_dtype[entry["dtype"]] = by_dtype.get(entry["dtype"], 0) + math.prod(entry["shape"])
            total_bytes += entry["data_offsets"][1] - entry["data_offsets"][0]
    return SafetensorsSummary(files=files, tensors=tensors, elements_by_dtype=dict(sorted(by_dtype.items())),
                              total_elements=sum(by_dtype.values()), total_bytes=total_bytes,
                              checkpoint_format=checkpoint_format, skipped=skipped)
