"""GPU block pool with vLLM v1 prefix-caching semantics, vectorised with numpy.

Semantics (vLLM v1 ``BlockPool`` / ``KVCacheManager``, vllm/v1/core/block_pool.py):

* A block is ``block_size`` token slots spanning every layer (one block table per request).
* Blocks are ref-counted. A block with ref count 0 sits in the *free queue* in LRU order; the pool
  allocates from the head of the queue. A finished request's blocks are appended to the tail
  last-block-first, so the deepest blocks of a prefix are evicted first.
* Only full blocks are cached. A cached block keeps its hash while it sits in the free queue and
  can still serve a prefix hit; its hash is dropped only when the block is reallocated (evicted).
* A prefix hit is the longest run of cached blocks from the request's first block; the first miss
  ends it. Hit blocks are *touched*: removed from the free queue if free, ref count + 1.
* When two requests compute the same block concurrently, the first registered block keeps the
  hash; the duplicate stays uncached (vLLM keeps both under one hash; either serves a hit).

Implementation: the free queue is an append-only array with lazy deletion (an entry is valid when
its sequence number equals the block's ``free_seq``), so allocation, freeing and touching are
vectorised and amortised O(1) per block; nothing scans the whole pool per step. The prefix index
(a dict key -> block) is lazily deleted too: an entry is live only while ``block_hash[block] ==
key``, so evicting a block is one numpy store, not a dict deletion per block; stale entries are
dropped by rebuilding the dict from ``block_hash`` once they outnumber the pool (amortised O(1)).
"""

from __future__ import annotations

from itertools import repeat

import numpy as np

NO_HASH = np.iinfo(np.int64).min


class PoolExhausted(RuntimeError):
    """Raised when more blocks are requested than are free (callers check first)."""


