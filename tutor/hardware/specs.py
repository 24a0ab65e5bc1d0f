"""Dense theoretical peaks of common GPUs, each with its source, and matching a detected name to one.

Every card is one record, `tutor/hardware/cards/<key>.json` (read by tutor.hardware.card_records):
the tables here (SPECS, DRIVER_MEMORY, GPU_ALIASES, the name patterns) are views over those records.

Values are DENSE (no 2:4 sparsity) tensor-core rates in TFLOP/s (INT8 in TOPS), decimal units,
each from the source named in its entry (vendor datasheet or whitepaper). None means the
chip has no hardware path for that dtype or no published dense figure.

The traps (§6.2) this table guards against:
- NVIDIA datasheets print tensor figures "with sparsity": 2x the dense rate. Stored values are halved.
- GeForce cards quote FP16 with FP16 accumulate; PyTorch GEMMs accumulate in FP32, which runs at
  half that rate on GeForce. Stored values are the FP32-accumulate rate; the headline is in notes.
- The CUDA-core (non-tensor) rate is not the BF16 tensor peak (Lightning's RTX 4090 entry).
- SKU variants differ (A10 vs A10G, H100 SXM/PCIe/NVL); an unknown name matches nothing.

Memory is stored twice. `memory_datasheet` is the marketing size in GB (1e9 bytes: the "80 GB" of
an H100). `memory_bytes` is the total the driver reports for that card (NVML `memory.total`, which
nvidia-smi prints in MiB; rocm-smi "VRAM Total Memory" on AMD), each with its `memory_source`: the
figure every fit check and lesson compares with. The two differ by up to ~7% either way (an H100
reports 81,559 MiB = 85.5e9 bytes; an L40S with ECC on reports 46,068 MiB = 48.3e9). CUDA's own
`total_memory` (cudaMemGetInfo) is a few hundred MiB below NVML's total (e.g. an A100-SXM4-40GB
reports 42,298,834,944 bytes to deviceQuery against 40,960 MiB = 42,949,672,960 in nvidia-smi:
https://github.com/bottlerocket-os/bottlerocket/pull/3873), part of what the CUDA-context overhead
term covers. Driver versions and ECC settings move the total slightly (an early A100-SXM-80GB driver
showed 81,252 MiB, later ones 81,920); the stored figure is one real report, with its driver version.
"""

from __future__ import annotations

import re

from tutor.hardware.card_records import (
    SPEC_DTYPES,
    CardRecord,
    Derivation,
    GpuSpec,
    compact_name,
    load_cards,
)

__all__ = ["CARDS", "CARDS_BY_KEY", "DRIVER_MEMORY", "GPU_ALIASES", "SPECS", "SPECS_BY_KEY", "SPEC_DTYPES",
           "CardRecord", "Derivation", "GpuSpec", "close_gpu_names", "gpu_names", "lookup_gpu_spec",
           "match_gpu_spec", "unknown_device_message"]

# One record per card (tutor/hardware/cards/<key>.json, tutor.hardware.card_records); the tables below
# are views over them, in the records' listing order.
CARDS: tuple[CardRecord, ...] = load_cards()
CARDS_BY_KEY: dict[str, CardRecord] = {card.key: card for card in CARDS}
SPECS: tuple[GpuSpec, ...] = tuple(card.spec for card in CARDS)
SPECS_BY_KEY: dict[str, GpuSpec] = {spec.key: spec for spec in SPECS}

# key -> (total bytes as the driver reports it, where that exact figure was read). nvidia-smi prints
# NVML's memory.total in MiB, so MiB * 2**20 is the NVML byte count. A card without one stands in its
# datasheet size, and its memory_source says so.
DRIVER_MEMORY: dict[str, tuple[int, str]] = {
    card.key: card.driver_memory for card in CARDS if card.driver_memory is not None}

