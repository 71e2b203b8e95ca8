"""Token-eviction policies: when a round fires, and which slots each group keeps.

Every policy follows TensorRT-LLM's split (seed 001): the policy only decides WHO stays (a keep
mask over the layout's slots); a shared, algorithm-neutral compactor (:mod:`policies.compaction`)
decides how bytes move and which blocks are freed.

Interface (all policies; one policy object serves every request, per-request state lives in
:class:`RequestState`):

    H = policy.num_groups(num_kv_heads, num_layers)     # groups for its mode (binds the model shape)
    st = policy.new_state(request_key, prompt_len)      # validates the request (ValueError)
    policy.next_round_at(st) -> Optional[int]           # token count (prompt+generated) of next round
    policy.on_prefill_end(st) -> bool                   # True: run a round now (after prefill)
    policy.on_decode(st, n_tokens) -> bool              # True: run a round now (after this step)
    policy.on_finish(st)
    keep = policy.select(layout, scores, n_tokens, step)  # bool[H, S]
    policy.pinned_len(layout)                           # slots forward packing must not move
    policy.uses_scores, policy.scores_from(layout)      # which scores select reads (score_slots)

Cost descriptors: ``needs_attention_scores`` (eager attention: score matrix in HBM),
``scoring_when`` (``step`` | ``round`` | ``never``), ``scoring_bytes(shape, n_tokens, prompt_len,
n_blocks)`` (bytes per scoring event), ``reads_fraction(n_blocks, num_layers)`` (share of KV pages a
decode step reads; < 1 only for Quest), ``frees_memory``.

Scores: ``float[H, S]`` (or ``[1, S]``, broadcast) aligned to ``layout.slot_pos`` (e.g.
:func:`policies.importance.score_slots`), larger = more important; values in empty slots are ignored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from sim.jit import inline, kernel

from . import importance
from .config import (MODES, AdaKVConfig, H2OConfig, PolicyOptions, PyramidKVConfig, SnapKVConfig,
                     StreamingLLMConfig, TOVAConfig, register_policy)
from .importance import log_score_at, log_scores_at
from .pooled_round import ada_keep, ada_pooled, scatter_rows, snap_keep


@dataclass
class ModelShape:
    """Model numbers the cost descriptors need.

    ``kv_bytes_per_token``: K+V bytes of one token over all layers and KV heads (design.md section 3,
    e.g. Qwen3-8B BF16 147,456). ``score_bytes``: bytes per attention score (fp32 = 4).
    """

    num_layers: int
    num_kv_heads: int
    num_q_heads: int
    head_dim: int
    kv_bytes_per_token: float
    score_bytes: int = 4


@dataclass
class RequestState:
    """Per-request policy state.

    ``n_tokens``: tokens in the sequence (prompt + generated) as last reported; ``rounds``: rounds
    fired; ``last_round_tokens``: n_tokens at the last round (-1 = none); ``extra``: policy scratch.
    """

    request_key: int
    prompt_len: int
    n_tokens: int = 0
    prefill_done: bool = False
    rounds: int = 0
    last_round_tokens: int = -1
    extra: dict = field(default_factory=dict)

    @property
    def generated(self) -> int:
        """Decode tokens so far (n_tokens - prompt_len, >= 0)."""
        return max(0, self.n_tokens - self.prompt_len)


# ---------------------------------------------------------------------------------- helpers
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
        "f8[:], i8, b1[:, :], i8[:, :], f8[:])", depends=(importance,))
def _score_topk_round(slot_pos, prm, logm, ip_i, ip_f, static, drift, consts, sig, lm, sink,
                      seq_len, keep, pend, pend_v):  # pragma: no cover (compiled)
    """The keep mask of a score-ranking round (TOVA, TriAttention, H2O ``select``) from the
    clipped log-scores of an importance model (:class:`policies.importance.LogScoreTerms`'
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


# ------------------------------------------------------------ per-step rounds kept between steps
# A per-step policy (H2O, TOVA) evicts about one token per group a step out of about budget
# candidates. Within one drift epoch a candidate's clipped log-score is ``clip(A + B cos th + C
# sin th + recency)`` with constants A, B, C per candidate (its static fields and its two epochs'
# drifting fields, weighted by the group's sigma), so over a window of steps it stays above a
# bound computed once. A round evaluates only the candidates whose bound lies below a guard level
# (the "danger" ones, kept first in the arrays) and is exact when the d-th smallest key among
# them lies below the guard: every other candidate stays above it all window long.

#: ``GuardedRanking.fv`` (float64): the window (first and last step, sequence length and
#: n_tokens at its start, cos and sin of theta at its first and last step, (theta span)^2 / 8),
#: cos and sin of the round's theta, log(sink_boost); the groups' guard levels follow
(_WIN_STEP0, _WIN_STEP1, _WIN_SEQ0, _WIN_N0, _WIN_C0, _WIN_S0, _WIN_C1, _WIN_S1, _WIN_H2,
 _F_C, _F_S, _F_LOGSB, _F_L) = range(13)
#: ``_guard_round``'s ``prm`` (int64): H2O's age weight on, the round's step, sequence length
#: and n_tokens, sink tokens, positions below this stay (shared blocks), danger candidates kept
#: at least, new candidates' positions (from, to), constants of a new epoch to compute, drift
#: period, window length (steps)
(_P_AGED, _P_STEP, _P_SEQ, _P_NTOK, _P_NSINK, _P_PIN, _P_MIN_DANGER, _P_FROM, _P_TO,
 _P_NEW_EPOCH, _P_PERIOD, _P_WINDOW) = range(12)
#: ``GuardedRanking.fa`` rows (float64[4, H, cap]) and ``ia`` rows (int64[3, H])
_A, _B, _C, _LO = range(4)
_N, _ND, _K = range(3)


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
    thr = np.partition(lo[:ng].copy(), m - 1)[m - 1]
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


@kernel("i8(i8[:, :], f8[:, :, :], i8[:, :], f8[:], i8[:], f8[:], f8[:], i8[:, :], f8[:, :], "
        "f8[:, :], f8[:, :], f8[:], f8[:], i8[:, :], i8[:, :], i8[:])")
def _guard_round(cpos, fa, ia, fv, prm, lm, logm, ip_i, ip_f, static, drift, consts, sig, ev,
                 pend, cnt):  # pragma: no cover (compiled)
    """One round of a :class:`GuardedRanking` (see the section's comment): the new
    candidates (positions ``prm[_P_FROM]..prm[_P_TO]-1``) join every group with their epoch
    constants (every candidate's when ``prm[_P_NEW_EPOCH]``: ``A = sig_g (a static_0 + b
    static_g)``, ``B = sig_g sd (a F_e,0 + b F_e,g)``, ``C = sig_g sd (a F_(e+1),0 + b
    F_(e+1),g)`` from the dense terms of ``ImportanceModel.log_score_terms``); the window is
    renewed when the round falls outside it (every group's bounds then), else the new
    candidates get bounds and join the danger ones when below the guard; then per group the
    ``d = n - k`` candidates with the smallest keys are evicted, as ``topk_mask`` keeps the
    other ``k`` (ties kept at the lower position). Evicted candidates below ``prm[_P_PIN]``
    (shared blocks) stay candidates and are not reported. Writes the evicted (group,
    position) pairs into ``ev`` (``cnt[0]``) and, for groups whose near-ties the keys leave
    open, rows (group, index, position, places left in the band, or -1 for a certain
    eviction) into ``pend`` (``cnt[1]``), those groups untouched; ``cnt[2]`` and ``cnt[3]``
    count group refreshes and keys computed. Returns 0, or -1 when ``ev`` or ``pend`` is too
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
    # the window of bounds
    new_window = prm[_P_NEW_EPOCH] != 0 or not (
        fv[_WIN_STEP0] <= step <= fv[_WIN_STEP1]
        and fv[_WIN_SEQ0] <= seq_len <= fv[_WIN_SEQ0] + (fv[_WIN_STEP1] - fv[_WIN_STEP0])
        and n_tokens >= fv[_WIN_N0])
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
    key = np.empty(cpos.shape[1], dtype=np.float64)
    idx = np.empty(cpos.shape[1], dtype=np.int64)
    n_ev = 0
    n_pend = 0
    for g in range(H):
        d = ia[_N, g] - ia[_K, g]
        if new_window:  # (a danger set as large as the last one needed)
            _bounds(g, 0, cpos, fa, ia, fv, lm, n_sink, logm, aged)
            _guard_level(g, max(prm[_P_MIN_DANGER], 2 * d, ia[_ND, g]), cpos, fa, ia, fv)
            cnt[2] += 1
            fresh = True
        else:
            _bounds(g, first[g], cpos, fa, ia, fv, lm, n_sink, logm, aged)
            for i in range(first[g], ia[_N, g]):
                if fa[_LO, g, i] <= fv[_F_L + g]:
                    j = ia[_ND, g]
                    if i != j:
                        cpos[g, i], cpos[g, j] = cpos[g, j], cpos[g, i]
                        for r in range(4):
                            fa[r, g, i], fa[r, g, j] = fa[r, g, j], fa[r, g, i]
                    ia[_ND, g] = j + 1
            fresh = False
        if d <= 0:
            continue
        thr = 0.0
        ndg = 0
        while True:
            ndg = ia[_ND, g]
            if ndg >= d:
                for i in range(ndg):
                    key[i] = _approx_log_key(fa[_A, g, i], fa[_B, g, i], fa[_C, g, i], cpos[g, i],
                                             c, s, lm, seq_len, n_sink, log_sb, logm, n_tokens,
                                             aged)
                cnt[3] += ndg
                if d == 1:
                    thr = key[0]
                    for i in range(1, ndg):
                        thr = min(thr, key[i])
                else:
                    thr = np.partition(key[:ndg].copy(), d - 1)[d - 1]
                if thr + 2.0 * KEY_EPS < fv[_F_L + g]:
                    break
            # the bounds hold all window long: a larger danger set from them
            m = max(prm[_P_MIN_DANGER], 2 * d, 2 * ndg) if not fresh else max(4 * ndg, 2 * d)
            _guard_level(g, m, cpos, fa, ia, fv)
            cnt[2] += 1
            fresh = True
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
    cap]``: their constants A, B, C and bounds), ``ia`` (``int64[3, H]``: candidates, danger
    candidates, candidates kept), ``fv`` (window and guard levels), ``start`` (lowest candidate
    position: the prompt's end when protected), ``floor`` (positions from it on are not
    candidates yet: H2O's recent window, or not placed), ``recent`` (H2O's window, 0 for
    TOVA), ``epoch`` of the constants."""

    #: steps one window of bounds covers (they widen with it: ~0.005 a step in the log)
    WINDOW = 32
    #: danger candidates a group keeps at least (more when it evicts more)
    MIN_DANGER = 32
    #: evictions a group may take in one round on this path (more: the caller's full round)
    MAX_EVICT = 64

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
        self.ia = np.zeros((3, H), dtype=np.int64)
        self.ia[_N] = [len(c) for c in cand]
        self.ia[_K] = k
        self.fv = np.zeros(_F_L + H)
        self.fv[_F_LOGSB] = math.log(float(imp.params.sink_boost))
        self.prm = np.zeros(12, dtype=np.int64)
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
        self.cnt = np.zeros(4, dtype=np.int64)  # evicted, band rows; refreshes, keys computed
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
            self.cpos, self.fa = cpos, fa
        self.room = self.cpos.shape[1] - int(self.ia[_N].max())

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
            # (the epoch's memos, fetched again when new candidates pass their ends)
            tab, static, drift, consts = imp.stream_terms(request_key, H, step, max(seq, 1))
            sa = self.streams = (tab[0], tab[1], static, drift, consts,
                                 imp._sigma(request_key, H))
        if floor - self.floor > self.room:
            self._grow(int(self.ia[_N].max()) + floor - self.floor)
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
                          self.pend, cnt)
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
        t = self.imp.log_score_terms(request_key, self.cpos.shape[0], step, seq, seq)
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


