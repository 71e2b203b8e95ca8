"""``output.skip_completed=true``: a finished run is skipped only while every input file (trace,
calibration, recorded importance) has the content it was made from and every table it wrote
is there at its size; a skipped run still prints its results line, written whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parent.parent
KVSIM = [sys.executable, "-m", "sim.cli"]
QUIET = ["sim.progress=false", "output.print_summary=false"]


def _kvsim(*args, timeout=300, check=True):
    r = subprocess.run([*KVSIM, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"kvsim {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def test_skip_completed_reruns_a_run_whose_trace_changed(tmp_path):
    """``output.skip_completed=true`` skips a finished run only if its trace's content is the
    one it was made from (summary.json's trace_input: each file's name, size and xxh3-128): the
    same file is skipped; the file edited in place (same path, same overrides) is rerun."""
    src = REPO / "traces" / "data" / "mooncake_conversation_10min.jsonl"
    trace = tmp_path / "t.jsonl"
    lines = src.read_text().splitlines(keepends=True)[:60]
    trace.write_text("".join(lines))
    out = tmp_path / "run"
    args = ["trace=mooncake_conversation_10min", f"trace.path={trace}", "trace.cache=false",
            f"output.dir={out}", f"hydra.run.dir={tmp_path / 'h'}", *QUIET,
            "output.skip_completed=true"]
    _kvsim(*args)
    s1 = json.loads((out / "summary.json").read_text())
    assert s1["trace_input"] == [["t.jsonl", trace.stat().st_size, s1["trace_input"][0][2]]]
    assert s1["requests_total"] == 60
    mt = (out / "summary.json").stat().st_mtime_ns
    _kvsim(*args)  # unchanged: skipped
    assert (out / "summary.json").stat().st_mtime_ns == mt
    trace.write_text("".join(lines[:40]))  # edited in place: rerun from the new content
    _kvsim(*args)
    s2 = json.loads((out / "summary.json").read_text())
    assert s2["requests_total"] == 40 and s2["trace_input"] != s1["trace_input"]


def test_skip_completed_reruns_a_run_whose_calibration_changed(tmp_path):
    """``output.skip_completed=true`` compares every input file, not only the trace:
    summary.json's input_files holds each calibration and recorded-importance file's name, size
    and xxh3-128; an unchanged file is skipped, an edited one rerun."""
    from sim.run import compose_config, input_files

    cal = tmp_path / "cal.json"
    doc = json.loads((REPO / "gpu_validation" / "calibrations" / "h200.json").read_text())
    cal.write_text(json.dumps(doc))
    out = tmp_path / "run"
    args = ["trace.max_requests=20", "cost=calibrated", f"cost.file={cal}", f"output.dir={out}",
            f"hydra.run.dir={tmp_path / 'h'}", *QUIET, "output.skip_completed=true"]
    _kvsim(*args)
    s1 = json.loads((out / "summary.json").read_text())
    assert s1["input_files"] == {"cost.file": ["cal.json", cal.stat().st_size,
                                               s1["input_files"]["cost.file"][2]]}
    mt = (out / "summary.json").stat().st_mtime_ns
    _kvsim(*args)  # unchanged: skipped
    assert (out / "summary.json").stat().st_mtime_ns == mt
    cal.write_text(json.dumps(doc, indent=1))  # re-written (same values): rerun
    _kvsim(*args)
    s2 = json.loads((out / "summary.json").read_text())
    assert (out / "summary.json").stat().st_mtime_ns != mt
    assert s2["input_files"]["cost.file"] != s1["input_files"]["cost.file"]
    # recorded importance scores count the same way; the analytic cost model reads no file
    scores = tmp_path / "scores.parquet"
    scores.write_bytes(b"not yet parquet")
    cfg = compose_config(["policy=h2o", "policy.importance_source=recorded",
                          f"policy.importance_file={scores}"])
    a = input_files(cfg)
    assert a == {"policy.importance_file": ["scores.parquet", 15, a["policy.importance_file"][2]]}
    scores.write_bytes(b"not yet parquet!")
    assert input_files(cfg) != a
    assert input_files(compose_config([])) == {}


def test_chdir_relative_calibration_results_line_and_wide_title(tmp_path):
    """With hydra.job.chdir=true a relative cost.file is looked up as without chdir (the
    repository root too); a run skipped by output.skip_completed prints its results line, one
    normalised absolute path; a title longer than 110 columns stays one line in a pipe."""
    run = tmp_path / "a" / ".." / "res"
    args = ["trace.max_requests=10", "cost=calibrated",
            "cost.file=gpu_validation/calibrations/h200.json", "hydra.job.chdir=true",
            f"hydra.run.dir={tmp_path / 'h'}", f"output.dir={run}", "sim.progress=false",
            "tiers=gpu_host_disk", "codec=nvfp4", "policy=triattention", "compaction=forward_pack",
            "model=llama3_1_70b", "cost.tensor_parallel_size=4", "output.skip_completed=true"]
    r = subprocess.run([*KVSIM, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert s["input_files"]["cost.file"][0] == "h200.json"
    lines = r.stdout.splitlines()
    assert lines[0].strip().startswith("kvsim: mooncake_conversation_10min | Llama-3.1-70B on 4 x "
                                       "H200 | triattention + forward_pack | tiers gpu_host_disk, "
                                       "codec nvfp4"), r.stdout
    assert lines[-1] == f"results: {tmp_path / 'res'}"
    r = subprocess.run([*KVSIM, *args], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == f"results: {tmp_path / 'res'}", r.stdout
    assert f"skipping {tmp_path / 'res'}: already complete" in r.stdout


def test_skip_completed_reruns_a_run_whose_tables_were_lost(tmp_path):
    """``output.skip_completed=true`` checks the tables as well as summary.json: summary.json
    lists the files the run wrote with their sizes and content digests (``output_files``); a
    run missing one, or with one of another size or another content of the same size, is rerun
    (the altered one with a note naming the file); an untouched one is still skipped; a
    hand-edited summary.json is not a complete run."""
    from sim.folders import file_digest
    from sim.run import is_complete

    out = tmp_path / "run"
    args = ["trace.max_requests=30", f"output.dir={out}", f"hydra.run.dir={tmp_path / 'h'}",
            *QUIET, "output.skip_completed=true"]
    _kvsim(*args)
    s = json.loads((out / "summary.json").read_text())
    names = [f[0] for f in s["output_files"]]
    assert {"requests.parquet", "steps.parquet", "transfers.parquet", "rounds.parquet"} <= set(names)
    assert all((out / f).stat().st_size == n for f, n, _ in s["output_files"])
    assert all(file_digest(out / f) == h for f, _, h in s["output_files"])
    assert is_complete(out)
    mt = (out / "summary.json").stat().st_mtime_ns
    _kvsim(*args)  # untouched: skipped
    assert (out / "summary.json").stat().st_mtime_ns == mt
    (out / "steps.parquet").unlink()
    assert not is_complete(out)
    _kvsim(*args)  # a table deleted: rerun, the table is back
    assert (out / "steps.parquet").is_file() and is_complete(out)
    with open(out / "steps.parquet", "r+b") as f:  # a byte altered, the size kept
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 0xFF]))
    assert not is_complete(out)
    r = _kvsim(*args)  # rerun, with a note saying why
    assert (f"kvsim: note: output.skip_completed: {out} is run again: steps.parquet's content "
            f"differs from what the run wrote") in " ".join(r.stderr.split()), r.stderr
    pd.read_parquet(out / "steps.parquet")
    assert (out / "steps.parquet").is_file() and is_complete(out)
    with open(out / "requests.parquet", "r+b") as f:  # truncated
        f.truncate(100)
    assert not is_complete(out)
    _kvsim(*args)
    pd.read_parquet(out / "requests.parquet")  # (rewritten whole)
    assert is_complete(out)
    # a hand-edited summary.json is not a complete run
    good = (out / "summary.json").read_text()
    for bad in (5, True, "abc", {"a": 1}, [{"a": 1}], [["steps.parquet", "x"]], [[1, 2]],
                [["steps.parquet", True]], [["steps.parquet"]], [["steps.parquet", 5, 7]]):
        (out / "summary.json").write_text(json.dumps({**json.loads(good), "output_files": bad}))
        assert not is_complete(out), bad
    for bad in ([], "x", 3):
        (out / "summary.json").write_text(json.dumps(bad))
        assert not is_complete(out)
    (out / "summary.json").write_text(json.dumps({**json.loads(good), "output_files": 5}))
    r = _kvsim(*args)  # rerun, no traceback
    assert "Traceback" not in r.stderr and is_complete(out)


_RECORD_WRITES = """
import json, os, sys

