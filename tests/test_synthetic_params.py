"""Synthetic traces' parameters (traces.formats.synthetic): a bad parameter is a TraceError
named by its config key (``trace.num_sessions``), lengths stay within their bounds, and every
prompt, the first included, stays within ``max_context_tokens``."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from conftest import quiet_config
from traces import TraceConfig, TraceError, load_workload


def test_synthetic_cap_below_the_shared_prefix_is_an_error():
    """A max_context_tokens at or below the shared prefix (12,000 tokens for synthetic_agentic)
    leaves no room for a first prompt: an error naming the key and the prefix."""
    with pytest.raises(TraceError, match=r"field 'trace.max_context_tokens': found 1000, expected > "
                                         r"shared_prefix_tokens=12000"):
        load_workload(TraceConfig(name="synthetic_agentic", format="synthetic_agentic",
                                  num_sessions=3, max_context_tokens=1000), 0)


def test_synthetic_first_prompt_obeys_max_context_tokens():
    """No prompt, the first included, exceeds max_context_tokens."""
    cap = 12_600  # 600 tokens for a first input of mean 2,000
    w = load_workload(TraceConfig(name="synthetic_agentic", format="synthetic_agentic",
                                  num_sessions=40, max_context_tokens=cap), 0)
    first = w.input_tokens[w.table.column("turn").to_numpy() == 0]
    assert first.size == 40 and first.max() <= cap and first.min() > 12_000
    assert w.input_tokens.max() <= cap


def test_synthetic_first_input_is_the_truncated_lognormal():
    """A draw within the cap is the plain lognormal draw (workloads that never reach the cap are
    unchanged); above it, a draw from the lognormal truncated at the cap."""
    from traces.formats.synthetic import _first_input, _lognormal

    a, b = np.random.default_rng(3), np.random.default_rng(3)
    assert [_first_input(a, 2000.0, 0.8, 10**9) for _ in range(200)] == \
        [int(_lognormal(b, 2000.0, 0.8, 1)[0]) for _ in range(200)]
    rng = np.random.default_rng(5)
    x = np.array([_first_input(rng, 2000.0, 0.8, 1000) for _ in range(20_000)])
    assert x.max() <= 1000 and x.min() >= 1
    mu, s = math.log(2000.0) - 0.32, 0.8
    cdf = lambda v: 0.5 * math.erfc(-(math.log(v) - mu) / (s * math.sqrt(2)))  # noqa: E731
    for v in (200, 500, 800):  # P(x <= v | x <= 1000) of the rounded lognormal
        assert abs((x <= v).mean() - cdf(v + 0.5) / cdf(1000.5)) < 0.015


def test_synthetic_defaults_never_reach_the_first_turn_cap():
    """The default configs' prompts stay within max_context_tokens, so the cap never changes
    their workloads."""
    for fmt in ("synthetic_agentic", "synthetic_reasoning", "synthetic_multiturn"):
        w = load_workload(TraceConfig(name=fmt, format=fmt), 0)
        cap = w.notes["params"]["max_context_tokens"]
        assert w.input_tokens.max() <= cap


@pytest.mark.parametrize("over", ["output_mean=1e25", "max_context_tokens=134217729"])
def test_synthetic_lengths_beyond_int_range_are_an_error(over):
    """An output mean whose draws pass 2**27 tokens, or a larger max_context_tokens, is a
    TraceError naming the field (lengths stay far inside int64, and the block ids of a shared
    prefix stay listable). Input draws are bounded by max_context_tokens instead: a first input
    above it is redrawn below it, a turn input above it ends the session."""
    fmt = "synthetic_reasoning"
    cfg = quiet_config(f"trace={fmt}", "trace.num_sessions=5", f"trace.{over}")
    with pytest.raises(TraceError, match=re.escape(f"trace.{over.split('=')[0]}")):
        load_workload(cfg.trace, seed=0)
    cfg = quiet_config(f"trace={fmt}", "trace.num_sessions=5", "trace.max_context_tokens=134217728")
    assert len(load_workload(cfg.trace, seed=0)) >= 5  # (the bound itself is allowed)
    # heavy-tailed inputs: draws of ~1e9 tokens are redrawn or end their sessions
    cfg = quiet_config("trace=synthetic_agentic", "trace.num_sessions=300", "trace.input_mean=5e5",
               "trace.input_sigma=3.5", "trace.turn_input_mean=1e5", "trace.turn_input_sigma=3.5")
    wl = load_workload(cfg.trace, seed=0)
    assert int(wl.input_tokens.max()) <= 131072 and any("ended early" in w for w in wl.warnings)
    cfg = quiet_config("trace=synthetic_multiturn", "trace.num_sessions=5", "trace.turn_input_mean=1e25")
    assert all(load_workload(cfg.trace, seed=0).turn == 0)  # (every second turn overflows)


@pytest.mark.parametrize("field,value,expected", [
    ("num_sessions", 0, "found 0, expected >= 1"),
    ("turns_min", 0, "found 0, expected 1 <= turns_min <= turns_max"),
    ("arrival_rate_per_s", 0.0, "found 0.0, expected > 0"),
])
def test_synthetic_parameter_error_names_the_config_key(field, value, expected):
    """A synthetic trace's bad parameter is named by the key the user typed
    (``trace.num_sessions``), as the other config errors are."""
    from traces.formats.synthetic import synthetic_params
    cfg = TraceConfig(format="synthetic_agentic", **{field: value})
    with pytest.raises(TraceError, match=re.escape(f"field 'trace.{field}': {expected}")):
        synthetic_params(cfg)
