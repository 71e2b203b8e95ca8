"""Read a per-device calibration file and predict operation times (seconds).

Imports only numpy, json and the standard library, so the simulator can use it without
torch. Schema: see gpu_validation/README.md ("Calibration file"). Written by
``python -m gpu_validation.calibrate``.

Models
------
* ``op_time(op, nbytes, n_items)``: ``overhead_s + per_item_s * n_items + nbytes / bandwidth_Bps``
  with the three coefficients fitted per op from the sweep (non-negative least squares on
  relative error). ``nbytes`` is the op's payload as defined in ``ops[op]["nbytes_means"]``
  (e.g. hot-page bytes for codecs, bytes of moved tokens for compaction, bytes on the link
  for h2d/d2h); ``n_items`` its count of pages / requests / separate copies.
* ``decode_attention_time(batch, kv_tokens_per_seq)``: bilinear interpolation of the measured
  per-layer table in (batch, kv tokens), times ``layers``. Below the table's smallest batch
  or length the edge value is used (launch-bound floor); above the largest, the edge value is
  scaled proportionally (memory-bound: time ~ batch x kv tokens).
* ``gemm_time(tokens)``: linear interpolation of the measured per-layer table, times
  ``layers``; below the smallest token count the edge value, above the largest it is scaled
  proportionally (compute-bound).
* ``operators``: the measured per-operator rows (dense GEMMs, grouped expert GEMMs, decode and
  prefill attention per layer) of ``calibrate --model``, checked and returned as lists; the
  per-operator cost model interpolates them itself.
"""
from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

OP_NAMES = (
    "d2d_copy", "compaction_move", "compaction_hole_fill", "nvfp4_encode", "nvfp4_decode",
    "fp8_encode", "fp8_decode", "h2d", "d2h", "nvfp4_encode_d2h_fused", "nvfp4_encode_then_d2h",
    "nvfp4_h2d_decode_fused", "h2d_then_nvfp4_decode", "fp8_encode_d2h_fused", "fp8_h2d_decode_fused",
)


SCHEMA_VERSION = 1


class CalibrationError(ValueError):
    """A calibration file is missing, unreadable, lacks a key, has a wrong type or an impossible
    value (a negative or non-finite time or coefficient, a grid that does not increase, an
    unfinished run)."""


def _finite(vals, where: str, path: str, positive: bool) -> None:
    """CalibrationError unless every value is finite and > 0 (``positive``) or >= 0."""
    a = np.asarray(vals, dtype=float)
    bad = ~np.isfinite(a) | ((a <= 0) if positive else (a < 0))
    if bad.any():
        i = np.unravel_index(int(np.argmax(bad)), a.shape)
        raise CalibrationError(f"{path}: {where}{''.join(f'[{int(j)}]' for j in i)} = "
                               f"{float(a[i])!r}; expected a finite value "
                               f"{'> 0' if positive else '>= 0'}")


def _numbers(vals, where: str, path: str) -> list:
    """``vals`` (a list of JSON numbers) as floats; CalibrationError naming the first entry that
    is not a number (booleans and strings included)."""
    out = []
    for i, v in enumerate(vals):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise CalibrationError(f"{path}: {where}[{i}] = {v!r}; expected a number")
        out.append(float(v))
    return out


def _grid(vals, where: str, path: str) -> None:
    """CalibrationError unless the grid is finite, > 0 and strictly increasing."""
    _finite(vals, where, path, positive=True)
    for i in range(1, len(vals)):
        if not vals[i] > vals[i - 1]:
            raise CalibrationError(f"{path}: {where} must increase strictly; {where}[{i - 1}] = "
                                   f"{vals[i - 1]!r}, {where}[{i}] = {vals[i]!r}")


def _need(d, key, typ, where, path):
    if not isinstance(d, dict) or key not in d:
        raise CalibrationError(f"{path}: missing key '{where}{key}'")
    v = d[key]
    if typ is float and isinstance(v, int) and not isinstance(v, bool):
        v = float(v)
    if not isinstance(v, typ) or isinstance(v, bool) and typ is not bool:
        tn = typ.__name__ if isinstance(typ, type) else "/".join(t.__name__ for t in typ)
        raise CalibrationError(f"{path}: key '{where}{key}' must be {tn}, got {type(v).__name__}")
    return v


