"""The importance model (deterministic, position-local scores with head correlation,
locality, drift, sinks and recency), score_slots, recorded importance files, and the compiled
log-score pass against the numpy path."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from policies import (ImportanceModel, ImportanceParams, PagedLayout, PolicyConfig, RecordedImportance,
                      make_compactor, make_policy, score_slots)

B = 16


def filled(n, groups=1, prompt=0, block=B, **kw):
    lay = PagedLayout(block, groups, prompt, **kw)
    lay.fill(n)
    return lay


# ------------------------------------------------------------------------- importance model
def test_importance_deterministic_and_position_local():
    m = ImportanceModel(seed=5)
    pos = np.arange(1000)
    a = m.scores(3, pos, 4, step=100, seq_len=1000)
    b = m.scores(3, pos, 4, step=100, seq_len=1000)
    assert np.array_equal(a, b) and a.shape == (4, 1000) and a.dtype == np.float32
    sub = m.scores(3, pos[::7][::-1], 4, step=100, seq_len=1000)
    assert np.array_equal(sub, a[:, ::7][:, ::-1])  # independent of which positions are asked
    assert not np.array_equal(a, ImportanceModel(seed=6).scores(3, pos, 4, 100, 1000))
    assert not np.array_equal(a, m.scores(4, pos, 4, 100, 1000))


def test_importance_head_correlation_effect():
    pos = np.arange(5000)
    one = ImportanceModel(ImportanceParams(head_correlation=1.0, sigma_spread=0.0), seed=0)
    s = one.scores(0, pos, 4)
    assert all(np.array_equal(s[0], s[g]) for g in range(4))  # rho = 1: identical groups
    z0 = ImportanceModel(ImportanceParams(head_correlation=0.0), seed=0).latent(0, pos, 2)
    z5 = ImportanceModel(ImportanceParams(head_correlation=0.5), seed=0).latent(0, pos, 2)
    assert abs(np.corrcoef(z0)[0, 1]) < 0.15
    assert 0.35 < np.corrcoef(z5)[0, 1] < 0.65


def test_importance_locality_effect():
    pos = np.arange(20000)
    lag = lambda z, d: np.corrcoef(z[:-d], z[d:])[0, 1]
    short = ImportanceModel(ImportanceParams(correlation_length=1, drift=0), seed=0).latent(0, pos, 1)[0]
    long = ImportanceModel(ImportanceParams(correlation_length=64, drift=0), seed=0).latent(0, pos, 1)[0]
    assert abs(lag(short, 8)) < 0.05 and lag(long, 8) > 0.8
    # locality concentrates top tokens in fewer blocks -> more blocks freed without compaction
    def freed(L):
        imp = ImportanceModel(ImportanceParams(correlation_length=L, recency_boost=0, sink_tokens=0), seed=0)
        lay = filled(16000)
        pol = make_policy(PolicyConfig(name="triattention", budget=1600, protect_prompt=False))
        keep = pol.select(lay, score_slots(imp, lay), 16000, 0)
        return make_compactor("none").apply(lay, keep).blocks_freed
    assert freed(256) > freed(1) + 300


def test_importance_drift_sinks_recency():
    pos = np.arange(4000)
    m = ImportanceModel(ImportanceParams(drift=1.0, drift_period=100, recency_boost=0, sink_tokens=0), seed=0)
    z0, z1, z9 = (m.latent(0, pos, 1, step=s)[0] for s in (0, 10, 900))
    assert np.corrcoef(z0, z1)[0, 1] > 0.9 and abs(np.corrcoef(z0, z9)[0, 1]) < 0.1
    static = ImportanceModel(ImportanceParams(drift=0.0), seed=0)
    assert np.array_equal(static.scores(0, pos, 1, 0), static.scores(0, pos, 1, 999))
    s = ImportanceModel(seed=0).scores(0, pos, 1)[0]
    assert s[:4].min() > np.quantile(s[4:], 0.99)  # sinks on top
    assert np.median(s[-16:]) > np.median(s[1000:3000])  # recency boost


def _reference_scores(params, seed, key, pos, G, step, seq_len):
    """The module docstring's formula computed directly from the lattice deviates (no memo, no
    tables), in the model's operation order: the memoised model must give the same bits."""
    from policies.importance import _SHARED, _STATIC, _gauss
    p = params
    L = float(p.correlation_length)
    x = pos / L
    i0 = np.floor(x).astype(np.int64)
    t = x - i0
    omt = 1.0 - t
    den = np.sqrt(omt ** 2 + t ** 2)

    def field(s, e):
        return (omt * _gauss(seed, key, s, e, i0) + t * _gauss(seed, key, s, e, i0 + 1)) / den

    e, r = divmod(step, p.drift_period)
    th = 0.5 * math.pi * r / p.drift_period

    def stream(s):
        dyn = math.cos(th) * field(s, e) + math.sin(th) * field(s, e + 1)
        return math.sqrt(1.0 - p.drift) * field(s, _STATIC) + math.sqrt(p.drift) * dyn

    rho = p.head_correlation
    z = np.stack([math.sqrt(rho) * stream(_SHARED) + math.sqrt(1.0 - rho) * stream(g) for g in range(G)])
    sig = p.sigma * np.exp(p.sigma_spread * _gauss(seed, key, -2, 0, np.arange(G)) - 0.5 * p.sigma_spread ** 2)
    age = np.maximum(seq_len - 1 - pos, 0).astype(np.float64)
    mult = 1.0 + p.recency_boost * np.exp(-age / p.recency_window)
    mult = np.where(pos < p.sink_tokens, mult * p.sink_boost, mult)
    return np.exp(np.clip(sig[:, None] * z + np.log(mult)[None, :], -80.0, 80.0)).astype(np.float32)


