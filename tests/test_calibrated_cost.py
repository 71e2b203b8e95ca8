"""cost.kind=calibrated: terms from gpu_validation/calibrations/h200.json, analytic fallback."""

import json

import numpy as np
import pandas as pd
import pytest

from conftest import SINGLE_ENGINE, make_workload
from gpu_validation.calibration_model import load_calibration
from sim.cost import AnalyticCostModel, StretchShape
from sim.cost_models import build_cost_model
from sim.errors import ConfigError
from sim.run import compose_config, run_simulation

H200 = "gpu_validation/calibrations/h200.json"


def cfg(*o):
    return compose_config([*SINGLE_ENGINE, "sim.progress=false", "cost=calibrated", *o])


def model_of(c):
    return build_cost_model(c.model, c.gpu, c.cache, c.cost)


@pytest.fixture(scope="module")
def cal():
    from sim.cost import CALIBRATION_DIR
    return load_calibration(CALIBRATION_DIR / "h200.json")


def test_missing_file_errors_clearly(tmp_path):
    with pytest.raises(ConfigError, match=r"calibration file not found: .*nope\.json.*available: .*h200\.json"):
        model_of(cfg(f"cost.file={tmp_path}/nope.json"))
    # the GPU card's default: B200 -> b200.json, which does not exist
    with pytest.raises(ConfigError, match=r"b200\.json \(cost\.file is null.*available: .*h200\.json"):
        model_of(cfg("gpu=b200"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"device": {"name": "X"}}')
    with pytest.raises(ConfigError, match=r"bad\.json: missing key 'software'"):
        model_of(cfg(f"cost.file={bad}"))


def test_explicit_file_relative_to_repo_root():
    m = model_of(cfg(f"cost.file={H200}"))
    assert m.path.name == "h200.json" and m.calibration.device["name"] == "NVIDIA H200"


def doc(doc_id, tokens, t=0.0, out=2):
    return dict(arrival_s=t, input_tokens=tokens, output_tokens=out,
                prefix_ids=[doc_id * 10_000 + j for j in range(tokens // 16)])


def test_nvfp4_offload_time_is_the_calibrated_fused_op(tmp_path, cal):
    wl = make_workload([doc(i, 4096, t=float(i)) for i in range(6)], prefix_block_tokens=16)
    c = cfg("tiers=gpu_host_disk", "codec=nvfp4", "tiers.write_policy=write_through",
            "output.write_ops=true", "output.write_steps=false")
    s = run_simulation(c, tmp_path, workload=wl)
    tr = pd.read_parquet(tmp_path / "transfers.parquet")
    d2h = tr[tr.direction == "d2h"]
    assert len(d2h) > 0
    hot = s["kv_bytes_per_block"]
    for pages, dur in zip(d2h.pages, d2h.duration_s):
        assert dur == pytest.approx(cal.op_time("nvfp4_encode_d2h_fused", pages * hot, pages), rel=1e-12)
        # and not the analytic link time (55 GB/s of cold bytes, 14 us)
        assert dur != pytest.approx(14e-6 + pages * s["page_bytes"] / 55e9, rel=1e-3)
    cm = s["cost_model"]
    assert "d2h (nvfp4_encode_d2h_fused)" in cm["calibrated"]
    assert "h2d (nvfp4_h2d_decode_fused)" in cm["calibrated"]
    assert "disk_read_write" in cm["analytic_fallback"]
    ops = [json.loads(line) for line in (tmp_path / "ops.jsonl").read_text().splitlines()]
    od = [o for o in ops if o["op"] == "d2h"]
    assert od and all(o["predicted_s"] == pytest.approx(
        cal.op_time("nvfp4_encode_d2h_fused", o["pages"] * hot, o["pages"]), rel=1e-12) for o in od)


def test_compaction_round_time_is_the_calibrated_mover(tmp_path, cal):
    wl = make_workload([dict(arrival_s=0.0, input_tokens=300, output_tokens=400) for _ in range(3)])
    c = cfg("policy=triattention", "policy.budget=128", "policy.beta=32", "compaction=forward_pack",
            "output.write_ops=true", "output.write_steps=false")
    s = run_simulation(c, tmp_path, workload=wl)
    assert "compaction_move" in s["cost_model"]["calibrated"]
    ops = [json.loads(line) for line in (tmp_path / "ops.jsonl").read_text().splitlines()]
    rounds = [o for o in ops if o["op"] == "compaction_move"]
    assert rounds
    for o in rounds:
        want = cal.op_time("compaction_move", o["bytes_moved"], 1) if o["bytes_moved"] > 0 else 0.0
        assert o["predicted_s"] == pytest.approx(want, rel=1e-12)


def test_trim_ops_keeps_evenly_spaced_ops_per_kind():
    from gpu_validation.trim_ops import trim

    lines = [{"op": "model"}] + [{"op": "d2h", "codec": "nvfp4", "i": i} for i in range(10)] + \
        [{"op": "h2d", "codec": "nvfp4", "i": i} for i in range(3)] + \
        [{"op": "compaction_move", "style": "forward", "i": i} for i in range(7)]
    out = trim(lines, 4)
    assert out[0] == {"op": "model"}
    assert [o["i"] for o in out if o["op"] == "d2h"] == [0, 2, 5, 7]
    assert [o["i"] for o in out if o["op"] == "h2d"] == [0, 1, 2]
    assert [o["i"] for o in out if o["op"] == "compaction_move"] == [0, 1, 3, 5]
    with pytest.raises(ValueError):
        trim(lines, 0)


def test_committed_replay_ops_carry_calibrated_predictions(cal):
    """The ops file replayed in gpu_validation/REPORT.md: every op has the simulator's
    prediction, equal to the calibration's op for its bytes (cost=calibrated)."""
    from pathlib import Path

    p = Path(__file__).resolve().parent.parent / "gpu_validation/ops/mooncake10min_triattention_b128_nvfp4.jsonl"
    assert p.stat().st_size < 2 * 2**20
    ops = [json.loads(line) for line in p.read_text().splitlines()]
    m = ops[0]
    assert m["op"] == "model"
    hot = 2 * m["num_kv_heads"] * m["head_dim"] * 2 * m["num_layers"]  # bytes per token, bf16
    kinds = {"compaction_move": 0, "d2h": 0, "h2d": 0}
    for o in ops[1:]:
        kinds[o["op"]] += 1
        if o["op"] == "compaction_move":
            r = o["requests"][0]
            want = cal.op_time("compaction_move", o["bytes_moved"], 1) if o["bytes_moved"] > 0 else 0.0
            assert o["blocks_after"] == -(-(r["prompt_len"] + len(r["kept"])) // o["block_size"])
        else:
            name = "nvfp4_encode_d2h_fused" if o["op"] == "d2h" else "nvfp4_h2d_decode_fused"
            want = cal.op_time(name, o["pages"] * o["page_tokens"] * hot, o["pages"])
        assert o["predicted_s"] == pytest.approx(want, rel=1e-12)
    assert kinds["compaction_move"] == 200 and kinds["d2h"] == 200 and 0 < kinds["h2d"] <= 200


def test_fast_forward_equals_per_step_with_calibrated_cost():
    from test_engine import random_workload, simulate

    wl = random_workload(0)
    o = ("cost=calibrated", "scheduler.max_num_batched_tokens=256")
    a, *_ = simulate(wl, *o, num_blocks=60, fast_forward=True)
    b, *_ = simulate(wl, *o, num_blocks=60, fast_forward=False)
    for col in ("first_token_s", "finish_s"):
        np.testing.assert_allclose(a[col], b[col], rtol=1e-9, atol=1e-12)


def test_calibration_of_another_gpu_is_rejected():
    """An H200 calibration with gpu=rtx4090 would time the 4090 as an H200: a clear error
    naming both devices, not a silent mismatch."""
    with pytest.raises(ConfigError, match=r"h200\.json was measured on NVIDIA H200, but gpu=RTX-4090"):
        model_of(cfg("gpu=rtx4090", "cost.file=gpu_validation/calibrations/h200.json"))


@pytest.mark.parametrize("model", ["qwen3_8b", "llama3_1_8b", "deepseek_v3"])
def test_compiled_stretch_times_equal_the_numpy_formula_bit_for_bit(model):
    """The compiled loops behind AnalyticCostModel.stretch_times of a pure-decode stretch (no
    sliding-window layers; steps ``first ..`` with a context ``shift``, or from step 0)
    gives the numpy expression's bits: the fast-forward's step ends must not move."""
    c = cfg(f"model={model}")
    m = AnalyticCostModel(c.model, c.gpu, c.cache, c.cost)
    assert not m.win_layers
    rng = np.random.default_rng(3)
    for _ in range(200):
        b = int(rng.integers(1, 300))
        ctx0 = rng.integers(0, 200_000, size=b)
        k, first, shift = int(rng.integers(1, 600)), int(rng.integers(0, 5)), int(rng.integers(-5000, 5000))
        # the numpy expression (AnalyticCostModel before the compiled loop)
        s = np.arange(first, first + k, dtype=np.float64)
        sum_c = float(np.sum(ctx0, dtype=np.float64)) + s * b
        if shift:
            sum_c = sum_c + float(shift)
        pairs = sum_c + b
        flops = pairs * m.attn_flops_per_pair * m.full_layers
        bytes_ = pairs * m.kv_tok
        attn = np.maximum(flops / (m.peak_flops * m.attn_eff), bytes_ / (m.hbm_bw * m.mbu))
        want = m.overhead + m.linear_time(b, b) + attn
        got, _ = m.stretch_times(StretchShape(ctx0, k, first=first, shift=shift))
        assert got.dtype == np.float64 and got.tobytes() == want.tobytes()


@pytest.mark.parametrize("model", ["qwen3_8b", "gpt_oss_120b"])
def test_stretch_times_stop_at_the_step_that_reaches_stop_bit_for_bit(model):
    """AnalyticCostModel.stretch_times of a pure-decode stretch with a ``stop`` (the
    fast-forward's step ends: compiled without sliding-window layers, numpy with them) equals
    its durations without one, the extra time on the first step, their running sum, cut after
    the first end at or after ``stop``."""
    from sim.clock import step_ends

    c = cfg(f"model={model}")
    m = AnalyticCostModel(c.model, c.gpu, c.cache, c.cost)
    assert bool(m.win_layers) == (model == "gpt_oss_120b")
    rng = np.random.default_rng(11)
    cut = full = 0
    for _ in range(200):
        b = int(rng.integers(1, 300))
        ctx0 = rng.integers(0, 200_000, size=b)
        k = int(rng.integers(1, 300))
        start = float(rng.uniform(0, 1e4))
        extra = float(rng.choice([0.0, rng.uniform(0, 0.05)]))
        durs, _ = m.stretch_times(StretchShape(ctx0, k))
        durs[0] += extra
        ends = step_ends(start, durs)
        # stop: past every end, between two ends, or exactly on one
        stop = float(rng.choice([np.inf, rng.uniform(start, ends[-1] * 1.01),
                                 ends[int(rng.integers(0, k))]]))
        j = int(np.searchsorted(ends, stop, side="left"))
        n = k if j >= k else j + 1
        cut += n < k
        full += n == k
        got_d, got_e = m.stretch_times(StretchShape(ctx0, k, extra_first=extra), start, stop)
        assert got_d.tobytes() == durs[:n].tobytes() and got_e.tobytes() == ends[:n].tobytes()
    assert cut and full


def test_step_ends_equal_numpy_cumsum_bit_for_bit():
    """sim.clock.step_ends (compiled) adds the step durations one at a time as np.cumsum does."""
    from sim.clock import step_ends

    rng = np.random.default_rng(5)
    for _ in range(200):
        start = float(rng.uniform(0, 1e5))
        durs = rng.uniform(1e-4, 0.5, size=int(rng.integers(1, 700)))
        want = np.cumsum(np.concatenate(([start], durs)))[1:]
        assert step_ends(start, durs).tobytes() == want.tobytes()


@pytest.mark.parametrize("model", ["qwen3_8b", "llama3_1_70b"])
def test_compiled_attention_time_equals_the_numpy_formula_bit_for_bit(model):
    """AnalyticCostModel.attention_time sums its integer terms in one compiled pass: the same
    bits as the float64 numpy sums (exact below 2**53), for decode batches and prefill chunks."""
    c = cfg(f"model={model}")
    m = AnalyticCostModel(c.model, c.gpu, c.cache, c.cost)
    rng = np.random.default_rng(11)
    for _ in range(300):
        b = int(rng.integers(1, 400))
        n = np.where(rng.random(b) < 0.9, 1, rng.integers(1, 8193, size=b)).astype(np.int64)
        ctx = rng.integers(0, 300_000, size=b).astype(np.int64)
        nf, cf = n.astype(np.float64), ctx.astype(np.float64)
        flops = float((nf * cf + nf * (nf + 1) / 2).sum()) * m.attn_flops_per_pair * m.full_layers
        bytes_ = float(cf.sum()) * m.kv_tok + float(nf.sum()) * m.kv_tok
        want = max(flops / (m.peak_flops * m.attn_eff), bytes_ / (m.hbm_bw * m.mbu))
        assert m.attention_time(n, ctx) == want
        assert m.attention_time(n[::-1], ctx[::-1]) == m.attention_time(n, ctx)  # strided views


def test_committed_replay_ops_are_what_the_simulator_writes_now(tmp_path):
    """gpu_validation/REPORT.md's kvsim and trim_ops commands give the committed ops file byte
    for byte: this runs them, so a change to what the simulator decides on that slice must
    come with a regenerated file (and a GPU replay of it, REPORT.md)."""
    from pathlib import Path

    from gpu_validation.trim_ops import main as trim_main

    committed = Path(__file__).resolve().parent.parent / "gpu_validation/ops/mooncake10min_triattention_b128_nvfp4.jsonl"
    c = compose_config([*SINGLE_ENGINE,
                        "trace=mooncake_conversation_10min", "trace.max_requests=300", "cache=trtllm",
                        "policy=triattention", "policy.budget=128", "policy.beta=32",
                        "compaction=forward_pack", "tiers=gpu_host_disk", "codec=nvfp4",
                        "cost=calibrated", "output.write_ops=true", "output.ops_limit=100000",
                        "output.write_steps=false", "sim.progress=false"])
    run_simulation(c, tmp_path / "run")
    trim_main([str(tmp_path / "run" / "ops.jsonl"), str(tmp_path / "trimmed.jsonl"), "--per-kind", "200"])
    assert (tmp_path / "trimmed.jsonl").read_bytes() == committed.read_bytes()


def test_trim_ops_per_kind_below_one_is_a_usage_error(tmp_path, capsys):
    """``trim_ops --per-kind`` below 1 is a usage error."""
    from gpu_validation.trim_ops import main as trim_main

    src = tmp_path / "ops.jsonl"
    src.write_text('{"op": "model"}\n')
    for bad in ("0", "-3"):
        with pytest.raises(SystemExit) as e:
            trim_main([str(src), str(tmp_path / "t.jsonl"), "--per-kind", bad])
        assert e.value.code == 2
        assert f"--per-kind {bad}: expected >= 1" in capsys.readouterr().err
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize("text, want", [
    ('{"op": "model"}\n{"op": "d2h", "codec": "none"}\n\n{"op": "h2d", oops}\n',
     "line 4: not JSON"),
    ('{"op": "model"}\n[1, 2]\n', 'line 2: expected a JSON object with an "op"'),
    ('{"op": "model"}\n{"pages": 3}\n', 'line 2: expected a JSON object with an "op"'),
    ('{"op": "model"}\n{"op": "frobnicate"}\n', "line 2: expected a JSON object with an \"op\" "
     "name (model, compaction_move, d2h, h2d), got op 'frobnicate'"),
    ('{"op": "d2h", "codec": "zstd"}\n', "line 1: codec 'zstd', expected one of none, nvfp4, fp8"),
    ("", "no operation (0 model line(s), nothing to trim)"),
    ('{"op": "model"}\n', "no operation (1 model line(s), nothing to trim)"),
])
def test_trim_ops_names_the_bad_line_and_refuses_an_empty_file(tmp_path, text, want):
    """A malformed line and an object without "op" are errors naming the line; an empty ops file
    is refused, not trimmed to an empty file."""
    from gpu_validation.trim_ops import main as trim_main

    src = tmp_path / "ops.jsonl"
    src.write_text(text)
    with pytest.raises(SystemExit) as e:
        trim_main([str(src), str(tmp_path / "t.jsonl")])
    assert str(e.value.code).startswith(f"{src}: {want}"), e.value.code
    assert not (tmp_path / "t.jsonl").exists()


def test_trim_ops_names_a_binary_line_and_an_output_it_cannot_write(tmp_path):
    """A non-UTF-8 ops file is an error naming the file and line, and an output that is a
    folder (or under a missing one) is one error line; validate --ops reads its file before it
    looks for torch and a GPU."""
    from gpu_validation import validate as V
    from gpu_validation.trim_ops import main as trim_main

    src = tmp_path / "ops.jsonl"
    src.write_bytes(b'{"op": "model"}\n{"op": "d2h"}\n\xff\xfe\n')
    with pytest.raises(SystemExit) as e:
        trim_main([str(src), str(tmp_path / "t.jsonl")])
    assert str(e.value.code) == (f"{src}: line 3: not UTF-8 text (byte 0xff at column 1); "
                                 f"expected one JSON object per line")
    with pytest.raises(SystemExit) as e:
        V.main(["--ops", str(src)])
    assert str(e.value.code).startswith(f"{src}: line 3: not UTF-8 text")
    src.write_text('{"op": "model"}\n{"op": "d2h", "pages": 2}\n')
    for dst in (tmp_path, tmp_path / "nope" / "t.jsonl"):
        with pytest.raises(SystemExit) as e:
            trim_main([str(src), str(dst)])
        assert str(e.value.code).startswith(f"{dst}: cannot write the ops file ("), e.value.code
        with pytest.raises(SystemExit) as e:
            V.main(["--dump-ops", str(dst)])
        assert str(e.value.code).startswith(f"{dst}: cannot write the ops file (")


def test_validate_dump_ops_writes_the_generated_set_without_a_gpu(tmp_path, capsys):
    """``validate --dump-ops FILE`` needs no GPU: it writes the generated ops (which trim_ops and
    validate --ops read) and says that nothing was replayed. With --ops too it is a usage
    error (the generated set is not used)."""
    from gpu_validation import validate as V
    from gpu_validation.trim_ops import read_ops

    if V._MISSING is None and V.torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: validate would replay the ops")
    out = tmp_path / "ops.jsonl"
    assert V.main(["--dump-ops", str(out), "--seed", "3", "--report",
                   str(tmp_path / "R.md")]) is None
    ops = read_ops(out)
    assert ops == json.loads(json.dumps(V.gen_default_ops(3)))
    assert f"wrote {out} ({len(ops)} ops, seed 3); nothing replayed" in capsys.readouterr().out
    assert not (tmp_path / "R.md").exists()
    with pytest.raises(SystemExit) as e:
        V.main(["--dump-ops", str(tmp_path / "b.jsonl"), "--ops", str(out)])
    assert e.value.code == 2 and "with --ops FILE they are not used" in capsys.readouterr().err
    assert not (tmp_path / "b.jsonl").exists()


@pytest.mark.parametrize("tool", ["validate", "calibrate"])
def test_gpu_tools_without_torch_give_help_and_say_what_to_install(tool):
    """Without torch (the core install has none), ``python -m gpu_validation.validate --help``
    (and calibrate) print their help, and a run says what to install."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None; sys.modules['triton'] = None; "
            f"from gpu_validation.{tool} import main; main(sys.argv[1:])")
    r = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr
    args = ["--out", "/nonexistent/x.json"] if tool == "calibrate" else []
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert r.stderr.strip().startswith(f"{tool} needs torch and triton (")
    assert "pip install -e '.[gpu]'" in r.stderr


def test_write_ops_counts_the_rounds_it_cannot_hold(tmp_path):
    """With several selection groups (policy.mode=per_head) or hole filling, output.write_ops
    cannot hold the rounds: summary.json counts those left out (the CLI prints it as a note),
    0 for single-group forward packing."""
    wl = make_workload([dict(arrival_s=0.0, input_tokens=300, output_tokens=400) for _ in range(3)])
    for extra, left_out in ((["policy.mode=per_head"], True), (["compaction=hole_fill"], True), ([], False)):
        c = cfg("policy=triattention", "policy.budget=128", "policy.beta=32", "compaction=forward_pack",
                "output.write_ops=true", "output.write_steps=false", *extra)
        s = run_simulation(c, tmp_path / "_".join(extra or ["base"]), workload=wl)
        ops = (tmp_path / "_".join(extra or ["base"]) / "ops.jsonl").read_text().splitlines()
        rounds = sum(1 for line in ops if '"compaction_move"' in line)
        assert s["rounds"] > 0
        assert s["ops_rounds_left_out"] == (s["rounds"] if left_out else 0)
        assert rounds == (0 if left_out else s["rounds"])


def test_write_ops_counts_what_output_ops_limit_leaves_out(tmp_path):
    """summary.json counts what output.write_ops wrote and what output.ops_limit left out,
    rounds and host copies apart."""
    wl = make_workload([doc(i, 2048, t=float(i), out=400) for i in range(3)], prefix_block_tokens=16)
    o = ["policy=triattention", "policy.budget=128", "policy.beta=32", "compaction=forward_pack",
         "tiers=gpu_host", "tiers.write_policy=write_through", "output.write_ops=true",
         "output.write_steps=false"]
    full = run_simulation(cfg(*o), tmp_path / "all", workload=wl)
    assert full["ops_rounds_over_limit"] == full["ops_transfers_over_limit"] == 0
    rounds, copies = full["ops_rounds_written"], full["ops_transfers_written"]
    assert rounds == full["rounds"] > 3 and copies > 3
    s = run_simulation(cfg(*o, "output.ops_limit=3"), tmp_path / "cut", workload=wl)
    assert (s["ops_rounds_written"], s["ops_rounds_over_limit"]) == (3, rounds - 3)
    assert (s["ops_transfers_written"], s["ops_transfers_over_limit"]) == (3, copies - 3)
    ops = [json.loads(line) for line in (tmp_path / "cut" / "ops.jsonl").read_text().splitlines()]
    assert sum(o["op"] == "compaction_move" for o in ops) == 3
    assert sum(o["op"] in ("d2h", "h2d") for o in ops) == 3


def test_write_ops_counts_the_disk_copies_it_cannot_hold(tmp_path):
    """ops.jsonl holds no host_to_disk or disk_to_host batch (the GPU replay has no op for a copy
    that involves no GPU); summary.json counts them in ``ops_transfers_left_out``, matching
    transfers.parquet."""
    out = tmp_path / "run"
    s = run_simulation(compose_config([*SINGLE_ENGINE,
                                       "trace.max_requests=200", "cache.num_gpu_blocks=3000",
                                       "tiers=gpu_host_disk", "tiers.host_gib=2",
                                       "output.write_ops=true", "output.ops_limit=100000",
                                       "sim.progress=false"]), out)
    tr = pd.read_parquet(out / "transfers.parquet")["direction"].value_counts()
    assert tr.get("host_to_disk", 0) > 0 and tr.get("disk_to_host", 0) > 0
    assert s["ops_transfers_left_out"] == {"host_to_disk": int(tr["host_to_disk"]),
                                           "disk_to_host": int(tr["disk_to_host"])}
    assert s["ops_transfers_written"] == int(tr.get("d2h", 0) + tr.get("h2d", 0))
    ops = [json.loads(line) for line in (out / "ops.jsonl").read_text().splitlines()]
    assert sum(o["op"] in ("d2h", "h2d") for o in ops) == s["ops_transfers_written"]
    assert json.loads((out / "summary.json").read_text())["ops_transfers_left_out"] \
        == s["ops_transfers_left_out"]


def test_stretch_times_refuses_a_shape_whose_fields_do_not_go_together():
    """StretchShape's fields of one kind of stretch are refused on another (ValueError naming
    them): a pure decode's first/shift/extra_first with fin or new_tokens, first_s without
    new_tokens, a chunked stretch without first_s."""
    c = cfg("model=qwen3_8b")
    m = AnalyticCostModel(c.model, c.gpu, c.cache, c.cost)
    ctx = np.array([10, 20], dtype=np.int64)
    fin = np.array([3, 5], dtype=np.int64)
    n = np.array([64, 1], dtype=np.int64)
    for shape in (StretchShape(ctx, 5, fin=fin, shift=4), StretchShape(ctx, 5, fin=fin, first=1),
                  StretchShape(ctx, 5, new_tokens=n, samples=1, first_s=0.01, extra_first=0.1)):
        with pytest.raises(ValueError, match="first, shift and extra_first apply"):
            m.stretch_times(shape)
    with pytest.raises(ValueError, match="first_s applies to a chunked stretch"):
        m.stretch_times(StretchShape(ctx, 5, first_s=0.01))
    with pytest.raises(ValueError, match="needs first_s"):
        m.stretch_times(StretchShape(ctx, 5, new_tokens=n, samples=1))
