"""KV bytes from the stored formats (sim.codecs): the hot record of each ``cache.kv_cache_dtype``
(sim.hardware) and the cold page of each codec (sim.tiers.cold_page_bytes), per model card of
each attention kind, counted by hand here: MHA (Llama-2-7B: 32 layers, 32 KV heads of 128),
GQA (Llama-3.1-8B: 32 layers, 8 KV heads of 128), MLA (DeepSeek-V3: 61 layers, a 512-value
latent + 64 RoPE values), and GQA with sliding-window layers (GPT-OSS-120B: 18 of 36 layers
keep every token, 8 KV heads of 64)."""

from __future__ import annotations

import pytest

from sim.errors import ConfigError
from sim.hardware import kv_bytes_per_block, kv_bytes_per_token, kv_bytes_per_token_per_layer
from sim.run import compose_config
from sim.tiers import cold_page_bytes


def cfg(model, *o):
    return compose_config([f"model={model}", *o])


def page(model, *o) -> int:
    c = cfg(model, *o)
    return cold_page_bytes(c.model, c.cache, c.codec)


# (model, kv_cache_dtype) -> bytes of one token's record in one layer, and in all layers
HOT = {
    # K and V of 32 heads x 128 values x 2 bytes; FP8: 1 byte; NVFP4: 64 B of 4-bit values +
    # 8 E4M3 scales = 72 B a head row (vLLM nvfp4_kv_cache_full_dim(128))
    ("llama2_7b", "auto"): (2 * 32 * 128 * 2, 32 * 16_384),
    ("llama2_7b", "fp8"): (2 * 32 * 128, 32 * 8_192),
    ("llama2_7b", "nvfp4"): (2 * 32 * 72, 32 * 4_608),
    ("llama3_1_8b", "auto"): (2 * 8 * 128 * 2, 32 * 4_096),
    ("llama3_1_8b", "fp8"): (2 * 8 * 128, 32 * 2_048),
    ("llama3_1_8b", "nvfp4"): (2 * 8 * 72, 32 * 1_152),
    # one 576-value latent (BF16: 61 x 1,152 = 70,272 B a token); FP8 (vLLM fp8_ds_mla): 512
    # FP8 bytes + 4 FP32 scales + 64 BF16 RoPE values = 656 B; NVFP4 (vLLM nvfp4_ds_mla): 256 B
    # of values + 32 E4M3 scales + 64 FP8 RoPE values = 352 B
    ("deepseek_v3", "auto"): (576 * 2, 70_272),
    ("deepseek_v3", "fp8"): (512 + 16 + 128, 61 * 656),
    ("deepseek_v3", "nvfp4"): (256 + 32 + 64, 61 * 352),
    # 18 full-attention layers in the pool; a head row of 64: NVFP4 32 + 4 = 36 B
    ("gpt_oss_120b", "auto"): (2 * 8 * 64 * 2, 18 * 2_048),
    ("gpt_oss_120b", "nvfp4"): (2 * 8 * 36, 18 * 576),
}


@pytest.mark.parametrize("model,dtype", sorted(HOT))
def test_hot_record_bytes_per_model_card(model, dtype):
    c = cfg(model, f"cache.kv_cache_dtype={dtype}", "cache.block_size=64")
    per_layer, per_token = HOT[model, dtype]
    assert kv_bytes_per_token_per_layer(c.model, c.cache) == per_layer
    assert kv_bytes_per_token(c.model, c.cache) == per_token
    assert kv_bytes_per_block(c.model, c.cache) == per_token * 64


