"""KV sizing and pool sizing pinned to published numbers (design.md section 3, seed 000/004)."""

import math

import pytest

from sim.errors import ConfigError
from sim.hardware import kv_bytes_per_token, plan_memory, weight_bytes, window_kv_bytes_per_seq
from sim.config import CONF_DIR as CONF
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
    # a window past max_model_len (131,072) holds no more than a whole sequence (the reserve
    # stays at 131,072 tokens of window, not 262,144)
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
                 "model.embedding_params_b=0.0", "cache.activation_reserve_gib=0",
                 "model.max_model_len=16384")  # (vLLM refuses a context the pool cannot hold)
    p = plan_memory(*[getattr(cfg(*seed_like), k) for k in ("model", "gpu", "cache", "scheduler")])
    tokens = p.token_capacity(16)
    assert 20_000 <= tokens <= 28_000, tokens
    assert tokens < 32_768  # a 32K trace does not fit
    p8 = plan_memory(*[getattr(cfg(*seed_like, "cache.kv_cache_dtype=fp8"), k)
                       for k in ("model", "gpu", "cache", "scheduler")])
    assert p8.token_capacity(16) == pytest.approx(2 * tokens, rel=0.002)
    # realistic default: embeddings at BF16 + activation reserve -> far below the seed's 24K
    c = cfg("model=qwen3_32b", "gpu=rtx4090", "model.weight_quant=int4_awq",
            "model.max_model_len=2048")
    real = plan_memory(c.model, c.gpu, c.cache, c.scheduler).token_capacity(16)
    assert 2_000 < real < tokens
    c8 = cfg("model=qwen3_32b", "gpu=rtx4090", "model.weight_quant=int4_awq", "cache.kv_cache_dtype=fp8",
             "model.max_model_len=2048")
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


# ------------------------------------------------ weight precisions, quantised scope, param counts
def small_card(**kw):
    """A hand-sized model card (ModelConfig schema): 2 layers, hidden 8, 4 query / 2 KV heads of
    2, dense MLP 16, vocab 10; ``kw`` overrides."""
    from omegaconf import OmegaConf

    from sim.config import ModelConfig
    base = dict(name="tiny", num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=2,
                hidden_size=8, intermediate_size=16, vocab_size=10, num_params_b=1312e-9,
                active_params_b=1312e-9, embedding_params_b=160e-9, max_model_len=64)
    base.update(kw)
    return OmegaConf.merge(OmegaConf.structured(ModelConfig), base)


def test_weight_quant_bytes_per_value():
    """NVFP4: 4-bit E2M1 + one E4M3 byte per 16 values; MXFP4: + one E8M0 byte per 32; int4 is
    the AWQ/GPTQ group-128 layout (FP16 scale + 4-bit zero per 128); FP8 one byte."""
    from sim.hardware import WEIGHT_QUANT_BYTES as B
    assert B["nvfp4"] == 0.5625
    assert B["mxfp4"] == 0.53125
    assert B["int4"] == B["int4_awq"] == B["int4_gptq"] == 0.51953125
    assert B["fp8"] == 1.0


def test_weight_bytes_linear_and_experts_scope_hand_worked():
    """1,312 parameters, 160 of them embeddings; a MoE variant's routed experts are 2 layers x
    3 experts x 3 x 8 x 4 = 576 parameters. linear: (1312 - 160) x 0.53125 + 160 x 2 = 932 B;
    experts: 576 x 0.53125 + (1312 - 576) x 2 = 1,778 B; none: 1312 x 2 B whatever the scope."""
    m = small_card(weight_quant="mxfp4", num_experts=3, num_experts_per_tok=1,
                   moe_intermediate_size=4)
    assert weight_bytes(m) == pytest.approx(932.0, abs=1e-9)
    from omegaconf import OmegaConf
    e = OmegaConf.merge(m, {"weight_quant_scope": "experts"})
    assert weight_bytes(e) == pytest.approx(1778.0, abs=1e-9)
    assert weight_bytes(OmegaConf.merge(e, {"weight_quant": "none"})) == pytest.approx(2624.0, abs=1e-9)


