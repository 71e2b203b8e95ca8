"""sim.pd: prefill/decode disaggregation (prefill replicas hand each request's KV to a decode
replica over a link, the transfer on the TTFT path)."""

import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import chunk_workload, make_workload
from sim.cluster import Cluster, ClusterRecorder
from sim.compression import Compression
from sim.engine import Simulator
from sim.errors import ConfigError
from sim.hardware import kv_bytes_per_block
from sim.metrics import Recorder
from sim.pd import build_pd_links
from sim.hardware import plan_memory
from sim.kv_store import build_store
from sim.run import _tiers_factory, build_cost_model, compose_config, run_simulation
from sim.tiers import cold_page_bytes


def _cfg(*overrides):
    return compose_config(["sim.progress=false", "cluster.router=round_robin", *overrides])


def page_bytes_of(cfg) -> int:
    """One block of every layer's K and V at the model's dtype (BF16: 2 bytes), from the card."""
    m = cfg.model
    assert str(m.dtype) in ("bfloat16", "bf16", "float16", "fp16")
    return int(m.num_layers) * int(m.num_kv_heads) * int(m.head_dim) * 2 * 2 * int(cfg.cache.block_size)


def compression_of(cfg) -> Compression:
    """The run's compression machinery, as sim.run builds it (policy=full: inactive)."""
    return Compression(cfg.policy, cfg.compaction, cfg.model, cfg.cache, cfg.cost,
                       float(cfg.gpu.hbm_bandwidth_gbps) * 1e9, int(cfg.seed))


def pd_run(wl, *overrides, num_blocks=400, check=True):
    """A disaggregated cluster's (requests, steps, Cluster); default 1 prefill + 1 decode."""
    cfg = _cfg("cluster.replicas=2", "cluster.pd.prefill_replicas=1", *overrides)
    cost = build_cost_model(cfg.model, cfg.gpu, cfg.cache, cfg.cost)
    links = build_pd_links(cfg, kv_bytes_per_block(cfg.model, cfg.cache),
                           cold_page_bytes(cfg.model, cfg.cache, cfg.codec))
    plan = plan_memory(cfg.model, cfg.gpu, cfg.cache, cfg.scheduler, cfg.cost.tensor_parallel_size)
    tiers, _ = _tiers_factory(cfg, plan)  # (None: tiers=gpu_only and no store)
    store = build_store(cfg, plan.block_bytes)  # (None: cluster.store.enabled=false)
    rec = ClusterRecorder(len(wl), wl.table.column("session_id").to_numpy())
    c = Cluster(cfg.cluster, wl, num_blocks, cfg.cache.block_size, cfg.scheduler, cfg.cache, cost,
                cfg.model.max_model_len, rec, check_invariants=check, pd_links=links,
                compression=compression_of(cfg), tiers=tiers, num_layers=cfg.model.num_layers,
                store=store)
    c.run()
    return rec.requests_frame(), rec.steps_frame(), c


def single(wl, *overrides, num_blocks=400):
    """The single engine's (requests, cost model, Simulator)."""
    cfg = _cfg("cluster.replicas=1", *overrides)
    cost = build_cost_model(cfg.model, cfg.gpu, cfg.cache, cfg.cost)
    rec = Recorder(len(wl), wl.table.column("session_id").to_numpy())
    sim = Simulator(wl, num_blocks, cfg.cache.block_size, cfg.scheduler, cfg.cache, cost,
                    cfg.model.max_model_len, rec, check_invariants=True,
                    compression=compression_of(cfg))
    sim.run()
    return rec.requests_frame(), cost, sim


