"""The rate of torch's causal attention kernel on a CPU, by sequence length (kind "attention").

`F.scaled_dot_product_attention` on a CPU runs a flash-style kernel (aten _scaled_dot_product_flash_attention_for_cpu:
blocks of queries against blocks of keys, an online softmax, the tiles above the diagonal skipped), whose small
blocked products and per-score exp run well below a square matmul's rate. Measured on one core of the dev machine,
FLOPs counted as tutor.theory.step_operations counts them (forward 4·b·h·s²·d / 2 causal, backward 2.5x that): 33
GFLOP/s at s = 128, 42 at 512, 63-70 at 2048 (d = 64 or 128 alike) against 107 for the fp32 matmul sweep. So the
kernel is timed, forward and backward, at SEQUENCES with HEAD_DIM, the heads chosen so that each call does about
the same work; `time` reads the rate at a step's sequence length between them. About 0.5 s on one core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SEQUENCES = (128, 512, 2048)
HEAD_DIM = 64
WORK = 1 << 21  # heads x s²: one head at 2048, 128 heads at 128
REPEATS = 3


@dataclass(frozen=True)
class AttentionResult:
    """SDPA's causal kernel at one sequence length: FLOP/s as the theory counts the pass."""

    device: str
    phase: str  # "forward" or "backward"
    seq: int
    heads: int
    head_dim: int
    tflops_median: float
    iters: int
    kind: str = "attention"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": self.device, "dtype": "fp32", "phase": self.phase, "seq": self.seq,
                "heads": self.heads, "head_dim": self.head_dim, "tflops_median": self.tflops_median,
                "iters": self.iters, "flops_counting": "forward 4·h·s²·d / 2 (causal), backward 2.5x the forward"}


def causal_attention_flops(heads: int, seq: int, head_dim: int) -> float:
    """Forward FLOPs of causal attention as tutor.theory.step_operations counts them: q·kᵀ and p·v, half each."""
    return 4 * heads * seq * seq * head_dim / 2


def attention_rates(device: str = "cpu") -> list[AttentionResult]:
    """The kernel's forward and backward rate at each of SEQUENCES (module docstring); nothing off the CPU."""
    if device != "cpu":
        return []
    import torch

    from tutor.bench.timing import time_case

    sdpa = torch.nn.functional.scaled_dot_product_attention
    results = []
    for seq in SEQUENCES:
        heads = max(1, WORK // (seq * seq))
        q, k, v = (torch.randn(1, heads, seq, HEAD_DIM, requires_grad=True) for _ in range(3))
        grad = torch.randn(1, heads, seq, HEAD_DIM)
        flops = causal_attention_flops(heads, seq, HEAD_DIM)
        with torch.no_grad():
            forward = time_case(lambda: sdpa(q, k, v, is_causal=True), iters=REPEATS).median_s
        state: dict[str, Any] = {}

        def setup() -> None:  # the backward alone: its forward runs before it, untimed
            q.grad = k.grad = v.grad = None
            state["out"] = sdpa(q, k, v, is_causal=True)

        backward = time_case(lambda: state["out"].backward(grad), iters=REPEATS, setup=setup).median_s
        results.append(AttentionResult(device, "forward", seq, heads, HEAD_DIM, flops / forward / 1e12, REPEATS))
        results.append(AttentionResult(device, "backward", seq, heads, HEAD_DIM, 2.5 * flops / backward / 1e12,
                                       REPEATS))
    return results
