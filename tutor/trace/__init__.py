"""Building and running real transformers models: the traced step of `fit --trace` on fake tensors
(memory_trace), the calibration of architectures without a hand profile (arch_calibration, layer_count,
transformers_import), and `time`'s checks against real runs (step_verify on the CPU, device_verify on a
CUDA device, host_costs: a family's own framework code per layer; decode_loops: eager and CUDA-graph decode).

Measurements of the machine alone live in tutor.bench; this package builds models on top of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

_listeners: list[Callable[[str], None]] = []


@contextmanager
def announcing(listener: Callable[[str], None]) -> Iterator[None]:
    """While inside, `listener` hears one sentence before each trace that takes seconds (a config first counted,
    a setup first calibrated): a front end says what it waits for instead of hanging silent. Light to import:
    the command line wraps every command in it."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def announce(text: str) -> None:
    """Tell every listener (announcing) what is about to take seconds."""
    for listener in list(_listeners):
        listener(text)
