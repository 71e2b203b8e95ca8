"""What ``kvsim`` prints: one clear line and exit 2 for a config or trace error (an existing
folder then holds the INCOMPLETE marker only; one the run made before its simulation began is
removed), notes for overrides that change nothing and for policies
whose rounds never started, warnings for skipped rows, loader warnings and rejected requests,
and the summary table's units, width and title."""

from __future__ import annotations

import json
import os
import subprocess

import pandas as pd
import pytest

from conftest import BAD, KVSIM, REPO, SINGLE_ENGINE, run_kvsim
from sim.run import MARKER


@pytest.mark.parametrize("overrides,pattern", [
    (["trace.path={bad}"], r"kvsim: error: .*mooncake_many_bad\.jsonl line 2, field 'hash_ids'"),
    (["cache.block_size=24"], r"kvsim: error: cache\.block_size=24; expected a power of two"),
    (["trace.name=nope", "trace.format=mooncake"], r"kvsim: error: .*field 'name': unknown trace name"),
    (["trace.max_requests=50", "sim.max_sim_time_s=1"],
     r"kvsim: error: sim\.max_sim_time_s=1\.0: the simulated clock passed it at t=[0-9.]+ s with \d+ of 50 "
     r"requests done"),
    # a request repeating a prefix id would give two of its blocks one key: the Mooncake
    # loader's chain check names the line
    (["trace.path={repeat}"], r"kvsim: error: .*mooncake_repeated_id\.jsonl line 2, field 'hash_ids': ids not "
                              r"prefix-chained, found id 0 follows id 1 \(position 2\); at line 1 it starts"),
], ids=["bad-trace", "bad-block-size", "unknown-trace", "sim-time-limit", "repeated-prefix-id"])
def test_cli_exits_2_with_one_clear_line(tmp_path, overrides, pattern):
    """A config or trace error is one line, exit 2; an output.dir that existed before the run
    then holds the INCOMPLETE marker with the error beside Hydra's record, and no results."""
    o = [x.format(bad=BAD / "mooncake_many_bad.jsonl", repeat=BAD / "mooncake_repeated_id.jsonl")
         for x in overrides]
    (tmp_path / "r").mkdir()
    r = run_kvsim(tmp_path / "r", *o)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    import re
    assert re.search(pattern, r.stderr), r.stderr
    assert "it holds an INCOMPLETE marker" in r.stderr
    # no results: the marker beside Hydra's own record of the job (.hydra/, the job's log)
    names = {p.name for p in (tmp_path / "r").iterdir()} - {".hydra", "cli.log"}
    assert sorted(names) == [MARKER]


