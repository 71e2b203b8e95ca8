"""A cluster: ``cluster.replicas`` engines behind a router, in one SimPy environment.

Each replica is a :class:`sim.engine.Simulator` with its own GPU pool, scheduler and host/disk
tiers, on the run's cost model. The cluster's arrival process replays the workload's open-loop
arrivals in time order (as the single engine's does) and hands each to the replica the router
(:mod:`sim.routers`) picks at that instant; a closed-loop child goes through the router too,
after its think time. A request is served by one replica from arrival to finish (the
``replica`` column of the requests table); the steps table carries each step's replica.

Exactness. One replica (``cluster.replicas=1``) is the single engine: the same environment,
event for event (tests/test_cluster.py checks every table). With more, a router reads replica
state at each arrival, so every replica must be in the state its per-step loop would have
then. The fast-forward stretches (:mod:`sim.stretches`) commit several steps at once, so a
replica's stretch never holds a step whose end is at or after a *barrier*: each arrival's time
and each ``arrival - cluster.event_staleness_s`` (the instant up to which that arrival's router
sees KV events) (:meth:`Replica.tie_inside`, :meth:`ReplicaEnv.peek`); with a router that
reads no replica state (round_robin), only the arrivals it sends to that replica. Those instants are known
ahead for open-loop arrivals only, so when the workload has closed-loop children, or when a
replica has host/disk tiers or a shared store (whose multi-step stretches let events happen
inside them), the replicas take only the stretches that keep one SimPy timeout per step
(:attr:`sim.stretches.base.Stretch.step_clock`: the tier stretch), which need no barrier; the
summary's ``cluster.per_step_reason`` says why. Under an active compression policy the
replicas take the compression stretches only behind a router that reads no replica state
(round_robin: each replica is then a single engine fed its own arrivals); a compression
stretch may commit a step's end (an admission's round, freeing blocks) before an arrival that
lands during that step, which a router reading the replica's load or KV events would see. Either way the run is deterministic and ties go to
the lowest replica index; with fast paths the tables equal the per-step loop's bit for bit
(tests/test_cluster.py).

KV events. With a router that reads them (``prefix_aware``), each replica's pool logs the keys
its prefix index gains and loses (:attr:`sim.block_pool.BlockPool.event_log`); the replica
publishes them as one batch at the end of every engine step (or fast-forward stretch: all its
steps end on one side of every barrier, so the batches a router sees are the per-step loop's),
and the router applies a batch published at ``t`` to its :class:`sim.routers.KVView` of that
replica for the arrivals after ``t + cluster.event_staleness_s`` (strictly after, so that the
order of simultaneous events never matters).

Shared store. With ``cluster.store.enabled`` the replicas share one
:class:`sim.kv_store.SharedStore` below their host and disk tiers, each over its own
:class:`sim.kv_store.StoreLink`: a replica's full blocks are put there and its prefix walk
extends into it (the remote tier, code :data:`sim.tiers.REMOTE`). Every replica then has a tier
manager (with no host or disk capacity: the store only), so the replicas take the tier stretch
only (``per_step_reason``: a shared KV store). Each store change is logged to every replica whose
waiting head's prefix walk is memoised, so that walk equals a fresh one. The requests table
gains ``hit_tokens_remote`` (and ``hit_tokens_gpu`` no longer counts them) and
``onboard_remote_s``; ``transfers.parquet`` the store's batches (``gpu_to_store``,
``store_to_gpu``, tier ``remote``); ``summary.json`` ``hit_ratio.remote`` and ``cluster.store``.

Prefill/decode disaggregation. With ``cluster.pd.prefill_replicas = P > 0`` replicas ``0 ..
P - 1`` prefill and ``P .. replicas - 1`` decode (:mod:`sim.pd`): ``cluster.router`` routes each
arrival over the prefill pool, ``cluster.pd.decode_router`` each finished prefill over the
decode pool, and :class:`sim.pd.PDLinks` times the KV transfer between them. A prefill replica
hands a request off when its one token is sampled and holds its blocks until the transfer
lands; the decode replica records the request's row (``prefill_replica``, ``decode_replica``
and the transfer's columns instead of ``replica``). The replicas run per step
(``per_step_reason``: prefill/decode disaggregation: hand-offs and transfers land inside what
would be a stretch).
"""

from __future__ import annotations

import bisect
import functools
import heapq
import itertools
import math
from collections import deque
from types import SimpleNamespace

import numpy as np
import pandas as pd
import simpy
from simpy.core import NORMAL

