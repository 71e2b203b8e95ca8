"""An oracle for kvsim's prefix cache: replay a workload through vLLM's own v1 ``KVCacheManager``,
one request at a time, and write each request's prefix hit and block table.

A tool, never a dependency of kvsim: vLLM is large and pins its own torch, so it lives in a
scratch virtual environment outside the repository, and the two halves of this script run in
different interpreters:

``export`` (kvsim's environment) writes a scenario: the rows of a kvsim workload (a trace preset
with overrides, or a YAML list of hand-written requests) in the order they run, with their prefix
ids and each request's continuation (the closed-loop child whose prompt starts with its prompt,
``sim.keys.continues``)::

    .venv/bin/python experiments/vllm_oracle.py export --trace mooncake_conversation \\
        --max-requests 300 --out /tmp/scenario.json

``replay`` (the scratch environment; imports vLLM only) drives the manager with it and writes
the goldens::

    python3 -m venv /tmp/vllm-venv
    /tmp/vllm-venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
    /tmp/vllm-venv/bin/pip install vllm==0.33.0
    /tmp/vllm-venv/bin/python experiments/vllm_oracle.py replay /tmp/scenario.json \\
        --block-size 16 --num-blocks 20000 --out tests/data/vllm_oracle/NAME.json

(vllm 0.33.0's wheel pulled torch 2.14.0 over the CPU 2.13.0; the block manager runs on the CPU
without a GPU, weights or a model config.)

How the replay stands in for vLLM's scheduler, one request at a time (vllm/v1/core/sched/
scheduler.py): ``get_computed_blocks`` (at most ``num_tokens - 1`` tokens: the last prompt token
is always recomputed), ``allocate_slots`` for the prompt in chunks of ``max_num_batched_tokens``
(the first with the hit blocks), one sampled token appended once the prompt is computed, then one
``allocate_slots(request, 1)`` per further output token, each followed by its sampled token, and
``free`` when the last token is sampled. ``num_blocks`` is the usable pool: the manager is given
one more, which vLLM's ``BlockPool`` takes as its null block (``null_block``), so its block ids
are kvsim's + 1; the goldens store them minus 1.

Token content is the oracle's own reading of the workload contract (traces/workload.py): a
prompt token at position ``t`` inside the span the request's ids identify
(``min(len(ids) x G, input)``) is the token ``(ids[t // G], t mod G)``; an output token (or a
prompt token past that span) at position ``t`` is its continuation's token there when the
continuation's ids identify position ``t`` and ``t < input + output``; any other token is unique
to its request. Tokens are numbered in order of first appearance. vLLM then hashes full blocks
of these tokens itself (sha256 of the parent hash and the block's tokens).
"""
from __future__ import annotations

import argparse
import json
import struct
import sys
import zlib
from pathlib import Path

SCENARIO_VERSION = 1


# ---------------------------------------------------------------------------------------- export
def export(args) -> dict:
    """The scenario of a kvsim workload (kvsim's environment)."""
    import numpy as np

    from sim.keys import continues
    from traces.loader import load_workload

    if args.requests:
        import yaml

        rows = yaml.safe_load(Path(args.requests).read_text())
        G = int(rows["prefix_block_tokens"])
        reqs = rows["requests"]
        n = len(reqs)
        w_in = [int(r["input_tokens"]) for r in reqs]
        w_out = [int(r["output_tokens"]) for r in reqs]
        parent = [int(r.get("parent_request_id", -1)) for r in reqs]
        ids = [list(map(int, r.get("prefix_ids", []))) for r in reqs]
        source = str(args.requests)
    else:
        from sim.run import compose_config

        cfg = dict(compose_config([f"trace={args.trace}", *args.override]).trace)
        if args.max_requests:
            cfg["max_requests"] = int(args.max_requests)
        wl = load_workload(cfg, seed=args.seed)  # (rows: request_id order)
        G = int(wl.prefix_block_tokens)
        n = len(wl)
        w_in = wl.input_tokens.tolist()
        w_out = wl.output_tokens.tolist()
        parent = wl.parent_request_id.tolist()
        off, val = wl.prefix_offsets(), wl.prefix_values()
        ids = [val[off[i]:off[i + 1]].tolist() for i in range(n)]
        source = f"{args.trace} {' '.join(args.override)} max_requests={args.max_requests}"
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parent):
        if p >= 0:
            kids.setdefault(p, []).append(i)
    cont = []
    for i in range(n):
        c = -1
        if not args.no_answer_reuse:
            for k in kids.get(i, []):
                if continues(np.asarray(ids[i]), w_in[i], G, np.asarray(ids[k]), w_in[k]):
                    c = k
                    break
        cont.append(c)
    order = _run_order(parent, n)
    return {"version": SCENARIO_VERSION, "source": source, "prefix_block_tokens": G,
            "order": order,
            "requests": [{"request_id": i, "input_tokens": w_in[i], "output_tokens": w_out[i],
                          "parent_request_id": parent[i], "continuation": cont[i],
                          "prefix_ids": ids[i]} for i in range(n)]}


