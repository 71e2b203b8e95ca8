"""Trace validation: every loader turns a malformed input into a TraceError naming the file, the
line (window, session, request) and the field, with what was found and what was expected, and
``trace.on_error=skip`` skips and counts such rows instead; nothing malformed is read silently
or dropped. Synthetic generators check their parameters the same way (named by their config
key) and keep every prompt, the first included, within ``max_context_tokens``."""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from traces import TraceConfig, TraceError, load_workload

DATA = Path(__file__).parent / "data" / "traces"
SERVEGEN_OK = DATA / "servegen_ok"
AZ_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
BIG_FIELD = 131_072 + 10  # past csv.field_size_limit()


def _load(**kw):
    return load_workload(TraceConfig(name="x", **kw), 0)


def _servegen(tmp_path, name="sg") -> Path:
    d = tmp_path / name
    shutil.copytree(SERVEGEN_OK, d)
    return d


def _sg(d, **kw):
    return _load(format="servegen", path=str(d), num_requests=50, **kw)


def _weka(tmp_path, *sessions) -> Path:
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps(s) + "\n" for s in sessions))
    return p


def _req(t, ids=(1, 2), **kw):
    return {"t": t, "type": "n", "in": 128, "out": 5, "hash_ids": list(ids), **kw}


# ------------------------------------------------------------------ Weka sub-agent start
def test_weka_subagent_starting_before_its_session_is_an_error(tmp_path):
    """A sub-agent marker whose start (t - duration_ms / 1000) falls before its session is an
    error naming the line, session, request and fields; with on_error=skip the session is
    skipped and counted. A marker before any main request that starts inside the session is a
    root at its start."""
    bad = {"id": "s1", "block_size": 64, "hash_id_scope": "local", "requests": [
        {"type": "subagent", "t": 0, "duration_ms": 5000, "requests": [_req(0)]}, _req(1)]}
    p = _weka(tmp_path, bad)
    with pytest.raises(TraceError, match=re.escape(
            "w.jsonl line 1 (session 's1', request 0), field 't/duration_ms': sub-agent starts "
            "before its session, found t 0 s - duration_ms 5000 / 1000 = start -5 s")):
        _load(format="weka", path=str(p))
    good = {"id": "s2", "requests": [_req(0, (3, 4)), {"type": "subagent", "t": 7, "duration_ms": 5000,
                                                       "requests": [_req(0, (3, 4))]}]}
    p = _weka(tmp_path, bad, good)
    w = _load(format="weka", path=str(p), on_error="skip")
    assert len(w) == 2 and w.skipped["count"] == 1
    assert "field 't/duration_ms'" in w.skipped["examples"][0]
    # a marker before any main request that starts inside the session is a root at its start
    ok = {"id": "s3", "requests": [{"type": "subagent", "t": 5.5, "duration_ms": 5000,
                                    "requests": [_req(0)]}, _req(1)]}
    w = _load(format="weka", path=str(_weka(tmp_path, ok)))
    assert len(w) == 2 and sorted(w.arrival_s.tolist()) == [0.5, 1.0]


# ------------------------------------------------------------------ ServeGen clients
def test_servegen_client_listed_twice_is_an_error(tmp_path):
    """trace.clients names each chunk once: a repeated client (which would sample its load
    twice) and an empty list are errors."""
    d = _servegen(tmp_path)
    assert len(_sg(d, clients=[0])) == 50
    with pytest.raises(TraceError, match=r"field 'clients': repeated client, found \[0, 0\], "
                                         r"expected each chunk number once \(\[0\] repeated"):
        _sg(d, clients=[0, 0])
    with pytest.raises(TraceError, match=r"field 'clients': found \[\]"):
        _sg(d, clients=[])


# ------------------------------------------------------------------ ServeGen file names
def test_servegen_two_files_of_one_client_and_a_file_path_are_errors(tmp_path):
    """Two trace files of one client (chunk-0-trace.csv and chunk-00-trace.csv) are an error
    naming both, as is a trace.path naming one chunk file instead of its folder; a file only
    like a chunk file's name is not read as a client's."""
    d = _servegen(tmp_path)
    shutil.copy(d / "chunk-0-trace.csv", d / "chunk-00-trace.csv")
    shutil.copy(d / "chunk-0-dataset.json", d / "chunk-00-dataset.json")
    with pytest.raises(TraceError, match=r"two trace files for one client, found chunk-0-trace\.csv "
                                         r"and chunk-00-trace\.csv \(both client 0\)"):
        _sg(d)
    d = _servegen(tmp_path, "file")
    with pytest.raises(TraceError, match=r"chunk-0-trace\.csv: not a folder, found a file.*"
                                         r"trace\.clients=\[N\]"):
        _sg(d / "chunk-0-trace.csv")
    # a file only like a chunk file's name is not read as client 0's
    d = _servegen(tmp_path, "names")
    (d / "chunk-0-trace.csv").rename(d / "old-chunk-0-trace.csv")
    with pytest.raises(TraceError, match="no chunk-N-trace.csv files"):
        _sg(d)


