"""The tiers below the GPU block pool: cold pages, page stores, links, the tier specs and the
tier manager, one module each.

Hierarchy (design.md section 3; vLLM CPU offloading, LMCache, SGLang HiCache, Mooncake Store):
GPU -> level 1 -> ... -> level N, by default host (pinned DRAM over PCIe) -> disk (NVMe). A
page (one block: all layers' K and V of ``block_size`` tokens) leaving the GPU is encoded by the
cold-page codec; every level holds the same encoded page, so a copy between two levels moves
raw bytes. It is decoded when it returns to the GPU.

* :mod:`sim.tiers.pages`: the bytes of an encoded page per codec, and the codec's GPU time.
* :mod:`sim.tiers.stores`: the page stores (LRU compiled, ARC) and the in-flight key set.
* :mod:`sim.tiers.links`: FIFO transfer links timed by arithmetic reservations.
* :mod:`sim.tiers.spec`: a level below the GPU as data (:class:`TierSpec`); the chain read
  from the ``tiers`` config by :func:`tier_specs`.
* :mod:`sim.tiers.manager`: the tier manager (write policies, demotions, onboarding, hit
  lookups).
"""

from .links import Link
from .manager import WRITE_POLICIES, TierManager, joined
from .pages import CODECS, codec_time, cold_page_bytes
from .spec import (DISK, GPU, HOST, MAX_LEVELS, REMOTE, LinkSpec, TierSpec, tier_capacity_pages,
                   tier_specs, tiers_enabled, tiers_name)
from .stores import REPLACEMENTS, ARCStore, KeySet, LRUStore, make_store

__all__ = [
    "CODECS", "REPLACEMENTS", "WRITE_POLICIES", "GPU", "HOST", "DISK", "REMOTE",
    "cold_page_bytes", "codec_time", "LRUStore", "ARCStore", "KeySet", "make_store", "Link",
    "LinkSpec", "TierSpec", "tier_capacity_pages", "tier_specs", "tiers_enabled", "tiers_name",
    "MAX_LEVELS", "TierManager", "joined",
]
