"""Policy registry: each policy class registered with its config class under its name.

A policy family's module declares its config (a :class:`policies.config.PolicyConfig`
subclass whose fields are the options the policy reads) and registers its class with
:func:`register_policy`; ``import policies`` imports every module of the package, so a new
module registers itself. :func:`policy_config` builds a policy's config by name or from a
mapping / OmegaConf node, :func:`validate_policy_config` checks it and :func:`make_policy`
builds the policy. Errors are ``ValueError`` naming the policy and the field (an unknown name
lists the valid ones; an option the policy does not read lists the ones it does).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from .config import (MODES, CompactionConfig, ImportanceParams, PolicyConfig,
                     validate_compaction_config)

#: name -> policy class (:class:`policies.eviction.EvictionPolicy` subclasses)
POLICIES: dict[str, type] = {}
#: name -> config class of that policy
POLICY_CONFIGS: dict[str, type[PolicyConfig]] = {}


def register_policy(config: type[PolicyConfig]):
    """Class decorator: register the policy class under its ``name`` with ``config``, the
    dataclass of the options it reads (a :class:`PolicyConfig` subclass whose ``name`` field
    defaults to the policy's name); sets the class's ``config_class``. Raises ValueError for a
    second class under the same name or a config named otherwise."""
    if not (isinstance(config, type) and issubclass(config, PolicyConfig)
            and dataclasses.is_dataclass(config)):
        raise ValueError(f"register_policy: {config!r} is not a PolicyConfig dataclass")

    def register(cls):
        name = cls.name
        default = config.__dataclass_fields__["name"].default
        if default != name:
            raise ValueError(f"register_policy: {config.__name__}.name defaults to {default!r}; "
                             f"expected the policy's name {name!r}")
        if POLICIES.get(name, cls) is not cls:
            raise ValueError(f"register_policy: policy {name!r} is already registered "
                             f"({POLICIES[name].__module__}.{POLICIES[name].__name__})")
        POLICIES[name] = cls
        POLICY_CONFIGS[name] = config
        cls.config_class = config
        return cls

    return register


def option_names(config: type[PolicyConfig]) -> list[str]:
    """The options of a policy config class (its fields but ``name``), in declaration order."""
    return [f.name for f in dataclasses.fields(config) if f.name != "name"]


def readers_of(option: str) -> list[str]:
    """The registered policies whose config has ``option``, sorted."""
    return sorted(n for n, c in POLICY_CONFIGS.items() if option in option_names(c))


def not_read_error(name: str, option: str) -> str:
    """The message for the option ``option`` set on the policy ``name``, which does not read it:
    the policy's options, the policies that read it and the config class's hint, if any."""
    config = POLICY_CONFIGS[name]
    own = option_names(config)
    readers = readers_of(option)
    hint = config.option_hints.get(option)
    return (f"policy {name} does not read {option} (its options: "
            f"{', '.join(own) if own else 'none'})"
            + (f"; {hint}" if hint else "")
            + (f"; {option} is read by policy={', '.join(readers)}" if readers else ""))


def _unknown_policy(name) -> ValueError:
    return ValueError(f"unknown policy {name!r}; valid: {', '.join(sorted(POLICIES))}")


def _from_mapping(d: Mapping, fields: dict) -> PolicyConfig:
    d = dict(d)
    d.update(fields)
    name = d.pop("name", None)
    if name not in POLICY_CONFIGS:
        raise _unknown_policy(name)
    config = POLICY_CONFIGS[name]
    own = set(option_names(config))
    for k in d:
        if k not in own:
            raise ValueError(not_read_error(name, k))
    if isinstance(d.get("importance"), Mapping):
        try:
            d["importance"] = ImportanceParams(**d["importance"])
        except TypeError as e:
            raise ValueError(f"policy {name}: importance: {e}") from None
    return config(name=name, **d)


def policy_config(spec: Any = None, /, **fields) -> PolicyConfig:
    """A policy's config, of the class registered under its name.

    ``spec``: a policy name (``policy_config("h2o", budget=100)``: that policy's defaults and
    ``fields``), a :class:`PolicyConfig` (returned as is, or a copy with ``fields``), an
    OmegaConf node (Hydra's ``policy`` node) or a mapping with a ``name``. None: ``full``.

    Raises ValueError for an unknown name (listing the valid ones), an option the policy does
    not read (:func:`not_read_error`) or a config whose class is not its name's
    (``policy.name=h2o`` with ``policy=full``'s options).
    """
    if spec is None:
        spec = "full"
    if isinstance(spec, str):
        return _from_mapping({"name": spec}, fields)
    if isinstance(spec, PolicyConfig):
        name = spec.name
        if name not in POLICY_CONFIGS:
            raise _unknown_policy(name)
        if type(spec) is not POLICY_CONFIGS[name]:
            raise ValueError(
                f"policy.name={name} with the options of {type(spec).__name__}; expected the "
                f"options of policy {name} ({POLICY_CONFIGS[name].__name__}): choose a policy "
                f"with policy={name}, not policy.name")
        if fields:
            own = set(option_names(type(spec)))
            for k in fields:
                if k not in own:
                    raise ValueError(not_read_error(name, k))
            return dataclasses.replace(spec, **fields)
        return spec
    if type(spec).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        obj = OmegaConf.to_object(spec)
        if isinstance(obj, PolicyConfig):
            return policy_config(obj, **fields)
        spec = obj
    if isinstance(spec, Mapping):
        return _from_mapping(spec, fields)
    raise ValueError(f"policy config: expected a policy name, a PolicyConfig, a mapping or an "
                     f"OmegaConf node, got {type(spec).__name__}")


def validate_policy_config(cfg, prompt_len: int | None = None) -> PolicyConfig:
    """Check a policy's config (anything :func:`policy_config` takes) and return it as its
    config class. Raises ValueError naming the policy and the field: unknown name, an option
    the policy does not read, a mode the policy does not support, and the config class's own
    ranges (``check``); with ``prompt_len``, also the per-request rule (e.g. a total budget
    below a protected prompt)."""
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
