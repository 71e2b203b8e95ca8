"""The engine (sim.engine): prefix hits, block usage, an idle pool, preemption, and fast-forward
stretches giving the per-step loop's tables."""

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SINGLE_ENGINE, chunk_workload, make_workload
from sim.cost import StretchShape
from sim.cost_models import build_cost_model
from sim.engine import Simulator
from sim.metrics import Recorder
from sim.run import compose_config


def simulate(wl, *overrides, num_blocks=1000, check=True, fast_forward=True, steps=True):
    cfg = compose_config(["cache.num_gpu_blocks=%d" % num_blocks, *overrides])
    cost = build_cost_model(cfg.model, cfg.gpu, cfg.cache, cfg.cost)
    rec = Recorder(len(wl), wl.table.column("session_id").to_numpy(), record_steps=steps)
    sim = Simulator(wl, num_blocks, cfg.cache.block_size, cfg.scheduler, cfg.cache, cost,
                    cfg.model.max_model_len, rec, check_invariants=check, fast_forward=fast_forward)
    sim.run()
    return rec.requests_frame(), rec.steps_frame(), rec, sim


def test_prefix_shorter_than_a_block_gives_no_hit():
    # two prompts share their first 8 tokens only (trace granularity 8 < block size 16)
    wl = make_workload([
        dict(arrival_s=0.0, input_tokens=40, output_tokens=4, prefix_ids=[1, 2, 3, 4, 5]),
        dict(arrival_s=10.0, input_tokens=40, output_tokens=4, prefix_ids=[1, 9, 10, 11, 12]),
    ], prefix_block_tokens=8)
    req, *_ = simulate(wl)
    assert req.prefix_hit_tokens.tolist() == [0, 0]


def test_hit_tokens_are_block_multiples_and_last_token_recomputed():
    ids = list(range(100, 110))
    wl = make_workload([
        dict(arrival_s=0.0, input_tokens=160, output_tokens=3, prefix_ids=ids),
        dict(arrival_s=10.0, input_tokens=160, output_tokens=3, prefix_ids=ids),  # full resend
        dict(arrival_s=20.0, input_tokens=150, output_tokens=3, prefix_ids=ids),  # shorter
    ], prefix_block_tokens=16)
    req, *_ = simulate(wl)
    hits = req.prefix_hit_tokens.tolist()
    assert all(h % 16 == 0 for h in hits)
    assert hits[0] == 0
    assert hits[1] == 144  # (160 - 1) // 16 = 9 blocks: the last token is always recomputed
    assert hits[2] == 144  # 150 tokens: 9 full blocks
    assert req.computed_prompt_tokens.tolist() == [160, 16, 6]


def test_block_usage_counts_allocated_blocks_not_filled_slots():
    wl = make_workload([dict(arrival_s=0.0, input_tokens=17, output_tokens=5) for _ in range(4)])
    req, steps, *_ = simulate(wl, fast_forward=False)
    first = steps.iloc[0]
    assert first.prefill_tokens == 4 * 17
    assert first.blocks_used == 4 * 2 and first.live_kv_tokens == 4 * 17
    assert first.blocks_used * 16 / first.live_kv_tokens == pytest.approx(32 / 17)


def test_idle_pool_has_no_used_blocks_but_cached_blocks_serve_a_resent_prompt():
    ids = [7, 8, 9, 10]
    wl = make_workload([
        dict(arrival_s=0.0, input_tokens=64, output_tokens=2, prefix_ids=ids),
        dict(arrival_s=50.0, input_tokens=64, output_tokens=2, prefix_ids=ids),
    ], prefix_block_tokens=16)
    req, steps, rec, sim = simulate(wl)
    last = steps[steps.time_s < 50.0].iloc[-1]  # the first request's last step: the row
    assert last.blocks_used == 5 and last.running == 1  # counts what it ran with (65 tokens)
    # idle in between: its 4 full blocks stayed cached; the resent prompt hits 3 of them (the
    # last prompt token is recomputed: a new 4th block), the 4th stays cached and free
    second = steps[steps.time_s >= 50.0].iloc[0]
    assert second.blocks_used == 4 and second.blocks_cached_free == 1
    assert req.prefix_hit_tokens.tolist() == [0, 48]
    assert sim.pool.num_used == 0


def test_preemption_by_recompute_and_rejection():
    # 6 blocks of 16 = 96 slots; two requests each growing to 64 tokens must preempt
    wl = make_workload([
        dict(arrival_s=0.0, input_tokens=20, output_tokens=44),
        dict(arrival_s=0.0, input_tokens=20, output_tokens=44),
        dict(arrival_s=0.0, input_tokens=90, output_tokens=20),  # 109 slots > 96: never fits
    ])
    req, steps, rec, sim = simulate(wl, num_blocks=6)
    assert req.status.tolist() == ["finished", "finished", "rejected"]
    assert req.reject_reason.tolist()[2] == "kv_capacity"
    assert rec.preemptions >= 1
    assert req.preemptions.sum() == rec.preemptions
    assert (steps.blocks_used <= 6).all()


