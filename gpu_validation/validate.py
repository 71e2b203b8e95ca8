"""Replay operations on a real GPU pool; compare measured time (and blocks in use) with the
simulator's prediction and with the calibration file's prediction.

    python -m gpu_validation.validate --calibration gpu_validation/calibrations/h200.json \
        [--ops decisions.jsonl] [--report gpu_validation/REPORT.md] [--dump-ops ops.jsonl]

With an ops file written by the simulator (``kvsim ... output.write_ops=true``), each line's
``predicted_s`` is the time the simulator charged for that compaction round or transfer batch
and ``blocks_after`` the blocks the request held after the round: the report compares the
measured time with both the simulator's ``predicted_s`` and the calibration model's own
``op_time`` on the replayed bytes, and the blocks held after the real kernel with ``blocks_after``.
Rounds that move nothing are not timed (the simulator charges 0 s and a server would not launch
the mover) but their blocks are compared.

Without ``--ops`` a default realistic set is generated (TriAttention-like compaction rounds
at Qwen3-8B shapes: budget 2048 decode tokens, beta 128, kept ordinals from a seeded random
importance with a recency bias; offload / onboard batches of NVFP4, FP8 and raw pages).
Ops file: JSONL, one op per line (schema in README.md, "Ops file").
"""
from __future__ import annotations

import argparse
import datetime
import json
import random
import sys

import numpy as np

try:  # (--help works without them; a run says what to install)
    import torch

    from . import kernels as K
    from . import reference as R
    from .calibrate import time_op
    from .calibration_model import load_calibration
    from .pool import PagedKVPool
except ImportError as _e:  # pragma: no cover (the CPU CI installs torch and triton)
    _MISSING: ImportError | None = _e
else:
    _MISSING = None

MODEL_DEFAULT = dict(num_layers=36, num_kv_heads=8, head_dim=128, dtype="bf16")


def gen_default_ops(seed: int = 0, block_size: int = 32):
    """The default op list (dicts in the ops-file schema)."""
    rng = random.Random(seed)
    ops = [dict(op="model", **MODEL_DEFAULT)]

    def round_req():
        P = rng.randint(256, 4096)
        budget, beta, tail = 2048, 128, 0
        V = P + budget + beta
        pos = list(range(P, V - tail))
        score = {s: rng.random() + 0.5 * (s - P) / (V - P) for s in pos}  # recency-biased importance
        kept = sorted(sorted(pos, key=score.get, reverse=True)[:budget])
        return dict(kept=kept, prompt_len=P, valid_len=V, tail=tail)

    for R_ in (1, 2, 4, 8, 16):
        for _ in range(3):
            ops.append(dict(op="compaction_move", style="forward", block_size=block_size,
                            requests=[round_req() for _ in range(R_)]))
    for R_ in (1, 8):
        ops.append(dict(op="compaction_move", style="hole_fill", block_size=block_size,
                        requests=[round_req() for _ in range(R_)]))
    for n in (1, 16, 64, 256):
        ops.append(dict(op="d2h", codec="nvfp4", fused=True, pages=n, page_tokens=block_size))
        ops.append(dict(op="h2d", codec="nvfp4", fused=True, pages=n, page_tokens=block_size))
        ops.append(dict(op="d2h", codec="none", pages=n, page_tokens=block_size))
    for n in (16, 256):
        ops.append(dict(op="d2h", codec="nvfp4", fused=False, pages=n, page_tokens=block_size))
        ops.append(dict(op="h2d", codec="nvfp4", fused=False, pages=n, page_tokens=block_size))
        ops.append(dict(op="d2h", codec="fp8", fused=True, pages=n, page_tokens=block_size))
        ops.append(dict(op="h2d", codec="fp8", fused=True, pages=n, page_tokens=block_size))
        ops.append(dict(op="h2d", codec="none", pages=n, page_tokens=block_size))
    return ops


