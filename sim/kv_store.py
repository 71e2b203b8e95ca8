"""A KV store shared by a cluster's replicas, below each replica's host and disk tiers.

The rule modelled is a hash-keyed pool of immutable KV pages that every engine of a cluster
reads and writes over its own network link: Mooncake Store (kvcache-ai/Mooncake,
doc/en/mooncake-store.md: objects keyed by a hash are immutable once put, evicted by an
approximate LRU; transfers by the Transfer Engine over (GPUDirect) RDMA) as vLLM's
MooncakeStoreConnector uses it ("multiple vLLM instances share cached KV blocks through the store
using block-hash deduplication"), and LMCache's remote backend.

* **What the store receives** (write-through of full blocks): every full block a replica
  registers in its GPU prefix cache (prompt blocks, generated blocks, blocks it onboarded) is
  put once, at the end of the engine step that registered it (its KV is computed then), unless
  the store holds it or a put of it is on its way from any replica. Pages of one step are put
  deepest block first, so a prefix's shallow blocks end most recent. A put is encoded with the
  store's codec on the GPU and sent over the replica's link; the page enters the store when its
  batch lands (LRU or ARC replacement, :func:`sim.tiers.make_store`).
* **Lookups**: a replica's prefix walk goes GPU, its host, its disk, then the store (code
  :data:`sim.tiers.REMOTE`): the blocks held by none of its own tiers but by the store are
  fetched, only those (as vLLM-Ascend's KV Cache Pool guide describes its MooncakeStoreConnector:
  the engine checks its on-chip prefix hit first and gets only the extra blocks from the pool).
* **Fetches** go over the replica's link straight into its GPU blocks (GPUDirect RDMA, as the
  Transfer Engine does), decoded on arrival, in batches of ``tiers.transfer_batch_pages``,
  concurrently with the replica's host/disk onboarding of the same admission; they are on the
  request's TTFT path (``onboard_s``; the fetch alone: ``onboard_remote_s``). A page is read as
  located at admission (a store eviction while the fetch queues does not cancel it).
* **Links**: one per replica and direction (put: GPU to store; get: store to GPU), FIFO with
  capacity 1 like the host/disk links (:class:`sim.tiers.Link`): a batch of ``n`` pages of ``b``
  bytes occupies it ``max(latency + n b / bandwidth, latency + codec time)`` seconds (the codec
  rides the transfer, as the PCIe copies' analytic time, :func:`sim.tiers.codec_time`). The
  store side is not a bottleneck (Mooncake stripes objects over many nodes' NICs).

Bytes: ``page_bytes`` of the store's codec (:func:`sim.tiers.cold_page_bytes`); capacity in
pages = ``capacity_gib x 2**30 // page_bytes``.
"""

from __future__ import annotations

import math

import numpy as np

from .clock import exact_delays
from .errors import ConfigError
from .metrics import TransferLog
from .tiers import CODECS, REPLACEMENTS, KeySet, Link, codec_time, make_store


def validate_store(store) -> None:
    """ConfigError naming the field when the ``cluster.store`` node is not usable:
    ``enabled`` a boolean, ``capacity_gib`` finite and > 0, ``replacement`` lru | arc, ``codec``
    null or a codec name, ``net_gbps`` finite and > 0, ``net_latency_s`` finite and >= 0."""
    if not isinstance(store.enabled, bool):
        raise ConfigError(f"cluster.store.enabled={store.enabled!r}; expected true or false")
    for f, lo, strict in (("capacity_gib", 0.0, True), ("net_gbps", 0.0, True),
                          ("net_latency_s", 0.0, False)):
        v = getattr(store, f)
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and \
            (v > lo if strict else v >= lo)
        if not ok:
            raise ConfigError(f"cluster.store.{f}={v!r}; expected a finite number "
                              f"{'>' if strict else '>='} {lo:g}")
    if store.replacement not in REPLACEMENTS:
        raise ConfigError(f"cluster.store.replacement={store.replacement!r}; expected one of "
                          f"{list(REPLACEMENTS)}")
    if store.codec is not None and store.codec not in CODECS:
        raise ConfigError(f"cluster.store.codec={store.codec!r}; expected null (the run's "
                          f"codec.name) or one of {list(CODECS)}")


class StoreTransferLog(TransferLog):
    """A replica's store transfers: ``gpu_to_store`` (puts) and ``store_to_gpu`` (fetches),
    tier ``remote``; the codec column is the store's codec."""

    DIRECTIONS = ("gpu_to_store", "store_to_gpu")
    TIERS = ("remote",)


