"""Tests of the traces package (loaders, validation, samplers). Real-data tests that need
../shared/traces are skipped when it is absent; the full Weka file is marked slow."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from traces import (TRACE_FORMATS, WORKLOAD_SCHEMA, TraceConfig, TraceError, Workload,
                    load_workload, traces_dir)
from traces.formats.servegen import parse_pmf

DATA = Path(__file__).parent / "data" / "traces"
REPO = Path(__file__).resolve().parents[1]
REAL = traces_dir()
needs_real = pytest.mark.skipif(not (REAL / "SOURCES.md").exists(), reason=f"shared traces absent ({REAL / 'SOURCES.md'} not found; set KVSIM_TRACES_DIR to the shared traces folder)")


def cfg(**kw) -> TraceConfig:
    return TraceConfig(**kw)


# ---------------------------------------------------------------- bundled slice / mooncake
def test_bundled_default_slice():
    w = load_workload(None, seed=0)
    assert isinstance(w, Workload)
    assert len(w) == 1750
    assert w.table.schema.equals(WORKLOAD_SCHEMA)
    assert w.prefix_block_tokens == 512 and not w.closed_loop
    assert w.input_tokens[0] == 6758 and w.output_tokens[0] == 500
    off, val = w.prefix_offsets(), w.prefix_values()
    assert off.dtype == np.int64 and off.size == 1751
    assert val[off[0]:off[1]].tolist() == list(range(14))
    assert val[off[1]:off[2]].tolist() == [0] + list(range(14, 28))
    assert np.all(w.request_id == np.arange(1750))
    assert np.all(w.parent_request_id == -1)
    # 'even' spread: ~3 s buckets spread over [T, T_next)
    a = w.arrival_s
    assert np.all(np.diff(a) >= 0) and a[0] == 0.0 and 0 < a[1] < 3.0
    assert a.max() < 600.0


def test_timestamp_spread_modes():
    keep = load_workload(cfg(timestamp_spread="keep"), 0).arrival_s
    assert keep[1] == 0.0 and np.unique(keep).size < len(keep) / 1.2
    assert np.allclose(keep * 1000, np.rint(keep * 1000))
    # (on the trace clock: by default arrivals count from the first, jittered, one)
    raw = dict(timestamp_spread="jitter", rebase_to_first_arrival=False)
    j1 = load_workload(cfg(**raw), 1).arrival_s
    j1b = load_workload(cfg(**raw), 1).arrival_s
    j2 = load_workload(cfg(**raw), 2).arrival_s
    assert np.array_equal(j1, j1b) and not np.array_equal(j1, j2)
    assert np.all(np.diff(j1) >= 0)
    assert np.all(j1 >= keep) and np.all(j1 < keep + 3.01)
    rebased = load_workload(cfg(timestamp_spread="jitter"), 1).arrival_s
    assert rebased[0] == 0.0 and np.allclose(rebased, j1 - j1[0])


def test_slicing_and_time_scale():
    w = load_workload(cfg(start_s=60, duration_s=60, time_scale=0.5, timestamp_spread="keep"), 0)
    full = load_workload(cfg(timestamp_spread="keep"), 0)
    fa = full.arrival_s
    sel = (fa >= 60) & (fa < 120)
    assert len(w) == sel.sum()
    assert np.allclose(w.arrival_s, (fa[sel] - 60) * 0.5)
    assert np.array_equal(w.input_tokens, full.input_tokens[sel])
    off, val = w.prefix_offsets(), w.prefix_values()
    foff, fval = full.prefix_offsets(), full.prefix_values()
    i0 = np.flatnonzero(sel)[0]
    assert np.array_equal(val[off[0]:off[1]], fval[foff[i0]:foff[i0 + 1]])
    assert len(load_workload(cfg(max_requests=7), 0)) == 7


def test_mooncake_hash_count_error():
    with pytest.raises(TraceError) as e:
        load_workload(cfg(name="x", path=str(DATA / "mooncake_bad_hash.jsonl")), 0)
    msg = str(e.value)
    assert "mooncake_bad_hash.jsonl line 2" in msg
    assert "field 'hash_ids'" in msg and "found 3 ids" in msg and "ceil(2000/512)=4" in msg


def test_mooncake_nonmonotonic_error():
    with pytest.raises(TraceError, match=r"mooncake_nonmono.jsonl line 2, field 'timestamp'"):
        load_workload(cfg(name="x", path=str(DATA / "mooncake_nonmono.jsonl")), 0)


def test_mooncake_timestamps_on_another_clock_start_at_zero(tmp_path):
    """A Mooncake-format file with Unix-epoch millisecond timestamps has its arrivals counted from
    the first row's timestamp, with a warning naming it (not a first arrival at ~1.7e9 s and a
    throughput near 0); a file starting at 0 (the real ones) loads without one."""
    rows = [{"timestamp": 1_700_000_000_000 + d, "input_length": 600, "output_length": 10,
             "hash_ids": [i, 100 + i]} for i, d in enumerate((0, 1500, 1500, 4000))]
    f = tmp_path / "epoch.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = load_workload(cfg(name="x", path=str(f), timestamp_spread="keep"), 0)
    assert w.arrival_s.tolist() == [0.0, 1.5, 1.5, 4.0]
    assert any("timestamps start at 1700000000000 ms (line 1)" in m for m in w.warnings)
    win = load_workload(cfg(name="x", path=str(f), timestamp_spread="keep", start_s=1.0,
                            duration_s=2.0, rebase_to_first_arrival=False), 0)
    assert win.arrival_s.tolist() == [0.5, 0.5]  # (the window counts from the first row too)
    for r in rows:
        r["timestamp"] -= 1_700_000_000_000
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w0 = load_workload(cfg(name="x", path=str(f), timestamp_spread="keep"), 0)
    assert w0.arrival_s.tolist() == [0.0, 1.5, 1.5, 4.0] and not w0.warnings
    for r in rows:  # a slice of a real file (first row at 300 s) keeps its clock with
        r["timestamp"] += 300_000  # rebase_to_first_arrival=false (by default it starts at 0)
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w3 = load_workload(cfg(name="x", path=str(f), timestamp_spread="keep",
                           rebase_to_first_arrival=False), 0)
    assert w3.arrival_s.tolist() == [300.0, 301.5, 301.5, 304.0] and not w3.warnings
    for r in rows:  # nanoseconds for ms: still the unit mix-up error, not a shifted clock
        r["timestamp"] = 1_700_000_000_000_000_000 + r["timestamp"] * 1_000_000
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TraceError, match=r"field 'timestamp'.*unit mix-up \(ns for ms\)"):
        load_workload(cfg(name="x", path=str(f)), 0)


def test_mooncake_spread_over_a_long_gap_is_named(tmp_path):
    """The timestamp spread (timestamp_spread=even, the default) is for the real files' ~3 s
    buckets: a spread over a gap longer than 30 s (or 10x the median gap), such as 10 requests
    at 0 followed by one an hour later, is named in a warning pointing to
    timestamp_spread=keep, which keeps the burst as recorded."""
    rows = [{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [i, 100 + i]}
            for i in range(10)]
    rows.append({"timestamp": 3_600_000, "input_length": 600, "output_length": 10,
                 "hash_ids": [50, 51]})
    f = tmp_path / "burst.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = load_workload(cfg(name="x", path=str(f)), 0)
    assert w.arrival_s[:3].tolist() == [0.0, 360.0, 720.0]
    assert len(w.warnings) == 1
    assert "10 requests at 0 ms spread over 3600 s" in w.warnings[0]
    assert "trace.timestamp_spread=keep" in w.warnings[0]
    k = load_workload(cfg(name="x", path=str(f), timestamp_spread="keep"), 0)
    assert k.arrival_s[:10].tolist() == [0.0] * 10 and not k.warnings
    assert not load_workload(cfg(name="x", path=str(REPO / "traces" / "data" /
                                                    "mooncake_conversation_10min.jsonl")), 0).warnings


def test_mooncake_mixed_fail_and_skip():
    p = str(DATA / "mooncake_mixed.jsonl")
    with pytest.raises(TraceError, match=r"line 2, field 'input_length': missing field"):
        load_workload(cfg(name="x", path=p), 0)
    w = load_workload(cfg(name="x", path=p, on_error="skip"), 0)
    assert len(w) == 2 and w.skipped["count"] == 4
    ex = w.skipped["examples"]
    assert "line 3, field 'input_length'" in ex[1] and "'100' (string)" in ex[1]
    assert "line 4, field 'input_length'" in ex[2] and ">= 1" in ex[2]
    assert "line 5" in ex[3] and "invalid JSON" in ex[3]
    assert any("skipped" in x for x in w.warnings)


def test_empty_file_and_missing_path_and_unknown():
    with pytest.raises(TraceError, match="empty file"):
        load_workload(cfg(name="x", path=str(DATA / "empty.jsonl")), 0)
    with pytest.raises(TraceError) as e:
        load_workload(cfg(name="x", path="/nonexistent/trace.jsonl"), 0)
    assert "/nonexistent/trace.jsonl" in str(e.value) and "trace.path" in str(e.value)
    with pytest.raises(TraceError) as e:
        load_workload(cfg(format="parquetx"), 0)
    assert "synthetic_multiturn" in str(e.value) and "parquetx" in str(e.value)
    with pytest.raises(TraceError, match="unknown trace name"):
        load_workload(cfg(name="nope", format="mooncake"), 0)
    with pytest.raises(TraceError, match="time_scale"):
        load_workload(cfg(time_scale=0), 0)


def test_missing_trace_path_names_the_users_file_not_the_preset():
    """A trace.path that does not exist is named as the user's file (field trace.path), never
    as the trace preset's (whose file was not looked for)."""
    with pytest.raises(TraceError) as e:
        load_workload(cfg(name="mooncake_conversation_10min", format="mooncake",
                          path="/nonexistent/own.jsonl"), 0)
    msg = str(e.value)
    assert msg.startswith("/nonexistent/own.jsonl, field 'trace.path': trace file not found, "
                          "expected an existing mooncake trace file"), msg
    assert "mooncake_conversation_10min" not in msg


