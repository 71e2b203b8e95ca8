"""Stored number formats of KV values, and the bytes of a cold page that a codec's format gives.

A :class:`Format` stores each value in ``value_bits`` bits, one scale of ``block_scale_bytes``
per ``block_values`` consecutive values of a row (a row: one token's values of one K or V head,
or of one MLA latent), and one scale of ``tensor_scale_bytes`` per tensor (one layer's K or V,
or one layer's MLA latent). Its bytes are counted from those fields, never set by hand:

* **FP8** (E4M3, the OCP 8-bit floating point format: 1 sign, 4 exponent, 3 mantissa bits, max
  448): one byte a value and one FP32 scale per tensor, as vLLM's FP8 KV cache keeps
  ``k_scale`` / ``v_scale`` per attention layer (vLLM docs, "Quantized KV Cache") and
  TensorRT-LLM's "FP8 KV Cache" (its quantization docs, "FP8 Per Tensor"). With per-block
  scales, one FP32 scale per ``block_values`` values of a row: DeepSeek's FP8 MLA record keeps
  one per 128 latent values (vLLM ``fp8_ds_mla``, vllm/v1/attention/backends/mla/
  flashmla_sparse.py: 512 FP8 bytes + 4 FP32 scales + 64 BF16 RoPE values = 656 B a token and
  layer for DeepSeek-V3).
* **NVFP4** (NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference",
  NVIDIA technical blog, 2025): 4-bit E2M1 values, one E4M3 scale per 16 consecutive values
  (a micro-block), and a second-level FP32 scale per tensor. vLLM's NVFP4 KV cache stores
  ``head_size // 2 + head_size // 16`` bytes a head row (vllm/utils/torch_utils.py
  ``nvfp4_kv_cache_full_dim``: 72 B for 128 values) and keeps the FP32 scale per layer;
  FlashInfer's ``nvfp4_quantize_paged_kv_cache`` (flashinfer.quantization) returns the
  per-block E4M3 scales beside the pages and one FP32 global scale for K and one for V.

A cold page (:func:`sim.cold_pages.cold_page_layout`: one block of ``block_size`` tokens, all
full-attention layers, leaving the GPU through the codec ``codec.name``) is laid out in
sections, as gpu_validation/reference.py's ``nvfp4_page_layout`` writes it: ``data`` (the
encoded values),
``scales`` (the block scales), ``tensor_scales`` (one FP32 per tensor of the page, when
``codec.tensor_scale=page``: a page that carries its own scales, encoded alone; with ``layer``
the scale is the layer's, held once by the server and not in any page) and ``rope`` (with
``codec.keep_rope_hot``: K's RoPE part, or MLA's RoPE part, kept at the hot cache's precision).
Each section is padded to a multiple of ``codec.align_bytes`` (16: the alignment of CUDA's bulk
copies, cp.async.bulk / TMA, whose addresses and sizes are multiples of 16 bytes, CUDA C++
Programming Guide; 1: sections packed back to back, as gpu_validation's kernels write them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

FP32_BYTES = 4
E4M3_BYTES = 1
TENSOR_SCALES = ("layer", "page")  # codec.tensor_scale: where a tensor's FP32 scale lives


@dataclass(frozen=True)
class Format:
    """A stored number format (see the module doc). ``block_values`` 0: no block scales."""

    name: str
    value_bits: int
    block_values: int = 0
    block_scale_bytes: int = 0
    tensor_scale_bytes: int = 0

    def value_bytes(self, values: int) -> int:
        """Bytes of ``values`` encoded values (a whole number of bytes: 4-bit values pair
        up, so ``values`` is even for a 4-bit format)."""
        bits = values * self.value_bits
        if bits % 8:
            raise ValueError(f"{self.name}: {values} values of {self.value_bits} bits are not "
                             f"whole bytes")
        return bits // 8

    def scale_bytes(self, rows: int, width: int) -> int:
        """Bytes of the block scales of ``rows`` rows of ``width`` values (a row's last block
        may be short: it still has its scale)."""
        if not self.block_values or not width:
            return 0
        return rows * math.ceil(width / self.block_values) * self.block_scale_bytes

    def row_bytes(self, width: int) -> int:
        """Bytes of one row of ``width`` values with its block scales (no tensor scale)."""
        return self.value_bytes(width) + self.scale_bytes(1, width)

    @property
    def bytes_per_value(self) -> float:
        """Mean bytes a value with its block scale (a row of whole blocks; no tensor scale)."""
        return self.value_bits / 8 + (self.block_scale_bytes / self.block_values
                                      if self.block_values else 0.0)


FP8 = Format("fp8", 8, tensor_scale_bytes=FP32_BYTES)
NVFP4 = Format("nvfp4", 4, block_values=16, block_scale_bytes=E4M3_BYTES,
               tensor_scale_bytes=FP32_BYTES)


def fp8_blocks(block_values: int) -> Format:
    """FP8 with one FP32 scale per ``block_values`` values of a row besides its tensor scale
    (0: the tensor scale only, :data:`FP8`)."""
    if block_values == 0:
        return FP8
    return Format(f"fp8 (an FP32 scale per {block_values} values)", 8, block_values,
                  FP32_BYTES, FP32_BYTES)


def codec_format(codec) -> Format:
    """The format of the cold-page codec ``codec`` (a ``CodecConfig``: ``fp8`` or ``nvfp4``).
    Raises ConfigError naming the field for a setting the format cannot take."""
    from .errors import ConfigError

    block = int(codec.fp8_scale_block)
    if block < 0:
        raise ConfigError(f"codec.fp8_scale_block={block}; expected 0 (one FP32 scale per "
                          f"tensor) or the values per FP32 block scale (e.g. 128)")
    if codec.name == "nvfp4":
        if block:
            raise ConfigError(f"codec.fp8_scale_block={block} sets FP8's block scales; codec "
                              f"nvfp4 has one E4M3 scale per 16 values by its format (expected "
                              f"0, or codec=fp8)")
        return NVFP4
    return fp8_blocks(block)
