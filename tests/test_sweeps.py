"""Sweeps end to end: the joblib launcher config, a 6-run local multirun, kill-and-resume with
``output.skip_completed=true``, ``kvsim-collect`` (Parquet outputs read by pandas, pyarrow and
DuckDB when installed; failed runs listed) and ``kvsim-plot``.

Kept light for 2 shared cores: small trace slices, at most 2 worker processes.
"""

from __future__ import annotations

import json
import os
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


# --- launchers ----------------------------------------------------------------------------------


def test_local_launcher_is_joblib_with_all_cores():
    out = _kvsim("hydra/launcher=local", "--cfg", "hydra").stdout
    assert "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher" in out
    assert "n_jobs: -1" in out


def test_slurm_launcher_config_composes():
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                        reason="hydra-submitit-launcher not installed (pip install -e '.[slurm]')")
    out = _kvsim("hydra/launcher=slurm", "--cfg", "hydra").stdout
    assert "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher" in out
    assert "cpus_per_task: 1" in out


def test_cluster_launcher_without_its_plugin_names_the_install():
    """hydra/launcher=slurm without hydra-submitit-launcher is exit 2 naming the pip extra
    (likewise ray_cluster), not Hydra's "Could not load"."""
    import importlib.util

    from sim.cli import LAUNCHER_PLUGINS, missing_launcher_plugin

    for name, (mod, extra) in LAUNCHER_PLUGINS.items():
        try:
            installed = importlib.util.find_spec(mod) is not None
        except ModuleNotFoundError:
            installed = False
        err = missing_launcher_plugin(["-m", f"hydra/launcher={name}", "seed=0,1"])
        if installed:
            assert err is None
        else:
            assert f"pip install -e '.[{extra}]'" in err, err
    assert missing_launcher_plugin(["-m", "hydra/launcher=local"]) is None


def test_ray_launcher_config_extends_the_plugins_without_recursion():
    """ray_cluster.yaml extends the plugin's ``ray`` node (a file named ray.yaml with ``defaults:
    [ray]`` would find itself first: Hydra's RecursionError), here a stand-in registered the way
    hydra-ray-launcher registers its own, and sets the resources per run."""
    from hydra import compose, initialize_config_dir
    from hydra.core.config_store import ConfigStore
    from hydra.core.global_hydra import GlobalHydra

    from sim.config import register_configs

    register_configs()
    ConfigStore.instance().store(group="hydra/launcher", name="ray", provider="test",
                                 node={"_target_": "stand_in.RayLauncher",
                                       "ray": {"init": {"address": None}, "remote": {}}})
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "experiments" / "conf"), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=ray_cluster"],
                      return_hydra_config=True)
    assert cfg.hydra.launcher._target_ == "stand_in.RayLauncher"
    assert cfg.hydra.launcher.ray.remote.num_cpus == 1


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

    # the collection of the interrupted sweep lists the unfinished runs and keeps them out
    res = C.collect(sweep, tmp_path / "col1", quiet=True)
    assert sorted(res.runs["run_id"]) == sorted(before)
    assert sorted(r.run_id for r in res.failed) == interrupted
    assert set(pd.read_csv(tmp_path / "col1" / "failed_runs.csv")["run_id"].astype(str)) == set(interrupted)

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
    """A run whose table lacks a column (older schema) gets nulls, not a broken dataset."""
    sw = tmp_path / "sw"
    shutil.copytree(sweep_dir, sw, ignore=shutil.ignore_patterns("collected"))
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