def _layers(d, where: str, path: str) -> int:
    n = int(_need(d, "layers", int, where, path))
    if n < 1:
        raise CalibrationError(f"{path}: {where}layers = {n}; expected >= 1")
    return n


# operators.<table>: required keys and their kinds ("int" >= 1, "int0" >= 0, "sec" finite > 0,
# "str", or a tuple of allowed strings); rows are keyed by every field but the time and method
OPERATOR_TABLES = {
    "gemm": {"dtype": ("bf16", "fp8"), "m": "int", "n": "int", "k": "int", "seconds": "sec",
             "mode": ("graph", "eager")},
    "grouped_gemm": {"dtype": ("bf16", "fp8"), "tokens": "int", "experts_active": "int", "n": "int",
                     "k": "int", "seconds": "sec", "method": "str", "mode": ("graph", "eager")},
    "attention_decode": {"kv_dtype": ("bf16", "fp8"), "batch": "int", "kv_tokens": "int",
                         "q_heads": "int", "kv_heads": "int", "head_dim": "int",
                         "seconds_per_layer": "sec", "method": "str", "mode": ("graph", "eager")},
    "attention_prefill": {"kv_dtype": ("bf16", "fp8"), "new_tokens": "int", "context_tokens": "int0",
                          "q_heads": "int", "kv_heads": "int", "head_dim": "int",
                          "seconds_per_layer": "sec", "method": "str", "mode": ("graph", "eager")},
}
OPERATOR_OPTIONAL = {"grouped_gemm": {"experts": "int", "top_k": "int"}}


def _check_operators(ops, path: str) -> dict:
    """Validate ``operators`` (schema: README.md) and return ``{table: [row dicts], "notes":
    dict}``. CalibrationError naming the file and the key (``operators.gemm[3].seconds``) for a
    missing table or key, a wrong type, a time that is not finite and > 0, a count < 1 (context
    tokens < 0), an unknown dtype or mode, q_heads not a multiple of kv_heads, experts_active
    above experts or routed rows, or a row that repeats an earlier row's shape."""
    if not isinstance(ops, dict):
        raise CalibrationError(f"{path}: operators is a {type(ops).__name__}; expected an object")
    out = {}
    for table, spec in OPERATOR_TABLES.items():
        rows = _need(ops, table, list, "operators.", path)
        opt = OPERATOR_OPTIONAL.get(table, {})
        seen = {}
        checked = []
        for i, r in enumerate(rows):
            w = f"operators.{table}[{i}]"
            if not isinstance(r, dict):
                raise CalibrationError(f"{path}: {w} is a {type(r).__name__}; expected an object")
            for key, kind in list(spec.items()) + [(k, v) for k, v in opt.items() if k in r]:
                if key not in r:
                    raise CalibrationError(f"{path}: missing key '{w}.{key}'")
                v = r[key]
                if isinstance(kind, tuple) or kind == "str":
                    if not isinstance(v, str) or (isinstance(kind, tuple) and v not in kind):
                        want = " or ".join(repr(x) for x in kind) if isinstance(kind, tuple) else "a string"
                        raise CalibrationError(f"{path}: {w}.{key} = {v!r}; expected {want}")
                elif kind == "sec":
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < float("inf")):
                        raise CalibrationError(f"{path}: {w}.{key} = {v!r}; expected a finite number "
                                               f"of seconds > 0")
                else:
                    lo = 0 if kind == "int0" else 1
                    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                        raise CalibrationError(f"{path}: {w}.{key} = {v!r}; expected an integer >= {lo}")
            if "q_heads" in spec and r["q_heads"] % r["kv_heads"]:
                raise CalibrationError(f"{path}: {w}: q_heads {r['q_heads']} is not a multiple of "
                                       f"kv_heads {r['kv_heads']}")
            if table == "grouped_gemm":
                cap = r["experts"] if "experts" in r else None
                if cap is not None and r["experts_active"] > cap:
                    raise CalibrationError(f"{path}: {w}.experts_active = {r['experts_active']} > "
                                           f"experts = {cap}")
                if "top_k" in r and r["experts_active"] > r["tokens"] * r["top_k"]:
                    raise CalibrationError(f"{path}: {w}.experts_active = {r['experts_active']} > "
                                           f"tokens x top_k = {r['tokens'] * r['top_k']}")
            key = tuple((k, r[k]) for k in list(spec) + list(opt)
                        if k in r and k not in ("seconds", "seconds_per_layer", "method"))
            if key in seen:
                raise CalibrationError(f"{path}: {w} repeats operators.{table}[{seen[key]}] "
                                       f"({', '.join(f'{k}={v}' for k, v in key)}); expected one "
                                       f"row per shape and mode")
            seen[key] = i
            checked.append(dict(r))
        out[table] = checked
    out["notes"] = _need(ops, "notes", dict, "operators.", path)
    return out


