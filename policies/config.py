"""What the policies share: the options base classes, the registry, the ``policy`` group's
schema, the importance model's and the compactors' configs.

Only ``dataclasses`` are used here (no Hydra / OmegaConf, numpy or numba import). Each policy
has its own :class:`PolicyOptions` subclass, declared beside the policy in the policy's module,
whose fields are exactly the options that policy reads, registered under the policy's name
(:func:`register_options`) and linked to the policy's class by :func:`register_policy`. Reading
:data:`POLICY_CONFIGS`, :data:`POLICIES` or :class:`PolicyConfig` imports every module of the
package first (:func:`discover`); :class:`PolicyConfig`, the Hydra schema of the ``policy``
group, is derived from the registered classes (:func:`group_schema`); an option the chosen
policy does not read is an error (:func:`policy_config`).

Units are in the field names or docstrings: token counts are tokens, ``*_bytes`` are bytes.
Validation (``PolicyOptions.check`` through :func:`policies.registry.validate_policy_config`,
:func:`validate_compaction_config`) raises ``ValueError`` with a message naming the field and
the valid values.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Mapping, Optional

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
class PolicyOptions:
    """Base of every policy's options (``experiments/conf/policy/<name>.yaml``). Each policy
    registers its own subclass (:func:`register_options`, :func:`register_policy`) whose
    fields are exactly the options that policy reads, so an option it does not read is an error
    (:func:`policy_config`).

    Fields:
      name: registry name (``policies.registry.POLICIES``); each subclass's default is its
        policy's name.

    Class attributes (not options) that :class:`policies.eviction.EvictionPolicy` reads, for the
    configs of policies that do not read them: ``mode`` ("" = the policy's default grouping) and
    ``protect_prompt`` (the prompt is kept: full and quest evict nothing). A subclass whose
    policy reads them declares them as fields. ``option_hints``: option name -> a hint for a
    user who sets that option on this policy, which does not read it.
    """

    name: str = ""

    mode: ClassVar[str] = ""
    protect_prompt: ClassVar[bool] = True
    option_hints: ClassVar[dict] = {}

    def check(self) -> None:
        """Raise ``ValueError`` naming the first bad field (``policy <name>: ...``): NaN and
        infinite numbers here; subclasses add their ranges."""
        check_finite(self, f"policy {self.name}: ")

    def _nonneg(self, *names: str) -> None:
        for f in names:
            if getattr(self, f) < 0:
                raise ValueError(f"policy {self.name}: {f} must be >= 0, got {getattr(self, f)}")

    def _budget_at_least_one(self) -> None:
        if self.budget < 1:
            raise ValueError(f"policy {self.name}: budget must be >= 1 token, got {self.budget}")

    def _beta_positive(self) -> None:
        if self.beta <= 0:
            raise ValueError(f"policy {self.name}: beta (round period, tokens) must be > 0, got "
                             f"{self.beta}")

    def _seed_in_range(self) -> None:
        try:
            ok = (not isinstance(self.seed, bool) and int(self.seed) == self.seed
                  and 0 <= self.seed < 2 ** 32)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"policy {self.name}: seed must be an integer in [0, 2**32) (the "
                             f"random policy's and the importance model's seed), got {self.seed}")

    def _one_of(self, f: str, valid) -> None:
        v = getattr(self, f)
        if v not in valid:
            raise ValueError(f"policy {self.name}: unknown {f} {v!r}; valid: {', '.join(valid)}")

    def _window_within_budget(self) -> None:
        if self.observation_window > self.budget:
            raise ValueError(f"policy {self.name}: observation_window {self.observation_window} "
                             f"exceeds budget {self.budget}")

    def _fraction(self, f: str) -> None:
        v = getattr(self, f)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"policy {self.name}: {f} must be in [0, 1], got {v}")


# name -> options class of that policy (register_options), in registration order; read as
# POLICY_CONFIGS (module __getattr__), which imports every policy module first (discover)
_CONFIGS: dict[str, type[PolicyOptions]] = {}
# name -> policy class (register_policy); read as POLICIES, likewise
_POLICIES: dict[str, type] = {}
_discovered = [False]


def discover() -> None:
    """Import every module of the ``policies`` package, in name order, once: each policy module
    registers its options class (:func:`register_options`) and its policy class
    (:func:`register_policy`) as it is imported, so afterwards :data:`POLICY_CONFIGS` and
    :data:`POLICIES` hold every policy. A policy module imports numpy, not numba (its kernels
    are :mod:`sim.jit` stand-ins until one is called), so composing a config stays free of
    numba. An exception from a module propagates (and the next call tries again)."""
    if _discovered[0]:
        return
    import importlib
    import os
    import pkgutil

    _discovered[0] = True
    try:
        for m in sorted(pkgutil.iter_modules([os.path.dirname(__file__)]), key=lambda m: m.name):
            importlib.import_module(f"{__package__}.{m.name}")
    except BaseException:
        _discovered[0] = False
        raise


def registered_options() -> dict[str, type[PolicyOptions]]:
    """Every policy's options class by name (:func:`discover` first), in registration order."""
    discover()
    return _CONFIGS


def register_options(config: type[PolicyOptions]) -> type[PolicyOptions]:
    """Class decorator: register the options dataclass ``config`` (a :class:`PolicyOptions`
    subclass) under its ``name`` default, the policy's registry name. Raises ValueError for a
    class that is not a PolicyOptions dataclass, has no name, or a second class under one name."""
    if not (isinstance(config, type) and issubclass(config, PolicyOptions)
            and dataclasses.is_dataclass(config)):
        raise ValueError(f"register_options: {config!r} is not a PolicyOptions dataclass")
    name = config.__dataclass_fields__["name"].default
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_options: {config.__name__}.name has no default; expected the "
                         f"policy's registry name")
    if _CONFIGS.get(name, config) is not config:
        raise ValueError(f"register_options: policy {name!r} already has options "
                         f"({_CONFIGS[name].__module__}.{_CONFIGS[name].__name__})")
    _CONFIGS[name] = config
    return config


