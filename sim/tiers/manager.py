"""The tier manager: offloads (write policies), demotions, onboarding and hit lookups across the
GPU's block pool and the levels below it (:mod:`sim.tiers.spec`), inside one SimPy env.

Write policies: ``write_back`` copies a cached GPU block's page down when the allocator evicts
it, and the block is not overwritten before that copy lands: the engine holds the step that
reuses it (and onboarding copies into it) until then (:meth:`TierManager.write_back`; SGLang
HiCache, ``HiRadixCache.evict`` with ``write_policy="write_back"``, waits for its writes before
freeing device memory); ``write_through`` and ``write_through_selective`` copy blocks that stay
on the GPU, asynchronously. The host's evictions are demoted to the disk; a disk page read back
is promoted into the host. An onboarding request's process waits on its batches' timeouts; an
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
from .spec import DISK, GPU, HOST, REMOTE, tier_specs
from .stores import KeySet, LRUStore, locate_pages, queue_absent

WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")


def joined(parts: list) -> np.ndarray:
    """The int64 arrays ``parts`` end to end (the one array itself when there is one)."""
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class TierManager:
    """Host/disk stores, links, offload (write policy) and onboarding, inside one SimPy env.

    Args:
        env: SimPy environment.
        tiers, codec: config nodes (``sim.config.TiersConfig`` / ``CodecConfig``).
        hot_page_bytes, cold_page_bytes: bytes of one block on the GPU / encoded.
        gpu: GPU card (PCIe defaults); hbm_Bps: HBM bandwidth for codec time.
        calibration: optional ``gpu_validation.calibration_model.Calibration`` whose fitted
            ``{codec}_encode_d2h_fused`` / ``{codec}_h2d_decode_fused`` / ``d2h`` / ``h2d`` ops
            replace the analytic link + codec times.

    Records every batch transfer in ``records`` (time_s, direction, tier, pages, bytes,
    duration_s, queue_s, codec).
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
        self.specs = host, disk = tier_specs(tiers, self.cold, gpu)
        self.host_pages = host.capacity_pages
        self.disk_pages = disk.capacity_pages
        self.host = host.store()
        self.disk = disk.store() if self.disk_pages > 0 else None
        self.h2d = host.serve.build()
        self.d2h = host.fill.build()
        self.disk_read = disk.serve.build()
        self.disk_write = disk.fill.build()
        self.hbm = float(hbm_Bps)
        self.cal = calibration
        self._d2h_memo: dict = {}  # pages -> d2h_time / h2d_time (s)
        self._h2d_memo: dict = {}
        self.inflight = KeySet()  # pages queued or being copied to the host
        self.pending: list[np.ndarray] = []  # pages to offload, in order (int64 arrays)
        self.pending_demote: list[np.ndarray] = []  # host evictions to write to disk
        self.hit_count: dict[int, int] = {}
        self.records = TransferLog(self.codec)
        self.bytes_offloaded = {"host": 0, "disk": 0}
        self.bytes_onboarded = {"host": 0, "disk": 0}
        # keys whose host/disk membership changed (inserted or evicted) since the engine last
        # cleared the list (int64 arrays, none empty): it revalidates its memo of the waiting
        # head's hit walk with it
        self.change_log: list[np.ndarray] = []
        # no host or disk capacity (a replica with a shared store only): nothing is offloaded
        self.local = self.host_pages > 0 or self.disk is not None
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

    def disk_read_time(self, pages: int) -> float:
        """Seconds to read ``pages`` encoded pages from disk (one I/O per batch)."""
        return self.disk_read.duration(pages * self.cold)

    def estimate_load_s(self, n_host: int, n_disk: int) -> float:
        """Unqueued estimate of onboarding ``n_host`` host pages and ``n_disk`` disk pages."""
        t = 0.0
        for lo in range(0, n_disk, self.batch):
            t += self.disk_read_time(min(self.batch, n_disk - lo))
        n = n_host + n_disk
        for lo in range(0, n, self.batch):
            t += self.h2d_time(min(self.batch, n - lo))
        return t

    # ------------------------------------------------------------------ lookup
    def where(self, key: int) -> int:
        """HOST, DISK, or -1 if neither tier holds the page."""
        if key in self.host:
            return HOST
        if self.disk is not None and key in self.disk:
            return DISK
        return -1

    def touch(self, host_keys: np.ndarray, disk_keys: np.ndarray) -> None:
        """Refresh hit pages in their stores, deepest first (shallow blocks end most recent).

        ``host_keys`` / ``disk_keys``: the hit's pages held by each tier, in block order (int64
        arrays)."""
        if len(host_keys):
            self.host.touch_many(host_keys[::-1])
        if len(disk_keys):
            self.disk.touch_many(disk_keys[::-1])

    def locate(self, pool, keys: np.ndarray, stop: bool = False):
        """Where each of ``keys`` (int64 array of block hashes) is served from: ``(blk, code)``,
        ``blk`` the GPU block of ``pool`` (:class:`sim.block_pool.BlockPool`) caching it or -1
        (int64), ``code`` GPU, HOST, DISK, REMOTE (the fastest tier holding it; REMOTE: held by
        the cluster's shared store only) or -1 where none does (int8). With ``stop`` the arrays
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
        """:meth:`locate` over the GPU, host and disk only. One compiled pass when the prefix
        index is a :class:`PrefixTable` and the stores are :class:`LRUStore` (the defaults),
        else numpy lookups giving the same arrays."""
        q = np.ascontiguousarray(keys, dtype=np.int64)
        disk = self.disk
        idx = pool.index
        if isinstance(idx, PrefixTable) and isinstance(self.host, LRUStore) and \
                (disk is None or isinstance(disk, LRUStore)):
            blk = np.empty(len(q), dtype=np.int64)
            code = np.empty(len(q), dtype=np.int8)
            d = disk if disk is not None else self.host
            m = locate_pages(idx.tab, idx.mask, idx.shift,
                              self.host._tab, self.host._mask, self.host._shift, d._tab, d._mask, d._shift, disk is not None, q, stop, blk, code)
            return blk[:m], code[:m]
        blk = pool.cached_blocks(q)
        in_host = self.host.contains_many(q)
        code = np.where(blk >= 0, GPU, np.where(in_host, HOST, -1)).astype(np.int8)
        rest = np.flatnonzero(code < 0)
        if disk is not None and len(rest):
            code[rest[disk.contains_many(q[rest])]] = DISK
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
        if self.pending_demote:
            d = joined(self.pending_demote)
            self.pending_demote = []
            for lo in range(0, len(d), self.batch):
                self._demote(d[lo:lo + self.batch])

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
        self._record(start, "d2h", "host", len(keys), dur, queued)
        self.bytes_offloaded["host"] += len(keys) * self.cold
        self.inflight.discard_many(keys)
        self._insert_host(keys)
        self.flush()

    def _insert_host(self, keys) -> None:
        """Insert pages (int64 array or list) into the host store; its evictions not on disk
        are queued for writing there."""
        keys = np.asarray(keys, dtype=np.int64)
        if not len(keys):
            return
        ev = self.host.insert_array(keys)
        self.change_log.append(keys)
        if len(ev):
            self.change_log.append(ev)
            if self.disk is not None:
                d = self.disk.not_held(ev)
                if len(d):
                    self.pending_demote.append(d)

    def _demote(self, keys) -> None:
        """Issue one host-to-disk batch now (arithmetic queue, as :meth:`_offload`)."""
        now = self.now()
        dur = self.disk_write.duration(len(keys) * self.cold)
        start, end = self.disk_write.reserve(now, dur)
        self.at(end, self._demoted, keys, start, dur, now)

    def _demoted(self, keys, start, dur, queued) -> None:
        self._record(start, "host_to_disk", "disk", len(keys), dur, queued)
        self.bytes_offloaded["disk"] += len(keys) * self.cold
        self.change_log.append(keys)
        ev = self.disk.insert_array(keys)
        if len(ev):
            self.change_log.append(ev)

    # ------------------------------------------------------------------ onboarding
    def _copy_batches(self, keys: np.ndarray, link: Link, duration, direction: str, tier: str,
                      after=None):
        """SimPy process: move ``keys`` over ``link`` in batches of ``transfer_batch_pages``,
        each batch queued on the link (:meth:`Link.reserve`) for ``duration(pages)`` seconds, then
        recorded and passed to ``after(batch_keys)`` if given."""
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
                after(chunk)

    def onboard(self, host_keys: np.ndarray, disk_keys: np.ndarray, out: dict,
                remote_keys: np.ndarray | None = None):
        """SimPy process: read ``disk_keys`` from disk (promoting them into the host store), then
        copy all pages to the GPU in batches. Fills ``out`` with onboard_host_s and
        onboard_disk_s (time spent per tier, queueing included). ``remote_keys`` (a shared
        store's pages) are fetched at the same time over the store link
        (:meth:`sim.kv_store.StoreLink.fetch`, ``out["onboard_remote_s"]``); the process ends
        when both paths have."""
        env = self.env
        t0 = env.now
        fetch = None
        if remote_keys is not None:
            out["onboard_remote_s"] = 0.0
            if len(remote_keys):
                fetch = env.process(self.store.fetch(remote_keys, out))
        def promote(chunk):  # read pages land in the host store batch by batch
            self.bytes_onboarded["disk"] += len(chunk) * self.cold
            self._insert_host(chunk)

        yield from self._copy_batches(disk_keys, self.disk_read, self.disk_read_time,
                                      "disk_to_host", "disk", after=promote)
        t1 = env.now
        yield from self._copy_batches(np.concatenate([host_keys, disk_keys]), self.h2d, self.h2d_time, "h2d", "host")
        self.bytes_onboarded["host"] += len(host_keys) * self.cold
        self.flush()
        out["onboard_disk_s"] = t1 - t0
        out["onboard_host_s"] = env.now - t1
        if fetch is not None:
            yield fetch
