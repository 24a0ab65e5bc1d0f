"""tutor.bench.ranks: local ranks on gloo, and what happens when one dies, hangs or is cancelled."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest
import torch  # noqa: F401  (a hard dependency: missing is a failure, not a skip)

from tutor.errors import UserError
from tutor.bench.ranks import RankFailure, RanksCancelled, check_local_ranks, local_rank_cap, run_ranks


def rank_processes() -> list[psutil.Process]:
    """This process's spawned ranks still alive (multiprocessing's resource tracker is not one)."""
    alive = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "spawn_main" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                alive.append(child)
        except psutil.NoSuchProcess:
            pass
    return alive


def summed_ranks(ctx, params: dict) -> dict:
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    dist.all_reduce(value)
    ctx.progress(0.5, f"rank {ctx.rank} reduced")
    return {"rank": ctx.rank, "world": ctx.world, "sum": value.item(), "threads": torch.get_num_threads(),
            "backend": ctx.backend}


def misbehaving_rank(ctx, params: dict) -> dict:
    import torch
    import torch.distributed as dist

    dist.barrier()
    if ctx.rank == params.get("victim", -1):
        if params["how"] == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if params["how"] == "exit":
            os._exit(1)
        if params["how"] == "raise":
            raise ValueError("the lab broke")
    if params["how"] == "hang":
        time.sleep(3600)
    if params["how"] == "loop":
        while not ctx.cancelled():
            ctx.progress(0.5, "looping")
            time.sleep(0.02)
        return {"stopped": True}
    dist.all_reduce(torch.ones(1))  # the survivor waits here for the dead rank
    return {}


@pytest.mark.slow
def test_two_gloo_ranks_return_their_results_in_rank_order() -> None:
    seen: list[str] = []
    results = run_ranks(summed_ranks, {}, ranks=2, timeout_s=60, progress=lambda f, m: seen.append(m))
    assert [r["rank"] for r in results] == [0, 1]
    assert all(r["sum"] == 3.0 and r["world"] == 2 and r["backend"] == "gloo" for r in results)
    assert seen == ["rank 0 reduced"]  # only rank 0's progress reaches the parent
    assert not rank_processes()


@pytest.mark.slow
def test_a_rank_that_dies_stops_every_rank_and_is_named() -> None:
    # The survivor waits in an all-reduce for the dead rank: had the death not ended the run, it would
    # end at the timeout with reason "timeout" (the hang test below), however long start-up took.
    with pytest.raises(RankFailure, match=r"^lab: rank 1 exited \(killed by signal 9, SIGKILL\)$") as caught:
        run_ranks(misbehaving_rank, {"victim": 1, "how": "sigkill"}, ranks=2, timeout_s=600, name="lab")
    assert caught.value.rank == 1 and caught.value.reason == "exited"
    assert not rank_processes()


@pytest.mark.slow
def test_a_rank_that_raises_is_one_line_naming_it() -> None:
    # One rank is enough for the path (and cheaper: each rank imports torch).
    with pytest.raises(RankFailure, match=r"^rank 0 failed: ValueError: the lab broke$"):
        run_ranks(misbehaving_rank, {"victim": 0, "how": "raise"}, ranks=1, timeout_s=60)
    assert not rank_processes()


@pytest.mark.slow
def test_a_hang_is_a_timeout_naming_the_unfinished_ranks() -> None:
    with pytest.raises(RankFailure, match=r"rank 0 did not finish within 5 s \(ranks 0, 1 still running\)") as caught:
        run_ranks(misbehaving_rank, {"how": "hang"}, ranks=2, timeout_s=5)
    assert caught.value.reason == "timeout"
    assert not rank_processes()


@pytest.mark.slow
def test_cancel_reaches_the_ranks_and_stops_them() -> None:
    cancel = threading.Event()

    def progress(fraction: float, message: str) -> None:
        cancel.set()  # the ranks are running: ask them to stop

    # The ranks loop until cancelled: without the cancel the run would end at the timeout, a RankFailure.
    with pytest.raises(RanksCancelled):
        run_ranks(misbehaving_rank, {"how": "loop"}, ranks=2, timeout_s=600, progress=progress, cancel=cancel)
    assert cancel.is_set()
    assert not rank_processes()


def test_too_many_ranks_is_one_line_with_the_numbers() -> None:
    cap, _why = local_rank_cap()
    with pytest.raises(UserError, match=f"{cap + 1:,} local ranks is more than {cap:,}: this machine has"):
        check_local_ranks(cap + 1)
    with pytest.raises(UserError, match=r"local ranks need about .* available"):
        check_local_ranks(1, memory_per_rank_bytes=2**60)
    check_local_ranks(min(cap, 2) if cap >= 2 else 1)
    with pytest.raises(UserError, match="more than"):
        run_ranks(summed_ranks, {}, ranks=cap + 1, timeout_s=10)
    assert not rank_processes()


def test_under_torchrun_the_job_ranks_are_used_and_nothing_is_spawned(monkeypatch: pytest.MonkeyPatch) -> None:
    from tutor.bench.ranks import free_port

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    # ranks=10,000 would be refused locally: torchrun's world decides.
    results = run_ranks(summed_ranks, {}, ranks=10_000, timeout_s=60)
    # One rank on this node: NCCL where there is a GPU for it (cuda:0), gloo on a machine without CUDA.
    backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= 1 else "gloo"
    assert results == [{"rank": 0, "world": 1, "sum": 1.0, "threads": results[0]["threads"], "backend": backend}]
    assert not rank_processes()
    import torch.distributed as dist

    assert not dist.is_initialized()  # the group run_ranks created is gone


@pytest.mark.parametrize(("gpus", "local_world", "backend"),
                         [(0, 1, "gloo"), (1, 1, "nccl"), (1, 2, "gloo"), (2, 2, "nccl"), (8, 4, "nccl")])
def test_a_torchrun_job_uses_nccl_only_when_each_local_rank_has_a_gpu(
        monkeypatch: pytest.MonkeyPatch, gpus: int, local_world: int, backend: str) -> None:
    # The choice every rank of the job makes alike (a machine with `gpus` GPUs, simulated): two ranks on
    # one GPU would get NCCL on rank 0 only, or a cuda:1 that does not exist.
    from tutor.bench.ranks import torchrun_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert torchrun_backend(local_world) == backend


@pytest.mark.gpu
def test_nccl_ranks_one_gpu_each() -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    results = run_ranks(summed_ranks, {}, ranks=2, timeout_s=120)
    assert [(r["backend"], r["sum"]) for r in results] == [("nccl", 3.0), ("nccl", 3.0)]
    assert not rank_processes()
