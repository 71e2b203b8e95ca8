"""The eviction policies' rounds on a decoding request: cadence, budget, what each keeps
(TriAttention, StreamingLLM, H2O, TOVA, SnapKV, PyramidKV, Ada-KV, R-KV, random, Quest, full)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import SINGLE_ENGINE
from policies import (ImportanceModel, ImportanceParams, PagedLayout, PolicyConfig, make_compactor,
                      make_policy, score_slots)
from policies.eviction import ModelShape

B = 16


def filled(n, groups=1, prompt=0, block=B, **kw):
    lay = PagedLayout(block, groups, prompt, **kw)
    lay.fill(n)
    return lay


# ------------------------------------------------------------------------- policies
def run_decode(policy, prompt, steps):
    """Return the n_tokens values at which rounds fire during `steps` decode steps."""
    st_ = policy.new_state(1, prompt)
    fired = [prompt] if policy.on_prefill_end(st_) else []
    for n in range(prompt + 1, prompt + steps + 1):
        if policy.on_decode(st_, n):
            fired.append(n)
    return fired


def test_triattention_cadence_and_keep():
    pol = make_policy(PolicyConfig(name="triattention", budget=64, beta=16))
    fired = run_decode(pol, prompt=40, steps=200)
    assert fired[0] == 40 + 80  # first multiple of beta > budget; sequence exceeds prompt + budget
    assert fired[0] > 40 + 64 and np.all(np.diff(fired) == 16)
    st_ = pol.new_state(1, 40)
    pol.on_prefill_end(st_)
    assert pol.next_round_at(st_) == 120
    # keep: prompt + budget decode tokens
    lay = filled(120, 1, 40)
    sc = score_slots(ImportanceModel(seed=0), lay, step=80)
    keep = pol.select(lay, sc, 120, 80)
    pos = lay.slot_pos[0]
    assert keep[0, (pos >= 0) & (pos < 40)].all() and keep[0, pos >= 40].sum() == 64
    # top-64 of decode tokens by score
    dec = np.flatnonzero((pos >= 40))
    best = dec[np.argsort(-sc[0, dec], kind="stable")[:64]]
    assert set(np.flatnonzero(keep[0] & (pos >= 40))) == set(best)
    assert not pol.needs_attention_scores
    shape = ModelShape(36, 8, 32, 128, 147456)
    assert pol.scoring_bytes(shape, 120, 40, 8) == 80 * 147456 / 2


def test_triattention_per_head_mode_groups():
    pol = make_policy(PolicyConfig(name="triattention", budget=32, beta=16, mode="per_head"))
    assert pol.num_groups(8, 36) == 8
    lay = filled(100, 8, 20)
    keep = pol.select(lay, score_slots(ImportanceModel(ImportanceParams(head_correlation=0.0)), lay), 100, 80)
    assert keep.sum(axis=1).tolist() == [52] * 8
    assert make_policy(PolicyConfig(name="triattention", mode="per_layer_per_head")).num_groups(8, 36) == 288


def test_streaming_llm_keeps_sinks_and_window():
    pol = make_policy(PolicyConfig(name="streaming_llm", sink_tokens=4, recent_window=28, beta=1))
    lay = filled(100)
    keep = pol.select(lay, None, 100, 0)
    kept = lay.slot_pos[keep]
    assert keep.sum() == 4 + 28
    assert kept.tolist() == list(range(4)) + list(range(72, 100))
    fired = run_decode(pol, prompt=10, steps=40)
    assert fired[0] == 33 and np.all(np.diff(fired) == 1)


def test_h2o_budget_and_recent():
    pol = make_policy(PolicyConfig(name="h2o", budget=40, beta=1, protect_prompt=False))
    lay = filled(100)
    keep = pol.select(lay, score_slots(ImportanceModel(seed=3), lay), 100, 60)
    assert keep.sum() == 40
    assert keep[0, 80:100].all()  # 20 most recent (heavy_ratio 0.5)
    assert pol.needs_attention_scores and pol.scoring_when == "step"
    with pytest.raises(ValueError, match="below the protected prompt"):
        make_policy(PolicyConfig(name="h2o", budget=40, protect_prompt=True)).new_state(0, 100)


@pytest.mark.parametrize("name", ["h2o", "tova"])
def test_total_budget_eviction_protected_prompt_within_budget(name):
    """A total-budget policy with a protected prompt serves prompts up to its budget and
    refuses a longer one, naming the policy, the budget and the prompt; unprotected, any
    prompt is served."""
    pol = make_policy(PolicyConfig(name=name, budget=40, protect_prompt=True))
    assert pol.budget_scope == "total"
    assert pol.new_state(0, 40).prompt_len == 40
    with pytest.raises(ValueError, match=rf"^{name}: budget 40 \(total tokens\) is below the "
                                         r"protected prompt of 41 tokens$"):
        pol.new_state(0, 41)
    make_policy(PolicyConfig(name=name, budget=40, protect_prompt=False)).new_state(0, 1000)


def test_tova_drops_lowest():
    pol = make_policy(PolicyConfig(name="tova", budget=10, beta=1, protect_prompt=False, mode="union"))
    lay = filled(11)
    sc = np.arange(1, lay.allocated_slots + 1, dtype=np.float32)[None, :]
    sc[0, 5] = 0.0
    keep = pol.select(lay, sc, 11, 0)
    assert keep.sum() == 10 and not keep[0, 5]


def test_snapkv_fires_once_and_compresses_prompt():
    pol = make_policy(PolicyConfig(name="snapkv", budget=64, observation_window=8, pooling_kernel=7))
    assert pol.mode == "per_head" and pol.num_groups(4, 2) == 4
    assert run_decode(pol, prompt=300, steps=500) == [300]
    assert run_decode(pol, prompt=50, steps=500) == []  # prompt within budget: never
    lay = filled(300, 4, 300)
    keep = pol.select(lay, score_slots(ImportanceModel(seed=0), lay), 300, 0)
    assert keep.sum(axis=1).tolist() == [64] * 4
    assert keep[:, 292:300].all()  # observation window kept
    assert pol.pinned_len(lay) == 0  # the prompt may move
    res = make_compactor("forward_pack").apply(lay, keep, pinned_len=pol.pinned_len(lay))
    assert res.blocks_after == 4 and res.blocks_freed == math.ceil(300 / B) - 4


def test_pyramidkv_layer_budgets_decrease():
    pol = make_policy(PolicyConfig(name="pyramidkv", budget=256, observation_window=8))
    H = pol.num_groups(2, 4)
    kb = pol.layer_budgets(4)
    assert np.all(np.diff(kb) < 0) and abs(kb.mean() - 256) <= 1 and kb[-1] == round(256 / 20)
    lay = filled(1000, H, 1000)
    keep = pol.select(lay, score_slots(ImportanceModel(seed=0), lay), 1000, 0)
    assert keep.sum(axis=1).tolist() == np.repeat(kb, 2).tolist()
    with pytest.raises(ValueError, match="mode"):
        make_policy(PolicyConfig(name="pyramidkv", mode="union"))


def test_ada_kv_layer_total_and_floor():
    pol = make_policy(PolicyConfig(name="ada_kv", budget=100, observation_window=10, ada_floor=0.2))
    H = pol.num_groups(4, 2)
    lay = filled(1000, H, 1000)
    imp = ImportanceModel(ImportanceParams(head_correlation=0.2, sigma_spread=0.8), seed=1)
    keep = pol.select(lay, score_slots(imp, lay), 1000, 0)
    per = keep.sum(axis=1)
    assert per.reshape(2, 4).sum(axis=1).tolist() == [400, 400]  # layer total = budget x heads
    assert per.min() >= 10 + 18 and len(set(per.tolist())) > 1  # floor respected; ragged


def test_r_kv_budget():
    pol = make_policy(PolicyConfig(name="r_kv", budget=64, beta=32, observation_window=8))
    lay = filled(300, 1, 50)
    keep = pol.select(lay, score_slots(ImportanceModel(seed=0), lay), 300, 250)
    pos = lay.slot_pos[0]
    assert keep[0, (pos >= 0) & (pos < 50)].all() and keep[0, pos >= 50].sum() == 64 and keep[0, 292:300].all()
    assert run_decode(pol, 50, 200)[0] == 50 + 96


def test_random_seeded_and_budget():
    cfg = PolicyConfig(name="random", budget=100, seed=7, mode="per_head")
    pol = make_policy(cfg)
    lay = filled(500, 3, 20)
    a, b = pol.select(lay, None, 500, 5), pol.select(lay, None, 500, 5)
    assert np.array_equal(a, b) and a.sum(axis=1).tolist() == [120] * 3
    assert not np.array_equal(a[0], a[1])


def test_quest_frees_nothing_reads_fraction():
    pol = make_policy(PolicyConfig(name="quest", budget=256))
    assert not pol.frees_memory and run_decode(pol, 100, 1000) == []
    lay = filled(4000)
    keep = pol.select(lay, None, 4000, 0)
    assert keep.sum() == 4000
    assert make_compactor("forward_pack").apply(lay, keep).blocks_freed == 0
    assert pol.pages_read(250, 16) == 16
    assert pol.reads_fraction(250, 36, 16) == pytest.approx((2 * 250 + 34 * 16) / (36 * 250))


@pytest.mark.parametrize("block_size", [16, 32])
def test_quest_pages_are_the_pools_blocks(tmp_path, monkeypatch, block_size):
    """Quest's pages are the pool's blocks: every call the simulator makes for its read
    fraction passes cache.block_size (16 and 32 tokens)."""
    from policies.quest import QuestPolicy
    from sim.run import compose_config, run_simulation

    seen = []
    real = QuestPolicy.reads_fraction

    def spy(self, n_blocks, num_layers, block_size=16):
        seen.append(block_size)
        return real(self, n_blocks, num_layers, block_size)

    monkeypatch.setattr(QuestPolicy, "reads_fraction", spy)
    s = run_simulation(compose_config([*SINGLE_ENGINE, "trace.max_requests=10", "policy=quest",
                                       "policy.budget=256", f"cache.block_size={block_size}",
                                       "sim.progress=false"]), tmp_path / "q")
    assert s["requests_finished"] == 10 and len(seen) > 10 and set(seen) == {block_size}


def test_full_never_fires():
    pol = make_policy(PolicyConfig(name="full"))
    assert run_decode(pol, 100, 5000) == [] and pol.next_round_at(pol.new_state(0, 100)) is None
