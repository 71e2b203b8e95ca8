"""Hydra callbacks of the ``kvsim`` command.

:class:`FailedRunsExit` makes a multirun whose jobs were rejected (bad config or trace: the CLI
marks the job directory ``INCOMPLETE`` with the error) end with exit status 2 and one line per
failed job, instead of status 0: a sweep script or CI job then sees the failure. The other jobs
still ran (Hydra launchers run every job of a sweep).

Each multirun also gets an id (``on_multirun_start`` writes it to ``<sweep dir>/.kvsim_sweep_id``;
every job copies it into its own directory): a sweep re-run into the same directory with a smaller
grid leaves the earlier sweep's extra job directories behind, and kvsim-collect and the failure
report skip job directories holding another sweep's id.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from hydra.experimental.callback import Callback

from .console import resource_error, write_line
from .folders import (FAILED_PREFIX, RESULTS_POINTER, SWEEP_ID, config_fingerprint, run_overrides,
                      stale_job)


_UNKNOWN = object()  # (is_complete then finds no finished run to skip: the run goes ahead)

# a single run's folder (hydra.run.dir, absolute) when this process made it, and the highest
# folder of its path made with it (the folder itself, or the first of its parents made:
# outputs/ or outputs/<date>/ for Hydra's timestamped folder); None when it existed already.
# Set by FailedRunsExit.on_run_start; sim.cli.job removes the folder when it holds nothing but
# the failed run's record (remove_new_run_folder).
new_run_folder: tuple[Path, Path] | None = None


def remove_new_run_folder(folder: Path, debris: set[str], release=None) -> bool:
    """Remove ``folder``, a single run's folder that this process made (:data:`new_run_folder`),
    when it holds nothing but entries named in ``debris`` (Hydra's record and log, the run's
    lock: a run that failed before its simulation began), then each parent made with it
    that is empty. Returns whether ``folder`` was removed; False (nothing touched) for another
    folder, one that existed before the run, or one holding anything else. ``release`` (the
    run's lock's) and ``logging.shutdown`` (the run's log file is in the folder) are called
    before it is removed."""
    import logging
    import shutil

    made = new_run_folder
    if made is None or os.path.abspath(folder) != str(made[0]):
        return False
    try:
        if not {p.name for p in folder.iterdir()} <= debris:
            return False
    except OSError:
        return False
    if release is not None:
        release()
    logging.shutdown()
    shutil.rmtree(folder, ignore_errors=True)
    if folder.exists():
        return False
    top = made[1]
    for p in folder.parents:  # (emptied parents made for this run: outputs/<date>/ ...)
        if p != top and top not in p.parents:
            break
        try:
            p.rmdir()
        except OSError:  # (not empty: another run's folder is there)
            break
    return True


def trace_input(trace_cfg):
    """The trace's content fingerprint (:func:`traces.input_fingerprint`) for
    ``output.skip_completed``; when the trace cannot be read or configured, a value no finished
    run matches, so the run goes ahead and its loader names the problem."""
    from traces import TraceError, input_fingerprint

    try:
        return input_fingerprint(trace_cfg)
    except (TraceError, OSError, ValueError, TypeError):
        return _UNKNOWN


def input_files_or_unknown(cfg):
    """The calibration and importance files' fingerprints (:func:`sim.run.input_files`) for
    ``output.skip_completed``; when one cannot be read, a value no finished run matches (the run
    goes ahead and names the problem)."""
    from .run import input_files

    try:
        return input_files(cfg)
    except (OSError, ValueError, TypeError):
        return _UNKNOWN


def complete_run_folder(config) -> Path | None:
    """For a single run into its Hydra run folder (no ``output.dir``) with
    ``output.skip_completed=true``: that folder (``hydra.run.dir``) when it holds this very run
    complete (:func:`sim.run.is_complete`: the same overrides, trace content, input files and
    config fingerprint), else None. ``config``: Hydra's whole config of the run. Only reads,
    so a complete run in a read-only folder is skipped without writing."""
    import copy

    from omegaconf import OmegaConf, open_dict, read_write
    from omegaconf.errors import OmegaConfBaseException

    from .run import is_complete

    try:  # (a setting that does not resolve: the caller's error line names it)
        if config.output.dir or not config.output.skip_completed:
            return None
        out = Path(str(config.hydra.run.dir)).absolute()
    except OmegaConfBaseException:
        return None
    task = copy.deepcopy(config)  # (the config the job gets, as Hydra's run_job makes it)
    with read_write(task), open_dict(task):
        del task["hydra"]
    given = [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task, resolve=False)]
    if is_complete(out, run_overrides(given), trace_input(task.trace), input_files_or_unknown(task),
                   config_fingerprint(task)):
        return out
    return None


def interpolation_error(key: str, exc: Exception, overrides: list[str]) -> str:
    """The one-line error for the config key ``key`` whose ``${...}`` interpolation could not
    be resolved (``exc``: OmegaConf's error), naming the override among ``overrides`` (the
    command line's, as given) that set it when one did."""
    import re

    why = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    given = next((o for o in overrides if key and o.lstrip("+").split("=", 1)[0] == key), None)
    if given is not None:  # (a sweep's job gets its value with Hydra's escapes: $\{nope\})
        given = re.sub(r"\\(.)", r"\1", given)
    if "recursion" in why.lower():
        hint = (f"expected an interpolation that does not lead back to {key or 'its key'} "
                f"(hydra:job.override_dirname holds every override, this one too: "
                f"hydra.job.config.override_dirname.exclude_keys=[{key or 'KEY'}] leaves it out)")
    else:
        hint = ("expected a value, or an interpolation of an existing key (kvsim --cfg job lists "
                "them) or environment variable")
    return f"{given or key}: cannot resolve the interpolation ({why}); {hint}"


def first_unresolvable(config, skip: tuple = ()) -> tuple[str, Exception] | None:
    """The dotted key and OmegaConf error of the first interpolation in ``config`` (a whole
    Hydra config, its ``hydra`` node included) that cannot be resolved, or None. Values only a
    job has (``${hydra:job.num}`` before the sweep's jobs exist: a missing value) are left to
    the job, as are the keys in ``skip`` (a sweep's run folder, which Hydra never resolves
    there: resolving it probes the pre-job ``output.dir``, making that folder)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from omegaconf.errors import (InterpolationToMissingValueError, MissingMandatoryValue,
                                  OmegaConfBaseException)

    def walk(node, prefix):
        keys = list(node.keys()) if isinstance(node, DictConfig) else range(len(node))
        if not prefix and "hydra" in keys:  # (the run's own keys first: they name the cause)
            keys = [k for k in keys if k != "hydra"] + ["hydra"]
        for k in keys:
            key = f"{prefix}{k}"
            if key in ("hydra.overrides", "hydra.job.override_dirname") or key in skip:
                continue  # (the command line's text, not interpolations Hydra resolves)
            try:
                if OmegaConf.is_interpolation(node, k):
                    node[k]
                    continue
                child = node._get_node(k)
            except (InterpolationToMissingValueError, MissingMandatoryValue):
                continue
            except OmegaConfBaseException as e:
                return key, e
            if isinstance(child, (DictConfig, ListConfig)) and not child._is_none() \
                    and not child._is_missing():
                found = walk(child, key + ".")
                if found is not None:
                    return found
        return None

    return walk(config, "")


def config_problem(config) -> str | None:
    """The error of :func:`sim.run.validate_config` (every check a config must pass before a
    simulation starts) for the job config of ``config`` (Hydra's whole config of a run, its
    ``hydra`` node aside); None when the config passes."""
    import copy

    from omegaconf import open_dict, read_write

    from .errors import ConfigError
    from .run import validate_config

    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    try:
        validate_config(task)
    except ConfigError as e:
        return str(e)
    return None


def _folder_problem(folder: Path, key: str, what: str) -> str | None:
    """The error for the folder ``folder`` (set by ``key``) that kvsim cannot create or write
    (a file in the way, no permission, a system folder); None when it can."""
    from .folders import blocked_folder, uncreatable_folder

    why = blocked_folder(folder) or uncreatable_folder(folder)
    if why is None:
        return None
    return (f"{key}={folder}: cannot create the {what} ({why}); expected a folder kvsim can "
            f"create and write")


def _hydra_problem(config, run: bool, folders: bool = True) -> str | None:
    """What Hydra would end with a traceback on before kvsim's job runs: an interpolation
    anywhere in the config (``output.dir``, ``hydra.run.dir``, ``hydra.sweep.dir``, ``hydra.job
    .name``, ...) that cannot be resolved, or, with ``folders``, the run folder (with ``run``:
    and its ``hydra.output_subdir``) or sweep folder that cannot be created (probing a folder
    creates it). None when neither."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    HydraConfig.instance().set_config(config)  # (the hydra: resolver reads it; Hydra sets it too)
    found = first_unresolvable(config, () if run else ("hydra.run.dir", "hydra.output_subdir"))
    if found is not None:
        given = [str(o) for o in [
            *OmegaConf.to_container(config.hydra.overrides.task, resolve=False),
            *OmegaConf.to_container(config.hydra.overrides.hydra, resolve=False)]]
        return interpolation_error(found[0], found[1], given)
    if not folders:
        return None
    if not run:
        return _folder_problem(Path(str(config.hydra.sweep.dir)), "hydra.sweep.dir",
                               "sweep folder")
    run_dir = Path(str(config.hydra.run.dir))
    sub = config.hydra.output_subdir
    record = None if sub is None else run_dir / str(sub)  # (an absolute subdir: itself)
    what = "folder of Hydra's record"
    if record is not None and Path(str(sub)).is_absolute():
        # (checked first: one that fails leaves no run folder made by the probe)
        bad = _folder_problem(record, "hydra.output_subdir", what)
        if bad is not None:
            return bad
    bad = _folder_problem(run_dir, "hydra.run.dir", "run folder")
    if bad is None and record is not None and not Path(str(sub)).is_absolute():
        bad = _folder_problem(record, "hydra.output_subdir", what)
    return bad


def _exit_with(msg: str, status: int = 2) -> None:
    print(f"kvsim: error: {msg}", file=sys.stderr)
    sys.exit(status)


def _write_error(e: OSError, folder: Path) -> str:
    """The one-line error for a write into the sweep folder ``folder`` that failed (``e``)."""
    return resource_error(e) or (f"hydra.sweep.dir={folder}: cannot write {e.filename} "
                                 f"({type(e).__name__}: {e.strerror or e}); expected a sweep "
                                 f"folder kvsim can write")


class FailedRunsExit(Callback):
    """``on_run_start`` / ``on_multirun_start``: check what Hydra resolves and makes before the
    job runs (an interpolation that does not resolve, a run or sweep folder that cannot be
    created: one kvsim error line, exit status 2, where Hydra ended with a traceback); for a
    sweep, a job whose config Hydra cannot compose (:func:`sim.sweep.uncomposable_job`); for a
    single run into Hydra's own run folder (no ``output.dir``), the config's checks
    (:func:`config_problem`: one line, exit status 2, before the folder is made); and for
    a sweep a policy option one of its policies does not read
    (:func:`sim.sweep.unread_policy_options`); give a sweep a new id (see the module doc). ``on_multirun_end``: list the sweep's rejected jobs on
    stderr and exit with status 2 (also when the sweep ran no job at all); when none was
    rejected, say on stderr how many jobs ran and how to collect them."""

    def on_run_start(self, config, **kwargs) -> None:
        global new_run_folder
        bad = _hydra_problem(config, run=True, folders=False)
        if bad is None:  # (before the probe below makes the folder)
            from .config import made_output_dirs
            from .folders import missing_top

            run_dir = Path(os.path.abspath(str(config.hydra.run.dir)))
            # (an output.dir is checked, and so made, as the config resolves: sim.config._run_dir)
            top = made_output_dirs.get(str(run_dir)) if config.output.dir else \
                missing_top(run_dir)
            new_run_folder = None if top is None else (run_dir, top)
            from omegaconf import OmegaConf

            from .validation import non_boolean_config_value

            # (a true/false option set to yes, 1, "on" by a config file: before the folder)
            bad = non_boolean_config_value(
                config.hydra.job.config_name,
                [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task,
                                                        resolve=False)])
            if bad is not None:
                remove_new_run_folder(run_dir, set())  # (an output.dir the check of it made)
                _exit_with(bad)
        if bad is None and not config.output.dir:
            # (before Hydra's own run folder is made, for this run alone: a config that fails
            # its checks leaves none; a run into output.dir marks that folder instead)
            bad = config_problem(config)
            if bad is not None:
                _exit_with(bad)
        bad = bad or _hydra_problem(config, run=True)
        if bad is not None:
            done = complete_run_folder(config)  # (output.skip_completed: a read-only folder)
            if done is not None:
                write_line(sys.stderr, f"kvsim: skipping {done}: already complete")
                write_line(sys.stdout, f"results: {done}")
                sys.exit(0)
            _exit_with(bad)

    def on_multirun_start(self, config, **kwargs) -> None:
        from .sweep import non_boolean_sweep_value, uncomposable_job, unread_policy_options

        bad = non_boolean_sweep_value(config) or uncomposable_job(config) or \
            unread_policy_options(config)
        if bad is not None:  # (before anything is made or run: a job's own config is wrong)
            _exit_with(bad)
        bad = _hydra_problem(config, run=False)
        if bad is not None:
            from .sweep import complete_sweep

            done = complete_sweep(config)  # (output.skip_completed: a read-only sweep folder)
            if done is not None:
                print(f"kvsim: skipping the sweep into {config.hydra.sweep.dir}: its {len(done)} "
                      f"job(s) are already complete", file=sys.stderr)
                sys.stdout.write("".join(f"results: {d}\n" for d in done))
                sys.exit(0)
            _exit_with(bad)
        from .errors import SweepBusy
        from .sweep import (basic_sweep_jobs, clear_ledger, guard_joblib_launcher, hold_sweep_dir,
                            release_sweep_dir, write_plan)

        sweep = Path(str(config.hydra.sweep.dir))
        sweep.mkdir(parents=True, exist_ok=True)
        try:  # (before anything is written: a second sweep into the folder leaves it alone)
            hold_sweep_dir(sweep)
        except SweepBusy as e:
            _exit_with(str(e))
        except OSError as e:  # (a full disk: Hydra's callbacks turn an exception into a warning)
            _exit_with(_write_error(e, sweep), 1)
        from omegaconf import OmegaConf

        from .hydra_record import write_whole

        try:
            clear_ledger(sweep)
            sweep_id = f"{time.time_ns()}-{os.getpid()}"
            write_whole(sweep / SWEEP_ID, f"{sweep_id}\n")
            # (Hydra's sweeper writes the same bytes there next, truncating the file first: a
            # disk with no room for them stops the sweep here with one line, not a traceback)
            write_whole(sweep / "multirun.yaml", OmegaConf.to_yaml(config))
            jobs = basic_sweep_jobs(config)  # (the jobs to run: one that never starts is known)
            if jobs is not None:
                write_plan(sweep, sweep_id, jobs)
        except OSError as e:
            release_sweep_dir()
            _exit_with(_write_error(e, sweep), 1)
        guard_joblib_launcher()

    def on_multirun_end(self, config, **kwargs) -> None:
        from .sweep import release_sweep_dir

        try:
            self._report_sweep(config)
        except Exception as e:  # noqa: BLE001 - (Hydra turns it into a warning and exit 0)
            msg = " ".join(f"{type(e).__name__}: {e}".split())
            _exit_with(f"the sweep's closing report failed ({msg}); each job's outcome is in "
                       f"{config.hydra.sweep.dir}/.kvsim_jobs and its folder (kvsim-collect "
                       f"lists the failed ones)", 1)
        finally:
            release_sweep_dir()

    def _report_sweep(self, config) -> None:
        """on_multirun_end's report (the sweep's lock is let go after it)."""
        from .sweep import read_ledger

        sweep = Path(str(config.hydra.sweep.dir))
        if not sweep.is_absolute():  # (from the folder kvsim started in, whatever chdir did)
            sweep = Path(str(config.hydra.runtime.cwd)) / sweep
        failed = []

        def rejected(folder: Path):
            """The error of a run ``folder`` marked INCOMPLETE by a rejection, else None."""
            marker = folder / "INCOMPLETE"
            try:
                text = marker.read_text(errors="replace").strip().splitlines()[:1] or [""]
            except OSError:
                return None
            return text[0][len(FAILED_PREFIX):].strip() if text[0].startswith(FAILED_PREFIX) else None

        # job directories nested by hydra.sweep.subdir too
        for marker in sorted(sweep.rglob("INCOMPLETE")):
            if marker.parent == sweep or stale_job(marker.parent):
                continue
            why = rejected(marker.parent)
            if why is not None:
                failed.append((marker.parent.relative_to(sweep).as_posix(), why))
        # jobs whose output.dir put their results elsewhere: the job folder points there
        for ptr in sorted(sweep.rglob(RESULTS_POINTER)):
            job = ptr.parent
            name = job.relative_to(sweep).as_posix()
            if stale_job(job) or any(n == name for n, _ in failed):
                continue
            try:
                target = Path(ptr.read_text().strip())
            except OSError:
                continue
            why = rejected(target)
            if why is not None:
                failed.append((name, why))
        # jobs that did not complete and left no marker of it (their folder held by another
        # process, a marker that could not be written): the sweep's ledger (sim.sweep) names them
        listed = {n for n, _ in failed}
        for num, entry in sorted(read_ledger(sweep).items()):
            name = str(entry.get("name") or num)
            if entry.get("state") != "complete" and name not in listed:
                failed.append((name, entry.get("why") or "its process ended before the job "
                                                         "finished (killed?)"))
        root_id = (sweep / SWEEP_ID).read_text().strip() if (sweep / SWEEP_ID).is_file() else None
        jobs = [p.parent for p in sweep.rglob(SWEEP_ID) if p.parent != sweep
                and p.read_text().strip() == root_id]
        # (a job folder is found inside the sweep folder unless hydra.sweep.subdir puts it
        # elsewhere: an absolute path, an environment variable, a resolver)
        from omegaconf import OmegaConf

        sub = str(OmegaConf.to_container(config.hydra.sweep, resolve=False).get("subdir", ""))
        inside = not sub.startswith(("/", "~", "${hydra:", "${oc.", "${now:")) and \
            not os.path.isabs(sub)
        if not inside and not failed:
            print(f"kvsim: sweep done into {sweep} (its job folders are where hydra.sweep.subdir="
                  f"{sub} puts them); collect their results with kvsim-collect on the folder "
                  f"holding them", file=sys.stderr)
            return
        if not failed and not jobs:  # (Hydra ran a sweep of no job with exit status 0)
            _exit_with(f"the sweep into {sweep} ran no job: a swept key has no values (a glob() "
                       f"matching no option?); expected at least one value per swept key")
        if not failed:
            print(f"kvsim: sweep done: {len(jobs)} job(s) in {sweep}; collect their results with "
                  f"`kvsim-collect {sweep}`", file=sys.stderr)
        if failed:
            for name, why in failed:
                print(f"kvsim: sweep job {name} failed: {why}", file=sys.stderr)
            names = {j.relative_to(sweep).as_posix() for j in jobs} | {n for n, _ in failed}
            rest = "no job completed" if len(failed) >= len(names) else "the other jobs completed"
            print(f"kvsim: {len(failed)} sweep job(s) failed; {rest} (their job folders are in "
                  f"{sweep}; their results too unless output.dir put them elsewhere)",
                  file=sys.stderr)
            sys.exit(2)
