"""sim.kv_store: the KV store a cluster's replicas share (the remote tier below host and disk)."""

import numpy as np
import pandas as pd
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_workload
from sim.block_pool import BlockPool
from sim.cluster import Cluster, ClusterRecorder
from sim.errors import ConfigError
from sim.hardware import kv_bytes_per_block, plan_memory
from sim.kv_manager import KVManager
from sim.kv_store import SharedStore, StoreLink, build_store
from sim.run import _tiers_factory, build_cost_model, compose_config, run_simulation
from sim.tiers import DISK, GPU, HOST, REMOTE, TierManager, cold_page_bytes

GIB = 2**30


def _cfg(*overrides):
    return compose_config(["sim.progress=false", *overrides])


def store_cluster(wl, *overrides, num_blocks=200, fresh_walks=False, monkeypatch=None,
                  fast_forward=True):
    """Run a cluster with a shared store (``cluster.store.enabled=true``) on ``wl``; returns
    (requests, steps, transfers, Cluster, audit). ``fresh_walks``: every prefix walk starts
    afresh (the waiting head's memo dropped before each lookup); ``fast_forward``: the
    replicas may take their fast paths (False: the per-step loop only)."""
    cfg = _cfg("cluster.store.enabled=true", *overrides)
    plan = plan_memory(cfg.model, cfg.gpu, cfg.cache, cfg.scheduler, cfg.cost.tensor_parallel_size)
    cost = build_cost_model(cfg.model, cfg.gpu, cfg.cache, cfg.cost)
    store = build_store(cfg, plan.block_bytes)
    store.audit = []
    factory, _ = _tiers_factory(cfg, plan)
    if fresh_walks:
        orig = KVManager.prefix_hit

        def fresh(self, req):
            self.hit_memo = None
            return orig(self, req)

        monkeypatch.setattr(KVManager, "prefix_hit", fresh)
    rec = ClusterRecorder(len(wl), wl.table.column("session_id").to_numpy())
    c = Cluster(cfg.cluster, wl, num_blocks, cfg.cache.block_size, cfg.scheduler, cfg.cache, cost,
                cfg.model.max_model_len, rec, check_invariants=True, tiers=factory, store=store,
                num_layers=cfg.model.num_layers, fast_forward=fast_forward)
    c.run()
    return rec.requests_frame(), rec.steps_frame(), c.tiers.records.frame(), c, store.audit


def _ids(base, n):
    return [base + j for j in range(n)]


def test_store_serves_a_prefix_computed_on_another_replica_and_charges_the_transfer(tmp_path):
    # replica 0 computes a 20-block prompt; replica 1 (round robin) gets the same prompt later:
    # its 19 hittable blocks ((320 - 1) // 16) come from the store over its link
    rows = [dict(arrival_s=0.0, input_tokens=320, output_tokens=2, prefix_ids=_ids(100, 20)),
            dict(arrival_s=5.0, input_tokens=320, output_tokens=2, prefix_ids=_ids(100, 20))]
    wl = make_workload(rows, prefix_block_tokens=16)
    ov = ("cluster.replicas=2", "cluster.router=round_robin", "cache.num_gpu_blocks=200")
    req, _, tr, c, audit = store_cluster(wl, *ov)
    store = c.store
    k = _cfg()
    page = cold_page_bytes(k.model, k.cache, k.codec)
    assert store.page_bytes == page == 147_456 * 16
    r1 = req.set_index("request_id").loc[1]
    assert r1["replica"] == 1
    assert r1["hit_tokens_remote"] == 19 * 16 == r1["prefix_hit_tokens"]
    assert r1["hit_tokens_gpu"] == r1["hit_tokens_host"] == r1["hit_tokens_disk"] == 0
    # one batch of 19 pages on an idle link: 100 us + 19 pages x 2,359,296 B / 47 GB/s
    dur = 100e-6 + 19 * page / 47e9
    assert r1["onboard_remote_s"] == (5.0 + dur) - 5.0
    assert r1["onboard_s"] == r1["onboard_remote_s"]  # (the fetch is the whole onboard)
    assert r1["ttft_s"] == pytest.approx(r1["queue_s"] + r1["onboard_s"] + r1["prefill_s"])
    get = tr[(tr["direction"] == "store_to_gpu")]
    assert get[["replica", "pages", "bytes", "queue_s"]].values.tolist() == [[1, 19, 19 * page, 0]]
    assert get["duration_s"].iloc[0] == dur and (get["codec"] == "identity").all()
    # replica 0 put its 20 full prompt blocks; replica 1 put none (the store held them all)
    put = tr[tr["direction"] == "gpu_to_store"]
    assert set(put["replica"]) == {0} and put["pages"].sum() == 20 == store.pages_put
    assert [op for op, _, _ in audit] == ["put", "get"]
    # without the store replica 1 recomputes the prompt
    cfg = _cfg(*ov)
    s = run_simulation(cfg, tmp_path / "off", workload=wl, progress_bar=False)
    off = pd.read_parquet(tmp_path / "off" / "requests.parquet").set_index("request_id")
    assert off.loc[1, "prefix_hit_tokens"] == 0 and "hit_tokens_remote" not in off.columns
    assert "remote" not in s["hit_ratio"] and "store" not in s["cluster"]
    assert r1["ttft_s"] < off.loc[1, "ttft_s"]


