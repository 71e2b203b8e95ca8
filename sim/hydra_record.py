"""Hydra's record of a job (``.hydra/config.yaml``, ``hydra.yaml``, ``overrides.yaml``) written
whole or not at all, and a record that could not be written handed to the job as its failure.

Hydra writes the record at a job's start (``hydra.core.utils.run_job``, through its
``_save_config``), before kvsim's job function runs, by truncating each file and writing it.
A write that fails (a full disk or quota, ``ulimit -f``, a read-only folder) left an empty or
cut ``config.yaml`` (in a folder of an earlier complete run: that run's record destroyed) and
ended the run, or the whole sweep, with Hydra's traceback. :func:`install` makes Hydra write
each record file to ``<file>.tmp`` and rename it over the file when whole: a write that fails
removes the temporary file and leaves the earlier file as it was, and the failure is kept for
the job of that folder (:func:`take_failure`), whose job function (:func:`sim.cli.job.app`)
reports it as the job's one-line error (or skips the job when its folder already holds it
complete and ``output.skip_completed`` is set) instead of simulating without a record.
Record files of a folder whose record already failed are not written (the record stays the
earlier one, or none).
"""

from __future__ import annotations

import os
from pathlib import Path

_failed: dict[str, OSError] = {}  # (record folder -> the first write that failed there)
_replaced: dict[str, list[str]] = {}  # (record folder -> files replaced before it failed)


def _key(folder) -> str:
    return os.path.abspath(str(folder))


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through ``path.tmp``, renamed over ``path`` when whole; an
    OSError removes the temporary file (``path`` stays as it was) and names ``path``."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        if e.filename is None or str(e.filename) == str(tmp):
            e.filename = str(path)
        raise


def install() -> None:
    """Make Hydra's job record (``hydra.core.utils._save_config``, which ``run_job`` calls for
    every launcher) write through :func:`write_whole` and keep a failure for
    :func:`take_failure` instead of raising it (once per process)."""
    import hydra.core.utils as U
    from omegaconf import OmegaConf

    if getattr(U._save_config, "_kvsim_record", False):
        return

    def save_config(cfg, filename: str, output_dir: Path) -> None:
        key = _key(output_dir)
        if filename == "config.yaml":  # (the first file of a job's record: a new record)
            _failed.pop(key, None)
            _replaced[key] = []
        if key in _failed:
            return
        try:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            write_whole(Path(output_dir) / filename, OmegaConf.to_yaml(cfg))
            _replaced.setdefault(key, []).append(filename)
        except OSError as e:
            if e.filename is None:
                e.filename = str(Path(output_dir) / filename)
            _failed[key] = e

    save_config._kvsim_record = True
    U._save_config = save_config


def take_failure(folder) -> tuple[OSError, list[str]] | None:
    """The write of the record folder ``folder`` that failed at this job's start and the
    record files replaced before it (those now belong to this job, the rest to an earlier
    run); None when the record was written whole. Forgets it."""
    key = _key(folder)
    e = _failed.pop(key, None)
    replaced = _replaced.pop(key, [])
    return None if e is None else (e, replaced)
