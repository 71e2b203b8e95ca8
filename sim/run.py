"""Run one simulation from a resolved config and write its results.

``run_simulation(cfg, out_dir)`` is what the ``kvsim`` command calls; tests call it directly.

Results directory (atomic: an ``INCOMPLETE`` marker exists while the run is in progress; tables
are written to temporary names and renamed; ``summary.json`` is written last, with
``"complete": true``. A crash or Ctrl-C leaves the marker and no summary.json):

* ``requests.parquet``, ``steps.parquet`` — see :mod:`sim.metrics`
* ``summary.json`` — see :func:`sim.metrics.summarize`; wall-clock fields live under ``wall``.
* the resolved config (``.hydra/config.yaml`` when run through Hydra; ``config.yaml`` otherwise).
"""

from __future__ import annotations

import json
import math
import os
import resource
import time
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from traces import load_workload

from .compression import ROUND_COLUMNS, Compression
from .config import CONF_DIR
from .cost_models import build_cost_model
from .engine import Simulator
from .errors import Busy, ConfigError, OutputDirBusy
from .folders import (MARKER, RUN_LOCK, altered_results, blocked_folder, file_digest,  # noqa: F401
                      is_complete)
from .hardware import kv_bytes_per_block, kv_bytes_per_token, plan_memory
from .metrics import TRANSFER_COLUMNS, Recorder, summarize



def hold_output_dir(out: Path, name: str | None = None):
    """Claim the results folder ``out`` for this run (created if missing): take the exclusive
    lock of its ``RUN_LOCK`` file (:func:`sim.locks.hold`, an ``flock`` the operating system
    lets go of when this process ends in any way, a SIGKILL included), and return the
    :class:`sim.locks.Held` lock; the caller releases it when the run ends. A lock file left
    by an ended process holds no lock and is taken over.

    Raises OutputDirBusy (a ConfigError) when another process holds the folder (on this host
    or, on a shared filesystem, another), so that two runs never write one folder's tables at
    once; OSError when the lock file cannot be created (a read-only or full filesystem).
    ``name``: how the error names the folder (default ``output.dir=<out>``)."""
    from .locks import hold

    out.mkdir(parents=True, exist_ok=True)
    try:
        return hold(out / RUN_LOCK)
    except Busy as e:
        raise OutputDirBusy(
            f"{name or f'output.dir={out}'}: another kvsim run ({e.holder}) is writing its "
            f"results there; expected a folder no other run is using (wait for it, or pick "
            f"another output.dir)") from None


def validate_config(cfg) -> None:
    """Check a config before anything runs; raise ConfigError naming the field.

    Delegates to :func:`sim.validation.validate_config` (every pre-simulation check: scheduler,
    model and GPU cards, cache, cost, trace options, tiers, codec, policy/compaction, the memory
    plan) and :func:`sim.cluster.validate_cluster` (replicas, router, store, P/D).
    """
    from .cluster import validate_cluster
    from .validation import validate_config as _validate

    _validate(cfg)
    validate_cluster(cfg.cluster)


def _write_parquet(df, path: Path) -> None:
    """Write ``df`` to ``path`` through ``path.tmp`` (renamed when whole; removed when the write
    stops: an error, Ctrl-C or SIGTERM leaves no half-written file)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        df.to_parquet(tmp, index=False)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # (pyarrow's errors name no file)
            e.filename = str(path)
        raise
    os.replace(tmp, path)


def _write_json(obj, path: Path) -> None:
    """Write ``obj`` as JSON to ``path`` through ``path.tmp``, as :func:`_write_parquet`."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=2, sort_keys=True, allow_nan=False, default=_json_default)
            f.write("\n")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def _json_default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def _clean_nan(x):
    if isinstance(x, float) and x != x:
        return None
    if isinstance(x, dict):
        return {k: _clean_nan(v) for k, v in x.items()}
    return x




