"""ServeGen (Xiang et al., arXiv 2505.09999) DeepSeek-R1 per-client distributions -> sampled requests.

Folder layout: ``chunk-N-trace.csv`` (no header; one row per 600 s window of client N over a day:
``window_start_s, rate (req/s), cv, pattern (Gamma | Weibull | empty = idle), shape, scale``) and
``chunk-N-dataset.json`` (``{window_start_s: {"input_tokens": "<dict literal>", "output_tokens":
..., "reason_ratio": ...}}``, PMFs as Python dict literals, 6 h windows; parsed with
``ast.literal_eval``; an empty dict = no data).

Format rules (each a TraceError naming the file, and the line or window where there is one; a bad
trace.csv row is skipped and counted with ``on_error=skip``, any other is an error either way):

* ``trace.path`` is the folder (a file is an error: ``trace.clients=[N]`` picks clients). Client
  N's files are named exactly ``chunk-N-trace.csv`` (N in ASCII digits; other names are not
  read) and, beside it, the same name ending ``-dataset.json``. Two trace files of one client
  number (``chunk-1-trace.csv`` and ``chunk-01-trace.csv``) are an error naming both; so is a
  client listed twice in ``trace.clients`` (it would be sampled twice), or a folder by a chunk
  file's name.
* trace.csv: UTF-8 text (a leading BOM skipped; blank lines at the end dropped); 6 fields, none
  longer than ``csv.field_size_limit()`` (131,072 characters); every field but ``pattern`` an
  ASCII decimal number (``600``, ``0.25``, ``1e-3``; not ``nan``/``inf``), finite and >= 0;
  ``window_start_s`` a multiple of 600, each once. ``cv`` is checked so but not used: the
  sampled process's cv is that of its family and ``shape`` (Gamma: 1/sqrt(shape), which the
  published Gamma rows' cv matches to 2e-8; the published Weibull rows' cv differs from their
  shape's by up to 3.2x, so cv is not compared with the shape).
* dataset.json: UTF-8 JSON (a leading BOM skipped), an object whose keys appear once (in every
  object: json itself keeps the last of a repeated key); each window key a plain ASCII decimal
  (``21600`` or ``21600.0``; not ``nan``, ``-inf``, ``1e309``), a multiple of 21600 s (the
  6 h windows: a start off that grid would overlap its neighbours), each start once.

Sampling (seeded, one independent ``numpy.random.Generator`` per client from
``SeedSequence([seed, client])``):

* Inter-arrival times within a window are a renewal process of the window's family: Gamma(shape
  k, scale theta) or theta * Weibull(k) (numpy's conventions). In the files ``k`` reproduces the
  window's cv exactly for Gamma (cv = 1/sqrt(k)) and k*theta ~= 1/rate for most windows, so
  shape/scale are fits of the inter-arrival time in seconds. ``servegen_iat=rate`` (default)
  keeps the fitted family and shape but rescales theta so the mean inter-arrival equals 1/rate
  (some fits are off by up to 4000x, which would flood a window); ``fit`` uses theta as given.
  Each window restarts the process at its start; arrivals past the window end are dropped. Idle
  windows (empty pattern or rate 0) produce nothing. Of a client's arrivals in a window only the
  first ``num_requests`` minus those of the windows already ended are kept (the later ones cannot
  be among the first ``num_requests``); its draws stop at the window's end, or once they number
  ``MAX_WINDOW_ARRIVALS`` (more than a valid row expects) and hold those, or with a TraceError at
  ``MAX_WINDOW_DRAWS``. (Token lengths are drawn for all of the window's arrivals before the
  cut, so the generator's stream, and the sample, are those of an uncut window.)
* Limits (an active row outside them is a TraceError naming the file, line and field): a renewal
  process restarted at the window start has about ``T/mean + (cv**2 - 1)/2`` arrivals in a window
  of length T (cv: the inter-arrival time's std / mean), so both terms are bounded:
  ``rate x 600 s`` and ``600 s / mean`` of the fitted shape and scale (checked whichever
  ``servegen_iat``: the fit is data) at most ``MAX_WINDOW_ARRIVALS`` (1,000,000), and the cv
  implied by the pattern and shape at most ``MAX_IAT_CV`` (1000: Gamma shape >= 1e-6, Weibull
  shape >= 0.0888), so ``(cv**2 - 1)/2`` stays below ``MAX_WINDOW_ARRIVALS`` too.
* Input and output lengths are drawn independently from the PMFs of the 6 h dataset window
  containing the arrival (the file gives marginals only). A window whose PMF is empty uses the
  nearest window with data (ties: the earlier). ``reason_ratio`` is drawn likewise and returned in
  ``Workload.extra['reason_ratio']``.
* Clients are merged by time from ``start_s`` and the first ``num_requests`` are kept. Every
  request is a single-shot root without prefix identity (G = 0).
"""
from __future__ import annotations

