"""Serving a model: latency per user, throughput of the server, the KV cache in pages, batching
policies and speculative decoding. Pure arithmetic on counts and times, standard library only.

Sources:
- TTFT, TPOT and end-to-end latency: a request's latency is its time to first token plus one time
  per output token for each token after the first (vLLM's `benchmarks/benchmark_serving.py` reports
  TTFT, TPOT = (latency - TTFT) / (output tokens - 1) and ITL the same way).
- PagedAttention: Kwon et al., "Efficient Memory Management for Large Language Model Serving with
  PagedAttention", SOSP 2023, arXiv 2309.06180: §3 (systems that reserve a contiguous chunk of the
  request's maximum length per request waste memory to reservation and internal fragmentation;
  only 20.4 % to 38.2 % of the KV memory held token states in their Fig. 2), §4.2-4.3 (fixed-size
  KV blocks mapped through a block table, so a request wastes at most one partly filled block),
  §4.4 (blocks shared between requests with reference counts: a shared prefix is stored once).
- Continuous batching: Yu et al., "Orca: A Distributed Serving System for Transformer-Based
  Generative Models", OSDI 2022, §3.1 (iteration-level scheduling: a finished request leaves the
  batch and a waiting one joins at the next iteration, instead of the whole batch running until its
  longest request ends).
- Speculative decoding: Leviathan, Kalman, Matias, "Fast Inference from Transformers via
  Speculative Decoding", ICML 2023, arXiv 2211.17192, Eq. (1) (expected tokens per run of the
  target with acceptance rate α and γ drafted tokens: (1 - α^(γ+1)) / (1 - α)) and Theorem 3.8
  (walltime improvement (1 - α^(γ+1)) / ((1 - α)(γc + 1)) for a draft costing c of a target step);
  Chen et al., "Accelerating Large Language Model Decoding with Speculative Sampling", arXiv
  2302.01318, the same scheme.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

from tutor.errors import UserError
from tutor.theory.checks import bounded_int, positive_int

__all__ = [
    "MAX_REQUESTS",
    "BatchSchedule",
    "contiguous_reserved_tokens",
    "continuous_batching_schedule",
    "expected_block_waste_tokens",
    "paged_reserved_tokens",
    "prefix_cache_saved_tokens",
    "request_latency_s",
    "server_tokens_per_second",
    "speculative_expected_tokens_per_step",
    "speculative_speedup",
    "static_batching_schedule",
    "user_tokens_per_second",
]

MAX_REQUESTS = 1_000_000
"""The most requests a schedule takes: a simulated mix stays a fraction of a second to schedule."""


def _seconds(value: float, name: str, *, zero: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not zero):
        raise UserError(f"{name} must be {'at least 0' if zero else 'more than 0'} seconds, got {value!r}")
    return float(value)


def _lengths(lengths: Sequence[int], name: str) -> list[int]:
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) or not lengths:
        raise UserError(f"{name} must be a non-empty list of token counts")
    if len(lengths) > MAX_REQUESTS:
        raise UserError(f"{name} may hold at most {MAX_REQUESTS:,} requests, got {len(lengths):,}")
    return [positive_int(length, f"each of {name}") for length in lengths]


# ---- latency and throughput -------------------------------------------------------------------

def request_latency_s(*, ttft_s: float, tpot_s: float, output_tokens: int) -> float:
    """Seconds from a request's arrival to its last token: TTFT + TPOT × (output tokens - 1).

    The first token comes out of the prefill (TTFT); each later one costs one decode step (TPOT).
    vLLM's benchmark_serving.py defines TPOT as (latency - TTFT) / (output tokens - 1), this read
    the other way round.
    """
    ttft = _seconds(ttft_s, "TTFT")
    tpot = _seconds(tpot_s, "TPOT", zero=True)
    return ttft + tpot * (positive_int(output_tokens, "output tokens") - 1)


def user_tokens_per_second(tpot_s: float) -> float:
    """Tokens per second one user sees while their answer streams: 1 / TPOT."""
    return 1.0 / _seconds(tpot_s, "TPOT")


def server_tokens_per_second(*, batch: int, step_s: float) -> float:
    """Tokens per second a server generates when each decode step serves `batch` sequences: batch / step.

    Each sequence in the batch gets one token per step (Orca §3.1; Pope et al., arXiv 2211.05102 §2).
    """
    return positive_int(batch, "batch") / _seconds(step_s, "step time")


# ---- the KV cache as pages --------------------------------------------------------------------

def contiguous_reserved_tokens(lengths: Sequence[int], max_len: int) -> int:
    """KV-cache slots reserved when each request gets one contiguous chunk of `max_len` tokens,
    whatever its real length (Kwon et al. 2023 §3: "reserved" and "internal fragmentation")."""
    tokens = _lengths(lengths, "lengths")
    max_len = positive_int(max_len, "max_len")
    longest = max(tokens)
    if longest > max_len:
        raise UserError(f"a request of {longest:,} tokens does not fit a maximum length of {max_len:,}")
    return len(tokens) * max_len


def paged_reserved_tokens(lengths: Sequence[int], block_size: int) -> int:
    """KV-cache slots held when each request takes whole blocks of `block_size` tokens as it grows:
    Σ ceil(length / block) × block (Kwon et al. 2023 §4.2; vLLM's default block is 16 tokens)."""
    tokens = _lengths(lengths, "lengths")
    block = positive_int(block_size, "block_size")
    return sum(-(-length // block) * block for length in tokens)


def expected_block_waste_tokens(block_size: int) -> float:
    """Expected empty slots in a request's last block: (block - 1) / 2, for lengths whose remainder
    modulo the block size is uniform (each of 0..block-1 empty slots equally likely). Kwon et al.
    2023 §4.2: the waste of paging is bounded by one block per request."""
    return (positive_int(block_size, "block_size") - 1) / 2


def prefix_cache_saved_tokens(*, requests: int, prefix_tokens: int, block_size: int) -> int:
    """KV slots not stored again when `requests` requests share a prompt prefix of `prefix_tokens`:
    (requests - 1) × the prefix's full blocks. Only whole blocks are shared: a block's content
    (and in vLLM's automatic prefix caching, its hash) must be identical, and the prefix's last,
    partly filled block continues differently in each request (Kwon et al. 2023 §4.4; vLLM docs,
    "Automatic Prefix Caching")."""
    requests = positive_int(requests, "requests")
    if isinstance(prefix_tokens, bool) or not isinstance(prefix_tokens, int) or prefix_tokens < 0:
        raise UserError(f"prefix tokens must be a whole number >= 0, got {prefix_tokens!r}")
    block = positive_int(block_size, "block_size")
    return (requests - 1) * (prefix_tokens // block) * block


# ---- batching policies ------------------------------------------------------------------------

@dataclass(frozen=True)
class BatchSchedule:
    """A batching policy played over a request mix, counted in decode iterations.

    steps: iterations the server ran; tokens: tokens generated (the sum of the output lengths);
    batch: the slots each iteration serves; finish_steps: the iteration at which each request ended
    (its latency in steps, all requests waiting from step 0)."""

    steps: int
    tokens: int
    batch: int
    finish_steps: list[int]

    @property
    def utilisation(self) -> float:
        """Share of the batch's slots that produced a token: tokens / (steps × batch)."""
        return self.tokens / (self.steps * self.batch)

    @property
    def mean_finish_step(self) -> float:
        """The mean request's latency, in decode iterations."""
        return sum(self.finish_steps) / len(self.finish_steps)


def static_batching_schedule(output_tokens: Sequence[int], batch: int) -> BatchSchedule:
    """Requests in arrival order, `batch` at a time; each batch runs until its longest request ends,
    and the next starts only then (request-level scheduling, Orca §2.2 and Fig. 3). A finished
    request's slot idles; its answer is returned when the batch ends."""
    lengths = _lengths(output_tokens, "output tokens")
    batch = bounded_int(batch, "batch", MAX_REQUESTS)
    steps = 0
    finish: list[int] = []
    for start in range(0, len(lengths), batch):
        group = lengths[start:start + batch]
        steps += max(group)
        finish.extend([steps] * len(group))
    return BatchSchedule(steps, sum(lengths), batch, finish)


def continuous_batching_schedule(output_tokens: Sequence[int], batch: int) -> BatchSchedule:
    """Iteration-level scheduling (Orca §3.1): a request leaves the batch as soon as its last token
    is out, and the next waiting request takes its slot at the next iteration. With every request
    waiting from step 0, the steps are those of a greedy assignment of requests, in arrival order,
    to whichever slot frees first."""
    lengths = _lengths(output_tokens, "output tokens")
    batch = bounded_int(batch, "batch", MAX_REQUESTS)
    slots = [0] * min(batch, len(lengths))  # the step at which each slot is free again
    finish: list[int] = []
    for length in lengths:
        free = heapq.heappop(slots)
        finish.append(free + length)
        heapq.heappush(slots, free + length)
    return BatchSchedule(max(finish), sum(lengths), batch, finish)


# ---- speculative decoding ---------------------------------------------------------------------

def _acceptance(rate: float) -> float:
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
        raise UserError(f"acceptance rate must be a number from 0 to 1, got {rate!r}")
    return float(rate)


def speculative_expected_tokens_per_step(acceptance: float, draft_tokens: int) -> float:
    """Expected tokens one verification step of the target yields: (1 - α^(γ+1)) / (1 - α).

    Leviathan et al. 2023, Eq. (1): with each drafted token accepted independently with
    probability α, the accepted run is geometric, capped at γ, and the target adds one token of its
    own (the correction, or a bonus token when all γ were accepted). α = 1 gives γ + 1.
    """
    alpha = _acceptance(acceptance)
    gamma = bounded_int(draft_tokens, "draft tokens", 1_000)
    if alpha == 1:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def speculative_speedup(acceptance: float, draft_tokens: int, draft_cost: float) -> float:
    """Expected walltime improvement over plain decoding: (1 - α^(γ+1)) / ((1 - α)(γc + 1)).

    Leviathan et al. 2023, Theorem 3.8; c is the draft's step time over the target's, and one
    verification of γ + 1 positions is taken to cost one target step (true while the step is
    bound by reading the weights, not by arithmetic).
    """
    if isinstance(draft_cost, bool) or not isinstance(draft_cost, (int, float)) or not 0 <= draft_cost < math.inf:
        raise UserError(f"draft cost must be a number >= 0 (the draft's step time over the target's), "
                        f"got {draft_cost!r}")
    gamma = bounded_int(draft_tokens, "draft tokens", 1_000)
    return speculative_expected_tokens_per_step(acceptance, gamma) / (gamma * float(draft_cost) + 1)
