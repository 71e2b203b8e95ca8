"""Multi-turn growth: prefix-hit ratio by turn while histories fit, and LRU thrash when they don't.

``N`` chat clients, ``R`` turns each; every turn resends the whole history. Built in memory
(prefix-chained block ids, block 16): turn 0's prompt is ``U`` = 1,024 fresh tokens; turn r's
prompt is turn r-1's prompt + its ``O`` = 64 output tokens + ``U - O`` = 960 new input tokens, so
prompt_r = U (r+1). kvsim identifies prompt blocks only (a request's generated tokens are unique to
it, traces/README.md), so turn r can reuse at most turn r-1's prompt = U r tokens: the ideal hit
ratio of turn r is exactly r / (r+1) (the previous turn's output is recomputed as part of the new
tokens; U and U-O are multiples of 16 so no partial block is lost).

Clients are round-robin and open-loop: client i's turn r arrives at ``(r N + i) dt`` (dt = 0.25 s),
so between two turns of one client every other client sends one turn. With LRU replacement the
reuse distance of a client's history is the sum of all clients' histories: when
``N x context`` exceeds GPU + host capacity the history is always evicted just before it is needed,
and the hit ratio collapses toward 0.

Qwen3-8B BF16, one H200, vLLM defaults, ``tiers=gpu_host`` (LRU, write-back; PCIe 55 GB/s).
Configurations (same N, R): "fits" with a host tier large enough for all histories, "thrash" with
GPU only, plus intermediate host sizes as extra curves.

Run: ``python -m experiments.multi_turn_growth [--quick]``; writes
``experiments/results/multi_turn_growth{.md,.csv,.png}``; run dirs under
``outputs/experiments/multi_turn_growth/`` (git-ignored).
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

from experiments._report import write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
SCRATCH = ROOT / "outputs" / "experiments" / "multi_turn_growth"
BLOCK = 16

FULL = dict(clients=256, turns=8, unit=1024, out=64, dt=0.25,
            configs=[("fits", 512), ("host 128 GiB", 128), ("host 32 GiB", 32), ("thrash", 0)],
            gpu_blocks=None)
QUICK = dict(clients=16, turns=4, unit=256, out=16, dt=0.05,
             configs=[("fits", 4), ("thrash", 0)], gpu_blocks=400)


def make_workload(clients: int, turns: int, unit: int, out: int, dt: float):
    """Round-robin multi-turn chat workload (module docstring); open loop, prefix ids per block."""
    from traces import WORKLOAD_SCHEMA, Workload

    assert unit % BLOCK == 0 and (unit - out) % BLOCK == 0
    rows, ids = [], []
    per_turn_blocks = unit // BLOCK
    for r in range(turns):
        for i in range(clients):
            nb = per_turn_blocks * (r + 1)
            # client i's stream ids: i * 10^6 + block index (unique per client, chained)
            ids.append([i * 1_000_000 + j for j in range(nb)])
            rows.append(dict(session_id=i, turn=r, arrival_s=(r * clients + i) * dt,
                             input_tokens=unit * (r + 1), output_tokens=out))
    order = np.argsort([x["arrival_s"] for x in rows], kind="stable")
    rows = [rows[k] for k in order]
    ids = [ids[k] for k in order]
    n = len(rows)
    cols = {
        "request_id": np.arange(n, dtype=np.int64),
        "session_id": np.array([x["session_id"] for x in rows], dtype=np.int64),
        "turn": np.array([x["turn"] for x in rows], dtype=np.int32),
        "arrival_s": np.array([x["arrival_s"] for x in rows], dtype=np.float64),
        "think_s": np.zeros(n, dtype=np.float64),
        "parent_request_id": np.full(n, -1, dtype=np.int64),
        "input_tokens": np.array([x["input_tokens"] for x in rows], dtype=np.int64),
        "output_tokens": np.array([x["output_tokens"] for x in rows], dtype=np.int64),
    }
    arrays = []
    for field in WORKLOAD_SCHEMA:
        if field.name == "prefix_ids":
            arrays.append(pa.array(ids, type=field.type))
        elif field.name == "prefix_block_tokens":
            arrays.append(pa.array([BLOCK] * n, type=field.type))
        else:
            arrays.append(pa.array(cols[field.name], type=field.type))
    table = pa.Table.from_arrays(arrays, schema=WORKLOAD_SCHEMA)
    return Workload(table=table, name="multi_turn_round_robin", source="<memory>",
                    prefix_block_tokens=BLOCK, closed_loop=False)


def run_one(job: dict) -> dict:
    from sim.run import compose_config, run_simulation

    p = job["p"]
    ov = ["cluster.replicas=1", "seed=0", "gpu=h200", "model=qwen3_8b", "sim.progress=false",
          "output.print_summary=false", "output.write_steps=false"]
    if job["host_gib"] > 0:
        ov += ["tiers=gpu_host", f"tiers.host_gib={job['host_gib']}"]
    if p["gpu_blocks"]:
        ov.append(f"cache.num_gpu_blocks={p['gpu_blocks']}")
    cfg = compose_config(ov)
    out = SCRATCH / job["tag"] / job["label"].replace(" ", "_")
    t0 = time.perf_counter()
    s = run_simulation(cfg, out, workload=make_workload(p["clients"], p["turns"], p["unit"], p["out"], p["dt"]))
    wall = time.perf_counter() - t0
    req = pd.read_parquet(out / "requests.parquet")
    wl = make_workload(p["clients"], p["turns"], p["unit"], p["out"], p["dt"])
    req["turn"] = wl.table.column("turn").to_numpy()[req["request_id"].to_numpy()]
    fin = req[req["status"] == "finished"]
    g = fin.groupby("turn")
    by = pd.DataFrame({
        "hit": g["prefix_hit_tokens"].sum() / g["input_tokens"].sum(),
        "hit_gpu": g["hit_tokens_gpu"].sum() / g["input_tokens"].sum(),
        "hit_host": g["hit_tokens_host"].sum() / g["input_tokens"].sum(),
        "ttft_p50": g["ttft_s"].median(),
    }).reset_index()
    by["config"] = job["label"]
    by["host_gib"] = job["host_gib"]
    return {"by_turn": by, "summary": {
        "config": job["label"], "host_gib": job["host_gib"], "hit_total": s["hit_ratio"]["total"],
        "gpu_pool_gib": s["memory_gib"]["kv_pool"], "gpu_blocks": s["gpu_blocks_total"],
        "peak_host_gib": s["peak_host_pages"] * s["page_bytes"] / 2**30,
        "final_context_gib": p["clients"] * p["unit"] * p["turns"] * s["kv_bytes_per_token"] / 2**30,
        "ttft_p50_s": s["ttft_s"]["p50"], "ttft_p99_s": s["ttft_s"]["p99"],
        "preemptions": s["preemptions"], "requests": s["requests_finished"], "wall_s": wall}}


def plot(by: pd.DataFrame, turns: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    r = np.arange(turns)
    ax.plot(r, r / (r + 1), "k--", lw=1.5, label="ideal r/(r+1)")
    for cfg, sub in by.groupby("config", sort=False):
        ax.plot(sub["turn"], sub["hit"], marker="o", label=cfg)
    ax.set_xlabel("turn r (0-based)")
    ax.set_ylabel("prefix hit ratio of turn r (tokens)")
    ax.set_ylim(-0.02, 1.0)
    ax.set_title("Round-robin multi-turn chat, LRU (Qwen3-8B, H200)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    p = QUICK if args.quick else FULL
    tag = "quick" if args.quick else "full"
    name = "multi_turn_growth" + ("_quick" if args.quick else "")
    jobs = [dict(p=p, label=lab, host_gib=h, tag=tag) for lab, h in p["configs"]]
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as ex:
            res = list(ex.map(run_one, jobs))
    else:
        res = [run_one(j) for j in jobs]
    total = time.perf_counter() - t0
    by = pd.concat([x["by_turn"] for x in res], ignore_index=True)
    summ = pd.DataFrame([x["summary"] for x in res])
    RESULTS.mkdir(parents=True, exist_ok=True)
    by.to_csv(RESULTS / f"{name}.csv", index=False)
    plot(by, p["turns"], RESULTS / f"{name}.png")
    wide = by.pivot(index="turn", columns="config", values="hit")[[lab for lab, _ in p["configs"]]]
    wide.insert(0, "ideal r/(r+1)", [r / (r + 1) for r in wide.index])
    lines = ["| turn | " + " | ".join(wide.columns) + " |", "|---|" + "|".join("---" for _ in wide.columns) + "|"]
    for t, row in wide.iterrows():
        lines.append(f"| {t} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
    sc = ["config", "host_gib", "gpu_pool_gib", "final_context_gib", "peak_host_gib", "hit_total",
          "ttft_p50_s", "ttft_p99_s", "preemptions", "requests", "wall_s"]
    slines = ["| " + " | ".join(sc) + " |", "|" + "|".join("---" for _ in sc) + "|"]
    for _, r in summ.iterrows():
        slines.append("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in sc) + " |")
    md = ["# Multi-turn growth: hit ratio by turn, fits vs thrash (kvsim)\n",
          f"Command: `python -m experiments.multi_turn_growth{' --quick' if args.quick else ''}`  ",
          f"Date: {_dt.date.today().isoformat()}; wall {total:.0f} s with {args.jobs} parallel jobs; deterministic.\n",
          f"Workload (in memory): {p['clients']} clients x {p['turns']} turns, round-robin, open loop "
          f"(client i turn r at (r x {p['clients']} + i) x {p['dt']} s); turn r prompt = {p['unit']} x (r+1) tokens "
          f"(whole history resent), {p['out']} output tokens per turn. Qwen3-8B BF16, H200, vLLM defaults"
          f"{', cache.num_gpu_blocks=' + str(p['gpu_blocks']) if p['gpu_blocks'] else ''}; "
          "host tier `tiers=gpu_host` (LRU, write-back) where host_gib > 0, else GPU only.\n",
          "## Hit ratio by turn (hit tokens / prompt tokens over all clients' turn r)\n",
          "\n".join(lines) + "\n",
          "## Runs\n", "\n".join(slines) + "\n",
          f"final_context_gib = all clients' last-turn histories ({p['clients']} x {p['unit'] * p['turns']:,} tokens).\n",
          f"Figure: `{name}.png`.\n"]
    write_report(RESULTS, name, "multi_turn_growth", md, args.quick)


if __name__ == "__main__":
    main()
