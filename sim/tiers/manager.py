"""The tier manager: offloads (write policies), demotions, onboarding and hit lookups across the
GPU's block pool and the levels below it (:mod:`sim.tiers.spec`), inside one SimPy env.

Write policies: ``write_back`` copies a cached GPU block's page down when the allocator evicts
it, and the block is not overwritten before that copy lands: the engine holds the step that
reuses it (and onboarding copies into it) until then (:meth:`TierManager.write_back`; SGLang
HiCache, ``HiRadixCache.evict`` with ``write_policy="write_back"``, waits for its writes before
freeing device memory); ``write_through`` and ``write_through_selective`` copy blocks that stay
on the GPU, asynchronously. Each level's evictions are demoted to the level below it (the
host's to the disk); a page read back from a deeper level is promoted into each level above it
on its way to the GPU (a disk page into the host). An onboarding request's process waits on its batches' timeouts; an
offload or demotion lands at its batch's end (one timeout, or an entry of a tier stretch's
agenda: :class:`sim.stretches.tiers.Agenda`).
"""

from __future__ import annotations

import numpy as np

from ..block_pool import PrefixTable
from ..clock import exact_delays
from ..errors import ConfigError
from ..metrics import TransferLog
from .links import Link
from .pages import codec_time
from .spec import GPU, REMOTE, tier_specs
from .stores import KeySet, LRUStore, locate_pages, queue_absent

WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")


