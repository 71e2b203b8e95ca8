"""Parsed-trace cache: a loader's result kept on disk, so that a sweep parses a trace once.

A sweep runs the same trace under many configurations; without the cache each run parses the
file again (the full Weka file is 460 MB of JSON; BENCHMARKS.md has its load times). The
cache stores the loader's :class:`~traces._common.Parsed` result (its arrays as ``.npy``
files, the rest as JSON) under a key that names everything the result depends on, and a
later run with the same key maps the arrays back (``numpy.load(mmap_mode="r")``) instead
of parsing.

The key (xxh3-128 of a JSON document) covers:

* the cache layout version (:data:`CACHE_FORMAT`) and a fingerprint of the source of every
  module of the ``traces`` package (a changed loader never reads an older entry);
* the trace format, the resolved path and the content of the input (each file's size and
  xxh3-128 of its bytes; a ServeGen folder's ``chunk-N-*`` files; a folder of Claude Code or
  OpenAI-log transcripts: each file the loader reads);
* the seed and every trace option a loader reads: all :class:`~traces.config.TraceConfig`
  fields except :data:`SLICING_FIELDS`, which only the slicing after the loader reads. A parse
  that drew no random number (Mooncake with ``timestamp_spread`` even or keep, Azure, Weka with
  ``session_arrival=recorded``) is stored once under a seed-free key that every seed finds;
* the environment the parse ran in: Python, numpy and orjson versions (orjson and the json
  fallback read some numbers differently).

The code fingerprint is of each module's source as it was imported (``traces._source``): a module
reloaded after an edit (``importlib.reload``, Jupyter's autoreload) counts with its new source, an
edited file not yet reloaded with the old one. Only a regular file is cached (a ServeGen folder:
its ``chunk-N-trace.csv`` / ``chunk-N-dataset.json`` files; a transcript folder: its ``*.jsonl``
files); a pipe or a folder given for a file format is parsed without the cache, so the loader
names the problem.

A hit returns the very arrays, warnings, notes and skipped-row record the parse gave (the
bad-row examples of ``on_error=skip`` are replayed into the run's sink; the parse's own
``parse_s`` note is left out), so results are the same bit for bit: every file of an entry is
checked when it is read back (each array's xxh3-64 and meta.json's xxh3-128 of its own
content, both in meta.json; an entry missing a file or holding one it did not write fails). A
cache entry that cannot be read (a truncated or altered file, a foreign layout, no permission)
is named in a warning and the trace parsed again (and the entry rewritten where it can be); a write that fails (disk full, no permission) is named in a warning
and the run goes on with the parsed trace. A loader result that depends on an option the key
leaves out (``Parsed.cacheable``) is not stored.

Where: ``trace.cache_dir``, else ``$KVSIM_CACHE_DIR/traces``, else
``$XDG_CACHE_HOME/kvsim/traces`` (``~/.cache/kvsim/traces``). Entries are written to a temporary
folder and renamed into place, so concurrent sweep jobs never see a half-written entry; an
entry's files are readable by all (as the umask allows), so one cache can serve several users.
Size: after each write the least recently used entries are removed until the folder holds at
most ``KVSIM_CACHE_MAX_GIB`` GiB (default 8; the full Weka trace's entry takes 723 MB); only
kvsim's own entries (a 32-hex-digit folder whose meta.json names that key) and temporary folders
of writes older than an hour (a killed run's) are ever removed. ``trace.cache=false`` turns it
off.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import xxhash

from ._source import IMPORTED
from ._common import Parsed
from .errors import ErrorSink, TraceError
from .registry import FORMATS

__all__ = ["CACHE_FORMAT", "SLICING_FIELDS", "cache_root", "cache_key", "parse_cached"]

CACHE_FORMAT = 2  # (2: meta.json carries the checksum of its own content)
# TraceConfig fields no loader reads (load_workload's slicing, the cache's own options, and the
# preset name and path, which the resolved path in the key stands for). A loader that starts
# reading one of them must take it out of this set, or mark a result that read it uncacheable
# (Parsed.cacheable, as Weka's late-arrival check does); tests/test_trace_cache.py checks that
# changing them leaves every loader's result unchanged.
SLICING_FIELDS = frozenset({"name", "path", "time_scale", "max_requests", "duration_s", "cache",
                            "cache_dir"})
_ARRAY_FIELDS = ("session_id", "turn", "arrival_s", "think_s", "parent", "input_tokens",
                 "output_tokens", "prefix_offsets", "prefix_values")
_CHUNK = 1 << 23  # bytes hashed per read
_DEFAULT_MAX_GIB = 8.0
_KEY_RE = re.compile(r"[0-9a-f]{32}")
_TMP_RE = re.compile(r"\.[0-9a-f]{32}\..+")
_STALE_TMP_S = 3600.0  # a temporary folder this old is a killed write's


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
    """``KVSIM_CACHE_MAX_GIB`` in bytes (unset or empty: 8 GiB). Raises TraceError naming the
    variable when it is not a finite number > 0."""
    raw = os.environ.get("KVSIM_CACHE_MAX_GIB", "").strip()
    if not raw:
        return _DEFAULT_MAX_GIB * 2**30
    try:
        gib = float(raw)
    except ValueError:
        gib = float("nan")
    if not (math.isfinite(gib) and gib > 0):
        raise TraceError("bad environment variable", field="KVSIM_CACHE_MAX_GIB",
                         found=repr(raw), expected="a finite number of GiB > 0 (the parsed-trace "
                                                   "cache's size cap; unset: 8)")
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


def _input_fingerprint(fmt: str, path: Path) -> Optional[list]:
    """``[[name, size in bytes, xxh3-128 hex], ...]`` of what the loader of ``fmt`` reads: the
    files its :attr:`~traces.registry.TraceFormat.input_files` names (a ServeGen folder's
    ``chunk-N-*`` files, a folder of agent transcripts' files named by their path in it), else
    the input file; None when the input is not of that kind (a pipe, a folder for a file
    format): the loader, run without the cache, says what is wrong. Raises OSError when a file
    cannot be read."""
    input_files = FORMATS[fmt].input_files
    if input_files is not None:
        named = input_files(path)
        if named is None:
            return None
        return [[name, *file_fingerprint(q)[1:]] for name, q in named]
    if not stat.S_ISREG(path.stat().st_mode):
        return None
    return [file_fingerprint(path)]


def file_fingerprint(p: Path) -> list:
    """``[name, size in bytes, xxh3-128 hex]`` of the regular file ``p`` (a trace file, a
    calibration or an importance-score file a run read). Raises OSError when it cannot be
    read."""
    p = Path(p)
    return [p.name, p.stat().st_size, _file_digest(p)]


def _code_fingerprint() -> str:
    """xxh3-128 over the source of every module of the ``traces`` package and its subpackages
    (``traces.formats``) as imported (``traces._source``; each is imported here first)."""
    here = Path(__file__).resolve().parent
    names = sorted(".".join(("traces", *q.relative_to(here).with_suffix("").parts))
                   .removesuffix(".__init__")
                   for q in here.rglob("*.py") if q.stem != "_source")
    h = xxhash.xxh3_128()
    for name in names:
        if name not in IMPORTED:
            importlib.import_module(name)
        if name not in IMPORTED:
            raise RuntimeError(f"module {name} does not record its source "
                               f"(traces._source.note_source at its end)")
        h.update(f"{name}={IMPORTED[name]};".encode())
    return h.hexdigest()


def _environment() -> dict:
    """The versions a parse's bits may depend on."""
    try:
        import orjson
        js = f"orjson {orjson.__version__}"
    except ImportError:  # pragma: no cover
        js = "json"
    return {"python": sys.version.split()[0], "numpy": np.__version__, "json": js}


def _material(cfg: Any, path: Path) -> Optional[dict]:
    """The key's document but its seed (see :func:`cache_key`); None when the input is not one
    the cache takes. Raises OSError when an input file cannot be read."""
    inp = _input_fingerprint(cfg.format, path)
    if inp is None:
        return None
    opts = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg)
            if f.name not in SLICING_FIELDS}
    return {"cache_format": CACHE_FORMAT, "code": _code_fingerprint(),
            "environment": _environment(), "path": str(path), "input": inp, "options": opts}


