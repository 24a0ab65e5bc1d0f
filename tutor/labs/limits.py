"""What a lab may ask of this machine: its memory and compute estimate against what is here.

Every lab's parameters have ranges, but a combination inside the ranges can still need 34 GB or
an hour (issue 11). Before a lab allocates anything it calls `check_lab_fits` with its estimate
(from tutor.theory: activation bytes, parameter bytes, collective buffers x ranks; FLOPs), and
gets one UserError line with both figures when the estimate does not fit.

- Memory: the estimate against MEMORY_SHARE of the memory available now (psutil on a CPU, the
  CUDA driver's free memory on a GPU); the rest is left to the OS and the other programs.
- Time: the estimate's FLOPs at this device's theoretical peak for the dtype (tutor.hardware's
  spec table or its CPU formula), the fastest the lab could possibly run, against
  LAB_PEAK_SECONDS. Real kernels reach a fraction of peak (`tensor-tutor bench matmul` measures
  it here), so a lab passing this check can still take a few times longer.
"""

from __future__ import annotations

from tutor.errors import UserError
from tutor.formatting import format_bytes, format_decimal_bytes, format_duration, format_quantity, format_rate

MEMORY_SHARE = 0.8
LAB_PEAK_SECONDS = 10.0  # a lesson's experiment: seconds, not minutes, even at peak speed


def available_memory_bytes(device: str = "cpu") -> int | None:
    """Bytes a lab can allocate on `device` now: psutil's `available` (CPU), the driver's free
    memory (CUDA); None when it cannot be read."""
    if device.startswith("cuda"):
        try:
            import torch

            free, _total = torch.cuda.mem_get_info(torch.device(device))
        except (ImportError, RuntimeError, AssertionError):
            return None
        return int(free)
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def peak_flops(device: str, dtype: str) -> float | None:
    """This device's theoretical peak FLOP/s for `dtype` (fp32's where the dtype has none)."""
    from tutor.bench.environment import load_machine

    machine = load_machine()
    for name in (dtype, "fp32"):
        tflops = machine.peak_tflops(device, name)
        if tflops:
            return float(tflops) * 1e12
    return None


def collective_buffer_bytes(size: int, ranks: int) -> int:
    """Bytes one rank holds for one collective case of `size` bytes: the full buffer plus its
    1/ranks shard (all_gather's input, reduce_scatter's output), as tutor.bench.collective
    allocates them (torch.distributed's tensor forms)."""
    return size + size // ranks


def check_lab_fits(probe: str, *, memory_bytes: int, memory_what: str, fix: str, device: str = "cpu",
                   flops: float | None = None, dtype: str = "fp32",
                   available: int | None = None, peak: float | None = None) -> None:
    """Raise one UserError line when the lab's estimate does not fit this machine.

    `available` and `peak` default to this machine's (tests pass recorded ones)."""
    room = available_memory_bytes(device) if available is None else available
    if room is not None and memory_bytes > MEMORY_SHARE * room:
        raise UserError(
            f"{probe}: needs about {format_bytes(memory_bytes)} ({format_decimal_bytes(memory_bytes)}: {memory_what}); "
            f"{device} has {format_bytes(room)} available and a lab may use {MEMORY_SHARE:.0%} of it; {fix}")
    if flops is None:
        return
    rate = peak_flops(device, dtype) if peak is None else peak
    if not rate:
        return
    seconds = flops / rate
    if seconds > LAB_PEAK_SECONDS:
        raise UserError(
            f"{probe}: about {format_quantity(flops, 'FLOP')}, at least {format_duration(seconds)} at this {device}'s "
            f"{dtype} peak of {format_rate(rate, 'FLOP/s')} (a lab may take {format_duration(LAB_PEAK_SECONDS)} at peak); "
            f"{fix}")
