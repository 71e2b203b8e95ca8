"""Routers of a cluster (:class:`sim.cluster.Cluster`): which replica serves each request.

Every router implements one method, :meth:`Router.route` (a request's workload row -> a replica
index), and may keep a ledger through :meth:`Router.routed` / :meth:`Router.done`. What a router
sees of the replicas, at the instant a request arrives:

* load (:meth:`sim.cluster.Cluster.queue_length`, :meth:`~sim.cluster.Cluster.kv_blocks_used`):
  the replica's waiting, running and onboarding requests and the GPU blocks it holds, as a
  serving engine's metrics endpoint reports them (read at the arrival, no scrape delay);
* cached prefixes (prefix_aware only): a :class:`KVView` per replica built from the
  replica's KV events (blocks stored / removed, published at the end of each engine step and
  applied ``cluster.event_staleness_s`` later), never from the replica's pool itself;
* its own ledger: the requests it routed that have not finished.

Ties go to the lowest replica index, so every decision is deterministic.
"""

from __future__ import annotations

import numpy as np

from . import hash_tables
from .hash_tables import NO_HASH, PrefixTable, _pair_discard, _pair_probe, _prefix_walk
from .errors import ConfigError
from .jit import kernel


class KVView:
    """A router's picture of one replica's prefix cache: the set of block keys its KV events
    say it holds (an open-addressing table of :class:`sim.block_pool.PrefixTable`'s layout,
    worked by compiled loops).

    Args: num_blocks: the replica's GPU blocks (> 0). The events mirror the replica's prefix
    index, which holds at most one key per block, so the view never holds more; the table is
    sized for that and :meth:`apply` raises RuntimeError if an event batch would pass it."""

    def __init__(self, num_blocks: int):
        self.num_blocks = int(num_blocks)
        self.table = PrefixTable(self.num_blocks)
        self.count = 0

    def apply(self, events) -> None:
        """Apply a replica's events in order: ``(+1, keys)`` stored, ``(-1, keys)`` removed
        (int64 arrays; :attr:`sim.block_pool.BlockPool.event_log`'s entries)."""
        t = self.table
        for op, keys in events:
            if op > 0:
                self.count += _view_add(t.tab, t.mask, t.shift, keys)
                if self.count > self.num_blocks:
                    raise RuntimeError(f"KV view holds {self.count} keys > {self.num_blocks} "
                                       f"blocks: the events do not mirror one prefix index")
            else:
                self.count -= _pair_discard(t.tab, t.mask, t.shift, keys)

    def overlap(self, keys: np.ndarray, limit: int) -> int:
        """Length of the run ``keys[0], keys[1], ...`` (at most ``limit``) held in the view:
        the prefix blocks the replica would serve from its cache, as far as the router knows."""
        limit = min(int(limit), len(keys))
        if limit <= 0:
            return 0
        t = self.table
        out = np.empty(limit, dtype=np.int64)
        return int(_prefix_walk(t.tab, t.mask, t.shift, keys, limit, out))

    def keys(self) -> np.ndarray:
        """Every key held (sorted int64 array; for tests)."""
        k = self.table.tab[0::2]
        return np.sort(k[k != NO_HASH])


@kernel("i8(i8[:], i8, i8, i8[:])", depends=(hash_tables,))
def _view_add(tab, mask, shift, keys):  # pragma: no cover (compiled)
    """Enter each of ``keys`` absent from the pair table ``tab`` (value 0); returns how many
    were entered."""
    n = 0
    for i in range(keys.shape[0]):
        s = _pair_probe(tab, mask, shift, keys[i])
        if tab[2 * s] != keys[i]:
            tab[2 * s] = keys[i]
            tab[2 * s + 1] = 0
            n += 1
    return n


class Router:
    """Base of the routers. ``cluster``: the :class:`sim.cluster.Cluster` it routes for;
    ``cfg``: the ``cluster`` config node; ``members``: the replica indices it routes over, in
    order (ties go to the first; default all of the cluster's replicas; with prefill/decode
    disaggregation one router per pool). Subclasses set ``name`` and ``needs_kv_events`` (the
    cluster then has its replicas publish KV events into :attr:`sim.cluster.Cluster.views`)."""

    name = ""
    needs_kv_events = False
    # whether route() reads replica state (load, KV views, a ledger of finishes); when False the
    # replica of each arrival is fixed by the arrivals before it, so an arrival need not stop
    # the other replicas' fast-forward stretches (sim.cluster.Cluster.next_barrier)
    reads_replicas = True

    def __init__(self, cluster, cfg, members=None):
        self.cluster = cluster
        self.members = list(range(cluster.num_replicas)) if members is None else list(members)
        self.n = len(self.members)

    def route(self, i: int) -> int:
        """The replica (0-based) that serves workload row ``i``, arriving now."""
        raise NotImplementedError

    def routed(self, i: int, r: int) -> None:
        """Row ``i`` was sent to replica ``r``."""

    def done(self, i: int, r: int) -> None:
        """Row ``i`` finished (or was rejected) on replica ``r``."""

    def least_loaded(self) -> int:
        """The member with the fewest requests queued or running (waiting + running +
        onboarding), ties to the fewest GPU blocks held, then the lowest index."""
        c = self.cluster
        return min(self.members, key=lambda r: (c.queue_length(r), c.kv_blocks_used(r), r))