def test_gpt_oss_experts_scope_gives_the_published_checkpoint_size():
    """gpt-oss-120b ships MXFP4 experts and BF16 attention, router, embeddings (config.json
    modules_to_not_convert); OpenAI's model card gives its checkpoint as 60.8 GiB. Quantising
    every linear layer instead (scope linear) undercounts it by ~1.4 GiB."""
    c = cfg("model=gpt_oss_120b")
    assert c.model.weight_quant_scope == "experts"
    assert weight_bytes(c.model) / 2**30 == pytest.approx(60.8, rel=0.005)
    lin = cfg("model=gpt_oss_120b", "model.weight_quant_scope=linear")
    assert weight_bytes(lin.model) / 2**30 == pytest.approx(59.39, abs=0.01)


def test_weight_quant_scope_errors_name_the_field():
    from omegaconf import OmegaConf
    with pytest.raises(ConfigError, match=r"model\.weight_quant_scope='experts' with "
                                          r"model\.num_experts=0 \(tiny\)"):
        weight_bytes(small_card(weight_quant="fp8", weight_quant_scope="experts"))
    with pytest.raises(ConfigError, match=r"model\.weight_quant_scope='layers'; expected one of "
                                          r"\['linear', 'experts'\]"):
        weight_bytes(small_card(weight_quant_scope="layers"))
    m = small_card(weight_quant="fp8", weight_quant_scope="experts", num_experts=3,
                   num_experts_per_tok=1, moe_intermediate_size=400)
    with pytest.raises(ConfigError, match=r"routed experts' 0\.00B parameters exceed"):
        weight_bytes(OmegaConf.merge(m, {"num_params_b": 1e-9}))


def test_linear_param_counts_gqa_hand_worked():
    """hidden 8, 4 query / 2 KV heads of 2: QKV 8 x (4 + 2 x 2) x 2 = 128, O 4 x 2 x 8 = 64;
    gated MLP 3 x 8 x 16 = 384 (2 x 8 x 16 = 256 ungated); embedding and lm_head 10 x 8 = 80
    each (lm_head 0 when tied). Total 80 + 80 + 2 x (192 + 384) = 1,312 = active."""
    from sim.hardware import linear_param_counts
    p = linear_param_counts(small_card())
    assert (p.attention, p.dense_mlp, p.embedding, p.lm_head) == (192, 384, 80, 80)
    assert (p.num_dense_layers, p.num_moe_layers, p.routed_experts) == (2, 0, 0)
    assert p.total == p.active == 1312 and p.active_matmul == 1232
    assert linear_param_counts(small_card(mlp_gated=False)).dense_mlp == 256
    tied = linear_param_counts(small_card(tie_word_embeddings=True))
    assert tied.lm_head == 0 and tied.total == 1232


def test_linear_param_counts_moe_hand_worked():
    """3 layers, the first dense (MLP 16), then 2 MoE layers of 4 experts (top 2) of width 2
    plus 1 shared: expert 3 x 8 x 2 = 48, router 8 x 4 = 32. Total 160 + 3 x 192 + 384 +
    2 x (4 x 48 + 48 + 32) = 1,664; active 160 + 576 + 384 + 2 x (2 x 48 + 48 + 32) = 1,472."""
    from sim.hardware import linear_param_counts
    p = linear_param_counts(small_card(num_layers=3, num_dense_layers=1, num_experts=4,
                                       num_experts_per_tok=2, moe_intermediate_size=2,
                                       num_shared_experts=1))
    assert (p.expert, p.shared_experts, p.router, p.dense_mlp) == (48, 48, 32, 384)
    assert (p.num_dense_layers, p.num_moe_layers, p.routed_experts) == (1, 2, 384)
    assert (p.total, p.active, p.active_matmul) == (1664, 1472, 1392)


