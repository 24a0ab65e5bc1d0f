"""Link bandwidths against their specifications and the datasheets that quote them."""

from __future__ import annotations

import pytest

from tutor.errors import UserError
from tutor.theory.interconnect import (
    infiniband_bandwidth_bytes_per_s,
    nvlink_bandwidth_bytes_per_s,
    pcie_bandwidth_bytes_per_s,
)


@pytest.mark.parametrize(("generation", "lanes", "gb_per_s"), [
    (3, 16, 15.754),   # the "~16 GB/s" of PCIe 3.0 x16
    (4, 16, 31.508),   # "~32 GB/s" (A100 PCIe datasheet: 64 GB/s bidirectional)
    (5, 16, 63.015),   # "~64 GB/s" (H100 PCIe datasheet: 128 GB/s bidirectional)
    (1, 1, 0.25),      # 2.5 GT/s with 8b/10b: 250 MB/s per lane
    (6, 16, 121.0),    # Gen6 FLIT mode: 64 GT/s x 242/256
])
def test_pcie_per_direction(generation: int, lanes: int, gb_per_s: float) -> None:
    assert pcie_bandwidth_bytes_per_s(generation, lanes) / 1e9 == pytest.approx(gb_per_s, rel=1e-3)


@pytest.mark.parametrize(("generation", "bidirectional_gb"), [(1, 160), (2, 300), (3, 600), (4, 900), (5, 1800)])
def test_nvlink_datasheets_count_both_directions(generation: int, bidirectional_gb: int) -> None:
    assert 2 * nvlink_bandwidth_bytes_per_s(generation) == bidirectional_gb * 1e9


def test_infiniband_ndr_is_50_gb_per_second_each_way() -> None:
    assert infiniband_bandwidth_bytes_per_s("NDR") == 50e9


@pytest.mark.parametrize("call", [lambda: pcie_bandwidth_bytes_per_s(7), lambda: pcie_bandwidth_bytes_per_s(4, 0),
                                  lambda: nvlink_bandwidth_bytes_per_s(9), lambda: infiniband_bandwidth_bytes_per_s("x")])
def test_unknown_links_are_user_errors(call) -> None:
    with pytest.raises(UserError):
        call()
