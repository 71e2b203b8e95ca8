"""What each figure of :mod:`experiments.plots` shows: one curve / bar per run of a sweep by
default, curves told apart by colour and line style, legends outside the data, titles that say
what is compared, the blocks figures' net and gross numbers, and the table saved beside a figure.

The sweeps are fake run folders (what ``kvsim -m`` writes, as far as ``kvsim-collect`` reads it)
with known numbers, so every test is quick.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
import pytest
import yaml

matplotlib.use("Agg")

from experiments import collect as C  # noqa: E402
from experiments import plots as P  # noqa: E402


def _write_run(d: Path, job: int, overrides: dict, requests: pd.DataFrame,
               steps: pd.DataFrame | None = None, rounds: pd.DataFrame | None = None) -> None:
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(
        [f"{k}={v}" for k, v in overrides.items()] + ["sim.progress=false"]))
    cfg: dict = {"seed": 0, "cache": {"block_size": 16}, "scheduler": {"max_num_seqs": 8}}
    for k, v in overrides.items():
        node = cfg
        *path, leaf = k.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = v
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(cfg))
    choices = {"codec": "identity", "policy": overrides.get("policy", "full")}
    (d / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(
        {"hydra": {"job": {"num": job}, "runtime": {"choices": choices}}}))
    fin = requests[requests["status"] == "finished"]
    (d / "summary.json").write_text(json.dumps({
        "complete": True, "requests_total": len(requests), "requests_finished": len(fin),
        "ttft_s": {"p50": float(fin["ttft_s"].median())}}))
    requests.to_parquet(d / "requests.parquet")
    if steps is not None:
        steps.to_parquet(d / "steps.parquet")
    if rounds is not None:
        rounds.to_parquet(d / "rounds.parquet")


def _requests(seed: int, n: int = 8) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    queue = rng.random(n) * 0.01 * (1 + seed)
    prefill = 0.02 + rng.random(n) * 0.01
    return pd.DataFrame({"request_id": np.arange(n), "status": ["finished"] * n,
                         "queue_s": queue, "onboard_s": 0.0, "onboard_host_s": 0.0,
                         "onboard_disk_s": 0.0, "prefill_s": prefill, "ttft_s": queue + prefill})


def _steps(blocks: list[int], live: list[int]) -> pd.DataFrame:
    n = len(blocks)
    return pd.DataFrame({"time_s": np.arange(n, dtype=float), "duration_s": np.ones(n),
                         "blocks_used": blocks, "live_kv_tokens": live})


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> Path:
    """Collected 2x2 sweep: cache.block_size=16,32 x scheduler.max_num_seqs=8,16; the block-size
    16 and 32 runs have the same steps (their curves lie on each other)."""
    tmp_path = tmp_path_factory.mktemp("grid")
    sw = tmp_path / "sw"
    job = 0
    for bs in (16, 32):
        for m in (8, 16):
            steps = _steps([4, 4, 6, 6], [40, 50, 80, 90])
            _write_run(sw / str(job), job, {"cache.block_size": bs, "scheduler.max_num_seqs": m},
                       _requests(job), steps)
            job += 1
    return C.collect(sw, tmp_path / "c", quiet=True).out_dir


@pytest.fixture(scope="module")
def policies(tmp_path_factory) -> Path:
    """Collected: policy=full,h2o x compaction=none,forward_pack. Blocks held per step: full
    10, 20, 30, 20; h2o/none 10, 15, 20, 15; h2o/forward_pack 10, 12, 15, 12 (one second per
    step). h2o's rounds evict 16 tokens each: none frees 1 block in 4 rounds, forward_pack 1 in
    every one of 40 rounds (churn)."""
    tmp_path = tmp_path_factory.mktemp("policies")
    sw = tmp_path / "pol"
    held = {("full", "none"): [10, 20, 30, 20], ("full", "forward_pack"): [10, 20, 30, 20],
            ("h2o", "none"): [10, 15, 20, 15], ("h2o", "forward_pack"): [10, 12, 15, 12]}
    for job, ((pol, comp), blocks) in enumerate(held.items()):
        rounds = None
        if pol == "h2o":
            k = 40
            rounds = pd.DataFrame({
                "time_s": np.linspace(0, 3, k), "request_id": np.arange(k) % 2,
                "policy": pol, "compaction": comp, "tokens_evicted": 16.0,
                "blocks_freed": (1 if comp == "forward_pack" else (np.arange(k) % 4 == 0) * 1),
                "bytes_moved": 2.0**20 * (comp == "forward_pack"),
                "fragmentation_after": 0.0 if comp == "forward_pack" else 0.3})
        _write_run(sw / str(job), job, {"policy": pol, "compaction": comp}, _requests(job),
                   _steps(blocks, [b * 16 for b in blocks]), rounds)
    return C.collect(sw, tmp_path / "pc", quiet=True).out_dir


def _bars(ax) -> list:
    return [p for p in ax.patches if p.get_width() > 0]


# --- default grouping: one curve / bar per run --------------------------------------------------


def test_varying_keys_are_the_overrides_that_differ_between_runs(grid):
    runs = pd.read_parquet(grid / "runs.parquet")
    assert P.varying_keys(runs) == ["cache.block_size", "scheduler.max_num_seqs"]
    assert P.default_by(runs) == ["cache.block_size", "scheduler.max_num_seqs"]
    assert P.varying_keys(runs[runs["cache.block_size"] == 16]) == ["scheduler.max_num_seqs"]
    one = runs.head(1)
    assert P.default_by(one) == [] and P.default_by(pd.concat([one, one])) == ["run_id"]


def test_ttft_decomposition_draws_one_bar_per_run_of_a_sweep_by_default(grid, tmp_path, capsys):
    out = tmp_path / "d.png"
    fig = P._draw(P_args("ttft-decomposition", grid, out), P.load_collected(grid))
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [f"block_size={b}, max_num_seqs={m}" for b in (16, 32) for m in (8, 16)]
    queue = [p for p in _bars(ax) if p.get_facecolor()[:3] == matplotlib.colors.to_rgb(
        P.TTFT_PART_COLORS["queue_s"])]
    assert len(queue) == 4  # one queue segment per run, none pooled
    assert P.main(["ttft-decomposition", str(grid), "--out", str(out)]) == 0
    assert "pools" not in capsys.readouterr().err


@pytest.mark.parametrize("figure", ["ttft-cdf", "pool-fragmentation"])
def test_curve_figures_draw_one_curve_per_run_by_default(grid, tmp_path, capsys, figure):
    out = tmp_path / "c.png"
    assert P.main([figure, str(grid), "--out", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    data = pd.read_csv(out.with_suffix(".csv"))
    assert len(data.groupby(["cache.block_size", "scheduler.max_num_seqs"])) == 4


def P_args(figure, collected, out, **kw):
    """The argparse namespace kvsim-plot builds for ``figure`` with its defaults."""
    import argparse

    base = {"figure": figure, "collected": str(collected), "out": str(out), "where": None,
            "by": None, "x": None, "hue": None, "agg": None, "tail": None, "request_id": None,
            "dpi": 150}
    base.update(kw)
    return argparse.Namespace(**base)


# --- curves told apart, legends outside, titles and units ---------------------------------------


def test_group_styles_give_each_curve_its_colour_and_the_last_key_its_line_style():
    df = pd.DataFrame({"a": [16, 16, 32, 32], "b": [8, 16, 8, 16]})
    st = P.group_styles(df, ["a", "b"])
    assert len({s["color"] for s in st.values()}) == 4
    assert st["16 / 8"]["linestyle"] == st["32 / 8"]["linestyle"] != st["16 / 16"]["linestyle"]
    widths = [s["linewidth"] for s in st.values()]
    assert widths == sorted(widths, reverse=True) and widths[0] > widths[-1]


def test_a_curve_lying_on_another_stays_visible():
    """Two block sizes with the same tokens per slot: the block-size-16 curve is drawn first and
    wider than the block-size-32 one over it, in another colour and line style."""
    one = _steps([4, 4, 6, 6], [40, 50, 80, 90])
    steps = pd.concat([one.assign(run_id="a", **{"cache.block_size": 16}),
                       one.assign(run_id="b", **{"cache.block_size": 32},
                                  live_kv_tokens=one["live_kv_tokens"] * 2)])
    fig = P.plot_pool_fragmentation(steps, by=["cache.block_size"])
    l16, l32 = [ln for ln in fig.axes[0].get_lines() if ln.get_label() in ("16", "32")]
    assert np.isfinite(l16.get_ydata()).sum() > 100  # (one unbroken curve over the 4 s)
    assert np.allclose(l16.get_ydata(), l32.get_ydata(), equal_nan=True)
    assert l16.get_linewidth() > l32.get_linewidth() + 1
    assert l16.get_color() != l32.get_color() and l16.get_linestyle() != l32.get_linestyle()


def _inside(inner, outer) -> bool:
    return inner.overlaps(outer) and not (inner.x0 >= outer.x1 - 1 or inner.y1 <= outer.y0 + 1)


@pytest.fixture(scope="module")
def figures(grid, policies):
    """Every figure, drawn from the fake sweeps (closed afterwards)."""
    import matplotlib.pyplot as plt

    figs = _figures(grid, policies)
    yield figs
    for f in figs.values():
        plt.close(f)


def _figures(grid, policies):
    col, pol = P.load_collected(grid), P.load_collected(policies)
    req = col.table("requests")
    steps = col.table("steps", run_columns=["cache.block_size"])
    rounds = pol.table("rounds")
    psteps = pol.table("steps", run_columns=["cache.block_size", "policy"])
    by = ["cache.block_size", "scheduler.max_num_seqs"]
    runs = col.runs.assign(**{"hit_ratio.gpu": 0.5, "hit_ratio.host": 0.1, "hit_ratio.disk": 0.0,
                              "hit_ratio.total": 0.6, "disk_share_of_hits": 0.0,
                              "ttft_s.p90": 0.1, "ttft_s.p99": 0.2})
    return {
        "ttft-cdf": P.plot_ttft_cdf(req, by=by),
        "ttft-decomposition": P.plot_ttft_decomposition(req, by=by),
        "pool-fragmentation": P.plot_pool_fragmentation(steps, by=by),
        "blocks-freed": P.plot_blocks_freed(rounds, by=["policy", "compaction"], steps=psteps),
        "fragmentation": P.plot_fragmentation(rounds, by=["policy", "compaction"]),
        "bytes-moved": P.plot_bytes_moved(rounds, by=["policy", "compaction"]),
        "hit-by-tier": P.plot_hit_by_tier(runs, x="cache.block_size", hue="scheduler.max_num_seqs"),
        "disk-share": P.plot_disk_share(runs, x="cache.block_size", hue="scheduler.max_num_seqs"),
        "ttft-vs": P.plot_ttft_vs(runs, x="cache.block_size", hue="scheduler.max_num_seqs"),
    }


def test_every_figure_has_its_question_as_title_and_its_legends_outside_the_data(figures):
    figs = figures
    assert sorted(figs) == sorted(P.FIGURES)
    for name, fig in figs.items():
        fig.canvas.draw()
        title = fig.get_suptitle()
        assert title.split("\n")[0].endswith("?"), (name, title)
        assert " per " in title.replace("\n", " "), (name, title)  # says what it compares
        legends = [a.get_legend() for a in fig.axes if a.get_legend()] + list(fig.legends)
        assert legends, name
        for lg in legends:
            box = lg.get_window_extent()
            for ax in fig.axes:
                assert not _inside(box, ax.get_window_extent()), (name, lg.get_title().get_text())


def _label_boxes(fig) -> list[tuple[str, object]]:
    """Window boxes of what a legend must not cover: each axes' data area, axis titles, panel
    title and tick labels, and the figure's title and shared axis titles (after a draw)."""
    from matplotlib.text import Text

    boxes = []
    for ax in fig.axes:
        boxes.append(("data area", ax.get_window_extent()))
        for what, t in (("x-axis title", ax.xaxis.label), ("y-axis title", ax.yaxis.label),
                        ("panel title", ax.title)):
            if t.get_text() and t.get_visible():
                boxes.append((f"{what} {t.get_text()!r}", t.get_window_extent()))
        for t in ax.get_xticklabels() + ax.get_yticklabels():
            if t.get_text() and t.get_visible():
                boxes.append((f"tick label {t.get_text()!r}", t.get_window_extent()))
    shared = {fig.get_suptitle(), fig.get_supxlabel(), fig.get_supylabel()} - {""}
    for t in fig.findobj(Text):
        if t.figure is fig and t.get_text() in shared and t.get_visible():
            boxes.append((f"figure title {t.get_text()[:30]!r}", t.get_window_extent()))
    return boxes


