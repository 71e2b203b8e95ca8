"""Physical layout of ONE request's KV cache in its block table (paged, vLLM/TensorRT-LLM-like).

A request owns ``n_blocks`` blocks of ``block_size`` token slots; one block id spans every layer and
KV head (one block table per request, design.md section 3). Eviction can be decided per *group*
(union: 1 group; per-head: one per KV head; per-layer-per-head: layers x KV heads), so the layout
stores, for every group and every slot, the token position held there (-1 = empty slot).

Freeing rule (design.md section 3): a block returns to the pool only when no live slot remains in it
across EVERY group sharing the block table. :meth:`PagedLayout.empty_blocks` implements it.

Protocol with the engine (the engine owns physical block ids; the layout only sees block-table
indices):

    k = layout.append(n)          # new blocks needed to place n tokens
    ... engine allocates k physical blocks ...
    layout.add_blocks(k)
    layout.commit_append(n)       # positions default to the next n positions

Compactors (:mod:`policies.compaction`) edit ``slot_pos`` and call :meth:`remove_blocks`; the engine
then returns the physical blocks at those block-table indices to its pool.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from sim.jit import kernel


class PagedLayout:
    """Per-group slot -> position map of one request's paged KV.

    Args:
      block_size: B, token slots per block (vLLM default 16, TRT-LLM 32).
      num_groups: H, number of independent selections sharing the block table (see module doc).
      prompt_len: tokens of the prompt (positions ``0..prompt_len-1``); protected policies keep them.
      hole_fill: if True, new tokens go first into vacated slots (empty in every group), lowest
        slot first, and only then at the end (needs a per-slot position index; see
        :class:`policies.compaction.HoleFill`). Otherwise appends are order preserving: group g
        writes its next token at ``append_ptr[g]``.
      request_key: integer identifying the request (seeds random policies / the importance model).

    State:
      slot_pos: ``int32[H, S]``, S = n_blocks * B, token position in each slot (-1 = empty).
      append_ptr: ``int64[H]``, next slot index for order-preserving appends, per group.
      next_position: next token position to be appended (= tokens appended so far).

    Raises:
      ValueError: on non-positive block_size / num_groups or negative prompt_len.
    """

    def __init__(self, block_size: int, num_groups: int = 1, prompt_len: int = 0, *,
                 hole_fill: bool = False, request_key: int = 0):
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        if num_groups <= 0:
            raise ValueError(f"num_groups must be > 0, got {num_groups}")
        if prompt_len < 0:
            raise ValueError(f"prompt_len must be >= 0, got {prompt_len}")
        self.block_size = int(block_size)
        self.num_groups = int(num_groups)
        self.prompt_len = int(prompt_len)
        self.hole_fill = bool(hole_fill)
        self.request_key = int(request_key)
        # slot_pos is the leading columns of _slots, whose spare columns let blocks be added
        # and dropped in place (a per-layer policy's layout has tens of groups)
        self._slots = np.full((self.num_groups, 0), -1, dtype=np.int32)
        self.slot_pos = self._slots
        self.append_ptr = np.zeros(self.num_groups, dtype=np.int64)
        self.next_position = 0

    # ------------------------------------------------------------------ sizes
    @property
    def n_blocks(self) -> int:
        """Blocks in the block table."""
        return self.slot_pos.shape[1] // self.block_size

    @property
    def allocated_slots(self) -> int:
        """Token slots allocated (n_blocks x block_size), per group."""
        return self.slot_pos.shape[1]

    @property
    def live(self) -> np.ndarray:
        """``bool[H, S]``: slot holds a live token."""
        return self.slot_pos >= 0

    def live_tokens(self) -> np.ndarray:
        """``int64[H]``: live tokens per group."""
        return self.live.sum(axis=1).astype(np.int64)

    def live_tokens_union(self) -> int:
        """Distinct token positions live in at least one group."""
        pos = self.slot_pos[self.slot_pos >= 0]
        return int(np.unique(pos).size)

    def occupancy(self, live_slots: Optional[int] = None) -> float:
        """Live slots / allocated slots over all groups (1.0 = no holes; 1.0 for an empty layout).
        ``live_slots``: the live (group, slot) count if the caller has it (else counted here)."""
        alloc = self.allocated_slots * self.num_groups
        if not alloc:
            return 1.0
        return float(self.live.sum() if live_slots is None else live_slots) / alloc

    def fragmentation(self, live_slots: Optional[int] = None) -> float:
        """Share of allocated slots that hold no live token: ``1 - occupancy(live_slots)``."""
        return 1.0 - self.occupancy(live_slots)

    def group_lengths(self) -> np.ndarray:
        """``int64[H]``: per-group physical length = 1 + highest live slot index (0 if none)."""
        live = self.live
        any_live = live.any(axis=1)
        last = self.allocated_slots - 1 - np.argmax(live[:, ::-1], axis=1)
        return np.where(any_live, last + 1, 0).astype(np.int64)

    def block_live_counts(self) -> np.ndarray:
        """``int64[n_blocks]``: live (group, slot) entries per block, summed over groups."""
        return self.live.reshape(self.num_groups, self.n_blocks, self.block_size).sum(axis=(0, 2))

    def empty_blocks(self) -> np.ndarray:
        """Block-table indices of blocks with no live slot in any group (freeable), ascending ``int64``."""
        out = np.empty(self.n_blocks, dtype=np.int64)
        return out[:_empty_blocks(self.slot_pos, self.block_size, out)]

    # ------------------------------------------------------------------ appends
    def free_slots_for_reuse(self) -> np.ndarray:
        """Slot indices empty in EVERY group (hole_fill reuse candidates), ascending."""
        return np.flatnonzero(~self.live.any(axis=0))

    def append(self, n: int) -> int:
        """Number of NEW blocks the engine must allocate to place ``n`` new tokens (>= 0).

        Order-preserving layout: group g needs slots ``append_ptr[g] .. append_ptr[g]+n-1``; the
        physical length is the longest group's. Hole-fill layout: the ``n`` tokens first take slots
        that are empty in every group, then new blocks.
        Raises ValueError if n < 0.
        """
        if n < 0:
            raise ValueError(f"cannot append a negative number of tokens ({n})")
        if n == 0:
            return 0
        B = self.block_size
        if self.hole_fill:
            free = self.free_slots_for_reuse().size
            short = max(0, n - free)
            return -(-short // B)
        need = int(self.append_ptr.max()) + n
        return max(0, -(-need // B) - self.n_blocks)

    def add_blocks(self, k: int) -> None:
        """Append ``k`` empty blocks at the end of the block table. Raises ValueError if k < 0."""
        if k < 0:
            raise ValueError(f"cannot add a negative number of blocks ({k})")
        if k:
            H, S = self.slot_pos.shape
            new = S + k * self.block_size
            if new > self._slots.shape[1]:  # (room for at least as many slots again)
                grown = np.empty((H, max(new, 2 * S)), dtype=np.int32)
                grown[:, :S] = self.slot_pos
                self._slots = grown
            self._slots[:, S:new] = -1
            self.slot_pos = self._slots[:, :new]

    def commit_append(self, n: int, positions: Optional[np.ndarray] = None) -> np.ndarray:
        """Write ``n`` new tokens (same positions in every group); returns the ``int64[H, n]`` slots used.

        ``positions`` defaults to ``next_position .. next_position + n - 1``.
        Raises ValueError if the allocated blocks cannot hold them (call :meth:`append` and
        :meth:`add_blocks` first) or if ``positions`` has the wrong length.
        """
        if n < 0:
            raise ValueError(f"cannot append a negative number of tokens ({n})")
        next_position = None  # the default positions: known without a reduction
        if positions is None:
            next_position = self.next_position + n
            positions = np.arange(self.next_position, next_position, dtype=np.int64)
        positions = np.asarray(positions, dtype=np.int64)
        if positions.shape != (n,):
            raise ValueError(f"positions must have shape ({n},), got {positions.shape}")
        if n == 0:
            return np.zeros((self.num_groups, 0), dtype=np.int64)
        if self.hole_fill:
            free = self.free_slots_for_reuse()
            if free.size < n:
                raise ValueError(f"hole_fill layout has {free.size} free slots, {n} tokens to place; "
                                 f"allocate {self.append(n)} more block(s) first")
            slots = free[:n]
            self.slot_pos[:, slots] = positions.astype(np.int32)
            self.append_ptr = np.maximum(self.append_ptr, int(slots.max()) + 1)
            out = np.broadcast_to(slots, (self.num_groups, n)).astype(np.int64)
        else:
            ptr = self.append_ptr.tolist()
            if max(ptr) + n > self.allocated_slots:
                raise ValueError(f"{n} tokens do not fit: append_ptr max {max(ptr)}, "
                                 f"{self.allocated_slots} slots allocated; allocate {self.append(n)} "
                                 f"more block(s) first")
            out = self.append_ptr[:, None] + np.arange(n)[None, :]
            if self.num_groups <= 8:  # a slice per group
                pos32 = positions.astype(np.int32)
                for g, p in enumerate(ptr):
                    self.slot_pos[g, p:p + n] = pos32
            else:
                rows = np.repeat(np.arange(self.num_groups), n)
                self.slot_pos[rows, out.ravel()] = np.tile(positions.astype(np.int32), self.num_groups)
            self.append_ptr = self.append_ptr + n
        if next_position is None:
            next_position = max(self.next_position, int(positions.max()) + 1)
        self.next_position = next_position
        return out

    def commit_next(self, n: int) -> None:
        """:meth:`commit_append` of the next ``n`` positions (``next_position`` on), without
        the slots returned: on an order-preserving layout one compiled pass over the groups
        (a per-layer policy's 36 groups took most of a per-step round in the indexing).
        Raises ValueError as :meth:`commit_append`."""
        if n < 0 or self.hole_fill:
            self.commit_append(n)
            return
        if n and not _append_rows(self.slot_pos, self.append_ptr, self.next_position, n):
            self.commit_append(n)  # (raises: the blocks cannot hold them)
        self.next_position += n

    def fill(self, n: int) -> int:
        """Convenience: allocate and commit ``n`` tokens; returns the blocks added."""
        k = self.append(n)
        self.add_blocks(k)
        self.commit_append(n)
        return k

    # ------------------------------------------------------------------ freeing
    def remove_blocks(self, indices) -> None:
        """Remove blocks (block-table indices) from the block table; they must be empty in every group.

        Slots after a removed block shift down by ``block_size``; ``append_ptr`` shifts by the
        number of removed slots below it. Raises ValueError if a block still holds a live token or an
        index is out of range.
        """
        idx = np.unique(np.asarray(indices, dtype=np.int64))
        if idx.size == 0:
            return
        if idx[0] < 0 or idx[-1] >= self.n_blocks:
            raise ValueError(f"block index out of range [0, {self.n_blocks}): {idx.tolist()[:8]}")
        counts = self.block_live_counts()
        if (counts[idx] > 0).any():
            bad = idx[counts[idx] > 0]
            raise ValueError(f"cannot free blocks {bad.tolist()[:8]}: they still hold live slots")
        self._drop_blocks(idx)

    def _drop_blocks(self, idx: np.ndarray) -> None:
        """Remove blocks ``idx`` (distinct, ascending, in range, empty in every group): the
        unchecked part of :meth:`remove_blocks`."""
        B = self.block_size
        nb = self.n_blocks
        k = len(idx)
        self.append_ptr = self._pointers_after_drop(self.append_ptr, idx, nb)
        if int(idx[0]) != nb - k:  # (dropping the trailing blocks moves nothing)
            _drop_blocks_in_place(self.slot_pos, np.ascontiguousarray(idx, dtype=np.int64), B)
        self.slot_pos = self._slots[:, :(nb - k) * B]

    def _pointers_after_drop(self, ptr: np.ndarray, idx: np.ndarray, nb: int) -> np.ndarray:
        """The append pointers ``ptr`` (``int64[H]``, within a table of ``nb`` blocks) after
        the blocks ``idx`` (distinct, ascending) are removed: each loses the removed slots
        below it (block b removes ``[bB, bB + B)`` of ``[0, ptr)``)."""
        B = self.block_size
        k = len(idx)
        if int(idx[0]) == nb - k:  # the trailing blocks: what lies past the kept blocks
            return np.minimum(ptr, (nb - k) * B)
        return ptr - np.clip(ptr[:, None] - idx[None, :] * B, 0, B).sum(axis=1)

    def fill_kept(self, n: int, n_blocks: int, keep: np.ndarray, release: bool) -> tuple:
        """On a layout with no blocks and no token: the state that :meth:`add_blocks`
        (``n_blocks``), ``commit_next(n)``, emptying the slots ``keep`` (``bool[H, n_blocks x
        B]``, True on slots below ``n`` only) drops and, with ``release``, removing the blocks
        then empty in every group leave, written once without the full ``H x S`` table in
        between (the slot table of a round on a prompt no group has evicted from yet: every
        group holds positions ``0..n-1`` in slots ``0..n-1``). Returns ``(cnt, freed)``:
        ``cnt`` (``int64[3, H]``) each group's live slots before (``n``), kept slots and 1 +
        its last kept slot (0 if none) in the table before the removal, and ``freed`` the
        removed blocks' indices in that table (ascending ``int64``). Raises ValueError when
        the layout is not empty, is a hole-fill one, or the blocks cannot hold ``n`` tokens."""
        B = self.block_size
        H = self.num_groups
        if self.slot_pos.shape[1] or self.next_position or self.hole_fill:
            raise ValueError("fill_kept needs an empty order-preserving layout (no blocks, no "
                             "token placed)")
        if not 0 <= n <= n_blocks * B or keep.shape != (H, n_blocks * B):
            raise ValueError(f"fill_kept: {n} tokens in {n_blocks} blocks of {B} slots, keep of "
                             f"shape {keep.shape} (expected ({H}, {n_blocks * B}))")
        cnt = np.empty((3, H), dtype=np.int64)
        used = np.empty(n_blocks, dtype=np.bool_)
        _kept_counts(n, B, keep, cnt, used)
        freed = (np.flatnonzero(~used).astype(np.int64) if release
                 else np.zeros(0, dtype=np.int64))
        blocks = np.flatnonzero(used) if release else np.arange(n_blocks, dtype=np.int64)
        out = np.empty((H, blocks.size * B), dtype=np.int32)
        _kept_rows(n, B, keep, blocks.astype(np.int64), out)
        self._slots = self.slot_pos = out
        ptr = np.full(H, n, dtype=np.int64)
        self.append_ptr = self._pointers_after_drop(ptr, freed, n_blocks) if freed.size else ptr
        self.next_position = n
        return cnt, freed

    def copy(self) -> "PagedLayout":
        """Deep copy."""
        out = PagedLayout(self.block_size, self.num_groups, self.prompt_len,
                          hole_fill=self.hole_fill, request_key=self.request_key)
        out._slots = out.slot_pos = self.slot_pos.copy()
        out.append_ptr = self.append_ptr.copy()
        out.next_position = self.next_position
        return out

    def __repr__(self) -> str:
        return (f"PagedLayout(B={self.block_size}, H={self.num_groups}, prompt_len={self.prompt_len}, "
                f"n_blocks={self.n_blocks}, live={self.live_tokens().tolist()[:4]}, "
                f"hole_fill={self.hole_fill})")


@kernel("b1(i4[:, :], i8[:], i8, i8)")
def _append_rows(slot_pos, append_ptr, first, n):  # pragma: no cover (compiled)
    """Positions ``first..first+n-1`` into every group's slots from its append pointer on,
    the pointers advanced by ``n``; False (nothing written) when a group's blocks cannot
    hold them."""
    for g in range(slot_pos.shape[0]):
        if append_ptr[g] + n > slot_pos.shape[1]:
            return False
    for g in range(slot_pos.shape[0]):
        j = append_ptr[g]
        for i in range(n):
            slot_pos[g, j + i] = first + i
        append_ptr[g] = j + n
    return True


@kernel("void(i4[:, :], i8[:], i8)")
def _drop_blocks_in_place(slot_pos, idx, B):  # pragma: no cover (compiled)
    """Moves the blocks after each of ``idx`` (distinct, ascending) down over it: the kept
    blocks' slots in order in the first ``S - len(idx) B`` slots of each group (the slots
    before the first dropped block stay where they are)."""
    H, S = slot_pos.shape
    for g in range(H):
        d = idx[0] * B
        for i in range(idx.shape[0]):
            b0 = idx[i] + 1
            b1 = idx[i + 1] if i + 1 < idx.shape[0] else S // B
            for j in range(b0 * B, b1 * B):  # (a run of kept blocks, moved down)
                slot_pos[g, d] = slot_pos[g, j]
                d += 1


@kernel("i8(i4[:, :], i8, i8[:])")
def _empty_blocks(slot_pos, B, out):  # pragma: no cover (compiled)
    """Block indices (ascending) whose slots are empty (-1) in every group, into ``out``;
    returns how many."""
    m = 0
    for b in range(slot_pos.shape[1] // B):
        empty = True
        for g in range(slot_pos.shape[0]):
            for s in range(b * B, (b + 1) * B):
                if slot_pos[g, s] >= 0:
                    empty = False
                    break
            if not empty:
                break
        if empty:
            out[m] = b
            m += 1
    return m


@kernel("void(i8, i8, b1[:, :], i8[:, :], b1[:])")
def _kept_counts(n, B, keep, cnt, used):  # pragma: no cover (compiled)
    """For groups holding positions ``0..n-1`` in slots ``0..n-1``: ``cnt[0, g] = n``,
    ``cnt[1, g]`` slots ``keep`` keeps, ``cnt[2, g]`` 1 + the last of them (0 if none);
    ``used[b]``: block ``b`` keeps a slot in some group."""
    H, S = keep.shape
    for b in range(S // B):
        used[b] = False
    for g in range(H):
        kept = 0
        last = -1
        for j in range(n):
            if keep[g, j]:
                kept += 1
                last = j
                used[j // B] = True
        cnt[0, g] = n
        cnt[1, g] = kept
        cnt[2, g] = last + 1


@kernel("void(i8, i8, b1[:, :], i8[:], i4[:, :])")
def _kept_rows(n, B, keep, blocks, out):  # pragma: no cover (compiled)
    """``out[g]``: the slots of ``blocks`` (ascending) in order, each the position ``j`` its
    slot ``j`` holds where ``keep[g, j]`` (``j < n``), else -1 (a select per slot, without a
    branch: kept slots fall anywhere in a block)."""
    for g in range(keep.shape[0]):
        d = 0
        for i in range(blocks.shape[0]):
            j0 = blocks[i] * B
            if j0 + B <= n:
                for x in range(B):
                    out[g, d + x] = np.int32(j0 + x) if keep[g, j0 + x] else np.int32(-1)
            else:
                for x in range(B):
                    j = j0 + x
                    out[g, d + x] = np.int32(j) if j < n and keep[g, j] else np.int32(-1)
            d += B
