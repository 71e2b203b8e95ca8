"""The error types kvsim's library raises (no imports of kvsim modules: every module may import
this one).

* :class:`ConfigError` (``ValueError``): an impossible or inconsistent configuration; the
  message names the field(s), the value found and what was expected. ``kvsim`` prints it as one
  ``kvsim: error: ...`` line and exits with status 2.
* :class:`OutputDirBusy` (a ``ConfigError``): another kvsim run is writing the results folder.
* :class:`SweepBusy`: another sweep is running into the same ``hydra.sweep.dir``.
* :class:`Busy`: another process holds a lock file (:func:`sim.locks.hold`).
* :class:`PoolExhausted` (``RuntimeError``): more GPU blocks were asked of the block pool than
  are free (callers check first: it marks a bug, not bad input).

Trace errors are :class:`traces.TraceError` (file, line, field, found, expected).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ConfigError", "OutputDirBusy", "SweepBusy", "Busy", "PoolExhausted"]


class ConfigError(ValueError):
    """An impossible or inconsistent configuration; the message names the field(s)."""


class OutputDirBusy(ConfigError):
    """The results folder is held by another kvsim run that is still running."""


class SweepBusy(Exception):
    """Another sweep is running into the same ``hydra.sweep.dir``."""


class Busy(Exception):
    """Another process holds the lock: ``holder`` is ``"process PID on HOST"`` (or ``"a
    process that is starting"`` when it has not written its name yet); ``path`` the lock
    file."""

    def __init__(self, path: Path, holder: str):
        super().__init__(f"{path} is held by {holder}")
        self.path = Path(path)
        self.holder = holder


class PoolExhausted(RuntimeError):
    """Raised when more blocks are requested than are free (callers check first)."""
