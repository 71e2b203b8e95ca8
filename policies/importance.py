"""Token-importance signals for score-based eviction.

A trace records lengths and prefix hashes, not attention scores, so score-based policies (H2O, TOVA,
SnapKV, PyramidKV, Ada-KV, R-KV, TriAttention) rank tokens by a *generative* importance model
(:class:`ImportanceModel`), or by scores recorded from a real model (:class:`RecordedImportance`).

Generative model (all randomness is a counter-based hash of (seed, request_key, stream, index), so a
token's score does not depend on which other positions are asked for, nor on call order):

    lattice noise  F_s(p) = Gaussian values on a lattice of spacing L = correlation_length, linearly
                            interpolated and renormalised to unit variance (locality: runs ~L tokens)
    per-stream     Z_s(p, t) = sqrt(1-drift) F_{s,static}(p)
                             + sqrt(drift) [cos(th) F_{s,e}(p) + sin(th) F_{s,e+1}(p)]
                   with e = t // drift_period, th = (pi/2) (t mod drift_period) / drift_period
                   (unit variance at every step; decorrelates over ~2 drift periods)
    per group g    z_g = sqrt(rho) Z_shared + sqrt(1-rho) Z_g           (rho = head_correlation)
    score          s_g(p, t) = exp(sigma_g z_g) x (sink_boost if p < sink_tokens)
                               x (1 + recency_boost exp(-(seq_len-1-p)/recency_window))
                   sigma_g = sigma exp(sigma_spread n_g - sigma_spread^2/2), n_g ~ N(0,1) per group

``t`` (``step``) is the number of decode steps done; ``seq_len`` (recency anchor) defaults to
``max(positions) + 1``. See ``policies/README.md`` for which results depend on which parameter.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import Optional

import numpy as np

from sim.jit import kernel

from .config import ImportanceParams, validate_importance_params
from .recorded import RecordedImportance
from .score_terms import _NO_SINK, LogScoreTerms, _fused_logs

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)

# stream tags (mixed into the hash)
_STATIC = -1
_SIGMA = -2
_SHARED = -10


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


_M64 = (1 << 64) - 1
_M1_INT, _M2_INT, _GOLD_INT = int(_M1), int(_M2), int(_GOLD)
_SEED_INT = 0x1234567887654321


def _mix1(x: int) -> int:
    """:func:`_mix` on one Python int in [0, 2**64) (the same wrapping arithmetic)."""
    x ^= x >> 30
    x = (x * _M1_INT) & _M64
    x ^= x >> 27
    x = (x * _M2_INT) & _M64
    return x ^ (x >> 31)


def _hash_prefix(parts) -> tuple[int, int]:
    """Fold the leading scalar ``parts`` with Python ints; returns (state, parts folded)."""
    h = _SEED_INT
    i = 0
    for p in parts:
        if np.ndim(p):
            break
        h = _mix1(h ^ ((int(p) + _GOLD_INT) & _M64))  # int64 -> uint64 wraps like & _M64
        i += 1
    return h, i


def _hash_fold(h, parts) -> np.ndarray:
    """Fold ``parts`` (integers or integer arrays, broadcast) into the hash state ``h``."""
    with np.errstate(over="ignore"):
        h = np.uint64(h) if isinstance(h, int) else h
        for p in parts:
            a = np.asarray(p).astype(np.int64).astype(np.uint64)
            h = _mix(h ^ (a + _GOLD))
        return np.asarray(h, dtype=np.uint64)


def _gauss(*parts) -> np.ndarray:
    """Standard normal deviates, one per broadcast element of ``parts`` (Box-Muller on two
    splitmix64 chains over the parts, ending in 1 and in 2; leading scalar parts are folded with
    Python ints, the same bits as the numpy chain)."""
    h, i = _hash_prefix(parts)
    return _gauss_from(h, parts[i:])


def _gauss_from(h, parts) -> np.ndarray:
    """:func:`_gauss` from the hash state ``h`` (a Python int, or a uint64 array broadcast with
    ``parts``) of the parts before ``parts``."""
    h = _hash_fold(h, parts)
    with np.errstate(over="ignore"):
        h1 = _mix(h ^ (np.uint64(1) + _GOLD))
        h2 = _mix(h ^ (np.uint64(2) + _GOLD))
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)
    u2 = ((h2 >> np.uint64(11)).astype(np.float64) + 0.5) * (1.0 / 9007199254740992.0)
    return _box_muller(u1, u2)


def _box_muller(u1: np.ndarray, u2: np.ndarray) -> np.ndarray:
    """Standard normal deviates from uniforms in (0, 1) (float64 arrays of one shape)."""
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


@kernel("u8(u8)")
def _mix_c(x):  # pragma: no cover (compiled)
    """:func:`_mix` on one uint64 (compiled)."""
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


@kernel("void(u8[:], i8, f8[:, :, :])")
def _index_uniforms(h0, lo, out):  # pragma: no cover (compiled)
    """The two uniforms of :func:`_gauss_from` for the hash states ``h0`` (one per row) folded
    with the indices ``lo, lo + 1, ...``: ``out[0, r, j]`` and ``out[1, r, j]`` for index
    ``lo + j`` (the same wrapping uint64 arithmetic and float conversion)."""
    for r in range(h0.shape[0]):
        for j in range(out.shape[2]):
            h = _mix_c(h0[r] ^ (np.uint64(lo + j) + _GOLD))
            h1 = _mix_c(h ^ (np.uint64(1) + _GOLD))
            h2 = _mix_c(h ^ (np.uint64(2) + _GOLD))
            out[0, r, j] = (np.float64(h1 >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)
            out[1, r, j] = (np.float64(h2 >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)


class ImportanceModel:
    """Seeded generative token-importance model (see module docstring for the formula).

    Args:
      params: :class:`policies.config.ImportanceParams` (validated; ValueError names a bad field).
      seed: integer seed.
      compiled: True: the compiled pass (:func:`_fused_logs`) computes the log-scores where it
        applies (interpolated, drifting, partly shared fields: the defaults); False: the numpy
        expressions always (the reference the compiled pass equals bit for bit; slower).

    ``scores(request_key, positions, num_groups, step, seq_len=None)`` ->
    ``float32[num_groups, len(positions)]``, > 0, deterministic in (seed, request_key, positions,
    step, seq_len) and independent per position of the other positions passed.
    """

    #: lattice values kept in the memo (float64; 64 MB), least recently used out; lattices are
    #: a pure function of (seed, key, stream, epoch, index), so the memo never changes a result
    MEMO_VALUES = 8 << 20
    #: entries of the per-group sigma memo
    MEMO_ENTRIES = 4096

    def __init__(self, params: Optional[ImportanceParams] = None, seed: int = 0,
                 compiled: bool = True):
        self.params = params if params is not None else ImportanceParams()
        validate_importance_params(self.params)
        self.seed = int(seed)
        self.compiled = bool(compiled)
        self._memo: "OrderedDict[tuple, np.ndarray]" = OrderedDict()
        self._memo_values = 0
        self._by_key: dict[int, set] = {}  # request key -> its memo keys (see forget)
        self._sigma_memo: dict[tuple, np.ndarray] = {}
        self._ip_tab = None  # interpolation terms at every position (see _interp)
        self._lm_tab = None  # log recency multiplier at every age (see _scores)

    # -- latent fields -------------------------------------------------------------------------
    def _remember(self, mk: tuple, arr: np.ndarray) -> np.ndarray:
        """Store ``arr`` under ``mk`` in the memo (most recent), dropping the least recently used
        entries beyond :attr:`MEMO_VALUES`."""
        self._drop(mk)
        self._memo[mk] = arr
        self._memo_values += arr.size
        self._by_key.setdefault(mk[0], set()).add(mk)
        while self._memo_values > self.MEMO_VALUES and len(self._memo) > 1:
            old_mk, old = self._memo.popitem(last=False)
            self._memo_values -= old.size
            self._by_key[old_mk[0]].discard(old_mk)
        return arr

    def _drop(self, mk: tuple) -> None:
        """Remove ``mk`` from the memo if it is there."""
        old = self._memo.pop(mk, None)
        if old is not None:
            self._memo_values -= old.size
            self._by_key[mk[0]].discard(mk)

    def forget(self, request_key: int) -> None:
        """Drop every memoised value of ``request_key`` (its request finished or was preempted):
        only memory and speed change, never a value (each is a pure function of its inputs)."""
        for mk in self._by_key.pop(request_key, ()):
            self._memo_values -= self._memo.pop(mk).size

    def _lattice_arr(self, key: int, streams: tuple, epoch: int, need: int,
                     room: int = 0) -> np.ndarray:
        """Gaussian deviates at lattice points ``0..>= need-1`` of each stream in ``streams``
        (``float64[len(streams), >= need]``), memoised per (key, streams, epoch) as a prefix
        array that grows by doubling (each value is a pure function of (seed, key, stream, epoch,
        index), so neither the memo nor the grouping of streams changes a value). ``room``: points
        to add beyond ``need`` when the array is (re)built."""
        def deviates(have: int, n: int) -> np.ndarray:
            # each stream's chain up to the index, folded with Python ints; the rest of the
            # chain and the uniforms compiled (integer work), the Box-Muller transform in numpy
            h0 = np.array([_hash_prefix((self.seed, key, s, epoch))[0] for s in streams],
                          dtype=np.uint64)
            u = np.empty((2, len(streams), n - have), dtype=np.float64)
            _index_uniforms(h0, have, u)
            return _box_muller(u[0], u[1])

        return self._prefix((key, streams, epoch), need, room, 256, deviates)

    def _prefix(self, mk: tuple, need: int, room: int, first: int, extend) -> np.ndarray:
        """The memo entry ``mk``: an array over indices ``0..>= need-1`` (axis 1), grown when
        short to ``max(need + room, twice its length)`` (``first`` at least when new) by
        ``extend(have, n)``, which returns the columns ``have..n-1``."""
        arr = self._memo.get(mk)
        if arr is not None and arr.shape[1] >= need:
            self._memo.move_to_end(mk)
            return arr
        have = 0 if arr is None else arr.shape[1]
        ext = extend(have, max(need + room, 2 * have if arr is not None else first))
        if arr is not None:
            ext = np.concatenate([arr, ext], axis=1)
        return self._remember(mk, ext)

    def _lattice(self, key: int, streams: tuple, epoch: int, idx: np.ndarray,
                 need: Optional[int] = None) -> np.ndarray:
        """Gaussian deviates at integer lattice points ``idx`` (>= 0) of each stream in
        ``streams``: ``float64[len(streams), len(idx)]`` (:meth:`_lattice_arr`).
        ``need``: at least ``max(idx) + 1`` if the caller knows it."""
        if idx.size == 0:
            return np.zeros((len(streams), 0), dtype=np.float64)
        if need is None:
            need = int(idx.max()) + 1
        return np.take(self._lattice_arr(key, streams, epoch, need), idx, axis=1)

    def _interp(self, pos: np.ndarray, hi: Optional[int] = None):
        """Linear-interpolation terms of :meth:`_field` at ``pos`` (they depend on the positions
        only, so the static and drift fields share them): ``None`` when L <= 1, else
        ``(i0, i0 + 1, t, 1 - t, sqrt((1 - t)^2 + t^2), max(i0) + 2)`` (the last: lattice
        points needed). ``hi``: ``max(pos) + 1`` if the caller knows it.

        The terms are read from tables over every position ``0..N-1`` (grown by doubling),
        computed with the same elementwise arithmetic, so they are the very bits computing them
        at ``pos`` gives."""
        L = float(self.params.correlation_length)
        if L <= 1.0:
            return None
        if not pos.size:
            z = np.zeros(0)
            return z.astype(np.int64), z.astype(np.int64), z, z, z, 0
        if hi is None:
            hi = int(pos.max()) + 1
        tab = self._ip_table(hi)
        ii = np.take(tab[0], pos, axis=1)
        ff = np.take(tab[1], pos, axis=1)
        return ii[0], ii[1], ff[0], ff[1], ff[2], int(tab[0][1, hi - 1]) + 1

    def _ip_table(self, hi: int) -> tuple:
        """The interpolation tables over positions ``0..>= hi-1`` (grown by doubling):
        ``(int64[2, N]`` rows i0, i0 + 1; ``float64[3, N]`` rows t, 1 - t, sqrt((1 - t)^2 + t^2))``
        with ``x = position / L``, ``i0 = floor(x)``, ``t = x - i0``. Needs L > 1."""
        tab = self._ip_tab
        if tab is None or tab[0].shape[1] < hi:
            L = float(self.params.correlation_length)
            n = max(hi, 2 * tab[0].shape[1] if tab is not None else 4096)
            x = np.arange(n, dtype=np.int64) / L
            i0 = np.floor(x).astype(np.int64)
            t = x - i0
            omt = 1.0 - t
            tab = self._ip_tab = (np.stack([i0, i0 + 1]), np.stack([t, omt, np.sqrt(omt ** 2 + t ** 2)]))
        return tab

    def _field(self, key: int, streams: tuple, epoch: int, pos: np.ndarray, ip) -> np.ndarray:
        """Unit-variance Gaussian fields with correlation length L over positions, one row per
        stream (``float64[len(streams), n]``). ``ip``: :meth:`_interp` of ``pos``."""
        if ip is None:
            return self._lattice(key, streams, epoch, pos)
        i0, i1, t, omt, den, need = ip
        g0 = self._lattice(key, streams, epoch, i0, need)
        g1 = self._lattice(key, streams, epoch, i1, need)
        return (omt * g0 + t * g1) / den

    def _static(self, key: int, streams: tuple, pos: np.ndarray, ip, scale: float,
                hi: Optional[int] = None) -> np.ndarray:
        """``scale x`` the static field of each stream at ``pos`` (``float64[len(streams), n]``).

        The static field never changes during a request, so it is memoised densely: the scaled
        field at every position ``0..n-1``, grown by doubling, in the lattice memo (same LRU and
        value budget). Each value is the elementwise arithmetic of :meth:`_field` at its position,
        so the memo returns the very bits :meth:`_field` would. ``hi``: ``max(pos) + 1`` if the
        caller knows it."""
        if ip is None:  # no interpolation: the lattice memo already holds the field densely
            f = self._field(key, streams, _STATIC, pos, ip)
            return f if scale == 1.0 else scale * f
        if hi is None:
            hi = int(pos.max()) + 1 if pos.size else 0
        return np.take(self._static_arr(key, streams, scale, hi), pos, axis=1)

    def _static_arr(self, key: int, streams: tuple, scale: float, hi: int) -> np.ndarray:
        """The memo of :meth:`_static` (interpolated fields only): ``scale x`` the static field
        of each stream at every position ``0..>= hi-1`` (``float64[len(streams), >= hi]``)."""
        def field(have: int, n: int) -> np.ndarray:
            new = np.arange(have, n, dtype=np.int64)
            i0, i1, t, omt, den, need = self._interp(new)
            # (_field's arithmetic, then the scale, in one compiled pass)
            ext = np.empty((len(streams), n - have), dtype=np.float64)
            _interp_rows(self._lattice_arr(key, streams, _STATIC, need), i0, i1, t, omt, den,
                         scale, ext)
            return ext

        return self._prefix((key, streams, "static", scale), hi, 0, 1024, field)

    def _drift(self, key: int, streams: tuple, epoch: int, ip, c: float, s: float) -> np.ndarray:
        """``c F_epoch + s F_(epoch+1)`` of each stream (the drifting part of :meth:`_stream`,
        ``float64[len(streams), n]``; ``ip`` from :meth:`_interp`, not None).

        The two epochs' lattices are memoised side by side with each point's right neighbour
        (rows: epoch at i, epoch + 1 at i, epoch at i + 1, epoch + 1 at i + 1), so one gather
        serves both fields; the arithmetic per element is :meth:`_field`'s."""
        i0, i1, t, omt, den, need = ip
        S = len(streams)
        g = np.take(self._drift_arr(key, streams, epoch, need), i0, axis=1)
        f = (omt * g[:2 * S] + t * g[2 * S:]) / den
        return c * f[:S] + s * f[S:]

    def _drift_arr(self, key: int, streams: tuple, epoch: int, need: int) -> np.ndarray:
        """The memo of :meth:`_drift`: ``float64[4 x len(streams), >= need - 1]``, rows the
        lattices of ``epoch`` and ``epoch + 1`` at each point, then at its right neighbour
        (``need``: lattice points the positions asked for need)."""
        p = self.params
        mk = (key, streams, "drift", epoch)
        arr = self._memo.get(mk)
        if arr is None or arr.shape[1] < need - 1:
            # headroom: the sequence grows while an epoch lasts (drift_period steps)
            grow = int(p.drift_period / float(p.correlation_length)) + 1  # lattice points per epoch
            a = self._lattice_arr(key, streams, epoch, need + grow, grow)
            b = self._lattice_arr(key, streams, epoch + 1, need + grow, 2 * grow)
            w = min(a.shape[1], b.shape[1]) - 1
            self._drop((key, streams, "drift", epoch - 1))  # steps only go forward
            self._drop((key, streams, epoch - 1))
            arr = self._remember(mk, np.concatenate([a[:, :w], b[:, :w], a[:, 1:w + 1], b[:, 1:w + 1]]))
        else:
            self._memo.move_to_end(mk)
        return arr

    def _still_drift_arr(self, key: int, streams: tuple, epoch: int, need: int) -> np.ndarray:
        """:meth:`_drift_arr`'s layout at a step where the drift's second epoch has weight
        ``sin th = 0``: the rows of ``epoch`` as there, the rows of ``epoch + 1`` zeros (a
        still round reads only the first epoch's field; the second's lattice is not drawn).
        Memoised apart from :meth:`_drift_arr`'s."""
        mk = (key, streams, "still drift", epoch)
        arr = self._memo.get(mk)
        if arr is None or arr.shape[1] < need - 1:
            a = self._lattice_arr(key, streams, epoch, need)
            S = len(streams)
            w = a.shape[1] - 1
            arr = np.zeros((4 * S, w), dtype=np.float64)
            arr[:S] = a[:, :w]
            arr[2 * S:3 * S] = a[:, 1:w + 1]
            arr = self._remember(mk, arr)
        else:
            self._memo.move_to_end(mk)
        return arr

    def _stream(self, key: int, streams: tuple, pos: np.ndarray, step: int, ip,
                hi: Optional[int] = None) -> np.ndarray:
        """``Z_s(p, step)`` of each stream in ``streams`` (module docstring): one row each. The
        streams share positions and epochs, so they are computed together (same elementwise
        arithmetic as one stream at a time). ``ip``: :meth:`_interp` of ``pos``; ``hi``:
        ``max(pos) + 1`` if the caller knows it."""
        p = self.params
        if p.drift <= 0.0 or p.drift_period <= 0:
            return self._static(key, streams, pos, ip, 1.0, hi)
        e, r = divmod(int(step), int(p.drift_period))
        th = 0.5 * math.pi * r / p.drift_period
        if ip is None:
            dyn = (math.cos(th) * self._field(key, streams, e, pos, ip)
                   + math.sin(th) * self._field(key, streams, e + 1, pos, ip))
        else:
            dyn = self._drift(key, streams, e, ip, math.cos(th), math.sin(th))
        return self._static(key, streams, pos, ip, math.sqrt(1.0 - p.drift), hi) + math.sqrt(p.drift) * dyn

    def latent(self, request_key: int, positions, num_groups: int, step: int = 0,
               hi: Optional[int] = None) -> np.ndarray:
        """``float64[num_groups, n]`` standard-normal latent z_g(p, step) (before the heavy tail).
        ``hi``: ``max(positions) + 1`` if the caller knows it."""
        pos = np.asarray(positions, dtype=np.int64)
        if hi is None and pos.size:
            hi = int(pos.max()) + 1
        rho = float(self.params.head_correlation)
        ip = self._interp(pos, hi)
        if rho >= 1.0:
            shared = self._stream(request_key, (_SHARED,), pos, step, ip, hi)
            return np.repeat(shared, num_groups, axis=0)
        if rho > 0:
            z = self._stream(request_key, (_SHARED,) + tuple(range(num_groups)), pos, step, ip, hi)
            shared, own = z[0], z[1:]
        else:
            shared, own = 0.0, self._stream(request_key, tuple(range(num_groups)), pos, step, ip, hi)
        return math.sqrt(rho) * shared + math.sqrt(1.0 - rho) * own

    def group_sigma(self, request_key: int, num_groups: int) -> np.ndarray:
        """``float64[num_groups]``: per-group sigma (mean-one lognormal spread around ``sigma``)."""
        return self._sigma(request_key, num_groups).copy()

    def _sigma(self, request_key: int, num_groups: int) -> np.ndarray:
        """:meth:`group_sigma` without the copy (the memo's array: not to be written)."""
        p = self.params
        if p.sigma_spread <= 0:
            return np.full(num_groups, p.sigma, dtype=np.float64)
        mk = (request_key, num_groups)
        sig = self._sigma_memo.get(mk)
        if sig is None:  # a pure function of (seed, request_key, num_groups): memoised
            n = _gauss(self.seed, request_key, _SIGMA, 0, np.arange(num_groups))
            sig = p.sigma * np.exp(p.sigma_spread * n - 0.5 * p.sigma_spread ** 2)
            if len(self._sigma_memo) >= self.MEMO_ENTRIES:
                self._sigma_memo.clear()
            self._sigma_memo[mk] = sig
        return sig

    def scores(self, request_key: int, positions, num_groups: int, step: int = 0,
               seq_len: Optional[int] = None) -> np.ndarray:
        """Importance scores ``float32[num_groups, len(positions)]`` (> 0; larger = more important).

        Args:
          request_key: request identifier (any int).
          positions: ``int[n]`` token positions (any order, may repeat).
          num_groups: selection groups (1 for union mode).
          step: decode steps done (drift clock).
          seq_len: current sequence length (recency anchor); default ``max(positions) + 1``.
        Raises ValueError on negative positions or num_groups < 1.
        """
        pos = np.asarray(positions, dtype=np.int64).ravel()
        if num_groups < 1:
            raise ValueError(f"num_groups must be >= 1, got {num_groups}")
        if pos.size and pos.min() < 0:
            raise ValueError("positions must be >= 0")
        if pos.size == 0:
            return np.zeros((num_groups, 0), dtype=np.float32)
        hi = int(pos.max()) + 1
        return self._scores(request_key, pos, num_groups, step, hi if seq_len is None else seq_len, hi)

    def _scores(self, request_key: int, pos: np.ndarray, num_groups: int, step: int,
                seq_len: int, hi: Optional[int] = None, lo: int = 0) -> np.ndarray:
        """:meth:`scores` without its checks: ``pos`` a non-empty ``int64[n]`` of positions >= 0;
        ``hi``: ``max(pos) + 1`` if the caller knows it; ``lo``: a lower bound of ``pos``.

        The recency term ``log(1 + recency_boost exp(-age / recency_window))`` is read from a
        table over every age (grown by doubling, the same elementwise arithmetic); sink tokens
        get theirs computed with the boost. With interpolated, drifting, partly shared fields
        (the defaults) one compiled pass (:func:`_fused_logs`) computes the log-scores from the
        memos, with the sink positions' recency terms computed in numpy; the exponential stays
        in numpy, so both ways give the same bits."""
        p = self.params
        if hi is None:
            hi = int(pos.max()) + 1
        if self._fused:
            sink = None
            if p.sink_tokens > lo and int(pos.min()) < p.sink_tokens:
                # the sink positions' recency terms, computed as the numpy path computes them
                # (the same array of their ages, in the same order), looked up by position
                age = np.maximum(seq_len - 1 - pos, 0)
                sk = pos < p.sink_tokens
                a = age[sk].astype(np.float64)
                sink = np.zeros(min(int(p.sink_tokens), hi) + 1, dtype=np.float64)  # (+ unused)
                sink[pos[sk]] = np.log((1.0 + p.recency_boost * np.exp(-a / p.recency_window))
                                       * p.sink_boost)
            return np.exp(self._logs_fused(request_key, pos, num_groups, step, int(seq_len), hi,
                                           sink)).astype(np.float32)
        z = self.latent(request_key, pos, num_groups, step, hi)
        sig = self._sigma(request_key, num_groups)[:, None]
        logs = sig * z
        age = np.maximum(seq_len - 1 - pos, 0)
        lm = np.take(self._lm_table(int(seq_len)), age)
        if p.sink_tokens > 0 and int(pos.min()) < p.sink_tokens:
            sk = pos < p.sink_tokens
            a = age[sk].astype(np.float64)
            lm[sk] = np.log((1.0 + p.recency_boost * np.exp(-a / p.recency_window)) * p.sink_boost)
        logs = logs + lm[None, :]
        return np.exp(np.clip(logs, -80.0, 80.0)).astype(np.float32)

    @property
    def _fused(self) -> bool:
        """Whether :meth:`_logs_fused` applies: :attr:`compiled`, interpolated fields (L > 1),
        drift in (0, 1] with a period, head correlation in (0, 1)."""
        p = self.params
        return (self.compiled and float(p.correlation_length) > 1.0 and 0.0 < p.drift <= 1.0 and p.drift_period > 0
                and 0.0 < p.head_correlation < 1.0)

    def _lm_table(self, top: int) -> np.ndarray:
        """``log(1 + recency_boost exp(-age / recency_window))`` at every age ``0..>= top-1``
        (``float64``, grown by doubling)."""
        p = self.params
        tab = self._lm_tab
        if tab is None or tab.size < top:
            n = max(top, 2 * tab.size if tab is not None else 4096)
            a = np.arange(n, dtype=np.int64).astype(np.float64)
            tab = self._lm_tab = np.log(1.0 + p.recency_boost * np.exp(-a / p.recency_window))
        return tab

    def _logs_fused(self, request_key: int, pos: np.ndarray, num_groups: int, step: int,
                    seq_len: int, hi: int, sink: Optional[np.ndarray] = None) -> np.ndarray:
        """The clipped log-scores ``float64[num_groups, n]`` of :meth:`_scores` (:attr:`_fused`
        holds) in one compiled pass over the memos: the same elementwise arithmetic, in the
        same order, as :meth:`latent` and :meth:`_scores`. ``sink``: the recency term of each
        sink position ``p < len(sink) - 1`` asked for (``float64``, indexed by position, one
        unused entry at the end), None when no sink position is asked for."""
        p = self.params
        rho = float(p.head_correlation)
        tab = self._ip_table(hi)
        need = int(tab[0][1, hi - 1]) + 1
        streams = (_SHARED,) + tuple(range(num_groups))
        e, r = divmod(int(step), int(p.drift_period))
        th = 0.5 * math.pi * r / p.drift_period
        dr = self._drift_arr(request_key, streams, e, need)
        st = self._static_arr(request_key, streams, math.sqrt(1.0 - p.drift), hi)
        out = np.empty((num_groups, len(pos)), dtype=np.float64)
        _fused_logs(pos, tab[0], tab[1], st, dr, math.cos(th), math.sin(th), math.sqrt(p.drift),
                    math.sqrt(rho), math.sqrt(1.0 - rho), self._sigma(request_key, num_groups),
                    self._lm_table(seq_len), _NO_SINK if sink is None else sink, seq_len, out)
        return out

    def log_score_terms(self, request_key: int, num_groups: int, step: int, seq_len: int,
                        hi: int, static_lattice: bool = False,
                        static: Optional[np.ndarray] = None) -> Optional["LogScoreTerms"]:
        """The :class:`LogScoreTerms` of ``request_key``'s scores at ``step`` with recency
        anchor ``seq_len``, for positions ``0..hi-1`` (``hi >= 1``), or None when
        :attr:`_fused` does not hold. ``f32(exp(log_score_at(g, p, *terms)))`` is the very
        float32 :meth:`scores` gives position ``p`` of group ``g`` (whatever other positions
        are asked with it): the same memos and, for sink positions, the same numpy
        expression of their recency terms. ``static_lattice``: ``static`` holds the static
        fields' lattice values instead of the dense memo, and ``consts`` a sixth entry, the
        memo's scale sqrt(1 - drift) (for :func:`log_score_lattice_at`); at a step where the
        drift's second epoch has weight ``sin th = 0`` its rows in ``drift`` are zeros
        (:meth:`_still_drift_arr`: the compiled rounds read the first epoch only there).
        ``static``: as :meth:`stream_terms` takes it."""
        if not self._fused:
            return None
        p = self.params
        tab, st, dr, consts = self.stream_terms(request_key, num_groups, step, hi, static_lattice,
                                                static)
        ns = min(int(p.sink_tokens), hi)
        sink = _NO_SINK
        if ns > 0:
            # (as _scores computes them: the ages as float64, then the numpy expression)
            a = np.maximum(seq_len - 1 - np.arange(ns, dtype=np.int64), 0).astype(np.float64)
            sink = np.empty(ns + 1, dtype=np.float64)
            sink[:ns] = np.log((1.0 + p.recency_boost * np.exp(-a / p.recency_window))
                               * p.sink_boost)
            sink[ns] = 0.0
        return LogScoreTerms(tab[0], tab[1], st, dr, consts, self._sigma(request_key, num_groups),
                             self._lm_table(int(seq_len)), sink, int(seq_len))

    def stream_terms(self, request_key: int, num_groups: int, step: int, hi: int,
                     static_lattice: bool = False, static: Optional[np.ndarray] = None) -> tuple:
        """The stream part of :meth:`log_score_terms` (:attr:`_fused` must hold): ``((ip_i,
        ip_f), static, drift, consts)``, without the recency terms. ``static``: the ``static``
        an earlier call for this request and ``num_groups`` returned (without
        ``static_lattice``), returned again when it covers ``hi`` positions (each value is a
        pure function of its position), so a request whose memo entry the LRU dropped in
        between does not compute it again."""
        p = self.params
        rho = float(p.head_correlation)
        tab = self._ip_table(hi)
        need = int(tab[0][1, hi - 1]) + 1
        streams = (_SHARED,) + tuple(range(num_groups))
        e, r = divmod(int(step), int(p.drift_period))
        th = 0.5 * math.pi * r / p.drift_period
        dr = (self._still_drift_arr(request_key, streams, e, need) if static_lattice and r == 0
              else self._drift_arr(request_key, streams, e, need))
        scale = math.sqrt(1.0 - p.drift)
        if static_lattice:
            st = self._lattice_arr(request_key, streams, _STATIC, need)
        elif static is not None and static.shape[1] >= hi:
            st = static
        else:
            st = self._static_arr(request_key, streams, scale, hi)
        consts = np.array([math.cos(th), math.sin(th), math.sqrt(p.drift), math.sqrt(rho),
                           math.sqrt(1.0 - rho)] + ([scale] if static_lattice else []))
        return tab, st, dr, consts


