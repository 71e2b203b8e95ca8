"""Block pool semantics (vLLM v1): LRU free queue, deepest-first eviction, prefix hits."""

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from sim.block_pool import BlockPool
from sim.hash_tables import NO_HASH, KeyTable
from sim.keys import block_keys


def test_finished_request_evicts_deepest_block_first():
    pool = BlockPool(3)
    blocks = pool.allocate(3)
    keys = np.array([101, 102, 103])  # A, B, C
    pool.cache_blocks(blocks, keys)
    pool.free(blocks[::-1])  # finished request: last block first
    assert pool.num_free == 3 and pool.num_cached_free == 3
    new = pool.allocate(1)
    assert new[0] == blocks[2]  # C, the deepest, is evicted
    hit = pool.lookup_prefix(keys, 3)
    assert hit.tolist() == blocks[:2].tolist()  # [A, B, C] now hits 2 blocks
    assert pool.block_hash[blocks[2]] == NO_HASH


def test_first_miss_ends_the_hit():
    pool = BlockPool(8)
    b = pool.allocate(4)
    pool.cache_blocks(b, np.array([1, 2, 3, 4]))
    assert len(pool.lookup_prefix(np.array([1, 2, 9, 4]), 4)) == 2
    assert len(pool.lookup_prefix(np.array([9, 2, 3, 4]), 4)) == 0
    assert len(pool.lookup_prefix(np.array([1, 2, 3, 4]), 3)) == 3


def test_touch_removes_from_free_queue_and_counts_refs():
    pool = BlockPool(4)
    b = pool.allocate(2)
    pool.cache_blocks(b, np.array([7, 8]))
    pool.free(b[::-1])
    assert pool.num_free == 4
    hit = pool.lookup_prefix(np.array([7, 8]), 2)
    assert pool.blocks_needed_for_touch(hit) == 2
    pool.touch(hit)
    assert pool.num_free == 2 and pool.num_cached_free == 0
    pool.touch(hit)  # a second request shares them
    assert pool.ref_cnt[hit].tolist() == [2, 2]
    pool.free(hit[::-1])
    assert pool.num_free == 2
    pool.free(hit[::-1])
    assert pool.num_free == 4
    with pytest.raises(RuntimeError, match="double free"):
        pool.free(hit)
    pool.check()
    # a block listed twice with one reference: refused, and the pool is left as it was
    c = pool.allocate(2)
    before = (pool.ref_cnt.copy(), pool.num_free, pool.free_queue_order().tolist())
    with pytest.raises(RuntimeError, match=f"double free of block {c[0]}"):
        pool.free(np.array([c[1], c[0], c[0]]))
    assert pool.ref_cnt.tolist() == before[0].tolist() and pool.num_free == before[1]
    assert pool.free_queue_order().tolist() == before[2]
    pool.check(held_blocks=c)


def test_lru_order_across_requests():
    pool = BlockPool(6)
    a = pool.allocate(2)
    b = pool.allocate(2)
    pool.cache_blocks(np.concatenate([a, b]), np.array([1, 2, 3, 4]))
    pool.free(a[::-1])
    pool.free(b[::-1])
    # cached blocks join the tail: what was never used (4, 5), then a reversed, then b reversed
    assert pool.free_queue_order().tolist() == [4, 5, a[1], a[0], b[1], b[0]]


def test_free_puts_unhashed_blocks_at_the_head_in_the_given_order():
    """vLLM BlockPool.free_blocks: a freed block without a hash (a request's partial last
    block, every block with caching off) is prepended, so it is reused first; hashed ones are
    appended. One request's table [full, full, partial] freed last block first."""
    pool = BlockPool(6)
    t = pool.allocate(3)
    pool.cache_blocks(t[:2], np.array([11, 12]))
    pool.free(t[::-1])
    assert pool.free_queue_order().tolist() == [t[2], 3, 4, 5, t[1], t[0]]
    assert pool.num_cached_free == 2
    assert pool.allocate(1).tolist() == [t[2]]  # the partial block, not a fresh one
    assert pool.num_cached_free == 2 and pool.evicted_cached_blocks == 0
    # several unhashed blocks keep the given order at the head
    u = pool.allocate(3)  # 3, 4, 5
    pool.free(u[::-1])
    assert pool.free_queue_order().tolist()[:3] == [u[2], u[1], u[0]]
    pool.check()


