"""Prefill/decode disaggregation: a cluster's prefill replicas hand each request's KV to a
decode replica over a network link (:class:`sim.cluster.Cluster` with
``cluster.pd.prefill_replicas > 0``).

The flow is vLLM's disaggregated serving with the NIXL connector, which NVIDIA Dynamo's
disaggregated serving also runs (docs.nvidia.com/dynamo, "Dynamo Disaggregation": the prefill
engine computes the KV, it is transferred from the prefill engine's VRAM to the decode
engine's, the decode engine decodes):

1. The prefill pool's router (``cluster.router``) picks a prefill replica at the arrival; it
   serves the request with one output token (vLLM's proxy, tests/v1/kv_connector/
   nixl_integration/toy_proxy_server.py, sends the prefill request with ``max_tokens=1`` and
   ``do_remote_decode``), its prefix cache and scheduler as any replica's.
2. When that token is sampled, the decode pool's router (``cluster.pd.decode_router``) picks
   a decode replica (the proxy picks it once the prefill has answered). The prefill replica
   keeps the request's blocks (the NIXL connector's ``request_finished`` delays their free)
   until the decode replica has read them.
3. The decode replica queues the request; its admission takes its local prefix hit and
   allocates blocks for the rest of the prompt (it waits at the head of the queue while the
   free blocks are short), then pulls those blocks' KV over the link
   (:meth:`sim.scheduler.Scheduler.admit_remote`). When they land, its full prompt blocks are
   registered in its prefix cache and it computes the last prompt token and decodes
   (vLLM's ``_update_waiting_for_remote_kv``); the prefill replica frees the blocks.

TTFT is the client's: from the arrival to the decode replica's first token (the proxy streams
the decode instance's answer, the prefill's one token is dropped), so it holds the prefill
queue, the prefill, the wait for the decode replica's blocks, the transfer and the decode
replica's first step.

With a compression policy the prefill replica runs the prefill-end round (TensorRT-LLM's
``on_context_step_end``, on the instance that runs the context phase) and the decode replica the
decode-time rounds: what moves is the prefill replica's block table after its round, with the
request's layout and policy state (:meth:`sim.scheduler.Scheduler.admit_remote`); the decode
replica's prefix hit covers at most the blocks that round left intact.

With host and disk tiers each replica keeps its own. A prefill replica's admission walks its
GPU, host and disk and onboards before the prefill, as a single engine's; a decode replica takes
its GPU hit only and receives the rest of a hand-off over the link (vLLM's ``MultiConnector``
loads a request from the first connector in its list that has the request's tokens; kvsim
takes the NIXL connector to be listed first on a decode instance), while its tiers take what its GPU caches and serve what it prefills
itself (preempted requests).

With the shared store (:mod:`sim.kv_store`) every replica has its link to it: each puts the
full blocks it registers (a prefill replica its prompts', a decode replica the blocks it
received and generated), and a prefill replica's walk extends into it (a prefix another prefill
replica computed is fetched over its link, on its TTFT path). A hand-off's KV is the decode
replica's GPU hit and the KV link's, as with tiers (the NIXL connector taken to be listed
first); the store
serves what a decode replica prefills itself.

Bytes: the blocks the decode replica lacks, ``page_bytes`` each (a block of ``block_size``
tokens of every layer's K and V in the run's codec, :func:`sim.tiers.cold_page_bytes`: 2,359,296
B for Qwen3-8B BF16 identity, half with fp8). Links: each replica has one network link each way
(FIFO, one transfer at a time); a transfer occupies its prefill replica's send link and its
decode replica's receive link together, from the later of the two being free, for
``max(latency + bytes / bandwidth, latency + codec time)`` (the codec's HBM time to encode and
decode, :func:`sim.tiers.codec_time`, as the shared store's batches).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .clock import exact_delays
from .errors import ConfigError
from .tiers import codec_time


def validate_pd(cfg) -> None:
    """ConfigError naming the field when the ``cluster.pd`` node of the ``cluster`` node ``cfg``
    is not usable: ``prefill_replicas`` an integer, 0 or 1 .. ``replicas - 1``;
    ``decode_router`` a known router; ``net_gbps`` finite and > 0; ``net_latency_s`` finite and
    >= 0."""
    from .routers import ROUTERS

    pd_ = cfg.pd
    p = pd_.prefill_replicas
    n = cfg.replicas
    if isinstance(p, bool) or not isinstance(p, int) or p < 0:
        raise ConfigError(f"cluster.pd.prefill_replicas={p!r}; expected an integer >= 0 "
                          f"(0: no disaggregation)")
    if p and not (isinstance(n, int) and p < n):
        raise ConfigError(f"cluster.pd.prefill_replicas={p} with cluster.replicas={n!r}; "
                          f"expected 1 .. replicas - 1 (the other replicas decode)")
    if str(pd_.decode_router) not in ROUTERS:
        raise ConfigError(f"cluster.pd.decode_router={pd_.decode_router!r}; expected one of "
                          f"{sorted(ROUTERS)}")
    for f, strict in (("net_gbps", True), ("net_latency_s", False)):
        v = getattr(pd_, f)
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v) and \
            (v > 0 if strict else v >= 0)
        if not ok:
            raise ConfigError(f"cluster.pd.{f}={v!r}; expected a finite number "
                              f"{'>' if strict else '>='} 0")


class Handoff:
    """One request's passage from a prefill replica to a decode replica.

    ``prefill_replica``, ``decode_replica``: replica indices; ``prefill``: the prefill
    replica's :class:`sim.request.Request` (it holds the blocks until the transfer lands);
    ``start``: when its prefill's token was sampled (s); ``decode_hit_tokens``: prompt tokens
    the decode replica's prefix cache served (not transferred); ``blocks``, ``bytes``: what
    crossed; ``transfer_s``: the transfer's own time on the links (s); ``landed``: whether the
    KV is in the decode replica's blocks."""

    __slots__ = ("prefill_replica", "decode_replica", "prefill", "start", "decode_hit_tokens",
                 "blocks", "bytes", "transfer_s", "landed")

    def __init__(self, prefill_replica: int, decode_replica: int, prefill, start: float):
        self.prefill_replica = prefill_replica
        self.decode_replica = decode_replica
        self.prefill = prefill
        self.start = start
        self.decode_hit_tokens = 0
        self.blocks = 0
        self.bytes = 0
        self.transfer_s = math.nan
        self.landed = False


