"""Policy registry: names -> classes, config validation, construction.

``make_policy(cfg)`` validates a :class:`policies.config.PolicyConfig` and returns the policy;
``make_compactor(cfg)`` does the same for :class:`policies.config.CompactionConfig`. Unknown names
raise ``ValueError`` listing the valid ones.
"""

from __future__ import annotations

from .config import (CompactionConfig, MODES, PolicyConfig, check_finite, validate_compaction_config,
                     validate_importance_params)
from .eviction import (AdaKVPolicy, EvictionPolicy, FullPolicy, H2OPolicy, PyramidKVPolicy, QuestPolicy,
                       RandomPolicy, RKVPolicy, SnapKVPolicy, StreamingLLMPolicy, TOVAPolicy, TriAttentionPolicy)

#: name -> policy class
POLICIES: dict[str, type[EvictionPolicy]] = {
    cls.name: cls for cls in (FullPolicy, RandomPolicy, StreamingLLMPolicy, H2OPolicy, TOVAPolicy, SnapKVPolicy,
                              PyramidKVPolicy, AdaKVPolicy, RKVPolicy, TriAttentionPolicy, QuestPolicy)
}


def validate_policy_config(cfg: PolicyConfig, prompt_len: int | None = None) -> None:
    """Raise ``ValueError`` with a clear message for a bad :class:`PolicyConfig`.

    Checks: known name (lists valid names), mode valid for the policy, budget >= 1 (>= 0 for full),
    beta >= 1, windows/sinks >= 0, window-within-budget rules, pooling kind, ratios in range,
    importance source and parameters. With ``prompt_len`` also checks the per-request rule (e.g. a
    total budget below a protected prompt).
    """
    if cfg.name not in POLICIES:
        raise ValueError(f"unknown policy {cfg.name!r}; valid: {', '.join(sorted(POLICIES))}")
    check_finite(cfg, f"policy {cfg.name}: ")
    cls = POLICIES[cfg.name]
    mode = cfg.mode or cls.default_mode
    if mode not in MODES:
        raise ValueError(f"policy {cfg.name}: unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if mode not in cls.allowed_modes:
        raise ValueError(f"policy {cfg.name}: mode {mode!r} not supported; valid for {cfg.name}: "
                         f"{', '.join(cls.allowed_modes)}")
    if cfg.beta <= 0:
        raise ValueError(f"policy {cfg.name}: beta (round period, tokens) must be > 0, got {cfg.beta}")
    if cfg.name not in ("full", "streaming_llm") and cfg.budget < 1:
        raise ValueError(f"policy {cfg.name}: budget must be >= 1 token, got {cfg.budget}")
    for f in ("sink_tokens", "recent_window", "observation_window", "top_k_pages", "dense_layers",
              "redundancy_window"):
        if getattr(cfg, f) < 0:
            raise ValueError(f"policy {cfg.name}: {f} must be >= 0, got {getattr(cfg, f)}")
    if cfg.name == "streaming_llm" and cfg.sink_tokens + cfg.recent_window < 1:
        raise ValueError("policy streaming_llm: sink_tokens + recent_window must be >= 1")
    if cfg.name in ("snapkv", "pyramidkv", "ada_kv", "r_kv") and cfg.observation_window > cfg.budget:
        raise ValueError(f"policy {cfg.name}: observation_window {cfg.observation_window} exceeds budget "
                         f"{cfg.budget}")
    if cfg.name == "r_kv" and cfg.recent_window:
        raise ValueError(f"policy r_kv: recent_window={cfg.recent_window} is not read by r_kv, "
                         f"whose always-kept recent tokens are its observation_window "
                         f"({cfg.observation_window}); expected recent_window=0 (set "
                         f"policy.observation_window instead)")
    try:
        seed_ok = not isinstance(cfg.seed, bool) and int(cfg.seed) == cfg.seed and 0 <= cfg.seed < 2 ** 32
    except (TypeError, ValueError):
        seed_ok = False
    if not seed_ok:
        raise ValueError(f"policy {cfg.name}: seed must be an integer in [0, 2**32) (the random "
                         f"policy's and the importance model's seed), got {cfg.seed}")
    if cfg.name in ("h2o", "triattention") and cfg.recent_window > cfg.budget:
        raise ValueError(f"policy {cfg.name}: recent_window {cfg.recent_window} exceeds budget {cfg.budget}")
    if cfg.pooling not in ("max", "avg"):
        raise ValueError(f"policy {cfg.name}: unknown pooling {cfg.pooling!r}; valid: max, avg")
    if cfg.pooling_kernel < 1 or cfg.pooling_kernel % 2 == 0:
        raise ValueError(f"policy {cfg.name}: pooling_kernel must be an odd number >= 1 (a window "
                         f"centred on each token), got {cfg.pooling_kernel}")
    if not 0.0 <= cfg.heavy_ratio <= 1.0:
        raise ValueError(f"policy {cfg.name}: heavy_ratio must be in [0, 1], got {cfg.heavy_ratio}")
    if not 0.0 <= cfg.rkv_lambda <= 1.0:
        raise ValueError(f"policy {cfg.name}: rkv_lambda must be in [0, 1], got {cfg.rkv_lambda}")
    if not 0.0 <= cfg.ada_floor <= 1.0:
        raise ValueError(f"policy {cfg.name}: ada_floor must be in [0, 1], got {cfg.ada_floor}")
    if cfg.layer_budget_ratio < 1.0:
        raise ValueError(f"policy {cfg.name}: layer_budget_ratio must be >= 1, got {cfg.layer_budget_ratio}")
    if cfg.importance_source not in ("generative", "recorded"):
        raise ValueError(f"policy {cfg.name}: unknown importance_source {cfg.importance_source!r}; "
                         f"valid: generative, recorded")
    if cfg.importance_source == "recorded" and not cfg.importance_file:
        raise ValueError(f"policy {cfg.name}: importance_source=recorded needs importance_file")
    validate_importance_params(cfg.importance)
    if prompt_len is not None:
        cls(cfg).check_request(prompt_len)


def make_policy(cfg: PolicyConfig) -> EvictionPolicy:
    """Validate ``cfg`` and build its policy. Raises ValueError (see :func:`validate_policy_config`)."""
    validate_policy_config(cfg)
    return POLICIES[cfg.name](cfg)


def make_compactor(cfg: CompactionConfig):
    """Validate ``cfg`` and build its compactor (:mod:`policies.compaction`). Raises ValueError."""
    from .compaction import COMPACTOR_CLASSES

    validate_compaction_config(cfg)
    return COMPACTOR_CLASSES[cfg.name](cfg)
