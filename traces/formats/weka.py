"""WEKA kv-cache-tester agentic coding traces (``weka_traces.jsonl.xz``): one session per line.

Session fields: ``id``, ``block_size`` (tokens per hash id: 64 in the published traces; any
positive integer, the same on every line of a file, which sets the table's prefix granularity G),
``hash_id_scope`` ("local"), ``system_tokens``, ``tool_tokens``, ``requests``, and, read with
``session_arrival=absolute`` only, ``start_time`` (the session's absolute start: Unix seconds
or an ISO-8601 date and time). Request fields: ``t`` (s since session start, a number in
[0, 2**32]: past 2**32 s float64 seconds stop resolving a microsecond), ``type``, ``in``,
``out``, ``hash_ids`` (floor(in/block_size) ids, session-local), ``api_time``/``think_time``
(s, may be absent). ``type: "subagent"`` entries carry their own ``requests`` (``t`` relative to the
sub-agent's start) sharing the session's id space, plus ``duration_ms``, ``system_tokens``,
``tool_tokens``.

Mapping (closed loop):

* Main chain = the session's non-subagent requests in listed order. The first is a root arriving
  at the session start; request i > 0 has parent = request i-1 and think_s = its ``think_time``.
  When ``think_time`` is absent: think_s = t[i] - t[i-1] - api_time[i-1] (api_time absent: 0).
  In the data t[i] - t[i-1] matches api_time[i-1] + think_time[i] to within ~1 s (t is rounded).
  A derived negative value is set to 0 and counted in ``warnings``.
* Sub-agents: the marker's ``t`` is the sub-agent's *completion* time in session seconds (it equals
  the spawning request's finish + ``duration_ms`` within ~1 s in the data), so its start is
  ``t - duration_ms/1000`` (``t`` when duration_ms is null), which must be >= 0 (a sub-agent
  cannot start before its session: else a TraceError naming the line, session, request and
  ``t/duration_ms``; the published markers start 8 s or more into their sessions), and each of
  its requests' start + ``t`` at most 2**32 s. The sub-agent's requests form their
  own chain; its first request's parent is the main-chain request listed just before the marker,
  think_s = start - (parent.t + parent.api_time) (>= 0; clamped values counted in ``warnings``;
  the marker-relative ``t`` of the first sub-agent request is 0 in all 63 markers). Later
  sub-agent requests chain as the main chain does. The main-chain request after a sub-agent keeps
  its recorded think_time (which already includes the wait for the sub-agent). A marker before any
  main request becomes a root at session start + start. Sub-agent rows keep the session's
  session_id; turn counts within each chain.
* Session arrivals: the published traces carry no absolute session start (every session's first
  t is 0). ``poisson`` (the default): seeded exponential gaps at ``session_rate_per_s``, first
  session at 0, one draw per line of the file (skipped sessions keep the others' times stable).
  ``recorded``: session k (file line order) starts at k * ``session_interval_s``. ``absolute``:
  each session starts at its ``start_time``, counted from the earliest one (Unix time in
  ``notes['time_origin_unix_s']``); a session without one is an error naming its line.
* Children's arrival_s = session start + recorded t (informational; the simulator releases them
  by parent finish + think_s). An arrival (session start + t) of a row the loader keeps more than
  2**32 s after ``start_s`` (a far session start: a tiny ``session_rate_per_s`` or a huge
  ``session_interval_s``) is a TraceError naming that request's line, session, request and
  field ``t`` (also with ``on_error=skip``: the file is not at fault).
* Prefix ids: every ``hash_ids`` element must be a non-negative integer below 2**63 (JSON
  ``true``/``false`` or a number with a fraction or exponent, such as 3.0, is an error: not read
  as 1 or truncated), and no id may appear twice in one request (the ids are prefix-chained: one
  id names one prefix). Within a session every occurrence of an id must follow the same id (or
  start its request's ids) as its first occurrence does; a session that breaks it is an error
  naming both requests. Session-local ids are remapped to dense global ids (session by session,
  so (session, local id) -> global id is injective), in increasing local-id order within a
  session; the memory this takes is proportional to the session's id count, not to its largest
  id. With ``share_system_prefix`` the first floor((system_tokens + tool_tokens)/block_size) ids of the
  session's first main request (and, per sub-agent, of its first request with the marker's
  system/tool tokens) map to one global id per position shared by all sessions: an ASSUMPTION
  that all sessions use the same system prompt and tool definitions (an optimistic bound on
  cross-session prefix reuse).
* Rows are session-major (file order), chains interleaved in listed order; ``max_requests``
  therefore keeps whole sessions first.
* ``on_error=skip`` skips a whole session (line) with any bad request: chains cannot be cut.
"""
from __future__ import annotations

