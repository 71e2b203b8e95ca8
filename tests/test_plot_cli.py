"""``kvsim-plot`` and :mod:`experiments.plots` on collected sweeps: usage errors (``--x`` equal to
``--hue``, ``--agg`` outside its choices, an option of another figure) as one line, warnings for
curves that pool runs of another parameter and for runs with nothing to draw, ``--agg``, and
the TTFT decomposition, whose parts sum to the TTFT with the onboarding wait apart.

The sweeps are fake run folders (``fake_sweeps``), so the tests are quick; one test runs the
simulator to check the decomposition on its own tables."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import SINGLE_ENGINE
from experiments import collect as C
from experiments import plots as P
from fake_sweeps import fake_sweep



@pytest.fixture
def seeds(tmp_path) -> Path:
    """Collected: cache.block_size=16,32 x seed=0,1 (two runs per block size)."""
    sw = fake_sweep(tmp_path / "sw4", [{"cache.block_size": b, "seed": s}
                                       for b in (16, 32) for s in (0, 1)])
    return C.collect(sw, tmp_path / "c4", quiet=True).out_dir


@pytest.fixture
def grid(tmp_path) -> Path:
    """Collected: cache.block_size=16,32 x scheduler.max_num_seqs=64,128,256 (README's grid)."""
    sw = fake_sweep(tmp_path / "sw6", [{"cache.block_size": b, "scheduler.max_num_seqs": m}
                                       for b in (16, 32) for m in (64, 128, 256)])
    return C.collect(sw, tmp_path / "c6", quiet=True).out_dir


@pytest.fixture
def rejected(tmp_path) -> Path:
    """Collected: model.max_model_len=100 (every request rejected), 200000."""
    sw = fake_sweep(tmp_path / "sw2", [{"model.max_model_len": 100, "finished": False},
                                       {"model.max_model_len": 200000}])
    return C.collect(sw, tmp_path / "c2", quiet=True).out_dir


def test_x_equal_to_hue_is_an_error_not_a_traceback(seeds, tmp_path, capsys):
    """``--x`` equal to ``--hue`` is one error line naming both options and the column (exit 2),
    and a PlotError from the library; no image is written."""
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
    """``--agg`` takes mean, median, min or max: another value (``sum`` would add percentiles of
    several runs) is a usage error naming the choices (exit 2), and a PlotError from the
    library."""
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
    """``agg=max`` draws the largest value of the runs sharing a cell, and a PlotWarning says how
    many runs it combines, as the per-request figures say what they pool."""
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


@pytest.mark.parametrize("fig", ["ttft-cdf", "ttft-decomposition", "pool-fragmentation"])
def test_by_group_pooling_runs_of_another_parameter_is_warned(grid, tmp_path, capsys, fig):
    """A ``--by`` group holding runs that differ in another swept parameter is drawn pooled
    with one warning line naming that parameter, the runs per group and the two ways to
    separate them (``--where``, a longer ``--by``); separated runs get no warning."""
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
    """Runs that differ only in seed are pooled per group, with a warning naming seed."""
    assert P.main(["ttft-cdf", str(seeds), "--by", "cache.block_size",
                   "--out", str(tmp_path / "s.png")]) == 0
    err = capsys.readouterr().err
    assert "pools runs that differ in seed (cache.block_size=16: 2 runs, cache.block_size=32: 2 runs)" in err


@pytest.mark.parametrize("fig, extra, what", [
    ("ttft-cdf", ["--by", "model.max_model_len"], "no finished request"),
    ("ttft-decomposition", ["--by", "model.max_model_len"], "no finished request"),
    ("ttft-vs", ["--x", "model.max_model_len", "--hue", "trace"], "ttft_s.p50"),
    ("hit-by-tier", ["--x", "model.max_model_len", "--hue", "trace"], "hit_ratio.total"),
])
def test_runs_with_nothing_to_draw_are_named_in_a_warning(rejected, tmp_path, capsys, fig, extra,
                                                          what):
    """A run with nothing to draw (no request finished, so no TTFT or hit ratio) is left out
    of the figure with one warning line naming the run, why, and what it lacks; the other runs
    are drawn."""
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
    """The library's figures give the same warning as a PlotWarning."""
    req = pd.read_parquet(rejected / "requests")
    with pytest.warns(P.PlotWarning, match=r"left out 1 run\(s\) .*run 0 \(6 requests: 6 rejected\)"):
        P.plot_ttft_cdf(req, by="model.max_model_len")


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
    """The TTFT parts are queue, host copy, disk read, onboard wait (the onboarding that is
    neither: write-back waits, layer stalls) and prefill; each is >= 0 and they sum to the TTFT,
    so "other" is 0. With layerwise loads (longer than the stall they cause) the stall is split
    over the loads in their order. Without onboard_s the rest of the onboarding is "other"."""
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
    # without onboard_s the rest of the onboarding can only be "other"
    d2 = P.ttft_decomposition(_onboard_frame().drop(columns="onboard_s"), by="codec")
    assert "onboard_wait_s" not in d2.columns and d2.loc["b", "other"] == pytest.approx(0.125)
    assert "onboard_wait_s" in P.ttft_part_values.__doc__


@pytest.mark.parametrize("onboard", ["blocking", "layerwise"])
def test_ttft_decomposition_on_the_simulators_own_requests_table(tmp_path, onboard):
    """On a run with host and disk tiers: every part >= 0, "other" is 0, and with blocking
    onboarding the tier parts are the recorded columns and the wait is onboard_s minus them."""
    from sim.run import compose_config, run_simulation

    out = tmp_path / "run"
    run_simulation(compose_config([*SINGLE_ENGINE, "trace.max_requests=200", "cache.num_gpu_blocks=3000",
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
    """kvsim-plot's errors name its subcommand and options (ttft-vs, --where, --agg) where the
    library's name its function and arguments (plot_ttft_vs, a DataFrame filter, agg='mean');
    its warnings name the subcommand too; a collection with no compression round is one
    line saying there is nothing to draw and why."""
    assert P.main(["ttft-vs", str(seeds), "--x", "cache.block_size", "--hue", "trace",
                   "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsim-plot: error: ttft-vs: several runs share the same")
    assert "--where COL=VALUE" in err and "--agg mean" in err and "runs[" not in err
    assert P.main(["ttft-vs", str(seeds), "--x", "cache.block_size", "--hue", "trace",
                   "--agg", "max", "--out", str(tmp_path / "w.png")]) == 0
    warned = [ln for ln in capsys.readouterr().err.splitlines() if "warning" in ln]
    assert warned and all(ln.startswith("kvsim-plot: warning: ttft-vs: ") for ln in warned), warned
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


def test_a_group_a_run_did_not_record_is_labelled_null_not_a_type_error(tmp_path):
    """A run collected without its group's option (a summary that does not record it, no
    .hydra/) reads back as a categorical null; its curve is labelled "null"."""
    req = pd.DataFrame({"ttft_s": [0.1, 0.2, 0.3, 0.4], "status": ["finished"] * 4,
                        "codec": pd.Categorical(["nvfp4", "nvfp4", None, None])})
    fig = P.plot_ttft_cdf(req, by="codec")
    labels = sorted(t.get_text() for t in fig.axes[0].get_legend().get_texts())
    assert labels == ["null (n=2)", "nvfp4 (n=2)"]


def test_an_option_of_another_figure_gets_the_figures_usage_and_says_which_take_it(
        seeds, tmp_path, capsys):
    """An option another figure takes (``ttft-cdf --agg mean``) gets the figure's own usage and
    an error naming the figures that take it, wherever it stands on the command line (before
    the folder, with ``=``, without --out); an unknown option is "unrecognized arguments"."""
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
    """A column named twice in ``--by`` (and a trailing comma) counts once."""
    for fig in ("ttft-cdf", "ttft-decomposition"):
        assert P.main([fig, str(seeds), "--by", "cache.block_size,cache.block_size,seed,",
                       "--out", str(tmp_path / f"{fig}.png")]) == 0


def test_save_names_an_out_path_that_cannot_take_an_image(tmp_path):
    """:func:`experiments.plots.save` refuses an empty path, a folder and a path under a file,
    naming the problem and writing nothing, and names the OS's reason for a folder it cannot
    make (/proc takes no folders)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (tmp_path / "afile").write_text("x")
    for path, why in (("", "an empty path; expected an image file's path"),
                      (tmp_path, "is a folder"),
                      (tmp_path / "afile" / "x.png", "is a file, not a folder")):
        with pytest.raises(P.PlotError, match=re.escape(why)):
            P.save(plt.figure(), path)
    with pytest.raises(P.PlotError, match="cannot save figure to '/proc/kvsim_no/x.png': "):
        P.save(plt.figure(), "/proc/kvsim_no/x.png")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