def test_store_codec_sets_the_page_bytes_the_link_moves():
    rows = [dict(arrival_s=0.0, input_tokens=320, output_tokens=2, prefix_ids=_ids(100, 20)),
            dict(arrival_s=5.0, input_tokens=320, output_tokens=2, prefix_ids=_ids(100, 20))]
    wl = make_workload(rows, prefix_block_tokens=16)
    req, _, tr, c, _ = store_cluster(wl, "cluster.replicas=2", "cluster.router=round_robin",
                                     "cluster.store.codec=fp8")
    k = _cfg("codec=fp8")
    fp8 = cold_page_bytes(k.model, k.cache, k.codec)
    assert c.store.page_bytes == fp8 == 147_456 * 16 // 2
    remote = tr[tr["tier"] == "remote"]
    assert (remote["bytes"] == remote["pages"] * fp8).all() and (remote["codec"] == "fp8").all()
    # the decode rides the fetch: the link time, or latency + codec time when longer
    hbm = float(k.gpu.hbm_bandwidth_gbps) * 1e9 * float(k.cost.mbu)
    link = 100e-6 + 19 * fp8 / 47e9
    codec = 100e-6 + 19 * (147_456 * 16 + fp8) / hbm
    get = remote[remote["direction"] == "store_to_gpu"]
    assert get["duration_s"].tolist() == [max(link, codec)]


def test_locate_serves_each_block_from_the_fastest_tier_and_the_store_last():
    env = simpy.Environment()
    k = _cfg("tiers=gpu_host")
    page = cold_page_bytes(k.model, k.cache, k.codec)
    tm = TierManager(env, k.tiers, k.codec, page, page, k.gpu, 1e12)
    store = SharedStore(100, "lru", page, "identity", page, 1e12, 47e9, 100e-6)
    tm.store = StoreLink(env, store, 0, 64)
    pool = BlockPool(16, True, index="table")
    keys = np.arange(1, 9, dtype=np.int64) * 7919
    blocks = pool.allocate(2)
    pool.cache_blocks(blocks, keys[[0, 3]])  # GPU: blocks 0 and 3
    tm.host.insert_many(keys[[1, 3]].tolist())  # host: 1 (and 3, also on the GPU)
    store.land(keys[[1, 2, 4, 6]], 0)  # store: 1 (also on the host), 2, 4, 6
    blk, code = tm.locate(pool, keys)
    assert code.tolist() == [GPU, HOST, REMOTE, GPU, REMOTE, -1, REMOTE, -1]
    assert blk.tolist() == [int(blocks[0]), -1, -1, int(blocks[1]), -1, -1, -1, -1]
    blk, code = tm.locate(pool, keys, stop=True)  # (a prefix walk ends at block 5)
    assert code.tolist() == [GPU, HOST, REMOTE, GPU, REMOTE]
    tm.store = None
    assert tm.locate(pool, keys, stop=True)[1].tolist() == [GPU, HOST]
    assert DISK not in code.tolist()


