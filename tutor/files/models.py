"""Model files on disk: config.json files and model folders, the bundled presets, safetensors headers.

Everything here reads files; what it reads is handed to tutor.theory, which only computes
(tutor.theory.models.architecture_from_config for a config dict, tutor.theory.safetensors_header for
a header's bytes). Every failure a user can cause (a missing, unreadable, binary, huge or malformed
file, a FIFO, an incomplete shard set) is one UserError line. Standard library only: `fit` and
`models` start fast.

Presets are the published config.json files of popular models, shipped in `tutor/presets/`, with
their published parameter counts and sources in tutor/presets/index.json.
"""

from __future__ import annotations

import difflib
import json
import os
import stat
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from tutor.errors import UserError
from tutor.theory.models import Architecture, architecture_from_config, shown
from tutor.theory.safetensors_header import (
    HF_SINGLE_FILE,
    INDEX_FILE,
    LENGTH_BYTES,
    SafetensorsSummary,
    header_length,
    hf_shards,
    invalid_file,
    missing_shards,
    check_header,
    shards_in_index,
    summarize_headers,
)
from tutor.files.untrusted import UntrustedDataError, loads_json

MAX_CONFIG_BYTES = 16 * 2**20  # a config.json is a few kilobytes; more is a weights file or a device
MAX_CONFIG_TEXT = 16_384
"""Characters one text value of a config.json may have: a path (_name_or_path) is at most PATH_MAX,
4,096 bytes on Linux; 100 KB of it is damage (and took Rich's highlighter a minute to print)."""
MAX_HEADER_TEXT = 1 << 20
"""Characters one text value of a safetensors header may have (a tensor's name, a __metadata__ value)."""
MAX_NAME_CHARS = 120
"""Characters of a config's _name_or_path shown as the model's name: the rest of a long path is cut."""
PRESET_PACKAGE = "tutor.presets"


# ---------------------------------------------------------------------------------------------
# config.json files


def load_config(path: str | os.PathLike[str]) -> dict:
    """Read a config.json file, or the config.json inside a model folder, as a dict.

    Missing, unreadable, binary, malformed, empty or non-object files raise UserError.
    """
    try:
        target = Path(path)
        is_dir, exists = target.is_dir(), target.exists()
        if is_dir:
            folder, target = target, target / "config.json"
            if not target.is_file():
                raise UserError(f"no config.json in folder {shown(folder)}; point at a model folder or a config.json file")
    except (TypeError, ValueError, OSError) as exc:
        if isinstance(exc, UserError):
            raise
        raise UserError(f"not a usable file path: {str(path)[:120]!r}") from None
    if not is_dir and not exists:
        raise UserError(f"no such file: {shown(target)}")
    try:
        # A FIFO, socket or device would block open() or read() forever: only regular files are read.
        regular = stat.S_ISREG(target.stat().st_mode)
    except OSError as exc:
        raise UserError(f"cannot read {shown(target)}: {exc.strerror or exc}") from None
    if not regular:
        raise UserError(f"{shown(target)} is not a regular file (a pipe, socket or device?); give a config.json")
    try:
        with target.open("rb") as handle:
            raw = handle.read(MAX_CONFIG_BYTES + 1)  # bounded: the path may be a weights file or a device
    except OSError as exc:
        raise UserError(f"cannot read {shown(target)}: {exc.strerror or exc}") from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise UserError(f"{shown(target)} is over {MAX_CONFIG_BYTES // 2**20} MiB; a config.json is a few kilobytes (a weights file?)")
    if not raw.strip():
        raise UserError(f"{shown(target)} is empty; expected a JSON object like a Hugging Face config.json")
    try:
        raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError(f"{shown(target)} is not a UTF-8 text file (binary?); expected a config.json") from None
    # Bounded digits, depth and text, no lone surrogates: one line naming the field. Infinity is kept:
    # transformers writes it itself (json.dumps; Mamba-2's time_step_limit defaults to (0.0, inf)), and the
    # fields fit reads are checked one by one by tutor.theory.models (a whole number of layers, heads, ...).
    config = loads_json(raw, what=shown(target), max_bytes=MAX_CONFIG_BYTES, max_chars=MAX_CONFIG_TEXT,
                        strings="clean", non_finite="keep")
    if not isinstance(config, dict):
        raise UserError(f"{shown(target)} holds a JSON {type(config).__name__}; a config.json must be a JSON object")
    return config


