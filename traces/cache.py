"""Parsed-trace cache: a loader's result kept on disk, so that a sweep parses a trace once.

A sweep runs the same trace under many configurations; each run used to parse the file again
(the full Weka file: about 12 s of a run's wall time, 460 MB of JSON). The cache stores the
loader's :class:`~traces._common.Parsed` result (its arrays as ``.npy`` files, the rest as JSON)
under a key that names everything the result depends on, and a later run with the same key
maps the arrays back (``numpy.load(mmap_mode="r")``) instead of parsing.

The key (xxh3-128 of a JSON document) covers:

* the cache layout version (:data:`CACHE_FORMAT`) and a fingerprint of the source of every
  module of the ``traces`` package (a changed loader never reads an older entry);
* the trace format, the resolved path and the content of the input (each file's size and
  xxh3-128 of its bytes; every file under a folder for ServeGen);
* the seed and every trace option a loader reads: all :class:`~traces.config.TraceConfig`
  fields except :data:`SLICING_FIELDS`, which only the slicing after the loader reads.

A hit returns the very arrays, warnings, notes and skipped-row record the parse gave (the
bad-row examples of ``on_error=skip`` are replayed into the run's sink), so results are the same
bit for bit. A cache entry that cannot be read (a truncated file, a foreign layout) is named in
a warning, parsed again and rewritten; a write that fails (disk full, no permission) is named in
a warning and the run goes on with the parsed trace.

Where: ``trace.cache_dir``, else ``$KVSIM_CACHE_DIR/traces``, else
``$XDG_CACHE_HOME/kvsim/traces`` (``~/.cache/kvsim/traces``). Entries are written to a temporary
folder and renamed into place, so concurrent sweep jobs never see a half-written entry. Size:
after each write the least recently used entries are removed until the folder holds at most
``KVSIM_CACHE_MAX_GIB`` GiB (default 8; the full Weka trace's entry is about 760 MB).
``trace.cache=false`` turns it off.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import xxhash

from ._common import Parsed
from .errors import ErrorSink

__all__ = ["CACHE_FORMAT", "SLICING_FIELDS", "cache_root", "cache_key", "parse_cached"]

CACHE_FORMAT = 1
# TraceConfig fields no loader reads (load_workload's slicing, the cache's own options, and the
# preset name and path, which the resolved path in the key stands for). A loader that starts
# reading one of them must take it out of this set (tests/test_trace_cache.py checks that
# changing them leaves every loader's result unchanged).
SLICING_FIELDS = frozenset({"name", "path", "time_scale", "max_requests", "duration_s", "cache",
                            "cache_dir"})
_ARRAY_FIELDS = ("session_id", "turn", "arrival_s", "think_s", "parent", "input_tokens",
                 "output_tokens", "prefix_offsets", "prefix_values")
_CHUNK = 1 << 23  # bytes hashed per read
_DEFAULT_MAX_GIB = 8.0


def cache_root(cache_dir: Optional[str] = None) -> Path:
    """The folder holding the entries: ``cache_dir`` (``trace.cache_dir``), else
    ``$KVSIM_CACHE_DIR/traces``, else ``$XDG_CACHE_HOME/kvsim/traces`` (``~/.cache`` when
    ``XDG_CACHE_HOME`` is unset)."""
    if cache_dir:
        return Path(os.path.expanduser(str(cache_dir)))
    env = os.environ.get("KVSIM_CACHE_DIR")
    if env:
        return Path(os.path.expanduser(env)) / "traces"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(os.path.expanduser(xdg)) / "kvsim" / "traces"


def _max_bytes() -> float:
    """``KVSIM_CACHE_MAX_GIB`` in bytes. Raises ValueError naming the variable when it is not a
    number > 0."""
    raw = os.environ.get("KVSIM_CACHE_MAX_GIB")
    if raw is None:
        return _DEFAULT_MAX_GIB * 2**30
    try:
        gib = float(raw)
    except ValueError:
        gib = float("nan")
    if not gib > 0 or gib == float("inf"):
        raise ValueError(f"KVSIM_CACHE_MAX_GIB={raw!r}: expected a number of GiB > 0")
    return gib * 2**30


def _file_digest(p: Path) -> str:
    h = xxhash.xxh3_128()
    with open(p, "rb") as f:
        while True:
            b = f.read(_CHUNK)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def _input_fingerprint(path: Path) -> list:
    """``[[relative name, size in bytes, xxh3-128 hex], ...]`` of the input file, or of every
    file under the input folder (sorted by name)."""
    if path.is_dir():
        files = sorted(q for q in path.rglob("*") if q.is_file())
        return [[str(q.relative_to(path)), q.stat().st_size, _file_digest(q)] for q in files]
    return [[path.name, path.stat().st_size, _file_digest(path)]]


_CODE_DIGEST: Optional[str] = None


def _code_fingerprint() -> str:
    """xxh3-128 of the source of every module of the ``traces`` package (sorted by name)."""
    global _CODE_DIGEST
    if _CODE_DIGEST is None:
        h = xxhash.xxh3_128()
        for q in sorted(Path(__file__).resolve().parent.glob("*.py")):
            h.update(q.name.encode())
            h.update(q.read_bytes())
        _CODE_DIGEST = h.hexdigest()
    return _CODE_DIGEST


def cache_key(cfg: Any, path: Path, seed: int) -> tuple[str, dict]:
    """``(key, material)``: the entry name (32 hex digits) for loading ``path`` with the trace
    config ``cfg`` (a :class:`~traces.config.TraceConfig`) and ``seed``, and the JSON-able
    document it hashes (see the module docstring)."""
    opts = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if f.name not in SLICING_FIELDS}
    material = {"cache_format": CACHE_FORMAT, "code": _code_fingerprint(),
                "path": str(path), "input": _input_fingerprint(path), "seed": int(seed),
                "options": opts}
    doc = json.dumps(material, sort_keys=True, default=repr).encode()
    return xxhash.xxh3_128_hexdigest(doc), material


class _Unreadable(Exception):
    """A cache entry that exists but cannot be read back (the message says why)."""


def _read(entry: Path, key: str, sink: ErrorSink) -> Parsed:
    """The Parsed stored in ``entry`` (arrays memory-mapped, read-only); replays its skipped rows
    into ``sink``. Raises FileNotFoundError when there is no entry, :class:`_Unreadable` when it
    cannot be read back."""
    meta_path = entry / "meta.json"
    if not meta_path.exists():
        raise FileNotFoundError(meta_path)
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("cache_format") != CACHE_FORMAT or meta.get("key") != key:
            raise _Unreadable(f"layout {meta.get('cache_format')!r} / key {meta.get('key')!r}, "
                              f"expected layout {CACHE_FORMAT} / key {key}")
        arrays = {}
        for name, (dtype, shape) in meta["arrays"].items():
            a = np.load(entry / f"{name}.npy", mmap_mode="r", allow_pickle=False)
            if str(a.dtype) != dtype or list(a.shape) != shape:
                raise _Unreadable(f"{name}.npy holds {a.dtype}{list(a.shape)}, expected "
                                  f"{dtype}{shape}")
            arrays[name] = a
        pr = Parsed(**{n: arrays[n] for n in _ARRAY_FIELDS},
                    block_tokens=int(meta["block_tokens"]), source=str(meta["source"]),
                    warnings=list(meta["warnings"]), notes=dict(meta["notes"]),
                    extra={n: arrays["extra." + n] for n in meta["extra"]})
        skipped = meta["skipped"]
        count, examples = int(skipped["count"]), list(skipped["examples"])
    except _Unreadable:
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise _Unreadable(f"{type(e).__name__}: {e}"[:200]) from None
    sink.count = count
    sink.examples = examples
    os.utime(meta_path)  # most recently used (the size cap removes the least recently used)
    return pr


def _write(root: Path, entry: Path, key: str, material: dict, pr: Parsed,
           sink: ErrorSink) -> None:
    """Store ``pr`` and the sink's skipped rows as ``entry`` (written in a temporary folder of
    ``root``, then renamed into place; a concurrent writer's entry of the same key is kept).
    Raises OSError, ValueError or TypeError when it cannot be written (disk, permissions, an
    object array, a note JSON cannot hold)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        arrays = {n: getattr(pr, n) for n in _ARRAY_FIELDS}
        arrays.update({"extra." + n: v for n, v in pr.extra.items()})
        shapes = {}
        for name, a in arrays.items():
            a = np.asarray(a)
            np.save(tmp / f"{name}.npy", a, allow_pickle=False)
            shapes[name] = [str(a.dtype), list(a.shape)]
        meta = {"cache_format": CACHE_FORMAT, "key": key, "material": material,
                "arrays": shapes, "extra": list(pr.extra), "block_tokens": int(pr.block_tokens),
                "source": pr.source, "warnings": list(pr.warnings), "notes": pr.notes,
                "skipped": sink.as_dict()}
        (tmp / "meta.json").write_text(json.dumps(meta, default=_plain))
        try:
            os.rename(tmp, entry)
        except OSError:
            if not (entry / "meta.json").exists():
                raise
            # another job wrote the same entry first: keep it
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _plain(v: Any) -> Any:
    """A numpy scalar as the Python number it holds (json.dumps' ``default``); TypeError for
    anything else JSON cannot hold exactly."""
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    raise TypeError(f"{type(v).__name__} is not JSON")


