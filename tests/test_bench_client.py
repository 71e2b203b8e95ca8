"""The ``bench`` trace format (traces/formats/bench.py): a serving benchmark's client as a workload.
Hand-checked small cases, property tests of the invariants, the errors of bad input, and
simulated runs that check the closed loop keeps at most N requests in flight and releases each
prompt when its parent finishes."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from conftest import SINGLE_ENGINE
from sim.run import compose_config, run_simulation
from traces import TraceConfig, TraceError, generate_bench, load_workload
from traces.formats.bench import bench_params, chain_parents, length_bounds
from traces.config import coerce_config

REPO = Path(__file__).resolve().parents[1]


def _cl(**kw):
    """A closed-loop workload with the given arguments over small defaults."""
    args = dict(num_prompts=12, input_len=100, output_len=20, max_concurrency=3)
    args.update(kw)
    return generate_bench(**args)


# ---------------------------------------------------------------- length bounds
@pytest.mark.parametrize("length, r, rule, output, bounds", [
    (1024, 0.8, "symmetric", False, (204, 1844)),  # floor(204.8), ceil(1843.2)
    (1024, 0.0, "symmetric", False, (1024, 1024)),
    (100, 0.5, "symmetric", False, (50, 150)),
    (1, 0.5, "symmetric", True, (1, 2)),  # floor(0.5) = 0 raised to 1 (outputs), ceil(1.5)
    (3, 0.9, "symmetric", False, (0, 6)),  # floor(0.3), ceil(5.7)
    (1024, 0.8, "one_sided", False, (819, 1024)),  # int(819.2)
    (1024, 1.0, "one_sided", True, (1024, 1024)),
    (1000, 0.0, "one_sided", False, (0, 1000)),
])
def test_length_bounds(length, r, rule, output, bounds):
    assert length_bounds(length, r, rule, output=output) == bounds


def test_fixed_lengths_and_prefix_in_the_prompt():
    w = _cl(range_ratio=0.0, prefix_tokens=40)
    assert w.input_tokens.tolist() == [140] * 12 and w.output_tokens.tolist() == [20] * 12


def test_symmetric_draws_are_vllms():
    """The random parts, then the outputs, from numpy.random.default_rng(seed) (vLLM's
    RandomDataset.get_sampling_params), within [floor(L(1-r)), ceil(L(1+r))]."""
    w = generate_bench(num_prompts=50, input_len=1024, output_len=128, range_ratio=0.8,
                       max_concurrency=4, prefix_tokens=32, seed=7)
    g = np.random.default_rng(7)
    ins = g.integers(204, 1845, size=50)
    outs = g.integers(25, 232, size=50)  # [floor(25.6), ceil(230.4)] = [25, 231]
    assert w.input_tokens.tolist() == (32 + ins).tolist()
    assert w.output_tokens.tolist() == outs.tolist()


def test_one_sided_draws_are_inferencemaxs():
    w = generate_bench(num_prompts=30, input_len=1024, output_len=1024, range_ratio=0.8,
                       max_concurrency=4, range_rule="one_sided", seed=3)
    rs = np.random.RandomState(3)
    assert w.input_tokens.tolist() == rs.randint(819, 1025, size=30).tolist()
    assert w.output_tokens.tolist() == rs.randint(819, 1025, size=30).tolist()
    assert w.input_tokens.min() >= 819 and w.input_tokens.max() <= 1024


# ---------------------------------------------------------------- closed loop
def test_round_robin_chains():
    w = _cl(chain_assignment="round_robin")
    assert w.parent_request_id.tolist() == [-1, -1, -1] + list(range(9))
    assert w.session_id.tolist() == [i % 3 for i in range(12)]
    assert w.turn.tolist() == [i // 3 for i in range(12)]
    assert np.all(w.arrival_s == 0) and np.all(w.think_s == 0) and w.closed_loop


def test_earliest_free_is_round_robin_for_equal_lengths():
    a, b = _cl(), _cl(chain_assignment="round_robin")
    assert a.table.equals(b.table)


def test_chain_parents_by_hand():
    out = np.array([10, 1, 1, 1, 1], dtype=np.int64)
    # earliest_free: prompt 0 holds chain 0 for 10 tokens; prompts 2-4 follow on chain 1
    parent, chain, turn = chain_parents(out, 2, "earliest_free")
    assert parent.tolist() == [-1, -1, 1, 2, 3]
    assert chain.tolist() == [0, 1, 1, 1, 1] and turn.tolist() == [0, 0, 1, 2, 3]
    parent, chain, turn = chain_parents(out, 2, "round_robin")
    assert parent.tolist() == [-1, -1, 0, 1, 2] and chain.tolist() == [0, 1, 0, 1, 0]
    # ties go to the lower chain
    parent, chain, _ = chain_parents(np.array([5, 5, 5, 5, 3]), 2, "earliest_free")
    assert parent.tolist() == [-1, -1, 0, 1, 2] and chain.tolist() == [0, 1, 0, 1, 0]


def test_cap_above_the_prompts_and_unpaced_rate():
    w = _cl(num_prompts=5, max_concurrency=8)
    assert np.all(w.parent_request_id == -1) and np.all(w.arrival_s == 0)
    assert any("max_concurrency=8" in x for x in w.warnings)
    # vLLM's default --request-rate inf: every prompt at 0 s, and with a cap the closed loop
    u = generate_bench(num_prompts=5, input_len=100, output_len=20, request_rate=math.inf)
    assert np.all(u.parent_request_id == -1) and np.all(u.arrival_s == 0) and not u.warnings
    c = _cl(request_rate=math.inf)
    assert c.table.equals(_cl().table)


# ---------------------------------------------------------------- open loop
def test_fixed_rate_arrivals():
    w = generate_bench(num_prompts=5, input_len=10, output_len=5, request_rate=2.0,
                       burstiness=math.inf)
    assert w.arrival_s.tolist() == [0.5, 1.0, 1.5, 2.0, 2.5]
    assert np.all(w.parent_request_id == -1) and not w.closed_loop
    assert w.session_id.tolist() == list(range(5))


@pytest.mark.parametrize("burstiness, cv", [(1.0, 1.0), (0.25, 2.0), (4.0, 0.5)])
def test_gamma_arrival_statistics(burstiness, cv):
    """20,000 arrivals at 5/s: the last at exactly n / rate (vLLM's rescaling), the mean gap
    1/rate and the gaps' coefficient of variation 1/sqrt(burstiness) (Poisson: 1) within 4%
    (fixed seed)."""
    n, rate = 20000, 5.0
    w = generate_bench(num_prompts=n, input_len=10, output_len=5, request_rate=rate,
                       burstiness=burstiness, seed=11)
    a = w.arrival_s
    assert np.all(np.diff(a) >= 0) and a[0] > 0
    assert a[-1] == pytest.approx(n / rate, rel=1e-12)
    gaps = np.diff(np.r_[0.0, a])
    assert gaps.mean() == pytest.approx(1 / rate, rel=1e-9)  # (n gaps summing to n / rate)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.04)
    # Poisson: the counts per 10 s window have variance ~ mean (50)
    if burstiness == 1.0:
        counts = np.histogram(a, bins=np.arange(0, n / rate + 10, 10))[0][:-1]
        assert counts.mean() == pytest.approx(50, rel=0.02)
        assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.15)


# ---------------------------------------------------------------- prefixes
def test_prefix_groups_and_identity():
    w = _cl(prefix_tokens=40, num_prefix_groups=2, block_tokens=16)
    assert w.prefix_block_tokens == 16
    ids = [w.prefix_ids_of(i).tolist() for i in range(len(w))]
    assert ids == [[0, 1] if i % 2 == 0 else [2, 3] for i in range(12)]  # floor(40/16) = 2
    none = _cl()
    assert none.prefix_block_tokens == 0 and len(none.prefix_values()) == 0
    short = _cl(prefix_tokens=10)
    assert len(short.prefix_values()) == 0 and any("prefix_tokens=10" in x for x in short.warnings)


# ---------------------------------------------------------------- determinism, config, presets
def test_deterministic_and_seeded():
    kw = dict(num_prompts=200, input_len=500, output_len=300, range_ratio=0.5, request_rate=3.0,
              prefix_tokens=64, num_prefix_groups=3)
    a, b = generate_bench(seed=5, **kw), generate_bench(seed=5, **kw)
    assert a.table.equals(b.table)
    assert not generate_bench(seed=6, **kw).table.equals(a.table)


def test_config_path_equals_generate_bench():
    c = TraceConfig(name="x", format="bench", num_requests=40, input_len=300, output_len=50,
                    range_ratio=0.3, max_concurrency=5, prefix_tokens=20)
    w = load_workload(c, seed=9)
    g = generate_bench(num_prompts=40, input_len=300, output_len=50, range_ratio=0.3,
                       max_concurrency=5, prefix_tokens=20, seed=9)
    assert w.table.equals(g.table) and w.source == g.source == "synthetic:bench"
    assert w.notes["client"] == "closed_loop" and w.notes["requests_in_flight"] == 5


def test_presets():
    from omegaconf import OmegaConf

    schema = OmegaConf.structured(TraceConfig)
    conf = REPO / "experiments" / "conf" / "trace"
    w = load_workload(OmegaConf.merge(schema, OmegaConf.load(conf / "bench_concurrency.yaml")), 0)
    assert len(w) == 160 and int((w.parent_request_id < 0).sum()) == 16
    assert w.input_tokens.min() >= 819 and w.input_tokens.max() <= 1024
    assert w.output_tokens.min() >= 819 and w.output_tokens.max() <= 1024
    p = load_workload(OmegaConf.merge(schema, OmegaConf.load(conf / "bench_poisson.yaml")), 0)
    assert len(p) == 1000 and not p.closed_loop and p.arrival_s[-1] == pytest.approx(250.0)
    assert set(p.input_tokens.tolist()) == {1024} and set(p.output_tokens.tolist()) == {128}


def test_hydra_takes_inf():
    cfg = compose_config(["trace=bench_poisson", "trace.burstiness=inf", "trace.num_requests=4"])
    w = load_workload(cfg.trace, seed=0)
    assert w.arrival_s.tolist() == [0.25, 0.5, 0.75, 1.0]
    cfg = compose_config(["trace=bench_poisson", "trace.request_rate=inf", "trace.num_requests=4"])
    assert np.all(load_workload(cfg.trace, seed=0).arrival_s == 0)


# ---------------------------------------------------------------- properties
_LENGTHS = st.integers(1, 5000)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 150), conc=st.integers(1, 40), L=_LENGTHS, O=_LENGTHS,
       r=st.floats(0.0, 1.0), rule=st.sampled_from(["symmetric", "one_sided"]),
       assign=st.sampled_from(["earliest_free", "round_robin"]), prefix=st.integers(0, 200),
       seed=st.integers(0, 2 ** 32 - 1))
def test_closed_loop_invariants(n, conc, L, O, r, rule, assign, prefix, seed):
    assume(not (rule == "symmetric" and r >= 1.0))
    try:
        w = generate_bench(num_prompts=n, input_len=L, output_len=O, range_ratio=r,
                           max_concurrency=conc, range_rule=rule, chain_assignment=assign,
                           prefix_tokens=prefix, seed=seed)
    except TraceError as e:  # only a range that allows a 0-token prompt or output
        assert e.field == "range_ratio"
        ilo, _ = length_bounds(L, r, rule, output=False)
        olo, _ = length_bounds(O, r, rule, output=True)
        assert prefix + ilo < 1 or olo < 1
        return
    ilo, ihi = length_bounds(L, r, rule, output=False)
    olo, ohi = length_bounds(O, r, rule, output=True)
    inp, out = w.input_tokens - prefix, w.output_tokens
    assert len(w) == n
    assert inp.min() >= ilo and inp.max() <= ihi and out.min() >= max(olo, 1) and out.max() <= ohi
    par, sess, turn = w.parent_request_id, w.session_id, w.turn
    chains = min(conc, n)
    assert int((par < 0).sum()) == chains and np.all(par[:chains] == -1)
    assert np.all(w.arrival_s == 0) and np.all(w.think_s == 0)
    kids = np.flatnonzero(par >= 0)
    assert np.all(par[kids] < kids) and np.all(sess[par[kids]] == sess[kids])
    assert np.all(turn[kids] == turn[par[kids]] + 1)
    # every prompt on one chain, each chain a path through its prompts in prompt order
    for c in range(chains):
        rows = np.flatnonzero(sess == c)
        assert rows[0] < chains and par[rows[0]] == -1
        assert np.all(par[rows[1:]] == rows[:-1])
    assert sorted(np.unique(sess).tolist()) == list(range(chains))
    if assign == "earliest_free":  # each prompt joined a chain with the fewest output tokens
        load = np.zeros(chains, dtype=np.int64)
        for i in range(n):
            assert load[sess[i]] == load.min()
            load[sess[i]] += out[i]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), rate=st.floats(0.01, 1000.0),
       b=st.one_of(st.floats(0.05, 20.0), st.just(math.inf)), seed=st.integers(0, 10 ** 6))
def test_open_loop_invariants(n, rate, b, seed):
    w = generate_bench(num_prompts=n, input_len=50, output_len=10, request_rate=rate,
                       burstiness=b, seed=seed)
    a = w.arrival_s
    assert len(w) == n and np.all(w.parent_request_id == -1) and np.all(a >= 0)
    assert np.all(np.diff(a) >= 0)
    assert a[-1] == pytest.approx(n / rate, rel=1e-9)


# ---------------------------------------------------------------- bad input
_OK = dict(num_prompts=10, input_len=100, output_len=20, max_concurrency=2)


@pytest.mark.parametrize("change, field", [
    (dict(max_concurrency=0), "max_concurrency"),
    (dict(max_concurrency=-3), "max_concurrency"),
    (dict(max_concurrency=2.5), "max_concurrency"),
    (dict(max_concurrency=True), "max_concurrency"),
    (dict(max_concurrency=None, request_rate=-1.0), "request_rate"),
    (dict(max_concurrency=None, request_rate=0.0), "request_rate"),
    (dict(max_concurrency=None, request_rate=float("nan")), "request_rate"),
    (dict(request_rate=4.0), "request_rate"),  # both: a finite rate with a cap
    (dict(max_concurrency=None), "max_concurrency"),  # neither
    (dict(range_ratio=1.0), "range_ratio"),
    (dict(range_ratio=-0.1), "range_ratio"),
    (dict(range_ratio=1.5, range_rule="one_sided"), "range_ratio"),
    (dict(output_len=2, range_ratio=0.4, range_rule="one_sided"), "range_ratio"),  # int(0.8)=0
    (dict(input_len=3, range_ratio=0.9), "range_ratio"),  # floor(0.3) = 0 and no prefix
    (dict(input_len=0), "input_len"),
    (dict(input_len=1.5), "input_len"),
    (dict(output_len=0), "output_len"),
    (dict(input_len=2 ** 27, prefix_tokens=1), "input_len"),  # the prompt: 2**27 + 1 tokens
    (dict(num_prompts=0), "num_prompts"),
    (dict(prefix_tokens=-1), "prefix_tokens"),
    (dict(num_prefix_groups=0), "num_prefix_groups"),
    (dict(num_prefix_groups=2), "num_prefix_groups"),  # several prefixes, none shared
    (dict(block_tokens=0), "block_tokens"),
    (dict(max_concurrency=None, request_rate=1.0, burstiness=0.0), "burstiness"),
    (dict(max_concurrency=None, request_rate=1.0, burstiness=-math.inf), "burstiness"),
    (dict(burstiness=2.0), "burstiness"),  # a closed loop has no inter-arrival times
    (dict(range_rule="uniform"), "range_rule"),
    (dict(chain_assignment="random"), "chain_assignment"),
    (dict(max_concurrency=None, request_rate=1e-30), "request_rate"),  # last arrival past 2**32 s
    (dict(num_prompts=3000, prefix_tokens=2 ** 20, block_tokens=1), "prefix_tokens"),  # 2**31+ ids
    (dict(seed=-1), "seed"),
    (dict(seed=2 ** 32, range_rule="one_sided", range_ratio=0.5), "seed"),
])
def test_bad_arguments_name_the_field(change, field):
    args = dict(_OK)
    args.update(change)
    with pytest.raises(TraceError) as e:
        generate_bench(**args)
    assert e.value.field == field
    assert "expected" in str(e.value)


@pytest.mark.parametrize("change, field", [
    (dict(num_requests=0), "num_requests"),
    (dict(max_concurrency=0), "max_concurrency"),
    (dict(request_rate=3.0), "request_rate"),
    (dict(range_ratio=1.0), "range_ratio"),
    (dict(input_len=0), "input_len"),
    (dict(shared_prefix_tokens=100), "shared_prefix_tokens"),  # the synthetic field's name
    (dict(arrival_rate_per_s=2.0), "arrival_rate_per_s"),
    (dict(burstiness=math.nan), "burstiness"),
])
def test_config_errors_name_the_trace_field(change, field):
    """The trace config is checked when it is read (before a run touches its folder); errors
    name the config's field (num_requests, not num_prompts)."""
    c = dict(name="b", format="bench", num_requests=10, max_concurrency=2)
    c.update(change)
    with pytest.raises(TraceError) as e:
        coerce_config(c)
    assert e.value.field == field


def test_params_report_bounds():
    d = bench_params(dict(num_prompts=3, input_len=1024, output_len=1024, range_ratio=0.8,
                          range_rule="one_sided", max_concurrency=2))
    assert d["input_bounds"] == (819, 1024) and d["chains"] == 2 and not d["paced"]


# ---------------------------------------------------------------- simulated closed loop
def _in_flight_peak(r: pd.DataFrame) -> int:
    """Most requests between arrival and finish at once (a finish at t before an arrival at
    t: a released prompt takes the slot its parent leaves)."""
    ev = sorted([(a, 1) for a in r.arrival_s] + [(f, -1) for f in r.finish_s])
    cur = peak = 0
    for _, d in ev:
        cur += d
        peak = max(peak, cur)
    return peak


@pytest.mark.parametrize("assign", ["earliest_free", "round_robin"])
def test_simulated_closed_loop_keeps_n_in_flight(tmp_path, assign):
    """Qwen3-8B on an H200: at most N requests in flight, each later prompt arriving the moment
    its parent finished, the first N at 0 s."""
    N = 4
    cfg = compose_config([*SINGLE_ENGINE, "trace=bench_concurrency", f"trace.max_concurrency={N}",
                          "trace.num_requests=30", "trace.input_len=300",
                          "trace.output_len=200", "trace.range_rule=symmetric",
                          f"trace.chain_assignment={assign}", "output.print_summary=false"])
    run_simulation(cfg, tmp_path / "r")
    r = pd.read_parquet(tmp_path / "r" / "requests.parquet").sort_values("request_id")
    w = load_workload(cfg.trace, seed=0)
    assert (r.status == "finished").all() and len(r) == 30
    assert _in_flight_peak(r) == N
    par = w.parent_request_id
    fin = r.finish_s.to_numpy()
    arr = r.arrival_s.to_numpy()
    kids = np.flatnonzero(par >= 0)
    assert np.array_equal(arr[kids], fin[par[kids]])
    assert np.all(arr[par < 0] == 0)


def test_simulated_shared_prefix_hits_only_the_prefix(tmp_path):
    """A 64-token shared prefix (4 blocks of 16): later prompts hit at most those 64 tokens,
    and some do; the random parts never hit."""
    cfg = compose_config([*SINGLE_ENGINE, "trace=bench_concurrency", "trace.max_concurrency=2",
                          "trace.num_requests=10", "trace.input_len=200", "trace.output_len=30",
                          "trace.range_ratio=0.5", "trace.prefix_tokens=70",
                          "output.print_summary=false"])
    run_simulation(cfg, tmp_path / "r")
    r = pd.read_parquet(tmp_path / "r" / "requests.parquet")
    assert r.prefix_hit_tokens.max() == 64 and r.prefix_hit_tokens.min() >= 0
    assert (r.prefix_hit_tokens == 64).sum() >= 8