def register_policy(config: type[PolicyOptions]):
    """Class decorator: register the policy class under its ``name`` with ``config``, its
    options class (registered with :func:`register_options`, whose ``name`` defaults to the
    policy's name); sets the class's ``config_class``. Raises ValueError for options not
    registered under the policy's name or a second class under one name."""
    if not (isinstance(config, type) and issubclass(config, PolicyOptions)
            and dataclasses.is_dataclass(config)):
        raise ValueError(f"register_policy: {config!r} is not a PolicyOptions dataclass")

    def register(cls):
        name = cls.name
        default = config.__dataclass_fields__["name"].default
        if default != name:
            raise ValueError(f"register_policy: {config.__name__}.name defaults to {default!r}; "
                             f"expected the policy's name {name!r}")
        if _CONFIGS.get(name) is not config:
            raise ValueError(f"register_policy: {config.__name__} is not registered as the options "
                             f"of policy {name!r}; expected @register_options on it, above the "
                             f"policy class in its module")
        if _POLICIES.get(name, cls) is not cls:
            raise ValueError(f"register_policy: policy {name!r} is already registered "
                             f"({_POLICIES[name].__module__}.{_POLICIES[name].__name__})")
        _POLICIES[name] = cls
        cls.config_class = config
        return cls

    return register


@dataclass
class ScoredConfig(PolicyOptions):
    """Options of the policies that rank tokens by importance scores (the generative model or a
    recorded file, :func:`policies.importance.make_importance`).

    Fields:
      mode: grouping mode, one of :data:`MODES`; "" = the policy's default (snapkv per_head,
        pyramidkv/ada_kv per_layer_per_head, others union).
      seed: seed of the importance model (plus the run's seed).
      importance_source: ``generative`` (ImportanceModel) or ``recorded`` (Parquet file).
      importance_file: Parquet path when importance_source = recorded.
      importance: generative importance model parameters.
    """

    mode: str = ""
    seed: int = 0
    importance_source: str = "generative"
    importance_file: str = ""
    importance: ImportanceParams = field(default_factory=ImportanceParams)

    def check(self) -> None:
        super().check()
        self._seed_in_range()
        self._one_of("importance_source", IMPORTANCE_SOURCES)
        if self.importance_source == "recorded" and not self.importance_file:
            raise ValueError(f"policy {self.name}: importance_source=recorded needs "
                             f"importance_file")
        validate_importance_params(self.importance)


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


def option_names(config: type[PolicyOptions]) -> list[str]:
    """The options of a policy's options class (its fields but ``name``), in declaration order."""
    return [f.name for f in dataclasses.fields(config) if f.name != "name"]


def readers_of(option: str) -> list[str]:
    """The registered policies whose options class has ``option``, sorted."""
    return sorted(n for n, c in registered_options().items() if option in option_names(c))


