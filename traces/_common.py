"""Intermediate result shared by the loaders, the options of the session formats, and small
validation helpers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .errors import TraceError

try:  # orjson is ~2x faster than json on the Weka file; json is the fallback.
    import orjson as _orjson

    def loads(b: bytes) -> Any:
        return _orjson.loads(b)

    JSONDecodeError: tuple = (_orjson.JSONDecodeError, ValueError)
except ImportError:  # pragma: no cover
    import json as _json

    def loads(b: bytes) -> Any:
        return _json.loads(b)

    JSONDecodeError = (ValueError,)


@dataclass
class Parsed:
    """Rows in canonical order (parents before children, roots by arrival), before slicing."""

    session_id: np.ndarray
    turn: np.ndarray
    arrival_s: np.ndarray
    think_s: np.ndarray
    parent: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    prefix_offsets: np.ndarray  # int64 [N+1], starting at 0
    prefix_values: np.ndarray  # int64
    block_tokens: int
    source: str
    warnings: list = field(default_factory=list)
    notes: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    # False when the result depends on an option the parsed-trace cache's key leaves out
    # (traces.cache.SLICING_FIELDS): the cache does not store it
    cacheable: bool = True


INT64_LIMIT = 1 << 63  # token counts and ids are held as int64
# Latest arrival (s) a workload may have: the clock is float64 seconds, whose spacing at 2**32 s
# is 2**-20 s (~1 us); past it step durations (~ms) and TTFTs lose their digits.
MAX_ARRIVAL_S = float(2 ** 32)


def counted(n: int, one: str, many: str) -> str:
    """``"1 row had"`` / ``"3 rows had"``: ``n`` and the phrase that agrees with it (a loader's
    count warnings)."""
    return f"{n:,} {one if n == 1 else many}"


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v  # not NaN


def json_error_found(raw: bytes, e: Exception) -> str:
    """What a JSON-lines row that did not parse holds, for its TraceError's ``found``: "a blank
    line" (``traces._io.iter_lines`` yields a blank line between rows as ``b""``), the first
    byte that is not UTF-8 and its column (1-based, in bytes; JSON text is UTF-8, RFC 8259
    section 8.1), else the parser's message cut to 80 characters."""
    if not raw.strip():
        return "a blank line"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as bad:
        return (f"byte 0x{raw[bad.start]:02x} at column {bad.start + 1}, not UTF-8 "
                f"(JSON text is UTF-8)")
    return str(e)[:80]


def short_repr(v: Any, limit: int = 60) -> str:
    """``repr(v)``, cut to about ``limit`` characters with the full length named (a field of
    thousands of characters in an error message)."""
    r = repr(v)
    if len(r) <= limit:
        return r
    n = f" ({len(v):,} characters)" if isinstance(v, str) else ""
    return r[:limit - 3] + "..." + n


def _shown(v: Any) -> str:
    """A JSON value as found, with its JSON type (``null`` for None)."""
    if v is None:
        return "null"
    kind = {bool: "boolean", str: "string", list: "array", dict: "object"}.get(type(v), type(v).__name__)
    return f"{v!r} ({kind})"


def need_int(obj: dict, key: str, *, path: str, where: str, minimum: Optional[int] = None,
             allow_zero_output: bool = False) -> int:
    """Return ``obj[key]`` as an int, or raise a TraceError naming the field."""
    if key not in obj:
        raise TraceError("missing field", path=path, where=where, field=key,
                         found="nothing", expected="an integer")
    raw = v = obj[key]
    if isinstance(v, float) and v.is_integer():  # (a whole number written 6760.0 or 1e3)
        v = int(v)
    if not is_int(v):
        raise TraceError(path=path, where=where, field=key, found=_shown(v),
                         expected="an integer")
    if minimum is not None and v < minimum:
        raise TraceError(path=path, where=where, field=key, found=v, expected=f">= {minimum}")
    if not -INT64_LIMIT <= v < INT64_LIMIT:  # (a float is shown as written: 1e+30 (float))
        raise TraceError(path=path, where=where, field=key,
                         found=_shown(raw) if isinstance(raw, float) else v,
                         expected="an integer that fits 64 bits (below 2**63)")
    return v


