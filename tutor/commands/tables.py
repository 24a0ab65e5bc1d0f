"""Rich tables that survive an 80-column terminal and a pipe: the ids a user must type stay whole.

Rich shrinks the columns of a table wider than the terminal, ids included (`training-loop/one-training-st…`),
and a column's min_width is re-applied after that shrinking, so the table overflows and the terminal cuts it.
An id column is `no_wrap` instead: Rich then narrows only the other columns (wrapping prose at spaces),
and cuts an id only where even the ids alone do not fit.
"""

from __future__ import annotations

from typing import Literal, TypedDict


class ColumnOptions(TypedDict, total=False):
    """The keyword options of rich's Table.add_column that these tables set."""

    no_wrap: bool
    overflow: Literal["fold", "crop", "ellipsis", "ignore"]


ID_COLUMN: ColumnOptions = {"no_wrap": True, "overflow": "fold"}
"""Options of a column of ids (lesson ids, presets, lab names, GPU keys)."""

PROSE_COLUMN: ColumnOptions = {"overflow": "fold"}
"""Options of a column of names or sentences: wrapped at spaces, a word longer than the column folded, never cut."""