def one(inp=100, out=5, ids=None, arrival=0.0):
    return dict(arrival_s=arrival, input_tokens=inp, output_tokens=out,
                prefix_ids=list(ids if ids is not None else range(-(-inp // 16))))


def test_the_transfer_moves_exactly_the_requests_prompt_blocks():
    """A lone request's KV transfer carries its prompt's blocks (ceil(input / block_size)),
    each of one block's bytes of every layer's K and V (the model card's), and its decode
    replica recomputes only the last prompt token."""
    wl = make_workload([one(100, 5)], prefix_block_tokens=16)
    req, _, c = pd_run(wl)
    cfg = _cfg()
    page = page_bytes_of(cfg)
    r = req.iloc[0]
    assert r["status"] == "finished"
    assert r["kv_transfer_blocks"] == 7  # ceil(100 / 16)
    assert r["kv_transfer_bytes"] == 7 * page
    assert (r["prefill_replica"], r["decode_replica"]) == (0, 1)
    assert r["computed_prompt_tokens"] == 100 + 1
    tr = c.transfers_frame()
    assert len(tr) == 1 and tr["pages"].iloc[0] == 7 and tr["bytes"].iloc[0] == 7 * page
    assert tr["direction"].iloc[0] == "prefill_to_decode" and tr["replica"].iloc[0] == 1
    assert c.pd.summary()["bytes"] == 7 * page


def test_an_fp8_codec_halves_the_bytes_moved():
    """The bytes of a block come from the run's codec: fp8 holds one byte a value."""
    wl = make_workload([one(100, 5)], prefix_block_tokens=16)
    req, _, _ = pd_run(wl, "codec=fp8")
    assert req["kv_transfer_bytes"].iloc[0] == 7 * page_bytes_of(_cfg()) // 2


def test_the_decode_replicas_prefix_cache_cuts_the_transfer_to_the_blocks_it_lacks():
    """A second request with the first one's prompt finds its full prompt blocks in the decode
    replica's cache (all but the last, which holds the token it recomputes): one block moves."""
    ids = list(range(10))
    wl = make_workload([one(160, 3, ids, 0.0), one(160, 3, ids, 50.0)], prefix_block_tokens=16)
    req, _, c = pd_run(wl)
    a, b = req.iloc[0], req.iloc[1]
    assert a["kv_transfer_blocks"] == 10 and a["decode_hit_tokens"] == 0
    assert b["decode_hit_tokens"] == 9 * 16  # ((160 - 1) // 16 blocks)
    assert b["kv_transfer_blocks"] == 1
    assert b["prefix_hit_tokens"] == 9 * 16  # (the prefill replica's own hit)
    assert c.pd.summary()["blocks"] == 11


def test_a_prefix_aware_decode_router_sends_a_repeated_prompt_where_its_kv_is():
    """With two decode replicas, a prompt repeated after the first finished goes, under
    pd.decode_router=prefix_aware, to the decode replica holding its blocks (1 block moves);
    round-robin sends it to the other one (all 10 move)."""
    ids = list(range(10))
    wl = make_workload([one(160, 3, ids, 0.0), one(160, 3, ids, 50.0)], prefix_block_tokens=16)
    aware, _, _ = pd_run(wl, "cluster.replicas=3", "cluster.pd.decode_router=prefix_aware")
    rr, _, _ = pd_run(wl, "cluster.replicas=3", "cluster.pd.decode_router=round_robin")
    assert list(aware["decode_replica"]) == [1, 1] and list(aware["kv_transfer_blocks"]) == [10, 1]
    assert list(rr["decode_replica"]) == [1, 2] and list(rr["kv_transfer_blocks"]) == [10, 10]


def test_the_transfer_is_on_the_ttft_path():
    """TTFT grows by exactly the link's extra time: latency + bytes / bandwidth."""
    wl = make_workload([one(100, 5)], prefix_block_tokens=16)
    slow, _, _ = pd_run(wl, "cluster.pd.net_gbps=2", "cluster.pd.net_latency_s=0.01")
    fast, _, _ = pd_run(wl, "cluster.pd.net_gbps=50", "cluster.pd.net_latency_s=0.0")
    nbytes = 7 * page_bytes_of(_cfg())
    extra = (0.01 + nbytes / 2e9) - nbytes / 50e9
    assert slow["ttft_s"].iloc[0] - fast["ttft_s"].iloc[0] == pytest.approx(extra, abs=1e-9)
    assert slow["kv_transfer_s"].iloc[0] == pytest.approx(0.01 + nbytes / 2e9, abs=1e-12)
    assert slow["onboard_s"].iloc[0] == pytest.approx(0.01 + nbytes / 2e9, abs=1e-9)
    # the prefill replica's part does not change
    assert slow["prefill_done_s"].iloc[0] == fast["prefill_done_s"].iloc[0]


def test_one_prefill_and_one_decode_replica_with_a_free_link_add_one_step_to_the_single_engine():
    """Requests far apart on 1 + 1 replicas with a link of no latency and (nearly) infinite
    bandwidth: each request's TTFT and end-to-end latency are the single engine's plus one
    decode step of its last prompt token (1 token, input - 1 of context), the step vLLM's decode
    instance runs to sample the first token; its time per output token is the single engine's."""
    rows = [one(100 + 37 * k, 4 + k, [k * 100 + j for j in range(-(-(100 + 37 * k) // 16))],
                100.0 * k) for k in range(4)]
    wl = make_workload(rows, prefix_block_tokens=16)
    s, cost, _ = single(wl)
    p, _, _ = pd_run(wl, "cluster.pd.net_gbps=1e12", "cluster.pd.net_latency_s=0")
    step = np.array([cost.step_time(np.array([1]), np.array([n - 1]), 1)
                     for n in s["input_tokens"]])
    np.testing.assert_allclose(p["ttft_s"] - s["ttft_s"], step, rtol=0, atol=1e-9)
    np.testing.assert_allclose(p["e2e_s"] - s["e2e_s"], step, rtol=0, atol=1e-9)
    np.testing.assert_allclose(p["tpot_s"], s["tpot_s"], rtol=1e-9)
    assert (p["prefix_hit_tokens"] == s["prefix_hit_tokens"]).all()


def test_a_decode_replica_short_of_blocks_holds_the_transfer_until_blocks_free():
    """Two requests of 5 prompt blocks that grow to 8 on replicas of 8 blocks: the second's
    prompt blocks on the decode replica are allocated, and its KV moves, only once the first
    has finished there; the prefill replica holds its blocks meanwhile (the pool invariants
    hold at every step of both)."""
    rows = [one(80, 40, [1, 2, 3, 4, 5], 0.0), one(80, 40, [9, 8, 7, 6, 5], 0.0)]
    wl = make_workload(rows, prefix_block_tokens=16)
    req, _, c = pd_run(wl, num_blocks=8)
    a, b = req.iloc[0], req.iloc[1]
    assert (req["status"] == "finished").all()
    tr = c.transfers_frame().set_index("request_id")
    assert tr.loc[1, "time_s"] >= a["finish_s"]
    assert b["onboard_s"] >= a["finish_s"] - (b["arrival_s"] + b["prefill_done_s"])
    assert b["ttft_s"] > a["e2e_s"]


# ---------------------------------------------------------------- compression policies
SNAP = ("policy=snapkv", "policy.budget=256", "compaction=forward_pack")
STREAM = ("policy=streaming_llm", "policy.recent_window=200", "policy.beta=16",
          "compaction=forward_pack")


def rounds_of(sim) -> pd.DataFrame:
    """One engine's rounds (sim.rounds) as a table of ROUND_COLUMNS."""
    from sim.compression import ROUND_COLUMNS

    return pd.DataFrame.from_records(sim.rounds, columns=ROUND_COLUMNS)


def test_a_prefill_round_sends_only_the_blocks_the_prefill_replica_held_after_it():
    """SnapKV compresses once, at the prefill's end, on the prefill replica: the transfer moves
    the blocks its table holds after that round (16 of the prompt's 38), page bytes each, and
    the decode replica runs no round of its own; the row counts the prefill round's evictions."""
    wl = make_workload([one(600, 40, range(38))], prefix_block_tokens=16)
    req, _, c = pd_run(wl, *SNAP)
    pre, dec = rounds_of(c.replicas[0]), rounds_of(c.replicas[1])
    assert len(pre) == 1 and len(dec) == 0
    held = int(pre["blocks_after"].iloc[0])
    assert held < 38 and pre["blocks_before"].iloc[0] == 38
    r = req.iloc[0]
    assert r["status"] == "finished"
    assert r["kv_transfer_blocks"] == held
    assert r["kv_transfer_bytes"] == held * page_bytes_of(_cfg())
    assert r["tokens_evicted"] == pre["tokens_evicted"].iloc[0] == 600 - 256


def test_decode_time_rounds_run_on_the_decode_replica_as_on_the_single_engine():
    """StreamingLLM evicts at the prefill's end (on the prefill replica) and then every beta
    tokens (on the decode replica, with the policy state the prefill replica handed over): the
    rounds of both replicas, in order, are the single engine's rounds of the same requests,
    token for token and block for block."""
    rows = [one(600, 60, [k * 100 + j for j in range(38)], 50.0 * k) for k in range(3)]
    wl = make_workload(rows, prefix_block_tokens=16)
    req, _, c = pd_run(wl, *STREAM)
    _, _, s = single(wl, *STREAM)
    cols = ["request_id", "tokens_before", "tokens_kept", "tokens_evicted", "blocks_before",
            "blocks_after", "blocks_freed"]
    pre, dec = rounds_of(c.replicas[0]), rounds_of(c.replicas[1])
    assert len(pre) == 3 and len(dec) > 3
    both = pd.concat([pre, dec]).sort_values("time_s", kind="stable")[cols]
    want = rounds_of(s)[cols]
    pd.testing.assert_frame_equal(both.reset_index(drop=True), want.reset_index(drop=True))
    assert (req["kv_transfer_blocks"] == pre["blocks_after"].to_numpy()).all()


def test_a_compressed_transfer_takes_no_decode_hit_on_blocks_its_round_rewrote():
    """SnapKV (budget 256) leaves a 200-token prompt as it is: its 12 full blocks enter both
    replicas' prefix caches. A 600-token prompt beginning with them hits them on the prefill
    replica, whose round then compresses the whole prompt (SnapKV pins none of it): the decode
    replica's cached blocks of that prefix hold the uncompressed KV, so they serve no hit and
    every block the prefill replica held moves."""
    ids = list(range(38))
    wl = make_workload([one(200, 5, ids, 0.0), one(600, 5, ids, 50.0)], prefix_block_tokens=16)
    req, _, c = pd_run(wl, *SNAP)
    pre = rounds_of(c.replicas[0])
    a, b = req.iloc[0], req.iloc[1]
    assert list(pre["request_id"]) == [1]
    assert a["kv_transfer_blocks"] == 13 and a["tokens_evicted"] == 0
    assert b["prefix_hit_tokens"] == 12 * 16
    assert b["decode_hit_tokens"] == 0
    assert b["kv_transfer_blocks"] == pre["blocks_after"].iloc[0] < 38


def test_a_policy_that_never_evicts_gives_the_full_policys_disaggregated_run():
    """A compression policy whose rounds never come due (a window longer than any sequence)
    carries its layouts through the hand-off and gives the full policy's requests, steps and
    transfers tables."""
    rng = np.random.default_rng(5)
    rows = [one(int(rng.integers(20, 400)), int(rng.integers(1, 30)),
                [int(rng.integers(0, 3)) * 100 + j for j in range(30)],
                float(np.round(rng.uniform(0, 2), 3))) for _ in range(20)]
    rows.sort(key=lambda r: r["arrival_s"])
    wl = make_workload(rows, prefix_block_tokens=16)
    over = ("cluster.replicas=3", "cluster.router=prefix_aware")
    full_r, full_s, full_c = pd_run(wl, *over, num_blocks=120)
    lazy_r, lazy_s, lazy_c = pd_run(wl, *over, "policy=streaming_llm",
                                    "policy.recent_window=4000", num_blocks=120)
    assert not any(s.rounds for s in lazy_c.replicas)
    pd.testing.assert_frame_equal(full_r, lazy_r)
    pd.testing.assert_frame_equal(full_s, lazy_s)
    pd.testing.assert_frame_equal(full_c.transfers_frame(), lazy_c.transfers_frame())


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000),
       policy=st.sampled_from([SNAP[:2] + ("policy.mode=union", SNAP[2]), STREAM]),
       compaction=st.sampled_from(["forward_pack", "none"]), blocks=st.integers(60, 200))
def test_every_request_moves_the_blocks_its_prefill_replica_held_less_the_decode_hit(
        seed, policy, compaction, blocks):
    """Any workload, pool and compression policy on 1 + 2 replicas: every request finishes or
    is rejected (the pool and layout invariants hold after every step), and its transfer
    moves the blocks its prefill replica held after its last round there (its prompt's
    blocks when none ran) less its decode replica's hit, page bytes each."""
    rng = np.random.default_rng(seed)
    rows = [one(int(rng.integers(1, 700)), int(rng.integers(1, 40)),
                [int(rng.integers(0, 3)) * 100 + j for j in range(44)],
                float(np.round(rng.uniform(0, 3), 2))) for _ in range(10)]
    rows.sort(key=lambda r: r["arrival_s"])
    wl = make_workload(rows, prefix_block_tokens=16)
    req, _, c = pd_run(wl, "cluster.replicas=3", *policy[:-1], f"compaction={compaction}",
                       num_blocks=blocks)
    fin = req[req["status"] == "finished"].set_index("request_id")
    assert len(fin) + (req["status"] == "rejected").sum() == len(req)
    last = rounds_of(c.replicas[0]).groupby("request_id")["blocks_after"].last()
    held = (-(-fin["input_tokens"] // 16)).copy()
    common = held.index.intersection(last.index)  # (finished requests with a round)
    held.loc[common] = last.loc[common].to_numpy(dtype=held.dtype)
    want = held - fin["decode_hit_tokens"] // 16
    assert (fin["kv_transfer_blocks"] == want).all()
    assert (fin["kv_transfer_bytes"] == want * page_bytes_of(_cfg())).all()
    assert all(not s.handed for s in c.replicas)


# ---------------------------------------------------------------- host and disk tiers
def test_a_prefill_replicas_host_tier_serves_its_prefix_hit_and_the_decode_link_the_rest():
    """Replicas of 24 blocks with a host tier: a third request repeats the first one's prompt
    after a second one evicted most of its blocks from both replicas' GPUs. The prefill
    replica's hit takes its 4 blocks still on the GPU and onboards the 15 its host tier holds
    (19 = (320 - 1) // 16 in all); the decode replica takes only its GPU hit (3 blocks) and
    receives the other 17 over the link, although its own host tier holds them (the connector
    that loads a handed-off request is the KV link's)."""
    X, Y = list(range(20)), list(range(100, 120))
    wl = make_workload([one(320, 3, X, 0.0), one(320, 3, Y, 10.0), one(320, 3, X, 20.0)],
                       prefix_block_tokens=16)
    req, _, c = pd_run(wl, "tiers=gpu_host", num_blocks=24)
    r = req.iloc[2]
    assert (r["prefix_hit_tokens"], r["hit_tokens_gpu"], r["hit_tokens_host"]) == (304, 64, 240)
    assert r["onboard_host_s"] > 0
    assert r["decode_hit_tokens"] == 48 and r["kv_transfer_blocks"] == 17
    keys = c.prompt_keys(2)[0]
    assert c.replicas[1].tiers.host.contains_many(keys[3:20]).all()
    only_gpu, _, _ = pd_run(wl, num_blocks=24)
    assert only_gpu["prefix_hit_tokens"].iloc[2] == 64
    assert r["prefill_done_s"] < only_gpu["prefill_done_s"].iloc[2]


def test_a_host_tier_nothing_spills_to_gives_the_gpu_only_tables():
    """Pools that never evict a cached block: a disaggregated run with a host tier gives the
    GPU-only run's requests and transfers tables."""
    rng = np.random.default_rng(11)
    rows = [one(int(rng.integers(20, 400)), int(rng.integers(1, 30)),
                [int(rng.integers(0, 3)) * 100 + j for j in range(30)],
                float(np.round(rng.uniform(0, 2), 3))) for _ in range(20)]
    rows.sort(key=lambda r: r["arrival_s"])
    wl = make_workload(rows, prefix_block_tokens=16)
    over = ("cluster.replicas=3", "cluster.router=prefix_aware")
    gpu, _, gc = pd_run(wl, *over, num_blocks=2000)
    host, _, hc = pd_run(wl, *over, "tiers=gpu_host", num_blocks=2000)
    assert host["hit_tokens_host"].sum() == 0
    pd.testing.assert_frame_equal(gpu, host)
    pd.testing.assert_frame_equal(gc.transfers_frame(), hc.transfers_frame())


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), tiers=st.sampled_from(["gpu_host", "gpu_host_disk"]),
       write=st.sampled_from(["write_back", "write_through"]), blocks=st.integers(40, 120))
def test_with_tiers_every_request_moves_its_prompt_blocks_less_the_decode_gpu_hit(
        seed, tiers, write, blocks):
    """Any workload and small pools over host (and disk) tiers on 1 + 2 replicas: every
    request finishes or is rejected (the pool invariants hold after every step), its prefill
    hit splits into GPU, host and disk tokens, and its transfer moves its prompt's blocks less
    the decode replica's GPU hit."""
    rng = np.random.default_rng(seed)
    rows = [one(int(rng.integers(1, 500)), int(rng.integers(1, 30)),
                [int(rng.integers(0, 3)) * 100 + j for j in range(32)],
                float(np.round(rng.uniform(0, 3), 2))) for _ in range(20)]
    rows.sort(key=lambda r: r["arrival_s"])
    wl = make_workload(rows, prefix_block_tokens=16)
    req, _, c = pd_run(wl, "cluster.replicas=3", f"tiers={tiers}", f"tiers.write_policy={write}",
                       num_blocks=blocks)
    fin = req[req["status"] == "finished"]
    assert len(fin) + (req["status"] == "rejected").sum() == len(req)
    assert (fin["hit_tokens_gpu"] + fin["hit_tokens_host"] + fin["hit_tokens_disk"]
            == fin["prefix_hit_tokens"]).all()
    want = -(-fin["input_tokens"] // 16) - fin["decode_hit_tokens"] // 16
    assert (fin["kv_transfer_blocks"] == want).all()
    assert all(not s.handed for s in c.replicas)


# ---------------------------------------------------------------- the shared store
STORE = ("cluster.replicas=3", "cluster.pd.prefill_replicas=2", "cluster.store.enabled=true")


def test_the_store_serves_one_prefill_replicas_prefix_to_another_over_its_link():
    """2 prefill replicas (round-robin) and a decode replica over the shared store: a prompt
    repeated after replica 0 computed it goes to replica 1, which fetches its 19 hittable
    blocks ((320 - 1) // 16) from the store over its link (the fetch on its TTFT path); the
    decode replica, which received the first copy, takes 19 blocks from its GPU and 1 moves."""
    X = list(range(20))
    wl = make_workload([one(320, 3, X, 0.0), one(320, 3, X, 10.0)], prefix_block_tokens=16)
    req, _, c = pd_run(wl, *STORE)
    a, b = req.iloc[0], req.iloc[1]
    assert (a["prefill_replica"], b["prefill_replica"]) == (0, 1)
    assert a["hit_tokens_remote"] == 0 and b["hit_tokens_remote"] == 19 * 16
    assert b["prefix_hit_tokens"] == 19 * 16 and b["onboard_remote_s"] > 0
    assert b["decode_hit_tokens"] == 19 * 16 and b["kv_transfer_blocks"] == 1
    tr = c.tiers.records.frame()
    fetched = tr[tr["direction"] == "store_to_gpu"]
    assert (fetched["replica"] == 1).all() and fetched["pages"].sum() == 19
    assert fetched["bytes"].sum() == 19 * c.store.page_bytes
    put = tr[tr["direction"] == "gpu_to_store"]
    assert put["pages"].sum() == 20  # (the prompt's 20 full blocks, put once)
    cold, _, _ = pd_run(wl, "cluster.replicas=3", "cluster.pd.prefill_replicas=2")
    assert cold["prefix_hit_tokens"].iloc[1] == 0
    assert b["prefill_done_s"] < cold["prefill_done_s"].iloc[1]


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), blocks=st.integers(40, 120),
       tiers=st.sampled_from(["gpu_only", "gpu_host"]))
def test_with_the_store_every_request_moves_its_prompt_blocks_less_the_decode_gpu_hit(
        seed, blocks, tiers):
    """Any workload and small pools on 2 prefill and 1 decode replica over the shared store
    (with or without host tiers): every request finishes or is rejected (the pool invariants
    hold after every step), its prefill hit splits into GPU, host, disk and store tokens, and
    its transfer moves its prompt's blocks less the decode replica's GPU hit."""
    rng = np.random.default_rng(seed)
    rows = [one(int(rng.integers(1, 500)), int(rng.integers(1, 30)),
                [int(rng.integers(0, 3)) * 100 + j for j in range(32)],
                float(np.round(rng.uniform(0, 3), 2))) for _ in range(20)]
    rows.sort(key=lambda r: r["arrival_s"])
    wl = make_workload(rows, prefix_block_tokens=16)
    req, _, c = pd_run(wl, *STORE, f"tiers={tiers}", num_blocks=blocks)
    fin = req[req["status"] == "finished"]
    assert len(fin) + (req["status"] == "rejected").sum() == len(req)
    assert (fin["hit_tokens_gpu"] + fin["hit_tokens_host"] + fin["hit_tokens_disk"]
            + fin["hit_tokens_remote"] == fin["prefix_hit_tokens"]).all()
    want = -(-fin["input_tokens"] // 16) - fin["decode_hit_tokens"] // 16
    assert (fin["kv_transfer_blocks"] == want).all()
    assert all(not s.handed for s in c.replicas)
    assert len(c.store.pages) <= c.store.capacity


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), blocks=st.integers(50, 120),
       policy=st.sampled_from([SNAP[:2] + ("policy.mode=union", SNAP[2]), STREAM]))
@example(seed=6600, blocks=50, policy=SNAP[:2] + ("policy.mode=union", SNAP[2]))
def test_compression_tiers_and_the_store_together_keep_the_transfer_rule(seed, blocks, policy):
    """A compression policy, host tiers and the shared store on 2 prefill and 2 decode
    replicas: every request finishes or is rejected (pool and layout invariants after every
    step), and its transfer moves the blocks its prefill replica held after its last round
    there less its decode replica's GPU hit."""
    rng = np.random.default_rng(seed)
    rows = [one(int(rng.integers(1, 700)), int(rng.integers(1, 40)),
                [int(rng.integers(0, 3)) * 100 + j for j in range(44)],
                float(np.round(rng.uniform(0, 3), 2))) for _ in range(12)]
    rows.sort(key=lambda r: r["arrival_s"])
    wl = make_workload(rows, prefix_block_tokens=16)
    req, _, c = pd_run(wl, "cluster.replicas=4", "cluster.pd.prefill_replicas=2",
                       "cluster.store.enabled=true", "tiers=gpu_host", *policy, num_blocks=blocks)
    fin = req[req["status"] == "finished"].set_index("request_id")
    assert len(fin) + (req["status"] == "rejected").sum() == len(req)
    rounds = pd.concat([rounds_of(c.replicas[p]) for p in (0, 1)]).sort_values("time_s",
                                                                             kind="stable")
    last = rounds.groupby("request_id")["blocks_after"].last()
    held = (-(-fin["input_tokens"] // 16)).copy()
    common = held.index.intersection(last.index)  # (finished requests with a round)
    held.loc[common] = last.loc[common].to_numpy(dtype=held.dtype)
    assert (fin["kv_transfer_blocks"] == held - fin["decode_hit_tokens"] // 16).all()
    assert all(not s.handed for s in c.replicas)


def test_disaggregated_runs_are_deterministic():
    """The same workload and config give identical tables."""
    rng = np.random.default_rng(3)
    rows = [one(int(rng.integers(20, 400)), int(rng.integers(1, 30)),
                [int(rng.integers(0, 3)) * 100 + j for j in range(30)],
                float(np.round(rng.uniform(0, 2), 3))) for _ in range(30)]
    rows.sort(key=lambda r: r["arrival_s"])
    wl = make_workload(rows, prefix_block_tokens=16)
    over = ("cluster.replicas=5", "cluster.pd.prefill_replicas=2",
            "cluster.router=prefix_aware", "cluster.pd.decode_router=least_loaded")
    r1, s1, c1 = pd_run(wl, *over, num_blocks=120)
    r2, s2, c2 = pd_run(wl, *over, num_blocks=120)
    pd.testing.assert_frame_equal(r1, r2)
    pd.testing.assert_frame_equal(s1, s2)
    pd.testing.assert_frame_equal(c1.transfers_frame(), c2.transfers_frame())
    assert set(r1["prefill_replica"]) <= {0, 1} and set(r1["decode_replica"]) <= {2, 3, 4}


def test_closed_loop_children_arrive_at_the_prefill_pool_after_their_parents_decode():
    """A closed-loop child is released when its parent finishes on its decode replica and, after
    its think time, is routed over the prefill pool again."""
    wl = chunk_workload(3)
    req, _, _ = pd_run(wl, "cluster.replicas=3", num_blocks=300)
    assert (req["status"] == "finished").all()
    by_id = req.set_index("request_id")
    parent = np.asarray(wl.parent_request_id)
    think = np.asarray(wl.think_s)
    rid = np.asarray(wl.request_id)
    kids = np.flatnonzero(parent >= 0)
    assert len(kids)
    for k in kids.tolist():
        p = by_id.loc[int(parent[k])]
        c = by_id.loc[int(rid[k])]
        assert c["arrival_s"] == pytest.approx(p["finish_s"] + max(think[k], 0.0), abs=1e-9)
        assert c["prefill_replica"] == 0 and c["decode_replica"] in (1, 2)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), prefill=st.integers(1, 2), decode=st.integers(1, 2),
       blocks=st.integers(40, 200), gbps=st.sampled_from([0.5, 47.0]))
def test_every_request_moves_its_prompt_blocks_less_the_decode_hit(seed, prefill, decode, blocks,
                                                                    gbps):
    """Any workload, pool and link: every request finishes (the pool invariants hold after
    every step of every replica), its transfer moves ceil(input / block_size) blocks less its
    decode replica's hit, page bytes each, and no prefill replica holds blocks at the end."""
    rng = np.random.default_rng(seed)
    rows = [one(int(rng.integers(1, 500)), int(rng.integers(1, 40)),
                [int(rng.integers(0, 4)) * 100 + j for j in range(32)],
                float(np.round(rng.uniform(0, 3), 2))) for _ in range(25)]
    rows.sort(key=lambda r: r["arrival_s"])
    wl = make_workload(rows, prefix_block_tokens=16)
    req, _, c = pd_run(wl, f"cluster.replicas={prefill + decode}",
                       f"cluster.pd.prefill_replicas={prefill}", f"cluster.pd.net_gbps={gbps}",
                       num_blocks=blocks)
    fin = req[req["status"] == "finished"]
    assert len(fin) + (req["status"] == "rejected").sum() == len(req)
    want = -(-fin["input_tokens"] // 16) - fin["decode_hit_tokens"] // 16
    assert (fin["kv_transfer_blocks"] == want).all()
    assert (fin["kv_transfer_bytes"] == want * page_bytes_of(_cfg())).all()
    assert (fin["ttft_s"] >= fin["prefill_done_s"] + fin["onboard_s"]).all()
    assert all(not s.handed for s in c.replicas)


def test_run_writes_the_transfers_and_the_pools_summary(tmp_path):
    """run_simulation with disaggregation: the requests table's prefill/decode columns, one
    transfers row per finished request, summary.json's cluster.pd per pool."""
    rows = [one(50 + 10 * k, 3, [k % 2 * 100 + j for j in range(8)], 0.1 * k) for k in range(12)]
    wl = make_workload(rows, prefix_block_tokens=16)
    cfg = _cfg("cluster.replicas=3", "cluster.pd.prefill_replicas=1",
               "cluster.pd.decode_router=least_loaded")
    s = run_simulation(cfg, tmp_path, workload=wl)
    req = pd.read_parquet(tmp_path / "requests.parquet")
    tr = pd.read_parquet(tmp_path / "transfers.parquet")
    assert "replica" not in req.columns
    assert len(tr) == (req["status"] == "finished").sum() == 12
    assert tr["bytes"].sum() == req["kv_transfer_bytes"].sum()
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    p = on_disk["cluster"]["pd"]
    assert (p["prefill_replicas"], p["decode_replicas"]) == (1, 2)
    assert p["link"]["bytes"] == int(tr["bytes"].sum()) and p["link"]["transfers"] == 12
    assert p["prefill"]["requests"] == 12 and p["decode"]["requests"] == 12
    assert [r["role"] for r in on_disk["cluster"]["per_replica"]] == ["prefill", "decode", "decode"]
    assert s["cluster"]["per_step_reason"] == "prefill/decode disaggregation"


def test_run_writes_the_replicas_tier_copies_beside_the_kv_transfers(tmp_path):
    """run_simulation with disaggregation and a host tier: transfers.parquet holds the KV
    transfers (request and prefill replica named) and the replicas' tier copies (request and
    prefill replica -1), in time order; summary.json counts them all."""
    X, Y = list(range(20)), list(range(100, 120))
    wl = make_workload([one(320, 3, X, 0.0), one(320, 3, Y, 10.0), one(320, 3, X, 20.0)],
                       prefix_block_tokens=16)
    cfg = _cfg("cluster.replicas=2", "cluster.pd.prefill_replicas=1", "tiers=gpu_host",
               "cache.num_gpu_blocks=24")
    s = run_simulation(cfg, tmp_path, workload=wl)
    req = pd.read_parquet(tmp_path / "requests.parquet")
    tr = pd.read_parquet(tmp_path / "transfers.parquet")
    kv = tr[tr["direction"] == "prefill_to_decode"]
    copies = tr[tr["direction"] != "prefill_to_decode"]
    assert list(kv["request_id"]) == [0, 1, 2] and (kv["prefill_replica"] == 0).all()
    assert kv["bytes"].sum() == req["kv_transfer_bytes"].sum()
    assert {"d2h", "h2d"} <= set(copies["direction"])
    assert (copies["request_id"] == -1).all() and (copies["prefill_replica"] == -1).all()
    assert tr["time_s"].is_monotonic_increasing
    assert s["transfers"] == len(tr)


@pytest.mark.parametrize("overrides, field", [
    (["cluster.replicas=2", "cluster.pd.prefill_replicas=2"], "cluster.pd.prefill_replicas=2"),
    (["cluster.replicas=2", "cluster.pd.prefill_replicas=-1"], "cluster.pd.prefill_replicas=-1"),
    (["cluster.replicas=2", "cluster.pd.prefill_replicas=1", "cluster.pd.decode_router=nearest"],
     "cluster.pd.decode_router='nearest'"),
    (["cluster.replicas=2", "cluster.pd.prefill_replicas=1", "cluster.pd.net_gbps=0"],
     "cluster.pd.net_gbps=0"),
])
def test_a_bad_disaggregation_config_is_one_error_naming_the_field(tmp_path, overrides, field):
    wl = make_workload([one(50, 3)], prefix_block_tokens=16)
    with pytest.raises(ConfigError, match=field.replace("[", r"\[")):
        run_simulation(_cfg(*overrides), tmp_path / "out", workload=wl)
    assert not (tmp_path / "out").exists()
