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

from sim.jit import kernel

from .config import MODES, PolicyConfig


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

    Args: cfg: :class:`policies.config.PolicyConfig` (validated by :func:`policies.registry.make_policy`).
    """

    name = "base"
    citation = ""
    needs_attention_scores = False
    scoring_when = "never"  # "step": every decode step; "round": at each round; "never"
    frees_memory = True
    default_mode = "union"
    allowed_modes = MODES

    def __init__(self, cfg: PolicyConfig):
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

    def pinned_len(self, layout) -> int:
        """Leading slots a compactor must not move: ``layout.prompt_len`` if the prompt is protected."""
        return layout.prompt_len if self.protects_prompt else 0

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
class FullPolicy(EvictionPolicy):
    """``full``: no eviction (dense baseline). Keeps every token; never fires."""

    name = "full"
    citation = "dense attention baseline"
    frees_memory = False
    uses_scores = False


class RandomPolicy(_Periodic):
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

    def select(self, layout, scores, n_tokens, step):
        pos, live, _ = self._prep(layout, None)
        return live & ((pos < self.cfg.sink_tokens) | (pos >= n_tokens - self.cfg.recent_window))


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


class TriAttentionPolicy(_Periodic):
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
    citation = "Mao et al., TriAttention, ICML 2026; TensorRT-LLM KV cache compression framework"
    scoring_when = "round"
    allowed_modes = ("union", "per_head", "per_layer_per_head")

    @property
    def budget_scope(self) -> str:
        return "decode" if self.protects_prompt else "total"

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


class RKVPolicy(_Periodic):
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

    def scoring_bytes(self, shape, n_tokens, prompt_len, n_blocks):
        w = min(self.cfg.observation_window, prompt_len)
        attn = 2.0 * w * shape.num_q_heads * prompt_len * shape.score_bytes * shape.num_layers
        return attn + prompt_len * shape.kv_bytes_per_token / 2.0


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
        H, S = pos.shape
        w, window, decode, cand, pooled = self._window_and_pool(layout, sc, pos, live)
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
        return window | decode | keep


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
