"""Faults around runs and sweeps: after each, every run is complete and labelled with its own
settings, or listed as failed with its reason, and a resume (``output.skip_completed=true``)
completes it; no command exits 0 while a result is lost.

Covers the sweep's process killed, a worker killed, a run killed while it writes, two sweeps
into one folder, a sweep and a single run into a folder another sweep's job holds, many
processes taking one lock at once, a full disk (``ulimit -f``), out of memory, damaged numba
and parsed-trace cache files (the latter in test_trace_cache.py), a collection killed midway
and labels of one run beside results of another. Small traces throughout.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import SINGLE_ENGINE
from experiments import collect as C
from sim.run import MARKER, RUN_LOCK, compose_config, is_complete, run_simulation

REPO = Path(__file__).resolve().parent.parent
KVSIM = [sys.executable, "-m", "sim.cli"]
QUIET = ["sim.progress=false", "output.print_summary=false"]
# a job that simulates for a few seconds (invariants checked every step): long enough to be
# caught mid-run, short enough to rerun
SLOW_JOB = ["sim.check_invariants=true", "trace.max_requests=120"]


def _kvsim(*args, timeout=300, env=None, preexec_fn=None):
    return subprocess.run([*KVSIM, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env, preexec_fn=preexec_fn)


def _start_sweep(sweep: Path, *args) -> subprocess.Popen:
    return subprocess.Popen([*KVSIM, "-m", "hydra/launcher=local", "hydra.launcher.n_jobs=2",
                             f"hydra.sweep.dir={sweep}", *args, *QUIET], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def _wait_for(cond, proc=None, timeout=120.0, what="the condition"):
    t0 = time.monotonic()
    while not cond():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the sweep ended (rc={proc.returncode}) before {what}: "
                        f"{proc.stderr.read()[-2000:]!r}")
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def _group_alive(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` that are running (zombies left out)."""
    alive = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(d.name))
    return alive


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _assert_labelled(sweep: Path, out: Path, sizes: list[int]) -> None:
    """Every job of ``sweep`` collected as complete, each with the block size its config and
    overrides name in its summary's numbers."""
    res = C.collect(sweep, out, quiet=True)
    assert not res.failed, [(r.run_id, r.failure) for r in res.failed]
    runs = res.runs.sort_values("cache.block_size")
    assert runs["cache.block_size"].tolist() == sizes
    assert runs["block_size"].tolist() == sizes  # (summary.json's own number)
    for _, row in runs.iterrows():
        assert f"cache.block_size={row['cache.block_size']}" in row["overrides"]


# --- the sweep's process and its workers --------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process groups from /proc")
def test_sweep_workers_end_with_the_sweep_process_and_a_resume_completes_every_job(tmp_path):
    """SIGKILL to a local sweep's process (an OOM killer, a closed SSH session): its joblib
    workers end too instead of finishing their jobs into folders a resumed sweep writes; the
    resume completes every job, each labelled with its own settings."""
    sweep = tmp_path / "sw"
    grid = ["cache.block_size=16,32", *SLOW_JOB]
    proc = _start_sweep(sweep, *grid)
    try:
        _wait_for(lambda: all((sweep / j / MARKER).exists() for j in "01"), proc,
                  what="both jobs simulating")
        # (a second sweep into the folder meanwhile is refused, naming this one's process)
        second = _kvsim("-m", f"hydra.sweep.dir={sweep}", "cache.block_size=64", *QUIET)
        os.kill(proc.pid, signal.SIGKILL)  # (the sweep's process only)
        proc.wait()
        t0 = time.monotonic()
        while _group_alive(proc.pid):
            assert time.monotonic() - t0 < 10, f"workers outlived the sweep: {_group_alive(proc.pid)}"
            time.sleep(0.1)
    finally:
        _kill_group(proc)
    assert second.returncode == 2 and (f"another kvsim sweep (process {proc.pid} on "
                                       in second.stderr), second.stderr[-2000:]
    assert [j for j in "01" if (sweep / j / MARKER).exists()], "no job was cut short"
    r = _kvsim("-m", "hydra/launcher=local", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}",
               *grid, *QUIET, "output.skip_completed=true")
    assert r.returncode == 0, r.stderr[-2000:]
    _assert_labelled(sweep, tmp_path / "c", [16, 32])


