"""The generative importance model's clipped log-scores, computed inside compiled loops: the
terms one request's scores need (:class:`LogScoreTerms`, from
:meth:`policies.importance.ImportanceModel.log_score_terms`) and the :func:`sim.jit.inline`
helpers that evaluate a (group, position) from them (:func:`log_score_at`,
:func:`lattice_stream_at`, :func:`log_score_from_streams`, :func:`recency_at`), with the same
arithmetic as the model's numpy path. A kernel in another module that calls these helpers lists
this module in ``kernel(..., depends=...)``."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sim.jit import inline, kernel


_NO_SINK = np.zeros(1, dtype=np.float64)  # (no sink position: the one unused entry)


class LogScoreTerms(NamedTuple):
    """What a compiled loop needs to compute one request's clipped log-scores at any (group,
    position) asked for (:func:`log_score_at`), from :meth:`ImportanceModel.log_score_terms`:
    the interpolation tables ``ip_i`` (``int64[2, N]``) and ``ip_f`` (``float64[3, N]``), the
    scaled static fields ``static`` (``float64[G + 1, >= hi]``: the shared stream, then one
    per group), the two drift epochs ``drift`` (``float64[4 (G + 1), >= lattice points]``),
    ``consts`` = ``float64[5]`` (cos th, sin th, sqrt(drift), sqrt(rho), sqrt(1 - rho)), the
    per-group ``sig`` (``float64[G]``), the recency table ``lm`` (``float64[>= seq_len]``, by
    age), the sink positions' recency terms ``sink`` (``float64[min(sink_tokens, hi) + 1]``, by
    position) and ``seq_len``. Valid for positions ``0..hi-1``."""

    ip_i: np.ndarray
    ip_f: np.ndarray
    static: np.ndarray
    drift: np.ndarray
    consts: np.ndarray
    sig: np.ndarray
    lm: np.ndarray
    sink: np.ndarray
    seq_len: int


@inline
def _drift_at(drift, S, r, i0, t, omt, den, c, s):  # pragma: no cover (compiled)
    """Stream ``r``'s drifting part ``c F_e + s F_(e+1)``, both epochs' fields interpolated
    between lattice points ``i0`` and ``i0 + 1`` (``drift``'s rows: epoch e, epoch e + 1 at the
    point, then at its right neighbour; ``S`` streams)."""
    fe = (omt * drift[r, i0] + t * drift[r + 2 * S, i0]) / den
    fe1 = (omt * drift[r + S, i0] + t * drift[r + 3 * S, i0]) / den
    return c * fe + s * fe1


@inline
def _stream_at(static, drift, S, r, p, i0, t, omt, den, c, s, sd):  # pragma: no cover (compiled)
    """Stream ``r``'s ``Z_r(p) = static[r, p] + sd (c F_e + s F_(e+1))`` (:func:`_drift_at`)."""
    return static[r, p] + sd * _drift_at(drift, S, r, i0, t, omt, den, c, s)


@inline
def _static_from_lattice(slat, r, i0, t, omt, den, scale):  # pragma: no cover (compiled)
    """Stream ``r``'s scaled static field between lattice points ``i0`` and ``i0 + 1`` of its
    lattice ``slat``: the arithmetic of :meth:`ImportanceModel._static_arr`'s memo."""
    return scale * ((omt * slat[r, i0] + t * slat[r, i0 + 1]) / den)


@inline
def _recency_at(p, lm, sink, seq_len):  # pragma: no cover (compiled)
    """Position ``p``'s recency term: ``sink[p]`` for a sink position ``p < len(sink) - 1``
    (``sink`` ends with one unused entry), else ``lm[age]`` with ``age = max(seq_len - 1 - p,
    0)``. Both arrays are read whatever ``p`` (in range), and the choice made on the values:
    a helper that branches around an array read keeps numba's reference counting in the
    loop (measured: 10x slower)."""
    n = sink.shape[0] - 1
    age = seq_len - 1 - p
    if age < 0:
        age = 0
    from_sink = sink[p if p < n else n]
    from_lm = lm[age]
    return from_sink if p < n else from_lm


@inline
def _clip80(v):  # pragma: no cover (compiled)
    """``v`` clipped to [-80, 80] (the log-score's range: exp stays a normal float32)."""
    if v < -80.0:
        v = -80.0
    elif v > 80.0:
        v = 80.0
    return v


