"""``triattention``: the top-scoring decode tokens every ``beta`` tokens once over budget
(TriAttention as TensorRT-LLM integrates it), with its options."""

from __future__ import annotations

from dataclasses import dataclass

from .config import ScoredConfig, register_options, register_policy
from .eviction import PeriodicEviction
from .selection import RULE_RECENT, recent_mask, topk_mask


@register_options
@dataclass
class TriAttentionConfig(ScoredConfig):
    """``triattention``: top-scoring decode tokens every beta tokens once over budget.

    Fields: budget (decode tokens kept with protect_prompt, else total tokens), beta (round
    period, tokens), recent_window (always-kept recent tokens, inside the budget; 0 = none),
    protect_prompt.
    """

    name: str = "triattention"
    budget: int = 2048
    beta: int = 128
    recent_window: int = 0
    protect_prompt: bool = True

    def check(self) -> None:
        super().check()
        self._beta_positive()
        self._budget_at_least_one()
        self._nonneg("recent_window")
        if self.recent_window > self.budget:
            raise ValueError(f"policy triattention: recent_window {self.recent_window} exceeds "
                             f"budget {self.budget}")


@register_policy(TriAttentionConfig)
class TriAttentionPolicy(PeriodicEviction):
    """``triattention``: TriAttention as integrated in TensorRT-LLM's KV compression framework.

    Rule: the prompt is protected (never evicted, never moved); ``budget`` decode tokens are kept
    (TensorRT-LLM default 2048). A round fires every ``beta`` generated tokens (default 128) once the
    sequence exceeds prompt + budget: at generated counts that are multiples of beta and > budget
    (budget 2048, beta 128: first at 2176, then 2304, ...). Each round keeps the ``budget``
    top-scoring decode tokens (scores: pre-RoPE query statistics x cached keys in the real method;
    here the importance model) and compacts (forward packing in TensorRT-LLM). Modes ``union`` (one
    decision broadcast to every KV head), ``per_head``, ``per_layer_per_head``. Does not need
    attention scores: reads the candidate keys once per round.
    Source: Mao et al., "TriAttention: Efficient Long Reasoning with Trigonometric KV Compression",
    ICML 2026; TensorRT-LLM ``TriAttentionKvCacheCompressionConfig`` (budget=2048, beta=128,
    eviction_mode).
    """

    name = "triattention"
    scores_candidates_only = True
    score_rule = RULE_RECENT
    citation = "Mao et al., TriAttention, ICML 2026; TensorRT-LLM KV cache compression framework"
    scoring_when = "round"
    allowed_modes = ("union", "per_head", "per_layer_per_head")

    @property
    def budget_scope(self) -> str:
        return "decode" if self.protects_prompt else "total"

    def _recent_param(self) -> int:
        return int(self.cfg.recent_window)

    def select(self, layout, scores, n_tokens, step):
        pos, live, sc = self._prep(layout, scores)
        prot = self._protected(pos, live, layout.prompt_len)
        # = live & ~prot: a live slot is protected exactly when it holds a prompt position
        cand = pos >= layout.prompt_len if self.protects_prompt else live
        budget = int(self.cfg.budget)
        keep = prot
        if self.cfg.recent_window > 0:
            rec = recent_mask(pos, cand, min(self.cfg.recent_window, budget))
            keep = keep | rec
            cand = cand & ~rec
            budget -= min(self.cfg.recent_window, budget)
        return keep | topk_mask(sc, cand, budget)

    def scoring_bytes(self, shape, n_tokens, prompt_len, n_blocks):
        cand = n_tokens - (prompt_len if self.protects_prompt else 0)
        return max(cand, 0) * shape.kv_bytes_per_token / 2.0  # reads K of every candidate
