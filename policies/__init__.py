"""kvsim policies: paged KV layout, token importance, eviction policies and compactors (numpy only).

See ``policies/README.md`` for the interface the engine uses. Importing the package imports
every module in it, so each policy class registered there with
:func:`policies.registry.register_policy` is in :data:`POLICIES` (CONTRIBUTING.md, "Adding a
policy").
"""

import importlib as _importlib
import pkgutil as _pkgutil

from .compaction import COMPACTOR_CLASSES, Compactor, ForwardPack, HoleFill, NoCompaction, RoundResult, make_compactor
from .config import (MODES, AdaKVConfig, CompactionConfig, FullConfig, H2OConfig, ImportanceParams, PolicyConfig,
                     PyramidKVConfig, QuestConfig, RandomConfig, RKVConfig, ScoredConfig, SnapKVConfig,
                     StreamingLLMConfig, TOVAConfig, TriAttentionConfig)
from .eviction import EvictionPolicy, ModelShape, RequestState, topk_mask
from .importance import ImportanceModel, RecordedImportance, make_importance, score_slots
from .layout import PagedLayout
from .registry import (POLICIES, POLICY_CONFIGS, make_policy, policy_config, register_policy,
                       validate_policy_config)

for _module in _pkgutil.iter_modules(__path__):  # (sorted by name: registration order is fixed)
    _importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "COMPACTOR_CLASSES", "Compactor", "ForwardPack", "HoleFill", "NoCompaction", "RoundResult", "make_compactor",
    "MODES", "CompactionConfig", "ImportanceParams", "PolicyConfig", "FullConfig", "ScoredConfig", "RandomConfig",
    "StreamingLLMConfig", "H2OConfig", "TOVAConfig", "TriAttentionConfig", "RKVConfig", "SnapKVConfig",
    "PyramidKVConfig", "AdaKVConfig", "QuestConfig", "EvictionPolicy", "ModelShape", "RequestState", "topk_mask",
    "ImportanceModel", "RecordedImportance", "make_importance", "score_slots", "PagedLayout", "POLICIES",
    "POLICY_CONFIGS", "make_policy", "policy_config", "register_policy", "validate_policy_config",
]