@pytest.mark.slow
def test_a_killed_sweep_worker_is_one_line_naming_the_jobs_and_a_resume_completes_them(tmp_path):
    """A worker killed with SIGKILL (as the OOM killer does): the sweep ends with exit 1 and
    one line naming the jobs that were running and those that never started, and how to
    resume; the resume completes all of them."""
    sweep = tmp_path / "sw"
    grid = ["cache.block_size=16,32,64", *SLOW_JOB]
    proc = _start_sweep(sweep, *grid)
    try:
        _wait_for(lambda: all((sweep / j / MARKER).exists() for j in "01"), proc,
                  what="two jobs simulating")
        worker = json.loads((sweep / ".kvsim_jobs" / "0").read_text())["pid"]
        os.kill(worker, signal.SIGKILL)
        rc = proc.wait(timeout=120)
        err = proc.stderr.read().decode()
    finally:
        _kill_group(proc)
    assert rc == 1, err[-2000:]
    line = [ln for ln in err.splitlines() if ln.startswith("kvsim: error: ")]
    assert len(line) == 1 and "a sweep worker process died" in line[0], err[-2000:]
    assert "SIGKILL" in line[0] and "job(s) 0, 1 ran (joblib stops every worker of a pool one " \
        "of whose workers died)" in line[0], line[0]
    assert "job(s) 2 never started" in line[0] and "output.skip_completed=true" in line[0]
    assert "Traceback" not in err
    r = _kvsim("-m", "hydra/launcher=local", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}",
               *grid, *QUIET, "output.skip_completed=true")
    assert r.returncode == 0, r.stderr[-2000:]
    _assert_labelled(sweep, tmp_path / "c", [16, 32, 64])


def test_a_second_sweep_into_a_running_sweeps_folder_is_refused(tmp_path):
    """A sweep into the hydra.sweep.dir of a sweep that still runs (here this process holds
    the folder as that sweep's process does) stops with one line (exit 2) naming the other
    sweep's process, before writing anything there."""
    from sim.sweep import hold_sweep_dir, release_sweep_dir

    sweep = tmp_path / "sw"
    (sweep / "0").mkdir(parents=True)
    (sweep / "0" / MARKER).write_text("this run has not completed\n")  # (its running job)
    (sweep / ".kvsim_sweep_id").write_text("1-1\n")
    before = sorted(str(p.relative_to(sweep)) for p in sweep.rglob("*"))
    hold_sweep_dir(sweep)
    try:
        r = _kvsim("-m", "hydra/launcher=local", "hydra.launcher.n_jobs=2",
                   f"hydra.sweep.dir={sweep}", "cache.block_size=64,128", "trace.max_requests=20",
                   *QUIET)
    finally:
        release_sweep_dir()
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines() == [
        f"kvsim: error: hydra.sweep.dir={sweep}: another kvsim sweep (process {os.getpid()} on "
        f"{__import__('socket').gethostname()}) is running into this folder; expected a sweep "
        f"folder no running sweep uses (wait for it to end, or pick another hydra.sweep.dir)"]
    assert sorted(str(p.relative_to(sweep)) for p in sweep.rglob("*")) == before
    assert (sweep / ".kvsim_sweep_id").read_text() == "1-1\n"


def test_a_sweep_job_whose_folder_another_process_holds_fails_the_sweep(tmp_path):
    """A job whose own folder another process holds (a worker of an earlier sweep still
    writing there) writes nothing into it; the sweep still lists the job as failed, naming
    the holder, and exits 2 (its job ledger records what the folder cannot)."""
    import socket

    from sim.locks import hold

    sweep = tmp_path / "sw"
    (sweep / "0").mkdir(parents=True)
    with hold(sweep / "0" / RUN_LOCK):
        r = _kvsim("-m", "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={sweep}",
                   "cache.block_size=16", "trace.max_requests=20", *QUIET)
    assert r.returncode == 2, r.stderr[-2000:]
    assert (f"kvsim: sweep job 0 failed: the run folder {sweep}/0: another kvsim run (process "
            f"{os.getpid()} on {socket.gethostname()}) is writing its results there") in r.stderr
    assert not (sweep / "0" / MARKER).exists() and not (sweep / "0" / "summary.json").exists()


