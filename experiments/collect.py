"""Collect a kvsim sweep into Parquet files that pandas, pyarrow and DuckDB read directly.

``kvsim-collect SWEEP_DIR [--out DIR]`` (or ``python -m experiments.collect ...``) walks a sweep
directory written by ``kvsim -m ...`` (Hydra's ``multirun/<date>/<time>``, one sub-directory per
run) and writes into ``DIR`` (default ``SWEEP_DIR/collected``):

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
  true, a file its ``summary.json`` lists in ``output_files`` deleted since the run) or whose
  per-run table cannot be read (a truncated or corrupt ``requests.parquet``, ...;
  only the tables being collected are read), with the reason (for a table: the file and the
  Parquet error). These runs are in no other output; the other runs are collected. Both files are
  always written (empty when every run completed).

* ``manifest.json``: sweep dir, counts, the override keys, the tables written, and
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
"""

from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import math
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from sim.folders import (FAILED_PREFIX, JOB_CLAIM, OVERRIDES_PREFIX, RESULTS_POINTER, SWEEP_ID, is_collection,
                         output_files_problem, stale_job)

MARKER = "INCOMPLETE"  # same name as sim.run.MARKER (not imported: collecting needs no simulator)

# Override keys that say how a run was executed, not what was simulated: they never become
# columns of the per-request tables (they are still in ``overrides`` and in the config columns).
BOOKKEEPING_PREFIXES = ("hydra.", "hydra/", "output.", "sim.progress", "sim.check_invariants")

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


def _is_run_dir(p: Path) -> bool:
    return ((p / ".hydra" / "overrides.yaml").is_file() or (p / "summary.json").is_file()
            or (p / MARKER).exists() or (p / RESULTS_POINTER).is_file())


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
    itself, a directory containing it, one inside it (except the default ``SWEEP_DIR/collected``),
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
    if o.is_relative_to(sw) and o != sw / "collected":
        raise CollectError(f"{what}: is inside the sweep directory {sweep_dir} (only the default "
                           f"{Path(sweep_dir) / 'collected'} may be); choose a directory outside "
                           f"the sweep")
    try:
        non_empty = o.is_dir() and any(o.iterdir())
    except OSError as e:
        raise CollectError(f"{what}: cannot list directory: {_one_line(e)}") from e
    if non_empty and not is_collection(o):
        raise CollectError(f"{what}: is a non-empty directory that is not a kvsim-collect output "
                           f"(no kvsim-collect manifest.json); it would be replaced, deleting its "
                           f"files: choose a new or empty directory")


