"""gpu_validation.calibration_model: loading, errors, predictions (numpy + stdlib only)."""
import json
import sys

import pytest

from gpu_validation.calibration_model import CalibrationError, fit_affine, load_calibration


def _doc():
    return {
        "device": {"name": "Test GPU"}, "software": {"torch": "x"}, "date": "2026-01-01",
        "ops": {"d2h": {"overhead_s": 1e-5, "per_item_s": 2e-6, "bandwidth_Bps": 5e10},
                "compaction_move": {"overhead_s": 5e-6, "per_item_s": 0, "bandwidth_Bps": 2e12}},
        "decode_attention": {"layers": 36, "batch": [1, 4], "kv_tokens": [1000, 2000],
                             "seconds_per_layer": [[1e-5, 2e-5], [4e-5, 8e-5]]},
        "gemm": {"layers": 36, "tokens": [1, 100], "seconds_per_layer": [1e-5, 1e-4]},
    }


def _write(tmp_path, doc):
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(doc))
    return p


def test_predictions(tmp_path):
    cal = load_calibration(_write(tmp_path, _doc()))
    assert cal.has("d2h") and not cal.has("nvfp4_encode") and cal.has("gemm") and cal.has("decode_attention")
    assert cal.op_time("d2h", 5e10, 1) == pytest.approx(1e-5 + 2e-6 + 1.0)
    assert cal.op_time("d2h", 0, 10) == pytest.approx(1e-5 + 2e-5)
    assert cal.decode_attention_time(1, 1000) == pytest.approx(36e-5)
    assert cal.decode_attention_time(2, 1500) == pytest.approx(36 * (1.5e-5 + (6e-5 - 1.5e-5) / 3))
    assert cal.decode_attention_time(1, 500) == pytest.approx(36e-5)          # below: edge value
    assert cal.decode_attention_time(8, 4000) == pytest.approx(36 * 8e-5 * 4)  # above: proportional
    assert cal.gemm_time(50.5) == pytest.approx(36 * 5.5e-5)
    assert cal.gemm_time(200) == pytest.approx(36 * 2e-4)
    with pytest.raises(KeyError, match="nvfp4_encode"):
        cal.op_time("nvfp4_encode", 1)


