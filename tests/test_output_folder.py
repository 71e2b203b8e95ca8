"""Results folders: ``output.dir`` is the run's Hydra run folder; a folder that is a file, holds
other files, cannot be created or takes no file is refused with one line before anything is
written; an earlier complete run survives a rejected re-run; a live run's lock refuses a second
run and a dead run's lock is taken over; any failure marks the folder; an interrupted write
leaves no temporary file; a Hydra run folder reused as ``output.dir`` drops its stale record;
relative paths under ``hydra.job.chdir=true`` name paths from the start folder; a run folder's own
collection does not block a new run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import KVSIM, REPO, SINGLE_ENGINE, quiet_config, run_kvsim
from experiments import collect as C
from sim.run import MARKER, run_simulation


def test_rejected_rerun_keeps_an_earlier_complete_run(tmp_path):
    """A config typo on a re-run into the same output.dir leaves the earlier complete results
    as they were (same bytes) and says so; the run exits 2."""
    out = tmp_path / "r"
    r = run_kvsim(out, "trace.max_requests=30")
    assert r.returncode == 0, r.stderr[-2000:]
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "cli.log"}
    r = run_kvsim(out, "trace.max_requests=30", "cache.block_size=7")
    assert r.returncode == 2
    assert "keeps an earlier complete run" in r.stderr, r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()
            if p.is_file() and p.name != "cli.log"} == before
    # the run's record (cli.log) has both attempts: the results, then the refused re-run
    log = (out / "cli.log").read_text()
    assert log.index("results: ") < log.index("keeps an earlier complete run"), log


def test_cli_output_dir_is_the_hydra_run_dir(tmp_path):
    """With output.dir the results and the job's log share that folder; no
    outputs/<date>/<time>/ folder appears in the working directory. A rejected re-run into it
    leaves the earlier run's files as they were (no .hydra/ record is written there: the run's
    own config.yaml is the record)."""
    out = tmp_path / "res"
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def kvsim(*ov):
        return subprocess.run([*KVSIM, f"output.dir={out}", "sim.progress=false",
                               "trace.max_requests=5", "output.print_summary=false", *ov],
                              capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)

    r = kvsim("cache.block_size=32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]
    assert (out / "summary.json").exists() and not (out / ".hydra").exists()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "cli.log"}
    r = kvsim("tiers.host_gib=-1")
    assert r.returncode == 2, r.stderr[-2000:]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "cli.log"} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]


def test_cli_output_dir_that_is_a_file(tmp_path):
    """An output.dir naming a file: one clear error (exit 2), the file untouched, and no run
    folder left where kvsim ran (no outputs/<date>/<time>/) nor in the temporary folder
    Hydra's log goes to."""
    f = tmp_path / "results.txt"
    f.write_text("not a folder")
    tmp = tmp_path.parent / (tmp_path.name + "-tmp")
    tmp.mkdir()
    env = dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONPATH=str(REPO), TMPDIR=str(tmp))
    r = subprocess.run([*KVSIM, f"output.dir={f}", "sim.progress=false", "trace.max_requests=5"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert f"output.dir={f}: exists and is not a folder" in r.stderr
    assert f.read_text() == "not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.txt"]
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("kind", ["files", "sweep", "summary"])
def test_cli_output_dir_holding_other_files_is_refused(tmp_path, kind):
    """An output.dir that holds files that are not a kvsim run's (a folder of the user's own, one
    with a summary.json of its own, a sweep folder, which kvsim-collect would then take for one
    run): one clear error (exit 2) naming the folder and what it holds; the folder untouched;
    no run folder left in the temporary folder."""
    d = tmp_path / "d"
    if kind == "files":
        d.mkdir()
        (d / "notes.txt").write_text("mine")
    elif kind == "summary":  # a summary.json of one's own does not make it a run folder
        (d / "src").mkdir(parents=True)
        (d / "summary.json").write_text("{}")
        (d / "notes.txt").write_text("mine")
    else:  # a sweep's folder: its record and a job's folder
        (d / "0").mkdir(parents=True)
        (d / "multirun.yaml").write_text("hydra: {}\n")
        (d / "0" / "summary.json").write_text("{}")
    before = sorted(str(p.relative_to(d)) for p in d.rglob("*"))
    tmp = tmp_path.parent / (tmp_path.name + "-tmp")
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp))
    r = subprocess.run([*KVSIM, f"output.dir={d}", "sim.progress=false", "trace.max_requests=5"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert f"output.dir={d}: the folder holds files that are not a kvsim run's" in r.stderr
    assert {"files": "(notes.txt)", "summary": "(notes.txt, src)",
            "sweep": "(0, multirun.yaml)"}[kind] in r.stderr
    assert sorted(str(p.relative_to(d)) for p in d.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and list(tmp.iterdir()) == []


def test_cli_output_dir_that_cannot_be_created(tmp_path):
    """An output.dir that cannot be created (under /proc): one clear error naming it and the
    reason, exit 2, no traceback."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp))
    r = subprocess.run([*KVSIM, "output.dir=/proc/kvsim-test/x", "sim.progress=false",
                        "trace.max_requests=5"], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert "output.dir=/proc/kvsim-test/x: cannot create or write the folder (" in r.stderr
    assert list(tmp.iterdir()) == []


def test_output_folder_that_exists_but_takes_no_file_is_named(tmp_path, monkeypatch):
    """An existing folder no file can be made in (read-only, immutable) is named with the
    reason (here a refused temporary file)."""
    import tempfile

    from sim.folders import uncreatable_folder

    assert uncreatable_folder(tmp_path) is None and list(tmp_path.iterdir()) == []

    def refuse(**kw):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert uncreatable_folder(tmp_path) == "PermissionError: Operation not permitted"


def test_output_folder_behind_a_dangling_symlink_is_named(tmp_path):
    """An output.dir that is (or lies under) a symbolic link to a missing target is named with
    the link and its target; once the target exists the folder is usable."""
    from sim.folders import uncreatable_folder

    (tmp_path / "out").symlink_to(tmp_path / "gone" / "x")
    want = f"{tmp_path / 'out'} is a symbolic link to {tmp_path / 'gone' / 'x'}, which does not exist"
    assert uncreatable_folder(tmp_path / "out") == want
    assert uncreatable_folder(tmp_path / "out" / "sub" / "run") == want
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    (tmp_path / "gone" / "x").mkdir(parents=True)  # the target made: the folder is usable
    assert uncreatable_folder(tmp_path / "out" / "sub") is None


def test_cli_output_dir_that_takes_no_file(tmp_path):
    """The CLI on an immutable folder (chattr +i; skipped where the filesystem has no such
    flag): one error line, exit 2, no traceback."""
    d = tmp_path / "imm"
    d.mkdir()
    if subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    try:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        r = subprocess.run([*KVSIM, f"output.dir={d}", "sim.progress=false",
                            "trace.max_requests=5"], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=120)
    finally:
        subprocess.run(["chattr", "-i", str(d)], capture_output=True)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert f"output.dir={d}: cannot create or write the folder (PermissionError" in r.stderr


def test_cli_log_is_the_record_of_the_run_beside_it(tmp_path):
    """A run into an earlier run's folder replaces its results, and its cli.log then holds this
    run's record only (Hydra appends to the file); a run rejected by the checks keeps the
    earlier results and adds its error to their record."""
    out = tmp_path / "res"
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def kvsim(*ov):
        return subprocess.run([*KVSIM, f"output.dir={out}", "sim.progress=false",
                               "trace.max_requests=5", *ov],
                              capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)

    assert kvsim("cache.block_size=32").returncode == 0
    first = (out / "cli.log").read_text()
    assert "cache.block_size=32 -> " in first
    assert kvsim("tiers.host_gib=-1").returncode == 2  # rejected: the first run's results stay
    log = (out / "cli.log").read_text()
    assert log.startswith(first) and "tiers.host_gib" in log[len(first):]
    assert kvsim("cache.block_size=64").returncode == 0
    log = (out / "cli.log").read_text()
    assert "cache.block_size=64" in log and "cache.block_size=32" not in log
    assert "tiers.host_gib" not in log and log.count("summary") == first.count("summary")


def test_a_folder_another_live_run_holds_is_refused_untouched(tmp_path):
    """A run holds its folder (the lock of sim.run.RUN_LOCK) while it writes there; a second
    run into it is refused without touching it (exit 2), naming the holder: it writes nothing
    there, not even a line of its log (its one error line goes to stderr)."""
    import socket

    from sim.locks import hold
    from sim.run import RUN_LOCK

    out = tmp_path / "r"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # (stands for the running run's results)
    held = hold(out / RUN_LOCK)  # (this process stands for the running run)
    (out / "cli.log").write_text("the running run's log\n")
    r = run_kvsim(out, "trace.max_requests=5", "output.print_summary=false")
    names = sorted(p.name for p in out.iterdir())
    held.release()
    assert r.returncode == 2, r.stderr[-1500:]
    assert (f"kvsim: error: output.dir={out}: another kvsim run (process {os.getpid()} on "
            f"{socket.gethostname()}) is writing its results there") in r.stderr
    assert names == sorted([RUN_LOCK, "cli.log", "summary.json"])
    assert (out / "summary.json").read_text() == "{}"
    assert (out / "cli.log").read_text() == "the running run's log\n"


def test_a_killed_runs_lock_is_taken_over_and_released(tmp_path):
    """A lock left by a process of this host that no longer exists (a run killed with SIGKILL)
    does not block the folder; a finished run leaves no lock behind."""
    import socket

    from sim.run import RUN_LOCK

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "r"
    out.mkdir()
    (out / RUN_LOCK).write_text(f"{socket.gethostname()} {dead.pid}")
    r = run_kvsim(out, "trace.max_requests=5", "output.print_summary=false")
    assert r.returncode == 0, r.stderr[-1500:]
    assert (out / "summary.json").exists() and not (out / RUN_LOCK).exists()


def test_an_unforeseen_error_marks_the_folder_failed(tmp_path):
    """An exception other than a config or trace error leaves the INCOMPLETE marker naming it
    (kvsim-collect lists the run as failed), shows the traceback and exits 1; no summary and no
    lock are left."""
    from sim.run import MARKER, RUN_LOCK

    out = tmp_path / "r"
    code = ("import sys; import sim.engine as E\n"
            "def boom(self):\n    raise RuntimeError('boom\\nsecond line')\n"
            "E.Simulator.run = boom\n"
            "from sim.cli import main\n"
            f"sys.argv = ['kvsim', 'output.dir={out}', 'sim.progress=false', 'trace.max_requests=5', "
            f"*{list(SINGLE_ENGINE)!r}]\n"  # (Simulator.run: one engine)
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env=dict(os.environ, HYDRA_FULL_ERROR="1"), timeout=120)
    assert r.returncode == 1, r.stderr[-1500:]
    assert "kvsim: error: internal error: RuntimeError: boom second line" in r.stderr
    assert "Traceback" in r.stderr
    marker = (out / MARKER).read_text()
    assert "internal error: RuntimeError: boom second line" in marker.splitlines()[0]
    assert not (out / "summary.json").exists() and not (out / RUN_LOCK).exists()


@pytest.mark.parametrize("stopped", ["requests.parquet", "summary.json"])
def test_interrupted_write_leaves_no_tmp_file(tmp_path, monkeypatch, stopped):
    """A run stopped (Ctrl-C, SIGTERM, an error) while it writes a table or summary.json
    removes the half-written temporary file: the folder holds the INCOMPLETE marker and the
    files written whole, no ``*.tmp`` and no summary.json."""
    real_parquet, real_dump = pd.DataFrame.to_parquet, json.dump

    def to_parquet(self, path, *a, **kw):
        if Path(path).name == f"{stopped}.tmp":
            Path(path).write_bytes(b"PAR1 half")
            raise KeyboardInterrupt
        return real_parquet(self, path, *a, **kw)

    def dump(obj, f, *a, **kw):
        if Path(getattr(f, "name", "")).name == f"{stopped}.tmp":
            f.write('{"half": ')
            raise KeyboardInterrupt
        return real_dump(obj, f, *a, **kw)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", to_parquet)
    monkeypatch.setattr(json, "dump", dump)
    out = tmp_path / "r"
    with pytest.raises(KeyboardInterrupt):
        run_simulation(quiet_config("trace.max_requests=5"), out)
    names = sorted(p.name for p in out.iterdir())
    assert MARKER in names and not [n for n in names if n.endswith(".tmp")], names
    assert "summary.json" not in names


QUIET = ["sim.progress=false", "output.print_summary=false"]


def _kvsim(*args, timeout=300, check=True):
    r = subprocess.run([*KVSIM, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"kvsim {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def test_output_dir_reusing_a_hydra_run_folder_drops_its_stale_record(tmp_path):
    """A run into a Hydra run folder with output.dir removes the earlier run's .hydra/ record with
    its tables and writes its own config.yaml, so the collected row shows the new settings."""
    run = tmp_path / "outputs" / "run"
    _kvsim(f"hydra.run.dir={run}", "trace.max_requests=20", "seed=1", *QUIET)
    assert (run / ".hydra" / "overrides.yaml").is_file()
    _kvsim(f"output.dir={run}", "trace.max_requests=30", "cache.block_size=32", *QUIET)
    assert not (run / ".hydra").exists()
    assert "block_size: 32" in (run / "config.yaml").read_text()
    res = C.collect(run, tmp_path / "col", quiet=True)
    row = res.runs.iloc[0]
    assert row["cache.block_size"] == 32 and row["trace.max_requests"] == 30


def test_output_dir_under_a_file_is_one_line(tmp_path):
    """output.dir=FILE/sub is one error line, not Hydra's NotADirectoryError."""
    f = tmp_path / "plainfile"
    f.write_text("x")
    r = _kvsim(f"output.dir={f / 'sub'}", "trace.max_requests=5", *QUIET, check=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert f"output.dir={f / 'sub'}: {f} is a file, not a folder" in r.stderr
    assert f.read_text() == "x"


@pytest.mark.slow
def test_relative_paths_with_hydra_job_chdir(tmp_path):
    """With hydra.job.chdir=true, relative trace.path and output.dir name paths from the folder
    kvsim started in, as without chdir."""
    lines = (REPO / "traces" / "data" / "mooncake_conversation_10min.jsonl").read_text().splitlines()
    (tmp_path / "m.jsonl").write_text("\n".join(lines[:40]) + "\n")
    r = subprocess.run([*KVSIM, "trace=mooncake_conversation", "trace.path=m.jsonl",
                        "hydra.job.chdir=true", "output.dir=res", *QUIET], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    s = json.loads((tmp_path / "res" / "summary.json").read_text())
    assert s["requests_total"] == 40 and s["trace_source"] == str(tmp_path / "m.jsonl")


def test_a_run_folder_collected_on_its_own_is_collected_beside_it(tmp_path):
    """``kvsim-collect RUN_DIR`` collects the run as a one-run sweep into ``RUN_DIR-collected``
    beside it, never inside the run's folder (``--out RUN_DIR/collected`` is refused naming the
    default), so the folder stays the run's and a later run into it is allowed; a folder in
    it that is not a run's file is still refused."""
    out = tmp_path / "run"
    args = ["trace.max_requests=20", f"output.dir={out}", f"hydra.run.dir={tmp_path / 'h'}", *QUIET]
    _kvsim(*args)
    r = subprocess.run([sys.executable, "-m", "experiments.collect", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"collected 1 complete run(s) of 1 into {tmp_path / 'run-collected'}" in r.stdout
    assert (tmp_path / "run-collected" / "manifest.json").is_file()
    assert not (out / "collected").exists()
    r = subprocess.run([sys.executable, "-m", "experiments.collect", str(out), "--out",
                        str(out / "collected")], cwd=REPO, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 2 and r.stderr == (
        f"kvsim-collect: error: output directory {out / 'collected'} (--out): is inside the run "
        f"folder {out}, which holds that run's files only; choose a directory outside it "
        f"(default: {tmp_path / 'run-collected'})\n"), r.stderr
    assert not (out / "collected").exists()
    _kvsim(*args, "seed=1")  # accepted: replaces the run's results
    assert json.loads((out / "summary.json").read_text())["seed"] == 1
    (out / "collected").mkdir()
    (out / "collected" / "notes.txt").write_text("mine")
    r = _kvsim(*args, check=False)
    assert r.returncode == 2 and "not a kvsim run's (collected)" in r.stderr


def test_a_sweep_jobs_results_folder_is_refused_to_a_single_run(tmp_path):
    """A single run whose output.dir is a sweep job's results folder (it holds the sweep's id)
    is refused with one line naming the job and the sweep, exit 2, leaving the folder's files
    as they were: it would replace the job's results and kvsim-collect would take them for the
    job's."""
    sw = tmp_path / "sw"
    job = sw / "3"
    job.mkdir(parents=True)
    (sw / ".kvsim_sweep_id").write_text("17-42\n")
    (job / ".kvsim_sweep_id").write_text("17-42\n")
    (job / "summary.json").write_text('{"complete": true}\n')
    before = {p.name: p.read_bytes() for p in job.iterdir()}
    r = run_kvsim(job, "trace.max_requests=5")
    assert r.returncode == 2, r.stderr[-2000:]
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: output.dir="), r.stderr
    assert f"job 3 of the sweep in {sw}" in lines[0], lines[0]
    assert {p.name: p.read_bytes() for p in job.iterdir()} == before
