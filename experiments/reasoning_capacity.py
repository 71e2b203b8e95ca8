"""Reasoning capacity: how many long-decode requests fit, dense vs TriAttention + forward packing.

Qwen3-8B BF16 on one B200 and one H200 (vLLM defaults: block 16, gpu_memory_utilization 0.9,
activation reserve estimated by sim/hardware.py). ``batch`` requests of 1,024 input and 16,384
output tokens, unique content (no prefix sharing), all arriving at t=0,
``scheduler.max_num_seqs = max(256, batch)``. Two configurations:

* dense: ``policy=full compaction=none``
* TriAttention: ``policy=triattention policy.budget=2048 policy.beta=128 compaction=forward_pack``

Per batch size: peak KV (GiB, blocks), preemptions, "fits" (every request finished with zero
preemptions), output tokens/s over the run, steady decode tokens/s (sum of decode tokens / sum of
step durations over pure-decode steps of steps.parquet), peak decode tokens/s (best pure-decode
step), mean TPOT. A side table sweeps the TriAttention budget at batch 32 on the B200 (decode
speed vs dense at the same batch).

Run: ``python -m experiments.reasoning_capacity [--quick]``. Writes
``experiments/results/reasoning_capacity{.md,.csv,.png}`` (``--quick``: ``*_quick.*``); the run
directories go to ``outputs/experiments/reasoning_capacity/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from experiments._report import md_table as _md_table, write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
SCRATCH = ROOT / "outputs" / "experiments" / "reasoning_capacity"
GIB = 2**30

FULL = dict(gpus=["b200", "h200"], batches=[16, 32, 64, 128, 256], input=1024, output=16384,
            budget=2048, beta=128, budget_sweep=[512, 1024, 2048, 4096], sweep_batch=32)
QUICK = dict(gpus=["b200"], batches=[4, 8], input=256, output=2048, budget=256, beta=64,
             budget_sweep=[256], sweep_batch=4, num_gpu_blocks=1000)


def make_workload(n: int, input_tokens: int, output_tokens: int, name: str = "reasoning"):
    """``n`` requests of unique content arriving at t=0 (copied from tests/conftest.py's
    make_workload, specialised)."""
    from traces import WORKLOAD_SCHEMA, Workload

    cols = {
        "request_id": np.arange(n, dtype=np.int64),
        "session_id": np.arange(n, dtype=np.int64),
        "turn": np.zeros(n, dtype=np.int32),
        "arrival_s": np.zeros(n, dtype=np.float64),
        "think_s": np.zeros(n, dtype=np.float64),
        "parent_request_id": np.full(n, -1, dtype=np.int64),
        "input_tokens": np.full(n, input_tokens, dtype=np.int64),
        "output_tokens": np.full(n, output_tokens, dtype=np.int64),
    }
    arrays = []
    for field in WORKLOAD_SCHEMA:
        if field.name == "prefix_ids":
            arrays.append(pa.array([[] for _ in range(n)], type=field.type))
        elif field.name == "prefix_block_tokens":
            arrays.append(pa.array([0] * n, type=field.type))
        else:
            arrays.append(pa.array(cols[field.name], type=field.type))
    table = pa.Table.from_arrays(arrays, schema=WORKLOAD_SCHEMA)
    return Workload(table=table, name=name, source="<memory>", prefix_block_tokens=0, closed_loop=False)


def overrides(gpu: str, batch: int, method: str, budget: int, beta: int, num_gpu_blocks=None) -> list[str]:
    ov = ["cluster.replicas=1", f"gpu={gpu}", f"scheduler.max_num_seqs={max(256, batch)}", "seed=0",
          "sim.progress=false", "output.print_summary=false"]
    if num_gpu_blocks:
        ov.append(f"cache.num_gpu_blocks={num_gpu_blocks}")
    if method == "dense":
        ov += ["policy=full", "compaction=none"]
    else:
        ov += ["policy=triattention", f"policy.budget={budget}", f"policy.beta={beta}",
               "compaction=forward_pack"]
    return ov


def run_one(job: dict) -> dict:
    from sim.run import compose_config, is_complete, run_simulation

    ov = overrides(job["gpu"], job["batch"], job["method"], job["budget"], job["beta"], job.get("num_gpu_blocks"))
    cfg = compose_config(ov)
    out = SCRATCH / job["tag"] / f"{job['gpu']}_{job['method']}_b{job['batch']}_k{job['budget']}"
    t0 = time.perf_counter()
    if job.get("reuse") and is_complete(out):  # same config, deterministic: reuse the finished run
        import json

        s = json.loads((out / "summary.json").read_text())
        wall = float(s["wall"]["wall_s"])
    else:
        s = run_simulation(cfg, out, workload=make_workload(job["batch"], job["input"], job["output"]))
        wall = time.perf_counter() - t0
    steps = pd.read_parquet(out / "steps.parquet")
    req = pd.read_parquet(out / "requests.parquet")
    dec = steps[(steps["prefill_tokens"] == 0) & (steps["decode_tokens"] > 0)]
    steady = float(dec["decode_tokens"].sum() / dec["duration_s"].sum()) if len(dec) else float("nan")
    peak_step = float((dec["decode_tokens"] / dec["duration_s"]).max()) if len(dec) else float("nan")
    block_bytes = float(s["kv_bytes_per_block"])
    fin = int(s["requests_finished"])
    return {
        "gpu": s["gpu"], "method": job["method"], "batch": job["batch"],
        "budget": str(job["budget"]) if job["method"] != "dense" else "-",
        "pool_blocks": int(s["gpu_blocks_total"]),
        "pool_gib": s["gpu_blocks_total"] * block_bytes / GIB,
        "peak_blocks": int(s["peak_gpu_blocks_used"]),
        "peak_kv_gib": s["peak_gpu_blocks_used"] * block_bytes / GIB,
        "preemptions": int(s["preemptions"]),
        "requests_preempted": int((req["preemptions"] > 0).sum()),
        "finished": fin,
        "fits": bool(fin == job["batch"] and s["preemptions"] == 0),
        "max_running": int(steps["running"].max()),
        "output_tok_s": float(s["output_throughput_tokens_per_s"]),
        "steady_decode_tok_s": steady,
        "peak_decode_tok_s": peak_step,
        "tpot_mean_ms": 1e3 * float(s["tpot_s"]["mean"]),
        "makespan_s": float(s["sim_duration_s"]),
        "decode_tokens_computed": int(s["decode_tokens_computed"]),
        "prefill_tokens_computed": int(s["prefill_tokens_computed"]),
        "activation_reserve_gib": float(s["memory_gib"]["activation_reserve"]),
        "weights_gib": float(s["memory_gib"]["weights"]),
        "wall_s": wall,
    }


FMT = {"peak_kv_gib": "{:.1f}", "pool_gib": "{:.1f}", "output_tok_s": "{:,.0f}",
       "steady_decode_tok_s": "{:,.0f}", "peak_decode_tok_s": "{:,.0f}", "tpot_mean_ms": "{:.2f}",
       "makespan_s": "{:,.0f}", "peak_blocks": "{:,}", "wall_s": "{:.1f}", "speedup_vs_dense": "{:.2f}x"}


def plot(df: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpus = list(dict.fromkeys(df["gpu"]))
    fig, axes = plt.subplots(2, len(gpus), figsize=(4.6 * len(gpus), 6.4), squeeze=False)
    for j, g in enumerate(gpus):
        sub = df[df["gpu"] == g]
        ax = axes[0][j]
        for m, c in (("dense", "#4C72B0"), ("triattention", "#DD8452")):
            s = sub[sub["method"] == m].sort_values("batch")
            ax.plot(s["batch"], s["output_tok_s"], "o-", color=c, label=f"{m} (run avg)")
            ax.plot(s["batch"], s["steady_decode_tok_s"], "s--", color=c, alpha=0.6, label=f"{m} (steady decode)")
            bad = s[~s["fits"]]
            ax.scatter(bad["batch"], bad["output_tok_s"], marker="x", s=80, color="red", zorder=5)
        ax.set_xscale("log", base=2)
        ax.set_title(f"Qwen3-8B on {g}: output tokens/s (x = preempted)", fontsize=9)
        ax.set_xlabel("batch size")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax = axes[1][j]
        for m, c in (("dense", "#4C72B0"), ("triattention", "#DD8452")):
            s = sub[sub["method"] == m].sort_values("batch")
            ax.plot(s["batch"], s["peak_kv_gib"], "o-", color=c, label=m)
        ax.axhline(sub["pool_gib"].iloc[0], color="k", ls=":", lw=1, label="KV pool")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_ylabel("peak KV (GiB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny version (tests)")
    ap.add_argument("--jobs", type=int, default=2, help="simulations in parallel (default 2)")
    ap.add_argument("--reuse", action="store_true",
                    help="reuse completed run directories from an earlier run (tables only)")
    args = ap.parse_args(argv)
    p = QUICK if args.quick else FULL
    tag = "quick" if args.quick else "full"
    name = "reasoning_capacity" + ("_quick" if args.quick else "")
    common = dict(input=p["input"], output=p["output"], beta=p["beta"], tag=tag, reuse=args.reuse,
                  num_gpu_blocks=p.get("num_gpu_blocks"))
    jobs = []
    for g in p["gpus"]:
        for b in p["batches"]:
            jobs.append(dict(gpu=g, batch=b, method="dense", budget=p["budget"], **common))
            jobs.append(dict(gpu=g, batch=b, method="triattention", budget=p["budget"], **common))
    sweep = [dict(gpu=p["gpus"][0], batch=p["sweep_batch"], method="triattention", budget=k, **common)
             for k in p["budget_sweep"] if not (k == p["budget"] and p["sweep_batch"] in p["batches"])]
    # longest first (TriAttention at large batch) so two workers finish together
    order = sorted(jobs + sweep, key=lambda j: -(j["batch"] * (3 if j["method"] != "dense" else 1)))
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as ex:
            res = list(ex.map(run_one, order))
    else:
        res = [run_one(j) for j in order]
    total_wall = time.perf_counter() - t0
    df = pd.DataFrame(res)
    main_df = df[(df["method"] == "dense") | (df["budget"] == str(p["budget"]))].copy()
    main_df = main_df[main_df["batch"].isin(p["batches"])]
    main_df = main_df.sort_values(["gpu", "batch", "method"], ascending=[False, True, True]).reset_index(drop=True)
    side = df[(df["gpu"].str.lower() == p["gpus"][0]) & (df["batch"] == p["sweep_batch"])].copy()
    dense_b = side[side["method"] == "dense"]
    d_steady = float(dense_b["steady_decode_tok_s"].iloc[0]) if len(dense_b) else float("nan")
    d_tpot = float(dense_b["tpot_mean_ms"].iloc[0]) if len(dense_b) else float("nan")
    side["speedup_vs_dense"] = side["steady_decode_tok_s"] / d_steady
    side["tpot_speedup"] = d_tpot / side["tpot_mean_ms"]
    side = side.assign(_k=pd.to_numeric(side["budget"], errors="coerce")).sort_values(["method", "_k"], na_position="first").drop(columns="_k").reset_index(drop=True)

    RESULTS.mkdir(parents=True, exist_ok=True)
    main_df.to_csv(RESULTS / f"{name}.csv", index=False)
    side.to_csv(RESULTS / f"{name}_budget_sweep.csv", index=False)
    plot(main_df, RESULTS / f"{name}.png")

    # headline ratios
    lines = []
    for g in list(dict.fromkeys(main_df["gpu"])):
        s = main_df[main_df["gpu"] == g]
        fit_d = s[(s["method"] == "dense") & s["fits"]]
        fit_t = s[(s["method"] == "triattention") & s["fits"]]
        bd = int(fit_d["batch"].max()) if len(fit_d) else None
        bt = int(fit_t["batch"].max()) if len(fit_t) else None
        pd_ = float(fit_d["output_tok_s"].max()) if len(fit_d) else float("nan")
        pt_ = float(fit_t["output_tok_s"].max()) if len(fit_t) else float("nan")
        pd_any = float(s[s["method"] == "dense"]["output_tok_s"].max())
        lines.append(f"* **{g}**: largest batch without preemption: dense {bd}, TriAttention {bt}. "
                     f"Best output tokens/s among fitting batches: dense {pd_:,.0f}, TriAttention "
                     f"{pt_:,.0f} (**{pt_ / pd_:.2f}x**); dense's best at any batch (preempting) "
                     f"{pd_any:,.0f} (TriAttention/that = {pt_ / pd_any:.2f}x).")
    cols = ["gpu", "batch", "method", "peak_kv_gib", "peak_blocks", "preemptions", "requests_preempted",
            "fits", "max_running", "output_tok_s", "steady_decode_tok_s", "peak_decode_tok_s",
            "tpot_mean_ms", "makespan_s", "wall_s"]
    scols = ["gpu", "batch", "method", "budget", "peak_kv_gib", "preemptions", "steady_decode_tok_s",
             "speedup_vs_dense", "tpot_mean_ms", "output_tok_s"]
    cmd = "python -m experiments.reasoning_capacity" + (" --quick" if args.quick else "")
    pool = main_df.groupby("gpu")[["pool_blocks", "pool_gib", "weights_gib", "activation_reserve_gib"]].first()
    md = ["# Reasoning capacity: dense vs TriAttention (kvsim)\n",
          f"Command: `{cmd}` (from the repository root, venv active)  ",
          f"Date: {_dt.date.today().isoformat()}; "
          + ("tables re-rendered from finished run directories (`--reuse`); " if args.reuse else
             f"wall time {total_wall:.0f} s with {args.jobs} parallel jobs; ") +
          "deterministic (seed 0, in-memory workload).\n",
          f"Workload: `batch` requests of {p['input']:,} input + {p['output']:,} output tokens, unique "
          f"content, all at t=0. Qwen3-8B BF16, vLLM defaults (block 16, utilisation 0.9, chunked "
          f"prefill 8,192 tokens/step), `scheduler.max_num_seqs=max(256, batch)`. Dense = `policy=full`; "
          f"TriAttention = `policy=triattention policy.budget={p['budget']} policy.beta={p['beta']} "
          f"compaction=forward_pack`. No `sim.max_sim_time_s` cap was needed (every run completes).\n",
          "KV pool per GPU (after weights and activation reserve):\n",
          _md_table(pool.reset_index(), ["gpu", "pool_blocks", "pool_gib", "weights_gib", "activation_reserve_gib"],
                    {"pool_gib": "{:.1f}", "weights_gib": "{:.1f}", "activation_reserve_gib": "{:.1f}",
                     "pool_blocks": "{:,}"}),
          "\n## Capacity and throughput\n",
          _md_table(main_df, cols, FMT),
          "\nColumns: peak KV = peak blocks used x block bytes (GiB = 2^30); `fits` = all requests "
          "finished and zero preemptions; output tok/s = output tokens / makespan; steady decode = "
          "decode tokens / time over pure-decode steps; peak decode = best single pure-decode step; "
          "TPOT mean over requests (includes time stalled behind re-prefills after preemption).\n",
          "\n".join(lines) + "\n",
          f"\n## TriAttention budget sweep at batch {p['sweep_batch']} ({p['gpus'][0].upper()})\n",
          _md_table(side, scols, FMT),
          f"\nFigure: `{name}.png` (top: throughput vs batch, red x = preempted; bottom: peak KV "
          "vs pool).\n"]
    write_report(RESULTS, name, "reasoning_capacity", md, args.quick)


if __name__ == "__main__":
    main()
