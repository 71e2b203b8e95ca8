"""Claude Code session transcripts (``~/.claude/projects/<project>/<session>.jsonl``) as agent
sessions of API calls (docs/AGENT_TRACES.md has the whole mapping).

``trace.path`` is one transcript file or a folder, read recursively: every file whose name ends
``.jsonl``, ``.jsonl.gz`` or ``.jsonl.xz`` (sub-agent files ``<session>/subagents/agent-*.jsonl``
and the older ``agent-*.jsonl`` beside the sessions included), in path order; a file of 0 bytes
is skipped and counted. All files form one pool of lines: a line is linked to its parent by
``parentUuid`` whatever file holds it.

Lines read (others, and lines without ``uuid``, such as ``summary`` or
``file-history-snapshot``, are passed over; a ``uuid`` seen before is a copy and is skipped):

* every line with a ``uuid`` (a non-empty string): ``parentUuid`` (string or null),
  ``logicalParentUuid`` (string or null, optional: a compaction's link over its cut),
  ``timestamp`` (ISO-8601 date and time; without a zone it is UTC), ``isSidechain`` (boolean,
  optional);
* an API call is an ``assistant`` line whose ``message`` has ``usage``: ``message.id`` (string),
  ``sessionId`` (string), ``usage.input_tokens`` and ``usage.output_tokens`` (integers >= 0),
  ``usage.cache_creation_input_tokens`` and ``usage.cache_read_input_tokens`` (integers >= 0,
  null or absent = 0). One response is written as several lines sharing ``message.id`` (one per
  content block): their input fields must agree (else an error naming both lines) and the call's
  output is the largest ``output_tokens`` among them; its usage is counted once. A response
  whose usage is all zero (the synthetic entries Claude Code writes for an API error or an
  interruption, ``model: "<synthetic>"``) is not a call: it is counted and passed over;
* a line whose ``toolUseResult.agentId`` is a string links that sub-agent to the call that
  spawned it (``sourceToolAssistantUUID``, else the line's parent).

Mapping: prompt = input + cache_creation + cache_read tokens; provider cache read =
cache_read (column ``provider_cached_tokens``), provider cache write = cache_creation
(``provider_cache_write_tokens``). A call's parent is the nearest call above its first line in
the ``parentUuid`` tree (through non-call lines; over a compaction's ``logicalParentUuid``):
the previous call of its chain. A sidechain's first call (``isSidechain: true``, no call above)
starts a chain of its own (turn 0); when its ``agentId`` is linked as above it is released by
the spawning call's finish, otherwise it is a root at its recorded time (Claude Code's
"Warmup" sub-agents). The prompt of a child continues its parent's: when it is at least as long
as the parent's it starts with the parent's prompt and answer, up to its own length
(``shared = min(parent prompt + parent output, prompt)``); when it is shorter (a rewind, an
edited context) or follows a compaction, the only evidence of what it shares is the provider's
cache read: ``shared = min(prompt, cache_read, parent prompt + parent output)`` (counted in
``notes['prompts_not_extending']``). Send time = the timestamp of the line above the call's
first line (the user prompt or tool result that was sent; the first line's own when there is
none); end = the latest timestamp among the call's lines. See :mod:`traces._calls` for ids,
think times and session arrivals.

``on_error=skip`` skips a bad line (its children may then lose their parent and start chains).
"""
from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path

from .._calls import Calls, agent_log_format, build, transcript_files
from .._common import JSONDecodeError, counted, is_int, json_error_found, loads, output_len
from .._io import iter_lines
from ..errors import ErrorSink, TraceError
from ..registry import register

_PROMPT_FIELDS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def parse_time(v, *, path: str, where: str, key: str = "timestamp") -> float:
    """An ISO-8601 date-and-time string as Unix seconds (a time without a zone is UTC), or a
    TraceError naming the field."""
    if not isinstance(v, str) or len(v) < 16:
        raise TraceError("missing field" if v is None else None, path=path, where=where,
                         field=key, found="nothing" if v is None else repr(v)[:40],
                         expected="an ISO-8601 date and time, e.g. 2025-07-20T18:30:28.444Z")
    try:
        d = _dt.datetime.fromisoformat(v)
    except ValueError:
        raise TraceError(path=path, where=where, field=key, found=repr(v)[:40],
                         expected="an ISO-8601 date and time, e.g. 2025-07-20T18:30:28.444Z"
                         ) from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=_dt.timezone.utc)
    return d.timestamp()


