"""The ``kvsim`` command (a Hydra app).

``kvsim`` replays the bundled Mooncake slice for Qwen3-8B on one H200 with vLLM defaults.
Any part is changed with Hydra overrides, e.g.
``kvsim trace=weka_agentic model=llama3_1_8b gpu=h100 cache.block_size=32``.
``kvsim --help`` lists the config groups; ``kvsim --cfg job`` prints the resolved config;
``kvsim -m ...`` runs a sweep.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from . import hydra_record
from .config import CONF_DIR, REJECTED_RUN_PREFIX, TiersConfig, register_configs
from .console import resource_error, write_line
from .folders import blocking_file

log = logging.getLogger("kvsim")


def _run_record() -> logging.Logger:
    """A logger that writes only to the job's log files (Hydra's ``cli.log`` in the run
    folder), not to the console: the run's record, beside what ``kvsim`` prints."""
    rec = logging.getLogger("kvsim.record")
    rec.propagate = False
    rec.setLevel(logging.INFO)
    for h in list(rec.handlers):
        rec.removeHandler(h)
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler):
            rec.addHandler(h)
    return rec

register_configs()
hydra_record.install()  # (Hydra's .hydra/ record of a job: whole or not at all, sim.hydra_record)


def _rate(v: float) -> str:
    """A throughput for the table: whole numbers from 100 up, else three significant digits
    (an idle trace's 0.45 tok/s is not '0')."""
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def format_summary(s: dict) -> "rich.table.Table":  # noqa: F821
    """A rich table of the headline numbers of a summary dict."""
    from rich.table import Table

    def times(d, scale, digits):
        """p50 / p90 / p99 of a latency dict (seconds) times ``scale``, to ``digits`` decimals."""
        return " / ".join("-" if d.get(k) is None else f"{d[k] * scale:,.{digits}f}"
                          for k in ("p50", "p90", "p99"))

    src = s.get("trace_source") or ""
    trace = s.get("trace")
    if src and not src.endswith(("mooncake_conversation_10min.jsonl",)) and trace and trace not in src:
        trace = f"{trace} ({Path(src).name})"
    tp = s.get("tensor_parallel_size") or 1
    title = f"kvsim: {trace} | {s.get('model')} on {f'{tp} x ' if tp > 1 else ''}{s.get('gpu')}"
    # the memory setup when it is not the default: policy + compaction, tiers + codec
    if s.get("policy", "full") != "full":
        comp = s.get("compaction", "none")
        title += f" | {s['policy']}" + (f" + {comp}" if comp != "none" else "")
    if s.get("tiers", "gpu_only") != "gpu_only":
        title += f" | tiers {s['tiers']}, codec {s.get('codec', 'identity')}"
    cl = s.get("cluster")  # (a cluster's summary: the replicas and the router)
    if cl:
        title += f" | {cl['replicas']} replicas, {cl['router']} router"
    # what the command line changed (the run's outputs and progress bar aside)
    shown = [o for o in s.get("overrides") or []
             if not o.lstrip("+~").startswith(("output.", "hydra.", "sim.progress"))]
    # (rich wraps a title to the table's width: the table is made as wide as its title)
    t = Table(title=title, caption=f"overrides: {' '.join(shown)}" if shown else None,
              show_header=True, min_width=len(title))
    t.add_column("metric")
    t.add_column("value", justify="right")
    t.add_row("requests (finished / rejected / total)",
              f"{s['requests_finished']:,} / {s['requests_rejected']:,} / {s['requests_total']:,}")
    if s.get("rejected_by_reason"):
        t.add_row("rejected by reason", ", ".join(f"{k}: {v:,}" for k, v in s["rejected_by_reason"].items()))
    # one unit per row, whatever the values (a sweep's tables compare line by line): TTFT and
    # E2E in s to the ms (an overloaded run queues for minutes), TPOT in ms
    for name, unit, scale, digits in (("ttft_s", "s", 1.0, 3), ("tpot_s", "ms", 1e3, 1),
                                      ("e2e_s", "s", 1.0, 3)):
        t.add_row(f"{name[:-2].upper()} {unit}  p50 / p90 / p99", times(s[name], scale, digits))
    thr = s.get("throughput_tokens_per_s")
    othr = s.get("output_throughput_tokens_per_s")
    t.add_row("throughput tok/s (total / output)",
              "-" if thr is None else f"{_rate(thr)} / {_rate(othr)}")
    hr = s.get("prefix_hit_ratio")
    hm = s.get("prefix_hit_ratio_mean_per_request")
    t.add_row("prefix-hit ratio (tokens / mean per request)",
              "-" if hr is None else f"{hr:.1%} / {hm:.1%}")
    pc = s.get("provider_cache") or {}
    if pc.get("provider_cached_tokens"):  # (a trace that records the provider's cache reads)
        t.add_row("prefix-hit tokens kvsim / provider's cache reads",
                  f"{pc['kvsim_hit_tokens']:,} / {pc['provider_cached_tokens']:,} "
                  f"({pc['difference_pct']:+.1f}%)")
    # (the levels below the GPU by name, level 1 first: host / disk in the default chain)
    levels = [k for k in (s.get("bytes_offloaded") or {"host": 0, "disk": 0})]
    if s.get("tiers", "gpu_only") != "gpu_only" or (s.get("hit_ratio") or {}).get(levels[0]):
        h = s["hit_ratio"]
        t.add_row(f"hit ratio by tier (GPU / {' / '.join(levels)})",
                  " / ".join("-" if h[k] is None else f"{h[k]:.1%}" for k in ("gpu", *levels)))
    pl = s.get("preempted_lookups") or {}
    if pl.get("requests"):
        ht = pl["hit_tokens"]
        t.add_row(f"re-admissions after preemption / their hit tokens GPU / {' / '.join(levels)}",
                  f"{pl['requests']:,} / " + " / ".join(f"{ht[k]:,}" for k in ("gpu", *levels)))
    if s.get("policy", "full") != "full" and s.get("rounds") is not None:
        t.add_row("compression rounds / tokens evicted / blocks freed",
                  f"{s['rounds']:,} / {s.get('tokens_evicted_total', 0):,} / "
                  f"{s.get('blocks_freed_total', 0):,}")
    if s.get("write_back_stalls"):
        t.add_row("steps held for write-back copies / time s",
                  f"{s['write_back_stalls']:,} / {s['write_back_stall_s']:,.2f}")
    # (a cluster's: the fullest replica's peak and one replica's pool)
    t.add_row("peak GPU blocks used / total" + (" (fullest replica / each)" if cl else ""),
              f"{s['peak_gpu_blocks_used']:,} / {s['gpu_blocks_total']:,}")
    t.add_row("preemptions", f"{s['preemptions']:,}")
    t.add_row("engine steps", f"{s['engine_steps']:,}")
    t.add_row("simulated time s / wall s",
              f"{s['sim_duration_s']:,.1f} / {s['wall']['wall_s']:,.1f}")
    tc = s.get("tier_copies_end_s")
    if tc is not None and tc > s["sim_duration_s"]:
        t.add_row("last tier copy landed s (after the last request)", f"{tc:,.1f}")
    return t


# tier options that only matter with a host or disk tier: all but the preset name and sizes
TIER_ONLY_FIELDS = tuple(f.name for f in dataclasses.fields(TiersConfig)
                         if f.name not in ("name", "host_gib", "disk_gib"))


# compaction option -> the compactions that read it (policies.compaction; pin_prompt only when
# Compactor.apply is called without the engine's pinned_len)
COMPACTION_READERS = {"position_index_bytes": ("hole_fill",), "position_index_per_group": ("hole_fill",),
                      "pin_prompt": ()}