def test_errors_name_file_and_key(tmp_path):
    with pytest.raises(CalibrationError, match="not found"):
        load_calibration(tmp_path / "nope.json")
    d = _doc()
    del d["ops"]["d2h"]["bandwidth_Bps"]
    with pytest.raises(CalibrationError, match=r"cal\.json.*ops\.d2h\.bandwidth_Bps"):
        load_calibration(_write(tmp_path, d))
    d = _doc()
    d["ops"]["d2h"]["overhead_s"] = "fast"
    with pytest.raises(CalibrationError, match="ops.d2h.overhead_s' must be float"):
        load_calibration(_write(tmp_path, d))
    d = _doc()
    d["decode_attention"]["seconds_per_layer"] = [[1e-5]]
    with pytest.raises(CalibrationError, match="seconds_per_layer"):
        load_calibration(_write(tmp_path, d))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(CalibrationError, match="bad.json"):
        load_calibration(tmp_path / "bad.json")
    # all three coefficients 0: a copy of any size would take no time (a tiered run's copies
    # 0 s); bandwidth 0 alone is the fit's "no byte term"
    d = _doc()
    d["ops"]["d2h"].update(overhead_s=0, per_item_s=0, bandwidth_Bps=0)
    with pytest.raises(CalibrationError, match=r"cal\.json: ops\.d2h: .* all 0, so the op would take no time"):
        load_calibration(_write(tmp_path, d))
    d["ops"]["d2h"]["per_item_s"] = 2e-6
    assert load_calibration(_write(tmp_path, d)).op_time("d2h", 10**9, 3) == pytest.approx(6e-6)
    # a UTF-8 byte-order mark (an editor's save) is not data, as in trace files
    (tmp_path / "bom.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(_doc()).encode())
    assert load_calibration(tmp_path / "bom.json").op_time("d2h", 0, 1) == pytest.approx(1.2e-5)


def test_fit_affine_recovers_coefficients():
    pts = [(n, k, 3e-6 + 1e-6 * k + n / 4e12) for n in (1e6, 1e8, 1e9) for k in (1, 8, 64)]
    fit, err = fit_affine(pts)
    assert err < 1e-9
    assert fit["overhead_s"] == pytest.approx(3e-6) and fit["per_item_s"] == pytest.approx(1e-6)
    assert fit["bandwidth_Bps"] == pytest.approx(4e12)


def test_no_torch_at_import():
    import importlib
    mods = set(sys.modules)
    importlib.reload(importlib.import_module("gpu_validation.calibration_model"))
    assert "torch" in mods or "torch" not in sys.modules  # reloading pulled in no torch


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["gemm"].update(seconds_per_layer=[-1e-5, 1e-4]),
     r"cal\.json: gemm\.seconds_per_layer\[0\] = -1e-05; expected a finite value > 0"),
    (lambda d: d["gemm"].update(seconds_per_layer=[float("nan"), 1e-4]), r"gemm\.seconds_per_layer\[0\] = nan"),
    (lambda d: d["gemm"].update(seconds_per_layer=[0.0, 0.0]), r"gemm\.seconds_per_layer\[0\] = 0\.0"),
    (lambda d: d["gemm"].update(tokens=[100, 1]), r"gemm\.tokens must increase strictly"),
    (lambda d: d["gemm"].update(layers=0), r"gemm\.layers = 0; expected >= 1"),
    (lambda d: d["decode_attention"].update(seconds_per_layer=[[1e-5, 2e-5], [-4e-5, 8e-5]]),
     r"decode_attention\.seconds_per_layer\[1\]\[0\] = -4e-05"),
    (lambda d: d["decode_attention"].update(kv_tokens=[2000, 1000]), r"decode_attention\.kv_tokens must increase"),
    (lambda d: d["decode_attention"].update(batch=[0, 4]), r"decode_attention\.batch\[0\] = 0\.0"),
    (lambda d: d["ops"]["d2h"].update(per_item_s=-2e-6), r"ops\.d2h\.per_item_s = -2e-06"),
    (lambda d: d["ops"]["d2h"].update(overhead_s=float("inf")), r"ops\.d2h\.overhead_s = inf"),
    (lambda d: d.update(complete=False), r"complete = False: the calibration run did not finish"),
    (lambda d: d.update(schema_version=99), r"schema_version 99; this kvsim reads version 1"),
    (lambda d: d["decode_attention"].update(batch=[1, "x"]), r"decode_attention\.batch\[1\] = 'x'; expected a number"),
    (lambda d: d["decode_attention"].update(kv_tokens=[1000, None]), r"decode_attention\.kv_tokens\[1\] = None"),
    (lambda d: d["decode_attention"].update(batch=[True, 4]), r"decode_attention\.batch\[0\] = True"),
    (lambda d: d["decode_attention"].update(seconds_per_layer=[[1e-5, 2e-5], [4e-5]]),
     r"decode_attention\.seconds_per_layer\[1\] must be a list of len\(kv_tokens\) = 2 numbers"),
    (lambda d: d["decode_attention"].update(seconds_per_layer=[[1e-5, "abc"], [4e-5, 8e-5]]),
     r"decode_attention\.seconds_per_layer\[0\]\[1\] = 'abc'"),
    (lambda d: d["gemm"].update(tokens=[[1], 100]), r"gemm\.tokens\[0\] = \[1\]; expected a number"),
    # an empty table (an IndexError mid-run), and a table's layers other than the model's (which
    # would scale every step time)
    (lambda d: d["decode_attention"].update(batch=[], kv_tokens=[], seconds_per_layer=[]),
     r"decode_attention\.batch and decode_attention\.kv_tokens must be non-empty \(got 0 and 0"),
    (lambda d: d.update(model_shapes={"num_layers": 36}) or d["decode_attention"].update(layers=1),
     r"decode_attention\.layers = 1, but model_shapes\.num_layers = 36"),
    (lambda d: d.update(model_shapes={"num_layers": 36}) or d["gemm"].update(layers=1),
     r"gemm\.layers = 1, but model_shapes\.num_layers = 36"),
    # a string '36' or a string schema version is named with its type
    (lambda d: d.update(model_shapes={"num_layers": "36"}),
     r"model_shapes\.num_layers = '36' \(str\); expected a positive integer"),
    (lambda d: d.update(model_shapes=[36]), r"model_shapes is a list; expected an object"),
    (lambda d: d.update(schema_version="1"), r"schema_version '1' is a str; expected the integer 1"),
])
def test_impossible_values_are_errors(tmp_path, edit, match):
    """Negative, zero or non-finite times, grids that do not increase, an unfinished run or
    another schema version: a CalibrationError naming the file, the key and the value."""
    import importlib

    cm = importlib.import_module("gpu_validation.calibration_model")  # (another test reloads it)
    d = _doc()
    edit(d)
    with pytest.raises(cm.CalibrationError, match=match):
        cm.load_calibration(_write(tmp_path, d))


