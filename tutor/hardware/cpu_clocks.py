"""Published maximum clocks of server CPUs: the clock a CPU peak assumes where cpufreq gives none.

A theoretical peak is a ceiling, so the clock behind it is the highest the cores run at: the
vendor's single-core "max boost" (AMD) or "max turbo" (Intel) clock. Linux reports it through
cpufreq (`cpuinfo_max_freq`), but most VMs have no cpufreq, and their /proc/cpuinfo "cpu MHz" is
the TSC rate, the base clock on current x86 parts: a peak on it is beaten by a quiet matmul (a
2-vCPU EPYC 9005 VM measured above a peak at its 2.60 GHz "cpu MHz"). This table gives the
published figure instead, by the SKU in the model name.

Some hypervisors hide the SKU (Firecracker gives an AMD guest its DEFAULT_AMD_BRAND_STRING,
plain "AMD EPYC"). The CPUID family and model still name the generation, so GENERATIONS gives the
highest max boost of any EPYC SKU of it: an upper bound, and said to be one.

Every row names where its figure is published: the vendor's product page (amd.com "Max. Boost
Clock", ark.intel.com "Max Turbo Frequency") or, for the cloud-only SKUs the vendors do not list,
the cloud provider's page for the instances that carry them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

# Sources: each row's figure is on the page of its SKU named by the row.
_AMD = "amd.com product page, Max. Boost Clock"
_INTEL = "ark.intel.com product page, Max Turbo Frequency"
_AWS = "aws.amazon.com/ec2/instance-types/{}/, \"up to {} GHz\""
_GCP = "cloud.google.com/compute/docs/cpu-platforms, {} max boost frequency"


def _hz(ghz: float) -> float:
    """GHz to Hz through whole MHz, so 4.1 GHz is 4.1e9 exactly (the figures are published in MHz steps)."""
    return round(ghz * 1000) * 1e6


@dataclass(frozen=True)
class SkuClock:
    """One CPU's published clocks (GHz); `base_ghz` None where the source gives only the maximum."""

    name: str
    max_ghz: float
    base_ghz: float | None
    source: str

    @property
    def max_hz(self) -> float:
        return _hz(self.max_ghz)

    @property
    def term(self) -> str:
        """What its vendor calls the maximum: AMD's "max boost", Intel's "max turbo"."""
        return "max turbo" if "Xeon" in self.name else "max boost"


def _amd(sku: str, base: float, boost: float) -> SkuClock:
    return SkuClock(f"AMD EPYC {sku}", boost, base, _AMD)


def _intel(sku: str, base: float, turbo: float) -> SkuClock:
    return SkuClock(f"Intel Xeon {sku}", turbo, base, _INTEL)


_ROWS: tuple[SkuClock, ...] = (
    # EPYC 7003 (Zen 3, Milan)
    _amd("7763", 2.45, 3.5),
    _amd("7713", 2.0, 3.675),
    _amd("7543", 2.8, 3.7),
    _amd("7313", 3.0, 3.7),
    _amd("72F3", 3.7, 4.1),
    # EPYC 9004 (Zen 4, Genoa)
    _amd("9654", 2.4, 3.7),
    _amd("9554", 3.1, 3.75),
    _amd("9454", 2.75, 3.8),
    _amd("9354", 3.25, 3.8),
    _amd("9174F", 4.1, 4.4),
    # EPYC 9005 (Zen 5 and Zen 5c, Turin)
    _amd("9965", 2.25, 3.7),
    _amd("9755", 2.7, 4.1),
    _amd("9655", 2.6, 4.5),
    _amd("9555", 3.2, 4.4),
    _amd("9355", 3.55, 4.4),
    _amd("9575F", 3.3, 5.0),
    _amd("9175F", 4.2, 5.0),
    # cloud-only EPYC SKUs: AMD publishes no page for them, the clouds publish the maximum
    SkuClock("AMD EPYC 7R13", 3.6, None, _AWS.format("m6a", "3.6")),
    SkuClock("AMD EPYC 9R14", 3.7, None, _AWS.format("m7a", "3.7")),
    SkuClock("AMD EPYC 9R45", 4.5, None, _AWS.format("m8a", "4.5")),
    SkuClock("AMD EPYC 7B13", 3.5, 2.45, _GCP.format("AMD Milan")),
    SkuClock("AMD EPYC 9B14", 3.7, 2.6, _GCP.format("AMD Genoa")),
    SkuClock("AMD EPYC 9B45", 4.1, None, _GCP.format("AMD Turin")),
    # Xeon Scalable 3rd gen (Ice Lake), 4th (Sapphire Rapids), 5th (Emerald Rapids)
    _intel("Gold 6338", 2.0, 3.2),
    _intel("Platinum 8380", 2.3, 3.4),
    SkuClock("Intel Xeon Platinum 8375C", 3.5, 2.9, _AWS.format("m6i", "3.5")),
    _intel("Platinum 8480+", 2.0, 3.8),
    _intel("Platinum 8592+", 1.9, 3.9),
)