def joined(parts: list) -> np.ndarray:
    """The int64 arrays ``parts`` end to end (the one array itself when there is one)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class TierManager:
    """The stores and links of the chain of levels below the GPU (:func:`sim.tiers.spec.
    tier_specs`), offload (write policy), demotion and onboarding, inside one SimPy env.

    Args:
        env: SimPy environment.
        tiers, codec: config nodes (``sim.config.TiersConfig`` / ``CodecConfig``).
        hot_page_bytes, cold_page_bytes: bytes of one block on the GPU / encoded.
        gpu: GPU card (PCIe defaults); hbm_Bps: HBM bandwidth for codec time.
        calibration: optional ``gpu_validation.calibration_model.Calibration`` whose fitted
            ``{codec}_encode_d2h_fused`` / ``{codec}_h2d_decode_fused`` / ``d2h`` / ``h2d`` ops
            replace the analytic link + codec times.

    Records every batch transfer in ``records`` (time_s, direction, tier, pages, bytes,
    duration_s, queue_s, codec; direction: the link's name, tier: the level it fills or
    serves from).

    The chain runs down to its last level with capacity above 0 (level 1 always: with none,
    a level of 0 pages that a shared store's replica stages nothing through): ``specs``,
    ``names``, ``stores`` (``host`` is level 1's, ``disk`` level 2's or None), ``fill`` and
    ``serve`` (their links), level 1 first; a level of 0 pages above a deeper one stages the
    pages passing through it.
    """

    def __init__(self, env, tiers, codec, hot_page_bytes: int, cold_page_bytes: int, gpu,
                 hbm_Bps: float, calibration=None):
        self.env = env
        self.codec = codec.name
        self.hot = int(hot_page_bytes)
        self.cold = int(cold_page_bytes)
        if tiers.write_policy not in WRITE_POLICIES:
            raise ConfigError(
                f"tiers.write_policy={tiers.write_policy!r}; expected one of {list(WRITE_POLICIES)}")
        self.write_policy = tiers.write_policy
        if tiers.selective_min_hits < 1:
            raise ConfigError(f"tiers.selective_min_hits={tiers.selective_min_hits}; expected >= 1")
        self.selective_min_hits = int(tiers.selective_min_hits)
        if tiers.transfer_batch_pages < 1:
            raise ConfigError(f"tiers.transfer_batch_pages={tiers.transfer_batch_pages}; expected >= 1")
        self.batch = int(tiers.transfer_batch_pages)
        if tiers.onboard not in ("blocking", "layerwise"):
            raise ConfigError(f"tiers.onboard={tiers.onboard!r}; expected 'blocking' or 'layerwise'")
        self.layerwise = tiers.onboard == "layerwise"
        self.load_or_recompute = bool(tiers.load_or_recompute)
        # the levels below the GPU (sim.tiers.spec): their stores and links
        chain = tier_specs(tiers, self.cold, gpu)
        last = max([0] + [i for i, sp in enumerate(chain) if sp.capacity_pages > 0])
        self.all_specs = chain  # (every level of the config, those off included)
        self.specs = chain[:last + 1]
        self.names = tuple(sp.name for sp in chain)
        self.capacity = {sp.name: sp.capacity_pages for sp in chain}
        self.stores = [sp.store() for sp in self.specs]
        self.fill = [sp.fill.build() for sp in self.specs]
        self.serve = [sp.serve.build() for sp in self.specs]
        self.host = self.stores[0]
        self.disk = self.stores[1] if len(self.stores) > 1 else None
        self.h2d = self.serve[0]
        self.d2h = self.fill[0]
        # (the compiled hit walk's arguments, while every store is an LRUStore)
        self._compiled = all(isinstance(st, LRUStore) for st in self.stores)
        self.hbm = float(hbm_Bps)
        self.cal = calibration
        self._d2h_memo: dict = {}  # pages -> d2h_time / h2d_time (s)
        self._h2d_memo: dict = {}
        self.inflight = KeySet()  # pages queued or being copied to the host
        self.pending: list[np.ndarray] = []  # pages to offload, in order (int64 arrays)
        # per level (index 0: level 1, never used): the evictions of the level above it to
        # write into it
        self.pending_demote: list[list[np.ndarray]] = [[] for _ in self.specs]
        self.hit_count: dict[int, int] = {}
        self.records = TransferLog(
            self.codec, tuple(d for sp in chain for d in (sp.fill.name, sp.serve.name)),
            self.names)
        self.bytes_offloaded = {n: 0 for n in self.names}
        self.bytes_onboarded = {n: 0 for n in self.names}
        # keys whose host/disk membership changed (inserted or evicted) since the engine last
        # cleared the list (int64 arrays, none empty): it revalidates its memo of the waiting
        # head's hit walk with it
        self.change_log: list[np.ndarray] = []
        # no level with capacity (a replica with a shared store only): nothing is offloaded
        self.local = any(sp.capacity_pages > 0 for sp in self.specs)
        # a cluster's shared store: this replica's sim.kv_store.StoreLink, set by the cluster
        self.store = None
        # a tier stretch's agenda (sim.stretches.tiers.Agenda) while it runs the landings it
        # causes itself, and the simulated time (s) of the work it does ahead of the SimPy clock
        # (TierManager.now); None: landings are SimPy timeouts and the clock is SimPy's
        self.agenda = None
        self.clock = None

    def now(self) -> float:
        """The simulated time (s) of the tier work being done: the SimPy clock, or the time a
        tier stretch runs its steps and landings at ahead of it (``clock``)."""
        return self.env.now if self.clock is None else self.clock

    # ------------------------------------------------------------------ timing
    def _copy_time(self, pages: int, link: Link, fused_op: str, plain_op: str) -> float:
        """Seconds to move ``pages`` over ``link`` with the codec fused into the copy: the
        calibrated fused op when there is one, else the link time or the codec's HBM time,
        whichever is longer (the quantisation rides the transfer)."""
        if self.cal is not None and self.codec != "identity" and self.cal.has(fused_op):
            return self.cal.op_time(fused_op, pages * self.hot, pages)
        if self.cal is not None and self.codec == "identity" and self.cal.has(plain_op):
            return self.cal.op_time(plain_op, pages * self.cold, 1)
        t_link = link.duration(pages * self.cold)
        t_codec = link.overhead + codec_time(self.codec, pages * self.hot, pages * self.cold, self.hbm)
        return max(t_link, t_codec)

    def d2h_time(self, pages: int) -> float:
        """Seconds to encode ``pages`` and copy them to host (encode fused with the copy).
        Memoised per page count (a pure function of it; batches have few distinct sizes)."""
        t = self._d2h_memo.get(pages)
        if t is None:
            t = self._d2h_memo[pages] = self._copy_time(pages, self.d2h,
                                                        f"{self.codec}_encode_d2h_fused", "d2h")
        return t

    def h2d_time(self, pages: int) -> float:
        """Seconds to copy ``pages`` to the GPU and decode them (decode fused with the copy).
        Memoised per page count, as :meth:`d2h_time`."""
        t = self._h2d_memo.get(pages)
        if t is None:
            t = self._h2d_memo[pages] = self._copy_time(pages, self.h2d,
                                                        f"{self.codec}_h2d_decode_fused", "h2d")
        return t

    def read_time(self, level: int, pages: int) -> float:
        """Seconds to read ``pages`` encoded pages out of level ``level`` (>= 2) into the level
        above it (one I/O per batch)."""
        return self.serve[level - 1].duration(pages * self.cold)

    def estimate_load_s(self, counts) -> float:
        """Unqueued estimate of onboarding ``counts[k - 1]`` pages held by level ``k`` (level 1
        first): each deeper level's pages, and those staged through it from below, read up one
        level at a time, deepest first, then all of them copied to the GPU."""
        t = 0.0
        below = 0
        for lv in range(len(counts), 1, -1):
            below += counts[lv - 1]
            for lo in range(0, below, self.batch):
                t += self.read_time(lv, min(self.batch, below - lo))
        n = below + counts[0]
        for lo in range(0, n, self.batch):
            t += self.h2d_time(min(self.batch, n - lo))
        return t

    # ------------------------------------------------------------------ lookup
    def where(self, key: int) -> int:
        """The code of the fastest level holding the page (1 .. N), or -1 if none does."""
        for lv, st in enumerate(self.stores, 1):
            if key in st:
                return lv
        return -1

    def touch(self, level_keys) -> None:
        """Refresh hit pages in their stores, each store's pages deepest block first (shallow
        blocks end most recent).

        ``level_keys``: per level (level 1 first), the hit's pages it holds, in block order
        (int64 arrays)."""
        for st, k in zip(self.stores, level_keys):
            if len(k):
                st.touch_many(k[::-1])

    def locate(self, pool, keys: np.ndarray, stop: bool = False):
        """Where each of ``keys`` (int64 array of block hashes) is served from: ``(blk, code)``,
        ``blk`` the GPU block of ``pool`` (:class:`sim.block_pool.BlockPool`) caching it or -1
        (int64), ``code`` GPU, a level's code (1 .. N: the fastest level holding it), REMOTE
        (held by the cluster's shared store only) or -1 where none does (int8). With ``stop`` the arrays
        end before the first key held nowhere (the walk of a prefix hit)."""
        blk, code = self._locate_local(pool, keys, stop)
        st = self.store
        if st is None:
            return blk, code
        q = np.ascontiguousarray(keys, dtype=np.int64)
        if not stop:
            miss = np.flatnonzero(code < 0)
            if len(miss):
                code[miss[st.store.contains_many(q[miss])]] = REMOTE
            return blk, code
        m = len(blk)
        if m == len(q) or not st.store.contains_many(q[m:m + 1])[0]:
            return blk, code
        rest_b, rest_c = self._locate_local(pool, q[m:], False)
        miss = np.flatnonzero(rest_c < 0)
        rest_c[miss[st.store.contains_many(q[m:][miss])]] = REMOTE
        bad = rest_c < 0
        if bad.any():
            k = int(np.argmax(bad))
            rest_b, rest_c = rest_b[:k], rest_c[:k]
        return np.concatenate([blk, rest_b]), np.concatenate([code, rest_c])

    def _locate_local(self, pool, keys: np.ndarray, stop: bool):
        """:meth:`locate` over the GPU and the chain's levels only. One compiled pass when the
        prefix index is a :class:`PrefixTable` and the stores are :class:`LRUStore` (the
        defaults), else numpy lookups giving the same arrays."""
        q = np.ascontiguousarray(keys, dtype=np.int64)
        idx = pool.index
        if self._compiled and isinstance(idx, PrefixTable):
            blk = np.empty(len(q), dtype=np.int64)
            code = np.empty(len(q), dtype=np.int8)
            st = self.stores
            h = st[0]
            d2 = st[1] if len(st) > 1 else h  # (slots past the chain's levels: not read)
            d3 = st[2] if len(st) > 2 else h
            d4 = st[3] if len(st) > 3 else h
            m = locate_pages(idx.tab, idx.mask, idx.shift, len(st), h._tab, h._mask, h._shift,
                             d2._tab, d2._mask, d2._shift, d3._tab, d3._mask, d3._shift,
                             d4._tab, d4._mask, d4._shift, q, stop, blk, code)
            return blk[:m], code[:m]
        blk = pool.cached_blocks(q)
        code = np.where(blk >= 0, GPU, -1).astype(np.int8)
        for lv, st in enumerate(self.stores, 1):
            rest = np.flatnonzero(code < 0)
            if not len(rest):
                break
            code[rest[st.contains_many(q[rest])]] = lv
        if stop:
            miss = code < 0
            if miss.any():
                m = int(np.argmax(miss))
                return blk[:m], code[:m]
        return blk, code

    # ------------------------------------------------------------------ offload
    def write_back(self, keys) -> float:
        """write_back: issue the D2H copies of the evicted cached blocks' pages (``keys``: int64
        array, in eviction order) now, those neither on the host nor in flight, in batches;
        returns the time (s) the last of them lands (the clock when none was needed). Their GPU
        blocks must not be overwritten before then: SGLang HiCache's write_back eviction
        (``HiRadixCache.evict``, ``write_policy == "write_back"``) blocks until these writes
        complete before it frees the device memory, so the engine holds the step (and any
        onboarding into the reused blocks) until this time."""
        self._queue(keys)
        if not self.pending:
            return self.now()
        self._issue_offloads()
        return self.d2h.free_at

    def _issue_offloads(self) -> None:
        """Issue the queued offloads now, in batches of ``transfer_batch_pages``."""
        p = joined(self.pending)
        self.pending = []
        for lo in range(0, len(p), self.batch):
            self._offload(p[lo:lo + self.batch])

    def on_gpu_cached(self, keys) -> None:
        """write_through: blocks are copied down as soon as they are full (registered;
        ``keys``: an int64 array or a list, in registration order). With a shared store they
        are put there too (:meth:`sim.kv_store.StoreLink.put`, deepest first)."""
        if self.write_policy == "write_through":
            self._queue(keys[::-1])
        if self.store is not None:
            self.store.put(np.asarray(keys, dtype=np.int64)[::-1])

    def on_gpu_hit(self, keys) -> None:
        """write_through_selective: a block is copied down once it has been hit N times
        (``keys``: the hit's GPU blocks' hashes, an int64 array or a list)."""
        if self.write_policy != "write_through_selective":
            return
        hc = self.hit_count
        ready = []
        for k in np.asarray(keys, dtype=np.int64).tolist():
            c = hc.get(k, 0) + 1
            hc[k] = c
            if c == self.selective_min_hits:
                ready.append(k)
        if ready:
            self._queue(ready[::-1])

    def _queue(self, keys) -> None:
        """Queue the pages among ``keys`` (int64 array or list) that are neither on the host
        nor already queued or being copied, each once, in order (none without a host or disk
        tier)."""
        q = np.asarray(keys, dtype=np.int64)
        if not len(q) or not self.local:
            return
        host, inflight = self.host, self.inflight
        if isinstance(host, LRUStore):  # one compiled pass
            inflight.reserve(len(q))
            out = np.empty(len(q), dtype=np.int64)
            m = queue_absent(host._tab, host._mask, host._shift, inflight._tab, inflight._mask,
                              inflight._shift, q, out)
            inflight.count += m
            if m:
                self.pending.append(out[:m])
            return
        new = host.not_held(q)
        if len(new):
            new = new[inflight.add_many(new)]  # those not in flight yet, each once
            if len(new):
                self.pending.append(new)

    def flush(self) -> None:
        """Issue queued offloads as batched D2H transfers (called at the end of each step), and
        the queued puts to a shared store."""
        if self.store is not None:
            self.store.flush()
        if self.pending:
            self._issue_offloads()
        for lv in range(2, len(self.stores) + 1):
            if self.pending_demote[lv - 1]:
                self._issue_demotions(lv)

    def _issue_demotions(self, level: int) -> None:
        """Issue the queued demotions into level ``level`` (>= 2) now, in batches."""
        d = joined(self.pending_demote[level - 1])
        self.pending_demote[level - 1] = []
        for lo in range(0, len(d), self.batch):
            self._demote(level, d[lo:lo + self.batch])

    def _record(self, start, direction, tier, pages, dur, queued):
        self.records.append(start, direction, tier, pages, pages * self.cold, dur, start - queued)

    def at(self, end: float, fn, *args) -> None:
        """Call ``fn(*args)`` when the clock reaches exactly ``end`` (>= now), through the
        timeouts of :func:`sim.clock.exact_delays` (one, or two when ``now + (end - now)``
        misses ``end``); while a tier stretch runs its own landings, on its agenda
        (:class:`sim.stretches.tiers.Agenda`) instead."""
        if self.agenda is not None:
            self.agenda.push(end, fn, args)
            return
        env = self.env
        now = env.now
        d = end - now
        if now + d == end:  # (exact_delays's first case, inline: a landing per batch)
            env.timeout(d).callbacks.append(lambda _e: fn(*args))
        else:
            env.timeout(exact_delays(now, end)[0]).callbacks.append(
                lambda _e: self.at(end, fn, *args))

    def _offload(self, keys) -> None:
        """Issue one D2H batch now: it queues on the link and lands in the host store at its
        end (:meth:`_offloaded`)."""
        now = self.now()
        dur = self.d2h_time(len(keys))
        start, end = self.d2h.reserve(now, dur)
        self.at(end, self._offloaded, keys, start, dur, now)

    def _offloaded(self, keys, start, dur, queued) -> None:
        sp = self.specs[0]
        self._record(start, sp.fill.name, sp.name, len(keys), dur, queued)
        self.bytes_offloaded[sp.name] += len(keys) * self.cold
        self.inflight.discard_many(keys)
        self._insert(1, keys)
        self.flush()

    def _insert(self, level: int, keys) -> None:
        """Insert pages (int64 array or list) into level ``level``'s store; its evictions not
        held by the level below (if any) are queued for demotion there."""
        keys = np.asarray(keys, dtype=np.int64)
        if not len(keys):
            return
        ev = self.stores[level - 1].insert_array(keys)
        self.change_log.append(keys)
        if len(ev):
            self.change_log.append(ev)
            if level < len(self.stores):
                d = self.stores[level].not_held(ev)
                if len(d):
                    self.pending_demote[level].append(d)

    def _demote(self, level: int, keys) -> None:
        """Issue one batch into level ``level`` (>= 2) from the level above now (arithmetic
        queue, as :meth:`_offload`)."""
        now = self.now()
        link = self.fill[level - 1]
        dur = link.duration(len(keys) * self.cold)
        start, end = link.reserve(now, dur)
        self.at(end, self._demoted, level, keys, start, dur, now)

    def _demoted(self, level, keys, start, dur, queued) -> None:
        sp = self.specs[level - 1]
        self._record(start, sp.fill.name, sp.name, len(keys), dur, queued)
        self.bytes_offloaded[sp.name] += len(keys) * self.cold
        self._insert(level, keys)
        if level < len(self.stores) and self.pending_demote[level]:
            self._issue_demotions(level + 1)  # (this landing's evictions, one level down)

    # ------------------------------------------------------------------ onboarding
    def _copy_batches(self, keys: np.ndarray, link: Link, duration, direction: str, tier: str,
                      after=None):
        """SimPy process: move ``keys`` over ``link`` in batches of ``transfer_batch_pages``,
        each batch queued on the link (:meth:`Link.reserve`) for ``duration(pages)`` seconds, then
        recorded and passed to ``after(batch_keys, lo)`` if given (``lo``: the batch's first
        index in ``keys``)."""
        env = self.env
        for lo in range(0, len(keys), self.batch):
            chunk = keys[lo:lo + self.batch]
            n = len(chunk)
            q = env.now
            dur = duration(n)
            start, end = link.reserve(q, dur)
            for d in exact_delays(q, end):
                yield env.timeout(d)
            self._record(start, direction, tier, n, dur, q)
            if after is not None:
                after(chunk, lo)

    def onboard(self, level_keys, out: dict, remote_keys: np.ndarray | None = None):
        """SimPy process: read the pages of ``level_keys`` (per level, level 1 first: the hit's
        pages it holds, int64 arrays) up the chain, deepest level first: those of level ``k``
        and those staged through it from below are read into level ``k - 1`` (promoted into
        its store batch by batch); then all pages are copied to the GPU in batches. Fills
        ``out`` with ``onboard_<level name>_s`` (time spent reading out of each level,
        queueing included). ``remote_keys`` (a shared store's pages) are fetched at the same
        time over the store link (:meth:`sim.kv_store.StoreLink.fetch`,
        ``out["onboard_remote_s"]``); the process ends when both paths have."""
        env = self.env
        fetch = None
        if remote_keys is not None:
            out["onboard_remote_s"] = 0.0
            if len(remote_keys):
                fetch = env.process(self.store.fetch(remote_keys, out))
        cold = self.cold
        specs = self.specs
        n = len(level_keys)
        below = level_keys[n - 1] if n > 1 else None
        for lv in range(n, 1, -1):
            if lv < n:
                below = np.concatenate([level_keys[lv - 1], below])
            own = len(level_keys[lv - 1])
            sp = specs[lv - 1]
            t0 = env.now

            def promote(chunk, lo, lv=lv, own=own, name=sp.name):  # (into the level above)
                self.bytes_onboarded[name] += (min(lo + len(chunk), own) - min(lo, own)) * cold
                self._insert(lv - 1, chunk)

            yield from self._copy_batches(below, self.serve[lv - 1],
                                          lambda k, lv=lv: self.read_time(lv, k),
                                          sp.serve.name, sp.name, after=promote)
            out[f"onboard_{sp.name}_s"] = env.now - t0
        t1 = env.now
        host = specs[0]
        yield from self._copy_batches(level_keys[0] if below is None else
                                      np.concatenate([level_keys[0], below]), self.h2d,
                                      self.h2d_time, host.serve.name, host.name)
        self.bytes_onboarded[host.name] += len(level_keys[0]) * cold
        self.flush()
        out[f"onboard_{host.name}_s"] = env.now - t1
        for sp in self.all_specs[n:]:  # (levels off: nothing read from them)
            out[f"onboard_{sp.name}_s"] = 0.0
        if fetch is not None:
            yield fetch
