"""Bad input: impossible configs and malformed traces fail before anything is simulated, with a
message naming the field (config) or the file, line and field (trace); ``kvsim`` exits 2 and
leaves only the INCOMPLETE marker. Also a property test: random small workloads and configs
(policies, compactors, a tiny host tier) keep the engine's invariants after every step and end
every request in exactly one terminal state."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import make_workload
from sim.errors import ConfigError
from sim.run import MARKER, compose_config, run_simulation
from sim.validation import validate_config, validate_workload
from traces import TraceConfig, TraceError, load_workload

REPO = Path(__file__).resolve().parents[1]
BAD = Path(__file__).parent / "data" / "bad"
TRACES = Path(__file__).parent / "data" / "traces"
KVSIM = [sys.executable, "-c", "from sim.cli import main; main()"]

# (overrides, regex the message must match): every message names the config field
CONFIG_CASES = [
    # break-it pass: both were accepted before
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
]


def _cfg(*o):
    return compose_config(["sim.progress=false", *o])


@pytest.mark.parametrize("overrides,pattern", CONFIG_CASES, ids=[" ".join(c[0]) for c in CONFIG_CASES])
def test_impossible_config_fails_before_simulation(tmp_path, overrides, pattern):
    """run_simulation raises ConfigError naming the field before it touches the results
    directory (nothing is created, so nothing can be mistaken for a finished run)."""
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=pattern):
        run_simulation(_cfg(*overrides), out)
    assert not out.exists()


def test_rejected_rerun_keeps_an_earlier_complete_run(tmp_path):
    """A config typo on a re-run into the same output.dir leaves the earlier complete results
    as they were (same bytes) and says so; the run exits 2."""
    out = tmp_path / "r"
    r = _kvsim(out, "trace.max_requests=30")
    assert r.returncode == 0, r.stderr[-2000:]
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file() and p.name != "cli.log"}
    r = _kvsim(out, "trace.max_requests=30", "cache.block_size=7")
    assert r.returncode == 2
    assert "keeps an earlier complete run" in r.stderr, r.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()
            if p.is_file() and p.name != "cli.log"} == before
    # the run's record (cli.log) has both attempts: the results, then the refused re-run
    log = (out / "cli.log").read_text()
    assert log.index("results: ") < log.index("keeps an earlier complete run"), log


def test_validate_config_accepts_every_preset():
    """The checks do not reject a shipped preset (a model that needs several GPUs gets them)."""
    conf = REPO / "experiments" / "conf"
    for grp in ("trace", "policy", "compaction", "tiers", "codec", "cache", "gpu"):
        for f in sorted((conf / grp).glob("*.yaml")):
            # (a 24 GB card holds Qwen3-8B's weights and ~40K tokens of KV: vLLM refuses to
            # start at its 131,072-token context, as kvsim does)
            extra = ("model.max_model_len=32768",) if grp == "gpu" else ()
            validate_config(_cfg(f"{grp}={f.stem}", *extra))
    for f in sorted((conf / "model").glob("*.yaml")):
        validate_config(_cfg(f"model={f.stem}", "gpu=h200", "cost.tensor_parallel_size=8"))


def test_sim_validate_config_delegates():
    from sim import run as run_mod

    with pytest.raises(ConfigError, match=r"tiers\.write_policy='x'"):
        run_mod.validate_config(_cfg("tiers.write_policy=x"))


def test_policy_budget_below_protected_prompt():
    """h2o/tova with a protected prompt keep ``budget`` tokens in total: a longer prompt is
    impossible. validate_workload names the request, its prompt and the field; requests rejected
    anyway for max_model_len do not count."""
    c = _cfg("policy=h2o", "policy.protect_prompt=true", "policy.budget=100", "model.max_model_len=2000")
    wl = make_workload([dict(arrival_s=0.0, input_tokens=50, output_tokens=4),
                        dict(arrival_s=0.1, input_tokens=300, output_tokens=4),
                        dict(arrival_s=0.2, input_tokens=5000, output_tokens=4)])
    with pytest.raises(ConfigError, match=r"policy\.budget=100 cannot serve request 1 .*300 prompt "
                                          r"tokens.*below the protected prompt of 300 tokens"):
        validate_workload(c, wl)
    validate_workload(_cfg("policy=h2o", "policy.protect_prompt=false", "policy.budget=100"), wl)
    ok = make_workload([dict(arrival_s=0.0, input_tokens=90, output_tokens=4)])
    validate_workload(c, ok)


def test_budget_below_prompt_run_is_not_complete(tmp_path):
    """Through run_simulation the same config fails with ConfigError (from the workload checks,
    before the results directory is touched, or from the engine at the request's admission,
    which leaves the marker) and leaves no summary.json."""
    c = _cfg("policy=h2o", "policy.protect_prompt=true", "policy.budget=100")
    wl = make_workload([dict(arrival_s=0.0, input_tokens=300, output_tokens=4)])
    with pytest.raises(ConfigError, match=r"budget 100 .* below the protected prompt of 300 tokens"):
        run_simulation(c, tmp_path / "r", workload=wl)
    assert not (tmp_path / "r" / "summary.json").exists()


# ------------------------------------------------------------------------------ traces
TRACE_CASES = [
    (dict(path=str(BAD / "mooncake_many_bad.jsonl")),
     r"mooncake_many_bad\.jsonl line 2, field 'hash_ids': found element -2, expected non-negative integers"),
    (dict(path=str(BAD / "mooncake_truncated.jsonl.gz")),
     r"mooncake_truncated\.jsonl\.gz after line \d+: unreadable gzip stream, found EOFError"),
    (dict(path=str(BAD / "blank.jsonl")), r"blank\.jsonl: empty file, found no non-blank lines"),
    (dict(format="azure", path=str(BAD / "azure_text.csv")),
     r"azure_text\.csv line 3, field 'ContextTokens': found 'abc', expected an integer"),
]


@pytest.mark.parametrize("kw,pattern", TRACE_CASES, ids=[Path(c[0]["path"]).name for c in TRACE_CASES])
def test_trace_errors_name_file_line_field(kw, pattern):
    with pytest.raises(TraceError, match=pattern):
        load_workload(TraceConfig(name="x", **kw), 0)


def test_trace_skip_keeps_count_and_examples():
    w = load_workload(TraceConfig(name="x", path=str(BAD / "mooncake_many_bad.jsonl"), on_error="skip"), 0)
    assert len(w) == 2 and w.skipped["count"] == 5
    ex = w.skipped["examples"]
    assert "line 3, field 'output_length': found -1, expected >= 0" in ex[1]
    assert "line 4, field 'hash_ids': found '7', expected a list" in ex[2]
    assert "line 5: found list, expected a JSON object" in ex[3]
    assert "line 6, field 'timestamp': found -5, expected >= 0" in ex[4]


# ------------------------------------------------------------------------------ the command
def _kvsim(out: Path, *overrides, timeout=120):
    env = dict(os.environ, HYDRA_FULL_ERROR="0")
    return subprocess.run([*KVSIM, f"output.dir={out}", "sim.progress=false", *overrides],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout)


def test_a_pool_override_beyond_the_gpus_memory_is_noted(tmp_path):
    """Break-it pass: cache.num_gpu_blocks=1e8 simulated a pool of thousands of GiB on one H200
    with no word; the override is a what-if (vLLM's num_gpu_blocks_override), so it runs, with
    a note giving the pool's size and what the GPU has left. A pool within it gets no note."""
    r = _kvsim(tmp_path / "big", "trace.max_requests=10", "cache.num_gpu_blocks=3000000",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    mem = json.loads((tmp_path / "big" / "summary.json").read_text())["memory_gib"]
    left = mem["budget"] - mem["weights"] - mem["activation_reserve"] - mem["sliding_window_reserve"]
    assert mem["kv_pool"] > 50 * left
    assert (f"kvsim: note: cache.num_gpu_blocks=3,000,000 ({mem['kv_pool']:,.1f} GiB of KV) is "
            f"beyond the 50,046 blocks ({left:,.1f} GiB) that H200 has room for") in r.stderr
    # the default plan's pool is 50,046 blocks: one more is noted, that many is not
    for n, noted in ((50047, True), (50046, False), (3000, False)):
        r = _kvsim(tmp_path / f"b{n}", "trace.max_requests=10", f"cache.num_gpu_blocks={n}",
                   "output.print_summary=false")
        assert r.returncode == 0, r.stderr
        assert ("num_gpu_blocks" in r.stderr) == noted, r.stderr


def test_cli_skip_reports_skipped_rows_in_summary(tmp_path):
    """trace.on_error=skip through a full kvsim run: summary.json's trace_skipped_rows holds the
    count and the first messages (file, line, field)."""
    p = BAD / "mooncake_many_bad.jsonl"
    r = _kvsim(tmp_path, f"trace.path={p}", "trace.on_error=skip", "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert not (tmp_path / MARKER).exists()
    sk = s["trace_skipped_rows"]
    assert sk["count"] == 5 and len(sk["examples"]) == 5
    assert f"{p} line 2, field 'hash_ids'" in sk["examples"][0]
    assert s["requests_total"] == 2
    assert "kvsim: warning: trace.on_error=skip skipped 5 bad rows (first: " in r.stderr
    # a slice counts the skipped rows of the whole file, and says so (regression pass)
    r = _kvsim(tmp_path / "one", f"trace.path={p}", "trace.on_error=skip", "trace.max_requests=1",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    assert ("kvsim: warning: trace.on_error=skip skipped 5 bad rows in the whole file (2 "
            "requests; the slice keeps 1) (first: ") in r.stderr


@pytest.mark.parametrize("overrides,pattern", [
    (["trace.path={bad}"], r"kvsim: error: .*mooncake_many_bad\.jsonl line 2, field 'hash_ids'"),
    (["cache.block_size=24"], r"kvsim: error: cache\.block_size=24; expected a power of two"),
    (["trace.name=nope", "trace.format=mooncake"], r"kvsim: error: .*field 'name': unknown trace name"),
    (["trace.max_requests=50", "sim.max_sim_time_s=1"],
     r"kvsim: error: sim\.max_sim_time_s=1\.0: the simulated clock passed it at t=[0-9.]+ s with \d+ of 50 "
     r"requests done"),
    # break-it pass: a request repeating a prefix id gave two of its blocks one key (both the
    # pool's counts and the results were wrong, silently); the Mooncake loader's chain check
    # names the line
    (["trace.path={repeat}"], r"kvsim: error: .*mooncake_repeated_id\.jsonl line 2, field 'hash_ids': ids not "
                              r"prefix-chained, found id 0 follows id 1 \(position 2\); at line 1 it starts"),
], ids=["bad-trace", "bad-block-size", "unknown-trace", "sim-time-limit", "repeated-prefix-id"])
def test_cli_exits_2_with_one_clear_line(tmp_path, overrides, pattern):
    o = [x.format(bad=BAD / "mooncake_many_bad.jsonl", repeat=BAD / "mooncake_repeated_id.jsonl")
         for x in overrides]
    r = _kvsim(tmp_path / "r", *o)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    import re
    assert re.search(pattern, r.stderr), r.stderr
    assert "it holds an INCOMPLETE marker" in r.stderr
    # no results: the marker beside Hydra's own record of the job (.hydra/, the job's log)
    names = {p.name for p in (tmp_path / "r").iterdir()} - {".hydra", "cli.log"}
    assert sorted(names) == [MARKER]


def test_sim_time_limit_stops_at_the_same_step_with_fast_forward(tmp_path):
    """The limit error names the clock at the first step that passed it, with the decode
    fast-forward as without it (a stretch ending at that step used to carry on to the next
    per-step check: 30.030 s vs 30.002 s)."""
    import re
    at = []
    for ff in ("true", "false"):
        r = _kvsim(tmp_path / ff, "trace.max_requests=50", "sim.max_sim_time_s=30",
                   f"sim.fast_forward={ff}")
        assert r.returncode == 2, r.stderr[-2000:]
        at.append(re.search(r"passed it at t=([0-9.]+) s", r.stderr).group(1))
    assert at[0] == at[1]


def test_cli_output_dir_is_the_hydra_run_dir(tmp_path):
    """With output.dir the results and the job's log share that folder; no
    outputs/<date>/<time>/ folder appears in the working directory. A rejected re-run into it
    leaves the earlier run's files as they were (no .hydra/ record is written there: the run's
    own config.yaml is the record)."""
    out = tmp_path / "res"
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def kvsim(*ov):
        return subprocess.run([*KVSIM, f"output.dir={out}", "sim.progress=false",
                               "trace.max_requests=5", "output.print_summary=false", *ov],
                              capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)

    r = kvsim("cache.block_size=32")
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]
    assert (out / "summary.json").exists() and not (out / ".hydra").exists()
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.name != "cli.log"}
    r = kvsim("tiers.host_gib=-1")
    assert r.returncode == 2, r.stderr[-2000:]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != "cli.log"} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["res"]


def test_cli_output_dir_that_is_a_file(tmp_path):
    """An output.dir naming a file: one clear error (exit 2), the file untouched, and no run
    folder left where kvsim ran (a newcomer found an outputs/<date>/<time>/ folder) nor in the
    temporary folder Hydra's log went to (a break-it pass found one per call there)."""
    f = tmp_path / "results.txt"
    f.write_text("not a folder")
    tmp = tmp_path.parent / (tmp_path.name + "-tmp")
    tmp.mkdir()
    env = dict(os.environ, HYDRA_FULL_ERROR="0", PYTHONPATH=str(REPO), TMPDIR=str(tmp))
    r = subprocess.run([*KVSIM, f"output.dir={f}", "sim.progress=false", "trace.max_requests=5"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert f"output.dir={f}: exists and is not a folder" in r.stderr
    assert f.read_text() == "not a folder"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.txt"]
    assert list(tmp.iterdir()) == []


@pytest.mark.parametrize("kind", ["files", "sweep", "summary"])
def test_cli_output_dir_holding_other_files_is_refused(tmp_path, kind):
    """An output.dir that holds files that are not a kvsim run's (a folder of the user's own,
    a sweep folder: a newcomer's run landed beside a sweep's jobs, and kvsim-collect then took
    the folder for one run and left the jobs out): one clear error (exit 2) naming the folder
    and what it holds; the folder untouched; no run folder left in the temporary folder."""
    d = tmp_path / "d"
    if kind == "files":
        d.mkdir()
        (d / "notes.txt").write_text("mine")
    elif kind == "summary":  # (break-it pass: a summary.json of one's own made it a run folder)
        (d / "src").mkdir(parents=True)
        (d / "summary.json").write_text("{}")
        (d / "notes.txt").write_text("mine")
    else:  # a sweep's folder: its record and a job's folder
        (d / "0").mkdir(parents=True)
        (d / "multirun.yaml").write_text("hydra: {}\n")
        (d / "0" / "summary.json").write_text("{}")
    before = sorted(str(p.relative_to(d)) for p in d.rglob("*"))
    tmp = tmp_path.parent / (tmp_path.name + "-tmp")
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp))
    r = subprocess.run([*KVSIM, f"output.dir={d}", "sim.progress=false", "trace.max_requests=5"],
                       capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert f"output.dir={d}: the folder holds files that are not a kvsim run's" in r.stderr
    assert {"files": "(notes.txt)", "summary": "(notes.txt, src)",
            "sweep": "(0, multirun.yaml)"}[kind] in r.stderr
    assert sorted(str(p.relative_to(d)) for p in d.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d"] and list(tmp.iterdir()) == []


def test_cli_output_dir_that_cannot_be_created(tmp_path):
    """An output.dir that cannot be created (under /proc): one clear error naming it and the
    reason, exit 2, no traceback (a newcomer got a FileNotFoundError traceback)."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp))
    r = subprocess.run([*KVSIM, "output.dir=/proc/kvsim-test/x", "sim.progress=false",
                        "trace.max_requests=5"], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert "output.dir=/proc/kvsim-test/x: cannot create or write the folder (" in r.stderr
    assert list(tmp.iterdir()) == []


def test_output_folder_that_exists_but_takes_no_file_is_named(tmp_path, monkeypatch):
    """An existing folder no file can be made in (read-only, immutable) is named with the
    reason: a break-it pass got Hydra's traceback for its log file there."""
    import tempfile

    from sim.config import uncreatable_folder

    assert uncreatable_folder(tmp_path) is None and list(tmp_path.iterdir()) == []

    def refuse(**kw):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert uncreatable_folder(tmp_path) == "PermissionError: Operation not permitted"


def test_output_folder_behind_a_dangling_symlink_is_named(tmp_path):
    """Break-it pass: an output.dir that is (or lies under) a symbolic link to a missing target
    was reported as "FileExistsError: File exists"; the link and its target are named."""
    from sim.config import uncreatable_folder

    (tmp_path / "out").symlink_to(tmp_path / "gone" / "x")
    want = f"{tmp_path / 'out'} is a symbolic link to {tmp_path / 'gone' / 'x'}, which does not exist"
    assert uncreatable_folder(tmp_path / "out") == want
    assert uncreatable_folder(tmp_path / "out" / "sub" / "run") == want
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    (tmp_path / "gone" / "x").mkdir(parents=True)  # the target made: the folder is usable
    assert uncreatable_folder(tmp_path / "out" / "sub") is None


def test_cli_output_dir_that_takes_no_file(tmp_path):
    """The CLI on an immutable folder (chattr +i; skipped where the filesystem has no such
    flag): one error line, exit 2, no traceback."""
    d = tmp_path / "imm"
    d.mkdir()
    if subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not supported here")
    try:
        env = dict(os.environ, PYTHONPATH=str(REPO))
        r = subprocess.run([*KVSIM, f"output.dir={d}", "sim.progress=false",
                            "trace.max_requests=5"], capture_output=True, text=True,
                           cwd=tmp_path, env=env, timeout=120)
    finally:
        subprocess.run(["chattr", "-i", str(d)], capture_output=True)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert f"output.dir={d}: cannot create or write the folder (PermissionError" in r.stderr


def test_cli_log_is_the_record_of_the_run_beside_it(tmp_path):
    """A run into an earlier run's folder replaces its results, and its cli.log then holds this
    run's record only (Hydra appends to the file; a newcomer found the earlier run's summary
    first); a run rejected by the checks keeps the earlier results and adds its error to their
    record."""
    out = tmp_path / "res"
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def kvsim(*ov):
        return subprocess.run([*KVSIM, f"output.dir={out}", "sim.progress=false",
                               "trace.max_requests=5", *ov],
                              capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)

    assert kvsim("cache.block_size=32").returncode == 0
    first = (out / "cli.log").read_text()
    assert "cache.block_size=32 -> " in first
    assert kvsim("tiers.host_gib=-1").returncode == 2  # rejected: the first run's results stay
    log = (out / "cli.log").read_text()
    assert log.startswith(first) and "tiers.host_gib" in log[len(first):]
    assert kvsim("cache.block_size=64").returncode == 0
    log = (out / "cli.log").read_text()
    assert "cache.block_size=64" in log and "cache.block_size=32" not in log
    assert "tiers.host_gib" not in log and log.count("summary") == first.count("summary")


# ------------------------------------------------------------------------------ invariants
POLICY_OVERRIDES = {
    "full": lambda d: [],
    "triattention": lambda d: ["policy=triattention", f"policy.budget={d['budget']}", f"policy.beta={d['beta']}"],
    "streaming_llm": lambda d: ["policy=streaming_llm", "policy.sink_tokens=4",
                                f"policy.recent_window={d['budget']}", f"policy.beta={d['beta']}"],
    "snapkv": lambda d: ["policy=snapkv", f"policy.budget={d['budget']}",
                         f"policy.observation_window={min(8, d['budget'])}"],
    "h2o": lambda d: ["policy=h2o", f"policy.budget={d['budget']}", f"policy.beta={d['beta']}"],
}


@st.composite
def scenarios(draw):
    n_docs = draw(st.integers(1, 4))
    rows = []
    for _ in range(draw(st.integers(1, 12))):
        doc = draw(st.integers(0, n_docs - 1))
        inp = draw(st.integers(1, 200))
        row = dict(arrival_s=draw(st.floats(0.0, 0.5)), input_tokens=inp,
                   output_tokens=draw(st.integers(1, 40)),
                   prefix_ids=[doc * 1000 + j for j in range(inp // 16)])
        rows.append(row)
    rows.sort(key=lambda r: r["arrival_s"])
    # a few closed-loop follow-ups (parents precede children)
    for k in range(draw(st.integers(0, 3))):
        p = draw(st.integers(0, len(rows) - 1))
        inp = rows[p]["input_tokens"] + rows[p]["output_tokens"] + draw(st.integers(1, 50))
        rows.append(dict(arrival_s=rows[p]["arrival_s"], input_tokens=inp,
                         output_tokens=draw(st.integers(1, 20)), parent_request_id=p,
                         think_s=draw(st.sampled_from([0.0, 0.01])),
                         prefix_ids=rows[p]["prefix_ids"] + [50_000 + 100 * k + j for j in
                                                             range(inp // 16 - len(rows[p]["prefix_ids"]))]))
    policy = draw(st.sampled_from(sorted(POLICY_OVERRIDES)))
    d = dict(budget=draw(st.sampled_from([8, 24, 64])), beta=draw(st.sampled_from([1, 4, 16])))
    o = [f"cache.block_size={draw(st.sampled_from([4, 8, 16, 32]))}",
         f"cache.num_gpu_blocks={draw(st.integers(2, 48))}",
         f"scheduler.max_num_seqs={draw(st.sampled_from([1, 3, 16]))}",
         f"scheduler.max_num_batched_tokens={draw(st.sampled_from([32, 256]))}",
         *POLICY_OVERRIDES[policy](d)]
    if policy != "full":
        o.append(f"compaction={draw(st.sampled_from(['none', 'forward_pack', 'hole_fill']))}")
    if draw(st.booleans()):
        # Qwen3-8B BF16: 147,456 B per token, so 1-8 MiB holds a handful of pages
        o += ["tiers=gpu_host", f"tiers.host_gib={draw(st.sampled_from([0.02, 0.04, 0.08]))}",
              f"tiers.write_policy={draw(st.sampled_from(['write_back', 'write_through']))}"]
    return rows, o


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_configs_keep_invariants(scenario):
    """sim.check_invariants asserts the pool and layout invariants after every step; every
    request ends exactly once, finished or rejected."""
    rows, o = scenario
    wl = make_workload(rows, prefix_block_tokens=16)
    c = _cfg("sim.check_invariants=true", "output.write_steps=false", *o)
    with tempfile.TemporaryDirectory() as d:
        s = run_simulation(c, d, workload=wl)
        req = pd.read_parquet(Path(d) / "requests.parquet")
    n = len(rows)
    assert s["requests_total"] == n == len(req)
    assert req.request_id.tolist() == list(range(n))
    assert set(req.status) <= {"finished", "rejected"}
    assert s["requests_finished"] + s["requests_rejected"] == n
    fin = req[req.status == "finished"]
    assert fin.finish_s.notna().all() and (fin.finish_s >= fin.arrival_s).all()
    assert (req[req.status == "rejected"].reject_reason != "").all()


def test_tier_smaller_than_one_page_is_an_error():
    from sim.errors import ConfigError
    from sim.run import compose_config, run_simulation

    cfg = compose_config(["tiers=gpu_host", "tiers.host_gib=0.001", "trace.max_requests=5",
                          "sim.progress=false"])
    with pytest.raises(ConfigError, match=r"tiers\.host_gib=0\.001 holds no page of 2359296 bytes"):
        run_simulation(cfg, None)


def test_cli_prints_and_records_trace_loader_warnings(tmp_path):
    """A loader warning (sessions cut at max_context_tokens: fewer requests than the trace
    describes) is printed and written to summary.json, never dropped."""
    r = _kvsim(tmp_path / "r", "trace=synthetic_multiturn", "trace.max_context_tokens=1000",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "kvsim: warning: trace synthetic_multiturn: 64 sessions ended early" in r.stderr
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert any("ended early at max_context_tokens=1000" in w for w in s["trace_warnings"])


def test_summary_table_gives_each_latency_in_one_unit():
    """The printed summary gives TTFT and E2E in s (to the ms) and TPOT in ms, whatever the
    values: an overloaded run's TTFT read as 409,794.9 ms once, and rows that switched unit with
    their values were misread side by side (newcomer pass); a long title is not wrapped; a
    compression run gets a row of its rounds, evicted tokens and freed blocks."""
    import io

    from rich.console import Console

    from sim.cli import format_summary

    s = {"requests_finished": 3, "requests_rejected": 0, "requests_total": 3,
         "ttft_s": {"p50": 2.5, "p90": 9.0, "p99": 409.7949}, "tpot_s": {"p50": 0.0123,
         "p90": 0.02, "p99": 0.031}, "e2e_s": {"p50": None, "p90": None, "p99": None},
         "peak_gpu_blocks_used": 1, "gpu_blocks_total": 2, "preemptions": 0, "engine_steps": 5,
         "sim_duration_s": 1.0, "wall": {"wall_s": 0.1}}
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(format_summary(s))
    text = buf.getvalue()
    assert "TTFT s  p50 / p90 / p99" in text and "2.500 / 9.000 / 409.795" in text
    assert "TPOT ms  p50 / p90 / p99" in text and "12.3 / 20.0 / 31.0" in text
    assert "E2E s  p50 / p90 / p99" in text and "- / - / -" in text
    s2 = dict(s, ttft_s={"p50": 0.0185, "p90": 0.0365, "p99": 1.2359})
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(format_summary(s2))
    assert "TTFT s  p50 / p90 / p99" in buf.getvalue() and "0.018 / 0.036 / 1.236" in buf.getvalue()
    long = dict(s, trace="weka_agentic_slice", trace_source="/x/weka_agentic_trace_0002.jsonl.xz",
                model="Qwen3-8B", gpu="H200", policy="triattention", compaction="forward_pack")
    buf = io.StringIO()
    Console(file=buf, width=110, color_system=None).print(format_summary(long))
    title = buf.getvalue().splitlines()[0].strip()
    assert title == ("kvsim: weka_agentic_slice (weka_agentic_trace_0002.jsonl.xz) | Qwen3-8B on "
                     "H200 | triattention + forward_pack"), buf.getvalue()
    assert "compression rounds" not in text  # no policy: no row
    s.update(policy="triattention", rounds=53564, tokens_evicted_total=6856192,
             blocks_freed_total=428512)
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(format_summary(s))
    assert "53,564 / 6,856,192 / 428,512" in buf.getvalue()


@pytest.mark.parametrize("over", ["output_mean=1e25", "max_context_tokens=134217729"])
def test_synthetic_lengths_beyond_int_range_are_an_error(over):
    """An output mean whose draws pass 2**27 tokens, or a larger max_context_tokens, is a
    TraceError naming the field; before, output_mean=1e25 wrapped int64 to negative lengths and
    ended in an internal error (break-it pass), and shared_prefix_tokens=1e10 with a larger
    max_context_tokens listed block ids until memory ran out. Input draws are bounded by
    max_context_tokens instead (regression pass: a huge draw the cap removes was refused): a
    first input above it is redrawn below it, a turn input above it ends the session."""
    fmt = "synthetic_reasoning"
    cfg = _cfg(f"trace={fmt}", "trace.num_sessions=5", f"trace.{over}")
    with pytest.raises(TraceError, match=re.escape(f"trace.{over.split('=')[0]}")):
        load_workload(cfg.trace, seed=0)
    cfg = _cfg(f"trace={fmt}", "trace.num_sessions=5", "trace.max_context_tokens=134217728")
    assert len(load_workload(cfg.trace, seed=0)) >= 5  # (the bound itself is allowed)
    # heavy-tailed inputs: draws of ~1e9 tokens, redrawn or ending sessions as before
    cfg = _cfg("trace=synthetic_agentic", "trace.num_sessions=300", "trace.input_mean=5e5",
               "trace.input_sigma=3.5", "trace.turn_input_mean=1e5", "trace.turn_input_sigma=3.5")
    wl = load_workload(cfg.trace, seed=0)
    assert int(wl.input_tokens.max()) <= 131072 and any("ended early" in w for w in wl.warnings)
    cfg = _cfg("trace=synthetic_multiturn", "trace.num_sessions=5", "trace.turn_input_mean=1e25")
    assert all(load_workload(cfg.trace, seed=0).turn == 0)  # (every second turn overflows)


@pytest.mark.parametrize("col", ["input_tokens", "output_tokens"])
def test_workload_with_a_length_below_one_is_rejected(col):
    """validate_workload holds every loader to the workload schema's lengths (>= 1 prompt and
    output token), naming the request."""
    rows = [dict(input_tokens=10, output_tokens=5), dict(input_tokens=10, output_tokens=5)]
    rows[1][col] = -3
    with pytest.raises(TraceError, match=rf"request 1 .*{col}.*found -3, expected >= 1 tokens"):
        validate_workload(_cfg(), make_workload(rows))


@pytest.mark.parametrize("bad", [8935703513288155120, 2 ** 63 - 1, (2 ** 63 - 1 - 512) // 513 + 1])
def test_prefix_id_too_large_for_exact_block_keys_is_rejected(tmp_path, bad):
    """A prefix id whose block key (id x (G + 1) + offset) would wrap int64 is a TraceError
    naming the file, the request and the id; before, 8935703513288155120 (break-it pass) made
    the first block's key the empty-slot marker and an empty cache reported a prefix hit. The
    largest allowed id passes."""
    p = tmp_path / "big.jsonl"
    rows = [dict(timestamp=0, input_length=600, output_length=20, hash_ids=[3, 4]),
            dict(timestamp=100, input_length=600, output_length=20, hash_ids=[bad, 7])]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _cfg("trace.format=mooncake", f"trace.path={p}")
    wl = load_workload(cfg.trace, seed=0)
    with pytest.raises(TraceError, match=rf"big.jsonl request 1 .*prefix id out of range, found id {bad}"):
        validate_workload(cfg, wl)
    rows[1]["hash_ids"][0] = (2 ** 63 - 1 - 512) // 513
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    validate_workload(cfg, load_workload(cfg.trace, seed=0))


def test_misspelt_override_key_gets_kvsims_error_with_the_near_field():
    """A misspelt key is kvsim's error (exit 2) naming the closest field, not Hydra's hint to
    append it with '+' (newcomer pass); every key of the composed config, with each policy's
    and the tiers' presets, passes the check."""
    from omegaconf import OmegaConf

    from sim.cli import unknown_override_key

    err = unknown_override_key(["trace.max_request=200"])
    assert "unknown config key 'trace.max_request'" in err and "did you mean trace.max_requests?" in err
    assert "did you mean" not in unknown_override_key(["sim.zzz=1"])
    # (break-it pass: a free-form "experiment" key took anything and was used by nothing)
    assert unknown_override_key(["experiment=hit_by_tier"]).startswith(
        "unknown config key 'experiment': the config has no field 'experiment'")
    assert unknown_override_key(["+trace.max_request=1", "hydra/launcher=joblib", "-m",
                                 "trace=weka_agentic", "trace.max_requests=1,2"]) is None

    def leaves(node, prefix=""):
        for k, v in node.items():
            if isinstance(v, dict):
                yield from leaves(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}"

    for extra in ([], ["policy=triattention", "tiers=gpu_host_disk", "codec=nvfp4"]):
        cfg = OmegaConf.to_container(_cfg(*extra), resolve=False)
        keys = list(leaves(cfg))
        assert len(keys) > 100
        assert unknown_override_key([f"{k}=1" for k in keys]) is None
    r = _kvsim(Path(tempfile.mkdtemp()) / "r", "trace.max_request=200")
    assert r.returncode == 2 and "did you mean trace.max_requests?" in r.stderr, r.stderr


def test_unparsable_overrides_and_bad_sweep_values_get_kvsims_error(tmp_path):
    """Break-it pass: overrides Hydra's grammar rejects (an unquoted '~' or non-ASCII character
    in a path, '16,,32'), a sweep value of the wrong type and a sweep on 0 joblib workers gave
    Hydra's error (exit 1) or joblib's traceback. Each is one kvsim error line naming the
    argument, with how to write it, exit 2, before any folder is made; a quoted path, sweeps,
    ranges, lists and interpolations still parse."""
    from sim.cli import unknown_override_key, unparsable_override

    err = unparsable_override(["trace.path=~/x.jsonl"])
    assert err.startswith("trace.path=~/x.jsonl: not an override Hydra can parse (")
    assert "needs quotes inside the argument: \"trace.path='~/x.jsonl'\"" in err
    assert "'ü' needs quotes" in unparsable_override(["trace.path=/tmp/ü.jsonl"])
    assert "separated by single commas" in unparsable_override(["cache.block_size=16,,32"])
    assert "0 workers" in unparsable_override(["-m", "hydra.launcher.n_jobs=0"])
    assert unparsable_override(["-m", "trace.path='~/x b ü.jsonl'", "seed=range(1,3)", "a=[1,2]",
                                "trace.path=${oc.env:HOME}/x", "--cfg", "job", "--info",
                                "config", "hydra.launcher.n_jobs=2", "seed=1,2"]) is None
    err = unknown_override_key(["trace.max_requests=10,abc"])
    assert err == "trace.max_requests=10,abc: the sweep's value abc: expected an integer"
    assert "expected a number" in unknown_override_key(["tiers.host_gib=1,x"])
    assert unknown_override_key(["trace.max_requests=10,20", "tiers.host_gib=1,2.5",
                                 "trace.max_requests=range(1,3)"]) is None
    # (second pass: choice(), quoted values, booleans and ++ were let through to Hydra's error;
    # the 0-worker check missed 00 and '0' and refused n_jobs=0 outside a sweep; an option's
    # value was parsed as an override; shell completion's words were refused as keys)
    for a, v in (("trace.max_requests=choice(abc)", "abc"), ("trace.max_requests='10','abc'", "abc"),
                 ("trace.max_requests=10,true", "True"), ("++trace.max_requests=10,abc", "abc")):
        assert f"the sweep's value {v}: expected an integer" in unknown_override_key([a]), a
    assert unknown_override_key(["trace.max_requests='10','20'", "sim.fast_forward=true,false",
                                 "trace.path='a','b'"]) is None
    for a in ("hydra.launcher.n_jobs=00", "hydra.launcher.n_jobs='0'", "hydra.launcher.n_jobs=-0"):
        assert "0 workers" in unparsable_override([a], sweep=True), a
    assert unparsable_override(["hydra.launcher.n_jobs=0"], sweep=False) is None
    assert "with \\' for a quote" in unparsable_override(["trace.path=~/it's.jsonl"])
    from sim.cli import command_line_overrides

    assert command_line_overrides(["--config-dir", "/x/cfg=1", "--cfg", "job", "-m", "seed=1,2",
                                   "--info", "config"]) == ["seed=1,2"]
    assert command_line_overrides(["-sc", "install=bash"]) == []
    for args in (["-m", "trace.max_requests=10,abc"], ["trace.path=~/x.jsonl"],
                 ["-m", "hydra.launcher.n_jobs=0", "seed=1,2"]):
        r = subprocess.run([*KVSIM, *args, f"hydra.sweep.dir={tmp_path / 'sw'}",
                            f"hydra.run.dir={tmp_path / 'run'}"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
        assert r.returncode == 2, (args, r.stderr[-1500:])
        (line,) = r.stderr.strip().splitlines()
        assert line.startswith("kvsim: error: ") and "Traceback" not in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_blank_and_extra_rows_are_not_dropped_silently(tmp_path):
    """Newcomer pass: a blank line between rows was skipped and its request silently lost, and
    an Azure row with an extra field was accepted. A blank line before a row is now a bad row
    (an error, or one skipped and counted with on_error=skip); blank lines at the end of the
    file are not rows; an Azure row must have exactly the header's fields."""
    rows = [json.dumps({"timestamp": i * 10, "input_length": 600, "output_length": 4,
                        "hash_ids": [i, 100 + i]}) for i in range(4)]
    mid = tmp_path / "mid.jsonl"
    mid.write_text("\n".join(rows[:2]) + "\n\n" + "\n".join(rows[2:]) + "\n")
    # (second newcomer pass: it said "found Input is a zero-length, empty document")
    with pytest.raises(TraceError, match=r"mid\.jsonl line 3: invalid JSON, found a blank line, "
                                         r"expected one JSON object per line"):
        load_workload(TraceConfig(name="x", path=str(mid)), 0)
    w = load_workload(TraceConfig(name="x", path=str(mid), on_error="skip"), 0)
    assert len(w) == 4 and w.skipped["count"] == 1 and "line 3" in w.skipped["examples"][0]
    trail = tmp_path / "trail.jsonl"
    trail.write_text("\n".join(rows) + "\n\n  \n")
    assert len(load_workload(TraceConfig(name="x", path=str(trail)), 0)) == 4
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
    row = "2023-11-16 18:15:46.6805900,374,44\n"
    for text, pattern in [(head + row + "\n" + row, r"line 3: found 0 fields \(a blank line\), expected 3"),
                          ("\n" + head + row, r"line 1: blank line, found a blank line, expected the header"),
                          (head + row + row.strip() + ",7\n", r"line 3: found 4 fields, expected 3")]:
        az = tmp_path / "az.csv"
        az.write_text(text)
        with pytest.raises(TraceError, match=pattern):
            load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)


def test_weka_unknown_request_type_is_a_warning(tmp_path):
    """A Weka request type other than the trace's ('n', 's', 'subagent') is loaded as a
    main-chain request with a warning naming it, its count and its first line."""
    reqs = [{"t": float(i), "type": typ, "in": 200, "out": 5, "hash_ids": [1, 2, 3][: 200 // 64]}
            for i, typ in enumerate(["n", "zzz", "s", "zzz"])]
    p = tmp_path / "w.jsonl"
    p.write_text(json.dumps({"id": "s1", "requests": reqs}) + "\n")
    w = load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)
    assert len(w) == 4
    assert any("2 requests have type 'zzz'" in x and "line 1" in x for x in w.warnings), w.warnings
    # inside a sub-agent too
    sub = {"t": 5.0, "type": "subagent", "requests": [
        {"t": 0.0, "type": "weird", "in": 200, "out": 5, "hash_ids": [1, 2, 3]}]}
    p.write_text(json.dumps({"id": "s1", "requests": reqs[:1] + [sub]}) + "\n")
    w = load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)
    assert any("1 request has type 'weird'" in x and "sub-agent request 0" in x
               for x in w.warnings), w.warnings


def test_trace_count_warnings_say_they_count_the_whole_file_when_sliced(tmp_path):
    """Break-it pass: a 200-request slice of the Weka file warned "27 requests had out = 0"
    counting the whole file. The parser counts before slicing (its result is cached for every
    slice): the count warnings now say so when the slice keeps fewer requests."""
    reqs = [{"t": float(i), "type": "n", "in": 200, "out": 0 if i % 2 else 5,
             "hash_ids": [1, 2, 3]} for i in range(6)]
    p = tmp_path / "w.jsonl"
    p.write_text("".join(json.dumps({"id": f"s{k}", "requests": reqs}) + "\n" for k in range(2)))
    whole = load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)
    assert "6 requests had out = 0; loaded as 1 (zero_output=as_one)" in whole.warnings
    part = load_workload(TraceConfig(name="x", format="weka", path=str(p), max_requests=4), 0)
    assert len(part) == 4
    assert ("in the whole file (12 requests; the slice keeps 4): 6 requests had out = 0; "
            "loaded as 1 (zero_output=as_one)") in part.warnings, part.warnings
    # a generated trace is no file: its counts are of the whole generated trace
    syn = load_workload(TraceConfig(name="x", format="synthetic_multiturn", num_sessions=40,
                                    max_context_tokens=3000, max_requests=5), 0)
    assert len(syn.warnings) == 1 and syn.warnings[0].startswith(
        "in the whole generated trace ("), syn.warnings


def test_weka_ids_not_prefix_chained_are_an_error_naming_both_requests(tmp_path):
    """Break-it pass: Weka ids were not checked for prefix-chaining (Mooncake's are), so a
    session whose id 7 followed id 1 in one request and id 2 in another got prefix hits no
    server could have. Now an error naming the session's line, both requests and positions;
    with on_error=skip the session is skipped. Requests without ids (in < 64) and sub-agent
    requests take part."""
    def write(*sessions):
        p = tmp_path / "w.jsonl"
        p.write_text("".join(json.dumps({"id": f"s{k}", "requests": [
            {"t": float(i), "type": "n", "in": 64 * len(h) + 10, "out": 5, "hash_ids": h}
            for i, h in enumerate(hs)]}) + "\n" for k, hs in enumerate(sessions)))
        return TraceConfig(name="x", format="weka", path=str(p))
    ok = write([[1, 2], [], [1, 2, 3], [1, 2, 4]], [[1, 5], [1, 5, 6]])
    assert len(load_workload(ok, 0)) == 6
    bad = write([[1, 2]], [[1, 2, 3], [], [1, 7], [1, 2, 7]])
    with pytest.raises(TraceError, match=re.escape(
            "line 2 (session 's1', request 3), field 'hash_ids': ids not prefix-chained, found id 7 "
            "follows id 2 (position 2); in line 2 (session 's1', request 2) it follows id 1 "
            "(position 1)")):
        load_workload(bad, 0)
    skip = TraceConfig(name="x", format="weka", path=bad.path, on_error="skip")
    assert len(load_workload(skip, 0)) == 1
    with pytest.raises(TraceError, match=re.escape("request 1), field 'hash_ids': ids not prefix-chained, "
                                                   "found id 2 starts the request's ids (position 0); "
                                                   "in line 1 (session 's0', request 0) it follows id 1")):
        load_workload(write([[1, 2], [2, 3]]), 0)
    sub = {"t": 5.0, "type": "subagent", "requests": [
        {"t": 0.0, "type": "n", "in": 200, "out": 5, "hash_ids": [9, 1, 2]}]}
    p = tmp_path / "w.jsonl"
    p.write_text(json.dumps({"id": "s1", "requests": [
        {"t": 0.0, "type": "n", "in": 200, "out": 5, "hash_ids": [1, 2, 3]}, sub]}) + "\n")
    with pytest.raises(TraceError, match=r"sub-agent request 0\), field 'hash_ids': ids not prefix-chained, "
                                         r"found id 1 follows id 9 \(position 1\)"):
        load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)


def test_policy_options_the_policy_does_not_read_get_a_note(tmp_path):
    """Break-it pass: policy.budget under streaming_llm (whose limit is sink_tokens +
    recent_window), policy.heavy_ratio under triattention and policy.pooling_kernel under
    streaming_llm changed nothing without a word; and a run whose rounds never started blamed
    policy.budget where streaming_llm's threshold is its sinks and window. Each such option gets
    a note naming the policies that read it; the no-round note names the real threshold."""
    from policies.config import PolicyConfig
    from policies.registry import POLICIES
    from sim.cli import POLICY_READERS, inert_override_notes

    notes = inert_override_notes(["policy.budget=100", "policy.pooling_kernel=5",
                                  "policy.sink_tokens=8", "policy.beta=64"], "mooncake",
                                 "gpu_only", policy="streaming_llm")
    assert [n.split(" is read by ")[0] for n in notes] == ["policy.budget", "policy.pooling_kernel"]
    assert notes[0].endswith("this run's policy is streaming_llm: it changes nothing")
    assert inert_override_notes(["policy.heavy_ratio=0.3"], "mooncake", "gpu_only",
                                policy="triattention") == [
        "policy.heavy_ratio is read by policy=h2o; this run's policy is triattention: it changes "
        "nothing"]
    assert inert_override_notes(["policy.heavy_ratio=0.3", "policy.budget=9"], "mooncake",
                                "gpu_only", policy="h2o") == []
    # (second pass: streaming_llm and the snapkv family never protect the prompt)
    for pol in ("streaming_llm", "snapkv", "pyramidkv", "ada_kv"):
        (note,) = inert_override_notes(["policy.protect_prompt=true"], "mooncake", "gpu_only",
                                       policy=pol)
        assert note.startswith("policy.protect_prompt is read by policy=random, h2o")
        assert not POLICIES[pol](PolicyConfig(name=pol, protect_prompt=True)).protects_prompt
    assert inert_override_notes(["policy.protect_prompt=false"], "mooncake", "gpu_only",
                                policy="h2o") == []
    assert set(n for r in POLICY_READERS.values() for n in r) <= set(POLICIES) - {"full"}
    r = subprocess.run([*KVSIM, "trace=synthetic_reasoning", "trace.num_sessions=2",
                        "policy=streaming_llm", "policy.sink_tokens=100000", "sim.progress=false",
                        "output.print_summary=false", f"output.dir={tmp_path / 'o'}",
                        f"hydra.run.dir={tmp_path / 'h'}"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("its first round comes at the first multiple of policy.beta=1 past "
            "policy.sink_tokens + policy.recent_window=102044 tokens (102,045 tokens)") in r.stderr
    assert "policy.budget=" not in r.stderr


def test_inert_overrides_get_a_note():
    """Break-it pass: options another kind of trace reads, and tier options without a tier,
    were accepted without a word."""
    from sim.cli import inert_override_notes

    notes = inert_override_notes(["trace.num_requests=10", "trace.max_sessions=3",
                                  "trace.max_requests=5", "tiers.write_policy=write_through",
                                  "+tiers.onboard=layerwise", "seed=1"], "mooncake", "gpu_only")
    assert notes == [
        "trace.num_requests is read by servegen and bench traces only; this run's trace is mooncake: it changes nothing",
        "trace.max_sessions is read by weka traces only; this run's trace is mooncake: it changes nothing",
        "tiers.write_policy applies to host and disk tiers; with none (tiers.host_gib = "
        "tiers.disk_gib = 0) it changes nothing",
        "tiers.onboard applies to host and disk tiers; with none (tiers.host_gib = "
        "tiers.disk_gib = 0) it changes nothing"]
    assert inert_override_notes(["trace.num_sessions=3", "tiers.onboard=layerwise"],
                                "synthetic_multiturn", "gpu_host") == []
    assert inert_override_notes(["trace.timestamp_spread=keep"], "weka", "gpu_only")[0].startswith(
        "trace.timestamp_spread is read by mooncake traces only")
    # (second break-it pass: a synthetic trace's path and an analytic run's cost.file)
    assert inert_override_notes(["trace.path=/x.jsonl", "cost.file=/c.json"], "synthetic_reasoning",
                                "gpu_only", "analytic") == [
        "trace.path is read by traces loaded from files; this run's trace is synthetic_reasoning, "
        "generated from its options: it changes nothing",
        "cost.file is read with cost.kind=calibrated; this run's cost.kind is analytic: it changes "
        "nothing"]
    assert inert_override_notes(["trace.path=/x.jsonl", "cost.file=/c.json"], "mooncake",
                                "gpu_only", "calibrated") == []
    # the parsed-trace cache's options: a generated trace is never parsed
    assert [n.split(" is ")[0] for n in inert_override_notes(
        ["trace.cache=false", "trace.cache_dir=/c"], "synthetic_agentic", "gpu_only")] == \
        ["trace.cache", "trace.cache_dir"]
    assert inert_override_notes(["trace.cache=false"], "weka", "gpu_only") == []


def test_inert_policy_compaction_and_codec_options_get_a_note():
    """Second break-it pass: policy and compaction options with policy=full, hole-filling
    options under another compaction, compaction.pin_prompt (the engine pins what the policy
    protects) and codec options with codec=identity changed nothing without a word."""
    from sim.cli import inert_override_notes

    notes = inert_override_notes(["policy.budget=100", "compaction=forward_pack",
                                  "codec.keep_rope_hot=true", "policy=full"], "mooncake",
                                 "gpu_host", "analytic", "full", "forward_pack", "identity")
    assert notes == [
        "policy.budget applies to a compression policy's rounds; policy=full keeps every token "
        "and runs none: it changes nothing",
        "compaction applies to a compression policy's rounds; policy=full keeps every token and "
        "runs none: it changes nothing",
        "codec.keep_rope_hot is read by the fp8 and nvfp4 codecs; this run's codec is identity "
        "(pages copied as they are): it changes nothing"]
    notes = inert_override_notes(["compaction.position_index_bytes=8", "compaction.pin_prompt=false",
                                  "compaction.release_empty_blocks=false", "policy.budget=100",
                                  "codec.keep_rope_hot=true"], "mooncake", "gpu_host", "analytic",
                                 "triattention", "forward_pack", "nvfp4")
    assert notes == [
        "compaction.position_index_bytes is read by compaction=hole_fill; this run's compaction "
        "is forward_pack: it changes nothing",
        "compaction.pin_prompt is not read in a simulation (the engine pins the slots the policy "
        "protects, policy.protect_prompt): it changes nothing"]
    assert inert_override_notes(["compaction.position_index_bytes=8"], "mooncake", "gpu_only",
                                "analytic", "h2o", "hole_fill", "identity") == []


def test_cli_notes_kv_capacity_rejections_under_a_compression_policy(tmp_path):
    """Break-it pass: 36 of 100 reasoning requests were rejected as kv_capacity under
    TriAttention (budget 128) exactly as without it; the check counts the uncompressed
    sequence, which the CLI now says."""
    r = _kvsim(tmp_path / "r", "trace=synthetic_reasoning", "trace.num_sessions=100",
               "cache.num_gpu_blocks=300", "policy=triattention", "policy.budget=128",
               "compaction=forward_pack", "output.print_summary=false", "output.write_steps=false")
    assert r.returncode == 0, r.stderr
    assert ("kvsim: note: 36 request(s) were rejected as kv_capacity: the check counts each whole "
            "uncompressed sequence (input + output) against the pool and does not credit "
            "policy=triattention's evictions") in r.stderr


def test_cli_warns_when_no_request_finished(tmp_path):
    r = _kvsim(tmp_path / "r", "trace.max_requests=20", "cache.num_gpu_blocks=1",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    assert "kvsim: warning: no request finished: all 20 were rejected (kv_capacity: 20)" in r.stderr


def test_cli_notes_a_policy_that_ran_no_round(tmp_path):
    """Newcomer pass: policy=triattention on the default slice printed 0 / 0 / 0 rounds with no
    word on why (no request passed the budget); Quest, which frees nothing, gets no note."""
    r = _kvsim(tmp_path / "r", "trace.max_requests=20", "policy=triattention",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    assert ("kvsim: note: policy=triattention ran no compression round: its first round comes "
            "at the first multiple of policy.beta=128 past policy.budget=2048 decode tokens "
            "(2,176 decode tokens)") in r.stderr
    r = _kvsim(tmp_path / "q", "trace.max_requests=20", "policy=quest", "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    assert "ran no compression round" not in r.stderr
    assert "read every page" not in r.stderr  # (its 2,048-token budget is below some contexts)


def test_cli_notes_a_quest_budget_above_every_context(tmp_path):
    """Break-it pass: policy=quest with a budget above every request's context read every page
    (it saved nothing) with no word; summary.json now holds the longest context, and the note
    names the pages read per step, the knob and that context."""
    r = _kvsim(tmp_path / "q", "trace.max_requests=20", "policy=quest", "policy.budget=1000000",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "q" / "summary.json").read_text())
    req = pd.read_parquet(tmp_path / "q" / "requests.parquet")
    assert s["longest_context_tokens"] == int((req.input_tokens + req.output_tokens).max())
    assert (f"kvsim: note: policy=quest read every page: it reads the top 62,500 pages of 16 "
            f"tokens per step (policy.budget=1,000,000 tokens), and no request's context passed "
            f"that (the longest: {s['longest_context_tokens']:,} tokens)") in r.stderr


def test_cli_note_for_a_prompt_policy_that_ran_no_round_names_the_prompt(tmp_path):
    """Break-it pass: snapkv with no prompt above its budget was told that a long-output trace
    would start its rounds; it compresses prompts only (one round at prefill end)."""
    r = _kvsim(tmp_path / "r", "trace.max_requests=20", "policy=snapkv", "policy.budget=200000",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    assert ("kvsim: note: policy=snapkv ran no compression round: it compresses a prompt once, "
            "at prefill end, when the prompt is longer than policy.budget=200,000 tokens, and no "
            "prompt of this trace was") in r.stderr
    assert "long outputs do not start it" in r.stderr
    # (second pass: pyramidkv's threshold is its smallest layer budget, not policy.budget)
    r = _kvsim(tmp_path / "p", "trace.max_requests=5", "policy=pyramidkv", "policy.budget=150000",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    assert ("when the prompt is longer than its smallest layer budget, policy.budget / "
            "policy.layer_budget_ratio with policy.observation_window as a floor = 7,500 tokens"
            ) in r.stderr


def test_summary_table_small_rates_and_tensor_parallel_title():
    """Newcomer pass: an idle trace's output throughput of 0.455 tok/s printed as '0', and a
    tensor-parallel run's title named one GPU."""
    import io

    from rich.console import Console

    from sim.cli import format_summary

    s = {"requests_finished": 3, "requests_rejected": 0, "requests_total": 3,
         "ttft_s": {}, "tpot_s": {}, "e2e_s": {}, "peak_gpu_blocks_used": 1,
         "gpu_blocks_total": 2, "preemptions": 0, "engine_steps": 5, "sim_duration_s": 1.0,
         "wall": {"wall_s": 0.1}, "throughput_tokens_per_s": 101.4,
         "output_throughput_tokens_per_s": 0.4551, "model": "M", "gpu": "H200",
         "tensor_parallel_size": 2}
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(format_summary(s))
    text = buf.getvalue()
    assert "101 / 0.455" in text and "M on 2 x H200" in text
    s.update(tensor_parallel_size=1, throughput_tokens_per_s=12345.6,
             output_throughput_tokens_per_s=99.94)
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(format_summary(s))
    text = buf.getvalue()
    assert "12,346 / 99.9" in text and "M on H200" in text


@pytest.mark.parametrize("arg, err", [
    ("seed=abc", "seed=abc: expected an integer"),
    ("tiers.host_gib=lots", "tiers.host_gib=lots: expected a number"),
    ("sim.fast_forward=maybe", "sim.fast_forward=maybe: expected true or false"),
    ("trace.max_requests=1.5", "trace.max_requests=1.5: expected an integer"),
    ("trace.max_requests=1_000", None), ("trace.max_requests=null", None),
    ("tiers.host_gib=1e2", None), ("sim.fast_forward=off", None), ("seed=1,2,3", None),
    ("seed=${oc.env:X}", None), ("trace.name=abc", None),
])
def test_mistyped_values_get_kvsim_errors(arg, err):
    """Break-it pass: a value that cannot be the field's type got Hydra's raw conversion
    error (exit 1); kvsim names the override and what it expected (exit 2, checked before
    Hydra). Sweeps, interpolations, null and OmegaConf's other bool spellings pass through."""
    from sim.cli import unknown_override_key

    assert unknown_override_key([arg]) == err


def test_line_endings(tmp_path):
    """CRLF rows load as LF rows; a file with CR-only line endings (one long line) is an error
    naming the line and the CR byte, in every format, instead of a bare JSON or field-count
    message."""
    rows = [json.dumps({"timestamp": i * 10, "input_length": 600, "output_length": 4,
                        "hash_ids": [i, 100 + i]}) for i in range(3)]
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(("\r\n".join(rows) + "\r\n").encode())
    assert len(load_workload(TraceConfig(name="x", path=str(crlf)), 0)) == 3
    cr = tmp_path / "cr.jsonl"
    cr.write_bytes(("\r".join(rows) + "\r").encode())
    for fmt in ("mooncake", "weka"):
        with pytest.raises(TraceError, match=r"cr\.jsonl line 1: carriage return inside a line"):
            load_workload(TraceConfig(name="x", format=fmt, path=str(cr)), 0)
    az = tmp_path / "az.csv"
    az.write_bytes(b"TIMESTAMP,ContextTokens,GeneratedTokens\r2023-11-16 18:15:46.6805900,374,44\r")
    with pytest.raises(TraceError, match=r"az\.csv line 1: carriage return inside a line"):
        load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)


def test_override_key_given_twice_is_an_error(tmp_path):
    """Break-it pass: ``tiers=gpu_host tiers=gpu_only`` ran gpu_only without a word (Hydra keeps
    the last value). A key given twice, ``+`` prefixes included, is now exit 2 with a message
    naming both and the sweep spelling; distinct keys pass. Deleting a kvsim setting (``~seed``)
    is exit 2 with one line too."""
    from sim.cli import duplicate_override_key

    err = duplicate_override_key(["trace.max_requests=5", "seed=1", "+seed=2"])
    assert err.startswith("override key 'seed' given twice (seed=1, +seed=2)") and "-m seed=1,2" in err
    assert duplicate_override_key(["seed=1", "~hydra.job", "tiers=gpu_host", "tiers.host_gib=2", "-m"]) is None
    # a kvsim setting deleted with ~ (a traceback from Hydra or OmegaConf, exit 1, before)
    assert duplicate_override_key(["~seed"]).startswith("cannot delete config key 'seed' (~seed)")
    r = _kvsim(tmp_path / "d", "~model")
    assert r.returncode == 2 and "cannot delete config key 'model'" in r.stderr and "Traceback" not in r.stderr
    r = _kvsim(tmp_path / "r", "tiers=gpu_host", "tiers=gpu_only")
    assert r.returncode == 2 and "override key 'tiers' given twice" in r.stderr, r.stderr
    assert not (tmp_path / "r").exists()


def test_relative_trace_path_is_recorded_absolute(tmp_path, monkeypatch):
    """Break-it pass: a relative trace.path went into summary.json's trace_source as typed, which
    says nothing once the run folder is read elsewhere; it is recorded as the absolute path it
    pointed at (from the working folder)."""
    row = json.dumps({"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]})
    (tmp_path / "small.jsonl").write_text(row + "\n")
    monkeypatch.chdir(tmp_path)
    w = load_workload(TraceConfig(name="x", path="small.jsonl"), 0)
    assert w.source == str(tmp_path / "small.jsonl")


def test_integers_past_64_bits_are_named(tmp_path):
    """Break-it pass: a hash id or token count of 2**63 or more ended in an OverflowError
    traceback (or a float-looking message for 2**70); it is a TraceError naming the field and
    the value as written."""
    big = 2**63 + 5
    cases = [({"input_length": 600, "hash_ids": [1, big]}, f"'hash_ids': found element {big}"),
             ({"input_length": 600, "hash_ids": [1, 2**70]}, f"'hash_ids': found element {2**70}"),
             ({"input_length": big, "hash_ids": [1]}, f"'input_length': found {big}, expected an integer that fits 64 bits"),
             # a whole float too large is shown as written (it was shown as its integer value)
             ({"input_length": 1e30, "hash_ids": [1]}, "'input_length': found 1e+30 (float), expected an integer that fits 64 bits")]
    for fields, msg in cases:
        p = tmp_path / "b.jsonl"
        p.write_text(json.dumps({"timestamp": 0, "output_length": 4, **fields}) + "\n")
        with pytest.raises(TraceError, match=re.escape(msg)):
            load_workload(TraceConfig(name="x", path=str(p)), 0)
    az = tmp_path / "az.csv"
    az.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,{big},44\n")
    with pytest.raises(TraceError, match=re.escape(f"line 2, field 'ContextTokens': found {big}")):
        load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)


def test_ids_not_prefix_chained_are_an_error(tmp_path):
    """Break-it pass: a Mooncake trace whose id 2 sat at block 2 of one request and started the
    next got prefix hits no server could have (block keys trust the ids to be prefix-chained).
    An id that follows a different id than at its first occurrence is now an error naming both
    lines; a shared prefix and a repeated prompt still load."""
    def write(rows):
        p = tmp_path / "c.jsonl"
        p.write_text("".join(json.dumps({"timestamp": i, "input_length": 512 * len(h), "output_length": 5,
                                         "hash_ids": h}) + "\n" for i, h in enumerate(rows)))
        return TraceConfig(name="x", path=str(p))
    assert len(load_workload(write([[0, 1, 2], [0, 1, 3], [0, 1, 2], [4]]), 0)) == 4
    for rows, msg in [([[0, 1, 2], [2, 3]], "line 2, field 'hash_ids': ids not prefix-chained, found id 2 "
                                              "starts the prompt (position 0); at line 1 it follows id 1"),
                      ([[0, 1], [5, 6], [5, 1]], "line 3, field 'hash_ids': ids not prefix-chained, found id 1 "
                                                 "follows id 5 (position 1); at line 1 it follows id 0")]:
        with pytest.raises(TraceError, match=re.escape(msg)):
            load_workload(write(rows), 0)
        with pytest.raises(TraceError, match="not prefix-chained"):
            load_workload(TraceConfig(name="x", path=str(tmp_path / "c.jsonl"), on_error="skip"), 0)


@pytest.mark.parametrize("extra, msg", [
    (["trace.time_scale=inf"], "trace.time_scale=inf; expected a finite number"),
    (["trace.start_s=nan"], "trace.start_s=nan; expected a finite number"),
    (["trace.time_scale=1e300"], "field 'time_scale': arrival past the simulated clock's range"),
    (["cache.num_gpu_blocks=1000000000000"], "cache.num_gpu_blocks=1000000000000: the block pool's "
                                             "bookkeeping alone needs"),
    (["gpu.memory_gib=1e300"], "the budget overflows float64 bytes"),
    (["gpu.memory_gib=1e9"], "KV blocks of gpu.memory_gib=1000000000.0: the block pool's bookkeeping"),
    (["tiers=gpu_host", "tiers.host_gib=1e18"], "tiers.host_gib=1e+18: 4.55e+20 pages of"),
    # (the clock ran on to 9.6e14 s: arrivals were bounded, step times were not)
    (["cost.step_overhead_s=1e12"], "the simulated clock passed 2**32 s (~136 years) at t=1e+12 s"),
    # (second newcomer pass: 1e300 GiB overflowed to inf bytes, a NaN page count and a
    # traceback; a 1e300 s disk latency ran to t = 2.4e303 s after the last request)
    (["tiers=gpu_host", "tiers.host_gib=1e300"], "tiers.host_gib=1e+300: inf pages of"),
    (["tiers=gpu_host_disk", "tiers.disk_gib=1e300"], "tiers.disk_gib=1e+300: inf pages of"),
    (["tiers=gpu_host_disk", "tiers.host_gib=0.05", "tiers.write_policy=write_through",
      "tiers.disk_latency_s=1e300"],
     "the simulated clock passed 2**32 s (~136 years) at t="),
])
def test_values_too_large_for_the_machine_are_config_errors(tmp_path, extra, msg):
    """Break-it pass: an infinite time_scale ran and then crashed writing summary.json (leaving
    tables beside the INCOMPLETE marker); 10**12 GPU blocks or 1e300 GiB of GPU memory ended in
    a MemoryError or NaN traceback, 1e18 GiB of host tier an OverflowError once offloads began.
    Each is now exit 2 with one line naming the value."""
    r = _kvsim(tmp_path / "r", "trace.max_requests=20", *extra)
    assert r.returncode == 2, r.stderr[-1500:]
    assert msg in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert not (tmp_path / "r" / "summary.json").exists()


def test_timestamps_past_the_clock_range_name_the_line(tmp_path):
    """Break-it pass: a Mooncake row with timestamp 1e308 (ms) loaded; the float clock lost its
    digits (TTFTs of 0.0). A timestamp past 2**32 s is an error naming its line."""
    rows = [{"timestamp": t, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}
            for t in (0, 10, 1e308)]
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(TraceError, match=r"t\.jsonl line 3, field 'timestamp': found 1e\+308 ms"):
        load_workload(TraceConfig(name="x", path=str(p)), 0)


def test_azure_rows_past_the_clock_range_name_their_line(tmp_path):
    """Break-it pass: an Azure row in year 9999 among 2023 rows was rejected by the loader's
    range check as "row 3 of the parsed trace"; the Azure loader names the file line, also when
    the rows were sorted by TIMESTAMP first."""
    az = tmp_path / "az.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,5\n"
                  "9999-11-16 18:17:04.0,10,5\n2023-11-16 18:17:04.0,10,5\n")
    with pytest.raises(TraceError, match=r"az\.csv line 3, field 'TIMESTAMP': arrival past the "
                                         r"simulated clock's range, found 2\.51698e\+11 s after the "
                                         r"earliest row \(line 2\)"):
        load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,5\n"
                  "2023-11-16 18:17:04.0,10,5\n1850-11-16 18:17:04.0,10,5\n")
    with pytest.raises(TraceError, match=r"az\.csv line 2, field 'TIMESTAMP'.*after the earliest row \(line 4\)"):
        load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)


def test_bom_strict_azure_integers_and_null(tmp_path):
    """Break-it pass: a UTF-8 byte-order mark (spreadsheet export) made the Azure header's first
    column '\\ufeffTIMESTAMP'; Azure token counts took '1_000' and Arabic-Indic digits (Python's
    int()); a JSON null was reported as 'NoneType'. A leading BOM is skipped; counts must be
    ASCII digits; null is named as null."""
    az = tmp_path / "az.csv"
    az.write_bytes(b"\xef\xbb\xbfTIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n")
    assert len(load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)) == 1
    for bad in ("1_000", "\u0665\u0660\u0660"):
        az.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,{bad},44\n")
        with pytest.raises(TraceError, match=r"line 2, field 'ContextTokens': found .*expected an integer"):
            load_workload(TraceConfig(name="x", format="azure", path=str(az)), 0)
    p = tmp_path / "m.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + json.dumps({"timestamp": 0, "input_length": 600, "output_length": 4,
                                                 "hash_ids": [1, 2]}).encode() + b"\n")
    assert len(load_workload(TraceConfig(name="x", path=str(p)), 0)) == 1
    p.write_text(json.dumps({"timestamp": 0, "input_length": None, "output_length": 4, "hash_ids": [1]}) + "\n")
    with pytest.raises(TraceError, match=r"field 'input_length': found null, expected an integer"):
        load_workload(TraceConfig(name="x", path=str(p)), 0)


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
    """Break-it pass: NaN or infinite policy and importance options passed the range checks
    (a NaN compares False with every bound) and changed results (sigma=nan: 2,623 blocks freed
    against 468); a position index of 2**62 bytes overflowed into a negative delay mid-run."""
    with pytest.raises(ConfigError, match=re.escape(msg)):
        validate_config(compose_config(["trace=synthetic_reasoning", *overrides]))


def test_recorded_importance_gaps_are_config_errors(tmp_path):
    """Break-it pass: a recorded importance file holding request 0 only crashed mid-run with a
    KeyError traceback at request 1's first round; one with NaN scores loaded and changed the
    blocks freed. Now: NaN scores are an error naming the row; requests longer than the budget
    missing from the file are an error before the run; a round that needs a position the file
    lacks stops the run with a one-line ConfigError (no complete-looking result)."""
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
    """Break-it pass: a 16,777,300-token request with block_size 1 passed the config and crashed
    mid-run (ValueError from the block keys, at most 2**24 blocks a request); a NaN activation
    reserve was reported as "zero KV blocks left ... nan GiB" instead of naming the field."""
    with pytest.raises(ConfigError, match=re.escape(msg)):
        validate_config(compose_config(overrides))


def test_summary_and_progress_off_a_terminal(tmp_path):
    """Newcomer pass: with stdout piped (a sweep, `| cat`, a CI log) rich fitted the summary to
    80 columns and cut its labels ("... GPU / host /"); tqdm drew its bar into the piped stderr,
    where a sweep's bars ran together. Off a terminal the table is 110 wide with whole labels
    and, with sim.progress at its default (null), no bar is drawn; sim.progress=true forces it."""
    def run(out, *ov):
        return subprocess.run([*KVSIM, f"output.dir={out}", *ov], capture_output=True, text=True,
                              cwd=REPO, timeout=120)

    r = run(tmp_path / "a", "trace.max_requests=300", "tiers=gpu_host_disk", "codec=nvfp4")
    assert r.returncode == 0, r.stderr[-2000:]
    row = [ln for ln in r.stdout.splitlines() if "re-admissions after preemption" in ln]
    assert len(row) == 1 and "their hit tokens GPU / host / disk │" in row[0], r.stdout
    assert "\r" not in r.stderr and "req/s" not in r.stderr, r.stderr[-500:]
    r = run(tmp_path / "b", "trace.max_requests=30", "sim.progress=true", "output.print_summary=false")
    assert "30/30" in r.stderr, r.stderr[-500:]


def test_group_option_from_another_config_folder_is_left_to_hydra(tmp_path):
    """An option that only a --config-dir folder holds is not refused by kvsim's check (which
    reads the command's options as well as its overrides), nor is that folder's path, with '='
    in it, taken for an override."""
    import shutil

    d = tmp_path / "cfg=1" / "trace"
    d.mkdir(parents=True)
    shutil.copy(REPO / "experiments" / "conf" / "trace" / "mooncake_conversation_10min.yaml",
                d / "mine.yaml")
    r = subprocess.run([*KVSIM, "--config-dir", str(tmp_path / "cfg=1"), "trace=mine", "--cfg",
                        "job"], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 0, r.stderr[-1500:]
    assert "mooncake_conversation_10min" in r.stdout


def test_unknown_group_option_is_one_line_with_a_hint():
    """Newcomer pass: `kvsim trace=mooncake_conversaton` printed Hydra's option list, search path
    and HYDRA_FULL_ERROR hint, exit 1; a typo'd key already got one line with a hint."""
    from sim.cli import unknown_group_option

    assert unknown_group_option(["model=qwen3-8b"]) == (
        "model=qwen3-8b: no option 'qwen3-8b' in config group 'model'; did you mean "
        "model=qwen3_8b? (options: codellama_34b, deepseek_r1, deepseek_v3, gpt_oss_120b, "
        "llama2_7b, llama3_1_70b, llama3_1_8b, llama3_3_70b, qwen3_235b_a22b, qwen3_32b, "
        "qwen3_8b)")
    assert "no option 'mooncake_conversaton'" in unknown_group_option(
        ["trace=azure_conv,mooncake_conversaton"])
    assert unknown_group_option(["trace=azure_conv,weka_agentic", "+tiers=gpu_host", "seed=3",
                                 "cache.block_size=32", "hydra/launcher=local"]) is None
    assert unknown_group_option(["trace=mine", "hydra.searchpath=[file://my_conf]"]) is None
    r = subprocess.run([*KVSIM, "trace=mooncake_conversaton"], capture_output=True, text=True,
                       cwd=REPO, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("kvsim: error: trace=mooncake_conversaton: no "
                                                     "option"), r.stderr


def test_group_option_check_leaves_nested_option_paths_to_hydra():
    """(Review) An option path with a folder (group=sub/option) is Hydra's to resolve."""
    from sim.cli import unknown_group_option

    assert unknown_group_option(["trace=custom/mine"]) is None


@pytest.mark.parametrize("field,value,expected", [
    ("num_sessions", 0, "found 0, expected >= 1"),
    ("turns_min", 0, "found 0, expected 1 <= turns_min <= turns_max"),
    ("arrival_rate_per_s", 0.0, "found 0.0, expected > 0"),
])
def test_synthetic_parameter_error_names_the_config_key(field, value, expected):
    """Break-it pass: a synthetic trace's bad parameter is named by the key the user typed
    (``trace.num_sessions``), as the other config errors are, not by the bare field name."""
    from traces.synthetic import synthetic_params
    cfg = TraceConfig(format="synthetic_agentic", **{field: value})
    with pytest.raises(TraceError, match=re.escape(f"field 'trace.{field}': {expected}")):
        synthetic_params(cfg)


def test_a_folder_another_live_run_holds_is_refused_untouched(tmp_path):
    """A run holds its folder (the lock of sim.run.RUN_LOCK) while it writes there; a second
    run into it is refused without touching it (exit 2), naming the holder."""
    import socket

    from sim.locks import hold
    from sim.run import RUN_LOCK

    out = tmp_path / "r"
    out.mkdir()
    (out / "summary.json").write_text("{}")  # (stands for the running run's results)
    held = hold(out / RUN_LOCK)  # (this process stands for the running run)
    r = _kvsim(out, "trace.max_requests=5", "output.print_summary=false")
    names = sorted(p.name for p in out.iterdir())
    held.release()
    assert r.returncode == 2, r.stderr[-1500:]
    assert (f"kvsim: error: output.dir={out}: another kvsim run (process {os.getpid()} on "
            f"{socket.gethostname()}) is writing its results there") in r.stderr
    # (Hydra's log of the refused run is appended to the folder's cli.log, nothing else)
    assert names == sorted([RUN_LOCK, "cli.log", "summary.json"])
    assert (out / "summary.json").read_text() == "{}"


def test_a_killed_runs_lock_is_taken_over_and_released(tmp_path):
    """A lock left by a process of this host that no longer exists (a run killed with SIGKILL)
    does not block the folder; a finished run leaves no lock behind."""
    import socket

    from sim.run import RUN_LOCK

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "r"
    out.mkdir()
    (out / RUN_LOCK).write_text(f"{socket.gethostname()} {dead.pid}")
    r = _kvsim(out, "trace.max_requests=5", "output.print_summary=false")
    assert r.returncode == 0, r.stderr[-1500:]
    assert (out / "summary.json").exists() and not (out / RUN_LOCK).exists()


def test_an_unforeseen_error_marks_the_folder_failed(tmp_path):
    """Newcomer pass: an exception other than a config or trace error (there, a NaN page count)
    left a folder with cli.log only and no error record. Any failure now leaves the INCOMPLETE
    marker naming it (kvsim-collect lists the run as failed), shows the traceback and exits 1."""
    from sim.run import MARKER, RUN_LOCK

    out = tmp_path / "r"
    code = ("import sys; import sim.engine as E\n"
            "def boom(self):\n    raise RuntimeError('boom\\nsecond line')\n"
            "E.Simulator.run = boom\n"
            "from sim.cli import main\n"
            f"sys.argv = ['kvsim', 'output.dir={out}', 'sim.progress=false', 'trace.max_requests=5']\n"
            "main()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env=dict(os.environ, HYDRA_FULL_ERROR="1"), timeout=120)
    assert r.returncode == 1, r.stderr[-1500:]
    assert "kvsim: error: internal error: RuntimeError: boom second line" in r.stderr
    assert "Traceback" in r.stderr
    marker = (out / MARKER).read_text()
    assert "internal error: RuntimeError: boom second line" in marker.splitlines()[0]
    assert not (out / "summary.json").exists() and not (out / RUN_LOCK).exists()


def test_weka_blank_line_and_truncated_xz_are_named_plainly(tmp_path):
    """Second newcomer pass: a Weka file's blank line between sessions was reported with the
    JSON parser's words, and an .xz file cut before its first line ended "after line 0"."""
    import lzma

    s = {"id": "a", "requests": [{"t": 0.0, "type": "n", "in": 64, "out": 4, "hash_ids": [1]}]}
    s2 = dict(s, id="b")
    p = tmp_path / "w.jsonl"
    p.write_text(json.dumps(s) + "\n\n" + json.dumps(s2) + "\n")
    with pytest.raises(TraceError, match=r"w\.jsonl line 2: invalid JSON, found a blank line"):
        load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)
    xz = tmp_path / "cut.jsonl.xz"
    xz.write_bytes(lzma.compress(((json.dumps(s) + "\n") * 200).encode())[:40])
    with pytest.raises(TraceError, match=r"cut\.jsonl\.xz before its first line: unreadable xz stream"):
        load_workload(TraceConfig(name="x", path=str(xz)), 0)
    # a .xz or .gz name on other content (break-it pass: "line 1: invalid JSON")
    xz.write_text(json.dumps(s) + "\n")
    with pytest.raises(TraceError, match=r"cut\.jsonl\.xz: not an xz stream, found first bytes "
                                         r".* \(uncompressed data\?\), expected xz-compressed"):
        load_workload(TraceConfig(name="x", format="weka", path=str(xz)), 0)
    gz = tmp_path / "w.jsonl.gz"
    gz.write_bytes(lzma.compress((json.dumps(s) + "\n").encode()))
    with pytest.raises(TraceError, match=r"w\.jsonl\.gz: not a gzip stream, .*\(an xz stream\)"):
        load_workload(TraceConfig(name="x", format="weka", path=str(gz)), 0)


def test_weka_session_fields_and_azure_dates_are_named(tmp_path):
    """Break-it pass, low severity: a Weka session id that is a list gave "malformed session,
    found TypeError: unhashable type"; system_tokens false or "" was read as 0; an Azure
    TIMESTAMP of the right form naming no date (2023-02-30) was told to have that form."""
    req = [{"t": 0.0, "type": "n", "in": 64, "out": 4, "hash_ids": [1]}]
    p = tmp_path / "w.jsonl"
    for bad, field, found in (({"id": [1]}, "id", "[1]"), ({"id": None}, "id", "null"),
                              ({"id": "a", "system_tokens": False}, "system_tokens/tool_tokens",
                               "False/0"),
                              ({"id": "a", "tool_tokens": ""}, "system_tokens/tool_tokens", "0/''")):
        p.write_text(json.dumps(dict(bad, requests=req)) + "\n")
        with pytest.raises(TraceError, match=re.escape(f"w.jsonl line 1, field '{field}': found {found}")):
            load_workload(TraceConfig(name="x", format="weka", path=str(p)), 0)
    a = tmp_path / "a.csv"
    for ts in ("2023-02-30 00:00:00", "2023-11-16 18:17:60.5"):
        a.write_text(f"TIMESTAMP,ContextTokens,GeneratedTokens\n{ts},  100 ,5\n")
        with pytest.raises(TraceError, match=r"a\.csv line 2, field 'TIMESTAMP': found .*expected "
                                             r"a real date and time"):
            load_workload(TraceConfig(name="x", format="azure", path=str(a)), 0)
    a.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-02-28 00:00:00,  100 ,5\n")
    assert load_workload(TraceConfig(name="x", format="azure", path=str(a)), 0).input_tokens[0] == 100


def test_interpolation_sweep_dir_and_range_errors(tmp_path):
    """Low-severity findings of the break-it passes: an unresolvable interpolation in an
    override (``cache.block_size=${nope}``) ended in OmegaConf's traceback (exit 1), a sweep
    folder that cannot be created in Hydra's sweeper's traceback, and a wrong-type
    ``range(...)`` sweep in Hydra's merge error (exit 1). Each is now one kvsim error line."""
    from sim.cli import unknown_override_key, unresolvable_interpolation

    assert unknown_override_key(["cache.block_size=range(1.5,3)"]) == \
        "cache.block_size=range(1.5,3): the sweep's value 1.5: expected an integer"
    assert "value 1.0: expected an integer" in unknown_override_key(["seed=range(1,9,0.5)"])
    assert unknown_override_key(["cache.block_size=range(1,3)", "seed=range(4)",
                                 "tiers.host_gib=range(0.5,2,0.5)",
                                 "sim.fast_forward=range(0,2)"]) is None  # (values 0, 1)
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"a": {"b": "${nope}", "c": "${a.d}", "d": 3}})
    assert unresolvable_interpolation(cfg, ["++a.b=$\\{nope\\}"]).startswith(
        "++a.b=${nope}: cannot resolve the interpolation (Interpolation key 'nope' not found)")
    assert unresolvable_interpolation(OmegaConf.create({"a": {"c": "${a.d}", "d": 3}}), []) is None
    env = dict(os.environ, PYTHONPATH=str(REPO))
    run = tmp_path / "run"
    r = subprocess.run([*KVSIM, "cache.block_size=${nope}", f"hydra.run.dir={run}"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env)
    assert r.returncode == 2, r.stderr[-1500:]
    assert r.stderr.strip() == (
        "kvsim: error: cache.block_size=${nope}: cannot resolve the interpolation (Interpolation "
        "key 'nope' not found); expected a value, or an interpolation of an existing key (kvsim "
        "--cfg job lists them) or environment variable")
    assert not run.exists()  # (checked before Hydra makes the run folder)
    # a sweep's job whose swept value does not resolve is a failed job of the sweep
    r = subprocess.run([*KVSIM, "-m", "trace.max_requests=20", "cache.block_size=16,${nope}",
                        f"hydra.sweep.dir={tmp_path / 'sv'}"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=180, env=env)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert "kvsim: sweep job 1 failed: cache.block_size=${nope}: cannot resolve" in r.stderr
    assert (tmp_path / "sv" / "1" / MARKER).read_text().startswith(
        "this run failed: cache.block_size=${nope}")
    assert (tmp_path / "sv" / "0" / "summary.json").exists()
    import shutil

    shutil.rmtree(tmp_path / "sv")
    (tmp_path / "afile").write_text("x")
    r = subprocess.run([*KVSIM, "-m", "seed=1,2", f"hydra.sweep.dir={tmp_path / 'afile' / 'sw'}"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env)
    assert r.returncode == 2, r.stderr[-1500:]
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith(f"kvsim: error: hydra.sweep.dir={tmp_path / 'afile' / 'sw'}: cannot "
                           f"create the sweep folder ({tmp_path / 'afile'} is a file, not a folder)")


def test_interrupted_write_leaves_no_tmp_file(tmp_path, monkeypatch):
    """Break-it finding: SIGTERM (or Ctrl-C, or an error) during a table's write left
    ``requests.parquet.tmp`` beside the INCOMPLETE marker; the half-written file is removed."""
    from sim import run as run_mod

    def stop(self, path, **kw):
        Path(path).write_bytes(b"PAR1 half")
        raise KeyboardInterrupt

    monkeypatch.setattr(pd.DataFrame, "to_parquet", stop)
    with pytest.raises(KeyboardInterrupt):
        run_mod._write_parquet(pd.DataFrame({"a": [1]}), tmp_path / "t.parquet")

    def bad(o):
        raise TypeError("not JSON serialisable")

    monkeypatch.setattr(run_mod, "_json_default", bad)
    with pytest.raises(TypeError):
        run_mod._write_json({"x": object()}, tmp_path / "s.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_folders_hydra_makes_and_sweep_forms(tmp_path):
    """Third break-it pass: Hydra resolves and creates its run and sweep folders before kvsim's
    job runs, so an unresolvable interpolation in ``output.dir`` / ``hydra.run.dir`` /
    ``hydra.sweep.dir`` or a run folder that cannot be created ended in a traceback (exit 1); a
    sweep job's ``output.dir`` under a file too. ``range(1,3,0)`` and ``range(1,3),5`` ended in
    tracebacks, an empty ``range(5,1)`` ran 0 jobs with exit 0, ``seed=1,2`` without ``-m`` got
    Hydra's "Ambiguous value" (exit 1), and the duplicate-key hint suggested ``range(1,3),5``."""
    from sim.cli import duplicate_override_key, unparsable_override

    assert "range() arg 3 must not be zero" in unparsable_override(["seed=range(1,3,0)"])
    for a in ("seed=range(5,1)", "seed=range(0,0)", "seed=range(1,2,-1)"):
        assert "the range has no values" in unparsable_override([a]), a
    assert "comma list cannot hold range()" in unparsable_override(["seed=range(1,3),5"])
    assert "runs with kvsim -m" in unparsable_override(["seed=1,2"], sweep=False)
    assert "runs with kvsim -m" in unparsable_override(["seed=range(1,3)"], sweep=False)
    assert unparsable_override(["seed=range(5,1,-1)", "seed=choice(1,2)", "gpu=glob(h*)",
                                "seed=1,2"], sweep=True) is None
    assert unparsable_override(["seed=3", "trace.path='a,b'"], sweep=False) is None
    err = duplicate_override_key(["seed=range(1,3)", "seed=5"])
    assert err == ("override key 'seed' given twice (seed=range(1,3), seed=5); expected one "
                   "value per key")
    from experiments.plots import _out_problem

    (tmp_path / "afile").write_text("x")
    assert "is a file, not a folder" in _out_problem(tmp_path / "afile" / "x.png")
    assert "is a folder" in _out_problem(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def kvsim(*args):
        r = subprocess.run([*KVSIM, *args], capture_output=True, text=True, cwd=tmp_path,
                           timeout=180, env=env)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, (args, r.stderr[-2000:])
        return r.stderr

    env.pop("KVSIM_NOT_SET", None)
    err = kvsim("output.dir=${oc.env:KVSIM_NOT_SET}")
    assert err.strip().splitlines() == [
        "kvsim: error: output.dir=${oc.env:KVSIM_NOT_SET}: cannot resolve the interpolation "
        "(KeyError raised while resolving interpolation: \"Environment variable 'KVSIM_NOT_SET' "
        "not found\"); expected a value, or an interpolation of an existing key (kvsim --cfg job "
        "lists them) or environment variable"]
    assert "kvsim: error: hydra.run.dir=${nope}: cannot resolve" in kvsim("hydra.run.dir=${nope}")
    sub = tmp_path / "afile" / "sub"
    assert kvsim(f"hydra.run.dir={sub}").strip() == (
        f"kvsim: error: hydra.run.dir={sub}: cannot create the run folder ({tmp_path / 'afile'} "
        f"is a file, not a folder); expected a folder kvsim can create and write")
    assert "hydra.sweep.dir=${nope}: cannot resolve" in kvsim("-m", "seed=1,2", "hydra.sweep.dir=${nope}")
    err = kvsim("-m", "trace.max_requests=20", f"output.dir={sub}", "seed=1,2",
                f"hydra.sweep.dir={tmp_path / 'sw'}")
    assert f"kvsim: sweep job 1 failed: output.dir={sub}: {tmp_path / 'afile'} is a file" in err
    assert "2 sweep job(s) failed" in err
    assert kvsim("-m", "seed=range(5,1)", f"hydra.sweep.dir={tmp_path / 'sw2'}").count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "sw"]


def test_fourth_break_it_pass_cli(tmp_path):
    """Fourth break-it pass: ``hydra.mode=MULTIRUN`` (Hydra's other spelling of ``-m``) was
    refused as a sweep without ``-m`` (a regression of the previous pass); an unresolvable
    interpolation in any other Hydra key (``hydra.job.name``) or a ``hydra.output_subdir``
    that cannot be made, ``interval()`` under the basic sweeper and ``-m --cfg job`` ended in
    tracebacks; a ``glob()`` matching nothing ran 0 jobs with exit 0; with
    ``hydra.job.chdir=true`` the jobs were not stamped with the sweep's id (0 jobs reported);
    an ``output.dir`` leading back to itself through ``hydra:job.override_dirname`` was told to
    use an existing key; ``kvsim-plot --out`` in /proc ended in a traceback."""
    from experiments.plots import PlotError, _out_problem, save
    from sim.cli import unparsable_override

    assert "interval() is sampled by a sampling sweeper" in unparsable_override(["seed=interval(1,2)"])
    assert unparsable_override(["seed=interval(1,2)", "hydra/sweeper=optuna"]) is None
    assert "step not 0" in unparsable_override(["seed=range(0.5,2.0,0.0)"])
    assert unparsable_override(["seed=1,2"], sweep=False, single=False) is None  # (--cfg job)
    assert _out_problem("") == "an empty path; expected an image file's path"
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    (tmp_path / "afile").write_text("x")
    with pytest.raises(PlotError, match="cannot save figure to '/proc/kvsim_no/x.png': "):
        save(plt.figure(), "/proc/kvsim_no/x.png")  # (mkdir fails: /proc takes no folders)
    env = dict(os.environ, PYTHONPATH=str(REPO))

    def kvsim(*args, rc=2):
        r = subprocess.run([*KVSIM, *args, "trace.max_requests=20"], capture_output=True,
                           text=True, cwd=tmp_path, timeout=180, env=env)
        assert r.returncode == rc, (args, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, (args, r.stderr[-2000:])
        return r.stderr

    err = kvsim("hydra.mode=MULTIRUN", "seed=1,2", "hydra.sweep.dir=mr", rc=0)
    assert "kvsim: sweep done: 2 job(s)" in err
    err = kvsim("-m", "seed=1,2", "hydra.job.chdir=true", "hydra.sweep.dir=cd", rc=0)
    assert "kvsim: sweep done: 2 job(s)" in err
    assert kvsim("hydra.job.name=${nope}").strip().startswith(
        "kvsim: error: hydra.job.name=${nope}: cannot resolve the interpolation")
    err = kvsim(f"output.dir={tmp_path / 'o'}/${{hydra:job.override_dirname}}")
    assert "exclude_keys=[output.dir] leaves it out" in err
    assert "cannot create the folder of Hydra's record" in kvsim("hydra.output_subdir=/proc/x")
    assert "-m runs a sweep and --cfg prints" in kvsim("-m", "--cfg", "job", "seed=1,2")
    err = kvsim("-m", "gpu=glob(zzz*)", "hydra.sweep.dir=g")
    assert "ran no job: a swept key has no values" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "cd", "g", "mr"]


def test_sweep_checks_make_no_folders_and_count_jobs_elsewhere(tmp_path):
    """Regression check of the fourth pass: the sweep-level check resolved ``hydra.run.dir``,
    whose resolver probes (makes) the pre-job ``output.dir`` (an empty ``results/None`` beside
    the jobs' ``results/0`` and ``results/1``); a sweep whose ``hydra.sweep.subdir`` puts the
    jobs outside the sweep folder was reported as having run no job (exit 2)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run([*KVSIM, "-m", "trace.max_requests=20", "output.dir=results/${hydra:job.num}",
                        "seed=1,2", "hydra.sweep.dir=sw"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["0", "1"]
    out = tmp_path / "elsewhere"
    r = subprocess.run([*KVSIM, "-m", "trace.max_requests=20", "seed=1,2", "hydra.sweep.dir=sw2",
                        f"hydra.sweep.subdir={out}/${{hydra.job.num}}"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=180, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "kvsim: sweep done into" in r.stderr and "ran no job" not in r.stderr
    assert all((out / j / "summary.json").exists() for j in ("0", "1"))