def input_files(cfg) -> dict:
    """The files besides the trace that a run of ``cfg`` reads, each as
    :func:`traces.cache.file_fingerprint` (``[name, bytes, xxh3-128]``, None when the file is
    not there), by the field that names it: ``cost.file`` (the calibration, with
    ``cost.kind=calibrated``; :func:`sim.cost.resolve_calibration_path`, its default included)
    and ``policy.importance_file`` (with ``policy.importance_source=recorded``). Recorded in
    ``summary.json`` (``input_files``), so that ``output.skip_completed`` reruns a run whose
    calibration or recorded scores changed. Raises OSError when a file cannot be read."""
    from traces.cache import file_fingerprint

    from .cost import resolve_calibration_path

    out = {}
    if str(cfg.cost.kind) == "calibrated":
        try:
            out["cost.file"] = file_fingerprint(resolve_calibration_path(cfg.cost, cfg.gpu))
        except ConfigError:  # (not there: the cost model's own error, or its fallback note)
            out["cost.file"] = None
    if str(cfg.policy.get("importance_source", "")) == "recorded" and cfg.policy.importance_file:
        p = Path(str(cfg.policy.importance_file))
        out["policy.importance_file"] = file_fingerprint(p) if p.is_file() else None
    return out


def transfers_frame(tm) -> pd.DataFrame:
    """The transfers table (one row per batched copy; empty with no tier)."""
    if tm is not None:
        return tm.records.frame()
    df = pd.DataFrame.from_records([], columns=TRANSFER_COLUMNS)
    return df.astype({"time_s": "float64", "direction": "string", "tier": "string",
                      "pages": "int64", "bytes": "int64", "duration_s": "float64",
                      "queue_s": "float64", "codec": "string"})


def _write_ops(cfg, comp, tm, path: Path) -> dict:
    """Write the run's compaction rounds and tier transfers as a gpu_validation ops file
    (schema: gpu_validation/README.md), at most ``output.ops_limit`` of each kind. Returns the
    counts for ``summary.json``: rounds and transfers written, those past the limit, the
    rounds no ops line can hold (several selection groups, hole filling), and the disk copies
    (``ops_transfers_left_out``: ``host_to_disk`` and ``disk_to_host`` batches; the GPU replay
    times GPU-host copies only, a disk copy involves no GPU)."""
    m = cfg.model
    lines = [{"op": "model", "num_layers": int(m.num_layers), "num_kv_heads": int(m.num_kv_heads),
              "head_dim": int(m.head_dim), "dtype": str(m.dtype)}]
    lines += comp.ops or []
    n_tr = tr_over = 0  # host copies written, past the limit
    disk = {"host_to_disk": 0, "disk_to_host": 0}  # copies no ops line holds (no GPU op)
    if tm is not None:
        codec = {"identity": "none"}.get(tm.codec, tm.codec)
        for (t, direction, tier, pages, nbytes, dur, q, c) in tm.records:
            if direction not in ("d2h", "h2d"):
                disk[direction] = disk.get(direction, 0) + 1  # (a shared store's too)
                continue
            if n_tr < int(cfg.output.ops_limit):
                lines.append({"op": direction, "codec": codec, "fused": True, "pages": int(pages),
                              "page_tokens": int(cfg.cache.block_size), "time_s": t,
                              "predicted_s": dur})
                n_tr += 1
            else:
                tr_over += 1
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        for line in lines:
            f.write(json.dumps(line) + "\n")
    os.replace(tmp, path)
    return {"ops_rounds_written": len(comp.ops or []), "ops_rounds_over_limit": comp.ops_over_limit,
            "ops_rounds_left_out": comp.ops_left_out,
            "ops_transfers_written": n_tr, "ops_transfers_over_limit": tr_over,
            "ops_transfers_left_out": disk}


