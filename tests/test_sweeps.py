"""Sweeps end to end: a 6-run local multirun, kill-and-resume with ``output.skip_completed=true``,
``kvsim-collect`` of a real sweep (Parquet outputs read by pandas, pyarrow and DuckDB when
installed; failed runs listed), ``kvsim-plot`` on its collection, and what a sweep reports of
rejected jobs, stale job folders, swept policies' options and a shared ``output.dir``.

Kept light for 2 shared cores: small trace slices, at most 2 worker processes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from experiments import collect as C
from experiments import plots as P

REPO = Path(__file__).resolve().parent.parent
KVSIM = [sys.executable, "-m", "sim.cli"]
GRID = ["cache.block_size=16,32", "scheduler.max_num_seqs=64,128,256"]  # 6 runs
QUIET = ["sim.progress=false", "output.print_summary=false"]


def _kvsim(*args, timeout=300, check=True):
    r = subprocess.run([*KVSIM, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"kvsim {' '.join(args)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}")
    return r


def _summaries(sweep: Path) -> dict[str, Path]:
    return {p.parent.name: p for p in sweep.glob("*/summary.json")}


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    """A completed 6-run joblib multirun (2 workers) of the bundled slice, 100 requests each."""
    d = tmp_path_factory.mktemp("sweep") / "sw"
    _kvsim("-m", "hydra/launcher=local", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={d}",
           *GRID, "trace.max_requests=100", *QUIET)
    return d


@pytest.fixture(scope="module")
def collected(sweep_dir, tmp_path_factory) -> C.CollectResult:
    return C.collect(sweep_dir, tmp_path_factory.mktemp("col") / "collected", quiet=True)


# --- multirun, kill, resume -----------------------------------------------------------------------


def test_joblib_multirun_completes_six_runs(sweep_dir):
    sums = _summaries(sweep_dir)
    assert sorted(sums) == [str(i) for i in range(6)]
    for name, p in sums.items():
        s = json.loads(p.read_text())
        assert s["complete"] is True and s["requests_total"] == 100
        assert not (p.parent / "INCOMPLETE").exists()
        ov = (p.parent / ".hydra" / "overrides.yaml").read_text()
        assert "cache.block_size=" in ov and "scheduler.max_num_seqs=" in ov


@pytest.mark.slow
def test_killed_sweep_resumes_only_missing_runs(tmp_path):
    """Start a 6-run sweep, SIGKILL its whole process group once the first run has completed,
    rerun the same command with output.skip_completed=true into the same sweep dir: every run
    ends complete, the runs completed before the kill are untouched (same bytes, same mtime) and
    logged as skipped, and the others were run by the second invocation."""
    sweep = tmp_path / "sw"
    args = ["-m", "hydra/launcher=local", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}",
            *GRID, "trace.max_requests=800", *QUIET]
    proc = subprocess.Popen([*KVSIM, *args], cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        # wait for a complete run (summary.json is renamed into place just before the marker
        # is removed: a run killed between the two is incomplete)
        while not any(C.read_run(p.parent, sweep, 0).complete for p in _summaries(sweep).values()):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"sweep ended (rc={proc.returncode}) or timed out before any run completed")
            time.sleep(0.02)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its joblib workers
        except ProcessLookupError:
            pass
        proc.wait(timeout=60)
    time.sleep(0.5)  # let orphaned workers (if any escaped the group) notice
    before = {k: (p.stat().st_mtime_ns, p.read_bytes()) for k, p in _summaries(sweep).items()
              if C.read_run(p.parent, sweep, 0).complete}
    assert 1 <= len(before) < 6, f"kill came too late: {sorted(before)} complete"
    started = sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    interrupted = [d for d in started if d not in before]
    for d in interrupted:  # a killed run holds the marker (and no summary unless killed
        # between writing its summary and removing the marker)
        assert (sweep / d / "INCOMPLETE").exists() or not (sweep / d / "summary.json").exists()

    # the collection of the interrupted sweep lists the unfinished runs and the jobs that never
    # started (the sweep's plan) and keeps them out
    res = C.collect(sweep, tmp_path / "col1", quiet=True)
    assert sorted(res.runs["run_id"]) == sorted(before)
    never = [str(i) for i in range(6) if str(i) not in started]
    assert sorted(r.run_id for r in res.failed) == sorted(interrupted + never)
    assert all(r.failure.startswith("never ran") for r in res.failed if r.run_id in never)
    assert set(pd.read_csv(tmp_path / "col1" / "failed_runs.csv")["run_id"].astype(str)) == \
        set(interrupted + never)

    t_resume = time.time_ns()
    _kvsim(*args, "output.skip_completed=true")
    after = _summaries(sweep)
    assert sorted(after) == [str(i) for i in range(6)]
    for k, p in after.items():
        assert C.read_run(p.parent, sweep, 0).complete, k
        log = (p.parent / "cli.log").read_text()
        if k in before:
            assert (p.stat().st_mtime_ns, p.read_bytes()) == before[k], f"run {k} was rerun"
            assert log.count("already complete") == 1, log
        else:
            assert p.stat().st_mtime_ns >= t_resume, f"run {k} was not run by the resume"
            assert "already complete" not in log
    res = C.collect(sweep, tmp_path / "col2", quiet=True)
    assert len(res.runs) == 6 and not res.failed

    # a second resume does nothing: everything is skipped
    mt = {k: p.stat().st_mtime_ns for k, p in after.items()}
    _kvsim(*args, "output.skip_completed=true")
    assert {k: p.stat().st_mtime_ns for k, p in _summaries(sweep).items()} == mt


# --- collect ------------------------------------------------------------------------------------


def test_collect_runs_table(collected, sweep_dir):
    runs = collected.runs.sort_values("job")
    assert list(runs["job"]) == list(range(6))
    assert collected.override_keys == ["cache.block_size", "scheduler.max_num_seqs", "trace.max_requests"]
    assert list(runs["cache.block_size"]) == [16, 16, 16, 32, 32, 32]
    assert list(runs["scheduler.max_num_seqs"]) == [64, 128, 256] * 2
    assert runs["cache.block_size"].dtype.kind == "i"
    # group choices and summary leaves, flattened with dots; name clashes get "summary."
    assert set(runs["trace"]) == {"mooncake_conversation_10min"}
    assert set(runs["summary.trace"]) == {"mooncake_conversation_10min"}
    assert set(runs["summary.model"]) == {"Qwen3-8B"}
    for c in ("ttft_s.p50", "ttft_s.p99", "wall.wall_s", "memory_gib.kv_pool", "requests_total"):
        assert c in runs.columns, c
    for _, r in runs.iterrows():
        s = json.loads((sweep_dir / r["run_id"] / "summary.json").read_text())
        assert r["ttft_s.p50"] == pytest.approx(s["ttft_s"]["p50"])
        assert r["prefix_hit_ratio"] == pytest.approx(s["prefix_hit_ratio"])
    on_disk = pd.read_parquet(collected.out_dir / "runs.parquet")
    assert len(on_disk) == 6
    m = json.loads((collected.out_dir / "manifest.json").read_text())
    assert m["runs_complete"] == 6 and m["runs_failed"] == 0 and m["tables"]["requests"] == 600
    assert pd.read_csv(collected.out_dir / "failed_runs.csv").empty


def test_collect_requests_dataset_pandas_and_pyarrow(collected, sweep_dir):
    req = pd.read_parquet(collected.out_dir / "requests")
    assert len(req) == 600
    assert {"run_id", "job", "cache.block_size", "scheduler.max_num_seqs", "ttft_s"} <= set(req.columns)
    assert "output.print_summary" not in req.columns and "sim.progress" not in req.columns
    dset = ds.dataset(collected.out_dir / "requests", partitioning="hive")
    t = dset.to_table(filter=ds.field("job") == 4)
    assert t.num_rows == 100
    one = t.to_pandas()
    assert set(one["cache.block_size"]) == {32} and set(one["scheduler.max_num_seqs"]) == {128}
    orig = pd.read_parquet(sweep_dir / "4" / "requests.parquet")
    pd.testing.assert_series_equal(one.sort_values("request_id")["ttft_s"].reset_index(drop=True),
                                   orig.sort_values("request_id")["ttft_s"].reset_index(drop=True))
    steps = pd.read_parquet(collected.out_dir / "steps")
    assert len(steps) == sum(len(pd.read_parquet(p)) for p in sweep_dir.glob("*/steps.parquet"))


def test_collect_readable_with_duckdb(collected):
    duckdb = pytest.importorskip("duckdb")
    glob = str(collected.out_dir / "requests" / "*" / "*.parquet")
    rows = duckdb.sql(
        f"SELECT job, count(*) AS n, min(\"cache.block_size\") AS bs FROM "
        f"read_parquet('{glob}', hive_partitioning=true) GROUP BY job ORDER BY job").fetchall()
    assert rows == [(j, 100, 16 if j < 3 else 32) for j in range(6)]


def test_collect_lists_failed_runs_and_keeps_them_out(sweep_dir, tmp_path):
    sw = tmp_path / "sw"
    shutil.copytree(sweep_dir, sw, ignore=shutil.ignore_patterns("collected"))
    (sw / "1" / "INCOMPLETE").write_text("x\n")
    (sw / "2" / "summary.json").unlink()
    s = json.loads((sw / "3" / "summary.json").read_text())
    s["complete"] = False
    (sw / "3" / "summary.json").write_text(json.dumps(s))
    (sw / "5" / "summary.json").write_text("{not json")
    r = subprocess.run([sys.executable, "-m", "experiments.collect", str(sw), "--out", str(tmp_path / "c"),
                        "--strict"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 1, r.stderr
    assert "4 of 6 runs did not complete" in r.stderr and str(sw / "2") in r.stderr
    runs = pd.read_parquet(tmp_path / "c" / "runs.parquet")
    assert sorted(runs["run_id"]) == ["0", "4"]
    assert sorted(pd.read_parquet(tmp_path / "c" / "requests")["run_id"].unique()) == ["0", "4"]
    failed = {str(f["run_id"]): f["reason"] for f in
              json.loads((tmp_path / "c" / "failed_runs.json").read_text())}
    assert set(failed) == {"1", "2", "3", "5"}
    assert "INCOMPLETE" in failed["1"] and "no summary.json" in failed["2"]
    assert "complete=False" in failed["3"] and "unreadable" in failed["5"]
    csv = pd.read_csv(tmp_path / "c" / "failed_runs.csv")
    assert sorted(csv["run_id"].astype(str)) == ["1", "2", "3", "5"]


def test_collect_unifies_table_schemas(sweep_dir, tmp_path):
    """A run whose table lacks a column (older schema) gets nulls, not a broken dataset. (The
    tables are rewritten: the runs' summaries list no output_files, as an older kvsim wrote
    them, else the digest check fails them.)"""
    sw = tmp_path / "sw"
    shutil.copytree(sweep_dir, sw, ignore=shutil.ignore_patterns("collected"))
    for run in ("0", "1"):
        s = json.loads((sw / run / "summary.json").read_text())
        del s["output_files"]
        (sw / run / "summary.json").write_text(json.dumps(s))
    t = pq.read_table(sw / "0" / "requests.parquet").drop_columns(["prefix_hit_tokens"])
    pq.write_table(t, sw / "0" / "requests.parquet")
    t = pq.read_table(sw / "1" / "requests.parquet")
    pq.write_table(t.append_column("new_metric", pa.array([7] * t.num_rows, pa.int64())),
                   sw / "1" / "requests.parquet")
    C.collect(sw, tmp_path / "c", quiet=True)
    req = pd.read_parquet(tmp_path / "c" / "requests")
    assert len(req) == 600
    j0, j1 = req[req["job"] == 0], req[req["job"] == 1]
    assert j0["prefix_hit_tokens"].isna().all() and j1["prefix_hit_tokens"].notna().all()
    assert (j1["new_metric"] == 7).all() and j0["new_metric"].isna().all()


def test_collect_bad_sweep_dir_names_the_path(tmp_path):
    missing = tmp_path / "nope"
    r = subprocess.run([sys.executable, "-m", "experiments.collect", str(missing)], cwd=REPO,
                       capture_output=True, text=True)
    assert r.returncode == 2 and str(missing) in r.stderr and "no such sweep directory" in r.stderr
    empty = tmp_path / "empty"
    (empty / "sub").mkdir(parents=True)
    with pytest.raises(C.CollectError, match="no kvsim run directories"):
        C.collect(empty)
    bad = tmp_path / "bad" / "0"
    (bad / ".hydra").mkdir(parents=True)
    (bad / ".hydra" / "overrides.yaml").write_text("[unclosed\n")
    with pytest.raises(C.CollectError, match=str(bad / ".hydra" / "overrides.yaml")):
        C.collect(tmp_path / "bad")


def test_collect_single_run_dir(tmp_path):
    run = tmp_path / "run"
    _kvsim(f"output.dir={run}", f"hydra.run.dir={tmp_path / 'hy'}", "trace.max_requests=20", *QUIET)
    res = C.collect(run, tmp_path / "c", quiet=True)
    assert len(res.runs) == 1 and res.runs["requests_total"].iloc[0] == 20
    assert res.runs["cache.block_size"].iloc[0] == 16  # from the run's config.yaml


def test_collect_replaces_previous_collection(collected, sweep_dir):
    (collected.out_dir / "stale.txt").write_text("old\n")
    C.collect(sweep_dir, collected.out_dir, quiet=True)
    assert not (collected.out_dir / "stale.txt").exists()
    assert not list(collected.out_dir.parent.glob(".collected.*"))


# --- plots --------------------------------------------------------------------------------------


def test_plot_cli_from_collected_sweep(collected, tmp_path):
    d = str(collected.out_dir)
    by = "cache.block_size,scheduler.max_num_seqs"
    for fig, extra in [("ttft-cdf", ["--by", by]), ("ttft-decomposition", ["--by", by, "--tail", "0.9"]),
                       ("pool-fragmentation", ["--by", by]),
                       ("ttft-vs", ["--x", "scheduler.max_num_seqs", "--hue", "cache.block_size"])]:
        out = tmp_path / f"{fig}.png"
        assert P.main([fig, d, "--out", str(out), *extra]) == 0
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    out = tmp_path / "filtered.png"
    assert P.main(["ttft-cdf", d, "--by", "scheduler.max_num_seqs", "--where", "cache.block_size=32",
                   "--out", str(out)]) == 0


def test_plot_errors_name_the_problem(collected, tmp_path, capsys):
    d = str(collected.out_dir)
    assert P.main(["ttft-vs", d, "--x", "cache.block_size", "--hue", "trace", "--out", str(tmp_path / "a.png")]) == 2
    assert "several runs share" in capsys.readouterr().err
    assert P.main(["ttft-cdf", d, "--by", "no_such_column", "--out", str(tmp_path / "b.png")]) == 2
    assert "no_such_column" in capsys.readouterr().err
    assert P.main(["bytes-moved", d, "--out", str(tmp_path / "c.png")]) == 2
    assert "rounds" in capsys.readouterr().err
    assert P.main(["ttft-cdf", str(collected.out_dir.parent), "--out", str(tmp_path / "d.png")]) == 2
    assert "runs.parquet" in capsys.readouterr().err



def test_sweep_rerun_with_a_smaller_grid_leaves_the_old_jobs_out(tmp_path):
    """A 3-job sweep, then a 2-job sweep (with a rejected job) into the same directory: job 2
    of the first sweep is neither collected nor reported as this sweep's failure."""
    sweep = tmp_path / "sw"
    base = ["-m", "hydra/launcher=local", "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={sweep}",
            *QUIET]
    _kvsim(*base, "trace.max_requests=10,20,30")
    (sweep / "2" / "INCOMPLETE").write_text("this run failed: an old failure\n")
    r = _kvsim(*base, "trace.max_requests=10,15", check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "an old failure" not in r.stderr
    res = C.collect(sweep, tmp_path / "c", quiet=True)
    assert sorted(res.runs["trace.max_requests"]) == [10, 15] and not res.failed
    man = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert man["stale_run_dirs"] == ["2"]


def test_stale_jobs_in_nested_sweep_subdirs(tmp_path):
    """Job directories nested by hydra.sweep.subdir (bs16/s1) are matched against the sweep
    directory's id, not their parent folder's."""
    sweep = tmp_path / "sw"
    base = ["-m", "hydra/launcher=local", "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={sweep}",
            "hydra.sweep.subdir=bs${cache.block_size}/s${trace.max_requests}", *QUIET]
    _kvsim(*base, "cache.block_size=16", "trace.max_requests=10,20")
    (sweep / "bs16" / "s20" / "INCOMPLETE").write_text("this run failed: an old failure\n")
    r = _kvsim(*base, "cache.block_size=16", "trace.max_requests=10", check=False)
    assert r.returncode == 0 and "an old failure" not in r.stderr, r.stderr[-2000:]
    res = C.collect(sweep, tmp_path / "c", quiet=True)
    assert list(res.runs["run_id"]) == ["bs16/s10"] and not res.failed
    man = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert man["stale_run_dirs"] == ["bs16/s20"]


def test_multirun_with_a_rejected_job_exits_2_and_collect_names_the_error(tmp_path):
    """A sweep whose grid holds an impossible value runs the other jobs, then exits 2 listing
    the failed job; kvsim-collect gives the job's own error as the failure reason."""
    sweep = tmp_path / "sw"
    r = _kvsim("-m", "hydra/launcher=local", "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={sweep}",
               "trace.max_requests=20", "cache.block_size=7,16", *QUIET, check=False)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "sweep job 0 failed: cache.block_size=7" in r.stderr
    assert C.read_run(sweep / "1", sweep, 1).complete
    res = C.collect(sweep, tmp_path / "c", quiet=True)
    (f,) = res.failed
    assert f.run_id == "0" and "cache.block_size=7; expected a power of two" in f.failure


def test_a_sweep_over_policies_takes_an_option_every_policy_reads(tmp_path):
    """kvsim -m policy=random,triattention policy.budget=512: the option is composed beside the
    swept policy (the policy group's schema holds every policy's options) and each job runs
    its policy with it."""
    sweep = tmp_path / "sw"
    r = _kvsim("-m", "hydra/launcher=local", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}",
               "policy=random,triattention", "policy.budget=512", "trace.max_requests=3", *QUIET)
    runs = {C.read_run(sweep / n, sweep, int(n)).config["policy"]["name"]:
            C.read_run(sweep / n, sweep, int(n)) for n in ("0", "1")}
    assert sorted(runs) == ["random", "triattention"], r.stderr[-2000:]
    for run in runs.values():
        assert run.complete and run.config["policy"]["budget"] == 512


