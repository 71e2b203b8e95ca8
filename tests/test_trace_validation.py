"""Trace validation: every loader turns a malformed input into a TraceError naming the file, the
line (window, session, request) and the field, with what was found and what was expected, and
``trace.on_error=skip`` skips and counts such rows instead; nothing malformed is read silently
or dropped. Synthetic generators' parameters: tests/test_synthetic_params.py."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from conftest import BAD
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
    import traces.formats.servegen as sg
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


# ------------------------------------------------------------------ every format: file, line and field
TRACE_CASES = [
    (dict(path=str(BAD / "mooncake_many_bad.jsonl")),
     r"mooncake_many_bad\.jsonl line 2, field 'hash_ids': found element -2, expected non-negative integers"),
    (dict(path=str(BAD / "mooncake_truncated.jsonl.gz")),
     r"mooncake_truncated\.jsonl\.gz after line \d+: unreadable gzip stream, found EOFError"),
    (dict(path=str(BAD / "blank.jsonl")), r"blank\.jsonl: empty file, found no non-blank lines"),
    (dict(format="azure", path=str(BAD / "azure_text.csv")),
     r"azure_text\.csv line 3, field 'ContextTokens': found 'abc', expected an integer"),
]


@pytest.mark.parametrize("kw,pattern", TRACE_CASES, ids=[Path(c[0]["path"]).name for c in TRACE_CASES])
def test_trace_errors_name_file_line_field(kw, pattern):
    with pytest.raises(TraceError, match=pattern):
        load_workload(TraceConfig(name="x", **kw), 0)


def test_trace_skip_keeps_count_and_examples():
    w = load_workload(TraceConfig(name="x", path=str(BAD / "mooncake_many_bad.jsonl"), on_error="skip"), 0)
    assert len(w) == 2 and w.skipped["count"] == 5
    ex = w.skipped["examples"]
    assert "line 3, field 'output_length': found -1, expected >= 0" in ex[1]
    assert "line 4, field 'hash_ids': found '7', expected a list" in ex[2]
    assert "line 5: found list, expected a JSON object" in ex[3]
    assert "line 6, field 'timestamp': found -5, expected >= 0" in ex[4]


def test_blank_and_extra_rows_are_not_dropped_silently(tmp_path):
    """A blank line before a row is a bad row (an error naming the line, or skipped and counted
    with on_error=skip), never a silently lost request; blank lines at the end of the file are
    not rows; an Azure row must have exactly the header's fields."""
    rows = [json.dumps({"timestamp": i * 10, "input_length": 600, "output_length": 4,
                        "hash_ids": [i, 100 + i]}) for i in range(4)]
    mid = tmp_path / "mid.jsonl"
    mid.write_text("\n".join(rows[:2]) + "\n\n" + "\n".join(rows[2:]) + "\n")
    # (the message names the blank line, not the JSON parser's words)
    with pytest.raises(TraceError, match=r"mid\.jsonl line 3: invalid JSON, found a blank line, "
                                         r"expected one JSON object per line"):
        load_workload(TraceConfig(name="x", path=str(mid)), 0)
    w = load_workload(TraceConfig(name="x", path=str(mid), on_error="skip"), 0)
    assert len(w) == 4 and w.skipped["count"] == 1 and "line 3" in w.skipped["examples"][0]
    trail = tmp_path / "trail.jsonl"
    trail.write_text("\n".join(rows) + "\n\n  \n")
    assert len(load_workload(TraceConfig(name="x", path=str(trail)), 0)) == 4
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    row = "2023-11-16 18:15:46.6805900,374,44\n"
    for text, pattern in [(head + row + "\n" + row, r"line 3: found 0 fields \(a blank line\), expected 3"),
                          ("\n" + head + row, r"line 1: blank line, found a blank line, expected the header"),
                          (head + row + row.strip() + ",7\n", r"line 3: found 4 fields, expected 3")]:
        az = tmp_path / "az.csv"
        az.write_text(text)
        with pytest.raises(TraceError, match=pattern):
            load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)