@dataclass(frozen=True)
class OpFit:
    """One op's fitted cost: seconds = overhead_s + per_item_s * n_items + nbytes / bandwidth_Bps."""
    overhead_s: float
    per_item_s: float
    bandwidth_Bps: float
    nbytes_means: str = ""

    def time(self, nbytes: float, n_items: int = 1) -> float:
        bw = self.bandwidth_Bps
        return self.overhead_s + self.per_item_s * n_items + (nbytes / bw if bw > 0 else 0.0)


class Calibration:
    """Predicted times for one device, from a calibration JSON (see :func:`load_calibration`)."""

    def __init__(self, data: dict, path: str = "<dict>"):
        self.path = str(path)
        p = self.path
        if isinstance(data, dict) and "schema_version" in data and data["schema_version"] != SCHEMA_VERSION:
            v = data["schema_version"]
            if not isinstance(v, int) or isinstance(v, bool):
                raise CalibrationError(f"{p}: schema_version {v!r} is a {type(v).__name__}; "
                                       f"expected the integer {SCHEMA_VERSION}")
            raise CalibrationError(f"{p}: schema_version {v!r}; this kvsim "
                                   f"reads version {SCHEMA_VERSION} (rerun gpu_validation.calibrate)")
        if isinstance(data, dict) and data.get("complete", True) is not True:
            raise CalibrationError(f"{p}: complete = {data['complete']!r}: the calibration run did "
                                   f"not finish; rerun python -m gpu_validation.calibrate")
        self.device = _need(data, "device", dict, "", p)
        _need(self.device, "name", str, "device.", p)
        self.software = _need(data, "software", dict, "", p)
        self.date = _need(data, "date", str, "", p)
        ops = _need(data, "ops", dict, "", p)
        self.ops: dict[str, OpFit] = {}
        for name, o in ops.items():
            w = f"ops.{name}."
            self.ops[name] = OpFit(
                overhead_s=_need(o, "overhead_s", float, w, p),
                per_item_s=_need(o, "per_item_s", float, w, p),
                bandwidth_Bps=_need(o, "bandwidth_Bps", float, w, p),
                nbytes_means=o.get("nbytes_means", "") if isinstance(o, dict) else "")
            for f in ("overhead_s", "per_item_s", "bandwidth_Bps"):
                v = getattr(self.ops[name], f)
                if not (0 <= v < float("inf")):
                    raise CalibrationError(f"{p}: ops.{name}.{f} = {v!r}; expected a finite "
                                           f"coefficient >= 0")
            o = self.ops[name]
            if o.overhead_s == 0 and o.per_item_s == 0 and o.bandwidth_Bps == 0:
                # (bandwidth_Bps 0 is the fit's "no byte term": with the others 0, no time)
                raise CalibrationError(f"{p}: ops.{name}: overhead_s, per_item_s and "
                                       f"bandwidth_Bps are all 0, so the op would take no time; "
                                       f"expected a fitted cost (bandwidth_Bps 0 means no byte "
                                       f"term, so overhead_s or per_item_s must then be > 0)")
        self._attn = None
        if "decode_attention" in data:
            a = data["decode_attention"]
            b = _numbers(_need(a, "batch", list, "decode_attention.", p), "decode_attention.batch", p)
            k = _numbers(_need(a, "kv_tokens", list, "decode_attention.", p),
                         "decode_attention.kv_tokens", p)
            rows = _need(a, "seconds_per_layer", list, "decode_attention.", p)
            for i, r in enumerate(rows):
                if not isinstance(r, list) or len(r) != len(k):
                    raise CalibrationError(
                        f"{p}: decode_attention.seconds_per_layer[{i}] must be a list of "
                        f"len(kv_tokens) = {len(k)} numbers, got {str(r)[:40]}")
            t = np.asarray([_numbers(r, f"decode_attention.seconds_per_layer[{i}]", p)
                            for i, r in enumerate(rows)], dtype=float).reshape(len(rows), len(k))
            if t.shape != (len(b), len(k)):
                raise CalibrationError(f"{p}: decode_attention.seconds_per_layer must be [len(batch)][len(kv_tokens)], "
                                       f"got shape {t.shape}")
            if not b or not k:
                raise CalibrationError(f"{p}: decode_attention.batch and decode_attention.kv_tokens "
                                       f"must be non-empty (got {len(b)} and {len(k)} values)")
            _grid(b, "decode_attention.batch", p)
            _grid(k, "decode_attention.kv_tokens", p)
            _finite(t, "decode_attention.seconds_per_layer", p, positive=True)
            self._attn = (b, k, t, _layers(a, "decode_attention.", p))
        self._gemm = None
        if "gemm" in data:
            g = data["gemm"]
            tok = _numbers(_need(g, "tokens", list, "gemm.", p), "gemm.tokens", p)
            sec = _numbers(_need(g, "seconds_per_layer", list, "gemm.", p), "gemm.seconds_per_layer", p)
            if len(tok) != len(sec) or not tok:
                raise CalibrationError(f"{p}: gemm.tokens and gemm.seconds_per_layer must have the same nonzero length")
            _grid(tok, "gemm.tokens", p)
            _finite(sec, "gemm.seconds_per_layer", p, positive=True)
            self._gemm = (tok, sec, _layers(g, "gemm.", p))
        shapes = data.get("model_shapes")
        if shapes is not None:
            if not isinstance(shapes, dict):
                raise CalibrationError(f"{p}: model_shapes is a {type(shapes).__name__}; expected "
                                       f"an object of the measured model's sizes")
            for k, v in shapes.items():
                if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                    raise CalibrationError(f"{p}: model_shapes.{k} = {v!r} ({type(v).__name__}); "
                                           f"expected a positive integer")
        n_layers = shapes.get("num_layers") if isinstance(shapes, dict) else None
        for name, table in (("decode_attention", self._attn), ("gemm", self._gemm)):
            # a table's per-layer times are scaled by its layers: they must be the model's
            if table is not None and n_layers is not None and table[-1] != n_layers:
                raise CalibrationError(f"{p}: {name}.layers = {table[-1]}, but model_shapes."
                                       f"num_layers = {n_layers}; expected the measured model's "
                                       f"layer count")
        self._operators = (_check_operators(data["operators"], p)
                           if isinstance(data, dict) and "operators" in data else None)
        self.raw = data

    @property
    def operators(self) -> dict | None:
        """The measured per-operator rows, or None when the file has no ``operators`` section
        (a calibration run without ``--model``): ``{"gemm": [...], "grouped_gemm": [...],
        "attention_decode": [...], "attention_prefill": [...], "notes": {...}}``, each list of
        row dicts as in README.md (seconds per call for one GPU; attention per layer). Copies:
        editing them does not change the calibration."""
        if self._operators is None:
            return None
        return {k: ([dict(r) for r in v] if isinstance(v, list) else dict(v))
                for k, v in self._operators.items()}

    # ---------------------------------------------------------------- ops
    def has(self, op: str) -> bool:
        """True if the file has a fitted entry for ``op`` (else the simulator should fall back
        to its analytic model). ``"decode_attention"`` and ``"gemm"`` name the tables,
        ``"operators"`` the per-operator section."""
        if op == "operators":
            return self._operators is not None
        if op == "decode_attention":
            return self._attn is not None
        if op == "gemm":
            return self._gemm is not None
        return op in self.ops

    def op_time(self, op: str, nbytes: int, n_items: int = 1) -> float:
        """Predicted seconds of ``op`` moving ``nbytes`` payload bytes in ``n_items`` items
        (pages, requests or copies). KeyError (naming the file) if the op is absent; use
        :meth:`has` first. ValueError on negative arguments."""
        if nbytes < 0 or n_items < 0:
            raise ValueError("nbytes and n_items must be >= 0")
        if op not in self.ops:
            raise KeyError(f"{self.path}: no calibration for op '{op}' (have: {sorted(self.ops)})")
        return self.ops[op].time(nbytes, n_items)

    # ---------------------------------------------------------------- tables
    @staticmethod
    def _interp1(xs, ys, x):
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] * (x / xs[-1])
        i = bisect.bisect_right(xs, x) - 1
        f = (x - xs[i]) / (xs[i + 1] - xs[i])
        return ys[i] + f * (ys[i + 1] - ys[i])

    def decode_attention_time(self, batch: int, kv_tokens_per_seq: int) -> float:
        """Seconds of one decode step's attention over all layers for ``batch`` sequences of
        ``kv_tokens_per_seq`` cached tokens each. KeyError if the file has no table."""
        if self._attn is None:
            raise KeyError(f"{self.path}: no decode_attention table")
        bs, ks, t, layers = self._attn
        if batch <= 0 or kv_tokens_per_seq <= 0:
            return 0.0
        col = [self._interp1(ks, list(t[i]), kv_tokens_per_seq) for i in range(len(bs))]
        return layers * self._interp1(bs, col, batch)

    def gemm_time(self, tokens: int) -> float:
        """Seconds of the dense projections (QKV, O, gate/up, down) of all layers for
        ``tokens`` tokens in one forward pass. KeyError if the file has no table."""
        if self._gemm is None:
            raise KeyError(f"{self.path}: no gemm table")
        tok, sec, layers = self._gemm
        if tokens <= 0:
            return 0.0
        return layers * self._interp1(tok, sec, tokens)


