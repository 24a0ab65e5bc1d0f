"""Checked exercises: the learner's answer (bits, a schedule, a placement, a training loop) run and
judged. Each check takes the answer as text and returns a Verdict: passed or not, one line saying
why, and the figures it measured or simulated. The pure ones judge with tutor.theory; the code ones
run the learner's loop with torch on a tiny model (in the app's worker process, never the app's).

A lesson's ```exercise block names its check; `tensor-tutor lab exercise check=NAME answer=...`
runs one from the command line.
"""

from __future__ import annotations

import math
import re

from tutor.formatting import format_bytes, format_number, format_percent, format_quantity
from tutor.labs.exercise_functions import (check_capacity_drops, check_int8_absmax, check_kv_cache_function,
                                             check_ring_allreduce, check_zero_memory)
from tutor.labs.exercise_torch import (check_checkpoint_resume, check_eval_loop, check_kv_decode, check_master_weights,
                                         check_moe_dispatch)
from tutor.labs.exercise_serving import check_continuous_batching, check_paged_blocks
from tutor.labs.exercise_types import Check, Verdict
from tutor.labs.learner_code import Refused, call, compile_answer, learner_function, run_code


# ---- precision: round FP32 to BF16 in integer arithmetic ---------------------------------------------

def _bf16_cases() -> tuple[int, ...]:
    """FP32 bit patterns the bf16-rounding check feeds the learner's function: 0.1, the ties on both
    sides of even (normal and subnormal), a carry into the exponent, an overflow to infinity, signs,
    zeros and infinities, then a fixed draw of finite patterns (NaN excluded: its payload is free)."""
    import random

    special = (0x3DCCCCCD, 0xBDCCCCCD, 0x3F808000, 0x3F818000, 0xBF818000, 0x3F7FFFFF, 0x7F7FFFFF, 0xFF7FFFFF,
               0x00008000, 0x00018000, 0x00007FFF, 0x00000000, 0x80000000, 0x7F800000, 0xFF800000, 0x3F800001,
               0x3F80FFFF, 0x47FF8000)
    draw = random.Random(20260401)
    finite = [bits for bits in (draw.getrandbits(32) for _ in range(600)) if (bits >> 23) & 0xFF != 0xFF]
    ties = [(draw.getrandbits(16) << 16) | 0x8000 for _ in range(200)]
    return special + tuple(bits for bits in finite + ties if (bits >> 23) & 0xFF != 0xFF)


def _fp32_value(bits: int) -> float:
    import struct

    return float(struct.unpack(">f", bits.to_bytes(4, "big"))[0])


def bf16_of_fp32_bits(bits: int) -> int:
    """The BF16 pattern nearest to the FP32 with pattern `bits` (ties to even, IEEE 754-2019 §4.3.1),
    by tutor.theory.formats.encode: the reference the learner's integer arithmetic is judged against."""
    from tutor.theory.formats import encode

    return encode(_fp32_value(bits), "bf16").bits