def test_binary_file_is_named_as_not_a_text_file(tmp_path):
    """A binary file given as a text trace (a Parquet table, gzip-compressed binary data) is
    one error naming the file, the first byte no text file holds and the format's kind of file,
    in every text format; a text file in another encoding still loads up to its line's UTF-8
    error."""
    import gzip

    import pandas as pd

    pq_file = tmp_path / "t.parquet"
    pd.DataFrame({"timestamp": [0, 1], "input_length": [10, 20]}).to_parquet(pq_file)
    for fmt, kind in (("mooncake", "JSONL"), ("weka", "JSONL"), ("azure", "CSV")):
        with pytest.raises(TraceError, match=re.escape(
                f"t.parquet: not a {kind} text file, found binary content at byte 4 (byte 0x") +
                r"[0-9a-f]{2}, after 'PAR1': a Parquet file\)"):
            load_workload(TraceConfig(name="x", format=fmt, path=str(pq_file)), 0)
    gz = tmp_path / "b.jsonl.gz"
    gz.write_bytes(gzip.compress(b'{"timestamp": 0\x00}\n'))
    with pytest.raises(TraceError, match=re.escape(
            "b.jsonl.gz: not a JSONL text file, found binary content at byte 15 (byte 0x00)")):
        _load(path=str(gz))
    latin = tmp_path / "l.jsonl"
    latin.write_bytes(b'{"timestamp": 0, "input_length": 10, "output_length": 4, '
                      b'"hash_ids": [0], "note": "caf\xe9"}\n')
    with pytest.raises(TraceError, match=r"l\.jsonl line 1.*UTF-8"):
        _load(path=str(latin))


def test_binary_content_past_the_first_4_kib_names_its_line(tmp_path):
    """Binary content after text (a NUL or other control byte on a line past the first 4 KiB,
    plain or compressed) is one error naming the file, the line, the byte and its column, in
    every text format, also with ``trace.on_error=skip`` (not a row to skip); a byte that is not
    UTF-8 on such a line names the line, the byte and its column too; a NUL in a ServeGen
    dataset file names its line."""
    import gzip

    rows = [json.dumps({"timestamp": i, "input_length": 600, "output_length": 4,
                        "hash_ids": [2 * i, 2 * i + 1]}).encode() for i in range(80)]
    assert sum(len(r) + 1 for r in rows[:60]) > 4096
    nul = rows[:60] + [rows[60].replace(b"600", b"6\x000")] + rows[61:]
    plain = tmp_path / "nul.jsonl"
    plain.write_bytes(b"\n".join(nul) + b"\n")
    gz = tmp_path / "nul.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    for f in (plain, gz):
        for on_error in ("fail", "skip"):
            with pytest.raises(TraceError, match=re.escape(
                    f"{f.name} line 61: not a JSONL text file, found binary content: byte 0x00 "
                    f"at column {rows[60].index(b'600') + 2}, expected a JSONL text file")):
                _load(path=str(f), on_error=on_error)
    sessions = [{"id": f"s{i}", "requests": [_req(float(i), ids=(2 * i, 2 * i + 1))]}
                for i in range(60)]
    weka = _weka(tmp_path, *sessions)
    lines = weka.read_bytes().splitlines()
    assert sum(len(x) + 1 for x in lines[:50]) > 4096
    lines[50] = lines[50].replace(b'"s50"', b'"s\x0150"')
    weka.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TraceError, match=r"w\.jsonl line 51: not a JSONL text file, found binary "
                                         r"content: byte 0x01 at column \d+"):
        _load(format="weka", path=str(weka))
    bad_utf8 = rows[:60] + [rows[60][:-1] + b', "note": "caf\xe9"}'] + rows[61:]
    plain.write_bytes(b"\n".join(bad_utf8) + b"\n")
    col = bad_utf8[60].index(b"\xe9") + 1
    with pytest.raises(TraceError, match=re.escape(
            f"nul.jsonl line 61: invalid JSON, found byte 0xe9 at column {col}, not UTF-8")):
        _load(path=str(plain))
    az = tmp_path / "az.csv"
    az_rows = [f"2023-11-16 18:15:{i // 10:02d}.{i % 10}000000,374,44" for i in range(200)]
    az_rows[150] = az_rows[150].replace(",374,", ",3\x0074,")
    az.write_bytes((AZ_HEAD + "\n".join(az_rows) + "\n").encode())
    with pytest.raises(TraceError, match=re.escape(
            "az.csv line 152: not a CSV text file, found binary content: byte 0x00 at column 30")):
        _load(format="azure", path=str(az), on_error="skip")
    d = _servegen(tmp_path)
    ds = sorted(d.glob("chunk-*-dataset.json"))[0]
    text = ds.read_bytes()
    at = text.index(b'"input_tokens"')
    ds.write_bytes(text[:at] + b"\x00" + text[at:])
    with pytest.raises(TraceError, match=re.escape(
            f"{ds.name} line 1: not a JSON text file, found binary content: byte 0x00 at "
            f"column {at + 1}")):
        _sg(d)