# ---------------------------------------------------------------------------------------------
# Bundled presets


@dataclass(frozen=True)
class PublishedCount:
    """A parameter count as published: exact (an integer) or rounded text like "7.61B"."""

    text: str
    source: str

    @property
    def exact(self) -> bool:
        return self.text.isdigit()

    @property
    def value(self) -> float:
        """The published number: the integer, or the rounded figure (B = 1e9, M = 1e6)."""
        if self.exact:
            return int(self.text)
        return float(self.text[:-1]) * {"B": 1e9, "M": 1e6}[self.text[-1]]

    @property
    def resolution(self) -> float:
        """One unit of the last published digit (0.01e9 for "7.61B"); 0 for exact counts."""
        if self.exact:
            return 0.0
        digits = self.text[:-1]
        decimals = len(digits.split(".")[1]) if "." in digits else 0
        return 10.0 ** -decimals * {"B": 1e9, "M": 1e6}[self.text[-1]]


@dataclass(frozen=True)
class PresetInfo:
    """What the preset index says about one shipped model config."""

    name: str
    display_name: str
    hf_repo: str
    config_source: str
    total: PublishedCount | None
    active: PublishedCount | None = None
    non_embedding: PublishedCount | None = None
    stored_elements: PublishedCount | None = None  # Hub API safetensors.total (may include buffers)
    notes: str = ""


@lru_cache(maxsize=1)
def _preset_index() -> dict[str, dict]:
    try:
        text = resources.files(PRESET_PACKAGE).joinpath("index.json").read_text(encoding="utf-8")
    except (OSError, ModuleNotFoundError) as exc:  # a broken install, not a user mistake
        raise UserError(f"the preset index is missing from this installation ({exc}); reinstall tensor-tutor") from None
    return json.loads(text)["presets"]


def _published(entry: dict, key: str) -> PublishedCount | None:
    value = entry.get(key)
    return PublishedCount(str(value["value"]), value["source"]) if value else None


def _preset_info(name: str, entry: dict) -> PresetInfo:
    return PresetInfo(
        name=name, display_name=entry["display_name"], hf_repo=entry["hf_repo"],
        config_source=entry["config_source"], total=_published(entry, "total"),
        active=_published(entry, "active"), non_embedding=_published(entry, "non_embedding"),
        stored_elements=_published(entry, "stored_elements"), notes=entry.get("notes", ""),
    )


def list_presets() -> list[PresetInfo]:
    """Every shipped preset, in index order."""
    return [_preset_info(name, entry) for name, entry in _preset_index().items()]


def preset_names() -> list[str]:
    """The names `fit` and the calculators accept for the shipped presets, in index order."""
    return list(_preset_index())


def _unknown_preset(name: str) -> UserError:
    names = list(_preset_index())
    key = name.strip().lower()
    starting = [n for n in names if key and n.startswith(key)]
    close = list(dict.fromkeys(starting + difflib.get_close_matches(key, names, n=3, cutoff=0.5)))[:3]
    hint = f"did you mean {', '.join(close)}?" if close else f"presets include {', '.join(names[:6])}, ..."
    return UserError(f"unknown model preset {name!r}: {hint} (or give a config.json path or a model folder)"[:300])