def check_bf16_rounding(answer: str) -> Verdict:
    """The learner's `to_bf16(bits)` must turn any FP32 bit pattern into the nearest BF16 pattern,
    rounding to nearest with ties to even as every cast does, in integer operations (no import: a
    library cast would do the rounding for them). Fed 0.1, the ties, a carry, an overflow and a draw
    of ~800 patterns; the first one it gets wrong is named with what went wrong there."""
    try:
        to_bf16 = learner_function(answer, "to_bf16", imports=False)
    except Refused as refused:
        return Verdict(False, str(refused))
    cases = _bf16_cases()
    wrong = []
    for bits in cases:
        expected = bf16_of_fp32_bits(bits)
        try:
            got = call(to_bf16, bits)
        except Refused as refused:
            return Verdict(False, str(refused))
        if isinstance(got, bool) or not isinstance(got, int):
            return Verdict(False, f"to_bf16 must return an int (the 16-bit pattern); it returned {type(got).__name__}")
        if got != expected:
            wrong.append((bits, got, expected))
    details = (f"{len(cases) - len(wrong)} of {len(cases)} FP32 patterns rounded right",)
    if not wrong:
        return Verdict(True, "right: every pattern rounds to the nearest BF16, ties to even", details)
    bits, got, expected = wrong[0]
    dropped = bits & 0xFFFF
    if got == bits >> 16 and expected != got:
        why = "that is the top half cut off (rounding toward zero): the dropped half decides whether to round up"
    elif dropped == 0x8000:
        why = ("the dropped half is exactly half a step, a tie: IEEE 754 rounds a tie to the neighbour whose last "
               "bit is 0")
    elif 0 <= got < 2**16 and got >> 15 != expected >> 15:
        why = "the sign bit changed"
    else:
        why = "compare the 16 bits you drop with half a step (0x8000)"
    shown = (f"FP32 0x{bits:08X} ({format_number(_fp32_value(bits), digits=9)}): you returned "
             + (f"0x{got:04X}" if 0 <= got < 2**16 else format_number(got)) + f", the nearest BF16 is 0x{expected:04X}")
    return Verdict(False, f"{shown}: {why}", details + (f"{len(wrong)} wrong",))


# ---- parallelism: write a pipeline schedule --------------------------------------------------------

PIPELINE_STAGES, PIPELINE_MICROBATCHES = 2, 4
FORWARD_TIME, BACKWARD_TIME = 1, 2
"""Time units of one micro-batch's forward and backward on one stage: backward costs about twice
the forward (two matmuls per weight instead of one; Narayanan et al. 2021, arXiv 2104.04473 §3.2)."""
_OP = re.compile(r"([FB])(\d+)")


def _read_schedule(answer: str) -> list[list[tuple[str, int]]]:
    stages = []
    for line in answer.strip().splitlines():
        body = line.split(":", 1)[1] if ":" in line else line
        ops = [(kind, int(number)) for kind, number in _OP.findall(body.upper())]
        if ops:
            stages.append(ops)
    return stages


def simulate_pipeline(schedule: list[list[tuple[str, int]]]) -> tuple[float, list[int], list[float]]:
    """Run a per-stage op order: (makespan, most micro-batches in flight per stage, idle share per
    stage). F(s, m) waits for F(s-1, m); B(s, m) waits for B(s+1, m) and F(s, m); a stage runs its
    ops in the order given. ValueError names the first op that can never start (a deadlock)."""
    stages = len(schedule)
    finished: dict[tuple[str, int, int], float] = {}
    position = [0] * stages
    free_at = [0.0] * stages
    in_flight = [0] * stages
    most = [0] * stages
    busy = [0.0] * stages
    while any(position[s] < len(schedule[s]) for s in range(stages)):
        progressed = False
        for s in range(stages):
            if position[s] >= len(schedule[s]):
                continue
            kind, m = schedule[s][position[s]]
            needs = ([("F", s - 1, m)] if kind == "F" and s > 0 else []) + (
                [("F", s, m)] + ([("B", s + 1, m)] if s < stages - 1 else []) if kind == "B" else [])
            if not all(need in finished for need in needs):
                continue
            start = max([free_at[s]] + [finished[need] for need in needs])
            length = FORWARD_TIME if kind == "F" else BACKWARD_TIME
            finished[(kind, s, m)] = free_at[s] = start + length
            busy[s] += length
            in_flight[s] += 1 if kind == "F" else -1
            most[s] = max(most[s], in_flight[s])
            position[s] += 1
            progressed = True
        if not progressed:
            stuck = [f"stage {s}: {schedule[s][position[s]][0]}{schedule[s][position[s]][1]}"
                     for s in range(stages) if position[s] < len(schedule[s])]
            raise ValueError("deadlock: " + ", ".join(stuck) + " wait for work that comes later in another "
                             "stage's order")
    makespan = max(free_at)
    return makespan, most, [1 - busy[s] / makespan for s in range(stages)]