def test_non_utf8_file_is_a_calibration_error(tmp_path):
    import importlib

    cm = importlib.import_module("gpu_validation.calibration_model")
    p = tmp_path / "cal.json"
    p.write_bytes(json.dumps(_doc()).replace("Test GPU", "Test GPU \u00e9").encode("latin-1")
                  .replace(b"\\u00e9", b"\xe9"))
    with pytest.raises(cm.CalibrationError, match=r"cal\.json: not readable as JSON"):
        cm.load_calibration(p)


# ------------------------------------------------------------------ operators section
def _ops_doc():
    d = _doc()
    d["operators"] = {
        "gemm": [{"dtype": "bf16", "m": 1, "n": 57344, "k": 8192, "seconds": 3e-4, "mode": "graph"},
                 {"dtype": "bf16", "m": 1, "n": 57344, "k": 8192, "seconds": 3.1e-4, "mode": "eager"},
                 {"dtype": "fp8", "m": 64, "n": 7168, "k": 8192, "seconds": 2e-5, "mode": "graph"}],
        "grouped_gemm": [{"dtype": "bf16", "tokens": 4, "experts_active": 16, "n": 3072, "k": 4096,
                          "seconds": 1e-4, "method": "torch._grouped_mm bf16", "mode": "graph",
                          "experts": 128, "top_k": 8}],
        "attention_decode": [{"kv_dtype": "bf16", "batch": 64, "kv_tokens": 4096, "q_heads": 64,
                              "kv_heads": 8, "head_dim": 128, "seconds_per_layer": 1e-4,
                              "method": "sdpa flash", "mode": "graph"}],
        "attention_prefill": [{"kv_dtype": "bf16", "new_tokens": 512, "context_tokens": 0,
                               "q_heads": 64, "kv_heads": 8, "head_dim": 128,
                               "seconds_per_layer": 2e-4, "method": "flash", "mode": "eager"}],
        "notes": {"all_reduce": "not measured"},
    }
    return d


def test_operators_accessor(tmp_path):
    cal = load_calibration(_write(tmp_path, _ops_doc()))
    assert cal.has("operators")
    ops = cal.operators
    assert set(ops) == {"gemm", "grouped_gemm", "attention_decode", "attention_prefill", "notes"}
    assert [r["mode"] for r in ops["gemm"]] == ["graph", "eager", "graph"]
    assert ops["grouped_gemm"][0]["experts_active"] == 16
    assert ops["attention_decode"][0]["seconds_per_layer"] == 1e-4
    assert ops["notes"]["all_reduce"] == "not measured"
    ops["gemm"].clear()  # a copy: the calibration keeps its rows
    assert len(cal.operators["gemm"]) == 3
    # a file without the section (no --model): None, has() False; the rest still loads
    plain = load_calibration(_write(tmp_path, _doc()))
    assert plain.operators is None and not plain.has("operators")
    # empty tables are allowed (e.g. no MoE card given)
    d = _ops_doc()
    d["operators"]["grouped_gemm"] = []
    assert load_calibration(_write(tmp_path, d)).operators["grouped_gemm"] == []


def _del(table, key):
    return lambda o: o[table][0].pop(key)


