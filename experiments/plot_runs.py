"""Figures of ``runs.parquet`` (one value per run, one run per (x, hue) cell): which tier serves
the prefix hits (:func:`plot_hit_by_tier`), the share that comes from disk
(:func:`plot_disk_share`), and TTFT percentiles against a swept column (:func:`plot_ttft_vs`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from experiments.plot_common import (COLUMN_LABELS, PlotError, TIERS, TIER_COLORS, _cat_x, _check_x_hue,
                                     _hit_col, _labels, _legend_right, _new_fig, _one_per_cell,
                                     _plain_log_ticks, _require, _set_data, _sorted_unique, _title,
                                     _warn_null_runs, axis_label, group_styles)


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
    # One key beside the last panel, below the figure's title: the bars' tiers, then a heading
    # (an entry with a hidden handle) and the total's curves.
    from matplotlib.patches import Rectangle

    h2, l2 = ax.get_legend_handles_labels()
    heading = Rectangle((0, 0), 0, 0, visible=False)
    entries = handles[::-1] + [heading] + h2
    lg = ax.legend(entries, labels[::-1] + [f"total, by {hue}"] + l2, title="served from",
                   loc="upper left", bbox_to_anchor=(1.04, 1.0), borderaxespad=0.0,
                   frameon=False, fontsize=8, title_fontsize=8, handlelength=3.2,
                   ncols=1 if len(entries) <= 10 else 2)
    lg.get_texts()[len(handles)].set_fontweight("bold")
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
