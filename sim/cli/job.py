"""The ``kvsim`` run command: Hydra's job function (:func:`app`), which simulates one config
into its results folder (:func:`_run`) and, in a sweep, records the job's outcome in the
sweep's ledger. Config and trace errors are one ``kvsim: error:`` line and exit status 2 (a
sweep's job returns its line instead); the folder a failed run leaves is marked ``INCOMPLETE``
with the error (:func:`mark_failed`), except a single run's folder that the run made and that
holds nothing of a simulation (:func:`sim.callbacks.remove_new_run_folder` removes it)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from .. import hydra_record
from ..config import REJECTED_RUN_PREFIX, register_configs
from ..console import resource_error, write_line
from ..folders import JOB_CLAIM, RUN_LOCK, blocking_file
from .claims import claim_output_dir, read_claim, running_sweep_claim, sweep_results_claim
from .overrides import unresolvable_interpolation
from .report import format_summary, run_notes

log = logging.getLogger("kvsim")


def _run_record(away_from: Path | None = None) -> logging.Logger:
    """A logger that writes only to the job's log files (Hydra's ``cli.log`` in the run
    folder), not to the console: the run's record, beside what ``kvsim`` prints. With
    ``away_from`` (a folder this run must not write: another run holds it), the log files in
    that folder are left out."""
    rec = logging.getLogger("kvsim.record")
    rec.propagate = False
    rec.setLevel(logging.INFO)
    for h in list(rec.handlers):
        rec.removeHandler(h)
    for h in logging.getLogger().handlers:
        if isinstance(h, logging.FileHandler) and not (
                away_from is not None and _same_folder(Path(h.baseFilename).parent, away_from)):
            rec.addHandler(h)
    return rec


register_configs()
hydra_record.install()  # (Hydra's .hydra/ record of a job: whole or not at all, sim.hydra_record)


def _bad_output_dir(out: Path, job_dir: Path, blocked: bool = False) -> str | None:
    """Why ``output.dir`` = ``out`` cannot take a run's results: a folder holding files that
    are not a kvsim run's (:func:`sim.folders.foreign_folder`; the job's own Hydra folder
    ``job_dir`` aside, where ``hydra.run.dir`` puts it inside ``out``), one that cannot be
    created or written, or, with ``blocked`` (a sweep's job, which makes the folder before
    simulating), a file in the way; None when it can (a single run's
    :func:`sim.run.run_simulation` names a file in the way)."""
    from ..folders import blocked_folder, foreign_folder, uncreatable_folder

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


# the results folder of this process's single run once its results are complete (written, or
# skipped as complete): a Ctrl-C after that leaves a complete run (interrupted_outside_run)
completed_run: Path | None = None


def interrupted_outside_run(overrides: list[str], how: str = "Ctrl-C") -> tuple[str, int]:
    """What a single run stopped by Ctrl-C or SIGTERM (``how``) outside the simulation itself
    (while Hydra composes the config and makes the run folder, before the run took its folder,
    or while the summary is printed) leaves, and the exit status: ``("the run had completed: ...", 0)`` once its
    results are complete (:data:`completed_run`: a run whose results and summary are written
    is complete); otherwise status 130 and nothing written, an earlier complete run kept, or
    the run folder Hydra made (the folder of its log file, ``cli.log``) marked INCOMPLETE with
    the run's ``overrides`` (the command line's): it would otherwise be a run folder without
    results or marker. Hydra's temporary folder of a rejected ``output.dir`` is removed. The
    status of a run stopped before it completed is 130 for Ctrl-C, 143 for SIGTERM."""
    import shutil

    from ..folders import MARKER, RUN_LOCK, failure_marker, is_complete, run_overrides
    from ..locks import held_by_another

    stopped = 143 if how == "SIGTERM" else 130
    if completed_run is not None:
        return f"the run had completed: its results in {completed_run} are complete", 0
    logs = [Path(h.baseFilename).parent for h in logging.getLogger().handlers
            if isinstance(h, logging.FileHandler)]
    if not logs:  # (Hydra had not opened the run's log, in the folder it makes first)
        return "nothing was run or written", stopped
    out = logs[0]
    if out.name.startswith(REJECTED_RUN_PREFIX):
        logging.shutdown()
        shutil.rmtree(out, ignore_errors=True)
        return "nothing was run or written", stopped
    if not out.is_dir() or held_by_another(out / RUN_LOCK):
        return f"nothing was written to {out}", stopped
    if is_complete(out):
        return f"nothing was written; {out} keeps an earlier complete run", stopped
    if not (out / MARKER).exists():
        try:
            (out / MARKER).write_text(failure_marker(
                "interrupted (Ctrl-C) before the run started" if how == "Ctrl-C"
                else "stopped by SIGTERM before the run started", run_overrides(overrides)))
        except OSError:
            return f"{out} holds no results (it could not be marked INCOMPLETE)", stopped
    return f"{out} is marked INCOMPLETE (no summary.json)", stopped


def _completed(out_dir: Path) -> None:
    global completed_run
    completed_run = out_dir


class Terminated(KeyboardInterrupt):
    """SIGTERM during a single run (``kill``, a scheduler's time limit): handled as Ctrl-C is,
    with its own message and exit status 143."""


def _on_sigterm(signum, frame):
    raise Terminated("SIGTERM")


@hydra.main(version_base="1.3", config_path="../../experiments/conf", config_name="config")
def app(cfg: DictConfig) -> None:
    """Hydra entry point: simulate ``cfg`` into the Hydra run directory (:func:`_run`). A
    sweep's job also records its outcome in the sweep's job ledger (:mod:`sim.sweep`), and a
    worker process of a local sweep ends when the sweep's process is gone
    (:func:`sim.sweep.end_with_sweep`). A sweep job that failed where neither the ledger nor
    its folder can record it (a full disk) raises :class:`sim.sweep.UnrecordedJobFailure`:
    Hydra's sweeper ends the sweep with its one line, exit status 1."""
    from hydra.types import RunMode

    # a log file that cannot be written (a full disk) is not worth a traceback per line, also
    # in a sweep's worker processes, which do not run the console script: the job's own error
    # says what happened
    logging.raiseExceptions = False
    hc = HydraConfig.get()
    # Hydra's .hydra/ record of this job, when one of its files could not be written
    record_failed = None if hc.output_subdir is None else hydra_record.take_failure(
        Path(hc.runtime.output_dir) / str(hc.output_subdir))
    if hc.mode != RunMode.MULTIRUN:
        _run(cfg, hc, multirun=False, record_failed=record_failed)
        return
    from .. import sweep as S
    from ..folders import SWEEP_ID

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

    from ..callbacks import input_files_or_unknown, trace_input
    from ..folders import config_fingerprint, run_overrides
    from ..errors import OutputDirBusy
    from ..run import altered_results, hold_output_dir, is_complete, run_simulation

    from omegaconf import OmegaConf

    # the overrides as given (an interpolation in one is not resolved here)
    task = [str(o) for o in OmegaConf.to_container(hc.overrides.task, resolve=False)]
    # (a sweep's job: its swept values are not in the config the Hydra callback checked, nor
    # its config files, and another sweeper than Hydra's basic one picks values as it goes)
    bad = unresolvable_interpolation(cfg, task)
    if bad is None and multirun:
        from ..validation import non_boolean_config_value, non_boolean_override

        bad = non_boolean_override(task) or non_boolean_config_value(hc.job.config_name, task)
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
            from ..cost import CALIBRATION_DIR

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
        if not cfg.output.skip_completed:
            return False
        if is_complete(out_dir, overrides, trace_input(cfg.trace), input_files_or_unknown(cfg),
                       run_fp):
            return True
        why = altered_results(out_dir)
        if why is not None:
            write_line(sys.stderr, f"kvsim: note: output.skip_completed: {out_dir} is run "
                                   f"again: {why}")
        return False

    def skipped() -> None:
        if not multirun:
            _completed(out_dir)
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
            from ..folders import failure_marker

            job_dir.mkdir(parents=True, exist_ok=True)
            (job_dir / "INCOMPLETE").write_text(failure_marker(bad, overrides))
            return bad
        _drop_rejected_run_dir(hc)
        sys.exit(2)
    from ..folders import RESULTS_POINTER, SWEEP_ID, failure_marker

    sweep_dir = None
    if multirun:
        sweep_dir = Path(hc.sweep.dir)
        if not sweep_dir.is_absolute():  # (hydra.job.chdir=true: the job runs in its folder)
            sweep_dir = Path(hc.runtime.cwd) / sweep_dir

    def refuse(msg: str, status: int = 2) -> str:
        """Report this job's failure before it wrote anything into ``out_dir`` (another
        process's folder): on stderr, in the job's log when that is not in ``out_dir`` and, in
        a sweep, in the job's own folder when that is not ``out_dir``; a single run exits
        (removing Hydra's temporary run folder, :func:`sim.config._run_dir`)."""
        print(f"kvsim: error: {msg}", file=sys.stderr)
        _run_record(away_from=out_dir).info("kvsim: error: %s", msg)  # (the job's cli.log)
        if not multirun:
            _drop_rejected_run_dir(hc)
            sys.exit(status)
        if not _same_folder(job_dir, out_dir):  # (the sweep's failure report lists it)
            try:
                job_dir.mkdir(parents=True, exist_ok=True)
                (job_dir / "INCOMPLETE").write_text(failure_marker(msg, overrides))
            except OSError:
                pass  # (the sweep's job ledger still has it)
        return msg

    if not multirun:  # (before its lock: the refused run writes nothing into the job's folder)
        other = sweep_results_claim(out_dir)
        if other is not None:
            refuse(f"output.dir={out_dir} holds the results of {other}; a single run would "
                   f"replace them and kvsim-collect would take its results for that job's; "
                   f"expected a folder of no sweep (pick another output.dir; a sweep run "
                   f"again with output.skip_completed=true reruns only its missing jobs)")
    try:  # the results folder is this run's until it ends: no other run writes it meanwhile
        # (a file in its way: run_simulation's error names it)
        lock = hold_output_dir(out_dir, None if cfg.output.dir else f"the run folder {out_dir}") \
            if blocking_file(out_dir) is None else None
    except OutputDirBusy as e:
        mine = read_claim(out_dir) if multirun else None
        sid = (sweep_dir / SWEEP_ID).read_text().strip() if multirun and \
            (sweep_dir / SWEEP_ID).is_file() else None
        if mine is not None and mine[0] == sid and mine[1] != str(hc.job.num):
            return refuse(_shared_output_dir_error(
                cfg, int(mine[1]) if mine[1].isdigit() else "another"))
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

        from ..errors import ConfigError

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
            if not multirun:
                _completed(out_dir)
            _drop_earlier_logs(log_starts)
        except (ConfigError, TraceError) as e:
            say(f"kvsim: error: {e}")
            if not multirun:
                # a single run into a folder it made, stopped before its simulation began (no
                # marker: run_simulation writes it once every check passed), the folder
                # holding only Hydra's record and log: nothing is left behind, the error line
                # says what went wrong
                from .. import callbacks

                debris = {RUN_LOCK, f"{hc.job.name}.log"}
                if hc.output_subdir is not None and not Path(str(hc.output_subdir)).is_absolute():
                    debris.add(Path(str(hc.output_subdir)).parts[0])
                if callbacks.remove_new_run_folder(out_dir, debris,
                                                   None if lock is None else lock.release):
                    sys.exit(2)
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
        except KeyboardInterrupt as e:  # (Ctrl-C, or SIGTERM: Terminated)
            how = "kvsim: stopped by SIGTERM" if isinstance(e, Terminated) else \
                "\nkvsim: interrupted"
            if is_complete(out_dir) and _summary_stamp(out_dir) != before:
                # (its results and summary were written: the run is complete)
                say(f"{how} after the run completed; its results in {out_dir} are complete")
                write_line(sys.stdout, f"results: {os.path.abspath(out_dir)}")
                sys.exit(0)
            if out_dir.is_dir() and not is_complete(out_dir) and not (out_dir / "INCOMPLETE").exists():
                # (stopped before the simulation marked its folder: its log is there)
                _try_mark_failed(out_dir, f"{how.strip()[7:]} before the simulation started",
                                 overrides)
            say(f"{how}; {_interrupted_state(out_dir, before)}")
            sys.exit(143 if isinstance(e, Terminated) else 130)
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
    for line in run_notes(summary, cfg, overrides):
        say(line)
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
    from ..folders import MARKER, is_complete

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
    from ..folders import failure_marker
    from ..folders import MARKER

    if blocking_file(out_dir) is not None:
        return False
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).write_text(failure_marker(msg, overrides))
    return True
