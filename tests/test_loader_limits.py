"""Limits of the ServeGen and Weka loaders: rows and ids that could hang the loader, exhaust memory,
or be read silently as something else are TraceErrors naming the file line (and field), and
sparse Weka ids take memory proportional to the data, not to the largest id.

A ServeGen load that could hang (or allocate without bound) runs in a fresh interpreter with a
time limit and an address-space cap, so that a regression fails the test instead of the run."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from traces import TraceConfig, TraceError, load_workload

WEKA_TINY = Path(__file__).resolve().parent / "data" / "traces" / "weka_tiny.jsonl"

# A fresh interpreter: address space capped at its size after the imports + 1 GiB, then one
# load per config of argv[1] (the ServeGen module's constants patched from argv[2]; argv[3] ==
# "zero": every inter-arrival draw is 0, as from a degenerate distribution).
_ISOLATED = r"""
import json, resource, sys
import numpy as np
from traces import TraceConfig, load_workload
import traces.formats.servegen as sg

def vm(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

cap, hard = vm("VmSize:") + (1 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
for name, value in json.loads(sys.argv[2]).items():
    setattr(sg, name, value)
if sys.argv[3] == "zero":
    sg._iat = lambda g, pat, k, theta, rate, mode, size: np.zeros(size)
out = []
for cfg in json.loads(sys.argv[1]):
    try:
        w = load_workload(TraceConfig(**cfg), 0)
        out.append({"ok": True, "n": len(w), "arrival_max": float(w.arrival_s.max())})
    except Exception as e:
        out.append({"ok": False, "type": type(e).__name__, "msg": str(e)})
print(json.dumps(out))
"""


def _isolated(cfgs: list[dict], patch: dict | None = None, zero: bool = False,
              timeout: float = 60.0) -> list[dict]:
    try:
        r = subprocess.run([sys.executable, "-c", _ISOLATED, json.dumps(cfgs), json.dumps(patch or {}),
                            "zero" if zero else "-"], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the load did not finish within {timeout:g} s (the draw loop runs on)")
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


_PMFS = {"input_tokens": "{10: 0.5, 20: 0.5}", "output_tokens": "{5: 1.0}",
         "reason_ratio": "{0.5: 1.0}"}


def _servegen_dir(tmp_path, *rows: str, name: str = "sg"):
    """A one-client ServeGen folder: line 1 an idle window at 0, then ``rows``."""
    d = tmp_path / name
    d.mkdir()
    (d / "chunk-0-trace.csv").write_text("".join(r + "\n" for r in ("0,0,0,,0,0",) + rows))
    (d / "chunk-0-dataset.json").write_text(json.dumps({"0": _PMFS}))
    return d


def _sg_cfg(d, **kw) -> dict:
    return {"name": "s", "format": "servegen", "path": str(d), "num_requests": 100, **kw}


# ---------------------------------------------------------------- ServeGen: row limits
@pytest.mark.parametrize("row, mode, field, found, expected", [
    # shape 1e-300: every Gamma draw underflows to 0 (the loop never left the window)
    ("600,0.085,6.69,Gamma,1e-300,73.0", "rate", "shape", "1e-300 (inter-arrival cv 1e+150)",
     "an inter-arrival cv (std/mean) <= 1000: Gamma shape >= 1e-06"),
    ("600,0.085,6.69,Gamma,1e-300,73.0", "fit", "shape", "1e-300 (inter-arrival cv 1e+150)",
     "an inter-arrival cv (std/mean) <= 1000: Gamma shape >= 1e-06"),
    # Weibull: Gamma(1 + 1/shape) overflowed (rate: OverflowError; fit: loaded)
    ("600,0.085,6.69,Weibull,1e-300,73.0", "rate", "shape", "1e-300 (inter-arrival cv inf)",
     "an inter-arrival cv (std/mean) <= 1000: Weibull shape >= 0.08881"),
    ("600,0.085,6.69,Weibull,1e-300,73.0", "fit", "shape", "1e-300 (inter-arrival cv inf)",
     "an inter-arrival cv (std/mean) <= 1000: Weibull shape >= 0.08881"),
    # scale 1e-300: mean gap 2e-302 s (fit: hang; rate: the fit's scale went unchecked)
    ("600,0.085,6.69,Gamma,0.022,1e-300", "fit", "scale",
     "1e-300 (mean inter-arrival shape x scale = 2.2e-302 s)",
     "a finite mean inter-arrival >= 0.0006 s (at most 1,000,000 arrivals per 600 s window)"),
    ("600,0.085,6.69,Gamma,0.022,1e-300", "rate", "scale",
     "1e-300 (mean inter-arrival shape x scale = 2.2e-302 s)",
     "a finite mean inter-arrival >= 0.0006 s (at most 1,000,000 arrivals per 600 s window)"),
    # 1e9 req/s: a buffer of 9e11 draws (numpy's _ArrayMemoryError)
    ("600,1000000000,6.69,Gamma,0.022,73.0", "rate", "rate", "1000000000.0",
     "at most 1,000,000 expected arrivals per 600 s window (rate <= 1666.67 req/s)"),
], ids=["gamma_shape_rate", "gamma_shape_fit", "weibull_shape_rate", "weibull_shape_fit",
        "scale_fit", "scale_rate", "huge_rate"])
def test_servegen_degenerate_row_is_an_error_naming_line_and_field(tmp_path, row, mode, field,
                                                                   found, expected):
    d = _servegen_dir(tmp_path, row)
    (r,) = _isolated([_sg_cfg(d, servegen_iat=mode)])
    assert not r["ok"] and r["type"] == "TraceError", r
    assert r["msg"] == (f"{d / 'chunk-0-trace.csv'} line 2, field '{field}': found {found}, "
                        f"expected {expected}")


def test_servegen_row_limits_are_the_documented_edges(tmp_path):
    """Rows at the limits load; just past them they are errors (they loaded before, unchecked)."""
    rows = {"gamma_shape": ("600,1.0,1.0,Gamma,1e-06,1e6", "600,1.0,1.0,Gamma,9.9e-07,1e6"),
            "weibull_shape": ("600,1.0,1.0,Weibull,0.0889,1.0", "600,1.0,1.0,Weibull,0.0888,1.0"),
            "rate": ("600,1666.66,1.0,Gamma,1.0,0.0006", "600,1666.67,1.0,Gamma,1.0,0.0006"),
            "fit_mean": ("600,1.0,1.0,Gamma,1.0,0.0006", "600,1.0,1.0,Gamma,1.0,0.00059")}
    cfgs = []
    for key, (good, bad) in rows.items():
        cfgs.append(_sg_cfg(_servegen_dir(tmp_path, good, name=f"{key}_ok"), num_requests=50))
        cfgs.append(_sg_cfg(_servegen_dir(tmp_path, bad, name=f"{key}_bad"), num_requests=50))
    res = _isolated(cfgs)
    for (key, _), good, bad in zip(rows.items(), res[0::2], res[1::2]):
        assert good["ok"] and good["n"] == 50, (key, good)
        assert not bad["ok"] and bad["type"] == "TraceError" and "line 2, field" in bad["msg"], \
            (key, bad)


def test_servegen_skip_counts_a_degenerate_row(tmp_path):
    d = _servegen_dir(tmp_path, "600,0.085,6.69,Gamma,1e-300,73.0", "1200,1.0,1.0,Gamma,1.0,1.0")
    (r,) = _isolated([_sg_cfg(d, num_requests=50, on_error="skip")])
    assert r["ok"] and r["n"] == 50 and 1200 <= r["arrival_max"] < 1800, r  # the valid window


def test_servegen_window_start_off_the_600_s_grid_is_an_error(tmp_path):
    """A window start must be a multiple of 600 s (600.0 is): one at 900 s, which would overlap
    the window at 600 s, is an error naming the line and field."""
    bad = _servegen_dir(tmp_path, "900,1.0,1.0,Gamma,1.0,1.0", name="off")
    ok = _servegen_dir(tmp_path, "600.0,1.0,1.0,Gamma,1.0,1.0", name="on")
    r_bad, r_ok = _isolated([_sg_cfg(bad, num_requests=50), _sg_cfg(ok, num_requests=50)])
    assert not r_bad["ok"] and r_bad["msg"] == (
        f"{bad / 'chunk-0-trace.csv'} line 2, field 'window_start_s': found 900, expected a "
        "multiple of 600 s (one row per 600 s window)"), r_bad
    assert r_ok["ok"] and r_ok["n"] == 50, r_ok


# ---------------------------------------------------------------- ServeGen: the draw loop
def test_servegen_draw_loop_stops_at_num_requests_on_zero_draws(tmp_path):
    """Draws that never advance time (a degenerate family past validation): the loop stops with
    the requests wanted instead of running on (patched limit: 1,000 draws)."""
    d = _servegen_dir(tmp_path, "600,1.0,1.0,Gamma,1.0,1.0")
    (r,) = _isolated([_sg_cfg(d, num_requests=50)], {"MAX_WINDOW_ARRIVALS": 1000}, zero=True)
    assert r["ok"] and r["n"] == 50 and r["arrival_max"] == 600.0, r  # all at the window start


def test_servegen_draw_loop_guard_when_draws_pile_up_before_start_s(tmp_path):
    """Zero draws in a window that start_s cuts: none is ever kept, so only the draw guard can
    end the loop: a TraceError naming the line (patched guard: 5,000 draws)."""
    d = _servegen_dir(tmp_path, "600,1.0,1.0,Gamma,1.0,1.0")
    (r,) = _isolated([_sg_cfg(d, num_requests=50, start_s=900.0)],
                     {"MAX_WINDOW_ARRIVALS": 1000, "MAX_WINDOW_DRAWS": 5000}, zero=True)
    assert not r["ok"] and r["type"] == "TraceError", r
    assert r["msg"].startswith(f"{d / 'chunk-0-trace.csv'} line 2, field 'shape/scale': "
                               "inter-arrival draws do not reach the window's end, found 5,400 "
                               "arrivals in [600, 600] s of the 600 s window"), r["msg"]


def test_servegen_start_s_inside_a_window_keeps_the_rest_of_it(tmp_path):
    """A window cut by start_s and drawn in many small buffers (fit mode, mean gap 0.1 s, buffers
    of 16) still yields its arrivals up to its end."""
    d = _servegen_dir(tmp_path, "600,0.01,1.0,Gamma,1.0,0.1")
    w = load_workload(TraceConfig(**_sg_cfg(d, num_requests=100_000, servegen_iat="fit",
                                            start_s=900.0)), 0)
    a = w.arrival_s  # rebased: start_s -> 0
    assert 2500 < len(w) < 3500 and a.min() < 2.0 and 298.0 < a.max() < 300.0


# ---------------------------------------------------------------- Weka: hash_ids elements
def _request(t: float, ids: list) -> dict:
    return {"t": t, "type": "n", "in": 64 * len(ids) + 10, "out": 5, "hash_ids": ids}


def _session(sid: str, *id_lists: list) -> dict:
    return {"id": sid, "block_size": 64, "hash_id_scope": "local",
            "requests": [_request(float(i), ids) for i, ids in enumerate(id_lists)]}


def _weka_file(tmp_path, *sessions: dict, name: str = "w.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(s) + "\n" for s in sessions))
    return p


def _weka(path, **kw):
    return load_workload(TraceConfig(name="x", format="weka", path=str(path),
                                     session_arrival="recorded", **kw), 0)


@pytest.mark.parametrize("ids, j, found", [
    ([7, 100000.5, 9], 1, "100000.5 (float)"),  # was truncated to 100000
    ([7, 3.0, 9], 1, "3.0 (float)"),
    ([7, True, 9], 1, "True (bool)"),  # was read as 1
    ([False, 8, 9], 0, "False (bool)"),  # was read as 0
    ([7, "8", 9], 1, "'8' (str)"),
    ([7, None, 9], 1, "None (NoneType)"),
    ([7, [8], 9], 1, "[8] (list)"),
    ([7, -1, 9], 1, "-1 (int)"),
    ([7, 2**63, 9], 1, "9223372036854775808 (int)"),  # was 'malformed session, OverflowError'
    ([7, 2**64, 9], 1, "18446744073709551616 (an integer past 64 bits)"),  # orjson: a float
], ids=["float", "integral_float", "true", "false", "string", "null", "list", "negative",
        "2**63", "2**64"])
def test_weka_hash_ids_element_must_be_a_non_negative_int64(tmp_path, ids, j, found):
    p = _weka_file(tmp_path, _session("a", [0, 1]), _session("b", [0, 1], ids))
    with pytest.raises(TraceError) as e:
        _weka(p)
    assert str(e.value) == (f"{p} line 2 (session 'b', request 1), field 'hash_ids': found "
                            f"element {j} = {found}, expected non-negative integers below 2**63")


def test_weka_hash_id_2_63_is_named_not_an_overflow(tmp_path):
    p = _weka_file(tmp_path, _session("a", [1, 2**63]))
    with pytest.raises(TraceError, match=r"line 1 \(session 'a', request 0\), field 'hash_ids': "
                                         r"found element 1 = 9223372036854775808 \(int\)") as e:
        _weka(p)
    assert "OverflowError" not in str(e.value) and "malformed" not in str(e.value)
    p = _weka_file(tmp_path, _session("a", [1, 2**63 - 1]), name="ok.jsonl")
    assert _weka(p).prefix_values().tolist() == [0, 1]  # the largest id accepted


def test_weka_bad_element_in_a_subagent_request_and_skip(tmp_path):
    s = _session("s", [0, 1])
    s["requests"].append({"t": 9.0, "type": "subagent", "duration_ms": 1000,
                          "requests": [_request(0.0, [0, 1, 2.5])]})
    p = _weka_file(tmp_path, _session("a", [0, 1]), s)
    with pytest.raises(TraceError) as e:
        _weka(p)
    assert str(e.value).startswith(f"{p} line 2 (session 's', request 1, sub-agent request 0), "
                                   "field 'hash_ids': found element 2 = 2.5 (float)")
    w = _weka(p, on_error="skip")  # the whole session goes
    assert len(w) == 1 and w.skipped["count"] == 1
    assert w.skipped["examples"][0] == str(e.value)


# ---------------------------------------------------------------- Weka: errors name the line
def test_weka_repeated_id_names_the_line(tmp_path):
    """Was caught only by the simulator's check, naming 'request 1 (session 1, turn 0)'."""
    p = _weka_file(tmp_path, _session("a", [0, 1]), _session("b", [4, 5, 4]))
    with pytest.raises(TraceError) as e:
        _weka(p)
    assert str(e.value) == (f"{p} line 2 (session 'b', request 0), field 'hash_ids': id repeated "
                            "within a request, found id 4 again at element 2, expected distinct "
                            "ids (prefix-chained: one id names one prefix)")
    # True == 1: a bool beside the id 1 is named as the bad element, not as a repeat
    p = _weka_file(tmp_path, _session("a", [1, True]), name="b.jsonl")
    with pytest.raises(TraceError, match=r"line 1 \(session 'a', request 0\), field 'hash_ids': "
                                         r"found element 1 = True \(bool\)"):
        _weka(p)


def test_weka_id_range_error_names_line_and_request(tmp_path):
    """Was 'line 2, field hash_ids: found ids in [-1, 3]' for the session, no request."""
    p = _weka_file(tmp_path, _session("a", [0, 1]), _session("b", [0, 1], [2, 3], [-1, 3]))
    with pytest.raises(TraceError) as e:
        _weka(p)
    assert str(e.value).startswith(f"{p} line 2 (session 'b', request 2), field 'hash_ids': "
                                   "found element 0 = -1 (int)")


# ---------------------------------------------------------------- Weka: sparse ids
def test_weka_sparse_ids_load_as_their_dense_equivalent(tmp_path):
    """Ids spread over int64 (x -> x * 2**40 + 12345, order kept) give the same workload as the
    original ids (they were rejected past 2**31), with and without shared system prefixes."""
    lines = WEKA_TINY.read_text().splitlines()

    def spread(node):
        if isinstance(node, dict):
            return {k: ([x * 2**40 + 12345 for x in v] if k == "hash_ids" else spread(v))
                    for k, v in node.items()}
        return [spread(x) for x in node] if isinstance(node, list) else node

    p = tmp_path / "sparse.jsonl"
    p.write_text("".join(json.dumps(spread(json.loads(line))) + "\n" for line in lines))
    for share in (False, True):
        dense, sparse = _weka(WEKA_TINY, share_system_prefix=share), _weka(p, share_system_prefix=share)
        assert sparse.table.equals(dense.table), share
        assert sparse.notes["global_prefix_ids"] == dense.notes["global_prefix_ids"]


_WEKA_MEMORY = r"""
import json, resource, sys
from traces import TraceConfig, load_workload

def vm(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

cfg = lambda p: TraceConfig(name="x", format="weka", path=p, session_arrival="recorded")
load_workload(cfg(sys.argv[1]), 0)  # imports and first allocations
cap, hard = vm("VmSize:") + (1 << 30), resource.getrlimit(resource.RLIMIT_AS)[1]
resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
before = vm("VmHWM:")
w = load_workload(cfg(sys.argv[2]), 0)
print(json.dumps({"grew_mb": (vm("VmHWM:") - before) / 2**20, "ids": w.prefix_values().tolist()}))
"""


def test_weka_large_ids_take_memory_of_the_data_not_of_the_id(tmp_path):
    """One id of 150,000,000 raised peak RSS by >1.2 GB (a table indexed by id) and one near
    2**31 tried 16 GiB; run capped at 1 GiB more address space, the load grows RSS < 64 MB."""
    small = _weka_file(tmp_path, _session("a", [0, 1]), name="small.jsonl")
    big = _weka_file(tmp_path, _session("a", [0, 150_000_000]), _session("b", [5, 2**31 - 1]),
                     _session("c", [1, 2**62]), name="big.jsonl")
    r = subprocess.run([sys.executable, "-c", _WEKA_MEMORY, str(small), str(big)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ids"] == [0, 1, 2, 3, 4, 5]
    assert out["grew_mb"] < 64, out



def test_weka_subagent_marker_tokens_are_checked(tmp_path):
    """Reviewer: with share_system_prefix a sub-agent marker's system_tokens / tool_tokens were
    used unchecked (a negative count sliced the leading ids from the end). They must be
    non-negative integers, as the session's are; the error names the marker's line and field."""
    sub = {"t": 5.0, "type": "subagent", "system_tokens": -128, "tool_tokens": 0,
           "requests": [{"t": 0.0, "type": "n", "in": 200, "out": 5, "hash_ids": [1, 2, 3]}]}
    s = {"id": "s1", "requests": [{"t": 0.0, "type": "n", "in": 200, "out": 5, "hash_ids": [1, 2, 3]}, sub]}
    p = tmp_path / "w.jsonl"
    p.write_text(json.dumps(s) + "\n")
    assert len(load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)) == 2
    with pytest.raises(TraceError, match=r"w\.jsonl line 1 .*field 'system_tokens/tool_tokens': found -128/0"):
        load_workload(TraceConfig(name="x", format="weka", path=str(p), share_system_prefix=True), 0)


def test_weka_think_time_past_the_clock_range_is_an_error(tmp_path):
    """A closed-loop think_time past 2**32 s (as recorded t and Mooncake timestamps are) is an
    error naming the line, session, request and field."""
    reqs = [{"t": 0.0, "type": "n", "in": 200, "out": 5, "hash_ids": [1, 2, 3]},
            {"t": 1.0, "type": "n", "in": 200, "out": 5, "hash_ids": [1, 2, 4], "think_time": 1e300}]
    p = tmp_path / "w.jsonl"
    p.write_text(json.dumps({"id": "s1", "requests": reqs}) + "\n")
    with pytest.raises(TraceError, match=r"w\.jsonl line 1 \(session 's1', request 1\), field 'think_time': found 1e\+300"):
        load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)
    reqs[1]["think_time"] = 2.0
    p.write_text(json.dumps({"id": "s1", "requests": reqs}) + "\n")
    assert len(load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)) == 2


def test_servegen_files_with_a_bom_load_as_without(tmp_path):
    """ServeGen chunk files saved with a UTF-8 byte-order mark load as without it, as the other
    formats do."""
    import shutil

    src = Path(__file__).parent / "data" / "traces" / "servegen_ok"
    bom = tmp_path / "bom"
    shutil.copytree(src, bom)
    for f in bom.iterdir():
        f.write_bytes(b"\xef\xbb\xbf" + f.read_bytes())
    cfg = {"name": "s", "format": "servegen", "num_requests": 50}
    a = load_workload(TraceConfig(**cfg, path=str(src)), 0).table
    b = load_workload(TraceConfig(**cfg, path=str(bom)), 0).table
    assert a.num_rows == 50 and a.equals(b)
