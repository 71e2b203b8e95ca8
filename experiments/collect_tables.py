"""The tables of a collection, built from the runs :mod:`experiments.run_folders` read:
flattening configs and summaries into dotted columns (:func:`flatten`), the override keys and
their typed values (:func:`override_keys`, :func:`parse_override_value`), the ``runs.parquet``
row of a run (:func:`run_row`, :func:`table_from_rows`), one partitioned dataset per per-run
table with a unified schema (:func:`write_table_dataset`), and the failed-runs list
(:func:`write_failed`). The column layout is described in :mod:`experiments.collect`.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from experiments.run_folders import CollectError, RunInfo, one_line

# Override keys that say how a run was executed, not what was simulated: they never become
# columns of the per-request tables (they are still in ``overrides`` and in the config columns).
BOOKKEEPING_PREFIXES = ("hydra.", "hydra/", "output.", "sim.progress", "sim.check_invariants")


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


def override_key(ov: str) -> tuple[str, str] | None:
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
            kv = override_key(ov)
            if kv is None:
                continue
            k = kv[0]
            if k.startswith(BOOKKEEPING_PREFIXES) or k in keys:
                continue
            keys.append(k)
    return keys


def override_values(run: RunInfo, keys: list[str], flat_cfg: dict[str, Any]) -> dict[str, Any]:
    """The run's value for each override key: the group choice for a group, else the resolved
    config value (typed), else the override's value typed by :func:`parse_override_value` (a run
    without a config file)."""
    literal = {}
    for ov in run.overrides:
        kv = override_key(ov)
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


def column_array(values: list) -> pa.Array:
    """A typed Arrow array for one column's values; mixed types fall back to strings."""
    try:
        arr = pa.array(values, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        arr = pa.array([None if v is None else (v if isinstance(v, str) else json.dumps(v, default=str))
                        for v in values], type=pa.string())
    if pa.types.is_null(arr.type):
        arr = arr.cast(pa.string())
    return arr


def table_from_rows(rows: list[dict[str, Any]]) -> pa.Table:
    cols: list[str] = []
    seen = set()
    for r in rows:
        for k in r:
            if k not in seen:
                seen.add(k)
                cols.append(k)
    return pa.table({c: column_array([r.get(c) for r in rows]) for c in cols})


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
            kv = override_key(ov)
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
PARQUET_ERRORS = (OSError, ValueError, pa.ArrowException)


class UnreadableTable(Exception):
    """One run's table file cannot be read (``run``, ``reason``); the caller lists the run as
    failed."""

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


def check_table_files(runs: list[RunInfo], names: list[str]) -> None:
    """Open the footer of every table in ``names`` of every run; a run with an unreadable one
    gets ``failure`` set to the file and the Parquet error (its other tables are not read)."""
    for r in runs:
        for n in names:
            p = r.tables.get(n)
            if p is None:
                continue
            try:
                pq.read_schema(p)
            except PARQUET_ERRORS as e:
                r.failure = f"{p}: cannot read Parquet file: {one_line(e)}"
                break


def write_table_dataset(name: str, runs: list[RunInfo], extra_cols: dict[str, dict[str, Any]],
                         out_dir: Path) -> int:
    """Write table ``name`` of every run into ``out_dir/name/job=<n>/part-0.parquet`` with a unified
    schema plus ``run_id`` and the override columns. Returns the number of rows written.

    Raises CollectError (naming the table, the column, the types and the runs that have each) when
    a column's types differ between runs and cannot be unified, and ``UnreadableTable`` when one
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
        except PARQUET_ERRORS as e:
            raise UnreadableTable(
                r, f"{r.tables[name]}: cannot read Parquet file: {one_line(e)}") from e
    extra_names = list(next(iter(extra_cols.values())).keys()) if extra_cols else []
    # one typed array per override column over the runs (mixed types fall back to strings for
    # every run alike, so each run's value always fits the column's type)
    extra_arrays = {c: column_array([extra_cols[r.run_id][c] for r in have]) for c in extra_names}
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
        except PARQUET_ERRORS as e:
            raise UnreadableTable(
                r, f"{r.tables[name]}: cannot read Parquet file: {one_line(e)}") from e
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
                        f"{f.type} of the other runs: {one_line(e)}") from e
            elif f.name in extra_arrays:
                cols.append(extra_arrays[f.name].take(pa.array([i] * n, type=pa.int64())))
            else:
                cols.append(pa.nulls(n, f.type))
        part = out_dir / name / f"job={r.job}"
        part.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(cols, schema=schema), part / "part-0.parquet")
        total += n
    return total


def write_failed(failed: list[RunInfo], out_dir: Path) -> None:
    rows = [{"run_id": r.run_id, "job": r.job, "run_dir": str(r.run_dir), "reason": r.failure,
             "overrides": " ".join(r.overrides)} for r in failed]
    with open(out_dir / "failed_runs.json", "w") as f:
        json.dump(rows, f, indent=2)
        f.write("\n")
    with open(out_dir / "failed_runs.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["run_id", "job", "run_dir", "reason", "overrides"])
        w.writeheader()
        w.writerows(rows)