def test_line_endings(tmp_path):
    """CRLF rows load as LF rows; a file with CR-only line endings (one long line) is an error
    naming the line and the CR byte, in every format, instead of a bare JSON or field-count
    message."""
    rows = [json.dumps({"timestamp": i * 10, "input_length": 600, "output_length": 4,
                        "hash_ids": [i, 100 + i]}) for i in range(3)]
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(("\r\n".join(rows) + "\r\n").encode())
    assert len(load_workload(TraceConfig(name="x", path=str(crlf)), 0)) == 3
    cr = tmp_path / "cr.jsonl"
    cr.write_bytes(("\r".join(rows) + "\r").encode())
    for fmt in ("mooncake", "weka"):
        with pytest.raises(TraceError, match=r"cr\.jsonl line 1: carriage return inside a line"):
            load_workload(TraceConfig(name="x", format=fmt, path=str(cr)), 0)
    az = tmp_path / "az.csv"
    az.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\r2023-11-16 18:15:46.6805900,374,44\r")
    with pytest.raises(TraceError, match=r"az\.csv line 1: carriage return inside a line"):
        load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)


def test_relative_trace_path_is_recorded_absolute(tmp_path, monkeypatch):
    """A relative trace.path is recorded in the workload's source (summary.json's trace_source)
    as the absolute path it pointed at from the working folder."""
    row = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]})
    (tmp_path / "small.jsonl").write_text(row + "\n")
    monkeypatch.chdir(tmp_path)
    w = load_workload(TraceConfig(name="x", path="small.jsonl"), 0)
    assert w.source == str(tmp_path / "small.jsonl")


def test_integers_past_64_bits_are_named(tmp_path):
    """A hash id or token count of 2**63 or more is a TraceError naming the field and the value as
    written (a whole float as a float)."""
    big = 2**63 + 5
    cases = [({"input_length": 600, "hash_ids": [1, big]}, f"'hash_ids': found element {big}"),
             ({"input_length": 600, "hash_ids": [1, 2**70]}, f"'hash_ids': found element {2**70}"),
             ({"input_length": big, "hash_ids": [1]}, f"'input_length': found {big}, expected an integer that fits 64 bits"),
             # a whole float too large is shown as written, not as its integer value
             ({"input_length": 1e30, "hash_ids": [1]}, "'input_length': found 1e+30 (float), expected an integer that fits 64 bits")]
    for fields, msg in cases:
        p = tmp_path / "b.jsonl"
        p.write_text(json.dumps({"timestamp": 0, "output_length": 4, **fields}) + "\n")
        with pytest.raises(TraceError, match=re.escape(msg)):
            load_workload(TraceConfig(name="x", path=str(p)), 0)
    az = tmp_path / "az.csv"
    az.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,{big},44\n")
    with pytest.raises(TraceError, match=re.escape(f"line 2, field 'ContextTokens': found {big}")):
        load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)


