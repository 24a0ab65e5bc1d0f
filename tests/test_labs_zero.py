"""lab zero: PyTorch's ZeRO-1 and FSDP2 shard the model states by the factor the ZeRO paper gives."""

from __future__ import annotations

import io

import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)
from rich.console import Console

from tutor.labs import get_probe, run_probe
from tutor.labs.zero import wire_bytes

SMALL = {"hidden": 32, "layers": 1, "batch": 2, "seq": 16}


@pytest.mark.slow
def test_stage1_shards_the_optimizer_states_by_the_world_size() -> None:
    data = run_probe("zero", {"stage": 1, **SMALL}).to_json()
    optimizer = data["optimizer_bytes_per_rank"]
    # Done-when: sharded = replicated / world within 10 % (whole tensors per rank, so not exact).
    assert optimizer["sharded"] == pytest.approx(optimizer["replicated"] / data["ranks"], rel=0.10)
    assert optimizer["replicated"] == pytest.approx(optimizer["theory_replicated"], rel=0.01)  # 8 B per parameter
    # ZeRO-1 keeps gradients and parameters whole.
    assert data["gradients_bytes_per_rank"]["sharded"] == data["gradients_bytes_per_rank"]["replicated"]
    assert data["parameters_bytes_per_rank"]["sharded"] == data["parameters_bytes_per_rank"]["replicated"]
    # torch's ZeRO-1 all-reduces gradients then broadcasts the partitions: counted, not assumed.
    assert set(data["communication_bytes_per_step"]["calls"]) == {"all_reduce", "broadcast"}


@pytest.mark.slow
def test_stage3_shards_parameters_gradients_and_optimizer_and_sends_3_psi() -> None:
    result = run_probe("zero", {"stage": 3, **SMALL})
    data = result.to_json()
    assert set(result.metrics) == set(get_probe("zero").metrics)
    for category in ("parameters", "gradients", "optimizer"):
        figures = data[f"{category}_bytes_per_rank"]
        assert figures["sharded"] == pytest.approx(figures["theory_sharded"], rel=0.10), category
    comm = data["communication_bytes_per_step"]
    assert comm["measured"] == pytest.approx(comm["theory"], rel=0.10)  # two all-gathers + one reduce-scatter
    assert comm["calls"]["all_gather_single"] == 2 * comm["calls"]["reduce_scatter_single"]
    text = io.StringIO()
    Console(file=text, width=100).print(get_probe("zero").render(result))
    assert "sharded" in text.getvalue() and "optimizer" in text.getvalue()


def test_wire_bytes_use_the_ring_factors() -> None:
    # 4 ranks: all_reduce 2(n-1)/n = 1.5, all_gather and reduce_scatter (n-1)/n = 0.75.
    assert wire_bytes([("all_reduce", 1000), ("all_gather_single", 1000), ("reduce_scatter_single", 1000)], 4) == 3000
