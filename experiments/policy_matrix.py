"""Policy matrix: every eviction policy x every compactor on a reasoning and an agentic trace.

Policies: full, random, streaming_llm, h2o, tova, snapkv, pyramidkv, ada_kv, r_kv, triattention,
quest (each with its preset in ``experiments/conf/policy``); compactors none, forward_pack,
hole_fill. Traces: a ServeGen DeepSeek-R1 sample (``trace=servegen_r1 trace.num_requests=N``) and
the bundled Weka agentic slice (``trace=weka_agentic_slice``, one real session, 33 calls).
Qwen3-8B BF16 on one H200, vLLM defaults, seed 0.

Each (trace, policy-group) is one Hydra sweep run through :func:`experiments.collect.run_sweep`
(``kvsim -m``, 2 local jobs) and collected; the table is built from the collected
``runs.parquet``. Columns: tokens evicted, blocks freed, freed ratio = blocks_freed x block_size /
tokens_evicted (1 = every evicted token came back as a free slot; under ``hole_fill`` holes are
reused in place so freed blocks undercount the memory recovered), peak blocks, throughput
(prompt+output tokens/s), output tokens/s, TTFT p50/p99, eviction rounds and bytes moved.

``pyramidkv`` and ``ada_kv`` default to ``per_layer_per_head`` (36 x 8 = 288 selection groups
for Qwen3-8B). ``--slow-mode-fallback`` (default on for the full run) runs them with their
cheapest allowed grouping instead (pyramidkv ``per_layer``: 36 groups; ada_kv ``per_head``: 8
groups); the mode used is in the table's ``mode`` column.

Run: ``python -m experiments.policy_matrix [--quick] [--num-requests N]``. Writes
``experiments/results/policy_matrix{.md,.csv,.png}`` and ``policy_matrix_blocks_freed_*.png``
(kvsim-plot's ``blocks-freed`` figure per trace); sweeps go to
``outputs/experiments/policy_matrix/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import shlex
import time
from pathlib import Path

import numpy as np
import pandas as pd

from experiments._report import md_table as _md_table, write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
SCRATCH = ROOT / "outputs" / "experiments" / "policy_matrix"

POLICIES = ["full", "random", "streaming_llm", "h2o", "tova", "snapkv", "pyramidkv", "ada_kv",
            "r_kv", "triattention", "quest"]
SLOW = {"pyramidkv": "per_layer", "ada_kv": "per_head"}  # cheaper allowed grouping
STEPWISE = ("streaming_llm", "h2o", "tova")  # presets evict every token (beta 1): slow here
COMPACTORS = ["none", "forward_pack", "hole_fill"]
COMMON = ["cluster.replicas=1", "seed=0", "gpu=h200", "model=qwen3_8b"]


def sweeps(quick: bool, num_requests: int, fallback: bool, step_beta: int = 64) -> list[tuple[str, str, list[str]]]:
    """(trace label, group label, overrides) per Hydra sweep."""
    traces = {
        "servegen_r1": ["trace=servegen_r1", f"trace.num_requests={num_requests}"],
        "weka_agentic_slice": ["trace=weka_agentic_slice"],
    }
    if quick:  # the bundled Weka slice loads instantly (a ServeGen sample takes seconds to draw)
        traces = {"weka_agentic_slice": ["trace=weka_agentic_slice"]}
    pols = ["full", "triattention", "snapkv"] if quick else POLICIES
    comps = ["none", "forward_pack"] if quick else COMPACTORS
    out = []
    for t, tov in traces.items():
        fast = [p for p in pols if not (fallback and p in SLOW) and not (step_beta > 1 and p in STEPWISE)]
        out.append((t, "main", [*COMMON, *tov, f"policy={','.join(fast)}", f"compaction={','.join(comps)}"]))
        step = [p for p in pols if step_beta > 1 and p in STEPWISE]
        if step:
            out.append((t, "stepwise", [*COMMON, *tov, f"policy={','.join(step)}", f"policy.beta={step_beta}",
                                        f"compaction={','.join(comps)}"]))
        if fallback:
            for p, mode in SLOW.items():
                if p in pols:
                    out.append((t, p, [*COMMON, *tov, f"policy={p}", f"policy.mode={mode}",
                                       f"compaction={','.join(comps)}"]))
    return out


def _table(runs: pd.DataFrame) -> pd.DataFrame:
    bs = runs["cache.block_size"].astype(float)
    ev = runs["tokens_evicted_total"].astype(float)
    fr = runs["blocks_freed_total"].astype(float)
    df = pd.DataFrame({
        "trace": runs["trace_label"],
        "policy": runs["policy"],
        "mode": runs["policy.mode"].fillna("").replace("", "default"),
        "compaction": runs["compaction"],
        "cadence": runs["cadence"],
        "requests": runs["requests_finished"].astype(int),
        "tokens_evicted": ev.astype(np.int64),
        "blocks_freed": fr.astype(np.int64),
        "freed_ratio": np.where(ev > 0, fr * bs / ev.where(ev > 0, 1), np.nan),
        "rounds": runs["rounds"].astype(int),
        "peak_blocks": runs["peak_gpu_blocks_used"].astype(int),
        "preemptions": runs["preemptions"].astype(int),
        "throughput_tok_s": runs["throughput_tokens_per_s"].astype(float),
        "output_tok_s": runs["output_throughput_tokens_per_s"].astype(float),
        "ttft_p50_s": runs["ttft_s.p50"].astype(float),
        "ttft_p99_s": runs["ttft_s.p99"].astype(float),
        "gib_moved": runs["bytes_moved_total"].astype(float) / 2**30,
        "wall_s": runs["wall.wall_s"].astype(float),
    })
    df["policy"] = pd.Categorical(df["policy"], POLICIES, ordered=True)
    df["compaction"] = pd.Categorical(df["compaction"], COMPACTORS, ordered=True)
    return df.sort_values(["trace", "policy", "compaction"]).reset_index(drop=True)


FMT = {"freed_ratio": "{:.3f}", "throughput_tok_s": "{:,.0f}", "output_tok_s": "{:,.0f}",
       "ttft_p50_s": "{:.3f}", "ttft_p99_s": "{:.3f}", "gib_moved": "{:.2f}", "wall_s": "{:.1f}",
       "tokens_evicted": "{:,}", "blocks_freed": "{:,}", "peak_blocks": "{:,}"}


def md_table(df: pd.DataFrame, cols: list[str]) -> str:
    """A markdown table with this module's number formats."""
    return _md_table(df, cols, FMT)


