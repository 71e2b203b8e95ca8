"""The compiled round of SnapKV's family (SnapKV, PyramidKV, Ada-KV) on the generative model.

A SnapKV round scores every prompt position of every group once, max-pools the scores along
positions and keeps the top of each group (Li et al., NeurIPS 2024; Cai et al., 2024; Feng et
al., 2024). With PyramidKV's and Ada-KV's ``per_layer_per_head`` groups (a 36-layer model with
8 KV heads: 288 groups) that is millions of scores a round, so the kernels here work group by
group, with the group's scores, pooled scores and ranking in arrays of one prompt's length
(they stay in the CPU's caches), and compute what the groups share (the shared stream and the
recency term of each position) once. SnapKV and PyramidKV rank without scoring every
position: a group's scores are bounded per lattice cell from the cell's two lattice values
(:func:`_cell_bounds`), and only the segments of candidates whose bound reaches the group's
threshold are scored (:func:`_bounded_threshold`); Ada-KV's normaliser needs every score.

Every value is the arithmetic of :mod:`policies.score_terms`' helpers (:func:`lattice_stream_at`,
:func:`log_score_from_streams`, :func:`recency_at`) in the same order, so the keep masks are
those of :meth:`policies.snapkv.SnapKVPolicy.select` on :func:`policies.importance.score_slots`'
float32 scores (``tests/test_compiled_rounds.py`` checks it on random layouts and models).
"""

from __future__ import annotations

import numpy as np

from sim.jit import inline, kernel

from . import score_terms
from .score_terms import _clip80, lattice_stream_at, log_score_from_streams, recency_at


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
def _region(slot_pos, row, g, P, cut, top, keep, rj, rp):  # pragma: no cover (compiled)
    """Group ``g``'s pooling region, read from row ``row`` of ``slot_pos`` (``g``, or ``0`` for
    a shared row): its live slots holding positions below ``P``, in slot order, into ``rj``
    (slots) and ``rp`` (positions); live slots holding positions ``>= cut`` are kept
    (``keep[g]``). Returns ``(n, nc)``: region entries and candidates (the leading
    entries, positions below ``cut``, as the positions increase along the region), or ``(-1,
    -1)`` when they do not increase or one is ``>= top``."""
    n = 0
    nc = 0
    last = -1
    for j in range(slot_pos.shape[1]):
        p = slot_pos[row, j]
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
def _group_region(slot_pos, g, first, shared, P, cut, top, keep, rj, rp, cutj, n, nc,
                  ncut):  # pragma: no cover (compiled)
    """:func:`_region` of group ``g``: of row ``g`` of ``slot_pos``, or with ``shared`` of its
    one row, whose region (``rj``, ``rp``, ``n``, ``nc``) and kept slots (``cutj[:ncut]``) the
    ``first`` group finds and the others reuse. Returns ``(n, nc, ncut)``."""
    if not shared:
        n, nc = _region(slot_pos, g, g, P, cut, top, keep, rj, rp)
        return n, nc, 0
    if first:
        n, nc = _region(slot_pos, 0, g, P, cut, top, keep, rj, rp)
        ncut = 0
        for j in range(slot_pos.shape[1]):
            if keep[g, j]:
                cutj[ncut] = j
                ncut += 1
        return n, nc, ncut
    for i in range(ncut):
        keep[g, cutj[i]] = True
    return n, nc, ncut


