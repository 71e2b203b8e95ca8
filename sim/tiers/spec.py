"""Tier specs: each level below the GPU described once, as data.

Hierarchy (design.md section 3; vLLM CPU offloading, LMCache, SGLang HiCache): GPU -> host
(pinned DRAM over PCIe) -> disk (NVMe). A level is a :class:`TierSpec`: its name, the code a hit
walk gives the pages it serves, its capacity in pages, its page store's replacement, and its two
links, ``fill`` (copies into it from the level above: device-to-host over PCIe for the host, the
host's demotions written for the disk) and ``serve`` (copies out of it toward the GPU:
host-to-device, disk reads). Every level holds the same encoded page (:mod:`sim.tiers.pages`).
:func:`tier_specs` reads the ``tiers`` config into the levels, and the tier manager
(:class:`sim.tiers.manager.TierManager`) builds its stores and links from them and from
nothing else of that config's capacities, replacements and links.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..hardware import GIB
from .links import Link
from .stores import make_store

# where a hit walk finds a page: the fastest level holding it (int8 codes of
# TierManager.locate); REMOTE: a cluster's shared store (sim.kv_store), below host and disk
GPU, HOST, DISK = 0, 1, 2
REMOTE = 3


@dataclass(frozen=True)
class LinkSpec:
    """One direction of a link: ``name`` (the transfer records' direction), ``bandwidth_Bps``
    (bytes/s, > 0) and ``overhead_s`` (s per batch: an issued copy or an I/O, >= 0)."""

    name: str
    bandwidth_Bps: float
    overhead_s: float

    def build(self) -> Link:
        """The link (ConfigError for a bandwidth <= 0 or a negative overhead)."""
        return Link(self.name, self.bandwidth_Bps, self.overhead_s)


@dataclass(frozen=True)
class TierSpec:
    """One level below the GPU: ``name`` (the transfer records' tier and the summary's names),
    ``code`` (:data:`HOST`, :data:`DISK`: what a hit walk gives its pages), ``capacity_pages``
    (>= 0; 0: the level is off), ``replacement`` (lru | arc), ``fill`` and ``serve`` (the links
    into it and out of it toward the GPU)."""

    name: str
    code: int
    capacity_pages: int
    replacement: str
    fill: LinkSpec
    serve: LinkSpec

    def store(self):
        """An empty page store of this level (:func:`sim.tiers.stores.make_store`)."""
        return make_store(self.replacement, self.capacity_pages)


def tier_capacity_pages(gib: float, page_bytes: int, field: str) -> int:
    """Pages of ``page_bytes`` that fit in ``gib`` GiB; ConfigError if ``gib`` is negative or
    so large that the page count does not fit the stores' int64 counters (pages >= 2**62)."""
    if not (0 <= gib < float("inf")):
        raise ConfigError(f"{field}={gib}; expected a finite capacity >= 0 GiB")
    nbytes = gib * GIB  # (inf for a finite gib near the float64 limit)
    if nbytes == float("inf") or nbytes // page_bytes >= 1 << 62:
        most = ((1 << 62) - 1) * page_bytes / GIB
        raise ConfigError(f"{field}={gib}: {nbytes / page_bytes:.3g} pages of {page_bytes} B; "
                          f"expected at most {most:.3g} GiB (2**62 pages; any capacity above the "
                          f"trace's unique pages already holds them all)")
    return int(nbytes // page_bytes)


def tier_specs(tiers, page_bytes: int, gpu) -> tuple[TierSpec, TierSpec]:
    """The host and disk levels of the ``tiers`` config node (``sim.config.TiersConfig``) for
    encoded pages of ``page_bytes`` bytes; ``gpu``: the GPU card, whose PCIe bandwidth (GB/s)
    and overhead (s per copy) the host's links take where ``tiers.pcie_gbps`` /
    ``tiers.pcie_overhead_s`` are null. Raises ConfigError for a capacity out of range
    (:func:`tier_capacity_pages`)."""
    host_pages = tier_capacity_pages(tiers.host_gib, page_bytes, "tiers.host_gib")
    disk_pages = tier_capacity_pages(tiers.disk_gib, page_bytes, "tiers.disk_gib")
    pcie = float(tiers.pcie_gbps if tiers.pcie_gbps is not None else gpu.pcie_bandwidth_gbps) * 1e9
    pcie_o = float(tiers.pcie_overhead_s if tiers.pcie_overhead_s is not None else gpu.pcie_overhead_s)
    disk_o = float(tiers.disk_latency_s)
    host = TierSpec("host", HOST, host_pages, tiers.replacement,
                    fill=LinkSpec("d2h", pcie, pcie_o), serve=LinkSpec("h2d", pcie, pcie_o))
    disk = TierSpec("disk", DISK, disk_pages, tiers.replacement,
                    fill=LinkSpec("disk_write", float(tiers.disk_write_gbps) * 1e9, disk_o),
                    serve=LinkSpec("disk_read", float(tiers.disk_read_gbps) * 1e9, disk_o))
    return host, disk
