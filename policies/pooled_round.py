"""The compiled round of SnapKV's family (SnapKV, PyramidKV, Ada-KV) on the generative model.

A SnapKV round scores every prompt position of every group once, max-pools the scores along
positions and keeps the top of each group (Li et al., NeurIPS 2024; Cai et al., 2024; Feng et
al., 2024). With PyramidKV's and Ada-KV's ``per_layer_per_head`` groups (a 36-layer model with
8 KV heads: 288 groups) that is millions of scores a round, so the kernels here work group by
group, with the group's scores, pooled scores and ranking in arrays of one prompt's length
(they stay in the CPU's caches), and compute what the groups share (the shared stream and the
recency term of each position) once.

Every value is the arithmetic of :mod:`policies.score_terms`' helpers (:func:`lattice_stream_at`,
:func:`log_score_from_streams`, :func:`recency_at`) in the same order, so the keep masks are
those of :meth:`policies.snapkv.SnapKVPolicy.select` on :func:`policies.importance.score_slots`'
float32 scores (``tests/test_compiled_rounds.py`` checks it on random layouts and models).
"""

from __future__ import annotations

import numpy as np

from sim.jit import inline, kernel

from . import score_terms
from .score_terms import lattice_stream_at, log_score_from_streams, recency_at


@inline
def _window_max(v, n, nc, half, k, out, buf):  # pragma: no cover (compiled)
    """``out[i]`` for ``i < nc``: the largest of ``v[lo..hi]``, ``lo = max(i - half, 0)``,
    ``hi = min(i - half + k - 1, n - 1)`` (``k`` odd, ``half = k // 2``; the values finite),
    by van Herk and Gil-Werman's running maxima over blocks of ``k`` (three comparisons an
    entry whatever ``k``). ``out``: at least ``nc`` entries; ``buf``: scratch of at least
    ``nc + k - 1``."""
    if k == 1:
        for i in range(nc):
            out[i] = v[i]
        return
    # the window of entry i is [i - half, i + half] clipped to [0, n - 1]: over the padded
    # sequence u (u[q] = v[q - half], -inf outside), the window [i, i + k - 1] of u
    m = nc + k - 1  # entries of u the windows of 0..nc-1 reach
    ninf = -np.inf
    # forward running maxima within each block of k entries of u (g), backward ones (h)
    # g into buf, h into out (out[i] only needs h[i] and g[i + k - 1]: h first, then combined)
    for b0 in range(0, m, k):
        b1 = min(b0 + k, m)
        run = ninf
        for q in range(b0, b1):
            x = v[q - half] if 0 <= q - half < n else ninf
            run = x if x > run else run
            buf[q] = run
    for b0 in range(0, m, k):
        b1 = min(b0 + k, m)
        run = ninf
        for q in range(b1 - 1, b0 - 1, -1):
            x = v[q - half] if 0 <= q - half < n else ninf
            run = x if x > run else run
            if q < nc:
                out[q] = run
    for i in range(nc):
        a = out[i]
        c = buf[i + k - 1]
        out[i] = a if a > c else c


