"""Collect a kvsim sweep into Parquet files that pandas, pyarrow and DuckDB read directly.

``kvsim-collect SWEEP_DIR [--out DIR]`` (or ``python -m experiments.collect ...``) walks a sweep
directory written by ``kvsim -m ...`` (Hydra's ``multirun/<date>/<time>``, one sub-directory per
run) and writes into ``DIR`` (default ``SWEEP_DIR/collected``; ``kvsim-collect RUN_DIR``
collects one run's folder as a one-run sweep into ``RUN_DIR-collected`` beside it):

* ``runs.parquet``: one row per completed run. Columns:

  - ``run_id`` (the run's directory relative to the sweep dir, e.g. ``"3"``), ``job`` (Hydra's
    job number, int), ``run_dir`` (absolute path), ``overrides`` (the run's command-line
    overrides joined by spaces);
  - one column per config group choice, named by the group (``model``, ``gpu``, ``trace``,
    ``cache``, ... and ``tiers``, ``codec``, ``policy``, ``compaction`` where the config has them),
    holding the option name (e.g. ``codec = "nvfp4"``), from ``.hydra/hydra.yaml``;
  - every leaf of the resolved config as a dotted column (``cache.block_size``,
    ``tiers.host_gib``, ``trace.max_requests``, ...); list values are JSON strings;
  - every leaf of ``summary.json`` as a dotted column (``ttft_s.p50``, ``hit_ratio.host``,
    ``wall.wall_s``, ...) but ``config_choices`` (the group columns above). A summary key whose name is already taken by a config or group column
    (``model``, ``gpu``, ``trace``, ``seed``; a group of any run of the sweep) is stored as
    ``summary.<key>``.

* ``<table>/``: one partitioned Parquet dataset per per-run table the runs wrote
  (``requests.parquet`` → ``requests/``, likewise ``steps``, ``transfers``, ``rounds``, ...),
  hive-partitioned by job number (``requests/job=3/part-0.parquet``). Every row carries
  ``run_id`` and the run's override columns (the group choices and config keys that appear in any
  run's overrides, e.g. ``codec``, ``tiers.host_gib``), so one table can be grouped by them
  without a join. Runs lacking a column another run has get nulls (schemas are unified).

* ``failed_runs.csv`` and ``failed_runs.json``: every run directory that is not a completed run
  (``INCOMPLETE`` marker present, no ``summary.json``, unreadable summary, ``complete`` not
  true, a file its ``summary.json`` lists in ``output_files`` deleted, of another size or with
  other bytes than the run wrote: its xxh3-128 digest, the check ``output.skip_completed``
  makes, :func:`sim.folders.output_files_problem`) or whose per-run table cannot be read (a
  truncated or corrupt ``requests.parquet`` of a run whose summary lists no ``output_files``,
  ...; only the tables being collected are read), with the reason (for a table: the file and the Parquet
  error), and every job the sweep was to run that left no folder (the sweep stopped
  before it started, or, while it still runs, has not started it yet:
  :func:`experiments.run_folders.jobs_not_run`), with its overrides. These runs are in no other output; the other runs are collected. Both files are
  always written (empty when every run completed).

* ``manifest.json``: sweep dir, counts, the override keys, the tables written,
  ``sweep_running`` (the sweep's process held its folder as the collection began: the
  collection is partial), and
  ``stale_run_dirs``: job directories left out because they belong to an earlier sweep run into
  the same directory (a larger grid's extra jobs; see ``sim.folders.stale_job``), and
  ``runs_without_config``: collected runs that had no config file (see below), ``sweeps``:
  the multiruns the runs come from (``{sweep id: [run ids]}``, ``""`` for single runs; more
  than one sweep is warned about on stderr: a results folder should hold one sweep), and
  ``runs_missing_tables``: for each table some complete runs lack (``steps`` with
  ``output.write_steps=false``, or a file deleted from a run of a kvsim that kept no
  ``output_files``), those runs (also a note on stderr).

Runs with missing or inconsistent files:

* A completed run without its ``.hydra/`` folder (e.g. copied without dotfiles) is collected with
  what it has: its ``summary.json`` (which also records the run's overrides), its tables, and its
  own ``config.yaml`` when there is one. Without a config file its config columns come from its
  overrides only (values typed as Hydra would: ``20`` -> int, ``0.5`` -> float, ``true`` ->
  bool), other config columns are null. Its group columns (``model``, ``codec``, ...) hold the
  options its ``summary.json`` records (``config_choices``: every group, written by the CLI);
  for a summary without them (an older kvsim, a programmatic run) the options its overrides
  choose (``codec=nvfp4``), null for groups its overrides do not name.
  Runs with no config file at all are listed on stderr and in the manifest's
  ``runs_without_config``; they are not failures (``--strict`` does not count them).
* A column whose types differ between runs and cannot be unified (e.g. ``ttft_s`` stored as
  strings in one run, as doubles in the others) stops the collection with a CollectError
  (``kvsim-collect`` exit status 2) naming the table, the column, each type with the runs that have
  it, and the file of the odd run; nothing is written. The collector does not guess which run is
  wrong: fix or remove the odd file, or leave the table out with ``--tables``. Columns that
  unify (int and double, a column that is all null in one run) are promoted as usual.

Reading::

    import pandas as pd, pyarrow.dataset as ds
    runs = pd.read_parquet("collected/runs.parquet")
    req = pd.read_parquet("collected/requests")                       # all runs
    req = ds.dataset("collected/requests", partitioning="hive").to_table(
        filter=ds.field("job") == 3).to_pandas()
    # DuckDB: SELECT * FROM read_parquet('collected/requests/*/*.parquet', hive_partitioning=true)

The output directory is built beside ``DIR`` and renamed into place, so a reader never sees a
half-written collection. ``DIR`` must be a new or empty directory or an earlier collection (a
directory whose ``manifest.json`` kvsim-collect wrote), which is replaced whole (files added to
it are deleted). Refused before anything is read or written (exit status 2, one line naming
``DIR``): the sweep directory itself, a directory containing it, a directory inside it other
than the default ``SWEEP_DIR/collected``, a run directory, an existing file, and a non-empty
directory that is not a collection. ``--tables`` names must be tables some run wrote (an unknown
name is an error listing the tables there are).

Runs that failed are listed on stderr with a warning line (how many, and the path of
``failed_runs.csv``) and on stdout's summary; the exit status stays 0 unless ``--strict``, or
unless no run completed (exit status 1: there is nothing to analyse).

This module runs the collection and the command; the run folders are read by
:mod:`experiments.run_folders`, the tables built by :mod:`experiments.collect_tables`.
"""


