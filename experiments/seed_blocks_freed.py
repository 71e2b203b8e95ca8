"""Seed experiment: blocks freed vs tokens evicted on one paged sequence (design.md section 3).

One sequence of 16,000 tokens in 1,000 blocks of 16 slots; one round keeps 1,600 tokens (evicts
90%). Rows:

1. uniform-random survivors shared by all heads, no compaction: ~1000 x 0.9^16 = 185 blocks freed;
2. independent uniform survivors per KV head (8 heads), no compaction: ~0 freed;
3-4. the same with forward packing: exactly 900 freed, 100 blocks left;
5-6. hole filling: nothing moves; with release_empty_blocks=False 0 blocks are freed and the next
   14,400 generated tokens need no new block; with the default (wholly empty blocks released) the
   ~185 empty blocks are freed and exactly as many new blocks are needed later;
7. streaming_llm with a block-aligned window (16 sinks + 1,584 recent = 1,600 tokens): whole
   blocks empty without compaction (900 freed).

``prompt_len`` (default 0: everything may be evicted/moved) keeps the first prompt tokens in the
random rows and pins them under forward packing.

Run: ``python -m experiments.seed_blocks_freed [--seed 0] [--prompt-len 0] [--csv out.csv]
[--parquet out.parquet]``.
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from policies import CompactionConfig, PagedLayout, PolicyConfig, make_compactor, make_policy


def _random_keep(n_tokens, block_size, groups, n_keep, prompt_len, seed, mode):
    cfg = PolicyConfig(name="random", budget=n_keep - prompt_len, seed=seed, mode=mode,
                       protect_prompt=prompt_len > 0)
    pol = make_policy(cfg)
    layout = PagedLayout(block_size, groups, prompt_len, request_key=0)
    layout.fill(n_tokens)
    keep = pol.select(layout, None, n_tokens, step=0)
    return layout, keep, pol


def seed_rows(seed: int = 0, prompt_len: int = 0, n_tokens: int = 16000, block_size: int = 16,
              n_keep: int = 1600, kv_heads: int = 8, kv_bytes_per_token: float = 147456.0) -> list[dict]:
    """Rows of the seed table (list of dicts). ``kv_bytes_per_token``: Qwen3-8B BF16 by default."""
    rows = []
    free_region = (n_tokens - prompt_len) // block_size  # blocks outside the kept prompt
    expect_uniform = free_region * (1 - (n_keep - prompt_len) / (n_tokens - prompt_len)) ** block_size

    def row(case, layout_groups, comp_name, mode, expected, **comp_kw):
        layout, keep, pol = _random_keep(n_tokens, block_size, layout_groups, n_keep, prompt_len, seed, mode)
        comp = make_compactor(CompactionConfig(name=comp_name, **comp_kw))
        res = comp.apply(layout, keep, kv_bytes_per_token=kv_bytes_per_token, pinned_len=pol.pinned_len(layout))
        d = {"case": case, "groups": layout_groups, "compaction": comp_name + (
            "" if comp_kw.get("release_empty_blocks", True) else " (keep empty)"),
             "tokens_before": res.tokens_before, "tokens_kept": res.tokens_kept,
             "blocks_before": res.blocks_before, "blocks_freed": res.blocks_freed,
             "blocks_after": res.blocks_after, "bytes_moved": res.bytes_moved,
             "new_blocks_next_tokens": np.nan, "expected": expected}
        if comp_name == "hole_fill":
            d["new_blocks_next_tokens"] = layout.append(n_tokens - n_keep)
        rows.append(d)

    row("uniform shared", 1, "none", "union", f"~{expect_uniform:.1f}")
    row("independent per head", kv_heads, "none", "per_head", f"~{expect_uniform * (expect_uniform / free_region) ** (kv_heads - 1):.3g}")
    packed = math.ceil(n_keep / block_size)
    row("uniform shared", 1, "forward_pack", "union", f"{n_tokens // block_size - packed} freed, {packed} left")
    row("independent per head", kv_heads, "forward_pack", "per_head", f"{n_tokens // block_size - packed} freed, {packed} left")
    row("uniform shared", 1, "hole_fill", "union", "0 freed; next tokens: 0 new blocks",
        release_empty_blocks=False)
    row("uniform shared", 1, "hole_fill", "union", "freed == new blocks needed later")

    # streaming_llm, block-aligned window
    sinks = block_size
    window = n_keep - sinks
    pol = make_policy(PolicyConfig(name="streaming_llm", sink_tokens=sinks, recent_window=window, beta=1))
    layout = PagedLayout(block_size, 1, prompt_len)
    layout.fill(n_tokens)
    keep = pol.select(layout, None, n_tokens, step=0)
    res = make_compactor(CompactionConfig(name="none")).apply(layout, keep, kv_bytes_per_token=kv_bytes_per_token)
    rows.append({"case": f"streaming_llm {sinks}+{window}", "groups": 1, "compaction": "none",
                 "tokens_before": res.tokens_before, "tokens_kept": res.tokens_kept,
                 "blocks_before": res.blocks_before, "blocks_freed": res.blocks_freed,
                 "blocks_after": res.blocks_after, "bytes_moved": res.bytes_moved,
                 "new_blocks_next_tokens": np.nan,
                 "expected": f"{(n_tokens - window) // block_size - 1} freed"})
    return rows


def format_table(rows: list[dict]) -> str:
    """Fixed-width text table of :func:`seed_rows`."""
    cols = ["case", "groups", "compaction", "tokens_kept", "blocks_before", "blocks_freed", "blocks_after",
            "bytes_moved", "new_blocks_next_tokens", "expected"]
    fmt = {"tokens_kept": "{:.0f}", "bytes_moved": "{:.3g}", "new_blocks_next_tokens": "{:.0f}"}
    cells = [[(fmt.get(c, "{}").format(r[c]) if not (isinstance(r[c], float) and np.isnan(r[c])) else "-")
              for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.ljust(w) for x, w in zip(xs, widths))
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(x) for x in cells])


def _unwritable(path: str) -> str | None:
    """Why the file ``path`` cannot be written (a folder there, a missing or unwritable parent
    folder), checked before the table is computed; None when it can be."""
    import os
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        return "is a folder; expected a file name"
    parent = p.parent
    if not parent.is_dir():
        return f"its folder {parent} does not exist"
    if not os.access(parent, os.W_OK):
        return f"its folder {parent} is not writable"
    return None


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-len", type=int, default=0)
    ap.add_argument("--csv", default=None, help="write the table as CSV")
    ap.add_argument("--parquet", default=None, help="write the table as Parquet")
    args = ap.parse_args(argv)
    for flag, path in (("--csv", args.csv), ("--parquet", args.parquet)):
        bad = _unwritable(path) if path else None
        if bad:
            ap.error(f"argument {flag}: {path}: {bad}")
    rows = seed_rows(seed=args.seed, prompt_len=args.prompt_len)
    print(format_table(rows))
    if args.csv or args.parquet:
        import pandas as pd

        df = pd.DataFrame(rows)
        if args.csv:
            df.to_csv(args.csv, index=False)
        if args.parquet:
            df.to_parquet(args.parquet, index=False)


if __name__ == "__main__":
    main()