def test_importance_memo_and_tables_give_the_formula_bits():
    """The importance model's memos (dense static field, interpolation and recency tables, the
    two drift epochs gathered together, a request's memo dropped at finish) return the very bits
    of the formula computed directly, whatever was asked before: growing sequences across drift
    epochs, unsorted and repeated positions, other requests, a forgotten request."""
    params = ImportanceParams(drift_period=64)
    m = ImportanceModel(params, seed=3)
    rng = np.random.default_rng(0)
    for step in (0, 40, 63, 64, 130, 700, 5000):
        for key, G in ((7, 1), (8, 3)):
            n = 50 + step
            pos = np.concatenate([rng.integers(0, n, 200), [0, 1, 2, 3, n - 1, n - 1]])
            got = m.scores(key, pos, G, step=step, seq_len=n + 5)
            assert np.array_equal(got, _reference_scores(params, 3, key, pos, G, step, n + 5))
        m.forget(7)
    assert m._memo_values == sum(a.size for a in m._memo.values())


def test_score_slots_from_pos_leaves_unread_slots_unscored():
    """``from_pos`` (a policy's ``scores_from``) leaves the slots below it at -inf and scores
    the others exactly as a full call; TriAttention's keep mask is the same either way."""
    lay = filled(3000, prompt=700)
    imp = ImportanceModel(seed=1)
    full = score_slots(imp, lay, step=300)
    part = score_slots(ImportanceModel(seed=1), lay, step=300, from_pos=700)
    hi = lay.slot_pos >= 700
    assert np.array_equal(part[hi], full[hi]) and np.isneginf(part[~hi]).all()
    pol = make_policy(PolicyConfig(name="triattention", budget=1000, protect_prompt=True))
    assert pol.scores_from(lay) == 700 and pol.uses_scores
    assert np.array_equal(pol.select(lay, part, 3000, 300), pol.select(lay, full, 3000, 300))
    assert make_policy(PolicyConfig(name="triattention", protect_prompt=False)).scores_from(lay) == 0
    assert not make_policy(PolicyConfig(name="streaming_llm")).uses_scores


@pytest.mark.parametrize("from_pos", [0, 2, 150])
def test_score_slots_several_groups_score_each_live_slot_by_its_position(from_pos):
    """Several groups (a per-head or per-layer policy): each slot holding a position >=
    from_pos gets its group's score of that position from one call over the distinct live
    positions (compiled: a rank table instead of np.unique), holes and slots below from_pos
    stay -inf; sink positions (0-3) included when from_pos is 0."""
    lay = filled(600, groups=5, prompt=100)
    rng = np.random.default_rng(from_pos)
    for g in range(5):  # each group its own holes and order, as after per-head compactions
        lay.slot_pos[g, rng.random(lay.slot_pos.shape[1]) < 0.2] = -1
        lay.slot_pos[g, 200:300] = rng.permutation(lay.slot_pos[g, 200:300])
    got = score_slots(ImportanceModel(seed=2), lay, step=40, from_pos=from_pos)
    live = lay.slot_pos >= from_pos
    uniq = np.unique(lay.slot_pos[live])
    sc = ImportanceModel(seed=2).scores(lay.request_key, uniq, 5, step=40,
                                        seq_len=max(lay.next_position, int(uniq.max()) + 1))
    assert got.shape == lay.slot_pos.shape and got.dtype == np.float32
    for g in range(5):
        idx = np.searchsorted(uniq, lay.slot_pos[g, live[g]])
        assert np.array_equal(got[g, live[g]], sc[g, idx])
    assert np.isneginf(got[~live]).all()
    # no live slot: all -inf
    lay.slot_pos[:] = -1
    assert np.isneginf(score_slots(ImportanceModel(seed=2), lay, step=40)).all()


