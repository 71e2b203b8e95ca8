"""The compiled selection and compression rounds equal their numpy definitions: SnapKV's
pooling, top-k masks, select_from_terms, the guarded ranking, apply_keep against the
compactor, run_rounds against run_round, kth_largest, and the kernels' recompilation when a
helper module changes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import SINGLE_ENGINE
from policies import (ImportanceModel, ImportanceParams, PagedLayout, PolicyConfig, make_compactor,
                      make_policy, score_slots)
from policies.pooled_round import kth_largest, pairwise_sum

B = 16


def filled(n, groups=1, prompt=0, block=B, **kw):
    lay = PagedLayout(block, groups, prompt, **kw)
    lay.fill(n)
    return lay


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 4), st.integers(0, 12), st.integers(0, 2**32 - 1),
       st.sampled_from([3, 7, 23, 25, 101, 1_000_001]), st.sampled_from(["max", "avg"]))
def test_snapkv_pooling_equals_the_windows_definition_for_any_kernel(H, S, seed, kernel, kind):
    """SnapKV's pooling (policies.snapkv._pool_along_positions) against its definition: each
    region token's value is the max (or the sum / kernel, zero padded) of the region's tokens
    within kernel // 2 ranks of it in position order; a kernel past 2S - 1 (1,000,001) costs
    what a window of 2S - 1 does."""
    from policies.snapkv import _pool_along_positions
    rng = np.random.default_rng(seed)
    score = rng.random((H, S)).astype(np.float32)
    pos = np.stack([rng.permutation(S) for _ in range(H)]) if S else np.zeros((H, 0), np.int64)
    region = rng.random((H, S)) < 0.7
    got = _pool_along_positions(score, pos, region, kernel, kind)
    half = kernel // 2
    for h in range(H):
        idx = [i for i in np.argsort(pos[h], kind="stable") if region[h, i]]
        for r, i in enumerate(idx):
            near = [float(score[h, j]) for j in idx[max(0, r - half):r + half + 1]]
            want = max(near) if kind == "max" else sum(near) / kernel
            assert got[h, i] == pytest.approx(want, rel=1e-12, abs=1e-300)
        assert np.isneginf(got[h, ~region[h]]).all()


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40), st.integers(0, 30), st.integers(0, 2**32 - 1), st.booleans(),
       st.booleans(), st.integers(-2, 33), st.sampled_from(["float32", "float64", "int64"]))
def test_topk_mask_equals_the_stable_descending_sort(H, S, seed, coarse, with_inf, k, dtype):
    """topk_mask (a compiled partition per row; the sort when a candidate score is infinite)
    keeps exactly the candidates a stable descending sort ranks below k: ties go to the lower
    slot, and infinite candidate scores tie with non-candidates as in the sort (float32,
    float64 and integer scores; up to 40 rows, as a per-layer policy's groups)."""
    from policies.selection import _rank_desc, topk_mask
    rng = np.random.default_rng(seed)
    sc = (rng.integers(0, 4, size=(H, S)) if coarse else rng.random((H, S)) * 100).astype(dtype)
    if with_inf and dtype != "int64":
        sc[rng.random((H, S)) < 0.2] = -np.inf
    cand = rng.random((H, S)) < 0.7
    ks = rng.integers(-2, S + 3, size=H) if k % 2 else k
    want = np.zeros((H, S), dtype=bool)
    if S:
        kk = np.maximum(np.broadcast_to(np.asarray(ks, dtype=np.int64), (H,)), 0)
        want = cand & (_rank_desc(sc, cand) < kk[:, None])
    assert (topk_mask(sc, cand, ks) == want).all()


def test_topk_mask_takes_read_only_views_and_integer_masks():
    """The compiled per-row path copies what it cannot take as is (broadcast, read-only score
    and candidate views; a candidate mask of integers) and keeps what the stable sort keeps."""
    from policies.selection import _rank_desc, topk_mask
    rng = np.random.default_rng(0)
    sc = np.broadcast_to(rng.random((1, 40)).astype(np.float32), (3, 40))
    cand = np.broadcast_to(rng.random(40) < 0.6, (3, 40))
    want = cand & (_rank_desc(sc, cand) < 7)
    assert not sc.flags.writeable and not cand.flags.writeable
    assert (topk_mask(sc, cand, 7) == want).all()
    assert (topk_mask(sc, cand.astype(np.int8), 7) == want).all()

# ------------------------------------------------------------------------- compiled rounds
def test_log_score_at_gives_the_models_float32_scores():
    """``f32(exp(log_score_at(g, p, *terms)))`` over a request's :meth:`log_score_terms` is
    the model's float32 score of position p for group g, over random fused parameters,
    steps, sequence lengths and groups, sink positions included; a model off the fused path
    has no terms."""
    from policies.score_terms import log_score_at
    rng = np.random.default_rng(7)
    for _ in range(25):
        params = ImportanceParams(
            drift_period=int(rng.integers(1, 600)),
            correlation_length=float(rng.choice([1.5, 4.0, 16.0])),
            head_correlation=float(rng.uniform(0.01, 0.99)), drift=float(rng.choice([0.05, 1.0])),
            sink_tokens=int(rng.integers(0, 8)), sigma_spread=float(rng.choice([0.0, 0.5])),
            sigma=float(rng.choice([0.0, 1.5, 40.0])))
        m = ImportanceModel(params, seed=int(rng.integers(0, 9)))
        G = int(rng.integers(1, 5))
        n = int(rng.integers(1, 3000))
        step = int(rng.integers(0, 2000))
        seq = n + int(rng.integers(0, 5))
        t = m.log_score_terms(11, G, step, seq, seq)
        pos = np.unique(np.concatenate([rng.integers(0, n, 200), np.arange(min(n, 8))]))
        want = m.scores(11, pos, G, step=step, seq_len=seq)
        got = np.array([[log_score_at(g, int(p), *t) for p in pos] for g in range(G)])
        assert np.array_equal(np.exp(got).astype(np.float32), want)
    assert ImportanceModel(ImportanceParams(drift=0.0)).log_score_terms(1, 1, 0, 5, 5) is None


def _scored_layout(rng, H, prompt, n, holes):
    lay = PagedLayout(B, H, prompt, request_key=int(rng.integers(0, 100)))
    lay.fill(n)
    for g in range(H):
        lay.slot_pos[g, rng.random(lay.allocated_slots) < holes] = -1
    return lay


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["h2o", "tova", "triattention"]), st.sampled_from([1, 3, 8]),
       st.integers(0, 300), st.integers(1, 1200), st.integers(1, 900), st.booleans(),
       st.sampled_from([0, 0, 25]), st.sampled_from([1.5, 1e-9, 0.0]), st.integers(0, 5000),
       st.floats(0.0, 0.6), st.integers(0, 2**32 - 1))
