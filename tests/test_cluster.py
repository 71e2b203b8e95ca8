"""sim.cluster and sim.routers: replicas behind a router in one SimPy environment."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import chunk_workload, make_workload
from sim.block_pool import NO_HASH
from sim.cluster import Cluster, ClusterRecorder
from sim.compression import Compression
from sim.engine import Simulator
from sim.errors import ConfigError
from sim.metrics import Recorder
from sim.hardware import plan_memory
from sim.run import _tiers_factory, build_cost_model, compose_config, run_simulation


def _cfg(*overrides):
    return compose_config(["sim.progress=false", *overrides])


def single(wl, *overrides, num_blocks=1000, fast_forward=True):
    """The single engine's (requests, steps) tables."""
    cfg = _cfg(*overrides)
    cost = build_cost_model(cfg.model, cfg.gpu, cfg.cache, cfg.cost)
    rec = Recorder(len(wl), wl.table.column("session_id").to_numpy())
    sim = Simulator(wl, num_blocks, cfg.cache.block_size, cfg.scheduler, cfg.cache, cost,
                    cfg.model.max_model_len, rec, fast_forward=fast_forward,
                    check_invariants=True)
    sim.run()
    return rec.requests_frame(), rec.steps_frame()


def cluster(wl, *overrides, num_blocks=1000, fast_forward=True, check=True, tiers=False,
            compression=False):
    """A cluster's (requests, steps, Cluster) for ``cluster.*`` overrides; ``tiers``: each
    replica gets the tier manager the ``tiers.*`` overrides describe; ``compression``: each
    replica runs the ``policy.*`` / ``compaction.*`` overrides' compression."""
    cfg = _cfg(*overrides)
    cost = build_cost_model(cfg.model, cfg.gpu, cfg.cache, cfg.cost)
    comp = (Compression(cfg.policy, cfg.compaction, cfg.model, cfg.cache, cfg.cost,
                        float(cfg.gpu.hbm_bandwidth_gbps) * 1e9, int(cfg.seed))
            if compression else None)
    factory = None
    if tiers:
        plan = plan_memory(cfg.model, cfg.gpu, cfg.cache, cfg.scheduler,
                           cfg.cost.tensor_parallel_size)
        factory, _ = _tiers_factory(cfg, plan)
    n = int(cfg.cluster.replicas)
    rec = (ClusterRecorder if n > 1 else Recorder)(len(wl), wl.table.column("session_id").to_numpy())
    c = Cluster(cfg.cluster, wl, num_blocks, cfg.cache.block_size, cfg.scheduler, cfg.cache, cost,
                cfg.model.max_model_len, rec, fast_forward=fast_forward, check_invariants=check,
                tiers=factory, num_layers=cfg.model.num_layers, compression=comp)
    c.run()
    return rec.requests_frame(), rec.steps_frame(), c