def _count(u: dict, key: str, *, path: str, where: str, optional: bool) -> int:
    v = u.get(key)
    if v is None and optional:
        return 0
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not is_int(v) or v < 0 or v >= 1 << 62:
        raise TraceError("missing field" if v is None else None, path=path, where=where,
                         field=f"message.usage.{key}",
                         found="nothing" if v is None else repr(v)[:40],
                         expected="an integer >= 0" + (" (or null)" if optional else ""))
    return v


def _opt_str(o: dict, key: str, *, path: str, where: str):
    v = o.get(key)
    if v is not None and not isinstance(v, str):
        raise TraceError(path=path, where=where, field=key, found=repr(v)[:40],
                         expected="a string or null")
    return v


class _Lines:
    """The pool of lines with a uuid (columns), and the calls among them."""

    def __init__(self):
        self.index: dict[str, int] = {}
        self.parent: list = []
        self.logical: list = []
        self.ts: list[float] = []
        self.call: list[int] = []
        self.where: list[str] = []
        # calls
        self.by_id: dict[str, int] = {}
        self.first: list[int] = []  # first line of each call
        self.usage: list[tuple] = []  # (input, cache_creation, cache_read)
        self.out: list[int] = []
        self.end: list[float] = []
        self.session: list[str] = []
        self.side: list[bool] = []
        self.agent: list = []
        self.msg: list[str] = []
        self.spawn: dict[str, str] = {}  # sub-agent id -> the line of the spawning call
        self.synthetic: set = set()
        self.copies = 0

    def add(self, o: dict, p: str, lineno: int, where_of) -> None:
        where = f"line {lineno}"
        u = o.get("uuid")
        if u is None:
            return
        if not isinstance(u, str) or not u:
            raise TraceError(path=p, where=where, field="uuid", found=repr(u)[:40],
                             expected="a non-empty string")
        if u in self.index:
            self.copies += 1
            return
        par = _opt_str(o, "parentUuid", path=p, where=where)
        logical = _opt_str(o, "logicalParentUuid", path=p, where=where)
        ts = parse_time(o.get("timestamp"), path=p, where=where)
        side = o.get("isSidechain", False)
        if not isinstance(side, bool):
            raise TraceError(path=p, where=where, field="isSidechain", found=repr(side)[:40],
                             expected="true or false")
        call = -1
        msg = o.get("message")
        if o.get("type") == "assistant" and isinstance(msg, dict) and "usage" in msg:
            call = self._call(o, msg, p, lineno, ts, side, where_of)
        tur = o.get("toolUseResult")
        if isinstance(tur, dict) and isinstance(tur.get("agentId"), str):
            src = o.get("sourceToolAssistantUUID")
            self.spawn.setdefault(tur["agentId"], src if isinstance(src, str) else par)
        self.index[u] = len(self.parent)
        self.parent.append(par)
        self.logical.append(logical)
        self.ts.append(ts)
        self.call.append(call)
        self.where.append(where_of(lineno))

    def _call(self, o: dict, msg: dict, p: str, lineno: int, ts: float, side: bool,
              where_of) -> int:
        where = f"line {lineno}"
        mid = msg.get("id")
        if not isinstance(mid, str) or not mid:
            raise TraceError("missing field" if mid is None else None, path=p, where=where,
                             field="message.id", found="nothing" if mid is None else repr(mid)[:40],
                             expected="the API response's id (a string)")
        usage = msg["usage"]
        if not isinstance(usage, dict):
            raise TraceError(path=p, where=where, field="message.usage", found=repr(usage)[:40],
                             expected="an object with input_tokens, output_tokens, "
                                      "cache_creation_input_tokens, cache_read_input_tokens")
        u3 = tuple(_count(usage, k, path=p, where=where, optional=k != "input_tokens")
                   for k in _PROMPT_FIELDS)
        out = _count(usage, "output_tokens", path=p, where=where, optional=False)
        if mid in self.synthetic:
            return -1
        c = self.by_id.get(mid)
        if c is None:
            if sum(u3) == 0:
                if out:
                    raise TraceError(path=p, where=where, field="message.usage",
                                     found=f"no prompt tokens and output_tokens {out}",
                                     expected="a prompt (input + cache_creation + cache_read "
                                              "tokens >= 1), or all zero for a synthetic entry")
                self.synthetic.add(mid)
                return -1
            sid = o.get("sessionId")
            if not isinstance(sid, str) or not sid:
                raise TraceError("missing field" if sid is None else None, path=p, where=where,
                                 field="sessionId", found="nothing" if sid is None else repr(sid)[:40],
                                 expected="the session's id (a string)")
            agent = o.get("agentId")
            c = self.by_id[mid] = len(self.first)
            self.first.append(len(self.parent))
            self.usage.append(u3)
            self.out.append(out)
            self.end.append(ts)
            self.session.append(sid)
            self.side.append(side)
            self.agent.append(agent if isinstance(agent, str) else None)
            self.msg.append(mid)
            return c
        if self.usage[c] != u3:
            first = self.where[self.first[c]]
            raise TraceError("usage differs between the lines of one API response", path=p,
                             where=where, field="message.usage",
                             found=f"input/cache_creation/cache_read tokens {u3}; {first} "
                                   f"(message {mid}) has {self.usage[c]}",
                             expected="the same prompt counts on every line of a response")
        self.out[c] = max(self.out[c], out)
        self.end[c] = max(self.end[c], ts)
        return c


