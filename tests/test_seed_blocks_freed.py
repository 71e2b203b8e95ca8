"""experiments.seed_blocks_freed: the seed table of blocks freed by uniform and per-head
survivors, its mean over seeds, and its command line's refusal of an unwritable output."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.seed_blocks_freed import seed_rows
from policies import PagedLayout, make_compactor

B = 16


def filled(n, groups=1, prompt=0, block=B, **kw):
    lay = PagedLayout(block, groups, prompt, **kw)
    lay.fill(n)
    return lay


def uniform_keep(n, n_keep, groups, rng, shared=True):
    keep = np.zeros((groups, n), dtype=bool)
    if shared:
        keep[:, rng.choice(n, n_keep, replace=False)] = True
    else:
        for g in range(groups):
            keep[g, rng.choice(n, n_keep, replace=False)] = True
    return keep


# ------------------------------------------------------------------------- seed numbers
def test_seed_table_fixed_seed():
    rows = {(r["case"], r["compaction"]): r for r in seed_rows(seed=0)}
    u = rows[("uniform shared", "none")]
    assert 150 <= u["blocks_freed"] <= 220 and u["blocks_freed"] == 181  # seed 0 value
    assert rows[("independent per head", "none")]["blocks_freed"] == 0
    for case in ("uniform shared", "independent per head"):
        r = rows[(case, "forward_pack")]
        assert r["blocks_freed"] == 900 and r["blocks_after"] == 100
    hf = rows[("uniform shared", "hole_fill (keep empty)")]
    assert hf["blocks_freed"] == 0 and hf["bytes_moved"] == 0 and hf["new_blocks_next_tokens"] == 0
    hf2 = rows[("uniform shared", "hole_fill")]
    assert hf2["blocks_freed"] == hf2["new_blocks_next_tokens"] == u["blocks_freed"]
    s = [r for k, r in rows.items() if k[0].startswith("streaming_llm")][0]
    assert s["blocks_freed"] == 900 and s["tokens_kept"] == 1600


def test_uniform_mean_over_seeds_matches_0_9_pow_16():
    # 200 seeds x (16,000 tokens, keep 1,600 shared, no compaction): mean blocks freed ~ 185.3.
    # Exact (sampling without replacement): 1000 * prod_{i<16} (14400-i)/(16000-i) = 185.15;
    # per-seed sd ~ 12, so the mean of 200 has sd ~ 0.9: +-4 blocks is > 4 sigma.
    rng = np.random.default_rng(12345)
    comp = make_compactor("none")
    freed = []
    for _ in range(200):
        lay = filled(16000)
        freed.append(comp.apply(lay, uniform_keep(16000, 1600, 1, rng)).blocks_freed)
    assert abs(np.mean(freed) - 1000 * 0.9 ** 16) < 4.0


def test_independent_heads_free_nothing():
    rng = np.random.default_rng(1)
    lay = filled(16000, groups=8)
    res = make_compactor("none").apply(lay, uniform_keep(16000, 1600, 8, rng, shared=False))
    assert res.blocks_freed == 0 and lay.n_blocks == 1000

def test_seed_blocks_freed_refuses_an_unwritable_output_before_computing(tmp_path, capsys):
    """``--csv`` in a missing folder, or ``--parquet`` naming a folder, is a usage error (exit 2)
    naming the path, raised before the table is computed."""
    from experiments.seed_blocks_freed import main

    for args, part in ((["--csv", str(tmp_path / "no" / "x.csv")], "does not exist"),
                       (["--parquet", str(tmp_path)], "is a folder")):
        with pytest.raises(SystemExit) as ei:
            main(args)
        assert ei.value.code == 2
        err = capsys.readouterr().err
        assert f"argument {args[0]}: {args[1]}: " in err and part in err