class SharedStore:
    """The pages a cluster's replicas share (module docstring).

    Args: capacity_pages: pages it holds (>= 1); replacement: lru | arc; page_bytes: bytes of
    one page in the store's codec; codec: that codec's name; hot_page_bytes: bytes of one GPU
    block; hbm_Bps: HBM bandwidth (bytes/s) for the codec's time; net_Bps: each replica's
    link bandwidth (bytes/s, each direction); net_latency_s: per batch (s).

    ``watchers``: one callable per replica, called with an int64 array of keys whose membership
    changed (landed or evicted), so that the replica's memoised prefix walk is revalidated.
    ``audit``: None, or a list that receives ``("put", replica, keys)`` when a put batch lands
    and ``("get", replica, keys)`` when a fetch batch lands (tests read it)."""

    def __init__(self, capacity_pages: int, replacement: str, page_bytes: int, codec: str,
                 hot_page_bytes: int, hbm_Bps: float, net_Bps: float, net_latency_s: float):
        self.capacity = int(capacity_pages)
        self.pages = make_store(replacement, self.capacity)
        self.replacement = replacement
        self.page_bytes = int(page_bytes)
        self.codec = codec
        self.hot = int(hot_page_bytes)
        self.hbm = float(hbm_Bps)
        self.net_Bps = float(net_Bps)
        self.latency = float(net_latency_s)
        self.inflight = KeySet()  # pages whose put batch has not landed
        self.watchers: list = []
        self.audit: list | None = None
        self.pages_put = 0
        self.pages_got = 0
        self.pages_evicted = 0

    def __len__(self) -> int:
        return len(self.pages)

    @property
    def peak(self) -> int:
        """The most pages held at once."""
        return int(self.pages.peak)

    def contains_many(self, keys: np.ndarray) -> np.ndarray:
        """Whether the store holds each of ``keys`` (int64 array; bool array). A page on its
        way (put, not landed) is not held."""
        return self.pages.contains_many(np.ascontiguousarray(keys, dtype=np.int64))

    def claim(self, keys: np.ndarray) -> np.ndarray:
        """The pages among ``keys`` (int64 array) neither held nor on their way, each once, in
        order; they are on their way from now on (the caller puts them)."""
        new = self.pages.not_held(np.ascontiguousarray(keys, dtype=np.int64))
        if len(new):
            new = new[self.inflight.add_many(new)]
        return new

    def land(self, keys: np.ndarray, replica: int) -> None:
        """A put batch of ``keys`` (int64 array) from ``replica`` lands: the pages enter the
        store in order (evicting the least recently used beyond the capacity)."""
        self.inflight.discard_many(keys)
        ev = self.pages.insert_array(keys)
        self.pages_put += len(keys)
        self.pages_evicted += len(ev)
        if self.audit is not None:
            self.audit.append(("put", replica, keys.copy()))
        changed = keys if not len(ev) else np.concatenate([keys, ev])
        for w in self.watchers:
            w(changed)

    def touch(self, keys: np.ndarray) -> None:
        """A hit on held pages (``keys``: in block order): refreshed deepest first, so the
        shallow blocks end most recent."""
        if len(keys):
            self.pages.touch_many(keys[::-1])

    def summary(self) -> dict:
        """``summary.json``'s ``cluster.store``: settings, pages and bytes moved."""
        return {"capacity_pages": self.capacity, "page_bytes": self.page_bytes,
                "codec": self.codec, "replacement": self.replacement,
                "net_gbps": self.net_Bps / 1e9, "net_latency_s": self.latency,
                "peak_pages": self.peak, "pages_held_at_end": len(self),
                "pages_put": self.pages_put, "pages_evicted": self.pages_evicted,
                "pages_fetched": self.pages_got,
                "bytes_put": self.pages_put * self.page_bytes,
                "bytes_fetched": self.pages_got * self.page_bytes}