def _nearest_calls(L: _Lines):
    """``anc(x)``: the nearest call at or above line ``x`` and whether the way there crossed a
    compaction (a ``logicalParentUuid`` link), memoised; and a counter of dangling parents."""
    memo: dict[int, tuple[int, bool]] = {}
    dangling = [0]

    def anc(x: int) -> tuple[int, bool]:
        path: list[tuple[int, bool]] = []
        on_path: set = set()
        while True:
            if x in memo:
                res = memo[x]
                break
            if L.call[x] >= 0:
                res = (L.call[x], False)
                break
            on_path.add(x)
            nxt, hop = L.parent[x], False
            if nxt is None and L.logical[x] is not None:
                nxt, hop = L.logical[x], True
            if nxt is None:
                res = (-1, False)
                break
            y = L.index.get(nxt)
            if y is None:
                dangling[0] += 1
                res = (-1, False)
                break
            if y in on_path or y == x:
                raise TraceError("parentUuid links that loop", path=None, where=L.where[y],
                                 field="parentUuid", found="a line among its own ancestors",
                                 expected="links leading back to a first line (parentUuid null)")
            path.append((x, hop))
            x = y
        memo.setdefault(x, res)
        c, comp = res
        for node, hop in reversed(path):
            comp = comp or hop
            memo[node] = (c, comp)
        return memo.get(path[0][0], res) if path else res

    return anc, dangling


