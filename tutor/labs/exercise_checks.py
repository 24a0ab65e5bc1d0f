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
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction

from tutor.formatting import format_bytes, format_number, format_percent, format_quantity


@dataclass(frozen=True)
class Verdict:
    """What a check found: `passed`, one line for the learner, and the figures behind it."""

    passed: bool
    message: str
    details: tuple[str, ...] = ()


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    run: Callable[[str], Verdict]
    needs_torch: bool = False


# ---- precision: round a value to BF16 by hand ----------------------------------------------------

BF16_VALUE = "0.1"
"""The value the bf16-bits exercise rounds (its lesson states it)."""


def check_bf16_bits(answer: str) -> Verdict:
    """The 16 bits of BF16 nearest to 0.1 (round to nearest, ties to even: IEEE 754 §4.3.1), typed as
    binary digits; spaces, underscores and a 0b prefix are ignored."""
    from tutor.theory.formats import encode, encoding_of_bits

    bits_text = re.sub(r"[\s_|]", "", answer.strip().lower()).removeprefix("0b")
    if not re.fullmatch(r"[01]+", bits_text or "x"):
        return Verdict(False, "type 16 binary digits: sign, 8 exponent bits, 7 mantissa bits, e.g. 0 01111011 0000000")
    if len(bits_text) != 16:
        return Verdict(False, f"BF16 has 16 bits (1 + 8 + 7); you typed {len(bits_text)}")
    typed = encoding_of_bits(int(bits_text, 2), "bf16")
    right = encode(Fraction(BF16_VALUE), "bf16")
    assert right.value is not None, f"{BF16_VALUE} is a finite BF16 value"
    shown = f"{typed.sign} {bits_text[1:9]} {bits_text[9:]}"
    value = typed.value
    details = (f"you typed {shown} = {format_number(float(value), digits=10)}" if value is not None else f"you typed {shown}: not a number",)
    if typed.bits == right.bits:
        return Verdict(True, f"right: {shown} is {format_number(float(right.value), digits=10)}, the BF16 value nearest to {BF16_VALUE}",
                       details)
    if typed.sign != right.sign:
        why = "the sign bit is 1: that is a negative number"
    elif typed.exponent != right.exponent:
        why = (f"the exponent field {typed.exponent} gives 2^{typed.exponent - 127}; {BF16_VALUE} lies between "
               f"2^{right.exponent - 127} and 2^{right.exponent - 126}")
    elif abs(typed.mantissa - right.mantissa) == 1 and value is not None and right.value is not None:
        target = Fraction(BF16_VALUE)
        why = (f"one step off in the last mantissa bit: {format_number(float(value), digits=10)} is "
               f"{format_number(float(abs(value - target)))} from {BF16_VALUE}, the other neighbour "
               f"{format_number(float(abs(right.value - target)))}: round to the "
               "nearer one (cutting FP32's bits off rounds toward zero)")
    else:
        why = "the mantissa bits are not 0.1's: write 0.1 as 1.f × 2^e and take f's first 7 bits, rounded"
    return Verdict(False, why, details)


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
    for line in answer.strip().splitlines():
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
                              "for it. Pair a busy expert with a quiet one", details)
    return Verdict(True, f"right: the busiest rank carries {format_quantity(busiest / mean, 'x')} the mean", details)


# ---- training loop and memory: run the learner's loop ------------------------------------------------

LOOP_STEPS, LOOP_BATCH, LOOP_FEATURES, LOOP_CLASSES, MICRO_BATCHES = 8, 32, 64, 512, 4


def _code(answer: str):
    import textwrap

    try:
        return compile(textwrap.dedent(answer), "<your loop>", "exec")
    except SyntaxError as error:
        raise _Refused(f"line {error.lineno}: {error.msg}") from None


class _Refused(Exception):
    """The answer cannot be run: a line for the learner."""


