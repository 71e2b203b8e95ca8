"""The state a per-step score-ranking policy (H2O, TOVA) keeps for one request between rounds
(:class:`GuardedRanking`), so that a round evaluates only the candidates near the eviction line;
the comment below says why that is exact."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from sim.jit import inline, kernel

from .score_terms import log_scores_at
from .selection import KEY_EPS, RULE_H2O


# A per-step policy (H2O, TOVA) evicts about one token per group a step out of about budget
# candidates. Within one drift epoch a candidate's clipped log-score is ``clip(A + B cos th + C
# sin th + recency)`` with constants A, B, C per candidate (its static fields and its two epochs'
# drifting fields, weighted by the group's sigma), so over a window of steps it stays above a
# bound computed once. A round evaluates only the candidates whose bound lies below a guard level
# (the "danger" ones, kept first in the arrays) and is exact when the d-th smallest key among
# them lies below the guard: every other candidate stays above it all window long.
#
# Candidates below ``pin`` (a request's shared leading blocks) stay whatever their rank, but they
# still take part in the ranking, so they count among the d smallest every round. Those whose
# upper bound over the window lies below the lower bound of every other candidate are "parked"
# at the window's start: kept aside, not evaluated, counted as evicted-and-kept. A round with L
# parked candidates in a group finds the (d - L)-th smallest key t among the rest; when t lies
# above every parked bound (the window's largest, ``_F_L + H + g`` in ``fv``), the parked ones
# are among the d smallest (each below t, with the margin the keys' error needs), the d-th
# smallest over all candidates is t, and the round's evictions are the ones the rest give.
# Otherwise the group's parked candidates rejoin the rest and the round runs on all of them.

#: ``GuardedRanking.fv`` (float64): the window (first and last step, sequence length and
#: n_tokens at its start, cos and sin of theta at its first and last step, (theta span)^2 / 8),
#: cos and sin of the round's theta, log(sink_boost); the groups' guard levels follow, then
#: each group's largest upper bound of its parked candidates (-inf when none)
(_WIN_STEP0, _WIN_STEP1, _WIN_SEQ0, _WIN_N0, _WIN_C0, _WIN_S0, _WIN_C1, _WIN_S1, _WIN_H2,
 _F_C, _F_S, _F_LOGSB, _F_L) = range(13)
#: ``_guard_round``'s ``prm`` (int64): H2O's age weight on, the round's step, sequence length
#: and n_tokens, sink tokens, positions below this stay (shared blocks), danger candidates kept
#: at least, new candidates' positions (from, to), constants of a new epoch to compute, drift
#: period, window length (steps), the ``pin`` the parked candidates were parked under
(_P_AGED, _P_STEP, _P_SEQ, _P_NTOK, _P_NSINK, _P_PIN, _P_MIN_DANGER, _P_FROM, _P_TO,
 _P_NEW_EPOCH, _P_PERIOD, _P_WINDOW, _P_PARK_PIN) = range(13)
#: ``GuardedRanking.fa`` rows (float64[4, H, cap]; ``pfa``: A, B, C and the upper bound) and
#: ``ia`` rows (int64[4, H]: candidates, danger candidates, candidates kept, parked ones)
_A, _B, _C, _LO = range(4)
_UB = 3
_N, _ND, _K, _NP = range(4)


@inline
def _clip_log(x):  # pragma: no cover (compiled)
    """``x`` clipped to the log-score's range [-80, 80]."""
    return -80.0 if x < -80.0 else (80.0 if x > 80.0 else x)


@inline
def _table_at(tab, i):  # pragma: no cover (compiled)
    """``tab[i]`` with ``i`` clamped into the table (read whatever ``i``: a branch around an
    array read would keep numba's reference counting in the caller's loop)."""
    return tab[min(max(i, 0), tab.shape[0] - 1)]


@inline
def _approx_log_key(A, Bc, Cs, p, c, s, lm, seq_len, n_sink, log_sb, logm, n_tokens,
                    aged):  # pragma: no cover (compiled)
    """A candidate's key in the log domain from its epoch constants: ``clip(A + B c + C s +
    recency)``, plus ``log m`` when ``aged`` (H2O); within :data:`KEY_EPS` of the log of its
    exact key (the sink term taken as ``lm[age] + log(sink_boost)``, equal up to rounding)."""
    rec = _table_at(lm, seq_len - 1 - p) + (log_sb if p < n_sink else 0.0)
    lg = _table_at(logm, n_tokens - p)
    return _clip_log(A + Bc * c + Cs * s + rec) + (lg if aged else 0.0)


