"""The ``kvsim`` console script (:func:`main`): the command line's checks before Hydra
(:mod:`sim.cli.overrides`), then Hydra's app (:func:`sim.cli.job.app`); a sweep stopped by
Ctrl-C or SIGTERM ends with one line."""

from __future__ import annotations

import logging
import sys

from .job import app
from .overrides import (command_line_overrides, duplicate_override_key, missing_cluster,
                        missing_launcher_plugin, non_boolean_override, unparsable_override)


def _app() -> None:
    """Hydra's app, with Hydra's errors raised rather than printed (HYDRA_FULL_ERROR=1, which
    Hydra reads when it catches one): an error composing the config (an unknown key or group
    option, a value of the wrong type) becomes one ``kvsim: error:`` line naming the override
    and what was expected (:func:`sim.console.hydra_error`), exit status 2; another compact
    Hydra error (``hydra.errors.CompactHydraException``, e.g.
    :class:`sim.sweep.UnrecordedJobFailure`) is its message alone, as Hydra prints one, exit
    status 1; any other exception goes on with its traceback (exit status 1)."""
    import os

    from hydra.errors import CompactHydraException

    from ..console import hydra_error

    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        app()
    except Exception as e:  # noqa: BLE001 - (hydra_error names the ones it translates)
        msg = hydra_error(e)
        if msg is None:
            if isinstance(e, CompactHydraException):
                print(str(e), file=sys.stderr)
                sys.exit(1)
            raise
        print(f"kvsim: error: {msg}", file=sys.stderr)
        sys.exit(2)


def version_line() -> str:
    """``kvsim --version``'s line: kvsim's version (its installed package's metadata) and the
    Hydra it runs on, e.g. ``kvsim 0.1.0 (Hydra 1.3.8)``."""
    from importlib.metadata import PackageNotFoundError, version

    import hydra

    try:
        own = version("kvsim")
    except PackageNotFoundError:  # (the source tree on PYTHONPATH, not installed)
        own = "(not installed)"
    return f"kvsim {own} (Hydra {hydra.__version__})"


def main() -> None:
    """The command after :func:`sim.cli.main` set SIGTERM to raise ``KeyboardInterrupt("SIGTERM")``
    (config and trace errors exit with status 2, one clear line; Ctrl-C or SIGTERM before the
    command reaches Hydra propagates to :func:`sim.cli.main`, which says so in one line)."""
    import signal

    if hasattr(signal, "SIGPIPE"):  # `kvsim --help | head` ends quietly, as Unix tools do
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    argv = sys.argv[1:]
    if "--version" in argv:  # (Hydra's own option prints only Hydra's version)
        print(version_line())
        return
    # a log file that cannot be written (a full disk) is not worth a traceback per line: the
    # run's own error says what happened
    logging.raiseExceptions = False
    import re

    dash_m = any(a in ("-m", "--multirun") for a in argv)
    # a multirun: -m, or Hydra's other spelling, the override hydra.mode=MULTIRUN
    sweep = dash_m or any(re.fullmatch(r"\+*hydra\.mode=['\"]?multirun['\"]?", a, re.IGNORECASE)
                          for a in argv)
    # options that print something instead of running (sweep values are Hydra's to report)
    info = any(a in ("--cfg", "-c", "--info", "-i", "--help", "-h", "--hydra-help", "-sc",
                     "--shell-completion") or a.startswith(("--cfg=", "--info="))
               for a in argv)
    if dash_m and any(a in ("--cfg", "-c") or a.startswith("--cfg=") for a in argv):  # (Hydra's traceback)
        print("kvsim: error: -m runs a sweep and --cfg prints one run's config; expected one of "
              "them (kvsim --cfg job KEY=VALUE ... prints a run's config)", file=sys.stderr)
        sys.exit(2)
    # (SIGTERM stops as Ctrl-C does, with its own line and exit status 143, sim.cli.main: a
    # single run's folder is marked INCOMPLETE, interrupted_outside_run below and sim.cli.job
    # while it simulates; a sweep's launcher ends its workers, which were otherwise left
    # running, orphaned, finishing jobs into folders a resumed sweep reruns)
    args = command_line_overrides(argv)
    err = unparsable_override(args, sweep, single=not sweep and not info) or \
        duplicate_override_key(args) or non_boolean_override(args) or \
        missing_launcher_plugin(args) or \
        (missing_cluster(args) if sweep and not info else None)
    if err is not None:
        print(f"kvsim: error: {err}", file=sys.stderr)
        sys.exit(2)
    try:
        _app()
    except KeyboardInterrupt as e:
        how = "SIGTERM" if str(e) == "SIGTERM" else "Ctrl-C"
        if not sweep:
            from .job import interrupted_outside_run

            state, status = interrupted_outside_run(args, how)
            print("kvsim: stopped by SIGTERM; " if how == "SIGTERM" else "\nkvsim: interrupted; ",
                  state, sep="", file=sys.stderr)
            sys.exit(status)
        from .. import sweep as S

        where = S.held_sweep_dir()
        if where is None:  # (stopped before the sweep took its folder: no job had started)
            print(f"\nkvsim: sweep stopped ({how}) before it started; no job ran",
                  file=sys.stderr)
            sys.exit(143 if how == "SIGTERM" else 130)
        S.mark_stopped_jobs(where)  # (jobs stopped before their simulation marked their folders)
        S.release_sweep_dir()
        print(f"\nkvsim: sweep stopped ({how}); its unfinished jobs are marked INCOMPLETE and "
              f"kvsim-collect lists those that never started; the same command with "
              f"output.skip_completed=true runs only those", file=sys.stderr)
        sys.exit(143 if how == "SIGTERM" else 130)
