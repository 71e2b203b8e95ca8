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


def write_report(results_dir, name: str, notes_stem: str, md: list[str], quick: bool) -> None:
    """Write ``results_dir/<name>.md`` from the report lines ``md`` (with the hand-written
    ``<notes_stem>_notes.md`` appended unless ``quick``) and print it."""
    from pathlib import Path

    notes = Path(results_dir) / f"{notes_stem}_notes.md"
    if not quick and notes.exists():
        md = [*md, "\n" + notes.read_text()]
    (Path(results_dir) / f"{name}.md").write_text("\n".join(md))
    print("\n".join(md))
