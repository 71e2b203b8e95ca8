"""gpu_validation kernels vs their torch references.

Runs on the CPU under Triton's interpreter (TRITON_INTERPRET=1, set here when no GPU is
present) on small shapes; on a CUDA machine the same tests run the compiled kernels.
Skips cleanly when torch or triton is absent.
"""
import os
import random

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from gpu_validation import kernels as K  # noqa: E402
from gpu_validation import reference as R  # noqa: E402
from gpu_validation.pool import DTYPES, PagedKVPool  # noqa: E402

# Triton's CPU interpreter evaluates both sides of the NVFP4 encoder's
# tl.where(sq > 0, 1 / (sq g), 0) with numpy, which warns on the masked-out 1 / 0 of an all-zero
# scale group; the GPU computes the same inf silently and the where drops it (tested values).
pytestmark = pytest.mark.filterwarnings(
    "ignore:divide by zero encountered in divide:RuntimeWarning:triton.runtime.interpreter")

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _bits(t):
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.uint8)


def _random_round(pool, rng, n_req, max_decode=70, with_tail=True):
    reqs, bts = [], []
    for i in range(n_req):
        P = rng.randint(0, 2 * pool.block_size)
        V = P + rng.randint(1, max_decode)
        T = rng.randint(0, min(8, V - P)) if with_tail else 0
        bt = list(pool.allocate(i, V))
        span = range(P, V - T)
        kept = sorted(rng.sample(span, rng.randint(0, len(span))))
        reqs.append(dict(kept=kept, prompt_len=P, valid_len=V, tail=T))
        bts.append(bt)
    return reqs, bts


@pytest.mark.parametrize("dtype,block_size,head_dim,chunk,seed", [
    ("bf16", 16, 64, 16, 0), ("fp16", 32, 32, 64, 1), ("fp8", 16, 32, 8, 2), ("bf16", 64, 16, 32, 3)])
