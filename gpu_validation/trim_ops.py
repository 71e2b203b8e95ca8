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

    Raises ValueError naming the file and the 1-based line number of a line that is not JSON or
    not an object with a string ``op``, and naming the file when it holds no operation (no line
    but ``model`` lines: an empty file is not a run's ops); OSError when it cannot be read."""
    lines: list[dict] = []
    with open(path) as f:
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            try:
                op = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {n}: not JSON ({e.msg} at column {e.colno}); "
                                 f"expected one JSON object per line") from None
            if not isinstance(op, dict) or not isinstance(op.get("op"), str):
                raise ValueError(f"{path}: line {n}: expected a JSON object with an \"op\" "
                                 f"name (model, compaction_move, d2h, h2d), got "
                                 f"{text.strip()[:80]}")
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
    with open(args.dst, "w") as f:
        for op in out:
            f.write(json.dumps(op) + "\n")
    counts: dict[str, int] = {}
    for op in out:
        if op["op"] != "model":
            counts[kind(op)] = counts.get(kind(op), 0) + 1
    print(f"{args.src}: {len(lines)} lines -> {args.dst}: {len(out)} lines {counts}")


if __name__ == "__main__":
    main()
