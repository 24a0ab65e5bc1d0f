"""pipeline: a small MLP stack split into P stages on P local ranks, trained with GPipe or 1F1B.

The schedules are torch's own (torch.distributed.pipelining: PipelineStage, ScheduleGPipe,
Schedule1F1B). Each rank's stage is a PipelineStage whose forward_one_chunk and backward_one_chunk,
the per-micro-batch compute the schedule calls, are timed; the send/recv between them is the
schedule's and lies outside the timed blocks. Time origin: after a barrier, rank 0's reading of the
monotonic clock, which every process on one host shares (across hosts: each rank's own reading after
the barrier, aligned to the barrier's release skew). The first stage's input needs its gradient too, as the output of an embedding would:
every stage then does the same work, which is what the bubble formula assumes.

Measured bubble, per step: T = the step time, from t0 to the moment the last rank's schedule returns;
busy(s) = the summed durations of stage s's forward and backward blocks;

    bubble = sum over stages of (T - busy(s)) / (P x T)

Everything outside the blocks counts as idle: pipeline fill and drain, and also the time spent
waiting on point-to-point sends and receives and the last stage's loss. On a machine whose cores are
shared with other work, descheduled time inflates both. The first step (warm-up: shape inference,
allocation) is not counted; of the others, the step with the median bubble is reported, with its
timeline. Beside it: tutor.theory.parallel.pipeline_bubble_fraction, (P-1)/(M+P-1).

Activations in flight: for each stage, the most micro-batches whose forward has finished and whose
backward has not, read off the timeline, against pipeline_microbatches_in_flight (GPipe: M; 1F1B:
P - stage). The bytes autograd saves for one micro-batch (saved_tensors_hooks, weights excluded)
times that count give the stage's peak activation bytes.
"""

from __future__ import annotations

import threading
from typing import Any

from tutor.errors import UserError
from tutor.labs import Measurement, ProbeResult, ProgressFn
from tutor.labs._params import Param, make_probe

SCHEDULES = ("gpipe", "1f1b")
TIMEOUT_S = 300.0
FFN_MULTIPLIER = 4
LEARNING_RATE = 1e-3


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


def _timed_stage_class():
    """A PipelineStage that records when each micro-batch's forward and backward ran, and the bytes
    autograd saves for each forward (the activations the stage holds until that backward)."""
    import time

    import torch
    from torch.distributed.pipelining import PipelineStage

    class TimedStage(PipelineStage):
        def start_step(self, t0: float) -> None:
            self.t0, self.events, self.saved_bytes = t0, [], {}

        def _now(self) -> float:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            return time.perf_counter() - self.t0

        def forward_one_chunk(self, fwd_chunk_id, *args, **kwargs):
            weights = {p.untyped_storage().data_ptr() for p in self.submod.parameters()}
            seen: set[tuple[int, int]] = set()
            saved = 0

            def pack(tensor):
                nonlocal saved
                key = (tensor.data_ptr(), tensor.numel())
                if tensor.untyped_storage().data_ptr() not in weights and key not in seen:
                    seen.add(key)
                    saved += tensor.numel() * tensor.element_size()
                return tensor

            start = self._now()
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
                output = super().forward_one_chunk(fwd_chunk_id, *args, **kwargs)
            self.events.append({"kind": "F", "microbatch": fwd_chunk_id, "start_s": start, "end_s": self._now()})
            self.saved_bytes[fwd_chunk_id] = saved
            return output

        def backward_one_chunk(self, bwd_chunk_id, *args, **kwargs):
            start = self._now()
            result = super().backward_one_chunk(bwd_chunk_id, *args, **kwargs)
            self.events.append({"kind": "B", "microbatch": bwd_chunk_id, "start_s": start, "end_s": self._now()})
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


