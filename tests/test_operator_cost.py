"""sim.operator_cost: the per-operator step-time model's physical pieces, with hand-worked values."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import SINGLE_ENGINE
from sim.cost import StretchShape
from sim.cost_models import build_cost_model
from sim.errors import ConfigError
from sim.hardware import linear_param_counts, weight_quant_bytes
from sim.operator_cost import OperatorCostModel, expected_experts, ring_allreduce_time
from sim.run import compose_config, run_simulation


def cfg(*o):
    return compose_config([*SINGLE_ENGINE, "sim.progress=false", "cost=operator", *o])


def model_of(c):
    return build_cost_model(c.model, c.gpu, c.cache, c.cost)


def test_expected_experts_hand_values():
    # one token touches exactly k experts; k/E = 1/2 and two tokens: 4 x (1 - 1/4) = 3
    assert expected_experts(128, 4, 1) == pytest.approx(4.0)
    assert expected_experts(4, 2, 2) == pytest.approx(3.0)
    # many tokens touch every expert; zero tokens none
    assert expected_experts(128, 4, 10_000) == pytest.approx(128.0)
    assert expected_experts(128, 4, 0) == 0.0
    # monotone in the batch
    e = expected_experts(256, 8, np.arange(1, 200))
    assert np.all(np.diff(e) > 0) and e[-1] < 256


def test_ring_allreduce_bytes_and_latency():
    # 8 ranks send 2 x 7/8 of the message: 1 MB at 100 GB/s = 17.5 us + 5 us latency
    assert ring_allreduce_time(1e6, 8, 100e9, 5e-6) == pytest.approx(5e-6 + 1.75e-5)
    assert ring_allreduce_time(1e6, 2, 100e9, 0.0) == pytest.approx(1e-5)
    assert ring_allreduce_time(1e6, 1, 100e9, 5e-6) == 0.0


def test_gemm_precision_follows_weights_and_card():
    # FP8 weights on an H100 run on the FP8 peak; MXFP4 weights (no FP4 tensor cores) on BF16
    m = model_of(cfg("model=llama3_1_70b", "gpu=h100", "model.weight_quant=fp8"))
    assert m.gemm_precision == "fp8"
    m = model_of(cfg("model=llama3_1_70b", "gpu=h100", "model.weight_quant=mxfp4"))
    assert m.gemm_precision == "bf16"
    m = model_of(cfg("model=llama3_1_70b", "gpu=b200", "model.weight_quant=nvfp4"))
    assert m.gemm_precision == "fp4"
    with pytest.raises(ConfigError, match=r"cost.gemm_precision=fp4: gpu H100-SXM lists no fp4"):
        model_of(cfg("model=llama3_1_70b", "gpu=h100", "model.weight_quant=nvfp4",
                     "cost.gemm_precision=fp4"))
    with pytest.raises(ConfigError, match=r"cost.gemm_precision='int3'"):
        model_of(cfg("cost.gemm_precision=int3"))


def test_decode_weight_traffic_hand_value():
    # Llama-3.1-70B BF16 on one H200, one decode token: every linear weight read once
    c = cfg("model=llama3_1_70b", "cost.layer_overhead_s=0", "cost.step_overhead_s=0",
            "cost.seq_overhead_s=0")
    m = model_of(c)
    p = linear_param_counts(c.model)
    body = (p.attention + p.dense_mlp) * 80 * 2
    head = p.lm_head * 2
    bw = 4800e9 * float(c.cost.mbu)
    parts = m.breakdown(np.array([1]), np.array([0]), 1)
    assert parts["gemm"] == pytest.approx(body / bw + head / bw, rel=1e-12)
    assert parts["collectives"] == 0.0


def test_moe_weight_traffic_grows_with_batch_until_all_experts_hot():
    c = cfg("model=gpt_oss_120b", "gpu=h200")
    m = model_of(c)
    if m.E == 0:
        pytest.skip("the gpt-oss card has no MoE fields yet")
    g = [m.gemm_time(b, b) for b in (1, 4, 16, 64, 256, 1024)]
    assert all(b > a for a, b in zip(g, g[1:]))
    # at 1 token 4 of 128 experts are read: far less than the whole expert weights
    full = (linear_param_counts(c.model).routed_experts * weight_quant_bytes(c.model)
            / (c.gpu.hbm_bandwidth_gbps * 1e9 * c.cost.mbu))
    assert g[0] < 0.2 * full


def test_tensor_parallel_adds_allreduce_per_layer():
    one = model_of(cfg("model=llama3_1_70b", "gpu=h100", "model.weight_quant=fp8"))
    c8 = cfg("model=llama3_1_70b", "gpu=h100", "model.weight_quant=fp8", "cost.tensor_parallel_size=8")
    eight = model_of(c8)
    g = c8.gpu
    msg = 64 * 8192 * 2  # 64 tokens x hidden x BF16
    per = g.nvlink_latency_s + 2 * 7 / 8 * msg / (g.nvlink_bandwidth_gbps * 1e9 * c8.cost.comm_efficiency)
    assert eight.comm_time(64) == pytest.approx(2 * 80 * per, rel=1e-12)
    assert one.comm_time(64) == 0.0
    # the GEMMs split 8 ways
    assert eight.gemm_time(64, 0) == pytest.approx(one.gemm_time(64, 0) / 8, rel=1e-9)


def test_step_time_equals_decode_stretches_bit_for_bit():
    m = model_of(cfg("model=llama3_1_70b", "gpu=h100", "model.weight_quant=fp8",
                     "cost.tensor_parallel_size=4", "cost.seq_overhead_s=2e-5",
                     "cost.layer_overhead_s=1e-5"))
    ctx0 = np.array([100, 2000, 4097, 33], dtype=np.int64)
    durs, _ = m.stretch_times(StretchShape(ctx0, 40, first=0, shift=0))
    per = [m.step_time(np.ones(4, dtype=np.int64), ctx0 + s, 4) for s in range(40)]
    assert list(durs) == per
    d2, ends = m.stretch_times(StretchShape(ctx0, 40), 1.0, math.inf)
    assert list(d2) == per


# dense single-GPU models (the scalar path of step_time) and models that keep the array
# formulas (tensor parallel, routed experts); composed once
_STEP_MODELS = {}


def _step_model(name):
    if name not in _STEP_MODELS:
        o = {"qwen3_8b": (), "llama3_1_70b_fp8": ("model=llama3_1_70b", "gpu=h100",
                                                  "model.weight_quant=fp8",
                                                  "cost.prefill_overhead_s=0.002",
                                                  "cost.seq_overhead_s=2e-5"),
             "llama3_1_70b_tp4": ("model=llama3_1_70b", "cost.tensor_parallel_size=4"),
             "qwen3_235b": ("model=qwen3_235b_a22b", "cost.tensor_parallel_size=8")}[name]
        _STEP_MODELS[name] = model_of(cfg(*o))
    return _STEP_MODELS[name]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["qwen3_8b", "llama3_1_70b_fp8", "llama3_1_70b_tp4", "qwen3_235b"]),
       chunks=st.lists(st.tuples(st.one_of(st.just(1), st.integers(1, 70_000)),
                                 st.integers(0, 300_000)), min_size=1, max_size=40),
       extra=st.integers(0, 3))
def test_step_time_int64_equals_array_formulas_bit_for_bit(name, chunks, extra):
    # int64 arrays may take the compiled integer sums; int32 arrays always take the float64
    # array formulas: the same bits, decode-only, prefill-only and mixed steps alike
    m = _step_model(name)
    new = np.array([n for n, _ in chunks], dtype=np.int64)
    ctx = np.array([c for _, c in chunks], dtype=np.int64)
    samples = max(0, int(np.count_nonzero(new == 1)) - extra)
    t64 = m.step_time(new, ctx, samples)
    t32 = m.step_time(new.astype(np.int32), ctx.astype(np.int32), samples)
    assert t64 == t32 and type(t64) is float


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["qwen3_8b", "llama3_1_70b_fp8", "llama3_1_70b_tp4"]),
       decodes=st.lists(st.integers(0, 200_000), max_size=30),
       chunk=st.integers(2, 8192), cached=st.integers(0, 100_000), k=st.integers(2, 60))
def test_chunked_stretch_times_equal_step_time_bit_for_bit(name, decodes, chunk, cached, k):
    # a chunked prefill beside decodes: the stretch's durations are step_time's of each step's
    # arrays (int32: the array formulas), ends summed left to right
    m = _step_model(name)
    new = np.array([1] * len(decodes) + [chunk], dtype=np.int64)
    ctx0 = np.array([*decodes, cached], dtype=np.int64)
    first = m.step_time(new, ctx0, len(decodes))
    durs, ends = m.stretch_times(StretchShape(ctx0, k, new_tokens=new, samples=len(decodes),
                                              first_s=first), 10.0)
    per = [m.step_time(new.astype(np.int32), (ctx0 + s * new).astype(np.int32), len(decodes))
           for s in range(k)]
    assert list(durs) == per
    t = 10.0
    for i, d in enumerate(per):
        t = t + d
        assert ends[i] == t


def test_step_time_past_exact_sums_takes_the_array_formulas():
    # chunks whose query-key pairs pass 2**53, where float64 products and sums round: int64
    # arrays get the array formulas' bits (uint64 arrays always take those formulas)
    m = _step_model("qwen3_8b")
    new = np.array([4097, 1, 3], dtype=np.int64)
    ctx = np.array([(1 << 42) + 1, (1 << 26) + 3, 5], dtype=np.int64)
    t = m.step_time(new, ctx, 1)
    assert t == m.step_time(new.astype(np.uint64), ctx.astype(np.uint64), 1)
    assert t > m.step_time(new, np.array([0, 0, 0], dtype=np.int64), 1)


def test_sliding_window_model_decode_times_match_step_time():
    m = model_of(cfg("model=gpt_oss_120b", "gpu=h200"))
    ctx0 = np.array([10, 500, 3000], dtype=np.int64)
    durs, _ = m.stretch_times(StretchShape(ctx0, 20))
    per = [m.step_time(np.ones(3, dtype=np.int64), ctx0 + s, 3) for s in range(20)]
    np.testing.assert_allclose(durs, per, rtol=1e-12)


def test_breakdown_sums_to_step_time_and_prefill_pays_host_extra():
    m = model_of(cfg("cost.prefill_overhead_s=0.002"))
    new = np.array([512, 1, 1], dtype=np.int64)
    ctx = np.array([0, 800, 900], dtype=np.int64)
    b = m.breakdown(new, ctx, 3)
    assert b["total"] == pytest.approx(m.step_time(new, ctx, 3), rel=1e-12)
    assert b["host"] == pytest.approx(m.overhead + 3 * m.seq_overhead + 0.002)
    assert b["attention_prefill"] > 0 and b["attention_decode"] > 0


def test_operator_run_reports_its_model(tmp_path):
    s = run_simulation(cfg("trace.max_requests=30"), tmp_path)
    assert s["cost_model"]["kind"] == "operator"
    assert s["cost_model"]["gemm_precision"] == "bf16"
    assert s["requests_finished"] == 30
    b = s["cost_model"]["step_time_s"]
    assert b["total"] == pytest.approx(b["host"] + b["gemm"] + b["attention"] + b["collectives"]
                                       + b["layer_overhead"], rel=1e-9)
    assert b["attention"] > 0 and b["gemm"] > 0 and b["collectives"] == 0.0
    assert sum(b["share"].values()) == pytest.approx(1.0)


@pytest.mark.parametrize("field,value,msg", [
    ("attention_mbu", 0, r"cost.attention_mbu=0.0; expected 0 < value <= 1"),
    ("comm_efficiency", 1.5, r"cost.comm_efficiency=1.5"),
    ("layer_overhead_s", -1e-6, r"cost.layer_overhead_s=-1e-06; expected >= 0"),
])
def test_operator_settings_are_checked(field, value, msg):
    with pytest.raises(ConfigError, match=msg):
        model_of(cfg(f"cost.{field}={value}"))


def test_operator_is_an_operator_cost_model():
    assert isinstance(model_of(cfg()), OperatorCostModel)


def test_gemm_precision_fp8_needs_quantised_weights():
    with pytest.raises(ConfigError, match=r"cost.gemm_precision=fp8 with model.weight_quant=none"):
        model_of(cfg("cost.gemm_precision=fp8"))


def test_fp4_efficiency_falls_back_to_fp8_then_bf16():
    m = model_of(cfg("gpu=b200", "model.weight_quant=nvfp4", "cost.mfu=0.7", "cost.fp8_mfu=0.5",
                     "cost.fp4_mfu=null"))
    assert m.gemm_efficiency == {"bf16": 0.7, "fp8": 0.5, "fp4": 0.5}
    m = model_of(cfg("cost.mfu=0.6", "cost.fp8_mfu=null", "cost.fp4_mfu=null"))
    assert m.gemm_efficiency == {"bf16": 0.6, "fp8": 0.6, "fp4": 0.6}
    assert model_of(cfg()).describe()["settings"]["frontend_latency_s"] > 0


def test_cost_overrides_that_change_nothing_get_notes():
    from sim.cli.report import inert_override_notes

    notes = inert_override_notes(["cost.fp8_mfu=0.4", "cost.mbu=0.5"], "mooncake", "gpu_only",
                                 "analytic")
    assert notes == ["cost.fp8_mfu is read by cost.kind=operator and calibrated; this run's "
                     "cost.kind is analytic: it changes nothing"]
    notes = inert_override_notes(["cost.kind=operator"], "mooncake", "gpu_only", "operator")
    assert notes and "cost=operator selects that model with its own (fitted) settings" in notes[0]


def test_tensor_parallel_beyond_one_node_is_noted():
    assert model_of(cfg("model=llama3_1_70b", "cost.tensor_parallel_size=8")).describe()["notes"] == []
    notes = model_of(cfg("model=llama3_1_70b", "cost.tensor_parallel_size=16")).describe()["notes"]
    assert notes and "spans more than one 8-GPU node" in notes[0]