@pytest.mark.slow
def test_an_output_dir_claimed_by_another_running_sweep_is_refused(tmp_path):
    """A folder holding the results of a job of another sweep that still runs (a shared
    ``output.dir=R/${hydra:job.num}``): a sweep's job into it fails naming that sweep (the
    sweep exits 2) and so does a single run, leaving it untouched; once that sweep has ended,
    a sweep takes the folder over."""
    from sim.sweep import hold_sweep_dir, release_sweep_dir

    other = tmp_path / "other"
    other.mkdir()
    res = tmp_path / "res"
    (res / "0").mkdir(parents=True)
    (res / "0" / "summary.json").write_text("{}")  # (stands for that job's results)
    (res / "0" / ".kvsim_job").write_text(f"1-1 0 {other}")
    mine = ["-m", "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={tmp_path / 'sw'}",
            "cache.block_size=16", "trace.max_requests=20",
            f"output.dir={res}/${{hydra:job.num}}", *QUIET]
    hold_sweep_dir(other)
    try:
        r = _kvsim(*mine)
        single = _kvsim(f"output.dir={res / '0'}", "trace.max_requests=20", *QUIET)
    finally:
        release_sweep_dir()
    assert r.returncode == 2, r.stderr[-2000:]
    assert (f"kvsim: sweep job 0 failed: output.dir={res}/0 holds the results of job 0 of the "
            f"sweep running into {other}") in r.stderr
    assert single.returncode == 2 and f"holds the results of job 0 of the sweep running into " \
        f"{other}" in single.stderr
    assert (res / "0" / "summary.json").read_text() == "{}"
    r = _kvsim(*mine)
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((res / "0" / "summary.json").read_text())["block_size"] == 16


# --- locks --------------------------------------------------------------------------------------

def _contend(path, start, done, wins, i, trials):
    from sim.errors import Busy
    from sim.locks import hold

    for t in range(trials):
        start.wait()
        try:
            held = hold(path)
            wins[t * 16 + i] = 1
        except Busy:
            held = None
        done.wait()
        if held is not None:
            held.release()
            # (a killed run's lock file, left for the next trial)
            path.write_text("host 999999\n")


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_a_lock_is_held_by_one_of_many_processes_taking_it_at_once(tmp_path):
    """Six processes take one lock at the same instant, over a lock file a killed run left,
    40 times: each time exactly one holds it (the takeover is atomic)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    n, trials = 6, 40
    path = tmp_path / RUN_LOCK
    path.write_text("host 999999\n")
    start, done = ctx.Barrier(n), ctx.Barrier(n)
    wins = ctx.Array("i", trials * 16)
    procs = [ctx.Process(target=_contend, args=(path, start, done, wins, i, trials))
             for i in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    assert [sum(wins[t * 16:t * 16 + n]) for t in range(trials)] == [1] * trials


def test_a_lock_file_no_process_holds_blocks_nothing(tmp_path):
    """A lock file whose process id now belongs to another live process, or an empty one (a
    disk that filled as a run started), holds no lock: a run takes the folder; a lock a live
    process holds is refused, naming it."""
    import socket

    from sim.errors import Busy
    from sim.locks import hold, is_held

    lock = tmp_path / "reused" / RUN_LOCK
    lock.parent.mkdir()
    lock.write_text(f"{socket.gethostname()} {os.getpid()}\n")  # (this process: alive)
    assert not is_held(lock)
    with hold(lock):
        assert is_held(lock)
        with pytest.raises(Busy, match=f"process {os.getpid()} on {socket.gethostname()}"):
            hold(lock)
    assert not lock.exists()
    out = tmp_path / "empty"
    out.mkdir()
    (out / RUN_LOCK).write_text("")
    r = _kvsim(f"output.dir={out}", "trace.max_requests=20", *QUIET)
    assert r.returncode == 0, r.stderr[-2000:]
    assert is_complete(out) and not (out / RUN_LOCK).exists()


# --- writes that fail or stop -------------------------------------------------------------------

def test_a_full_disk_is_one_line_and_a_resume_completes_the_run(tmp_path):
    """Writes cut off by the file size limit (``ulimit -f``, as a full disk cuts them): one
    ``kvsim: error:`` line naming the file (exit 1), no traceback, the folder marked
    INCOMPLETE with the error (collect lists it); the same command with skip_completed and
    room to write completes it."""
    out = tmp_path / "r"

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024, 16 * 1024))

    args = [f"output.dir={out}", "trace.max_requests=20", *QUIET, "output.skip_completed=true"]
    r = _kvsim(*args, preexec_fn=small_files)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    (line,) = [ln for ln in r.stderr.splitlines() if ln.startswith("kvsim: error:")]
    assert f"the file size limit (ulimit -f) is reached writing {out}/" in line
    assert f"{out} is marked INCOMPLETE with it" in line
    assert "the file size limit" in (out / MARKER).read_text().splitlines()[0]
    assert not is_complete(out)
    res = C.collect(out, tmp_path / "c", quiet=True)
    assert "the file size limit" in res.failed[0].failure
    r = _kvsim(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    assert is_complete(out)


def _no_file_data():
    """``ulimit -f 0``: no file can get a byte (a disk full from the start); empty files and
    folders can still be made."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def test_a_full_disk_as_hydra_writes_the_run_record_is_one_line(tmp_path):
    """No room for Hydra's ``.hydra/`` record at a run's start (no ``output.dir``): one
    ``kvsim: error:`` line naming the record file (exit 1), no traceback, the folder not
    complete, no lock or temporary file left; the same command with room completes it."""
    run = tmp_path / "r"
    args = [f"hydra.run.dir={run}", "trace.max_requests=20", *QUIET,
            "output.skip_completed=true"]
    r = _kvsim(*args, preexec_fn=_no_file_data)
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.splitlines() == [
        f"kvsim: error: the file size limit (ulimit -f) is reached writing {run}/.hydra/"
        f"config.yaml (EFBIG: File too large); expected room for the results: free space (or "
        f"pick another output.dir), then run the same command with output.skip_completed=true; "
        f"{run} is marked INCOMPLETE"]
    assert (run / MARKER).exists() and not (run / "summary.json").exists()
    assert not (run / RUN_LOCK).exists() and not list(run.rglob("*.tmp"))
    assert list((run / ".hydra").iterdir()) == []
    r = _kvsim(*args)
    assert r.returncode == 0, r.stderr[-2000:]
    assert is_complete(run, ["trace.max_requests=20"])


