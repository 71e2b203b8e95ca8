"""Host and disk tiers below the GPU block pool, cold-page codecs and the links between them.

Hierarchy (design.md section 3; vLLM CPU offloading, LMCache, SGLang HiCache): GPU -> host
(pinned DRAM over PCIe) -> disk (NVMe). A page (one block: all layers' K and V of ``block_size``
tokens) leaving the GPU is encoded by the cold-page codec; host and disk hold the same encoded
page, so host -> disk copies raw bytes. It is decoded when it returns to the GPU.

Cold page bytes (:func:`cold_page_bytes`), per block of ``B`` tokens with ``V`` cached values,
from the codec's format (:mod:`sim.codecs`, which cites the formats):

* ``identity``: the hot record as the GPU stores it (``V x hot_bytes``, or the FP8 / NVFP4
  record of ``cache.kv_cache_dtype`` with its scales).
* ``fp8`` (E4M3, from a 16-bit hot cache): ``V x 1``, plus one FP32 scale per
  ``codec.fp8_scale_block`` values of a row when set, plus one FP32 per tensor (layer x K/V)
  with ``codec.tensor_scale=page`` (``layer``: the scale is the layer's, in no page).
* ``nvfp4``: 4-bit E2M1 values + one E4M3 scale per 16 values = ``V x 0.5625`` bytes (seed 001:
  43.75% smaller than an FP8 page, 71.875% smaller than BF16), plus the FP32 tensor scales as
  for fp8. Needs rows (head dims) in multiples of 16.
* ``keep_rope_hot``: K's RoPE part (``rope_dim`` of each K head; MLA's ``qk_rope_head_dim``)
  stays at hot precision.
* Each section of the page (values, block scales, tensor scales, hot RoPE part) is padded to
  ``codec.align_bytes``.

Replacement (``tiers.replacement``): ``lru``, or ``arc`` (Megiddo & Modha, FAST 2003; as vLLM's
CPU offload manager offers). Pages of one request are inserted deepest block first, so the
shallow blocks of a prefix chain are the most recent and a chain is evicted leaf first: no
unreachable descendants are kept while their parent is gone (for pages inserted together).

Write policies: ``write_back`` copies a cached GPU block's page down when the allocator evicts
it, and the block is not overwritten before that copy lands: the engine holds the step that
reuses it (and onboarding copies into it) until then (:meth:`TierManager.write_back`; SGLang
HiCache, ``HiRadixCache.evict`` with ``write_policy="write_back"``, waits for its writes before
freeing device memory); ``write_through`` and ``write_through_selective`` copy blocks that stay
on the GPU, asynchronously.

Links are FIFO queues with capacity 1 (one per direction: PCIe host-to-device, device-to-host,
disk read, disk write), so transfers queue and contend, through arithmetic reservations
(:meth:`Link.reserve`: a capacity-1 FIFO resource's times, without its events); an onboarding
request's process waits on its batches' timeouts, an offload lands at its batch's end. A batch
of ``n`` pages of ``b`` bytes takes ``overhead + n x b / bandwidth`` (PCIe: 14 us per issued
copy, 55 GB/s each way, measured on this workplace's H200, design.md; disk: latency per I/O +
bytes / bandwidth, defaults for one NVMe Gen4 drive: 7 GB/s read, 5 GB/s write, 80 us per I/O
from vendor sheets).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .block_pool import NO_HASH, PrefixTable, _home, _pair_delete, _pair_discard, _pair_probe
from .clock import exact_delays
from .errors import ConfigError
from .hardware import GIB, dtype_bytes, kv_bytes_per_block
from .jit import PREFETCH_AHEAD, kernel, prefetch

D = PREFETCH_AHEAD  # (kernels fetch key i + D's table slot while on key i)
from .metrics import TransferLog

CODECS = ("identity", "fp8", "nvfp4")
REPLACEMENTS = ("lru", "arc")
WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")


def cold_page_bytes(model, cache, codec) -> int:
    """Bytes of one encoded (cold) page; see the module docstring (``fp8`` and ``nvfp4``:
    :func:`sim.cold_pages.cold_page_layout`'s ``page_bytes``). Raises ConfigError when the codec
    cannot express the model's cache (NVFP4 rows not multiples of 16, FP8/NVFP4 from a cache
    that is not 16-bit) or a codec field is out of range."""
    from .cold_pages import cold_page_layout

    name = codec.name
    if name not in CODECS:
        raise ConfigError(f"codec.name={name!r}; expected one of {list(CODECS)}")
    if name == "identity":  # (the hot record as the GPU stores it, scales included)
        return kv_bytes_per_block(model, cache)
    return cold_page_layout(model, cache, codec)["page_bytes"]


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


@kernel("i8(i8[:], i8, i8, i8[:], i8[:], i8, i8[:], i8[:])")
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


@kernel("i8(i8[:], i8, i8, i8[:], i8[:], i8[:])")
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


@kernel("void(i8[:], i8, i8, i8[:], b1[:])")
def _lru_contains(tab, mask, shift, keys, out):  # pragma: no cover (compiled)
    n = keys.shape[0]
    for i in range(n):
        if i + D < n:
            prefetch(tab, 2 * _home(keys[i + D], shift))
        out[i] = tab[2 * _pair_probe(tab, mask, shift, keys[i])] == keys[i]


@kernel("i8(i8[:], i8, i8, i8[:], i8[:])")
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


@kernel("i8(i8[:], i8, i8, i8[:], i8, i8, i8[:], i8, i8, b1, i8[:], b1, i8[:], i1[:])")
def _locate_pages(gtab, gmask, gshift, htab, hmask, hshift, dtab, dmask, dshift,
                  has_disk, q, stop, blk, code):  # pragma: no cover (compiled)
    """:meth:`TierManager.locate` on the arrays: for each key of ``q`` its GPU block (the
    prefix-index table ``gtab`` of a :class:`sim.block_pool.PrefixTable`, which holds live
    entries only) or -1 into ``blk`` and the fastest tier holding it (0 GPU, 1 host, 2 disk,
    -1 none) into ``code``. With ``stop`` it ends at the first key held nowhere and returns its
    index, else it returns ``len(q)``."""
    n = q.shape[0]
    for i in range(n):
        if i + D < n:  # (the GPU and host slots: most keys are looked up in both)
            prefetch(gtab, 2 * _home(q[i + D], gshift))
            prefetch(htab, 2 * _home(q[i + D], hshift))
        key = q[i]
        b = -1
        s = _pair_probe(gtab, gmask, gshift, key)
        if gtab[2 * s] == key:
            b = gtab[2 * s + 1]
        blk[i] = b
        if b >= 0:
            code[i] = 0
        elif htab[2 * _pair_probe(htab, hmask, hshift, key)] == key:
            code[i] = 1
        elif has_disk and dtab[2 * _pair_probe(dtab, dmask, dshift, key)] == key:
            code[i] = 2
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


@kernel("i8(i8[:], i8, i8, i8[:], b1[:])")
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


@kernel("i8(i8[:], i8, i8, i8[:], i8, i8, i8[:], i8[:])")
def _queue_absent(htab, hmask, hshift, stab, smask, sshift, keys, out):  # pragma: no cover
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


class Link:
    """A transfer link: FIFO, one batch at a time, ``overhead_s + bytes / bandwidth`` per batch.

    Batches queue arithmetically (:meth:`reserve`: the times of a capacity-1 FIFO resource,
    without its events): an offload or demotion lands through one timeout at its end, and an
    onboarding process waits for each of its batches with one timeout.

    Args:
        name: for records; bandwidth_Bps: bytes/s (> 0); overhead_s: fixed cost per batch
            (per issued copy or I/O).
    """

    def __init__(self, name: str, bandwidth_Bps: float, overhead_s: float):
        if bandwidth_Bps <= 0:
            raise ConfigError(f"link {name}: bandwidth {bandwidth_Bps} B/s; expected > 0")
        if overhead_s < 0:
            raise ConfigError(f"link {name}: overhead {overhead_s} s; expected >= 0")
        self.name = name
        self.bw = float(bandwidth_Bps)
        self.overhead = float(overhead_s)
        self.free_at = float("-inf")  # when the last reserved batch ends

    def reserve(self, now: float, dur: float) -> tuple[float, float]:
        """Queue one batch of ``dur`` seconds issued at ``now`` behind the batches already
        reserved: returns its ``(start, end)``, ``end = start + dur`` (the value a SimPy timeout
        from ``start`` reaches). The same times as a capacity-1 FIFO resource."""
        start = now if now >= self.free_at else self.free_at
        end = start + dur
        self.free_at = end
        return start, end

    def duration(self, nbytes: float) -> float:
        """Seconds one batch of ``nbytes`` occupies the link."""
        return self.overhead + nbytes / self.bw


def tier_capacity_pages(gib: float, page_bytes: int, field: str) -> int:
    """Pages of ``page_bytes`` that fit in ``gib`` GiB; ConfigError if ``gib`` is negative or
    so large that the page count does not fit the stores' int64 counters (pages >= 2**62)."""
    if not (0 <= gib < float("inf")):
        raise ConfigError(f"{field}={gib}; expected a finite capacity >= 0 GiB")
    nbytes = gib * GIB  # (inf for a finite gib near the float64 limit)
    if nbytes == float("inf") or nbytes // page_bytes >= 1 << 62:
        most = ((1 << 62) - 1) * page_bytes / GIB
        raise ConfigError(f"{field}={gib}: {nbytes / page_bytes:.3g} pages of {page_bytes} B; "
                          f"expected at most {most:.3g} GiB (2**62 pages; any capacity above the "
                          f"trace's unique pages already holds them all)")
    return int(nbytes // page_bytes)


def codec_time(codec_name: str, hot_bytes: float, cold_bytes: float, hbm_Bps: float) -> float:
    """Analytic GPU time to encode or decode pages: read one side and write the other at HBM
    bandwidth (the quantisation arithmetic rides the memory traffic). 0 for ``identity``."""
    if codec_name == "identity":
        return 0.0
    return (hot_bytes + cold_bytes) / hbm_Bps


__all__ = [
    "CODECS", "REPLACEMENTS", "WRITE_POLICIES", "cold_page_bytes", "LRUStore", "ARCStore", "make_store", "Link",
    "tier_capacity_pages", "codec_time", "dtype_bytes",
]


GPU, HOST, DISK = 0, 1, 2
REMOTE = 3  # a cluster's shared store (sim.kv_store), below host and disk


def _joined(parts: list) -> np.ndarray:
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
        self.host_pages = tier_capacity_pages(tiers.host_gib, self.cold, "tiers.host_gib")
        self.disk_pages = tier_capacity_pages(tiers.disk_gib, self.cold, "tiers.disk_gib")
        self.host = make_store(tiers.replacement, self.host_pages)
        self.disk = make_store(tiers.replacement, self.disk_pages) if self.disk_pages > 0 else None
        pcie = float(tiers.pcie_gbps if tiers.pcie_gbps is not None else gpu.pcie_bandwidth_gbps) * 1e9
        pcie_o = float(tiers.pcie_overhead_s if tiers.pcie_overhead_s is not None else gpu.pcie_overhead_s)
        self.h2d = Link("h2d", pcie, pcie_o)
        self.d2h = Link("d2h", pcie, pcie_o)
        self.disk_read = Link("disk_read", float(tiers.disk_read_gbps) * 1e9, float(tiers.disk_latency_s))
        self.disk_write = Link("disk_write", float(tiers.disk_write_gbps) * 1e9, float(tiers.disk_latency_s))
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
    def _copy_time(self, pages: int, link: "Link", fused_op: str, plain_op: str) -> float:
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
            m = _locate_pages(idx.tab, idx.mask, idx.shift,
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
        p = _joined(self.pending)
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
            m = _queue_absent(host._tab, host._mask, host._shift, inflight._tab, inflight._mask,
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
            d = _joined(self.pending_demote)
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