import ast
import json
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from .._common import Parsed, check_choice, short_repr
from .._io import binary_at, csv_row, decode_utf8, iter_lines
from ..errors import ErrorSink, TraceError
from ..registry import TraceFormat, register

WINDOW_S = 600.0
DATASET_WINDOW_S = 6 * 3600.0  # the dataset.json PMF windows (6 h)
PMF_FIELDS = ("input_tokens", "output_tokens", "reason_ratio")
_CHUNK_RE = re.compile(r"chunk-([0-9]+)-trace\.csv")  # (fullmatch: ASCII digits, the whole name)
_DATASET_RE = re.compile(r"chunk-([0-9]+)-dataset\.json")
# a trace.csv number and a dataset.json window key, ASCII only (float() also takes 'nan', 'inf',
# '1_000' and non-ASCII digits)
_CSV_NUM_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_KEY_RE = re.compile(r"[0-9]+(?:\.[0-9]+)?")
# a plain {number: number, ...} literal (what ServeGen files hold) is parsed as JSON; anything else
# goes through ast.literal_eval (same result, and its errors)
# (atomic groups and possessive quantifiers: a failed match takes linear time, not quadratic in a
# run of digits or spaces)
_NUM = r"(?>[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?))"
_PMF_RE = re.compile(
    rf"\s*+\{{\s*+(?:{_NUM}\s*+:\s*+{_NUM}\s*+(?:,\s*+{_NUM}\s*+:\s*+{_NUM}\s*+)*+,?+\s*+)?+\}}\s*+\Z")
# the largest token count a PMF may hold: far above any model's context, and a trace's token
# sums stay well inside int64
MAX_PMF_TOKENS = 2**31 - 1
# Expected arrivals one window row may ask for (module docstring). The loader draws one client's
# window at a time, in buffers of 1.5x the expected count, and holds its arrivals with three token
# draws each: about 100 MB per million arrivals, beside the requests kept (of each client's
# window at most the requests still wanted). The published folder's largest are 11,267 (rate
# 18.8 req/s) and, from its fits' means, 65,275.
MAX_WINDOW_ARRIVALS = 1_000_000
# Largest inter-arrival cv (std / mean): (cv**2 - 1)/2 is the renewal process's extra arrivals at a
# window start (bursts of near-zero gaps: a Gamma of shape k draws about 1/k of them), kept below
# MAX_WINDOW_ARRIVALS. The published folder's largest is 9.1 (Gamma shape 0.012).
MAX_IAT_CV = math.sqrt(MAX_WINDOW_ARRIVALS)
# Arrivals a window may draw without reaching its end before sampling stops with an error (10x the
# most a valid row expects: a guard, so that no row can make the draw loop run on, e.g. when
# start_s falls inside a window whose draws pile up before it).
MAX_WINDOW_DRAWS = 10 * MAX_WINDOW_ARRIVALS


def _literal_dict(text: str):
    """``ast.literal_eval(text)``, with a fast path for a flat ``{number: number}`` literal: read
    as the JSON array of its numbers, where JSON and Python agree on every int and float token
    JSON accepts. Any other text (a token JSON lacks, such as ``5.``, ``+5`` or ``007``) goes
    to ``ast.literal_eval``: the same result, and its errors."""
    if _PMF_RE.match(text):
        try:
            flat = json.loads(text.replace("{", "[", 1).replace("}", "]").replace(":", ","))
        except ValueError:
            return ast.literal_eval(text)
        return dict(zip(flat[0::2], flat[1::2]))
    return ast.literal_eval(text)