PD_COLUMNS = ["time_s", "direction", "tier", "pages", "bytes", "duration_s", "queue_s", "codec",
              "replica", "prefill_replica", "request_id"]


class PDLinks:
    """Every replica's network link, one each way, for the KV transfers of a disaggregated
    cluster (module docstring). ``n``: replicas; ``page_bytes``: bytes of one block in
    ``codec``; ``hot_page_bytes``: bytes of one GPU block; ``hbm_Bps``: HBM bandwidth for the
    codec's time (bytes/s); ``net_Bps``: each link's bandwidth (bytes/s); ``latency_s``: per
    transfer (s). ``rows``: one per transfer, the transfers table's (:meth:`frame`)."""

    def __init__(self, n: int, page_bytes: int, codec: str, hot_page_bytes: int,
                 hbm_Bps: float, net_Bps: float, latency_s: float):
        self.page_bytes = int(page_bytes)
        self.codec = codec
        self.hot = int(hot_page_bytes)
        self.hbm = float(hbm_Bps)
        self.net_Bps = float(net_Bps)
        self.latency = float(latency_s)
        self.send_free = [-math.inf] * n
        self.recv_free = [-math.inf] * n
        self.rows: list[tuple] = []

    def duration(self, blocks: int) -> float:
        """Seconds a transfer of ``blocks`` blocks occupies its links."""
        nb = blocks * self.page_bytes
        t_link = self.latency + nb / self.net_Bps
        t_codec = self.latency + codec_time(self.codec, blocks * self.hot, nb, self.hbm)
        return max(t_link, t_codec)

    def transfer(self, env, h: Handoff, blocks: int, rid: int):
        """SimPy process body: move ``blocks`` blocks of ``h``'s request from its prefill
        replica to its decode replica, from the later of now and both links being free; sets
        ``h.blocks``, ``h.bytes``, ``h.transfer_s`` and records the row."""
        p, d = h.prefill_replica, h.decode_replica
        now = env.now
        dur = self.duration(blocks)
        start = max(now, self.send_free[p], self.recv_free[d])
        end = start + dur
        self.send_free[p] = self.recv_free[d] = end
        for dt in exact_delays(now, end):
            yield env.timeout(dt)
        h.blocks = blocks
        h.bytes = blocks * self.page_bytes
        h.transfer_s = dur
        self.rows.append((start, "prefill_to_decode", "gpu", blocks, h.bytes, dur, start - now,
                          self.codec, d, p, rid))

    def frame(self) -> pd.DataFrame:
        """The transfers table: one row per transfer in the order they landed; TRANSFER_COLUMNS
        (direction ``prefill_to_decode``, tier ``gpu``, pages = blocks) and ``replica`` (the
        decode replica), ``prefill_replica``, ``request_id``."""
        df = pd.DataFrame.from_records(self.rows, columns=PD_COLUMNS)
        return df.astype({"time_s": "float64", "direction": "string", "tier": "string",
                          "pages": "int64", "bytes": "int64", "duration_s": "float64",
                          "queue_s": "float64", "codec": "string", "replica": "int64",
                          "prefill_replica": "int64", "request_id": "int64"})

    def summary(self) -> dict:
        """``summary.json``'s ``cluster.pd`` link part: settings and totals."""
        dur = np.array([r[5] for r in self.rows], dtype=np.float64)
        q = np.percentile(dur, [50, 99]).tolist() if len(dur) else [None, None]
        return {"net_gbps": self.net_Bps / 1e9, "net_latency_s": self.latency,
                "page_bytes": self.page_bytes, "codec": self.codec,
                "transfers": len(self.rows), "blocks": int(sum(r[3] for r in self.rows)),
                "bytes": int(sum(r[4] for r in self.rows)),
                "transfer_p50_s": q[0], "transfer_p99_s": q[1]}


