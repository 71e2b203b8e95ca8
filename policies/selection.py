"""Selection shared by the policies: the top-``k`` and most-recent masks (:func:`topk_mask`,
:func:`recent_mask`) and the compiled score-ranking round (:func:`_score_topk_round`, its rules
:data:`RULE_TOP`, :data:`RULE_RECENT`, :data:`RULE_H2O`) that TOVA, TriAttention and H2O keep
their top by, with the band of candidates it leaves open ranked exactly (:func:`_rank_band`)."""

from __future__ import annotations

import numpy as np

from sim.jit import kernel

from . import score_terms
from .score_terms import log_score_at


def _rank_desc(score: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Per-row rank (0 = best) of candidates by descending score; non-candidates get a huge rank.

    Ties break toward the lower slot index (stable sort)."""
    s = np.where(cand, score.astype(np.float64), -np.inf)
    order = np.argsort(-s, axis=1, kind="stable")
    rank = np.empty_like(order)
    rows = np.arange(s.shape[0])[:, None]
    rank[rows, order] = np.arange(s.shape[1])[None, :]
    return np.where(cand, rank, np.iinfo(np.int64).max)


def topk_mask(score: np.ndarray, cand: np.ndarray, k) -> np.ndarray:
    """``bool[H, S]``: the top-``k`` candidates per row by ``score`` (all of them if fewer).

    ``k``: int or ``int[H]`` (per-row budgets, clipped at 0)."""
    if isinstance(k, (int, np.integer)):
        k = np.full(score.shape[0], max(int(k), 0), dtype=np.int64)
    else:
        k = np.maximum(np.broadcast_to(np.asarray(k, dtype=np.int64), (score.shape[0],)), 0)
    if score.shape[1] == 0:
        return np.zeros(score.shape, dtype=bool)
    # per row, a partition finds the k-th largest candidate score; every candidate above it is
    # kept, and of those equal to it the lowest slots (the stable sort's tie order): one
    # compiled call over the rows (_topk_rows), O(S) a row against a sort's O(S log S) (a
    # per-layer policy selects over 36 rows a round)
    if score.dtype != np.float32 and score.dtype != np.float64:
        score = score.astype(np.float64)  # exact and order-preserving for the scores used
    elif not score.flags.writeable:  # a broadcast view: the kernel takes writable arrays
        score = score.copy()
    if cand.dtype != np.bool_ or not cand.flags.writeable:
        cand = np.array(cand, dtype=bool)
    out = np.zeros(score.shape, dtype=bool)
    if _topk_rows(score, cand, np.ascontiguousarray(k), out) < 0:
        # an infinite candidate score ties with non-candidates
        return cand & (_rank_desc(score, cand) < k[:, None])
    return out


@kernel(["i8(f4[:], b1[:], i8, b1[:])", "i8(f8[:], b1[:], i8, b1[:])"])
def _topk_row(score, cand, k, out):  # pragma: no cover (compiled)
    """One row of :func:`topk_mask`: sets ``out`` True on the ``k`` candidates with the largest
    scores, ties to the lowest slots; returns the candidates kept, or -1 (``out`` untouched) if
    a candidate's score is not finite."""
    n = 0
    for i in range(score.shape[0]):
        if cand[i]:
            if not np.isfinite(score[i]):
                return -1
            n += 1
    if n <= k:
        for i in range(score.shape[0]):
            if cand[i]:
                out[i] = True
        return n
    if k <= 0:
        return 0
    v = np.empty(n, dtype=score.dtype)
    j = 0
    for i in range(score.shape[0]):
        if cand[i]:
            v[j] = score[i]
            j += 1
    thr = np.partition(v, n - k)[n - k]
    ties = k
    for j in range(n):
        if v[j] > thr:
            ties -= 1
    for i in range(score.shape[0]):
        if cand[i]:
            x = score[i]
            if x > thr:
                out[i] = True
            elif x == thr and ties > 0:
                out[i] = True
                ties -= 1
    return k


@kernel(["i8(f4[:, :], b1[:, :], i8[:], b1[:, :])", "i8(f8[:, :], b1[:, :], i8[:], b1[:, :])"])
def _topk_rows(score, cand, k, out):  # pragma: no cover (compiled)
    """:func:`_topk_row` on each row ``h`` with ``k[h]``; -1 as soon as a row returns -1
    (``out`` then partly written: the caller discards it), else 0."""
    for h in range(score.shape[0]):
        if _topk_row(score[h], cand[h], k[h], out[h]) < 0:
            return -1
    return 0


def recent_mask(pos: np.ndarray, cand: np.ndarray, k) -> np.ndarray:
    """``bool[H, S]``: the ``k`` candidates with the largest positions per row."""
    return topk_mask(pos.astype(np.float64), cand, k)


# rules of the compiled score-ranking round (_score_topk_round): which candidates a group's
# recent window takes and how many of the rest the scores rank in
RULE_TOP = 0      # TOVA: the top (budget - protected) by score
RULE_RECENT = 1   # TriAttention: min(recent_window, budget) recent, then the top budget - that
RULE_H2O = 2      # H2O: min(n_recent, budget - protected) recent, the rest by score x age

#: bound on |log(exact key) - key the compiled round ranks by| (log domain): a float32 score's
#: rounding is below 2**-24 relative (6e-8), numpy's exp and log a few ulps
KEY_EPS = 1e-6


@kernel("i8(i4[:, :], i8[:], f8[:], i8[:, :], f8[:, :], f8[:, :], f8[:, :], f8[:], f8[:], f8[:], "
        "f8[:], i8, b1[:, :], i8[:, :], f8[:])", depends=(score_terms,))
def _score_topk_round(slot_pos, prm, logm, ip_i, ip_f, static, drift, consts, sig, lm, sink,
                      seq_len, keep, pend, pend_v):  # pragma: no cover (compiled)
    """The keep mask of a score-ranking round (TOVA, TriAttention, H2O ``select``) from the
    clipped log-scores of an importance model (:class:`policies.score_terms.LogScoreTerms`'
    fields), computed only for the candidates the scores rank.

    ``prm`` = (rule, budget, protect, prompt_len, recent, n_tokens); ``logm[m] = log(m)`` for
    every age weight ``m = max(n_tokens - p, 1)`` (H2O). Per group: live slots below
    ``prompt_len`` are kept when ``protect`` (the protected prompt), the rest are candidates;
    the rule's recent window takes the candidates with the largest positions; the top ``k``
    of the others by score (f32(exp(v))) or H2O's score x age are kept, ties to the lowest
    slots, as :func:`topk_mask`. The ranking is by ``v`` (or ``v + log m``), within
    :data:`KEY_EPS` of the log of the exact key: candidates more than ``2 KEY_EPS`` above the
    k-th largest are kept, those more than that below dropped, and when the band between holds
    more candidates than places left, its candidates go to ``pend`` (group, slot, places
    left, m) and ``pend_v`` (their v) for the caller to rank by their exact keys. Returns the
    band candidates written, or -1 when ``pend`` cannot hold them (``keep`` is then partly
    written)."""
    rule = prm[0]
    budget = prm[1]
    protect = prm[2] != 0
    P = prm[3]
    rcfg = prm[4]
    n_tokens = prm[5]
    H, S = slot_pos.shape
    cj = np.empty(S, dtype=np.int64)
    cp = np.empty(S, dtype=np.int64)
    key = np.empty(S, dtype=np.float64)
    vv = np.empty(S, dtype=np.float64)
    n_pend = 0
    for g in range(H):
        n = 0
        nprot = 0
        for j in range(S):
            p = slot_pos[g, j]
            if p < 0:
                continue
            if protect and p < P:
                keep[g, j] = True
                nprot += 1
            else:
                cj[n] = j
                cp[n] = p
                n += 1
        if rule == RULE_TOP:
            r = 0
            k = budget - nprot
        elif rule == RULE_RECENT:
            r = min(rcfg, budget) if rcfg > 0 else 0
            k = budget - r
        else:
            avail = budget - nprot
            r = min(rcfg, max(avail, 0))
            k = avail - r
        if r > 0 and n > 0:
            if r >= n:
                for i in range(n):
                    keep[g, cj[i]] = True
                n = 0
            else:  # (positions are distinct within a group: no ties)
                thr = np.partition(cp[:n], n - r)[n - r]
                m = 0
                for i in range(n):
                    if cp[i] >= thr:
                        keep[g, cj[i]] = True
                    else:
                        cj[m] = cj[i]
                        cp[m] = cp[i]
                        m += 1
                n = m
        if k <= 0 or n == 0:
            continue
        if n <= k:
            for i in range(n):
                keep[g, cj[i]] = True
            continue
        for i in range(n):
            v = log_score_at(g, cp[i], ip_i, ip_f, static, drift, consts, sig, lm, sink, seq_len)
            vv[i] = v
            if rule == RULE_H2O:
                mm = n_tokens - cp[i]
                key[i] = v + logm[mm if mm > 1 else 1]
            else:
                key[i] = v
        thr = np.partition(key[:n], n - k)[n - k]
        above = thr + 2.0 * KEY_EPS
        below = thr - 2.0 * KEY_EPS
        certain = 0
        band = 0
        for i in range(n):
            if key[i] > above:
                certain += 1
            elif key[i] >= below:
                band += 1
        need = k - certain
        if need == band:
            for i in range(n):
                if key[i] >= below:
                    keep[g, cj[i]] = True
            continue
        if n_pend + band > pend.shape[0]:
            return -1
        for i in range(n):
            if key[i] > above:
                keep[g, cj[i]] = True
            elif key[i] >= below:
                mm = n_tokens - cp[i]
                pend[n_pend, 0] = g
                pend[n_pend, 1] = cj[i]
                pend[n_pend, 2] = need
                pend[n_pend, 3] = mm if mm > 1 else 1
                pend_v[n_pend] = vv[i]
                n_pend += 1
    return n_pend


_NO_LOGS = np.zeros(1, dtype=np.float64)


def _rank_band(keep: np.ndarray, pend: np.ndarray, pend_v: np.ndarray, aged: bool) -> None:
    """Keep, per group, the band candidates ``_score_topk_round`` left open: rows of ``pend``
    (group, slot, places left, m) in slot order within a group, ``pend_v`` their clipped
    log-scores. Their exact keys are the model's float32 scores ``f32(exp(v))`` (numpy's exp,
    as :meth:`policies.importance.ImportanceModel._scores`), times ``m`` in float64 when
    ``aged`` (H2O); the top ``places left`` by key are kept, ties to the lower slot."""
    sc = np.exp(pend_v).astype(np.float32)
    ex = sc.astype(np.float64) * pend[:, 3] if aged else sc
    cut = np.flatnonzero(np.diff(pend[:, 0])) + 1
    for a, b in zip(np.r_[0, cut], np.r_[cut, len(pend)]):
        order = np.argsort(-ex[a:b], kind="stable")
        keep[pend[a, 0], pend[a:b, 1][order[:pend[a, 2]]]] = True
