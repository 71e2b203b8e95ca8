"""GPU block pool with vLLM v1 prefix-caching semantics, in numpy arrays worked by compiled loops.

Semantics (vLLM v1 ``BlockPool`` / ``KVCacheManager``, vllm/v1/core/block_pool.py):

* A block is ``block_size`` token slots spanning every layer (one block table per request).
* Blocks are ref-counted. A block with ref count 0 sits in the *free queue* in LRU order; the pool
  allocates from the head of the queue. A freed request's blocks (its table reversed, last block
  first) that hold a hash (or registered a key another block holds, below) are appended to the
  tail, so the deepest blocks of a prefix are evicted first; those that hold none (the partial
  last block, every block with caching off, blocks a compression round changed) are put at the
  head, in that order, so they are reused first (vLLM ``BlockPool.free_blocks``,
  vllm/v1/core/block_pool.py: unhashed blocks ``prepend_n``, hashed ``append_n``).
* Only full blocks are cached. A cached block keeps its hash while it sits in the free queue and
  can still serve a prefix hit; its hash is dropped only when the block is reallocated (evicted).
* A prefix hit is the longest run of cached blocks from the request's first block; the first miss
  ends it. Hit blocks are *touched*: removed from the free queue if free, ref count + 1.
* When two requests compute the same block concurrently, the first registered block keeps the
  hash and serves hits; the duplicate is marked registered (``dup``), so it is freed to the tail
  as a hashed block is, but serves no hit (vLLM keeps both under one hash, and the second serves
  hits once the first is evicted: ``BlockHashToBlockMap``; kvsim does not).

Implementation: the free queue is an append-only array with lazy deletion (an entry is valid when
its sequence number equals the block's ``free_seq``), so allocation, freeing and touching are
compiled loops over the blocks they move (numba, :mod:`sim.jit`), amortised O(1) per block;
nothing scans the whole pool per step. The prefix index (key -> block) is one of the
interchangeable backends of :mod:`sim.hash_tables`, which give the same answers:
:class:`~sim.hash_tables.PrefixTable` (the default), holding live entries only (a block losing
its hash, evicted by an allocation or uncached, loses its entry in the same compiled loop), and
:class:`~sim.hash_tables.DictIndex`, lazily deleted (its stale entries are dropped by
rebuilding it from ``block_hash`` once they outnumber the pool, amortised O(1) per
registration).
"""

from __future__ import annotations

import numpy as np

from . import hash_tables
from .errors import PoolExhausted
from .hash_tables import (NO_HASH, PREFIX_SLOTS_PER_BLOCK, DictIndex, KeyTable, PrefixTable, _home,
                          _pair_delete, _pair_discard, _pair_probe, _prefix_register, _prefix_walk)
from .jit import PREFETCH_AHEAD, kernel, prefetch

# the prefix index's types and kernels are importable from here too (the pool's users: routers, tiers)
__all__ = ["BlockPool", "DictIndex", "KeyTable", "NO_HASH", "PrefixTable", "pool_host_bytes", "_home",
           "_pair_delete", "_pair_discard", "_pair_probe", "_prefix_walk"]

D = PREFETCH_AHEAD  # (kernels fetch element i + D's lines while on element i)


def pool_host_bytes(num_blocks: int) -> int:
    """Host memory (bytes) a :class:`BlockPool` of ``num_blocks`` blocks takes once its prefix
    index has grown to the pool's size: ref counts (4 B a block), block hashes and free-queue
    positions (8 B each), the free queue (block and sequence arrays of ``max(2 n, 1024)`` int64
    entries) and the prefix table (:class:`PrefixTable`: ``PREFIX_SLOTS_PER_BLOCK x n`` slots of
    16 B, rounded up to a power of two)."""
    n = int(num_blocks)
    slots = 1 << max(10, int(PREFIX_SLOTS_PER_BLOCK * n - 1).bit_length())
    return n * (4 + 8 + 8) + 2 * max(2 * n, 1024) * 8 + 16 * slots