def _legend_collisions(fig) -> list[str]:
    """What each legend of ``fig`` covers by more than half a pixel each way (after a draw)."""
    fig.canvas.draw()
    legends = [a.get_legend() for a in fig.axes if a.get_legend()] + list(fig.legends)
    hits = []
    for lg in legends:
        lb = lg.get_window_extent()
        for what, b in _label_boxes(fig):
            if min(lb.x1, b.x1) - max(lb.x0, b.x0) > 0.5 and min(lb.y1, b.y1) - max(lb.y0, b.y0) > 0.5:
                hits.append(f"legend {lg.get_title().get_text()!r} covers {what}")
    return hits


def _blocks_sweep(n: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Rounds and steps of ``n`` runs (policy x compaction; the first is h2o/none, full's runs
    have no rounds), 20 steps of one second each."""
    pairs = [(p, c) for p in ("h2o", "full", "snapkv", "streaming_llm")
             for c in ("none", "forward_pack", "hole_fill")][:n]
    steps, rounds = [], []
    for i, (pol, comp) in enumerate(pairs):
        b = 100 + 10 * ((np.arange(20) + i) % 7)
        steps.append(_steps(list(b), list(b * 16)).assign(run_id=f"r{i}", policy=pol,
                                                          compaction=comp))
        if pol != "full":
            rounds.append(pd.DataFrame({"run_id": f"r{i}", "policy": pol, "compaction": comp,
                                        "time_s": np.arange(5.0), "request_id": 0,
                                        "tokens_evicted": 16.0 * (i + 1), "blocks_freed": 1}))
    return pd.concat(rounds), pd.concat(steps).assign(**{"cache.block_size": 16})


def test_legends_cover_no_axis_title_tick_label_or_data(figures):
    for name, fig in figures.items():
        assert not _legend_collisions(fig), name


@pytest.mark.parametrize("n", [1, 4, 12])
@pytest.mark.parametrize("dpi", [80, 100])
def test_blocks_freed_legends_clear_the_axis_titles_for_any_number_of_runs(n, dpi):
    import matplotlib.pyplot as plt

    rounds, steps = _blocks_sweep(n)
    fig = P.plot_blocks_freed(rounds, by=["policy", "compaction"], steps=steps)
    fig.set_dpi(dpi)
    try:
        assert _legend_collisions(fig) == []
    finally:
        plt.close(fig)


def test_hit_by_tier_legend_clears_the_title_with_one_hue():
    import matplotlib.pyplot as plt

    fig = P.plot_hit_by_tier(_fake_runs()[lambda r: r["codec"] == "identity"])
    try:
        assert _legend_collisions(fig) == []
    finally:
        plt.close(fig)


def test_axes_name_their_units(figures):
    figs = figures
    labels = {n: [a.get_xlabel() for a in f.axes] + [a.get_ylabel() for a in f.axes]
              + [f.get_supxlabel()] for n, f in figs.items()}
    assert "TTFT (s, log scale)" in labels["ttft-cdf"]
    assert "mean TTFT (ms)" in labels["ttft-decomposition"]
    assert "block size (tokens; cache.block_size)" in labels["hit-by-tier"]
    assert "simulated time (s)" in labels["blocks-freed"] and "GPU blocks held" in labels[
        "blocks-freed"]
    assert "GiB moved (total over the run)" in labels["bytes-moved"]


def test_a_where_filter_is_named_in_the_title(grid, tmp_path):
    fig = P._draw(P_args("ttft-cdf", grid, tmp_path / "w.png", where=["cache.block_size=32"]),
                  P.load_collected(grid))
    title = fig.get_suptitle()
    assert title.endswith("\nruns with cache.block_size=32") and "one curve per scheduler" in title


def test_fragmentation_title_says_which_request_and_why(policies):
    rounds = P.load_collected(policies).table("rounds")
    fig = P.plot_fragmentation(rounds, by=["policy", "compaction"])
    title = fig.get_suptitle()
    assert "request 0 (the request with the most eviction rounds)" in title
    assert "one curve per policy / compaction" in title


# --- the blocks figure: held over time, net against full, gross --------------------------------


def test_blocks_freed_net_saving_is_against_the_same_run_with_policy_full(policies):
    col = P.load_collected(policies)
    rounds = col.table("rounds")
    steps = col.table("steps", run_columns=["cache.block_size", "policy"])
    fig = P.plot_blocks_freed(rounds, by=["policy", "compaction"], steps=steps)
    t = P.figure_data(fig).set_index(["policy", "compaction"])
    assert t.loc[("h2o", "forward_pack"), "peak_blocks"] == 15
    assert t.loc[("h2o", "forward_pack"), "baseline_peak_blocks"] == 30
    assert t.loc[("h2o", "forward_pack"), "peak_saved_frac"] == pytest.approx(0.5)
    assert t.loc[("h2o", "none"), "mean_blocks"] == pytest.approx(15.0)
    assert t.loc[("h2o", "none"), "mean_saved_frac"] == pytest.approx(1 - 15 / 20)
    # gross: every forward_pack round frees a block, 40 against the 40 blocks' worth evicted
    assert t.loc[("h2o", "forward_pack"), "gross_blocks_freed"] == 40
    assert t.loc[("h2o", "none"), "gross_blocks_freed"] == 10
    assert t.loc[("h2o", "none"), "tokens_evicted_blocks"] == 40
    assert t.loc[("full", "none"), "gross_blocks_freed"] == 0
    held = P.figure_data(fig, "held")
    assert len(held.groupby(["policy", "compaction"])) == 4
    top = fig.axes[0]
    assert len(top.get_lines()) == 4 and top.get_ylabel() == "GPU blocks held"
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "peak -50%, mean -39%" in texts and "baseline" in texts  # (12.25 vs 20 on average)


def test_blocks_freed_draws_totals_not_a_per_round_scatter(policies):
    """Every h2o round evicts 16 tokens: a per-round scatter would put every point at x=16."""
    from matplotlib.collections import PathCollection

    col = P.load_collected(policies)
    fig = P.plot_blocks_freed(col.table("rounds"), by=["policy", "compaction"],
                              steps=col.table("steps", run_columns=["policy"]))
    assert not [c for ax in fig.axes for c in ax.collections if isinstance(c, PathCollection)]


def test_blocks_freed_without_steps_draws_the_gross_frees_and_says_what_is_missing(policies):
    rounds = P.load_collected(policies).table("rounds", run_columns=["cache.block_size"])
    with pytest.warns(P.PlotWarning, match="no steps table given"):
        fig = P.plot_blocks_freed(rounds, by=["policy", "compaction"])
    assert len(fig.axes) == 1 and "gross" in fig.axes[0].get_title()


def test_blocks_freed_command_line_reads_steps_and_writes_both_tables(policies, tmp_path, capsys):
    out = tmp_path / "b.png"
    assert P.main(["blocks-freed", str(policies), "--out", str(out), "--dpi", "60"]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {out} (its data: {out.with_suffix('.csv')}, ")
    assert out.with_suffix(".held.csv").is_file()
    assert pd.read_csv(out.with_suffix(".csv"))["baseline_peak_blocks"].notna().all()


# --- pool fragmentation: tokens per allocated slot, binned ---------------------------------------


def test_pool_fragmentation_is_tokens_per_slot_weighted_by_time_in_each_bin():
    steps = pd.DataFrame({"run_id": "a", "g": "x", "time_s": [0.0, 1.0, 4.0, 5.0, 8.0],
                          "duration_s": [1.0, 3.0, 1.0, 1.0, 1.0],
                          "blocks_used": [2, 4, 1, 0, 1], "live_kv_tokens": [16, 64, 40, 0, 8]})
    fig = P.plot_pool_fragmentation(steps, by="g", block_size=16, nbins=3)
    d = P.figure_data(fig)
    # bins of 3 s: [0, 3) holds step 0 (1 s) and 2 s of step 1; [3, 6) 1 s of step 1 and steps
    # 2 and 3 (no block: no weight); [6, 9) step 4 only, 1 s of it
    assert d["tokens_per_slot"].tolist() == pytest.approx([(16 + 64 * 2) / (32 + 64 * 2),
                                                           (64 + 40) / (64 + 16), 8 / 16])
    assert d["t_start_s"].tolist() == [0.0, 3.0, 6.0]
    # an idle stretch (no step) breaks the curve instead of joining its ends
    idle = steps.assign(time_s=[0.0, 1.0, 14.0, 15.0, 28.0])
    fig = P.plot_pool_fragmentation(idle, by="g", block_size=16, nbins=29)
    (line,) = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "x"]
    assert np.isnan(line.get_ydata()).sum() == 2


# --- the table beside a figure -------------------------------------------------------------------


def test_save_writes_the_figures_table_beside_it(grid, tmp_path):
    req = P.load_collected(grid).table("requests")
    fig = P.plot_ttft_cdf(req, by="cache.block_size")
    want = P.figure_data(fig)
    P.save(fig, tmp_path / "f" / "cdf.svg", dpi=50)
    got = pd.read_csv(tmp_path / "f" / "cdf.csv")
    assert list(got.columns) == ["cache.block_size", "ttft_s", "fraction"]
    assert np.allclose(got["ttft_s"], want["ttft_s"]) and len(got) == 32
    assert (tmp_path / "f" / "cdf.svg").stat().st_size > 0
    fig = P.plot_ttft_cdf(req, by="cache.block_size")
    P.save(fig, tmp_path / "g.png", data=False)
    assert not (tmp_path / "g.csv").exists()


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
