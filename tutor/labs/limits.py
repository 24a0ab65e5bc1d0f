"""What a lab may ask of this machine: its memory and compute estimate against what is here.

Every lab's parameters have ranges, but a combination inside the ranges can still need 34 GB or
an hour. Before a lab allocates anything it calls `check_lab_fits` with its estimate
(from tutor.theory: activation bytes, parameter bytes, collective buffers x ranks; FLOPs), and
gets one UserError line with both figures when the estimate does not fit.

- Memory: the estimate against MEMORY_SHARE of the memory available now (psutil on a CPU, the
  CUDA driver's free memory on a GPU); the rest is left to the OS and the other programs.
- Time: the estimate's FLOPs at the rate `tensor-tutor bench matmul` last measured on this
  machine for the device and dtype (the results notebook), against LAB_MEASURED_SECONDS. Without
  a measurement, at the theoretical peak (tutor.hardware's spec table or its CPU formula), the
  fastest the lab could possibly run, against LAB_PEAK_SECONDS; the refusal then says "at least".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from tutor.bench.memory import MEMORY_SHARE, available_memory_bytes, collective_buffer_bytes
from tutor.errors import UserError
from tutor.formatting import format_bytes, format_decimal_bytes, format_duration, format_quantity, format_rate
from tutor.hardware.machine import Machine

if TYPE_CHECKING:
    from tutor.bench.notebook import Notebook

LAB_PEAK_SECONDS = 10.0  # a lesson's experiment: seconds, not minutes, even at peak speed
# The same wait measured rather than bounded: what a learner sits through for one lab run. A product
# choice, not a fact: a lab whose peak-speed time is 10 s typically measures a few times that.
LAB_MEASURED_SECONDS = 30.0


@dataclass(frozen=True)
class ComputeRate:
    """FLOP/s a lab's estimate is divided by, and where the figure comes from."""

    flops_per_s: float
    source: str     # "the fp32 rate `bench matmul` measured here on 2025-01-02" or "this cpu's fp32 peak"
    measured: bool  # False: a theoretical peak, so the time it gives is a lower bound


def peak_flops(device: str, dtype: str, machine: Machine | None = None) -> float | None:
    """This device's theoretical peak FLOP/s for `dtype` (fp32's where the dtype has none)."""
    if machine is None:
        from tutor.bench.environment import load_machine

        machine = load_machine()
    for name in (dtype, "fp32"):
        tflops = machine.peak_tflops(device, name)
        if tflops:
            return float(tflops) * 1e12
    return None


def lab_compute_rate(device: str, dtype: str, machine: Machine | None = None,
                     notebook: Notebook | None = None) -> ComputeRate | None:
    """The rate `bench matmul` last measured for `dtype` on `device` of this machine (the results
    notebook), else the theoretical peak; None when neither is known."""
    from tutor.bench.notebook import last_matmul_tflops, read_notebook

    if machine is None:
        from tutor.bench.environment import load_machine

        machine = load_machine()
    measured = last_matmul_tflops(notebook if notebook is not None else read_notebook(),
                                  device=device, dtype=dtype, machine=machine)
    if measured is not None:
        tflops, date = measured
        return ComputeRate(tflops * 1e12, f"the {dtype} rate `bench matmul` measured here on {date[:10]}", True)
    peak = peak_flops(device, dtype, machine)
    return ComputeRate(peak, f"this {device}'s {dtype} peak", False) if peak else None


def check_lab_fits(probe: str, *, memory_bytes: int, memory_what: str, fix: str, device: str = "cpu",
                   flops: float | None = None, dtype: str = "fp32",
                   available: int | None = None, peak: float | None = None, rate: ComputeRate | None = None) -> None:
    """Raise one UserError line when the lab's estimate does not fit this machine.

    `available` and the compute rate default to this machine's; tests pass recorded ones (`peak`: a
    theoretical peak in FLOP/s, `rate`: a ComputeRate)."""
    room = available_memory_bytes(device) if available is None else available
    if room is not None and memory_bytes > MEMORY_SHARE * room:
        raise UserError(
            f"{probe}: needs about {format_bytes(memory_bytes)} ({format_decimal_bytes(memory_bytes)}: {memory_what}); "
            f"{device} has {format_bytes(room)} available and a lab may use {MEMORY_SHARE:.0%} of it; {fix}")
    if flops is None:
        return
    if rate is None:
        rate = (ComputeRate(peak, f"this {device}'s {dtype} peak", False) if peak is not None
                else lab_compute_rate(device, dtype))
    if rate is None or rate.flops_per_s <= 0:
        return
    seconds = flops / rate.flops_per_s
    limit = LAB_MEASURED_SECONDS if rate.measured else LAB_PEAK_SECONDS
    if seconds <= limit:
        return
    figure = format_rate(rate.flops_per_s, "FLOP/s")
    if rate.measured:
        raise UserError(
            f"{probe}: about {format_quantity(flops, 'FLOP')}, about {format_duration(seconds)} at {figure} "
            f"({rate.source}; a lab may take {format_duration(limit)}); {fix}")
    raise UserError(
        f"{probe}: about {format_quantity(flops, 'FLOP')}, at least {format_duration(seconds)} at {rate.source} "
        f"of {figure} (a lab may take {format_duration(limit)} at peak); {fix}")


__all__ = ["LAB_MEASURED_SECONDS", "LAB_PEAK_SECONDS", "MEMORY_SHARE", "ComputeRate", "available_memory_bytes",
           "check_lab_fits", "collective_buffer_bytes", "lab_compute_rate", "peak_flops"]
