"""The compression stretch: decode steps of a batch under a compression policy, running the
policy's rounds that fall inside the stretch and going on past finishes and the admissions after
them (no tiers, no sliding-window layers)."""

from __future__ import annotations

import heapq
import math

import numpy as np

from ..clock import advance_to, step_ends
from ..cost import StretchShape
from ..request import FINISHED
from .base import Stretch
from .common import block_pairs, commit_stretch, grown, head_hit_step, waiting_per_step


class RoundsStretch(Stretch):
    """Compression stretches of one engine (``sim``)."""

    name = "rounds"

    def __init__(self, sim):
        super().__init__(sim)
        self.admitted = 0

    def eligible(self, plan, dt: float, hold: float | None) -> bool:
        """Compression runs without tiers or sliding-window layers: a pure-decode step or one
        whose admissions complete their (compressed) prompts; no write-back hold, and no
        event before the step's end."""
        sim = self.sim
        if hold is not None or not sim.rounds_in_stretches:
            return False
        if not (sim.sched.pure_decode(plan) or sim.sched.decode_and_admitted(plan)):
            return False
        return sim.env.peek() > sim.env.now + dt

    def start(self, plan, n_arr, ctx_arr, dt: float, extra_dt: float, hold: float | None):
        if plan.admitted:  # (the admission step becomes the stretch's first step)
            k = yield from self.advance(plan.reqs, ctx_arr, 0.0,
                                        (dt, plan.tokens[-plan.admitted:]))
            self.admitted += k > 0
            return k
        return (yield from self.advance(plan.reqs, ctx_arr, extra_dt))

    def counters(self) -> dict:
        """:meth:`Stretch.counters` with ``admitted``: admission steps taken into a stretch
        (as its first step, or after requests finished inside it)."""
        return dict(super().counters(), admitted=self.admitted)

    def advance(self, reqs, ctx0, extra_first: float = 0.0, admitted=None):
        """:meth:`DecodeStretch.advance` for compression runs, running the rounds that fall inside
        the stretch at their steps, and going on past requests that finish and the admissions that
        follow. With hundreds of running requests and a round every ``beta`` tokens each, some
        request reaches its round point every step or two, and one finishes every few steps, so a
        stretch cut at either would rarely exceed a few steps.

        Exact against the per-step loop because, in a pure-decode stretch with no tiers and no
        sliding-window layers:

        * a round at the end of step ``r`` changes only its own request's slot index (its
          context) from step ``r + 1`` on, so the batch's context sum, on which the step times
          depend, shifts by the change; its time is charged to step ``r + 1`` (to the next engine
          step when ``r`` is the stretch's last);
        * allocations are made segment by segment (the steps between round steps) in (step,
          running order) order, as the scheduler makes them, each segment's before the rounds
          at its end and after those before it, so the free queue (blocks a round frees join
          its tail) hands out the blocks the per-step loop's allocations get, and a round sees
          its request's block table as the per-step loop does; the rounds of one step run in
          running order;
        * at the end of a step where requests finish (after that step's rounds) the clock is brought
          to the step's end, they are retired as :meth:`Simulator.retire_finished` does, and the
          next step is scheduled as :meth:`Scheduler.schedule` would: the survivors' decode blocks,
          then :meth:`Scheduler.admit` on the budget they leave; that step takes the scheduler's
          step time of the whole batch (:meth:`_admission_step_time`), and the admitted requests,
          whose prompt chunks complete in it, decode with the rest from the step after (their
          prefill end is handled at that step's end, in running order). A finish that releases a
          closed-loop request at once, or an admission whose chunk does not complete its prompt (or
          that ends its request), ends the stretch there instead.

        ``k`` is bounded by the next SimPy event and the free blocks (those free when each segment
        allocates), as in :meth:`DecodeStretch.advance`, and, while the waiting head could be
        admitted (a free sequence slot and token budget), by the first step whose rounds return
        blocks that admit it, or, after an admission step, by that step if the head it stopped at
        fits with the next step's budget (:meth:`Scheduler.head_fits`). ``admitted``: ``(step time
        s, chunks)`` when the first step also admits the last ``len(chunks)`` of ``reqs``
        (:meth:`Scheduler.decode_and_admitted`): their prompt chunks, already scheduled, complete in
        that step, which takes the step time the scheduler's batch gives; from step 2 on they decode
        like the rest.

        Returns ``k`` (0 = not taken: then nothing was changed).
        """
        sim = self.sim
        env = sim.env
        B = sim.B
        comp = sim.comp
        pool = sim.pool
        reqs = list(reqs)  # grows with the stretch's admissions; indices stay (running order)
        b = len(reqs)
        fin = [r.output - r.n_generated for r in reqs]  # the step at whose end each finishes
        kf = min(fin)  # the next step where requests finish
        if kf < 2:
            return 0
        nc0 = [r.n_computed for r in reqs]  # computed tokens after step s: nc0[i] + s
        chunk = {}  # index -> prompt chunk of a request admitted in the stretch (until its step)
        heap = []  # (step, index): rounds (and prefill ends) due at the end of that step
        # step rows: (first step, last step, decode, prefill, running, live base, live per step)
        rows = []
        first_row = 1
        if admitted is not None:
            # an admitted request has computed n_computed + chunk - 1 + s tokens after step s
            b_dec = b - len(admitted[1])
            for i, n in enumerate(admitted[1], b_dec):
                nc0[i] += n - 1
                chunk[i] = n
                heap.append((1, i))  # its prefill end, at step 1's end
            ctx0 = ctx0.copy()
            ctx0[b_dec:] = nc0[b_dec:]
            # step 1's row: the admitted chunks are prefill tokens
            pre = dec = 0
            for i, n in enumerate(admitted[1], b_dec):
                if nc0[i] - n + 1 >= reqs[i].input and n == 1:
                    dec += 1
                else:
                    pre += n
            rows.append((1, 1, b_dec + dec, pre, b, sum(nc0), b))
            first_row = 2
        for i, r in enumerate(reqs):
            if r.layout is not None and r.next_round is not None:
                st = r.next_round - r.n_computed
                if st < 1:
                    return 0  # due already (the per-step loop handles it)
                if st <= fin[i]:
                    heap.append((st, i))
        heapq.heapify(heap)
        # the slot index of each request's step-s token is anchor + s - 1; nxt: the next step at
        # which it needs a new block (then every B steps)
        anchor = np.fromiter((nc0[i] if r.layout is None else r.phys_base + r.pending - 1
                              for i, r in enumerate(reqs)), dtype=np.int64, count=b)
        nxt = 2 + (-(anchor + 1)) % B
        # step 2 must fit whatever the rounds of step 1 do (each may need one block more), so a
        # stretch that ran a round is never cut below 2 steps by the free blocks
        r1 = sum(1 for st, _ in heap if st == 1)
        if int(np.count_nonzero(nxt == 2)) + r1 > pool.num_free:
            return 0
        t_ev = env.peek()
        t_lim = float(sim.max_sim_time) if sim.max_sim_time is not None else math.inf
        t_next = min(t_ev, t_lim)
        used0 = pool.num_used
        cf0 = pool.num_cached_free
        start = env.now
        waiting0 = len(sim.waiting)
        # arrivals behind a waiting head are passed, not stopped at (_pass_arrivals; this
        # path runs without tiers)
        pass_ev = waiting0 > 0
        ev_log: list[tuple[float, int]] = []
        # the per-step loop retries the waiting head every step; the stretch only takes blocks
        # except where a round or a finish returns blocks or a first round uncaches some (the
        # stretch then ends at that step if the head fits: _head_fits; a finish admits it
        # within the stretch), and it ends before a step whose new blocks take a block of the
        # head's hit (common.head_hit_step), so between those the head can only become less
        # admissible (fewer free blocks, the same hit)
        admit = sim.sched.head_retried(b)
        # the running requests in the stretch (indices into reqs, running order)
        active = list(range(b))
        live_base = sum(nc0)  # live tokens after step s: live_base + s x len(active)
        # per step (index = step): blocks allocated, cached blocks evicted by them, and the
        # change of used and cached-free blocks by the rounds and retirements at the step's end
        cap = kf + 1
        alloc_ps = np.zeros(cap, dtype=np.int64)
        ev_ps = np.zeros(cap, dtype=np.int64)
        round_used = np.zeros(cap, dtype=np.int64)
        round_cf = np.zeros(cap, dtype=np.int64)
        done = [0] * b     # steps committed to each request's counters
        new_blk = [0] * b  # blocks added to its table since then
        shift = 0          # change of the batch's context sum by the rounds so far (tokens)
        carry = extra_first
        step_time = admitted[0] if admitted is not None else None  # an admission step's time
        recheck = 1 if admitted is not None else 0  # an admission step: retry the head after it
        k = kf
        cut = False  # the stretch ends at k (an event, the free blocks, the head)
        last = start
        durs_parts = []
        cum_parts = []
        seg = 1
        while True:
            hi = min(heap[0][0], k) if heap else k  # this segment: steps seg..hi
            d, _ = sim.cost.stretch_times(StretchShape(ctx0, hi - seg + 1, first=seg - 1,
                                                       shift=shift))
            if step_time is not None:
                d[0] = step_time  # an admission step: the scheduler's batch (round costs in)
                step_time = None
            else:
                d[0] += carry  # round costs charged to the segment's first step
            c = step_ends(last, d)
            # new blocks of steps seg..hi (nxt >= seg >= 1; step 1's were allocated by the
            # scheduler, so nxt >= 2), request-major; the free blocks bound the stretch first
            # (arrivals are passed only inside the steps it keeps)
            cnt, pi, ps = block_pairs(nxt, hi, B)
            n_pairs = len(ps)
            if n_pairs:
                per = np.bincount(ps, minlength=hi + 1)
                cum_new = np.cumsum(per)
                free = pool.num_free  # with the blocks the rounds so far returned
                if cum_new[hi] > free:  # the last step whose blocks fit ends the stretch (>= 2)
                    hi = k = int(np.searchsorted(cum_new, free, side="right")) - 1
                    cut = True
                    if hi < seg:  # not even step seg: the stretch ended with the last segment
                        sim.round_time = carry  # its rounds' time goes to the next step
                        k = seg - 1
                        break
                    d = d[:hi - seg + 1]
                    c = c[:hi - seg + 1]
                if admit and sim.waiting:
                    # the per-step loop retries the head every step: the stretch ends before
                    # the first step whose new blocks take a block of its prefix hit
                    # (common.head_hit_step; steps in allocation order)
                    first = head_hit_step(sim, np.sort(ps[ps <= hi]),
                                                sim.max_tokens - len(active))
                    if first is not None:
                        hi = k = first - 1
                        cut = True
                        if hi < seg:  # the stretch ended with the last segment
                            sim.round_time = carry
                            k = seg - 1
                            break
                        d = d[:hi - seg + 1]
                        c = c[:hi - seg + 1]
            if pass_ev and c[-1] >= t_ev and t_ev < t_lim:
                t_ev, before = yield from self.pass_arrivals(c, last, t_ev, t_lim, ev_log)
                t_next = min(t_ev, t_lim)
                if before is not None:
                    cut = True
                    if before == 0 and env.now != last:
                        # the stretch ends at step seg - 1 (the clock has not reached it, so it
                        # is not step 1, which the engine scheduled: its start is the clock)
                        sim.round_time = carry
                        k = seg - 1
                        break
                    # it ends at step seg + before - 1; or at step seg, whose start is the clock
                    # (the engine or a finish scheduled it): the stretch's one clock wait from
                    # there, created before the arrival inside it, runs first at its end
                    j = max(before, 1)
                    hi = k = seg + j - 1
                    d = d[:j]
                    c = c[:j]
            if c[-1] >= t_next:  # the event lands during step seg + j: the stretch ends there
                j = int(np.searchsorted(c, t_next, side="left"))
                hi = k = seg + j
                cut = True
                d = d[:j + 1]
                c = c[:j + 1]
            if n_pairs and len(per) > hi + 1:  # the stretch was cut: the blocks up to step hi
                keep = ps <= hi
                ps = ps[keep]
                pi = pi[keep]
                n_pairs = len(ps)
                per = per[:hi + 1]
                cnt = np.bincount(pi, minlength=len(reqs))
            if n_pairs:
                alloc_ps[:hi + 1] += per
                nxt = nxt + B * cnt
                self.allocate(reqs, cnt, ps, ev_ps, new_blk)
            durs_parts.append(d)
            cum_parts.append(c)
            last = float(c[-1])
            if heap and heap[0][0] == hi:
                # the rounds at the end of step hi, in running order
                u = pool.num_used
                cf = pool.num_cached_free
                unc = pool.uncached_blocks
                while heap and heap[0][0] == hi:
                    i = heapq.heappop(heap)[1]
                    req = reqs[i]
                    pd = False
                    n = chunk.pop(i, 0)
                    if n:  # an admitted request's step (its chunk, placed by the scheduler)
                        req.n_computed += n
                        pd = req.n_computed - n < req.input
                    else:
                        commit_stretch(sim, req, hi - done[i], hi - max(done[i], 1), new_blk[i])
                    done[i] = hi
                    new_blk[i] = 0
                    if comp is not None and req.layout is not None \
                            and req.n_computed >= req.input and comp.due(req, pd):
                        sim.run_round(req, last)
                        a = req.phys_base + req.pending - hi
                        shift += a - int(anchor[i])
                        anchor[i] = a
                        nxt[i] = max(hi + 1, req.n_blocks * B - a + 1)
                    if n and req.n_computed == req.input + req.n_generated:  # it samples
                        req.n_generated += 1
                        if req.n_generated == 1:
                            req.first_token = last
                    if req.next_round is not None:
                        # due again at the first step end with n_computed >= next_round
                        st = max(req.next_round - nc0[i], hi + 1)
                        if st <= fin[i]:
                            heapq.heappush(heap, (st, i))
                freed = u - pool.num_used
                round_used[hi] -= freed
                round_cf[hi] += pool.num_cached_free - cf
                if (freed > 0 or pool.uncached_blocks != unc) and admit \
                        and sim.sched.head_fits(sim.max_tokens - len(active)):
                    # the freed blocks admit the waiting head, or a first round's uncached
                    # blocks cut its hit (hit blocks after the cut that are free then no longer
                    # count against the free blocks): the next scheduling does it. If they do
                    # not, no later step of the stretch does either until blocks are freed or
                    # uncached again (see admit above), so the stretch goes on; the next step's
                    # scheduling, before its admission, takes the decode blocks first and
                    # leaves fewer free
                    k = hi
                    cut = True
            if hi == recheck:
                recheck = 0
                if admit and sim.sched.head_fits(sim.max_tokens - len(active)):
                    # the admission stopped at a head that the next step's budget (no prefill
                    # chunks) may admit
                    k = hi
                    cut = True
            if hi >= k:
                if cut or hi != kf:
                    break
                # requests finish at the end of step hi: retire them, schedule step hi + 1
                if hi + 2 > len(alloc_ps):
                    alloc_ps, ev_ps, round_used, round_cf = grown(
                        (alloc_ps, ev_ps, round_used, round_cf), hi + 2)
                go_on, first_row, live_base, nxt, anchor, step_time, admitted_now = \
                    yield from self.batch_change(
                        reqs, hi, last, fin, nc0, done, new_blk, chunk, heap, anchor, nxt,
                        active, (alloc_ps, ev_ps, round_used, round_cf), rows, first_row,
                        live_base, ev_log)
                if not go_on:  # the stretch ends at step hi
                    break
                if admitted_now:
                    self.admitted += 1
                ctx0 = anchor[active]  # contexts at step 1 (anchor + s - 1 at step s)
                shift = 0
                # the next finish; the per-step arrays grow to it
                kf = k = min(fin[i] for i in active) if active else hi + 1
                if admitted_now:
                    recheck = hi + 1
                    if any(reqs[i].n_computed + chunk[i] != reqs[i].input + reqs[i].n_generated
                           or fin[i] == hi + 1 for i in admitted_now):
                        k = hi + 1  # a chunk short of its prompt, or a request that ends there
                        cut = True
                if k + 1 > len(alloc_ps):
                    alloc_ps, ev_ps, round_used, round_cf = grown(
                        (alloc_ps, ev_ps, round_used, round_cf), k + 1)
                t_ev = env.peek()  # released closed-loop requests scheduled their arrivals
                t_next = min(t_ev, t_lim)
                pass_ev = bool(sim.waiting)
                admit = sim.sched.head_retried(len(active))
                if step_time is not None:
                    step_time += sim.round_time  # the finish step's round costs
                    sim.round_time = 0.0
                    carry = 0.0
                    seg = hi + 1
                    continue
            carry = sim.round_time
            sim.round_time = 0.0
            seg = hi + 1
        durs = np.concatenate(durs_parts)
        cum = np.concatenate(cum_parts)
        yield from advance_to(env, float(cum[-1]))
        now = env.now
        finished = False
        reg = ([], [])  # decode-filled blocks: keys unique to their requests, one registration
        for i in active:
            req = reqs[i]
            if done[i] < k:
                commit_stretch(sim, req, k - done[i], k - max(done[i], 1), new_blk[i], reg)
            if req.n_generated >= req.output:
                req.status = FINISHED
                req.finish = now
                finished = True
        sim.kv.flush_grow([], reg)
        if finished:
            sim.retire_finished()
        if k >= first_row:
            rows.append((first_row, k, len(active), 0, len(active), live_base, len(active)))
        used = used0 + np.cumsum(alloc_ps[1:k + 1] + round_used[1:k + 1])
        cached_free = cf0 - np.cumsum(ev_ps[1:k + 1] - round_cf[1:k + 1])
        self.record(rows, k, start, durs, cum, used, cached_free, waiting0, ev_log)
        if sim.check:
            sim.check_invariants()
        return k

    def allocate(self, reqs, cnt: np.ndarray, ps: np.ndarray, ev_ps: np.ndarray,
                     new_blk: list) -> None:
        """Allocate a stretch's new blocks: ``cnt[i]`` for ``reqs[i]``, the pairs' steps ``ps``
        in request-major order, handed out in (step, running order) order as the scheduler
        makes them; cached blocks they evict are counted per step in ``ev_ps``, the blocks added
        to each table in ``new_blk``."""
        sim = self.sim
        order = np.argsort(ps, kind="stable")  # allocation order: step, then running order
        blocks, evicted = sim.pool.allocate(len(ps), return_evicted=True)
        if evicted.any():
            ev = np.bincount(ps[order][evicted])
            ev_ps[:len(ev)] += ev
        by_req = np.empty(len(ps), dtype=np.int64)
        by_req[order] = blocks
        idx = np.flatnonzero(cnt)
        if len(idx) == len(ps):  # one block each (the common short segment): scalar stores
            for i, blk in zip(idx.tolist(), by_req.tolist()):
                req = reqs[i]
                req.blocks[req.n_blocks] = blk
                req.n_blocks += 1
                new_blk[i] += 1
            return
        lo = 0
        for i in idx.tolist():
            req = reqs[i]
            nb = int(cnt[i])
            req.blocks[req.n_blocks:req.n_blocks + nb] = by_req[lo:lo + nb]
            req.n_blocks += nb
            new_blk[i] += nb
            lo += nb

    def batch_change(self, reqs, f: int, t: float, fin, nc0, done, new_blk, chunk, heap,
                         anchor, nxt, active, per_step, rows, first_row, live_base, ev_log):
        """SimPy process fragment of :meth:`RoundsStretch.advance` at the end of step ``f``
        (time ``t``, after its rounds), where the requests of ``active`` with ``fin == f``
        finish: the clock goes to ``t``, they are committed and retired, and step ``f + 1`` is
        scheduled as :meth:`Scheduler.schedule` would: the survivors' decode blocks, then
        :meth:`Scheduler.admit` on the budget they leave. The stretch's per-request lists and arrays
        (indexed by position in ``reqs``, running order) are updated in place or returned;
        ``rows`` gets the rows of steps up to ``f`` (and ``f + 1``'s if it admits).

        Returns ``(go on, first step without a row, live base, nxt, anchor, the admission
        step's time without round costs or None, indices admitted)``; the stretch ends at ``f``
        when it does not go on: no request left, a released closed-loop request arrived at once
        (the step's row counts it), or the survivors' blocks do not fit (the per-step loop
        preempts)."""
        sim = self.sim
        pool = sim.pool
        B = sim.B
        alloc_ps, ev_ps, round_used, round_cf = per_step
        b_old = len(active)
        gone = [i for i in active if fin[i] == f]
        yield from advance_to(sim.env, t)
        reg = ([], [])
        for i in gone:
            req = reqs[i]
            if done[i] < f:
                commit_stretch(sim, req, f - done[i], f - max(done[i], 1), new_blk[i], reg)
                done[i] = f
                new_blk[i] = 0
            req.status = FINISHED
            req.finish = t
        sim.kv.flush_grow([], reg)
        u = pool.num_used
        cf = pool.num_cached_free
        n_wait = len(sim.waiting)
        sim.retire_finished()
        # (step f's row counts the blocks before they left: the next step's after)
        round_used[f + 1] += pool.num_used - u
        round_cf[f + 1] += pool.num_cached_free - cf
        gone_set = set(gone)
        active[:] = [i for i in active if i not in gone_set]
        nxt[gone] = np.iinfo(np.int64).max // 2  # no more blocks
        tokens = (b_old, 0)  # step f's decode and prefill tokens
        if first_row > f:  # f admitted requests: its row is written again below
            tokens = rows.pop()[2:4]
        elif f > first_row:
            rows.append((first_row, f - 1, b_old, 0, b_old, live_base, b_old))
        # step f's row: the requests it ran with, the finishing ones included
        rows.append((f, f, *tokens, b_old, live_base, b_old))
        live_base -= sum(nc0[i] for i in gone)
        b = len(active)
        first_row = f + 1
        stop = (False, first_row, live_base, nxt, anchor, None, [])
        if len(sim.waiting) != n_wait or not (b or sim.waiting):
            return stop
        if not sim.sched.head_retried(b):
            return (True, first_row, live_base, nxt, anchor, None, [])  # no admission
        s = f + 1
        cnt, pi, ps = block_pairs(nxt, s, B)
        if len(ps) > pool.num_free:
            return stop
        if len(ps):
            alloc_ps[s] += len(ps)
            nxt = nxt + B * cnt
            self.allocate(reqs, cnt, ps, ev_ps, new_blk)
        ctx_dec = anchor[active] + f  # the survivors' contexts at step f + 1
        sched_req, sched_n, sched_ctx = [], [], []
        u = pool.num_used
        cf = pool.num_cached_free
        _, samples, _ = sim.sched.admit(sim.max_tokens - b, sched_req, sched_n, sched_ctx)
        round_used[s] += pool.num_used - u  # the admitted tables (hit blocks and new ones)
        round_cf[s] += pool.num_cached_free - cf
        if not sched_req:  # nobody running and nobody admitted: the per-step loop says why
            return (b > 0, first_row, live_base, nxt, anchor, None, [])
        ev_log.append((t, len(sim.waiting)))
        new = []
        pre = dec = 0
        for req, n, h in zip(sched_req, sched_n, sched_ctx):
            i = len(reqs)
            reqs.append(req)
            fin.append(s + req.output - req.n_generated - 1)
            nc0.append(h + n - s)  # computed tokens after step s' >= s: h + n + (s' - s)
            done.append(0)
            new_blk.append(0)
            chunk[i] = n
            heapq.heappush(heap, (s, i))
            a = nc0[i] if req.layout is None else req.phys_base + req.pending - s
            anchor = np.append(anchor, a)
            nxt = np.append(nxt, s + 1 + (-(a + s)) % B)
            active.append(i)
            new.append(i)
            live_base += nc0[i]
            if h >= req.input and n == 1:
                dec += 1
            else:
                pre += n
        step_time = sim.cost.step_time(
            np.asarray([1] * b + sched_n, dtype=np.int64),
            np.concatenate([ctx_dec, np.asarray(sched_ctx, dtype=np.int64)]), b + samples)
        rows.append((s, s, b + dec, pre, len(active), live_base, len(active)))
        return (True, s + 1, live_base, nxt, anchor, step_time, new)

    def record(self, rows, k: int, start: float, durs, cum, used, cached_free, waiting0: int,
                   ev_log) -> None:
        """Record a compression stretch's ``k`` steps: ``rows`` of ``(first step, last step,
        decode tokens, prefill tokens, running, live base, live per step)`` (live tokens after
        step s = base + s x per step), ``used`` / ``cached_free`` blocks each step ran with
        (before its finished requests left); the last row's waiting count is the one after
        the stretch."""
        sim = self.sim
        rec = sim.rec
        dec = np.empty(k, dtype=np.int64)
        pre = np.empty(k, dtype=np.int64)
        for s0, s1, d_, p_, *_ in rows:
            dec[s0 - 1:s1] = d_
            pre[s0 - 1:s1] = p_
        if not rec.record_steps:
            rec.record(k, None, None, None, None, pre, dec, used, None, None)
            return
        steps = np.arange(1, k + 1)
        running = np.empty(k, dtype=np.int64)
        live = np.empty(k, dtype=np.int64)
        for s0, s1, _, _, r_, lb, bl in rows:
            running[s0 - 1:s1] = r_
            live[s0 - 1:s1] = lb + steps[s0 - 1:s1] * bl
        waiting = waiting_per_step(waiting0, ev_log, cum)
        waiting[-1] = len(sim.waiting)
        starts = np.concatenate(([start], cum[:-1]))
        rec.record(k, starts, durs, running, waiting, pre, dec, used, cached_free, live)

    def pass_arrivals(self, c: np.ndarray, t0: float, t_ev: float, t_lim: float, log: list):
        """SimPy process fragment: let the events that land before the end of a fast-forward
        segment happen, moving the clock to each; returns ``(next event's time, j)``, ``j`` the
        index of a step the stretch must end before, or None.

        ``c``: the segment's step end times (s, ascending) from ``t0``; ``t_ev``: the next
        event's time; ``t_lim``: ``sim.max_sim_time_s`` (events from it on are left to the
        caller); ``log`` gets ``(time, waiting requests)`` after each event.

        Used only with requests waiting and no tiers. Every event then is an arrival (the arrival
        process, or a closed-loop child after its think time), and an arrival joins the waiting
        queue behind a head that no step of the stretch can admit (the scheduler admits in FCFS
        order and stops at the first request that does not fit; see :meth:`RoundsStretch.advance`),
        so the per-step loop would schedule the same decode batch after it. An event at a step's
        exact end time stops here (the caller ends the stretch there): it was created before that
        step began (the arrival process after an arrival in an earlier step, or a finish), so SimPy
        runs it before the per-step loop's scheduling there, as it runs before the stretch's. A step
        in which an arrival would create an arrival at the step's exact end is not entered
        (:meth:`Simulator.tie_inside`: SimPy would run that one after the scheduling): ``j`` is its
        index. """
        sim = self.sim
        env = sim.env
        while c[-1] >= t_ev and t_ev < t_lim:
            j = int(np.searchsorted(c, t_ev, side="left"))
            if c[j] == t_ev:
                break
            if sim.tie_inside(float(c[j - 1]) if j else t0, float(c[j])):
                return t_ev, j
            yield from advance_to(env, t_ev)
            log.append((t_ev, len(sim.waiting)))
            t_ev = env.peek()
        return t_ev, None