def test_missing_default_names_env(monkeypatch, tmp_path):
    monkeypatch.setenv("KVSIM_TRACES_DIR", str(tmp_path))
    with pytest.raises(TraceError) as e:
        load_workload(cfg(name="azure_conv", format="azure"), 0)
    assert str(tmp_path / "azure2023" / "AzureLLMInferenceTrace_conv.csv") in str(e.value)


# ---------------------------------------------------------------- azure
def test_azure_errors_and_policies():
    with pytest.raises(TraceError, match=r"azure_neg.csv line 3, field 'ContextTokens': found -3"):
        load_workload(cfg(name="x", format="azure", path=str(DATA / "azure_neg.csv")), 0)
    with pytest.raises(TraceError, match=r"line 1, field 'GeneratedTokens': missing column"):
        load_workload(cfg(name="x", format="azure", path=str(DATA / "azure_missing_col.csv")), 0)
    z = str(DATA / "azure_zero.csv")
    with pytest.raises(TraceError, match=r"line 2, field 'GeneratedTokens': found 0"):
        load_workload(cfg(name="x", format="azure", path=z, zero_output="error"), 0)
    w = load_workload(cfg(name="x", format="azure", path=z), 0)
    assert w.output_tokens.tolist() == [1] and w.notes["zero_output_rows"] == 1 and w.warnings
    u = load_workload(cfg(name="x", format="azure", path=str(DATA / "azure_unsorted.csv")), 0)
    assert u.input_tokens.tolist() == [20, 10] and u.arrival_s.tolist() == [0.0, 1.5]
    assert "sorted" in u.warnings[0] and "line 3" in u.warnings[0]
    assert u.prefix_block_tokens == 0 and u.prefix_values().size == 0


