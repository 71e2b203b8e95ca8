"""Compactors: apply a keep mask to a layout, move survivors (or not), free wholly empty blocks.

Algorithm-neutral, as TensorRT-LLM's shared compaction mover (seed 001): the policy writes its keep
decision, the compactor decides the physical moves. Three styles (design.md section 3):

- ``none``: holes stay; only blocks with no live slot in any group are freed.
- ``forward_pack``: order preserving. In every group, survivors outside the pinned prefix (the
  protected prompt) move to the lowest slots after it, in slot (= position) order; trailing blocks
  empty out and are freed. Cost = every (token, group) whose slot changes x bytes per token per
  group. Groups pack independently; under one shared block table the physical length is the
  longest group's, the rest is reported as ragged waste.
- ``hole_fill``: nothing moves at the round (0 bytes; only wholly empty blocks are freed); the
  layout switches to slot reuse: new tokens go into vacated slots (empty in every group) before
  new blocks are allocated. Order is lost, so each slot stores a position index that attention
  kernels read (metadata bytes, read overhead).

``compactor.apply(layout, keep, kv_bytes_per_token=0, pinned_len=None) -> RoundResult`` edits the
layout in place (evicts, moves, removes freed blocks from the block table) and returns what
happened. ``freed_block_indices`` and ``moves`` are in the block table's coordinates BEFORE the
round (what a mover kernel and the block pool see); the engine returns the physical blocks at those
indices to its pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from sim.jit import kernel

from .config import CompactionConfig, validate_compaction_config
from .layout import PagedLayout


@dataclass
class RoundResult:
    """Outcome of one compaction round on one request.

    Token counts are per group, averaged over the H groups (exact integers when every group keeps
    the same number, e.g. union mode); ``kept_per_group`` has the exact per-group counts.

    Fields:
      tokens_before / tokens_kept / tokens_evicted: live tokens per group before, after, evicted.
      blocks_before / blocks_after: blocks in the block table before/after the round.
      freed_block_indices: ``int64[k]`` pre-round block-table indices of freed blocks (ascending).
      bytes_moved: bytes copied by the mover (each moved byte is read once and written once).
      moves: ``int64[M, 3]`` rows (group, src_slot, dst_slot), pre-round slot indices, sorted by
        group then src; per group src strictly increasing, dst <= src, pinned slots never appear.
      kept_per_group: ``int64[H]`` live tokens per group after the round.
      group_lengths: ``int64[H]`` per-group packed length (slots) after the round.
      ragged_waste_slots: sum over groups of (longest group's length - own length): slots held in
        the shared block table beyond each group's own need.
      ragged_waste_bytes: ragged_waste_slots x bytes per token per group.
      metadata_bytes: position-index bytes held after the round (hole_fill), else 0.
    """

    tokens_before: float
    tokens_kept: float
    tokens_evicted: float
    blocks_before: int
    blocks_after: int
    freed_block_indices: np.ndarray
    bytes_moved: float
    moves: np.ndarray
    kept_per_group: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    group_lengths: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    ragged_waste_slots: int = 0
    ragged_waste_bytes: float = 0.0
    metadata_bytes: float = 0.0

    @property
    def blocks_freed(self) -> int:
        """Blocks returned to the pool this round (= len(freed_block_indices), >= 0)."""
        return int(self.freed_block_indices.size)

    @property
    def tokens_moved(self) -> int:
        """(token, group) entries whose slot changed."""
        return int(self.moves.shape[0])

    def as_row(self) -> dict:
        """Flat dict for a ``rounds.parquet`` row (arrays summarised)."""
        return {"tokens_before": self.tokens_before, "tokens_kept": self.tokens_kept,
                "tokens_evicted": self.tokens_evicted, "blocks_before": self.blocks_before,
                "blocks_after": self.blocks_after, "blocks_freed": self.blocks_freed,
                "bytes_moved": self.bytes_moved, "tokens_moved": self.tokens_moved,
                "ragged_waste_slots": self.ragged_waste_slots, "ragged_waste_bytes": self.ragged_waste_bytes,
                "metadata_bytes": self.metadata_bytes}


def _row_counts(mask: np.ndarray) -> np.ndarray:
    """``int64[H]``: True entries per row of a ``bool[H, S]`` mask."""
    if mask.shape[0] == 1:
        return np.array([np.count_nonzero(mask)], dtype=np.int64)
    return mask.sum(axis=1)


class Compactor:
    """Base compactor (style ``none``). Args: cfg: :class:`policies.config.CompactionConfig`."""

    name = "none"
    moves_tokens = False

    def __init__(self, cfg: Optional[CompactionConfig] = None):
        self.cfg = cfg if cfg is not None else CompactionConfig(name=self.name)
        validate_compaction_config(self.cfg)

    def layout_kwargs(self) -> dict:
        """Keyword arguments for :class:`PagedLayout` under this compactor (``hole_fill`` flag)."""
        return {"hole_fill": False}

    def metadata_bytes(self, layout: PagedLayout) -> float:
        """Per-request metadata bytes this style keeps (position indices; 0 here)."""
        return 0.0

    def read_overhead_factor(self, kv_bytes_per_token: float, num_layers: int, num_groups: int = 1) -> float:
        """Multiplier on attention's KV read bytes per live token (1.0 = none)."""
        return 1.0

    # ------------------------------------------------------------------------------------------
    def _check_keep(self, layout: PagedLayout, keep):
        """``(keep as a bool array, live mask of the layout)``; ValueError on a malformed mask."""
        keep = np.asarray(keep)
        if keep.dtype != bool:
            raise ValueError(f"keep mask must be bool, got {keep.dtype}")
        if keep.shape != layout.slot_pos.shape:
            raise ValueError(f"keep mask shape {keep.shape} != layout slots {layout.slot_pos.shape} (H, S)")
        live = layout.slot_pos >= 0
        bad = keep & ~live
        if bad.any():
            g, s = np.argwhere(bad)[0]
            raise ValueError(f"keep mask keeps an empty slot (group {g}, slot {s}); policies must never do that")
        return keep, live

    def _pack(self, layout: PagedLayout, keep: np.ndarray, pinned: int) -> np.ndarray:
        """Evict the slots ``keep`` drops and move the survivors (style-dependent); returns the
        ``int64[M, 3]`` moves. Base: eviction only."""
        layout.slot_pos[~keep] = -1
        return np.zeros((0, 3), dtype=np.int64)

    def apply(self, layout: PagedLayout, keep, kv_bytes_per_token: float = 0.0,
              pinned_len: Optional[int] = None) -> RoundResult:
        """Evict ``~keep`` slots, move survivors (style-dependent), free wholly empty blocks.

        Args:
          layout: the request's :class:`PagedLayout` (modified in place).
          keep: ``bool[H, S]`` keep mask (True only on live slots; ValueError otherwise).
          kv_bytes_per_token: K+V bytes of one token over all layers and heads; bytes per token per
            group = kv_bytes_per_token / H.
          pinned_len: leading slots never moved (forward_pack); default ``layout.prompt_len`` if
            ``cfg.pin_prompt`` else 0 (engine: pass ``policy.pinned_len(layout)``).
        Returns: :class:`RoundResult`. Raises ValueError on a malformed keep mask.
        """
        keep, live = self._check_keep(layout, keep)
        H = layout.num_groups
        before = _row_counts(live)  # = layout.live_tokens()
        blocks_before = layout.n_blocks
        if pinned_len is None:
            pinned_len = layout.prompt_len if self.cfg.pin_prompt else 0
        moves = self._pack(layout, keep, int(pinned_len))
        per_group_bytes = float(kv_bytes_per_token) / H
        freed = layout.empty_blocks() if self.cfg.release_empty_blocks else np.zeros(0, dtype=np.int64)
        kept = _row_counts(keep)  # = layout.live_tokens(): keep is within the live slots, moves keep counts
        lengths = self._group_lengths(layout)
        if len(freed):
            layout._drop_blocks(freed)  # empty by construction (empty_blocks)
        waste = int((lengths.max() - lengths).sum()) if H > 1 and lengths.size else 0
        if H == 1:  # the means of one value (the same floats, without three numpy reductions)
            b0, k0 = int(before[0]), int(kept[0])
            t_before, t_kept, t_evicted = float(b0), float(k0), float(b0 - k0)
        else:
            t_before, t_kept = float(before.mean()), float(kept.mean())
            t_evicted = float((before - kept).mean())
        return RoundResult(
            tokens_before=t_before, tokens_kept=t_kept,
            tokens_evicted=t_evicted, blocks_before=blocks_before,
            blocks_after=layout.n_blocks, freed_block_indices=freed,
            bytes_moved=moves.shape[0] * per_group_bytes, moves=moves, kept_per_group=kept,
            group_lengths=lengths, ragged_waste_slots=waste, ragged_waste_bytes=waste * per_group_bytes,
            metadata_bytes=self.metadata_bytes(layout))

    def _group_lengths(self, layout: PagedLayout) -> np.ndarray:
        return layout.group_lengths()


class NoCompaction(Compactor):
    """``none``: holes stay where eviction left them; a block is freed only if no live slot remains
    in it in any group (design.md section 3). 0 bytes moved. Appends continue at the end."""

    name = "none"


class ForwardPack(Compactor):
    """``forward_pack``: order-preserving compaction (TriAttention / TensorRT-LLM compaction mover).

    Per group, survivors at slots >= pinned_len move to slots pinned_len, pinned_len+1, ... in slot
    order; slots < pinned_len (the protected prompt) never move. Moves are emitted with sources in
    ascending order so an in-place copy never overwrites an unread source (dst <= src). Trailing
    blocks become empty and are freed; the next append goes right after each group's last survivor.
    Raises ValueError on a hole-fill layout (slot order would not be position order).
    Source: TensorRT-LLM ``kv_cache_compression/compaction.py`` (kept tokens then protected tail,
    ascending sources); TriAttention blog "forward-packing compaction".
    """

    name = "forward_pack"
    moves_tokens = True

    def _pack(self, layout, keep, pinned):
        if layout.hole_fill:
            raise ValueError("forward_pack on a hole_fill layout: slot order is not position order")
        moves = np.empty((np.count_nonzero(keep), 3), dtype=np.int64)  # at most one per survivor
        m = _forward_pack(layout.slot_pos, keep, layout.append_ptr, int(pinned), moves)
        return moves[:m]

    def _group_lengths(self, layout):
        return layout.append_ptr.astype(np.int64).copy()


class HoleFill(Compactor):
    """``hole_fill``: slot reuse. Nothing moves at the round (0 bytes; only wholly empty blocks are
    freed); afterwards new tokens go into slots vacated in every group, lowest first, before any new
    block is allocated (the layout's ``hole_fill`` flag is set by :meth:`apply`; create layouts with
    :meth:`layout_kwargs`). Cache order is lost: each slot stores a position index of
    ``position_index_bytes`` (per group if ``position_index_per_group``), which every attention
    kernel reads. Source: design.md section 3 (b); seed 000 ("token 16,001 in the slot of token 40").
    """

    name = "hole_fill"

    def layout_kwargs(self):
        return {"hole_fill": True}

    def _pack(self, layout, keep, pinned):
        layout.hole_fill = True
        return super()._pack(layout, keep, pinned)

    def metadata_bytes(self, layout):
        """``position_index_bytes`` x allocated slots x (H if per group else 1), bytes."""
        per = layout.num_groups if self.cfg.position_index_per_group else 1
        return float(self.cfg.position_index_bytes) * layout.allocated_slots * per

    def read_overhead_factor(self, kv_bytes_per_token, num_layers, num_groups=1):
        """1 + index bytes read per token / KV bytes read per token: each layer's kernel reads the
        slot's position index (per group if stored per group; for per-layer groups the index is
        read once per layer anyway)."""
        if kv_bytes_per_token <= 0:
            return 1.0
        per = max(1, num_groups // max(1, num_layers)) if self.cfg.position_index_per_group else 1
        idx = float(self.cfg.position_index_bytes) * num_layers * per
        return 1.0 + idx / float(kv_bytes_per_token)


@kernel("i8(i4[:, :], b1[:, :], i8[:], i8, i8[:, :])")
def _forward_pack(slot_pos, keep, append_ptr, pinned, moves):  # pragma: no cover (compiled)
    """:class:`ForwardPack` on the arrays, group by group: the pinned slots (below
    ``min(pinned, append_ptr[g])``) that ``keep`` drops are emptied; the survivors after them
    move down to the next slots in slot order (the ones before the first hole stay put); every
    slot after the last survivor is emptied; ``append_ptr[g]`` = the slot after it. Writes the
    moves ``(group, source slot, destination slot)`` into ``moves`` (ascending sources per
    group) and returns how many."""
    m = 0
    S = slot_pos.shape[1]
    for g in range(slot_pos.shape[0]):
        p = min(pinned, append_ptr[g])
        for i in range(p):
            if not keep[g, i]:
                slot_pos[g, i] = -1
        w = p
        for i in range(p, S):
            if keep[g, i]:
                if i != w:
                    slot_pos[g, w] = slot_pos[g, i]
                    moves[m, 0] = g
                    moves[m, 1] = i
                    moves[m, 2] = w
                    m += 1
                w += 1
        for i in range(w, S):
            slot_pos[g, i] = -1
        append_ptr[g] = w
    return m


COMPACTOR_CLASSES = {c.name: c for c in (NoCompaction, ForwardPack, HoleFill)}


def make_compactor(name_or_cfg) -> Compactor:
    """Compactor from a name or :class:`CompactionConfig`. Raises ValueError listing valid names."""
    cfg = CompactionConfig(name=name_or_cfg) if isinstance(name_or_cfg, str) else name_or_cfg
    validate_compaction_config(cfg)
    return COMPACTOR_CLASSES[cfg.name](cfg)
