"""Per-operator timings on a real GPU for the shapes of kvsim model cards.

What it times (one layer, one GPU; ``t`` = tensor-parallel degree, the shard one GPU holds):

* dense GEMMs ``[m, k] x [k, n]`` per projection and ``t``: QKV (k = hidden, n = (q_heads/t +
  2 max(kv_heads/t, 1)) head_dim; KV heads replicated once ``t`` exceeds them, as servers do),
  O (k = q_heads/t head_dim, n = hidden), gate_up (k = hidden, n = 2 intermediate/t; n =
  intermediate/t for a non-gated MLP), down (k = intermediate/t, n = hidden), lm_head (k = hidden,
  n = ceil(vocab/t)); MoE shared experts and MLA projections (DeepSeek) likewise; bf16
  (``torch.nn.functional.linear``) and fp8 (``torch._scaled_mm``, e4m3 weights and activations,
  per-tensor scales, bf16 output);
* grouped expert GEMMs of MoE cards: ``T`` tokens routed uniformly at random to ``top_k`` of
  ``E`` experts, each touched expert multiplying its rows by its ``[k, n]`` weight
  (``torch._grouped_mm`` / ``torch._scaled_grouped_mm``, else a loop of GEMMs);
* attention: decode (one query token per sequence; contiguous KV ``[batch, kv_heads, kv_tokens,
  head_dim]``) and prefill (``new`` causal query tokens after ``context`` cached ones) with the
  flash kernel of torch SDPA.

Reading the cards (:mod:`gpu_validation.model_cards`) and planning (deduplicated shapes, time
estimate: :mod:`gpu_validation.operator_plan`) need only the standard library, so they can be
tested and checked on a machine without torch; this module times the plan:
:func:`bench_operators` needs torch (a
CUDA GPU for real numbers; a CPU runs it as a smoke test, eagerly timed with a host clock).
Units: seconds, tokens, elements; FLOP counts are 2 m n k for a GEMM.
"""
from __future__ import annotations

import math
import statistics
import time

from .model_cards import ModelShapes
from .operator_plan import (DECODE_MAX_BYTES, DECODE_MAX_TOKENS, EAGER_DECODE, EAGER_M, EAGER_PREFILL, EAGER_T,
                            MAX_COPIES, MAX_GRAPH_S, ROTATE_L2_FACTOR, Plan, ceil_div, decode_points,
                            estimate_seconds, grids, plan_operators)


class Timer:
    """Times lists of zero-argument callables on one device.

    CUDA: ``graph`` mode captures one call of every callable in ``fns`` (copies of the op on
    rotated buffers) into a CUDA graph and times replays with CUDA events: seconds = median over
    ``reps`` of (replay time / len(fns)); GPU time without launch overhead. ``eager`` mode
    records events around one Python call (``fns`` rotated between repeats), so the host's
    launch latency is included whenever the GPU waits for it. CPU (smoke test only): eager,
    host clock around the call."""

    def __init__(self, torch, device: str, log=print):
        self.torch, self.device, self.log = torch, device, log
        self.cuda = device.startswith("cuda")
        self.graph_failures = []

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def time(self, fns, mode="graph", reps=10, warmup=2):
        """(median seconds per call, mode actually used)."""
        torch = self.torch
        if not self.cuda:
            reps, warmup = 3, 1
        for _ in range(warmup):
            for f in fns:
                f()
        self.sync()
        if mode == "graph" and self.cuda:
            g = None
            try:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for f in fns:
                        f()
                g.replay()
                torch.cuda.synchronize()
            except Exception as e:  # pragma: no cover - device specific
                self.graph_failures.append(f"{type(e).__name__}: {str(e)[:200]}")
                self.log(f"  graph capture failed ({type(e).__name__}: {str(e)[:120]}); timing eagerly")
                g = None
                torch.cuda.synchronize()
            if g is not None:
                ts = []
                for _ in range(reps):
                    a = torch.cuda.Event(enable_timing=True)
                    b = torch.cuda.Event(enable_timing=True)
                    a.record()
                    g.replay()
                    b.record()
                    b.synchronize()
                    ts.append(a.elapsed_time(b) * 1e-3 / len(fns))
                del g
                return statistics.median(ts), "graph"
        ts = []
        for i in range(reps):
            f = fns[i % len(fns)]
            if self.cuda:
                a = torch.cuda.Event(enable_timing=True)
                b = torch.cuda.Event(enable_timing=True)
                a.record()
                f()
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b) * 1e-3)
            else:
                t0 = time.perf_counter()
                f()
                ts.append(time.perf_counter() - t0)
        return statistics.median(ts), "eager"