# cost settings only the per-operator models read (sim.operator_cost)
OPERATOR_ONLY_COST = ("fp8_mfu", "fp4_mfu", "expert_mfu", "attention_mbu", "seq_overhead_s",
                      "prefill_overhead_s", "layer_overhead_s", "comm_efficiency",
                      "gemm_precision", "expert_parallel")


def inert_override_notes(overrides: list[str], trace_format: str, tiers: str,
                         cost_kind: str = "analytic", policy: str = "full",
                         compaction: str = "none", codec: str = "identity") -> list[str]:
    """Notes for command-line overrides that change nothing in this run: a trace option of
    another kind of trace (``trace_format``: the run's ``trace.format``; ``trace.path`` of a
    synthetic one, which is generated), a tier option with no host or disk tier (``tiers``: the
    summary's ``tiers``, e.g. ``gpu_only``), ``cost.file`` without ``cost.kind=calibrated``, a
    policy option or a compaction with ``policy=full`` (no round ever runs), a compaction
    option with ``compaction=none``, and a codec option with ``codec=identity``."""
    from traces.registry import all_formats, readers_of

    notes = []
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        group, _, field = key.partition(".")
        if group == "trace":
            # (trace options that only some formats read: their options classes, traces.formats)
            readers = readers_of(field)
            if readers and trace_format not in readers:
                notes.append(f"{key} is read by {' and '.join(readers)} traces only; this run's "
                             f"trace is {trace_format}: it changes nothing")
            fmt = all_formats().get(trace_format)
            if field in ("path", "cache", "cache_dir") and fmt is not None and fmt.generated:
                notes.append(f"{key} is read by traces loaded from files; this run's trace is "
                             f"{trace_format}, generated from its options: it changes nothing")
        elif key == "cost.file" and cost_kind != "calibrated":
            notes.append(f"cost.file is read with cost.kind=calibrated; this run's cost.kind is "
                         f"{cost_kind}: it changes nothing")
        elif key == "cost.kind":
            notes.append(f"cost.kind={cost_kind} keeps the other cost.* settings of the cost "
                         f"preset; cost={cost_kind} selects that model with its own (fitted) "
                         f"settings")
        elif group == "cost" and field in OPERATOR_ONLY_COST and cost_kind == "analytic":
            notes.append(f"{key} is read by cost.kind=operator and calibrated; this run's "
                         f"cost.kind is analytic: it changes nothing")
        elif group == "tiers" and field in TIER_ONLY_FIELDS and tiers == "gpu_only":
            notes.append(f"{key} applies to host and disk tiers; with none (tiers.host_gib = "
                         f"tiers.disk_gib = 0) it changes nothing")
        elif group in ("policy", "compaction") and field and field != "name" and policy == "full" \
                or key == "compaction" and compaction != "none" and policy == "full":
            notes.append(f"{key} applies to a compression policy's rounds; policy=full keeps "
                         f"every token and runs none: it changes nothing")
        elif group == "compaction" and field in COMPACTION_READERS \
                and compaction not in COMPACTION_READERS[field]:
            readers = COMPACTION_READERS[field]
            notes.append(f"{key} is read by compaction={' and '.join(readers)}; this run's "
                         f"compaction is {compaction}: it changes nothing" if readers else
                         f"{key} is not read in a simulation (the engine pins the slots the "
                         f"policy protects, policy.protect_prompt): it changes nothing")
        elif group == "codec" and field and field != "name" and codec == "identity":
            notes.append(f"{key} is read by the fp8 and nvfp4 codecs; this run's codec is "
                         f"identity (pages copied as they are): it changes nothing")
    return notes


# cost terms a calibration never covers (see sim.calibrated_cost): not worth a note
ALWAYS_ANALYTIC = ("collectives", "disk_read_write", "compaction_scoring")


def _bad_output_dir(out: Path, job_dir: Path, blocked: bool = False) -> str | None:
    """Why ``output.dir`` = ``out`` cannot take a run's results: a folder holding files that
    are not a kvsim run's (:func:`sim.folders.foreign_folder`; the job's own Hydra folder
    ``job_dir`` aside, where ``hydra.run.dir`` puts it inside ``out``), one that cannot be
    created or written, or, with ``blocked`` (a sweep's job, which makes the folder before
    simulating), a file in the way; None when it can (a single run's
    :func:`sim.run.run_simulation` names a file in the way)."""
    from .folders import blocked_folder, foreign_folder, uncreatable_folder

    why = blocked_folder(out) if blocked else None
    if why is not None:
        return f"output.dir={out}: {why}; expected a folder for the results (or a path to create)"

    try:
        inner = job_dir.resolve().relative_to(out.resolve()).parts[:1]
    except (ValueError, OSError):
        inner = ()
    names = foreign_folder(out, inner)
    if names is not None:
        shown = ", ".join(names[:5]) + (f", ... ({len(names)} entries)" if len(names) > 5 else "")
        return (f"output.dir={out}: the folder holds files that are not a kvsim run's ({shown}); "
                f"expected a new or empty folder, or an earlier kvsim run's results folder (whose "
                f"results a run replaces)")
    why = uncreatable_folder(out)
    if why is not None:
        return (f"output.dir={out}: cannot create or write the folder ({why}); expected a "
                f"folder kvsim can create and write")
    return None


def _drop_rejected_run_dir(hc) -> None:
    """Remove Hydra's temporary run folder of a single run whose ``output.dir`` was rejected
    (:func:`sim.config._run_dir` sent Hydra's log there), so nothing is left behind."""
    rejected = Path(hc.runtime.output_dir)
    if rejected.name.startswith(REJECTED_RUN_PREFIX):
        import shutil

        logging.shutdown()
        shutil.rmtree(rejected, ignore_errors=True)


def _log_sizes() -> dict:
    """Bytes in each of the job's log files now (Hydra's ``cli.log``, opened for appending):
    what an earlier run into the same folder left there."""
    import os

    out = {}
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler) and os.path.exists(h.baseFilename):
            out[h.baseFilename] = os.path.getsize(h.baseFilename)
    return out


def _drop_earlier_logs(sizes: dict) -> None:
    """Cut from each job log file the first ``sizes[file]`` bytes (an earlier run's record,
    :func:`_log_sizes`), once this run has replaced that run's results: ``cli.log`` is the
    record of the results beside it."""
    for h in logging.getLogger().handlers:
        n = sizes.get(getattr(h, "baseFilename", None))
        if not n or not isinstance(h, logging.FileHandler):
            continue
        h.flush()
        with open(h.baseFilename, "r+b") as f:
            rest = f.read()[n:]
            f.seek(0)
            f.write(rest)
            f.truncate()


class Terminated(KeyboardInterrupt):
    """SIGTERM during a single run (``kill``, a scheduler's time limit): handled as Ctrl-C is,
    with its own message and exit status 143."""


def _on_sigterm(signum, frame):
    raise Terminated()


def _on_sweep_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