def _pool_along_positions(score: np.ndarray, pos: np.ndarray, region: np.ndarray, kernel: int,
                          kind: str) -> np.ndarray:
    """1-D pooling of scores over the tokens of ``region`` taken in position order (SnapKV clustering).

    Returns ``float64[H, S]`` (``-inf`` outside ``region``). ``kind``: ``max`` or ``avg``
    (zero-padded average, like ``avg_pool1d`` with padding)."""
    H, S = score.shape
    out = np.full((H, S), -np.inf)
    if kernel <= 1:
        return np.where(region, score.astype(np.float64), -np.inf)
    if S == 0:
        return out
    big = np.iinfo(np.int32).max
    key = np.where(region, pos, big)
    order = np.argsort(key, axis=1, kind="stable")
    rows = np.arange(H)[:, None]
    srt = np.where(region[rows, order], score[rows, order].astype(np.float64), np.nan)
    # a window wider than 2S - 1 reaches every token from every token, as a 2S - 1 one does: the
    # same maxima and sums (the average still divides by the kernel), without the S x kernel work
    # of a huge kernel (pooling_kernel=1000001 would take minutes)
    k = max(1, min(kernel, 2 * S - 1))
    half = k // 2
    fill = -np.inf if kind == "max" else 0.0
    pad = np.pad(np.where(np.isnan(srt), fill, srt), ((0, 0), (half, half)), constant_values=fill)
    win = np.lib.stride_tricks.sliding_window_view(pad, k, axis=1)
    pooled = win.max(axis=2) if kind == "max" else win.sum(axis=2) / kernel
    pooled = np.where(np.isnan(srt), -np.inf, pooled)
    out[rows, order] = pooled
    return out


