"""The prefix index of the block pool (int64 key -> block id) and the compiled hash tables under
it: :class:`PrefixTable`, an open-addressing table of (key, block) pairs holding live entries
only (backward-shift deletion), the default; :class:`DictIndex`, a Python dict lazily deleted
(an entry is live only while ``block_hash[block] == key``), same answers; :class:`KeyTable`, an
open-addressing key -> value table without deletion (the engine's index of a waiting request's
own keys). The kernels (numba, :mod:`sim.jit`) work a whole array of keys per call: probing
(:func:`_home`, :func:`_probe`, :func:`_pair_probe`), lookups (:func:`_table_get`,
:func:`_pair_get`, :func:`_prefix_walk`: the run of held keys from a request's first block),
insertion (:func:`_table_put_absent`, :func:`_prefix_register`) and deletion
(:func:`_pair_delete`, :func:`_pair_discard`). ``NO_HASH`` (int64 min) is reserved: the
empty-slot marker and the hash of a block holding none; never a key. The pool that owns the
index is :mod:`sim.block_pool`.
"""

from __future__ import annotations

from itertools import repeat

import numpy as np

from .jit import PREFETCH_AHEAD, kernel, prefetch

D = PREFETCH_AHEAD  # (kernels fetch element i + D's lines while on element i)

NO_HASH = np.iinfo(np.int64).min

# PrefixTable: slots per pool block (its load stays <= 1/2; 16 bytes a slot: 2 MiB at 50,000 blocks)
PREFIX_SLOTS_PER_BLOCK = 2
SMALL_BATCH = 8  # DictIndex: at most this many keys take the scalar path


class DictIndex:
    """Prefix-index backend on a Python dict (int64 key -> block id), same interface as
    :class:`KeyTable`. ``min_size``: the pool size x ``INDEX_SLOTS_PER_BLOCK`` (the rebuild
    threshold is ``1 / INDEX_LOAD_DIV`` of it)."""

    def __init__(self, min_size: int):
        self.d: dict[int, int] = {}
        self.size = int(min_size)

    @property
    def count(self) -> int:
        """Entries held (live and stale)."""
        return len(self.d)

    def get1(self, key: int) -> int:
        """Value of one key, -1 where absent."""
        return self.d.get(key, -1)

    def get_many(self, q: np.ndarray) -> np.ndarray:
        """Value of each key in ``q`` (int64 array), -1 where absent."""
        n = len(q)
        return np.fromiter(map(self.d.get, q.tolist(), repeat(-1, n)), dtype=np.int64, count=n)

    def put_absent(self, q: np.ndarray, v: np.ndarray, live_hash: np.ndarray) -> np.ndarray:
        """Set ``q[i] -> v[i]`` for each key not held by a live entry (one whose value ``b`` has
        ``live_hash[b] == key``). Returns the bool mask of keys set."""
        if len(q) <= SMALL_BATCH:  # scalar: a few keys cost less one by one
            d = self.d
            out = []
            for key, val in zip(q.tolist(), v.tolist()):
                cur = d.get(key)
                if cur is None or int(live_hash[cur]) != key:
                    d[key] = val
                    out.append(True)
                else:
                    out.append(False)
            return np.array(out, dtype=bool)
        if not self.d:  # empty (a fresh or rebuilt index): every key is absent
            self.d.update(zip(q.tolist(), v.tolist()))
            return np.ones(len(q), dtype=bool)
        # one C-level pass: absent keys are inserted, held ones return their block; an entry
        # is kept only if live (a stale one is overwritten below)
        vl = v.tolist()
        cur = np.fromiter(map(self.d.setdefault, q.tolist(), vl), dtype=np.int64, count=len(vl))
        new = live_hash[cur] != q
        stale = new & (cur != v)
        if stale.any():
            self.d.update(zip(q[stale].tolist(), v[stale].tolist()))
        return new


