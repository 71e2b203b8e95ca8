"""Figures of a collected kvsim sweep (matplotlib), shared by the notebooks and ``kvsim-plot``.

Input is what :mod:`experiments.collect` writes: ``runs.parquet`` (one row per run: override,
config and flattened summary columns such as ``tiers.host_gib``, ``codec``, ``hit_ratio.host``,
``ttft_s.p90``) and the per-run tables (``requests/``, ``steps/``, ``rounds/``, ``transfers/``)
whose rows carry ``run_id`` and the override columns.

Every ``plot_*`` function takes DataFrames, draws into a new figure and returns it; nothing is
shown or saved (``fig.savefig(path)``, or :func:`save`). A missing column raises
:class:`PlotError` naming the column, the table and the columns that are there.

Command line (headless, Agg backend)::

    kvsim-plot hit-by-tier COLLECTED_DIR --x tiers.host_gib --hue codec --out hit.png
    kvsim-plot ttft-cdf COLLECTED_DIR --by codec --out ttft_cdf.png
    kvsim-plot ttft-decomposition COLLECTED_DIR --by tiers,codec --out ttft_parts.png
    kvsim-plot blocks-freed COLLECTED_DIR --by policy,compaction --out freed.png
    kvsim-plot --help                     # all figures and options

Units on the axes: seconds for times, GiB / MiB for bytes (2**30 / 2**20), ratios in [0, 1].

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
TTFT_PART_LABELS = {"onboard_wait_s": "onboard wait (write-back, layer stall)"}
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
    return cols.where(cols.notna(), "null").astype(str).agg(" / ".join, axis=1)


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
    from experiments.collect import BOOKKEEPING_PREFIXES, _override_key

    names = []
    for _, r in runs.head(limit).iterrows():
        name = f"run {r['run_id'] if 'run_id' in runs.columns else r.name}"
        if "overrides" in runs.columns and isinstance(r["overrides"], str):
            ovs = [o for o in r["overrides"].split()
                   if (kv := _override_key(o)) is None or not kv[0].startswith(BOOKKEEPING_PREFIXES)]
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

    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols, h * nrows), squeeze=False, **kw)
    return fig, axes


def _cat_x(ax, xs: list, label: str) -> dict:
    """Evenly spaced categorical x positions for the (sorted) x values; returns value->position."""
    pos = {v: i for i, v in enumerate(xs)}
    ax.set_xticks(range(len(xs)))
    ax.set_xticklabels([_fmt(v) for v in xs])
    ax.set_xlabel(label)
    return pos


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def _hit_col(runs: pd.DataFrame, tier: str) -> str:
    c = f"hit_ratio.{tier}"
    _require(runs, [c], "runs (summary hit_ratio by tier)")
    return c


# ---------------------------------------------------------------------------------------------
# Figures from runs.parquet


def plot_hit_by_tier(runs: pd.DataFrame, x: str = "tiers.host_gib", hue: str = "codec",
                     tiers: Sequence[str] = TIERS, agg: str | None = None):
    """Prefix-hit ratio split by the tier that served it, against ``x``, per ``hue`` value.

    One panel per ``hue`` value with stacked bars ``hit_ratio.<tier>`` (fraction of prompt tokens
    served from that tier; the stack is ``hit_ratio.total``), plus a last panel with one curve of
    ``hit_ratio.total`` per ``hue`` value. ``runs``: the collected ``runs.parquet``.
    Raises PlotError if a column is missing, ``x`` equals ``hue``, ``agg`` is not one of
    :data:`AGGS`, or several runs share an (x, hue) cell and ``agg`` (e.g. ``"mean"``) is not
    given. Runs with no hit ratio (no request finished) are named in a PlotWarning.
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
    fig, axes = _new_fig(len(hues) + 1, sharey=True)
    for ax, hv in zip(axes[0], hues):
        sub = r[r[hue] == hv].set_index(x)
        pos = _cat_x(ax, xs, x)
        bottom = np.zeros(len(xs))
        for t in tiers:
            vals = np.array([sub[f"hit_ratio.{t}"].get(v, np.nan) for v in xs], dtype=float)
            ax.bar([pos[v] for v in xs], np.nan_to_num(vals), bottom=bottom, width=0.7,
                   label=t, color=TIER_COLORS.get(t))
            bottom += np.nan_to_num(vals)
        ax.set_title(f"{hue} = {hv}")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("hit ratio (hit tokens / prompt tokens)")
    axes[0][0].legend(title="served from", fontsize=8)
    ax = axes[0][-1]
    pos = _cat_x(ax, xs, x)
    for hv in hues:
        sub = r[r[hue] == hv].set_index(x)
        vals = [sub["hit_ratio.total"].get(v, np.nan) for v in xs]
        ax.plot([pos[v] for v in xs], vals, marker="o", label=str(hv))
    ax.set_title("total hit ratio")
    ax.legend(title=hue, fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


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
    fig, axes = _new_fig()
    ax = axes[0][0]
    pos = _cat_x(ax, xs, x)
    for hv in _sorted_unique(r[hue]):
        sub = r[r[hue] == hv].set_index(x)
        ax.plot([pos[v] for v in xs], [sub["disk_share_of_hits"].get(v, np.nan) for v in xs],
                marker="o", label=str(hv))
    ax.set_ylabel("disk share of hit tokens")
    ax.set_ylim(bottom=0)
    ax.legend(title=hue, fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_ttft_vs(runs: pd.DataFrame, x: str = "tiers.host_gib", hue: str = "codec",
                 percentiles: Sequence[str] = ("p50", "p90", "p99"), metric: str = "ttft_s",
                 agg: str | None = None):
    """Percentiles of ``metric`` (summary ``<metric>.<pXX>``, seconds) against ``x``: one panel
    per percentile, one curve per ``hue`` value, log y. Raises PlotError on missing columns,
    ``x`` equal to ``hue``, an ``agg`` not in :data:`AGGS` or ambiguous cells; runs without a
    value (no request finished) are named in a PlotWarning."""
    _check_x_hue(x, hue, agg, "plot_ttft_vs")
    cols = [x, hue] + [f"{metric}.{p}" for p in percentiles]
    _require(runs, cols, "runs")
    _warn_null_runs(runs, cols[2:], "plot_ttft_vs")
    r = _one_per_cell(runs[cols], [x, hue], agg, "plot_ttft_vs")
    xs = _sorted_unique(r[x])
    fig, axes = _new_fig(len(percentiles))
    for ax, p in zip(axes[0], percentiles):
        pos = _cat_x(ax, xs, x)
        for hv in _sorted_unique(r[hue]):
            sub = r[r[hue] == hv].set_index(x)
            ax.plot([pos[v] for v in xs], [sub[f"{metric}.{p}"].get(v, np.nan) for v in xs],
                    marker="o", label=str(hv))
        ax.set_title(f"{metric[:-2].upper()} {p}")
        ax.set_yscale("log")
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel(f"{metric} (s)")
    axes[0][0].legend(title=hue, fontsize=8)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Figures from requests


def _finished(req: pd.DataFrame) -> pd.DataFrame:
    if "status" in req.columns:
        return req[req["status"] == "finished"]
    return req


def plot_ttft_cdf(requests: pd.DataFrame, by="codec", log: bool = True):
    """Empirical CDF of per-request TTFT (seconds, finished requests), one curve per ``by`` group
    (a column name, a comma-separated string or a list). Raises PlotError on missing columns or
    no finished request; runs (``run_id``) with no finished request are named in a PlotWarning."""
    by = _as_list(by)
    _require(requests, ["ttft_s", *by], "requests")
    req = _finished(requests).dropna(subset=["ttft_s"])
    if req.empty:
        raise PlotError("plot_ttft_cdf: no finished request with a TTFT")
    _warn_runs_without_ttft(requests, req, "plot_ttft_cdf")
    labels = _labels(req, by)
    fig, axes = _new_fig(w=5.5, h=3.8)
    ax = axes[0][0]
    for lab in _label_order(req, by):
        v = np.sort(req.loc[labels == lab, "ttft_s"].to_numpy(dtype=float))
        if log:
            v = np.maximum(v, 1e-6)
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=f"{lab} (n={len(v)})")
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("TTFT (s)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.01)
    ax.grid(alpha=0.3, which="both")
    ax.legend(title=" / ".join(by) or None, fontsize=8)
    fig.tight_layout()
    return fig


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
    """Stacked horizontal bars of the mean TTFT per ``by`` group split into queue, onboarding
    (host / disk / wait: write-back waits and layer stalls), prefill and other (see
    :func:`ttft_decomposition`; seconds; ``other`` is drawn only where it is not 0). With
    ``tail`` (e.g. 0.9) only each group's slowest requests are averaged."""
    d = ttft_decomposition(requests, by, tail)
    parts = [c for c in d.columns if c != "ttft_s"]
    if (d["other"].abs() <= 1e-9 * max(float(d["ttft_s"].abs().max()), 1e-12)).all():
        parts.remove("other")  # (rounding only: the recorded parts close the sum)
    fig, axes = _new_fig(w=7.0, h=max(2.5, 0.45 * len(d) + 1.5))
    ax = axes[0][0]
    y = np.arange(len(d))
    left = np.zeros(len(d))
    for c in parts:
        vals = d[c].to_numpy(dtype=float)
        ax.barh(y, vals, left=left, color=TTFT_PART_COLORS.get(c),
                label=TTFT_PART_LABELS.get(c, c.removesuffix("_s")))
        left += vals
    ax.set_yticks(y)
    ax.set_yticklabels(d.index)
    ax.invert_yaxis()
    ax.set_ylabel(d.index.name)
    ax.set_xlabel("mean TTFT (s)" + (f", requests at or above the p{tail * 100:g}" if tail else ""))
    ax.legend(fontsize=8, ncols=min(len(parts), 5), loc="upper center",
              bbox_to_anchor=(0.5, -0.14 - 0.6 / fig.get_figheight()), frameon=False)
    ax.set_xlim(0, max(float(left.max()), 1e-9) * 1.05)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------------------------------------
# Figures from rounds (eviction / compaction) and steps


def plot_blocks_freed(rounds: pd.DataFrame, by=("policy", "compaction"), block_size: int | None = None):
    """Tokens evicted vs blocks freed per ``by`` group (one eviction round per row of
    ``rounds``; a ``requests`` frame with ``tokens_evicted``/``blocks_freed`` works too).

    Left: per-round scatter, blocks freed against tokens evicted, with the ideal line
    ``tokens / block_size`` when ``block_size`` is given (or a ``cache.block_size`` column holds
    one value). Right: totals per group: blocks freed and, beside them, the blocks' worth of
    evicted tokens. Raises PlotError on missing columns or an empty frame.
    """
    by = _as_list(by)
    _require(rounds, ["tokens_evicted", "blocks_freed", *by], "rounds")
    if rounds.empty:
        raise PlotError("plot_blocks_freed: no rounds (did any policy evict?)",
                        cli="blocks-freed: no compression rounds in these runs, nothing to draw "
                            "(policy=full evicts nothing; a policy's rounds start once a request "
                            "passes policy.budget)")
    if block_size is None and "cache.block_size" in rounds.columns:
        bs = rounds["cache.block_size"].dropna().unique()
        if len(bs) == 1:
            block_size = int(bs[0])
    labels = _labels(rounds, by)
    groups = _label_order(rounds, by)
    fig, axes = _new_fig(2, w=5.0, h=3.8)
    ax = axes[0][0]
    for g in groups:
        sub = rounds[labels == g]
        ax.scatter(sub["tokens_evicted"], sub["blocks_freed"], s=10, alpha=0.6, label=g)
    if block_size:
        m = float(rounds["tokens_evicted"].max())
        ax.plot([0, m], [0, m / block_size], "k--", lw=1, label=f"ideal (tokens / {block_size})")
    ax.set_xlabel("tokens evicted per round")
    ax.set_ylabel("blocks freed per round")
    ax.legend(fontsize=7, title=" / ".join(by) or None)
    ax.grid(alpha=0.3)
    ax = axes[0][1]
    tot = rounds.assign(_g=labels).groupby("_g")[["tokens_evicted", "blocks_freed"]].sum().loc[groups]
    y = np.arange(len(groups))
    ax.barh(y - 0.2, tot["blocks_freed"], height=0.4, label="blocks freed", color="#4C72B0")
    if block_size:
        ax.barh(y + 0.2, tot["tokens_evicted"] / block_size, height=0.4,
                label="tokens evicted / block size", color="#BBBBBB")
    ax.set_yticks(y)
    ax.set_yticklabels(groups)
    ax.set_xlabel("blocks (total over the run)")
    ax.legend(fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def longest_request(rounds: pd.DataFrame) -> int:
    """The request id with the most eviction rounds (over all runs): the default subject of
    :func:`plot_fragmentation`. Raises PlotError if ``rounds`` is empty."""
    _require(rounds, ["request_id"], "rounds")
    if rounds.empty:
        raise PlotError("no rounds")
    return int(rounds.groupby("request_id").size().idxmax())


def plot_fragmentation(rounds: pd.DataFrame, request_id: int | None = None,
                       by=("policy", "compaction")):
    """Fragmentation after each eviction round (``fragmentation_after``: fraction of allocated
    slots of the request's blocks that hold no live token) over simulated time for one request,
    one curve per ``by`` group. ``request_id`` defaults to :func:`longest_request`."""
    by = _as_list(by)
    _require(rounds, ["time_s", "request_id", "fragmentation_after", *by], "rounds")
    rid = longest_request(rounds) if request_id is None else int(request_id)
    sub = rounds[rounds["request_id"] == rid]
    if sub.empty:
        raise PlotError(f"plot_fragmentation: request {rid} has no rounds")
    labels = _labels(sub, by)
    fig, axes = _new_fig(w=6.0, h=3.8)
    ax = axes[0][0]
    for g in _label_order(sub, by):
        s = sub[labels == g].sort_values("time_s")
        ax.step(s["time_s"], s["fragmentation_after"], where="post", marker=".", label=g)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("fragmentation after round")
    ax.set_ylim(bottom=0)
    ax.set_title(f"request {rid}")
    ax.legend(fontsize=8, title=" / ".join(by) or None)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def plot_bytes_moved(rounds: pd.DataFrame, by="compaction"):
    """KV bytes moved by compaction per eviction round, per ``by`` group: left, the CDF of
    per-round MiB moved (rounds that moved nothing included); right, GiB moved in total."""
    by = _as_list(by)
    _require(rounds, ["bytes_moved", *by], "rounds")
    if rounds.empty:
        raise PlotError("plot_bytes_moved: no rounds")
    labels = _labels(rounds, by)
    groups = _label_order(rounds, by)
    fig, axes = _new_fig(2, w=5.0, h=3.6)
    ax = axes[0][0]
    for g in groups:
        v = np.sort(rounds.loc[labels == g, "bytes_moved"].to_numpy(dtype=float) / 2**20)
        ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=g)
    ax.set_xlabel("MiB moved per round")
    ax.set_ylabel("fraction of rounds")
    ax.legend(fontsize=8, title=" / ".join(by) or None)
    ax.grid(alpha=0.3)
    ax = axes[0][1]
    tot = rounds.assign(_g=labels).groupby("_g")["bytes_moved"].sum().loc[groups] / 2**30
    ax.barh(np.arange(len(groups)), tot.to_numpy(), color="#4C72B0")
    ax.set_yticks(np.arange(len(groups)))
    ax.set_yticklabels(groups)
    ax.set_xlabel("GiB moved (total)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_pool_fragmentation(steps: pd.DataFrame, by="cache.block_size", block_size: int | None = None):
    """Fragmentation of the GPU pool over simulated time from ``steps``: 1 - live KV tokens /
    (blocks used x block size), i.e. the fraction of allocated slots holding no live token (the
    partly filled last block of every sequence, plus holes left by eviction). Block size comes
    from ``block_size`` or a ``cache.block_size`` column. One curve per ``by`` group."""
    by = _as_list(by)
    _require(steps, ["time_s", "blocks_used", "live_kv_tokens", *by], "steps")
    if block_size is None:
        _require(steps, ["cache.block_size"], "steps (or pass block_size=)")
        bs = steps["cache.block_size"].astype(float)
    else:
        bs = float(block_size)
    slots = steps["blocks_used"] * bs
    frag = np.where(slots > 0, 1.0 - steps["live_kv_tokens"] / slots.where(slots > 0, 1), np.nan)
    df = steps.assign(_frag=frag, _g=_labels(steps, by))
    fig, axes = _new_fig(w=6.0, h=3.6)
    ax = axes[0][0]
    for g in _label_order(df, by):
        s = df[df["_g"] == g].sort_values("time_s")
        ax.plot(s["time_s"], s["_frag"], lw=0.8, label=g)
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("unused fraction of allocated slots")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8, title=" / ".join(by) or None)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def image_formats() -> list[str]:
    """The file extensions (without the dot) matplotlib can write a figure as: ``png``, ``pdf``,
    ``svg``, ..."""
    from matplotlib.backend_bases import FigureCanvasBase

    return sorted(FigureCanvasBase.get_supported_filetypes())


def _out_problem(path) -> str | None:
    """Why ``path`` cannot be written as an image (no or unknown extension, a folder there, or
    a file where a folder above it would be), or None if it can."""
    from sim.config import blocking_file

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


def save(fig, path) -> Path:
    """Save ``fig`` at ``path`` (150 dpi), in the format its extension names (``.png``, ``.pdf``,
    ``.svg``, ...: :func:`image_formats`); parent directories are created; close the figure.
    Raises PlotError naming the path and the supported extensions when the extension is missing or
    unknown (nothing is written)."""
    import matplotlib.pyplot as plt

    problem = _out_problem(path)
    if problem is not None:
        plt.close(fig)
        raise PlotError(f"cannot save figure: {problem}")
    p = Path(path)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(p, dpi=150, bbox_inches="tight")
    except OSError as e:
        raise PlotError(f"cannot save figure to {str(path)!r}: {e.strerror or e}; expected a "
                        f"path kvsim-plot can create and write") from None
    finally:
        plt.close(fig)
    return p


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
    from experiments.collect import BOOKKEEPING_PREFIXES, _override_key

    pairs = df[[*dict.fromkeys([*by, "run_id"])]].drop_duplicates()
    pairs = pairs.assign(_g=_labels(pairs, by))
    sel = runs[runs["run_id"].isin(set(pairs["run_id"]))].set_index("run_id")
    literal: dict = {}
    for rid, ov in sel["overrides"].items():
        for o in str(ov).split() if isinstance(ov, str) else []:
            kv = _override_key(o)
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


def _draw(args, col: Collected):
    runs = _filter_runs(col.runs, args.where or [])
    ids = set(runs["run_id"])

    def table(name, need):
        df = col.table(name, run_columns=[c for c in need if c in runs.columns])
        df = df[df["run_id"].isin(ids)]
        _warn_pooled(df, runs, _as_list(args.by), args.figure)
        return df

    k = args.figure
    if k == "hit-by-tier":
        return plot_hit_by_tier(runs, x=args.x, hue=args.hue, agg=args.agg)
    if k == "disk-share":
        return plot_disk_share(runs, x=args.x, hue=args.hue, agg=args.agg)
    if k == "ttft-vs":
        return plot_ttft_vs(runs, x=args.x, hue=args.hue, agg=args.agg)
    by = _as_list(args.by)
    if k == "ttft-cdf":
        return plot_ttft_cdf(table("requests", by), by=by)
    if k == "ttft-decomposition":
        return plot_ttft_decomposition(table("requests", by), by=by, tail=args.tail)
    if k == "blocks-freed":
        return plot_blocks_freed(table("rounds", [*by, "cache.block_size"]), by=by)
    if k == "fragmentation":
        return plot_fragmentation(table("rounds", by), request_id=args.request_id, by=by)
    if k == "bytes-moved":
        return plot_bytes_moved(table("rounds", by), by=by)
    if k == "pool-fragmentation":
        return plot_pool_fragmentation(table("steps", [*by, "cache.block_size"]), by=by)
    raise PlotError(f"unknown figure {k!r}")


FIGURES = {
    "hit-by-tier": ("runs", "tiers.host_gib", "codec", None),
    "disk-share": ("runs", "tiers.host_gib", "codec", None),
    "ttft-vs": ("runs", "tiers.host_gib", "codec", None),
    "ttft-cdf": ("requests", None, None, "codec"),
    "ttft-decomposition": ("requests", None, None, "codec"),
    "blocks-freed": ("rounds", None, None, "policy,compaction"),
    "fragmentation": ("rounds", None, None, "policy,compaction"),
    "bytes-moved": ("rounds", None, None, "compaction"),
    "pool-fragmentation": ("steps", None, None, "cache.block_size"),
}


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

    for name, (src, x, hue, by) in FIGURES.items():
        p = parsers[name] = sub.add_parser(name, help=f"from {src}")
        options[name] = {"-h", "--help"}

        def add(*flags, _p=p, _name=name, **kw):
            _p.add_argument(*flags, **kw)
            options[_name].update(f for f in flags if f.startswith("-"))

        add("collected", help="directory written by kvsim-collect")
        add("--out", required=True,
            help="output image; the extension picks the format (.png, .svg, .pdf, ...)")
        add("--where", action="append", metavar="COL=VALUE",
            help="keep runs with runs.parquet COL == VALUE (repeatable)")
        if src == "runs":
            add("--x", default=x, help=f"x column (default {x})")
            add("--hue", default=hue, help=f"one curve / panel per value (default {hue})")
            add("--agg", default=None, choices=AGGS,
                help="combine runs sharing an (x, hue) cell (e.g. seeds) by this "
                     "statistic of their values (default: such runs are an error)")
        else:
            add("--by", default=by, help=f"comma-separated grouping columns (default {by})")
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
            out = save(fig, args.out)
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
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
