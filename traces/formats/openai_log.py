"""Logs of OpenAI-compatible chat completions (``/v1/chat/completions`` responses, one JSON
object per line, with a session id added) as agent sessions of API calls.

``trace.path`` is one file or a folder, read recursively (files ending ``.jsonl``, ``.jsonl.gz``
or ``.jsonl.xz``, in path order). Each non-blank line is one call, and must be a JSON object
whose keys are among:

============================  ========  =====================================================
key                           needed    value
============================  ========  =====================================================
``session_id``                one of    the conversation (string or integer); ``conversation_id``
``conversation_id``           the two   is the same, under its other common name (not both)
``created``                   yes       Unix seconds the request was made (a number >= 0; the
                                        response's ``created``)
``completed_at``              no        Unix seconds its answer ended (a number >= created)
``usage``                     yes       object, keys among: ``prompt_tokens`` (integer >= 1,
                                        needed), ``completion_tokens`` (integer >= 0, needed),
                                        ``total_tokens`` (= prompt + completion when given),
                                        ``prompt_tokens_details`` (null, or an object with keys
                                        among ``cached_tokens``, an integer in [0,
                                        prompt_tokens] or null, and ``audio_tokens``),
                                        ``completion_tokens_details`` (null or an object:
                                        not read)
``id``, ``model``,            no        strings (not read); ``object``, when given, is
``system_fingerprint``,                 ``"chat.completion"``
``service_tier``, ``object``
``choices``                   no        an array (not read)
============================  ========  =====================================================

Anything else (another key, a value of another type, a missing needed key) is an error naming
the file, the line and the field.

Mapping: the calls of a session form one chain in ``created`` order (ties: file order); each
call's parent is the call before it. A call's prompt starts with its parent's prompt and answer
up to its own length when it is at least as long as the parent's prompt (``shared =
min(parent prompt + parent completion, prompt)``); when it is shorter, with what the provider
served from its cache (``min(prompt, cached_tokens, parent prompt + parent completion)``). When
the parent's ``completed_at`` is after the call's ``created`` (two calls of one session in
flight at once) the call is a root at its own time with a prompt of its own (counted). A child's
think time is its ``created`` minus its parent's ``completed_at`` (without ``completed_at``: minus
the parent's ``created``, so the gap includes the parent's recorded latency, counted in a
warning). ``provider_cached_tokens`` = ``cached_tokens`` when some line reports it. See
:mod:`traces._calls` for ids, think times and session arrivals.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

from .._calls import Calls, agent_log_format, build, transcript_files
from .._common import (JSONDecodeError, counted, is_int, is_num, json_error_found, loads,
                      output_len)
from .._io import iter_lines
from ..errors import ErrorSink, TraceError
from ..registry import register

TOP_KEYS = ("session_id", "conversation_id", "created", "completed_at", "usage", "id", "object",
            "model", "choices", "system_fingerprint", "service_tier")
USAGE_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details",
              "completion_tokens_details")
PROMPT_DETAIL_KEYS = ("cached_tokens", "audio_tokens")


def _int(obj: dict, key: str, name: str, *, p: str, where: str, lo: int, optional: bool = False):
    v = obj.get(key)
    if v is None and optional:
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if not is_int(v) or v < lo or v >= 1 << 62:
        raise TraceError("missing field" if key not in obj else None, path=p, where=where,
                         field=name, found="nothing" if key not in obj else repr(v)[:40],
                         expected=f"an integer >= {lo}" + (" or null" if optional else ""))
    return v


def _time(obj: dict, key: str, *, p: str, where: str, optional: bool = False):
    v = obj.get(key)
    if v is None and optional and key not in obj:
        return None
    if not is_num(v) or not math.isfinite(v) or v < 0:
        raise TraceError("missing field" if key not in obj else None, path=p, where=where,
                         field=key, found="nothing" if key not in obj else repr(v)[:40],
                         expected="Unix seconds (a finite number >= 0)")
    return float(v)


def _only(obj: dict, allowed: tuple, name: str, *, p: str, where: str) -> None:
    for k in obj:
        if k not in allowed:
            raise TraceError("unknown field", path=p, where=where,
                             field=f"{name}{k}" if name else k, found=repr(obj[k])[:40],
                             expected=f"only the keys {', '.join(allowed)} "
                                      f"(docs/AGENT_TRACES.md)")


def parse_line(o, p: str, where: str) -> tuple:
    """One log line -> ``(session, created, completed or None, prompt, completion, cached or
    None)``; a TraceError naming the field for anything outside the schema."""
    if not isinstance(o, dict):
        raise TraceError(path=p, where=where, found=type(o).__name__, expected="a JSON object")
    _only(o, TOP_KEYS, "", p=p, where=where)
    if "session_id" in o and "conversation_id" in o:
        raise TraceError(path=p, where=where, field="session_id/conversation_id",
                         found="both", expected="one of the two")
    key = "session_id" if "session_id" in o else "conversation_id"
    sid = o.get(key)
    if not (isinstance(sid, str) and sid) and not is_int(sid):
        raise TraceError("missing field" if key not in o else None, path=p, where=where,
                         field="session_id" if key not in o else key,
                         found="nothing" if key not in o else repr(sid)[:40],
                         expected="the conversation's id (a non-empty string or an integer)")
    created = _time(o, "created", p=p, where=where)
    done = _time(o, "completed_at", p=p, where=where, optional=True)
    if done is not None and done < created:
        raise TraceError(path=p, where=where, field="completed_at", found=f"{done:g}",
                         expected=f">= created ({created:g})")
    if "object" in o and o["object"] != "chat.completion":
        raise TraceError(path=p, where=where, field="object", found=repr(o["object"])[:40],
                         expected="'chat.completion'")
    for k in ("id", "model", "system_fingerprint", "service_tier"):
        if k in o and o[k] is not None and not isinstance(o[k], str):
            raise TraceError(path=p, where=where, field=k, found=repr(o[k])[:40],
                             expected="a string or null")
    if "choices" in o and not isinstance(o["choices"], list):
        raise TraceError(path=p, where=where, field="choices", found=repr(o["choices"])[:40],
                         expected="an array")
    u = o.get("usage")
    if not isinstance(u, dict):
        raise TraceError("missing field" if "usage" not in o else None, path=p, where=where,
                         field="usage", found="nothing" if "usage" not in o else repr(u)[:40],
                         expected="an object with prompt_tokens and completion_tokens")
    _only(u, USAGE_KEYS, "usage.", p=p, where=where)
    prompt = _int(u, "prompt_tokens", "usage.prompt_tokens", p=p, where=where, lo=1)
    comp = _int(u, "completion_tokens", "usage.completion_tokens", p=p, where=where, lo=0)
    total = _int(u, "total_tokens", "usage.total_tokens", p=p, where=where, lo=0, optional=True)
    if total is not None and total != prompt + comp:
        raise TraceError(path=p, where=where, field="usage.total_tokens", found=total,
                         expected=f"prompt_tokens + completion_tokens = {prompt + comp}")
    cached = None
    d = u.get("prompt_tokens_details")
    if d is not None:
        if not isinstance(d, dict):
            raise TraceError(path=p, where=where, field="usage.prompt_tokens_details",
                             found=repr(d)[:40], expected="an object or null")
        _only(d, PROMPT_DETAIL_KEYS, "usage.prompt_tokens_details.", p=p, where=where)
        cached = _int(d, "cached_tokens", "usage.prompt_tokens_details.cached_tokens", p=p,
                      where=where, lo=0, optional=True)
        if cached is not None and cached > prompt:
            raise TraceError(path=p, where=where, field="usage.prompt_tokens_details.cached_tokens",
                             found=cached, expected=f"<= prompt_tokens ({prompt})")
        _int(d, "audio_tokens", "usage.prompt_tokens_details.audio_tokens", p=p, where=where,
             lo=0, optional=True)
    cd = u.get("completion_tokens_details")
    if cd is not None and not isinstance(cd, dict):
        raise TraceError(path=p, where=where, field="usage.completion_tokens_details",
                         found=repr(cd)[:40], expected="an object or null")
    return (type(sid).__name__, sid), created, done, prompt, comp, cached


def load_openai_log(path: Path, cfg, rng: np.random.Generator, sink: ErrorSink):
    """Read an OpenAI-compatible chat completion log file or folder (module docstring).

    Raises:
        TraceError: a line outside the schema (naming file, line and field), no valid line.
    """
    t0 = time.perf_counter()
    files = transcript_files(path, kind="chat completion log")
    root = path if path.is_dir() else path.parent
    rows = []  # (session, created, file order, completed, prompt, completion, cached, where)
    lines = 0
    zero = [0]
    for f in files:
        p = str(f)
        shown = f.relative_to(root).as_posix()
        for lineno, raw in iter_lines(f, "a JSONL text file"):
            lines += 1
            try:
                try:
                    o = loads(raw)
                except JSONDecodeError as e:
                    raise TraceError("invalid JSON", path=p, where=f"line {lineno}",
                                     found=json_error_found(raw, e),
                                     expected="one JSON object per line") from None
                sess, created, done, prompt, comp, cached = parse_line(o, p, f"line {lineno}")
                comp = output_len(comp, cfg.zero_output, path=p, where=f"line {lineno}",
                                  key="usage.completion_tokens", counter=zero)
            except TraceError as e:
                sink.bad(e)
                continue
            rows.append((sess, created, len(rows), done, prompt, comp, cached,
                         f"{shown} line {lineno}"))
    src = str(path)
    if not rows:
        raise TraceError("no valid calls", path=src, found=f"{lines} lines, {sink.count} skipped",
                         expected="at least one chat completion line (docs/AGENT_TRACES.md)")
    rows.sort(key=lambda r: (r[0], r[1], r[2]))  # by session, then created, then file order
    reported = sum(r[6] is not None for r in rows)
    no_end = overlap = not_ext = 0
    calls = Calls()
    for i, (sess, created, _, done, prompt, comp, cached, where) in enumerate(rows):
        pi = i - 1 if i and rows[i - 1][0] == sess else -1  # the session's previous call
        shared = 0
        if pi >= 0:
            pr = rows[pi]
            if pr[3] is not None and pr[3] > created:
                overlap += 1
                pi = -1
            else:
                cap = pr[4] + pr[5]
                if prompt >= pr[4]:
                    shared = min(cap, prompt)
                else:
                    shared = min(prompt, cached or 0, cap)
                    not_ext += 1
                no_end += pr[3] is None
        calls.session.append(sess)
        calls.parent.append(pi)
        calls.new_chain.append(False)
        calls.shared.append(shared)
        calls.hint.append(cached or 0)
        calls.prompt.append(prompt)
        calls.output.append(comp)
        calls.send.append(created)
        calls.end.append(done if done is not None else math.nan)
        calls.where.append(where)
        calls.cached.append(cached or 0)
    warnings: list = []
    if zero[0]:
        warnings.append(f"{counted(zero[0], 'call', 'calls')} had completion_tokens 0; "
                        f"loaded as 1 (zero_output=as_one)")
    if no_end:
        warnings.append(f"{counted(no_end, 'call follows', 'calls follow')} a call without "
                        f"completed_at: its think time counts from the parent's created, so it "
                        f"includes the parent's recorded latency")
    if overlap:
        warnings.append(f"{counted(overlap, 'call was', 'calls were')} made while the previous "
                        f"call of its session was in flight: loaded as roots at their own time")
    if not_ext:
        warnings.append(f"{counted(not_ext, 'call', 'calls')} had a shorter prompt than the "
                        f"previous call of its session: their shared prefix is cached_tokens")
    notes = {"files": len(files), "lines": lines, "overlapping_calls": overlap,
             "prompts_not_extending": not_ext, "cached_tokens_reported": reported,
             "zero_output_rows": zero[0],
             "provider_cache_read_tokens": int(sum(r[6] or 0 for r in rows))}
    pr = build(calls, cfg, rng, source=src, warnings=warnings, notes=notes,
               provider_read=reported > 0, provider_write=False)
    pr.notes["parse_s"] = round(time.perf_counter() - t0, 3)
    return pr

register(agent_log_format("openai_log", load_openai_log), __name__)


from .._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
