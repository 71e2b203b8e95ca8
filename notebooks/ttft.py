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
# # TTFT: distributions and where the time goes
#
# TTFT CDFs per memory hierarchy and codec, and the mean TTFT split into queueing, onboarding
# from host and from disk, and prefill. The notebook runs its own small sweep (8 runs of the
# synthetic multi-turn trace, GPU pool cut to 1,200 blocks; host 0 or 1 GiB x disk 0 or 16 GiB
# x codec identity / nvfp4), collects it and saves the figures to `notebooks/figures/`
# (`kvsim-plot ttft-cdf|ttft-decomposition COLLECTED_DIR --by ...` draws the same).

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
# A readable name for each memory hierarchy.
def hierarchy(r):
    parts = ["GPU"]
    if r["tiers.host_gib"] > 0:
        parts.append(f"host {r['tiers.host_gib']:g} GiB")
    if r["tiers.disk_gib"] > 0:
        parts.append(f"disk {r['tiers.disk_gib']:g} GiB")
    return " + ".join(parts)

req["hierarchy"] = req.apply(hierarchy, axis=1)
req.groupby(["hierarchy", "codec"])[["ttft_s", "queue_s", "onboard_host_s", "onboard_disk_s",
                                     "prefill_s"]].mean()

# %% [markdown]
# ## TTFT CDFs

# %%
fig = plots.plot_ttft_cdf(req, by=["hierarchy", "codec"])
plots.save(fig, FIGURES / "ttft_cdf.png")
fig

# %% [markdown]
# ## Mean TTFT decomposition
# Queue (waiting for admission), onboarding from host, from disk and the onboarding wait (write-back
# copies the reused blocks wait for; with layerwise onboarding the stall after the prefill), prefill:
# they sum to the mean TTFT (`other`, drawn only when not 0, is what a table without those columns
# leaves uncovered).

# %%
fig = plots.plot_ttft_decomposition(req, by=["hierarchy", "codec"])
plots.save(fig, FIGURES / "ttft_decomposition.png")
fig

# %% [markdown]
# ## The slowest 10% of requests

# %%
fig = plots.plot_ttft_decomposition(req, by=["hierarchy", "codec"], tail=0.9)
plots.save(fig, FIGURES / "ttft_decomposition_p90.png")
fig

# %%
plots.ttft_decomposition(req, by=["hierarchy", "codec"], tail=0.9)
