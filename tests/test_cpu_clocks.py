"""The published CPU clock table: every row sourced and findable by its own model name, and each
generation's bound at or above every SKU of it in the table."""

from __future__ import annotations

import pytest

from tutor.hardware import cpu_clocks
from tutor.hardware.cpu_clocks import GENERATIONS, SKU_CLOCKS, generation_clock, sku_clock, sku_in_model_name


@pytest.mark.parametrize("row", list(SKU_CLOCKS.values()), ids=lambda row: row.name)
def test_each_row_is_sourced_and_found_by_its_name(row):
    assert row.source and ("amd.com" in row.source or "intel.com" in row.source or "aws.amazon.com" in row.source
                           or "cloud.google.com" in row.source)
    assert 1.0 < row.max_ghz < 6.0
    assert row.base_ghz is None or row.base_ghz <= row.max_ghz
    assert sku_clock(row.name) == row


@pytest.mark.parametrize("text, sku", [
    ("AMD EPYC 9654 96-Core Processor", "AMD EPYC 9654"),
    ("AMD EPYC 9575F 64-Core Processor", "AMD EPYC 9575F"),
    ("AMD EPYC 7B13", "AMD EPYC 7B13"),
    ("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "Intel Xeon Platinum 8375C"),
    ("Intel(R) Xeon(R) Platinum 8480+", "Intel Xeon Platinum 8480+"),
    ("AMD EPYC", None),
    ("AMD EPYC Processor", None),
    ("Intel(R) Xeon(R) Processor", None),
    ("Intel(R) Xeon(R) CPU @ 2.20GHz", None),
    (None, None),
])
def test_sku_in_model_name(text, sku):
    assert sku_in_model_name(text) == sku


def test_one_socket_p_part_has_its_siblings_clocks():
    row = sku_clock("AMD EPYC 9654P 96-Core Processor")
    assert row is not None and row.name == "AMD EPYC 9654P" and row.max_ghz == SKU_CLOCKS["AMD EPYC 9654"].max_ghz


def test_published_figures_in_whole_mhz():
    assert SKU_CLOCKS["AMD EPYC 7713"].max_hz == 3675e6 and GENERATIONS[0].max_hz == 4.1e9


@pytest.mark.parametrize("generation, pattern", [(GENERATIONS[0], ("7", "3")), (GENERATIONS[1], ("9", "4")),
                                                 (GENERATIONS[2], ("9", "5"))])
def test_generation_bound_covers_its_skus(generation, pattern):
    first, last = pattern
    # EPYC numbering: the first digit is the socket line, the last the generation (9654: 9004, 9575F: 9005)
    tokens = [(row, row.name.split()[-1]) for row in SKU_CLOCKS.values() if row.name.startswith("AMD EPYC ")]
    skus = [row for row, token in tokens if token[0] == first and token.rstrip("F")[-1] == last]
    assert skus
    assert all(row.max_ghz <= generation.max_ghz for row in skus)
    assert any(row.max_ghz == generation.max_ghz for row in skus)  # the bound is a real SKU's figure


def test_generation_needs_the_brand_and_the_cpuid():
    assert generation_clock("AMD EPYC", vendor="AuthenticAMD", family=0x1A, model=0x02) is GENERATIONS[2]
    assert generation_clock("AMD Ryzen 9 9950X", vendor="AuthenticAMD", family=0x1A, model=0x02) is None
    assert generation_clock("AMD EPYC", vendor="AuthenticAMD", family=0x1A, model=0x44) is None  # EPYC 4005
    assert generation_clock("AMD EPYC", vendor="AuthenticAMD", family=None, model=None) is None
    assert cpu_clocks.generation_clock(None, vendor="AuthenticAMD", family=0x19, model=0x01) is None