def test_select_from_terms_equals_select_on_the_models_scores(name, H, prompt, n, budget,
                                                               protect, recent, sigma, step,
                                                               holes, seed):
    """The compiled score-ranking round (``select_from_terms``: log-scores of the ranked
    candidates only, the exponential only where they leave the order open) keeps exactly what
    ``select`` keeps on ``score_slots``' float32 scores: H2O (score x age, recent window), TOVA
    and TriAttention, protected prompts or not, holes, several groups; near-ties (sigma 1e-9)
    and exact ties (sigma 0: the recency and sink terms only) included. It may decline (None)
    when more near-ties than it holds are open, never give another mask."""
    rng = np.random.default_rng(seed)
    if name in ("h2o", "tova") and protect:
        budget += prompt
    recent = recent if name != "tova" else 0
    pol = make_policy(PolicyConfig(name=name, budget=max(budget, recent), beta=1,
                                   protect_prompt=protect, mode="union" if H == 1 else "per_head",
                                   recent_window=None if name == "tova" else recent))
    assert pol.num_groups(H, 4) == H
    lay = _scored_layout(rng, H, prompt, prompt + n, holes)
    imp = ImportanceModel(ImportanceParams(sigma=sigma, sink_tokens=int(rng.integers(0, 6))),
                          seed=int(rng.integers(0, 4)))
    n_tok = prompt + n
    want = pol.select(lay, score_slots(imp, lay, step=step, from_pos=pol.scores_from(lay)),
                      n_tok, step)
    terms = imp.log_score_terms(lay.request_key, H, step, lay.next_position, lay.next_position)
    got = pol.select_from_terms(lay, terms, n_tok)
    assert got is None or np.array_equal(got, want)
    if sigma == 1.5:
        assert got is not None


