"""`--json` output: strict JSON (RFC 8259), which has no NaN or Infinity.

Python's json module writes `Infinity` and `NaN` for non-finite floats by default, which jq, JavaScript's
JSON.parse and most other readers refuse; a figure that is not a number is `null` here instead.
"""

from __future__ import annotations

import json
import math
from typing import Any

import click


def finite_or_null(value: Any) -> Any:
    """`value` with every non-finite float (inf, -inf, nan) inside it replaced by None."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_null(item) for item in value]
    return value


def json_text(data: Any, *, indent: int | None = 2, default: Any = None) -> str:
    """`data` as strict JSON text (allow_nan=False after finite_or_null: a NaN left would be a bug, not output)."""
    return json.dumps(finite_or_null(data), indent=indent, default=default, allow_nan=False)


def echo_json(data: Any, *, indent: int | None = 2, default: Any = None) -> None:
    """Print `data` as strict JSON on stdout."""
    click.echo(json_text(data, indent=indent, default=default))
