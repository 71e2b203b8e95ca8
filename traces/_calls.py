"""API calls of agent sessions -> a :class:`~traces._common.Parsed` table (the Claude Code and
OpenAI-log loaders' common half; docs/AGENT_TRACES.md).

A loader hands over one entry per API call: its session, its *timing parent* (the call whose
finish, plus the recorded gap, releases it; -1 for a root), whether it starts a chain of its own
(a sub-agent's first call: turn 0 although it has a timing parent), its prompt and output
lengths, when it was sent and when its answer ended (Unix seconds), and ``shared``: how many
tokens of its parent's *stream* (the parent's prompt followed by the parent's answer) its prompt
starts with. The transcripts hold token counts, not tokens, so prefix ids are made up here, at
``G`` tokens per id (``trace.block_tokens``, default 16), prefix-chained as ``sim.keys`` reads
them:

* a call's first ``floor(shared / G)`` ids are its parent's stream ids: the parent's own prompt
  ids, then ids that stand for "the parent's prompt and answer up to here" (drawn the first time
  a child needs them, so two children that both continue the parent's answer get the same ids);
  its other ``floor(prompt / G)`` ids are new;
* with ``share_system_prefix`` a chain's first call (a root, or a sub-agent's first call) takes
  its first ``floor(min(hint, prompt) / G)`` ids from one pool shared by every chain, where
  ``hint`` is the tokens the provider served that call from its cache (an ASSUMPTION: those were
  the leading tokens every chain starts with, the agent's system prompt and tool definitions).

Times: a root arrives when it was sent; a child's ``think_s`` is its send time minus its
parent's end (negative values, clock skew, are set to 0 and counted). ``session_arrival``:
``absolute`` keeps the recorded wall clock (arrivals counted from the earliest call, whose Unix
time is ``notes['time_origin_unix_s']``); ``recorded`` starts session k (in order of first call)
at k x ``session_interval_s``, ``poisson`` at seeded exponential gaps of mean
1 / ``session_rate_per_s`` (the first at 0), each keeping its calls' recorded offsets.
``max_sessions`` keeps the first N sessions in that order. Rows are ordered parents first,
roots by arrival (ties: call order).
"""
from __future__ import annotations

import heapq
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ._common import Parsed, SessionOptions, check_session_options, counted
from .errors import TraceError
from .registry import TraceFormat, session_arrival_of

DEFAULT_BLOCK_TOKENS = 16
#: Names of the files read from a folder of transcripts or logs.
SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.xz")


@dataclass
class Calls:
    """The calls a loader found, one entry per call in its own order (see the module doc)."""

    session: list = field(default_factory=list)  # any hashable key
    parent: list = field(default_factory=list)  # timing parent's index, or -1
    new_chain: list = field(default_factory=list)  # bool: turn 0 although parent >= 0
    shared: list = field(default_factory=list)  # tokens of the parent's stream the prompt starts with
    hint: list = field(default_factory=list)  # provider cache-read tokens (share_system_prefix)
    prompt: list = field(default_factory=list)
    output: list = field(default_factory=list)
    send: list = field(default_factory=list)  # Unix s
    end: list = field(default_factory=list)  # Unix s (nan: unknown; the send time is used)
    where: list = field(default_factory=list)  # the call's place, for messages
    cached: list = field(default_factory=list)  # provider cache-read tokens (extra column)
    written: list = field(default_factory=list)  # provider cache-write tokens (may stay empty)

    def __len__(self) -> int:
        return len(self.session)


def _topological(parent: np.ndarray, arrival: np.ndarray, where: list, source: str) -> np.ndarray:
    """Row order: parents before children; among the rows ready, earliest arrival first (ties:
    call order). Raises TraceError naming a call on a cycle of parents."""
    import numpy as np
    n = parent.size
    kids: dict[int, list] = {}
    for i, p in enumerate(parent.tolist()):
        if p >= 0:
            kids.setdefault(p, []).append(i)
    heap = [(float(arrival[i]), i) for i in np.flatnonzero(parent < 0).tolist()]
    heapq.heapify(heap)
    order = []
    while heap:
        _, i = heapq.heappop(heap)
        order.append(i)
        for k in kids.get(i, ()):
            heapq.heappush(heap, (float(arrival[k]), k))
    if len(order) < n:
        seen = np.zeros(n, dtype=bool)
        seen[order] = True
        i = int(np.flatnonzero(~seen)[0])
        raise TraceError("calls whose parents form a cycle", path=source, where=where[i],
                         found="the call is among its own ancestors (parentUuid links that loop)",
                         expected="each call's chain leading back to a first call")
    return np.asarray(order, dtype=np.int64)