def test_trace_count_warnings_say_they_count_the_whole_file_when_sliced(tmp_path):
    """The parser counts before slicing (its result is cached for every slice), so its count
    warnings say they count the whole file when the slice keeps fewer requests; a generated
    trace's say they count the whole generated trace."""
    reqs = [{"t": float(i), "type": "n", "in": 200, "out": 0 if i % 2 else 5,
             "hash_ids": [1, 2, 3]} for i in range(6)]
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps({"id": f"s{k}", "requests": reqs}) + "\n" for k in range(2)))
    whole = load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)
    assert "6 requests had out = 0; loaded as 1 (zero_output=as_one)" in whole.warnings
    part = load_workload(TraceConfig(name="x", format="weka", path=str(p), max_requests=4), 0)
    assert len(part) == 4
    assert ("in the whole file (12 requests; the slice keeps 4): 6 requests had out = 0; "
            "loaded as 1 (zero_output=as_one)") in part.warnings, part.warnings
    # a generated trace is no file: its counts are of the whole generated trace
    syn = load_workload(TraceConfig(name="x", format="synthetic_multiturn", num_sessions=40,
                                    max_context_tokens=3000, max_requests=5), 0)
    assert len(syn.warnings) == 1 and syn.warnings[0].startswith(
        "in the whole generated trace ("), syn.warnings


def test_ids_not_prefix_chained_are_an_error(tmp_path):
    """Mooncake ids must be prefix-chained (block keys trust them to be): an id that follows a
    different id than at its first occurrence is an error naming both lines, also with
    on_error=skip; a shared prefix and a repeated prompt still load."""
    def write(rows):
        p = tmp_path / "c.jsonl"
        p.write_text("".join(json.dumps({"timestamp": i, "input_length": 512 * len(h), "output_length": 5,
                                         "hash_ids": h}) + "\n" for i, h in enumerate(rows)))
        return TraceConfig(name="x", path=str(p))
    assert len(load_workload(write([[0, 1, 2], [0, 1, 3], [0, 1, 2], [4]]), 0)) == 4
    for rows, msg in [([[0, 1, 2], [2, 3]], "line 2, field 'hash_ids': ids not prefix-chained, found id 2 "
                                              "starts the prompt (position 0); at line 1 it follows id 1"),
                      ([[0, 1], [5, 6], [5, 1]], "line 3, field 'hash_ids': ids not prefix-chained, found id 1 "
                                                 "follows id 5 (position 1); at line 1 it follows id 0")]:
        with pytest.raises(TraceError, match=re.escape(msg)):
            load_workload(write(rows), 0)
        with pytest.raises(TraceError, match="not prefix-chained"):
            load_workload(TraceConfig(name="x", path=str(tmp_path / "c.jsonl"), on_error="skip"), 0)


def test_timestamps_past_the_clock_range_name_the_line(tmp_path):
    """A timestamp past 2**32 s (where the float clock loses its digits) is an error naming its
    line."""
    rows = [{"timestamp": t, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}
            for t in (0, 10, 1e308)]
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TraceError, match=r"t\.jsonl line 3, field 'timestamp': found 1e\+308 ms"):
        load_workload(TraceConfig(name="x", path=str(p)), 0)


def test_bom_strict_azure_integers_and_null(tmp_path):
    """A leading UTF-8 byte-order mark (a spreadsheet export) is skipped; Azure token counts are
    ASCII digits ('1_000' and Arabic-Indic digits are errors); a JSON null is named as null."""
    az = tmp_path / "az.csv"
    az.write_bytes(b"\xef\xbb\xbfTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    assert len(load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)) == 1
    for bad in ("1_000", "\u0665\u0660\u0660"):
        az.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,{bad},44\n")
        with pytest.raises(TraceError, match=r"line 2, field 'ContextTokens': found .*expected an integer"):
            load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)
    p = tmp_path / "m.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"timestamp": 0, "input_length": 600, "output_length": 4,
                                                 "hash_ids": [1, 2]}).encode() + b"\n")
    assert len(load_workload(TraceConfig(name="x", path=str(p)), 0)) == 1
    p.write_text(json.dumps({"timestamp": 0, "input_length": None, "output_length": 4, "hash_ids": [1]}) + "\n")
    with pytest.raises(TraceError, match=r"field 'input_length': found null, expected an integer"):
        load_workload(TraceConfig(name="x", path=str(p)), 0)


