"""Per-request block tables and prefix hits (the role of vLLM v1's ``KVCacheManager``).

:class:`KVManager` holds what a request owns in the block pool (:mod:`sim.block_pool`): its block
keys (:mod:`sim.keys`), its block table grown as tokens get slots (new blocks, and the blocks now
full registered in the prefix index, in the scheduler's order), freed on finish or preemption;
and the admission's prefix hit: the GPU lookup (at most ``(num_tokens - 1) // block_size``
blocks), extended through host and disk pages with tiers (the waiting head's walk memoised
against the pool's and tiers' change logs), and the onboarding of those pages into the blocks
the hit reserved. Token counts in tokens, times in simulated seconds."""

from __future__ import annotations

import numpy as np

from .block_pool import KeyTable
from .clock import advance_to
from .keys import block_keys, continues
from .request import ONBOARDING, RUNNING, Request
from .tiers.spec import GPU, HOST, REMOTE


MEMO_LOG_MAX = 1 << 18  # keys logged while a hit-walk memo waits; past this the memo is dropped


def queue_registration(req, full: int, reg: tuple) -> None:
    """Queue ``req``'s blocks ``n_cached .. full - 1`` for one later prefix-cache registration
    (``reg`` = (block arrays, key arrays)) and count them as registered."""
    reg[0].append(req.blocks[req.n_cached:full])
    reg[1].append(req.keys[req.n_cached:full])
    req.n_cached = full


def joined_registration(reg: tuple) -> tuple:
    """The blocks and keys ``reg`` (:func:`queue_registration`'s lists) queued, each as one
    int64 array; empties the lists."""
    if len(reg[0]) == 1:
        out = reg[0][0], reg[1][0]
    else:
        out = np.concatenate(reg[0]), np.concatenate(reg[1])
    reg[0].clear()
    reg[1].clear()
    return out


