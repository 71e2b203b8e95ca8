"""The ``kvsim`` command (a Hydra app).

``kvsim`` replays the bundled Mooncake slice for Qwen3-8B on H200s with vLLM defaults.
Any part is changed with Hydra overrides, e.g.
``kvsim trace=weka_agentic model=llama3_1_8b gpu=h100 cache.block_size=32``.
``kvsim --help`` lists the config groups; ``kvsim --cfg job`` prints the resolved config;
``kvsim -m ...`` runs a sweep.

Modules, one job each: :mod:`~sim.cli.entry` (the console script: checks before Hydra, one
line per error), :mod:`~sim.cli.overrides` (those checks), :mod:`~sim.cli.job` (Hydra's job
function: one run into its results folder), :mod:`~sim.cli.report` (the summary table and the
notes after a run), :mod:`~sim.cli.claims` (a sweep job's claim on its ``output.dir``).
"""

import sys


def _on_sigterm(signum, frame):
    raise KeyboardInterrupt("SIGTERM")


def main() -> None:
    """The ``kvsim`` console script (:func:`sim.cli.entry.main`). SIGTERM raises
    ``KeyboardInterrupt("SIGTERM")`` from the start, so it stops the command as Ctrl-C does,
    with its own line and exit status: while the modules are imported and the command line is
    checked (before Hydra: nothing has been written yet) one line and exit status 130 (Ctrl-C)
    or 143 (SIGTERM); later, :mod:`sim.cli.entry` and :mod:`sim.cli.job` say what was left."""
    import signal

    from ..console import exit_after_interrupt

    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        from .entry import main as run

        run()
    except KeyboardInterrupt as e:
        if str(e) == "SIGTERM":
            print("kvsim: stopped by SIGTERM; nothing was run or written", file=sys.stderr)
            exit_after_interrupt(143)
        print("\nkvsim: interrupted; nothing was run or written", file=sys.stderr)
        exit_after_interrupt(130)
    except SystemExit as e:
        if e.code in (130, 143):  # (an interrupt that was reported: see exit_after_interrupt)
            exit_after_interrupt(e.code)
        raise


__all__ = ["main"]