def with_tier_transfers(tiers: pd.DataFrame, kv: pd.DataFrame) -> pd.DataFrame:
    """One transfers table from the replicas' tier copies (``tiers``: TRANSFER_COLUMNS and
    ``replica``) and the KV transfers (``kv``: :meth:`PDLinks.frame`): every row of both,
    ordered by ``time_s`` (stable: at equal times the tier copies first, each table in its own
    order); a tier copy's ``prefill_replica`` and ``request_id`` are -1."""
    t = tiers.copy()
    t["prefill_replica"] = np.full(len(t), -1, dtype=np.int64)
    t["request_id"] = np.full(len(t), -1, dtype=np.int64)
    out = pd.concat([t[PD_COLUMNS], kv[PD_COLUMNS]], ignore_index=True)
    out = out.sort_values("time_s", kind="stable", ignore_index=True)
    return out.astype(kv.dtypes.to_dict())


def build_pd_links(cfg, hot_page_bytes: int, page_bytes: int):
    """The run's :class:`PDLinks` from ``cfg.cluster`` (None without disaggregation):
    ``hot_page_bytes``, one GPU block's bytes; ``page_bytes``, one block in the run's codec
    (:func:`sim.tiers.cold_page_bytes`)."""
    c = cfg.cluster
    validate_pd(c)
    if not int(c.pd.prefill_replicas):
        return None
    hbm = float(cfg.gpu.hbm_bandwidth_gbps) * 1e9 * float(cfg.cost.mbu)
    return PDLinks(int(c.replicas), page_bytes, str(cfg.codec.name), hot_page_bytes, hbm,
                   float(c.pd.net_gbps) * 1e9, float(c.pd.net_latency_s))