@pytest.mark.parametrize("edit, match", [
    (lambda o: o.pop("gemm"), r"cal\.json: missing key 'operators\.gemm'"),
    (lambda o: o.pop("notes"), r"missing key 'operators\.notes'"),
    (lambda o: o.update(notes=[]), r"key 'operators\.notes' must be dict"),
    (lambda o: o.update(attention_decode={}), r"key 'operators\.attention_decode' must be list"),
    (_del("gemm", "seconds"), r"missing key 'operators\.gemm\[0\]\.seconds'"),
    (_del("grouped_gemm", "method"), r"missing key 'operators\.grouped_gemm\[0\]\.method'"),
    (_del("attention_prefill", "context_tokens"), r"operators\.attention_prefill\[0\]\.context_tokens"),
    (lambda o: o["gemm"][2].update(seconds=-1.0), r"operators\.gemm\[2\]\.seconds = -1\.0; expected a finite"),
    (lambda o: o["gemm"][0].update(seconds=float("nan")), r"operators\.gemm\[0\]\.seconds = nan"),
    (lambda o: o["gemm"][0].update(seconds=0), r"operators\.gemm\[0\]\.seconds = 0;"),
    (lambda o: o["gemm"][0].update(seconds="1e-4"), r"operators\.gemm\[0\]\.seconds = '1e-4'"),
    (lambda o: o["gemm"][0].update(m=0), r"operators\.gemm\[0\]\.m = 0; expected an integer >= 1"),
    (lambda o: o["gemm"][0].update(m=1.0), r"operators\.gemm\[0\]\.m = 1\.0; expected an integer"),
    (lambda o: o["gemm"][0].update(n=True), r"operators\.gemm\[0\]\.n = True"),
    (lambda o: o["gemm"][0].update(dtype="fp16"), r"operators\.gemm\[0\]\.dtype = 'fp16'; expected 'bf16' or 'fp8'"),
    (lambda o: o["gemm"][0].update(mode="cuda_graph"), r"operators\.gemm\[0\]\.mode = 'cuda_graph'"),
    (lambda o: o["gemm"].append(dict(o["gemm"][0], seconds=1.0)),
     r"operators\.gemm\[3\] repeats operators\.gemm\[0\] \(dtype=bf16, m=1, n=57344, k=8192, mode=graph\)"),
    (lambda o: o["gemm"].append(7), r"operators\.gemm\[3\] is a int; expected an object"),
    (lambda o: o["attention_decode"][0].update(kv_heads=6), r"attention_decode\[0\]: q_heads 64 is not a multiple of kv_heads 6"),
    (lambda o: o["attention_decode"][0].update(kv_dtype="int8"), r"attention_decode\[0\]\.kv_dtype = 'int8'"),
    (lambda o: o["attention_prefill"][0].update(context_tokens=-1), r"context_tokens = -1; expected an integer >= 0"),
    (lambda o: o["grouped_gemm"][0].update(experts_active=129), r"experts_active = 129 > experts = 128"),
    (lambda o: o["grouped_gemm"][0].update(experts_active=33), r"experts_active = 33 > tokens x top_k = 32"),
    (lambda o: o["grouped_gemm"][0].update(top_k=0), r"grouped_gemm\[0\]\.top_k = 0"),
    (lambda o: o["grouped_gemm"][0].update(method=3), r"grouped_gemm\[0\]\.method = 3; expected a string"),
])
def test_operators_errors_name_file_and_key(tmp_path, edit, match):
    import importlib

    cm = importlib.import_module("gpu_validation.calibration_model")  # (another test reloads it)
    d = _ops_doc()
    edit(d["operators"])
    with pytest.raises(cm.CalibrationError, match=match):
        cm.load_calibration(_write(tmp_path, d))


def test_operators_section_must_be_an_object(tmp_path):
    import importlib

    cm = importlib.import_module("gpu_validation.calibration_model")
    d = _ops_doc()
    d["operators"] = []
    with pytest.raises(cm.CalibrationError, match=r"cal\.json: operators is a list; expected an object"):
        cm.load_calibration(_write(tmp_path, d))


# ------------------------------------------------------------------ operator planning (stdlib)
CARDS = __import__("pathlib").Path(__file__).resolve().parents[1] / "experiments" / "conf" / "model"


def _card(tmp_path, name, **kw):
    p = tmp_path / f"{name}.yaml"
    body = dict(name=name, num_layers=2, num_q_heads=8, num_kv_heads=2, head_dim=64, hidden_size=512,
                intermediate_size=1024, vocab_size=1000)
    body.update(kw)
    p.write_text("# test card\n" + "\n".join(f"{k}: {v}" for k, v in body.items()) + "\n")
    return p


def test_operator_plan_shapes_of_a_shipped_card():
    from gpu_validation import model_cards as MC
    from gpu_validation import operator_plan as OP

    m = MC.model_shapes(CARDS / "llama3_1_70b.yaml")
    pl = OP.plan_operators([m], [1, 8])
    tp1, tp8 = pl.by_model["Llama-3.1-70B"]["tp1"], pl.by_model["Llama-3.1-70B"]["tp8"]
    assert tp1["qkv"] == {"n": (64 + 16) * 128, "k": 8192} and tp1["o"] == {"n": 8192, "k": 8192}
    assert tp1["gate_up"] == {"n": 2 * 28672, "k": 8192} and tp1["down"] == {"n": 8192, "k": 28672}
    assert tp8["gate_up"] == {"n": 7168, "k": 8192} and tp8["down"] == {"n": 8192, "k": 3584}
    assert tp8["qkv"] == {"n": (8 + 2) * 128, "k": 8192} and tp8["lm_head"] == {"n": 16032, "k": 8192}
    assert tp8["attention"] == {"q_heads": 8, "kv_heads": 1, "head_dim": 128}
    assert (7168, 8192) in pl.gemm and (64, 8, 128) in pl.attention and (8, 1, 128) in pl.attention
    assert not pl.grouped


