"""Triton kernels for the paged KV pool of :mod:`gpu_validation.pool`.

All kernels take the pool ``kv`` of shape [L, NB, 2, H, B, D] (HND inside a block; see
pool.py) and explicit strides. The number formats are defined in
:mod:`gpu_validation.reference`, whose torch functions these kernels must equal exactly.

Kernels
-------
* ``compact_forward``: forward packing (order preserving). A Triton pack kernel writes each
  request's move sources (kept ordinals, then the protected tail) and destinations
  (``prompt_len + m``); one mover launch per pool moves K and V of every (request, layer,
  K/V, head) row in place through the block table. Destination <= source always, so each
  program walks its moves in chunks of increasing ordinal and separates a chunk's loads from
  its stores with a CTA barrier; a later chunk never reads a slot an earlier chunk wrote.
  Tokens whose slot does not change are masked out (cost = bytes of tokens that move).
* ``compact_hole_fill``: slot reuse. Survivors above the new length move into the holes
  below it (ascending pairs); sources and destinations are disjoint, so no ordering is
  needed. The per-slot position index moves with them.
* ``nvfp4_encode`` / ``nvfp4_decode``: hot page (all layers' K and V of one block) <-> one
  contiguous NVFP4 cold page, optionally leaving K's RoPE columns unquantised. ``out`` /
  ``pages`` may be device memory or pinned host memory (the kernel then reads/writes the host
  page directly through the mapped pointer: the "fused" host copy).
* ``fp8_encode`` / ``fp8_decode``: bf16/fp16 page <-> FP8 (E4M3) cold page, per-(layer, K/V)
  scale.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .reference import E4M3_MAX, fp8_page_bytes, forward_move_sources, nvfp4_page_layout


# ============================================================================ helpers (jit)
@triton.jit
def _e4m3_round(s):
    # s: float32 in [0, 448]. RNE to 3 mantissa bits (normal) or to a multiple of 2**-9.
    u = s.to(tl.int32, bitcast=True)
    r = (u + 0x7FFFF + ((u >> 20) & 1)) & -1048576
    normal = r.to(tl.float32, bitcast=True)
    sub = (s + 16384.0) - 16384.0
    return tl.where(s >= 0.015625, normal, sub)


@triton.jit
def _e4m3_byte(sq):
    u = sq.to(tl.int32, bitcast=True)
    normal = ((((u >> 23) & 0xFF) - 120) << 3) | ((u >> 20) & 7)
    sub = (sq * 512.0).to(tl.int32)
    return tl.where(sq >= 0.015625, normal, sub)


@triton.jit
def _e4m3_value(b):
    # b: int32 bit patterns; sign bit ignored
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    sub = m.to(tl.float32) * 0.001953125
    return tl.where(e > 0, normal, sub)


@triton.jit
def _e2m1_code(v):
    a = tl.abs(v)
    code = ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
            + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
            + (a > 5.0).to(tl.int32))
    return tl.where((v < 0) & (code > 0), code | 8, code)


@triton.jit
def _e2m1_value(c):
    mag = c & 7
    e = mag >> 1
    m = (mag & 1).to(tl.float32)
    p = (1 << tl.maximum(e - 1, 0)).to(tl.float32)
    val = tl.where(e == 0, m * 0.5, (1.0 + 0.5 * m) * p)
    return tl.where((c & 8) != 0, -val, val)


# ============================================================================ compaction
@triton.jit
def _pack_forward_kernel(kept_ptr, keep_cnt_ptr, prompt_ptr, valid_ptr, tail_ptr,
                         src_ptr, dst_ptr, nmov_ptr, first_ptr, kept_stride, mv_stride,
                         BLOCK: tl.constexpr):
    r = tl.program_id(0)
    c = tl.program_id(1)
    K = tl.load(keep_cnt_ptr + r)
    P = tl.load(prompt_ptr + r)
    V = tl.load(valid_ptr + r)
    T = tl.load(tail_ptr + r)
    n = K + T
    m = c * BLOCK + tl.arange(0, BLOCK)
    kept = tl.load(kept_ptr + r * kept_stride + m, mask=m < K, other=0)
    # kept tokens first, then the protected tail [V - T, V)
    src = tl.where(m < K, kept, V - T + (m - K))
    msk = m < n
    tl.store(src_ptr + r * mv_stride + m, src, mask=msk)
    tl.store(dst_ptr + r * mv_stride + m, P + m, mask=msk)
    # src - dst never decreases along m, so the moves that change slot form a suffix:
    # record where it starts (the mover skips the no-op prefix)
    first = tl.min(tl.where(msk & (src != P + m), m, n), axis=0)
    tl.atomic_min(first_ptr + r, first)
    if c == 0:
        tl.store(nmov_ptr + r, n)


@triton.jit
def _move_tokens_kernel(kv_ptr, bt_ptr, src_ptr, dst_ptr, nmov_ptr, first_ptr,
                        s_layer, s_block, s_kv, s_head, bt_stride, mv_stride,
                        NUM_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr,
                        HEAD_DIM: tl.constexpr, CHUNK: tl.constexpr):
    r = tl.program_id(0)
    row = tl.program_id(1)  # (layer, K/V, head)
    l = row // (2 * NUM_HEADS)
    kvh = row % (2 * NUM_HEADS)
    base = kv_ptr + l.to(tl.int64) * s_layer + (kvh // NUM_HEADS) * s_kv + (kvh % NUM_HEADS) * s_head
    n = tl.load(nmov_ptr + r)
    start = tl.load(first_ptr + r)
    d = tl.arange(0, HEAD_DIM)
    for c0 in range(start, n, CHUNK):
        m = c0 + tl.arange(0, CHUNK)
        mm = m < n
        s = tl.load(src_ptr + r * mv_stride + m, mask=mm, other=0)
        t = tl.load(dst_ptr + r * mv_stride + m, mask=mm, other=0)
        act = mm & (s != t)
        sb = tl.load(bt_ptr + r * bt_stride + s // BLOCK_SIZE, mask=act, other=0)
        tb = tl.load(bt_ptr + r * bt_stride + t // BLOCK_SIZE, mask=act, other=0)
        so = sb.to(tl.int64) * s_block + (s % BLOCK_SIZE) * HEAD_DIM
        to = tb.to(tl.int64) * s_block + (t % BLOCK_SIZE) * HEAD_DIM
        vals = tl.load(base + so[:, None] + d[None, :], mask=act[:, None])
        tl.debug_barrier()  # every load of this chunk before any store of it
        tl.store(base + to[:, None] + d[None, :], vals, mask=act[:, None])


def _bits(kv: torch.Tensor) -> torch.Tensor:
    """Reinterpret the pool as integers of its element width (moves are bit copies)."""
    return kv.view(torch.int16) if kv.element_size() == 2 else kv.view(torch.uint8)


class CompactionBatch:
    """Packed per-request compaction decision rows (device tensors, int32):
    ``kept`` [R, Kmax] (padded), ``keep_count``, ``prompt_len``, ``valid_len``, ``tail`` [R],
    ``block_table`` [R, W]. Built by :meth:`from_requests`; ``max_moves`` is the longest
    ``keep_count + tail`` (sizes the pack grid)."""

    def __init__(self, kept, keep_count, prompt_len, valid_len, tail, block_table, max_moves, max_keep):
        self.kept, self.keep_count, self.prompt_len = kept, keep_count, prompt_len
        self.valid_len, self.tail, self.block_table = valid_len, tail, block_table
        self.max_moves, self.max_keep = max_moves, max_keep

    @property
    def num_requests(self) -> int:
        return self.kept.shape[0]

    @classmethod
    def from_requests(cls, requests, block_tables, device, validate: bool = True):
        """``requests``: dicts with ``kept`` (strictly increasing ordinals in
        [prompt_len, valid_len - tail)), ``prompt_len``, ``valid_len``, ``tail``;
        ``block_tables``: block-id lists covering at least ``valid_len`` slots.
        ValueError on a malformed row (when ``validate``)."""
        R = len(requests)
        kmax = max(1, max(len(r["kept"]) for r in requests))
        wmax = max(len(b) for b in block_tables)
        kept = torch.zeros((R, kmax), dtype=torch.int32)
        bt = torch.zeros((R, wmax), dtype=torch.int32)
        meta = torch.zeros((4, R), dtype=torch.int32)
        max_moves = 1
        for i, (rq, b) in enumerate(zip(requests, block_tables)):
            if validate:
                forward_move_sources(rq["kept"], rq["prompt_len"], rq["valid_len"], rq["tail"])
            if len(rq["kept"]):
                kept[i, :len(rq["kept"])] = torch.as_tensor(rq["kept"], dtype=torch.int32)
            bt[i, :len(b)] = torch.as_tensor(b, dtype=torch.int32)
            meta[:, i] = torch.tensor([len(rq["kept"]), rq["prompt_len"], rq["valid_len"], rq["tail"]])
            max_moves = max(max_moves, len(rq["kept"]) + rq["tail"])
        meta = meta.to(device)
        return cls(kept.to(device), meta[0], meta[1], meta[2], meta[3], bt.to(device), max_moves, kmax)


def _freed_blocks(batch: CompactionBatch, new_lens: torch.Tensor, block_size: int):
    W = batch.block_table.shape[1]
    idx = torch.arange(W, device=new_lens.device)[None, :]
    lo = ((new_lens + block_size - 1) // block_size)[:, None]
    hi = ((batch.valid_len + block_size - 1) // block_size)[:, None]
    mask = (idx >= lo) & (idx < hi)
    bt = batch.block_table.cpu()
    mask = mask.cpu()
    return [bt[i][mask[i]].tolist() for i in range(bt.shape[0])]


def _mover_config(programs: int, head_dim: int):
    """(CHUNK, num_warps) of the mover: with few (request, layer, K/V, head) rows the chip
    is latency bound, so each program moves more tokens per barrier."""
    if programs >= 4096:
        return 64, 4
    return (128, 8) if head_dim >= 128 else (256, 8)


def compact_forward(kv: torch.Tensor, batch: CompactionBatch, chunk: int | None = None,
                    num_warps: int = 4, return_freed: bool = True):
    """Forward-packing compaction of ``batch`` in place on ``kv`` ([L, NB, 2, H, B, D]).

    Two launches: the pack kernel (move sources/destinations) and one mover launch over
    (request, layer, K/V, head). Returns ``(new_lens, freed)``: int32 [R] device tensor
    ``prompt_len + keep_count + tail`` and, if ``return_freed``, per request the list of
    block ids (from the block table) at or past ``ceil(new_len / B)`` and below
    ``ceil(valid_len / B)``: the blocks that became empty (the caller returns them to the
    pool). ``return_freed=False`` avoids the device->host sync (for timing).
    """
    L, NB, _, H, B, D = kv.shape
    R = batch.num_requests
    dev = kv.device
    M = batch.max_moves
    src = torch.empty((R, M), dtype=torch.int32, device=dev)
    dst = torch.empty((R, M), dtype=torch.int32, device=dev)
    nmov = torch.empty((R,), dtype=torch.int32, device=dev)
    first = torch.full((R,), 2 ** 30, dtype=torch.int32, device=dev)
    PB = 256
    _pack_forward_kernel[(R, triton.cdiv(M, PB))](
        batch.kept, batch.keep_count, batch.prompt_len, batch.valid_len, batch.tail,
        src, dst, nmov, first, batch.kept.stride(0), M, BLOCK=PB)
    bits = _bits(kv)
    if chunk is None:
        chunk, num_warps = _mover_config(R * L * 2 * H, D)
    _move_tokens_kernel[(R, L * 2 * H)](
        bits, batch.block_table, src, dst, nmov, first,
        bits.stride(0), bits.stride(1), bits.stride(2), bits.stride(3),
        batch.block_table.stride(0), M,
        NUM_HEADS=H, BLOCK_SIZE=B, HEAD_DIM=D, CHUNK=chunk, num_warps=num_warps)
    new_lens = batch.prompt_len + batch.keep_count + batch.tail
    if not return_freed:
        return new_lens, None
    return new_lens, _freed_blocks(batch, new_lens, B)


def hole_fill_pairs(batch: CompactionBatch, block_size: int):
    """(src, dst, n_moves) int32 device tensors of hole filling, computed with torch ops:
    survivors at slots >= new_len, ascending, paired with the ascending holes below it."""
    R, W = batch.block_table.shape
    dev = batch.kept.device
    S = W * block_size
    s = torch.arange(S + 1, device=dev)[None, :]
    P = batch.prompt_len[:, None].long()
    V = batch.valid_len[:, None].long()
    T = batch.tail[:, None].long()
    K = batch.keep_count[:, None].long()
    kidx = torch.arange(batch.kept.shape[1], device=dev)[None, :]
    kept = torch.where(kidx < K, batch.kept.long(), torch.full_like(batch.kept.long(), S))
    alive = torch.zeros((R, S + 1), dtype=torch.bool, device=dev)
    alive.scatter_(1, kept, True)
    alive |= (s < P) | ((s >= V - T) & (s < V))
    new = P + K + T
    hole = ~alive & (s >= P) & (s < new)
    mover = alive & (s >= new) & (s < V)
    n = mover.sum(1)
    nmax = int(n.max().item()) if R else 0
    src = torch.zeros((R, nmax + 1), dtype=torch.int64, device=dev)
    dst = torch.zeros((R, nmax + 1), dtype=torch.int64, device=dev)
    rm = torch.where(mover, mover.cumsum(1) - 1, nmax)
    rh = torch.where(hole, hole.cumsum(1) - 1, nmax)
    src.scatter_(1, rm, s.expand(R, -1))
    dst.scatter_(1, rh, s.expand(R, -1))
    return src[:, :max(nmax, 1)].to(torch.int32).contiguous(), dst[:, :max(nmax, 1)].to(torch.int32).contiguous(), n.to(torch.int32)


def compact_hole_fill(kv: torch.Tensor, positions: torch.Tensor | None, batch: CompactionBatch,
                      chunk: int | None = None, num_warps: int = 4, return_freed: bool = True, pairs=None):
    """Hole-filling compaction in place on ``kv`` and the per-slot position index
    ``positions`` ([NB, B] int32, may be None). Same return value as :func:`compact_forward`.
    Moves only survivors that sit at or beyond the new length (fewest bytes), loses order.
    ``pairs``: precomputed :func:`hole_fill_pairs` (else computed here with torch ops, which
    synchronises with the host once)."""
    L, NB, _, H, B, D = kv.shape
    src, dst, nmov = pairs if pairs is not None else hole_fill_pairs(batch, B)
    bits = _bits(kv)
    if chunk is None:
        chunk, num_warps = _mover_config(batch.num_requests * L * 2 * H, D)
    _move_tokens_kernel[(batch.num_requests, L * 2 * H)](
        bits, batch.block_table, src, dst, nmov, torch.zeros_like(nmov),
        bits.stride(0), bits.stride(1), bits.stride(2), bits.stride(3),
        batch.block_table.stride(0), src.shape[1],
        NUM_HEADS=H, BLOCK_SIZE=B, HEAD_DIM=D, CHUNK=chunk, num_warps=num_warps)
    if positions is not None:
        valid = torch.arange(src.shape[1], device=src.device)[None, :] < nmov[:, None].long()
        bt = batch.block_table.long()
        sl, dl = src.long(), dst.long()
        sblk = torch.gather(bt, 1, sl // B)[valid]
        dblk = torch.gather(bt, 1, dl // B)[valid]
        positions[dblk, (dl % B)[valid]] = positions[sblk, (sl % B)[valid]]
    new_lens = batch.prompt_len + batch.keep_count + batch.tail
    if not return_freed:
        return new_lens, None
    return new_lens, _freed_blocks(batch, new_lens, B)


# ============================================================================ NVFP4 codec
# One program = (page, layer, head, token tile), K then V. The hot rows are read as int32
# words (two adjacent bf16/fp16 values each) in a 2-D tile of [scale groups, 8 words]: a
# tile row is one 16-value scale group, so the group amax, the scale and the codes stay in
# registers (no reshape / split through shared memory), and the even value of a word is
# the low nibble of its output byte. E2M1 and E4M3 rounding are integer/float bit tricks.
@triton.jit
def _word_lo_hi(w, IS_BF16: tl.constexpr):
    if IS_BF16:
        lo = (w << 16).to(tl.float32, bitcast=True)
        hi = (w & -65536).to(tl.float32, bitcast=True)
    else:
        lo = w.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        hi = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return lo, hi


@triton.jit
def _e2m1_code_fast(v):
    # == _e2m1_code (compare chain) for every float32 (checked exhaustively against
    # reference.e2m1_code): RNE onto {0,.5,1,1.5,2,3,4,6}, saturating, NaN -> 0, sign only on
    # non-zero codes. |v| < 1: 2|v| rounded to an integer (0, 1, 2) by adding 2**22 (fp32 ulp
    # 0.5 there) and reading the low mantissa bits; |v| >= 1: keep one mantissa bit (RNE) and
    # read exponent|mantissa as the code. Integer ops only (no float->int convert).
    a = tl.minimum(tl.abs(v), 6.0)
    u = a.to(tl.int32, bitcast=True)
    cn = ((u + 0x1FFFFF + ((u >> 22) & 1)) >> 22) - 252
    cs = (a + 4194304.0).to(tl.int32, bitcast=True) - 0x4A800000
    code = tl.where(a < 1.0, cs, cn)
    code = tl.where(v == v, code, 0)
    # sign bit of v moved to bit 3, kept only when code > 0 ((code + 7) & 8 == 8 iff code >= 1)
    return code | ((v.to(tl.int32, bitcast=True) >> 28) & (code + 7) & 8)


@triton.jit
def _e2m1_value_fast(c):
    # == _e2m1_value: magnitude 2..7 is the float with exponent|mantissa = code + 252
    mag = c & 7
    big = ((mag + 252) << 22).to(tl.float32, bitcast=True)
    val = tl.where(mag < 2, mag.to(tl.float32) * 0.5, big)
    return (val.to(tl.int32, bitcast=True) | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _nvfp4_dec_words(wp, dp, sp, rm, g, IS_BF16: tl.constexpr):
    # inverse of _nvfp4_enc_words: codes and scales of one part -> [groups, 8] hot words
    b = tl.load(dp, mask=rm[:, None], other=0).to(tl.int32)
    sq = _e4m3_value(tl.load(sp, mask=rm, other=0).to(tl.int32))
    lo = (_e2m1_value_fast(b & 15) * sq[:, None]) * g
    hi = (_e2m1_value_fast(b >> 4) * sq[:, None]) * g
    if IS_BF16:
        lo16 = lo.to(tl.bfloat16).to(tl.int16, bitcast=True)
        hi16 = hi.to(tl.bfloat16).to(tl.int16, bitcast=True)
    else:
        lo16 = lo.to(tl.float16).to(tl.int16, bitcast=True)
        hi16 = hi.to(tl.float16).to(tl.int16, bitcast=True)
    tl.store(wp, (lo16.to(tl.int32) & 0xFFFF) | (hi16.to(tl.int32) << 16), mask=rm[:, None])


@triton.jit
def _nvfp4_enc_words(w, dp, sp, rm, g, IS_BF16: tl.constexpr):
    # w: [groups, 8] int32 words of one part; dp / sp: byte pointers of its codes / scales
    lo, hi = _word_lo_hi(w, IS_BF16)
    amax = tl.max(tl.maximum(tl.abs(lo), tl.abs(hi)), axis=1)
    s = tl.minimum(tl.math.div_rn(amax, tl.zeros_like(amax) + g * 6.0), 448.0)
    sq = _e4m3_round(s)
    inv = tl.where(sq > 0, tl.math.div_rn(tl.full(sq.shape, 1.0, tl.float32), sq * g), 0.0)
    cl = _e2m1_code_fast(lo * inv[:, None])
    ch = _e2m1_code_fast(hi * inv[:, None])
    tl.store(dp, (cl | (ch << 4)).to(tl.uint8), mask=rm[:, None])
    tl.store(sp, _e4m3_byte(sq).to(tl.uint8), mask=rm)


@triton.jit
def _nvfp4_ptrs(w_base, tt, data_base, scale_base,
                Q: tl.constexpr, QO: tl.constexpr, HEAD_DIM: tl.constexpr, TB: tl.constexpr,
                NGP: tl.constexpr):
    G: tl.constexpr = Q // 16
    r = tl.arange(0, NGP)
    j = tl.arange(0, 8)
    grp = tt * (TB * G) + r
    woff = (grp // G) * (HEAD_DIM // 2) + (QO // 2) + (grp % G) * 8
    return (w_base + woff[:, None] + j[None, :], data_base + grp[:, None] * 8 + j[None, :],
            scale_base + grp, r < TB * G)


@triton.jit
def _nvfp4_page_kernel(kv_ptr, kw_ptr, blocks_ptr, slots_ptr, page_ptr, g_ptr,
                       s_layer, s_block, s_kv, s_head, page_bytes,
                       NUM_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                       TB: tl.constexpr, QK: tl.constexpr, NGK: tl.constexpr, NGV: tl.constexpr,
                       Q0: tl.constexpr, ROPE: tl.constexpr, ROPEP: tl.constexpr, R0: tl.constexpr,
                       EB: tl.constexpr, DATA_K: tl.constexpr, DATA_V: tl.constexpr,
                       SC_K: tl.constexpr, SC_V: tl.constexpr, SCALE_OFF: tl.constexpr,
                       ROPE_OFF: tl.constexpr, IS_BF16: tl.constexpr, DECODE: tl.constexpr):
    # s_*: strides of the pool in elements of the hot dtype (kv_ptr); kw_ptr is the same
    # memory as int32 words (strides halved).
    p = tl.program_id(0)
    lh = tl.program_id(1)
    tt = tl.program_id(2)
    l = lh // NUM_HEADS
    h = lh % NUM_HEADS
    blk = tl.load(blocks_ptr + p).to(tl.int64)
    slot = tl.load(slots_ptr + p).to(tl.int64)
    page = page_ptr + slot * page_bytes
    eoff = l.to(tl.int64) * s_layer + blk * s_block + h * s_head  # K rows, in elements
    wk = kw_ptr + eoff // 2
    wv = kw_ptr + (eoff + s_kv) // 2
    gk = tl.load(g_ptr + 2 * l)
    gv = tl.load(g_ptr + 2 * l + 1)
    dk = page + l * (DATA_K + DATA_V) + h * (BLOCK_SIZE * QK // 2)
    dv = page + l * (DATA_K + DATA_V) + DATA_K + h * (BLOCK_SIZE * HEAD_DIM // 2)
    sk = page + SCALE_OFF + l * (SC_K + SC_V) + h * (BLOCK_SIZE * QK // 16)
    sv = page + SCALE_OFF + l * (SC_K + SC_V) + SC_K + h * (BLOCK_SIZE * HEAD_DIM // 16)
    wpk, dpk, spk, rmk = _nvfp4_ptrs(wk, tt, dk, sk, QK, Q0, HEAD_DIM, TB, NGK)
    wpv, dpv, spv, rmv = _nvfp4_ptrs(wv, tt, dv, sv, HEAD_DIM, 0, HEAD_DIM, TB, NGV)
    if DECODE:
        _nvfp4_dec_words(wpk, dpk, spk, rmk, gk, IS_BF16)
        _nvfp4_dec_words(wpv, dpv, spv, rmv, gv, IS_BF16)
    else:
        # both parts' loads are issued before any store (stores may alias loads for the compiler)
        xk = tl.load(wpk, mask=rmk[:, None], other=0)
        xv = tl.load(wpv, mask=rmv[:, None], other=0)
        _nvfp4_enc_words(xk, dpk, spk, rmk, gk, IS_BF16)
        _nvfp4_enc_words(xv, dpv, spv, rmv, gv, IS_BF16)
    if ROPE > 0:
        tok = tt * TB + tl.arange(0, TB)
        rc = tl.arange(0, ROPEP)
        rmask = (rc < ROPE)[None, :]
        rp = (page + ROPE_OFF + (l * NUM_HEADS + h) * (BLOCK_SIZE * ROPE * EB)).to(
            tl.pointer_type(kv_ptr.dtype.element_ty))
        rp = rp + tok[:, None] * ROPE + rc[None, :]
        xp = kv_ptr + eoff + tok[:, None] * HEAD_DIM + R0 + rc[None, :]
        if DECODE:
            tl.store(xp, tl.load(rp, mask=rmask), mask=rmask)
        else:
            tl.store(rp, tl.load(xp, mask=rmask), mask=rmask)


def _tile(block_size: int, head_dim: int, max_elems: int = 4096) -> int:
    tb = max(1, min(block_size, max_elems // head_dim))
    while block_size % tb:
        tb //= 2
    return tb


# No fused multiply-add in the codecs: codes must equal the torch reference exactly.
_NOFUSE = {} if os.environ.get("TRITON_INTERPRET") == "1" else {"enable_fp_fusion": False}


def _nvfp4_launch(kv, blocks, gscale, pages, slots, rope_dim, rope_side, decode, num_warps, tile_elems):
    L, NB, _, H, B, D = kv.shape
    if kv.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"NVFP4 codec supports bf16/fp16 hot pages, got {kv.dtype}")
    lay = nvfp4_page_layout(L, H, B, D, rope_dim, rope_side, kv.element_size())
    if pages.dtype != torch.uint8 or pages.dim() != 2 or pages.shape[1] != lay["page_bytes"]:
        raise ValueError(f"pages must be uint8 [n, {lay['page_bytes']}], got {pages.dtype} {tuple(pages.shape)}")
    if kv.stride(-1) != 1 or any(s % 2 for s in kv.stride()[:-1]) or kv.storage_offset() % 2:
        raise ValueError("NVFP4 codec needs a pool with contiguous rows and even strides")
    n = blocks.numel()
    if slots is None:
        slots = torch.arange(n, dtype=torch.int32, device=blocks.device)
    TB = _tile(B, D, tile_elems)
    qk = lay["qk"]
    kw = kv.view(torch.int32)  # two hot values per word (rows are D values, D % 16 == 0)
    grid = (n, L * H, B // TB)
    _nvfp4_page_kernel[grid](
        kv, kw, blocks, slots, pages, gscale,
        kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3), lay["page_bytes"],
        NUM_HEADS=H, BLOCK_SIZE=B, HEAD_DIM=D, TB=TB, QK=qk,
        NGK=triton.next_power_of_2(TB * qk // 16), NGV=triton.next_power_of_2(TB * D // 16),
        Q0=lay["q0"], ROPE=rope_dim, ROPEP=triton.next_power_of_2(max(rope_dim, 1)), R0=lay["r0"],
        EB=kv.element_size(), DATA_K=lay["data_k"], DATA_V=lay["data_v"], SC_K=lay["sc_k"],
        SC_V=lay["sc_v"], SCALE_OFF=lay["scale_off"], ROPE_OFF=lay["rope_off"],
        IS_BF16=kv.dtype == torch.bfloat16, DECODE=decode, num_warps=num_warps, **_NOFUSE)
    return pages


def nvfp4_encode(kv: torch.Tensor, blocks: torch.Tensor, gscale: torch.Tensor, out: torch.Tensor,
                 slots: torch.Tensor | None = None, rope_dim: int = 0, rope_side: str = "trailing",
                 num_warps: int = 4, tile_elems: int = 4096) -> torch.Tensor:
    """Encode hot pages ``kv[:, blocks]`` into NVFP4 cold pages ``out[slots]``.

    kv: [L, NB, 2, H, B, D] bf16/fp16. blocks, slots: int32 [n] (slots default 0..n-1).
    gscale: float32 [L, 2] per-(layer, K/V) global scale (see
    ``reference.nvfp4_global_scale``). out: uint8 [S, page_bytes], on the device or in
    pinned host memory (then the kernel stores straight over the host link: fused D2H).
    rope_dim > 0 copies that many K columns (``rope_side`` end of the row) unquantised.
    Format per NVIDIA NVFP4: E2M1 values, E4M3 scale per 16 values, FP32 global scale.
    Layout: ``reference.nvfp4_page_layout``. Returns ``out``.
    """
    return _nvfp4_launch(kv, blocks, gscale, out, slots, rope_dim, rope_side, False, num_warps, tile_elems)


def nvfp4_decode(pages: torch.Tensor, kv: torch.Tensor, blocks: torch.Tensor, gscale: torch.Tensor,
                 slots: torch.Tensor | None = None, rope_dim: int = 0, rope_side: str = "trailing",
                 num_warps: int = 4, tile_elems: int = 4096) -> torch.Tensor:
    """Decode NVFP4 cold pages ``pages[slots]`` (device or pinned host: fused H2D) into hot
    blocks ``kv[:, blocks]`` in place; arguments as :func:`nvfp4_encode`. Returns ``kv``."""
    _nvfp4_launch(kv, blocks, gscale, pages, slots, rope_dim, rope_side, True, num_warps, tile_elems)
    return kv


# ============================================================================ FP8 codec
@triton.jit
def _fp8_page_kernel(kv_ptr, blocks_ptr, slots_ptr, page_ptr, s_ptr,
                     s_layer, s_block, s_kv, s_head, page_bytes,
                     NUM_HEADS: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr,
                     TB: tl.constexpr, DECODE: tl.constexpr):
    p = tl.program_id(0)
    row = tl.program_id(1)  # (layer, K/V, head)
    tt = tl.program_id(2)
    l = row // (2 * NUM_HEADS)
    kvh = row % (2 * NUM_HEADS)
    c = kvh // NUM_HEADS
    h = kvh % NUM_HEADS
    blk = tl.load(blocks_ptr + p).to(tl.int64)
    slot = tl.load(slots_ptr + p).to(tl.int64)
    tok = tt * TB + tl.arange(0, TB)
    d = tl.arange(0, HEAD_DIM)
    off = tok[:, None] * HEAD_DIM + d[None, :]
    xp = kv_ptr + l.to(tl.int64) * s_layer + blk * s_block + c * s_kv + h * s_head + off
    pp = page_ptr + slot * page_bytes + row * (BLOCK_SIZE * HEAD_DIM) + off
    s = tl.load(s_ptr + 2 * l + c)
    if DECODE:
        b = tl.load(pp).to(tl.int32)
        v = _e4m3_value(b)
        v = tl.where((b & 0x80) != 0, -v, v)
        tl.store(xp, (v * s).to(kv_ptr.dtype.element_ty))
    else:
        x = tl.load(xp).to(tl.float32)
        inv = tl.math.div_rn(tl.full((1,), 1.0, tl.float32), tl.full((1,), 1.0, tl.float32) * s)
        v = x * inv
        b = _e4m3_byte(_e4m3_round(tl.minimum(tl.abs(v), 448.0)))
        b = tl.where((v < 0) & (b > 0), b | 0x80, b)
        tl.store(pp, b.to(tl.uint8))


def _fp8_launch(kv, blocks, scale, pages, slots, decode, num_warps, tile_elems):
    L, NB, _, H, B, D = kv.shape
    if kv.dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"FP8 codec encodes bf16/fp16 hot pages, got {kv.dtype}")
    pb = fp8_page_bytes(L, H, B, D)
    if pages.dtype != torch.uint8 or pages.dim() != 2 or pages.shape[1] != pb:
        raise ValueError(f"pages must be uint8 [n, {pb}], got {pages.dtype} {tuple(pages.shape)}")
    n = blocks.numel()
    if slots is None:
        slots = torch.arange(n, dtype=torch.int32, device=blocks.device)
    TB = _tile(B, D, tile_elems)
    _fp8_page_kernel[(n, L * 2 * H, B // TB)](
        kv, blocks, slots, pages, scale,
        kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3), pb,
        NUM_HEADS=H, BLOCK_SIZE=B, HEAD_DIM=D, TB=TB, DECODE=decode, num_warps=num_warps, **_NOFUSE)


def fp8_encode(kv: torch.Tensor, blocks: torch.Tensor, scale: torch.Tensor, out: torch.Tensor,
               slots: torch.Tensor | None = None, num_warps: int = 4, tile_elems: int = 4096) -> torch.Tensor:
    """Encode bf16/fp16 hot pages ``kv[:, blocks]`` into FP8 (E4M3, OCP FP8 / NVIDIA
    ``float8_e4m3fn``: RNE, saturating at 448) cold pages ``out[slots]`` (uint8
    [S, L*2*H*B*D], device or pinned host). ``scale``: float32 [L, 2]; byte = E4M3(x / s)
    computed as x * (1/s). Returns ``out``."""
    _fp8_launch(kv, blocks, scale, out, slots, False, num_warps, tile_elems)
    return out


def fp8_decode(pages: torch.Tensor, kv: torch.Tensor, blocks: torch.Tensor, scale: torch.Tensor,
               slots: torch.Tensor | None = None, num_warps: int = 4, tile_elems: int = 4096) -> torch.Tensor:
    """Decode FP8 cold pages ``pages[slots]`` into ``kv[:, blocks]`` (x = value * s). Returns kv."""
    _fp8_launch(kv, blocks, scale, pages, slots, True, num_warps, tile_elems)
    return kv


__all__ = ["CompactionBatch", "compact_forward", "compact_hole_fill", "hole_fill_pairs",
           "nvfp4_encode", "nvfp4_decode", "fp8_encode", "fp8_decode", "E4M3_MAX"]