from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


# the kvsim-collect command (its console script, python -m experiments.collect): Ctrl-C or
# SIGTERM while the modules below load (a second or so) is one line, nothing written yet
_COMMAND = __name__ == "__main__" or Path(sys.argv[0]).name == "kvsim-collect"
if _COMMAND:
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
try:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from experiments.collect_tables import (UnreadableTable, check_table_files, flatten, override_key,
                                            override_keys, override_values, run_row, table_from_rows,
                                            write_failed, write_table_dataset)
    from experiments.run_folders import (MARKER, CollectError, RunInfo, check_out_dir,
                                         default_out_dir, find_run_dirs, jobs_not_run,
                                         mark_running_jobs, one_line, read_run, results_dir)
    from sim.folders import RESULTS_POINTER, stale_job
    from sim.sweep import SWEEP_LOCK, read_ledger, sweep_running
except KeyboardInterrupt as _e:
    if not _COMMAND:
        raise
    from sim.console import exit_after_interrupt

    print("kvsim-collect: stopped by SIGTERM; nothing was written" if str(_e) == "SIGTERM" else
          "\nkvsim-collect: interrupted; nothing was written", file=sys.stderr)
    exit_after_interrupt(143 if str(_e) == "SIGTERM" else 130)

@dataclass
class CollectResult:
    """What :func:`collect` wrote: the output dir, the runs frame, failed runs, rows per table."""

    out_dir: Path
    runs: pd.DataFrame
    failed: list[RunInfo]
    tables: dict[str, int]
    override_keys: list[str]
    sweep_running: bool = False  # the sweep held its folder as the collection began: partial