@inline
def _still_run(g, lo, hi, p0, ip_i, ip_f, slat, drift, consts, sig, z0, rec,
               v):  # pragma: no cover (compiled)
    """``v[i]``, ``lo <= i < hi``: group ``g``'s clipped log-score of position ``p0 + i - lo``
    (consecutive positions) at a still round (``consts[1] == 0``), the arithmetic of
    :func:`_still_stream` and :func:`log_score_from_streams` in the same order, one lattice
    cell at a time: the cell's lattice values read once and the positions' terms in order (a
    loop the compiler vectorises)."""
    S = slat.shape[0]
    r = g + 1
    c0 = consts[0]
    c2 = consts[2]
    c3 = consts[3]
    c4 = consts[4]
    c5 = consts[5]
    sg = sig[g]
    d = lo - p0
    p = p0
    pe = p0 + hi - lo
    while p < pe:
        q = ip_i[0, p]
        e = p + 1
        while e < pe and ip_i[0, e] == q:
            e += 1
        sl = slat[r, q]
        sr = slat[r, q + 1]
        dl = drift[r, q]
        dr = drift[r + 2 * S, q]
        for x in range(p, e):
            t = ip_f[0, x]
            omt = ip_f[1, x]
            den = ip_f[2, x]
            fe = (omt * dl + t * dr) / den
            zg = c5 * ((omt * sl + t * sr) / den) + c2 * (c0 * fe)
            v[x + d] = _clip80(sg * (c3 * z0[x] + c4 * zg) + rec[x])
        p = e


@inline
def _pool_group(g, rp, n, nc, k, z0, rec, ip_i, ip_f, slat, drift, consts, sig, v, pooled,
                tmp):  # pragma: no cover (compiled)
    """``pooled[i]``, ``i < nc``: group ``g``'s max-pooled clipped log-score of region entry
    ``i`` (kernel ``k``) from :func:`_shared_terms`' ``z0`` and ``rec`` (``v``, ``tmp``:
    scratch)."""
    half = k // 2
    m = min(n, nc + half)  # (the candidates' windows reach half entries past the last one)
    if consts[1] == 0.0 and m > 0 and rp[m - 1] - rp[0] == m - 1:  # (consecutive positions)
        _still_run(g, 0, m, rp[0], ip_i, ip_f, slat, drift, consts, sig, z0, rec, v)
    elif consts[1] == 0.0:
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


#: segments of a group's candidates (region entries) that one upper bound covers
SEG = 16
#: the widest pooling kernel the bounded ranking takes (a window reaches one segment either
#: side; a wider one scores every candidate)
BOUND_KERNEL = 2 * SEG + 1


@inline
def _cell_tables(top, ip_i, slat, drift, consts, rec, z0l, z0r, recmax):  # pragma: no cover (compiled)
    """What every group's cell bounds share: the shared stream's combined lattice values at
    the left (``z0l[q]``) and right (``z0r[q]``) point of each lattice cell ``q`` (the
    positions ``p`` with ``ip_i[0, p] == q``), and the largest recency term ``recmax[q]`` of
    the cell's positions below ``top`` (``-inf`` for a cell without one). Returns the cells."""
    ncell = ip_i[0, top - 1] + 1 if top > 0 else 0
    S = slat.shape[0]
    c = consts[0]
    s = consts[1]
    sd = consts[2]
    sc = consts[5]
    for q in range(ncell):
        z0l[q] = sc * slat[0, q] + sd * (c * drift[0, q] + s * drift[S, q])
        z0r[q] = sc * slat[0, q + 1] + sd * (c * drift[2 * S, q] + s * drift[3 * S, q])
        recmax[q] = -np.inf
    for p in range(top):
        q = ip_i[0, p]
        if rec[p] > recmax[q]:
            recmax[q] = rec[p]
    return ncell


