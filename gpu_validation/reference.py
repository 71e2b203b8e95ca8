"""Plain torch references for every kernel in :mod:`gpu_validation.kernels`.

These are written to be obviously correct, not fast: per-request Python loops, one token
at a time where order matters. The Triton kernels must equal them bit for bit (compaction)
or exactly in codes and scales (codecs); ``tests/test_gpu_kernels.py`` checks that.

Number formats (the rules both sides implement, in float32 arithmetic):

* E2M1 (FP4), per NVIDIA's NVFP4 / OCP MX definition: sign bit + 2 exponent bits + 1 mantissa
  bit, magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Rounding: to nearest, ties to the even code,
  saturating at 6. A value that rounds to 0 is stored as +0 (sign bit only on non-zero codes),
  so a decoded page re-encodes to the same bytes.
* E4M3 (FP8, ``float8_e4m3fn``): bias 7, max 448, subnormal step 2**-9. Rounding: to nearest
  even, saturating at 448 (the value is clamped first). Used for the NVFP4 block scales
  (unsigned there) and for FP8 pages.
* NVFP4 per NVIDIA's format: one E4M3 scale per 16 consecutive values of a row, and one FP32
  global scale per (layer, K/V) that lives in metadata, not in the page.
  ``s = amax16 / (6 * g)``, ``s_q = E4M3(s)``, ``code = E2M1(x * (1 / (s_q * g)))``;
  decode ``x' = (E2M1value(code) * s_q) * g``. With ``g`` a power of two (what
  :func:`nvfp4_global_scale` returns) decode is exact in bf16/fp16 and a second
  encode/decode round trip returns the decoded page unchanged.
"""
from __future__ import annotations


import torch

E4M3_MAX = 448.0
E4M3_MIN_NORMAL = 2.0 ** -6
E2M1_MAX = 6.0
NVFP4_GROUP = 16
# Bytes per value of an NVFP4 cold page: 4-bit code + one 8-bit scale per 16 values.
NVFP4_BYTES_PER_VALUE = 0.5 + 1.0 / NVFP4_GROUP  # 0.5625


# ----------------------------------------------------------------------------- formats
def e4m3_round(s: torch.Tensor) -> torch.Tensor:
    """Round non-negative float32 ``s`` (already clamped to [0, 448]) to the nearest E4M3
    value, ties to even. Returns float32 holding exactly representable E4M3 values."""
    s = s.to(torch.float32)
    u = s.view(torch.int32)
    rnd = (u + 0x7FFFF + ((u >> 20) & 1)) & -1048576  # keep 3 mantissa bits, RNE
    normal = rnd.view(torch.float32)
    sub = (s + 16384.0) - 16384.0  # multiples of 2**-9, RNE (fp32 ulp at 2**14 is 2**-9)
    return torch.where(s >= E4M3_MIN_NORMAL, normal, sub)


def e4m3_byte(sq: torch.Tensor) -> torch.Tensor:
    """Bit pattern (int32, 0..126) of non-negative float32 values that are exact E4M3."""
    u = sq.view(torch.int32)
    normal = ((((u >> 23) & 0xFF) - 120) << 3) | ((u >> 20) & 7)
    sub = (sq * 512.0).to(torch.int32)
    return torch.where(sq >= E4M3_MIN_NORMAL, normal, sub)


def e4m3_value(b: torch.Tensor) -> torch.Tensor:
    """float32 value of unsigned E4M3 bit patterns ``b`` (int tensor, sign bit ignored)."""
    b = b.to(torch.int32) & 0x7F
    e = b >> 3
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).view(torch.float32)
    sub = m.to(torch.float32) * (1.0 / 512.0)
    return torch.where(e > 0, normal, sub)


def e2m1_code(v: torch.Tensor) -> torch.Tensor:
    """E2M1 4-bit codes (int32 0..15) of float32 ``v``: RNE on {0,.5,1,1.5,2,3,4,6}, saturating."""
    a = v.abs()
    code = ((a > 0.25).to(torch.int32) + (a >= 0.75).to(torch.int32) + (a > 1.25).to(torch.int32)
            + (a >= 1.75).to(torch.int32) + (a > 2.5).to(torch.int32) + (a >= 3.5).to(torch.int32)
            + (a > 5.0).to(torch.int32))
    sign = ((v < 0) & (code > 0)).to(torch.int32) << 3
    return code | sign


def e2m1_value(c: torch.Tensor) -> torch.Tensor:
    """float32 value of E2M1 codes ``c`` (int tensor 0..15)."""
    c = c.to(torch.int32)
    mag = c & 7
    e = mag >> 1
    m = (mag & 1).to(torch.float32)
    p = (1 << torch.clamp(e - 1, min=0)).to(torch.float32)
    val = torch.where(e == 0, m * 0.5, (1.0 + 0.5 * m) * p)
    return torch.where((c & 8) != 0, -val, val)