def build(calls: Calls, cfg, rng: np.random.Generator, *, source: str, warnings: list,
          notes: dict, provider_read: bool, provider_write: bool) -> Parsed:
    """The Parsed table of ``calls`` (see the module docstring); ``warnings`` / ``notes`` are the
    loader's, extended here. ``provider_read`` / ``provider_write``: whether ``calls.cached`` /
    ``calls.written`` are kept as the extra columns ``provider_cached_tokens`` /
    ``provider_cache_write_tokens``."""
    import numpy as np
    G = int(cfg.block_tokens) if cfg.block_tokens is not None else DEFAULT_BLOCK_TOKENS
    n = len(calls)
    parent = np.asarray(calls.parent, dtype=np.int64)
    send = np.asarray(calls.send, dtype=np.float64)
    end = np.asarray(calls.end, dtype=np.float64)
    end = np.where(np.isnan(end), send, end)
    prompt = np.asarray(calls.prompt, dtype=np.int64)
    output = np.asarray(calls.output, dtype=np.int64)
    # sessions in order of their first call (ties: first appearance)
    keys: dict = {}
    sess = np.empty(n, dtype=np.int64)
    for i, k in enumerate(calls.session):
        sess[i] = keys.setdefault(k, len(keys))
    n_sess = len(keys)
    start = np.full(n_sess, np.inf)
    np.minimum.at(start, sess, send)
    rank_order = np.lexsort((np.arange(n_sess), start))  # session ids by start
    rank = np.empty(n_sess, dtype=np.int64)
    rank[rank_order] = np.arange(n_sess)
    keep = np.ones(n, dtype=bool)
    if cfg.max_sessions is not None and n_sess > cfg.max_sessions:
        keep = rank[sess] < cfg.max_sessions
        notes["sessions_dropped"] = int(n_sess - cfg.max_sessions)
    orphan = keep & (parent >= 0) & ~keep[np.maximum(parent, 0)]
    parent = np.where(orphan, -1, parent)
    # session starts on the trace clock
    mode = session_arrival_of(cfg)
    if mode == "absolute":
        origin = float(send[keep].min())
        new_start = start - origin
        notes["time_origin_unix_s"] = origin
    elif mode == "recorded":
        new_start = rank * float(cfg.session_interval_s)
    else:  # poisson: one draw per session in start order, the first at 0
        gaps = rng.exponential(1.0 / cfg.session_rate_per_s, size=n_sess)
        gaps[0] = 0.0
        new_start = np.cumsum(gaps)[rank]
    arrival = send - start[sess] + new_start[sess]
    # think times (children): send minus the parent's end
    has_p = parent >= 0
    think = np.zeros(n)
    raw = send - end[np.maximum(parent, 0)]
    neg = has_p & (raw < 0)
    think[has_p] = np.maximum(raw[has_p], 0.0)
    # rows: kept calls, parents first
    idx_all = _topological(parent, arrival, calls.where, source)
    order = idx_all[keep[idx_all]]
    m = order.size
    row_of = np.full(n, -1, dtype=np.int64)
    row_of[order] = np.arange(m)
    # turns and prefix ids, parents first
    new_chain = np.asarray(calls.new_chain, dtype=bool)
    shared = np.asarray(calls.shared, dtype=np.int64)
    hint = np.asarray(calls.hint, dtype=np.int64) if calls.hint else np.zeros(n, dtype=np.int64)
    turn = np.zeros(n, dtype=np.int32)
    ids: list = [None] * n
    ext: dict[int, np.ndarray] = {}  # call -> ids past its own prompt ids (its answer's)
    pool = np.zeros(0, dtype=np.int64)  # share_system_prefix's shared leading ids
    next_id = 0
    for i in order.tolist():
        p = int(parent[i])
        nfull = int(prompt[i]) // G
        head = None
        if p >= 0 and not new_chain[i]:
            turn[i] = turn[p] + 1
            s = min(int(shared[i]), int(prompt[p]) + int(output[p]), int(prompt[i]))
            k = min(s // G, nfull)
            pids = ids[p]
            if k <= pids.size:
                head = pids[:k]
            else:
                e = ext.get(p, np.zeros(0, dtype=np.int64))
                need = k - pids.size
                if e.size < need:
                    add = need - e.size
                    e = np.concatenate([e, np.arange(next_id, next_id + add, dtype=np.int64)])
                    next_id += add
                    ext[p] = e
                head = np.concatenate([pids, e[:need]])
        elif cfg.share_system_prefix and hint[i] > 0:
            k = min(int(hint[i]), int(prompt[i])) // G
            if pool.size < k:
                add = k - pool.size
                pool = np.concatenate([pool, np.arange(next_id, next_id + add, dtype=np.int64)])
                next_id += add
            head = pool[:k]
        if head is None:
            head = np.zeros(0, dtype=np.int64)
        fresh = nfull - head.size
        ids[i] = np.concatenate([head, np.arange(next_id, next_id + fresh, dtype=np.int64)])
        next_id += fresh
    lens = np.asarray([ids[i].size for i in order.tolist()], dtype=np.int64)
    offs = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    vals = np.concatenate([ids[i] for i in order.tolist()]) if m else np.zeros(0, dtype=np.int64)
    # sessions renumbered in row order (the loader renumbers them again after slicing)
    extra = {}
    if provider_read:
        extra["provider_cached_tokens"] = np.asarray(calls.cached, dtype=np.int64)[order]
    if provider_write:
        extra["provider_cache_write_tokens"] = np.asarray(calls.written, dtype=np.int64)[order]
    n_neg = int(neg[keep].sum())
    if n_neg:
        warnings.append(f"{counted(n_neg, 'call was', 'calls were')} sent before the parent "
                        f"call's answer ended (recorded clocks); think_s set to 0")
    if cfg.share_system_prefix:
        warnings.append("share_system_prefix: each chain's first call takes its leading "
                        "provider-cached tokens from one prefix shared by every chain "
                        "(assumption: the same system prompt and tool definitions)")
    notes.update({
        "sessions": int(np.unique(sess[keep]).size), "calls": int(m),
        "chains": int(((parent[order] < 0) | new_chain[order]).sum()),
        "block_tokens": G, "session_arrival": mode, "prefix_ids": int(vals.size),
        "shared_prefix_ids": int(pool.size),
    })
    return Parsed(
        session_id=sess[order],
        turn=turn[order],
        arrival_s=arrival[order],
        think_s=think[order],
        parent=np.where(parent[order] >= 0, row_of[np.maximum(parent[order], 0)], -1),
        input_tokens=prompt[order],
        output_tokens=output[order],
        prefix_offsets=offs,
        prefix_values=vals,
        block_tokens=G,
        source=source,
        warnings=warnings,
        notes=notes,
        extra=extra,
    )

@dataclass
class AgentLogOptions(SessionOptions):
    """The options of agent transcripts and chat completion logs (``claude_code``,
    ``openai_log``; docs/AGENT_TRACES.md has the accepted fields and the mapping): those of
    sessions (:class:`traces._common.SessionOptions`; ``share_system_prefix``: the leading tokens
    each chain's first call read from the provider's cache are taken as one prefix shared by
    every chain, an assumption), and:

    Attributes:
        block_tokens: G, tokens per prefix id made up for the calls' prompts (>= 1); null: 16.
    """

    block_tokens: Optional[int] = None


def check_agent_log_options(c) -> None:
    """The checks of :class:`AgentLogOptions`' fields of ``c`` (raises TraceError naming the
    field)."""
    check_session_options(c)
    if c.block_tokens is not None and not (isinstance(c.block_tokens, int) and c.block_tokens >= 1):
        raise TraceError(field="block_tokens", found=repr(c.block_tokens),
                         expected="an integer >= 1 (tokens per prefix id) or null (16)")


#: ``trace.path`` hint of the agent log formats.
AGENT_LOG_HINT = ("Point trace.path at a transcript file or a folder of them (e.g. "
                  "`trace.path=~/.claude/projects/-home-me-myproject`; docs/AGENT_TRACES.md)")


def transcript_files(path: Path, kind: str = "transcript") -> list[Path]:
    """The files a folder ``path`` holds (recursively, names ending :data:`SUFFIXES`, sorted by
    their path), or ``[path]`` for a file. Raises TraceError when a folder holds none."""
    if not path.is_dir():
        return [path]
    files = sorted((q for q in path.rglob("*") if q.name.endswith(SUFFIXES) and q.is_file()),
                   key=lambda q: q.relative_to(path).as_posix())
    if not files:
        raise TraceError(f"no {kind} files in the folder", path=str(path),
                         found="no file named *.jsonl, *.jsonl.gz or *.jsonl.xz (searched "
                               "recursively)",
                         expected=f"{kind} files (docs/AGENT_TRACES.md)")
    return files


def agent_log_input_files(path: Path) -> Optional[list]:
    """The files the agent log loaders read from ``path``: ``[(name, file)]`` of a regular file,
    or of every transcript file in a folder (named by its path in the folder); None when
    ``path`` is neither, or a folder without one (the loader names it)."""
    if not path.is_dir():
        return [(path.name, path)] if stat.S_ISREG(path.stat().st_mode) else None
    try:
        files = transcript_files(path)
    except TraceError:
        return None
    return [(q.relative_to(path).as_posix(), q) for q in files]



def agent_log_format(name: str, load) -> TraceFormat:
    """The :class:`TraceFormat` of an agent-log format ``name`` (Claude Code transcripts,
    OpenAI-style logs): :class:`AgentLogOptions` and their checks, a file or folder as input,
    sessions arriving at their recorded times by default; ``load(path, cfg, rng, sink)`` parses
    the input."""
    return TraceFormat(
        name=name, options=AgentLogOptions, check=check_agent_log_options,
        input="trace file or folder", path_hint=AGENT_LOG_HINT, input_files=agent_log_input_files,
        recorded_clock=lambda c: session_arrival_of(c) == "absolute",
        session_arrival_default="absolute",
        load=lambda path, cfg, rng, sink, seed: load(path, cfg, rng, sink))

from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