def test_a_full_disk_as_hydra_writes_the_record_keeps_an_earlier_complete_run(tmp_path):
    """A run into the folder of an earlier complete run, with no room for its record: the
    earlier run's ``.hydra/`` record is left byte for byte (each record file is replaced whole
    or not at all) and the run stays complete; with ``output.skip_completed`` and the same
    settings the run is skipped as complete."""
    run = tmp_path / "r"
    base = [f"hydra.run.dir={run}", "trace.max_requests=20", *QUIET]
    assert _kvsim(*base).returncode == 0
    record = {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()}
    r = _kvsim(*base, "seed=7", preexec_fn=_no_file_data)
    assert r.returncode == 1, r.stderr[-2000:]
    (line,) = r.stderr.splitlines()
    assert line.endswith(f"; nothing was written; {run} keeps an earlier complete run"), line
    assert {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()} == record
    assert is_complete(run, ["trace.max_requests=20"])
    r = _kvsim(*base, "output.skip_completed=true", preexec_fn=_no_file_data)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[-1] == f"results: {run}"


def test_a_sweep_on_a_full_disk_is_one_line_and_leaves_no_lock_that_blocks(tmp_path):
    """A sweep whose folder has no room (``ulimit -f 0``): one line naming the sweep's lock
    file (exit 1), no traceback; the next sweep into the folder runs every job."""
    sweep = tmp_path / "sw"
    args = ["-m", "hydra/launcher=basic", f"hydra.sweep.dir={sweep}", "cache.block_size=16,32",
            "trace.max_requests=20", *QUIET]
    r = _kvsim(*args, preexec_fn=_no_file_data)
    assert r.returncode == 1, r.stderr[-2000:]
    assert r.stderr.splitlines() == [
        f"kvsim: error: the file size limit (ulimit -f) is reached writing {sweep}/"
        f".kvsim_sweep_lock (EFBIG: File too large); expected room for the results: free space "
        f"(or pick another output.dir), then run the same command with "
        f"output.skip_completed=true"]
    r = _kvsim(*args, "output.skip_completed=true")
    assert r.returncode == 0, r.stderr[-2000:]
    _assert_labelled(sweep, tmp_path / "c", [16, 32])


# job 1's record (and, with FULL_LEDGER set, its ledger entries) meets a full disk
_FULL_FOR_JOB_1 = """
import errno, os, sys
import sim.hydra_record as R
import sim.sweep as S
write, record = R.write_whole, S.record_job

def write_whole(path, text):
    if f"{os.sep}1{os.sep}.hydra{os.sep}" in str(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    write(path, text)

def record_job(sweep, job, *args, **kwargs):
    return False if job == 1 and os.environ.get("FULL_LEDGER") else record(sweep, job, *args,
                                                                            **kwargs)

R.write_whole, S.record_job = write_whole, record_job
from sim.cli import main
sys.argv = ["kvsim", *sys.argv[1:]]
main()
"""