# Full-match patterns over the normalized name (see _normalize). The patterns are mutually exclusive
# (tests/test_card_records.py), and anything else (GH200, L40, RTX 4090 D, V100S) is unknown.
_PATTERNS: tuple[tuple[str, str], ...] = tuple((card.key, "|".join(card.name_patterns)) for card in CARDS)
_COMPILED = tuple((key, re.compile(pattern)) for key, pattern in _PATTERNS)
_PREFIXES = ("nvidia", "tesla", "geforce", "amd", "instinct", "radeon")


def _normalize(name: str) -> str:
    """'NVIDIA A100-SXM4-80GB' -> 'a100 sxm4 80gb': lower case, separators to spaces, vendor words dropped."""
    words = re.sub(r"[\s\-_]+", " ", name.lower()).strip().split(" ")
    while words and words[0] in _PREFIXES:
        words.pop(0)
    return " ".join(words)


def match_gpu_spec(name: str) -> GpuSpec | None:
    """The spec entry for a device name as NVML or torch reports it, or None for an unknown GPU.

    Handles SKU spellings ("NVIDIA H100 80GB HBM3" is the SXM part, "NVIDIA H100 PCIe",
    "NVIDIA A100-SXM4-80GB", "Tesla V100-SXM2-16GB"). A name that is not exactly a known SKU
    (a bare "NVIDIA H100", a GH200, an RTX 4090 D) returns None: never a fallback to another card.
    """
    if not isinstance(name, str):
        return None
    normalized = _normalize(name)
    for key, pattern in _COMPILED:
        if pattern.fullmatch(normalized):
            return SPECS_BY_KEY[key]
    return None


# Short names people type for a card -> (table key, which SKU that is when the name covers several).
GPU_ALIASES: dict[str, tuple[str, str]] = {
    alias: (card.key, note) for card in CARDS for alias, note in card.aliases.items()}


_BY_COMPACT: dict[str, tuple[str, str]] = {
    **{compact_name(key): (key, "") for key in SPECS_BY_KEY},
    **{compact_name(alias): target for alias, target in GPU_ALIASES.items()},
}
_VENDOR_WORDS = tuple(sorted(_PREFIXES, key=len, reverse=True))


def lookup_gpu_spec(text: str) -> tuple[GpuSpec, str] | None:
    """The spec a typed card name means, and a note when a short name covers several SKUs; None if unknown.

    Accepts table keys (h100-sxm), the aliases above (h100, a100, 4090), case and `_`/space/`-`
    spellings, a leading vendor word (nvidia-h100), and full names as NVML reports them.
    """
    compact = compact_name(text)
    while True:
        vendor = next((word for word in _VENDOR_WORDS if compact.startswith(word) and compact != word), None)
        if compact in _BY_COMPACT or vendor is None:
            break
        compact = compact[len(vendor):]
    if compact in _BY_COMPACT:
        key, note = _BY_COMPACT[compact]
        return SPECS_BY_KEY[key], note
    spec = match_gpu_spec(text)
    return (spec, "") if spec is not None else None


def gpu_names() -> tuple[str, ...]:
    """Every name lookup_gpu_spec accepts in its canonical spelling: the table keys, then the aliases."""
    return tuple(SPECS_BY_KEY) + tuple(GPU_ALIASES)


def close_gpu_names(text: str, limit: int = 4) -> list[str]:
    """The accepted names nearest to a mistyped one (difflib), for a one-line error message."""
    import difflib

    by_compact = {compact_name(name): name for name in gpu_names()}
    found = difflib.get_close_matches(compact_name(text), list(by_compact), n=limit, cutoff=0.5)
    return [by_compact[name] for name in found]


def unknown_device_message(text: str) -> str:
    """One line for a card name the spec table does not know: the closest known names, and where the rest are."""
    close = close_gpu_names(text)
    nearest = f"did you mean {', '.join(close)}? " if close else ""
    return (f"unknown GPU {text!r}: {nearest}use 'this' (the detected device) or a card such as h100, h200, "
            "a100-40gb, rtx-4090 (tensor-tutor models --devices lists them all)")