@inline
def _cell_bounds(g, ncell, slat, drift, consts, sig, z0l, z0r, recmax, yl, yr,
                 ub):  # pragma: no cover (compiled)
    """Group ``g``'s latent at the lattice points of each cell ``q``: ``yl[q]`` (left),
    ``yr[q]`` (right), and ``ub[q]``, an upper bound on its log-score (before the clip) at
    every position of the cell. Within a cell every term is the interpolation ``((1 - t) y_l
    + t y_r) / sqrt((1 - t)^2 + t^2)`` of its lattice values with the same ``t``, so the
    group's latent is that of the combined values; over ``t`` in [0, 1] its largest value is
    ``sqrt(y_l^2 + y_r^2)`` when both are positive (Cauchy-Schwarz: the weights are a unit
    vector of the quadrant), else ``max(y_l, y_r)``. Times ``sig[g] >= 0``, plus the cell's
    largest recency term, plus a margin (:func:`_bound_of`)."""
    S = slat.shape[0]
    c = consts[0]
    s = consts[1]
    sd = consts[2]
    a = consts[3]
    b = consts[4]
    sc = consts[5]
    r = g + 1
    sg = sig[g]
    for q in range(ncell):
        u = a * z0l[q] + b * (sc * slat[r, q] + sd * (c * drift[r, q] + s * drift[r + S, q]))
        w = a * z0r[q] + b * (sc * slat[r, q + 1] + sd * (c * drift[r + 2 * S, q]
                                                         + s * drift[r + 3 * S, q]))
        yl[q] = u
        yr[q] = w
        if u > 0.0 and w > 0.0:
            m = np.sqrt(u * u + w * w)
        else:
            m = u if u > w else w
        ub[q] = _bound_of(sg * m, recmax[q])


@inline
def _bound_of(x, rm):  # pragma: no cover (compiled)
    """``x + rm`` plus a margin of ``1e-9 (1 + |x| + |rm|)``: the rounding of the score's own
    arithmetic is ~1e-15 of those magnitudes."""
    return x + rm + 1e-9 * (1.0 + abs(x) + abs(rm))


@inline
def _raw_scores(g, lo, hi, rp, z0, rec, ip_i, ip_f, slat, drift, consts, sig,
                v):  # pragma: no cover (compiled)
    """``v[i]``: group ``g``'s clipped log-score of region entry ``i`` (position ``rp[i]``), for
    ``lo <= i < hi``, as :func:`_pool_group` computes it."""
    # (one loop per stream helper: a branch around the helpers' array reads inside the loop
    # keeps numba's reference counting in it)
    if consts[1] == 0.0 and hi > lo and rp[hi - 1] - rp[lo] == hi - 1 - lo:  # (consecutive)
        _still_run(g, lo, hi, rp[lo], ip_i, ip_f, slat, drift, consts, sig, z0, rec, v)
    elif consts[1] == 0.0:
        for i in range(lo, hi):
            p = rp[i]
            v[i] = log_score_from_streams(
                g, z0[p], _still_stream(g + 1, p, ip_i, ip_f, slat, drift, consts), rec[p],
                consts, sig)
    else:
        for i in range(lo, hi):
            p = rp[i]
            v[i] = log_score_from_streams(
                g, z0[p], lattice_stream_at(g + 1, p, ip_i, ip_f, slat, drift, consts), rec[p],
                consts, sig)


@inline
def _score_marked(g, rp, nc, m, half, mark, z0, rec, ip_i, ip_f, slat, drift, consts, sig, v,
                  pooled, cv, nsc):  # pragma: no cover (compiled)
    """The pooled log-scores (``pooled[i]``, and appended to ``cv`` from ``nsc`` on) of the
    candidates of each segment ``s`` with ``mark[s] == 1``, in slot order: the largest of the
    raw scores (``v``) of region entries ``i - half .. i + half`` within ``0..m-1``, as
    :func:`_pool_group` pools them. Returns the new end of ``cv``."""
    nseg = (nc + SEG - 1) // SEG
    done = 0  # raw scores v[lo..done - 1] of this pass are computed
    for si in range(nseg):
        if mark[si] != 1:
            continue
        a = si * SEG
        e = min(a + SEG, nc)
        lo = max(a - half, done)
        hi = min(e + half, m)
        _raw_scores(g, lo, hi, rp, z0, rec, ip_i, ip_f, slat, drift, consts, sig, v)
        done = hi
        for i in range(a, e):
            w0 = max(i - half, 0)
            w1 = min(i + half, m - 1)
            x = v[w0]
            for j in range(w0 + 1, w1 + 1):
                y = v[j]
                x = y if y > x else x
            pooled[i] = x
            cv[nsc] = x
            nsc += 1
    return nsc


