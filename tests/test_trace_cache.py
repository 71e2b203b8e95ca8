"""The parsed-trace cache (traces.cache): a hit gives the parse's result bit for bit, the key
follows what the parse reads, and a broken entry, a failed write or a full cache is named."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from traces import load_workload
from traces.cache import SLICING_FIELDS, cache_key, cache_root
from traces.config import TraceConfig, coerce_config, resolve_path
from traces.errors import ErrorSink, TraceError

DATA = Path(__file__).parent / "data" / "traces"
BAD = Path(__file__).parent / "data" / "bad"
BUNDLED = Path(__file__).resolve().parent.parent / "traces" / "data"

# (id, trace options): one small file of every format, and bad rows skipped
CASES = [
    ("mooncake", {"format": "mooncake", "path": str(BUNDLED / "mooncake_conversation_10min.jsonl"),
                  "timestamp_spread": "jitter"}),
    ("mooncake-skip", {"format": "mooncake", "path": str(BAD / "mooncake_many_bad.jsonl"),
                       "on_error": "skip"}),
    ("azure", {"format": "azure", "path": str(DATA / "azure_zero.csv")}),
    ("weka", {"format": "weka", "path": str(BUNDLED / "weka_agentic_trace_0002.jsonl.xz")}),
    ("weka-skip", {"format": "weka", "path": str(DATA / "weka_bad.jsonl"), "on_error": "skip"}),
    ("servegen", {"format": "servegen", "path": str(DATA / "servegen_ok"), "num_requests": 300}),
]
# notes that describe the load itself, not the workload
LOAD_NOTES = {"trace_cache", "trace_cache_entry", "load_s", "peak_rss_mb", "parse_s"}


def _load(tmp_path, seed=0, **opts):
    return load_workload({"name": "t", "cache_dir": str(tmp_path / "cache"), **opts}, seed=seed)


def _same_workload(a, b):
    """The same table, warnings (but the cache's own), skipped rows, notes (but the load's) and
    extra columns."""
    assert a.table.equals(b.table)
    own = lambda ws: [w for w in ws if not w.startswith("trace cache")]  # noqa: E731
    assert own(a.warnings) == own(b.warnings) and a.skipped == b.skipped
    assert {k: v for k, v in a.notes.items() if k not in LOAD_NOTES} == \
        {k: v for k, v in b.notes.items() if k not in LOAD_NOTES}
    assert a.extra.keys() == b.extra.keys()
    for k in a.extra:
        assert a.extra[k].dtype == b.extra[k].dtype and np.array_equal(a.extra[k], b.extra[k])


@pytest.mark.parametrize("opts", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_a_hit_gives_what_the_parse_gave(tmp_path, opts):
    off = load_workload({"name": "t", "cache": False, **opts}, seed=5)
    miss = _load(tmp_path, seed=5, **opts)
    hit = _load(tmp_path, seed=5, **opts)
    assert (off.notes["trace_cache"], miss.notes["trace_cache"], hit.notes["trace_cache"]) == \
        ("off", "miss", "hit")
    assert hit.notes["trace_cache_entry"] == miss.notes["trace_cache_entry"]
    _same_workload(off, miss)
    _same_workload(off, hit)
    assert off.warnings == miss.warnings == hit.warnings
    if opts.get("on_error") == "skip":
        assert hit.skipped["count"] > 0


def test_the_key_follows_the_file_the_seed_and_the_options_the_loader_reads(tmp_path):
    src = tmp_path / "trace.jsonl"
    shutil.copy(BUNDLED / "mooncake_conversation_10min.jsonl", src)
    opts = {"format": "mooncake", "path": str(src), "timestamp_spread": "jitter"}
    assert _load(tmp_path, **opts).notes["trace_cache"] == "miss"
    # the slicing options and the preset name are read after the loader: the same entry
    for extra in ({"max_requests": 10}, {"time_scale": 2.0}, {"duration_s": 60.0}, {"name": "u"}):
        assert _load(tmp_path, **opts, **extra).notes["trace_cache"] == "hit", extra
    assert _load(tmp_path, seed=1, **opts).notes["trace_cache"] == "miss"  # (the jitter)
    assert _load(tmp_path, **{**opts, "timestamp_spread": "keep"}).notes["trace_cache"] == "miss"
    # the same size and modification time, one digit changed: the content is in the key
    raw = src.read_bytes()
    st = src.stat()  # (the first row's output length: the first file row is the first table row)
    i = raw.index(b'"output_length": ') + len(b'"output_length": ')
    digit = raw[i:i + 1]
    assert digit.isdigit() and digit != b"0"
    src.write_bytes(raw[:i] + (b"1" if digit != b"1" else b"2") + raw[i + 1:])
    import os
    os.utime(src, ns=(st.st_atime_ns, st.st_mtime_ns))
    changed = _load(tmp_path, **opts)
    assert changed.notes["trace_cache"] == "miss"
    assert changed.table.column("output_tokens")[0].as_py() != \
        _load(tmp_path, **{**opts, "path": str(BUNDLED / "mooncake_conversation_10min.jsonl")}
              ).table.column("output_tokens")[0].as_py()


@pytest.mark.parametrize("opts", [c[1] for c in CASES if "skip" not in c[0]],
                         ids=[c[0] for c in CASES if "skip" not in c[0]])
def test_no_loader_reads_the_fields_the_key_leaves_out(opts):
    """The key leaves out SLICING_FIELDS: every loader's Parsed must be the same whatever they
    hold (else an entry would be reused for a different parse)."""
    import traces.formats.azure
    import traces.formats.mooncake
    import traces.formats.servegen
    import traces.formats.weka

    fn = {"mooncake": traces.formats.mooncake.load_mooncake, "azure": traces.formats.azure.load_azure,
          "weka": traces.formats.weka.load_weka, "servegen": traces.formats.servegen.load_servegen}[opts["format"]]
    other = {"name": "other", "time_scale": 3.0, "max_requests": 2, "duration_s": 1.0,
             "cache": False, "cache_dir": "/nonexistent"}
    assert set(other) | {"path"} == SLICING_FIELDS

    def parse(**more):
        c = coerce_config({"name": "t", **opts, **more})
        rng = np.random.default_rng(7)
        return fn(resolve_path(coerce_config({"name": "t", **opts})), c, rng, ErrorSink("fail"))

    a, b = parse(), parse(**other)
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "notes":
            x, y = ({k: v for k, v in d.items() if k != "parse_s"} for d in (x, y))
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and np.array_equal(x, y), f.name
        elif f.name == "extra":
            assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
        else:
            assert x == y, f.name


def test_an_unreadable_entry_is_named_parsed_again_and_rewritten(tmp_path):
    opts = {"format": "weka", "path": str(BUNDLED / "weka_agentic_trace_0002.jsonl.xz")}
    first = _load(tmp_path, **opts)
    entry = Path(first.notes["trace_cache_entry"])
    npy = entry / "prefix_values.npy"
    npy.write_bytes(npy.read_bytes()[:200])  # truncated
    again = _load(tmp_path, **opts)
    assert again.notes["trace_cache"] == "miss"
    msg = [w for w in again.warnings if "could not be read back" in w]
    assert msg and str(entry) in msg[0]
    _same_workload(first, again)
    third = _load(tmp_path, **opts)
    assert third.notes["trace_cache"] == "hit" and not any("trace cache" in w for w in third.warnings)
    # an entry of another layout is not read either
    meta = json.loads((entry / "meta.json").read_text())
    meta["cache_format"] = 0
    (entry / "meta.json").write_text(json.dumps(meta))
    assert _load(tmp_path, **opts).notes["trace_cache"] == "miss"


def test_a_failed_write_is_named_and_the_load_goes_on(tmp_path):
    (tmp_path / "cache").write_text("a file where the cache folder should be\n")
    opts = {"format": "azure", "path": str(DATA / "azure_zero.csv")}
    w = _load(tmp_path, **opts)
    msg = [x for x in w.warnings if "could not be written" in x]
    assert msg and "the run goes on without it" in msg[0]
    _same_workload(w, load_workload({"name": "t", "cache": False, **opts}))


def test_a_failed_parse_stores_nothing(tmp_path):
    with pytest.raises(TraceError, match="weka_bad.jsonl line 2"):
        _load(tmp_path, format="weka", path=str(DATA / "weka_bad.jsonl"))
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_the_size_cap_removes_the_least_recently_used_entries(tmp_path, monkeypatch):
    a = {"format": "azure", "path": str(DATA / "azure_zero.csv")}
    b = {"format": "mooncake", "path": str(BUNDLED / "mooncake_conversation_10min.jsonl")}
    first = _load(tmp_path, **a)
    monkeypatch.setenv("KVSIM_CACHE_MAX_GIB", "1e-9")  # ~1 byte: only the newest entry stays
    second = _load(tmp_path, **b)
    assert any("removed 1 least recently used" in w for w in second.warnings)
    assert not Path(first.notes["trace_cache_entry"]).exists()
    assert Path(second.notes["trace_cache_entry"]).exists()
    assert _load(tmp_path, **b).notes["trace_cache"] == "hit"
    for bad in ("0", "-1", "lots", "inf", "nan", "1e400"):
        monkeypatch.setenv("KVSIM_CACHE_MAX_GIB", bad)
        with pytest.raises(TraceError, match="KVSIM_CACHE_MAX_GIB.*a finite number of GiB > 0"):
            _load(tmp_path, **a)
    monkeypatch.setenv("KVSIM_CACHE_MAX_GIB", " ")  # empty: the default
    assert _load(tmp_path, **a).notes["trace_cache"] == "miss"


def test_cache_options_are_checked_and_the_folder_defaults(tmp_path, monkeypatch):
    with pytest.raises(TraceError, match="field 'cache'.*true or false"):
        coerce_config({"cache": "yes"})
    for bad in ("", "  "):
        with pytest.raises(TraceError, match="field 'cache_dir'"):
            coerce_config({"cache_dir": bad})
    monkeypatch.setenv("KVSIM_CACHE_DIR", str(tmp_path / "k"))
    assert cache_root() == tmp_path / "k" / "traces"
    monkeypatch.delenv("KVSIM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_root() == tmp_path / "x" / "kvsim" / "traces"
    assert cache_root(str(tmp_path / "d")) == tmp_path / "d"
    # the key names the seed and every option a loader reads, not the slicing
    c = coerce_config({"name": "mooncake_conversation_10min"})
    key, material = cache_key(c, resolve_path(c), 0)
    assert set(material["options"]) == {f.name for f in dataclasses.fields(TraceConfig)} - SLICING_FIELDS
    assert cache_key(dataclasses.replace(c, max_requests=5), resolve_path(c), 0)[0] == key
    assert cache_key(c, resolve_path(c), 1)[0] != key


def test_the_size_cap_removes_only_its_own_entries_and_old_unfinished_writes(tmp_path, monkeypatch):
    """A folder of the user's inside the cache folder (even one holding a meta.json, even one
    with a 32-hex-digit name whose meta.json names another key) is never removed; a temporary
    folder of a write older than an hour (a killed run's) is, a fresh one (a write going on) is
    not."""
    import os
    import time

    root = tmp_path / "cache"
    mine = root / "my_experiment"
    hexname = root / ("ab" * 16)
    for d in (mine, hexname):
        d.mkdir(parents=True)
        (d / "meta.json").write_text(json.dumps({"key": "not-this-folder"}))
        (d / "results.csv").write_text("keep\n" * 1000)
    old_tmp, new_tmp = root / (".%s.x1" % ("cd" * 16)), root / (".%s.x2" % ("cd" * 16))
    for d in (old_tmp, new_tmp):
        d.mkdir()
        (d / "a.npy").write_bytes(b"0" * 1000)
    t = time.time() - 7200
    os.utime(old_tmp, (t, t))
    monkeypatch.setenv("KVSIM_CACHE_MAX_GIB", "1e-9")
    a = _load(tmp_path, format="azure", path=str(DATA / "azure_zero.csv"))
    b = _load(tmp_path, format="mooncake", path=str(BUNDLED / "mooncake_conversation_10min.jsonl"))
    assert (mine / "results.csv").exists() and (hexname / "results.csv").exists()
    assert not old_tmp.exists() and new_tmp.exists()
    assert not Path(a.notes["trace_cache_entry"]).exists()  # (ours: removed by the cap)
    assert Path(b.notes["trace_cache_entry"]).exists()


@pytest.mark.parametrize("damage", ["meta-list", "meta-null", "arrays-list", "warnings-str",
                                    "count-float", "meta-block-tokens", "meta-note",
                                    "empty-npy", "garbled-npy", "swapped-npy", "missing-npy",
                                    "foreign-file"])
def test_a_damaged_entry_is_parsed_again_never_returned(tmp_path, damage):
    """Whatever is wrong in an entry (meta.json of another shape, fields of the wrong type, a
    well-formed value of meta.json changed, an empty array file, same-header bytes altered,
    another array of the same shape swapped in, an array file deleted, a file it did not
    write): a warning naming the entry, the parse's result, and a good entry for the next
    run."""
    opts = {"format": "weka", "path": str(BUNDLED / "weka_agentic_trace_0002.jsonl.xz")}
    first = _load(tmp_path, **opts)
    entry = Path(first.notes["trace_cache_entry"])
    meta_path = entry / "meta.json"
    meta = json.loads(meta_path.read_text())
    if damage == "meta-list":
        meta_path.write_text("[]")
    elif damage == "meta-null":
        meta_path.write_text("null")
    elif damage == "arrays-list":
        meta["arrays"] = list(meta["arrays"])
        meta_path.write_text(json.dumps(meta))
    elif damage == "warnings-str":
        meta["warnings"] = "abc"
        meta_path.write_text(json.dumps(meta))
    elif damage == "count-float":
        meta["skipped"]["count"] = 2.7
        meta_path.write_text(json.dumps(meta))
    elif damage == "meta-block-tokens":  # (a hit would identify blocks of 112 tokens)
        meta["block_tokens"] += 100
        meta_path.write_text(json.dumps(meta))
    elif damage == "meta-note":
        meta["notes"]["edited"] = 1
        meta_path.write_text(json.dumps(meta))
    elif damage == "missing-npy":
        (entry / "turn.npy").unlink()
    elif damage == "foreign-file":
        (entry / "notes.txt").write_text("mine")
    elif damage == "empty-npy":
        (entry / "turn.npy").write_bytes(b"")
    elif damage == "garbled-npy":
        raw = bytearray((entry / "prefix_values.npy").read_bytes())
        raw[-1] ^= 0x01
        (entry / "prefix_values.npy").write_bytes(bytes(raw))
    else:  # two int64 arrays of one shape swapped
        a, b = entry / "input_tokens.npy", entry / "output_tokens.npy"
        ra, rb = a.read_bytes(), b.read_bytes()
        a.write_bytes(rb)
        b.write_bytes(ra)
    again = _load(tmp_path, **opts)
    assert again.notes["trace_cache"] == "miss"
    msg = [w for w in again.warnings if "could not be read back" in w]
    assert msg and str(entry) in msg[0] and "rewrote the entry" in msg[0]
    _same_workload(first, again)
    assert _load(tmp_path, **opts).notes["trace_cache"] == "hit"


def test_a_read_only_entry_is_read_as_it_is(tmp_path, monkeypatch):
    """A cache the run cannot write (another user's, a read-only mount): its entries are read,
    their age left unchanged; the files are readable by all (the umask allowing)."""
    import os
    import stat as st_

    opts = {"format": "azure", "path": str(DATA / "azure_zero.csv")}
    first = _load(tmp_path, **opts)
    entry = Path(first.notes["trace_cache_entry"])
    assert entry.stat().st_mode & st_.S_IROTH and entry.stat().st_mode & st_.S_IXOTH

    def no_utime(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "utime", no_utime)
    hit = _load(tmp_path, **opts)
    assert hit.notes["trace_cache"] == "hit" and hit.warnings == first.warnings
    weka = _load(tmp_path, format="weka", path=str(BUNDLED / "weka_agentic_trace_0002.jsonl.xz"))
    assert "parse_s" in weka.notes  # (the parse's timing, not replayed by a hit: nothing parsed)
    assert "parse_s" not in _load(tmp_path, format="weka",
                                  path=str(BUNDLED / "weka_agentic_trace_0002.jsonl.xz")).notes


def test_the_key_follows_the_code_as_imported_and_the_environment(tmp_path, monkeypatch):
    """The code fingerprint is each traces module's source as imported (a reload after an edit
    counts, an edit not yet reloaded does not); the key names the Python, numpy and JSON reader
    versions."""
    import importlib

    from traces import _source

    c = coerce_config({"name": "mooncake_conversation_10min"})
    key, material = cache_key(c, resolve_path(c), 0)
    assert set(material["environment"]) == {"python", "numpy", "json"}
    monkeypatch.setitem(_source.IMPORTED, "traces.formats.mooncake", "0" * 32)  # (as if reloaded edited)
    assert cache_key(c, resolve_path(c), 0)[0] != key
    import traces.formats.mooncake
    importlib.reload(traces.formats.mooncake)  # the same source again: the same key
    assert cache_key(c, resolve_path(c), 0)[0] == key


def test_inputs_the_cache_does_not_take_are_parsed_without_it(tmp_path):
    """A folder given for a file format and a pipe are parsed without the cache (the loader's
    error, as with trace.cache=false); a ServeGen folder's key covers its chunk files only."""
    import os

    for path in (str(DATA), ):
        opts = {"format": "mooncake", "path": path}
        with pytest.raises(TraceError) as with_cache:
            _load(tmp_path, **opts)
        with pytest.raises(TraceError) as without:
            load_workload({"name": "t", "cache": False, **opts})
        assert str(with_cache.value) == str(without.value)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    c = coerce_config({"name": "t", "format": "mooncake", "path": str(fifo)})
    assert cache_key(c, fifo, 0) is None  # (never opened: a pipe is read once)
    sg = tmp_path / "sg"
    shutil.copytree(DATA / "servegen_ok", sg)
    c = coerce_config({"name": "t", "format": "servegen", "path": str(sg)})
    key = cache_key(c, sg, 0)[0]
    (sg / "notes.txt").write_text("not read by the loader\n")
    (sg / "sub").mkdir()
    assert cache_key(c, sg, 0)[0] == key
    (sg / "chunk-0-trace.csv").write_text((sg / "chunk-0-trace.csv").read_text() + "\n")
    assert cache_key(c, sg, 0)[0] != key


def test_a_result_that_read_a_slicing_option_is_not_stored(tmp_path):
    """Weka's late-arrival check reads the slicing options (it names the first late row the
    slicing keeps): a result that passed it (max_requests cut the late sessions away) is not
    stored, so a later load without the cut raises the same error as without the cache."""
    line = (DATA / "weka_tiny.jsonl").read_text().splitlines()[0]
    sess = json.loads(line)
    src = tmp_path / "six.jsonl"
    rows = []
    for i in range(6):
        sess["id"] = f"s{i}"
        rows.append(json.dumps(sess))
    src.write_text("\n".join(rows) + "\n")
    opts = {"format": "weka", "path": str(src), "session_arrival": "recorded",
            "session_interval_s": 1e9}
    cut = _load(tmp_path, max_requests=1, **opts)
    assert cut.notes["trace_cache"] == "off"
    with pytest.raises(TraceError) as with_cache:
        _load(tmp_path, **opts)
    with pytest.raises(TraceError) as without:
        load_workload({"name": "t", "cache": False, **opts})
    assert str(with_cache.value) == str(without.value) and "session_interval_s" in str(without.value)


def test_a_relative_cache_dir_is_the_start_folders_with_hydra_chdir(tmp_path):
    """hydra.job.chdir=true: a relative trace.cache_dir names a folder of the folder kvsim was
    started in (as trace.path does), so two runs share it."""
    import subprocess
    import sys

    for run in ("r1", "r2"):
        r = subprocess.run([sys.executable, "-m", "sim.cli", "trace.max_requests=20",
                            "hydra.job.chdir=true", "trace.cache_dir=relcache",
                            f"hydra.run.dir={tmp_path / run}", "sim.progress=false",
                            "output.print_summary=false"],
                           cwd=tmp_path, capture_output=True, text=True,
                           env={**__import__("os").environ,
                                "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
        assert r.returncode == 0, r.stderr[-2000:]
    walls = [json.loads((tmp_path / run / "summary.json").read_text())["wall"]["load_cache"]
             for run in ("r1", "r2")]
    assert walls == ["miss", "hit"] and (tmp_path / "relcache").is_dir()


@pytest.mark.parametrize("opts, seed_free", [
    ({"format": "mooncake", "path": str(BUNDLED / "mooncake_conversation_10min.jsonl")}, True),
    ({"format": "mooncake", "path": str(BUNDLED / "mooncake_conversation_10min.jsonl"),
      "timestamp_spread": "jitter"}, False),
    ({"format": "azure", "path": str(DATA / "azure_zero.csv")}, True),
    ({"format": "weka", "path": str(BUNDLED / "weka_agentic_trace_0002.jsonl.xz"),
      "session_arrival": "recorded"}, True),
    ({"format": "weka", "path": str(DATA / "weka_tiny.jsonl")}, False),  # (poisson starts)
    ({"format": "servegen", "path": str(DATA / "servegen_ok"), "num_requests": 200}, False),
], ids=["mooncake-even", "mooncake-jitter", "azure", "weka-recorded", "weka-poisson", "servegen"])
def test_a_parse_that_draws_no_random_number_is_stored_once_for_every_seed(tmp_path, opts,
                                                                           seed_free):
    """A sweep over seeds keeps one entry of a parse that never drew from the seeded generator
    (its result is the same for every seed), and one entry per seed otherwise; either way each
    seed gets the parse's result."""
    a = _load(tmp_path, seed=0, **opts)
    b = _load(tmp_path, seed=1, **opts)
    assert a.notes["trace_cache"] == "miss"
    assert b.notes["trace_cache"] == ("hit" if seed_free else "miss")
    assert (a.notes["trace_cache_entry"] == b.notes["trace_cache_entry"]) == seed_free
    _same_workload(b, load_workload({"name": "t", "cache": False, **opts}, seed=1))
    assert _load(tmp_path, seed=1, **opts).notes["trace_cache"] == "hit"


def test_a_file_that_changes_while_it_is_parsed_is_not_stored(tmp_path, monkeypatch):
    """The key is taken before the parse: when the file's content differs after it, the result
    (of whichever content the loader read) is not stored under the old content's key."""
    import traces.formats.azure

    src = tmp_path / "a.csv"
    shutil.copy(DATA / "azure_zero.csv", src)
    real = traces.formats.azure.load_azure

    def edit_then_load(path, *a, **k):
        out = real(path, *a, **k)
        src.write_text(src.read_text() + src.read_text().splitlines()[-1] + "\n")
        return out

    monkeypatch.setattr(traces.formats.azure, "load_azure", edit_then_load)
    w = _load(tmp_path, format="azure", path=str(src))
    assert w.notes["trace_cache"] == "off" and any("changed while it was parsed" in x
                                                   for x in w.warnings)
    monkeypatch.setattr(traces.formats.azure, "load_azure", real)
    assert _load(tmp_path, format="azure", path=str(src)).notes["trace_cache"] == "miss"
