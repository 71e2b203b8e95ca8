"""Streaming line readers with compression detection and error wrapping; one-line CSV and UTF-8
helpers that turn the csv module's and the codec's errors into TraceErrors naming the line."""
from __future__ import annotations

import csv
import gzip
import lzma
import zlib
from pathlib import Path
from typing import Iterator

from .errors import TraceError

_XZ_MAGIC = b"\xfd7zXZ\x00"
_GZ_MAGIC = b"\x1f\x8b"


# bytes no text file holds: NUL and the C0 controls other than tab, LF, VT, FF, CR and ESC
_BINARY = bytes(b for b in range(32) if b not in b"\t\n\x0b\x0c\r\x1b")
_HEAD = 4096  # bytes of (decompressed) content looked at for binary data


def binary_at(head: bytes) -> int | None:
    """Offset of the first byte in ``head`` that no text file holds (:data:`_BINARY`), or
    None (the heuristic of file(1) and git: text files hold no NUL or C0 control bytes)."""
    hits = [i for i in (head.find(bytes([b])) for b in _BINARY) if i >= 0]
    return min(hits) if hits else None


def _binary_in_line(raw: bytes, path: Path, lineno: int, what: str) -> TraceError:
    """The error for line ``lineno`` (``raw``, newline stripped) holding a byte of
    :data:`_BINARY`: names the first such byte and its column (1-based, in bytes)."""
    col = binary_at(raw)
    return TraceError(f"not {what}", path=str(path), where=f"line {lineno}",
                      found=f"binary content: byte 0x{raw[col]:02x} at column {col + 1}",
                      expected=f"{what}: text on every line")


def iter_lines(path: Path, what: str = "a text file") -> Iterator[tuple[int, bytes]]:
    """Yield ``(line_number, raw_line_bytes)`` (1-based, newline stripped) from a plain, .xz or
    .gz file, reading one line at a time. Blank lines at the end of the file are dropped; a
    blank line before a row (leading or between rows) is yielded as ``b""``, so the loader
    reports it (or counts it as skipped with ``on_error=skip``) like any other malformed row:
    it is not a record.

    ``what``: the kind of file the format reads (``"a JSONL text file"``), for the error on
    binary content.

    Every line is checked for binary content (a byte of :data:`_BINARY`: NUL and the C0
    controls other than tab, LF, VT, FF, CR and ESC); whether it is UTF-8 is the format's to
    check (``orjson`` refuses other bytes, :func:`decode_utf8` names them).

    Raises:
        TraceError: empty file; a name ending .xz or .gz on other content; binary content in
            the first 4 KiB (decompressed: a Parquet or other binary file; names the byte's
            offset) or on any later line (names the line, the byte and its column, also with
            ``trace.on_error=skip``: such a file is not a text file with a bad row); corrupt
            or truncated compressed stream (names the last good line); a CR byte inside a line
            (a file with CR-only line endings reads as one line).
    """
    path = Path(path)
    if path.is_dir():
        raise TraceError("not a file", path=str(path), found="a directory",
                         expected="a trace file (set trace.path to the file itself)")
    with open(path, "rb") as fh:
        magic = fh.read(6)
    if not magic:
        raise TraceError("empty file", path=str(path), found="0 bytes", expected="at least one row")
    if magic.startswith(_XZ_MAGIC):
        opener, kind = lzma.open, "xz"
    elif magic.startswith(_GZ_MAGIC):
        opener, kind = gzip.open, "gzip"
    else:
        opener, kind = open, None
    named = {".xz": "xz", ".gz": "gzip"}.get(path.suffix.lower())
    if named is not None and kind != named:
        # (read by its content, the file would fail as a row: say what it is instead)
        an = {"xz": "an xz", "gzip": "a gzip"}
        raise TraceError(f"not {an[named]} stream", path=str(path),
                         found=f"first bytes {magic!r}"
                               + (f" ({an[kind]} stream)" if kind else " (uncompressed data?)"),
                         expected=f"{named}-compressed data, as the name's {path.suffix} says "
                                  f"(or a name without {path.suffix} for a plain file)")
    try:
        with opener(path, "rb") as fh:
            head = fh.read(_HEAD)
    except (lzma.LZMAError, EOFError, OSError, zlib.error):
        head = b""  # (the stream's error is named with its line below)
    at = binary_at(head)
    if at is not None:
        raise TraceError(f"not {what}", path=str(path),
                         found=f"binary content at byte {at} (byte 0x{head[at]:02x}"
                               + (", after 'PAR1': a Parquet file" if head.startswith(b"PAR1")
                                  else "") + ")",
                         expected=f"{what} (set trace.format to the file's format)")
    lineno = 0
    nonblank = 0
    blank: list[int] = []  # blank lines since the last row (yielded if a row follows)
    try:
        with opener(path, "rb") as fh:
            for raw in fh:
                lineno += 1
                raw = raw.rstrip(b"\r\n")
                if len(raw.translate(None, _BINARY)) != len(raw):
                    raise _binary_in_line(raw, path, lineno, what)
                if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]  # a UTF-8 byte-order mark (spreadsheet exports) is not data
                if b"\r" in raw:
                    raise TraceError("carriage return inside a line", path=str(path),
                                     where=f"line {lineno}",
                                     found="a CR byte before the line's end (CR-only line endings?)",
                                     expected="rows separated by LF or CRLF newlines")
                if not raw.strip():
                    blank.append(lineno)
                    continue
                if blank:
                    for b in blank:
                        yield b, b""
                blank.clear()
                nonblank += 1
                yield lineno, raw
    except (lzma.LZMAError, EOFError, OSError, zlib.error) as e:
        if kind is None:
            raise
        raise TraceError(f"unreadable {kind} stream", path=str(path),
                         where=f"after line {lineno}" if lineno else "before its first line",
                         found=f"{type(e).__name__}: {e}",
                         expected=f"a complete, valid {kind} file") from e
    if nonblank == 0:
        raise TraceError("empty file", path=str(path), found="no non-blank lines",
                         expected="at least one row")


