"""``load_workload``: dispatch on ``cfg.format``, then slice, rebase, scale and build the table."""
from __future__ import annotations

import resource
import time
from typing import Any

import numpy as np
import pyarrow as pa

from ._common import MAX_ARRIVAL_S, Parsed
from .cache import _input_fingerprint, parse_cached
from .config import TraceConfig, coerce_config, resolve_path
from .errors import ErrorSink, TraceError
from .workload import Workload, build_table

__all__ = ["load_workload"]


def peak_rss_mb() -> float:
    """Peak resident memory of this process's own address space, MiB.

    Linux keeps ``getrusage().ru_maxrss`` across ``exec``, so a process started by a large parent
    (a test runner) would report the parent's peak; ``VmHWM`` in /proc/self/status is the high
    water mark of the current address space only. Falls back to ru_maxrss elsewhere.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


_peak_rss_mb = peak_rss_mb


def _roots_of(parent: np.ndarray) -> np.ndarray:
    """Index of each row's chain root (parents precede children)."""
    root = np.arange(parent.size, dtype=np.int64)
    kids = np.flatnonzero(parent >= 0)
    if kids.size:
        par = parent.tolist()
        r = root.tolist()
        for i in kids.tolist():
            r[i] = r[par[i]]
        root = np.asarray(r, dtype=np.int64)
    return root


def kept_rows(parent: np.ndarray, arr: np.ndarray, cfg: TraceConfig) -> np.ndarray:
    """The parsed rows the slicing keeps, in canonical order (int64 row indices): roots
    non-decreasing in arrival, each root's chain after it; roots (with their chains) arriving
    in ``[start_s, start_s + duration_s)`` on the trace clock; the first ``max_requests``.
    ``parent``: each row's parent row or -1 (parents precede children); ``arr``: arrivals (s)."""
    n = parent.size
    root = _roots_of(parent)
    order = None
    ra = arr[parent < 0]
    if ra.size > 1 and np.any(np.diff(ra) < 0):
        order = np.lexsort((np.arange(n), root, arr[root]))
    hi = np.inf if cfg.duration_s is None else cfg.start_s + cfg.duration_s
    keep_root = (arr[root] >= cfg.start_s) & (arr[root] < hi)
    idx = np.arange(n) if order is None else order
    idx = idx[keep_root[idx]]
    if cfg.max_requests is not None:
        idx = idx[: cfg.max_requests]
    return idx


