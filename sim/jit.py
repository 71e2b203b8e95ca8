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

import numba


def kernel(signature):
    """Decorator: ``numba.njit(signature, cache=True, nogil=True)`` (``signature``: a numba
    signature string or object), without ``cache`` when
    numba finds no writable cache location (it raises RuntimeError "cannot cache function")."""

    def wrap(fn):
        try:
            return numba.njit(signature, cache=True, nogil=True)(fn)
        except RuntimeError as e:
            if "cannot cache" not in str(e):
                raise
            return numba.njit(signature, cache=False, nogil=True)(fn)

    return wrap


__all__ = ["kernel"]