class Rec:
    def __init__(self, f, log):
        self.f, self.log = f, log
    def write(self, t):
        self.log.append(t)
        return self.f.write(t)
    def __getattr__(self, n):
        return getattr(self.f, n)

outs, errs = [], []
sys.stdout, sys.stderr = Rec(sys.stdout, outs), Rec(sys.stderr, errs)
from sim.cli import main
try:
    main()
finally:
    with open(os.environ["KVSIM_TEST_WRITES"], "w") as f:
        json.dump({"out": outs, "err": errs}, f)
"""


@pytest.mark.parametrize("skip", [False, True])
def test_results_line_and_notes_are_one_write_each(tmp_path, skip):
    """With the joblib launcher each job's ``results:`` line (also the one of a run
    skip_completed skips) and every note are written whole, newline included, in one write, so
    parallel jobs' lines never join."""
    writes = tmp_path / "writes.json"
    args = [f"output.dir={tmp_path / 'r'}", "trace.max_requests=200", "cache.num_gpu_blocks=3000",
            "output.write_ops=true", "tiers=gpu_host_disk", "tiers.host_gib=2", *QUIET]
    if skip:
        _kvsim(*args)
        args.append("output.skip_completed=true")
    r = subprocess.run([sys.executable, "-c", _RECORD_WRITES, *args], cwd=REPO, text=True,
                       capture_output=True, timeout=300,
                       env={**os.environ, "KVSIM_TEST_WRITES": str(writes)})
    assert r.returncode == 0, r.stderr
    w = json.loads(writes.read_text())
    line = f"results: {tmp_path / 'r'}\n"
    assert line in w["out"] and r.stdout.endswith(line)
    notes = [t for t in w["err"] if t.startswith("kvsim: ")]
    if not skip:
        assert notes and all(t.endswith("\n") and t.count("\n") == 1 for t in notes), w["err"]
        assert any("ops_transfers_left_out" in t for t in notes)