import gc
import itertools
import struct
import time
from dataclasses import dataclass
from pathlib import Path

from .._common import (INT64_LIMIT, MAX_ARRIVAL_S, JSONDecodeError, Parsed, SessionOptions,
                       check_session_options, counted, is_int, is_num, json_error_found, loads,
                       need_int, need_list, need_num, output_len)
from .._io import iter_lines
from ..errors import ErrorSink, TraceError
from ..registry import TraceFormat, register, session_arrival_of

BLOCK_TOKENS = 64  # (the published traces'; a file may declare another, the same on every line)
# request types of the main chain in the published trace (counted there: 'n' 40,192, 's' 8,466,
# beside 63 'subagent' markers); another type is loaded as main-chain with a warning
MAIN_TYPES = ("n", "s")


def _note_type(typ, counters: dict, where: str) -> None:
    """Count a request type other than MAIN_TYPES (with the first place it appears) for the
    loader's warning; such a request is loaded as an ordinary one."""
    if typ not in MAIN_TYPES:
        other = counters["other_types"]
        key = repr(typ)
        if key not in other:
            other[key] = [0, where]
        other[key][0] += 1


# A session's local ids are ranked through a table indexed by id when the table has at most
# _TABLE_PER_ID entries per id of the session (8 bytes each: under the ~40 bytes per id its parsed
# JSON list takes), else by sorting the distinct ids: memory stays proportional to the session's
# data whatever the ids' values. (Published trace: largest id / ids per session <= 0.4.)
_TABLE_PER_ID = 4


def _short(x) -> str:
    """``repr(x)``, cut to 40 characters (an integer of thousands of digits)."""
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


def _hash_ids(h: list, p: str, where: str) -> np.ndarray:
    """One request's ``hash_ids`` (a list) as an int64 array.

    Each element must be a non-negative integer below 2**63 (``INT64_LIMIT``; a bool is not an
    integer here, nor is a float such as 3.0), and no id may appear twice (prefix-chained ids:
    one id names one prefix).

    Raises:
        TraceError: naming ``where`` (file line, session, request), the field and the first bad
            element (its index, value and type) or the first repeated id.
    """
    import numpy as np
    try:  # C speed: packs ints in [-2**63, 2**63) (and bools, as 1 and 0), refuses the rest
        a = np.frombuffer(struct.pack(f"={len(h)}q", *h), dtype=np.int64)
    except (struct.error, TypeError, OverflowError):
        a = None
    if a is not None and a.size > 1 and (a[1:] > a[:-1]).all():
        # strictly increasing (every request of the published trace): no id repeats, the least
        # is the first, and only the first two can be 0 or 1 (where a bool would hide)
        ok, distinct = a[0] >= 0 and type(h[0]) is not bool and type(h[1]) is not bool, True
    else:
        ok = a is not None and (a.size == 0 or (int(a.min()) >= 0 and not any(
            type(h[j]) is bool for j in np.flatnonzero(a <= 1).tolist())))
        distinct = not ok or a.size < 2 or not (np.diff(np.sort(a)) == 0).any()
    if not ok:  # name the first bad element
        for j, x in enumerate(h):
            if not (is_int(x) and 0 <= x < INT64_LIMIT):
                # (orjson reads a JSON integer past 64 bits as a float)
                big = isinstance(x, float) and x.is_integer() and abs(x) >= INT64_LIMIT
                found = f"{x:.0f} (an integer past 64 bits)" if big else \
                    f"{_short(x)} ({type(x).__name__})"
                raise TraceError(path=p, where=where, field="hash_ids",
                                 found=f"element {j} = {found}",
                                 expected="non-negative integers below 2**63")
    if not distinct:  # name the first repeat
        seen: set = set()
        for j, x in enumerate(h):
            if x in seen:
                raise TraceError("id repeated within a request", path=p, where=where,
                                 field="hash_ids", found=f"id {x} again at element {j}",
                                 expected="distinct ids (prefix-chained: one id names one prefix)")
            seen.add(x)
    return a