@inline
def _bounded_threshold(g, rp, nc, m, k, kg, eps, z0, rec, ip_i, ip_f, slat, drift, consts, sig,
                       yl, yr, recmax, ub, sb, sbc, sel, v, pooled, cv, tmp):  # pragma: no cover
    """The ``kg``-th largest pooled log-score of group ``g``'s ``nc`` candidates (``kg <
    nc``; pooling kernel ``k <= 2 SEG + 1`` over region entries ``0..m-1``), scoring only the
    segments of :data:`SEG` candidates whose bound can reach it. ``sb[s]`` bounds every
    pooled score of segment ``s``: the largest bound over the positions of its own
    candidates and over those of the ``k // 2`` region entries either side its windows reach,
    clipped as the score is. A range of positions spanning several lattice cells takes their
    bounds (:func:`_cell_bounds`); within one cell ``q`` the bound is the largest
    interpolated latent over ``t`` in ``[t(pa), t(pb)]``: ``sqrt(y_l^2 + y_r^2)`` where its
    peak ``t* = y_r / (y_l + y_r)`` (both positive) lies in the range, else the larger end
    (the latent is ``|y| cos`` of the angle between the weights' unit vector and ``y``: one
    peak over the quadrant), times ``sig[g]``, plus the cell's largest recency term and
    :func:`_bound_of`'s margin. The segments are scored in rounds, each taking the segments
    not yet scored whose bounds are the largest, about ``max(2 kg, scored)`` candidates of
    them, after which ``t``, the ``kg``-th largest pooled score scored so far, is at most the
    threshold ``thr``; a segment whose bound is below ``t - 2 eps`` holds no candidate the
    ranking keeps or leaves in its band (they are at least ``thr - 2 eps``), and the rounds
    end when none is left above it. ``sel[s]`` is then 1 for the segments scored
    (``pooled`` holds their candidates' pooled scores), 0 for the others. Returns ``thr``:
    the value :func:`kth_largest` gives over every candidate's pooled score."""
    half = k // 2
    sg = sig[g]
    nseg = (nc + SEG - 1) // SEG
    for si in range(nseg):
        a = si * SEG
        e = min(a + SEG, nc)
        # three position ranges: the segment's own candidates, then the entries its windows
        # reach on the left and on the right (empty ranges: pa > pb)
        x = -np.inf
        for part in range(3):
            if part == 0:
                ia = a
                ib = e - 1
            elif part == 1:
                ia = max(a - half, 0)
                ib = a - 1
            else:
                ia = e
                ib = min(e - 1 + half, m - 1)
            if ia > ib:
                continue
            pa = rp[ia]
            pb = rp[ib]
            q0 = ip_i[0, pa]
            q1 = ip_i[0, pb]
            u = yl[q0]
            w = yr[q0]
            ta = ip_f[0, pa]
            tb = ip_f[0, pb]
            fa = (ip_f[1, pa] * u + ta * w) / ip_f[2, pa]
            fb = (ip_f[1, pb] * u + tb * w) / ip_f[2, pb]
            rm = recmax[q0]
            y = ub[q0]
            for q in range(q0 + 1, q1 + 1):
                z = ub[q]
                y = z if z > y else y
            # within one cell: the interpolated latent's largest value over [t(pa), t(pb)]
            f = fa if fa > fb else fb
            ts = w / (u + w) if u > 0.0 and w > 0.0 else -1.0
            if ts >= ta - 1e-9 and ts <= tb + 1e-9:
                f = np.sqrt(u * u + w * w)
            one = _bound_of(sg * f, rm)
            y = one if q0 == q1 else y
            x = y if y > x else x
        sb[si] = _clip80(x)
        sel[si] = 0
    nsc = 0
    t = -np.inf
    while True:
        # the segments not scored whose bound reaches t - 2 eps: score those with the largest
        # bounds, about max(2 kg, nsc) candidates of them (all when fewer), then raise t
        floor = t - 2.0 * eps
        nC = 0
        for si in range(nseg):
            if sel[si] == 0 and sb[si] >= floor:
                sbc[nC] = sb[si]
                nC += 1
        if nC == 0:
            break
        jj = max(2 * kg, nsc) // SEG + 1
        tb = floor if jj >= nC else kth_largest(sbc, nC, jj, tmp)
        for si in range(nseg):
            x = sel[si]
            sel[si] = 2 if x == 1 else (1 if x == 0 and sb[si] >= tb else 0)
        nsc = _score_marked(g, rp, nc, m, half, sel, z0, rec, ip_i, ip_f, slat, drift, consts,
                            sig, v, pooled, cv, nsc)
        for si in range(nseg):
            sel[si] = 1 if sel[si] != 0 else 0
        if nsc >= kg:  # (fewer: a short last segment among them; t stays -inf, all go on)
            t = kth_largest(cv, nsc, kg, tmp)
    return kth_largest(cv, nsc, kg, tmp)


