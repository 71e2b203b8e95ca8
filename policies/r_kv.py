"""``r_kv``: importance minus redundancy at decode time (R-KV), with its options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from .config import ScoredConfig, register_options, register_policy
from .eviction import PeriodicEviction
from .selection import recent_mask, topk_mask


@register_options
@dataclass
class RKVConfig(ScoredConfig):
    """``r_kv``: importance minus redundancy, decode time.

    Fields: budget (decode tokens kept with protect_prompt, else total tokens), beta (round
    period, tokens), observation_window (always-kept recent tokens, inside the budget),
    rkv_lambda (weight of importance vs redundancy), redundancy_window (following tokens a
    token is compared with), protect_prompt.
    """

    name: str = "r_kv"
    budget: int = 2048
    beta: int = 128
    observation_window: int = 32
    rkv_lambda: float = 0.1
    redundancy_window: int = 8
    protect_prompt: bool = True

    option_hints: ClassVar[dict] = {
        "recent_window": "r_kv's always-kept recent tokens are its observation_window (set "
                         "policy.observation_window instead)"}

    def check(self) -> None:
        super().check()
        self._beta_positive()
        self._budget_at_least_one()
        self._nonneg("observation_window", "redundancy_window")
        self._window_within_budget()
        self._fraction("rkv_lambda")


@register_policy(RKVConfig)
class RKVPolicy(PeriodicEviction):
    """``r_kv``: Redundancy-aware KV compression for reasoning models (decode time).

    Rule: decode-time; the prompt is kept; once generated tokens exceed ``budget``, every ``beta``
    generated tokens (the paper's buffer, 128) keep the ``observation_window`` most recent tokens
    plus the top ``budget - observation_window`` by ``rkv_lambda x importance - (1 - rkv_lambda) x
    redundancy`` (paper lambda = 0.1). Importance = attention from the observation window (here:
    importance scores, min-max normalised per group); redundancy = key cosine similarity in the
    paper, proxied here by the similarity of log-scores with the next ``redundancy_window`` cached
    tokens (tokens inside a run of alike tokens are redundant). Needs attention scores of the
    observation window (eager attention) at each round.
    Source: Cai et al., "R-KV: Redundancy-aware KV Cache Compression for Reasoning Models", 2025.
    """

    name = "r_kv"
    citation = "Cai et al., R-KV: Redundancy-aware KV Cache Compression for Reasoning Models, 2025"
    needs_attention_scores = True
    scoring_when = "round"

    @property
    def budget_scope(self) -> str:
        return "decode" if self.protects_prompt else "total"

    def redundancy(self, pos, cand, sc) -> np.ndarray:
        """``float64[H, S]`` in [0, 1]: mean similarity exp(-|log s_p - log s_q|) to the next
        ``redundancy_window`` candidates in position order (0 for the last one)."""
        H, S = pos.shape
        big = np.iinfo(np.int32).max
        order = np.argsort(np.where(cand, pos, big), axis=1, kind="stable")
        rows = np.arange(H)[:, None]
        ok = cand[rows, order]
        ls = np.where(ok, np.log(np.maximum(sc[rows, order].astype(np.float64), 1e-30)), np.nan)
        acc = np.zeros((H, S))
        cnt = np.zeros((H, S))
        for d in range(1, max(1, int(self.cfg.redundancy_window)) + 1):
            if d >= S:
                break
            sim = np.exp(-np.abs(ls[:, :-d] - ls[:, d:]))
            valid = ~np.isnan(sim)
            acc[:, :-d] += np.where(valid, sim, 0.0)
            cnt[:, :-d] += valid
        red_sorted = np.where(cnt > 0, acc / np.maximum(cnt, 1), 0.0)
        out = np.zeros((H, S))
        out[rows, order] = red_sorted
        return np.where(cand, out, 0.0)

    def select(self, layout, scores, n_tokens, step):
        pos, live, sc = self._prep(layout, scores)
        prot = self._protected(pos, live, layout.prompt_len)
        cand = live & ~prot
        budget = int(self.cfg.budget)
        w = min(int(self.cfg.observation_window), budget)
        rec = recent_mask(pos, cand, w)
        rest = cand & ~rec
        s = np.where(rest, sc.astype(np.float64), np.nan)
        with np.errstate(invalid="ignore", all="ignore"):
            lo = np.nanmin(np.where(rest, s, np.inf), axis=1, keepdims=True)
            hi = np.nanmax(np.where(rest, s, -np.inf), axis=1, keepdims=True)
            imp = np.where(rest, (s - lo) / np.where(hi > lo, hi - lo, 1.0), 0.0)
        red = self.redundancy(pos, rest, sc)
        lam = float(self.cfg.rkv_lambda)
        combined = lam * imp - (1.0 - lam) * red
        return prot | rec | topk_mask(combined, rest, budget - w)

    def scoring_bytes(self, shape, n_tokens, prompt_len, n_blocks):
        w = self.cfg.observation_window
        attn = 2.0 * w * shape.num_q_heads * n_tokens * shape.score_bytes * shape.num_layers
        keys = max(n_tokens - (prompt_len if self.protects_prompt else 0), 0) * shape.kv_bytes_per_token / 2.0
        return attn + keys
