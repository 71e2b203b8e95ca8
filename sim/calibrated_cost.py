"""Calibrated per-operator step times (``cost.kind=calibrated``).

:class:`CalibratedOperatorModel` is :class:`sim.operator_cost.OperatorCostModel` with the GPU
work of a step read from a calibration file's ``operators`` section (``python -m
gpu_validation.calibrate --model CARD``: per-GPU times of the card's shapes at each TP degree,
README of gpu_validation), term by term where the file has the shapes:

* ``gemm``: each projection of a layer (QKV, O, gate_up, down; MLA's q_a, q_b, kv_a, kv_b, o;
  shared experts) and lm_head, by ``(dtype, n, k)``, linear in the token count ``m`` between
  the measured ``m``, the first point's time below it, proportional above the last; summed over
  the layers that have it. Used when the weights are stored in the GEMM's dtype (BF16/FP16
  weights and ``gemm_precision`` bf16, or FP8 weights on FP8 GEMMs) and every projection's
  shape is in the file.
* ``experts``: routed experts' grouped GEMMs (gate_up, down) by ``(dtype, n, k)``, linear in
  the token count, times the MoE layers; the same dtype condition.
* ``decode_attention`` / ``prefill_attention``: per layer by ``(kv dtype, q heads, kv heads,
  head_dim)`` of one rank, bilinear in (batch, mean KV tokens) and (new tokens, context tokens)
  over the measured grid (edges held below it, scaled in proportion above it), times the
  full-attention layers; GQA without sliding-window layers only.

Every other term (host time, collectives, per-layer overhead; any term whose shapes or dtype
the file lacks) is the operator model's, and ``summary.json["cost_model"]`` lists which came
from where, with the reason for each fallback. Host/disk copies, codecs and the compaction
mover read the same file (``self.calibration``).
"""

from __future__ import annotations

import re

import numpy as np

from .cost import CALIBRATION_DIR, gpu_short_name, resolve_calibration_path
from .errors import ConfigError
from .hardware import kv_dtype_bytes
from .operator_cost import OperatorCostModel


def _curve(xs, ys):
    """A function of ``x`` (scalar or array): linear between the points ``(xs, ys)`` (xs
    ascending), ``ys[0]`` below ``xs[0]``, ``ys[-1] x / xs[-1]`` above ``xs[-1]``."""
    xs = np.asarray(xs, np.float64)
    ys = np.asarray(ys, np.float64)

    def f(x):
        x = np.asarray(x, np.float64)
        return np.where(x > xs[-1], ys[-1] * x / xs[-1], np.interp(x, xs, ys))
    return f


def _grid(rows, xkey, ykey, tkey, below_x: str = "hold"):
    """Bilinear interpolation over a measured grid of ``rows`` (dicts with ``xkey``, ``ykey``
    and the time ``tkey``): a function of ``(x, y)`` (scalars or arrays, broadcast). Along
    ``y`` each measured ``x`` is a :func:`_curve` of its own points; along ``x`` the same rule
    (linear between, proportional above the last), and below the first ``x`` its value held
    (``below_x="hold"``: a kernel's floor) or scaled in proportion (``"proportional"``: a
    prefill chunk shorter than the smallest measured one does proportionally less work)."""
    xs = np.array(sorted({r[xkey] for r in rows}), np.float64)
    curves = []
    for x in xs:
        pts = sorted((r[ykey], r[tkey]) for r in rows if r[xkey] == x)
        curves.append(_curve([p[0] for p in pts], [p[1] for p in pts]))

    def f(x, y):
        x, y = np.broadcast_arrays(np.atleast_1d(np.asarray(x, np.float64)),
                                   np.atleast_1d(np.asarray(y, np.float64)))
        cols = np.stack([c(y) for c in curves])  # (len(xs),) + y.shape
        scale_below = below_x == "proportional"
        if len(xs) == 1:
            return np.where((x > xs[0]) | scale_below, cols[0] * x / xs[0], cols[0])
        i = np.clip(np.searchsorted(xs, x, side="right") - 1, 0, len(xs) - 2)
        w = np.clip((x - xs[i]) / (xs[i + 1] - xs[i]), 0.0, 1.0)
        lo = np.take_along_axis(cols, i[None], 0)[0]
        hi = np.take_along_axis(cols, (i + 1)[None], 0)[0]
        out = lo + w * (hi - lo)
        if scale_below:
            out = np.where(x < xs[0], cols[0] * x / xs[0], out)
        return np.where(x > xs[-1], cols[-1] * x / xs[-1], out)
    return f