@kernel("i8(i4[:, :], i8, i8, i8, i8[:], i8[:, :], f8[:, :], f8[:, :], f8[:, :], f8[:], f8[:], "
        "f8[:], f8[:], i8, f8, b1[:, :], i8[:, :], f8[:], b1, b1)", depends=(score_terms,))
def snap_keep(slot_pos, P, k, cut, kg_all, ip_i, ip_f, slat, drift, consts, sig, lm, sink, seq_len,
              eps, keep, pend, pend_v, bound, shared):  # pragma: no cover (compiled)
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
    the rest. ``bound``: with a kernel of at most :data:`BOUND_KERNEL` (and ``sig[g] >= 0``)
    a group scores only the segments of candidates whose upper bound can reach its threshold
    (:func:`_bounded_threshold`); the others can be neither kept nor in the band, so the
    mask and the band are those scoring every candidate gives (``bound`` False). ``shared``:
    ``slot_pos`` is one row (``int32[1, S]``) that every group of ``keep`` (``bool[H, S]``)
    holds, its region found once.

    Returns the band rows written, or -1 (``keep`` partly written) when a group's prompt
    positions do not increase along its slots, a prompt position lies beyond the terms'
    tables, or ``pend`` cannot hold the band."""
    H, S = keep.shape
    rj = np.empty(S, dtype=np.int64)
    rp = np.empty(S, dtype=np.int64)
    cutj = np.empty(S if shared else 0, dtype=np.int64)
    ncut = 0
    n = 0
    nc = 0
    v = np.empty(S, dtype=np.float64)
    pooled = np.empty(S, dtype=np.float64)
    tmp = np.empty(S + k, dtype=np.float64)  # (_window_max's scratch: nc + k - 1 entries)
    top = min(P, ip_i.shape[1])
    z0 = np.empty(top, dtype=np.float64)
    rec = np.empty(top, dtype=np.float64)
    _shared_terms(top, ip_i, ip_f, slat, drift, consts, lm, sink, seq_len, z0, rec)
    bounded = bound and k <= BOUND_KERNEL and slat.shape[1] > 0
    ncell = 0
    nseg_max = (S + SEG - 1) // SEG + 1
    ub = np.empty(ip_i[0, top - 1] + 1 if top > 0 else 0, dtype=np.float64)
    z0l = np.empty(ub.shape[0], dtype=np.float64)
    z0r = np.empty(ub.shape[0], dtype=np.float64)
    recmax = np.empty(ub.shape[0], dtype=np.float64)
    yl = np.empty(ub.shape[0], dtype=np.float64)
    yr = np.empty(ub.shape[0], dtype=np.float64)
    sb = np.empty(nseg_max, dtype=np.float64)
    sbc = np.empty(nseg_max, dtype=np.float64)
    sel = np.empty(nseg_max, dtype=np.int8)
    cv = np.empty(S, dtype=np.float64)
    if bounded:
        ncell = _cell_tables(top, ip_i, slat, drift, consts, rec, z0l, z0r, recmax)
    n_pend = 0
    for g in range(H):
        n, nc, ncut = _group_region(slot_pos, g, g == 0, shared, P, cut, top, keep, rj, rp, cutj,
                                    n, nc, ncut)
        if n < 0:
            return -1
        kg = kg_all[g]
        if kg <= 0 or nc == 0:
            continue
        if nc <= kg:
            for i in range(nc):
                keep[g, rj[i]] = True
            continue
        half = k // 2
        m = min(n, nc + half)
        if bounded and sig[g] >= 0.0:
            _cell_bounds(g, ncell, slat, drift, consts, sig, z0l, z0r, recmax, yl, yr, ub)
            thr = _bounded_threshold(g, rp, nc, m, k, kg, eps, z0, rec, ip_i, ip_f, slat, drift,
                                     consts, sig, yl, yr, recmax, ub, sb, sbc, sel, v, pooled,
                                     cv, tmp)
            nseg = (nc + SEG - 1) // SEG
        else:
            _pool_group(g, rp, n, nc, k, z0, rec, ip_i, ip_f, slat, drift, consts, sig, v, pooled,
                        tmp)
            thr = kth_largest(pooled, nc, kg, tmp)
            nseg = (nc + SEG - 1) // SEG
            for si in range(nseg):
                sel[si] = 1
        above = thr + 2.0 * eps
        below = thr - 2.0 * eps
        certain = 0
        band = 0
        for si in range(nseg):
            if sel[si]:
                for i in range(si * SEG, min(si * SEG + SEG, nc)):
                    if pooled[i] > above:
                        certain += 1
                    elif pooled[i] >= below:
                        band += 1
        need = kg - certain
        if need != band and n_pend + band > pend.shape[0]:
            return -1
        for si in range(nseg):
            if sel[si] == 0:
                continue
            for i in range(si * SEG, min(si * SEG + SEG, nc)):
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


@kernel("void(i8, i8[:, :], f8[:, :], f8[:, :], f8[:, :], f8[:], f8[:], f8[:], i8, f8[:], f8[:])",
        depends=(score_terms,))
def shared_terms(P, ip_i, ip_f, slat, drift, consts, lm, sink, seq_len, z0,
                 rec):  # pragma: no cover (compiled)
    """:func:`_shared_terms` of the positions below ``min(P, ip_i.shape[1])`` (the length of
    ``z0`` and ``rec``): the shared stream and the recency term every group's score adds."""
    _shared_terms(z0.shape[0], ip_i, ip_f, slat, drift, consts, lm, sink, seq_len, z0, rec)


