"""Collective bandwidth through torch.distributed, as nccl-tests defines it.

algbw = S / t with S the buffer size in bytes (all_reduce: the buffer; all_gather: the gathered
output, sendcount x n; reduce_scatter: the full input, recvcount x n) and busbw = algbw x factor
from tutor.theory.parallel.bus_bandwidth (2(n-1)/n for all_reduce, (n-1)/n for the others;
NVIDIA/nccl-tests doc/PERFORMANCE.md). gloo on CPU tensors, NCCL on GPUs. Each iteration is
blocking (barrier, collective, wait), like nccl-tests `-z 1` and ml-engineering's
all_reduce_bench.py; per-iteration times are averaged over ranks.

On one machine the ranks are local processes started by tutor.labs.ranks.run_ranks (spawn, 127.0.0.1
and a free port, capped by this machine's cores and memory: too many ranks is a UserError); a rank
that fails, dies or hangs is reported as a state, never waited on forever, and leaves no process. Across nodes:

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m tutor.bench.collective --sizes 1M,64M,1G --json

(`torchrun --standalone --nproc-per-node N -m tutor.bench.collective` on a single node.) Rank 0
prints one JSON line per result.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from tutor.bench.counting import gbps
from tutor.errors import UserError

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")
DEFAULT_SIZES = (2**20, 16 * 2**20, 64 * 2**20)  # bytes of S per op
WARMUP_ITERS = 2
MAX_ITERS = 20  # nccl-tests -n 20
MIN_ITERS = 3
# Seconds a rank may take to start (import torch, rendezvous) before the run is declared failed.
STARTUP_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class CollectiveResult:
    """One collective at one size; `state` is "ok", or why there is no figure ("failed", "timeout",
    "cancelled", "not applicable: 1 rank") with `message` saying more."""

    op: str
    backend: str
    ranks: int
    bytes: int
    dtype: str
    algbw_gbps: float | None
    busbw_gbps: float | None
    time_median_s: float | None
    time_best_s: float | None
    iters: int
    device: str
    state: str = "ok"
    message: str = ""
    noisy: bool = False
    spread: float | None = None
    kind: str = "collective"

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "op": self.op, "backend": self.backend, "ranks": self.ranks, "bytes": self.bytes,
            "dtype": self.dtype, "algbw_gbps": self.algbw_gbps, "busbw_gbps": self.busbw_gbps,
            "time_median_s": self.time_median_s, "time_best_s": self.time_best_s, "iters": self.iters,
            "device": self.device, "state": self.state, "message": self.message, "noisy": self.noisy,
            "spread": self.spread,
        }


def bus_bandwidth_gbps(op: str, algbw_gbps: float, ranks: int) -> float:
    """busbw in GB/s via tutor.theory.parallel.bus_bandwidth (nccl-tests doc/PERFORMANCE.md)."""
    from tutor.theory.parallel import bus_bandwidth

    return bus_bandwidth(op, algbw_gbps * 1e9, ranks) / 1e9


def parse_sizes(text: str | None) -> tuple[int, ...]:
    if text is None:
        return DEFAULT_SIZES
    from tutor.theory.units import parse_bytes

    sizes = []
    for part in text.split(","):
        try:
            sizes.append(parse_bytes(part))
        except ValueError as error:
            raise UserError(str(error)) from None
    return tuple(sizes)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _measure_rank(rank: int, world: int, device: str, ops: tuple[str, ...], sizes: tuple[int, ...],
                  budget_s: float, backend: str) -> list[dict[str, Any]]:
    """Runs inside every rank after init_process_group; rank 0's return value is the report."""
    import torch
    import torch.distributed as dist

    element = 4  # fp32, as nccl-tests' default float and all_reduce_bench.py
    deadline = time.perf_counter() + budget_s
    on_cuda = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(torch.device(device))) if on_cuda else (lambda: None)
    rows = []
    cases = [(op, size) for size in sizes for op in ops]
    for index, (op, size) in enumerate(cases):
        elements = max(world, size // element // world * world)
        total_bytes = elements * element
        full = torch.rand(elements, device=device)
        part = torch.rand(elements // world, device=device)
        # torch >= 2.13 renamed the tensor forms to *_single (the old names warn); both are (output, input).
        all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        if op == "all_reduce":
            run = lambda: dist.all_reduce(full)  # noqa: E731
        elif op == "all_gather":
            run = lambda: all_gather(full, part)  # noqa: E731
        else:
            run = lambda: reduce_scatter(part, full)  # noqa: E731
        for _ in range(WARMUP_ITERS):
            run()
        sync()
        times = []
        share = (deadline - time.perf_counter()) / (len(cases) - index)
        case_deadline = time.perf_counter() + max(share, 0.0)
        while len(times) < MAX_ITERS:
            # Every rank must agree to go on, or one would wait in a collective the others skipped.
            go = torch.tensor([1.0 if (len(times) < MIN_ITERS or time.perf_counter() < case_deadline) else 0.0],
                              device=device)
            dist.all_reduce(go, op=dist.ReduceOp.MIN)
            if go.item() == 0.0:
                break
            dist.barrier()
            start = time.perf_counter()
            run()
            sync()
            times.append(time.perf_counter() - start)
        # Average each iteration's time over ranks (all_reduce_bench.py averages across ranks).
        summed = torch.tensor(times, dtype=torch.float64, device=device)
        dist.all_reduce(summed)
        mean_times = sorted((summed / world).tolist())
        rows.append({"op": op, "bytes": total_bytes, "times": mean_times})
    return rows


def _rows_to_results(rows: list[dict[str, Any]], *, backend: str, world: int, device: str) -> list[CollectiveResult]:
    from tutor.bench.timing import timing_from_samples

    results = []
    for row in rows:
        timing = timing_from_samples(row["times"])
        algbw = gbps(row["bytes"], timing.median_s)
        results.append(CollectiveResult(
            op=row["op"], backend=backend, ranks=world, bytes=row["bytes"], dtype="fp32",
            algbw_gbps=algbw, busbw_gbps=bus_bandwidth_gbps(row["op"], algbw, world),
            time_median_s=timing.median_s, time_best_s=timing.best_s, iters=timing.iters, device=device,
            message=timing.noise_message, noisy=timing.noisy, spread=timing.spread,
        ))
    return results


def process_group_device(backend: str, device: str) -> dict[str, Any]:
    """`device_id` for init_process_group on NCCL: it binds the rank to its GPU up front, without which
    PyTorch warns at the first barrier that the device is guessed (and may hang on a wrong guess).
    Empty for gloo, and for a torch whose init_process_group has no device_id."""
    import inspect

    import torch
    import torch.distributed as dist

    if backend != "nccl" or "device_id" not in inspect.signature(dist.init_process_group).parameters:
        return {}
    return {"device_id": torch.device(device)}


def _collective_rank(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    """One rank of a local run (tutor.labs.ranks): every rank measures, rank 0's rows are the report."""
    rows = _measure_rank(ctx.rank, ctx.world, ctx.device, params["ops"], params["sizes"], params["budget_s"],
                         ctx.backend)
    return {"rows": rows}


def collective_bandwidth(*, ranks: int, budget_s: float, ops: tuple[str, ...] = COLLECTIVE_OPS,
                         sizes: tuple[int, ...] = DEFAULT_SIZES, backend: str | None = None,
                         cancel: threading.Event | None = None) -> list[CollectiveResult]:
    """Spawn `ranks` local processes and measure each op at each size within about `budget_s`
    (plus process start-up). backend None: nccl when there are at least `ranks` GPUs, else gloo."""
    if ranks < 1:
        raise UserError(f"--ranks must be at least 1, got {ranks}")
    for op in ops:
        if op not in COLLECTIVE_OPS:
            raise UserError(f"unknown collective {op!r} (choose from {', '.join(COLLECTIVE_OPS)})")
    from tutor.bench.ranks import choose_backend

    backend = choose_backend(ranks, backend)
    device = "cuda" if backend == "nccl" else "cpu"
    if ranks == 1:
        return [CollectiveResult(op=op, backend=backend, ranks=1, bytes=size, dtype="fp32", algbw_gbps=None,
                                 busbw_gbps=None, time_median_s=None, time_best_s=None, iters=0, device=device,
                                 state="not applicable", message="needs at least 2 ranks (busbw factor is 0)")
                for size in sizes for op in ops]
    from tutor.bench.memory import collective_buffer_bytes
    from tutor.bench.ranks import DEFAULT_MEMORY_PER_RANK, RankFailure, RanksCancelled, run_ranks

    memory = DEFAULT_MEMORY_PER_RANK + collective_buffer_bytes(max(sizes), ranks)
    params = {"ops": tuple(ops), "sizes": tuple(sizes), "budget_s": budget_s}
    try:
        reports = run_ranks(_collective_rank, params, ranks=ranks, timeout_s=STARTUP_TIMEOUT_S + budget_s * 2,
                            cancel=cancel, backend=backend, memory_per_rank_bytes=memory)
        state, payload = "ok", reports[0]["rows"]
    except RanksCancelled:
        state, payload = "cancelled", "cancelled before the collectives finished"
    except RankFailure as error:  # a rank that failed, died or hung is a reported state (the suite goes on)
        state, payload = ("timeout" if error.reason == "timeout" else "failed"), str(error)
    if state == "ok":
        return _rows_to_results(payload, backend=backend, world=ranks, device=device)
    return [CollectiveResult(op=op, backend=backend, ranks=ranks, bytes=0, dtype="fp32", algbw_gbps=None,
                             busbw_gbps=None, time_median_s=None, time_best_s=None, iters=0, device=device,
                             state=state, message=str(payload)) for op in ops]


def _result_line(result: CollectiveResult) -> str:
    """One rank-0 line of the torchrun output, in human units; a case that did not run says why."""
    from tutor.formatting import format_decimal_bytes as format_bytes, format_rate  # sizes are typed as 1M, 64M

    if result.algbw_gbps is None or result.busbw_gbps is None:
        return f"{result.op:15} {format_bytes(result.bytes):>10}  {result.state}: {result.message}"
    return (f"{result.op:15} {format_bytes(result.bytes):>10}  algbw {format_rate(result.algbw_gbps * 1e9, 'B/s'):>11}"
            f"  busbw {format_rate(result.busbw_gbps * 1e9, 'B/s'):>11}")


def main(argv: list[str] | None = None) -> int:
    """`torchrun ... -m tutor.bench.collective`: every rank measures, rank 0 prints the results."""
    import argparse

    import torch
    import torch.distributed as dist

    parser = argparse.ArgumentParser(prog="python -m tutor.bench.collective", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(COLLECTIVE_OPS))
    parser.add_argument("--sizes", default=None, help="comma-separated sizes, e.g. 1M,64M,1GiB")
    parser.add_argument("--budget", type=float, default=30.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if "RANK" not in os.environ:
        print("run under torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK); for local ranks use "
              "`tensor-tutor bench collective --ranks N`", file=sys.stderr)
        return 2
    from tutor.bench.timing import usable_cpu_count

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    # Ranks on one node share its cores; without this each would start a full-size thread pool.
    torch.set_num_threads(max(1, usable_cpu_count() // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    device = f"cuda:{local_rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    dist.init_process_group(backend, **process_group_device(backend, device))
    world, rank = dist.get_world_size(), dist.get_rank()
    try:
        ops = tuple(op.strip() for op in args.ops.split(",") if op.strip())
        rows = _measure_rank(rank, world, device, ops, parse_sizes(args.sizes), args.budget, backend)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        for result in _rows_to_results(rows, backend=backend, world=world, device=device):
            if args.json:
                print(json.dumps(result.to_json()))
            else:
                print(_result_line(result))
    return 0


if __name__ == "__main__":
    code = main()
    if "RANK" in os.environ:  # a torchrun rank, its group destroyed: skip torch's teardown (see end_rank)
        from tutor.bench.ranks import end_rank

        end_rank(code)
    sys.exit(code)