class KeyTable:
    """Hash table int64 key -> int64 value in numpy arrays (open addressing, linear probing,
    Fibonacci hashing: the top bits of key x 2^64/phi), probed by compiled loops
    (:func:`_probe`, :func:`_table_get`, :func:`_table_put_absent`, numba) a whole array of keys
    per call.

    Args:
        min_size: the table gets at least this many slots (rounded up to a power of two).

    No deletion: a key's stale entry is overwritten by a later :meth:`put_absent` of the key.
    ``NO_HASH`` is reserved (the empty-slot marker) and never a key. ``count`` = occupied slots.
    (The engine's index of a waiting request's own keys; the pool's prefix index is a
    :class:`PrefixTable`.)
    """

    def __init__(self, min_size: int):
        self.bits = max(10, int(min_size - 1).bit_length())
        self.size = 1 << self.bits
        self.mask = self.size - 1
        self.keys = np.full(self.size, NO_HASH, dtype=np.int64)
        self.vals = np.empty(self.size, dtype=np.int64)  # read only where ``keys`` holds a key
        self.count = 0
        self._shift = 64 - self.bits

    def get1(self, key: int) -> int:
        """Value of one key, -1 where absent."""
        out = np.empty(1, dtype=np.int64)
        _table_get(self.keys, self.vals, self._shift, self.mask, np.array([key], dtype=np.int64), out)
        return int(out[0])

    def get_many(self, q: np.ndarray) -> np.ndarray:
        """Value of each key in ``q`` (1-d int64 array), -1 where absent. Shape ``(len(q),)``."""
        out = np.empty(len(q), dtype=np.int64)
        _table_get(self.keys, self.vals, self._shift, self.mask, q, out)
        return out

    def put_absent(self, q: np.ndarray, v: np.ndarray, live_hash: np.ndarray) -> np.ndarray:
        """Set ``q[i] -> v[i]`` for each key not held by a live entry (one whose value ``b`` has
        ``live_hash[b] == key``; a stale entry of the key is overwritten), in key order. Keys
        distinct. Returns the bool mask of keys set. Raises RuntimeError if the table would
        fill up (:class:`BlockPool` rebuilds it long before)."""
        n = len(q)
        new = np.zeros(n, dtype=bool)
        if n == 0:
            return new
        if self.count + n > self.size - 1:
            raise RuntimeError("KeyTable full")
        sel = np.empty(n, dtype=np.int64)
        taken, m = _table_put_absent(self.keys, self.vals, self._shift, self.mask, q, v,
                                     live_hash, sel)
        self.count += taken
        new[sel[:m]] = True
        return new


@kernel("i8(i8, i8)")
def _home(key, shift):  # pragma: no cover (compiled)
    """Home slot of ``key`` in a table of ``2 ** (64 - shift)`` slots (Fibonacci hashing: the
    top bits of key x 2^64/phi, wrapping uint64 product)."""
    return np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift))


@kernel("i8(i8[:], i8, i8, i8)")
def _probe(keys, mask, shift, key):  # pragma: no cover (compiled)
    """The slot of ``key`` in the open-addressing table ``keys`` (linear probing from its
    :func:`_home`), or the empty slot where it would go."""
    s = _home(key, shift)
    while True:
        k = keys[s]
        if k == key or k == NO_HASH:
            return s
        s = (s + 1) & mask


@kernel("i8(i8[:], i8, i8, i8)")
def _pair_probe(tab, mask, shift, key):  # pragma: no cover (compiled)
    """The slot of ``key`` in a table of (key, value) pairs in adjacent int64s (slot ``s`` is
    ``tab[2 s]``, ``tab[2 s + 1]``; ``NO_HASH`` marks an empty slot; ``mask + 1`` slots): linear
    probing from its :func:`_home`; or the empty slot where it would go."""
    s = _home(key, shift)
    while True:
        k = tab[2 * s]
        if k == key or k == NO_HASH:
            return s
        s = (s + 1) & mask


