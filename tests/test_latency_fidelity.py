"""experiments.latency_fidelity: the measured points, their split, their replay settings."""

import json

import numpy as np
import pytest

from experiments.latency_fidelity import (DATA, LABEL_LENGTHS, Point, blis_workload, load_points,
                                          point_overrides, simulate_point, summarize_errors)


@pytest.fixture(scope="module")
def points():
    return load_points()


def test_load_points_split_is_vllm_on_hopper(points):
    pts, skipped = points
    tune = [p for p in pts if p.split == "tune"]
    assert tune and all(p.framework == "vllm" and p.gpu in ("h100", "h200") for p in tune)
    held = [p for p in pts if p.split == "held_out"]
    assert held and all(p.framework != "vllm" or p.gpu not in ("h100", "h200") for p in held)
    # every measured value is a positive time in seconds, converted from microseconds
    raw = json.loads((DATA / "inferencex_absolutes.json").read_text())
    a = raw["anchors"][0]
    conc = min(a["absolute_ttft_us"], key=int)
    first = [p for p in pts if p.scenario == a["scenario"].removesuffix(".yaml")
             and p.label == a["label"] and p.concurrency == int(conc)]
    if first:
        assert first[0].ttft_s == pytest.approx(a["absolute_ttft_us"][conc] * 1e-6)
    assert all(p.ttft_s > 0 and p.tpot_s > 0 for p in pts)
    # an anchor is either a point set or skipped with a reason, never dropped silently
    kept = {(p.scenario, p.label) for p in pts}
    gone = {(s["scenario"].removesuffix(".yaml"), s["label"]) for s in skipped}
    assert len(kept) + len(gone) == len(raw["anchors"])
    assert all(s["reason"] for s in skipped)


def test_point_overrides_replay_the_deployment():
    p = Point("llama-3.1-70b-instruct-h200-fp8-vllm-tp4", "llama3_3_70b", "h200", "fp8", "vllm", 4,
              "8k1k", 32, 1.0, 0.02, "tune", kv_cache_dtype="fp8")
    ov = point_overrides(p, "operator", {"mfu": 0.5})
    assert "cost.tensor_parallel_size=4" in ov and "model.weight_quant=fp8" in ov
    assert "scheduler.max_num_seqs=32" in ov and "cache.kv_cache_dtype=fp8" in ov
    assert "cache.enable_prefix_caching=false" in ov and "cost.mfu=0.5" in ov
    assert LABEL_LENGTHS["8k1k"] == (8192, 1024)


def test_simulate_point_reports_a_config_that_cannot_run():
    # Llama-70B in BF16 does not fit one H100: an error row, not a number
    p = Point("x", "llama3_3_70b", "h100", "bf16", "vllm", 1, "1k1k", 4, 1.0, 0.02, "tune")
    r = simulate_point(p, "operator", None, 1, 0.8)
    assert np.isnan(r["sim_ttft_s"]) and "weights do not fit" in r["error"]


def test_summarize_errors_medians():
    import pandas as pd

    df = pd.DataFrame({"g": ["a", "a", "a"], "ttft_err": [0.1, -0.3, 0.2],
                       "tpot_err": [0.0, 0.05, np.nan]})
    s = summarize_errors(df, ["g"]).iloc[0]
    assert s["points"] == 2 and s["failed"] == 1
    assert s["ttft_mae"] == pytest.approx(0.2) and s["tpot_bias"] == pytest.approx(0.025)


def test_blis_workload_shares_only_the_guidellm_prefix():
    run = {"workload": {"profile": {"data": {"prefix_tokens": 64}}},
           "requests": {"columns": ["status", "client_start_unix_s", "prompt_tokens", "output_tokens"],
                        "rows": [["successful", 10.5, 100, 5], ["successful", 10.0, 70, 1],
                                 ["errored", 9.0, 80, 3]]}}
    wl, rows = blis_workload(run)
    assert len(wl) == 2 and [r["client_start_unix_s"] for r in rows] == [10.0, 10.5]
    np.testing.assert_allclose(wl.arrival_s, [0.0, 0.5])
    a, b = wl.prefix_ids_of(0), wl.prefix_ids_of(1)
    assert len(a) == 70 // 16 and len(b) == 100 // 16
    assert list(a[:4]) == list(b[:4]) == [0, 1, 2, 3]  # 64 shared tokens = 4 blocks
    assert not set(a[4:]) & set(b[4:])
