"""Issue 4: host/disk tiers, cold-page codecs, hit lookup across tiers."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from conftest import SINGLE_ENGINE, make_workload
from sim.errors import ConfigError
from sim.run import compose_config, run_simulation
from sim.tiers import ARCStore, LRUStore, cold_page_bytes

PAGE_16 = 147_456 * 16  # Qwen3-8B BF16 hot page of 16 tokens


def cfg(*o):
    return compose_config([*SINGLE_ENGINE, "sim.progress=false", "sim.check_invariants=true", *o])


@pytest.mark.parametrize("bs", [16, 32, 64])
def test_cold_page_sizes_qwen3_8b(bs):
    values = 36 * 2 * 8 * 128 * bs  # values per page, K and V, all layers
    c = cfg(f"cache.block_size={bs}", "codec=identity")
    assert cold_page_bytes(c.model, c.cache, c.codec) == values * 2
    c = cfg(f"cache.block_size={bs}", "codec=fp8")
    assert cold_page_bytes(c.model, c.cache, c.codec) == values
    c = cfg(f"cache.block_size={bs}", "codec=nvfp4")
    nv = cold_page_bytes(c.model, c.cache, c.codec)
    assert nv == values * 9 // 16  # 0.5625 bytes per value
    assert nv == pytest.approx(values * (1 - 0.4375))  # 43.75% smaller than FP8
    assert nv == pytest.approx(values * 2 * (1 - 0.71875))  # 71.875% smaller than BF16
    c = cfg(f"cache.block_size={bs}", "codec=nvfp4", "codec.keep_rope_hot=true")
    rope = 36 * 8 * 128 * bs  # Qwen3 rotates the whole K head
    assert cold_page_bytes(c.model, c.cache, c.codec) == (values - rope) * 9 // 16 + rope * 2


def test_codec_errors():
    c = cfg("codec=nvfp4", "cache.kv_cache_dtype=fp8")
    with pytest.raises(ConfigError, match="16-bit hot cache"):
        cold_page_bytes(c.model, c.cache, c.codec)
    c = cfg("codec=nvfp4", "model.head_dim=72")
    with pytest.raises(ConfigError, match="multiples of 16"):
        cold_page_bytes(c.model, c.cache, c.codec)


def run(rows, *o, G=16):
    wl = make_workload(rows, prefix_block_tokens=G)
    c = cfg(*o)
    s = run_simulation(c, None, workload=wl)
    from sim import run as r
    return s


def run_frames(tmp_path, rows, *o, G=16):
    wl = make_workload(rows, prefix_block_tokens=G)
    s = run_simulation(cfg(*o), tmp_path, workload=wl)
    req = pd.read_parquet(tmp_path / "requests.parquet").sort_values("request_id")
    tr = pd.read_parquet(tmp_path / "transfers.parquet")
    return s, req, tr


def doc(doc_id, tokens, spread=100.0, t=0.0, out=2):
    """A request whose prompt is document ``doc_id`` (16-token trace blocks)."""
    return dict(arrival_s=t, input_tokens=tokens, output_tokens=out,
                prefix_ids=[doc_id * 10_000 + j for j in range(tokens // 16)])


def test_working_set_in_gpu_needs_no_host_loads(tmp_path):
    rows = [doc(i % 3, 160, t=10.0 * k) for k, i in enumerate(range(12))]
    s, req, tr = run_frames(tmp_path, rows, "tiers=gpu_host", "tiers.host_gib=1",
                            "cache.num_gpu_blocks=200")
    assert s["hit_ratio"]["host"] == 0 and (req.hit_tokens_host == 0).all()
    assert (tr.direction == "h2d").sum() == 0
    assert s["hit_ratio"]["gpu"] > 0.6


@pytest.mark.parametrize("replacement", ["lru"])  # ARC keeps a frequent subset by design
def test_cyclic_scan_larger_than_every_tier_gets_no_hits(tmp_path, replacement):
    # 10 documents of 10 pages cycled: 100 pages > GPU 12 + host 20 + disk 30 (host evictions
    # are demoted to disk, so the tiers together hold up to 62 pages)
    rows = [doc(k % 10, 160, t=10.0 * k) for k in range(50)]
    page = 147_456 * 16
    s, req, tr = run_frames(
        tmp_path, rows, "tiers=gpu_host_disk", f"tiers.host_gib={20 * page / 2**30}",
        f"tiers.disk_gib={30 * page / 2**30}", f"tiers.replacement={replacement}",
        "cache.num_gpu_blocks=12")
    assert s["prefix_hit_tokens_total"] == 0
    assert (req[["hit_tokens_gpu", "hit_tokens_host", "hit_tokens_disk"]] == 0).all().all()
    assert s["bytes_offloaded"]["host"] > 0 and s["bytes_offloaded"]["disk"] > 0


def test_host_hit_cuts_computed_prompt_by_its_hit_tokens(tmp_path):
    # request 0 fills the GPU with doc 1; request 1 (doc 2) evicts it to host; request 2 resends doc 1
    rows = [doc(1, 320, t=0.0), doc(2, 320, t=50.0), doc(1, 320, t=100.0)]
    s, req, tr = run_frames(tmp_path, rows, "tiers=gpu_host", "tiers.host_gib=1",
                            "cache.num_gpu_blocks=22")
    r = req.iloc[2]
    assert r.hit_tokens_host > 0 and r.hit_tokens_host % 16 == 0
    assert r.prefix_hit_tokens == r.hit_tokens_gpu + r.hit_tokens_host + r.hit_tokens_disk
    assert r.computed_prompt_tokens == 320 - r.prefix_hit_tokens
    assert r.onboard_s > 0 and r.onboard_host_s > 0
    assert (tr.direction == "h2d").sum() >= 1 and (tr.direction == "d2h").sum() >= 1
    # the same run without a host tier recomputes everything the GPU lost
    s2, req2, _ = run_frames(tmp_path / "b", rows, "cache.num_gpu_blocks=22")
    assert req2.iloc[2].computed_prompt_tokens == 320 - req2.iloc[2].prefix_hit_tokens
    assert req2.iloc[2].computed_prompt_tokens > r.computed_prompt_tokens


def test_hits_are_block_multiples_and_first_missing_block_ends_hit_in_every_tier(tmp_path):
    rows = [doc(1, 320, t=0.0), doc(2, 320, t=50.0), doc(3, 320, t=100.0),
            # prompt shares doc 1's first 10 blocks, then differs, then doc 1 again: no hit past it
            dict(arrival_s=200.0, input_tokens=320, output_tokens=2,
                 prefix_ids=[10_000 + j for j in range(10)] + [99_000 + j for j in range(10)])]
    page = 147_456 * 16
    s, req, tr = run_frames(tmp_path, rows, "tiers=gpu_host_disk",
                            f"tiers.host_gib={15 * page / 2**30}", f"tiers.disk_gib=1",
                            "cache.num_gpu_blocks=22")
    for col in ("prefix_hit_tokens", "hit_tokens_gpu", "hit_tokens_host", "hit_tokens_disk"):
        assert (req[col] % 16 == 0).all()
    last = req.iloc[3]
    assert last.prefix_hit_tokens == 160  # exactly the shared 10 blocks, from whatever tier


def test_disk_hit_with_load_or_recompute_picks_recompute_when_disk_is_slower(tmp_path):
    rows = [doc(1, 640, t=0.0), doc(2, 640, t=50.0), doc(3, 640, t=100.0), doc(1, 640, t=200.0)]
    common = ["tiers=gpu_host_disk", "tiers.host_gib=0", "tiers.disk_gib=1",
              "cache.num_gpu_blocks=45", "tiers.disk_read_gbps=0.05", "tiers.disk_latency_s=0.05"]
    s, req, _ = run_frames(tmp_path / "a", rows, *common)
    assert req.iloc[3].hit_tokens_disk > 0  # without the option the slow disk is used
    s2, req2, _ = run_frames(tmp_path / "b", rows, *common, "tiers.load_or_recompute=true")
    assert req2.iloc[3].hit_tokens_disk == 0
    assert req2.iloc[3].ttft_s < req.iloc[3].ttft_s
    # the hit given up is counted:
    # the first run's disk hit is what the second recomputes
    assert s["recomputed_instead_of_load"] == {"admissions": 0, "tokens": 0, "disk_tokens": 0}
    ri = s2["recomputed_instead_of_load"]
    assert ri["admissions"] == 1 and ri["disk_tokens"] == req.iloc[3].hit_tokens_disk > 0
    assert ri["tokens"] == req.iloc[3].hit_tokens_host + req.iloc[3].hit_tokens_disk
    assert req2.iloc[3].computed_prompt_tokens - req.iloc[3].computed_prompt_tokens == ri["tokens"]
    # a fast disk (7 GB/s NVMe) holding NVFP4 pages is loaded: 40 pages x 0.66 MB in ~4 ms
    # versus ~15 ms to recompute 640 tokens of Qwen3-8B
    s3, req3, _ = run_frames(tmp_path / "c", rows, *common[:-2], "tiers.load_or_recompute=true",
                             "codec=nvfp4")
    assert req3.iloc[3].hit_tokens_disk > 0
    assert s3["recomputed_instead_of_load"]["admissions"] == 0


def test_multi_turn_hit_ratio_regimes(tmp_path):
    """N clients, each turn resends the whole history. While the histories fit, turn r's hit
    ratio approaches r/(r+1) (each turn adds as much as the first); once clients x context exceed
    the tiers, with LRU and round-robin clients, it collapses toward 0."""
    def convo(n_clients, turns, per_turn=320):
        rows = []
        for r in range(turns):
            for c in range(n_clients):
                L = per_turn * (r + 1)
                rows.append(dict(arrival_s=1000.0 * r + 10.0 * c, input_tokens=L, output_tokens=1,
                                 prefix_ids=[c * 100_000 + j for j in range(L // 16)]))
        return rows

    turns = 6
    s, req, _ = run_frames(tmp_path / "fit", convo(4, turns), "cache.num_gpu_blocks=2000")
    req["turn"] = np.arange(len(req)) // 4
    for r in range(1, turns):
        got = (req[req.turn == r].prefix_hit_tokens / req[req.turn == r].input_tokens).mean()
        ideal = r / (r + 1)
        assert got == pytest.approx(ideal, abs=1.5 / (20 * (r + 1))), (r, got, ideal)
    # 8 clients x up to 120 blocks >> GPU 130 blocks + host 100 pages: LRU thrashes
    page = 147_456 * 16
    s2, req2, _ = run_frames(tmp_path / "thrash", convo(8, turns), "cache.num_gpu_blocks=130",
                             "tiers=gpu_host", f"tiers.host_gib={100 * page / 2**30}")
    late = req2.iloc[8 * 3:]
    assert (late.prefix_hit_tokens / late.input_tokens).mean() < 0.1


def test_lru_and_arc_stores():
    s = LRUStore(2)
    assert s.insert(1) == [] and s.insert(2) == []
    s.touch(1)
    assert s.insert(3) == [2] and 1 in s and 3 in s
    a = ARCStore(2)
    a.insert(1)
    a.insert(2)
    a.touch(1)  # 1 becomes frequent
    ev = a.insert(3)
    assert ev == [2] and 1 in a and len(a) == 2


@pytest.mark.parametrize("write_policy", ["write_back", "write_through"])
def test_fast_forward_equals_per_step_with_tiers(tmp_path, write_policy):
    rng = np.random.default_rng(3)
    rows = []
    for i in range(40):
        d = int(rng.integers(0, 6))
        rows.append(doc(d, int(rng.integers(2, 12)) * 16, t=float(rng.uniform(0, 30)),
                        out=int(rng.integers(20, 200))))
    rows.sort(key=lambda r: r["arrival_s"])
    page = 147_456 * 16
    common = ["tiers=gpu_host_disk", f"tiers.host_gib={30 * page / 2**30}",
              f"tiers.disk_gib={60 * page / 2**30}", f"tiers.write_policy={write_policy}",
              "tiers.transfer_batch_pages=4", "cache.num_gpu_blocks=60"]
    sa, ra, ta = run_frames(tmp_path / "ff", rows, *common, "sim.fast_forward=true")
    sb, rb, tb = run_frames(tmp_path / "step", rows, *common, "sim.fast_forward=false")
    cols = ["hit_tokens_gpu", "hit_tokens_host", "hit_tokens_disk", "computed_prompt_tokens",
            "preemptions", "status"]
    pd.testing.assert_frame_equal(ra[cols].reset_index(drop=True), rb[cols].reset_index(drop=True))
    np.testing.assert_allclose(ra.finish_s, rb.finish_s, rtol=1e-9)
    assert len(ta) == len(tb) and (ta.pages.to_numpy() == tb.pages.to_numpy()).all()
    np.testing.assert_allclose(ta.time_s, tb.time_s, rtol=1e-9)
    assert sa["engine_steps"] == sb["engine_steps"]


def _lru_reference_insert(ref, keys, cap: int) -> list:
    """Insert ``keys`` into the OrderedDict ``ref`` one at a time (a held key moves to the most
    recent end), then evict beyond ``cap``: the pages evicted, in order (the LRU stores' rule)."""
    for k in keys:
        if k in ref:
            ref.move_to_end(k)
        else:
            ref[k] = None
    return [ref.popitem(last=False)[0] for _ in range(max(0, len(ref) - cap))]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 30), max_size=12), max_size=15), st.integers(0, 12))