def load_calibration(path) -> Calibration:
    """Load a calibration JSON. Raises :class:`CalibrationError` naming the file (and key)
    when the file is missing, is not JSON, or a required key is missing or mistyped."""
    p = Path(path)
    if not p.is_file():
        raise CalibrationError(f"calibration file not found: {p}")
    try:
        data = json.loads(p.read_text(encoding="utf-8-sig"))  # (a BOM, as traces allow one)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CalibrationError(f"{p}: not readable as JSON ({e})") from e
    if not isinstance(data, dict):
        raise CalibrationError(f"{p}: top level must be an object")
    return Calibration(data, str(p))


def fit_affine(points, min_bw: float = 1.0) -> tuple[dict, float]:
    """Fit seconds = a + b * n_items + nbytes / bw to ``points`` [(nbytes, n_items, seconds)],
    minimising relative error, all coefficients >= 0 (terms that come out negative are
    dropped and the fit repeated). Returns (coefficients dict, median abs relative error)."""
    P = np.asarray(points, dtype=float)
    y = P[:, 2]
    cols = {"overhead_s": np.ones(len(P)), "per_item_s": P[:, 1], "inv_bw": P[:, 0]}
    active = list(cols)
    if np.ptp(P[:, 1]) == 0:  # n_items never varies: it cannot be told from the overhead
        active.remove("per_item_s")
    while True:
        A = np.stack([cols[c] for c in active], axis=1) / y[:, None]
        coef, *_ = np.linalg.lstsq(A, np.ones(len(P)), rcond=None)
        neg = [c for c, v in zip(active, coef) if v < 0]
        if not neg:
            break
        active.remove(min(neg, key=lambda c: coef[active.index(c)]))
        if not active:
            break
    res = {"overhead_s": 0.0, "per_item_s": 0.0, "inv_bw": 0.0}
    for c, v in zip(active, coef if active else []):
        res[c] = float(v)
    pred = res["overhead_s"] + res["per_item_s"] * P[:, 1] + res["inv_bw"] * P[:, 0]
    err = float(np.median(np.abs(pred - y) / y))
    bw = 1.0 / res["inv_bw"] if res["inv_bw"] > 0 else 0.0
    return {"overhead_s": res["overhead_s"], "per_item_s": res["per_item_s"],
            "bandwidth_Bps": bw if bw == 0.0 else max(bw, min_bw)}, err


__all__ = ["Calibration", "CalibrationError", "OpFit", "load_calibration", "fit_affine", "OP_NAMES",
           "OPERATOR_TABLES"]
