"""sim.calibrated_cost: cost.kind=calibrated reads per-operator GPU times (a calibration's
``operators`` section) term by term, the operator model elsewhere."""

import json

import numpy as np
import pytest

from conftest import SINGLE_ENGINE
from sim.calibrated_cost import CalibratedOperatorModel, _curve, _grid
from sim.cost import CALIBRATION_DIR, StretchShape
from sim.cost_models import build_cost_model
from sim.run import compose_config, run_simulation

M = [1, 16, 256, 4096]
BATCH = [1, 8, 64]
KV = [128, 1024, 8192]
NEW = [128, 1024]
CTX = [0, 4096]


def gemm_s(m, n, k):
    """The synthetic calibration's GEMM time (s): a floor plus a compute term."""
    return 5e-6 + 2.0 * m * n * k / 400e12


def operators_qwen3_8b():
    """Rows for Qwen3-8B (36 layers, 32/8 heads of 128, hidden 4096, MLP 12288, vocab 151936)
    at tp 1 in BF16, as gpu_validation.calibrate --model writes them."""
    shapes = [(6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (151936, 4096)]
    gemm = [dict(dtype="bf16", m=m, n=n, k=k, seconds=gemm_s(m, n, k), mode="graph")
            for n, k in shapes for m in M]
    dec = [dict(kv_dtype="bf16", batch=b, kv_tokens=kv, q_heads=32, kv_heads=8, head_dim=128,
                seconds_per_layer=3e-6 + b * kv * 2 * 8 * 128 * 2 / 3e12, method="sdpa",
                mode="graph") for b in BATCH for kv in KV]
    pre = [dict(kv_dtype="bf16", new_tokens=n, context_tokens=c, q_heads=32, kv_heads=8,
                head_dim=128, seconds_per_layer=1e-5 + n * (c + n / 2) * 4 * 32 * 128 / 500e12,
                method="sdpa", mode="graph") for n in NEW for c in CTX]
    return dict(gemm=gemm, grouped_gemm=[], attention_decode=dec, attention_prefill=pre,
                notes={"what": "synthetic rows for tests"})


@pytest.fixture(scope="module")
def cal_file(tmp_path_factory):
    raw = json.loads((CALIBRATION_DIR / "h200.json").read_text())
    raw["operators"] = operators_qwen3_8b()
    p = tmp_path_factory.mktemp("cal") / "h200_ops.json"
    p.write_text(json.dumps(raw))
    return p


def cfg(cal_file, *o):
    return compose_config([*SINGLE_ENGINE,
                           "sim.progress=false", "cost=calibrated", f"cost.file={cal_file}", *o])


def model_of(c):
    return build_cost_model(c.model, c.gpu, c.cache, c.cost)


def test_curve_and_grid_interpolate_hold_and_scale():
    f = _curve([1, 10], [2.0, 20.0])
    np.testing.assert_allclose(f([0.5, 1, 5.5, 10, 20]), [2.0, 2.0, 11.0, 20.0, 40.0])
    g = _grid([dict(x=x, y=y, t=x * y) for x in (1, 4) for y in (10, 100)], "x", "y", "t")
    assert g(2.5, 55)[0] == pytest.approx(2.5 * 55)  # bilinear is exact on x*y inside the grid
    assert g(8, 100)[0] == pytest.approx(800)  # proportional beyond the last x
    assert g(0.5, 10)[0] == pytest.approx(10)  # the first x held below it
    gp = _grid([dict(x=x, y=y, t=x * y) for x in (1, 4) for y in (10, 100)], "x", "y", "t",
               below_x="proportional")
    assert gp(0.5, 10)[0] == pytest.approx(5)  # or scaled in proportion


def test_gemm_and_attention_come_from_the_tables(cal_file):
    m = model_of(cfg(cal_file, "cost.layer_overhead_s=0"))
    assert isinstance(m, CalibratedOperatorModel)
    # 16 tokens, 16 lm_head rows: exactly the measured points
    want = 36 * (gemm_s(16, 6144, 4096) + gemm_s(16, 4096, 4096) + gemm_s(16, 24576, 4096)
                 + gemm_s(16, 4096, 12288)) + gemm_s(16, 151936, 4096)
    assert float(m.gemm_time(16, 16)) == pytest.approx(want, rel=1e-12)
    # between measured m: linear
    mid = 36 * (gemm_s(136, 6144, 4096) + gemm_s(136, 4096, 4096) + gemm_s(136, 24576, 4096)
                + gemm_s(136, 4096, 12288))
    assert float(m.gemm_time(136, 0)) == pytest.approx(mid, rel=1e-9)
    # decode attention: 8 sequences of mean 1024 cached + 1 new token
    ctx = np.full(8, 1023, dtype=np.int64)
    parts = m.breakdown(np.ones(8, dtype=np.int64), ctx, 8)
    d, p = parts["attention_decode"], parts["attention_prefill"]
    row = 3e-6 + 8 * 1024 * 2 * 8 * 128 * 2 / 3e12
    assert d == pytest.approx(36 * row, rel=1e-9) and p == 0.0
    cm = m.describe()
    assert set(cm["calibrated"]) == {"gemm", "decode_attention", "prefill_attention"}
    assert "collectives" not in cm["fallback_reasons"] and cm["kind"] == "calibrated"


def test_decode_steps_equal_step_time(cal_file):
    m = model_of(cfg(cal_file, "cost.seq_overhead_s=1e-5"))
    ctx0 = np.array([100, 2000, 9000], dtype=np.int64)
    durs, _ = m.stretch_times(StretchShape(ctx0, 30))
    per = [m.step_time(np.ones(3, dtype=np.int64), ctx0 + s, 3) for s in range(30)]
    np.testing.assert_allclose(durs, per, rtol=1e-12)


def test_unmatched_shapes_and_precisions_fall_back_with_reasons(cal_file):
    cm = model_of(cfg(cal_file, "model=llama3_1_8b")).describe()
    assert "gemm" in cm["fallback_reasons"] and "lacks bf16 GEMM shapes" in cm["fallback_reasons"]["gemm"]
    cm = model_of(cfg(cal_file, "model.weight_quant=fp8", "gpu=h200")).describe()
    assert "decode_attention" in cm["calibrated"]
    assert "lacks fp8 GEMM shapes" in cm["fallback_reasons"]["gemm"]
    cm = model_of(cfg(cal_file, "cache.kv_cache_dtype=fp8")).describe()
    assert "no attention_decode rows for fp8 KV" in cm["fallback_reasons"]["decode_attention"]


def test_file_without_operators_falls_back_whole(tmp_path):
    raw = json.loads((CALIBRATION_DIR / "h200.json").read_text())
    raw.pop("operators", None)
    p = tmp_path / "old.json"
    p.write_text(json.dumps(raw))
    m = model_of(cfg(p))
    assert m.describe()["calibrated"] == []
    assert "no operators section" in m.describe()["fallback_reasons"]["gemm"]
    op = build_cost_model(*(lambda c: (c.model, c.gpu, c.cache, c.cost))(
        compose_config(["cost=operator"])))
    new = np.array([300, 1, 1], dtype=np.int64)
    ctx = np.array([0, 500, 800], dtype=np.int64)
    assert m.step_time(new, ctx, 3) == op.step_time(new, ctx, 3)


def test_calibrated_run_writes_its_terms(cal_file, tmp_path):
    s = run_simulation(cfg(cal_file, "trace.max_requests=30"), tmp_path)
    assert set(s["cost_model"]["calibrated"]) >= {"gemm", "decode_attention"}
    assert s["requests_finished"] == 30