def _keyed(material: dict, seed: Optional[int]) -> tuple[str, dict]:
    material = {**material, "seed": None if seed is None else int(seed)}
    doc = json.dumps(material, sort_keys=True, default=repr).encode()
    return xxhash.xxh3_128_hexdigest(doc), material


def cache_key(cfg: Any, path: Path, seed: Optional[int]) -> Optional[tuple[str, dict]]:
    """``(key, material)``: the entry name (32 hex digits) for loading ``path`` with the trace
    config ``cfg`` (a :class:`~traces.config.TraceConfig`) and ``seed`` (None: the entry of a
    parse that drew no random number, valid for every seed), and the JSON-able document it
    hashes (see the module docstring); None when the input is not one the cache takes
    (:func:`_input_fingerprint`). Raises OSError when an input file cannot be read."""
    material = _material(cfg, path)
    return None if material is None else _keyed(material, seed)


class _Unreadable(Exception):
    """A cache entry that exists but cannot be read back (the message says why)."""


def _checked(cond: bool, what: str) -> None:
    if not cond:
        raise _Unreadable(what)


def _read(entry: Path, key: str, sink: ErrorSink) -> Parsed:
    """The Parsed stored in ``entry`` (arrays memory-mapped, read-only, each checked against its
    stored xxh3-64); replays its skipped rows into ``sink``. Raises FileNotFoundError when there
    is no entry, :class:`_Unreadable` (saying why) when it cannot be read back."""
    meta_path = entry / "meta.json"
    try:
        if not meta_path.exists():
            raise FileNotFoundError(meta_path)
        meta = json.loads(meta_path.read_text())
        _checked(isinstance(meta, dict), "meta.json is not a JSON object")
        _checked(meta.pop("checksum", None) == _meta_checksum(meta),
                 "meta.json's content is not the one written (its xxh3-128 checksum)")
        if meta.get("cache_format") != CACHE_FORMAT or meta.get("key") != key:
            raise _Unreadable(f"layout {meta.get('cache_format')!r} / key {meta.get('key')!r}, "
                              f"expected layout {CACHE_FORMAT} / key {key}")
        arrays_meta, extra = meta.get("arrays"), meta.get("extra")
        warnings, notes, skipped = meta.get("warnings"), meta.get("notes"), meta.get("skipped")
        _checked(isinstance(arrays_meta, dict) and isinstance(extra, list)
                 and set(arrays_meta) == {*_ARRAY_FIELDS, *("extra." + n for n in extra)},
                 "meta.json's arrays do not match its fields")
        _checked(isinstance(warnings, list) and all(isinstance(w, str) for w in warnings),
                 "meta.json's warnings are not a list of strings")
        _checked(isinstance(notes, dict), "meta.json's notes are not an object")
        _checked(isinstance(skipped, dict) and type(skipped.get("count")) is int
                 and isinstance(skipped.get("examples"), list)
                 and all(isinstance(x, str) for x in skipped["examples"]),
                 "meta.json's skipped rows are not {count: int, examples: [str]}")
        _checked(type(meta.get("block_tokens")) is int and isinstance(meta.get("source"), str),
                 "meta.json's block_tokens / source are not an int / a string")
        files = {"meta.json", *(f"{n}.npy" for n in arrays_meta)}
        found = set(os.listdir(entry))
        _checked(found == files, f"its files are not those written (missing: "
                                 f"{sorted(files - found)}, not its own: {sorted(found - files)})")
        arrays = {}
        for name, spec in arrays_meta.items():
            _checked(isinstance(spec, list) and len(spec) == 3, f"meta.json's entry of {name}")
            dtype, shape, digest = spec
            a = np.load(entry / f"{name}.npy", mmap_mode="r", allow_pickle=False)
            _checked(str(a.dtype) == dtype and list(a.shape) == shape,
                     f"{name}.npy holds {a.dtype}{list(a.shape)}, expected {dtype}{shape}")
            _checked(xxhash.xxh3_64_hexdigest(memoryview(np.ascontiguousarray(a)).cast("B"))
                     == digest, f"{name}.npy's bytes are not the ones written (xxh3-64)")
            arrays[name] = a
    except (FileNotFoundError, _Unreadable):
        raise
    except Exception as e:  # noqa: BLE001 - whatever a damaged entry raises: parse again
        raise _Unreadable(f"{type(e).__name__}: {e}"[:200]) from None
    pr = Parsed(**{n: arrays[n] for n in _ARRAY_FIELDS},
                block_tokens=meta["block_tokens"], source=meta["source"], warnings=warnings,
                notes={k: v for k, v in notes.items() if k != "parse_s"},
                extra={n: arrays["extra." + n] for n in extra})
    sink.count = skipped["count"]
    sink.examples = list(skipped["examples"])
    try:
        os.utime(meta_path)  # most recently used (the size cap removes the least recently used)
    except OSError:
        pass  # (a read-only cache, or another user's entry: read as it is, its age unchanged)
    return pr


