"""policies.layout: PagedLayout's block table kept as slots per group."""

import numpy as np
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
