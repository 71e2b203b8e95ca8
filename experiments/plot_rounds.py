"""Figures of the per-round (eviction / compaction) and per-step tables (``rounds/``,
``steps/``): GPU blocks freed by evicting tokens (:func:`plot_blocks_freed`), one request's
fragmentation (:func:`plot_fragmentation`, :func:`longest_request`), KV bytes moved by compaction
(:func:`plot_bytes_moved`) and how full the allocated slots are (:func:`plot_pool_fragmentation`).
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from experiments.plot_common import (PlotError, PlotWarning, _as_list, _binned, _by_title, _display,
                                     _label_order, _labels, _legend_right, _new_fig, _plain_log_ticks,
                                     _require, _set_data, _step_intervals, _title, group_styles)


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
        ax_n.barh(y - 0.2, table["peak_blocks"], height=0.4, color="#4C72B0", label="peak held")
        ax_n.barh(y + 0.2, table["mean_blocks"], height=0.4, color="#A1C3E8",
                  label="time-averaged held")
        if table["baseline_peak_blocks"].notna().any():
            ax_n.plot(table["baseline_peak_blocks"], y - 0.2, "|", color="black", ms=11, mew=2,
                      label=f"same run with policy={baseline}")
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
    # The bar panels' keys in one row under the whole figure: constrained layout reserves the
    # row below the axis titles, whatever the panels' height (one run or many).
    handles, labels = [], []
    for ax in (ax_n, ax_g):
        if ax is not None:
            h, lab = ax.get_legend_handles_labels()
            handles += h
            labels += lab
    fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), fontsize=7.5,
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