def test_ttft_decomposition_parts_sum_to_mean_ttft():
    req = pd.DataFrame({
        "codec": ["a", "a", "b", "b"], "status": ["finished"] * 4,
        "ttft_s": [1.0, 3.0, 2.0, 2.0], "queue_s": [0.5, 1.0, 0.0, 1.0],
        "onboard_host_s": [0.1, 0.3, 0.2, 0.2], "onboard_disk_s": [0.0, 1.0, 0.0, 0.0],
        "prefill_s": [0.3, 0.5, 1.5, 0.5]})
    d = P.ttft_decomposition(req, by="codec")
    assert list(d.columns) == ["queue_s", "onboard_host_s", "onboard_disk_s", "prefill_s", "other", "ttft_s"]
    assert d.loc["a", "ttft_s"] == pytest.approx(2.0)
    assert d.loc["a", "other"] == pytest.approx(2.0 - (0.75 + 0.2 + 0.5 + 0.4))
    parts = d.drop(columns="ttft_s").sum(axis=1)
    pd.testing.assert_series_equal(parts, d["ttft_s"], check_names=False)
    tail = P.ttft_decomposition(req, by="codec", tail=0.5)
    assert tail.loc["a", "ttft_s"] == pytest.approx(3.0)


def _fake_runs():
    rows = []
    for codec in ("identity", "nvfp4"):
        for host in (0, 32, 128):
            g, h = 0.2, (0.0 if host == 0 else 0.1 * (1 + host / 64) * (2 if codec == "nvfp4" else 1))
            dsk = 0.05
            rows.append({"run_id": f"{codec}{host}", "codec": codec, "tiers.host_gib": host,
                         "hit_ratio.gpu": g, "hit_ratio.host": h, "hit_ratio.disk": dsk,
                         "hit_ratio.total": g + h + dsk, "disk_share_of_hits": dsk / (g + h + dsk),
                         "ttft_s.p50": 1 / (1 + h), "ttft_s.p90": 2 / (1 + h), "ttft_s.p99": 4 / (1 + h)})
    return pd.DataFrame(rows)


def _fake_rounds():
    rows = []
    for pol in ("h2o", "triattention"):
        for comp in ("none", "forward_pack", "hole_fill"):
            for i in range(20):
                ev = 160 + 16 * i
                rows.append({"policy": pol, "compaction": comp, "request_id": i % 3, "time_s": float(i),
                             "tokens_evicted": ev, "blocks_freed": ev // 16 if comp != "none" else i % 2,
                             "bytes_moved": 0 if comp != "forward_pack" else ev * 147456,
                             "fragmentation_after": 0.5 if comp == "none" else 0.05})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("fn", ["hit_by_tier", "disk_share", "ttft_vs"])
def test_tier_figures_on_the_agreed_summary_schema(fn, tmp_path):
    fig = getattr(P, f"plot_{fn}")(_fake_runs(), x="tiers.host_gib", hue="codec")
    assert fig.axes
    assert P.save(fig, tmp_path / f"{fn}.png").stat().st_size > 5000


def test_hit_by_tier_stacks_to_total():
    fig = P.plot_hit_by_tier(_fake_runs())
    ax = fig.axes[0]  # codec = identity: 3 tiers x 3 host sizes
    tops = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        tops[x] = max(tops.get(x, 0), patch.get_y() + patch.get_height())
    runs = _fake_runs()
    want = runs[runs["codec"] == "identity"].sort_values("tiers.host_gib")["hit_ratio.total"].tolist()
    assert [tops[i] for i in range(3)] == pytest.approx(want)


@pytest.mark.parametrize("fn,by", [("blocks_freed", ("policy", "compaction")),
                                   ("fragmentation", ("policy", "compaction")),
                                   ("bytes_moved", "compaction")])