def test_lru_insert_many_equals_one_insert_per_key(batches, cap):
    """LRUStore.insert_many (C-level batch path) leaves the same order and evicts the same pages
    as inserting each key in turn, with repeated and already-held keys."""
    from collections import OrderedDict

    s = LRUStore(cap)
    ref: OrderedDict[int, None] = OrderedDict()
    for keys in batches:
        got = s.insert_many(keys)
        want = list(keys) if cap <= 0 else _lru_reference_insert(ref, keys, cap)
        assert got == want
        assert s.lru_order().tolist() == list(ref)
        assert s.missing(list(range(31))) == [k for k in range(31) if k not in ref]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(-(1 << 62), 1 << 62) | st.integers(0, 700),
                                                  max_size=400)), max_size=12),
       st.integers(1, 900))
def test_lru_store_matches_an_ordered_dict_while_growing(ops, cap):
    """The compiled LRU store (table and ring grow past their first 256 pages; evictions
    delete from the table with backward shifts) against an OrderedDict: inserts (held keys
    refreshed) and touches of held keys give the same evictions, order and membership."""
    from collections import OrderedDict

    s = LRUStore(cap)
    ref: OrderedDict[int, None] = OrderedDict()
    seen: list[int] = []
    peak = 0
    for is_touch, keys in ops:
        if is_touch:
            held = [k for k in keys if k in ref] or list(ref)[:3]
            s.touch_many(held)
            for k in held:
                ref.move_to_end(k)
        else:
            assert s.insert_many(keys) == _lru_reference_insert(ref, keys, cap)
            seen.extend(keys)
            peak = max(peak, len(ref))
        assert s.lru_order().tolist() == list(ref)
        assert len(s) == len(ref)
        assert s.peak == peak  # (the most held after an insert, across table rebuilds)
        probe = seen[-500:] + [5, 1 << 40]
        assert s.missing(probe) == [k for k in probe if k not in ref]
    with pytest.raises(KeyError):
        s.touch_many([k for k in range(-5, 0) if k not in ref][:1] or [-(1 << 63) + 1])