def need_list(obj: dict, key: str, *, path: str, where: str, expected: str) -> list:
    """Return ``obj[key]`` when it is a JSON array, or raise a TraceError naming the field
    (missing, ``null``, or another value: its first 40 characters)."""
    v = obj.get(key)
    if isinstance(v, list):
        return v
    absent = key not in obj
    raise TraceError("missing field" if absent else None, path=path, where=where, field=key,
                     expected=expected,
                     found="nothing" if absent else "null" if v is None else repr(v)[:40])


def need_num(obj: dict, key: str, *, path: str, where: str, minimum: Optional[float] = None) -> float:
    """Return ``obj[key]`` as a finite float, or raise a TraceError naming the field."""
    if key not in obj:
        raise TraceError("missing field", path=path, where=where, field=key,
                         found="nothing", expected="a number")
    v = obj[key]
    if not is_num(v) or v in (float("inf"), float("-inf")):
        raise TraceError(path=path, where=where, field=key, found=_shown(v),
                         expected="a finite number")
    if minimum is not None and v < minimum:
        raise TraceError(path=path, where=where, field=key, found=v, expected=f">= {minimum}")
    return float(v)


def output_len(v: int, zero_output: str, *, path: str, where: str, key: str,
               counter: list) -> int:
    """Apply the ``zero_output`` policy to a recorded output length (already an int >= 0)."""
    if v >= 1:
        return v
    if zero_output == "as_one":
        counter[0] += 1
        return 1
    raise TraceError(path=path, where=where, field=key, found=v,
                     expected=">= 1 (set trace.zero_output=as_one to load 0 as 1)")


def check_choice(c: Any, field: str, options: tuple[str, ...]) -> None:
    """Raise TraceError naming ``field`` when ``getattr(c, field)`` is not one of ``options``."""
    v = getattr(c, field)
    if v not in options:
        raise TraceError(field=field, found=repr(v), expected=f"one of {list(options)}")


@dataclass
class SessionOptions:
    """Formats of sessions (Weka, Claude Code, OpenAI logs): how the sessions start.

    Attributes:
        session_arrival: ``poisson`` (seeded, ``session_rate_per_s``; first session at 0) |
            ``recorded`` (session order, ``session_interval_s`` apart) | ``absolute`` (the
            sessions' recorded wall-clock starts: Weka needs a session ``start_time``, which
            the published traces lack) | null (the format's default: Weka ``poisson``, Claude
            Code and OpenAI logs ``absolute``).
        session_rate_per_s: sessions per second of ``poisson`` (> 0).
        session_interval_s: seconds between session starts of ``recorded`` (>= 0).
        share_system_prefix: map the leading ids covering ``system_tokens + tool_tokens`` to one
            id space shared across sessions (assumption: same system/tool prompt everywhere).
        max_sessions: read only the first N sessions (Weka: file order; Claude Code and OpenAI
            logs: in order of their first call); null: all.
    """

    session_arrival: Optional[str] = None
    session_rate_per_s: float = 0.2
    session_interval_s: float = 5.0
    share_system_prefix: bool = False
    max_sessions: Optional[int] = None


def check_session_options(c: Any) -> None:
    """The checks of :class:`SessionOptions`' fields of ``c`` (raises TraceError naming the
    field)."""
    if c.session_arrival is not None:
        check_choice(c, "session_arrival", ("poisson", "recorded", "absolute"))
    if c.session_rate_per_s <= 0:
        raise TraceError(field="session_rate_per_s", found=c.session_rate_per_s, expected="> 0")
    if c.session_interval_s < 0:
        raise TraceError(field="session_interval_s", found=c.session_interval_s, expected=">= 0")
    if c.max_sessions is not None and c.max_sessions < 1:
        raise TraceError(field="max_sessions", found=c.max_sessions, expected=">= 1 or null")


from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