@pytest.mark.parametrize("fast_forward", [True, False])
def test_computed_prompt_tokens_count_what_was_prefilled_through_preemptions(fast_forward):
    """A request preempted in the middle of its chunked prefill counts as computed only the
    prompt tokens its prefill reached: preemption takes back the rest, and the re-admission
    counts what it prefills again. So the requests' computed prompt tokens add up to the steps'
    prefill tokens, a request never preempted counts its prompt once, and none exceeds
    (prompt + output) x (1 + preemptions) (a recompute prefills the tokens generated so far
    too); per-step loop and fast-forward alike."""
    wl = make_workload([dict(arrival_s=0.0, input_tokens=1500, output_tokens=200)] * 6)
    req, steps, rec, sim = simulate(wl, "scheduler.max_num_batched_tokens=512",
                                    "cache.enable_prefix_caching=false", num_blocks=200,
                                    fast_forward=fast_forward)
    assert rec.preemptions >= 3 and (req.status == "finished").all()
    assert req.computed_prompt_tokens.sum() == steps.prefill_tokens.sum() == rec.sum_prefill
    assert (req.computed_prompt_tokens >= req.input_tokens).all()
    assert (req.computed_prompt_tokens <= (req.input_tokens + req.output_tokens)
            * (1 + req.preemptions)).all()
    assert (req.computed_prompt_tokens[req.preemptions == 0] == 1500).all()


def test_max_model_len_rejection():
    wl = make_workload([dict(arrival_s=0.0, input_tokens=100, output_tokens=28)])
    req, *_ = simulate(wl, "model.max_model_len=127")
    assert req.status.tolist() == ["rejected"] and req.reject_reason.tolist() == ["max_model_len"]


def test_closed_loop_child_arrives_after_parent_finish_plus_think():
    wl = make_workload([
        dict(arrival_s=0.0, input_tokens=64, output_tokens=10, prefix_ids=[1, 2, 3, 4], session_id=0),
        dict(arrival_s=999.0, input_tokens=128, output_tokens=10, prefix_ids=[1, 2, 3, 4, 5, 6, 7, 8],
             parent_request_id=0, think_s=2.5, session_id=0, turn=1),
    ], prefix_block_tokens=16)
    req, *_ = simulate(wl)
    assert req.arrival_s[1] == pytest.approx(req.finish_s[0] + 2.5)
    assert req.prefix_hit_tokens[1] == 64