@needs_real
def test_azure_real():
    w = load_workload(cfg(name="azure_code", format="azure"), 0)
    assert len(w) == 8819 and w.input_tokens[0] == 4808 and w.output_tokens[0] == 10
    assert abs(w.arrival_s[1] - 0.052) < 1e-9 and not w.warnings


@needs_real
def test_mooncake_real_full():
    w = load_workload(cfg(name="mooncake_conversation"), 0)
    assert len(w) == 12031 and not w.warnings


# ---------------------------------------------------------------- weka
def _weka(path, **kw):
    return load_workload(cfg(name="t", format="weka", path=str(path), session_arrival="recorded",
                             session_interval_s=100.0, **kw), 0)


@pytest.mark.parametrize("fname", ["weka_tiny.jsonl", "weka_tiny.jsonl.xz"])
def test_weka_structure(fname):
    w = _weka(DATA / fname)
    assert w.closed_loop and w.prefix_block_tokens == 64 and len(w) == 7
    assert w.parent_request_id.tolist() == [-1, 0, 1, 0, 3, -1, 5]
    assert np.allclose(w.think_s, [0, 3.0, 4.0, 25.0, 7.0, 0, 8.0])
    assert w.turn.tolist() == [0, 0, 1, 1, 2, 0, 1]
    assert w.session_id.tolist() == [0, 0, 0, 0, 0, 1, 1]
    assert np.allclose(w.arrival_s, [0, 5, 10, 30, 40, 100, 110])
    assert w.output_tokens.tolist() == [10, 4, 3, 1, 5, 2, 2]  # out 0 -> 1
    off, val = w.prefix_offsets(), w.prefix_values()
    ids = [val[off[i]:off[i + 1]].tolist() for i in range(7)]
    assert ids == [[0, 1, 2], [4, 5], [4, 5, 6], [0, 1, 2, 3], [0, 1, 2, 3], [7, 8], [7, 9]]


