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
    or 143 (SIGTERM); later, :mod:`sim.cli.entry` and :mod:`sim.cli.job` say what was left.

    The handler is set before anything else is imported (``sim`` and this module import only
    ``sys``; ``signal`` needs only ``enum``, which the console script's ``import re`` loaded;
    :mod:`sim.console` imports ``typing``, a few milliseconds, so it is imported after): a signal
    before it, while the interpreter starts and the console script imports this module, ends
    the process by the signal's default action (docs/RELIABILITY.md, "Not covered")."""
    import signal

    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        from .entry import main as run

        run()
    except KeyboardInterrupt as e:
        from ..console import exit_after_interrupt

        if str(e) == "SIGTERM":
            print("kvsim: stopped by SIGTERM; nothing was run or written", file=sys.stderr)
            exit_after_interrupt(143)
        print("\nkvsim: interrupted; nothing was run or written", file=sys.stderr)
        exit_after_interrupt(130)
    except SystemExit as e:
        if e.code in (130, 143):  # (an interrupt that was reported: see exit_after_interrupt)
            from ..console import exit_after_interrupt

            exit_after_interrupt(e.code)
        raise
    # the command has finished and said so: Ctrl-C or SIGTERM while the interpreter shuts down
    # (a fraction of a second: finalizers, threads, atexit) would end a complete command by
    # the signal or with a traceback from an atexit callback; they are ignored from here
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


__all__ = ["main"]