def find_run_dirs(sweep_dir, exclude: Path | None = None) -> list[Path]:
    """Run directories under ``sweep_dir`` (a directory holding ``.hydra/overrides.yaml``,
    ``summary.json``, an ``INCOMPLETE`` marker, or the pointer a multirun job leaves when its
    ``output.dir`` is elsewhere: :func:`results_dir`); not descending into a run directory.

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
        else:
            info.failure = "INCOMPLETE marker present (run interrupted, crashed or still running)"
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
            elif (gone := output_files_problem(run_dir, summary, sizes=False)) is not None:
                # (sizes are not compared: a truncated or corrupt table is found when it is
                # read, with the Parquet error; one rewritten since is collected if it reads)
                info.failure = gone
            elif (mixed := labels_problem(info, summary)) is not None:
                info.failure = mixed
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
            return mixed(f"{info.config_path} cannot be read back ({_one_line(e)})")
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


def flatten(d: dict, prefix: str = "", sep: str = ".") -> dict[str, Any]:
    """Flatten nested dicts into ``{"a.b.c": leaf}``; lists become JSON strings, NaN becomes None.

    An empty dict becomes no key.
    """
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten(v, key, sep))
        elif isinstance(v, (list, tuple)):
            out[key] = json.dumps(v, default=str)
        elif isinstance(v, float) and math.isnan(v):
            out[key] = None
        else:
            out[key] = v
    return out


def _override_key(ov: str) -> tuple[str, str] | None:
    """``"cache.block_size=32"`` -> ``("cache.block_size", "32")``; ``"~x"`` -> None."""
    s = ov.strip()
    if s.startswith("~") or "=" not in s:
        return None
    key, val = s.split("=", 1)
    key = key.lstrip("+")
    if "@" in key:  # group@package=option
        key = key.split("@", 1)[0]
    return key, val


def parse_override_value(text: str) -> Any:
    """The typed value of an override's right-hand side, as Hydra reads a plain value:
    ``"20"`` -> 20, ``"0.5"`` -> 0.5, ``"true"`` -> True, ``"null"`` -> None, ``"'x'"`` -> ``"x"``;
    anything else (``"nvfp4"``, ``"[1,2]"``) stays the string it is."""
    s = text.strip()
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low == "null":
        return None
    if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"":
        return s[1:-1]
    try:
        return int(s.replace("_", "")) if s.lstrip("+-").replace("_", "").isdigit() else float(s)
    except ValueError:
        return s


def override_keys(runs: list[RunInfo]) -> list[str]:
    """The override keys of a sweep, in first-seen order, without bookkeeping keys.

    A group override (``codec=nvfp4``) yields the group name; a value override
    (``tiers.host_gib=32``) yields the dotted key.
    """
    keys: list[str] = []
    for r in runs:
        for ov in r.overrides:
            kv = _override_key(ov)
            if kv is None:
                continue
            k = kv[0]
            if k.startswith(BOOKKEEPING_PREFIXES) or k in keys:
                continue
            keys.append(k)
    return keys


def _override_values(run: RunInfo, keys: list[str], flat_cfg: dict[str, Any]) -> dict[str, Any]:
    """The run's value for each override key: the group choice for a group, else the resolved
    config value (typed), else the override's value typed by :func:`parse_override_value` (a run
    without a config file)."""
    literal = {}
    for ov in run.overrides:
        kv = _override_key(ov)
        if kv is not None:
            literal[kv[0]] = parse_override_value(kv[1])
    out = {}
    for k in keys:
        if k in run.choices:
            out[k] = run.choices[k]
        elif k in flat_cfg:
            out[k] = flat_cfg[k]
        else:
            out[k] = literal.get(k)
    return out


def _column_array(values: list) -> pa.Array:
    """A typed Arrow array for one column's values; mixed types fall back to strings."""
    try:
        arr = pa.array(values, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        arr = pa.array([None if v is None else (v if isinstance(v, str) else json.dumps(v, default=str))
                        for v in values], type=pa.string())
    if pa.types.is_null(arr.type):
        arr = arr.cast(pa.string())
    return arr


def _table_from_rows(rows: list[dict[str, Any]]) -> pa.Table:
    cols: list[str] = []
    seen = set()
    for r in rows:
        for k in r:
            if k not in seen:
                seen.add(k)
                cols.append(k)
    return pa.table({c: _column_array([r.get(c) for r in rows]) for c in cols})


def run_row(run: RunInfo, groups: set[str] | None = None) -> dict[str, Any]:
    """The ``runs.parquet`` row of a completed run (see the module docstring for the columns).

    ``groups``: the config group names of the whole sweep (default: the run's own choices); a
    summary key named like one of them is stored as ``summary.<key>`` even in a run that lacks
    that group's choice (no ``.hydra/`` record), so one column never mixes the two meanings.
    A run without a config file gets its config columns from its overrides (typed values).
    """
    if run.summary is None:
        raise ValueError(f"{run.run_dir}: run is not complete ({run.failure})")
    groups = set(run.choices) if groups is None else set(groups) | set(run.choices)
    row: dict[str, Any] = {
        "run_id": run.run_id,
        "job": run.job,
        "run_dir": str(run.run_dir),
        "overrides": " ".join(run.overrides),
    }
    for g, opt in run.choices.items():
        row[g] = opt
    for k, v in flatten(run.config).items():
        if k not in row:
            row[k] = v
    if run.config_path is None:  # no config file: what the overrides say is all there is
        for ov in run.overrides:
            kv = _override_key(ov)
            if kv is None or kv[0].startswith(("hydra.", "hydra/")) or kv[0] in row:
                continue
            row[kv[0]] = kv[1] if kv[0] in groups else parse_override_value(kv[1])
    taken = set(row)
    # (config_choices are the group columns above: not repeated as config_choices.<group>)
    for k, v in flatten({k: v for k, v in run.summary.items() if k != "config_choices"}).items():
        top = k.split(".", 1)[0]
        row[f"summary.{k}" if (k in taken or top in groups or top in ("run_id", "job")) else k] = v
    return row


# ---------------------------------------------------------------------------------------------
# Writing


# Errors a Parquet reader raises on a truncated or corrupt file (footer, thrift page headers,
# decompression): OSError for I/O and thrift, ArrowInvalid/ArrowException for the rest.
_PARQUET_ERRORS = (OSError, ValueError, pa.ArrowException)


def _one_line(e: BaseException) -> str:
    """An exception's message on one line (Parquet errors span several)."""
    return " ".join(str(e).split()) or type(e).__name__


class _UnreadableTable(Exception):
    """Internal: one run's table file cannot be read; the run is listed as failed."""

    def __init__(self, run: RunInfo, reason: str):
        super().__init__(reason)
        self.run = run
        self.reason = reason


def _runs_text(runs: list[RunInfo], limit: int = 4) -> str:
    """``"run 3"`` / ``"runs 0, 1, 2, 4 and 7 more"`` for an error message."""
    ids = [r.run_id for r in runs]
    head = ", ".join(ids[:limit]) + (f" and {len(ids) - limit} more" if len(ids) > limit else "")
    return f"{'run' if len(ids) == 1 else 'runs'} {head}"


def _type_conflict(name: str, have: list[RunInfo], schemas: list[pa.Schema]) -> str:
    """The one-line description of the first column of table ``name`` whose types do not unify."""
    cols: dict[str, dict[str, tuple[pa.DataType, list[RunInfo]]]] = {}
    for r, s in zip(have, schemas):
        for f in s:
            by_type = cols.setdefault(f.name, {})
            by_type.setdefault(str(f.type), (f.type, []))[1].append(r)
    for col, by_type in cols.items():
        if len(by_type) < 2:
            continue
        try:
            pa.unify_schemas([pa.schema([pa.field(col, t)]) for t, _ in by_type.values()],
                             promote_options="permissive")
            continue
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
            pass
        groups = sorted(by_type.items(), key=lambda kv: -len(kv[1][1]))  # most common type first
        parts = [f"{t} in {_runs_text(rs)}" for t, (_, rs) in groups]
        odd = groups[-1][1][1][0]  # a run of the least common type
        parts[-1] += f" ({odd.tables[name]})"
        return (f"table {name!r} ({name}.parquet): column {col!r} has incompatible types across "
                f"runs: {'; '.join(parts)}; fix or remove the odd file, or leave the table out "
                f"with --tables")
    return f"table {name!r} ({name}.parquet): the runs' schemas cannot be unified"


def _check_table_files(runs: list[RunInfo], names: list[str]) -> None:
    """Open the footer of every table in ``names`` of every run; a run with an unreadable one
    gets ``failure`` set to the file and the Parquet error (its other tables are not read)."""
    for r in runs:
        for n in names:
            p = r.tables.get(n)
            if p is None:
                continue
            try:
                pq.read_schema(p)
            except _PARQUET_ERRORS as e:
                r.failure = f"{p}: cannot read Parquet file: {_one_line(e)}"
                break


def _write_table_dataset(name: str, runs: list[RunInfo], extra_cols: dict[str, dict[str, Any]],
                         out_dir: Path) -> int:
    """Write table ``name`` of every run into ``out_dir/name/job=<n>/part-0.parquet`` with a unified
    schema plus ``run_id`` and the override columns. Returns the number of rows written.

    Raises CollectError (naming the table, the column, the types and the runs that have each) when
    a column's types differ between runs and cannot be unified, and ``_UnreadableTable`` when one
    run's file cannot be read (the caller lists that run as failed and writes again without it).
    """
    have = [r for r in runs if name in r.tables]
    if not have:
        return 0
    # pass 1: schemas only
    schemas = []
    for r in have:
        try:
            schemas.append(pq.read_schema(r.tables[name]).remove_metadata())
        except _PARQUET_ERRORS as e:
            raise _UnreadableTable(
                r, f"{r.tables[name]}: cannot read Parquet file: {_one_line(e)}") from e
    extra_names = list(next(iter(extra_cols.values())).keys()) if extra_cols else []
    # one typed array per override column over the runs (mixed types fall back to strings for
    # every run alike, so each run's value always fits the column's type)
    extra_arrays = {c: _column_array([extra_cols[r.run_id][c] for r in have]) for c in extra_names}
    try:
        base = pa.unify_schemas(schemas, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
        raise CollectError(_type_conflict(name, have, schemas)) from e
    fields = [pa.field("run_id", pa.string())]
    fields += [pa.field(c, extra_arrays[c].type) for c in extra_names if c not in base.names]
    fields += [f for f in base if f.name not in ("run_id", "job")]
    schema = pa.schema(fields)
    total = 0
    for i, r in enumerate(have):
        try:
            t = pq.read_table(r.tables[name])
        except _PARQUET_ERRORS as e:
            raise _UnreadableTable(
                r, f"{r.tables[name]}: cannot read Parquet file: {_one_line(e)}") from e
        n = t.num_rows
        cols = []
        for f in schema:
            if f.name == "run_id":
                cols.append(pa.array([r.run_id] * n, type=pa.string()))
            elif f.name in t.column_names:
                col = t.column(f.name)
                try:
                    cols.append(col.cast(f.type))
                except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
                    raise CollectError(
                        f"table {name!r} ({name}.parquet): column {f.name!r} of run {r.run_id} "
                        f"({r.tables[name]}) is {col.type}, which does not convert to the "
                        f"{f.type} of the other runs: {_one_line(e)}") from e
            elif f.name in extra_arrays:
                cols.append(extra_arrays[f.name].take(pa.array([i] * n, type=pa.int64())))
            else:
                cols.append(pa.nulls(n, f.type))
        part = out_dir / name / f"job={r.job}"
        part.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(cols, schema=schema), part / "part-0.parquet")
        total += n
    return total


def _write_failed(failed: list[RunInfo], out_dir: Path) -> None:
    rows = [{"run_id": r.run_id, "job": r.job, "run_dir": str(r.run_dir), "reason": r.failure,
             "overrides": " ".join(r.overrides)} for r in failed]
    with open(out_dir / "failed_runs.json", "w") as f:
        json.dump(rows, f, indent=2)
        f.write("\n")
    with open(out_dir / "failed_runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["run_id", "job", "run_dir", "reason", "overrides"])
        w.writeheader()
        w.writerows(rows)


@dataclass
class CollectResult:
    """What :func:`collect` wrote: the output dir, the runs frame, failed runs, rows per table."""

    out_dir: Path
    runs: pd.DataFrame
    failed: list[RunInfo]
    tables: dict[str, int]
    override_keys: list[str]


def collect(sweep_dir, out_dir=None, tables: list[str] | None = None, quiet: bool = False) -> CollectResult:
    """Collect ``sweep_dir`` into ``out_dir`` (default ``sweep_dir/collected``); see the module doc.

    ``tables``: per-run table names to collect (default: every ``*.parquet`` the runs wrote); a
    name no run wrote raises CollectError listing the names there are (nothing is written).
    ``out_dir`` is checked by :func:`check_out_dir` first (CollectError when it is the sweep, in
    or around it, a run directory, a file, or a non-empty directory that is no collection).
    Incomplete runs, and runs with an unreadable table among those collected, are listed on
    stderr (unless ``quiet``) and in ``failed_runs.csv/json``; runs without a ``.hydra/`` record
    are collected (those without any config file are listed on stderr). Raises CollectError naming the path when the sweep dir is
    missing or holds no run directory, or a run's config / Hydra files cannot be read; naming the
    table, column, types and runs when a column's types differ between runs. The output
    directory is replaced atomically (built as ``.<name>.tmp-<pid>`` beside it, then renamed),
    holding the lock ``.<name>.lock`` beside it meanwhile (:mod:`sim.locks`): a second
    kvsim-collect into the same directory raises CollectError, and the temporary folders of a
    killed one are removed.
    """
    sweep = Path(sweep_dir)
    out = Path(out_dir) if out_dir is not None else sweep / "collected"
    if sweep.is_dir():  # (a missing sweep dir is find_run_dirs' error)
        check_out_dir(sweep, out)
    run_dirs = find_run_dirs(sweep, exclude=out)
    # a results folder inside the sweep that a job's pointer names is that job's, not a run
    targets = {results_dir(d)[0].resolve() for d in run_dirs if (d / RESULTS_POINTER).is_file()}
    run_dirs = [d for d in run_dirs if d.resolve() not in targets]
    # job directories an earlier, larger sweep left in a sweep directory run again
    stale = [d for d in run_dirs if d != sweep and stale_job(d)]
    run_dirs = [d for d in run_dirs if d not in stale]
    if not run_dirs:
        raise CollectError(
            f"{sweep}: no kvsim run directories found (expected sub-directories with "
            f".hydra/overrides.yaml, summary.json or an {MARKER} marker, as `kvsim -m` writes)")
    runs = [read_run(d, sweep, i) for i, d in enumerate(run_dirs)]
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
            kv = _override_key(ov)
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
    _check_table_files([r for r in runs if r.complete], wanted)

    from sim.errors import Busy
    from sim.locks import hold

    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        # one collection into ``out`` at a time; with it held, temporary folders of ``out``
        # are those of a kvsim-collect that was killed
        lock = hold(out.parent / f".{out.name}.lock")
    except Busy as e:
        raise CollectError(f"{out}: another kvsim-collect ({e.holder}) is writing this "
                           f"collection; expected one kvsim-collect into a folder at a time "
                           f"(wait for it to end)") from None
    except OSError as e:
        why = getattr(e, "strerror", None) or _one_line(e)
        raise CollectError(f"{out}: cannot create the output directory (in {out.parent}: "
                           f"{why})") from e
    try:
        runs_table, manifest = _collect_into(out, tmp, runs, wanted, keys, groups, sweep, stale)
    finally:
        lock.release()
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
    if failed and not quiet:
        print(f"kvsim-collect: warning: {len(failed)} of {len(runs)} runs did not complete or have "
              f"an unreadable table and were left out (listed in {out / 'failed_runs.csv'}; "
              + ("exit status 0 unless --strict):" if len(failed) < len(runs) else
                 "none completed: exit status 1):"), file=sys.stderr)
        for r in failed:
            print(f"  {r.run_dir}: {r.failure}  [{' '.join(r.overrides)}]", file=sys.stderr)
    return CollectResult(out, runs_table.to_pandas(), failed, written, keys)


def _leftovers(out: Path) -> list[Path]:
    """Temporary folders of collections into ``out`` (``.<name>.tmp-<pid>``, ``.<name>.old-<pid>``
    beside it)."""
    import re

    pat = re.compile(re.escape(f".{out.name}.") + r"(tmp|old)-[0-9]+")
    try:
        return [p for p in out.parent.iterdir() if pat.fullmatch(p.name) and p.is_dir()]
    except OSError:
        return []


def _collect_into(out: Path, tmp: Path, runs: list[RunInfo], wanted: list[str],
                  keys: list[str], groups: set, sweep: Path,
                  stale: list[Path]) -> tuple[pa.Table, dict]:
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
        why = getattr(e, "strerror", None) or _one_line(e)  # (the error names the temporary name)
        raise CollectError(f"{out}: cannot create the output directory (in {out.parent}: "
                           f"{why})") from e
    try:
        while True:  # a table that fails past its footer drops its run; write again without it
            done = [r for r in runs if r.complete]
            extra = {r.run_id: _override_values(r, keys, flatten(r.config)) for r in done}
            names = [n for n in wanted if any(n in r.tables for r in done)]
            try:
                written = {n: _write_table_dataset(n, done, extra, tmp) for n in names}
            except _UnreadableTable as e:
                e.run.failure = e.reason
                for n in names:
                    shutil.rmtree(tmp / n, ignore_errors=True)
                continue
            break
        failed = [r for r in runs if not r.complete]
        rows = [run_row(r, groups) for r in done]
        runs_table = _table_from_rows(rows) if rows else pa.table({"run_id": pa.array([], pa.string())})
        pq.write_table(runs_table, tmp / "runs.parquet")
        _write_failed(failed, tmp)
        manifest = {
            "sweep_dir": str(sweep.resolve()),
            "collected_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "runs_total": len(runs),
            "runs_complete": len(done),
            "runs_failed": len(failed),
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
            os.replace(tmp, out)
            shutil.rmtree(old)
        else:
            os.replace(tmp, out)
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
    column whose types differ between runs (message names the table, column, types and runs)."""
    ap = argparse.ArgumentParser(
        prog="kvsim-collect",
        description="Collect a kvsim sweep (kvsim -m ...) into runs.parquet, partitioned per-run "
                    "tables (requests/, steps/, ...) and failed_runs.csv.")
    ap.add_argument("sweep_dir", help="sweep directory (e.g. multirun/2026-01-01/12-00-00-000000) or one run dir")
    ap.add_argument("--out", default=None,
                    help="output directory (default SWEEP_DIR/collected): a new or empty directory, "
                         "or an earlier kvsim-collect output, which is replaced")
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
    return 1 if (args.strict and res.failed) else 0


if __name__ == "__main__":
    sys.exit(main())