def test_azure_rows_past_the_clock_range_name_their_line(tmp_path):
    """An Azure row past the clock's range from the earliest row is an error naming its file line
    and the earliest row's, also when the rows are sorted by TIMESTAMP first."""
    az = tmp_path / "az.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,5\n"
                  "9999-11-16 18:17:04.0,10,5\n2023-11-16 18:17:04.0,10,5\n")
    with pytest.raises(TraceError, match=r"az\.csv line 3, field 'TIMESTAMP': arrival past the "
                                         r"simulated clock's range, found 2\.51698e\+11 s after the "
                                         r"earliest row \(line 2\)"):
        load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,5\n"
                  "2023-11-16 18:17:04.0,10,5\n1850-11-16 18:17:04.0,10,5\n")
    with pytest.raises(TraceError, match=r"az\.csv line 2, field 'TIMESTAMP'.*after the earliest row \(line 4\)"):
        load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)


def test_weka_unknown_request_type_is_a_warning(tmp_path):
    """A Weka request type other than the trace's ('n', 's', 'subagent') is loaded as a
    main-chain request with a warning naming it, its count and its first line."""
    reqs = [{"t": float(i), "type": typ, "in": 200, "out": 5, "hash_ids": [1, 2, 3][: 200 // 64]}
            for i, typ in enumerate(["n", "zzz", "s", "zzz"])]
    p = tmp_path / "w.jsonl"
    p.write_text(json.dumps({"id": "s1", "requests": reqs}) + "\n")
    w = load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)
    assert len(w) == 4
    assert any("2 requests have type 'zzz'" in x and "line 1" in x for x in w.warnings), w.warnings
    # inside a sub-agent too
    sub = {"t": 5.0, "type": "subagent", "requests": [
        {"t": 0.0, "type": "weird", "in": 200, "out": 5, "hash_ids": [1, 2, 3]}]}
    p.write_text(json.dumps({"id": "s1", "requests": reqs[:1] + [sub]}) + "\n")
    w = load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)
    assert any("1 request has type 'weird'" in x and "sub-agent request 0" in x
               for x in w.warnings), w.warnings


def test_weka_ids_not_prefix_chained_are_an_error_naming_both_requests(tmp_path):
    """Weka ids must be prefix-chained (block keys trust them to be): a session whose id follows
    different ids in two requests is an error naming the session's line, both requests and
    positions; with on_error=skip the session is skipped. Requests without ids (in < 64) and
    sub-agent requests take part."""
    def write(*sessions):
        p = tmp_path / "w.jsonl"
        p.write_text("".join(json.dumps({"id": f"s{k}", "requests": [
            {"t": float(i), "type": "n", "in": 64 * len(h) + 10, "out": 5, "hash_ids": h}
            for i, h in enumerate(hs)]}) + "\n" for k, hs in enumerate(sessions)))
        return TraceConfig(name="x", format="weka", path=str(p))
    ok = write([[1, 2], [], [1, 2, 3], [1, 2, 4]], [[1, 5], [1, 5, 6]])
    assert len(load_workload(ok, 0)) == 6
    bad = write([[1, 2]], [[1, 2, 3], [], [1, 7], [1, 2, 7]])
    with pytest.raises(TraceError, match=re.escape(
            "line 2 (session 's1', request 3), field 'hash_ids': ids not prefix-chained, found id 7 "
            "follows id 2 (position 2); in line 2 (session 's1', request 2) it follows id 1 "
            "(position 1)")):
        load_workload(bad, 0)
    skip = TraceConfig(name="x", format="weka", path=bad.path, on_error="skip")
    assert len(load_workload(skip, 0)) == 1
    with pytest.raises(TraceError, match=re.escape("request 1), field 'hash_ids': ids not prefix-chained, "
                                                   "found id 2 starts the request's ids (position 0); "
                                                   "in line 1 (session 's0', request 0) it follows id 1")):
        load_workload(write([[1, 2], [2, 3]]), 0)
    sub = {"t": 5.0, "type": "subagent", "requests": [
        {"t": 0.0, "type": "n", "in": 200, "out": 5, "hash_ids": [9, 1, 2]}]}
    p = tmp_path / "w.jsonl"
    p.write_text(json.dumps({"id": "s1", "requests": [
        {"t": 0.0, "type": "n", "in": 200, "out": 5, "hash_ids": [1, 2, 3]}, sub]}) + "\n")
    with pytest.raises(TraceError, match=r"sub-agent request 0\), field 'hash_ids': ids not prefix-chained, "
                                         r"found id 1 follows id 9 \(position 1\)"):
        load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)