@inline
def kth_largest(x, n, kg, buf):  # pragma: no cover (compiled)
    """The ``kg``-th largest of ``x[:n]`` (``1 <= kg <= n``, values not NaN): the value
    ``np.partition(x[:n], n - kg)[n - kg]`` gives. The values between two order statistics of
    a sample of ``x`` that bracket the rank are gathered into ``buf`` (``n`` entries) and
    partitioned there; a rank outside the bracket partitions all of them."""
    t = n - kg  # rank, ascending from 0
    if n > 2048:
        m = 256
        smp = np.empty(m, dtype=np.float64)
        for i in range(m):
            smp[i] = x[(i * n) // m]
        smp.sort()
        c = (t * m) // n
        lo = smp[max(c - 24, 0)]
        hi = smp[min(c + 24, m - 1)]
        below = 0
        nb = 0
        for i in range(n):
            y = x[i]
            if y < lo:
                below += 1
            elif y <= hi:
                buf[nb] = y
                nb += 1
        if below <= t < below + nb:
            return np.partition(buf[:nb], t - below)[t - below]
    for i in range(n):
        buf[i] = x[i]
    return np.partition(buf[:n], t)[t]


@inline
def _still_stream(r, p, ip_i, ip_f, slat, drift, consts):  # pragma: no cover (compiled)
    """:func:`lattice_stream_at` of stream ``r`` at position ``p`` when the drift's second
    epoch has weight ``sin th = 0`` (``consts[1] == 0``, a round at step 0): only the first
    epoch's field is read, ``c F_e`` for ``c F_e + 0 F_(e+1)``: the same number whenever ``c
    F_e`` is not zero, and otherwise one that differs only in the sign of a zero, which no
    comparison or exponential downstream tells apart. (The caller picks this helper or
    :func:`lattice_stream_at` outside its loop: a branch around array reads inside a helper
    keeps numba's reference counting in the loop.)"""
    i0 = ip_i[0, p]
    t = ip_f[0, p]
    omt = ip_f[1, p]
    den = ip_f[2, p]
    S = slat.shape[0]
    fe = (omt * drift[r, i0] + t * drift[r + 2 * S, i0]) / den
    return consts[5] * ((omt * slat[r, i0] + t * slat[r, i0 + 1]) / den) + consts[2] * (consts[0] * fe)


@inline
def _shared_terms(top, ip_i, ip_f, slat, drift, consts, lm, sink, seq_len, z0,
                  rec):  # pragma: no cover (compiled)
    """The shared stream ``z0[p]`` and the recency term ``rec[p]`` of every position ``p <
    top`` (the same for every group)."""
    if consts[1] == 0.0:
        for p in range(top):
            z0[p] = _still_stream(0, p, ip_i, ip_f, slat, drift, consts)
    else:
        for p in range(top):
            z0[p] = lattice_stream_at(0, p, ip_i, ip_f, slat, drift, consts)
    for p in range(top):
        rec[p] = recency_at(p, lm, sink, seq_len)


@inline
def _region(slot_pos, g, P, cut, top, keep, rj, rp):  # pragma: no cover (compiled)
    """Group ``g``'s pooling region: its live slots holding positions below ``P``, in slot
    order, into ``rj`` (slots) and ``rp`` (positions); live slots holding positions ``>= cut``
    are kept (``keep[g]``). Returns ``(n, nc)``: region entries and candidates (the leading
    entries, positions below ``cut``, as the positions increase along the region), or ``(-1,
    -1)`` when they do not increase or one is ``>= top``."""
    n = 0
    nc = 0
    last = -1
    for j in range(slot_pos.shape[1]):
        p = slot_pos[g, j]
        if p >= cut:
            keep[g, j] = True
        if p >= 0 and p < P:
            if p <= last or p >= top:
                return -1, -1
            last = p
            rj[n] = j
            rp[n] = p
            n += 1
            if p < cut:
                nc += 1
    return n, nc


@inline
def _pool_group(g, rp, n, nc, k, z0, rec, ip_i, ip_f, slat, drift, consts, sig, v, pooled,
                tmp):  # pragma: no cover (compiled)
    """``pooled[i]``, ``i < nc``: group ``g``'s max-pooled clipped log-score of region entry
    ``i`` (kernel ``k``) from :func:`_shared_terms`' ``z0`` and ``rec`` (``v``, ``tmp``:
    scratch)."""
    half = k // 2
    m = min(n, nc + half)  # (the candidates' windows reach half entries past the last one)
    if consts[1] == 0.0:
        for i in range(m):
            p = rp[i]
            v[i] = log_score_from_streams(
                g, z0[p], _still_stream(g + 1, p, ip_i, ip_f, slat, drift, consts), rec[p], consts,
                sig)
    else:
        for i in range(m):
            p = rp[i]
            v[i] = log_score_from_streams(
                g, z0[p], lattice_stream_at(g + 1, p, ip_i, ip_f, slat, drift, consts), rec[p],
                consts, sig)
    _window_max(v, m, nc, half, k, pooled, tmp)


@kernel("i8(i4[:, :], i8, i8, i8, i8[:], i8[:, :], f8[:, :], f8[:, :], f8[:, :], f8[:], f8[:], "
        "f8[:], f8[:], i8, f8, b1[:, :], i8[:, :], f8[:])", depends=(score_terms,))
def snap_keep(slot_pos, P, k, cut, kg_all, ip_i, ip_f, slat, drift, consts, sig, lm, sink, seq_len,
              eps, keep, pend, pend_v):  # pragma: no cover (compiled)
    """SnapKV's keep mask in one pass per group, from the terms of ``log_score_terms(...,
    static_lattice=True)``.

    Per group ``g`` (row of ``slot_pos``, ``int32[H, S]``): the live slots holding prompt
    positions (below ``P``), in slot order, are the pooling region; each gets the largest
    clipped log-score of the region entries ``i - k // 2 .. i - k // 2 + k - 1`` around it
    (``k``: the pooling kernel, odd, at most ``2 S - 1``). Live slots holding a position
    ``>= cut`` (the observation window and decode tokens) are kept; of those below it (the
    candidates), the top ``kg_all[g]`` by pooled log-score are kept, as
    :func:`policies.selection.topk_mask` ranks their float32 scores ``f32(exp(.))``: where more
    candidates lie within ``2 eps`` (``eps``: the bound on the log-domain error,
    :data:`policies.selection.KEY_EPS`) of the ``kg``-th largest than places are left, they go
    to ``pend`` (group, slot, places left, 1) and ``pend_v`` (pooled log-score) in slot order,
    for :func:`policies.selection._rank_band`. ``keep`` (``bool[H, S]``, False on entry) gets
    the rest.

    Returns the band rows written, or -1 (``keep`` partly written) when a group's prompt
    positions do not increase along its slots, a prompt position lies beyond the terms'
    tables, or ``pend`` cannot hold the band."""
    H, S = slot_pos.shape
    rj = np.empty(S, dtype=np.int64)
    rp = np.empty(S, dtype=np.int64)
    v = np.empty(S, dtype=np.float64)
    pooled = np.empty(S, dtype=np.float64)
    tmp = np.empty(S + k, dtype=np.float64)  # (_window_max's scratch: nc + k - 1 entries)
    top = min(P, ip_i.shape[1])
    z0 = np.empty(top, dtype=np.float64)
    rec = np.empty(top, dtype=np.float64)
    _shared_terms(top, ip_i, ip_f, slat, drift, consts, lm, sink, seq_len, z0, rec)
    n_pend = 0
    for g in range(H):
        n, nc = _region(slot_pos, g, P, cut, top, keep, rj, rp)
        if n < 0:
            return -1
        kg = kg_all[g]
        if kg <= 0 or nc == 0:
            continue
        if nc <= kg:
            for i in range(nc):
                keep[g, rj[i]] = True
            continue
        _pool_group(g, rp, n, nc, k, z0, rec, ip_i, ip_f, slat, drift, consts, sig, v, pooled, tmp)
        thr = kth_largest(pooled, nc, kg, tmp)
        above = thr + 2.0 * eps
        below = thr - 2.0 * eps
        certain = 0
        band = 0
        for i in range(nc):
            if pooled[i] > above:
                certain += 1
            elif pooled[i] >= below:
                band += 1
        need = kg - certain
        if need != band and n_pend + band > pend.shape[0]:
            return -1
        for i in range(nc):
            x = pooled[i]
            if x > above or (need == band and x >= below):
                keep[g, rj[i]] = True
            elif x >= below:
                pend[n_pend, 0] = g
                pend[n_pend, 1] = rj[i]
                pend[n_pend, 2] = need
                pend[n_pend, 3] = 1
                pend_v[n_pend] = x
                n_pend += 1
    return n_pend


@kernel("i8(i4[:, :], i8, i8, i8, i8[:, :], f8[:, :], f8[:, :], f8[:, :], f8[:], f8[:], f8[:], "
        "f8[:], i8, b1[:, :], f8[:], i8[:], i8[:])", depends=(score_terms,))
def ada_pooled(slot_pos, P, k, cut, ip_i, ip_f, slat, drift, consts, sig, lm, sink, seq_len, keep,
               cv, cj, off):  # pragma: no cover (compiled)
    """Ada-KV's pooled log-scores (:func:`snap_keep`'s pooling) of every candidate, group by
    group: group ``g``'s candidates (live slots holding positions below ``cut``, in slot
    order) are entries ``off[g]..off[g + 1] - 1`` of ``cv`` (pooled clipped log-score) and
    ``cj`` (slot), ``cv``, ``cj`` of ``H x S`` entries; live slots holding positions ``>=
    cut`` are kept (``keep``). Returns the candidates, or -1 where :func:`snap_keep` returns
    it for the region."""
    H, S = slot_pos.shape
    rj = np.empty(S, dtype=np.int64)
    rp = np.empty(S, dtype=np.int64)
    v = np.empty(S, dtype=np.float64)
    pooled = np.empty(S, dtype=np.float64)
    tmp = np.empty(S + k, dtype=np.float64)
    top = min(P, ip_i.shape[1])
    z0 = np.empty(top, dtype=np.float64)
    rec = np.empty(top, dtype=np.float64)
    _shared_terms(top, ip_i, ip_f, slat, drift, consts, lm, sink, seq_len, z0, rec)
    o = 0
    for g in range(H):
        off[g] = o
        n, nc = _region(slot_pos, g, P, cut, top, keep, rj, rp)
        if n < 0:
            return -1
        if nc:
            _pool_group(g, rp, n, nc, k, z0, rec, ip_i, ip_f, slat, drift, consts, sig, v, pooled,
                        tmp)
            for i in range(nc):
                cv[o + i] = pooled[i]
                cj[o + i] = rj[i]
            o += nc
    off[H] = o
    return o


@kernel("void(f4[:], i8[:], i8[:], f8[:, :])")
def scatter_rows(e, cj, off, out):  # pragma: no cover (compiled)
    """``out[g, cj[i]] = e[i]`` for the entries ``off[g]..off[g + 1] - 1`` of each group
    (``out``: zeros elsewhere, as the caller made it)."""
    for g in range(out.shape[0]):
        for i in range(off[g], off[g + 1]):
            out[g, cj[i]] = e[i]


@inline
def _top_by_value(x, idx, base, n, kk, buf, out_keep):  # pragma: no cover (compiled)
    """The ``kk`` entries of ``x[:n]`` with the largest values, ties to the lower entry (as
    :func:`policies.selection.topk_mask` ranks a row): ``out_keep[j] = True`` for each, ``j =
    idx[i]``, or ``base + i`` when ``idx`` is empty. ``buf``: ``n`` entries of scratch."""
    if kk <= 0 or n == 0:
        return
    direct = idx.shape[0] == 0
    if kk >= n:
        for i in range(n):
            out_keep[base + i if direct else idx[i]] = True
        return
    thr = kth_largest(x, n, kk, buf)
    above = 0
    for i in range(n):
        if x[i] > thr:
            above += 1
    ties = kk - above
    for i in range(n):
        y = x[i]
        if y > thr or (y == thr and ties > 0):
            if y == thr:
                ties -= 1
            out_keep[base + i if direct else idx[i]] = True


@kernel("void(f4[:], i8[:], i8[:], f8[:], i8[:], i8, i8, b1[:, :])")
def ada_keep(e, cj, off, den, layer_start, per_head, floor, keep):  # pragma: no cover (compiled)
    """Ada-KV's keep (:meth:`policies.snapkv.AdaKVPolicy._keep_pooled`) from the candidates'
    float32 pooled scores ``e`` (:func:`ada_pooled`'s order) and each group's normaliser
    ``den`` (``max(sum of its scores, 1e-300)``, as numpy sums the row): per group the top
    ``floor`` by normalised score ``e / den``, then per layer (groups ``layer_start[l] ..
    layer_start[l + 1] - 1``) the top ``per_head x groups - kept`` of the others by the same
    score, ties to the lower group, then the lower slot; into ``keep`` (``bool[H, S]``)."""
    H, S = keep.shape
    tot = off[H]
    p = np.empty(tot, dtype=np.float64)
    for g in range(H):
        for i in range(off[g], off[g + 1]):
            p[i] = np.float64(e[i]) / den[g]
    wide = 0  # (the most candidates of a group or a layer: the scratch arrays' length)
    for l in range(layer_start.shape[0] - 1):
        wide = max(wide, off[layer_start[l + 1]] - off[layer_start[l]])
    buf = np.empty(wide, dtype=np.float64)
    vals = np.empty(wide, dtype=np.float64)
    idx = np.empty(wide, dtype=np.int64)
    flat_keep = np.zeros(tot, dtype=np.bool_)
    none = idx[:0]
    for g in range(H):
        a = off[g]
        _top_by_value(p[a:off[g + 1]], none, a, off[g + 1] - a, floor, buf, flat_keep)
    for l in range(layer_start.shape[0] - 1):
        g0 = layer_start[l]
        g1 = layer_start[l + 1]
        n_l = 0
        kept_l = 0
        for i in range(off[g0], off[g1]):
            if flat_keep[i]:
                kept_l += 1
            else:
                vals[n_l] = p[i]
                idx[n_l] = i
                n_l += 1
        extra = per_head * (g1 - g0) - kept_l
        if extra > 0:
            _top_by_value(vals, idx[:n_l], 0, n_l, extra, buf, flat_keep)
    for g in range(H):
        for i in range(off[g], off[g + 1]):
            if flat_keep[i]:
                keep[g, cj[i]] = True