@kernel("i8(i4[:], i8[:], i8)")
def _shared_lead(ref_cnt, table, n):  # pragma: no cover (compiled)
    """:meth:`BlockPool.shared_lead`'s count: leading entries of ``table[:n]`` whose
    ``ref_cnt`` is above 1."""
    for i in range(n):
        if ref_cnt[table[i]] <= 1:
            return i
    return n


@kernel("i8(i4[:], i8[:])")
def _count_free(ref_cnt, blocks):  # pragma: no cover (compiled)
    """Number of ``blocks`` with ref count 0."""
    c = 0
    for b in blocks:
        if ref_cnt[b] == 0:
            c += 1
    return c


@kernel("void(i4[:], i8[:], i8[:], i8)")
def _prefetch_block(ref_cnt, free_seq, block_hash, b):  # pragma: no cover (compiled)
    """Fetch block ``b``'s entries of the pool's per-block arrays (:func:`sim.jit.prefetch`)."""
    prefetch(ref_cnt, b)
    prefetch(free_seq, b)
    prefetch(block_hash, b)


@kernel("UniTuple(i8, 2)(i4[:], i8[:], i8[:], i8[:])")
def _touch(ref_cnt, free_seq, block_hash, blocks):  # pragma: no cover (compiled)
    """:meth:`BlockPool.touch` on the arrays: returns (blocks taken off the free queue, of them
    holding a hash)."""
    n_free = 0
    n_cached = 0
    nb = blocks.shape[0]
    for j in range(nb):
        if j + D < nb:
            _prefetch_block(ref_cnt, free_seq, block_hash, blocks[j + D])
        b = blocks[j]
        if ref_cnt[b] == 0:
            free_seq[b] = -1
            n_free += 1
            if block_hash[b] != NO_HASH:
                n_cached += 1
        ref_cnt[b] += 1
    return n_free, n_cached


@kernel("UniTuple(i8, 3)(i8[:], i8[:], i8[:], i4[:], i8[:], b1[:], i8, i8[:], b1[:], i8[:], i8[:], "
        "i8, i8)", depends=(hash_tables,))
def _take_free(q, qseq, free_seq, ref_cnt, block_hash, dup, head, out, cached, ev, tab, mask,
               shift):  # pragma: no cover (compiled)
    """Take the first ``len(out)`` valid free-queue entries from ``head`` (the caller checked
    that many are free): ids into ``out``, ref count 1, their duplicate marks and hashes
    cleared (``cached`` marks
    those that held one, ``ev[:m]`` gets the hashes in order) and, when the pair table ``tab``
    of a :class:`PrefixTable` is given (not empty), their entries deleted from it. Returns
    (new head, m, entries deleted)."""
    n = out.shape[0]
    i = 0
    m = 0
    nq = q.shape[0]
    nb = free_seq.shape[0]
    while i < n:
        if head + D < nq:
            a = q[head + D]
            if 0 <= a < nb:  # (past the tail the queue array holds unset entries)
                _prefetch_block(ref_cnt, free_seq, block_hash, a)
        b = q[head]
        if free_seq[b] == qseq[head]:
            out[i] = b
            free_seq[b] = -1
            ref_cnt[b] = 1
            dup[b] = False
            h = block_hash[b]
            cached[i] = h != NO_HASH
            if h != NO_HASH:
                ev[m] = h
                m += 1
                block_hash[b] = NO_HASH
            i += 1
        head += 1
    d = 0
    if tab.shape[0]:
        for j in range(m):
            if j + D < m:
                prefetch(tab, 2 * _home(ev[j + D], shift))
            s = _pair_probe(tab, mask, shift, ev[j])
            if tab[2 * s] == ev[j]:
                _pair_delete(tab, mask, shift, s)
                d += 1
    return head, m, d


@kernel("UniTuple(i8, 5)(i8[:], i8[:], i8[:], i4[:], i8[:], b1[:], i8, i8[:], b1[:], i8[:], i8[:], "
        "i8, i8, i8[:], i8[:], i8[:])", depends=(hash_tables,))