def check_pipeline_schedule(answer: str) -> Verdict:
    """A schedule for 2 stages and 4 micro-batches that keeps at most 2 micro-batches' activations
    on any stage and idles no more than GPipe's bubble (p-1)/(m+p-1) (Huang et al. 2019 §2.3): the
    1F1B schedule of PipeDream-Flush (Narayanan et al. 2021 §2.2.1)."""
    from tutor.theory.parallel import pipeline_bubble_fraction

    p, m = PIPELINE_STAGES, PIPELINE_MICROBATCHES
    schedule = _read_schedule(answer)
    if len(schedule) != p:
        return Verdict(False, f"write one line per stage ({p}), e.g. 'stage 0: F1 F2 B1 ...'; found {len(schedule)}")
    wanted = sorted([("F", i) for i in range(1, m + 1)] + [("B", i) for i in range(1, m + 1)])
    for s, ops in enumerate(schedule):
        if sorted(ops) != wanted:
            return Verdict(False, f"stage {s} must run F1..F{m} and B1..B{m} once each; it has "
                                  f"{' '.join(f'{k}{i}' for k, i in ops)}")
    try:
        makespan, most, idle = simulate_pipeline(schedule)
    except ValueError as error:
        return Verdict(False, str(error))
    bound = float(pipeline_bubble_fraction(stages=p, microbatches=m))
    details = (f"step time {format_number(makespan)} units (forward {FORWARD_TIME}, backward {BACKWARD_TIME} per micro-batch)",
               *(f"stage {s}: idle {format_percent(idle[s], digits=2)}, at most {most[s]} micro-batches in flight" for s in range(p)),
               f"GPipe's bubble (p-1)/(m+p-1) = {format_percent(bound, digits=2)}")
    worst_idle = max(idle)
    if max(most) > p:
        s = most.index(max(most))
        return Verdict(False, f"stage {s} holds {most[s]} micro-batches' activations at once; at most {p} "
                              "fit: start a backward as soon as its forward has come back", details)
    if worst_idle > bound + 1e-9:
        return Verdict(False, f"the busiest-idle stage waits {format_percent(worst_idle, digits=2)} of the step, "
                              f"more than the {format_percent(bound, digits=2)} bubble any schedule must pay: start work as soon as its input is there",
                       details)
    return Verdict(True, f"right: at most {max(most)} in flight, idle {format_percent(worst_idle, digits=2)} = the bubble "
                         f"(p-1)/(m+p-1): this is 1F1B", details)


# ---- mixture of experts: place experts on ranks ---------------------------------------------------

EXPERT_LOADS = (27, 24, 21, 18, 12, 9, 6, 3)
"""Tokens routed to each of 8 experts in one batch (a router with a popularity bias, as the
moe-routing lab draws it); the exercise's lesson states them."""
EXPERT_RANKS = 4
PLACEMENT_TOLERANCE = 1.05
"""The busiest rank may carry at most 5 % above the mean."""


def check_expert_placement(answer: str) -> Verdict:
    """Two experts per rank on 4 ranks such that the busiest rank receives at most 1.05x the mean
    number of tokens: with expert parallelism a step waits for its busiest rank (Lepikhin et al.
    2020, GShard, arXiv 2006.16668 §2.2), so placement is load balancing too."""
    per_rank = len(EXPERT_LOADS) // EXPERT_RANKS
    ranks = []
    for line in re.split(r"[\n;]", answer.strip()):  # one rank a line, or "; " between them on a command line
        body = line.split(":", 1)[1] if ":" in line else line
        experts = [int(n) for n in re.findall(r"\d+", body)]
        if experts:
            ranks.append(experts)
    if len(ranks) != EXPERT_RANKS:
        return Verdict(False, f"write one line per rank ({EXPERT_RANKS}), e.g. 'rank 0: 0 7'; found {len(ranks)}")
    placed = sorted(e for experts in ranks for e in experts)
    if placed != list(range(len(EXPERT_LOADS))):
        return Verdict(False, f"place each expert 0..{len(EXPERT_LOADS) - 1} exactly once; you placed {placed}")
    if any(len(experts) != per_rank for experts in ranks):
        return Verdict(False, f"each rank holds {per_rank} experts (its memory is sized for that)")
    loads = [sum(EXPERT_LOADS[e] for e in experts) for experts in ranks]
    mean = sum(loads) / len(loads)
    busiest = max(loads)
    details = tuple(f"rank {r}: experts {' '.join(map(str, experts))}, {loads[r]} tokens"
                    for r, experts in enumerate(ranks)) + (f"mean {format_number(mean)} tokens per rank",)
    if busiest > PLACEMENT_TOLERANCE * mean:
        r = loads.index(busiest)
        return Verdict(False, f"rank {r} receives {busiest} tokens, {format_quantity(busiest / mean, 'x')} the mean: every rank waits "
                              "for it. A rank carries the sum of its experts' loads: aim every rank at the mean", details)
    return Verdict(True, f"right: the busiest rank carries {format_quantity(busiest / mean, 'x')} the mean", details)


