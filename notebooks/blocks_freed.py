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
# # Tokens evicted vs blocks freed
#
# Evicting tokens from a paged KV cache frees memory only when whole blocks empty. This
# notebook compares eviction policies and compactors on long reasoning decodes: tokens evicted
# against blocks actually freed, the fragmentation of one long request over time, and the KV
# bytes each compaction round moves. It runs its own small sweep (policy full / h2o /
# triattention x compaction none / forward_pack / hole_fill on 16 synthetic reasoning
# requests of ~1,200 output tokens, budget 512), collects it and saves the figures to `notebooks/figures/`
# (`kvsim-plot blocks-freed|fragmentation|bytes-moved|pool-fragmentation COLLECTED_DIR`).

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
    "trace=synthetic_reasoning", "trace.num_sessions=16", "trace.output_mean=1200",
    "trace.output_sigma=0.3", "policy.budget=512",
    "policy=full,h2o,triattention",
    "compaction=none,forward_pack,hole_fill",
]

# %%
res = run_sweep(SWEEP, SWEEPS / "blocks_freed", n_jobs=N_JOBS)
print(f"{len(res.runs)} runs collected into {res.out_dir}; failed: {len(res.failed)}")
assert not res.failed, res.failed

# %%
col = plots.load_collected(res.out_dir)
runs = col.runs
runs[["policy", "compaction", "tokens_evicted_total", "blocks_freed_total", "bytes_moved_total",
      "mean_fragmentation", "logical_compression_ratio", "physical_compression_ratio"]].sort_values(
    ["policy", "compaction"])

# %% [markdown]
# ## Tokens evicted vs blocks freed, per policy and compactor
# Left: one dot per eviction round; the dashed line is the ideal (every evicted block's worth
# of tokens frees a block). Right: totals over the run.

# %%
rounds = col.table("rounds", run_columns=["cache.block_size"])
fig = plots.plot_blocks_freed(rounds, by=["policy", "compaction"])
plots.save(fig, FIGURES / "blocks_freed.png")
fig

# %% [markdown]
# ## Fragmentation over time for one long request
# The request with the most eviction rounds; fraction of its allocated slots holding no live
# token after each round.

# %%
rid = plots.longest_request(rounds)
fig = plots.plot_fragmentation(rounds, request_id=rid, by=["policy", "compaction"])
plots.save(fig, FIGURES / "fragmentation_one_request.png")
fig

# %% [markdown]
# ## Bytes moved per round

# %%
fig = plots.plot_bytes_moved(rounds, by=["policy", "compaction"])
plots.save(fig, FIGURES / "bytes_moved.png")
fig

# %% [markdown]
# ## Pool-level fragmentation over time
# From the per-step table: 1 - live KV tokens / (blocks used x block size).

# %%
steps = col.table("steps", run_columns=["cache.block_size"])
fig = plots.plot_pool_fragmentation(steps, by=["policy", "compaction"])
plots.save(fig, FIGURES / "pool_fragmentation.png")
fig