def _take_and_register(q, qseq, free_seq, ref_cnt, block_hash, dup, head, out, cached, ev, tab,
                       mask, shift, rb, rk, sel):  # pragma: no cover (compiled)
    """:func:`_take_free` into ``out``, then, when ``rb`` is not empty, :func:`_prefix_register`
    of the blocks ``rb`` under the keys ``rk`` in the pair table ``tab`` (``rb`` may view the
    same block table as ``out``: it is read after the allocation). Returns (new head, hashes
    evicted, entries deleted, entries added - deleted by the registration, keys entered)."""
    head, m, d = _take_free(q, qseq, free_seq, ref_cnt, block_hash, dup, head, out, cached, ev,
                            tab, mask, shift)
    added = 0
    nreg = 0
    if rb.shape[0]:
        added, nreg = _prefix_register(tab, mask, shift, block_hash, rk, rb, sel)
    return head, m, d, added, nreg


@kernel("void(i8[:], i8[:], i8[:], i8, i8[:])")
def _peek_free(q, qseq, free_seq, head, out):  # pragma: no cover (compiled)
    """The first ``len(out)`` valid free-queue entries from ``head`` into ``out``."""
    i = 0
    while i < out.shape[0]:
        b = q[head]
        if free_seq[b] == qseq[head]:
            out[i] = b
            i += 1
        head += 1


@kernel("UniTuple(i8, 4)(i4[:], i8[:], i8[:], b1[:], i8[:], i8[:], i8, i8, i8, i8[:])")
def _free(ref_cnt, free_seq, block_hash, dup, q, qseq, head, tail, next_seq,
          blocks):  # pragma: no cover (compiled)
    """:meth:`BlockPool.free` on the arrays (the queue has room for every block at both ends:
    ``head >= len(blocks)``). Blocks reaching ref count 0 holding a hash or marked ``dup`` join
    the tail in the given order; the others go before the head, in the given order (the first
    of them becomes the head). Returns (blocks released, of them holding a hash, -1, new head)
    or, when a block has no reference left to drop (a block listed twice drops two),
    (0, 0, that block, head) with nothing changed."""
    nb = blocks.shape[0]
    for j in range(nb):
        if j + D < nb:
            _prefetch_block(ref_cnt, free_seq, block_hash, blocks[j + D])
        ref_cnt[blocks[j]] -= 1
        if ref_cnt[blocks[j]] < 0:
            for i in range(j + 1):  # undo
                ref_cnt[blocks[i]] += 1
            return 0, 0, blocks[j], head
    k = 0
    n_cached = 0
    n_front = 0
    for j in range(nb):  # (count the head's entries first: they keep the given order)
        b = blocks[j]
        if ref_cnt[b] == 0 and free_seq[b] == -1 and block_hash[b] == NO_HASH and not dup[b]:
            free_seq[b] = -2  # (marked: a block listed twice joins once)
            n_front += 1
    f = head - n_front
    a = 0
    for j in range(nb):
        b = blocks[j]
        if ref_cnt[b] != 0:
            continue
        if free_seq[b] == -2:
            s = next_seq + k
            free_seq[b] = s
            q[f] = b
            qseq[f] = s
            f += 1
            k += 1
        elif free_seq[b] == -1:
            s = next_seq + k
            free_seq[b] = s
            q[tail + a] = b
            qseq[tail + a] = s
            a += 1
            k += 1
            if block_hash[b] != NO_HASH:
                n_cached += 1
    return k, n_cached, -1, head - n_front


# DictIndex (lazily deleted): its nominal size per pool block and the rebuild point (entries >
# size / LOAD_DIV, about 3 x num_blocks registrations after the last rebuild, which drops the
# stale entries)
INDEX_SLOTS_PER_BLOCK = 16
INDEX_LOAD_DIV = 4
# the dict index starts sized for at most this many blocks and doubles at its rebuilds up to the
# pool's size (its registrations grow it)
INDEX_START_BLOCKS = 1 << 16
INDEX_BACKENDS = {"dict": DictIndex, "table": PrefixTable}


