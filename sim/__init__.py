"""kvsim's engine and memory model: block pool, scheduler, cost model, tiers, metrics."""

__version__ = "0.1.0"