class StoreLink:
    """Replica ``replica``'s network link to ``store`` in ``env``: puts (:meth:`put`,
    :meth:`flush`) and fetches (:meth:`fetch`), in batches of ``batch_pages``, each direction a
    FIFO :class:`sim.tiers.Link`; every batch is recorded in ``records``."""

    def __init__(self, env, store: SharedStore, replica: int, batch_pages: int):
        self.env = env
        self.store = store
        self.replica = int(replica)
        self.batch = int(batch_pages)
        self.write = Link(f"store_put[{replica}]", store.net_Bps, store.latency)
        self.read = Link(f"store_get[{replica}]", store.net_Bps, store.latency)
        self.pending: list[np.ndarray] = []
        self.records = StoreTransferLog(store.codec)
        self._memo: dict = {}

    def batch_time(self, pages: int) -> float:
        """Seconds one batch of ``pages`` occupies the link (either direction): the transfer,
        or the latency plus the codec's encode/decode time when that is longer."""
        t = self._memo.get(pages)
        if t is None:
            s = self.store
            t_link = self.write.duration(pages * s.page_bytes)
            t_codec = s.latency + codec_time(s.codec, pages * s.hot, pages * s.page_bytes, s.hbm)
            t = self._memo[pages] = max(t_link, t_codec)
        return t

    def put(self, keys: np.ndarray) -> None:
        """Queue the pages among ``keys`` (int64 array, in put order) that the store neither
        holds nor receives already; :meth:`flush` sends them."""
        new = self.store.claim(keys)
        if len(new):
            self.pending.append(new)

    def flush(self) -> None:
        """Send the queued puts now, in batches."""
        if not self.pending:
            return
        p = self.pending[0] if len(self.pending) == 1 else np.concatenate(self.pending)
        self.pending = []
        env = self.env
        for lo in range(0, len(p), self.batch):
            chunk = p[lo:lo + self.batch]
            now = env.now
            dur = self.batch_time(len(chunk))
            start, end = self.write.reserve(now, dur)
            self._at(end, self._landed, chunk, start, dur, now)

    def _landed(self, keys, start, dur, queued) -> None:
        self.records.append(start, "gpu_to_store", "remote", len(keys),
                            len(keys) * self.store.page_bytes, dur, start - queued)
        self.store.land(keys, self.replica)

    def fetch(self, keys: np.ndarray, out: dict):
        """SimPy process: read ``keys`` (int64 array) from the store into the GPU in batches,
        each queued on the read link; sets ``out["onboard_remote_s"]`` (s, queueing included)."""
        env = self.env
        t0 = env.now
        s = self.store
        for lo in range(0, len(keys), self.batch):
            chunk = keys[lo:lo + self.batch]
            q = env.now
            dur = self.batch_time(len(chunk))
            start, end = self.read.reserve(q, dur)
            for d in exact_delays(q, end):
                yield env.timeout(d)
            self.records.append(start, "store_to_gpu", "remote", len(chunk),
                                len(chunk) * s.page_bytes, dur, start - q)
            s.pages_got += len(chunk)
            if s.audit is not None:
                s.audit.append(("get", self.replica, chunk.copy()))
        out["onboard_remote_s"] = env.now - t0

    def _at(self, end: float, fn, *args) -> None:
        """Call ``fn(*args)`` when the clock reaches exactly ``end`` (s, >= now)."""
        env = self.env
        d = exact_delays(env.now, end)
        if len(d) == 1:
            env.timeout(d[0]).callbacks.append(lambda _e: fn(*args))
        else:
            env.timeout(d[0]).callbacks.append(lambda _e: self._at(end, fn, *args))


def build_store(cfg, hot_page_bytes: int):
    """The run's :class:`SharedStore` from ``cfg.cluster.store``, or None when it is off.
    Raises ConfigError (one line naming the field) for a bad store node, a store with fewer
    than 2 replicas, without prefix caching, with ``tiers.load_or_recompute`` (which weighs
    disk pages only), or whose capacity holds no page."""
    from .tiers import cold_page_bytes, tier_capacity_pages

    st = cfg.cluster.store
    validate_store(st)
    if not st.enabled:
        return None
    n = cfg.cluster.replicas
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ConfigError(f"cluster.store.enabled=true with cluster.replicas={n!r}; expected "
                          f"replicas >= 2 (a store shared by replicas)")
    if not cfg.cache.enable_prefix_caching:
        raise ConfigError("cluster.store.enabled=true needs cache.enable_prefix_caching=true "
                          "(the store holds blocks by their prefix keys)")
    if cfg.tiers.load_or_recompute:
        raise ConfigError("cluster.store.enabled=true with tiers.load_or_recompute=true; expected "
                          "tiers.load_or_recompute=false (it weighs disk pages only, not the store's)")
    codec = cfg.codec
    if st.codec is not None and st.codec != codec.name:
        from omegaconf import OmegaConf

        codec = OmegaConf.merge(codec, {"name": st.codec})
    page = cold_page_bytes(cfg.model, cfg.cache, codec)
    pages = tier_capacity_pages(float(st.capacity_gib), page, "cluster.store.capacity_gib")
    if pages < 1:
        raise ConfigError(f"cluster.store.capacity_gib={st.capacity_gib} holds no page of {page} "
                          f"bytes ({codec.name}); expected at least {page / 2**30:.6f} GiB")
    hbm = float(cfg.gpu.hbm_bandwidth_gbps) * 1e9 * float(cfg.cost.mbu)
    return SharedStore(pages, str(st.replacement), page, str(codec.name), hot_page_bytes, hbm,
                       float(st.net_gbps) * 1e9, float(st.net_latency_s))


def add_remote_hit_ratios(summary: dict, req) -> None:
    """Add ``hit_ratio.remote`` and ``hit_ratio_mean_per_request.remote`` to ``summary`` from
    the requests table ``req`` (its ``hit_tokens_remote`` over the finished requests' prompt
    tokens, as :func:`sim.metrics.summarize` does for the other tiers)."""
    fin = req[req["status"] == "finished"]
    prompt = float(fin["input_tokens"].sum())
    remote = float(fin["hit_tokens_remote"].sum())
    summary["hit_ratio"]["remote"] = remote / prompt if prompt > 0 else None
    summary["hit_ratio_mean_per_request"]["remote"] = (
        float((fin["hit_tokens_remote"] / fin["input_tokens"]).mean()) if len(fin) else None)