def test_select_from_terms_ranks_near_ties_by_the_exact_scores():
    """Candidates whose keys lie within the bound of the threshold are ranked by the model's
    exact keys, and the masks equal ``select``'s: TOVA and TriAttention with sigma 1e-9 (every
    score within 1e-9 of another, so the bound alone cannot decide), H2O where the age weights
    of old tokens are 1 / 600,000 apart in the log (sigma 0: the key is the age weight)."""
    rng = np.random.default_rng(3)
    for name, sigma, n, holes in (("tova", 1e-9, 400, 0.1), ("triattention", 1e-9, 400, 0.1),
                                  ("h2o", 0.0, 600_000, 0.0)):
        imp = ImportanceModel(ImportanceParams(sigma=sigma, recency_boost=0.0), seed=1)
        pol = make_policy(PolicyConfig(name=name, budget=150, beta=1, protect_prompt=False,
                                       mode="union"))
        pol.num_groups(2, 1)
        lay = _scored_layout(rng, 1, 0, n, holes)
        want = pol.select(lay, score_slots(imp, lay, step=5, from_pos=pol.scores_from(lay)), n, 5)
        got = pol.select_from_terms(lay, imp.log_score_terms(lay.request_key, 1, 5, n, n), n)
        assert got is not None and np.array_equal(got, want), name


@settings(max_examples=120, deadline=None)
@given(st.sampled_from(["none", "forward_pack"]), st.integers(1, 5), st.integers(0, 60),
       st.integers(1, 400), st.floats(0.0, 1.0), st.booleans(), st.integers(0, 2**32 - 1))
def test_compression_apply_keep_equals_the_compactor(style, H, prompt, n, keep_share, release,
                                                     seed):
    """``Compression.apply_keep`` (counts, eviction and lengths in one compiled pass) leaves
    the layout and returns the round result ``compactor.apply`` does, for none and
    forward_pack, holes before the round, pinned prompts, kept shares from nothing to all,
    empty blocks released or kept."""
    from sim.compression import Compression
    from sim.run import compose_config
    rng = np.random.default_rng(seed)
    prompt = min(prompt, n)
    cfg = compose_config([*SINGLE_ENGINE, f"compaction={style}", "policy=tova",
                          f"compaction.release_empty_blocks={str(release).lower()}"])
    comp = Compression(cfg.policy, cfg.compaction, cfg.model, cfg.cache, cfg.cost, 4.8e12, 0)
    a = _scored_layout(rng, H, prompt, n, 0.2)
    b = a.copy()
    keep = (rng.random(a.slot_pos.shape) < keep_share) & (a.slot_pos >= 0)
    keep[:, :prompt] |= a.slot_pos[:, :prompt] >= 0
    want = comp.compactor.apply(a, keep.copy(), comp.kv_tok, pinned_len=prompt)
    got = comp.apply_keep(b, keep.copy(), prompt)
    assert np.array_equal(a.slot_pos, b.slot_pos) and np.array_equal(a.append_ptr, b.append_ptr)
    for f in ("tokens_before", "tokens_kept", "tokens_evicted", "blocks_before", "blocks_after",
              "bytes_moved", "ragged_waste_slots", "ragged_waste_bytes", "metadata_bytes"):
        assert getattr(got, f) == getattr(want, f), f
    for f in ("freed_block_indices", "moves", "kept_per_group", "group_lengths"):
        x, y = getattr(got, f), getattr(want, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["h2o", "tova"]), st.sampled_from(["union", "per_head", "per_layer"]),
       st.integers(40, 400), st.integers(0, 300), st.booleans(), st.sampled_from([1.5, 1e-9]),
       st.sampled_from([512, 37]), st.integers(0, 4), st.integers(0, 2**32 - 1))
def test_guarded_ranking_rounds_drop_what_select_drops(name, mode, budget, prompt, protect, sigma,
                                                        period, pin_blocks, seed):
    """Per-step rounds from a ``GuardedRanking`` (bounds over windows of steps, keys of the
    danger candidates only) drop, step after step, exactly the (group, position) pairs
    ``select`` drops on the model's scores, for H2O and TOVA in every mode, protected prompts,
    near-ties, drift epochs every 37 steps and shared leading blocks that stay; the layout
    evolves as the none compactor leaves it."""
    _guarded_rounds_against_select(name, mode, budget, prompt, protect, sigma, period,
                                   pin_blocks, seed, 90)


