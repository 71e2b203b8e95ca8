"""Small helpers the named experiments share for their markdown reports."""

from __future__ import annotations

import numpy as np
import pandas as pd


def md_table(df: pd.DataFrame, cols: list[str], fmt: dict | None = None) -> str:
    """A markdown table of ``df[cols]``; ``fmt`` maps a column to a ``str.format`` pattern;
    None / NaN cells print as ``-``."""
    fmt = fmt or {}
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for _, r in df.iterrows():
        cells = []
        for c in cols:
            v = r[c]
            if v is None or (isinstance(v, float) and np.isnan(v)):
                cells.append("-")
            else:
                cells.append(fmt[c].format(v) if c in fmt else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
