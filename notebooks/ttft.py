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
# # Where does the time to first token go when host DRAM and disk sit below the GPU?
#
# A request's TTFT is its wait for admission, the onboarding of the prefix pages it reuses from
# host DRAM or disk, and its prefill. This notebook compares memory hierarchies (GPU only, + host
# 1 GiB, + disk 16 GiB, both) and cold-page codecs (identity, nvfp4) on the synthetic multi-turn
# chat trace (32 sessions, ~260 requests) with the GPU pool cut to 1,200 blocks so that prefixes
# spill below it. It runs its own small sweep (8 runs), collects it and saves each figure with
# its data (CSV beside the PNG) to `notebooks/figures/` (`KVSIM_NOTEBOOK_FIGURES` names another
# folder). `kvsim-plot ttft-cdf|ttft-decomposition COLLECTED_DIR` draws the same figures, one
# curve / bar per run.

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
    "tiers=gpu_host_disk", "tiers.host_gib=0,1", "tiers.disk_gib=0,16",
    "codec=identity,nvfp4",
]

# %%
res = run_sweep(SWEEP, SWEEPS / "ttft", n_jobs=N_JOBS)
print(f"{len(res.runs)} runs collected into {res.out_dir}; failed: {len(res.failed)}")
assert not res.failed, res.failed

# %%
col = plots.load_collected(res.out_dir)
req = col.table("requests")


def hierarchy(r):
    """A readable name for a run's memory hierarchy."""
    parts = ["GPU"]
    if r["tiers.host_gib"] > 0:
        parts.append(f"host {r['tiers.host_gib']:g} GiB")
    if r["tiers.disk_gib"] > 0:
        parts.append(f"disk {r['tiers.disk_gib']:g} GiB")
    return " + ".join(parts)


req["hierarchy"] = req.apply(hierarchy, axis=1)
BY = ["hierarchy", "codec"]
req.groupby(BY)[["ttft_s", "queue_s", "onboard_host_s", "onboard_disk_s", "prefill_s"]].mean()

# %% [markdown]
# ## How is TTFT distributed in each hierarchy?
# One curve per hierarchy and codec: the fraction of finished requests (y) whose TTFT is at most
# x seconds (log scale). Solid curves are identity pages, dashed ones nvfp4; without a host or
# disk tier the codec changes nothing, so those two curves lie on each other (the wider one
# drawn first shows at the edges).

# %%
fig_cdf = plots.plot_ttft_cdf(req, by=BY)
plots.save(fig_cdf, FIGURES / "ttft_cdf.png")
fig_cdf

# %% [markdown]
# ## Where does the mean TTFT go?
# One bar per hierarchy and codec, split into the parts of TTFT: queue (waiting for admission),
# the host-to-GPU copy, the disk read, the onboarding wait (write-back copies the reused blocks
# wait for; with layerwise onboarding, the stall after the prefill) and the prefill. They sum to
# the mean TTFT (written at each bar's end). Disk pages reach the GPU through host memory: they
# are read from disk into host DRAM, then copied to the GPU, so a hierarchy with a disk and no
# host tier still shows a host-to-GPU segment.

# %%
fig_parts = plots.plot_ttft_decomposition(req, by=BY)
plots.save(fig_parts, FIGURES / "ttft_decomposition.png")
fig_parts

# %% [markdown]
# ## And for the slowest 10% of requests?
# The same split, averaged over the requests at or above their group's p90 TTFT.

# %%
fig_tail = plots.plot_ttft_decomposition(req, by=BY, tail=0.9)
plots.save(fig_tail, FIGURES / "ttft_decomposition_p90.png")
fig_tail

# %% [markdown]
# ## What the figures say
# Read off the figures' own tables (`plots.figure_data`, also the CSV files beside the PNGs).

# %%
cdf = plots.figure_data(fig_cdf)
parts = plots.figure_data(fig_parts).set_index(BY)
tail = plots.figure_data(fig_tail).set_index(BY)
median = cdf[cdf["fraction"] >= 0.5].groupby(BY)["ttft_s"].min()
best, worst = parts["ttft_s"].idxmin(), parts["ttft_s"].idxmax()
ms = 1e3


def name(key):
    return f"{key[0]} with {key[1]} pages"


disk = parts[parts.index.get_level_values("hierarchy").str.contains("disk")]
disk_share = (disk["onboard_disk_s"] / disk["ttft_s"]).groupby(level="codec").mean()
onboard_cols = [c for c in ("onboard_host_s", "onboard_disk_s", "onboard_wait_s") if c in tail]
tail_onboard = tail[onboard_cols].sum(axis=1) / tail["ttft_s"]
Markdown(
    f"* Mean TTFT is lowest for {name(best)} ({parts.loc[best, 'ttft_s'] * ms:.1f} ms) and "
    f"highest for {name(worst)} ({parts.loc[worst, 'ttft_s'] * ms:.1f} ms); their median TTFTs "
    f"are {median.loc[best] * ms:.1f} and {median.loc[worst] * ms:.1f} ms.\n"
    + "".join(f"* Where there is a disk tier, the disk read is on average "
              f"{disk_share[c]:.0%} of the mean TTFT with {c} pages.\n" for c in disk_share.index)
    + f"* Among the slowest 10% of requests, onboarding (copy, read and wait) is up to "
    f"{tail_onboard.max():.0%} of the mean TTFT ({name(tail_onboard.idxmax())}), against "
    f"{tail_onboard.min():.0%} for {name(tail_onboard.idxmin())}.")