from .engine import MAX_CLOCK_S, Simulator
from .errors import ConfigError
from .hardware import check_pool_host_memory
from .keys import block_keys
from .kv_store import StoreLink, validate_store
from .metrics import Recorder, _Growable
from .pd import Handoff, validate_pd
from .routers import KVView, make_router


def validate_cluster(cfg) -> None:
    """ConfigError naming the field when the ``cluster`` node is not usable: ``replicas`` an
    integer >= 1, ``router`` a known router, ``event_staleness_s`` and ``overlap_weight``
    finite and >= 0, ``store`` as :func:`sim.kv_store.validate_store` and ``pd`` as
    :func:`sim.pd.validate_pd` check them."""
    from .routers import ROUTERS

    n = cfg.replicas
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"cluster.replicas={n!r}; expected an integer >= 1 (engines)")
    if str(cfg.router) not in ROUTERS:
        raise ConfigError(f"cluster.router={cfg.router!r}; expected one of {sorted(ROUTERS)}")
    for f in ("event_staleness_s", "overlap_weight"):
        v = float(getattr(cfg, f))
        if not (math.isfinite(v) and v >= 0):
            raise ConfigError(f"cluster.{f}={getattr(cfg, f)!r}; expected a finite number >= 0")
    validate_store(cfg.store)
    validate_pd(cfg)


class ReplicaEnv(simpy.Environment):
    """One replica's handle on the cluster's environment: events it creates go into the shared
    queue (``shared``), and :meth:`peek` answers for this replica alone: its own next event,
    or the float just below the cluster's next barrier (:meth:`Cluster.next_barrier`), whichever
    is first, so that a fast-forward stretch ends with a step that ends before the barrier.
    Running the environment is the cluster's (:meth:`step` and :meth:`run` raise)."""

    def __init__(self, shared: simpy.Environment, cluster: "Cluster", peekable: bool = True,
                 index: int = 0):
        self._shared = shared
        self._cluster = cluster
        self._index = index
        self._active_proc = None
        self._own: list = []  # heap of (time, seq, event) this replica scheduled
        self._seq = itertools.count()
        self._peekable = peekable
        if not peekable:
            # (no stretch of the replica asks peek: its events go straight into the shared
            # queue, untracked)
            self.schedule = shared.schedule

    @property
    def now(self) -> float:
        return self._shared._now

    def schedule(self, event, priority=NORMAL, delay=0) -> None:
        self._shared.schedule(event, priority, delay)
        own = self._own
        while own and own[0][2].callbacks is None:  # (processed)
            heapq.heappop(own)
        heapq.heappush(own, (self._shared.now + delay, next(self._seq), event))

    def peek(self) -> float:
        if not self._peekable:
            raise RuntimeError("peek on a replica whose events are not tracked (peekable=False)")
        own = self._own
        while own and own[0][2].callbacks is None:
            heapq.heappop(own)
        t = own[0][0] if own else math.inf
        b = self._cluster.next_barrier(self._index)
        return min(t, float(np.nextafter(b, -math.inf))) if b < math.inf else t

    def step(self) -> None:
        raise RuntimeError("a replica's environment is run by its cluster")

    def run(self, until=None):
        raise RuntimeError("a replica's environment is run by its cluster")


class Replica(Simulator):
    """A :class:`Simulator` as replica ``index`` of ``cluster``: its fast-forward stretches do
    not enter a step in which one of the cluster's barriers lands (:meth:`tie_inside`)."""

    def __init__(self, cluster: "Cluster", index: int, *args, **kwargs):
        self.cluster = cluster
        self.index = index
        super().__init__(*args, **kwargs)
        if cluster.prefill_replicas:
            # hand-offs and transfer landings change the queues between any two steps
            self.candidates = ()
        elif cluster.ff_reason is not None:
            # barriers are not known ahead: only the stretches that keep one SimPy timeout per
            # step (Stretch.step_clock), which need none
            self.candidates = tuple(s for s in self.candidates if s.step_clock)

    def tie_inside(self, lo: float, end: float) -> bool:
        """Whether a barrier of the cluster lands in the step ``(lo, end]`` (s): the stretch
        ends before that step."""
        return self.cluster.barrier_in(lo, end, self.index)


