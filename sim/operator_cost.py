"""Per-operator step-time model (``cost.kind=operator``).

One engine step (forward pass) of a tensor-parallel group of ``t`` GPUs, with ``T`` tokens
computed, ``S`` sampling rows and ``n`` scheduled sequences, takes

``host(n, prefill) + sum over operator groups of max(FLOPs / (peak x mfu), bytes / (HBM x mbu))
+ attention + collectives + L x layer_overhead_s``

Operator groups (parameters from :func:`sim.hardware.linear_param_counts`, split over the
``t`` ranks):

* attention projections (QKV and O; MLA's low-rank projections), every layer;
* dense MLP (``num_dense_layers`` layers of a MoE model, every layer of a dense one);
* shared experts and router, every MoE layer;
* routed experts: ``T`` tokens routed top-``k`` of ``E`` experts touch
  ``E x (1 - (1 - k/E)^T)`` distinct experts per layer in expectation (uniform routing), whose
  weights are read once; FLOPs ``2 x T x k x`` expert parameters at ``expert_mfu`` of the peak
  (grouped GEMMs of a few tokens per expert reach less of it than dense ones);
* lm_head: ``S`` rows of ``hidden x vocab`` (weights in ``model.dtype``; a tied lm_head
  multiplies by the embedding table).

Precision (``cost.gemm_precision``): a group's weights are read at their stored bytes
(``model.weight_quant`` within ``model.weight_quant_scope``; :data:`sim.hardware.WEIGHT_QUANT_BYTES`)
and computed on the tensor-core peak of their precision where the GPU card lists one
(``gpu.fp8_dense_tflops``, ``gpu.fp4_dense_tflops``), else on the BF16 peak after
dequantisation (weight-only kernels such as Marlin), at the achieved fraction of that peak
``cost.mfu`` (BF16), ``cost.fp8_mfu`` (null: ``cost.mfu``) or ``cost.fp4_mfu`` (null: the FP8
efficiency: both quantise activations on the fly).
``gemm_precision=bf16|fp8|fp4`` forces one peak for every quantised group; a peak the card
lacks, or fp8/fp4 with unquantised weights, is a ConfigError naming the field.

Attention: a chunk of ``m`` new tokens after ``c`` cached ones costs, per full-attention layer,
``pairs = m c + m (m + 1) / 2`` query-key pairs; prefill FLOPs ``pairs x 2 x q_heads x
(qk_dim + v_dim)`` (MLA: the decompressed heads), decode (``m = 1``) FLOPs
``pairs x 4 x q_heads x width`` (MLA: the absorbed latent, ``width = kv_lora_rank + rope``),
KV bytes read ``c`` and written ``m`` tokens at :func:`sim.hardware.kv_bytes_per_token`, times
the copies the TP group holds (:func:`sim.hardware.kv_replication`). Prefill attention runs at
``attention_efficiency`` of the BF16 peak, decode attention at ``attention_mbu`` of HBM
bandwidth. Sliding-window layers see at most ``window`` cached tokens.

Collectives (``t > 1``): two all-reduces of ``T x hidden`` activations (``model.dtype``) per
layer, each ``nvlink_latency_s + 2 (t - 1) / t x bytes / (nvlink_bandwidth x comm_efficiency)``
(ring all-reduce: each rank sends and receives ``2 (t - 1) / t`` of the message). With
``cost.expert_parallel`` a MoE layer's MLP all-reduce is replaced by an all-to-all dispatch and
combine of ``T x k x hidden`` values, each rank sending ``(t - 1) / t`` of them. Without NVLink
(``gpu.nvlink_bandwidth_gbps = 0``) the PCIe link carries them.

Host: ``step_overhead_s + seq_overhead_s x n``, plus ``prefill_overhead_s`` for a step with any
chunk of more than one token (decode-only steps replay a CUDA graph; mixed steps do not).

Pure-decode steps use the compiled stretch kernels of :class:`sim.cost.AnalyticCostModel`
unchanged: their attention term has the same form (``max(pairs x a / F, pairs x kv / B)``) and
everything else depends on the batch size only (:meth:`OperatorCostModel._fixed_step_times`).
"""