def test_round_figures_on_the_agreed_rounds_schema(fn, by, tmp_path):
    kw = {"block_size": 16} if fn == "blocks_freed" else {}
    if fn == "blocks_freed":  # (rounds alone: the gross frees, and a word on what is missing)
        with pytest.warns(P.PlotWarning, match="no steps table given"):
            fig = P.plot_blocks_freed(_fake_rounds(), by=by, **kw)
    else:
        fig = getattr(P, f"plot_{fn}")(_fake_rounds(), by=by, **kw)
    assert P.save(fig, tmp_path / f"{fn}.png").stat().st_size > 5000
    assert P.longest_request(_fake_rounds()) in (0, 1, 2)


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
    """kvsim -m policy=h2o,triattention policy.budget=512: the option is composed beside the
    swept policy (the policy group's schema holds every policy's options) and each job runs
    its policy with it."""
    sweep = tmp_path / "sw"
    r = _kvsim("-m", "hydra/launcher=local", "hydra.launcher.n_jobs=2", f"hydra.sweep.dir={sweep}",
               "policy=h2o,triattention", "policy.budget=512", "trace.max_requests=3", *QUIET)
    runs = {C.read_run(sweep / n, sweep, int(n)).config["policy"]["name"]:
            C.read_run(sweep / n, sweep, int(n)) for n in ("0", "1")}
    assert sorted(runs) == ["h2o", "triattention"], r.stderr[-2000:]
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
    per-job folder (${hydra:job.num}) works, also when the sweep is run again."""
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
    # a later single run into job 1's folder replaced its results: the pointer no longer leads
    _kvsim(f"output.dir={tmp_path / 'pj_1'}", "trace.max_requests=10", *QUIET)
    res = C.collect(tmp_path / "sw2", tmp_path / "c3", quiet=True)
    assert res.runs["cache.block_size"].tolist() == [16]
    (f,) = res.failed
    assert f.run_id == "1" and "now holds another run" in f.failure


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
    lists the files the run wrote with their sizes (``output_files``); a run missing one, or
    with one of another size, is rerun; an untouched one is still skipped; a hand-edited
    summary.json is not a complete run."""
    from sim.run import is_complete

    out = tmp_path / "run"
    args = ["trace.max_requests=30", f"output.dir={out}", f"hydra.run.dir={tmp_path / 'h'}",
            *QUIET, "output.skip_completed=true"]
    _kvsim(*args)
    s = json.loads((out / "summary.json").read_text())
    names = [f for f, _ in s["output_files"]]
    assert {"requests.parquet", "steps.parquet", "transfers.parquet", "rounds.parquet"} <= set(names)
    assert all((out / f).stat().st_size == n for f, n in s["output_files"])
    assert is_complete(out)
    mt = (out / "summary.json").stat().st_mtime_ns
    _kvsim(*args)  # untouched: skipped
    assert (out / "summary.json").stat().st_mtime_ns == mt
    (out / "steps.parquet").unlink()
    assert not is_complete(out)
    _kvsim(*args)  # a table deleted: rerun, the table is back
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
                [["steps.parquet", True]], [["steps.parquet"]]):
        (out / "summary.json").write_text(json.dumps({**json.loads(good), "output_files": bad}))
        assert not is_complete(out), bad
    for bad in ([], "x", 3):
        (out / "summary.json").write_text(json.dumps(bad))
        assert not is_complete(out)
    (out / "summary.json").write_text(json.dumps({**json.loads(good), "output_files": 5}))
    r = _kvsim(*args)  # rerun, no traceback
    assert "Traceback" not in r.stderr and is_complete(out)


def test_a_run_folder_collected_on_its_own_takes_a_new_run(tmp_path):
    """``kvsim-collect RUN_DIR`` writes its default ``RUN_DIR/collected``, and a later run into
    RUN_DIR is allowed (the collection is a kvsim file there); a folder named so that is not a
    collection is still refused."""
    out = tmp_path / "run"
    args = ["trace.max_requests=20", f"output.dir={out}", f"hydra.run.dir={tmp_path / 'h'}", *QUIET]
    _kvsim(*args)
    r = subprocess.run([sys.executable, "-m", "experiments.collect", str(out)], cwd=REPO,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (out / "collected" / "manifest.json").is_file()
    _kvsim(*args, "seed=1")  # accepted: replaces the run's results
    assert json.loads((out / "summary.json").read_text())["seed"] == 1
    shutil.rmtree(out / "collected")
    (out / "collected").mkdir()
    (out / "collected" / "notes.txt").write_text("mine")
    r = _kvsim(*args, check=False)
    assert r.returncode == 2 and "not a kvsim run's (collected)" in r.stderr


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
