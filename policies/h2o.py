"""``h2o``: heavy hitters plus a recent window in a total budget (H2O), with its options."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ScoredConfig, register_options, register_policy
from .eviction import TotalBudgetEviction
from .selection import RULE_H2O, recent_mask, topk_mask


@register_options
@dataclass
class H2OConfig(ScoredConfig):
    """``h2o``: heavy hitters + recent window in a total budget.

    Fields: budget (total tokens), beta (round period, tokens), recent_window (0 = budget x
    (1 - heavy_ratio)), heavy_ratio (share of budget for heavy hitters), protect_prompt.
    """

    name: str = "h2o"
    budget: int = 2048
    beta: int = 128
    recent_window: int = 0
    heavy_ratio: float = 0.5
    protect_prompt: bool = True

    def check(self) -> None:
        super().check()
        self._beta_positive()
        self._budget_at_least_one()
        self._nonneg("recent_window")
        if self.recent_window > self.budget:
            raise ValueError(f"policy h2o: recent_window {self.recent_window} exceeds budget "
                             f"{self.budget}")
        self._fraction("heavy_ratio")



@register_policy(H2OConfig)
class H2OPolicy(TotalBudgetEviction):
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