def load_preset(name: str) -> tuple[dict, PresetInfo]:
    """The published config.json of a preset (case-insensitive name) and its index entry."""
    if not isinstance(name, str):
        raise UserError("a preset name must be text, such as llama-3.1-8b")
    key = name.strip().lower()
    entry = _preset_index().get(key)
    if entry is None:
        raise _unknown_preset(name)
    try:
        text = resources.files(PRESET_PACKAGE).joinpath(f"{key}.json").read_text(encoding="utf-8")
    except OSError as exc:  # listed in the index but not shipped: a broken install
        raise UserError(f"preset {key} is missing from this installation ({exc}); reinstall tensor-tutor") from None
    return json.loads(text), _preset_info(key, entry)


# ---------------------------------------------------------------------------------------------
# MODEL as `fit` takes it: a preset, a config.json or a model folder


@dataclass(frozen=True)
class ModelConfig:
    """A model's config.json dict, the name to show it under, where it came from, and its
    quantization_config scheme, parsed once as the config is read (quantized_weights)."""

    config: dict
    name: str
    source: str
    quantization: QuantizedWeights | None = None
    quantization_problem: str | None = None
    """Why the quantization_config cannot be counted; raised only when the scheme is asked for (--dtype
    chooses the format otherwise)."""
    file: str = ""
    """The config.json read, as shown in a message ("" for a preset): what a refusal of a field names."""

    @classmethod
    def read(cls, config: dict, name: str, source: str, file: str = "") -> ModelConfig:
        try:
            return cls(config, name, source, quantization=quantized_weights(config), file=file)
        except UserError as problem:
            return cls(config, name, source, quantization_problem=str(problem), file=file)

    def refusal(self, error: UserError) -> UserError:
        """`error` (a field of this config refused by tutor.theory) naming the file it came from."""
        if not self.file or str(error).startswith(self.file):
            return error
        return UserError(f"{self.file}: {error}")

    def weights_scheme(self) -> QuantizedWeights | None:
        """The weight format the quantization_config stores (None without one); UserError for a scheme fit
        cannot count."""
        if self.quantization_problem is not None:
            raise UserError(self.quantization_problem)
        return self.quantization


def read_model_config(spec: str) -> ModelConfig:
    """A preset name, a config.json path or a model folder -> its config dict, display name and source."""
    if not isinstance(spec, str) or not spec.strip():
        raise UserError("give a model: a preset name such as llama-3.1-8b, a config.json path or a model folder")
    spec = spec.strip()
    if spec.lower() in _preset_index():
        config, info = load_preset(spec)
        return ModelConfig.read(config, info.display_name, f"preset {info.name} ({info.hf_repo} config.json)")
    try:
        path = Path(os.path.expanduser(spec))  # unlike Path.expanduser, never raises on "~nobody"
        exists = path.exists()
    except (OSError, ValueError):  # a NUL byte or an over-long name is not a path on this system
        path, exists = Path(), False
    if exists:
        config = load_config(path)
        folder = path if path.is_dir() else path.parent
        named = config.get("_name_or_path")
        name = named if isinstance(named, str) else ""
        if len(name) > MAX_NAME_CHARS:  # shown in every report's title: the end of a long path names the model
            name = "..." + name[-(MAX_NAME_CHARS - 3):]
        config_file = path / "config.json" if path.is_dir() else path
        return ModelConfig.read(config, name or folder.resolve().name or spec, f"config {shown(path)}",
                                file=shown(config_file))
    if os.sep in spec or "/" in spec or spec.endswith(".json"):
        if "/" in spec and not spec.startswith((".", "/", "~")) and spec.count("/") == 1:
            close = difflib.get_close_matches(spec.split("/")[1].lower(), list(_preset_index()), n=1, cutoff=0.6)
            hint = f"try the preset {close[0]}" if close else "or use a preset"
            raise UserError(f"no such file or folder: {shown(spec)}; Hub ids are not fetched (no network): download its "
                            f"config.json and pass that path, {hint}"[:300])
        raise UserError(f"no such file or folder: {shown(spec)}")
    raise _unknown_preset(spec)


