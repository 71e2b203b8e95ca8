"""What every figure of ``kvsim-plot`` shares: the collection it reads (:func:`load_collected`,
:class:`Collected`), the errors and warnings (:class:`PlotError`, :class:`PlotWarning`), colours,
line styles and axis labels (:func:`group_styles`, :func:`axis_label`), the checks of a figure's
columns and cells, the table a figure was drawn from (:func:`figure_data`) and saving a figure
with that table beside it (:func:`save`). The figures are in :mod:`experiments.plot_runs`,
:mod:`experiments.plot_requests` and :mod:`experiments.plot_rounds`; the command line in
:mod:`experiments.plots`. Names with a leading underscore are helpers of those modules only.
"""

from __future__ import annotations

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
