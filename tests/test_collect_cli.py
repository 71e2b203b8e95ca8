"""``kvsim-collect``: what ``--out`` may replace (never a folder of other files, the sweep, a
folder around or inside it, a run or a file), ``--tables`` names checked before anything is
written, failed runs listed with a warning and the exit status, every group option of an
``output.dir`` run, and a results folder that mixes sweeps.

The sweeps are fake run folders (``fake_sweeps``), so the tests are quick; one test runs the
simulator for the group options it records."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from experiments import collect as C
from experiments import plots as P
from fake_sweeps import fake_run, fake_sweep
from sim.folders import is_collection

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def sweep(tmp_path) -> Path:
    """Two runs: cache.block_size=16,32."""
    return fake_sweep(tmp_path / "multirun" / "s1",
                      [{"cache.block_size": 16}, {"cache.block_size": 32}])


def _cli(capsys, *args) -> tuple[int, str, str]:
    rc = C.main([str(a) for a in args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _one_error_line(err: str, *parts: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("kvsim-collect: error: ") and "Traceback" not in err
    for p in parts:
        assert p in lines[0], (p, lines[0])
    return lines[0]


def _tree(d: Path) -> dict[str, bytes]:
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_out_non_empty_folder_that_is_no_collection_is_refused_and_kept(sweep, tmp_path, capsys):
    """An ``--out`` folder holding files that are not a collection (notes.txt) is refused with
    one error line (exit 2) and left as it was."""
    mine = tmp_path / "myresults"
    mine.mkdir()
    (mine / "notes.txt").write_text("notes\n")
    rc, out, err = _cli(capsys, sweep, "--out", mine)
    assert rc == 2
    _one_error_line(err, str(mine), "not a kvsim-collect output")
    assert (mine / "notes.txt").read_text() == "notes\n" and len(list(mine.iterdir())) == 1
    assert not list(tmp_path.glob(".myresults*"))


@pytest.mark.parametrize("where, expect", [
    ("sweep", "is the sweep directory itself"),
    ("parent", "contains the sweep directory"),
    ("run", "is a kvsim run directory"),
    ("inside", "is inside the sweep directory"),
    ("file", "is an existing file"),
    ("under_file", "is a file, not a directory"),
])
def test_out_that_would_delete_the_sweep_a_run_or_a_file_is_refused(sweep, tmp_path, capsys,
                                                                       where, expect):
    """An ``--out`` that is the sweep, a folder around it (holding other sweeps), one of its
    runs, a folder inside it, an existing file or a path under a file is refused with one error
    line naming it (exit 2), by the CLI and by :func:`collect`; nothing is deleted, renamed or
    written."""
    other = fake_sweep(tmp_path / "multirun" / "s2", [{"cache.block_size": 64}])
    (tmp_path / "somefile.txt").write_text("keep me\n")
    out = {"sweep": sweep, "parent": sweep.parent, "run": sweep / "0",
           "inside": sweep / "mine", "file": tmp_path / "somefile.txt",
           "under_file": tmp_path / "somefile.txt" / "x"}[where]
    before = _tree(tmp_path)
    rc, _, err = _cli(capsys, sweep, "--out", out)
    assert rc == 2
    _one_error_line(err, str(out), expect)
    assert _tree(tmp_path) == before  # nothing deleted, renamed or written
    assert (other / "0" / "summary.json").is_file() and not (sweep / "mine").exists()
    with pytest.raises(C.CollectError, match=expect):
        C.collect(sweep, out, quiet=True)
    assert _tree(tmp_path) == before


def test_out_refusal_through_the_console_script_is_one_line_exit_2(sweep, tmp_path):
    """The console script's refusal is one line on stderr, no traceback, exit 2."""
    mine = tmp_path / "myresults"
    mine.mkdir()
    (mine / "notes.txt").write_text("notes\n")
    r = subprocess.run([sys.executable, "-m", "experiments.collect", str(sweep), "--out", str(mine)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    _one_error_line(r.stderr, str(mine))
    assert (mine / "notes.txt").is_file()


def test_an_earlier_collection_an_empty_folder_and_the_default_are_still_written(sweep, tmp_path,
                                                                                  capsys):
    """An earlier collection is replaced whole (no file of it left), an empty folder and the
    default ``SWEEP/collected`` are written, and no temporary folder is left beside them."""
    out = tmp_path / "col"
    assert _cli(capsys, sweep, "--out", out)[0] == 0
    assert is_collection(out) and not is_collection(sweep) and not is_collection(sweep / "0")
    (out / "stale.txt").write_text("old\n")
    assert _cli(capsys, sweep, "--out", out)[0] == 0  # an earlier collection is replaced whole
    assert not (out / "stale.txt").exists() and len(pd.read_parquet(out / "runs.parquet")) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".col")]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _cli(capsys, sweep, "--out", empty)[0] == 0 and is_collection(empty)
    for _ in range(2):  # the default SWEEP/collected, new and then replaced
        assert _cli(capsys, sweep)[0] == 0
    assert is_collection(sweep / "collected")
    assert len(pd.read_parquet(sweep / "collected" / "runs.parquet")) == 2