def _write(root: Path, entry: Path, key: str, material: dict, pr: Parsed,
           sink: ErrorSink) -> bool:
    """Store ``pr`` and the sink's skipped rows as ``entry`` (written in a temporary folder of
    ``root``, readable by all as the umask allows, then renamed into place). Returns True when
    it placed the entry, False when an entry of the same key was there already (a concurrent
    writer's, or one that could not be removed). Raises OSError, ValueError or TypeError when it
    cannot be written (disk, permissions, an object array, a note JSON cannot hold)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # (mkdtemp makes it 0700)
        arrays = {n: getattr(pr, n) for n in _ARRAY_FIELDS}
        arrays.update({"extra." + n: v for n, v in pr.extra.items()})
        specs = {}
        for name, a in arrays.items():
            a = np.ascontiguousarray(a)
            np.save(tmp / f"{name}.npy", a, allow_pickle=False)
            specs[name] = [str(a.dtype), list(a.shape),
                           xxhash.xxh3_64_hexdigest(memoryview(a).cast("B"))]
        meta = {"cache_format": CACHE_FORMAT, "key": key, "material": material,
                "arrays": specs, "extra": list(pr.extra), "block_tokens": int(pr.block_tokens),
                "source": pr.source, "warnings": list(pr.warnings), "notes": pr.notes,
                "skipped": sink.as_dict()}
        meta = json.loads(json.dumps(meta, default=_plain))  # (as it reads back)
        meta["checksum"] = _meta_checksum(meta)
        (tmp / "meta.json").write_text(json.dumps(meta))
        try:
            os.rename(tmp, entry)
            return True
        except OSError:
            if not entry.exists():
                raise
            return False
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _meta_checksum(meta: dict) -> str:
    """xxh3-128 (hex) of an entry's meta.json document ``meta`` without its ``checksum`` key
    (canonical JSON: sorted keys), stored as that key: a meta.json altered since it was
    written (a number changed, a line cut) no longer matches and the entry is parsed again."""
    return xxhash.xxh3_128_hexdigest(json.dumps(meta, sort_keys=True).encode())


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


def _own_entry(e: Path) -> bool:
    """Whether folder ``e`` is a cache entry this module wrote: a 32-hex-digit name and a
    meta.json naming that key (so a user's folder is never taken for one)."""
    if not (_KEY_RE.fullmatch(e.name) and e.is_dir()):
        return False
    try:
        meta = json.loads((e / "meta.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("key") == e.name


def _trim(root: Path, keep: Path, limit: float) -> list[str]:
    """Remove the least recently used entries of ``root`` (by their meta.json's modification
    time) until the entries take at most ``limit`` bytes, and temporary folders of writes older
    than an hour (a killed run's); ``keep`` and anything not written by this module are never
    removed. Returns the names of the entries removed."""
    entries = []
    now = time.time()
    for e in root.iterdir():
        try:
            if _TMP_RE.fullmatch(e.name) and e.is_dir() and now - e.stat().st_mtime > _STALE_TMP_S:
                shutil.rmtree(e, ignore_errors=True)
            elif _own_entry(e):
                entries.append(((e / "meta.json").stat().st_mtime, e.name, e, _entry_bytes(e)))
        except OSError:
            continue  # (another job removed it meanwhile, or it is not ours to read)
    total = sum(x[3] for x in entries)
    removed = []
    for _, name, e, size in sorted(entries):
        if total <= limit:
            break
        if e == keep:
            continue
        shutil.rmtree(e, ignore_errors=True)
        if not e.exists():
            total -= size
            removed.append(name)
    return removed


def parse_cached(cfg: Any, path: Path, seed: int, sink: ErrorSink,
                 parse: Callable[[], Parsed],
                 seed_used: Optional[Callable[[], bool]] = None) -> tuple[Parsed, dict]:
    """The loader's result for ``path`` under ``cfg`` and ``seed``: from the cache when it holds
    the entry, else ``parse()`` (which reports bad rows to ``sink``), stored for the next run.

    ``seed_used``: called after ``parse()``, whether the parse drew from the seeded random
    generator (None: assume it did). A parse that drew nothing gives the same result for every
    seed: it is stored once, under the seed-free key (:func:`cache_key` with seed None), which
    every seed looks up first.

    Returns ``(parsed, info)``: ``info`` has ``status`` (``"hit"``, ``"miss"`` or ``"off"``:
    ``trace.cache=false``, an input the cache does not take, a result it may not store, an input
    that changed while it was parsed),
    ``entry`` (the entry folder, or None) and ``warnings`` (an unreadable entry, a failed write,
    an input that could not be fingerprinted, entries removed by the size cap), and where the
    input was fingerprinted and did not change while parsed, ``input``
    (:func:`input_fingerprint`'s list).

    Raises whatever ``parse`` raises (a TraceError on a bad trace: nothing is stored then), and
    TraceError for a malformed ``KVSIM_CACHE_MAX_GIB``.
    """
    if not getattr(cfg, "cache", True):
        return parse(), {"status": "off", "entry": None, "warnings": []}
    limit = _max_bytes()
    root = cache_root(getattr(cfg, "cache_dir", None))
    try:
        material = _material(cfg, path)
    except OSError as e:  # (the loader, reading the same file, names the problem if it is one)
        return parse(), {"status": "off", "entry": None, "warnings": [
            f"trace cache: could not read {path} to fingerprint it ({type(e).__name__}: "
            f"{e}"[:300] + "); parsed without the cache"]}
    if material is None:
        return parse(), {"status": "off", "entry": None, "warnings": []}
    seeded = _keyed(material, seed)
    free = _keyed(material, None) if seed_used is not None else None
    warnings: list[str] = []
    unreadable: dict = {}  # entry -> why it could not be read back
    for key, _ in [k for k in (free, seeded) if k is not None]:
        entry = root / key
        try:
            return _read(entry, key, sink), {"status": "hit", "entry": str(entry),
                                             "warnings": [], "input": material["input"]}
        except FileNotFoundError:
            pass
        except _Unreadable as e:
            unreadable[entry] = str(e)
            shutil.rmtree(entry, ignore_errors=True)
    pr = parse()
    if not pr.cacheable:
        return pr, {"status": "off", "entry": None, "warnings": []}
    try:
        same = _input_fingerprint(cfg.format, path) == material["input"]
    except OSError:
        same = False
    if not same:  # (the file changed while it was parsed: the key would not name what was read)
        return pr, {"status": "off", "entry": None, "warnings": [
            f"trace cache: {path} changed while it was parsed; the result was not stored"]}
    key, stored = free if free is not None and not seed_used() else seeded
    info_input = material["input"]
    entry = root / key
    placed = False
    try:
        placed = _write(root, entry, key, stored, pr, sink)
        removed = _trim(root, entry, limit)
        if removed:
            warnings.append(f"trace cache {root}: removed {len(removed)} least recently used "
                            f"entries to stay under {limit / 2**30:g} GiB (KVSIM_CACHE_MAX_GIB)")
    except (OSError, ValueError, TypeError) as e:
        warnings.append(f"trace cache entry {entry} could not be written "
                        f"({type(e).__name__}: {e}"[:300] + "); the run goes on without it")
    for bad, why in unreadable.items():
        done = " and rewrote the entry" if placed and bad == entry else \
            " (the entry could not be replaced: it stays as it is)" if bad.exists() else ""
        warnings.insert(0, f"trace cache entry {bad} could not be read back ({why}); parsed "
                           f"the trace again{done}")
    return pr, {"status": "miss", "entry": str(entry), "warnings": warnings, "input": info_input}


def input_fingerprint(cfg: Any) -> Optional[list]:
    """What a run of the trace config ``cfg`` (a :class:`~traces.config.TraceConfig`, DictConfig
    or dict) reads, as ``[[file name, size in bytes, xxh3-128 hex], ...]``: the trace file, or a
    ServeGen folder's ``chunk-N-*`` files; None for a generated trace or an input that is not a
    regular file (or folder, for ServeGen). Recorded in a run's ``summary.json``
    (``trace_input``), so that ``output.skip_completed`` reruns a run whose trace changed.
    Raises TraceError when the trace file is missing (as the loader would), OSError when it
    cannot be read."""
    from .config import coerce_config, resolve_path

    c = coerce_config(cfg)
    path = resolve_path(c)
    return None if path is None else _input_fingerprint(c.format, path)


from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
