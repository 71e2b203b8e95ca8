"""The eviction policies' base (:class:`EvictionPolicy`, :class:`PeriodicEviction`) and the values
they share (:class:`ModelShape`, :class:`RequestState`): when a round fires, and which slots
each group keeps. Each policy family is a module of its own (CONTRIBUTING.md, "Adding a
policy"); the selection helpers are in :mod:`policies.selection`.

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

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .config import MODES, PolicyOptions
from .selection import _NO_LOGS, RULE_H2O, _rank_band, _score_topk_round


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


class PeriodicEviction(EvictionPolicy):
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


class TotalBudgetEviction(PeriodicEviction):
    """:class:`PeriodicEviction` whose ``budget`` counts every token of the sequence, prompt
    included (H2O, TOVA): a protected prompt must fit in it."""

    @property
    def budget_scope(self) -> str:
        return "total"

    def check_request(self, prompt_len):
        """:meth:`EvictionPolicy.check_request`; also ValueError when the prompt is protected
        and longer than ``budget`` (it could never be kept within it)."""
        super().check_request(prompt_len)
        if self.protects_prompt and prompt_len > self.cfg.budget:
            raise ValueError(f"{self.name}: budget {self.cfg.budget} (total tokens) is below the "
                             f"protected prompt of {prompt_len} tokens")