def nvfp4_global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """Per-layer NVFP4 global scale: the smallest power of two ``g`` with
    ``amax / (6 * g) <= 448`` (so no block scale saturates). float32, same shape as amax."""
    a = torch.as_tensor(amax, dtype=torch.float32)
    a = torch.clamp(a, min=1e-30)
    return torch.exp2(torch.ceil(torch.log2(a / (E2M1_MAX * E4M3_MAX)))).to(torch.float32)


def fp8_global_scale(amax: torch.Tensor | float) -> torch.Tensor:
    """Per-layer FP8 page scale: the smallest power of two ``s`` with ``amax / s <= 448``."""
    a = torch.clamp(torch.as_tensor(amax, dtype=torch.float32), min=1e-30)
    return torch.exp2(torch.ceil(torch.log2(a / E4M3_MAX))).to(torch.float32)


# ----------------------------------------------------------------------------- page layout
def nvfp4_page_layout(num_layers: int, num_kv_heads: int, block_size: int, head_dim: int,
                      rope_dim: int = 0, rope_side: str = "trailing", elem_bytes: int = 2) -> dict:
    """Byte layout of one NVFP4 cold page (all layers' K and V of one block).

    Sections, each ordered [layer][K,V][head][token]:
      data   : packed E2M1 codes, 2 per byte (even column in the low nibble),
               ``qk/2`` bytes per K row and ``head_dim/2`` per V row;
      scales : one E4M3 byte per 16 quantised values of a row;
      rope   : only with ``rope_dim > 0`` (skip-RoPE option): the K row's RoPE columns
               copied unquantised in the hot dtype, ``[layer][head][token][rope_dim]``.
    ``qk = head_dim - rope_dim`` must be a positive multiple of 16 and the RoPE columns must be
    one end of the row (``rope_side`` "leading" or "trailing"), else ValueError (the codec
    quantises one contiguous piece per row, as the TensorRT-LLM cold-page codec does).
    """
    if rope_dim < 0 or rope_dim >= head_dim:
        raise ValueError(f"rope_dim={rope_dim} must be in [0, head_dim={head_dim})")
    qk = head_dim - rope_dim
    if qk % NVFP4_GROUP or head_dim % NVFP4_GROUP:
        raise ValueError(f"quantised width {qk} and head_dim {head_dim} must be multiples of 16")
    if rope_side not in ("leading", "trailing"):
        raise ValueError("rope_side must be 'leading' or 'trailing'")
    L, H, B, D = num_layers, num_kv_heads, block_size, head_dim
    data_k = H * B * qk // 2
    data_v = H * B * D // 2
    sc_k = H * B * qk // NVFP4_GROUP
    sc_v = H * B * D // NVFP4_GROUP
    data_bytes = L * (data_k + data_v)
    scale_bytes = L * (sc_k + sc_v)
    rope_bytes = L * H * B * rope_dim * elem_bytes
    return dict(num_layers=L, num_kv_heads=H, block_size=B, head_dim=D, rope_dim=rope_dim,
                rope_side=rope_side, qk=qk, q0=(rope_dim if rope_side == "leading" else 0),
                r0=(0 if rope_side == "leading" else qk), elem_bytes=elem_bytes,
                data_k=data_k, data_v=data_v, sc_k=sc_k, sc_v=sc_v,
                data_off=0, scale_off=data_bytes, rope_off=data_bytes + scale_bytes,
                data_bytes=data_bytes, scale_bytes=scale_bytes, rope_bytes=rope_bytes,
                page_bytes=data_bytes + scale_bytes + rope_bytes)


def fp8_page_bytes(num_layers: int, num_kv_heads: int, block_size: int, head_dim: int) -> int:
    """Bytes of one FP8 cold page: one byte per value, ordered [layer][K,V][head][token][dim]."""
    return num_layers * 2 * num_kv_heads * block_size * head_dim


# ----------------------------------------------------------------------------- compaction
def forward_move_sources(kept, prompt_len: int, valid_len: int, tail: int):
    """Move sources of one request for forward packing: the kept ordinals, then the
    protected tail ``[valid_len - tail, valid_len)``. Destination of move ``m`` is
    ``prompt_len + m``. Raises ValueError on unsorted or out-of-range ordinals."""
    kept = [int(k) for k in kept]
    if any(b <= a for a, b in zip(kept, kept[1:])):
        raise ValueError("kept ordinals must be strictly increasing")
    if kept and (kept[0] < prompt_len or kept[-1] >= valid_len - tail):
        raise ValueError("kept ordinals must lie in [prompt_len, valid_len - tail)")
    if tail < 0 or valid_len - tail < prompt_len:
        raise ValueError("need 0 <= tail <= valid_len - prompt_len")
    return kept + list(range(valid_len - tail, valid_len))