def test_weka_share_system_prefix():
    w = _weka(DATA / "weka_tiny.jsonl", share_system_prefix=True)
    off, val = w.prefix_offsets(), w.prefix_values()
    ids = [val[off[i]:off[i + 1]].tolist() for i in range(7)]
    assert ids[0][:2] == ids[5][:2] == [0, 1]   # shared system+tool blocks
    assert ids[6] == [0, 7]                      # diverges at block 1 -> own id
    assert ids[0][2] not in ids[5]
    assert ids[1][0] == 2                        # sub-agent system block


def test_weka_poisson_seeded():
    p = str(DATA / "weka_tiny.jsonl")
    a = load_workload(cfg(name="t", format="weka", path=p), 1).arrival_s
    b = load_workload(cfg(name="t", format="weka", path=p), 1).arrival_s
    c = load_workload(cfg(name="t", format="weka", path=p), 2).arrival_s
    assert np.array_equal(a, b) and not np.array_equal(a, c) and a[0] == 0.0


def test_weka_errors():
    with pytest.raises(TraceError) as e:
        _weka(DATA / "weka_bad.jsonl")
    msg = str(e.value)
    assert "weka_bad.jsonl line 2" in msg and "field 'hash_ids'" in msg and "floor(150/64)=2" in msg
    w = _weka(DATA / "weka_bad.jsonl", on_error="skip")
    assert w.skipped["count"] == 2 and "duplicate session id" in w.skipped["examples"][1]
    assert w.num_sessions == 1
    with pytest.raises(TraceError, match=r"weka_corrupt.jsonl.xz before its first line: unreadable xz"):
        _weka(DATA / "weka_corrupt.jsonl.xz")


@needs_real
@pytest.mark.slow
def test_weka_real_full():
    w = load_workload(cfg(name="weka_agentic", format="weka"), 0)
    assert len(w) == 49334 and w.num_sessions == 710
    assert w.prefix_values().size == 94_310_647
    assert int(w.input_tokens.sum()) == 6_037_445_403
    assert w.notes["subagents"] == 63


