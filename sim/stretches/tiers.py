"""The tier stretch: pure-decode steps of a dense batch with host/disk tiers, run with the landings
they cause on an agenda of their own, the SimPy clock advanced only where another event comes
first (offload landings and arrivals keep their order), without the per-request work of the
per-step loop."""

from __future__ import annotations

import heapq

import numpy as np

from ..clock import advance_to
from ..cost import StretchShape
from ..kv_manager import queue_registration
from ..request import FINISHED
from .base import Stretch


class Agenda:
    """A tier stretch's own events in the order SimPy would run them: by time (s), then by
    creation. Each is ``(time, fn, args)``: a landing's call ``fn(*args)``, or an engine point
    (``fn`` None; ``args`` None: a step ends, True: a write-back hold ends)."""

    def __init__(self):
        self.heap: list = []
        self.seq = 0

    def push(self, t: float, fn, args) -> None:
        """Add an event at ``t`` (s), after every event pushed before it at that time."""
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, fn, args))

    def pop(self):
        """The first event: ``(time, fn, args)``."""
        t, _, fn, args = heapq.heappop(self.heap)
        return t, fn, args


class TierStretch(Stretch):
    """Tier stretches of one engine (``sim``)."""

    name = "tiers"
    # (as a cluster's replica, which runs on_iteration between steps, every step is a SimPy
    # timeout created where the per-step loop creates its own: see TierStretch.advance)
    step_clock = True

    def __init__(self, sim):
        super().__init__(sim)
        # the SimPy clock waits the stretches took (a write-back hold's first wait included):
        # fewer than their steps where the steps and their landings ran ahead of the clock
        self.clock_waits = 0

    def counters(self) -> dict:
        """:meth:`Stretch.counters` with ``clock_waits``."""
        return dict(super().counters(), clock_waits=self.clock_waits)

    def eligible(self, plan, dt: float, hold: float | None) -> bool:
        """Dense runs with host/disk tiers: a pure-decode step (held or not)."""
        sim = self.sim
        return sim.tiers is not None and sim.comp is None and sim.sched.pure_decode(plan)

    def start(self, plan, n_arr, ctx_arr, dt: float, extra_dt: float, hold: float | None):
        return self.advance(plan.reqs, ctx_arr, dt, hold)

    def advance(self, reqs, ctx0, dt: float, hold: float | None = None):
        """Pure-decode steps of a dense batch with host/disk tiers, the first of them scheduled by
        :meth:`Scheduler.schedule` (duration ``dt``; held until ``hold`` (s) for write-back copies
        when not None), without the per-request work of the per-step loop.

        The steps run on an :class:`Agenda`, together with the landings of the offloads and
        demotions they issue (:meth:`sim.tiers.TierManager.write_back`, their host insertions and
        the demotions those issue): each in the order of its time and, at equal times, of its
        creation, as SimPy orders the per-step loop's timeouts. The SimPy clock is advanced only
        where another event (an arrival, an onboarding transfer, a landing issued before the
        stretch) comes first or at the same time, and to the stretch's last step, so those run in
        the same order as there; the stretch's work ahead of the clock is timed by
        :meth:`sim.tiers.TierManager.now`. The landings still pending when it ends become SimPy
        timeouts, in their order. With a cluster's shared store (its link's puts are SimPy
        events) and as a cluster's replica (which publishes its KV events between steps,
        :attr:`Simulator.on_iteration`) every step and landing is a SimPy timeout, created where
        the per-step loop creates its own.

        At each step's end it does what the per-step loop does for such a step: the write-policy
        offloads (:meth:`Simulator.tier_step_end`), the step's row, and the next step's
        scheduling made for the few requests it concerns: one new block for each request whose
        token starts a block (in running order, from the free queue) and the registration of each
        block a token fills, then the waiting head's admission check (:meth:`TierStretch.next_step`),
        and with write_back the copies of the cached blocks those new blocks evicted, the next step
        waiting for them as the engine's steps do. The per-request counters (computed and generated
        tokens) are committed at the end. It ends, leaving the rest of the next scheduling to
        :meth:`Scheduler.schedule`, where the per-step loop would decide anything else:

        * the running list changed (an onboarding request joined it) or the waiting head may be
          admitted (the batch's part of that scheduling is then done; the scheduler does the
          rest);
        * the next step's new blocks exceed the free blocks (the scheduler preempts; nothing of
          that step is done);
        * requests finish at the step's end (they are committed and retired there, as the
          per-step loop does, and the stretch returns).

        Returns the number of steps taken (0: not taken, the engine runs the step).
        """
        sim = self.sim
        env = sim.env
        pool = sim.pool
        tm = sim.tiers
        B = sim.B
        b = len(reqs)
        k = min([r.output - r.n_generated for r in reqs])  # the first finish: at step k's end
        if k < 2 or (tm.layerwise and any(r.load_event is not None for r in reqs)):
            return 0  # (layer-by-layer loads: the per-step loop waits for them, then clears)
        nc0 = [r.n_computed for r in reqs]  # before step 1
        durs = sim.cost.stretch_times(StretchShape(ctx0, k))[0].tolist()
        durs[0] = dt
        live0 = sum(nc0)
        caching = sim.caching
        rec = sim.rec
        # the steps at which each request next starts a block (grow) and fills one (its
        # registration), as buckets step -> request indices: a step touches only its own
        grow_at: dict = {}
        reg_at: dict = {}
        for i, (req, c) in enumerate(zip(reqs, nc0)):
            grow_at.setdefault(max(req.n_blocks * B - c + 1, 2), []).append(i)
            if caching:
                reg_at.setdefault(max((req.n_cached + 1) * B - c, 2), []).append(i)
        start = env.now  # (the scheduling of step s)
        if hold is not None:  # (the first step's copies were issued as SimPy timeouts)
            self.clock_waits += 1
            yield from sim.wait_write_back(hold)
        # every step and landing through SimPy with a shared store (its link's puts are events)
        # and in a cluster's replica (its KV events are published between steps on the clock)
        if tm.store is not None or sim.on_iteration is not None:
            return (yield from self.advance_clocked(reqs, nc0, durs, k, live0, grow_at, reg_at,
                                                    start, hold))
        agenda = Agenda()
        agenda.push(env.now + durs[0], None, None)
        s = 1
        done = False
        try:
            while True:
                t, fn, args = agenda.pop()
                if env.now < t and (env.peek() <= t or (fn is None and s == k)):
                    # another event comes first or at the same time (or the requests finish:
                    # their closed-loop children are released on the SimPy clock)
                    tm.agenda = tm.clock = None
                    self.clock_waits += 1
                    yield from advance_to(env, t)
                tm.agenda = agenda
                tm.clock = t
                if fn is not None:  # a landing
                    fn(*args)
                    continue
                if args is not None:  # the end of a write-back hold: the step starts
                    agenda.push(t + durs[s - 1], None, None)
                    continue
                step_dur = durs[s - 1] if hold is None else t - start
                done = s == k
                # the row: the requests and blocks the step ran with (before its finished requests
                # leave); the batch's counters are committed at the end, and a request that joined
                # the running list during the step (its onboarding ended) counts its own
                running = len(sim.running)
                live = live0 + s * b + sum(r.n_computed for r in sim.running[b:])
                used = pool.num_used
                cached_free = pool.num_cached_free
                if done:
                    self._end_batch(sim, reqs, nc0, s, t)
                sim.tier_step_end()
                rec.record(1, start, step_dur, running, len(sim.waiting), 0, b, used,
                           cached_free, live)
                if done:
                    break
                sim.check_sim_time(t)
                nxt = self.next_step(reqs, nc0, s + 1, B, grow_at, reg_at)
                if nxt != 1:
                    # step s + 1 unscheduled, or its batch part scheduled: Scheduler.schedule
                    # goes on (as a cluster's replica, without a second on_iteration before it)
                    sim.iteration_begun = nxt == 2
                    break
                hold = sim.write_back_hold()  # (as the engine after a scheduling)
                s += 1
                start = t
                if hold is None:
                    agenda.push(t + durs[s - 1], None, None)
                else:  # (Simulator.wait_write_back's count)
                    sim.write_back_stall_s += hold - t
                    sim.write_back_stalls += 1
                    agenda.push(hold, None, True)
        finally:
            tm.agenda = tm.clock = None
        if env.now < t:  # (no other event before t: the SimPy clock catches up)
            self.clock_waits += 1
            yield from advance_to(env, t)
        for end, _, fn, args in sorted(agenda.heap):  # (landings after t, in their order)
            tm.at(end, fn, *args)
        if not done:
            self.commit_counts(reqs, nc0, s)
        if sim.check:
            sim.check_invariants()
        return s

    def advance_clocked(self, reqs, nc0, durs, k: int, live0: int, grow_at: dict, reg_at: dict,
                        start: float, hold: float | None):
        """:meth:`advance`'s steps when each is a SimPy timeout of its own (with a shared store,
        as a cluster's replica): the same steps, rows and scheduling, the clock advanced to
        every step's end (and to a write-back hold's end) where the per-step loop advances it,
        and the landings the steps issue left to SimPy. Arguments as :meth:`advance` prepares
        them: ``nc0`` the batch's computed tokens before step 1, ``durs`` the steps' durations
        (s; ``durs[0]`` the scheduled step's), ``k`` the step at whose end the first request
        finishes, ``live0`` the sum of ``nc0``, ``grow_at`` / ``reg_at`` the block buckets,
        ``start`` the first step's scheduling time (s) and ``hold`` its write-back hold (s) or
        None (already waited for). Returns the steps taken."""
        sim = self.sim
        env = sim.env
        pool = sim.pool
        rec = sim.rec
        B = sim.B
        b = len(reqs)
        on_iteration = sim.on_iteration
        timeout = env.timeout  # (simpy makes the bound method at each attribute access)
        t = env.now + durs[0]
        step_end = True  # (False: t is a write-back hold's end, the step starts there)
        s = 1
        while True:
            now = env.now
            if now < t:
                self.clock_waits += 1
                d = t - now
                if now + d == t:
                    yield timeout(d)
                else:
                    yield from advance_to(env, t)
            if not step_end:  # (the hold ended: the step runs)
                step_end = True
                t = t + durs[s - 1]
                continue
            step_dur = durs[s - 1] if hold is None else t - start
            done = s == k
            # the row: as TierStretch.advance's
            running = len(sim.running)
            live = live0 + s * b
            if running > b:
                live += sum(r.n_computed for r in sim.running[b:])
            used = pool.num_used
            cached_free = pool.num_cached_free
            if done:
                self._end_batch(sim, reqs, nc0, s, t)
            sim.tier_step_end()
            rec.record_step(start, step_dur, running, len(sim.waiting), 0, b, used,
                            cached_free, live)
            if done:
                break
            sim.check_sim_time(t)
            if on_iteration is not None:
                on_iteration()  # (between steps, before the next scheduling, as the loop)
            nxt = self.next_step(reqs, nc0, s + 1, B, grow_at, reg_at)
            if nxt != 1:
                sim.iteration_begun = nxt == 2
                break
            hold = sim.write_back_hold()
            s += 1
            start = t
            if hold is None:
                t = t + durs[s - 1]
            else:  # (Simulator.wait_write_back's count)
                sim.write_back_stall_s += hold - t
                sim.write_back_stalls += 1
                t = hold
                step_end = False
        if not done:
            self.commit_counts(reqs, nc0, s)
        if sim.check:
            sim.check_invariants()
        return s

    def _end_batch(self, sim, reqs, nc0, steps: int, t: float) -> None:
        """The stretch's last step (``steps`` of them) at time ``t`` (s): the batch's counters
        committed, the requests whose output is complete finished, and retired."""
        self.commit_counts(reqs, nc0, steps)
        for req in reqs:
            if req.n_generated >= req.output:
                req.status = FINISHED
                req.finish = t
        sim.retire_finished()

    def commit_counts(self, reqs, nc0, steps: int) -> None:
        """Commit ``steps`` decode steps to the counters of ``reqs`` (``nc0``: computed tokens
        before the first; every request sampled a token in each)."""
        for req, c in zip(reqs, nc0):
            req.n_computed = c + steps
            req.n_generated += steps

    def next_step(self, reqs, nc0, s: int, B: int, grow_at: dict, reg_at: dict) -> int:
        """For :meth:`TierStretch.advance`: schedule its step ``s`` (token index ``nc0[i] + s - 1``
        of request ``i``) as :meth:`Scheduler.schedule` would for the unchanged decode batch.
        ``grow_at`` and ``reg_at`` map a step to the indices of the requests whose token starts a
        block there (``nc0 + s > n_blocks x B``) and of those whose token fills one (``(nc0 + s) //
        B > n_cached``, with prefix caching), the stretch's buckets, moved on here. Returns 1 when
        that is the whole scheduling; 0 (nothing done) when the new blocks exceed the free ones (the
        scheduler preempts); 2 when the batch's part is done (its new blocks allocated and full
        blocks registered, in the scheduler's order) but the rest may decide something: the running
        list grew (an onboarding request joined it, after the batch in running order), or the
        waiting head may be admitted. :meth:`Scheduler.schedule` then does the rest: it finds the
        batch's blocks in place and goes on to the others and the admission. The head is checked as
        the scheduler checks it: while the memo of its last failed check holds (no key of its hit in
        the change logs, these evictions included) it fails again (no more blocks are free than
        then); else :meth:`Scheduler.admission_plan` decides."""
        sim = self.sim
        pool = sim.pool
        # requests whose step-s token starts a block, and those whose token fills one
        # (registered at this scheduling), in running order
        gi = grow_at.get(s)
        if gi is not None:
            gi.sort()
            if len(gi) > pool.num_free:
                return 0  # the scheduler preempts
        ri = reg_at.pop(s, None)
        if gi is not None or ri is not None:  # (else the batch's part is nothing)
            grow = [reqs[i] for i in gi] if gi is not None else []
            reg = ([], [])
            if ri is not None:
                ri.sort()
                for i in ri:
                    req = reqs[i]
                    full = (nc0[i] + s) // B
                    queue_registration(req, full, reg)
                    reg_at.setdefault((full + 1) * B - nc0[i], []).append(i)
            sim.kv.flush_grow(grow, reg)  # the new blocks, then the registrations, as the scheduler
        if gi is not None:
            del grow_at[s]
            for i in gi:  # (one block more: the next starts B tokens on)
                grow_at.setdefault(reqs[i].n_blocks * B - nc0[i] + 1, []).append(i)
        # the batch's part of the scheduling is done; the rest is the admission's
        if len(sim.running) != len(reqs):
            return 2
        head = sim.waiting[0] if sim.waiting else None
        if head is not None and sim.sched.head_retried(len(reqs)):
            kt = sim.kv.head_key_table(head)
            logs = pool.change_log + sim.tiers.change_log
            if kt is not None and not (logs and (kt.get_many(np.concatenate(logs)) >= 0).any()):
                # the memo of the head's last (failed) check holds, with no more free blocks
                # now: it fails again; the logs are cleared as the memo's revalidation clears them
                pool.change_log.clear()
                sim.tiers.change_log.clear()
            elif sim.sched.admission_plan(head, sim.max_tokens - len(reqs)) is not None:
                return 2  # it may be admitted: the scheduler does it
            # (else the admission's own checks, as the scheduler makes them, failed: its hit
            # walk is up to date and the logs cleared, as there)
        return 1