@pytest.mark.slow
def test_a_sweep_job_that_meets_a_full_disk_fails_alone_and_a_resume_completes_it(tmp_path):
    """In a sweep, the disk is full as Hydra writes job 1's record: job 1 fails with one line
    naming the file and is marked INCOMPLETE, jobs 0 and 2 complete, the sweep lists job 1 and
    exits 2. When the sweep's job ledger cannot record the failure either, the sweep ends with
    one line naming the job (exit 1). A resume completes every job, each with its settings."""
    grid = ["cache.block_size=16,32,64", "trace.max_requests=20", *QUIET]
    err = {}
    for name, env in (("sw", {}), ("sw_ledger", {"FULL_LEDGER": "1"})):
        sweep = tmp_path / name
        r = subprocess.run([sys.executable, "-c", _FULL_FOR_JOB_1, "-m", "hydra/launcher=basic",
                            f"hydra.sweep.dir={sweep}", *grid], cwd=REPO, capture_output=True,
                           text=True, timeout=300, env=dict(os.environ, **env))
        err[name] = (r.returncode, [ln for ln in r.stderr.splitlines() if "kvsim:" in ln])
        assert "Traceback" not in r.stderr
        assert "this run failed: no space left on the device writing " \
            f"{sweep}/1/.hydra/config.yaml" in (sweep / "1" / MARKER).read_text()
        assert list((sweep / "1" / ".hydra").iterdir()) == []
    why = (f"no space left on the device writing {tmp_path}/sw/1/.hydra/config.yaml (ENOSPC: "
           f"No space left on device); expected room for the results: free space (or pick "
           f"another output.dir), then run the same command with output.skip_completed=true")
    assert err["sw"] == (2, [f"kvsim: error: {why}; {tmp_path}/sw/1 is marked INCOMPLETE with "
                             f"it",
                             f"kvsim: sweep job 1 failed: {why}",
                             f"kvsim: 1 sweep job(s) failed; the other jobs completed (their "
                             f"job folders are in {tmp_path}/sw; their results too unless "
                             f"output.dir put them elsewhere)"]), err["sw"]
    rc, lines = err["sw_ledger"]
    assert rc == 1 and lines[-1] == (
        f"kvsim: error: sweep job 1 failed and the sweep's job ledger in {tmp_path}/sw_ledger "
        f"could not record it, so the sweep stops here: "
        f"{why.replace('/sw/', '/sw_ledger/')}"), lines
    for name in ("sw", "sw_ledger"):
        assert is_complete(tmp_path / name / "0") and is_complete(tmp_path / name / "2")
        r = _kvsim("-m", "hydra/launcher=basic", f"hydra.sweep.dir={tmp_path / name}", *grid,
                   "output.skip_completed=true")
        assert r.returncode == 0, r.stderr[-2000:]
        _assert_labelled(tmp_path / name, tmp_path / f"c_{name}", [16, 32, 64])


def _kill_after_first_table(cfg, out):
    """A run that SIGKILLs itself once its first table is in place (renamed to its
    ``.parquet`` name): a process killed while it writes its results."""
    real = os.replace

    def replace_then_die(src, dst, *args, **kwargs):
        real(src, dst, *args, **kwargs)
        if str(dst).endswith(".parquet"):
            os.kill(os.getpid(), signal.SIGKILL)

    os.replace = replace_then_die  # (this forked process only)
    run_simulation(cfg, out, overrides=["trace.max_requests=20"])


def test_a_run_killed_while_it_writes_is_incomplete_until_rerun(tmp_path):
    """SIGKILL between two table writes: the folder keeps its INCOMPLETE marker beside the
    tables already written, is not complete, is listed as failed; the rerun completes it."""
    import multiprocessing as mp

    cfg = compose_config(["trace.max_requests=20", "sim.progress=false"])
    out = tmp_path / "r"
    p = mp.get_context("fork").Process(target=_kill_after_first_table, args=(cfg, out))
    p.start()
    p.join(120)
    assert p.exitcode == -signal.SIGKILL
    assert (out / MARKER).exists() and (out / "requests.parquet").exists()
    assert not (out / "summary.json").exists() and not is_complete(out)
    assert "run interrupted or crashed" in C.collect(out, tmp_path / "c",
                                                  quiet=True).failed[0].failure
    run_simulation(cfg, out, overrides=["trace.max_requests=20"])
    assert is_complete(out, ["trace.max_requests=20"])