# ---- training loop and memory: run the learner's loop ------------------------------------------------

LOOP_STEPS, LOOP_BATCH, LOOP_FEATURES, LOOP_CLASSES = 8, 32, 64, 512
ACCUMULATION_KS = (2, 4, 8)
"""The accumulation check runs the loop once per k: a loop right for one k only divides by a number."""


def _tiny_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(LOOP_FEATURES, 128), nn.GELU(), nn.Linear(128, LOOP_CLASSES))
    x = torch.randn(LOOP_BATCH, LOOP_FEATURES)
    y = torch.randint(0, LOOP_CLASSES, (LOOP_BATCH,))
    return model, x, y


def check_accumulation_loop(answer: str) -> Verdict:
    """The learner's gradient-accumulation loop over k micro-batches must leave in .grad the big
    batch's gradient (the mean loss over all examples: the k slice means divided by k), run one
    forward per micro-batch (the whole batch at once is no accumulation) and step the optimizer once.
    It runs for each k in ACCUMULATION_KS, so a loop that divides by a number rather than by k fails."""
    try:
        code = compile_answer(answer)
        findings = [_accumulation_run(code, k) for k in ACCUMULATION_KS]
    except Refused as refused:
        return Verdict(False, f"your loop did not run: {refused}")
    details = tuple(line for finding in findings for line in finding[1])
    for message, _lines in findings:
        if message:
            return Verdict(False, message, details)
    return Verdict(True, f"right: for k = {', '.join(map(str, ACCUMULATION_KS))} the accumulated gradient equals the big "
                         "batch's, one forward per micro-batch and one optimizer step", details)


def _accumulation_run(code, k: int) -> tuple[str, tuple[str, ...]]:
    """(what is wrong, or "", the figures) for the learner's loop run with k micro-batches."""
    import torch
    from torch import nn

    model, x, y = _tiny_model()
    loss_fn = nn.CrossEntropyLoss()
    reference = torch.autograd.grad(loss_fn(model(x), y), list(model.parameters()))
    steps: list[int] = []
    forwards: list[int] = []
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the gradient is what is judged
    original_step = optimizer.step

    def counted_step(*args, **kwargs):
        steps.append(1)
        return original_step(*args, **kwargs)

    setattr(optimizer, "step", counted_step)
    model.register_forward_pre_hook(lambda _module, inputs: forwards.append(int(inputs[0].shape[0])))
    micro_batches = list(zip(x.chunk(k), y.chunk(k), strict=True))
    run_code(code, {"model": model, "loss_fn": loss_fn, "optimizer": optimizer, "micro_batches": micro_batches,
                    "k": k, "torch": torch})
    grads = [p.grad for p in model.parameters()]
    if any(g is None for g in grads):
        return f"with k = {k}: no gradient in .grad after your loop: call backward() on each micro-batch's loss", ()
    ratio = (sum(float((g * r).sum()) for g, r in zip(grads, reference, strict=True))
             / sum(float((r * r).sum()) for r in reference))
    error = max(float((g - r).abs().max()) for g, r in zip(grads, reference, strict=True)) / max(
        float(r.abs().max()) for r in reference)
    micro = LOOP_BATCH // k
    details = (f"k = {k}: accumulated gradient / the big batch's {format_quantity(ratio, 'x')}, largest difference "
               f"{format_number(error, digits=2)} of the largest gradient; {len(forwards)} forward(s) of "
               f"{', '.join(map(str, sorted(set(forwards)))) or 'no'} examples; optimizer.step() {len(steps)} time(s)",)
    if len(steps) != 1:
        return (f"with k = {k}, optimizer.step() ran {len(steps)} times: once per optimizer step, after the last "
                "micro-batch"), details
    if any(size > micro for size in forwards) or len(forwards) < k:
        return (f"with k = {k}, your loop ran {len(forwards)} forward(s) of up to {max(forwards, default=0)} examples: "
                f"accumulation runs each of the {k} micro-batches of {micro} on its own (that is what keeps the "
                "activations small)"), details
    if error > 1e-4:
        if abs(ratio - k) < 0.01 * k:
            return (f"with k = {k} the gradient is {format_quantity(ratio, 'x')} the big batch's: each micro-batch loss is a "
                    f"mean over its slice, so the {k} of them add up to {k} times the average"), details
        return (f"with k = {k} the gradient is {format_quantity(ratio, 'x')} the big batch's: the loop must hold for "
                "every k it is given, not one"), details
    return "", details


