"""Config validation: an impossible config, or a workload the config cannot serve, fails before
anything is simulated with a ConfigError (or TraceError) naming the field, the value found and
what was expected; the results folder is not created (or holds only the INCOMPLETE marker when
the engine finds the problem at a request's admission). Every shipped preset passes."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from conftest import REPO, make_workload, quiet_config, run_kvsim
from sim.errors import ConfigError
from sim.run import MARKER, compose_config, run_simulation
from sim.validation import validate_config, validate_workload
from traces import TraceError, load_workload


# (overrides, regex the message must match): every message names the config field
CONFIG_CASES = [
    (["policy=snapkv", "policy.pooling_kernel=4"], r"pooling_kernel must be an odd number >= 1"),
    (["policy=quest", "policy.dense_layers=100"], r"dense_layers=100 exceeds the model's 36 layers"),
    (["model=llama3_1_70b", "gpu=rtx4090"],
     r"model weights do not fit: Llama-3\.1-70B \(none\) needs 131\.5 GiB .* 1 x RTX-4090"),
    (["model=llama3_1_70b", "cache.num_gpu_blocks=1000"],
     r"model weights do not fit: Llama-3\.1-70B \(none\) needs 131\.5 GiB .* 1 x H200"),
    (["cache.activation_reserve_gib=120"], r"zero KV blocks left: budget 126\.36 GiB"),
    (["scheduler.max_num_batched_tokens=100000000"],
     r"zero KV blocks left: .*scheduler\.max_num_batched_tokens=100000000"),
    (["cache.num_gpu_blocks=0"], r"cache\.num_gpu_blocks=0; expected a positive number"),
    (["seed=-1"], r"seed=-1; expected an integer in \[0, 2\*\*32\)"),
    (["cache.block_size=24"], r"cache\.block_size=24; expected a power of two between 1 and "
                              r"cache\.max_block_size=256"),
    (["cache.block_size=512"], r"cache\.block_size=512; expected a power of two"),
    (["cache.block_size=0"], r"cache\.block_size=0; expected a power of two"),
    (["cache.gpu_memory_utilization=-0.5"], r"cache\.gpu_memory_utilization=-0\.5; expected 0 < u <= 1"),
    (["cache.gpu_memory_utilization=1.2"], r"cache\.gpu_memory_utilization=1\.2"),
    (["cache.activation_reserve_gib=-1"], r"cache\.activation_reserve_gib=-1\.0; expected a finite number >= 0"),
    (["cache.kv_cache_dtype=int3"], r"cache\.kv_cache_dtype='int3' is not a known KV cache dtype; expected auto or one of"),
    (["model.weight_quant=int2"], r"model\.weight_quant='int2'; expected one of \['none', 'fp8'"),
    (["policy=triattention", "policy.beta=0"],
     r"policy\.\*\): policy triattention: beta \(round period, tokens\) must be > 0, got 0"),
    (["policy=h2o", "policy.beta=-4"], r"policy h2o: beta .* must be > 0, got -4"),
    (["policy=snapkv", "policy.budget=0"], r"policy snapkv: budget must be >= 1 token, got 0"),
    (["policy.name=nope"], r"unknown policy 'nope'; valid: ada_kv, full, h2o, pyramidkv, quest, "
                           r"r_kv, random, snapkv, streaming_llm, tova, triattention"),
    (["compaction.name=defrag"], r"compaction\.\*\): unknown compaction 'defrag'; valid: none, "
                                 r"forward_pack, hole_fill"),
    (["tiers=gpu_host", "tiers.host_gib=-1"], r"tiers\.host_gib=-1\.0; expected a finite capacity >= 0 GiB"),
    (["tiers.disk_gib=-2"], r"tiers\.disk_gib=-2\.0; expected a finite capacity >= 0 GiB"),
    (["tiers=gpu_host", "tiers.host_gib=inf"], r"tiers\.host_gib=inf; expected a finite capacity >= 0 GiB"),
    (["sim.prefix_index=btree"], r"sim\.prefix_index='btree'; expected 'auto', 'dict' or 'table'"),
    (["tiers.write_policy=bogus"], r"tiers\.write_policy='bogus'; expected one of \['write_back'"),
    (["tiers=gpu_host", "tiers.replacement=mru"], r"tiers\.replacement='mru'; expected one of \['lru', 'arc'\]"),
    (["tiers.onboard=lazy"], r"tiers\.onboard='lazy'; expected one of \['blocking', 'layerwise'\]"),
    (["tiers=gpu_host", "tiers.pcie_gbps=0"], r"tiers\.pcie_gbps=0\.0; expected > 0"),
    (["tiers=gpu_host", "tiers.disk_read_gbps=0"], r"tiers\.disk_read_gbps=0\.0; expected > 0"),
    (["tiers=gpu_host", "cache.enable_prefix_caching=false"],
     r"tiers below the GPU need cache\.enable_prefix_caching=true"),
    (["codec=nvfp4", "model.head_dim=72", "model.rope_dim=72"],
     r"codec nvfp4 needs rows in multiples of 16 values .* model Qwen3-8B has model\.head_dim = 72"),
    (["codec=fp8", "cache.kv_cache_dtype=fp8"], r"codec fp8 encodes a 16-bit hot cache"),
    (["codec.name=zstd"], r"codec\.name='zstd'; expected one of \['identity', 'fp8', 'nvfp4'\]"),
    (["cost.mfu=1.5"], r"cost\.mfu=1\.5; expected 0 < value <= 1"),
    (["cost.mbu=0"], r"cost\.mbu=0\.0; expected 0 < value <= 1"),
    (["cost.attention_efficiency=-0.1"], r"cost\.attention_efficiency=-0\.1"),
    (["cost.step_overhead_s=-0.001"], r"cost\.step_overhead_s=-0\.001; expected >= 0"),
    (["cost.tensor_parallel_size=0"], r"cost\.tensor_parallel_size=0; expected >= 1"),
    (["model=llama3_1_70b", "cost.tensor_parallel_size=3"],
     r"cost\.tensor_parallel_size=3 does not divide model\.num_q_heads=64"),
    (["cost.kind=magic"], r"cost\.kind='magic'; expected one of"),
    (["scheduler.max_num_seqs=0"], r"scheduler\.max_num_seqs=0; expected >= 1"),
    (["scheduler.max_num_batched_tokens=0"], r"scheduler\.max_num_batched_tokens=0; expected >= 1"),
    (["scheduler.max_num_batched_tokens=64"],
     r"scheduler\.max_num_batched_tokens=64 < scheduler\.max_num_seqs=256"),
    (["scheduler.long_prefill_token_threshold=-1"], r"scheduler\.long_prefill_token_threshold=-1"),
    (["scheduler.preemption_mode=swap"], r"scheduler\.preemption_mode='swap'; expected 'recompute'"),
    (["scheduler.enable_chunked_prefill=false", "scheduler.max_num_batched_tokens=1024"],
     r"scheduler\.max_num_batched_tokens=1024 < model\.max_model_len=131072 with "
     r"scheduler\.enable_chunked_prefill=false"),
    (["model.max_model_len=0"], r"model\.max_model_len=0; expected > 0"),
    (["model.attention=linear"], r"model\.attention='linear'; expected 'gqa' or 'mla'"),
    (["model.num_kv_heads=0"], r"model\.num_kv_heads=0; expected >= 1"),
    (["model.num_layers=0"], r"model\.num_layers=0; expected >= 1"),
    (["model.head_dim=-8"], r"model\.head_dim=-8; expected >= 1"),
    (["model.vocab_size=0"], r"model\.vocab_size=0; expected >= 1"),
    (["model.num_kv_heads=5"], r"model\.num_q_heads=32 is not a multiple of model\.num_kv_heads=5"),
    (["model.num_sliding_window_layers=36"],
     r"model\.num_sliding_window_layers=36; expected 0 <= n < model\.num_layers=36"),
    (["model.num_sliding_window_layers=4"], r"model\.sliding_window=0 with model\.num_sliding_window_layers=4"),
    (["model.rope_dim=256"], r"model\.rope_dim=256; expected 0 <= rope_dim <= model\.head_dim=128"),
    (["model.active_params_b=100"], r"model\.active_params_b=100\.0; expected embedding_params_b"),
    (["model.attention=mla", "model.kv_lora_rank=0"], r"model\.kv_lora_rank=0; expected >= 1 with model\.attention=mla"),
    (["gpu.memory_gib=-5"], r"gpu\.memory_gib=-5\.0; expected > 0"),
    (["gpu.hbm_bandwidth_gbps=0"], r"gpu\.hbm_bandwidth_gbps=0\.0; expected > 0"),
    (["gpu.bf16_dense_tflops=0"], r"gpu\.bf16_dense_tflops=0\.0; expected > 0"),
    (["sim.max_sim_time_s=0"], r"sim\.max_sim_time_s=0\.0; expected > 0 s or null"),
    (["output.ops_limit=-1"], r"output\.ops_limit=-1; expected >= 0"),
    (["trace.time_scale=0"], r"trace\.time_scale=0\.0; expected > 0"),
    (["trace.time_scale=-1"], r"trace\.time_scale=-1\.0; expected > 0"),
    (["trace.on_error=ignore"], r"trace\.on_error='ignore'; expected one of \['fail', 'skip'\]"),
    (["trace.max_requests=0"], r"trace\.max_requests=0; expected >= 1 or null"),
    (["model.num_layers=???"], r"model\.num_layers=\?\?\?: the field has no value; expected a value"),
]


@pytest.mark.parametrize("overrides,pattern", CONFIG_CASES, ids=[" ".join(c[0]) for c in CONFIG_CASES])
def test_impossible_config_fails_before_simulation(tmp_path, overrides, pattern):
    """run_simulation raises ConfigError naming the field before it touches the results
    directory (nothing is created, so nothing can be mistaken for a finished run)."""
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=pattern):
        run_simulation(quiet_config(*overrides), out)
    assert not out.exists()


def test_validate_config_accepts_every_preset():
    """The checks do not reject a shipped preset (a model that needs several GPUs gets them)."""
    conf = REPO / "experiments" / "conf"
    for grp in ("trace", "policy", "compaction", "tiers", "codec", "cache", "gpu"):
        for f in sorted((conf / grp).glob("*.yaml")):
            # (a 24 GB card holds Qwen3-8B's weights and ~40K tokens of KV: vLLM refuses to
            # start at its 131,072-token context, as kvsim does)
            extra = ("model.max_model_len=32768",) if grp == "gpu" else ()
            validate_config(quiet_config(f"{grp}={f.stem}", *extra))
    for f in sorted((conf / "model").glob("*.yaml")):
        validate_config(quiet_config(f"model={f.stem}", "gpu=h200", "cost.tensor_parallel_size=8"))


def test_sim_validate_config_delegates():
    from sim import run as run_mod

    with pytest.raises(ConfigError, match=r"tiers\.write_policy='x'"):
        run_mod.validate_config(quiet_config("tiers.write_policy=x"))


def test_policy_budget_below_protected_prompt():
    """h2o/tova with a protected prompt keep ``budget`` tokens in total: a longer prompt is
    impossible. validate_workload names the request, its prompt and the field; requests rejected
    anyway for max_model_len do not count."""
    c = quiet_config("policy=h2o", "policy.protect_prompt=true", "policy.budget=100", "model.max_model_len=2000")
    wl = make_workload([dict(arrival_s=0.0, input_tokens=50, output_tokens=4),
                        dict(arrival_s=0.1, input_tokens=300, output_tokens=4),
                        dict(arrival_s=0.2, input_tokens=5000, output_tokens=4)])
    with pytest.raises(ConfigError, match=r"policy\.budget=100 cannot serve request 1 .*300 prompt "
                                          r"tokens.*below the protected prompt of 300 tokens"):
        validate_workload(c, wl)
    validate_workload(quiet_config("policy=h2o", "policy.protect_prompt=false", "policy.budget=100"), wl)
    ok = make_workload([dict(arrival_s=0.0, input_tokens=90, output_tokens=4)])
    validate_workload(c, ok)
    # with trace.path (the user's own file) the message names that file, not the trace preset
    own = quiet_config("policy=h2o", "policy.protect_prompt=true", "policy.budget=100",
                       "model.max_model_len=2000", "trace.path=/data/own.jsonl")
    with pytest.raises(ConfigError, match=r"cannot serve request 1 of the trace file "
                                          r"/data/own\.jsonl \(300 prompt tokens") as e:
        validate_workload(own, wl)
    assert own.trace.name not in str(e.value)


def test_budget_below_prompt_run_is_not_complete(tmp_path):
    """Through run_simulation the same config fails with ConfigError (from the workload checks,
    before the results directory is touched, or from the engine at the request's admission,
    which leaves the marker) and leaves no summary.json."""
    c = quiet_config("policy=h2o", "policy.protect_prompt=true", "policy.budget=100")
    wl = make_workload([dict(arrival_s=0.0, input_tokens=300, output_tokens=4)])
    with pytest.raises(ConfigError, match=r"budget 100 .* below the protected prompt of 300 tokens"):
        run_simulation(c, tmp_path / "r", workload=wl)
    assert not (tmp_path / "r" / "summary.json").exists()


def test_tier_smaller_than_one_page_is_an_error():
    from sim.errors import ConfigError
    from sim.run import compose_config, run_simulation

    cfg = compose_config(["tiers=gpu_host", "tiers.host_gib=0.001", "trace.max_requests=5",
                          "sim.progress=false"])
    with pytest.raises(ConfigError, match=r"tiers\.host_gib=0\.001 holds no page of 2359296 bytes"):
        run_simulation(cfg, None)


@pytest.mark.parametrize("col", ["input_tokens", "output_tokens"])
def test_workload_with_a_length_below_one_is_rejected(col):
    """validate_workload holds every loader to the workload schema's lengths (>= 1 prompt and
    output token), naming the request."""
    rows = [dict(input_tokens=10, output_tokens=5), dict(input_tokens=10, output_tokens=5)]
    rows[1][col] = -3
    with pytest.raises(TraceError, match=rf"request 1 .*{col}.*found -3, expected >= 1 tokens"):
        validate_workload(quiet_config(), make_workload(rows))


@pytest.mark.parametrize("bad", [8935703513288155120, 2 ** 63 - 1, (2 ** 63 - 1 - 512) // 513 + 1])
def test_prefix_id_too_large_for_exact_block_keys_is_rejected(tmp_path, bad):
    """A prefix id whose block key (id x (G + 1) + offset) would wrap int64 (and could become the
    empty-slot marker, a hit in an empty cache) is a TraceError naming the file, the request and
    the id. The largest allowed id passes."""
    p = tmp_path / "big.jsonl"
    rows = [dict(timestamp=0, input_length=600, output_length=20, hash_ids=[3, 4]),
            dict(timestamp=100, input_length=600, output_length=20, hash_ids=[bad, 7])]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = quiet_config("trace.format=mooncake", f"trace.path={p}")
    wl = load_workload(cfg.trace, seed=0)
    with pytest.raises(TraceError, match=rf"big.jsonl request 1 .*prefix id out of range, found id {bad}"):
        validate_workload(cfg, wl)
    rows[1]["hash_ids"][0] = (2 ** 63 - 1 - 512) // 513
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    validate_workload(cfg, load_workload(cfg.trace, seed=0))


@pytest.mark.parametrize("extra, msg", [
    (["trace.time_scale=inf"], "trace.time_scale=inf; expected a finite number"),
    (["trace.start_s=nan"], "trace.start_s=nan; expected a finite number"),
    (["trace.time_scale=1e300"], "field 'time_scale': arrival past the simulated clock's range"),
    (["cache.num_gpu_blocks=1000000000000"], "cache.num_gpu_blocks=1000000000000: the block pool's "
                                             "bookkeeping alone needs"),
    (["gpu.memory_gib=1e300"], "the budget overflows float64 bytes"),
    (["gpu.memory_gib=1e9"], "KV blocks of gpu.memory_gib=1000000000.0: the block pool's bookkeeping"),
    (["tiers=gpu_host", "tiers.host_gib=1e18"], "tiers.host_gib=1e+18: 4.55e+20 pages of"),
    # step times bounded as arrivals are
    (["cost.step_overhead_s=1e12"], "the simulated clock passed 2**32 s (~136 years) at t=1e+12 s"),
    # tier sizes that overflow float64 bytes, and a disk latency past the clock's range
    (["tiers=gpu_host", "tiers.host_gib=1e300"], "tiers.host_gib=1e+300: inf pages of"),
    (["tiers=gpu_host_disk", "tiers.disk_gib=1e300"], "tiers.disk_gib=1e+300: inf pages of"),
    (["tiers=gpu_host_disk", "tiers.host_gib=0.05", "tiers.write_policy=write_through",
      "tiers.disk_latency_s=1e300"],
     "the simulated clock passed 2**32 s (~136 years) at t="),
])
def test_values_too_large_for_the_machine_are_config_errors(tmp_path, extra, msg):
    """Values the machine cannot simulate (an infinite or huge time scale, a pool whose
    bookkeeping alone needs more memory than there is, GPU memory or tier sizes that overflow,
    step times or disk latencies that carry the clock past 2**32 s) are each exit 2 with one
    line naming the value, and no summary.json."""
    r = run_kvsim(tmp_path / "r", "trace.max_requests=20", *extra)
    assert r.returncode == 2, r.stderr[-1500:]
    assert msg in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert not (tmp_path / "r" / "summary.json").exists()


@pytest.mark.parametrize("overrides, msg", [
    (["policy=triattention", "policy.mode=per_head", "policy.importance.sigma=nan"],
     "importance.sigma must be a finite number, got nan"),
    (["policy=pyramidkv", "policy.layer_budget_ratio=nan"],
     "policy pyramidkv: layer_budget_ratio must be a finite number, got nan"),
    (["policy=triattention", "policy.importance.correlation_length=inf"],
     "importance.correlation_length must be a finite number, got inf"),
    (["policy=triattention", "policy.importance.recency_window=nan"],
     "importance.recency_window must be a finite number, got nan"),
    (["compaction=hole_fill", "policy=triattention",
      "compaction.position_index_bytes=4611686018427387904"],
     "compaction.position_index_bytes must be in [0, 1024]"),
])
def test_non_finite_policy_options_are_config_errors(overrides, msg):
    """NaN or infinite policy and importance options (a NaN passes every range comparison) and a
    position index too large for the delay arithmetic are config errors naming the option."""
    with pytest.raises(ConfigError, match=re.escape(msg)):
        validate_config(compose_config(["trace=synthetic_reasoning", *overrides]))


def test_recorded_importance_gaps_are_config_errors(tmp_path):
    """A recorded importance file with NaN scores is an error naming the row; requests longer than
    the budget missing from the file are an error before the run (nothing created); a round
    that needs a position the file lacks stops the run with a one-line ConfigError, leaving the
    INCOMPLETE marker and no summary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base = ["trace=synthetic_reasoning", "trace.num_sessions=3", "policy=snapkv", "policy.budget=256",
            "policy.observation_window=16", "policy.importance_source=recorded"]
    n = 40_000

    def write(name, rids, positions=n, nan=False):
        score = np.ones(len(rids) * positions, dtype=np.float32)
        if nan:
            score[7] = np.nan
        p = tmp_path / name
        pq.write_table(pa.table({"request_id": np.repeat(np.asarray(rids, np.int64), positions),
                                 "group": np.zeros(len(rids) * positions, np.int32),
                                 "position": np.tile(np.arange(positions, dtype=np.int64), len(rids)),
                                 "score": score}), p)
        return p

    cfg = compose_config([*base, f"policy.importance_file={write('nan.parquet', [0, 1, 2], nan=True)}"])
    with pytest.raises(ConfigError, match=r"nan\.parquet: row 7: score nan \(request_id 0, position 7\)"):
        run_simulation(cfg, out_dir=tmp_path / "a")
    cfg = compose_config([*base, f"policy.importance_file={write('one.parquet', [0])}"])
    with pytest.raises(ConfigError, match=r"one\.parquet: no scores recorded for 2 of the 3 requests "
                                          r".* \(first: request 1\)"):
        run_simulation(cfg, out_dir=tmp_path / "b")
    assert not (tmp_path / "b").exists()
    cfg = compose_config([*base, f"policy.importance_file={write('short.parquet', [0, 1, 2], 100)}"])
    with pytest.raises(ConfigError, match=r"short\.parquet: request \d+ group 0 has no score for "
                                          r"positions \[100, .*expected scores for every position"):
        run_simulation(cfg, out_dir=tmp_path / "c")
    assert (tmp_path / "c" / MARKER).exists() and not (tmp_path / "c" / "summary.json").exists()


@pytest.mark.parametrize("overrides, msg", [
    (["cache.block_size=1", "model.max_model_len=20000000"],
     "model.max_model_len=20000000 with cache.block_size=1: a request may need 20,000,000 blocks; "
     "expected at most 16,777,216 (2**24) per request"),
    (["cache.activation_reserve_gib=nan"],
     "cache.activation_reserve_gib=nan; expected a finite number >= 0 GiB or null"),
])
def test_cache_limits_are_config_errors(overrides, msg):
    """A max_model_len needing more than 2**24 blocks a request (the block keys' limit) and a NaN
    activation reserve are config errors naming the fields."""
    with pytest.raises(ConfigError, match=re.escape(msg)):
        validate_config(compose_config(overrides))
