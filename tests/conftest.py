"""Shared test helpers: compose configs and build small in-memory workloads."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pytest

from sim.run import compose_config


def make_workload(rows, prefix_block_tokens=0, name="test"):
    """Build a traces.Workload from dicts with keys arrival_s, input_tokens, output_tokens and
    optional prefix_ids, parent_request_id, think_s, session_id."""
    from traces import WORKLOAD_SCHEMA, Workload

    n = len(rows)
    cols = {
        "request_id": np.arange(n, dtype=np.int64),
        "session_id": np.array([r.get("session_id", i) for i, r in enumerate(rows)], dtype=np.int64),
        "turn": np.array([r.get("turn", 0) for r in rows], dtype=np.int32),
        "arrival_s": np.array([r.get("arrival_s", 0.0) for r in rows], dtype=np.float64),
        "think_s": np.array([r.get("think_s", 0.0) for r in rows], dtype=np.float64),
        "parent_request_id": np.array([r.get("parent_request_id", -1) for r in rows], dtype=np.int64),
        "input_tokens": np.array([r["input_tokens"] for r in rows], dtype=np.int64),
        "output_tokens": np.array([r["output_tokens"] for r in rows], dtype=np.int64),
    }
    arrays = []
    for field in WORKLOAD_SCHEMA:
        if field.name == "prefix_ids":
            arrays.append(pa.array([list(r.get("prefix_ids", [])) for r in rows], type=field.type))
        elif field.name == "prefix_block_tokens":
            arrays.append(pa.array([prefix_block_tokens] * n, type=field.type))
        else:
            arrays.append(pa.array(cols[field.name], type=field.type))
    table = pa.Table.from_arrays(arrays, schema=WORKLOAD_SCHEMA)
    return Workload(table=table, name=name, source="<memory>", prefix_block_tokens=prefix_block_tokens,
                    closed_loop=bool((cols["parent_request_id"] >= 0).any()))


@pytest.fixture
def cfg_factory():
    def make(*overrides):
        return compose_config(list(overrides))
    return make


@pytest.fixture(autouse=True, scope="session")
def _session_trace_cache(tmp_path_factory):
    """Parsed-trace cache entries (traces.cache) go to a folder of this test session, not to the
    user's ~/.cache (subprocesses the tests start inherit the variable)."""
    old = os.environ.get("KVSIM_CACHE_DIR")
    os.environ["KVSIM_CACHE_DIR"] = str(tmp_path_factory.mktemp("kvsim-cache"))
    yield
    if old is None:
        os.environ.pop("KVSIM_CACHE_DIR", None)
    else:
        os.environ["KVSIM_CACHE_DIR"] = old
