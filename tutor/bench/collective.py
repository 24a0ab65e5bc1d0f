"""Collective bandwidth through torch.distributed, as nccl-tests defines it.

algbw = S / t with S the buffer size in bytes (all_reduce: the buffer; all_gather: the gathered
output, sendcount x n; reduce_scatter: the full input, recvcount x n) and busbw = algbw x factor
from tutor.theory.parallel.bus_bandwidth (2(n-1)/n for all_reduce, (n-1)/n for the others;
NVIDIA/nccl-tests doc/PERFORMANCE.md). gloo on CPU tensors, NCCL on GPUs. Each iteration is
blocking (barrier, collective, wait), like nccl-tests `-z 1` and ml-engineering's
all_reduce_bench.py; per-iteration times are averaged over ranks.

On one machine the ranks are local processes started by tutor.bench.ranks.run_ranks (spawn, 127.0.0.1
and a free port, capped by this machine's cores and memory: too many ranks is a UserError); a rank
that fails, dies or hangs is reported as a state, never waited on forever, and leaves no process. Across nodes:

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m tutor.bench.collective --sizes 1M,64M,1G --json

(`torchrun --standalone --nproc-per-node N -m tutor.bench.collective` on a single node.) Rank 0
prints the results, with --json as one JSON object {"device": {...}, "results": [...]}, as
`tensor-tutor bench collective --json` does. Sizes are measured smallest first; the sizes left when the
budget is spent are reported as skipped, with a note.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from tutor.bench.counting import gbps
from tutor.errors import UserError

COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter")
# Bytes of S per op: a sweep from 4 KiB (latency-bound) up by 4x to 64 MiB (bandwidth-bound), the
# curve nccl-tests draws (busbw rises with the message size until the link saturates).
DEFAULT_SIZES = tuple(4096 * 4**k for k in range(8))
QUICK_SIZES = (2**20, 16 * 2**20)  # `bench --quick`: two sizes, as before the sweep
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
    # Every size this op was run at in the same run, this one among them (sweep_points): one result
    # read alone gives the busbw-against-size curve.
    sweep: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "op": self.op, "backend": self.backend, "ranks": self.ranks, "bytes": self.bytes,
            "dtype": self.dtype, "algbw_gbps": self.algbw_gbps, "busbw_gbps": self.busbw_gbps,
            "time_median_s": self.time_median_s, "time_best_s": self.time_best_s, "iters": self.iters,
            "device": self.device, "state": self.state, "message": self.message, "noisy": self.noisy,
            "spread": self.spread, "sweep": [dict(point) for point in self.sweep],
        }


def sweep_points(results: list[CollectiveResult]) -> list[CollectiveResult]:
    """The results, each carrying the sweep of its op: [{"size_bytes", "busbw_gbps", "algbw_gbps",
    "time_median_s", "state"}] over the sizes measured, smallest first."""
    from dataclasses import replace

    by_op: dict[str, list[dict[str, Any]]] = {}
    for result in sorted(results, key=lambda r: r.bytes):
        if result.bytes:
            by_op.setdefault(result.op, []).append({
                "size_bytes": result.bytes, "busbw_gbps": result.busbw_gbps, "algbw_gbps": result.algbw_gbps,
                "time_median_s": result.time_median_s, "state": result.state})
    return [replace(result, sweep=tuple(by_op.get(result.op, ()))) for result in results]


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


SKIPPED = "skipped"
"""The state of a size left unmeasured because the budget was spent before it."""


def _buffer_bytes(size: int, world: int, element: int = 4) -> int:
    """S as measured: `size` rounded down to whole fp32 elements divisible by the ranks (at least one each)."""
    return max(world, size // element // world * world) * element


def _predicted_size_s(seconds_per_byte: dict[str, float], ops: tuple[str, ...], size_bytes: int) -> float:
    """Seconds the next size needs at least (warm-up and MIN_ITERS of each op), from each op's time per
    byte at the size before it: a collective of a larger buffer is bandwidth-bound, its time ~ S."""
    return sum((WARMUP_ITERS + MIN_ITERS) * seconds_per_byte.get(op, 0.0) * size_bytes for op in ops)


def _measure_rank(rank: int, world: int, device: str, ops: tuple[str, ...], sizes: tuple[int, ...],
                  budget_s: float, backend: str, deadline: float | None = None) -> list[dict[str, Any]]:
    """Runs inside every rank after init_process_group; rank 0's return value is the report.

    Sizes are measured smallest first; before each larger size the ranks agree (all_reduce MIN) that
    its predicted time fits what is left of the budget, else the sizes left are reported as skipped.
    `deadline` (time.time()) is the caller's, so ranks that took long to start spend the same budget."""
    import torch
    import torch.distributed as dist

    element = 4  # fp32, as nccl-tests' default float and all_reduce_bench.py
    deadline = time.time() + budget_s if deadline is None else deadline
    on_cuda = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(torch.device(device))) if on_cuda else (lambda: None)

    def all_agree(yes: bool) -> bool:
        flag = torch.tensor([1.0 if yes else 0.0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return flag.item() == 1.0

    rows: list[dict[str, Any]] = []
    ordered = tuple(sorted(sizes))
    seconds_per_byte: dict[str, float] = {}
    total_cases = len(ordered) * len(ops)
    for size_index, size in enumerate(ordered):
        if size_index and not all_agree(
                _predicted_size_s(seconds_per_byte, ops, _buffer_bytes(size, world)) <= deadline - time.time()):
            rows.extend({"op": op, "bytes": _buffer_bytes(later, world), "times": [], "skipped": True}
                        for later in ordered[size_index:] for op in ops)
            break
        for op_index, op in enumerate(ops):
            elements = _buffer_bytes(size, world) // element
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
            times: list[float] = []
            share = (deadline - time.time()) / (total_cases - size_index * len(ops) - op_index)
            case_deadline = time.perf_counter() + max(share, 0.0)
            while len(times) < MAX_ITERS:
                # Every rank must agree to go on, or one would wait in a collective the others skipped.
                if not all_agree(len(times) < MIN_ITERS or time.perf_counter() < case_deadline):
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
            seconds_per_byte[op] = mean_times[len(mean_times) // 2] / total_bytes
            rows.append({"op": op, "bytes": total_bytes, "times": mean_times})
    return rows


def _rows_to_results(rows: list[dict[str, Any]], *, backend: str, world: int, device: str,
                     budget_s: float | None = None) -> list[CollectiveResult]:
    from tutor.bench.timing import timing_from_samples

    results = []
    for row in rows:
        if row.get("skipped"):
            spent = f" ({budget_s:g} s)" if budget_s is not None else ""
            results.append(CollectiveResult(
                op=row["op"], backend=backend, ranks=world, bytes=row["bytes"], dtype="fp32", algbw_gbps=None,
                busbw_gbps=None, time_median_s=None, time_best_s=None, iters=0, device=device, state=SKIPPED,
                message=f"budget{spent} spent before this size: not measured"))
            continue
        timing = timing_from_samples(row["times"])
        algbw = gbps(row["bytes"], timing.median_s)
        results.append(CollectiveResult(
            op=row["op"], backend=backend, ranks=world, bytes=row["bytes"], dtype="fp32",
            algbw_gbps=algbw, busbw_gbps=bus_bandwidth_gbps(row["op"], algbw, world),
            time_median_s=timing.median_s, time_best_s=timing.best_s, iters=timing.iters, device=device,
            message=timing.noise_message, noisy=timing.noisy, spread=timing.spread,
        ))
    return results


def budget_note(results: list[CollectiveResult]) -> str:
    """One line when sizes were skipped for the budget ("" otherwise): what a reader must know."""
    from tutor.formatting import format_decimal_bytes

    skipped = sorted({result.bytes for result in results if result.state == SKIPPED})
    if not skipped:
        return ""
    return (f"budget spent: {', '.join(format_decimal_bytes(size) for size in skipped)} not measured "
            "(give --budget more seconds or fewer --sizes)")


def _collective_rank(ctx: Any, params: dict[str, Any]) -> dict[str, Any]:
    """One rank of a local run (tutor.bench.ranks): every rank measures, rank 0's rows are the report."""
    rows = _measure_rank(ctx.rank, ctx.world, ctx.device, params["ops"], params["sizes"], params["budget_s"],
                         ctx.backend, deadline=params.get("deadline"))
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
    # One deadline for every rank, from before they start: their start-up is spent from the budget too.
    params = {"ops": tuple(ops), "sizes": tuple(sizes), "budget_s": budget_s, "deadline": time.time() + budget_s}
    try:
        reports = run_ranks(_collective_rank, params, ranks=ranks, timeout_s=STARTUP_TIMEOUT_S + budget_s * 2,
                            cancel=cancel, backend=backend, memory_per_rank_bytes=memory)
        state, payload = "ok", reports[0]["rows"]
    except RanksCancelled:
        state, payload = "cancelled", "cancelled before the collectives finished"
    except RankFailure as error:  # a rank that failed, died or hung is a reported state (the suite goes on)
        state, payload = ("timeout" if error.reason == "timeout" else "failed"), str(error)
    if state == "ok":
        return sweep_points(_rows_to_results(payload, backend=backend, world=ranks, device=device, budget_s=budget_s))
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


def _parser() -> Any:
    """The torchrun entry's options (argparse: --help answers before torch is imported)."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m tutor.bench.collective",
        description="Collective bandwidth (algbw, busbw as nccl-tests defines them) across the ranks of a "
                    "torchrun job; rank 0 prints the results. For local ranks without torchrun use "
                    "`tensor-tutor bench collective --ranks N`.",
        epilog="example: torchrun --standalone --nproc-per-node=8 -m tutor.bench.collective --sizes 1M,64M,1G --json")
    parser.add_argument("--ops", default=",".join(COLLECTIVE_OPS), metavar="OPS",
                        help=f"collectives, comma-separated (default {','.join(COLLECTIVE_OPS)})")
    parser.add_argument("--sizes", default=None, metavar="SIZES",
                        help="buffer sizes, comma-separated, e.g. 1M,64M,1GiB (default 1MiB,16MiB,64MiB); measured "
                             "smallest first, and the sizes left when the budget is spent are skipped and said so")
    parser.add_argument("--budget", type=float, default=30.0, metavar="SECONDS",
                        help="seconds for the measurements, after the process group starts (default 30)")
    parser.add_argument("--json", action="store_true",
                        help='print one JSON object {"device": {...}, "results": [...]} on rank 0, nothing else')
    return parser


def main(argv: list[str] | None = None) -> int:
    """`torchrun ... -m tutor.bench.collective`: every rank measures, rank 0 prints the results."""
    parser = _parser()
    args = parser.parse_args(argv)
    ops = tuple(op.strip() for op in args.ops.split(",") if op.strip())
    unknown = [op for op in ops if op not in COLLECTIVE_OPS]
    if unknown or not ops:
        parser.error(f"unknown collective {', '.join(unknown) or '(none given)'} (choose from {', '.join(COLLECTIVE_OPS)})")
    if not (args.budget > 0 and args.budget < float("inf")):
        parser.error(f"--budget must be a positive number of seconds, got {args.budget:g}")
    try:
        sizes = parse_sizes(args.sizes)
    except UserError as error:
        parser.error(str(error))
    if "RANK" not in os.environ:
        print("run under torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK); for local ranks use "
              "`tensor-tutor bench collective --ranks N`", file=sys.stderr)
        return 2
    from tutor.bench.ranks import init_torchrun_group, torchrun_backend, torchrun_job

    try:
        job = torchrun_job()
    except UserError as error:
        print(f"tensor-tutor: error: {error}", file=sys.stderr)
        return 2
    import torch
    import torch.distributed as dist

    from tutor.bench.timing import usable_cpu_count

    started = time.time()
    backend = torchrun_backend(job.local_world)
    local_rank = job.local_rank
    # Ranks on one node share its cores; without this each would start a full-size thread pool.
    torch.set_num_threads(max(1, usable_cpu_count() // job.local_world))
    device = f"cuda:{local_rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    try:
        init_torchrun_group(job, backend, device, timeout_s=600.0)
    except UserError as error:
        print(f"tensor-tutor: error: {error}", file=sys.stderr)
        return 2
    world, rank = dist.get_world_size(), dist.get_rank()
    try:
        rows = _measure_rank(rank, world, device, ops, sizes, args.budget, backend)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        results = _rows_to_results(rows, backend=backend, world=world, device=device, budget_s=args.budget)
        note = budget_note(results)
        if args.json:
            from tutor.bench.record import utc_now

            header = {"date": utc_now(), "command": "python -m tutor.bench.collective " + " ".join(sys.argv[1:]),
                      "device_under_test": device, "backend": backend, "ranks": world, "budget_s": args.budget,
                      "elapsed_s": round(time.time() - started, 3), "torch": torch.__version__, "cancelled": False}
            print(json.dumps({"device": header, "results": [result.to_json() for result in results]}))
        else:
            for result in results:
                print(_result_line(result))
        if note:
            print(f"tensor-tutor: note: {note}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    code = main()
    if "RANK" in os.environ:  # a torchrun rank, its group destroyed: skip torch's teardown (see end_rank)
        from tutor.bench.ranks import end_rank

        end_rank(code)
    sys.exit(code)