def test_servegen_dataset_file_follows_the_trace_file_name(tmp_path):
    """A client's dataset file is its trace file's name with -dataset.json (chunk-00-trace.csv
    -> chunk-00-dataset.json); a dataset file spelling the number differently is named in the
    error."""
    d = _servegen(tmp_path)
    ref = _sg(d).table
    for f in d.iterdir():
        f.rename(d / f.name.replace("chunk-0-", "chunk-00-"))
    assert _sg(d).table.equals(ref)
    (d / "chunk-00-dataset.json").rename(d / "chunk-0-dataset.json")
    with pytest.raises(TraceError, match=r"chunk-00-dataset\.json: missing dataset file, found no such "
                                         r"file \(chunk-0-dataset\.json spells the number differently\)"):
        _sg(d)


# ------------------------------------------------------------------ ServeGen unreadable input
def test_servegen_undecodable_bytes_long_fields_and_folders_are_trace_errors(tmp_path):
    """A byte that is not UTF-8, a field past the csv module's limit and a folder named like the
    dataset file are TraceErrors naming the file and line (or the file), also with
    on_error=skip, which skips a bad trace row and counts it."""
    d = _servegen(tmp_path, "byte")
    csv_path = d / "chunk-0-trace.csv"
    rows = csv_path.read_bytes().splitlines()
    csv_path.write_bytes(b"\n".join([rows[0], rows[1] + b"\xff", rows[2]]) + b"\n")
    with pytest.raises(TraceError, match=r"chunk-0-trace\.csv line 2: not UTF-8 text, found byte 0xff "
                                         r"at column 13"):
        _sg(d)
    w = _sg(d, on_error="skip")
    assert w.skipped["count"] == 1 and len(w) == 50

    d = _servegen(tmp_path, "long")
    (d / "chunk-0-trace.csv").write_text("0,2.0,1.0,Gamma,1.0,0.5\n600,0,0,," + "0" * BIG_FIELD + ",0\n")
    with pytest.raises(TraceError, match=r"chunk-0-trace\.csv line 2, field 'shape': field too long, "
                                         r"found 131,082 characters, expected at most 131,072"):
        _sg(d)
    assert _sg(d, on_error="skip").skipped["count"] == 1

    d = _servegen(tmp_path, "json")
    ds = d / "chunk-0-dataset.json"
    ds.write_bytes(ds.read_bytes().replace(b'{"0": {', b'{"0":\n {\xff', 1))
    for mode in ("fail", "skip"):
        with pytest.raises(TraceError, match=r"chunk-0-dataset\.json line 2: not UTF-8 text, found "
                                             r"byte 0xff at column 3"):
            _sg(d, on_error=mode)

    d = _servegen(tmp_path, "dir")
    (d / "chunk-0-dataset.json").unlink()
    (d / "chunk-0-dataset.json").mkdir()
    with pytest.raises(TraceError, match=r"chunk-0-dataset\.json: not a file, found a folder"):
        _sg(d)


# ------------------------------------------------------------------ ServeGen numbers
@pytest.mark.parametrize("key, found", [
    ("nan", "'nan'"), ("-inf", "'-inf'"), ("1e309", "'1e309'"), ("600", "'600'"), ("-21600", "'-21600'"),
    ("21600\u0660", "'21600\u0660'")])
def test_servegen_dataset_window_keys_are_finite_starts_on_the_6h_grid(tmp_path, key, found):
    """A dataset window key is a finite decimal number of seconds >= 0 on the 6 h grid: 'nan',
    '-inf', '1e309', a key off the grid (which would overlap its neighbours) and non-ASCII
    digits are errors naming the key."""
    d = _servegen(tmp_path)
    ds = d / "chunk-0-dataset.json"
    obj = json.loads(ds.read_text())
    obj[key] = obj.pop("21600")
    ds.write_text(json.dumps(obj))
    with pytest.raises(TraceError, match=re.escape(
            f"chunk-0-dataset.json window '{key}': found {found}, expected a window start in "
            f"seconds: a finite decimal number >= 0, a multiple of 21600 s (6 h windows)")):
        _sg(d)