def test_free_without_caching_prepends_every_block():
    pool = BlockPool(4, enable_caching=False)
    t = pool.allocate(2)
    pool.cache_blocks(t, np.array([1, 2]))  # (ignored without caching)
    pool.free(t[::-1])
    assert pool.free_queue_order().tolist() == [t[1], t[0], 2, 3]


@pytest.mark.parametrize("index", ["table", "dict"])
def test_duplicate_registration_is_queued_as_a_hashed_block(index):
    """Two requests compute the same block: the first keeps the key and serves hits; the
    second is marked a duplicate, freed to the tail like a hashed block (vLLM keeps it under
    the same hash) and unmarked when reallocated."""
    pool = BlockPool(4, index=index)
    a = pool.allocate(1)
    b = pool.allocate(1)
    pool.cache_blocks(a, np.array([42]))
    pool.cache_blocks(b, np.array([42]))
    assert pool.lookup_prefix(np.array([42]), 1).tolist() == a.tolist()
    assert pool.dup[b].tolist() == [True] and pool.block_hash[b[0]] == NO_HASH
    pool.free(b)
    assert pool.free_queue_order().tolist() == [2, 3, b[0]]
    got = pool.allocate(3)
    assert got.tolist() == [2, 3, b[0]] and not pool.dup[b].any()
    pool.check(held_blocks=np.concatenate([a, got]))


def test_keys_mooncake_mapping():
    # G=512, B=16: block k inside trace block j gets (ids[j], index in j)
    ids = np.array([10, 11, 12])
    keys = block_keys(ids, 512, 1100, 16, request_id=5, n_blocks=72)
    assert keys[0] == 10 * 513 + 16
    assert keys[31] == 10 * 513 + 512
    assert keys[32] == 11 * 513 + 16
    # last partial trace block covers only input_length: 1100 tokens -> 68 full blocks identified
    assert (keys[:68] >= 0).all() and (keys[68:] < 0).all()
    # unidentified keys are unique per request
    other = block_keys(ids, 512, 1100, 16, request_id=6, n_blocks=72)
    assert (keys[:68] == other[:68]).all() and not np.intersect1d(keys[68:], other[68:]).size


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "free", "hit"]), st.integers(1, 6)), max_size=80))
def test_pool_never_double_frees_or_exceeds(ops):
    pool = BlockPool(16)
    held = []
    next_key = [0]
    for op, k in ops:
        if op == "alloc" and k <= pool.num_free:
            b = pool.allocate(k)
            keys = np.arange(next_key[0], next_key[0] + k)
            next_key[0] += k
            pool.cache_blocks(b, keys)
            held.append((b, keys))
        elif op == "free" and held:
            b, _ = held.pop(k % len(held))
            pool.free(b[::-1])
        elif op == "hit" and held:
            _, keys = held[k % len(held)]
            hit = pool.lookup_prefix(keys, len(keys))
            if pool.blocks_needed_for_touch(hit) <= pool.num_free:
                pool.touch(hit)
                held.append((hit, keys[:len(hit)]))
        allheld = np.concatenate([h for h, _ in held]) if held else np.empty(0, np.int64)
        pool.check(allheld)
        assert pool.num_free + pool.num_used == 16
        assert 0 <= pool.num_free <= 16


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(-50, 50), st.integers(0, 10**6)), max_size=40), max_size=25),
       st.sampled_from([1024, 2048]))