def _guarded_rounds_against_select(name, mode, budget, prompt, protect, sigma, period,
                                   pin_blocks, seed, steps):
    """Runs ``steps`` per-step rounds of a ``GuardedRanking`` beside ``select`` (a prompt of
    ``prompt`` tokens, ``pin_blocks`` leading blocks shared), asserting at each round that it
    drops what ``select`` drops; returns the last state."""
    from policies.guarded import GuardedRanking
    rng = np.random.default_rng(seed)
    budget += prompt if protect else 0
    pol = make_policy(PolicyConfig(name=name, budget=budget, beta=1, mode=mode,
                                   protect_prompt=protect))
    H = pol.num_groups(3, 2)
    imp = ImportanceModel(ImportanceParams(sigma=sigma, drift_period=period), seed=seed % 7)
    n = prompt + budget + int(rng.integers(1, 200))
    lay = _scored_layout(rng, H, prompt, n, 0.0)
    none = make_compactor("none")
    state = None
    for step in range(1, steps):
        if step > 1:
            lay.fill(1)
            n += 1
        keep = pol.select(lay, score_slots(imp, lay, step=step, from_pos=pol.scores_from(lay)),
                          n, step)
        pin = min(pin_blocks, lay.n_blocks) * B
        pin_below = int(lay.slot_pos[:, :pin].max()) + 1 if pin else 0
        dropped = (lay.slot_pos >= 0) & ~keep
        dropped[:, :pin] = False
        want = {(g, int(lay.slot_pos[g, j])) for g, j in zip(*np.nonzero(dropped))}
        if state is None:
            state = GuardedRanking.build(pol, imp, lay, pin_below)
        got = None if state is None else state.round(lay.request_key, step, lay.next_position,
                                                      n, pin_below)
        if got is None:
            state = None  # (the full round: too many to drop, e.g. at the first)
        else:
            assert set(zip(got[0].tolist(), got[1].tolist())) == want
        keep[:, :pin] |= lay.slot_pos[:, :pin] >= 0
        none.apply(lay, keep)
    assert state is not None
    return state


@pytest.mark.parametrize("name,mode,seed,rejoins", [
    ("tova", "per_layer", 2, True), ("tova", "union", 0, True), ("h2o", "union", 0, False),
    ("h2o", "per_head", 2, False)])
def test_guarded_ranking_parks_shared_positions_and_drops_what_select_drops(name, mode, seed,
                                                                            rejoins):
    """With many shared leading positions among the candidates (20 blocks, budget 120), the
    guarded ranking parks shared positions certain to rank among the evicted over a window
    (``cnt[4]`` counts them; ``cnt[5]`` those that rejoined the ranking within a window, when
    a round's threshold did not leave them below it) and still drops, round after round,
    exactly what ``select`` drops."""
    state = _guarded_rounds_against_select(name, mode, 120, 0, False, 1.5, 512, 20, seed, 160)
    assert state.cnt[4] > 0
    if rejoins:
        assert state.cnt[5] > 0


@pytest.mark.parametrize("overrides,shared", [
    (["policy=h2o", "policy.budget=300"], 0), (["policy=tova", "policy.budget=300"], 0),
    (["policy=tova", "policy.budget=300", "policy.mode=union"], 3),
    (["policy=h2o", "policy.budget=300", "policy.mode=per_head"], 25),
    (["policy=tova", "policy.budget=600", "policy.protect_prompt=true"], 12)])
def test_compression_guarded_rounds_equal_the_full_rounds(overrides, shared):
    """``Compression.run_round`` on per-step H2O and TOVA rounds under the none compactor (a
    ``GuardedRanking`` and the block bookkeeping of an unmoved layout) gives the round results
    and layouts of the full round (scores, select, the compactor), over a prefill-end round and
    decode steps with a varying number of shared leading blocks, a trailing block freed and
    new blocks after it."""
    from sim.compression import Compression
    from sim.run import compose_config

    class Req:
        pass

    cfg = compose_config([*SINGLE_ENGINE, *overrides])
    comps = [Compression(cfg.policy, cfg.compaction, cfg.model, cfg.cache, cfg.cost, 4.8e12, 0)
             for _ in range(2)]
    comps[1].guarded = False
    assert comps[0].guarded
    reqs = []
    for comp in comps:
        r = Req()
        r.rid, r.input, r.n_computed = 7, 500, 0
        comp.new_request(r)
        reqs.append(r)
    rng = np.random.default_rng(len(overrides) + shared)
    rounds = 0
    for it in range(700):
        n = 500 if it == 0 else 1
        due = []
        for comp, r in zip(comps, reqs):
            comp.place(r, n, comp.blocks_for(r, n))
            r.n_computed += n
            due.append(comp.due(r, it == 0))
        assert due[0] == due[1]
        if not due[0]:
            continue
        sh = min(int(rng.integers(0, shared + 1)), reqs[0].layout.n_blocks + reqs[0].blocks_since)
        (a, da, pa), (b, db, pb) = (comp.run_round(r, sh) for comp, r in zip(comps, reqs))
        rounds += 1
        assert (da, pa) == (db, pb)
        for f in ("tokens_before", "tokens_kept", "tokens_evicted", "blocks_before",
                  "blocks_after", "bytes_moved", "ragged_waste_slots", "ragged_waste_bytes",
                  "metadata_bytes"):
            assert getattr(a, f) == getattr(b, f), f
        for f in ("freed_block_indices", "moves", "kept_per_group", "group_lengths"):
            x, y = getattr(a, f), getattr(b, f)
            assert x.dtype == y.dtype and np.array_equal(x, y), f
        assert np.array_equal(reqs[0].layout.slot_pos, reqs[1].layout.slot_pos)
        assert np.array_equal(reqs[0].layout.append_ptr, reqs[1].layout.append_ptr)
    assert rounds > 100 and reqs[0].pstate.extra.get("guard") is not None