@kernel("void(i8[:], i8, i8, i8)")
def _pair_delete(tab, mask, shift, s):  # pragma: no cover (compiled)
    """Empty slot ``s``, shifting back the entries after it whose probe run crosses it."""
    j = s
    while True:
        j = (j + 1) & mask
        k = tab[2 * j]
        if k == NO_HASH:
            break
        home = _home(k, shift)
        # the entry at j may move to s unless its home lies cyclically in (s, j]
        if s <= j:
            stays = s < home <= j
        else:
            stays = home > s or home <= j
        if not stays:
            tab[2 * s] = k
            tab[2 * s + 1] = tab[2 * j + 1]
            s = j
    tab[2 * s] = NO_HASH


@kernel("i8(i8[:], i8, i8, i8[:])")
def _pair_discard(tab, mask, shift, keys):  # pragma: no cover (compiled)
    """Delete each of ``keys`` held in the pair table ``tab`` (absent ones are skipped);
    returns how many were held."""
    n = 0
    m = keys.shape[0]
    for i in range(m):
        if i + D < m:
            prefetch(tab, 2 * _home(keys[i + D], shift))
        s = _pair_probe(tab, mask, shift, keys[i])
        if tab[2 * s] == keys[i]:
            _pair_delete(tab, mask, shift, s)
            n += 1
    return n


@kernel("void(i8[:], i8[:], i8, i8, i8[:], i8[:])")
def _table_get(keys, vals, shift, mask, q, out):  # pragma: no cover (compiled)
    """``out[i]`` = the value of ``q[i]`` in the table ``keys``/``vals``, -1 where absent."""
    for i in range(q.shape[0]):
        s = _probe(keys, mask, shift, q[i])
        out[i] = vals[s] if keys[s] == q[i] else -1


@kernel("UniTuple(i8, 2)(i8[:], i8[:], i8, i8, i8[:], i8[:], i8[:], i8[:])")
def _table_put_absent(keys, vals, shift, mask, q, v, live_hash, sel):  # pragma: no cover
    """:meth:`KeyTable.put_absent` on the arrays: the indices of the keys set into ``sel``;
    returns (slots newly taken, keys set)."""
    taken = 0
    n = 0
    for i in range(q.shape[0]):
        key = q[i]
        s = _probe(keys, mask, shift, key)
        if keys[s] == key:
            if live_hash[vals[s]] != key:  # stale entry: replace
                vals[s] = v[i]
                sel[n] = i
                n += 1
        else:
            keys[s] = key
            vals[s] = v[i]
            sel[n] = i
            n += 1
            taken += 1
    return taken, n


class PrefixTable:
    """The block pool's prefix index (hash -> block) as an open-addressing table holding live
    entries only: (key, block) pairs in adjacent int64s, linear probing from the key's
    :func:`_home`, backward-shift deletion (:func:`_pair_delete`), worked by compiled loops a
    whole array of keys per call.

    Args:
        num_blocks: the pool's blocks (> 0). Each block holds at most one hash and each hash
            has at most one entry, so the table never holds more than ``num_blocks`` entries; it
            is sized once to ``PREFIX_SLOTS_PER_BLOCK x num_blocks`` slots (a power of two, at
            least 1,024), so its load stays <= 1/2 and it is never rebuilt.

    :class:`BlockPool` deletes a key's entry whenever its block loses the hash (an allocation
    evicts it, :meth:`BlockPool.uncache`, a re-registration), so an entry found is live; unlike
    the lazily deleted :class:`DictIndex` no entry goes stale. One pair is 16 B and adjacent
    slots share a cache line, so a probe reads one line: at 50,000 blocks the table is 2 MiB and
    stays in the CPU cache, where the lazily deleted table it replaced (16 slots a block, keys
    and blocks in two arrays, 16 MiB) missed it twice a key. ``NO_HASH`` is never a key.
    """

    def __init__(self, num_blocks: int):
        bits = max(10, int(PREFIX_SLOTS_PER_BLOCK * num_blocks - 1).bit_length())
        self.size = 1 << bits
        self.mask = self.size - 1
        self.shift = 64 - bits
        self.tab = np.empty(2 * self.size, dtype=np.int64)
        self.tab[0::2] = NO_HASH
        self.count = 0

    def get1(self, key: int) -> int:
        """Block of one key, -1 where absent."""
        return int(self.get_many(np.array([key], dtype=np.int64))[0])

    def get_many(self, q: np.ndarray) -> np.ndarray:
        """Block of each key in ``q`` (1-d int64 array), -1 where absent. Shape ``(len(q),)``."""
        out = np.empty(len(q), dtype=np.int64)
        _pair_get(self.tab, self.mask, self.shift, np.ascontiguousarray(q, dtype=np.int64), out)
        return out