class BlockPool:
    """Ref-counted GPU block pool with an LRU free queue and a prefix-cache index.

    Args:
        num_blocks: number of physical blocks (> 0).
        enable_caching: register full blocks in the prefix index (vLLM ``enable_prefix_caching``).

    Block ids are ``0..num_blocks-1``. All methods take and return ``np.ndarray`` of int64 ids.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        if num_blocks <= 0:
            raise ValueError(f"num_blocks={num_blocks}; expected > 0")
        n = int(num_blocks)
        self.num_blocks = n
        self.enable_caching = bool(enable_caching)
        self.ref_cnt = np.zeros(n, dtype=np.int32)
        self.block_hash = np.full(n, NO_HASH, dtype=np.int64)
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
        # key -> block; live only while block_hash[block] == key (see the module docstring)
        self.index: dict[int, int] = {}
        self.evicted_cached_blocks = 0
        # when lists, allocate() appends evicted keys and cache_blocks() newly registered keys
        # (the tier manager's write policies read them)
        self.evict_log: list[int] | None = None
        self.cached_log: list[int] | None = None
        # when a list: every key registered, evicted or uncached (any change of the index)
        self.change_log: list[int] | None = None

    # ------------------------------------------------------------------ counts
    @property
    def num_used(self) -> int:
        """Blocks with ref count > 0 (held by at least one block table)."""
        return self.num_blocks - self.num_free

    # ------------------------------------------------------------------ prefix index
    def cached_blocks(self, keys: list[int]) -> np.ndarray:
        """Block id holding each of ``keys`` in the prefix index, -1 where none does.

        ``keys``: Python ints (a list). Returns int64, shape ``(len(keys),)``.
        """
        n = len(keys)
        if n == 0:
            return np.empty(0, dtype=np.int64)
        vals = np.fromiter(map(self.index.get, keys, repeat(-1, n)), dtype=np.int64, count=n)
        found = vals >= 0
        if found.any():
            stale = found.copy()
            stale[found] = self.block_hash[vals[found]] != np.asarray(keys, dtype=np.int64)[found]
            vals[stale] = -1
        return vals

    def lookup_prefix(self, keys: np.ndarray, max_blocks: int) -> np.ndarray:
        """Longest run of cached blocks matching ``keys[0], keys[1], ...`` (at most ``max_blocks``).

        Returns the block ids (int64 array, possibly empty). Does not touch them.
        """
        if not self.enable_caching or max_blocks <= 0:
            return np.empty(0, dtype=np.int64)
        out: list[np.ndarray] = []
        start = 0
        limit = min(int(max_blocks), len(keys))
        chunk = 256
        while start < limit:
            stop = min(start + chunk, limit)
            vals = self.cached_blocks(keys[start:stop].tolist())
            miss = vals < 0
            if miss.any():
                out.append(vals[:int(np.argmax(miss))])
                break
            out.append(vals)
            start = stop
            chunk = min(chunk * 4, 1 << 16)
        if not out:
            return np.empty(0, dtype=np.int64)
        return out[0] if len(out) == 1 else np.concatenate(out)

    def cache_blocks(self, blocks: np.ndarray, keys: np.ndarray) -> None:
        """Register full ``blocks`` under ``keys`` (same length, keys distinct) in the prefix
        index. A key already held by a block keeps its first block (see module docstring)."""
        if not self.enable_caching or len(blocks) == 0:
            return
        kl = keys.tolist()
        new = self.cached_blocks(kl) < 0
        if not new.any():
            return
        index = self.index
        if new.all():
            nb, nk = blocks, keys
            index.update(zip(kl, blocks.tolist()))
        else:
            nb, nk = blocks[new], keys[new]
            index.update(zip(nk.tolist(), nb.tolist()))
        self.block_hash[nb] = nk
        if self.cached_log is not None or self.change_log is not None:
            nkl = nk.tolist()
            if self.cached_log is not None:
                self.cached_log.extend(nkl)
            if self.change_log is not None:
                self.change_log.extend(nkl)
        if len(index) > 2 * self.num_blocks + 1024:
            self._rebuild_index()

    def _rebuild_index(self) -> None:
        """Drop stale index entries: rebuild the dict from ``block_hash`` (O(num_blocks), run
        once the dict outgrows twice the pool, so amortised O(1) per registration)."""
        held = np.flatnonzero(self.block_hash != NO_HASH)
        self.index = dict(zip(self.block_hash[held].tolist(), held.tolist()))

    def uncache(self, blocks: np.ndarray) -> None:
        """Drop ``blocks`` (held by a request) from the prefix index: their content changed
        (eviction or compaction), so they must never serve a hit for the uncompressed text."""
        if not self.enable_caching or len(blocks) == 0:
            return
        if self.change_log is not None:
            h = self.block_hash[blocks]
            self.change_log.extend(h[h != NO_HASH].tolist())
        self.block_hash[blocks] = NO_HASH  # their index entries are now stale

    # ------------------------------------------------------------------ queue ops
    def blocks_needed_for_touch(self, blocks: np.ndarray) -> int:
        """How many of ``blocks`` are currently free (touching them consumes free capacity)."""
        if len(blocks) == 0:
            return 0
        return int(np.count_nonzero(self.ref_cnt[blocks] == 0))

    def touch(self, blocks: np.ndarray) -> None:
        """Take hit blocks: remove the free ones from the free queue, ref count + 1."""
        if len(blocks) == 0:
            return
        rc = self.ref_cnt[blocks]
        was_free = blocks[rc == 0]
        if len(was_free):
            self.free_seq[was_free] = -1
            self.num_free -= len(was_free)
            self.num_cached_free -= int(np.count_nonzero(self.block_hash[was_free] != NO_HASH))
        self.ref_cnt[blocks] = rc + 1

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
        taken: list[np.ndarray] = []
        need = n
        head = self._head
        while need > 0:
            win = max(2 * need, 64)
            stop = min(head + win, self._tail)
            qb = self._q[head:stop]
            valid = self.free_seq[qb] == self._qseq[head:stop]
            pos = np.flatnonzero(valid)
            if len(pos) >= need:
                pos = pos[:need]
                taken.append(qb[pos])
                head = head + int(pos[-1]) + 1
                need = 0
            else:
                if len(pos):
                    taken.append(qb[pos])
                need -= len(pos)
                head = stop
        self._head = head
        out = taken[0] if len(taken) == 1 else np.concatenate(taken)
        self.free_seq[out] = -1
        self.ref_cnt[out] = 1
        self.num_free -= n
        h = self.block_hash[out]
        cached = h != NO_HASH
        if cached.any():
            # clearing block_hash makes the block's index entry stale (lazy deletion)
            if self.evict_log is not None or self.change_log is not None:
                ek = h[cached].tolist()
                if self.evict_log is not None:
                    self.evict_log.extend(ek)
                if self.change_log is not None:
                    self.change_log.extend(ek)
            nc = int(np.count_nonzero(cached))
            self.num_cached_free -= nc
            self.evicted_cached_blocks += nc
            self.block_hash[out] = NO_HASH
        return (out, cached) if return_evicted else out

    def free(self, blocks: np.ndarray) -> None:
        """Drop one reference to each of ``blocks``; those reaching 0 join the free-queue tail in
        the given order (callers pass a finished request's table reversed, last block first)."""
        if len(blocks) == 0:
            return
        rc = self.ref_cnt[blocks] - 1
        if (rc < 0).any():
            raise RuntimeError(f"double free of blocks {blocks[rc < 0][:8].tolist()}")
        self.ref_cnt[blocks] = rc
        released = blocks[rc == 0]
        k = len(released)
        if k == 0:
            return
        if self._tail + k > len(self._q):
            self._compact(k)
        seqs = np.arange(self._next_seq, self._next_seq + k, dtype=np.int64)
        self._next_seq += k
        self.free_seq[released] = seqs
        self._q[self._tail:self._tail + k] = released
        self._qseq[self._tail:self._tail + k] = seqs
        self._tail += k
        self.num_free += k
        self.num_cached_free += int(np.count_nonzero(self.block_hash[released] != NO_HASH))

    def _compact(self, extra: int) -> None:
        """Drop stale queue entries (amortised: runs when the queue array is full)."""
        qb = self._q[self._head:self._tail]
        qs = self._qseq[self._head:self._tail]
        valid = self.free_seq[qb] == qs
        qb = qb[valid]
        qs = qs[valid]
        m = len(qb)
        cap = len(self._q)
        if m + extra > cap // 2:
            cap = max(2 * (m + extra), cap)
            self._q = np.empty(cap, dtype=np.int64)
            self._qseq = np.empty(cap, dtype=np.int64)
        self._q[:m] = qb
        self._qseq[:m] = qs
        self._head = 0
        self._tail = m

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
        for b, k in zip(held.tolist(), self.block_hash[held].tolist()):
            assert self.index.get(k) == b, f"block {b} holds hash {k}; the index maps it to {self.index.get(k)}"
        cf = int(np.count_nonzero(self.block_hash[order] != NO_HASH))
        assert cf == self.num_cached_free, f"cached-free counter {self.num_cached_free} != {cf}"
