"""Compiled loops for the memory model's hot paths (numba).

:func:`kernel` compiles a function for its explicit signatures the first time it is called (from
Python, or from another kernel being compiled), not when its module is imported, so a process
compiles or loads only the kernels its configuration runs; numba's on-disk cache (next to the
source, or ``NUMBA_CACHE_DIR``, or ``~/.cache``) keeps the machine code, so later processes load
it (a few ms a kernel) instead of compiling it (~0.2-1 s a kernel). Where no cache location is
writable (a read-only install without a writable home), it compiles without the cache instead of
failing. Kernels release the GIL and use no fast-math: integer and
comparison work, and float64 arithmetic done in the order of the numpy expression it replaces
(tests compare the bits); transcendental functions (exp, log, cos) stay in numpy, whose results
a compiled loop might round differently.

Importing this module, or a module that declares kernels, does not import numba: until numba is
imported, :func:`kernel` and :func:`inline` return a :class:`_Deferred` stand-in, and the first
call of any stand-in (or a read of one of its attributes, or of :data:`prefetch`) imports numba
(:mod:`sim._jit`), builds every declared kernel and helper, and puts each in place of its
stand-in in every loaded module's namespace, so kernels calling kernels see numba's
dispatchers. A declaration made once numba is imported (by anything) is built at once. So a
process that only composes a config (``kvsim --help``, the policies' options classes in the
policy modules) never imports numba.

Each cache file kvsim's kernels write (``<function>-<line>.pyXY.kvsim.nbi``, its index, and
``...kvsim.<n>.nbc``, the machine code) starts with the xxh3-128 digest of the rest, checked
before numba unpickles it: a file that is empty, cut short or altered (a flipped bit) is named
in one ``kvsim:`` line on stderr, removed, and the kernel compiled again and its file rewritten,
never loaded (machine code with a flipped bit ran with other results, or crashed). A cache that
cannot be written (a full disk) is named once and the kernels run uncached.

With ``NUMBA_DISABLE_JIT=1`` (numba's switch for debugging) every kernel runs as the plain
Python function it is, :func:`prefetch` as a no-op, with the same results, slower.
"""

from __future__ import annotations

import sys
import threading

# how many iterations ahead the pool's kernels prefetch (block ids and table slots of the
# element ``i + PREFETCH_AHEAD`` while working on element ``i``)
PREFETCH_AHEAD = 8

#: the stand-ins declared before numba was imported and not built yet, in declaration order
_pending: list = []
#: :mod:`sim._jit` once :func:`_load` imported it
_backend = None
_loading = threading.RLock()  # (one thread builds the stand-ins; the others wait for it)


class _Deferred:
    """The stand-in of a kernel or :func:`inline` helper declared before numba was imported:
    ``build(backend)`` makes the numba object. Calling it, or reading an attribute numba's
    object has (``py_func``, ``ensure_compiled``), builds every pending stand-in first
    (:func:`_load`) and forwards to its own numba object."""

    def __init__(self, fn, build):
        self.__wrapped__ = fn
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__module__ = fn.__module__
        self.__doc__ = fn.__doc__
        self._build = build
        self._built = None

    def built(self):
        """The numba object (dispatcher, or the plain function under ``NUMBA_DISABLE_JIT``)."""
        if self._built is None:
            _load()
        return self._built

    def __call__(self, *args, **kws):
        return self.built()(*args, **kws)

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_build", "_built"):
            raise AttributeError(name)
        return getattr(self.built(), name)

    def __repr__(self):
        return f"<kernel {self.__module__}.{self.__qualname__}, numba not imported yet>"


def _load():
    """Import numba (:mod:`sim._jit`), build every pending stand-in in declaration order and
    replace each one, wherever a loaded module's namespace holds it, by what it built. Returns
    :mod:`sim._jit`."""
    global _backend
    if _backend is not None:
        return _backend
    with _loading:
        if _backend is not None:
            return _backend
        from . import _jit

        pending = list(_pending)
        for d in pending:
            d._built = d._build(_jit)
        _pending.clear()
        for mod in list(sys.modules.values()) if pending else ():
            try:
                ns = object.__getattribute__(mod, "__dict__")
            except AttributeError:
                continue
            if not isinstance(ns, dict):
                continue
            for k, v in list(ns.items()):
                if type(v) is _Deferred and v._built is not None:
                    ns[k] = v._built
        _backend = _jit
    return _jit


def _numba_loaded() -> bool:
    return _backend is not None or "numba" in sys.modules


def kernel(signature, depends=()):
    """Decorator: ``numba.njit(signature, cache=True, nogil=True)`` (``signature``: a numba
    signature string or object, or a list of them) compiled on the kernel's first call, with
    numba's cache in checked files; without ``cache`` where numba finds no writable cache
    location (it raises RuntimeError "cannot cache function"); under ``NUMBA_DISABLE_JIT=1`` the
    Python function itself (numpy's overflow warnings off: integers wrap around in the compiled
    kernel too). Before numba is imported it returns a :class:`_Deferred` stand-in.

    ``depends``: the other modules whose :func:`inline` helpers the kernel calls. numba stamps a
    cached kernel with its own file only, so a changed helper in another file would leave the
    old machine code in use; with ``depends`` the stamp also holds those modules' files, and a
    change to any of them compiles the kernel again."""

    def wrap(fn):
        if not _numba_loaded():
            d = _Deferred(fn, lambda jit: jit.kernel(signature, depends)(fn))
            _pending.append(d)
            return d
        return _load().kernel(signature, depends)(fn)

    return wrap


def inline(fn):
    """Decorator for a helper of kernels: ``numba.njit(inline="always")``, compiled into each
    kernel that calls it (no signature, no cache of its own; a kernel in another module lists
    the helper's module in ``kernel(..., depends=...)``); the plain function under
    ``NUMBA_DISABLE_JIT=1``. Before numba is imported it returns a :class:`_Deferred`
    stand-in."""
    if not _numba_loaded():
        d = _Deferred(fn, lambda jit: jit.inline(fn))
        _pending.append(d)
        return d
    return _load().inline(fn)


def __getattr__(name: str):
    """``prefetch`` (a numba intrinsic) and numba's side of this module (:mod:`sim._jit`):
    imports numba."""
    if name.startswith("__"):
        raise AttributeError(f"module 'sim.jit' has no attribute {name!r}")
    return getattr(_load(), name)


__all__ = ["kernel", "inline", "prefetch", "PREFETCH_AHEAD"]