def load_claude_code(path: Path, cfg, rng: np.random.Generator, sink: ErrorSink):
    """Read a Claude Code transcript file or folder (see the module docstring).

    Raises:
        TraceError: a line that is not a JSON object, a field of the wrong type (naming file,
            line and field), usage that differs between the lines of one response, a loop of
            parentUuid links, no API call found.
    """
    import numpy as np
    t0 = time.perf_counter()
    files = transcript_files(path)
    root = path if path.is_dir() else path.parent
    L = _Lines()
    empty = lines = 0
    for f in files:
        if f.stat().st_size == 0 and len(files) > 1:
            empty += 1
            continue
        p = str(f)
        shown = f.relative_to(root).as_posix()
        where_of = (lambda n, s=shown: f"{s} line {n}")
        for lineno, raw in iter_lines(f, "a JSONL text file"):
            lines += 1
            try:
                try:
                    o = loads(raw)
                except JSONDecodeError as e:
                    raise TraceError("invalid JSON", path=p, where=f"line {lineno}",
                                     found=json_error_found(raw, e),
                                     expected="one JSON object per line") from None
                if not isinstance(o, dict):
                    raise TraceError(path=p, where=f"line {lineno}", found=type(o).__name__,
                                     expected="a JSON object")
                L.add(o, p, lineno, where_of)
            except TraceError as e:
                sink.bad(e)
    n = len(L.first)
    src = str(path)
    if n == 0:
        raise TraceError("no API calls found", path=src,
                         found=f"{lines:,} lines in {len(files) - empty} file(s), "
                               f"{len(L.synthetic)} synthetic entries, {sink.count} skipped",
                         expected="Claude Code transcript lines of type 'assistant' with "
                                  "message.usage (docs/AGENT_TRACES.md)")
    anc, dangling = _nearest_calls(L)
    calls = Calls()
    zero = [0]
    counts = {"linked": 0, "unlinked": 0, "compactions": 0, "not_extending": 0}
    prompt = [sum(u) for u in L.usage]
    out = [output_len(o, cfg.zero_output, path=src, where=L.where[L.first[c]],
                      key="message.usage.output_tokens", counter=zero)
           for c, o in enumerate(L.out)]
    for c in range(n):
        x = L.first[c]
        par = L.parent[x]
        y = L.index.get(par) if par is not None else None
        send = min(L.ts[y], L.ts[x]) if y is not None else L.ts[x]
        pc, compact = anc(y) if y is not None else (-1, False)
        if y is None and par is not None:
            dangling[0] += 1
        if pc == c:  # (a response whose lines do not chain in file order)
            pc, compact = -1, False
        new_chain, shared = False, 0
        if pc < 0 and L.side[c] and L.agent[c] is not None and L.agent[c] in L.spawn:
            s = L.index.get(L.spawn[L.agent[c]]) if L.spawn[L.agent[c]] else None
            q = anc(s)[0] if s is not None else -1
            if 0 <= q != c:
                pc, new_chain = q, True
                counts["linked"] += 1
        if pc < 0 and L.side[c]:
            counts["unlinked"] += 1
        if pc >= 0 and not new_chain:
            cap = prompt[pc] + out[pc]
            if compact or prompt[c] < prompt[pc]:
                shared = min(prompt[c], L.usage[c][2], cap)
                counts["not_extending"] += 1
                counts["compactions"] += compact
            else:
                shared = min(cap, prompt[c])
        calls.session.append(L.session[c])
        calls.parent.append(pc)
        calls.new_chain.append(new_chain)
        calls.shared.append(shared)
        calls.hint.append(L.usage[c][2])
        calls.prompt.append(prompt[c])
        calls.output.append(out[c])
        calls.send.append(send)
        calls.end.append(L.end[c])
        calls.where.append(f"{L.where[x]} (message {L.msg[c]})")
        calls.cached.append(L.usage[c][2])
        calls.written.append(L.usage[c][1])
    warnings: list = []
    if zero[0]:
        warnings.append(f"{counted(zero[0], 'call', 'calls')} had output_tokens 0; loaded as 1 "
                        f"(zero_output=as_one)")
    if counts["not_extending"]:
        warnings.append(f"{counted(counts['not_extending'], 'call', 'calls')} did not extend "
                        f"the previous call of its chain (a shorter prompt, or after a "
                        f"compaction): their shared prefix is the provider's cache read")
    u = np.asarray(L.usage, dtype=np.int64)
    notes = {"files": len(files) - empty, "files_empty": empty, "lines": lines,
             "synthetic_entries": len(L.synthetic), "lines_copied": L.copies,
             "dangling_parents": dangling[0], "subagent_chains_linked": counts["linked"],
             "sidechain_chains_unlinked": counts["unlinked"],
             "compactions": counts["compactions"],
             "prompts_not_extending": counts["not_extending"],
             "zero_output_rows": zero[0],
             "provider_input_tokens": int(u[:, 0].sum()),
             "provider_cache_write_tokens": int(u[:, 1].sum()),
             "provider_cache_read_tokens": int(u[:, 2].sum())}
    pr = build(calls, cfg, rng, source=src, warnings=warnings, notes=notes,
               provider_read=True, provider_write=True)
    pr.notes["parse_s"] = round(time.perf_counter() - t0, 3)
    return pr

register(agent_log_format("claude_code", load_claude_code), __name__)


from .._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