def test_servegen_dataset_repeated_windows_and_keys_are_errors(tmp_path):
    d = _servegen(tmp_path)
    ds = d / "chunk-0-dataset.json"
    obj = json.loads(ds.read_text())
    obj["21600.0"] = obj.pop("21600")
    ds.write_text(json.dumps(obj))
    assert len(_sg(d)) == 50  # 21600.0 is the window at 21600 s
    obj["0.0"] = obj["0"]
    ds.write_text(json.dumps(obj))
    with pytest.raises(TraceError, match=r"window '0\.0': duplicate window, found start 0 s, "
                                         r"expected unique window starts \(also given as '0'\)"):
        _sg(d)
    text = json.dumps({"0": json.loads(SERVEGEN_OK.joinpath("chunk-0-dataset.json").read_text())["0"]})
    ds.write_text(text[:-1] + ', "0": {}}')  # json.load kept the last "0" silently
    with pytest.raises(TraceError, match=r"invalid JSON, found ValueError: key '0' given twice"):
        _sg(d)
    ds.write_text('{"0": ' + "1" * 5000 + "}")  # json: ValueError, past 4,300 digits
    with pytest.raises(TraceError, match=r"chunk-0-dataset\.json: invalid JSON, found ValueError"):
        _sg(d)


@pytest.mark.parametrize("field, value", [("cv", "1_0"), ("window_start_s", "\u0666\u0660\u0660"),
                                          ("rate", "1_0"), ("cv", "nan"), ("cv", "-1")])
def test_servegen_trace_numbers_are_ascii_decimals(tmp_path, field, value):
    """trace.csv numbers are ASCII decimals: '1_0', Arabic-Indic digits, NaN and a negative cv
    are errors naming the line and field."""
    cols = {"window_start_s": "600", "rate": "1.0", "cv": "1.0"}
    cols[field] = value
    d = _servegen(tmp_path)
    rows = (d / "chunk-0-trace.csv").read_text().splitlines()
    rows[1] = f"{cols['window_start_s']},{cols['rate']},{cols['cv']},Gamma,1.0,1.0"
    (d / "chunk-0-trace.csv").write_text("\n".join(rows) + "\n")
    with pytest.raises(TraceError, match=rf"chunk-0-trace\.csv line 2, field '{field}': found "
                                         rf"'{re.escape(value)}', expected a"):
        _sg(d)


def test_servegen_cv_is_checked_but_does_not_change_the_sample(tmp_path):
    """The cv column is read (a finite number >= 0) and otherwise ignored, as documented: the
    sampled process's cv is that of the family and shape."""
    a, b = _servegen(tmp_path, "a"), _servegen(tmp_path, "b")
    rows = (b / "chunk-0-trace.csv").read_text().splitlines()
    rows = [",".join(r.split(",")[:2] + ["7.5"] + r.split(",")[3:]) for r in rows]
    (b / "chunk-0-trace.csv").write_text("\n".join(rows) + "\n")
    assert _sg(a).table.equals(_sg(b).table)
    import traces.servegen as sg
    assert "``cv`` is checked so but not used" in sg.__doc__


# ------------------------------------------------------------------ Azure long fields
def test_azure_long_token_count_and_long_field_are_trace_errors(tmp_path):
    """A token count of more than 4,300 digits (past int()'s limit) and a quoted extra column
    past 131,072 characters are TraceErrors naming the line and field, also with on_error=skip;
    leading zeros do not count as digits of the value."""
    az = tmp_path / "az.csv"
    good = "2023-11-16 18:15:46.6805900,374,44\n"
    az.write_text(AZ_HEAD + good + "2023-11-16 18:15:47.0,1" + "0" * 5000 + ",44\n" + good)
    with pytest.raises(TraceError, match=r"az\.csv line 3, field 'ContextTokens': found "
                                         r"100000000000\.\.\. \(5,001 digits\), expected an integer "
                                         r"that fits 64 bits"):
        _load(format="azure", path=str(az))
    w = _load(format="azure", path=str(az), on_error="skip")
    assert len(w) == 2 and w.skipped["count"] == 1
    # leading zeros are not digits of the value
    az.write_text(AZ_HEAD + "2023-11-16 18:15:47.0," + "0" * 5000 + "7,44\n")
    assert _load(format="azure", path=str(az)).input_tokens.tolist() == [7]

    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,Note\n"
                  + good.strip() + ',"' + "x" * BIG_FIELD + '"\n' + good.strip() + ",ok\n")
    with pytest.raises(TraceError, match=r"az\.csv line 2, field 'Note': field too long, found "
                                         r"131,082 characters, expected at most 131,072"):
        _load(format="azure", path=str(az))
    w = _load(format="azure", path=str(az), on_error="skip")
    assert len(w) == 1 and w.skipped["count"] == 1