def random_workload(seed, n=60):
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        inp = int(rng.integers(1, 300))
        shared = int(rng.integers(0, 3))
        nid = -(-inp // 16)
        ids = [shared * 1000 + j for j in range(nid)]
        rows.append(dict(arrival_s=float(rng.uniform(0, 2)), input_tokens=inp,
                         output_tokens=int(rng.integers(1, 80)), prefix_ids=ids))
    rows.sort(key=lambda r: r["arrival_s"])
    return make_workload(rows, prefix_block_tokens=16)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fast_forward_equals_per_step(seed):
    wl = random_workload(seed)
    a, sa, ra, _ = simulate(wl, "scheduler.max_num_batched_tokens=256", num_blocks=60, fast_forward=True)
    b, sb, rb, _ = simulate(wl, "scheduler.max_num_batched_tokens=256", num_blocks=60, fast_forward=False)
    ints = ["prefix_hit_tokens", "computed_prompt_tokens", "preemptions"]
    pd.testing.assert_frame_equal(a[ints + ["status"]], b[ints + ["status"]])
    for col in ("first_token_s", "finish_s"):
        np.testing.assert_allclose(a[col], b[col], rtol=1e-9, atol=1e-12)
    assert ra.num_steps == rb.num_steps and ra.preemptions == rb.preemptions
    cols = ["running", "waiting", "prefill_tokens", "decode_tokens", "blocks_used",
            "blocks_cached_free", "live_kv_tokens"]
    pd.testing.assert_frame_equal(sa[cols], sb[cols])


def batch_workload(seed, n=40):
    """Requests in bursts (each burst admitted together, then decoding with nothing waiting):
    output lengths that differ, so requests finish inside decode stretches; prompts sharing
    prefixes (shared blocks: a finish frees only some); a closed-loop child after a few."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        inp = int(rng.integers(1, 200))
        nid = -(-inp // 16)
        shared = int(rng.integers(0, 2))
        rows.append(dict(arrival_s=float(i // 10) * 4.0, input_tokens=inp,
                         output_tokens=int(rng.integers(1, 150)),
                         prefix_ids=[shared * 1000 + j for j in range(nid)]))
    for p in (3, 17, 25):
        rows.append(dict(input_tokens=int(rng.integers(1, 100)), output_tokens=int(rng.integers(1, 60)),
                         parent_request_id=p, think_s=float(rng.choice([0.0, 0.01, 0.3])),
                         session_id=p))
    return make_workload(rows, prefix_block_tokens=16)


@pytest.mark.parametrize("seed,num_blocks,steps", [(0, 1000, True), (1, 1000, False),
                                                   (2, 60, True), (3, 45, False), (4, 4000, True),
                                                   (1, 36, True), (4, 45, False)])
def test_stretches_past_finishes_equal_per_step(seed, num_blocks, steps):
    """A dense decode stretch with nothing waiting goes on past requests that finish inside it
    (DecodeStretch.finishing_end): the requests, steps and counters equal the per-step loop's,
    bit for bit, with small pools (the stretch cut by free blocks; preemptions) and a
    closed-loop child (its parent's finish ends the stretch); an admission step whose chunks
    complete their prompts is the stretch's first step (a preempted request re-admitted with
    one token to compute counts it as a decode token, as the per-step loop does). Both paths
    are taken (the decode stretch's public counters)."""
    wl = batch_workload(seed)
    a, sa, ra, sim = simulate(wl, num_blocks=num_blocks, steps=steps, fast_forward=True)
    b, sb, rb, _ = simulate(wl, num_blocks=num_blocks, steps=steps, fast_forward=False)
    dec = sim.stretch_counts()["decode"]
    assert dec["finished_inside"] > 0 and dec["admission_tokens"] > 0
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    pd.testing.assert_frame_equal(sa, sb, check_exact=True)
    assert (ra.num_steps, ra.sum_decode, ra.sum_prefill, ra.peak_blocks_used, ra.preemptions) == \
        (rb.num_steps, rb.sum_decode, rb.sum_prefill, rb.peak_blocks_used, rb.preemptions)


@pytest.mark.parametrize("seed,num_blocks,budget,steps", [
    (0, 1000, 64, True), (1, 1000, 100, False), (2, 90, 64, True), (3, 70, 128, True),
    (4, 130, 48, False), (5, 4000, 80, True), (6, 60, 32, True)])
def test_prefill_stretches_equal_per_step(seed, num_blocks, budget, steps):
    """A chunked prefill whose chunk takes the rest of the token budget while the other running
    requests decode is advanced several steps at once (PrefillStretch): requests, steps and
    counters equal the per-step loop's, bit for bit, with small pools (stretches cut by the
    free blocks; preemptions), prompts sharing prefixes, decodes finishing at a stretch's last
    step and closed-loop children. Stretches are taken in every case."""
    wl = chunk_workload(seed)
    o = [f"scheduler.max_num_batched_tokens={budget}"]
    a, sa, ra, sim = simulate(wl, *o, num_blocks=num_blocks, steps=steps, fast_forward=True)
    assert sim.stretch_counts()["prefill"]["taken"] >= 3
    b, sb, rb, _ = simulate(wl, *o, num_blocks=num_blocks, steps=steps, fast_forward=False)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    pd.testing.assert_frame_equal(sa, sb, check_exact=True)
    assert (ra.num_steps, ra.sum_decode, ra.sum_prefill, ra.peak_blocks_used, ra.preemptions) == \
        (rb.num_steps, rb.sum_decode, rb.sum_prefill, rb.peak_blocks_used, rb.preemptions)


@pytest.mark.parametrize("seed,n,num_blocks,budget,thr", [(711486, 20, 60, 256, 40),
                                                          (3, 30, 60, 256, 40),
                                                          (5, 30, 80, 128, 32)])
def test_decode_stretch_ends_before_it_takes_the_waiting_heads_hit(seed, n, num_blocks, budget,
                                                                    thr):
    """With a request waiting whose chunk is capped (here by long_prefill_token_threshold), a
    decode stretch whose new blocks take one of the head's prefix-hit blocks off the free queue
    ends before that step (sim.stretches.common.head_hit_step): the head's hit is cut there while hit
    blocks after it are still free, so the head may fit where it did not. Requests and steps
    equal the per-step loop's, exactly."""
    wl = chunk_workload(seed, n=n)
    o = [f"scheduler.max_num_batched_tokens={budget}",
         f"scheduler.long_prefill_token_threshold={thr}"]
    a, sa, ra, _ = simulate(wl, *o, num_blocks=num_blocks, fast_forward=True)
    b, sb, rb, _ = simulate(wl, *o, num_blocks=num_blocks, fast_forward=False)
    pd.testing.assert_frame_equal(a, b, check_exact=True)
    pd.testing.assert_frame_equal(sa, sb, check_exact=True)


from hypothesis import HealthCheck, given, settings, strategies as st


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(st.tuples(st.floats(0, 3), st.integers(1, 200), st.integers(1, 60),
                            st.integers(0, 3)), min_size=1, max_size=30),
    num_blocks=st.integers(4, 40),
    budget=st.sampled_from([16, 64, 512]),
    max_seqs=st.sampled_from([1, 4, 64]),
    chunked=st.booleans(),
)
def test_random_streams_keep_pool_invariants(rows, num_blocks, budget, max_seqs, chunked):
    """Random request streams never double-free, never exceed the pool, keep ref counts >= 0 and
    free + used = total after every step (check_invariants asserts these each step), and every
    request ends in exactly one terminal state."""
    rows = sorted(rows)
    wl = make_workload([
        dict(arrival_s=t, input_tokens=i, output_tokens=o,
             prefix_ids=[fam * 100 + j for j in range(-(-i // 16))])
        for t, i, o, fam in rows
    ], prefix_block_tokens=16)
    extra = [] if chunked else [f"model.max_model_len={budget}"]  # vLLM: budget >= max_model_len
    req, steps, rec, sim = simulate(
        wl, f"scheduler.max_num_batched_tokens={budget}", f"scheduler.max_num_seqs={max_seqs}",
        f"scheduler.enable_chunked_prefill={chunked}", *extra, num_blocks=num_blocks)
    assert len(req) == len(rows) and req.request_id.is_unique
    assert set(req.status) <= {"finished", "rejected"}
    assert (steps.blocks_used <= num_blocks).all() and (steps.blocks_used >= 0).all()
    assert sim.pool.num_used == 0 and sim.pool.num_free == num_blocks
    assert (req.prefix_hit_tokens % 16 == 0).all()


def _tie_rows(a1, a2):
    def doc(d, tokens, t, out):
        return dict(arrival_s=t, input_tokens=tokens, output_tokens=out,
                    prefix_ids=[d * 10_000 + j for j in range(tokens // 16)])
    return ([doc(i, 512, 0.0, 600) for i in range(3)] + [doc(10, 900, 0.5, 50)]
            + [doc(11, 64, a1, 20), doc(12, 64, a2, 20)])


@pytest.mark.parametrize("extra", [[], ["policy=triattention", "policy.budget=128",
                                        "policy.beta=64", "compaction=forward_pack"]])
def test_arrival_created_inside_a_step_at_its_exact_end_waits_for_the_scheduling(tmp_path, extra):
    """An arrival inside a decode step whose next arrival lands exactly at that step's end:
    SimPy runs the step's end first (its timeout was created earlier), so the scheduling there
    does not see the second arrival. Fast-forward stretches (dense, and compression ones that
    pass arrivals behind a blocked head) give the same tables as the per-step loop, exactly,
    for ten such steps of a run, dense and with compression."""
    from sim.run import run_simulation

    def run(rows, ff, d):
        cfg = compose_config([*SINGLE_ENGINE, "sim.progress=false", f"sim.fast_forward={ff}",
                              "cache.num_gpu_blocks=120", *extra])
        run_simulation(cfg, d, workload=make_workload(rows, prefix_block_tokens=16))
        return {t: pd.read_parquet(d / f"{t}.parquet") for t in ("requests", "steps")}

    st = run(_tie_rows(1e5, 1e5 + 1), "false", tmp_path / "cal")["steps"]
    t = st.time_s.to_numpy()
    ok = np.flatnonzero(st.waiting.to_numpy()[:-1] >= 1)  # a blocked head waits
    assert len(ok) > 100
    for j in ok[np.linspace(0, len(ok) - 1, 10).astype(int)].tolist():
        rows = _tie_rows((t[j] + t[j + 1]) / 2, float(t[j + 1]))  # 2nd: the step's end, exactly
        a, b = (run(rows, ff, tmp_path / f"{ff}{j}") for ff in ("true", "false"))
        for name in ("requests", "steps"):
            pd.testing.assert_frame_equal(a[name], b[name], check_exact=True, obj=f"{name} {j}")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-5, 300), max_size=40), st.integers(0, 300), st.integers(1, 64))
def test_block_pairs_equal_the_numpy_expansion(first, last, B):
    """The compiled (request, step) pairs of a stretch's new blocks equal their numpy
    expansion: counts, request-major order, steps (requests past the stretch get none)."""
    from sim.stretches.common import block_pairs as _block_pairs

    f = np.asarray(first + [np.iinfo(np.int64).max // 2], dtype=np.int64)
    cnt, pi, ps = _block_pairs(f, last, B)
    want_cnt = np.where(f <= last, (last - f) // B + 1, 0)
    n = int(want_cnt.sum())
    want_pi = np.repeat(np.arange(len(f)), want_cnt)
    want_ps = np.repeat(f, want_cnt) + B * (np.arange(n) - np.repeat(np.cumsum(want_cnt) - want_cnt, want_cnt))
    assert cnt.tolist() == want_cnt.tolist()
    assert pi.tolist() == want_pi.tolist() and ps.tolist() == want_ps.tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 250)), min_size=1, max_size=30),
       st.integers(2, 200), st.integers(1, 32), st.integers(0, 400),
       st.none() | st.tuples(st.integers(0, 3000), st.integers(2, 600)))
def test_stretch_pairs_equal_the_request_major_pairs_sorted_by_step(rows, k, B, free, chunk):
    """The compiled layout of a decode stretch's new blocks (sim.engine._stretch_pairs) equals
    the numpy one it replaced: request i's pairs at steps s0, s0 + B, ... up to k or its last
    step (s0 = 2 + (-(slot0 + 1)) mod B), blocks per step, k cut to the last step whose
    cumulative need fits ``free``, the pairs in allocation order (a stable sort of the
    request-major pairs by step). ``chunk = (computed, c)``: a prefill computing ``c`` more
    prompt tokens a step also takes its new blocks from ``free`` (``extra``)."""
    from sim.stretches.common import NO_EXTRA as _NO_EXTRA, block_pairs as _block_pairs, stretch_pairs as _stretch_pairs

    s = np.asarray([r[0] for r in rows], dtype=np.int64)
    last = np.asarray([r[1] for r in rows], dtype=np.int64)
    b = len(s)
    s0 = 2 + (-(s + 1)) % B
    _, want_pi, want_ps = _block_pairs(s0, k, B)
    mine = want_ps <= last[want_pi]  # (a request takes no block after its last step)
    want_pi, want_ps = want_pi[mine], want_ps[mine]
    alloc = np.bincount(want_ps, minlength=k + 1)
    extra = _NO_EXTRA
    cum = np.cumsum(alloc)
    if chunk is not None:  # the prefill's blocks after step s, less those after step s - 1
        cp, c = chunk
        nb = [-(-(cp + s_ * c) // B) for s_ in range(k + 1)]
        extra = np.asarray([0, 0] + [nb[s_] - nb[s_ - 1] for s_ in range(2, k + 1)], dtype=np.int64)
        cum = np.cumsum(alloc + extra)
    want_k = k if cum[k] <= free else int(np.searchsorted(cum, free, side="right")) - 1
    keep = want_ps <= want_k
    order = np.argsort(want_ps[keep], kind="stable")
    n_max = b * ((k - 2) // B + 1)
    got_alloc = np.empty(k + 1, dtype=np.int64)
    pi = np.empty(n_max, dtype=np.int64)
    ps = np.empty(n_max, dtype=np.int64)
    got_k, n = _stretch_pairs(s, last, B, k, free, extra, got_alloc, pi, ps)
    assert got_k == want_k
    if want_k < 2:
        return  # (the stretch is not taken)
    assert got_alloc[:got_k + 1].tolist() == alloc[:want_k + 1].tolist()
    assert n == int(keep.sum())
    assert pi[:n].tolist() == want_pi[keep][order].tolist()
    assert ps[:n].tolist() == want_ps[keep][order].tolist()


_COST_MODELS = {}


def _cost_model(i):
    """The analytic cost model of Llama-3.1-8B on H100 (0) or Qwen3-8B on H200 (1), or the
    calibrated one of Qwen3-8B on H200 (2), built once."""
    if i not in _COST_MODELS:
        cfg = compose_config([["model=llama3_1_8b", "gpu=h100"], ["model=qwen3_8b"],
                              ["model=qwen3_8b", "gpu=h200", "cost=calibrated"]][i])
        _COST_MODELS[i] = build_cost_model(cfg.model, cfg.gpu, cfg.cache, cfg.cost)
    return _COST_MODELS[i]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200_000), st.integers(1, 400)), min_size=1, max_size=40),
       st.integers(1, 400), st.floats(0, 1e5), st.floats(0.0, 3.0), st.sampled_from([0, 1]))
def test_finishing_stretch_times_compiled_equal_the_runs_between_finishes(rows, k, start, span,
                                                                          model):
    """AnalyticCostModel.stretch_times of a stretch whose requests leave as they finish
    (``fin``): its compiled loop equals its fallback, one pure-decode stretch per run of steps
    between finishes (here through the numpy step
    times): same steps, same bits, stopped at the same step."""
    import copy

    cm = copy.copy(_cost_model(model))
    ctx = np.asarray([r[0] for r in rows], dtype=np.int64)
    fin = np.asarray([r[1] for r in rows], dtype=np.int64)
    k = min(k, int(fin.max()))  # (somebody runs to the stretch's end)
    stop = start + span if span < 2.5 else np.inf
    d1, e1 = cm.stretch_times(StretchShape(ctx, k, fin=fin), start, stop)
    cm._dense_decode_args = lambda ctx0: None  # the fallback's runs, numpy step times
    d2, e2 = cm.stretch_times(StretchShape(ctx, k, fin=fin), start, stop)
    assert d1.tolist() == d2.tolist() and e1.tolist() == e2.tolist()
    assert len(e1) == k or (e1[-1] >= stop and (len(e1) == 1 or e1[-2] < stop))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200_000), st.integers(1, 9000)), min_size=1, max_size=30),
       st.integers(1, 60), st.floats(0, 1e5), st.floats(0.0, 3.0), st.sampled_from([0, 1, 2]))
