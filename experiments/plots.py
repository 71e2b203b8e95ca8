"""Figures of a collected kvsim sweep (matplotlib), shared by the notebooks and ``kvsim-plot``.

Input is what :mod:`experiments.collect` writes: ``runs.parquet`` (one row per run: override,
config and flattened summary columns such as ``tiers.host_gib``, ``codec``, ``hit_ratio.host``,
``ttft_s.p90``) and the per-run tables (``requests/``, ``steps/``, ``rounds/``, ``transfers/``)
whose rows carry ``run_id`` and the override columns.

Every ``plot_*`` function takes DataFrames, draws into a new figure and returns it; nothing is
shown or saved (``fig.savefig(path)``, or :func:`save`, which also writes the table the figure
was drawn from beside it as CSV: :func:`figure_data`). A missing column raises
:class:`PlotError` naming the column, the table and the columns that are there.

Each figure answers one question, its title (the ``FIGURES`` table lists them; docs/FIGURES.md
shows a reference of each), with what it compares on the title's second line; legends sit
outside the data; curves differ in colour and line style (:func:`group_styles`); axes name
their units: seconds or milliseconds for times, GiB / MiB for bytes (2**30 / 2**20), ratios in
[0, 1], swept columns with their meaning (:func:`axis_label`).

Command line (headless, Agg backend)::

    kvsim-plot ttft-decomposition COLLECTED_DIR --out ttft_parts.png   # one bar per run
    kvsim-plot ttft-cdf COLLECTED_DIR --by codec --where tiers.host_gib=4 --out ttft_cdf.png
    kvsim-plot hit-by-tier COLLECTED_DIR --x tiers.host_gib --hue codec --out hit.png
    kvsim-plot blocks-freed COLLECTED_DIR --out freed.png --dpi 100   # + freed.csv, freed.held.csv
    kvsim-plot --help                     # all figures and options

Without ``--by`` (``--x`` / ``--hue``) a figure separates runs by the override keys that differ
between them (:func:`default_by`, :func:`default_x_hue`): one curve or bar per run of a sweep.
Run-level figures (``hit-by-tier``, ``disk-share``, ``ttft-vs``) draw one run per (``--x``,
``--hue``) cell: ``--x`` and ``--hue`` must differ, and runs sharing a cell (another parameter
varies) are an error unless ``--agg`` (mean, median, min or max of their values) combines them
(a warning says how many).
The per-request / per-round / per-step figures draw one curve (bar) per ``--by`` group; when a
group holds runs that differ in another override key, it is drawn pooled and a warning names
the key and how many runs each group pools (``--where KEY=VALUE`` or ``--by ...,KEY`` separates
them). Runs with nothing to draw (no finished request, a null summary value) are named in a
warning. Warnings are :class:`PlotWarning` (``kvsim-plot`` prints them on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

TIERS = ("gpu", "host", "disk")
TIER_COLORS = {"gpu": "#4C72B0", "host": "#DD8452", "disk": "#55A868"}
# TTFT parts (columns of the requests table) in the order they happen; see ttft_parts for the
# derived onboard_wait_s and ttft_decomposition for "other".
TTFT_PARTS = ("queue_s", "onboard_host_s", "onboard_disk_s", "prefill_s")
TTFT_PART_COLORS = {"queue_s": "#8172B3", "onboard_s": "#DD8452", "onboard_host_s": "#DD8452",
                    "onboard_disk_s": "#55A868", "onboard_wait_s": "#C44E52", "prefill_s": "#4C72B0",
                    "other": "#BBBBBB"}
TTFT_PART_LABELS = {"queue_s": "queue (waiting for admission)",
                    "onboard_s": "onboarding",
                    "onboard_host_s": "host→GPU copy (host hits, and disk pages\nstaged through host DRAM)",
                    "onboard_disk_s": "disk→host read",
                    "onboard_wait_s": "onboard wait (write-back, layer stall)",
                    "prefill_s": "prefill"}
# How runs sharing an (x, hue) cell may be combined (--agg): each is a statistic of ratios and
# percentiles that stays one (a sum of hit ratios or of p99s over runs would not be).
AGGS = ("mean", "median", "min", "max")


class PlotError(ValueError):
    """Bad input for a figure: missing column, empty selection, ambiguous grouping or bad dir.
    ``cli``: the message in ``kvsim-plot``'s words (its options instead of the function's
    arguments), when they differ."""

    def __init__(self, msg: str, cli: str | None = None):
        super().__init__(msg)
        self.cli = cli


class PlotWarning(UserWarning):
    """A figure drawn from less than, or more than, it seems to show: runs left out (no value to
    draw) or runs pooled into one curve. ``kvsim-plot`` prints each on stderr."""


# ---------------------------------------------------------------------------------------------
# Loading


@dataclass
class Collected:
    """A collected sweep directory: ``runs`` (DataFrame) and lazy access to its tables."""

    path: Path
    runs: pd.DataFrame

    def tables(self) -> list[str]:
        """Names of the per-run tables present (``requests``, ``steps``, ...)."""
        return sorted(p.name for p in self.path.iterdir() if p.is_dir() and not p.name.startswith("."))

    def table(self, name: str, columns: Sequence[str] | None = None,
              run_columns: Sequence[str] = ()) -> pd.DataFrame:
        """Read table ``name`` (all runs) into pandas; ``job`` comes back as int.

        ``run_columns``: columns of ``runs`` to add by ``run_id`` (e.g. ``["cache.block_size"]``)
        when they are not already in the table. Raises PlotError if the table does not exist.
        """
        import pyarrow.dataset as ds

        p = self.path / name
        if not p.is_dir():
            raise PlotError(f"{p}: no table {name!r} in this collection (tables: "
                            f"{', '.join(self.tables()) or 'none'}); the runs did not write "
                            f"{name}.parquet")
        dset = ds.dataset(p, format="parquet", partitioning="hive")
        cols = None
        if columns is not None:
            want = list(dict.fromkeys(["run_id", "job", *columns]))
            missing = [c for c in want if c not in dset.schema.names and c not in self.runs.columns]
            if missing:
                raise PlotError(f"{p}: no column(s) {missing}; columns: {dset.schema.names}")
            cols = [c for c in want if c in dset.schema.names]
            run_columns = list(run_columns) + [c for c in want if c not in dset.schema.names]
        df = dset.to_table(columns=cols).to_pandas()
        if "job" in df.columns:
            df["job"] = df["job"].astype("int64")
        return add_run_columns(df, self.runs, run_columns)


def load_collected(path) -> Collected:
    """Open a directory written by ``kvsim-collect`` (it must hold ``runs.parquet``).

    Raises PlotError naming the path if it is missing or is a sweep dir not yet collected.
    """
    p = Path(path)
    rp = p / "runs.parquet"
    if not rp.is_file():
        hint = ""
        if (p / "collected" / "runs.parquet").is_file():
            hint = f"; did you mean {p / 'collected'}?"
        elif p.is_dir():
            hint = f"; run `kvsim-collect {p}` first to collect a sweep directory"
        raise PlotError(f"{rp}: not found (not a kvsim-collect output directory){hint}")
    runs = pd.read_parquet(rp)
    return Collected(p, runs)


def add_run_columns(df: pd.DataFrame, runs: pd.DataFrame, columns: Iterable[str]) -> pd.DataFrame:
    """Return ``df`` with ``columns`` of ``runs`` joined on ``run_id`` (those not already in df)."""
    cols = [c for c in dict.fromkeys(columns) if c not in df.columns]  # (each once)
    if not cols:
        return df
    _require(runs, cols, "runs")
    _require(df, ["run_id"], "table")
    return df.merge(runs[["run_id", *cols]], on="run_id", how="left")


# ---------------------------------------------------------------------------------------------
# Helpers


def _require(df: pd.DataFrame, cols: Iterable[str], what: str) -> None:
    missing = [c for c in cols if c not in df.columns]
    if missing:
        import difflib

        have = sorted(map(str, df.columns))
        near = sorted({m for c in missing for m in difflib.get_close_matches(c, have, n=6, cutoff=0.5)
                       } | {h for c in missing for h in have if h.startswith(c.split(".")[0] + ".")})
        shown = near[:20] if near else have[:30]
        raise PlotError(f"{what}: no column(s) {missing}; "
                        f"{'similar' if near else 'some'} columns of {len(have)}: {shown}")


def _as_list(by) -> list[str]:
    if by is None:
        return []
    if isinstance(by, str):
        by = by.split(",")
    return list(dict.fromkeys(c for c in by if c))  # (a column named twice counts once)


def _labels(df: pd.DataFrame, by: list[str]) -> pd.Series:
    """One label per row from the ``by`` columns (``"nvfp4"`` or ``"h2o / forward_pack"``)."""
    if not by:
        return pd.Series(["all"] * len(df), index=df.index)
    # (object first: a categorical column, as a hive-partitioned table reads, keeps a null as a
    # float NaN through astype(str); a null is labelled "null", the run did not record a value)
    cols = df[by].astype(object)
    cols = cols.where(cols.notna(), "null").astype(str)
    out = cols[by[0]].astype(object)
    for c in by[1:]:  # (column by column: a row-wise join is slow on large tables)
        out = out + " / " + cols[c].astype(object)
    return out


def _label_order(df: pd.DataFrame, by: list[str]) -> list[str]:
    """Group labels ordered by their ``by`` values (numbers numerically: 64 before 128)."""
    if not by:
        return ["all"]
    combos = df[by].drop_duplicates()
    try:
        combos = combos.sort_values(by, kind="stable")
    except TypeError:
        combos = combos.astype(str).sort_values(by, kind="stable")
    return list(_labels(combos, by))


def _sorted_unique(values: pd.Series) -> list:
    vals = pd.unique(values.dropna())
    try:
        return sorted(vals)
    except TypeError:
        return sorted(vals, key=str)


def _check_agg(agg: str | None, what: str) -> None:
    """PlotError unless ``agg`` is None or one of :data:`AGGS`."""
    if agg is not None and agg not in AGGS:
        raise PlotError(f"{what}: agg (--agg) {agg!r}; expected one of {', '.join(AGGS)}")


def _check_x_hue(x: str, hue: str, agg: str | None, what: str) -> None:
    """PlotError when ``x`` and ``hue`` are one column or ``agg`` is not one of :data:`AGGS`."""
    if x == hue:
        raise PlotError(f"{what}: x (--x) and hue (--hue) are both {x!r}; pick another column for "
                        f"one of them (hue draws one curve / panel per value)")
    _check_agg(agg, what)


def _run_names(runs: pd.DataFrame, limit: int = 6) -> str:
    """``"run 0 [model.max_model_len=100], run 3 [...]"``: run ids with their overrides (bookkeeping
    overrides such as ``sim.progress`` left out) when ``runs`` has an ``overrides`` column."""
    from experiments.collect_tables import BOOKKEEPING_PREFIXES, override_key

    names = []
    for _, r in runs.head(limit).iterrows():
        name = f"run {r['run_id'] if 'run_id' in runs.columns else r.name}"
        if "overrides" in runs.columns and isinstance(r["overrides"], str):
            ovs = [o for o in r["overrides"].split()
                   if (kv := override_key(o)) is None or not kv[0].startswith(BOOKKEEPING_PREFIXES)]
            name += f" [{' '.join(ovs)}]"
        names.append(name)
    more = f" and {len(runs) - limit} more" if len(runs) > limit else ""
    return ", ".join(names) + more


def _warn_null_runs(runs: pd.DataFrame, cols: list[str], what: str) -> None:
    """A PlotWarning naming the runs that have no value (null) in some of ``cols``: nothing is
    drawn for those values (e.g. ``ttft_s.p50`` of a run in which no request finished)."""
    null = runs[cols].isna()
    bad = null.any(axis=1)
    if not bad.any():
        return
    for miss, idx in runs[bad].groupby(null[bad].apply(tuple, axis=1)).groups.items():
        sub = runs.loc[idx]
        cols_missing = [c for c, m in zip(cols, miss) if m]
        why = ""
        if "requests_finished" in sub.columns and (sub["requests_finished"] == 0).all():
            why = "; no request finished in them"
        warnings.warn(f"{what}: left out {len(sub)} run(s) with no value of "
                      f"{', '.join(cols_missing)} (null in runs.parquet{why}): {_run_names(sub)}",
                      PlotWarning, stacklevel=3)


def _warn_runs_without_ttft(requests: pd.DataFrame, kept: pd.DataFrame, what: str) -> None:
    """A PlotWarning naming the runs of ``requests`` (by ``run_id``) of which no row is in
    ``kept`` (the finished requests with a TTFT), with each one's count of requests by status."""
    if "run_id" not in requests.columns:
        return
    gone = sorted(set(requests["run_id"].dropna()) - set(kept["run_id"].dropna()), key=str)
    if not gone:
        return
    parts = []
    for rid in gone[:6]:
        rows = requests[requests["run_id"] == rid]
        st = ""
        if "status" in rows.columns:
            st = ": " + ", ".join(f"{n} {s}" for s, n in rows["status"].value_counts().items())
        parts.append(f"run {rid} ({len(rows)} requests{st})")
    more = f" and {len(gone) - 6} more" if len(gone) > 6 else ""
    warnings.warn(f"{what}: left out {len(gone)} run(s) with no finished request with a TTFT: "
                  f"{', '.join(parts)}{more}", PlotWarning, stacklevel=3)