class KVManager:
    """Block tables, prefix hits and onboarding of the requests of one engine (``sim``: its
    :class:`sim.engine.Simulator`, whose pool, tiers and queues it works on)."""

    def __init__(self, sim):
        self.sim = sim
        self.hit_memo = None  # (request, gen, max_hit, walk state, result); tiers only
        self.hit_keys = None  # [request, its keys array, max_hit, KeyTable key -> index or None]

    def ensure_keys(self, req: Request) -> None:
        sim = self.sim
        if req.keys is None:
            i = req.idx
            ids = sim.p_val[sim.p_off[i]:sim.p_off[i + 1]]
            nxt, reach = self.continuation(i, ids) if sim.reuse_answers else (None, 0)
            req.keys = block_keys(ids, sim.G, req.input, sim.B, req.rid, req.total_blocks,
                                  nxt, reach)
            req.blocks = np.empty(req.total_blocks, dtype=np.int64)

    def continuation(self, i: int, ids: np.ndarray):
        """Row ``i``'s continuation (:func:`sim.keys.continues`: its first closed-loop child
        whose ids begin with ``ids``, row ``i``'s full trace blocks): ``(its prefix ids, the
        tokens of row i they identify)``, or ``(None, 0)``."""
        sim = self.sim
        kids = sim.children.get(i)
        if not kids or sim.G <= 0:
            return None, 0
        n_in = int(sim.w_in[i])
        for c in kids:
            cids = sim.p_val[sim.p_off[c]:sim.p_off[c + 1]]
            c_in = int(sim.w_in[c])
            if continues(ids, n_in, sim.G, cids, c_in):
                return cids, min(c_in, n_in + int(sim.w_out[i]))
        return None, 0

    def grow(self, req: Request, upto_tokens: int) -> bool:
        """Give ``req`` slots for ``upto_tokens`` tokens; False if the pool is short."""
        sim = self.sim
        if req.layout is not None:
            return self.grow_layout(req, upto_tokens)
        need = -(-upto_tokens // sim.B) - req.n_blocks
        full = upto_tokens // sim.B
        reg = sim.caching and full > req.n_cached
        if need > 0:
            if need > sim.pool.num_free:
                return False
            # the new blocks, then the blocks now full registered: one pool call
            nb = req.n_blocks
            if reg:
                sim.pool.allocate_into(req.blocks[nb:nb + need], req.blocks[req.n_cached:full],
                                        req.keys[req.n_cached:full])
                req.n_cached = full
                reg = False
            else:
                sim.pool.allocate_into(req.blocks[nb:nb + need])
            req.n_blocks = nb + need
            if req.n_blocks > req.peak_blocks:
                req.peak_blocks = req.n_blocks
        if reg:
            sim.pool.cache_blocks(req.blocks[req.n_cached:full], req.keys[req.n_cached:full])
            req.n_cached = full
        return True

    def grow_layout(self, req: Request, upto_tokens: int) -> bool:
        sim = self.sim
        n = upto_tokens - req.n_placed
        if n <= 0:
            return True
        comp = sim.comp
        k = comp.blocks_for(req, n)
        if k > sim.pool.num_free:
            return False
        if k:
            sim.pool.allocate_into(req.blocks[req.n_blocks:req.n_blocks + k])
            req.n_blocks += k
            if req.n_blocks > req.peak_blocks:
                req.peak_blocks = req.n_blocks
        comp.place(req, n, k)
        full = upto_tokens // sim.B
        if sim.caching and not req.compressed and full > req.n_cached:
            sim.pool.cache_blocks(req.blocks[req.n_cached:full], req.keys[req.n_cached:full])
            req.n_cached = full
        return True

    def flush_grow(self, defer: list, reg: tuple) -> None:
        """Make :meth:`Scheduler.schedule`'s deferred work: one new block for each of ``defer`` (in
        order; they fit the free blocks), and one registration of the blocks in ``reg``
        (lists of block and key arrays). Empties both."""
        sim = self.sim
        # with block_size > 1 a block a deferred decode token starts is not full, so the
        # registration never reads a block this allocation writes: one pool call does both
        fuse = defer and reg[0] and sim.B > 1
        if defer:
            new = np.empty(len(defer), dtype=np.int64)
            if fuse:
                sim.pool.allocate_into(new, *joined_registration(reg))
            else:
                sim.pool.allocate_into(new)
            for req, blk in zip(defer, new.tolist()):
                req.blocks[req.n_blocks] = blk
                req.n_blocks += 1
                if req.n_blocks > req.peak_blocks:
                    req.peak_blocks = req.n_blocks
            defer.clear()
        if reg[0] and not fuse:
            sim.pool.cache_blocks(*joined_registration(reg))

    def free_blocks(self, req: Request) -> None:
        sim = self.sim
        if req.n_blocks:
            sim.pool.free(req.blocks[:req.n_blocks][::-1])
        req.n_blocks = 0
        req.n_cached = 0

    def prefix_hit(self, req: Request):
        """The admission's prefix hit: GPU lookup, extended through host and disk with tiers.

        Returns ``(table, tier_pos, tier_keys, tier_codes)`` as :meth:`KVManager.hit_result` (the
        last three None without tier pages). With tiers, the walk for the waiting head is memoised:
        an overloaded server retries its head every step, and the walk over thousands of keys was
        the top cost. While none of the head's keys changed membership in the GPU index, host or
        disk (the pool's and tier manager's change logs since the walk) the result is reused;
        otherwise only the changed blocks are looked up again (:meth:`KVManager.rewalk`). """
        sim = self.sim
        B = sim.B
        max_hit = (req.num_tokens - 1) // B if sim.caching else 0
        tiers = sim.tiers
        if tiers is None:
            return sim.pool.lookup_prefix(req.keys, max_hit), None, None, None
        memo = self.hit_memo
        pool_log = sim.pool.change_log
        if memo is not None and memo[0] is req and memo[1] == req.gen and memo[2] == max_hit:
            if not pool_log and not tiers.change_log:
                return memo[4]
            changed = np.concatenate(pool_log + tiers.change_log)
            idx = self.hit_index(req, max_hit).get_many(changed)
            pool_log.clear()
            tiers.change_log.clear()
            idx = idx[idx >= 0]
            if not len(idx):
                return memo[4]
            state = self.rewalk(req, memo[3], np.unique(idx), max_hit)
        else:
            pool_log.clear()
            tiers.change_log.clear()
            state = self.walk(req, 0, max_hit)
        res = self.hit_result(req, *state)
        self.hit_memo = (req, req.gen, max_hit, state, res)
        return res

    def walk(self, req: Request, lo: int, max_hit: int):
        """Locate ``req``'s blocks from ``lo`` up to the first held nowhere (or ``max_hit``):
        ``(GPU block id or -1, code)`` arrays of those blocks (:meth:`TierManager.locate`)."""
        sim = self.sim
        if lo >= max_hit:
            return np.empty(0, np.int64), np.empty(0, np.int8)
        return sim.tiers.locate(sim.pool, req.keys[lo:max_hit], stop=True)

    def rewalk(self, req: Request, state, changed: np.ndarray, max_hit: int):
        """The memoised walk ``state = (blk, code)`` of the head's blocks ``0 .. m - 1`` brought
        up to date after the blocks at indices ``changed`` (sorted) changed membership: they are
        located again; the first one now held nowhere ends the hit; if block ``m`` (the one that
        ended it) is now held, the walk goes on from there. Every other block's location is
        unchanged (the change logs list every key whose GPU, host or disk membership changed),
        so this equals a fresh walk."""
        sim = self.sim
        blk, code = state
        m = len(blk)
        idx = np.asarray(changed, dtype=np.int64)
        inside = idx[idx < m]
        if len(inside):
            gpu_b, c = sim.tiers.locate(sim.pool, req.keys[inside])
            blk = blk.copy()
            code = code.copy()
            blk[inside] = gpu_b
            code[inside] = c
            gone = inside[c < 0]
            if len(gone):
                cut = int(gone[0])
                return blk[:cut], code[:cut]
        if m < max_hit and m in changed:
            ext_b, ext_c = self.walk(req, m, max_hit)
            if len(ext_b):
                blk = np.concatenate([blk, ext_b])
                code = np.concatenate([code, ext_c])
        return blk, code

    def hit_result(self, req: Request, blk: np.ndarray, code: np.ndarray):
        """The admission's hit from the walk of blocks ``0 .. m - 1`` (``blk``: GPU block id or
        -1, ``code``: serving tier): the GPU prefix, then every block from the first that is not
        on the GPU served by the fastest tier holding it, up to the first held nowhere. Returns
        the block-table prefix (GPU block ids, -1 where a page must be onboarded) and the
        positions, keys and tier codes of those pages (None, None, None without any). With
        ``load_or_recompute`` the hit is cut at the first page below level 1 (a disk page) when
        loading the pages from there on would take longer than recomputing their tokens.
        """
        sim = self.sim
        tiers = sim.tiers
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
        deep = (codes_a > HOST) & (codes_a != REMOTE)
        if deep.any():
            first = int(np.argmax(deep))
            rest = codes_a[first:]
            counts = [int(np.count_nonzero(rest == lv)) for lv in range(1, len(tiers.stores) + 1)]
            n_disk = sum(counts[1:])
            load = tiers.estimate_load_s(counts)
            ctx = (g + first) * sim.B
            recompute = sim.cost.prefill_time((len(codes_a) - first) * sim.B, ctx)
            if recompute < load:
                req.recompute_cut = ((len(codes_a) - first) * sim.B, n_disk * sim.B)
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

    def start_onboard(self, req: Request, pos, keys, codes, blocking: bool) -> None:
        sim = self.sim
        tiers = sim.tiers
        level_keys = [keys[codes == lv] for lv in range(1, len(tiers.stores) + 1)]
        tiers.touch(level_keys)
        remote_keys = None
        if tiers.store is not None:  # (a cluster's shared store: fetched over its link)
            remote_keys = keys[codes == REMOTE]
            tiers.store.store.touch(remote_keys)
        if blocking:
            req.status = ONBOARDING
            sim.onboarding += 1
            if sim.check:
                sim.onboarding_reqs[req.rid] = req  # (check_invariants counts their blocks)
        req.load_event = sim.env.process(
            self.onboard(req, pos, level_keys, blocking, req.gen, remote_keys))

    def onboard(self, req: Request, pos, level_keys, blocking: bool, gen: int,
                remote_keys=None):
        sim = self.sim
        env = sim.env
        t0 = env.now
        out = {}
        if sim.wb_until > env.now:  # (write_back) the reused blocks' old pages leave first
            yield from advance_to(env, sim.wb_until)
        yield env.process(sim.tiers.onboard(level_keys, out, remote_keys))
        if req.gen != gen:  # preempted while loading (layerwise): its blocks are gone
            return
        sim.pool.cache_blocks(req.blocks[pos], req.keys[pos])
        if req.n_generated == 0:  # before the first token (the TTFT split: queue + onboard + prefill)
            t = req.onboard_tier_s
            if t is None:
                t = req.onboard_tier_s = [0.0] * len(sim.tiers.names)
            for i, name in enumerate(sim.tiers.names):
                t[i] += out[f"onboard_{name}_s"]
            if remote_keys is not None:
                req.onboard_remote_s += out["onboard_remote_s"]
        if blocking:
            if req.n_generated == 0:
                req.onboard_s += env.now - t0
            self._onboarded(req)

    def _onboarded(self, req: Request) -> None:
        """``req``'s onboarding ended: it joins the running list and wakes the engine loop."""
        sim = self.sim
        sim.onboarding -= 1
        sim.onboarding_reqs.pop(req.rid, None)
        req.status = RUNNING
        sim.running.append(req)
        if sim.wake is not None and not sim.wake.triggered:
            sim.wake.succeed()

    def start_receive(self, req: Request, blocks: int) -> None:
        """Receive ``req``'s prompt KV from its prefill replica into its last ``blocks`` blocks
        (prefill/decode disaggregation; :meth:`sim.scheduler.Scheduler.admit_remote` allocated
        them): ``req`` onboards (it holds its blocks outside the running list, counted against
        ``max_num_seqs``) until the transfer (``sim.receive``) lands, then its full prompt blocks
        are registered in the prefix cache (with compression, those its prefill replica's round
        left uncompressed) and it computes from its last prompt token on (vLLM's
        ``_update_waiting_for_remote_kv``: the received tokens are computed, less one when they
        are all the request's tokens, so that the decode replica samples the first token; a
        compressed layout already holds that token's slot)."""
        sim = self.sim
        req.status = ONBOARDING
        sim.onboarding += 1
        if sim.check:
            sim.onboarding_reqs[req.rid] = req
        sim.env.process(self.receive(req, blocks))

    def receive(self, req: Request, blocks: int):
        sim = self.sim
        if sim.wb_until > sim.env.now:  # (write_back) the reused blocks' old pages leave first
            yield from advance_to(sim.env, sim.wb_until)
        yield from sim.receive(req, blocks)
        full = req.input // sim.B
        if req.compressed and req.intact_blocks < full:  # (its other blocks hold compressed KV)
            full = req.intact_blocks
        if sim.caching and full > req.n_cached:
            sim.pool.cache_blocks(req.blocks[req.n_cached:full], req.keys[req.n_cached:full])
            req.n_cached = full
        req.n_computed = req.input - 1
        req.computed_prompt_tokens += 1
        req.prefill_end = req.input
        req.onboard_s = sim.env.now - req.pd.start
        req.pd.landed = True
        self._onboarded(req)

    def head_key_table(self, head):
        """:meth:`KVManager.hit_index` of the waiting head, or None when the memo is not the head's
        current walk."""
        sim = self.sim
        memo = self.hit_memo
        max_hit = (head.num_tokens - 1) // sim.B if sim.caching else 0
        if memo is None or memo[0] is not head or memo[1] != head.gen or memo[2] != max_hit:
            return None
        return self.hit_index(head, max_hit)

    def hit_index(self, req: Request, max_hit: int) -> KeyTable:
        """The key -> block index table of ``req``'s first ``max_hit`` blocks (chained keys:
        distinct), kept across the re-walks of its memoised hit (:meth:`KVManager.prefix_hit`) and
        built when first needed."""
        kp = self.hit_keys
        if kp is None or kp[0] is not req or kp[1] is not req.keys or kp[2] != max_hit:
            kp = self.hit_keys = [req, req.keys, max_hit, None]
        if kp[3] is None:
            keys = req.keys[:max_hit]
            kp[3] = KeyTable(2 * len(keys) + 2)
            kp[3].put_absent(keys, np.arange(len(keys), dtype=np.int64), keys)
        return kp[3]