def test_stretch_times_of_a_chunked_stretch_equal_step_time_per_step(rows, k, start, span, model):
    """AnalyticCostModel.stretch_times of a chunked stretch (``new_tokens``; integer sums moved a step at a time; the
    calibrated model calls step_time per step) equals step_time called on each step's arrays,
    added to the clock one step at a time: same bits, stopped at the first step that ends at
    or after ``stop``."""
    cm = _cost_model(model)
    n = np.asarray([r[1] for r in rows], dtype=np.int64)
    ctx = np.asarray([r[0] for r in rows], dtype=np.int64)
    samples = int((n == 1).sum())
    stop = start + span if span < 2.5 else np.inf
    first = cm.step_time(n, ctx, samples)
    d1, e1 = cm.stretch_times(StretchShape(ctx, k, new_tokens=n, samples=samples, first_s=first),
                              start, stop)
    d1, e1 = d1.tolist(), e1.tolist()
    d2, e2 = [first], [start + first]
    c = ctx.copy()
    while len(e2) < k and e2[-1] < stop:
        c += n
        d2.append(cm.step_time(n, c, samples))
        e2.append(e2[-1] + d2[-1])
    assert d1 == d2 and e1 == e2


@given(k=st.integers(1, 4), steps=st.booleans(), seed=st.integers(0, 2**16))
@settings(max_examples=30, deadline=None)
def test_recorder_counts_a_stretchs_columns_as_python_numbers(k, steps, seed):
    """Recorder.record of a stretch's numpy columns (shape (k,), k = 1 included), with or
    without per-step rows, leaves the counters Python ints equal to the columns' sums (prefill,
    decode) and maximum (peak blocks), as k calls with each step's numbers do."""
    rng = np.random.default_rng(seed)
    pre, dec, used = (rng.integers(0, 1_000, size=k) for _ in range(3))
    durs = rng.uniform(1e-3, 0.05, size=k)
    starts = np.cumsum(durs) - durs
    cols = [np.full(k, 3), np.full(k, 2)]
    a = Recorder(1, np.zeros(1, dtype=np.int64), record_steps=steps)
    b = Recorder(1, np.zeros(1, dtype=np.int64), record_steps=steps)
    if steps:
        a.record(k, starts, durs, *cols, pre, dec, used, np.full(k, 5), np.full(k, 9))
    else:
        a.record(k, None, None, None, None, pre, dec, used, None, None)
    for s in range(k):
        b.record(1, float(starts[s]), float(durs[s]), 3, 2, int(pre[s]), int(dec[s]),
                 int(used[s]), 5, 9)
    for r in (a, b):
        assert all(type(v) is int for v in (r.num_steps, r.sum_prefill, r.sum_decode,
                                            r.peak_blocks_used))
    assert (a.num_steps, a.sum_prefill, a.sum_decode, a.peak_blocks_used) == (
        k, int(pre.sum()), int(dec.sum()), int(used.max()))
    assert (b.num_steps, b.sum_prefill, b.sum_decode, b.peak_blocks_used) == (
        a.num_steps, a.sum_prefill, a.sum_decode, a.peak_blocks_used)