class RoundRobin(Router):
    """Replica ``k mod N`` for the ``k``-th request routed (0-based): the default of NVIDIA
    Dynamo's frontend (``--router-mode round_robin``) and of most HTTP load balancers."""

    name = "round_robin"
    reads_replicas = False

    def __init__(self, cluster, cfg, members=None):
        super().__init__(cluster, cfg, members)
        self.k = 0

    def route(self, i: int) -> int:
        r = self.members[self.k % self.n]
        self.k += 1
        return r


class LeastLoaded(Router):
    """The replica with the shortest queue (:meth:`Router.least_loaded`: waiting + running +
    onboarding requests, ties to the lower KV-cache use, then the lowest index): llm-d's
    inference scheduler's queue scorer (``queue-scorer``, the pod with the fewest waiting
    requests) with its KV-cache utilisation scorer breaking ties."""

    name = "least_loaded"

    def route(self, i: int) -> int:
        return self.least_loaded()


class SessionAffinity(Router):
    """A session's requests stay on the replica that served its first request, which goes to
    the least loaded replica (:meth:`Router.least_loaded`): llm-d's session-affinity scorer,
    which sends a request carrying a session token back to the pod that served the session
    (sticky sessions of an HTTP load balancer). Sessions are the workload's ``session_id``."""

    name = "session_affinity"

    def __init__(self, cluster, cfg, members=None):
        super().__init__(cluster, cfg, members)
        self.session = cluster.wl.table.column("session_id").to_numpy()
        self.home: dict[int, int] = {}

    def route(self, i: int) -> int:
        s = int(self.session[i])
        r = self.home.get(s)
        if r is None:
            r = self.least_loaded()
            self.home[s] = r
        return r


class PrefixAware(Router):
    """KV-cache-aware routing: the replica with the lowest cost
    ``cluster.overlap_weight x prefill_blocks + active_blocks`` (ties to the lowest index), as
    NVIDIA Dynamo's KV router scores workers (its ``kv-overlap-score-weight``, default 1.0, at
    router temperature 0: the minimum, no sampling):

    * ``prefill_blocks``: the request's prompt blocks (``ceil(input_tokens / block_size)``)
      less the overlap, the longest run of its prompt's block keys (at most ``(input_tokens -
      1) // block_size``, what the engine can hit) that the replica holds according to the
      router's :class:`KVView` of it, built from the replica's KV events as Dynamo's KV indexer
      and llm-d's precise prefix-cache scorer build theirs;
    * ``active_blocks``: the router's own ledger of the replica's work, the prompt blocks of the
      requests it sent there that have not finished (Dynamo's router tracks active blocks from
      the requests it routes, not from the worker).
    """

    name = "prefix_aware"
    needs_kv_events = True

    def __init__(self, cluster, cfg, members=None):
        super().__init__(cluster, cfg, members)
        self.w = float(cfg.overlap_weight)
        self.active = np.zeros(cluster.num_replicas, dtype=np.int64)  # (by replica index)
        self.blocks_of: dict[int, int] = {}

    def route(self, i: int) -> int:
        c = self.cluster
        c.apply_events()
        keys, n_blocks, limit = c.prompt_keys(i)
        best = None
        for r in self.members:
            ov = c.views[r].overlap(keys, limit) if limit > 0 else 0
            cost = self.w * (n_blocks - ov) + int(self.active[r])
            if best is None or cost < best[0]:
                best = (cost, r)
        return best[1]

    def routed(self, i: int, r: int) -> None:
        b = -(-int(self.cluster.wl.input_tokens[i]) // self.cluster.B)
        self.blocks_of[i] = b
        self.active[r] += b

    def done(self, i: int, r: int) -> None:
        self.active[r] -= self.blocks_of.pop(i)


ROUTERS = {cls.name: cls for cls in (RoundRobin, LeastLoaded, SessionAffinity, PrefixAware)}


def make_router(cluster, cfg, members=None, field: str = "router") -> Router:
    """The router the ``cluster`` config node's ``field`` names (``router``, or
    ``pd.decode_router`` for a disaggregated cluster's decode pool), for ``cluster``, routing
    over the replicas ``members`` (None: all); ConfigError for an unknown name."""
    node = cfg
    for part in field.split("."):
        node = getattr(node, part)
    name = str(node)
    if name not in ROUTERS:
        raise ConfigError(f"cluster.{field}={name!r}; expected one of {sorted(ROUTERS)}")
    return ROUTERS[name](cluster, cfg, members)
