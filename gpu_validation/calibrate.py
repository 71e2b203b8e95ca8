"""Benchmarks on a real GPU -> per-device calibration JSON.

    python -m gpu_validation.calibrate --out gpu_validation/calibrations/h200.json [--quick]
    python -m gpu_validation.calibrate --out FILE --model experiments/conf/model/llama3_1_8b.yaml \
        [--model CARD2.yaml ...] [--tp 1 2 4 8] [--moe NAME:experts=E,top_k=K,width=W]

Times (CUDA events around each call, warm-up first, median of repeats):
  d2d copy; compaction (forward packing, hole filling) over block size 16/32/64, head_dim
  64/128, kv heads 4/8, requests per round, tokens moved per round; NVFP4 and FP8 page codecs
  to/from device memory, fused with the pinned host copy (kernel stores to / loads from
  mapped pinned memory) and unfused (codec + one batched cudaMemcpyAsync); pinned H2D/D2H per
  size (64 KiB..256 MiB) and per separately issued copy; decode attention (torch SDPA) and
  prefill GEMMs at Qwen3-8B shapes (one layer timed, scaled by 36 layers).
Each op gets an affine fit (calibration_model.fit_affine). With --model: the section
`operators` (gpu_validation/operators.py): dense GEMMs (bf16, fp8), grouped expert GEMMs,
decode / prefill attention at every card's shapes per TP degree, deduplicated. Schema: README.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import sys
import time

import numpy as np

try:  # (--help works without them; a run says what to install)
    import torch
    import triton

    from . import kernels as K
    from . import reference as R
    from .calibration_model import fit_affine
    from .pool import PagedKVPool
except ImportError as _e:  # pragma: no cover (the CPU CI installs torch and triton)
    _MISSING: ImportError | None = _e
else:
    _MISSING = None

QWEN3_8B = dict(num_layers=36, num_q_heads=32, num_kv_heads=8, head_dim=128, hidden=4096,
                intermediate=12288)

NBYTES_MEANS = {
    "d2d_copy": "bytes copied (payload; traffic = 2x)",
    "compaction_move": "bytes of tokens whose slot changes (token_bytes = L*2*H*D*elem); n_items = requests",
    "compaction_hole_fill": "bytes of tokens moved into holes (mover only; pairs precomputed); n_items = requests",
    "nvfp4_encode": "hot (bf16) page bytes encoded; n_items = pages",
    "nvfp4_decode": "hot (bf16) page bytes produced; n_items = pages",
    "fp8_encode": "hot (bf16) page bytes encoded; n_items = pages",
    "fp8_decode": "hot (bf16) page bytes produced; n_items = pages",
    "h2d": "bytes copied host->device (pinned); n_items = separately issued copies",
    "d2h": "bytes copied device->host (pinned); n_items = separately issued copies",
    "nvfp4_encode_d2h_fused": "hot page bytes; kernel writes cold pages into mapped pinned memory; n_items = pages",
    "nvfp4_encode_then_d2h": "hot page bytes; encode to device staging + one batched copy; n_items = pages",
    "nvfp4_h2d_decode_fused": "hot page bytes; kernel reads cold pages from mapped pinned memory; n_items = pages",
    "h2d_then_nvfp4_decode": "hot page bytes; one batched copy to staging + decode; n_items = pages",
    "fp8_encode_d2h_fused": "hot page bytes; FP8 kernel writes into pinned memory; n_items = pages",
    "fp8_h2d_decode_fused": "hot page bytes; FP8 kernel reads pinned memory; n_items = pages",
}


def log(*a):
    print(*a, flush=True)


def time_op(fn, warmup: int = 2, reps: int = 10, graph: bool = False) -> float:
    """Median seconds of ``fn()`` over ``reps`` calls, each bracketed by CUDA events.

    ``graph=True`` captures one call in a CUDA graph and times its replays: GPU time without
    the Python launch overhead (a server launches from C++); falls back to eager calls if
    the capture fails."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    run = fn
    if graph:
        try:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            g.replay()
            torch.cuda.synchronize()
            run = g.replay
        except Exception as e:  # pragma: no cover - device specific
            log(f"graph capture failed ({type(e).__name__}: {e}); timing eagerly")
            torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    return float(np.median(ts))


def shuffled_pool(L, NB, H, B, D, seed=0):
    pool = PagedKVPool(L, NB, H, B, D, "bf16", "cuda", seed=seed)
    random.Random(seed).shuffle(pool._free)  # non-contiguous block tables, as on a server
    return pool


