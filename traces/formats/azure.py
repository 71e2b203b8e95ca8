"""Azure LLM inference traces 2023 (Splitwise, ISCA'24): CSV ``TIMESTAMP`` (wall clock, 100 ns
resolution, e.g. ``2023-11-16 18:17:03.9799600``), ``ContextTokens``, ``GeneratedTokens``.

Format rules (a row breaking one is a TraceError naming the file line and field; with
``on_error=skip`` the row is skipped and counted): the header (line 1) names each column once (a
repeated name is an error naming it; extra columns are allowed and not read); the file is UTF-8;
TIMESTAMP is ``YYYY-MM-DD HH:MM:SS`` optionally followed by ``.`` and 1 to 7 fraction digits,
ASCII digits only, a real date and time; token counts are ASCII integers (optional sign) within
64 bits; blanks around a field are allowed (CSV padding); a field longer than ``csv.field_size_limit()`` (131,072 characters) is an error
naming its column.

Mapping: arrival_s = TIMESTAMP - first row's TIMESTAMP (exact to 100 ns, computed in integer
ticks); input = ContextTokens (>= 1), output = GeneratedTokens. No prefix identity (G = 0, empty
prefix_ids). Open loop. Rows out of time order are stably sorted with a warning (the format is a
request log without ids, so order carries no other meaning; the 2023 files are already in
order). GeneratedTokens = 0 follows ``zero_output`` (the 2023 files have none).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from .._common import INT64_LIMIT, MAX_ARRIVAL_S, Parsed, counted, output_len, short_repr
from .._io import csv_row, decode_utf8, iter_lines
from ..errors import ErrorSink, TraceError
from ..registry import TraceFormat, register

COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_TICKS = 10_000_000  # 100 ns ticks per second


_TS_RE = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,7}))?")


def _parse_ts(s: str, cache: dict) -> int:
    """'YYYY-MM-DD HH:MM:SS[.fffffff]' (ASCII digits, 1-7 fraction digits) -> integer 100 ns
    ticks since the Unix epoch (UTC). Raises ValueError otherwise (strptime alone would take
    non-ASCII digits and one-digit fields)."""
    m = _TS_RE.fullmatch(s.strip())
    if m is None:
        raise ValueError(f"bad timestamp {s!r}")
    head, frac = m.groups()
    base = cache.get(head)
    if base is None:
        try:
            dt = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
        except ValueError:  # (the form is right: 2023-02-30, 25:00:00, :60 seconds)
            raise _NoSuchTime(head) from None
        base = int(dt.timestamp()) * _TICKS
        cache[head] = base
    if frac:
        return base + int(frac.ljust(7, "0"))
    return base


class _NoSuchTime(ValueError):
    """A TIMESTAMP of the right form that names no date and time (2023-02-30, 25:00:00)."""


_INT_RE = re.compile(r"[+-]?[0-9]+")
_INT64_DIGITS = len(str(INT64_LIMIT))  # 19


def _int(v: str, *, p: str, where: str, field: str, minimum: int) -> int:
    v = v.strip()
    if not _INT_RE.fullmatch(v):  # (int() also takes '1_000' and non-ASCII digits)
        raise TraceError(path=p, where=where, field=field, found=short_repr(v),
                         expected="an integer")
    sign = v[0] if v[0] in "+-" else ""
    digits = v[len(sign):].lstrip("0") or "0"
    if len(digits) > _INT64_DIGITS:  # (int() refuses more than 4,300 digits with a ValueError)
        raise TraceError(path=p, where=where, field=field,
                         found=f"{sign}{digits[:12]}... ({len(digits):,} digits)",
                         expected="an integer that fits 64 bits (below 2**63)")
    x = int(sign + digits)
    if x < minimum:
        raise TraceError(path=p, where=where, field=field, found=x, expected=f">= {minimum}")
    if x >= INT64_LIMIT:
        raise TraceError(path=p, where=where, field=field, found=x,
                         expected="an integer that fits 64 bits (below 2**63)")
    return x


def load_azure(path: Path, cfg, rng: np.random.Generator, sink: ErrorSink) -> Parsed:
    """Parse an Azure 2023 CSV trace (see module docstring).

    Raises:
        TraceError: missing column, unparsable timestamp or integer, ContextTokens < 1,
            GeneratedTokens < 0 (or 0 with ``zero_output=error``), no data rows, empty file.
    """
    import numpy as np
    p = str(path)
    lines = iter_lines(path, "a CSV text file")
    hline, header_raw = next(lines)
    if not header_raw.strip():
        raise TraceError("blank line", path=p, where=f"line {hline}", found="a blank line",
                         expected=f"the header ({', '.join(COLUMNS)}) on the first line")
    header = csv_row(decode_utf8(header_raw, path=p, where=f"line {hline}"), path=p,
                     where=f"line {hline}")
    header = [h.strip() for h in header]
    dup = sorted(h for h, n in Counter(header).items() if n > 1)
    if dup:
        raise TraceError("repeated header column", path=p, where=f"line {hline}",
                         field=", ".join(dup),
                         found=f"header {header}", expected="each column named once")
    idx = {}
    for c in COLUMNS:
        if c not in header:
            raise TraceError("missing column", path=p, where="line 1", field=c,
                             found=f"header {header}", expected=f"columns {list(COLUMNS)}")
        idx[c] = header.index(c)
    ticks: list[int] = []
    inp: list[int] = []
    out: list[int] = []
    line_of: list[int] = []
    zero = [0]
    cache: dict = {}
    rows = 0
    for lineno, raw in lines:
        rows += 1
        where = f"line {lineno}"
        try:
            rec = csv_row(decode_utf8(raw, path=p, where=where), path=p, where=where,
                          columns=header)
            if len(rec) != len(header):
                raise TraceError(path=p, where=where,
                                 found=f"{len(rec)} fields" + ("" if rec else " (a blank line)"),
                                 expected=f"{len(header)} fields ({', '.join(header)})")
            try:
                tk = _parse_ts(rec[idx["TIMESTAMP"]], cache)
            except _NoSuchTime:
                raise TraceError(path=p, where=where, field="TIMESTAMP",
                                 found=short_repr(rec[idx["TIMESTAMP"]]),
                                 expected="a real date and time (month 01-12, a day the month "
                                          "has, hour 00-23, minute and second 00-59)") from None
            except ValueError:
                raise TraceError(path=p, where=where, field="TIMESTAMP",
                                 found=short_repr(rec[idx["TIMESTAMP"]]),
                                 expected="'YYYY-MM-DD HH:MM:SS[.fffffff]' (ASCII digits, 1-7 "
                                          "fraction digits)") from None
            n_in = _int(rec[idx["ContextTokens"]], p=p, where=where, field="ContextTokens", minimum=1)
            n_out = _int(rec[idx["GeneratedTokens"]], p=p, where=where, field="GeneratedTokens",
                         minimum=0)
            n_out = output_len(n_out, cfg.zero_output, path=p, where=where,
                               key="GeneratedTokens", counter=zero)
        except TraceError as e:
            sink.bad(e)
            continue
        ticks.append(tk)
        inp.append(n_in)
        out.append(n_out)
        line_of.append(lineno)
    if not ticks:
        raise TraceError("no valid rows", path=p, found=f"{rows} data rows, {sink.count} skipped",
                         expected="at least one valid row")
    tk = np.asarray(ticks, dtype=np.int64)
    inp_a = np.asarray(inp, dtype=np.int64)
    out_a = np.asarray(out, dtype=np.int64)
    warnings = []
    back = np.flatnonzero(np.diff(tk) < 0)
    lines_a = np.asarray(line_of, dtype=np.int64)
    if back.size:
        order = np.argsort(tk, kind="stable")
        tk, inp_a, out_a, lines_a = tk[order], inp_a[order], out_a[order], lines_a[order]
        earlier = counted(back.size, "row earlier than the row before it",
                          "rows earlier than the row before them")
        warnings.append(f"{earlier} (first at line "
                        f"{line_of[back[0] + 1]}); rows stably sorted by TIMESTAMP")
    late = np.flatnonzero(tk - tk[0] > int(MAX_ARRIVAL_S) * _TICKS)
    if late.size:  # (named by file line here; the loader's own check knows only parsed rows)
        k = int(late[0])
        raise TraceError("arrival past the simulated clock's range", path=p,
                         where=f"line {lines_a[k]}", field="TIMESTAMP",
                         found=f"{(tk[k] - tk[0]) / _TICKS:.6g} s after the earliest row "
                               f"(line {lines_a[0]})",
                         expected="rows within 2**32 s (~136 years) of each other, where float64 "
                                  "seconds still resolve a microsecond")
    if zero[0]:
        warnings.append(f"{counted(zero[0], 'row', 'rows')} had GeneratedTokens 0; loaded as 1 "
                        f"(zero_output=as_one)")
    n = tk.size
    arrival = (tk - tk[0]).astype(np.float64) / _TICKS
    return Parsed(
        session_id=np.arange(n, dtype=np.int64),
        turn=np.zeros(n, dtype=np.int32),
        arrival_s=arrival,
        think_s=np.zeros(n),
        parent=np.full(n, -1, dtype=np.int64),
        input_tokens=inp_a,
        output_tokens=out_a,
        prefix_offsets=np.zeros(n + 1, dtype=np.int64),
        prefix_values=np.zeros(0, dtype=np.int64),
        block_tokens=0,
        source=p,
        warnings=warnings,
        notes={"rows_read": rows, "zero_output_rows": zero[0], "rows_out_of_order": int(back.size),
               "first_timestamp_ticks_100ns": int(tk[0])},
    )

@dataclass
class AzureOptions:
    """Azure's options: none beyond the common ones."""


register(TraceFormat(
    name="azure", options=AzureOptions, recorded_clock=lambda c: True,
    default_path="azure2023/AzureLLMInferenceTrace_conv.csv",
    load=lambda path, cfg, rng, sink, seed: load_azure(path, cfg, rng, sink)), __name__)


from .._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