def _storages(tensors) -> dict[int, int]:
    """data pointer -> bytes of each tensor's storage (a view and its base count once)."""
    found = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.nbytes():
            found[storage.data_ptr()] = storage.nbytes()
    return found


def _live_tensor_storages() -> dict[int, int]:
    """Every tensor storage a Python object holds right now, wherever the learner's code put it: a
    list, a closure, a function's locals, an attribute (the garbage collector tracks every tensor)."""
    import gc

    import torch

    return _storages(o for o in gc.get_objects() if issubclass(type(o), torch.Tensor))


def check_logits_alive(answer: str) -> Verdict:
    """The learner's loop must record each step's accuracy in `accuracies` (floats) without keeping
    each step's logits alive: a list of logits holds batch × classes × 4 bytes per step (with the
    whole vocabulary as classes, gigabytes; the activations lesson's loss head). The memory is read at
    its peak, at every forward and every optimizer step of the loop, not after it: a `del` after the
    loop frees what the loop held through all of its steps, too late to lower the peak. Read at each
    optimizer step (where a step's logits, and whatever earlier steps left, are alive) and at the end."""
    import torch
    from torch import nn

    expected = _logits_reference_accuracies()
    step_logits = LOOP_BATCH * LOOP_CLASSES * 4
    model, batches, optimizer = _logits_setup()
    namespace = {"model": model, "batches": batches, "optimizer": optimizer, "loss_fn": nn.CrossEntropyLoss(),
                 "torch": torch}
    before = set(_live_tensor_storages())
    samples: list[int] = []

    def sample(*_args) -> None:
        own = before | set(_storages(p.grad for p in model.parameters() if p.grad is not None))
        samples.append(sum(size for pointer, size in _live_tensor_storages().items() if pointer not in own))

    original_step = optimizer.step

    def sampled_step(*args, **kwargs):
        sample()
        return original_step(*args, **kwargs)

    setattr(optimizer, "step", sampled_step)
    try:
        run_code(compile_answer(answer), namespace)
    except Refused as refused:
        return Verdict(False, f"your loop did not run: {refused}")
    sample()
    accuracies = namespace.get("accuracies")
    if not isinstance(accuracies, list) or len(accuracies) != LOOP_STEPS or not all(
            isinstance(a, (int, float)) and not isinstance(a, bool) for a in accuracies):
        return Verdict(False, f"after your loop, `accuracies` must be a list of {LOOP_STEPS} numbers (one per step, "
                              "e.g. with .item())")
    if any(not math.isclose(a, e, abs_tol=1e-6) for a, e in zip(accuracies, expected, strict=True)):
        return Verdict(False, "`accuracies` does not hold each step's training accuracy (argmax of the logits "
                              "equal to the labels, averaged over the batch)")
    peak = max(samples)
    at = samples.index(peak)
    details = (f"one step's logits: {format_bytes(step_logits)} ({LOOP_BATCH} x {LOOP_CLASSES} FP32)",
               f"tensors your loop held at its peak: {format_bytes(peak)}, read at {len(samples)} moments "
               "(each optimizer step, and the end)",
               f"after the loop: {format_bytes(samples[-1])}")
    if peak > 1.5 * step_logits:
        when = "after the loop" if at == len(samples) - 1 else "during the loop"
        return Verdict(False, f"{when} your loop held {format_number(peak / step_logits, digits=2)} steps' worth of "
                              "logits at once: keep the number you need (.item()), not the tensor, while the step "
                              "still has it", details)
    return Verdict(True, "right: the accuracy of every step, and no step's logits kept beyond its own", details)