def test_a_sweeps_policy_option_runs_the_full_baseline_without_it(tmp_path):
    """kvsim -m policy=full,h2o policy.heavy_ratio=0.3: full, the dense baseline, reads no
    option; its job runs without the option and says so, the h2o job runs with it."""
    sweep = tmp_path / "sw"
    r = _kvsim("-m", "hydra/launcher=local", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}",
               "policy=full,h2o", "policy.heavy_ratio=0.3", "trace.max_requests=3", *QUIET)
    assert ("kvsim: note: policy.heavy_ratio applies to a compression policy's rounds; "
            "policy=full keeps every token and runs none: it changes nothing") in r.stderr
    for n, name in (("0", "full"), ("1", "h2o")):
        run = C.read_run(sweep / n, sweep, int(n))
        assert run.complete and run.config["policy"]["name"] == name
    assert json.loads((sweep / "1" / "summary.json").read_text())["policy"] == "h2o"


def test_a_sweeps_policy_option_a_swept_policy_does_not_read_is_an_error_before_any_job(tmp_path):
    """kvsim -m policy=h2o,tova policy.heavy_ratio=0.3 (tova does not read heavy_ratio), or an
    option no policy of the sweep reads, is exit 2 with one line naming the option and the
    policies, before any job runs or any folder is made (Hydra too checks every job's
    composition before it launches one)."""
    sweep = tmp_path / "sw"
    r = _kvsim("-m", f"hydra.sweep.dir={sweep}", "policy=h2o,tova", "policy.heavy_ratio=0.3",
               "trace.max_requests=3", *QUIET, check=False)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == (
        "kvsim: error: policy.heavy_ratio=0.3: policy=tova of this sweep does not read "
        "heavy_ratio (read by policy=h2o); expected policy options that every policy of the "
        "sweep reads (policy=full, the dense baseline, runs without them), or one sweep per "
        "policy")
    assert not sweep.exists()
    r = _kvsim("-m", f"hydra.sweep.dir={sweep}", "seed=1,2", "policy.importance.sigma=2",
               "trace.max_requests=3", *QUIET, check=False)
    assert r.returncode == 2 and not sweep.exists(), r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1].startswith(
        "kvsim: error: policy.importance.sigma=2.0: no policy of this sweep reads importance "
        "(read by policy=ada_kv, h2o, ")


