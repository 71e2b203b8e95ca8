"""policies.layout: PagedLayout's block table kept as slots per group."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies import PagedLayout


@settings(max_examples=60, deadline=None)
@given(groups=st.integers(1, 5), block=st.sampled_from([1, 2, 4]), data=st.data())
def test_paged_layout_blocks_added_and_dropped_as_columns(groups, block, data):
    """Any sequence of block additions, appends, evictions and block drops leaves
    ``slot_pos`` equal to a plain array edited column by column (new blocks: -1 columns at
    the end; a dropped block: its columns deleted), each pointer lowered by the dropped slots
    below it; a copy keeps its slots when blocks are added to the original after."""
    lay = PagedLayout(block, groups, 0)
    ref = np.full((groups, 0), -1, dtype=np.int32)
    ptr = np.zeros(groups, dtype=np.int64)
    nxt = 0
    for _ in range(data.draw(st.integers(1, 25))):
        op = data.draw(st.sampled_from(["add", "append", "drop"]))
        if op == "add":
            k = data.draw(st.integers(0, 3))
            lay.add_blocks(k)
            ref = np.concatenate([ref, np.full((groups, k * block), -1, dtype=np.int32)], axis=1)
        elif op == "append":
            room = ref.shape[1] - int(ptr.max())
            n = data.draw(st.integers(0, room))
            lay.commit_next(n)
            for g in range(groups):
                ref[g, ptr[g]:ptr[g] + n] = np.arange(nxt, nxt + n)
            ptr += n
            nxt += n
        elif ref.shape[1]:
            # empty some blocks in every group, then drop a subset of the empty ones
            nb = ref.shape[1] // block
            clear = data.draw(st.lists(st.integers(0, nb - 1), max_size=nb, unique=True))
            for b in clear:
                lay.slot_pos[:, b * block:(b + 1) * block] = -1
                ref[:, b * block:(b + 1) * block] = -1
            empty = lay.empty_blocks()
            drop = sorted(data.draw(st.lists(st.sampled_from(empty.tolist()), unique=True))
                          if len(empty) else [])
            if drop:
                lay.remove_blocks(drop)
                cols = np.concatenate([np.arange(b * block, (b + 1) * block) for b in drop])
                ptr = ptr - np.array([np.count_nonzero(cols < p) for p in ptr], dtype=np.int64)
                ref = np.delete(ref, cols, axis=1)
        assert lay.slot_pos.shape == ref.shape
        np.testing.assert_array_equal(lay.slot_pos, ref)
        np.testing.assert_array_equal(lay.append_ptr, ptr)
        assert lay.n_blocks == ref.shape[1] // block
    copy = lay.copy()
    np.testing.assert_array_equal(copy.slot_pos, ref)
    lay.add_blocks(1)
    np.testing.assert_array_equal(copy.slot_pos, ref)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 12), st.integers(0, 300), st.sampled_from([16, 8, 12, 1]),
       st.floats(0.0, 1.0), st.booleans(), st.integers(0, 2**32 - 1))
def test_fill_kept_writes_what_filling_evicting_and_removing_leave(H, n, block, share, release,
                                                                   seed):
    """``PagedLayout.fill_kept(n, nb, keep, release)`` on an empty layout leaves the slots,
    append pointers and next position that ``add_blocks(nb)``, ``commit_next(n)``, emptying
    the slots ``keep`` drops and (``release``) removing the blocks then empty in every group
    leave, and returns each group's live, kept and 1 + last kept slot before the removal and
    the removed blocks: sparse and dense keeps, whole blocks dropped in the middle and at the
    end, a spare block past the tokens, block sizes that are and are not multiples of 8."""
    rng = np.random.default_rng(seed)
    nb = -(-n // block) + int(rng.integers(0, 2))
    keep = np.zeros((H, nb * block), dtype=bool)
    keep[:, :n] = rng.random((H, n)) < share * share
    for b in rng.integers(0, max(nb, 1), int(rng.integers(0, 3))) if nb else ():
        keep[:, b * block:(b + 1) * block] = False
    want = PagedLayout(block, H, n)
    want.add_blocks(nb)
    want.commit_next(n)
    live = want.slot_pos >= 0
    last = (np.where(keep.any(axis=1), nb * block - np.argmax(keep[:, ::-1], axis=1), 0) if nb
            else np.zeros(H, dtype=np.int64))
    cnt_want = np.stack([live.sum(axis=1), (keep & live).sum(axis=1), last])
    want.slot_pos[~keep] = -1
    freed_want = want.empty_blocks() if release else np.zeros(0, dtype=np.int64)
    if freed_want.size:
        want.remove_blocks(freed_want)
    got = PagedLayout(block, H, n)
    cnt, freed = got.fill_kept(n, nb, keep, release)
    assert np.array_equal(cnt, cnt_want) and np.array_equal(freed, freed_want)
    assert freed.dtype == np.int64 and cnt.dtype == np.int64
    assert np.array_equal(got.slot_pos, want.slot_pos) and got.slot_pos.dtype == np.int32
    assert np.array_equal(got.append_ptr, want.append_ptr)
    assert got.next_position == want.next_position == n
    for lay in (got, want):  # (blocks added and tokens appended after it)
        lay.add_blocks(2)
        lay.commit_next(2 * block)
    assert np.array_equal(got.slot_pos, want.slot_pos)
    assert np.array_equal(got.append_ptr, want.append_ptr)
    if n:
        with pytest.raises(ValueError, match="empty order-preserving layout"):
            got.fill_kept(n, nb, keep, release)
