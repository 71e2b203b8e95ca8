"""Tier specs: the chain of levels below the GPU, each described once, as data.

Hierarchy (design.md section 3; vLLM CPU offloading, LMCache, SGLang HiCache, Mooncake Store):
GPU -> level 1 -> level 2 -> ... -> level N. Level 1 is where the GPU's pages are copied to and
where every onboarded page crosses to the GPU (pinned host DRAM over PCIe by default); each
deeper level takes the evictions of the level above it and serves its pages back up through
it. A level is a :class:`TierSpec`: its name, the code a hit walk gives the pages it serves
(its depth, 1 .. N), its capacity in pages, its page store's replacement, and its two links,
``fill`` (copies into it from the level above: device-to-host over PCIe for level 1, the
demotions written for a deeper level) and ``serve`` (copies out of it toward the GPU:
host-to-device for level 1, reads into the level above for a deeper one). Every level holds
the same encoded page (:mod:`sim.tiers.pages`).

:func:`tier_specs` reads the ``tiers`` config into the chain: ``tiers.levels`` when it lists
levels (:class:`sim.config.LevelConfig`), else the two levels ``host`` (``host_gib``, PCIe)
and ``disk`` (``disk_gib``, ``disk_read_gbps`` / ``disk_write_gbps`` / ``disk_latency_s``).
The tier manager (:class:`sim.tiers.manager.TierManager`) builds its stores and links from
them and from nothing else of that config's capacities, replacements and links.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from ..hardware import GIB
from .links import Link
from .stores import make_store

# where a hit walk finds a page: the fastest level holding it (int8 codes of
# TierManager.locate): GPU, then level k of the chain is code k (HOST, DISK: the default
# chain's two levels); REMOTE: a cluster's shared store (sim.kv_store), below every level
GPU, HOST, DISK = 0, 1, 2
REMOTE = 127
# the most levels a chain may have (the compiled hit walk's table slots, sim.tiers.stores)
MAX_LEVELS = 4


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


# the names a level may not take: the GPU's and the cluster store's (hit_tokens_gpu,
# hit_tokens_remote) and the summary's hit_ratio.total
RESERVED_LEVEL_NAMES = ("gpu", "remote", "total")
LEVEL_NAME_RULE = (f"a name of its own: a lowercase letter, then lowercase letters and digits, "
                   f"at most 16 characters (it names columns: hit_tokens_<name>, "
                   f"onboard_<name>_s, links <above>_to_<name>), not "
                   f"{', '.join(map(repr, RESERVED_LEVEL_NAMES))} or another level's")


def level_name_problem(name, taken) -> str | None:
    """What is wrong with ``name`` as the name of a ``tiers.levels`` entry, whose levels above
    it are named ``taken``: not a string, not of :data:`LEVEL_NAME_RULE`'s form (empty,
    whitespace, upper case, an underscore, which would make the link names ambiguous), a
    reserved name (:data:`RESERVED_LEVEL_NAMES`) or one taken; None when it is fine."""
    import re

    if not isinstance(name, str):
        return f"a {type(name).__name__}, not a string"
    if name.lower() in RESERVED_LEVEL_NAMES:
        return "a name kvsim reserves"
    if name in taken:
        return f"another level's name (tiers.levels[{list(taken).index(name)}])"
    if not re.fullmatch(r"[a-z][a-z0-9]{0,15}", name):
        return "empty" if not name else "blank" if not name.strip() else "not of that form"
    return None


def _level_link(level, field: str, value, default) -> float:
    """``value`` (or ``default`` where null) as a float, for the ``tiers.levels`` entry
    ``level``; ConfigError naming ``tiers.levels[i].field`` for a missing figure."""
    if value is None:
        if default is None:
            raise ConfigError(f"{field}: missing; expected a number (only the first level "
                              f"takes the GPU card's PCIe figures when it is null)")
        return float(default)
    return float(value)


def tier_specs(tiers, page_bytes: int, gpu) -> tuple[TierSpec, ...]:
    """The chain of levels below the GPU of the ``tiers`` config node (``sim.config.
    TiersConfig``) for encoded pages of ``page_bytes`` bytes, level 1 first (codes 1 .. N).

    With ``tiers.levels`` empty: ``host`` (``host_gib``; its links PCIe, ``tiers.pcie_gbps`` /
    ``tiers.pcie_overhead_s`` or, where null, the GPU card's ``pcie_bandwidth_gbps`` (GB/s) /
    ``pcie_overhead_s`` (s per copy)) and ``disk`` (``disk_gib``; fill at ``disk_write_gbps``,
    serve at ``disk_read_gbps``, ``disk_latency_s`` per I/O), links named ``d2h`` / ``h2d`` and
    ``host_to_disk`` / ``disk_to_host``. With ``tiers.levels``: one level per entry, its links
    named ``d2h`` / ``h2d`` for the first and ``<above>_to_<name>`` / ``<name>_to_<above>``
    for the others; a null ``write_gbps`` / ``read_gbps`` / ``latency_s`` of the first level is
    the PCIe figure above, ``replacement`` null is ``tiers.replacement``.

    Raises ConfigError for a capacity out of range (:func:`tier_capacity_pages`), a level name
    out of :data:`LEVEL_NAME_RULE` (:func:`level_name_problem`), ``tiers.levels`` beside a nonzero
    ``host_gib`` / ``disk_gib``, more than :data:`MAX_LEVELS` levels, or a missing figure."""
    pcie = float(tiers.pcie_gbps if tiers.pcie_gbps is not None else gpu.pcie_bandwidth_gbps) * 1e9
    pcie_o = float(tiers.pcie_overhead_s if tiers.pcie_overhead_s is not None else gpu.pcie_overhead_s)
    levels = list(getattr(tiers, "levels", None) or ())
    if not levels:
        host_pages = tier_capacity_pages(tiers.host_gib, page_bytes, "tiers.host_gib")
        disk_pages = tier_capacity_pages(tiers.disk_gib, page_bytes, "tiers.disk_gib")
        disk_o = float(tiers.disk_latency_s)
        host = TierSpec("host", HOST, host_pages, tiers.replacement,
                        fill=LinkSpec("d2h", pcie, pcie_o), serve=LinkSpec("h2d", pcie, pcie_o))
        disk = TierSpec("disk", DISK, disk_pages, tiers.replacement,
                        fill=LinkSpec("host_to_disk", float(tiers.disk_write_gbps) * 1e9, disk_o),
                        serve=LinkSpec("disk_to_host", float(tiers.disk_read_gbps) * 1e9, disk_o))
        return host, disk
    if float(tiers.host_gib) != 0 or float(tiers.disk_gib) != 0:
        raise ConfigError(f"tiers.levels lists {len(levels)} levels with tiers.host_gib="
                          f"{tiers.host_gib}, tiers.disk_gib={tiers.disk_gib}; expected both 0 "
                          f"(tiers.levels is the whole chain below the GPU)")
    if len(levels) > MAX_LEVELS:
        raise ConfigError(f"tiers.levels lists {len(levels)} levels; expected at most {MAX_LEVELS}")
    out = []
    for i, lv in enumerate(levels):
        f = f"tiers.levels[{i}]"
        name = lv.name
        why = level_name_problem(name, [sp.name for sp in out])
        if why is not None:
            raise ConfigError(f"{f}.name={name!r}: {why}; expected {LEVEL_NAME_RULE}")
        pages = tier_capacity_pages(lv.gib, page_bytes, f"{f}.gib")
        first = i == 0
        wbw = _level_link(lv, f"{f}.write_gbps", lv.write_gbps, pcie / 1e9 if first else None)
        rbw = _level_link(lv, f"{f}.read_gbps", lv.read_gbps, pcie / 1e9 if first else None)
        lat = _level_link(lv, f"{f}.latency_s", lv.latency_s, pcie_o if first else None)
        above = out[-1].name if out else None
        fill = "d2h" if first else f"{above}_to_{name}"
        serve = "h2d" if first else f"{name}_to_{above}"
        repl = lv.replacement if lv.replacement is not None else tiers.replacement
        out.append(TierSpec(name, i + 1, pages, repl, fill=LinkSpec(fill, wbw * 1e9, lat),
                            serve=LinkSpec(serve, rbw * 1e9, lat)))
    return tuple(out)


def tiers_enabled(tiers) -> bool:
    """Whether the ``tiers`` config has a level below the GPU with capacity above 0
    (``tiers.levels``' ``gib``, else ``host_gib`` / ``disk_gib``)."""
    levels = getattr(tiers, "levels", None) or ()
    if levels:
        return any(float(lv.gib) > 0 for lv in levels)
    return float(tiers.host_gib) > 0 or float(tiers.disk_gib) > 0


def tiers_name(tiers) -> str:
    """The chain the ``tiers`` config runs: ``gpu_`` and the names of its levels with capacity
    above 0, joined by ``_`` (``gpu_host_disk``, ``gpu_host``, ``gpu_disk``), or ``gpu_only``."""
    levels = getattr(tiers, "levels", None) or ()
    if levels:
        on = [str(lv.name) for lv in levels if float(lv.gib) > 0]
    else:
        on = [n for n, g in (("host", tiers.host_gib), ("disk", tiers.disk_gib)) if float(g) > 0]
    return "gpu_" + "_".join(on) if on else "gpu_only"
