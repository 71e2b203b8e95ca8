"""``load_workload``: the format's loader (:data:`traces.registry.FORMATS`), then slice, rebase,
scale and build the table."""
from __future__ import annotations

import resource
import time
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from ._common import MAX_ARRIVAL_S, Parsed, is_int
from .cache import _input_fingerprint, parse_cached
from .config import TraceConfig, coerce_config, recorded_clock, resolve_path
from .errors import ErrorSink, TraceError
from .registry import FORMATS
from .slicing import kept_rows
from .workload import Workload, build_table

__all__ = ["load_workload", "generate_bench"]


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
    # the clock's origin: start_s, or (rebase_to_first_arrival, recorded clocks) the first kept
    # root's arrival, so that a slice of a trace whose clock starts late starts at 0 s
    origin = cfg.start_s
    if cfg.rebase_to_first_arrival and recorded_clock(cfg):
        first = float(arr[idx[parent[idx] < 0]].min())
        if first > origin:
            origin = first
    notes["rebase_s"] = float(origin - cfg.start_s)
    arrival = (arr[idx] - origin) * cfg.time_scale
    late = np.flatnonzero(~(arrival <= MAX_ARRIVAL_S))
    if late.size:
        k = int(late[0])
        scaled = arr[idx[k]] - origin <= MAX_ARRIVAL_S  # (then time_scale took it there)
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
    fmt = FORMATS[c.format]

    def parse() -> Parsed:
        return fmt.load(path, c, rng, sink, int(seed))

    if path is None:  # generated: nothing to cache
        pr, cached = parse(), {"status": "off", "entry": None, "warnings": []}
    else:
        state0 = rng.bit_generator.state
        pr, cached = parse_cached(
            c, path, int(seed), sink, parse,
            # (a loader that reads the seed itself keys its entries by it always)
            seed_used=None if fmt.seed_keyed else (lambda: rng.bit_generator.state != state0))
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
    if notes["rebase_s"] > 0:
        warnings.append(f"arrivals counted from the first request's: it arrives at "
                        f"{c.start_s + notes['rebase_s']:,.9g} s on the trace clock and at 0 s "
                        f"here (trace.rebase_to_first_arrival=false counts from "
                        f"trace.start_s={c.start_s:g} instead)")
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


def generate_bench(*, num_prompts: int, input_len: int, output_len: int,
                   range_ratio: float = 0.0, max_concurrency: Optional[int] = None,
                   request_rate: Optional[float] = None, burstiness: float = 1.0,
                   prefix_tokens: int = 0, num_prefix_groups: int = 1, block_tokens: int = 16,
                   seed: int = 0, range_rule: str = "symmetric",
                   chain_assignment: str = "earliest_free"):
    """A serving benchmark's workload (:mod:`traces.formats.bench`'s docstring), ready for
    ``sim.run.run_simulation(cfg, workload=...)``.

    Args:
        num_prompts: prompts sent in all (``--num-prompts``).
        input_len: random prompt tokens around which lengths are drawn
            (``--random-input-len``); the prompt is ``prefix_tokens`` longer.
        output_len: generated tokens around which lengths are drawn (``--random-output-len``).
        range_ratio: spread of the lengths (``--random-range-ratio``), see ``range_rule``.
        max_concurrency: closed loop with this many requests in flight
            (``--max-concurrency``), or None.
        request_rate: open loop at this many requests per second (``--request-rate``), or
            None; exactly one of the two is set.
        burstiness: gamma shape of the open loop's inter-arrival times (``--burstiness``; 1 =
            Poisson, ``math.inf`` = fixed rate).
        prefix_tokens: shared prefix tokens at the start of every prompt
            (``--random-prefix-len``).
        num_prefix_groups: distinct shared prefixes, given out round robin.
        block_tokens: tokens per prefix id (G).
        seed: seeds every draw (the run's ``seed``); same arguments and seed give the same
            workload bit for bit.
        range_rule: ``symmetric`` (vLLM) or ``one_sided`` (InferenceMAX, SGLang).
        chain_assignment: ``earliest_free`` or ``round_robin``, how a closed loop deals
            prompts to its chains.

    Returns:
        :class:`traces.workload.Workload`, the table ``kvsim trace=... trace.format=bench``
        builds from the same values (:func:`traces.load_workload` makes it).

    Raises:
        TraceError: an argument out of range, naming it and what was expected.
    """
    from .formats.bench import bench_params

    bench_params(dict(num_prompts=num_prompts, input_len=input_len, output_len=output_len,
                      range_ratio=range_ratio, max_concurrency=max_concurrency,
                      request_rate=request_rate, burstiness=burstiness,
                      prefix_tokens=prefix_tokens, num_prefix_groups=num_prefix_groups,
                      block_tokens=block_tokens, range_rule=range_rule,
                      chain_assignment=chain_assignment))
    if not is_int(seed) or seed < 0:
        raise TraceError(field="seed", found=repr(seed), expected="an integer >= 0")
    cfg = TraceConfig(name="bench", format="bench", num_requests=num_prompts,
                      input_len=input_len, output_len=output_len, range_ratio=range_ratio,
                      range_rule=range_rule, max_concurrency=max_concurrency,
                      request_rate=request_rate, burstiness=burstiness,
                      prefix_tokens=prefix_tokens, num_prefix_groups=num_prefix_groups,
                      block_tokens=block_tokens, chain_assignment=chain_assignment)
    return load_workload(cfg, seed=seed)


from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
