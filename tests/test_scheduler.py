"""The scheduler (sim.scheduler): its pass over the running requests."""

from functools import lru_cache

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_workload
from sim.cost_models import build_cost_model
from sim.engine import Simulator
from sim.metrics import Recorder
from sim.request import RUNNING, Request
from omegaconf import OmegaConf

from sim.run import compose_config

# one running request: (prompt tokens, tokens generated (0: still in its prefill), prompt tokens
# computed if in its prefill, a block beyond its tokens' slots, its blocks registered (fraction))
RUNNING_REQUEST = st.tuples(st.integers(1, 300), st.integers(0, 40), st.integers(0, 299),
                            st.booleans(), st.floats(0, 1))


@lru_cache(maxsize=1)
def _base_config():
    return compose_config([])


def _engine(rows, num_blocks, block_size, budget, long_thr, caching):
    """A simulator whose running list holds ``rows`` (RUNNING_REQUEST tuples) with their blocks
    allocated (and the leading ones registered) in order; None when the pool cannot hold them."""
    cfg = OmegaConf.merge(_base_config(), {
        "cache": {"num_gpu_blocks": num_blocks, "block_size": block_size,
                  "enable_prefix_caching": caching},
        "scheduler": {"max_num_batched_tokens": budget, "long_prefill_token_threshold": long_thr,
                      "max_num_seqs": 64}})
    wl = make_workload([dict(arrival_s=0.0, input_tokens=8, output_tokens=1)])
    cost = build_cost_model(cfg.model, cfg.gpu, cfg.cache, cfg.cost)
    rec = Recorder(len(wl), wl.table.column("session_id").to_numpy())
    sim = Simulator(wl, num_blocks, block_size, cfg.scheduler, cfg.cache, cost,
                    cfg.model.max_model_len, rec)
    B = block_size
    for i, (inp, gen, pre, extra, frac) in enumerate(rows):
        req = Request(i, i, 0.0, inp, gen + 5)
        req.n_generated = gen
        req.n_computed = inp + gen - 1 if gen else min(pre, inp - 1)
        req.prefill_end = inp
        total = -(-(inp + gen + 5) // B) + 1
        req.total_blocks = total
        req.keys = (np.arange(total, dtype=np.int64) + 1) * 1_000_003 + i * (1 << 32)
        req.blocks = np.full(total, -1, dtype=np.int64)
        nb = min(-(-req.n_computed // B) + int(extra), total)
        if nb > sim.pool.num_free:
            return None
        req.blocks[:nb] = sim.pool.allocate(nb)
        req.n_blocks = req.peak_blocks = nb
        req.n_cached = int(frac * (req.n_computed // B)) if caching else 0
        if req.n_cached:
            sim.pool.cache_blocks(req.blocks[:req.n_cached], req.keys[:req.n_cached])
        req.status = RUNNING
        sim.running.append(req)
    return sim


def _state(sim, result):
    """What a pass leaves: its result (requests by index) and every request's, queue's and
    the pool's state."""
    reqs, tokens, ctx, budget, samples, decodes, preempted = result
    by_idx = {}
    for req in list(sim.running) + list(sim.waiting):
        by_idx[req.idx] = (req.n_blocks, req.n_cached, req.blocks[:req.n_blocks].tolist(),
                           req.status, req.preemptions, req.n_computed,
                           req.computed_prompt_tokens, req.peak_blocks)
    pool = sim.pool
    return ([r.idx for r in reqs], tokens, ctx, budget, samples, decodes, preempted,
            [r.idx for r in sim.running], [r.idx for r in sim.waiting], by_idx,
            pool.num_free, pool.num_cached_free, pool.ref_cnt.tolist(),
            pool.block_hash.tolist(), pool.free_seq.tolist(), sim.rec.preemptions)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(RUNNING_REQUEST, min_size=1, max_size=24),
       num_blocks=st.integers(1, 120), block_size=st.sampled_from([1, 4, 16]),
       budget=st.sampled_from([64, 100, 512, 8192]), long_thr=st.sampled_from([0, 1, 7, 50]),
       caching=st.booleans())
def test_dense_pass_equals_the_running_pass(rows, num_blocks, block_size, budget, long_thr,
                                            caching):
    """Without a compression policy the scheduler's dense pass over the running requests gives
    the general pass's result (scheduled requests, tokens, contexts, budget left, samples,
    decodes, preemption) and leaves the same block tables, registrations, queues and pool
    (free queue order included), for running lists mixing decodes, prefill chunks, blocks to
    allocate and register, and pools too short (deferred blocks past the free ones,
    preemptions)."""
    sims = [_engine(rows, num_blocks, block_size, budget, long_thr, caching) for _ in range(2)]
    if sims[0] is None:
        return
    out = []
    for sim, run_pass in zip(sims, (sims[0].sched.dense_pass, sims[1].sched.running_pass)):
        defer, reg = [], ([], [])
        result = run_pass(sim.max_tokens, defer, reg, sim.pool.num_free)
        if defer or reg[0]:
            sim.kv.flush_grow(defer, reg)
        out.append(_state(sim, result))
    assert out[0] == out[1]
