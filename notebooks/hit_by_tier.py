# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Prefix hits by tier
#
# Where do prefix-cache hits come from when a host-DRAM and a disk tier sit below the GPU block
# pool, and how does that change with the host capacity and the cold-page codec?
#
# The notebook runs its own small sweep (`kvsim -m`, local joblib launcher, 2 workers), collects
# it with `kvsim-collect` and draws the figures with `experiments.plots` (the same figures come
# out of `kvsim-plot hit-by-tier|disk-share|ttft-vs COLLECTED_DIR`). Figures are saved to
# `notebooks/figures/`. Workload: the synthetic multi-turn chat trace (32 sessions, ~260
# requests) with the GPU pool cut to 1,200 blocks so that prefixes spill to host and disk.
# Takes well under a minute on 2 cores. To analyse a sweep you ran yourself, set `COLLECTED`
# to its `kvsim-collect` output and skip the sweep cell.

# %%
import os
from pathlib import Path

import experiments
from experiments import plots
from experiments.collect import run_sweep

REPO = Path(experiments.__file__).resolve().parent.parent
SWEEPS = Path(os.environ.get("KVSIM_NOTEBOOK_SWEEPS", REPO / "multirun" / "notebooks"))
FIGURES = REPO / "notebooks" / "figures"
N_JOBS = int(os.environ.get("KVSIM_NOTEBOOK_JOBS", "2"))

SWEEP = [
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
# ## Hit ratio by tier vs host capacity
# Stacked bars: fraction of prompt tokens served from the GPU pool, host DRAM and disk, one
# panel per codec; the last panel compares the total hit ratio of the codecs. A denser codec
# holds more pages in the same host GiB, so hits move from disk to host.

# %%
fig = plots.plot_hit_by_tier(runs, x="tiers.host_gib", hue="codec")
plots.save(fig, FIGURES / "hit_by_tier.png")
fig

# %% [markdown]
# ## Disk share of hits

# %%
fig = plots.plot_disk_share(runs, x="tiers.host_gib", hue="codec")
plots.save(fig, FIGURES / "disk_share.png")
fig

# %% [markdown]
# ## TTFT percentiles vs host capacity

# %%
fig = plots.plot_ttft_vs(runs, x="tiers.host_gib", hue="codec")
plots.save(fig, FIGURES / "ttft_vs_host_gib.png")
fig

# %% [markdown]
# ## Bytes moved between tiers

# %%
runs[["tiers.host_gib", "codec", "bytes_offloaded.host", "bytes_offloaded.disk",
      "bytes_onboarded.host", "bytes_onboarded.disk", "peak_host_pages", "peak_disk_pages"]].sort_values(
    ["codec", "tiers.host_gib"])