def _field_spans(text: str) -> list[int]:
    """Length of each field of one CSV line (quote-aware, quote characters not counted): the
    error path of :func:`csv_row`, to name the field the csv module refused."""
    lens, n, quoted = [], 0, False
    for ch in text:
        if ch == '"':
            quoted = not quoted  # (a doubled quote inside a quoted field toggles twice)
            continue
        if ch == "," and not quoted:
            lens.append(n)
            n = 0
            continue
        n += 1
    lens.append(n)
    return lens


def csv_row(text: str, *, path: str, where: str, columns=()) -> list[str]:
    """One CSV line -> its fields (``csv.reader``).

    Raises:
        TraceError: the csv module refuses the line (a field longer than
            ``csv.field_size_limit()``, 131,072 characters by default), naming ``where`` and the
            field (``columns[j]``, else ``column j+1``).
    """
    try:
        return next(csv.reader([text]), [])
    except csv.Error as e:
        limit = csv.field_size_limit()
        lens = _field_spans(text)
        long = [j for j, n in enumerate(lens) if n > limit]
        if not long:
            raise TraceError("unreadable CSV row", path=path, where=where,
                             found=f"csv.Error: {e}", expected="a CSV row") from None
        j = long[0]
        raise TraceError("field too long", path=path, where=where,
                         field=columns[j] if j < len(columns) else f"column {j + 1}",
                         found=f"{lens[j]:,} characters",
                         expected=f"at most {limit:,} characters (csv.field_size_limit)") from None


def decode_utf8(raw: bytes, *, path: str, where: str) -> str:
    """``raw.decode('utf-8')``, or a TraceError naming ``where`` and the first bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError("not UTF-8 text", path=path, where=where,
                         found=f"byte 0x{raw[e.start]:02x} at column {e.start + 1}",
                         expected="UTF-8 text") from None

from ._source import note_source as _note_source  # noqa: E402

_note_source(__name__, __file__)
