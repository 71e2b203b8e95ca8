"""The discrete-event engine: arrivals, a vLLM-v1-like scheduler, one SimPy event per step.

Data flow per engine step (vLLM v1 ``Scheduler.schedule``, vllm/v1/core/sched/scheduler.py):

1. Running requests first, in order: each gets ``num_tokens - num_computed_tokens`` new tokens
   (1 for decode; the rest of the prompt for a chunked prefill), capped by the remaining token
   budget (``max_num_batched_tokens``) and ``long_prefill_token_threshold``. If the pool cannot
   supply the slots, the lowest-priority running request (the last one) is preempted by
   recompute: its blocks are freed (last block first), its computed tokens reset to 0 and it goes
   to the front of the waiting queue. Its cached blocks may still serve it when it returns.
2. If nothing was preempted this step, waiting requests are admitted FCFS while the budget and
   ``max_num_seqs`` allow: prefix-cache lookup (at most ``(num_tokens - 1) // block_size`` blocks:
   the last token is always recomputed), then slots for the rest (chunked if the budget is short;
   without chunked prefill a prompt that does not fit the remaining budget waits).
3. The step's duration comes from the cost model; SimPy advances the clock by it.
4. At the end of the step computed tokens advance; a request whose tokens are all computed samples
   one token (the first one sets TTFT); a request with all its output tokens finishes, frees its
   blocks (last block first) and releases its closed-loop successor after its think time.

Full blocks are registered in the prefix index when their slots are allocated (as vLLM v1 does).
Block identity comes from the trace (see :mod:`sim.keys`).

Requests are rejected at arrival, with a reason, when ``input + output > max_model_len``
(``max_model_len``, as vLLM's API validation) or when the whole sequence needs more blocks than the
pool has (``kv_capacity``: without compression it could never run, even alone). The check counts
the uncompressed sequence: it does not credit a compression policy's evictions, which could let
such a request run (the CLI says so in a note when a compression run rejects any).
"""

from __future__ import annotations

import bisect
from collections import deque

import numpy as np
import simpy
from traces._common import MAX_ARRIVAL_S

from .block_pool import BlockPool
from .clock import advance_to
from .errors import ConfigError
from .hardware import check_prefill_budget
from .kv_manager import MEMO_LOG_MAX, KVManager
from .metrics import Recorder
from .request import FINISHED, ONBOARDING, REJECTED, RUNNING, WAITING, Request
from .scheduler import Scheduler
from .stretches.decode import DecodeStretch
from .stretches.prefill import PrefillStretch
from .stretches.rounds import RoundsStretch
from .stretches.tiers import TierStretch
from .tiers.manager import joined

# Latest simulated time (s) a run may reach: the bound arrivals are checked against; past it
# float64 seconds lose the microsecond.
MAX_CLOCK_S = MAX_ARRIVAL_S