def triattention_round(rng, prompt_len, budget=2048, beta=128, window=None, tail=0):
    """One TriAttention-like round: the decode region holds budget + beta tokens; ``beta``
    are evicted by a seeded random importance (lowest scores go), restricted to the last
    ``window`` decode tokens when given (controls tokens moved)."""
    n_dec = budget + beta
    V = prompt_len + n_dec
    lo = prompt_len if window is None else max(prompt_len, V - tail - window)
    cand = list(range(lo, V - tail))
    scores = {s: rng.random() for s in cand}
    evict = set(sorted(cand, key=scores.get)[:beta])
    kept = [s for s in range(prompt_len, V - tail) if s not in evict]
    return dict(kept=kept, prompt_len=prompt_len, valid_len=V, tail=tail)


def moved_tokens(rq):
    P = rq["prompt_len"]
    src = R.forward_move_sources(rq["kept"], P, rq["valid_len"], rq["tail"])
    return sum(1 for m, s in enumerate(src) if s != P + m)


# ------------------------------------------------------------------------------ sections
def bench_copy(res, quick):
    pts = []
    for mib in ([4, 64, 1024] if quick else [1, 4, 16, 64, 256, 1024]):
        n = mib << 20
        a = torch.empty(n, dtype=torch.uint8, device="cuda").random_()
        b = torch.empty_like(a)
        t = time_op(lambda: b.copy_(a))
        pts.append((n, 1, t))
        log(f"d2d_copy {mib:5d} MiB {t*1e6:9.1f} us  traffic {2*n/t/1e12:.2f} TB/s")
        del a, b
    res["copy_bandwidth_Bps"] = max(2 * p[0] / p[2] for p in pts)
    return {"d2d_copy": pts}


