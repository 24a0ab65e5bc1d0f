"""pipeline: a small MLP stack split into P stages on P local ranks, trained with GPipe or 1F1B.

Two schedules, each a fixed order of blocks per stage (`schedule_order`): GPipe (Huang et al. 2019,
arXiv 1811.06965 §2.3) runs every micro-batch's forward, then every backward; 1F1B (PipeDream-Flush,
Narayanan et al. 2021, arXiv 2104.04473 §2.2.1) fills the pipeline with P - stage forwards, then
alternates one backward and one forward, then drains the backwards. Each block is timed on one clock.

Why not torch.distributed.pipelining on CPUs: its ScheduleGPipe and Schedule1F1B post each receive
only when the stage is about to need it. gloo moves a tensor only once both sides have posted
(sender and receiver exchange ready notices, then gloo's own event-loop thread writes and reads the
socket), so on CPU ranks the hand-over of micro-batch i started only when the receiver had finished
its previous block, and then needed the sender's loop thread, which competes with the sender's
compute for the same cores. The lab measured that delay, up to a whole block per micro-batch, and
a bubble up to twice (P-1)/(M+P-1) at M=8. Here every receive of a step is posted before the step
starts (one buffer per micro-batch and direction), so each send finds its receive waiting and gloo
writes the data at once; the receiver only reads it. With NCCL (GPU ranks) the receives of both
directions would queue on one stream and could deadlock, and NCCL progresses on the GPU: GPU ranks
use torch's schedules as they are (`_torch_schedule_step`).

Time origin: after a barrier, rank 0's reading of the monotonic clock, which every process on one
host shares (across hosts: each rank's own reading after the barrier, aligned to the barrier's
release skew). The first stage's input needs its gradient too, as the output of an embedding would,
so every stage does the same work, which is what the bubble formula assumes; the last stage's
forward also computes the loss (timed as its work, as a language model's last stage computes its
head and loss), which makes it slightly slower and the others wait a little for it.

Measured bubble, per step: T = the step time, from t0 to the moment the last rank's step returns
(its sends completed); busy(s) = the summed durations of stage s's forward and backward blocks;

    bubble = sum over stages of (T - busy(s)) / (P x T)

Everything outside the blocks counts as idle: pipeline fill and drain, and also the time spent
waiting for sends and receives between stages. Each hand-over is recorded (`transfers`: when the
sender's block ended, when the receiver began to wait, when the data was there), so the
communication inside the bubble is visible. On a machine whose cores are shared with other work,
descheduled time inflates both; `core_wait_share` (Linux schedstat: time the stages' threads were
ready to run but had no core) says how much. The first step (warm-up: allocation, socket buffers) is not
counted; of the others, the step with the median bubble is reported, with its timeline. Beside it:
tutor.theory.parallel.pipeline_bubble_fraction, (P-1)/(M+P-1), and the theory's schedule drawn on the
same time scale: every block at the median measured forward or backward length, replayed through the
schedule with free hand-overs (equal_block_durations, replay_timeline), whose bubble is the formula's.

Activations in flight: for each stage, the most micro-batches whose forward has finished and whose
backward has not, read off the timeline, against pipeline_microbatches_in_flight (GPipe: M; 1F1B:
P - stage). The bytes autograd saves for one micro-batch (saved_tensors_hooks, weights excluded)
times that count give the stage's peak activation bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from tutor.errors import UserError
from tutor.labs.probe import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, make_probe

SCHEDULES = ("gpipe", "1f1b")
TIMEOUT_S = 300.0
FFN_MULTIPLIER = 4
LEARNING_RATE = 1e-3
FORWARD, BACKWARD = "F", "B"


# ---------------------------------------------------------------- the schedules (no torch)


def schedule_order(schedule: str, *, stages: int, stage: int, microbatches: int) -> list[tuple[str, int]]:
    """The blocks one stage runs in one step, in order: ("F", i) forward and ("B", i) backward of
    micro-batch i.

    GPipe (Huang et al. 2019 §2.3): F0 .. F(M-1), then B0 .. B(M-1). 1F1B (Narayanan et al. 2021
    §2.2.1, as torch's Schedule1F1B): min(M, P - stage) forwards, then for each micro-batch i one
    backward Bi followed by the next forward while any is left."""
    if schedule == "gpipe":
        return [(FORWARD, i) for i in range(microbatches)] + [(BACKWARD, i) for i in range(microbatches)]
    if schedule != "1f1b":
        raise UserError(f"pipeline: unknown schedule {schedule!r} (choose one of {', '.join(SCHEDULES)})")
    warmup = min(microbatches, stages - stage)
    order = [(FORWARD, i) for i in range(warmup)]
    for i in range(microbatches):
        order.append((BACKWARD, i))
        if warmup + i < microbatches:
            order.append((FORWARD, warmup + i))
    return order


def source_stage(kind: str, stage: int, stages: int) -> int | None:
    """The stage whose output a block of `stage` needs: a forward the previous stage's activation, a
    backward the next stage's gradient; None at the ends of the pipeline."""
    source = stage - 1 if kind == FORWARD else stage + 1
    return source if 0 <= source < stages else None


def block_durations(timeline: list[list[dict]]) -> list[dict[tuple[str, int], float]]:
    """Per stage: (kind, microbatch) -> how long that block ran."""
    return [{(e["kind"], e["microbatch"]): e["end_s"] - e["start_s"] for e in events} for events in timeline]


def equal_block_durations(timeline: list[list[dict]]) -> list[dict[tuple[str, int], float]]:
    """Per stage: every forward the median measured forward, every backward the median measured
    backward (over all stages): the equal blocks the bubble formula assumes, so that replayed with
    free hand-overs they give the theory's schedule (its bubble (P-1)/(M+P-1) when F = B)."""
    import statistics

    medians = {kind: statistics.median([e["end_s"] - e["start_s"] for events in timeline for e in events
                                        if e["kind"] == kind] or [0.0]) for kind in (FORWARD, BACKWARD)}
    return [{(e["kind"], e["microbatch"]): medians[e["kind"]] for e in events} for events in timeline]


def replay_timeline(schedule: str, durations: list[dict[tuple[str, int], float]]) -> list[list[dict]]:
    """The timeline `schedule` gives with these block durations and free, instant hand-overs: each
    stage runs its `schedule_order` and starts a block as soon as the stage is free and the block's
    input exists (the neighbour's block, and for a backward the stage's own forward). Set beside the
    measured timeline, it separates the bubble the schedule makes from the time communication adds.
    ValueError if the stages' orders wait on each other (a deadlocked schedule)."""
    stages = len(durations)
    microbatches = len(durations[0]) // 2 if durations else 0
    orders = [schedule_order(schedule, stages=stages, stage=s, microbatches=microbatches) for s in range(stages)]
    ends: dict[tuple[int, str, int], float] = {}
    timeline: list[list[dict]] = [[] for _ in range(stages)]
    position, free = [0] * stages, [0.0] * stages
    while any(position[s] < len(orders[s]) for s in range(stages)):
        progressed = False
        for stage in range(stages):
            if position[stage] == len(orders[stage]):
                continue
            kind, microbatch = orders[stage][position[stage]]
            source = source_stage(kind, stage, stages)
            needs = [] if source is None else [(source, kind, microbatch)]
            needs += [(stage, FORWARD, microbatch)] if kind == BACKWARD else []
            if not all(need in ends for need in needs):
                continue
            start = max([free[stage]] + [ends[need] for need in needs])
            free[stage] = ends[(stage, kind, microbatch)] = start + durations[stage][(kind, microbatch)]
            timeline[stage].append({"kind": kind, "microbatch": microbatch, "start_s": start, "end_s": free[stage]})
            position[stage] += 1
            progressed = True
        if not progressed:
            raise ValueError(f"the {schedule} orders wait on each other at positions {position}")
    return timeline


Data = TypeVar("Data")
"""What a block hands to the next stage (a torch tensor in the lab; anything in the tests)."""


class Links(Protocol[Data]):
    """A stage's point-to-point links to its neighbours for one step."""

    def post_receives(self) -> None:
        """Post every receive the step will need (before the step's time origin)."""

    def receive(self, kind: str, microbatch: int) -> Data | None:
        """Wait for the input of block (kind, microbatch); None when no stage sends it."""

    def send(self, kind: str, microbatch: int, output: Data) -> None:
        """Start sending a block's output to the stage that needs it (no-op at the pipeline's ends)."""

    def finish(self) -> None:
        """Wait until every send of the step has completed."""


def run_step(order: list[tuple[str, int]], links: Links[Data], compute: Callable[[str, int, Data | None], Data],
             start: Callable[[], float], clock: Callable[[], float]) -> dict[str, Any]:
    """One step of one stage: receives posted, time origin taken (`start`, a barrier), then each
    block of `order` in turn: wait for its input, compute (timed), start sending its output. The
    step ends when every send has completed.

    Returns the blocks ("events": kind, microbatch, start_s, end_s), the receive waits ("receives":
    kind, microbatch, wait_s = when the stage began to wait, received_s = when the data was there)
    and end_s, all in seconds from the time origin."""
    links.post_receives()
    t0 = start()
    events: list[dict[str, Any]] = []
    receives: list[dict[str, Any]] = []
    for kind, microbatch in order:
        waited = clock() - t0
        received = links.receive(kind, microbatch)
        begin = clock() - t0
        if received is not None:
            receives.append({"kind": kind, "microbatch": microbatch, "wait_s": waited, "received_s": begin})
        output = compute(kind, microbatch, received)
        end = clock() - t0
        events.append({"kind": kind, "microbatch": microbatch, "start_s": begin, "end_s": end})
        links.send(kind, microbatch, output)
    links.finish()
    return {"events": events, "receives": receives, "end_s": clock() - t0}


def transfers(timeline: list[list[dict]], receives: list[list[dict]]) -> list[dict]:
    """Every hand-over between stages in one step: the sender's block end (`sent_s`: the send is
    posted right after it), when the receiver began to wait (`wait_s`), when the data was there
    (`received_s`), and `delay_s` = received_s - max(sent_s, wait_s), the time the hand-over itself
    cost (0 would be a free wire)."""
    stages = len(timeline)
    ends = [{(e["kind"], e["microbatch"]): e["end_s"] for e in events} for events in timeline]
    found = []
    for stage, waits in enumerate(receives):
        for wait in waits:
            source = source_stage(wait["kind"], stage, stages)
            if source is None:
                continue
            sent = ends[source][(wait["kind"], wait["microbatch"])]
            found.append({"kind": wait["kind"], "microbatch": wait["microbatch"], "from_stage": source,
                          "to_stage": stage, "sent_s": sent, "wait_s": wait["wait_s"],
                          "received_s": wait["received_s"],
                          "delay_s": wait["received_s"] - max(sent, wait["wait_s"])})
    return sorted(found, key=lambda t: t["received_s"])


# ---------------------------------------------------------------- inside each rank (imports torch)


def _stage_module(hidden: int, layers: int):
    """`layers` residual MLP blocks (Linear h->4h, GELU, Linear 4h->h): one stage's share of the model."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.up, self.down = nn.Linear(hidden, FFN_MULTIPLIER * hidden), nn.Linear(FFN_MULTIPLIER * hidden, hidden)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(x)))

    return nn.Sequential(*(Block() for _ in range(layers)))


def _saved_bytes_hooks(module, counter: dict):
    """saved_tensors_hooks that add the bytes autograd saves (weights and repeats excluded) to counter["bytes"]."""
    import torch

    weights = {p.untyped_storage().data_ptr() for p in module.parameters()}
    seen: set[tuple[int, int]] = set()

    def pack(tensor):
        key = (tensor.data_ptr(), tensor.numel())
        if tensor.untyped_storage().data_ptr() not in weights and key not in seen:
            seen.add(key)
            counter["bytes"] += tensor.numel() * tensor.element_size()
        return tensor

    return torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)


class _GlooLinks:
    """Links over torch.distributed isend/irecv with every receive posted before the step (see the
    module docstring). One receive buffer per micro-batch and direction; a tag per micro-batch and
    direction, so each receive matches exactly one send."""

    def __init__(self, *, stage: int, stages: int, microbatches: int, shape: tuple[int, ...], device) -> None:
        import torch

        self.stage, self.stages, self.microbatches = stage, stages, microbatches
        self.buffers = {(kind, i): torch.empty(shape, device=device)
                        for kind in (FORWARD, BACKWARD) if source_stage(kind, stage, stages) is not None
                        for i in range(microbatches)}
        self.pending: dict[tuple[str, int], Any] = {}
        self.sends: list[Any] = []

    def _tag(self, kind: str, microbatch: int) -> int:
        return microbatch if kind == FORWARD else self.microbatches + microbatch

    def post_receives(self) -> None:
        import torch.distributed as dist

        for (kind, i), buffer in self.buffers.items():
            self.pending[(kind, i)] = dist.irecv(buffer, src=source_stage(kind, self.stage, self.stages),
                                                 tag=self._tag(kind, i))

    def receive(self, kind: str, microbatch: int):
        work = self.pending.pop((kind, microbatch), None)
        if work is None:
            return None
        work.wait()
        return self.buffers[(kind, microbatch)]

    def send(self, kind: str, microbatch: int, output) -> None:
        import torch.distributed as dist

        target = self.stage + 1 if kind == FORWARD else self.stage - 1
        if output is not None and 0 <= target < self.stages:
            self.sends.append(dist.isend(output, dst=target, tag=self._tag(kind, microbatch)))

    def finish(self) -> None:
        for work in self.sends:
            work.wait()
        self.sends.clear()


class _StageCompute:
    """One stage's blocks: forward of a micro-batch (the last stage's includes its loss, scaled by
    1/M as torch's schedules scale the gradients) and backward; the bytes autograd saves per forward."""

    def __init__(self, module, *, first: bool, last: bool, inputs, targets, microbatches: int) -> None:
        self.module, self.first, self.last = module, first, last
        self.inputs, self.targets, self.microbatches = inputs, targets, microbatches
        self.reset()

    def reset(self) -> None:
        self.saved: dict[int, tuple[Any, Any]] = {}
        self.saved_bytes: dict[int, int] = {}
        self.losses: list = []

    def __call__(self, kind: str, microbatch: int, received):
        import torch

        if kind == FORWARD:
            source = self.inputs[microbatch] if self.first else received
            x = source.detach().requires_grad_(True)
            counter = {"bytes": 0}
            with _saved_bytes_hooks(self.module, counter):
                y = self.module(x)
                if self.last:
                    y = torch.nn.functional.mse_loss(y, self.targets[microbatch]) / self.microbatches
            self.saved[microbatch], self.saved_bytes[microbatch] = (x, y), counter["bytes"]
            if self.last:
                self.losses.append(y.detach() * self.microbatches)
                return None
            return y.detach()
        x, y = self.saved.pop(microbatch)
        y.backward(None if self.last else received)
        return x.grad


def _timed_stage_class():
    """A torch PipelineStage (GPU path) that records when each micro-batch's forward and backward
    ran, and the bytes autograd saves for each forward."""
    import time

    import torch
    from torch.distributed.pipelining import PipelineStage

    class TimedStage(PipelineStage):
        def start_step(self, t0: float) -> None:
            self.t0 = t0
            self.events: list[dict[str, Any]] = []
            self.saved_bytes: dict[int, int] = {}

        def _now(self) -> float:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return time.perf_counter() - self.t0

        def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
            counter = {"bytes": 0}
            start = self._now()
            with _saved_bytes_hooks(self.submod, counter):
                output = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
            self.events.append({"kind": FORWARD, "microbatch": fwd_chunk_id, "start_s": start, "end_s": self._now()})
            self.saved_bytes[fwd_chunk_id] = counter["bytes"]
            return output

        def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
            start = self._now()
            result = super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)
            self.events.append({"kind": BACKWARD, "microbatch": bwd_chunk_id, "start_s": start, "end_s": self._now()})
            return result

    return TimedStage