class CalibratedOperatorModel(OperatorCostModel):
    """See the module docstring. Args: as :class:`sim.operator_cost.OperatorCostModel`;
    ``cost.file`` names the calibration (:func:`sim.cost.resolve_calibration_path`). Raises
    ConfigError for a missing or invalid file, or one measured on another GPU (its
    ``device.name`` must contain :func:`sim.cost.gpu_short_name` of the card)."""

    def __init__(self, model, gpu, cache, cost):
        super().__init__(model, gpu, cache, cost)
        from gpu_validation.calibration_model import CalibrationError, load_calibration

        self.path = resolve_calibration_path(cost, gpu)
        try:
            self.calibration = load_calibration(self.path)
        except CalibrationError as e:
            raise ConfigError(f"cost.kind=calibrated: {e}") from None
        cal = self.calibration
        dev = str(cal.device.get("name", ""))
        if gpu_short_name(gpu) not in re.sub(r"[^a-z0-9]", "", dev.lower()):
            raise ConfigError(
                f"cost.kind=calibrated: {self.path} was measured on {dev or 'an unnamed device'}, "
                f"but gpu={gpu.name}; expected a calibration of this GPU (cost.file), or "
                f"cost.kind=operator")
        self.reasons: dict[str, str] = {}
        self._gemm_cal = None
        self._expert_cal = None
        self._dec_cal = None
        self._pre_cal = None
        ops = cal.operators
        if ops is None:
            why = f"{self.path} has no operators section (gpu_validation.calibrate --model CARD)"
            for term in ("gemm", "experts", "decode_attention", "prefill_attention"):
                self.reasons[term] = why
        else:
            self._setup(model, cache, ops)
        if self.tp > 1:
            self.reasons["collectives"] = "operator model: NVLink from the GPU card (one-GPU calibration)"

    # ------------------------------------------------------------- tables
    def _setup(self, model, cache, ops):
        tp = self.tp
        q = int(model.num_q_heads) // tp
        kv = max(int(model.num_kv_heads) // tp, 1)
        h = int(model.hidden_size)
        gate = 2 if model.mlp_gated else 1
        quant = str(model.weight_quant).lower()
        if quant in ("none", "") and self.gemm_precision == "bf16":
            dt = "bf16"
        elif quant == "fp8" and self.gemm_precision == "fp8":
            dt = "fp8"
        else:
            dt = None
            why = (f"weights {model.weight_quant} on {self.gemm_precision} GEMMs: the calibration "
                   f"times bf16 x bf16 and fp8 x fp8 GEMMs only")
            self.reasons["gemm"] = why
            self.reasons["experts"] = why
        p = self.p
        L, Ld, Lm = p.num_layers, p.num_dense_layers, p.num_moe_layers
        proj = []  # (n, k, layers)
        if model.attention == "mla":
            rope, nope, v = int(model.qk_rope_head_dim), int(model.qk_nope_head_dim), int(model.v_head_dim)
            qk, kvl, ql = nope + rope, int(model.kv_lora_rank), int(model.q_lora_rank)
            if ql:
                proj += [(ql, h, L), (q * qk, ql, L)]
            else:
                proj += [(q * qk, h, L)]
            proj += [(kvl + rope, h, L), (q * (nope + v), kvl, L), (h, q * v, L)]
        else:
            hd = int(model.head_dim)
            proj += [((q + 2 * kv) * hd, h, L), (h, q * hd, L)]
        if Ld:
            it = int(model.intermediate_size) // tp
            proj += [(gate * it, h, Ld), (h, it, Ld)]
        if Lm and int(model.num_shared_experts):
            w = int(model.num_shared_experts) * int(model.moe_intermediate_size) // tp
            proj += [(gate * w, h, Lm), (h, w, Lm)]
        head = (-(-int(model.vocab_size) // tp), h)
        if dt is not None:
            rows = self._rows(ops["gemm"], dt)
            miss = [(n, k) for n, k, _ in proj if (n, k) not in rows]
            if head not in self._rows(ops["gemm"], "bf16"):
                miss.append(head)
            if miss:
                self.reasons["gemm"] = (f"{self.path} lacks {dt} GEMM shapes (n, k) {miss[:4]} of "
                                        f"{model.name} at tp {tp}")
            else:
                self._gemm_cal = ([(_curve(*rows[(n, k)]), n_layers) for n, k, n_layers in proj],
                                  _curve(*self._rows(ops["gemm"], "bf16")[head]))
            if Lm:
                w = int(model.moe_intermediate_size) // tp
                g = self._rows(ops["grouped_gemm"], dt, x="tokens")
                shapes = [(gate * w, h), (h, w)]
                if all(s in g for s in shapes):
                    self._expert_cal = [_curve(*g[s]) for s in shapes]
                else:
                    self.reasons["experts"] = (f"{self.path} lacks {dt} grouped expert GEMMs "
                                               f"{shapes} of {model.name} at tp {tp}")
        kvd = "fp8" if kv_dtype_bytes(model, cache) == 1.0 else "bf16"
        if model.attention != "gqa" or self.win_layers:
            why = "calibrated for GQA attention without sliding-window layers only"
            self.reasons["decode_attention"] = why
            self.reasons["prefill_attention"] = why
            return
        shape = dict(kv_dtype=kvd, q_heads=q, kv_heads=kv, head_dim=int(model.head_dim))
        for table, term, x, y in (("attention_decode", "decode_attention", "batch", "kv_tokens"),
                                  ("attention_prefill", "prefill_attention", "new_tokens",
                                   "context_tokens")):
            rows = [r for r in ops[table] if all(r[k] == v for k, v in shape.items())]
            graph = [r for r in rows if r.get("mode") == "graph"]
            rows = graph or rows
            if not rows:
                self.reasons[term] = (f"{self.path} has no {table} rows for {kvd} KV, {q} query / "
                                      f"{kv} KV heads of {shape['head_dim']} ({model.name}, tp {tp})")
                continue
            f = _grid(rows, x, y, "seconds_per_layer",
                      below_x="hold" if term == "decode_attention" else "proportional")
            if term == "decode_attention":
                self._dec_cal = f
            else:
                self._pre_cal = f

    @staticmethod
    def _rows(rows, dtype, x="m"):
        """``{(n, k): (xs, seconds)}`` of the rows of ``dtype``, CUDA-graph rows where a shape
        has them, sorted by ``x``."""
        out: dict = {}
        for mode in ("eager", "graph"):  # (graph rows replace eager ones of the same shape)
            by: dict = {}
            for r in rows:
                if r["dtype"] == dtype and r.get("mode", "graph") == mode:
                    by.setdefault((r["n"], r["k"]), []).append((r[x], r["seconds"]))
            for key, pts in by.items():
                pts.sort()
                out[key] = ([p[0] for p in pts], [p[1] for p in pts])
        return out

    # -------------------------------------------------------------- terms
    def gemm_time(self, tokens, samples):
        """Linear layers (s): calibrated projections, experts and lm_head where the file has
        them (module docstring), the operator roofline elsewhere."""
        if self._gemm_cal is None and self._expert_cal is None:
            return super().gemm_time(tokens, samples)
        tok = np.asarray(tokens, np.float64)
        s = np.asarray(samples, np.float64)
        t = 0.0
        if self._gemm_cal is not None:
            curves, head = self._gemm_cal
            for c, layers in curves:
                t = t + layers * c(tok)
            t = t + np.where(s > 0, head(np.maximum(s, 1)), 0.0)
        else:
            for params, bpp, fs in self._groups:
                if params:
                    t = t + self._roofline(params, bpp, fs, tok, self._bytes_s)
            params, bpp, fs = self._lm_head
            t = t + np.where(s > 0, self._roofline(params, bpp, fs, s, self._bytes_s), 0.0)
        if self._expert[0]:
            if self._expert_cal is not None:
                t = t + self.p.num_moe_layers * sum(c(tok) for c in self._expert_cal)
            else:
                params, bpp, fs = self._expert
                touched = np.asarray(self.E * (1.0 - (1.0 - self.k / self.E) ** tok)) / self.E
                t = t + np.maximum(2.0 * tok * self.k * params / self.E / fs,
                                   touched * params * bpp / self._bytes_s)
        return t

    def _dense_decode_args(self, ctx0):
        """None with calibrated decode attention (the compiled loop is the roofline's)."""
        return None if self._dec_cal is not None else super()._dense_decode_args(ctx0)

    def _attention_parts(self, new_tokens, context_tokens):
        d, p = super()._attention_parts(new_tokens, context_tokens)
        dec = new_tokens == 1
        if self._dec_cal is not None and dec.any():
            b = int(np.count_nonzero(dec))
            kv_mean = (float(np.sum(context_tokens[dec], dtype=np.float64)) + b) / b
            d = float(self.full_layers * self._dec_cal(b, kv_mean)[0])
        if self._pre_cal is not None and (~dec).any():
            n = new_tokens[~dec].astype(np.float64)
            c = context_tokens[~dec].astype(np.float64)
            p = float(self.full_layers * np.sum(self._pre_cal(n, c)))
        return d, p

    def step_time(self, new_tokens, context_tokens, samples):
        """Duration of one engine step (s), as the operator model with the calibrated terms."""
        if self._dec_cal is None:
            return super().step_time(new_tokens, context_tokens, samples)
        b = len(new_tokens)
        t = int(new_tokens.sum())
        prefill = bool(b) and int(new_tokens.max()) > 1
        d, p = self._attention_parts(new_tokens, context_tokens)
        return float(self.host_time(b, prefill)) + self.linear_time(t, samples) + d + p

    def _decode_times(self, ctx0, k, first=0, shift=0):
        """``k`` pure-decode steps with calibrated decode attention (shape ``(k,)``, s); each
        equals :meth:`step_time` of that step."""
        if self._dec_cal is None:
            return super()._decode_times(ctx0, k, first, shift)
        b, _, sum_c = self._decode_ctx_sums(ctx0, k, first, shift)
        kv_mean = (sum_c + b) / b
        return self._fixed_step_times(b)[b] + self.full_layers * self._dec_cal(b, kv_mean)

    def describe(self, codec=None, disk: bool = False, compaction: bool = False) -> dict:
        """Which terms came from the calibration file and which from the operator model."""
        d = super().describe(codec, disk, compaction)
        cal = self.calibration
        reasons = dict(self.reasons)
        done = [t for t, ok in (("gemm", self._gemm_cal), ("experts", self._expert_cal),
                                ("decode_attention", self._dec_cal),
                                ("prefill_attention", self._pre_cal)) if ok is not None]
        if not self._expert[0]:
            reasons.pop("experts", None)
        if codec is not None:
            for dd, fused in (("d2h", "encode_d2h_fused"), ("h2d", "h2d_decode_fused")):
                op = dd if codec == "identity" else f"{codec}_{fused}"
                if cal.has(op):
                    done.append(f"{dd} ({op})")
                else:
                    reasons[dd] = f"{self.path} has no op {op!r}: PCIe link + codec roofline"
            if disk:
                reasons["disk_read_write"] = "disk links are not calibrated (tiers.disk_* settings)"
        if compaction:
            if cal.has("compaction_move"):
                done.append("compaction_move")
            else:
                reasons["compaction_move"] = f"{self.path} has no op 'compaction_move'"
            reasons["compaction_scoring"] = "policy scoring bytes at HBM bandwidth x mbu"
        try:
            file = str(self.path.resolve().relative_to(CALIBRATION_DIR.parent.parent))
        except ValueError:
            file = str(self.path)
        d.update({"kind": "calibrated", "file": file, "device": cal.device.get("name"),
                  "calibration_date": cal.date, "calibrated": done,
                  "analytic_fallback": sorted(reasons), "fallback_reasons": reasons})
        return d