def bench_host_link(res, quick):
    pts = {"h2d": [], "d2h": []}
    sizes = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]
    big = sizes[-1]
    host = torch.empty(big, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(big, dtype=torch.uint8, device="cuda").random_()
    host.copy_(dev.cpu())
    for n in sizes:
        for copies in ([1, 16] if n <= (4 << 20) else [1]):
            per = n // copies
            def h2d():
                for i in range(copies):
                    dev[i * per:(i + 1) * per].copy_(host[i * per:(i + 1) * per], non_blocking=True)
            def d2h():
                for i in range(copies):
                    host[i * per:(i + 1) * per].copy_(dev[i * per:(i + 1) * per], non_blocking=True)
            for name, fn in (("h2d", h2d), ("d2h", d2h)):
                t = time_op(fn, reps=5 if n >= (64 << 20) else 10)
                pts[name].append((n, copies, t))
                log(f"{name} {n>>10:8d} KiB x{copies:2d} copies {t*1e6:9.1f} us  {n/t/1e9:6.1f} GB/s")
    return pts


def bench_compaction(res, quick):
    pts = {"compaction_move": [], "compaction_hole_fill": []}
    rows = []
    L = QWEN3_8B["num_layers"]
    shapes = [(B, D, H) for B in (16, 32, 64) for D in (64, 128) for H in (4, 8)]
    if quick:
        shapes = [(32, 128, 8), (16, 64, 4)]
    rng = random.Random(1)
    for (B, D, H) in shapes:
        reqs_max = 32
        prompt = 512
        toks = prompt + 2048 + 128
        NB = reqs_max * (-(-toks // B)) + 8
        pool = shuffled_pool(L, NB, H, B, D, seed=B + D + H)
        tb = pool.token_bytes
        for rid in range(reqs_max):
            pool.allocate(rid, toks)
        for R_ in (1, 8, 32):
            for window in (256, 1024, None):
                reqs = [triattention_round(rng, prompt, window=window) for _ in range(R_)]
                bts = [pool.block_tables[i] for i in range(R_)]
                batch = K.CompactionBatch.from_requests(reqs, bts, "cuda")
                mv = sum(moved_tokens(r) for r in reqs)
                t = time_op(lambda: K.compact_forward(pool.kv, batch, return_freed=False), graph=True)
                nbytes = mv * tb
                pts["compaction_move"].append((nbytes, R_, t))
                bw = 2 * nbytes / t
                rows.append(dict(op="compaction_move", B=B, D=D, H=H, requests=R_, window=window or 2176,
                                 moved_tokens=mv, nbytes=nbytes, seconds=t, traffic_Bps=bw,
                                 frac_copy_bw=bw / res["copy_bandwidth_Bps"]))
                log(f"compact B={B:2d} D={D:3d} H={H} R={R_:2d} win={window or 2176:4d} moved={mv:6d} "
                    f"{t*1e6:9.1f} us  {bw/1e12:.2f} TB/s ({100*bw/res['copy_bandwidth_Bps']:.0f}% copy)")
                if window is None and (R_ != 8 or quick):
                    # hole filling moves only survivors above the new length
                    pairs = K.hole_fill_pairs(batch, B)
                    hb = int(pairs[2].sum().item()) * tb
                    tp = time_op(lambda: K.hole_fill_pairs(batch, B))
                    t2 = time_op(lambda: K.compact_hole_fill(pool.kv, None, batch, return_freed=False,
                                                             pairs=pairs), graph=True)
                    pts["compaction_hole_fill"].append((hb, R_, t2))
                    rows.append(dict(op="compaction_hole_fill", B=B, D=D, H=H, requests=R_, nbytes=hb,
                                     seconds=t2, traffic_Bps=2 * hb / t2))
                    log(f"  hole_fill moved={hb//tb:6d} {t2*1e6:9.1f} us (mover); torch pairing {tp*1e6:.1f} us (eager)")
        del pool
        torch.cuda.empty_cache()
    res["raw"]["compaction"] = rows
    return pts


def bench_codecs(res, quick):
    names = ["nvfp4_encode", "nvfp4_decode", "fp8_encode", "fp8_decode", "nvfp4_encode_d2h_fused",
             "nvfp4_encode_then_d2h", "nvfp4_h2d_decode_fused", "h2d_then_nvfp4_decode",
             "fp8_encode_d2h_fused", "fp8_h2d_decode_fused", "cold_d2h_bare", "cold_h2d_bare"]
    pts = {n: [] for n in names}
    rows = []
    L = QWEN3_8B["num_layers"]
    shapes = [(B, D, H) for B in (16, 32, 64) for D in (64, 128) for H in (4, 8)]
    pages_list = [1, 8, 64, 256]
    if quick:
        shapes, pages_list = [(32, 128, 8)], [1, 64]
    for (B, D, H) in shapes:
        NB = max(pages_list) * 2 + 8
        pool = shuffled_pool(L, NB, H, B, D, seed=7)
        kv = pool.kv
        g = R.nvfp4_global_scale(kv.float().abs().amax(dim=(1, 3, 4, 5))).cuda()
        s8 = R.fp8_global_scale(kv.float().abs().amax(dim=(1, 3, 4, 5))).cuda()
        lay = R.nvfp4_page_layout(L, H, B, D)
        pb4, pb8, hot = lay["page_bytes"], R.fp8_page_bytes(L, H, B, D), pool.block_bytes
        P = max(pages_list)
        dev4 = torch.empty((P, pb4), dtype=torch.uint8, device="cuda")
        dev8 = torch.empty((P, pb8), dtype=torch.uint8, device="cuda")
        host4 = torch.empty((P, pb4), dtype=torch.uint8, pin_memory=True)
        host8 = torch.empty((P, pb8), dtype=torch.uint8, pin_memory=True)
        blocks_all = torch.randperm(NB, device="cuda")[:P].to(torch.int32)
        K.nvfp4_encode(kv, blocks_all, g, dev4)
        K.fp8_encode(kv, blocks_all, s8, dev8)
        host4.copy_(dev4.cpu())
        host8.copy_(dev8.cpu())
        out_blocks_all = torch.randperm(NB, device="cuda")[:P].to(torch.int32)
        for n in pages_list:
            bl, ob = blocks_all[:n], out_blocks_all[:n]
            d4, h4, d8, h8 = dev4[:n], host4[:n], dev8[:n], host8[:n]
            ops = {
                "nvfp4_encode": lambda: K.nvfp4_encode(kv, bl, g, d4),
                "nvfp4_decode": lambda: K.nvfp4_decode(d4, kv, ob, g),
                "fp8_encode": lambda: K.fp8_encode(kv, bl, s8, d8),
                "fp8_decode": lambda: K.fp8_decode(d8, kv, ob, s8),
                "nvfp4_encode_d2h_fused": lambda: K.nvfp4_encode(kv, bl, g, h4),
                "nvfp4_encode_then_d2h": lambda: (K.nvfp4_encode(kv, bl, g, d4), h4.copy_(d4, non_blocking=True)),
                "nvfp4_h2d_decode_fused": lambda: K.nvfp4_decode(h4, kv, ob, g),
                "h2d_then_nvfp4_decode": lambda: (d4.copy_(h4, non_blocking=True), K.nvfp4_decode(d4, kv, ob, g)),
                "fp8_encode_d2h_fused": lambda: K.fp8_encode(kv, bl, s8, h8),
                "fp8_h2d_decode_fused": lambda: K.fp8_decode(h8, kv, ob, s8),
                "cold_d2h_bare": lambda: h4.copy_(d4, non_blocking=True),
                "cold_h2d_bare": lambda: d4.copy_(h4, non_blocking=True),
            }
            times = {}
            for name, fn in ops.items():
                t = time_op(fn, reps=5 if n * hot > (1 << 30) else 10, graph=True)
                times[name] = t
                nbytes = n * pb4 if name.startswith("cold_") else n * hot
                pts[name].append((nbytes, n, t))
                cold = pb8 if name.startswith("fp8") else pb4
                traffic = n * (hot + cold) / t
                rows.append(dict(op=name, B=B, D=D, H=H, pages=n, hot_bytes=n * hot, cold_bytes=n * cold,
                                 seconds=t, traffic_Bps=traffic, frac_copy_bw=traffic / res["copy_bandwidth_Bps"]))
            log(f"codec B={B:2d} D={D:3d} H={H} pages={n:3d} hot={n*hot/2**20:8.1f} MiB | "
                + " ".join(f"{k}={v*1e6:.0f}us" for k, v in times.items()))
            log(f"   nvfp4 enc {n*(hot+pb4)/times['nvfp4_encode']/1e12:.2f} TB/s dec {n*(hot+pb4)/times['nvfp4_decode']/1e12:.2f} TB/s"
                f" | fused d2h / bare copy = {times['nvfp4_encode_d2h_fused']/times['cold_d2h_bare']:.3f}"
                f" unfused / bare = {times['nvfp4_encode_then_d2h']/times['cold_d2h_bare']:.3f}"
                f" | fused h2d-dec / bare = {times['nvfp4_h2d_decode_fused']/times['cold_h2d_bare']:.3f}"
                f" unfused / bare = {times['h2d_then_nvfp4_decode']/times['cold_h2d_bare']:.3f}")
        del pool, kv, dev4, dev8, host4, host8
        torch.cuda.empty_cache()
    res["raw"]["codecs"] = rows
    return pts


def bench_attention(res, quick):
    m = QWEN3_8B
    Hq, Hk, D = m["num_q_heads"], m["num_kv_heads"], m["head_dim"]
    batches = [1, 4, 16, 64] if not quick else [1, 16]
    kvs = [512, 2048, 8192, 32768] if not quick else [1024, 8192]
    tab = []
    for b in batches:
        row = []
        for S in kvs:
            # GQA decode as SDPA over [b, Hk, Hq/Hk, D] queries per kv head (no KV repeat)
            q = torch.randn(b, Hk, Hq // Hk, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(b, Hk, S, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            t = time_op(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v), reps=10)
            row.append(t)
            log(f"attn b={b:3d} kv={S:6d} {t*1e6:9.1f} us/layer  KV read {2*k.numel()*2/t/1e12:.2f} TB/s")
            del q, k, v
        tab.append(row)
    return {"layers": m["num_layers"], "batch": batches, "kv_tokens": kvs, "seconds_per_layer": tab,
            "method": "torch SDPA, bf16, one layer timed and scaled by layers; GQA decode laid out as "
                      "[batch, 8 kv heads, 4 query rows, 128] (same FLOPs and KV bytes as 32 q heads)"}


def bench_gemm(res, quick):
    m = QWEN3_8B
    h, i = m["hidden"], m["intermediate"]
    qkv = (m["num_q_heads"] + 2 * m["num_kv_heads"]) * m["head_dim"]
    W = [torch.randn(h, qkv, device="cuda", dtype=torch.bfloat16) * 0.02,
         torch.randn(m["num_q_heads"] * m["head_dim"], h, device="cuda", dtype=torch.bfloat16) * 0.02,
         torch.randn(h, 2 * i, device="cuda", dtype=torch.bfloat16) * 0.02,
         torch.randn(i, h, device="cuda", dtype=torch.bfloat16) * 0.02]
    toks = [1, 16, 64, 256, 1024, 4096, 16384] if not quick else [1, 1024, 16384]
    secs = []
    for T in toks:
        x = torch.randn(T, h, device="cuda", dtype=torch.bfloat16)
        a = torch.randn(T, m["num_q_heads"] * m["head_dim"], device="cuda", dtype=torch.bfloat16)
        u = torch.randn(T, i, device="cuda", dtype=torch.bfloat16)

        def layer():
            x @ W[0]
            a @ W[1]
            x @ W[2]
            u @ W[3]
        t = time_op(layer, reps=10)
        flops = 2 * T * (h * qkv + h * h + h * 2 * i + i * h)
        secs.append(t)
        log(f"gemm tokens={T:6d} {t*1e6:9.1f} us/layer  {flops/t/1e12:.0f} TFLOP/s")
    return {"layers": m["num_layers"], "tokens": toks, "seconds_per_layer": secs,
            "method": "bf16 torch.matmul with random weights: QKV (4096x6144), O (4096x4096), gate+up "
                      "(4096x24576), down (12288x4096) per layer, one layer timed, scaled by 36; "
                      "attention, norms, activations and lm_head not included"}


def device_name(torch_name: str) -> str:
    """The name recorded as ``device.name``: torch's name, with the simulator's card name in front
    where torch's name lacks it ('NVIDIA H100 80GB HBM3' is the SXM part, the GPU card 'H100-SXM'
    whose calibration short name is 'h100sxm'; the PCIe part reports 'NVIDIA H100 PCIe')."""
    if "H100" in torch_name and "HBM3" in torch_name and "PCIe" not in torch_name and "SXM" not in torch_name:
        return f"H100-SXM ({torch_name})"
    return torch_name


def write(res, points, path, t0, final=False):
    """Fit every op measured so far and write the calibration JSON (called after each
    section, so a run cut short still leaves a usable file)."""
    ops = {}
    for name, pts in points.items():
        if not pts:
            continue
        fit, err = fit_affine(pts)
        ops[name] = dict(fit, nbytes_means=NBYTES_MEANS.get(name, "cold page bytes copied (reference for fused paths)"),
                         fit_median_abs_rel_err=err, n_points=len(pts),
                         raw=[[int(a), int(b), float(c)] for a, b, c in pts])
        if final:
            log(f"fit {name:24s} overhead {fit['overhead_s']*1e6:8.2f} us  per_item {fit['per_item_s']*1e6:7.2f} us  "
                f"bw {fit['bandwidth_Bps']/1e9:8.1f} GB/s  median |rel err| {100*err:.1f}%")
    res["ops"] = ops
    res["elapsed_s"] = time.time() - t0
    res["complete"] = final
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="calibration JSON to write")
    ap.add_argument("--quick", action="store_true", help="small sweep (smoke test)")
    ap.add_argument("--sections", default="copy,host,compaction,codecs,attention,gemm,operators",
                    help="comma list; 'operators' runs only with --model")
    ap.add_argument("--model", action="append", default=[], metavar="CARD.yaml",
                    help="model card (experiments/conf/model/*.yaml) whose operator shapes to time; repeatable")
    ap.add_argument("--tp", type=int, nargs="+", default=[1, 2, 4, 8], help="tensor-parallel degrees")
    ap.add_argument("--moe", action="append", default=[], metavar="NAME:experts=E,top_k=K,width=W",
                    help="MoE fields for a card that lacks them (also shared=, dense_layers=, gated=0|1)")
    ap.add_argument("--operators-budget-s", type=float, default=300.0,
                    help="stop timing operators after this many seconds (the rest is recorded as not measured)")
    ap.add_argument("--device-name", default=None,
                    help="device.name to record (default: torch's name, 'H100-SXM (...)' for an H100 SXM)")
    ap.add_argument("--plan-only", action="store_true",
                    help="print the operator shapes and the estimated time of --model, time nothing")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="time only the operators on the CPU (a smoke test of the code; not a calibration)")
    args = ap.parse_args(argv)
    models = None
    if args.model:
        from . import model_cards as MC
        from . import operator_plan as OP

        try:
            over = dict(MC.parse_moe_override(x) for x in args.moe)
            models = [MC.model_shapes(c, over) for c in args.model]
        except MC.CardError as e:
            sys.exit(f"calibrate: {e}")
        if args.plan_only:
            pl = OP.plan_operators(models, args.tp)
            est = OP.estimate_seconds(pl, args.quick)
            for (n, k), uses in sorted(pl.gemm.items(), key=lambda x: (x[0][1], x[0][0])):
                log(f"gemm n={n:6d} k={k:6d}  {'; '.join(uses)}")
            for key, uses in sorted(pl.grouped.items()):
                log(f"grouped experts={key[0]} top_k={key[1]} n={key[2]} k={key[3]}  {'; '.join(uses)}")
            for key, uses in sorted(pl.attention.items()):
                log(f"attention q_heads={key[0]} kv_heads={key[1]} head_dim={key[2]}  {'; '.join(uses)}")
            for r in pl.skipped:
                log(f"skipped: {r}")
            log(f"{len(pl.gemm)} GEMM shapes, {len(pl.grouped)} grouped, {len(pl.attention)} attention; "
                f"{est['points']} points; estimated {est['total']:.0f} s on an H100 (a lead, not a measurement)")
            return
    elif args.plan_only or args.cpu_smoke:
        ap.error("--plan-only and --cpu-smoke need --model")
    if _MISSING is not None:
        sys.exit(f"calibrate needs torch and triton ({_MISSING}); install them with "
                 f"pip install -e '.[gpu]' (a CUDA build of torch on the GPU machine)")
    if args.cpu_smoke:
        return cpu_smoke(args, models)
    if not torch.cuda.is_available():
        sys.exit("calibrate needs a CUDA GPU")
    t0 = time.time()
    prop = torch.cuda.get_device_properties(0)
    tname = torch.cuda.get_device_name(0)
    res = {"schema_version": 1,
           "device": {"name": args.device_name or device_name(tname), "torch_name": tname,
                      "sm_count": prop.multi_processor_count, "memory_bytes": prop.total_memory,
                      "l2_bytes": int(getattr(prop, "L2_cache_size", 0)),
                      "compute_capability": list(torch.cuda.get_device_capability(0))},
           "software": {"torch": torch.__version__, "triton": triton.__version__,
                        "cuda": torch.version.cuda, "python": platform.python_version(), "numpy": np.__version__},
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python -m gpu_validation.calibrate " + " ".join(argv if argv is not None else sys.argv[1:]),
           "model_shapes": QWEN3_8B, "timing": "CUDA events, warm-up 2, median of 5-10 repeats; kernels (compaction, codecs incl. fused/unfused host paths) timed as CUDA-graph replays (no Python launch overhead); h2d/d2h/d2d_copy, attention and GEMM eager"
           + ("; operators: see operators.notes.timing" if models else ""),
           "raw": {}}
    secs = args.sections.split(",")
    points = {}
    points.update(bench_copy(res, args.quick))  # always: the copy ceiling
    import traceback
    def bench_ops(res, quick):
        from .operators import bench_operators

        def checkpoint(out):  # (a run cut short keeps the operators measured so far)
            res["operators"] = out
            write(res, points, args.out, t0)
        return bench_operators(torch, models, args.tp, "cuda", quick, args.operators_budget_s, log, checkpoint)

    for sec, fn in (("host", bench_host_link), ("compaction", bench_compaction), ("codecs", bench_codecs),
                    ("attention", bench_attention), ("gemm", bench_gemm), ("operators", bench_ops)):
        if sec not in secs or (sec == "operators" and not models):
            continue
        log(f"== section {sec} (t = {time.time() - t0:.0f} s)")
        try:
            out = fn(res, args.quick)
        except Exception:  # keep what the other sections measured
            log(f"section {sec} FAILED:\n{traceback.format_exc()}")
            res.setdefault("failed_sections", []).append(sec)
            continue
        if sec == "attention":
            res["decode_attention"] = out
        elif sec == "operators":
            res["operators"] = out
        elif sec == "gemm":
            res["gemm"] = out
        else:
            points.update(out)
        write(res, points, args.out, t0)
    write(res, points, args.out, t0, final=True)
    log(f"wrote {args.out} in {res['elapsed_s']:.0f} s")


def cpu_smoke(args, models):
    """--cpu-smoke: the operators section on the CPU (eager, host clock) into a calibration-shaped
    JSON whose device is 'cpu'; checks the code paths and the file's schema, measures nothing
    useful."""
    from .operators import bench_operators

    t0 = time.time()
    res = {"schema_version": 1, "device": {"name": "cpu (smoke test)"},
           "software": {"torch": torch.__version__, "python": platform.python_version(), "numpy": np.__version__},
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "python -m gpu_validation.calibrate " + " ".join(sys.argv[1:]), "raw": {}}
    res["operators"] = bench_operators(torch, models, args.tp, "cpu", args.quick, args.operators_budget_s, log)
    write(res, {}, args.out, t0, final=True)
    log(f"wrote {args.out} in {res['elapsed_s']:.0f} s (CPU smoke test)")


if __name__ == "__main__":
    main()
