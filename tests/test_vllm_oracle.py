"""kvsim's block pool and prefix cache against vLLM's own: request by request, the prefix-hit
tokens and block tables that vLLM 0.33.0's v1 ``KVCacheManager`` gave for the same workload,
replayed one request at a time (experiments/vllm_oracle.py made the goldens in
tests/data/vllm_oracle; experiments/vllm_oracle_goldens.sh regenerates them).

Scenarios: hand-written ones (chat turns whose answers the next turn hits, the free-queue order
of a partial block, fully cached prompts, a thrashing pool) and slices of real and synthetic
traces (Mooncake conversation, Weka agent sessions, synthetic multi-turn chat), each at block
sizes 16 and 32, in a pool that never evicts and one that thrashes. vLLM's block ids are kvsim's
+ 1 (its null block)."""

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import SINGLE_ENGINE, make_workload
from sim.cost_models import build_cost_model
from sim.engine import Simulator
from sim.metrics import Recorder
from sim.run import compose_config, run_simulation
from traces import traces_dir

DATA = Path(__file__).parent / "data" / "vllm_oracle"
GOLDENS = sorted(p.name[:-5] for p in DATA.glob("*_b*_n*.json")
                 if not p.name.endswith(".hits.json"))
MOONCAKE = traces_dir() / "mooncake" / "conversation_trace.jsonl"


def kvsim_one_at_a_time(scen: dict, block_size: int, num_blocks: int, max_model_len: int):
    """Run a scenario through kvsim one request at a time: roots (in row order) arrive 10^5 s
    apart, children when their parent finishes, one sequence at a time. Returns the requests
    frame and ``{row: block table}``."""
    reqs = scen["requests"]
    roots = [r["request_id"] for r in reqs if r["parent_request_id"] < 0]
    rank = {r: k for k, r in enumerate(roots)}
    rows = [dict(arrival_s=1e5 * rank.get(r["request_id"], 0), input_tokens=r["input_tokens"],
                 output_tokens=r["output_tokens"], prefix_ids=r["prefix_ids"],
                 parent_request_id=r["parent_request_id"]) for r in reqs]
    wl = make_workload(rows, prefix_block_tokens=scen["prefix_block_tokens"])
    cfg = compose_config([*SINGLE_ENGINE,
                          f"cache.block_size={block_size}", f"cache.num_gpu_blocks={num_blocks}",
                          "scheduler.max_num_seqs=1", f"model.max_model_len={max_model_len}"])
    cost = build_cost_model(cfg.model, cfg.gpu, cfg.cache, cfg.cost)
    rec = Recorder(len(wl), wl.table.column("session_id").to_numpy(), record_steps=False)
    sim = Simulator(wl, num_blocks, block_size, cfg.scheduler, cfg.cache, cost, max_model_len,
                    rec)
    tables = {}
    free_blocks = sim.kv.free_blocks

    def keep_table(req):  # each request's block table as it is freed
        tables[req.idx] = req.blocks[:req.n_blocks].tolist()
        free_blocks(req)

    sim.kv.free_blocks = keep_table
    sim.run()
    assert rec.preemptions == 0
    return rec.requests_frame().set_index("request_id"), tables


def _crc(table) -> int:
    return zlib.crc32(struct.pack(f"<{len(table)}q", *table))


@pytest.mark.parametrize("golden", GOLDENS)
def test_engine_matches_vllm_request_by_request(golden):
    g = json.loads((DATA / f"{golden}.json").read_text())
    scen = json.loads((DATA / f"{golden.rsplit('_b', 1)[0]}.scen.json").read_text())
    assert g["vllm"] == "0.33.0"
    req, tables = kvsim_one_at_a_time(scen, g["block_size"], g["num_blocks"], g["max_model_len"])
    bad = []
    for row in g["requests"]:
        i = row["request_id"]
        got = req.loc[i]
        if got.status != row["status"]:
            bad.append((i, "status", got.status, row["status"]))
            continue
        if row["status"] != "finished":
            continue
        if int(got.prefix_hit_tokens) != row["prefix_hit_tokens"]:
            bad.append((i, "hit", int(got.prefix_hit_tokens), row["prefix_hit_tokens"]))
        if "blocks" in row and tables[i] != row["blocks"]:
            bad.append((i, "blocks", tables[i], row["blocks"]))
        elif _crc(tables[i]) != row["blocks_crc"]:
            bad.append((i, "blocks_crc", tables[i][:8], "..."))
    assert not bad, f"{len(bad)} of {len(g['requests'])} requests differ from vLLM: {bad[:5]}"


def test_turn_two_hits_the_previous_prompt_and_answer():
    """The oracle's chat: turn 1 hits turn 0's prompt and answer (144 tokens at block size 16),
    turn 2 all of turn 1's (208); without answer reuse, only the previous prompts' full blocks
    (96 and 176: kvsim's cache.reuse_answer_blocks=false)."""
    g = json.loads((DATA / "chat_turns_b16_n1000.json").read_text())
    assert [r["prefix_hit_tokens"] for r in g["requests"]][:3] == [0, 144, 208]
    scen = json.loads((DATA / "chat_turns.scen.json").read_text())
    req, _ = kvsim_one_at_a_time(scen, 16, 1000, 131072)
    assert req.prefix_hit_tokens.tolist()[:3] == [0, 144, 208]
    for r in scen["requests"]:
        r["parent_request_id"] = -1  # (no session: answers stay unique)
    req, _ = kvsim_one_at_a_time(scen, 16, 1000, 131072)
    assert req.prefix_hit_tokens.tolist()[:3] == [0, 96, 176]


@pytest.mark.slow
@pytest.mark.skipif(not MOONCAKE.exists(), reason=f"{MOONCAKE} not present (shared traces absent; set KVSIM_TRACES_DIR to the shared traces folder)")
def test_mooncake_conversation_matches_vllm_with_20000_blocks(tmp_path):
    """The whole Mooncake conversation trace (12,031 requests) one at a time with 20,000 usable
    16-token blocks: every request's prefix hit equals vLLM's."""
    g = json.loads((DATA / "mooncake_conversation_b16_n20000.hits.json").read_text())
    cfg = compose_config([*SINGLE_ENGINE,
        "trace=mooncake_conversation", "trace.time_scale=1000", "trace.timestamp_spread=even",
        "cache.num_gpu_blocks=20000", "scheduler.max_num_seqs=1", "sim.progress=false",
        "output.write_steps=false"])
    run_simulation(cfg, tmp_path)
    req = pd.read_parquet(tmp_path / "requests.parquet").set_index("request_id")
    want = np.array(g["prefix_hit_tokens"])
    got = req.prefix_hit_tokens.reindex(np.arange(len(want))).to_numpy()
    differ = np.flatnonzero(got != want)
    assert len(want) == 12031 and req.status.eq("finished").all()
    assert not len(differ), (f"{len(differ)} requests differ from vLLM: "
                             f"{[(int(i), int(got[i]), int(want[i])) for i in differ[:5]]}")
