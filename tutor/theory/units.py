"""Byte units and the parsing of sizes and counts that users type.

GB = 1e9 bytes (datasheets, the ZeRO paper); GiB = 2**30 bytes (what CUDA and the OS report).
An "80 GB" H100 shows about 79.2 GiB to CUDA; the program always says which one it means.
Turning numbers into text is `tutor.formatting`'s job (format_bytes, format_count, ...).
"""

from __future__ import annotations

import math
import re

from tutor.errors import UserError

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40

_SIZE_UNITS = {
    "": 1, "b": 1,
    "k": KB, "kb": KB, "m": MB, "mb": MB, "g": GB, "gb": GB, "t": TB, "tb": TB,
    "kib": KiB, "mib": MiB, "gib": GiB, "tib": TiB,
}
_COUNT_SUFFIXES = {"": 1, "k": 10**3, "m": 10**6, "b": 10**9, "g": 10**9, "t": 10**12}
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)(?:e([+-]?\d+))?"


def parse_bytes(text: str) -> int:
    """Parse a memory size such as '24GiB', '80GB', '80 G' or '1e9' into a whole number of bytes.

    A bare suffix G/GB means 1e9 bytes, GiB means 2**30; a bare number is bytes.
    Raises UserError with a one-line message on anything else, including zero and negatives.
    """
    match = re.fullmatch(_NUMBER + r"\s*([a-zA-Z]*)", text.strip())
    if not match or match.group(3).lower() not in _SIZE_UNITS:
        raise UserError(f"not a memory size: {text!r} (try 24GiB, 80GB or 16e9)")
    value = float(f"{match.group(1)}e{match.group(2) or 0}")  # inf on overflow, rejected below
    size = value * _SIZE_UNITS[match.group(3).lower()]
    if not math.isfinite(size):
        raise UserError(f"memory size is too large to be a number: {text!r}")
    if size < 1:
        raise UserError(f"memory size must be at least one byte: {text!r}")
    return int(size)


def parse_count(text: str) -> int:
    """Parse a parameter count such as '7B', '70b', '1.5e9', '350M' or '124439808'.

    B (or G) means 1e9 (the "7B" in model names); raises UserError on anything else or < 1.
    """
    match = re.fullmatch(_NUMBER + r"\s*([a-zA-Z]?)", text.strip().replace("_", "").replace(",", ""))
    if not match or match.group(3).lower() not in _COUNT_SUFFIXES:
        raise UserError(f"not a parameter count: {text!r} (try 7B, 350M or 1.5e9)")
    value = float(f"{match.group(1)}e{match.group(2) or 0}") * _COUNT_SUFFIXES[match.group(3).lower()]
    if not math.isfinite(value):
        raise UserError(f"parameter count is too large to be a number: {text!r}")
    if value < 1:
        raise UserError(f"parameter count must be at least 1: {text!r}")
    return int(round(value))


def gib(n_bytes: float) -> float:
    """Bytes in GiB (2**30)."""
    return n_bytes / GiB


def gb(n_bytes: float) -> float:
    """Bytes in GB (1e9)."""
    return n_bytes / GB


def human_bytes(n_bytes: float) -> str:
    """A size in binary units for lesson prose ('15 GiB', '512 MiB'): tutor.formatting.format_bytes,
    under the name lesson expressions use (`units.human_bytes`)."""
    from tutor.formatting import format_bytes

    return format_bytes(n_bytes)


def human_count(n: float) -> str:
    """A count the way model cards write it, for lesson prose ('8.03B', '124M'):
    tutor.formatting.format_count, under the name lesson expressions use (`units.human_count`)."""
    from tutor.formatting import format_count

    return format_count(n)