def test_unknown_table_name_is_an_error_listing_the_tables_before_anything_is_written(sweep,
                                                                                       capsys):
    """An unknown ``--tables`` name is one error line (exit 2) naming it, the tables there are
    and the closest one, before anything is written (the earlier collection stays); spaces
    after the commas are allowed."""
    assert _cli(capsys, sweep)[0] == 0
    before = _tree(sweep / "collected")
    rc, _, err = _cli(capsys, sweep, "--tables", "requets")
    assert rc == 2
    _one_error_line(err, "--tables", "'requets'", "requests, steps", "did you mean requests")
    assert _tree(sweep / "collected") == before
    rc, _, err = _cli(capsys, sweep, "--tables", "requests,nope")
    assert rc == 2 and "'nope'" in err and "'requests'" not in err
    rc, _, err = _cli(capsys, sweep, "--tables", ",")
    assert rc == 2 and "expected comma-separated table names" in err
    assert _tree(sweep / "collected") == before
    rc, out, _ = _cli(capsys, sweep, "--tables", "requests, steps")  # spaces are fine
    assert rc == 0 and "requests (12 rows), steps (10 rows)" in out


def test_failed_runs_exit_0_with_a_warning_naming_how_many_and_where(sweep, tmp_path, capsys):
    """Failed runs are listed, not fatal: exit 0 with one warning line naming how many and the
    failed_runs.csv; ``--strict`` makes it exit 1."""
    (sweep / "1" / "INCOMPLETE").write_text("x\n")
    out = tmp_path / "c"
    rc, stdout, err = _cli(capsys, sweep, "--out", out)
    assert rc == 0  # documented: failed runs are listed, not fatal (--strict makes it 1)
    warn = [ln for ln in err.splitlines() if ln.startswith("kvsim-collect: warning: ")]
    assert len(warn) == 1, err
    assert "1 of 2 runs" in warn[0] and str(out / "failed_runs.csv") in warn[0]
    assert "--strict" in warn[0]
    assert f"1 failed run(s) left out: see {out / 'failed_runs.csv'}" in stdout
    assert _cli(capsys, sweep, "--out", out, "--strict")[0] == 1


def test_no_complete_run_exits_1_naming_the_failed_runs_list(sweep, tmp_path, capsys):
    """A sweep none of whose runs completed leaves nothing to analyse: exit 1 (without
    ``--strict``) and an error line naming the sweep and the failed runs' list, still written."""
    for job in ("0", "1"):
        (sweep / job / "INCOMPLETE").write_text("x\n")
    out = tmp_path / "c"
    rc, stdout, err = _cli(capsys, sweep, "--out", out)
    assert rc == 1
    assert "collected 0 complete run(s) of 2" in stdout
    errors = [ln for ln in err.splitlines() if ln.startswith("kvsim-collect: error: ")]
    assert len(errors) == 1 and str(sweep) in errors[0]
    assert str(out / "failed_runs.csv") in errors[0] and (out / "failed_runs.csv").is_file()
    warn = [ln for ln in err.splitlines() if ln.startswith("kvsim-collect: warning: ")]
    assert len(warn) == 1 and "none completed: exit status 1" in warn[0] and "--strict" not in warn[0]