class Simulator:
    """Replays a workload through the paged KV cache.

    Args: workload: a :class:`traces.Workload` (rows ordered parents before children).
    num_gpu_blocks, block_size: the pool. scheduler: scheduler config node; cache: cache config
    node. cost_model: object with ``step_time(new_tokens, context_tokens, samples)``. max_model_len:
    longest accepted request (input + output tokens). recorder: metrics sink; check_invariants:
    verify pool invariants after every step. prefix_index: ``dict`` | ``table`` | ``auto`` (=
    ``table``; see :class:`sim.block_pool.BlockPool`). progress: a callable ``progress(n_done)`` or
    None.

    As one replica of a cluster (:class:`sim.cluster.Cluster`): ``env``, the cluster's SimPy
    environment (None: the engine makes its own); ``release``, a callable ``release(row, think_s)``
    that takes each closed-loop child this engine's requests release (the cluster routes it
    after its think time; None: it arrives here); ``on_iteration``, a callable run once between
    steps, before the next scheduling: at the top of every pass of the engine loop (after each
    step or fast-forward stretch) and between the steps of a stretch that keeps one SimPy timeout
    per step (:class:`sim.stretches.tiers.TierStretch`); the cluster publishes the replica's KV
    events there. A replica's loop does not end when its own requests are done: it waits for the
    next arrival the cluster routes to it, and the cluster's run ends when every request is
    done.

    As a replica of a disaggregated cluster (prefill/decode): ``hand_off``, on a prefill
    replica, a callable ``hand_off(req)`` that takes each request whose prefill ended (its one
    token sampled: a prefill replica serves every request with one output token, as vLLM's
    disaggregated proxy sends ``max_tokens=1``); the request keeps its blocks (``handed``)
    until the cluster calls :meth:`free_handed` once its KV has crossed to the decode replica;
    ``receive``, on a decode replica, a callable ``receive(req, blocks)`` returning the SimPy
    process body of the KV transfer of ``blocks`` blocks into ``req``'s blocks
    (:meth:`arrive_remote`, :meth:`sim.kv_manager.KVManager.start_receive`)."""

    def __init__(self, workload, num_gpu_blocks: int, block_size: int, scheduler, cache,
                 cost_model, max_model_len: int, recorder: Recorder,
                 check_invariants: bool = False, progress=None, max_sim_time_s=None,
                 fast_forward: bool = True, tiers=None, num_layers: int = 1, compression=None,
                 prefix_index: str = "auto", env=None, release=None, on_iteration=None,
                 hand_off=None, receive=None):
        self.wl = workload
        self.B = int(block_size)
        if prefix_index == "auto":
            # the compiled table is faster than the dict at every batch size (sim/block_pool.py)
            prefix_index = "table"
        self.prefix_index = prefix_index
        self.pool = BlockPool(num_gpu_blocks, cache.enable_prefix_caching, index=prefix_index)
        self.caching = bool(cache.enable_prefix_caching)
        # a request's generated tokens take its continuation's keys (sim/keys.py)
        self.reuse_answers = self.caching and bool(cache.reuse_answer_blocks)
        self.max_seqs = int(scheduler.max_num_seqs)
        self.max_tokens = int(scheduler.max_num_batched_tokens)
        self.chunked = bool(scheduler.enable_chunked_prefill)
        self.long_thr = int(scheduler.long_prefill_token_threshold)
        self.cost = cost_model
        self.max_model_len = int(max_model_len)
        self.rec = recorder
        self.check = bool(check_invariants)
        self.progress = progress
        self.max_sim_time = max_sim_time_s
        self.fast_forward = bool(fast_forward)
        check_prefill_budget(self.max_tokens, self.max_model_len, self.chunked)
        self.env = simpy.Environment() if env is None else env
        self.release = release
        self.on_iteration = on_iteration
        # a stretch ran on_iteration after its last step and began the next scheduling
        # (TierStretch): the loop's next pass does not run on_iteration again
        self.iteration_begun = False
        self.hand_off = hand_off
        self.receive = receive
        self.handed: dict = {}  # rid -> request whose prefill ended, holding its blocks
        # tiers: a factory env -> TierManager (None = GPU only)
        self.tiers = tiers(self.env) if tiers is not None else None
        if self.tiers is not None:  # (the requests table's columns per level of its chain)
            recorder.levels = self.tiers.names
        self.num_layers = max(1, int(num_layers))
        self.onboarding = 0
        self.onboarding_reqs: dict = {}  # rid -> request in a blocking onboard (with self.check)
        self.comp = compression if compression is not None and compression.active else None
        self.round_time = 0.0  # round costs charged to the next step
        self.rounds: list[tuple] = []
        if self.comp is not None and self.comp.hole_fill:
            # hole-filled appends land in scattered slots: no closed form for block crossings
            self.fast_forward = False
        if self.comp is not None and self.comp.step_scoring:
            # per-step scoring (H2O, TOVA, ...) adds a cost that grows with each request's
            # length every step; the stretch's step times do not model it
            self.fast_forward = False
        # compression runs whose step times depend on the batch's context sum only (no
        # sliding-window layers) and whose pool no tier sees run their rounds inside stretches
        # (RoundsStretch); every other run's decode steps take DecodeStretch
        self.rounds_in_stretches = (self.comp is not None and self.tiers is None
                                    and not getattr(self.cost, "win_layers", 0))
        # without compression and tiers an admission step whose chunks complete their prompts
        # becomes the first step of the dense stretch after it (DecodeStretch)
        self.admit_in_stretches = self.comp is None and self.tiers is None
        self.kv = KVManager(self)
        self.sched = Scheduler(self)
        self.ff_prefill = PrefillStretch(self)
        self.ff_decode = DecodeStretch(self)
        self.ff_rounds = RoundsStretch(self)
        self.ff_tiers = TierStretch(self)
        # the fast paths, in the order the loop asks them (their conditions exclude each other),
        # and those this run's configuration lets take a step
        self.stretches = (self.ff_tiers, self.ff_rounds, self.ff_decode, self.ff_prefill)
        self.candidates = tuple(s for s, on in (
            (self.ff_tiers, self.tiers is not None and self.comp is None),
            (self.ff_rounds, self.rounds_in_stretches),
            (self.ff_decode, not self.rounds_in_stretches),
            (self.ff_prefill, self.admit_in_stretches)) if on)
        if self.tiers is not None:
            self.pool.cached_log = []
            self.pool.change_log = []
            # the decode stretch issues each step's offloads at that step's end time and, with
            # requests waiting, stops where tier changes could admit one
            # (DecodeStretch.tier_cap), so tiers keep it exact
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.n = len(workload)
        self.reqs: list[Request | None] = [None] * self.n
        self.done = 0
        # prefix lookups of preempted requests re-admitted (the requests' own hit columns count
        # their first admission only): lookups, tokens looked up, hit tokens by serving tier
        self.preempted_lookups = {"requests": 0, "query_tokens": 0,
                                  "hit_tokens": dict.fromkeys(("gpu",) + recorder.levels, 0)}
        # tiers.load_or_recompute: admissions whose hit was cut at a disk page because loading
        # would take longer than recomputing, the hit tokens given up, and those held on disk
        self.recomputed_instead_of_load = {"admissions": 0, "tokens": 0, "disk_tokens": 0}
        self.wake = None
        # write_back: the step holds until the evicted cached blocks' copies land
        # (TierManager.write_back); _wb_until: when the last one issued lands (s)
        self.write_back_on = self.tiers is not None and self.tiers.write_policy == "write_back"
        if self.write_back_on:  # (only write_back copies evicted cached blocks down)
            self.pool.evict_log = []
        self.wb_until = 0.0
        self.write_back_stall_s = 0.0  # total time steps waited for those copies
        self.write_back_stalls = 0  # steps that waited
        # workload columns as numpy
        self.w_rid = workload.request_id
        self.w_arrival = workload.arrival_s
        self.w_think = workload.think_s
        self.w_parent = workload.parent_request_id
        self.w_in = workload.input_tokens
        self.w_out = workload.output_tokens
        self.p_off = workload.prefix_offsets()
        self.p_val = workload.prefix_values()
        self.G = int(workload.prefix_block_tokens)
        # children lists (closed loop): row index of parent -> child rows
        self.children: dict[int, list[int]] = {}
        rid_to_row = None
        parents = np.asarray(self.w_parent)
        has_parent = np.flatnonzero(parents >= 0)
        if len(has_parent):
            rid_to_row = {int(r): i for i, r in enumerate(np.asarray(self.w_rid).tolist())}
            for i in has_parent.tolist():
                p = rid_to_row[int(parents[i])]
                self.children.setdefault(p, []).append(i)
        self.roots = np.flatnonzero(parents < 0)
        # root arrival times, ascending (the arrival process's order; Simulator.tie_inside reads them)
        # (a list: bisect on a list is faster than np.searchsorted for one value at a time)
        self.root_times = np.sort(np.asarray(self.w_arrival, dtype=np.float64)[self.roots],
                                  kind="stable").tolist()

    def _arrivals(self):
        env = self.env
        arr = self.w_arrival
        order = self.roots[np.argsort(arr[self.roots], kind="stable")]
        for i in order.tolist():
            t = float(arr[i])
            if t > env.now:
                yield env.timeout(t - env.now)
            self._arrive(i)

    def _arrive(self, i: int) -> None:
        env = self.env
        req = Request(i, int(self.w_rid[i]), env.now, int(self.w_in[i]), int(self.w_out[i]))
        self.reqs[i] = req
        total = req.input + req.output
        # blocks for every token that gets a KV slot: all but the last sampled token
        req.total_blocks = -(-(total - 1) // self.B)
        if total > self.max_model_len:
            self._reject(req, "max_model_len")
            return
        if req.total_blocks > self.pool.num_blocks:
            self._reject(req, "kv_capacity")
            return
        if self.hand_off is not None:  # (a prefill replica: the prompt and one token)
            req.output = 1
            req.total_blocks = -(-req.input // self.B)
        self.waiting.append(req)
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def arrive_remote(self, i: int, handoff) -> None:
        """Workload row ``i`` arrives now on this decode replica with its prompt's KV computed
        by a prefill replica (``handoff``: a :class:`sim.cluster.Handoff`, whose ``prefill``
        request gives the row's arrival, first scheduling, prefix hit and its split by tier,
        the onboarding times of its tiers, computed prompt tokens and preemptions so far). It waits in the queue; its admission allocates the blocks of
        its whole prompt, its local prefix hit first, and the rest receive the KV
        (:meth:`sim.scheduler.Scheduler.admit_remote`)."""
        p = handoff.prefill
        req = Request(i, int(self.w_rid[i]), p.arrival, int(self.w_in[i]), int(self.w_out[i]))
        self.reqs[i] = req
        req.total_blocks = -(-(req.input + req.output - 1) // self.B)
        req.first_scheduled = p.first_scheduled
        req.hit_tokens = p.hit_tokens
        req.hit_tier = None if p.hit_tier is None else list(p.hit_tier)
        req.hit_remote = p.hit_remote
        req.onboard_tier_s = None if p.onboard_tier_s is None else list(p.onboard_tier_s)
        req.onboard_remote_s = p.onboard_remote_s
        req.computed_prompt_tokens = p.computed_prompt_tokens
        req.preemptions = p.preemptions
        req.pd = handoff
        self.waiting.append(req)
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def free_handed(self, req: Request) -> None:
        """A prefill replica's request whose KV has crossed to its decode replica: its blocks
        return to the pool (last block first; the full ones stay cached)."""
        del self.handed[req.rid]
        self.kv.free_blocks(req)
        req.keys = None
        req.blocks = None
        if self.wake is not None and not self.wake.triggered:
            self.wake.succeed()

    def tie_inside(self, lo: float, end: float) -> bool:
        """Whether a root arrival lands strictly inside the step ``(lo, end)`` (s) and the next
        root arrival after it lands exactly at ``end``. The arrival process creates that next
        arrival's timeout during the step, after the per-step loop created the step's timeout,
        so SimPy (equal times run in creation order) ends the step first and the scheduling at
        ``end`` does not see that arrival; a fast-forward stretch, whose clock waits are created
        later, would let it in first. Stretches end before such a step."""
        rt = self.root_times
        i = bisect.bisect_left(rt, end)
        return 0 < i < len(rt) and rt[i] == end and rt[i - 1] > lo

    def _release_children(self, i: int) -> None:
        kids = self.children.get(i)
        if not kids:
            return
        env = self.env
        for c in kids:
            think = float(self.w_think[c])
            if self.release is not None:
                self.release(c, think)
            elif think <= 0:
                self._arrive(c)
            else:
                ev = env.timeout(think)
                ev.callbacks.append(lambda _ev, c=c: self._arrive(c))

    def _reject(self, req: Request, reason: str) -> None:
        req.status = REJECTED
        req.reason = reason
        req.finish = self.env.now
        self.done += 1
        self.rec.request_done(req)
        self._release_children(req.idx)

    def run_round(self, req: Request, now: float | None = None) -> None:
        """Run one compression round on ``req`` and return its freed blocks to the pool.
        ``now``: the round's time (s) when it is not the SimPy clock's (a fast-forward stretch
        runs the rounds of its steps before its single timeout)."""
        pool = self.pool
        comp = self.comp
        table = req.blocks[:req.n_blocks]
        # leading blocks shared with other requests (prefix hits)
        res, dur, pinned = comp.run_round(req, pool.shared_lead(req.blocks, req.n_blocks))
        if not req.compressed:
            # blocks past the pinned prompt no longer hold the uncompressed text
            first = pinned // self.B
            pool.uncache(table[first:])
            req.compressed = True
            req.intact_blocks = first
        freed_idx = res.freed_block_indices
        if len(freed_idx):
            freed = table[freed_idx]
            nf = len(freed_idx)
            if int(freed_idx[0]) != req.n_blocks - nf:  # else the table's tail: nothing moves
                keep = np.ones(req.n_blocks, dtype=bool)
                keep[freed_idx] = False
                kept = table[keep]
                req.blocks[:len(kept)] = kept
            req.n_blocks -= nf
            pool.free(freed[::-1])
        req.tokens_evicted += int(round(res.tokens_evicted))
        req.blocks_freed += res.blocks_freed
        self.round_time += dur
        self.rounds.append((
            self.env.now if now is None else now, req.rid, comp.name, comp.compaction,
            res.tokens_before, res.tokens_kept, res.tokens_evicted, res.blocks_before,
            res.blocks_after, res.blocks_freed, res.bytes_moved, res.tokens_moved,
            res.ragged_waste_slots, res.metadata_bytes,
            req.layout.fragmentation(int(res.kept_per_group.sum())), dur))

    def _engine(self):
        env = self.env
        rec = self.rec
        # (a cluster's replica serves part of the n requests: its loop waits for arrivals until
        # the cluster's run ends)
        while self.done < self.n:
            if self.iteration_begun:
                self.iteration_begun = False
            elif self.on_iteration is not None:
                self.on_iteration()
            if not self.running and not self.waiting:
                self.wake = env.event()
                yield self.wake
                self.wake = None
                continue
            plan = self.sched.schedule()
            sched_req = plan.reqs
            sched_n = plan.tokens
            hold = self.write_back_hold()
            if not sched_req and (self.onboarding or self.handed):
                # nothing runnable until an onboarding request's pages arrive, a handed-off
                # request's blocks return (or an arrival)
                self.wake = env.event()
                yield self.wake
                self.wake = None
                continue
            if not sched_req:
                raise RuntimeError(
                    f"scheduler deadlock at t={env.now:.3f}s: {len(self.waiting)} waiting, "
                    f"{len(self.running)} running, {self.pool.num_free} free blocks")
            n_arr = np.asarray(sched_n, dtype=np.int64)
            ctx_arr = np.asarray(plan.context, dtype=np.int64)
            dt = self.cost.step_time(n_arr, ctx_arr, plan.samples)
            extra_dt = 0.0
            if self.comp is not None:
                extra_dt = self.round_time
                self.round_time = 0.0
                if self.comp.step_scoring:
                    extra_dt += sum(self.comp.step_extra_time(r) for r, n in zip(sched_req, sched_n)
                                    if r.layout is not None and n == 1)
                dt += extra_dt
            if self.fast_forward:
                for stretch in self.candidates:
                    if stretch.eligible(plan, dt, hold):
                        break
                else:
                    stretch = None
                if stretch is not None and \
                        (yield from stretch.run(plan, n_arr, ctx_arr, dt, extra_dt, hold)):
                    self.check_sim_time()
                    continue
            start = env.now
            if hold is not None:
                yield from self.wait_write_back(hold)
            yield env.timeout(dt)
            if self.tiers is not None and self.tiers.layerwise:
                loads = [r.load_event for r in sched_req
                         if r.load_event is not None and not r.load_event.processed]
                if loads:
                    # layer-by-layer overlap: the last layer's attention waits for its KV
                    t_wait = env.now
                    yield simpy.AllOf(env, loads)
                    yield env.timeout(dt / self.num_layers)
                    stall = env.now - t_wait
                    for r in sched_req:
                        if r.load_event in loads and r.n_generated == 0:
                            r.onboard_s += stall
                    dt = env.now - start
                for r in sched_req:
                    if r.load_event is not None and r.load_event.processed:
                        r.load_event = None
            if hold is not None:
                dt = env.now - start  # (the step's row: the wait included)
            now = env.now
            finished = False
            decode_tokens = 0
            prefill_tokens = 0
            live = 0  # computed tokens of the scheduled requests (those finishing included)
            comp = self.comp
            for req, n in zip(sched_req, sched_n):
                c = req.n_computed
                if c >= req.input and n == 1:
                    decode_tokens += 1
                else:
                    prefill_tokens += n
                c += n
                req.n_computed = c
                if comp is not None and req.layout is not None and c >= req.input:
                    # Compression.due is False unless the prefill ended now or the cached round
                    # point is reached: test those here before the call
                    pd = c - n < req.input
                    if (pd or (req.next_round is not None and c >= req.next_round)) \
                            and comp.due(req, pd):
                        self.run_round(req)  # (it changes no token count)
                g = req.n_generated
                if c == req.input + g:
                    g += 1
                    req.n_generated = g
                    if g == 1:
                        req.first_token = now
                    if g >= req.output:
                        req.status = FINISHED
                        req.finish = now
                        finished = True
                live += c
            # the step's row counts the requests and blocks it ran with: before its finished
            # requests leave (the waiting count after, with the requests they release)
            running = len(self.running)
            if running != len(sched_req):
                # (some running request was not scheduled, or joined during the step: its
                # onboarding ended) the whole running list's counters
                live = self.live_tokens()
            used = self.pool.num_used
            cached_free = self.pool.num_cached_free
            if finished:
                self.retire_finished()
            if self.tiers is not None:
                self.tier_step_end()
            rec.record_step(start, dt, running, len(self.waiting), prefill_tokens,
                            decode_tokens, used, cached_free, live)
            if self.check:
                self.check_invariants()
            self.check_sim_time()

    def write_back_hold(self) -> float | None:
        """write_back, after a scheduling: issue the copies of the cached blocks it evicted
        (:meth:`sim.tiers.TierManager.write_back`) and return when they land (s), the time the
        step and onboarding into those blocks wait for; None when nothing is to wait for. The
        scheduling's time is the tiers' (:meth:`sim.tiers.TierManager.now`)."""
        if not (self.write_back_on and self.pool.evict_log):
            return None
        end = self.tiers.write_back(joined(self.pool.evict_log))
        self.pool.evict_log.clear()
        if end > self.tiers.now():
            self.wb_until = end
            return end
        return None

    def wait_write_back(self, hold: float):
        """SimPy process fragment: a held step waits until ``hold`` (s), counted in
        ``write_back_stalls`` / ``write_back_stall_s``."""
        self.write_back_stall_s += hold - self.env.now
        self.write_back_stalls += 1
        yield from advance_to(self.env, hold)

    def check_sim_time(self, now: float | None = None) -> None:
        """ConfigError once the clock (``now``, s; default the SimPy clock) has passed
        ``sim.max_sim_time_s`` or 2**32 s (checked after every step and every fast-forward
        stretch, which ends at the step that passes it)."""
        if now is None:
            now = self.env.now
        if now > MAX_CLOCK_S:
            raise ConfigError(
                f"the simulated clock passed 2**32 s (~136 years) at t={now:.6g} s with "
                f"{self.done} of {self.n} requests done: float64 seconds stop resolving a "
                f"microsecond there; expected step and transfer times that keep the run inside "
                f"it (check the cost.* and tiers.* options: a step overhead, latency, efficiency or "
                f"bandwidth off by orders of magnitude?)")
        if self.max_sim_time is not None and now > self.max_sim_time:
            raise ConfigError(
                f"sim.max_sim_time_s={self.max_sim_time}: the simulated clock passed it at "
                f"t={now:.3f} s with {self.done} of {self.n} requests done; expected a limit "
                f"the run fits in (raise it, or null for no limit)")

    def tier_step_end(self) -> None:
        pool = self.pool
        tiers = self.tiers
        if self.kv.hit_memo is not None and \
                sum(map(len, pool.change_log)) + sum(map(len, tiers.change_log)) > MEMO_LOG_MAX:
            # the head has not been walked for a long time (e.g. max_num_seqs reached): drop the
            # memo rather than let the logs grow
            self.kv.hit_memo = None
        if self.kv.hit_memo is None:  # nothing to revalidate: keep the change logs short
            pool.change_log.clear()
            tiers.change_log.clear()
        if pool.cached_log:
            # (write_through is the only policy copying them down now; a shared store takes them)
            if tiers.write_policy == "write_through" or tiers.store is not None:
                tiers.on_gpu_cached(np.concatenate(pool.cached_log))
            pool.cached_log.clear()
        tiers.flush()

    def retire_finished(self) -> None:
        """Free the finished requests' blocks, record them and release their closed-loop
        children, in running order; the others stay running, in order."""
        self.retire([req for req in self.running if req.status == FINISHED])
        self.drop_finished()

    def drop_finished(self) -> None:
        """The running list without the retired (finished) requests, in order; progress."""
        self.running = [req for req in self.running if req.status != FINISHED]
        if self.progress is not None:
            self.progress(self.done)

    def retire(self, done: list, freed: bool = False) -> None:
        """Free the finished requests ``done``'s blocks (in that order; ``freed``: the pool already
        took them back, :meth:`DecodeStretch.allocate_finishing`), record them and release their
        closed-loop children."""
        rec = self.rec
        for req in done:
            if self.hand_off is not None:  # (a prefill replica: the KV goes to a decode replica)
                self.handed[req.rid] = req
                self.hand_off(req)
                continue
            if req.layout is not None:
                # = live tokens after Compression.sync: each pending token takes a slot in
                # every group
                req.end_live = int(round(float((req.layout.live_tokens() + req.pending).mean())))
                req.end_blocks = req.n_blocks
                self.comp.finish(req)
                req.layout = None
                req.pstate = None
            else:
                req.end_live = req.n_computed
                req.end_blocks = req.n_blocks
            if freed:
                req.n_blocks = 0
                req.n_cached = 0
            else:
                self.kv.free_blocks(req)
            req.keys = None
            req.blocks = None
            self.done += 1
            rec.request_done(req)
            self._release_children(req.idx)

    def live_tokens(self) -> int:
        return sum(r.n_computed for r in self.running)

    def check_invariants(self) -> None:
        """Assert pool and request invariants (``sim.check_invariants``)."""
        for r in self.running:
            if r.layout is not None:  # the scheduler's fast path reads n_blocks for this sum
                assert r.n_blocks == r.layout.n_blocks + r.blocks_since, (
                    f"request {r.rid}: block table {r.n_blocks} != layout {r.layout.n_blocks} + "
                    f"{r.blocks_since}")
        # (a request in a blocking onboard holds its blocks outside the running list)
        onboarding = list(self.onboarding_reqs.values())
        assert len(onboarding) == self.onboarding, "onboarding count differs from its requests"
        assert all(r.status == ONBOARDING for r in onboarding)
        handed = list(self.handed.values())  # (a prefill replica's, until their KV has crossed)
        held = [r.blocks[:r.n_blocks] for r in self.running + onboarding + handed if r.n_blocks]
        held_arr = np.concatenate(held) if held else np.empty(0, np.int64)
        self.pool.check(held_arr)
        # every block held by a table: ref count >= number of tables holding it
        if len(held_arr):
            counts = np.bincount(held_arr, minlength=self.pool.num_blocks)
            assert (self.pool.ref_cnt >= counts).all(), "ref count below table references"
            assert (self.pool.ref_cnt == counts).all(), "ref count not equal to table references"
        for r in self.running:
            assert r.status == RUNNING
            if r.layout is None:
                assert r.n_computed <= r.n_blocks * self.B, "computed tokens exceed slots"
                continue
            self.comp.sync(r)
            lay = r.layout
            assert lay.n_blocks == r.n_blocks, f"layout {lay.n_blocks} blocks != table {r.n_blocks}"
            assert r.n_computed <= r.n_placed, "computed tokens without a slot"
            for g in range(lay.num_groups):
                pos = lay.slot_pos[g]
                pos = pos[pos >= 0]
                assert len(np.unique(pos)) == len(pos), "a token in two slots of one group"
        for r in self.waiting:
            assert r.n_blocks == 0 and r.status == WAITING
        tm = self.tiers
        if tm is not None:
            for sp, st in zip(tm.specs, tm.stores):
                assert len(st) <= sp.capacity_pages, \
                    f"{sp.name} holds {len(st)} > {sp.capacity_pages} pages"

    def stretch_counts(self) -> dict:
        """Which fast paths ran: ``{stretch name: {"taken": stretches advanced, "steps": engine
        steps they covered}}`` (:class:`sim.stretches.base.Stretch`)."""
        return {s.name: s.counters() for s in self.stretches}

    def run(self) -> None:
        """Run until every request has finished or been rejected. Raises ConfigError when the
        clock passes ``sim.max_sim_time_s`` or 2**32 s (:meth:`Simulator.check_sim_time`; the latter
        also when tier copies still landing after the last request take it there)."""
        self.env.process(self._arrivals())
        self.env.process(self._engine())
        self.env.run()
        # the pool's peak: the most blocks held at once (BlockPool.peak_used)
        self.rec.peak_blocks_used = max(self.rec.peak_blocks_used, self.pool.peak_used)
        if self.env.now > MAX_CLOCK_S:
            # (tier copies still landing after the last request: a disk latency or bandwidth
            # off by orders of magnitude)
            self.check_sim_time()
        if self.done != self.n:
            raise RuntimeError(f"simulation ended with {self.n - self.done} requests unfinished")
        if self.check:
            ids = [row[0] for row in self.rec.rows]
            assert len(ids) == self.n and len(set(ids)) == self.n, \
                "a request did not end in exactly one terminal state"