def test_out_of_memory_is_one_line_and_marks_the_folder(tmp_path):
    """A MemoryError in the simulation: one ``kvsim: error: out of memory`` line (exit 1),
    no traceback, the folder marked INCOMPLETE with it."""
    out = tmp_path / "r"
    code = ("import sys; import sim.engine as E\n"
            "def boom(self):\n    raise MemoryError()\n"
            "E.Simulator.run = boom\n"
            "from sim.cli import main\n"
            f"sys.argv = ['kvsim', 'output.dir={out}', 'sim.progress=false', "
            f"'trace.max_requests=5', *{list(SINGLE_ENGINE)!r}]\n"  # (Simulator.run: one engine)
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       timeout=120)
    assert r.returncode == 1, r.stderr[-1500:]
    assert "Traceback" not in r.stderr
    assert "kvsim: error: out of memory (MemoryError)" in r.stderr
    assert (out / MARKER).read_text().startswith("this run failed: out of memory")


def test_the_pool_memory_check_uses_the_memory_available(monkeypatch):
    """The pool's bookkeeping is checked against the memory available now (free memory and
    droppable caches, a cgroup's limit), not the machine's total."""
    import sim.hardware as H
    from sim.errors import ConfigError

    monkeypatch.setattr(H, "available_host_memory", lambda: 2**20)
    cfg = compose_config(["cache.num_gpu_blocks=100000"])
    with pytest.raises(ConfigError, match="GiB available; expected fewer blocks"):
        H.plan_memory(cfg.model, cfg.gpu, cfg.cache, cfg.scheduler, 1)


@contextlib.contextmanager
def _read_only(folder: Path):
    """``folder`` read-only while the block runs: without write permission, or, for root (who
    writes anywhere), a read-only bind mount (skipped where mount is not permitted)."""
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(folder)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chmod", "-R", "u+w", str(folder)])
        return
    if subprocess.run(["mount", "--bind", str(folder), str(folder)],
                      capture_output=True).returncode != 0:
        pytest.skip("needs a read-only folder: root here, and mount is not permitted")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)],
                          capture_output=True).returncode != 0:
            pytest.skip("needs a read-only folder: root here, and remount is not permitted")
        yield
    finally:
        subprocess.run(["umount", str(folder)])


@pytest.mark.slow
def test_skip_completed_skips_a_complete_run_in_a_read_only_folder(tmp_path):
    """``output.skip_completed=true`` on a complete run whose folder cannot be written (a
    read-only mount), an ``output.dir`` or a Hydra run folder, skips it (exit 0, "already
    complete", its results line) without writing; a run of other settings there is refused
    with one line."""
    out = tmp_path / "ro" / "r"
    run = tmp_path / "ro" / "h"
    out.parent.mkdir()
    run_simulation(compose_config(["trace.max_requests=20", "sim.progress=false"]), out,
                   overrides=["trace.max_requests=20"])
    assert _kvsim(f"hydra.run.dir={run}", "trace.max_requests=20", *QUIET).returncode == 0
    before = sorted((str(p), p.stat().st_mtime_ns) for p in out.parent.rglob("*"))
    with _read_only(out.parent):
        r = _kvsim(f"output.dir={out}", "trace.max_requests=20", "output.skip_completed=true",
                   *QUIET)
        again = _kvsim(f"output.dir={out}", "trace.max_requests=30", "output.skip_completed=true",
                       *QUIET)
        hydra_run = _kvsim(f"hydra.run.dir={run}", "trace.max_requests=20",
                           "output.skip_completed=true", *QUIET)
        hydra_again = _kvsim(f"hydra.run.dir={run}", "trace.max_requests=30",
                             "output.skip_completed=true", *QUIET)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == f"results: {out}"
    assert "already complete" in r.stderr + r.stdout
    assert again.returncode == 2 and "cannot create or write the folder" in again.stderr
    assert hydra_run.returncode == 0, hydra_run.stderr[-2000:]
    assert hydra_run.stdout.splitlines() == [f"results: {run}"]
    assert hydra_run.stderr.splitlines() == [f"kvsim: skipping {run}: already complete"]
    assert hydra_again.returncode == 2 and hydra_again.stderr.splitlines() == [
        f"kvsim: error: hydra.run.dir={run}: cannot create the run folder (OSError: Read-only "
        f"file system); expected a folder kvsim can create and write"] or os.geteuid() != 0
    assert sorted((str(p), p.stat().st_mtime_ns) for p in out.parent.rglob("*")) == before