class EvictionPolicy:
    """Base class: no eviction, never fires. Subclasses set the class attributes and override
    :meth:`select` and (for non-periodic cadences) :meth:`next_round_at` / :meth:`on_prefill_end`.

    Args: cfg: the policy's :class:`policies.config.PolicyOptions` subclass (validated by
    :func:`policies.registry.make_policy`).
    """

    name = "base"
    citation = ""
    needs_attention_scores = False
    scoring_when = "never"  # "step": every decode step; "round": at each round; "never"
    frees_memory = True
    default_mode = "union"
    allowed_modes = MODES

    def __init__(self, cfg: PolicyOptions):
        self.cfg = cfg
        self.mode = cfg.mode or self.default_mode
        self.num_layers: Optional[int] = None
        self.num_kv_heads: Optional[int] = None

    # -------------------------------------------------------------------- grouping
    def num_groups(self, num_kv_heads: int, num_layers: int) -> int:
        """Selection groups for this policy's mode (union 1, per_head kv_heads, per_layer layers,
        per_layer_per_head layers x kv_heads). Also binds the model shape used by layer-aware
        policies (PyramidKV, Ada-KV). Raises ValueError on non-positive sizes."""
        if num_kv_heads < 1 or num_layers < 1:
            raise ValueError(f"num_kv_heads and num_layers must be >= 1, got {num_kv_heads}, {num_layers}")
        self.num_kv_heads, self.num_layers = int(num_kv_heads), int(num_layers)
        return {"union": 1, "per_head": num_kv_heads, "per_layer": num_layers,
                "per_layer_per_head": num_layers * num_kv_heads}[self.mode]

    def group_layer(self, H: int) -> np.ndarray:
        """``int[H]``: layer index of each group (0 for modes that share a selection over layers)."""
        if self.mode == "per_layer":
            return np.arange(H)
        if self.mode == "per_layer_per_head":
            if not self.num_kv_heads:
                raise ValueError(f"{self.name}: call num_groups(num_kv_heads, num_layers) first")
            return np.arange(H) // self.num_kv_heads
        return np.zeros(H, dtype=np.int64)

    @property
    def protects_prompt(self) -> bool:
        """Prompt tokens are never evicted (and never moved by forward packing)."""
        return bool(self.cfg.protect_prompt)

    @property
    def budget_scope(self) -> str:
        """What ``budget`` counts: ``decode`` | ``total`` | ``prompt`` | ``read`` | ``none``."""
        return "none"

    #: ``select`` reads its ``scores`` argument (False: pass None, nothing is scored)
    uses_scores = True
    #: ``select`` reads the scores of candidate slots only, so a protected prompt needs none
    scores_candidates_only = False

    def scores_from(self, layout) -> int:
        """Lowest token position whose score :meth:`select` reads (``score_slots``'s
        ``from_pos``): ``layout.prompt_len`` when the prompt is protected and the policy ranks
        only the other tokens, else 0."""
        if self.scores_candidates_only and self.protects_prompt:
            return layout.prompt_len
        return 0

    def evict_range(self, n_tokens: int) -> Optional[tuple[int, int]]:
        """``(lo, hi)`` when :meth:`select` at sequence length ``n_tokens`` keeps every live
        slot except those holding positions ``lo <= p < hi`` (in every group); None when a
        round's selection depends on more than positions (scores, draws)."""
        return None

    def pinned_len(self, layout) -> int:
        """Leading slots a compactor must not move: ``layout.prompt_len`` if the prompt is protected."""
        return layout.prompt_len if self.protects_prompt else 0

    #: the rule of the compiled score-ranking round (:data:`RULE_TOP`, :data:`RULE_RECENT`,
    #: :data:`RULE_H2O`) when ``select`` keeps a top-k by score; None: ``select`` only
    score_rule: Optional[int] = None
    #: pending-band rows a compiled round can hold before it falls back to ``select``
    PEND_CAP = 1024

    def _recent_param(self) -> int:
        """The ``recent`` parameter of the compiled round (see :func:`_score_topk_round`)."""
        return 0

    def _log_ages(self, n: int) -> np.ndarray:
        """``float64[>= n + 1]``: ``log(m)`` at index m (``log(1) = 0`` at 0 and 1), grown by
        doubling."""
        tab = getattr(self, "_logm", None)
        if tab is None or tab.size <= n:
            size = max(n + 1, 2 * tab.size if tab is not None else 4096)
            tab = self._logm = np.log(np.maximum(np.arange(size, dtype=np.float64), 1.0))
        return tab

    def select_from_terms(self, layout, terms, n_tokens: int) -> np.ndarray:
        """:meth:`select` of a policy with a :attr:`score_rule`, for the scores of a fused
        :class:`policies.importance.ImportanceModel` given as its
        :meth:`~policies.importance.ImportanceModel.log_score_terms` (at the round's step,
        ``seq_len = layout.next_position``, ``hi >= layout.next_position``): the same keep
        mask, ``bool[H, S]``, with only the ranked candidates scored (compiled,
        :func:`_score_topk_round`) and the exponential taken (in numpy, as the model does)
        only where log-scores within :data:`KEY_EPS` leave the order open."""
        slot_pos = layout.slot_pos
        keep = np.zeros(slot_pos.shape, dtype=bool)
        rule = self.score_rule
        prm = np.array([rule, int(self.cfg.budget), int(self.protects_prompt), layout.prompt_len,
                        self._recent_param(), int(n_tokens)], dtype=np.int64)
        logm = self._log_ages(max(int(n_tokens), 1)) if rule == RULE_H2O else _NO_LOGS
        pend = np.empty((self.PEND_CAP, 4), dtype=np.int64)
        pend_v = np.empty(self.PEND_CAP, dtype=np.float64)
        t = terms
        n = _score_topk_round(slot_pos, prm, logm, t.ip_i, t.ip_f, t.static, t.drift, t.consts,
                              t.sig, t.lm, t.sink, t.seq_len, keep, pend, pend_v)
        if n < 0:
            return None
        if n:
            _rank_band(keep, pend[:n], pend_v[:n], rule == RULE_H2O)
        return keep

    # -------------------------------------------------------------------- lifecycle
    def check_request(self, prompt_len: int) -> None:
        """Raise ValueError if this policy cannot serve a prompt of ``prompt_len`` tokens."""
        if prompt_len < 0:
            raise ValueError(f"prompt_len must be >= 0, got {prompt_len}")

    def new_state(self, request_key: int, prompt_len: int) -> RequestState:
        """Fresh :class:`RequestState` (mirrors TensorRT-LLM ``on_request_init``). Validates the request."""
        self.check_request(prompt_len)
        return RequestState(request_key=int(request_key), prompt_len=int(prompt_len))

    def next_round_at(self, state: RequestState) -> Optional[int]:
        """Token count (prompt + generated) at which the next round fires; None = never."""
        return None

    def _fire(self, state: RequestState, n_tokens: int) -> bool:
        state.rounds += 1
        state.last_round_tokens = int(n_tokens)
        return True

    def on_prefill_end(self, state: RequestState) -> bool:
        """Prefill done (TensorRT-LLM ``on_context_step_end``): returns True if a round runs now."""
        nxt = self.next_round_at(state)
        state.n_tokens = state.prompt_len
        state.prefill_done = True
        if nxt is not None and nxt <= state.prompt_len:
            return self._fire(state, state.prompt_len)
        return False

    def on_decode(self, state: RequestState, n_tokens: int) -> bool:
        """A decode step wrote its token(s), sequence now ``n_tokens`` long (TensorRT-LLM
        ``on_generation_step_end``). Returns True if a round runs now; a step that jumps past several
        round points fires once (like a speculative step)."""
        if not state.prefill_done:
            state.prefill_done = True
        nxt = self.next_round_at(state)
        state.n_tokens = int(n_tokens)
        if nxt is not None and n_tokens >= nxt:
            return self._fire(state, n_tokens)
        return False

    def on_finish(self, state: RequestState) -> None:
        """Request finished or aborted (TensorRT-LLM ``on_request_finish``): drops scratch state."""
        state.extra.clear()

    # -------------------------------------------------------------------- selection
    def _prep(self, layout, scores):
        pos = layout.slot_pos
        live = pos >= 0
        H, S = pos.shape
        if scores is None:
            sc = np.zeros((H, S), dtype=np.float64)
        else:
            sc = np.asarray(scores)
            if sc.ndim != 2 or sc.shape[1] != S or sc.shape[0] not in (1, H):
                raise ValueError(f"{self.name}: scores must have shape ({H}, {S}) or (1, {S}), got {sc.shape}")
            if sc.shape[0] != H:
                sc = np.broadcast_to(sc, (H, S))
        return pos, live, sc

    def _protected(self, pos, live, prompt_len):
        if self.protects_prompt:
            return live & (pos < prompt_len)
        return np.zeros_like(live)

    def select(self, layout, scores, n_tokens: int, step: int) -> np.ndarray:
        """Keep mask ``bool[H, S]`` over ``layout``'s slots (never True on an empty slot).

        Args: layout: :class:`policies.layout.PagedLayout`; scores: ``float[H|1, S]`` or None;
        n_tokens: sequence length now (prompt + generated); step: decode steps done.
        Base policy keeps every live slot."""
        return layout.slot_pos >= 0

    # -------------------------------------------------------------------- cost descriptors
    def scoring_bytes(self, shape: ModelShape, n_tokens: int, prompt_len: int, n_blocks: int) -> float:
        """HBM bytes of one scoring event (per decode step if ``scoring_when == 'step'``, per round
        if ``'round'``), beyond the normal attention read. 0 for policies that do not score."""
        return 0.0

    def scoring_bytes_per_token(self, shape: ModelShape) -> Optional[float]:
        """``c`` when :meth:`scoring_bytes` is ``c x n_tokens`` whatever the other arguments,
        with every product exact in float64 (integer factors, below 2**53 for any sequence a
        run holds), so ``c * n_tokens`` gives its very bits; None otherwise."""
        return None

    def reads_fraction(self, n_blocks: int, num_layers: int, block_size: int = 16) -> float:
        """Share of the request's KV pages (``n_blocks`` blocks of ``block_size`` tokens) a
        decode step reads over ``num_layers`` layers (1.0 except Quest)."""
        return 1.0

    def describe(self) -> dict:
        """Name, citation and cost flags, for logs/metrics."""
        return {"name": self.name, "citation": self.citation, "mode": self.mode,
                "needs_attention_scores": self.needs_attention_scores,
                "scoring_when": self.scoring_when, "frees_memory": self.frees_memory,
                "budget_scope": self.budget_scope, "protects_prompt": self.protects_prompt}