def test_linear_param_counts_mla_hand_worked():
    """DeepSeek-V3's MLA projections with hidden 16, 2 heads, q_lora 4, kv_lora 6, qk_nope 3,
    qk_rope 1, v 5 (qk = 4): q_a 16 x 4 = 64, q_b 4 x 2 x 4 = 32, kv_a 16 x (6 + 1) = 112,
    kv_b 6 x 2 x (3 + 5) = 96, o 2 x 5 x 16 = 160: 464; without q_lora, q 16 x 2 x 4 = 128:
    496. DeepSeek-V3 itself: 11,010,048 + 37,748,736 + 4,128,768 + 16,777,216 + 117,440,512."""
    from sim.hardware import linear_param_counts
    mla = dict(attention="mla", hidden_size=16, num_q_heads=2, num_kv_heads=1, head_dim=4,
               kv_lora_rank=6, qk_rope_head_dim=1, qk_nope_head_dim=3, v_head_dim=5, rope_dim=1)
    assert linear_param_counts(small_card(q_lora_rank=4, **mla)).attention == 464
    assert linear_param_counts(small_card(**mla)).attention == 496
    assert linear_param_counts(cfg("model=deepseek_v3").model).attention == 187_105_280
    with pytest.raises(ConfigError, match=r"model\.qk_nope_head_dim=0, model\.v_head_dim=5 "
                                          r"\(tiny\): an MLA card needs both"):
        linear_param_counts(small_card(**dict(mla, qk_nope_head_dim=0)))
    with pytest.raises(ConfigError, match=r"model\.num_experts=4 with "
                                          r"model\.moe_intermediate_size=0"):
        linear_param_counts(small_card(num_experts=4, num_experts_per_tok=2))


MODEL_CARDS = sorted(p.stem for p in (CONF / "model").glob("*.yaml"))


@pytest.mark.parametrize("model", MODEL_CARDS)
def test_shipped_card_param_counts_match_published(model):
    """Every shipped card's architecture gives its published totals: all parameters within 2%
    of num_params_b, the active ones within 3% of active_params_b, embedding + untied lm_head
    within 0.1% of embedding_params_b (cards round to 3 decimals)."""
    from sim.hardware import linear_param_counts
    m = cfg(f"model={model}").model
    p = linear_param_counts(m)
    assert p.total / 1e9 == pytest.approx(m.num_params_b, rel=0.02)
    assert p.active / 1e9 == pytest.approx(m.active_params_b, rel=0.03)
    assert (p.embedding + p.lm_head) / 1e9 == pytest.approx(m.embedding_params_b, rel=0.001)


def test_gpt_oss_matmul_active_is_openais_published_count():
    """OpenAI's 5.13B active parameters of gpt-oss-120b count the unembedding but not the input
    embedding table (model card table: 0.96B attention + 4 of 128 experts + unembedding)."""
    from sim.hardware import linear_param_counts
    p = linear_param_counts(cfg("model=gpt_oss_120b").model)
    assert p.active_matmul / 1e9 == pytest.approx(5.13, abs=0.01)
    assert p.active - p.active_matmul == 201_088 * 2_880


@pytest.mark.parametrize("model,dtype,per_layer,per_token", [
    # DeepSeek's FP8 MLA record: 512 FP8 latent + 4 FP32 scales (one per 128) + 64 BF16 RoPE
    ("deepseek_v3", "fp8", 512 + 16 + 128, 61 * 656),
    # NVFP4 MLA: 512 values at 4 bits + 32 E4M3 scales + 64 FP8 RoPE
    ("deepseek_v3", "nvfp4", 256 + 32 + 64, 61 * 352),
    ("deepseek_v3", "auto", 576 * 2, 70_272),
    # GQA: each 128-value head 64 B of values + 8 E4M3 scales; FP8 one byte a value
    ("qwen3_8b", "nvfp4", 2 * 8 * (64 + 8), 36 * 1152),
    ("qwen3_8b", "fp8", 2 * 8 * 128, 73_728),
    ("llama3_1_8b", "nvfp4", 2 * 8 * 72, 32 * 1152),
])
def test_kv_bytes_per_token_per_layer_are_the_stored_records(model, dtype, per_layer, per_token):
    from sim.hardware import kv_bytes_per_token_per_layer
    c = cfg(f"model={model}", f"cache.kv_cache_dtype={dtype}")
    assert kv_bytes_per_token_per_layer(c.model, c.cache) == per_layer
    assert kv_bytes_per_token(c.model, c.cache) == per_token


