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
    # all three coefficients 0: a copy of any size would take no time (break-it pass: accepted,
    # and the h2d copies of a tiered run took 0 s); bandwidth 0 alone is the fit's "no byte term"
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
    # break-it pass: an empty table crashed mid-run (IndexError); a table's layers other than the
    # model's scaled every step time (decode_attention.layers=1: e2e p50 19.7 s against 24.7 s)
    (lambda d: d["decode_attention"].update(batch=[], kv_tokens=[], seconds_per_layer=[]),
     r"decode_attention\.batch and decode_attention\.kv_tokens must be non-empty \(got 0 and 0"),
    (lambda d: d.update(model_shapes={"num_layers": 36}) or d["decode_attention"].update(layers=1),
     r"decode_attention\.layers = 1, but model_shapes\.num_layers = 36"),
    (lambda d: d.update(model_shapes={"num_layers": 36}) or d["gemm"].update(layers=1),
     r"gemm\.layers = 1, but model_shapes\.num_layers = 36"),
    # (second break-it pass) a string '36' read as 'layers = 36, but num_layers = 36'; a string
    # schema version as 'schema_version '1'; this kvsim reads version 1'
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
