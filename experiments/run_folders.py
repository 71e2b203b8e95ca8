"""Reading the run folders of a kvsim sweep: finding them (:func:`find_run_dirs`), where a
run's results are (:func:`results_dir`), what one run folder holds (:func:`read_run` -> a
:class:`RunInfo`: overrides, group choices, config, summary, table files, or why it is not a
completed run), and whether a folder may receive a collection (:func:`check_out_dir`).

Errors: :class:`CollectError` (one line naming the file or folder). The collection these feed is
:mod:`experiments.collect`; the tables built from them :mod:`experiments.collect_tables`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sim.folders import (FAILED_PREFIX, JOB_CLAIM, LEDGER, OVERRIDES_PREFIX, RESULTS_POINTER, RUN_LOCK,
                         SWEEP_ID, is_collection, output_files_problem, read_plan)
from sim.locks import is_held

MARKER = "INCOMPLETE"  # same name as sim.run.MARKER (not imported: collecting needs no simulator)
RUN_LOG = "cli.log"  # the log file Hydra opens in a run's folder (job logging, job name "cli")

# Names of the per-run tables that are not collected into datasets (none today; kept explicit).
SKIP_TABLES: frozenset[str] = frozenset()


class CollectError(Exception):
    """A sweep directory that cannot be collected (missing, empty, or unreadable run files)."""


@dataclass
class RunInfo:
    """One run directory of a sweep and what was read from it."""

    run_dir: Path
    run_id: str
    job: int | None = None
    overrides: list[str] = field(default_factory=list)
    choices: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] | None = None
    failure: str | None = None
    tables: dict[str, Path] = field(default_factory=dict)
    has_hydra: bool = False  # .hydra/hydra.yaml was read (group choices and job number)
    config_path: Path | None = None  # the config file read, None when the run has none
    sweep_id: str | None = None  # the multirun it ran in (its id), None for a single run
    hydra_overrides: list[str] | None = None  # .hydra/overrides.yaml as read, None without one

    @property
    def complete(self) -> bool:
        return self.failure is None


# ---------------------------------------------------------------------------------------------
# Discovery and reading


def _only_log(p: Path) -> bool:
    """``p`` holds the run log kvsim's Hydra app writes first (``cli.log``) and no folder but
    hidden ones: a run stopped (SIGKILL) after Hydra made its folder, before it marked it."""
    try:
        return (p / RUN_LOG).is_file() and not any(
            c.is_dir() and not c.name.startswith(".") for c in p.iterdir())
    except OSError:
        return False


def _is_run_dir(p: Path) -> bool:
    return ((p / ".hydra" / "overrides.yaml").is_file() or (p / "summary.json").is_file()
            or (p / MARKER).exists() or (p / RESULTS_POINTER).is_file() or _only_log(p))


def default_out_dir(sweep_dir) -> Path:
    """Where ``kvsim-collect SWEEP_DIR`` writes without ``--out``: ``SWEEP_DIR/collected`` for
    a sweep folder; for one run's folder (``kvsim-collect RUN_DIR``, collected as a one-run
    sweep) ``RUN_DIR-collected`` beside it, since a run's folder holds that run's files only
    (a later run into it replaces them)."""
    p = Path(sweep_dir)
    if p.is_dir() and _is_run_dir(p):
        return p.parent / f"{p.name}-collected"
    return p / "collected"


def results_dir(run_dir: Path) -> tuple[Path, str | None]:
    """Where the results of the run in ``run_dir`` are: ``(folder, problem)``. A multirun job
    whose ``output.dir`` put them elsewhere leaves a pointer to that folder in its Hydra
    folder (``sim.folders.RESULTS_POINTER``); ``problem`` is a one-line reason when the
    pointed-to folder is missing or now holds another sweep's run (its ``.kvsim_sweep_id``),
    else None. Without a pointer the folder is ``run_dir`` itself."""
    ptr = run_dir / RESULTS_POINTER
    if (run_dir / "summary.json").is_file() or (run_dir / MARKER).exists() or not ptr.is_file():
        return run_dir, None
    target = Path(ptr.read_text(errors="replace").strip())
    if not target.is_dir():
        return target, f"its results folder {target} (output.dir) is not there"
    mine, theirs = run_dir / SWEEP_ID, target / SWEEP_ID
    if mine.is_file() and (not theirs.is_file()
                           or mine.read_text().strip() != theirs.read_text().strip()):
        return target, (f"its results folder {target} (output.dir) now holds another run (its "
                        f"{SWEEP_ID} is not this sweep's)")
    return target, None


def check_out_dir(sweep_dir, out_dir) -> None:
    """Raise CollectError (one line naming ``out_dir``) unless ``out_dir`` may receive a
    collection of ``sweep_dir``: a directory that does not exist yet, an empty one, or an
    earlier collection (:func:`is_collection`), which is replaced. Refused: the sweep directory
    itself, a directory containing it, one inside it (except the default ``SWEEP_DIR/collected``
    of a sweep folder; nothing inside one run's folder),
    a run directory, an existing file, and a non-empty directory that is not a collection.
    Nothing is written or deleted here."""
    given = Path(out_dir)
    sw = Path(sweep_dir).resolve()
    o = given.resolve()
    what = f"output directory {given} (--out)"
    if o.exists() and not o.is_dir():
        raise CollectError(f"{what}: is an existing file; expected a directory (a new or empty one, "
                           f"or an earlier kvsim-collect output to replace)")
    for parent in o.parents:  # the first existing ancestor must be a directory
        if parent.exists():
            if not parent.is_dir():
                raise CollectError(f"{what}: {parent} is a file, not a directory")
            break
    if o == sw:
        raise CollectError(f"{what}: is the sweep directory itself; collecting into it would "
                           f"delete its runs (default: {Path(sweep_dir) / 'collected'})")
    if sw.is_relative_to(o):
        raise CollectError(f"{what}: contains the sweep directory {sweep_dir}; collecting into it "
                           f"would delete the sweep; choose a directory outside it")
    if o.is_dir() and _is_run_dir(o):
        raise CollectError(f"{what}: is a kvsim run directory (it holds summary.json, "
                           f".hydra/overrides.yaml or an {MARKER} marker); collecting into it "
                           f"would delete the run; choose another directory")
    if o.is_relative_to(sw) and _is_run_dir(sw):
        raise CollectError(f"{what}: is inside the run folder {sweep_dir}, which holds that "
                           f"run's files only; choose a directory outside it (default: "
                           f"{default_out_dir(sweep_dir)})")
    if o.is_relative_to(sw) and o != sw / "collected":
        raise CollectError(f"{what}: is inside the sweep directory {sweep_dir} (only the default "
                           f"{Path(sweep_dir) / 'collected'} may be); choose a directory outside "
                           f"the sweep")
    try:
        non_empty = o.is_dir() and any(o.iterdir())
    except OSError as e:
        raise CollectError(f"{what}: cannot list directory: {one_line(e)}") from e
    if non_empty and not is_collection(o):
        raise CollectError(f"{what}: is a non-empty directory that is not a kvsim-collect output "
                           f"(no kvsim-collect manifest.json); it would be replaced, deleting its "
                           f"files: choose a new or empty directory")


def find_run_dirs(sweep_dir, exclude: Path | None = None) -> list[Path]:
    """Run directories under ``sweep_dir`` (a directory holding ``.hydra/overrides.yaml``,
    ``summary.json``, an ``INCOMPLETE`` marker, the pointer a multirun job leaves when its
    ``output.dir`` is elsewhere (:func:`results_dir`), or only the run's log ``cli.log``, a run
    killed before it marked its folder: a failed run); not descending into a run directory.

    ``sweep_dir`` may itself be one run directory (``kvsim`` without ``-m``): it is then the only
    run. Hidden directories (``.submitit``, ``.hydra``) and ``exclude`` are skipped.
    Raises CollectError if ``sweep_dir`` does not exist or is not a directory.
    """
    root = Path(sweep_dir)
    if not root.exists():
        raise CollectError(f"{root}: no such sweep directory")
    if not root.is_dir():
        raise CollectError(f"{root}: not a directory (expected a kvsim sweep directory)")
    if _is_run_dir(root):
        return [root]
    excl = exclude.resolve() if exclude is not None else None
    found: list[Path] = []
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            children = sorted(c for c in d.iterdir() if c.is_dir() and not c.name.startswith("."))
        except OSError as e:
            raise CollectError(f"{d}: cannot list directory: {e}") from e
        for c in children:
            if excl is not None and c.resolve() == excl:
                continue
            if _is_run_dir(c):
                found.append(c)
            else:
                stack.append(c)
    return found


def _load_yaml(path: Path):
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except (OSError, yaml.YAMLError) as e:
        raise CollectError(f"{path}: cannot read YAML: {e}") from e


def _load_config(run_dir: Path) -> tuple[dict, Path | None]:
    """The run's config as a plain dict, interpolations resolved where they resolve on their own,
    and the file it came from (``({}, None)`` when the run has no config file)."""
    from omegaconf import OmegaConf

    for p in (run_dir / ".hydra" / "config.yaml", run_dir / "config.yaml"):
        if p.is_file():
            try:
                conf = OmegaConf.load(p)
            except Exception as e:  # noqa: BLE001 - report any parse error with the file name
                raise CollectError(f"{p}: cannot read config: {e}") from e
            try:
                return OmegaConf.to_container(conf, resolve=True), p
            except Exception:  # noqa: BLE001 - e.g. ${hydra:...} resolvers outside a Hydra app
                return OmegaConf.to_container(conf, resolve=False), p
    return {}, None


def read_run(run_dir: Path, sweep_dir: Path, index: int) -> RunInfo:
    """Read one run directory: overrides, group choices, config, summary and table paths.

    A run that has not completed is returned with ``failure`` set (never raised); a file that
    exists but cannot be parsed (config or Hydra YAML) raises CollectError naming the file.
    """
    rel = run_dir.relative_to(sweep_dir).as_posix() if run_dir != sweep_dir else run_dir.name
    job_dir = run_dir
    run_dir, moved = results_dir(job_dir)
    info = RunInfo(run_dir=run_dir.resolve(), run_id=rel)
    info.sweep_id = _sweep_id(job_dir, run_dir)
    hydra_dir = job_dir / ".hydra"
    if (hydra_dir / "overrides.yaml").is_file():
        ov = _load_yaml(hydra_dir / "overrides.yaml") or []
        if not isinstance(ov, list):
            raise CollectError(f"{hydra_dir / 'overrides.yaml'}: expected a list of overrides")
        info.overrides = [str(o) for o in ov]
        info.hydra_overrides = list(info.overrides)
    if (hydra_dir / "hydra.yaml").is_file():
        hy = (_load_yaml(hydra_dir / "hydra.yaml") or {}).get("hydra", {}) or {}
        choices = (hy.get("runtime") or {}).get("choices") or {}
        info.choices = {str(k): str(v) for k, v in choices.items()
                        if not str(k).startswith("hydra/") and v is not None}
        num = (hy.get("job") or {}).get("num")
        if isinstance(num, int):
            info.job = num
        info.has_hydra = True
    if info.job is None:
        info.job = int(rel) if rel.isdigit() else index
    if moved is not None:
        info.failure = moved
        return info
    info.config, info.config_path = _load_config(run_dir)
    for p in sorted(run_dir.glob("*.parquet")):
        name = p.name[: -len(".parquet")]
        if name not in SKIP_TABLES:
            info.tables[name] = info.run_dir / p.name

    summary_path = run_dir / "summary.json"
    if (run_dir / MARKER).exists():
        text = (run_dir / MARKER).read_text(errors="replace").strip()
        lines = text.splitlines() or [""]
        if lines[-1].startswith(OVERRIDES_PREFIX):  # the run's overrides (kvsim's markers)
            try:
                ov = json.loads(lines[-1][len(OVERRIDES_PREFIX):])
            except ValueError:
                ov = None
            if isinstance(ov, list):
                lines.pop()
                if not info.overrides:
                    info.overrides = [str(o) for o in ov]
        if text.startswith(FAILED_PREFIX):  # the CLI's record of a rejected config/trace
            info.failure = f"INCOMPLETE marker: {' '.join(lines)}"
        elif is_held(run_dir / RUN_LOCK):  # (the run's process holds its folder now)
            info.failure = ("still running: a kvsim process holds this folder (INCOMPLETE until "
                            "it ends; collect again after the sweep ends)")
        else:
            info.failure = "INCOMPLETE marker present (run interrupted or crashed)"
    elif not summary_path.is_file() and _only_log(run_dir):
        info.failure = (f"no summary.json and no {MARKER} marker, only the run's log {RUN_LOG} "
                        f"(the run was killed before it marked its folder)")
    elif not summary_path.is_file():
        info.failure = "no summary.json"
    else:
        try:
            summary = json.loads(summary_path.read_text())
        except (OSError, ValueError) as e:
            info.failure = f"summary.json unreadable: {e}"
        else:
            if isinstance(summary, dict) and not info.overrides \
                    and isinstance(summary.get("overrides"), list):
                # a run with output.dir has no .hydra/ record: summary.json keeps its overrides
                # (also those of a run that fails a check below: the failed-runs list names them)
                info.overrides = [str(o) for o in summary["overrides"]]
            if not isinstance(summary, dict):
                info.failure = "summary.json is not a JSON object"
            elif summary.get("complete") is not True:
                info.failure = f"summary.json has complete={summary.get('complete')!r}"
            elif (mixed := labels_problem(info, summary)) is not None:
                # (first: a config file of another run also fails the digest check below, and
                # this says what happened)
                info.failure = mixed
            elif (gone := output_files_problem(run_dir, summary, contents=True)) is not None:
                # (the check output.skip_completed makes: a file gone, of another size or with
                # other bytes than the run wrote; a run of a kvsim that recorded no digests has
                # its tables checked when they are read, with the Parquet error)
                info.failure = gone
            else:
                info.summary = summary
                cc = summary.get("config_choices")
                if not info.has_hydra and isinstance(cc, dict):
                    # (and the option of each config group, those its overrides do not name too)
                    info.choices = {str(k): str(v) for k, v in cc.items()
                                    if not str(k).startswith("hydra/") and v is not None}
    return info


def labels_problem(info: RunInfo, summary: dict) -> str | None:
    """Why the labels read for a run (``info``: its ``.hydra/`` overrides and group choices,
    its config file) are not those of the run whose ``summary.json`` is ``summary``: its
    overrides, group choices (``config_choices``) or config fingerprint
    (:func:`sim.folders.config_fingerprint`) differ, as when a process wrote into the folder
    after another run had taken it. None when they agree, and for what a summary does not
    record (a kvsim that recorded no fingerprint)."""
    from omegaconf import OmegaConf

    from sim.folders import config_fingerprint, run_overrides

    def mixed(what: str) -> str:
        return (f"{what}: the folder holds the record of one run and the results of another "
                f"(e.g. a process that wrote into it after another run took it); rerun it "
                f"(output.skip_completed=true reruns it)")

    ov = summary.get("overrides")
    given = info.hydra_overrides
    if isinstance(ov, list) and given is not None and run_overrides(given) != \
            [str(o) for o in ov]:
        return mixed(f".hydra/overrides.yaml ({' '.join(run_overrides(given))}) and "
                     f"summary.json's overrides ({' '.join(str(o) for o in ov)}) differ")
    cc = summary.get("config_choices")
    if isinstance(cc, dict) and info.has_hydra and info.choices != {
            str(k): str(v) for k, v in cc.items() if not str(k).startswith("hydra/")
            and v is not None}:
        return mixed(".hydra/hydra.yaml's config group choices and summary.json's "
                     "config_choices differ")
    fp = summary.get("config_fingerprint")
    if isinstance(fp, str) and info.config_path is not None:
        try:
            here = config_fingerprint(OmegaConf.load(info.config_path))
        except Exception as e:  # noqa: BLE001 - (read already by _load_config: not expected)
            return mixed(f"{info.config_path} cannot be read back ({one_line(e)})")
        if here != fp:
            return mixed(f"{info.config_path.name} is not the config of the run that wrote "
                         f"summary.json (config fingerprint {here}, summary.json's {fp})")
    return None


def _sweep_id(job_dir: Path, run_dir: Path) -> str | None:
    """The id of the multirun a run belongs to: its job folder's stamp (``.kvsim_sweep_id``),
    else its ``output.dir``'s claim (``.kvsim_job``: "<sweep id> <job>"); None for a single
    run (or one of a kvsim that wrote neither)."""
    for f in (job_dir / SWEEP_ID, run_dir / JOB_CLAIM):
        try:
            words = f.read_text().split()
        except OSError:
            continue
        if words:
            return words[0]
    return None


# ---------------------------------------------------------------------------------------------
# Flattening and typing


def jobs_not_run(sweep_dir: Path, runs: list[RunInfo], ledger: dict[int, dict],
                 running: bool) -> list[RunInfo]:
    """The jobs the latest sweep into ``sweep_dir`` was to run (the plan in its job ledger,
    :func:`sim.folders.read_plan`) that left no run folder among ``runs`` (the runs read from
    it, by job number, with this sweep's id or none): a sweep stopped (Ctrl-C, a killed process,
    a node lost) before they started, a job killed before it made its folder, or, while the
    sweep still runs (``running``: :func:`sim.sweep.sweep_running`), a job not started yet.
    ``ledger`` is the sweep's job ledger (:func:`sim.sweep.read_ledger`) as read *before* the
    folders were scanned: a job it records as complete had its folder then, so one missing from
    ``runs`` was removed since, not a job that completed during the scan. Each is a failed
    RunInfo naming the job, its overrides and why (the ledger's entry when the job started,
    else that it never started, or has not yet), its ``run_dir`` the folder Hydra's default
    ``hydra.sweep.subdir`` gives it (``SWEEP_DIR/<job number>``) or the one its ledger entry
    names. Empty without a plan (another sweeper, a single run's folder) or when the plan is
    another sweep's than the folder's sweep id."""
    plan = read_plan(sweep_dir)
    try:
        sid = (sweep_dir / SWEEP_ID).read_text().strip()
    except OSError:
        return []
    if plan is None or plan[0] != sid:
        return []
    # (a job folder without an id: a job refused before it wrote one; other ids are stale jobs,
    # already left out by the caller)
    present = {r.job for r in runs if r.job is not None and r.sweep_id in (None, sid)}
    missing = []
    for num, overrides in enumerate(plan[1]):
        if num in present:
            continue
        entry = ledger.get(num)
        if entry is None:
            why = (NOT_STARTED if running else
                   "never ran: the sweep stopped before this job started")
        elif entry.get("state") == "complete":
            why = "its results folder is gone (the job completed, its folder was removed since)"
        elif running and entry.get("state") == "running":
            why = STILL_RUNNING
        else:
            why = (entry.get("why") or "its process ended before the job made its folder "
                   "(killed?)")
        name = str(entry.get("name") or num) if entry else str(num)
        missing.append(RunInfo(run_dir=sweep_dir / name, run_id=name, job=num,
                               overrides=list(overrides), failure=why, sweep_id=sid))
    return missing


NOT_STARTED = "not started yet: the sweep is still running"
STILL_RUNNING = "still running: the sweep is running this job (collect again after the sweep ends)"


def mark_running_jobs(sweep_dir: Path, runs: list[RunInfo], ledger: dict[int, dict]) -> None:
    """While the sweep into ``sweep_dir`` runs, set the failure of each run read from its
    folders (``runs``) that is a job of this sweep the job ledger (``ledger``, read after the
    folders were read: :func:`sim.sweep.read_ledger`) records as running, or not at all (Hydra
    made its folder, the job has not recorded its start yet), to "still running" instead of
    what its half-written folder looks like (only ``cli.log``, no ``summary.json``). A job
    failed by kvsim (its ``INCOMPLETE`` marker's error) or already named as running keeps its
    reason; complete runs are left as they are."""
    try:
        sid = (sweep_dir / SWEEP_ID).read_text().strip()
    except OSError:
        return
    for r in runs:
        if r.complete or r.job is None or r.sweep_id not in (None, sid):
            continue
        if r.failure.startswith(("still running", f"{MARKER} marker: {FAILED_PREFIX}")):
            continue
        entry = ledger.get(r.job)
        if entry is None or entry.get("state") == "running":
            r.failure = STILL_RUNNING


def one_line(e: BaseException) -> str:
    """An exception's message on one line (Parquet errors span several)."""
    return " ".join(str(e).split()) or type(e).__name__