def test_output_dir_runs_keep_every_group_option_and_curves_by_group_draw(tmp_path, capsys):
    """Two ``output.dir`` runs (no ``.hydra/``), one with ``codec=nvfp4``: each run's
    summary.json records every config group's option (``config_choices``), so the collector
    gives the base run its default codec and tiers (its overrides name neither), and figures
    grouped by codec draw both runs."""
    cmd = [sys.executable, "-c", "from sim.cli import main; main()", "trace=synthetic_multiturn",
           "trace.num_sessions=4", "sim.progress=false"]
    for name, extra in (("base", []), ("nvfp4", ["codec=nvfp4", "tiers=gpu_host"])):
        r = subprocess.run([*cmd, *extra, f"output.dir={tmp_path / 'res' / name}"], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "res" / "base" / "summary.json").read_text())
    assert s["config_choices"]["codec"] == "identity" and s["config_choices"]["tiers"] == "gpu_only"
    assert not any(k.startswith("hydra/") for k in s["config_choices"])
    out = C.collect(tmp_path / "res", tmp_path / "rc", quiet=True).out_dir
    runs = pd.read_parquet(out / "runs.parquet").set_index("run_id")
    assert runs.loc["base", "codec"] == "identity" and runs.loc["nvfp4", "codec"] == "nvfp4"
    assert runs.loc["base", "tiers"] == "gpu_only"
    assert not [c for c in runs.columns if c.startswith(("config_choices", "summary.config"))]
    req = pd.read_parquet(out / "requests")
    assert set(req.groupby("run_id")["codec"].first().items()) == {("base", "identity"),
                                                                    ("nvfp4", "nvfp4")}
    for fig in ("ttft-cdf", "ttft-decomposition"):
        assert P.main([fig, str(out), "--out", str(tmp_path / f"{fig}.png")]) == 0, \
            capsys.readouterr().err
        assert (tmp_path / f"{fig}.png").stat().st_size > 0