@inline
def log_score_at(g, p, ip_i, ip_f, static, drift, consts, sig, lm, sink,
                 seq_len):  # pragma: no cover (compiled)
    """Group ``g``'s clipped log-score of position ``p`` from a :class:`LogScoreTerms`'
    fields: the very bits :meth:`ImportanceModel._scores` takes the exponential of (the same
    arithmetic in the same order as :func:`_fused_logs`)."""
    S = static.shape[0]
    i0 = ip_i[0, p]
    t = ip_f[0, p]
    omt = ip_f[1, p]
    den = ip_f[2, p]
    c = consts[0]
    s = consts[1]
    sd = consts[2]
    z0 = _stream_at(static, drift, S, 0, p, i0, t, omt, den, c, s, sd)
    z = consts[3] * z0 + consts[4] * _stream_at(static, drift, S, g + 1, p, i0, t, omt, den, c, s, sd)
    return _clip80(sig[g] * z + _recency_at(p, lm, sink, seq_len))


@inline
def lattice_stream_at(r, p, ip_i, ip_f, slat, drift, consts):  # pragma: no cover (compiled)
    """Stream ``r``'s ``Z_r(p)`` from the terms of ``log_score_terms(..., static_lattice=True)``:
    the static field interpolated from its lattice ``slat`` here (scale ``consts[5]``), the
    bits of the dense memo without building it (a per-layer-per-head request's 289 streams
    over its whole prompt)."""
    i0 = ip_i[0, p]
    t = ip_f[0, p]
    omt = ip_f[1, p]
    den = ip_f[2, p]
    return (_static_from_lattice(slat, r, i0, t, omt, den, consts[5])
            + consts[2] * _drift_at(drift, slat.shape[0], r, i0, t, omt, den, consts[0],
                                    consts[1]))


@inline
def log_score_from_streams(g, z0, zg, rec, consts, sig):  # pragma: no cover (compiled)
    """Group ``g``'s clipped log-score from the shared stream ``z0``, its own stream ``zg``
    and the position's recency term ``rec`` (:func:`_recency_at`): the arithmetic of
    :func:`_fused_logs`."""
    return _clip80(sig[g] * (consts[3] * z0 + consts[4] * zg) + rec)


@inline
def recency_at(p, lm, sink, seq_len):  # pragma: no cover (compiled)
    """Position ``p``'s recency term (:func:`_recency_at`)."""
    return _recency_at(p, lm, sink, seq_len)


@kernel("void(i8[:], i8[:], i8[:, :], f8[:, :], f8[:, :], f8[:, :], f8[:], f8[:], f8[:], f8[:], i8, "
        "f8[:])")
def log_scores_at(groups, positions, ip_i, ip_f, static, drift, consts, sig, lm, sink, seq_len,
                  out):  # pragma: no cover (compiled)
    """``out[i] = log_score_at(groups[i], positions[i], *terms)`` (dense :class:`LogScoreTerms`'
    fields)."""
    for i in range(groups.shape[0]):
        out[i] = log_score_at(groups[i], positions[i], ip_i, ip_f, static, drift, consts, sig, lm,
                              sink, seq_len)


@kernel("void(i8[:], i8[:, :], f8[:, :], f8[:, :], f8[:, :], f8, f8, f8, f8, f8, f8[:], f8[:], "
        "f8[:], i8, f8[:, :])")
def _fused_logs(pos, ip_i, ip_f, static, drift, c, s, sd, a, b, sig, lm, sink, seq_len,
                out):  # pragma: no cover
    """Per position ``pos[j]`` and group ``g``: ``clip(sig[g] z_g + lm[age], -80, 80)`` into
    ``out[g, j]`` (``sink[p]`` instead of ``lm[age]`` for a position below ``len(sink) - 1``),
    with ``z_g = a Z_0 + b Z_(g+1)`` and stream ``Z_r = static[r, p] + sd (c F_e
    + s F_(e+1))``, each field interpolated from ``drift`` (rows: epoch e, epoch e + 1 at the
    lattice point, then at its right neighbour; ``ImportanceModel._drift_arr``) with the terms of
    ``ip_i`` / ``ip_f`` (``ImportanceModel._ip_table``)."""
    S = static.shape[0]
    for j in range(pos.shape[0]):
        p = pos[j]
        i0 = ip_i[0, p]
        t = ip_f[0, p]
        omt = ip_f[1, p]
        den = ip_f[2, p]
        rec = _recency_at(p, lm, sink, seq_len)
        z0 = _stream_at(static, drift, S, 0, p, i0, t, omt, den, c, s, sd)
        for g in range(out.shape[0]):
            z = a * z0 + b * _stream_at(static, drift, S, g + 1, p, i0, t, omt, den, c, s, sd)
            out[g, j] = _clip80(sig[g] * z + rec)