def ref_compact_forward(kv: torch.Tensor, block_tables, requests):
    """Reference forward packing, in place on ``kv`` ([L, NB, 2, H, B, D]).

    ``requests``: list of dicts with ``kept`` (ordinals), ``prompt_len``, ``valid_len``,
    ``tail``; ``block_tables``: list of block-id lists. Moves one token at a time in order.
    Returns (new_lens list, freed block ids per request list).
    """
    B = kv.shape[4]
    new_lens, freed = [], []
    for bt, rq in zip(block_tables, requests):
        P, V, T = rq["prompt_len"], rq["valid_len"], rq["tail"]
        src = forward_move_sources(rq["kept"], P, V, T)
        for m, s in enumerate(src):
            d = P + m
            if s != d:
                kv[:, bt[d // B], :, :, d % B, :] = kv[:, bt[s // B], :, :, s % B, :].clone()
        n = P + len(src)
        new_lens.append(n)
        freed.append(list(bt[-(-n // B):-(-V // B)]))
    return new_lens, freed


def hole_fill_moves(kept, prompt_len: int, valid_len: int, tail: int):
    """(src, dst) slot pairs of hole filling: survivors at slots >= new_len move, in
    ascending order, into the ascending holes below new_len. Order is not preserved."""
    src_fwd = forward_move_sources(kept, prompt_len, valid_len, tail)
    n = prompt_len + len(src_fwd)
    alive = set(src_fwd)
    holes = [s for s in range(prompt_len, n) if s not in alive]
    movers = [s for s in src_fwd if s >= n]
    assert len(holes) == len(movers)
    return movers, holes


def ref_compact_hole_fill(kv: torch.Tensor, positions: torch.Tensor, block_tables, requests):
    """Reference hole filling, in place on ``kv`` and the per-slot position index
    ``positions`` ([NB, B] int32). Returns (new_lens, freed block ids per request)."""
    B = kv.shape[4]
    new_lens, freed = [], []
    for bt, rq in zip(block_tables, requests):
        P, V, T = rq["prompt_len"], rq["valid_len"], rq["tail"]
        src, dst = hole_fill_moves(rq["kept"], P, V, T)
        for s, d in zip(src, dst):
            kv[:, bt[d // B], :, :, d % B, :] = kv[:, bt[s // B], :, :, s % B, :].clone()
            positions[bt[d // B], d % B] = positions[bt[s // B], s % B]
        n = P + len(rq["kept"]) + T
        new_lens.append(n)
        freed.append(list(bt[-(-n // B):-(-V // B)]))
    return new_lens, freed


# ----------------------------------------------------------------------------- NVFP4
def _quant_cols(lay, kv_index):
    if kv_index == 0:
        return lay["q0"], lay["qk"]
    return 0, lay["head_dim"]


def ref_nvfp4_encode(kv: torch.Tensor, blocks, gscale: torch.Tensor, rope_dim: int = 0,
                     rope_side: str = "trailing") -> torch.Tensor:
    """Encode pages ``blocks`` of ``kv`` ([L, NB, 2, H, B, D], bf16/fp16) into a
    [len(blocks), page_bytes] uint8 tensor. ``gscale``: float32 [L, 2] global scales."""
    L, _, _, H, B, D = kv.shape
    lay = nvfp4_page_layout(L, H, B, D, rope_dim, rope_side, kv.element_size())
    out = torch.zeros(len(blocks), lay["page_bytes"], dtype=torch.uint8)
    g_all = gscale.to(torch.float32).cpu()
    for p, blk in enumerate(blocks):
        page = out[p]
        for l in range(L):
            for c in range(2):
                q0, q = _quant_cols(lay, c)
                x = kv[l, blk, c, :, :, q0:q0 + q].to(torch.float32).cpu()  # [H, B, q]
                g = g_all[l, c]
                xg = x.reshape(H, B, q // 16, 16)
                amax = xg.abs().amax(dim=-1)
                s = torch.clamp(amax / (g * 6.0), max=E4M3_MAX)
                sq = e4m3_round(s)
                inv = torch.where(sq > 0, 1.0 / (sq * g), torch.zeros_like(sq))
                codes = e2m1_code(xg * inv[..., None]).reshape(H, B, q)
                packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
                d0 = lay["data_off"] + l * (lay["data_k"] + lay["data_v"]) + c * lay["data_k"]
                s0 = lay["scale_off"] + l * (lay["sc_k"] + lay["sc_v"]) + c * lay["sc_k"]
                page[d0:d0 + packed.numel()] = packed.reshape(-1)
                page[s0:s0 + sq.numel()] = e4m3_byte(sq).to(torch.uint8).reshape(-1)
            if rope_dim:
                r0 = lay["r0"]
                raw = kv[l, blk, 0, :, :, r0:r0 + rope_dim].contiguous().cpu()
                rb = raw.view(torch.uint8).reshape(-1)
                o = lay["rope_off"] + l * H * B * rope_dim * lay["elem_bytes"]
                page[o:o + rb.numel()] = rb
    return out


def ref_nvfp4_decode(pages: torch.Tensor, kv: torch.Tensor, blocks, gscale: torch.Tensor,
                     rope_dim: int = 0, rope_side: str = "trailing") -> None:
    """Decode ``pages`` ([n, page_bytes] uint8) into ``kv`` blocks ``blocks`` in place."""
    L, _, _, H, B, D = kv.shape
    lay = nvfp4_page_layout(L, H, B, D, rope_dim, rope_side, kv.element_size())
    g_all = gscale.to(torch.float32).cpu()
    pages = pages.cpu()
    for p, blk in enumerate(blocks):
        page = pages[p]
        for l in range(L):
            for c in range(2):
                q0, q = _quant_cols(lay, c)
                g = g_all[l, c]
                d0 = lay["data_off"] + l * (lay["data_k"] + lay["data_v"]) + c * lay["data_k"]
                s0 = lay["scale_off"] + l * (lay["sc_k"] + lay["sc_v"]) + c * lay["sc_k"]
                packed = page[d0:d0 + H * B * q // 2].to(torch.int32).reshape(H, B, q // 2)
                codes = torch.stack([packed & 15, packed >> 4], dim=-1).reshape(H, B, q // 16, 16)
                sq = e4m3_value(page[s0:s0 + H * B * q // 16].reshape(H, B, q // 16))
                x = (e2m1_value(codes) * sq[..., None]) * g
                kv[l, blk, c, :, :, q0:q0 + q] = x.reshape(H, B, q).to(kv.dtype).to(kv.device)
            if rope_dim:
                r0 = lay["r0"]
                o = lay["rope_off"] + l * H * B * rope_dim * lay["elem_bytes"]
                rb = page[o:o + H * B * rope_dim * lay["elem_bytes"]].contiguous()
                kv[l, blk, 0, :, :, r0:r0 + rope_dim] = rb.view(kv.dtype).reshape(H, B, rope_dim).to(kv.device)


# ----------------------------------------------------------------------------- FP8
def fp8_code(v: torch.Tensor) -> torch.Tensor:
    """E4M3 bytes (int32 0..255) of float32 ``v``: RNE, saturating at +-448, zero stored as +0."""
    a = torch.clamp(v.abs(), max=E4M3_MAX)
    b = e4m3_byte(e4m3_round(a))
    return torch.where((v < 0) & (b > 0), b | 0x80, b)


def ref_fp8_encode(kv: torch.Tensor, blocks, scale: torch.Tensor) -> torch.Tensor:
    """Encode pages of a bf16/fp16 ``kv`` into [n, fp8_page_bytes] uint8: byte = E4M3(x * (1/s))
    with ``s`` the float32 [L, 2] per-(layer, K/V) scale."""
    L, _, _, H, B, D = kv.shape
    inv = (1.0 / scale.to(torch.float32).cpu())
    out = torch.empty(len(blocks), fp8_page_bytes(L, H, B, D), dtype=torch.uint8)
    for p, blk in enumerate(blocks):
        x = kv[:, blk].to(torch.float32).cpu()  # [L, 2, H, B, D]
        out[p] = fp8_code(x * inv[:, :, None, None, None]).to(torch.uint8).reshape(-1)
    return out


def ref_fp8_decode(pages: torch.Tensor, kv: torch.Tensor, blocks, scale: torch.Tensor) -> None:
    """Decode FP8 pages into ``kv`` blocks in place: x = E4M3value(byte) * s, cast to kv dtype."""
    L, _, _, H, B, D = kv.shape
    s = scale.to(torch.float32).cpu()
    for p, blk in enumerate(blocks):
        b = pages[p].cpu().to(torch.int32).reshape(L, 2, H, B, D)
        v = e4m3_value(b)
        v = torch.where((b & 0x80) != 0, -v, v)
        kv[:, blk] = (v * s[:, :, None, None, None]).to(kv.dtype).to(kv.device)