def test_multirun_with_per_job_output_dirs_reports_a_rejected_job(tmp_path):
    """With per-job output.dir folders a rejected job's INCOMPLETE marker sits in its output.dir,
    outside the sweep folder; the sweep's report follows each job folder's pointer to its
    results: exit 2 naming the job. With every job rejected it says that no job completed."""
    sweep = tmp_path / "sw"
    per_job = str(tmp_path / "res" / "${hydra:job.num}")
    r = _kvsim("-m", "hydra/launcher=local", "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={sweep}",
               "trace.max_requests=20", "cache.block_size=16,7", f"output.dir={per_job}", *QUIET,
               check=False)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "sweep job 1 failed: cache.block_size=7" in r.stderr
    assert "1 sweep job(s) failed; the other jobs completed" in r.stderr
    assert (tmp_path / "res" / "0" / "summary.json").is_file()
    r = _kvsim("-m", "hydra/launcher=local", "hydra.launcher.n_jobs=1",
               f"hydra.sweep.dir={tmp_path / 'sw2'}", "trace.max_requests=20",
               "cache.block_size=7,9", f"output.dir={str(tmp_path / 'res2' / '${hydra:job.num}')}",
               *QUIET, check=False)
    assert r.returncode == 2 and "2 sweep job(s) failed; no job completed" in r.stderr, r.stderr[-2000:]


