"""Collectives with local gloo ranks: algbw/busbw as nccl-tests defines them; failure states."""

from __future__ import annotations

import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)

from tutor.bench import collective
from tutor.bench.collective import collective_bandwidth, parse_sizes
from tutor.errors import UserError

COLLECTIVE_KEYS = {"kind", "op", "backend", "ranks", "bytes", "algbw_gbps", "busbw_gbps"}


@pytest.mark.slow
def test_two_gloo_ranks_report_algbw_and_busbw() -> None:
    results = collective_bandwidth(ranks=2, budget_s=1.0, sizes=(64 * 1024,))
    assert [r.op for r in results] == ["all_reduce", "all_gather", "reduce_scatter"]
    for result in results:
        data = result.to_json()
        assert COLLECTIVE_KEYS <= set(data) and data["kind"] == "collective"
        assert result.state == "ok", result.message
        assert result.backend == "gloo" and result.ranks == 2 and result.bytes == 64 * 1024
        assert result.algbw_gbps == pytest.approx(result.bytes / result.time_median_s / 1e9)
    by_op = {r.op: r for r in results}
    # nccl-tests doc/PERFORMANCE.md on n = 2: all_reduce 2(n-1)/n = 1, all_gather/reduce_scatter (n-1)/n = 1/2.
    assert by_op["all_reduce"].busbw_gbps == pytest.approx(by_op["all_reduce"].algbw_gbps)
    assert by_op["all_gather"].busbw_gbps == pytest.approx(by_op["all_gather"].algbw_gbps / 2)
    assert by_op["reduce_scatter"].busbw_gbps == pytest.approx(by_op["reduce_scatter"].algbw_gbps / 2)


@pytest.mark.slow
def test_a_sweep_of_sizes_is_kept_with_each_result() -> None:
    results = collective_bandwidth(ranks=2, budget_s=20.0, ops=("all_reduce",), sizes=(16 * 1024, 4096, 64 * 1024))
    assert [r.bytes for r in results] == [4096, 16 * 1024, 64 * 1024]  # measured smallest first
    for result in results:
        sweep = result.to_json()["sweep"]
        assert [p["size_bytes"] for p in sweep] == [4096, 16 * 1024, 64 * 1024]
        assert [p["busbw_gbps"] for p in sweep] == [r.busbw_gbps for r in results]
        assert [p["state"] for p in sweep] == [r.state for r in results]  # a size the budget skipped says so
    assert results[0].state == "ok", results[0].message


def test_the_default_sizes_sweep_from_latency_to_bandwidth_bound() -> None:
    sizes = parse_sizes(None)
    assert sizes[0] == 4096 and sizes[-1] == 64 * 2**20
    assert all(b == 4 * a for a, b in zip(sizes, sizes[1:]))


def test_busbw_factor_for_eight_ranks() -> None:
    # nccl-tests: all_reduce busbw = algbw x 2(n-1)/n = 1.75 x algbw on 8 ranks; all_gather 7/8.
    assert collective.bus_bandwidth_gbps("all_reduce", 100.0, 8) == pytest.approx(175.0)
    assert collective.bus_bandwidth_gbps("all_gather", 100.0, 8) == pytest.approx(87.5)


def test_one_rank_is_not_applicable() -> None:
    results = collective_bandwidth(ranks=1, budget_s=1.0, sizes=(1024,), ops=("all_reduce",))
    assert [(r.state, r.algbw_gbps, r.busbw_gbps) for r in results] == [("not applicable", None, None)]


def test_nccl_without_a_gpu_per_rank_is_one_clear_line() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() >= 2:
        pytest.skip("NCCL works here")
    with pytest.raises(UserError, match="NCCL needs one per rank"):
        collective_bandwidth(ranks=2, budget_s=1.0, sizes=(1024,), ops=("all_reduce",), backend="nccl")


def test_too_many_ranks_is_one_clear_line_before_any_process_starts() -> None:
    import psutil

    with pytest.raises(UserError, match="local ranks is more than"):
        collective_bandwidth(ranks=100_000, budget_s=1.0, sizes=(1024,), ops=("all_reduce",))
    assert not [p for p in psutil.Process().children(recursive=True) if "spawn_main" in " ".join(p.cmdline())]


def test_a_hanging_start_is_a_timeout_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collective, "STARTUP_TIMEOUT_S", 0.0)
    (result,) = collective_bandwidth(ranks=2, budget_s=0.01, sizes=(1024,), ops=("all_reduce",))
    assert result.state == "timeout"


def test_bad_arguments() -> None:
    with pytest.raises(UserError, match="at least 1"):
        collective_bandwidth(ranks=0, budget_s=1.0)
    with pytest.raises(UserError, match="unknown collective"):
        collective_bandwidth(ranks=2, budget_s=1.0, ops=("broadcastx",))
    assert parse_sizes("1MiB,64KB") == (2**20, 64_000)
    with pytest.raises(UserError):
        parse_sizes("lots")