@hydra.main(version_base="1.3", config_path="../experiments/conf", config_name="config")
def app(cfg: DictConfig) -> None:
    """Hydra entry point: simulate ``cfg`` into the Hydra run directory (:func:`_run`). A
    sweep's job also records its outcome in the sweep's job ledger (:mod:`sim.sweep`), and a
    worker process of a local sweep ends when the sweep's process is gone
    (:func:`sim.sweep.end_with_sweep`). A sweep job that failed where neither the ledger nor
    its folder can record it (a full disk) raises :class:`sim.sweep.UnrecordedJobFailure`:
    Hydra's sweeper ends the sweep with its one line, exit status 1."""
    from hydra.types import RunMode

    hc = HydraConfig.get()
    # Hydra's .hydra/ record of this job, when one of its files could not be written
    record_failed = None if hc.output_subdir is None else hydra_record.take_failure(
        Path(hc.runtime.output_dir) / str(hc.output_subdir))
    if hc.mode != RunMode.MULTIRUN:
        _run(cfg, hc, multirun=False, record_failed=record_failed)
        return
    from . import sweep as S
    from .folders import SWEEP_ID

    sweep_dir = Path(hc.sweep.dir)
    if not sweep_dir.is_absolute():  # (hydra.job.chdir=true: the job runs in its folder)
        sweep_dir = Path(hc.runtime.cwd) / sweep_dir
    try:
        S.end_with_sweep(S.sweep_pid((sweep_dir / SWEEP_ID).read_text()))
    except OSError:
        pass
    job_dir = Path(hc.runtime.output_dir)
    try:
        name = job_dir.resolve().relative_to(sweep_dir.resolve()).as_posix()
    except ValueError:
        name = str(job_dir)
    num = int(hc.job.num)
    S.record_job(sweep_dir, num, "running", name=name)
    why = "its process stopped before the job finished"
    try:
        why = _run(cfg, hc, multirun=True, record_failed=record_failed)
    finally:
        recorded = S.record_job(sweep_dir, num, "complete" if why is None else "failed", why,
                                name=name)
    if why is not None and not recorded:
        raise S.UnrecordedJobFailure(name, why, sweep_dir)