def delay_workload(wl, delay_s: float):
    """``wl`` with every request reaching the engine ``delay_s`` seconds after its client sent
    it (``cost.frontend_latency_s``): open-loop roots arrive ``delay_s`` later, closed-loop
    children ``delay_s`` after their parent's finish plus their think time. Returns a new
    :class:`traces.Workload` (``wl`` unchanged); ``delay_s == 0`` returns ``wl``."""
    if delay_s == 0:
        return wl
    import copy

    import pyarrow as pa

    t = wl.table
    roots = wl.parent_request_id < 0
    arr = wl.arrival_s + np.where(roots, delay_s, 0.0)
    think = wl.think_s + np.where(roots, 0.0, delay_s)
    t = t.set_column(t.schema.get_field_index("arrival_s"), "arrival_s", pa.array(arr))
    t = t.set_column(t.schema.get_field_index("think_s"), "think_s", pa.array(think))
    out = copy.copy(wl)
    out.table = t
    return out


def _tiers_factory(cfg, plan, calibration=None):
    """Validate the tier and codec config; return (factory env -> TierManager or None, cold page
    bytes). A tier manager exists when host or disk capacity is above zero, or with a cluster's
    shared store (``cluster.store.enabled``). ``calibration`` (``cost.kind=calibrated``) times
    the host copies and codecs."""
    from .tiers import TierManager, cold_page_bytes, tiers_enabled

    cold = cold_page_bytes(cfg.model, cfg.cache, cfg.codec)
    t = cfg.tiers
    sizes = ([(f"levels[{i}].gib", lv.gib) for i, lv in enumerate(t.levels)] if t.levels else
             [("host_gib", t.host_gib), ("disk_gib", t.disk_gib)])
    for f, gib in sizes:
        if gib < 0:
            raise ConfigError(f"tiers.{f}={gib}; expected a finite capacity >= 0 GiB")
    for f, gib in sizes:
        if 0 < gib and gib * 2**30 < cold:
            raise ConfigError(
                f"tiers.{f}={gib} holds no page of {cold} bytes ({cfg.codec.name} page of "
                f"{cfg.cache.block_size} tokens); use 0 to disable the tier or at least "
                f"{cold / 2**30:.6f} GiB")
    if not tiers_enabled(t) and not cfg.cluster.store.enabled:
        return None, cold
    if not cfg.cache.enable_prefix_caching:
        raise ConfigError("tiers below the GPU need cache.enable_prefix_caching=true")
    hbm = float(cfg.gpu.hbm_bandwidth_gbps) * 1e9 * float(cfg.cost.mbu)

    def factory(env):
        return TierManager(env, t, cfg.codec, plan.block_bytes, cold, cfg.gpu, hbm, calibration=calibration)

    # build once now so config errors surface before the simulation starts
    import simpy
    factory(simpy.Environment())
    return factory, cold