def open_loop(seed, n=40, families=3, spread=4.0):
    """Open-loop requests whose prompts share prefixes by family (ids of 16 tokens)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        inp = int(rng.integers(40, 700))
        fam = int(rng.integers(0, families))
        rows.append(dict(arrival_s=float(np.round(rng.uniform(0, spread), 3)), input_tokens=inp,
                         output_tokens=int(rng.integers(1, 90)),
                         prefix_ids=[fam * 1000 + j for j in range(-(-inp // 16))]))
    rows.sort(key=lambda r: r["arrival_s"])
    return rows


@pytest.mark.parametrize("fast_forward", [True, False])
def test_cluster_of_one_replica_equals_the_single_engine(fast_forward):
    wl = chunk_workload(3)  # (closed-loop children, shared prefixes, chunked prefills)
    r1, s1 = single(wl, num_blocks=60, fast_forward=fast_forward)
    r2, s2, c = cluster(wl, "cluster.replicas=1", num_blocks=60, fast_forward=fast_forward)
    pd.testing.assert_frame_equal(r1, r2)
    pd.testing.assert_frame_equal(s1, s2)
    assert "replica" not in r2.columns and "replica" not in s2.columns


@pytest.mark.parametrize("fast_forward", [True, False])
def test_round_robin_over_copies_equals_single_runs(fast_forward):
    rows = open_loop(5)
    n = 3
    wl1 = make_workload(rows, prefix_block_tokens=16)
    copies = [dict(r, session_id=k * 1000 + j) for j, r in enumerate(rows) for k in range(n)]
    wln = make_workload(copies, prefix_block_tokens=16)
    r1, s1 = single(wl1, num_blocks=120, fast_forward=fast_forward)
    rn, sn, _ = cluster(wln, f"cluster.replicas={n}", "cluster.router=round_robin",
                        num_blocks=120, fast_forward=fast_forward)
    assert (rn["replica"].to_numpy() == rn["request_id"].to_numpy() % n).all()
    drop = ["request_id", "session_id", "replica"]
    for k in range(n):
        rk = rn[rn["replica"] == k].drop(columns=drop).reset_index(drop=True)
        pd.testing.assert_frame_equal(rk, r1.drop(columns=["request_id", "session_id"]))
        sk = sn[sn["replica"] == k].drop(columns="replica").reset_index(drop=True)
        pd.testing.assert_frame_equal(sk, s1)


def test_round_robin_arrivals_stop_only_their_own_replicas_stretches():
    """With round-robin routing an arrival stops only its own replica's fast-forward stretch:
    replica 0 serves the same requests at the same times, and takes the same stretches, whether
    the other replicas' requests arrive with its own or a little after."""
    rows = open_loop(5)
    n = 3
    counts = []
    for shift in (0.0, 0.0007):
        copies = [dict(r, arrival_s=r["arrival_s"] + k * shift, session_id=k * 1000 + j)
                  for j, r in enumerate(rows) for k in range(n)]
        req, _, c = cluster(make_workload(copies, prefix_block_tokens=16),
                            f"cluster.replicas={n}", "cluster.router=round_robin",
                            num_blocks=120)
        assert (req.loc[req["replica"] == 0, "request_id"] % n == 0).all()
        counts.append(c.replicas[0].stretch_counts()["decode"])
    assert counts[0]["taken"] > 0 and counts[0] == counts[1]


def _resend(first):
    """Four documents (16 blocks each, answers of 400 tokens) at t=0..0.3, then ``first``'s
    resent at t=30 (every request done)."""
    rows = [dict(arrival_s=0.1 * d, input_tokens=256, output_tokens=400,
                 prefix_ids=[100 * (d + 1) + j for j in range(16)]) for d in range(4)]
    rows.append(dict(arrival_s=30.0, input_tokens=256, output_tokens=4,
                     prefix_ids=[100 * (first + 1) + j for j in range(16)]))
    return make_workload(rows, prefix_block_tokens=16)


def test_prefix_aware_sends_a_resent_document_to_its_holder_round_robin_misses():
    wl = _resend(first=1)
    req, _, _ = cluster(wl, "cluster.replicas=3", "cluster.router=prefix_aware")
    assert req["replica"].iloc[4] == req["replica"].iloc[1]
    assert req["prefix_hit_tokens"].iloc[4] == 240  # (256 - 1) // 16 blocks
    req, _, _ = cluster(wl, "cluster.replicas=3", "cluster.router=round_robin")
    assert req["replica"].tolist() == [0, 1, 2, 0, 1]
    wl0 = _resend(first=0)  # document 0 on replica 0; round robin sends the resend to 1
    req, _, _ = cluster(wl0, "cluster.replicas=3", "cluster.router=round_robin")
    assert req["prefix_hit_tokens"].iloc[4] == 0


def test_prefix_aware_router_does_not_see_events_younger_than_the_staleness():
    # document 1 sits on replica 1 (replica 0 is busier when it arrives); at t=30 every ledger
    # is empty: a fresh view picks replica 1 (hit), a view 100 s stale sees nothing and the tie
    # goes to replica 0 (miss)
    wl = _resend(first=1)
    fresh, _, _ = cluster(wl, "cluster.replicas=2", "cluster.router=prefix_aware")
    stale, _, _ = cluster(wl, "cluster.replicas=2", "cluster.router=prefix_aware",
                          "cluster.event_staleness_s=100")
    assert fresh["replica"].iloc[1] == 1 and fresh["replica"].iloc[4] == 1
    assert fresh["prefix_hit_tokens"].iloc[4] == 240
    assert stale["replica"].iloc[4] == 0 and stale["prefix_hit_tokens"].iloc[4] == 0


