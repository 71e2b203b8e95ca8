"""Policy registry: every policy class, with validation and construction.

Importing this module imports every module of the package (:func:`policies.config.discover`),
so each policy class registered with :func:`policies.config.register_policy` is in
:data:`POLICIES`. The options classes live beside their policies, one module per family; the
``policy`` group's schema and :func:`policy_config` live in :mod:`policies.config` (no policy
module imports numba before a kernel is called, so composing a config never does);
:func:`validate_policy_config` checks a policy's options and :func:`make_policy` builds the
policy. Errors are ``ValueError`` naming the policy and the field (an unknown name lists the
valid ones; an option the policy does not read lists the ones it does and the policies that
read it).
"""

from __future__ import annotations

from .config import (MODES, POLICIES, POLICY_CONFIGS, CompactionConfig, PolicyOptions, not_read_error,
                     option_names, policy_config, readers_of, register_options, register_policy,
                     unread_options, validate_compaction_config)

__all__ = ["POLICIES", "POLICY_CONFIGS", "not_read_error", "option_names", "policy_config", "readers_of",
           "register_options", "register_policy", "unread_options", "validate_policy_config", "make_policy",
           "make_compactor"]


def validate_policy_config(cfg, prompt_len: int | None = None) -> PolicyOptions:
    """Check a policy's options (anything :func:`policy_config` takes) and return them as the
    policy's options class. Raises ValueError naming the policy and the field: unknown name, an
    option the policy does not read, a mode the policy does not support, and the options
    class's own ranges (``check``); with ``prompt_len``, also the per-request rule (e.g. a total
    budget below a protected prompt)."""
    cfg = policy_config(cfg)
    cls = POLICIES[cfg.name]
    cfg.check()
    mode = cfg.mode or cls.default_mode
    if mode not in MODES:
        raise ValueError(f"policy {cfg.name}: unknown mode {mode!r}; valid: {', '.join(MODES)}")
    if mode not in cls.allowed_modes:
        raise ValueError(f"policy {cfg.name}: mode {mode!r} not supported; valid for {cfg.name}: "
                         f"{', '.join(cls.allowed_modes)}")
    if prompt_len is not None:
        cls(cfg).check_request(prompt_len)
    return cfg


def make_policy(cfg):
    """Validate ``cfg`` (anything :func:`policy_config` takes) and build its policy. Raises
    ValueError (see :func:`validate_policy_config`)."""
    cfg = validate_policy_config(cfg)
    return POLICIES[cfg.name](cfg)


def make_compactor(cfg: CompactionConfig):
    """Validate ``cfg`` and build its compactor (:mod:`policies.compaction`). Raises ValueError."""
    from .compaction import COMPACTOR_CLASSES

    validate_compaction_config(cfg)
    return COMPACTOR_CLASSES[cfg.name](cfg)
