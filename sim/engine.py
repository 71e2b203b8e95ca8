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
import heapq
import math
from collections import deque

import numpy as np
import simpy
from traces._common import MAX_ARRIVAL_S

from .block_pool import NO_HASH, BlockPool, KeyTable
from .clock import exact_delays, step_ends
from .jit import kernel
from .keys import block_keys, continues
from .metrics import Recorder
from .tiers import DISK, GPU, HOST, _joined

WAITING, RUNNING, FINISHED, REJECTED, ONBOARDING = 0, 1, 2, 3, 4
MEMO_LOG_MAX = 1 << 18  # keys logged while a hit-walk memo waits; past this the memo is dropped
STATUS_NAMES = {WAITING: "waiting", RUNNING: "running", FINISHED: "finished", REJECTED: "rejected",
                ONBOARDING: "onboarding"}


def _advance_to(env, end: float):
    """SimPy process fragment: advance the clock to exactly ``end`` (>= now), so a stretch of
    steps timed as one lands on the clock value the per-step loop's additions (``now += dt`` per
    step) reach (:func:`sim.clock.exact_delays`)."""
    for d in exact_delays(env.now, end):
        yield env.timeout(d)


def _waiting_per_step(waiting0: int, log: list, ends: np.ndarray) -> np.ndarray:
    """Waiting requests after each step of a fast-forward stretch: ``waiting0``, then the count
    after the last event (``log``: ``(time, waiting)``, ascending) before each step's end time
    (``ends``, s). Returns int64, shape ``(len(ends),)``."""
    out = np.full(len(ends), waiting0, dtype=np.int64)
    if log:
        t = np.array([x[0] for x in log])
        n = np.array([x[1] for x in log], dtype=np.int64)
        i = np.searchsorted(t, ends, side="left") - 1
        out[i >= 0] = n[i[i >= 0]]
    return out


def _block_pairs(first: np.ndarray, last: int, B: int):
    """The (request, step) pairs of a decode stretch's new blocks: request ``i`` takes one at
    steps ``first[i], first[i] + B, ...`` up to step ``last``. Returns ``(count per request,
    request index per pair, step per pair)``, pairs in request-major order (int64 arrays; two
    compiled passes)."""
    first = np.ascontiguousarray(first, dtype=np.int64)
    cnt = np.empty(len(first), dtype=np.int64)
    n = _pair_counts(first, last, B, cnt)
    pi = np.empty(n, dtype=np.int64)
    ps = np.empty(n, dtype=np.int64)
    _pair_fill(first, B, cnt, pi, ps)
    return cnt, pi, ps


@kernel("i8(i8[:], i8, i8, i8[:])")
def _pair_counts(first, last, B, cnt):  # pragma: no cover (compiled)
    n = 0
    for i in range(first.shape[0]):
        c = (last - first[i]) // B + 1 if first[i] <= last else 0
        cnt[i] = c
        n += c
    return n


@kernel("void(i8[:], i8, i8[:], i8[:], i8[:])")
def _pair_fill(first, B, cnt, pi, ps):  # pragma: no cover (compiled)
    k = 0
    for i in range(first.shape[0]):
        for j in range(cnt[i]):
            pi[k] = i
            ps[k] = first[i] + B * j
            k += 1


@kernel("UniTuple(i8, 2)(i8[:], i8[:], i8, i8, i8, i8[:], i8[:], i8[:], i8[:])")
def _stretch_pairs(slot0, last, B, k, free, extra, alloc, pi, ps):  # pragma: no cover (compiled)
    """The new blocks of a dense decode stretch of ``k`` steps: request ``i``'s token at step
    ``s`` (index ``slot0[i] + s - 1``) starts a block at steps ``s0 = 2 + (-(slot0[i] + 1)) mod
    B``, ``s0 + B``, ... up to its last step ``last[i]`` (it finishes there) or ``k`` (step 1's
    block came with its scheduling). Fills ``alloc[s]`` (blocks needed at step ``s``, shape
    ``(k + 1,)``) and the pairs (``pi``: request, ``ps``: step; room for ``len(slot0) x ((k -
    2) // B + 1)``) in allocation order: by step, then request. ``extra`` (empty, or shape
    ``(k + 1,)``) holds blocks other requests take at each step (a prefill chunk's): counted
    against ``free``, not in ``alloc`` or the pairs. When the cumulative need exceeds ``free``
    blocks, ``k`` is cut to the last step whose cumulative need fits. Returns ``(k, number of
    pairs)``."""
    b = slot0.shape[0]
    for s in range(k + 1):
        alloc[s] = 0
    for i in range(b):
        s = 2 + (-(slot0[i] + 1)) % B
        end = last[i] if last[i] < k else k
        while s <= end:
            alloc[s] += 1
            s += B
    total = 0
    n = 0
    kk = k
    more = extra.shape[0] > 0
    for s in range(k + 1):
        need = alloc[s] + extra[s] if more else alloc[s]
        if total + need > free:
            kk = s - 1
            break
        total += need
        n += alloc[s]
    if kk < 2:
        return kk, 0
    # counting sort by step: each step's pairs start at the steps before it; requests in order
    pos = np.empty(kk + 1, dtype=np.int64)
    acc = 0
    for s in range(kk + 1):
        pos[s] = acc
        acc += alloc[s]
    for i in range(b):
        s = 2 + (-(slot0[i] + 1)) % B
        end = last[i] if last[i] < kk else kk
        while s <= end:
            j = pos[s]
            pi[j] = i
            ps[j] = s
            pos[s] = j + 1
            s += B
    return kk, n


_NO_EXTRA = np.empty(0, dtype=np.int64)  # (_stretch_pairs: no other request's blocks)


def _flat(log: list) -> list:
    """The keys of a pool log (a list of int64 arrays) as one list of ints."""
    return np.concatenate(log).tolist() if log else []


def _grown(arrays, n: int) -> tuple:
    """``arrays`` (1-d int64) zero-extended to at least ``n`` entries (doubling)."""
    out = []
    for a in arrays:
        if len(a) < n:
            a = np.concatenate([a, np.zeros(max(n, 2 * len(a)) - len(a), dtype=a.dtype)])
        out.append(a)
    return tuple(out)


def _queue_registration(req, full: int, reg: tuple) -> None:
    """Queue ``req``'s blocks ``n_cached .. full - 1`` for one later prefix-cache registration
    (``reg`` = (block arrays, key arrays)) and count them as registered."""
    reg[0].append(req.blocks[req.n_cached:full])
    reg[1].append(req.keys[req.n_cached:full])
    req.n_cached = full


def _joined_registration(reg: tuple) -> tuple:
    """The blocks and keys ``reg`` (:func:`_queue_registration`'s lists) queued, each as one
    int64 array; empties the lists."""
    if len(reg[0]) == 1:
        out = reg[0][0], reg[1][0]
    else:
        out = np.concatenate(reg[0]), np.concatenate(reg[1])
    reg[0].clear()
    reg[1].clear()
    return out


# Latest simulated time (s) a run may reach: the bound arrivals are checked against; past it
# float64 seconds lose the microsecond.
MAX_CLOCK_S = MAX_ARRIVAL_S


class Request:
    """One request's live state. Token counts in tokens, times in simulated seconds."""

    __slots__ = (
        "idx", "rid", "arrival", "input", "output", "keys", "blocks", "n_blocks", "n_cached",
        "n_computed", "n_generated", "status", "first_scheduled", "first_token", "finish",
        "hit_tokens", "computed_prompt_tokens", "preemptions", "reason", "total_blocks",
        "hit_host", "hit_disk", "onboard_s", "onboard_host_s", "onboard_disk_s", "load_event",
        "gen", "layout", "pstate", "n_placed", "compressed", "tokens_evicted", "blocks_freed",
        "peak_blocks", "end_live", "end_blocks", "pending", "blocks_since", "phys_base",
        "next_round", "prefill_end", "recompute_cut",
    )

    def __init__(self, idx: int, rid: int, arrival: float, input_tokens: int, output_tokens: int):
        self.idx = idx
        self.rid = rid
        self.arrival = arrival
        self.input = input_tokens
        self.output = output_tokens
        self.keys = None
        self.blocks = None
        self.n_blocks = 0
        self.n_cached = 0
        self.n_computed = 0
        self.n_generated = 0
        self.status = WAITING
        self.first_scheduled = np.nan
        self.first_token = np.nan
        self.finish = np.nan
        self.hit_tokens = 0
        self.computed_prompt_tokens = 0
        self.prefill_end = 0  # the tokens the prefill of its latest admission reaches
        self.preemptions = 0
        self.reason = ""
        self.total_blocks = 0
        self.hit_host = 0
        self.hit_disk = 0
        self.onboard_s = 0.0
        self.onboard_host_s = 0.0
        self.onboard_disk_s = 0.0
        self.load_event = None
        self.gen = 0  # incremented at preemption (invalidates in-flight loads)
        self.layout = None  # policies.PagedLayout when a compression policy is active
        self.pstate = None
        self.n_placed = 0
        self.compressed = False
        self.tokens_evicted = 0
        self.blocks_freed = 0
        self.peak_blocks = 0
        self.end_live = 0
        self.end_blocks = 0
        # the prefix-hit tokens its latest walk gave up to recompute them (tiers.load_or_recompute:
        # from the first disk page on), and of them those held on disk: (tokens, disk tokens)
        self.recompute_cut = (0, 0)

    @property
    def num_tokens(self) -> int:
        """Tokens whose KV the request needs now: prompt + generated so far."""
        return self.input + self.n_generated