def test_nvfp4_kv_cache_grows_capacity_less_than_4x():
    """4 bits + one E4M3 scale per 16 values (+ the MLA RoPE part in FP8): the pool holds
    3.56x the BF16 blocks for Qwen3-8B and 3.27x for DeepSeek-V3 (FP8: 2x and 1.76x), not 4x."""
    for model, tp, lo, hi in (("qwen3_8b", 1, 3.5, 3.6), ("deepseek_v3", 8, 3.2, 3.3)):
        blocks = {}
        for d in ("auto", "fp8", "nvfp4"):
            c = cfg(f"model={model}", f"cache.kv_cache_dtype={d}", f"cost.tensor_parallel_size={tp}")
            blocks[d] = plan_memory(c.model, c.gpu, c.cache, c.scheduler, tp).num_gpu_blocks
        assert lo < blocks["nvfp4"] / blocks["auto"] < hi
        assert blocks["fp8"] / blocks["auto"] < 2.01


def test_kv_cache_dtype_errors_name_the_field():
    c = cfg("cache.kv_cache_dtype=int3")
    with pytest.raises(ConfigError, match=r"cache\.kv_cache_dtype='int3'.*nvfp4"):
        kv_bytes_per_token(c.model, c.cache)
    c = cfg("cache.kv_cache_dtype=nvfp4", "model.head_dim=120")
    with pytest.raises(ConfigError, match=r"nvfp4 needs model\.head_dim in multiples of 16.*120"):
        kv_bytes_per_token(c.model, c.cache)


def _rtx3090(max_model_len: int):
    # vllm-project/vllm #10517: Llama-3.1-8B-Instruct on an RTX 3090 (total_gpu_memory=23.58GiB),
    # gpu_memory_utilization 0.90, no chunked prefill (the profile batch is max_model_len tokens)
    return cfg("model=llama3_1_8b", "gpu=rtx4090", "gpu.name=RTX-3090", "gpu.memory_gib=23.58",
               f"model.max_model_len={max_model_len}", "scheduler.enable_chunked_prefill=false",
               f"scheduler.max_num_batched_tokens={max_model_len}",
               "cache.gpu_memory_utilization=0.9")


def test_pool_size_within_1_percent_of_vllms_logs():
    """vLLM logged 1,952 blocks at max_model_len 20,000 (kv_cache_size 3.81 GiB)."""
    c = _rtx3090(20000)
    n = plan_memory(c.model, c.gpu, c.cache, c.scheduler).num_gpu_blocks
    assert abs(n - 1952) <= 0.01 * 1952


def test_pool_that_cannot_hold_one_max_model_len_request_refuses_to_start():
    """vLLM logged 1,478 blocks at max_model_len 29,000 and refused to start: 'The model's max
    seq len (29000) is larger than the maximum number of tokens that can be stored in KV cache
    (23648)'. kvsim: one error naming the numbers; an explicit cache.num_gpu_blocks is taken
    as given (a what-if pool)."""
    c = _rtx3090(29000)
    with pytest.raises(ConfigError) as e:
        plan_memory(c.model, c.gpu, c.cache, c.scheduler)
    msg = str(e.value)
    assert "model.max_model_len=29,000" in msg and "cache.block_size=16" in msg
    blocks = int(msg.split(" blocks x")[0].split()[-1].replace(",", ""))
    assert abs(blocks - 1478) <= 0.01 * 1478
    assert f"{blocks * 16:,} tokens" in msg
    c = cfg("model=llama3_1_8b", "gpu=rtx4090", "gpu.memory_gib=23.58",
            "model.max_model_len=29000", "cache.num_gpu_blocks=1000")
    assert plan_memory(c.model, c.gpu, c.cache, c.scheduler).num_gpu_blocks == 1000
