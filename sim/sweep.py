"""What keeps a sweep's results whole when several processes work on them.

* **The sweep's lock** (:func:`hold_sweep_dir`): the sweep's own process holds
  ``<hydra.sweep.dir>/.kvsim_sweep_lock`` (:mod:`sim.locks`) from its start to its end, so a
  second sweep into the same folder stops with one line before it writes anything, and
  :func:`sweep_running` tells whether the sweep that made a folder still runs.
* **The job ledger** (``<hydra.sweep.dir>/.kvsim_jobs/<job number>``): each job records its
  state there, ``running`` when it starts, then ``complete`` (simulated or skipped as already
  complete) or ``failed`` with its reason. The sweep's end reads it, so a job that could not
  even mark its results folder (a folder another process held) is still reported, and a
  killed worker's report names the jobs that were running and those that never started. A
  failure the ledger cannot record (a full disk) ends the sweep with one line, exit status 1
  (:class:`UnrecordedJobFailure`).
* **Workers end with their sweep** (:func:`end_with_sweep`): a worker process of the local
  (joblib) launcher kills itself once the sweep's process is gone (SIGKILL, a closed SSH
  session), instead of finishing its jobs into folders a resumed sweep is writing.
* **A killed worker is one line** (:func:`guard_joblib_launcher`): the joblib launcher's
  ``TerminatedWorkerError`` becomes a line naming the jobs that were running, those that never
  started and how to resume, exit status 1.
* **A complete sweep needs no writing** (:func:`complete_sweep`): with
  ``output.skip_completed=true``, a sweep whose folder cannot be written and whose every job is
  complete is skipped as complete.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from hydra.errors import CompactHydraException

from .errors import Busy, SweepBusy
from .folders import LEDGER, PLAN
from .locks import Held, hold, is_held

SWEEP_LOCK = ".kvsim_sweep_lock"
RESUME_HINT = "the same command with output.skip_completed=true runs only the jobs left"

_held: list[Held] = []  # (the sweep lock of this process, held until the sweep ends)


def hold_sweep_dir(sweep: Path) -> Held:
    """Take ``sweep``'s lock for this process (until :func:`release_sweep_dir` or the process
    ends); raise SweepBusy (one line naming the folder and the other sweep's process) when
    another sweep holds it. A lock taken an instant before by a :func:`sweep_running` probe
    is retried for a moment."""
    for attempt in range(5):
        try:
            held = hold(sweep / SWEEP_LOCK)
            break
        except Busy as e:
            if attempt == 4:
                raise SweepBusy(
                    f"hydra.sweep.dir={sweep}: another kvsim sweep ({e.holder}) is running into "
                    f"this folder; expected a sweep folder no running sweep uses (wait for it to "
                    f"end, or pick another hydra.sweep.dir)") from None
            time.sleep(0.1)
    _held.append(held)
    return held


def release_sweep_dir() -> None:
    """Let go of the sweep locks this process holds (the sweep ended)."""
    while _held:
        _held.pop().release()


def held_sweep_dir() -> Path | None:
    """The sweep folder whose lock this process holds (:func:`hold_sweep_dir`), or None."""
    return _held[-1].path.parent if _held else None


def mark_stopped_jobs(sweep: Path) -> list[str]:
    """Mark ``INCOMPLETE`` every job folder directly under ``sweep`` that a stopped sweep
    (Ctrl-C, SIGTERM) left without a marker or a complete run: one whose worker was stopped
    after Hydra made it (its ``cli.log`` or ``.hydra/``) but before the simulation marked it.
    The marker holds the job's overrides (``.hydra/overrides.yaml``, when readable) for
    ``kvsim-collect``'s failure list. A job whose results went to its ``output.dir`` (its
    pointer, :data:`sim.folders.RESULTS_POINTER`) is left to that folder's own marker.
    Returns the names of the folders marked."""
    from .folders import MARKER, RESULTS_POINTER, failure_marker, is_complete, run_overrides

    marked = []
    try:
        children = sorted(Path(sweep).iterdir())
    except OSError:
        return marked
    for d in children:
        if not d.is_dir() or not ((d / "cli.log").exists() or (d / ".hydra").is_dir()):
            continue
        if (d / MARKER).exists() or (d / RESULTS_POINTER).exists() or is_complete(d):
            continue
        try:
            import yaml

            task = yaml.safe_load((d / ".hydra" / "overrides.yaml").read_text()) or []
        except (OSError, ValueError, ImportError):
            task = []
        try:
            (d / MARKER).write_text(failure_marker(
                "the sweep was stopped before this job's simulation started",
                run_overrides([str(t) for t in task] if isinstance(task, list) else [])))
        except OSError:
            continue
        marked.append(d.name)
    return marked


def sweep_running(sweep: Path) -> bool:
    """Whether a sweep process holds the folder ``sweep`` now."""
    return is_held(Path(sweep) / SWEEP_LOCK)


def sweep_pid(sweep_id: str) -> int | None:
    """The process id in a sweep id (``"<ns>-<pid>"``, ``sim.folders.SWEEP_ID``), or None."""
    tail = sweep_id.strip().rpartition("-")[2]
    return int(tail) if tail.isdigit() else None


def clear_ledger(sweep: Path) -> None:
    """Empty the sweep's job ledger (a new sweep starts; the caller holds the sweep lock)."""
    import shutil

    shutil.rmtree(Path(sweep) / LEDGER, ignore_errors=True)