def test_key_table_matches_a_dict(batches, size):
    """KeyTable (vectorised and scalar open addressing) answers like a dict under batched puts
    and overwrites, including many keys colliding on one home slot (keys spaced by 2**40)."""
    t = KeyTable(size)
    stale = np.full(10**6 + 1, NO_HASH, dtype=np.int64)
    ref: dict[int, int] = {}
    for batch in batches:
        d = dict(batch)  # distinct keys per batch, last value wins
        if not d:
            continue
        # spread small ints over the int64 range with multiples of 2**40 (collide in the low bits)
        q = np.array([k * (1 << 40) + (k & 1) for k in d], dtype=np.int64)
        v = np.array(list(d.values()), dtype=np.int64)
        # every entry stale (its value's live hash is never the key): put_absent overwrites,
        # so the table must behave like dict.update
        t.put_absent(q, v, stale)
        ref.update(zip(q.tolist(), v.tolist()))
        probe = np.array(sorted(ref) + [7, -7 * (1 << 40) + 3], dtype=np.int64)
        want = [ref.get(k, -1) for k in probe.tolist()]
        assert t.get_many(probe).tolist() == want
        assert [t.get1(k) for k in probe.tolist()] == want
    assert t.count == len(ref)


def test_index_rebuild_keeps_live_entries_only():
    """Many registrations and evictions on a small pool: the table is rebuilt (stale entries
    dropped) and every cached block still resolves to itself."""
    pool = BlockPool(8)
    sizes = []
    for r in range(400):
        keys = block_keys(np.empty(0, np.int64), 0, 0, 16, r, 4)
        b = pool.allocate(4)
        pool.cache_blocks(b, keys)
        sizes.append(pool.index.count)
        assert pool.lookup_prefix(keys, 4).tolist() == b.tolist()
        pool.free(b[::-1])
        pool.check()
    assert max(sizes) <= pool.index.size // 4
    assert min(sizes[100:]) < max(sizes)  # rebuilt at least once



@pytest.mark.parametrize("backend", ["dict", "table"])
def test_put_absent_keeps_live_entries_and_replaces_stale(backend):
    """put_absent sets only keys not held live; a stale entry (its block now holds another
    hash) is replaced; a live one keeps its first block."""
    from sim.hash_tables import DictIndex
    t = {"dict": DictIndex, "table": KeyTable}[backend](1024)
    live = np.full(10, NO_HASH, dtype=np.int64)
    q = np.array([5, 7 << 40, 9], dtype=np.int64)
    new = t.put_absent(q, np.array([0, 1, 2]), live)
    assert new.tolist() == [True, True, True]
    live[[0, 1, 2]] = q
    live[1] = 123  # block 1 now holds another hash: key 7<<40's entry is stale
    new = t.put_absent(np.array([5, 7 << 40, 11], dtype=np.int64), np.array([3, 4, 5]), live)
    assert new.tolist() == [False, True, True]
    assert t.get_many(np.array([5, 7 << 40, 11, 9, 13], dtype=np.int64)).tolist() == [0, 4, 5, 2, -1]


@pytest.mark.parametrize("backend", ["dict", "table"])
def test_lookup_prefix_first_block_evicted_or_stale(backend):
    """lookup_prefix probes the first key alone: a stale first entry (its block evicted and
    reallocated) is a miss even when later keys are still cached; a live first key walks on."""
    pool = BlockPool(6, index=backend)
    keys = block_keys(np.empty(0, np.int64), 0, 0, 16, 1, 3)
    b = pool.allocate(3)
    pool.cache_blocks(b, keys)
    assert pool.lookup_prefix(keys, 3).tolist() == b.tolist()
    pool.free(b[::-1])  # freed deepest first: b[2], b[1], b[0] at the queue's tail
    pool.allocate(3)  # the never-used blocks go first; nothing evicted yet
    assert pool.lookup_prefix(keys, 3).tolist() == b.tolist()
    pool.allocate(1)  # evicts b[2] (deepest): the hit is cut after two blocks
    assert pool.lookup_prefix(keys, 3).tolist() == b[:2].tolist()
    pool.allocate(2)  # evicts b[1] and b[0]: the first key's entry is stale (dict) or gone
    # the dict index deletes lazily (the entry stays, judged by block_hash); the table deletes
    assert pool.index.get1(int(keys[0])) == (int(b[0]) if backend == "dict" else -1)
    assert pool.lookup_prefix(keys, 3).tolist() == []
    assert pool.lookup_prefix(keys[1:], 2).tolist() == []