def _run_order(parent: list[int], n: int) -> list[int]:
    """The order requests run in a one-at-a-time replay whose roots arrive far apart (row
    order) and whose children arrive when their parent finishes: each root, then its
    descendants depth first, children in row order (every child is released, in row order, when
    its parent finishes, and runs before the next root)."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parent):
        if p >= 0:
            kids.setdefault(p, []).append(i)
    out: list[int] = []
    for r in range(n):
        if parent[r] >= 0:
            continue
        queue = [r]  # (FCFS: a released child waits behind those released before it)
        while queue:
            i = queue.pop(0)
            out.append(i)
            queue.extend(kids.get(i, []))
    return out


# ---------------------------------------------------------------------------------------- replay
class _Tokens:
    """Token ids of a scenario's requests (the module docstring's content rule)."""

    def __init__(self, scen: dict):
        self.G = int(scen["prefix_block_tokens"])
        self.reqs = scen["requests"]
        self.numbers: dict[tuple, int] = {}

    def _tok(self, key: tuple) -> int:
        t = self.numbers.get(key)
        if t is None:
            t = self.numbers[key] = len(self.numbers)
        return t

    def _identified(self, r: dict, t: int) -> bool:
        return self.G > 0 and t < min(len(r["prefix_ids"]) * self.G, r["input_tokens"])

    def token(self, i: int, t: int) -> int:
        r = self.reqs[i]
        if self._identified(r, t):
            return self._tok(("id", r["prefix_ids"][t // self.G], t % self.G))
        c = r["continuation"]
        if c >= 0 and t < r["input_tokens"] + r["output_tokens"]:
            rc = self.reqs[c]
            if self._identified(rc, t):
                return self._tok(("id", rc["prefix_ids"][t // self.G], t % self.G))
        return self._tok(("own", i, t))


def replay(scen: dict, block_size: int, num_blocks: int, max_num_batched_tokens: int,
           max_model_len: int, enable_caching: bool = True) -> list[dict]:
    """Run the scenario's requests one at a time through vLLM's ``KVCacheManager``; per
    request (in run order): request id, prefix-hit tokens, its block table (kvsim's ids: vLLM's
    - 1) and its CRC (:func:`blocks_crc`). A request longer than ``max_model_len`` or whose whole
    sequence needs more blocks than the pool has is recorded ``rejected`` (kvsim rejects it at
    arrival; vLLM refuses the first at its API and would keep the second waiting)."""
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                            KVCacheTensor)
    from vllm.v1.request import Request

    init_none_hash(sha256)
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1,
                             dtype=torch.float32)
    cfg = KVCacheConfig(num_blocks=num_blocks + 1,  # + vLLM's null block
                        kv_cache_tensors=[KVCacheTensor(size=1, layers=["layer0"], layer_stride=1,
                                                        block_stride=1)],
                        kv_cache_groups=[KVCacheGroupSpec(["layer0"], spec)])
    longest = max(r["input_tokens"] + r["output_tokens"] for r in scen["requests"])
    mgr = KVCacheManager(cfg, max_model_len=longest, scheduler_block_size=block_size,
                         hash_block_size=block_size, enable_caching=enable_caching)
    hasher = get_request_block_hasher(block_size, sha256)
    toks = _Tokens(scen)
    out = []
    for i in scen["order"]:
        r = scen["requests"][i]
        n_in, n_out = r["input_tokens"], r["output_tokens"]
        if -(-(n_in + n_out - 1) // block_size) > num_blocks or n_in + n_out > max_model_len:
            out.append({"request_id": i, "status": "rejected"})
            continue
        prompt = [toks.token(i, t) for t in range(n_in)]
        req = Request(request_id=str(i), prompt_token_ids=prompt,
                      sampling_params=SamplingParams(max_tokens=n_out), pooling_params=None,
                      block_hasher=hasher)
        blocks, hit, _ = mgr.get_computed_blocks(req)
        done = hit
        first = True
        while done < n_in:  # prefill chunks (the first adopts the hit blocks)
            n = min(n_in - done, max_num_batched_tokens)
            got = (mgr.allocate_slots(req, n, hit, blocks) if first
                   else mgr.allocate_slots(req, n))
            if got is None:
                raise RuntimeError(f"request {i}: the pool could not hold its prompt")
            first = False
            done += n
            req.num_computed_tokens = done
        if first:  # (a full hit cannot happen: the last token is always recomputed)
            raise RuntimeError(f"request {i}: nothing to compute")
        req.append_output_token_ids(toks.token(i, n_in))
        for j in range(1, n_out):
            if mgr.allocate_slots(req, 1) is None:
                raise RuntimeError(f"request {i}: the pool could not hold its decode")
            req.num_computed_tokens += 1
            req.append_output_token_ids(toks.token(i, n_in + j))
        table = [b - 1 for b in mgr.get_block_ids(str(i))[0]]
        mgr.free(req)
        out.append({"request_id": i, "status": "finished", "prefix_hit_tokens": int(hit),
                    "blocks": table, "blocks_crc": blocks_crc(table)})
    return out


def blocks_crc(table) -> int:
    """CRC-32 of a block table (block ids as little-endian int64), the goldens' compact record
    of a table."""
    return zlib.crc32(struct.pack(f"<{len(table)}q", *table))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="write a scenario from a kvsim workload (kvsim's venv)")
    src = ex.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="a kvsim trace preset (experiments/conf/trace)")
    src.add_argument("--requests", help="a YAML file: prefix_block_tokens and requests")
    ex.add_argument("--override", nargs="*", default=[], help="trace.* overrides")
    ex.add_argument("--max-requests", type=int, default=0)
    ex.add_argument("--seed", type=int, default=0)
    ex.add_argument("--no-answer-reuse", action="store_true",
                    help="no continuation (kvsim's cache.reuse_answer_blocks=false)")
    ex.add_argument("--out", required=True)
    rp = sub.add_parser("replay", help="run a scenario through vLLM's KVCacheManager")
    rp.add_argument("scenario")
    rp.add_argument("--block-size", type=int, default=16)
    rp.add_argument("--num-blocks", type=int, required=True, help="usable blocks")
    rp.add_argument("--max-num-batched-tokens", type=int, default=8192)
    rp.add_argument("--max-model-len", type=int, default=131072)
    rp.add_argument("--no-blocks", action="store_true", help="omit block tables")
    rp.add_argument("--out", required=True)
    hi = sub.add_parser("hits", help="a replay's prefix hits in request_id order (compact)")
    hi.add_argument("replay")
    hi.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if a.cmd == "export":
        Path(a.out).write_text(json.dumps(export(a)))
        return 0
    if a.cmd == "hits":
        g = json.loads(Path(a.replay).read_text())
        rows = sorted(g.pop("requests"), key=lambda r: r["request_id"])
        g["prefix_hit_tokens"] = [r.get("prefix_hit_tokens", -1) for r in rows]
        Path(a.out).write_text(json.dumps(g, separators=(",", ":")) + "\n")
        return 0
    scen = json.loads(Path(a.scenario).read_text())
    if scen.get("version") != SCENARIO_VERSION:
        print(f"vllm_oracle: {a.scenario}: scenario version {scen.get('version')!r}; expected "
              f"{SCENARIO_VERSION}", file=sys.stderr)
        return 2
    import vllm

    rows = replay(scen, a.block_size, a.num_blocks, a.max_num_batched_tokens, a.max_model_len)
    if a.no_blocks:
        for r in rows:
            r.pop("blocks", None)
    Path(a.out).write_text(json.dumps({
        "vllm": vllm.__version__, "source": scen["source"], "block_size": a.block_size,
        "num_blocks": a.num_blocks, "max_num_batched_tokens": a.max_num_batched_tokens,
        "max_model_len": a.max_model_len,
        "requests": rows}, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
