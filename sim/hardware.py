"""KV sizing, weight bytes and GPU block-pool size from model and GPU cards.

Rules (design.md section 3, seed 004):

* MHA/GQA: KV bytes per token = ``layers x 2 (K,V) x kv_heads x head_dim x kv_dtype_bytes``.
* MLA (DeepSeek-V2/V3): one compressed latent per token per layer shared by K and V:
  ``layers x (kv_lora_rank + qk_rope_head_dim) x kv_dtype_bytes`` (DeepSeek-V3 BF16: 61 x 576 x 2
  = 70,272 B/token).
* Quantised caches store what real servers store (:func:`kv_bytes_per_token_per_layer`): FP8
  GQA/MHA one byte a value (per-tensor scales live in the layer); FP8 MLA DeepSeek's record,
  the latent in FP8 with one FP32 scale per 128 values and the RoPE part in BF16 (656 B per
  token per layer for DeepSeek-V3); NVFP4 4-bit values with one E4M3 scale per 16 (0.5625 B a
  value), for MLA the latent so and the RoPE part in FP8 (352 B for DeepSeek-V3).
* Sliding-window layers hold at most ``window`` tokens per sequence, so they are not part of the
  per-token block size; their memory is a per-sequence reserve (see :func:`num_gpu_blocks`).
* vLLM's three precisions are separate (seed 004): ``--dtype`` (model dtype: activations and
  unquantized weights), ``--quantization`` (weight bytes only, hence KV *capacity*, never bytes per
  KV token) and ``--kv-cache-dtype`` (``auto`` follows the model dtype).
* Pool size (vLLM ``determine_num_available_blocks``): ``(GPU memory x gpu_memory_utilization -
  weights - activation reserve) / bytes per block``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .codecs import NVFP4, fp8_blocks
from .errors import ConfigError

GIB = 1 << 30

DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "bf16": 2.0, "bfloat16": 2.0, "fp16": 2.0,
               "float16": 2.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0}
# cache.kv_cache_dtype: the model dtypes plus nvfp4 (4-bit E2M1 values + one E4M3 scale per 16:
# vLLM's NVFP4 KV cache, vllm/utils/torch_utils.py nvfp4_kv_cache_full_dim: head_size // 2 +
# head_size // 16 bytes a head; sim.codecs.NVFP4), here its mean bytes per value
KV_DTYPE_BYTES = {**DTYPE_BYTES, "nvfp4": NVFP4.bytes_per_value}
# FP8 MLA record (vLLM fp8_ds_mla, vllm/v1/attention/backends/mla/flashmla_sparse.py): the latent
# ("NoPE") in FP8 with one FP32 scale per tile of this many values, the RoPE part in BF16
MLA_FP8_SCALE_TILE = 128

# Bytes per weight parameter by quantization method (``model.weight_quant``).
# fp8: one E4M3 byte per value; its scales (one FP32 per tensor, or per 128 x 128 block in
# DeepSeek-V3's checkpoint: 4 B per 16,384 values) are negligible.
# int4_awq / int4_gptq (and int4, the same layout): 4-bit values plus one FP16 scale and one
# 4-bit zero point per group of 128 weights (AutoAWQ / GPTQ default group size).
# mxfp4 (OCP Microscaling Formats spec v1.0): 4-bit E2M1 values + one 8-bit E8M0 scale per 32.
# nvfp4 (NVIDIA NVFP4): 4-bit E2M1 values + one 8-bit E4M3 scale per 16 values; the one FP32
# per-tensor scale is negligible.
WEIGHT_QUANT_BYTES = {
    "fp8": 1.0,
    "int4": 0.5 + 2.0 / 128 + 0.5 / 128,
    "int4_awq": 0.5 + 2.0 / 128 + 0.5 / 128,
    "int4_gptq": 0.5 + 2.0 / 128 + 0.5 / 128,
    "mxfp4": 0.5 + 1.0 / 32,
    "nvfp4": 0.5 + 1.0 / 16,
}

# model.weight_quant_scope: which parameters model.weight_quant applies to
WEIGHT_QUANT_SCOPES = ("linear", "experts")


def check_prefill_budget(max_num_batched_tokens: int, max_model_len: int, chunked: bool) -> None:
    """Without chunked prefill a prompt longer than the step budget could never be scheduled
    (vLLM rejects this config too). Raises ConfigError naming the fields."""
    if not chunked and max_num_batched_tokens < max_model_len:
        raise ConfigError(
            f"scheduler.max_num_batched_tokens={max_num_batched_tokens} < model.max_model_len="
            f"{max_model_len} with scheduler.enable_chunked_prefill=false: a long prompt could "
            f"never be scheduled; enable chunked prefill, raise the budget or lower "
            f"model.max_model_len")


def dtype_bytes(name: str, field_name: str) -> float:
    """Bytes per value of a dtype name; raises ConfigError naming ``field_name`` if unknown."""
    try:
        return DTYPE_BYTES[str(name).lower()]
    except KeyError:
        raise ConfigError(
            f"{field_name}={name!r} is not a known dtype; expected one of {sorted(DTYPE_BYTES)}"
        ) from None


def kv_dtype_bytes(model, cache) -> float:
    """Bytes per cached K/V value of the cache's dtype: ``cache.kv_cache_dtype`` or, for
    ``auto``, the model dtype (nvfp4: 0.5625, its scales included). A record's bytes, which
    may keep part of it in another precision, are :func:`kv_bytes_per_token_per_layer`'s.
    Raises ConfigError naming the field for an unknown dtype."""
    if str(cache.kv_cache_dtype).lower() == "auto":
        return dtype_bytes(model.dtype, "model.dtype")
    try:
        return KV_DTYPE_BYTES[str(cache.kv_cache_dtype).lower()]
    except KeyError:
        raise ConfigError(
            f"cache.kv_cache_dtype={cache.kv_cache_dtype!r} is not a known KV cache dtype; "
            f"expected auto or one of {sorted(KV_DTYPE_BYTES)}") from None


def kv_bytes_per_token_per_layer(model, cache) -> float:
    """Bytes one token's K/V record takes in one layer, as the server stores it (bytes):

    * 16/32-bit dtypes, and FP8 for GQA/MHA: values x bytes per value (vLLM's FP8 cache keeps
      one scale per tensor, in the layer, not per token);
    * FP8 MLA: ``kv_lora_rank`` FP8 bytes + one FP32 scale per 128 of them + the RoPE part in
      BF16 (vLLM ``fp8_ds_mla``, vllm/v1/attention/backends/mla/flashmla_sparse.py: 512 + 16 +
      128 = 656 B for DeepSeek-V3);
    * NVFP4 (``nvfp4``): 4-bit values + one E4M3 scale per 16 (vLLM
      ``nvfp4_kv_cache_full_dim``: 72 B per 128-value head); for MLA the latent so and the RoPE
      part in FP8 (vLLM ``nvfp4_ds_mla``, flashmla_sparse.py: 256 + 32 + 64 = 352 B for
      DeepSeek-V3).

    Raises ConfigError (naming the field) for an unknown dtype, or for NVFP4 where a head (GQA)
    or the latent (MLA) is not a multiple of 16 values.
    """
    name = str(cache.kv_cache_dtype).lower()
    values = kv_values_per_token_per_layer(model)
    per_value = kv_dtype_bytes(model, cache)
    mla = model.attention == "mla"
    if name == "nvfp4":
        width = int(model.kv_lora_rank) if mla else int(model.head_dim)
        if width % 16:
            what = "model.kv_lora_rank" if mla else "model.head_dim"
            raise ConfigError(
                f"cache.kv_cache_dtype=nvfp4 needs {what} in multiples of 16 (one scale per 16 "
                f"values); model {model.name} has {width}")
        if mla:  # (the latent in NVFP4, the RoPE part in FP8: one byte a value)
            return float(NVFP4.row_bytes(width) + int(model.qk_rope_head_dim))
        return float(2 * int(model.num_kv_heads) * NVFP4.row_bytes(width))
    if mla and name.startswith("fp8"):  # (the latent in FP8 with FP32 tile scales, RoPE in BF16)
        return float(fp8_blocks(MLA_FP8_SCALE_TILE).row_bytes(int(model.kv_lora_rank))
                     + 2 * int(model.qk_rope_head_dim))
    return values * per_value


def kv_values_per_token_per_layer(model) -> int:
    """Number of cached values per token in one layer (K and V together)."""
    if model.attention == "mla":
        return int(model.kv_lora_rank + model.qk_rope_head_dim)
    if model.attention == "gqa":
        return int(2 * model.num_kv_heads * model.head_dim)
    raise ConfigError(f"model.attention={model.attention!r}; expected 'gqa' or 'mla'")


def full_attention_layers(model) -> int:
    """Layers that keep every token (all layers minus sliding-window layers)."""
    return int(model.num_layers - model.num_sliding_window_layers)


def kv_bytes_per_token(model, cache) -> int:
    """KV bytes per token in the paged (full-attention) pool, all full-attention layers.

    Returns bytes (int). Sliding-window layers are excluded (see :func:`window_kv_bytes_per_seq`).
    """
    b = kv_bytes_per_token_per_layer(model, cache) * full_attention_layers(model)
    return int(round(b))


def window_kv_bytes_per_token(model, cache) -> int:
    """KV bytes per token summed over the sliding-window layers only (0 if none)."""
    b = kv_bytes_per_token_per_layer(model, cache) * model.num_sliding_window_layers
    return int(round(b))


def window_kv_bytes_per_seq(model, cache) -> int:
    """Bytes one running sequence holds in sliding-window layers at most: window tokens rounded up
    to whole blocks plus one block being filled (as vLLM's sliding-window manager keeps them),
    and never more than the blocks of ``model.max_model_len`` tokens (a sequence's longest)."""
    if model.num_sliding_window_layers == 0 or model.sliding_window <= 0:
        return 0
    blocks = math.ceil(model.sliding_window / cache.block_size) + 1
    if model.max_model_len:
        blocks = min(blocks, math.ceil(model.max_model_len / cache.block_size))
    return blocks * cache.block_size * window_kv_bytes_per_token(model, cache)


def kv_bytes_per_block(model, cache) -> int:
    """Bytes of one block (``block_size`` slots, all full-attention layers, K and V)."""
    return kv_bytes_per_token(model, cache) * int(cache.block_size)


@dataclass(frozen=True)
class LinearParamCounts:
    """Parameter counts of a model card's weight matrices by layer type (parameters, not bytes).

    Per layer: ``attention`` (Q, K, V and output projections of one layer), ``dense_mlp`` (one
    dense-MLP layer's MLP; 0 when no layer has one), ``shared_experts`` and ``router`` (one MoE
    layer's). ``expert``: one routed expert. ``embedding``: the input table (``vocab x hidden``);
    ``lm_head``: ``vocab x hidden``, 0 when tied to the embedding. Layer counts:
    ``num_dense_layers`` (dense MLP) and ``num_moe_layers`` (routed experts). Norm weights and
    biases are left out (under 0.01% of any shipped card).
    """

    attention: int
    dense_mlp: int
    expert: int
    shared_experts: int
    router: int
    embedding: int
    lm_head: int
    num_layers: int
    num_dense_layers: int
    num_moe_layers: int
    num_experts: int
    num_experts_per_tok: int

    @property
    def routed_experts(self) -> int:
        """Every routed expert of every MoE layer (parameters)."""
        return self.num_moe_layers * self.num_experts * self.expert

    @property
    def non_expert(self) -> int:
        """Transformer-layer parameters outside the routed experts: attention of every layer,
        the dense MLPs, and the shared experts and routers of the MoE layers (no embeddings)."""
        return (self.num_layers * self.attention + self.num_dense_layers * self.dense_mlp
                + self.num_moe_layers * (self.shared_experts + self.router))

    @property
    def total(self) -> int:
        """Every parameter: embeddings, lm_head, transformer layers and routed experts."""
        return self.embedding + self.lm_head + self.non_expert + self.routed_experts

    @property
    def active(self) -> int:
        """Parameters one token touches, counted as the cards count ``active_params_b``: the
        total with only ``num_experts_per_tok`` routed experts per MoE layer (the input
        embedding table included, as a dense card's active count equals its total)."""
        return (self.embedding + self.lm_head + self.non_expert
                + self.num_moe_layers * self.num_experts_per_tok * self.expert)

    @property
    def active_matmul(self) -> int:
        """Weights one token is multiplied by (2 FLOPs each): :attr:`active` without the input
        embedding table, which is a lookup (OpenAI's "active parameters" of gpt-oss)."""
        return self.active - self.embedding


def linear_param_counts(model) -> LinearParamCounts:
    """:class:`LinearParamCounts` of a model card, from its architecture fields.

    Attention, GQA/MHA: ``hidden x (q_heads + 2 kv_heads) x head_dim`` (Q, K, V) ``+ q_heads x
    head_dim x hidden`` (O). MLA, as DeepSeek-V3 defines its projections (``qk = qk_nope +
    qk_rope``): ``q_a_proj`` ``hidden x q_lora_rank`` and ``q_b_proj`` ``q_lora_rank x heads x
    qk`` (without a q_lora_rank, ``q_proj`` ``hidden x heads x qk``), ``kv_a_proj_with_mqa``
    ``hidden x (kv_lora_rank + qk_rope)``, ``kv_b_proj`` ``kv_lora_rank x heads x (qk_nope +
    v_head_dim)``, ``o_proj`` ``heads x v_head_dim x hidden``. MLP of width ``w``: ``(3 if
    mlp_gated else 2) x hidden x w``: dense layers at ``intermediate_size``, experts at
    ``moe_intermediate_size``. Router: ``hidden x num_experts``. A dense card
    (``num_experts = 0``) has a dense MLP in every layer; a MoE card in its first
    ``num_dense_layers``.

    Raises ConfigError naming the field when an MLA card lacks its projection widths or a MoE
    card its expert fields.
    """
    h = int(model.hidden_size)
    heads = int(model.num_q_heads)
    L = int(model.num_layers)
    if model.attention == "mla":
        nope, v, rope = int(model.qk_nope_head_dim), int(model.v_head_dim), int(model.qk_rope_head_dim)
        kvl, ql = int(model.kv_lora_rank), int(model.q_lora_rank)
        if nope < 1 or v < 1:
            raise ConfigError(
                f"model.qk_nope_head_dim={nope}, model.v_head_dim={v} ({model.name}): an MLA "
                f"card needs both (>= 1) to count its projections (DeepSeek-V3: 128 and 128)")
        qk = nope + rope
        q = h * ql + ql * heads * qk if ql > 0 else h * heads * qk
        attention = q + h * (kvl + rope) + kvl * heads * (nope + v) + heads * v * h
    elif model.attention == "gqa":
        hd = int(model.head_dim)
        attention = h * (heads + 2 * int(model.num_kv_heads)) * hd + heads * hd * h
    else:
        raise ConfigError(f"model.attention={model.attention!r}; expected 'gqa' or 'mla'")
    mats = 3 if model.mlp_gated else 2
    e = int(model.num_experts)
    if e > 0:
        if int(model.moe_intermediate_size) < 1 or int(model.num_experts_per_tok) < 1:
            raise ConfigError(
                f"model.num_experts={e} with model.moe_intermediate_size="
                f"{model.moe_intermediate_size}, model.num_experts_per_tok="
                f"{model.num_experts_per_tok} ({model.name}): a MoE card needs both >= 1")
        dense_layers = int(model.num_dense_layers)
        expert = mats * h * int(model.moe_intermediate_size)
        shared, router = int(model.num_shared_experts) * expert, h * e
    else:
        dense_layers, expert, shared, router = L, 0, 0, 0
    emb = int(model.vocab_size) * h
    return LinearParamCounts(
        attention=attention, dense_mlp=mats * h * int(model.intermediate_size) if dense_layers else 0,
        expert=expert, shared_experts=shared, router=router, embedding=emb,
        lm_head=0 if model.tie_word_embeddings else emb, num_layers=L,
        num_dense_layers=dense_layers, num_moe_layers=L - dense_layers if e > 0 else 0,
        num_experts=e, num_experts_per_tok=int(model.num_experts_per_tok) if e > 0 else 0)


def weight_quant_bytes(model) -> float:
    """Bytes per quantised weight parameter of ``model.weight_quant`` (``none``: the model
    dtype's); raises ConfigError naming the field for an unknown method."""
    q = str(model.weight_quant).lower()
    if q in ("none", ""):
        return dtype_bytes(model.dtype, "model.dtype")
    if q in WEIGHT_QUANT_BYTES:
        return WEIGHT_QUANT_BYTES[q]
    raise ConfigError(
        f"model.weight_quant={model.weight_quant!r}; expected one of "
        f"{['none'] + sorted(WEIGHT_QUANT_BYTES)}"
    )


def quantised_params(model) -> float:
    """Parameters stored at ``model.weight_quant`` (``model.weight_quant_scope``):
    ``linear``: every non-embedding parameter (``num_params_b - embedding_params_b``, billions
    x 1e9), as AWQ/GPTQ/FP8 checkpoints keep the embedding table and lm_head in the model dtype;
    ``experts``: the routed experts only (:attr:`LinearParamCounts.routed_experts`; gpt-oss:
    MXFP4 experts, BF16 attention and router). Raises ConfigError naming the field."""
    scope = str(model.weight_quant_scope)
    if scope == "linear":
        return model.num_params_b * 1e9 - model.embedding_params_b * 1e9
    if scope != "experts":
        raise ConfigError(f"model.weight_quant_scope={model.weight_quant_scope!r}; expected one "
                          f"of {list(WEIGHT_QUANT_SCOPES)}")
    if int(model.num_experts) < 1:
        raise ConfigError(
            f"model.weight_quant_scope='experts' with model.num_experts={model.num_experts} "
            f"({model.name}): expected a MoE card (num_experts >= 1) or scope 'linear'")
    n = float(linear_param_counts(model).routed_experts)
    rest = model.num_params_b * 1e9 - model.embedding_params_b * 1e9
    if n > rest:
        raise ConfigError(
            f"model.weight_quant_scope='experts' ({model.name}): the routed experts' "
            f"{n / 1e9:.2f}B parameters exceed num_params_b - embedding_params_b = "
            f"{rest / 1e9:.2f}B; expected num_params_b to count them")
    return n


def weight_bytes(model) -> float:
    """Bytes of the model weights on the GPU.

    ``quantised_params(model) x weight_quant_bytes(model)`` plus every other parameter
    (``num_params_b x 1e9`` in all) in ``model.dtype``: quantization (``model.weight_quant``)
    applies within ``model.weight_quant_scope`` (:func:`quantised_params`).
    """
    dt = dtype_bytes(model.dtype, "model.dtype")
    per = weight_quant_bytes(model)
    q = quantised_params(model)
    if str(model.weight_quant_scope) == "linear":  # (the rest is the embeddings: their own count)
        return q * per + model.embedding_params_b * 1e9 * dt
    return q * per + (model.num_params_b * 1e9 - q) * dt


# Fixed memory outside the batch's activations: what vLLM's profiling reports outside torch's
# allocator (CUDA context, cuBLAS workspaces, NCCL: non_torch_memory=0.35GiB for Llama-3.1-8B on
# an RTX 3090, vllm-project/vllm #10517) and 0.04 GiB of buffers beside the weights (the RoPE
# cos/sin cache: 131,072 positions x 128 x 2 B = 0.03 GiB for Llama-3.1; that log's peak torch
# memory less weights less the per-token term leaves 0.01 GiB more)
FIXED_RESERVE_BYTES = 0.39 * GIB


def activation_reserve_bytes(model, cache, scheduler) -> float:
    """Memory kept out of the KV pool besides the weights (bytes).

    If ``cache.activation_reserve_gib`` is set, that value. Otherwise the peak of vLLM's
    profiling forward pass over ``max_num_batched_tokens`` tokens (vLLM's ``profile_run``: KV
    cache = memory x utilization - peak torch memory - non-torch memory): the tensors live at
    once inside one decoder layer's gated MLP, per token the residual, the hidden states, the
    normalised input (3 x hidden), the gate/up projection's output (2 x intermediate) and the
    activation's output (1 x intermediate), in the model dtype (vLLM ``LlamaMLP``:
    ``gate_up_proj`` then ``SiluAndMul``), plus :data:`FIXED_RESERVE_BYTES`. On vLLM's logs for
    Llama-3.1-8B on an RTX 3090 (23.58 GiB) at utilization 0.90 without chunked prefill
    (vllm-project/vllm #10517: peak torch memory 17.06 GiB at 20,000 batched tokens, 17.98 GiB
    at 29,000, weights 14.9888 GiB) the per-token term is 110,592 B against the 109,760 B the
    two runs differ by, and the pools are within 1% of vLLM's 1,952 and 1,478 blocks
    (tests/test_hardware.py). vLLM V1 also profiles CUDA graphs and the sampler; they are not
    counted here.
    """
    if cache.activation_reserve_gib is not None:
        return float(cache.activation_reserve_gib) * GIB
    dt = dtype_bytes(model.dtype, "model.dtype")
    tokens = scheduler.max_num_batched_tokens
    layer = tokens * (3 * model.hidden_size + 3 * model.intermediate_size) * dt
    return layer + FIXED_RESERVE_BYTES


def check_tensor_parallel(model, tensor_parallel_size: int) -> None:
    """vLLM's head-split rules for a TP group (vllm/model_executor/models/*Attention):
    ``num_q_heads % tp == 0``; KV heads are split when ``num_kv_heads >= tp`` (then
    ``num_kv_heads % tp == 0``) and replicated otherwise (then ``tp % num_kv_heads == 0``).
    MLA keeps one latent cache per rank. Raises ConfigError naming the field and the heads."""
    tp = int(tensor_parallel_size)
    q = int(model.num_q_heads)
    if q % tp:
        raise ConfigError(f"cost.tensor_parallel_size={tp} does not divide model.num_q_heads={q} "
                          f"({model.name}); expected a divisor of the attention heads, as vLLM "
                          f"requires")
    if model.attention == "mla":
        return
    kv = int(model.num_kv_heads)
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise ConfigError(f"cost.tensor_parallel_size={tp} with model.num_kv_heads={kv} "
                          f"({model.name}): expected tp to divide the KV heads or be a multiple of "
                          f"them, as vLLM requires")


def kv_replication(model, tensor_parallel_size: int) -> int:
    """Copies of each token's KV a TP group holds (vLLM): 1 when the KV heads are split across
    the ranks; ``tp / num_kv_heads`` when there are fewer KV heads than ranks (each rank keeps
    one, replicated); ``tp`` for MLA (every rank holds the whole latent cache, shape
    ``[blocks, block_size, 1, kv_lora_rank + rope]`` per rank in vLLM's MLA backend)."""
    tp = int(tensor_parallel_size)
    if model.attention == "mla":
        return tp
    kv = int(model.num_kv_heads)
    return tp // kv if tp > kv else 1


@dataclass(frozen=True)
class MemoryPlan:
    """How GPU memory is split (bytes), and the resulting pool size (blocks)."""

    gpu_bytes: float
    budget_bytes: float
    weight_bytes: float
    activation_bytes: float
    window_reserve_bytes: float
    kv_pool_bytes: float
    block_bytes: int
    num_gpu_blocks: int
    kv_replication: int = 1  # copies of each block across the TP group (see kv_replication)

    def token_capacity(self, block_size: int) -> int:
        """Token slots in the pool: ``num_gpu_blocks x block_size``."""
        return self.num_gpu_blocks * block_size


def plan_memory(model, gpu, cache, scheduler, tensor_parallel_size: int = 1) -> MemoryPlan:
    """Compute the KV pool size.

    ``num_gpu_blocks = floor((memory x utilization - weights - activations - window reserve) /
    (block bytes x kv_replication))`` with memory and activations summed over
    ``tensor_parallel_size`` GPUs (:func:`check_tensor_parallel` first; replicated KV heads and
    MLA's per-rank latent cache hold several copies of each block, :func:`kv_replication`).
    ``cache.num_gpu_blocks`` overrides the result (after the weights check).

    Raises ConfigError if the weights do not fit or no block is left, naming the numbers.
    """
    tp = int(tensor_parallel_size)
    if tp < 1:
        raise ConfigError(f"cost.tensor_parallel_size={tp}; expected >= 1")
    check_tensor_parallel(model, tp)
    rep = kv_replication(model, tp)
    if not 0.0 < float(cache.gpu_memory_utilization) <= 1.0:
        raise ConfigError(
            f"cache.gpu_memory_utilization={cache.gpu_memory_utilization}; expected 0 < u <= 1"
        )
    bs = int(cache.block_size)
    if bs <= 0 or bs & (bs - 1) or bs > int(cache.max_block_size):
        raise ConfigError(
            f"cache.block_size={bs}; expected a power of two between 1 and {cache.max_block_size}"
        )
    gpu_bytes = float(gpu.memory_gib) * GIB * tp
    budget = gpu_bytes * float(cache.gpu_memory_utilization)
    if not math.isfinite(budget):
        raise ConfigError(f"gpu.memory_gib={gpu.memory_gib} x cost.tensor_parallel_size={tp} x "
                          f"cache.gpu_memory_utilization={cache.gpu_memory_utilization}: the "
                          f"budget overflows float64 bytes; expected a GPU memory size in GiB")
    w = weight_bytes(model)
    act = activation_reserve_bytes(model, cache, scheduler) * tp
    win = window_kv_bytes_per_seq(model, cache) * scheduler.max_num_seqs * rep
    block_bytes = kv_bytes_per_block(model, cache)
    if w >= budget:
        raise ConfigError(
            f"model weights do not fit: {model.name} ({model.weight_quant}) needs "
            f"{w / GIB:.1f} GiB of weights but {tp} x {gpu.name} x gpu_memory_utilization "
            f"{cache.gpu_memory_utilization} gives {budget / GIB:.1f} GiB; use a larger GPU, "
            f"cost.tensor_parallel_size, or model.weight_quant"
        )
    if cache.num_gpu_blocks is not None:
        # vLLM num_gpu_blocks_override: the pool size is taken as given (a what-if may exceed
        # the memory left after weights); the weights must still fit
        n = int(cache.num_gpu_blocks)
        if n <= 0:
            raise ConfigError(f"cache.num_gpu_blocks={n}; expected a positive number of blocks")
        check_pool_host_memory(n, f"cache.num_gpu_blocks={n}")
        return MemoryPlan(gpu_bytes, budget, w, act, win, float(n) * block_bytes * rep,
                          block_bytes, n, rep)
    pool = budget - w - act - win
    n = int(pool // (block_bytes * rep)) if pool > 0 else 0
    if n <= 0:
        raise ConfigError(
            f"zero KV blocks left: budget {budget / GIB:.2f} GiB - weights {w / GIB:.2f} GiB - "
            f"activation reserve {act / GIB:.2f} GiB (scheduler.max_num_batched_tokens="
            f"{scheduler.max_num_batched_tokens}) - sliding-window reserve {win / GIB:.2f} GiB "
            f"(scheduler.max_num_seqs={scheduler.max_num_seqs}"
            + (f" x model.sliding_window={model.sliding_window} tokens on "
               f"{model.num_sliding_window_layers} layers" if win > 0 else "")
            + f") = {pool / GIB:.2f} GiB < one "
            f"block of {block_bytes} B x {rep} cop{'y' if rep == 1 else 'ies'} across the TP group"
        )
    if model.max_model_len and n * bs < int(model.max_model_len):
        # vLLM refuses to start when one max_model_len request cannot fit the pool
        # (vllm/v1/core/kv_cache_utils.py check_enough_kv_cache_memory)
        raise ConfigError(
            f"model.max_model_len={int(model.max_model_len):,} tokens do not fit the KV pool: "
            f"{n:,} blocks x cache.block_size={bs} = {n * bs:,} tokens (budget "
            f"{budget / GIB:.2f} GiB - weights {w / GIB:.2f} GiB - activation reserve "
            f"{act / GIB:.2f} GiB" + (f" - sliding-window reserve {win / GIB:.2f} GiB"
                                      if win > 0 else "")
            + f" = {pool / GIB:.2f} GiB of {block_bytes * rep:,} B blocks); vLLM refuses to "
            f"start. Lower model.max_model_len, raise cache.gpu_memory_utilization, use a larger "
            f"GPU or cost.tensor_parallel_size, or set cache.num_gpu_blocks")
    check_pool_host_memory(n, f"the {n} KV blocks of gpu.memory_gib={gpu.memory_gib}")
    return MemoryPlan(gpu_bytes, budget, w, act, win, pool, block_bytes, n, rep)


def available_host_memory() -> int | None:
    """Bytes of memory this process can still take: the kernel's ``MemAvailable``
    (``/proc/meminfo``: free memory and the caches it can drop), less where a cgroup v2
    limit leaves less (``memory.max - memory.current`` of this process's cgroup); the
    physical memory where there is no ``/proc`` (macOS); None where neither is known."""
    import os

    have = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    have = int(line.split()[1]) * 1024
                    break
    except (OSError, ValueError, IndexError):
        pass
    if have is None:
        try:
            have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return None
    try:
        with open("/proc/self/cgroup") as f:
            rel = next((ln.split(":", 2)[2].strip() for ln in f if ln.startswith("0::")), None)
        if rel is not None:
            d = os.path.join("/sys/fs/cgroup", rel.lstrip("/"))
            with open(os.path.join(d, "memory.max")) as f:
                limit = f.read().strip()
            if limit.isdigit():
                with open(os.path.join(d, "memory.current")) as f:
                    have = min(have, max(int(limit) - int(f.read().strip()), 0))
    except (OSError, ValueError):
        pass
    return have


def check_pool_host_memory(n: int, what: str, copies: int = 1) -> None:
    """ConfigError when the simulator's bookkeeping for ``copies`` block pools of ``n`` GPU
    blocks each (:func:`sim.block_pool.pool_host_bytes`; ``copies``: a cluster's replicas)
    exceeds the memory this machine has available now (:func:`available_host_memory`): the run
    would die in an allocation (or swap, or the kernel's out-of-memory killer) instead of
    simulating. ``what`` names the setting in the message."""
    from .block_pool import pool_host_bytes

    need = int(copies) * pool_host_bytes(n)
    have = available_host_memory()
    if have is None:  # (not known here: no check)
        return
    if need > have:
        pools = "the block pool's" if copies == 1 else f"the {copies:,} block pools'"
        fewer = ("fewer blocks (a larger block_size, or a smaller pool)" if copies == 1 else
                 "fewer replicas or blocks (cluster.replicas, a larger block_size, or a smaller "
                 "pool)")
        raise ConfigError(f"{what}: {pools} bookkeeping alone needs {need / GIB:,.1f} GiB "
                          f"of host memory ({need // (n * copies)} B a block) and this machine "
                          f"has {have / GIB:,.1f} GiB available; expected {fewer}")