@pytest.mark.parametrize("backend", ["dict", "table"])
@pytest.mark.parametrize("n", [3, 40])
def test_put_absent_batch_paths_agree_with_a_reference(backend, n):
    """Scalar (few keys) and batch paths of put_absent: absent keys are set, live entries kept,
    stale entries replaced, including a stale entry that already points at the new block."""
    from sim.hash_tables import DictIndex
    rng = np.random.default_rng(n)
    t = {"dict": DictIndex, "table": KeyTable}[backend](4096)
    live = np.full(200, NO_HASH, dtype=np.int64)
    ref: dict[int, int] = {}
    for _ in range(30):
        q = rng.choice(np.arange(1, 300, dtype=np.int64) << 33, size=n, replace=False)
        v = rng.integers(0, 200, size=n)
        want = []
        for key, val in zip(q.tolist(), v.tolist()):
            cur = ref.get(key)
            ok = cur is None or live[cur] != key
            if ok:
                ref[key] = val
            want.append(ok)
        assert t.put_absent(q, v, live).tolist() == want
        # some registrations become live, some blocks get other hashes (entries go stale)
        for key, val, w in zip(q.tolist(), v.tolist(), want):
            if w and rng.random() < 0.6:
                live[val] = key
        live[rng.integers(0, 200, size=10)] = NO_HASH
        probe = np.array(sorted(ref), dtype=np.int64)
        assert t.get_many(probe).tolist() == [ref[k] for k in probe.tolist()]


def test_kernel_compiles_without_the_cache_when_no_location_is_writable(monkeypatch):
    """A read-only install with no writable home: numba refuses ``cache=True`` ("cannot cache
    function ... no locator available"); the kernel is compiled without the cache instead of
    the import failing. Any other error still propagates."""
    import numba

    import sim.jit

    real = numba.njit
    calls = []

    def njit(cache=False, nogil=False, _msg="cannot cache function 'f': no locator available"):
        calls.append(cache)
        if cache:
            def refuse(fn):
                raise RuntimeError(_msg)
            return refuse
        return real(cache=False, nogil=nogil)

    monkeypatch.setattr(sim.jit.numba, "njit", njit)

    @sim.jit.kernel("i8(i8)")
    def plus_one(x):
        return x + 1

    assert plus_one(41) == 42 and calls == [True, False]
    monkeypatch.setattr(sim.jit.numba, "njit",
                        lambda cache=False, nogil=False: njit(cache, nogil, _msg="other"))
    with pytest.raises(RuntimeError, match="other"):
        sim.jit.kernel("i8(i8)")(lambda x: x)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 10**12), max_size=12), st.sampled_from([0, 16, 64, 100, 512]),
       st.integers(0, 7000), st.sampled_from([1, 8, 16, 48]), st.integers(0, 10**6),
       st.integers(0, 500))
def test_block_keys_follow_the_two_rules(ids, G, input_tokens, B, rid, n_blocks):
    """block_keys against the module docstring's rules applied block by block: a block ending
    inside the span the trace identifies gets ``ids[j] (G + 1) + offset``, any other one the
    request's own negative key."""
    covered = min(len(ids) * G, input_tokens) if G > 0 else 0
    want = []
    for k in range(n_blocks):
        e = (k + 1) * B
        if e <= covered:
            j = (e - 1) // G
            want.append(ids[j] * (G + 1) + e - j * G)
        else:
            want.append(-(rid * 2**24 + k) - 1)
    got = block_keys(np.array(ids, dtype=np.int64), G, input_tokens, B, rid, n_blocks)
    assert got.dtype == np.int64 and got.tolist() == want


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["reg", "free", "alloc", "uncache"]), st.integers(1, 5),
                          st.lists(st.integers(0, 25), min_size=1, max_size=5, unique=True)),
                max_size=40))
