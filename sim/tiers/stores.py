"""Page stores of the tiers below the GPU: which pages a tier holds and which it evicts.

Replacement (``tiers.replacement``): ``lru`` (:class:`LRUStore`, compiled), or ``arc``
(:class:`ARCStore`; Megiddo & Modha, FAST 2003; as vLLM's CPU offload manager offers). Pages of
one request are inserted deepest block first, so the shallow blocks of a prefix chain are the
most recent and a chain is evicted leaf first: no unreachable descendants are kept while their
parent is gone (for pages inserted together). :class:`KeySet` holds the pages in flight to a
tier. Keys are int64 page hashes (``sim.block_pool.NO_HASH`` is reserved). The compiled
lookups across the GPU's prefix index and two stores (:func:`locate_pages`) and the offload
queue's filter (:func:`queue_absent`) work on the stores' tables.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .. import hash_tables
from ..hash_tables import NO_HASH, _home, _pair_delete, _pair_discard, _pair_probe
from ..errors import ConfigError
from ..jit import PREFETCH_AHEAD, kernel, prefetch

D = PREFETCH_AHEAD  # (kernels fetch key i + D's table slot while on key i)

REPLACEMENTS = ("lru", "arc")


class LRUStore:
    """Pages held by one tier, least recently used first. Capacity in pages (>= 0).

    A ring of keys in use order (oldest at the head) and an open-addressing key -> ring
    position table (linear probing, backward-shift deletion), in numpy arrays worked by compiled
    loops (:func:`_lru_insert_many` and friends, numba); the arrays grow with the pages held, not
    with the capacity. Keys are int64 page hashes (``sim.block_pool.NO_HASH`` is reserved).

    Using a page appends it at the ring's tail and blanks its older entry (``NO_HASH``), so each
    held page has exactly one entry, at the position its table slot records; eviction pops the
    head, skipping blanks. When the ring fills it is rewritten with the held pages only (grown
    when they fill over half of it), so the rewrite costs O(1) amortised per use. A table slot is
    the pair (key, position) in adjacent int64s.

    Why a ring: a disk tier holds millions of pages, far beyond the CPU caches. An insert that
    evicts touches two random table slots (the new page's and the evicted page's) and otherwise
    memory read in order; the linked list it replaced also touched the evicted node and its
    neighbours at random (``python -m experiments.bench_pagestore``; BENCHMARKS.md)."""

    def __init__(self, capacity_pages: int):
        self.capacity = int(capacity_pages)
        # st: ring position of the head (oldest entry), of the tail (next entry), pages held,
        # pages the table is sized for, most pages held after an insert (the peak)
        self._st = np.zeros(5, dtype=np.int64)
        self._alloc(256, np.empty(0, dtype=np.int64))

    @property
    def peak(self) -> int:
        """The most pages held at once (after an insert's evictions)."""
        return int(self._st[4])

    def _alloc(self, room: int, order: np.ndarray) -> None:
        """(Re)build for ``room`` pages: a table of >= 2 x ``room`` slots and a ring of as many
        entries, holding the pages ``order`` (least recently used first)."""
        bits = max(10, int(2 * room - 1).bit_length())
        self._tab = np.empty(2 << bits, dtype=np.int64)
        self._tab[0::2] = NO_HASH
        self._mask = (1 << bits) - 1
        self._shift = 64 - bits
        self._ring = np.empty(1 << bits, dtype=np.int64)
        self._st[:4] = (0, 0, 0, room)
        if len(order):
            self._insert(order)

    def _room(self, n: int, held_too: bool = True) -> None:
        """Make room for ``n`` more ring entries and, with ``held_too``, ``n`` more pages held:
        grow (held pages beyond the sized room) or rewrite the ring with the held pages only
        (ring full; the ring then has at least twice ``max(room, n)`` entries)."""
        held = int(self._st[2])
        room = int(self._st[3])
        if held_too and held + n > room:
            self._alloc(max(2 * room, held + n), self.lru_order())
        elif self._st[1] - self._st[0] + n > len(self._ring):
            self._alloc(max(room, n), self.lru_order())

    def _insert(self, keys: np.ndarray) -> np.ndarray:
        out = np.empty(len(keys), dtype=np.int64)  # at most the batch is evicted (held <= cap)
        m = _lru_insert_many(self._tab, self._mask, self._shift, self._ring, self._st,
                             self.capacity, keys, out)
        if m < 0:  # (no room: the kernel changed nothing)
            self._room(len(keys))
            m = _lru_insert_many(self._tab, self._mask, self._shift, self._ring, self._st,
                                 self.capacity, keys, out)
        return out[:m]

    def __contains__(self, key: int) -> bool:
        return bool(self.contains_many([key])[0])

    def __len__(self) -> int:
        return int(self._st[2])

    def lru_order(self) -> np.ndarray:
        """The pages held, least recently used first (int64)."""
        out = np.empty(int(self._st[2]), dtype=np.int64)
        _lru_order(self._ring, self._st, out)
        return out

    def touch(self, key: int) -> None:
        """Mark a held page most recently used (KeyError if not held)."""
        self.touch_many([key])

    def touch_many(self, keys) -> None:
        """Mark held pages (``keys``: int64 array or list) most recently used, in order (the
        last ends most recent). KeyError for a page not held (the pages before it were
        touched)."""
        q = np.asarray(keys, dtype=np.int64)
        self._room(len(q), held_too=False)
        bad = _lru_touch_many(self._tab, self._mask, self._shift, self._ring, self._st, q)
        if bad >= 0:
            raise KeyError(int(q[bad]))

    def contains_many(self, keys: np.ndarray) -> np.ndarray:
        """Membership of each key (``keys``: int64 array or list; bool array)."""
        q = np.asarray(keys, dtype=np.int64)
        out = np.empty(len(q), dtype=bool)
        _lru_contains(self._tab, self._mask, self._shift, q, out)
        return out

    def missing(self, keys: list[int]) -> list[int]:
        """The keys not held, in order."""
        return self.not_held(np.asarray(keys, dtype=np.int64)).tolist()

    def insert_many(self, keys: list[int]) -> list[int]:
        """Insert pages in order (a held page is refreshed: it moves to the most recent end),
        then evict the least recently used pages beyond the capacity; returns those evicted, in
        eviction order. Same result as one :meth:`insert` per key: a batch's own pages are
        newer than everything already held, so older pages go first."""
        return self.insert_array(np.asarray(keys, dtype=np.int64)).tolist()

    def insert(self, key: int) -> list[int]:
        """Insert (or refresh) a page; returns the pages evicted to make room."""
        return self.insert_many([key])

    def not_held(self, keys: np.ndarray) -> np.ndarray:
        """The keys not held, in order (``keys``: int64 array; int64 array)."""
        out = np.empty(len(keys), dtype=np.int64)
        return out[:_lru_absent(self._tab, self._mask, self._shift, keys, out)]

    def insert_array(self, keys: np.ndarray) -> np.ndarray:
        """:meth:`insert_many` on an int64 array; returns the evicted pages as an int64 array."""
        if self.capacity <= 0:
            return keys.copy()
        if not len(keys):
            return keys[:0]
        return self._insert(keys)


# The compiled LRU store: table slot s is tab[2s] (key, NO_HASH when empty), tab[2s + 1] (the
# ring position of its entry); ring position p is ring[p & (len(ring) - 1)], NO_HASH when blank.

@kernel("void(i8[:], i8[:], i8[:], i8, i8)")
def _lru_use(tab, ring, st, s, key):  # pragma: no cover (compiled)
    """Make ``key`` (at table slot ``s``, held or not) the most recent: blank its older ring
    entry if held, append it at the tail."""
    rmask = ring.shape[0] - 1
    t = st[1]
    if tab[2 * s] == key:
        ring[tab[2 * s + 1] & rmask] = NO_HASH
    else:
        tab[2 * s] = key
        st[2] += 1
    ring[t & rmask] = key
    tab[2 * s + 1] = t
    st[1] = t + 1


@kernel("i8(i8[:], i8, i8, i8[:], i8[:], i8, i8[:], i8[:])", depends=(hash_tables,))
def _lru_insert_many(tab, mask, shift, ring, st, cap, keys, out):  # pragma: no cover
    """:meth:`LRUStore.insert_many` on the arrays: the evicted pages into ``out``; returns how
    many, or -1 (nothing changed) when the table or the ring lacks room for every key
    (:meth:`LRUStore._room` makes it). Keeps the peak of the pages held in ``st[4]``."""
    n = keys.shape[0]
    if st[2] + n > st[3] or st[1] - st[0] + n > ring.shape[0]:
        return -1
    for i in range(n):
        if i + D < n:
            prefetch(tab, 2 * _home(keys[i + D], shift))
        key = keys[i]
        _lru_use(tab, ring, st, _pair_probe(tab, mask, shift, key), key)
    rmask = ring.shape[0] - 1
    m = 0
    while st[2] > cap:
        h = st[0]
        st[0] = h + 1
        ahead = ring[(h + D) & rmask]  # (the entry D positions on: likely evicted soon)
        if ahead != NO_HASH:
            prefetch(tab, 2 * _home(ahead, shift))
        key = ring[h & rmask]
        if key == NO_HASH:
            continue
        _pair_delete(tab, mask, shift, _pair_probe(tab, mask, shift, key))
        st[2] -= 1
        out[m] = key
        m += 1
    if st[2] > st[4]:
        st[4] = st[2]
    return m


@kernel("i8(i8[:], i8, i8, i8[:], i8[:], i8[:])", depends=(hash_tables,))
def _lru_touch_many(tab, mask, shift, ring, st, keys):  # pragma: no cover (compiled)
    """Move each held key to the most recent end, in order; the index of the first key not
    held (the touching stops there), or -1. The ring has room for every key."""
    n = keys.shape[0]
    for i in range(n):
        if i + D < n:
            prefetch(tab, 2 * _home(keys[i + D], shift))
        s = _pair_probe(tab, mask, shift, keys[i])
        if tab[2 * s] != keys[i]:
            return i
        _lru_use(tab, ring, st, s, keys[i])
    return -1


@kernel("void(i8[:], i8, i8, i8[:], b1[:])", depends=(hash_tables,))
def _lru_contains(tab, mask, shift, keys, out):  # pragma: no cover (compiled)
    n = keys.shape[0]
    for i in range(n):
        if i + D < n:
            prefetch(tab, 2 * _home(keys[i + D], shift))
        out[i] = tab[2 * _pair_probe(tab, mask, shift, keys[i])] == keys[i]


@kernel("i8(i8[:], i8, i8, i8[:], i8[:])", depends=(hash_tables,))
def _lru_absent(tab, mask, shift, keys, out):  # pragma: no cover (compiled)
    """The keys absent from the table, in order, into ``out``; returns how many."""
    n = keys.shape[0]
    m = 0
    for i in range(n):
        if i + D < n:
            prefetch(tab, 2 * _home(keys[i + D], shift))
        if tab[2 * _pair_probe(tab, mask, shift, keys[i])] != keys[i]:
            out[m] = keys[i]
            m += 1
    return m


@kernel("void(i8[:], i8[:], i8[:])")
def _lru_order(ring, st, out):  # pragma: no cover (compiled)
    rmask = ring.shape[0] - 1
    i = 0
    for p in range(st[0], st[1]):
        k = ring[p & rmask]
        if k != NO_HASH:
            out[i] = k
            i += 1


@kernel("i8(i8[:], i8, i8, i8, i8[:], i8, i8, i8[:], i8, i8, i8[:], i8, i8, i8[:], i8, i8, "
        "i8[:], b1, i8[:], i1[:])", depends=(hash_tables,))
def locate_pages(gtab, gmask, gshift, levels, tab1, mask1, shift1, tab2, mask2, shift2, tab3,
                 mask3, shift3, tab4, mask4, shift4, q, stop, blk,
                 code):  # pragma: no cover (compiled)
    """:meth:`TierManager.locate` on the arrays: for each key of ``q`` its GPU block (the
    prefix-index table ``gtab`` of a :class:`sim.block_pool.PrefixTable`, which holds live
    entries only) or -1 into ``blk`` and the fastest place holding it into ``code``: 0 the GPU,
    ``k`` level ``k`` of the first ``levels`` (1 .. 4, :data:`sim.tiers.spec.MAX_LEVELS`), whose
    :class:`LRUStore` table is ``tab<k>`` (with ``mask<k>``, ``shift<k>``; the slots past
    ``levels`` are not read), -1 none. With ``stop`` it ends at the first key held nowhere and
    returns its index, else it returns ``len(q)``. (Tables as separate arguments, not a tuple:
    numba's dispatcher types arrays and integers without Python, tuples with it.)"""
    n = q.shape[0]
    for i in range(n):
        if i + D < n:  # (the GPU and level-1 slots: most keys are looked up in both)
            prefetch(gtab, 2 * _home(q[i + D], gshift))
            prefetch(tab1, 2 * _home(q[i + D], shift1))
        key = q[i]
        b = -1
        s = _pair_probe(gtab, gmask, gshift, key)
        if gtab[2 * s] == key:
            b = gtab[2 * s + 1]
        blk[i] = b
        if b >= 0:
            code[i] = 0
        elif tab1[2 * _pair_probe(tab1, mask1, shift1, key)] == key:
            code[i] = 1
        elif levels > 1 and tab2[2 * _pair_probe(tab2, mask2, shift2, key)] == key:
            code[i] = 2
        elif levels > 2 and tab3[2 * _pair_probe(tab3, mask3, shift3, key)] == key:
            code[i] = 3
        elif levels > 3 and tab4[2 * _pair_probe(tab4, mask4, shift4, key)] == key:
            code[i] = 4
        else:
            code[i] = -1
            if stop:
                return i
    return q.shape[0]


class KeySet:
    """A set of int64 keys (``NO_HASH`` reserved) in an open-addressing table worked by the
    compiled loops of :class:`LRUStore`'s table (linear probing, backward-shift deletion): a
    whole array of keys per call. Holds the pages in flight to the host tier."""

    def __init__(self):
        self.count = 0
        self._resize(1 << 10)

    def _resize(self, slots: int) -> None:
        old = self._tab[0::2] if hasattr(self, "_tab") else None
        bits = int(slots - 1).bit_length()
        self._tab = np.empty(2 << bits, dtype=np.int64)
        self._tab[0::2] = NO_HASH
        self._mask = (1 << bits) - 1
        self._shift = 64 - bits
        if old is not None:
            held = old[old != NO_HASH]
            _set_add(self._tab, self._mask, self._shift, held, np.empty(len(held), dtype=bool))

    def __len__(self) -> int:
        return self.count

    def contains_many(self, keys: np.ndarray) -> np.ndarray:
        """Membership of each key (int64 array; bool array)."""
        out = np.empty(len(keys), dtype=bool)
        _lru_contains(self._tab, self._mask, self._shift, keys, out)
        return out

    def reserve(self, n: int) -> None:
        """Room for ``n`` more keys (the table stays at most half full)."""
        if 2 * (self.count + n) > self._mask + 1:
            self._resize(4 * (self.count + n))

    def add_many(self, keys: np.ndarray) -> np.ndarray:
        """Add keys (int64 array; held ones stay). Returns the bool mask of the keys added:
        each one not held before, at its first occurrence."""
        self.reserve(len(keys))
        new = np.empty(len(keys), dtype=bool)
        self.count += _set_add(self._tab, self._mask, self._shift, keys, new)
        return new

    def discard_many(self, keys: np.ndarray) -> None:
        """Remove keys (int64 array; absent ones are ignored)."""
        self.count -= _pair_discard(self._tab, self._mask, self._shift, keys)


@kernel("i8(i8[:], i8, i8, i8[:], b1[:])", depends=(hash_tables,))
def _set_add(tab, mask, shift, keys, new):  # pragma: no cover (compiled)
    n = 0
    nk = keys.shape[0]
    for i in range(nk):
        if i + D < nk:
            prefetch(tab, 2 * _home(keys[i + D], shift))
        s = _pair_probe(tab, mask, shift, keys[i])
        new[i] = tab[2 * s] != keys[i]
        if new[i]:
            tab[2 * s] = keys[i]
            n += 1
    return n


@kernel("i8(i8[:], i8, i8, i8[:], i8, i8, i8[:], i8[:])", depends=(hash_tables,))
def queue_absent(htab, hmask, hshift, stab, smask, sshift, keys, out):  # pragma: no cover
    """The keys neither in the LRU table ``htab`` nor in the set table ``stab``, each added to
    the set, in order, into ``out`` (each once); returns how many (the set has room)."""
    m = 0
    n = keys.shape[0]
    for i in range(n):
        if i + D < n:
            prefetch(htab, 2 * _home(keys[i + D], hshift))
            prefetch(stab, 2 * _home(keys[i + D], sshift))
        key = keys[i]
        if htab[2 * _pair_probe(htab, hmask, hshift, key)] == key:
            continue
        s = _pair_probe(stab, smask, sshift, key)
        if stab[2 * s] != key:
            stab[2 * s] = key
            out[m] = key
            m += 1
    return m


class ARCStore:
    """Adaptive Replacement Cache (Megiddo & Modha, FAST 2003): recency list T1, frequency list
    T2, ghost lists B1/B2 steering the target size ``p`` of T1. Capacity in pages."""

    def __init__(self, capacity_pages: int):
        self.capacity = int(capacity_pages)
        self.t1: OrderedDict[int, None] = OrderedDict()
        self.t2: OrderedDict[int, None] = OrderedDict()
        self.b1: OrderedDict[int, None] = OrderedDict()
        self.b2: OrderedDict[int, None] = OrderedDict()
        self.p = 0
        self.peak = 0

    def __contains__(self, key: int) -> bool:
        return key in self.t1 or key in self.t2

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def missing(self, keys: list[int]) -> list[int]:
        """The keys in neither T1 nor T2, in order."""
        t1, t2 = self.t1, self.t2
        return [k for k in keys if not (k in t1 or k in t2)]

    def contains_many(self, keys: np.ndarray) -> np.ndarray:
        """Membership of each key in T1 or T2 (``keys``: int64 array; bool array)."""
        t1, t2 = self.t1, self.t2
        return np.fromiter((k in t1 or k in t2 for k in keys.tolist()), dtype=bool, count=len(keys))

    def insert_many(self, keys: list[int]) -> list[int]:
        """Insert pages in order; returns those evicted."""
        out = []
        for k in keys:
            out.extend(self.insert(k))
        return out

    def not_held(self, keys: np.ndarray) -> np.ndarray:
        """The keys in neither T1 nor T2, in order (int64 arrays)."""
        return np.asarray(self.missing(keys.tolist()), dtype=np.int64)

    def insert_array(self, keys: np.ndarray) -> np.ndarray:
        """:meth:`insert_many` on an int64 array; returns the evicted pages as an int64 array."""
        return np.asarray(self.insert_many(keys.tolist()), dtype=np.int64)

    def touch(self, key: int) -> None:
        """A hit: move the page to the MRU end of T2."""
        if key in self.t1:
            del self.t1[key]
            self.t2[key] = None
        elif key in self.t2:
            self.t2.move_to_end(key)

    def touch_many(self, keys) -> None:
        """:meth:`touch` each of ``keys`` (int64 array or list) in order."""
        for k in np.asarray(keys, dtype=np.int64).tolist():
            self.touch(k)

    def _replace(self, key_in_b2: bool) -> int:
        if self.t1 and (len(self.t1) > self.p or (key_in_b2 and len(self.t1) == self.p)):
            k = self.t1.popitem(last=False)[0]
            self.b1[k] = None
        else:
            k = self.t2.popitem(last=False)[0]
            self.b2[k] = None
        return k

    def insert(self, key: int) -> list[int]:
        """Insert a page (a miss) and return the pages evicted from T1/T2."""
        c = self.capacity
        if key in self:
            self.touch(key)
            return []
        if c <= 0:
            return [key]
        out = []
        if key in self.b1:
            self.p = min(c, self.p + max(len(self.b2) // max(len(self.b1), 1), 1))
            if len(self) >= c:
                out.append(self._replace(False))
            del self.b1[key]
            self.t2[key] = None
        elif key in self.b2:
            self.p = max(0, self.p - max(len(self.b1) // max(len(self.b2), 1), 1))
            if len(self) >= c:
                out.append(self._replace(True))
            del self.b2[key]
            self.t2[key] = None
        else:
            l1 = len(self.t1) + len(self.b1)
            if l1 == c:
                if len(self.t1) < c:
                    self.b1.popitem(last=False)
                    out.append(self._replace(False))
                else:
                    out.append(self.t1.popitem(last=False)[0])
            elif l1 < c and l1 + len(self.t2) + len(self.b2) >= c:
                if l1 + len(self.t2) + len(self.b2) == 2 * c and self.b2:
                    self.b2.popitem(last=False)
                if len(self) >= c:
                    out.append(self._replace(False))
            self.t1[key] = None
        if len(self) > self.peak:
            self.peak = len(self)
        return out


def make_store(replacement: str, capacity_pages: int):
    """A page store with the named replacement policy."""
    if replacement == "lru":
        return LRUStore(capacity_pages)
    if replacement == "arc":
        return ARCStore(capacity_pages)
    raise ConfigError(f"tiers.replacement={replacement!r}; expected one of {list(REPLACEMENTS)}")