def _entry_bytes(entry: Path) -> int:
    return sum(q.stat().st_size for q in entry.iterdir() if q.is_file())


def _trim(root: Path, keep: Path, limit: float) -> list[str]:
    """Remove the least recently used entries of ``root`` (by their meta.json's modification
    time) until the entries take at most ``limit`` bytes; ``keep`` is never removed. Returns the
    names removed."""
    entries = []
    for e in root.iterdir():
        meta = e / "meta.json"
        if e.is_dir() and not e.name.startswith(".") and meta.exists():
            entries.append((meta.stat().st_mtime, e.name, e, _entry_bytes(e)))
    total = sum(x[3] for x in entries)
    removed = []
    for _, name, e, size in sorted(entries):
        if total <= limit:
            break
        if e == keep:
            continue
        shutil.rmtree(e, ignore_errors=True)
        total -= size
        removed.append(name)
    return removed


def parse_cached(cfg: Any, path: Path, seed: int, sink: ErrorSink,
                 parse: Callable[[], Parsed]) -> tuple[Parsed, dict]:
    """The loader's result for ``path`` under ``cfg`` and ``seed``: from the cache when it holds
    the entry, else ``parse()`` (which reports bad rows to ``sink``), stored for the next run.

    Returns ``(parsed, info)``: ``info`` has ``status`` (``"hit"``, ``"miss"`` or ``"off"``),
    ``entry`` (the entry folder, or None when off) and ``warnings`` (an unreadable entry, a
    failed write, entries removed by the size cap).

    Raises whatever ``parse`` raises (a TraceError on a bad trace: nothing is stored then), and
    ValueError for a malformed ``KVSIM_CACHE_MAX_GIB``.
    """
    if not getattr(cfg, "cache", True):
        return parse(), {"status": "off", "entry": None, "warnings": []}
    limit = _max_bytes()
    root = cache_root(getattr(cfg, "cache_dir", None))
    key, material = cache_key(cfg, path, seed)
    entry = root / key
    warnings: list[str] = []
    try:
        return _read(entry, key, sink), {"status": "hit", "entry": str(entry), "warnings": []}
    except FileNotFoundError:
        pass
    except _Unreadable as e:
        warnings.append(f"trace cache entry {entry} could not be read back ({e}); parsed the "
                        f"trace again and rewrote the entry")
        shutil.rmtree(entry, ignore_errors=True)
    pr = parse()
    try:
        _write(root, entry, key, material, pr, sink)
        removed = _trim(root, entry, limit)
        if removed:
            warnings.append(f"trace cache {root}: removed {len(removed)} least recently used "
                            f"entries to stay under {limit / 2**30:g} GiB (KVSIM_CACHE_MAX_GIB)")
    except (OSError, ValueError, TypeError) as e:
        warnings.append(f"trace cache entry {entry} could not be written "
                        f"({type(e).__name__}: {e}"[:300] + "); the run goes on without it")
    return pr, {"status": "miss", "entry": str(entry), "warnings": warnings}