def test_lru_store_long_random_run_matches_an_ordered_dict():
    """20,000 batched inserts and touches on a store at its capacity (every insert evicts, so the
    table deletes and shifts entries back all the time, and the ring fills with blanked entries
    and is rewritten dozens of times) against an OrderedDict."""
    from collections import OrderedDict

    rng = np.random.default_rng(7)
    cap = 300
    s = LRUStore(cap)
    ref: OrderedDict[int, None] = OrderedDict()
    universe = rng.integers(-(1 << 62), 1 << 62, size=1500)
    for it in range(2000):
        keys = universe[rng.integers(0, len(universe), size=int(rng.integers(1, 20)))].tolist()
        if it % 5 == 4:
            held = [k for k in keys if k in ref]
            s.touch_many(held)
            for k in held:
                ref.move_to_end(k)
            continue
        assert s.insert_many(keys) == _lru_reference_insert(ref, keys, cap)
        if it % 50 == 0:
            assert s.lru_order().tolist() == list(ref)
            assert s.contains_many(universe).tolist() == [k in ref for k in universe.tolist()]
    assert s.lru_order().tolist() == list(ref)


def _ff_on_off(tmp_path, stretch: str, overrides: list):
    """Run ``overrides`` on the bundled slice with fast-forward on, then off (into
    ``tmp_path/true`` and ``tmp_path/false``). Returns (the counters of the engine's stretch
    ``stretch`` in the fast run: summary.json ``wall.stretches``, the sha256 of the requests,
    steps and transfers tables per setting)."""
    import hashlib

    digests = {}
    for ff in ("true", "false"):
        out = tmp_path / ff
        summary = run_simulation(compose_config([*SINGLE_ENGINE, *overrides, "sim.progress=false",
                                                 f"sim.fast_forward={ff}"]), out)
        if ff == "true":
            counts = summary["wall"]["stretches"][stretch]
        digests[ff] = {t: hashlib.sha256((out / t).read_bytes()).hexdigest()
                       for t in ("requests.parquet", "steps.parquet", "transfers.parquet")}
    return counts, digests