def test_score_slots_one_group_scores_each_live_slot_by_its_position():
    """One group: every slot holding a position >= from_pos gets the model's score of that
    position (holes and slots below from_pos stay -inf), in slot order after a compaction
    reordered and emptied slots."""
    lay = filled(600, prompt=100)
    lay.slot_pos[0, ::7] = -1  # holes
    lay.slot_pos[0, 300:400] = lay.slot_pos[0, 300:400][::-1].copy()  # out of position order
    got = score_slots(ImportanceModel(seed=2), lay, step=40, from_pos=150)
    pos = lay.slot_pos[0]
    live = pos >= 150
    want = ImportanceModel(seed=2).scores(lay.request_key, pos[live], 1, step=40,
                                          seq_len=max(lay.next_position, int(pos.max()) + 1))[0]
    assert got.shape == lay.slot_pos.shape and got.dtype == np.float32
    assert np.array_equal(got[0, live], want) and np.isneginf(got[0, ~live]).all()


# ------------------------------------------------------------------------- recorded importance
def _write(path, **cols):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(cols), path)


def test_recorded_importance_roundtrip(tmp_path):
    p = tmp_path / "scores.parquet"
    n = 50
    _write(p, request_id=np.repeat(np.array([7, 7], dtype=np.int64), n),
           group=np.repeat(np.array([0, 1], dtype=np.int32), n),
           position=np.tile(np.arange(n, dtype=np.int64), 2),
           score=np.concatenate([np.arange(n), -np.arange(n)]).astype(np.float32))
    rec = RecordedImportance(p)
    s = rec.scores(7, np.array([3, 10, 0]), 2)
    assert s.tolist() == [[3, 10, 0], [-3, -10, 0]]
    with pytest.raises(KeyError, match=r"request 8"):
        rec.scores(8, np.array([1]), 2)
    with pytest.raises(KeyError, match=r"positions \[60\]"):
        rec.scores(7, np.array([1, 60]), 2)
    with pytest.raises(KeyError, match="no group 2"):
        rec.scores(7, np.array([1]), 3)
    lay = filled(20, 2, 0, request_key=7)
    sl = score_slots(rec, lay)
    assert sl.shape == (2, 32) and np.isneginf(sl[:, 20:]).all()
    assert sl[0, 5] == 5 and sl[1, 5] == -5
    lay.request_key = 0
    with pytest.raises(KeyError, match="request 0 not recorded"):
        score_slots(rec, lay)


def test_recorded_importance_step_and_broadcast(tmp_path):
    p = tmp_path / "s.parquet"
    _write(p, request_id=np.zeros(4, np.int64), group=np.zeros(4, np.int32), position=np.array([0, 0, 1, 1]),
           score=np.array([1, 2, 3, 4], np.float32), step=np.array([0, 10, 0, 10]))
    rec = RecordedImportance(p)
    assert rec.scores(0, [0, 1], 3, step=5).tolist() == [[1, 3]] * 3
    assert rec.scores(0, [0, 1], 1, step=10).tolist() == [[2, 4]]


def test_recorded_importance_missing_column(tmp_path):
    p = tmp_path / "bad.parquet"
    _write(p, request_id=np.zeros(3, np.int64), position=np.arange(3), score=np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"bad.parquet.*missing column 'group'"):
        RecordedImportance(p)
    with pytest.raises(FileNotFoundError):
        RecordedImportance(tmp_path / "nope.parquet")