def make_importance(cfg) -> "ImportanceModel | RecordedImportance":
    """Importance source of a score-ranking policy's options (``importance_source``).

    Raises ValueError for an unknown source or a recorded source without ``importance_file``.
    """
    src = cfg.importance_source
    if src == "generative":
        return ImportanceModel(cfg.importance, seed=cfg.seed)
    if src == "recorded":
        if not cfg.importance_file:
            raise ValueError("importance_source=recorded needs importance_file (a Parquet path)")
        return RecordedImportance(cfg.importance_file)
    raise ValueError(f"unknown importance_source {src!r}; valid: generative, recorded")


def score_slots(source, layout, step: int = 0, seq_len: Optional[int] = None,
                from_pos: int = 0) -> np.ndarray:
    """Scores aligned to a layout's slots: ``float32[H, S]``, ``-inf`` in empty slots.

    ``source``: an :class:`ImportanceModel` or :class:`RecordedImportance`. Positions are read from
    ``layout.slot_pos``; ``seq_len`` defaults to ``layout.next_position``. ``from_pos``: slots
    holding a position below it are left at ``-inf`` unscored (a policy's
    ``scores_from(layout)``: the protected prompt, whose scores its selection never reads); a
    score depends on its own position only, so the others are the same either way.
    """
    H, S = layout.slot_pos.shape
    out = np.full((H, S), -np.inf, dtype=np.float32)
    seq = layout.next_position if seq_len is None else seq_len
    if H == 1:
        # score the group's slots directly: a score is a function of its position alone (given
        # step and seq_len), so this equals scoring the sorted distinct positions and mapping back
        row = layout.slot_pos[0]
        lo = max(int(from_pos), 0)
        pos = np.empty(S, dtype=np.int64)
        n = _live_positions(row, lo, pos)  # the live slots' positions, in slot order
        if not n:
            return out
        pos = pos[:n]
        hi = int(pos.max()) + 1
        seq = max(seq, hi)  # the largest live position is always scored
        if isinstance(source, ImportanceModel):
            sc = source._scores(layout.request_key, pos, 1, step, seq, hi, int(from_pos))[0]
        else:
            sc = source.scores(layout.request_key, pos, 1, step=step, seq_len=seq)[0]
        _scatter_live(row, lo, np.ascontiguousarray(sc, dtype=np.float32), out[0])
        return out
    # several groups: the distinct live positions in order, scored once for all groups, each
    # slot given its group's score of its position (compiled: a position -> rank table over
    # [lo, max position] instead of a sort; the same positions and mapping as np.unique)
    lo = max(int(from_pos), 0)
    slot_pos = np.ascontiguousarray(layout.slot_pos, dtype=np.int32)
    top = int(slot_pos.max()) + 1 if slot_pos.size else 0
    if top <= lo:
        return out
    rank = np.full(top - lo, -1, dtype=np.int64)
    pos_all = np.empty(top - lo, dtype=np.int64)
    n = _rank_live_positions(slot_pos, lo, rank, pos_all)
    pos_all = pos_all[:n]
    sc = source.scores(layout.request_key, pos_all, H, step=step, seq_len=max(seq, int(pos_all[-1]) + 1))
    _scatter_groups(slot_pos, lo, rank, np.ascontiguousarray(sc, dtype=np.float32), out)
    return out


