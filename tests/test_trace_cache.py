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
    import traces.azure
    import traces.mooncake
    import traces.servegen
    import traces.weka

    fn = {"mooncake": traces.mooncake.load_mooncake, "azure": traces.azure.load_azure,
          "weka": traces.weka.load_weka, "servegen": traces.servegen.load_servegen}[opts["format"]]
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
    for bad in ("0", "-1", "lots", "inf"):
        monkeypatch.setenv("KVSIM_CACHE_MAX_GIB", bad)
        with pytest.raises(ValueError, match="KVSIM_CACHE_MAX_GIB"):
            _load(tmp_path, **a)


def test_cache_options_are_checked_and_the_folder_defaults(tmp_path, monkeypatch):
    with pytest.raises(TraceError, match="field 'cache'.*true or false"):
        coerce_config({"cache": "yes"})
    with pytest.raises(TraceError, match="field 'cache_dir'"):
        coerce_config({"cache_dir": ""})
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
