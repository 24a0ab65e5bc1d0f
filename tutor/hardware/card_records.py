"""One record per GPU card, read from `tutor/hardware/cards/<key>.json`, each fact with its source.

The layout follows cli99/llm-analysis (llm_analysis/gpu_configs/*.json: one file per GPU), with a
source beside every figure. A record holds:

- `key`, `name`, `listing_order` (where listings put the card), `name_patterns` (full-match regexes over
  the name as NVML or torch reports it, normalized by tutor.hardware.specs) and `aliases` (short names
  people type -> a note when the name covers several SKUs);
- `datasheet`: dense peaks per dtype in TFLOP/s (TOPS for int8; null where the chip has no path or no
  published dense figure), the marketing memory size in GB (1e9 bytes), the memory bandwidth in GB/s,
  the `source` all of them were read from, a `confidence` ("datasheet" or "low: ...") and `notes`;
- `driver_memory`: the total the driver reports (`mib` as nvidia-smi prints it, or `bytes` as
  rocm-smi prints it) with the `source` of that exact figure, or null where none was found;
- `intra_node_link`: the link between GPUs of one node (`kind` "nvlink" or "pcie", its `generation`)
  with its `source`, or null: then `tensor-tutor time` refuses a step that talks between GPUs;
- `mamf`: the maximum achievable bf16 matmul measured by mamf-finder (`bf16_tflops`, `measured_on`,
  the best `shape_mnk`) with its `source`, or null where none is published;
- `clocks`: the SM count, dense FP16 FLOP per clock per SM and boost clock behind the FP16 peak
  (NVIDIA architecture whitepapers), with their `source`, or null.

Every field is required (null where the fact is unknown), so a missing fact is a decision written
down, never an omission. A bad file raises CardRecordError naming the file and the field.
Standard library only: importing this reads 24 small JSON files and nothing heavy.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tutor.errors import UserError
from tutor.theory.interconnect import nvlink_bandwidth_bytes_per_s, pcie_bandwidth_bytes_per_s
from tutor.theory.units import GB, MiB

SPEC_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")
LINK_KINDS = ("nvlink", "pcie")
CARDS_FOLDER = "cards"


@dataclass(frozen=True)
class Derivation:
    """Inputs of `SMs x dense FLOP/clock/SM x boost clock` (NVIDIA architecture whitepapers:
    dense FLOP per clock per SM) for the fp16 tensor rate."""

    sm_count: int
    fp16_flops_per_clock_per_sm: int
    boost_clock_mhz: float


@dataclass(frozen=True)
class GpuSpec:
    """Dense datasheet peaks of one GPU SKU."""

    key: str
    name: str
    tflops: dict[str, float | None]  # dtype -> dense TFLOP/s (TOPS for int8); None = no support / unpublished
    memory_datasheet: int | None  # bytes, the marketing "80 GB" (1e9 bytes per GB)
    bandwidth_gbps: float  # GB/s, 1e9
    source: str
    notes: str = ""
    derivation: Derivation | None = None
    confidence: str = "datasheet"  # "datasheet" or "low: ..." (third-party, measure)
    memory_bytes: int | None = None  # what the driver reports as total (see tutor.hardware.specs)
    memory_source: str = ""

    def peak_tflops(self, dtype: str) -> float | None:
        return self.tflops.get(dtype)


@dataclass(frozen=True)
class IntraNodeLink:
    """The link between the GPUs of one node: NVLink or PCIe of a generation, with its source."""

    kind: str  # "nvlink" or "pcie"
    generation: int
    source: str


@dataclass(frozen=True)
class PublishedMamf:
    """The maximum achievable bf16 matmul mamf-finder measured (stas00/ml-engineering), with its source."""

    bf16_tflops: float
    measured_on: str
    shape: tuple[int, int, int]
    source: str


@dataclass(frozen=True)
class CardRecord:
    """Everything the project knows about one GPU card, each fact with its source."""

    spec: GpuSpec
    listing_order: int
    name_patterns: tuple[str, ...]
    aliases: dict[str, str] = field(default_factory=dict)  # short name -> which SKU it is taken as ("" if one)
    driver_memory: tuple[int, str] | None = None  # (bytes the driver reports, where that figure was read)
    intra_node_link: IntraNodeLink | None = None
    mamf: PublishedMamf | None = None
    clocks_source: str = ""

    @property
    def key(self) -> str:
        return self.spec.key


class CardRecordError(ValueError):
    """A card file that does not hold a valid record: the message names the file and the field."""


_FIELDS = ("key", "name", "listing_order", "name_patterns", "aliases", "datasheet", "driver_memory",
           "intra_node_link", "mamf", "clocks")
_KEY = re.compile(r"[a-z0-9][a-z0-9-]*")


class _Reader:
    """Typed reads of one decoded card file; every failure names the file and the dotted field."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, path: str, problem: str) -> CardRecordError:
        return CardRecordError(f"{self.where}: {path}: {problem}")

    def table(self, value: Any, path: str, fields: tuple[str, ...], optional: tuple[str, ...] = ()) -> dict:
        if not isinstance(value, dict):
            raise self.fail(path or "the file", "expected a JSON object")
        missing = [name for name in fields if name not in value]
        unknown = [name for name in value if name not in fields + optional]
        if missing:
            raise self.fail(path or "the file", f"missing field(s) {', '.join(missing)}")
        if unknown:
            raise self.fail(path or "the file", f"unknown field(s) {', '.join(unknown)} (expected {', '.join(fields)})")
        return value

    def text(self, value: Any, path: str, *, empty: bool = False) -> str:
        if not isinstance(value, str) or not (empty or value.strip()):
            raise self.fail(path, "expected " + ("a string" if empty else "a non-empty string"))
        return value

    def number(self, value: Any, path: str) -> float:
        # JSON keeps 1979 an int and 66.9 a float; either is kept as written, so the values read back
        # exactly as the tables held them.
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise self.fail(path, "expected a positive number")
        return value

    def integer(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise self.fail(path, "expected a positive whole number")
        return value


def parse_card(data: Any, where: str, *, stem: str | None = None) -> CardRecord:
    """The record a decoded card file holds; CardRecordError naming `where` and the field if it is not one."""
    read = _Reader(where)
    top = read.table(data, "", _FIELDS)
    key = read.text(top["key"], "key")
    if not _KEY.fullmatch(key):
        raise read.fail("key", f"{key!r} is not lower-case letters, digits and '-'")
    if stem is not None and key != stem:
        raise read.fail("key", f"{key!r} differs from the file name {stem!r}: the file is named after its key")
    name = read.text(top["name"], "name")
    order = read.integer(top["listing_order"], "listing_order")

    patterns = top["name_patterns"]
    if not isinstance(patterns, list) or not patterns:
        raise read.fail("name_patterns", "expected a non-empty list of regular expressions")
    for index, pattern in enumerate(patterns):
        read.text(pattern, f"name_patterns[{index}]")
        try:
            re.compile(pattern)
        except re.error as error:
            raise read.fail(f"name_patterns[{index}]", f"not a regular expression: {error}") from None

    aliases = top["aliases"]
    if not isinstance(aliases, dict):
        raise read.fail("aliases", "expected an object of short name -> note")
    for alias, note in aliases.items():
        read.text(note, f"aliases.{alias}", empty=True)

    sheet = read.table(top["datasheet"], "datasheet",
                       ("source", "confidence", "notes", "memory_gb", "bandwidth_gbps", "dense_tflops"))
    source = read.text(sheet["source"], "datasheet.source")
    confidence = read.text(sheet["confidence"], "datasheet.confidence")
    if confidence != "datasheet" and not confidence.startswith("low: "):
        raise read.fail("datasheet.confidence", f"{confidence!r} is neither 'datasheet' nor 'low: <why>'")
    peaks_in = read.table(sheet["dense_tflops"], "datasheet.dense_tflops", SPEC_DTYPES)
    peaks: dict[str, float | None] = {
        dtype: None if peaks_in[dtype] is None else read.number(peaks_in[dtype], f"datasheet.dense_tflops.{dtype}")
        for dtype in SPEC_DTYPES}
    memory_gb = read.number(sheet["memory_gb"], "datasheet.memory_gb")

    driver: tuple[int, str] | None = None
    if top["driver_memory"] is not None:
        raw = top["driver_memory"]
        unit = next((u for u in ("mib", "bytes") if isinstance(raw, dict) and u in raw), "mib")
        memory = read.table(raw, "driver_memory", (unit, "source"))
        total = read.integer(memory[unit], f"driver_memory.{unit}") * (MiB if unit == "mib" else 1)
        driver = (total, read.text(memory["source"], "driver_memory.source"))

    link = None
    if top["intra_node_link"] is not None:
        raw_link = read.table(top["intra_node_link"], "intra_node_link", ("kind", "generation", "source"))
        kind = raw_link["kind"]
        if kind not in LINK_KINDS:
            raise read.fail("intra_node_link.kind", f"{kind!r} is not one of {', '.join(LINK_KINDS)}")
        generation = read.integer(raw_link["generation"], "intra_node_link.generation")
        try:  # the generation must be one tutor.theory.interconnect has a line rate for
            (nvlink_bandwidth_bytes_per_s if kind == "nvlink" else pcie_bandwidth_bytes_per_s)(generation)
        except UserError as error:
            raise read.fail("intra_node_link.generation", str(error)) from None
        link = IntraNodeLink(kind, generation, read.text(raw_link["source"], "intra_node_link.source"))

    mamf = None
    if top["mamf"] is not None:
        raw_mamf = read.table(top["mamf"], "mamf", ("bf16_tflops", "measured_on", "shape_mnk", "source"))
        shape = raw_mamf["shape_mnk"]
        if not isinstance(shape, list) or len(shape) != 3:
            raise read.fail("mamf.shape_mnk", "expected [m, n, k]")
        m, n, k = (read.integer(size, f"mamf.shape_mnk[{i}]") for i, size in enumerate(shape))
        mamf = PublishedMamf(read.number(raw_mamf["bf16_tflops"], "mamf.bf16_tflops"),
                             read.text(raw_mamf["measured_on"], "mamf.measured_on"), (m, n, k),
                             read.text(raw_mamf["source"], "mamf.source"))

    derivation, clocks_source = None, ""
    if top["clocks"] is not None:
        clocks = read.table(top["clocks"], "clocks",
                            ("sm_count", "fp16_flops_per_clock_per_sm", "boost_clock_mhz", "source"))
        per_sm = "fp16_flops_per_clock_per_sm"
        derivation = Derivation(read.integer(clocks["sm_count"], "clocks.sm_count"),
                                read.integer(clocks[per_sm], f"clocks.{per_sm}"),
                                read.number(clocks["boost_clock_mhz"], "clocks.boost_clock_mhz"))
        clocks_source = read.text(clocks["source"], "clocks.source")

    datasheet_bytes = round(memory_gb * GB)
    if driver is not None:
        memory_bytes, memory_source = driver
    else:
        memory_bytes = datasheet_bytes
        memory_source = f"datasheet size ({datasheet_bytes / GB:g} GB): no driver-reported total found for this card"
    spec = GpuSpec(key=key, name=name, tflops=peaks, memory_datasheet=datasheet_bytes,
                   bandwidth_gbps=read.number(sheet["bandwidth_gbps"], "datasheet.bandwidth_gbps"), source=source,
                   notes=read.text(sheet["notes"], "datasheet.notes", empty=True), derivation=derivation,
                   confidence=confidence, memory_bytes=memory_bytes, memory_source=memory_source)
    return CardRecord(spec=spec, listing_order=order, name_patterns=tuple(patterns), aliases=dict(aliases),
                      driver_memory=driver, intra_node_link=link, mamf=mamf, clocks_source=clocks_source)


def load_card(file: Path, folder_name: str = f"tutor/hardware/{CARDS_FOLDER}") -> CardRecord:
    """The record of one card file; CardRecordError naming the file (and the field) if it is not valid."""
    where = f"{folder_name}/{file.name}"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CardRecordError(f"{where}: not readable JSON: {error}") from None
    return parse_card(data, where, stem=file.name.removesuffix(".json"))


def compact_name(text: str) -> str:
    """'RTX_4090', 'rtx 4090', 'RTX-4090' -> 'rtx4090': case and separators do not matter."""
    return re.sub(r"[\s\-_]+", "", text.lower())


def check_cards(cards: list[CardRecord], folder_name: str) -> tuple[CardRecord, ...]:
    """The records in listing order, once no two share a listing position, a key or a typed name."""
    cards = sorted(cards, key=lambda card: card.listing_order)
    seen_orders: dict[int, str] = {}
    seen_names: dict[str, str] = {}
    for card in cards:
        if card.listing_order in seen_orders:
            raise CardRecordError(f"{folder_name}/{card.key}.json: listing_order: {card.listing_order} is also "
                                  f"{seen_orders[card.listing_order]}'s")
        seen_orders[card.listing_order] = card.key
        for typed in (card.key, *card.aliases):
            compact = compact_name(typed)
            if compact in seen_names:
                raise CardRecordError(f"{folder_name}/{card.key}.json: aliases: {typed!r} is also a name of "
                                      f"{seen_names[compact]}")
            seen_names[compact] = card.key
    return tuple(cards)


def load_cards(folder: Path | None = None) -> tuple[CardRecord, ...]:
    """Every record in a folder of card files (the shipped tutor/hardware/cards/ unless given), in listing
    order: adding a card is adding a file."""
    folder_name = f"tutor/hardware/{CARDS_FOLDER}" if folder is None else str(folder)
    # Package data beside this module, as the lessons are found (tutor.lessons.loader): an installed wheel
    # and an editable install both keep it on disk, and importlib.resources would cost its own imports.
    folder = Path(__file__).with_name(CARDS_FOLDER) if folder is None else folder
    files = sorted(folder.glob("*.json"), key=lambda f: f.name)
    return check_cards([load_card(f, folder_name) for f in files], folder_name)