def _one_per_cell(runs: pd.DataFrame, keys: list[str], agg: str | None, what: str) -> pd.DataFrame:
    """Rows of ``runs`` with one row per ``keys`` combination; duplicates need ``agg`` (one of
    :data:`AGGS`)."""
    _check_agg(agg, what)
    dup = runs.duplicated(keys, keep=False)
    if dup.any():
        if agg is None:
            ex = runs.loc[dup, [c for c in ("run_id", *keys) if c in runs.columns]].head(6)
            ex = ex.to_string(index=False)
            same = (f"{what}: several runs share the same {keys} (another parameter varies, "
                    f"or a run is repeated); ")
            raise PlotError(
                f"{same}filter the runs first (e.g. runs[runs['trace'] == ...]) or pass "
                f"agg='mean'. Runs:\n{ex}",
                cli=f"{same}keep one value of the other parameter with --where COL=VALUE, or "
                    f"pool them with --agg mean (or median, min, max). Runs:\n{ex}")
        num = runs.select_dtypes("number").columns.difference(keys)
        out = runs.groupby(keys, as_index=False, dropna=False)[list(num)].agg(agg)
        pts = int(dup.sum()) - (len(runs) - len(out))
        warnings.warn(f"{what}: agg={agg} combines {int(dup.sum())} runs that share their "
                      f"{' / '.join(keys)} cell (another parameter varies, or a run is "
                      f"repeated) into {pts} point{'s' * (pts != 1)}; --where COL=VALUE keeps "
                      f"one value of it instead", PlotWarning, stacklevel=3)
        return out
    return runs


def _new_fig(ncols: int = 1, nrows: int = 1, w: float = 4.2, h: float = 3.4, **kw):
    import matplotlib.pyplot as plt

    kw.setdefault("layout", "constrained")
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False, **kw)
    return fig, axes


def _cat_x(ax, xs: list, label: str | None) -> dict:
    """Evenly spaced categorical x positions for the (sorted) x values; returns value->position.
    ``label``: the column, written on the axis with its meaning and unit (:func:`axis_label`;
    None: no label, as under a figure-wide one)."""
    pos = {v: i for i, v in enumerate(xs)}
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels([_fmt(v) for v in xs])
    if label is not None:
        ax.set_xlabel(axis_label(label))
    return pos


def _fmt(v) -> str:
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    return str(v)


def _hit_col(runs: pd.DataFrame, tier: str) -> str:
    c = f"hit_ratio.{tier}"
    _require(runs, [c], "runs (summary hit_ratio by tier)")
    return c


# What a swept column means and its unit, for axis labels and legend titles.
COLUMN_LABELS = {
    "tiers.host_gib": ("host DRAM tier", "GiB"),
    "tiers.disk_gib": ("disk tier", "GiB"),
    "cache.block_size": ("block size", "tokens"),
    "cache.num_gpu_blocks": ("GPU pool", "blocks"),
    "cache.gpu_memory_utilization": ("GPU memory share", "fraction"),
    "scheduler.max_num_seqs": ("max running requests", "requests"),
    "scheduler.max_num_batched_tokens": ("token budget per step", "tokens"),
    "policy.budget": ("KV budget per request", "tokens"),
    "trace.time_scale": ("arrival slow-down", "x"),
    "trace.max_requests": ("requests replayed", "requests"),
    "trace.num_sessions": ("sessions", "sessions"),
    "codec": ("cold-page codec", None),
    "policy": ("eviction policy", None),
    "compaction": ("compactor", None),
    "tiers": ("memory tiers", None),
}


def axis_label(col: str) -> str:
    """An axis label for column ``col``: its meaning and unit when known, and the column's name
    (``"host DRAM tier (GiB; tiers.host_gib)"``), else the name itself."""
    if col not in COLUMN_LABELS:
        return col
    text, unit = COLUMN_LABELS[col]
    return f"{text} ({unit}; {col})" if unit else f"{text} ({col})"


def _short(col: str) -> str:
    """A column's name without its group (``block_size`` for ``cache.block_size``)."""
    return col.rsplit(".", 1)[-1] if col.count(".") == 1 else col


def _display(df: pd.DataFrame, by: list[str]) -> dict[str, str]:
    """Legend text per group label of :func:`_labels`: the value alone for one ``by`` column (the
    legend's title names it), ``key=value`` pairs joined by ", " for several."""
    if len(by) < 2:
        return {g: g for g in _label_order(df, by)}
    out = {}
    combos = df[by].drop_duplicates()
    for lab, (_, row) in zip(_labels(combos, by), combos.iterrows()):
        out[lab] = ", ".join(f"{_short(k)}={_fmt(v) if pd.notna(v) else 'null'}"
                             for k, v in zip(by, row))
    return out


def _by_title(by: list[str]) -> str | None:
    """Legend title for ``by``: the column's name for one, None for several (the entries name
    their keys)."""
    return by[0] if len(by) == 1 else None


