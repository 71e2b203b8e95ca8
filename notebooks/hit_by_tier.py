# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Which tier serves the prefix hits as the host DRAM tier grows, and what does it do to TTFT?
#
# When host DRAM and a disk tier sit below the GPU block pool, a prefix evicted from the GPU can
# still be a hit, served from host or disk. This notebook sweeps the host tier's capacity (0.25,
# 1 and 4 GiB, disk 16 GiB) and the cold-page codec (identity, nvfp4: denser pages) on the
# synthetic multi-turn chat trace (32 sessions, ~260 requests) with the GPU pool cut to 1,200
# blocks so that prefixes spill to host and disk.
#
# It runs its own small sweep (`kvsim -m`, local joblib launcher, 2 workers), collects it with
# `kvsim-collect` and draws the figures with `experiments.plots` (the same figures come out of
# `kvsim-plot hit-by-tier|disk-share|ttft-vs COLLECTED_DIR`). Each figure is saved with its data
# (CSV beside the PNG) to `notebooks/figures/` (`KVSIM_NOTEBOOK_FIGURES` names another folder).
# Takes well under a minute on 2 cores. To analyse a sweep you ran yourself, set `COLLECTED` to
# its `kvsim-collect` output and skip the sweep cell.

# %%
import os
from pathlib import Path

from IPython.display import Markdown

import experiments
from experiments import plots
from experiments.collect import run_sweep

REPO = Path(experiments.__file__).resolve().parent.parent
SWEEPS = Path(os.environ.get("KVSIM_NOTEBOOK_SWEEPS", REPO / "multirun" / "notebooks"))
FIGURES = Path(os.environ.get("KVSIM_NOTEBOOK_FIGURES", REPO / "notebooks" / "figures"))
N_JOBS = int(os.environ.get("KVSIM_NOTEBOOK_JOBS", "2"))

SWEEP = [
    "cluster.replicas=1",
    "trace=synthetic_multiturn", "trace.num_sessions=32",
    "cache.num_gpu_blocks=1200",
    "tiers=gpu_host_disk", "tiers.host_gib=0.25,1,4", "tiers.disk_gib=16",
    "codec=identity,nvfp4",
]

# %%
res = run_sweep(SWEEP, SWEEPS / "hit_by_tier", n_jobs=N_JOBS)
COLLECTED = res.out_dir
print(f"{len(res.runs)} runs collected into {COLLECTED}; failed: {len(res.failed)}")
assert not res.failed, res.failed

# %%
col = plots.load_collected(COLLECTED)
runs = col.runs
runs[["tiers.host_gib", "codec", "hit_ratio.gpu", "hit_ratio.host", "hit_ratio.disk",
      "hit_ratio.total", "disk_share_of_hits", "ttft_s.p50", "ttft_s.p99"]].sort_values(
    ["codec", "tiers.host_gib"])

# %% [markdown]
# ## Which tier serves the hits?
# Stacked bars, one panel per codec: the fraction of prompt tokens served from the GPU pool,
# host DRAM and disk at each host capacity; the last panel compares the codecs' total hit
# ratio. A denser codec holds more pages in the same host GiB, so hits move from disk to host.

# %%
fig_hit = plots.plot_hit_by_tier(runs, x="tiers.host_gib", hue="codec")
plots.save(fig_hit, FIGURES / "hit_by_tier.png")
fig_hit

# %% [markdown]
# ## How much of the hits has to come from disk?
# The disk-served share of all hit tokens, one curve per codec.

# %%
fig_disk = plots.plot_disk_share(runs, x="tiers.host_gib", hue="codec")
plots.save(fig_disk, FIGURES / "disk_share.png")
fig_disk

# %% [markdown]
# ## What does that do to TTFT?
# TTFT p50, p90 and p99 of each run against the host capacity, one curve per codec.

# %%
fig_ttft = plots.plot_ttft_vs(runs, x="tiers.host_gib", hue="codec")
plots.save(fig_ttft, FIGURES / "ttft_vs_host_gib.png")
fig_ttft

# %% [markdown]
# ## Bytes moved between tiers

# %%
runs[["tiers.host_gib", "codec", "bytes_offloaded.host", "bytes_offloaded.disk",
      "bytes_onboarded.host", "bytes_onboarded.disk", "peak_host_pages", "peak_disk_pages"]].sort_values(
    ["codec", "tiers.host_gib"])

# %% [markdown]
# ## What the figures say
# Read off the figures' own tables (`plots.figure_data`, also the CSV files beside the PNGs).

# %%
hit = plots.figure_data(fig_hit).set_index(["codec", "tiers.host_gib"]).sort_index()
disk = plots.figure_data(fig_disk).set_index(["codec", "tiers.host_gib"]).sort_index()
ttft = plots.figure_data(fig_ttft).set_index(["codec", "tiers.host_gib"]).sort_index()
small, large = hit.index.get_level_values(1).min(), hit.index.get_level_values(1).max()
total = hit["hit_ratio.total"]


def change(a, b):
    return "falls" if b < a else "rises" if b > a else "stays"


spread = total.max() - total.min()
lo, hi = f"{total.min():.1%}", f"{total.max():.1%}"
lines = [(f"* The total hit ratio is {lo} in every run" if lo == hi
          else f"* The total hit ratio is between {lo} and {hi}")
         + (": the host capacity and the codec move hits between tiers, they barely change how "
            "many there are." if spread < 0.02 else f", {spread:.1%} apart.")]
for c in hit.index.get_level_values(0).unique():
    d0, d1 = disk.loc[(c, small), "disk_share_of_hits"], disk.loc[(c, large), "disk_share_of_hits"]
    h0, h1 = hit.loc[(c, small), "hit_ratio.host"], hit.loc[(c, large), "hit_ratio.host"]
    t0, t1 = ttft.loc[(c, small), "ttft_s.p90"], ttft.loc[(c, large), "ttft_s.p90"]
    lines.append(f"* With {c} pages, from {small:g} to {large:g} GiB of host DRAM the host serves "
                 f"{h0:.1%} then {h1:.1%} of prompt tokens, the disk's share of hits {change(d0, d1)} "
                 f"from {d0:.0%} to {d1:.0%}, and TTFT p90 {change(t0, t1)} from {t0 * 1e3:.1f} to "
                 f"{t1 * 1e3:.1f} ms.")
Markdown("\n".join(lines))