@pytest.mark.parametrize("extra", [
    ["tiers=gpu_host_disk", "codec=nvfp4", "tiers.host_gib=2", "tiers.disk_gib=8"],
    ["tiers=gpu_host", "tiers.write_policy=write_through_selective", "tiers.host_gib=4"],
], ids=["write_back-host-disk", "write_through_selective"])
def test_fast_forward_byte_identical_with_tiers_on_real_trace(tmp_path, extra):
    """The bundled Mooncake slice on a small pool with a long waiting queue: the fast-forward
    gives byte-identical tables to the per-step loop. (It did not when offloads landing or GPU
    evictions inside a stretch changed what the waiting head could be admitted with, or when a
    stretch's last offloads were issued after the next scheduling.) The tier stretches run
    through landings with the head waiting: most decode steps are taken by them."""
    counts, digests = _ff_on_off(tmp_path, "tiers", [
        "trace.max_requests=1200", "cache.num_gpu_blocks=4000", *extra])
    steps = len(pd.read_parquet(tmp_path / "true" / "steps.parquet"))
    assert counts["longest"] >= 20 and counts["steps"] > steps / 2, (counts, steps)
    # their steps and landings ran ahead of the SimPy clock: fewer clock waits than steps
    assert counts["clock_waits"] < counts["steps"] / 2, counts
    assert digests["true"] == digests["false"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 3)), max_size=40))
def test_agenda_runs_events_by_time_then_creation(ops):
    """The tier stretch's agenda (sim.stretches.tiers.Agenda) gives its events back in the
    order SimPy runs timeouts: by time, and at equal times in the order they were pushed,
    pops interleaved with pushes."""
    from sim.stretches.tiers import Agenda

    a, ref, out, want = Agenda(), [], [], []
    for i, (t, pops) in enumerate(ops):
        a.push(float(t), None, i)
        ref.append((float(t), i))
        for _ in range(min(pops, len(ref))):
            out.append(a.pop())
            m = min(ref)
            ref.remove(m)
            want.append((m[0], None, m[1]))
    while ref:
        out.append(a.pop())
        m = min(ref)
        ref.remove(m)
        want.append((m[0], None, m[1]))
    assert out == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.lists(st.integers(-40, 40), max_size=30)), max_size=40))
def test_key_set_matches_a_python_set(ops):
    """KeySet (the pages in flight to the host): adds and discards of int64 arrays, with
    repeated and absent keys and growth past its first table, match a Python set; an add marks
    the first occurrence of each key not held before."""
    from sim.tiers import KeySet

    s, ref = KeySet(), set()
    for add, keys in ops:
        q = np.asarray([k * 1000 + 7 for k in keys] * (30 if add else 1), dtype=np.int64)
        if add:
            new = s.add_many(q)
            want, seen = [], set(ref)
            for k in q.tolist():
                want.append(k not in seen)
                seen.add(k)
            assert new.tolist() == want  # first occurrences of keys not held
            ref.update(q.tolist())
        else:
            s.discard_many(q)
            ref.difference_update(q.tolist())
        assert len(s) == len(ref)
        probe = np.arange(-40_000, 41_000, 1000, dtype=np.int64) + 7
        assert s.contains_many(probe).tolist() == [k in ref for k in probe.tolist()]


def _walk_reference(gpu: dict, levels: list, query: list, stop: bool):
    """The hit walk spelled out: each key's GPU block (or -1) and the code of the fastest place
    holding it (0 GPU, k level k, -1 none); with ``stop`` it ends at the first held nowhere."""
    blk, code = [], []
    for k in query:
        b = gpu.get(k, -1)
        c = 0 if b >= 0 else next((i for i, lv in enumerate(levels, 1) if k in lv), -1)
        if c < 0 and stop:
            break
        blk.append(b)
        code.append(c)
    return blk, code


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=24),
       st.lists(st.lists(st.integers(0, 40), max_size=30), min_size=3, max_size=3),
       st.integers(0, 12), st.lists(st.integers(0, 45), max_size=40), st.booleans(),
       st.sampled_from([0, 8]), st.sampled_from([1, 2, 3]), st.booleans())