@inline
def _key_lower_bound(A, Bc, Cs, p, c0, s0, c1, s1, h2, age_end, n0, lm, n_sink, log_sb, logm,
                     aged):  # pragma: no cover (compiled)
    """A lower bound of :func:`_approx_log_key` over a window of steps, less ``2 KEY_EPS``
    (``c0, s0, c1, s1``: cos and sin of theta at its ends, ``h2`` = (theta span)^2 / 8,
    ``age_end``: the age of position 0 at its end, ``n0``: n_tokens at its start): ``B cos th +
    C sin th`` is at least its smaller end value less ``R h^2 / 8`` (its second derivative is
    at most R = sqrt(B^2 + C^2) in size); the recency term falls with age (at least its value
    at the window's end; 0, the table's limit, past the table); log m grows with n_tokens."""
    fmin = min(Bc * c0 + Cs * s0, Bc * c1 + Cs * s1) - math.sqrt(Bc * Bc + Cs * Cs) * h2
    age = age_end - p
    lm_end = _table_at(lm, age)
    rec = (lm_end if age < lm.shape[0] else 0.0) + (log_sb if p < n_sink else 0.0)
    lg = _table_at(logm, n0 - p)
    return _clip_log(A + fmin + rec) + (lg if aged else 0.0) - 2.0 * KEY_EPS


@inline
def _key_upper_bound(A, Bc, Cs, p, c0, s0, c1, s1, h2, age_start, n_end, lm, n_sink, log_sb,
                     logm, aged):  # pragma: no cover (compiled)
    """An upper bound of :func:`_approx_log_key` over a window of steps, plus ``2 KEY_EPS``
    (the mirror of :func:`_key_lower_bound`: ``B cos th + C sin th`` at most its larger end
    value plus ``R h^2 / 8``; the recency term at its largest, at the window's start,
    ``age_start`` the age of position 0 then; log m at its largest, at the window's last
    n_tokens ``n_end``; the recency table falls with age as ``recency_boost >= 0`` makes it,
    and log m grows with m)."""
    fmax = max(Bc * c0 + Cs * s0, Bc * c1 + Cs * s1) + math.sqrt(Bc * Bc + Cs * Cs) * h2
    rec = _table_at(lm, age_start - p) + (log_sb if p < n_sink else 0.0)
    lg = _table_at(logm, n_end - p)
    return _clip_log(A + fmax + rec) + (lg if aged else 0.0) + 2.0 * KEY_EPS


@inline
def _bounds(g, first, cpos, fa, ia, fv, lm, n_sink, logm, aged):  # pragma: no cover (compiled)
    """:func:`_key_lower_bound` of group ``g``'s candidates ``first..`` over the window in
    ``fv``, into ``fa[_LO, g]`` (the window's constants read once)."""
    c0 = fv[_WIN_C0]
    s0 = fv[_WIN_S0]
    c1 = fv[_WIN_C1]
    s1 = fv[_WIN_S1]
    h2 = fv[_WIN_H2]
    age_end = np.int64(fv[_WIN_SEQ0] + (fv[_WIN_STEP1] - fv[_WIN_STEP0])) - 1
    n0 = np.int64(fv[_WIN_N0])
    log_sb = fv[_F_LOGSB]
    for i in range(first, ia[_N, g]):
        fa[_LO, g, i] = _key_lower_bound(fa[_A, g, i], fa[_B, g, i], fa[_C, g, i], cpos[g, i], c0,
                                         s0, c1, s1, h2, age_end, n0, lm, n_sink, log_sb, logm,
                                         aged)