def _tiny_model():
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(LOOP_FEATURES, 128), nn.GELU(), nn.Linear(128, LOOP_CLASSES))
    x = torch.randn(LOOP_BATCH, LOOP_FEATURES)
    y = torch.randint(0, LOOP_CLASSES, (LOOP_BATCH,))
    return model, x, y


def _run_learner_code(code, namespace: dict) -> None:
    try:
        exec(code, namespace)  # the learner's own loop, on their own machine, in the worker process
    except Exception as error:
        line = ""
        traceback = error.__traceback__
        while traceback is not None:
            if traceback.tb_frame.f_code.co_filename == "<your loop>":
                line = f"line {traceback.tb_lineno}: "
            traceback = traceback.tb_next
        raise _Refused(f"{line}{type(error).__name__}: {error}") from None


def check_accumulation_loop(answer: str) -> Verdict:
    """The learner's gradient-accumulation loop over k micro-batches must leave in .grad the big
    batch's gradient (the mean loss over all examples: the k slice means divided by k) and step the
    optimizer once."""
    import torch
    from torch import nn

    try:
        code = _code(answer)
        model, x, y = _tiny_model()
        loss_fn = nn.CrossEntropyLoss()
        reference = torch.autograd.grad(loss_fn(model(x), y), list(model.parameters()))
        steps = []
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the gradient is what is judged
        original_step = optimizer.step

        def counted_step(*args, **kwargs):
            steps.append(1)
            return original_step(*args, **kwargs)

        setattr(optimizer, "step", counted_step)
        micro_batches = list(zip(x.chunk(MICRO_BATCHES), y.chunk(MICRO_BATCHES), strict=True))
        _run_learner_code(code, {"model": model, "loss_fn": loss_fn, "optimizer": optimizer,
                                 "micro_batches": micro_batches, "k": MICRO_BATCHES, "torch": torch})
    except _Refused as refused:
        return Verdict(False, f"your loop did not run: {refused}")
    grads = [p.grad for p in model.parameters()]
    if any(g is None for g in grads):
        return Verdict(False, "no gradient in .grad after your loop: call backward() on each micro-batch's loss")
    ratio = (sum(float((g * r).sum()) for g, r in zip(grads, reference, strict=True))
             / sum(float((r * r).sum()) for r in reference))
    error = max(float((g - r).abs().max()) for g, r in zip(grads, reference, strict=True)) / max(
        float(r.abs().max()) for r in reference)
    details = (f"accumulated gradient / the big batch's: {format_quantity(ratio, 'x')}",
               f"largest difference: {format_number(error, digits=2)} of the largest gradient", f"optimizer.step() called {len(steps)} time(s)")
    if len(steps) != 1:
        return Verdict(False, f"optimizer.step() ran {len(steps)} times: once per optimizer step, after the last "
                              "micro-batch", details)
    if error > 1e-4:
        if abs(ratio - MICRO_BATCHES) < 0.01 * MICRO_BATCHES:
            return Verdict(False, f"the gradient is {format_quantity(ratio, 'x')} the big batch's: each micro-batch loss is a mean "
                                  f"over its slice, so the {MICRO_BATCHES} of them add up to {MICRO_BATCHES} times "
                                  "the average", details)
        return Verdict(False, f"the gradient differs from the big batch's ({format_quantity(ratio, 'x')} along it)", details)
    return Verdict(True, f"right: the accumulated gradient equals the big batch's to {format_number(error, digits=1)}", details)


