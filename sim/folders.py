"""Results and sweep folders: what kvsim writes there and how it is read back.

* whether a folder can take a run's results (:func:`foreign_folder`, :func:`uncreatable_folder`,
  :func:`blocking_file`, :func:`blocked_folder`; a ``kvsim-collect`` output,
  :func:`is_collection`);
* the marks a sweep leaves (:data:`SWEEP_ID`, :data:`RESULTS_POINTER`, :data:`JOB_CLAIM`,
  :func:`sweep_root`, :func:`stale_job`) and the jobs it was to run (:func:`read_plan`);
* what identifies a run (:func:`run_overrides`, :func:`config_fingerprint`), the files its
  summary lists (:func:`output_files_problem`) and the INCOMPLETE marker of a failed run
  (:func:`failure_marker`); whether a folder holds a complete run (:func:`is_complete`,
  :func:`altered_results`).

Used by the Hydra config (:func:`sim.config._run_dir`), :mod:`sim.run`, the CLI, the Hydra
callbacks (:mod:`sim.callbacks`) and ``kvsim-collect``; imports nothing of kvsim.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional


def is_collection(path) -> bool:
    """Whether ``path`` is a directory written by ``kvsim-collect``: it holds a ``manifest.json``
    that is a JSON object with the keys every collection's manifest has (``sweep_dir``,
    ``runs_total``, ``tables``)."""
    import json

    try:
        m = json.loads((Path(path) / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and {"sweep_dir", "runs_total", "tables"} <= m.keys()


# what kvsim and Hydra write into a run's results folder (sim.run, sim.cli, sim.callbacks and
# Hydra's log); a results file's ``<name>.tmp`` is its atomic write in progress
RUN_FOLDER_NAMES = (
    "summary.json", "INCOMPLETE", ".kvsim_running", "cli.log", ".hydra", "config.yaml",
    "requests.parquet", "steps.parquet", "rounds.parquet", "transfers.parquet", "ops.jsonl",
    ".kvsim_sweep_id", ".kvsim_job", ".kvsim_results")


PROBE_PREFIX = ".kvsim-probe-"  # (uncreatable_folder's test file, removed at once)


def foreign_folder(path: Path, ignore: tuple = ()) -> Optional[list]:
    """The names in the folder ``path`` that are not a kvsim run's (:data:`RUN_FOLDER_NAMES`
    and their ``.tmp`` files), sorted, when there are any: a sweep folder, a checkout, a
    ``kvsim-collect`` output, a folder of other files. A run writing its results there would mix
    them with those files (and replace any of them named like its own), and ``kvsim-collect``
    would take the folder for one run. None for a missing or empty folder, a run's folder (with
    or without the ``collected`` folder ``kvsim-collect RUN_DIR`` makes there), or a
    path that is not a folder (:func:`blocking_file` names that). Names in ``ignore`` are left
    out (the job's own Hydra folder, when ``hydra.run.dir`` is inside)."""
    import os

    try:
        if not path.is_dir():
            return None
        names = os.listdir(path)
    except OSError:
        return None
    other = sorted(n for n in names if n not in ignore and n not in RUN_FOLDER_NAMES
                   and not (n.endswith(".tmp") and n[:-4] in RUN_FOLDER_NAMES)
                   and not n.startswith(PROBE_PREFIX)  # (another job's probe, for a moment)
                   and not (n == "collected" and is_collection(path / n)))
    return other or None


def uncreatable_folder(path: Path) -> Optional[str]:
    """Why the folder ``path`` cannot be created or written (``"PermissionError: ..."``),
    creating it (and its parents) when it can, and probing it with a file made and removed at
    once; None when it can take files, or when a file is in the way (:func:`blocking_file`
    names that)."""
    import os
    import tempfile

    if blocking_file(path) is not None:
        return None
    for p in (path, *path.parents):  # (mkdir would say "File exists" of a dangling link)
        if p.is_symlink() and not p.exists():
            return f"{p} is a symbolic link to {os.readlink(p)}, which does not exist"
        if p.exists():
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=PROBE_PREFIX, dir=path)
        try:
            os.close(fd)
        finally:  # (also when Ctrl-C comes in between: no probe file is left behind)
            os.unlink(probe)
    except OSError as e:
        return f"{type(e).__name__}: {e.strerror or e}"
    return None


def missing_top(folder: Path) -> Optional[Path]:
    """The highest folder of ``folder``'s path (``folder`` itself included) that does not exist
    (what making ``folder`` with its parents creates first), or None when ``folder`` exists."""
    top = None
    for p in (folder, *folder.parents):
        if p.exists() or p.is_symlink():
            break
        top = p
    return top


def blocking_file(path: Path) -> Optional[Path]:
    """The existing file (not a folder) at ``path`` or at the nearest existing folder above it,
    which keeps ``path`` from being a folder; None when ``path`` is or can become one."""
    for p in (path, *path.parents):
        if p.exists():
            return None if p.is_dir() else p
    return None