def run_simulation(cfg, out_dir=None, progress_bar: bool | None = None, workload=None,
                   overrides: list[str] | None = None, hydra_record: bool = False,
                   hold: bool = True, config_choices: dict[str, str] | None = None,
                   record_fingerprint: str | None = None) -> dict:
    """Simulate ``cfg`` (a KvsimConfig DictConfig) and write results into ``out_dir``.

    ``workload``: a :class:`traces.Workload` to replay instead of loading ``cfg.trace`` (for
    programmatic use and tests). ``hydra_record``: ``out_dir/.hydra/`` is Hydra's record of this
    very run (the CLI without ``output.dir``); otherwise a ``.hydra/`` there is an earlier run's
    and is removed with its other results (kvsim-collect reads the run's settings from it), and
    the run writes its own ``config.yaml``. ``config_choices``: the option chosen for each config
    group (``{"codec": "identity", "tiers": "gpu_host", ...}``, Hydra's ``runtime.choices``; the
    CLI passes them), recorded as the summary's ``config_choices`` so that ``kvsim-collect``
    knows the groups of a run that has no ``.hydra/`` folder (an ``output.dir`` run).
    ``record_fingerprint``: with ``hydra_record``, :func:`sim.folders.config_fingerprint` of
    the config Hydra recorded in ``.hydra/config.yaml`` (the CLI's config before it made
    paths absolute); the summary records it as ``config_fingerprint`` (without it, or when the
    run writes its own ``config.yaml``, that of ``cfg``).

    Returns the summary dict. Raises ConfigError / TraceError before anything is simulated when
    the config or trace is invalid; the results directory is then not touched (an earlier
    run's results stay as they were). With ``hold`` (the default; the CLI's sweep jobs, whose
    folders the sweep's claims guard, pass False) this run holds ``out_dir`` from its checks'
    end until it returns or raises, and raises OutputDirBusy (a ConfigError), touching nothing,
    when another run holds it (:func:`hold_output_dir`).
    """
    wall0 = time.perf_counter()
    out = Path(out_dir) if out_dir is not None else None
    why = blocked_folder(out) if out is not None else None
    if why is not None:
        raise ConfigError(f"output.dir={out}: {why}; expected a folder for the results (or a "
                          f"path to create)")
    # every config and trace check runs before the results directory is touched, so a
    # rejected run leaves an earlier run's results there as they were
    validate_config(cfg)
    inputs = input_files(cfg)  # (before they are read: a file changed during the run reruns)
    plan = plan_memory(cfg.model, cfg.gpu, cfg.cache, cfg.scheduler, cfg.cost.tensor_parallel_size)
    cost = build_cost_model(cfg.model, cfg.gpu, cfg.cache, cfg.cost)
    t_load = time.perf_counter()
    wl = load_workload(cfg.trace, seed=int(cfg.seed)) if workload is None else workload
    from .validation import validate_workload

    validate_workload(cfg, wl)
    delay = float(cfg.cost.frontend_latency_s)
    if not (delay >= 0 and math.isfinite(delay)):
        raise ConfigError(f"cost.frontend_latency_s={delay}; expected a time >= 0 (seconds)")
    wl = delay_workload(wl, delay)
    t_load = time.perf_counter() - t_load
    calibration = getattr(cost, "calibration", None)  # cost.kind=calibrated
    from .kv_store import build_store

    store = build_store(cfg, plan.block_bytes)  # (None: no shared store)
    tiers_factory, page_bytes = _tiers_factory(cfg, plan, calibration)
    comp = Compression(cfg.policy, cfg.compaction, cfg.model, cfg.cache, cfg.cost,
                       float(cfg.gpu.hbm_bandwidth_gbps) * 1e9, int(cfg.seed), calibration=calibration)
    if cfg.output.write_ops:
        comp.ops = []
        comp.ops_limit = int(cfg.output.ops_limit)
    from .pd import build_pd_links

    pd_links = build_pd_links(cfg, plan.block_bytes, page_bytes)  # (None: not disaggregated)
    lock = hold_output_dir(out) if out is not None and hold else None
    try:
        return _simulate_into(cfg, out, wl, plan, cost, comp, tiers_factory, page_bytes,
                              progress_bar, overrides, hydra_record, wall0, t_load, inputs,
                              config_choices, record_fingerprint, store=store,
                              pd_links=pd_links)
    finally:
        if lock is not None:
            lock.release()


