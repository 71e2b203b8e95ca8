"""Hydra callbacks of the ``kvsim`` command.

:class:`FailedRunsExit` makes a multirun whose jobs were rejected (bad config or trace: the CLI
marks the job directory ``INCOMPLETE`` with the error) end with exit status 2 and one line per
failed job, instead of status 0: a sweep script or CI job then sees the failure. The other jobs
still ran (Hydra launchers run every job of a sweep).
"""

from __future__ import annotations

import sys
from pathlib import Path

from hydra.experimental.callback import Callback


class FailedRunsExit(Callback):
    """``on_multirun_end``: list the sweep's rejected jobs on stderr and exit with status 2."""

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep = Path(str(config.hydra.sweep.dir))
        failed = []
        for marker in sorted(sweep.glob("*/INCOMPLETE")):
            text = marker.read_text(errors="replace").strip()
            if text.startswith("this run failed:"):
                failed.append((marker.parent.name, text[len("this run failed:"):].strip()))
        if failed:
            for name, why in failed:
                print(f"kvsim: sweep job {name} failed: {why}", file=sys.stderr)
            print(f"kvsim: {len(failed)} sweep job(s) failed; the others' results are in {sweep}",
                  file=sys.stderr)
            sys.exit(2)