def record_job(sweep: Path, job: int, state: str, why: str | None = None,
               name: str | None = None, overrides: list[str] | None = None) -> bool:
    """Record job ``job``'s ``state`` (``running``, ``complete`` or ``failed``, with ``why``)
    in the ledger of ``sweep``; ``name``: its job folder relative to the sweep folder. False
    when the ledger cannot be written (a full disk): it is left as it was (the caller raises
    :class:`UnrecordedJobFailure` for a failure it could not record)."""
    d = Path(sweep) / LEDGER
    entry = {"state": state, "why": why, "pid": os.getpid(), "name": name,
             "overrides": overrides}
    tmp = d / f".{job}.{os.getpid()}.tmp"
    try:
        d.mkdir(exist_ok=True)
        tmp.write_text(json.dumps(entry) + "\n")
        os.replace(tmp, d / str(job))
    except OSError:
        try:
            tmp.unlink()
        except OSError:
            pass
        return False
    return True


BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"



def _sweep_arguments(config) -> list[str]:
    """The overrides a sweep's jobs are expanded from (``config``: Hydra's whole config of the
    sweep): ``hydra.sweeper.params`` as ``key=values``, then the command line's overrides."""
    from omegaconf import OmegaConf

    params = config.hydra.sweeper.get("params") or {}
    return [f"{k}={v}" for k, v in params.items()] + [
        str(o) for o in OmegaConf.to_container(config.hydra.overrides.task, resolve=False)]


def non_boolean_sweep_value(config) -> str | None:
    """The error for the first value of a true/false option that a sweep (``config``: Hydra's
    whole config of the sweep) would give its jobs and that is not true or false, from its
    ``hydra.sweeper.params`` (a config file's, which no check before Hydra sees) or its command
    line (:func:`sim.validation.non_boolean_override`); None when every one is."""
    from .validation import non_boolean_override

    return non_boolean_override(_sweep_arguments(config))