@needs_real
def test_weka_full_load_streams_with_bounded_memory():
    """Issue 8: the full Weka trace (460 MB of JSON) loads streaming; peak RSS measured in a fresh
    process so earlier tests do not count."""
    import json as _json
    import subprocess
    import sys

    code = (
        "import json, resource\n"
        "from traces import TraceConfig, load_workload\n"
        "w = load_workload(TraceConfig(name='weka_agentic', format='weka'), 0)\n"
        "from traces.loader import peak_rss_mb\n"
        "print(json.dumps({'n': len(w), 'rss_mb': peak_rss_mb()}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    r = _json.loads(out.stdout.strip().splitlines()[-1])
    assert r["n"] == 49334
    # 1.04 GB measured (VmHWM: ru_maxrss would include the pytest parent's memory, inherited
    # across fork+exec on Linux)
    assert r["rss_mb"] < 1500, r


@needs_real
def test_weka_real_first_sessions():
    w = load_workload(cfg(name="weka_agentic", format="weka", max_sessions=3), 0)
    assert w.num_sessions == 3 and w.input_tokens[0] == 71175
    assert (w.parent_request_id < 0).sum() == 3


# ---------------------------------------------------------------- servegen
def test_pmf_parsing():
    v, pr = parse_pmf("{10: 0.25, 20: 0.75}", path="f", window="0", field="input_tokens", integer=True)
    assert v.tolist() == [10, 20] and pr.tolist() == [0.25, 0.75]
    assert parse_pmf("{}", path="f", window="0", field="x", integer=True) is None
    with pytest.raises(TraceError, match=r"f window '0', field 'x': PMF does not sum to 1"):
        parse_pmf("{1: 0.5}", path="f", window="0", field="x", integer=True)
    with pytest.raises(TraceError, match="unparsable PMF"):
        parse_pmf("__import__('os')", path="f", window="0", field="x", integer=True)


@pytest.mark.parametrize("text, integer, found", [
    ("{100000000000000000000: 1.0}", True, "key 100000000000000000000"),  # beyond int64
    ("{9223372036854775807: 1.0}", True, "key 9223372036854775807"),  # beyond any context
    ("{0: 1.0}", True, "key 0"),
    ("{1e400: 1.0}", False, "key inf"),  # reason_ratio: a ratio
    ("{5.0: 1.0}", False, "key 5.0"),
    ("{10: " + "9" * 400 + "}", True, "probability 999"),  # an int beyond any float
])
def test_pmf_keys_and_probabilities_out_of_range_name_the_field(text, integer, found):
    """Token counts outside [1, 2**31 - 1], ratios outside [0, 1] and probabilities no float
    holds are TraceErrors naming the file, window, field and value (not an OverflowError from
    numpy, nor a run of requests with 9.2e18 tokens)."""
    with pytest.raises(TraceError, match=r"f window '0', field 'x': found " + found):
        parse_pmf(text, path="f", window="0", field="x", integer=integer)


def test_servegen_bad_pmf_and_sampler():
    with pytest.raises(TraceError) as e:
        load_workload(cfg(name="s", format="servegen", path=str(DATA / "servegen_bad")), 0)
    msg = str(e.value)
    assert "chunk-0-dataset.json" in msg and "window '0'" in msg and "'input_tokens'" in msg
    c = cfg(name="s", format="servegen", path=str(DATA / "servegen_ok"), num_requests=500)
    a, b, d = load_workload(c, 3), load_workload(c, 3), load_workload(c, 4)
    assert len(a) == 500 and a.table.equals(b.table) and not a.table.equals(d.table)
    assert set(a.input_tokens.tolist()) <= {10, 20} and set(a.output_tokens.tolist()) == {5}
    assert np.all(np.diff(a.arrival_s) >= 0) and a.arrival_s.max() < 600 + 1200
    assert a.extra["reason_ratio"].shape == (500,)


@needs_real
def test_servegen_real_small():
    w = load_workload(cfg(name="servegen_r1", format="servegen", num_requests=300, clients=[0, 1]), 0)
    assert len(w) == 300 and w.output_tokens.min() >= 1 and w.input_tokens.min() >= 1


# ---------------------------------------------------------------- synthetic
@pytest.mark.parametrize("fmt", ["synthetic_agentic", "synthetic_reasoning", "synthetic_multiturn"])
def test_synthetic_determinism(fmt):
    a, b, c = (load_workload(cfg(name=fmt, format=fmt), s) for s in (7, 7, 8))
    assert a.table.equals(b.table) and not a.table.equals(c.table)
    assert a.output_tokens.min() >= 1 and a.input_tokens.min() >= 1
    assert np.all(a.parent_request_id < a.request_id)


def test_synthetic_multiturn_prefix_consistency():
    w = load_workload(cfg(name="m", format="synthetic_multiturn", num_sessions=5), 0)
    off, val, par = w.prefix_offsets(), w.prefix_values(), w.parent_request_id
    G = w.prefix_block_tokens
    n_child = 0
    for i in range(len(w)):
        assert off[i + 1] - off[i] == w.input_tokens[i] // G
        p = par[i]
        if p >= 0:
            n_child += 1
            # turn r shares the full previous prompt + output (all its full blocks)
            k = (w.input_tokens[p] + w.output_tokens[p]) // G
            assert np.array_equal(val[off[i]:off[i] + k], val[off[p]:off[p]] if k == 0 else
                                  np.concatenate([val[off[p]:off[p + 1]],
                                                  val[off[i] + (off[p + 1] - off[p]):off[i] + k]]))
            assert np.array_equal(val[off[i]:off[i] + (off[p + 1] - off[p])], val[off[p]:off[p + 1]])
            assert w.think_s[i] > 0
    assert n_child > 0
    sess = w.session_id
    first = [np.flatnonzero(sess == s)[0] for s in np.unique(sess)]
    nshared = 500 // G
    for a in first[1:]:
        assert np.array_equal(val[off[a]:off[a] + nshared], val[off[first[0]]:off[first[0]] + nshared])


# ---------------------------------------------------------------- config / presets
def test_presets_and_omegaconf():
    from omegaconf import OmegaConf
    schema = OmegaConf.structured(TraceConfig)
    confdir = REPO / "experiments" / "conf" / "trace"
    names = sorted(p.stem for p in confdir.glob("*.yaml"))
    assert {"mooncake_conversation_10min", "mooncake_conversation", "mooncake_synthetic",
            "azure_conv", "azure_code", "weka_agentic", "servegen_r1", "synthetic_agentic",
            "synthetic_reasoning", "synthetic_multiturn"} <= set(names)
    for n in names:
        merged = OmegaConf.merge(schema, OmegaConf.load(confdir / f"{n}.yaml"))
        assert merged.name == n and merged.format in TRACE_FORMATS
    w = load_workload(OmegaConf.merge(schema, OmegaConf.load(confdir / "synthetic_reasoning.yaml")), 0)
    assert len(w) == 2000
    w2 = load_workload(OmegaConf.merge(schema, {"max_requests": 5}), 0)
    assert len(w2) == 5


_NUM_TOKENS = st.one_of(
    st.integers(-10**20, 10**20).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(["5.", ".5", "+5", "007", "1e400", "-0", "-0.0", "2E-3", "1.5e+2"]))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_NUM_TOKENS, _NUM_TOKENS), max_size=8), st.sampled_from([", ", ",", " , "]),
       st.booleans())
