"""Step-time cost model: how long one forward pass (engine step) takes.

Analytic roofline (default, ``cost.kind=analytic``). For one step with prefill chunks and decode
tokens:

* Linear layers (GEMMs): ``F_lin = 2 x P_active x T + 2 x vocab x hidden x S`` FLOPs, where
  ``P_active`` are the non-embedding parameters touched per token, ``T`` the tokens computed this
  step and ``S`` the sequences that sample a token (lm_head rows). Bytes: all weights read once
  per step. ``t_lin = max(F_lin / (peak x mfu), W / (HBM bw x mbu))``.
* Attention: a chunk of ``n`` new tokens after ``c`` cached tokens costs, per full-attention layer,
  ``4 x q_heads x head_dim x (n x c + n(n+1)/2)`` FLOPs (QK^T and PV, causal) and reads the
  ``c`` cached tokens' KV once and writes ``n`` tokens' KV (flash attention never writes the score
  matrix). Decode is the ``n = 1`` case. MLA reads the compressed latent; its FLOPs use
  ``kv_lora_rank + rope`` as the head width (absorbed form). Sliding-window layers see at most
  ``window`` context tokens. ``t_attn = max(F_attn / (peak x attention_efficiency),
  bytes / (HBM bw x mbu))``.
* ``step = step_overhead_s + t_lin + t_attn`` (the two phases run one after the other per layer).

All inputs are numpy int arrays per scheduled request: ``new_tokens``, ``context_tokens`` (KV
already cached before this step) and ``samples`` (1 if the request samples a token this step).
Tensor parallelism multiplies peak FLOP/s and bandwidth by ``tp`` (ideal scaling, no
communication cost: an optimistic simplification).

The per-operator model (``cost.kind=operator``) is :mod:`sim.operator_cost`, its calibrated
form (``cost.kind=calibrated``) :mod:`sim.calibrated_cost`; both keep this class's interface.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

from .clock import step_ends
from .hardware import (full_attention_layers, kv_bytes_per_token, weight_bytes,
                       window_kv_bytes_per_token)
from .jit import kernel


@dataclass(slots=True)
class StretchShape:
    """The steps of a fast path's stretch, as :meth:`AnalyticCostModel.stretch_times` times
    them: one batch of ``b`` requests, step after step, each request's context growing by the
    tokens it computes.

    Attributes:
        ctx0: int64, shape ``(b,)``: tokens request ``i`` has cached before the stretch's first
            step.
        k: steps at most (>= 1).
        new_tokens: int64, shape ``(b,)``: tokens request ``i`` computes each step (a chunked
            prefill with decodes: step ``s``, 1-based, computes them after ``ctx0[i] + (s - 1)
            x new_tokens[i]`` cached tokens, ``samples`` requests sampling); None: a pure-decode
            stretch, one token per request a step, every request sampling.
        samples: requests that sample a token each step (with ``new_tokens``).
        first_s: with ``new_tokens``, step 1's duration (s), given (the engine's
            :meth:`AnalyticCostModel.step_time` of it; required).
        fin: int64, shape ``(b,)`` (pure decode): request ``i`` runs steps ``1 .. fin[i]``
            and then leaves; ``fin >= 1``, some ``fin[i] >= k``. None: every request runs
            every step.
        first: pure decode without ``fin``: the stretch's steps are steps ``first .. first + k
            - 1`` of a decode run from ``ctx0`` (step ``s``, 0-based, computes one token after
            ``ctx0[i] + s`` cached tokens).
        shift: pure decode without ``fin``: tokens added to the batch's context sum (a
            compression round between steps changed some contexts; a model without
            sliding-window layers, else ValueError).
        extra_first: seconds added to step 1 (pure decode without ``fin``).
    """

    ctx0: np.ndarray
    k: int
    new_tokens: Optional[np.ndarray] = None
    samples: int = 0
    first_s: Optional[float] = None
    fin: Optional[np.ndarray] = None
    first: int = 0
    shift: int = 0
    extra_first: float = 0.0


class AnalyticCostModel:
    """Roofline step-time model from the model card, GPU card and cost config.

    Args:
        model, gpu, cache, cost: config nodes (see :mod:`sim.config`).

    Methods return seconds (float).
    """

    def __init__(self, model, gpu, cache, cost):
        tp = int(cost.tensor_parallel_size)
        self.peak_flops = float(gpu.bf16_dense_tflops) * 1e12 * tp
        self.hbm_bw = float(gpu.hbm_bandwidth_gbps) * 1e9 * tp
        self.mfu = float(cost.mfu)
        self.attn_eff = float(cost.attention_efficiency)
        self.mbu = float(cost.mbu)
        self.overhead = float(cost.step_overhead_s)
        self._decode_consts = None  # _dense_decode_args' attention constants, at first use
        self._fixed_times = np.empty(0)  # batch size -> step overhead + linear time (s)
        for name, v in (("cost.mfu", self.mfu), ("cost.attention_efficiency", self.attn_eff),
                        ("cost.mbu", self.mbu)):
            if not 0 < v <= 1:
                from .errors import ConfigError
                raise ConfigError(f"{name}={v}; expected 0 < value <= 1")
        if self.overhead < 0:
            from .errors import ConfigError
            raise ConfigError(f"cost.step_overhead_s={self.overhead}; expected >= 0")
        self.weight_bytes = weight_bytes(model)
        self.active_nonemb = (float(model.active_params_b) - float(model.embedding_params_b)) * 1e9
        if self.active_nonemb <= 0:
            from .errors import ConfigError
            raise ConfigError(
                f"model {model.name}: active_params_b={model.active_params_b} must exceed "
                f"embedding_params_b={model.embedding_params_b}"
            )
        self.lm_head_flops = 2.0 * model.vocab_size * model.hidden_size
        self.kv_tok = float(kv_bytes_per_token(model, cache))
        self.win_kv_tok = float(window_kv_bytes_per_token(model, cache))
        self.window = int(model.sliding_window)
        self.full_layers = full_attention_layers(model)
        self.win_layers = int(model.num_sliding_window_layers)
        if model.attention == "mla":
            width = model.kv_lora_rank + model.qk_rope_head_dim
        else:
            width = model.head_dim
        self.attn_flops_per_pair = 4.0 * model.num_q_heads * width  # per layer, per (q, k) pair

    def linear_time(self, tokens: int, samples: int) -> float:
        """GEMM time for ``tokens`` computed tokens and ``samples`` lm_head rows (s)."""
        flops = 2.0 * self.active_nonemb * tokens + self.lm_head_flops * samples
        return max(flops / (self.peak_flops * self.mfu), self.weight_bytes / (self.hbm_bw * self.mbu))

    def attention_time(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> float:
        """Attention time for chunks of ``new_tokens`` after ``context_tokens`` each (s).
        ``new_tokens``, ``context_tokens``: integer arrays of one length (tokens)."""
        sums = self._int_attention_sums(new_tokens, context_tokens)
        if sums is not None:
            return self._attention_from_sums(*sums)
        n = new_tokens.astype(np.float64)
        c = context_tokens.astype(np.float64)
        pairs_full = float((n * c + n * (n + 1) / 2).sum())
        kv_read = float(c.sum()) * self.kv_tok
        kv_write = float(n.sum()) * self.kv_tok
        flops = pairs_full * self.attn_flops_per_pair * self.full_layers
        bytes_ = kv_read + kv_write
        if self.win_layers:
            w = self.window
            cw = np.minimum(c, w)
            pairs_w = float(np.sum(n * cw + n * np.minimum(n + 1, w) / 2))
            flops += pairs_w * self.attn_flops_per_pair * self.win_layers
            bytes_ += float(np.sum(cw) + np.sum(n)) * self.win_kv_tok
        return max(flops / (self.peak_flops * self.attn_eff), bytes_ / (self.hbm_bw * self.mbu))

    def _int_attention_sums(self, new_tokens: np.ndarray, context_tokens: np.ndarray):
        """``(query-key pairs, context tokens, new tokens)`` of a step's chunks as Python ints
        (one compiled pass), or None where :meth:`attention_time` needs its float formula
        (sliding-window layers, non-int64 arrays, sums past 2**53). Every term is an integer,
        so float sums of them below 2**53 are exact in any order: the same bits."""
        if not self.win_layers and new_tokens.dtype == np.int64 and context_tokens.dtype == np.int64:
            sums = _attention_sums(new_tokens, context_tokens)
            if max(sums) < _EXACT:
                return sums
        return None

    def _attention_from_sums(self, pairs_i: int, c_i: int, n_i: int) -> float:
        """:meth:`attention_time` from :meth:`_int_attention_sums` (s)."""
        flops = float(pairs_i) * self.attn_flops_per_pair * self.full_layers
        bytes_ = float(c_i) * self.kv_tok + float(n_i) * self.kv_tok
        return max(flops / (self.peak_flops * self.attn_eff), bytes_ / (self.hbm_bw * self.mbu))

    def step_time(self, new_tokens: np.ndarray, context_tokens: np.ndarray, samples: int) -> float:
        """Duration of one engine step (s): overhead + linear + attention. ``new_tokens``,
        ``context_tokens``: int arrays of one length (tokens per scheduled request);
        ``samples``: requests that sample a token."""
        if type(self).attention_time is AnalyticCostModel.attention_time:
            sums = self._int_attention_sums(new_tokens, context_tokens)
            if sums is not None:  # (one pass gives the new tokens' sum too)
                return (self.overhead + self.linear_time(int(sums[2]), samples)
                        + self._attention_from_sums(*sums))
        t = int(new_tokens.sum())
        return self.overhead + self.linear_time(t, samples) + self.attention_time(new_tokens, context_tokens)

    def stretch_times(self, shape: StretchShape, start: float = 0.0,
                      stop: float = math.inf) -> tuple[np.ndarray, np.ndarray]:
        """Durations and end times (s) of the steps of a fast path's stretch (``shape``) from
        ``start`` (s), up to ``shape.k`` steps, ending with the first step whose end is at or
        after ``stop`` (s; ``inf``: all ``k``). A chunked stretch's durations are
        :meth:`step_time`'s for each step's batch, bit for bit; a pure-decode stretch's are
        :meth:`step_time`'s formulas computed for all its steps at once (each model's
        ``_decode_times``; the fast paths and the per-step loop's stretches use the same).
        ``ends[i]`` is ``start + durs[0] + ... + durs[i]`` added left to right (the per-step
        loop's clock, :func:`sim.clock.step_ends`).

        Returns:
            ``(durs, ends)``: float64 arrays of one shape ``(k',)``, ``1 <= k' <= k``.

        Raises:
            ValueError: ``shape.shift`` with sliding-window layers; ``first``, ``shift`` or
                ``extra_first`` with ``fin`` or ``new_tokens``; ``new_tokens`` without
                ``first_s``, or ``first_s`` without them.
        """
        if shape.first_s is not None and shape.new_tokens is None:
            raise ValueError("stretch_times: first_s applies to a chunked stretch (new_tokens)")
        if shape.new_tokens is not None or shape.fin is not None:
            if shape.first or shape.shift or shape.extra_first:
                raise ValueError("stretch_times: first, shift and extra_first apply to a pure-"
                                 "decode stretch without fin")
            if shape.new_tokens is not None:
                if shape.first_s is None:
                    raise ValueError("stretch_times: a chunked stretch needs first_s")
                durs, ends = self._chunk_times(shape.new_tokens, shape.ctx0, shape.samples,
                                               shape.k, start, shape.first_s, stop)
                return np.array(durs, dtype=np.float64), np.array(ends, dtype=np.float64)
            return self._finishing_times(shape.ctx0, shape.fin, shape.k, start, stop)
        if shape.first or shape.shift:
            durs = self._decode_times(shape.ctx0, shape.k, shape.first, shape.shift)
            durs[0] += shape.extra_first
            ends = step_ends(start, durs)
            j = int(np.searchsorted(ends, stop, side="left"))
            return (durs[:j + 1], ends[:j + 1]) if j < len(ends) else (durs, ends)
        return self._decode_stretch(shape.ctx0, shape.k, start, stop, shape.extra_first)

    def _decode_times(self, ctx0: np.ndarray, k: int, first: int = 0, shift: int = 0) -> np.ndarray:
        """Durations (s) of ``k`` consecutive pure-decode steps of one batch.

        ``ctx0[i]``: tokens of request ``i`` already cached before step 0; at step ``s`` (0-based)
        each request computes one token after ``ctx0[i] + s`` cached tokens and samples one. The
        steps returned are ``first .. first + k - 1``; ``shift`` (tokens) is added to the batch's
        context sum (a compression round between steps changed some contexts; needs a model
        without sliding-window layers, else ValueError). Same formulas as :meth:`step_time`,
        computed for all steps at once (a compiled loop without sliding-window layers, numpy with
        them). Returns shape ``(k,)``.
        """
        if shift and self.win_layers:
            raise ValueError("stretch_times: a context shift needs per-request contexts "
                             "with sliding-window layers")
        args = self._dense_decode_args(ctx0)
        if args is not None:
            # the same float64 operations in the same order, one compiled loop over the steps
            out = np.empty(k, dtype=np.float64)
            _dense_decode_times(args[0], args[1], first, float(shift), *args[2:], out)
            return out
        b, s, sum_c = self._decode_ctx_sums(ctx0, k, first, shift)
        pairs = sum_c + b  # sum over requests of (1 x c + 1)
        flops = pairs * self.attn_flops_per_pair * self.full_layers
        bytes_ = pairs * self.kv_tok  # (sum_c + b) tokens read and written
        if self.win_layers:
            w = self.window
            cw = np.minimum(ctx0[None, :].astype(np.float64) + s[:, None], w).sum(axis=1)
            flops = flops + (cw + b * min(2, w) / 2) * self.attn_flops_per_pair * self.win_layers
            bytes_ = bytes_ + (cw + b) * self.win_kv_tok
        attn = np.maximum(flops / (self.peak_flops * self.attn_eff), bytes_ / (self.hbm_bw * self.mbu))
        return self.overhead + self.linear_time(b, b) + attn

    def _dense_decode_args(self, ctx0: np.ndarray):
        """The arguments of the compiled decode-step loop for a batch at contexts ``ctx0``
        (the sum of contexts, the batch size, then the cost constants), or None where that loop
        does not give this model's step times (sliding-window layers)."""
        if self.win_layers:
            return None
        b = len(ctx0)
        const = self._decode_consts
        if const is None:  # (the model's constants do not change)
            const = (self.attn_flops_per_pair, float(self.full_layers), self.kv_tok,
                     self.peak_flops * self.attn_eff, self.hbm_bw * self.mbu)
            self._decode_consts = const
        return (float(np.add.reduce(ctx0, dtype=np.float64)), b) + const + (
            float(self._fixed_step_times(b)[b]),)

    def _fixed_step_times(self, b: int) -> np.ndarray:
        """Step overhead + linear time (s) of a decode batch of ``n`` requests, indexed by ``n``
        (``n`` = 1 .. at least ``b``; index 0 is NaN): a table grown on demand."""
        if len(self._fixed_times) <= b:
            self._fixed_times = np.array(
                [np.nan] + [self.overhead + self.linear_time(n, n) for n in range(1, 2 * b + 1)])
        return self._fixed_times

    def _decode_stretch(self, ctx0: np.ndarray, k: int, start: float, stop: float,
                        extra_first: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        """Durations and end times (s) of up to ``k`` consecutive pure-decode steps of one batch
        (:meth:`_decode_times`, the first step ``extra_first`` s longer) from ``start`` (s),
        ending with the first step whose end is at or after ``stop`` (s; ``inf``: all ``k``).

        Returns ``(durs, ends)``, float64 of one shape ``(k',)``, ``k' <= k``: ``ends[i]`` is
        ``start + durs[0] + ... + durs[i]`` added left to right (:func:`sim.clock.step_ends`).
        Computes only the steps it returns where the model allows (one compiled loop without
        sliding-window layers), else 64 steps, then all ``k`` if ``stop`` is not reached.
        """
        args = self._dense_decode_args(ctx0)
        if args is not None:
            durs = np.empty(k, dtype=np.float64)
            ends = np.empty(k, dtype=np.float64)
            n = _dense_stretch(*args, float(start), float(stop), float(extra_first), durs, ends)
            return durs[:n], ends[:n]
        k_try = min(k, 64)
        durs = self._decode_times(ctx0, k_try)
        durs[0] += extra_first
        ends = step_ends(start, durs)
        if k_try < k and ends[-1] < stop:
            durs = self._decode_times(ctx0, k)
            durs[0] += extra_first
            ends = step_ends(start, durs)
        j = int(np.searchsorted(ends, stop, side="left"))
        if j < len(ends):
            return durs[:j + 1], ends[:j + 1]
        return durs, ends

    def _finishing_times(self, ctx0: np.ndarray, fin: np.ndarray, k: int,
                         start: float, stop: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`_decode_stretch` of a batch whose requests leave as they finish: request
        ``i`` (``ctx0[i]`` tokens cached before step 1) runs steps ``1 .. fin[i]``. Each run of
        steps between finishes is timed as :meth:`_decode_stretch` times the requests
        still running from the previous run's end, so the times equal those of the per-step
        loop's stretches. Returns ``(durs, ends)`` (s), float64 of shape ``(k',)``, ``k' <= k``,
        ending with the first step whose end is at or after ``stop`` (s). One compiled loop
        where :meth:`_decode_stretch` has one (no sliding-window layers, analytic
        attention), else one call of it per run. ``ctx0``, ``fin``: int64, shape ``(b,)``;
        ``fin`` >= 1, some ``fin[i] >= k``."""
        args = self._dense_decode_args(ctx0)
        if args is not None:
            fixed = self._fixed_step_times(len(ctx0))  # (filled by the call above)
            durs = np.empty(k, dtype=np.float64)
            ends = np.empty(k, dtype=np.float64)
            n = _dense_finishing_stretch(ctx0, fin, k, *args[2:7], fixed, float(start),
                                         float(stop), durs, ends)
            return durs[:n], ends[:n]
        durs = []
        ends = []
        done = 0  # steps timed
        ctx = ctx0
        t = start
        for f in sorted({f for f in fin.tolist() if f < k}) + [k]:
            d, e = self._decode_stretch(ctx, f - done, t, stop)
            durs.append(d)
            ends.append(e)
            if len(e) < f - done or e[-1] >= stop:
                break  # (the next event lands in this run's last step)
            t = float(e[-1])
            done = f
            ctx = ctx0[fin > f] + f
        if len(durs) == 1:
            return durs[0], ends[0]
        return np.concatenate(durs), np.concatenate(ends)

    def _chunk_times(self, new_tokens: np.ndarray, ctx0: np.ndarray, samples: int,
                     k: int, start: float, first: float,
                     stop: float) -> tuple[list, list]:
        """Durations and end times (s) of up to ``k`` consecutive steps of one batch whose
        requests each compute ``new_tokens[i]`` tokens a step (a chunked prefill with decodes):
        step ``s`` (1-based) computes them after ``ctx0[i] + (s - 1) x new_tokens[i]`` cached
        tokens, ``samples`` requests sampling; step 1 takes ``first`` s (the engine's
        :meth:`step_time` of it). Ends with the first step whose end is at or after ``stop``
        (s). Each later duration is :meth:`step_time`'s for that step's arrays, bit for bit:
        with the analytic attention its integer sums move by ``sum n_i^2`` pairs and ``sum
        n_i`` context tokens a step (exact while below 2**53), else :meth:`step_time` is called
        per step. Ends are ``start + first + ...`` added left to right (the per-step clock).
        Returns two lists of floats of one length ``<= k``. ``new_tokens``, ``ctx0``: int64,
        shape ``(b,)``."""
        t = start + first
        durs = [first]
        ends = [t]
        if k < 2 or t >= stop:
            return durs, ends
        sums = None
        if (type(self).attention_time is AnalyticCostModel.attention_time
                and type(self).step_time is AnalyticCostModel.step_time):
            sums = self._int_attention_sums(new_tokens, ctx0)
        if sums is not None:
            pairs, cs, ns = (int(x) for x in sums)
            dp = int(np.dot(new_tokens, new_tokens))
            if pairs + (k - 1) * dp < _EXACT and cs + (k - 1) * ns < _EXACT:
                fixed = self.overhead + self.linear_time(ns, samples)
                attn = self._attention_from_sums
                while len(ends) < k and t < stop:
                    pairs += dp
                    cs += ns
                    d = fixed + attn(pairs, cs, ns)
                    t = t + d
                    durs.append(d)
                    ends.append(t)
                return durs, ends
        ctx = ctx0.copy()
        while len(ends) < k and t < stop:
            ctx += new_tokens
            d = self.step_time(new_tokens, ctx, samples)
            t = t + d
            durs.append(d)
            ends.append(t)
        return durs, ends

    @staticmethod
    def _decode_ctx_sums(ctx0: np.ndarray, k: int, first: int, shift: int):
        """``(b, steps, context sum per step)`` of :meth:`_decode_times` (float64, exact for
        integer token counts below 2**53)."""
        b = len(ctx0)
        s = np.arange(first, first + k, dtype=np.float64)
        sum_c = float(np.sum(ctx0, dtype=np.float64)) + s * b
        if shift:
            sum_c = sum_c + float(shift)
        return b, s, sum_c

    def prefill_time(self, tokens: int, context: int = 0) -> float:
        """Time to prefill ``tokens`` after ``context`` cached tokens alone (s, no overhead)."""
        return self.linear_time(tokens, 1) + self.attention_time(
            np.array([tokens]), np.array([context]))

    def describe(self, codec=None, disk: bool = False, compaction: bool = False) -> dict:
        """Which model produced each cost term (for the run's ``summary.json``): all analytic."""
        return {"kind": "analytic", "file": None, "calibrated": [], "analytic_fallback": [],
                "fallback_reasons": {}}


_EXACT = 1 << 53  # float64 holds every integer below this


@kernel("UniTuple(i8, 3)(i8[:], i8[:])")
def _attention_sums(n, c):  # pragma: no cover (compiled)
    """``(sum n_i c_i + n_i (n_i + 1) / 2, sum c_i, sum n_i)`` in int64 (query-key pairs,
    context tokens, new tokens of a step's chunks)."""
    pairs = 0
    cs = 0
    ns = 0
    for i in range(n.shape[0]):
        pairs += n[i] * c[i] + n[i] * (n[i] + 1) // 2
        cs += c[i]
        ns += n[i]
    return pairs, cs, ns


@kernel("f8(f8, i8, i8, f8, f8, f8, f8, f8, f8, f8)")
def _dense_step_time(sum0, b, i, shift, apf, layers, kv_tok, flops_s, bytes_s,
                     fixed):  # pragma: no cover (compiled)
    """Step ``i``'s time (s) of :meth:`AnalyticCostModel._decode_times` without
    sliding-window layers: the numpy expression's float64 operations in its order (``sum0``:
    the batch's context sum before step 0, ``b`` requests, ``shift``: tokens added to the sum,
    ``fixed`` = overhead + linear time, ``flops_s`` = peak FLOP/s x attention efficiency,
    ``bytes_s`` = HBM B/s x MBU), so the same bits."""
    pairs = ((sum0 + float(i) * b) + shift) + b
    a = pairs * apf * layers / flops_s
    m = pairs * kv_tok / bytes_s
    return fixed + (a if a >= m else m)


@kernel("void(f8, i8, i8, f8, f8, f8, f8, f8, f8, f8, f8[:])")
def _dense_decode_times(sum0, b, first, shift, apf, layers, kv_tok, flops_s, bytes_s, fixed,
                        out):  # pragma: no cover (compiled)
    """:meth:`AnalyticCostModel._decode_times` without sliding-window layers: steps
    ``first .. first + len(out) - 1`` by :func:`_dense_step_time`."""
    for i in range(out.shape[0]):
        out[i] = _dense_step_time(sum0, b, first + i, shift, apf, layers, kv_tok, flops_s,
                                  bytes_s, fixed)


@kernel("i8(f8, i8, f8, f8, f8, f8, f8, f8, f8, f8, f8, f8[:], f8[:])")
def _dense_stretch(sum0, b, apf, layers, kv_tok, flops_s, bytes_s, fixed, start, stop,
                   extra_first, durs, ends):  # pragma: no cover (compiled)
    """:meth:`AnalyticCostModel._decode_stretch` without sliding-window layers: the step
    times of :func:`_dense_step_time` (from step 0, no shift) and their running sum from
    ``start``, up to the first end at or after ``stop``; returns the number of steps written."""
    t = start
    for i in range(durs.shape[0]):
        d = _dense_step_time(sum0, b, i, 0.0, apf, layers, kv_tok, flops_s, bytes_s, fixed)
        if i == 0:
            d = d + extra_first
        durs[i] = d
        t = t + d
        ends[i] = t
        if t >= stop:
            return i + 1
    return durs.shape[0]


CALIBRATION_DIR = Path(__file__).resolve().parent.parent / "gpu_validation" / "calibrations"

def gpu_short_name(gpu) -> str:
    """Short name of a GPU card for its default calibration file: ``gpu.name`` lower-cased with
    everything but letters and digits removed (``H200`` -> ``h200``, ``RTX-4090`` -> ``rtx4090``)."""
    return re.sub(r"[^a-z0-9]", "", str(gpu.name).lower())


def resolve_calibration_path(cost, gpu) -> Path:
    """The calibration file a ``cost.kind=calibrated`` run reads.

    ``cost.file`` null: ``gpu_validation/calibrations/<gpu short name>.json``. A relative
    ``cost.file`` is looked up in the working directory, then in the repository root. Raises
    ConfigError naming the path(s) tried and the files available when none exists.
    """
    from .errors import ConfigError

    if cost.file is None or str(cost.file) == "":
        tried = [CALIBRATION_DIR / f"{gpu_short_name(gpu)}.json"]
    else:
        p = Path(str(cost.file)).expanduser()
        tried = [p] if p.is_absolute() else [Path.cwd() / p, CALIBRATION_DIR.parent.parent / p]
        if len(tried) == 2 and tried[0].resolve() == tried[1].resolve():
            tried = tried[:1]  # (run from the repository root: one path)
    for p in tried:
        if p.is_file():
            return p
    avail = sorted(str(f) for f in CALIBRATION_DIR.glob("*.json"))
    how = ("cost.file is null, so the GPU card's default was used" if cost.file in (None, "")
           else f"cost.file={cost.file!r}")
    raise ConfigError(f"calibration file not found: {' or '.join(str(p) for p in tried)} ({how}); "
                      f"available: {avail or 'none'} in {CALIBRATION_DIR}")


@kernel("i8(i8[:], i8[:], i8, f8, f8, f8, f8, f8, f8[:], f8, f8, f8[:], f8[:])")
def _dense_finishing_stretch(ctx0, fin, k, apf, layers, kv_tok, flops_s, bytes_s, fixed, start,
                             stop, durs, ends):  # pragma: no cover (compiled)
    """:meth:`AnalyticCostModel._finishing_times` without sliding-window layers:
    each run of steps between finishes as :func:`_dense_stretch` times it (``fixed[b]``: step
    overhead + linear time of a batch of ``b``; a run's context sum is the running requests'
    contexts at its first step, summed exactly as integers); returns the steps written."""
    n = ctx0.shape[0]
    leave = np.zeros(k + 1, dtype=np.int64)  # requests leaving after step s
    leave_ctx = np.zeros(k + 1, dtype=np.int64)  # the sum of their ctx0
    rest = 0  # the sum of ctx0 over the running requests
    for j in range(n):
        rest += ctx0[j]
        if fin[j] < k:
            leave[fin[j]] += 1
            leave_ctx[fin[j]] += ctx0[j]
    b = n
    sum0 = float(rest)
    seg0 = 0  # the step before the run's first
    t = start
    for s in range(1, k + 1):
        d = _dense_step_time(sum0, b, s - 1 - seg0, 0.0, apf, layers, kv_tok, flops_s, bytes_s,
                             fixed[b])
        durs[s - 1] = d
        t = t + d
        ends[s - 1] = t
        if t >= stop:
            return s
        if leave[s] > 0:
            b -= leave[s]
            rest -= leave_ctx[s]
            sum0 = float(rest + s * b)
            seg0 = s
    return k