def test_recorded_importance_repeated_key_null_and_float32_overflow_are_named(tmp_path):
    """A repeated (request_id, group, position) key, a float64 score beyond float32's range and
    a null request_id, group or position are each an error naming the file and the rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = dict(request_id=np.zeros(4, np.int64), group=np.zeros(4, np.int32),
                position=np.array([0, 1, 2, 1]), score=np.array([1, 2, 3, 4], np.float32))
    p = tmp_path / "dup.parquet"
    _write(p, **base)
    with pytest.raises(ValueError, match=r"dup.parquet: rows \[1, 3\] repeat the key "
                                         r"\(request_id 0, group 0, position 1\)"):
        RecordedImportance(p)
    # with a step column the same position at two steps is fine; the same step twice is not
    _write(p, **base, step=np.array([0, 0, 0, 5]))
    assert RecordedImportance(p).scores(0, [1], 1, step=5).tolist() == [[4]]
    _write(p, **base, step=np.array([0, 5, 0, 5]))
    with pytest.raises(ValueError, match=r"rows \[1, 3\] repeat the key \(request_id 0, "
                                         r"group 0, position 1, step 5\)"):
        RecordedImportance(p)
    big = tmp_path / "big.parquet"
    _write(big, **{**base, "position": np.arange(4),
                   "score": np.array([1.0, 2.0, 1e39, 4.0], np.float64)})
    with pytest.raises(ValueError, match=r"big.parquet: row 2: score 1e\+39 \(request_id 0, "
                                         r"position 2\) is beyond float32's range"):
        RecordedImportance(big)
    # negative keys, and unsigned ones past int64 (they wrapped to negative), are named
    for col, vals, says in (("position", [0, 1, -1, 3], "row 2: position -1, expected >= 0"),
                            ("group", [0, -2, 0, 0], "row 1: group -2, expected >= 0"),
                            ("request_id", [0, 0, 0, -5], "row 3: request_id -5, expected >= 0"),
                            ("step", [0, 0, -1, 0], "row 2: step -1, expected >= 0")):
        f = tmp_path / f"neg_{col}.parquet"
        _write(f, **{**base, "position": np.arange(4), col: np.array(vals, np.int64)})
        with pytest.raises(ValueError, match=rf"neg_{col}.parquet: {re.escape(says)}"):
            RecordedImportance(f)
    f = tmp_path / "u64.parquet"
    _write(f, **{**base, "position": np.array([0, 1, 2**63, 3], np.uint64)})
    with pytest.raises(ValueError, match=r"u64.parquet: row 2: position 9223372036854775808, "
                                         r"expected at most 2\*\*63 - 1"):
        RecordedImportance(f)
    _write(f, **{**base, "position": np.arange(4, dtype=np.uint64)})  # (unsigned, in range: fine)
    assert RecordedImportance(f).scores(0, [2], 1).tolist() == [[3]]
    for col in ("request_id", "group", "position", "score"):
        cols = {k: pa.array(v) for k, v in {**base, "position": np.arange(4)}.items()}
        vals = cols[col].to_pylist()
        vals[2] = None
        cols[col] = pa.array(vals, type=cols[col].type)
        f = tmp_path / f"null_{col}.parquet"
        pq.write_table(pa.table(cols), f)
        with pytest.raises(ValueError, match=rf"null_{col}.parquet: row 2: column '{col}' is null"):
            RecordedImportance(f)

def test_importance_compiled_scores_equal_the_numpy_path():
    """The compiled log-score pass (``ImportanceModel._logs_fused``) gives the very bits of the
    numpy path (``latent`` and the recency table) over random parameters, positions, groups,
    steps and sequence lengths, sink positions included (their recency terms come from numpy
    as in the numpy path)."""
    rng = np.random.default_rng(1)
    for _ in range(60):
        params = ImportanceParams(
            drift_period=int(rng.integers(1, 600)),
            correlation_length=float(rng.choice([1.5, 4.0, 16.0, 33.3])),
            head_correlation=float(rng.uniform(0.01, 0.99)),
            drift=float(rng.choice([0.05, 0.3, 1.0])), sink_tokens=int(rng.integers(0, 8)),
            sigma_spread=float(rng.choice([0.0, 0.5])))
        seed = int(rng.integers(0, 9))
        fused = ImportanceModel(params, seed=seed)
        plain = ImportanceModel(params, seed=seed, compiled=False)
        assert fused.log_score_terms(5, 1, 0, 10, 10) is not None  # (the compiled pass applies)
        assert plain.log_score_terms(5, 1, 0, 10, 10) is None
        for k in range(3):
            n = int(rng.integers(10, 6000))
            G = int(rng.integers(1, 4))
            step = int(rng.integers(0, 3000)) + 100 * k
            lo = params.sink_tokens if k == 0 else 0  # (k > 0: sink positions too)
            pos = rng.integers(lo, n, int(rng.integers(1, 3000)))
            if k == 2:
                pos[:3] = [0, 1, 0]
            seq = n + int(rng.integers(0, 10))
            got = fused.scores(5, pos, G, step, seq)
            want = plain.scores(5, pos, G, step, seq)
            assert np.array_equal(got, want)