@kernel("i8(i4[:, :], i8, i8, i8, i8, i8, i8[:, :], f8[:, :], f8[:, :], f8[:, :], f8[:], f8[:], "
        "f8[:], f8[:], b1[:, :], f8[:], i8[:], i8[:], b1)", depends=(score_terms,))
def ada_pooled(slot_pos, P, k, cut, g0, g1, ip_i, ip_f, slat, drift, consts, sig, z0, rec, keep, cv,
               cj, off, shared):  # pragma: no cover (compiled)
    """Ada-KV's pooled log-scores (:func:`snap_keep`'s pooling) of every candidate of groups
    ``g0..g1-1`` (one layer), group by group: group ``g0 + i``'s candidates (live slots
    holding positions below ``cut``, in slot order) are entries ``off[i]..off[i + 1] - 1`` of
    ``cv`` (pooled clipped log-score) and ``cj`` (slot), ``cv``, ``cj`` of ``(g1 - g0) x S``
    entries; live slots holding positions ``>= cut`` are kept (``keep``, ``bool[H, S]``);
    ``z0``, ``rec``: :func:`shared_terms`; ``shared`` as :func:`snap_keep` takes it. Returns
    the candidates, or -1 where :func:`snap_keep` returns it for the region."""
    S = keep.shape[1]
    rj = np.empty(S, dtype=np.int64)
    rp = np.empty(S, dtype=np.int64)
    cutj = np.empty(S if shared else 0, dtype=np.int64)
    ncut = 0
    n = 0
    nc = 0
    v = np.empty(S, dtype=np.float64)
    pooled = np.empty(S, dtype=np.float64)
    tmp = np.empty(S + k, dtype=np.float64)
    top = z0.shape[0]
    o = 0
    for g in range(g0, g1):
        off[g - g0] = o
        n, nc, ncut = _group_region(slot_pos, g, g == g0, shared, P, cut, top, keep, rj, rp, cutj,
                                    n, nc, ncut)
        if n < 0:
            return -1
        if nc:
            _pool_group(g, rp, n, nc, k, z0, rec, ip_i, ip_f, slat, drift, consts, sig, v, pooled,
                        tmp)
            for i in range(nc):
                cv[o + i] = pooled[i]
                cj[o + i] = rj[i]
            o += nc
    off[g1 - g0] = o
    return o