def _tensors_kept(value, seen: set[int], found: dict[int, int], depth: int = 0) -> None:
    """Bytes of every tensor storage reachable from `value` through lists, tuples, dicts and sets."""
    import torch

    if depth > 6 or id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        storage = value.untyped_storage()
        found[storage.data_ptr()] = storage.nbytes()
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _tensors_kept(item, seen, found, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            _tensors_kept(item, seen, found, depth + 1)


def check_logits_alive(answer: str) -> Verdict:
    """The learner's loop must record each step's accuracy in `accuracies` (floats) without keeping
    each step's logits alive: a list of logits holds batch × classes × 4 bytes per step (with the
    whole vocabulary as classes, gigabytes; the activations lesson's loss head)."""
    import torch
    from torch import nn

    def fresh():
        model, x, y = _tiny_model()
        batches = [(x.roll(i, 0), y.roll(i, 0)) for i in range(LOOP_STEPS)]
        return model, batches, torch.optim.SGD(model.parameters(), lr=0.1)

    model, batches, optimizer = fresh()
    expected = []
    for x, y in batches:
        optimizer.zero_grad()
        logits = model(x)
        nn.functional.cross_entropy(logits, y).backward()
        optimizer.step()
        expected.append(float((logits.argmax(-1) == y).float().mean()))
    step_logits = LOOP_BATCH * LOOP_CLASSES * 4
    model, batches, optimizer = fresh()
    namespace = {"model": model, "batches": batches, "optimizer": optimizer, "loss_fn": nn.CrossEntropyLoss(),
                 "torch": torch}
    try:
        _run_learner_code(_code(answer), namespace)
    except _Refused as refused:
        return Verdict(False, f"your loop did not run: {refused}")
    accuracies = namespace.get("accuracies")
    if not isinstance(accuracies, list) or len(accuracies) != LOOP_STEPS or not all(
            isinstance(a, (int, float)) and not isinstance(a, bool) for a in accuracies):
        return Verdict(False, f"after your loop, `accuracies` must be a list of {LOOP_STEPS} numbers (one per step, "
                              "e.g. with .item())")
    if any(not math.isclose(a, e, abs_tol=1e-6) for a, e in zip(accuracies, expected, strict=True)):
        return Verdict(False, "`accuracies` does not hold each step's training accuracy (argmax of the logits "
                              "equal to the labels, averaged over the batch)")
    own = {p.untyped_storage().data_ptr() for p in model.parameters()}
    own |= {t.untyped_storage().data_ptr() for group in optimizer.state.values() for t in group.values()
            if isinstance(t, torch.Tensor)}
    own |= {t.untyped_storage().data_ptr() for batch in batches for t in batch}
    found: dict[int, int] = {}
    seen: set[int] = set()
    for name, value in namespace.items():
        if name not in ("model", "batches", "optimizer", "loss_fn", "torch", "__builtins__"):
            _tensors_kept(value, seen, found)
    kept = sum(size for pointer, size in found.items() if pointer not in own)
    details = (f"one step's logits: {format_bytes(step_logits)} ({LOOP_BATCH} x {LOOP_CLASSES} FP32)",
               f"tensors your loop keeps after {LOOP_STEPS} steps: {format_bytes(kept)}")
    if kept > 1.5 * step_logits:
        return Verdict(False, f"after {LOOP_STEPS} steps your loop still holds {format_number(kept / step_logits, digits=2)} steps' worth of "
                              "logits: keep the number you need (.item()), not the tensor", details)
    return Verdict(True, "right: the accuracy of every step, and no step's logits kept beyond its own", details)


CHECKS: dict[str, Check] = {check.name: check for check in (
    Check("bf16-bits", "round 0.1 to BF16 by hand", check_bf16_bits),
    Check("pipeline-schedule", "a pipeline schedule within the memory and the bubble", check_pipeline_schedule),
    Check("expert-placement", "experts placed so no rank is the bottleneck", check_expert_placement),
    Check("accumulation-loop", "a gradient-accumulation loop that gives the big batch's gradient",
          check_accumulation_loop, needs_torch=True),
    Check("logits-alive", "a training loop that logs accuracy without keeping the logits", check_logits_alive,
          needs_torch=True),
)}


def run_check(name: str, answer: str) -> Verdict:
    """The named check on the learner's answer; UserError for an unknown check."""
    from tutor.errors import UserError

    check = CHECKS.get(name)
    if check is None:
        raise UserError(f"unknown exercise check {name!r}; choose one of: {', '.join(CHECKS)}")
    return check.run(answer)