@kernel("void(f8[:, :], i8[:], i8[:], f8[:], f8[:], f8[:], f8, f8[:, :])")
def _interp_rows(lat, i0, i1, t, omt, den, scale, out):  # pragma: no cover (compiled)
    """``out[s, j] = scale x ((omt[j] lat[s, i0[j]] + t[j] lat[s, i1[j]]) / den[j])`` (the
    scale left out when 1.0): :meth:`ImportanceModel._field`'s interpolation of lattice
    ``lat`` at positions with interpolation terms ``i0, i1, t, omt, den``, and the static
    memo's scale, element by element in numpy's order."""
    for r in range(out.shape[0]):
        for j in range(out.shape[1]):
            v = (omt[j] * lat[r, i0[j]] + t[j] * lat[r, i1[j]]) / den[j]
            out[r, j] = v if scale == 1.0 else scale * v


@kernel("i8(i4[:, :], i8, i8[:], i8[:])")
def _rank_live_positions(slot_pos, lo, rank, pos_all):  # pragma: no cover (compiled)
    """:func:`score_slots`' distinct live positions (``>= lo``) of all groups, ascending, into
    ``pos_all``; ``rank[p - lo]`` = the index of position ``p`` there (``rank`` holds -1 over
    ``[lo, max position]`` on entry). Returns how many."""
    for g in range(slot_pos.shape[0]):
        for i in range(slot_pos.shape[1]):
            p = slot_pos[g, i]
            if p >= lo:
                rank[p - lo] = 0
    n = 0
    for j in range(rank.shape[0]):
        if rank[j] == 0:
            rank[j] = n
            pos_all[n] = j + lo
            n += 1
    return n


