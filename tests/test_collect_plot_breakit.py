"""Break-it pass on ``kvsim-collect`` and ``kvsim-plot``: an ``--out`` that would delete what is
there (a folder of notes, the sweep, its parent, a run, a file), an unknown ``--tables`` name,
failed runs without a warning, ``--x`` equal to ``--hue`` and ``--agg`` outside its choices,
``--by`` curves that silently pool runs of another swept parameter, runs silently left out of a
figure, and a TTFT decomposition whose "other" was really onboarding time.

The sweeps are fake run folders (what ``kvsim -m`` writes, as far as the collector reads it), so
every test is quick; one test runs the simulator to check the decomposition on its own tables.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from experiments import collect as C
from experiments import plots as P

REPO = Path(__file__).resolve().parent.parent


def _set(cfg: dict, key: str, value) -> None:
    *path, leaf = key.split(".")
    for p in path:
        cfg = cfg.setdefault(p, {})
    cfg[leaf] = value


def _fake_run(d: Path, job: int, overrides: dict, *, finished: bool = True, n: int = 6) -> Path:
    """A completed run folder: ``.hydra/{overrides,config,hydra}.yaml``, ``summary.json``,
    ``requests.parquet`` (n requests, all finished or all rejected) and ``steps.parquet``."""
    (d / ".hydra").mkdir(parents=True)
    ov = [f"{k}={v}" for k, v in overrides.items()] + ["sim.progress=false"]
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(ov))
    cfg: dict = {"seed": 0, "cache": {"block_size": 16}, "scheduler": {"max_num_seqs": 64},
                 "model": {"max_model_len": 200000}}
    for k, v in overrides.items():
        _set(cfg, k, v)
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    hydra = {"hydra": {"job": {"num": job},
                       "runtime": {"choices": {"trace": "fake", "hydra/launcher": "local"}}}}
    (d / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(hydra))
    rng = np.random.default_rng(job)
    ttft = 0.1 + rng.random(n) * (1 + job)
    stats = ({"p50": float(np.median(ttft)), "p90": float(np.quantile(ttft, 0.9)),
              "p99": float(np.quantile(ttft, 0.99))} if finished
             else {"p50": None, "p90": None, "p99": None})
    hit = ({"gpu": 0.2, "host": 0.1, "disk": 0.0, "total": 0.3} if finished
           else {"gpu": None, "host": None, "disk": None, "total": None})
    summary = {"complete": True, "requests_total": n, "requests_finished": n if finished else 0,
               "ttft_s": stats, "hit_ratio": hit, "disk_share_of_hits": 0.0 if finished else None}
    (d / "summary.json").write_text(json.dumps(summary))
    queue = ttft * 0.5
    req = pd.DataFrame({
        "request_id": np.arange(n), "status": ["finished" if finished else "rejected"] * n,
        "ttft_s": ttft if finished else np.nan, "queue_s": queue if finished else np.nan,
        "onboard_s": 0.0, "onboard_host_s": 0.0, "onboard_disk_s": 0.0,
        "prefill_s": ttft - queue if finished else np.nan})
    req.to_parquet(d / "requests.parquet")
    pd.DataFrame({"time_s": np.arange(5.0), "blocks_used": [4] * 5,
                  "live_kv_tokens": [40] * 5}).to_parquet(d / "steps.parquet")
    return d


def _fake_sweep(root: Path, grid: list[dict], failed: dict | None = None) -> Path:
    """A sweep folder with one fake run per ``grid`` entry (``finished=False`` in an entry makes
    a run in which every request was rejected)."""
    root.mkdir(parents=True)
    for i, ov in enumerate(grid):
        ov = dict(ov)
        fin = ov.pop("finished", True)
        _fake_run(root / str(i), i, ov, finished=fin)
    return root


@pytest.fixture
def sweep(tmp_path) -> Path:
    """Two runs: cache.block_size=16,32."""
    return _fake_sweep(tmp_path / "multirun" / "s1",
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


# --- 1. --out that would delete what is there ---------------------------------------------------


def test_out_non_empty_folder_that_is_no_collection_is_refused_and_kept(sweep, tmp_path, capsys):
    """Was: ``--out myresults`` (holding notes.txt) replaced the folder, deleting notes.txt."""
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
    """Was: the sweep, its parent (every sweep under it) or run 0 were deleted (run 0 also left
    out of the collection); an existing file was renamed away, then NotADirectoryError."""
    other = _fake_sweep(tmp_path / "multirun" / "s2", [{"cache.block_size": 64}])
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
    out = tmp_path / "col"
    assert _cli(capsys, sweep, "--out", out)[0] == 0
    assert C.is_collection(out) and not C.is_collection(sweep) and not C.is_collection(sweep / "0")
    (out / "stale.txt").write_text("old\n")
    assert _cli(capsys, sweep, "--out", out)[0] == 0  # an earlier collection is replaced whole
    assert not (out / "stale.txt").exists() and len(pd.read_parquet(out / "runs.parquet")) == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".col")]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _cli(capsys, sweep, "--out", empty)[0] == 0 and C.is_collection(empty)
    for _ in range(2):  # the default SWEEP/collected, new and then replaced
        assert _cli(capsys, sweep)[0] == 0
    assert C.is_collection(sweep / "collected")
    assert len(pd.read_parquet(sweep / "collected" / "runs.parquet")) == 2


# --- 2. --tables with an unknown name ----------------------------------------------------------


def test_unknown_table_name_is_an_error_listing_the_tables_before_anything_is_written(sweep,
                                                                                       capsys):
    """Was: ``--tables requets`` exited 0 with "tables: none", replacing the earlier collection."""
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


# --- 3. failed runs: exit 0 (documented), with a warning line ----------------------------------


def test_failed_runs_exit_0_with_a_warning_naming_how_many_and_where(sweep, tmp_path, capsys):
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


# --- 4. --x equal to --hue, --agg outside its choices -------------------------------------------


@pytest.fixture
def seeds(tmp_path) -> Path:
    """Collected: cache.block_size=16,32 x seed=0,1 (two runs per block size)."""
    sw = _fake_sweep(tmp_path / "sw4", [{"cache.block_size": b, "seed": s}
                                        for b in (16, 32) for s in (0, 1)])
    return C.collect(sw, tmp_path / "c4", quiet=True).out_dir


def test_x_equal_to_hue_is_an_error_not_a_traceback(seeds, tmp_path, capsys):
    """Was: TypeError: unique requires a Series ... got DataFrame."""
    for fig in ("ttft-vs", "hit-by-tier", "disk-share"):
        assert P.main([fig, str(seeds), "--x", "cache.block_size", "--hue", "cache.block_size",
                       "--agg", "mean", "--out", str(tmp_path / "x.png")]) == 2
        err = capsys.readouterr().err
        (line,) = err.splitlines()
        assert line.startswith("kvsim-plot: error: ") and "'cache.block_size'" in line
        assert "--x" in line and "--hue" in line
    runs = pd.read_parquet(seeds / "runs.parquet")
    with pytest.raises(P.PlotError, match="both 'seed'"):
        P.plot_ttft_vs(runs, x="seed", hue="seed")
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("agg", ["foo", "sum"])
def test_agg_outside_the_documented_choices_is_a_usage_error(seeds, tmp_path, capsys, agg):
    """Was: ``--agg foo`` AttributeError; ``--agg sum`` summed p99s of several runs."""
    with pytest.raises(SystemExit) as ei:
        P.main(["ttft-vs", str(seeds), "--x", "cache.block_size", "--hue", "trace", "--agg", agg,
                "--out", str(tmp_path / "x.png")])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if "error:" in ln]
    assert "--agg" in line and f"'{agg}'" in line and "mean" in line and "max" in line
    runs = pd.read_parquet(seeds / "runs.parquet")
    with pytest.raises(P.PlotError, match=f"agg .*'{agg}'.*mean, median, min, max"):
        P.plot_ttft_vs(runs, x="cache.block_size", hue="trace", agg=agg)


def test_agg_max_draws_the_largest_value_of_the_runs_of_a_cell(seeds, tmp_path):
    """(And, break-it pass: the runs --agg combines are said in a warning, as the per-request
    figures say what they pool.)"""
    runs = pd.read_parquet(seeds / "runs.parquet")
    with pytest.warns(P.PlotWarning, match=r"plot_ttft_vs: agg=max combines \d+ runs that share "
                                           r"their cache\.block_size / trace cell"):
        fig = P.plot_ttft_vs(runs, x="cache.block_size", hue="trace", agg="max")
    want = runs.groupby("cache.block_size")["ttft_s.p50"].max().to_numpy()
    (line,) = fig.axes[0].get_lines()
    assert np.allclose(line.get_ydata(), want)
    assert not np.allclose(want, runs.groupby("cache.block_size")["ttft_s.p50"].mean())
    assert P.main(["ttft-vs", str(seeds), "--x", "cache.block_size", "--hue", "trace",
                   "--agg", "median", "--out", str(tmp_path / "m.png")]) == 0


# --- 5. --by curves that pool runs of another swept parameter -----------------------------------


@pytest.fixture
def grid(tmp_path) -> Path:
    """Collected: cache.block_size=16,32 x scheduler.max_num_seqs=64,128,256 (README's grid)."""
    sw = _fake_sweep(tmp_path / "sw6", [{"cache.block_size": b, "scheduler.max_num_seqs": m}
                                        for b in (16, 32) for m in (64, 128, 256)])
    return C.collect(sw, tmp_path / "c6", quiet=True).out_dir


@pytest.mark.parametrize("fig", ["ttft-cdf", "ttft-decomposition", "pool-fragmentation"])
def test_by_group_pooling_runs_of_another_parameter_is_warned(grid, tmp_path, capsys, fig):
    """Was: each cache.block_size curve pooled 3 runs without a word (only n= in the legend)."""
    out = tmp_path / "p.png"
    assert P.main([fig, str(grid), "--by", "cache.block_size", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert line.startswith(f"kvsim-plot: warning: {fig}: each --by group")
    for part in ("scheduler.max_num_seqs", "16: 3 runs", "32: 3 runs",
                 "--where scheduler.max_num_seqs=VALUE",
                 "--by cache.block_size,scheduler.max_num_seqs"):
        assert part in line, (part, line)
    assert "sim.progress" not in line
    assert out.stat().st_size > 1000  # still drawn
    # separated: no warning
    for extra in (["--by", "cache.block_size,scheduler.max_num_seqs"],
                  ["--by", "cache.block_size", "--where", "scheduler.max_num_seqs=128"]):
        assert P.main([fig, str(grid), "--out", str(out), *extra]) == 0
        assert capsys.readouterr().err == ""


def test_pooled_seeds_are_drawn_with_a_warning_naming_seed(seeds, tmp_path, capsys):
    assert P.main(["ttft-cdf", str(seeds), "--by", "cache.block_size",
                   "--out", str(tmp_path / "s.png")]) == 0
    err = capsys.readouterr().err
    assert "pools runs that differ in seed (cache.block_size=16: 2 runs, cache.block_size=32: 2 runs)" in err


# --- 6. runs with nothing to draw ---------------------------------------------------------------


@pytest.fixture
def rejected(tmp_path) -> Path:
    """Collected: model.max_model_len=100 (every request rejected), 200000."""
    sw = _fake_sweep(tmp_path / "sw2", [{"model.max_model_len": 100, "finished": False},
                                        {"model.max_model_len": 200000}])
    return C.collect(sw, tmp_path / "c2", quiet=True).out_dir


@pytest.mark.parametrize("fig, extra, what", [
    ("ttft-cdf", ["--by", "model.max_model_len"], "no finished request"),
    ("ttft-decomposition", ["--by", "model.max_model_len"], "no finished request"),
    ("ttft-vs", ["--x", "model.max_model_len", "--hue", "trace"], "ttft_s.p50"),
    ("hit-by-tier", ["--x", "model.max_model_len", "--hue", "trace"], "hit_ratio.total"),
])
def test_runs_with_nothing_to_draw_are_named_in_a_warning(rejected, tmp_path, capsys, fig, extra,
                                                          what):
    """Was: the max_model_len=100 run (no request finished) silently absent from the figure."""
    out = tmp_path / "r.png"
    assert P.main([fig, str(rejected), "--out", str(out), *extra]) == 0
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.splitlines() if ln.strip()]
    assert line.startswith("kvsim-plot: warning: ") and "left out 1 run(s)" in line
    assert "run 0" in line and what in line and "run 1" not in line
    assert ("6 rejected" in line) if fig.startswith("ttft-") and "vs" not in fig else (
        "model.max_model_len=100" in line and "no request finished" in line)
    assert out.stat().st_size > 1000


def test_library_figures_warn_with_a_plot_warning(rejected):
    req = pd.read_parquet(rejected / "requests")
    with pytest.warns(P.PlotWarning, match=r"left out 1 run\(s\) .*run 0 \(6 requests: 6 rejected\)"):
        P.plot_ttft_cdf(req, by="model.max_model_len")


# --- 7. the TTFT decomposition's "other" ---------------------------------------------------------


def _onboard_frame() -> pd.DataFrame:
    """Group b: blocking onboarding (onboard_s = write-back wait + disk + host); group l:
    layerwise (the loads overlap the prefill: onboard_s is the stall, shorter than the loads)."""
    return pd.DataFrame({
        "codec": ["b", "b", "l", "l"], "status": ["finished"] * 4,
        "queue_s": [1.0, 0.0, 0.5, 0.5],
        "onboard_host_s": [0.2, 0.1, 0.3, 0.0],
        "onboard_disk_s": [0.3, 0.0, 0.4, 0.0],
        "onboard_s": [0.5 + 0.25, 0.1, 0.35, 0.0],  # b: waits 0.25 and 0; l: stall 0.35, none
        "prefill_s": [1.0, 2.0, 1.0, 0.5],
    }).assign(ttft_s=lambda d: d["queue_s"] + d["onboard_s"] + d["prefill_s"])


def test_ttft_decomposition_names_the_onboarding_wait_and_other_is_only_the_rest():
    """Was: the onboarding that is neither a host copy nor a disk read (write-back waits, layer
    stalls) was drawn as "other" ("e.g. waiting behind other prefills"), and with layerwise
    loads (longer than the stall they cause) "other" went negative."""
    d = P.ttft_decomposition(_onboard_frame(), by="codec")
    assert list(d.columns) == ["queue_s", "onboard_host_s", "onboard_disk_s", "onboard_wait_s",
                               "prefill_s", "other", "ttft_s"]
    b, lw = d.loc["b"], d.loc["l"]
    assert b["onboard_host_s"] == pytest.approx(0.15) and b["onboard_disk_s"] == pytest.approx(0.15)
    assert b["onboard_wait_s"] == pytest.approx(0.125)  # the write-back wait
    # layerwise: the 0.35 s stall is the loads' end: all 0.3 s of host copies, 0.05 s of disk
    assert lw["onboard_host_s"] == pytest.approx(0.15) and lw["onboard_disk_s"] == pytest.approx(0.025)
    assert lw["onboard_wait_s"] == pytest.approx(0.0)
    assert (d.drop(columns="ttft_s") >= -1e-12).all().all()
    assert d["other"].abs().max() < 1e-12
    pd.testing.assert_series_equal(d.drop(columns="ttft_s").sum(axis=1), d["ttft_s"],
                                   check_names=False)
    v = P.ttft_part_values(_onboard_frame())
    onboard = v[["onboard_host_s", "onboard_disk_s", "onboard_wait_s"]].sum(axis=1)
    assert np.allclose(onboard, _onboard_frame()["onboard_s"])
    # without onboard_s the rest of the onboarding can only be "other" (as before)
    d2 = P.ttft_decomposition(_onboard_frame().drop(columns="onboard_s"), by="codec")
    assert "onboard_wait_s" not in d2.columns and d2.loc["b", "other"] == pytest.approx(0.125)
    assert "e.g. waiting behind other prefills" not in P.ttft_decomposition.__doc__
    assert "onboard_wait_s" in P.ttft_part_values.__doc__


@pytest.mark.parametrize("onboard", ["blocking", "layerwise"])
def test_ttft_decomposition_on_the_simulators_own_requests_table(tmp_path, onboard):
    """On a run with host and disk tiers: every part >= 0, "other" is 0, and with blocking
    onboarding the tier parts are the recorded columns and the wait is onboard_s minus them."""
    from sim.run import compose_config, run_simulation

    out = tmp_path / "run"
    run_simulation(compose_config(["trace.max_requests=200", "cache.num_gpu_blocks=3000",
                                   "tiers=gpu_host_disk", "tiers.host_gib=2",
                                   f"tiers.onboard={onboard}", "sim.progress=false"]), out)
    req = pd.read_parquet(out / "requests.parquet").assign(mode=onboard)
    fin = req[req["status"] == "finished"]
    assert (fin["onboard_host_s"] + fin["onboard_disk_s"] > 0).sum() >= 5
    v = P.ttft_part_values(fin)
    assert (v >= 0).all().all()
    assert np.allclose(v.sum(axis=1), fin["ttft_s"], rtol=1e-9, atol=1e-9)
    gap = fin["onboard_s"] - fin["onboard_host_s"] - fin["onboard_disk_s"]
    if onboard == "blocking":
        assert np.allclose(v["onboard_host_s"], fin["onboard_host_s"])
        assert np.allclose(v["onboard_disk_s"], fin["onboard_disk_s"])
        assert (gap > 1e-9).any() and np.allclose(v["onboard_wait_s"], gap)
    else:
        assert (gap < -1e-9).any()  # the loads overlapped the prefill
    d = P.ttft_decomposition(req, by="mode")
    assert abs(d["other"].iloc[0]) < 1e-9 * d["ttft_s"].iloc[0]
    fig = P.plot_ttft_decomposition(req, by="mode")
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    # a part is in the legend where it is not 0 (layerwise loads hide behind the prefill)
    assert ("onboard wait (write-back, layer stall)" in labels) == (d["onboard_wait_s"].iloc[0] > 0)
    assert (onboard == "blocking") <= ("onboard wait (write-back, layer stall)" in labels)
    assert "other" not in labels


def test_cli_errors_name_the_cli_options(seeds, tmp_path, capsys):
    """Newcomer pass: kvsim-plot's errors told a command-line user to filter a DataFrame
    (runs[runs['trace'] == ...]) or pass agg='mean'; they name --where and --agg. The library
    keeps its own words."""
    assert P.main(["ttft-vs", str(seeds), "--x", "cache.block_size", "--hue", "trace",
                   "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsim-plot: error: plot_ttft_vs: several runs share the same")
    assert "--where COL=VALUE" in err and "--agg mean" in err and "runs[" not in err
    runs = pd.read_parquet(seeds / "runs.parquet")
    with pytest.raises(P.PlotError, match=r"runs\[runs\['trace'\] == \.\.\.\]\) or pass agg='mean'"):
        P.plot_ttft_vs(runs, x="cache.block_size", hue="trace")
    # no rounds at all (no policy evicted): one line saying there is nothing to draw and why
    (seeds / "rounds" / "job=0").mkdir(parents=True)
    pd.DataFrame({"run_id": pd.Series([], dtype=str), "tokens_evicted": pd.Series([], dtype="int64"),
                  "blocks_freed": pd.Series([], dtype="int64"), "policy": pd.Series([], dtype=str),
                  "compaction": pd.Series([], dtype=str)}).to_parquet(
        seeds / "rounds" / "job=0" / "part-0.parquet")
    assert P.main(["blocks-freed", str(seeds), "--out", str(tmp_path / "b.png")]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line == ("kvsim-plot: error: blocks-freed: no compression rounds in these runs, "
                    "nothing to draw (policy=full evicts nothing; a policy's rounds start once a "
                    "request passes policy.budget)")
    assert not (tmp_path / "x.png").exists() and not (tmp_path / "b.png").exists()


# --- a collected output.dir run that kept a group's default --------------------------------------


def test_output_dir_runs_keep_every_group_option_and_curves_by_group_draw(tmp_path, capsys):
    """Break-it: two ``output.dir`` runs (no ``.hydra/``), one with ``codec=nvfp4``: the base
    run's codec column was null (its overrides name no codec), and ``kvsim-plot ttft-cdf`` (by
    codec) raised TypeError in the labels. The CLI now records every group's option in
    summary.json (``config_choices``) and the collector reads them."""
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


def test_a_group_a_run_did_not_record_is_labelled_null_not_a_type_error(tmp_path):
    """A run collected without its group's option (a summary of an older kvsim, no .hydra/):
    its rows read back as a categorical null, which ``astype(str)`` kept a float NaN
    (TypeError in the labels); the curve is now labelled "null"."""
    req = pd.DataFrame({"ttft_s": [0.1, 0.2, 0.3, 0.4], "status": ["finished"] * 4,
                        "codec": pd.Categorical(["nvfp4", "nvfp4", None, None])})
    fig = P.plot_ttft_cdf(req, by="codec")
    labels = sorted(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    assert labels == ["null (n=2)", "nvfp4 (n=2)"]


def test_an_option_of_another_figure_gets_the_figures_usage_and_says_which_take_it(
        seeds, tmp_path, capsys):
    """Newcomer pass: ``kvsim-plot ttft-cdf ... --agg mean`` printed the top-level usage
    (``kvsim-plot [-h] FIGURE ...``) and "unrecognized arguments", not which figures take it;
    regression pass: before the folder (``ttft-cdf --agg mean DIR``) the folder was named as the
    stray argument, and without --out the hint was lost."""
    out = ["--out", str(tmp_path / "x.png")]
    for args, says in (
            (["ttft-cdf", str(seeds), *out, "--agg", "mean"],
             "argument --agg: ttft-cdf has no --agg; hit-by-tier, disk-share, ttft-vs take it"),
            (["ttft-cdf", "--agg", "mean", str(seeds), *out], "ttft-cdf has no --agg;"),
            (["ttft-cdf", "--agg=mean", str(seeds)], "ttft-cdf has no --agg;"),
            (["hit-by-tier", str(seeds), *out, "--by", "codec"],
             "hit-by-tier has no --by; ttft-cdf, ttft-decomposition,"),
            (["ttft-cdf", str(seeds), *out, "--request-id", "3"], "fragmentation takes it"),
            (["ttft-cdf", str(seeds), *out, "--bogus"], "unrecognized arguments: --bogus")):
        with pytest.raises(SystemExit) as e:
            P.main(args)
        assert e.value.code == 2
        err = capsys.readouterr().err
        fig = args[0]
        assert f"usage: kvsim-plot {fig} " in err and f"kvsim-plot {fig}: error: " in err, err
        assert says in err, err
    assert not (tmp_path / "x.png").exists()


def test_a_column_named_twice_in_by_counts_once(seeds, tmp_path):
    """Regression pass: ``--by codec,codec`` ended in pandas' "column label is not unique"."""
    assert P._as_list("cache.block_size,seed,cache.block_size,") == ["cache.block_size", "seed"]
    for fig in ("ttft-cdf", "ttft-decomposition"):
        assert P.main([fig, str(seeds), "--by", "cache.block_size,cache.block_size,seed",
                       "--out", str(tmp_path / f"{fig}.png")]) == 0


def test_a_results_folder_mixing_sweeps_is_warned_and_listed(tmp_path, capsys):
    """Break-it pass: two sweeps' output.dir runs in one results folder were collected as one,
    with no word (their curves pooled). The collection now lists each run's sweep in
    manifest.json ``sweeps`` and warns when there is more than one; one sweep is not warned."""
    root = tmp_path / "res"
    for name, sweep in (("a0", "S1 0"), ("a1", "S1 1"), ("b0", "S2 0"), ("one", None)):
        d = _fake_run(root / name, 0, {"cache.block_size": 16})
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