def _same_folder(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _run(cfg: DictConfig, hc, multirun: bool, record_failed=None) -> str | None:
    """Simulate ``cfg`` into its results folder (``output.dir``, or Hydra's run or job folder)
    while holding it (:func:`sim.run.hold_output_dir`). Returns None when the run completed or
    was skipped as complete; a sweep's job returns the one-line error of its failure (also
    written into its folder), a single run exits with status 2 (bad input, a folder another
    run holds), 1 (out of memory, a full disk: :func:`resource_error`) or 130/143
    (interrupted). ``record_failed``: the write of Hydra's ``.hydra/`` record that failed at
    the job's start and the record files replaced before it
    (:func:`sim.hydra_record.take_failure`): the run fails with it, or is skipped when
    ``output.skip_completed`` finds it complete."""
    from rich.console import Console

    from .callbacks import input_files_or_unknown, trace_input
    from .folders import config_fingerprint, run_overrides
    from .errors import OutputDirBusy
    from .run import hold_output_dir, is_complete, run_simulation

    from omegaconf import OmegaConf

    # the overrides as given (an interpolation in one is not resolved here)
    task = [str(o) for o in OmegaConf.to_container(hc.overrides.task, resolve=False)]
    # (a sweep's job: its swept values are not in the config the Hydra callback checked)
    bad = unresolvable_interpolation(cfg, task)
    if bad is not None:
        print(f"kvsim: error: {bad}", file=sys.stderr)
        _run_record().info("kvsim: error: %s", bad)  # (the job's cli.log)
        # nothing ran: the job's folder holds the error (a sweep's failure report lists it)
        mark_failed(Path(hc.runtime.output_dir), bad, task)
        if multirun:
            return bad
        sys.exit(2)
    # (the config Hydra recorded in .hydra/config.yaml, before paths are made absolute below)
    record_fp = config_fingerprint(cfg)
    if hc.job.chdir:
        # Hydra moved into the run folder: relative paths on the command line name files from
        # the folder kvsim was started in (hydra.runtime.cwd), as without hydra.job.chdir
        from hydra.utils import to_absolute_path

        given = str(cfg.cost.file) if cfg.cost.file else None
        for node, key in ((cfg.trace, "path"), (cfg.trace, "cache_dir"), (cfg.cost, "file"),
                          (cfg.policy, "importance_file"), (cfg.output, "dir")):
            if node[key]:
                node[key] = to_absolute_path(str(node[key]))
        if given and not Path(given).is_absolute() and not Path(cfg.cost.file).exists():
            # (a relative cost.file is looked up in the start folder, then in the repository
            # root, sim.cost.resolve_calibration_path: the same two places with chdir)
            from .cost import CALIBRATION_DIR

            if (CALIBRATION_DIR.parent.parent / given).is_file():
                cfg.cost.file = str(CALIBRATION_DIR.parent.parent / given)
    out_dir = Path(cfg.output.dir) if cfg.output.dir else Path(hc.runtime.output_dir)
    job_dir = Path(hc.runtime.output_dir)
    # the overrides that define this run (the resume flag itself excluded)
    overrides = run_overrides(task)
    # the fingerprint the run records: Hydra's record's, or that of the config.yaml it writes
    run_fp = record_fp if not cfg.output.dir and hc.output_subdir is not None \
        else config_fingerprint(cfg)
    if multirun and str(cfg.policy.name) == "full":
        # the dense baseline of a sweep over policies runs without the options the sweep sets
        # for its other policies (sim.sweep.unread_policy_options lets only policy=full's jobs
        # leave an option unread; inert_override_notes names each)
        from policies.config import unread_options

        for key, _ in unread_options(cfg.policy):
            OmegaConf.update(cfg.policy, key, None)

    def complete_already() -> bool:
        return bool(cfg.output.skip_completed) and is_complete(
            out_dir, overrides, trace_input(cfg.trace), input_files_or_unknown(cfg), run_fp)

    def skipped() -> None:
        log.info("skipping %s: already complete", os.path.abspath(out_dir))
        write_line(sys.stdout, f"results: {os.path.abspath(out_dir)}")  # (the earlier run's)

    if record_failed is not None:
        if complete_already():  # (its results and record are there already: nothing to write)
            skipped()
            return None
        e, replaced = record_failed
        msg = resource_error(e) or (f"cannot write Hydra's record of the run, {e.filename} "
                                    f"({type(e).__name__}: {e.strerror or e}); expected a run "
                                    f"folder kvsim can write")
        if not replaced and is_complete(out_dir):
            state = f"nothing was written; {out_dir} keeps an earlier complete run"
        elif _try_mark_failed(out_dir, msg, overrides):
            state = f"{out_dir} is marked INCOMPLETE with it"
        else:  # (an empty marker, where the disk took the file but not its text)
            state = (f"{out_dir} is marked INCOMPLETE" if (out_dir / "INCOMPLETE").exists()
                     else f"{out_dir} could not be marked INCOMPLETE")
        print(f"kvsim: error: {msg}; {state}", file=sys.stderr)
        _run_record().info("kvsim: error: %s; %s", msg, state)  # (the job's cli.log)
        if multirun:
            return msg
        sys.exit(1)
    bad = _bad_output_dir(out_dir, job_dir, multirun) if cfg.output.dir else None
    if bad is not None:
        if not multirun and complete_already():
            # (a folder this run cannot write, a read-only one, holding the complete run)
            skipped()
            _drop_rejected_run_dir(hc)
            return None
        print(f"kvsim: error: {bad}", file=sys.stderr)
        _run_record().info("kvsim: error: %s", bad)  # (the job's cli.log)
        if multirun:  # (the sweep's failure report lists the job; the others go on)
            from .folders import failure_marker

            job_dir.mkdir(parents=True, exist_ok=True)
            (job_dir / "INCOMPLETE").write_text(failure_marker(bad, overrides))
            return bad
        _drop_rejected_run_dir(hc)
        sys.exit(2)
    from .folders import RESULTS_POINTER, SWEEP_ID, failure_marker

    sweep_dir = None
    if multirun:
        sweep_dir = Path(hc.sweep.dir)
        if not sweep_dir.is_absolute():  # (hydra.job.chdir=true: the job runs in its folder)
            sweep_dir = Path(hc.runtime.cwd) / sweep_dir

    def refuse(msg: str, status: int = 2) -> str:
        """Report this job's failure before it wrote anything into ``out_dir`` (another
        process's folder): on stderr, in the job's log and, in a sweep, in the job's own
        folder when that is not ``out_dir``; a single run exits."""
        print(f"kvsim: error: {msg}", file=sys.stderr)
        _run_record().info("kvsim: error: %s", msg)  # (the job's cli.log)
        if not multirun:
            sys.exit(status)
        if not _same_folder(job_dir, out_dir):  # (the sweep's failure report lists it)
            try:
                job_dir.mkdir(parents=True, exist_ok=True)
                (job_dir / "INCOMPLETE").write_text(failure_marker(msg, overrides))
            except OSError:
                pass  # (the sweep's job ledger still has it)
        return msg

    try:  # the results folder is this run's until it ends: no other run writes it meanwhile
        # (a file in its way: run_simulation's error names it)
        lock = hold_output_dir(out_dir, None if cfg.output.dir else f"the run folder {out_dir}") \
            if blocking_file(out_dir) is None else None
    except OutputDirBusy as e:
        mine = read_claim(out_dir) if multirun else None
        sid = (sweep_dir / SWEEP_ID).read_text().strip() if multirun and \
            (sweep_dir / SWEEP_ID).is_file() else None
        if mine is not None and mine[0] == sid and mine[1] != str(hc.job.num):
            return refuse(_shared_output_dir_error(cfg, mine[1]))
        return refuse(str(e))
    except OSError as e:
        return refuse(resource_error(e) or f"output.dir={out_dir}: cannot take the folder's "
                                           f"lock ({type(e).__name__}: {e})", 1)
    if lock is not None and not lock.locked:
        write_line(sys.stderr, f"kvsim: note: {lock.why}: this run's folder is not guarded "
                               f"against another run writing into it at the same time")
    try:
        if not multirun:
            other = running_sweep_claim(out_dir)
            if other is not None:
                refuse(f"output.dir={out_dir} holds the results of {other}; expected a folder "
                       f"no running sweep uses (wait for the sweep to end, or pick another "
                       f"output.dir)")
        log_starts = {} if multirun else _log_sizes()
        if multirun:
            # this job belongs to the sweep now running (sim.callbacks: stale jobs of an
            # earlier sweep into the same directory keep another id)
            sid = sweep_dir / SWEEP_ID
            if cfg.output.dir:
                other = claim_output_dir(out_dir, sid.read_text().strip() if sid.is_file()
                                         else str(sweep_dir), int(hc.job.num), sweep_dir)
                if other is not None:
                    return refuse(_shared_output_dir_error(cfg, other))
            if sid.is_file():
                for d in {out_dir, job_dir}:
                    d.mkdir(parents=True, exist_ok=True)
                    (d / SWEEP_ID).write_text(sid.read_text())
            if cfg.output.dir and not _same_folder(out_dir, job_dir):
                (job_dir / RESULTS_POINTER).write_text(f"{out_dir.resolve()}\n")
                # (an earlier attempt's failure in the job's folder: the pointer tells now)
                (job_dir / "INCOMPLETE").unlink(missing_ok=True)
        if complete_already():
            skipped()
            return None
        from traces import TraceError

        from .errors import ConfigError

        record = _run_record()
        record.info("kvsim %s -> %s", " ".join(overrides) or "(defaults)", out_dir)

        def say(msg: str) -> None:  # a note, warning or error: to stderr and to the record
            write_line(sys.stderr, msg)
            record.info(msg)

        import signal
        import threading

        # a single run stopped by SIGTERM marks its folder and says so, as for Ctrl-C (a
        # sweep's jobs leave SIGTERM to their launcher: submitit requeues on it)
        sigterm = None
        if not multirun and threading.current_thread() is threading.main_thread():
            sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
        before = _summary_stamp(out_dir)  # (an interrupt then tells whose results it holds)
        try:
            choices = {str(k): str(v) for k, v in hc.runtime.choices.items()
                       if not str(k).startswith("hydra/") and v is not None}
            summary = run_simulation(cfg, out_dir, overrides=overrides,
                                     hydra_record=not cfg.output.dir,
                                     config_choices=choices, record_fingerprint=record_fp,
                                     progress_bar=sys.stderr.isatty() if cfg.sim.progress is None
                                     else bool(cfg.sim.progress), hold=False)
            _drop_earlier_logs(log_starts)
        except (ConfigError, TraceError) as e:
            say(f"kvsim: error: {e}")
            if is_complete(out_dir):
                say(f"kvsim: nothing was written; {out_dir} keeps an earlier complete run")
            elif mark_failed(out_dir, str(e), overrides):
                say(f"kvsim: no results were written to {out_dir} (it holds an INCOMPLETE "
                    f"marker with this error)")
            if not multirun and blocking_file(out_dir) is not None:
                _drop_rejected_run_dir(hc)
            if multirun:
                return str(e)  # the other jobs of the sweep go on; kvsim-collect lists this one
            sys.exit(2)
        except Terminated:
            say(f"kvsim: stopped by SIGTERM; {_interrupted_state(out_dir, before)}")
            sys.exit(143)
        except KeyboardInterrupt:
            say(f"\nkvsim: interrupted; {_interrupted_state(out_dir, before)}")
            sys.exit(130)
        except Exception as e:
            import traceback

            msg = resource_error(e)
            if msg is not None:  # (the machine's: out of memory, a full disk)
                record.info("kvsim: error: %s\n%s", msg, traceback.format_exc())
                marked = not is_complete(out_dir) and _try_mark_failed(out_dir, msg, overrides)
                state = (f"{out_dir} is marked INCOMPLETE with it" if marked else
                         _interrupted_state(out_dir, before))
                say(f"kvsim: error: {msg}; {state}")
                if multirun:
                    return msg
                sys.exit(1)
            # a failure kvsim did not foresee (a bug): the folder is marked failed with it, as
            # for a config error, and the traceback goes to the log and the terminal
            msg = " ".join(f"internal error: {type(e).__name__}: {e}".split())  # (one line)
            record.info("kvsim: %s\n%s", msg, traceback.format_exc())
            if not is_complete(out_dir):
                _try_mark_failed(out_dir, msg, overrides)
            if multirun:
                # the other jobs of the sweep go on; kvsim-collect lists this one as failed
                traceback.print_exc()
                say(f"kvsim: error: {msg} (this job failed; please report it with the "
                    f"traceback)")
                return msg
            say(f"kvsim: error: {msg}; {out_dir} is marked INCOMPLETE with it (please report "
                f"it with the traceback below)")
            raise
        finally:
            if sigterm is not None:
                signal.signal(signal.SIGTERM, sigterm)
        if not multirun:
            # (a sweep job's marks, when a sweep used this folder before: this run replaced
            # its results, and a pointer left in that job's Hydra folder must not lead to them)
            for name in (SWEEP_ID, JOB_CLAIM):
                (out_dir / name).unlink(missing_ok=True)
    finally:
        if lock is not None:
            lock.release()
    cm = summary.get("cost_model") or {}
    for note in cm.get("notes") or []:
        say(f"kvsim: note: {note}")
    if cm.get("kind") == "calibrated" and cm.get("analytic_fallback"):
        why = cm.get("fallback_reasons") or {}
        for term in cm["analytic_fallback"]:
            if term in ALWAYS_ANALYTIC:
                continue
            say(f"kvsim: note: cost.kind=calibrated: {term} uses the operator model's roofline"
                + (f" ({why[term]})" if why.get(term) else ""))
    mem = summary.get("memory_gib") or {}
    if cfg.cache.num_gpu_blocks is not None and mem:
        left = (mem["budget"] - mem["weights"] - mem["activation_reserve"]
                - mem["sliding_window_reserve"])
        per_block = summary["kv_bytes_per_block"] * summary.get("kv_replication", 1) / 2**30
        room = max(int(left // per_block), 0)  # (the blocks sim.hardware.plan_memory sizes)
        n = int(cfg.cache.num_gpu_blocks)
        if n > room:
            say(f"kvsim: note: cache.num_gpu_blocks={n:,} ({mem['kv_pool']:,.1f} GiB of KV) is "
                f"beyond the {room:,} blocks ({max(left, 0.0):,.1f} GiB) that "
                f"{summary.get('gpu')} has room for after weights and reserves (a what-if pool, "
                f"as vLLM's num_gpu_blocks_override; summary.json memory_gib)")
    if summary.get("tiers_preset") not in (None, summary.get("tiers")):
        say(f"kvsim: note: tiers={summary['tiers_preset']} with tiers.host_gib={cfg.tiers.host_gib}"
            f" and tiers.disk_gib={cfg.tiers.disk_gib} runs as {summary['tiers']}")
    if summary.get("tiers") == "gpu_disk":
        say("kvsim: note: with no host tier, offloaded pages are staged through host memory on "
            "their way to disk (bytes_offloaded.host counts those GPU-to-host copies) and disk "
            "hits are read through it")
    if summary.get("codec", "identity") != "identity" and summary.get("tiers") == "gpu_only":
        say(f"kvsim: note: codec={summary['codec']} encodes pages copied below the GPU; with "
            f"no host or disk tier (tiers.host_gib = tiers.disk_gib = 0) it changes nothing")
    from policies.registry import POLICIES, policy_config

    frees = POLICIES[summary.get("policy", "full")].frees_memory  # (full: False)
    if frees and summary.get("rounds") == 0 and summary["requests_finished"]:
        pol = POLICIES[summary["policy"]](policy_config(cfg.policy))
        if pol.budget_scope == "prompt":  # (snapkv, pyramidkv, ada_kv: one round at prefill end)
            pol.num_groups(int(cfg.model.num_kv_heads), int(cfg.model.num_layers))
            thr = pol._min_budget()  # (pyramidkv: its smallest layer budget)
            what = (f"its smallest layer budget, policy.budget / policy.layer_budget_ratio with "
                    f"policy.observation_window as a floor = {thr:,} tokens"
                    if summary["policy"] == "pyramidkv" else f"policy.budget={thr:,} tokens")
            say(f"kvsim: note: policy={summary['policy']} ran no compression round: it "
                f"compresses a prompt once, at prefill end, when the prompt is longer than "
                f"{what}, and no prompt of this trace was (long outputs do not start it; use "
                f"longer prompts or a lower policy.budget)")
        elif hasattr(pol, "_threshold"):  # (the periodic policies: policies.eviction._Periodic)
            thr, beta = pol._threshold(), pol._period()
            first = -(-(thr + 1) // beta) * beta
            what = ("policy.sink_tokens + policy.recent_window" if summary["policy"] ==
                    "streaming_llm" else "policy.budget")
            unit = "decode tokens" if pol.budget_scope == "decode" else "tokens"
            say(f"kvsim: note: policy={summary['policy']} ran no compression round: its first "
                f"round comes at the first multiple of policy.beta={beta} past {what}={thr} "
                f"{unit} ({first:,} {unit}), and no request of this trace reached it before "
                f"it finished (a reasoning trace such as trace=servegen_r1 has long outputs; or "
                f"lower {what} or policy.beta)")
    longest = summary.get("longest_context_tokens")
    if summary.get("policy") == "quest" and longest:
        pol = POLICIES["quest"](policy_config(cfg.policy))
        B = int(cfg.cache.block_size)
        pages = pol.top_k(B)
        if pages * B >= longest - 1:  # (a step reads the KV of all tokens but the last)
            knob = (f"policy.top_k_pages={pages:,}" if pol.cfg.top_k_pages > 0
                    else f"policy.budget={int(pol.cfg.budget):,} tokens")
            say(f"kvsim: note: policy=quest read every page: it reads the top {pages:,} pages "
                f"of {B} tokens per step ({knob}), and no request's context passed that (the "
                f"longest: {longest:,} tokens); it saves reads only on longer contexts (lower "
                f"the budget or use a longer trace)")
    n_cap = (summary.get("rejected_by_reason") or {}).get("kv_capacity", 0)
    if n_cap and frees:
        say(f"kvsim: note: {n_cap:,} request(s) were rejected as kv_capacity: the check counts "
            f"each whole uncompressed sequence (input + output) against the pool and does not "
            f"credit policy={summary['policy']}'s evictions, under which some of them might run")
    if summary.get("ops_rounds_left_out"):
        say(f"kvsim: note: output.write_ops: {summary['ops_rounds_left_out']:,} of "
            f"{summary.get('rounds', 0):,} compaction rounds are not in ops.jsonl: the GPU replay's "
            f"mover is single-group forward packing (compaction=forward_pack, one selection "
            f"group); rounds of several groups or of hole filling are left out")
    disk = summary.get("ops_transfers_left_out") or {}
    if any(disk.values()):
        say(f"kvsim: note: output.write_ops: {disk.get('host_to_disk', 0):,} host-to-disk and "
            f"{disk.get('disk_to_host', 0):,} disk-to-host copies are not in ops.jsonl: the GPU "
            f"replay times GPU-host copies (d2h, h2d) only (summary.json ops_transfers_left_out)")
    over = {k: summary.get(f"ops_{k}_over_limit", 0) for k in ("rounds", "transfers")}
    if any(over.values()):
        say(f"kvsim: note: output.ops_limit={cfg.output.ops_limit}: ops.jsonl holds the first "
            f"{summary['ops_rounds_written']:,} compaction rounds and "
            f"{summary['ops_transfers_written']:,} host copies; {over['rounds']:,} rounds and "
            f"{over['transfers']:,} copies past the limit are left out (raise output.ops_limit "
            f"to replay more)")
    for n in inert_override_notes(overrides, str(cfg.trace.format), summary.get("tiers", "gpu_only"),
                                  str(cfg.cost.kind), str(summary.get("policy", "full")),
                                  str(summary.get("compaction", "none")),
                                  str(summary.get("codec", "identity"))):
        say(f"kvsim: note: {n}")
    if summary["requests_finished"] == 0:
        say(f"kvsim: warning: no request finished: all {summary['requests_rejected']:,} were "
            f"rejected ({', '.join(f'{k}: {v:,}' for k, v in summary['rejected_by_reason'].items())})")
    for w in summary.get("trace_warnings") or []:
        if not w.endswith("(on_error=skip)"):  # the skipped rows get their own line below
            say(f"kvsim: warning: trace {summary['trace']}: {w}")
    skipped = (summary.get("trace_skipped_rows") or {}).get("count", 0)
    if skipped:
        ex = (summary["trace_skipped_rows"].get("examples") or [""])[0]
        # (counted over the whole file, which a slice may not reach: traces.loader says so)
        scope = next((w[:w.index("): ") + 1] for w in summary.get("trace_warnings") or []
                      if w.endswith("(on_error=skip)") and w.startswith("in the whole ")),
                     None)
        say(f"kvsim: warning: trace.on_error=skip skipped {skipped} bad "
            f"row{'s' * (skipped != 1)}{' ' + scope if scope else ''} (first: {ex}); "
            f"see summary.json trace_skipped_rows")
    table = format_summary(summary)
    # (a log file's or a pipe's width: 110 columns, or the title's when longer, so that it
    # stays on one line; a terminal narrower than the title wraps it)
    wide = max(110, len(str(table.title)))
    if record.handlers:
        import io

        buf = io.StringIO()
        Console(file=buf, width=wide, color_system=None).print(table)
        record.info("summary\n%s", buf.getvalue().rstrip())
    record.info("results: %s", os.path.abspath(out_dir))
    if cfg.output.print_summary:
        # (rich fits a table to 80 columns when stdout is not a terminal, cutting the labels
        # of a sweep's, a pipe's or a CI log's table: those get the log file's width)
        Console(stderr=False, width=None if sys.stdout.isatty() else wide).print(table)
    # (without the table too: where the run went)
    write_line(sys.stdout, f"results: {os.path.abspath(out_dir)}")


def _shared_output_dir_error(cfg, other) -> str:
    """The error of a sweep job whose ``output.dir`` is claimed by ``other``: a job number of
    its own sweep, or the line naming a job of another sweep that still runs."""
    if isinstance(other, str) and other != "another":
        return (f"output.dir={cfg.output.dir} holds the results of {other}; expected a folder "
                f"per job that no running sweep uses (wait for that sweep to end, or pick "
                f"another output.dir)")
    return (f"output.dir={cfg.output.dir} is also the output folder of job {other} of this "
            f"multirun; expected a folder per job, e.g. output.dir=results/${{hydra:job.num}} "
            f"(or no output.dir: each job writes its own Hydra job folder)")


def _try_mark_failed(out_dir: Path, msg: str, overrides: list[str]) -> bool:
    """:func:`mark_failed`, False when the marker cannot be written (a full disk: the
    run's in-progress marker stays)."""
    try:
        return mark_failed(out_dir, msg, overrides)
    except OSError:
        return False


def _summary_stamp(out_dir: Path):
    """``out_dir``'s summary.json as (inode, size, mtime ns), None when there is none."""
    try:
        st = (out_dir / "summary.json").stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def _interrupted_state(out_dir: Path, before) -> str:
    """What the results folder ``out_dir`` holds after a single run was stopped (Ctrl-C,
    SIGTERM), for its closing line: this run's complete results (stopped after writing them),
    an earlier complete run (stopped before touching it; ``before``: the summary's
    :func:`_summary_stamp` when the run started), this run's INCOMPLETE marker, or nothing."""
    from .run import MARKER, is_complete

    if is_complete(out_dir):
        if _summary_stamp(out_dir) != before:
            return f"this run had completed: its results in {out_dir} are complete"
        return f"nothing was written; {out_dir} keeps an earlier complete run"
    if (out_dir / MARKER).exists():
        return f"{out_dir} is marked INCOMPLETE (no summary.json)"
    return f"nothing was written to {out_dir}"


def mark_failed(out_dir: Path, msg: str, overrides: list[str]) -> bool:
    """Mark the results folder ``out_dir`` failed with ``msg`` (one line): its INCOMPLETE
    marker holds the error and the run's overrides (``sim.folders.failure_marker``), which
    kvsim-collect lists. False, writing nothing, where ``out_dir`` or a folder above it is a
    file."""
    from .folders import failure_marker
    from .run import MARKER

    if blocking_file(out_dir) is not None:
        return False
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).write_text(failure_marker(msg, overrides))
    return True


from .folders import JOB_CLAIM  # noqa: E402 (in a multirun job's output.dir)


def read_claim(out_dir: Path) -> tuple[str, str, Path | None] | None:
    """The claim a multirun job left in its ``output.dir`` ``out_dir``: (sweep id, job number,
    the sweep's folder, None in a claim of a kvsim that did not record it), or None."""
    try:
        words = (out_dir / JOB_CLAIM).read_text().split(maxsplit=2)
    except OSError:
        return None
    if len(words) < 2:
        return None
    return words[0], words[1], Path(words[2].strip()) if len(words) == 3 else None


def running_sweep_claim(out_dir: Path, sweep_dir: Path | None = None) -> str | None:
    """When ``out_dir`` is claimed by a job of a sweep that still runs (its process holds its
    sweep folder, :func:`sim.sweep.sweep_running`) other than the sweep into ``sweep_dir``:
    ``"job N of the sweep running into DIR"``; else None."""
    from .sweep import sweep_running

    held = read_claim(out_dir)
    if held is None or held[2] is None:
        return None
    if sweep_dir is not None:
        try:
            if held[2].resolve() == Path(sweep_dir).resolve():
                return None
        except OSError:
            pass
    return f"job {held[1]} of the sweep running into {held[2]}" if sweep_running(held[2]) \
        else None


def claim_output_dir(out_dir: Path, sweep_id: str, job: int,
                     sweep_dir: Path | None = None) -> int | str | None:
    """Claim ``out_dir`` (which this job holds, :func:`sim.run.hold_output_dir`) for job
    ``job`` of the multirun ``sweep_id`` running into ``sweep_dir``. None when it is this job's
    now (claimed now, by this job earlier, or by an earlier sweep that no longer runs); else
    the number of the job of this sweep that holds it, or the line naming a job of another
    sweep that still runs (:func:`running_sweep_claim`), whose results this job would
    replace."""
    out_dir.mkdir(parents=True, exist_ok=True)
    held = read_claim(out_dir)
    if held is not None and held[0] == sweep_id:
        if held[1] == str(job):
            return None
        return int(held[1]) if held[1].isdigit() else "another"
    other = running_sweep_claim(out_dir, sweep_dir)
    if other is not None:
        return other
    tmp = out_dir / f"{JOB_CLAIM}.tmp"  # (this job holds the folder: no other writer)
    tmp.write_text(f"{sweep_id} {job} {Path(sweep_dir).resolve() if sweep_dir else ''}".rstrip())
    os.replace(tmp, out_dir / JOB_CLAIM)
    return None


def unknown_override_key(args: list[str]) -> str | None:
    """The error for the first command-line override ``a.b=value`` whose dotted key is not a
    field of the typed config (:class:`sim.config.KvsimConfig`), with the closest field name
    as a hint, or whose plain value cannot be that field's int, float or bool
    (:func:`_scalar_error`); None when every override passes. Hydra's own forms
    (``+``/``~``/``++`` prefixes, ``hydra.*``, options with ``-``) and free-form nodes are left
    to Hydra. Hydra's message for
    such a key suggests appending it with ``+``, which a typo does not want."""
    import dataclasses
    import difflib
    import typing

    from .config import KvsimConfig

    def node_type(t):
        if typing.get_origin(t) is typing.Union:  # Optional[X]
            t = next((a for a in typing.get_args(t) if a is not type(None)), t)
        return t if dataclasses.is_dataclass(t) else None

    for a in args:
        if a.startswith("-") or "=" not in a:
            continue
        key = a.split("=", 1)[0]
        if key.startswith("++"):  # (set, added if absent: an existing key is checked as one)
            key, a = key[2:], a[2:]
        if key.startswith(("+", "~", "hydra.", "hydra/")) or "@" in key or "/" in key:
            continue
        cls = KvsimConfig
        parts = key.split(".")
        for i, part in enumerate(parts):
            hints = typing.get_type_hints(cls)
            if part not in hints:
                where = ".".join(parts[:i])
                close = difflib.get_close_matches(part, list(hints), n=1)
                hint = f"; did you mean {'.'.join(parts[:i] + close)}?" if close else ""
                return (f"unknown config key '{key}': {where or 'the config'} has no field "
                        f"'{part}'{hint} (kvsim --cfg job prints every key)")
            cls = node_type(hints[part])
            if cls is None:  # a leaf or a free-form node: Hydra checks the rest
                if i == len(parts) - 1:
                    value = a.split("=", 1)[1]
                    err = _scalar_error(key, value, hints[part])
                    if err:
                        return err
                    sweepish = "," in value or value.strip().startswith(("choice(", "range("))
                    for v in (_sweep_values(a) or []) if sweepish else []:
                        v = getattr(v, "text", v)  # (a quoted value: Hydra's QuotedString)
                        if isinstance(v, (str, int, float)):
                            err = _scalar_error(key, str(v), hints[part])
                            if err:
                                return (f"{key}={value}: the sweep's value {v}: expected "
                                        f"{err.split(': expected ', 1)[1]}")
                break
    return None


# kvsim's cluster launcher configs (experiments/conf/hydra/launcher/) -> (Hydra plugin module,
# the extra that installs it)
LAUNCHER_PLUGINS = {"slurm": ("hydra_plugins.hydra_submitit_launcher", "slurm"),
                    "ray_cluster": ("hydra_plugins.hydra_ray_launcher", "ray")}


def missing_launcher_plugin(args: list[str]) -> str | None:
    """The error for ``hydra/launcher=slurm`` or ``=ray_cluster`` when the Hydra plugin it
    extends is not installed (Hydra's own message names a config it cannot load, exit 1), with
    the ``pip install`` that adds it; None otherwise."""
    import importlib.util

    for a in args:
        if a.lstrip("+").startswith("hydra/launcher="):
            name = a.split("=", 1)[1]
            if name in LAUNCHER_PLUGINS:
                mod, extra = LAUNCHER_PLUGINS[name]
                try:
                    found = importlib.util.find_spec(mod) is not None
                except ModuleNotFoundError:  # (the hydra_plugins namespace itself is absent)
                    found = False
                if not found:
                    return (f"{a}: its Hydra plugin ({mod}) is not installed; expected "
                            f"pip install -e '.[{extra}]' in this environment first")
    return None


def missing_cluster(args: list[str]) -> str | None:
    """The error for a sweep with ``hydra/launcher=slurm`` on a host where SLURM's ``srun``
    is not on the PATH (submitit ends with a traceback: Could not detect "srun"); None
    otherwise."""
    import shutil

    for a in args:
        if a.lstrip("+").startswith("hydra/launcher=") and a.split("=", 1)[1] == "slurm" \
                and shutil.which("srun") is None:
            return (f"{a}: this host has no SLURM (srun is not on the PATH); expected to run "
                    f"the sweep on a SLURM login node, or on this machine with "
                    f"hydra/launcher=local")
    return None


def unknown_group_option(args: list[str]) -> str | None:
    """The error for the first ``group=option`` override (``trace=``, ``model=``, ...; a comma
    sweep of plain names too) naming an option that ``experiments/conf/<group>/`` lacks, with
    the closest option as a hint and the list (Hydra's own message is a page of its search path
    and exit 1); None when every option exists. Hydra's sweep functions, interpolations,
    ``hydra/...`` groups and runs given other config folders (``--config-dir``,
    ``hydra.searchpath``) are left to Hydra."""
    import difflib

    if any(a.startswith(("--config-dir", "-cd", "--config-path", "-cp", "hydra.searchpath",
                         "+hydra.searchpath")) for a in args):
        return None  # (options may come from the other config folders: Hydra decides)
    for a in args:
        if a.startswith(("-", "~")) or "=" not in a:
            continue
        key, value = a.split("=", 1)
        group = key.lstrip("+")
        if "." in group or "/" in group or "@" in group or not (CONF_DIR / group).is_dir():
            continue
        if any(c in value for c in "${}[]()'\" /") or value.startswith(("choice", "range", "glob")):
            # (sweep functions, interpolations, quoting, nested option paths: Hydra's)
            continue
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        for v in value.split(","):
            if v and v not in options:
                close = difflib.get_close_matches(v, options, n=1)
                hint = f"did you mean {group}={close[0]}? " if close else ""
                return (f"{a}: no option {v!r} in config group '{group}'; {hint}"
                        f"(options: {', '.join(options)})")
    return None


def duplicate_override_key(args: list[str]) -> str | None:
    """The error for the first override key given twice on the command line (``seed=1
    seed=2``, ``tiers=gpu_host tiers=gpu_only``): Hydra silently keeps the last value, which
    hides a typo or a sweep written as two overrides; or for a ``~key`` deletion of a kvsim
    setting (every one is typed and needed: Hydra failed with a traceback or exit 1). None when
    every key appears once. ``+``/``++`` prefixes count as the same key; options and
    ``~hydra...`` deletions are left to Hydra."""
    seen: dict[str, str] = {}
    for a in args:
        if a.startswith("~") and not a.startswith(("~hydra.", "~hydra/")):
            key = a[1:].split("=", 1)[0]
            return (f"cannot delete config key '{key}' ({a}): every kvsim setting needs a value; "
                    f"expected an override that sets it ({key}=...)")
        if a.startswith(("-", "~")) or "=" not in a:
            continue
        key = a.split("=", 1)[0].lstrip("+")
        if key in seen:
            v1, v2 = seen[key].split("=", 1)[1], a.split("=", 1)[1]
            both = ("" if "(" in v1 + v2 else  # (a comma list cannot hold range() or choice())
                    f" (for a sweep over both: kvsim -m {key}={v1},{v2})")
            return (f"override key '{key}' given twice ({seen[key]}, {a}); expected one value "
                    f"per key{both}")
        seen[key] = a
    return None


def unresolvable_interpolation(cfg: DictConfig, overrides: list[str]) -> str | None:
    """The error for the first ``${...}`` interpolation of the composed run config ``cfg`` that
    cannot be resolved (``cache.block_size=${nope}``: no such key; an unknown resolver; an
    unset environment variable), naming the override that set it when one did (``overrides``:
    the command line's, as given; :func:`sim.callbacks.interpolation_error`); None when all
    resolve. Hydra ended with a traceback from OmegaConf otherwise. (The folders Hydra makes
    before the job runs are checked by :class:`sim.callbacks.FailedRunsExit`.)"""
    from .callbacks import first_unresolvable, interpolation_error

    found = first_unresolvable(cfg)
    return None if found is None else interpolation_error(found[0], found[1], overrides)


def command_line_overrides(argv: list[str]) -> list[str]:
    """The overrides among the command's arguments, as Hydra's own argument parser separates
    them from its options and their values (``--config-dir DIR``, ``--cfg job``, ``--info
    config``); none for shell completion (``-sc install=bash``: Hydra's, not overrides) or
    arguments Hydra's parser rejects (Hydra prints its usage error)."""
    from hydra._internal.utils import get_args_parser

    import contextlib
    import io

    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            ns = get_args_parser().parse_args(argv)
    except SystemExit:  # (--version, or an option Hydra's parser rejects: Hydra says so)
        return []
    return [] if ns.shell_completion else list(ns.overrides)


def unparsable_override(args: list[str], sweep: bool = True, single: bool | None = None) -> str | None:
    """The error for the first ``key=value`` argument Hydra's override grammar cannot parse
    (``cache.block_size=16,,32``; an unquoted ``~``, or a character outside ASCII, in a path),
    or, in a ``sweep``, ``hydra.launcher.n_jobs`` 0 (joblib ends with a traceback), with how to
    write it; None when every one parses. Hydra exits 1 with its grammar error otherwise.
    ``args``: the overrides (:func:`command_line_overrides`); arguments without ``=`` are left
    to Hydra. ``single`` (default: not ``sweep``): a single run, where a sweep's values are an
    error (:func:`_sweep_problem`)."""
    import re

    from hydra.core.override_parser.overrides_parser import OverridesParser

    if single is None:
        single = not sweep
    sweeper = not any(a.lstrip("+").startswith("hydra/sweeper=") for a in args)
    parser = None
    for a in args:
        if a.startswith("-") or "=" not in a:
            continue
        key, value = a.split("=", 1)
        parser = parser or OverridesParser.create()
        try:
            o = parser.parse_override(a)
            if sweep and key.lstrip("+") == "hydra.launcher.n_jobs" and not o.is_sweep_override() \
                    and re.fullmatch(r"[+-]?0+", str(o.value()).strip()):
                return (f"{a}: joblib cannot run a sweep on 0 workers; expected a positive count, "
                        f"or -1 for every core")
            bad = _sweep_problem(a, o, single, sweeper)
            if bad is not None:
                return bad
        except Exception as e:  # noqa: BLE001 - (Hydra's grammar errors have several types)
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            odd = [c for c in value if c == "~" or c == " " or not c.isascii()]
            hint = ("; expected range(start, stop) or range(start, stop, step), step not 0"
                    if value.strip().startswith("range(") and not odd else
                    f"; a value with {odd[0]!r} needs quotes inside the argument: "
                    f"\"{key}='{value}'\"" if odd and "'" not in value else
                    f"; a value with {odd[0]!r} needs quotes inside the argument (Hydra's quoted "
                    f"string, key='...', with \\' for a quote in it)" if odd else
                    "; a sweep's values are separated by single commas (key=a,b,c), and a value "
                    "with Hydra's special characters needs quotes: \"key='a,b'\"")
            return f"{a}: not an override Hydra can parse ({why}){hint}"
    return None


def _sweep_problem(arg: str, o, single: bool, basic_sweeper: bool = True) -> str | None:
    """The error for the parsed override ``o`` (``arg`` as given) when it is a sweep that Hydra
    would end with a traceback or a usage error: several values in a ``single`` run (Hydra's
    "Ambiguous value"), a comma list holding a ``range()`` / ``choice()`` / ``glob()``
    (Hydra's sweeper failed on it), a ``range()`` with step 0 or no values (0 jobs, exit 0),
    or, with Hydra's basic sweeper (``basic_sweeper``: no ``hydra/sweeper=`` override), an
    ``interval()``, which only a sampling sweeper takes; None otherwise."""
    from hydra.core.override_parser.types import ChoiceSweep, Glob, IntervalSweep, RangeSweep, Sweep

    if not o.is_sweep_override():
        return None
    if single:
        return (f"{arg}: a sweep (several values) runs with kvsim -m, one job per value; "
                f"expected kvsim -m {arg} ..., or a single value (a value holding commas is "
                f"quoted: key='a,b')")
    v = o.value()
    if isinstance(v, IntervalSweep) and basic_sweeper:
        return (f"{arg}: interval() is sampled by a sampling sweeper (hydra/sweeper=optuna, "
                f"nevergrad), not Hydra's basic sweeper, which runs listed values; expected "
                f"range(), choice() or a comma list")
    if isinstance(v, ChoiceSweep) and any(isinstance(x, (Sweep, Glob)) for x in v.list):
        return (f"{arg}: a sweep's comma list cannot hold range(), choice(), interval() or "
                f"glob(); expected one of them alone, or the values listed: key=1,2,5")
    if isinstance(v, RangeSweep):
        try:
            first = _range_values(o, 1)
        except ValueError as e:
            return f"{arg}: {e}; expected range(start, stop) or range(start, stop, step), step not 0"
        if not first:
            return (f"{arg}: the range has no values (it stops before its first); expected "
                    f"start < stop for a positive step (start > stop for a negative one)")
    return None


def _sweep_values(arg: str) -> list | None:
    """The values of a comma-separated sweep override (``seed=1,2,3``) or of a ``range(...)``
    sweep (its first 1,000), or None when ``arg`` is neither (a single value, ``glob(...)``, a
    list, or not parsable)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    try:
        o = OverridesParser.create().parse_override(arg)
        v = o.value()
    except Exception:  # noqa: BLE001 - (unparsable_override reports those)
        return None
    if isinstance(v, RangeSweep):  # (_sweep_problem reports step 0)
        try:
            return _range_values(o, 1000)
        except ValueError:
            return None
    return list(v.list) if isinstance(v, ChoiceSweep) else None


def _range_values(o, limit: int) -> list:
    """The first ``limit`` values of the parsed ``range(...)`` override ``o``, as Hydra's
    sweeper lists them (ValueError for step 0)."""
    import itertools

    return list(itertools.islice(o.sweep_iterator(), limit))


def _scalar_error(key: str, value: str, t) -> str | None:
    """The error for a plain value that cannot become the int / float / bool field ``key`` of
    type ``t`` (Optional allowed), or None. Sweeps, interpolations, Hydra functions, lists and
    ``null`` are left to Hydra."""
    import re
    import typing

    if typing.get_origin(t) is typing.Union:
        t = next((a for a in typing.get_args(t) if a is not type(None)), t)
    v = value.strip()
    if t not in (int, float, bool) or not v or v.lower() == "null" or \
            any(c in v for c in ",${}[]()'\"") or v.startswith(("choice", "range", "interval")):
        return None
    if t is bool:
        ok = v.lower() in ("true", "false", "yes", "no", "y", "n", "on", "off", "1", "0")
        want = "true or false"  # (OmegaConf also takes yes/no, on/off, 1/0)
    elif t is int:
        ok = re.fullmatch(r"[+-]?[0-9][0-9_]*", v) is not None
        want = "an integer"
    else:
        try:
            float(v.replace("_", ""))
            ok = True
        except ValueError:
            ok = False
        want = "a number"
    return None if ok else f"{key}={value}: expected {want}"


def main() -> None:
    """Console-script entry point (config and trace errors exit with status 2, one clear line)."""
    import signal

    if hasattr(signal, "SIGPIPE"):  # `kvsim --help | head` ends quietly, as Unix tools do
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    argv = sys.argv[1:]
    # a log file that cannot be written (a full disk) is not worth a traceback per line: the
    # run's own error says what happened
    logging.raiseExceptions = False
    import re

    dash_m = any(a in ("-m", "--multirun") for a in argv)
    # a multirun: -m, or Hydra's other spelling, the override hydra.mode=MULTIRUN
    sweep = dash_m or any(re.fullmatch(r"\+*hydra\.mode=['\"]?multirun['\"]?", a, re.IGNORECASE)
                          for a in argv)
    # options that print something instead of running (sweep values are Hydra's to report)
    info = any(a in ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "-sc",
                     "--shell-completion") or a.startswith(("--cfg=", "--info="))
               for a in argv)
    if dash_m and any(a in ("--cfg", "-c") or a.startswith("--cfg=") for a in argv):  # (Hydra's traceback)
        print("kvsim: error: -m runs a sweep and --cfg prints one run's config; expected one of "
              "them (kvsim --cfg job KEY=VALUE ... prints a run's config)", file=sys.stderr)
        sys.exit(2)
    if sweep:
        # a sweep stopped by SIGTERM stops as on Ctrl-C: the launcher ends its workers (they
        # were left running, orphaned, finishing jobs into folders a resumed sweep reruns)
        signal.signal(signal.SIGTERM, _on_sweep_sigterm)
    args = command_line_overrides(argv)
    # (unknown_group_option reads the options too: with another config folder it checks nothing)
    err = unparsable_override(args, sweep, single=not sweep and not info) or \
        duplicate_override_key(args) or \
        (unknown_group_option(argv) if args else None) or unknown_override_key(args) or \
        missing_launcher_plugin(args) or (missing_cluster(args) if sweep and not info else None)
    if err is not None:
        print(f"kvsim: error: {err}", file=sys.stderr)
        sys.exit(2)
    if not sweep:
        app()
        return
    try:
        app()
    except KeyboardInterrupt as e:
        how = "SIGTERM" if str(e) == "SIGTERM" else "Ctrl-C"
        print(f"\nkvsim: sweep stopped ({how}); its unfinished jobs are marked INCOMPLETE; the "
              f"same command with output.skip_completed=true runs only those", file=sys.stderr)
        sys.exit(143 if how == "SIGTERM" else 130)


if __name__ == "__main__":
    main()
