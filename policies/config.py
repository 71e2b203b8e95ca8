"""Plain dataclass configs for eviction policies, compactors and the importance model.

Only ``dataclasses`` are used here (no Hydra / OmegaConf import) so the lead can register
:class:`PolicyConfig` and :class:`CompactionConfig` as Hydra structured configs, and so
``policies`` stays importable with numpy alone.

Units are in the field names or docstrings: token counts are tokens, ``*_bytes`` are bytes.
Validation (:func:`validate_policy_config`, :func:`validate_compaction_config`) raises
``ValueError`` with a message naming the field and the valid values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

#: Grouping modes (how many independent keep-selections one request's KV has).
#:  - ``union``: one selection shared by every layer and KV head (groups = 1).
#:  - ``per_head``: one selection per KV head, shared by all layers (groups = kv_heads).
#:  - ``per_layer``: one selection per layer, shared by its KV heads (groups = layers).
#:  - ``per_layer_per_head``: one selection per (layer, KV head) (groups = layers x kv_heads;
#:    group index = layer * kv_heads + head).
MODES = ("union", "per_head", "per_layer", "per_layer_per_head")

IMPORTANCE_SOURCES = ("generative", "recorded")

COMPACTORS = ("none", "forward_pack", "hole_fill")


@dataclass
class ImportanceParams:
    """Parameters of the generative token-importance model (:class:`policies.importance.ImportanceModel`).

    A trace has no attention scores, so every score-based policy ranks tokens by this seeded model.
    See ``policies/README.md`` ("Importance model") for the formula and for which results depend on
    which parameter.

    Fields:
      sigma: log-scale of the lognormal heavy tail (score = exp(sigma * z), z ~ N(0,1) per token).
        Rank-only policies (TriAttention, SnapKV, TOVA top-k) are invariant to it; it matters where
        scores are added/multiplied (H2O accumulation, R-KV mix, Ada-KV cross-head allocation,
        retained attention mass).
      sigma_spread: per-group log-normal spread of ``sigma`` (0 = every head equally peaked).
        Drives Ada-KV's per-head budget differences.
      sink_tokens: the first ``sink_tokens`` positions are attention sinks.
      sink_boost: multiplicative boost of sink tokens (>= 1).
      recency_window: e-folding length (tokens) of the recency boost.
      recency_boost: recency multiplier amplitude: score *= 1 + recency_boost * exp(-age / recency_window),
        age = seq_len - 1 - position.
      correlation_length: locality, tokens. Important tokens come in runs of about this length (the
        latent field is Gaussian value noise on a lattice of this spacing). 1 = independent tokens.
        Strongly affects blocks freed WITHOUT compaction (longer runs -> survivors concentrated in
        fewer blocks -> more empty blocks).
      head_correlation: rho in [0, 1], correlation of the latent field between groups (heads/layers).
        1 = all groups identical (per-head eviction behaves like union), 0 = independent. Strongly
        affects blocks freed by per-head eviction without compaction and the ragged waste.
      drift: in [0, 1], share of the latent variance that changes during decoding (0 = static scores).
      drift_period: decode steps over which the drifting part decorrelates (0 disables drift).
    """

    sigma: float = 1.5
    sigma_spread: float = 0.3
    sink_tokens: int = 4
    sink_boost: float = 1000.0
    recency_window: float = 64.0
    recency_boost: float = 10.0
    correlation_length: float = 16.0
    head_correlation: float = 0.5
    drift: float = 0.3
    drift_period: int = 512


@dataclass
class PolicyConfig:
    """One eviction policy and its parameters (field values for ``experiments/conf/policy/<name>.yaml``).

    Which fields a policy reads is listed in ``policies/README.md`` and in each policy's docstring.

    Fields:
      name: registry name (``policies.registry.POLICIES``).
      budget: tokens kept. Meaning depends on the policy (``budget_scope``): decode tokens kept on top
        of the protected prompt (triattention, r_kv, random with protect_prompt), total tokens kept
        (h2o, tova, random without protect_prompt), prompt tokens kept per group (snapkv, ada_kv; the
        per-layer average for pyramidkv), tokens read per step (quest: top_k_pages = ceil(budget/B)).
      beta: round period in tokens (compaction period; TriAttention default 128). 1 = every step.
      sink_tokens / recent_window: StreamingLLM sinks and recent window; recent_window is also the
        always-kept recent tail of h2o and triattention when set (r_kv's recent tail is its
        ``observation_window``; r_kv rejects a recent_window).
      heavy_ratio: H2O share of ``budget`` for heavy hitters (the rest is the recent window).
      mode: grouping mode, one of :data:`MODES`; "" = the policy's default (snapkv per_head,
        pyramidkv/ada_kv per_layer_per_head, others union).
      protect_prompt: keep every prompt token (and never move it under forward packing).
      observation_window: SnapKV/PyramidKV/Ada-KV/R-KV observation window (last tokens, always kept).
      pooling_kernel: SnapKV 1-D pooling kernel (tokens, odd); pooling: ``max`` or ``avg``.
      layer_budget_ratio: PyramidKV beta: top layer keeps budget / layer_budget_ratio.
      ada_floor: Ada-KV safeguard: each head keeps at least ada_floor x its uniform share.
      rkv_lambda: R-KV weight of importance vs redundancy (score = l*imp - (1-l)*red).
      redundancy_window: R-KV proxy: number of following tokens a token is compared with.
      top_k_pages: Quest pages read per step (0 = ceil(budget / block_size)).
      dense_layers: Quest layers that read every page (the paper leaves the first two layers dense).
      seed: seed of the random policy.
      importance_source: ``generative`` (ImportanceModel) or ``recorded`` (Parquet file).
      importance_file: Parquet path when importance_source = recorded.
      importance: generative importance model parameters.
    """

    name: str = "full"
    budget: int = 2048
    beta: int = 128
    sink_tokens: int = 4
    recent_window: int = 0
    heavy_ratio: float = 0.5
    mode: str = ""
    protect_prompt: bool = True
    observation_window: int = 32
    pooling_kernel: int = 7
    pooling: str = "max"
    layer_budget_ratio: float = 20.0
    ada_floor: float = 0.2
    rkv_lambda: float = 0.1
    redundancy_window: int = 8
    top_k_pages: int = 0
    dense_layers: int = 2
    seed: int = 0
    importance_source: str = "generative"
    importance_file: str = ""
    importance: ImportanceParams = field(default_factory=ImportanceParams)


@dataclass
class CompactionConfig:
    """A compactor (``experiments/conf/compaction/<name>.yaml``).

    Fields:
      name: ``none`` | ``forward_pack`` | ``hole_fill``.
      position_index_bytes: hole_fill: bytes of the position index stored per slot (per group if
        ``position_index_per_group``), default 4 (int32).
      position_index_per_group: hole_fill: one index per slot per group (True) or one per slot
        shared by all groups (False; valid because hole filling writes a new token into the same
        slot of every group).
      pin_prompt: forward_pack never moves the first ``prompt_len`` slots (when the policy protects
        the prompt; the engine passes ``pinned_len``).
      release_empty_blocks: return wholly empty blocks to the pool at a round. True for every style
        by default (a block with no live slot is freeable). With hole_fill, False keeps them in the
        request's block table for reuse by its next tokens (pure slot reuse: 0 blocks freed, and
        the next appends need no new block until every vacated slot is used). Both give the same
        net block count after the reuse; they differ in who may use the blocks in between.
    """

    name: str = "none"
    position_index_bytes: int = 4
    position_index_per_group: bool = True
    pin_prompt: bool = True
    release_empty_blocks: bool = True


# Largest position index a slot may carry (bytes): far above any real one (int32/int64), and low
# enough that the metadata bytes of a pool stay exact in int64 and float64 arithmetic.
MAX_POSITION_INDEX_BYTES = 1024


def _check_choice(what: str, value: str, valid) -> None:
    if value not in valid:
        raise ValueError(f"unknown {what} {value!r}; valid: {', '.join(valid)}")


def check_finite(obj, prefix: str) -> None:
    """Raise ``ValueError`` naming the first float field of the dataclass ``obj`` that is NaN or
    infinite (``prefix``: how the message names the object, e.g. ``policy triattention:
    importance.``). The range checks that follow compare with ``<``, which a NaN passes."""
    for f in fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{prefix}{f.name} must be a finite number, got {v}")


def validate_importance_params(p: ImportanceParams) -> None:
    """Raise ``ValueError`` naming the bad field of an :class:`ImportanceParams` (NaN and
    infinite values included)."""
    check_finite(p, "importance.")
    if p.sigma < 0:
        raise ValueError(f"importance.sigma must be >= 0, got {p.sigma}")
    if p.sigma_spread < 0:
        raise ValueError(f"importance.sigma_spread must be >= 0, got {p.sigma_spread}")
    if p.sink_tokens < 0:
        raise ValueError(f"importance.sink_tokens must be >= 0, got {p.sink_tokens}")
    if p.sink_boost < 1:
        raise ValueError(f"importance.sink_boost must be >= 1, got {p.sink_boost}")
    if p.recency_window <= 0:
        raise ValueError(f"importance.recency_window must be > 0 tokens, got {p.recency_window}")
    if p.recency_boost < 0:
        raise ValueError(f"importance.recency_boost must be >= 0, got {p.recency_boost}")
    if p.correlation_length < 1:
        raise ValueError(f"importance.correlation_length must be >= 1 token, got {p.correlation_length}")
    if not 0.0 <= p.head_correlation <= 1.0:
        raise ValueError(f"importance.head_correlation must be in [0, 1], got {p.head_correlation}")
    if not 0.0 <= p.drift <= 1.0:
        raise ValueError(f"importance.drift must be in [0, 1], got {p.drift}")
    if p.drift_period < 0:
        raise ValueError(f"importance.drift_period must be >= 0 steps, got {p.drift_period}")


def validate_compaction_config(cfg: CompactionConfig) -> None:
    """Raise ``ValueError`` for an unknown compactor name or an index size outside
    ``[0, MAX_POSITION_INDEX_BYTES]``."""
    _check_choice("compaction", cfg.name, COMPACTORS)
    if not 0 <= cfg.position_index_bytes <= MAX_POSITION_INDEX_BYTES:
        raise ValueError(f"compaction.position_index_bytes must be in [0, {MAX_POSITION_INDEX_BYTES}] "
                         f"(bytes per slot of an index: 4 = int32), got {cfg.position_index_bytes}")
