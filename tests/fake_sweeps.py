"""Fake sweep folders for the ``kvsim-collect`` and ``kvsim-plot`` tests: what ``kvsim -m``
writes, as far as the collector reads it, without running the simulator."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import yaml


def _set(cfg: dict, key: str, value) -> None:
    *path, leaf = key.split(".")
    for p in path:
        cfg = cfg.setdefault(p, {})
    cfg[leaf] = value


def fake_run(d: Path, job: int, overrides: dict, *, finished: bool = True, n: int = 6) -> Path:
    """A completed run folder: ``.hydra/{overrides,config,hydra}.yaml``, ``summary.json``,
    ``requests.parquet`` (n requests, all finished or all rejected) and ``steps.parquet``."""
    (d / ".hydra").mkdir(parents=True)
    ov = [f"{k}={v}" for k, v in overrides.items()] + ["sim.progress=false"]
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(ov))
    cfg: dict = {"seed": 0, "cache": {"block_size": 16}, "scheduler": {"max_num_seqs": 64},
                 "model": {"max_model_len": 200000}}
    for k, v in overrides.items():
        _set(cfg, k, v)
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    hydra = {"hydra": {"job": {"num": job},
                       "runtime": {"choices": {"trace": "fake", "hydra/launcher": "local"}}}}
    (d / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    rng = np.random.default_rng(job)
    ttft = 0.1 + rng.random(n) * (1 + job)
    stats = ({"p50": float(np.median(ttft)), "p90": float(np.quantile(ttft, 0.9)),
              "p99": float(np.quantile(ttft, 0.99))} if finished
             else {"p50": None, "p90": None, "p99": None})
    hit = ({"gpu": 0.2, "host": 0.1, "disk": 0.0, "total": 0.3} if finished
           else {"gpu": None, "host": None, "disk": None, "total": None})
    summary = {"complete": True, "requests_total": n, "requests_finished": n if finished else 0,
               "ttft_s": stats, "hit_ratio": hit, "disk_share_of_hits": 0.0 if finished else None}
    (d / "summary.json").write_text(json.dumps(summary))
    queue = ttft * 0.5
    req = pd.DataFrame({
        "request_id": np.arange(n), "status": ["finished" if finished else "rejected"] * n,
        "ttft_s": ttft if finished else np.nan, "queue_s": queue if finished else np.nan,
        "onboard_s": 0.0, "onboard_host_s": 0.0, "onboard_disk_s": 0.0,
        "prefill_s": ttft - queue if finished else np.nan})
    req.to_parquet(d / "requests.parquet")
    pd.DataFrame({"time_s": np.arange(5.0), "blocks_used": [4] * 5,
                  "live_kv_tokens": [40] * 5}).to_parquet(d / "steps.parquet")
    return d


def fake_sweep(root: Path, grid: list[dict]) -> Path:
    """A sweep folder with one fake run per ``grid`` entry (``finished=False`` in an entry makes
    a run in which every request was rejected)."""
    root.mkdir(parents=True)
    for i, ov in enumerate(grid):
        ov = dict(ov)
        fin = ov.pop("finished", True)
        fake_run(root / str(i), i, ov, finished=fin)
    return root