# --- output.dir across jobs and runs ---------------------------------------------------------------

@pytest.mark.slow
def test_multirun_jobs_sharing_one_output_dir_fail_clearly(tmp_path):
    """``kvsim -m ... output.dir=X``: the first job to start holds X; another job of the same sweep
    fails with one line naming the job that holds it, and the sweep exits 2. Collecting the
    sweep folder counts both jobs; a sweep ends with a line saying how to collect it; a
    per-job folder (${hydra:job.num}) works, also when the sweep is run again; a single run
    into a job's folder is refused; a job folder another sweep took since is a failed job."""
    shared = tmp_path / "od"
    r = _kvsim("-m", "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={tmp_path / 'sw'}",
               "cache.block_size=16,32", "trace.max_requests=20", f"output.dir={shared}", *QUIET,
               check=False)
    assert r.returncode == 2, r.stderr[-2000:]
    assert (f"kvsim: sweep job 1 failed: output.dir={shared} is also the output folder of job 0 of "
            "this multirun") in r.stderr
    assert "Traceback" not in r.stderr
    assert json.loads((shared / "summary.json").read_text())["block_size"] == 16
    # collecting the sweep folder counts both jobs: job 0's results through its
    # pointer to output.dir, job 1 failed with its overrides (its marker records them)
    res = C.collect(tmp_path / "sw", tmp_path / "c", quiet=True)
    assert list(res.runs["run_id"]) == ["0"] and res.runs["cache.block_size"].tolist() == [16]
    assert res.runs["run_dir"].tolist() == [str(shared.resolve())]
    (f,) = res.failed
    assert f.run_id == "1" and f.overrides == ["cache.block_size=32", "trace.max_requests=20"]
    assert "is also the output folder of job 0" in f.failure and "overrides:" not in f.failure
    # with parallel workers, a job finding the folder claimed by another job of its sweep
    # names that job as a job of this multirun
    r = _kvsim("-m", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={tmp_path / 'swp'}",
               "cache.block_size=16,32", "trace.max_requests=20", f"output.dir={tmp_path / 'odp'}",
               *QUIET, check=False)
    assert r.returncode == 2, r.stderr[-2000:]
    assert re.search(r"output\.dir=\S+ is also the output folder of job [01] of this multirun",
                     r.stderr), r.stderr[-2000:]
    per_job = str(tmp_path / "pj_${hydra:job.num}")
    r = _kvsim("-m", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={tmp_path / 'sw2'}",
               "cache.block_size=16,32", "trace.max_requests=20", f"output.dir={per_job}", *QUIET)
    # a sweep ends with a line saying where its jobs are and how to collect them
    assert r.stderr.rstrip().endswith(f"kvsim: sweep done: 2 job(s) in {tmp_path / 'sw2'}; collect "
                                      f"their results with `kvsim-collect {tmp_path / 'sw2'}`")
    assert [json.loads((tmp_path / f"pj_{k}" / "summary.json").read_text())["block_size"]
            for k in (0, 1)] == [16, 32]
    # re-running the same sweep into the same folders is this sweep's jobs again: allowed
    _kvsim("-m", "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={tmp_path / 'sw2'}",
           "cache.block_size=16,32", "trace.max_requests=20", f"output.dir={per_job}", *QUIET)
    res = C.collect(tmp_path / "sw2", tmp_path / "c2", quiet=True)
    assert res.runs["cache.block_size"].tolist() == [16, 32] and not res.failed
    # a later single run into job 1's folder is refused, the folder left as it was
    before = (tmp_path / "pj_1" / "summary.json").read_bytes()
    r = _kvsim(f"output.dir={tmp_path / 'pj_1'}", "trace.max_requests=10", *QUIET, check=False)
    assert r.returncode == 2 and "holds the results of job 1 of the sweep in" in r.stderr, r.stderr
    assert (tmp_path / "pj_1" / "summary.json").read_bytes() == before
    # another sweep's job that took job 1's folder since: the pointer no longer leads
    (tmp_path / "pj_1" / ".kvsim_sweep_id").write_text("1-1\n")
    res = C.collect(tmp_path / "sw2", tmp_path / "c3", quiet=True)
    assert res.runs["cache.block_size"].tolist() == [16]
    (f,) = res.failed
    assert f.run_id == "1" and "now holds another run" in f.failure


