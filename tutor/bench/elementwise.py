"""What an elementwise kernel costs on a CPU core beyond its bytes: the two figures `time` needs besides a STREAM-like
triad for a model's elementwise work.

- Transcendental functions (kind "elementwise"): exp, erf and tanh take tens of instructions per element, so the
  kernels built on them (SiLU, GELU, tanh soft-capping, log_softmax and softmax, and their backward kernels) can be
  bound by the arithmetic, not the memory. Each function of tutor.theory.step_operations.ELEMENTWISE_FUNCTIONS is
  timed on ELEMENTS fp32 values (rows of ROW for the softmax family), in the caches, so the figure is the
  function's own rate: elements per second. Measured on one core of the dev machine: tanh 0.5 G/s, GELU-tanh 0.9,
  log_softmax 2.5, SiLU 4.6, where a unary op's 8 bytes at the 38 GB/s triad allow 4.75.
- First touch (kind "first_touch"): a block from the operating system (glibc maps blocks of 32 MiB and more fresh
  each time) has its pages faulted in and zeroed on the first write: a fill of a new FIRST_TOUCH_BYTES tensor
  against the same fill of one already mapped, bytes over the difference. Measured on the dev machine's VM:
  1.25 us per 4 KiB page (3.3 GB/s), ten times the fill itself.

Timed by the bench's timing core (tutor.bench.timing, like the triad it stands beside), on the CPU only; about
0.2 s in all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ELEMENTS = 1 << 18
ROW = 4096
REPEATS = 7
FIRST_TOUCH_BYTES = 64 * 2**20
FIRST_TOUCH_REPEATS = 3


@dataclass(frozen=True)
class ElementwiseResult:
    """One function's rate on data in the caches: elements per second."""

    device: str
    function: str
    elements: int
    elements_per_s: float
    iters: int
    kind: str = "elementwise"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": self.device, "dtype": "fp32", "function": self.function,
                "elements": self.elements, "elements_per_s": self.elements_per_s, "iters": self.iters}


@dataclass(frozen=True)
class FirstTouchResult:
    """Bytes per second of first-touching freshly mapped memory, beyond writing mapped memory."""

    device: str
    bytes: int
    gbps_median: float
    iters: int
    kind: str = "first_touch"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": self.device, "bytes": self.bytes, "gbps_median": self.gbps_median,
                "iters": self.iters, "bytes_counting": "a new block's bytes over (fill of a new block - fill of a "
                                                      "mapped one)"}


def function_calls(torch) -> dict[str, Any]:
    """The callable of each function of ELEMENTWISE_FUNCTIONS on fresh fp32 inputs, as torch runs it for a model."""
    F = torch.nn.functional
    aten = torch.ops.aten
    x, grad = torch.randn(ELEMENTS), torch.randn(ELEMENTS)
    rows, grad_rows = x.view(-1, ROW), grad.view(-1, ROW)
    log_probs = F.log_softmax(rows, -1)
    return {
        "silu": lambda: F.silu(x),
        "silu backward": lambda: aten.silu_backward(grad, x),
        "gelu": lambda: F.gelu(x),
        "gelu backward": lambda: aten.gelu_backward(grad, x),
        "gelu tanh": lambda: F.gelu(x, approximate="tanh"),
        "gelu tanh backward": lambda: aten.gelu_backward(grad, x, approximate="tanh"),
        "tanh": lambda: torch.tanh(x),
        "log_softmax": lambda: F.log_softmax(rows, -1),
        "log_softmax backward": lambda: aten._log_softmax_backward_data(grad_rows, log_probs, -1, torch.float32),
        "softmax": lambda: F.softmax(rows, -1),
    }


def _median_seconds(fn, repeats: int) -> float:
    from tutor.bench.timing import time_case

    return max(time_case(fn, iters=repeats).median_s, 1e-9)


def elementwise_rates(device: str = "cpu") -> list[Any]:
    """Each function's elements per second and the first-touch rate (module docstring); nothing off the CPU."""
    if device != "cpu":
        return []
    import torch

    results: list[Any] = []
    with torch.no_grad():
        for name, call in function_calls(torch).items():
            seconds = _median_seconds(call, REPEATS)
            results.append(ElementwiseResult(device, name, ELEMENTS, ELEMENTS / seconds, REPEATS))
        elements = FIRST_TOUCH_BYTES // 4
        mapped = torch.empty(elements)
        written = _median_seconds(lambda: mapped.fill_(1.0), FIRST_TOUCH_REPEATS)
        fresh = _median_seconds(lambda: torch.empty(elements).fill_(1.0), FIRST_TOUCH_REPEATS)
        if fresh > written:
            results.append(FirstTouchResult(device, FIRST_TOUCH_BYTES, FIRST_TOUCH_BYTES / (fresh - written) / 1e9,
                                            FIRST_TOUCH_REPEATS))
    return results
