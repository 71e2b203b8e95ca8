"""Figure: kvsim's prefix-cache hits beside the provider's own cache reads, for one run of a
trace that records them (``trace=claude_code``, ``trace=openai_log``; docs/AGENT_TRACES.md).

Left: one point per session, the provider's cache-read tokens (x) against kvsim's hit tokens
(y), over the finished requests, with the line y = x and a +-10% band. Right (when the run's
summary.json has ``provider_cache.by_call_kind``): kvsim minus provider tokens by kind of call
(``sim.provider_cache.call_kinds``: chain starts, calls after more than 5 idle minutes, the
rest), whose sum is the total difference named in the title.

    python -m experiments.provider_cache RUN_DIR --out provider_cache.png   # + provider_cache.csv
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from .plot_common import PlotError, _new_fig, _set_data, _title, save

KINDS = {"chain_start": "chain starts", "after_idle": "after > 5 min idle",
         "continuing": "continuing calls"}


def session_table(requests: pd.DataFrame) -> pd.DataFrame:
    """Per session (finished requests): requests, prompt tokens, kvsim hit tokens, provider
    cache-read tokens and their ratio. Raises PlotError without the provider column."""
    need = ("session_id", "status", "input_tokens", "prefix_hit_tokens", "provider_cached_tokens")
    missing = [c for c in need if c not in requests.columns]
    if missing:
        raise PlotError(f"the requests table has no column {missing[0]!r}: the run's trace does "
                        f"not record the provider's cache reads (trace=claude_code or openai_log)")
    fin = requests[requests["status"] == "finished"]
    g = fin.groupby("session_id").agg(
        requests=("input_tokens", "size"), prompt_tokens=("input_tokens", "sum"),
        kvsim_hit_tokens=("prefix_hit_tokens", "sum"),
        provider_cached_tokens=("provider_cached_tokens", "sum")).reset_index()
    g["kvsim_over_provider"] = g["kvsim_hit_tokens"] / g["provider_cached_tokens"].where(
        g["provider_cached_tokens"] > 0)
    return g


def plot_provider_cache(requests: pd.DataFrame, summary: dict | None = None):
    """The figure (module docstring) from a run's requests table and, optionally, its summary."""
    t = session_table(requests)
    kinds = ((summary or {}).get("provider_cache") or {}).get("by_call_kind")
    fig, axes = _new_fig(ncols=2 if kinds else 1, w=4.6, h=3.8)
    ax = axes[0][0]
    pos = t[(t["provider_cached_tokens"] > 0) & (t["kvsim_hit_tokens"] > 0)]
    size = 12 + 60 * np.sqrt(pos["requests"] / max(float(t["requests"].max()), 1.0))
    ax.scatter(pos["provider_cached_tokens"], pos["kvsim_hit_tokens"], s=size, alpha=0.7,
               color="#4C72B0", edgecolor="white", linewidth=0.5, label="session")
    if len(pos):
        lo = float(min(pos["provider_cached_tokens"].min(), pos["kvsim_hit_tokens"].min())) / 1.5
        hi = float(max(pos["provider_cached_tokens"].max(), pos["kvsim_hit_tokens"].max())) * 1.5
        xs = np.geomspace(lo, hi, 50)
        ax.plot(xs, xs, color="black", linewidth=0.8, label="kvsim = provider")
        ax.fill_between(xs, xs * 0.9, xs * 1.1, color="#BBBBBB", alpha=0.4, label="±10%")
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel("provider cache-read tokens per session")
    ax.set_ylabel("kvsim prefix-hit tokens per session")
    left = len(t) - len(pos)
    ax.legend(fontsize=7, loc="upper left",
              title=f"{left} session(s) with a zero side not drawn" if left else None,
              title_fontsize=7)
    kv, pv = int(t["kvsim_hit_tokens"].sum()), int(t["provider_cached_tokens"].sum())
    diff = f"{100.0 * (kv - pv) / pv:+.2f}%" if pv else "n/a"
    if kinds:
        ax2 = axes[0][1]
        names = [k for k in KINDS if k in kinds]
        vals = [kinds[k]["difference_tokens"] / 1e3 for k in names]
        ax2.barh([f"{KINDS[k]}\n({kinds[k]['requests']:,} calls)" for k in names], vals,
                 color=["#55A868" if v >= 0 else "#C44E52" for v in vals])
        ax2.axvline(0, color="black", linewidth=0.8)
        ax2.set_xlabel("kvsim − provider (thousand tokens)")
        ax2.invert_yaxis()
    _title(fig, "How close are kvsim's prefix hits to the provider's cache reads?",
           f"{len(t)} sessions, {int(t['requests'].sum()):,} finished calls: kvsim {kv:,} vs "
           f"provider {pv:,} tokens ({diff})")
    return _set_data(fig, t)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="a run's results folder (requests.parquet, summary.json)")
    ap.add_argument("--out", type=Path, default=Path("provider_cache.png"))
    ap.add_argument("--dpi", type=int, default=150)
    args = ap.parse_args(argv)
    req = pd.read_parquet(args.run_dir / "requests.parquet")
    sp = args.run_dir / "summary.json"
    summary = json.loads(sp.read_text()) if sp.exists() else None
    try:
        print(save(plot_provider_cache(req, summary), args.out, dpi=args.dpi))
    except PlotError as e:
        print(f"provider_cache: error: {e}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
