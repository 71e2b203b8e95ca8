"""The plan of a per-operator timing run (:mod:`gpu_validation.operators`): the grids of token
counts, batch sizes and context lengths timed, the deduplicated GEMM, grouped-GEMM and attention
shapes the model cards imply for each tensor-parallel degree (:func:`plan_operators` ->
:class:`Plan`), and an estimate of the run's time (:func:`estimate_seconds`). Standard library
only, so a plan is checked on a machine without torch. Units: seconds, tokens, elements.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .model_cards import MLA_KEYS, MOE_KEYS, ModelShapes


M_GRID = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
T_GRID = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
DECODE_BATCH = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
DECODE_KV = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
PREFILL_NEW = [128, 256, 512, 1024, 2048, 4096, 8192]
PREFILL_CTX = [0, 1024, 4096, 16384, 32768]
QUICK = dict(m=[1, 64, 1024], t=[1, 64, 1024], batch=[1, 16], kv=[128, 1024], new=[128, 512],
             ctx=[0, 1024])
CPU = dict(m=[1, 16], t=[1, 16], batch=[1, 2], kv=[128], new=[128], ctx=[0, 128])  # --cpu-smoke
DECODE_MAX_TOKENS = 1 << 21      # batch x kv_tokens cap (KV of one layer; 8 GiB at 8 heads x 128)
DECODE_MAX_BYTES = 8 << 30       # K + V bytes of one decode point
EAGER_M = [1, 8, 64, 512, 4096]  # eager GEMM points (first card, first and last TP degree)
EAGER_T = [1, 64, 4096]
EAGER_DECODE = [(1, 1024), (64, 4096), (512, 1024)]
EAGER_PREFILL = [(128, 0), (512, 4096), (2048, 0), (8192, 32768)]  # (new, context)
ROTATE_L2_FACTOR = 4             # rotated buffers together >= 4 x L2
MAX_COPIES = 256
MAX_GRAPH_S = 0.02               # copies x estimated time per replay at most 20 ms


@dataclass
class Plan:
    """Deduplicated shapes to time, each with the (model, t, projection) uses that need it.

    ``gemm[(n, k)]``, ``grouped[(experts, top_k, n, k)]``, ``attention[(q_heads, kv_heads,
    head_dim)]`` -> list of use strings; ``by_model[name][f"tp{t}"]`` -> projection -> shape;
    ``skipped`` -> reasons for what a card implies but is not timed."""
    gemm: dict = field(default_factory=dict)
    grouped: dict = field(default_factory=dict)
    attention: dict = field(default_factory=dict)
    by_model: dict = field(default_factory=dict)
    skipped: list = field(default_factory=list)
    models: dict = field(default_factory=dict)
    eager_gemm: set = field(default_factory=set)      # (n, k) timed eagerly too
    eager_grouped: set = field(default_factory=set)   # grouped keys timed eagerly too
    eager_attention: set = field(default_factory=set)  # head configs timed eagerly too


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def plan_operators(models: list[ModelShapes], tps: list[int]) -> Plan:
    """Shapes per model and TP degree (see the module docstring), deduplicated across models.
    A TP degree that does not divide a model's q heads or widths is skipped (reason recorded)."""
    pl = Plan()
    for mi, m in enumerate(models):
        first = mi == 0  # the first card's shapes are also timed eagerly (first and last t)
        pl.models[m.name] = dict(card=m.path, moe=m.is_moe, attention=m.attention,
                                 sources=m.sources,
                                 **({k: getattr(m, k) for k in MOE_KEYS} if m.is_moe else {}),
                                 **({k: getattr(m, k) for k in MLA_KEYS + ("kv_lora_rank", "qk_rope_head_dim")}
                                    if m.attention == "mla" else {}))
        bym = pl.by_model.setdefault(m.name, {})
        for t in tps:
            if m.num_q_heads % t:
                pl.skipped.append(f"{m.name} tp{t}: {m.num_q_heads} query heads do not split {t} ways")
                continue
            q = m.num_q_heads // t
            kv = max(m.num_kv_heads // t, 1)
            if m.num_kv_heads > t and m.num_kv_heads % t:
                pl.skipped.append(f"{m.name} tp{t}: {m.num_kv_heads} KV heads do not split {t} ways")
                continue
            h, D = m.hidden_size, m.head_dim
            proj = {}
            if m.attention == "mla":
                qk = m.qk_nope_head_dim + m.qk_rope_head_dim
                if not (m.kv_lora_rank and qk and m.v_head_dim):
                    pl.skipped.append(f"{m.name}: MLA card lacks kv_lora_rank / qk_nope_head_dim / "
                                      f"v_head_dim: its attention projections are not timed")
                else:
                    if m.q_lora_rank:
                        proj["q_a"] = (m.q_lora_rank, h)
                        proj["q_b"] = (q * qk, m.q_lora_rank)
                    else:
                        proj["q"] = (q * qk, h)
                    proj["kv_a"] = (m.kv_lora_rank + m.qk_rope_head_dim, h)
                    proj["kv_b"] = (q * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank)
                    proj["o"] = (h, q * m.v_head_dim)
            else:
                proj["qkv"] = ((q + 2 * kv) * D, h)
                proj["o"] = (h, q * D)
                key = (q, kv, D)
                pl.attention.setdefault(key, []).append(f"{m.name} tp{t}")
                if first and t in (tps[0], tps[-1]):
                    pl.eager_attention.add(key)
            gate = 2 if m.mlp_gated else 1
            if not m.is_moe or m.num_dense_layers > 0:
                if m.intermediate_size % t:
                    pl.skipped.append(f"{m.name} tp{t}: intermediate {m.intermediate_size} does not split {t} ways")
                else:
                    it = m.intermediate_size // t
                    proj["gate_up"] = (gate * it, h)
                    proj["down"] = (h, it)
            if m.is_moe and m.num_shared_experts:
                w = m.num_shared_experts * m.moe_intermediate_size
                if w % t == 0:
                    proj["shared_gate_up"] = (gate * w // t, h)
                    proj["shared_down"] = (h, w // t)
            proj["lm_head"] = (ceil_div(m.vocab_size, t), h)
            bym[f"tp{t}"] = {k: dict(n=n, k=k_) for k, (n, k_) in proj.items()}
            for name, (n, k_) in proj.items():
                pl.gemm.setdefault((n, k_), []).append(f"{m.name} tp{t} {name}")
                if first and t in (tps[0], tps[-1]):
                    pl.eager_gemm.add((n, k_))
            if m.attention == "gqa":
                bym[f"tp{t}"]["attention"] = dict(q_heads=q, kv_heads=kv, head_dim=D)
            if m.is_moe:
                if m.moe_intermediate_size % t:
                    pl.skipped.append(f"{m.name} tp{t}: expert width {m.moe_intermediate_size} does not split {t} ways")
                    continue
                w = m.moe_intermediate_size // t
                E, k = m.num_experts, m.num_experts_per_tok
                ex = {"experts_gate_up": (E, k, gate * w, h), "experts_down": (E, k, h, w)}
                bym[f"tp{t}"].update({nm: dict(experts=E, top_k=k, n=n, k=k_)
                                      for nm, (E, k, n, k_) in ex.items()})
                first_moe = all(not pl.models[x]["moe"] for x in list(pl.models)[:-1])
                for nm, key in ex.items():
                    pl.grouped.setdefault(key, []).append(f"{m.name} tp{t} {nm}")
                    if first_moe and t == tps[0]:
                        pl.eager_grouped.add(key)
        if m.attention == "mla":
            pl.skipped.append(f"{m.name}: MLA attention (latent KV of kv_lora_rank + rope values, "
                              f"absorbed decode) not timed: torch SDPA has no MLA kernel and "
                              f"FlashMLA / FlashInfer are not on the device")
    return pl


def grids(quick, cpu: bool = False) -> dict:
    """The M / T / attention grids (full, the --quick subset, or the CPU smoke test's)."""
    if cpu:
        return dict(CPU)
    if quick:
        return dict(QUICK)
    return dict(m=M_GRID, t=T_GRID, batch=DECODE_BATCH, kv=DECODE_KV, new=PREFILL_NEW, ctx=PREFILL_CTX)


def decode_points(q, kv, D, g):
    """(batch, kv_tokens) decode points within the caps (batch x kv_tokens <= DECODE_MAX_TOKENS,
    K+V bytes <= DECODE_MAX_BYTES at bf16)."""
    return [(b, S) for b in g["batch"] for S in g["kv"]
            if b * S <= DECODE_MAX_TOKENS and 2 * b * S * kv * D * 2 <= DECODE_MAX_BYTES]


def estimate_seconds(pl: Plan, quick: bool = False, dtypes=("bf16", "fp8"), bf16_tflops=650.0,
                     fp8_tflops=1100.0, attn_tflops=350.0, hbm_Bps=2.8e12, per_point_s=0.004,
                     reps=12) -> dict:
    """Rough device seconds of :func:`bench_operators` for this plan (rates are leads for an
    H100; used to size grids, not reported as measurements)."""
    g = grids(quick)
    out = dict(gemm=0.0, grouped=0.0, decode=0.0, prefill=0.0, points=0)
    for (n, k) in pl.gemm:
        for dt in dtypes:
            rate, el = (bf16_tflops, 2) if dt == "bf16" else (fp8_tflops, 1)
            for m in g["m"]:
                t = max(2 * m * n * k / rate / 1e12, (n * k * el + m * k * el + m * n * 2) / hbm_Bps)
                out["gemm"] += per_point_s + reps * max(t, 1e-5) * (1 + 0.5 * ((n, k) in pl.eager_gemm))
                out["points"] += 1
    for (E, top, n, k) in pl.grouped:
        for dt in dtypes:
            rate, el = (bf16_tflops, 2) if dt == "bf16" else (fp8_tflops, 1)
            for T in g["t"]:
                act = min(E, T * top)
                t = max(2 * T * top * n * k / rate / 1e12, act * n * k * el / hbm_Bps)
                out["grouped"] += per_point_s + E * n * k * el / 1e12 + reps * max(t, 1e-5)
                out["points"] += 1
    for (q, kv, D) in pl.attention:
        for (b, S) in decode_points(q, kv, D, g):
            out["decode"] += per_point_s + reps * max(2 * b * S * kv * D * 2 / hbm_Bps, 5e-6)
            out["points"] += 1
        for n in g["new"]:
            for c in g["ctx"]:
                fl = 4 * n * (c + n / 2) * q * D
                out["prefill"] += per_point_s + 6 * fl / attn_tflops / 1e12
                out["points"] += 1
    out["total"] = out["gemm"] + out["grouped"] + out["decode"] + out["prefill"]
    return out
