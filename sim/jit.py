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
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

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


# how many iterations ahead the pool's kernels prefetch (block ids and table slots of the
# element ``i + PREFETCH_AHEAD`` while working on element ``i``)
PREFETCH_AHEAD = 8


@intrinsic
def prefetch(typingctx, arr, idx):
    """``prefetch(arr, i)`` inside a kernel: a hint (LLVM ``llvm.prefetch``, write intent, high
    locality) that ``arr[i]`` (a 1-d array, ``i`` an integer) will be read and written soon, so
    its cache line is fetched while the loop works on earlier elements. It changes no value and
    never faults (an index out of range is not dereferenced; the caller keeps ``i`` in range
    anyway).

    The pool's kernels work on random block ids and hash-table slots: each element's loads miss
    the CPU caches and a loop that waits for each in turn runs at memory latency (on this
    project's 2-core machine ``python -m experiments.bench_pool``, a 49,987-block pool's
    512-block growth calls: 154-176 ns a block without prefetching, 108-112 ns with it;
    ``BENCHMARKS.md``)."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]),
            "llvm.prefetch.p0")
        # (address, rw = 1 write, locality = 3 keep in all levels, cache type = 1 data)
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(1), i32(3), i32(1)])
        return context.get_dummy_value()

    return sig, codegen


__all__ = ["kernel", "prefetch", "PREFETCH_AHEAD"]