def not_read_error(name: str, option: str) -> str:
    """The message for the option ``option`` set on the policy ``name``, which does not read it:
    the policy's options, the options class's hint, if any, and the policies that read it."""
    config = registered_options()[name]
    own = option_names(config)
    readers = readers_of(option)
    hint = config.option_hints.get(option)
    return (f"policy {name} does not read {option} (its options: "
            f"{', '.join(own) if own else 'none'})"
            + (f"; {hint}" if hint else "")
            + (f"; {option} is read by policy={', '.join(readers)}" if readers else ""))


# ------------------------------------------------------------------------- the group's schema
def _optional_schema(cls: type) -> type:
    """A dataclass with the fields of the dataclass ``cls``, each ``Optional`` with default None
    (a nested dataclass field: its own optional schema), named ``<cls>Options``."""
    hints = typing.get_type_hints(cls)
    spec = []
    for f in dataclasses.fields(cls):
        t = hints[f.name]
        if dataclasses.is_dataclass(t):
            sub = _optional_schema(t)
            spec.append((f.name, sub, dataclasses.field(default_factory=sub)))
        else:
            spec.append((f.name, Optional[t], dataclasses.field(default=None)))
    out = dataclasses.make_dataclass(f"{cls.__name__}Options", spec)
    out.__module__ = __name__
    out.__doc__ = (f"The fields of :class:`{cls.__module__}.{cls.__name__}`, each None when "
                   f"not set (its default applies).")
    return out


def group_schema(configs: Mapping[str, type[PolicyOptions]] | None = None) -> type:
    """The schema of Hydra's ``policy`` group, derived from the options classes ``configs``
    (name -> class; default: the registered ones, :data:`POLICY_CONFIGS`): a dataclass named
    ``PolicyConfig`` with ``name`` (default ``full``) and every option of every policy,
    ``Optional`` with default None, meaning not set (a nested dataclass option, such as
    ``importance``, has each of its fields so). Hydra composes any policy's options into it, so
    a sweep over policies composes its shared options before the sweep's values choose each
    job's policy; :func:`policy_config` then rejects the options the chosen policy does not
    read.

    Raises ValueError when two policies declare one option with different types."""
    configs = registered_options() if configs is None else configs
    types: dict[str, tuple[Any, str]] = {}
    readers: dict[str, list[str]] = {}
    for pname, config in configs.items():
        hints = typing.get_type_hints(config)
        for f in option_names(config):
            t = hints[f]
            if f in types and types[f][0] != t:
                raise ValueError(f"policy option {f}: {types[f][1]} declares it {types[f][0]}, "
                                 f"{config.__name__} {t}; expected one type per option name")
            types.setdefault(f, (t, config.__name__))
            readers.setdefault(f, []).append(pname)
    spec: list = [("name", str, dataclasses.field(default="full"))]
    for f, (t, _) in types.items():
        if dataclasses.is_dataclass(t):
            sub = _optional_schema(t)
            spec.append((f, sub, dataclasses.field(default_factory=sub)))
        else:
            spec.append((f, Optional[t], dataclasses.field(default=None)))
    schema = dataclasses.make_dataclass("PolicyConfig", spec)
    schema.__module__ = __name__
    lines = [f"      {f}: read by policy={', '.join(sorted(readers[f]))}" for f in types]
    schema.__doc__ = (
        "The options of any policy: the schema of Hydra's ``policy`` group, derived from the "
        "registered options classes (:func:`policies.config.group_schema`). ``name``: the "
        "policy; every other field is None when not set (the policy's default applies), and "
        ":func:`policies.config.policy_config` rejects a set option the policy does not "
        "read.\n\n    Fields:\n" + "\n".join(lines) + "\n")
    return schema


def _set_options(spec) -> dict:
    """The options set in ``spec`` (a :class:`PolicyConfig`, an OmegaConf node or a mapping):
    its items whose value is not None, a nested mapping with its set items (dropped when it has
    none)."""
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        spec = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    elif type(spec).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        spec = OmegaConf.to_container(spec, resolve=True)
    out = {}
    for k, v in dict(spec).items():
        if isinstance(v, Mapping) or (dataclasses.is_dataclass(v) and not isinstance(v, type)):
            v = _set_options(v)
            if v:
                out[k] = v
        elif v is not None:
            out[k] = v
    return out