def blocked_folder(path: Path) -> Optional[str]:
    """Why ``path`` cannot become a folder because of a file (:func:`blocking_file`): "exists
    and is not a folder", or "<file> is a file, not a folder" for a file above it; None when no
    file is in the way."""
    f = blocking_file(path)
    if f is None:
        return None
    return "exists and is not a folder" if f == path else f"{f} is a file, not a folder"


# In a results folder while a run writes there: "<host> <pid>" (sim.locks, sim.run.hold_output_dir)
RUN_LOCK = ".kvsim_running"
SWEEP_ID = ".kvsim_sweep_id"
LEDGER = ".kvsim_jobs"  # (a sweep's job ledger: sim.sweep)
PLAN = "plan.json"  # (in the ledger: the jobs the sweep was to run, written at its start)
# In a multirun job's Hydra folder when ``output.dir`` put its results elsewhere: that folder's
# absolute path (kvsim-collect follows it, so collecting the sweep folder finds every job).
RESULTS_POINTER = ".kvsim_results"
# In a multirun job's output.dir: "<sweep id> <job number>" (the job that holds the folder)
JOB_CLAIM = ".kvsim_job"
# The first line of an INCOMPLETE marker the CLI writes for a rejected run; the second line
# is "overrides: " and the run's overrides as a JSON list (kvsim-collect reports them).
FAILED_PREFIX = "this run failed:"
OVERRIDES_PREFIX = "overrides: "


# overrides that say how a run is executed, not what it simulates: left out of the overrides a
# run records (summary.json overrides) and of its config fingerprint
RUN_BOOKKEEPING = ("output.skip_completed", "output.dir", "sim.progress", "output.print_summary")


def run_overrides(overrides) -> list[str]:
    """The overrides that define a run (``overrides``: the command line's, as given), those of
    :data:`RUN_BOOKKEEPING` left out."""
    return [str(o) for o in overrides if not str(o).lstrip("+").startswith(RUN_BOOKKEEPING)]


def config_fingerprint(config) -> str:
    """xxh3-128 (hex) of a run's config: ``config`` is the DictConfig the run got, or its
    record read back (``.hydra/config.yaml`` or ``config.yaml``, ``OmegaConf.load``);
    interpolations are not resolved, and the keys of :data:`RUN_BOOKKEEPING` are left out.
    A run records it in summary.json (``config_fingerprint``); kvsim-collect and
    ``output.skip_completed`` compare it with the config record beside the summary, so a
    folder whose record and results come from two runs is never taken for one run."""
    import json

    import xxhash
    from omegaconf import DictConfig, OmegaConf

    c = OmegaConf.to_container(config, resolve=False, enum_to_str=True) \
        if isinstance(config, DictConfig) else config
    c = json.loads(json.dumps(c, default=repr))  # (a copy; the keys below are removed)
    for key in RUN_BOOKKEEPING:
        *path, last = key.split(".")
        node = c
        for k in path:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(last, None)
    return xxhash.xxh3_128_hexdigest(json.dumps(c, sort_keys=True, default=repr).encode())


def file_digest(path) -> str:
    """xxh3-128 (hex) of the bytes of the file ``path`` (read in 1 MiB chunks); OSError when
    it cannot be read. A run records it for each file it wrote (summary.json
    ``output_files``)."""
    import xxhash

    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def output_files_problem(run_dir, summary: dict, sizes: bool = True,
                         contents: bool = False) -> str | None:
    """What is wrong with the files a run's ``summary.json`` (``summary``, a dict) lists in
    ``output_files`` (``[[file name, bytes, xxh3-128 hex of the content], ...]``, written by
    :func:`sim.run.run_simulation`; an entry of two, without the digest, and a summary with no
    list at all, as older kvsim versions wrote them, are accepted): a malformed
    list, a file gone, with ``sizes`` one of another size than written, with ``contents`` one
    whose bytes differ from those written (:func:`file_digest`; a same-size corruption or
    edit). None when all are as written. ``output.skip_completed`` (:func:`sim.run.is_complete`)
    reruns such a run; ``kvsim-collect`` (:func:`experiments.run_folders.read_run`) lists it
    as failed with this reason."""
    files = summary.get("output_files")
    if files is not None and not isinstance(files, list):
        return f"summary.json's output_files is {str(files)[:40]!r}, not a list of [file name, bytes, digest]"
    for f in files or []:
        if not (isinstance(f, list) and len(f) in (2, 3) and isinstance(f[0], str)
                and isinstance(f[1], int) and not isinstance(f[1], bool)
                and (len(f) == 2 or isinstance(f[2], str))):
            return f"summary.json's output_files entry {str(f)[:40]!r} is not [file name, bytes, digest]"
        p = Path(run_dir) / f[0]
        if not p.is_file():
            return f"{f[0]} is missing (the run wrote it, {f[1]:,} bytes)"
        if sizes and p.stat().st_size != f[1]:
            return f"{f[0]} is {p.stat().st_size:,} bytes, the run wrote {f[1]:,}"
        if contents and len(f) == 3:
            try:
                same = file_digest(p) == f[2]
            except OSError as e:
                return f"{f[0]} cannot be read ({type(e).__name__}: {e.strerror or e})"
            if not same:
                return (f"{f[0]}'s content differs from what the run wrote (its xxh3-128 digest "
                        f"is not the one summary.json records: the file was altered or "
                        f"corrupted since)")
    return None