@kernel("void(i4[:, :], i8, i8[:], f4[:, :], f4[:, :])")
def _scatter_groups(slot_pos, lo, rank, sc, out):  # pragma: no cover (compiled)
    """``out[g, i] = sc[g, rank[p - lo]]`` for each live slot (position ``p = slot_pos[g, i] >=
    lo``): the scores of :func:`_rank_live_positions`' positions back to the slots."""
    for g in range(slot_pos.shape[0]):
        for i in range(slot_pos.shape[1]):
            p = slot_pos[g, i]
            if p >= lo:
                out[g, i] = sc[g, rank[p - lo]]


@kernel("i8(i4[:], i8, i8[:])")
def _live_positions(row, lo, pos):  # pragma: no cover (compiled)
    """:func:`score_slots`' live slots of one group: the positions ``>= lo`` held in ``row``
    (slot -> position, -1 when empty), in slot order, into ``pos``; returns how many."""
    n = 0
    for i in range(row.shape[0]):
        if row[i] >= lo:
            pos[n] = row[i]
            n += 1
    return n


@kernel("void(i4[:], i8, f4[:], f4[:])")
def _scatter_live(row, lo, vals, out):  # pragma: no cover (compiled)
    """``out[slot] = vals[j]`` for the ``j``-th slot of ``row`` holding a position ``>= lo``
    (the inverse of :func:`_live_positions`)."""
    j = 0
    for i in range(row.shape[0]):
        if row[i] >= lo:
            out[i] = vals[j]
            j += 1