def test_tier_locate_compiled_equals_numpy_lookups_and_the_walk_spelled_out(
        cached, held, evict, query, stop, deep_cap, n_levels, as_levels):
    """TierManager.locate over a chain of 1-3 levels (the default host/disk chain, or the same
    figures listed in tiers.levels): the one-pass compiled walk (table index, LRU stores) and
    the numpy lookups (dict index) both give each key's GPU block and the fastest level
    holding it, as the walk spelled out does; stale GPU entries and levels off included."""
    import types

    import simpy

    from sim.block_pool import BlockPool
    from sim.config import CodecConfig, LevelConfig, TiersConfig
    from sim.tiers import TierManager

    gpu = types.SimpleNamespace(pcie_bandwidth_gbps=50.0, pcie_overhead_s=1e-5)
    scale = 1 << 40  # spread keys over the int64 range, colliding in the low bits
    page = 1 << 20
    caps = [6, deep_cap, 8][:n_levels]  # (pages; deep_cap 0: the levels below level 1 off)
    if as_levels or n_levels == 3:
        tiers = TiersConfig(levels=[LevelConfig(name=f"l{i}", gib=c / 1024, read_gbps=7.0,
                                                write_gbps=5.0, latency_s=1e-4)
                                    for i, c in enumerate(caps)])
    else:
        tiers = TiersConfig(host_gib=caps[0] / 1024, disk_gib=caps[1] / 1024 if n_levels > 1 else 0)
    # (the levels the chain runs: down to the last with pages; a level of 0 above it stages)
    on = caps[:max(i for i, c in enumerate(caps) if c or i == 0) + 1]
    out = []
    for index in ("table", "dict"):
        tm = TierManager(simpy.Environment(), tiers, CodecConfig(), page, page, gpu, 1e12)
        assert [st_.capacity for st_ in tm.stores] == on
        pool = BlockPool(16, index=index)
        keys = np.array(sorted(set(cached))[:16], dtype=np.int64) * scale + 3
        b = pool.allocate(len(keys))
        pool.cache_blocks(b, keys)
        pool.free(b[::-1])
        pool.allocate(min(evict, pool.num_free))  # reallocates cached blocks: stale entries
        for st_, h in zip(tm.stores, held):
            st_.insert_array(np.array(h, dtype=np.int64) * scale + 3)
        q = np.array(query, dtype=np.int64) * scale + 3
        blk, code = tm.locate(pool, q, stop=stop)
        out.append((blk.tolist(), code.tolist()))
        gpu_map = {int(k): int(pool.cached_blocks(np.array([k], dtype=np.int64))[0]) for k in q}
        gpu_map = {k: v for k, v in gpu_map.items() if v >= 0}
        sets = [set(q[st_.contains_many(q)].tolist()) for st_ in tm.stores]
        assert out[-1] == tuple(_walk_reference(gpu_map, sets, q.tolist(), stop))
    assert out[0] == out[1]


def test_bench_pagestore_runs_small_and_rejects_bad_sizes(capsys):
    """The page-store micro-benchmark (BENCHMARKS.md) runs on a small store and prints its
    per-page times; a zero size is a usage error, not a division by zero."""
    from experiments import bench_pagestore

    assert bench_pagestore.main(["--pages", "500", "--inserts", "2000", "--batch", "7", "--repeats", "2"]) == 0
    out = capsys.readouterr().out
    assert "ns/page; median" in out and len(out.split("ns/page")[0].split()) == 2
    with pytest.raises(SystemExit) as e:
        bench_pagestore.main(["--inserts", "0"])
    assert e.value.code == 2


@pytest.mark.parametrize("extra", [
    ["tiers=gpu_host"],
    ["tiers=gpu_host_disk", "tiers.write_policy=write_through", "codec=nvfp4", "tiers.host_gib=2",
     "tiers.disk_gib=8"],
], ids=["host", "host-disk-write-through"])
def test_onboarded_pages_are_all_counted_as_hits(tmp_path, extra):
    """Every page copied to the GPU is a hit of some admission: the requests' first admissions
    (their hit_tokens_host / _disk columns) plus the re-admissions of preempted requests
    (``preempted_lookups``, vLLM's PrefixCacheStats counts those apart), so the bytes onboarded
    from each tier equal those hit tokens' pages. With a small pool the bundled slice preempts
    often and most host loads are re-admissions: before these were counted, the host tier
    showed 0% hits with gigabytes onboarded. The run's duration ends with its last request,
    not with the last offload landing after it."""
    import json

    out = tmp_path / "run"
    run_simulation(compose_config([*SINGLE_ENGINE, "trace.max_requests=300", "cache.num_gpu_blocks=4000",
                                   "sim.progress=false", *extra]), out)
    s = json.loads((out / "summary.json").read_text())
    r = pd.read_parquet(out / "requests.parquet")
    pl = s["preempted_lookups"]
    assert pl["requests"] > 0 and pl["hit_tokens"]["host"] > 0
    assert pl["requests"] <= int(r["preemptions"].sum())  # (one lookup per re-admission)
    B = 16
    for t in ("host", "disk"):
        tokens = int(r[f"hit_tokens_{t}"].sum()) + pl["hit_tokens"][t]
        assert s["bytes_onboarded"][t] == tokens // B * s["page_bytes"], t
    assert s["sim_duration_s"] == float(r["finish_s"].max())
    assert s["tier_copies_end_s"] >= s["sim_duration_s"]


def test_write_back_holds_the_step_until_evicted_pages_are_copied(tmp_path):
    """write_back (SGLang HiCache's): a cached GPU block is reused only after its page reached
    the host, so a slow D2H link holds the steps that evict (their rows include the wait) and
    slows the run, where write-through copies (of blocks that stay on the GPU) never hold a
    step. A fast link holds the same steps for milliseconds."""
    import json

    def summary(*o):
        out = tmp_path / "_".join(o).replace("=", "-")
        run_simulation(compose_config([*SINGLE_ENGINE,
                                       "trace.max_requests=200", "sim.progress=false", *o]), out)
        return json.loads((out / "summary.json").read_text()), pd.read_parquet(out / "steps.parquet")

    base, _ = summary("tiers=gpu_only")
    slow, steps = summary("tiers=gpu_host", "tiers.pcie_gbps=0.05")
    fast, _ = summary("tiers=gpu_host")
    wt, _ = summary("tiers=gpu_host", "tiers.pcie_gbps=0.05", "tiers.write_policy=write_through")
    assert base["write_back_stalls"] == 0 and wt["write_back_stalls"] == 0
    assert slow["write_back_stalls"] > 0 and slow["write_back_stall_s"] > 100
    assert 0 < fast["write_back_stall_s"] < slow["write_back_stall_s"] / 100
    assert slow["ttft_s"]["p50"] > 2 * base["ttft_s"]["p50"]
    # the held steps' rows span the wait: the steps tile the clock
    ends = steps["time_s"] + steps["duration_s"]
    assert steps["duration_s"].max() > 1.0
    assert np.all(ends.to_numpy()[:-1] <= steps["time_s"].to_numpy()[1:] + 1e-9)