#: numpy's pairwise summation: rows of at most this many entries are summed with eight
#: accumulators (``PW_BLOCKSIZE`` of numpy's ``loops_utils.h``)
PW_BLOCK = 128


@inline
def _pairwise_leaf(a, lo, n):  # pragma: no cover (compiled)
    """numpy's pairwise sum of ``a[lo:lo + n]`` for ``n <= PW_BLOCK``: in order below 8
    entries, else eight running sums over strides of 8 combined as ``((r0 + r1) + (r2 + r3))
    + ((r4 + r5) + (r6 + r7))``, then the entries past the last multiple of 8 in order."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0 = a[lo]
    r1 = a[lo + 1]
    r2 = a[lo + 2]
    r3 = a[lo + 3]
    r4 = a[lo + 4]
    r5 = a[lo + 5]
    r6 = a[lo + 6]
    r7 = a[lo + 7]
    m = lo + n - n % 8
    i = lo + 8
    while i < m:
        r0 += a[i]
        r1 += a[i + 1]
        r2 += a[i + 2]
        r3 += a[i + 3]
        r4 += a[i + 4]
        r5 += a[i + 5]
        r6 += a[i + 6]
        r7 += a[i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < lo + n:
        res += a[i]
        i += 1
    return res


@inline
def pairwise_sum(a, n, stk, rs):  # pragma: no cover (compiled)
    """``np.add.reduce`` of ``a[:n]`` (float64) as numpy computes it along a contiguous row:
    ``0.0 +`` the pairwise sum, which splits a range of more than :data:`PW_BLOCK` entries at
    half its length rounded down to a multiple of 8 and adds the halves' sums (left + right),
    and sums a shorter range with :func:`_pairwise_leaf`. ``stk`` (``int64[3, >= 64]``) and
    ``rs`` (``float64[>= 64]``): the explicit recursion's stacks (depth ~log2(n / 128))."""
    sp = 1
    rp = 0
    stk[0, 0] = 0
    stk[1, 0] = n
    stk[2, 0] = 0
    while sp > 0:
        sp -= 1
        lo = stk[0, sp]
        m = stk[1, sp]
        if stk[2, sp] == 1:  # both halves summed: left + right
            rp -= 1
            r = rs[rp]
            rs[rp - 1] = rs[rp - 1] + r
        elif m <= PW_BLOCK:
            rs[rp] = _pairwise_leaf(a, lo, m)
            rp += 1
        else:
            n2 = m // 2
            n2 -= n2 % 8
            stk[0, sp] = lo
            stk[1, sp] = m
            stk[2, sp] = 1
            stk[0, sp + 1] = lo + n2
            stk[1, sp + 1] = m - n2
            stk[2, sp + 1] = 0
            stk[0, sp + 2] = lo
            stk[1, sp + 2] = n2
            stk[2, sp + 2] = 0
            sp += 3
    return 0.0 + rs[0]



