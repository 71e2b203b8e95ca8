"""The bytes of a cold page: one block of a model's KV cache encoded by a codec's format
(:mod:`sim.codecs`) when it leaves the GPU, section by section (:func:`cold_page_layout`)."""

from __future__ import annotations

from .codecs import TENSOR_SCALES, codec_format
from .errors import ConfigError
from .hardware import full_attention_layers, kv_dtype_bytes


def cold_page_layout(model, cache, codec) -> dict:
    """Sections of one cold page of ``codec`` (``fp8`` or ``nvfp4``) for ``model`` and
    ``cache`` (:mod:`sim.codecs`' docstring), in bytes: ``data``, ``scales``, ``tensor_scales``,
    ``rope`` (each padded to ``codec.align_bytes``), ``padding`` (their padding together) and
    ``page_bytes`` (their sum). Raises ConfigError (naming the field) when the hot cache is
    not 16-bit, or for NVFP4 a row (a head, or the latent; K's part without RoPE with
    ``keep_rope_hot``) that is not a multiple of 16 values."""
    fmt = codec_format(codec)
    where = str(codec.tensor_scale)
    if where not in TENSOR_SCALES:
        raise ConfigError(f"codec.tensor_scale={where!r}; expected one of {list(TENSOR_SCALES)}"
                          f" (layer: the server holds each layer's scale; page: each page "
                          f"carries its tensors' scales)")
    align = int(codec.align_bytes)
    if align < 1:
        raise ConfigError(f"codec.align_bytes={align}; expected a section alignment >= 1 byte")
    hot = kv_dtype_bytes(model, cache)
    if hot != 2.0:
        raise ConfigError(
            f"codec {codec.name} encodes a 16-bit hot cache; cache.kv_cache_dtype gives "
            f"{hot:g} bytes per value (use codec=identity)")
    L, B = full_attention_layers(model), int(cache.block_size)
    keep = bool(codec.keep_rope_hot)
    if model.attention == "mla":
        rope = int(model.qk_rope_head_dim) if keep else 0
        # (per layer: one latent tensor of B rows; K and V share it)
        tensors = [(B, int(model.kv_lora_rank) + int(model.qk_rope_head_dim) - rope)]
        hot_values = B * rope
        what = "model.kv_lora_rank" + ("" if keep else " + model.qk_rope_head_dim")
    else:
        H, D = int(model.num_kv_heads), int(model.head_dim)
        rope = int(model.rope_dim) if keep else 0
        tensors = [(H * B, D - rope), (H * B, D)]  # (K without its hot RoPE part, V)
        hot_values = H * B * rope
        what = "model.head_dim" + (" - model.rope_dim (K's part without RoPE)" if keep else "")
    if fmt.block_values:
        bad = sorted({w for _, w in tensors if w % fmt.block_values})
        if bad:
            raise ConfigError(
                f"codec {codec.name} needs rows in multiples of {fmt.block_values} values (one "
                f"scale per {fmt.block_values}); model {model.name} has {what} = "
                f"{', '.join(map(str, bad))}")
    encoded = [(r, w) for r, w in tensors if w]
    raw = {
        "data": L * sum(fmt.value_bytes(r * w) for r, w in encoded),
        "scales": L * sum(fmt.scale_bytes(r, w) for r, w in encoded),
        "tensor_scales": L * len(encoded) * fmt.tensor_scale_bytes if where == "page" else 0,
        "rope": int(L * hot_values * hot),
    }
    out = {k: -(-v // align) * align for k, v in raw.items()}
    out["padding"] = sum(out.values()) - sum(raw.values())
    out["page_bytes"] = sum(out[k] for k in raw)
    return out