def _short(x) -> str:
    """``repr(x)``, cut to 40 characters (a key of thousands of digits)."""
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


def parse_pmf(text, *, path: str, window: str, field: str, integer: bool):
    """Parse one PMF dict literal -> (values, probabilities) numpy arrays, or None if empty.
    ``integer``: keys are token counts (int64 values in [1, ``MAX_PMF_TOKENS``]), else ratios
    in [0, 1] (float64; ServeGen's ``reason_ratio``: the reasoning share of the output).

    Raises:
        TraceError: not a dict literal, bad key/probability, or probabilities not summing to 1
            within 1e-6.
    """
    import numpy as np
    where = f"window '{window}'"
    if isinstance(text, dict):
        d = text
    else:
        if not isinstance(text, str):
            raise TraceError(path=path, where=where, field=field, found=type(text).__name__,
                             expected="a string holding a dict literal")
        try:
            d = _literal_dict(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError) as e:
            raise TraceError("unparsable PMF", path=path, where=where, field=field,
                             found=f"{type(e).__name__}: {str(e)[:60]}",
                             expected="a Python dict literal {value: probability}") from None
    if not isinstance(d, dict):
        raise TraceError(path=path, where=where, field=field, found=type(d).__name__,
                         expected="a dict literal {value: probability}")
    if not d:
        return None
    keys, probs = [], []
    for k, v in d.items():
        if integer:
            ok = isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= MAX_PMF_TOKENS
        else:
            ok = isinstance(k, (int, float)) and not isinstance(k, bool) and 0 <= k <= 1
        if not ok:
            raise TraceError(path=path, where=where, field=field, found=f"key {_short(k)}",
                             expected=f"integer token counts in [1, {MAX_PMF_TOKENS}]" if integer
                             else "ratios in [0, 1]")
        ok = isinstance(v, (int, float)) and not isinstance(v, bool)
        if ok:
            try:
                v = float(v)
            except OverflowError:  # an int beyond any float
                ok = False
        if not ok or not (v >= 0) or math.isinf(v):
            raise TraceError(path=path, where=where, field=field,
                             found=f"probability {_short(v)} for {_short(k)}",
                             expected="a finite probability >= 0")
        keys.append(k)
        probs.append(v)
    total = math.fsum(probs)
    if abs(total - 1.0) > 1e-6:
        raise TraceError("PMF does not sum to 1", path=path, where=where, field=field,
                         found=f"sum {total:.9g}", expected="1 within 1e-6")
    return np.asarray(keys, dtype=np.int64 if integer else np.float64), np.asarray(probs)


def _iat_cv(pat: str, k: float) -> float:
    """Coefficient of variation (std / mean) of the inter-arrival time of family ``pat`` with shape
    ``k`` > 0 (the scale cancels): Gamma ``1/sqrt(k)``, Weibull ``sqrt(G(1+2/k)/G(1+1/k)**2 - 1)``
    (G: the gamma function); inf where that overflows."""
    if pat == "Gamma":
        return 1.0 / math.sqrt(k)
    try:
        cv = math.sqrt(math.expm1(math.lgamma(1.0 + 2.0 / k) - 2.0 * math.lgamma(1.0 + 1.0 / k)))
    except (OverflowError, ValueError):
        return math.inf
    return cv if cv == cv else math.inf  # nan: inf - inf for a subnormal shape


def _fit_mean(pat: str, k: float, theta: float) -> float:
    """Mean inter-arrival time (s) of the fitted Gamma(k, theta) (``k x theta``) or
    ``theta x Weibull(k)`` (``theta x G(1 + 1/k)``); inf where it overflows."""
    if pat == "Gamma":
        return k * theta
    try:
        return theta * math.exp(math.lgamma(1.0 + 1.0 / k))
    except OverflowError:
        return math.inf


def _min_shape(pat: str) -> float:
    """The least shape whose inter-arrival cv is at most ``MAX_IAT_CV`` (the cv falls as the shape
    grows): ``1 / MAX_IAT_CV**2`` for Gamma, by bisection for Weibull."""
    if pat == "Gamma":
        return 1.0 / MAX_IAT_CV**2
    lo, hi = 1e-12, 1.0
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if _iat_cv(pat, mid) <= MAX_IAT_CV:
            hi = mid
        else:
            lo = mid
    return hi