def test_fast_forward_byte_identical_with_write_back_and_compression(tmp_path):
    """Compression with tiers fast-forwards through :class:`sim.stretches.decode.DecodeStretch`; with
    write_back a step that evicts a cached block is held for its copy, so the stretch ends
    before it, with or without requests waiting (it did not: the held step's wait was missing
    and the tables differed from the per-step loop's late in the run)."""
    counts, digests = _ff_on_off(tmp_path, "decode", [
        "trace.max_requests=600", "cache.num_gpu_blocks=3000", "tiers=gpu_host_disk",
        "policy=triattention", "compaction=forward_pack"])
    assert counts["steps"] > 1000, counts
    assert digests["true"] == digests["false"]


@pytest.mark.parametrize("onboard", ["blocking", "layerwise"])
def test_ttft_split_terms_are_never_negative_with_reloads_after_the_first_token(tmp_path, onboard):
    """A request preempted after its first token reloads its pages from the host when
    re-admitted; onboard_s (and its host/disk split) counts the onboarding before the first
    token only, so every term of ttft = queue + onboard + prefill is >= 0."""
    out = tmp_path / "run"
    run_simulation(compose_config([*SINGLE_ENGINE,
                                   "trace=synthetic_reasoning", "trace.num_sessions=20", "tiers=gpu_host",
                                   "tiers.host_gib=2", "cache.num_gpu_blocks=1500", f"tiers.onboard={onboard}",
                                   "sim.progress=false"]), out)
    r = pd.read_parquet(out / "requests.parquet")
    assert int(r["preemptions"].sum()) > 0
    for c in ("queue_s", "onboard_s", "onboard_host_s", "onboard_disk_s", "prefill_s"):
        assert (r[c] >= 0).all(), (c, r[c].min())
    assert np.allclose(r["queue_s"] + r["onboard_s"] + r["prefill_s"], r["ttft_s"])


def test_check_invariants_counts_the_blocks_of_blocking_onboards(tmp_path):
    """sim.check_invariants=true holds with host/disk tiers: a request waiting for a blocking
    onboard holds its blocks outside the running list, and the check counts them."""
    c = compose_config([*SINGLE_ENGINE,
                        "trace.max_requests=150", "sim.check_invariants=true", "tiers=gpu_host_disk",
                        "sim.progress=false", "output.write_steps=false"])
    s = run_simulation(c, tmp_path)
    assert s["bytes_onboarded"]["host"] > 0 and s["requests_finished"] == 150


