"""Metrics recorder: per-request and per-step tables and the run summary.

Tables (written as Parquet by :mod:`sim.results`):

``requests`` — one row per request (times in simulated seconds, NaN where not reached):
  request_id, session_id, arrival_s, first_token_s, finish_s, ttft_s (first token - arrival),
  tpot_s ((finish - first token) / (output_tokens - 1), NaN for 1-token outputs), e2e_s
  (finish - arrival; a request is rejected on arrival, so a rejected one has finish_s =
  arrival_s, e2e_s 0 and NaN TTFT and TPOT), queue_s (first scheduled - arrival), input_tokens, output_tokens,
  prefix_hit_tokens (GPU prefix-cache hit at first admission, a multiple of the block size),
  computed_prompt_tokens (prompt tokens actually prefilled: each admission's tokens past its
  prefix hit, a recompute after preemption prefilling the tokens generated so far too, less the
  part of a prefill that a preemption cut before it ran; their sum is the steps' prefill_tokens
  but for one token per recompute whose chunk is a single generated token, e.g. after a hit of
  all but it: the step counts that one as decode, as it computes one generated token and
  samples, as a decode step does), preemptions, status (finished | rejected), reject_reason;
  with a trace that records the provider's prompt cache (sim.provider_cache), also
  provider_cached_tokens and provider_cache_write_tokens (the provider's cache reads and writes
  of that call, as recorded).

``steps`` — one row per engine step: time_s (start), duration_s, running, waiting,
  prefill_tokens, decode_tokens, blocks_used, blocks_cached_free, live_kv_tokens (sum of the
  running requests' computed tokens: logical, a shared prefix counts once per request and
  compression does not lower it; ``blocks_used`` is the physical count). ``running``,
  ``blocks_used``, ``blocks_cached_free`` and ``live_kv_tokens`` count what the step ran with:
  a request that finishes at the step's end is counted in its row (its blocks leave after it);
  ``waiting`` is the queue after the step, with the requests its finishes released.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .request import STATUS_NAMES

REQUEST_COLUMNS = [
    "request_id", "session_id", "arrival_s", "first_token_s", "finish_s", "ttft_s", "tpot_s",
    "e2e_s", "queue_s", "onboard_s", "onboard_host_s", "onboard_disk_s", "prefill_s",
    "input_tokens", "output_tokens", "prefix_hit_tokens", "hit_tokens_gpu", "hit_tokens_host",
    "hit_tokens_disk", "computed_prompt_tokens", "preemptions", "tokens_evicted", "blocks_freed",
    "peak_blocks", "end_live_tokens", "end_blocks", "status", "reject_reason",
]



def request_columns(levels=("host", "disk")) -> list:
    """The requests table's columns for a chain of tiers whose levels are named ``levels``
    (level 1 first; :mod:`sim.tiers.spec`): ``onboard_<level>_s`` after ``onboard_s`` and
    ``hit_tokens_<level>`` after ``hit_tokens_gpu``, one per level (the default chain's:
    :data:`REQUEST_COLUMNS`)."""
    levels = tuple(levels)
    if levels == ("host", "disk"):
        return list(REQUEST_COLUMNS)
    cols = []
    for c in REQUEST_COLUMNS:
        if c in ("onboard_host_s", "onboard_disk_s", "hit_tokens_host", "hit_tokens_disk"):
            if c in ("onboard_host_s", "hit_tokens_host"):
                fmt = "onboard_{}_s" if c.startswith("onboard") else "hit_tokens_{}"
                cols += [fmt.format(n) for n in levels]
            continue
        cols.append(c)
    return cols


TRANSFER_COLUMNS = ["time_s", "direction", "tier", "pages", "bytes", "duration_s", "queue_s", "codec"]


class _Growable:
    """Column buffers that grow by doubling: :meth:`reserve` rows, then fill them."""

    def __init__(self, names_dtypes, cap=4096):
        self.names = [n for n, _ in names_dtypes]
        self.cols = {n: np.empty(cap, dtype=d) for n, d in names_dtypes}
        self.arrays = list(self.cols.values())  # (the buffers in column order)
        self.cap = cap
        self.n = 0

    def reserve(self, k: int) -> int:
        """Make room for ``k`` more rows, count them as written and return the first one's
        index (the caller fills rows ``i .. i + k - 1`` of every column)."""
        i = self.n
        cap = self.cap
        if i + k > cap:
            while cap < i + k:
                cap *= 2
            for name, v in self.cols.items():
                nv = np.empty(cap, dtype=v.dtype)
                nv[:i] = v[:i]
                self.cols[name] = nv
            self.arrays = list(self.cols.values())
            self.cap = cap
        self.n = i + k
        return i

    def extend(self, *cols):
        """Append ``len(cols[0])`` rows; each of ``cols`` is an array or a scalar (broadcast)."""
        k = len(cols[0])
        i = self.reserve(k)
        for name, v in zip(self.names, cols):
            self.cols[name][i:i + k] = v

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({k: v[:self.n] for k, v in self.cols.items()})


class TransferLog:
    """The tier manager's transfer records (one per batched copy), kept as typed columns.

    ``append(time_s, direction, tier, pages, bytes, duration_s, queue_s)`` takes seconds, pages
    and bytes; each field goes to its own ``array.array`` column (~42 bytes per row, no Python
    object per row), read as numpy arrays at the end. Iterating yields the rows as tuples
    ``(time_s, direction, tier, pages, bytes, duration_s, queue_s, codec)``; :meth:`frame`
    gives the ``transfers`` table (TRANSFER_COLUMNS).
    """

    DIRECTIONS = ("d2h", "h2d", "disk_to_host", "host_to_disk")
    TIERS = ("host", "disk")  # (the default chain's; ``directions`` / ``tiers`` replace them)
    _TYPES = ("d", "b", "b", "q", "q", "d", "d")  # time, direction, tier, pages, bytes, dur, queue

    def __init__(self, codec: str, directions: tuple | None = None, tiers: tuple | None = None):
        from array import array

        self.codec = codec
        if directions is not None:  # (a chain of tiers of its own: its links and levels)
            self.DIRECTIONS = tuple(directions)
        if tiers is not None:
            self.TIERS = tuple(tiers)
        self._cols = [array(t) for t in self._TYPES]
        (self._t, self._d, self._tr, self._p, self._b, self._dur, self._q) = (
            c.append for c in self._cols)
        self._dcode = {d: i for i, d in enumerate(self.DIRECTIONS)}
        self._tcode = {t: i for i, t in enumerate(self.TIERS)}

    def append(self, time_s, direction, tier, pages, nbytes, duration_s, queue_s) -> None:
        """Record one batched copy (``direction`` in DIRECTIONS, ``tier`` in TIERS)."""
        self._t(time_s)
        self._d(self._dcode[direction])
        self._tr(self._tcode[tier])
        self._p(pages)
        self._b(nbytes)
        self._dur(duration_s)
        self._q(queue_s)

    def __len__(self) -> int:
        return len(self._cols[0])

    def _columns(self):
        return [np.array(c, dtype=t) for c, t in zip(self._cols, self._TYPES)]

    def __iter__(self):
        t, d, tr, p, b, dur, q = self._columns()
        for i in range(len(t)):
            yield (float(t[i]), self.DIRECTIONS[d[i]], self.TIERS[tr[i]], int(p[i]), int(b[i]),
                   float(dur[i]), float(q[i]), self.codec)

    def frame(self) -> pd.DataFrame:
        """The transfers table (columns TRANSFER_COLUMNS; string-typed direction/tier/codec)."""
        t, d, tr, p, b, dur, q = self._columns()
        return pd.DataFrame({
            "time_s": t, "direction": pd.array(np.array(self.DIRECTIONS, dtype=object)[d], dtype="string"),
            "tier": pd.array(np.array(self.TIERS, dtype=object)[tr], dtype="string"),
            "pages": p, "bytes": b, "duration_s": dur, "queue_s": q,
            "codec": pd.array([self.codec] * len(t), dtype="string")})


class Recorder:
    """Collects what happened. ``request_done`` is called once per request (finished or rejected)."""

    def __init__(self, n_requests: int, session_id: np.ndarray, record_steps: bool = True,
                 levels: tuple = ("host", "disk")):
        self.n = n_requests
        # the names of the levels below the GPU whose hit and onboarding columns the requests
        # table has (request_columns; set by the engine from its tier chain)
        self.levels = tuple(levels)
        self.session_id = session_id
        self.rows: list[tuple] = []
        self.preemptions = 0
        self.record_steps = record_steps
        self.steps = _Growable([
            ("time_s", np.float64), ("duration_s", np.float64), ("running", np.int32),
            ("waiting", np.int32), ("prefill_tokens", np.int32), ("decode_tokens", np.int32),
            ("blocks_used", np.int64), ("blocks_cached_free", np.int64), ("live_kv_tokens", np.int64),
        ])
        self.num_steps = 0
        self.peak_blocks_used = 0
        self.sum_prefill = 0
        self.sum_decode = 0

    def request_done(self, r) -> None:
        """Record a request in its terminal state (finished or rejected)."""
        ttft = r.first_token - r.arrival
        tpot = (r.finish - r.first_token) / (r.output - 1) if r.output > 1 else math.nan
        e2e = r.finish - r.arrival
        queue = r.first_scheduled - r.arrival
        prefill = ttft - queue - r.onboard_s
        k = len(self.levels)
        hits = r.hit_tier if r.hit_tier is not None else (0,) * k
        onb = r.onboard_tier_s if r.onboard_tier_s is not None else (0.0,) * k
        gpu_hit = r.hit_tokens - sum(hits)
        self.rows.append((
            r.rid, int(self.session_id[r.idx]), r.arrival, r.first_token, r.finish, ttft, tpot, e2e,
            queue, r.onboard_s, *onb, prefill,
            r.input, r.output, r.hit_tokens, gpu_hit, *hits,
            r.computed_prompt_tokens, r.preemptions, r.tokens_evicted, r.blocks_freed,
            r.peak_blocks, r.end_live, r.end_blocks, STATUS_NAMES[r.status], r.reason,
        ))

    def count(self, k: int, prefill: int, decode: int, peak_used: int) -> None:
        """Count ``k`` engine steps computing ``prefill`` and ``decode`` tokens in all, the
        most blocks used in them ``peak_used`` (the counters of every step, recorded as rows
        or not)."""
        self.num_steps += k
        self.sum_prefill += prefill
        self.sum_decode += decode
        if peak_used > self.peak_blocks_used:
            self.peak_blocks_used = peak_used

    def reserve_steps(self, k: int):
        """Room for ``k`` rows of the steps table: ``(i, columns)``, the first row's index and
        the nine column buffers in table order (time_s, duration_s, running, waiting,
        prefill_tokens, decode_tokens, blocks_used, blocks_cached_free, live_kv_tokens), whose
        rows ``i .. i + k - 1`` the caller fills; None without per-step rows (``record_steps``
        false). Every row of the table is written through it; :meth:`count` counts them."""
        if not self.record_steps:
            return None
        st = self.steps
        return st.reserve(k), st.arrays

    def record_step(self, start, dur, running, waiting, prefill, decode, used, cached_free,
                    live) -> None:
        """Record one engine step from its numbers (Python ints and floats; the columns of
        :meth:`record`, one step's): :meth:`record` with ``k = 1`` and no arrays."""
        self.num_steps += 1
        self.sum_prefill += prefill
        self.sum_decode += decode
        if used > self.peak_blocks_used:
            self.peak_blocks_used = used
        if self.record_steps:
            st = self.steps
            i = st.n
            if i < st.cap:
                st.n = i + 1
            else:
                st.reserve(1)
            for col, v in zip(st.arrays, (start, dur, running, waiting, prefill, decode,
                                          used, cached_free, live)):
                col[i] = v

    def record(self, k: int, starts, durs, running, waiting, prefill, decode, used,
               cached_free, live) -> None:
        """Record ``k`` consecutive engine steps from their columns (:meth:`count` and
        :meth:`reserve_steps`): the per-step loop's step (``k = 1``) and a stretch's arrays
        alike.

        Each column is a number (every step's value) or an array of shape ``(k,)``: ``starts``
        the steps' start times (s), ``durs`` their durations (s), ``running`` / ``waiting``
        requests, ``prefill`` / ``decode`` tokens, ``used`` / ``cached_free`` blocks and
        ``live`` computed tokens of the running requests (the steps table, module docstring).
        Numbers are Python ints and floats (the counters add them as given). Without per-step
        rows (``record_steps`` false) only ``prefill``, ``decode`` and ``used`` are read, and
        the others may be None.
        """
        if k == 1 and not isinstance(prefill, np.ndarray) and not isinstance(
                decode, np.ndarray) and not isinstance(used, np.ndarray) and not isinstance(
                durs, np.ndarray):  # (one step's numbers: the per-step loop's)
            self.record_step(starts, durs, running, waiting, prefill, decode, used,
                             cached_free, live)
            return
        self.count(k, int(prefill.sum()) if isinstance(prefill, np.ndarray) else prefill * k,
                   int(decode.sum()) if isinstance(decode, np.ndarray) else decode * k,
                   int(used.max()) if isinstance(used, np.ndarray) else used)
        if self.record_steps:
            i, arrays = self.reserve_steps(k)
            j = i + k
            for col, v in zip(arrays, (starts, durs, running, waiting, prefill, decode, used,
                                       cached_free, live)):
                col[i:j] = v

    def requests_frame(self) -> pd.DataFrame:
        """The requests table, sorted by request_id."""
        df = pd.DataFrame.from_records(self.rows, columns=request_columns(self.levels))
        df = df.sort_values("request_id", kind="stable").reset_index(drop=True)
        return df.astype({
            "request_id": "int64", "session_id": "int64", "input_tokens": "int64",
            "output_tokens": "int64", "prefix_hit_tokens": "int64", "hit_tokens_gpu": "int64",
            **{f"hit_tokens_{n}": "int64" for n in self.levels}, "tokens_evicted": "int64",
            "blocks_freed": "int64", "peak_blocks": "int64", "end_live_tokens": "int64",
            "end_blocks": "int64",
            "computed_prompt_tokens": "int64", "preemptions": "int64",
        })

    def steps_frame(self) -> pd.DataFrame:
        """The steps table."""
        return self.steps.frame()


def _time_mean_blocks(rec: Recorder) -> float | None:
    """Blocks used averaged over the steps' durations (blocks; the steps' ``blocks_used``: the
    blocks each step ran with), or None without step rows."""
    if not rec.record_steps or rec.steps.n == 0:
        return None
    c = rec.steps.cols
    n = rec.steps.n
    d = c["duration_s"][:n]
    tot = float(d.sum())
    return float((c["blocks_used"][:n] * d).sum() / tot) if tot > 0 else None


def _stats(x: pd.Series) -> dict:
    x = x.dropna()
    if len(x) == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    q = np.percentile(x.to_numpy(), [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(q[0]), "p90": float(q[1]), "p99": float(q[2])}


def summarize(req: pd.DataFrame, rec: Recorder, sim_duration_s: float, gpu_blocks_total: int,
              extra: dict | None = None, block_size: int = 16) -> dict:
    """Summary of a run (the ``summary.json`` keys).

    ``prefix_hit_ratio`` = sum of hit tokens / sum of prompt tokens over finished requests;
    ``prefix_hit_ratio_mean_per_request`` = mean of per-request ratios (they differ when long
    prompts hit more or less than short ones). ``throughput_tokens_per_s`` = (prompt + output tokens
    of finished requests) / ``serving_span_s``; ``output_throughput_tokens_per_s`` counts output
    tokens only. ``sim_duration_s``: from 0 to the last request's finish or rejection (the
    caller's ``sim_duration_s``; tier copies landing later do not count); ``serving_span_s``:
    from the first request's arrival (``first_arrival_s``) to that end, the span that holds
    requests (a trace whose first request arrives late is not charged the idle lead).
    ``peak_gpu_blocks_used``: the most blocks held at once (the pool's high-water mark, so a
    request finishing in the step that allocated its blocks counts, as in the steps' rows). Memory saved by a compression policy:
    ``blocks_freed_total`` is gross (every block a round returned, a block freed and taken
    back again counted each time); ``blocks_saved_net`` the blocks the finished requests did
    not hold at their finish against an uncompressed cache (sum of ``ceil((input + output - 1)
    / block_size) - end_blocks``); ``blocks_used_time_mean`` the steps' blocks used weighted
    by their durations (None without step rows): set beside the same run with ``policy=full``
    for the blocks a policy keeps free.
    """
    fin = req[req["status"] == "finished"]
    prompt = float(fin["input_tokens"].sum())
    hits = float(fin["prefix_hit_tokens"].sum())
    per_req = (fin["prefix_hit_tokens"] / fin["input_tokens"]) if len(fin) else pd.Series(dtype=float)
    out_tokens = float(fin["output_tokens"].sum())
    dur = float(sim_duration_s)
    first = float(req["arrival_s"].min()) if len(req) else 0.0
    span = dur - min(max(first, 0.0), dur)
    rejected = req[req["status"] == "rejected"]
    s = {
        "complete": True,
        "requests_total": int(len(req)),
        "requests_finished": int(len(fin)),
        "requests_rejected": int(len(rejected)),
        "rejected_by_reason": {str(k): int(v) for k, v in rejected["reject_reason"].value_counts().sort_index().items()},
        "ttft_s": _stats(fin["ttft_s"]),
        "tpot_s": _stats(fin["tpot_s"]),
        "e2e_s": _stats(fin["e2e_s"]),
        "queue_s": _stats(fin["queue_s"]),
        "throughput_tokens_per_s": (prompt + out_tokens) / span if span > 0 else None,
        "output_throughput_tokens_per_s": out_tokens / span if span > 0 else None,
        "prompt_tokens_total": int(prompt),
        "output_tokens_total": int(out_tokens),
        "prefix_hit_tokens_total": int(hits),
        "prefix_hit_ratio": hits / prompt if prompt > 0 else None,
        "prefix_hit_ratio_mean_per_request": float(per_req.mean()) if len(per_req) else None,
        "computed_prompt_tokens_total": int(fin["computed_prompt_tokens"].sum()),
        "gpu_blocks_total": int(gpu_blocks_total),
        "peak_gpu_blocks_used": int(rec.peak_blocks_used),
        "preemptions": int(rec.preemptions),
        "engine_steps": int(rec.num_steps),
        "prefill_tokens_computed": int(rec.sum_prefill),
        "decode_tokens_computed": int(rec.sum_decode),
        "sim_duration_s": dur,
        "first_arrival_s": first,
        "serving_span_s": span,
    }
    tiers = ("gpu",) + rec.levels
    tier_hits = {t: float(fin[f"hit_tokens_{t}"].sum()) for t in tiers}
    s["hit_ratio"] = {t: (v / prompt if prompt > 0 else None) for t, v in tier_hits.items()}
    s["hit_ratio"]["total"] = s["prefix_hit_ratio"]
    s["hit_ratio_mean_per_request"] = {
        t: (float((fin[f"hit_tokens_{t}"] / fin["input_tokens"]).mean()) if len(fin) else None)
        for t in tiers}
    s["hit_ratio_mean_per_request"]["total"] = s["prefix_hit_ratio_mean_per_request"]
    # (the hits served below level 1: the disk's in the default chain)
    deep = sum(tier_hits[t] for t in rec.levels[1:])
    s["disk_share_of_hits"] = deep / hits if hits > 0 else None
    # compression: logical = tokens the sequence has / tokens still cached; physical = blocks a
    # dense cache would hold / blocks actually held (both at finish, summed over requests)
    seq_tokens = fin["input_tokens"] + fin["output_tokens"] - 1
    dense_blocks = float(np.ceil(seq_tokens / block_size).sum()) if block_size else 0.0
    live = float(fin["end_live_tokens"].sum())
    held = float(fin["end_blocks"].sum())
    s["tokens_evicted_total"] = int(req["tokens_evicted"].sum())
    # gross: every block a round returned, counted again each time a request frees a block it
    # later takes back (per-step churn); net: the blocks the finished requests did not hold at
    # their finish against an uncompressed cache (dense blocks - blocks held)
    s["blocks_freed_total"] = int(req["blocks_freed"].sum())
    s["blocks_saved_net"] = int(dense_blocks - held)
    s["blocks_used_time_mean"] = _time_mean_blocks(rec)
    s["logical_compression_ratio"] = float(seq_tokens.sum()) / live if live > 0 else None
    s["physical_compression_ratio"] = dense_blocks / held if held > 0 else None
    s["onboard_s"] = _stats(fin["onboard_s"])
    s["prefill_s"] = _stats(fin["prefill_s"])
    if extra:
        s.update(extra)
    return s