def _key(name: str) -> str:
    return re.sub(r"\s+", " ", name).strip().upper()


SKU_CLOCKS: dict[str, SkuClock] = {_key(row.name): row for row in _ROWS}


@dataclass(frozen=True)
class GenerationClock:
    """The highest max boost of any SKU of one server generation, by CPUID family and model."""

    series: str
    vendor: str  # CPUID vendor string, as /proc/cpuinfo "vendor_id" shows it
    brand: str  # the word the model name must carry (a Ryzen or Threadripper of the same family boosts higher)
    family: int
    models: range
    max_ghz: float
    fastest: str  # the SKUs that reach it
    source: str

    @property
    def max_hz(self) -> float:
        return _hz(self.max_ghz)


# CPUID family/model ranges: AMD's Processor Programming References (PPR) per family (Family 19h
# Models 00h-0Fh is Milan, 10h-1Fh Genoa; Family 1Ah Models 00h-1Fh is Turin and Turin dense).
GENERATIONS: tuple[GenerationClock, ...] = (
    GenerationClock("AMD EPYC 7003 (Zen 3, Milan)", "AuthenticAMD", "EPYC", 0x19, range(0x00, 0x10), 4.1,
                    "EPYC 72F3", _AMD),
    GenerationClock("AMD EPYC 9004 (Zen 4, Genoa)", "AuthenticAMD", "EPYC", 0x19, range(0x10, 0x20), 4.4,
                    "EPYC 9174F", _AMD),
    GenerationClock("AMD EPYC 9005 (Zen 5, Turin)", "AuthenticAMD", "EPYC", 0x1A, range(0x00, 0x20), 5.0,
                    "EPYC 9575F and 9175F", "amd.com product pages, Max. Boost Clock"),
)


def sku_in_model_name(model_name: str | None) -> str | None:
    """The SKU a model name carries: "AMD EPYC 9654 96-Core Processor" -> "AMD EPYC 9654",
    "Intel(R) Xeon(R) Platinum 8480+" -> "Intel Xeon Platinum 8480+"; None when it names none
    ("AMD EPYC", "Intel(R) Xeon(R) Processor", "Intel(R) Xeon(R) CPU @ 2.20GHz")."""
    text = (model_name or "").replace("(R)", " ").replace("(TM)", " ")
    amd = re.search(r"\bEPYC\s+(\d[0-9A-Z]{3,4})\b", text, re.IGNORECASE)
    if amd:
        return f"AMD EPYC {amd.group(1).upper()}"
    intel = re.search(r"\bXeon\s+(Platinum|Gold|Silver|Bronze)\s+(\d{4}[A-Z]*\+?)", text, re.IGNORECASE)
    if intel:
        return f"Intel Xeon {intel.group(1).title()} {intel.group(2).upper()}"
    return None


def sku_clock(model_name: str | None) -> SkuClock | None:
    """The published clocks of the SKU in `model_name`, or None when it is not in the table. A
    one-socket "P" part (EPYC 9654P) has its two-socket sibling's clocks."""
    sku = sku_in_model_name(model_name)
    if sku is None:
        return None
    key = _key(sku)
    row = SKU_CLOCKS.get(key)
    if row is None and key.endswith("P"):
        sibling = SKU_CLOCKS.get(key[:-1])
        row = replace(sibling, name=sku) if sibling is not None else None
    return row


def generation_clock(model_name: str | None, *, vendor: str | None, family: int | None,
                     model: int | None) -> GenerationClock | None:
    """The generation a CPU belongs to by its CPUID family and model, when its model name carries the
    generation's brand; None for anything else (no guess from the family alone)."""
    if not model_name or vendor is None or family is None or model is None:
        return None
    for generation in GENERATIONS:
        if (vendor == generation.vendor and family == generation.family and model in generation.models
                and generation.brand.lower() in model_name.lower()):
            return generation
    return None
