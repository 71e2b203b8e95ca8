"""The golden matrix: configurations whose tables must not change while the engine's code moves.

Each case is a trace x tiers x policy x compactor combination (Hydra overrides) replayed with the
per-step loop (``sim.fast_forward=false``) and with the fast paths; both must give the tables
recorded in ``tests/data/golden_matrix.json``: a digest of every table the run writes
(requests, steps, rounds, transfers parquet) and of summary.json without its wall-clock,
input-file and output-file fields and the trace's path.

Record (only after a deliberate change of results, saying why in the commit message)::

    .venv/bin/python -m tests.golden.matrix --record            # bundled and synthetic traces
    .venv/bin/python -m tests.golden.matrix --record --shared   # also the ../shared/traces cases
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden_matrix.json"

TRACES = {
    "mooncake": ["trace=mooncake_conversation_10min", "trace.max_requests=160",
                 "cache.num_gpu_blocks=1200"],
    "weka": ["trace=weka_agentic_slice", "cache.num_gpu_blocks=3000"],
    "multiturn": ["trace=synthetic_multiturn", "trace.num_sessions=12", "trace.turns_max=6",
                  "cache.num_gpu_blocks=900"],
    "agentic": ["trace=synthetic_agentic", "trace.num_sessions=4", "trace.turns_max=10",
                "trace.shared_prefix_tokens=3000", "cache.num_gpu_blocks=2500"],
    "reasoning": ["trace=synthetic_reasoning", "trace.num_sessions=60", "trace.output_mean=600",
                  "cache.num_gpu_blocks=1500", "scheduler.max_num_batched_tokens=512"],
}
SHARED_TRACES = {
    "azure": ["trace=azure_conv", "trace.max_requests=300", "cache.num_gpu_blocks=2000"],
    "servegen": ["trace=servegen_r1", "trace.num_requests=40", "cache.num_gpu_blocks=4000"],
}
CONFIGS = {
    "full": [],
    "full_tiers": ["tiers=gpu_host_disk", "codec=nvfp4"],
    "tri_pack": ["policy=triattention", "policy.budget=128", "policy.beta=32",
                 "compaction=forward_pack"],
    "tri_pack_tiers": ["policy=triattention", "policy.budget=128", "policy.beta=32",
                       "compaction=forward_pack", "tiers=gpu_host_disk", "codec=nvfp4"],
    "stream_hole": ["policy=streaming_llm", "compaction=hole_fill", "cache=trtllm"],
}
MODES = {"per_step": ["sim.fast_forward=false"], "fast": ["sim.fast_forward=true"]}
# wall-clock figures and the paths of this checkout's files: not results
_SKIP_SUMMARY = ("wall", "input_files", "output_files", "trace_input", "trace_source",
                 "overrides", "config_fingerprint")


def cases(shared: bool) -> dict[str, list[str]]:
    """``{case id: overrides}`` for every trace x config (without the mode)."""
    traces = dict(TRACES, **(SHARED_TRACES if shared else {}))
    return {f"{t}/{c}": [*to, *co] for t, to in traces.items() for c, co in CONFIGS.items()}


def frame_digest(df: pd.DataFrame) -> str:
    """SHA-256 over a table's column names, dtypes and every value's bits (row order kept)."""
    h = hashlib.sha256()
    h.update(json.dumps([[str(c), str(t)] for c, t in df.dtypes.items()]).encode())
    if len(df):
        h.update(pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes())
    h.update(str(len(df)).encode())
    return h.hexdigest()[:20]


def run_case(overrides: list[str]) -> dict[str, str]:
    """Run one configuration in a scratch folder; return ``{table: digest}``."""
    from sim.run import compose_config, run_simulation

    # (the single engine, whatever kvsim's root config sets)
    cfg = compose_config(["sim.progress=false", "output.write_steps=true", "cluster.replicas=1",
                          *overrides])
    with tempfile.TemporaryDirectory(prefix="kvsim-golden-") as d:
        summary = run_simulation(cfg, d, progress_bar=False)
        out = {}
        for name in ("requests", "steps", "rounds", "transfers"):
            p = Path(d) / f"{name}.parquet"
            out[name] = frame_digest(pd.read_parquet(p)) if p.exists() else "absent"
    kept = {k: v for k, v in summary.items() if k not in _SKIP_SUMMARY}
    out["summary"] = hashlib.sha256(json.dumps(kept, sort_keys=True, default=_json).encode()
                                    ).hexdigest()[:20]
    return out


def _json(o):
    if isinstance(o, np.generic):
        return o.item()
    return str(o)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="write tests/data/golden_matrix.json")
    ap.add_argument("--shared", action="store_true", help="include the ../shared/traces cases")
    a = ap.parse_args(argv)
    old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    new, bad = dict(old), []
    for cid, ov in cases(a.shared).items():
        digests = {m: run_case([*ov, *mo]) for m, mo in MODES.items()}
        if digests["per_step"] != digests["fast"]:
            bad.append(f"{cid}: per-step and fast paths differ: {digests}")
        new[cid] = digests["per_step"]
        if cid in old and old[cid] != new[cid]:
            bad.append(f"{cid}: differs from the golden: {old[cid]} -> {new[cid]}")
        print(cid, "ok" if not bad or not bad[-1].startswith(cid) else "DIFF", flush=True)
    if a.record:
        GOLDEN.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    for b in bad:
        print(b, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