# ------------------------------------------------------------------ Azure header and timestamps
def test_azure_repeated_header_column_is_an_error(tmp_path):
    """A header naming a column twice is an error naming the column and the header."""
    az = tmp_path / "az.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,ContextTokens\n"
                  "2023-11-16 18:15:46.6805900,374,44,999\n")
    with pytest.raises(TraceError, match=r"az\.csv line 1, field 'ContextTokens': repeated header "
                                         r"column, found header \["):
        _load(format="azure", path=str(az))


@pytest.mark.parametrize("ts", ["2023-11-16 18:15:46.\u0661\u0662", "\u0662023-11-16 18:15:46.1",
                                "2023-11-16 18:15:46.", "2023-11-16 18:15:46.12345678",
                                "2023-1-16 18:15:46.1", "2023-11-16 18:15:46.1 ", "2023-11-16T18:15:46"])
def test_azure_timestamp_is_strict_ascii(tmp_path, ts):
    """TIMESTAMP is 'YYYY-MM-DD HH:MM:SS[.fffffff]' in ASCII digits with 1-7 fraction digits:
    non-ASCII digits, an empty fraction, one-digit fields and a 'T' separator are errors;
    surrounding blanks are allowed."""
    az = tmp_path / "az.csv"
    az.write_text(AZ_HEAD + f"{ts},374,44\n")
    if ts.endswith(" "):  # surrounding blanks are allowed
        assert len(_load(format="azure", path=str(az))) == 1
        return
    with pytest.raises(TraceError, match=re.escape(
            f"az.csv line 2, field 'TIMESTAMP': found {ts!r}, expected 'YYYY-MM-DD "
            f"HH:MM:SS[.fffffff]' (ASCII digits, 1-7 fraction digits)")):
        _load(format="azure", path=str(az))


def test_azure_timestamp_fraction_digits_still_load(tmp_path):
    az = tmp_path / "az.csv"
    az.write_text(AZ_HEAD + "2023-11-16 18:15:46,1,1\n2023-11-16 18:15:46.5,1,1\n"
                  "2023-11-16 18:15:46.5000001,1,1\n")
    assert _load(format="azure", path=str(az)).arrival_s.tolist() == [0.0, 0.5, 0.5000001]


# ------------------------------------------------------------------ Mooncake element type
def test_mooncake_float_hash_id_is_named_as_a_float(tmp_path):
    """A hash_ids element that is not an integer is named with its type (1.0 (float),
    True (bool), '1' (str))."""
    p = tmp_path / "m.jsonl"
    for elem, found in ((1.0, "1.0 (float)"), (True, "True (bool)"), ("1", "'1' (str)")):
        p.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 4,
                                 "hash_ids": [0, elem]}) + "\n")
        with pytest.raises(TraceError, match=re.escape(
                f"m.jsonl line 1, field 'hash_ids': found element {found}, expected non-negative "
                "integers below 2**63")):
            _load(path=str(p))


def test_mooncake_repeated_key_is_an_error(tmp_path):
    """A row naming a field twice is an error naming the line and the field (a JSON parser
    would keep the last value and read a corrupted row as another request); fields the loader
    does not read are not checked."""
    p = tmp_path / "m.jsonl"
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [0]}\n'
                 '{"timestamp": 5, "input_length": 10, "output_length": 4, "hash_ids": [1], '
                 '"output_length": 9000}\n')
    with pytest.raises(TraceError, match=re.escape(
            "m.jsonl line 2, field 'output_length': repeated key, found it twice or more, "
            "expected each field once per row")):
        _load(path=str(p))
    p.write_text('{"timestamp": 0, "input_length": 10, "output_length": 4, "hash_ids": [0], '
                 '"note": "x"}\n')  # (other fields are not checked)
    assert _load(path=str(p)).output_tokens.tolist() == [4]


# ------------------------------------------------------------------ Synthetic first turn
def test_synthetic_cap_below_the_shared_prefix_is_an_error():
    """A max_context_tokens at or below the shared prefix (12,000 tokens for synthetic_agentic)
    leaves no room for a first prompt: an error naming the key and the prefix."""
    with pytest.raises(TraceError, match=r"field 'trace.max_context_tokens': found 1000, expected > "
                                         r"shared_prefix_tokens=12000"):
        load_workload(TraceConfig(name="synthetic_agentic", format="synthetic_agentic",
                                  num_sessions=3, max_context_tokens=1000), 0)


