"""The baselines: ``full`` (no eviction, the dense baseline) and ``random`` (seeded
uniform-random survivors, the control for score-based policies), with their options."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import PolicyOptions, register_options, register_policy
from .eviction import EvictionPolicy, PeriodicEviction
from .selection import topk_mask


@register_options
@dataclass
class FullConfig(PolicyOptions):
    """``full``: no eviction; reads no option."""

    name: str = "full"


@register_policy(FullConfig)
class FullPolicy(EvictionPolicy):
    """``full``: no eviction (dense baseline). Keeps every token; never fires."""

    name = "full"
    citation = "dense attention baseline"
    frees_memory = False
    uses_scores = False


@register_options
@dataclass
class RandomConfig(PolicyOptions):
    """``random``: seeded uniform-random survivors.

    Fields: budget (decode tokens kept with protect_prompt, else total tokens), beta (round
    period, tokens), mode, protect_prompt, seed (plus the run's seed).
    """

    name: str = "random"
    budget: int = 2048
    beta: int = 128
    mode: str = ""
    protect_prompt: bool = True
    seed: int = 0

    def check(self) -> None:
        super().check()
        self._beta_positive()
        self._budget_at_least_one()
        self._seed_in_range()


@register_policy(RandomConfig)
class RandomPolicy(PeriodicEviction):
    """``random``: seeded uniform-random survivors (control for score-based methods).

    Rule: same cadence as TriAttention (rounds every ``beta`` tokens once over ``budget``); keeps
    the protected prompt plus ``budget`` uniformly random tokens (decode tokens if
    ``protect_prompt``, else any tokens). ``mode`` union draws one set for all groups; per-head
    modes draw independently per group. Deterministic in (cfg.seed, request_key, step).
    Source: random-eviction baselines in the KV compression literature (e.g. "Random Attention",
    2026: prompt kept, uniform eviction per head).
    """

    name = "random"
    citation = "uniform random eviction baseline (prompt kept, per head or shared)"
    uses_scores = False

    @property
    def budget_scope(self) -> str:
        return "decode" if self.protects_prompt else "total"

    def select(self, layout, scores, n_tokens, step):
        pos, live, _ = self._prep(layout, None)
        H, S = pos.shape
        prot = self._protected(pos, live, layout.prompt_len)
        cand = live & ~prot
        rng = np.random.default_rng([int(self.cfg.seed), int(layout.request_key) & 0x7FFFFFFF, int(step)])
        pri = rng.random((1 if self.mode == "union" else H, S))
        return prot | topk_mask(np.broadcast_to(pri, (H, S)), cand, int(self.cfg.budget))