@kernel("void(i8[:], i8, i8, i8[:], i8[:])")
def _pair_get(tab, mask, shift, q, out):  # pragma: no cover (compiled)
    """``out[i]`` = the value of ``q[i]`` in the pair table ``tab``, -1 where absent."""
    m = q.shape[0]
    for i in range(m):
        if i + D < m:
            prefetch(tab, 2 * _home(q[i + D], shift))
        s = _pair_probe(tab, mask, shift, q[i])
        out[i] = tab[2 * s + 1] if tab[2 * s] == q[i] else -1


@kernel("i8(i8[:], i8, i8, i8[:], i8, i8[:])")
def _prefix_walk(tab, mask, shift, q, limit, out):  # pragma: no cover (compiled)
    """The run of ``q[0], q[1], ...`` (at most ``limit``) held in the :class:`PrefixTable`
    ``tab``: their blocks into ``out``; returns its length (the index of the first key not
    held)."""
    for i in range(limit):
        if i + D < limit:
            prefetch(tab, 2 * _home(q[i + D], shift))
        s = _pair_probe(tab, mask, shift, q[i])
        if tab[2 * s] != q[i]:
            return i
        out[i] = tab[2 * s + 1]
    return limit


@kernel("UniTuple(i8, 2)(i8[:], i8, i8, i8[:], i8[:], i8[:], i8[:])")
def _prefix_register(tab, mask, shift, block_hash, q, v, sel):  # pragma: no cover (compiled)
    """:meth:`BlockPool.cache_blocks` on a :class:`PrefixTable`: each key of ``q`` not held
    when the batch starts is entered for block ``v[i]``, which takes it as its hash (an older
    hash of that block loses its entry); a key held then keeps its block, even when the batch
    took its entry away (its block registered again under another key; the engine never does
    that, but the lazily deleted :class:`DictIndex` judges the batch this way). The indices of
    the keys entered go into ``sel``. Returns (entries added - entries deleted, keys
    entered)."""
    added = 0
    n = 0
    dead = np.empty(0, dtype=np.int64)  # keys whose entries this batch deleted (rare)
    nd = 0
    nq = q.shape[0]
    for i in range(nq):
        if i + D < nq:
            prefetch(tab, 2 * _home(q[i + D], shift))
            prefetch(block_hash, v[i + D])
        key = q[i]
        s = _pair_probe(tab, mask, shift, key)
        if tab[2 * s] == key:
            continue
        held = False
        for j in range(nd):
            if dead[j] == key:
                held = True
        if held:
            continue
        b = v[i]
        old = block_hash[b]
        if old != NO_HASH:
            so = _pair_probe(tab, mask, shift, old)
            if tab[2 * so] == old and tab[2 * so + 1] == b:
                _pair_delete(tab, mask, shift, so)
                added -= 1
                if nd == dead.shape[0]:
                    grown = np.empty(max(8, 2 * nd), dtype=np.int64)
                    grown[:nd] = dead[:nd]
                    dead = grown
                dead[nd] = old
                nd += 1
            s = _pair_probe(tab, mask, shift, key)  # (the deletion may have moved entries)
        tab[2 * s] = key
        tab[2 * s + 1] = b
        block_hash[b] = key
        added += 1
        sel[n] = i
        n += 1
    return added, n
