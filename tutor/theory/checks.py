"""Argument checks shared by the formulas: impossible input becomes a one-line UserError."""

from __future__ import annotations

from tutor.errors import UserError


def positive_int(value: object, name: str) -> int:
    """`value` if it is a whole number >= 1 (bools refused); otherwise a UserError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"{name} must be a whole number of at least 1, got {value!r}")
    return value