def test_operator_plan_dedups_and_handles_moe(tmp_path):
    from gpu_validation import model_cards as MC
    from gpu_validation import operator_plan as OP

    a = MC.model_shapes(_card(tmp_path, "A"))
    b = MC.model_shapes(_card(tmp_path, "B", vocab_size=2000))  # same projections, other lm_head
    moe = MC.model_shapes(_card(tmp_path, "M", num_kv_heads=4, num_experts=8, num_experts_per_tok=2,
                                moe_intermediate_size=256))
    pl = OP.plan_operators([a, b, moe], [1, 8])
    assert pl.gemm[(2 * 1024, 512)] == ["A tp1 gate_up", "B tp1 gate_up"]  # timed once
    assert "gate_up" not in pl.by_model["M"]["tp1"]  # MoE, num_dense_layers 0: no dense MLP
    assert pl.by_model["M"]["tp8"]["qkv"] == {"n": (1 + 2 * 1) * 64, "k": 512}  # kv heads replicated
    assert pl.grouped[(8, 2, 2 * 256, 512)] == ["M tp1 experts_gate_up"]
    assert (8, 2, 512, 32) in pl.grouped  # down at tp8: k = 256 / 8
    assert (1, 1, 64) in pl.attention  # 8 q / 2 kv heads at tp8: one KV head per GPU
    est = OP.estimate_seconds(pl)
    assert est["points"] > 0 and est["total"] > 0
    # a MoE card with dense layers and shared experts keeps both
    ds = MC.model_shapes(_card(tmp_path, "D", num_experts=8, num_experts_per_tok=2,
                               moe_intermediate_size=256, num_shared_experts=1, num_dense_layers=1))
    t1 = OP.plan_operators([ds], [1]).by_model["D"]["tp1"]
    assert t1["gate_up"]["n"] == 2048 and t1["shared_gate_up"] == {"n": 512, "k": 512}


def test_operator_cards_errors_and_overrides(tmp_path):
    from gpu_validation import model_cards as MC

    p = _card(tmp_path, "X")
    p.write_text(p.read_text().replace("head_dim: 64\n", ""))
    with pytest.raises(MC.CardError, match=r"X\.yaml: missing key 'head_dim'"):
        MC.model_shapes(p)
    p = _card(tmp_path, "Y", num_q_heads="eight")
    with pytest.raises(MC.CardError, match=r"Y\.yaml: key 'num_q_heads' = 'eight'"):
        MC.model_shapes(p)
    p = _card(tmp_path, "Z", num_experts=8)
    with pytest.raises(MC.CardError, match=r"Z\.yaml: num_experts = 8 but 'num_experts_per_tok'"):
        MC.model_shapes(p)
    name, over = MC.parse_moe_override("Z:experts=8,top_k=2,width=128,gated=0")
    m = MC.model_shapes(p, {name: over})
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size, m.mlp_gated) == (8, 2, 128, False)
    assert "command line" in m.sources["moe"]
    with pytest.raises(MC.CardError, match="unknown key 'colour'"):
        MC.parse_moe_override("Z:colour=3")
    # a card of a known MoE model without the fields: the published config.json values
    q = _card(tmp_path, "Qwen3-235B-A22B", num_q_heads=64, num_kv_heads=4)
    m = MC.model_shapes(q)
    assert (m.num_experts, m.num_experts_per_tok, m.moe_intermediate_size) == (128, 8, 1536)
    assert "huggingface.co/Qwen" in m.sources["moe"]


def test_flat_yaml_parser_reads_the_shipped_cards_as_yaml_does():
    yaml = pytest.importorskip("yaml")
    from gpu_validation import model_cards as MC

    cards = sorted(CARDS.glob("*.yaml"))
    assert cards
    for c in cards:
        assert MC.parse_flat_yaml(c.read_text(), str(c)) == yaml.safe_load(c.read_text()), c.name
    with pytest.raises(MC.CardError, match=r"card\.yaml:2: nested"):
        MC.parse_flat_yaml("a: 1\n  b: 2\n", "card.yaml")


def test_operators_module_imports_no_torch():
    import importlib

    mods = set(sys.modules)
    importlib.reload(importlib.import_module("gpu_validation.operators"))
    assert "torch" in mods or "torch" not in sys.modules
