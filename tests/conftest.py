"""Shared test helpers: compose configs, run the ``kvsim`` command, build small in-memory
workloads."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from sim.run import compose_config

REPO = Path(__file__).resolve().parents[1]
BAD = Path(__file__).parent / "data" / "bad"  # malformed trace files
KVSIM = [sys.executable, "-c", "from sim.cli import main; main()"]
# a call that means the single engine passes these overrides, whatever replicas kvsim's root
# config (experiments/conf/config.yaml) sets
SINGLE_ENGINE = ("cluster.replicas=1",)


def quiet_config(*overrides):
    """The composed config of ``overrides``, with the progress bar off."""
    return compose_config(["sim.progress=false", *overrides])


def run_kvsim(out, *overrides, timeout=120):
    """``kvsim output.dir=OUT sim.progress=false OVERRIDES`` in a new process started in the
    repository, with Hydra's short errors (HYDRA_FULL_ERROR=0); the CompletedProcess, with
    stdout and stderr as text."""
    env = dict(os.environ, HYDRA_FULL_ERROR="0")
    return subprocess.run([*KVSIM, f"output.dir={out}", "sim.progress=false", *overrides],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


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


def chunk_workload(seed, n=30):
    """Long prompts chunked over several steps while earlier requests decode: prompts of one
    of three families share prefixes (their keys are registered by one request and looked up
    or re-registered by others), outputs that differ (decodes finish during chunked
    prefills), arrivals spread so the waiting queue fills and empties, and closed-loop children
    (a finish releases one)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        inp = int(rng.integers(100, 900))
        fam = int(rng.integers(0, 3))
        rows.append(dict(arrival_s=float(rng.uniform(0, 3)), input_tokens=inp,
                         output_tokens=int(rng.integers(1, 120)),
                         prefix_ids=[fam * 1000 + j for j in range(-(-inp // 16))]))
    rows.sort(key=lambda r: r["arrival_s"])
    for p in (2, 11, 19):
        inp = int(rng.integers(100, 600))
        rows.append(dict(input_tokens=inp, output_tokens=int(rng.integers(1, 40)),
                         parent_request_id=p, think_s=float(rng.choice([0.0, 0.01, 0.2])),
                         session_id=p, prefix_ids=[7000 + j for j in range(-(-inp // 16))]))
    return make_workload(rows, prefix_block_tokens=16)


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


def pytest_addoption(parser):
    parser.addoption(
        "--cpu-times", metavar="PATH", default=None,
        help="append each test's CPU time to PATH, one 'node id<TAB>seconds' line per test: user "
             "+ sys of the process that ran it (an xdist worker or pytest itself) and of the "
             "subprocesses it waited for, setup and teardown included. Unlike --durations' wall "
             "times it does not grow with other jobs on the machine.")


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = item.config.getoption("--cpu-times")
    t0 = _cpu_s()
    yield
    if path:
        with open(path, "a") as f:  # (one short line per write: workers' lines do not mix)
            f.write(f"{item.nodeid}\t{_cpu_s() - t0:.3f}\n")