def collect(sweep_dir, out_dir=None, tables: list[str] | None = None, quiet: bool = False) -> CollectResult:
    """Collect ``sweep_dir`` into ``out_dir`` (default ``sweep_dir/collected``; for one run's
    folder, collected as a one-run sweep, ``RUN_DIR-collected`` beside it:
    :func:`experiments.run_folders.default_out_dir`); see the module doc.

    ``tables``: per-run table names to collect (default: every ``*.parquet`` the runs wrote); a
    name no run wrote raises CollectError listing the names there are (nothing is written).
    ``out_dir`` is checked by :func:`check_out_dir` first (CollectError when it is the sweep, in
    or around it, a run directory, a file, or a non-empty directory that is no collection).
    Incomplete runs, and runs with an unreadable table among those collected, are listed on
    stderr (unless ``quiet``) and in ``failed_runs.csv/json``; runs without a ``.hydra/`` record
    are collected (those without any config file are listed on stderr). Raises CollectError naming the path when the sweep dir is
    missing or holds no run directory, or a run's config / Hydra files cannot be read; naming the
    table, column, types and runs when a column's types differ between runs. The output
    directory is replaced atomically (built as ``.<name>.tmp-<pid>`` beside it, then renamed).
    The lock ``.<name>.lock`` beside it (:mod:`sim.locks`) is held from before the sweep is
    read until the collection is in place: a second kvsim-collect into the same directory
    meanwhile raises CollectError (one line, nothing written), and the temporary folders of a
    killed one are removed.

    A sweep still running (its process holds the sweep folder's lock,
    :func:`sim.sweep.sweep_running`) is collected as it stands: its jobs not started yet and
    those running are failed runs saying so, ``sweep_running`` is True in the result and the
    manifest, and a line on stderr says the collection is partial. The job ledger is read
    before the folders are scanned, so a job that completes during the scan is not taken for
    one whose folder was removed.
    """
    sweep = Path(sweep_dir)
    out = Path(out_dir) if out_dir is not None else default_out_dir(sweep)
    if sweep.is_dir():  # (a missing sweep dir is find_run_dirs' error)
        check_out_dir(sweep, out)
    else:
        find_run_dirs(sweep)
    from sim.errors import Busy
    from sim.locks import hold

    made = [d for d in (out.parent, *out.parent.parents) if not d.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # one collection into ``out`` at a time, from reading the sweep to renaming the new
        # collection into place; with it held, temporary folders of ``out`` are those of a
        # kvsim-collect that was killed
        lock = hold(out.parent / f".{out.name}.lock")
    except Busy as e:
        raise CollectError(f"{out}: another kvsim-collect ({e.holder}) is writing this "
                           f"collection; expected one kvsim-collect into a folder at a time "
                           f"(wait for it to end)") from None
    except OSError as e:
        why = getattr(e, "strerror", None) or one_line(e)
        raise CollectError(f"{out}: cannot create the output directory (in {out.parent}: "
                           f"{why})") from e
    try:
        runs, runs_table, manifest, stale, keys = _read_and_write(sweep, out, tables)
    except CollectError:  # (nothing written: the folders made for the lock go again)
        lock.release()
        for d in made:  # (release deleted the lock file)
            try:
                d.rmdir()
            except OSError:
                break
        raise
    finally:
        lock.release()
    running = manifest["sweep_running"]
    failed = [r for r in runs if not r.complete]
    written = manifest["tables"]
    if stale and not quiet:
        print(f"kvsim-collect: left out {len(stale)} job directories of an earlier sweep into "
              f"the same directory (another sweep id): "
              f"{', '.join(sorted(d.relative_to(sweep).as_posix() for d in stale))}", file=sys.stderr)
    sweeps = {k: v for k, v in manifest["sweeps"].items() if k}
    if len(sweeps) > 1 and not quiet:
        print(f"kvsim-collect: warning: the runs come from {len(sweeps)} sweeps ("
              + "; ".join(f"{k}: {len(v)} run(s), e.g. {v[0]}" for k, v in sweeps.items())
              + (f"; and {len(manifest['sweeps'][''])} single run(s)" if "" in manifest["sweeps"]
                 else "")
              + "): a figure's curves may pool runs of different sweeps (manifest.json "
                "sweeps; give each sweep its own results folder)", file=sys.stderr)
    partial = [r for r in runs if r.complete and r.config_path is None]
    if partial and not quiet:
        print(f"kvsim-collect: {len(partial)} run(s) have neither .hydra/config.yaml nor "
              f"config.yaml; collected from summary.json and their overrides (config columns "
              f"their overrides do not name are null; group columns come from summary.json's "
              f"config_choices, where it has them): "
              f"{', '.join(str(r.run_dir) for r in partial)}", file=sys.stderr)
    for n, ids in manifest["runs_missing_tables"].items():
        if not quiet:
            print(f"kvsim-collect: note: {len(ids)} complete run(s) wrote no {n}.parquet (other runs "
                  f"did; e.g. output.write_steps=false, or a deleted file): "
                  f"{', '.join(ids[:10])}{' ...' if len(ids) > 10 else ''}; their rows are absent "
                  f"from {n}/ (manifest.json runs_missing_tables)", file=sys.stderr)
    if running and not quiet:
        print(f"kvsim-collect: warning: the sweep {sweep} is still running (a kvsim process "
              f"holds {sweep / SWEEP_LOCK}): this collection is partial, its jobs not started "
              f"yet and those running are listed as failed; collect again after it ends",
              file=sys.stderr)
    if failed and not quiet:
        print(f"kvsim-collect: warning: {len(failed)} of {len(runs)} runs did not complete or have "
              f"an unreadable table and were left out (listed in {out / 'failed_runs.csv'}; "
              + ("exit status 0 unless --strict):" if len(failed) < len(runs) else
                 "none completed: exit status 1):"), file=sys.stderr)
        for r in failed:
            print(f"  {r.run_dir}: {r.failure}  [{' '.join(r.overrides)}]", file=sys.stderr)
    return CollectResult(out, runs_table.to_pandas(), failed, written, keys, running)


def _read_and_write(sweep: Path, out: Path, tables: list[str] | None):
    """Read the runs of ``sweep`` and write their collection into ``out`` (the caller holds
    ``out``'s lock): (runs, runs table, manifest, stale job folders, override keys)."""
    # whether the sweep runs, and its ledger, before its folders are scanned (see collect)
    running = sweep.is_dir() and sweep_running(sweep)
    ledger = read_ledger(sweep) if sweep.is_dir() else {}
    run_dirs = find_run_dirs(sweep, exclude=out)
    # a results folder inside the sweep that a job's pointer names is that job's, not a run
    targets = {results_dir(d)[0].resolve() for d in run_dirs if (d / RESULTS_POINTER).is_file()}
    run_dirs = [d for d in run_dirs if d.resolve() not in targets]
    # job directories an earlier, larger sweep left in a sweep directory run again
    stale = [d for d in run_dirs if d != sweep and stale_job(d)]
    run_dirs = [d for d in run_dirs if d not in stale]
    runs = [read_run(d, sweep, i) for i, d in enumerate(run_dirs)]
    if running and sweep not in run_dirs:
        mark_running_jobs(sweep, runs, read_ledger(sweep))
    # jobs the sweep was to run that left no folder (it stopped before they started, or, while
    # it runs, has not started them yet)
    runs += jobs_not_run(sweep, runs, ledger, running) if sweep not in run_dirs else []
    if not runs:
        raise CollectError(
            f"{sweep}: no kvsim run directories found (expected sub-directories with "
            f".hydra/overrides.yaml, summary.json or an {MARKER} marker, as `kvsim -m` writes)")
    runs.sort(key=lambda r: (r.job if r.job is not None else 1 << 62, r.run_id))
    jobs = [r.job for r in runs]
    if len(set(jobs)) != len(jobs):  # e.g. nested sweeps: number runs by sorted position
        for i, r in enumerate(runs):
            r.job = i
    # runs without .hydra/hydra.yaml (copied without dotfiles, output.dir runs): their group
    # choices are the groups their overrides name
    groups = {g for r in runs for g in r.choices}
    no_hydra = [r for r in runs if not r.has_hydra]
    for r in no_hydra:
        for ov in r.overrides:
            kv = override_key(ov)
            if kv is not None and kv[0] in groups:
                r.choices.setdefault(kv[0], kv[1])
    keys = override_keys(runs)
    wanted = sorted({n for r in runs for n in r.tables})
    if tables is not None:
        unknown = [t for t in dict.fromkeys(tables) if t not in wanted]
        if unknown:
            import difflib

            near = sorted({m for t in unknown for m in difflib.get_close_matches(t, wanted, n=3)})
            raise CollectError(
                f"--tables: no run of {sweep} wrote {', '.join(repr(t) for t in unknown)} "
                f"(<table>.parquet); tables the runs wrote: {', '.join(wanted) or 'none'}"
                + (f"; did you mean {', '.join(near)}?" if near else ""))
        wanted = [n for n in wanted if n in tables]
    check_table_files([r for r in runs if r.complete], wanted)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    runs_table, manifest = _collect_into(out, tmp, runs, wanted, keys, groups, sweep, stale,
                                         running)
    return runs, runs_table, manifest, stale, keys


def _leftovers(out: Path) -> list[Path]:
    """Temporary folders of collections into ``out`` (``.<name>.tmp-<pid>``, ``.<name>.old-<pid>``
    beside it)."""
    import re

    pat = re.compile(re.escape(f".{out.name}.") + r"(tmp|old)-[0-9]+")
    try:
        return [p for p in out.parent.iterdir() if pat.fullmatch(p.name) and p.is_dir()]
    except OSError:
        return []


# the output folders this process's collections have written (renamed into place): an
# interrupt after that leaves the new collection, whole
_replaced: list[Path] = []


def _collect_into(out: Path, tmp: Path, runs: list[RunInfo], wanted: list[str],
                  keys: list[str], groups: set, sweep: Path,
                  stale: list[Path], running: bool) -> tuple[pa.Table, dict]:
    """Write the collection of ``runs`` into the temporary folder ``tmp`` and rename it to
    ``out`` (an earlier collection there is replaced), while holding ``out``'s lock: the
    temporary folders a killed kvsim-collect left beside ``out`` are removed first. A run
    whose table turns out unreadable is marked failed and the tables written again. Returns
    the runs table and the manifest written."""
    for old in _leftovers(out):
        shutil.rmtree(old, ignore_errors=True)
    try:
        tmp.mkdir()
    except OSError as e:
        why = getattr(e, "strerror", None) or one_line(e)  # (the error names the temporary name)
        raise CollectError(f"{out}: cannot create the output directory (in {out.parent}: "
                           f"{why})") from e
    try:
        while True:  # a table that fails past its footer drops its run; write again without it
            done = [r for r in runs if r.complete]
            extra = {r.run_id: override_values(r, keys, flatten(r.config)) for r in done}
            names = [n for n in wanted if any(n in r.tables for r in done)]
            try:
                written = {n: write_table_dataset(n, done, extra, tmp) for n in names}
            except UnreadableTable as e:
                e.run.failure = e.reason
                for n in names:
                    shutil.rmtree(tmp / n, ignore_errors=True)
                continue
            break
        failed = [r for r in runs if not r.complete]
        rows = [run_row(r, groups) for r in done]
        runs_table = table_from_rows(rows) if rows else pa.table({"run_id": pa.array([], pa.string())})
        pq.write_table(runs_table, tmp / "runs.parquet")
        write_failed(failed, tmp)
        manifest = {
            "sweep_dir": str(sweep.resolve()),
            "collected_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "runs_total": len(runs),
            "runs_complete": len(done),
            "runs_failed": len(failed),
            # the sweep held its folder as the collection began: its jobs not started yet and
            # those running are failed runs, and this collection is partial
            "sweep_running": running,
            "stale_run_dirs": sorted(d.relative_to(sweep).as_posix() for d in stale),
            "runs_without_config": [r.run_id for r in done if r.config_path is None],
            # the multiruns the collected runs come from: {sweep id: [run ids]} ("" for runs
            # of no sweep), more than one when a results folder mixes sweeps
            "sweeps": {k: [r.run_id for r in runs if (r.sweep_id or "") == k]
                       for k in sorted({r.sweep_id or "" for r in runs})},
            "runs_missing_tables": {n: [r.run_id for r in done if n not in r.tables]
                                    for n in names if any(n not in r.tables for r in done)},
            "override_keys": keys,
            "tables": written,
        }
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.replace(out, old)
            try:
                os.replace(tmp, out)
            except BaseException:  # (Ctrl-C, SIGTERM between the renames: the earlier one back)
                if not out.exists():
                    os.replace(old, out)
                raise
            _replaced.append(out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
            _replaced.append(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return runs_table, manifest


def run_sweep(overrides: list[str], sweep_dir, n_jobs: int = 2, fresh: bool = True,
              resume: bool = True, out_dir=None, timeout_s: float | None = 1800) -> CollectResult:
    """Run ``kvsim -m <overrides>`` into ``sweep_dir`` with the local joblib launcher
    (``n_jobs`` workers, -1 = all cores) and collect it (into ``out_dir``, default
    ``sweep_dir/collected``). Used by the notebooks.

    ``fresh``: delete ``sweep_dir`` first (results of an older simulator are never reused);
    ``resume``: pass ``output.skip_completed=true`` (with ``fresh=False`` an interrupted sweep
    continues). Runs ``sys.executable -m sim.cli`` so the current environment's kvsim is used.
    Raises RuntimeError with the tail of kvsim's stderr if the sweep fails, and
    subprocess.TimeoutExpired after ``timeout_s`` seconds.
    """
    import subprocess

    sweep = Path(sweep_dir).resolve()
    if fresh and sweep.exists():
        shutil.rmtree(sweep)
    cmd = [sys.executable, "-m", "sim.cli", "-m", "hydra/launcher=local",
           f"hydra.launcher.n_jobs={int(n_jobs)}", f"hydra.sweep.dir={sweep}",
           "sim.progress=false", "output.print_summary=false",
           *(["output.skip_completed=true"] if resume else []), *overrides]
    repo = Path(__file__).resolve().parent.parent
    r = subprocess.run(cmd, cwd=repo, capture_output=True, text=True, timeout=timeout_s)
    if r.returncode != 0:
        tail = "\n".join((r.stderr or r.stdout).splitlines()[-25:])
        raise RuntimeError(f"sweep into {sweep} failed (exit {r.returncode}): {' '.join(cmd)}\n{tail}")
    return collect(sweep, out_dir)


def main(argv: list[str] | None = None) -> int:
    """``kvsim-collect`` console entry point. Exit status: 0 collected (incomplete runs and runs
    with an unreadable table are listed with a warning on stderr, not fatal), 1 when no run
    completed, or with ``--strict`` when some run failed (the collection is still written, its
    failed runs listed), 2 bad sweep directory (message names
    the path), an ``--out`` that :func:`check_out_dir` refuses, an unknown ``--tables`` name, or a
    column whose types differ between runs (message names the table, column, types and runs);
    130 (Ctrl-C) or 143 (SIGTERM) with one line: the output directory is as it was, or holds
    the new collection whole when it was written first (a collection replaces it whole or not
    at all: :func:`collect`)."""
    import signal
    import threading

    # (the caller's SIGTERM handler is put back on return: main is also called in-process)
    before = signal.signal(signal.SIGTERM, _on_sigterm) \
        if threading.current_thread() is threading.main_thread() else None
    try:
        return _main(argv)
    except KeyboardInterrupt as e:
        ap = argparse.ArgumentParser(add_help=False)
        ap.add_argument("sweep_dir", nargs="?")
        ap.add_argument("--out", default=None)
        known = ap.parse_known_args(argv)[0]
        out = known.out if known.out is not None else (
            default_out_dir(known.sweep_dir) if known.sweep_dir else "the output directory")
        how = ("kvsim-collect: stopped by SIGTERM" if str(e) == "SIGTERM" else
               "\nkvsim-collect: interrupted")
        if _replaced:
            print(f"{how} after the collection was written; {_replaced[-1]} holds it whole",
                  file=sys.stderr)
        else:
            print(f"{how}; {out} was left as it was", file=sys.stderr)
        if _COMMAND:  # (the process ends here; in-process callers get the status)
            from sim.console import exit_after_interrupt

            exit_after_interrupt(143 if str(e) == "SIGTERM" else 130)
        return 143 if str(e) == "SIGTERM" else 130
    finally:
        if before is not None:
            signal.signal(signal.SIGTERM, before)


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(
        prog="kvsim-collect",
        description="Collect a kvsim sweep (kvsim -m ...) into runs.parquet, partitioned per-run "
                    "tables (requests/, steps/, ...) and failed_runs.csv.")
    ap.add_argument("sweep_dir", help="sweep directory (e.g. multirun/2026-01-01/12-00-00-000000), "
                                      "or one run's folder, collected as a one-run sweep")
    ap.add_argument("--out", default=None,
                    help="output directory (default SWEEP_DIR/collected; for one run's folder "
                         "RUN_DIR-collected beside it, never inside the run's folder): a new or "
                         "empty directory, or an earlier kvsim-collect output, which is replaced")
    ap.add_argument("--tables", default=None,
                    help="comma-separated per-run tables to collect, each one some run wrote "
                         "(default: all, e.g. requests,steps)")
    ap.add_argument("--strict", action="store_true", help="exit 1 if any run did not complete")
    args = ap.parse_args(argv)
    tables = None
    if args.tables is not None:
        tables = [t.strip() for t in args.tables.split(",") if t.strip()]
        if not tables:
            print(f"kvsim-collect: error: --tables {args.tables!r}: expected comma-separated table "
                  f"names (e.g. requests,steps)", file=sys.stderr)
            return 2
    try:
        res = collect(args.sweep_dir, args.out, tables=tables)
    except CollectError as e:
        print(f"kvsim-collect: error: {e}", file=sys.stderr)
        return 2
    n_ok = len(res.runs)
    written = ", ".join(f"{k} ({v:,} rows)" for k, v in res.tables.items()) or "none"
    print(f"collected {n_ok} complete run(s) of {n_ok + len(res.failed)} into {res.out_dir}")
    print(f"  runs.parquet; tables: {written}; override columns: {', '.join(res.override_keys) or '-'}")
    if res.failed:
        print(f"  {len(res.failed)} failed run(s) left out: see {res.out_dir / 'failed_runs.csv'}")
    if not n_ok:
        print(f"kvsim-collect: error: no run in {args.sweep_dir} completed; there is nothing to "
              f"analyse (the failed runs are listed in {res.out_dir / 'failed_runs.csv'})",
              file=sys.stderr)
        return 1
    return 1 if (args.strict and (res.failed or res.sweep_running)) else 0


if __name__ == "__main__":
    sys.exit(main())
