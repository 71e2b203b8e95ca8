"""Block-pool micro-benchmark (issue "Simulation speed"; not part of the test run).

``python -m experiments.bench_pool [--blocks 49987] [--chunk 512] [--calls 4000]
[--held 40] [--index table|dict] [--repeats 3]``

The growth a chunked prefill makes: a :class:`sim.block_pool.BlockPool` of ``--blocks`` blocks
(default: the Weka benchmark's pool, Qwen3-8B on an H200) with prefix caching (``--index``:
its prefix-index backend, ``sim.prefix_index``'s; default the engine's, ``table``) and every block
cached and freed in a random order (the free queue scattered over the block ids), then ``--calls`` growth calls of ``--chunk`` blocks each (one
:meth:`~sim.block_pool.BlockPool.allocate_into` that takes the blocks off the free queue,
evicts their cached hashes from the prefix index and registers the chunk's blocks under new
random keys), with ``--held`` chunks held at a time: the oldest is freed last block first (as a
finished request's table) once more are held. Prints, per repeat and as medians, the
nanoseconds per block of the growth calls and of the frees.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from sim.block_pool import BlockPool


def run(blocks: int, chunk: int, calls: int, held: int, index: str,
        seed: int) -> tuple[float, float]:
    """(growth ns per block, free ns per block) of ``calls`` steady-state growth calls."""
    rng = np.random.default_rng(seed)
    pool = BlockPool(blocks, True, index=index)
    tables = []
    while pool.num_free >= chunk:  # every block cached, then all free (cached-free)
        t = np.empty(chunk, dtype=np.int64)
        pool.allocate_into(t, t, rng.integers(1, 1 << 62, chunk, dtype=np.int64))
        tables.append(t)
    # freed in a random order: after hours of serving, the free queue's order is scattered
    # over the block ids (a block's arrays and index slot are random reads)
    pool.free(rng.permutation(np.concatenate(tables)))
    keys = rng.integers(1, 1 << 62, (calls, chunk), dtype=np.int64)
    live = []
    grow = free = 0.0
    for c in range(calls):
        t = np.empty(chunk, dtype=np.int64)
        t0 = time.perf_counter()
        pool.allocate_into(t, t, keys[c])
        grow += time.perf_counter() - t0
        live.append(t)
        if len(live) > held:
            old = live.pop(0)[::-1].copy()
            t0 = time.perf_counter()
            pool.free(old)
            free += time.perf_counter() - t0
    n_freed = max(1, (calls - held) * chunk)
    return grow / (calls * chunk) * 1e9, free / n_freed * 1e9


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=49_987)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--calls", type=int, default=4000)
    ap.add_argument("--held", type=int, default=40)
    ap.add_argument("--index", choices=("table", "dict"), default="table")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    if min(a.blocks, a.chunk, a.calls, a.held, a.repeats) < 1:
        ap.error("--blocks, --chunk, --calls, --held and --repeats must be >= 1")
    if (a.held + 1) * a.chunk > a.blocks:
        ap.error(f"--held {a.held} + 1 chunks of {a.chunk} blocks exceed the pool's "
                 f"{a.blocks} blocks; expected (held + 1) x chunk <= blocks")
    runs = [run(a.blocks, a.chunk, a.calls, a.held, a.index, seed) for seed in range(a.repeats)]
    g = [r[0] for r in runs]
    f = [r[1] for r in runs]
    print("growth:", " ".join(f"{x:.1f}" for x in g), "ns/block; median",
          f"{statistics.median(g):.1f}")
    print("free:  ", " ".join(f"{x:.1f}" for x in f), "ns/block; median",
          f"{statistics.median(f):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
