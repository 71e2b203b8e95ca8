"""kvsim's prefix-cache hits beside the provider's own cache reads, for traces that record them
(Claude Code transcripts: ``usage.cache_read_input_tokens`` / ``cache_creation_input_tokens``;
OpenAI-compatible logs: ``usage.prompt_tokens_details.cached_tokens``; docs/AGENT_TRACES.md).

The loader keeps them as ``Workload.extra`` columns (``provider_cached_tokens``, and where the
trace has them ``provider_cache_write_tokens``); :func:`attach_provider_columns` copies them into
the requests table (requests.parquet) and :func:`compare_with_provider` gives summary.json's
``provider_cache``: over the finished requests, kvsim's ``prefix_hit_tokens`` (every tier) and
the provider's cache reads, in total and per session.

Why the two differ (the ``note`` in the summary): the provider caches a prompt only up to the
cache breakpoints the client marks (Claude Code marks the end of each request, so the previous
answer and the new tool result are written on one call and read on the next), reads only whole
prompt prefixes it wrote less than ~5 minutes before (1 hour with the extended TTL) and may share
an entry between sessions (the same system prompt and tools); kvsim caches every full block,
generated tokens included (``cache.reuse_answer_blocks``), keeps it until the pool evicts it,
whatever the time, and shares between sessions only what the trace's prefix ids say
(``trace.share_system_prefix``), and it rounds hits down to whole blocks.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

COLUMNS = ("provider_cached_tokens", "provider_cache_write_tokens")
NOTE = ("provider: caches up to the client's cache breakpoints (Claude Code: the end of each "
        "request, so an answer is written on the next call and read on the one after), entries "
        "expire after ~5 min unused (1 h extended), may be shared across sessions; kvsim: every "
        "full block incl. generated tokens until evicted, no expiry, across sessions only where "
        "the trace's prefix ids say so, hits rounded down to whole blocks")


def attach_provider_columns(req: pd.DataFrame, wl) -> pd.DataFrame:
    """``req`` (the requests table, one row per request id) with the workload's provider
    columns (:data:`COLUMNS` that ``wl.extra`` holds) added; unchanged when it has none."""
    extra = getattr(wl, "extra", None) or {}
    if len(req) and any(c in extra for c in COLUMNS):
        rid = req["request_id"].to_numpy()
        for c in COLUMNS:
            if c in extra:
                req[c] = np.asarray(extra[c], dtype=np.int64)[rid]
    return req


def _ratio(a: float, b: float):
    return float(a) / float(b) if b else None


IDLE_S = 300.0  # the provider's default cache lifetime (5 minutes unused)


def call_kinds(wl, request_id: np.ndarray) -> np.ndarray:
    """Each request's kind for the difference's breakdown: ``chain_start`` (turn 0: a session's
    first call, a sub-agent's first call; kvsim has nothing cached for it unless the trace's
    ids share a prefix, the provider may read another session's entry), ``after_idle`` (sent
    more than :data:`IDLE_S` after its parent's answer: the provider's 5-minute entry may have
    expired, kvsim's blocks stay until evicted), ``continuing`` (the rest: kvsim also hits the
    parent's answer, which the provider reads one call later, and rounds down to whole blocks)."""
    turn = np.asarray(wl.turn)[request_id]
    think = np.asarray(wl.think_s)[request_id]
    return np.where(turn == 0, "chain_start",
                    np.where(think > IDLE_S, "after_idle", "continuing"))


def compare_with_provider(req: pd.DataFrame, wl=None, max_sessions: int = 100) -> dict | None:
    """summary.json's ``provider_cache`` (None without the provider columns): totals over the
    finished requests (``kvsim_hit_tokens``, ``provider_cached_tokens``, their ratio
    ``kvsim_over_provider`` and ``difference_pct`` = 100 x (kvsim - provider) / provider,
    ``provider_cache_write_tokens`` where recorded, each side's share of the prompt tokens),
    with ``wl`` (the workload) ``by_call_kind`` (requests, both sides' tokens and their
    difference per :func:`call_kinds` kind: the differences add up to the total's), and
    ``per_session`` (the ``max_sessions`` sessions with the most provider cache reads, by
    session id; ``per_session_left_out`` counts the rest)."""
    if "provider_cached_tokens" not in req.columns:
        return None
    fin = req[req["status"] == "finished"]
    prompt = int(fin["input_tokens"].sum())
    kv = int(fin["prefix_hit_tokens"].sum())
    pv = int(fin["provider_cached_tokens"].sum())
    out = {
        "requests_compared": int(len(fin)),
        "requests_not_finished": int(len(req) - len(fin)),
        "prompt_tokens": prompt,
        "kvsim_hit_tokens": kv,
        "provider_cached_tokens": pv,
        "kvsim_over_provider": _ratio(kv, pv),
        "difference_pct": 100.0 * (kv - pv) / pv if pv else None,
        "kvsim_hit_ratio": _ratio(kv, prompt),
        "provider_hit_ratio": _ratio(pv, prompt),
    }
    if wl is not None and len(fin):
        kinds = call_kinds(wl, fin["request_id"].to_numpy())
        out["by_call_kind"] = {}
        for k in ("chain_start", "after_idle", "continuing"):
            sel = fin[kinds == k]
            a, b = int(sel["prefix_hit_tokens"].sum()), int(sel["provider_cached_tokens"].sum())
            out["by_call_kind"][k] = {"requests": int(len(sel)), "kvsim_hit_tokens": a,
                                      "provider_cached_tokens": b, "difference_tokens": a - b}
    cols = ["input_tokens", "prefix_hit_tokens", "provider_cached_tokens"]
    if "provider_cache_write_tokens" in fin.columns:
        out["provider_cache_write_tokens"] = int(fin["provider_cache_write_tokens"].sum())
        cols.append("provider_cache_write_tokens")
    g = fin.groupby("session_id")[cols].sum()
    g["requests"] = fin.groupby("session_id").size()
    top = g.sort_values("provider_cached_tokens", ascending=False, kind="stable").head(max_sessions)
    rows = []
    for sid, r in top.sort_index().iterrows():
        row = {"session_id": int(sid), "requests": int(r["requests"]),
               "prompt_tokens": int(r["input_tokens"]), "kvsim_hit_tokens": int(r["prefix_hit_tokens"]),
               "provider_cached_tokens": int(r["provider_cached_tokens"])}
        if "provider_cache_write_tokens" in r:
            row["provider_cache_write_tokens"] = int(r["provider_cache_write_tokens"])
        row["kvsim_over_provider"] = _ratio(row["kvsim_hit_tokens"], row["provider_cached_tokens"])
        rows.append(row)
    out["per_session"] = rows
    out["per_session_left_out"] = int(len(g) - len(top))
    out["note"] = NOTE
    return out