# (model, block_size, overrides) -> cold page bytes, counted section by section
COLD = [
    # MHA, 16 tokens: 32 layers x K,V x 32 heads x 16 tokens x 128 values = 4,194,304 values
    ("llama2_7b", 16, ["codec=identity"], 4_194_304 * 2),
    ("llama2_7b", 16, ["codec=fp8"], 4_194_304),
    ("llama2_7b", 16, ["codec=nvfp4"], 4_194_304 // 2 + 4_194_304 // 16),
    # + one FP32 scale per (layer, K/V) in the page: 32 x 2 x 4 = 256 B
    ("llama2_7b", 16, ["codec=nvfp4", "codec.tensor_scale=page"], 2_359_296 + 256),
    # RoPE spans the whole K head: K stays FP16 (2,097,152 values x 2 B), V in NVFP4
    # (1,048,576 B + 131,072 B), and one FP32 scale per layer (V's) in the page
    ("llama2_7b", 16, ["codec=nvfp4", "codec.keep_rope_hot=true", "codec.tensor_scale=page"],
     4_194_304 + 1_048_576 + 131_072 + 32 * 4),
    # GQA, 16 tokens: 32 x 2 x 8 x 16 x 128 = 1,048,576 values
    ("llama3_1_8b", 16, ["codec=fp8"], 1_048_576),
    # + an FP32 scale per 128-value row (8 heads x 16 tokens x 2 x 32 layers) + tensor scales
    ("llama3_1_8b", 16, ["codec=fp8", "codec.fp8_scale_block=128", "codec.tensor_scale=page"],
     1_048_576 + 8_192 * 4 + 64 * 4),
    ("llama3_1_8b", 16, ["codec=nvfp4"], 589_824),
    # a 64-value RoPE part of each K head kept in BF16: K's other 64 values and V in NVFP4
    ("llama3_1_8b", 16, ["codec=nvfp4", "codec.keep_rope_hot=true", "model.rope_dim=64"],
     (1_048_576 - 262_144) * 9 // 16 + 262_144 * 2),
    # MLA, 64 tokens: 61 layers x 64 tokens x 576 latent values = 2,248,704 values
    ("deepseek_v3", 64, ["codec=identity"], 2_248_704 * 2),
    ("deepseek_v3", 64, ["codec=fp8"], 2_248_704),
    ("deepseek_v3", 64, ["codec=nvfp4"], 2_248_704 * 9 // 16),
    ("deepseek_v3", 64, ["codec=nvfp4", "codec.keep_rope_hot=true"],
     61 * 64 * (512 * 9 // 16 + 64 * 2)),
    # FP8 with an FP32 scale per 128 latent values and RoPE in BF16: vLLM's fp8_ds_mla record
    # (656 B a token and layer), the FP32 tensor scale held by the server
    ("deepseek_v3", 64, ["codec=fp8", "codec.fp8_scale_block=128", "codec.keep_rope_hot=true"],
     61 * 64 * 656),
    # one token: values 61 x 288 = 17,568 B; scales 61 x 36 = 2,196 B, padded to 2,208; tensor
    # scales 61 x 4 = 244 B, padded to 256
    ("deepseek_v3", 1, ["codec=nvfp4", "codec.tensor_scale=page", "codec.align_bytes=16"],
     17_568 + 2_208 + 256),
    ("deepseek_v3", 1, ["codec=nvfp4", "codec.tensor_scale=page"], 17_568 + 2_196 + 244),
    # sliding-window layers hold no pages: 18 layers x 2 x 8 heads x 16 tokens x 64 values
    ("gpt_oss_120b", 16, ["codec=fp8"], 294_912),
    ("gpt_oss_120b", 16, ["codec=nvfp4"], 294_912 * 9 // 16),
]


@pytest.mark.parametrize("model,block_size,overrides,expected", COLD,
                         ids=[f"{m}-{b}-{' '.join(o)}" for m, b, o, _ in COLD])
def test_cold_page_bytes_per_model_card(model, block_size, overrides, expected):
    assert page(model, f"cache.block_size={block_size}", *overrides) == expected


def test_identity_pages_are_the_hot_record():
    """An identity page is the block as the GPU stores it, an FP8 or NVFP4 record's scales
    included (DeepSeek-V3 FP8: 656 B a token and layer)."""
    for dtype in ("auto", "fp8", "nvfp4"):
        c = cfg("deepseek_v3", "codec=identity", f"cache.kv_cache_dtype={dtype}",
                "cache.block_size=64")
        assert cold_page_bytes(c.model, c.cache, c.codec) == HOT["deepseek_v3", dtype][1] * 64


@pytest.mark.parametrize("model,overrides", [
    ("llama3_1_8b", []), ("llama2_7b", []), ("gpt_oss_120b", []),
    ("llama3_1_8b", ["model.rope_dim=64", "codec.keep_rope_hot=true"])])
def test_cold_pages_are_the_bytes_gpu_validation_kernels_write(model, overrides):
    """The fp8 and nvfp4 presets' pages are the pages gpu_validation's codec kernels write
    (their layouts in gpu_validation/reference.py)."""
    pytest.importorskip("torch")
    from gpu_validation import reference as R
    from sim.hardware import full_attention_layers

    c = cfg(model, "codec=nvfp4", "cache.block_size=16", *overrides)
    m = c.model
    rope = int(m.rope_dim) if c.codec.keep_rope_hot else 0
    lay = R.nvfp4_page_layout(full_attention_layers(m), int(m.num_kv_heads), 16,
                              int(m.head_dim), rope_dim=rope)
    assert cold_page_bytes(m, c.cache, c.codec) == lay["page_bytes"]
    if not rope:
        assert page(model, "codec=fp8", "cache.block_size=16", *overrides) == R.fp8_page_bytes(
            full_attention_layers(m), int(m.num_kv_heads), 16, int(m.head_dim))


@pytest.mark.parametrize("overrides,message", [
    (["codec=nvfp4", "model.head_dim=72"],
     "codec nvfp4 needs rows in multiples of 16 values .one scale per 16.; model Llama-3.1-8B "
     "has model.head_dim = 72"),
    (["codec=nvfp4", "codec.keep_rope_hot=true", "model.rope_dim=40"],
     "model Llama-3.1-8B has model.head_dim - model.rope_dim .K's part without RoPE. = 88"),
    (["codec=nvfp4", "codec.fp8_scale_block=128"],
     "codec.fp8_scale_block=128 sets FP8's block scales; codec nvfp4 has one E4M3 scale per "
     "16 values by its format"),
    (["codec=fp8", "codec.fp8_scale_block=-1"], "codec.fp8_scale_block=-1; expected 0"),
    (["codec=fp8", "codec.tensor_scale=token"],
     "codec.tensor_scale='token'; expected one of \\['layer', 'page'\\]"),
    (["codec=fp8", "codec.align_bytes=0"], "codec.align_bytes=0; expected a section alignment"),
    (["codec=fp8", "cache.kv_cache_dtype=fp8"], "codec fp8 encodes a 16-bit hot cache"),
])
def test_codec_settings_the_format_cannot_take_are_named(overrides, message):
    with pytest.raises(ConfigError, match=message):
        page("llama3_1_8b", *overrides)