# a block registered again under another key in the batch that holds its old key: that key was
# held when the batch started, so it keeps no block (the dict judges liveness before the batch)
@example(ops=[("reg", 1, [0]), ("alloc", 2, [0]), ("reg", 1, [1]), ("reg", 1, [0, 1])])
def test_cache_blocks_table_and_dict_register_alike(ops):
    """The table index (PrefixTable: deleted on eviction, uncache and re-registration) against
    the lazily deleted dict index: the same block hashes, the same keys logged as newly
    registered and changed (a key held live keeps its first block; a stale entry, its block
    reallocated, uncached or registered again under another key, is replaced), the same prefix
    hits, and the pool's invariants (the table holds exactly one entry per cached block)."""
    pools = [BlockPool(12, index=i) for i in ("table", "dict")]
    for p in pools:
        p.cached_log, p.change_log = [], []
    held = [[], []]
    for op, k, keys in ops:
        for p, h in zip(pools, held):
            if op == "alloc" and k <= p.num_free:
                h.append(p.allocate(k))
            elif op == "free" and h:
                p.free(h.pop(k % len(h))[::-1])
            elif op == "reg" and h:
                b = h[k % len(h)]
                n = min(len(b), len(keys))
                p.cache_blocks(b[:n], np.array(keys[:n], dtype=np.int64) * (1 << 40) + 1)
            elif op == "uncache" and h:
                p.uncache(h[k % len(h)][:keys[0] % 3 + 1])
            p.check(np.concatenate(h) if h else None)
        a, d = pools
        assert np.array_equal(a.block_hash, d.block_hash)
        assert [x.tolist() for x in a.cached_log] == [x.tolist() for x in d.cached_log]
        assert [x.tolist() for x in a.change_log] == [x.tolist() for x in d.change_log]
        q = np.arange(26, dtype=np.int64) * (1 << 40) + 1
        assert a.cached_blocks(q).tolist() == d.cached_blocks(q).tolist()
        for first in range(0, 26, 5):
            assert a.lookup_prefix(q[first:], 6).tolist() == d.lookup_prefix(q[first:], 6).tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), max_size=12), min_size=1, max_size=8),
       st.lists(st.booleans(), min_size=8, max_size=8))
def test_first_repeated_id_is_the_first_row_with_a_repeat(rows, sort):
    """sim.keys.first_repeated_id: the first row repeating an id and that id (the first repeat
    in the row's order), or (-1, 0); rows sorted strictly increasing (the real traces', passed
    by the kernel without a hash set) mixed with unsorted ones and ones that repeat."""
    from sim.keys import first_repeated_id

    rows = [sorted(set(r)) if s else r for r, s in zip(rows, sort)]
    want = (-1, 0)
    for i, r in enumerate(rows):
        seen = set()
        hit = next((x for x in r if x in seen or seen.add(x)), None)
        if hit is not None:
            want = (i, hit)
            break
    off = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
    val = np.array([x for r in rows for x in r], dtype=np.int64)
    assert first_repeated_id(off, val) == want