_MIN_SHAPE = {pat: _min_shape(pat) for pat in ("Gamma", "Weibull")}


def _check_window(p: str, where: str, rate: float, pat: str, k: float, theta: float) -> None:
    """Raise a TraceError naming the field if an active window (pattern set, rate > 0, shape and
    scale > 0) is outside the limits of the module docstring."""
    if rate * WINDOW_S > MAX_WINDOW_ARRIVALS:
        raise TraceError(path=p, where=where, field="rate", found=repr(rate),
                         expected=f"at most {MAX_WINDOW_ARRIVALS:,} expected arrivals per "
                                  f"{WINDOW_S:g} s window (rate <= "
                                  f"{MAX_WINDOW_ARRIVALS / WINDOW_S:.6g} req/s)")
    if not k >= _MIN_SHAPE[pat]:
        raise TraceError(path=p, where=where, field="shape",
                         found=f"{k!r} (inter-arrival cv {_iat_cv(pat, k):.3g})",
                         expected=f"an inter-arrival cv (std/mean) <= {MAX_IAT_CV:g}: {pat} "
                                  f"shape >= {_MIN_SHAPE[pat]:.4g}")
    mean = _fit_mean(pat, k, theta)
    lo = WINDOW_S / MAX_WINDOW_ARRIVALS
    if not (lo <= mean < math.inf):
        form = "shape x scale" if pat == "Gamma" else "scale x G(1 + 1/shape)"
        raise TraceError(path=p, where=where, field="scale",
                         found=f"{theta!r} (mean inter-arrival {form} = {mean:.3g} s)",
                         expected=f"a finite mean inter-arrival >= {lo:g} s (at most "
                                  f"{MAX_WINDOW_ARRIVALS:,} arrivals per {WINDOW_S:g} s window)")


def _read_windows(path: Path,
                  sink: ErrorSink) -> list[tuple[float, float, float, str, float, float, int]]:
    """Rows of one chunk-N-trace.csv, sorted by window start: ``(window_start_s, rate, cv,
    pattern, shape, scale, line)``; a bad row goes to ``sink`` (TraceError naming the line)."""
    p = str(path)
    out = []
    seen = {}
    names = ("window_start_s", "rate", "cv", "pattern", "shape", "scale")
    # (read as the other formats' line files are: a leading BOM is not data, blank lines at the
    # end are dropped, a blank line before a row is a row of 0 fields)
    try:
        lines = list(iter_lines(path, "a CSV text file"))  # (about 144 short rows a file)
    except OSError as e:
        raise TraceError("unreadable file", path=p, found=f"{type(e).__name__}: {e.strerror}",
                         expected="a readable chunk-N-trace.csv file") from None
    for i, raw in lines:
        where = f"line {i}"
        try:
            rec = csv_row(decode_utf8(raw, path=p, where=where), path=p, where=where,
                          columns=names) if raw else []
            if len(rec) != 6:
                raise TraceError(path=p, where=where, found=f"{len(rec)} fields",
                                 expected="6 fields: window_start_s,rate,cv,pattern,shape,scale")
            vals = []
            for name, v in zip(names, rec):
                if name == "pattern":
                    vals.append(v.strip())
                    continue
                if not _CSV_NUM_RE.fullmatch(v.strip()):  # (float() takes 'nan', '1_0', '١')
                    raise TraceError(path=p, where=where, field=name, found=short_repr(v),
                                     expected="a number (ASCII decimal, e.g. 600, 0.25 or 1e-3)")
                x = float(v)
                if not math.isfinite(x) or x < 0:
                    raise TraceError(path=p, where=where, field=name, found=short_repr(v),
                                     expected="a finite number >= 0")
                vals.append(x)
            w0, rate, cv, pat, k, theta = vals
            if pat not in ("", "Gamma", "Weibull"):
                raise TraceError(path=p, where=where, field="pattern", found=short_repr(pat),
                                 expected="'Gamma', 'Weibull' or empty (idle)")
            if pat and rate > 0 and not (k > 0 and theta > 0):
                raise TraceError(path=p, where=where, field="shape/scale", found=f"{k}/{theta}",
                                 expected="> 0 for an active window")
            if pat == "" and rate > 0:
                raise TraceError(path=p, where=where, field="pattern", found="empty (idle)",
                                 expected=f"a distribution for rate {rate} > 0")
            if pat and rate > 0:
                _check_window(p, where, rate, pat, k, theta)
            if w0 % WINDOW_S:
                # (windows are WINDOW_S long: a start off the grid overlaps its neighbours, whose
                # arrivals would be drawn twice over the overlap)
                raise TraceError(path=p, where=where, field="window_start_s", found=rec[0].strip(),
                                 expected=f"a multiple of {WINDOW_S:g} s (one row per "
                                          f"{WINDOW_S:g} s window)")
            if w0 in seen:
                raise TraceError("duplicate window", path=p, where=where, field="window_start_s",
                                 found=w0, expected=f"unique window starts (first at line {seen[w0]})")
        except TraceError as e:
            sink.bad(e)
            continue
        seen[w0] = i
        out.append((w0, rate, cv, pat, k, theta, i))
    out.sort()
    return out