def scatter(df: pd.DataFrame, path: Path, block_size: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"none": "#4C72B0", "forward_pack": "#DD8452", "hole_fill": "#55A868"}
    markers = {t: m for t, m in zip(sorted(df["trace"].unique()), ["o", "^", "s"])}
    fig, ax = plt.subplots(figsize=(6.6, 5.0))
    d = df[df["tokens_evicted"] > 0]
    for (t, c), sub in d.groupby(["trace", "compaction"], observed=True):
        y = sub["blocks_freed"].clip(lower=0.5)  # 0 freed drawn at 0.5 on the log axis
        ax.scatter(sub["tokens_evicted"], y, c=colors[c], marker=markers[t], s=36, alpha=0.8,
                   edgecolors="k", linewidths=0.3, label=f"{c} / {t}")
        for _, r in sub.iterrows():
            ax.annotate(str(r["policy"]).replace("streaming_llm", "stream").replace("triattention", "tri"),
                        (r["tokens_evicted"], max(r["blocks_freed"], 0.5)), fontsize=5, alpha=0.7,
                        xytext=(2, 2), textcoords="offset points")
    lo, hi = d["tokens_evicted"].min(), d["tokens_evicted"].max()
    xs = np.array([lo, hi], dtype=float)
    ax.plot(xs, xs / block_size, "k--", lw=1, label=f"ideal: tokens / {block_size}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens evicted (run total)")
    ax.set_ylabel("blocks freed (run total; 0 drawn at 0.5)")
    ax.set_title("kvsim policy x compactor: evicted tokens vs freed blocks (Qwen3-8B, H200)", fontsize=9)
    ax.legend(fontsize=6, loc="lower right")
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny version (tests)")
    ap.add_argument("--num-requests", type=int, default=None, help="ServeGen R1 sample size (150)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--step-beta", type=int, default=64,
                    help="round cadence for streaming_llm/h2o/tova (presets: 1 = every token; slow)")
    ap.add_argument("--no-fallback", action="store_true",
                    help="run pyramidkv/ada_kv in their default per_layer_per_head mode")
    args = ap.parse_args(argv)
    from experiments.collect import run_sweep
    from experiments.plots import plot_blocks_freed

    n = args.num_requests or (8 if args.quick else 150)
    fallback = not args.no_fallback
    tag = "quick" if args.quick else "full"
    name = "policy_matrix" + ("_quick" if args.quick else "")
    t0 = time.perf_counter()
    frames, cmds = [], []
    for trace, group, ov in sweeps(args.quick, n, fallback, args.step_beta):
        sweep_dir = SCRATCH / tag / f"{trace}_{group}"
        cmds.append(f"kvsim -m hydra/launcher=local hydra.launcher.n_jobs={args.jobs} "
                    f"hydra.sweep.dir={sweep_dir.relative_to(ROOT)} sim.progress=false "
                    + " ".join(shlex.quote(o) for o in ov))
        ts = time.perf_counter()
        res = run_sweep(ov, sweep_dir, n_jobs=args.jobs, fresh=False, resume=True, timeout_s=3600)
        print(f"[{trace}/{group}] {len(res.runs)} runs, {len(res.failed)} failed, "
              f"{time.perf_counter() - ts:.0f} s", flush=True)
        runs = res.runs.copy()
        runs["trace_label"] = trace
        if "policy.mode" not in runs:
            runs["policy.mode"] = ""
        runs["cadence"] = f"beta={args.step_beta}" if group == "stepwise" else "preset"
        frames.append(runs)
        # the tooling's blocks-freed figure (rounds of every run of the sweep)
    total = time.perf_counter() - t0
    allruns = pd.concat(frames, ignore_index=True)
    df = _table(allruns)
    RESULTS.mkdir(parents=True, exist_ok=True)
    df.to_csv(RESULTS / f"{name}.csv", index=False)
    bs = int(allruns["cache.block_size"].iloc[0])
    scatter(df, RESULTS / f"{name}.png", bs)
    # kvsim-plot's blocks-freed figure for the forward_pack/none main sweeps (blocks held, net
    # against policy=full, gross frees)
    figs = []
    import matplotlib.pyplot as plt

    from experiments.plots import load_collected

    shown = ["streaming_llm", "h2o", "snapkv", "triattention", "r_kv"]
    for trace in dict.fromkeys(t for t, _, _ in sweeps(args.quick, n, fallback, args.step_beta)):
        parts, step_parts = [], []
        for t, group, _ in sweeps(args.quick, n, fallback, args.step_beta):
            if t != trace or group not in ("main", "stepwise"):
                continue
            col = load_collected(SCRATCH / tag / f"{trace}_{group}" / "collected")
            for table, into in (("rounds", parts), ("steps", step_parts)):
                if table in col.tables():
                    tab = col.table(table, run_columns=["cache.block_size", "policy", "compaction"])
                    into.append(tab.assign(run_id=f"{group}/" + tab["run_id"].astype(str)))
        rounds = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
        if rounds.empty:
            continue
        rounds = rounds[rounds["policy"].isin(shown)]
        if rounds.empty:
            continue
        steps = pd.concat(step_parts, ignore_index=True) if step_parts else None
        if steps is not None:  # (policy=full: the baseline of the net saving)
            steps = steps[steps["policy"].isin([*shown, "full"])
                          & steps["compaction"].isin(set(rounds["compaction"]))]
        out = RESULTS / f"{name}_blocks_freed_{trace}.png"
        fig = plot_blocks_freed(rounds, by=["policy", "compaction"], steps=steps)
        fig.savefig(out, dpi=80, bbox_inches="tight")
        plt.close(fig)
        figs.append(out.name)
    cols = ["policy", "mode", "cadence", "compaction", "tokens_evicted", "blocks_freed", "freed_ratio", "rounds",
            "peak_blocks", "preemptions", "throughput_tok_s", "output_tok_s", "ttft_p50_s", "ttft_p99_s",
            "gib_moved", "wall_s"]
    md = ["# Policy x compactor matrix (kvsim)\n",
          f"Command: `python -m experiments.policy_matrix{' --quick' if args.quick else ''}` "
          f"(ServeGen R1 sample of {n} requests)  ",
          f"Date: {_dt.date.today().isoformat()}; total wall {total:.0f} s with {args.jobs} parallel jobs; "
          "deterministic (seed 0).\n",
          "Underlying sweeps (each collected with `kvsim-collect <dir>`):\n",
          "\n".join(f"    {c}" for c in cmds) + "\n",
          "Qwen3-8B BF16, one H200, vLLM defaults (block 16). freed_ratio = blocks_freed x 16 / "
          "tokens_evicted. `mode` = grouping used (`default` = the preset's: union for random / "
          "triattention, per_head for snapkv, per_layer for tova, ...; pyramidkv and ada_kv were "
          f"{'run with their cheaper grouping, see the notes' if fallback else 'run per_layer_per_head'}).\n"]
    for t in df["trace"].unique():
        md += [f"\n## {t}\n", md_table(df[df["trace"] == t], cols)]
    md += [f"\nFigures: `{name}.png` (run totals, log-log, colour = compactor, marker = trace); "
           + ", ".join(f"`{f}`" for f in figs) + " (kvsim-plot `blocks-freed`: blocks held over time, net "
           "saving against policy=full and gross frees; policies streaming_llm / h2o / snapkv / "
           "r_kv / triattention).\n"]
    write_report(RESULTS, name, "policy_matrix", md, args.quick)


if __name__ == "__main__":
    main()