def _rank(local: np.ndarray) -> tuple[int, np.ndarray]:
    """``(number of distinct ids, rank of each element among them in increasing order)`` of a
    non-empty int64 array of ids >= 0; memory O(``local.size``) (see ``_TABLE_PER_ID``)."""
    import numpy as np
    hi = int(local.max())
    if hi < _TABLE_PER_ID * local.size:
        table = np.zeros(hi + 1, dtype=np.int64)
        table[local] = 1  # present
        np.cumsum(table, out=table)
        table -= 1  # rank of each present id
        return int(table[-1]) + 1, table[local]
    distinct = np.unique(local)
    return int(distinct.size), np.searchsorted(distinct, local)


def _check_chained(local: np.ndarray, rank: np.ndarray, n_distinct: int, lens: list[int],
                   wheres: list[str], p: str) -> None:
    """Raise a TraceError unless one session's ids are prefix-chained: every occurrence of an id
    follows the same id (or starts its request's ids), as its first occurrence does (the rule
    the Mooncake loader checks across its file; ``sim.keys``: an id stands for the whole prefix
    up to its block). ``local``: the session's ids, its rows' ids end to end (row ``r`` has
    ``lens[r]``), ``rank``: each id's rank among the ``n_distinct`` distinct ones, ``wheres``:
    each row's place for the message. O(ids): each id is given one parent (whichever occurrence
    the assignment keeps); a mismatch anywhere means two parents."""
    import numpy as np
    n = len(rank)
    parent = np.empty(n, dtype=np.int64)
    parent[1:] = rank[:-1]
    starts = np.cumsum(lens[:-1]) if len(lens) > 1 else np.zeros(0, dtype=np.int64)
    parent[0] = -1
    parent[starts[starts < n]] = -1  # (a row without ids shares its start with the next row)
    one = np.full(n_distinct, -2, dtype=np.int64)
    one[rank] = parent
    if (one[rank] == parent).all():
        return
    first: dict = {}  # (the error path) the first occurrence in row order that breaks the rule
    for i, (r, q) in enumerate(zip(rank.tolist(), parent.tolist())):
        f = first.setdefault(r, i)
        if parent[f] != q:
            break
    ends = np.cumsum(lens)
    row_of = lambda j: int(np.searchsorted(ends, j, side="right"))  # noqa: E731
    pos = lambda j: j - (int(ends[row_of(j) - 1]) if row_of(j) else 0)  # noqa: E731
    desc = lambda j: ("starts the request's ids" if parent[j] < 0  # noqa: E731
                      else f"follows id {int(local[j - 1])}")
    raise TraceError("ids not prefix-chained", path=p, where=wheres[row_of(i)], field="hash_ids",
                     found=f"id {int(local[i])} {desc(i)} (position {pos(i)}); in "
                           f"{wheres[row_of(f)]} it {desc(f)} (position {pos(f)})",
                     expected="prefix-chained ids: an id always follows the same id (or always "
                              "starts the request's ids)")


def _think(req: dict, prev: dict, p: str, where: str, neg: list) -> float:
    tt = req.get("think_time")
    if tt is not None:
        if not is_num(tt) or not 0 <= tt <= MAX_ARRIVAL_S:
            raise TraceError(path=p, where=where, field="think_time", found=repr(tt),
                             expected="a number in [0, 2**32] s (past 2**32 s float64 seconds stop "
                                      "resolving a microsecond) or absent")
        return float(tt)
    api = prev.get("api_time")
    d = req["t"] - prev["t"] - (api if is_num(api) else 0.0)
    if d < 0:
        neg[0] += 1
        return 0.0
    return float(d)


def _need_t(r: dict, p: str, where: str) -> float:
    """``r['t']``: a finite number in [0, 2**32] s (``MAX_ARRIVAL_S``), or a TraceError naming
    ``where`` and the field ``t``."""
    t = need_num(r, "t", path=p, where=where, minimum=0)
    if t > MAX_ARRIVAL_S:
        raise TraceError(path=p, where=where, field="t", found=f"{t:g}",
                         expected="a number in [0, 2**32] s (seconds since the session start; "
                                  "past 2**32 s float64 seconds stop resolving a microsecond)")
    return t