@inline
def _kth_smallest(a, n, k):  # pragma: no cover (compiled)
    """The ``k``-th smallest (from 0) of ``a[:n]`` (finite floats): ``np.partition(a[:n],
    k)[k]``'s value, by quickselect on a copy (Hoare's partition, middle pivot)."""
    b = a[:n].copy()
    lo = 0
    hi = n - 1
    while lo < hi:
        x = b[(lo + hi) // 2]
        i = lo
        j = hi
        while i <= j:
            while b[i] < x:
                i += 1
            while b[j] > x:
                j -= 1
            if i <= j:
                b[i], b[j] = b[j], b[i]
                i += 1
                j -= 1
        if k <= j:
            hi = j
        elif k >= i:
            lo = i
        else:
            break
    return b[k]


@kernel("void(i8, i8, i8[:, :], f8[:, :, :], i8[:, :], f8[:])")
def _guard_level(g, m, cpos, fa, ia, fv):  # pragma: no cover (compiled)
    """Group ``g``'s guard level from its bounds: the m-th smallest (+inf when ``m`` reaches
    its candidates), the candidates with a bound at most the guard moved first (``ia[_ND,
    g]`` of them)."""
    ng = ia[_N, g]
    lo = fa[_LO, g]
    if m >= ng:
        fv[_F_L + g] = np.inf
        ia[_ND, g] = ng
        return
    thr = _kth_smallest(lo, ng, m - 1)
    fv[_F_L + g] = thr
    j = 0
    for i in range(ng):
        if lo[i] <= thr:
            if i != j:
                cpos[g, i], cpos[g, j] = cpos[g, j], cpos[g, i]
                for r in range(4):
                    fa[r, g, i], fa[r, g, j] = fa[r, g, j], fa[r, g, i]
            j += 1
    ia[_ND, g] = j


@kernel("i8(i8, i8, i8[:, :], f8[:, :, :], i8[:, :])")
def _guard_remove(g, i, cpos, fa, ia):  # pragma: no cover (compiled)
    """Removes group ``g``'s candidate ``i`` (a danger one: ``i < ia[_ND, g]``): the last
    danger candidate takes its place and the last candidate that one's. Returns its
    position."""
    p = cpos[g, i]
    last_d = ia[_ND, g] - 1
    last = ia[_N, g] - 1
    for r in range(4):
        fa[r, g, i] = fa[r, g, last_d]
        fa[r, g, last_d] = fa[r, g, last]
    cpos[g, i] = cpos[g, last_d]
    cpos[g, last_d] = cpos[g, last]
    ia[_ND, g] = last_d
    ia[_N, g] = last
    return p


@inline
def _join_danger(g, first, cpos, fa, ia, fv):  # pragma: no cover (compiled)
    """Group ``g``'s candidates ``first..`` (their bounds computed) with a bound at most its
    guard level join the danger ones (moved to the front)."""
    for i in range(first, ia[_N, g]):
        if fa[_LO, g, i] <= fv[_F_L + g]:
            j = ia[_ND, g]
            if i != j:
                cpos[g, i], cpos[g, j] = cpos[g, j], cpos[g, i]
                for r in range(4):
                    fa[r, g, i], fa[r, g, j] = fa[r, g, j], fa[r, g, i]
            ia[_ND, g] = j + 1


@inline
def _unpark(g, cpos, fa, ia, ppos, pfa):  # pragma: no cover (compiled)
    """Group ``g``'s parked candidates rejoin its candidates (after them, with their
    constants; their bounds are to be computed). Returns the index of the first."""
    first = ia[_N, g]
    m = first
    for j in range(ia[_NP, g]):
        cpos[g, m] = ppos[g, j]
        for r in range(3):
            fa[r, g, m] = pfa[r, g, j]
        m += 1
    ia[_N, g] = m
    ia[_NP, g] = 0
    return first


@inline
def _park(g, pin, cpos, fa, ia, fv, ppos, pfa, lm, n_sink, logm, aged):  # pragma: no cover
    """Parks group ``g``'s candidates below ``pin`` whose upper bound over the window in
    ``fv`` lies below the lower bound of every candidate from ``pin`` on (bounds computed,
    none parked); the group's largest parked bound into ``fv``. Returns how many."""
    H = cpos.shape[0]
    ng = ia[_N, g]
    fv[_F_L + H + g] = -np.inf
    q = np.inf
    below = 0
    for i in range(ng):
        if cpos[g, i] >= pin:
            q = min(q, fa[_LO, g, i])
        else:
            below += 1
    if below == 0 or q == np.inf:
        return 0
    c0 = fv[_WIN_C0]
    s0 = fv[_WIN_S0]
    c1 = fv[_WIN_C1]
    s1 = fv[_WIN_S1]
    h2 = fv[_WIN_H2]
    span = np.int64(fv[_WIN_STEP1] - fv[_WIN_STEP0])
    age_start = np.int64(fv[_WIN_SEQ0]) - 1
    n_end = np.int64(fv[_WIN_N0]) + span
    log_sb = fv[_F_LOGSB]
    top = -np.inf
    npk = 0
    j = 0
    for i in range(ng):
        p = cpos[g, i]
        if p < pin:
            ub = _key_upper_bound(fa[_A, g, i], fa[_B, g, i], fa[_C, g, i], p, c0, s0, c1, s1,
                                  h2, age_start, n_end, lm, n_sink, log_sb, logm, aged)
            if ub < q:
                ppos[g, npk] = p
                for r in range(3):
                    pfa[r, g, npk] = fa[r, g, i]
                pfa[_UB, g, npk] = ub
                top = max(top, ub)
                npk += 1
                continue
        if i != j:
            cpos[g, j] = p
            for r in range(4):
                fa[r, g, j] = fa[r, g, i]
        j += 1
    ia[_N, g] = j
    ia[_ND, g] = min(ia[_ND, g], j)
    ia[_NP, g] = npk
    fv[_F_L + H + g] = top
    return npk


@inline
def _rejoin(g, cpos, fa, ia, fv, ppos, pfa, lm, n_sink, logm, aged):  # pragma: no cover
    """Group ``g``'s parked candidates rejoin the rest within the window (bounds computed,
    danger ones joined). Returns how many."""
    n = ia[_NP, g]
    i0 = _unpark(g, cpos, fa, ia, ppos, pfa)
    _bounds(g, i0, cpos, fa, ia, fv, lm, n_sink, logm, aged)
    _join_danger(g, i0, cpos, fa, ia, fv)
    return n


@inline
def _threshold(g, d, fresh, key, cpos, fa, ia, fv, prm, c, s, lm, seq_len, n_sink, log_sb, logm,
               n_tokens, aged, cnt):  # pragma: no cover (compiled)
    """Group ``g``'s d-th smallest key among its danger candidates (their keys into ``key``),
    the danger set grown from the bounds until that key lies below the guard level: ``(the
    key, danger candidates, fresh)``; ``fresh``: the guard level was set this round."""
    thr = 0.0
    while True:
        ndg = ia[_ND, g]
        if ndg >= d:
            for i in range(ndg):
                key[i] = _approx_log_key(fa[_A, g, i], fa[_B, g, i], fa[_C, g, i], cpos[g, i],
                                         c, s, lm, seq_len, n_sink, log_sb, logm, n_tokens, aged)
            cnt[3] += ndg
            if d == 1:
                thr = key[0]
                for i in range(1, ndg):
                    thr = min(thr, key[i])
            else:
                thr = _kth_smallest(key, ndg, d - 1)
            if thr + 2.0 * KEY_EPS < fv[_F_L + g]:
                return thr, ndg, fresh
        # the bounds hold all window long: a larger danger set from them
        m = max(prm[_P_MIN_DANGER], 2 * d, 2 * ndg) if not fresh else max(4 * ndg, 2 * d)
        _guard_level(g, m, cpos, fa, ia, fv)
        cnt[2] += 1
        fresh = True


@kernel("i8(i8[:, :], f8[:, :, :], i8[:, :], f8[:], i8[:], f8[:], f8[:], i8[:, :], f8[:, :], "
        "f8[:, :], f8[:, :], f8[:], f8[:], i8[:, :], i8[:, :], i8[:], i8[:, :], f8[:, :, :])")
def _guard_round(cpos, fa, ia, fv, prm, lm, logm, ip_i, ip_f, static, drift, consts, sig, ev,
                 pend, cnt, ppos, pfa):  # pragma: no cover (compiled)
    """One round of a :class:`GuardedRanking` (see the section's comment): the new
    candidates (positions ``prm[_P_FROM]..prm[_P_TO]-1``) join every group with their epoch
    constants (every candidate's when ``prm[_P_NEW_EPOCH]``: ``A = sig_g (a static_0 + b
    static_g)``, ``B = sig_g sd (a F_e,0 + b F_e,g)``, ``C = sig_g sd (a F_(e+1),0 + b
    F_(e+1),g)`` from the dense terms of ``ImportanceModel.log_score_terms``); the window is
    renewed when the round falls outside it (every group's bounds then), else the new
    candidates get bounds and join the danger ones when below the guard; then per group the
    ``d = n - k`` candidates with the smallest keys are evicted, as ``topk_mask`` keeps the
    other ``k`` (ties kept at the lower position). Evicted candidates below ``prm[_P_PIN]``
    (shared blocks) stay candidates and are not reported; at a new window those certain to
    stay among the evicted all window are parked (``ppos``, ``pfa``; the section's comment),
    and all parked ones rejoin at the next window, a new epoch, another ``pin``, or a round
    whose ranking does not leave them below its threshold. Writes the evicted (group,
    position) pairs into ``ev`` (``cnt[0]``) and, for groups whose near-ties the keys leave
    open, rows (group, index, position, places left in the band, or -1 for a certain
    eviction) into ``pend`` (``cnt[1]``), those groups untouched; ``cnt[2]`` and ``cnt[3]``
    count group refreshes and keys computed, ``cnt[4]`` and ``cnt[5]`` candidates parked and
    candidates that rejoined within a window. Returns 0, or -1 when ``ev`` or ``pend`` is too
    small (the state is then to be rebuilt)."""
    H = cpos.shape[0]
    lo_p = prm[_P_FROM]
    hi_p = prm[_P_TO]
    aged = prm[_P_AGED] != 0
    step = prm[_P_STEP]
    seq_len = prm[_P_SEQ]
    n_tokens = prm[_P_NTOK]
    n_sink = prm[_P_NSINK]
    pin = prm[_P_PIN]
    c = fv[_F_C]
    s = fv[_F_S]
    log_sb = fv[_F_LOGSB]
    # the window of bounds (the parked candidates rejoin at a new one, or under another pin)
    new_window = prm[_P_NEW_EPOCH] != 0 or not (
        fv[_WIN_STEP0] <= step <= fv[_WIN_STEP1]
        and fv[_WIN_SEQ0] <= seq_len <= fv[_WIN_SEQ0] + (fv[_WIN_STEP1] - fv[_WIN_STEP0])
        and fv[_WIN_N0] <= n_tokens <= fv[_WIN_N0] + (fv[_WIN_STEP1] - fv[_WIN_STEP0]))
    if new_window or pin != prm[_P_PARK_PIN]:
        for g in range(H):
            if ia[_NP, g]:
                _unpark(g, cpos, fa, ia, ppos, pfa)
                new_window = True
    # new candidates and epoch constants
    S = static.shape[0]
    sd = consts[2]
    a = consts[3]
    b = consts[4]
    first = np.empty(H, dtype=np.int64)
    for g in range(H):
        m = ia[_N, g]
        first[g] = 0 if prm[_P_NEW_EPOCH] != 0 else m
        for p in range(lo_p, hi_p):
            cpos[g, m] = p
            m += 1
        ia[_N, g] = m
        r = g + 1
        sg = sig[g]
        for i in range(first[g], m):
            p = cpos[g, i]
            i0 = ip_i[0, p]
            t = ip_f[0, p]
            omt = ip_f[1, p]
            den = ip_f[2, p]
            fe0 = (omt * drift[0, i0] + t * drift[2 * S, i0]) / den
            fe10 = (omt * drift[S, i0] + t * drift[3 * S, i0]) / den
            feg = (omt * drift[r, i0] + t * drift[r + 2 * S, i0]) / den
            fe1g = (omt * drift[r + S, i0] + t * drift[r + 3 * S, i0]) / den
            fa[_A, g, i] = sg * (a * static[0, p] + b * static[r, p])
            fa[_B, g, i] = sg * sd * (a * fe0 + b * feg)
            fa[_C, g, i] = sg * sd * (a * fe10 + b * fe1g)
    if new_window:
        period = prm[_P_PERIOD]
        step1 = min(step + prm[_P_WINDOW], (step // period + 1) * period - 1)
        th0 = 0.5 * math.pi * (step % period) / period
        th1 = 0.5 * math.pi * (step1 % period) / period
        fv[_WIN_STEP0] = step
        fv[_WIN_STEP1] = step1
        fv[_WIN_SEQ0] = seq_len
        fv[_WIN_N0] = n_tokens
        fv[_WIN_C0] = math.cos(th0)
        fv[_WIN_S0] = math.sin(th0)
        fv[_WIN_C1] = math.cos(th1)
        fv[_WIN_S1] = math.sin(th1)
        fv[_WIN_H2] = (th1 - th0) ** 2 / 8.0
        prm[_P_PARK_PIN] = pin
    key = np.empty(cpos.shape[1], dtype=np.float64)
    idx = np.empty(cpos.shape[1], dtype=np.int64)
    n_ev = 0
    n_pend = 0
    for g in range(H):
        if new_window:  # (a danger set as large as the last one needed)
            _bounds(g, 0, cpos, fa, ia, fv, lm, n_sink, logm, aged)
            if pin > 0:
                cnt[4] += _park(g, pin, cpos, fa, ia, fv, ppos, pfa, lm, n_sink, logm, aged)
            d = ia[_N, g] - ia[_K, g]
            _guard_level(g, max(prm[_P_MIN_DANGER], 2 * d, ia[_ND, g]), cpos, fa, ia, fv)
            cnt[2] += 1
            fresh = True
        else:
            _bounds(g, first[g], cpos, fa, ia, fv, lm, n_sink, logm, aged)
            _join_danger(g, first[g], cpos, fa, ia, fv)
            fresh = False
        thr = 0.0
        ndg = 0
        while True:
            # (the parked candidates count among the d smallest: d less them here)
            d = ia[_N, g] - ia[_K, g]
            if d <= 0:
                if not ia[_NP, g]:
                    break
                cnt[5] += _rejoin(g, cpos, fa, ia, fv, ppos, pfa, lm, n_sink, logm, aged)
                continue
            thr, ndg, fresh = _threshold(g, d, fresh, key, cpos, fa, ia, fv, prm, c, s, lm,
                                         seq_len, n_sink, log_sb, logm, n_tokens, aged, cnt)
            if not ia[_NP, g] or thr - KEY_EPS > fv[_F_L + H + g]:
                break
            # a parked candidate may rank above the threshold: all rejoin, the group again
            cnt[5] += _rejoin(g, cpos, fa, ia, fv, ppos, pfa, lm, n_sink, logm, aged)
        if d <= 0:
            continue
        above = thr + 2.0 * KEY_EPS
        below = thr - 2.0 * KEY_EPS
        certain = 0
        band = 0
        for i in range(ndg):
            if key[i] < below:
                certain += 1
            elif key[i] <= above:
                band += 1
        need = d - certain
        if need != band:  # near-ties the keys leave open: the caller ranks them exactly
            if n_pend + certain + band > pend.shape[0]:
                return -1
            for i in range(ndg):
                if key[i] <= above:
                    pend[n_pend, 0] = g
                    pend[n_pend, 1] = i
                    pend[n_pend, 2] = cpos[g, i]
                    pend[n_pend, 3] = -1 if key[i] < below else need
                    n_pend += 1
            continue
        m = 0
        for i in range(ndg):
            if key[i] <= above:
                idx[m] = i
                m += 1
        for q in range(m - 1, -1, -1):  # descending: each swap moves an index not yet seen
            i = idx[q]
            if cpos[g, i] < pin:
                continue
            if n_ev == ev.shape[0]:
                return -1
            ev[n_ev, 0] = g
            ev[n_ev, 1] = _guard_remove(g, i, cpos, fa, ia)
            n_ev += 1
    cnt[0] = n_ev
    cnt[1] = n_pend
    return 0


class GuardedRanking:
    """The state a per-step score-ranking policy (:data:`RULE_TOP`, :data:`RULE_H2O`) keeps for
    one request between rounds, for the generative model's fused path on an order-preserving
    layout whose tokens never move (``none`` compactor): per group, its candidates' positions,
    epoch constants and window bounds (see the section's comment). A round gives the positions
    ``select`` would drop, from work on the danger candidates only.

    Build it with :meth:`build` at a round; each :meth:`round` must then see every token
    appended since as the layout's tokens and the layout must drop the evictions it returns:
    nothing else may change the layout in between.

    Attributes: ``cpos`` (``int64[H, cap]``: candidate positions), ``fa`` (``float64[4, H,
    cap]``: their constants A, B, C and bounds), ``ppos`` and ``pfa`` (the same for the parked
    candidates: shared positions certain to stay among the evicted over the window; A, B, C
    and upper bounds), ``ia`` (``int64[4, H]``: candidates, danger candidates, candidates
    kept, parked candidates), ``fv`` (window, guard levels and parked bounds), ``start`` (lowest candidate
    position: the prompt's end when protected), ``floor`` (positions from it on are not
    candidates yet: H2O's recent window, or not placed), ``recent`` (H2O's window, 0 for
    TOVA), ``epoch`` of the constants."""

    #: steps one window of bounds covers (they widen with it: ~0.005 a step in the log)
    WINDOW = 32
    #: danger candidates a group keeps at least (more when it evicts more)
    MIN_DANGER = 32
    #: evictions a group may take in one round on this path (more: the caller's full round)
    MAX_EVICT = 64
    #: positions past the sequence a newly fetched static field covers (new candidates join
    #: one a step: the field is fetched again every AHEAD steps at most)
    AHEAD = 512

    def __init__(self, policy, imp, k: np.ndarray, start: int, floor: int, recent: int,
                 cand: list):
        H = len(cand)
        self.policy = policy
        self.imp = imp
        self.start = start
        self.floor = floor
        self.recent = recent
        self.period = int(imp.params.drift_period)
        cap = max(64, 2 * max(len(c) for c in cand))
        self.cpos = np.zeros((H, cap), dtype=np.int64)
        for g, c in enumerate(cand):
            self.cpos[g, :len(c)] = c
        self.fa = np.zeros((4, H, cap))
        self.ppos = np.zeros((H, cap), dtype=np.int64)
        self.pfa = np.zeros((4, H, cap))
        self.ia = np.zeros((4, H), dtype=np.int64)
        self.ia[_N] = [len(c) for c in cand]
        self.ia[_K] = k
        self.fv = np.zeros(_F_L + 2 * H)
        self.fv[_F_LOGSB] = math.log(float(imp.params.sink_boost))
        self.prm = np.zeros(13, dtype=np.int64)
        self.prm[_P_AGED] = policy.score_rule == RULE_H2O
        self.prm[_P_NSINK] = int(imp.params.sink_tokens)
        self.prm[_P_MIN_DANGER] = self.MIN_DANGER
        self.prm[_P_PERIOD] = self.period
        self.prm[_P_WINDOW] = self.WINDOW
        self.epoch = -1
        self.seq = -1  # the sequence length of the last round
        self.streams = None  # (ip_i, ip_f, static, drift, consts, sig) of self.epoch
        self.ev = np.empty((H * self.MAX_EVICT, 2), dtype=np.int64)
        self.pend = np.empty((H * self.MAX_EVICT + 1024, 4), dtype=np.int64)
        # evicted, band rows; refreshes, keys computed, candidates parked, rejoined (totals)
        self.cnt = np.zeros(6, dtype=np.int64)
        self.room = cap - int(self.ia[_N].max())  # candidates a group may still add, at least
        self.tables = (imp._lm_table(1), policy._log_ages(1))  # (recency, log m: grown as needed)

    @classmethod
    def build(cls, policy, imp, layout, pin_below: int = 0) -> Optional["GuardedRanking"]:
        """The state of ``layout`` for ``policy`` (``score_rule`` TOP or H2O, its
        ``num_groups`` bound) under the fused model ``imp``, or None where it does not apply:
        H2O's recent window not every position from ``seq_len - recent`` on in every group,
        a negative number of candidates kept, more evictions due than :attr:`MAX_EVICT`
        (candidates below ``pin_below`` not counted: shared blocks, they stay)."""
        pos = layout.slot_pos
        H = pos.shape[0]
        seq = layout.next_position
        P = layout.prompt_len
        budget = int(policy.cfg.budget)
        protect = policy.protects_prompt
        start = P if protect else 0
        live = pos >= 0
        prot = (live & (pos < P)).sum(axis=1) if protect else np.zeros(H, dtype=np.int64)
        if policy.score_rule == RULE_H2O:
            avail = budget - prot
            r = np.minimum(policy._recent_param(), np.maximum(avail, 0))
            if (r != r[0]).any():
                return None
            recent = int(r[0])
            k = (avail - r).astype(np.int64)
            floor = max(start, seq - recent)
            # H2O keeps its recent window every round: all of it must be live in every group
            held = ((pos >= floor) & (pos < seq)).sum(axis=1)
            if (held != seq - floor).any():
                return None
        else:
            recent = 0
            k = (budget - prot).astype(np.int64)
            floor = seq
        cand = [np.sort(row[(row >= start) & (row < floor)]).astype(np.int64) for row in pos]
        if (k < 0).any() or max(len(c) - kk - int(np.searchsorted(c, pin_below))
                                for c, kk in zip(cand, k)) > cls.MAX_EVICT:
            return None
        st = cls(policy, imp, k, start, floor, recent, cand)
        st.seq = seq
        return st

    def _grow(self, need: int) -> None:
        """Room for ``need`` candidates a group (at least twice the old capacity)."""
        cap = self.cpos.shape[1]
        if need > cap:
            new = max(need, 2 * cap)
            cpos = np.zeros((self.cpos.shape[0], new), dtype=np.int64)
            cpos[:, :cap] = self.cpos
            fa = np.zeros((4, self.cpos.shape[0], new))
            fa[:, :, :cap] = self.fa
            ppos = np.zeros_like(cpos)
            ppos[:, :cap] = self.ppos
            pfa = np.zeros_like(fa)
            pfa[:, :, :cap] = self.pfa
            self.cpos, self.fa, self.ppos, self.pfa = cpos, fa, ppos, pfa
        self.room = self.cpos.shape[1] - int((self.ia[_N] + self.ia[_NP]).max())

    def round(self, request_key: int, step: int, seq: int, n_tokens: int,
              pin_below: int) -> Optional[tuple]:
        """One round at ``step`` (decode steps done) with ``seq`` tokens placed and
        ``n_tokens`` computed: ``(groups, positions)`` (``int64`` each) of the candidates
        ``select`` drops, less those below ``pin_below`` (shared blocks: they stay), removed
        from the state; None when this round needs the full path (more evictions than the
        state holds, :attr:`MAX_EVICT` a group, or tokens gone back): the state is then
        stale."""
        if seq < self.seq:
            return None
        H = self.cpos.shape[0]
        prm = self.prm
        floor = max(self.start, seq - self.recent) if prm[_P_AGED] else seq
        if floor < self.floor:
            return None
        imp = self.imp
        e = step // self.period
        new_epoch = e != self.epoch
        sa = self.streams
        if new_epoch or (floor > self.floor and (floor > sa[2].shape[1] or floor > sa[0].shape[1]
                                                 or sa[0][0, floor - 1] >= sa[3].shape[1])):
            # (the epoch's memos, fetched again when new candidates pass their ends; the
            # static field held is kept while it covers them, and a new one reaches AHEAD
            # positions further)
            held = sa[2] if sa is not None and sa[2].shape[1] >= max(seq, 1) else None
            tab, static, drift, consts = imp.stream_terms(
                request_key, H, step, max(seq, 1) + (0 if held is not None else self.AHEAD),
                static=held)
            sa = self.streams = (tab[0], tab[1], static, drift, consts,
                                 imp._sigma(request_key, H))
        if floor - self.floor > self.room:
            self._grow(int((self.ia[_N] + self.ia[_NP]).max()) + floor - self.floor)
        th = 0.5 * math.pi * (step % self.period) / self.period
        fv = self.fv
        fv[_F_C] = math.cos(th)
        fv[_F_S] = math.sin(th)
        prm[_P_STEP] = step
        prm[_P_SEQ] = seq
        prm[_P_NTOK] = n_tokens
        prm[_P_PIN] = pin_below
        prm[_P_FROM] = self.floor
        prm[_P_TO] = floor
        prm[_P_NEW_EPOCH] = new_epoch
        lm, logm = self.tables
        if lm.shape[0] <= seq + self.WINDOW or logm.shape[0] <= n_tokens + self.WINDOW:
            lm, logm = self.tables = (imp._lm_table(seq + 2 * self.WINDOW),
                                      self.policy._log_ages(max(n_tokens, 1) + 2 * self.WINDOW))
        cnt = self.cnt
        rc = _guard_round(self.cpos, self.fa, self.ia, fv, prm, lm, logm, *sa, self.ev,
                          self.pend, cnt, self.ppos, self.pfa)
        if rc < 0:
            return None
        self.room -= floor - self.floor
        self.epoch = e
        self.floor = floor
        self.seq = seq
        ev = self.ev[:cnt[0]]
        if cnt[1]:
            ev = np.concatenate([ev, self._rank_pending(request_key, step, seq, n_tokens,
                                                        self.pend[:cnt[1]], pin_below)])
        return ev[:, 0], ev[:, 1]

    def _rank_pending(self, request_key, step, seq, n_tokens, pend, pin_below) -> np.ndarray:
        """Evictions of the groups whose near-ties :func:`_guard_round` left open: their
        certain ones, and of the band, the ``places left`` smallest by the exact key (the
        model's float32 score, times m in float64 for H2O; ties evict the higher position,
        as ``topk_mask`` keeps the lower slot). Removed from the state as the kernel does."""
        t = self.imp.log_score_terms(request_key, self.cpos.shape[0], step, seq, seq,
                                     static=self.streams[2])
        out = []
        for g in np.unique(pend[:, 0]):
            rows = pend[pend[:, 0] == g]
            band = rows[rows[:, 3] >= 0]
            v = np.empty(len(band))
            log_scores_at(band[:, 0].copy(), band[:, 2].copy(), t.ip_i, t.ip_f, t.static,
                          t.drift, t.consts, t.sig, t.lm, t.sink, t.seq_len, v)
            ex = np.exp(v).astype(np.float32)
            if self.prm[_P_AGED]:
                ex = ex.astype(np.float64) * np.maximum(n_tokens - band[:, 2], 1)
            order = np.lexsort((-band[:, 2], ex))
            chosen = np.concatenate([rows[rows[:, 3] < 0][:, 1], band[order[:band[0, 3]], 1]])
            for i in np.sort(chosen)[::-1]:
                if self.cpos[g, i] < pin_below:
                    continue
                out.append((g, _guard_remove(g, i, self.cpos, self.fa, self.ia)))
        return np.array(out, dtype=np.int64).reshape(-1, 2)