from __future__ import annotations

import numpy as np

from .cost import AnalyticCostModel
from .errors import ConfigError
from .hardware import (WEIGHT_QUANT_BYTES, dtype_bytes, full_attention_layers, kv_bytes_per_token,
                       kv_replication, linear_param_counts, window_kv_bytes_per_token)
from .jit import kernel

#: GPUs an NVLink domain of the shipped cards' HGX boards holds (H100/H200/B200/B300 HGX: 8)
GPUS_PER_NODE = 8

#: weight_quant -> the tensor-core precision that computes it where the GPU has one
QUANT_PRECISION = {"fp8": "fp8", "nvfp4": "fp4", "mxfp4": "fp4"}


def expected_experts(num_experts: int, top_k: int, tokens) -> np.ndarray:
    """Expected distinct routed experts touched in one layer by ``tokens`` tokens, each routed
    to ``top_k`` of ``num_experts`` experts uniformly at random: ``E x (1 - (1 - k/E)^T)``
    (each expert is missed by one token with probability ``1 - k/E``). ``tokens``: scalar or
    array; returns float64 of its shape."""
    t = np.asarray(tokens, dtype=np.float64)
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** t)


def ring_allreduce_time(message_bytes, ranks: int, bandwidth_Bps: float, latency_s: float):
    """One ring all-reduce of ``message_bytes`` over ``ranks`` GPUs (s): ``latency_s + 2 (p -
    1) / p x bytes / bandwidth``; 0 for one rank. ``bandwidth_Bps``: achieved bytes/s per GPU,
    one direction."""
    if ranks <= 1:
        return 0.0 * np.asarray(message_bytes, dtype=np.float64)
    return latency_s + 2.0 * (ranks - 1) / ranks * np.asarray(message_bytes, np.float64) / bandwidth_Bps


