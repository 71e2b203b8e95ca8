"""Page-store micro-benchmark (issue "Simulation speed"; not part of the test run).

``python -m experiments.bench_pagestore [--pages 1657008] [--inserts 4000000] [--batch 40]
[--repeats 3]``

Fills an :class:`sim.tiers.LRUStore` to ``--pages`` (default: the Mooncake benchmark's disk tier,
1 TiB of NVFP4 Qwen3-8B pages), then inserts ``--inserts`` new random keys in batches of
``--batch``, each evicting the least recently used page, as demotions do on a full disk tier.
Prints the nanoseconds per inserted page of each repeat and their median.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from sim.tiers import LRUStore


def run(pages: int, inserts: int, batch: int, seed: int) -> float:
    """Nanoseconds per page of ``inserts`` evicting inserts into a full store of ``pages``."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(-(1 << 62), 1 << 62, size=pages + inserts)
    store = LRUStore(pages)
    store.insert_array(keys[:pages])
    t0 = time.perf_counter()
    for lo in range(pages, pages + inserts, batch):
        store.insert_array(keys[lo:lo + batch])
    return (time.perf_counter() - t0) / inserts * 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pages", type=int, default=1_657_008)
    ap.add_argument("--inserts", type=int, default=4_000_000)
    ap.add_argument("--batch", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    if a.pages < 1 or a.inserts < 1 or a.batch < 1 or a.repeats < 1:
        ap.error("--pages, --inserts, --batch and --repeats must be >= 1")
    ns = [run(a.pages, a.inserts, a.batch, seed) for seed in range(a.repeats)]
    print(" ".join(f"{x:.0f}" for x in ns), "ns/page; median", f"{statistics.median(ns):.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
