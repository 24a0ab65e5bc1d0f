"""Byte units and the parsing of sizes and counts that users type.

GB = 1e9 bytes (datasheets, the ZeRO paper); GiB = 2**30 bytes (what CUDA and the OS report).
An "80 GB" H100 shows about 79.2 GiB to CUDA; the program always says which one it means.
Turning numbers into text is `tutor.formatting`'s job (format_bytes, format_count, ...).
"""

from __future__ import annotations

from tutor.errors import UserError

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40

def parse_bytes(text: str) -> int:
    """Parse a memory size such as '24GiB', '80GB', '80 G', '1e9' or '2*80GB' into a whole number of bytes.

    Read by tutor.theory.number_reader as a size in bytes: a bare suffix G/GB means 1e9 bytes, GiB
    means 2**30; a bare number is bytes. Raises UserError with a one-line message on anything else,
    including zero and negatives.
    """
    from tutor.theory.number_reader import read_number

    try:
        size = read_number(str(text), "B").value
    except UserError as error:
        if "too large" in str(error):
            raise UserError(f"memory size is too large to be a number: {text!r}") from None
        raise UserError(f"not a memory size: {text!r} (try 24GiB, 80GB or 16e9)") from None
    if size < 1:
        raise UserError(f"memory size must be at least one byte: {text!r}")
    return int(round(size))


def parse_count(text: str) -> int:
    """Parse a parameter count such as '7B', '70b', '1.5e9', '350M', '15 trillion' or '124439808'.

    Read by tutor.theory.number_reader as a count: B (or G) means 1e9 (the "7B" in model names);
    raises UserError on anything else (a size or a time included) or < 1.
    """
    from tutor.theory.number_reader import read_number

    try:
        value = read_number(str(text).replace(",", ""), "count").value
    except UserError as error:
        if "too large" in str(error):
            raise UserError(f"parameter count is too large to be a number: {text!r}") from None
        raise UserError(f"not a parameter count: {text!r} (try 7B, 350M or 1.5e9)") from None
    if value < 1:
        raise UserError(f"parameter count must be at least 1: {text!r}")
    return int(round(value))


def gib(n_bytes: float) -> float:
    """Bytes in GiB (2**30)."""
    return n_bytes / GiB


def gb(n_bytes: float) -> float:
    """Bytes in GB (1e9)."""
    return n_bytes / GB