def _open_loop(seed, n, families):
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        inp = int(rng.integers(40, 600))
        fam = int(rng.integers(0, families))
        rows.append(dict(arrival_s=float(np.round(rng.uniform(0, 2.0), 3)), input_tokens=inp,
                         output_tokens=int(rng.integers(1, 60)),
                         prefix_ids=_ids(fam * 1000, -(-inp // 16))))
    rows.sort(key=lambda r: r["arrival_s"])
    return rows


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), n=st.integers(2, 3),
       router=st.sampled_from(["round_robin", "least_loaded", "prefix_aware"]),
       pages=st.sampled_from([8, 40, 400]), host=st.sampled_from([0, 30]),
       blocks=st.sampled_from([60, 150]), seqs=st.sampled_from([1, 2, 256]),
       replacement=st.sampled_from(["lru", "arc"]))
def test_store_invariants_and_memoised_walks_equal_fresh_walks(seed, n, router, pages, host,
                                                               blocks, seqs, replacement,
                                                               monkeypatch):
    """Store pages never exceed its capacity; every page fetched from the store was put by some
    replica before; each request's hit tokens split over the tiers exactly; every store batch
    moves pages x page bytes; the memoised prefix walks (revalidated by the store's change
    log) and the replicas' tier stretches give the tables of walks made afresh at every lookup
    by the per-step loop."""
    wl = make_workload(_open_loop(seed, 28, 3), prefix_block_tokens=16)
    page = 147_456 * 16
    ov = (f"cluster.replicas={n}", f"cluster.router={router}", f"scheduler.max_num_seqs={seqs}",
          f"cluster.store.capacity_gib={(pages + 0.5) * page / GIB!r}",
          f"cluster.store.replacement={replacement}",
          f"tiers.host_gib={(host + 0.5) * page / GIB if host else 0.0!r}")
    seen = []
    req, steps, tr, c, audit = store_cluster(wl, *ov, num_blocks=blocks)
    store = c.store
    assert store.capacity == pages and store.peak <= pages and len(store) <= pages
    landed = set()
    for op, r, keys in audit:
        if op == "put":
            landed |= set(keys.tolist())
        else:
            assert set(keys.tolist()) <= landed, "a page fetched that no replica put"
            seen.append(len(keys))
    fin = req[req["status"] == "finished"]
    parts = fin[["hit_tokens_gpu", "hit_tokens_host", "hit_tokens_disk", "hit_tokens_remote"]]
    assert (parts.sum(axis=1) == fin["prefix_hit_tokens"]).all() and (parts >= 0).all().all()
    assert fin["hit_tokens_remote"].sum() <= 16 * store.pages_got
    remote = tr[tr["tier"] == "remote"]
    assert (remote["bytes"] == remote["pages"] * page).all()
    assert remote.loc[remote["direction"] == "store_to_gpu", "pages"].sum() == sum(seen)
    assert c.ff_reason == "a shared KV store"
    rf, sf, tf, _, _ = store_cluster(wl, *ov, num_blocks=blocks, fresh_walks=True,
                                     monkeypatch=monkeypatch, fast_forward=False)
    pd.testing.assert_frame_equal(req, rf)
    pd.testing.assert_frame_equal(steps, sf)
    pd.testing.assert_frame_equal(tr, tf)


@pytest.mark.parametrize("router", ["least_loaded", "prefix_aware"])
def test_replicas_with_a_store_take_the_tier_stretch_and_equal_the_per_step_loop(router):
    """With a shared store the replicas take the tier stretch (one SimPy timeout a step: the
    store's puts and landings and the router's reads keep their order), and every table equals
    the per-step loop's."""
    wl = make_workload(_open_loop(3, 30, 3), prefix_block_tokens=16)
    ov = ("cluster.replicas=3", f"cluster.router={router}", "cluster.event_staleness_s=0.02")
    req, steps, tr, c, _ = store_cluster(wl, *ov, num_blocks=150)
    counts = c.stretch_counts()["tiers"]
    assert counts["taken"] > 0 and counts["steps"] > counts["taken"]
    assert c.stretch_counts()["decode"]["taken"] == 0
    rp, sp, tp, cp, _ = store_cluster(wl, *ov, num_blocks=150, fast_forward=False)
    assert cp.stretch_counts()["tiers"]["taken"] == 0
    pd.testing.assert_frame_equal(req, rp)
    pd.testing.assert_frame_equal(steps, sp)
    pd.testing.assert_frame_equal(tr, tp)


def test_run_with_a_store_writes_remote_columns_and_summary(tmp_path):
    cfg = _cfg("trace.max_requests=80", "cluster.replicas=2", "cluster.router=round_robin",
               "cluster.store.enabled=true", "cache.num_gpu_blocks=2000")
    s = run_simulation(cfg, tmp_path, progress_bar=False)
    req = pd.read_parquet(tmp_path / "requests.parquet")
    cols = req.columns.tolist()
    assert cols[cols.index("hit_tokens_disk") + 1] == "hit_tokens_remote"
    assert cols[cols.index("onboard_disk_s") + 1] == "onboard_remote_s"
    assert req["hit_tokens_remote"].dtype == np.int64
    fin = req[req["status"] == "finished"]
    prompt = fin["input_tokens"].sum()
    assert s["hit_ratio"]["remote"] == fin["hit_tokens_remote"].sum() / prompt > 0
    assert sum(s["hit_ratio"][t] for t in ("gpu", "host", "disk", "remote")) == \
        pytest.approx(s["hit_ratio"]["total"])
    st_ = s["cluster"]["store"]
    assert st_["pages_put"] == sum(p["store_pages_put"] for p in s["cluster"]["per_replica"])
    assert st_["bytes_fetched"] == st_["pages_fetched"] * st_["page_bytes"]
    assert "remote" in s["preempted_lookups"]["hit_tokens"]
    assert s["cluster"]["per_step_reason"] == "a shared KV store"


@pytest.mark.parametrize("override,field", [
    ("cluster.store.capacity_gib=0", "cluster.store.capacity_gib=0"),
    ("cluster.store.capacity_gib=1e-9", "cluster.store.capacity_gib=1e-09 holds no page"),
    ("cluster.store.net_gbps=-1", "cluster.store.net_gbps=-1"),
    ("cluster.store.net_latency_s=-0.5", "cluster.store.net_latency_s=-0.5"),
    ("cluster.store.replacement=fifo", "cluster.store.replacement='fifo'"),
    ("cluster.store.codec=zstd", "cluster.store.codec='zstd'"),
    ("cluster.replicas=1", "cluster.replicas=1"),
    ("tiers.load_or_recompute=true", "tiers.load_or_recompute=false"),
    ("cache.enable_prefix_caching=false", "cache.enable_prefix_caching=true"),
])
def test_bad_store_config_is_one_line_naming_the_field(override, field, tmp_path):
    n = [] if override.startswith("cluster.replicas") else ["cluster.replicas=2"]
    cfg = _cfg("trace.max_requests=5", *n, "cluster.store.enabled=true", override)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.").replace("'", "'?")) as e:
        run_simulation(cfg, tmp_path / "o", progress_bar=False)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "o").exists()


def test_a_waiting_head_sees_pages_that_land_in_the_store_while_it_waits(monkeypatch):
    # replica 1's pool (40 blocks) is held by a long decode (row 1) when row 3 arrives there:
    # row 3 waits, its prefix walk memoised, while replica 0 computes the same prompt (row 0)
    # and puts it in the store; once row 1 finishes, row 3 is admitted with those pages
    rows = [dict(arrival_s=0.0, input_tokens=480, output_tokens=2, prefix_ids=_ids(100, 30)),
            dict(arrival_s=0.0, input_tokens=320, output_tokens=300, prefix_ids=_ids(500, 20)),
            dict(arrival_s=0.0, input_tokens=16, output_tokens=1, prefix_ids=_ids(900, 1)),
            dict(arrival_s=0.01, input_tokens=480, output_tokens=2, prefix_ids=_ids(100, 30))]
    wl = make_workload(rows, prefix_block_tokens=16)
    ov = ("cluster.replicas=2", "cluster.router=round_robin")
    req, steps, tr, c, audit = store_cluster(wl, *ov, num_blocks=40)
    r3 = req.set_index("request_id").loc[3]
    assert r3["replica"] == 1 and r3["hit_tokens_remote"] == 29 * 16
    first_put = min(t for t in tr.loc[tr["direction"] == "gpu_to_store", "time_s"])
    assert r3["queue_s"] > first_put  # (it waited past the puts)
    rf, sf, tf, _, _ = store_cluster(wl, *ov, num_blocks=40, fresh_walks=True,
                                     monkeypatch=monkeypatch)
    pd.testing.assert_frame_equal(req, rf)
    pd.testing.assert_frame_equal(tr, tf)