def _label(key: str) -> str:
    """A dataset.json window key for a message, cut to 40 characters."""
    return key if len(key) <= 40 else f"{key[:37]}..."


def _no_repeats(pairs: list) -> dict:
    """``object_pairs_hook`` of json: a dict, or ValueError naming a key given twice (json
    itself keeps the last silently)."""
    d = dict(pairs)
    if len(d) < len(pairs):
        seen: set = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"key {_short(k)} given twice in one object")
            seen.add(k)
    return d


def _read_dataset(path: Path) -> list[tuple[float, dict]]:
    p = str(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise TraceError("unreadable file", path=p, found=f"{type(e).__name__}: {e.strerror}",
                         expected="a readable chunk-N-dataset.json file") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # (a leading UTF-8 BOM is not data)

    def line_col(data: bytes, at: int) -> tuple[int, int]:
        return data.count(b"\n", 0, at) + 1, at - (data.rfind(b"\n", 0, at) + 1) + 1

    at = binary_at(data)
    if at is not None:
        line, col = line_col(data, at)
        raise TraceError("not a JSON text file", path=p, where=f"line {line}",
                         found=f"binary content: byte 0x{data[at]:02x} at column {col}",
                         expected="a chunk-N-dataset.json text file: text on every line")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line, col = line_col(data, e.start)
        raise TraceError("not UTF-8 text", path=p, where=f"line {line}",
                         found=f"byte 0x{data[e.start]:02x} at column {col}",
                         expected="UTF-8 text") from None
    del data
    try:
        d = json.loads(text, object_pairs_hook=_no_repeats)
    except json.JSONDecodeError as e:
        raise TraceError("invalid JSON", path=p, where=f"line {e.lineno}",
                         found=f"{e.msg} (column {e.colno})",
                         expected="a JSON object keyed by window start") from None
    except (ValueError, RecursionError) as e:  # a repeated key; an int of > 4,300 digits; nesting
        raise TraceError("invalid JSON", path=p, found=f"{type(e).__name__}: {str(e)[:80]}",
                         expected="a JSON object keyed by window start, each key once") from None
    if not isinstance(d, dict) or not d:
        raise TraceError(path=p, found=short_repr(d, 40), expected="a non-empty JSON object")
    wins = []
    seen: dict = {}
    for key, fields in d.items():
        where = f"window '{_label(key)}'"
        w0 = float(key) if _KEY_RE.fullmatch(key) else math.nan
        if not (math.isfinite(w0) and w0 % DATASET_WINDOW_S == 0):
            raise TraceError(path=p, where=where, found=_short(key),
                             expected=f"a window start in seconds: a finite decimal number >= 0, "
                                      f"a multiple of {DATASET_WINDOW_S:g} s (6 h windows)")
        if w0 in seen:
            raise TraceError("duplicate window", path=p, where=where, found=f"start {w0:g} s",
                             expected=f"unique window starts (also given as {_short(seen[w0])})")
        seen[w0] = key
        if not isinstance(fields, dict):
            raise TraceError(path=p, where=where, found=type(fields).__name__,
                             expected="an object with input_tokens/output_tokens/reason_ratio")
        pm = {}
        for f in PMF_FIELDS:
            if f not in fields:
                raise TraceError("missing field", path=p, where=where, field=f,
                                 found="nothing", expected="a PMF dict literal")
            pm[f] = parse_pmf(fields[f], path=p, window=_label(key), field=f,
                              integer=f != "reason_ratio")
        wins.append((w0, pm))
    wins.sort(key=lambda x: x[0])
    return wins


def _pmf_for(wins: list, t: float, field: str, p: str):
    """PMF of the dataset window containing t; empty -> nearest window with data."""
    import numpy as np
    starts = [w for w, _ in wins]
    i = max(0, int(np.searchsorted(starts, t, side="right")) - 1)
    if wins[i][1][field] is not None:
        return wins[i][1][field]
    best = None
    for j, (w0, pm) in enumerate(wins):
        if pm[field] is None:
            continue
        dist = abs(j - i)
        if best is None or dist < best[0]:
            best = (dist, pm[field])
    if best is None:
        raise TraceError("no PMF data in any window", path=p, field=field, found="empty dicts",
                         expected="at least one window with data")
    return best[1]


def _iat(rng, pat: str, k: float, theta: float, rate: float, mode: str, size: int) -> np.ndarray:
    if pat == "Gamma":
        if mode == "rate":
            theta = 1.0 / (rate * k)
        return rng.gamma(k, theta, size)
    if mode == "rate":
        theta = 1.0 / (rate * math.gamma(1.0 + 1.0 / k))
    return theta * rng.weibull(k, size)


def load_servegen(path: Path, cfg, rng: np.random.Generator, sink: ErrorSink, seed: int = 0) -> Parsed:
    """Sample ``cfg.num_requests`` requests from a ServeGen client folder (module docstring).

    Memory: one client's window is drawn at a time (a valid row expects at most about 1.5 x
    ``MAX_WINDOW_ARRIVALS`` arrivals: module docstring), and of each client's window at most the
    requests still wanted are kept.

    Raises:
        TraceError: ``path`` not a folder, no chunk files / requested client missing / a client
            listed twice / two trace files of one client number / a chunk name held by a folder,
            text that is not UTF-8, a field past the csv module's limit, a window key off the 6 h
            grid or repeated, malformed trace.csv row (rate, shape or scale outside the limits
            of the module docstring included, naming the file, line and field), unparsable or
            non-normalised PMF, no data, a window whose draws pass ``MAX_WINDOW_DRAWS`` arrivals
            without reaching its end, no arrivals after start_s.
    """
    import numpy as np
    folder = Path(path)
    if not folder.is_dir():
        raise TraceError("not a folder", path=str(folder),
                         found="a file" if folder.is_file() else "not a folder",
                         expected="the folder of chunk-N-trace.csv / chunk-N-dataset.json files",
                         hint="Set trace.path to that folder; to load one client, add "
                              "trace.clients=[N] (e.g. trace.clients=[5] for chunk-5-trace.csv)")
    found: dict = {}
    datasets: dict = {}
    try:
        entries = sorted(folder.iterdir())
    except OSError as e:
        raise TraceError("unreadable folder", path=str(folder),
                         found=f"{type(e).__name__}: {e.strerror}",
                         expected="a readable folder of chunk files") from None
    for f in entries:
        for regex, into in ((_CHUNK_RE, found), (_DATASET_RE, datasets)):
            m = regex.fullmatch(f.name)
            if m:
                into.setdefault(int(m.group(1)), []).append(f)
    for c, fs in found.items():
        if len(fs) > 1:
            raise TraceError("two trace files for one client", path=str(folder),
                             found=" and ".join(f.name for f in fs) + f" (both client {c})",
                             expected="one chunk-N-trace.csv per client number N")
    found = {c: fs[0] for c, fs in found.items()}
    if not found:
        raise TraceError("no chunk-N-trace.csv files", path=str(folder), found="none",
                         expected="chunk-N-trace.csv + chunk-N-dataset.json pairs")
    if cfg.clients is not None:
        clients = list(cfg.clients)
        if not clients:
            raise TraceError(field="clients", found="[]",
                             expected=f"chunk numbers of {folder}, or null for all")
        dup = sorted(c for c, n in Counter(clients).items() if n > 1)
        if dup:
            raise TraceError("repeated client", field="clients", found=f"{clients}",
                             expected=f"each chunk number once ({dup} repeated: a client "
                                      f"listed twice would be sampled twice)")
    else:
        clients = sorted(found)
    per_client = []
    for c in clients:
        if c not in found:
            raise TraceError("unknown client", path=str(folder), field="clients", found=c,
                             expected=f"one of {sorted(found)}")
        trace = found[c]
        ds = trace.with_name(trace.name[: -len("-trace.csv")] + "-dataset.json")
        for f, what in ((trace, "a chunk-N-trace.csv file"), (ds, "a chunk-N-dataset.json file")):
            if f.exists() and not f.is_file():
                raise TraceError("not a file", path=str(f), found="a folder" if f.is_dir() else
                                 "not a regular file", expected=what)
        if not ds.exists():
            other = [f.name for f in datasets.get(c, [])]
            raise TraceError("missing dataset file", path=str(ds), found="no such file" +
                             (f" ({', '.join(other)} spells the number differently)"
                              if other else ""),
                             expected=f"the PMFs of client {c} beside {trace.name}")
        per_client.append((c, _read_windows(trace, sink), _read_dataset(ds), str(ds)))
    # generate window by window (all clients), stop once enough arrivals are after start_s
    t_all, c_all, in_all, out_all, rr_all = [], [], [], [], []
    gens = {c: np.random.default_rng(np.random.SeedSequence([seed, 0x5E2, c])) for c in clients}
    all_starts = sorted({w[0] for _, wins, _, _ in per_client for w in wins})
    count = 0  # arrivals kept so far (at or after start_s)
    sampled = 0  # arrivals drawn at or after start_s (notes['sampled_before_cut'])
    done: list[tuple[float, int]] = []  # (window end, arrivals kept) of each window processed
    by_client_window = {c: {w[0]: w for w in wins} for c, wins, _, _ in per_client}
    for w0 in all_starts:
        if w0 + WINDOW_S <= cfg.start_s:
            continue
        # the arrivals of windows ended by w0 precede all of this window's, and a client's own
        # arrivals here come in time order: its arrivals here past the first `wanted` cannot be
        # among the first num_requests
        wanted = cfg.num_requests - sum(n for w_end, n in done if w_end <= w0)
        end = w0 + WINDOW_S
        in_window = 0
        for c, wins, dsw, dsp in per_client:
            w = by_client_window[c].get(w0)
            if w is None:
                continue
            _, rate, cv, pat, k, theta, line = w
            if rate <= 0 or not pat:
                continue
            g = gens[c]
            ts = []
            t = w0
            kept = drawn = 0
            size = max(16, int(rate * WINDOW_S * 1.5))  # <= 1.5 x MAX_WINDOW_ARRIVALS
            # Ends when the window is full; or once it has drawn MAX_WINDOW_ARRIVALS (more than
            # a valid row expects, so valid windows keep their seeded draws and what follows
            # them) and holds `wanted` arrivals; or with an error at MAX_WINDOW_DRAWS.
            while True:
                cs = t + np.cumsum(_iat(g, pat, k, theta, rate, cfg.servegen_iat, size))
                inside = cs[cs < end]
                full = inside.size < cs.size  # a draw passed the window's end
                drawn += inside.size
                if w0 < cfg.start_s:
                    inside = inside[inside >= cfg.start_s]
                ts.append(inside)
                kept += inside.size
                if full or (kept >= wanted and drawn >= MAX_WINDOW_ARRIVALS):
                    break
                if drawn >= MAX_WINDOW_DRAWS:
                    raise TraceError(
                        "inter-arrival draws do not reach the window's end", path=str(found[c]),
                        where=f"line {line}", field="shape/scale",
                        found=f"{drawn:,} arrivals in [{w0:g}, {cs[-1]:.9g}] s of the "
                              f"{WINDOW_S:g} s window ({pat} shape {k!r}, scale {theta!r})",
                        expected=f"at most {MAX_WINDOW_DRAWS:,} arrivals per window")
                t = cs[-1]
            ts = np.concatenate(ts)
            if not ts.size:
                continue
            pin = _pmf_for(dsw, w0, "input_tokens", dsp)
            pout = _pmf_for(dsw, w0, "output_tokens", dsp)
            prr = _pmf_for(dsw, w0, "reason_ratio", dsp)
            n = ts.size
            tin = g.choice(pin[0], size=n, p=pin[1] / pin[1].sum())
            tout = g.choice(pout[0], size=n, p=pout[1] / pout[1].sum())
            rr = g.choice(prr[0], size=n, p=prr[1] / prr[1].sum())
            sampled += n
            n = min(n, wanted)  # (after the draws: the generator's stream is as if all kept)
            t_all.append(ts[:n])
            c_all.append(np.full(n, c, dtype=np.int64))
            in_all.append(tin[:n])
            out_all.append(tout[:n])
            rr_all.append(rr[:n])
            count += n
            in_window += n
        done.append((end, in_window))
        if count >= cfg.num_requests:
            break
    if count == 0:
        raise TraceError("no arrivals sampled", path=str(folder), found=f"0 requests after start_s={cfg.start_s}",
                         expected="active windows for the chosen clients")
    t = np.concatenate(t_all)
    order = np.argsort(t, kind="stable")[: cfg.num_requests]
    n = order.size
    warnings = []
    if n < cfg.num_requests:
        warnings.append(f"only {n} arrivals in the day after start_s; fewer than num_requests="
                        f"{cfg.num_requests}")
    client = np.concatenate(c_all)[order]
    return Parsed(
        session_id=np.arange(n, dtype=np.int64),
        turn=np.zeros(n, dtype=np.int32),
        arrival_s=t[order],
        think_s=np.zeros(n),
        parent=np.full(n, -1, dtype=np.int64),
        input_tokens=np.concatenate(in_all)[order].astype(np.int64),
        output_tokens=np.concatenate(out_all)[order].astype(np.int64),
        prefix_offsets=np.zeros(n + 1, dtype=np.int64),
        prefix_values=np.zeros(0, dtype=np.int64),
        block_tokens=0,
        source=str(folder),
        warnings=warnings,
        notes={"clients": len(clients), "sampled_before_cut": int(sampled)},
        extra={"reason_ratio": np.concatenate(rr_all)[order], "client": client},
    )

@dataclass
class ServegenOptions:
    """ServeGen's options (the module docstring has the sampling).

    Attributes:
        num_requests: requests to sample (>= 1).
        clients: chunk numbers to read; null: every client in the folder.
        servegen_iat: ``rate`` (fitted family and shape, scale rescaled so the mean
            inter-arrival equals 1/rate of the window) | ``fit`` (shape and scale exactly as in
            the file).
    """

    num_requests: int = 5000
    clients: Optional[list[int]] = None
    servegen_iat: str = "rate"


def _check(c) -> None:
    check_choice(c, "servegen_iat", ("rate", "fit"))
    if c.num_requests < 1:
        raise TraceError(field="num_requests", found=c.num_requests, expected=">= 1")


def _input_files(path: Path) -> Optional[list]:
    """The chunk files of the folder ``path`` that the loader may read, sorted by name; None
    when ``path`` is not a folder."""
    if not path.is_dir():
        return None
    return [(q.name, q) for q in sorted(path.iterdir())
            if (_CHUNK_RE.fullmatch(q.name) or _DATASET_RE.fullmatch(q.name)) and q.is_file()]


register(TraceFormat(
    name="servegen", options=ServegenOptions, check=_check, input="trace folder",
    path_hint="Point trace.path at the folder of chunk-N-trace.csv / chunk-N-dataset.json files "
              "(e.g. `trace.path=/data/traces/servegen_deepseek_r1` on the Hydra command line)",
    default_path="servegen_deepseek_r1", seed_keyed=True, input_files=_input_files,
    load=lambda path, cfg, rng, sink, seed: load_servegen(path, cfg, rng, sink, seed)), __name__)


from .._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
