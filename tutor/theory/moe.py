"""Mixture-of-experts routing: how many experts a batch touches, load balance and capacity.

Sources: Fedus, Zoph, Shazeer, "Switch Transformers", arXiv 2101.03961 §2.2 (expert capacity,
eq. 3; load-balancing loss, eq. 4-6); Lepikhin et al. "GShard" arXiv 2006.16668 (top-2 gating
with capacity); DeepSpeed-MoE `deepspeed/moe/sharded_moe.py` `_capacity` (rounding up).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from tutor.errors import UserError


def _count(value: int | float, name: str, *, minimum: int = 1) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 540.35e9 typed as a float is still a whole count
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise UserError(f"{name} must be a whole number of at least {minimum}, got {value!r}")
    return value


def _routing(top_k: int, num_experts: int) -> tuple[int, int]:
    num_experts = _count(num_experts, "number of experts")
    top_k = _count(top_k, "top_k (experts per token)")
    if top_k > num_experts:
        raise UserError(f"top_k {top_k} exceeds the {num_experts} experts (use top_k <= {num_experts})")
    return top_k, num_experts


def experts_active_fraction(top_k: int, num_experts: int) -> Fraction:
    """Share of routed experts one token uses: k / E (Mixtral 2/8, DeepSeek-V3 8/256)."""
    top_k, num_experts = _routing(top_k, num_experts)
    return Fraction(top_k, num_experts)


def expected_distinct_experts_touched(tokens: int, top_k: int, num_experts: int) -> float:
    """Expected number of different experts a batch of tokens routes to: E·(1 − (1 − k/E)^T).

    Assumes uniform, independent routing: each token picks a uniformly random set of k distinct
    experts, independently of the other tokens, so one expert is missed by one token with
    probability 1 − k/E and by all T tokens with (1 − k/E)^T. Real routers are skewed, which
    touches fewer. It is why decode at batch 1 reads only the k active experts' weights while a
    large batch reads nearly all of them (DeepSeek-V3, arXiv 2412.19437, §2: 37B of 671B parameters
    active per token).
    """
    tokens = _count(tokens, "tokens", minimum=0)
    top_k, num_experts = _routing(top_k, num_experts)
    miss = Fraction(num_experts - top_k, num_experts)
    if tokens <= 4096:  # exact, so that e.g. one token touches exactly k experts
        return float(num_experts * (1 - miss**tokens))
    return num_experts * -math.expm1(tokens * math.log1p(-top_k / num_experts)) if miss else float(num_experts)


def load_balancing_loss(
    fraction_tokens: Sequence[float],
    mean_router_prob: Sequence[float],
    num_experts: int,
    *,
    alpha: float = 1.0,
) -> float:
    """Switch Transformer auxiliary loss α·N·Σ f_i·P_i (Fedus et al. arXiv 2101.03961, eq. 4).

    f_i is the fraction of tokens dispatched to expert i (eq. 5), P_i the mean router probability
    for expert i (eq. 6). Under perfectly uniform routing (f_i = P_i = 1/N) it equals α; the paper
    uses α = 0.01. With top-k dispatch counted per token (as HF Mixtral does) the f_i sum to k and
    the uniform value is α·k.
    """
    num_experts = _count(num_experts, "number of experts")
    f, p = list(fraction_tokens), list(mean_router_prob)
    if len(f) != num_experts or len(p) != num_experts:
        raise UserError(
            f"need one token fraction and one router probability per expert: "
            f"got {len(f)} and {len(p)} for {num_experts} experts"
        )
    for values, name in ((f, "token fraction"), (p, "router probability")):
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, float, Fraction)) or not 0 <= value <= 1:
                raise UserError(f"each {name} must be between 0 and 1, got {value!r}")
    if not math.isclose(float(sum(p)), 1.0, rel_tol=1e-6, abs_tol=1e-9):
        raise UserError(f"router probabilities must sum to 1 over the experts, they sum to {float(sum(p)):.6g}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha < 0:
        raise UserError(f"alpha must be a number >= 0, got {alpha!r}")
    return alpha * num_experts * math.fsum(float(fi) * float(pi) for fi, pi in zip(f, p, strict=True))


def expert_capacity(tokens: int, num_experts: int, top_k: int = 1, capacity_factor: float = 1.0) -> int:
    """Token slots per expert: ceil(k · tokens / experts × capacity factor).

    Switch Transformers eq. 3 (k = 1): (tokens per batch / number of experts) × capacity factor;
    GShard top-2 and DeepSpeed-MoE's `_capacity` scale by k and round up. Tokens routed to a full
    expert are dropped (they skip the layer through the residual connection).
    """
    tokens = _count(tokens, "tokens")
    top_k, num_experts = _routing(top_k, num_experts)
    if isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float)) or not math.isfinite(
        capacity_factor
    ) or capacity_factor <= 0:
        raise UserError(f"capacity factor must be a positive number such as 1.0 or 1.25, got {capacity_factor!r}")
    factor = Fraction(repr(capacity_factor)) if isinstance(capacity_factor, float) else Fraction(capacity_factor)
    return math.ceil(Fraction(top_k * tokens, num_experts) * factor)


@dataclass(frozen=True)
class CapacityOutcome:
    """What happens to a batch's expert assignments when each expert has `capacity` slots."""

    capacity: int
    processed: int
    dropped: int

    @property
    def drop_fraction(self) -> float:
        total = self.processed + self.dropped
        return self.dropped / total if total else 0.0


def tokens_dropped(expert_loads: Sequence[int], capacity: int) -> CapacityOutcome:
    """Assignments over capacity are dropped: Σ max(0, load_i − capacity) (Switch §2.2, Figure 3)."""
    capacity = _count(capacity, "expert capacity", minimum=0)
    loads = [_count(load, "tokens routed to an expert", minimum=0) for load in expert_loads]
    if not loads:
        raise UserError("need the number of tokens routed to each expert")
    dropped = sum(max(0, load - capacity) for load in loads)
    return CapacityOutcome(capacity=capacity, processed=sum(loads) - dropped, dropped=dropped)
