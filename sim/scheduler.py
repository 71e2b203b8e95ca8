"""The vLLM-v1-like scheduler: which requests run in the next engine step, and with how many tokens.

:meth:`Scheduler.schedule` (vLLM v1 ``Scheduler.schedule``, vllm/v1/core/sched/scheduler.py)
serves running requests first, in order, each with its next tokens capped by the token budget
and ``long_prefill_token_threshold`` (preempting the last running request by recompute when the
pool is short), then admits waiting requests FCFS while the budget and ``max_num_seqs`` allow
(prefix hit, first chunk, blocks). It returns the step as a :class:`StepPlan` value; the
predicates below say which fast path (:mod:`sim.stretches`) may take the step."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .kv_manager import queue_registration
from .request import RUNNING, WAITING, Request
from .tiers.spec import REMOTE


@dataclass(slots=True)
class StepPlan:
    """One engine step as the scheduler decided it (vLLM v1's ``SchedulerOutput`` role).

    ``reqs``: the scheduled requests, running ones first in running order, then the admitted
    ones; ``tokens``: new tokens each computes this step; ``context``: tokens each has cached
    before its chunk (the attention context the cost model charges); ``samples``: requests
    whose chunk ends at their last token (they sample a token at the step's end); ``decodes``:
    running requests scheduled for exactly their one next decode token; ``admitted``: waiting
    requests admitted this step (those not onboarding are the last ones of ``reqs``);
    ``preempted``: whether a running request was preempted (then nothing was admitted)."""

    reqs: list
    tokens: list
    context: list
    samples: int
    decodes: int
    admitted: int
    preempted: bool


class Scheduler:
    """The scheduler of one engine (``sim``: its :class:`sim.engine.Simulator`, whose waiting and
    running queues it orders)."""

    def __init__(self, sim):
        self.sim = sim

    def preempt(self, req: Request) -> None:
        sim = self.sim
        if req.n_computed < req.prefill_end:  # the prompt tokens it will not compute now
            req.computed_prompt_tokens -= req.prefill_end - req.n_computed
        req.gen += 1
        req.load_event = None
        if req.layout is not None:
            sim.comp.finish(req)
            req.layout = None
            req.pstate = None
            req.compressed = False
        sim.kv.free_blocks(req)
        req.n_computed = 0
        req.status = WAITING
        req.preemptions += 1
        sim.rec.preemptions += 1
        sim.waiting.appendleft(req)

    def schedule(self) -> StepPlan:
        sim = self.sim
        # A decode token that starts a new block takes one block: those allocations are
        # deferred and made together, in running order, before any other allocation (so every
        # block id is the one the request-by-request order gives), while they fit the free
        # blocks; blocks a decode token fills are registered together (their keys are unique to
        # their requests). Both are flushed before a slow-path allocation and before admission.
        defer: list[Request] = []
        reg = ([], [])
        run_pass = self.dense_pass if sim.comp is None else self.running_pass
        sched_req, sched_n, sched_ctx, budget, samples, decodes, preempted = \
            run_pass(sim.max_tokens, defer, reg, sim.pool.num_free)
        if defer or reg[0]:
            sim.kv.flush_grow(defer, reg)
        admitted = 0
        if not preempted:
            budget, adm, admitted = self.admit(budget, sched_req, sched_n, sched_ctx)
            samples += adm
        return StepPlan(sched_req, sched_n, sched_ctx, samples, decodes, admitted, preempted)

    def grow_preempting(self, req: Request, upto: int) -> tuple[bool, bool]:
        """Grow ``req``'s block table to hold ``upto`` tokens, preempting the running queue's
        tail (:meth:`preempt`, the newest request first, as vLLM's scheduler does) until the
        pool has the blocks. Returns ``(grown, preempted)``: ``grown`` False when ``req``
        itself was preempted, ``preempted`` whether any request was."""
        sim = self.sim
        preempted = False
        while not sim.kv.grow(req, upto):
            victim = sim.running.pop()
            self.preempt(victim)
            preempted = True
            if victim is req:
                return False, True
        return True, preempted

    def running_pass(self, budget: int, defer: list, reg: tuple, free: int):
        """:meth:`Scheduler.schedule`'s pass over the running requests, in order, with ``budget``
        tokens, the empty deferred-allocation and registration lists ``defer`` and ``reg`` and
        ``free`` free blocks: each request's next tokens (capped by the budget and
        ``long_prefill_token_threshold``) and their slots, preempting the last running request
        while the pool is short. Returns ``(scheduled requests, their tokens, their contexts,
        budget left, samples, decodes, preempted)``; ``defer`` and ``reg`` may hold work left
        for :meth:`KVManager.flush_grow`."""
        sim = self.sim
        sched_req: list[Request] = []
        sched_n: list[int] = []
        sched_ctx: list[int] = []
        preempted = False
        running = sim.running
        long_thr = sim.long_thr
        B = sim.B
        caching = sim.caching
        ff_layout = sim.comp is not None and not sim.comp.hole_fill
        plain_ctx = ff_layout and not sim.comp.quest
        samples = 0  # scheduled requests whose chunk ends at their last token (they sample)
        decodes = 0  # running requests scheduled for exactly their one next decode token
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            c = req.n_computed  # (neither it nor the layout changes in this pass)
            g = req.n_generated
            rem = req.input + g - c
            n = rem
            if long_thr and n > long_thr:
                n = long_thr
            if n > budget:
                n = budget
            upto = c + n
            lay = req.layout
            if len(defer) < free and (n == 1 if lay is None else ff_layout and upto - req.n_placed == 1):
                # the fast path (most decode steps): one new token whose slot exists, or whose
                # one block is deferred as above, and a block it fills queued for registration;
                # a compressed layout (order-preserving) only records it
                if lay is None:
                    if upto > req.n_blocks * B:
                        defer.append(req)
                    if caching and upto // B > req.n_cached:
                        queue_registration(req, upto // B, reg)
                else:
                    # the block table's length (= layout.n_blocks + blocks_since; check_invariants)
                    if req.phys_base + req.pending + 1 > req.n_blocks * B:
                        defer.append(req)
                        req.blocks_since += 1  # = Compression.place(req, 1, 1)
                    req.pending += 1
                    req.n_placed += 1
                    if caching and not req.compressed and upto // B > req.n_cached:
                        queue_registration(req, upto // B, reg)
            else:
                if lay is None:
                    slow = upto > req.n_blocks * B or (caching and upto // B > req.n_cached)
                elif ff_layout:
                    slow = upto > req.n_placed or (caching and not req.compressed
                                                   and upto // B > req.n_cached)
                else:
                    slow = True
                if slow:
                    if defer or reg[0]:
                        sim.kv.flush_grow(defer, reg)
                        free = sim.pool.num_free
                    ok, lost = self.grow_preempting(req, upto)
                    preempted = preempted or lost
                    free = sim.pool.num_free
                    if not ok:
                        break
            sched_req.append(req)
            sched_n.append(n)
            if n == rem:
                samples += 1
                if n == 1 and g:
                    decodes += 1
            if lay is None:
                sched_ctx.append(c)
            elif plain_ctx:  # = Compression.physical_context without read-factor or Quest
                ctx = req.phys_base + req.pending if req.compressed else req.n_placed
                sched_ctx.append(max(0, ctx - n))
            else:
                sched_ctx.append(max(0, sim.comp.physical_context(req) - n))
            budget -= n
            i += 1
        return sched_req, sched_n, sched_ctx, budget, samples, decodes, preempted

    def dense_pass(self, budget: int, defer: list, reg: tuple, free: int):
        """:meth:`Scheduler.running_pass` without a compression policy (every block table
        dense): the same arguments, decisions, allocations, preemptions and result, with less
        work per decode token (one new token whose slot exists or whose one block is
        deferred)."""
        sim = self.sim
        running = sim.running
        long_thr = sim.long_thr
        B = sim.B
        caching = sim.caching
        sched_ctx: list[int] = []
        ctx_append = sched_ctx.append
        odd: list = []  # (index, tokens) of the scheduled requests not taking exactly one token
        n_defer = 0
        samples = 0
        decodes = 0
        preempted = False
        m = 0  # requests scheduled
        for req in running if budget > 0 else ():  # (a preemption pops the tail: it ends there)
            c = req.n_computed
            g = req.n_generated
            rem = req.input + g - c
            if rem == 1 and n_defer < free:
                # one new token (budget >= 1 here, a long-prefill cap >= 1): its slot exists, or
                # its one block is deferred; a block it fills is queued for registration
                if c >= req.n_blocks * B:
                    defer.append(req)
                    n_defer += 1
                if caching and (c + 1) // B > req.n_cached:
                    queue_registration(req, (c + 1) // B, reg)
                samples += 1
                if g:
                    decodes += 1
                ctx_append(c)
                m += 1
                budget -= 1
                if budget <= 0:
                    break
                continue
            n = rem
            if long_thr and n > long_thr:
                n = long_thr
            if n > budget:
                n = budget
            upto = c + n
            if n == 1 and n_defer < free:  # (rem > 1: a prompt's chunk of one token)
                if upto > req.n_blocks * B:
                    defer.append(req)
                    n_defer += 1
                if caching and upto // B > req.n_cached:
                    queue_registration(req, upto // B, reg)
            elif upto > req.n_blocks * B or (caching and upto // B > req.n_cached):
                if n_defer or reg[0]:
                    sim.kv.flush_grow(defer, reg)
                    n_defer = 0
                ok, lost = self.grow_preempting(req, upto)
                preempted = preempted or lost
                free = sim.pool.num_free
                if not ok:
                    break
            if n != 1:
                odd.append((m, n))
            if n == rem:
                samples += 1
                if n == 1 and g:
                    decodes += 1
            ctx_append(c)
            m += 1
            budget -= n
            if budget <= 0:
                break
        sched_n = [1] * m
        for j, n in odd:
            sched_n[j] = n
        return running[:m], sched_n, sched_ctx, budget, samples, decodes, preempted

    def admit(self, budget: int, sched_req: list, sched_n: list, sched_ctx: list):
        """The scheduler's admission: waiting requests FCFS while the token ``budget`` and
        ``max_num_seqs`` allow, each with its prefix hit (onboarding the host/disk part), its
        first chunk and the blocks for it, until one does not fit. Admitted requests join the
        running list and the step's lists (``sched_req``, ``sched_n``: chunk tokens,
        ``sched_ctx``: tokens cached before it). Returns ``(budget left, admitted requests whose
        chunk completes their prompt: they sample, admitted requests)``."""
        sim = self.sim
        samples = 0
        admitted = 0
        pool = sim.pool
        B = sim.B
        tiers = sim.tiers
        while sim.waiting and budget > 0 and len(sim.running) + sim.onboarding < sim.max_seqs:
            req = sim.waiting[0]
            if req.pd is not None and not req.pd.landed:  # (its KV comes from a prefill replica)
                if not self.admit_remote(req):
                    break
                admitted += 1
                continue
            plan = self.admission_plan(req, budget)
            if plan is None:
                break
            hit, tier_pos, tier_keys, tier_codes, n, blocking, gpu_blocks = plan
            num_tokens = req.num_tokens
            n_tier = 0 if tier_pos is None else len(tier_pos)
            hit_tokens = len(hit) * B
            pool.touch(gpu_blocks)
            if n_tier:
                hit = hit.copy()
                hit[tier_pos] = pool.allocate(n_tier)
            req.blocks[:len(hit)] = hit
            req.n_blocks = len(hit)
            req.n_cached = len(hit)
            req.n_computed = hit_tokens
            if len(hit) > req.peak_blocks:
                req.peak_blocks = len(hit)
            if sim.comp is not None:
                sim.comp.new_request(req)
                if hit_tokens:
                    sim.comp.place(req, hit_tokens, sim.comp.blocks_for(req, hit_tokens))
            sim.waiting.popleft()
            sim.kv.hit_memo = None
            if req.recompute_cut[0]:  # (tiers.load_or_recompute cut this hit)
                ri = sim.recomputed_instead_of_load
                ri["admissions"] += 1
                ri["tokens"] += req.recompute_cut[0]
                ri["disk_tokens"] += req.recompute_cut[1]
                req.recompute_cut = (0, 0)
            # per level below the GPU, level 1 first (tokens; sim.tiers.spec's codes)
            by_level = ([int(np.count_nonzero(tier_codes == lv)) * B
                         for lv in range(1, len(tiers.names) + 1)] if n_tier else None)
            # (a cluster's shared store: sim.kv_store)
            n_remote = int(np.count_nonzero(tier_codes == REMOTE)) * B if n_tier else 0
            if req.preemptions == 0:
                req.hit_tokens = hit_tokens
                req.first_scheduled = sim.env.now
                req.hit_tier = by_level
                req.hit_remote = n_remote
            else:  # a preempted request's lookup, counted apart (as vLLM's PrefixCacheStats)
                pl = sim.preempted_lookups
                pl["requests"] += 1
                pl["query_tokens"] += num_tokens
                pl["hit_tokens"]["gpu"] += hit_tokens - n_tier * B
                if by_level:
                    ht = pl["hit_tokens"]
                    for name, v in zip(tiers.names, by_level):
                        ht[name] += v
                if n_remote:
                    pl["hit_tokens"]["remote"] += n_remote
            if tiers is not None and len(gpu_blocks):
                keys = req.keys[:len(hit)]
                tiers.on_gpu_hit(keys[hit >= 0] if n_tier else keys)
            req.computed_prompt_tokens += num_tokens - hit_tokens  # (less, if preempted, what
            req.prefill_end = num_tokens                           # it had not computed yet)
            admitted += 1
            if n_tier:
                sim.kv.start_onboard(req, tier_pos, tier_keys, tier_codes, blocking)
            if blocking:
                continue
            if not sim.kv.grow(req, hit_tokens + n):  # cannot happen after the check above
                raise RuntimeError("allocation failed after capacity check")
            req.status = RUNNING
            sim.running.append(req)
            sched_req.append(req)
            sched_n.append(n)
            sched_ctx.append(hit_tokens)
            if hit_tokens + n == num_tokens:
                samples += 1
            budget -= n
        return budget, samples, admitted

    def admit_remote(self, req: Request) -> bool:
        """Admit the waiting head ``req`` of a decode replica, whose prompt's KV a prefill
        replica computed (prefill/decode disaggregation), as vLLM's scheduler admits a request
        with ``do_remote_prefill`` (vllm/v1/core/sched/scheduler.py with the NIXL connector's
        ``get_num_new_matched_tokens``): its local prefix hit (at most ``(input - 1) //
        block_size`` blocks), then blocks for the rest of its prompt (``ceil(input /
        block_size)`` in all), whose KV is received over the link
        (:meth:`sim.kv_manager.KVManager.start_receive`); it computes no token in this step.
        Returns False, admitting nothing, when the free blocks are short: it waits at the head
        of the queue (vLLM's allocation failing stops the admission loop) while the prefill
        replica holds its KV.

        With a compression policy the prompt's KV is what the prefill replica holds after its
        prefill-end round (the round of TensorRT-LLM's ``on_context_step_end`` hook, which runs
        where the context phase runs): its blocks, as many as its table holds, and its layout
        and policy state, which move to ``req``; the local hit covers at most the blocks that
        round left uncompressed (``intact_blocks``)."""
        sim = self.sim
        pool = sim.pool
        B = sim.B
        sim.kv.ensure_keys(req)
        p = req.pd.prefill
        max_hit = (req.input - 1) // B if sim.caching else 0
        if p.layout is None:
            n_prompt = -(-req.input // B)
        else:
            n_prompt = p.n_blocks
            if p.compressed and p.intact_blocks < max_hit:
                max_hit = p.intact_blocks
        hit = pool.lookup_prefix(req.keys, max_hit)
        need = n_prompt - len(hit)
        if need + pool.blocks_needed_for_touch(hit) > pool.num_free:
            return False
        pool.touch(hit)
        req.blocks[:len(hit)] = hit
        req.blocks[len(hit):n_prompt] = pool.allocate(need)
        req.n_blocks = n_prompt
        req.n_cached = len(hit)
        if n_prompt > req.peak_blocks:
            req.peak_blocks = n_prompt
        if p.layout is not None:
            take_compressed_kv(req, p)
        sim.waiting.popleft()
        req.pd.decode_hit_tokens = len(hit) * B
        sim.kv.start_receive(req, need)
        return True

    def admission_plan(self, req: Request, budget: int):
        """The admission's checks for the waiting head ``req`` with ``budget`` tokens left: its
        prefix hit (:meth:`KVManager.prefix_hit`), its first chunk, and its new blocks (a blocking
        onboard needs only its host/disk pages' blocks first) with the free hit blocks it would take
        against the free blocks. Returns None when it cannot be admitted now, else ``(hit table,
        tier positions, tier keys, tier codes, chunk tokens, blocking, GPU hit blocks)``."""
        sim = self.sim
        sim.kv.ensure_keys(req)
        hit, tier_pos, tier_keys, tier_codes = sim.kv.prefix_hit(req)
        n_tier = 0 if tier_pos is None else len(tier_pos)
        hit_tokens = len(hit) * sim.B
        n = self.chunk(req.num_tokens - hit_tokens, budget)
        if n < 0:
            return None
        blocking = n_tier > 0 and not sim.tiers.layerwise
        gpu_blocks = hit if n_tier == 0 else hit[hit >= 0]
        need = n_tier if blocking else -(-(hit_tokens + n) // sim.B) - len(hit) + n_tier
        if need + sim.pool.blocks_needed_for_touch(gpu_blocks) > sim.pool.num_free:
            return None
        return hit, tier_pos, tier_keys, tier_codes, n, blocking, gpu_blocks

    def chunk(self, rest: int, budget: int) -> int:
        """Tokens an admission schedules of the ``rest`` a request still needs with ``budget``
        tokens left: capped by ``long_prefill_token_threshold`` and the budget; -1 when it
        cannot start (no chunked prefill and the rest exceeds the budget)."""
        sim = self.sim
        if not sim.chunked and rest > budget:
            return -1
        if sim.long_thr and rest > sim.long_thr:
            rest = sim.long_thr
        return budget if rest > budget else rest

    def head_fits(self, budget: int) -> bool:
        """Whether :meth:`Scheduler.schedule` would admit the waiting head now (without tiers), with
        ``budget`` tokens left in the step: its prefix hit, chunk and new blocks against the
        free blocks, the checks the admission loop makes."""
        sim = self.sim
        req = sim.waiting[0]
        sim.kv.ensure_keys(req)
        hit = sim.kv.prefix_hit(req)[0]
        n = self.chunk(req.num_tokens - len(hit) * sim.B, budget)
        if n < 0:
            return False
        need = -(-(len(hit) * sim.B + n) // sim.B) - len(hit)
        return need + sim.pool.blocks_needed_for_touch(hit) <= sim.pool.num_free

    def pure_decode(self, plan: StepPlan) -> bool:
        """True if ``plan`` schedules every running request for exactly one decode token (each
        has sampled at least one token and computed all but its last) and admitted and preempted
        nobody (so the next steps repeat the same shape until an event changes it)."""
        if plan.admitted or plan.preempted:
            return False
        return len(plan.reqs) == len(self.sim.running) == plan.decodes

    def decode_and_admitted(self, plan: StepPlan, compressed: bool = True) -> bool:
        """True if ``plan`` is a pure-decode step of the running requests plus the admission
        of ``plan.admitted`` waiting requests whose chunk completes their prompt (each samples
        its first token at the step's end), with nobody preempted and no waiting request that a
        later step could admit on token budget and sequence slots: from the next step on the
        batch is pure decode, so :class:`sim.stretches.rounds.RoundsStretch` (``compressed``:
        the admitted requests have compressed layouts) or
        :class:`sim.stretches.decode.DecodeStretch` (not ``compressed``) can take this step as
        its first."""
        na = plan.admitted
        reqs = plan.reqs
        if not na or plan.preempted or len(reqs) != len(self.sim.running):
            return False
        if len(reqs) - na != plan.decodes:
            return False
        if self.head_retried(len(reqs)):
            # the head may have been stopped by the token budget this step's prefill chunks
            # took: the next step has it again, so the per-step loop may admit the head there
            return False
        for req, n in zip(reqs[-na:], plan.tokens[-na:]):
            if (compressed and req.layout is None) or req.n_computed + n != req.input + req.n_generated:
                return False
        return True

    def head_retried(self, b: int) -> bool:
        """Whether the scheduler tries the waiting head in a step whose ``b`` running requests
        take one token each: a request waits, the token budget has room after them, and the
        running and onboarding requests are below ``max_num_seqs``."""
        sim = self.sim
        return bool(sim.waiting) and sim.max_tokens > b and \
            len(sim.running) + sim.onboarding < sim.max_seqs

    def prefill_chunk_step(self, plan: StepPlan) -> bool:
        """True if ``plan`` is a chunked-prefill step that the next ones repeat: every running
        request scheduled, all but the last for its one next decode token, the last for a chunk
        of at least 2 tokens that leaves its prompt incomplete and takes the rest of the token
        budget (so the scheduler tries no waiting request), nobody admitted or preempted
        (:class:`sim.stretches.prefill.PrefillStretch`)."""
        sim = self.sim
        b = len(plan.reqs)
        if not b or plan.admitted or plan.preempted or b != len(sim.running):
            return False
        n = plan.tokens[-1]
        if plan.decodes != b - 1 or n < 2 or b - 1 + n != sim.max_tokens:
            return False
        p = plan.reqs[-1]
        return p.n_computed + n < p.input + p.n_generated


def take_compressed_kv(req: Request, p: Request) -> None:
    """Move the paged layout and policy state of ``p``, a prefill replica's request whose
    prefill ended, to ``req``, its decode replica's, whose block table holds as many blocks in
    the same order: the layout's lazy summary, its round point, whether and where it was
    compressed, and the tokens and blocks its rounds evicted and freed."""
    for name in ("layout", "pstate", "n_placed", "compressed", "intact_blocks", "pending",
                 "blocks_since", "phys_base", "next_round", "tokens_evicted", "blocks_freed"):
        setattr(req, name, getattr(p, name))
    p.layout = None
    p.pstate = None
