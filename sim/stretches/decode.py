"""The decode stretch: pure-decode steps of the running batch advanced in one SimPy timeout, also
past finishing requests when nothing waits (dense runs), and with compression and tiers up to
the next round, offload or admission point."""

from __future__ import annotations

import numpy as np

from ..block_pool import NO_HASH
from ..clock import advance_to
from ..cost import StretchShape
from ..jit import kernel
from ..request import FINISHED
from .base import Stretch
from .common import NO_EXTRA, commit_decodes, commit_stretch, flat, head_hit_step, stretch_pairs


class DecodeStretch(Stretch):
    """Decode stretches of one engine (``sim``)."""

    name = "decode"

    def __init__(self, sim):
        super().__init__(sim)
        # requests that finished before a stretch's last step (the stretch went on past them),
        # and the prefill tokens of admission steps that began a dense stretch
        self.finished_inside = 0
        self.admission_tokens = 0

    def counters(self) -> dict:
        """:meth:`Stretch.counters` with ``finished_inside`` and ``admission_tokens``."""
        return dict(super().counters(), finished_inside=self.finished_inside,
                    admission_tokens=self.admission_tokens)

    def eligible(self, plan, dt: float, hold: float | None) -> bool:
        """Runs whose compression rounds do not run inside stretches
        (:class:`sim.stretches.rounds.RoundsStretch` takes those): a pure-decode step, or
        (dense, without tiers) a decode step whose admissions complete their prompts; no
        write-back hold, and no event before the step's end."""
        sim = self.sim
        if hold is not None or sim.rounds_in_stretches:
            return False
        sched = sim.sched
        if not (sched.pure_decode(plan)
                or (sim.admit_in_stretches and sched.decode_and_admitted(plan, False))):
            return False
        return sim.env.peek() > sim.env.now + dt

    def start(self, plan, n_arr, ctx_arr, dt: float, extra_dt: float, hold: float | None):
        if plan.admitted:  # (the admission step becomes the stretch's first step)
            return self.advance(plan.reqs, ctx_arr, 0.0, (dt, plan.tokens[-plan.admitted:]))
        return self.advance(plan.reqs, ctx_arr, extra_dt)

    def advance(self, reqs, ctx0, extra_first: float = 0.0, admitted=None):
        """Advance ``k`` pure-decode steps in one SimPy timeout when it is exact.

        The first step's slots were allocated by the scheduler. ``k`` is bounded by the first finish
        (every running request samples one token per step; without compression, tiers and waiting
        requests, by the last finish or the first that releases closed-loop children instead, the
        finished requests leaving the batch at their steps:
        :meth:`AnalyticCostModel.stretch_times` with ``fin``,
        :meth:`DecodeStretch.finishing_end`), by the next pending SimPy event (an arrival or a
        closed-loop release: the run stops at the step during which it happens, as the per-step loop
        would see it at that step's end), and by the free blocks (the step that would need a
        preemption runs through the normal path), and with tiers and a waiting request by
        :meth:`DecodeStretch.tier_cap`; with compression, by the next round point (compression runs
        without tiers or sliding-window layers take :meth:`RoundsStretch.advance`, which runs the
        rounds inside the stretch). Blocks are allocated in the per-step order (step, then running
        order), so pool state, prefix-cache evictions and recorded steps equal the per-step loop's.
        Returns ``k`` (0 = not taken).

        ``admitted = (dt, chunks)`` (dense runs without tiers): the step just scheduled also
        admitted the last ``len(chunks)`` of ``reqs`` with those prompt chunks (tokens), each
        completing its prompt (:meth:`Scheduler.decode_and_admitted`); it becomes the stretch's
        first step, of ``dt`` s (its :meth:`step_time`), and they decode from the second. """
        sim = self.sim
        env = sim.env
        B = sim.B
        b = len(reqs)
        fin = [r.output - r.n_generated for r in reqs]  # the step each request finishes at
        k = k_first = min(fin)
        comp = sim.comp
        # With nothing waiting and neither compression nor tiers, a finish changes nothing the
        # next steps depend on but the batch (the finished request leaves; its cached blocks
        # join the free queue's tail, behind every block the stretch takes from its head, and
        # its unhashed blocks the head, which the stretch's next allocations take:
        # DecodeStretch.allocate_finishing), so the stretch goes on past it, up to the last finish or the
        # first finish that releases closed-loop children (their arrival is an event)
        inner = False
        if k < max(fin) and comp is None and sim.tiers is None and not sim.waiting:
            k_all = max(fin)
            if sim.children:
                kids = sim.children
                for r, f in zip(reqs, fin):
                    if f < k_all and r.idx in kids:
                        k_all = f
            if k_all > k:
                k = k_all
                inner = True
        if k < 2:
            return 0
        if comp is not None:
            for r in reqs:
                if r.layout is not None and r.next_round is not None:
                    k = min(k, r.next_round - r.n_computed)  # the round fires at that step's end
            if k < 2:
                return 0
        # slot index of each request's step-1 token (dense: its position, = its context in
        # ``ctx0``; compressed: physical)
        if comp is None:
            slot0 = ctx0
            if admitted is not None:  # (their step-1 token: the last of their chunk)
                na = len(admitted[1])
                slot0 = ctx0.copy()
                slot0[-na:] += np.asarray(admitted[1], dtype=np.int64) - 1
        else:
            slot0 = np.fromiter((r.n_computed if r.layout is None else r.phys_base + r.pending - 1
                                 for r in reqs), dtype=np.int64, count=b)
        t_next = env.peek()
        if sim.max_sim_time is not None:
            t_next = min(t_next, float(sim.max_sim_time))
        # step durations up to the step during which the next event lands (round costs
        # charged to the first step)
        fin_a = np.array(fin, dtype=np.int64)
        if admitted is not None:
            t1 = env.now + admitted[0]  # (the per-step loop's clock after the first step)
            if t1 >= t_next:
                return 0
            keep = fin_a > 1  # (the step-1 finishers leave; the others from step 2 on)
            durs, cum = sim.cost.stretch_times(
                StretchShape(slot0[keep] + 1, k - 1, fin=fin_a[keep] - 1), t1, t_next)
            durs = np.concatenate(([admitted[0]], durs))
            cum = np.concatenate(([t1], cum))
        elif inner:
            durs, cum = sim.cost.stretch_times(StretchShape(ctx0, k, fin=fin_a), env.now,
                                               t_next)
        else:
            durs, cum = sim.cost.stretch_times(StretchShape(ctx0, k, extra_first=extra_first),
                                               env.now, t_next)
        k = len(cum)
        if cum[-1] >= t_next:
            j = k - 1
            if cum[j] != t_next and sim.tie_inside(float(cum[j - 1]) if j else env.now,
                                                     float(cum[j])):
                k = j  # (Simulator.tie_inside: the stretch's clock waits would let the arrival in)
        if k < 2:
            return 0
        # new blocks needed at steps 2..k: request i's token index slot0 + s - 1 starts a block
        # at steps s0[i], s0[i] + B, ...; pairs of (step, request) in allocation order (by step,
        # then running order), k cut to the steps whose new blocks fit the free blocks
        alloc_per_step = np.empty(k + 1, dtype=np.int64)
        n_max = b * ((k - 2) // B + 1)
        pi = np.empty(n_max, dtype=np.int64)
        ps = np.empty(n_max, dtype=np.int64)
        k, n_pairs = stretch_pairs(np.ascontiguousarray(slot0, dtype=np.int64), fin_a, B, k,
                                    sim.pool.num_free, NO_EXTRA, alloc_per_step, pi, ps)
        if k < 2:
            return 0
        inner = inner and k_first < k  # (some request finishes before the end)
        general = inner or admitted is not None  # (rows: DecodeStretch.finishing_end)
        alloc_per_step = alloc_per_step[:k + 1]
        pi = pi[:n_pairs]
        ps = ps[:n_pairs]
        tiers = sim.tiers
        if tiers is not None and sim.sched.head_retried(b):
            # The per-step loop retries the waiting head every step. Without tiers a pure-decode
            # stretch can only make it less admissible (fewer free blocks, shorter hits); with
            # tiers a GPU eviction can cut its hit before host/disk pages (a blocking onboard
            # then needs fewer blocks) and landed offloads change its host/disk hits. So the
            # stretch ends before the first step that evicts a cached block (its scheduling
            # would see the change) and at most one step after the first step whose end issues
            # an offload (a copy lands no earlier than during the next step).
            cap = self.tier_cap(reqs, k, ps if n_pairs else None, B)
        elif sim.write_back_on:
            # a step that evicts a cached block is held for its write-back copy by the
            # per-step loop (TierManager.write_back): the stretch ends before it
            first = self.first_evicting_step(ps if n_pairs else None)
            cap = k if first is None else first - 1
        elif n_pairs and sim.sched.head_retried(b):
            # The per-step loop retries the waiting head every step; the stretch ends before
            # the first step whose new blocks evict a block of the head's prefix hit
            # (common.head_hit_step)
            first = head_hit_step(sim, ps, sim.max_tokens - b)
            cap = k if first is None else first - 1
        else:
            cap = k
        if cap < k:
            k = cap
            if k < 2:
                return 0
            if n_pairs:  # (ps is sorted)
                n_pairs = int(np.searchsorted(ps, k, side="right"))
                ps = ps[:n_pairs]
                pi = pi[:n_pairs]
            alloc_per_step = alloc_per_step[:k + 1]
        evicted_per_step = np.zeros(k + 1, dtype=np.int64)
        n_evicted = 0
        if tiers is not None:
            # offloads the per-step loop would issue at the end of step 1 (its scheduling
            # already ran): the keys it evicted and registered
            # (write_back's evictions were issued at the scheduling, and the stretch ends before
            # a step that evicts: only write_through's registrations are copied from here)
            t_cached = {1: flat(sim.pool.cached_log)}
            sim.pool.cached_log.clear()
        nb_all = None
        early = {}  # finish step -> (blocks freed, of them cached) of requests freed inside
        early_freed = early_cached = 0
        if inner:
            ev0 = sim.pool.evicted_cached_blocks
            evicted, early = self.allocate_finishing(reqs, fin_a, slot0, pi, ps, k)
            if sim.pool.evicted_cached_blocks != ev0:
                ps_ev = ps[evicted]
                n_evicted = len(ps_ev)
                evicted_per_step = np.bincount(ps_ev, minlength=k + 1)
            early_freed = sum(v[0] for v in early.values())
            early_cached = sum(v[1] for v in early.values())
        elif n_pairs:
            ev0 = sim.pool.evicted_cached_blocks
            blocks, evicted = sim.pool.allocate(n_pairs, return_evicted=True)
            if sim.pool.evicted_cached_blocks != ev0:  # (cached blocks were evicted)
                ps_ev = ps[evicted]
                n_evicted = len(ps_ev)
                evicted_per_step = np.bincount(ps_ev, minlength=k + 1)
            if k <= B + 1:  # at most one new block per request (s0 >= 2)
                for i, blk in zip(pi.tolist(), blocks.tolist()):
                    req = reqs[i]
                    req.blocks[req.n_blocks] = blk
                    req.n_blocks += 1
            else:
                nb_all = np.bincount(pi, minlength=b)
                by_req = blocks[np.argsort(pi, kind="stable")]  # request-major, by step
                ends = np.cumsum(nb_all)
                for i in np.flatnonzero(nb_all).tolist():
                    req = reqs[i]
                    nb = int(nb_all[i])
                    req.blocks[req.n_blocks:req.n_blocks + nb] = by_req[ends[i] - nb:ends[i]]
                    req.n_blocks += nb
        used1 = sim.pool.num_used - n_pairs + early_freed  # after step 1
        cf1 = sim.pool.num_cached_free + n_evicted - early_cached
        start = env.now
        waiting0 = len(sim.waiting)
        durs = durs[:k]
        cum = cum[:k]
        if tiers is not None:
            # blocks filled by decode tokens are registered by the scheduling of the step that
            # fills them: block j of a request at c tokens fills at step (j + 1) x B - c; their
            # keys are unique to the request (sim/keys.py), so every one is newly registered
            if sim.caching:
                for req in reqs:
                    if req.compressed:
                        continue
                    c = req.n_computed
                    for j in range(req.n_cached, (c + k) // B):
                        t_cached.setdefault((j + 1) * B - c, []).append(int(req.keys[j]))
            env.process(self.offloads(cum, t_cached, k))
        yield from advance_to(env, float(cum[-1]))
        now = env.now
        # commit: every request computed k tokens and sampled k tokens
        if sim.rec.record_steps and not general:
            # live KV tokens as the per-step loop records them (Simulator.live_tokens: computed tokens of
            # the running requests: ctx0 without compression; compressed requests' physical
            # contexts in ctx0 differ)
            live0 = int(np.add.reduce(ctx0)) if comp is None else sum(r.n_computed for r in reqs)
        finished = False
        reg = ([], [])  # decode-filled blocks: keys unique to their requests, one registration
        if comp is None:  # dense requests only: the loop below without its layout branches
            if admitted is not None:
                # their chunks (computed at step 1) and first tokens (sampled at its end)
                t1 = float(cum[0])
                for req, n in zip(reqs[-na:], admitted[1]):
                    req.n_computed += n - 1  # (+ 1 a step below)
                    if req.n_generated == 0:
                        req.first_token = t1
            finished = commit_decodes(sim, reqs, fin, k, cum, now, reg)
        else:
            if nb_all is None:  # new blocks per request
                nb_all = np.bincount(pi, minlength=b)
            for i, req in enumerate(reqs):
                # a compressed request registers its blocks now, before its round (which may
                # uncache them); dense ones join the one registration below
                commit_stretch(sim, req, k, k - 1, int(nb_all[i]),
                                reg if req.layout is None else None)
                if req.layout is not None and comp.due(req, False):
                    sim.run_round(req)
                if req.n_generated >= req.output:
                    req.status = FINISHED
                    req.finish = now
                    finished = True
        sim.kv.flush_grow([], reg)  # one registration (the decode-filled keys are distinct)
        if tiers is not None:
            sim.pool.cached_log.clear()  # issued per step by DecodeStretch.offloads
        rec = sim.rec
        if general:
            pre1, dec1 = 0, b
            if admitted is not None:  # (the per-step loop's count: a re-admitted preempted
                # request's one token after a full hit is a decode token)
                dec1 = b - na
                for req, n, c in zip(reqs[-na:], admitted[1], ctx0[-na:].tolist()):
                    if c >= req.input and n == 1:
                        dec1 += 1
                    else:
                        pre1 += n
            self.finishing_end(reqs, fin_a, slot0, start, cum, durs, waiting0, used1,
                                        alloc_per_step, cf1, evicted_per_step, pre1, dec1, early)
            return k
        # the last step's row: the requests and blocks it ran with (before the finished leave)
        last = (len(sim.running), sim.pool.num_used, sim.pool.num_cached_free, sim.live_tokens())
        if finished:
            sim.retire_finished()
        if tiers is not None:
            # the last step's offloads are issued here, at the end of the stretch, before the
            # next scheduling (as the per-step loop's Simulator.tier_step_end), not by DecodeStretch.offloads
            if t_cached.get(k):
                sim.pool.cached_log.append(np.asarray(t_cached[k], dtype=np.int64))
            sim.tier_step_end()
        rows = rec.reserve_steps(k)
        if rows is None:
            # counters only: used blocks grow through the stretch; its last step's are the most
            rec.count(k, 0, b * k, last[1])
        else:
            rec.count(k, 0, b * k, fill_decode_rows(
                *rows[1], rows[0], start, cum, durs, b, waiting0, used1, alloc_per_step, cf1,
                evicted_per_step, live0, last[0], len(sim.waiting), last[1], last[2], last[3]))
        if sim.check:
            sim.check_invariants()
        return k

    def allocate_finishing(self, reqs, fin, slot0, pi, ps, k: int):
        """The new blocks of a dense stretch of ``k`` steps in which requests finish before the
        last step (:meth:`DecodeStretch.advance`): the pairs (request ``pi``, step ``ps``), in
        allocation order (step, then running order), are allocated segment by segment, each
        up to a finish step ``f``; then the requests finishing at ``f`` (``fin[i] == f``;
        ``slot0[i] + f``: the tokens they computed) register their blocks now full and free
        their tables, in running order, as the per-step loop does by the end of step ``f``.
        Their unhashed blocks join the free queue's head (:meth:`BlockPool.free`), so the next
        steps' allocations take them as the per-step loop's do. Requests finishing after the
        last allocation are left to :meth:`DecodeStretch.finishing_end`. Returns (bool array of the
        pairs whose block's cached hash was evicted, ``{f: (blocks freed, of them cached)}``
        for the steps whose requests were freed here)."""
        sim = self.sim
        pool = sim.pool
        B = sim.B
        n = len(pi)
        evicted = np.zeros(n, dtype=bool)
        early = {}
        groups: dict[int, list[int]] = {}
        for i, f in enumerate(fin.tolist()):
            if f < k:
                groups.setdefault(f, []).append(i)
        lo = 0
        for f in sorted(groups):
            if lo == n:
                break
            hi = int(np.searchsorted(ps, f, side="right"))
            if hi == n:  # (no allocation after step f: the retirement frees them)
                break
            if hi > lo:
                self.take(reqs, pi[lo:hi], evicted[lo:hi])
                lo = hi
            nf = pool.num_free
            ncf = pool.num_cached_free
            for i in groups[f]:
                req = reqs[i]
                full = (int(slot0[i]) + f) // B
                if sim.caching and full > req.n_cached:
                    pool.cache_blocks(req.blocks[req.n_cached:full], req.keys[req.n_cached:full])
                    req.n_cached = full
                pool.free(req.blocks[:req.n_blocks][::-1])
            early[f] = (pool.num_free - nf, pool.num_cached_free - ncf)
        if lo < n:
            self.take(reqs, pi[lo:], evicted[lo:])
        return evicted, early

    def take(self, reqs, pi, evicted) -> None:
        """Allocate one block for each request index of ``pi`` (in order) onto its table;
        ``evicted`` (bool, ``len(pi)``) marks those whose cached hash was evicted."""
        sim = self.sim
        blocks = np.empty(len(pi), dtype=np.int64)
        sim.pool.allocate_into(blocks, cached=evicted)
        for i, blk in zip(pi.tolist(), blocks.tolist()):
            req = reqs[i]
            req.blocks[req.n_blocks] = blk
            req.n_blocks += 1

    def finishing_end(self, reqs, fin, slot0, start: float, cum, durs, waiting0: int,
                               used1: int, alloc, cf1: int, evicted, pre1: int, dec1: int,
                               early=None) -> None:
        """The end of a dense stretch of ``k = len(cum)`` steps with requests finishing before its
        last step or an admission as its first (:meth:`DecodeStretch.advance`; ``fin[i]``: request
        ``i``'s last step; ``slot0[i] + s``: its computed tokens after step ``s``): retire the
        finished requests step by step, in running order within a step (their blocks join the free
        queue's tail in that order, as the per-step loop frees them), and record the steps
        (``alloc`` / ``evicted``: blocks taken / cached blocks evicted at each step, shape ``(k +
        1,)``; ``used1`` / ``cf1``: blocks used / cached-free after step 1's scheduling;
        ``waiting0``: requests waiting during the stretch; ``pre1`` / ``dec1``: step 1's prefill and
        decode tokens; ``early``: ``{f: (blocks freed, of them cached)}`` for the steps whose
        finished requests :meth:`DecodeStretch.allocate_finishing` freed)."""
        sim = self.sim
        k = len(cum)
        self.finished_inside += int((fin < k).sum())
        self.admission_tokens += int(pre1)
        pool = sim.pool
        freed = np.zeros(k + 1, dtype=np.int64)  # blocks back in the free queue after step s
        cfreed = np.zeros(k + 1, dtype=np.int64)  # of them cached
        done = sorted((f, i) for i, f in enumerate(fin.tolist()) if f <= k)
        j = 0
        while j < len(done):
            f = done[j][0]
            nf = pool.num_free
            ncf = pool.num_cached_free
            group = []
            while j < len(done) and done[j][0] == f:
                group.append(reqs[done[j][1]])
                j += 1
            if early and f in early:
                sim.retire(group, freed=True)
                freed[f], cfreed[f] = early[f]
                continue
            sim.retire(group)
            freed[f] = pool.num_free - nf
            cfreed[f] = pool.num_cached_free - ncf
        sim.drop_finished()
        rec = sim.rec
        rows = rec.reserve_steps(k)
        i, cols = rows if rows is not None else (0, rec.steps.arrays)
        pk, dec = fill_finishing_rows(*cols, rows is not None, i, start, cum, durs, fin, slot0,
                                      waiting0, len(sim.waiting), used1, alloc, cf1, evicted,
                                      freed, cfreed, pre1, dec1)
        rec.count(k, pre1, dec, pk)
        if sim.check:
            sim.check_invariants()

    def first_evicting_step(self, ps):
        """The first fast-forward step whose new blocks evict a cached block from the free
        queue, or None. ``ps``: the step of each new block, in allocation order (by step; None
        or empty: no new blocks); blocks are taken from the free queue's head in that order."""
        sim = self.sim
        if ps is None or not len(ps):
            return None
        ev = sim.pool.block_hash[sim.pool.peek_free(len(ps))] != NO_HASH
        return int(ps[int(np.argmax(ev))]) if ev.any() else None

    def tier_cap(self, reqs, k: int, ps, B: int) -> int:
        """Last fast-forward step that keeps the waiting head's per-step retries exact with
        tiers (see :meth:`DecodeStretch.advance`). ``ps``: the step of each new block, in allocation
        order (by step; None: no new blocks). Returns a step count <= ``k``."""
        sim = self.sim
        pool = sim.pool
        wp = sim.tiers.write_policy
        cap = k
        # step 1's scheduling already evicted/registered: its offloads are issued at its end
        # (write_back's evictions were issued at the scheduling, which then holds the step and
        # is not fast-forwarded)
        if wp == "write_through" and pool.cached_log:
            cap = min(cap, 2)
        first = self.first_evicting_step(ps)
        if first is not None:
            cap = min(cap, first - 1)
        if wp == "write_through" and sim.caching:
            # decode-filled blocks are registered (and copied down at that step's end) at step
            # (n_cached + 1) x B - n_computed
            first = min((((r.n_cached + 1) * B - r.n_computed) for r in reqs if not r.compressed),
                        default=None)
            if first is not None:
                cap = min(cap, first + 1)
        return cap

    def offloads(self, ends, cached: dict, last: int):
        """SimPy process: the write-policy offloads of fast-forwarded steps before step ``last``,
        each issued at its step's end time (``ends[s - 1]``) as the per-step loop would (the
        last step's are issued by the engine itself, before it schedules again)."""
        sim = self.sim
        env = sim.env
        tiers = sim.tiers
        for st in sorted(st for st in cached if st < last):
            t = float(ends[st - 1])
            if t > env.now:
                yield env.timeout(t - env.now)
            tiers.on_gpu_cached(cached[st])
            tiers.flush()


@kernel("i8(f8[:], f8[:], i4[:], i4[:], i4[:], i4[:], i8[:], i8[:], i8[:], i8, f8, f8[:], f8[:], "
        "i8, i8, i8, i8[:], i8, i8[:], i8, i8, i8, i8, i8, i8)")
def fill_decode_rows(t, d, run, wait, pre, dec, used, cf, live, i, start, cum, durs, b,
                     waiting0, used1, alloc, cf1, ev, live0, last_run, last_wait, last_used,
                     last_cf, last_live):  # pragma: no cover (compiled)
    """Rows ``i .. i + k - 1`` of the steps table's columns (``t .. live``, the buffers of
    :meth:`sim.metrics.Recorder.reserve_steps`) for the ``k = len(durs)`` steps of a
    pure-decode stretch of ``b`` running requests (one decode token each); returns the most
    blocks used in them.

    ``start``: the first step's start (s); ``cum``: step end times (s, shape ``(k,)``);
    ``durs``: step durations (s); ``waiting0``: waiting requests during the stretch;
    ``used1`` / ``cf1``: blocks used / cached-free before the stretch's allocations, then
    ``alloc[s]`` blocks allocated and ``ev[s]`` cached blocks evicted at step ``s`` (shape
    ``(k + 1,)``; indices 0 and 1 are 0: step 1's blocks came with its scheduling);
    ``live0``: computed tokens before the stretch (``b`` more a step). ``last_*``: the last
    row's running, waiting (the queue after the stretch), blocks used, cached free and live
    tokens (its finishing requests counted)."""
    k = durs.shape[0]
    u = used1
    c = cf1
    pk = last_used
    for s in range(k):
        r = i + s
        t[r] = start if s == 0 else cum[s - 1]
        d[r] = durs[s]
        run[r] = b
        wait[r] = waiting0
        pre[r] = 0
        dec[r] = b
        u += alloc[s + 1]  # (step s + 1's new blocks; alloc[1] is 0: step 1 was scheduled)
        c -= ev[s + 1]
        used[r] = u
        cf[r] = c
        live[r] = live0 + (s + 1) * b
        if s < k - 1 and u > pk:
            pk = u
    r = i + k - 1
    run[r] = last_run
    wait[r] = last_wait
    used[r] = last_used
    cf[r] = last_cf
    live[r] = last_live
    return pk


@kernel("UniTuple(i8, 2)(f8[:], f8[:], i4[:], i4[:], i4[:], i4[:], i8[:], i8[:], i8[:], b1, i8, "
        "f8, f8[:], f8[:], i8[:], i8[:], i8, i8, i8, i8[:], i8, i8[:], i8[:], i8[:], i8, i8)")
def fill_finishing_rows(t, d, run, wait, pre, dec, used, cf, live, write, i, start, cum,
                        durs, fin, ctx0, waiting0, waiting_last, used1, alloc, cf1, ev,
                        freed, cfreed, pre1, dec1):  # pragma: no cover (compiled)
    """Rows ``i .. i + k - 1`` of the steps table's columns (``t .. live``, the buffers of
    :meth:`sim.metrics.Recorder.reserve_steps`; written when ``write``) for the ``k =
    len(durs)`` steps of a stretch whose requests leave as they finish: one decode token per
    running request a step, but the first step's ``pre1`` prefill and ``dec1`` decode tokens (an admission step
    as the first, or ``0`` and ``len(fin)``). Returns ``(most blocks used, decode tokens)`` of
    the steps.

    ``start``: the first step's start (s); ``cum``: step end times (s, shape ``(k,)``);
    ``durs``: step durations (s); ``fin[i]``: the step request ``i`` finishes at (it runs
    steps ``1 .. fin[i]``; past ``k``: still running), ``ctx0[i] + s``: its computed tokens
    after step ``s``; ``waiting0``: waiting requests during the stretch, ``waiting_last``
    after its last step. ``used1`` / ``cf1``: blocks used / cached-free before the stretch's
    allocations; at step ``s`` (arrays of shape ``(k + 1,)``, index 0 unused) ``alloc[s]``
    blocks were allocated and ``ev[s]`` cached blocks evicted by its scheduling, and
    ``freed[s]`` blocks (``cfreed[s]`` of them cached) joined the free queue when its finished
    requests left. A row counts the requests and blocks its step ran with, before its finished
    requests leave."""
    k = durs.shape[0]
    leave = np.zeros(k + 2, dtype=np.int64)  # requests finishing at step s
    leave_ctx = np.zeros(k + 2, dtype=np.int64)  # their contexts before step 1
    running = fin.shape[0]
    ctx = 0
    for j in range(running):
        f = fin[j] if fin[j] <= k else k + 1
        leave[f] += 1
        leave_ctx[f] += ctx0[j]
        ctx += ctx0[j]
    u = used1
    c = cf1
    pk = 0
    n_dec = 0
    for s in range(1, k + 1):
        in_step = running if s > 1 else dec1
        n_dec += in_step
        u += alloc[s]
        c -= ev[s]
        if u > pk:
            pk = u
        if write:
            r = i + s - 1
            t[r] = start if s == 1 else cum[s - 2]
            d[r] = durs[s - 1]
            run[r] = running
            wait[r] = waiting0 if s < k else waiting_last
            pre[r] = 0 if s > 1 else pre1
            dec[r] = in_step
            used[r] = u
            cf[r] = c
            live[r] = ctx + s * running
        running -= leave[s]
        ctx -= leave_ctx[s]
        u -= freed[s]
        c += cfreed[s]
    return pk, n_dec