@pytest.mark.parametrize("overrides", [
    ["policy=snapkv", "policy.budget=120"], ["policy=pyramidkv", "policy.budget=150"],
    ["policy=ada_kv", "policy.budget=130"],
    ["policy=pyramidkv", "policy.budget=90", "compaction.release_empty_blocks=false"],
    ["policy=snapkv", "policy.budget=100", "cache.block_size=12"]])
def test_compression_row_rounds_equal_the_rounds_on_the_slot_table(overrides):
    """``Compression.run_round`` of SnapKV's family on a layout not yet brought up to date
    (one shared row ranked, the kept slots' table written once: ``row_rounds``) gives the
    round results, durations and layouts of the round on the full slot table, over prompts
    with and without shared leading blocks, and the decode steps after it."""
    from sim.compression import Compression
    from sim.run import compose_config

    class Req:
        pass

    cfg = compose_config([*SINGLE_ENGINE, *overrides])
    comps = [Compression(cfg.policy, cfg.compaction, cfg.model, cfg.cache, cfg.cost, 4.8e12, 0)
             for _ in range(2)]
    comps[1].row_rounds = False
    assert comps[0].row_rounds
    rounds = 0
    for rid, (P, shared) in enumerate([(700, 0), (433, 5), (1200, 3), (160, 0), (95, 0)]):
        reqs = []
        for comp in comps:
            r = Req()
            r.rid, r.input, r.n_computed = 40 + rid, P, 0
            comp.new_request(r)
            reqs.append(r)
        for it in range(40):
            n = P if it == 0 else 1
            due = []
            for comp, r in zip(comps, reqs):
                comp.place(r, n, comp.blocks_for(r, n))
                r.n_computed += n
                due.append(comp.due(r, it == 0))
            assert due[0] == due[1]
            if due[0]:
                (a, da, pa), (b, db, pb) = (comp.run_round(r, shared)
                                            for comp, r in zip(comps, reqs))
                rounds += 1
                assert (da, pa, a.as_row()) == (db, pb, b.as_row())
                for f in ("freed_block_indices", "kept_per_group", "group_lengths"):
                    x, y = getattr(a, f), getattr(b, f)
                    assert x.dtype == y.dtype and np.array_equal(x, y), f
        for comp, r in zip(comps, reqs):
            comp.sync(r)
        assert np.array_equal(reqs[0].layout.slot_pos, reqs[1].layout.slot_pos)
        assert np.array_equal(reqs[0].layout.append_ptr, reqs[1].layout.append_ptr)
        assert reqs[0].layout.next_position == reqs[1].layout.next_position
        assert comps[0].physical_context(reqs[0]) == comps[1].physical_context(reqs[1])
    assert rounds >= 3


