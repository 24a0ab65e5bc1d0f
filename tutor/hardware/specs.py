"""Dense theoretical peaks of common GPUs, each with its source, and matching a detected name to one.

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
from dataclasses import dataclass

from dataclasses import replace

from tutor.theory.units import GB, MiB

SPEC_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8", "int8")


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
    memory_bytes: int | None = None  # what the driver reports as total (see the module docstring)
    memory_source: str = ""

    def peak_tflops(self, dtype: str) -> float | None:
        return self.tflops.get(dtype)


def _peaks(fp32: float | None, tf32: float | None, bf16: float | None, fp16: float | None,
           fp8: float | None, int8: float | None) -> dict[str, float | None]:
    return {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16, "fp8": fp8, "int8": int8}


_H100_SOURCE = ("NVIDIA H100 Tensor Core GPU datasheet (sparse figures halved), via stas00/ml-engineering "
                "compute/accelerator/README.md, Lightning throughput.py, composer speed_monitor.py")
_A100_SOURCE = ("NVIDIA A100 Tensor Core GPU datasheet (sparse figures halved), via ml-engineering / Lightning / "
                "composer")
_V100_SOURCE = "NVIDIA Tesla V100 datasheet, via composer / Lightning GPU_AVAILABLE_FLOPS"
_GEFORCE_ACC = ("GeForce: stored tensor rates are FP32-accumulate (what PyTorch GEMMs use), half the "
                "FP16-accumulate headline")

_DATASHEET_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("h100-sxm", "H100 SXM5 80GB", _peaks(66.9, 494.7, 989.4, 989.4, 1979, 1979), 80 * GB, 3350,
            _H100_SOURCE, "3.35 TB/s is the datasheet value; early material said 3.0 TB/s",
            Derivation(132, 4096, 1830)),
    GpuSpec("h100-pcie", "H100 PCIe 80GB", _peaks(51.2, 378, 756, 756, 1513, 1513), 80 * GB, 2000,
            _H100_SOURCE, "", Derivation(114, 4096, 1620)),
    GpuSpec("h100-nvl", "H100 NVL (per GPU)", _peaks(None, None, 835, 835, None, None), 94 * GB, 3900,
            "torchtitan get_peak_flops (835e12 dense); ml-engineering: 94 GB, 3.9 TB/s",
            "sources disagree (ml-engineering calls it 'the same FLOPS as H100'); Lightning's 1978.8 is "
            "the dual-card sparse figure", confidence="low: sources disagree, measure"),
    GpuSpec("h200-sxm", "H200 SXM 141GB", _peaks(67, 494.7, 989.4, 989.4, 1979, 1979), 141 * GB, 4800,
            "NVIDIA H200 datasheet via ml-engineering note 16 ('same as H100 ... faster memory'); composer h200-sxm",
            "same compute as H100 SXM, faster memory", Derivation(132, 4096, 1830)),
    GpuSpec("h200-nvl", "H200 NVL 141GB", _peaks(60, 417.5, 835.5, 835.5, 1670.5, 1670.5), 141 * GB, 4800,
            "NVIDIA H200 Tensor Core GPU datasheet, H200 NVL column (TF32 835, BF16/FP16 1671, FP8/INT8 3341 "
            "with sparsity; halved)",
            "lower-power (600 W) PCIe variant; not in the project reference table",
            confidence="low: from the datasheet, not cross-checked in the project reference; measure"),
    GpuSpec("b200", "B200", _peaks(80, 1125, 2250, 2250, 4500, 4500), 180 * GB, 8000,
            "DGX B200 datasheet via ml-engineering; torchtitan 2.25e15",
            "180 GB usable of 192 GiB physical; peaks vary by power SKU; FP4 9000 dense"),
    GpuSpec("a100-40gb", "A100 40GB (SXM4/PCIe)", _peaks(19.5, 156, 312, 312, None, 624), 40 * GB, 1555,
            _A100_SOURCE + "; LLM-Viewer 1555e9", "no FP8 on Ampere", Derivation(108, 2048, 1410)),
    GpuSpec("a100-80gb-sxm", "A100 SXM4 80GB", _peaks(19.5, 156, 312, 312, None, 624), 80 * GB, 2039,
            _A100_SOURCE + "; LLM-Viewer 2039e9", "no FP8 on Ampere", Derivation(108, 2048, 1410)),
    GpuSpec("a100-80gb-pcie", "A100 PCIe 80GB", _peaks(19.5, 156, 312, 312, None, 624), 80 * GB, 1935,
            _A100_SOURCE, "same TFLOPS as SXM, lower memory bandwidth", Derivation(108, 2048, 1410)),
    GpuSpec("a10", "A10", _peaks(31.2, 62.5, 125, 125, None, 250), 24 * GB, 600,
            "NVIDIA A10 datasheet via composer 'a10'", "not the A10G", Derivation(72, 1024, 1695)),
    GpuSpec("a10g", "A10G (AWS g5)", _peaks(None, None, 70, 70, None, 140), 24 * GB, 600,
            "cli99/llm-analysis gpu_configs/a10g-pcie-24gb.json; Baseten 'NVIDIA A10 vs A10G'",
            "no NVIDIA datasheet; Lightning maps a10g to A10 values (125), a trap",
            confidence="low: no datasheet, measure"),
    GpuSpec("l4", "L4", _peaks(30.3, 60, 121, 121, 242.5, 242.5), 24 * GB, 300,
            "NVIDIA L4 datasheet (sparse 120/242/485 halved); Lightning 'l4'"),
    GpuSpec("l40s", "L40S", _peaks(91.6, 183, 362, 362, 733, 733), 48 * GB, 864,
            "NVIDIA L40S datasheet via ml-engineering; torchtitan 362e12"),
    GpuSpec("t4", "T4", _peaks(8.1, None, None, 65, None, 130), 16 * GB, 320,
            "NVIDIA T4 datasheet via composer / Lightning", "Turing: no BF16, TF32 or sparsity; INT4 260",
            Derivation(40, 1024, 1590)),
    GpuSpec("v100-sxm2-16gb", "V100 SXM2 16GB", _peaks(15.7, None, None, 125, None, None), 16 * GB, 900,
            _V100_SOURCE, "no BF16/TF32/INT8 tensor cores (INT8 ~62 TOPS via DP4A on CUDA cores)",
            Derivation(80, 1024, 1530)),
    GpuSpec("v100-sxm2-32gb", "V100 SXM2 32GB", _peaks(15.7, None, None, 125, None, None), 32 * GB, 900,
            _V100_SOURCE, "no BF16/TF32/INT8 tensor cores (INT8 ~62 TOPS via DP4A on CUDA cores)",
            Derivation(80, 1024, 1530)),
    GpuSpec("v100-pcie-16gb", "V100 PCIe 16GB", _peaks(14, None, None, 112, None, None), 16 * GB, 900,
            _V100_SOURCE, "no BF16/TF32/INT8 tensor cores"),
    GpuSpec("v100-pcie-32gb", "V100 PCIe 32GB", _peaks(14, None, None, 112, None, None), 32 * GB, 900,
            _V100_SOURCE, "no BF16/TF32/INT8 tensor cores"),
    GpuSpec("rtx-3090", "GeForce RTX 3090", _peaks(35.6, 35.6, 71, 71, None, 284), 24 * GB, 936,
            "NVIDIA GA102 (Ampere) whitepaper appendix",
            _GEFORCE_ACC + ": FP16-acc 142. Lightning's bf16 35.6 is the non-tensor rate",
            Derivation(82, 512, 1695)),
    GpuSpec("rtx-4090", "GeForce RTX 4090", _peaks(82.6, 82.6, 165.2, 165.2, 330.3, 660.6), 24 * GB, 1008,
            "NVIDIA Ada Lovelace architecture whitepaper (third-party tabulation)",
            _GEFORCE_ACC + ": FP16-acc 330.3, FP8 660.6. Lightning's bf16 82.6 is the non-tensor rate",
            Derivation(128, 512, 2520)),
    GpuSpec("rtx-5090", "GeForce RTX 5090", _peaks(104.8, 104.8, 209.5, 209.5, 419, 838), 32 * GB, 1792,
            "third-party copies of the NVIDIA RTX Blackwell whitepaper",
            _GEFORCE_ACC + ": FP16-acc 419, FP8 838; the 838.4 and 3352 'AI TOPS' are sparse",
            confidence="low: third-party copies, measure"),
    GpuSpec("rtx-a6000", "RTX A6000", _peaks(38.7, 77.4, 154.8, 154.8, None, 309.7), 48 * GB, 768,
            "NVIDIA GA102 whitepaper; LLM-Viewer 309.677e12/2",
            "pro card: full-rate FP32 accumulate; Lightning's bf16 38.7 is the non-tensor rate"),
    GpuSpec("mi250x", "Instinct MI250X (one GCD)", _peaks(23.95, None, 191.5, 191.5, None, 191.5), 64 * GB, 1638.4,
            "AMD Instinct MI250X datasheet (per package: 47.9 FP32 vector, 383 FP16/BF16/INT8, 128 GB, "
            "3.2768 TB/s) halved per GCD as torchtitan does (191.5)",
            "ROCm shows each of the 2 GCDs as its own device; one matmul uses one GCD"),
    GpuSpec("mi300x", "Instinct MI300X", _peaks(163.4, 653.7, 1307, 1307, 2615, 2615), 192 * GB, 5300,
            "AMD Instinct MI300X spec via ml-engineering (1300/2610/2600 rounded)",
            "AMD also publishes 2x 'with sparsity'; FP8 is e4m3fnuz"),
)

_MODAL = ("nvidia-smi totals listed in modal-labs/modal-client PR #2797 "
          "(https://github.com/modal-labs/modal-client/pull/2797) and "
          "https://thundergolfer.com/blog/nvidia-gpu-memory-capacity")

# key -> (total bytes as the driver reports it, where that exact figure was read). nvidia-smi prints
# NVML's memory.total in MiB, so MiB * 2**20 is the NVML byte count.
DRIVER_MEMORY: dict[str, tuple[int, str]] = {
    "h100-sxm": (81559 * MiB, "nvidia-smi 'NVIDIA H100 80GB HBM3 ... 0MiB /  81559MiB', driver 550.54.15: "
                              "https://github.com/NVIDIA/nccl/issues/1264 (also " + _MODAL + ")"),
    "h100-pcie": (81559 * MiB, "nvidia-smi 'NVIDIA H100 PCIe ... 0MiB /  81559MiB' (350 W) in several public "
                               "GitHub READMEs found by exact-string code search; no issue thread found: "
                               "weakly sourced, same total as the SXM part"),
    "h100-nvl": (95830 * MiB, "nvidia-smi 'NVIDIA H100 NVL ... 0MiB / 95830MiB', driver 535.183.01: "
                              "https://github.com/NVIDIA/gpu-admin-tools/issues/4"),
    "h200-sxm": (143771 * MiB, "nvidia-smi 143,771 MiB for the H200: "
                               "https://thundergolfer.com/blog/nvidia-gpu-memory-capacity"),
    "b200": (183359 * MiB, "nvidia-smi 'NVIDIA B200 ... 166593MiB / 183359MiB', driver 580.95.05: "
                           "https://github.com/NVIDIA/TensorRT-LLM/issues/10278"),
    "a100-40gb": (40960 * MiB, "nvidia-smi 40960MiB for the A100 40GB (SXM4): " + _MODAL
                               + "; the PCIe 40GB part is assumed to report the same"),
    "a100-80gb-sxm": (81920 * MiB, "nvidia-smi 81920MiB for the A100 80GB (SXM4): " + _MODAL
                                   + "; 'NVIDIA A800-SXM4-80GB ... 34447MiB / 81920MiB', driver 535.86.10: "
                                   "https://github.com/dexmal/dexbotic/issues/41"),
    "a10": (23028 * MiB, "nvidia-smi 23028MiB for the A10: " + _MODAL),
    "a10g": (23028 * MiB, "nvidia-smi 'NVIDIA A10G ... 8722MiB / 23028MiB', driver 535.247.01: "
                          "https://github.com/NVIDIA/DCGM/issues/232"),
    "l4": (23034 * MiB, "nvidia-smi 23034MiB for the L4: " + _MODAL),
    "l40s": (46068 * MiB, "nvidia-smi 46068MiB for the L40S (ECC on): " + _MODAL),
    "t4": (15360 * MiB, "nvidia-smi 15360MiB for the T4: " + _MODAL),
    "v100-sxm2-16gb": (16384 * MiB, "nvidia-smi 'Tesla V100-SXM2-16GB ... 5MiB /  16384MiB', driver 570.211.01: "
                                    "https://github.com/1CatAI/1Cat-vLLM/issues/85"),
    "v100-sxm2-32gb": (32768 * MiB, "nvidia-smi 'Tesla V100-SXM2... 308MiB / 32768MiB', driver 525.105.17: "
                                    "https://github.com/Wan-Video/Wan2.1/issues/5"),
    "v100-pcie-32gb": (32768 * MiB, "nvidia-smi --query-gpu 'Tesla PG500-216, 32768 MiB' (the V100 PCIe 32GB "
                                    "board): https://github.com/akash-network/provider-configs/pull/90; driver "
                                    "410 showed 32480MiB for a V100-PCIE 32GB"),
    "rtx-3090": (24576 * MiB, "nvidia-smi 'NVIDIA GeForce RTX 3090 ... 22598MiB /  24576MiB', driver 595.84: "
                              "https://github.com/noonghunna/club-3090/issues/1128"),
    "rtx-4090": (24564 * MiB, "nvidia-smi 'NVIDIA GeForce RTX 4090 ... 507MiB /  24564MiB', driver 550.163.01: "
                              "https://github.com/RLinf/RLinf/issues/255"),
    "rtx-5090": (32607 * MiB, "nvidia-smi 'NVIDIA GeForce RTX 5090 ... 492MiB /  32607MiB', driver 595.71.05: "
                              "https://github.com/noonghunna/club-3090/issues/617"),
    "rtx-a6000": (49140 * MiB, "nvidia-smi 'NVIDIA RTX A6000 ... 67MiB / 49140MiB' (ECC off, the default) in "
                               "several public GitHub files found by exact-string code search; no issue thread "
                               "found: weakly sourced"),
    "mi300x": (206141652992, "rocm-smi 'VRAM Total Memory (B): 206141652992' (whole device): "
                             "https://github.com/ROCm/legacy-rocm-build/issues/4750"),
}


def _with_driver_memory(spec: GpuSpec) -> GpuSpec:
    """The spec with the driver-reported total, or its datasheet size marked as such where none was found."""
    if spec.key in DRIVER_MEMORY:
        total, source = DRIVER_MEMORY[spec.key]
        return replace(spec, memory_bytes=total, memory_source=source)
    size = f"{spec.memory_datasheet / GB:g} GB" if spec.memory_datasheet else "unknown"
    return replace(spec, memory_bytes=spec.memory_datasheet,
                   memory_source=f"datasheet size ({size}): no driver-reported total found for this card")


SPECS: tuple[GpuSpec, ...] = tuple(_with_driver_memory(spec) for spec in _DATASHEET_SPECS)
SPECS_BY_KEY: dict[str, GpuSpec] = {spec.key: spec for spec in SPECS}

# Full-match patterns over the normalized name (see _normalize). Order matters only for clarity:
# the patterns are mutually exclusive, and anything else (GH200, L40, RTX 4090 D, V100S) is unknown.
_PATTERNS: tuple[tuple[str, str], ...] = (
    ("h100-sxm", r"h100( sxm5?)?( 80gb)? hbm3|h100 sxm5?( 80gb)?"),
    ("h100-pcie", r"h100( 80gb)? pcie( 80gb)?"),
    ("h100-nvl", r"h100 nvl( 94gb)?"),
    ("h200-sxm", r"h200( sxm5?)?( 141gb)?( hbm3e)?"),
    ("h200-nvl", r"h200 nvl( 141gb)?"),
    ("b200", r"b200( 180gb)?( hbm3e)?"),
    ("a100-40gb", r"a100( sxm4| pcie)? 40gb( sxm4| pcie)?"),
    ("a100-80gb-sxm", r"a100 sxm4? 80gb|a100 80gb sxm4?"),
    ("a100-80gb-pcie", r"a100 pcie 80gb|a100 80gb pcie"),
    ("a10", r"a10"),
    ("a10g", r"a10g"),
    ("l4", r"l4"),
    ("l40s", r"l40s"),
    ("t4", r"t4"),
    ("v100-sxm2-16gb", r"v100 sxm2 16gb"),
    ("v100-sxm2-32gb", r"v100 sxm2 32gb"),
    ("v100-pcie-16gb", r"v100 pcie 16gb"),
    ("v100-pcie-32gb", r"v100 pcie 32gb"),
    ("rtx-3090", r"rtx 3090"),
    ("rtx-4090", r"rtx 4090"),
    ("rtx-5090", r"rtx 5090"),
    ("rtx-a6000", r"rtx a6000"),
    ("mi250x", r"mi250x( ?/ ?mi250)?( oam)?"),
    ("mi300x", r"mi300x( oam)?"),
)
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
    "h100": ("h100-sxm", "h100 is taken as the H100 SXM5 80GB (h100-pcie and h100-nvl are the others)"),
    "h100-80gb": ("h100-sxm", "h100-80gb is taken as the H100 SXM5 80GB (h100-pcie is the PCIe card)"),
    "h200": ("h200-sxm", "h200 is taken as the H200 SXM 141GB (h200-nvl is the other)"),
    "a100": ("a100-80gb-sxm", "a100 is taken as the A100 SXM4 80GB (a100-40gb and a100-80gb-pcie are the others)"),
    "a100-80gb": ("a100-80gb-sxm", "a100-80gb is taken as the A100 SXM4 80GB (a100-80gb-pcie is the other)"),
    "a100-sxm": ("a100-80gb-sxm", "a100-sxm is taken as the A100 SXM4 80GB (a100-40gb is the 40GB part)"),
    "a100-pcie": ("a100-80gb-pcie", "a100-pcie is taken as the A100 PCIe 80GB (a100-40gb is the 40GB part)"),
    "v100": ("v100-sxm2-16gb", "v100 is taken as the V100 SXM2 16GB (the 32GB and PCIe parts have their own keys)"),
    "b200-sxm": ("b200", ""),
    "3090": ("rtx-3090", ""),
    "4090": ("rtx-4090", ""),
    "5090": ("rtx-5090", ""),
    "a6000": ("rtx-a6000", ""),
    "mi250": ("mi250x", "mi250 is taken as one GCD of an MI250X (ROCm shows each GCD as a device)"),
}


def _compact(text: str) -> str:
    """'RTX_4090', 'rtx 4090', 'RTX-4090' -> 'rtx4090': case and separators do not matter."""
    return re.sub(r"[\s\-_]+", "", text.lower())


_BY_COMPACT: dict[str, tuple[str, str]] = {
    **{_compact(key): (key, "") for key in SPECS_BY_KEY},
    **{_compact(alias): target for alias, target in GPU_ALIASES.items()},
}
_VENDOR_WORDS = tuple(sorted(_PREFIXES, key=len, reverse=True))


def lookup_gpu_spec(text: str) -> tuple[GpuSpec, str] | None:
    """The spec a typed card name means, and a note when a short name covers several SKUs; None if unknown.

    Accepts table keys (h100-sxm), the aliases above (h100, a100, 4090), case and `_`/space/`-`
    spellings, a leading vendor word (nvidia-h100), and full names as NVML reports them.
    """
    compact = _compact(text)
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

    by_compact = {_compact(name): name for name in gpu_names()}
    found = difflib.get_close_matches(_compact(text), list(by_compact), n=limit, cutoff=0.5)
    return [by_compact[name] for name in found]


def unknown_device_message(text: str) -> str:
    """One line for a card name the spec table does not know: the closest known names, and where the rest are."""
    close = close_gpu_names(text)
    nearest = f"did you mean {', '.join(close)}? " if close else ""
    return (f"unknown GPU {text!r}: {nearest}use 'this' (the detected device) or a card such as h100, h200, "
            "a100-40gb, rtx-4090 (tensor-tutor models --devices lists them all)")
