"""The chunked-prefill stretch: a prompt computed chunk by chunk while the other running requests
decode, each step taking the whole token budget (dense runs without tiers)."""

from __future__ import annotations

import numpy as np

from ..clock import advance_to
from ..cost import StretchShape
from .base import Stretch
from .common import commit_decodes, stretch_pairs


class PrefillStretch(Stretch):
    """Chunked-prefill stretches of one engine (``sim``)."""

    name = "prefill"

    def eligible(self, plan, dt: float, hold: float | None) -> bool:
        """Dense runs without tiers: a chunked-prefill step the next ones repeat
        (:meth:`sim.scheduler.Scheduler.prefill_chunk_step`), no write-back hold, and no
        event before the step's end."""
        sim = self.sim
        return (hold is None and sim.admit_in_stretches and sim.sched.prefill_chunk_step(plan)
                and sim.env.peek() > sim.env.now + dt)

    def start(self, plan, n_arr, ctx_arr, dt: float, extra_dt: float, hold: float | None):
        return self.advance(plan.reqs, n_arr, ctx_arr, dt)

    def advance(self, reqs, n_arr, ctx_arr, dt: float):
        """Advance ``k`` steps of a chunked prefill in one SimPy timeout when it is exact (dense
        runs without tiers; the first step, of ``dt`` s, scheduled by :meth:`Scheduler.schedule` and
        checked by :meth:`Scheduler.prefill_chunk_step`).

        Each step every running request but the last decodes one token and the last, ``P``, computes
        the next ``c = max_num_batched_tokens - decodes`` tokens of its prompt: the whole token
        budget, so the scheduler (running requests first, as vLLM's) tries no waiting request. ``k``
        is bounded by the step before ``P``'s last chunk (a smaller one leaves budget for an
        admission), by the first decode finish (the stretch ends with that step, as
        :meth:`DecodeStretch.advance` without its finishing stretch), by the next pending SimPy
        event (the step during which it lands, :meth:`Simulator.tie_inside` as there) and by the
        free blocks (a step that would preempt runs through the scheduler).

        Each step's pool calls are the scheduler's, in its order: the decodes' new blocks (in
        running order), then ``P``'s new blocks and the registration of its blocks now full
        (:meth:`KVManager.grow`: ``P``'s prompt keys may be held by free blocks that a later step
        evicts, so registrations and evictions keep their order). The blocks decode tokens fill
        are registered in one call at the end (their keys are unique to their requests). Step
        times are :meth:`AnalyticCostModel.step_time`'s for each step's batch
        (:meth:`AnalyticCostModel.stretch_times` with ``new_tokens``); the rows are the per-step loop's.
        Returns ``k`` (0 = not taken, nothing changed)."""
        sim = self.sim
        env = sim.env
        pool = sim.pool
        B = sim.B
        b = len(reqs)
        p = reqs[-1]
        c = int(n_arr[-1])
        cp = p.n_computed  # before step 1
        k = (p.input + p.n_generated - cp - 1) // c  # steps with a full chunk before the last
        dec = reqs[:-1]
        fin = [r.output - r.n_generated for r in dec]  # the step each decode finishes at
        if fin:
            f = min(fin)
            if f < k:
                k = f
        if k < 2:
            return 0
        t_next = env.peek()
        if sim.max_sim_time is not None:
            t_next = min(t_next, float(sim.max_sim_time))
        # step times up to the step during which the next event lands: step s's batch is
        # step 1's with every request s - 1 chunks further
        durs, ends = sim.cost.stretch_times(
            StretchShape(ctx_arr, k, new_tokens=n_arr, samples=b - 1, first_s=dt), env.now,
            t_next)
        k = len(ends)
        t = ends[-1]
        if t >= t_next:
            j = k - 1
            if t != t_next and sim.tie_inside(float(ends[j - 1]) if j else env.now, float(t)):
                k = j
        if k < 2:
            return 0
        # new blocks: the decodes' (by step, then running order) and P's (``extra``: its
        # blocks after step s less those after step s - 1), cut to the steps whose cumulative
        # need fits the free blocks
        alloc = np.empty(k + 1, dtype=np.int64)
        n_max = (b - 1) * ((k - 2) // B + 1)
        pi = np.empty(n_max, dtype=np.int64)
        ps = np.empty(n_max, dtype=np.int64)
        nb = np.arange(k + 1, dtype=np.int64)
        nb *= c
        nb += cp + B - 1
        nb //= B  # (ceil((cp + s c) / B): P's blocks after step s)
        extra = np.zeros(k + 1, dtype=np.int64)
        extra[2:] = nb[2:] - nb[1:-1]
        k, n_pairs = stretch_pairs(np.ascontiguousarray(ctx_arr[:-1]),
                                    np.array(fin, dtype=np.int64), B, k, pool.num_free, extra,
                                    alloc, pi, ps)
        if k < 2:
            return 0
        alloc = alloc.tolist()
        pi = pi[:n_pairs]
        ps = ps[:n_pairs]
        durs = durs[:k]
        ends = ends[:k]
        used = np.empty(k, dtype=np.int64)
        cfree = np.empty(k, dtype=np.int64)
        used[0] = pool.num_used
        cfree[0] = pool.num_cached_free
        blocks = np.empty(n_pairs, dtype=np.int64)
        j = 0
        for s in range(2, k + 1):
            nd = alloc[s]
            if nd:
                pool.allocate_into(blocks[j:j + nd])
                j += nd
            if not sim.kv.grow(p, cp + s * c):  # (the need was checked above)
                raise RuntimeError("allocation failed after capacity check")
            used[s - 1] = pool.num_used
            cfree[s - 1] = pool.num_cached_free
        for i, blk in zip(pi.tolist(), blocks.tolist()):  # (by step: each table in order)
            r = dec[i]
            r.blocks[r.n_blocks] = blk
            r.n_blocks += 1
        start = env.now
        waiting0 = len(sim.waiting)
        yield from advance_to(env, float(ends[-1]))
        now = env.now
        # commit: the decodes computed and sampled k tokens, P computed k chunks
        reg = ([], [])
        finished = commit_decodes(sim, dec, fin, k, ends, now, reg)
        p.n_computed = cp + k * c
        sim.kv.flush_grow([], reg)
        if finished:
            sim.retire_finished()
        rec = sim.rec
        running = np.full(k, b, dtype=np.int64)
        waiting = np.full(k, waiting0, dtype=np.int64)
        # live KV tokens after each step: the scheduled requests' computed tokens (the rows
        # count the requests and blocks each step ran with, the last one's finishing requests
        # included; the waiting count after it, with the requests they release)
        live = np.arange(1, k + 1, dtype=np.int64)
        live *= sim.max_tokens
        live += int(np.add.reduce(ctx_arr))
        waiting[-1] = len(sim.waiting)
        starts = np.empty(k, dtype=np.float64)
        starts[0] = start
        starts[1:] = ends[:-1]
        rec.record(k, starts, np.array(durs, dtype=np.float64), running, waiting, int(c),
                   int(b) - 1, used, cfree, live)
        if sim.check:
            sim.check_invariants()
        return k
