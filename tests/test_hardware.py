"""KV sizing and pool sizing pinned to published numbers (design.md section 3, seed 000/004)."""

import math

import pytest

from sim.hardware import (ConfigError, kv_bytes_per_token, plan_memory, weight_bytes,
                          window_kv_bytes_per_seq)
from sim.run import compose_config


def cfg(*o):
    return compose_config(list(o))


@pytest.mark.parametrize("model,expected", [
    ("qwen3_8b", 147_456),
    ("llama3_1_8b", 131_072),
    ("qwen3_32b", 262_144),
    ("deepseek_v3", 70_272),
])
def test_kv_bytes_per_token(model, expected):
    c = cfg(f"model={model}")
    assert kv_bytes_per_token(c.model, c.cache) == expected


def test_gpt_oss_full_part_and_window_cap():
    c = cfg("model=gpt_oss_120b")
    # 18 full-attention layers x 2 x 8 heads x 64 x 2 bytes
    assert kv_bytes_per_token(c.model, c.cache) == 18 * 2048 == 36_864
    # window layers hold at most 128 tokens per sequence (whole blocks, plus the one being filled)
    per_seq = window_kv_bytes_per_seq(c.model, c.cache)
    assert per_seq == (math.ceil(128 / 16) + 1) * 16 * 18 * 2048
    c2 = cfg("model=gpt_oss_120b", "cache.block_size=32")
    assert window_kv_bytes_per_seq(c2.model, c2.cache) == (4 + 1) * 32 * 18 * 2048
    # (break-it pass) a window past max_model_len (131,072) holds no more than a whole sequence:
    # the reserve had doubled from 131,072 to 262,144 tokens of window
    for w in (131072, 262144):
        cw = cfg("model=gpt_oss_120b", f"model.sliding_window={w}")
        assert window_kv_bytes_per_seq(cw.model, cw.cache) == 131072 * 18 * 2048
    with pytest.raises(ConfigError, match=r"sliding-window reserve 1152\.00 GiB \(scheduler\.max_num_seqs="
                                          r"256 x model\.sliding_window=262144 tokens on 18 layers\)"):
        plan_memory(cw.model, cw.gpu, cw.cache, cw.scheduler, 1)


def test_kv_dtype_fp8_halves_and_weight_quant_does_not_change_kv():
    c = cfg("model=qwen3_8b", "cache.kv_cache_dtype=fp8")
    assert kv_bytes_per_token(c.model, c.cache) == 147_456 // 2
    c = cfg("model=qwen3_8b", "model.weight_quant=int4_awq")
    assert kv_bytes_per_token(c.model, c.cache) == 147_456
    # 4-bit linear layers; embeddings and lm_head stay BF16
    assert weight_bytes(c.model) < weight_bytes(cfg("model=qwen3_8b").model) / 2.5


def test_seed000_qwen3_32b_int4_on_24gb():
    """Seed 000: Qwen3-32B, 4-bit weights, 24 GB GPU: KV room ~24K tokens, so a 32K-token trace
    runs out around 24K. That arithmetic treats all weights as 4-bit and reserves nothing for
    activations; kvsim's default keeps embeddings/lm_head at BF16 (as AWQ checkpoints do) and
    estimates the activation reserve, which leaves much less room. FP8 KV doubles both."""
    seed_like = ("model=qwen3_32b", "gpu=rtx4090", "model.weight_quant=int4_awq",
                 "model.embedding_params_b=0.0", "cache.activation_reserve_gib=0")
    p = plan_memory(*[getattr(cfg(*seed_like), k) for k in ("model", "gpu", "cache", "scheduler")])
    tokens = p.token_capacity(16)
    assert 20_000 <= tokens <= 28_000, tokens
    assert tokens < 32_768  # a 32K trace does not fit
    p8 = plan_memory(*[getattr(cfg(*seed_like, "cache.kv_cache_dtype=fp8"), k)
                       for k in ("model", "gpu", "cache", "scheduler")])
    assert p8.token_capacity(16) == pytest.approx(2 * tokens, rel=0.002)
    # realistic default: embeddings at BF16 + activation reserve -> far below the seed's 24K
    c = cfg("model=qwen3_32b", "gpu=rtx4090", "model.weight_quant=int4_awq")
    real = plan_memory(c.model, c.gpu, c.cache, c.scheduler).token_capacity(16)
    assert 2_000 < real < tokens
    c8 = cfg("model=qwen3_32b", "gpu=rtx4090", "model.weight_quant=int4_awq", "cache.kv_cache_dtype=fp8")
    assert plan_memory(c8.model, c8.gpu, c8.cache, c8.scheduler).token_capacity(16) == pytest.approx(2 * real, rel=0.01)


def test_pool_size_formula_and_override():
    c = cfg()
    p = plan_memory(c.model, c.gpu, c.cache, c.scheduler)
    expect = int((140.4 * 2**30 * 0.9 - p.weight_bytes - p.activation_bytes) // (147_456 * 16))
    assert p.num_gpu_blocks == expect
    c = cfg("cache.num_gpu_blocks=1234")
    assert plan_memory(c.model, c.gpu, c.cache, c.scheduler).num_gpu_blocks == 1234


def test_weights_do_not_fit_is_a_clear_error():
    c = cfg("model=llama3_1_70b", "gpu=rtx4090")
    with pytest.raises(ConfigError, match="weights do not fit"):
        plan_memory(c.model, c.gpu, c.cache, c.scheduler)


def test_bad_block_size_is_a_clear_error():
    for bs in (0, 12, 512):
        c = cfg(f"cache.block_size={bs}")
        with pytest.raises(ConfigError, match="cache.block_size"):
            plan_memory(c.model, c.gpu, c.cache, c.scheduler)


def test_tensor_parallel_heads_and_kv_replication():
    """vLLM's TP rules: KV heads split while tp <= num_kv_heads (one copy of each block across
    the group), replicated beyond (tp / kv copies), and MLA's latent cache on every rank (tp
    copies): the pool shrinks by that factor. A TP size that splits neither way is an error."""
    from sim.hardware import check_tensor_parallel, kv_replication
    c = cfg("model=llama3_1_70b")  # 64 q heads, 8 KV heads
    assert [kv_replication(c.model, tp) for tp in (1, 2, 8, 16, 32)] == [1, 1, 1, 2, 4]
    p8 = plan_memory(c.model, c.gpu, c.cache, c.scheduler, 8)
    p16 = plan_memory(c.model, c.gpu, c.cache, c.scheduler, 16)
    bb = p8.block_bytes
    assert p8.num_gpu_blocks == int((p8.budget_bytes - p8.weight_bytes - p8.activation_bytes
                                     - p8.window_reserve_bytes) // bb)
    assert p16.kv_replication == 2 and p16.num_gpu_blocks == int(
        (p16.budget_bytes - p16.weight_bytes - p16.activation_bytes - p16.window_reserve_bytes)
        // (2 * bb))
    d = cfg("model=deepseek_v3")
    assert kv_replication(d.model, 8) == 8
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=3 does not divide model\.num_q_heads=64"):
        check_tensor_parallel(c.model, 3)
    from omegaconf import OmegaConf
    m = OmegaConf.merge(c.model, {"num_q_heads": 48, "num_kv_heads": 6})
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=4 with model\.num_kv_heads=6"):
        check_tensor_parallel(m, 4)