def _flat(options: dict, prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for k, v in options.items():
        if isinstance(v, dict):
            out += _flat(v, f"{prefix}{k}.")
        else:
            out.append((f"{prefix}{k}", v))
    return out


def _unknown_policy(name) -> ValueError:
    return ValueError(f"unknown policy {name!r}; valid: {', '.join(sorted(registered_options()))}")


def unread_options(spec) -> list[tuple[str, Any]]:
    """The options set in ``spec`` (a :class:`PolicyConfig`, an OmegaConf node or a mapping
    with a ``name``) that its policy does not read, as ``(dotted key under policy, value)``
    pairs in the schema's order (``[("budget", 512)]`` for ``policy=full policy.budget=512``).
    Raises ValueError for an unknown policy name."""
    d = _set_options(spec)
    name = d.pop("name", "full")
    configs = registered_options()
    if name not in configs:
        raise _unknown_policy(name)
    own = set(option_names(configs[name]))
    return _flat({k: v for k, v in d.items() if k not in own})


def _from_mapping(d: Mapping, fields: dict) -> PolicyOptions:
    d = dict(d)
    d.update(fields)
    name = d.pop("name", None)
    configs = registered_options()
    if name not in configs:
        raise _unknown_policy(name)
    config = configs[name]
    own = set(option_names(config))
    for k, v in d.items():
        if k not in own:
            key, value = _flat({k: v})[0] if isinstance(v, dict) and v else (k, v)
            raise ValueError(f"policy.{key}={value}: {not_read_error(name, k)}")
    if isinstance(d.get("importance"), Mapping):
        try:
            d["importance"] = ImportanceParams(**d["importance"])
        except TypeError as e:
            raise ValueError(f"policy {name}: importance: {e}") from None
    return config(name=name, **d)


def policy_config(spec: Any = None, /, **fields) -> PolicyOptions:
    """The options of the policy ``spec`` names, as that policy's options class.

    ``spec``: a policy name (``policy_config("h2o", budget=100)``: that policy's defaults and
    ``fields``), a :class:`PolicyOptions` (returned as is, or a copy with ``fields``), a
    :class:`PolicyConfig`, an OmegaConf node (Hydra's ``policy`` node) or a mapping with a
    ``name`` (their options that are None are not set: the policy's defaults apply). None:
    ``full``.

    Raises ValueError for an unknown name (listing the valid ones), an option the policy does
    not read (``policy.<option>=<value>: ``, then :func:`not_read_error`) or a
    :class:`PolicyOptions` whose class is not its name's.
    """
    if spec is None:
        spec = "full"
    if isinstance(spec, str):
        return _from_mapping({"name": spec}, fields)
    if isinstance(spec, PolicyOptions):
        name = spec.name
        configs = registered_options()
        if name not in configs:
            raise _unknown_policy(name)
        if type(spec) is not configs[name]:
            raise ValueError(f"policy.name={name} with the options of {type(spec).__name__}; "
                             f"expected the options of policy {name} "
                             f"({configs[name].__name__})")
        if fields:
            own = set(option_names(type(spec)))
            for k, v in fields.items():
                if k not in own:
                    raise ValueError(f"policy.{k}={v}: {not_read_error(name, k)}")
            return dataclasses.replace(spec, **fields)
        return spec
    if isinstance(spec, Mapping) or type(spec).__module__.startswith("omegaconf") or (
            dataclasses.is_dataclass(spec) and not isinstance(spec, type)):
        return _from_mapping(_set_options(spec), {k: v for k, v in fields.items()})
    raise ValueError(f"policy config: expected a policy name, a PolicyOptions, a PolicyConfig, a "
                     f"mapping or an OmegaConf node, got {type(spec).__name__}")


_schema: dict[str, type] = {}


def __getattr__(name: str):
    """The names that need every policy module (:func:`discover`): ``POLICY_CONFIGS`` (name ->
    options class), ``POLICIES`` (name -> policy class), ``PolicyConfig`` (the schema of Hydra's
    ``policy`` group, :func:`group_schema` of the registered options classes) and the schema's
    nested classes (a pickled config, a sweep's job handed to a worker process, finds its
    classes here)."""
    if name == "POLICY_CONFIGS":
        return registered_options()
    if name == "POLICIES":
        discover()
        return _POLICIES
    if name.startswith("__"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if not _schema:
        schema = group_schema()
        _schema[schema.__name__] = schema
        for f in dataclasses.fields(schema):
            if dataclasses.is_dataclass(f.type):
                _schema[f.type.__name__] = f.type
        globals().update(_schema)
    if name in _schema:
        return _schema[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
