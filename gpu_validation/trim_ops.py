"""Trim a simulator ops file (``ops.jsonl``, written with ``output.write_ops=true``) to at most
N operations of each kind, evenly spaced over the run, so that it can be committed and replayed
in a few minutes by ``python -m gpu_validation.validate --ops``.

    python -m gpu_validation.trim_ops IN.jsonl OUT.jsonl [--per-kind 200]

A kind is ``op`` plus ``style`` (compaction) or ``codec`` (transfers): ``compaction_move/forward``,
``d2h/nvfp4``, ``h2d/nvfp4``, ... ``model`` lines are kept in place. Kept lines are written in
their original order and unchanged. Standard library only.
"""
from __future__ import annotations

import argparse
import json
import sys


OPS = ("model", "compaction_move", "d2h", "h2d")  # the ops a replay knows
CODECS = ("none", "nvfp4", "fp8")  # the page codecs of d2h / h2d copies


def write_ops(path, ops: list[dict]) -> None:
    """Write ``ops`` as an ops file (one JSON object per line); exit with a one-line error
    naming ``path`` when it cannot be written (a folder, a missing parent folder, ...)."""
    try:
        with open(path, "w") as f:
            for op in ops:
                f.write(json.dumps(op) + "\n")
    except OSError as e:
        sys.exit(f"{path}: cannot write the ops file ({e.strerror or e})")


def kind(op: dict) -> str:
    """The group an ops-file line is sampled in."""
    if op["op"] == "compaction_move":
        return f"compaction_move/{op.get('style', 'forward')}"
    return f"{op['op']}/{op.get('codec', 'none')}"


def trim(lines: list[dict], per_kind: int) -> list[dict]:
    """Keep every ``model`` line and, of each kind, ``per_kind`` lines at evenly spaced ranks
    (all of them when there are fewer); order preserved."""
    if per_kind < 1:
        raise ValueError(f"per_kind={per_kind}; expected >= 1")
    idx: dict[str, list[int]] = {}
    for i, op in enumerate(lines):
        if op["op"] != "model":
            idx.setdefault(kind(op), []).append(i)
    keep = {i for i, op in enumerate(lines) if op["op"] == "model"}
    for ids in idx.values():
        n = len(ids)
        if n <= per_kind:
            keep.update(ids)
        else:
            keep.update(ids[(j * n) // per_kind] for j in range(per_kind))
    return [lines[i] for i in sorted(keep)]


def read_ops(path) -> list[dict]:
    """The ops-file lines of ``path`` (blank lines skipped), each a JSON object with an ``op``.

    Raises ValueError naming the file and the 1-based line number of a line that is not UTF-8,
    not JSON, not an object whose ``op`` is one of :data:`OPS`, or a copy whose ``codec`` is not
    one of :data:`CODECS`, and naming the file when it holds no operation (no line
    but ``model`` lines: an empty file is not a run's ops); OSError when it cannot be read."""
    lines: list[dict] = []
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"{path}: line {n}: not UTF-8 text (byte {raw[e.start]:#04x} at "
                                 f"column {e.start + 1}); expected one JSON object per line") \
                    from None
            if not text.strip():
                continue
            try:
                op = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n}: not JSON ({e.msg} at column {e.colno}); "
                                 f"expected one JSON object per line") from None
            if not isinstance(op, dict) or op.get("op") not in OPS:
                got = op.get("op") if isinstance(op, dict) else None
                raise ValueError(f"{path}: line {n}: expected a JSON object with an \"op\" "
                                 f"name ({', '.join(OPS)}), got "
                                 + (f"op {got!r}" if isinstance(got, str)
                                    else text.strip()[:80]))
            if op["op"] in ("d2h", "h2d") and op.get("codec", "none") not in CODECS:
                raise ValueError(f"{path}: line {n}: codec {op.get('codec')!r}, expected one of "
                                 f"{', '.join(CODECS)} (or none given)")
            lines.append(op)
    if not any(op["op"] != "model" for op in lines):
        raise ValueError(f"{path}: no operation ({len(lines)} model line(s), nothing to trim); "
                         f"expected an ops file written by kvsim output.write_ops=true")
    return lines


def read_ops_or_exit(path) -> list[dict]:
    """:func:`read_ops`, or exit with its one-line error (the command-line tools' reading)."""
    try:
        return read_ops(path)
    except OSError as e:
        sys.exit(f"{path}: cannot read ops file ({e.strerror or e})")
    except ValueError as e:
        sys.exit(str(e))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--per-kind", type=int, default=200)
    args = ap.parse_args(argv)
    if args.per_kind < 1:
        ap.error(f"--per-kind {args.per_kind}: expected >= 1 (ops kept per kind)")
    lines = read_ops_or_exit(args.src)
    out = trim(lines, args.per_kind)
    write_ops(args.dst, out)
    counts: dict[str, int] = {}
    for op in out:
        if op["op"] != "model":
            counts[kind(op)] = counts.get(kind(op), 0) + 1
    print(f"{args.src}: {len(lines)} lines -> {args.dst}: {len(out)} lines {counts}")


if __name__ == "__main__":
    main()
