"""policies' paged layout and compactors: forward packing's moves contract and bytes moved,
hole filling's slot reuse, blocks freed within bounds, keep masks on empty slots refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import PagedLayout, make_compactor

B = 16


def filled(n, groups=1, prompt=0, block=B, **kw):
    lay = PagedLayout(block, groups, prompt, **kw)
    lay.fill(n)
    return lay


# ------------------------------------------------------------------------- forward pack
def check_moves_contract(moves, pinned, keep, slot_pos_before):
    for g in np.unique(moves[:, 0]) if moves.size else []:
        m = moves[moves[:, 0] == g]
        src, dst = m[:, 1], m[:, 2]
        assert np.all(np.diff(src) > 0), "sources strictly increasing"
        assert np.all(dst <= src), "destination <= source"
        assert np.all(src >= pinned) and np.all(dst >= pinned), "pinned prompt never moved/overwritten"
        assert np.all(np.diff(dst) > 0)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), groups=st.integers(1, 4), prompt=st.integers(0, 40), block=st.sampled_from([4, 16]),
       data=st.data())
def test_forward_pack_contract_property(n, groups, prompt, block, data):
    prompt = min(prompt, n)
    lay = filled(n, groups, prompt, block)
    before = lay.slot_pos.copy()
    keep = np.array(data.draw(st.lists(st.booleans(), min_size=groups * n, max_size=groups * n)),
                    dtype=bool).reshape(groups, n)
    keep = np.pad(keep, ((0, 0), (0, lay.allocated_slots - n)))
    keep[:, :prompt] = True  # protected prompt
    res = make_compactor("forward_pack").apply(lay, keep, kv_bytes_per_token=100.0 * groups, pinned_len=prompt)
    check_moves_contract(res.moves, prompt, keep, before)
    for g in range(groups):
        kept_pos = before[g][keep[g]]
        row = lay.slot_pos[g]
        # order preserved and packed: survivors occupy slots [0, k) in position order
        assert np.array_equal(row[:kept_pos.size], kept_pos)
        assert np.all(row[kept_pos.size:] == -1)
        assert np.array_equal(row[:prompt], np.arange(prompt))  # prompt unmoved
        # each move copies the right token
        m = res.moves[res.moves[:, 0] == g]
        assert np.array_equal(before[g, m[:, 1]], row[m[:, 2]])
    assert 0 <= res.blocks_freed <= res.blocks_before
    assert lay.n_blocks == math.ceil(int(res.kept_per_group.max()) / block)
    assert res.bytes_moved == res.moves.shape[0] * 100.0  # 100 B per token per group


def test_bytes_moved_hand_worked():
    # B = 4, one group, 12 tokens (3 blocks), prompt 2 pinned. Keep positions 0,1 | 3, 6, 7, 10.
    # Packing region starts at slot 2: 3->2, 6->3, 7->4, 10->5  => 4 tokens move.
    # kv_bytes_per_token = 147,456 (Qwen3-8B BF16) and H = 1 => 4 x 147,456 = 589,824 bytes.
    # Survivors occupy slots 0..5 -> 2 blocks; block 2 (slots 8..11) freed.
    lay = filled(12, 1, 2, block=4)
    keep = np.zeros((1, 12), bool)
    keep[0, [0, 1, 3, 6, 7, 10]] = True
    res = make_compactor("forward_pack").apply(lay, keep, kv_bytes_per_token=147456, pinned_len=2)
    assert res.moves.tolist() == [[0, 3, 2], [0, 6, 3], [0, 7, 4], [0, 10, 5]]
    assert res.bytes_moved == 4 * 147456 == 589824
    assert res.freed_block_indices.tolist() == [2] and res.blocks_after == 2
    assert lay.slot_pos[0].tolist() == [0, 1, 3, 6, 7, 10, -1, -1]
    # per_head with 2 groups: each group's token is 147,456 / 2 = 73,728 B. Group 0 as above
    # (4 moves), group 1 keeps 0,1,2,11: 11->3 (1 move) => 5 x 73,728 = 368,640 B.
    lay = filled(12, 2, 2, block=4)
    keep = np.zeros((2, 12), bool)
    keep[0, [0, 1, 3, 6, 7, 10]] = True
    keep[1, [0, 1, 2, 11]] = True
    res = make_compactor("forward_pack").apply(lay, keep, kv_bytes_per_token=147456, pinned_len=2)
    assert res.bytes_moved == 5 * 73728 == 368640
    # ragged: lengths 6 and 4 -> physical length 6 (2 blocks), waste 6 - 4 = 2 slots
    assert res.group_lengths.tolist() == [6, 4] and res.blocks_after == 2
    assert res.ragged_waste_slots == 2 and res.ragged_waste_bytes == 2 * 73728


def test_forward_pack_then_append_continues_after_survivors():
    lay = filled(64, 1, 0)
    keep = np.zeros((1, 64), bool)
    keep[0, ::8] = True  # 8 survivors
    make_compactor("forward_pack").apply(lay, keep)
    assert lay.n_blocks == 1 and lay.append_ptr.tolist() == [8]
    assert lay.append(8) == 0 and lay.append(9) == 1
    lay.commit_append(8)
    assert lay.slot_pos[0, 8:16].tolist() == list(range(64, 72))


def test_per_head_ragged_physical_length_is_longest_group():
    lay = filled(160, 4, 0)
    keep = np.zeros((4, 160), bool)
    for g, k in enumerate([10, 40, 70, 100]):
        keep[g, np.linspace(0, 159, k).astype(int)] = True
    res = make_compactor("forward_pack").apply(lay, keep)
    assert res.group_lengths.tolist() == [10, 40, 70, 100]
    assert lay.n_blocks == math.ceil(100 / B) == 7
    assert res.ragged_waste_slots == (100 - 10) + (100 - 40) + (100 - 70)
    # appends: each group continues at its own tail; physical need = longest group + n
    assert lay.append(12) == 0 and lay.append(13) == 1


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), groups=st.integers(1, 3), comp=st.sampled_from(["none", "forward_pack", "hole_fill"]),
       seed=st.integers(0, 2 ** 16))
def test_blocks_freed_bounds(n, groups, comp, seed):
    rng = np.random.default_rng(seed)
    lay = filled(n, groups)
    keep = (rng.random(lay.slot_pos.shape) < rng.random()) & (lay.slot_pos >= 0)
    before = lay.n_blocks
    res = make_compactor(comp).apply(lay, keep)
    assert 0 <= res.blocks_freed <= before
    assert res.blocks_after == before - res.blocks_freed == lay.n_blocks
    assert lay.live_tokens().tolist() == keep.sum(axis=1).tolist()
    if comp != "forward_pack":
        assert res.bytes_moved == 0 and res.moves.shape == (0, 3)


def test_keep_mask_on_empty_slot_rejected():
    lay = filled(10)
    keep = np.ones(lay.slot_pos.shape, bool)  # slots 10..15 are empty
    with pytest.raises(ValueError, match="empty slot"):
        make_compactor("none").apply(lay, keep)


# ------------------------------------------------------------------------- hole fill
def test_hole_fill_appends_need_no_blocks_until_holes_used():
    lay = filled(160, 1, 0, **make_compactor("hole_fill").layout_kwargs())
    keep = np.zeros((1, 160), bool)
    keep[0, ::2] = True  # 80 survivors, no block wholly empty
    res = make_compactor("hole_fill").apply(lay, keep, kv_bytes_per_token=1000)
    assert res.blocks_freed == 0 and res.bytes_moved == 0
    assert res.metadata_bytes == 4 * 160  # 4 B per slot per group, 160 slots, 1 group
    assert lay.append(80) == 0 and lay.append(81) == 1
    lay.commit_append(80)
    assert lay.slot_pos[0, 1] == 160  # first new token in the first vacated slot: order lost
    assert lay.append(1) == 1
    comp = make_compactor("hole_fill")
    assert comp.read_overhead_factor(147456, 36) == pytest.approx(1 + 4 * 36 / 147456)


def test_hole_fill_reuse_requires_slot_empty_in_every_group():
    lay = filled(32, 2, 0, hole_fill=True)
    keep = np.ones((2, 32), bool)
    keep[0, :8] = False  # group 0 evicts slots 0..7, group 1 keeps them
    keep[:, 8:12] = False  # both evict 8..11
    make_compactor("hole_fill").apply(lay, keep)
    assert lay.free_slots_for_reuse().tolist() == list(range(8, 12))
    assert lay.append(4) == 0 and lay.append(5) == 1