# Curves are told apart by colour and line style (group_styles).
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f", "#bcbd22", "#17becf")
LINESTYLES = ("-", "--", ":", "-.", (0, (6, 2, 1, 2, 1, 2)), (0, (10, 3)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def group_styles(df: pd.DataFrame, by: list[str]) -> dict[str, dict]:
    """Matplotlib keyword arguments (``color``, ``linestyle``, ``linewidth``, ``marker``) per
    group label of :func:`_labels`, in :func:`_label_order`: each group its own colour; with
    several ``by`` columns the line style follows the last one's value (one column: it cycles
    with the groups); the first groups drawn are the widest, so that a later curve lying on an
    earlier one leaves it visible at its edges."""
    groups = _label_order(df, by)
    n = len(groups)
    if len(by) >= 2:
        combos = df[by].drop_duplicates()
        tail = dict(zip(_labels(combos, by), _labels(combos, by[-1:])))
        tails = list(dict.fromkeys(tail[g] for g in groups))
        si = {g: tails.index(tail[g]) for g in groups}
    else:
        si = {g: i for i, g in enumerate(groups)}
    out = {}
    for i, g in enumerate(groups):
        lw = 1.8 if n == 1 else 3.2 - 2.0 * i / (n - 1)
        out[g] = {"color": COLORS[i % len(COLORS)],
                  "linestyle": LINESTYLES[si[g] % len(LINESTYLES)],
                  "linewidth": round(lw, 2), "marker": MARKERS[i % len(MARKERS)]}
    return out


def _legend_right(ax, title=None, fontsize: float = 8):
    """The axes' legend outside it, to the right of the data (None when nothing is labelled)."""
    if not ax.get_legend_handles_labels()[0]:
        return None
    return ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                     frameon=False, fontsize=fontsize, title=title, title_fontsize=fontsize,
                     handlelength=3.2)


def _title(fig, question: str, compared: str | None = None) -> None:
    """The figure's question as its title, with what it compares below it (wrapped)."""
    import textwrap

    text = question + ("\n" + "\n".join(textwrap.wrap(compared, 95)) if compared else "")
    fig.suptitle(text, fontsize=10)


def _set_data(fig, data: "pd.DataFrame | dict[str, pd.DataFrame]"):
    """Attach the table(s) a figure draws: :func:`save` writes them beside its image."""
    fig.kvsim_data = data if isinstance(data, dict) else {"": data}
    return fig


def figure_data(fig, name: str = "") -> pd.DataFrame:
    """The table a ``plot_*`` figure was drawn from (``name``: one of several, e.g. ``"held"``
    for :func:`plot_blocks_freed`'s curves over time). Raises PlotError when there is none."""
    data = getattr(fig, "kvsim_data", {})
    if name not in data:
        raise PlotError(f"this figure has no data table {name!r} (tables: {sorted(data)})")
    return data[name]


def _time_unit(seconds_max: float) -> tuple[str, float]:
    """``("ms", 1000)`` when the values stay below a second, else ``("s", 1)``."""
    return ("ms", 1e3) if np.isfinite(seconds_max) and seconds_max < 1.0 else ("s", 1.0)


def _plain_log_ticks(axis) -> None:
    """Tick labels of a log axis as plain numbers (0.01, 0.03, 0.1, ...), not powers of ten:
    the decades labelled, and the 3s too on an axis spanning at most 3 decades."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    def minor(v, _):
        lo, hi = sorted(axis.get_view_interval())
        if v <= 0 or (lo > 0 and np.log10(hi / lo) > 3):  # (wide axes: decades only)
            return ""
        m = v / 10 ** np.floor(np.log10(v))
        return f"{v:g}" if abs(m - 3) < 1e-6 else ""

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_locator(LogLocator(subs=(2, 3, 4, 5, 6, 7, 8, 9)))
    axis.set_minor_formatter(FuncFormatter(minor))


def _step_intervals(steps: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Each step's start and end (s): ``time_s`` and ``time_s + duration_s``; without
    ``duration_s`` a step lasts until the run's next step (the last one as long as the one
    before it)."""
    t0 = steps["time_s"].to_numpy(dtype=float)
    if "duration_s" in steps.columns:
        return t0, t0 + np.clip(steps["duration_s"].to_numpy(dtype=float), 0.0, None)
    rid = (steps["run_id"] if "run_id" in steps.columns
           else pd.Series("run", index=steps.index)).to_numpy()
    order = np.lexsort((t0, rid))
    t1 = np.empty_like(t0)
    ts, rs = t0[order], rid[order]
    nxt = np.r_[ts[1:], np.nan]
    same = np.r_[rs[1:] == rs[:-1], False]
    prev = np.r_[np.nan, np.diff(ts)]
    t1[order] = np.where(same, nxt, ts + np.nan_to_num(prev, nan=0.0))
    return t0, np.maximum(t1, t0)


def _binned(steps: pd.DataFrame, value: pd.Series, t_end: float, nbins: int) -> pd.DataFrame:
    """Per run (``run_id``) and time bin (``nbins`` equal bins of [0, ``t_end``]), the sum of
    ``value`` x the time each step spent in the bin (``v``) and that time (``w``): a step
    spanning several bins counts in each for its part. Columns run_id, bin, v, w; a bin no
    step covers (the engine idle) has no row."""
    t0, t1 = _step_intervals(steps)
    width = t_end / nbins
    b0 = np.clip(np.floor(t0 / width).astype(np.int64), 0, nbins - 1)
    b1 = np.clip(np.floor(np.maximum(t1 - 1e-12 * t_end, t0) / width).astype(np.int64), b0,
                 nbins - 1)
    n = b1 - b0 + 1
    idx = np.repeat(np.arange(len(t0)), n)
    first = np.repeat(np.cumsum(n) - n, n)
    bins = b0[idx] + (np.arange(len(idx)) - first)
    over = np.minimum(t1[idx], (bins + 1) * width) - np.maximum(t0[idx], bins * width)
    over = np.clip(over, 0.0, None)
    rid = (steps["run_id"] if "run_id" in steps.columns
           else pd.Series("run", index=steps.index)).to_numpy()
    frame = pd.DataFrame({"run_id": rid[idx], "bin": bins,
                          "v": value.to_numpy(dtype=float)[idx] * over, "w": over})
    out = frame.groupby(["run_id", "bin"], as_index=False)[["v", "w"]].sum()
    return out[out["w"] > 0]


# ---------------------------------------------------------------------------------------------
# Figures from runs.parquet


def plot_hit_by_tier(runs: pd.DataFrame, x: str = "tiers.host_gib", hue: str = "codec",
                     tiers: Sequence[str] = TIERS, agg: str | None = None):
    """Which tier serves the prefix hits, against ``x``, per ``hue`` value.

    One panel per ``hue`` value with stacked bars ``hit_ratio.<tier>`` (fraction of prompt tokens,
    0..1, served from that tier; the stack is ``hit_ratio.total``), plus a last panel with one
    curve of ``hit_ratio.total`` per ``hue`` value. ``runs``: the collected ``runs.parquet``.
    Raises PlotError if a column is missing, ``x`` equals ``hue``, ``agg`` is not one of
    :data:`AGGS`, or several runs share an (x, hue) cell and ``agg`` (e.g. ``"mean"``) is not
    given. Runs with no hit ratio (no request finished) are named in a PlotWarning. The data
    drawn (one row per cell) is :func:`figure_data`.
    """
    _check_x_hue(x, hue, agg, "plot_hit_by_tier")
    cols = [x, hue, "hit_ratio.total"] + [_hit_col(runs, t) for t in tiers]
    _require(runs, cols, "runs")
    _warn_null_runs(runs, cols[2:], "plot_hit_by_tier")
    r = _one_per_cell(runs[cols + (["run_id"] if "run_id" in runs else [])], [x, hue], agg,
                      "plot_hit_by_tier")
    hues = _sorted_unique(r[hue])
    xs = _sorted_unique(r[x])
    if not hues or not xs:
        raise PlotError("plot_hit_by_tier: no runs to plot")
    fig, axes = _new_fig(len(hues) + 1, w=3.3, h=3.3, sharey=True)
    for ax, hv in zip(axes[0], hues):
        sub = r[r[hue] == hv].set_index(x)
        pos = _cat_x(ax, xs, None)
        bottom = np.zeros(len(xs))
        for t in tiers:
            vals = np.array([sub[f"hit_ratio.{t}"].get(v, np.nan) for v in xs], dtype=float)
            ax.bar([pos[v] for v in xs], np.nan_to_num(vals), bottom=bottom, width=0.7,
                   label=t, color=TIER_COLORS.get(t))
            bottom += np.nan_to_num(vals)
        ax.set_title(f"{hue} = {hv}", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("prefix hit ratio\n(hit tokens / prompt tokens)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    ax = axes[0][-1]
    pos = _cat_x(ax, xs, None)
    fig.supxlabel(axis_label(x), fontsize=10)
    hframe = pd.DataFrame({hue: hues})
    styles = group_styles(hframe, [hue])
    for hv, lab in zip(hues, _labels(hframe, [hue])):
        sub = r[r[hue] == hv].set_index(x)
        vals = [sub["hit_ratio.total"].get(v, np.nan) for v in xs]
        ax.plot([pos[v] for v in xs], vals, label=str(hv), markersize=6, **styles[lab])
    ax.set_title("total hit ratio", fontsize=9)
    ax.grid(alpha=0.3)
    ax.set_ylim(0, max(1.0, float(np.nanmax(r["hit_ratio.total"].to_numpy(dtype=float)))
                       if r["hit_ratio.total"].notna().any() else 1.0) * 1.02)
    fig.legend(handles[::-1], labels[::-1], title="served from", loc="outside right upper",
               frameon=False, fontsize=8, title_fontsize=8)
    h2, l2 = ax.get_legend_handles_labels()
    fig.legend(h2, l2, title=f"total, by {hue}", loc="outside right lower", frameon=False,
               fontsize=8, title_fontsize=8, handlelength=3.2)
    _title(fig, "Which tier serves the prefix hits?",
           f"share of prompt tokens served from GPU, host and disk vs {x}, one panel per {hue}")
    return _set_data(fig, r.reset_index(drop=True))


def plot_disk_share(runs: pd.DataFrame, x: str = "tiers.host_gib", hue: str = "codec",
                    agg: str | None = None):
    """Share of prefix hits served from disk (``disk_share_of_hits``, 0..1) against ``x``, one
    curve per ``hue`` value. Raises PlotError on a missing column, ``x`` equal to ``hue``, an
    ``agg`` not in :data:`AGGS` or ambiguous cells; runs with no value are named in a
    PlotWarning."""
    _check_x_hue(x, hue, agg, "plot_disk_share")
    cols = [x, hue, "disk_share_of_hits"]
    _require(runs, cols, "runs")
    _warn_null_runs(runs, cols[2:], "plot_disk_share")
    r = _one_per_cell(runs[cols], [x, hue], agg, "plot_disk_share")
    xs = _sorted_unique(r[x])
    hues = _sorted_unique(r[hue])
    fig, axes = _new_fig(w=5.2, h=3.4)
    ax = axes[0][0]
    pos = _cat_x(ax, xs, x)
    hframe = pd.DataFrame({hue: hues})
    styles = group_styles(hframe, [hue])
    for hv, lab in zip(hues, _labels(hframe, [hue])):
        sub = r[r[hue] == hv].set_index(x)
        ax.plot([pos[v] for v in xs], [sub["disk_share_of_hits"].get(v, np.nan) for v in xs],
                label=str(hv), markersize=6, **styles[lab])
    ax.set_ylabel("disk share of hit tokens (fraction)")
    ax.set_ylim(0, 1.02)
    _legend_right(ax, title=hue)
    ax.grid(alpha=0.3)
    _title(fig, "How much of the prefix hits has to come from disk?",
           f"disk-served hit tokens / all hit tokens vs {x}, one curve per {hue}")
    return _set_data(fig, r.reset_index(drop=True))


def plot_ttft_vs(runs: pd.DataFrame, x: str = "tiers.host_gib", hue: str = "codec",
                 percentiles: Sequence[str] = ("p50", "p90", "p99"), metric: str = "ttft_s",
                 agg: str | None = None):
    """Percentiles of ``metric`` (summary ``<metric>.<pXX>``, seconds) against ``x``: one panel
    per percentile, one curve per ``hue`` value; a panel's y axis is logarithmic where its values
    span a factor of 10 or more, else linear from 0. Raises PlotError on missing columns,
    ``x`` equal to ``hue``, an ``agg`` not in :data:`AGGS` or ambiguous cells; runs without a
    value (no request finished) are named in a PlotWarning."""
    _check_x_hue(x, hue, agg, "plot_ttft_vs")
    cols = [x, hue] + [f"{metric}.{p}" for p in percentiles]
    _require(runs, cols, "runs")
    _warn_null_runs(runs, cols[2:], "plot_ttft_vs")
    r = _one_per_cell(runs[cols], [x, hue], agg, "plot_ttft_vs")
    xs = _sorted_unique(r[x])
    hues = _sorted_unique(r[hue])
    name = metric.removesuffix("_s").upper()
    fig, axes = _new_fig(len(percentiles), w=3.6, h=3.3)
    hframe = pd.DataFrame({hue: hues})
    styles = group_styles(hframe, [hue])
    fig.supxlabel(axis_label(x), fontsize=10)
    for ax, p in zip(axes[0], percentiles):
        pos = _cat_x(ax, xs, None)
        for hv, lab in zip(hues, _labels(hframe, [hue])):
            sub = r[r[hue] == hv].set_index(x)
            ax.plot([pos[v] for v in xs], [sub[f"{metric}.{p}"].get(v, np.nan) for v in xs],
                    label=str(hv), markersize=6, **styles[lab])
        ax.set_title(f"{name} {p}", fontsize=9)
        v = r[f"{metric}.{p}"].to_numpy(dtype=float)
        v = v[np.isfinite(v) & (v > 0)]
        if len(v) and v.max() / v.min() >= 10:  # (a log scale only where values span a decade)
            ax.set_yscale("log")
            _plain_log_ticks(ax.yaxis)
            ax.set_ylabel(f"{name} {p} (s, log scale)")
        else:
            ax.set_ylim(0, (float(v.max()) if len(v) else 1.0) * 1.12)
            ax.set_ylabel(f"{name} {p} (s)")
        ax.grid(alpha=0.3, which="both")
    _legend_right(axes[0][-1], title=hue)
    _title(fig, f"How does {name} change with the {COLUMN_LABELS[x][0]}?" if x in COLUMN_LABELS
           else f"How does {name} change with {x}?",
           f"{', '.join(percentiles)} of the finished requests' {name} per run, one curve per {hue}")
    return _set_data(fig, r.reset_index(drop=True))


# ---------------------------------------------------------------------------------------------
# Figures from requests


def _finished(req: pd.DataFrame) -> pd.DataFrame:
    if "status" in req.columns:
        return req[req["status"] == "finished"]
    return req


def plot_ttft_cdf(requests: pd.DataFrame, by="codec", log: bool = True):
    """Empirical CDF of per-request TTFT (seconds, log x unless ``log=False``; finished
    requests), one curve per ``by`` group (a column name, a comma-separated string or a list),
    told apart by colour and line style (:func:`group_styles`), legend outside the axes. Raises
    PlotError on missing columns or no finished request; runs (``run_id``) with no finished
    request are named in a PlotWarning. :func:`figure_data`: the ``by`` columns, ``ttft_s`` and
    ``fraction`` (the CDF's height at it)."""
    by = _as_list(by)
    _require(requests, ["ttft_s", *by], "requests")
    req = _finished(requests).dropna(subset=["ttft_s"])
    if req.empty:
        raise PlotError("plot_ttft_cdf: no finished request with a TTFT")
    _warn_runs_without_ttft(requests, req, "plot_ttft_cdf")
    labels = _labels(req, by)
    styles = group_styles(req, by)
    shown = _display(req, by)
    fig, axes = _new_fig(w=7.6, h=4.0)
    ax = axes[0][0]
    parts = []
    for lab in _label_order(req, by):
        rows = req.loc[labels == lab]
        order = np.argsort(rows["ttft_s"].to_numpy(dtype=float), kind="stable")
        rows = rows.iloc[order]
        v = rows["ttft_s"].to_numpy(dtype=float)
        frac = np.arange(1, len(v) + 1) / len(v)
        parts.append(rows[by].assign(ttft_s=v, fraction=frac))
        st = {k: s for k, s in styles[lab].items() if k != "marker"}
        ax.step(np.maximum(v, 1e-6) if log else v, frac, where="post",
                label=f"{shown[lab]} (n={len(v)})", **st)
    if log:
        ax.set_xscale("log")
        _plain_log_ticks(ax.xaxis)
    ax.set_xlabel("TTFT (s" + (", log scale)" if log else ")"))
    ax.set_ylabel("fraction of finished requests")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3, which="both")
    _legend_right(ax, title=_by_title(by))
    _title(fig, "How long do requests wait for their first token?",
           f"CDF of per-request TTFT, one curve per {' / '.join(by) or 'run'}")
    return _set_data(fig, pd.concat(parts, ignore_index=True))


def ttft_parts(requests: pd.DataFrame) -> list[str]:
    """The TTFT parts :func:`ttft_decomposition` reports for ``requests``, in the order they
    happen: ``queue_s``; the onboarding, per tier (``onboard_host_s``, ``onboard_disk_s``) plus
    ``onboard_wait_s`` (the rest of ``onboard_s``, derived; only when ``onboard_s`` is there) when
    the table splits it, else ``onboard_s``; ``prefill_s``. Only the parts whose columns exist."""
    cols = requests.columns
    parts = [c for c in TTFT_PARTS if c in cols]
    split = [c for c in ("onboard_host_s", "onboard_disk_s") if c in cols]
    if split and "onboard_s" in cols:
        parts.insert(parts.index(split[-1]) + 1, "onboard_wait_s")
    elif not split and "onboard_s" in cols:
        parts.insert(1 if "queue_s" in parts else 0, "onboard_s")
    return parts


def ttft_part_values(requests: pd.DataFrame) -> pd.DataFrame:
    """Per request, the seconds of each of :func:`ttft_parts` (same index as ``requests``).

    In the requests table kvsim writes, ``ttft_s = queue_s + onboard_s + prefill_s`` exactly, and
    ``onboard_s`` is the time the request waited for onboarding before its first token: with
    ``tiers.onboard=blocking`` the whole onboarding (waiting for write-back copies of the reused
    blocks to land, then the disk reads, then the host-to-GPU copies); with ``layerwise`` only the
    stall after the prefill's compute (the loads overlap it; the stall also holds the last
    layer's compute). ``onboard_host_s`` / ``onboard_disk_s`` are the time of the host-to-GPU
    copies / disk reads (queueing on the link included), overlapped or not.

    So ``onboard_s`` is split from its end back, as it happened: the host part is
    ``min(onboard_host_s, onboard_s)``, the disk part ``min(onboard_disk_s, onboard_s - host
    part)``, and ``onboard_wait_s`` the rest (write-back waits and layer stalls). With blocking
    onboarding the tier parts are the columns themselves; with layerwise onboarding, load time
    hidden behind the prefill's compute is in no part. The onboarding parts are >= 0 and sum to
    ``onboard_s``; ``queue_s`` and ``prefill_s`` are the columns. Without an ``onboard_s`` column
    the tier columns are taken as they are."""
    parts = ttft_parts(requests)
    out = pd.DataFrame(index=requests.index)
    for c in parts:
        if c in requests.columns:
            out[c] = requests[c].astype(float)
    if "onboard_wait_s" in parts:
        ob = requests["onboard_s"].astype(float)
        zero = pd.Series(0.0, index=requests.index)
        host = requests["onboard_host_s"].astype(float) if "onboard_host_s" in parts else zero
        disk = requests["onboard_disk_s"].astype(float) if "onboard_disk_s" in parts else zero
        host = np.minimum(host, ob).clip(lower=0.0)
        disk = np.minimum(disk, ob - host).clip(lower=0.0)
        if "onboard_host_s" in parts:
            out["onboard_host_s"] = host
        if "onboard_disk_s" in parts:
            out["onboard_disk_s"] = disk
        out["onboard_wait_s"] = (ob - host - disk).clip(lower=0.0)
    return out[parts]


def ttft_decomposition(requests: pd.DataFrame, by="codec", tail: float | None = None) -> pd.DataFrame:
    """Mean TTFT per ``by`` group split into its parts (seconds): the parts of
    :func:`ttft_parts` (per request as :func:`ttft_part_values` splits them: queue, onboarding
    from host, from disk, onboarding wait, prefill) plus ``other`` = mean TTFT - sum of the parts,
    and ``ttft_s``.

    ``other`` is 0 up to rounding for a requests table kvsim wrote (``ttft_s = queue_s +
    onboard_s + prefill_s``); it is nonzero only for a frame lacking a part's column (e.g. without
    ``onboard_s``: the onboarding that is neither a host copy nor a disk read) or with null parts.
    Waiting for admission is ``queue_s``; the time from the first admission to the first token
    that is not onboarding (the prefill's steps, shared with other requests, and any wait after a
    preemption before the first token) is ``prefill_s``.

    ``tail``: only requests whose TTFT is at or above that quantile of their group (e.g. 0.9 for
    the slowest 10%). Means decompose exactly (the parts sum to the mean TTFT); percentiles
    would not, so none are offered. Raises PlotError on missing columns / no requests; runs
    (``run_id``) with no finished request are named in a PlotWarning.
    """
    by = _as_list(by)
    _require(requests, ["ttft_s", *by], "requests")
    req = _finished(requests).dropna(subset=["ttft_s"]).copy()
    if req.empty:
        raise PlotError("ttft_decomposition: no finished request with a TTFT")
    _warn_runs_without_ttft(requests, req, "ttft_decomposition")
    req["_group"] = _labels(req, by)
    if tail is not None:
        if not 0.0 <= tail < 1.0:
            raise PlotError(f"tail={tail}; expected a quantile in [0, 1)")
        q = req.groupby("_group")["ttft_s"].transform(lambda s: s.quantile(tail))
        req = req[req["ttft_s"] >= q]
    parts = ttft_parts(req)
    vals = ttft_part_values(req).assign(ttft_s=req["ttft_s"].astype(float), _group=req["_group"])
    out = vals.groupby("_group")[[*parts, "ttft_s"]].mean()
    out = out.loc[[g for g in _label_order(req, by) if g in out.index]]
    out["other"] = out["ttft_s"] - out[parts].sum(axis=1)
    out.index.name = " / ".join(by) or "group"
    return out[[*parts, "other", "ttft_s"]]


def plot_ttft_decomposition(requests: pd.DataFrame, by="codec", tail: float | None = None):
    """Stacked horizontal bars of the mean TTFT per ``by`` group (one bar per group: with the
    command line's default ``--by``, one per run of a sweep) split into queue, onboarding (the
    host-to-GPU copy, which also carries disk pages: they are read into host memory first; the
    disk read; the wait: write-back waits and layer stalls), prefill and other (see
    :func:`ttft_decomposition`; ``other`` is drawn only where it is not 0). Milliseconds when
    every mean is under a second, else seconds; the total is written at each bar's end. With
    ``tail`` (e.g. 0.9) only each group's slowest requests are averaged. :func:`figure_data`:
    :func:`ttft_decomposition`'s table (seconds), the ``by`` columns first."""
    by = _as_list(by)
    d = ttft_decomposition(requests, by, tail)
    parts = [c for c in d.columns if c != "ttft_s"]
    if (d["other"].abs() <= 1e-9 * max(float(d["ttft_s"].abs().max()), 1e-12)).all():
        parts.remove("other")  # (rounding only: the recorded parts close the sum)
    drawn = [c for c in parts if (d[c].abs() > 0).any()] or parts[:1]  # (all-zero parts: no bar)
    unit, scale = _time_unit(float(d["ttft_s"].max()))
    fin = _finished(requests).dropna(subset=["ttft_s"])
    shown = _display(fin, by) if by else {g: g for g in d.index}
    # a small gap between bars whose first --by value differs, so that they read as groups
    first = [g.split(" / ")[0] for g in d.index]
    y, pos = [], 0.0
    for i, f in enumerate(first):
        if i and f != first[i - 1] and len(by) > 1:
            pos += 0.5
        y.append(pos)
        pos += 1.0
    y = np.array(y)
    fig, axes = _new_fig(w=9.0, h=max(2.4, 0.42 * len(d) + 1.5) + 0.6)
    ax = axes[0][0]
    left = np.zeros(len(d))
    for c in drawn:
        vals = d[c].to_numpy(dtype=float) * scale
        ax.barh(y, vals, left=left, height=0.8, color=TTFT_PART_COLORS.get(c),
                label=TTFT_PART_LABELS.get(c, c.removesuffix("_s")))
        left += vals
    for yi, tot in zip(y, d["ttft_s"].to_numpy(dtype=float) * scale):
        ax.text(tot, yi, f" {tot:.3g}", va="center", ha="left", fontsize=8)
    ax.set_yticks(y)
    ax.set_yticklabels([shown.get(g, g) for g in d.index], fontsize=8)
    ax.invert_yaxis()
    ax.set_ylim(y.max() + 0.6, -0.6)
    ax.set_xlabel(f"mean TTFT ({unit})")
    ax.set_xlim(0, max(float(left.max()), 1e-9) * 1.12)
    ax.grid(axis="x", alpha=0.3)
    h, lab = ax.get_legend_handles_labels()
    fig.legend(h, lab, loc="outside lower center", ncols=3, frameon=False, fontsize=8,
               title="TTFT part", title_fontsize=8)
    which = (f"requests at or above their group's p{tail * 100:g} TTFT" if tail
             else "all finished requests")
    _title(fig, "Where does the time to first token go?",
           f"mean TTFT split into its parts ({which}), one bar per {' / '.join(by) or 'run'}")
    data = d.reset_index()
    if by and len(by) > 1:  # the group label split back into its columns
        data = data.drop(columns=data.columns[0])
        keys = fin[by].drop_duplicates().assign(_g=lambda f: _labels(f, by)).set_index("_g")
        data = pd.concat([keys.loc[d.index].reset_index(drop=True), data], axis=1)
    return _set_data(fig, data)


# ---------------------------------------------------------------------------------------------
# Figures from rounds (eviction / compaction) and steps


def _time_curves(steps: pd.DataFrame, by: list[str], num: pd.Series, den: pd.Series | None,
                 nbins: int) -> pd.DataFrame:
    """Binned curves over simulated time, one per ``by`` group: in each of ``nbins`` equal bins
    of [0, the last step's end], the time-weighted mean of ``num`` over the steps in it (or, with
    ``den``, the ratio of the time-weighted sums of ``num`` and ``den``) per run (see
    :func:`_binned`), averaged over the group's runs. Bins no step covers are left out (the
    curve breaks there). Columns: the ``by`` columns, t_start_s, t_end_s, value."""
    _, t1 = _step_intervals(steps)
    t_end = float(t1.max()) if len(t1) else 0.0
    t_end = t_end if t_end > 0 else 1.0
    a = _binned(steps, num, t_end, nbins)
    if den is not None:
        b = _binned(steps, den, t_end, nbins)
        a = a.merge(b[["run_id", "bin", "v"]].rename(columns={"v": "d"}), on=["run_id", "bin"])
        a = a.assign(value=a["v"] / a["d"].where(a["d"] > 0))
    else:
        a = a.assign(value=a["v"] / a["w"])
    rid = steps["run_id"] if "run_id" in steps.columns else pd.Series("run", index=steps.index)
    keys = steps[by].assign(run_id=rid.to_numpy()).drop_duplicates("run_id")
    a = a.merge(keys, on="run_id", how="left").dropna(subset=["value"])
    out = (a.groupby([*by, "bin"], as_index=False, dropna=False, observed=True)["value"].mean()
           if by else a.groupby("bin", as_index=False)["value"].mean())
    width = t_end / nbins
    out["t_start_s"] = out["bin"] * width
    out["t_end_s"] = (out["bin"] + 1) * width
    return out[[*by, "t_start_s", "t_end_s", "value"]]


def _draw_curves(ax, curves: pd.DataFrame, by: list[str], styles: dict, shown: dict) -> None:
    """One line per group of ``curves`` (:func:`_time_curves`), at each bin's middle; a bin with
    no step breaks the line."""
    labels = _labels(curves, by)
    for g in styles:
        c = curves[labels == g]
        if c.empty:
            continue
        mid = ((c["t_start_s"] + c["t_end_s"]) / 2).to_numpy()
        width = float((c["t_end_s"] - c["t_start_s"]).iloc[0])
        val = c["value"].to_numpy(dtype=float)
        gap = np.where(np.diff(mid) > 1.5 * width)[0] + 1  # (no step in between: a gap)
        mid = np.insert(mid, gap, np.nan)
        val = np.insert(val, gap, np.nan)
        st = {k: s for k, s in styles[g].items() if k != "marker"}
        ax.plot(mid, val, label=shown.get(g, g), **st)


def plot_blocks_freed(rounds: pd.DataFrame, by=("policy", "compaction"),
                      block_size: int | None = None, steps: pd.DataFrame | None = None,
                      baseline: str = "full", nbins: int = 150):
    """How many GPU blocks eviction saves, per ``by`` group, against the same runs with
    ``policy=<baseline>`` (``full``: no eviction).

    With ``steps`` (the per-step table, with ``run_id``, ``time_s``, ``blocks_used``, the ``by``
    columns and ``policy``): top, blocks held (GPU blocks in use, step-duration-weighted mean in
    ``nbins`` time bins) over simulated time, one curve per group; bottom left, the net saving:
    peak and time-averaged blocks held per group (averaged over the time the engine steps), with
    the baseline's as black ticks and the saving in percent. The baseline of a group is the group
    whose ``by`` values are the same but ``policy`` is ``baseline``, else every baseline run.
    Bottom right (also without ``steps``): the gross frees, blocks freed summed over the
    eviction rounds, beside the blocks' worth of evicted tokens (tokens evicted / block size).
    Gross frees count per-step churn: a round that frees a block lets the next decode step
    allocate one again, so they can exceed the blocks' worth of tokens many times while the
    blocks held fall far less. Block size: ``block_size`` or a ``cache.block_size`` column
    holding one value.

    :func:`figure_data`: per group (``""``): runs, peak_blocks, mean_blocks, the baseline's
    (baseline_peak_blocks, baseline_mean_blocks), the net saving in blocks and as a fraction
    of the baseline's (peak_saved, mean_saved, peak_saved_frac, mean_saved_frac), rounds,
    tokens_evicted, tokens_evicted_blocks and gross_blocks_freed (per run, averaged over the
    group's runs); ``"held"``: the curves (t_start_s, t_end_s, blocks_held). Raises PlotError
    on missing columns or no rounds.
    """
    by = _as_list(by)
    _require(rounds, ["tokens_evicted", "blocks_freed", *by], "rounds")
    if rounds.empty:
        raise PlotError("plot_blocks_freed: no rounds (did any policy evict?)",
                        cli="blocks-freed: no compression rounds in these runs, nothing to draw "
                            "(policy=full evicts nothing; a policy's rounds start once a request "
                            "passes policy.budget)")
    if block_size is None:
        for df in (rounds, steps):
            if df is not None and "cache.block_size" in df.columns:
                bs = df["cache.block_size"].dropna().unique()
                if len(bs) == 1:
                    block_size = int(bs[0])
                    break
    rid_r = rounds["run_id"] if "run_id" in rounds.columns else pd.Series("run", index=rounds.index)
    per_run = rounds.assign(_run=rid_r.to_numpy(), _g=_labels(rounds, by)).groupby(
        ["_g", "_run"], sort=False).agg(rounds=("blocks_freed", "size"),
                                        tokens_evicted=("tokens_evicted", "sum"),
                                        gross_blocks_freed=("blocks_freed", "sum"))
    gross = per_run.groupby(level="_g").mean()
    if steps is None:
        warnings.warn("plot_blocks_freed: no steps table given: the blocks held over time and "
                      "the net saving against policy=full are not drawn", PlotWarning,
                      stacklevel=2)
        frame = rounds
    else:
        _require(steps, ["time_s", "blocks_used", *by], "steps")
        frame = steps
    groups = _label_order(frame, by)
    styles = group_styles(frame, by)
    shown = _display(frame, by)
    keys = None
    if by:
        keys = frame[by].drop_duplicates().assign(_g=lambda f: _labels(f, by)).set_index("_g")
        table = keys.loc[groups].copy()
    else:
        table = pd.DataFrame(index=pd.Index(groups, name="_g"))
    for c in ("rounds", "tokens_evicted", "gross_blocks_freed"):
        table[c] = gross[c].reindex(groups).fillna(0).to_numpy(dtype=float)
    table["tokens_evicted_blocks"] = (table["tokens_evicted"] / block_size if block_size
                                      else np.nan)
    held = None
    if steps is not None:
        t0, t1 = _step_intervals(steps)
        s = steps.assign(_g=_labels(steps, by), _w=t1 - t0,
                         _run=(steps["run_id"] if "run_id" in steps.columns else "run"))
        s = s.assign(_bw=s["blocks_used"].astype(float) * s["_w"])
        pr = s.groupby(["_g", "_run"], sort=False).agg(peak=("blocks_used", "max"),
                                                      bw=("_bw", "sum"), w=("_w", "sum"))
        pr["mean"] = pr["bw"] / pr["w"].where(pr["w"] > 0)
        g = pr.groupby(level="_g")
        table["runs"] = g.size().reindex(groups).to_numpy()
        table["peak_blocks"] = g["peak"].mean().reindex(groups).to_numpy(dtype=float)
        table["mean_blocks"] = g["mean"].mean().reindex(groups).to_numpy(dtype=float)
        pol = steps["policy"] if "policy" in steps.columns else None
        base_peak, base_mean = [], []
        for gl in groups:
            sel = None
            if pol is not None:
                if "policy" in by:
                    vals = keys.loc[gl].copy()
                    vals["policy"] = baseline
                    lab = _labels(pd.DataFrame([vals]), by).iloc[0]
                    if lab in table.index:
                        sel = [lab]
                if sel is None:
                    sel = list(dict.fromkeys(s.loc[pol == baseline, "_g"]))
            rows = pr.loc[pr.index.get_level_values("_g").isin(sel or [])]
            base_peak.append(float(rows["peak"].mean()) if len(rows) else np.nan)
            base_mean.append(float(rows["mean"].mean()) if len(rows) else np.nan)
        table["baseline_peak_blocks"] = base_peak
        table["baseline_mean_blocks"] = base_mean
        for k in ("peak", "mean"):
            table[f"{k}_saved"] = table[f"baseline_{k}_blocks"] - table[f"{k}_blocks"]
            table[f"{k}_saved_frac"] = table[f"{k}_saved"] / table[f"baseline_{k}_blocks"]
        curves = _time_curves(steps, by, steps["blocks_used"].astype(float), None, nbins)
        held = curves.rename(columns={"value": "blocks_held"})
    # --- drawing
    n = len(groups)
    import matplotlib.pyplot as plt

    bars_h = max(2.2, 0.34 * n + 1.0)
    if steps is not None:
        fig = plt.figure(figsize=(12.0, 3.4 + bars_h), layout="constrained")
        gs = fig.add_gridspec(2, 2, height_ratios=[3.0, bars_h])
        ax_t = fig.add_subplot(gs[0, :])
        ax_n = fig.add_subplot(gs[1, 0])
        ax_g = fig.add_subplot(gs[1, 1], sharey=ax_n)
    else:
        fig = plt.figure(figsize=(7.0, bars_h + 0.8), layout="constrained")
        ax_t = ax_n = None
        ax_g = fig.add_subplot(1, 1, 1)
    y = np.arange(n)
    if ax_t is not None:
        _draw_curves(ax_t, held.rename(columns={"blocks_held": "value"}), by, styles, shown)
        ax_t.set_xlabel("simulated time (s)")
        ax_t.set_ylabel("GPU blocks held")
        ax_t.set_ylim(bottom=0)
        ax_t.set_title("blocks held over time (mean over each of "
                       f"{nbins} time bins)", fontsize=9)
        ax_t.grid(alpha=0.3)
        _legend_right(ax_t, title=_by_title(by))
        ax_n.barh(y - 0.2, table["peak_blocks"], height=0.4, color="#4C72B0", label="peak")
        ax_n.barh(y + 0.2, table["mean_blocks"], height=0.4, color="#A1C3E8",
                  label="time-averaged")
        if table["baseline_peak_blocks"].notna().any():
            ax_n.plot(table["baseline_peak_blocks"], y - 0.2, "|", color="black", ms=11, mew=2,
                      label=f"policy={baseline}")
            ax_n.plot(table["baseline_mean_blocks"], y + 0.2, "|", color="black", ms=11, mew=2)
        xmax = float(np.nanmax(np.r_[table["peak_blocks"], table["baseline_peak_blocks"], 1]))
        for yi, (gl, r) in zip(y, table.iterrows()):
            at = float(np.nanmax([r["peak_blocks"], r["baseline_peak_blocks"]]))
            if "policy" in by and str(keys.loc[gl, "policy"]) == baseline:
                txt = "baseline"
            elif pd.notna(r["baseline_peak_blocks"]) and r["baseline_peak_blocks"] > 0:
                txt = f"peak {-r['peak_saved_frac']:+.0%}, mean {-r['mean_saved_frac']:+.0%}"
            else:
                continue
            ax_n.annotate(txt, (at, yi), xytext=(8, 0), textcoords="offset points",
                          va="center", fontsize=7.5)
        ax_n.set_xlim(0, xmax * 1.55)
        ax_n.set_yticks(y)
        ax_n.set_yticklabels([shown[g] for g in groups], fontsize=8)
        ax_n.invert_yaxis()
        ax_n.set_xlabel("GPU blocks held")
        ax_n.set_title(f"net: blocks held (peak, time-averaged)\nvs the same run with "
                       f"policy={baseline}", fontsize=9)
        ax_n.grid(axis="x", alpha=0.3)
        ax_n.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=2,
                    frameon=False)
    ax_g.barh(y - 0.2, table["gross_blocks_freed"], height=0.4, color="#C44E52",
              label="blocks freed by the rounds (gross)")
    if block_size:
        ax_g.barh(y + 0.2, table["tokens_evicted_blocks"], height=0.4, color="#BBBBBB",
                  label=f"tokens evicted / {block_size}")
    both = np.r_[table["gross_blocks_freed"], table["tokens_evicted_blocks"]].astype(float)
    both = both[np.isfinite(both) & (both > 0)]
    gmax = float(both.max()) if len(both) else 1.0
    log = len(both) and gmax / float(both.min()) > 30  # (a log axis where bars differ 30-fold)
    for col, dy in (("gross_blocks_freed", -0.2), ("tokens_evicted_blocks", 0.2)):
        for yi, v in zip(y, table[col]):
            if pd.notna(v):
                ax_g.annotate(f"{v:,.0f}", (max(v, 1.0) if log else v, yi + dy), xytext=(3, 0),
                              textcoords="offset points", va="center", fontsize=7,
                              color="black" if dy < 0 else "#555555")
    if log:
        ax_g.set_xscale("log")
        ax_g.set_xlim(0.8, gmax * 4)
        _plain_log_ticks(ax_g.xaxis)
    else:
        ax_g.set_xlim(0, gmax * 1.2)
    if ax_n is None:
        ax_g.set_yticks(y)
        ax_g.set_yticklabels([shown[g] for g in groups], fontsize=8)
        ax_g.invert_yaxis()
    else:
        ax_g.tick_params(labelleft=False)
    ax_g.set_xlabel("blocks per run, summed over its eviction rounds" + (" (log scale)" if log
                                                                          else ""))
    ax_g.set_title("gross: blocks freed, summed over rounds\n(per-step churn: the next step can "
                   "take them again)", fontsize=9)
    ax_g.grid(axis="x", alpha=0.3)
    ax_g.legend(fontsize=7.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=1,
                frameon=False)
    _title(fig, "How many GPU blocks does evicting tokens save?",
           f"one curve / bar pair per {' / '.join(by) or 'run'}; net: blocks held against the "
           f"same run with policy={baseline}; gross: blocks the eviction rounds freed")
    out = {"": table.reset_index(drop=True)}
    if held is not None:
        out["held"] = held
    return _set_data(fig, out)


def longest_request(rounds: pd.DataFrame) -> int:
    """The request id with the most eviction rounds (over all runs): the default subject of
    :func:`plot_fragmentation`. Raises PlotError if ``rounds`` is empty."""
    _require(rounds, ["request_id"], "rounds")
    if rounds.empty:
        raise PlotError("no rounds")
    return int(rounds.groupby("request_id").size().idxmax())


def plot_fragmentation(rounds: pd.DataFrame, request_id: int | None = None,
                       by=("policy", "compaction")):
    """Fragmentation of one request's blocks after each eviction round
    (``fragmentation_after``: the fraction, 0..1, of the slots of the request's blocks that hold
    no live token) over simulated time (s), one curve per ``by`` group; the title names the
    request and why it was picked. ``request_id`` defaults to :func:`longest_request` (the
    request ids of runs of one trace are the same request). :func:`figure_data`: the rounds
    drawn (``by`` columns, time_s, fragmentation_after)."""
    by = _as_list(by)
    _require(rounds, ["time_s", "request_id", "fragmentation_after", *by], "rounds")
    rid = longest_request(rounds) if request_id is None else int(request_id)
    sub = rounds[rounds["request_id"] == rid]
    if sub.empty:
        raise PlotError(f"plot_fragmentation: request {rid} has no rounds")
    labels = _labels(sub, by)
    styles = group_styles(sub, by)
    shown = _display(sub, by)
    fig, axes = _new_fig(w=8.8, h=3.8)
    ax = axes[0][0]
    parts = []
    for g in _label_order(sub, by):
        s = sub[labels == g].sort_values("time_s", kind="stable")
        parts.append(s[[*by, "time_s", "fragmentation_after"]])
        st = dict(styles[g])
        if len(s) > 60:  # (a marker per round would hide the line)
            st.pop("marker")
        ax.step(s["time_s"], s["fragmentation_after"], where="post", markersize=4,
                label=f"{shown[g]} ({len(s)} rounds)", **st)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("unused slots in the request's blocks\n(fraction, after each round)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    _legend_right(ax, title=_by_title(by))
    why = ("the request with the most eviction rounds" if request_id is None
           else "the request asked for")
    _title(fig, "How fragmented do one long request's blocks get?",
           f"request {rid} ({why}), one curve per {' / '.join(by) or 'run'}")
    data = pd.concat(parts, ignore_index=True).assign(request_id=rid)
    return _set_data(fig, data)


def plot_bytes_moved(rounds: pd.DataFrame, by="compaction"):
    """KV bytes moved by compaction per eviction round, per ``by`` group: left, the CDF of
    per-round MiB moved (2**20 bytes; rounds that moved nothing included); right, GiB (2**30
    bytes) moved over the run. :func:`figure_data`: per group, rounds, rounds that moved
    something, the median, p90 and largest MiB per round and the GiB total."""
    by = _as_list(by)
    _require(rounds, ["bytes_moved", *by], "rounds")
    if rounds.empty:
        raise PlotError("plot_bytes_moved: no rounds")
    labels = _labels(rounds, by)
    groups = _label_order(rounds, by)
    styles = group_styles(rounds, by)
    shown = _display(rounds, by)
    import matplotlib.pyplot as plt

    bars_h = max(1.6, 0.3 * len(groups) + 0.8)
    fig = plt.figure(figsize=(8.0, 3.4 + bars_h), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[3.4, bars_h])  # (each laid out alone)
    ax = top.add_subplot(1, 1, 1)
    rows = []
    for g in groups:
        v = np.sort(rounds.loc[labels == g, "bytes_moved"].to_numpy(dtype=float) / 2**20)
        st = {k: s for k, s in styles[g].items() if k != "marker"}
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=shown[g], **st)
        rows.append({"_g": g, "rounds": len(v), "rounds_moving": int((v > 0).sum()),
                     "mib_per_round_p50": float(np.median(v)),
                     "mib_per_round_p90": float(np.quantile(v, 0.9)),
                     "mib_per_round_max": float(v.max()), "gib_total": float(v.sum() / 1024)})
    ax.set_xlabel("MiB moved per round")
    ax.set_ylabel("fraction of rounds")
    ax.set_title("per round (CDF)", fontsize=9)
    ax.grid(alpha=0.3)
    _legend_right(ax, title=_by_title(by))
    ax = bottom.add_subplot(1, 1, 1)
    tab = pd.DataFrame(rows).set_index("_g")
    yy = np.arange(len(groups))
    ax.barh(yy, tab["gib_total"].to_numpy(), color=[styles[g]["color"] for g in groups])
    for yi, v in zip(yy, tab["gib_total"]):
        ax.text(v, yi, f" {v:.3g}", va="center", fontsize=7.5)
    ax.set_yticks(yy)
    ax.set_yticklabels([shown[g] for g in groups], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max(float(tab["gib_total"].max()), 1e-9) * 1.2)
    ax.set_xlabel("GiB moved (total over the run)")
    ax.set_title("over the run", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    _title(fig, "How many KV bytes does compaction move?",
           f"bytes copied to pack or fill blocks, one curve / bar per {' / '.join(by) or 'run'}")
    if by:
        keys = rounds[by].drop_duplicates().assign(_g=lambda f: _labels(f, by)).set_index("_g")
        tab = pd.concat([keys.loc[groups], tab], axis=1)
    return _set_data(fig, tab.reset_index(drop=True))


def plot_pool_fragmentation(steps: pd.DataFrame, by="cache.block_size",
                            block_size: int | None = None, nbins: int = 150):
    """How full the allocated KV slots are over simulated time (s), from ``steps``: the running
    requests' KV tokens (``live_kv_tokens``) per allocated token slot (``blocks_used`` x block
    size), in ``nbins`` equal time bins (the step-duration-weighted sums of each, per run;
    a group's runs averaged), one curve per ``by`` group, with 1 marked.

    Below 1, allocated slots hold no token (the partly filled last block of each sequence,
    holes left by eviction): the pool's fragmentation is 1 minus it. Above 1, requests share
    blocks (a prefix hit's blocks count once in ``blocks_used`` but once per request in
    ``live_kv_tokens``) or a compression policy keeps fewer tokens than the sequences have
    (``live_kv_tokens`` is the logical count). Block size from ``block_size`` or a
    ``cache.block_size`` column. :func:`figure_data`: the curves (``by`` columns, t_start_s,
    t_end_s, tokens_per_slot)."""
    by = _as_list(by)
    _require(steps, ["time_s", "blocks_used", "live_kv_tokens", *by], "steps")
    if steps.empty:
        raise PlotError("plot_pool_fragmentation: no steps")
    if block_size is None:
        _require(steps, ["cache.block_size"], "steps (or pass block_size=)")
        bs = steps["cache.block_size"].astype(float)
    else:
        bs = float(block_size)
    slots = steps["blocks_used"].astype(float) * bs
    curves = _time_curves(steps, by, steps["live_kv_tokens"].astype(float), slots, nbins)
    styles = group_styles(steps, by)
    shown = _display(steps, by)
    fig, axes = _new_fig(w=7.4, h=3.8)
    ax = axes[0][0]
    _draw_curves(ax, curves, by, styles, shown)
    ax.axhline(1.0, color="black", lw=0.8, alpha=0.6)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("running requests' tokens\nper allocated slot")
    ax.grid(alpha=0.3)
    _legend_right(ax, title=_by_title(by))
    width = float(steps["time_s"].max()) / nbins if len(steps) else 0.0
    _title(fig, "How full are the allocated KV slots?",
           f"running requests' tokens / (blocks used x block size), mean per {width:.3g} s of "
           f"simulated time, one curve per {' / '.join(by) or 'run'}; below 1: unused slots; "
           f"above 1: prefix blocks shared by requests, or tokens a policy evicted")
    return _set_data(fig, curves.rename(columns={"value": "tokens_per_slot"}))


def image_formats() -> list[str]:
    """The file extensions (without the dot) matplotlib can write a figure as: ``png``, ``pdf``,
    ``svg``, ..."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def _out_problem(path) -> str | None:
    """Why ``path`` cannot be written as an image (no or unknown extension, a folder there, or
    a file where a folder above it would be), or None if it can."""
    from sim.folders import blocking_file

    if not str(path).strip():
        return "an empty path; expected an image file's path"
    p = Path(path)
    if p.is_dir():
        return f"{str(path)!r} is a folder; expected an image file's path"
    f = blocking_file(p.parent)
    if f is not None:
        return f"{str(path)!r}: {f} is a file, not a folder; expected a path kvsim-plot can create"
    ext = Path(path).suffix.lower().lstrip(".")
    formats = image_formats()
    shown = ", ".join(f".{f}" for f in formats)
    if not ext:
        return f"{str(path)!r} has no file extension; expected one of {shown}"
    if ext not in formats:
        return f"{str(path)!r}: unsupported extension '.{ext}'; expected one of {shown}"
    return None


def save(fig, path, dpi: int = 150, data: bool = True) -> Path:
    """Save ``fig`` at ``path`` (``dpi``, 150 unless told), in the format its extension names
    (``.png``, ``.pdf``, ``.svg``, ...: :func:`image_formats`); parent directories are created;
    close the figure. With ``data`` (the default), the table(s) the figure was drawn from
    (:func:`figure_data`) are written beside it as CSV: ``<stem>.csv``, and ``<stem>.<name>.csv``
    for a figure with several (:func:`plot_blocks_freed`'s ``held``). Raises PlotError naming the
    path and the supported extensions when the extension is missing or unknown (nothing is
    written)."""
    import matplotlib.pyplot as plt

    problem = _out_problem(path)
    if problem is not None:
        plt.close(fig)
        raise PlotError(f"cannot save figure: {problem}")
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(p, dpi=dpi, bbox_inches="tight")
        if data:
            for name, df in getattr(fig, "kvsim_data", {}).items():
                df.to_csv(_data_path(p, name), index=False, float_format="%.9g")
    except OSError as e:
        raise PlotError(f"cannot save figure to {str(path)!r}: {e.strerror or e}; expected a "
                        f"path kvsim-plot can create and write") from None
    finally:
        plt.close(fig)
    return p


def _data_path(image: Path, name: str = "") -> Path:
    """The CSV beside ``image`` holding its table ``name`` (see :func:`save`)."""
    return image.with_suffix(".csv") if not name else image.with_suffix(f".{name}.csv")


def data_files(fig, path) -> list[Path]:
    """The CSV files :func:`save` writes beside ``path`` for ``fig``'s tables."""
    return [_data_path(Path(path), n) for n in getattr(fig, "kvsim_data", {})]


# ---------------------------------------------------------------------------------------------
# Command line


def _filter_runs(runs: pd.DataFrame, where: list[str]) -> pd.DataFrame:
    """Apply ``col=value`` filters (value compared as the column's type). PlotError when no run
    is left (or there was none: every run of the collection failed)."""
    if runs.empty:
        raise PlotError("the collection holds no completed run (kvsim-collect lists the failed "
                        "ones in failed_runs.csv); expected at least one")
    for w in where:
        if "=" not in w:
            raise PlotError(f"--where {w!r}: expected COLUMN=VALUE")
        col, val = w.split("=", 1)
        _require(runs, [col], "runs")
        s = runs[col]
        try:
            target = json.loads(val) if not pd.api.types.is_string_dtype(s) else val
        except ValueError:
            target = val
        runs = runs[s == target] if not pd.api.types.is_string_dtype(s) else runs[s.astype(str) == val]
    if runs.empty:
        raise PlotError(f"no run matches {where}")
    return runs


def _warn_pooled(df: pd.DataFrame, runs: pd.DataFrame, by: list[str], figure: str) -> None:
    """A PlotWarning when a ``by`` group of ``df`` (a per-request / per-round / per-step table
    with ``run_id``) holds runs that differ in an override key other than the ``by`` columns:
    its curve pools them. Names the keys and how many runs each curve pools. The override keys
    come from the ``overrides`` column of ``runs`` (bookkeeping keys left out); a key's value
    is the runs column of that name when there is one, else the override's text."""
    if (df.empty or "run_id" not in df.columns or "overrides" not in runs.columns
            or any(c not in df.columns for c in by)):  # (a missing column is the figure's error)
        return
    from experiments.collect_tables import BOOKKEEPING_PREFIXES, override_key

    pairs = df[[*dict.fromkeys([*by, "run_id"])]].drop_duplicates()
    pairs = pairs.assign(_g=_labels(pairs, by))
    sel = runs[runs["run_id"].isin(set(pairs["run_id"]))].set_index("run_id")
    literal: dict = {}
    for rid, ov in sel["overrides"].items():
        for o in str(ov).split() if isinstance(ov, str) else []:
            kv = override_key(o)
            if kv is not None and not kv[0].startswith(BOOKKEEPING_PREFIXES) and kv[0] not in by:
                literal.setdefault(kv[0], {})[rid] = kv[1]
    if not literal:
        return
    values = pd.DataFrame({k: (sel[k] if k in sel.columns else pd.Series(v, dtype=object))
                           for k, v in literal.items()}, index=sel.index).astype(str)
    varying: list[str] = []
    counts: dict[str, int] = {}
    for g, ids in pairs.groupby("_g", sort=False)["run_id"]:
        ids = list(dict.fromkeys(ids))
        if len(ids) < 2:
            continue
        keys = [k for k in values.columns if values.loc[ids, k].nunique(dropna=False) > 1]
        if keys:
            counts[g] = len(ids)
            varying += [k for k in keys if k not in varying]
    if not counts:
        return
    order = [g for g in _label_order(pairs, by) if g in counts]
    name = " / ".join(by)  # (the groups are named by their --by values: say whose)
    shown = ", ".join(f"{name}={g}: {counts[g]} runs" for g in order[:6])
    shown += f" and {len(order) - 6} more" if len(order) > 6 else ""
    keys = ", ".join(varying)
    which = ("each --by group (curve / bar) pools" if len(counts) == len(set(pairs["_g"]))
             else "some --by groups (curve / bar) pool")
    warnings.warn(
        f"{figure}: {which} runs that differ in {keys} ({shown}); pick one "
        f"value with --where {varying[0]}=VALUE, or add {'it' if len(varying) == 1 else 'them'} "
        f"to --by (--by {','.join([*by, *varying])}); drawn pooled", PlotWarning, stacklevel=2)


def varying_keys(runs: pd.DataFrame) -> list[str]:
    """The override keys (``overrides`` column; bookkeeping keys such as ``sim.progress`` and
    ``output.*`` left out) whose value differs between ``runs``, in the order the overrides first
    name them; only keys that are columns of ``runs``."""
    from experiments.collect_tables import BOOKKEEPING_PREFIXES, override_key

    keys: list[str] = []
    if "overrides" in runs.columns:
        for ov in runs["overrides"]:
            for o in ov.split() if isinstance(ov, str) else []:
                kv = override_key(o)
                if kv is not None and not kv[0].startswith(BOOKKEEPING_PREFIXES):
                    keys.append(kv[0])
    out = []
    for k in dict.fromkeys(keys):
        if k in runs.columns:
            col = runs[k].astype(object)
            if col.where(col.notna(), "null").astype(str).nunique() > 1:
                out.append(k)
    return out


def default_by(runs: pd.DataFrame) -> list[str]:
    """``kvsim-plot``'s grouping when ``--by`` is not given: :func:`varying_keys`, so that each
    curve or bar is one run of a sweep; ``run_id`` when runs differ in no override; none for a
    single run."""
    keys = varying_keys(runs)
    if keys:
        return keys
    return ["run_id"] if len(runs) > 1 else []


def default_x_hue(runs: pd.DataFrame, x: str | None, hue: str | None) -> tuple[str, str]:
    """``kvsim-plot``'s ``--x`` / ``--hue`` when not given, from :func:`varying_keys`: x is
    ``tiers.host_gib`` when it varies (or nothing does), else the first numeric varying key;
    hue is ``codec`` when it varies (or nothing else does), else the next varying key."""
    vary = varying_keys(runs)
    if x is None:
        num = [k for k in vary if k != hue and pd.api.types.is_numeric_dtype(runs[k])]
        x = ("tiers.host_gib" if "tiers.host_gib" in vary or not vary
             else (num or [k for k in vary if k != hue] or ["tiers.host_gib"])[0])
    if hue is None:
        rest = [k for k in vary if k != x]
        hue = "codec" if "codec" in rest or not rest else rest[0]
        if hue == x:
            hue = "trace" if x != "trace" else "model"
    return x, hue


def _draw(args, col: Collected):
    fig = _draw_figure(args, col)
    if args.where:  # (the title says which runs were kept)
        fig.suptitle(f"{fig.get_suptitle()}\nruns with {', '.join(args.where)}", fontsize=10)
    return fig


def _draw_figure(args, col: Collected):
    runs = _filter_runs(col.runs, args.where or [])
    ids = set(runs["run_id"])
    k = args.figure
    if FIGURES[k][0] == "runs":
        x, hue = default_x_hue(runs, args.x, args.hue)
        fn = {"hit-by-tier": plot_hit_by_tier, "disk-share": plot_disk_share,
              "ttft-vs": plot_ttft_vs}[k]
        return fn(runs, x=x, hue=hue, agg=args.agg)
    by = _as_list(args.by) if args.by is not None else default_by(runs)

    def table(name, need, warn=True):
        df = col.table(name, run_columns=[c for c in need if c in runs.columns])
        df = df[df["run_id"].isin(ids)]
        if warn:
            _warn_pooled(df, runs, by, args.figure)
        return df

    if k == "ttft-cdf":
        return plot_ttft_cdf(table("requests", by), by=by)
    if k == "ttft-decomposition":
        return plot_ttft_decomposition(table("requests", by), by=by, tail=args.tail)
    if k == "blocks-freed":
        rounds = table("rounds", [*by, "cache.block_size"])
        steps = None
        if not rounds.empty:  # (no rounds: the figure's own error says why)
            steps = table("steps", [*by, "cache.block_size", "policy"], warn=False)
        return plot_blocks_freed(rounds, by=by, steps=steps)
    if k == "fragmentation":
        return plot_fragmentation(table("rounds", by), request_id=args.request_id, by=by)
    if k == "bytes-moved":
        return plot_bytes_moved(table("rounds", by), by=by)
    if k == "pool-fragmentation":
        return plot_pool_fragmentation(table("steps", [*by, "cache.block_size"]), by=by)
    raise PlotError(f"unknown figure {k!r}")


# Each figure: the table it reads and the question it answers.
FIGURES = {
    "hit-by-tier": ("runs", "which tier serves the prefix hits?"),
    "disk-share": ("runs", "how much of the prefix hits comes from disk?"),
    "ttft-vs": ("runs", "how do TTFT p50/p90/p99 change with --x?"),
    "ttft-cdf": ("requests", "how long do requests wait for their first token?"),
    "ttft-decomposition": ("requests", "where does the time to first token go?"),
    "blocks-freed": ("rounds", "how many GPU blocks does evicting tokens save (net and gross)?"),
    "fragmentation": ("rounds", "how fragmented do one long request's blocks get?"),
    "bytes-moved": ("rounds", "how many KV bytes does compaction move?"),
    "pool-fragmentation": ("steps", "how full are the allocated KV slots?"),
}


def _positive_int(text: str) -> int:
    v = int(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive integer")
    return v


def main(argv: list[str] | None = None) -> int:
    """``kvsim-plot FIGURE COLLECTED_DIR --out FILE.png [options]``; exit 2 on bad input with one
    line naming the file or column (an ``--out`` without a supported image extension, or an
    ``--agg`` not in :data:`AGGS`, is an argparse usage error: SystemExit(2) before anything is
    read). Each :class:`PlotWarning` (runs left out for lack of a value, runs pooled into one
    curve) is printed on stderr as one ``kvsim-plot: warning:`` line; the figure is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    ap = argparse.ArgumentParser(prog="kvsim-plot",
                                 description="Draw a figure of a collected kvsim sweep (see kvsim-collect).")
    sub = ap.add_subparsers(dest="figure", required=True, metavar="FIGURE")
    parsers = {}
    options: dict[str, set[str]] = {}  # each figure's option strings

    for name, (src, question) in FIGURES.items():
        p = parsers[name] = sub.add_parser(name, help=f"{question} (from {src})")
        options[name] = {"-h", "--help"}

        def add(*flags, _p=p, _name=name, **kw):
            _p.add_argument(*flags, **kw)
            options[_name].update(f for f in flags if f.startswith("-"))

        add("collected", help="directory written by kvsim-collect")
        add("--out", required=True,
            help="output image; the extension picks the format (.png, .svg, .pdf, ...); the "
                 "figure's data is written beside it (the same name with .csv)")
        add("--where", action="append", metavar="COL=VALUE",
            help="keep runs with runs.parquet COL == VALUE (repeatable)")
        add("--dpi", type=_positive_int, default=150,
            help="resolution of a raster image (dots per inch; default 150)")
        if src == "runs":
            add("--x", default=None, help="x column (default: tiers.host_gib when it varies "
                                          "between the runs, else the first swept number)")
            add("--hue", default=None, help="one curve / panel per value (default: codec when "
                                            "it varies, else the other swept key)")
            add("--agg", default=None, choices=AGGS,
                help="combine runs sharing an (x, hue) cell (e.g. seeds) by this "
                     "statistic of their values (default: such runs are an error)")
        else:
            add("--by", default=None,
                help="comma-separated grouping columns (default: the override keys whose "
                     "values differ between the runs, one curve / bar per run)")
        if name == "ttft-decomposition":
            add("--tail", type=float, default=None,
                help="only requests at or above this TTFT quantile of their group")
        if name == "fragmentation":
            add("--request-id", type=int, default=None,
                help="request to follow (default: the one with most rounds)")
    argv = sys.argv[1:] if argv is None else list(argv)
    fig = next((a for a in argv if not a.startswith("-")), None)
    if fig in parsers:
        # an option of other figures only (--agg on ttft-cdf): named before parsing, so that it
        # is not taken for a stray positional, nor lost behind a missing --out
        for a in argv:
            opt = a.split("=", 1)[0]
            if opt.startswith("--") and opt not in options[fig]:
                takes = [k for k in parsers if opt in options[k]]
                if takes:
                    parsers[fig].error(f"argument {opt}: {fig} has no {opt}; "
                                       f"{', '.join(takes)} take{'s' * (len(takes) == 1)} it")
    args, extra = ap.parse_known_args(argv)
    if extra:  # (the figure's usage, not the top level's: the options are the figure's)
        parsers[args.figure].error(f"unrecognized arguments: {' '.join(extra)}")
    problem = _out_problem(args.out)
    if problem is not None:  # before any work; argparse prints usage + one line and exits 2
        parsers[args.figure].error(f"argument --out: {problem}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PlotWarning)
        try:
            fig = _draw(args, load_collected(args.collected))
            tables = data_files(fig, args.out)
            out = save(fig, args.out, dpi=args.dpi)
        except PlotError as e:
            err = e
        else:
            err = None
    for w in caught:  # PlotWarnings as one line each; anything else as Python shows it
        if issubclass(w.category, PlotWarning):
            print(f"kvsim-plot: warning: {w.message}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if err is not None:
        print(f"kvsim-plot: error: {err.cli or err}", file=sys.stderr)
        return 2
    print(f"wrote {out}" + (f" (its data: {', '.join(str(t) for t in tables)})" if tables else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