class OperatorCostModel(AnalyticCostModel):
    """Per-operator step times (see the module docstring); same interface as
    :class:`sim.cost.AnalyticCostModel`.

    Args: ``model``, ``gpu``, ``cache``, ``cost`` config nodes. Raises ConfigError for an
    efficiency outside ``(0, 1]``, a negative overhead, an unknown ``cost.gemm_precision`` or
    one the GPU card has no peak for.
    """

    def __init__(self, model, gpu, cache, cost):
        super().__init__(model, gpu, cache, cost)
        tp = int(cost.tensor_parallel_size)
        self.tp = tp
        self._cost = cost
        for name in ("attention_mbu", "comm_efficiency", "expert_mfu"):
            v = float(getattr(cost, name))
            if not 0 < v <= 1:
                raise ConfigError(f"cost.{name}={v}; expected 0 < value <= 1")
        for name in ("seq_overhead_s", "prefill_overhead_s", "layer_overhead_s"):
            v = float(getattr(cost, name))
            if not v >= 0:
                raise ConfigError(f"cost.{name}={v}; expected >= 0 (seconds)")
        self.seq_overhead = float(cost.seq_overhead_s)
        self.prefill_overhead = float(cost.prefill_overhead_s)
        self.layer_overhead = float(cost.layer_overhead_s) * int(model.num_layers)
        self.p = p = linear_param_counts(model)
        bw = float(gpu.hbm_bandwidth_gbps) * 1e9 * tp  # the group's HBM bytes/s
        self._bytes_s = bw * self.mbu
        peaks = {"bf16": float(gpu.bf16_dense_tflops), "fp8": float(gpu.fp8_dense_tflops),
                 "fp4": float(gpu.fp4_dense_tflops)}
        dt = dtype_bytes(model.dtype, "model.dtype")
        q = str(model.weight_quant).lower()
        qbytes = dt if q in ("none", "") else WEIGHT_QUANT_BYTES.get(q)
        if qbytes is None:
            raise ConfigError(f"model.weight_quant={model.weight_quant!r}; expected one of "
                              f"{['none'] + sorted(WEIGHT_QUANT_BYTES)}")
        want = str(cost.gemm_precision).lower()
        if want not in ("auto", "bf16", "fp8", "fp4"):
            raise ConfigError(f"cost.gemm_precision={cost.gemm_precision!r}; expected auto, "
                              f"bf16, fp8 or fp4")
        if want == "auto":
            qprec = QUANT_PRECISION.get(q, "bf16")
            if peaks[qprec] <= 0:
                qprec = "bf16"  # weight-only: dequantised to BF16 in the kernel
        elif want != "bf16" and q in ("none", ""):
            raise ConfigError(
                f"cost.gemm_precision={want} with model.weight_quant={model.weight_quant}: "
                f"{model.dtype} weights run on BF16/FP16 GEMMs; expected auto or bf16, or a "
                f"quantised model.weight_quant")
        else:
            qprec = want
            if peaks[qprec] <= 0:
                raise ConfigError(
                    f"cost.gemm_precision={want}: gpu {gpu.name} lists no {want} tensor-core "
                    f"peak (gpu.{want}_dense_tflops=0); expected auto or bf16 on this card")
        self.gemm_precision = qprec
        scope = str(model.weight_quant_scope).lower()
        if scope not in ("linear", "experts"):
            raise ConfigError(f"model.weight_quant_scope={model.weight_quant_scope!r}; expected "
                              f"'linear' or 'experts'")
        effs = {"bf16": self.mfu}
        for prec, fallback in (("fp8", "bf16"), ("fp4", "fp8")):
            v = getattr(cost, f"{prec}_mfu")
            effs[prec] = effs[fallback] if v is None else float(v)
            if not 0 < effs[prec] <= 1:
                raise ConfigError(f"cost.{prec}_mfu={v}; expected 0 < value <= 1 or null "
                                  f"(= cost.{'mfu' if fallback == 'bf16' else 'fp8_mfu'})")
        self.gemm_efficiency = effs
        qf = peaks[qprec] * 1e12 * tp * effs[qprec]  # quantised groups' FLOP/s
        bf = peaks["bf16"] * 1e12 * tp * self.mfu
        if scope == "experts":
            dense_b, dense_f = dt, bf
        else:
            dense_b, dense_f = qbytes, qf
        # (parameters, bytes per parameter, achieved FLOP/s) of the groups every token passes
        self._groups = [
            (float(p.attention * p.num_layers + p.dense_mlp * p.num_dense_layers
                   + (p.shared_experts + p.router) * p.num_moe_layers), dense_b, dense_f)]
        self._expert = (float(p.routed_experts), qbytes,
                        peaks[qprec] * 1e12 * tp * float(cost.expert_mfu))
        self._lm_head = (float(p.lm_head or p.embedding), dt, bf)
        self.E = int(model.num_experts)
        self.k = int(model.num_experts_per_tok)
        # collectives
        self.act_bytes = dt * float(model.hidden_size)  # one token's activation row
        if float(gpu.nvlink_bandwidth_gbps) > 0:
            link, lat = float(gpu.nvlink_bandwidth_gbps) * 1e9, float(gpu.nvlink_latency_s)
            self.link_name = "nvlink"
        else:
            link, lat = float(gpu.pcie_bandwidth_gbps) * 1e9, float(gpu.pcie_overhead_s)
            self.link_name = "pcie"
        self._link_Bps = link * float(cost.comm_efficiency)
        self._link_lat = lat
        self.expert_parallel = bool(cost.expert_parallel) and self.E > 0 and tp > 1
        self.num_layers = int(model.num_layers)
        # attention: the group's copies of the KV and its FLOP/s
        rep = kv_replication(model, tp)
        self.kv_tok = float(kv_bytes_per_token(model, cache)) * rep
        self.win_kv_tok = float(window_kv_bytes_per_token(model, cache)) * rep
        self.full_layers = full_attention_layers(model)
        self.peak_flops = peaks["bf16"] * 1e12 * tp
        self.hbm_bw = bw
        self.mbu_attn = float(cost.attention_mbu)
        if model.attention == "mla":
            rope = int(model.qk_rope_head_dim)
            nope = int(model.qk_nope_head_dim) or int(model.head_dim) - rope
            v = int(model.v_head_dim) or nope
            self.prefill_flops_per_pair = 2.0 * model.num_q_heads * (nope + rope + v)
        else:
            self.prefill_flops_per_pair = 4.0 * model.num_q_heads * model.head_dim
        self._decode_consts = None
        self._fixed_times = np.empty(0)
        self._scalar_ok = None  # (see _scalar_terms)

    # ----------------------------------------------------------------- terms
    @staticmethod
    def _roofline(params: float, bpp: float, flops_s: float, tokens, bytes_s: float):
        """max(2 x tokens x params / flops_s, params x bpp / bytes_s) (s)."""
        return np.maximum(2.0 * np.asarray(tokens, np.float64) * params / flops_s,
                          params * bpp / bytes_s)

    def gemm_time(self, tokens, samples):
        """Linear layers (s): dense groups and routed experts for ``tokens`` computed tokens,
        lm_head for ``samples`` rows. Scalars or arrays of one shape."""
        t = 0.0
        for params, bpp, fs in self._groups:
            if params:
                t = t + self._roofline(params, bpp, fs, tokens, self._bytes_s)
        params, bpp, fs = self._expert
        if params:
            tok = np.asarray(tokens, np.float64)
            touched = expected_experts(self.E, self.k, tok) / self.E  # fraction of experts read
            t = t + np.maximum(2.0 * tok * self.k * params / self.E / fs,
                               touched * params * bpp / self._bytes_s)
        params, bpp, fs = self._lm_head
        s = np.asarray(samples, np.float64)
        t = t + np.where(s > 0, self._roofline(params, bpp, fs, s, self._bytes_s), 0.0)
        return t

    def comm_time(self, tokens):
        """Collectives of one step (s) for ``tokens`` computed tokens (scalar or array)."""
        if self.tp <= 1:
            return 0.0 * np.asarray(tokens, np.float64)
        msg = np.asarray(tokens, np.float64) * self.act_bytes
        ar = ring_allreduce_time(msg, self.tp, self._link_Bps, self._link_lat)
        if not self.expert_parallel:
            return 2.0 * self.num_layers * ar
        moe = self.p.num_moe_layers
        a2a = self._link_lat + (self.tp - 1) / self.tp * msg * self.k / self._link_Bps
        return (2.0 * self.num_layers - moe) * ar + moe * 2.0 * a2a

    def host_time(self, seqs, prefill: bool):
        """Host-side time of a step with ``seqs`` scheduled sequences (s)."""
        return (self.overhead + self.seq_overhead * np.asarray(seqs, np.float64)
                + (self.prefill_overhead if prefill else 0.0))

    def linear_time(self, tokens: int, samples: int) -> float:
        """GEMMs, collectives and the per-layer overhead of ``tokens`` computed tokens with
        ``samples`` lm_head rows (s; no host time, no attention)."""
        return float(self.gemm_time(tokens, samples) + self.comm_time(tokens)) + self.layer_overhead

    def _fixed_step_times(self, b: int) -> np.ndarray:
        """Everything but decode attention in a decode-only step of ``n`` sequences, indexed
        by ``n`` (``n`` = 1 .. at least ``b``; index 0 is NaN): host, GEMMs, collectives,
        per-layer overhead (s)."""
        if len(self._fixed_times) <= b:
            n = np.arange(1, 2 * b + 1, dtype=np.float64)
            fixed = (self.host_time(n, False) + self.gemm_time(n, n) + self.comm_time(n)
                     + self.layer_overhead)
            self._fixed_times = np.concatenate([[np.nan], fixed])
        return self._fixed_times

    def _dense_decode_args(self, ctx0: np.ndarray):
        """The compiled decode loop's arguments (see the base class), with the decode
        attention's bandwidth at ``attention_mbu``."""
        if self.win_layers:
            return None
        b = len(ctx0)
        const = self._decode_consts
        if const is None:
            const = (self.attn_flops_per_pair, float(self.full_layers), self.kv_tok,
                     self.peak_flops * self.attn_eff, self.hbm_bw * self.mbu_attn)
            self._decode_consts = const
        return (float(np.add.reduce(ctx0, dtype=np.float64)), b) + const + (
            float(self._fixed_step_times(b)[b]),)

    def _attention_parts(self, new_tokens: np.ndarray, context_tokens: np.ndarray):
        """(decode attention s, prefill attention s) of a step's chunks."""
        n = new_tokens.astype(np.float64)
        c = context_tokens.astype(np.float64)
        dec = new_tokens == 1
        t_dec = 0.0
        t_pre = 0.0
        if dec.any():
            pairs = float(np.sum(c[dec] + 1.0))
            a = pairs * self.attn_flops_per_pair * self.full_layers / (self.peak_flops * self.attn_eff)
            m = pairs * self.kv_tok / (self.hbm_bw * self.mbu_attn)
            t_dec = a if a >= m else m
            if self.win_layers:
                cw = np.minimum(c[dec], self.window)
                pw = float(np.sum(cw + 1.0))
                t_dec += max(pw * self.attn_flops_per_pair * self.win_layers
                             / (self.peak_flops * self.attn_eff),
                             pw * self.win_kv_tok / (self.hbm_bw * self.mbu_attn))
        pre = ~dec
        if pre.any():
            np_, cp = n[pre], c[pre]
            pairs = float(np.sum(np_ * cp + np_ * (np_ + 1) / 2))
            flops = pairs * self.prefill_flops_per_pair * self.full_layers
            bytes_ = float(np.sum(cp + np_)) * self.kv_tok
            if self.win_layers:
                w = self.window
                cw = np.minimum(cp, w)
                pw = float(np.sum(np_ * cw + np_ * np.minimum(np_ + 1, w) / 2))
                flops += pw * self.prefill_flops_per_pair * self.win_layers
                bytes_ += float(np.sum(cw + np_)) * self.win_kv_tok
            t_pre = max(flops / (self.peak_flops * self.attn_eff), bytes_ / (self.hbm_bw * self.mbu))
        return t_dec, t_pre

    def attention_time(self, new_tokens: np.ndarray, context_tokens: np.ndarray) -> float:
        """Decode and prefill attention of a step's chunks (s)."""
        d, p = self._attention_parts(new_tokens, context_tokens)
        return d + p

    def _scalar_terms(self) -> bool:
        """Whether :meth:`step_time` may take its scalar path (:meth:`_step_time_sums`): this
        class's own terms (a subclass may replace any), no sliding-window layers, no routed
        experts and one GPU (no collectives)."""
        f = self._scalar_ok
        if f is None:
            cls = type(self)
            f = self._scalar_ok = (
                all(getattr(cls, m) is getattr(OperatorCostModel, m)
                    for m in ("step_time", "gemm_time", "comm_time", "host_time", "linear_time",
                              "_attention_parts", "_roofline"))
                and not self.win_layers and not self._expert[0] and self.tp <= 1)
        return f

    def _step_time_sums(self, b: int, sums: tuple, samples: int) -> float:
        """:meth:`step_time` of a step with a prefill chunk from :func:`_step_sums`'s integer
        sums (``b`` scheduled requests), for a model :meth:`_scalar_terms` admits: the same
        float64 operations in the same order as the array formulas, on Python floats (every
        summed term is an integer below 2**53, so each sum has the same bits in any order)."""
        dec_pairs, pre_pairs, pre_kv, n_sum, n_max, n_dec = sums
        host = self.overhead + self.seq_overhead * float(b) + (
            self.prefill_overhead if n_max > 1 else 0.0)
        # gemm_time: the groups' rooflines, then the lm_head's (np.maximum of two finite floats)
        tok = float(n_sum)
        g = 0.0
        bytes_s = self._bytes_s
        for params, bpp, fs in self._groups:
            if params:
                x, y = 2.0 * tok * params / fs, params * bpp / bytes_s
                g = g + (x if x >= y else y)
        params, bpp, fs = self._lm_head
        s = float(samples)
        x, y = 2.0 * s * params / fs, params * bpp / bytes_s
        g = g + ((x if x >= y else y) if s > 0 else 0.0)
        lin = (g + 0.0 * tok) + self.layer_overhead  # (comm_time of one GPU: 0 x tokens)
        t_dec = 0.0
        if n_dec:
            pairs = float(dec_pairs)
            a = pairs * self.attn_flops_per_pair * self.full_layers / (self.peak_flops * self.attn_eff)
            m = pairs * self.kv_tok / (self.hbm_bw * self.mbu_attn)
            t_dec = a if a >= m else m
        t_pre = 0.0
        if n_dec < b:
            flops = float(pre_pairs) * self.prefill_flops_per_pair * self.full_layers
            bytes_ = float(pre_kv) * self.kv_tok
            t_pre = max(flops / (self.peak_flops * self.attn_eff), bytes_ / (self.hbm_bw * self.mbu))
        return host + lin + t_dec + t_pre

    def step_time(self, new_tokens: np.ndarray, context_tokens: np.ndarray, samples: int) -> float:
        """Duration of one engine step (s); ``new_tokens``, ``context_tokens``: int arrays of
        one length (tokens per scheduled request); ``samples``: requests that sample a token.
        A decode-only step equals the compiled decode loop's time bit for bit; a step with a
        prefill chunk, with this class's terms (:meth:`_scalar_terms`) and int64 arrays whose
        sums stay below 2**52, takes :meth:`_step_time_sums` (the same bits as the array
        formulas below)."""
        b = len(new_tokens)
        if b and self._scalar_terms() and new_tokens.dtype == np.int64 \
                and context_tokens.dtype == np.int64:
            sums = _step_sums(new_tokens, context_tokens)
            if sums[4] > 1 and sums[6]:
                return self._step_time_sums(b, sums[:6], samples)
        if b and not self.win_layers and int(new_tokens.max()) == 1 and samples == b:
            args = self._dense_decode_args(context_tokens)
            out = np.empty(1, dtype=np.float64)
            from .cost import _dense_decode_times
            _dense_decode_times(args[0], args[1], 0, 0.0, *args[2:], out)
            return float(out[0])
        t = int(new_tokens.sum())
        prefill = bool(b) and int(new_tokens.max()) > 1
        d, p = self._attention_parts(new_tokens, context_tokens)
        return float(self.host_time(b, prefill)) + self.linear_time(t, samples) + d + p

    def _chunk_times(self, new_tokens: np.ndarray, ctx0: np.ndarray, samples: int,
                     k: int, start: float, first: float, stop: float) -> tuple[list, list]:
        """:meth:`sim.cost.AnalyticCostModel._chunk_times`; with the scalar terms
        (:meth:`_scalar_terms`), int64 arrays and a prefill chunk, each later step's time is
        :meth:`_step_time_sums` of integer sums moved by the batch's growth (decode pairs by
        the decode chunks, prefill pairs by ``sum n_i^2``, prefill KV tokens by ``sum n_i``
        over the prefill chunks), checked exact at the last step's contexts: the bits
        :meth:`step_time` gives for each step's arrays."""
        b = len(new_tokens)
        if (k >= 2 and start + first < stop and b and self._scalar_terms()
                and new_tokens.dtype == np.int64 and ctx0.dtype == np.int64):
            last = _step_sums(new_tokens, ctx0 + (k - 1) * new_tokens)
            if last[6] and last[4] > 1:
                dec_pairs, pre_pairs, pre_kv, ns, nmax, ndec = _step_sums(new_tokens, ctx0)[:6]
                pre = new_tokens[new_tokens > 1]
                d_pairs = int(np.dot(pre, pre))
                d_kv = int(pre.sum())
                t = start + first
                durs = [first]
                ends = [t]
                step = self._step_time_sums
                while len(ends) < k and t < stop:
                    dec_pairs += ndec
                    pre_pairs += d_pairs
                    pre_kv += d_kv
                    d = step(b, (dec_pairs, pre_pairs, pre_kv, ns, nmax, ndec), samples)
                    t = t + d
                    durs.append(d)
                    ends.append(t)
                return durs, ends
        return super()._chunk_times(new_tokens, ctx0, samples, k, start, first, stop)

    def _decode_times(self, ctx0: np.ndarray, k: int, first: int = 0, shift: int = 0) -> np.ndarray:
        """``k`` pure-decode steps (see :meth:`sim.cost.AnalyticCostModel._decode_times`)
        with this model's terms; shape ``(k,)`` (s)."""
        args = self._dense_decode_args(ctx0)
        if args is not None:
            from .cost import _dense_decode_times
            out = np.empty(k, dtype=np.float64)
            _dense_decode_times(args[0], args[1], first, float(shift), *args[2:], out)
            return out
        if shift:
            raise ValueError("stretch_times: a context shift needs per-request contexts "
                             "with sliding-window layers")
        b, s, sum_c = self._decode_ctx_sums(ctx0, k, first, shift)
        pairs = sum_c + b
        a = pairs * self.attn_flops_per_pair * self.full_layers / (self.peak_flops * self.attn_eff)
        m = pairs * self.kv_tok / (self.hbm_bw * self.mbu_attn)
        attn = np.maximum(a, m)
        if self.win_layers:
            w = self.window
            cw = np.minimum(ctx0[None, :].astype(np.float64) + s[:, None], w).sum(axis=1)
            pw = cw + b
            attn = attn + np.maximum(pw * self.attn_flops_per_pair * self.win_layers
                                     / (self.peak_flops * self.attn_eff),
                                     pw * self.win_kv_tok / (self.hbm_bw * self.mbu_attn))
        return self._fixed_step_times(b)[b] + attn

    def prefill_time(self, tokens: int, context: int = 0) -> float:
        """Time to prefill ``tokens`` after ``context`` cached tokens alone (s, no host time)."""
        d, p = self._attention_parts(np.array([tokens]), np.array([context]))
        return self.linear_time(tokens, 1) + d + p

    def breakdown(self, new_tokens: np.ndarray, context_tokens: np.ndarray, samples: int) -> dict:
        """Where one step's time goes (s): ``host``, ``gemm`` (linear layers, lm_head
        included), ``attention_decode``, ``attention_prefill``, ``collectives``,
        ``layer_overhead`` and ``total`` (their sum; :meth:`step_time` up to rounding)."""
        b = len(new_tokens)
        t = int(new_tokens.sum())
        prefill = bool(b) and int(new_tokens.max()) > 1
        d, p = self._attention_parts(new_tokens, context_tokens)
        parts = {"host": float(self.host_time(b, prefill)),
                 "gemm": float(self.gemm_time(t, samples)), "attention_decode": d,
                 "attention_prefill": p, "collectives": float(self.comm_time(t)),
                 "layer_overhead": self.layer_overhead}
        parts["total"] = sum(parts.values())
        return parts

    def run_breakdown(self, steps) -> dict:
        """Where a run's step time went (s, summed over its steps), from the steps table
        (:meth:`sim.metrics.Recorder.steps_frame`: ``duration_s``, ``running``,
        ``prefill_tokens``, ``decode_tokens``): host, linear layers (lm_head rows taken as the
        step's decode tokens), collectives and the per-layer overhead from this model's terms,
        and ``attention`` the rest of each step's recorded duration (the only term that needs
        each request's context; a compaction round or an onboarding wait inside a step would
        count there too). ``share``: each term over the total."""
        d = steps["duration_s"].to_numpy(np.float64)
        if len(d) == 0:
            return {}
        pre = steps["prefill_tokens"].to_numpy(np.float64)
        dec = steps["decode_tokens"].to_numpy(np.float64)
        tok = pre + dec
        host = self.host_time(steps["running"].to_numpy(np.float64), False) + np.where(
            pre > 0, self.prefill_overhead, 0.0)
        parts = {"host": host, "gemm": self.gemm_time(tok, dec),
                 "collectives": self.comm_time(tok) + np.zeros_like(d),
                 "layer_overhead": np.full_like(d, self.layer_overhead)}
        out = {k: float(v.sum()) for k, v in parts.items()}
        out["attention"] = float(d.sum()) - sum(out.values())
        total = float(d.sum())
        out["total"] = total
        out["share"] = {k: (out[k] / total if total > 0 else None)
                        for k in ("host", "gemm", "attention", "collectives", "layer_overhead")}
        return out

    def describe(self, codec=None, disk: bool = False, compaction: bool = False) -> dict:
        """The model and the settings behind its terms (for ``summary.json``)."""
        c = self._cost
        settings = {k: (None if getattr(c, k) is None else float(getattr(c, k)))
                    for k in ("mfu", "fp8_mfu", "fp4_mfu", "expert_mfu", "mbu", "attention_mbu",
                              "attention_efficiency", "step_overhead_s", "seq_overhead_s",
                              "prefill_overhead_s", "layer_overhead_s", "comm_efficiency",
                              "frontend_latency_s")}
        notes = []
        if self.tp > GPUS_PER_NODE:
            notes.append(f"tensor_parallel_size {self.tp} spans more than one {GPUS_PER_NODE}-GPU "
                         f"node; its all-reduces are priced on one node's {self.link_name}, "
                         f"not the network between nodes")
        return {"kind": "operator", "file": None, "calibrated": [], "analytic_fallback": [],
                "fallback_reasons": {}, "notes": notes, "settings": settings,
                "gemm_precision": self.gemm_precision,
                "tensor_parallel_size": self.tp, "collective_link": self.link_name if self.tp > 1 else None,
                "expert_parallel": self.expert_parallel,
                "moe": ({"num_experts": self.E, "top_k": self.k} if self.E else None)}