def test_skip_completed_skips_a_complete_sweep_in_a_read_only_folder(tmp_path):
    """A sweep with ``output.skip_completed=true`` whose folder cannot be written and whose
    every job is complete, in its job folder or its own ``output.dir``: one "already complete"
    line, each job's results line, exit 0, nothing written; a grid with a job not run yet is
    refused with one line (exit 2)."""
    sweeps = {"jobs": [], "outs": [f"output.dir={tmp_path / 'ro' / 'res'}/${{hydra:job.num}}"]}
    grid = ["-m", "hydra/launcher=basic", "trace.max_requests=20", *QUIET]
    for name, extra in sweeps.items():
        r = _kvsim(*grid, f"hydra.sweep.dir={tmp_path / 'ro' / name}", "cache.block_size=16,32",
                   *extra)
        assert r.returncode == 0, r.stderr[-2000:]
    before = sorted((str(p), p.stat().st_mtime_ns) for p in (tmp_path / "ro").rglob("*"))
    with _read_only(tmp_path / "ro"):
        runs = {name: _kvsim(*grid, f"hydra.sweep.dir={tmp_path / 'ro' / name}",
                             "cache.block_size=16,32", "output.skip_completed=true", *extra)
                for name, extra in sweeps.items()}
        more = _kvsim(*grid, f"hydra.sweep.dir={tmp_path / 'ro' / 'jobs'}",
                      "cache.block_size=16,32,64", "output.skip_completed=true")
    for name, r in runs.items():
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stderr.splitlines() == [f"kvsim: skipping the sweep into {tmp_path / 'ro' / name}:"
                                         f" its 2 job(s) are already complete"]
        folders = tmp_path / "ro" / ("jobs" if name == "jobs" else "res")
        assert r.stdout.splitlines() == [f"results: {folders / '0'}", f"results: {folders / '1'}"]
    assert more.returncode == 2 and "cannot create the sweep folder" in more.stderr
    assert sorted((str(p), p.stat().st_mtime_ns) for p in (tmp_path / "ro").rglob("*")) == before


def test_skip_completed_with_a_folder_setting_that_does_not_resolve_is_one_line(tmp_path):
    """``output.skip_completed=true`` with a results or sweep folder whose interpolation does
    not resolve: the interpolation's one error line (exit 2), as without skip_completed."""
    for args in (["output.dir=${oc.env:KVSIM_NOT_SET}"],
                 ["-m", "hydra.sweep.dir=${oc.env:KVSIM_NOT_SET}", "seed=1,2"]):
        r = _kvsim(*args, "trace.max_requests=20", "output.skip_completed=true", *QUIET)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        (line,) = r.stderr.splitlines()
        assert line.startswith("kvsim: error: ") and "cannot resolve the interpolation" in line


# --- labels, collections, caches ----------------------------------------------------------------

@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    """Two complete ``output.dir`` runs, ``a`` (block size 16) and ``b`` (32)."""
    root = tmp_path_factory.mktemp("runs")
    for name, bs in (("a", 16), ("b", 32)):
        ov = ["trace.max_requests=20", f"cache.block_size={bs}"]
        run_simulation(compose_config([*ov, "sim.progress=false"]), root / name, overrides=ov)
    return root


def test_collect_lists_a_run_whose_record_and_results_are_two_runs(two_runs, tmp_path):
    """A folder whose config record (config.yaml, .hydra/overrides.yaml) and summary.json come
    from two runs (a process that wrote into a folder another run had taken) is listed as
    failed naming the files, never collected under the wrong labels; output.skip_completed
    reruns it."""
    from sim.folders import config_fingerprint

    root = tmp_path / "res"
    shutil.copytree(two_runs, root)
    shutil.copy(root / "b" / "config.yaml", root / "a" / "config.yaml")
    (root / "b" / ".hydra").mkdir()
    (root / "b" / ".hydra" / "overrides.yaml").write_text(
        "- trace.max_requests=20\n- cache.block_size=64\n")
    res = C.collect(root, tmp_path / "c", quiet=True)
    assert res.runs.empty
    why = {r.run_id: r.failure for r in res.failed}
    assert "config.yaml is not the config of the run that wrote summary.json" in why["a"]
    assert ".hydra/overrides.yaml (trace.max_requests=20 cache.block_size=64) and summary.json's " \
           "overrides (trace.max_requests=20 cache.block_size=32) differ" in why["b"]
    cfg = compose_config(["trace.max_requests=20", "cache.block_size=16"])
    ov = ["trace.max_requests=20", "cache.block_size=16"]
    assert is_complete(two_runs / "a", ov, fingerprint=config_fingerprint(cfg))
    assert not is_complete(two_runs / "a", ov, fingerprint=config_fingerprint(
        compose_config(["trace.max_requests=20", "cache.block_size=32"])))


