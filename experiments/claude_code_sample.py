"""Build ``traces/data/claude_code_sample.jsonl.xz`` from a folder of Claude Code transcripts:
the lines the ``claude_code`` loader reads, with only the fields it reads (no message content,
no paths), ids renamed to short ones (the same id for the same value everywhere), one file in
the folder's path order (traces/data/NOTICE.md says where the bundled one comes from).

    python -m experiments.claude_code_sample SRC_DIR OUT.jsonl.xz

Kept per line with a ``uuid``: ``type``, ``uuid``, ``parentUuid``, ``logicalParentUuid``,
``isSidechain``, ``sessionId``, ``agentId``, ``timestamp``, ``sourceToolAssistantUUID``,
``toolUseResult.agentId``, and for an assistant line with usage ``message.id``,
``message.model`` and the four token counts of ``message.usage``. Lines without a ``uuid`` are
left out (the loader passes over them). Renamed: uuids ``uN``, message ids ``mN``, session ids
``sN``, agent ids ``aN`` (N in order of first appearance). Empty files are left out.
"""
from __future__ import annotations

import argparse
import json
import lzma
from pathlib import Path

USAGE_KEYS = ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
              "output_tokens")


class _Names:
    def __init__(self, prefix: str):
        self.prefix, self.map = prefix, {}

    def __call__(self, v):
        if not isinstance(v, str):
            return v
        return self.map.setdefault(v, f"{self.prefix}{len(self.map) + 1}")


def strip_line(o: dict, u: _Names, m: _Names, s: _Names, a: _Names) -> dict | None:
    """The loader's fields of one transcript line, ids renamed; None for a line without uuid."""
    if "uuid" not in o:
        return None
    out = {"type": o.get("type"), "uuid": u(o["uuid"]), "parentUuid": u(o.get("parentUuid"))}
    if "logicalParentUuid" in o:
        out["logicalParentUuid"] = u(o["logicalParentUuid"])
    out["isSidechain"] = o.get("isSidechain", False)
    if "sessionId" in o:
        out["sessionId"] = s(o["sessionId"])
    if isinstance(o.get("agentId"), str):
        out["agentId"] = a(o["agentId"])
    out["timestamp"] = o.get("timestamp")
    msg = o.get("message")
    if o.get("type") == "assistant" and isinstance(msg, dict) and isinstance(msg.get("usage"), dict):
        out["message"] = {"id": m(msg.get("id")), "model": msg.get("model"),
                          "usage": {k: msg["usage"][k] for k in USAGE_KEYS if k in msg["usage"]}}
    tur = o.get("toolUseResult")
    if isinstance(tur, dict) and isinstance(tur.get("agentId"), str):
        out["toolUseResult"] = {"agentId": a(tur["agentId"])}
    if isinstance(o.get("sourceToolAssistantUUID"), str):
        out["sourceToolAssistantUUID"] = u(o["sourceToolAssistantUUID"])
    return out


def build_sample(src: Path, out: Path) -> dict:
    """Write the stripped sample of every transcript under ``src`` to ``out`` (xz); returns
    counts (files, lines)."""
    from traces._calls import transcript_files

    names = [_Names(p) for p in "umsa"]
    files = [f for f in transcript_files(src) if f.stat().st_size]
    n = 0
    with lzma.open(out, "wt", preset=9 | lzma.PRESET_EXTREME) as fh:
        for f in files:
            for raw in f.read_text().splitlines():
                if not raw.strip():
                    continue
                line = strip_line(json.loads(raw), *names)
                if line is not None:
                    fh.write(json.dumps(line, separators=(",", ":")) + "\n")
                    n += 1
    return {"files": len(files), "lines": n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path)
    ap.add_argument("out", type=Path)
    args = ap.parse_args(argv)
    print(build_sample(args.src, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
