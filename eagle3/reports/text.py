"""How every report writes a value in a table cell: one rule for missing, NaN and yes/no."""

from __future__ import annotations

import math
from typing import Any

MISSING = "–"


def fmt(value: Any, digits: int = 2, suffix: str = "") -> str:
    """`None` -> "–", floats to `digits` places (NaN as "nan"), bools as yes / NO, else str()."""
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return ("nan" if math.isnan(value) else f"{value:.{digits}f}") + suffix
    return f"{value}{suffix}"


def md_cell(text: str) -> str:
    """`text` safe inside a markdown table cell (pipes escaped, one line)."""
    return str(text).replace("|", "\\|").replace("\n", " ")