def test_weka_blank_line_and_truncated_xz_are_named_plainly(tmp_path):
    """A Weka file's blank line is an error naming the line; an .xz file cut before its first line
    is named as such; a .xz or .gz name on other content (plain text, the other compression) is
    named with what it holds."""
    import lzma

    s = {"id": "a", "requests": [{"t": 0.0, "type": "n", "in": 64, "out": 4, "hash_ids": [1]}]}
    s2 = dict(s, id="b")
    p = tmp_path / "w.jsonl"
    p.write_text(json.dumps(s) + "\n\n" + json.dumps(s2) + "\n")
    with pytest.raises(TraceError, match=r"w\.jsonl line 2: invalid JSON, found a blank line"):
        load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)
    xz = tmp_path / "cut.jsonl.xz"
    xz.write_bytes(lzma.compress(((json.dumps(s) + "\n") * 200).encode())[:40])
    with pytest.raises(TraceError, match=r"cut\.jsonl\.xz before its first line: unreadable xz stream"):
        load_workload(TraceConfig(name="x", path=str(xz)), 0)
    # a .xz or .gz name on other content is named with what it holds
    xz.write_text(json.dumps(s) + "\n")
    with pytest.raises(TraceError, match=r"cut\.jsonl\.xz: not an xz stream, found first bytes "
                                         r".* \(uncompressed data\?\), expected xz-compressed"):
        load_workload(TraceConfig(name="x", format="weka", path=str(xz)), 0)
    gz = tmp_path / "w.jsonl.gz"
    gz.write_bytes(lzma.compress((json.dumps(s) + "\n").encode()))
    with pytest.raises(TraceError, match=r"w\.jsonl\.gz: not a gzip stream, .*\(an xz stream\)"):
        load_workload(TraceConfig(name="x", format="weka", path=str(gz)), 0)


def test_weka_session_fields_and_azure_dates_are_named(tmp_path):
    """A Weka session id that is not a string and system_tokens or tool_tokens that are not
    integers are errors naming the field and the value; an Azure TIMESTAMP of the right form
    that names no date (2023-02-30) is an error saying it needs a real date and time."""
    req = [{"t": 0.0, "type": "n", "in": 64, "out": 4, "hash_ids": [1]}]
    p = tmp_path / "w.jsonl"
    for bad, field, found in (({"id": [1]}, "id", "[1]"), ({"id": None}, "id", "null"),
                              ({"id": "a", "system_tokens": False}, "system_tokens/tool_tokens",
                               "False/0"),
                              ({"id": "a", "tool_tokens": ""}, "system_tokens/tool_tokens", "0/''")):
        p.write_text(json.dumps(dict(bad, requests=req)) + "\n")
        with pytest.raises(TraceError, match=re.escape(f"w.jsonl line 1, field '{field}': found {found}")):
            load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)
    a = tmp_path / "a.csv"
    for ts in ("2023-02-30 00:00:00", "2023-11-16 18:17:60.5"):
        a.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n{ts},  100 ,5\n")
        with pytest.raises(TraceError, match=r"a\.csv line 2, field 'TIMESTAMP': found .*expected "
                                             r"a real date and time"):
            load_workload(TraceConfig(name="x", format="azure", path=str(a)), 0)
    a.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-02-28 00:00:00,  100 ,5\n")
    assert load_workload(TraceConfig(name="x", format="azure", path=str(a)), 0).input_tokens[0] == 100
