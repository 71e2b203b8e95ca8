"""numba's side of :mod:`sim.jit`: imported (and numba with it) by :func:`sim.jit._load` on
the first call of a kernel declared before numba was imported, or at a declaration once numba is
imported. Here :func:`kernel` and :func:`inline` build numba dispatchers at once (a kernel still
compiles on its first call, :class:`_LazyKernel`); the contracts (cache files, float rule,
``NUMBA_DISABLE_JIT``) are in :mod:`sim.jit`'s docstring.
"""

from __future__ import annotations

import io
import os
import pickle
import sys

import numba
import xxhash
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.caching import FunctionCache, IndexDataCacheFile
from numba.core.registry import CPUDispatcher
from numba.extending import intrinsic

_checked = [False]
_DIGEST = 16  # bytes of the xxh3-128 digest in front of each cache file
_said: set = set()  # (the one-time notes said in this process)


def _say_once(key, text: str) -> None:
    if key not in _said:
        _said.add(key)
        print(f"kvsim: {text}", file=sys.stderr, flush=True)


class _Damaged(Exception):
    """A kernel cache file whose bytes are not those written: ``path`` and ``why``."""

    def __init__(self, path: str, why: str):
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


class _CheckedCacheFile(IndexDataCacheFile):
    """numba's index and data files of one function, each written with the xxh3-128 digest
    of its bytes in front and under names of their own (``<base>.kvsim.nbi``, ``<base>.kvsim.<n>
    .nbc``: numba's own files are never read as these). Reading a file whose digest does not
    match, or that does not unpickle, raises :class:`_Damaged`."""

    def __init__(self, cache_path, filename_base, source_stamp):
        super().__init__(cache_path=cache_path, filename_base=f"{filename_base}.kvsim",
                         source_stamp=source_stamp)

    @staticmethod
    def _framed(body: bytes) -> bytes:
        return xxhash.xxh3_128_digest(body) + body

    @staticmethod
    def _verified(path: str) -> bytes:
        with open(path, "rb") as f:  # (FileNotFoundError: no such entry)
            raw = f.read()
        body = raw[_DIGEST:]
        if len(raw) < _DIGEST or xxhash.xxh3_128_digest(body) != raw[:_DIGEST]:
            raise _Damaged(path, "it is empty" if not raw else
                           "its bytes are not those written (xxh3-128)")
        return body

    def _load_index(self):
        try:
            body = self._verified(self._index_path)
        except FileNotFoundError:
            return {}
        f = io.BytesIO(body)
        try:
            if pickle.load(f) != self._version:
                return {}  # (another numba's index)
            stamp, overloads = pickle.loads(f.read())
        except Exception as e:  # noqa: BLE001 - (whatever a bad pickle raises)
            raise _Damaged(self._index_path, f"{type(e).__name__}: {e}"[:120]) from None
        return overloads if stamp == self._source_stamp else {}

    def _save_index(self, overloads):
        body = pickle.dumps(self._version, protocol=-1) + \
            self._dump((self._source_stamp, overloads))
        with self._open_for_write(self._index_path) as f:
            f.write(self._framed(body))

    def _load_data(self, name):
        path = self._data_path(name)
        body = self._verified(path)
        try:
            return pickle.loads(body)
        except Exception as e:  # noqa: BLE001 - (whatever a bad pickle raises)
            raise _Damaged(path, f"{type(e).__name__}: {e}"[:120]) from None

    def _save_data(self, name, data):
        body = self._dump(data)
        with self._open_for_write(self._data_path(name)) as f:
            f.write(self._framed(body))


class _CheckedFunctionCache(FunctionCache):
    """numba's per-function cache on :class:`_CheckedCacheFile`: a damaged file is named
    (one line), removed and treated as a cache miss, so the kernel is compiled again and the
    file rewritten; a cache that cannot be written is named once and skipped."""

    def __init__(self, py_func):
        super().__init__(py_func)
        self._cache_file = _CheckedCacheFile(self._cache_path, self._impl.filename_base,
                                             self._impl.locator.get_source_stamp())

    def load_overload(self, sig, target_context):
        try:
            return super().load_overload(sig, target_context)
        except _Damaged as e:
            _say_once(e.path, f"numba's cache file {e.path} of the compiled kernel "
                              f"{self._py_func.__qualname__} is damaged ({e.why}); compiling the "
                              f"kernel again and rewriting the file")
            try:
                os.unlink(e.path)
            except OSError:
                pass
            return None

    def save_overload(self, sig, data):
        try:
            super().save_overload(sig, data)
        except (OSError, _Damaged) as e:
            _say_once("save", f"note: numba's cache in {self._cache_path} cannot be written "
                              f"({type(e).__name__}: {e}"[:300] + "); the compiled kernels "
                              f"are not kept for the next run")


class _DependentFunctionCache(_CheckedFunctionCache):
    """:class:`_CheckedFunctionCache` whose source stamp is the kernel's file's together with
    those of :attr:`_depends` (file paths; (modification time, size) each, as numba stamps a
    file): the kernel's cached code is used only while none of them changed."""

    _depends: tuple = ()

    def __init__(self, py_func):
        super().__init__(py_func)
        stamp = (self._impl.locator.get_source_stamp(),
                 tuple((os.stat(f).st_mtime, os.stat(f).st_size) for f in self._depends))
        self._cache_file = _CheckedCacheFile(self._cache_path, self._impl.filename_base, stamp)


def _dependent_cache(files) -> type:
    """A :class:`_DependentFunctionCache` class for the kernel files ``files``."""
    return type("_DependentFunctionCache", (_DependentFunctionCache,), {"_depends": tuple(files)})