def test_collect_removes_a_killed_collects_folders_and_refuses_a_concurrent_one(two_runs,
                                                                               tmp_path):
    """The temporary folders a killed kvsim-collect left beside its output are removed by the
    next one; a kvsim-collect into an output another one is writing stops with one line."""
    from sim.locks import hold

    out = tmp_path / "c"
    for leftover in (".c.tmp-999999", ".c.old-999998"):
        (tmp_path / leftover / "requests").mkdir(parents=True)
    res = C.collect(two_runs, out, quiet=True)
    assert len(res.runs) == 2 and not res.failed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    with hold(tmp_path / ".c.lock"):
        with pytest.raises(C.CollectError, match=f"{out}: another kvsim-collect \\(process "
                                                 f"{os.getpid()} on "):
            C.collect(two_runs, out, quiet=True)
    assert C.main([str(two_runs), "--out", str(out)]) == 0


NUMBA_MODULE = '''
from sim.jit import kernel


@kernel("i8(i8)")
def plus_one(x):
    return x + 1
'''


def test_a_damaged_numba_cache_file_is_named_and_rebuilt(tmp_path):
    """A kernel's cached machine code with a flipped bit, then an empty cache index: each
    gives one ``kvsim:`` line naming the file and a kernel compiled again with the right
    result; the next process loads the rewritten files silently."""
    (tmp_path / "mod").mkdir()
    (tmp_path / "mod" / "nbmod.py").write_text(NUMBA_MODULE)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join([str(tmp_path / "mod"), str(REPO)]))
    cmd = [sys.executable, "-c", "import nbmod; print(nbmod.plus_one(41))"]

    def run():
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == "42", r.stderr[-2000:]
        return [ln for ln in r.stderr.splitlines() if "is damaged" in ln]

    assert run() == []
    (data,) = (tmp_path / "cache").rglob("nbmod.plus_one-*.kvsim.1.nbc")
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x10
    data.write_bytes(bytes(raw))
    (line,) = run()
    assert line.startswith(f"kvsim: numba's cache file {data} of the compiled kernel plus_one is "
                           f"damaged (its bytes are not those written")
    (index,) = (tmp_path / "cache").rglob("nbmod.plus_one-*.kvsim.nbi")
    index.write_bytes(b"")
    (line,) = run()
    assert f"{index} of the compiled kernel plus_one is damaged (it is empty)" in line
    assert run() == []


def test_kernels_run_as_python_under_numba_disable_jit(tmp_path):
    """``NUMBA_DISABLE_JIT=1`` (numba's debugging switch) runs the simulator in pure Python
    with the compiled run's results, bit for bit."""
    ov = ["trace.max_requests=20", "sim.progress=false"]
    run_simulation(compose_config(ov), tmp_path / "jit", overrides=ov[:1])
    r = _kvsim(f"output.dir={tmp_path / 'py'}", *ov, "output.print_summary=false",
               env=dict(os.environ, NUMBA_DISABLE_JIT="1"))
    assert r.returncode == 0 and r.stderr == "", r.stderr[-2000:]
    for table in ("requests", "steps"):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "jit" / f"{table}.parquet"),
                                      pd.read_parquet(tmp_path / "py" / f"{table}.parquet"),
                                      check_exact=True)


def test_a_slurm_sweep_without_slurm_is_one_line(monkeypatch):
    """``-m hydra/launcher=slurm`` where SLURM's srun is not on the PATH: one line saying so
    (the launcher ended with submitit's traceback)."""
    import shutil as sh

    from sim.cli.overrides import missing_cluster

    monkeypatch.setattr(sh, "which", lambda name: None)
    assert missing_cluster(["hydra/launcher=slurm", "seed=1,2"]) == (
        "hydra/launcher=slurm: this host has no SLURM (srun is not on the PATH); expected to run "
        "the sweep on a SLURM login node, or on this machine with hydra/launcher=local")
    assert missing_cluster(["hydra/launcher=local"]) is None
    monkeypatch.setattr(sh, "which", lambda name: "/usr/bin/srun")
    assert missing_cluster(["hydra/launcher=slurm"]) is None