@pytest.mark.parametrize("index", ["table", "dict"])
def test_bench_pool_runs_small_and_rejects_bad_sizes(capsys, index):
    """The block-pool micro-benchmark (BENCHMARKS.md) runs on a small pool with either prefix
    index and prints its per-block growth and free times; sizes it cannot run (a zero count, more
    held chunks than the pool holds) are usage errors naming the flags."""
    from experiments import bench_pool

    assert bench_pool.main(["--blocks", "300", "--chunk", "16", "--calls", "60", "--held", "5",
                            "--index", index, "--repeats", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["growth", "free"]
    for line in out:
        times = line.split(":")[1].split("ns/block")[0].split()
        assert len(times) == 2 and all(float(t) > 0 for t in times)
    for bad in (["--calls", "0"], ["--blocks", "100", "--chunk", "50", "--held", "2"]):
        with pytest.raises(SystemExit) as e:
            bench_pool.main(bad)
        assert e.value.code == 2
    assert "exceed the pool's 100 blocks" in capsys.readouterr().err


def test_block_keys_take_the_continuations_keys_past_the_own_span():
    """A request of 100 prompt + 50 output tokens (G = B = 16: 6 identified blocks) whose next
    turn's ids identify 180 tokens: blocks ending within 150 tokens take the next turn's keys
    (the same keys the next turn computes for them), the rest stay unique."""
    own = np.arange(1, 7)
    nxt = np.arange(1, 12)
    keys = block_keys(own, 16, 100, 16, 3, 10, next_ids=nxt, next_reach=150)
    child = block_keys(nxt, 16, 180, 16, 4, 12)
    assert keys[:9].tolist() == child[:9].tolist()  # 6 prompt blocks + 3 more up to token 144
    assert (keys[9:] < 0).all()  # block 9 ends at 160 > 150
    assert keys[:6].tolist() == block_keys(own, 16, 100, 16, 3, 6).tolist()
    # reach is capped by the continuation's identified span (its ids x G)
    short = block_keys(own, 16, 100, 16, 3, 10, next_ids=nxt[:7], next_reach=150)
    assert short[:7].tolist() == child[:7].tolist() and (short[7:] < 0).all()
    # no continuation: the same hit
    assert block_keys(own, 16, 100, 16, 3, 10, next_ids=nxt, next_reach=0).tolist() == \
        block_keys(own, 16, 100, 16, 3, 10).tolist()


def test_block_keys_keep_the_own_ids_where_they_identify_the_block():
    """G = 512, B = 16 with the last trace block partial (Mooncake lists it): blocks within the
    request's own identified span keep its own keys even where the continuation's id for that
    trace block differs (it names a longer prefix)."""
    own = np.array([10, 11])  # 600 tokens: 1 full + 1 partial trace block
    nxt = np.array([10, 12, 13])
    keys = block_keys(own, 512, 600, 16, 1, 50, next_ids=nxt, next_reach=800)
    base = block_keys(own, 512, 600, 16, 1, 50)
    assert keys[:37].tolist() == base[:37].tolist()  # 600 // 16 = 37 own blocks
    cont = block_keys(nxt, 512, 1536, 16, 2, 50)
    assert keys[37:50].tolist() == cont[37:50].tolist()  # up to 800 = 50 blocks


@pytest.mark.parametrize("ids, n_in, child_ids, child_in, want", [
    ([1, 2, 3], 50, [1, 2, 3, 4, 5], 90, True),  # starts with every full trace block
    ([1, 2, 3], 50, [1, 2, 3], 50, False),  # not longer
    ([1, 2, 3], 50, [1, 9, 3, 4, 5], 90, False),  # another prompt
    ([1, 2], 50, [1, 2, 3, 4, 5], 90, False),  # the request's third full block unidentified
    ([1, 2, 3], 50, [1, 2], 90, False),  # the child identifies less than the request's prompt
    ([], 10, [], 90, True),  # a prompt shorter than G: nothing contradicts the trace's link
])
def test_continues_needs_every_full_trace_block_of_the_prompt(ids, n_in, child_ids, child_in,
                                                               want):
    from sim.keys import continues
    assert continues(np.array(ids, dtype=np.int64), n_in, 16, np.array(child_ids, dtype=np.int64),
                     child_in) is want
    assert continues(np.array(ids, dtype=np.int64), n_in, 0, np.array(child_ids, dtype=np.int64),
                     child_in) is False


@settings(max_examples=40, deadline=None)
@given(refs=st.lists(st.integers(1, 3), min_size=0, max_size=12), n=st.integers(0, 12))
def test_shared_lead_counts_the_leading_blocks_held_more_than_once(refs, n):
    """``BlockPool.shared_lead(table, n)``: leading entries of ``table[:n]`` whose reference
    count is above 1, up to the first that is not (blocks touched by 1-3 requests)."""
    pool = BlockPool(16)
    table = pool.allocate(len(refs))
    for b, r in zip(table, refs):
        for _ in range(r - 1):
            pool.touch(np.array([b]))
    n = min(n, len(refs))
    want = 0
    while want < n and refs[want] > 1:
        want += 1
    assert pool.shared_lead(table, n) == want
