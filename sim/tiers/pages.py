"""Cold pages: the bytes of one encoded page and the GPU time of its codec.

A page (one block: all layers' K and V of ``block_size`` tokens) leaving the GPU is encoded by the
cold-page codec; every tier below the GPU holds the same encoded page. Bytes per block of ``B``
tokens with ``V`` cached values, from the codec's format (:mod:`sim.codecs`, which cites the
formats):

* ``identity``: the hot record as the GPU stores it (``V x hot_bytes``, or the FP8 / NVFP4
  record of ``cache.kv_cache_dtype`` with its scales).
* ``fp8`` (E4M3, from a 16-bit hot cache): ``V x 1``, plus one FP32 scale per
  ``codec.fp8_scale_block`` values of a row when set, plus one FP32 per tensor (layer x K/V)
  with ``codec.tensor_scale=page`` (``layer``: the scale is the layer's, in no page).
* ``nvfp4``: 4-bit E2M1 values + one E4M3 scale per 16 values = ``V x 0.5625`` bytes (seed 001:
  43.75% smaller than an FP8 page, 71.875% smaller than BF16), plus the FP32 tensor scales as
  for fp8. Needs rows (head dims) in multiples of 16.
* ``keep_rope_hot``: K's RoPE part (``rope_dim`` of each K head; MLA's ``qk_rope_head_dim``)
  stays at hot precision.
* Each section of the page (values, block scales, tensor scales, hot RoPE part) is padded to
  ``codec.align_bytes``.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..hardware import kv_bytes_per_block

CODECS = ("identity", "fp8", "nvfp4")


def cold_page_bytes(model, cache, codec) -> int:
    """Bytes of one encoded (cold) page; see the module docstring (``fp8`` and ``nvfp4``:
    :func:`sim.cold_pages.cold_page_layout`'s ``page_bytes``). Raises ConfigError when the codec
    cannot express the model's cache (NVFP4 rows not multiples of 16, FP8/NVFP4 from a cache
    that is not 16-bit) or a codec field is out of range."""
    from ..cold_pages import cold_page_layout

    name = codec.name
    if name not in CODECS:
        raise ConfigError(f"codec.name={name!r}; expected one of {list(CODECS)}")
    if name == "identity":  # (the hot record as the GPU stores it, scales included)
        return kv_bytes_per_block(model, cache)
    return cold_page_layout(model, cache, codec)["page_bytes"]


def codec_time(codec_name: str, hot_bytes: float, cold_bytes: float, hbm_Bps: float) -> float:
    """Analytic GPU time to encode or decode pages: read one side and write the other at HBM
    bandwidth (the quantisation arithmetic rides the memory traffic). 0 for ``identity``."""
    if codec_name == "identity":
        return 0.0
    return (hot_bytes + cold_bytes) / hbm_Bps
