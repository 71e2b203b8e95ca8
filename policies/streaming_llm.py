"""``streaming_llm``: attention sinks plus a recent window (StreamingLLM), with its options."""

from __future__ import annotations

from dataclasses import dataclass

from .config import PolicyOptions, register_options, register_policy
from .eviction import PeriodicEviction


@register_options
@dataclass
class StreamingLLMConfig(PolicyOptions):
    """``streaming_llm``: attention sinks + recent window.

    Fields: sink_tokens, recent_window (tokens kept at the start and at the end), beta (round
    period, tokens), mode.
    """

    name: str = "streaming_llm"
    sink_tokens: int = 4
    recent_window: int = 0
    beta: int = 128
    mode: str = ""

    def check(self) -> None:
        super().check()
        self._beta_positive()
        self._nonneg("sink_tokens", "recent_window")
        if self.sink_tokens + self.recent_window < 1:
            raise ValueError("policy streaming_llm: sink_tokens + recent_window must be >= 1")



@register_policy(StreamingLLMConfig)
class StreamingLLMPolicy(PeriodicEviction):
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
