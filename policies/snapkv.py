"""The SnapKV family: ``snapkv`` (compress the prompt once after prefill from an observation
window), ``pyramidkv`` (layer budgets decreasing with depth) and ``ada_kv`` (per-head budgets
within each layer), with their options and the pooling they share."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import ScoredConfig, register_options, register_policy
from .eviction import EvictionPolicy
from .pooled_round import ada_keep, ada_pooled, shared_terms, snap_keep
from .selection import KEY_EPS, _rank_band, topk_mask


@register_options
@dataclass
class SnapKVConfig(ScoredConfig):
    """``snapkv``: compress the prompt once after prefill from an observation window.

    Fields: budget (prompt tokens kept per group), observation_window (last prompt tokens,
    always kept), pooling_kernel (odd, tokens), pooling (``max`` or ``avg``).
    """

    name: str = "snapkv"
    budget: int = 2048
    observation_window: int = 32
    pooling_kernel: int = 7
    pooling: str = "max"

    def check(self) -> None:
        super().check()
        self._budget_at_least_one()
        self._nonneg("observation_window")
        self._window_within_budget()
        self._one_of("pooling", ("max", "avg"))
        if self.pooling_kernel < 1 or self.pooling_kernel % 2 == 0:
            raise ValueError(f"policy {self.name}: pooling_kernel must be an odd number >= 1 (a "
                             f"window centred on each token), got {self.pooling_kernel}")


@register_options
@dataclass
class PyramidKVConfig(SnapKVConfig):
    """``pyramidkv``: SnapKV with layer budgets decreasing with depth.

    Fields: SnapKV's, and layer_budget_ratio (the top layer keeps budget / layer_budget_ratio,
    >= 1); budget is the per-layer average.
    """

    name: str = "pyramidkv"
    layer_budget_ratio: float = 20.0

    def check(self) -> None:
        super().check()
        if self.layer_budget_ratio < 1.0:
            raise ValueError(f"policy pyramidkv: layer_budget_ratio must be >= 1, got "
                             f"{self.layer_budget_ratio}")


@register_options
@dataclass
class AdaKVConfig(SnapKVConfig):
    """``ada_kv``: SnapKV with per-head budgets within each layer.

    Fields: SnapKV's, and ada_floor (each head keeps at least ada_floor x its uniform share).
    """

    name: str = "ada_kv"
    ada_floor: float = 0.2

    def check(self) -> None:
        super().check()
        self._fraction("ada_floor")


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
        pos = layout.slot_pos
        return self._from_terms(pos, pos.shape[0], layout.prompt_len, terms, False)

    def select_row_from_terms(self, row: np.ndarray, H: int, prompt_len: int, terms):
        """:meth:`select_from_terms` on a layout of ``H`` groups that all hold ``row``
        (``int32[S]``: each slot's position, -1 empty) and prompt ``prompt_len``, without the
        ``H x S`` slot table: the same ``bool[H, S]`` keep mask, or None where it does not
        apply."""
        return self._from_terms(row.reshape(1, -1), int(H), int(prompt_len), terms, True)

    def _from_terms(self, pos, H, P, terms, shared):
        """:meth:`select_from_terms` on the slots ``pos`` (``int32[H, S]``, or with ``shared``
        ``int32[1, S]``: every group's row)."""
        if not self.pools_logs:
            return None
        S = pos.shape[1]
        if S == 0:
            return np.zeros((H, 0), dtype=bool)
        w = min(int(self.cfg.observation_window), P)
        kernel = int(self.cfg.pooling_kernel)
        k = max(1, min(kernel, 2 * S - 1)) if kernel > 1 else 1
        return self._keep_from_terms(pos, H, P, w, k, terms, shared)

    def _keep_from_terms(self, pos, H, P, w, k, t, shared):
        """:meth:`select_from_terms`' keep (``bool[H, S]``) from the terms ``t`` (pooling
        kernel ``k``; ``pos``, ``shared`` as :meth:`_from_terms` takes them): the observation
        window, decode tokens and the top ``group_budgets - w`` pooled scores of each group
        (:func:`policies.pooled_round.snap_keep`, near-ties by the exact float32 scores), or
        None (see :meth:`select_from_terms`)."""
        S = pos.shape[1]
        keep = np.zeros((H, S), dtype=bool)
        pend = np.empty((self.PEND_CAP, 4), dtype=np.int64)
        pend_v = np.empty(self.PEND_CAP, dtype=np.float64)
        kg = np.ascontiguousarray(self.group_budgets(H) - w, dtype=np.int64)
        n = snap_keep(pos, P, k, P - w, kg, t.ip_i, t.ip_f, t.static, t.drift, t.consts, t.sig,
                      t.lm, t.sink, t.seq_len, KEY_EPS, keep, pend, pend_v, True, shared)
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

    def _keep_from_terms(self, pos, H, P, w, k, t, shared):
        """:meth:`_keep_pooled` on the exact pooled scores of the candidates, ``f32(exp(.))`` of
        their pooled log-scores (:func:`policies.pooled_round.ada_pooled`; the normalisation
        sums every candidate's score, so each is needed exactly; numpy's exp, and the row sums
        in numpy's pairwise order, as :meth:`select` computes them), with the observation
        window and decode tokens (:func:`policies.pooled_round.ada_keep`); None where the
        pooling does not apply."""
        S = pos.shape[1]
        keep = np.zeros((H, S), dtype=bool)
        per_head = max(int(self.cfg.budget) - w, 0)
        floor = int(math.floor(self.cfg.ada_floor * per_head))
        layers = self.group_layer(H)
        starts = np.r_[0, np.flatnonzero(np.diff(layers)) + 1, H].tolist()
        top = min(P, t.ip_i.shape[1])
        z0 = np.empty(top, dtype=np.float64)
        rec = np.empty(top, dtype=np.float64)
        shared_terms(P, t.ip_i, t.ip_f, t.static, t.drift, t.consts, t.lm, t.sink, t.seq_len, z0,
                     rec)
        # one layer at a time: its groups' scores in arrays of (groups x S) entries
        wide = max(b - a for a, b in zip(starts[:-1], starts[1:]))
        cv = np.empty(wide * S, dtype=np.float64)
        cj = np.empty(wide * S, dtype=np.int64)
        off = np.empty(wide + 1, dtype=np.int64)
        e = np.empty(wide * S, dtype=np.float32)
        for g0, g1 in zip(starts[:-1], starts[1:]):
            n = ada_pooled(pos, P, k, P - w, g0, g1, t.ip_i, t.ip_f, t.static, t.drift, t.consts,
                           t.sig, z0, rec, keep, cv, cj, off, shared)
            if n < 0:
                return None
            np.exp(cv[:n], out=cv[:n])
            e[:n] = cv[:n]  # (float32, as astype rounds)
            ada_keep(e[:n], cj, off[:g1 - g0 + 1], g0, per_head, floor, keep)
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