class _Periodic(EvictionPolicy):
    """Cadence shared by budget-triggered policies: a round fires at counter values ``c`` with
    ``c % beta == 0`` and ``c > threshold``; ``c`` = generated tokens (budget_scope ``decode``) or
    sequence length (``total``). With ``total`` scope a prompt longer than the threshold also
    fires at prefill end."""

    def _threshold(self) -> int:
        return int(self.cfg.budget)

    def _period(self) -> int:
        return int(self.cfg.beta)

    def next_round_at(self, state: RequestState) -> Optional[int]:
        thr, beta = self._threshold(), self._period()
        decode = self.budget_scope == "decode"
        base = state.prompt_len if decode else 0
        if not state.prefill_done:
            if not decode and state.prompt_len > thr:
                return state.prompt_len
            now = state.prompt_len
        else:
            now = max(state.n_tokens, state.prompt_len)
        c_min = max(thr + 1, now - base)
        if state.last_round_tokens >= 0:
            c_min = max(c_min, state.last_round_tokens - base + 1)
        c = -(-c_min // beta) * beta
        return base + c


# ================================================================================== policies
@register_policy(StreamingLLMConfig)
class StreamingLLMPolicy(_Periodic):
    """``streaming_llm``: attention sinks + sliding recent window.

    Rule: keep the first ``sink_tokens`` positions and the last ``recent_window`` positions; evict
    everything between. A round fires every ``beta`` tokens (paper: every step, beta = 1) once the
    sequence exceeds ``sink_tokens + recent_window``; the prompt is not protected. No scores needed.
    Window tails that cover whole blocks free blocks even without compaction.
    Defaults: 4 sinks (paper), window = 2044 here (cache of 2048).
    Source: Xiao et al., "Efficient Streaming Language Models with Attention Sinks", ICLR 2024.
    """

    name = "streaming_llm"
    citation = "Xiao et al., Efficient Streaming Language Models with Attention Sinks, ICLR 2024"
    uses_scores = False

    @property
    def protects_prompt(self) -> bool:
        return False

    @property
    def budget_scope(self) -> str:
        return "total"

    def _threshold(self) -> int:
        return int(self.cfg.sink_tokens + self.cfg.recent_window)

    def evict_range(self, n_tokens: int) -> tuple[int, int]:
        """``(lo, hi)``: a round at sequence length ``n_tokens`` evicts every live position
        ``lo <= p < hi`` (the tokens between the sinks and the recent window) and keeps the
        rest."""
        return int(self.cfg.sink_tokens), int(n_tokens) - int(self.cfg.recent_window)

    def select(self, layout, scores, n_tokens, step):
        pos, live, _ = self._prep(layout, None)
        lo, hi = self.evict_range(n_tokens)
        return live & ((pos < lo) | (pos >= hi))


@register_policy(H2OConfig)
class H2OPolicy(_Periodic):
    """``h2o``: Heavy-Hitter Oracle: accumulated-attention heavy hitters + recent window.

    Rule: cache of ``budget`` tokens (total, prompt included unless ``protect_prompt``); when over
    budget, at every step (beta = 1), keep the ``recent_window`` most recent tokens (default
    ``budget x (1 - heavy_ratio)``, paper: half heavy, half recent) and the heaviest of the rest by
    accumulated attention. Accumulated attention is proxied by ``score x age`` (age = steps the
    token has been attended, n_tokens - position): the generative model has no per-step history.
    Needs attention scores every decode step (eager attention).
    Source: Zhang et al., "H2O: Heavy-Hitter Oracle for Efficient Generative Inference of LLMs",
    NeurIPS 2023.
    """

    name = "h2o"
    scores_candidates_only = True
    score_rule = RULE_H2O
    citation = "Zhang et al., H2O: Heavy-Hitter Oracle, NeurIPS 2023"
    needs_attention_scores = True
    scoring_when = "step"

    @property
    def budget_scope(self) -> str:
        return "total"

    def check_request(self, prompt_len):
        super().check_request(prompt_len)
        if self.protects_prompt and prompt_len > self.cfg.budget:
            raise ValueError(f"h2o: budget {self.cfg.budget} (total tokens) is below the protected "
                             f"prompt of {prompt_len} tokens")

    def _n_recent(self) -> int:
        if self.cfg.recent_window > 0:
            return int(self.cfg.recent_window)
        return int(round(self.cfg.budget * (1.0 - self.cfg.heavy_ratio)))

    def _recent_param(self) -> int:
        return self._n_recent()

    def select(self, layout, scores, n_tokens, step):
        pos, live, sc = self._prep(layout, scores)
        prot = self._protected(pos, live, layout.prompt_len)
        cand = live & ~prot
        avail = int(self.cfg.budget) - prot.sum(axis=1)
        n_recent = np.minimum(self._n_recent(), np.maximum(avail, 0))
        recent = recent_mask(pos, cand, n_recent)
        acc = sc.astype(np.float64) * np.maximum(n_tokens - pos, 1)
        heavy = topk_mask(acc, cand & ~recent, avail - n_recent)
        return prot | recent | heavy

    def scoring_bytes(self, shape, n_tokens, prompt_len, n_blocks):
        # full score matrix of this step (q_heads x n_tokens per layer) written then read, fp32
        return 2.0 * shape.num_q_heads * n_tokens * shape.score_bytes * shape.num_layers

    def scoring_bytes_per_token(self, shape):
        return 2.0 * shape.num_q_heads * shape.score_bytes * shape.num_layers


@register_policy(TOVAConfig)
class TOVAPolicy(_Periodic):
    """``tova``: Token Omission Via Attention.

    Rule: fixed cache of ``budget`` tokens (total); once over it, at every step drop the tokens with
    the lowest CURRENT attention score (no recent window, no sink rule). The paper averages scores
    over the heads of a layer (one selection per layer: ``mode: per_layer``); ``union`` shares one
    selection over layers. Needs attention scores every decode step.
    Source: Oren et al., "Transformers are Multi-State RNNs", 2024 (TOVA).
    """

    name = "tova"
    scores_candidates_only = True
    score_rule = RULE_TOP
    citation = "Oren et al., Transformers are Multi-State RNNs (TOVA), 2024"
    needs_attention_scores = True
    scoring_when = "step"

    @property
    def budget_scope(self) -> str:
        return "total"

    def check_request(self, prompt_len):
        super().check_request(prompt_len)
        if self.protects_prompt and prompt_len > self.cfg.budget:
            raise ValueError(f"tova: budget {self.cfg.budget} (total tokens) is below the protected "
                             f"prompt of {prompt_len} tokens")

    def select(self, layout, scores, n_tokens, step):
        pos, live, sc = self._prep(layout, scores)
        prot = self._protected(pos, live, layout.prompt_len)
        cand = live & ~prot
        return prot | topk_mask(sc, cand, int(self.cfg.budget) - prot.sum(axis=1))

    def scoring_bytes(self, shape, n_tokens, prompt_len, n_blocks):
        return 2.0 * shape.num_q_heads * n_tokens * shape.score_bytes * shape.num_layers

    def scoring_bytes_per_token(self, shape):
        return 2.0 * shape.num_q_heads * shape.score_bytes * shape.num_layers


@register_policy(SnapKVConfig)
class SnapKVPolicy(EvictionPolicy):
    """``snapkv``: compress the prompt once after prefill, from an observation window.

    Rule: fires once, at prefill end, if the prompt is longer than ``budget``. Per KV head
    (``mode: per_head``), the last ``observation_window`` prompt tokens (paper 32) are kept; the other
    prompt tokens are scored by the window's attention (here: importance scores at step 0),
    smoothed by 1-D pooling with ``pooling_kernel`` (paper 7, max pooling) so that kept tokens come in
    clusters, and the top ``budget - observation_window`` are kept. Decode tokens are never evicted
    (the cache then grows by one token per step). Needs the window's attention scores once.
    Source: Li et al., "SnapKV: LLM Knows What You are Looking for Before Generation", NeurIPS 2024.
    """

    name = "snapkv"
    citation = "Li et al., SnapKV, NeurIPS 2024"
    needs_attention_scores = True
    scoring_when = "round"
    default_mode = "per_head"

    @property
    def protects_prompt(self) -> bool:
        return False  # it compresses the prompt

    @property
    def budget_scope(self) -> str:
        return "prompt"

    def group_budgets(self, H: int) -> np.ndarray:
        """``int64[H]``: prompt tokens kept per group (including the observation window)."""
        return np.full(H, int(self.cfg.budget), dtype=np.int64)

    def check_request(self, prompt_len):
        super().check_request(prompt_len)

    def next_round_at(self, state):
        if state.rounds == 0 and not state.prefill_done and state.prompt_len > self._min_budget():
            return state.prompt_len
        return None

    def _min_budget(self) -> int:
        return int(self.cfg.budget)

    def on_decode(self, state, n_tokens):
        state.prefill_done = True
        state.n_tokens = int(n_tokens)
        return False

    def _window_and_pool(self, layout, sc, pos, live):
        P = layout.prompt_len
        w = min(int(self.cfg.observation_window), P)
        window = live & (pos >= P - w) & (pos < P)
        decode = live & (pos >= P)
        cand = live & (pos < P - w)
        pooled = _pool_along_positions(sc, pos, live & (pos < P), int(self.cfg.pooling_kernel),
                                       self.cfg.pooling)
        return w, window, decode, cand, pooled

    def select(self, layout, scores, n_tokens, step):
        pos, live, sc = self._prep(layout, scores)
        H = pos.shape[0]
        w, window, decode, cand, pooled = self._window_and_pool(layout, sc, pos, live)
        k = self.group_budgets(H) - w
        return window | decode | topk_mask(pooled, cand, k)

    @property
    def pools_logs(self) -> bool:
        """:meth:`select_from_terms` applies: max pooling (it commutes with the exponential)."""
        return self.cfg.pooling == "max"

    def select_from_terms(self, layout, terms, n_tokens: int):
        """:meth:`select` for the scores of a fused :class:`policies.importance.ImportanceModel`
        given as ``log_score_terms(..., static_lattice=True)`` at the round's step (``seq_len
        = layout.next_position``): the same keep mask (``bool[H, S]``), pooled in the log
        domain and ranked group by group in compiled passes (:meth:`_keep_from_terms`,
        :mod:`policies.pooled_round`), or None where it does not apply (average pooling,
        prompt positions out of slot order, more near-ties than it holds)."""
        if not self.pools_logs:
            return None
        pos = layout.slot_pos
        H, S = pos.shape
        if S == 0:
            return np.zeros((H, 0), dtype=bool)
        P = layout.prompt_len
        w = min(int(self.cfg.observation_window), P)
        kernel = int(self.cfg.pooling_kernel)
        k = max(1, min(kernel, 2 * S - 1)) if kernel > 1 else 1
        return self._keep_from_terms(pos, P, w, k, terms)

    def _keep_from_terms(self, pos, P, w, k, t):
        """:meth:`select_from_terms`' keep from the terms ``t`` (pooling kernel ``k``): the
        observation window, decode tokens and the top ``group_budgets - w`` pooled scores of
        each group (:func:`policies.pooled_round.snap_keep`, near-ties by the exact float32
        scores), or None (see :meth:`select_from_terms`)."""
        H, S = pos.shape
        keep = np.zeros((H, S), dtype=bool)
        pend = np.empty((self.PEND_CAP, 4), dtype=np.int64)
        pend_v = np.empty(self.PEND_CAP, dtype=np.float64)
        kg = np.ascontiguousarray(self.group_budgets(H) - w, dtype=np.int64)
        n = snap_keep(pos, P, k, P - w, kg, t.ip_i, t.ip_f, t.static, t.drift, t.consts, t.sig,
                      t.lm, t.sink, t.seq_len, KEY_EPS, keep, pend, pend_v)
        if n < 0:
            return None
        if n:
            _rank_band(keep, pend[:n], pend_v[:n], False)
        return keep

    def scoring_bytes(self, shape, n_tokens, prompt_len, n_blocks):
        w = min(self.cfg.observation_window, prompt_len)
        attn = 2.0 * w * shape.num_q_heads * prompt_len * shape.score_bytes * shape.num_layers
        return attn + prompt_len * shape.kv_bytes_per_token / 2.0


@register_policy(PyramidKVConfig)
class PyramidKVPolicy(SnapKVPolicy):
    """``pyramidkv``: SnapKV selection with layer budgets decreasing with depth.

    Rule: as SnapKV (once after prefill, observation window, pooling, per head), but layer l of L
    keeps k_l prompt tokens, an arithmetic sequence from k_0 = 2 x budget - budget/beta_p (bottom)
    to k_{L-1} = budget / beta_p (top), beta_p = ``layer_budget_ratio`` (paper 20), so the average
    is ``budget``; every k_l is at least the observation window. Needs a layer-resolving mode:
    ``per_layer_per_head`` (default) or ``per_layer``. Ragged lengths: under one block table the
    physical length is the bottom layer's.
    Source: Cai et al., "PyramidKV: Dynamic KV Cache Compression based on Pyramidal Information
    Funneling", 2024.
    """

    name = "pyramidkv"
    citation = "Cai et al., PyramidKV, 2024"
    default_mode = "per_layer_per_head"
    allowed_modes = ("per_layer", "per_layer_per_head")

    def layer_budgets(self, num_layers: int) -> np.ndarray:
        """``int64[num_layers]`` prompt tokens kept per layer (bottom first)."""
        b = float(self.cfg.budget)
        top = b / float(self.cfg.layer_budget_ratio)
        bottom = 2.0 * b - top
        if num_layers == 1:
            k = np.array([b])
        else:
            k = bottom - (bottom - top) * np.arange(num_layers) / (num_layers - 1)
        return np.maximum(np.round(k).astype(np.int64), int(self.cfg.observation_window))

    def _min_budget(self) -> int:
        L = self.num_layers or 1
        return int(self.layer_budgets(L).min())

    def group_budgets(self, H):
        layers = self.group_layer(H)
        L = self.num_layers if self.num_layers else int(layers.max()) + 1
        return self.layer_budgets(L)[layers]


@register_policy(AdaKVConfig)
class AdaKVPolicy(SnapKVPolicy):
    """``ada_kv``: adaptive per-head budgets within a layer (Ada-SnapKV).

    Rule: once after prefill (as SnapKV: observation window kept, pooled window scores), each layer
    has ``budget x kv_heads`` prompt tokens to share among its heads: scores are normalised per head
    to sum to 1 (attention-like), every head first keeps its top ``ada_floor`` share of the uniform
    per-head budget (the safeguard), and the rest of the layer budget goes to the highest normalised
    scores across all heads of the layer (flattened top-k). Heads with concentrated attention keep
    fewer tokens; ragged per-head lengths follow. Modes: ``per_layer_per_head`` (default; heads
    grouped by layer) or ``per_head`` (one representative layer).
    Source: Feng et al., "Ada-KV: Optimizing KV Cache Eviction by Adaptive Budget Allocation for
    Efficient LLM Inference", 2024.
    """

    name = "ada_kv"
    citation = "Feng et al., Ada-KV, 2024"
    default_mode = "per_layer_per_head"
    allowed_modes = ("per_head", "per_layer_per_head")

    def select(self, layout, scores, n_tokens, step):
        pos, live, sc = self._prep(layout, scores)
        w, window, decode, cand, pooled = self._window_and_pool(layout, sc, pos, live)
        return window | decode | self._keep_pooled(pooled, cand, w)

    def _keep_from_terms(self, pos, P, w, k, t):
        """:meth:`_keep_pooled` on the exact pooled scores of the candidates, ``f32(exp(.))`` of
        their pooled log-scores (:func:`policies.pooled_round.ada_pooled`; the normalisation
        sums every candidate's score, so each is needed exactly; numpy's exp and row sums, as
        :meth:`select` computes them), with the observation window and decode tokens
        (:func:`policies.pooled_round.ada_keep`); None where the pooling does not apply."""
        H, S = pos.shape
        keep = np.zeros((H, S), dtype=bool)
        cv = np.empty(H * S, dtype=np.float64)
        cj = np.empty(H * S, dtype=np.int64)
        off = np.empty(H + 1, dtype=np.int64)
        n = ada_pooled(pos, P, k, P - w, t.ip_i, t.ip_f, t.static, t.drift, t.consts, t.sig, t.lm,
                       t.sink, t.seq_len, keep, cv, cj, off)
        if n < 0:
            return None
        e = np.exp(cv[:n]).astype(np.float32)
        rows = np.zeros((H, S), dtype=np.float64)
        scatter_rows(e, cj, off, rows)
        den = np.maximum(rows.sum(axis=1), 1e-300)
        per_head = max(int(self.cfg.budget) - w, 0)
        floor = int(math.floor(self.cfg.ada_floor * per_head))
        layers = self.group_layer(H)
        starts = np.r_[0, np.flatnonzero(np.diff(layers)) + 1, H].astype(np.int64)
        ada_keep(e, cj, off, den, starts, per_head, floor, keep)
        return keep

    def _keep_pooled(self, pooled, cand, w):
        """The candidates kept by the pooled scores ``pooled`` (float64 of the float32 scores;
        read on candidates only): each head's floor by its normalised scores, then each
        layer's remaining budget by the flattened top-k."""
        H, S = cand.shape
        per_head = max(int(self.cfg.budget) - w, 0)
        floor = int(math.floor(self.cfg.ada_floor * per_head))
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(cand, pooled, 0.0)
            p = p / np.maximum(p.sum(axis=1, keepdims=True), 1e-300)
        keep = topk_mask(p, cand, floor)
        layers = self.group_layer(H)
        for l in np.unique(layers):
            gs = np.flatnonzero(layers == l)
            rest = cand[gs] & ~keep[gs]
            extra = per_head * gs.size - int(keep[gs].sum())
            if extra <= 0:
                continue
            flat = topk_mask(p[gs].reshape(1, -1), rest.reshape(1, -1), extra).reshape(gs.size, S)
            keep[gs] |= flat
        return keep
