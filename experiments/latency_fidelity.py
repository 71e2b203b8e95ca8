"""Latency fidelity: kvsim's TTFT and TPOT against published measurements of real serving runs.

The measurements (``experiments/data/latency/``, SOURCES.md there says where they come from):
InferenceMAX sweeps as BLIS vendors them, one point per (deployment, input/output lengths,
concurrency) with the measured TTFT and TPOT. Each point is replayed as the benchmark client
drove the server: a closed loop at fixed concurrency N (:func:`traces.generate_bench`),
``--prompts-per-client`` x N prompts (InferenceMAX sends 10 x N) whose input and output lengths
are uniform in ``[0.8 L, L]`` for the label's L (InferenceMAX's ``--random-range-ratio 0.8``
with its client's one-sided rule), on the deployment's model card, GPU card, tensor-parallel
size, weight and KV precision and scheduler limits.

The points split in two sets that never mix:

* ``tune``: vLLM on H100 and H200, the only points ``--fit`` may look at;
* ``held_out``: every other GPU (B200, B300) and engine (SGLang, TensorRT-LLM), reported only.

A point whose model has no card in ``experiments/conf/model`` is listed as skipped with the
reason. Errors are ``(simulated - measured) / measured``; the report gives per scenario and per
set the median absolute error of TTFT and TPOT, and the signed median (bias).

Run:
``python -m experiments.latency_fidelity [--cost operator,analytic] [--jobs 2] [--only tune]``
``python -m experiments.latency_fidelity --fit-decode`` (the decode step's settings fitted to
the ``tune`` set's TPOT through a steady-state model, :func:`steady_tpot`), then
``python -m experiments.latency_fidelity --fit --fit-params fp8_mfu,frontend_latency_s,prefill_overhead_s``
(a bounded Powell search, SciPy, of the operator
model's efficiencies and overheads on the ``tune`` set; prints the values for
``experiments/conf/cost/operator.yaml``).

Writes ``experiments/results/latency_fidelity.csv`` (one row per point and cost model) and
``latency_fidelity.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "experiments" / "data" / "latency"
RESULTS = ROOT / "experiments" / "results"
CARDS = ROOT / "experiments" / "conf" / "model"

#: scenario model name -> kvsim model card (experiments/conf/model/<card>.yaml)
MODEL_CARDS = {
    # (InferenceMAX served nvidia/Llama-3.3-70B-Instruct-FP8 under this label: SOURCES.md)
    "llama-3.1-70b-instruct": "llama3_3_70b",
    "llama-3.3-70b-instruct": "llama3_3_70b",
    "gpt-oss-120b": "gpt_oss_120b",
    "deepseek-v3": "deepseek_v3",
    "deepseek-r1": "deepseek_r1",
    "qwen3-235b-a22b": "qwen3_235b_a22b",
}
#: benchmark label -> (input tokens, output tokens)
LABEL_LENGTHS = {"1k1k": (1024, 1024), "1k8k": (1024, 8192), "8k1k": (8192, 1024)}


@dataclass(frozen=True)
class Point:
    """One measured point. Times in seconds; ``split``: ``tune`` or ``held_out``."""

    scenario: str
    model: str
    gpu: str
    precision: str
    framework: str
    tp: int
    label: str
    concurrency: int
    ttft_s: float
    tpot_s: float
    split: str
    expert_parallel: bool = False
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    kv_cache_dtype: str = "auto"


def load_points(data_dir: Path = DATA) -> tuple[list[Point], list[dict]]:
    """The measured points of ``inferencex_absolutes.json`` with their deployments from
    ``inferencex_scenarios.json``, and the anchors left out as ``{"scenario", "label",
    "reason"}`` (no model or GPU card, data-parallel attention). Raises ValueError naming the
    file and the entry for a malformed entry."""
    path = data_dir / "inferencex_absolutes.json"
    raw = json.loads(path.read_text())
    scen_path = data_dir / "inferencex_scenarios.json"
    scen = json.loads(scen_path.read_text())
    points, skipped = [], []
    for i, a in enumerate(raw.get("anchors", [])):
        name = str(a.get("scenario", ""))
        s = scen.get(name)
        if s is None:
            raise ValueError(f"{path}: anchors[{i}].scenario={name!r} is not in {scen_path}")
        label = str(a.get("label"))
        if label not in LABEL_LENGTHS:
            raise ValueError(f"{path}: anchors[{i}].label={label!r}; expected one of "
                             f"{sorted(LABEL_LENGTHS)}")
        card = MODEL_CARDS.get(s["model"])
        why = None
        if card is None or not (CARDS / f"{card}.yaml").exists():
            why = f"no model card for {s['model']}"
        elif s["gpu"] not in ("h100", "h200", "b200", "b300"):
            why = f"no GPU card for {s['gpu']}"
        elif int(s.get("dp") or 1) > 1 or int(s.get("pp") or 1) > 1:
            why = "data or pipeline parallelism (not modelled)"
        if why:
            skipped.append({"scenario": name, "label": label, "reason": why})
            continue
        tp = int(s["tp"])
        topo = s.get("topology_comment") or {}
        ep = bool(s.get("enable_expert_parallel")) or int(topo.get("moe_ep_size") or 1) > 1
        split = "tune" if s["framework"] == "vllm" and s["gpu"] in ("h100", "h200") else "held_out"
        ttft = a.get("absolute_ttft_us", {})
        tpot = a.get("absolute_tpot_us", {})
        for conc in sorted(set(ttft) & set(tpot), key=int):
            points.append(Point(
                scenario=name.removesuffix(".yaml"), model=card, gpu=s["gpu"],
                precision=s["precision"], framework=s["framework"], tp=tp, label=label,
                concurrency=int(conc), ttft_s=float(ttft[conc]) * 1e-6,
                tpot_s=float(tpot[conc]) * 1e-6, split=split, expert_parallel=ep,
                max_num_batched_tokens=int(s.get("max_num_batched_tokens") or 8192),
                max_num_seqs=int(s.get("max_num_seqs") or 256),
                kv_cache_dtype="fp8" if str(s.get("cache_dtype") or "").startswith("fp8") else "auto"))
    return points, skipped


def _weight_quant(p: Point) -> str | None:
    """The ``model.weight_quant`` override of a point (None: the card's own)."""
    if p.precision == "fp8":
        return "fp8"
    if p.precision == "fp4":
        return "mxfp4" if p.model == "gpt_oss_120b" else "nvfp4"
    return "none"


def point_overrides(p: Point, cost: str, extra: dict | None = None) -> list[str]:
    """The kvsim config overrides that replay point ``p`` with cost model ``cost`` and the
    ``cost.<key>`` settings in ``extra``. The server as InferenceMAX ran it: vLLM with
    ``--max-num-seqs`` equal to the concurrency, prefix caching off, the deployment's token
    budget (SOURCES.md beside the data)."""
    isl, osl = LABEL_LENGTHS[p.label]
    ov = ["cluster.replicas=1", f"model={p.model}", f"gpu={p.gpu}", f"cost={cost}",
          f"cost.tensor_parallel_size={p.tp}",
          f"scheduler.max_num_batched_tokens={p.max_num_batched_tokens}",
          f"scheduler.max_num_seqs={p.concurrency}",
          "cache.enable_prefix_caching=false",
          f"cache.kv_cache_dtype={p.kv_cache_dtype}",
          "output.print_summary=false", "output.write_steps=false", "sim.progress=false"]
    q = _weight_quant(p)
    if q is not None:
        ov.append(f"model.weight_quant={q}")
    if cost == "operator" and p.expert_parallel:
        ov.append("cost.expert_parallel=true")
    for k, v in (extra or {}).items():
        ov.append(f"cost.{k}={v}")
    return ov


def simulate_point(p: Point, cost: str, extra: dict | None, prompts_per_client: int,
                   range_ratio: float, seed: int = 0) -> dict:
    """Replay one point; returns ``{"sim_ttft_s", "sim_tpot_s", "error"}`` (means over the
    finished requests; ``error`` is the message of a config the model cannot run)."""
    from sim.errors import ConfigError
    from sim.run import run_simulation
    from traces import generate_bench

    isl, osl = LABEL_LENGTHS[p.label]
    try:
        cfg = _config(p, cost, extra)
        wl = generate_bench(num_prompts=prompts_per_client * p.concurrency, input_len=isl,
                            output_len=osl, range_ratio=range_ratio, range_rule="one_sided",
                            max_concurrency=p.concurrency, seed=seed)
        s = run_simulation(cfg, out_dir=None, workload=wl, progress_bar=False)
    except ConfigError as e:
        return {"sim_ttft_s": math.nan, "sim_tpot_s": math.nan, "error": str(e)}
    return {"sim_ttft_s": s["ttft_s"]["mean"], "sim_tpot_s": s["tpot_s"]["mean"], "error": ""}


_CONFIGS: dict = {}  # composed configs of this process, by their overrides


def _config(p: Point, cost: str, extra: dict | None):
    """The composed config of :func:`point_overrides` (Hydra composes each distinct deployment
    once per process; the concurrency and the ``cost.<key>`` settings are then set on a copy)."""
    import copy

    from sim.run import compose_config

    base = tuple(o for o in point_overrides(p, cost) if not o.startswith("scheduler.max_num_seqs="))
    if base not in _CONFIGS:
        _CONFIGS[base] = compose_config(list(base))
    cfg = copy.deepcopy(_CONFIGS[base])
    cfg.scheduler.max_num_seqs = p.concurrency
    for k, v in (extra or {}).items():
        cfg.cost[k] = v
    return cfg


_POOL: dict = {}  # jobs -> the process pool replays run in (kept for the fit's many replays)


def _run_one(args):
    p, cost, extra, ppc, rr = args
    t0 = time.perf_counter()
    r = simulate_point(p, cost, extra, ppc, rr)
    r["wall_s"] = time.perf_counter() - t0
    return r


def run_points(points: list[Point], cost: str, extra: dict | None = None, *, jobs: int = 2,
               prompts_per_client: int = 10, range_ratio: float = 0.8) -> pd.DataFrame:
    """Replay ``points`` (in parallel over ``jobs`` processes); one row per point with the
    measured and simulated times and the errors."""
    tasks = [(p, cost, extra, prompts_per_client, range_ratio) for p in points]
    if jobs > 1:
        if jobs not in _POOL:
            _POOL[jobs] = ProcessPoolExecutor(max_workers=jobs)
        res = list(_POOL[jobs].map(_run_one, tasks, chunksize=1))
    else:
        res = [_run_one(t) for t in tasks]
    df = pd.DataFrame([{**asdict(p), **r, "cost": cost} for p, r in zip(points, res)])
    df["ttft_err"] = (df["sim_ttft_s"] - df["ttft_s"]) / df["ttft_s"]
    df["tpot_err"] = (df["sim_tpot_s"] - df["tpot_s"]) / df["tpot_s"]
    return df


def summarize_errors(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Median |error| and median signed error of TTFT and TPOT per group of ``by``, with the
    number of points (NaN errors, from configs the model cannot run, are left out and
    counted in ``failed``)."""
    rows = []
    for key, g in df.groupby(by, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        ok = g.dropna(subset=["ttft_err", "tpot_err"])
        rows.append({**dict(zip(by, key)), "points": len(ok), "failed": len(g) - len(ok),
                     "ttft_mae": float(ok["ttft_err"].abs().median()) if len(ok) else math.nan,
                     "ttft_bias": float(ok["ttft_err"].median()) if len(ok) else math.nan,
                     "tpot_mae": float(ok["tpot_err"].abs().median()) if len(ok) else math.nan,
                     "tpot_bias": float(ok["tpot_err"].median()) if len(ok) else math.nan})
    return pd.DataFrame(rows)


BLIS_MODELS = {"codellama/CodeLlama-34b-Instruct-hf": "codellama_34b",
               "meta-llama/Llama-2-7b-hf": "llama2_7b"}


def blis_workload(run: dict, block_tokens: int = 16):
    """One BLIS ground-truth run as an open-loop workload: every request of the run at its
    recorded start (client start where the client's records exist, else the server span's),
    with its recorded prompt and output tokens. GuideLLM's shared prefix
    (``workload.profile.data.prefix_tokens``) gets the same prefix ids in every prompt, the
    rest of each prompt ids of its own, so the prefix cache hits exactly the shared part.
    Returns ``(Workload, rows)`` with ``rows`` the per-request records in workload order."""
    from traces.workload import Workload, build_table

    cols = run["requests"]["columns"]
    rows = [dict(zip(cols, r)) for r in run["requests"]["rows"]]
    rows = [r for r in rows if r.get("status", "successful") == "successful"]
    if "client_start_unix_s" in cols:
        start = np.array([r["client_start_unix_s"] for r in rows], np.float64)
    else:
        start = np.array([r["span_start_unix_ns"] for r in rows], np.float64) * 1e-9
    order = np.argsort(start, kind="stable")
    rows = [rows[i] for i in order]
    start = start[order] - start[order][0]
    n = len(rows)
    inp = np.array([r["prompt_tokens"] for r in rows], np.int64)
    out = np.array([max(1, r["output_tokens"]) for r in rows], np.int64)
    shared = int((run.get("workload", {}).get("profile", {}).get("data", {}) or {})
                 .get("prefix_tokens", 0)) // block_tokens
    offs, vals = [0], []
    for i in range(n):
        full = int(inp[i]) // block_tokens
        k = min(shared, full)
        vals.extend(range(k))
        vals.extend(range(1_000_000 * (i + 1) + k, 1_000_000 * (i + 1) + full))
        offs.append(len(vals))
    ids = np.arange(n)
    table = build_table(session_id=ids, turn=np.zeros(n), arrival_s=start, think_s=np.zeros(n),
                        parent_request_id=np.full(n, -1), input_tokens=inp, output_tokens=out,
                        prefix_offsets=np.array(offs, np.int64),
                        prefix_values=np.array(vals, np.int64), block_tokens=block_tokens)
    return Workload(table=table, name="blis", source="experiments/data/latency/blis_vllm_runs.json",
                    prefix_block_tokens=block_tokens, closed_loop=False), rows


def simulate_blis_run(name: str, run: dict, cost: str, extra: dict | None = None) -> pd.DataFrame:
    """Replay one BLIS run on an H100 (BLIS's evaluator names it) with the run's engine
    arguments (max_num_batched_tokens, max_num_seqs, max_model_len) and vLLM's logged pool
    size; one row per compared group (each GuideLLM benchmark with client records, else all
    requests with the server's): measured and simulated mean TTFT, ITL (TPOT) and E2E (s)."""
    from sim.run import compose_config, run_simulation

    card = BLIS_MODELS[run["model"]]
    ec = run["exp_config"]
    v = run["vllm"]
    ov = ["cluster.replicas=1", f"model={card}", "gpu=h100", f"cost={cost}", "sim.progress=false",
          "output.print_summary=false", f"model.max_model_len={ec['max_model_len']}",
          f"scheduler.max_num_batched_tokens={ec['max_num_batched_tokens']}",
          f"scheduler.max_num_seqs={ec['max_num_seqs']}",
          f"cache.num_gpu_blocks={v['num_gpu_blocks']}"]
    if "float16" in str(v.get("dtype")) and "bfloat16" not in str(v.get("dtype")):
        ov.append("model.dtype=fp16")
    ov += [f"cost.{k}={val}" for k, val in (extra or {}).items()]
    wl, rows = blis_workload(run)
    if "client_ttft_ms" not in rows[0]:
        # vLLM's own spans start when the engine has the request: no API-server latency
        ov.append("cost.frontend_latency_s=0")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        run_simulation(compose_config(ov), out_dir=tmp, workload=wl, progress_bar=False)
        req = pd.read_parquet(Path(tmp) / "requests.parquet").sort_values("request_id")
    req = req.reset_index(drop=True)
    client = "client_ttft_ms" in rows[0]
    req["group"] = [f"benchmark {r['benchmark_index']}" if client else "all" for r in rows]
    if client:
        req["m_ttft"] = [r["client_ttft_ms"] / 1e3 for r in rows]
        req["m_itl"] = [r["client_itl_ms"] / 1e3 if r["client_itl_ms"] is not None else np.nan
                        for r in rows]
        req["m_e2e"] = [r["client_e2e_s"] for r in rows]
    else:
        req["m_ttft"] = [r["server_ttft_s"] for r in rows]
        req["m_itl"] = [r["server_decode_s"] / (r["output_tokens"] - 1)
                        if r["output_tokens"] > 1 else np.nan for r in rows]
        req["m_e2e"] = [r["server_e2e_s"] for r in rows]
    out = []
    groups = list(req.groupby("group", sort=False))
    if len(groups) > 1:  # (and the whole run: every request of every benchmark)
        groups.append(("all", req))
    for g, d in groups:
        out.append({"run": name, "model": card, "group": g, "side": "client" if client else "server",
                    "requests": len(d), "cost": cost,
                    "ttft_s": d["m_ttft"].mean(), "sim_ttft_s": d["ttft_s"].mean(),
                    "itl_s": d["m_itl"].mean(), "sim_itl_s": d["tpot_s"].mean(),
                    "e2e_s": d["m_e2e"].mean(), "sim_e2e_s": d["e2e_s"].mean()})
    df = pd.DataFrame(out)
    for k in ("ttft", "itl", "e2e"):
        df[f"{k}_err"] = (df[f"sim_{k}_s"] - df[f"{k}_s"]) / df[f"{k}_s"]
    return df


def blis_replay(cost: str, extra: dict | None = None, data_dir: Path = DATA) -> pd.DataFrame:
    """:func:`simulate_blis_run` for every run of ``blis_vllm_runs.json`` with request rows."""
    runs = json.loads((data_dir / "blis_vllm_runs.json").read_text())["runs"]
    return pd.concat([simulate_blis_run(k, r, cost, extra) for k, r in runs.items()
                      if r.get("requests", {}).get("rows")], ignore_index=True)


#: the concurrencies of the tune set the fit replays by default (the others are tune points the
#: fit never saw; the report gives their error apart)
FIT_CONCURRENCY = (4, 16, 64)

#: the operator model's fitted settings and the bounds of the search (cost.<name>), in the order
#: the search visits them (``attention_efficiency`` stays at its preset: prefill attention is a
#: small share of these 1k-8k prompts and would be fitted on noise)
FIT_PARAMS = {
    "layer_overhead_s": (0.0, 1.5e-4), "mbu": (0.3, 1.0), "fp8_mfu": (0.2, 1.0),
    "frontend_latency_s": (0.0, 0.1), "seq_overhead_s": (0.0, 2e-4),
    "step_overhead_s": (0.0, 0.01), "expert_mfu": (0.05, 1.0), "attention_mbu": (0.2, 1.0),
    "prefill_overhead_s": (0.0, 0.05), "comm_efficiency": (0.1, 1.0),
}


def _objective(df: pd.DataFrame) -> float:
    """Median over points of |log(sim / measured)|, TTFT and TPOT weighted equally (a point
    the model cannot run counts as a factor e)."""
    lt = np.log(df["sim_ttft_s"] / df["ttft_s"]).abs().fillna(1.0)
    lp = np.log(df["sim_tpot_s"] / df["tpot_s"]).abs().fillna(1.0)
    return float(np.median(lt) + np.median(lp))


def fit(points: list[Point], start: dict, *, jobs: int, prompts_per_client: int,
        range_ratio: float, max_evals: int = 80, params: list[str] | None = None,
        log=print) -> dict:
    """Fit :data:`FIT_PARAMS` (or the ``params`` of them) on ``points`` (the ``tune`` set only) by minimising
    :func:`_objective` with SciPy's bounded Powell search, each parameter scaled to its bounds;
    at most ``max_evals`` replays of the points. Returns the best settings found."""
    from scipy.optimize import minimize

    assert all(p.split == "tune" for p in points), "fit sees the tune set only"
    names = list(params or FIT_PARAMS)
    lo = np.array([FIT_PARAMS[n][0] for n in names])
    hi = np.array([FIT_PARAMS[n][1] for n in names])
    seen: dict = {}

    def settings(x):
        return {**start, **{n: float(v) for n, v in zip(names, lo + np.clip(x, 0, 1) * (hi - lo))}}

    def f(x):
        key = tuple(np.round(x, 6))
        if key not in seen:
            st = settings(x)
            seen[key] = (_objective(run_points(points, "operator", st, jobs=jobs,
                                               prompts_per_client=prompts_per_client,
                                               range_ratio=range_ratio)), st)
            log(f"  eval {len(seen)}: objective {seen[key][0]:.4f} "
                + " ".join(f"{n}={v:.4g}" for n, v in st.items()))
        return seen[key][0]

    x0 = (np.array([start[n] for n in names]) - lo) / (hi - lo)
    minimize(f, np.clip(x0, 0, 1), method="Powell", bounds=[(0, 1)] * len(names),
             options={"maxfev": max_evals, "xtol": 1e-3, "ftol": 1e-4})
    best_obj, best = min(seen.values(), key=lambda v: v[0])
    log(f"fit: objective {best_obj:.4f} after {len(seen)} replays")
    return best


#: the settings :func:`fit_decode` fits (the decode step's), in FIT_PARAMS' bounds
DECODE_PARAMS = ("layer_overhead_s", "mbu", "fp8_mfu", "seq_overhead_s", "step_overhead_s",
                 "expert_mfu", "attention_mbu", "prefill_overhead_s", "comm_efficiency")


def steady_tpot(m, p: Point) -> float:
    """A steady-state TPOT (s) of point ``p`` under cost model ``m``, without the simulator:
    the decode step of ``N`` sequences at the mean context (input + half the output, lengths at
    0.9 L as the client draws them), plus the ``N / output`` prefills of the requests that
    replace finishing ones, each adding its mixed step's extra time (one chunk per
    ``max_num_batched_tokens``)."""
    isl, osl = LABEL_LENGTHS[p.label]
    inp, out, n = 0.9 * isl, 0.9 * osl, p.concurrency
    ctx = np.full(n, int(inp + out / 2), dtype=np.int64)
    dec = m.step_time(np.ones(n, dtype=np.int64), ctx, n)
    chunk = int(min(inp, p.max_num_batched_tokens))
    mixed = m.step_time(np.concatenate([[chunk], np.ones(n - 1, dtype=np.int64)]),
                        np.concatenate([[0], ctx[1:]]), n)
    return dec + n / out * (mixed - dec) * math.ceil(inp / p.max_num_batched_tokens)


def fit_decode(points: list[Point], start: dict, log=print) -> dict:
    """Fit :data:`DECODE_PARAMS` to the measured TPOT of ``points`` (the ``tune`` set only)
    through :func:`steady_tpot` (no simulation: seconds, not hours): SciPy's Nelder-Mead on the
    median |log(model / measured)|, within :data:`FIT_PARAMS`' bounds. Returns the settings."""
    import copy

    from scipy.optimize import minimize

    from sim.cost_models import build_cost_model

    assert all(p.split == "tune" for p in points), "fit sees the tune set only"
    base = [(_config(p, "operator", None), p) for p in points]
    meas = np.array([p.tpot_s for p in points])
    lo = np.array([FIT_PARAMS[n][0] for n in DECODE_PARAMS])
    hi = np.array([FIT_PARAMS[n][1] for n in DECODE_PARAMS])

    def obj(x):
        if np.any(x < lo) or np.any(x > hi):
            return 10.0
        pred = []
        models = {}
        for c, p in base:
            key = id(c)
            if key not in models:
                cc = copy.deepcopy(c)
                for n, v in zip(DECODE_PARAMS, x):
                    cc.cost[n] = float(v)
                models[key] = build_cost_model(cc.model, cc.gpu, cc.cache, cc.cost)
            pred.append(steady_tpot(models[key], p))
        return float(np.median(np.abs(np.log(np.array(pred) / meas))))

    x0 = np.array([start[n] for n in DECODE_PARAMS])
    r = minimize(obj, x0, method="Nelder-Mead", options={"maxfev": 600, "xatol": 1e-7, "fatol": 1e-5})
    log(f"fit_decode: median |log TPOT error| {obj(x0):.4f} -> {r.fun:.4f}")
    return {**start, **{n: float(v) for n, v in zip(DECODE_PARAMS, r.x)}}


def _fmt_pct(x: float) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:+.1f}%"


def report(df: pd.DataFrame, skipped: list[dict], header: list[str]) -> str:
    """The markdown report of a replay (overall and per-scenario tables)."""
    from experiments._report import md_table

    md = list(header)
    fmt = {c: "{:.1%}" for c in ("ttft_mae", "tpot_mae")}
    fmt.update({c: "{:+.1%}" for c in ("ttft_bias", "tpot_bias")})
    md.append("\n## Overall (median |error|, median signed error)\n")
    md.append(md_table(summarize_errors(df, ["cost", "split"]),
                       ["cost", "split", "points", "failed", "ttft_mae", "ttft_bias", "tpot_mae",
                        "tpot_bias"], fmt))
    tune = df[df["split"] == "tune"]
    if len(tune):
        seen = tune["concurrency"].isin(FIT_CONCURRENCY)
        part = pd.concat([tune[seen].assign(split="tune: concurrency the fit replayed"),
                          tune[~seen].assign(split="tune: concurrency the fit never saw")])
        md.append(md_table(summarize_errors(part, ["cost", "split"]),
                           ["cost", "split", "points", "failed", "ttft_mae", "ttft_bias", "tpot_mae",
                            "tpot_bias"], fmt))
    md.append("\n## By GPU and engine\n")
    md.append(md_table(summarize_errors(df, ["cost", "split", "gpu", "framework"]),
                       ["cost", "split", "gpu", "framework", "points", "ttft_mae", "ttft_bias",
                        "tpot_mae", "tpot_bias"], fmt))
    md.append("\n## By scenario and lengths\n")
    md.append(md_table(summarize_errors(df, ["cost", "split", "scenario", "label"]),
                       ["cost", "split", "scenario", "label", "points", "failed", "ttft_mae",
                        "ttft_bias", "tpot_mae", "tpot_bias"], fmt))
    if skipped:
        md.append("\n## Skipped\n")
        sk = pd.DataFrame(skipped).groupby("reason").size().reset_index(name="anchors")
        md.append(md_table(sk, ["reason", "anchors"]))
    return "\n".join(md)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.latency_fidelity",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--cost", default="operator,analytic",
                    help="cost presets to replay, comma-separated (default: operator,analytic)")
    ap.add_argument("--only", choices=("tune", "held_out"), default=None,
                    help="replay one set only")
    ap.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)))
    ap.add_argument("--prompts-per-client", type=int, default=10,
                    help="prompts per unit of concurrency (default 10, as InferenceMAX sends; "
                         "fewer weigh the first wave, all N sent at once, more in the mean TTFT, "
                         "so the errors are not those of the published runs)")
    ap.add_argument("--range-ratio", type=float, default=0.8,
                    help="input/output lengths drawn uniformly in [ratio x L, L], as InferenceMAX's "
                         "client does (default 0.8, its setting)")
    ap.add_argument("--fit", action="store_true",
                    help="fit the operator model on the tune set and print the settings")
    ap.add_argument("--fit-decode", action="store_true",
                    help="fit the decode settings (DECODE_PARAMS) to the tune set's TPOT through a "
                         "steady-state model, no simulation, and print the settings")
    ap.add_argument("--fit-prompts-per-client", type=int, default=10)
    ap.add_argument("--fit-evals", type=int, default=80, help="replays of the tune set the fit may make")
    ap.add_argument("--fit-params", default="",
                    help="fit only these settings (comma-separated; default: all of FIT_PARAMS), "
                         "the others at the preset's values")
    ap.add_argument("--fit-concurrency", default=",".join(map(str, FIT_CONCURRENCY)),
                    help="the tune set's concurrencies the fit replays (comma-separated; '' = all)")
    ap.add_argument("--out", default=str(RESULTS), help="results folder")
    a = ap.parse_args(argv)
    points, skipped = load_points()
    if a.fit or a.fit_decode:
        from omegaconf import OmegaConf

        from sim.config import CostConfig

        preset = OmegaConf.load(ROOT / "experiments" / "conf" / "cost" / "operator.yaml")
        start = {k: float(preset.get(k, getattr(CostConfig, k))) for k in FIT_PARAMS}
        params = a.fit_params.split(",") if a.fit_params else None
        unknown = sorted(set(params or []) - set(FIT_PARAMS))
        if unknown:
            ap.error(f"--fit-params: {unknown} are not fitted settings; expected some of {list(FIT_PARAMS)}")
        keep = {int(c) for c in a.fit_concurrency.split(",")} if a.fit_concurrency else None
        tune = [p for p in points if p.split == "tune" and (keep is None or p.concurrency in keep)]
        if a.fit_decode:
            print(json.dumps(fit_decode([p for p in points if p.split == "tune"], start), indent=1))
            return 0
        best = fit(tune, start, jobs=a.jobs, prompts_per_client=a.fit_prompts_per_client,
                   range_ratio=a.range_ratio, max_evals=a.fit_evals, params=params)
        print(json.dumps(best, indent=1))
        return 0
    if a.only:
        points = [p for p in points if p.split == a.only]
    frames = []
    t0 = time.perf_counter()
    for cost in a.cost.split(","):
        frames.append(run_points(points, cost.strip(), jobs=a.jobs,
                                 prompts_per_client=a.prompts_per_client, range_ratio=a.range_ratio))
    df = pd.concat(frames, ignore_index=True)
    blis = pd.concat([blis_replay(c.strip()) for c in a.cost.split(",")], ignore_index=True) \
        if not a.only or a.only == "held_out" else None
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "latency_fidelity.csv", index=False)
    if blis is not None:
        blis.to_csv(out / "latency_fidelity_blis.csv", index=False)
    header = ["# Latency fidelity: kvsim vs published serving measurements\n",
              f"Command: `python -m experiments.latency_fidelity {' '.join(argv or sys.argv[1:])}`"
              f" ({len(points)} points, {len(skipped)} anchors skipped, "
              f"{time.perf_counter() - t0:.0f} s). Errors are (simulated - measured) / measured "
              f"of the mean TTFT and mean TPOT; `tune` = vLLM on H100/H200 (the only points the "
              f"operator model's settings were fitted on), `held_out` = everything else."]
    if a.prompts_per_client != 10:
        header.append(f"\n**{a.prompts_per_client} prompts per unit of concurrency, not the 10 "
                      f"InferenceMAX sent**: the first wave (all N requests at once) weighs "
                      f"{10 / a.prompts_per_client:.1f}x as much in the mean TTFT as in the "
                      f"published runs; these TTFT errors are not comparable with theirs.")
    text = report(df, skipped, header)
    if blis is not None:
        from experiments._report import md_table

        text += ("\n\n## BLIS's vLLM runs (H100, BF16/FP16, TP1; held out)\n\nMeans over the "
                 "requests of each GuideLLM benchmark (client-side), or of the whole run where "
                 "only vLLM's server-side spans survive.\n\n")
        text += md_table(blis, ["cost", "run", "group", "side", "requests", "ttft_err", "itl_err",
                                "e2e_err"], {k: "{:+.1%}" for k in ("ttft_err", "itl_err", "e2e_err")})
        agg = blis.groupby("cost")[["ttft_err", "itl_err", "e2e_err"]].agg(lambda x: x.abs().median())
        text += "\nMedian |error| over the groups: " + "; ".join(
            f"{c}: TTFT {r.ttft_err:.1%}, ITL {r.itl_err:.1%}, E2E {r.e2e_err:.1%}"
            for c, r in agg.iterrows()) + "\n"
    (out / "latency_fidelity.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
