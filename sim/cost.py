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

A calibration file measured on a real GPU (``gpu_validation``) can replace these terms later;
the model is split into :meth:`linear_time` and :meth:`attention_time` for that purpose.
"""

from __future__ import annotations

import numpy as np

from .hardware import full_attention_layers, kv_bytes_per_token, weight_bytes, window_kv_bytes_per_token


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
        for name, v in (("cost.mfu", self.mfu), ("cost.attention_efficiency", self.attn_eff),
                        ("cost.mbu", self.mbu)):
            if not 0 < v <= 1:
                from .hardware import ConfigError
                raise ConfigError(f"{name}={v}; expected 0 < value <= 1")
        if self.overhead < 0:
            from .hardware import ConfigError
            raise ConfigError(f"cost.step_overhead_s={self.overhead}; expected >= 0")
        self.weight_bytes = weight_bytes(model)
        self.active_nonemb = (float(model.active_params_b) - float(model.embedding_params_b)) * 1e9
        if self.active_nonemb <= 0:
            from .hardware import ConfigError
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
        """Attention time for chunks of ``new_tokens`` after ``context_tokens`` each (s)."""
        n = new_tokens.astype(np.float64)
        c = context_tokens.astype(np.float64)
        pairs_full = float(np.sum(n * c + n * (n + 1) / 2))
        kv_read = float(np.sum(c)) * self.kv_tok
        kv_write = float(np.sum(n)) * self.kv_tok
        flops = pairs_full * self.attn_flops_per_pair * self.full_layers
        bytes_ = kv_read + kv_write
        if self.win_layers:
            w = self.window
            cw = np.minimum(c, w)
            pairs_w = float(np.sum(n * cw + n * np.minimum(n + 1, w) / 2))
            flops += pairs_w * self.attn_flops_per_pair * self.win_layers
            bytes_ += float(np.sum(cw) + np.sum(n)) * self.win_kv_tok
        return max(flops / (self.peak_flops * self.attn_eff), bytes_ / (self.hbm_bw * self.mbu))

    def step_time(self, new_tokens: np.ndarray, context_tokens: np.ndarray, samples: int) -> float:
        """Duration of one engine step (s): overhead + linear + attention."""
        t = int(np.sum(new_tokens))
        return self.overhead + self.linear_time(t, samples) + self.attention_time(new_tokens, context_tokens)

    def decode_step_times(self, ctx0: np.ndarray, k: int) -> np.ndarray:
        """Durations (s) of ``k`` consecutive pure-decode steps of one batch.

        ``ctx0[i]``: tokens of request ``i`` already cached before the first step; at step ``s``
        (0-based) each request computes one token after ``ctx0[i] + s`` cached tokens and samples
        one. Same formulas as :meth:`step_time`, vectorised over steps. Returns shape ``(k,)``.
        """
        b = len(ctx0)
        s = np.arange(k, dtype=np.float64)
        sum_c = float(np.sum(ctx0, dtype=np.float64)) + s * b
        pairs = sum_c + b  # sum over requests of (1 x c + 1)
        flops = pairs * self.attn_flops_per_pair * self.full_layers
        bytes_ = (sum_c + b) * self.kv_tok
        if self.win_layers:
            w = self.window
            cw = np.minimum(ctx0[None, :].astype(np.float64) + s[:, None], w).sum(axis=1)
            flops = flops + (cw + b * min(2, w) / 2) * self.attn_flops_per_pair * self.win_layers
            bytes_ = bytes_ + (cw + b) * self.win_kv_tok
        attn = np.maximum(flops / (self.peak_flops * self.attn_eff), bytes_ / (self.hbm_bw * self.mbu))
        return self.overhead + self.linear_time(b, b) + attn

    def prefill_time(self, tokens: int, context: int = 0) -> float:
        """Time to prefill ``tokens`` after ``context`` cached tokens alone (s, no overhead)."""
        return self.linear_time(tokens, 1) + self.attention_time(
            np.array([tokens]), np.array([context]))


def build_cost_model(model, gpu, cache, cost):
    """Return the cost model named by ``cost.kind``.

    Raises ConfigError for an unknown kind (valid: ``analytic``).
    """
    kinds = {"analytic": AnalyticCostModel}
    if cost.kind not in kinds:
        from .hardware import ConfigError
        raise ConfigError(f"cost.kind={cost.kind!r}; expected one of {sorted(kinds)}")
    return kinds[cost.kind](model, gpu, cache, cost)
