"""Link bandwidths: PCIe, NVLink and InfiniBand, per direction, from their specifications.

Every figure is bytes per second in ONE direction, the number a copy or an all-reduce step can use;
vendors often quote both directions added ("NVLink 900 GB/s" on an H100 is 450 GB/s each way).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from tutor.errors import UserError
from tutor.theory.checks import positive_int


@dataclass(frozen=True)
class PcieGeneration:
    """Per-lane signalling of one PCIe generation and its line-code efficiency."""

    generation: int
    gigatransfers_per_s: Fraction | int
    encoding: Fraction  # payload bits per transmitted bit
    encoding_name: str


# PCI Express Base Specification revisions 1.0-6.0 (PCI-SIG): 8b/10b through Gen2, 128b/130b for
# Gen3-5, and Gen6's FLIT mode (PAM4 at 64 GT/s, 242 payload bytes per 256-byte flit).
PCIE_GENERATIONS: dict[int, PcieGeneration] = {
    1: PcieGeneration(1, Fraction("2.5"), Fraction(8, 10), "8b/10b"),
    2: PcieGeneration(2, 5, Fraction(8, 10), "8b/10b"),
    3: PcieGeneration(3, 8, Fraction(128, 130), "128b/130b"),
    4: PcieGeneration(4, 16, Fraction(128, 130), "128b/130b"),
    5: PcieGeneration(5, 32, Fraction(128, 130), "128b/130b"),
    6: PcieGeneration(6, 64, Fraction(242, 256), "FLIT 242/256"),
}


def pcie_bandwidth_bytes_per_s(generation: int, lanes: int = 16) -> float:
    """One direction of a PCIe link: GT/s x lanes x encoding efficiency / 8 bits.

    Gen5 x16: 32 GT/s x 16 x 128/130 / 8 = 63.0 GB/s (the "64 GB/s" often quoted is before the
    128b/130b line code). Packet headers cost a further few percent that no link formula includes.
    """
    positive_int(generation, "PCIe generation")
    positive_int(lanes, "PCIe lanes")
    if generation not in PCIE_GENERATIONS:
        raise UserError(f"PCIe generation must be 1 to {max(PCIE_GENERATIONS)}, got {generation}")
    gen = PCIE_GENERATIONS[generation]
    return float(gen.gigatransfers_per_s * 10**9 * lanes * gen.encoding / 8)


# NVIDIA NVLink generations: bytes per second per link per direction, and the links per GPU of the
# flagship part (NVIDIA NVLink/NVSwitch page and the P100, V100, A100, H100 and B200 datasheets:
# 160, 300, 600, 900 GB/s and 1.8 TB/s bidirectional per GPU).
NVLINK_GENERATIONS: dict[int, tuple[int, int, str]] = {
    1: (20 * 10**9, 4, "P100"),
    2: (25 * 10**9, 6, "V100"),
    3: (25 * 10**9, 12, "A100"),
    4: (25 * 10**9, 18, "H100"),
    5: (50 * 10**9, 18, "B200"),
}


def nvlink_bandwidth_bytes_per_s(generation: int, links: int | None = None) -> float:
    """One direction of a GPU's NVLink: per-link rate x links (default: the generation's flagship GPU).

    NVLink 4 on an H100 SXM: 25 GB/s x 18 links = 450 GB/s each way, the datasheet's 900 GB/s
    counting both directions.
    """
    positive_int(generation, "NVLink generation")
    if generation not in NVLINK_GENERATIONS:
        raise UserError(f"NVLink generation must be 1 to {max(NVLINK_GENERATIONS)}, got {generation}")
    per_link, flagship_links, _ = NVLINK_GENERATIONS[generation]
    return float(per_link * (flagship_links if links is None else positive_int(links, "NVLink links")))


# InfiniBand data rates of a 4x port, Gb/s (InfiniBand Trade Association roadmap): EDR 100, HDR 200,
# NDR 400, XDR 800. These are data rates, after the 64b/66b line code.
INFINIBAND_RATES_GBIT: dict[str, int] = {"edr": 100, "hdr": 200, "ndr": 400, "xdr": 800}


def infiniband_bandwidth_bytes_per_s(rate: str = "ndr") -> float:
    """One direction of one 4x InfiniBand port: NDR 400 Gb/s = 50 GB/s."""
    key = rate.strip().lower() if isinstance(rate, str) else rate
    if key not in INFINIBAND_RATES_GBIT:
        raise UserError(f"unknown InfiniBand rate {rate!r}: use {', '.join(INFINIBAND_RATES_GBIT)}")
    return INFINIBAND_RATES_GBIT[key] * 10**9 / 8