def _copies(rotated_bytes: float, est_s: float, l2_bytes: int) -> int:
    """Buffer copies so the rotated bytes together reach ROTATE_L2_FACTOR x L2, at most
    MAX_COPIES and at most MAX_GRAPH_S of estimated work per replay (>= 1)."""
    c = max(1, math.ceil(ROTATE_L2_FACTOR * l2_bytes / max(rotated_bytes, 1)))
    c = min(c, MAX_COPIES, max(1, int(MAX_GRAPH_S / max(est_s, 1e-7))))
    return max(1, c)


def _reps(est_s: float) -> int:
    return 10 if est_s < 1e-3 else (7 if est_s < 1e-2 else 5)


def _rel_err(out, ref) -> float:
    o, r = out.double(), ref.double()
    return float((o - r).norm() / max(float(r.norm()), 1e-30))


class OperatorBench:
    """Runs a :class:`Plan` and fills the ``operators`` section (schema: gpu_validation/README.md).

    ``budget_s``: once the section has run this long, remaining points are skipped (recorded in
    ``notes.not_measured``), so a device call ends inside its limit."""

    def __init__(self, torch, plan: Plan, device="cuda", quick=False, budget_s=420.0, log=print,
                 checkpoint=None):
        self.torch, self.plan, self.device, self.log = torch, plan, device, log
        self.cuda = device.startswith("cuda")
        self.g = grids(quick, cpu=not self.cuda)
        self.timer = Timer(torch, device, log)
        self.t0 = time.time()
        self.budget_s = budget_s
        self.checkpoint = checkpoint
        if self.cuda:
            prop = torch.cuda.get_device_properties(0)
            self.l2 = int(getattr(prop, "L2_cache_size", 0) or 50 << 20)
        else:
            self.l2 = 64 << 10  # (CPU smoke test: few copies)
        self.gen = torch.Generator(device="cpu").manual_seed(0)
        self.out = {"gemm": [], "grouped_gemm": [], "attention_decode": [], "attention_prefill": [],
                    "notes": {}}
        self.notes = self.out["notes"]
        self.not_measured = []
        self.checks = {}
        self.fp8 = hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")
        if self.cuda and self.fp8:
            cc = torch.cuda.get_device_capability(0)
            if cc < (8, 9):
                self.fp8 = False
                self.fp8_why = f"compute capability {cc[0]}.{cc[1]} has no FP8 tensor cores (needs >= 8.9)"
        if not self.fp8 and not hasattr(self, "fp8_why"):
            self.fp8_why = "this torch has no float8_e4m3fn / torch._scaled_mm"
        self.fp8_padded = []

    # ---- helpers
    def over_budget(self) -> bool:
        return time.time() - self.t0 > self.budget_s

    def randn(self, *shape, dtype=None, scale=1.0):
        t = self.torch
        x = t.randn(*shape, device=self.device, dtype=t.bfloat16)
        if scale != 1.0:
            x.mul_(scale)
        return x if dtype is None or dtype == t.bfloat16 else x.to(dtype)

    def _save(self):
        if self.checkpoint is not None:
            self.finish_notes()
            self.checkpoint(self.out)

    # ---- dense GEMM
    def _gemm_fn(self, dtype, x, w):
        """Callable computing x [m, k] times w [n, k]^T -> [m, n] bf16."""
        t = self.torch
        if dtype == "bf16":
            return lambda: t.nn.functional.linear(x, w)
        one = t.ones((), device=self.device, dtype=t.float32)
        return lambda: t._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=t.bfloat16)

    def check_gemm(self):
        """Relative error of both GEMM paths against a float64 product of the same operands."""
        t = self.torch
        x, w = self.randn(96, 512), self.randn(384, 512, scale=0.05)
        self.checks["gemm_bf16_rel_err"] = _rel_err(self._gemm_fn("bf16", x, w)(), x.double() @ w.double().t())
        if self.fp8:
            x8, w8 = x.to(t.float8_e4m3fn), w.to(t.float8_e4m3fn)
            try:
                out = self._gemm_fn("fp8", x8, w8)()
                self.checks["gemm_fp8_rel_err"] = _rel_err(out, x8.double() @ w8.double().t())
            except Exception as e:
                self.fp8 = False
                self.fp8_why = f"torch._scaled_mm failed: {type(e).__name__}: {str(e)[:200]}"

    def _time_modes(self, table, fns, est, eager, row, time_key, line):
        """Time ``fns`` as CUDA-graph replays, and eagerly too when ``eager``, and append one
        row per mode that ran to ``self.out[table]``: ``row`` with the median time (s) under
        ``time_key`` and the mode; a mode that fell back to one already recorded (a graph
        capture that failed runs eagerly) is not repeated. ``line(seconds, mode)`` is the log
        line. ``est``: the expected time (s), which sets the repeats."""
        done = set()
        for mode in ["graph"] + (["eager"] if eager else []):
            s, used = self.timer.time(fns, mode, reps=_reps(est))
            if used in done:
                continue
            done.add(used)
            self.out[table].append(dict(row, **{time_key: s}, mode=used))
            self.log(line(s, used))

    def _gemm_point(self, dt, tdt, el, m, n, k, ws, nw):
        """Time one (dtype, m, n, k) point (graph; eager too for the first card's shapes)."""
        est = max(2 * m * n * k / (1.1e15 if dt == "fp8" else 6.5e14),
                  (n * k * el + m * (k * el + 2 * n)) / 2.8e12)
        c = min(nw, _copies(n * k * el, est, self.l2))
        x = self.randn(m, k, dtype=tdt)
        fns = [self._gemm_fn(dt, x, w) for w in ws[:c]]
        try:
            fns[0]()
        except RuntimeError as e:
            if dt != "fp8":
                raise
            mm = ceil_div(m, 16) * 16  # (an M the FP8 GEMM refuses: padded rows, recorded)
            x = self.randn(mm, k, dtype=tdt)
            fns = [self._gemm_fn(dt, x, w) for w in ws[:c]]
            fns[0]()
            self.fp8_padded.append(dict(m=m, padded_to=mm, why=str(e)[:160]))
        self._time_modes(
            "gemm", fns, est, (n, k) in self.plan.eager_gemm and m in EAGER_M,
            dict(dtype=dt, m=m, n=n, k=k), "seconds",
            lambda s, used: f"gemm {dt:4s} m={m:6d} n={n:6d} k={k:6d} {s*1e6:10.2f} us "
                            f"{2*m*n*k/s/1e12:7.1f} TFLOP/s ({used}, {c} weight copies)")

    def bench_gemm(self):
        t = self.torch
        self.check_gemm()
        dtypes = ["bf16"] + (["fp8"] if self.fp8 else [])
        for (n, k) in sorted(self.plan.gemm, key=lambda s: (s[1], s[0])):
            if self.over_budget():
                self.not_measured.append(f"gemm n={n} k={k} and later: section time budget spent")
                break
            for dt in dtypes:
                if dt == "fp8" and (n % 16 or k % 16):
                    self.plan.skipped.append(f"gemm fp8 n={n} k={k}: not multiples of 16 (FP8 GEMM alignment)")
                    continue
                el = 2 if dt == "bf16" else 1
                tdt = t.bfloat16 if dt == "bf16" else t.float8_e4m3fn
                est1 = n * k * el / 2.8e12
                nw = _copies(n * k * el, est1, self.l2)
                ws = [self.randn(n, k, dtype=tdt, scale=0.02) for _ in range(nw)]
                for m in self.g["m"]:
                    try:
                        self._gemm_point(dt, tdt, el, m, n, k, ws, nw)
                    except Exception as e:  # (one point; the others still run)
                        self.not_measured.append(f"gemm {dt} m={m} n={n} k={k}: {type(e).__name__}: {str(e)[:160]}")
                        self.log(f"gemm {dt} m={m} n={n} k={k} FAILED: {type(e).__name__}: {str(e)[:160]}")
                        if self.cuda:
                            t.cuda.synchronize()
                            t.cuda.empty_cache()
                del ws
            if self.cuda:
                t.cuda.empty_cache()
        self._save()

    # ---- grouped expert GEMM
    def _route(self, T, E, top):
        """Rows per expert (CPU int64 [E]) for T tokens, each routed to ``top`` distinct experts
        drawn uniformly at random."""
        t = self.torch
        idx = t.rand(T, E, generator=self.gen).topk(top, dim=1).indices
        return t.bincount(idx.flatten(), minlength=E)

    @staticmethod
    def _rows(counts, method):
        """Rows the GEMM sees per expert: the routed rows, or padded up to a multiple of 16 per
        touched expert (method 'grouped_mm_pad16')."""
        return ((counts + 15) // 16) * 16 if method == "grouped_mm_pad16" else counts

    def _grouped_fns(self, dt, x, w, counts_list, method):
        """Callables, one per routing in ``counts_list`` (CPU int64 [E] rows per expert; the
        rows of ``x`` [sum rows, k] are sorted by expert), for weights ``w`` [E, n, k]."""
        t = self.torch
        fns = []
        for counts in counts_list:
            rows = self._rows(counts, method)
            if method.startswith("grouped_mm"):
                offs = t.cumsum(rows, 0).to(device=self.device, dtype=t.int32)
                if dt == "bf16":
                    fns.append(lambda offs=offs: t._grouped_mm(x, w.transpose(-2, -1), offs=offs))
                else:
                    sa = t.ones(x.shape[0], device=self.device, dtype=t.float32)
                    sb = t.ones(w.shape[0], w.shape[1], device=self.device, dtype=t.float32)
                    fns.append(lambda offs=offs, sa=sa, sb=sb: t._scaled_grouped_mm(
                        x, w.transpose(-2, -1), sa, sb, offs=offs, out_dtype=t.bfloat16))
            else:
                bounds, s = [], 0
                for e, c in enumerate(rows.tolist()):
                    if c:
                        bounds.append((e, s, s + c))
                    s += c
                one = t.ones((), device=self.device, dtype=t.float32)

                def loop(bounds=bounds, one=one):
                    for e, a, b in bounds:
                        if dt == "bf16":
                            t.nn.functional.linear(x[a:b], w[e])
                        else:
                            t._scaled_mm(x[a:b], w[e].t(), scale_a=one, scale_b=one, out_dtype=t.bfloat16)
                fns.append(loop)
        return fns

    def _grouped_method(self, dt):
        """The grouped-GEMM method for ``dt``: 'grouped_mm' (torch's grouped kernel on the routed
        rows), 'grouped_mm_pad16' (the same with each expert's rows padded to a multiple of 16,
        when the kernel refuses or mis-computes unaligned groups) or 'loop'; checked against a
        float64 per-expert product on a small problem with unaligned and empty groups.
        Returns (method, reasons for what was passed over)."""
        t = self.torch
        name = "_grouped_mm" if dt == "bf16" else "_scaled_grouped_mm"
        tdt = t.bfloat16 if dt == "bf16" else t.float8_e4m3fn
        why = []
        if not hasattr(t, name):
            why.append(f"torch.{name} absent")
        E, n, k = 4, 64, 128
        counts = t.tensor([13, 0, 37, 30])
        w = self.randn(E, n, k, scale=0.05, dtype=tdt)
        for method in (["grouped_mm", "grouped_mm_pad16"] if hasattr(t, name) else []) + ["loop"]:
            rows = self._rows(counts, method)
            x = self.randn(int(rows.sum()), k, dtype=tdt)
            try:
                out = self._grouped_fns(dt, x, w, [counts], method)[0]()
                if method == "loop":
                    return method, why
                ref, s = [], 0
                for e, c in enumerate(rows.tolist()):
                    ref.append(x[s:s + c].double() @ w[e].double().t())
                    s += c
                err = _rel_err(out, t.cat(ref))
                self.checks[f"grouped_{dt}_{method}_rel_err"] = err
                if err < 2e-2:
                    return method, why
                why.append(f"torch.{name} ({method}) disagreed with the per-expert product (rel err {err:.2e})")
            except Exception as e:
                why.append(f"torch.{name} ({method}) failed: {type(e).__name__}: {str(e)[:200]}")
        return "loop", why

    def bench_grouped(self):
        t = self.torch
        if not self.plan.grouped:
            return
        dtypes = ["bf16"] + (["fp8"] if self.fp8 else [])
        methods = {}
        for dt in dtypes:
            meth, why = self._grouped_method(dt)
            methods[dt] = meth
            if why:
                self.notes.setdefault("grouped_gemm_fallback", {})[dt] = why
        fn_name = {"bf16": "torch._grouped_mm bf16", "fp8": "torch._scaled_grouped_mm fp8 e4m3 (rowwise "
                   "scales: one per row, one per expert output column), bf16 out"}
        desc = {"grouped_mm": "{f}; 2D x 3D, offs over all experts (empty groups for untouched ones)",
                "grouped_mm_pad16": "{f}; 2D x 3D, offs over all experts, each touched expert's rows "
                                    "padded to a multiple of 16",
                "loop": "loop over the touched experts of {g}"}
        for key in sorted(self.plan.grouped):
            E, top, n, k = key
            if self.over_budget():
                self.not_measured.append(f"grouped_gemm experts={E} top_k={top} n={n} k={k} and later: "
                                         f"section time budget spent")
                break
            for dt in dtypes:
                if dt == "fp8" and (n % 16 or k % 16):
                    self.plan.skipped.append(f"grouped_gemm fp8 experts={E} n={n} k={k}: not multiples of 16 "
                                             f"(FP8 GEMM alignment)")
                    continue
                meth = methods[dt]
                method = desc[meth].format(
                    f=fn_name[dt], g="torch.nn.functional.linear (bf16)" if dt == "bf16" else
                    "torch._scaled_mm (fp8 e4m3, per-tensor scales)")
                tdt = t.bfloat16 if dt == "bf16" else t.float8_e4m3fn
                try:
                    w = self.randn(E, n, k, dtype=tdt, scale=0.02)
                except Exception as e:
                    self.not_measured.append(f"grouped_gemm {dt} experts={E} n={n} k={k}: weights: "
                                             f"{type(e).__name__}: {str(e)[:160]}")
                    continue
                for T in self.g["t"]:
                    try:
                        self._grouped_point(dt, tdt, meth, method, key, T, w)
                    except Exception as e:
                        self.not_measured.append(f"grouped_gemm {dt} experts={E} n={n} k={k} T={T}: "
                                                 f"{type(e).__name__}: {str(e)[:160]}")
                        self.log(f"grouped {dt} E={E} n={n} k={k} T={T} FAILED: {type(e).__name__}: {str(e)[:160]}")
                        if self.cuda:
                            t.cuda.synchronize()
                del w
                if self.cuda:
                    t.cuda.empty_cache()
            self._save()

    def _grouped_point(self, dt, tdt, meth, method, key, T, w):
        """Time T routed tokens through the grouped GEMM (graph; eager too for a few points)."""
        t = self.torch
        E, top, n, k = key
        el = 2 if dt == "bf16" else 1
        counts = self._route(T, E, top)
        active = int((counts > 0).sum())
        est = max(2 * T * top * n * k / (1.1e15 if dt == "fp8" else 6.5e14), active * n * k * el / 2.8e12)
        c = _copies(active * n * k * el, est, self.l2)
        # the copies: the same row counts on other experts (a random relabelling of the experts)
        cl = [counts] + [counts[t.randperm(E, generator=self.gen)] for _ in range(c - 1)]
        x = self.randn(int(self._rows(counts, meth).sum()), k, dtype=tdt)
        fns = self._grouped_fns(dt, x, w, cl, meth)
        self._time_modes(
            "grouped_gemm", fns, est, key in self.plan.eager_grouped and T in EAGER_T,
            dict(dtype=dt, tokens=T, experts_active=active, n=n, k=k, method=method, experts=E,
                 top_k=top), "seconds",
            lambda s, used: f"grouped {dt:4s} E={E:3d} top{top} T={T:6d} active={active:3d} "
                            f"n={n:5d} k={k:5d} {s*1e6:10.2f} us "
                            f"{2*T*top*n*k/s/1e12:7.1f} TFLOP/s ({used}, {c} routings)")

    # ---- attention
    def _sdpa_ctx(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: PLC0415
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION])

    def _decode_fn(self, q, k, v):
        """GQA decode: q [b, kv_heads, group, D] (a sequence's one query token, its ``group``
        query heads per KV head laid out as query rows), k / v [b, kv_heads, S, D]; non-causal
        (the new token sees every cached token). Same FLOPs and KV bytes as q [b, q_heads, 1, D]."""
        F = self.torch.nn.functional

        def fn():
            with self._sdpa_ctx():
                return F.scaled_dot_product_attention(q, k, v)
        return fn

    def _prefill_fn(self, q, k, v, repeat: int):
        """Chunked prefill: q [1, q_heads, n, D], k / v [1, kv_heads, c + n, D]; causal aligned to
        the bottom right (query i sees cached tokens and new tokens <= i). Flash kernel called
        directly (its ``is_causal`` is bottom-right aligned), KV heads shared by ``group`` query
        heads; ``repeat`` > 1: K/V were repeated to q heads before timing (fallback)."""
        torch = self.torch
        if not self.cuda:  # (CPU smoke test: SDPA with an explicit bottom-right causal bias)
            from torch.nn.attention.bias import causal_lower_right  # noqa: PLC0415
            mask = causal_lower_right(q.shape[2], k.shape[2])
            return lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=k.shape[1] != q.shape[1])

        def fn():
            return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)[0]
        return fn

    def check_attention(self):
        """Decode and prefill paths against a float64 reference with an explicit mask; returns
        (decode ok, prefill GQA ok)."""
        t = self.torch
        b, Hq, Hk, D, S, n = 2, 8, 2, 64, 96, 40
        gq = Hq // Hk
        q = self.randn(b, Hq, 1, D)
        k, v = self.randn(b, Hk, S, D), self.randn(b, Hk, S, D)

        def ref(q, k, v, causal_offset=None):
            kk = k.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            vv = v.double().repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            s = q.double() @ kk.transpose(-1, -2) / math.sqrt(q.shape[-1])
            if causal_offset is not None:
                i = t.arange(q.shape[2], device=q.device)[:, None]
                j = t.arange(k.shape[2], device=q.device)[None, :]
                s = s.masked_fill(j > i + causal_offset, float("-inf"))
            return s.softmax(-1) @ vv
        ok = {}
        try:
            packed = q.view(b, Hk, gq, D)  # heads h*gq..h*gq+gq-1 share kv head h
            out = self._decode_fn(packed, k, v)().reshape(b, Hq, 1, D)
            ok["decode"] = _rel_err(out, ref(q, k, v))
        except Exception as e:
            ok["decode"] = f"{type(e).__name__}: {str(e)[:200]}"
        qp = self.randn(1, Hq, n, D)
        kp, vp = self.randn(1, Hk, S, D), self.randn(1, Hk, S, D)
        try:
            ok["prefill_gqa"] = _rel_err(self._prefill_fn(qp, kp, vp, 1)(), ref(qp, kp, vp, S - n))
        except Exception as e:
            ok["prefill_gqa"] = f"{type(e).__name__}: {str(e)[:200]}"
        try:
            kr, vr = kp.repeat_interleave(gq, 1), vp.repeat_interleave(gq, 1)
            ok["prefill_repeat"] = _rel_err(self._prefill_fn(qp, kr, vr, gq)(), ref(qp, kp, vp, S - n))
        except Exception as e:
            ok["prefill_repeat"] = f"{type(e).__name__}: {str(e)[:200]}"
        self.checks.update({f"attention_{k}_rel_err": v for k, v in ok.items()})
        good = lambda v: isinstance(v, float) and v < 2e-2  # noqa: E731
        return good(ok["decode"]), good(ok["prefill_gqa"]), good(ok["prefill_repeat"])

    def bench_attention(self):
        t = self.torch
        if not self.plan.attention:
            return
        dec_ok, pre_gqa, pre_rep = self.check_attention()
        dec_method = ("torch SDPA, flash backend forced (sdpa_kernel FLASH_ATTENTION), bf16; GQA decode "
                      "as q [batch, kv_heads, group, head_dim] against K/V [batch, kv_heads, kv_tokens, "
                      "head_dim], contiguous KV (no paging)")
        pre_method = (("torch.ops.aten._scaled_dot_product_flash_attention (FlashAttention-2 in torch), "
                       "bf16, is_causal bottom-right aligned, " if self.cuda else
                       "CPU smoke test: torch SDPA with a causal_lower_right bias, bf16, ")
                      + ("K/V with kv_heads heads (GQA in the kernel)" if pre_gqa else
                         "K/V repeated to q_heads before timing (the kernel refused GQA heads)")
                      + ", contiguous KV (no paging)")
        if not dec_ok:
            self.not_measured.append(f"attention_decode: the flash SDPA path failed its check "
                                     f"({self.checks.get('attention_decode_rel_err')})")
        if not (pre_gqa or pre_rep):
            self.not_measured.append(f"attention_prefill: the flash path failed its check "
                                     f"({self.checks.get('attention_prefill_gqa_rel_err')})")
        for (Hq, Hk, D) in sorted(self.plan.attention):
            if dec_ok:
                for (b, S) in decode_points(Hq, Hk, D, self.g):
                    if self.over_budget():
                        self.not_measured.append(f"attention_decode q{Hq} kv{Hk} d{D} b={b} S={S} and "
                                                 f"later: section time budget spent")
                        break
                    self._guard(f"attention_decode q{Hq} kv{Hk} d{D} b={b} S={S}",
                                self._decode_point, Hq, Hk, D, b, S, dec_method)
            if pre_gqa or pre_rep:
                rep = 1 if pre_gqa else Hq // Hk
                for n in self.g["new"]:
                    for c_ in self.g["ctx"]:
                        if self.over_budget():
                            self.not_measured.append(f"attention_prefill q{Hq} kv{Hk} d{D} n={n} c={c_} "
                                                     f"and later: section time budget spent")
                            break
                        self._guard(f"attention_prefill q{Hq} kv{Hk} d{D} n={n} c={c_}",
                                    self._prefill_point, Hq, Hk, D, n, c_, rep, pre_method)
            if self.cuda:
                t.cuda.empty_cache()
            self._save()

    def _guard(self, what, fn, *args):
        """Run one point; an exception is recorded in notes.not_measured and the others go on."""
        try:
            fn(*args)
        except Exception as e:
            self.not_measured.append(f"{what}: {type(e).__name__}: {str(e)[:160]}")
            self.log(f"{what} FAILED: {type(e).__name__}: {str(e)[:160]}")
            if self.cuda:
                self.torch.cuda.synchronize()
                self.torch.cuda.empty_cache()

    def _decode_point(self, Hq, Hk, D, b, S, method):
        """One decode point: ``b`` sequences of ``S`` cached tokens, one new query token each."""
        kvb = 2 * b * S * Hk * D * 2
        est = kvb / 2.8e12 + 5e-6
        c = _copies(kvb, est, self.l2)
        q = self.randn(b, Hk, Hq // Hk, D)
        kvs = [(self.randn(b, Hk, S, D), self.randn(b, Hk, S, D)) for _ in range(c)]
        fns = [self._decode_fn(q, k, v) for k, v in kvs]
        self._time_modes(
            "attention_decode", fns, est,
            (Hq, Hk, D) in self.plan.eager_attention and (b, S) in EAGER_DECODE,
            dict(kv_dtype="bf16", batch=b, kv_tokens=S, q_heads=Hq, kv_heads=Hk, head_dim=D,
                 method=method), "seconds_per_layer",
            lambda s, used: f"decode q{Hq:3d} kv{Hk:2d} d{D:3d} b={b:4d} S={S:6d} "
                            f"{s*1e6:9.2f} us KV {kvb/s/1e9:7.1f} GB/s ({used}, {c} KV copies)")

    def _prefill_point(self, Hq, Hk, D, n, c_, rep, method):
        """One prefill chunk: ``n`` new tokens (causal) after ``c_`` cached tokens, one sequence
        (graph replays on rotated q/K/V; eager too for a few points)."""
        fl = 4 * n * (c_ + n / 2) * Hq * D
        nbytes = (n * Hq + 2 * (c_ + n) * Hk * rep) * D * 2
        est = fl / 3.5e14 + 5e-6
        c = _copies(nbytes, est, self.l2)
        qkv = [(self.randn(1, Hq, n, D), self.randn(1, Hk * rep, c_ + n, D), self.randn(1, Hk * rep, c_ + n, D))
               for _ in range(c)]
        fns = [self._prefill_fn(q, k, v, rep) for q, k, v in qkv]
        self._time_modes(
            "attention_prefill", fns, est,
            (Hq, Hk, D) in self.plan.eager_attention and (n, c_) in EAGER_PREFILL,
            dict(kv_dtype="bf16", new_tokens=n, context_tokens=c_, q_heads=Hq, kv_heads=Hk,
                 head_dim=D, method=method), "seconds_per_layer",
            lambda s, used: f"prefill q{Hq:3d} kv{Hk:2d} d{D:3d} new={n:5d} ctx={c_:6d} "
                            f"{s*1e6:10.1f} us {fl/s/1e12:6.1f} TFLOP/s ({used}, {c} q/K/V copies)")

    # ---- notes
    def finish_notes(self):
        t = self.torch
        try:
            import flash_attn  # noqa: F401, PLC0415
            fa = f"flash_attn {getattr(flash_attn, '__version__', '?')} is installed but not used (torch's own flash kernel timed)"
        except ImportError:
            fa = "flash_attn is not installed on this machine"
        n = self.notes
        n["timing"] = (
            "CUDA events; warm-up 2 calls; median of 5-15 repeats. mode 'graph': one CUDA graph holding "
            "one call on each of `copies` rotated buffer sets is replayed, seconds = replay time / "
            "copies (GPU time, launch overhead excluded, as a server replaying graphs for decode). "
            "mode 'eager': events around one Python call per repeat (buffers rotated), so the host's "
            "launch latency counts when the GPU waits for it. Every table: graph for every point, eager "
            "as well for a few points (grids.eager_*), so the difference is on record. Prefill attention "
            "is graph-timed too: eager, chunks under ~0.2 ms measured the host's launch path (+-50% "
            "between two H100 runs), not the kernel.")
        n["l2"] = (
            f"L2 ({self.l2 >> 20} MiB) is not flushed; instead each graph replays the op on rotated "
            f"buffers that together reach {ROTATE_L2_FACTOR}x L2 (GEMM weights; expert weights through "
            f"other random expert sets with the same row counts; decode K/V; prefill q/K/V), at most "
            f"{MAX_COPIES} copies and at most ~{int(MAX_GRAPH_S*1e3)} ms of work per replay (so "
            "compute-bound large-M points of small weights rotate less, and the tiniest decode points, "
            f"whose {MAX_COPIES} copies stay under 4x L2, are partly L2-resident); activations (GEMM "
            "input rows, decode queries) are shared by the copies: L2-warm, as after the kernel that "
            "produced them.")
        n["gemm_method"] = (
            "bf16: torch.nn.functional.linear(x [m, k], w [n, k]) (cuBLAS), bf16 out. fp8: "
            "torch._scaled_mm(x e4m3 [m, k] row-major, w e4m3 [n, k] viewed as [k, n] column-major, "
            "per-tensor float32 scales, out_dtype bf16). Activation quantisation to fp8 is not timed. "
            "Random normal data (weights x 0.02), never zeros.")
        n["grouped_gemm_rows"] = (
            "tokens: T tokens, each routed to top_k distinct experts drawn uniformly at random "
            "(rows fed to the GEMM = T x top_k, sorted by expert); experts_active: experts with >= 1 "
            "row; n, k: one expert's GEMM (gate_up: n = 2 x width / t, k = hidden; down: n = hidden, "
            "k = width / t); extra keys experts (E) and top_k. Routing, permutation and the "
            "activation between gate_up and down are not timed.")
        n["all_reduce"] = "not measured: needs several GPUs (one GPU here); a multi-GPU issue covers it"
        n["attention_fp8_kv"] = (
            "not measured: torch SDPA (flash / efficient / cuDNN) takes no FP8 K/V in this torch "
            f"({t.__version__}), and no FP8 attention kernel is installed ({fa}); only bf16 KV rows")
        n["attention_layout"] = ("contiguous K/V per sequence; a paged KV layout (block tables) is not "
                                 "timed: torch has no paged attention kernel and " + fa)
        n["attention_sliding_window"] = ("sliding-window layers (gpt-oss) are not timed separately: "
                                         "a window of w tokens costs what kv_tokens = w costs here")
        n["tp_heads"] = ("per TP degree t: q_heads / t query heads and max(kv_heads / t, 1) KV heads "
                         "(KV heads replicated once t exceeds them, as vLLM does), also in the QKV GEMM's n")
        n["mlp"] = "dense MLP (gate_up, down) skipped for MoE cards with num_dense_layers 0"
        n["decode_grid_caps"] = (f"decode points with batch x kv_tokens <= {DECODE_MAX_TOKENS} and K+V "
                                 f"bytes <= {DECODE_MAX_BYTES >> 30} GiB per layer only")
        n["grids"] = dict(m=self.g["m"], tokens=self.g["t"], decode_batch=self.g["batch"],
                          decode_kv_tokens=self.g["kv"], prefill_new_tokens=self.g["new"],
                          prefill_context_tokens=self.g["ctx"], eager_gemm_m=EAGER_M,
                          eager_grouped_tokens=EAGER_T, eager_decode=[list(p) for p in EAGER_DECODE],
                          eager_prefill=[list(p) for p in EAGER_PREFILL])
        n["checks"] = self.checks
        n["fp8"] = "measured" if self.fp8 else f"not measured: {self.fp8_why}"
        if self.fp8_padded:
            n["fp8_padded_m"] = self.fp8_padded
        if self.timer.graph_failures:
            n["graph_capture_failures"] = self.timer.graph_failures[:20]
        n["not_measured"] = list(self.not_measured)
        n["skipped"] = list(dict.fromkeys(self.plan.skipped))
        n["models"] = self.plan.models
        n["shapes_by_model"] = self.plan.by_model
        n["elapsed_s"] = round(time.time() - self.t0, 1)
        n["device"] = str(t.cuda.get_device_name(0)) if self.cuda else "cpu (smoke test)"

    def run(self):
        for name, fn in (("gemm", self.bench_gemm), ("grouped_gemm", self.bench_grouped),
                         ("attention", self.bench_attention)):
            t0 = time.time()
            fn()
            self.log(f"operators: {name} took {time.time() - t0:.1f} s")
        self.finish_notes()
        return self.out


def bench_operators(torch, models: list[ModelShapes], tps: list[int], device="cuda", quick=False,
                    budget_s=420.0, log=print, checkpoint=None) -> dict:
    """Time every planned operator and return the ``operators`` section (see README.md)."""
    plan = plan_operators(models, tps)
    est = estimate_seconds(plan, quick)
    log(f"operators: {len(plan.gemm)} GEMM shapes, {len(plan.grouped)} grouped shapes, "
        f"{len(plan.attention)} attention head configs; {est['points']} points, estimated "
        f"{est['total']:.0f} s (gemm {est['gemm']:.0f}, grouped {est['grouped']:.0f}, decode "
        f"{est['decode']:.0f}, prefill {est['prefill']:.0f})")
    return OperatorBench(torch, plan, device, quick, budget_s, log, checkpoint).run()