def _finalize(pr: Parsed, cfg: TraceConfig) -> tuple[pa.Table, dict, np.ndarray]:
    n = pr.session_id.size
    parent = pr.parent
    if np.any(parent >= np.arange(n)):
        raise TraceError("internal: a parent does not precede its child", path=pr.source)
    arr = pr.arrival_s
    idx = kept_rows(parent, arr, cfg)
    notes = {"rows_before_slicing": int(n), "rows": int(idx.size)}
    if idx.size == 0:
        raise TraceError("no requests left after slicing", path=pr.source,
                         found=f"start_s={cfg.start_s}, duration_s={cfg.duration_s}, "
                               f"max_requests={cfg.max_requests}",
                         expected="a window containing at least one root arrival")
    contiguous = idx.size == 0 or (idx[-1] - idx[0] + 1 == idx.size and np.all(np.diff(idx) == 1))
    new_id = np.full(n, -1, dtype=np.int64)
    new_id[idx] = np.arange(idx.size)
    par = parent[idx]
    new_par = np.where(par >= 0, new_id[np.maximum(par, 0)], -1)
    if np.any((par >= 0) & (new_par < 0)):  # cannot happen: parents precede children
        raise TraceError("internal: slicing dropped a parent", path=pr.source)
    arrival = (arr[idx] - cfg.start_s) * cfg.time_scale
    late = np.flatnonzero(~(arrival <= MAX_ARRIVAL_S))
    if late.size:
        k = int(late[0])
        scaled = arr[idx[k]] - cfg.start_s <= MAX_ARRIVAL_S  # (then time_scale took it there)
        raise TraceError("arrival past the simulated clock's range", path=pr.source,
                         where=f"row {int(idx[k]) + 1} of the parsed trace (in file order)",
                         field="time_scale" if scaled else "timestamp",
                         found=f"an arrival at {arrival[k]:.6g} s (start_s={cfg.start_s:g}, "
                               f"time_scale={cfg.time_scale:g})",
                         expected="arrivals <= 2**32 s (~136 years), where float64 seconds still "
                                  "resolve a microsecond" + ("" if scaled else
                                                            "; a timestamp unit mix-up (ns for ms)?"))
    offs = pr.prefix_offsets
    if contiguous:
        a, b = int(idx[0]), int(idx[-1]) + 1
        o0, o1 = int(offs[a]), int(offs[b])
        new_offs = offs[a:b + 1] - o0
        values = pr.prefix_values[o0:o1]  # view, no copy
    else:
        lens = offs[idx + 1] - offs[idx]
        new_offs = np.zeros(idx.size + 1, dtype=np.int64)
        np.cumsum(lens, out=new_offs[1:])
        if lens.sum():
            starts = np.repeat(offs[idx], lens)
            within = np.arange(int(lens.sum())) - np.repeat(new_offs[:-1], lens)
            values = pr.prefix_values[starts + within]
        else:
            values = np.zeros(0, dtype=np.int64)
    # session ids renumbered densely in order of first appearance
    sess = pr.session_id[idx]
    _, first, inv = np.unique(sess, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    table = build_table(
        session_id=rank[inv],
        turn=pr.turn[idx],
        arrival_s=arrival,
        think_s=pr.think_s[idx],
        parent_request_id=new_par,
        input_tokens=pr.input_tokens[idx],
        output_tokens=pr.output_tokens[idx],
        prefix_offsets=new_offs,
        prefix_values=values,
        block_tokens=pr.block_tokens,
    )
    return table, notes, idx


def load_workload(cfg: Any = None, seed: int = 0) -> Workload:
    """Load (or generate) the workload described by ``cfg``.

    Args:
        cfg: :class:`TraceConfig`, an OmegaConf DictConfig / dict with its fields, or None
            (defaults: the bundled Mooncake 10-minute slice).
        seed: seeds every random choice (jitter, Poisson session arrivals, ServeGen and synthetic
            sampling). Same seed and config => identical table.

    Returns:
        :class:`Workload` whose table follows ``WORKLOAD_SCHEMA`` (rows ordered so that parents
        precede children and roots are in arrival order).

    Raises:
        TraceError: unknown format/name, missing file, malformed rows (with ``on_error=fail``),
            nothing left after slicing.
    """
    t0 = time.perf_counter()
    c = coerce_config(cfg)
    path = resolve_path(c)
    sink = ErrorSink(c.on_error)
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0x7ACE]))
    if c.format == "mooncake":
        from .mooncake import load_mooncake as fn
    elif c.format == "azure":
        from .azure import load_azure as fn
    elif c.format == "weka":
        from .weka import load_weka as fn
    elif c.format == "servegen":
        from .servegen import load_servegen as fn
    elif c.format == "bench":
        from .bench import generate as fn
    else:
        from .synthetic import generate as fn
    if c.format in ("mooncake", "azure", "weka"):
        def parse() -> Parsed:
            return fn(path, c, rng, sink)
    else:
        def parse() -> Parsed:
            return fn(path, c, rng, sink, seed=int(seed))
    if path is None:  # generated: nothing to cache
        pr, cached = parse(), {"status": "off", "entry": None, "warnings": []}
    else:
        state0 = rng.bit_generator.state
        pr, cached = parse_cached(
            c, path, int(seed), sink, parse,
            # (ServeGen's loader takes the seed itself: its entries are always the seed's own)
            seed_used=(lambda: rng.bit_generator.state != state0)
            if c.format in ("mooncake", "azure", "weka") else None)
    table, notes, idx = _finalize(pr, c)
    extra = {k: np.asarray(v)[idx] for k, v in pr.extra.items()}
    file_warnings = list(pr.warnings)
    if sink.count:
        file_warnings.append(f"{sink.count} bad row{'s' * (sink.count != 1)} skipped "
                             f"(on_error=skip)")
    if notes["rows"] < notes["rows_before_slicing"]:
        # the parser's counts are of the whole file (it is parsed, and cached, before slicing):
        # say so where the slice keeps fewer requests (the count warnings start with the count)
        whole = "file" if path is not None else "generated trace"
        scope = (f"in the whole {whole} ({notes['rows_before_slicing']:,} requests; the slice "
                 f"keeps {notes['rows']:,}): ")
        file_warnings = [scope + w if w[:1].isdigit() else w for w in file_warnings]
    warnings = file_warnings + cached["warnings"]
    allnotes = dict(pr.notes)
    allnotes.update(notes)
    # what was read (summary.json's trace_input; output.skip_completed compares it)
    if "input" in cached:
        allnotes["trace_input"] = cached["input"]
    else:
        try:
            allnotes["trace_input"] = None if path is None else _input_fingerprint(c.format, path)
        except OSError:  # (it was parsed, so this is a race with a change: unknown input)
            allnotes["trace_input"] = None
    allnotes["trace_cache"] = cached["status"]
    allnotes["trace_cache_entry"] = cached["entry"]
    allnotes["load_s"] = round(time.perf_counter() - t0, 3)
    allnotes["peak_rss_mb"] = round(_peak_rss_mb(), 1)
    allnotes["seed"] = int(seed)
    del pr
    return Workload(
        table=table,
        name=c.name,
        source=str(path) if path is not None else f"synthetic:{c.format}",
        prefix_block_tokens=int(table.column("prefix_block_tokens")[0].as_py()) if table.num_rows else 0,
        closed_loop=bool(np.any(table.column("parent_request_id").to_numpy() >= 0)),
        skipped=sink.as_dict(),
        warnings=warnings,
        notes=allnotes,
        extra=extra,
    )

from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
