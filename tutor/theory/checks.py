"""Argument checks shared by the formulas: impossible input becomes a one-line UserError."""

from __future__ import annotations

from tutor.errors import UserError


def positive_int(value: object, name: str) -> int:
    """`value` if it is a whole number >= 1 (bools refused); otherwise a UserError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{name} must be a whole number of at least 1, got {value!r}")
    return value


MAX_LAYERS = 10_000
"""The most transformer layers a formula takes (tutor.theory.models reads configs to the same bound):
the deepest published LLMs have under 200, and one entry per layer or stage must stay quick to build."""
MAX_DIMENSION = 2**31
"""The largest model dimension (heads, FFN width, vocabulary) a formula takes: the vocabulary bound of
tutor.theory.models; a divisor search over it stays under 50,000 steps."""


def bounded_int(value: int, name: str, most: int) -> int:
    """positive_int(value, name), also refusing values above `most` (a UserError naming the bound), so a
    formula whose work grows with the argument (a list per stage, a divisor search) always ends quickly."""
    value = positive_int(value, name)
    if value > most:
        raise UserError(f"{name} must be at most {most:,}, got {value:,}")
    return value
