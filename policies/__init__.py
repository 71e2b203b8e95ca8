"""kvsim policies: paged KV layout, token importance, eviction policies and compactors (numpy only).

See ``policies/README.md`` for the interface the engine uses. Each policy family is one module
holding its options class and its policy class, both registered as the module is imported
(:func:`policies.config.register_options`, :func:`policies.config.register_policy`);
:mod:`policies.config` imports every module of the package (:func:`policies.config.discover`)
when the registry is first read and derives :class:`PolicyConfig`, the schema of Hydra's
``policy`` group, from the options classes (CONTRIBUTING.md, "Adding a policy").
"""

# (each name's module, imported on first use: ``import policies`` imports no other module of the
# package, and no module of the package imports numba before a kernel is called (sim.jit), so
# what needs only the config classes (``kvsim --help``, composing a run's config) does not
# wait for it)
_HOMES = {
    "baselines": ("FullConfig", "RandomConfig"),
    "compaction": ("COMPACTOR_CLASSES", "Compactor", "ForwardPack", "HoleFill", "NoCompaction",
                   "RoundResult", "make_compactor"),
    "config": ("MODES", "CompactionConfig", "ImportanceParams", "PolicyConfig", "PolicyOptions", "ScoredConfig",
               "POLICY_CONFIGS", "policy_config", "register_options", "register_policy", "unread_options"),
    "eviction": ("EvictionPolicy", "ModelShape", "RequestState"),
    "h2o": ("H2OConfig",),
    "importance": ("ImportanceModel", "RecordedImportance", "make_importance", "score_slots"),
    "layout": ("PagedLayout",),
    "quest": ("QuestConfig",),
    "r_kv": ("RKVConfig",),
    "registry": ("POLICIES", "make_policy", "validate_policy_config"),
    "selection": ("topk_mask",),
    "snapkv": ("SnapKVConfig", "PyramidKVConfig", "AdaKVConfig"),
    "streaming_llm": ("StreamingLLMConfig",),
    "tova": ("TOVAConfig",),
    "triattention": ("TriAttentionConfig",),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}


def _home(module: str):
    """The submodule ``module`` of ``_HOMES``, imported."""
    if module == "baselines":
        from . import baselines as m
    elif module == "compaction":
        from . import compaction as m
    elif module == "config":
        from . import config as m
    elif module == "eviction":
        from . import eviction as m
    elif module == "h2o":
        from . import h2o as m
    elif module == "importance":
        from . import importance as m
    elif module == "layout":
        from . import layout as m
    elif module == "quest":
        from . import quest as m
    elif module == "r_kv":
        from . import r_kv as m
    elif module == "selection":
        from . import selection as m
    elif module == "snapkv":
        from . import snapkv as m
    elif module == "streaming_llm":
        from . import streaming_llm as m
    elif module == "tova":
        from . import tova as m
    elif module == "triattention":
        from . import triattention as m
    else:
        from . import registry as m
    return m


def __getattr__(name: str):
    """``policies.NAME`` for the names of ``__all__``, from the module that defines it."""
    if name not in _HOME:
        raise AttributeError(f"module 'policies' has no attribute {name!r}")
    value = getattr(_home(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_HOME))


__all__ = [
    "COMPACTOR_CLASSES", "Compactor", "ForwardPack", "HoleFill", "NoCompaction", "RoundResult", "make_compactor",
    "MODES", "CompactionConfig", "ImportanceParams", "PolicyConfig", "EvictionPolicy", "ModelShape",
    "RequestState", "topk_mask", "ImportanceModel", "RecordedImportance", "make_importance", "score_slots",
    "PagedLayout", "POLICIES", "make_policy", "validate_policy_config", "PolicyOptions", "ScoredConfig",
    "FullConfig", "RandomConfig", "StreamingLLMConfig", "H2OConfig", "TOVAConfig", "TriAttentionConfig",
    "RKVConfig", "SnapKVConfig", "PyramidKVConfig", "AdaKVConfig", "QuestConfig", "POLICY_CONFIGS",
    "policy_config", "register_options", "register_policy", "unread_options",
]