class Simulator:
    """Replays a workload through the paged KV cache.

    Args:
        workload: a :class:`traces.Workload` (rows ordered parents before children).
        num_gpu_blocks, block_size: the pool.
        scheduler: scheduler config node; cache: cache config node.
        cost_model: object with ``step_time(new_tokens, context_tokens, samples)``.
        max_model_len: longest accepted request (input + output tokens).
        recorder: metrics sink; check_invariants: verify pool invariants after every step.
        prefix_index: ``dict`` | ``table`` | ``auto`` (= ``table``; see :class:`sim.block_pool.BlockPool`).
        progress: a callable ``progress(n_done)`` or None.
    """

    def __init__(self, workload, num_gpu_blocks: int, block_size: int, scheduler, cache,
                 cost_model, max_model_len: int, recorder: Recorder,
                 check_invariants: bool = False, progress=None, max_sim_time_s=None,
                 fast_forward: bool = True, tiers=None, num_layers: int = 1, compression=None,
                 prefix_index: str = "auto"):
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
        from .hardware import check_prefill_budget
        check_prefill_budget(self.max_tokens, self.max_model_len, self.chunked)
        self.env = simpy.Environment()
        # tiers: a factory env -> TierManager (None = GPU only)
        self.tiers = tiers(self.env) if tiers is not None else None
        self.num_layers = max(1, int(num_layers))
        self.onboarding = 0
        self._onboarding_reqs: dict = {}  # rid -> request in a blocking onboard (with self.check)
        self.comp = compression if compression is not None and compression.active else None
        self._round_time = 0.0  # round costs charged to the next step
        self.rounds: list[tuple] = []
        if self.comp is not None and self.comp.hole_fill:
            # hole-filled appends land in scattered slots: no closed form for block crossings
            self.fast_forward = False
        if self.comp is not None and self.comp.step_scoring:
            # per-step scoring (H2O, TOVA, ...) adds a cost that grows with each request's
            # length every step; the stretch's step times do not model it
            self.fast_forward = False
        # a fast-forward stretch runs the compression rounds that fall inside it, and goes on
        # past finishing requests and the admissions after them, when the step times depend on
        # the batch's context sum only (no sliding-window layers) and no tier sees the pool
        # (see _fast_forward_rounds). Dense runs take _fast_forward's own loop: measured on the
        # full Azure and Weka traces, this one simulated them slower (4.8-5.5 s against 3.4 s,
        # 36 s against 32 s)
        self._ff_rounds = (self.comp is not None and self.tiers is None
                           and not getattr(self.cost, "win_layers", 0))
        # without compression and tiers an admission step whose chunks complete their prompts
        # becomes the first step of the dense stretch after it (_fast_forward)
        self._ff_admit = self.comp is None and self.tiers is None
        self._hit_memo = None  # (request, gen, max_hit, walk state, result); tiers only
        self._hit_keys = None  # [request, its keys array, max_hit, KeyTable key -> index or None]
        if self.tiers is not None:
            self.pool.cached_log = []
            self.pool.change_log = []
            # the decode fast-forward issues each step's offloads at that step's end time and,
            # with requests waiting, stops where tier changes could admit one (_tier_ff_cap),
            # so tiers keep it exact
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.n = len(workload)
        self.reqs: list[Request | None] = [None] * self.n
        self.done = 0
        # prefix lookups of preempted requests re-admitted (the requests' own hit columns count
        # their first admission only): lookups, tokens looked up, hit tokens by serving tier
        self.preempted_lookups = {"requests": 0, "query_tokens": 0,
                                  "hit_tokens": {"gpu": 0, "host": 0, "disk": 0}}
        # tiers.load_or_recompute: admissions whose hit was cut at a disk page because loading
        # would take longer than recomputing, the hit tokens given up, and those held on disk
        self.recomputed_instead_of_load = {"admissions": 0, "tokens": 0, "disk_tokens": 0}
        self._wake = None
        # write_back: the step holds until the evicted cached blocks' copies land
        # (TierManager.write_back); _wb_until: when the last one issued lands (s)
        self._write_back = self.tiers is not None and self.tiers.write_policy == "write_back"
        if self._write_back:  # (only write_back copies evicted cached blocks down)
            self.pool.evict_log = []
        self._wb_until = 0.0
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
        # root arrival times, ascending (the arrival process's order; _tie_inside reads them)
        # (a list: bisect on it took 0.49 us against np.searchsorted's 3.36 us for one value,
        # 19,366 times, timeit, 2026-12-03)
        self.root_times = np.sort(np.asarray(self.w_arrival, dtype=np.float64)[self.roots],
                                  kind="stable").tolist()

    # ------------------------------------------------------------------ arrivals
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
        self.waiting.append(req)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _tie_inside(self, lo: float, end: float) -> bool:
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
            if think <= 0:
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

    # ------------------------------------------------------------------ block tables
    def _ensure_keys(self, req: Request) -> None:
        if req.keys is None:
            i = req.idx
            ids = self.p_val[self.p_off[i]:self.p_off[i + 1]]
            nxt, reach = self._continuation(i, ids) if self.reuse_answers else (None, 0)
            req.keys = block_keys(ids, self.G, req.input, self.B, req.rid, req.total_blocks,
                                  nxt, reach)
            req.blocks = np.empty(req.total_blocks, dtype=np.int64)

    def _continuation(self, i: int, ids: np.ndarray):
        """Row ``i``'s continuation (:func:`sim.keys.continues`: its first closed-loop child
        whose ids begin with ``ids``, row ``i``'s full trace blocks): ``(its prefix ids, the
        tokens of row i they identify)``, or ``(None, 0)``."""
        kids = self.children.get(i)
        if not kids or self.G <= 0:
            return None, 0
        n_in = int(self.w_in[i])
        for c in kids:
            cids = self.p_val[self.p_off[c]:self.p_off[c + 1]]
            c_in = int(self.w_in[c])
            if continues(ids, n_in, self.G, cids, c_in):
                return cids, min(c_in, n_in + int(self.w_out[i]))
        return None, 0

    def _grow(self, req: Request, upto_tokens: int) -> bool:
        """Give ``req`` slots for ``upto_tokens`` tokens; False if the pool is short."""
        if req.layout is not None:
            return self._grow_layout(req, upto_tokens)
        need = -(-upto_tokens // self.B) - req.n_blocks
        full = upto_tokens // self.B
        reg = self.caching and full > req.n_cached
        if need > 0:
            if need > self.pool.num_free:
                return False
            # the new blocks, then the blocks now full registered: one pool call
            nb = req.n_blocks
            if reg:
                self.pool.allocate_into(req.blocks[nb:nb + need], req.blocks[req.n_cached:full],
                                        req.keys[req.n_cached:full])
                req.n_cached = full
                reg = False
            else:
                self.pool.allocate_into(req.blocks[nb:nb + need])
            req.n_blocks = nb + need
            if req.n_blocks > req.peak_blocks:
                req.peak_blocks = req.n_blocks
        if reg:
            self.pool.cache_blocks(req.blocks[req.n_cached:full], req.keys[req.n_cached:full])
            req.n_cached = full
        return True

    def _grow_layout(self, req: Request, upto_tokens: int) -> bool:
        n = upto_tokens - req.n_placed
        if n <= 0:
            return True
        comp = self.comp
        k = comp.blocks_for(req, n)
        if k > self.pool.num_free:
            return False
        if k:
            self.pool.allocate_into(req.blocks[req.n_blocks:req.n_blocks + k])
            req.n_blocks += k
            if req.n_blocks > req.peak_blocks:
                req.peak_blocks = req.n_blocks
        comp.place(req, n, k)
        full = upto_tokens // self.B
        if self.caching and not req.compressed and full > req.n_cached:
            self.pool.cache_blocks(req.blocks[req.n_cached:full], req.keys[req.n_cached:full])
            req.n_cached = full
        return True

    def _flush_grow(self, defer: list, reg: tuple) -> None:
        """Make :meth:`_schedule`'s deferred work: one new block for each of ``defer`` (in
        order; they fit the free blocks), and one registration of the blocks in ``reg``
        (lists of block and key arrays). Empties both."""
        # with block_size > 1 a block a deferred decode token starts is not full, so the
        # registration never reads a block this allocation writes: one pool call does both
        fuse = defer and reg[0] and self.B > 1
        if defer:
            new = np.empty(len(defer), dtype=np.int64)
            if fuse:
                self.pool.allocate_into(new, *_joined_registration(reg))
            else:
                self.pool.allocate_into(new)
            for req, blk in zip(defer, new.tolist()):
                req.blocks[req.n_blocks] = blk
                req.n_blocks += 1
                if req.n_blocks > req.peak_blocks:
                    req.peak_blocks = req.n_blocks
            defer.clear()
        if reg[0] and not fuse:
            self.pool.cache_blocks(*_joined_registration(reg))

    def _round(self, req: Request, now: float | None = None) -> None:
        """Run one compression round on ``req`` and return its freed blocks to the pool.
        ``now``: the round's time (s) when it is not the SimPy clock's (a fast-forward stretch
        runs the rounds of its steps before its single timeout)."""
        pool = self.pool
        comp = self.comp
        table = req.blocks[:req.n_blocks]
        sh = pool.ref_cnt[table] > 1
        shared = int(np.argmin(sh)) if not sh.all() else len(sh)
        res, dur, pinned = comp.run_round(req, shared)
        if not req.compressed:
            # blocks past the pinned prompt no longer hold the uncompressed text
            first = pinned // self.B
            pool.uncache(table[first:])
            req.compressed = True
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
        self._round_time += dur
        self.rounds.append((
            self.env.now if now is None else now, req.rid, comp.name, comp.compaction,
            res.tokens_before, res.tokens_kept, res.tokens_evicted, res.blocks_before,
            res.blocks_after, res.blocks_freed, res.bytes_moved, res.tokens_moved,
            res.ragged_waste_slots, res.metadata_bytes,
            req.layout.fragmentation(int(res.kept_per_group.sum())), dur))

    def _free_blocks(self, req: Request) -> None:
        if req.n_blocks:
            self.pool.free(req.blocks[:req.n_blocks][::-1])
        req.n_blocks = 0
        req.n_cached = 0

    def _preempt(self, req: Request) -> None:
        if req.n_computed < req.prefill_end:  # the prompt tokens it will not compute now
            req.computed_prompt_tokens -= req.prefill_end - req.n_computed
        req.gen += 1
        req.load_event = None
        if req.layout is not None:
            self.comp.finish(req)
            req.layout = None
            req.pstate = None
            req.compressed = False
        self._free_blocks(req)
        req.n_computed = 0
        req.status = WAITING
        req.preemptions += 1
        self.rec.preemptions += 1
        self.waiting.appendleft(req)

    # ------------------------------------------------------------------ scheduling
    def _schedule(self):
        budget = self.max_tokens
        sched_req: list[Request] = []
        sched_n: list[int] = []
        sched_ctx: list[int] = []
        preempted = False
        running = self.running
        long_thr = self.long_thr
        B = self.B
        caching = self.caching
        ff_layout = self.comp is not None and not self.comp.hole_fill
        plain_ctx = ff_layout and not self.comp.quest
        samples = 0  # scheduled requests whose chunk ends at their last token (they sample)
        decodes = 0  # running requests scheduled for exactly their one next decode token
        # A decode token that starts a new block takes one block: those allocations are
        # deferred and made together, in running order, before any other allocation (so every
        # block id is the one the request-by-request order gives), while they fit the free
        # blocks; blocks a decode token fills are registered together (their keys are unique to
        # their requests). Both are flushed before a slow-path allocation and before admission.
        defer: list[Request] = []
        reg = ([], [])
        free = self.pool.num_free
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
                        _queue_registration(req, upto // B, reg)
                else:
                    # the block table's length (= layout.n_blocks + blocks_since; check_invariants)
                    if req.phys_base + req.pending + 1 > req.n_blocks * B:
                        defer.append(req)
                        req.blocks_since += 1  # = Compression.place(req, 1, 1)
                    req.pending += 1
                    req.n_placed += 1
                    if caching and not req.compressed and upto // B > req.n_cached:
                        _queue_registration(req, upto // B, reg)
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
                        self._flush_grow(defer, reg)
                        free = self.pool.num_free
                    ok = True
                    while not self._grow(req, upto):
                        victim = running.pop()
                        self._preempt(victim)
                        preempted = True
                        if victim is req:
                            ok = False
                            break
                    free = self.pool.num_free
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
                sched_ctx.append(max(0, self.comp.physical_context(req) - n))
            budget -= n
            i += 1
        if defer or reg[0]:
            self._flush_grow(defer, reg)
        self._step_preempted = preempted
        self._step_admitted = 0
        self._step_decodes = decodes
        if not preempted:
            budget, adm = self._admit(budget, sched_req, sched_n, sched_ctx)
            samples += adm
        return sched_req, sched_n, sched_ctx, samples

    def _admit(self, budget: int, sched_req: list, sched_n: list, sched_ctx: list):
        """The scheduler's admission: waiting requests FCFS while the token ``budget`` and
        ``max_num_seqs`` allow, each with its prefix hit (onboarding the host/disk part), its
        first chunk and the blocks for it, until one does not fit. Admitted requests join the
        running list and the step's lists (``sched_req``, ``sched_n``: chunk tokens,
        ``sched_ctx``: tokens cached before it). Returns ``(budget left, admitted requests whose
        chunk completes their prompt: they sample)``."""
        samples = 0
        pool = self.pool
        B = self.B
        tiers = self.tiers
        while self.waiting and budget > 0 and len(self.running) + self.onboarding < self.max_seqs:
            req = self.waiting[0]
            plan = self._admission_plan(req, budget)
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
            if self.comp is not None:
                self.comp.new_request(req)
                if hit_tokens:
                    self.comp.place(req, hit_tokens, self.comp.blocks_for(req, hit_tokens))
            self.waiting.popleft()
            self._hit_memo = None
            if req.recompute_cut[0]:  # (tiers.load_or_recompute cut this hit)
                ri = self.recomputed_instead_of_load
                ri["admissions"] += 1
                ri["tokens"] += req.recompute_cut[0]
                ri["disk_tokens"] += req.recompute_cut[1]
                req.recompute_cut = (0, 0)
            n_disk = int(np.count_nonzero(tier_codes == DISK)) * B if n_tier else 0
            if req.preemptions == 0:
                req.hit_tokens = hit_tokens
                req.first_scheduled = self.env.now
                req.hit_disk = n_disk
                req.hit_host = n_tier * B - n_disk
            else:  # a preempted request's lookup, counted apart (as vLLM's PrefixCacheStats)
                pl = self.preempted_lookups
                pl["requests"] += 1
                pl["query_tokens"] += num_tokens
                pl["hit_tokens"]["gpu"] += hit_tokens - n_tier * B
                pl["hit_tokens"]["host"] += n_tier * B - n_disk
                pl["hit_tokens"]["disk"] += n_disk
            if tiers is not None and len(gpu_blocks):
                keys = req.keys[:len(hit)]
                tiers.on_gpu_hit(keys[hit >= 0] if n_tier else keys)
            req.computed_prompt_tokens += num_tokens - hit_tokens  # (less, if preempted, what
            req.prefill_end = num_tokens                           # it had not computed yet)
            self._step_admitted += 1
            if n_tier:
                self._start_onboard(req, tier_pos, tier_keys, tier_codes, blocking)
            if blocking:
                continue
            if not self._grow(req, hit_tokens + n):  # cannot happen after the check above
                raise RuntimeError("allocation failed after capacity check")
            req.status = RUNNING
            self.running.append(req)
            sched_req.append(req)
            sched_n.append(n)
            sched_ctx.append(hit_tokens)
            if hit_tokens + n == num_tokens:
                samples += 1
            budget -= n
        return budget, samples

    def _admission_plan(self, req: Request, budget: int):
        """The admission's checks for the waiting head ``req`` with ``budget`` tokens left:
        its prefix hit (:meth:`_prefix_hit`), its first chunk, and its new blocks (a blocking
        onboard needs only its host/disk pages' blocks first) with the free hit blocks it would
        take against the free blocks. Returns None when it cannot be admitted now, else
        ``(hit table, tier positions, tier keys, tier codes, chunk tokens, blocking, GPU hit
        blocks)``."""
        self._ensure_keys(req)
        hit, tier_pos, tier_keys, tier_codes = self._prefix_hit(req)
        n_tier = 0 if tier_pos is None else len(tier_pos)
        hit_tokens = len(hit) * self.B
        n = self._chunk(req.num_tokens - hit_tokens, budget)
        if n < 0:
            return None
        blocking = n_tier > 0 and not self.tiers.layerwise
        gpu_blocks = hit if n_tier == 0 else hit[hit >= 0]
        need = n_tier if blocking else -(-(hit_tokens + n) // self.B) - len(hit) + n_tier
        if need + self.pool.blocks_needed_for_touch(gpu_blocks) > self.pool.num_free:
            return None
        return hit, tier_pos, tier_keys, tier_codes, n, blocking, gpu_blocks

    def _chunk(self, rest: int, budget: int) -> int:
        """Tokens an admission schedules of the ``rest`` a request still needs with ``budget``
        tokens left: capped by ``long_prefill_token_threshold`` and the budget; -1 when it
        cannot start (no chunked prefill and the rest exceeds the budget)."""
        if not self.chunked and rest > budget:
            return -1
        if self.long_thr and rest > self.long_thr:
            rest = self.long_thr
        return budget if rest > budget else rest

    def _head_fits(self, budget: int) -> bool:
        """Whether :meth:`_schedule` would admit the waiting head now (without tiers), with
        ``budget`` tokens left in the step: its prefix hit, chunk and new blocks against the
        free blocks, the checks the admission loop makes."""
        req = self.waiting[0]
        self._ensure_keys(req)
        hit = self._prefix_hit(req)[0]
        n = self._chunk(req.num_tokens - len(hit) * self.B, budget)
        if n < 0:
            return False
        need = -(-(len(hit) * self.B + n) // self.B) - len(hit)
        return need + self.pool.blocks_needed_for_touch(hit) <= self.pool.num_free

    def _prefix_hit(self, req: Request):
        """The admission's prefix hit: GPU lookup, extended through host and disk with tiers.

        Returns ``(table, tier_pos, tier_keys, tier_codes)`` as :meth:`_hit_result` (the last
        three None without tier pages). With tiers, the walk for the waiting head is memoised:
        an overloaded server retries its head every step, and the walk over thousands of keys
        was the top cost. While none of the head's keys changed membership in the GPU index,
        host or disk (the pool's and tier manager's change logs since the walk) the result is
        reused; otherwise only the changed blocks are looked up again (:meth:`_rewalk`).
        """
        B = self.B
        max_hit = (req.num_tokens - 1) // B if self.caching else 0
        tiers = self.tiers
        if tiers is None:
            return self.pool.lookup_prefix(req.keys, max_hit), None, None, None
        memo = self._hit_memo
        pool_log = self.pool.change_log
        if memo is not None and memo[0] is req and memo[1] == req.gen and memo[2] == max_hit:
            if not pool_log and not tiers.change_log:
                return memo[4]
            changed = np.concatenate(pool_log + tiers.change_log)
            idx = self._hit_index(req, max_hit).get_many(changed)
            pool_log.clear()
            tiers.change_log.clear()
            idx = idx[idx >= 0]
            if not len(idx):
                return memo[4]
            state = self._rewalk(req, memo[3], np.unique(idx), max_hit)
        else:
            pool_log.clear()
            tiers.change_log.clear()
            state = self._walk(req, 0, max_hit)
        res = self._hit_result(req, *state)
        self._hit_memo = (req, req.gen, max_hit, state, res)
        return res

    # ------------------------------------------------------------------ tiers
    def _walk(self, req: Request, lo: int, max_hit: int):
        """Locate ``req``'s blocks from ``lo`` up to the first held nowhere (or ``max_hit``):
        ``(GPU block id or -1, code)`` arrays of those blocks (:meth:`TierManager.locate`)."""
        if lo >= max_hit:
            return np.empty(0, np.int64), np.empty(0, np.int8)
        return self.tiers.locate(self.pool, req.keys[lo:max_hit], stop=True)

    def _rewalk(self, req: Request, state, changed: np.ndarray, max_hit: int):
        """The memoised walk ``state = (blk, code)`` of the head's blocks ``0 .. m - 1`` brought
        up to date after the blocks at indices ``changed`` (sorted) changed membership: they are
        located again; the first one now held nowhere ends the hit; if block ``m`` (the one that
        ended it) is now held, the walk goes on from there. Every other block's location is
        unchanged (the change logs list every key whose GPU, host or disk membership changed),
        so this equals a fresh walk."""
        blk, code = state
        m = len(blk)
        idx = np.asarray(changed, dtype=np.int64)
        inside = idx[idx < m]
        if len(inside):
            gpu_b, c = self.tiers.locate(self.pool, req.keys[inside])
            blk = blk.copy()
            code = code.copy()
            blk[inside] = gpu_b
            code[inside] = c
            gone = inside[c < 0]
            if len(gone):
                cut = int(gone[0])
                return blk[:cut], code[:cut]
        if m < max_hit and m in changed:
            ext_b, ext_c = self._walk(req, m, max_hit)
            if len(ext_b):
                blk = np.concatenate([blk, ext_b])
                code = np.concatenate([code, ext_c])
        return blk, code

    def _hit_result(self, req: Request, blk: np.ndarray, code: np.ndarray):
        """The admission's hit from the walk of blocks ``0 .. m - 1`` (``blk``: GPU block id or
        -1, ``code``: serving tier): the GPU prefix, then every block from the first that is not
        on the GPU served by the fastest tier holding it, up to the first held nowhere. Returns
        the block-table prefix (GPU block ids, -1 where a page must be onboarded) and the
        positions, keys and tier codes of those pages (None, None, None without any). With
        ``load_or_recompute`` the hit is cut at the first disk page when loading the disk pages
        would take longer than recomputing the tokens from there on.
        """
        tiers = self.tiers
        if tiers.load_or_recompute:
            req.recompute_cut = (0, 0)  # (this walk's: an earlier walk's cut is not admitted)
        pos = np.flatnonzero(code != GPU)
        if not len(pos):
            return blk, None, None, None
        if not tiers.load_or_recompute:
            return blk, pos, req.keys[pos], code[pos]
        g = int(pos[0])
        gpu_hit = blk[:g]
        ext = blk[g:]
        codes_a = code[g:]
        if (codes_a == DISK).any():
            first = int(np.argmax(codes_a == DISK))
            n_disk = int(np.count_nonzero(codes_a[first:] == DISK))
            n_host = int(np.count_nonzero(codes_a[first:] == HOST))
            load = tiers.estimate_load_s(n_host, n_disk)
            ctx = (g + first) * self.B
            recompute = self.cost.prefill_time((len(codes_a) - first) * self.B, ctx)
            if recompute < load:
                req.recompute_cut = ((len(codes_a) - first) * self.B, n_disk * self.B)
                ext = ext[:first]
                codes_a = codes_a[:first]
                if len(ext) == 0:
                    return gpu_hit, None, None, None
        table = np.concatenate([gpu_hit, ext])
        is_tier = codes_a != GPU
        if not is_tier.any():
            return table, None, None, None
        pos = g + np.flatnonzero(is_tier)
        keys = req.keys[pos]
        return table, pos, keys, codes_a[is_tier]

    def _start_onboard(self, req: Request, pos, keys, codes, blocking: bool) -> None:
        tiers = self.tiers
        host_keys = keys[codes == HOST]
        disk_keys = keys[codes == DISK]
        tiers.touch(host_keys, disk_keys)
        if blocking:
            req.status = ONBOARDING
            self.onboarding += 1
            if self.check:
                self._onboarding_reqs[req.rid] = req  # (check_invariants counts their blocks)
        req.load_event = self.env.process(
            self._onboard(req, pos, host_keys, disk_keys, blocking, req.gen))

    def _onboard(self, req: Request, pos, host_keys, disk_keys, blocking: bool, gen: int):
        env = self.env
        t0 = env.now
        out = {}
        if self._wb_until > env.now:  # (write_back) the reused blocks' old pages leave first
            yield from _advance_to(env, self._wb_until)
        yield env.process(self.tiers.onboard(host_keys, disk_keys, out))
        if req.gen != gen:  # preempted while loading (layerwise): its blocks are gone
            return
        self.pool.cache_blocks(req.blocks[pos], req.keys[pos])
        if req.n_generated == 0:  # before the first token (the TTFT split: queue + onboard + prefill)
            req.onboard_host_s += out["onboard_host_s"]
            req.onboard_disk_s += out["onboard_disk_s"]
        if blocking:
            if req.n_generated == 0:
                req.onboard_s += env.now - t0
            self.onboarding -= 1
            self._onboarding_reqs.pop(req.rid, None)
            req.status = RUNNING
            self.running.append(req)
            if self._wake is not None and not self._wake.triggered:
                self._wake.succeed()

    # ------------------------------------------------------------------ engine loop
    def _engine(self):
        env = self.env
        rec = self.rec
        while self.done < self.n:
            if not self.running and not self.waiting:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            sched_req, sched_n, sched_ctx, samples = self._schedule()
            hold = self._write_back_hold()
            if not sched_req and self.onboarding:
                # nothing runnable until an onboarding request's pages arrive (or an arrival)
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            if not sched_req:
                raise RuntimeError(
                    f"scheduler deadlock at t={env.now:.3f}s: {len(self.waiting)} waiting, "
                    f"{len(self.running)} running, {self.pool.num_free} free blocks")
            n_arr = np.asarray(sched_n, dtype=np.int64)
            ctx_arr = np.asarray(sched_ctx, dtype=np.int64)
            dt = self.cost.step_time(n_arr, ctx_arr, samples)
            extra_dt = 0.0
            if self.comp is not None:
                extra_dt = self._round_time
                self._round_time = 0.0
                if self.comp.step_scoring:
                    extra_dt += sum(self.comp.step_extra_time(r) for r, n in zip(sched_req, sched_n)
                                    if r.layout is not None and n == 1)
                dt += extra_dt
            if self.fast_forward:
                stretch = None
                if self.tiers is not None and self.comp is None and self._pure_decode(sched_req):
                    # steps one timeout at a time (events inside pass in SimPy's own order)
                    if (yield from self._tier_stretch(sched_req, ctx_arr, dt, hold)):
                        self._check_sim_time()
                        continue
                elif hold is not None:
                    pass  # (a held step runs through the per-step loop)
                elif self._pure_decode(sched_req):
                    stretch = self._fast_forward(sched_req, ctx_arr, extra_dt)
                elif self._ff_rounds and self._decode_and_admitted(sched_req, sched_n):
                    # the admission step becomes the stretch's first step
                    stretch = self._fast_forward_rounds(sched_req, ctx_arr, 0.0,
                                                        (dt, sched_n[-self._step_admitted:]))
                elif self._ff_admit and self._decode_and_admitted(sched_req, sched_n, False):
                    # (dense) likewise
                    stretch = self._fast_forward(sched_req, ctx_arr, 0.0,
                                                 (dt, sched_n[-self._step_admitted:]))
                elif self._ff_admit and self._prefill_chunk_step(sched_req, sched_n):
                    stretch = self._prefill_stretch(sched_req, n_arr, ctx_arr, dt)
                # taken unless the next event lands inside this step
                if stretch is not None and env.peek() > env.now + dt and (yield from stretch):
                    self._check_sim_time()
                    continue
            start = env.now
            if hold is not None:
                yield from self._wait_write_back(hold)
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
            live = 0  # computed tokens of the scheduled requests that stay running
            n_done = 0
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
                        self._round(req)  # (it changes no token count)
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
                        n_done += 1
                        continue
                live += c
            if finished:
                self._retire_finished()
            if self.tiers is not None:
                self._tier_step_end()
            if len(self.running) != len(sched_req) - n_done:
                # (some running request was not scheduled, or joined during the step: its
                # onboarding ended) the whole running list's counters
                live = self._live_tokens()
            rec.step(start, dt, len(self.running), len(self.waiting), prefill_tokens, decode_tokens,
                     self.pool.num_used, self.pool.num_cached_free, live)
            if self.check:
                self.check_invariants()
            self._check_sim_time()

    def _write_back_hold(self) -> float | None:
        """write_back, after a scheduling: issue the copies of the cached blocks it evicted
        (:meth:`sim.tiers.TierManager.write_back`) and return when they land (s), the time the
        step and onboarding into those blocks wait for; None when nothing is to wait for."""
        if not (self._write_back and self.pool.evict_log):
            return None
        end = self.tiers.write_back(_joined(self.pool.evict_log))
        self.pool.evict_log.clear()
        if end > self.env.now:
            self._wb_until = end
            return end
        return None

    def _wait_write_back(self, hold: float):
        """SimPy process fragment: a held step waits until ``hold`` (s), counted in
        ``write_back_stalls`` / ``write_back_stall_s``."""
        self.write_back_stall_s += hold - self.env.now
        self.write_back_stalls += 1
        yield from _advance_to(self.env, hold)

    def _check_sim_time(self) -> None:
        """ConfigError once the clock has passed ``sim.max_sim_time_s`` or 2**32 s (checked after
        every step and every fast-forward stretch, which ends at the step that passes it)."""
        now = self.env.now
        if now > MAX_CLOCK_S:
            from .hardware import ConfigError
            raise ConfigError(
                f"the simulated clock passed 2**32 s (~136 years) at t={now:.6g} s with "
                f"{self.done} of {self.n} requests done: float64 seconds stop resolving a "
                f"microsecond there; expected step and transfer times that keep the run inside "
                f"it (check the cost.* and tiers.* options: a step overhead, latency, efficiency or "
                f"bandwidth off by orders of magnitude?)")
        if self.max_sim_time is not None and now > self.max_sim_time:
            from .hardware import ConfigError
            raise ConfigError(
                f"sim.max_sim_time_s={self.max_sim_time}: the simulated clock passed it at "
                f"t={now:.3f} s with {self.done} of {self.n} requests done; expected a limit "
                f"the run fits in (raise it, or null for no limit)")

    # ------------------------------------------------------------------ fast-forward
    def _pure_decode(self, sched_req) -> bool:
        """True if this step schedules every running request for exactly one decode token (each
        has sampled at least one token and computed all but its last) and admitted and preempted
        nobody (so the next steps repeat the same shape until an event changes it). Uses the
        counts :meth:`_schedule` kept."""
        if self._step_admitted or self._step_preempted:
            return False
        return len(sched_req) == len(self.running) == self._step_decodes

    def _decode_and_admitted(self, sched_req, sched_n, compressed: bool = True) -> bool:
        """True if this step is a pure-decode step of the running requests plus the admission
        of ``_step_admitted`` waiting requests whose chunk completes their prompt (each samples
        its first token at the step's end), with nobody preempted and no waiting request that a
        later step could admit on token budget and sequence slots: from the next step on the
        batch is pure decode, so :meth:`_fast_forward_rounds` (``compressed``: the admitted
        requests have compressed layouts) or :meth:`_fast_forward` (not ``compressed``) can
        take this step as its first."""
        na = self._step_admitted
        if not na or self._step_preempted or len(sched_req) != len(self.running):
            return False
        if len(sched_req) - na != self._step_decodes:
            return False
        if self._head_retried(len(sched_req)):
            # the head may have been stopped by the token budget this step's prefill chunks
            # took: the next step has it again, so the per-step loop may admit the head there
            return False
        for req, n in zip(sched_req[-na:], sched_n[-na:]):
            if (compressed and req.layout is None) or req.n_computed + n != req.input + req.n_generated:
                return False
        return True

    def _head_retried(self, b: int) -> bool:
        """Whether the scheduler tries the waiting head in a step whose ``b`` running requests
        take one token each: a request waits, the token budget has room after them, and the
        running and onboarding requests are below ``max_num_seqs``."""
        return bool(self.waiting) and self.max_tokens > b and \
            len(self.running) + self.onboarding < self.max_seqs

    def _prefill_chunk_step(self, sched_req, sched_n) -> bool:
        """True if this step is a chunked-prefill step that the next ones repeat: every running
        request scheduled, all but the last for its one next decode token, the last for a chunk
        of at least 2 tokens that leaves its prompt incomplete and takes the rest of the token
        budget (so the scheduler tries no waiting request), nobody admitted or preempted.
        Uses the counts :meth:`_schedule` kept (:meth:`_prefill_stretch`)."""
        b = len(sched_req)
        if not b or self._step_admitted or self._step_preempted or b != len(self.running):
            return False
        n = sched_n[-1]
        if self._step_decodes != b - 1 or n < 2 or b - 1 + n != self.max_tokens:
            return False
        p = sched_req[-1]
        return p.n_computed + n < p.input + p.n_generated

    def _prefill_stretch(self, reqs, n_arr, ctx_arr, dt: float):
        """Advance ``k`` steps of a chunked prefill in one SimPy timeout when it is exact
        (dense runs without tiers; the first step, of ``dt`` s, scheduled by :meth:`_schedule`
        and checked by :meth:`_prefill_chunk_step`).

        Each step every running request but the last decodes one token and the last, ``P``,
        computes the next ``c = max_num_batched_tokens - decodes`` tokens of its prompt: the
        whole token budget, so the scheduler (running requests first, as vLLM's) tries no
        waiting request. ``k`` is bounded by the step before ``P``'s last chunk (a smaller one
        leaves budget for an admission), by the first decode finish (the stretch ends with
        that step, as :meth:`_fast_forward` without its finishing stretch), by the next pending
        SimPy event (the step during which it lands, :meth:`_tie_inside` as there) and by the
        free blocks (a step that would preempt runs through the scheduler).

        Each step's pool calls are the scheduler's, in its order: the decodes' new blocks (in
        running order), then ``P``'s new blocks and the registration of its blocks now full
        (:meth:`_grow`: ``P``'s prompt keys may be held by free blocks that a later step
        evicts, so registrations and evictions keep their order). The blocks decode tokens fill
        are registered in one call at the end (their keys are unique to their requests). Step
        times are :meth:`AnalyticCostModel.step_time`'s for each step's batch
        (:meth:`AnalyticCostModel.chunk_stretch_times`); the rows are the per-step loop's.
        Returns ``k`` (0 = not taken, nothing changed)."""
        env = self.env
        pool = self.pool
        B = self.B
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
        if self.max_sim_time is not None:
            t_next = min(t_next, float(self.max_sim_time))
        # step times up to the step during which the next event lands: step s's batch is
        # step 1's with every request s - 1 chunks further
        durs, ends = self.cost.chunk_stretch_times(n_arr, ctx_arr, b - 1, k, env.now, dt, t_next)
        k = len(ends)
        t = ends[-1]
        if t >= t_next:
            j = k - 1
            if t != t_next and self._tie_inside(float(ends[j - 1]) if j else env.now, float(t)):
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
        k, n_pairs = _stretch_pairs(np.ascontiguousarray(ctx_arr[:-1]),
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
            if not self._grow(p, cp + s * c):  # (the need was checked above)
                raise RuntimeError("allocation failed after capacity check")
            used[s - 1] = pool.num_used
            cfree[s - 1] = pool.num_cached_free
        for i, blk in zip(pi.tolist(), blocks.tolist()):  # (by step: each table in order)
            r = dec[i]
            r.blocks[r.n_blocks] = blk
            r.n_blocks += 1
        start = env.now
        waiting0 = len(self.waiting)
        yield from _advance_to(env, float(ends[-1]))
        now = env.now
        # commit: the decodes computed and sampled k tokens, P computed k chunks
        reg = ([], [])
        finished = self._commit_decodes(dec, fin, k, ends, now, reg)
        p.n_computed = cp + k * c
        self._flush_grow([], reg)
        if finished:
            self._retire_finished()
        rec = self.rec
        running = np.full(k, b, dtype=np.int64)
        waiting = np.full(k, waiting0, dtype=np.int64)
        # live KV tokens after each step: the scheduled requests' computed tokens
        live = np.arange(1, k + 1, dtype=np.int64)
        live *= self.max_tokens
        live += int(np.add.reduce(ctx_arr))
        # the last row: the state after the finished requests left
        running[-1] = len(self.running)
        waiting[-1] = len(self.waiting)
        used[-1] = pool.num_used
        cfree[-1] = pool.num_cached_free
        live[-1] = self._live_tokens()
        starts = np.empty(k, dtype=np.float64)
        starts[0] = start
        starts[1:] = ends[:-1]
        rec.steps_rows(starts, np.array(durs, dtype=np.float64), running, waiting,
                       np.full(k, c, dtype=np.int64), np.full(k, b - 1, dtype=np.int64), used,
                       cfree, live)
        if self.check:
            self.check_invariants()
        return k

    def _fast_forward(self, reqs, ctx0, extra_first: float = 0.0, admitted=None):
        """Advance ``k`` pure-decode steps in one SimPy timeout when it is exact.

        The first step's slots were allocated by the scheduler. ``k`` is bounded by the first
        finish (every running request samples one token per step; without compression, tiers
        and waiting requests, by the last finish or the first that releases closed-loop
        children instead, the finished requests leaving the batch at their steps:
        :meth:`AnalyticCostModel.decode_stretch_times_finishing`,
        :meth:`_finishing_stretch_end`), by the next pending SimPy
        event (an arrival or a closed-loop release: the run stops at the step during which it
        happens, as the per-step loop would see it at that step's end), and by the free blocks
        (the step that would need a preemption runs through the normal path), and with tiers and
        a waiting request by :meth:`_tier_ff_cap`; with compression, by the next round point
        (compression runs without tiers or sliding-window layers take
        :meth:`_fast_forward_rounds`, which runs the rounds inside the stretch). Blocks are
        allocated in the per-step order (step, then running order), so pool state, prefix-cache
        evictions and recorded steps equal the per-step loop's. Returns ``k`` (0 = not taken).

        ``admitted = (dt, chunks)`` (dense runs without tiers): the step just scheduled also
        admitted the last ``len(chunks)`` of ``reqs`` with those prompt chunks (tokens), each
        completing its prompt (:meth:`_decode_and_admitted`); it becomes the stretch's first
        step, of ``dt`` s (its :meth:`step_time`), and they decode from the second.
        """
        if self._ff_rounds:
            return (yield from self._fast_forward_rounds(reqs, ctx0, extra_first))
        env = self.env
        B = self.B
        b = len(reqs)
        fin = [r.output - r.n_generated for r in reqs]  # the step each request finishes at
        k = k_first = min(fin)
        comp = self.comp
        # With nothing waiting and neither compression nor tiers, a finish changes nothing the
        # next steps depend on but the batch (the finished request leaves; its cached blocks
        # join the free queue's tail, behind every block the stretch takes from its head, and
        # its unhashed blocks the head, which the stretch's next allocations take:
        # _ff_allocate_finishing), so the stretch goes on past it, up to the last finish or the
        # first finish that releases closed-loop children (their arrival is an event)
        inner = False
        if k < max(fin) and comp is None and self.tiers is None and not self.waiting:
            k_all = max(fin)
            if self.children:
                kids = self.children
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
        if self.max_sim_time is not None:
            t_next = min(t_next, float(self.max_sim_time))
        # step durations up to the step during which the next event lands (round costs
        # charged to the first step)
        fin_a = np.array(fin, dtype=np.int64)
        if admitted is not None:
            t1 = env.now + admitted[0]  # (the per-step loop's clock after the first step)
            if t1 >= t_next:
                return 0
            keep = fin_a > 1  # (the step-1 finishers leave; the others from step 2 on)
            durs, cum = self.cost.decode_stretch_times_finishing(
                slot0[keep] + 1, fin_a[keep] - 1, k - 1, t1, t_next)
            durs = np.concatenate(([admitted[0]], durs))
            cum = np.concatenate(([t1], cum))
        elif inner:
            durs, cum = self.cost.decode_stretch_times_finishing(ctx0, fin_a, k, env.now,
                                                                 t_next)
        else:
            durs, cum = self.cost.decode_stretch_times(ctx0, k, env.now, t_next, extra_first)
        k = len(cum)
        if cum[-1] >= t_next:
            j = k - 1
            if cum[j] != t_next and self._tie_inside(float(cum[j - 1]) if j else env.now,
                                                     float(cum[j])):
                k = j  # (_tie_inside: the stretch's clock waits would let the arrival in)
        if k < 2:
            return 0
        # new blocks needed at steps 2..k: request i's token index slot0 + s - 1 starts a block
        # at steps s0[i], s0[i] + B, ...; pairs of (step, request) in allocation order (by step,
        # then running order), k cut to the steps whose new blocks fit the free blocks
        alloc_per_step = np.empty(k + 1, dtype=np.int64)
        n_max = b * ((k - 2) // B + 1)
        pi = np.empty(n_max, dtype=np.int64)
        ps = np.empty(n_max, dtype=np.int64)
        k, n_pairs = _stretch_pairs(np.ascontiguousarray(slot0, dtype=np.int64), fin_a, B, k,
                                    self.pool.num_free, _NO_EXTRA, alloc_per_step, pi, ps)
        if k < 2:
            return 0
        inner = inner and k_first < k  # (some request finishes before the end)
        general = inner or admitted is not None  # (rows: _finishing_stretch_end)
        alloc_per_step = alloc_per_step[:k + 1]
        pi = pi[:n_pairs]
        ps = ps[:n_pairs]
        tiers = self.tiers
        if tiers is not None and self._head_retried(b):
            # The per-step loop retries the waiting head every step. Without tiers a pure-decode
            # stretch can only make it less admissible (fewer free blocks, shorter hits); with
            # tiers a GPU eviction can cut its hit before host/disk pages (a blocking onboard
            # then needs fewer blocks) and landed offloads change its host/disk hits. So the
            # stretch ends before the first step that evicts a cached block (its scheduling
            # would see the change) and at most one step after the first step whose end issues
            # an offload (a copy lands no earlier than during the next step).
            cap = self._tier_ff_cap(reqs, k, ps if n_pairs else None, B)
        elif self._write_back:
            # a step that evicts a cached block is held for its write-back copy by the
            # per-step loop (TierManager.write_back): the stretch ends before it
            first = self._first_evicting_step(ps if n_pairs else None)
            cap = k if first is None else first - 1
        elif n_pairs and self._head_retried(b):
            # The per-step loop retries the waiting head every step; the stretch ends before
            # the first step whose new blocks evict a block of the head's prefix hit
            # (_head_hit_step)
            first = self._head_hit_step(ps, self.max_tokens - b)
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
            t_cached = {1: _flat(self.pool.cached_log)}
            self.pool.cached_log.clear()
        nb_all = None
        early = {}  # finish step -> (blocks freed, of them cached) of requests freed inside
        early_freed = early_cached = 0
        if inner:
            ev0 = self.pool.evicted_cached_blocks
            evicted, early = self._ff_allocate_finishing(reqs, fin_a, slot0, pi, ps, k)
            if self.pool.evicted_cached_blocks != ev0:
                ps_ev = ps[evicted]
                n_evicted = len(ps_ev)
                evicted_per_step = np.bincount(ps_ev, minlength=k + 1)
            early_freed = sum(v[0] for v in early.values())
            early_cached = sum(v[1] for v in early.values())
        elif n_pairs:
            ev0 = self.pool.evicted_cached_blocks
            blocks, evicted = self.pool.allocate(n_pairs, return_evicted=True)
            if self.pool.evicted_cached_blocks != ev0:  # (cached blocks were evicted)
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
        used1 = self.pool.num_used - n_pairs + early_freed  # after step 1
        cf1 = self.pool.num_cached_free + n_evicted - early_cached
        start = env.now
        waiting0 = len(self.waiting)
        durs = durs[:k]
        cum = cum[:k]
        if tiers is not None:
            # blocks filled by decode tokens are registered by the scheduling of the step that
            # fills them: block j of a request at c tokens fills at step (j + 1) x B - c; their
            # keys are unique to the request (sim/keys.py), so every one is newly registered
            if self.caching:
                for req in reqs:
                    if req.compressed:
                        continue
                    c = req.n_computed
                    for j in range(req.n_cached, (c + k) // B):
                        t_cached.setdefault((j + 1) * B - c, []).append(int(req.keys[j]))
            env.process(self._ff_offloads(cum, t_cached, k))
        yield from _advance_to(env, float(cum[-1]))
        now = env.now
        # commit: every request computed k tokens and sampled k tokens
        if self.rec.record_steps and not general:
            # live KV tokens as the per-step loop records them (_live_tokens: computed tokens of
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
            finished = self._commit_decodes(reqs, fin, k, cum, now, reg)
        else:
            if nb_all is None:  # new blocks per request
                nb_all = np.bincount(pi, minlength=b)
            for i, req in enumerate(reqs):
                # a compressed request registers its blocks now, before its round (which may
                # uncache them); dense ones join the one registration below
                self._ff_commit(req, k, k - 1, int(nb_all[i]),
                                reg if req.layout is None else None)
                if req.layout is not None and comp.due(req, False):
                    self._round(req)
                if req.n_generated >= req.output:
                    req.status = FINISHED
                    req.finish = now
                    finished = True
        self._flush_grow([], reg)  # one registration (the decode-filled keys are distinct)
        if tiers is not None:
            self.pool.cached_log.clear()  # issued per step by _ff_offloads
        rec = self.rec
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
            self._finishing_stretch_end(reqs, fin_a, slot0, start, cum, durs, waiting0, used1,
                                        alloc_per_step, cf1, evicted_per_step, pre1, dec1, early)
            return k
        if finished:
            self._retire_finished()
        if tiers is not None:
            # the last step's offloads are issued here, at the end of the stretch, before the
            # next scheduling (as the per-step loop's _tier_step_end), not by _ff_offloads
            if t_cached.get(k):
                self.pool.cached_log.append(np.asarray(t_cached[k], dtype=np.int64))
            self._tier_step_end()
        if not rec.record_steps:
            # counters only: the peak of used blocks is before the finished requests left
            # (used grows through the stretch) or after
            rec.steps_counted(k, b, max(used1 + int(alloc_per_step[1:k].sum()), self.pool.num_used))
            if self.check:
                self.check_invariants()
            return k
        # the last step's row reflects the state after finished requests left
        rec.decode_stretch(start, cum, durs, b, waiting0, used1, alloc_per_step, cf1,
                           evicted_per_step, live0,
                           (len(self.running), len(self.waiting), self.pool.num_used,
                            self.pool.num_cached_free, self._live_tokens()))
        if self.check:
            self.check_invariants()
        return k

    def _commit_decodes(self, reqs, fin, k: int, ends, now: float, reg: tuple) -> bool:
        """Commit a dense stretch of ``k`` steps to the decoding requests ``reqs``: request
        ``i`` ran ``min(fin[i], k)`` steps (it finishes at step ``fin[i]``), each computing and
        sampling one token; its peak blocks are updated, its blocks now full are queued on
        ``reg`` for one registration (:func:`_queue_registration`), and a finished one is marked
        so, at the end of its last step (``ends[n - 1]``, s; ``now`` for the stretch's last).
        Returns whether any finished."""
        B = self.B
        caching = self.caching
        finished = False
        for req, f in zip(reqs, fin):
            if req.n_blocks > req.peak_blocks:
                req.peak_blocks = req.n_blocks
            n = k if f > k else f  # (steps it ran: it finished at step f <= k)
            c = req.n_computed + n
            req.n_computed = c
            req.n_generated += n
            if caching and c // B > req.n_cached:
                _queue_registration(req, c // B, reg)
            if req.n_generated >= req.output:
                req.status = FINISHED
                req.finish = now if n == k else float(ends[n - 1])
                finished = True
        return finished

    def _ff_allocate_finishing(self, reqs, fin, slot0, pi, ps, k: int):
        """The new blocks of a dense stretch of ``k`` steps in which requests finish before the
        last step (:meth:`_fast_forward`): the pairs (request ``pi``, step ``ps``), in
        allocation order (step, then running order), are allocated segment by segment, each
        up to a finish step ``f``; then the requests finishing at ``f`` (``fin[i] == f``;
        ``slot0[i] + f``: the tokens they computed) register their blocks now full and free
        their tables, in running order, as the per-step loop does by the end of step ``f``.
        Their unhashed blocks join the free queue's head (:meth:`BlockPool.free`), so the next
        steps' allocations take them as the per-step loop's do. Requests finishing after the
        last allocation are left to :meth:`_finishing_stretch_end`. Returns (bool array of the
        pairs whose block's cached hash was evicted, ``{f: (blocks freed, of them cached)}``
        for the steps whose requests were freed here)."""
        pool = self.pool
        B = self.B
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
                self._ff_take(reqs, pi[lo:hi], evicted[lo:hi])
                lo = hi
            nf = pool.num_free
            ncf = pool.num_cached_free
            for i in groups[f]:
                req = reqs[i]
                full = (int(slot0[i]) + f) // B
                if self.caching and full > req.n_cached:
                    pool.cache_blocks(req.blocks[req.n_cached:full], req.keys[req.n_cached:full])
                    req.n_cached = full
                pool.free(req.blocks[:req.n_blocks][::-1])
            early[f] = (pool.num_free - nf, pool.num_cached_free - ncf)
        if lo < n:
            self._ff_take(reqs, pi[lo:], evicted[lo:])
        return evicted, early

    def _ff_take(self, reqs, pi, evicted) -> None:
        """Allocate one block for each request index of ``pi`` (in order) onto its table;
        ``evicted`` (bool, ``len(pi)``) marks those whose cached hash was evicted."""
        blocks = np.empty(len(pi), dtype=np.int64)
        self.pool.allocate_into(blocks, cached=evicted)
        for i, blk in zip(pi.tolist(), blocks.tolist()):
            req = reqs[i]
            req.blocks[req.n_blocks] = blk
            req.n_blocks += 1

    def _finishing_stretch_end(self, reqs, fin, slot0, start: float, cum, durs, waiting0: int,
                               used1: int, alloc, cf1: int, evicted, pre1: int, dec1: int,
                               early=None) -> None:
        """The end of a dense stretch of ``k = len(cum)`` steps with requests finishing
        before its last step or an admission as its first (:meth:`_fast_forward`; ``fin[i]``:
        request ``i``'s last step; ``slot0[i] + s``: its computed tokens after step ``s``):
        retire the finished requests step by step, in running order within a step (their
        blocks join the free queue's tail in that order, as the per-step loop frees them), and
        record the steps (``alloc`` / ``evicted``: blocks taken / cached blocks evicted at each
        step, shape ``(k + 1,)``; ``used1`` / ``cf1``: blocks used / cached-free after step
        1's scheduling; ``waiting0``: requests waiting during the stretch; ``pre1`` / ``dec1``:
        step 1's prefill and decode tokens; ``early``: ``{f: (blocks freed, of them cached)}``
        for the steps whose finished requests :meth:`_ff_allocate_finishing` freed)."""
        k = len(cum)
        pool = self.pool
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
                self._retire(group, freed=True)
                freed[f], cfreed[f] = early[f]
                continue
            self._retire(group)
            freed[f] = pool.num_free - nf
            cfreed[f] = pool.num_cached_free - ncf
        self._drop_finished()
        self.rec.finishing_stretch(start, cum, durs, fin, slot0, waiting0, len(self.waiting),
                                   used1, alloc, cf1, evicted, freed, cfreed, pre1, dec1)
        if self.check:
            self.check_invariants()

    def _tier_stretch(self, reqs, ctx0, dt: float, hold: float | None = None):
        """Pure-decode steps of a dense batch with host/disk tiers, the first of them scheduled
        by :meth:`_schedule` (duration ``dt``; held until ``hold`` (s) for write-back copies when
        not None), without the per-request work of the per-step loop.

        Offloads land during almost every step and the waiting head's hit may change with them,
        so the stretch keeps one SimPy timeout per step, created where the per-step loop creates
        its own (after the step-end offloads were issued): every other event (offload and
        demotion landings, arrivals, onboarding transfers) runs in the same order as there. At
        each step's end it does what the per-step loop does for such a step: the write-policy
        offloads (:meth:`_tier_step_end`), the step's row, and the next step's scheduling made
        for the few requests it concerns: one new block for each request whose token starts a
        block (in running order, from the free queue) and the registration of each block a
        token fills, then the waiting head's admission check (:meth:`_tier_next_step`), and with
        write_back the copies of the cached blocks those new blocks evicted, the next step
        waiting for them as the engine's steps do (:meth:`sim.tiers.TierManager.write_back`). The
        per-request counters (computed and generated tokens) are committed at the end. It ends,
        leaving the rest of the next scheduling to :meth:`_schedule`, where the per-step loop
        would decide anything else:

        * the running list changed (an onboarding request joined it) or the waiting head may be
          admitted (the batch's part of that scheduling is then done; the scheduler does the
          rest);
        * the next step's new blocks exceed the free blocks (the scheduler preempts; nothing of
          that step is done);
        * requests finish at the step's end (they are committed and retired there, as the
          per-step loop does, and the stretch returns).

        Returns the number of steps taken (0: not taken, the engine runs the step).
        """
        env = self.env
        pool = self.pool
        B = self.B
        b = len(reqs)
        k = min([r.output - r.n_generated for r in reqs])  # the first finish: at step k's end
        if k < 2 or (self.tiers.layerwise and any(r.load_event is not None for r in reqs)):
            return 0  # (layer-by-layer loads: the per-step loop waits for them, then clears)
        nc0 = [r.n_computed for r in reqs]  # before step 1
        durs = self.cost.decode_step_times(ctx0, k)
        durs[0] = dt
        live0 = sum(nc0)
        caching = self.caching
        rec = self.rec
        # the steps at which each request next starts a block (grow) and fills one (its
        # registration), as buckets step -> request indices: a step touches only its own
        grow_at: dict = {}
        reg_at: dict = {}
        for i, (req, c) in enumerate(zip(reqs, nc0)):
            grow_at.setdefault(max(req.n_blocks * B - c + 1, 2), []).append(i)
            if caching:
                reg_at.setdefault(max((req.n_cached + 1) * B - c, 2), []).append(i)
        s = 1  # (hold: when the write-back copies the step's new blocks wait for land)
        while True:
            start = env.now
            if hold is not None:
                yield from self._wait_write_back(hold)
            yield env.timeout(float(durs[s - 1]))
            step_dur = float(durs[s - 1]) if hold is None else env.now - start
            done = s == k
            if done:
                now = env.now
                self._ff_counts(reqs, nc0, s)
                for req in reqs:
                    if req.n_generated >= req.output:
                        req.status = FINISHED
                        req.finish = now
                self._retire_finished()
            self._tier_step_end()
            if done:
                live = self._live_tokens()
            else:  # the batch's counters are committed at the end; a request that joined the
                # running list during the step (its onboarding ended) counts its own
                live = live0 + s * b + sum(r.n_computed for r in self.running[b:])
            rec.step(start, step_dur, len(self.running), len(self.waiting), 0, b,
                     pool.num_used, pool.num_cached_free, live)
            if not done:
                self._check_sim_time()
            if done or self._tier_next_step(reqs, nc0, s + 1, B, grow_at, reg_at) != 1:
                break  # (step s + 1 unscheduled, or its batch part scheduled: _schedule goes on)
            hold = self._write_back_hold()  # (as the engine after a scheduling)
            s += 1
        if not done:
            self._ff_counts(reqs, nc0, s)
        if self.check:
            self.check_invariants()
        return s

    def _ff_counts(self, reqs, nc0, steps: int) -> None:
        """Commit ``steps`` decode steps to the counters of ``reqs`` (``nc0``: computed tokens
        before the first; every request sampled a token in each)."""
        for req, c in zip(reqs, nc0):
            req.n_computed = c + steps
            req.n_generated += steps

    def _tier_next_step(self, reqs, nc0, s: int, B: int, grow_at: dict, reg_at: dict) -> int:
        """For :meth:`_tier_stretch`: schedule its step ``s`` (token index ``nc0[i] + s - 1`` of
        request ``i``) as :meth:`_schedule` would for the unchanged decode batch. ``grow_at`` and
        ``reg_at`` map a step to the indices of the requests whose token starts a block there
        (``nc0 + s > n_blocks x B``) and of those whose token fills one (``(nc0 + s) // B >
        n_cached``, with prefix caching), the stretch's buckets, moved on here. Returns 1 when
        that is the whole scheduling; 0 (nothing done) when the new blocks exceed the free ones
        (the scheduler preempts); 2 when the batch's part is done (its new blocks allocated and
        full blocks registered, in the scheduler's order) but the rest may decide something:
        the running list grew (an onboarding request joined it, after the batch in running
        order), or the waiting head may be admitted. :meth:`_schedule` then does the rest: it
        finds the batch's blocks in place and goes on to the others and the admission. The
        head is checked as the scheduler checks it: while the memo of its last failed check
        holds (no key of its hit in the change logs, these evictions included) it fails again
        (no more blocks are free than then); else :meth:`_admission_plan` decides."""
        pool = self.pool
        # requests whose step-s token starts a block, and those whose token fills one
        # (registered at this scheduling), in running order
        gi = grow_at.get(s)
        if gi is not None:
            gi.sort()
            if len(gi) > pool.num_free:
                return 0  # the scheduler preempts
            grow = [reqs[i] for i in gi]
        else:
            grow = []
        reg = ([], [])
        ri = reg_at.pop(s, None)
        if ri is not None:
            ri.sort()
            for i in ri:
                req = reqs[i]
                full = (nc0[i] + s) // B
                _queue_registration(req, full, reg)
                reg_at.setdefault((full + 1) * B - nc0[i], []).append(i)
        self._flush_grow(grow, reg)  # the new blocks, then the registrations, as the scheduler
        if gi is not None:
            del grow_at[s]
            for i in gi:  # (one block more: the next starts B tokens on)
                grow_at.setdefault(reqs[i].n_blocks * B - nc0[i] + 1, []).append(i)
        # the batch's part of the scheduling is done; the rest is the admission's
        if len(self.running) != len(reqs):
            return 2
        head = self.waiting[0] if self.waiting else None
        if head is not None and self._head_retried(len(reqs)):
            kt = self._head_key_table(head)
            logs = pool.change_log + self.tiers.change_log
            if kt is not None and not (logs and (kt.get_many(np.concatenate(logs)) >= 0).any()):
                # the memo of the head's last (failed) check holds, with no more free blocks
                # now: it fails again; the logs are cleared as the memo's revalidation clears them
                pool.change_log.clear()
                self.tiers.change_log.clear()
            elif self._admission_plan(head, self.max_tokens - len(reqs)) is not None:
                return 2  # it may be admitted: the scheduler does it
            # (else the admission's own checks, as the scheduler makes them, failed: its hit
            # walk is up to date and the logs cleared, as there)
        return 1

    def _head_key_table(self, head):
        """:meth:`_hit_index` of the waiting head, or None when the memo is not the head's
        current walk."""
        memo = self._hit_memo
        max_hit = (head.num_tokens - 1) // self.B if self.caching else 0
        if memo is None or memo[0] is not head or memo[1] != head.gen or memo[2] != max_hit:
            return None
        return self._hit_index(head, max_hit)

    def _hit_index(self, req: Request, max_hit: int) -> KeyTable:
        """The key -> block index table of ``req``'s first ``max_hit`` blocks (chained keys:
        distinct), kept across the re-walks of its memoised hit (:meth:`_prefix_hit`) and built
        when first needed."""
        kp = self._hit_keys
        if kp is None or kp[0] is not req or kp[1] is not req.keys or kp[2] != max_hit:
            kp = self._hit_keys = [req, req.keys, max_hit, None]
        if kp[3] is None:
            keys = req.keys[:max_hit]
            kp[3] = KeyTable(2 * len(keys) + 2)
            kp[3].put_absent(keys, np.arange(len(keys), dtype=np.int64), keys)
        return kp[3]

    def _fast_forward_rounds(self, reqs, ctx0, extra_first: float = 0.0, admitted=None):
        """:meth:`_fast_forward` for compression runs, running the rounds that fall inside the
        stretch at their steps, and going on past requests that finish and the admissions that
        follow. With hundreds of running requests and a round every ``beta`` tokens each, some
        request reaches its round point every step or two, and one finishes every few steps, so
        a stretch cut at either would rarely exceed a few steps.

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
        * at the end of a step where requests finish (after that step's rounds) the clock is
          brought to the step's end, they are retired as :meth:`_retire_finished` does, and the
          next step is scheduled as :meth:`_schedule` would: the survivors' decode blocks, then
          :meth:`_admit` on the budget they leave; that step takes the scheduler's step time of
          the whole batch (:meth:`_admission_step_time`), and the admitted requests, whose
          prompt chunks complete in it, decode with the rest from the step after (their prefill
          end is handled at that step's end, in running order). A finish that releases a
          closed-loop request at once, or an admission whose chunk does not complete its prompt
          (or that ends its request), ends the stretch there instead.

        ``k`` is bounded by the next SimPy event and the free blocks (those free when each
        segment allocates), as in :meth:`_fast_forward`, and, while the waiting head could be
        admitted (a free sequence slot and token budget), by the first step whose rounds return
        blocks that admit it, or, after an admission step, by that step if the head it stopped
        at fits with the next step's budget (:meth:`_head_fits`).
        ``admitted``: ``(step time s, chunks)`` when the first step also admits the last
        ``len(chunks)`` of ``reqs`` (:meth:`_decode_and_admitted`): their prompt chunks, already
        scheduled, complete in that step, which takes the step time the scheduler's batch gives;
        from step 2 on they decode like the rest.

        Returns ``k`` (0 = not taken: then nothing was changed).
        """
        env = self.env
        B = self.B
        comp = self.comp
        pool = self.pool
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
        t_lim = float(self.max_sim_time) if self.max_sim_time is not None else math.inf
        t_next = min(t_ev, t_lim)
        used0 = pool.num_used
        cf0 = pool.num_cached_free
        start = env.now
        waiting0 = len(self.waiting)
        # arrivals behind a waiting head are passed, not stopped at (_pass_arrivals; this
        # path runs without tiers)
        pass_ev = waiting0 > 0
        ev_log: list[tuple[float, int]] = []
        # the per-step loop retries the waiting head every step; the stretch only takes blocks
        # except where a round or a finish returns blocks or a first round uncaches some (the
        # stretch then ends at that step if the head fits: _head_fits; a finish admits it
        # within the stretch), and it ends before a step whose new blocks take a block of the
        # head's hit (_head_hit_step), so between those the head can only become less
        # admissible (fewer free blocks, the same hit)
        admit = self._head_retried(b)
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
            d = self.cost.decode_step_times(ctx0, hi - seg + 1, seg - 1, shift)
            if step_time is not None:
                d[0] = step_time  # an admission step: the scheduler's batch (round costs in)
                step_time = None
            else:
                d[0] += carry  # round costs charged to the segment's first step
            c = step_ends(last, d)
            # new blocks of steps seg..hi (nxt >= seg >= 1; step 1's were allocated by the
            # scheduler, so nxt >= 2), request-major; the free blocks bound the stretch first
            # (arrivals are passed only inside the steps it keeps)
            cnt, pi, ps = _block_pairs(nxt, hi, B)
            n_pairs = len(ps)
            if n_pairs:
                per = np.bincount(ps, minlength=hi + 1)
                cum_new = np.cumsum(per)
                free = pool.num_free  # with the blocks the rounds so far returned
                if cum_new[hi] > free:  # the last step whose blocks fit ends the stretch (>= 2)
                    hi = k = int(np.searchsorted(cum_new, free, side="right")) - 1
                    cut = True
                    if hi < seg:  # not even step seg: the stretch ended with the last segment
                        self._round_time = carry  # its rounds' time goes to the next step
                        k = seg - 1
                        break
                    d = d[:hi - seg + 1]
                    c = c[:hi - seg + 1]
                if admit and self.waiting:
                    # the per-step loop retries the head every step: the stretch ends before
                    # the first step whose new blocks take a block of its prefix hit
                    # (_head_hit_step; steps in allocation order)
                    first = self._head_hit_step(np.sort(ps[ps <= hi]),
                                                self.max_tokens - len(active))
                    if first is not None:
                        hi = k = first - 1
                        cut = True
                        if hi < seg:  # the stretch ended with the last segment
                            self._round_time = carry
                            k = seg - 1
                            break
                        d = d[:hi - seg + 1]
                        c = c[:hi - seg + 1]
            if pass_ev and c[-1] >= t_ev and t_ev < t_lim:
                t_ev, before = yield from self._pass_arrivals(c, last, t_ev, t_lim, ev_log)
                t_next = min(t_ev, t_lim)
                if before is not None:
                    cut = True
                    if before == 0 and env.now != last:
                        # the stretch ends at step seg - 1 (the clock has not reached it, so it
                        # is not step 1, which the engine scheduled: its start is the clock)
                        self._round_time = carry
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
                self._ff_allocate(reqs, cnt, ps, ev_ps, new_blk)
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
                        self._ff_commit(req, hi - done[i], hi - max(done[i], 1), new_blk[i])
                    done[i] = hi
                    new_blk[i] = 0
                    if comp is not None and req.layout is not None \
                            and req.n_computed >= req.input and comp.due(req, pd):
                        self._round(req, last)
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
                        and self._head_fits(self.max_tokens - len(active)):
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
                if admit and self._head_fits(self.max_tokens - len(active)):
                    # the admission stopped at a head that the next step's budget (no prefill
                    # chunks) may admit
                    k = hi
                    cut = True
            if hi >= k:
                if cut or hi != kf:
                    break
                # requests finish at the end of step hi: retire them, schedule step hi + 1
                if hi + 2 > len(alloc_ps):
                    alloc_ps, ev_ps, round_used, round_cf = _grown(
                        (alloc_ps, ev_ps, round_used, round_cf), hi + 2)
                go_on, first_row, live_base, nxt, anchor, step_time, admitted_now = \
                    yield from self._ff_batch_change(
                        reqs, hi, last, fin, nc0, done, new_blk, chunk, heap, anchor, nxt,
                        active, (alloc_ps, ev_ps, round_used, round_cf), rows, first_row,
                        live_base, ev_log)
                if not go_on:  # the stretch ends at step hi
                    break
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
                    alloc_ps, ev_ps, round_used, round_cf = _grown(
                        (alloc_ps, ev_ps, round_used, round_cf), k + 1)
                t_ev = env.peek()  # released closed-loop requests scheduled their arrivals
                t_next = min(t_ev, t_lim)
                pass_ev = bool(self.waiting)
                admit = self._head_retried(len(active))
                if step_time is not None:
                    step_time += self._round_time  # the finish step's round costs
                    self._round_time = 0.0
                    carry = 0.0
                    seg = hi + 1
                    continue
            carry = self._round_time
            self._round_time = 0.0
            seg = hi + 1
        durs = np.concatenate(durs_parts)
        cum = np.concatenate(cum_parts)
        yield from _advance_to(env, float(cum[-1]))
        now = env.now
        finished = False
        reg = ([], [])  # decode-filled blocks: keys unique to their requests, one registration
        for i in active:
            req = reqs[i]
            if done[i] < k:
                self._ff_commit(req, k - done[i], k - max(done[i], 1), new_blk[i], reg)
            if req.n_generated >= req.output:
                req.status = FINISHED
                req.finish = now
                finished = True
        self._flush_grow([], reg)
        if finished:
            self._retire_finished()
        if k >= first_row:
            rows.append((first_row, k, len(active), 0, len(active), live_base, len(active)))
        used = used0 + np.cumsum(alloc_ps[1:k + 1] + round_used[1:k + 1])
        cached_free = cf0 - np.cumsum(ev_ps[1:k + 1] - round_cf[1:k + 1])
        self._ff_record(rows, k, start, durs, cum, used, cached_free, waiting0, ev_log)
        if self.check:
            self.check_invariants()
        return k

    def _ff_allocate(self, reqs, cnt: np.ndarray, ps: np.ndarray, ev_ps: np.ndarray,
                     new_blk: list) -> None:
        """Allocate a stretch's new blocks: ``cnt[i]`` for ``reqs[i]``, the pairs' steps ``ps``
        in request-major order, handed out in (step, running order) order as the scheduler
        makes them; cached blocks they evict are counted per step in ``ev_ps``, the blocks added
        to each table in ``new_blk``."""
        order = np.argsort(ps, kind="stable")  # allocation order: step, then running order
        blocks, evicted = self.pool.allocate(len(ps), return_evicted=True)
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

    def _ff_batch_change(self, reqs, f: int, t: float, fin, nc0, done, new_blk, chunk, heap,
                         anchor, nxt, active, per_step, rows, first_row, live_base, ev_log):
        """SimPy process fragment of :meth:`_fast_forward_rounds` at the end of step ``f``
        (time ``t``, after its rounds), where the requests of ``active`` with ``fin == f``
        finish: the clock goes to ``t``, they are committed and retired, and step ``f + 1`` is
        scheduled as :meth:`_schedule` would: the survivors' decode blocks, then
        :meth:`_admit` on the budget they leave. The stretch's per-request lists and arrays
        (indexed by position in ``reqs``, running order) are updated in place or returned;
        ``rows`` gets the rows of steps up to ``f`` (and ``f + 1``'s if it admits).

        Returns ``(go on, first step without a row, live base, nxt, anchor, the admission
        step's time without round costs or None, indices admitted)``; the stretch ends at ``f``
        when it does not go on: no request left, a released closed-loop request arrived at once
        (the step's row counts it), or the survivors' blocks do not fit (the per-step loop
        preempts)."""
        pool = self.pool
        B = self.B
        alloc_ps, ev_ps, round_used, round_cf = per_step
        b_old = len(active)
        gone = [i for i in active if fin[i] == f]
        yield from _advance_to(self.env, t)
        reg = ([], [])
        for i in gone:
            req = reqs[i]
            if done[i] < f:
                self._ff_commit(req, f - done[i], f - max(done[i], 1), new_blk[i], reg)
                done[i] = f
                new_blk[i] = 0
            req.status = FINISHED
            req.finish = t
        self._flush_grow([], reg)
        u = pool.num_used
        cf = pool.num_cached_free
        n_wait = len(self.waiting)
        self._retire_finished()
        round_used[f] += pool.num_used - u
        round_cf[f] += pool.num_cached_free - cf
        gone_set = set(gone)
        active[:] = [i for i in active if i not in gone_set]
        nxt[gone] = np.iinfo(np.int64).max // 2  # no more blocks
        tokens = (b_old, 0)  # step f's decode and prefill tokens
        if first_row > f:  # f admitted requests: its row is written; it gets the running after
            tokens = rows.pop()[2:4]
        elif f > first_row:
            rows.append((first_row, f - 1, b_old, 0, b_old, live_base, b_old))
        live_base -= sum(nc0[i] for i in gone)
        b = len(active)
        rows.append((f, f, *tokens, b, live_base, b))
        first_row = f + 1
        stop = (False, first_row, live_base, nxt, anchor, None, [])
        if len(self.waiting) != n_wait or not (b or self.waiting):
            return stop
        if not self._head_retried(b):
            return (True, first_row, live_base, nxt, anchor, None, [])  # no admission
        s = f + 1
        cnt, pi, ps = _block_pairs(nxt, s, B)
        if len(ps) > pool.num_free:
            return stop
        if len(ps):
            alloc_ps[s] += len(ps)
            nxt = nxt + B * cnt
            self._ff_allocate(reqs, cnt, ps, ev_ps, new_blk)
        ctx_dec = anchor[active] + f  # the survivors' contexts at step f + 1
        sched_req, sched_n, sched_ctx = [], [], []
        u = pool.num_used
        cf = pool.num_cached_free
        _, samples = self._admit(self.max_tokens - b, sched_req, sched_n, sched_ctx)
        round_used[s] += pool.num_used - u  # the admitted tables (hit blocks and new ones)
        round_cf[s] += pool.num_cached_free - cf
        if not sched_req:  # nobody running and nobody admitted: the per-step loop says why
            return (b > 0, first_row, live_base, nxt, anchor, None, [])
        ev_log.append((t, len(self.waiting)))
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
        step_time = self.cost.step_time(
            np.asarray([1] * b + sched_n, dtype=np.int64),
            np.concatenate([ctx_dec, np.asarray(sched_ctx, dtype=np.int64)]), b + samples)
        rows.append((s, s, b + dec, pre, len(active), live_base, len(active)))
        return (True, s + 1, live_base, nxt, anchor, step_time, new)

    def _ff_record(self, rows, k: int, start: float, durs, cum, used, cached_free, waiting0: int,
                   ev_log) -> None:
        """Record a compression stretch's ``k`` steps: ``rows`` of ``(first step, last step,
        decode tokens, prefill tokens, running, live base, live per step)`` (live tokens after
        step s = base + s x per step), ``used`` / ``cached_free`` blocks after each step; the
        last step's row takes the state after the finished requests left."""
        rec = self.rec
        used[-1] = self.pool.num_used
        cached_free[-1] = self.pool.num_cached_free
        dec = np.empty(k, dtype=np.int64)
        pre = np.empty(k, dtype=np.int64)
        for s0, s1, d_, p_, *_ in rows:
            dec[s0 - 1:s1] = d_
            pre[s0 - 1:s1] = p_
        if not rec.record_steps:
            rec.steps_rows(None, None, None, None, pre, dec, used, None, None)
            return
        steps = np.arange(1, k + 1)
        running = np.empty(k, dtype=np.int64)
        live = np.empty(k, dtype=np.int64)
        for s0, s1, _, _, r_, lb, bl in rows:
            running[s0 - 1:s1] = r_
            live[s0 - 1:s1] = lb + steps[s0 - 1:s1] * bl
        running[-1] = len(self.running)
        live[-1] = self._live_tokens()
        waiting = _waiting_per_step(waiting0, ev_log, cum)
        waiting[-1] = len(self.waiting)
        starts = np.concatenate(([start], cum[:-1]))
        rec.steps_rows(starts, durs, running, waiting, pre, dec, used, cached_free, live)

    def _pass_arrivals(self, c: np.ndarray, t0: float, t_ev: float, t_lim: float, log: list):
        """SimPy process fragment: let the events that land before the end of a fast-forward
        segment happen, moving the clock to each; returns ``(next event's time, j)``, ``j`` the
        index of a step the stretch must end before, or None.

        ``c``: the segment's step end times (s, ascending) from ``t0``; ``t_ev``: the next
        event's time; ``t_lim``: ``sim.max_sim_time_s`` (events from it on are left to the
        caller); ``log`` gets ``(time, waiting requests)`` after each event.

        Used only with requests waiting and no tiers. Every event then is an arrival (the
        arrival process, or a closed-loop child after its think time), and an arrival joins the
        waiting queue behind a head that no step of the stretch can admit (the scheduler admits
        in FCFS order and stops at the first request that does not fit; see
        :meth:`_fast_forward_rounds`), so the per-step loop would schedule the same decode batch
        after it. An event at a step's exact end time stops here (the caller ends the stretch
        there): it was created before that step began (the arrival process after an arrival
        in an earlier step, or a finish), so SimPy runs it before the per-step loop's scheduling
        there, as it runs before the stretch's. A step in which an arrival would create an
        arrival at the step's exact end is not entered (:meth:`_tie_inside`: SimPy would run that
        one after the scheduling): ``j`` is its index.
        """
        env = self.env
        while c[-1] >= t_ev and t_ev < t_lim:
            j = int(np.searchsorted(c, t_ev, side="left"))
            if c[j] == t_ev:
                break
            if self._tie_inside(float(c[j - 1]) if j else t0, float(c[j])):
                return t_ev, j
            yield from _advance_to(env, t_ev)
            log.append((t_ev, len(self.waiting)))
            t_ev = env.peek()
        return t_ev, None

    def _ff_commit(self, req: Request, steps: int, tokens: int, blocks: int, reg=None) -> None:
        """Bring ``req``'s counters forward by ``steps`` pure-decode steps of a fast-forward
        stretch: ``tokens`` placed in its layout (a stretch's first token was placed by the
        scheduler) with the ``blocks`` already added to its table (``n_blocks``), full blocks
        registered in the prefix cache (now, or appended to ``reg`` = (blocks list, keys list)
        for one registration later), peak blocks."""
        if req.layout is not None and (tokens or blocks):
            # = Compression.blocks_for + place on an order-preserving layout (fast-forward runs
            # none other), with layout.n_blocks + blocks_since = n_blocks - blocks
            need = req.phys_base + req.pending + tokens
            if max(0, -(-need // self.B) - (req.n_blocks - blocks)) != blocks:
                raise RuntimeError("fast-forward block count disagrees with the layout")
            req.pending += tokens
            req.blocks_since += blocks
            req.n_placed += tokens
        if req.n_blocks > req.peak_blocks:
            req.peak_blocks = req.n_blocks
        req.n_computed += steps
        req.n_generated += steps
        if self.caching and not req.compressed:
            full = req.n_computed // self.B
            if full > req.n_cached:
                if reg is None:
                    self.pool.cache_blocks(req.blocks[req.n_cached:full],
                                           req.keys[req.n_cached:full])
                    req.n_cached = full
                else:
                    _queue_registration(req, full, reg)

    def _head_hit_step(self, ps, budget: int):
        """The first fast-forward step (no tiers) whose new blocks take a block of the waiting
        head's prefix hit off the free queue and after which the head fits, or None: the
        per-step loop admits it in that step's scheduling. ``ps``: the step of each new block,
        in allocation order (by step; blocks are taken from the free queue's head in that
        order, none freed between); ``budget``: the tokens the step's decodes leave.

        At such a step the head is checked as :meth:`_admission_plan` checks it: its hit cut at
        the first block taken, the free blocks among the hit blocks before it (none of them
        taken), its chunk, and the free blocks after that step's new blocks.

        Between such steps a pure-decode stretch can only make the head less admissible:
        fewer free blocks, the same hit. Taking one of its hit blocks cuts its hit at that
        block, and the hit blocks after it that are still free no longer count against the
        free blocks (they were taken with the hit): when the head's chunk is capped (by the
        token budget or ``long_prefill_token_threshold``) its new blocks stay as many, so it
        may need fewer blocks than before. A hit block with free blocks after it happens when
        requests sharing a prefix computed parts of it concurrently (one's blocks were
        registered, the other's kept as duplicates) and freed them in another order; found by
        a differential search with ``long_prefill_token_threshold``."""
        head = self.waiting[0]
        max_hit = (head.num_tokens - 1) // self.B if self.caching else 0
        if not max_hit:
            return None
        self._ensure_keys(head)
        # a block holding one of the head's first max_hit keys is that key's indexed block
        # (a key held keeps its block; duplicates stay unregistered): a hit block, or one past
        # its first miss (taking that one changes nothing; cutting there is merely early)
        pool = self.pool
        held = self._hit_index(head, max_hit).get_many(pool.block_hash[pool.peek_free(len(ps))])
        bad = np.flatnonzero(held >= 0)
        if not len(bad):
            return None
        hit = pool.lookup_prefix(head.keys, max_hit)
        cut = len(hit)
        B = self.B
        free0 = pool.num_free
        for i in bad.tolist():  # (allocation order)
            j = int(held[i])
            if j >= cut:
                continue  # past the hit, or behind an earlier cut: the hit stays as short
            cut = j
            s = int(ps[i])
            n = self._chunk(head.num_tokens - j * B, budget)
            if n < 0:
                continue
            need = -(-(j * B + n) // B) - j + pool.blocks_needed_for_touch(hit[:j])
            if need <= free0 - int(np.searchsorted(ps, s, side="right")):
                return s
        return None

    def _first_evicting_step(self, ps):
        """The first fast-forward step whose new blocks evict a cached block from the free
        queue, or None. ``ps``: the step of each new block, in allocation order (by step; None
        or empty: no new blocks); blocks are taken from the free queue's head in that order."""
        if ps is None or not len(ps):
            return None
        ev = self.pool.block_hash[self.pool.peek_free(len(ps))] != NO_HASH
        return int(ps[int(np.argmax(ev))]) if ev.any() else None

    def _tier_ff_cap(self, reqs, k: int, ps, B: int) -> int:
        """Last fast-forward step that keeps the waiting head's per-step retries exact with
        tiers (see :meth:`_fast_forward`). ``ps``: the step of each new block, in allocation
        order (by step; None: no new blocks). Returns a step count <= ``k``."""
        pool = self.pool
        wp = self.tiers.write_policy
        cap = k
        # step 1's scheduling already evicted/registered: its offloads are issued at its end
        # (write_back's evictions were issued at the scheduling, which then holds the step and
        # is not fast-forwarded)
        if wp == "write_through" and pool.cached_log:
            cap = min(cap, 2)
        first = self._first_evicting_step(ps)
        if first is not None:
            cap = min(cap, first - 1)
        if wp == "write_through" and self.caching:
            # decode-filled blocks are registered (and copied down at that step's end) at step
            # (n_cached + 1) x B - n_computed
            first = min((((r.n_cached + 1) * B - r.n_computed) for r in reqs if not r.compressed),
                        default=None)
            if first is not None:
                cap = min(cap, first + 1)
        return cap

    def _ff_offloads(self, ends, cached: dict, last: int):
        """SimPy process: the write-policy offloads of fast-forwarded steps before step ``last``,
        each issued at its step's end time (``ends[s - 1]``) as the per-step loop would (the
        last step's are issued by the engine itself, before it schedules again)."""
        env = self.env
        tiers = self.tiers
        for st in sorted(st for st in cached if st < last):
            t = float(ends[st - 1])
            if t > env.now:
                yield env.timeout(t - env.now)
            tiers.on_gpu_cached(cached[st])
            tiers.flush()

    def _tier_step_end(self) -> None:
        pool = self.pool
        tiers = self.tiers
        if self._hit_memo is not None and \
                sum(map(len, pool.change_log)) + sum(map(len, tiers.change_log)) > MEMO_LOG_MAX:
            # the head has not been walked for a long time (e.g. max_num_seqs reached): drop the
            # memo rather than let the logs grow
            self._hit_memo = None
        if self._hit_memo is None:  # nothing to revalidate: keep the change logs short
            pool.change_log.clear()
            tiers.change_log.clear()
        if pool.cached_log:
            if tiers.write_policy == "write_through":  # (the only policy copying them now)
                tiers.on_gpu_cached(np.concatenate(pool.cached_log))
            pool.cached_log.clear()
        tiers.flush()

    def _retire_finished(self) -> None:
        """Free the finished requests' blocks, record them and release their closed-loop
        children, in running order; the others stay running, in order."""
        self._retire([req for req in self.running if req.status == FINISHED])
        self._drop_finished()

    def _drop_finished(self) -> None:
        """The running list without the retired (finished) requests, in order; progress."""
        self.running = [req for req in self.running if req.status != FINISHED]
        if self.progress is not None:
            self.progress(self.done)

    def _retire(self, done: list, freed: bool = False) -> None:
        """Free the finished requests ``done``'s blocks (in that order; ``freed``: the pool
        already took them back, :meth:`_ff_allocate_finishing`), record them and release their
        closed-loop children."""
        rec = self.rec
        for req in done:
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
                self._free_blocks(req)
            req.keys = None
            req.blocks = None
            self.done += 1
            rec.request_done(req)
            self._release_children(req.idx)

    def _live_tokens(self) -> int:
        return sum(r.n_computed for r in self.running)

    def check_invariants(self) -> None:
        """Assert pool and request invariants (``sim.check_invariants``)."""
        for r in self.running:
            if r.layout is not None:  # the scheduler's fast path reads n_blocks for this sum
                assert r.n_blocks == r.layout.n_blocks + r.blocks_since, (
                    f"request {r.rid}: block table {r.n_blocks} != layout {r.layout.n_blocks} + "
                    f"{r.blocks_since}")
        # (a request in a blocking onboard holds its blocks outside the running list)
        onboarding = list(self._onboarding_reqs.values())
        assert len(onboarding) == self.onboarding, "onboarding count differs from its requests"
        assert all(r.status == ONBOARDING for r in onboarding)
        held = [r.blocks[:r.n_blocks] for r in self.running + onboarding if r.n_blocks]
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
            assert len(tm.host) <= tm.host_pages, f"host holds {len(tm.host)} > {tm.host_pages} pages"
            if tm.disk is not None:
                assert len(tm.disk) <= tm.disk_pages, f"disk holds {len(tm.disk)} > {tm.disk_pages} pages"

    def run(self) -> None:
        """Run until every request has finished or been rejected. Raises ConfigError when the
        clock passes ``sim.max_sim_time_s`` or 2**32 s (:meth:`_check_sim_time`; the latter
        also when tier copies still landing after the last request take it there)."""
        self.env.process(self._arrivals())
        self.env.process(self._engine())
        self.env.run()
        # the steps' rows count the pool after each step's finished requests left; its peak is
        # the most blocks held at once (BlockPool.peak_used), finishing requests included
        self.rec.peak_blocks_used = max(self.rec.peak_blocks_used, self.pool.peak_used)
        if self.env.now > MAX_CLOCK_S:
            # (tier copies still landing after the last request: a disk latency or bandwidth
            # off by orders of magnitude)
            self._check_sim_time()
        if self.done != self.n:
            raise RuntimeError(f"simulation ended with {self.n - self.done} requests unfinished")
        if self.check:
            ids = [row[0] for row in self.rec.rows]
            assert len(ids) == self.n and len(set(ids)) == self.n, \
                "a request did not end in exactly one terminal state"