class ReplicaRecorder(Recorder):
    """One replica's :class:`Recorder`, which also tells the cluster of each request done.
    With a shared store, ``remote`` holds each row's ``(hit_remote, onboard_remote_s)``."""

    def __init__(self, cluster: "Cluster", index: int, *args, store: bool = False,
                 pd: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.cluster = cluster
        self.index = index
        self.remote: list | None = [] if store else None
        self.pd: list | None = [] if pd else None

    def request_done(self, r) -> None:
        super().request_done(r)
        if self.remote is not None:
            self.remote.append((r.hit_remote, r.onboard_remote_s))
        if self.pd is not None:
            h = r.pd
            self.pd.append((self.index, -1, math.nan, 0, 0, 0, math.nan) if h is None else
                           (h.prefill_replica, h.decode_replica, h.start - r.arrival,
                            h.decode_hit_tokens, h.blocks, h.bytes, h.transfer_s))
        self.cluster.request_done(self.index, r)


class ClusterRecorder(Recorder):
    """The run's :class:`Recorder` for a cluster: after :meth:`Cluster.run` it holds every
    replica's rows and counters; its tables carry a ``replica`` column (int64). With a shared
    store the requests table also has ``hit_tokens_remote`` (int64, tokens; after the deepest
    level's ``hit_tokens_disk``, and ``hit_tokens_gpu`` excludes them) and ``onboard_remote_s``
    (s; after its ``onboard_disk_s``)."""

    replica_of: np.ndarray | None = None  # the replica of each of ``rows``
    remote: list | None = None  # (hit_remote, onboard_remote_s) of each of ``rows``
    pd: list | None = None  # prefill/decode disaggregation: PD_REQUEST_COLUMNS of each row

    def requests_frame(self) -> pd.DataFrame:
        df = super().requests_frame()  # (rows sorted by request_id, stable)
        rid = np.array([row[0] for row in self.rows], dtype=np.int64)
        order = np.argsort(rid, kind="stable")
        if self.remote is not None:
            rem = (np.array(self.remote, dtype=np.float64).reshape(-1, 2)[order]
                   if len(self.remote) else np.empty((0, 2)))
            hit = rem[:, 0].astype(np.int64)
            df["hit_tokens_gpu"] = df["hit_tokens_gpu"] - hit
            last = self.levels[-1]  # (after the deepest level's columns)
            df.insert(df.columns.get_loc(f"hit_tokens_{last}") + 1, "hit_tokens_remote", hit)
            df.insert(df.columns.get_loc(f"onboard_{last}_s") + 1, "onboard_remote_s", rem[:, 1])
        if self.pd is not None:
            cols = list(zip(*self.pd)) if self.pd else [()] * len(PD_REQUEST_COLUMNS)
            for (name, dtype), col in zip(PD_REQUEST_COLUMNS, cols):
                df[name] = np.asarray(col, dtype=dtype)[order]
            return df
        df["replica"] = self.replica_of[order]
        return df


# the requests table's columns with prefill/decode disaggregation (instead of ``replica``):
# the prefill and decode replica (-1: none, a request rejected at its prefill replica), the
# prefill replica's token since the arrival (s), the prompt tokens the decode replica's prefix
# cache served, the blocks and bytes the KV transfer moved and its time on the links (s)
PD_REQUEST_COLUMNS = [("prefill_replica", np.int64), ("decode_replica", np.int64),
                      ("prefill_done_s", np.float64), ("decode_hit_tokens", np.int64),
                      ("kv_transfer_blocks", np.int64), ("kv_transfer_bytes", np.int64),
                      ("kv_transfer_s", np.float64)]


class ClusterTiers:
    """The replicas' tier managers seen as one for the run's summary: bytes moved summed,
    capacities of one replica, peaks the highest replica's, transfers of all (``replica``
    column; with a shared store its batches too)."""

    def __init__(self, tms: list):
        t0 = tms[0]
        self.tms = tms
        self.codec = t0.codec
        self.names = t0.names
        self.capacity = t0.capacity
        self.bytes_offloaded = {k: sum(t.bytes_offloaded[k] for t in tms) for k in t0.bytes_offloaded}
        self.bytes_onboarded = {k: sum(t.bytes_onboarded[k] for t in tms) for k in t0.bytes_onboarded}
        self.stores = [SimpleNamespace(peak=max(t.stores[i].peak for t in tms))
                       for i in range(len(t0.stores))]
        self.records = _ClusterTransfers(tms)


class _ClusterTransfers:
    """Every replica's transfer records, replica after replica: its host/disk batches, then
    its shared-store batches."""

    def __init__(self, tms):
        self.logs = [(r, log) for r, t in enumerate(tms)
                     for log in ((t.records,) if t.store is None else (t.records, t.store.records))]

    def __len__(self) -> int:
        return sum(len(log) for _, log in self.logs)

    def __iter__(self):
        for _, log in self.logs:
            yield from log

    def frame(self) -> pd.DataFrame:
        parts = []
        for r, log in self.logs:
            f = log.frame()
            f["replica"] = np.full(len(f), r, dtype=np.int64)
            parts.append(f)
        return pd.concat(parts, ignore_index=True)


class Cluster:
    """``cfg.replicas`` replicas of one engine behind ``cfg.router``, replaying ``workload``.

    Args: cfg: the ``cluster`` config node (:class:`sim.config.ClusterConfig`); the others as
    :class:`sim.engine.Simulator`'s, for every replica (``tiers``: a factory env -> TierManager
    called once per replica); ``recorder``: the single engine's with one replica, else a
    :class:`ClusterRecorder` that :meth:`run` fills with every replica's rows.

    After :meth:`run` it answers what the run's results read of a single engine (``tiers``,
    ``rounds``, ``preempted_lookups``, ``recomputed_instead_of_load``, ``write_back_stall_s``,
    ``write_back_stalls``, ``env``, ``stretch_counts()``, ``prefix_index``) summed or joined
    over the replicas, and :meth:`summary` gives the per-replica part of ``summary.json``.
    ``store``: a :class:`sim.kv_store.SharedStore` the replicas share (``tiers`` is then
    required: each replica's tier manager gets a :class:`sim.kv_store.StoreLink` to it), or
    None. Raises ConfigError for a bad ``cfg`` (:func:`validate_cluster`) or a store without
    tiers or with one replica."""

    def __init__(self, cfg, workload, num_gpu_blocks: int, block_size: int, scheduler, cache,
                 cost_model, max_model_len: int, recorder: ClusterRecorder,
                 check_invariants: bool = False, progress=None, max_sim_time_s=None,
                 fast_forward: bool = True, tiers=None, num_layers: int = 1, compression=None,
                 prefix_index: str = "auto", store=None, pd_links=None):
        validate_cluster(cfg)
        self.cfg = cfg
        self.wl = workload
        self.num_replicas = n = int(cfg.replicas)
        if n > 1:
            check_pool_host_memory(int(num_gpu_blocks), f"cluster.replicas={n} x "
                                   f"{int(num_gpu_blocks):,} KV blocks", copies=n)
        self.B = int(block_size)
        self.staleness = float(cfg.event_staleness_s)
        self.rec = recorder
        self.progress = progress
        self.env = simpy.Environment()
        self.n = len(workload)
        self.done = 0
        self.where = np.full(self.n, -1, dtype=np.int64)  # row -> replica
        session = workload.table.column("session_id").to_numpy()
        has_children = bool((np.asarray(workload.parent_request_id) >= 0).any())
        comp_on = compression is not None and compression.active
        # the fast paths of several replicas: open loop, no tiers, no store, and with an active
        # compression policy a router that reads no replica state (module docstring)
        if store is not None and (n < 2 or tiers is None):
            raise ConfigError(f"a shared KV store with cluster.replicas={n} and "
                              f"{'tier managers' if tiers is not None else 'no tier manager'}; "
                              f"expected replicas >= 2, each with a tier manager")
        self.store = store
        P = int(cfg.pd.prefill_replicas)
        self.prefill_replicas = P
        if P and pd_links is None:
            raise ConfigError(f"cluster.pd.prefill_replicas={P}: expected a KV link "
                              f"(sim.pd.PDLinks)")
        self.pd = pd_links if P else None
        if P:  # (one router per pool)
            self.router = make_router(self, cfg, members=range(P))
            self.decode_router = make_router(self, cfg, members=range(P, n),
                                             field="pd.decode_router")
        else:
            self.router = self.decode_router = make_router(self, cfg)
        if n == 1:
            self.ff_reason = None
        elif P:
            self.ff_reason = "prefill/decode disaggregation"
        elif store is not None:
            self.ff_reason = "a shared KV store"
        elif has_children:
            self.ff_reason = "closed-loop children (their arrivals are not known ahead)"
        elif tiers is not None:
            self.ff_reason = "host/disk tiers"
        elif comp_on and (self.router.reads_replicas or self.decode_router.reads_replicas):
            self.ff_reason = "a compression policy with a router that reads replica state"
        else:
            self.ff_reason = None
        ff = bool(fast_forward)
        self.fast_forward = ff
        self.replicas: list[Simulator] = []
        self._done_by = [0] * n
        for r in range(n):
            rec = recorder if n == 1 else ReplicaRecorder(self, r, self.n, session,
                                                          record_steps=recorder.record_steps,
                                                          store=store is not None, pd=bool(P))
            # (with disaggregation the cluster counts the requests done: request_done)
            prog = None if progress is None or P else (lambda d, r=r: self._progress(r, d))
            roles = {}
            if P and r < P:
                roles["hand_off"] = lambda req, r=r: self.prefilled(r, req)
            elif P:
                roles["receive"] = self._receive
            common = dict(check_invariants=check_invariants, progress=prog,
                          max_sim_time_s=max_sim_time_s, fast_forward=ff, tiers=tiers,
                          num_layers=num_layers, compression=compression,
                          prefix_index=prefix_index, release=self.release)
            if n == 1:  # the single engine on the cluster's environment
                sim = Simulator(workload, num_gpu_blocks, block_size, scheduler, cache,
                                cost_model, max_model_len, rec, env=self.env, **common)
            else:
                sim = Replica(self, r, workload, num_gpu_blocks, block_size, scheduler, cache,
                              cost_model, max_model_len, rec,
                              env=ReplicaEnv(self.env, self, self.ff_reason is None, r),
                              on_iteration=functools.partial(self._publish, r), **roles, **common)
            self.replicas.append(sim)
            if store is not None:
                self._attach(sim, r)
        self.prefix_index = self.replicas[0].prefix_index
        # arrival order and barriers (module docstring)
        s0 = self.replicas[0]
        self.order = s0.roots[np.argsort(s0.w_arrival[s0.roots], kind="stable")]
        self.arrival_times = np.asarray(s0.w_arrival, dtype=np.float64)[self.order].tolist()
        self.cut_times = [t - self.staleness for t in self.arrival_times]
        self.next_root = 0  # index into order of the next root to arrive
        self._cut = 0  # first cut after the clock, as far as seen
        # a router that reads no replica state (round_robin) sends the k-th root to replica
        # k mod N (the fast paths run open loop only, so every arrival is a root): each
        # replica's barriers are its own arrivals, and without KV views there are no cuts
        self.own_barriers = (self.ff_reason is None and n > 1
                             and not self.router.reads_replicas)
        self.own_times = ([self.arrival_times[r::n] for r in range(n)]
                          if self.own_barriers else None)
        # KV events (prefix-aware routers)
        self.views: list[KVView] = []
        self.pending: deque = deque()  # (publish time, replica, events)
        if (self.router.needs_kv_events or self.decode_router.needs_kv_events) and n > 1:
            if not cache.enable_prefix_caching:
                field = "router" if self.router.needs_kv_events else "pd.decode_router"
                name = cfg.router if self.router.needs_kv_events else cfg.pd.decode_router
                raise ConfigError(f"cluster.{field}={name}: needs "
                                  f"cache.enable_prefix_caching=true (it routes by cached blocks)")
            for sim in self.replicas:
                sim.pool.event_log = []
                self.views.append(KVView(sim.pool.num_blocks))

    def _attach(self, sim: Simulator, r: int) -> None:
        """Give replica ``r`` (``sim``) its link to the shared store, count its preempted
        lookups' remote hits, and log the store's changes to it while its waiting head's walk
        is memoised (sim.kv_manager.KVManager.prefix_hit)."""
        tm = sim.tiers
        tm.store = StoreLink(self.env, self.store, r, tm.batch)
        sim.preempted_lookups["hit_tokens"]["remote"] = 0
        kv = sim.kv

        def watch(keys, kv=kv, log=tm.change_log):
            if kv.hit_memo is not None:
                log.append(keys)

        self.store.watchers.append(watch)

    # ------------------------------------------------------------------ barriers
    def next_barrier(self, r: int) -> float:
        """Replica ``r``'s next barrier (s): the next root arrival not yet handed to a replica,
        or the next ``arrival - event_staleness_s`` after the clock; with a router that reads
        no replica state (:attr:`sim.routers.Router.reads_replicas`), the next root arrival
        it sends to ``r``; inf when none is left."""
        if self.own_barriers:
            n = self.num_replicas
            k = self.next_root + (r - self.next_root) % n  # (the next root sent to r)
            return self.arrival_times[k] if k < len(self.arrival_times) else math.inf
        now = self.env.now
        ct = self.cut_times
        j = self._cut
        while j < len(ct) and ct[j] <= now:
            j += 1
        self._cut = j
        b = ct[j] if j < len(ct) else math.inf
        if self.next_root < len(self.arrival_times):
            b = min(b, self.arrival_times[self.next_root])
        return b

    def barrier_in(self, lo: float, end: float, r: int) -> bool:
        """Whether one of replica ``r``'s barriers (:meth:`next_barrier`), an arrival or a
        cut, lands in ``(lo, end]`` (s)."""
        for ts in ((self.own_times[r],) if self.own_barriers
                   else (self.arrival_times, self.cut_times)):
            i = bisect.bisect_right(ts, lo)
            if i < len(ts) and ts[i] <= end:
                return True
        return False

    # ------------------------------------------------------------------ arrivals
    def _arrivals(self):
        env = self.env
        times = self.arrival_times
        for k, i in enumerate(self.order.tolist()):
            t = times[k]
            if t > env.now:
                yield env.timeout(t - env.now)
            self.next_root = k + 1
            self.dispatch(i)

    def dispatch(self, i: int) -> None:
        """Route workload row ``i``, arriving now, and hand it to its replica."""
        r = self.router.route(i) if self.num_replicas > 1 else 0
        self.where[i] = r
        self.router.routed(i, r)
        self.replicas[r]._arrive(i)

    def release(self, i: int, think: float) -> None:
        """A closed-loop child (row ``i``) released now: it arrives after ``think`` s (at once
        when ``think <= 0``), routed then."""
        if think <= 0:
            self.dispatch(i)
        else:
            ev = self.env.timeout(think)
            ev.callbacks.append(lambda _ev, i=i: self.dispatch(i))

    def request_done(self, r: int, req) -> None:
        self.done += 1
        (self.decode_router if r >= self.prefill_replicas else self.router).done(req.idx, r)
        if self.prefill_replicas and self.progress is not None:
            self.progress(self.done)

    # ------------------------------------------------------------------ disaggregation
    def prefilled(self, p: int, req) -> None:
        """Prefill replica ``p`` sampled the one token of ``req`` now: the decode pool's router
        picks its decode replica, which queues it (:meth:`Simulator.arrive_remote`)."""
        i = req.idx
        self.router.done(i, p)
        d = self.decode_router.route(i)
        self.decode_router.routed(i, d)
        self.replicas[d].arrive_remote(i, Handoff(p, d, req, self.env.now))

    def _receive(self, req, blocks: int):
        """A decode replica's KV transfer of ``blocks`` blocks for ``req`` (SimPy process body):
        the links' time, then the prefill replica frees its blocks."""
        h = req.pd
        yield from self.pd.transfer(self.env, h, blocks, req.rid)
        self.replicas[h.prefill_replica].free_handed(h.prefill)

    def _progress(self, r: int, done_r: int) -> None:
        self._done_by[r] = done_r
        self.progress(sum(self._done_by))

    # ------------------------------------------------------------------ router's inputs
    def queue_length(self, r: int) -> int:
        """Replica ``r``'s requests waiting, running or onboarding now."""
        s = self.replicas[r]
        return len(s.waiting) + len(s.running) + s.onboarding

    def kv_blocks_used(self, r: int) -> int:
        """GPU blocks replica ``r`` holds now."""
        return self.replicas[r].pool.num_used

    def prompt_keys(self, i: int):
        """Row ``i``'s block keys as its replica will compute them (:func:`sim.keys.block_keys`),
        its prompt blocks (``ceil(input / block_size)``) and the most blocks a prefix hit can
        cover (``(input - 1) // block_size``): ``(keys, blocks, limit)``."""
        s = self.replicas[0]
        n_in = int(s.w_in[i])
        total = -(-(n_in + int(s.w_out[i]) - 1) // self.B)
        ids = s.p_val[s.p_off[i]:s.p_off[i + 1]]
        nxt, reach = s.kv.continuation(i, ids) if s.reuse_answers else (None, 0)
        keys = block_keys(ids, s.G, n_in, self.B, int(s.w_rid[i]), max(total, 1), nxt, reach)
        limit = (n_in - 1) // self.B if s.caching else 0
        return np.ascontiguousarray(keys, dtype=np.int64), -(-n_in // self.B), limit

    def _publish(self, r: int) -> None:
        """Replica ``r``'s engine loop, between steps: its pool's events since the last call
        become one batch published now."""
        log = self.replicas[r].pool.event_log
        if log:
            self.pending.append((self.env.now, r, log))
            self.replicas[r].pool.event_log = []

    def apply_events(self) -> None:
        """Apply to the views every batch published more than ``event_staleness_s`` ago."""
        now = self.env.now
        p = self.pending
        S = self.staleness
        while p and p[0][0] + S < now:
            _, r, events = p.popleft()
            self.views[r].apply(events)

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        """Run until every request has finished or been rejected; then fill the recorder.
        Raises ConfigError as :meth:`Simulator.run` (the clock past its limits) and
        RuntimeError when requests are left unfinished."""
        env = self.env
        env.process(self._arrivals())
        for sim in self.replicas:
            env.process(sim._engine())
        env.run()
        if self.num_replicas == 1:  # (its recorder is the run's)
            self.done = self.replicas[0].done
        for sim in self.replicas:
            sim.rec.peak_blocks_used = max(sim.rec.peak_blocks_used, sim.pool.peak_used)
            if env.now > MAX_CLOCK_S:  # (tier copies landing after the last request)
                sim.check_sim_time()
        if self.done != self.n:
            raise RuntimeError(f"simulation ended with {self.n - self.done} requests unfinished")
        held = sum(len(s.handed) for s in self.replicas)
        if held:
            raise RuntimeError(f"simulation ended with {held} prefilled requests holding blocks")
        if self.num_replicas > 1:
            self._merge()

    def _merge(self) -> None:
        rec = self.rec
        recs = [s.rec for s in self.replicas]
        rec.rows = [row for r in recs for row in r.rows]
        rec.levels = recs[0].levels
        rec.replica_of = np.concatenate([np.full(len(r.rows), k, dtype=np.int64)
                                         for k, r in enumerate(recs)]) if rec.rows else \
            np.empty(0, dtype=np.int64)
        rec.preemptions = sum(r.preemptions for r in recs)
        rec.num_steps = sum(r.num_steps for r in recs)
        rec.sum_prefill = sum(r.sum_prefill for r in recs)
        rec.sum_decode = sum(r.sum_decode for r in recs)
        rec.peak_blocks_used = max(r.peak_blocks_used for r in recs)
        if self.store is not None:
            rec.remote = [x for r in recs for x in r.remote]
        if self.pd is not None:
            rec.pd = [x for r in recs for x in r.pd]
        if rec.record_steps:
            names = recs[0].steps.names
            dtypes = [(nm, recs[0].steps.cols[nm].dtype) for nm in names]
            st = _Growable(dtypes + [("replica", np.int64)], cap=max(1, sum(r.steps.n for r in recs)))
            for k, r in enumerate(recs):
                m = r.steps.n
                if m:
                    st.extend(*[r.steps.cols[nm][:m] for nm in names],
                              np.full(m, k, dtype=np.int64))
            rec.steps = st

    # ------------------------------------------------------------------ results
    @property
    def tiers(self):
        tms = [s.tiers for s in self.replicas]
        if tms[0] is None:
            return None
        return tms[0] if self.num_replicas == 1 else ClusterTiers(tms)

    @property
    def rounds(self) -> list:
        rows = [row for s in self.replicas for row in s.rounds]
        rows.sort(key=lambda row: row[0])  # (by time; stable: replica order at equal times)
        return rows

    @property
    def preempted_lookups(self) -> dict:
        levels = self.replicas[0].rec.levels
        out = {"requests": 0, "query_tokens": 0, "hit_tokens": dict.fromkeys(("gpu",) + levels, 0)}
        if self.store is not None:
            out["hit_tokens"]["remote"] = 0
        for s in self.replicas:
            p = s.preempted_lookups
            out["requests"] += p["requests"]
            out["query_tokens"] += p["query_tokens"]
            for t in out["hit_tokens"]:
                out["hit_tokens"][t] += p["hit_tokens"][t]
        return out

    @property
    def recomputed_instead_of_load(self) -> dict:
        out = {"admissions": 0, "tokens": 0, "disk_tokens": 0}
        for s in self.replicas:
            for k in out:
                out[k] += s.recomputed_instead_of_load[k]
        return out

    @property
    def write_back_stall_s(self) -> float:
        return float(sum(s.write_back_stall_s for s in self.replicas))

    @property
    def write_back_stalls(self) -> int:
        return int(sum(s.write_back_stalls for s in self.replicas))

    def stretch_counts(self) -> dict:
        out: dict = {}
        for s in self.replicas:
            for name, c in s.stretch_counts().items():
                o = out.setdefault(name, {})
                for k, v in c.items():
                    o[k] = max(o.get(k, 0), v) if k == "longest" else o.get(k, 0) + v
        return out

    def summary(self, req: pd.DataFrame) -> dict:
        """``summary.json``'s ``cluster`` part: the settings, whether the replicas took their fast
        paths (``per_step_reason``: why the replicas take only the stretches that keep one
        SimPy timeout per step whatever ``sim.fast_forward`` says, or None), and per replica its requests, prefix-hit ratio, TTFT p50/p99 (s),
        preemptions, engine steps and peak GPU blocks; with a shared store, per replica its
        remote hit ratio and pages put and fetched, and ``store``
        (:meth:`sim.kv_store.SharedStore.summary`); with prefill/decode disaggregation, each
        replica's ``role`` (its requests: those it prefilled or decoded) and ``pd``
        (:meth:`pd_summary`). ``req``: the run's requests table."""
        per = []
        P = self.prefill_replicas
        for k, s in enumerate(self.replicas):
            col = "replica" if not P else "prefill_replica" if k < P else "decode_replica"
            mine = req[req[col] == k]
            fin = mine[mine["status"] == "finished"]
            prompt = float(fin["input_tokens"].sum())
            ttft = fin["ttft_s"].dropna().to_numpy()
            q = np.percentile(ttft, [50, 99]).tolist() if len(ttft) else [None, None]
            per.append({
                "replica": k, "requests": int(len(mine)), "requests_finished": int(len(fin)),
                "prefix_hit_ratio": (float(fin["prefix_hit_tokens"].sum()) / prompt
                                     if prompt > 0 else None),
                "ttft_p50_s": q[0], "ttft_p99_s": q[1],
                "preemptions": int(s.rec.preemptions), "engine_steps": int(s.rec.num_steps),
                "peak_gpu_blocks_used": int(s.rec.peak_blocks_used),
                "gpu_blocks_total": int(s.pool.num_blocks)})
            if P:
                per[-1]["role"] = "prefill" if k < P else "decode"
            if self.store is not None:
                recs = s.tiers.store.records
                pages = {d: 0 for d in recs.DIRECTIONS}
                for row in recs:
                    pages[row[1]] += row[3]
                per[-1].update({
                    "remote_hit_ratio": (float(fin["hit_tokens_remote"].sum()) / prompt
                                         if prompt > 0 else None),
                    "store_pages_put": pages["gpu_to_store"],
                    "store_pages_fetched": pages["store_to_gpu"]})
        out = {"replicas": self.num_replicas, "router": str(self.cfg.router),
               "event_staleness_s": self.staleness,
               "overlap_weight": float(self.cfg.overlap_weight),
               "gpu_blocks_total_all": int(sum(s.pool.num_blocks for s in self.replicas)),
               "per_step_reason": self.ff_reason,
               "per_replica": per}
        if self.store is not None:
            out["store"] = self.store.summary()
        if P:
            out["pd"] = self.pd_summary(req, per)
        return out

    def pd_summary(self, req: pd.DataFrame, per: list) -> dict:
        """``summary.json``'s ``cluster.pd``: the pools' sizes and routers, the link and its
        totals (:meth:`sim.pd.PDLinks.summary`), and per pool (``prefill``, ``decode``) its
        requests, preemptions, engine steps, peak GPU blocks (fullest replica) and prefix-hit
        ratio (the prefill pool's hits; the decode pool's ``decode_hit_tokens``: prompt tokens
        not transferred), with the prefill pool's ``prefill_done_s`` and the decode pool's
        hand-off time (``onboard_s``: from the prefill's token to the KV landed) and TTFT,
        p50/p99 (s), over the finished requests."""
        P = self.prefill_replicas
        fin = req[req["status"] == "finished"]
        prompt = float(fin["input_tokens"].sum())

        def pct(x):
            x = x.dropna().to_numpy()
            return np.percentile(x, [50, 99]).tolist() if len(x) else [None, None]

        def pool(rows):
            return {"replicas": len(rows), "requests": int(sum(p["requests"] for p in rows)),
                    "preemptions": int(sum(p["preemptions"] for p in rows)),
                    "engine_steps": int(sum(p["engine_steps"] for p in rows)),
                    "peak_gpu_blocks_used": int(max(p["peak_gpu_blocks_used"] for p in rows))}

        pre, dec = pool(per[:P]), pool(per[P:])
        pre["prefix_hit_ratio"] = (float(fin["prefix_hit_tokens"].sum()) / prompt
                                   if prompt > 0 else None)
        pre["prefill_done_p50_s"], pre["prefill_done_p99_s"] = pct(fin["prefill_done_s"])
        dec["prefix_hit_ratio"] = (float(fin["decode_hit_tokens"].sum()) / prompt
                                   if prompt > 0 else None)
        dec["handoff_p50_s"], dec["handoff_p99_s"] = pct(fin["onboard_s"])
        dec["ttft_p50_s"], dec["ttft_p99_s"] = pct(fin["ttft_s"])
        return {"prefill_replicas": P, "decode_replicas": self.num_replicas - P,
                "router": str(self.cfg.router), "decode_router": str(self.cfg.pd.decode_router),
                "link": self.pd.summary(), "prefill": pre, "decode": dec}

    def transfers_frame(self) -> pd.DataFrame | None:
        """The KV transfers of a disaggregated cluster (:meth:`sim.pd.PDLinks.frame`), or None
        without disaggregation."""
        return None if self.pd is None else self.pd.frame()