def basic_sweep_jobs(config) -> list[list[str]] | None:
    """The jobs of a sweep through Hydra's basic sweeper (``config``: Hydra's whole config of
    the sweep), in job-number order: each job's overrides, as the sweeper expands the swept
    keys (``hydra.sweeper.params`` and the command line's overrides; Hydra's
    ``BasicSweeper.split_arguments``). None for another sweeper. Raises Hydra's or OmegaConf's
    error for an override it cannot parse."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    if OmegaConf.select(config, "hydra.sweeper._target_") != BASIC_SWEEPER:
        return None
    loader = GlobalHydra.instance().config_loader()
    parsed = OverridesParser.create(config_loader=loader).parse_overrides(_sweep_arguments(config))
    return [list(job) for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def write_plan(sweep: Path, sweep_id: str, jobs: list[list[str]]) -> None:
    """Record in the ledger of ``sweep`` the jobs the sweep ``sweep_id`` is to run (``jobs``:
    each job's overrides, in job-number order), so that a job that never started (the sweep
    stopped or was killed first) is still known to :func:`read_plan`. Raises OSError when the
    file cannot be written (the caller holds the sweep lock; written whole, then renamed)."""
    d = Path(sweep) / LEDGER
    d.mkdir(exist_ok=True)
    tmp = d / f".{PLAN}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"sweep_id": sweep_id, "jobs": jobs}) + "\n")
    os.replace(tmp, d / PLAN)


class UnrecordedJobFailure(CompactHydraException):
    """A sweep job (folder ``name``) failed (``why``) and the job ledger of ``sweep`` could
    not record it (a full disk). Raised by the job function: the job's launcher hands it to
    Hydra's sweeper in the sweep's process, which raises it once the launched jobs have ended,
    and Hydra prints it as one line and exits with status 1 (a compact Hydra error), so a sweep
    never ends with status 0 after a failure that nothing on disk tells of."""

    def __init__(self, name: str, why: str, sweep) -> None:
        super().__init__(name, why, str(sweep))

    def __str__(self) -> str:
        name, why, sweep = self.args
        hint = "" if "skip_completed=true" in why else f"; {RESUME_HINT}"
        return (f"kvsim: error: sweep job {name} failed and the sweep's job ledger in {sweep} "
                f"could not record it, so the sweep stops here: {why}{hint}")


def read_ledger(sweep: Path) -> dict[int, dict]:
    """The sweep's ledger: ``{job number: entry}`` (entries that cannot be read are left
    out)."""
    out = {}
    d = Path(sweep) / LEDGER
    try:
        names = os.listdir(d)
    except OSError:
        return out
    for n in names:
        if not n.isdigit():
            continue
        try:
            e = json.loads((d / n).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(e, dict):
            out[int(n)] = e
    return out


def complete_sweep(config) -> list[Path] | None:
    """For a sweep run with ``output.skip_completed=true`` through Hydra's basic sweeper
    (``config``: Hydra's whole config of the sweep): the results folder of each of its jobs
    when every one holds its job complete (:func:`sim.run.is_complete`, as the job itself
    checks: the same overrides, trace content, input files and config fingerprint); else None,
    also when a setting does not resolve or a job's config does not compose (the caller's
    error names it). Each job's config is composed as the launchers compose it (Hydra's config
    loader, job number set); nothing is written, so a complete sweep in a read-only folder is
    skipped."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        return _complete_jobs(config)
    except (OmegaConfBaseException, HydraException):
        return None
    finally:
        HydraConfig.instance().set_config(config)


def _complete_jobs(config) -> list[Path] | None:
    """:func:`complete_sweep`'s check (which sets Hydra's config back after it)."""
    import copy

    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict, read_write

    from traces import TraceError, input_fingerprint

    from .folders import config_fingerprint, run_overrides
    from .run import input_files, is_complete

    jobs = basic_sweep_jobs(config) if config.output.skip_completed else None
    if jobs is None:
        return None
    loader = GlobalHydra.instance().config_loader()
    folders = []
    for num, job in enumerate(jobs):
        job_cfg = loader.load_sweep_config(config, list(job))
        with open_dict(job_cfg):
            job_cfg.hydra.job.num = num
            job_cfg.hydra.job.id = f"{num}"
        HydraConfig.instance().set_config(job_cfg)  # (${hydra:job.num} in output.dir)
        task = copy.deepcopy(job_cfg)
        with read_write(task), open_dict(task):
            del task["hydra"]
        out = Path(str(task.output.dir)) if task.output.dir else \
            Path(str(job_cfg.hydra.sweep.dir)) / str(job_cfg.hydra.sweep.subdir)
        try:
            trace, inputs = input_fingerprint(task.trace), input_files(task)
        except (TraceError, OSError, ValueError, TypeError):
            return None  # (the job reads its inputs and names the problem)
        overrides = run_overrides(OmegaConf.to_container(job_cfg.hydra.overrides.task,
                                                         resolve=False))
        if not is_complete(out, overrides, trace, inputs, config_fingerprint(task)):
            return None
        folders.append(out.absolute())
    return folders or None