class BlockPool:
    """Ref-counted GPU block pool with an LRU free queue and a prefix-cache index.

    Args:
        num_blocks: number of physical blocks (> 0).
        enable_caching: register full blocks in the prefix index (vLLM ``enable_prefix_caching``).
        index: prefix-index backend, ``"dict"`` (:class:`DictIndex`) or ``"table"``
            (:class:`PrefixTable`); same results, different speed (see the module docstring).

    Block ids are ``0..num_blocks-1``. All methods take and return ``np.ndarray`` of int64 ids.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True, index: str = "dict"):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks={num_blocks}; expected > 0")
        if index not in INDEX_BACKENDS:
            raise ValueError(f"index={index!r}; expected one of {list(INDEX_BACKENDS)}")
        self._index_cls = INDEX_BACKENDS[index]
        self._table = index == "table"
        n = int(num_blocks)
        self.num_blocks = n
        self.enable_caching = bool(enable_caching)
        self.ref_cnt = np.zeros(n, dtype=np.int32)
        self.block_hash = np.full(n, NO_HASH, dtype=np.int64)
        # registered under a key another block holds (module docstring): queued as hashed
        self.dup = np.zeros(n, dtype=bool)
        self.free_seq = np.arange(n, dtype=np.int64)  # -1 when not in the free queue
        cap = max(2 * n, 1024)
        self._q = np.empty(cap, dtype=np.int64)
        self._qseq = np.empty(cap, dtype=np.int64)
        self._q[:n] = np.arange(n)
        self._qseq[:n] = np.arange(n)
        self._head = 0
        self._tail = n
        self._next_seq = n
        self.num_free = n
        self.num_cached_free = 0
        # the most blocks held at once (ref count > 0) since the pool was made: the physical peak,
        # counted as blocks are taken, so a request that finishes in the step that allocated
        # its blocks counts too
        self.peak_used = 0
        # key -> block (see the module docstring: the table holds live entries only, the dict's
        # are live only while block_hash[block] == key)
        if self._table:
            self.index = PrefixTable(n)
            self._tab, self._mask, self._shift = self.index.tab, self.index.mask, self.index.shift
        else:
            self.index = DictIndex(INDEX_SLOTS_PER_BLOCK * min(n, INDEX_START_BLOCKS))
            # (allocate: no table to delete from)
            self._tab, self._mask, self._shift = np.empty(0, dtype=np.int64), 0, 0
        # allocate_into's scratch: evicted hashes, cached flags, registered key positions
        self._ev = np.empty(256, dtype=np.int64)
        self._cf = np.empty(256, dtype=bool)
        self._sel = np.empty(256, dtype=np.int64)
        self.evicted_cached_blocks = 0
        self.uncached_blocks = 0  # hashes dropped by uncache (compression rounds)
        # when lists, allocate() appends the keys it evicts and cache_blocks() those it newly
        # registers, as int64 arrays, none empty (the tier manager's write policies read them)
        self.evict_log: list[np.ndarray] | None = None
        self.cached_log: list[np.ndarray] | None = None
        # when a list: every key registered, evicted or uncached (any change of the index), as
        # int64 arrays, none empty
        self.change_log: list[np.ndarray] | None = None
        # when a list: the prefix index's changes in order, as ``(+1, keys)`` for keys newly
        # registered and ``(-1, keys)`` for keys an allocation evicted or uncache dropped (int64
        # arrays, none empty): a replica's KV events (vLLM's BlockStored / BlockRemoved) that a
        # cluster's router reads (sim.cluster)
        self.event_log: list[tuple[int, np.ndarray]] | None = None

    # ------------------------------------------------------------------ counts
    @property
    def num_used(self) -> int:
        """Blocks with ref count > 0 (held by at least one block table)."""
        return self.num_blocks - self.num_free

    # ------------------------------------------------------------------ prefix index
    def cached_blocks(self, keys: np.ndarray) -> np.ndarray:
        """Block id holding each of ``keys`` (int64 array) in the prefix index, -1 where none
        does. Returns int64, shape ``(len(keys),)``."""
        vals = self.index.get_many(keys)
        found = np.flatnonzero(vals >= 0)
        if len(found):
            stale = found[self.block_hash[vals[found]] != keys[found]]
            vals[stale] = -1
        return vals

    def lookup_prefix(self, keys: np.ndarray, max_blocks: int) -> np.ndarray:
        """Longest run of cached blocks matching ``keys[0], keys[1], ...`` (at most ``max_blocks``).

        Returns the block ids (int64 array, possibly empty). Does not touch them.
        """
        if not self.enable_caching or max_blocks <= 0:
            return np.empty(0, dtype=np.int64)
        limit = min(int(max_blocks), len(keys))
        if limit <= 0:
            return np.empty(0, dtype=np.int64)
        idx = self.index
        if self._table:  # one compiled walk to the first miss
            out = np.empty(limit, dtype=np.int64)
            m = _prefix_walk(idx.tab, idx.mask, idx.shift,
                             np.ascontiguousarray(keys, dtype=np.int64), limit, out)
            return out[:m]
        k0 = int(keys[0])
        b0 = idx.get1(k0)
        if b0 < 0 or int(self.block_hash[b0]) != k0:  # no hit (a scalar probe, not a chunk)
            return np.empty(0, dtype=np.int64)
        parts: list[np.ndarray] = []
        start = 0
        chunk = 256
        while start < limit:
            stop = min(start + chunk, limit)
            vals = self.cached_blocks(keys[start:stop])
            miss = vals < 0
            if miss.any():
                parts.append(vals[:int(np.argmax(miss))])
                break
            parts.append(vals)
            start = stop
            chunk = min(chunk * 4, 1 << 16)
        if not parts:
            return np.empty(0, dtype=np.int64)
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def cache_blocks(self, blocks: np.ndarray, keys: np.ndarray) -> None:
        """Register full ``blocks`` under ``keys`` (int64 arrays of one length, keys distinct) in
        the prefix index. A key already held by a block keeps its first block (see module
        docstring). The keys newly registered go to the cached and change logs when kept."""
        if not self.enable_caching or len(blocks) == 0:
            return
        idx = self.index
        if self._table:  # one compiled pass (the same as the lines below)
            keys = np.asarray(keys, dtype=np.int64)
            sel = np.empty(len(keys), dtype=np.int64)
            blocks = np.asarray(blocks, dtype=np.int64)
            added, m = _prefix_register(idx.tab, idx.mask, idx.shift, self.block_hash, keys,
                                        blocks, sel)
            idx.count += added
            if m < len(keys):
                self._mark_dups(blocks, keys)
            if m and (self.cached_log is not None or self.change_log is not None
                      or self.event_log is not None):
                self._note_cached(keys[sel[:m]])
            return
        if idx.count + len(keys) > idx.size // INDEX_LOAD_DIV:
            self._rebuild_index(len(keys))
            idx = self.index
        new = idx.put_absent(keys, blocks, self.block_hash)
        if not new.all():
            self._mark_dups(blocks[~new], keys[~new])
        if not new.any():
            return
        if new.all():
            nb, nk = blocks, keys
        else:
            nb, nk = blocks[new], keys[new]
        self.block_hash[nb] = nk
        if self.cached_log is not None or self.change_log is not None or self.event_log is not None:
            self._note_cached(nk.copy() if nk is keys else nk)  # (keys may be a reused view)

    def _mark_dups(self, blocks: np.ndarray, keys: np.ndarray) -> None:
        """Mark those of ``blocks`` just registered under ``keys`` whose key another block
        holds (duplicates: see the module docstring)."""
        d = self.block_hash[blocks] != keys
        self.dup[blocks[d]] = True

    def _rebuild_index(self, extra: int = 0) -> None:
        """Drop a :class:`DictIndex`'s stale entries: rebuild it from ``block_hash``
        (O(num_blocks), run once its entries pass ``1 / INDEX_LOAD_DIV`` of its nominal size).
        The new index is sized for twice the blocks the old one was (at most the pool's, at least
        the blocks holding a hash and the ``extra`` about to register): an index started below
        the pool's size (``INDEX_START_BLOCKS``) reaches it in a few doublings, after which a
        rebuild comes at least ``num_blocks`` registrations after the last, so amortised O(1)
        per registration. (A :class:`PrefixTable` is never rebuilt: it holds no stale entry.)"""
        held = np.flatnonzero(self.block_hash != NO_HASH)
        grown = min(self.num_blocks, 2 * (self.index.size // INDEX_SLOTS_PER_BLOCK))
        t = self._index_cls(INDEX_SLOTS_PER_BLOCK * max(grown, len(held) + extra))
        t.put_absent(self.block_hash[held], held, self.block_hash)  # all new: distinct keys
        self.index = t

    def uncache(self, blocks: np.ndarray) -> None:
        """Drop ``blocks`` (held by a request) from the prefix index: their content changed
        (eviction or compaction), so they must never serve a hit for the uncompressed text."""
        if not self.enable_caching or len(blocks) == 0:
            return
        h = self.block_hash[blocks]
        h = h[h != NO_HASH]
        if len(h):
            self.uncached_blocks += len(h)
            if self.change_log is not None:
                self.change_log.append(h)
            if self.event_log is not None:
                self.event_log.append((-1, h))
            if self._table:
                idx = self.index
                idx.count -= _pair_discard(idx.tab, idx.mask, idx.shift, h)
        self.block_hash[blocks] = NO_HASH  # (a dict index's entries are now stale)
        self.dup[blocks] = False

    def shared_lead(self, table: np.ndarray, n: int) -> int:
        """Leading blocks of the block table ``table[:n]`` held by more than one request
        (reference count > 1: prefix hits), up to the first that is not."""
        if n == 0 or self.ref_cnt[table[0]] <= 1:
            return 0
        return _shared_lead(self.ref_cnt, table, n)

    # ------------------------------------------------------------------ queue ops
    def blocks_needed_for_touch(self, blocks: np.ndarray) -> int:
        """How many of ``blocks`` are currently free (touching them consumes free capacity)."""
        if len(blocks) == 0:
            return 0
        return int(_count_free(self.ref_cnt, blocks))

    def touch(self, blocks: np.ndarray) -> None:
        """Take hit blocks: remove the free ones from the free queue, ref count + 1."""
        if len(blocks) == 0:
            return
        n_free, n_cached = _touch(self.ref_cnt, self.free_seq, self.block_hash, blocks)
        self.num_free -= n_free
        self.num_cached_free -= n_cached
        if self.num_blocks - self.num_free > self.peak_used:
            self.peak_used = self.num_blocks - self.num_free

    def allocate(self, n: int, return_evicted: bool = False):
        """Pop ``n`` blocks from the head of the free queue (LRU), evicting their cached hashes.

        Returns int64 ids with ref count 1 (and, with ``return_evicted``, a bool array marking the
        blocks whose cached hash was evicted). Raises PoolExhausted if fewer than ``n`` are free.
        """
        n = int(n)
        if n <= 0:
            e = np.empty(0, dtype=np.int64)
            return (e, np.empty(0, dtype=bool)) if return_evicted else e
        if n > self.num_free:
            raise PoolExhausted(f"asked for {n} blocks, {self.num_free} free")
        out = np.empty(n, dtype=np.int64)
        cached = np.empty(n, dtype=bool) if return_evicted else None
        self.allocate_into(out, cached=cached)
        return (out, cached) if return_evicted else out

    def allocate_into(self, out: np.ndarray, blocks: np.ndarray | None = None,
                      keys: np.ndarray | None = None, cached: np.ndarray | None = None) -> None:
        """``out[:] = allocate(len(out))``, then ``cache_blocks(blocks, keys)`` when given: a
        request's growth (new blocks, then its blocks that became full registered) in one
        compiled call with the table index, without the arrays two calls make.

        Args:
            out: int64 array (a request's block table slice), filled with the new block ids.
            blocks, keys: int64 arrays of one length (keys distinct), or None; ``blocks`` may
                view the same block table as ``out`` (it is read after the allocation).
            cached: a bool array of ``len(out)`` marking the blocks whose hash was evicted
                (:meth:`allocate`'s ``return_evicted``), or None.

        Raises PoolExhausted if fewer than ``len(out)`` blocks are free (nothing changes)."""
        n = len(out)
        if n > self.num_free:
            raise PoolExhausted(f"asked for {n} blocks, {self.num_free} free")
        nr = 0 if blocks is None or not self.enable_caching else len(blocks)
        if len(self._ev) < max(n, nr):
            k = max(n, nr, 2 * len(self._ev))
            self._ev = np.empty(k, dtype=np.int64)
            self._cf = np.empty(k, dtype=bool)
            self._sel = np.empty(k, dtype=np.int64)
        table = nr and self._table
        rb = blocks if table else self._ev[:0]
        rk = keys if table else rb
        self._head, m, d, added, nreg = _take_and_register(
            self._q, self._qseq, self.free_seq, self.ref_cnt, self.block_hash, self.dup,
            self._head, out, self._cf if cached is None else cached, self._ev, self._tab,
            self._mask, self._shift, rb, rk, self._sel)
        self.num_free -= n
        if self.num_blocks - self.num_free > self.peak_used:
            self.peak_used = self.num_blocks - self.num_free
        if m:
            # their table entries are deleted (a dict index's are now stale: lazy deletion)
            if d:
                self.index.count -= d
            self._note_evicted(m)
        if table:
            self.index.count += added
            if nreg < nr:
                self._mark_dups(blocks, keys)
            if nreg and (self.cached_log is not None or self.change_log is not None
                         or self.event_log is not None):
                self._note_cached(keys[self._sel[:nreg]])
        elif nr:
            self.cache_blocks(blocks, keys)

    def _note_evicted(self, m: int) -> None:
        """Bookkeeping of the ``m`` cached hashes an allocation evicted (the scratch
        ``_ev[:m]``, in allocation order): the tier and memo logs (a copy), the cached-free and
        eviction counts."""
        if self.evict_log is not None or self.change_log is not None or self.event_log is not None:
            keys = self._ev[:m].copy()
            if self.evict_log is not None:
                self.evict_log.append(keys)
            if self.change_log is not None:
                self.change_log.append(keys)
            if self.event_log is not None:
                self.event_log.append((-1, keys))
        self.num_cached_free -= m
        self.evicted_cached_blocks += m

    def _note_cached(self, keys: np.ndarray) -> None:
        """The keys a registration newly entered (int64 array, not a view of the caller's) into
        the cached and change logs, where kept."""
        if self.cached_log is not None:
            self.cached_log.append(keys)
        if self.change_log is not None:
            self.change_log.append(keys)
        if self.event_log is not None:
            self.event_log.append((1, keys))

    def peek_free(self, n: int) -> np.ndarray:
        """The ``n`` blocks :meth:`allocate` would take next, in order, without taking them
        (int64; fewer if fewer are free)."""
        out = np.empty(min(int(n), self.num_free), dtype=np.int64)
        _peek_free(self._q, self._qseq, self.free_seq, self._head, out)
        return out

    def free(self, blocks: np.ndarray) -> None:
        """Drop one reference to each of ``blocks`` (callers pass a request's table reversed,
        last block first); of those reaching 0, the ones holding a hash (or marked ``dup``)
        join the free-queue tail in the given order, the others its head, in the given order
        (the first of them is allocated first): vLLM ``BlockPool.free_blocks``
        (vllm/v1/core/block_pool.py). Raises RuntimeError (a double free) if a block has no
        reference left to drop; the pool is then unchanged."""
        n = len(blocks)
        if n == 0:
            return
        if self._tail + n > len(self._q) or self._head < n:
            self._compact(n)
        k, n_cached, bad, head = _free(self.ref_cnt, self.free_seq, self.block_hash, self.dup,
                                       self._q, self._qseq, self._head, self._tail,
                                       self._next_seq, blocks)
        if bad >= 0:
            raise RuntimeError(f"double free of block {bad}")
        self._next_seq += k
        self._tail += k - (self._head - head)
        self._head = head
        self.num_free += k
        self.num_cached_free += n_cached

    def _compact(self, extra: int) -> None:
        """Drop stale queue entries and leave room for ``extra`` entries at each end of the
        valid ones (amortised: runs when the queue array has no room at the end a free needs;
        the valid entries are centred in the array, so either end has room for many frees)."""
        qb = self._q[self._head:self._tail]
        qs = self._qseq[self._head:self._tail]
        valid = self.free_seq[qb] == qs
        qb = qb[valid]
        qs = qs[valid]
        m = len(qb)  # (qb, qs: copies)
        cap = len(self._q)
        if m + 2 * extra > cap:  # (never with cap >= 2 x num_blocks: m + extra <= num_blocks)
            cap = 2 * (m + 2 * extra)
            self._q = np.empty(cap, dtype=np.int64)
            self._qseq = np.empty(cap, dtype=np.int64)
        off = (cap - m) // 2
        self._q[off:off + m] = qb
        self._qseq[off:off + m] = qs
        self._head = off
        self._tail = off + m

    # ------------------------------------------------------------------ checks
    def free_queue_order(self) -> np.ndarray:
        """Block ids in the free queue, head (next evicted) first. O(queue) — for tests/invariants."""
        qb = self._q[self._head:self._tail]
        qs = self._qseq[self._head:self._tail]
        return qb[self.free_seq[qb] == qs]

    def check(self, held_blocks: np.ndarray | None = None) -> None:
        """Assert the pool's invariants (O(num_blocks); used by ``sim.check_invariants``).

        free + used = total; ref counts >= 0; free blocks have ref 0 and appear once in the queue;
        ``held_blocks`` (all blocks in block tables) are never in the free queue; every block holding
        a hash is the index's entry for it (other entries are stale); the cached-free counter matches.
        """
        n = self.num_blocks
        assert (self.ref_cnt >= 0).all(), "negative ref count"
        order = self.free_queue_order()
        assert len(order) == self.num_free, f"queue holds {len(order)} != num_free {self.num_free}"
        assert len(np.unique(order)) == len(order), "block twice in the free queue"
        assert (self.ref_cnt[order] == 0).all(), "block with ref > 0 in the free queue"
        assert self.num_free + int(np.count_nonzero(self.ref_cnt > 0)) == n, "free + used != total"
        if held_blocks is not None and len(held_blocks):
            assert (self.free_seq[held_blocks] == -1).all(), "block in a block table is free"
        held = np.flatnonzero(self.block_hash != NO_HASH)
        assert len(np.unique(self.block_hash[held])) == len(held), "one hash on two blocks"
        got = self.index.get_many(self.block_hash[held])
        bad = np.flatnonzero(got != held)
        assert not len(bad), (f"block {held[bad[0]]} holds hash {self.block_hash[held[bad[0]]]}; "
                              f"the index maps it to {got[bad[0]]}")
        if self._table:  # no stale entry: one entry per block holding a hash
            assert self.index.count == len(held), \
                f"prefix table holds {self.index.count} entries for {len(held)} cached blocks"
            assert int(np.count_nonzero(self.index.tab[0::2] != NO_HASH)) == len(held), \
                "prefix table's occupied slots != cached blocks"
        cf = int(np.count_nonzero(self.block_hash[order] != NO_HASH))
        assert cf == self.num_cached_free, f"cached-free counter {self.num_cached_free} != {cf}"