def _check_request(r: dict, p: str, where: str, zero_output: str,
                   zero: list, bs: int = BLOCK_TOKENS) -> tuple[int, int, np.ndarray]:
    _need_t(r, p, where)
    n_in = need_int(r, "in", path=p, where=where, minimum=1)
    n_out = need_int(r, "out", path=p, where=where, minimum=0)
    h = need_list(r, "hash_ids", path=p, where=where,
                  expected="a list of non-negative integers")
    want = n_in // bs
    if len(h) != want:
        raise TraceError(path=p, where=where, field="hash_ids", found=f"{len(h)} ids",
                         expected=f"floor({n_in}/{bs})={want}")
    h = _hash_ids(h, p, where)
    api = r.get("api_time")
    if api is not None and (not is_num(api) or api < 0):
        raise TraceError(path=p, where=where, field="api_time", found=repr(api),
                         expected="a number >= 0 or absent")
    n_out = output_len(n_out, zero_output, path=p, where=where, key="out", counter=zero)
    return n_in, n_out, h


def _parse_session(s, p: str, lineno: int, cfg, counters: dict):
    """Validate one session; return (sid, rows, ids, canon, wheres) in listed order.

    rows: list of (local_parent, turn, t_rel, think, in, out); ids: one int64 array of local ids
    per row; canon: (scope_name, row, number of leading ids) per shared system prefix; wheres:
    each row's place for error messages ("line L (session S, request K...)")."""
    where0 = f"line {lineno}"
    if not isinstance(s, dict):
        raise TraceError(path=p, where=where0, found=type(s).__name__, expected="a JSON object")
    sid = s.get("id")
    if sid is None:
        if "id" in s:
            raise TraceError(path=p, where=where0, field="id", found="null",
                             expected="a session id: a string or an integer")
        raise TraceError("missing field", path=p, where=where0, field="id", found="nothing",
                         expected="a session id")
    if not isinstance(sid, (str, int)) or isinstance(sid, bool):
        raise TraceError(path=p, where=where0, field="id", found=repr(sid)[:40],
                         expected="a session id: a string or an integer")
    bs = s.get("block_size", BLOCK_TOKENS)
    if not is_int(bs) or not 1 <= bs <= 1 << 20:
        raise TraceError(path=p, where=where0, field="block_size", found=repr(bs)[:40],
                         expected="a positive integer (tokens per hash id, e.g. 16, 32, 64)")
    known = counters.get("block_size")
    if known is not None and bs != known[0]:
        raise TraceError("block_size differs between sessions", path=p, where=where0,
                         field="block_size", found=bs,
                         expected=f"{known[0]}, as line {known[1]} declares (one table holds one "
                                  f"prefix-id granularity)")
    scope = s.get("hash_id_scope", "local")
    if scope != "local":
        raise TraceError(path=p, where=where0, field="hash_id_scope", found=repr(scope),
                         expected="'local'")
    reqs = s.get("requests")
    if not isinstance(reqs, list) or not reqs:
        raise TraceError(path=p, where=where0, field="requests",
                         found=repr(reqs)[:40] if reqs is not None else "nothing",
                         expected="a non-empty list")
    sys_tok = s.get("system_tokens", 0)  # (absent: 0; null, false or "" is an error below)
    tool_tok = s.get("tool_tokens", 0)
    if not (is_int(sys_tok) and is_int(tool_tok)) or sys_tok < 0 or tool_tok < 0:
        raise TraceError(path=p, where=where0, field="system_tokens/tool_tokens",
                         found=f"{sys_tok!r}/{tool_tok!r}", expected="non-negative integers")
    rows: list = []
    ids: list = []
    wheres: list = []
    canon: list = []  # (scope_name, row, number of leading ids)
    zero, neg = counters["zero"], counters["neg_think"]
    prev_main = None  # (row index, request dict)
    main_turn = 0
    for k, r in enumerate(reqs):
        where = f"line {lineno} (session {sid!r}, request {k})"
        if not isinstance(r, dict):
            raise TraceError(path=p, where=where, found=type(r).__name__, expected="a JSON object")
        typ = r.get("type")
        if typ == "subagent":
            mt = _need_t(r, p, where)
            sub = r.get("requests")
            if not isinstance(sub, list) or not sub:
                raise TraceError(path=p, where=where, field="requests",
                                 found=repr(sub)[:40] if sub is not None else "nothing",
                                 expected="a non-empty list of sub-agent requests")
            dur = r.get("duration_ms")
            if dur is not None and (not is_num(dur) or dur < 0):
                raise TraceError(path=p, where=where, field="duration_ms", found=repr(dur),
                                 expected="a number >= 0 or null")
            start = mt - dur / 1000.0 if dur is not None else mt
            if start < 0:
                raise TraceError("sub-agent starts before its session", path=p, where=where,
                                 field="t/duration_ms",
                                 found=f"t {mt:g} s - duration_ms {dur:g} / 1000 = start "
                                       f"{start:g} s",
                                 expected="t >= duration_ms/1000 (the sub-agent's start, t - "
                                          "duration_ms/1000, at or after the session start 0)")
            prev_sub = None
            for j, q in enumerate(sub):
                w2 = f"{where[:-1]}, sub-agent request {j})"
                if not isinstance(q, dict):
                    raise TraceError(path=p, where=w2, found=type(q).__name__, expected="a JSON object")
                if q.get("type") == "subagent":
                    raise TraceError(path=p, where=w2, field="type", found="'subagent'",
                                     expected="no nested sub-agents")
                _note_type(q.get("type"), counters, f"{p} {w2}")
                n_in, n_out, h = _check_request(q, p, w2, cfg.zero_output, zero, bs)
                t_rel = start + float(q["t"])
                if t_rel > MAX_ARRIVAL_S:
                    raise TraceError(path=p, where=w2, field="t",
                                     found=f"{q['t']:g} after the sub-agent's start {start:g} s "
                                           f"= {t_rel:g} s into the session",
                                     expected="at most 2**32 s into the session (past it float64 "
                                              "seconds stop resolving a microsecond)")
                if prev_sub is None:
                    if prev_main is None:
                        parent, think = -1, 0.0
                    else:
                        pm = prev_main[1]
                        api = pm.get("api_time")
                        think = start - float(pm["t"]) - (api if is_num(api) else 0.0)
                        if think < 0:
                            counters["neg_sub_think"][0] += 1
                            think = 0.0
                        parent = prev_main[0]
                    if cfg.share_system_prefix:
                        a, b = r.get("system_tokens", 0), r.get("tool_tokens", 0)
                        if not (is_int(a) and is_int(b)) or a < 0 or b < 0:
                            raise TraceError(path=p, where=where, field="system_tokens/tool_tokens",
                                             found=f"{a!r}/{b!r}",
                                             expected="non-negative integers (the sub-agent's marker)")
                        canon.append(("subagent", len(rows), len(h[: (a + b) // bs])))
                else:
                    parent = len(rows) - 1
                    think = _think(q, prev_sub, p, w2, neg)
                    if q["t"] < prev_sub["t"]:
                        raise TraceError(path=p, where=w2, field="t", found=q["t"],
                                         expected=f">= previous t {prev_sub['t']}")
                rows.append((parent, j, t_rel, think, n_in, n_out))
                ids.append(h)
                wheres.append(w2)
                prev_sub = q
            counters["subagents"] += 1
            continue
        if not isinstance(typ, str):
            raise TraceError(path=p, where=where, field="type", found=repr(typ),
                             expected="a string")
        _note_type(typ, counters, f"{p} {where}")
        n_in, n_out, h = _check_request(r, p, where, cfg.zero_output, zero, bs)
        if prev_main is None:
            parent, think = -1, 0.0
            if cfg.share_system_prefix:
                canon.append(("main", len(rows), len(h[: (sys_tok + tool_tok) // bs])))
        else:
            if r["t"] < prev_main[1]["t"]:
                raise TraceError(path=p, where=where, field="t", found=r["t"],
                                 expected=f">= previous main-chain t {prev_main[1]['t']}")
            parent = prev_main[0]
            think = _think(r, prev_main[1], p, where, neg)
        rows.append((parent, main_turn, float(r["t"]), think, n_in, n_out))
        ids.append(h)
        wheres.append(where)
        prev_main = (len(rows) - 1, r)
        main_turn += 1
    return sid, rows, ids, canon, wheres, bs


def _session_start(s: dict, p: str, lineno: int) -> float:
    """The session's recorded absolute start (``session_arrival=absolute``): its ``start_time``,
    Unix seconds (a finite number >= 0) or an ISO-8601 date and time (UTC without a zone)."""
    v = s.get("start_time")
    if isinstance(v, str):
        from .claude_code import parse_time

        return parse_time(v, path=p, where=f"line {lineno}", key="start_time")
    if not is_num(v) or not 0 <= v < float("inf"):
        raise TraceError("missing field" if v is None else None, path=p, where=f"line {lineno}",
                         field="start_time", found="nothing" if v is None else repr(v)[:40],
                         expected="the session's absolute start with session_arrival=absolute: "
                                  "Unix seconds or an ISO-8601 date and time (the published "
                                  "traces have none: session_arrival=poisson or recorded)")
    return float(v)


def _check_clock(arrival: np.ndarray, parent: np.ndarray, session: np.ndarray,
                 sess_start: list, sess_line: list, cfg, path: Path) -> None:
    """Raise a TraceError naming the line, session, request and field ``t`` of the first row
    (in the loader's canonical order, among the rows its ``start_s`` / ``duration_s`` /
    ``max_requests`` slicing keeps) whose arrival, session start + t, is more than 2**32 s
    after ``start_s``: the loader's own range check could name only "row N of the parsed trace"
    and a field 'timestamp' Weka lacks. Each ``t`` is within 2**32 s of its session's start
    (checked per request), so the session start (``session_arrival``) takes part in it: the
    message gives both. Called only when some arrival is that late (the rows are the loader's
    :func:`traces.loader.kept_rows`; the late row's session line is parsed again for its
    request's place)."""
    import numpy as np
    from ..slicing import kept_rows

    p = str(path)
    idx = kept_rows(parent, arrival, cfg)
    late = np.flatnonzero(arrival[idx] - cfg.start_s > MAX_ARRIVAL_S)
    if not late.size:
        return
    row = int(idx[late[0]])
    k = int(session[row])
    first = int(np.searchsorted(session, k))  # rows are session-major
    where = f"line {sess_line[k]}"
    for lineno, raw in iter_lines(path, "a JSONL text file"):
        if lineno == sess_line[k]:
            counters = {"zero": [0], "neg_think": [0], "neg_sub_think": [0], "subagents": 0,
                        "other_types": {}}
            where = _parse_session(loads(raw), p, lineno, cfg, counters)[4][row - first]
            break
    mode = session_arrival_of(cfg)
    how = (f"session_arrival=poisson, session_rate_per_s={cfg.session_rate_per_s:g}"
           if mode == "poisson" else
           f"session_arrival=recorded, session_interval_s={cfg.session_interval_s:g}"
           if mode == "recorded" else "session_arrival=absolute, counted from the earliest "
                                      "start_time")
    raise TraceError(
        "arrival past the simulated clock's range", path=p, where=where,
        field="t", found=f"session start {sess_start[k]:.6g} s ({how}) + t "
                         f"{arrival[row] - sess_start[k]:.6g} s = {arrival[row]:.6g} s, "
                         f"{arrival[row] - cfg.start_s:.6g} s after start_s={cfg.start_s:g}",
        expected="arrivals at most 2**32 s (~136 years) after start_s, where float64 seconds "
                 "still resolve a microsecond",
        hint="Session starts come from trace.session_arrival: a higher session_rate_per_s, a "
             "smaller session_interval_s, fewer sessions (max_sessions) or a later start_s keeps "
             "them in range")


def load_weka(path: Path, cfg, rng: np.random.Generator, sink: ErrorSink) -> Parsed:
    """Stream a Weka agentic JSONL(.xz) file line by line (see module docstring).

    Memory: the flat prefix-id buffer (int64) grows in place with ``ndarray.resize`` (realloc),
    so the peak is about the final table plus one session's parsed JSON; remapping a session's
    local ids takes memory proportional to its id count (not to the value of its largest id).

    Raises:
        TraceError: bad JSON, missing/mistyped field, in < 1, out < 0, hash_ids count !=
            floor(in/64), a hash_ids element that is not a non-negative integer below 2**63
            (bool, float, string, ...), an id repeated within a request, ids not
            prefix-chained within a session, decreasing t within a
            chain, duplicate session id, a block_size that is not a positive integer or differs
            from the first session's, non-local id scope, a missing start_time with
            session_arrival=absolute, corrupt/truncated
            .xz, empty file. Each names the file line (and the session/request when it is one
            request's fault).
    """
    import numpy as np
    p = str(path)
    t0 = time.perf_counter()
    cap = 1 << 22
    vals = np.empty(cap, dtype=np.int64)
    nvals = 0
    offs: list[int] = [0]
    col_session: list[int] = []
    col_turn: list[int] = []
    col_arrival: list[float] = []
    col_think: list[float] = []
    col_parent: list[int] = []
    col_in: list[int] = []
    col_out: list[int] = []
    seen: dict = {}
    sess_start: list[float] = []  # each kept session's start and file line (for _check_clock)
    sess_line: list[int] = []
    shared: dict = {}
    next_gid = 0
    counters = {"zero": [0], "neg_think": [0], "neg_sub_think": [0], "subagents": 0,
                "other_types": {}, "block_size": None}
    mode = session_arrival_of(cfg)
    sessions = 0
    lines_read = 0
    poisson_t = 0.0
    gc_was = gc.isenabled()
    gc.disable()  # the parsed sessions hold no cycles; GC passes only cost time here
    try:
        for lineno, raw in iter_lines(path, "a JSONL text file"):
            if cfg.max_sessions is not None and sessions >= cfg.max_sessions:
                break
            k = lines_read
            lines_read += 1
            if mode == "poisson":
                if k > 0:
                    poisson_t += rng.exponential(1.0 / cfg.session_rate_per_s)
                start = poisson_t
            elif mode == "recorded":
                start = k * cfg.session_interval_s
            try:
                try:
                    s = loads(raw)
                except JSONDecodeError as e:
                    raise TraceError("invalid JSON", path=p, where=f"line {lineno}",
                                     found=json_error_found(raw, e),
                                     expected="one JSON object per line") from None
                sid, rows, ids, canon, wheres, bs = _parse_session(s, p, lineno, cfg, counters)
                if mode == "absolute":
                    start = _session_start(s, p, lineno)
                if sid in seen:
                    raise TraceError("duplicate session id", path=p, where=f"line {lineno}",
                                     field="id", found=repr(sid),
                                     expected=f"unique ids (first at line {seen[sid]})")
                lens = [len(h) for h in ids]
                total = sum(lens)
                local = np.concatenate(ids) if total else np.zeros(0, dtype=np.int64)
                del s, ids  # the parsed JSON and per-request arrays: only `local` is used below
                if total:
                    # global id of each distinct local id (indexed by its rank): the shared
                    # leading ids first, then fresh ids in increasing local-id order
                    n_distinct, rank = _rank(local)
                    _check_chained(local, rank, n_distinct, lens, wheres, p)
            except (TraceError, TypeError, ValueError, OverflowError) as e:
                if not isinstance(e, TraceError):
                    e = TraceError("malformed session", path=p, where=f"line {lineno}",
                                   found=f"{type(e).__name__}: {e}"[:120],
                                   expected="fields of the documented types")
                sink.bad(e)
                continue
            if total:
                gid = np.full(n_distinct, -1, dtype=np.int64)
                if canon:
                    starts = list(itertools.accumulate(lens, initial=0))
                    for scope, row, n in canon:
                        for j, rk in enumerate(rank[starts[row]:starts[row] + n].tolist()):
                            if gid[rk] >= 0:
                                continue
                            g = shared.get((scope, j))
                            if g is None:
                                g = shared[(scope, j)] = next_gid
                                next_gid += 1
                            gid[rk] = g
                need = gid < 0
                m = int(need.sum())
                gid[need] = np.arange(next_gid, next_gid + m, dtype=np.int64)
                next_gid += m
                if nvals + total > cap:
                    while nvals + total > cap:
                        cap = int(cap * 1.5)
                    vals.resize(cap, refcheck=False)  # realloc: grows in place / via mremap
                vals[nvals:nvals + total] = gid[rank]
            seen[sid] = lineno
            if counters["block_size"] is None:
                counters["block_size"] = (bs, lineno)
            sess_start.append(start)
            sess_line.append(lineno)
            base = len(col_session)
            for parent, turn, t_rel, think, n_in, n_out in rows:
                col_parent.append(parent + base if parent >= 0 else -1)
                col_turn.append(turn)
                col_arrival.append(start + t_rel)
                col_think.append(think)
                col_in.append(n_in)
                col_out.append(n_out)
                col_session.append(sessions)
            for n in lens:
                offs.append(offs[-1] + n)
            nvals += total
            sessions += 1
    finally:
        if gc_was:
            gc.enable()
    if sessions == 0:
        raise TraceError("no valid sessions", path=p,
                         found=f"{lines_read} lines, {sink.count} skipped",
                         expected="at least one valid session")
    arrival = np.asarray(col_arrival, dtype=np.float64)
    origin = None
    if mode == "absolute":  # (counted from the earliest session start)
        origin = min(sess_start)
        arrival -= origin
        sess_start = [x - origin for x in sess_start]
    cacheable = True
    if arrival.max() - cfg.start_s > MAX_ARRIVAL_S:
        # (it reads the slicing options: a result that passes it depends on them)
        cacheable = False
        _check_clock(arrival, np.asarray(col_parent, dtype=np.int64),
                     np.asarray(col_session, dtype=np.int64), sess_start, sess_line, cfg, path)
    vals.resize(nvals, refcheck=False)
    warnings = []
    for typ, (n, first) in sorted(counters["other_types"].items()):
        warnings.append(f"{counted(n, 'request has', 'requests have')} type {typ} (the "
                        f"trace's request types are "
                        f"{', '.join(repr(t) for t in MAIN_TYPES)}, and 'subagent' markers); "
                        f"loaded as ordinary requests (first: {first})")
    if counters["zero"][0]:
        warnings.append(f"{counted(counters['zero'][0], 'request', 'requests')} had out = 0; "
                        f"loaded as 1 "
                        "(zero_output=as_one)")
    if counters["neg_think"][0]:
        n = counters["neg_think"][0]
        warnings.append(f"{counted(n, 'derived think time', 'derived think times')} (no "
                        f"think_time) {'was' if n == 1 else 'were'} negative; set to 0")
    if counters["neg_sub_think"][0]:
        n = counters["neg_sub_think"][0]
        warnings.append(f"{counted(n, 'sub-agent start was', 'sub-agent starts were')} before "
                        "their parent's finish; think_s set to 0")
    if cfg.share_system_prefix:
        warnings.append("share_system_prefix: leading system+tool prompt ids shared across "
                        "sessions (assumption: identical system/tool prompts)")
    return Parsed(
        session_id=np.asarray(col_session, dtype=np.int64),
        turn=np.asarray(col_turn, dtype=np.int32),
        arrival_s=arrival,
        think_s=np.asarray(col_think, dtype=np.float64),
        parent=np.asarray(col_parent, dtype=np.int64),
        input_tokens=np.asarray(col_in, dtype=np.int64),
        output_tokens=np.asarray(col_out, dtype=np.int64),
        prefix_offsets=np.asarray(offs, dtype=np.int64),
        prefix_values=vals,
        block_tokens=counters["block_size"][0],
        source=p,
        warnings=warnings,
        notes={"sessions": sessions, "lines_read": lines_read, "subagents": counters["subagents"],
               "global_prefix_ids": next_gid, "shared_prefix_ids": len(shared),
               "zero_output_rows": counters["zero"][0],
               "block_size": counters["block_size"][0], "session_arrival": mode,
               **({"time_origin_unix_s": origin} if origin is not None else {}),
               "parse_s": round(time.perf_counter() - t0, 3)},
        cacheable=cacheable,
    )

@dataclass
class WekaOptions(SessionOptions):
    """Weka's options: those of sessions (:class:`traces._common.SessionOptions`)."""


register(TraceFormat(
    name="weka", options=WekaOptions, check=check_session_options,
    recorded_clock=lambda c: session_arrival_of(c) == "absolute",
    session_arrival_default="poisson", default_path="weka_agentic/weka_traces.jsonl.xz",
    load=lambda path, cfg, rng, sink, seed: load_weka(path, cfg, rng, sink)), __name__)


from .._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