def test_synthetic_first_prompt_obeys_max_context_tokens():
    """No prompt, the first included, exceeds max_context_tokens."""
    cap = 12_600  # 600 tokens for a first input of mean 2,000
    w = load_workload(TraceConfig(name="synthetic_agentic", format="synthetic_agentic",
                                  num_sessions=40, max_context_tokens=cap), 0)
    first = w.input_tokens[w.table.column("turn").to_numpy() == 0]
    assert first.size == 40 and first.max() <= cap and first.min() > 12_000
    assert w.input_tokens.max() <= cap


def test_synthetic_first_input_is_the_truncated_lognormal():
    """A draw within the cap is the plain lognormal draw (workloads that never reach the cap are
    unchanged); above it, a draw from the lognormal truncated at the cap."""
    from traces.synthetic import _first_input, _lognormal

    a, b = np.random.default_rng(3), np.random.default_rng(3)
    assert [_first_input(a, 2000.0, 0.8, 10**9) for _ in range(200)] == \
        [int(_lognormal(b, 2000.0, 0.8, 1)[0]) for _ in range(200)]
    rng = np.random.default_rng(5)
    x = np.array([_first_input(rng, 2000.0, 0.8, 1000) for _ in range(20_000)])
    assert x.max() <= 1000 and x.min() >= 1
    mu, s = math.log(2000.0) - 0.32, 0.8
    cdf = lambda v: 0.5 * math.erfc(-(math.log(v) - mu) / (s * math.sqrt(2)))  # noqa: E731
    for v in (200, 500, 800):  # P(x <= v | x <= 1000) of the rounded lognormal
        assert abs((x <= v).mean() - cdf(v + 0.5) / cdf(1000.5)) < 0.015


def test_synthetic_defaults_never_reach_the_first_turn_cap():
    """The default configs' prompts stay within max_context_tokens, so the cap never changes
    their workloads."""
    for fmt in ("synthetic_agentic", "synthetic_reasoning", "synthetic_multiturn"):
        w = load_workload(TraceConfig(name=fmt, format=fmt), 0)
        cap = w.notes["params"]["max_context_tokens"]
        assert w.input_tokens.max() <= cap


# ------------------------------------------------------------------ Weka clock range
def test_weka_t_past_the_clock_range_names_line_session_request_and_t(tmp_path):
    """A request t past the simulated clock's range (2**32 s), or a sub-agent request's t
    before its sub-agent's start, is an error naming the line, session, request and 't'."""
    p = _weka(tmp_path, {"id": "s1", "requests": [_req(0), _req(1e300, think_time=1.0)]})
    with pytest.raises(TraceError, match=re.escape(
            "w.jsonl line 1 (session 's1', request 1), field 't': found 1e+300, expected a number "
            "in [0, 2**32] s")):
        _load(format="weka", path=str(p))
    sub = {"type": "subagent", "t": 4e9, "duration_ms": 0, "requests": [_req(0), _req(5e8)]}
    p = _weka(tmp_path, {"id": "s1", "requests": [_req(0), sub]})
    with pytest.raises(TraceError, match=re.escape(
            "w.jsonl line 1 (session 's1', request 1, sub-agent request 1), field 't': found 5e+08 "
            "after the sub-agent's start 4e+09 s")):
        _load(format="weka", path=str(p))


def test_weka_far_session_start_names_line_session_request_and_t(tmp_path):
    """A session start past the clock's range (session_interval_s=5e9) is an error naming the
    request, 't' and the session_arrival settings. Sessions the slicing drops (start_s,
    duration_s, max_requests) are not errors."""
    p = _weka(tmp_path, {"id": "s1", "requests": [_req(0)]},
              {"id": "s2", "requests": [_req(0, (3, 4)), _req(2, (3, 4), think_time=1.0)]})
    kw = dict(format="weka", path=str(p), session_arrival="recorded", session_interval_s=5e9)
    with pytest.raises(TraceError, match=re.escape(
            "w.jsonl line 2 (session 's2', request 0), field 't': arrival past the simulated "
            "clock's range, found session start 5e+09 s (session_arrival=recorded, "
            "session_interval_s=5e+09) + t 0 s = 5e+09 s")):
        _load(**kw)
    assert len(_load(**kw, start_s=5e9)) == 2
    assert len(_load(**kw, duration_s=10.0)) == 1
    assert len(_load(**kw, max_requests=1)) == 1
