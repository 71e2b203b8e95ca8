"""Prefix-cache hits by tier (GPU / host / disk) vs host capacity and cold-page codec.

Qwen3-8B BF16 on one H200 (vLLM defaults), ``tiers=gpu_host_disk`` (LRU, write-back, one NVMe
Gen4 drive), host capacity swept over 0, 16, 32, 64, 128, 256 GiB, disk 1,024 GiB, codecs
identity / fp8 / nvfp4. Two traces:

* ``trace=mooncake_conversation`` (the full Kimi conversation trace);
* ``trace=weka_agentic`` (the full Weka agentic trace, 710 sessions, closed loop); with
  ``--weka-sessions N`` only its first N sessions (``trace.max_sessions=N``, a quicker run).

Each trace is one Hydra sweep (``kvsim -m``, 2 local jobs, through
:func:`experiments.collect.run_sweep`), collected with kvsim-collect; the figures are drawn by
``kvsim-plot hit-by-tier`` / ``disk-share`` / ``ttft-vs`` on the collected directory.

Run: ``python -m experiments.hit_by_tier [--quick] [--weka-sessions N] [--weka-host-gib 0,16,...]
[--only mooncake|weka]``.
Writes ``experiments/results/hit_by_tier{.md,.csv}``, ``hit_by_tier_<trace>.png``,
``hit_by_tier_<trace>_disk_share.png``, ``hit_by_tier_<trace>_ttft.png``; sweeps go to
``outputs/experiments/hit_by_tier/`` (git-ignored).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from experiments._report import md_table as _md_table, write_report

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "experiments" / "results"
SCRATCH = ROOT / "outputs" / "experiments" / "hit_by_tier"

HOST_GIB = [0, 16, 32, 64, 128, 256]
CODECS = ["identity", "fp8", "nvfp4"]
COMMON = ["cluster.replicas=1", "seed=0", "gpu=h200", "model=qwen3_8b", "tiers=gpu_host_disk",
          "tiers.disk_gib=1024", "output.write_steps=false"]


def sweep_overrides(trace: str, quick: bool, weka_sessions: int, extra: list[str] = (),
                    weka_hosts: list[int] = HOST_GIB) -> list[str]:
    """Hydra overrides of one sweep. ``weka_sessions``: 0 = the full Weka trace."""
    if quick:
        tr = ["trace=mooncake_conversation_10min", "trace.max_requests=300", "cache.num_gpu_blocks=2000"]
        hosts, codecs = [0, 4], ["identity", "nvfp4"]
    elif trace == "mooncake":
        tr, hosts, codecs = ["trace=mooncake_conversation"], HOST_GIB, CODECS
    else:
        tr = ["trace=weka_agentic"] + ([f"trace.max_sessions={weka_sessions}"] if weka_sessions else [])
        hosts, codecs = weka_hosts, CODECS
    return [*COMMON, *tr, *extra, "tiers.host_gib=" + ",".join(str(h) for h in hosts),
            "codec=" + ",".join(codecs)]


def kvsim_plot(figure: str, collected: Path, out: Path, *args: str) -> str:
    cmd = [sys.executable, "-m", "experiments.plots", figure, str(collected), "--out", str(out), *args]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed: {r.stderr.strip()}")
    return "kvsim-plot " + " ".join(cmd[3:]).replace(str(ROOT) + "/", "")


def table(runs: pd.DataFrame, label: str) -> pd.DataFrame:
    df = pd.DataFrame({
        "trace": label,
        "host_gib": runs["tiers.host_gib"].astype(float).astype(int),
        "codec": runs["codec"],
        "hit_gpu": runs["hit_ratio.gpu"].astype(float),
        "hit_host": runs["hit_ratio.host"].astype(float),
        "hit_disk": runs["hit_ratio.disk"].astype(float),
        "hit_total": runs["hit_ratio.total"].astype(float),
        "disk_share": runs["disk_share_of_hits"].astype(float),
        "ttft_p50_s": runs["ttft_s.p50"].astype(float),
        "ttft_p90_s": runs["ttft_s.p90"].astype(float),
        "ttft_p99_s": runs["ttft_s.p99"].astype(float),
        "throughput_tok_s": runs["throughput_tokens_per_s"].astype(float),
        "preemptions": runs["preemptions"].astype(int),
        "requests": runs["requests_finished"].astype(int),
        "peak_host_gib": runs["peak_host_pages"].astype(float) * runs["page_bytes"].astype(float) / 2**30,
        "gpu_pool_gib": runs["memory_gib.kv_pool"].astype(float),
        "wall_s": runs["wall.wall_s"].astype(float),
    })
    df["codec"] = pd.Categorical(df["codec"], CODECS, ordered=True)
    return df.sort_values(["codec", "host_gib"]).reset_index(drop=True)


FMT = {c: "{:.3f}" for c in ("hit_gpu", "hit_host", "hit_disk", "hit_total", "disk_share")}
FMT.update({"ttft_p50_s": "{:.3f}", "ttft_p90_s": "{:.3f}", "ttft_p99_s": "{:.3f}",
            "throughput_tok_s": "{:,.0f}", "peak_host_gib": "{:.1f}", "gpu_pool_gib": "{:.1f}",
            "wall_s": "{:.1f}"})


def md_table(df: pd.DataFrame, cols: list[str]) -> str:
    """A markdown table with this module's number formats."""
    return _md_table(df, cols, FMT)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny version (tests)")
    ap.add_argument("--weka-sessions", type=int, default=0,
                    help="first N Weka sessions only (0 = the full trace, 710 sessions)")
    ap.add_argument("--weka-host-gib", default=",".join(map(str, HOST_GIB)),
                    help="host capacities (GiB) swept on Weka, comma-separated")
    ap.add_argument("--timeout", type=float, default=4 * 3600, help="seconds per sweep")
    ap.add_argument("--only", choices=["mooncake", "weka"], default=None)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--gpu-blocks", type=int, default=None,
                    help="cap the GPU cache (cache.num_gpu_blocks) for an extra 'capped' sweep of mooncake")
    args = ap.parse_args(argv)
    from experiments.collect import run_sweep

    name = "hit_by_tier" + ("_quick" if args.quick else "")
    traces = ["mooncake"] if args.quick else (["mooncake", "weka"] if args.only is None else [args.only])
    weka_hosts = [int(h) for h in args.weka_host_gib.split(",")]
    sweeps = [(t, t if t != "weka" or not args.weka_sessions else f"weka{args.weka_sessions}", [])
              for t in traces]
    if args.gpu_blocks and not args.quick:
        sweeps.append(("mooncake", f"mooncake_capped{args.gpu_blocks}", [f"cache.num_gpu_blocks={args.gpu_blocks}"]))
    tag = "quick" if args.quick else "full"
    frames, cmds, figs = [], [], []
    t0 = time.perf_counter()
    for trace, label, extra in sweeps:
        ov = sweep_overrides(trace, args.quick, args.weka_sessions, extra, weka_hosts)
        sweep_dir = SCRATCH / tag / label
        cmds.append(f"kvsim -m hydra/launcher=local hydra.launcher.n_jobs={args.jobs} "
                    f"hydra.sweep.dir={sweep_dir.relative_to(ROOT)} sim.progress=false " + " ".join(ov))
        ts = time.perf_counter()
        res = run_sweep(ov, sweep_dir, n_jobs=args.jobs, fresh=False, resume=True, timeout_s=args.timeout)
        cmds.append(f"kvsim-collect {sweep_dir.relative_to(ROOT)}")
        print(f"[{label}] {len(res.runs)} runs, {len(res.failed)} failed, {time.perf_counter() - ts:.0f} s",
              flush=True)
        frames.append(table(res.runs, label))
        coll = sweep_dir / "collected"
        stem = f"{name}_{label}"
        for fig, suffix, extra_args in (("hit-by-tier", "", []), ("disk-share", "_disk_share", []),
                                        ("ttft-vs", "_ttft", [])):
            out = RESULTS / f"{stem}{suffix}.png"
            cmds.append(kvsim_plot(fig, coll, out, "--x", "tiers.host_gib", "--hue", "codec", *extra_args))
            figs.append(out.name)
    total = time.perf_counter() - t0
    df = pd.concat(frames, ignore_index=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    df.to_csv(RESULTS / f"{name}.csv", index=False)

    # NVFP4 vs identity deltas per host size
    delta_rows = []
    for tr in df["trace"].unique():
        s = df[df["trace"] == tr]
        for h in sorted(s["host_gib"].unique()):
            a = s[(s["host_gib"] == h) & (s["codec"] == "identity")]
            b = s[(s["host_gib"] == h) & (s["codec"] == "nvfp4")]
            if len(a) and len(b):
                a, b = a.iloc[0], b.iloc[0]
                delta_rows.append({"trace": tr, "host_gib": h,
                                   "hit_total_identity": a["hit_total"], "hit_total_nvfp4": b["hit_total"],
                                   "delta_points": 100 * (b["hit_total"] - a["hit_total"]),
                                   "disk_share_identity": a["disk_share"], "disk_share_nvfp4": b["disk_share"],
                                   "ttft_p99_identity": a["ttft_p99_s"], "ttft_p99_nvfp4": b["ttft_p99_s"],
                                   "p99_ratio": b["ttft_p99_s"] / a["ttft_p99_s"] if a["ttft_p99_s"] else np.nan})
    deltas = pd.DataFrame(delta_rows)
    FMT.update({"hit_total_identity": "{:.3f}", "hit_total_nvfp4": "{:.3f}", "delta_points": "{:+.1f}",
                "disk_share_identity": "{:.3f}", "disk_share_nvfp4": "{:.3f}", "ttft_p99_identity": "{:.3f}",
                "ttft_p99_nvfp4": "{:.3f}", "p99_ratio": "{:.2f}"})
    cols = ["host_gib", "codec", "hit_gpu", "hit_host", "hit_disk", "hit_total", "disk_share", "ttft_p50_s",
            "ttft_p90_s", "ttft_p99_s", "throughput_tok_s", "preemptions", "peak_host_gib", "wall_s"]
    md = ["# Prefix hits by tier vs host capacity and codec (kvsim)\n",
          f"Command: `python -m experiments.hit_by_tier{' --quick' if args.quick else ''}"
          f"{f' --weka-sessions {args.weka_sessions}' if args.weka_sessions and not args.quick else ''}"
          f"{f' --weka-host-gib {args.weka_host_gib}' if args.weka_host_gib != ','.join(map(str, HOST_GIB)) else ''}"
          f"{f' --gpu-blocks {args.gpu_blocks}' if args.gpu_blocks else ''}`  ",
          f"Date: {_dt.date.today().isoformat()}; this invocation's wall {total:.0f} s with {args.jobs} parallel "
          "jobs (runs already complete in the sweep folder are reused, output.skip_completed; each run's "
          "own wall is the wall_s column); deterministic (seed 0).\n",
          "Equivalent tool commands (what the module runs):\n",
          "\n".join(f"    {c}" for c in cmds) + "\n",
          "Qwen3-8B BF16 on one H200 (vLLM defaults, block 16), `tiers=gpu_host_disk` (LRU, write-back, "
          "disk 1,024 GiB NVMe Gen4: 7 GB/s read, 5 GB/s write, 80 us). hit_* = hit tokens served from that "
          "tier / prompt tokens (summary.json `hit_ratio`); disk_share = disk hits / all hits.\n"]
    for tr in df["trace"].unique():
        s = df[df["trace"] == tr]
        md += [f"\n## {tr} (GPU KV pool {s['gpu_pool_gib'].iloc[0]:.1f} GiB, {int(s['requests'].iloc[0]):,} requests)\n",
               md_table(s, cols)]
    if len(deltas):
        md += ["\n## NVFP4 vs identity at equal host capacity\n",
               md_table(deltas, list(deltas.columns))]
    md += ["\nFigures (drawn by kvsim-plot from the collected sweeps): " + ", ".join(f"`{f}`" for f in figs) + "\n"]
    write_report(RESULTS, name, "hit_by_tier", md, args.quick)


if __name__ == "__main__":
    main()