@dataclass(frozen=True)
class QuantizedWeights:
    """The weight format a config's `quantization_config` stores its linear weights in, as a name of
    tutor.theory.memory.WEIGHT_FORMATS, and the words saying which scheme was read."""

    weight_format: str
    scheme: str


def _bits(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def quantized_weights(config: dict) -> QuantizedWeights | None:
    """The scheme of a transformers `quantization_config` block (the one every quantized Hub checkpoint
    carries), None without one; UserError for a scheme fit cannot count, rather than a silent bf16.

    Mapped as transformers' quantizers store the weights: GPTQ and AWQ pack 4-bit codes with one fp16
    scale (and zero) per group of `group_size`; bitsandbytes' nf4 (with double quantization when
    `bnb_4bit_use_double_quant`) or int8; fbgemm_fp8 and compressed-tensors' float8 one byte per weight;
    DeepSeek-V3's "fp8" with 128x128 block scales; GPT-OSS's mxfp4."""
    block = config.get("quantization_config")
    if block is None:
        return None
    if not isinstance(block, dict):
        raise UserError(f"quantization_config must be an object, got {type(block).__name__}")
    method = str(block.get("quant_method", "")).lower()
    bits, group = _bits(block.get("bits")), _bits(block.get("group_size"))
    if method in ("gptq", "awq"):
        if bits == 4 and group == 128:
            return QuantizedWeights(f"{method}-int4-g128", f"{method.upper()} 4-bit, groups of 128")
        if bits == 8:
            return QuantizedWeights("int8", f"{method.upper()} 8-bit")
        if bits == 4:
            return QuantizedWeights("int4", f"{method.upper()} 4-bit, groups of {group} (counted without group scales)")
        raise UserError(f"quantization_config: {method} with bits={bits!r} is not a format fit counts; "
                        "pass --dtype to choose one")
    if method == "bitsandbytes":
        if block.get("load_in_4bit"):
            kind = str(block.get("bnb_4bit_quant_type", "fp4")).lower()
            double = bool(block.get("bnb_4bit_use_double_quant"))
            if kind == "nf4":
                return QuantizedWeights("nf4-dq" if double else "nf4",
                                        "bitsandbytes nf4" + (" with double quantization" if double else ""))
            return QuantizedWeights("int4", f"bitsandbytes 4-bit {kind}")
        if block.get("load_in_8bit"):
            return QuantizedWeights("int8", "bitsandbytes LLM.int8()")
    if method in ("fbgemm_fp8", "fp8"):
        size = block.get("weight_block_size")
        if method == "fp8" and isinstance(size, list) and size == [128, 128]:
            return QuantizedWeights("fp8-block128", "FP8 with 128x128 block scales")
        return QuantizedWeights("fp8", f"{method} FP8 weights")
    if method == "mxfp4":
        return QuantizedWeights("mxfp4", "MXFP4 (4-bit, a shared scale per 32 weights)")
    if method == "compressed-tensors":
        groups = block.get("config_groups")
        weights = next((group.get("weights") for group in groups.values() if isinstance(group, dict)), None) \
            if isinstance(groups, dict) else None
        if isinstance(weights, dict):
            num_bits, kind = _bits(weights.get("num_bits")), str(weights.get("type", "int")).lower()
            if num_bits == 8 and kind == "float":
                return QuantizedWeights("fp8", "compressed-tensors FP8")
            if num_bits == 8:
                return QuantizedWeights("int8", "compressed-tensors int8")
            if num_bits == 4:
                return QuantizedWeights("int4", "compressed-tensors int4 (counted without group scales)")
    raise UserError(f"quantization_config: quant_method {method or '(none)'!r} is not a scheme fit counts; "
                    "pass --dtype to say how the weights are stored")


def resolve_model(spec: str) -> tuple[Architecture, str]:
    """A preset name, a config.json path or a model folder -> (Architecture, where it came from)."""
    found = read_model_config(spec)
    try:
        return architecture_from_config(found.config, found.name), found.source
    except UserError as error:
        raise found.refusal(error) from None


# ---------------------------------------------------------------------------------------------
# safetensors checkpoints: headers only, never the weights


def read_safetensors_header(path: str | os.PathLike[str]) -> dict:
    """The JSON header of one .safetensors file, validated against the file's size.

    Reads only 8 + N bytes. Truncated, corrupt or oversized headers raise UserError.
    """
    path = Path(path)
    name = shown(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):  # a FIFO or device would block the read forever
            raise invalid_file(name, "not a regular file (a pipe, socket or device?)")
        size = info.st_size
        with path.open("rb") as handle:
            length = header_length(handle.read(LENGTH_BYTES), size, name)
            raw = handle.read(length)
    except UserError:
        raise
    except FileNotFoundError:
        raise UserError(f"no such file: {name}") from None
    except IsADirectoryError:
        raise UserError(f"{name} is a folder; give a .safetensors file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise UserError(f"cannot read {name}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse_safetensors_header(raw, size - LENGTH_BYTES - length, name)


def parse_safetensors_header(raw: bytes, data_size: int, name: str) -> dict:
    """A header's bytes parsed by tutor.files.untrusted.loads_json and checked against the `data_size` bytes after
    it (tutor.theory.safetensors_header.check_header); one UserError line naming the file otherwise."""
    try:
        header = loads_json(raw, what=name, max_bytes=max(len(raw), 1), max_chars=MAX_HEADER_TEXT, strings="clean")
    except UntrustedDataError as error:
        raise invalid_file(name, f"the header {error.field_reason}") from None
    return check_header(header, data_size, name)


@dataclass(frozen=True)
class _Selection:
    files: list[Path]
    checkpoint_format: str
    skipped: tuple[str, ...] = ()


def _listed(names: list[str], limit: int = 6) -> str:
    shown_names = ", ".join(names[:limit])
    return shown_names + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _check_complete(folder: Path, files: list[Path]) -> None:
    """Refuse a set of name-0000k-of-0000N shards with some k missing (no index to say otherwise):
    summing the shards that are there would understate the model."""
    missing = missing_shards(p.name for p in files)
    if missing:
        raise UserError(f"incomplete checkpoint in {shown(folder)}: {len(missing)} shard file(s) missing: "
                        f"{_listed(missing)}; download every shard (or pass a config.json alone)")


def _files_from_index(index: Path) -> list[Path]:
    from tutor.files.storage import read_checked_json

    try:
        data = read_checked_json(index, what=shown(index), max_bytes=MAX_CONFIG_BYTES, follow_symlinks=True)  # an index is a few megabytes
    except UntrustedDataError as error:
        raise UserError(f"{shown(index)} is not a readable JSON index: {error.field_reason}") from None
    except OSError:  # unreadable, too large
        raise UserError(f"{shown(index)} is not a readable JSON index") from None
    shards = shards_in_index(data, shown(index))
    missing = [shard for shard in shards if not (index.parent / shard).is_file()]
    if missing:
        raise UserError(f"incomplete checkpoint: {shown(index)} names {len(shards)} shard file(s) and "
                        f"{len(missing)} are missing: {_listed(missing)}"[:400])
    return [index.parent / shard for shard in shards]


class NoCheckpointFiles(UserError):
    """A folder holds no safetensors file that transformers would load (none, or only stray names)."""


def _explicit_weights(folder: Path, config: dict | None) -> Path | None:
    """The file a config.json's `transformers_weights` names (transformers loads it before any other,
    and only from inside the model folder), None without one. `config` is the folder's config.json when
    already read; else it is read here."""
    if config is None:
        if not (folder / "config.json").is_file():
            return None
        config = load_config(folder / "config.json")
    named = config.get("transformers_weights")
    if not isinstance(named, str) or not named.strip():
        return None
    target = folder / named
    try:
        inside = folder.resolve() in target.resolve().parents and target.is_file()
    except (OSError, ValueError):  # a NUL byte, a loop of links
        inside = False
    if not inside:
        raise UserError(f"{shown(folder / 'config.json')} names transformers_weights {named[:80]!r}, which is not "
                        "a file in its folder")
    return target


def _shard_files(target: Path, config: dict | None = None) -> _Selection:
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
    # transformers' from_pretrained (modeling_utils, a local folder): the config's transformers_weights,
    # else model.safetensors, else the shards model.safetensors.index.json names; nothing else.
    for name in (HF_SINGLE_FILE, INDEX_FILE):  # what transformers would open: a FIFO there is no checkpoint
        if (target / name).exists() and not (target / name).is_file():
            raise UserError(f"{shown(target / name)} is not a regular file (a folder, pipe or device?); "
                            "move it away or pass the config.json alone")
    explicit = _explicit_weights(target, config)
    if explicit is not None:
        if explicit.name.endswith(".index.json"):
            return _Selection(_files_from_index(explicit), "hf-index", consolidated)
        return _Selection([explicit], "hf-single", consolidated)
    if (target / HF_SINGLE_FILE) in files:
        return _Selection([target / HF_SINGLE_FILE], "hf-single", consolidated)
    index = target / INDEX_FILE
    if index.is_file():
        return _Selection(_files_from_index(index), "hf-index", consolidated)
    if not files:
        raise NoCheckpointFiles(f"no .safetensors files in {shown(target)}")
    shards = set(hf_shards(p.name for p in files))
    if shards:  # the index lost on download: the complete set it would name
        shard_files = [p for p in files if p.name in shards]
        _check_complete(target, shard_files)
        return _Selection(shard_files, "hf-shards", consolidated)
    if consolidated and len(consolidated) == len(files):
        _check_complete(target, files)
        return _Selection(files, "mistral-consolidated")
    raise NoCheckpointFiles(f"no checkpoint transformers would load in {shown(target)} ({HF_SINGLE_FILE} or "
                            f"{INDEX_FILE}); not counted: {_listed([p.name for p in files])}"[:400])


def safetensors_summary(folder: str | os.PathLike[str], config: dict | None = None) -> SafetensorsSummary:
    """Sum the headers of a checkpoint: a folder, one file, or an index.

    A folder is read as transformers would load it: the file config.json's transformers_weights names,
    else model.safetensors, else the shards its model.safetensors.index.json names (all of them must be
    there); without either, a complete model-0000k-of-0000N set (the index lost) or Mistral's
    consolidated files alone. Other *.safetensors (adapters, optimizer states, copies) are never
    summed; consolidated*.safetensors beside Hugging Face files is Mistral's copy of the same weights
    and is skipped (`skipped`). Counting: summarize_headers. `config` is the folder's config.json when
    already read.
    """
    selection = _shard_files(Path(folder), config)
    return summarize_headers((read_safetensors_header(path) for path in selection.files),
                             selection.checkpoint_format, selection.skipped)


def checkpoint_summary(model: str | None, config: dict | None = None) -> SafetensorsSummary | None:
    """The safetensors headers of a local model folder, or of the folder of its config.json (headers only,
    never the weights); None for a preset, or a folder without safetensors files transformers would load.
    `config` is the model's config.json when already read."""
    if not model or model.strip().lower() in _preset_index():
        return None  # a preset is its published config: a folder that happens to share its name is not read
    folder = Path(model).expanduser()
    if folder.is_file():
        folder = folder.parent if folder.name == "config.json" else folder
    if not folder.is_dir():
        return None
    try:
        return safetensors_summary(folder, config)
    except NoCheckpointFiles:
        return None  # the config alone: nothing here is what transformers would load