def _logits_setup():
    import torch

    model, x, y = _tiny_model()
    batches = [(x.roll(i, 0), y.roll(i, 0)) for i in range(LOOP_STEPS)]
    return model, batches, torch.optim.SGD(model.parameters(), lr=0.1)


def _logits_reference_accuracies() -> list[float]:
    """Each step's accuracy, from the loop run right (in its own frame: none of its tensors outlive it,
    so the learner's peak is not read with the reference's logits in it)."""
    from torch import nn

    model, batches, optimizer = _logits_setup()
    expected = []
    for x, y in batches:
        optimizer.zero_grad()
        logits = model(x)
        nn.functional.cross_entropy(logits, y).backward()
        optimizer.step()
        expected.append(float((logits.argmax(-1) == y).float().mean()))
    return expected


CHECKS: dict[str, Check] = {check.name: check for check in (
    Check("bf16-rounding", "round any FP32 to BF16 in integer arithmetic", check_bf16_rounding),
    Check("pipeline-schedule", "a pipeline schedule within the memory and the bubble", check_pipeline_schedule),
    Check("expert-placement", "experts placed so no rank is the bottleneck", check_expert_placement),
    Check("accumulation-loop", "a gradient-accumulation loop that gives the big batch's gradient",
          check_accumulation_loop, needs_torch=True),
    Check("logits-alive", "a training loop that logs accuracy without keeping the logits", check_logits_alive,
          needs_torch=True),
    Check("kv-cache-bytes", "the KV cache of a config.json, GQA included", check_kv_cache_function),
    Check("int8-absmax", "an INT8 absmax quantization that round-trips within half a step", check_int8_absmax),
    Check("zero-memory", "the bytes ZeRO stage 0-3 leaves on one GPU", check_zero_memory),
    Check("capacity-drops", "the tokens an expert capacity factor drops", check_capacity_drops),
    Check("ring-allreduce", "an all-reduce that sends no more than a ring", check_ring_allreduce),
    Check("kv-decode", "a decode step that keeps a KV cache", check_kv_decode, needs_torch=True),
    Check("eval-loop", "an evaluation pass: the mean loss per example, no graph, dropout off", check_eval_loop,
          needs_torch=True),
    Check("checkpoint-resume", "a checkpoint a run resumes from exactly", check_checkpoint_resume, needs_torch=True),
    Check("master-weights", "an update that keeps FP32 master weights", check_master_weights, needs_torch=True),
    Check("moe-dispatch", "an MoE layer that runs each expert on its own tokens", check_moe_dispatch,
          needs_torch=True),
    Check("paged-blocks", "the KV blocks a paged pool holds when requests share a prefix", check_paged_blocks),
    Check("continuous-batching", "the step each request ends at under continuous batching",
          check_continuous_batching),
)}


def run_check(name: str, answer: str) -> Verdict:
    """The named check on the learner's answer; UserError for an unknown check."""
    from tutor.errors import UserError

    check = CHECKS.get(name)
    if check is None:
        raise UserError(f"unknown exercise check {name!r}; choose one of: {', '.join(CHECKS)}")
    return check.run(answer)