def test_servegen_flat_pmf_literal_reads_as_python_does(pairs, sep, trailing):
    """The fast path for a flat ``{number: number}`` literal (read as JSON) gives what
    ``ast.literal_eval`` gives: the same keys, values and their int / float types, or its
    error."""
    import ast

    from traces.formats.servegen import _literal_dict

    text = "{" + sep.join(f"{k}: {v}" for k, v in pairs) + ("," if trailing and pairs else "") + "}"
    try:
        want = ast.literal_eval(text)
    except (ValueError, SyntaxError) as e:  # e.g. 007: the fast path raises the same error
        with pytest.raises(type(e)):
            _literal_dict(text)
        return
    got = _literal_dict(text)
    assert list(got.items()) == list(want.items())
    assert [(type(k), type(v)) for k, v in got.items()] == [(type(k), type(v)) for k, v in want.items()]


def test_null_hash_ids_is_named_as_found(tmp_path):
    """``"hash_ids": null`` is named as found (null); an absent field is a missing one."""
    f = tmp_path / "n.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": null}\n')
    with pytest.raises(TraceError, match=r"line 1, field 'hash_ids': found null, expected a list"):
        load_workload(cfg(name="x", path=str(f), cache=False), 0)
    f.write_text('{"timestamp": 0, "input_length": 600, "output_length": 10}\n')
    with pytest.raises(TraceError, match=r"field 'hash_ids': missing field, found nothing"):
        load_workload(cfg(name="x", path=str(f), cache=False), 0)