MARKER = "INCOMPLETE"  # in a results folder while its run is in progress, or failed
_ANY = object()


def altered_results(out_dir) -> str | None:
    """Why the run in ``out_dir``, whose summary.json says it completed (no INCOMPLETE
    marker), no longer holds the results it wrote: a file its ``output_files`` lists gone,
    of another size or with other content (:func:`output_files_problem`). None
    when they are as written, or when the folder holds no completed run."""
    p = Path(out_dir)
    if (p / MARKER).exists():
        return None
    try:
        s = json.loads((p / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(s, dict) or s.get("complete") is not True:
        return None
    return output_files_problem(p, s, contents=True)


def is_complete(out_dir, overrides: list[str] | None = None, trace_input=_ANY,
                inputs=_ANY, fingerprint=_ANY) -> bool:
    """True if ``out_dir`` holds a finished run (summary.json with complete=true, no marker, and
    every file its ``output_files`` lists still there with the size and content written,
    :func:`output_files_problem`) and, when
    ``overrides`` is given, that run was made with exactly these Hydra overrides (so a reused
    sweep directory with a changed grid is rerun, not skipped), and when ``trace_input`` is given
    (:func:`traces.input_fingerprint`'s list, or None for a generated trace), from a trace with
    exactly that content (an edited or replaced trace file is rerun), and when ``inputs`` is
    given (:func:`input_files`' dict), with a calibration and importance file of exactly that
    content (a re-calibrated GPU is rerun), and when ``fingerprint`` is given
    (:func:`sim.folders.config_fingerprint` of the config about to run), from that very
    config (a summary of an older kvsim, which records none, passes)."""
    p = Path(out_dir)
    if (p / MARKER).exists() or not (p / "summary.json").exists():
        return False
    try:
        s = json.loads((p / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(s, dict) or s.get("complete") is not True:
        return False
    if overrides is not None and list(s.get("overrides") or []) != list(overrides):
        return False
    if output_files_problem(p, s, contents=True) is not None:
        return False
    if inputs is not _ANY and s.get("input_files", {}) != inputs:
        return False
    if fingerprint is not _ANY and s.get("config_fingerprint", fingerprint) != fingerprint:
        return False
    return trace_input is _ANY or s.get("trace_input", _ANY) == trace_input


def failure_marker(msg: str, overrides: list[str]) -> str:
    """The text of the INCOMPLETE marker of a run rejected with ``msg``: two lines, the error
    (``msg``: one line) and the run's ``overrides`` as a JSON list."""
    import json

    return f"{FAILED_PREFIX} {msg}\n{OVERRIDES_PREFIX}{json.dumps(list(overrides))}\n"


def sweep_root(job_dir: Path) -> Path | None:
    """The nearest folder above ``job_dir`` holding a sweep id (the sweep directory, also when
    ``hydra.sweep.subdir`` nests job directories), or None."""
    for d in job_dir.parents:
        if (d / SWEEP_ID).is_file():
            return d
    return None


def stale_job(job_dir: Path) -> bool:
    """True when ``job_dir`` holds the id of a sweep other than the latest one run into its
    sweep directory (a job of an earlier, larger grid). A job without an id (written before
    ids existed, or killed before its first line) is not stale."""
    mine = job_dir / SWEEP_ID
    root = sweep_root(job_dir)
    if root is None or not mine.is_file():
        return False
    return mine.read_text().strip() != (root / SWEEP_ID).read_text().strip()


def read_plan(sweep: Path) -> tuple[str, list[list[str]]] | None:
    """The plan :func:`sim.sweep.write_plan` left in the ledger of ``sweep``: (sweep id, each job's
    overrides in job-number order), or None when there is none (another sweeper, a sweep of a
    kvsim that wrote none) or it cannot be read."""
    try:
        e = json.loads((Path(sweep) / LEDGER / PLAN).read_text())
    except (OSError, ValueError):
        return None
    if not (isinstance(e, dict) and isinstance(e.get("sweep_id"), str)
            and isinstance(e.get("jobs"), list)
            and all(isinstance(j, list) and all(isinstance(o, str) for o in j) for j in e["jobs"])):
        return None
    return e["sweep_id"], e["jobs"]
