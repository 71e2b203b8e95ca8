"""A sweep job's claim on its ``output.dir``: the file (:data:`sim.folders.JOB_CLAIM`) that
says which job of which sweep writes there, so that two jobs of one sweep, or a job and a job of
another sweep still running, never write one folder."""

from __future__ import annotations

import os
from pathlib import Path

from ..folders import JOB_CLAIM, SWEEP_ID, sweep_root


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
    from ..sweep import sweep_running

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


def sweep_results_claim(out_dir: Path) -> str | None:
    """When ``out_dir`` holds the results of a sweep's job (the sweep id a job writes into its
    results folder, :data:`sim.folders.SWEEP_ID`), whether or not that sweep still runs:
    ``"job N of the sweep in DIR"`` (N from the job's claim when ``output.dir`` put it there,
    else the folder's name; DIR the nearest folder above holding the sweep's id, or "a sweep"
    when none does); else None. A single run into such a folder would replace that job's
    results and ``kvsim-collect`` would take them for the job's."""
    try:
        if not (out_dir / SWEEP_ID).is_file():
            return None
    except OSError:
        return None
    held = read_claim(out_dir)
    job = held[1] if held is not None else out_dir.name
    root = held[2] if held is not None and held[2] is not None else sweep_root(out_dir)
    return f"job {job} of the sweep in {root}" if root is not None else f"job {job} of a sweep"


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
