"""Pieces the fast paths share: a *stretch* advances several engine steps at once and leaves
every table, pool state and clock value equal to the per-step loop's.

* allocation order: :func:`block_pairs` / :func:`stretch_pairs` list the (request, step) pairs
  of a stretch's new blocks in the per-step order (step, then running order), cut at the free
  blocks (compiled);
* commits: :func:`commit_decodes` / :func:`commit_stretch` apply a stretch's tokens, new
  blocks and prefix-cache registrations to its requests;
* bounds: :func:`head_hit_step` (the step at which the waiting head's prefix hit changes),
  :func:`waiting_per_step` (the waiting count of each step's row)."""

from __future__ import annotations

import numpy as np

from ..jit import kernel
from ..kv_manager import queue_registration
from ..request import FINISHED, Request


NO_EXTRA = np.empty(0, dtype=np.int64)  # (stretch_pairs: no other request's blocks)


def waiting_per_step(waiting0: int, log: list, ends: np.ndarray) -> np.ndarray:
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


def block_pairs(first: np.ndarray, last: int, B: int):
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
def stretch_pairs(slot0, last, B, k, free, extra, alloc, pi, ps):  # pragma: no cover (compiled)
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


def flat(log: list) -> list:
    """The keys of a pool log (a list of int64 arrays) as one list of ints."""
    return np.concatenate(log).tolist() if log else []


def grown(arrays, n: int) -> tuple:
    """``arrays`` (1-d int64) zero-extended to at least ``n`` entries (doubling)."""
    out = []
    for a in arrays:
        if len(a) < n:
            a = np.concatenate([a, np.zeros(max(n, 2 * len(a)) - len(a), dtype=a.dtype)])
        out.append(a)
    return tuple(out)


def commit_decodes(sim, reqs, fin, k: int, ends, now: float, reg: tuple) -> bool:
    """Commit a dense stretch of ``k`` steps to the decoding requests ``reqs``: request
    ``i`` ran ``min(fin[i], k)`` steps (it finishes at step ``fin[i]``), each computing and
    sampling one token; its peak blocks are updated, its blocks now full are queued on
    ``reg`` for one registration (:func:`queue_registration`), and a finished one is marked
    so, at the end of its last step (``ends[n - 1]``, s; ``now`` for the stretch's last).
    Returns whether any finished."""
    B = sim.B
    caching = sim.caching
    finished = False
    for req, f in zip(reqs, fin):
        if req.n_blocks > req.peak_blocks:
            req.peak_blocks = req.n_blocks
        n = k if f > k else f  # (steps it ran: it finished at step f <= k)
        c = req.n_computed + n
        req.n_computed = c
        req.n_generated += n
        if caching and c // B > req.n_cached:
            queue_registration(req, c // B, reg)
        if req.n_generated >= req.output:
            req.status = FINISHED
            req.finish = now if n == k else float(ends[n - 1])
            finished = True
    return finished


def commit_stretch(sim, req: Request, steps: int, tokens: int, blocks: int, reg=None) -> None:
    """Bring ``req``'s counters forward by ``steps`` pure-decode steps of a fast-forward
    stretch: ``tokens`` placed in its layout (a stretch's first token was placed by the
    scheduler) with the ``blocks`` already added to its table (``n_blocks``), full blocks
    registered in the prefix cache (now, or appended to ``reg`` = (blocks list, keys list)
    for one registration later), peak blocks."""
    if req.layout is not None and (tokens or blocks):
        # = Compression.blocks_for + place on an order-preserving layout (fast-forward runs
        # none other), with layout.n_blocks + blocks_since = n_blocks - blocks
        need = req.phys_base + req.pending + tokens
        if max(0, -(-need // sim.B) - (req.n_blocks - blocks)) != blocks:
            raise RuntimeError("fast-forward block count disagrees with the layout")
        req.pending += tokens
        req.blocks_since += blocks
        req.n_placed += tokens
    if req.n_blocks > req.peak_blocks:
        req.peak_blocks = req.n_blocks
    req.n_computed += steps
    req.n_generated += steps
    if sim.caching and not req.compressed:
        full = req.n_computed // sim.B
        if full > req.n_cached:
            if reg is None:
                sim.pool.cache_blocks(req.blocks[req.n_cached:full],
                                       req.keys[req.n_cached:full])
                req.n_cached = full
            else:
                queue_registration(req, full, reg)


def head_hit_step(sim, ps, budget: int):
    """The first fast-forward step (no tiers) whose new blocks take a block of the waiting
    head's prefix hit off the free queue and after which the head fits, or None: the
    per-step loop admits it in that step's scheduling. ``ps``: the step of each new block,
    in allocation order (by step; blocks are taken from the free queue's head in that
    order, none freed between); ``budget``: the tokens the step's decodes leave.

    At such a step the head is checked as :meth:`Scheduler.admission_plan` checks it: its hit cut at
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
    head = sim.waiting[0]
    max_hit = (head.num_tokens - 1) // sim.B if sim.caching else 0
    if not max_hit:
        return None
    sim.kv.ensure_keys(head)
    # a block holding one of the head's first max_hit keys is that key's indexed block
    # (a key held keeps its block; duplicates stay unregistered): a hit block, or one past
    # its first miss (taking that one changes nothing; cutting there is merely early)
    pool = sim.pool
    held = sim.kv.hit_index(head, max_hit).get_many(pool.block_hash[pool.peek_free(len(ps))])
    bad = np.flatnonzero(held >= 0)
    if not len(bad):
        return None
    hit = pool.lookup_prefix(head.keys, max_hit)
    cut = len(hit)
    B = sim.B
    free0 = pool.num_free
    for i in bad.tolist():  # (allocation order)
        j = int(held[i])
        if j >= cut:
            continue  # past the hit, or behind an earlier cut: the hit stays as short
        cut = j
        s = int(ps[i])
        n = sim.sched.chunk(head.num_tokens - j * B, budget)
        if n < 0:
            continue
        need = -(-(j * B + n) // B) - j + pool.blocks_needed_for_touch(hit[:j])
        if need <= free0 - int(np.searchsorted(ps, s, side="right")):
            return s
    return None
