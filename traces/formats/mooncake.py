"""Mooncake (FAST'25) JSONL traces: ``timestamp`` (ms), ``input_length``, ``output_length``,
``hash_ids`` (prefix-chained ids of 512-token blocks, ``len == ceil(input_length/512)``, the last
block may be partial).

Open loop: every row is a root. Timestamps must be non-decreasing (the real files are).
arrival_s = timestamp / 1000 (the real files start at 0); a file whose first timestamp is a
wall clock (>= 1e9 ms, ~11.6 days; Unix-epoch milliseconds are ~1.7e12) is counted from its
first row instead (``trace.start_s`` too), with a warning naming the offset.

Timestamp buckets (``timestamp_spread``): the conversation trace records arrivals quantised into
~3 s buckets (up to ~30 requests share one timestamp). ``keep`` uses them as recorded (bursts);
``even`` (default) spreads the k requests sharing timestamp T evenly over [T, T_next) in file
order (request i at T + i*(T_next - T)/k), deterministic; ``jitter`` draws k seeded uniform
offsets in [T, T_next) and sorts them so file order is kept. For the last bucket T_next - T is the
median gap between distinct timestamps of the file (0 if the file has a single timestamp).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from .._common import (INT64_LIMIT, MAX_ARRIVAL_S, JSONDecodeError, Parsed, check_choice, counted,
                       is_int, json_error_found, loads, need_int, need_list, need_num, output_len,
                       short_repr)
from .._io import iter_lines
from ..errors import ErrorSink, TraceError
from ..registry import TraceFormat, register

BLOCK_TOKENS = 512
# a first timestamp at or past this (ms, ~11.6 days) is a wall clock (Unix-epoch ms are ~1.7e12):
# the file is counted from its first row; an earlier one is taken as written (the real files
# start at 0, and a slice of them keeps its clock for trace.start_s)
EPOCH_ORIGIN_MS = 1e9
FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")


def _element(x) -> str:
    """A bad ``hash_ids`` element as found: an int as is (``-2``); any other value with its
    type (``1.0 (float)``, ``True (bool)``, ``'3' (str)``), as the Weka loader names it; a
    float holding an integer of 2**63 or more (orjson's reading of a JSON integer past 64 bits)
    in full digits."""
    if is_int(x):
        return str(x)
    if isinstance(x, float) and x.is_integer() and abs(x) >= INT64_LIMIT:
        return f"{x:.0f} (an integer past 64 bits)"
    return f"{short_repr(x, 40)} ({type(x).__name__})"


def spread_timestamps(t: np.ndarray, mode: str, rng: np.random.Generator) -> np.ndarray:
    """Spread quantised, non-decreasing timestamps ``t`` (s) within their buckets (see module doc)."""
    import numpy as np
    if mode == "keep" or t.size == 0:
        return t.copy()
    uniq, start, counts = np.unique(t, return_index=True, return_counts=True)
    gaps = np.diff(uniq)
    last = float(np.median(gaps)) if gaps.size else 0.0
    width = np.append(gaps, last)
    group = np.repeat(np.arange(uniq.size), counts)
    pos = np.arange(t.size) - start[group]
    if mode == "even":
        return uniq[group] + pos * (width[group] / counts[group])
    # jitter: sorted uniform offsets within each bucket
    off = rng.uniform(0.0, 1.0, size=t.size) * width[group]
    # rows of a bucket are contiguous, so sorting (group, offset) gives each position its offset
    order = np.lexsort((off, group))
    return uniq[group] + off[order]


# The row's fields as they appear in its JSON text; no value in a row is a string, so each
# appears once in a valid row.
_KEYS = (b'"timestamp"', b'"input_length"', b'"output_length"', b'"hash_ids"')


def load_mooncake(path: Path, cfg, rng: np.random.Generator, sink: ErrorSink) -> Parsed:
    """Parse a Mooncake JSONL file. See module docstring for the mapping.

    Raises:
        TraceError: bad JSON, missing/mistyped field, input_length < 1, output_length < 0 (or 0
            with ``zero_output=error``), hash_ids count != ceil(input_length/512), negative ids,
            decreasing timestamp, a field repeated in a row, empty file.
    """
    import numpy as np
    p = str(path)
    ts: list[float] = []
    inp: list[int] = []
    out: list[int] = []
    offs: list[int] = [0]
    vals: list[int] = []
    zero = [0]
    last_ts = -math.inf
    rows = 0
    lines: list[int] = []  # file line of each row kept
    for lineno, raw in iter_lines(path, "a JSONL text file"):
        rows += 1
        where = f"line {lineno}"
        try:
            try:
                obj = loads(raw)
            except JSONDecodeError as e:
                raise TraceError("invalid JSON", path=p, where=where,
                                 found=json_error_found(raw, e),
                                 expected="one JSON object per line") from None
            if not isinstance(obj, dict):
                raise TraceError(path=p, where=where, found=type(obj).__name__,
                                 expected="a JSON object")
            for key in _KEYS:  # (the JSON parser keeps a repeated key's last value silently)
                if raw.count(key) > 1:
                    raise TraceError("repeated key", path=p, where=where,
                                     field=key.decode().strip('"'), found="it twice or more",
                                     expected="each field once per row")
            t = need_num(obj, "timestamp", path=p, where=where, minimum=0)
            n_in = need_int(obj, "input_length", path=p, where=where, minimum=1)
            n_out = need_int(obj, "output_length", path=p, where=where, minimum=0)
            h = need_list(obj, "hash_ids", path=p, where=where,
                          expected="a list of non-negative integers")
            want = -(-n_in // BLOCK_TOKENS)
            if len(h) != want:
                raise TraceError(path=p, where=where, field="hash_ids", found=f"{len(h)} ids",
                                 expected=f"ceil({n_in}/{BLOCK_TOKENS})={want}")
            for x in h:
                if not is_int(x) or not 0 <= x < INT64_LIMIT:
                    raise TraceError(path=p, where=where, field="hash_ids",
                                     found=f"element {_element(x)}",
                                     expected="non-negative integers below 2**63 (64-bit ids)")
            if t < last_ts:
                raise TraceError("timestamps must be non-decreasing", path=p, where=where,
                                 field="timestamp", found=f"{t:g}",
                                 expected=f">= previous timestamp {last_ts:g}")
            n_out = output_len(n_out, cfg.zero_output, path=p, where=where,
                               key="output_length", counter=zero)
        except TraceError as e:
            sink.bad(e)
            continue
        last_ts = t
        lines.append(lineno)
        ts.append(t)
        inp.append(n_in)
        out.append(n_out)
        vals.extend(h)
        offs.append(len(vals))
    if not ts:
        raise TraceError("no valid rows", path=p, found=f"{rows} rows, {sink.count} skipped",
                         expected="at least one valid row")
    vals_a = np.asarray(vals, dtype=np.int64)
    offs_a = np.asarray(offs, dtype=np.int64)
    del vals, offs
    _check_chained(vals_a, offs_a, lines, p)
    t_ms = np.asarray(ts, dtype=np.float64)
    late = np.flatnonzero(t_ms / 1000.0 > MAX_ARRIVAL_S)
    origin = float(t_ms[0])  # (the smallest: non-decreasing; exact for integer ms < 2**53)
    if origin >= EPOCH_ORIGIN_MS and not late.size:
        t_ms = t_ms - origin  # (a wall clock: counted from the first row)
    else:
        origin = 0.0
    t_s = t_ms / 1000.0
    if late.size:  # (before the spread moves other rows next to it)
        raise TraceError(path=p, where=f"line {lines[int(late[0])]}", field="timestamp",
                         found=f"{ts[int(late[0])]:g} ms",
                         expected=f"<= {MAX_ARRIVAL_S * 1000:.0f} ms (2**32 s, ~136 years: "
                                  f"where float64 seconds still resolve a microsecond); a unit "
                                  f"mix-up (ns for ms)?")
    arrival = spread_timestamps(t_s, cfg.timestamp_spread, rng)
    n = len(ts)
    warnings = []
    wide = _wide_spreads(t_s) if cfg.timestamp_spread != "keep" else None
    if wide:
        warnings.append(wide)
    if origin:
        warnings.append(f"timestamps start at {origin:.17g} ms (line {lines[0]}), a wall clock "
                        f"it seems: arrival times, trace.start_s and trace.duration_s are counted "
                        f"from there (arrival_s = (timestamp - {origin:.17g}) / 1000; timestamps "
                        f"are read as milliseconds)")
    if zero[0]:
        warnings.append(f"{counted(zero[0], 'row', 'rows')} had output_length 0; loaded as 1 "
                        f"(zero_output=as_one)")
    return Parsed(
        session_id=np.arange(n, dtype=np.int64),
        turn=np.zeros(n, dtype=np.int32),
        arrival_s=arrival,
        think_s=np.zeros(n),
        parent=np.full(n, -1, dtype=np.int64),
        input_tokens=np.asarray(inp, dtype=np.int64),
        output_tokens=np.asarray(out, dtype=np.int64),
        prefix_offsets=offs_a,
        prefix_values=vals_a,
        block_tokens=BLOCK_TOKENS,
        source=p,
        warnings=warnings,
        notes={"rows_read": rows, "zero_output_rows": zero[0],
               "distinct_timestamps": int(np.unique(t_s).size)},
    )


def _wide_spreads(t_s: np.ndarray) -> str | None:
    """A warning when ``timestamp_spread`` spreads requests sharing a timestamp over a gap longer
    than 30 s or 10x the file's median gap between distinct timestamps (``t_s``: seconds,
    non-decreasing): a burst followed by a quiet spell, it seems, not the ~3 s quantisation the
    spread is for (the real Mooncake files have no such gap); None otherwise."""
    import numpy as np
    uniq, counts = np.unique(t_s, return_counts=True)
    if uniq.size < 2:
        return None
    gaps = np.diff(uniq)
    med = float(np.median(gaps))
    wide = np.flatnonzero((counts[:-1] > 1) & ((gaps > 10 * med) | (gaps > 30.0)))
    if not wide.size:
        return None
    i = int(wide[0])
    return (f"{wide.size} timestamp(s) of the file shared by several requests are followed by "
            f"a gap longer than 30 s or 10x the file's median gap ({med:g} s), and timestamp_spread="
            f"even/jitter spreads their requests over it (first: {int(counts[i])} requests at "
            f"{uniq[i] * 1000:.17g} ms spread over {gaps[i]:g} s); if they are bursts, "
            f"trace.timestamp_spread=keep keeps them")


def _check_chained(vals: np.ndarray, offs: np.ndarray, lines: list[int], p: str) -> None:
    """Raise a TraceError unless the ids are prefix-chained across rows: every occurrence of an
    id follows the same id (or starts its prompt), as the first occurrence does. The block keys
    rely on it (``sim.keys``: an id stands for the whole prefix up to its block), so a trace
    that breaks it would get prefix hits no server could have. ``vals``: the kept rows' ids end
    to end, ``offs``: row ``i``'s ids are ``vals[offs[i]:offs[i + 1]]`` (every row has >= 1),
    ``lines``: each row's file line. Whole-file consistency, so an error even with
    ``on_error=skip``. O(ids log ids): 0.3 M ids in the Mooncake conversation trace."""
    import numpy as np
    if not len(vals):
        return
    parent = np.empty_like(vals)
    parent[1:] = vals[:-1]
    parent[offs[:-1]] = -1  # (ids are >= 0)
    order = np.argsort(vals, kind="stable")  # each id's occurrences in file order
    sv = vals[order]
    first = np.ones(len(sv), dtype=bool)
    first[1:] = sv[1:] != sv[:-1]
    first_parent = parent[order][np.maximum.accumulate(np.where(first, np.arange(len(sv)), 0))]
    bad = np.flatnonzero(parent[order] != first_parent)
    if not len(bad):
        return
    at = int(order[bad].min())  # the first breaking occurrence in file order
    x = int(vals[at])
    f = int(order[np.searchsorted(sv, x)])  # the id's first occurrence
    row_of = lambda i: int(np.searchsorted(offs, i, side="right")) - 1  # noqa: E731
    desc = lambda i: "starts the prompt" if parent[i] < 0 else f"follows id {int(parent[i])}"  # noqa: E731
    raise TraceError("ids not prefix-chained", path=p, where=f"line {lines[row_of(at)]}",
                     field="hash_ids",
                     found=f"id {x} {desc(at)} (position {at - offs[row_of(at)]}); at line "
                           f"{lines[row_of(f)]} it {desc(f)} (position {f - offs[row_of(f)]})",
                     expected="prefix-chained ids: an id always follows the same id (or always "
                              "starts the prompt)")

@dataclass
class MooncakeOptions:
    """Mooncake's options.

    Attributes:
        timestamp_spread: the quantised (~3 s) timestamps: ``keep`` | ``even`` | ``jitter``
            (the module docstring).
    """

    timestamp_spread: str = "even"


def _check(c) -> None:
    check_choice(c, "timestamp_spread", ("keep", "even", "jitter"))


register(TraceFormat(
    name="mooncake", options=MooncakeOptions, check=_check, recorded_clock=lambda c: True,
    default_path="mooncake/conversation_trace.jsonl",
    load=lambda path, cfg, rng, sink, seed: load_mooncake(path, cfg, rng, sink)), __name__)


from .._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
