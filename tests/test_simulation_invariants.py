"""Property test: random small workloads and configs (policies, compactors, a tiny host tier)
keep the pool and layout invariants after every step (``sim.check_invariants``) and end every
request in exactly one terminal state."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import SINGLE_ENGINE, make_workload, quiet_config
from sim.run import run_simulation


POLICY_OVERRIDES = {
    "full": lambda d: [],
    "triattention": lambda d: ["policy=triattention", f"policy.budget={d['budget']}", f"policy.beta={d['beta']}"],
    "streaming_llm": lambda d: ["policy=streaming_llm", "policy.sink_tokens=4",
                                f"policy.recent_window={d['budget']}", f"policy.beta={d['beta']}"],
    "snapkv": lambda d: ["policy=snapkv", f"policy.budget={d['budget']}",
                         f"policy.observation_window={min(8, d['budget'])}"],
    "h2o": lambda d: ["policy=h2o", f"policy.budget={d['budget']}", f"policy.beta={d['beta']}"],
}


@st.composite
def scenarios(draw):
    n_docs = draw(st.integers(1, 4))
    rows = []
    for _ in range(draw(st.integers(1, 12))):
        doc = draw(st.integers(0, n_docs - 1))
        inp = draw(st.integers(1, 200))
        row = dict(arrival_s=draw(st.floats(0.0, 0.5)), input_tokens=inp,
                   output_tokens=draw(st.integers(1, 40)),
                   prefix_ids=[doc * 1000 + j for j in range(inp // 16)])
        rows.append(row)
    rows.sort(key=lambda r: r["arrival_s"])
    # a few closed-loop follow-ups (parents precede children)
    for k in range(draw(st.integers(0, 3))):
        p = draw(st.integers(0, len(rows) - 1))
        inp = rows[p]["input_tokens"] + rows[p]["output_tokens"] + draw(st.integers(1, 50))
        rows.append(dict(arrival_s=rows[p]["arrival_s"], input_tokens=inp,
                         output_tokens=draw(st.integers(1, 20)), parent_request_id=p,
                         think_s=draw(st.sampled_from([0.0, 0.01])),
                         prefix_ids=rows[p]["prefix_ids"] + [50_000 + 100 * k + j for j in
                                                             range(inp // 16 - len(rows[p]["prefix_ids"]))]))
    policy = draw(st.sampled_from(sorted(POLICY_OVERRIDES)))
    d = dict(budget=draw(st.sampled_from([8, 24, 64])), beta=draw(st.sampled_from([1, 4, 16])))
    o = [f"cache.block_size={draw(st.sampled_from([4, 8, 16, 32]))}",
         f"cache.num_gpu_blocks={draw(st.integers(2, 48))}",
         f"scheduler.max_num_seqs={draw(st.sampled_from([1, 3, 16]))}",
         f"scheduler.max_num_batched_tokens={draw(st.sampled_from([32, 256]))}",
         *POLICY_OVERRIDES[policy](d)]
    if policy != "full":
        o.append(f"compaction={draw(st.sampled_from(['none', 'forward_pack', 'hole_fill']))}")
    if draw(st.booleans()):
        # Qwen3-8B BF16: 147,456 B per token, so 1-8 MiB holds a handful of pages
        o += ["tiers=gpu_host", f"tiers.host_gib={draw(st.sampled_from([0.02, 0.04, 0.08]))}",
              f"tiers.write_policy={draw(st.sampled_from(['write_back', 'write_through']))}"]
    return rows, o


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_configs_keep_invariants(scenario):
    """sim.check_invariants asserts the pool and layout invariants after every step; every
    request ends exactly once, finished or rejected."""
    rows, o = scenario
    wl = make_workload(rows, prefix_block_tokens=16)
    c = quiet_config(*SINGLE_ENGINE, "sim.check_invariants=true", "output.write_steps=false", *o)
    with tempfile.TemporaryDirectory() as d:
        s = run_simulation(c, d, workload=wl)
        req = pd.read_parquet(Path(d) / "requests.parquet")
    n = len(rows)
    assert s["requests_total"] == n == len(req)
    assert req.request_id.tolist() == list(range(n))
    assert set(req.status) <= {"finished", "rejected"}
    assert s["requests_finished"] + s["requests_rejected"] == n
    fin = req[req.status == "finished"]
    assert fin.finish_s.notna().all() and (fin.finish_s >= fin.arrival_s).all()
    assert (req[req.status == "rejected"].reject_reason != "").all()
