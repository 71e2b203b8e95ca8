"""kvsim policies: paged KV layout, token importance, eviction policies and compactors (numpy only).

See ``policies/README.md`` for the interface the engine uses.
"""

from .compaction import COMPACTOR_CLASSES, Compactor, ForwardPack, HoleFill, NoCompaction, RoundResult, make_compactor
from .config import MODES, CompactionConfig, ImportanceParams, PolicyConfig
from .eviction import EvictionPolicy, ModelShape, RequestState, topk_mask
from .importance import ImportanceModel, RecordedImportance, make_importance, score_slots
from .layout import PagedLayout
from .registry import POLICIES, make_policy, validate_policy_config

__all__ = [
    "COMPACTOR_CLASSES", "Compactor", "ForwardPack", "HoleFill", "NoCompaction", "RoundResult", "make_compactor",
    "MODES", "CompactionConfig", "ImportanceParams", "PolicyConfig", "EvictionPolicy", "ModelShape",
    "RequestState", "topk_mask", "ImportanceModel", "RecordedImportance", "make_importance", "score_slots",
    "PagedLayout", "POLICIES", "make_policy", "validate_policy_config",
]
