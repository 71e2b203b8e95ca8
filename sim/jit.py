"""Compiled loops for the memory model's hot paths (numba).

:func:`kernel` compiles a function for one explicit signature when its module is imported and
keeps the machine code in numba's on-disk cache (next to the source, or ``NUMBA_CACHE_DIR``, or
``~/.cache``), so later processes load it (~0.2 s) instead of compiling it (~1-3 s). Where no
cache location is writable (a read-only install without a writable home), it compiles without
the cache instead of failing. Kernels release the GIL and use no fast-math: integer and
comparison work, and float64 arithmetic done in the order of the numpy expression it replaces
(tests compare the bits); transcendental functions (exp, log, cos) stay in numpy, whose results
a compiled loop might round differently.
"""

from __future__ import annotations

import os
import sys

import numba

_checked = [False]


def _note_first_compile(fn) -> None:
    """Before the first kernel compiles: when numba's cache has no index for it (a fresh
    install, or an emptied ``NUMBA_CACHE_DIR``), say on stderr that compiling takes a while, so
    the first run's ~20 s of silence is explained. Checked once per process; any trouble
    reading numba's cache path skips the note."""
    if _checked[0]:
        return
    _checked[0] = True
    try:
        index = numba.njit(cache=True)(fn)._cache._cache_file._index_path
    except Exception:  # noqa: BLE001 - (numba internals; the note is a courtesy)
        return
    if not os.path.exists(index):
        print("kvsim: compiling the simulator's kernels (the first run of an install takes "
              "~20 s more; numba caches them for the next runs)", file=sys.stderr, flush=True)


def kernel(signature):
    """Decorator: ``numba.njit(signature, cache=True, nogil=True)`` (``signature``: a numba
    signature string or object), without ``cache`` when
    numba finds no writable cache location (it raises RuntimeError "cannot cache function")."""

    def wrap(fn):
        _note_first_compile(fn)
        try:
            return numba.njit(signature, cache=True, nogil=True)(fn)
        except RuntimeError as e:
            if "cannot cache" not in str(e):
                raise
            return numba.njit(signature, cache=False, nogil=True)(fn)

    return wrap


__all__ = ["kernel"]