def test_compression_run_rounds_equals_run_round_request_by_request():
    """``Compression.run_rounds`` over one step's due requests gives each request's round
    result, and leaves its layout and state, as ``run_round`` called request by request: six
    H2O requests with different prompts and shared blocks, over their decode steps."""
    from sim.compression import Compression
    from sim.run import compose_config

    class Req:
        pass

    cfg = compose_config([*SINGLE_ENGINE, "policy=h2o", "policy.budget=200"])
    comps = [Compression(cfg.policy, cfg.compaction, cfg.model, cfg.cache, cfg.cost, 4.8e12, 0)
             for _ in range(2)]
    prompts = [150, 230, 400, 260, 90, 333]
    reqs = []
    for comp in comps:
        rs = []
        for i, P in enumerate(prompts):
            r = Req()
            r.rid, r.input, r.n_computed = 100 + i, P, 0
            comp.new_request(r)
            rs.append(r)
        reqs.append(rs)
    shared = [0, 2, 0, 1, 0, 3]
    batches = 0
    for it in range(300):
        due = [[], []]
        for k, comp in enumerate(comps):
            for i, r in enumerate(reqs[k]):
                n = r.input if it == 0 else 1
                comp.place(r, n, comp.blocks_for(r, n))
                r.n_computed += n
                if comp.due(r, it == 0):
                    due[k].append(i)
        assert due[0] == due[1]
        if not due[0]:
            continue
        batches += len(due[0]) > 1
        got = comps[0].run_rounds([reqs[0][i] for i in due[0]], [shared[i] for i in due[0]])
        want = [comps[1].run_round(reqs[1][i], shared[i]) for i in due[1]]
        for (a, da, pa), (b, db, pb) in zip(got, want):
            assert (da, pa, a.as_row()) == (db, pb, b.as_row())
            assert np.array_equal(a.freed_block_indices, b.freed_block_indices)
    for a, b in zip(reqs[0], reqs[1]):
        assert np.array_equal(a.layout.slot_pos, b.layout.slot_pos)
    assert batches > 100


