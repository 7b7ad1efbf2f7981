"""Rich tables of result rows: one formatter per column, text columns left, numbers right."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
from rich.markup import escape
from rich.table import Table
from rich.text import Text

# (header, row -> cell): plain text is shown as it is; a styled Text keeps its style
Column = tuple[str, Callable[[Any], str | Text]]


def pct(value: Any) -> str:
    """A fraction as a percentage with two decimals; empty for a missing value."""
    return "" if value is None or pd.isna(value) else f"{100 * value:.2f}"


def whole(value: Any) -> str:
    """A count (a step) without decimals; empty for a missing value."""
    return "" if value is None or pd.isna(value) else f"{value:.0f}"


def rows_table(title: str, df: pd.DataFrame, columns: Sequence[Column], text: set[str]) -> Table:
    """One table row per DataFrame row; headers in ``text`` are left-aligned and never wrap."""
    table = Table(title=title, title_justify="left")
    for name, _ in columns:
        left = name in text
        table.add_column(name, justify="left" if left else "right", no_wrap=left)
    for r in df.itertuples():
        table.add_row(*(_shown(cell(r)) for _, cell in columns))
    return table


def _shown(value: str | Text) -> str | Text:
    return value if isinstance(value, Text) else escape(value)  # data, not rich markup


def flag_text(value: Any) -> Text:
    """A result's flag (e.g. ``= majority``) in red; empty when there is none."""
    if value is None or (isinstance(value, float) and pd.isna(value)) or not str(value):
        return Text("")
    return Text(str(value), style="red")


# Beside every classification result: what a constant (majority-class) predictor and a uniform
# guess score on the same examples, and the flag (single-class set, result = majority rate).
BASELINE_COLUMNS: list[Column] = [
    ("majority %", lambda r: pct(getattr(r, "majority_rate", None))),
    ("chance %", lambda r: pct(getattr(r, "chance_rate", None))),
    ("flag", lambda r: flag_text(getattr(r, "flag", None))),
]