def test_a_config_error_without_output_dir_leaves_no_run_folder(tmp_path):
    """A single run into Hydra's own run folder (no output.dir) whose config fails its checks
    is one line, exit 2, and leaves no outputs/ folder where kvsim was started."""
    r = subprocess.run([*KVSIM, "cache.block_size=24", "sim.progress=false"], capture_output=True,
                       text=True, cwd=tmp_path, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr == ("kvsim: error: cache.block_size=24; expected a power of two between 1 and "
                        "cache.max_block_size=256\n")
    assert list(tmp_path.iterdir()) == []


def test_an_error_before_the_simulation_leaves_no_folder_the_run_made(tmp_path):
    """A single run stopped by a trace or config error found after Hydra made its run folder
    (here the trace's bad row) is one line, exit 2, and leaves nothing behind: no
    outputs/<date>/<time>/ folder (nor outputs/) where kvsim was started, no output.dir (nor the
    parents made for it). An error while simulating (the simulated-time limit) leaves the new
    output.dir marked INCOMPLETE with it."""
    env = dict(os.environ, PYTHONPATH=str(REPO), HYDRA_FULL_ERROR="0")
    bad = f"trace.path={BAD / 'mooncake_many_bad.jsonl'}"

    def kvsim(*ov):
        return subprocess.run([*KVSIM, "sim.progress=false", "output.print_summary=false", *ov],
                              capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env)

    r = kvsim(bad)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.startswith("kvsim: error: ") and "mooncake_many_bad.jsonl line 2" in r.stderr
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert list(tmp_path.iterdir()) == []
    out = tmp_path / "new" / "deeper" / "r"
    r = kvsim(bad, f"output.dir={out}")
    assert r.returncode == 2, r.stderr[-2000:]
    assert len(r.stderr.splitlines()) == 1, r.stderr
    assert list(tmp_path.iterdir()) == []
    r = kvsim(f"output.dir={out}", "trace.max_requests=50", "sim.max_sim_time_s=1")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "it holds an INCOMPLETE marker" in r.stderr
    assert MARKER in {p.name for p in out.iterdir()}


def test_help_names_the_run_folders_and_the_companion_commands():
    """``kvsim --help`` says where a run and a sweep write (the time folder to the microsecond),
    what the policy_defaults group is, and names kvsim-collect and kvsim-plot."""
    r = subprocess.run([*KVSIM, "--help"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    for text in ("outputs/YYYY-MM-DD/HH-MM-SS-ffffff/", "multirun/YYYY-MM-DD/HH-MM-SS-ffffff/",
                 "policy_defaults is not chosen on the command line", "kvsim-collect DIR",
                 "kvsim-plot FIGURE DIR"):
        assert text in r.stdout, text


def test_version_names_kvsim_and_hydra():
    """``kvsim --version`` prints kvsim's version (package metadata) and Hydra's on one line."""
    from importlib.metadata import version

    import hydra

    r = subprocess.run([*KVSIM, "--version"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout == f"kvsim {version('kvsim')} (Hydra {hydra.__version__})\n"


def test_sim_time_limit_stops_at_the_same_step_with_fast_forward(tmp_path):
    """The limit error names the clock at the first step that passed it, the same with the decode
    fast-forward as without it (a stretch ends at that step)."""
    import re
    at = []
    for ff in ("true", "false"):
        r = run_kvsim(tmp_path / ff, *SINGLE_ENGINE, "trace.max_requests=50",
                      "sim.max_sim_time_s=30", f"sim.fast_forward={ff}")
        assert r.returncode == 2, r.stderr[-2000:]
        at.append(re.search(r"passed it at t=([0-9.]+) s", r.stderr).group(1))
    assert at[0] == at[1]


def test_a_pool_override_beyond_the_gpus_memory_is_noted(tmp_path):
    """cache.num_gpu_blocks beyond what the GPU has room for is a what-if (vLLM's
    num_gpu_blocks_override): it runs, with a note giving the pool's size and what the GPU has
    left after weights and reserves. A pool within it gets no note."""
    r = run_kvsim(tmp_path / "big", "trace.max_requests=10", "cache.num_gpu_blocks=3000000",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    mem = json.loads((tmp_path / "big" / "summary.json").read_text())["memory_gib"]
    left = mem["budget"] - mem["weights"] - mem["activation_reserve"] - mem["sliding_window_reserve"]
    assert mem["kv_pool"] > 50 * left
    assert (f"kvsim: note: cache.num_gpu_blocks=3,000,000 ({mem['kv_pool']:,.1f} GiB of KV) is "
            f"beyond the 50,046 blocks ({left:,.1f} GiB) that H200 has room for") in r.stderr
    # the default plan's pool is 50,046 blocks: one more is noted, that many is not
    for n, noted in ((50047, True), (50046, False), (3000, False)):
        r = run_kvsim(tmp_path / f"b{n}", "trace.max_requests=10", f"cache.num_gpu_blocks={n}",
                   "output.print_summary=false")
        assert r.returncode == 0, r.stderr
        assert ("num_gpu_blocks" in r.stderr) == noted, r.stderr


def test_cli_skip_reports_skipped_rows_in_summary(tmp_path):
    """trace.on_error=skip through a full kvsim run: summary.json's trace_skipped_rows holds the
    count and the first messages (file, line, field)."""
    p = BAD / "mooncake_many_bad.jsonl"
    r = run_kvsim(tmp_path, f"trace.path={p}", "trace.on_error=skip", "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert not (tmp_path / MARKER).exists()
    sk = s["trace_skipped_rows"]
    assert sk["count"] == 5 and len(sk["examples"]) == 5
    assert f"{p} line 2, field 'hash_ids'" in sk["examples"][0]
    assert s["requests_total"] == 2
    assert "kvsim: warning: trace.on_error=skip skipped 5 bad rows (first: " in r.stderr
    # a slice counts the skipped rows of the whole file, and says so
    r = run_kvsim(tmp_path / "one", f"trace.path={p}", "trace.on_error=skip", "trace.max_requests=1",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    assert ("kvsim: warning: trace.on_error=skip skipped 5 bad rows in the whole file (2 "
            "requests; the slice keeps 1) (first: ") in r.stderr


def test_cli_prints_and_records_trace_loader_warnings(tmp_path):
    """A loader warning (sessions cut at max_context_tokens: fewer requests than the trace
    describes) is printed and written to summary.json, never dropped."""
    r = run_kvsim(tmp_path / "r", "trace=synthetic_multiturn", "trace.max_context_tokens=1000",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr[-2000:]
    assert "kvsim: warning: trace synthetic_multiturn: 64 sessions ended early" in r.stderr
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert any("ended early at max_context_tokens=1000" in w for w in s["trace_warnings"])


def test_trace_warnings_of_the_users_file_name_that_file(tmp_path):
    """With trace.path (the user's own file) a loader warning names that file, not the trace
    preset whose name the run keeps (the bundled trace was not read)."""
    own = tmp_path / "own.jsonl"
    own.write_text("".join(json.dumps({"timestamp": i * 1000, "input_length": 100,
                                       "output_length": 0 if i == 1 else 4, "hash_ids": [i]}) + "\n"
                           for i in range(3)))
    r = run_kvsim(tmp_path / "r", f"trace.path={own}", "output.print_summary=false")
    assert r.returncode == 0, r.stderr[-2000:]
    warned = [ln for ln in r.stderr.splitlines() if ln.startswith("kvsim: warning: ")]
    assert warned and all(ln.startswith(f"kvsim: warning: trace file {own}: ") for ln in warned), \
        warned
    assert "output_length 0" in warned[0]
    assert "mooncake_conversation_10min" not in r.stderr


def test_a_policy_option_the_policy_does_not_read_is_an_error(tmp_path):
    """A policy option the run's policy does not read (policy.budget under full, which keeps
    every token; policy.protect_prompt under streaming_llm and the snapkv family, which never
    protect the prompt) is exit 2 with one line naming the option, the policy's options and the
    policies that read it; the note for a run whose rounds never started names the policy's
    real threshold."""
    from policies import POLICIES, policy_config
    from policies.registry import unread_options

    for pol in ("streaming_llm", "snapkv", "pyramidkv", "ada_kv"):
        assert not POLICIES[pol](policy_config(pol)).protects_prompt
        assert unread_options({"name": pol, "protect_prompt": True}) == [("protect_prompt", True)]
    r = run_kvsim(tmp_path / "e", "trace.max_requests=5", "policy=full", "policy.budget=512",
                  "output.print_summary=false")
    assert r.returncode == 2, r.stderr[-2000:]
    assert ("kvsim: error: policy.budget=512: policy full does not read budget (its options: "
            "none); budget is read by policy=ada_kv, h2o, pyramidkv, quest, r_kv, random, "
            "snapkv, tova, triattention\n") in r.stderr
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
    """Options another kind of trace reads, tier options without a tier, a generated trace's
    path and cache options, and a calibration file under another cost model each get a note
    saying they change nothing."""
    from sim.cli.report import inert_override_notes

    notes = inert_override_notes(["trace.num_requests=10", "trace.max_sessions=3",
                                  "trace.max_requests=5", "tiers.write_policy=write_through",
                                  "+tiers.onboard=layerwise", "seed=1"], "mooncake", "gpu_only")
    assert notes == [
        "trace.num_requests is read by bench and servegen traces only; this run's trace is mooncake: it changes nothing",
        "trace.max_sessions is read by claude_code and openai_log and weka traces only; this "
        "run's trace is mooncake: it changes nothing",
        "tiers.write_policy applies to host and disk tiers; with none (tiers.host_gib = "
        "tiers.disk_gib = 0) it changes nothing",
        "tiers.onboard applies to host and disk tiers; with none (tiers.host_gib = "
        "tiers.disk_gib = 0) it changes nothing"]
    assert inert_override_notes(["trace.num_sessions=3", "tiers.onboard=layerwise"],
                                "synthetic_multiturn", "gpu_host") == []
    assert inert_override_notes(["trace.timestamp_spread=keep"], "weka", "gpu_only")[0].startswith(
        "trace.timestamp_spread is read by mooncake traces only")
    # a synthetic trace's path and an analytic run's cost.file
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
    """Policy and compaction options with policy=full, hole-filling options under another
    compaction, compaction.pin_prompt (the engine pins what the policy protects) and codec
    options with codec=identity each get a note saying they change nothing."""
    from sim.cli.report import inert_override_notes

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


def test_inert_cluster_store_and_pd_options_get_a_note():
    """A shared KV store's options without the store (cluster.store.enabled=false) and the P/D
    options without prefill/decode disaggregation (cluster.pd.prefill_replicas=0) each get a
    note naming the option and saying it changes nothing; with the feature on, none."""
    from sim.cli.report import inert_override_notes

    given = ["cluster.store.capacity_gib=64", "cluster.store.enabled=false",
             "cluster.pd.net_gbps=10", "cluster.pd.decode_router=least_loaded",
             "cluster.pd.prefill_replicas=0", "cluster.replicas=4"]
    assert inert_override_notes(given, "mooncake", "gpu_only") == [
        "cluster.store.capacity_gib is read by the KV store the replicas share; this run has "
        "none (cluster.store.enabled=false): it changes nothing",
        "cluster.pd.net_gbps is read with prefill/decode disaggregation; this run has none "
        "(cluster.pd.prefill_replicas=0): it changes nothing",
        "cluster.pd.decode_router is read with prefill/decode disaggregation; this run has none "
        "(cluster.pd.prefill_replicas=0): it changes nothing"]
    assert inert_override_notes(given, "mooncake", "gpu_only", store=True, pd=True) == []


def test_cli_notes_kv_capacity_rejections_under_a_compression_policy(tmp_path):
    """The arrival check counts each whole uncompressed sequence against the pool, also under a
    compression policy; the CLI says so when requests are rejected as kv_capacity."""
    r = run_kvsim(tmp_path / "r", "trace=synthetic_reasoning", "trace.num_sessions=100",
               "cache.num_gpu_blocks=300", "policy=triattention", "policy.budget=128",
               "compaction=forward_pack", "output.print_summary=false", "output.write_steps=false")
    assert r.returncode == 0, r.stderr
    assert ("kvsim: note: 36 request(s) were rejected as kv_capacity: the check counts each whole "
            "uncompressed sequence (input + output) against the pool and does not credit "
            "policy=triattention's evictions") in r.stderr


def test_cli_warns_when_no_request_finished(tmp_path):
    r = run_kvsim(tmp_path / "r", "trace.max_requests=20", "cache.num_gpu_blocks=1",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    assert "kvsim: warning: no request finished: all 20 were rejected (kv_capacity: 20)" in r.stderr


def test_cli_notes_a_policy_that_ran_no_round(tmp_path):
    """A compression policy that ran no round gets a note saying where its first round would
    come; Quest, which frees nothing, gets none."""
    r = run_kvsim(tmp_path / "r", "trace.max_requests=20", "policy=triattention",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    assert ("kvsim: note: policy=triattention ran no compression round: its first round comes "
            "at the first multiple of policy.beta=128 past policy.budget=2048 decode tokens "
            "(2,176 decode tokens)") in r.stderr
    r = run_kvsim(tmp_path / "q", "trace.max_requests=20", "policy=quest", "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    assert "ran no compression round" not in r.stderr
    assert "read every page" not in r.stderr  # (its 2,048-token budget is below some contexts)


def test_cli_notes_a_quest_budget_above_every_context(tmp_path):
    """policy=quest with a budget above every request's context reads every page (it saves
    nothing): summary.json holds the longest context, and a note names the pages read per
    step, the knob and that context."""
    r = run_kvsim(tmp_path / "q", "trace.max_requests=20", "policy=quest", "policy.budget=1000000",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "q" / "summary.json").read_text())
    req = pd.read_parquet(tmp_path / "q" / "requests.parquet")
    assert s["longest_context_tokens"] == int((req.input_tokens + req.output_tokens).max())
    assert (f"kvsim: note: policy=quest read every page: it reads the top 62,500 pages of 16 "
            f"tokens per step (policy.budget=1,000,000 tokens), and no request's context passed "
            f"that (the longest: {s['longest_context_tokens']:,} tokens)") in r.stderr


def test_cli_note_for_a_prompt_policy_that_ran_no_round_names_the_prompt(tmp_path):
    """A prompt-compressing policy (snapkv, pyramidkv) that ran no round gets a note naming the
    prompt length that starts its round (pyramidkv's smallest layer budget), and that long
    outputs do not."""
    r = run_kvsim(tmp_path / "r", "trace.max_requests=20", "policy=snapkv", "policy.budget=200000",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    assert ("kvsim: note: policy=snapkv ran no compression round: it compresses a prompt once, "
            "at prefill end, when the prompt is longer than policy.budget=200,000 tokens, and no "
            "prompt of this trace was") in r.stderr
    assert "long outputs do not start it" in r.stderr
    # pyramidkv's threshold is its smallest layer budget, not policy.budget
    r = run_kvsim(tmp_path / "p", "trace.max_requests=5", "policy=pyramidkv", "policy.budget=150000",
               "output.print_summary=false")
    assert r.returncode == 0, r.stderr
    assert ("when the prompt is longer than its smallest layer budget, policy.budget / "
            "policy.layer_budget_ratio with policy.observation_window as a floor = 7,500 tokens"
            ) in r.stderr


def test_summary_table_gives_each_latency_in_one_unit():
    """The printed summary gives TTFT and E2E in s (to the ms) and TPOT in ms, whatever the
    values, so rows read side by side in one unit; a long title is not wrapped; a compression
    run gets a row of its rounds, evicted tokens and freed blocks."""
    import io

    from rich.console import Console

    from sim.cli.report import format_summary

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
    # trace.path (the user's own file): the file first, the preset only as the trace preset
    own = dict(s, trace="mooncake_conversation_10min", trace_source="/data/own.jsonl",
               overrides=["trace.path=/data/own.jsonl"], model="Qwen3-8B", gpu="H200")
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(format_summary(own))
    assert buf.getvalue().splitlines()[0].strip().startswith(
        "kvsim: own.jsonl (trace preset mooncake_conversation_10min) | Qwen3-8B on H200"), \
        buf.getvalue()
    assert "compression rounds" not in text  # no policy: no row
    s.update(policy="triattention", rounds=53564, tokens_evicted_total=6856192,
             blocks_freed_total=428512)
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(format_summary(s))
    assert "53,564 / 6,856,192 / 428,512" in buf.getvalue()


def test_summary_table_small_rates_and_tensor_parallel_title():
    """A small output throughput keeps its digits (0.455 tok/s) and a tensor-parallel run's title
    names the GPU count."""
    import io

    from rich.console import Console

    from sim.cli.report import format_summary

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


def test_summary_table_of_a_cluster_names_its_replicas_router_and_fullest_replica():
    """A cluster's summary table says in its title how many replicas and which router, and its
    blocks row says the peak is the fullest replica's and the total one replica's pool."""
    import io

    from rich.console import Console

    from sim.cli.report import format_summary

    s = {"requests_finished": 3, "requests_rejected": 0, "requests_total": 3,
         "ttft_s": {}, "tpot_s": {}, "e2e_s": {}, "peak_gpu_blocks_used": 7,
         "gpu_blocks_total": 9, "preemptions": 0, "engine_steps": 5, "sim_duration_s": 1.0,
         "wall": {"wall_s": 0.1}, "trace": "t", "model": "M", "gpu": "H200",
         "cluster": {"replicas": 4, "router": "prefix_aware"}}
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(format_summary(s))
    text = buf.getvalue()
    assert text.splitlines()[0].strip() == "kvsim: t | M on H200 | 4 replicas, prefix_aware router"
    assert "peak GPU blocks used / total (fullest replica / each)" in text and "7 / 9" in text
    del s["cluster"]
    buf = io.StringIO()
    Console(file=buf, width=120, color_system=None).print(format_summary(s))
    assert "replicas" not in buf.getvalue() and "fullest" not in buf.getvalue()


def test_summary_and_progress_off_a_terminal(tmp_path):
    """Off a terminal (a sweep, ``| cat``, a CI log) the summary table is 110 wide with whole
    labels and, with sim.progress at its default (null), no progress bar is drawn;
    sim.progress=true forces it."""
    def run(out, *ov):
        return subprocess.run([*KVSIM, f"output.dir={out}", *ov], capture_output=True, text=True,
                              cwd=REPO, timeout=120)

    r = run(tmp_path / "a", *SINGLE_ENGINE, "trace.max_requests=300", "tiers=gpu_host_disk",
            "codec=nvfp4")
    assert r.returncode == 0, r.stderr[-2000:]
    row = [ln for ln in r.stdout.splitlines() if "re-admissions after preemption" in ln]
    assert len(row) == 1 and "their hit tokens GPU / host / disk │" in row[0], r.stdout
    assert "\r" not in r.stderr and "req/s" not in r.stderr, r.stderr[-500:]
    r = run(tmp_path / "b", "trace.max_requests=30", "sim.progress=true", "output.print_summary=false")
    assert "30/30" in r.stderr, r.stderr[-500:]