def _one_clock() -> bool:
    """Whether every rank reads the same monotonic clock: one host, one boot (perf_counter is
    CLOCK_MONOTONIC on Linux, shared by all processes of a machine)."""
    import socket

    import torch.distributed as dist

    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as handle:
            boot = handle.read().strip()
    except OSError:
        boot = ""
    mine = (socket.gethostname(), boot)
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return bool(boot) and all(other == mine for other in everyone)


def _common_t0(shared_clock: bool, device: str) -> float:
    """The step's time origin, after a barrier. On one host: rank 0's clock reading, broadcast, so
    that every rank's blocks sit on one time axis exactly; across hosts each rank's own reading after
    the barrier (aligned to within the barrier's release skew)."""
    import time

    import torch
    import torch.distributed as dist

    dist.barrier()
    if not shared_clock:
        return time.perf_counter()
    t0 = torch.tensor([time.perf_counter()], dtype=torch.float64, device=device)
    dist.broadcast(t0, src=0)
    return float(t0.item())


def _run_queue_wait_s() -> float | None:
    """Seconds this thread has spent runnable but waiting for a CPU core (the second field of Linux's
    /proc/thread-self/schedstat, in ns; Documentation/scheduler/sched-stats.rst); None elsewhere."""
    try:
        with open("/proc/thread-self/schedstat", encoding="ascii") as handle:
            return int(handle.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _core_wait_since(before: float | None) -> float | None:
    after = _run_queue_wait_s()
    return None if before is None or after is None else after - before


def _torch_schedule_steps(ctx, params: dict, module, inputs, targets, optimizer, shared_clock: bool):
    """GPU ranks: torch's ScheduleGPipe / Schedule1F1B on a TimedStage, one record per step."""
    import time

    import torch
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    stage = _timed_stage_class()(module, ctx.rank, ctx.world, torch.device(ctx.device))
    stage.start_step(time.perf_counter())
    schedule_class = ScheduleGPipe if params["schedule"] == "gpipe" else Schedule1F1B
    schedule = schedule_class(stage, params["microbatches"], loss_fn=torch.nn.functional.mse_loss)
    first, last = ctx.rank == 0, ctx.rank == ctx.world - 1
    whole_inputs, whole_targets = torch.cat(inputs), torch.cat(targets)
    for step in range(params["steps"]):
        if ctx.cancelled():
            return
        optimizer.zero_grad()
        losses: list = []
        stage.start_step(_common_t0(shared_clock, ctx.device))
        core_wait = _run_queue_wait_s()
        if first:
            schedule.step(whole_inputs.detach().requires_grad_(True))
        elif last:
            schedule.step(target=whole_targets, losses=losses)
        else:
            schedule.step()
        end = stage._now()
        core_wait = _core_wait_since(core_wait)
        optimizer.step()
        yield {"events": list(stage.events), "receives": [], "end_s": end, "saved_bytes": dict(stage.saved_bytes),
               "loss": float(torch.stack(losses).detach().mean()) if losses else None, "core_wait_s": core_wait}


def _own_schedule_steps(ctx, params: dict, module, inputs, targets, optimizer, shared_clock: bool):
    """CPU (gloo) ranks: `schedule_order` run by `run_step` over _GlooLinks, one record per step."""
    import time

    import torch

    microbatches = params["microbatches"]
    first, last = ctx.rank == 0, ctx.rank == ctx.world - 1
    compute = _StageCompute(module, first=first, last=last, inputs=inputs, targets=targets, microbatches=microbatches)
    links = _GlooLinks(stage=ctx.rank, stages=ctx.world, microbatches=microbatches, shape=tuple(inputs[0].shape),
                       device=torch.device(ctx.device))
    order = schedule_order(params["schedule"], stages=ctx.world, stage=ctx.rank, microbatches=microbatches)
    for _step in range(params["steps"]):
        if ctx.cancelled():
            return
        optimizer.zero_grad()
        compute.reset()
        core_wait: list[float | None] = []

        def start() -> float:
            t0 = _common_t0(shared_clock, ctx.device)
            core_wait.append(_run_queue_wait_s())
            return t0

        record = run_step(order, links, compute, start=start, clock=time.perf_counter)
        record["core_wait_s"] = _core_wait_since(core_wait[0])
        optimizer.step()
        record["saved_bytes"] = dict(compute.saved_bytes)
        record["loss"] = float(torch.stack(compute.losses).mean()) if compute.losses else None
        yield record


def pipeline_rank(ctx, params: dict) -> dict:
    """Rank function (tutor.bench.ranks): this rank's stage trained for `steps` steps; per step its
    forward/backward blocks and receive waits (seconds from the common t0) and the step's end."""
    import torch

    hidden, tokens, microbatches = params["hidden"], params["microbatch_tokens"], params["microbatches"]
    device = torch.device(ctx.device)
    torch.manual_seed(params["seed"] + ctx.rank)
    module = _stage_module(hidden, params["layers_per_stage"]).to(device)
    optimizer = torch.optim.SGD(module.parameters(), lr=LEARNING_RATE)
    generator = torch.Generator().manual_seed(params["seed"])
    inputs = list(torch.randn(microbatches, tokens, hidden, generator=generator).to(device).unbind(0))
    targets = list(torch.randn(microbatches, tokens, hidden, generator=generator).to(device).unbind(0))
    shared_clock = _one_clock()
    # params["torch_schedules"] (not a lab parameter) lets tests run torch's schedules on CPU ranks.
    run = _torch_schedule_steps if params.get("torch_schedules", ctx.backend == "nccl") else _own_schedule_steps
    steps: list[dict[str, Any]] = []
    for record in run(ctx, params, module, inputs, targets, optimizer, shared_clock):
        steps.append(record)
        ctx.progress(len(steps) / params["steps"], f"step {len(steps)} of {params['steps']}")
    return {"rank": ctx.rank, "device": ctx.device, "steps": steps}


# ---------------------------------------------------------------- in the calling process (no torch)


def step_time(timeline: list[list[dict]], ends: list[float]) -> float:
    """T: from the common t0 to the moment the last rank's schedule returned (or its last block ended)."""
    last_block = max((event["end_s"] for events in timeline for event in events), default=0.0)
    return max([last_block, *ends])


def measured_bubble_fraction(timeline: list[list[dict]], step_s: float) -> float:
    """Idle share of P stages x T: 1 - (sum of every forward and backward block) / (P x T)."""
    if step_s <= 0 or not timeline:
        raise ValueError("a pipeline step needs a positive duration and at least one stage")
    busy = sum(event["end_s"] - event["start_s"] for events in timeline for event in events)
    return 1.0 - busy / (len(timeline) * step_s)


def peak_in_flight(events: list[dict]) -> int:
    """The most micro-batches a stage held at once: forwards finished whose backward had not."""
    held, peak = set(), 0
    for event in sorted(events, key=lambda e: (e["end_s"], e["kind"] == "F")):
        if event["kind"] == "F":
            held.add(event["microbatch"])
            peak = max(peak, len(held))
        else:
            held.discard(event["microbatch"])
    return peak


def transfer_delay_summary(handovers: list[dict]) -> dict | None:
    """Median and largest hand-over delay of one step (see `transfers`); None without hand-overs
    (GPU ranks, whose receives torch's schedules post)."""
    delays = sorted(t["delay_s"] for t in handovers)
    if not delays:
        return None
    middle = len(delays) // 2
    median = delays[middle] if len(delays) % 2 else (delays[middle - 1] + delays[middle]) / 2
    return {"median": median, "max": delays[-1], "count": len(delays)}


def _check(params: dict) -> None:
    if params["schedule"] == "1f1b" and params["microbatches"] < params["stages"]:
        raise UserError(f"pipeline: 1f1b needs at least as many micro-batches as stages "
                        f"(got microbatches={params['microbatches']}, stages={params['stages']}); "
                        f"raise microbatches or use schedule=gpipe")
    if params["steps"] < 2:
        raise UserError("pipeline: steps must be at least 2 (the first one warms up and is not counted)")


def _stage_memory_bytes(params: dict) -> int:
    """One stage's working set, fp32: weights, gradients and the SGD step's copy of them; inputs and
    targets of every micro-batch, and the receive buffers (one per micro-batch and direction); and
    the activations of every micro-batch in flight (GPipe holds all M), each block saving its input,
    its 4h-wide pre-activation and the GELU of it per token."""
    hidden, layers, tokens, microbatches = (params["hidden"], params["layers_per_stage"], params["microbatch_tokens"],
                                            params["microbatches"])
    weights = layers * (2 * FFN_MULTIPLIER * hidden * hidden + (FFN_MULTIPLIER + 1) * hidden)
    data = 4 * microbatches * tokens * hidden  # inputs, targets, and a receive buffer per micro-batch each way
    activations = microbatches * tokens * hidden * (1 + 2 * FFN_MULTIPLIER) * layers
    return 4 * (3 * weights + data + activations)


def _stage_flops(params: dict) -> float:
    """Forward + backward of one stage for the whole run: 6 x weights x tokens (Kaplan et al. 2020, §2.1)."""
    hidden, layers = params["hidden"], params["layers_per_stage"]
    weights = layers * 2 * FFN_MULTIPLIER * hidden * hidden
    return 6.0 * weights * params["microbatch_tokens"] * params["microbatches"] * params["steps"]


def _check_machine(params: dict) -> int:
    """UserError when one stage would not fit a lab's share of this machine; its bytes otherwise."""
    from tutor.labs.limits import check_lab_fits
    from tutor.bench.ranks import DEFAULT_MEMORY_PER_RANK

    stage_bytes = _stage_memory_bytes(params)
    check_lab_fits("pipeline", memory_bytes=params["stages"] * (stage_bytes + DEFAULT_MEMORY_PER_RANK),
                   memory_what=f"{params['stages']} stages, each its weights and the activations of "
                               f"{params['microbatches']} micro-batches of {params['microbatch_tokens']} tokens",
                   fix="lower microbatch_tokens, microbatches, hidden or layers_per_stage",
                   flops=_stage_flops(params))
    return stage_bytes


def _pipeline(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.bench.ranks import DEFAULT_MEMORY_PER_RANK, run_lab_ranks
    from tutor.theory.parallel import pipeline_bubble_fraction, pipeline_microbatches_in_flight

    _check(params)
    if cancel.is_set():
        return ProbeResult("pipeline", (), {}, "cancelled before the ranks started", True, "cpu")
    stage_bytes = _check_machine(params)
    results = run_lab_ranks("pipeline", pipeline_rank, dict(params), ranks=params["stages"], timeout_s=TIMEOUT_S,
                            progress=progress, cancel=cancel, memory_per_rank_bytes=DEFAULT_MEMORY_PER_RANK + stage_bytes)
    if results is None:
        return ProbeResult("pipeline", (), {}, "cancelled", True, "cpu")
    stages, microbatches, schedule = len(results), params["microbatches"], params["schedule"]
    counted = range(1, min(len(r["steps"]) for r in results))  # step 0 warms up
    if not counted:
        return ProbeResult("pipeline", (), {}, "cancelled before a step was measured", True, "cpu")
    per_step = []
    for index in counted:
        timeline = [r["steps"][index]["events"] for r in results]
        span = step_time(timeline, [r["steps"][index]["end_s"] for r in results])
        per_step.append((measured_bubble_fraction(timeline, span), index, span))
    bubble, chosen, span = sorted(per_step)[len(per_step) // 2]
    timeline = [sorted(r["steps"][chosen]["events"], key=lambda e: e["start_s"]) for r in results]
    theory = float(pipeline_bubble_fraction(stages=stages, microbatches=microbatches))
    in_flight = []
    for stage, result in enumerate(results):
        saved = result["steps"][chosen]["saved_bytes"]
        per_microbatch = max(saved.values()) if saved else 0
        held = peak_in_flight(timeline[stage])
        in_flight.append({"stage": stage, "measured": held,
                          "theory": pipeline_microbatches_in_flight(schedule=schedule, stages=stages, stage=stage,
                                                                    microbatches=microbatches),
                          "activation_bytes_per_microbatch": per_microbatch,
                          "peak_activation_bytes": held * per_microbatch})
    losses = [step["loss"] for step in results[-1]["steps"] if step["loss"] is not None]
    handovers = transfers(timeline, [r["steps"][chosen].get("receives", []) for r in results])
    replayed = replay_timeline(schedule, block_durations(timeline))
    free_handovers = measured_bubble_fraction(replayed, step_time(replayed, [0.0] * stages))
    schedule_of_theory = replay_timeline(schedule, equal_block_durations(timeline))
    core_waits = [r["steps"][chosen].get("core_wait_s") for r in results]
    core_wait_share = None if None in core_waits else sum(core_waits) / (stages * span)
    details = {"bubble_fraction": {"measured": bubble, "theory": theory},
               "schedule": schedule, "stages": stages, "microbatches": microbatches,
               "step_s": span, "timeline": timeline, "transfers": handovers,
               "transfer_delay_s": transfer_delay_summary(handovers),
               "bubble_per_step": [round(fraction, 6) for fraction, _i, _s in per_step],
               "bubble_with_free_handovers": free_handovers,
               "in_flight": in_flight, "losses": losses, "core_wait_share": core_wait_share,
               "theory_timeline": schedule_of_theory,
               "theory_step_s": step_time(schedule_of_theory, [0.0] * stages),
               "theory_schedule_bubble": measured_bubble_fraction(
                   schedule_of_theory, step_time(schedule_of_theory, [0.0] * stages))}
    metrics = {"bubble_measured": bubble, "bubble_theory": theory, "bubble_over_theory": bubble / theory if theory else 0.0,
               "step_s": span, "peak_in_flight_first_stage": float(in_flight[0]["measured"])}
    progress(1.0, "done")
    return ProbeResult("pipeline", tuple(_rows(details)), metrics, _summary(details), False,
                       results[0].get("device", "cpu"), details)


def _rows(details: dict) -> list[Measurement]:
    stages, microbatches = details["stages"], details["microbatches"]
    spread = details["bubble_per_step"]
    rows = [Measurement("bubble: idle share of the step", details["bubble_fraction"]["measured"], "",
                        theory=details["bubble_fraction"]["theory"],
                        theory_source=f"(P-1)/(M+P-1) with P={stages}, M={microbatches} (GPipe §2.3)",
                        note=f"median of {len(spread)} steps; idle includes send/recv waits"),
            Measurement("step time", details["step_s"], "s", note=f"{details['schedule']}, {stages} stages")]
    if details.get("bubble_with_free_handovers") is not None:
        rows.append(Measurement("bubble if hand-overs were free", details["bubble_with_free_handovers"], "",
                                theory=details["bubble_fraction"]["theory"],
                                theory_source="the formula assumes equal blocks",
                                note="the measured blocks replayed through the schedule; the measured bubble's "
                                     "rest is hand-overs and waiting"))
    delay = details.get("transfer_delay_s")
    if delay:
        from tutor.formatting import format_duration

        rows.append(Measurement("hand-over to the next stage, median", delay["median"], "s",
                                note=f"longest {format_duration(delay['max'])} of {delay['count']}; block end (or wait "
                                     f"start) to arrival"))
    if details.get("core_wait_share") is not None:
        rows.append(Measurement("waiting for a free CPU core: share of the step", details["core_wait_share"], "",
                                note="stages ready to run while other programs held the cores (Linux schedstat); "
                                     "a quiet machine shows about 0"))
    for entry in details["in_flight"]:
        rows.append(Measurement(f"stage {entry['stage']}: micro-batches in flight at most", float(entry["measured"]), "",
                                theory=float(entry["theory"]),
                                theory_source="GPipe: M; 1F1B: P - stage (Narayanan et al. 2021 §2.2.1)"))
        rows.append(Measurement(f"stage {entry['stage']}: activations held at the peak",
                                float(entry["peak_activation_bytes"]), "B",
                                note="bytes autograd saves per micro-batch x micro-batches in flight"))
    return rows


def _summary(details: dict) -> str:
    from tutor.formatting import format_duration, format_percent

    bubble = details["bubble_fraction"]
    return (f"{details['schedule']}, {details['stages']} stages, {details['microbatches']} micro-batches: "
            f"bubble {format_percent(bubble['measured'])} measured, {format_percent(bubble['theory'])} in theory; "
            f"step {format_duration(details['step_s'])}")


def render_pipeline(result: ProbeResult):
    """The per-stage timeline of the reported step and, beside it on the same time scale, the
    theory's schedule (equal blocks, free hand-overs), each with its table (tutor.answers.pictures; no torch)."""
    from rich.text import Text

    from tutor.formatting import format_duration, format_percent
    from tutor.answers.pictures import lanes_with_table, pipeline_lanes

    details = result.details
    step_s = details.get("step_s") or 0.0
    timeline = details.get("timeline") or []
    if step_s <= 0 or not timeline:
        return Text("no timeline")
    theory = details.get("theory_timeline") or []
    theory_s = details.get("theory_step_s") or 0.0
    length = max(step_s, theory_s)
    bubble = details["bubble_fraction"]
    head = f"{details['schedule']}, {details['stages']} stages x {details['microbatches']} micro-batches"
    pictures = [pipeline_lanes(timeline, length=length, step=step_s, title=(
        f"measured: {head}, one step of {format_duration(step_s)}; bubble {format_percent(bubble['measured'])}"))]
    if theory and theory_s > 0:
        pictures.append(pipeline_lanes(theory, length=length, step=theory_s, title=(
            f"theory's schedule: the same blocks at their median length, hand-overs free, "
            f"{format_duration(theory_s)}; bubble {format_percent(details.get('theory_schedule_bubble'))} "
            f"(P-1)/(M+P-1) {format_percent(bubble['theory'])}")))
    return lanes_with_table(*pictures)


PIPELINE = make_probe(
    name="pipeline",
    title="Pipeline parallelism for real",
    description="Splits a small model into stages on local ranks, trains it with the GPipe or 1F1B schedule, "
                "times every micro-batch's forward, backward and hand-over between stages, and sets the measured "
                "bubble beside (P-1)/(M+P-1).",
    needs_torch=True,
    params=(
        Param("stages", "int", 2, "pipeline stages, one local process each", minimum=2, maximum=16),
        Param("microbatches", "int", 4, "micro-batches per step", minimum=1, maximum=64),
        Param("schedule", "str", "gpipe", "gpipe: every forward, then every backward; 1f1b: one forward, "
              "one backward", choices=SCHEDULES),
        Param("hidden", "int", 256, "hidden size", minimum=8, maximum=1024),
        Param("layers_per_stage", "int", 2, "MLP blocks on each stage", minimum=1, maximum=8),
        Param("microbatch_tokens", "int", 1024, "rows (tokens) per micro-batch; more makes each block longer "
              "against the send/recv", minimum=1, maximum=8192),
        Param("steps", "int", 4, "training steps; the first warms up and is not counted", minimum=2, maximum=50),
        Param("seed", "int", 0, "random seed", minimum=0, maximum=2**31 - 1),
    ),
    metrics=("bubble_measured", "bubble_theory", "bubble_over_theory", "step_s", "peak_in_flight_first_stage"),
    body=_pipeline,
    render=render_pipeline,
)