def test_kv_views_mirror_each_replica_prefix_index():
    wl = make_workload(open_loop(11, n=60, families=4), prefix_block_tokens=16)
    _, _, c = cluster(wl, "cluster.replicas=3", "cluster.router=prefix_aware", num_blocks=80)
    for r, sim in enumerate(c.replicas):
        c._publish(r)
    c.pending, batches = [], list(c.pending)
    for _, r, events in batches:
        c.views[r].apply(events)
    evicted = sum(s.pool.evicted_cached_blocks for s in c.replicas)
    assert evicted > 0  # (the pools were small enough to evict cached blocks)
    for view, sim in zip(c.views, c.replicas):
        tab = sim.pool.index.tab[0::2]
        assert np.array_equal(view.keys(), np.sort(tab[tab != NO_HASH]))


def test_session_affinity_keeps_a_session_on_one_replica_and_children_go_through_the_router():
    wl = chunk_workload(4)
    req, _, c = cluster(wl, "cluster.replicas=3", "cluster.router=session_affinity", num_blocks=60)
    assert c.ff_reason is not None  # (closed-loop children: per-step replicas)
    assert req.groupby("session_id")["replica"].nunique().max() == 1
    assert req["request_id"].is_unique and len(req) == len(wl)


def test_least_loaded_picks_the_shortest_queue_ties_to_the_lowest_index():
    # three long requests at t=0 spread over 3 replicas; the fourth, at t=0.01, goes to the
    # replica whose request finished (its output is 1 token)
    rows = [dict(arrival_s=0.0, input_tokens=64, output_tokens=o) for o in (200, 1, 200)]
    rows.append(dict(arrival_s=1.0, input_tokens=64, output_tokens=3))
    wl = make_workload(rows)
    req, _, _ = cluster(wl, "cluster.replicas=3", "cluster.router=least_loaded")
    assert req["replica"].tolist() == [0, 1, 2, 1]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(2, 4),
       router=st.sampled_from(["round_robin", "least_loaded", "session_affinity",
                               "prefix_aware"]),
       stale=st.sampled_from([0.0, 0.05, 0.4]), blocks=st.sampled_from([60, 200]))
def test_every_request_served_once_and_fast_paths_equal_the_per_step_loop(seed, n, router,
                                                                           stale, blocks):
    wl = make_workload(open_loop(seed, n=30, spread=3.0), prefix_block_tokens=16)
    ov = (f"cluster.replicas={n}", f"cluster.router={router}",
          f"cluster.event_staleness_s={stale}")
    rf, sf, c = cluster(wl, *ov, num_blocks=blocks, fast_forward=True)
    rp, sp, _ = cluster(wl, *ov, num_blocks=blocks, fast_forward=False)
    assert c.ff_reason is None
    assert rf["request_id"].is_unique and len(rf) == len(wl)
    assert rf["replica"].between(0, n - 1).all()
    assert set(rf["status"]) <= {"finished", "rejected"}
    pd.testing.assert_frame_equal(rf, rp)
    pd.testing.assert_frame_equal(sf, sp)


COMPRESSION_POLICIES = [("policy=triattention", "policy.budget=64", "policy.beta=16",
                         "compaction=forward_pack"),
                        ("policy=snapkv", "policy.budget=64"),
                        ("policy=streaming_llm", "policy.recent_window=60", "policy.beta=16")]


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), n=st.integers(2, 3),
       policy=st.sampled_from(COMPRESSION_POLICIES), blocks=st.sampled_from([120, 400]))
def test_round_robin_replicas_with_compression_take_the_stretches_and_equal_the_per_step_loop(
        seed, n, policy, blocks):
    """Behind round_robin, replicas under a compression policy (no tiers) take the compression
    stretches, each ended at its own replica's arrivals, and every table (requests, steps,
    compression rounds) equals the per-step loop's."""
    wl = make_workload(open_loop(seed, n=20, spread=3.0), prefix_block_tokens=16)
    ov = (f"cluster.replicas={n}", "cluster.router=round_robin", *policy)
    rf, sf, c = cluster(wl, *ov, num_blocks=blocks, compression=True)
    assert c.ff_reason is None
    counts = c.stretch_counts()
    assert counts["rounds"]["taken"] > 0 and counts["rounds"]["steps"] > counts["rounds"]["taken"]
    rp, sp, cp = cluster(wl, *ov, num_blocks=blocks, compression=True, fast_forward=False)
    assert all(v["taken"] == 0 for v in cp.stretch_counts().values())
    pd.testing.assert_frame_equal(rf, rp)
    pd.testing.assert_frame_equal(sf, sp)
    assert c.rounds == cp.rounds