def test_a_decode_stretchs_rows_equal_its_steps_recorded_one_by_one():
    """The rows a pure-decode stretch writes in one compiled pass into Recorder.reserve_steps
    (sim.stretches.decode.fill_decode_rows), with its Recorder.count, equal k calls of
    Recorder.record(1, ...) with each step's numbers (the per-step loop's path) and one
    Recorder.record of the stretch's numpy columns: rows, counters and peak, across buffer
    growth."""
    from sim.stretches.decode import fill_decode_rows

    rng = np.random.default_rng(7)
    a, b, c = (Recorder(1, np.zeros(1, dtype=np.int64)) for _ in range(3))
    for _ in range(40):
        k = int(rng.integers(2, 300))
        nb = int(rng.integers(1, 50))
        start = float(rng.uniform(0, 100))
        durs = rng.uniform(1e-3, 0.05, size=k)
        cum = np.cumsum(np.concatenate(([start], durs)))[1:]
        alloc = np.concatenate(([0, 0], rng.integers(0, 3, size=k - 1)))
        ev = np.concatenate(([0, 0], rng.integers(0, 2, size=k - 1)))
        used1, cf1, live0, w0 = (int(x) for x in rng.integers(0, 10_000, size=4))
        last = tuple(int(x) for x in rng.integers(0, 10_000, size=5))
        for r in (a, b, c):
            r.peak_blocks_used = 0  # (each stretch's own peak, compared below)
        i, cols = a.reserve_steps(k)
        a.count(k, 0, nb * k, fill_decode_rows(*cols, i, start, cum, durs, nb, w0, used1, alloc,
                                               cf1, ev, live0, *last))
        starts = np.concatenate(([start], cum[:-1]))
        used = used1 + np.cumsum(alloc[1:])
        cached_free = cf1 - np.cumsum(ev[1:])
        live = live0 + np.arange(1, k + 1) * nb
        running = np.full(k, nb)
        waiting = np.full(k, w0)
        running[-1], waiting[-1], used[-1], cached_free[-1], live[-1] = last
        for s in range(k):
            b.record(1, float(starts[s]), float(durs[s]), int(running[s]), int(waiting[s]), 0,
                     nb, int(used[s]), int(cached_free[s]), int(live[s]))
        c.record(k, starts, durs, running, waiting, 0, nb, used, cached_free, live)
        assert a.peak_blocks_used == b.peak_blocks_used == c.peak_blocks_used
    for r in (b, c):
        pd.testing.assert_frame_equal(a.steps_frame(), r.steps_frame(), check_exact=True)
        assert (a.num_steps, a.sum_decode, a.sum_prefill) == (r.num_steps, r.sum_decode,
                                                              r.sum_prefill)


