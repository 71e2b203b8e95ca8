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


SWEEP_ID = ".kvsim_sweep_id"
# In a multirun job's Hydra folder when ``output.dir`` put its results elsewhere: that folder's
# absolute path (kvsim-collect follows it, so collecting the sweep folder finds every job).
RESULTS_POINTER = ".kvsim_results"
# The first line of an INCOMPLETE marker the CLI writes for a rejected run; the second line
# is "overrides: " and the run's overrides as a JSON list (kvsim-collect reports them).
FAILED_PREFIX = "this run failed:"
OVERRIDES_PREFIX = "overrides: "


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


def output_files_problem(run_dir, summary: dict, sizes: bool = True) -> str | None:
    """What is wrong with the files a run's ``summary.json`` (``summary``, a dict) lists in
    ``output_files`` (``[[file name, bytes], ...]``, written by :func:`sim.run.run_simulation`;
    absent in summaries of kvsim before b5d3cad, which pass): a malformed list, a file gone,
    or, with ``sizes``, one of another size than written. None when all are as written.
    ``output.skip_completed`` (:func:`sim.run.is_complete`) reruns such a run; ``kvsim-collect``
    lists it as failed (without ``sizes``: it reads the tables themselves)."""
    files = summary.get("output_files")
    if files is not None and not isinstance(files, list):
        return f"summary.json's output_files is {str(files)[:40]!r}, not a list of [file name, bytes]"
    for f in files or []:
        if not (isinstance(f, list) and len(f) == 2 and isinstance(f[0], str)
                and isinstance(f[1], int) and not isinstance(f[1], bool)):
            return f"summary.json's output_files entry {str(f)[:40]!r} is not [file name, bytes]"
        p = Path(run_dir) / f[0]
        if not p.is_file():
            return f"{f[0]} is missing (the run wrote it, {f[1]:,} bytes)"
        if sizes and p.stat().st_size != f[1]:
            return f"{f[0]} is {p.stat().st_size:,} bytes, the run wrote {f[1]:,}"
    return None


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


class FailedRunsExit(Callback):
    """``on_multirun_start``: give the sweep a new id (see the module doc).
    ``on_multirun_end``: list the sweep's rejected jobs on stderr and exit with status 2; when
    none was rejected, say on stderr how many jobs ran and how to collect them."""

    def on_multirun_start(self, config, **kwargs) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        try:
            sweep.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # (Hydra's sweeper ended with a traceback from its own mkdir)
            import sys

            why = e.strerror or type(e).__name__
            print(f"kvsim: error: hydra.sweep.dir={sweep}: cannot create the sweep folder "
                  f"({why}: {e.filename or sweep}); expected a folder kvsim can create and write",
                  file=sys.stderr)
            sys.exit(2)
        (sweep / SWEEP_ID).write_text(f"{time.time_ns()}-{os.getpid()}\n")

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
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
        root_id = (sweep / SWEEP_ID).read_text().strip() if (sweep / SWEEP_ID).is_file() else None
        jobs = [p.parent for p in sweep.rglob(SWEEP_ID) if p.parent != sweep
                and p.read_text().strip() == root_id]
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
