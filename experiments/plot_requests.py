"""Figures of the per-request table (``requests/``): the TTFT distribution
(:func:`plot_ttft_cdf`) and where the time to first token goes (:func:`ttft_parts`,
:func:`ttft_part_values`, :func:`ttft_decomposition`, :func:`plot_ttft_decomposition`).
"""

from __future__ import annotations


import numpy as np
import pandas as pd

from experiments.plot_common import (PlotError, TTFT_PARTS, TTFT_PART_COLORS, TTFT_PART_LABELS, _as_list,
                                     _by_title, _display, _label_order, _labels, _legend_right, _new_fig,
                                     _plain_log_ticks, _require, _set_data, _time_unit, _title,
                                     _warn_runs_without_ttft, group_styles)


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