def test_first_compile_is_announced_once(tmp_path):
    """With an empty numba cache the first kernel's compile is announced on stderr, once (the
    first run of an install spends seconds compiling); once cached, not."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    cmd = [sys.executable, "-c", "import numpy as np, sim.clock as c; "
           "assert c.step_ends(1.0, np.ones(2)).tolist() == [2.0, 3.0]"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0 and again.returncode == 0, first.stderr + again.stderr
    assert first.stderr.count("kvsim: compiling the simulator's kernels") == 1, first.stderr
    assert "compiling" not in again.stderr, again.stderr


@pytest.mark.parametrize("block_size", [1, 16])
def test_deferred_decode_block_is_allocated_before_its_registration(block_size):
    """_flush_grow with block_size 1: a decode token that starts a block also fills it, so the
    block the deferred allocation writes into the table is one the queued registration names;
    the registration must see the new id (the fused allocate-and-register call is taken only
    for block_size > 1). With 16 the queued block is an older one."""
    from sim.kv_manager import queue_registration as _queue_registration
    from sim.request import Request

    wl = make_workload([dict(arrival_s=0.0, input_tokens=40, output_tokens=2,
                             prefix_ids=[1, 2, 3, 4, 5])], prefix_block_tokens=8)
    *_, sim = simulate(wl, f"cache.block_size={block_size}", num_blocks=64)
    pool = sim.pool
    req = Request(0, 99, 0.0, 3 * block_size, 4)
    req.keys = np.arange(4, dtype=np.int64) * (1 << 40) + 7
    req.blocks = np.full(4, -1, dtype=np.int64)
    if block_size == 1:  # blocks 0, 1 held; the token at position 2 starts and fills block 2
        req.blocks[:2] = pool.allocate(2)
        req.n_blocks, req.n_cached = 2, 2
        full = 3
    else:  # blocks 0..2 held, block 1 just filled; the next token starts block 3
        req.blocks[:3] = pool.allocate(3)
        req.n_blocks, req.n_cached = 3, 1
        full = 2
    pool.cache_blocks(req.blocks[:req.n_cached], req.keys[:req.n_cached])
    reg = ([], [])
    _queue_registration(req, full, reg)
    sim.kv.flush_grow([req], reg)
    assert req.n_blocks == (3 if block_size == 1 else 4) and (req.blocks[:req.n_blocks] >= 0).all()
    held = req.blocks[:full]
    assert pool.block_hash[held].tolist() == req.keys[:full].tolist()
    assert pool.lookup_prefix(req.keys, full).tolist() == held.tolist()
    pool.check(req.blocks[:req.n_blocks])


def _turns(reuse: bool, *extra, **kw):
    """Two turns of one chat (G = 16): 100 prompt + 50 answer tokens, then the history resent
    with 30 new tokens; the second turn arrives when the first finishes."""
    wl = make_workload([
        dict(arrival_s=0.0, input_tokens=100, output_tokens=50, prefix_ids=list(range(1, 7))),
        dict(arrival_s=0.0, input_tokens=180, output_tokens=5, prefix_ids=list(range(1, 12)),
             parent_request_id=0, turn=1, session_id=0),
    ], prefix_block_tokens=16)
    return simulate(wl, f"cache.reuse_answer_blocks={str(reuse).lower()}", *extra, **kw)


def test_the_next_turn_hits_the_previous_answer():
    req, *_ = _turns(True)
    assert req.prefix_hit_tokens.tolist() == [0, 144]  # floor(149 / 16) = 9 blocks
    req, *_ = _turns(True, fast_forward=False)
    assert req.prefix_hit_tokens.tolist() == [0, 144]
    req, *_ = _turns(False)
    assert req.prefix_hit_tokens.tolist() == [0, 96]  # the previous prompt's 6 full blocks
    req, *_ = _turns(True, "cache.enable_prefix_caching=false")
    assert req.prefix_hit_tokens.tolist() == [0, 0]


def test_fast_forward_equals_per_step_with_answer_reuse(seed=0):
    """Multi-turn sessions whose turns hit their previous answers, in a pool that thrashes
    (preemptions, evictions): the fast-forward stretches equal the per-step loop."""
    from traces.loader import load_workload
    wl = load_workload({"name": "synthetic_multiturn", "format": "synthetic_multiturn",
                        "num_sessions": 12, "arrival_rate_per_s": 5.0, "think_time_mean_s": 0.5,
                        "output_mean": 120.0}, seed=seed)
    args = ("scheduler.max_num_batched_tokens=512",)
    a, sa, ra, _ = simulate(wl, *args, num_blocks=300, fast_forward=True)
    b, sb, rb, _ = simulate(wl, *args, num_blocks=300, fast_forward=False)
    ints = ["prefix_hit_tokens", "computed_prompt_tokens", "preemptions"]
    pd.testing.assert_frame_equal(a[ints + ["status"]], b[ints + ["status"]])
    np.testing.assert_allclose(a.finish_s, b.finish_s, rtol=1e-9, atol=1e-12)
    cols = ["running", "waiting", "prefill_tokens", "decode_tokens", "blocks_used",
            "blocks_cached_free", "live_kv_tokens"]
    pd.testing.assert_frame_equal(sa[cols], sb[cols])
    c, *_ = simulate(wl, *args, "cache.reuse_answer_blocks=false", num_blocks=300)
    assert a.prefix_hit_tokens.sum() > c.prefix_hit_tokens.sum()


@pytest.mark.parametrize("fast_forward", [True, False])
def test_peak_blocks_count_a_request_that_finishes_in_its_first_step(fast_forward):
    """A 1,000-token prompt with 1 output token holds ceil(1000 / 16) = 63 blocks during its
    only step and frees them at its end: the step's row and the pool's peak count the 63
    (the row counts what the step ran with); a trace of such requests peaks at its largest
    batch."""
    wl = make_workload([dict(arrival_s=0.0, input_tokens=1000, output_tokens=1)])
    req, steps, rec, sim = simulate(wl, fast_forward=fast_forward)
    assert req.peak_blocks.tolist() == [63]
    assert steps.blocks_used.tolist() == [63] and steps.running.tolist() == [1]
    assert rec.peak_blocks_used == sim.pool.peak_used == 63
    wl = make_workload([dict(arrival_s=0.0, input_tokens=100, output_tokens=1)] * 3
                       + [dict(arrival_s=5.0, input_tokens=40, output_tokens=1)])
    req, steps, rec, sim = simulate(wl, fast_forward=fast_forward)
    assert steps.blocks_used.tolist() == [3 * 7, 3] and steps.running.tolist() == [3, 1]
    assert rec.peak_blocks_used == 3 * 7


def test_summary_reports_net_blocks_saved_beside_gross_frees(tmp_path):
    """h2o + forward_pack on a Weka slice: the gross frees (every round's freed blocks, a block
    freed and taken back counted each time) exceed the net saving at finish (dense blocks -
    blocks held), which is at most the evicted tokens' worth of blocks; without a policy the
    net saving is 0. The time-averaged blocks used is the steps' duration-weighted mean."""
    from sim.run import run_simulation
    base = [*SINGLE_ENGINE, "trace=weka_agentic_slice", "trace.max_requests=6", "sim.progress=false"]
    s = run_simulation(compose_config(base + ["policy=h2o", "compaction=forward_pack"]),
                       tmp_path / "h2o")
    assert s["blocks_freed_total"] > s["blocks_saved_net"] > 0
    assert s["blocks_saved_net"] <= s["tokens_evicted_total"] / 16 + s["requests_finished"]
    full = run_simulation(compose_config(base), tmp_path / "full")
    assert full["blocks_saved_net"] == 0 and full["blocks_freed_total"] == 0
    steps = pd.read_parquet(tmp_path / "full" / "steps.parquet")
    want = (steps.blocks_used * steps.duration_s).sum() / steps.duration_s.sum()
    assert full["blocks_used_time_mean"] == pytest.approx(want, rel=1e-12)
    assert s["blocks_used_time_mean"] < full["blocks_used_time_mean"]
