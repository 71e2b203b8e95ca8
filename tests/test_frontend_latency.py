"""sim.run.delay_workload / cost.frontend_latency_s: the engine sees each request d seconds
after its client sent it; TTFT, E2E and queue time are the client's."""

import numpy as np
import pytest

from conftest import SINGLE_ENGINE, make_workload
from sim.errors import ConfigError
from sim.run import compose_config, delay_workload, run_simulation


def rows():
    return [dict(arrival_s=0.0, input_tokens=512, output_tokens=8),
            dict(arrival_s=5.0, input_tokens=256, output_tokens=4)]


def test_delay_workload_shifts_roots_and_children():
    from traces import generate_bench

    wl = generate_bench(num_prompts=6, input_len=64, output_len=8, max_concurrency=2, seed=1)
    d = delay_workload(wl, 0.25)
    roots = wl.parent_request_id < 0
    np.testing.assert_array_equal(d.arrival_s[roots], wl.arrival_s[roots] + 0.25)
    np.testing.assert_array_equal(d.think_s[~roots], wl.think_s[~roots] + 0.25)
    np.testing.assert_array_equal(d.think_s[roots], wl.think_s[roots])
    assert delay_workload(wl, 0.0) is wl
    assert wl.arrival_s[roots].max() == 0.0  # the original is untouched


def test_frontend_latency_adds_to_client_times_only(tmp_path):
    base = run_simulation(compose_config([*SINGLE_ENGINE,
                                          "sim.progress=false", "output.print_summary=false",
                                          "cost.frontend_latency_s=0"]),
                          tmp_path / "a", workload=make_workload(rows()))
    late = run_simulation(compose_config([*SINGLE_ENGINE,
                                          "sim.progress=false", "output.print_summary=false",
                                          "cost.frontend_latency_s=0.05"]),
                          tmp_path / "b", workload=make_workload(rows()))
    # two requests far apart: the engine does the same work, 50 ms later
    assert late["ttft_s"]["mean"] == pytest.approx(base["ttft_s"]["mean"] + 0.05, abs=1e-12)
    assert late["e2e_s"]["mean"] == pytest.approx(base["e2e_s"]["mean"] + 0.05, abs=1e-12)
    assert late["tpot_s"]["mean"] == pytest.approx(base["tpot_s"]["mean"], rel=1e-12)
    import pandas as pd

    a = pd.read_parquet(tmp_path / "a" / "requests.parquet")
    b = pd.read_parquet(tmp_path / "b" / "requests.parquet")
    np.testing.assert_allclose(b["arrival_s"], a["arrival_s"], atol=1e-12)  # the client's send
    np.testing.assert_allclose(b["first_token_s"], a["first_token_s"] + 0.05, atol=1e-12)


def test_frontend_latency_must_be_a_time():
    with pytest.raises(ConfigError, match=r"cost.frontend_latency_s=-0.1; expected a time >= 0"):
        run_simulation(compose_config(["sim.progress=false", "cost.frontend_latency_s=-0.1"]), None,
                       workload=make_workload(rows()))