def test_kernel_depends_compiles_again_when_a_helper_module_changes(tmp_path):
    """A cached kernel that inlines a helper from another module (``kernel(...,
    depends=(module,))``) runs the helper's new code after that module changes, in a new
    process with the same numba cache."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "helper_mod.py").write_text(
        "from sim.jit import inline\n\n@inline\ndef scale(x):\n    return x * 2\n")
    (tmp_path / "kernel_mod.py").write_text(
        "import helper_mod\nfrom helper_mod import scale\nfrom sim.jit import kernel\n\n"
        "@kernel('i8(i8)', depends=(helper_mod,))\ndef twice(x):\n    return scale(x)\n")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    env.pop("NUMBA_DISABLE_JIT", None)

    def run():
        out = subprocess.run([sys.executable, "-c", "import kernel_mod; print(kernel_mod.twice(5))"],
                             env=env, cwd=tmp_path, capture_output=True, text=True, check=True)
        return int(out.stdout.split()[-1])

    assert run() == 10 and run() == 10  # (the second from the cache)
    assert any((tmp_path / "cache").rglob("*.kvsim.nbi"))
    (tmp_path / "helper_mod.py").write_text(
        "from sim.jit import inline\n\n@inline\ndef scale(x):\n    return x * 3 + 0\n")
    assert run() == 15


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 40), st.integers(0, 3), st.integers(0, 120), st.sampled_from([4, 16]))
def test_commit_next_writes_what_commit_append_writes(H, steps, n, block):
    """``PagedLayout.commit_next`` (one compiled pass) leaves an order-preserving layout as
    ``commit_append`` with the default positions does, after holes and trailing blocks were
    dropped; both refuse tokens the blocks cannot hold."""
    rng = np.random.default_rng(H * 1000 + steps * 100 + n)
    a = filled(max(n, 1), groups=H, block=block)
    for _ in range(steps):
        a.slot_pos[rng.random(a.slot_pos.shape) < 0.3] = -1
        empty = a.empty_blocks()
        if empty.size:
            a._drop_blocks(empty)
    b = a.copy()
    k = a.append(n)
    for lay in (a, b):
        lay.add_blocks(k)
    a.commit_append(n)
    b.commit_next(n)
    assert np.array_equal(a.slot_pos, b.slot_pos) and np.array_equal(a.append_ptr, b.append_ptr)
    assert a.next_position == b.next_position
    with pytest.raises(ValueError, match="do not fit"):
        b.commit_next(b.allocated_slots + 1)


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 12), st.integers(1, 40), st.sampled_from([4, 16]), st.integers(0, 2**32 - 1))
def test_remove_blocks_keeps_the_other_blocks_slots_in_order(H, nb, block, seed):
    """``PagedLayout.remove_blocks`` (the compiled copy of the kept blocks' runs, or the
    trailing blocks cut) leaves every group's slots of the other blocks, in order: none,
    some, runs, the trailing ones and every block removed."""
    rng = np.random.default_rng(seed)
    lay = filled(nb * block, groups=H, block=block)
    drop = np.flatnonzero(rng.random(nb) < rng.choice([0.0, 0.3, 0.8, 1.0]))
    if rng.random() < 0.3:
        drop = np.arange(nb - int(rng.integers(0, nb + 1)), nb)
    view = lay.slot_pos.reshape(H, nb, block)
    view[:, drop, :] = -1
    want = view[:, np.setdiff1d(np.arange(nb), drop), :].reshape(H, -1).copy()
    lay.remove_blocks(drop)
    assert np.array_equal(lay.slot_pos, want)
    assert lay.n_blocks == nb - drop.size


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 7000), st.integers(0, 2**32 - 1), st.sampled_from(["normal", "ties", "sorted", "runs"]))
def test_kth_largest_is_numpys_partition_value(n, seed, kind):
    """``policies.pooled_round.kth_largest(x, n, kg, buf)`` is the value ``np.partition(x[:n],
    n - kg)[n - kg]`` for every rank, on spread values, heavy ties, sorted rows and long runs
    of equal values (the sample's bracket missing the rank)."""
    rng = np.random.default_rng(seed)
    if kind == "normal":
        x = rng.standard_normal(n)
    elif kind == "ties":
        x = rng.integers(0, 4, n).astype(np.float64)
    elif kind == "sorted":
        x = np.sort(rng.standard_normal(n))[::-1].copy()
    else:
        x = np.repeat(rng.standard_normal(n // 50 + 1), 50)[:n].copy()
    buf = np.empty(n)
    for kg in {1, n, int(rng.integers(1, n + 1)), max(1, n // 3), max(1, n - 7)}:
        assert kth_largest(x, n, kg, buf) == np.partition(x, n - kg)[n - kg]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([1, 7, 8, 9, 128, 129, 136, 255, 4096, 8193, 70001]), st.integers(0, 300),
       st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
def test_pairwise_sum_is_numpys_row_sum(n, extra, density, seed):
    """``policies.pooled_round.pairwise_sum(a, n, ...)`` is ``a[:n].sum()`` as numpy sums a
    row of a 2-D array (``sum(axis=1)``), bit for bit: float32 scores spread over 20 orders of
    magnitude with zeros between them (Ada-KV's rows), lengths around the eight-way unrolling,
    numpy's block of 128 and its buffer of 8192."""
    rng = np.random.default_rng(seed)
    n += extra
    rows = np.zeros((2, n))
    mask = rng.random((2, n)) < density
    rows[mask] = np.exp(rng.standard_normal(int(mask.sum())) * 10).astype(np.float32)
    want = rows.sum(axis=1)
    stk = np.empty((3, 128), dtype=np.int64)
    rs = np.empty(128)
    for g in range(2):
        assert pairwise_sum(rows[g], n, stk, rs) == want[g]
    if n > 300:  # (long rows of spread values: a running sum gives other floats here)
        big = np.exp(rng.standard_normal(n) * 10).astype(np.float32).astype(np.float64)
        assert pairwise_sum(big, n, stk, rs) == big.reshape(1, -1).sum(axis=1)[0]


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(["snapkv", "pyramidkv", "ada_kv"]), st.booleans(), st.integers(1, 1500),
       st.integers(0, 2), st.integers(33, 600), st.sampled_from([7, 1, 3, 9]),
       st.sampled_from([32, 8]), st.sampled_from([1.5, 1e-9, 0.0]), st.sampled_from([0, 1024, 700]),
       st.integers(0, 2**32 - 1))
def test_snapkv_select_from_terms_equals_select(name, layered, prompt, decode, budget, kernel,
                                                window, sigma, step, seed):
    """SnapKV, PyramidKV and Ada-KV rounds from log-scores pooled in the log domain
    (``select_from_terms`` with the static fields' lattice) keep what ``select`` keeps on
    ``score_slots``' float32 scores: max pooling of any odd kernel, observation windows, decode
    tokens, per-head and per-layer groups, near-ties and ties (sigma 1e-9, 0), at steps where
    the drift's second epoch has no weight (0 and 1024: its lattice is not drawn) and mid-drift
    (700)."""
    rng = np.random.default_rng(seed)
    modes = {"snapkv": ("per_head", "union"), "pyramidkv": ("per_layer", "per_layer_per_head"),
             "ada_kv": ("per_head", "per_layer_per_head")}[name]
    pol = make_policy(PolicyConfig(name=name, budget=budget, mode=modes[layered],
                                   pooling_kernel=kernel, observation_window=window))
    H = pol.num_groups(4, 3)
    lay = PagedLayout(B, H, prompt, request_key=int(rng.integers(0, 1000)))
    lay.fill(prompt + decode)
    imp = ImportanceModel(ImportanceParams(sigma=sigma, sink_tokens=int(rng.integers(0, 6))),
                          seed=int(rng.integers(0, 5)))
    want = pol.select(lay, score_slots(imp, lay, step=step), prompt + decode, step)
    terms = imp.log_score_terms(lay.request_key, H, step, lay.next_position, lay.next_position,
                                static_lattice=True)
    got = pol.select_from_terms(lay, terms, prompt + decode)
    assert got is None or np.array_equal(got, want)
    if sigma == 1.5:
        assert got is not None


@settings(max_examples=120, deadline=None)
@given(st.sampled_from([1, 3, 8]), st.integers(1, 2500), st.integers(0, 40), st.floats(0.0, 0.5),
       st.sampled_from([1, 3, 7, 9, 33, 35]), st.sampled_from([1.5, 4.0, 1e-9, 0.0]),
       st.sampled_from([0, 0, 300, 777]), st.sampled_from([16.0, 5.5, 40.0]),
       st.integers(0, 2**32 - 1))
@example(H=8, prompt=38, decode=27, holes=0.0, kernel=33, sigma=4.0, step=0, corr=5.5,
         seed=14783875)  # (budgets of 2-4: a round of segments may hold fewer than kg)
def test_snap_keep_bounded_scoring_keeps_what_scoring_every_candidate_keeps(
        H, prompt, decode, holes, kernel, sigma, step, corr, seed):
    """``snap_keep`` with ``bound`` (a group scores only the segments whose upper bound on the
    pooled log-score reaches its threshold) gives the keep mask, the band rows and their
    scores that scoring every candidate gives: holes in the groups' slots, per-group budgets
    from 1 to every candidate, kernels up to the widest the bound takes and past it, sinks,
    rounds at step 0 and mid-drift, lattice spacings that do not divide the segments,
    near-ties and ties (sigma 1e-9, 0); and with every group holding one row, that row
    given once (``shared``) gives what the table of its copies gives."""
    from policies.pooled_round import snap_keep
    from policies.selection import KEY_EPS
    rng = np.random.default_rng(seed)
    lay = PagedLayout(B, H, prompt, request_key=int(rng.integers(0, 1000)))
    lay.fill(prompt + decode)
    for g in range(H):
        lay.slot_pos[g, rng.random(lay.allocated_slots) < holes] = -1
    imp = ImportanceModel(ImportanceParams(sigma=sigma, sink_tokens=int(rng.integers(0, 40)),
                                           correlation_length=corr),
                          seed=int(rng.integers(0, 5)))
    seq = lay.next_position
    t = imp.log_score_terms(lay.request_key, H, step, seq, seq, static_lattice=True)
    w = int(rng.integers(0, 40))
    kg = rng.integers(1, prompt + 2, H).astype(np.int64)
    row = lay.slot_pos[:1].copy()
    out = []
    # (bounded, every candidate scored; then group 0's row in every group, as one shared row
    # and as a table of H equal rows)
    for slots, bound, shared in ((lay.slot_pos, True, False), (lay.slot_pos, False, False),
                                 (row, True, True), (np.repeat(row, H, axis=0), False, False)):
        keep = np.zeros(lay.slot_pos.shape, dtype=bool)
        pend = np.zeros((1 << 14, 4), dtype=np.int64)
        pend_v = np.zeros(1 << 14)
        n = snap_keep(slots, prompt, kernel, max(prompt - w, 0), kg, t.ip_i, t.ip_f, t.static,
                      t.drift, t.consts, t.sig, t.lm, t.sink, t.seq_len, KEY_EPS, keep, pend,
                      pend_v, bound, shared)
        out.append((n, keep, pend[:max(n, 0)], pend_v[:max(n, 0)]))
    for (n1, k1, p1, v1), (n0, k0, p0, v0) in (out[:2], out[2:]):
        assert n1 == n0
        assert np.array_equal(k1, k0) and np.array_equal(p1, p0) and np.array_equal(v1, v0)