@kernel("void(f4[:], i8[:], i8[:], i8, i8, i8, b1[:, :])")
def ada_keep(e, cj, off, g0, per_head, floor, keep):  # pragma: no cover (compiled)
    """Ada-KV's keep (:meth:`policies.snapkv.AdaKVPolicy._keep_pooled`) in one layer, groups
    ``g0..g0+G-1`` (``G = len(off) - 1``), from their candidates' float32 pooled scores ``e``
    (:func:`ada_pooled`'s order): each group's normaliser ``den = max(sum, 1e-300)`` of its
    row (the scores at their slots, zeros elsewhere, ``S = keep.shape[1]`` entries) summed as
    numpy sums a row (:func:`pairwise_sum`), then per group the top ``floor`` by normalised
    score ``e / den``, then the top ``per_head x G - kept`` of the others by the same score,
    ties to the lower group, then the lower slot; into ``keep`` (``bool[H, S]``)."""
    S = keep.shape[1]
    G = off.shape[0] - 1
    row = np.zeros(S, dtype=np.float64)
    stk = np.empty((3, 128), dtype=np.int64)
    rs = np.empty(128, dtype=np.float64)
    den = np.empty(G, dtype=np.float64)
    for g in range(G):
        for i in range(off[g], off[g + 1]):
            row[cj[i]] = np.float64(e[i])
        den[g] = max(pairwise_sum(row, S, stk, rs), 1e-300)
        for i in range(off[g], off[g + 1]):
            row[cj[i]] = 0.0
    n_l = off[G]
    vals = np.empty(n_l, dtype=np.float64)
    buf = np.empty(n_l, dtype=np.float64)
    ninf = -np.inf
    kept_l = 0
    # each group's floor, by its normalised scores; kept entries leave the layer's ranking
    # (-inf: below every score, which are >= 0)
    for g in range(G):
        a = off[g]
        n = off[g + 1] - a
        for i in range(n):
            vals[a + i] = np.float64(e[a + i]) / den[g]
        if floor <= 0 or n == 0:
            continue
        if floor >= n:
            for i in range(n):
                keep[g0 + g, cj[a + i]] = True
                vals[a + i] = ninf
            kept_l += n
            continue
        thr = kth_largest(vals[a:a + n], n, floor, buf)
        above = 0
        for i in range(n):
            if vals[a + i] > thr:
                above += 1
        ties = floor - above
        for i in range(n):
            y = vals[a + i]
            if y > thr or (y == thr and ties > 0):
                if y == thr:
                    ties -= 1
                keep[g0 + g, cj[a + i]] = True
                vals[a + i] = ninf
        kept_l += floor
    extra = per_head * G - kept_l
    rest = n_l - kept_l
    if extra <= 0 or rest == 0:
        return
    thr = 0.0
    ties = 0
    if extra < rest:
        # (the extra-th largest of the layer is one of the others': extra < rest of them lie
        # above the -inf entries)
        thr = kth_largest(vals, n_l, extra, buf)
        above = 0
        for i in range(n_l):
            if vals[i] > thr:
                above += 1
        ties = extra - above
    g = 0
    for i in range(n_l):
        while i >= off[g + 1]:
            g += 1
        y = vals[i]
        if y == ninf:
            continue
        if extra >= rest or y > thr or (y == thr and ties > 0):
            if extra < rest and y == thr:
                ties -= 1
            keep[g0 + g, cj[i]] = True