def test_compact_forward_matches_reference(dtype, block_size, head_dim, chunk, seed):
    rng = random.Random(seed)
    pool = PagedKVPool(2, 24, 2, block_size, head_dim, dtype, DEV, seed=seed)
    reqs, bts = _random_round(pool, rng, 4)
    ref = pool.kv.clone().cpu()
    new_ref, freed_ref = R.ref_compact_forward(ref, bts, reqs)
    batch = K.CompactionBatch.from_requests(reqs, bts, DEV)
    new, freed = K.compact_forward(pool.kv, batch, chunk=chunk)
    assert torch.equal(_bits(pool.kv).cpu(), _bits(ref))
    assert new.tolist() == new_ref
    assert freed == freed_ref
    # what remains in use: ceil(new_len / B) blocks per request
    for n, bt, f in zip(new_ref, bts, freed):
        assert len(bt) - len(f) == -(-n // block_size)


def test_compact_forward_keeps_prompt_and_order():
    pool = PagedKVPool(1, 8, 1, 16, 16, "bf16", DEV, seed=5)
    bt = pool.allocate(0, 64)
    before = pool.kv.clone()
    kept = [20, 21, 30, 45, 50]
    rq = dict(kept=kept, prompt_len=10, valid_len=64, tail=4)
    new, freed = K.compact_forward(pool.kv, K.CompactionBatch.from_requests([rq], [bt], DEV))
    slots = list(range(10)) + kept + [60, 61, 62, 63]
    B = 16
    for d, s in enumerate(slots):
        assert torch.equal(pool.kv[:, bt[d // B], :, :, d % B], before[:, bt[s // B], :, :, s % B])
    assert new.tolist() == [19] and freed == [bt[2:4]]


def test_compact_rejects_bad_rows():
    with pytest.raises(ValueError):
        K.CompactionBatch.from_requests([dict(kept=[5, 4], prompt_len=0, valid_len=10, tail=0)], [[0]], DEV)
    with pytest.raises(ValueError):
        K.CompactionBatch.from_requests([dict(kept=[1, 9], prompt_len=2, valid_len=10, tail=2)], [[0]], DEV)


@pytest.mark.parametrize("dtype,block_size,seed", [("bf16", 16, 0), ("fp16", 32, 1)])
def test_compact_hole_fill_matches_reference(dtype, block_size, seed):
    rng = random.Random(10 + seed)
    pool = PagedKVPool(2, 24, 2, block_size, 32, dtype, DEV, with_positions=True, seed=seed)
    reqs, bts = _random_round(pool, rng, 3)
    ref, ref_pos = pool.kv.clone().cpu(), pool.positions.clone().cpu()
    new_ref, freed_ref = R.ref_compact_hole_fill(ref, ref_pos, bts, reqs)
    batch = K.CompactionBatch.from_requests(reqs, bts, DEV)
    new, freed = K.compact_hole_fill(pool.kv, pool.positions, batch)
    assert torch.equal(_bits(pool.kv).cpu(), _bits(ref))
    assert torch.equal(pool.positions.cpu(), ref_pos)
    assert new.tolist() == new_ref and freed == freed_ref


def _hot(dtype, L=2, NB=5, H=2, B=16, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((L, NB, 2, H, B, D), generator=g) * torch.logspace(-2, 1, D)
    x[0, 1, 0, 0, 3] = 0.0  # an all-zero row: scale 0
    return x.to(DTYPES[dtype]).to(DEV)


def _gscale(kv):
    return R.nvfp4_global_scale(kv.float().abs().amax(dim=(1, 3, 4, 5)).cpu()).to(DEV)


@pytest.mark.parametrize("dtype,rope_dim,rope_side,B,D", [
    ("bf16", 0, "trailing", 16, 64), ("fp16", 0, "trailing", 32, 32),
    ("bf16", 32, "trailing", 16, 64), ("bf16", 16, "leading", 16, 64), ("fp16", 16, "trailing", 16, 48)])
def test_nvfp4_codec_matches_reference(dtype, rope_dim, rope_side, B, D):
    kv = _hot(dtype, B=B, D=D)
    g = _gscale(kv)
    blocks = [3, 0, 4]
    bl = torch.tensor(blocks, dtype=torch.int32, device=DEV)
    ref_pages = R.ref_nvfp4_encode(kv.cpu(), blocks, g.cpu(), rope_dim, rope_side)
    lay = R.nvfp4_page_layout(2, 2, B, D, rope_dim, rope_side, kv.element_size())
    out = torch.full((4, lay["page_bytes"]), 0xAB, dtype=torch.uint8, device=DEV)  # poisoned
    slots = torch.tensor([2, 0, 1], dtype=torch.int32, device=DEV)
    K.nvfp4_encode(kv, bl, g, out, slots=slots, rope_dim=rope_dim, rope_side=rope_side)
    assert torch.equal(out[slots.long()].cpu(), ref_pages)
    assert torch.equal(out[3].cpu(), torch.full((lay["page_bytes"],), 0xAB, dtype=torch.uint8))
    dec_ref = kv.clone().cpu()
    R.ref_nvfp4_decode(ref_pages, dec_ref, blocks, g.cpu(), rope_dim, rope_side)
    dec = kv.clone()
    dec[:, bl.long()] = 7.0  # poison
    K.nvfp4_decode(out, dec, bl, g, slots=slots, rope_dim=rope_dim, rope_side=rope_side)
    assert torch.equal(_bits(dec).cpu(), _bits(dec_ref))


def test_nvfp4_error_bound_and_idempotence():
    kv = _hot("bf16", NB=3, D=64, seed=3)
    g = _gscale(kv)
    bl = torch.arange(3, dtype=torch.int32, device=DEV)
    lay = R.nvfp4_page_layout(2, 2, 16, 64)
    p1 = torch.empty((3, lay["page_bytes"]), dtype=torch.uint8, device=DEV)
    K.nvfp4_encode(kv, bl, g, p1)
    d1 = kv.clone()
    K.nvfp4_decode(p1, d1, bl, g)
    # bound per group of 16: |x - x'| <= half the widest E2M1 gap (1.0) x scale,
    # scale <= amax/6 * (1 + 1/16) (E4M3 rounding), plus bf16 rounding of x'
    x = kv.float().reshape(2, 3, 2, 2, 16, 4, 16)
    y = d1.float().reshape_as(x)
    amax = x.abs().amax(-1, keepdim=True)
    bound = amax / 6.0 * (1 + 1 / 16) * 1.0 + y.abs() * 2 ** -8 + 1e-30
    assert bool(((x - y).abs() <= bound).all())
    rel = ((x - y).norm() / x.norm()).item()
    assert rel < 0.12
    # second round trip of the decoded page: same codes, same values
    p2 = torch.empty_like(p1)
    K.nvfp4_encode(d1, bl, g, p2)
    d2 = d1.clone()
    K.nvfp4_decode(p2, d2, bl, g)
    assert torch.equal(p1.cpu(), p2.cpu())
    assert torch.equal(_bits(d1).cpu(), _bits(d2).cpu())


def test_nvfp4_page_bytes():
    for L, H, B, D in [(36, 8, 32, 128), (2, 2, 16, 64), (4, 4, 64, 64)]:
        lay = R.nvfp4_page_layout(L, H, B, D)
        values = L * 2 * H * B * D
        assert lay["page_bytes"] == values * 0.5625 == values * R.NVFP4_BYTES_PER_VALUE
        lr = R.nvfp4_page_layout(L, H, B, D, rope_dim=D // 2)
        q_values = values - L * H * B * D // 2
        assert lr["data_bytes"] + lr["scale_bytes"] == q_values * 0.5625
        assert lr["page_bytes"] == q_values * 0.5625 + L * H * B * (D // 2) * 2
    # BF16 page 71.875% larger saving, FP8 43.75%
    assert 1 - 0.5625 / 2 == 0.71875 and 1 - 0.5625 / 1 == 0.4375
    for bad in [dict(rope_dim=128), dict(rope_dim=8), dict(rope_side="middle", rope_dim=16)]:
        with pytest.raises(ValueError):
            R.nvfp4_page_layout(2, 2, 16, 128, **bad)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fp8_codec_matches_reference(dtype):
    kv = _hot(dtype, D=32)
    s = R.fp8_global_scale(kv.float().abs().amax(dim=(1, 3, 4, 5)).cpu()).to(DEV)
    blocks = [1, 4]
    bl = torch.tensor(blocks, dtype=torch.int32, device=DEV)
    ref = R.ref_fp8_encode(kv.cpu(), blocks, s.cpu())
    out = torch.full((2, R.fp8_page_bytes(2, 2, 16, 32)), 0xAB, dtype=torch.uint8, device=DEV)
    K.fp8_encode(kv, bl, s, out)
    assert torch.equal(out.cpu(), ref)
    d_ref = kv.clone().cpu()
    R.ref_fp8_decode(ref, d_ref, blocks, s.cpu())
    d = kv.clone()
    K.fp8_decode(out, d, bl, s)
    assert torch.equal(_bits(d).cpu(), _bits(d_ref))


def test_e4m3_rounding_matches_torch_cast():
    v = torch.cat([torch.randn(20000) * 50, torch.randn(2000) * 0.01, torch.tensor([448.0, 0.0, 2 ** -9, 2 ** -10, 3 * 2 ** -10])])
    v = torch.clamp(v, -448, 448)
    mine = R.fp8_code(v)
    native = v.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int32)
    native = torch.where(native == 0x80, torch.zeros_like(native), native)  # we store -0 as +0
    assert torch.equal(mine, native)
    assert torch.equal(R.e2m1_value(R.e2m1_code(torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.1]))),
                       torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, 0.0]))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned host memory needs CUDA")
def test_fused_host_paths_match_device_paths():
    kv = _hot("bf16", NB=6, D=64)
    g = _gscale(kv)
    bl = torch.tensor([5, 1, 2], dtype=torch.int32, device=DEV)
    lay = R.nvfp4_page_layout(2, 2, 16, 64)
    dev_pages = torch.empty((3, lay["page_bytes"]), dtype=torch.uint8, device=DEV)
    host = torch.zeros((3, lay["page_bytes"]), dtype=torch.uint8, pin_memory=True)
    K.nvfp4_encode(kv, bl, g, dev_pages)
    K.nvfp4_encode(kv, bl, g, host)
    torch.cuda.synchronize()
    assert torch.equal(host, dev_pages.cpu())
    a, b = kv.clone(), kv.clone()
    K.nvfp4_decode(dev_pages, a, bl, g)
    K.nvfp4_decode(host, b, bl, g)
    torch.cuda.synchronize()
    assert torch.equal(_bits(a), _bits(b))


def test_validate_amax_in_chunks_equals_whole_pool():
    from gpu_validation.validate import amax_per_layer_kv, pool_tokens

    for dt in ("bf16", "fp8"):
        kv = PagedKVPool(3, 37, 2, 4, 8, dt, DEV, seed=3).kv
        row = kv[:, :1].numel() * 4
        for chunk in (1, row, 5 * row, 1 << 30):  # one block per chunk .. the whole pool
            assert torch.equal(amax_per_layer_kv(kv, chunk_bytes=chunk), kv.float().abs().amax(dim=(1, 3, 4, 5)))
    assert pool_tokens(147456, 78 << 30) == 140_000  # Qwen3-8B slots on an 80 GB card: all of them
    assert pool_tokens(147456, 10 << 30) == (5 << 30) // 147456


def test_operator_bench_runs_and_its_section_loads(tmp_path):
    """The operators section end to end on tiny cards (CPU: eager smoke grid; GPU: graphs, the
    --quick grid): every table filled, checks passed, and the calibration loader accepts it."""
    import json

    from gpu_validation import operators as O
    from gpu_validation.model_cards import model_shapes
    from gpu_validation.calibration_model import load_calibration

    cards = []
    for name, extra in (("Tiny-Dense", {}), ("Tiny-MoE", dict(num_experts=8, num_experts_per_tok=2,
                                                              moe_intermediate_size=128))):
        p = tmp_path / f"{name}.yaml"
        body = dict(name=name, num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=64, hidden_size=256,
                    intermediate_size=512, vocab_size=1024, **extra)
        p.write_text("\n".join(f"{k}: {v}" for k, v in body.items()) + "\n")
        cards.append(model_shapes(p))
    ops = O.bench_operators(torch, cards, [1, 2], device=DEV, quick=True, budget_s=120, log=lambda *a: None)
    for table in ("gemm", "grouped_gemm", "attention_decode", "attention_prefill"):
        assert ops[table], table
    n = ops["notes"]
    assert n["not_measured"] == [], n["not_measured"]
    for k, v in n["checks"].items():
        assert isinstance(v, float) and v < 2e-2, (k, v)
    assert {r["dtype"] for r in ops["gemm"]} == ({"bf16", "fp8"} if n["fp8"] == "measured" else {"bf16"})
    if DEV == "cuda":
        assert {r["mode"] for r in ops["gemm"]} == {"graph", "eager"}
    doc = {"device": {"name": "x"}, "software": {}, "date": "2026-12-07", "ops": {}, "operators": ops}
    (tmp_path / "cal.json").write_text(json.dumps(doc))
    cal = load_calibration(tmp_path / "cal.json")
    assert len(cal.operators["gemm"]) == len(ops["gemm"])