def test_tier_specs_read_the_tiers_config_and_build_the_managers_stores_and_links():
    """tier_specs reads the host and disk levels (capacity in encoded pages, replacement,
    fill and serve links, PCIe from the GPU card where the config leaves it null) from the
    tiers config; the tier manager's stores and links are those the specs build."""
    import simpy

    from sim.tiers import DISK, HOST, LinkSpec, TierManager, tier_specs

    cfg = compose_config([*SINGLE_ENGINE, "tiers=gpu_host_disk", "codec=nvfp4", "tiers.disk_gib=2",
                          "tiers.replacement=arc"])
    cold = cold_page_bytes(cfg.model, cfg.cache, cfg.codec)
    host, disk = tier_specs(cfg.tiers, cold, cfg.gpu)
    pcie = float(cfg.gpu.pcie_bandwidth_gbps) * 1e9
    assert (host.name, host.code, host.capacity_pages, host.replacement) == \
        ("host", HOST, int(cfg.tiers.host_gib * 2**30) // cold, "arc")
    assert host.fill == LinkSpec("d2h", pcie, float(cfg.gpu.pcie_overhead_s))
    assert host.serve == LinkSpec("h2d", pcie, float(cfg.gpu.pcie_overhead_s))
    assert (disk.name, disk.code, disk.capacity_pages) == ("disk", DISK, 2 * 2**30 // cold)
    assert disk.fill == LinkSpec("host_to_disk", 5e9, 80e-6)
    assert disk.serve == LinkSpec("disk_to_host", 7e9, 80e-6)
    tm = TierManager(simpy.Environment(), cfg.tiers, cfg.codec, 1 << 20, cold, cfg.gpu, 1e12)
    assert tm.specs == (host, disk) and tm.names == ("host", "disk")
    assert isinstance(tm.host, ARCStore) and tm.host.capacity == host.capacity_pages
    assert tm.disk.capacity == disk.capacity_pages
    for link, spec in ((tm.d2h, host.fill), (tm.h2d, host.serve), (tm.fill[1], disk.fill),
                       (tm.serve[1], disk.serve)):
        assert (link.name, link.bw, link.overhead) == (spec.name, spec.bandwidth_Bps, spec.overhead_s)
    with pytest.raises(ConfigError, match="link disk_to_host: bandwidth -1.0 B/s; expected > 0"):
        LinkSpec("disk_to_host", -1.0, 0.0).build()


THREE_LEVELS = ["tiers=gpu_host_cxl_disk"]


def test_tier_specs_read_a_chain_of_levels_from_tiers_levels():
    """tiers.levels lists the whole chain: one level per entry, codes 1 .. N, links named by the
    levels they join, the first level's null figures PCIe's; the levels' columns name the
    summary's keys. A chain beside host_gib / disk_gib, a repeated or reserved name, or a deep
    level without its link figures is an error naming the field."""
    from sim.tiers import LinkSpec, tier_specs

    cfg = compose_config([*SINGLE_ENGINE, *THREE_LEVELS])
    pcie = float(cfg.gpu.pcie_bandwidth_gbps) * 1e9
    host, cxl, disk = tier_specs(cfg.tiers, 1 << 20, cfg.gpu)
    assert [(sp.name, sp.code) for sp in (host, cxl, disk)] == [("host", 1), ("cxl", 2), ("disk", 3)]
    assert host.fill == LinkSpec("d2h", pcie, float(cfg.gpu.pcie_overhead_s))
    assert cxl.fill.name == "host_to_cxl" and cxl.serve.name == "cxl_to_host"
    assert disk.fill.name == "cxl_to_disk" and disk.serve.name == "disk_to_cxl"
    assert cxl.capacity_pages == int(cfg.tiers.levels[1].gib * 2**30) // (1 << 20)
    for bad, msg in ((["tiers.host_gib=1"], r"tiers\.levels lists 3 levels with tiers\.host_gib=1"),
                     (["tiers.levels.1.name=host"], r"tiers\.levels\[1\]\.name='host'"),
                     (["tiers.levels.2.name=remote"], r"tiers\.levels\[2\]\.name='remote'"),
                     (["tiers.levels.1.read_gbps=null"], r"tiers\.levels\[1\]\.read_gbps=None; expected > 0"),
                     (["tiers.levels.2.gib=-1"], r"tiers\.levels\[2\]\.gib=-1\.0")):
        with pytest.raises(ConfigError, match=msg):
            from sim.validation import validate_config

            c = compose_config([*SINGLE_ENGINE, *THREE_LEVELS, *bad])
            validate_config(c)
            tier_specs(c.tiers, 1 << 20, c.gpu)


@pytest.mark.parametrize("name, why", [
    ("''", "empty"), ("' '", "blank"), ("'a b'", "not of that form"), ("Host", "not of that form"),
    ("a_b", "not of that form"), ("5", "not of that form"), ("abcdefghijklmnopq", "not of that form"),
    ("gpu", "a name kvsim reserves"), ("GPU", "a name kvsim reserves"),
    ("remote", "a name kvsim reserves"), ("total", "a name kvsim reserves"),
    ("host", r"another level's name \(tiers\.levels\[0\]\)")])
def test_a_level_name_out_of_the_rule_is_refused_naming_its_field(name, why):
    """A ``tiers.levels`` name names the level's columns and links, so it is a lowercase letter
    then lowercase letters and digits (at most 16), not reserved ('gpu', 'remote', 'total', in
    any case) and not another level's: anything else is a ConfigError naming
    ``tiers.levels[i].name``, why, and what is allowed, from validate_config and tier_specs."""
    from sim.tiers import tier_specs
    from sim.validation import validate_config

    c = compose_config([*SINGLE_ENGINE, *THREE_LEVELS, f"tiers.levels.1.name={name}"])
    for check in (validate_config, lambda c: tier_specs(c.tiers, 1 << 20, c.gpu)):
        with pytest.raises(ConfigError, match=rf"^tiers\.levels\[1\]\.name='.*': {why}; expected a "
                                              rf"name of its own: a lowercase letter"):
            check(c)


def test_zero_capacity_levels_get_a_note_saying_what_happens():
    """A level of 0 GiB above a level with capacity keeps no page but stages those passing
    through; one with no capacity below it is off; all at 0 GiB keep nothing below the GPU."""
    from sim.cli.report import zero_level_notes
    from sim.config import LevelConfig

    def chain(*gib):
        return [LevelConfig(name=n, gib=g) for n, g in zip(("host", "cxl", "disk"), gib)]

    assert zero_level_notes(chain(64, 256, 1024)) == []
    assert zero_level_notes(chain(64, 0, 1024)) == [
        "tiers.levels[1] (cxl) has 0 GiB: it keeps no page, but the pages moving between the "
        "levels above and below it pass through it (their copies timed on its links)"]
    assert zero_level_notes(chain(64, 256, 0)) == [
        "tiers.levels[2] (disk) has 0 GiB and no level below it has capacity: it is off, no page "
        "is copied to it"]
    assert zero_level_notes(chain(0, 0, 0)) == [
        "every level of tiers.levels has 0 GiB: no page is kept below the GPU (the run is "
        "gpu_only)"]


def test_three_level_chain_demotes_and_onboards_through_every_level_with_exact_bytes_and_times():
    """A chain host (2 pages) -> cxl (2 pages) -> disk (8 pages): six pages offloaded one at a
    time land in the host; its evictions are demoted to cxl, whose evictions are demoted to
    disk; an onboarding of one page per level reads the disk page into cxl, the cxl pages
    (its own and the staged one) into the host (their evictions demoted again), then all three
    to the GPU; every batch's
    duration is overhead + bytes / bandwidth on its link, and the bytes per level count the
    pages each level served."""
    import types

    import simpy

    from sim.config import CodecConfig, LevelConfig, TiersConfig
    from sim.tiers import TierManager

    page = 1 << 20
    gpu = types.SimpleNamespace(pcie_bandwidth_gbps=50.0, pcie_overhead_s=1e-5)
    tiers = TiersConfig(transfer_batch_pages=4, levels=[
        LevelConfig(name="host", gib=2 / 1024),
        LevelConfig(name="cxl", gib=2 / 1024, read_gbps=30.0, write_gbps=20.0, latency_s=2e-6),
        LevelConfig(name="disk", gib=8 / 1024, read_gbps=7.0, write_gbps=5.0, latency_s=8e-5)])
    env = simpy.Environment()
    tm = TierManager(env, tiers, CodecConfig(), page, page, gpu, 1e12)
    keys = np.arange(1, 7, dtype=np.int64) * 1_000_003
    for k in keys:  # (one offload after the other lands)
        tm.write_back(np.array([k]))
        env.run()
    assert sorted(tm.stores[0].not_held(keys).tolist()) == sorted(keys[:4].tolist())  # host: 5, 6
    assert tm.where(int(keys[5])) == 1 and tm.where(int(keys[3])) == 2
    assert tm.where(int(keys[0])) == 3 and tm.where(int(keys[1])) == 3
    assert tm.bytes_offloaded == {"host": 6 * page, "cxl": 4 * page, "disk": 2 * page}
    tr = tm.records.frame()
    d2h, demote_cxl, demote_disk = (tr[tr["direction"] == d] for d in
                                    ("d2h", "host_to_cxl", "cxl_to_disk"))
    assert len(d2h) == 6 and len(demote_cxl) == 4 and len(demote_disk) == 2
    assert set(demote_cxl["tier"]) == {"cxl"} and set(demote_disk["tier"]) == {"disk"}
    assert demote_cxl["duration_s"].tolist() == [2e-6 + page / 20e9] * 4
    assert demote_disk["duration_s"].tolist() == [8e-5 + page / 5e9] * 2
    out = {}
    t0 = env.now
    proc = env.process(tm.onboard([keys[[5]], keys[[3]], keys[[0]]], out))
    env.run(until=proc)
    end = env.now
    env.run()  # (the demotions the promotions' evictions caused)
    tr = tm.records.frame()
    reads = tr[(tr["time_s"] >= t0) & tr["direction"].isin(["disk_to_cxl", "cxl_to_host", "h2d"])]
    assert reads["direction"].tolist() == ["disk_to_cxl", "cxl_to_host", "h2d"]
    assert reads["pages"].tolist() == [1, 2, 3]
    disk_read, cxl_read, h2d = 8e-5 + page / 7e9, 2e-6 + 2 * page / 30e9, 1e-5 + 3 * page / 50e9
    assert reads["duration_s"].tolist() == [disk_read, cxl_read, h2d]
    assert (out["onboard_disk_s"], out["onboard_cxl_s"], out["onboard_host_s"]) == \
        pytest.approx((disk_read, cxl_read, h2d), rel=1e-12)
    assert end == pytest.approx(t0 + disk_read + cxl_read + h2d, rel=1e-12)
    assert tm.bytes_onboarded == {"host": page, "cxl": page, "disk": page}
    assert tm.where(int(keys[0])) == 1 and tm.where(int(keys[3])) == 1  # (promoted on the way)
    assert tm.estimate_load_s([1, 1, 1]) == disk_read + cxl_read + h2d


def test_three_level_preset_runs_end_to_end_with_columns_per_level(tmp_path):
    """tiers=gpu_host_cxl_disk on 60 requests revisiting 12 documents, with room for a few of
    them on the GPU and in each level: hits come from every level, the requests table and the
    summary carry one column / key per level name, and the per-step loop and the fast paths
    give the same tables."""
    import json

    rng = np.random.default_rng(5)
    rows = [doc(int(rng.integers(0, 12)), int(rng.integers(4, 12)) * 16,
                t=float(rng.uniform(0, 40)), out=int(rng.integers(20, 120))) for _ in range(60)]
    rows.sort(key=lambda r: r["arrival_s"])
    page = 147_456 * 16
    common = [*THREE_LEVELS, "cache.num_gpu_blocks=40", f"tiers.levels.0.gib={8 * page / 2**30}",
              f"tiers.levels.1.gib={16 * page / 2**30}", f"tiers.levels.2.gib={200 * page / 2**30}",
              "tiers.transfer_batch_pages=4"]
    sa, ra, ta = run_frames(tmp_path / "ff", rows, *common, "sim.fast_forward=true")
    sb, rb, tb = run_frames(tmp_path / "step", rows, *common, "sim.fast_forward=false")
    pd.testing.assert_frame_equal(ra, rb)
    pd.testing.assert_frame_equal(ta, tb)
    levels = ("host", "cxl", "disk")
    assert (ra["hit_tokens_gpu"] + sum(ra[f"hit_tokens_{n}"] for n in levels)
            == ra["prefix_hit_tokens"]).all()
    assert all(ra[f"hit_tokens_{n}"].sum() > 0 for n in levels), ra[[f"hit_tokens_{n}" for n in levels]].sum()
    assert (ra[[f"onboard_{n}_s" for n in levels]] >= 0).all().all()
    assert sa["tiers"] == "gpu_host_cxl_disk"
    assert set(sa["hit_ratio"]) == {"gpu", *levels, "total"}
    assert all(sa["bytes_offloaded"][n] > 0 and sa[f"peak_{n}_pages"] > 0 for n in levels)
    assert set(ta["direction"]) >= {"d2h", "h2d", "host_to_cxl", "cxl_to_disk", "disk_to_cxl"}
    assert json.loads((tmp_path / "ff" / "summary.json").read_text())["tiers"] == "gpu_host_cxl_disk"