def test_a_results_folder_mixing_sweeps_is_warned_and_listed(tmp_path, capsys):
    """A results folder holding the output.dir runs of several sweeps is collected with one
    warning naming the sweeps, and manifest.json ``sweeps`` lists each run's sweep; the runs of
    one sweep (and single runs) get no warning."""
    root = tmp_path / "res"
    for name, sweep in (("a0", "S1 0"), ("a1", "S1 1"), ("b0", "S2 0"), ("one", None)):
        d = fake_run(root / name, 0, {"cache.block_size": 16})
        if sweep:
            (d / ".kvsim_job").write_text(sweep)
    out = tmp_path / "c"
    assert C.main([str(root), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    man = json.loads((out / "manifest.json").read_text())
    assert man["sweeps"] == {"": ["one"], "S1": ["a0", "a1"], "S2": ["b0"]}
    assert ("kvsim-collect: warning: the runs come from 2 sweeps (S1: 2 run(s), e.g. a0; S2: 1 "
            "run(s), e.g. b0; and 1 single run(s))") in err
    shutil.rmtree(root / "b0")
    assert C.main([str(root), "--out", str(out)]) == 0
    assert "sweeps" not in capsys.readouterr().err
    assert json.loads((out / "manifest.json").read_text())["sweeps"] == {"": ["one"],
                                                                          "S1": ["a0", "a1"]}


_STOP_AFTER = """
import os, signal, sys
from experiments.collect import main

sig = getattr(signal, sys.argv[1])
signal.signal(signal.SIGALRM, lambda *a: os.kill(os.getpid(), sig))
signal.setitimer(signal.ITIMER_REAL, float(sys.argv[2]))
rc = main(sys.argv[3:])
signal.setitimer(signal.ITIMER_REAL, 0)  # (finished first: no alarm while Python exits)
sys.exit(rc)
"""


@pytest.mark.parametrize("sig,delay", [("SIGINT", 0.001), ("SIGINT", 0.05), ("SIGINT", 0.2),
                                       ("SIGTERM", 0.001), ("SIGTERM", 0.05)])
def test_ctrl_c_or_sigterm_is_one_line_and_leaves_the_earlier_collection_whole(sweep, tmp_path,
                                                                                sig, delay):
    """Ctrl-C (SIGTERM) at any moment of a collection ends with one ``kvsim-collect:
    interrupted; OUT was left as it was`` (``stopped by SIGTERM``) line, exit 130 (143), no
    traceback, and ``OUT`` holds the earlier collection byte for byte; or the line says the new
    collection was written and ``OUT`` holds it whole; a collection that finished first exits
    0 with the new one whole."""
    out = tmp_path / "c"
    assert C.main([str(sweep), "--out", str(out)]) == 0
    before = _tree(out)
    r = subprocess.run([sys.executable, "-c", _STOP_AFTER, sig, str(delay), str(sweep), "--out",
                        str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    if r.returncode == 0:  # (it finished before the signal)
        assert json.loads((out / "manifest.json").read_text())["runs_complete"] == 2
        return
    assert r.returncode == (130 if sig == "SIGINT" else 143), r.stderr[-2000:]
    how = "interrupted" if sig == "SIGINT" else "stopped by SIGTERM"
    lines = r.stderr.strip().splitlines()
    if lines == [f"kvsim-collect: {how} after the collection was written; {out} holds it whole"]:
        assert json.loads((out / "manifest.json").read_text())["runs_complete"] == 2
        return
    assert lines == [f"kvsim-collect: {how}; {out} was left as it was"], r.stderr[-2000:]
    assert _tree(out) == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".c.")
                and not p.name.endswith(".lock")]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_while_kvsim_collect_starts_is_one_line(sweep, tmp_path, sig):
    """Ctrl-C (SIGTERM) while the command's modules load is one line, exit 130 (143), and
    nothing is written."""
    import signal
    import time

    out = tmp_path / "c"
    proc = subprocess.Popen([sys.executable, "-m", "experiments.collect", str(sweep), "--out",
                             str(out)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(0.25)
    proc.send_signal(getattr(signal, sig))
    err = proc.communicate(timeout=120)[1].decode()
    if proc.returncode in (0, -getattr(signal, sig)):  # (finished first; before Python's handler)
        return
    assert "Traceback" not in err, err[-2000:]
    how = "interrupted" if sig == "SIGINT" else "stopped by SIGTERM"
    assert proc.returncode == (130 if sig == "SIGINT" else 143), err[-2000:]
    assert err.strip().splitlines() in ([f"kvsim-collect: {how}; nothing was written"],
                                        [f"kvsim-collect: {how}; {out} was left as it was"]), err
    assert not out.exists()


def test_a_collect_into_an_output_another_is_writing_is_refused_before_reading(sweep, tmp_path,
                                                                               capsys):
    """The output's lock is taken before the sweep is read: while another kvsim-collect holds
    it, a second one stops with one line (exit 2) naming the output, whatever it would have
    found in the sweep (here an unknown --tables name), and the earlier collection stays byte
    for byte."""
    from sim.locks import hold

    out = tmp_path / "c"
    assert _cli(capsys, sweep, "--out", out)[0] == 0
    before = _tree(out)
    with hold(tmp_path / ".c.lock"):
        rc, _, err = _cli(capsys, sweep, "--out", out, "--tables", "nope")
    assert rc == 2
    _one_error_line(err, f"{out}: another kvsim-collect (process ", "one kvsim-collect into a "
                    "folder at a time")
    assert _tree(out) == before
    rc, _, err = _cli(capsys, sweep, "--out", out, "--tables", "nope")
    assert rc == 2 and "--tables: no run of" in err and "another kvsim-collect" not in err


def test_an_error_found_while_reading_leaves_no_folder_made_for_the_output(sweep, tmp_path,
                                                                          capsys):
    """A collection refused after its output's lock was taken (an unknown --tables name) takes
    back the folders it made for the output: nothing is left."""
    out = tmp_path / "new" / "deeper" / "c"
    rc, _, err = _cli(capsys, sweep, "--out", out, "--tables", "nope")
    assert rc == 2 and "'nope'" in err
    assert not (tmp_path / "new").exists()
