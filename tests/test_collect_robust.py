"""``kvsim-collect`` and ``kvsim-plot`` on damaged or inconsistent sweeps: a job directory without
its ``.hydra/`` folder, a column whose type differs between runs, a truncated or corrupt per-run
table, and an ``--out`` whose extension matplotlib cannot write.

One tiny 2-job sweep (10 requests per run) is run once per module and copied into each test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from experiments import collect as C
from experiments import plots as P
from experiments.collect_tables import parse_override_value

REPO = Path(__file__).resolve().parent.parent
QUIET = ["sim.progress=false", "output.print_summary=false"]


@pytest.fixture(scope="module")
def base_sweep(tmp_path_factory) -> Path:
    """Jobs 0 and 1 (seed 0 and 1) of ``trace.max_requests=10 codec=identity``."""
    d = tmp_path_factory.mktemp("robust") / "sw"
    env = dict(os.environ)
    env.setdefault("KVSIM_TRACES_DIR", str(REPO.parent / "shared" / "traces"))
    r = subprocess.run([sys.executable, "-m", "sim.cli", "-m", "hydra/launcher=local",
                        "hydra.launcher.n_jobs=1", f"hydra.sweep.dir={d}", "trace.max_requests=10",
                        "codec=identity", "seed=0,1", *QUIET],
                       cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (d / "0" / "summary.json").is_file() and (d / "1" / "summary.json").is_file()
    return d


@pytest.fixture
def sweep(base_sweep, tmp_path) -> Path:
    """A private copy of the 2-job sweep (dotfiles included)."""
    sw = tmp_path / "sw"
    shutil.copytree(base_sweep, sw, ignore=shutil.ignore_patterns("collected"))
    return sw


def _collect_cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "experiments.collect", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


# --- 1. a job directory without .hydra/ ----------------------------------------------------------


def test_run_without_hydra_dir_is_collected_from_its_summary_and_overrides(sweep, tmp_path):
    shutil.rmtree(sweep / "0" / ".hydra")
    out = tmp_path / "c"
    r = _collect_cli(sweep, "--out", out, "--strict")
    assert r.returncode == 0, r.stderr  # collected, not a failure (even with --strict)
    assert "Traceback" not in r.stderr
    assert str((sweep / "0").resolve()) in r.stderr and "config.yaml" in r.stderr

    runs = pd.read_parquet(out / "runs.parquet").set_index("run_id")
    assert sorted(runs.index) == ["0", "1"]
    # config columns of the run without a config come from its overrides, typed like run 1's
    assert runs.loc["0", "trace.max_requests"] == 10 and runs.loc["0", "seed"] == 0
    assert runs["trace.max_requests"].dtype.kind == "i"
    assert runs.loc["0", "codec"] == runs.loc["1", "codec"] == "identity"  # group from overrides
    # the summary's "model" (Qwen3-8B) never lands in the group column "model" (qwen3_8b); the
    # run without .hydra/ has every group's option from its summary's config_choices
    assert runs.loc["1", "model"] == "qwen3_8b" and runs.loc["0", "model"] == "qwen3_8b"
    assert set(runs["summary.model"]) == {"Qwen3-8B"}
    assert pd.isna(runs.loc["0", "cache.block_size"])  # not in its overrides: null, not guessed
    assert runs.loc["0", "requests_total"] == 10

    req = pd.read_parquet(out / "requests")
    assert len(req) == 20
    assert req["seed"].dtype.kind == "i" and req["trace.max_requests"].dtype.kind == "i"
    assert dict(req.groupby("run_id")["seed"].first()) == {"0": 0, "1": 1}
    assert set(req["codec"]) == {"identity"}
    man = json.loads((out / "manifest.json").read_text())
    assert man["runs_complete"] == 2 and man["runs_failed"] == 0
    assert man["runs_without_config"] == ["0"]
    assert pd.read_csv(out / "failed_runs.csv").empty


def test_run_without_hydra_dir_uses_its_own_config_yaml(sweep, tmp_path):
    shutil.copy(sweep / "0" / ".hydra" / "config.yaml", sweep / "0" / "config.yaml")
    shutil.rmtree(sweep / "0" / ".hydra")
    res = C.collect(sweep, tmp_path / "c", quiet=True)
    runs = res.runs.set_index("run_id")
    assert runs.loc["0", "cache.block_size"] == 16 and runs.loc["0", "seed"] == 0
    assert runs.loc["0", "codec"] == "identity" and not res.failed
    # summary keys named like a group of the sweep go to summary.<key> in this run too
    assert runs.loc["0", "summary.model"] == "Qwen3-8B" and runs.loc["0", "model"] == "qwen3_8b"
    # (a summary without config_choices, an older kvsim's: the groups its overrides name only)
    s = json.loads((sweep / "0" / "summary.json").read_text())
    del s["config_choices"]
    (sweep / "0" / "summary.json").write_text(json.dumps(s))
    runs = C.collect(sweep, tmp_path / "c", quiet=True).runs.set_index("run_id")
    assert runs.loc["0", "codec"] == "identity" and pd.isna(runs.loc["0", "model"])
    man = json.loads((tmp_path / "c" / "manifest.json").read_text())
    assert man["runs_without_config"] == []


@pytest.mark.parametrize("text, value", [("20", 20), ("-3", -3), ("0.5", 0.5), ("1e3", 1000.0),
                                         ("true", True), ("False", False), ("null", None),
                                         ("'16'", "16"), ("nvfp4", "nvfp4"), ("[1,2]", "[1,2]")])
def test_parse_override_value(text, value):
    got = parse_override_value(text)
    assert got == value and type(got) is type(value)


# --- 2. incompatible column types between runs ---------------------------------------------------


def test_incompatible_column_types_exit_2_naming_table_column_types_and_runs(sweep, tmp_path):
    """(Run 1's table rewritten: a run that recorded no output_files, else its digest fails
    it first.)"""
    _without_output_files(sweep / "1")
    p = sweep / "1" / "requests.parquet"
    t = pq.read_table(p)
    i = t.schema.get_field_index("ttft_s")
    pq.write_table(t.set_column(i, "ttft_s", pc.cast(t["ttft_s"], pa.string())), p)
    out = tmp_path / "c"
    r = _collect_cli(sweep, "--out", out)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    (line,) = _error_lines(r.stderr)
    assert line.startswith("kvsim-collect: error: ")
    for part in ("'requests'", "'ttft_s'", "double in run 0", "string in run 1", str(p.resolve())):
        assert part in line, (part, line)
    assert not out.exists() and not list(tmp_path.glob(".c.*"))  # nothing half-written
    with pytest.raises(C.CollectError, match="column 'ttft_s' has incompatible types"):
        C.collect(sweep, out, quiet=True)
    # the hint works: leaving the table out collects the rest
    r = _collect_cli(sweep, "--out", out, "--tables", "steps")
    assert r.returncode == 0, r.stderr
    assert len(pd.read_parquet(out / "runs.parquet")) == 2 and not (out / "requests").exists()


# --- 3. a truncated or corrupt per-run table -----------------------------------------------------


def _check_run_1_failed(out: Path, bad: Path, stderr: str) -> str:
    runs = pd.read_parquet(out / "runs.parquet")
    assert list(runs["run_id"]) == ["0"]
    for table in ("requests", "steps"):
        assert set(pd.read_parquet(out / table)["run_id"]) == {"0"}, table
        assert not (out / table / "job=1").exists(), table
    failed = json.loads((out / "failed_runs.json").read_text())
    assert [f["run_id"] for f in failed] == ["1"]
    reason = failed[0]["reason"]
    assert str(bad.resolve()) in reason and "cannot read Parquet file" in reason
    assert "\n" not in reason
    csv = pd.read_csv(out / "failed_runs.csv")
    assert list(csv["run_id"].astype(str)) == ["1"] and csv["reason"][0] == reason
    man = json.loads((out / "manifest.json").read_text())
    assert man["runs_complete"] == 1 and man["runs_failed"] == 1
    assert "Traceback" not in stderr and str(bad.resolve()) in stderr
    return reason


def _without_output_files(run: Path) -> None:
    """Take ``output_files`` out of ``run``'s summary.json, as a kvsim that recorded no sizes
    or digests wrote it: its tables are checked only when read."""
    s = json.loads((run / "summary.json").read_text())
    del s["output_files"]
    (run / "summary.json").write_text(json.dumps(s))


def test_table_altered_at_the_same_size_lists_the_run_as_failed(sweep, tmp_path):
    """One bit of run 1's requests.parquet flipped where the file still reads (other values,
    same size): its xxh3-128 digest is not the one summary.json records, so the run is failed
    with that reason and none of its rows are collected; --strict exits 1."""
    bad = sweep / "1" / "requests.parquet"
    orig, ref = bad.read_bytes(), pq.read_table(bad)
    for i in range(len(orig) // 3, len(orig)):
        data = bytearray(orig)
        data[i] ^= 0x01
        bad.write_bytes(bytes(data))
        try:
            if not pq.read_table(bad).equals(ref):
                break
        except (OSError, pa.ArrowException):
            pass
    else:
        pytest.fail("no flipped bit left requests.parquet readable with other values")
    assert bad.stat().st_size == len(orig)
    r = _collect_cli(sweep, "--out", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    assert "collected 1 complete run(s) of 2" in r.stdout
    (failed,) = json.loads((tmp_path / "c" / "failed_runs.json").read_text())
    assert failed["run_id"] == "1"
    assert failed["reason"].startswith("requests.parquet's content differs from what the run "
                                       "wrote (its xxh3-128 digest")
    assert set(pd.read_parquet(tmp_path / "c" / "requests")["run_id"]) == {"0"}
    assert _collect_cli(sweep, "--out", tmp_path / "c2", "--strict").returncode == 1


def test_truncated_table_lists_the_run_as_failed_by_its_size(sweep, tmp_path):
    bad = sweep / "1" / "requests.parquet"
    size = bad.stat().st_size
    bad.write_bytes(bad.read_bytes()[: size // 2])
    (f,) = C.collect(sweep, tmp_path / "c", quiet=True).failed
    assert f.run_id == "1" and f.failure == f"requests.parquet is {size // 2:,} bytes, the run wrote {size:,}"


def test_truncated_table_lists_the_run_as_failed_and_collects_the_others(sweep, tmp_path):
    """A run that recorded no output_files: its truncated table fails with the Parquet error."""
    _without_output_files(sweep / "1")
    bad = sweep / "1" / "requests.parquet"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    r = _collect_cli(sweep, "--out", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    reason = _check_run_1_failed(tmp_path / "c", bad, r.stderr)
    assert "magic bytes" in reason  # the Parquet error itself
    r = _collect_cli(sweep, "--out", tmp_path / "c2", "--strict")
    assert r.returncode == 1, r.stderr
    _check_run_1_failed(tmp_path / "c2", bad, r.stderr)


def test_table_corrupt_past_its_footer_drops_the_run_from_every_table(sweep, tmp_path):
    """The footer reads, the pages do not: found while writing (after run 1's requests and
    rounds were written), so the run is taken out of every table and the rest written again
    (a run that recorded no output_files: one that did is failed by its digest before any
    read)."""
    _without_output_files(sweep / "1")
    bad = sweep / "1" / "steps.parquet"
    data = bytearray(bad.read_bytes())
    for i in range(8, min(3000, len(data) - 2000)):
        data[i] = (data[i] * 7 + 13) % 256
    bad.write_bytes(bytes(data))
    pq.read_schema(bad)  # the footer is intact
    with pytest.raises(OSError):
        pq.read_table(bad)
    r = _collect_cli(sweep, "--out", tmp_path / "c")
    assert r.returncode == 0, r.stderr
    _check_run_1_failed(tmp_path / "c", bad, r.stderr)
    # only the tables being collected are read: without steps, run 1 is fine
    res = C.collect(sweep, tmp_path / "c3", tables=["requests"], quiet=True)
    assert sorted(res.runs["run_id"]) == ["0", "1"] and not res.failed


# --- 4. kvsim-plot --out with an extension matplotlib cannot write -------------------------------


def test_plot_out_with_unsupported_extension_is_a_usage_error(base_sweep, tmp_path, capsys):
    col = C.collect(base_sweep, tmp_path / "c", quiet=True).out_dir
    for out, what in [(tmp_path / "x.txt", "'.txt'"), (tmp_path / "x", "no file extension")]:
        with pytest.raises(SystemExit) as ei:
            P.main(["ttft-cdf", str(col), "--by", "cache.block_size", "--out", str(out)])
        assert ei.value.code == 2
        err = capsys.readouterr().err
        (line,) = [ln for ln in err.splitlines() if "error:" in ln]
        assert line.startswith("kvsim-plot ttft-cdf: error: argument --out: ")
        for part in (str(out), what, ".png", ".pdf", ".svg"):
            assert part in line, (part, line)
        assert "Traceback" not in err and not out.exists()
    # the console script: exit status 2, same message
    r = subprocess.run([sys.executable, "-m", "experiments.plots", "ttft-cdf", str(col),
                        "--out", str(tmp_path / "x.txt")], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "argument --out" in r.stderr and "Traceback" not in r.stderr
    # an upper-case supported extension still works
    assert P.main(["ttft-cdf", str(col), "--by", "cache.block_size",
                   "--out", str(tmp_path / "ok.SVG")]) == 0
    assert (tmp_path / "ok.SVG").stat().st_size > 1000


def test_plots_save_rejects_unknown_extension(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    fig = P.plot_ttft_cdf(pd.DataFrame({"ttft_s": [0.1, 0.2], "codec": ["a", "b"]}))
    with pytest.raises(P.PlotError, match=r"x\.txt.*unsupported extension '\.txt'.*\.png"):
        P.save(fig, tmp_path / "x.txt")
    assert not (tmp_path / "x.txt").exists()
    assert "png" in P.image_formats() and "pdf" in P.image_formats()


def test_pool_fragmentation_with_block_size_as_the_grouping(base_sweep, tmp_path):
    """pool-fragmentation reads ``cache.block_size`` beside the ``--by`` columns; with ``--by
    cache.block_size`` (its default) each run column is joined once."""
    col = C.collect(base_sweep, tmp_path / "c", quiet=True).out_dir
    for extra in ([], ["--by", "cache.block_size"], ["--by", "seed"]):
        out = tmp_path / f"pf{len(extra)}.png"
        assert P.main(["pool-fragmentation", str(col), "--out", str(out), *extra]) == 0
        assert out.stat().st_size > 1000


def test_run_without_one_table_is_noted(sweep, tmp_path, capsys):
    """A table the run wrote (its summary.json's output_files) and that is gone makes the run
    failed, with the file named; a run that lists none (output.write_steps=false writes no
    steps table; a summary without output_files) is still collected, with a note on stderr and
    the manifest's runs_missing_tables."""
    (sweep / "0" / "steps.parquet").unlink()
    res = C.collect(sweep, tmp_path / "c0")
    assert sorted(res.runs["run_id"]) == ["1"]
    (failed,) = json.loads((res.out_dir / "failed_runs.json").read_text())
    assert failed["run_id"] == "0" and failed["reason"].startswith("steps.parquet is missing (")
    capsys.readouterr()
    s = json.loads((sweep / "0" / "summary.json").read_text())
    for bad, why in ((5, "output_files is '5', not a list"), ([{"a": 1}], "entry \"{'a': 1}\" is")):
        (sweep / "0" / "summary.json").write_text(json.dumps({**s, "output_files": bad}))
        res = C.collect(sweep, tmp_path / "cb", quiet=True)
        (failed,) = json.loads((res.out_dir / "failed_runs.json").read_text())
        assert failed["run_id"] == "0" and why in failed["reason"], failed["reason"]
    s["output_files"] = [f for f in s["output_files"] if f[0] != "steps.parquet"]
    (sweep / "0" / "summary.json").write_text(json.dumps(s))
    res = C.collect(sweep, tmp_path / "c")
    man = json.loads((res.out_dir / "manifest.json").read_text())
    assert man["runs_missing_tables"] == {"steps": ["0"]} and man["runs_failed"] == 0
    assert "1 complete run(s) wrote no steps.parquet" in capsys.readouterr().err
    assert set(pd.read_parquet(res.out_dir / "steps")["run_id"].astype(str)) == {"1"}


def test_out_that_cannot_be_created_names_it_not_the_temporary(base_sweep, tmp_path):
    """An ``--out`` where no folder can be made is one error naming --out's path and the reason,
    not the collection's temporary folder."""
    out = Path("/proc/kvsim-test-collect")  # (no folder can be made in /proc, even as root)
    with pytest.raises(C.CollectError) as ei:
        C.collect(base_sweep, out, quiet=True)
    msg = str(ei.value)
    assert msg.startswith(f"{out}: cannot create the output directory (in {out.parent}: ")
    assert ".tmp-" not in msg


# --- jobs a sweep never ran ------------------------------------------------------------------------


def test_sweep_plan_lists_each_jobs_overrides(base_sweep):
    """The sweep records the jobs it is to run (sim.sweep.write_plan) under its own id, each
    job's overrides as Hydra gives them to that job."""
    from sim.folders import read_plan

    sid, jobs = read_plan(base_sweep)
    assert sid == (base_sweep / ".kvsim_sweep_id").read_text().strip()
    import yaml
    assert jobs == [yaml.safe_load((base_sweep / str(i) / ".hydra" / "overrides.yaml").read_text())
                    for i in range(2)]


def test_job_that_never_ran_is_a_failed_run(sweep, tmp_path):
    """A job of the sweep's plan that left no folder (the sweep stopped before it started) is
    listed as failed with its overrides; --strict exits non-zero; the other job is collected."""
    shutil.rmtree(sweep / "1")
    (sweep / ".kvsim_jobs" / "1").unlink()
    out = tmp_path / "c"
    r = _collect_cli(sweep, "--out", out, "--strict")
    assert r.returncode != 0, r.stdout + r.stderr
    failed = pd.read_csv(out / "failed_runs.csv")
    assert failed["job"].tolist() == [1]
    assert failed["reason"].iloc[0].startswith("never ran: the sweep stopped before this job")
    assert "seed=1" in failed["overrides"].iloc[0].split()
    assert pd.read_parquet(out / "runs.parquet")["job"].tolist() == [0]
    assert json.loads((out / "manifest.json").read_text())["runs_total"] == 2


def test_job_killed_before_its_folder_names_the_ledger(sweep, tmp_path):
    """A job the ledger shows started but that left no folder is failed with the ledger's
    reason (its process ended)."""
    shutil.rmtree(sweep / "1")
    entry = json.loads((sweep / ".kvsim_jobs" / "1").read_text())
    entry.update(state="running", why=None)
    (sweep / ".kvsim_jobs" / "1").write_text(json.dumps(entry))
    res = C.collect(sweep, tmp_path / "c", quiet=True)
    assert [(r.job, r.failure) for r in res.failed] == [
        (1, "its process ended before the job made its folder (killed?)")]


def test_plan_of_another_sweep_is_not_read(sweep, tmp_path):
    """A plan whose sweep id is not the folder's (an older kvsim's folder, a copied ledger) adds
    no failed run."""
    plan = sweep / ".kvsim_jobs" / "plan.json"
    p = json.loads(plan.read_text())
    p["jobs"].append(["seed=7"])
    p["sweep_id"] = "1-1"
    plan.write_text(json.dumps(p))
    res = C.collect(sweep, tmp_path / "c", quiet=True)
    assert res.failed == [] and len(res.runs) == 2


def test_folder_holding_only_the_run_log_is_a_failed_run(sweep, tmp_path):
    """A folder holding only a run's log ``cli.log`` (a run killed after Hydra made its folder,
    before it marked it) is a run, listed as failed, never skipped; ``--strict`` exits non-zero."""
    (sweep / "killed").mkdir()
    (sweep / "killed" / "cli.log").write_text("[kvsim] kvsim (defaults) -> killed\n")
    res = C.collect(sweep, tmp_path / "c", quiet=True)
    assert [(r.run_dir.name, r.failure) for r in res.failed] == [
        ("killed", "no summary.json and no INCOMPLETE marker, only the run's log cli.log (the "
                   "run was killed before it marked its folder)")]
    assert len(res.runs) == 2  # (the sweep's two complete jobs)
    r = _collect_cli(sweep, "--out", tmp_path / "d", "--strict")
    assert r.returncode != 0, r.stdout + r.stderr


def test_run_still_running_is_named_as_running(sweep, tmp_path):
    """A job folder marked INCOMPLETE whose run lock a process holds (the run goes on) is
    failed as still running, not as interrupted or crashed; once the lock is let go it is an
    interrupted run."""
    from sim.folders import RUN_LOCK
    from sim.locks import hold

    (sweep / "1" / "summary.json").unlink()
    (sweep / "1" / "INCOMPLETE").write_text("")
    held = hold(sweep / "1" / RUN_LOCK)
    try:
        (f,) = C.collect(sweep, tmp_path / "c", quiet=True).failed
        assert f.run_id == "1" and f.failure.startswith("still running: a kvsim process holds")
    finally:
        held.release()
    (f,) = C.collect(sweep, tmp_path / "c", quiet=True).failed
    assert f.failure == "INCOMPLETE marker present (run interrupted or crashed)"


def test_sweep_still_running_names_jobs_not_started_and_running(sweep, tmp_path):
    """While a process holds the sweep folder's lock (the sweep runs): a job that left no
    folder and no ledger entry is "not started yet", one the ledger records as running is
    "still running", also when its folder holds only the run's log so far; the collection says
    on one line that it is partial, the manifest records it, and --strict exits 1. Once the
    lock is let go, the same job is one the sweep never ran."""
    from experiments.run_folders import NOT_STARTED, STILL_RUNNING
    from sim.locks import hold
    from sim.sweep import SWEEP_LOCK, record_job

    shutil.rmtree(sweep / "1")
    (sweep / ".kvsim_jobs" / "1").unlink()
    held = hold(sweep / SWEEP_LOCK)
    try:
        res = C.collect(sweep, tmp_path / "c", quiet=True)
        assert res.sweep_running and [(f.run_id, f.failure) for f in res.failed] == [("1", NOT_STARTED)]
        assert json.loads((tmp_path / "c" / "manifest.json").read_text())["sweep_running"] is True
        r = _collect_cli(sweep, "--out", tmp_path / "c2", "--strict")
        assert r.returncode == 1
        (line,) = [ln for ln in r.stderr.splitlines() if "partial" in ln]
        assert f"the sweep {sweep} is still running" in line and "partial" in line
        assert record_job(sweep, 1, "running", name="1")
        (f,) = C.collect(sweep, tmp_path / "c", quiet=True).failed
        assert (f.run_id, f.failure) == ("1", STILL_RUNNING)
        (sweep / "1").mkdir()
        (sweep / "1" / "cli.log").write_text("")
        (f,) = C.collect(sweep, tmp_path / "c", quiet=True).failed
        assert (f.run_id, f.failure) == ("1", STILL_RUNNING)
    finally:
        held.release()
    (f,) = C.collect(sweep, tmp_path / "c", quiet=True).failed
    assert f.failure.startswith("no summary.json and no INCOMPLETE marker, only the run's log")
    shutil.rmtree(sweep / "1")
    (sweep / ".kvsim_jobs" / "1").unlink()
    res = C.collect(sweep, tmp_path / "c", quiet=True)
    assert not res.sweep_running
    assert [f.failure for f in res.failed] == ["never ran: the sweep stopped before this job started"]


def test_jobs_not_run_judges_by_the_ledger_read_before_the_scan(sweep):
    """A job the ledger read before the folders were scanned did not record (it completed
    during the scan, its folder made after the scan passed) is not called removed: the ledger
    given is the one judged by, not the one on disk now."""
    from experiments.run_folders import NOT_STARTED, jobs_not_run, read_run

    runs = [read_run(sweep / "0", sweep, 0)]
    (f,) = jobs_not_run(sweep, runs, {}, running=True)
    assert (f.run_id, f.failure) == ("1", NOT_STARTED)
    (f,) = jobs_not_run(sweep, runs, {1: {"state": "complete", "name": "1"}}, running=False)
    assert f.failure.startswith("its results folder is gone")