def calib_name(op: dict) -> str:
    """Calibration op name an ops-file entry is predicted with."""
    if op["op"] == "compaction_move":
        return "compaction_hole_fill" if op.get("style", "forward") == "hole_fill" else "compaction_move"
    codec, fused = op.get("codec", "none"), op.get("fused", True)
    if op["op"] == "d2h":
        return {"none": "d2h", "nvfp4": "nvfp4_encode_d2h_fused" if fused else "nvfp4_encode_then_d2h",
                "fp8": "fp8_encode_d2h_fused"}[codec]
    if op["op"] == "h2d":
        return {"none": "h2d", "nvfp4": "nvfp4_h2d_decode_fused" if fused else "h2d_then_nvfp4_decode",
                "fp8": "fp8_h2d_decode_fused"}[codec]
    raise ValueError(f"unknown op {op['op']!r}")


ELEM_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}


def pool_tokens(token_bytes: int, free_bytes: int, want: int = 140_000, frac: float = 0.5) -> int:
    """Token slots of a replay pool: ``want`` (enough for 16 requests of a 4096-token prompt plus
    2176 decode tokens), fewer when ``frac`` of the device's free memory cannot hold that many
    slots of ``token_bytes`` (all layers, K and V); the rest stays free for page buffers."""
    return max(1, min(want, int(frac * free_bytes) // max(int(token_bytes), 1)))


def amax_per_layer_kv(kv, chunk_bytes: int = 1 << 30):
    """``max |x|`` per (layer, K/V) of a pool ``kv[L, NB, 2, H, B, D]`` as float32 [L, 2],
    read in chunks of blocks (about ``chunk_bytes`` of float32 at a time) instead of one float32
    copy of the whole pool; equal to ``kv.float().abs().amax(dim=(1, 3, 4, 5))``."""
    L, NB = kv.shape[0], kv.shape[1]
    per_block = max(1, kv[:, :1].numel() * 4)
    step = max(1, chunk_bytes // per_block)
    out = None
    for s in range(0, NB, step):
        a = kv[:, s:s + step].float().abs().amax(dim=(1, 3, 4, 5))
        out = a if out is None else torch.maximum(out, a)
    return out


class Replayer:
    def __init__(self, model: dict, max_tokens: int | None = None):
        """``max_tokens``: token slots per pool; None sizes each pool from the device's free
        memory (:func:`pool_tokens`: 140,000 slots where they fit, as on an 80 GB card for
        Qwen3-8B shapes, 20.6 GB)."""
        self.model = model
        self.max_tokens = max_tokens
        self.pools = {}
        self.next_rid = 0

    def pool(self, B):
        if B not in self.pools:
            m = self.model
            dt = m.get("dtype", "bf16")
            token_bytes = m["num_layers"] * 2 * m["num_kv_heads"] * m["head_dim"] * ELEM_BYTES.get(dt, 2)
            tokens = self.max_tokens
            if tokens is None:
                free, _ = torch.cuda.mem_get_info()
                tokens = pool_tokens(token_bytes, free)
                if tokens < 140_000:
                    print(f"replay pool of block size {B}: {tokens} token slots ({tokens * token_bytes / 2**30:.1f} "
                          f"GiB), sized from {free / 2**30:.1f} GiB free", flush=True)
            NB = tokens // B
            p = PagedKVPool(m["num_layers"], NB, m["num_kv_heads"], B, m["head_dim"], dt,
                            "cuda", with_positions=True, seed=B)
            random.Random(B).shuffle(p._free)
            kv = p.kv
            amax = amax_per_layer_kv(kv)
            p.g4 = R.nvfp4_global_scale(amax).cuda()
            p.s8 = R.fp8_global_scale(amax).cuda()
            self.pools[B] = p
        return self.pools[B]

    def compaction(self, op):
        B = int(op.get("block_size", 32))
        pool = self.pool(B)
        reqs = op["requests"]
        rids = []
        for rq in reqs:
            rid = ("v", self.next_rid)
            self.next_rid += 1
            pool.allocate(rid, rq["valid_len"])
            rids.append(rid)
        bts = [list(pool.block_tables[r]) for r in rids]
        batch = K.CompactionBatch.from_requests(reqs, bts, "cuda")
        hole = op.get("style", "forward") == "hole_fill"
        if hole:
            pairs = K.hole_fill_pairs(batch, B)
            moved = int(pairs[2].sum().item())
            fn = lambda: K.compact_hole_fill(pool.kv, None, batch, return_freed=False, pairs=pairs)  # noqa: E731
        else:
            moved = 0
            for rq in reqs:
                src = R.forward_move_sources(rq["kept"], rq["prompt_len"], rq["valid_len"], rq["tail"])
                moved += sum(1 for m, s in enumerate(src) if s != rq["prompt_len"] + m)
            fn = lambda: K.compact_forward(pool.kv, batch, return_freed=False)  # noqa: E731
        if moved == 0:
            fn = None
        # one real round (blocks), then timing of the same moves
        if hole:
            new, freed = K.compact_hole_fill(pool.kv, pool.positions, batch)
        else:
            new, freed = K.compact_forward(pool.kv, batch)
        for rid, f in zip(rids, freed):
            pool.free_blocks(rid, f)
        measured_blocks = sum(len(pool.block_tables[r]) for r in rids)
        predicted_blocks = sum(-(-(rq["prompt_len"] + len(rq["kept"]) + rq["tail"]) // B) for rq in reqs)
        t = time_op(fn, warmup=1, reps=5, graph=True) if fn is not None else 0.0
        for rid in rids:
            pool.release(rid)
        return t, moved * pool.token_bytes, len(reqs), predicted_blocks, measured_blocks

    def transfer(self, op):
        B = int(op.get("page_tokens", 32))
        pool = self.pool(B)
        n = int(op["pages"])
        kv = pool.kv
        L, H, D = pool.num_layers, pool.num_kv_heads, pool.head_dim
        blocks = torch.randperm(pool.num_blocks, device="cuda")[:n].to(torch.int32)
        codec, fused = op.get("codec", "none"), op.get("fused", True)
        hot = pool.block_bytes
        if codec == "nvfp4":
            pb = R.nvfp4_page_layout(L, H, B, D)["page_bytes"]
        elif codec == "fp8":
            pb = R.fp8_page_bytes(L, H, B, D)
        else:
            pb = hot
        host = torch.empty((n, pb), dtype=torch.uint8, pin_memory=True)
        dev = torch.empty((n, pb), dtype=torch.uint8, device="cuda")
        d2h = op["op"] == "d2h"
        if codec == "nvfp4":
            K.nvfp4_encode(kv, blocks, pool.g4, dev)
            host.copy_(dev.cpu())
            if d2h:
                fn = ((lambda: K.nvfp4_encode(kv, blocks, pool.g4, host)) if fused else
                      (lambda: (K.nvfp4_encode(kv, blocks, pool.g4, dev), host.copy_(dev, non_blocking=True))))
            else:
                fn = ((lambda: K.nvfp4_decode(host, kv, blocks, pool.g4)) if fused else
                      (lambda: (dev.copy_(host, non_blocking=True), K.nvfp4_decode(dev, kv, blocks, pool.g4))))
            nbytes = n * hot
        elif codec == "fp8":
            if not fused:
                raise ValueError("fp8 transfers are measured fused only")
            K.fp8_encode(kv, blocks, pool.s8, dev)
            host.copy_(dev.cpu())
            fn = ((lambda: K.fp8_encode(kv, blocks, pool.s8, host)) if d2h else
                  (lambda: K.fp8_decode(host, kv, blocks, pool.s8)))
            nbytes = n * hot
        else:
            fn = (lambda: host.copy_(dev, non_blocking=True)) if d2h else (lambda: dev.copy_(host, non_blocking=True))
            nbytes = n * pb
        t = time_op(fn, warmup=2, reps=7, graph=codec != "none")
        items = n if codec != "none" else 1
        return t, nbytes, items, None, None


def run(ops, cal, source: str):
    model = dict(MODEL_DEFAULT)
    rep = None
    results = []
    for op in ops:
        if op["op"] == "model":
            model.update({k: v for k, v in op.items() if k != "op"})
            rep = None
            continue
        if rep is None:
            rep = Replayer(model)
        name = calib_name(op)
        if op["op"] == "compaction_move":
            t, nbytes, items, pb, mb = rep.compaction(op)
        else:
            t, nbytes, items, pb, mb = rep.transfer(op)
        timed = t > 0
        pred = cal.op_time(name, nbytes, items) if cal.has(name) else float("nan")
        err = abs(pred - t) / t if timed else float("nan")
        sim = op.get("predicted_s")
        sim = float(sim) if sim is not None else None
        sim_err = abs(sim - t) / t if sim is not None and timed else None
        results.append(dict(op=name, source=source, nbytes=nbytes, n_items=items, measured_s=t, predicted_s=pred,
                            abs_rel_err=err, timed=timed, sim_predicted_s=sim, sim_abs_rel_err=sim_err,
                            sim_bytes_moved=op.get("bytes_moved"), sim_blocks_after=op.get("blocks_after"),
                            predicted_blocks=pb, measured_blocks=mb))
        if not timed:
            print(f"{name:24s} items={items:4d} moves nothing: not timed (simulator predicted "
                  f"{1e6 * (sim or 0.0):.1f} us)  blocks pred {pb} sim {op.get('blocks_after')} meas {mb}", flush=True)
            continue
        print(f"{name:24s} items={items:4d} bytes={nbytes/2**20:10.1f} MiB measured {t*1e6:9.1f} us "
              f"calibration {pred*1e6:9.1f} us  err {100*err:5.1f}%"
              + (f"  simulator {sim*1e6:9.1f} us err {100*sim_err:5.1f}%" if sim is not None else "")
              + (f"  blocks pred {pb} sim {op.get('blocks_after')} meas {mb}" if pb is not None else ""), flush=True)
    return results


def _pct(x, q):
    return f"{100 * np.percentile(x, q):.1f}%" if len(x) else "n/a"


def report(results, cal, cmd, path, source_note):
    """Write the error table (median / p90 absolute relative error per op, against the
    simulator's ``predicted_s`` when the ops carry it and against the calibration model) and
    the blocks-in-use comparison to ``path``; return the text."""
    by = {}
    for r in results:
        by.setdefault(r["op"], []).append(r)
    has_sim = any(r["sim_predicted_s"] is not None for r in results)
    lines = ["# gpu_validation: measured vs predicted", "",
             f"Produced by: `{cmd}`", "",
             f"Device: {cal.device.get('name')}; calibration file `{cal.path}` (dated {cal.date}); "
             f"run {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}; "
             f"torch {torch.__version__}.", "",
             f"Ops: {source_note}", "",
             "Measured: CUDA events, median of 5-7 repeats after warm-up; kernel ops as CUDA-graph replays "
             "(as in the calibration), plain h2d/d2h copies eager. Error = |predicted - measured| / measured.",
             "Simulator: the `predicted_s` the simulator charged for that round / batch (ops file). "
             "Calibration: `Calibration.op_time(op, nbytes, n_items)` on the bytes and items the replay "
             "moved (affine fit from the calibration sweep).", ""]
    if has_sim:
        lines += ["| op | ops timed | simulator: median err | simulator: p90 err | calibration: median err | "
                  "calibration: p90 err | median measured (us) | median simulator (us) | median calibration (us) | "
                  "max rel diff simulator vs calibration |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    else:
        lines += ["| op | ops timed | median abs rel err | p90 abs rel err | median measured (us) | median predicted (us) |",
                  "|---|---:|---:|---:|---:|---:|"]
    untimed = 0
    for name, rs_all in sorted(by.items()):
        rs = [r for r in rs_all if r["timed"]]
        untimed += len(rs_all) - len(rs)
        if not rs:
            continue
        e = np.array([r["abs_rel_err"] for r in rs])
        meas = 1e6 * np.median([r["measured_s"] for r in rs])
        calp = 1e6 * np.median([r["predicted_s"] for r in rs])
        if has_sim:
            sr = [r for r in rs if r["sim_predicted_s"] is not None]
            se = np.array([r["sim_abs_rel_err"] for r in sr])
            simp = f"{1e6 * np.median([r['sim_predicted_s'] for r in sr]):.1f}" if sr else "n/a"
            diff = max((abs(r["sim_predicted_s"] - r["predicted_s"]) / r["predicted_s"] for r in sr), default=None)
            lines.append(f"| {name} | {len(rs)} | {_pct(se, 50)} | {_pct(se, 90)} | {_pct(e, 50)} | {_pct(e, 90)} | "
                         f"{meas:.1f} | {simp} | {calp:.1f} | {'n/a' if diff is None else f'{diff:.1e}'} |")
        else:
            lines.append(f"| {name} | {len(rs)} | {_pct(e, 50)} | {_pct(e, 90)} | {meas:.1f} | {calp:.1f} |")
    if untimed:
        lines += ["", f"{untimed} compaction rounds moved no token (prefix of kept slots already in place): "
                  "not timed, the simulator charges 0 s for them; their blocks are compared below."]
    comp = [r for r in results if r["predicted_blocks"] is not None]
    if comp:
        ok = sum(r["predicted_blocks"] == r["measured_blocks"] for r in comp)
        lines += ["", "Blocks in use after compaction, per round (measured = pool blocks still held after freeing "
                  "the blocks the real kernel reported empty; rule = sum over requests of ceil(new_len / block_size)): "
                  f"rule = measured in {ok}/{len(comp)} rounds (totals {sum(r['predicted_blocks'] for r in comp)} "
                  f"vs {sum(r['measured_blocks'] for r in comp)})."]
        sim = [r for r in comp if r["sim_blocks_after"] is not None]
        if sim:
            ok = sum(r["sim_blocks_after"] == r["measured_blocks"] for r in sim)
            lines.append(f"Simulator's `blocks_after` = measured in {ok}/{len(sim)} rounds (totals "
                         f"{sum(r['sim_blocks_after'] for r in sim)} vs {sum(r['measured_blocks'] for r in sim)}).")
        bm = [r for r in comp if r["sim_bytes_moved"] is not None and r["timed"]]
        if bm:
            ok = sum(abs(r["sim_bytes_moved"] - r["nbytes"]) <= 0.5 for r in bm)
            lines.append(f"Simulator's `bytes_moved` = bytes of tokens the replay moved in {ok}/{len(bm)} timed rounds.")
    lines += ["", "Per-op rows are in the JSON written next to this report when `--json` is given.", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calibration", default="gpu_validation/calibrations/h200.json")
    ap.add_argument("--ops", default=None, help="JSONL ops file (default: generated set)")
    ap.add_argument("--report", default="gpu_validation/REPORT.md")
    ap.add_argument("--json", default=None, help="write per-op rows here")
    ap.add_argument("--dump-ops", default=None,
                    help="write the generated default ops as JSONL (without --ops; on a machine "
                         "without torch or a CUDA GPU it only writes them)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--note", default="", help="how the ops file was produced (goes into the report)")
    args = ap.parse_args(argv)
    if args.dump_ops and args.ops:
        ap.error("--dump-ops writes the generated default ops; with --ops FILE they are not used")
    from .trim_ops import read_ops_or_exit, write_ops

    if args.dump_ops:  # (the ops are generated without torch: written before the GPU checks)
        generated = gen_default_ops(args.seed)
        write_ops(args.dump_ops, generated)
        if _MISSING is not None or not torch.cuda.is_available():
            print(f"wrote {args.dump_ops} ({len(generated)} ops, seed {args.seed}); nothing "
                  f"replayed: {'torch and triton are missing' if _MISSING else 'no CUDA GPU'}")
            return
    ops = read_ops_or_exit(args.ops) if args.ops else None  # (checked before the GPU is)
    if _MISSING is not None:
        sys.exit(f"validate needs torch and triton ({_MISSING}); install them with "
                 f"pip install -e '.[gpu]' (a CUDA build of torch on the GPU machine)")
    if not torch.cuda.is_available():
        sys.exit("validate needs a CUDA GPU")
    cal = load_calibration(args.calibration)
    if args.ops:
        note = f"from ops file `{args.ops}` ({len(ops)} lines). {args.note}".strip()
        src = "file"
    else:
        ops = gen_default_ops(args.seed)
        note = ("generated by `gen_default_ops(seed=%d)` (no ops file given): TriAttention-like forward-packing "
                "rounds (budget 2048, beta 128, prompt 256-4096, recency-biased seeded random importance) for "
                "1/2/4/8/16 requests, hole-filling rounds for 1 and 8 requests, offload (d2h) and onboard (h2d) "
                "batches of 1-256 pages of 32 tokens: NVFP4 fused and unfused, FP8 fused, raw bf16; Qwen3-8B "
                "shapes (36 layers, 8 KV heads, d=128, bf16)." % args.seed)
        src = "generated"
    cmd = "python -m gpu_validation.validate " + " ".join(argv if argv is not None else sys.argv[1:])
    results = run(ops, cal, src)
    print(report(results, cal, cmd, args.report, note))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