def test_a_stopped_sweeps_unmarked_job_folders_are_marked_incomplete(tmp_path):
    """A sweep stopped by Ctrl-C or SIGTERM marks INCOMPLETE, with the job's overrides, each
    job folder its worker left without a marker (Hydra had made it, the simulation had not
    started); a job already marked, a complete one, one whose results went to its output.dir
    and a folder that is no job's are left as they are."""
    import json

    from sim.folders import FAILED_PREFIX, OVERRIDES_PREFIX, RESULTS_POINTER
    from sim.run import compose_config, run_simulation
    from sim.sweep import mark_stopped_jobs

    sweep = tmp_path / "sw"
    (sweep / "0" / ".hydra").mkdir(parents=True)
    (sweep / "0" / ".hydra" / "overrides.yaml").write_text("- cache.block_size=16\n- output.dir=x\n")
    (sweep / "0" / "cli.log").write_text("")
    (sweep / "1").mkdir()
    (sweep / "1" / "cli.log").write_text("")
    (sweep / "1" / "INCOMPLETE").write_text("this run has not completed\n")
    run_simulation(compose_config(["sim.progress=false", "trace.max_requests=5"]), sweep / "2")
    (sweep / "3").mkdir()
    (sweep / "3" / "cli.log").write_text("")
    (sweep / "3" / RESULTS_POINTER).write_text("/elsewhere\n")
    (sweep / "notes").mkdir()
    assert mark_stopped_jobs(sweep) == ["0"]
    first, second = (sweep / "0" / "INCOMPLETE").read_text().splitlines()
    assert first.startswith(FAILED_PREFIX) and "stopped before" in first
    assert json.loads(second[len(OVERRIDES_PREFIX):]) == ["cache.block_size=16"]
    assert (sweep / "1" / "INCOMPLETE").read_text() == "this run has not completed\n"
    assert not (sweep / "2" / "INCOMPLETE").exists()
    assert not (sweep / "3" / "INCOMPLETE").exists() and not (sweep / "notes" / "INCOMPLETE").exists()
