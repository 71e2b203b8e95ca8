"""``quest``: query-aware page selection (keeps all KV, reads the top pages per step), with
its options."""

from __future__ import annotations

from dataclasses import dataclass

from .config import PolicyOptions, register_options, register_policy
from .eviction import EvictionPolicy


@register_options
@dataclass
class QuestConfig(PolicyOptions):
    """``quest``: keeps all KV, reads only the top-k pages per decode step.

    Fields: budget (tokens read per step: top_k_pages = ceil(budget / block_size) when
    top_k_pages is 0), top_k_pages, dense_layers (leading layers that read every page), mode.
    """

    name: str = "quest"
    budget: int = 2048
    top_k_pages: int = 0
    dense_layers: int = 2
    mode: str = ""

    def check(self) -> None:
        super().check()
        self._budget_at_least_one()
        self._nonneg("top_k_pages", "dense_layers")


@register_policy(QuestConfig)
class QuestPolicy(EvictionPolicy):
    """``quest``: query-aware page selection; keeps ALL KV, reads only the top-k pages per step.

    Rule: every decode step, each page's upper-bound score (from per-page min/max keys) ranks the
    pages and attention reads the top ``top_k_pages`` (default ceil(budget / block_size); paper token
    budgets 1K-4K, page size 16) in every layer except the first ``dense_layers`` (paper: 2), which
    read everything. Nothing is evicted, no block is freed: it saves bandwidth, not memory.
    Source: Tang et al., "Quest: Query-Aware Sparsity for Efficient Long-Context LLM Inference",
    ICML 2024.
    """

    name = "quest"
    citation = "Tang et al., Quest, ICML 2024"
    frees_memory = False
    uses_scores = False
    scoring_when = "step"

    @property
    def budget_scope(self) -> str:
        return "read"

    def num_groups(self, num_kv_heads: int, num_layers: int) -> int:
        """As :meth:`EvictionPolicy.num_groups`; ValueError if ``dense_layers`` exceeds the
        model's layers."""
        if self.cfg.dense_layers > num_layers:
            raise ValueError(f"quest: dense_layers={self.cfg.dense_layers} exceeds the model's "
                             f"{num_layers} layers; expected 0..{num_layers}")
        return super().num_groups(num_kv_heads, num_layers)

    def top_k(self, block_size: int) -> int:
        """Pages read per step in sparse layers."""
        if self.cfg.top_k_pages > 0:
            return int(self.cfg.top_k_pages)
        return max(1, -(-int(self.cfg.budget) // int(block_size)))

    def pages_read(self, n_blocks: int, block_size: int = 16) -> int:
        """Pages a sparse layer reads this step: min(n_blocks, top_k)."""
        return min(int(n_blocks), self.top_k(block_size))

    def reads_fraction(self, n_blocks, num_layers, block_size: int = 16):
        """Pages read / pages held: the ``dense_layers`` read all ``n_blocks``, the others
        :meth:`pages_read` (``block_size``: the pool's block size, tokens)."""
        if n_blocks <= 0:
            return 1.0
        dense = min(int(self.cfg.dense_layers), num_layers)
        read = dense * n_blocks + (num_layers - dense) * self.pages_read(n_blocks, block_size)
        return read / float(num_layers * n_blocks)

    def scoring_bytes(self, shape, n_tokens, prompt_len, n_blocks):
        # per-page min and max key per KV head per layer = 2 x (K bytes of one token) = kv bytes/token
        return float(n_blocks) * shape.kv_bytes_per_token