def unread_policy_options(config) -> str | None:
    """The error for a sweep through Hydra's basic sweeper (``config``: Hydra's whole config of
    the sweep) in which a policy option is set for a job whose policy does not read it, before
    any job runs: each job's ``policy`` node is composed as the launchers compose it (Hydra's
    config loader; one job per distinct choice of config groups and ``policy.*`` values) and
    checked with :func:`policies.registry.unread_options`. The jobs of ``policy=full``, the
    dense baseline, run without the options the sweep sets for its other policies (the job
    notes each); an option that no policy of the sweep reads is an error too. None when every
    option is read, or for another sweeper; a job whose config does not compose is left to
    Hydra's own check, a policy name unknown to its job's validation."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from policies.config import readers_of, unread_options

    if OmegaConf.select(config, "hydra.sweeper._target_") != BASIC_SWEEPER:
        return None
    loader = GlobalHydra.instance().config_loader()
    groups = {str(g) for g in config.hydra.runtime.choices if not str(g).startswith("hydra")}

    def shapes_policy(o: str) -> bool:
        key = o.split("=", 1)[0].lstrip("+~").split("@", 1)[0]
        return key == "policy" or key.startswith(("policy.", "policy/")) or key in groups

    try:
        jobs = basic_sweep_jobs(config) or []
        seen: dict[tuple, tuple[str, list]] = {}
        for job in jobs:
            shape = tuple(o for o in job if shapes_policy(o))
            if shape in seen:
                continue
            node = loader.load_sweep_config(config, list(job)).policy
            try:
                seen[shape] = (str(node.name), unread_options(node))
            except ValueError:
                seen[shape] = (str(node.name), [])
    except (OmegaConfBaseException, HydraException):
        return None
    finally:
        HydraConfig.instance().set_config(config)
    names = sorted({n for n, _ in seen.values()})
    for key, value in dict(kv for _, unread in seen.values() for kv in unread).items():
        option = key.split(".", 1)[0]
        readers = readers_of(option)
        not_reading = sorted({n for n, unread in seen.values()
                              if n != "full" and key in dict(unread)})
        read_by = f"read by policy={', '.join(readers)}" if readers else "read by no policy"
        if not_reading:
            return (f"policy.{key}={value}: policy={', '.join(not_reading)} of this sweep "
                    f"{'does' if len(not_reading) == 1 else 'do'} not read {option} ({read_by}); "
                    f"expected policy options that every policy of the sweep reads "
                    f"(policy=full, the dense baseline, runs without them), or one sweep per "
                    f"policy")
        if not set(names) & set(readers):
            return (f"policy.{key}={value}: no policy of this sweep reads {option} ({read_by}; "
                    f"this sweep runs policy={', '.join(names)})")
    return None


_watching = [False]


def end_with_sweep(parent: int | None) -> None:
    """In a worker process whose parent is the sweep's process ``parent`` (a local sweep's
    joblib worker): start a thread that kills this process with SIGKILL once that parent is
    gone, so no worker outlives its sweep (its run keeps its INCOMPLETE marker; a resumed
    sweep reruns it). Nothing in the sweep's own process, under another parent (a cluster
    launcher's job) or when already started."""
    if _watching[0] or parent is None or os.getpid() == parent or os.getppid() != parent:
        return
    _watching[0] = True

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="kvsim-end-with-sweep", daemon=True).start()


def _jobs_text(nums: list[int]) -> str:
    return ", ".join(str(n) for n in nums[:20]) + (f", ... ({len(nums)} jobs)" if len(nums) > 20
                                                     else "")


