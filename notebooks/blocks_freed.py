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
# # How many GPU blocks does evicting tokens actually save?
#
# A KV-cache eviction policy drops tokens, but a paged cache gets memory back only when whole
# blocks empty; a compactor moves the surviving tokens so that blocks do empty, at the price of
# copying KV bytes. This notebook compares eviction policies (full: no eviction, h2o,
# triattention; budget 512 tokens) and compactors (none, forward_pack, hole_fill) on 16
# synthetic reasoning requests with ~1,200 output tokens: the blocks held over time and at the
# peak against `full` (the net saving), the blocks the eviction rounds free (gross, which
# counts per-step churn), the fragmentation of one long request's blocks and the bytes the
# compactors move. It runs its own small sweep (9 runs), collects it and saves each figure with
# its data (CSV beside the PNG) to `notebooks/figures/` (`KVSIM_NOTEBOOK_FIGURES` names another
# folder); `kvsim-plot blocks-freed|fragmentation|bytes-moved COLLECTED_DIR` draws the same.

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
    "trace=synthetic_reasoning", "trace.num_sessions=16", "trace.output_mean=1200",
    "trace.output_sigma=0.3", "policy.budget=512",
    "policy=full,h2o,triattention",
    "compaction=none,forward_pack,hole_fill",
]
BY = ["policy", "compaction"]

# %%
res = run_sweep(SWEEP, SWEEPS / "blocks_freed", n_jobs=N_JOBS)
print(f"{len(res.runs)} runs collected into {res.out_dir}; failed: {len(res.failed)}")
assert not res.failed, res.failed

# %%
col = plots.load_collected(res.out_dir)
runs = col.runs
runs[["policy", "compaction", "tokens_evicted_total", "blocks_freed_total", "peak_gpu_blocks_used",
      "bytes_moved_total", "mean_fragmentation", "logical_compression_ratio",
      "physical_compression_ratio"]].sort_values(BY)

# %% [markdown]
# ## Blocks held, net and gross frees
# Top: the GPU blocks held over simulated time, one curve per policy and compactor (the three
# `full` runs are the same run: without eviction the compactor has nothing to do). Bottom left,
# the net saving: each run's peak and time-averaged blocks held, with the same run under
# `policy=full` as a black tick and the difference in percent. Bottom right, the gross frees:
# the blocks the eviction rounds freed, summed, beside the blocks' worth of the tokens evicted.
# Gross frees count churn: a policy that evicts a token at every decode step frees a block that
# the next step allocates again, so its gross frees can exceed the evicted tokens' worth many
# times while the blocks it holds fall far less.

# %%
rounds = col.table("rounds", run_columns=["cache.block_size"])
steps = col.table("steps", run_columns=["cache.block_size"])
fig_blocks = plots.plot_blocks_freed(rounds, by=BY, steps=steps)
plots.save(fig_blocks, FIGURES / "blocks_freed.png")
fig_blocks

# %% [markdown]
# ## How fragmented do one long request's blocks get?
# The request with the most eviction rounds: the fraction of the slots of its blocks holding no
# live token after each round, one curve per policy and compactor.

# %%
fig_frag = plots.plot_fragmentation(rounds, by=BY)
plots.save(fig_frag, FIGURES / "fragmentation_one_request.png")
fig_frag

# %% [markdown]
# ## How many KV bytes do the compactors move?
# Top: the CDF over eviction rounds of the MiB each round copied; bottom: GiB copied over the run.

# %%
fig_bytes = plots.plot_bytes_moved(rounds, by=BY)
plots.save(fig_bytes, FIGURES / "bytes_moved.png")
fig_bytes

# %% [markdown]
# ## What the figures say
# Read off the figures' own tables (`plots.figure_data`, also the CSV files beside the PNGs).

# %%
blocks = plots.figure_data(fig_blocks).set_index(BY)
frag = plots.figure_data(fig_frag)
moved = plots.figure_data(fig_bytes).set_index(BY)
evicting = blocks[blocks.index.get_level_values("policy") != "full"]
best = evicting["peak_saved_frac"].idxmax()
churn = (evicting["gross_blocks_freed"] / evicting["tokens_evicted_blocks"]).dropna()
most = churn.idxmax()
last = frag.sort_values("time_s").groupby(BY)["fragmentation_after"].last()
heavy = moved["gib_total"].idxmax()


def name(key):
    return f"{key[0]} with {key[1]}"


b, ch = evicting.loc[best], evicting.loc[most]
lines = [
    f"* Net: {name(best)} saves the most, {b['peak_blocks']:,.0f} blocks held at the peak "
    f"against {b['baseline_peak_blocks']:,.0f} for the same run under full "
    f"({b['peak_saved_frac']:.0%} fewer; {b['mean_saved_frac']:.0%} fewer on average over time).",
    f"* Gross: the rounds of {name(most)} freed {ch['gross_blocks_freed']:,.0f} blocks, "
    f"{churn[most]:.1f} times the {ch['tokens_evicted_blocks']:,.0f} blocks' worth of tokens it "
    f"evicted, while its peak fell by {ch['peak_saved']:,.0f} blocks"
    + (": most of those frees are blocks taken again by the next steps (churn)."
       if churn[most] > 2 else ": the rounds free about the blocks' worth they evict."),
    f"* Request {int(frag['request_id'].iloc[0])}'s blocks end with "
    + ", ".join(f"{v:.0%} unused under {name(k)}" for k, v in last.items()) + ".",
    f"* {name(heavy)} moves the most KV bytes: {moved.loc[heavy, 'gib_total']:.3g} GiB over "
    f"{moved.loc[heavy, 'rounds']:,.0f} rounds.",
]
Markdown("\n".join(lines))