def inline(fn):
    """Decorator for a helper of kernels: ``numba.njit(inline="always")``, compiled into each
    kernel that calls it (no signature, no cache of its own; a kernel in another module lists
    the helper's module in ``kernel(..., depends=...)``); the plain function under
    ``NUMBA_DISABLE_JIT=1``."""
    if numba.config.DISABLE_JIT:
        return fn
    return numba.njit(inline="always")(fn)


def _note_first_compile(disp) -> None:
    """Before a kernel compiles: when numba's cache has no index for it (a fresh install, or an
    emptied ``NUMBA_CACHE_DIR``), say once on stderr that compiling takes a while, so the first
    run's seconds of silence are explained. Any trouble reading numba's cache path (no cache:
    numba's ``NullCache``) skips the note."""
    if _checked[0]:
        return
    try:
        index = disp._cache._cache_file._index_path
    except Exception:  # noqa: BLE001 - (numba internals; the note is a courtesy)
        return
    if not os.path.exists(index):
        _checked[0] = True
        # (one write, newline included: a sweep's parallel jobs' lines never join)
        sys.stderr.write("kvsim: compiling the simulator's kernels (the first run of an install "
                         "takes ~10-20 s more; numba caches them for the next runs)\n")
        sys.stderr.flush()


class _LazyKernel(CPUDispatcher):
    """numba's CPU dispatcher of a kernel with declared signatures (``_declared``) that compiles
    them, or loads them from numba's cache, the first time the kernel is called from Python or
    typed inside another kernel being compiled, then disables compilation: from then on it is
    what ``numba.njit(signatures)`` returns (the same machine code; arguments converted to a
    declared signature by numba's own rules, a call no signature takes raises numba's
    TypeError). Calls after the first go through numba's C dispatcher with no Python in
    between."""

    _declared: tuple = ()

    def ensure_compiled(self) -> None:
        """Compile (or load) every declared signature now, once; later calls return at once."""
        if not self._can_compile:
            return
        from numba.core import typeinfer

        _note_first_compile(self)
        with typeinfer.register_dispatcher(self):  # (as numba.njit(signatures) compiles them)
            for sig in self._declared:
                self.compile(sig)
        self.disable_compile()

    def _compile_for_args(self, *args, **kws):
        # (numba's C dispatcher calls this when no compiled signature takes the arguments and
        # compiling is allowed, then calls what it returns with them: the dispatcher itself,
        # which now has its signatures and resolves the call as an eager kernel would)
        self.ensure_compiled()
        return self

    def get_call_template(self, args, kws):
        self.ensure_compiled()
        return super().get_call_template(args, kws)


def _lazy(disp, signature) -> CPUDispatcher:
    """``disp`` (a dispatcher from ``numba.njit`` without signatures) as a :class:`_LazyKernel`
    of ``signature`` (one numba signature or a list of them)."""
    if type(disp) is not CPUDispatcher:  # (not numba's CPU dispatcher: compile it now)
        for sig in (signature if isinstance(signature, list) else [signature]):
            disp.compile(sig)
        disp.disable_compile()
        return disp
    disp.__class__ = _LazyKernel
    disp._declared = tuple(signature if isinstance(signature, list) else [signature])
    return disp


def kernel(signature, depends=()):
    """Decorator: ``numba.njit(signature, cache=True, nogil=True)`` (``signature``: a numba
    signature string or object, or a list of them) compiled on the kernel's first call
    (:class:`_LazyKernel`), with numba's cache in checked files (:class:`_CheckedFunctionCache`);
    without ``cache`` where numba finds no writable cache location (it raises RuntimeError
    "cannot cache function"); under ``NUMBA_DISABLE_JIT=1`` the Python function itself (numpy's
    overflow warnings off: integers wrap around in the compiled kernel too).

    ``depends``: the other modules whose :func:`inline` helpers the kernel calls. numba stamps a
    cached kernel with its own file only, so a changed helper in another file would leave the
    old machine code in use; with ``depends`` the stamp also holds those modules' files
    (:class:`_DependentFunctionCache`), and a change to any of them compiles the kernel again."""

    def wrap(fn):
        if numba.config.DISABLE_JIT:
            import functools

            import numpy as np

            @functools.wraps(fn)
            def plain(*args):
                # (integers wrap around silently, as in the compiled kernel: the hashes rely on it)
                with np.errstate(over="ignore"):
                    return fn(*args)

            return plain
        import numba.core.dispatcher as dispatcher

        # (numba's Dispatcher.enable_caching makes dispatcher.FunctionCache: kvsim's checked
        # cache for kvsim's kernels, numba's own for anything else)
        numbas = dispatcher.FunctionCache
        dispatcher.FunctionCache = (_CheckedFunctionCache if not depends else
                                    _dependent_cache([m.__file__ for m in depends]))
        try:
            return _lazy(numba.njit(cache=True, nogil=True)(fn), signature)
        except RuntimeError as e:  # (numba: "cannot cache function ...": no writable place)
            if "cannot cache" not in str(e):
                raise
            return _lazy(numba.njit(cache=False, nogil=True)(fn), signature)
        finally:
            dispatcher.FunctionCache = numbas

    return wrap


def _prefetch_python(arr, idx):
    """:func:`prefetch` under ``NUMBA_DISABLE_JIT=1``: a hint with no effect."""


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


if numba.config.DISABLE_JIT:  # (an intrinsic cannot be called from Python)
    prefetch = _prefetch_python  # noqa: F811

__all__ = ["kernel", "inline", "prefetch"]