def dead_worker_line(sweep: Path, first: int, count: int, error: BaseException) -> str:
    """The line for a sweep (jobs ``first`` .. ``first + count - 1`` into ``sweep``) whose
    worker process died (``error``: joblib's TerminatedWorkerError): the jobs that were
    running, those that never started, and how to resume."""
    import re

    ledger = read_ledger(sweep)
    nums = range(first, first + count)
    running = [n for n in nums if ledger.get(n, {}).get("state") == "running"]
    waiting = [n for n in nums if n not in ledger]
    done = [n for n in nums if ledger.get(n, {}).get("state") == "complete"]
    codes = re.search(r"exit codes? of the workers? (?:are|is) \{([^}]*)\}", str(error))
    how = f" (exit code {codes.group(1)}" + (": killed, e.g. by the out-of-memory killer)"
                                             if "SIGKILL" in codes.group(1) else ")") \
        if codes else ""
    return (f"a sweep worker process died{how} while job(s) {_jobs_text(running) or '-'} "
            f"ran (joblib stops every worker of a pool one of whose workers died): they are "
            f"marked INCOMPLETE; job(s) {_jobs_text(waiting) or '-'} never started; "
            f"{len(done)} of {count} jobs completed (in {sweep}); {RESUME_HINT}")


def guard_joblib_launcher() -> None:
    """Make the joblib launcher (hydra-joblib-launcher) end a sweep whose worker died with
    :func:`dead_worker_line` on stderr and exit status 1 instead of joblib's traceback. Hydra
    only instantiates launchers defined in its ``hydra_plugins`` package, so the launcher's
    ``launch`` is wrapped in this process (once)."""
    try:
        from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
        from joblib.externals.loky.process_executor import (BrokenProcessPool,
                                                            TerminatedWorkerError)
    except ImportError:  # (no joblib launcher installed: nothing to guard)
        return
    if getattr(JoblibLauncher.launch, "_kvsim_guard", False):
        return
    launch = JoblibLauncher.launch

    def guarded(self, job_overrides, initial_job_idx):
        try:
            return launch(self, job_overrides, initial_job_idx)
        except (TerminatedWorkerError, BrokenProcessPool) as e:
            sweep = Path(str(self.config.hydra.sweep.dir))
            if not sweep.is_absolute():
                sweep = Path(str(self.config.hydra.runtime.cwd)) / sweep
            line = dead_worker_line(sweep, initial_job_idx, len(job_overrides), e)
            print(f"kvsim: error: {line}", file=sys.stderr, flush=True)
            release_sweep_dir()
            raise SystemExit(1) from None

    guarded._kvsim_guard = True
    JoblibLauncher.launch = guarded


def uncomposable_job(config) -> str | None:
    """The one-line error (:func:`sim.console.hydra_error`) for a job of a sweep through
    Hydra's basic sweeper (``config``: Hydra's whole config of the sweep) whose config Hydra
    cannot compose (an option a config group lacks, a key the typed config lacks, a value that
    is not its field's type), before the sweep folder is made or any job runs; None when each
    composes, for another sweeper, or for a problem Hydra reports itself. Every value of every
    swept key is composed once, not every combination: job ``i`` takes the ``i``-th value of
    each swept key (from the first again past a key's last), ``max(values per key)`` configs
    in all. That suffices because every group's node is typed by the root schema
    (:class:`sim.config.KvsimConfig`) whatever option the group takes, so whether a key exists
    and whether a value fits its type do not depend on the other keys' values."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from .console import hydra_error

    if OmegaConf.select(config, "hydra.sweeper._target_") != BASIC_SWEEPER:
        return None
    loader = GlobalHydra.instance().config_loader()
    given = _sweep_arguments(config)
    values: dict[str, list[str]] = {}  # (BasicSweeper.split_arguments' job overrides)
    try:
        for o in OverridesParser.create(config_loader=loader).parse_overrides(given):
            key = o.get_key_element()
            if not o.is_sweep_override():
                values[key] = [f"{key}={o.get_value_element_as_str()}"]
            elif o.is_discrete_sweep():
                values[key] = [f"{key}={v}" for v in o.sweep_string_iterator()]
            else:
                return None
    except (OmegaConfBaseException, HydraException):
        return None
    if not all(values.values()):  # (a key with no values: the sweep runs no job)
        return None
    try:
        for i in range(max((len(v) for v in values.values()), default=1)):
            try:
                loader.load_sweep_config(config, [v[i % len(v)] for v in values.values()])
            except Exception as e:  # noqa: BLE001 - (hydra_error names the ones it translates)
                return hydra_error(e)
    finally:
        HydraConfig.instance().set_config(config)
    return None