@pytest.mark.parametrize("router", ["prefix_aware", "least_loaded"])
def test_replicas_with_compression_behind_a_state_reading_router_run_per_step(router):
    """Behind a router that reads replica state, replicas under a compression policy take no
    multi-step stretch (per_step_reason says why)."""
    wl = make_workload(open_loop(5, n=12, spread=2.0), prefix_block_tokens=16)
    ov = ("cluster.replicas=2", f"cluster.router={router}", *COMPRESSION_POLICIES[1])
    _, _, c = cluster(wl, *ov, num_blocks=200, compression=True)
    assert c.ff_reason == "a compression policy with a router that reads replica state"
    assert all(v["taken"] == 0 for v in c.stretch_counts().values())


@pytest.mark.parametrize("router", ["prefix_aware", "least_loaded"])
def test_replicas_with_host_tiers_take_the_tier_stretch_and_equal_the_per_step_loop(router):
    """Replicas with a host tier take the tier stretch (one SimPy timeout a step, KV events
    published between its steps), never a multi-step stretch, and every table equals the
    per-step loop's."""
    wl = make_workload(open_loop(11, n=30, spread=3.0), prefix_block_tokens=16)
    ov = ("cluster.replicas=3", f"cluster.router={router}", "cluster.event_staleness_s=0.05",
          "tiers=gpu_host", "tiers.host_gib=0.05")
    rf, sf, c = cluster(wl, *ov, num_blocks=120, tiers=True)
    assert c.ff_reason == "host/disk tiers"
    counts = c.stretch_counts()
    assert counts["tiers"]["taken"] > 0 and counts["tiers"]["steps"] > counts["tiers"]["taken"]
    assert counts["decode"]["taken"] == 0 and counts["prefill"]["taken"] == 0
    rp, sp, cp = cluster(wl, *ov, num_blocks=120, tiers=True, fast_forward=False)
    assert cp.stretch_counts()["tiers"]["taken"] == 0
    pd.testing.assert_frame_equal(rf, rp)
    pd.testing.assert_frame_equal(sf, sp)
    pd.testing.assert_frame_equal(c.tiers.records.frame(), cp.tiers.records.frame())


def test_run_writes_replica_columns_and_the_cluster_summary(tmp_path):
    cfg = _cfg("trace.max_requests=60", "cluster.replicas=2", "cluster.router=prefix_aware")
    s = run_simulation(cfg, tmp_path, progress_bar=False)
    req = pd.read_parquet(tmp_path / "requests.parquet")
    steps = pd.read_parquet(tmp_path / "steps.parquet")
    assert req["replica"].dtype == np.int64 and set(req["replica"]) <= {0, 1}
    assert set(steps["replica"]) == {0, 1}
    per = s["cluster"]["per_replica"]
    assert [p["requests"] for p in per] == [int((req["replica"] == k).sum()) for k in (0, 1)]
    assert sum(p["engine_steps"] for p in per) == s["engine_steps"] == len(steps)


@pytest.mark.parametrize("override,field", [
    ("cluster.replicas=0", "cluster.replicas=0"),
    ("cluster.router=random_walk", "cluster.router='random_walk'"),
    ("cluster.event_staleness_s=-1", "cluster.event_staleness_s=-1"),
])
def test_bad_cluster_config_is_one_line_naming_the_field(override, field, tmp_path):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.").replace("'", "'?")):
        run_simulation(_cfg("trace.max_requests=5", override), tmp_path / "o", progress_bar=False)
    assert not (tmp_path / "o").exists()


def test_a_cluster_whose_pools_outgrow_the_host_memory_is_a_config_error(tmp_path):
    """The replicas' block pools together are checked against the host memory available before
    any is built (sim.hardware.check_pool_host_memory with the replica count): 100,000 replicas
    of the default pool need some 440 GiB of bookkeeping, an error naming cluster.replicas."""
    with pytest.raises(ConfigError, match=r"cluster\.replicas=100000 x [\d,]+ KV blocks: the "
                                          r"100,000 block pools' bookkeeping alone needs"):
        run_simulation(_cfg("trace.max_requests=5", "cluster.replicas=100000"), tmp_path / "o",
                       progress_bar=False)
