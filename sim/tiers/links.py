"""Links between the tiers: FIFO transfer queues of capacity 1, one per direction.

Transfers queue and contend through arithmetic reservations (:meth:`Link.reserve`: a capacity-1
FIFO resource's times, without its events). A batch of ``n`` pages of ``b`` bytes takes
``overhead + n x b / bandwidth`` (PCIe: 14 us per issued copy, 55 GB/s each way, measured on this
workplace's H200, design.md; disk: latency per I/O + bytes / bandwidth, defaults for one NVMe Gen4
drive: 7 GB/s read, 5 GB/s write, 80 us per I/O from vendor sheets).
"""

from __future__ import annotations

from ..errors import ConfigError


class Link:
    """A transfer link: FIFO, one batch at a time, ``overhead_s + bytes / bandwidth`` per batch.

    Batches queue arithmetically (:meth:`reserve`: the times of a capacity-1 FIFO resource,
    without its events): an offload or demotion lands through one timeout at its end, and an
    onboarding process waits for each of its batches with one timeout.

    Args:
        name: for records; bandwidth_Bps: bytes/s (> 0); overhead_s: fixed cost per batch
            (per issued copy or I/O).
    """

    def __init__(self, name: str, bandwidth_Bps: float, overhead_s: float):
        if bandwidth_Bps <= 0:
            raise ConfigError(f"link {name}: bandwidth {bandwidth_Bps} B/s; expected > 0")
        if overhead_s < 0:
            raise ConfigError(f"link {name}: overhead {overhead_s} s; expected >= 0")
        self.name = name
        self.bw = float(bandwidth_Bps)
        self.overhead = float(overhead_s)
        self.free_at = float("-inf")  # when the last reserved batch ends

    def reserve(self, now: float, dur: float) -> tuple[float, float]:
        """Queue one batch of ``dur`` seconds issued at ``now`` behind the batches already
        reserved: returns its ``(start, end)``, ``end = start + dur`` (the value a SimPy timeout
        from ``start`` reaches). The same times as a capacity-1 FIFO resource."""
        start = now if now >= self.free_at else self.free_at
        end = start + dur
        self.free_at = end
        return start, end

    def duration(self, nbytes: float) -> float:
        """Seconds one batch of ``nbytes`` occupies the link."""
        return self.overhead + nbytes / self.bw
