"""The dense peak table: values from reference §6.1, derivations from §6.3, SKU matching, no silent fallback."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tutor.hardware.specs import (
    DRIVER_MEMORY,
    GPU_ALIASES,
    SPEC_DTYPES,
    SPECS,
    SPECS_BY_KEY,
    close_gpu_names,
    lookup_gpu_spec,
    match_gpu_spec,
)
from tutor.theory import peaks
from tutor.theory.units import GB, MiB

REQUIRED = {"v100-sxm2-16gb", "v100-pcie-16gb", "a100-40gb", "a100-80gb-sxm", "a100-80gb-pcie", "a10", "a10g",
            "l4", "l40s", "h100-sxm", "h100-pcie", "h100-nvl", "h200-sxm", "h200-nvl", "b200", "rtx-3090",
            "rtx-4090", "rtx-5090", "t4", "mi250x", "mi300x"}

KNOWN_NAMES = [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"),
    ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200-sxm"),
    ("NVIDIA H200 NVL", "h200-nvl"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"),
    ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
    ("NVIDIA A100-PCIE-40GB", "a100-40gb"),
    ("NVIDIA A100 80GB PCIe", "a100-80gb-pcie"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("Tesla T4", "t4"),
    ("Tesla V100-SXM2-16GB", "v100-sxm2-16gb"),
    ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
    ("Tesla V100-PCIE-32GB", "v100-pcie-32gb"),
    ("NVIDIA GeForce RTX 3090", "rtx-3090"),
    ("NVIDIA GeForce RTX 4090", "rtx-4090"),
    ("NVIDIA GeForce RTX 5090", "rtx-5090"),
    ("NVIDIA RTX A6000", "rtx-a6000"),
    ("AMD Instinct MI300X", "mi300x"),
    ("AMD Instinct MI250X/MI250", "mi250x"),
]


def test_table_covers_the_required_gpus_and_every_entry_has_a_source():
    assert REQUIRED <= set(SPECS_BY_KEY)
    assert len(SPECS_BY_KEY) == len(SPECS)
    for spec in SPECS:
        assert spec.source and set(spec.tflops) == set(SPEC_DTYPES)
        assert spec.bandwidth_gbps > 0


@pytest.mark.parametrize(
    ("key", "dtype", "published"),
    [
        ("h100-sxm", "bf16", 989.4), ("h100-sxm", "fp8", 1979), ("h100-sxm", "tf32", 494.7),
        ("h100-pcie", "bf16", 756), ("h200-sxm", "bf16", 989.4), ("b200", "bf16", 2250), ("b200", "fp8", 4500),
        ("a100-80gb-sxm", "bf16", 312), ("a100-40gb", "int8", 624), ("a10", "bf16", 125), ("l4", "fp8", 242.5),
        ("l40s", "bf16", 362), ("t4", "fp16", 65), ("v100-sxm2-16gb", "fp16", 125), ("rtx-4090", "bf16", 165.2),
        ("rtx-3090", "fp16", 71), ("mi300x", "bf16", 1307),
    ],
)
def test_dense_values_from_the_reference_table(key, dtype, published):
    assert SPECS_BY_KEY[key].peak_tflops(dtype) == pytest.approx(published)


def test_sparse_figures_are_not_stored():
    # §6.2 trap 1: the H100 SXM datasheet's 1979 BF16 / 3958 FP8 are "with sparsity".
    assert SPECS_BY_KEY["h100-sxm"].peak_tflops("bf16") < 1979
    assert SPECS_BY_KEY["h100-sxm"].peak_tflops("fp8") < 3958
    # §6.2 trap 3: a GeForce card's FP16-accumulate headline is 2x what PyTorch gets.
    assert SPECS_BY_KEY["rtx-4090"].peak_tflops("fp16") == pytest.approx(330.3 / 2, abs=0.1)
    assert "FP16-acc 330.3" in SPECS_BY_KEY["rtx-4090"].notes
    # §6.2 trap 4: the tensor BF16 rate is not the CUDA-core rate (Lightning's 82.6).
    assert SPECS_BY_KEY["rtx-4090"].peak_tflops("bf16") > SPECS_BY_KEY["rtx-4090"].peak_tflops("fp32")


def test_no_hardware_support_is_none():
    assert SPECS_BY_KEY["t4"].peak_tflops("bf16") is None     # Turing has no BF16
    assert SPECS_BY_KEY["v100-sxm2-16gb"].peak_tflops("tf32") is None
    assert SPECS_BY_KEY["a100-80gb-sxm"].peak_tflops("fp8") is None  # Ampere has no FP8


@pytest.mark.parametrize("spec", [s for s in SPECS if s.derivation is not None], ids=lambda s: s.key)
def test_stored_fp16_peak_matches_sm_derivation(spec):
    # §6.3: SMs x dense FLOP/clk/SM x boost clock; §0.6: "check each stored entry".
    d = spec.derivation
    derived = peaks.gpu_peak_flops(sm_count=d.sm_count, flops_per_clock_per_sm=d.fp16_flops_per_clock_per_sm,
                                   clock_hz=d.boost_clock_mhz * 1e6) / 1e12
    assert derived == pytest.approx(spec.peak_tflops("fp16"), rel=0.01)


def test_pcie_and_sxm_a100_differ_in_bandwidth_only():
    sxm, pcie = SPECS_BY_KEY["a100-80gb-sxm"], SPECS_BY_KEY["a100-80gb-pcie"]
    assert sxm.tflops == pcie.tflops and sxm.bandwidth_gbps > pcie.bandwidth_gbps


def test_mi250x_is_per_gcd():
    # §6.2 trap 6: 383 TF is per package of 2 GCDs; one device is one GCD (torchtitan 191.5).
    assert SPECS_BY_KEY["mi250x"].peak_tflops("bf16") == pytest.approx(383 / 2)


@pytest.mark.parametrize(("name", "key"), KNOWN_NAMES)
def test_sku_names_match(name, key):
    spec = match_gpu_spec(name)
    assert spec is not None and spec.key == key


@pytest.mark.parametrize(
    "name",
    ["NVIDIA GH200 480GB", "NVIDIA H100", "NVIDIA L40", "NVIDIA GeForce RTX 4090 D", "NVIDIA GeForce RTX 4090 Laptop GPU",
     "Tesla V100S-PCIE-32GB", "Tesla V100-SXM3-32GB", "NVIDIA A100", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA A40",
     "NVIDIA GeForce GTX 1080", "", "cpu", "Apple M2 Max"],
)
def test_unknown_or_ambiguous_names_match_nothing(name):
    assert match_gpu_spec(name) is None


def test_datasheet_sizes_are_decimal_gb():
    assert SPECS_BY_KEY["h100-sxm"].memory_datasheet == 80 * GB
    assert SPECS_BY_KEY["b200"].memory_datasheet == 180 * GB


def test_capacity_is_what_the_driver_reports():
    # nvidia-smi on an H100 80GB HBM3: "0MiB /  81559MiB" (85,520,809,984 bytes), not 80e9.
    assert SPECS_BY_KEY["h100-sxm"].memory_bytes == 81559 * MiB == 85_520_809_984
    assert "81559MiB" in SPECS_BY_KEY["h100-sxm"].memory_source


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.key)
def test_every_capacity_has_a_source_and_is_near_its_marketing_size(spec):
    assert spec.memory_source
    assert spec.memory_bytes is not None and spec.memory_datasheet is not None
    # Sanity bound only: real reports run from -6% (ECC carve-outs) to +7.4% (GiB-sized parts) of "N GB".
    assert 0.9 * spec.memory_datasheet <= spec.memory_bytes <= 1.1 * spec.memory_datasheet
    if spec.key in DRIVER_MEMORY:
        assert "http" in spec.memory_source or "weakly sourced" in spec.memory_source
    else:
        assert spec.memory_source.startswith("datasheet size") and spec.memory_bytes == spec.memory_datasheet


@pytest.mark.parametrize(("typed", "key"), [
    ("h100", "h100-sxm"), ("H100_SXM", "h100-sxm"), ("h100 pcie", "h100-pcie"), ("a100-40gb", "a100-40gb"),
    ("A100 40GB", "a100-40gb"), ("a100", "a100-80gb-sxm"), ("rtx-4090", "rtx-4090"), ("RTX4090", "rtx-4090"),
    ("4090", "rtx-4090"), ("l4", "l4"), ("mi300x", "mi300x"), ("h200", "h200-sxm"), ("nvidia-h100", "h100-sxm"),
    ("NVIDIA A100-SXM4-80GB", "a100-80gb-sxm"),
])
def test_typed_card_names_resolve_to_one_table_entry(typed, key):
    spec, _ = lookup_gpu_spec(typed)
    assert spec.key == key


def test_a_short_name_that_covers_several_skus_says_which_it_picked():
    _, note = lookup_gpu_spec("a100")
    assert "SXM4 80GB" in note and "a100-40gb" in note
    assert lookup_gpu_spec("h100-sxm")[1] == ""


def test_every_alias_points_at_a_table_key_and_unknown_names_get_close_matches():
    assert all(key in SPECS_BY_KEY for key, _ in GPU_ALIASES.values())
    assert lookup_gpu_spec("h1000") is None and lookup_gpu_spec("rtx-4080") is None
    assert "h100" in close_gpu_names("h1000")


@given(st.text())
def test_matching_never_raises(text):
    spec = match_gpu_spec(text)
    assert spec is None or spec in SPECS


@given(st.sampled_from(KNOWN_NAMES), st.text(alphabet="xyz0123456789", min_size=1, max_size=5))
def test_an_unknown_suffix_never_matches_a_known_card(known, suffix):
    # "never a silent fallback": a known name with an extra word is another product.
    name, key = known
    assert match_gpu_spec(name).key == key
    assert match_gpu_spec(f"{name} {suffix}q") is None