def pipeline_rank(ctx, params: dict) -> dict:
    """Rank function (tutor.labs.ranks): this rank's stage trained for `steps` steps; per step its
    forward/backward blocks (seconds from the common t0) and the schedule's end."""
    import time

    import torch
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe

    hidden, tokens, microbatches = params["hidden"], params["microbatch_tokens"], params["microbatches"]
    device = torch.device(ctx.device)
    torch.manual_seed(params["seed"] + ctx.rank)
    module = _stage_module(hidden, params["layers_per_stage"]).to(device)
    stage = _timed_stage_class()(module, ctx.rank, ctx.world, device)
    stage.start_step(time.perf_counter())
    schedule_class = ScheduleGPipe if params["schedule"] == "gpipe" else Schedule1F1B
    schedule = schedule_class(stage, microbatches, loss_fn=torch.nn.functional.mse_loss)
    optimizer = torch.optim.SGD(module.parameters(), lr=LEARNING_RATE)
    first, last = ctx.rank == 0, ctx.rank == ctx.world - 1
    generator = torch.Generator().manual_seed(params["seed"])
    inputs = torch.randn(microbatches * tokens, hidden, generator=generator).to(device).requires_grad_(True)
    targets = torch.randn(microbatches * tokens, hidden, generator=generator).to(device)
    shared_clock = _one_clock()
    steps: list[dict[str, Any]] = []
    for step in range(params["steps"]):
        if ctx.cancelled():
            break
        optimizer.zero_grad()
        inputs.grad = None
        losses: list = []
        stage.start_step(_common_t0(shared_clock, ctx.device))
        if first:
            schedule.step(inputs)
        elif last:
            schedule.step(target=targets, losses=losses)
        else:
            schedule.step()
        end = stage._now()
        optimizer.step()
        steps.append({"events": list(stage.events), "end_s": end, "saved_bytes": dict(stage.saved_bytes),
                      "loss": float(torch.stack(losses).detach().mean()) if losses else None})
        ctx.progress((step + 1) / params["steps"], f"step {step + 1} of {params['steps']}")
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


def _check(params: dict) -> None:
    if params["schedule"] == "1f1b" and params["microbatches"] < params["stages"]:
        raise UserError(f"pipeline: 1f1b needs at least as many micro-batches as stages "
                        f"(got microbatches={params['microbatches']}, stages={params['stages']}); "
                        f"raise microbatches or use schedule=gpipe")
    if params["steps"] < 2:
        raise UserError("pipeline: steps must be at least 2 (the first one warms up and is not counted)")


def _stage_memory_bytes(params: dict) -> int:
    """One stage's working set, fp32: weights, gradients and the SGD step's copy of them; inputs and
    targets of every micro-batch; and the activations of every micro-batch in flight (GPipe holds all M),
    each block saving its input, its 4h-wide pre-activation and the GELU of it per token."""
    hidden, layers, tokens, microbatches = (params["hidden"], params["layers_per_stage"], params["microbatch_tokens"],
                                            params["microbatches"])
    weights = layers * (2 * FFN_MULTIPLIER * hidden * hidden + (FFN_MULTIPLIER + 1) * hidden)
    data = 2 * microbatches * tokens * hidden
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
    from tutor.labs.ranks import DEFAULT_MEMORY_PER_RANK

    stage_bytes = _stage_memory_bytes(params)
    check_lab_fits("pipeline", memory_bytes=params["stages"] * (stage_bytes + DEFAULT_MEMORY_PER_RANK),
                   memory_what=f"{params['stages']} stages, each its weights and the activations of "
                               f"{params['microbatches']} micro-batches of {params['microbatch_tokens']} tokens",
                   fix="lower microbatch_tokens, microbatches, hidden or layers_per_stage",
                   flops=_stage_flops(params))
    return stage_bytes


def _pipeline(params: dict, progress: ProgressFn, cancel: threading.Event) -> ProbeResult:
    from tutor.labs.ranks import DEFAULT_MEMORY_PER_RANK, RanksCancelled, run_ranks
    from tutor.theory.parallel import pipeline_bubble_fraction, pipeline_microbatches_in_flight

    _check(params)
    if cancel.is_set():
        return ProbeResult("pipeline", (), {}, "cancelled before the ranks started", True, "cpu")
    stage_bytes = _check_machine(params)
    progress(0.0, f"starting {params['stages']} ranks")
    try:
        results = run_ranks(pipeline_rank, dict(params), ranks=params["stages"], timeout_s=TIMEOUT_S,
                            progress=progress, cancel=cancel, name="pipeline",
                            memory_per_rank_bytes=DEFAULT_MEMORY_PER_RANK + stage_bytes)
    except RanksCancelled:
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
    details = {"bubble_fraction": {"measured": bubble, "theory": theory},
               "schedule": schedule, "stages": stages, "microbatches": microbatches,
               "step_s": span, "timeline": timeline,
               "bubble_per_step": [round(fraction, 6) for fraction, _i, _s in per_step],
               "in_flight": in_flight, "losses": losses}
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


