"""``tova``: drop the lowest current score in a total budget (TOVA), with its options."""

from __future__ import annotations

from dataclasses import dataclass

from .config import ScoredConfig, register_options, register_policy
from .eviction import TotalBudgetEviction
from .selection import RULE_TOP, topk_mask


@register_options
@dataclass
class TOVAConfig(ScoredConfig):
    """``tova``: drop the lowest current score in a total budget.

    Fields: budget (total tokens), beta (round period, tokens), protect_prompt.
    """

    name: str = "tova"
    budget: int = 2048
    beta: int = 128
    protect_prompt: bool = True

    def check(self) -> None:
        super().check()
        self._beta_positive()
        self._budget_at_least_one()



@register_policy(TOVAConfig)
class TOVAPolicy(TotalBudgetEviction):
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

    def select(self, layout, scores, n_tokens, step):
        pos, live, sc = self._prep(layout, scores)
        prot = self._protected(pos, live, layout.prompt_len)
        cand = live & ~prot
        return prot | topk_mask(sc, cand, int(self.cfg.budget) - prot.sum(axis=1))

    def scoring_bytes(self, shape, n_tokens, prompt_len, n_blocks):
        return 2.0 * shape.num_q_heads * n_tokens * shape.score_bytes * shape.num_layers

    def scoring_bytes_per_token(self, shape):
        return 2.0 * shape.num_q_heads * shape.score_bytes * shape.num_layers