def _simulate_into(cfg, out, wl, plan, cost, comp, tiers_factory, page_bytes, progress_bar,
                   overrides, hydra_record, wall0, t_load, inputs=None,
                   config_choices=None, record_fingerprint=None, store=None,
                   pd_links=None) -> dict:
    """:func:`run_simulation` once the config and trace passed their checks and ``out`` (or
    None) is held by this run: simulate, then write the results. ``store``: the cluster's
    shared store (:func:`sim.kv_store.build_store`) or None; ``pd_links``: a disaggregated
    cluster's KV links (:func:`sim.pd.build_pd_links`) or None."""
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        # (with the run's overrides: kvsim-collect names an interrupted run's settings)
        from .folders import OVERRIDES_PREFIX

        try:
            (out / MARKER).write_text("this run has not completed\n" + (
                f"{OVERRIDES_PREFIX}{json.dumps(list(overrides))}\n" if overrides is not None
                else ""))
        except OSError as e:  # (a write or close that fails carries no file name: name it)
            if e.filename is None:
                e.filename = str(out / MARKER)
            raise
        # a reused directory must not keep an earlier run's tables next to the marker
        for name in ("summary.json", "requests.parquet", "steps.parquet", "rounds.parquet",
                     "transfers.parquet", "ops.jsonl", "config.yaml"):
            if (out / name).exists():
                (out / name).unlink()
        if not hydra_record and (out / ".hydra").is_dir():
            import shutil

            shutil.rmtree(out / ".hydra")
    n = len(wl)
    replicas = int(cfg.cluster.replicas)
    from .cluster import Cluster, ClusterRecorder

    rec = (ClusterRecorder if replicas > 1 else Recorder)(
        n, wl.table.column("session_id").to_numpy(), record_steps=bool(cfg.output.write_steps))
    show = cfg.sim.progress is not False if progress_bar is None else progress_bar
    bar = None
    progress = None
    if show:
        from tqdm.auto import tqdm
        bar = tqdm(total=n, unit="req", desc="kvsim", mininterval=0.5)  # left on screen, ends its line

        def progress(done, _bar=bar):
            _bar.update(done - _bar.n)
    # (one replica: the single engine; more: a Cluster, whose tables gain a replica column)
    engine = Simulator if replicas == 1 else (
        lambda *a, **k: Cluster(cfg.cluster, *a, store=store, pd_links=pd_links, **k))
    sim = engine(wl, plan.num_gpu_blocks, cfg.cache.block_size, cfg.scheduler, cfg.cache, cost,
                 cfg.model.max_model_len, rec, check_invariants=cfg.sim.check_invariants,
                 progress=progress, max_sim_time_s=cfg.sim.max_sim_time_s,
                 fast_forward=cfg.sim.fast_forward, tiers=tiers_factory,
                 num_layers=cfg.model.num_layers, compression=comp,
                 prefix_index=cfg.sim.prefix_index)
    t_sim = time.perf_counter()
    try:
        sim.run()
    finally:
        if bar is not None:
            bar.close()
    t_sim = time.perf_counter() - t_sim
    req = rec.requests_frame()
    from .provider_cache import attach_provider_columns, compare_with_provider

    req = attach_provider_columns(req, wl)  # (a trace that records the provider's cache reads)
    delay = float(cfg.cost.frontend_latency_s)
    if delay:  # (times as the client measures them: it sent each request delay s earlier)
        req["arrival_s"] = req["arrival_s"] - delay
        for col in ("ttft_s", "e2e_s", "queue_s", "prefill_done_s"):
            if col in req:  # (prefill_done_s: a disaggregated cluster's)
                req[col] = req[col] + delay
    extra = {
        "model": cfg.model.name,
        "gpu": cfg.gpu.name,
        "tensor_parallel_size": int(cfg.cost.tensor_parallel_size),
        "trace": cfg.trace.name,
        "trace_source": str(getattr(wl, "source", "")),
        "block_size": int(cfg.cache.block_size),
        "kv_bytes_per_token": kv_bytes_per_token(cfg.model, cfg.cache),
        "kv_bytes_per_block": kv_bytes_per_block(cfg.model, cfg.cache),
        "memory_gib": {
            "budget": plan.budget_bytes / 2**30,
            "weights": plan.weight_bytes / 2**30,
            "activation_reserve": plan.activation_bytes / 2**30,
            "sliding_window_reserve": plan.window_reserve_bytes / 2**30,
            "kv_pool": plan.num_gpu_blocks * plan.block_bytes * plan.kv_replication / 2**30,
        },
        "kv_replication": plan.kv_replication,
        "trace_skipped_rows": _clean_nan(dict(wl.skipped)) if getattr(wl, "skipped", None) else {"count": 0, "examples": []},
        # what the loader changed or could not honour (zero outputs loaded as 1, sessions cut
        # at max_context_tokens, ...): printed by the CLI too
        "trace_warnings": [str(w) for w in (getattr(wl, "warnings", None) or [])],
        "seed": int(cfg.seed),
        "overrides": list(overrides) if overrides is not None else None,
        # the option of each config group (Hydra's runtime.choices; None outside the CLI)
        "config_choices": ({str(k): str(v) for k, v in sorted(config_choices.items())}
                           if config_choices is not None else None),
        # the trace's files as read ([[name, bytes, xxh3-128], ...]; None: generated)
        "trace_input": (getattr(wl, "notes", None) or {}).get("trace_input"),
        # seconds the loader moved the clock so that the first request arrives at 0
        # (trace.rebase_to_first_arrival; 0: none; None: a workload passed in, not loaded)
        "trace_rebase_s": (getattr(wl, "notes", None) or {}).get("rebase_s"),
        # the calibration and importance files read (input_files: {field: [name, bytes, xxh3]})
        "input_files": input_files(cfg) if inputs is None else inputs,
    }
    tm = sim.tiers
    extra["codec"] = cfg.codec.name
    # the tiers the run had (a preset's capacities can be overridden: tiers.host_gib=64 on
    # gpu_only is a host tier); the preset's name is kept beside it
    from .tiers.spec import tiers_name

    extra["tiers"] = tiers_name(cfg.tiers)
    extra["tiers_preset"] = cfg.tiers.name
    extra["page_bytes"] = page_bytes
    # per level below the GPU, by name (the default chain: host, disk)
    names = tm.names if tm else ("host", "disk")
    extra["bytes_offloaded"] = dict(tm.bytes_offloaded) if tm else dict.fromkeys(names, 0)
    extra["bytes_onboarded"] = dict(tm.bytes_onboarded) if tm else dict.fromkeys(names, 0)
    for n in names:
        extra[f"{n}_capacity_pages"] = tm.capacity[n] if tm else 0
    for i, n in enumerate(names):
        extra[f"peak_{n}_pages"] = tm.stores[i].peak if tm and i < len(tm.stores) else 0
    # (a disaggregated cluster's transfers table: its KV transfers, with its replicas' tier
    # copies when they have tiers)
    pd_transfers = sim.transfers_frame() if pd_links is not None else None
    if pd_transfers is not None and tm is not None:
        from .pd import with_tier_transfers

        pd_transfers = with_tier_transfers(transfers_frame(tm), pd_transfers)
    extra["transfers"] = (len(tm.records) if tm else 0) if pd_transfers is None else \
        len(pd_transfers)
    extra["cost_model"] = cost.describe(codec=tm.codec if tm else None, disk=bool(tm and len(tm.stores) > 1),
                                        compaction=comp.active)
    rounds = pd.DataFrame.from_records(sim.rounds, columns=ROUND_COLUMNS).astype({
        "time_s": "float64", "request_id": "int64", "policy": "string", "compaction": "string",
        "tokens_before": "float64", "tokens_kept": "float64", "tokens_evicted": "float64",
        "blocks_before": "int64", "blocks_after": "int64", "blocks_freed": "int64",
        "bytes_moved": "float64", "tokens_moved": "int64", "ragged_waste_slots": "int64",
        "metadata_bytes": "float64", "fragmentation_after": "float64", "duration_s": "float64"})
    extra["policy"] = cfg.policy.name
    extra["compaction"] = cfg.compaction.name
    extra["rounds"] = int(len(rounds))
    extra["bytes_moved_total"] = float(rounds["bytes_moved"].sum())
    extra["mean_fragmentation"] = float(rounds["fragmentation_after"].mean()) if len(rounds) else None
    extra["round_time_total_s"] = float(rounds["duration_s"].sum())
    extra["preempted_lookups"] = sim.preempted_lookups
    fin = req[req["status"] == "finished"] if len(req) else req
    # (prompt + output of the longest finished request: a read budget above it saves nothing)
    extra["longest_context_tokens"] = (int((fin["input_tokens"] + fin["output_tokens"]).max())
                                       if len(fin) else None)
    # (tiers.load_or_recompute: the hits cut because loading was slower; null without tiers)
    extra["recomputed_instead_of_load"] = (dict(sim.recomputed_instead_of_load)
                                           if tm is not None else None)
    extra["write_back_stall_s"] = float(sim.write_back_stall_s)
    extra["write_back_stalls"] = int(sim.write_back_stalls)
    # the serving span ends with the last request; copies still landing after it (offloads,
    # demotions) do not stretch the throughput's denominator
    serve_end = float(req["finish_s"].max()) if len(req) else float(sim.env.now)
    extra["tier_copies_end_s"] = float(sim.env.now) if tm is not None else None
    provider = compare_with_provider(req, wl)
    if provider is not None:  # (kvsim's hits beside the provider's cache reads)
        extra["provider_cache"] = provider
    if hasattr(cost, "run_breakdown"):  # (cost.kind=operator: where the step time went)
        extra["cost_model"]["step_time_s"] = cost.run_breakdown(rec.steps_frame())
    if replicas > 1:  # (per replica; the top-level block counts are one replica's)
        extra["cluster"] = sim.summary(req)
    summary = summarize(req, rec, serve_end, plan.num_gpu_blocks, extra,
                        block_size=int(cfg.cache.block_size))
    if store is not None:  # (the remote tier's hit ratios; no such keys without a store)
        from .kv_store import add_remote_hit_ratios

        add_remote_hit_ratios(summary, req)
    from traces.loader import peak_rss_mb as _peak

    peak_rss_mb = _peak()
    summary["wall"] = {
        "wall_s": time.perf_counter() - wall0,
        "load_s": t_load,
        # the parsed-trace cache: hit, miss (parsed and stored) or off (traces.cache)
        "load_cache": str((getattr(wl, "notes", None) or {}).get("trace_cache", "off")),
        "simulate_s": t_sim,
        "peak_rss_mb": peak_rss_mb,
        # the engine's fast paths: {name: {"taken": stretches, "steps": steps they covered}}
        "stretches": sim.stretch_counts(),
    }
    summary["prefix_index"] = sim.prefix_index  # the backend sim.prefix_index resolved to
    summary = _clean_nan(summary)
    if out is not None:
        written = ["requests.parquet", "transfers.parquet", "rounds.parquet"]
        _write_parquet(req, out / "requests.parquet")
        if cfg.output.write_steps:
            _write_parquet(rec.steps_frame(), out / "steps.parquet")
            written.append("steps.parquet")
        _write_parquet(transfers_frame(tm) if pd_transfers is None else pd_transfers,
                       out / "transfers.parquet")
        _write_parquet(rounds, out / "rounds.parquet")
        if cfg.output.write_ops:
            summary.update(_write_ops(cfg, comp, tm, out / "ops.jsonl"))
            written.append("ops.jsonl")
        from .folders import config_fingerprint

        if not (hydra_record and (out / ".hydra" / "config.yaml").exists()):
            (out / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
            written.append("config.yaml")
            record_fingerprint = None
        # the config record's fingerprint: kvsim-collect and output.skip_completed check that
        # the record beside this summary is this run's
        summary["config_fingerprint"] = record_fingerprint or config_fingerprint(cfg)
        # the files this run wrote, with their sizes and content digests: output.skip_completed
        # reruns a run whose tables were deleted, truncated or altered since (is_complete)
        summary["output_files"] = [[f, (out / f).stat().st_size, file_digest(out / f)]
                                   for f in sorted(written)]
        summary["wall"]["wall_s"] = time.perf_counter() - wall0
        summary["wall"]["peak_rss_mb"] = _peak()
        _write_json(summary, out / "summary.json")
        (out / MARKER).unlink()
    return summary


def compose_config(overrides: list[str] | None = None) -> DictConfig:
    """Compose the kvsim config without running Hydra's app (for tests and notebooks)."""
    from hydra import compose, initialize_config_dir

    from .config import register_configs

    register_configs()
    conf_dir = str(CONF_DIR)
    with initialize_config_dir(config_dir=conf_dir, version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides or []))