@kernel("UniTuple(i8, 7)(i8[:], i8[:])")
def _step_sums(n, c):  # pragma: no cover (compiled)
    """One step's integer sums for :meth:`OperatorCostModel._step_time_sums` (``n``: new tokens,
    ``c``: cached tokens before them, per scheduled request): ``(decode query-key pairs sum
    (c_i + 1) over n_i = 1, prefill pairs sum n_i c_i + n_i (n_i + 1) / 2 over n_i > 1, prefill
    KV tokens sum c_i + n_i over n_i > 1, sum n_i, max n_i, decode chunks, exact)``; ``exact``
    is 0 where a count is below 1 (``n``) or 0 (``c``) or reaches 2**26 (a product of two
    could pass 2**52) or a sum reaches 2**52: the array formulas' float64 products and sums
    could round there, so the caller takes them."""
    dec_pairs = 0
    pre_pairs = 0
    pre_kv = 0
    ns = 0
    nmax = 0
    ndec = 0
    ok = 1
    lim = 1 << 52
    one = 1 << 26
    for i in range(n.shape[0]):
        ni = n[i]
        ci = c[i]
        if ni < 1 or ci < 0 or ni >= one or ci >= one:
            ok = 0
            break
        if ni == 1:
            dec_pairs += ci + 1
            ndec += 1
        else:
            pre_pairs += ni * ci + ni * (ni + 1) // 2
            pre_kv += ci + ni
        ns += ni
        if ni > nmax:
            nmax = ni
        if dec_pairs >= lim or pre_pairs >= lim or pre_kv >= lim or ns >= lim:
            ok = 0
            break
    return dec_pairs, pre_pairs, pre_kv, ns, nmax, ndec, ok
