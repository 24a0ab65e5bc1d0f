"""Checked exercises of the serving track: functions the learner writes, run on many request mixes
and judged against tutor.theory.serving.

- paged-blocks: blocks(lengths, block_size, shared_prefix), the KV blocks a paged pool holds when
  every request starts with the same shared prefix (PagedAttention, Kwon et al. 2023, §4.2-4.4);
- continuous-batching: finish_steps(outputs, batch), the decode step at which each request ends
  under iteration-level scheduling (Orca, Yu et al. 2022, §3.1).
"""

from __future__ import annotations

import random
from typing import Any

from tutor.labs.exercise_functions import _close, _judge
from tutor.labs.exercise_types import Verdict

# ---- paged KV blocks with a shared prefix -----------------------------------------------------


def _paged_cases() -> list[dict[str, Any]]:
    draw = random.Random(2309)
    cases: list[dict[str, Any]] = [
        {"lengths": [40, 40, 40], "block_size": 16, "shared_prefix": 0},
        {"lengths": [100, 120, 130], "block_size": 16, "shared_prefix": 40},  # prefix ends mid-block
        {"lengths": [64, 80], "block_size": 16, "shared_prefix": 64},  # a request that is all prefix
        {"lengths": [33], "block_size": 32, "shared_prefix": 32},
    ]
    for _ in range(12):
        block = draw.choice((4, 8, 16, 32))
        prefix = draw.choice((0, block * draw.randint(1, 6), draw.randint(1, 200)))
        lengths = [prefix + draw.randint(1, 300) for _ in range(draw.randint(1, 12))]
        cases.append({"lengths": lengths, "block_size": block, "shared_prefix": prefix})
    return cases


def paged_blocks_expected(lengths: list[int], block_size: int, shared_prefix: int) -> int:
    """Blocks held: the prefix's full blocks once, then each request's own tokens in whole blocks
    (tutor.theory.serving: paged slots less the prefix blocks shared by the other requests)."""
    from tutor.theory.serving import paged_reserved_tokens, prefix_cache_saved_tokens

    slots = paged_reserved_tokens(lengths, block_size) - prefix_cache_saved_tokens(
        requests=len(lengths), prefix_tokens=shared_prefix, block_size=block_size)
    return slots // block_size


def _paged_explain(case: dict[str, Any], got: Any, want: Any) -> str:
    lengths, block, prefix = case["lengths"], case["block_size"], case["shared_prefix"]
    unshared = sum(-(-length // block) for length in lengths)
    whole_prefix = -(-prefix // block) if prefix else 0
    over_shared = whole_prefix + sum(-(-(length - whole_prefix * block) // block) if length > whole_prefix * block
                                     else 0 for length in lengths)
    floored = sum(length // block for length in lengths)
    if got == unshared and prefix >= block:
        return "the prefix's full blocks are stored once and every request's table points at them"
    if got == over_shared and prefix % block:
        return ("the prefix's last block is only partly the prefix: each request fills the rest with its own tokens, "
                "so only the prefix's full blocks can be shared")
    if got == floored:
        return "a request's last block holds its last tokens even when it is partly empty: round up, not down"
    return "count the prefix's full blocks once, then each request's remaining tokens in whole blocks"


def check_paged_blocks(answer: str) -> Verdict:
    """blocks(lengths, block_size, shared_prefix): KV blocks a paged pool holds with a shared prefix,
    against tutor.theory.serving (PagedAttention's block tables and reference-counted sharing)."""
    return _judge(answer, "blocks", _paged_cases(), paged_blocks_expected,
                  lambda got, want: _close(got, want, absolute=0), _paged_explain,
                  lambda case: (f"lengths={case['lengths']}, block_size={case['block_size']}, "
                                f"shared_prefix={case['shared_prefix']}"),
                  "right: the prefix's full blocks once, every request's own tokens in whole blocks")


# ---- continuous batching ----------------------------------------------------------------------

def _batching_cases() -> list[dict[str, Any]]:
    draw = random.Random(2022)
    cases: list[dict[str, Any]] = [
        {"outputs": [5, 1, 1, 1, 5, 5], "batch": 2},
        {"outputs": [3, 3, 3], "batch": 4},  # fewer requests than slots
        {"outputs": [10, 2, 2, 2, 2, 2], "batch": 2},
    ]
    for _ in range(12):
        batch = draw.choice((2, 3, 4, 8))
        cases.append({"outputs": [draw.randint(1, 40) for _ in range(draw.randint(2, 25))], "batch": batch})
    return cases


def finish_steps_expected(outputs: list[int], batch: int) -> list[int]:
    from tutor.theory.serving import continuous_batching_schedule

    return continuous_batching_schedule(outputs, batch).finish_steps


def _static_finish(outputs: list[int], batch: int) -> list[int]:
    from tutor.theory.serving import static_batching_schedule

    return static_batching_schedule(outputs, batch).finish_steps


def _round_robin_finish(outputs: list[int], batch: int) -> list[int]:
    ends = [0] * batch
    finish = []
    for index, length in enumerate(outputs):
        ends[index % batch] += length
        finish.append(ends[index % batch])
    return finish


def _batching_explain(case: dict[str, Any], got: Any, want: Any) -> str:
    outputs, batch = case["outputs"], case["batch"]
    if not isinstance(got, list) or len(got) != len(outputs):
        return f"return one finish step per request: a list of {len(outputs)} numbers"
    if got == _static_finish(outputs, batch):
        return ("that is static batching: every request of a batch waits for its longest; here a finished request's "
                "slot takes the next request at once")
    if got == _round_robin_finish(outputs, batch):
        return "a waiting request takes whichever slot frees first, not the next slot in turn"
    return "each request starts when a slot frees (the earliest free slot) and ends its length of steps later"


def check_continuous_batching(answer: str) -> Verdict:
    """finish_steps(outputs, batch): the step at which each request ends under iteration-level
    scheduling, against tutor.theory.serving.continuous_batching_schedule (Orca §3.1)."""
    return _judge(answer, "finish_steps", _batching_cases(), finish_steps_expected,
                  lambda got, want: isinstance(got, list) and [_close(g, w, absolute=0) for g, w in zip(got, want)]
                  == [True] * len(want) and len(got) == len(want),
                  _batching_explain, lambda case: f"outputs={case['outputs']}, batch={case['batch']}",
                  "right: each waiting request takes the first slot to free, at the step it frees")
