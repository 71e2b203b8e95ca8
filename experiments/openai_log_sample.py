"""Build an ``openai_log`` trace (``traces/formats/openai_log.py``'s schema) from mini-SWE-agent
trajectories (``*.traj.json``, trajectory format ``mini-swe-agent-1.1``), whose assistant
messages keep the provider's whole chat-completion response in ``extra.response`` and the time
it arrived in ``extra.timestamp``.

    python -m experiments.openai_log_sample OUT.jsonl.xz RUN_DIR [RUN_DIR ...]

One line per assistant message that has a response, in trajectory order; the trajectories of
each RUN_DIR in path order. Written per call:

* ``session_id``: ``<run dir name>/<trajectory file stem>`` (one SWE-bench task of one run);
* ``created``: when the request was sent, the later of the response's ``created`` (whole
  seconds, rounded down by the provider) and the latest ``extra.timestamp`` of the messages
  before it (the tool output that the request carries; fractional seconds). Taking the
  response's ``created`` alone would put most requests before their parent's recorded end, as
  the agent sends the next request within the second its tool returns;
* ``completed_at``: the assistant message's ``extra.timestamp``;
* ``usage``: ``prompt_tokens``, ``completion_tokens``, ``total_tokens`` and
  ``prompt_tokens_details.cached_tokens`` as the response reports them (DeepSeek's
  ``prompt_cache_hit_tokens``, equal to ``cached_tokens`` on every call, is checked and left out);
* ``model`` and ``object``.

Message content, tool calls, response ids and everything else are left out.
"""
from __future__ import annotations

import argparse
import json
import lzma
from pathlib import Path


def calls(traj: dict, session: str) -> list[dict]:
    """The openai_log lines of one trajectory."""
    out, last_ts = [], None
    for m in traj["messages"]:
        extra = m.get("extra") or {}
        r = extra.get("response") if m.get("role") == "assistant" else None
        if r is not None:
            u = r["usage"]
            cached = (u.get("prompt_tokens_details") or {}).get("cached_tokens")
            hit = u.get("prompt_cache_hit_tokens")
            if hit is not None and cached is not None and hit != cached:
                raise ValueError(f"{session}: prompt_cache_hit_tokens {hit} != cached {cached}")
            created = float(r["created"]) if last_ts is None else max(float(r["created"]), last_ts)
            out.append({
                "session_id": session,
                "created": round(created, 3),
                "completed_at": round(max(float(extra["timestamp"]), created), 3),
                "model": r.get("model"),
                "object": "chat.completion",
                "usage": {"prompt_tokens": u["prompt_tokens"],
                          "completion_tokens": u["completion_tokens"],
                          "total_tokens": u["prompt_tokens"] + u["completion_tokens"],
                          "prompt_tokens_details": {"cached_tokens": cached}},
            })
        if isinstance(extra.get("timestamp"), (int, float)):
            last_ts = float(extra["timestamp"])
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("runs", type=Path, nargs="+")
    a = ap.parse_args(argv)
    lines = []
    for run in a.runs:
        for f in sorted(run.glob("*/*.traj.json")):
            lines += calls(json.loads(f.read_text()), f"{run.name}/{f.name.split('.')[0]}")
    text = "".join(json.dumps(o, separators=(",", ":")) + "\n" for o in lines)
    opener = lzma.open if a.out.suffix == ".xz" else open
    with opener(a.out, "wt") as fh:
        fh.write(text)
    print(f"{a.out}: {len(lines)} calls, {len({o['session_id'] for o in lines})} sessions")


if __name__ == "__main__":
    main()