class PipelineTimeline:
    """The timeline as terminal art: one row per stage, forward (F) and backward (B) blocks labelled
    by micro-batch ("F3───" is micro-batch 3's forward), idle time as dots, scaled to the width Rich
    gives it."""

    LABEL_WIDTH = 9  # "stage 12 "

    def __init__(self, details: dict) -> None:
        self.details = details

    def _row(self, events: list[dict], width: int, step_s: float):
        from rich.text import Text

        cells: list[tuple[str, str]] = [("·", "dim")] * width
        for event in events:
            first = min(width - 1, round(event["start_s"] / step_s * width))
            last = max(first + 1, min(width, round(event["end_s"] / step_s * width)))
            # The label opens the block, so block edges stay visible without colour.
            label = f"{event['kind']}{event['microbatch']}"[: last - first]
            text = label + "─" * (last - first - len(label))
            style = "bold black on cyan" if event["kind"] == "F" else "bold black on magenta"
            for offset, char in enumerate(text):
                cells[first + offset] = (char, style)
        line = Text()
        for char, style in cells:
            line.append(char, style)
        return line

    def __rich_console__(self, console, options):
        from rich.text import Text

        from tutor.formatting import format_duration, format_percent

        details = self.details
        step_s = details.get("step_s") or 0.0
        timeline = details.get("timeline") or []
        if step_s <= 0 or not timeline:
            yield Text("no timeline")
            return
        width = max(10, options.max_width - self.LABEL_WIDTH)
        bubble = details["bubble_fraction"]
        yield Text(f"{details['schedule']} timeline: {details['stages']} stages x {details['microbatches']} "
                   f"micro-batches, one step of {format_duration(step_s)}; bubble {format_percent(bubble['measured'])} "
                   f"(theory {format_percent(bubble['theory'])})")
        for stage, events in enumerate(timeline):
            yield Text(f"stage {stage}".ljust(self.LABEL_WIDTH)) + self._row(events, width, step_s)
        end = format_duration(step_s)
        yield Text(" " * self.LABEL_WIDTH + "0".ljust(max(1, width - len(end))) + end, style="dim")
        legend = Text(" " * self.LABEL_WIDTH)
        legend.append(" F ", "bold black on cyan")
        legend.append(" forward  ")
        legend.append(" B ", "bold black on magenta")
        legend.append(" backward  · idle (bubble, send/recv waits)")
        yield legend


def render_pipeline(result: ProbeResult):
    """The per-stage timeline of the reported step (no torch)."""
    return PipelineTimeline(result.details)


PIPELINE = make_probe(
    name="pipeline",
    title="Pipeline parallelism for real",
    description="Splits a small model into stages on local ranks, trains it with torch's GPipe or 1F1B schedule, "
                "times every micro-batch's forward and backward, and sets the measured bubble beside (P-1)/(M+P-1).",
    needs_torch=True,
    params=(
        Param("stages", "int", 2, "pipeline stages, one local process each", minimum=2, maximum=16),
        Param("microbatches", "int", 4, "micro-batches per step", minimum=1, maximum=64),
        Param("schedule", "str", "gpipe", "gpipe: every forward, then every backward; 1f1b: one forward, "
              "one backward", choices=SCHEDULES),
        Param("hidden", "int", 256, "hidden size", minimum=8, maximum=1024),
        Param("layers_per_stage", "int", 2, "MLP blocks on each stage", minimum=1, maximum=8),
        Param("microbatch_tokens", "int", 512, "rows (tokens) per micro-batch; more makes each block longer "
              "against the send/recv", minimum=1, maximum=8192),
        Param("steps", "int", 4, "training steps; the first warms up and is not counted", minimum=2, maximum=50),
        Param("seed", "int", 0, "random seed", minimum=0, maximum=2**31 - 1),
    ),
    metrics=("bubble_measured", "bubble_theory", "bubble_over_theory", "step_s", "peak_in_flight_first_stage"),
    body=_pipeline,
    render=render_pipeline,
)
